/*
 * kv_elem.h — how the elements of each KV element type (ib_kv_dtype) lie in memory, and the 8-bit
 * type's (IB_KV_Q8) encoding of a row of keys or values into bytes and decoding back into floats. The
 * definitions are here once, as IB_HD inline functions, for every backend.
 *
 * IB_KV_F32 and IB_KV_F16 planes are arrays of 4- and 2-byte elements. IB_KV_Q8:
 *
 * Layout. Rows hold a multiple of IB_KVQ8_BLOCK (32) elements. Every 32 consecutive elements are one
 * block of IB_KVQ8_BLOCK_BYTES (36) bytes: 32 signed 8-bit codes c[0..31], then the block's float32
 * scale s (4 bytes, host byte order, not aligned). A plane of such rows laid end to end is indexed by
 * logical element e (row j's element d is e = j*stride + d, stride a multiple of 32): e's code is at
 * byte ib_kvq8_offset(e) = (e/32)*36 + e%32 and its block's scale at (e/32)*36 + 32. So 32 elements take
 * 36 bytes: 1.125 bytes an element, against 2 for IB_KV_F16 and 4 for IB_KV_F32.
 *
 * Encoding one block x[0..31] — a function of those 32 floats alone (so of the session's own row, never
 * of the batch):
 *   if some x[i] is NaN or infinite:  s = NaN, every c[i] = 0;
 *   else a = max |x[i]| (exact in any order), s = a / 127 (one correctly rounded float division);
 *        if s == 0 (a is zero, or so small that a/127 underflows): every c[i] = 0;
 *        else c[i] = x[i] / s (one float division) rounded to the nearest integer, ties to even,
 *             clamped to [-127, 127] (the clamp acts only where s is subnormal).
 * Decoding: x'[i] = s * (float)c[i] (one float product, correctly rounded). Attention over a q8 cache
 * is, by definition, attention over the decoded floats x' (ops.h), so every ISA copy and backend gives
 * the same bits: they differ only in how they load codes and scales.
 */
#ifndef IB_CORE_KV_ELEM_H
#define IB_CORE_KV_ELEM_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "core/hd.h"
#include "isobatch.h"

#define IB_KVQ8_BLOCK 32
#define IB_KVQ8_BLOCK_BYTES 36

/* Byte offset of logical element e's code in a plane of q8 rows (see above). */
IB_HD static inline size_t ib_kvq8_offset(size_t e) {
    return (e / IB_KVQ8_BLOCK) * IB_KVQ8_BLOCK_BYTES + e % IB_KVQ8_BLOCK;
}

/* Byte offset of logical element e in a KV plane of type t; for e a multiple of IB_KVQ8_BLOCK (every
 * row start of a cache, whose head dims q8 requires to be such multiples) also the bytes that e
 * elements take. */
IB_HD static inline size_t ib_kv_bytes(ib_kv_dtype t, size_t e) {
    return t == IB_KV_Q8 ? ib_kvq8_offset(e) : t == IB_KV_F16 ? e * 2 : e * 4;
}

/* The scale of the block holding logical element e of the plane p. */
IB_HD static inline float ib_kvq8_scale(const void *p, size_t e) {
    float s;
    memcpy(&s, (const unsigned char *)p + (e / IB_KVQ8_BLOCK) * IB_KVQ8_BLOCK_BYTES + IB_KVQ8_BLOCK, sizeof s);
    return s;
}

/* Logical element e of the plane p, decoded: s * (float)c. */
IB_HD static inline float ib_kvq8_get(const void *p, size_t e) {
    return ib_kvq8_scale(p, e) * (float)((const int8_t *)p)[ib_kvq8_offset(e)];
}

/* The scale of a block whose largest magnitude is a, for codes up to qmax (an integer: 127 is the
 * definition; another value only under the test-only kvq8-step-scale fault): a / qmax, or NaN when the
 * block holds a NaN or an infinity (finite 0). Shared by every encoder (the CUDA backend's store too). */
IB_HD static inline float ib_kvq8_block_scale(float a, int finite, float qmax) {
    return finite ? a / qmax : ib_bits_to_f32(0x7fc00000u);
}

/* The code of x in a block of scale s (finite and nonzero), codes up to qmax: x / s clamped to
 * [-qmax, qmax] (which commutes with rounding to an integer), then rounded to the nearest integer, ties
 * to even, by the addition and subtraction of 1.5 * 2^23 (exact round-to-nearest-even for |y| < 2^22 in
 * the default rounding mode). No branch, so the loops calling it vectorize. */
IB_HD static inline signed char ib_kvq8_code(float x, float s, float qmax) {
    float y = x / s;
    y = y > qmax ? qmax : y < -qmax ? -qmax : y;
    y = (y + 12582912.0f) - 12582912.0f; /* 1.5 * 2^23 */
    return (signed char)(int)y;
}

/* Encode n floats x (n a multiple of IB_KVQ8_BLOCK) into n/32 blocks at dst (n/32*36 bytes) with codes
 * up to qmax (ib_kvq8_block_scale, ib_kvq8_code). Written without branches inside the element loops, so
 * they vectorize. */
IB_HD static inline void ib_kvq8_encode_row_qmax(const float *x, int n, void *dst, float qmax) {
    unsigned char *o = (unsigned char *)dst;
    for (int b = 0; b < n / IB_KVQ8_BLOCK; b++, x += IB_KVQ8_BLOCK, o += IB_KVQ8_BLOCK_BYTES) {
        float a = 0.0f;
        int finite = 1;
        for (int i = 0; i < IB_KVQ8_BLOCK; i++) {
            const float m = fabsf(x[i]);
            finite &= m <= 3.40282347e38f;   /* 0 for NaN or infinite */
            a = m > a ? m : a;
        }
        const float s = ib_kvq8_block_scale(a, finite, qmax);
        signed char c[IB_KVQ8_BLOCK];
        if (finite && s != 0.0f) {
            for (int i = 0; i < IB_KVQ8_BLOCK; i++) c[i] = ib_kvq8_code(x[i], s, qmax);
        } else {
            for (int i = 0; i < IB_KVQ8_BLOCK; i++) c[i] = 0;
        }
        memcpy(o, c, IB_KVQ8_BLOCK);
        memcpy(o + IB_KVQ8_BLOCK, &s, sizeof s);
    }
}

/* Encode n floats x (n a multiple of IB_KVQ8_BLOCK) into n/32 q8 blocks at dst: the definition above. */
IB_HD static inline void ib_kvq8_encode_row(const float *x, int n, void *dst) { ib_kvq8_encode_row_qmax(x, n, dst, 127.0f); }

#ifndef __CUDACC__
/* ib_kvq8_encode_row_qmax on SIMD lanes (kv_elem.c): the same bytes for every input, several times
 * faster; the CPU backend's store of q8 keys and values. */
void ib_kvq8_encode_rows_qmax(const float *x, int n, void *dst, float qmax);
#endif

/* Decode n elements (a multiple of IB_KVQ8_BLOCK) from the blocks at src into floats y. */
IB_HD static inline void ib_kvq8_decode_row(const void *src, int n, float *y) {
    for (int i = 0; i < n; i++) y[i] = ib_kvq8_get(src, (size_t)i);
}

#endif
