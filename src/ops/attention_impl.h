/*
 * attention_impl.h — the body of causal attention (the contract is in ops.h), included by
 * attention.c (portable build), attention_avx2.c and attention_avx512.c (built with those ISA flags).
 * Each includer defines at most one of IB_ATTN_AVX512 / IB_ATTN_AVX2 first; everything here is
 * static, so each translation unit gets its own copy.
 *
 * All arithmetic is written on 16-lane GCC vectors whose operations are lane-wise IEEE (products and
 * sums separate: -ffp-contract=off), so the portable, AVX2 (two ymm halves) and AVX-512 (one zmm)
 * copies give the same bits. Only two things differ between copies, neither of them arithmetic:
 *   - how 16 half-precision keys or values become floats (an exact conversion: F16C / vcvtph2ps,
 *     NEON vcvt, or the portable bit manipulation of half.h), done in registers as they are used;
 *   - under the test-only isa-fma fault the vector copies fuse the dot products' multiply-adds.
 */
#ifndef IB_OPS_ATTENTION_IMPL_H
#define IB_OPS_ATTENTION_IMPL_H
#include <math.h>
#include <stdint.h>

#include "core/fmath.h"
#include "core/half.h"
#include "ops/ops.h"

#if defined(IB_ATTN_AVX512) || defined(IB_ATTN_AVX2)
#include <immintrin.h>
#define IB_ATTN_VECTOR_ISA 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

/* 16 float lanes; a vector never crosses a call boundary (every helper is inlined). */
typedef float v16f __attribute__((vector_size(64)));
#pragma GCC diagnostic ignored "-Wpsabi"

#define ATTN_AI static inline __attribute__((always_inline))
#define IB_ATTN_MAX_BLOCK 128   /* largest key block the body takes */
#define IB_ATTN_PF_KEYS 32      /* keys (rows) ahead that are prefetched */

ATTN_AI v16f ld16(const float *p) {
    v16f v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
ATTN_AI void st16(float *p, v16f v) { __builtin_memcpy(p, &v, sizeof v); }

/* 16 halves as floats, exactly. */
ATTN_AI v16f ld16_half(const uint16_t *p) {
    v16f v;
#if defined(IB_ATTN_AVX512)
    __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    __builtin_memcpy(&v, &x, sizeof v);
#elif defined(IB_ATTN_AVX2)
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
    __builtin_memcpy(&v, &lo, 32);
    __builtin_memcpy((char *)&v + 32, &hi, 32);
#elif defined(__aarch64__)
    float f[16];
    for (int i = 0; i < 16; i += 4) vst1q_f32(f + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + i))));
    v = ld16(f);
#else
    float f[16];
    ib_f16_to_f32_row(p, f, 16);
    v = ld16(f);
#endif
    return v;
}

/* Keys and values: element i of a KV plane of floats (f16 = 0) or halves (f16 = 1); f16 is a
 * constant wherever these are inlined. */
ATTN_AI v16f kv16(const void *p, size_t i, const int f16) {
    return f16 ? ld16_half((const uint16_t *)p + i) : ld16((const float *)p + i);
}
ATTN_AI float kv1(const void *p, size_t i, const int f16) {
    return f16 ? ib_f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* acc + a*b, lane-wise; fused only in the vector copies under the isa-fma fault. */
ATTN_AI v16f mac16(v16f acc, v16f a, v16f b, const int fused) {
#if defined(IB_ATTN_AVX512)
    if (fused) {
        __m512 x, y, z;
        __builtin_memcpy(&x, &a, 64), __builtin_memcpy(&y, &b, 64), __builtin_memcpy(&z, &acc, 64);
        z = _mm512_fmadd_ps(x, y, z);
        __builtin_memcpy(&acc, &z, 64);
        return acc;
    }
#elif defined(IB_ATTN_AVX2)
    if (fused) {
        __m256 x0, x1, y0, y1, z0, z1;
        __builtin_memcpy(&x0, &a, 32), __builtin_memcpy(&x1, (char *)&a + 32, 32);
        __builtin_memcpy(&y0, &b, 32), __builtin_memcpy(&y1, (char *)&b + 32, 32);
        __builtin_memcpy(&z0, &acc, 32), __builtin_memcpy(&z1, (char *)&acc + 32, 32);
        z0 = _mm256_fmadd_ps(x0, y0, z0), z1 = _mm256_fmadd_ps(x1, y1, z1);
        __builtin_memcpy(&acc, &z0, 32), __builtin_memcpy((char *)&acc + 32, &z1, 32);
        return acc;
    }
#endif
    (void)fused;
    return acc + a * b;
}

/* The 16 lanes of a partial dot product, finished as ib_dot16_inline does: the tail i..n-1 added into
 * lanes 0.., then the halving tree. */
ATTN_AI float dot16_finish(v16f acc, const float *q, const void *k, size_t ko, int i, int n, const int f16) {
    float lane[16];
    st16(lane, acc);
    for (int j = 0; i + j < n; j++) lane[j] = lane[j] + q[i + j] * kv1(k, ko + (size_t)(i + j), f16);
    for (int w = 8; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++) lane[j] = lane[j] + lane[j + w];
    return lane[0];
}

/* r[t] = ib_dot16(q, key at element ko + t*st, n) for t = 0..T-1 (T <= 4), bitwise: T independent
 * chains. */
ATTN_AI void dot16_keys(const int T, const int f16, const int fused, const float *q, const void *k, size_t ko,
                        size_t st, int n, float *r) {
    v16f a[4] = {{0}, {0}, {0}, {0}};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        v16f qv = ld16(q + i);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a[t] = mac16(a[t], qv, kv16(k, ko + (size_t)t * st + (size_t)i, f16), fused);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) r[t] = dot16_finish(a[t], q, k, ko + (size_t)t * st, i, n, f16);
}

