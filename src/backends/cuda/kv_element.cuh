/*
 * kv_element.cuh — a KV cache element as a float on the GPU, exactly as the host decodes it (floats as
 * they are; halves by the conversion instruction, infinities and NaNs by half.h; q8 codes times their
 * block's scale, core/kv_elem.h), one at a time and a 16-byte piece at a time (kv_read), and the q8
 * store of a key or value head by one warp.
 */
#ifndef IB_BACKENDS_CUDA_KV_ELEMENT_CUH
#define IB_BACKENDS_CUDA_KV_ELEMENT_CUH

#include "core/half.h"
#include "core/kv_elem.h"

/* A KV element as float, exactly: a half by the conversion instruction, which is exact for every finite
 * half (subnormals included: denormals are kept), or, for infinities and NaNs (exponent bits all set),
 * by half.h's conversion, so a NaN keeps the bits the host gives it. */
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(uint16_t h) {
    return (h & 0x7c00u) == 0x7c00u ? ib_f16_to_f32_lane(h) : __half2float(__ushort_as_half(h));
}

/* The 8 halves of w (element 2k in the low half of word k) as floats into f, each exactly to_f32's:
 * when no half has all exponent bits set — ((h & 0x7c00) + 0x400) & 0x8000 is then 0 for each — by
 * paired conversion instructions, else one by one. */
__device__ __forceinline__ void halves8_regs(uint4 w, float (&f)[8]) {
    const unsigned ws[4] = {w.x, w.y, w.z, w.w};
    unsigned sp = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) sp |= ((ws[k] & 0x7c007c00u) + 0x04000400u) & 0x80008000u;
    if (sp == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 t = __half22float2(*(const __half2 *)&ws[k]);
            f[2 * k] = t.x, f[2 * k + 1] = t.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = to_f32((uint16_t)(ws[e >> 1] >> (16 * (e & 1))));
    }
}

/* The 8 halves of w (element 2k in the low half of word k) as floats into o [8] (shared memory, 16-byte
 * aligned), each exactly to_f32's (halves8_regs). */
__device__ __forceinline__ void halves8_to_f32(uint4 w, float *o) {
    float f[8];
    halves8_regs(w, f);
    ((float4 *)o)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4 *)o)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

/* The q8 KV element type's tag (IB_KV_Q8, core/kv_elem.h: 36-byte blocks of 32 codes, then the block's
 * float scale). */
struct kvq8 {};

/* Whether T is the q8 tag (for `if constexpr` where a kernel's code differs by KV type). */
template <typename T>
struct kv_is_q8 {
    static constexpr bool value = false;
};
template <>
struct kv_is_q8<kvq8> {
    static constexpr bool value = true;
};

/* A place in a q8 plane: the plane's first byte and a logical element (its code at ib_kvq8_offset(e)).
 * Adding n moves n elements, as a pointer to float or half elements does. */
struct kvq8_ptr {
    const unsigned char *b;
    size_t e;
    __device__ __forceinline__ kvq8_ptr operator+(size_t n) const { return kvq8_ptr{b, e + n}; }
};

/* A q8 element decoded: s * (float)c, the host's bits — where s is NaN (a block that held a NaN or an
 * infinity; its codes are 0) the host's product is s itself, so s is returned rather than the device's
 * own NaN. */
__device__ __forceinline__ float kvq8_value(float s, int c) { return s != s ? s : s * (float)c; }

/* One code and its block's scale (kv_read<kvq8>::elem). */
struct kvq8_elem {
    int c;
    float s;
};

/* Sixteen codes (4 words, element 4k + j in byte j of word k) and their block's scale
 * (kv_read<kvq8>::piece). */
struct kvq8_piece {
    unsigned c[4];
    float s;
};

/* How a kernel reads a KV plane of element type T (float, uint16_t: half, kvq8): ptr, a place in a
 * plane (at(base, e): logical element e of the plane at base), ld / cvt one element (the load, then
 * its float, so a thread's loads can all be issued before any conversion), load / to_f32s a piece of E
 * elements (E at an element that is a multiple of E: 16 bytes of floats or halves, or 16 q8 codes and
 * their scale — a piece never straddles a q8 block), and bytes(n): the bytes of n elements from a row
 * start. Every value is exactly the host's decoding. */
template <typename T>
struct kv_read;

template <>
struct kv_read<float> {
    typedef const float *ptr;
    typedef float elem;
    typedef uint4 piece;
    static constexpr int E = 4;
    static __device__ __forceinline__ ptr at(const void *base, size_t e) { return (const float *)base + e; }
    static __device__ __forceinline__ elem ld(ptr p, size_t i) { return p[i]; }
    static __device__ __forceinline__ elem zero() { return 0.0f; }
    static __device__ __forceinline__ float cvt(elem x) { return x; }
    static __device__ __forceinline__ piece load(ptr p) { return *(const uint4 *)p; }
    static __device__ __forceinline__ void to_f32s(const piece &w, float *o) { *(uint4 *)o = w; }
    static __device__ __forceinline__ const char *addr(ptr p) { return (const char *)p; }
    static __device__ __forceinline__ size_t bytes(size_t n) { return n * 4; }
};

