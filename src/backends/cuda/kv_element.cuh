/*
 * kv_element.cuh — a KV cache element as a float on the GPU, exactly as half.h converts it on the host
 * (floats as they are; halves by the conversion instruction, infinities and NaNs by half.h), one at a
 * time and eight at a time.
 */
#ifndef IB_BACKENDS_CUDA_KV_ELEMENT_CUH
#define IB_BACKENDS_CUDA_KV_ELEMENT_CUH

#include "core/half.h"

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

#endif