/* Ask for key or value row j + IB_ATTN_PF_KEYS (bytes [o0, o1) of it) while row j is computed, when
 * that row exists (j + IB_ATTN_PF_KEYS < n_rows). Row i starts at element base + i*st. One head's
 * keys are a few dozen kilobytes in rows far apart from its values: too short and scattered a stream
 * for the hardware prefetcher, so without this every block waits for memory. */
ATTN_AI void prefetch_row(const int f16, const void *p, size_t base, size_t st, int j, int n_rows, size_t o0,
                          size_t o1) {
    if (j + IB_ATTN_PF_KEYS >= n_rows) return;
    const char *r = (const char *)p + (base + (size_t)(j + IB_ATTN_PF_KEYS) * st) * (f16 ? 2 : 4);
    for (size_t o = o0; o < o1; o += 64) __builtin_prefetch(r + o);
}

/* out[d] = out[d]*c, then out[d] = out[d] + p[j]*v_j[d] for j = j0..nb-1 in order, for every d:
 * the contract's per-element sequence. Columns are walked in register-sized chunks with the values
 * inside, so the accumulators stay in registers; each element's operations are unchanged. A scalar
 * operand of a vector operation is broadcast (a 16-element initializer would not compile to one
 * broadcast). Value j starts at element vo + j*st. */
ATTN_AI void scale_accumulate(const int f16, float *out, int hd, float c, const float *p, const void *v, size_t vo,
                              size_t st, int j0, int nb, int n_rows) {
    const size_t eb = f16 ? 2 : 4;
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) {
        v16f o0 = ld16(out + d0) * c, o1 = ld16(out + d0 + 16) * c;
        v16f o2 = ld16(out + d0 + 32) * c, o3 = ld16(out + d0 + 48) * c;
        for (int j = j0; j < nb; j++) {
            prefetch_row(f16, v, vo, st, j, n_rows, (size_t)d0 * eb, (size_t)(d0 + 64) * eb);
            size_t e = vo + (size_t)j * st + (size_t)d0;
            const float pj = p[j];
            o0 = o0 + pj * kv16(v, e, f16), o1 = o1 + pj * kv16(v, e + 16, f16);
            o2 = o2 + pj * kv16(v, e + 32, f16), o3 = o3 + pj * kv16(v, e + 48, f16);
        }
        st16(out + d0, o0), st16(out + d0 + 16, o1), st16(out + d0 + 32, o2), st16(out + d0 + 48, o3);
    }
    for (; d0 + 16 <= hd; d0 += 16) {
        v16f o0 = ld16(out + d0) * c;
        for (int j = j0; j < nb; j++) o0 = o0 + p[j] * kv16(v, vo + (size_t)j * st + (size_t)d0, f16);
        st16(out + d0, o0);
    }
    for (; d0 < hd; d0++) {
        float o = out[d0] * c;
        for (int j = j0; j < nb; j++) o = o + p[j] * kv1(v, vo + (size_t)j * st + (size_t)d0, f16);
        out[d0] = o;
    }
}

/* The scaled scores s[j] = dot16(q, k_j) * scale of keys j0..nb-1 of a block (key j at element
 * ko + j*st; the block's keys and those after it number n_rows). */
