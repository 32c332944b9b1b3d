/*
 * half.h — exact conversions of IEEE half (float16) and bfloat16 to float32, and float32 to
 * bfloat16/float16 with round-to-nearest-even (used when writing synthetic models). The scalar ones
 * are IB_HD: the CUDA backend stores and reads half KV with these same definitions.
 */
#ifndef IB_CORE_HALF_H
#define IB_CORE_HALF_H
#include <stdint.h>
#include <string.h>

#include "core/hd.h"

IB_HD static inline float ib_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
IB_HD static inline uint32_t ib_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* bfloat16 -> float32: the 16 bits are the top half of a float32. Exact. */
IB_HD static inline float ib_bf16_to_f32(uint16_t h) { return ib_bits_to_f32((uint32_t)h << 16); }

/* float16 -> float32, exact for every input (subnormals, inf, NaN kept). */
IB_HD static inline float ib_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return ib_bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return ib_bits_to_f32(sign);
        /* subnormal: value = man * 2^-24, exactly representable in float32 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return ib_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* float16 -> float32 for n values, exact, branch-free (lanes independent, so it vectorizes): the
 * exponent and mantissa bits placed in a float32 and scaled by 2^112 (exact for normals and
 * subnormals alike), infinities and NaNs set apart. Equal to ib_f16_to_f32 for every input. */
static inline void ib_f16_to_f32_row(const uint16_t *h, float *f, int n) {
    for (int i = 0; i < n; i++) {
        uint32_t em = h[i] & 0x7fffu;
        uint32_t r = ib_f32_to_bits(ib_bits_to_f32(em << 13) * 0x1p112f);
        if (em >= 0x7c00u) r = 0x7f800000u | ((em & 0x3ffu) << 13);
        f[i] = ib_bits_to_f32(r | ((uint32_t)(h[i] & 0x8000u) << 16));
    }
}

/* One value of ib_f16_to_f32_row (the same operations): equal to ib_f16_to_f32 for every input, with
 * no branch, so a GPU thread can issue many loads before converting them (the CUDA backend's half KV). */
IB_HD static inline float ib_f16_to_f32_lane(uint16_t h) {
    uint32_t em = h & 0x7fffu;
    uint32_t r = ib_f32_to_bits(ib_bits_to_f32(em << 13) * 0x1p112f);
    r = em >= 0x7c00u ? 0x7f800000u | ((em & 0x3ffu) << 13) : r;
    return ib_bits_to_f32(r | ((uint32_t)(h & 0x8000u) << 16));
}

/* float16 -> float32 for n values with the fastest exact conversion this CPU has (half.c): equal to
 * ib_f16_to_f32 on every input but signaling NaNs, which may come back quieted. */
void ib_f16_to_f32_rows(const uint16_t *h, float *f, int n);

/* h[i] = ib_f32_to_f16(f[i]) for n values, with the fastest conversion this CPU has (half.c); equal
 * to ib_f32_to_f16 on every input. */
void ib_f32_to_f16_rows(const float *f, uint16_t *h, int n);

/* float32 -> bfloat16, round to nearest even (NaN stays NaN). */
static inline uint16_t ib_f32_to_bf16(float f) {
    uint32_t u = ib_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* float32 -> float16, round to nearest even, overflow to inf, underflow through subnormals. */
IB_HD static inline uint16_t ib_f32_to_f16(float f) {
    uint32_t u = ib_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;          /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;         /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                              /* below 2^-14: subnormal or zero */
        float v = ib_bits_to_f32(a) * 16777216.0f;      /* exact scale by 2^24 */
        /* v < 1024; round to nearest even integer */
        uint32_t iv = (uint32_t)v;
        float frac = v - (float)iv;
        if (frac > 0.5f || (frac == 0.5f && (iv & 1))) iv++;
        return sign | (uint16_t)iv;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1);          /* round mantissa to 10 bits */
    return sign | (uint16_t)(((r >> 13) - (112u << 10)) & 0x7fff);
}

#endif