template <>
struct kv_read<uint16_t> {
    typedef const uint16_t *ptr;
    typedef uint16_t elem;
    typedef uint4 piece;
    static constexpr int E = 8;
    static __device__ __forceinline__ ptr at(const void *base, size_t e) { return (const uint16_t *)base + e; }
    static __device__ __forceinline__ elem ld(ptr p, size_t i) { return p[i]; }
    static __device__ __forceinline__ elem zero() { return (uint16_t)0; }
    static __device__ __forceinline__ float cvt(elem x) { return to_f32(x); }
    static __device__ __forceinline__ piece load(ptr p) { return *(const uint4 *)p; }
    static __device__ __forceinline__ void to_f32s(const piece &w, float *o) { halves8_to_f32(w, o); }
    static __device__ __forceinline__ const char *addr(ptr p) { return (const char *)p; }
    static __device__ __forceinline__ size_t bytes(size_t n) { return n * 2; }
};

template <>
struct kv_read<kvq8> {
    typedef kvq8_ptr ptr;
    typedef kvq8_elem elem;
    typedef kvq8_piece piece;
    static constexpr int E = 16;
    static __device__ __forceinline__ ptr at(const void *base, size_t e) {
        return kvq8_ptr{(const unsigned char *)base, e};
    }
    static __device__ __forceinline__ float scale(const unsigned char *b, size_t e) {
        return *(const float *)(b + (e / IB_KVQ8_BLOCK) * IB_KVQ8_BLOCK_BYTES + IB_KVQ8_BLOCK);
    }
    static __device__ __forceinline__ elem ld(ptr p, size_t i) {
        const size_t e = p.e + i;
        return kvq8_elem{(int)(signed char)p.b[ib_kvq8_offset(e)], scale(p.b, e)};
    }
    static __device__ __forceinline__ elem zero() { return kvq8_elem{0, 0.0f}; }
    static __device__ __forceinline__ float cvt(elem x) { return kvq8_value(x.s, x.c); }
    static __device__ __forceinline__ piece load(ptr p) {
        const unsigned *w = (const unsigned *)(p.b + ib_kvq8_offset(p.e));   /* 4-byte aligned */
        return kvq8_piece{{w[0], w[1], w[2], w[3]}, scale(p.b, p.e)};
    }
    static __device__ __forceinline__ void to_f32s(const piece &w, float *o) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float f[4];
#pragma unroll
            for (int j = 0; j < 4; j++) f[j] = kvq8_value(w.s, (int)(signed char)(w.c[k] >> (8 * j)));
            ((float4 *)o)[k] = make_float4(f[0], f[1], f[2], f[3]);
        }
    }
    static __device__ __forceinline__ const char *addr(ptr p) { return (const char *)p.b + ib_kvq8_offset(p.e); }
    static __device__ __forceinline__ size_t bytes(size_t n) { return ib_kvq8_offset(n); }
};

/* Store x, element `lane` of the q8 block that starts at logical element e0 (a multiple of 32) of the
 * plane at base, by the 32 lanes of a warp together (each its own element): the block's scale
 * (ib_kvq8_block_scale of the largest magnitude — a maximum, so the same in any order — and whether all
 * 32 are finite) and each lane's code (ib_kvq8_code; 0 where the scale is NaN or 0) — the bytes
 * ib_kvq8_encode_row_qmax writes (qmax: 127, the definition; 126 only under a test-only fault); mir !=
 * NULL: the same bytes also at logical element me0 of the plane at mir (a mirror in shared memory).
 * Returns the element as it will be decoded (kvq8_value). */
__device__ __forceinline__ float kvq8_store_warp(unsigned char *base, size_t e0, float x, int lane, float qmax,
                                                 unsigned char *mir = NULL, size_t me0 = 0) {
    const float m = fabsf(x);
    int finite = m <= 3.40282347e38f;   /* 0 for NaN or infinite */
    float a = finite ? m : 0.0f;
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, a, o);
        const int f = __shfl_xor_sync(0xffffffffu, finite, o);
        a = t > a ? t : a;
        finite &= f;
    }
    const float s = ib_kvq8_block_scale(a, finite, qmax);
    const int c = finite && s != 0.0f ? (int)ib_kvq8_code(x, s, qmax) : 0;
    unsigned char *blk = base + (e0 / IB_KVQ8_BLOCK) * IB_KVQ8_BLOCK_BYTES;
    blk[lane] = (unsigned char)(signed char)c;
    if (lane == 0) *(float *)(blk + IB_KVQ8_BLOCK) = s;
    if (mir) {
        unsigned char *mb = mir + (me0 / IB_KVQ8_BLOCK) * IB_KVQ8_BLOCK_BYTES;
        mb[lane] = (unsigned char)(signed char)c;
        if (lane == 0) *(float *)(mb + IB_KVQ8_BLOCK) = s;
    }
    return kvq8_value(s, c);
}

#endif