ATTN_AI void block_scores(const int f16, const int fused, const float *q, const void *k, size_t ko, size_t st, int hd,
                          float scale, int j0, int nb, int n_rows, float *s) {
    const size_t row_bytes = (size_t)hd * (f16 ? 2 : 4);
    int j = j0;
    for (; j + 4 <= nb; j += 4) {
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) prefetch_row(f16, k, ko, st, j + t, n_rows, 0, row_bytes);
        dot16_keys(4, f16, fused, q, k, ko + (size_t)j * st, st, hd, s + j);
    }
    for (; j < nb; j++) dot16_keys(1, f16, fused, q, k, ko + (size_t)j * st, st, hd, s + j);
    for (j = j0; j < nb; j++) s[j] = s[j] * scale;
}

/* The online-softmax update of one block from its scores s[j0..nb): the running max m and sum l,
 * and out rescaled then accumulated with the values (value j at element vo + j*st). */
ATTN_AI void block_update(const int f16, const float *s, const void *v, size_t vo, size_t st, int hd, int j0, int nb,
                          int n_rows, float *m, float *l, float *out) {
    float mb = -INFINITY;
    for (int j = j0; j < nb; j++)
        if (s[j] > mb) mb = s[j];
    float m_new = mb > *m ? mb : *m;
    float c = ib_expf(*m - m_new); /* exp(-inf) = 0 on the first block */
    float lv = *l * c;
    float pw[IB_ATTN_MAX_BLOCK]; /* the block's softmax weights, computed lane-parallel */
    for (int j = j0; j < nb; j++) pw[j] = ib_expf_lane(s[j] - m_new);
    for (int j = j0; j < nb; j++) lv = lv + pw[j];
    scale_accumulate(f16, out, hd, c, pw, v, vo, st, j0, nb, n_rows);
    *m = m_new;
    *l = lv;
}

/* ib_attend_heads over a float (f16 = 0) or half (f16 = 1) KV plane: nq query heads q [nq][hd] walk
 * each key block in turn while its keys and values are in L1; out [nq][hd]. block <= IB_ATTN_MAX_BLOCK. */
ATTN_AI void attend_heads_body(const int f16, const int fused, const float *q, int nq, const void *k, const void *v,
                               int n_keys, int kv_stride, int hd, float scale, int block, int window, float *out) {
    float m[IB_ATTN_MAX_GROUP], l[IB_ATTN_MAX_GROUP];
    float s[IB_ATTN_MAX_BLOCK];   /* one head's scores of the block */
    const int lo = window > 0 && n_keys > window ? n_keys - window : 0;  /* first attended key */
    const size_t st = (size_t)kv_stride;
    for (int h = 0; h < nq; h++) m[h] = -INFINITY, l[h] = 0.0f;
    for (int d = 0; d < nq * hd; d++) out[d] = 0.0f;
    for (int b0 = lo - lo % block; b0 < n_keys; b0 += block) {
        int j0 = lo > b0 ? lo - b0 : 0;
        int nb = n_keys - b0 < block ? n_keys - b0 : block;
        /* every head's pass asks for the rows IB_ATTN_PF_KEYS on (asking again costs little, and was
         * measured faster than asking in the first head's pass only) */
        for (int h = 0; h < nq; h++) {
            block_scores(f16, fused, q + (size_t)h * hd, k, (size_t)b0 * st, st, hd, scale, j0, nb, n_keys - b0, s);
            block_update(f16, s, v, (size_t)b0 * st, st, hd, j0, nb, n_keys - b0, &m[h], &l[h], out + (size_t)h * hd);
        }
    }
    for (int h = 0; h < nq; h++)
        for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] = out[(size_t)h * hd + d] / l[h];
}

/* The two entry points of this copy: float and half KV, the fault read once per call. */
static void attend_heads_f32_copy(const float *q, int nq, const float *k, const float *v, int n_keys, int kv_stride,
                                  int hd, float scale, int block, int window, float *out) {
#ifdef IB_ATTN_VECTOR_ISA
    if (ib_fault_get() == IB_FAULT_ISA_FMA) {
        attend_heads_body(0, 1, q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out);
        return;
    }
#endif
    attend_heads_body(0, 0, q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out);
}

static void attend_heads_f16_copy(const uint16_t *k, const uint16_t *v, const float *q, int nq, int n_keys,
                                  int kv_stride, int hd, float scale, int block, int window, float *out) {
#ifdef IB_ATTN_VECTOR_ISA
    if (ib_fault_get() == IB_FAULT_ISA_FMA) {
        attend_heads_body(1, 1, q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out);
        return;
    }
#endif
    attend_heads_body(1, 0, q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out);
}

#endif
