/*
 * attention_impl.h — the body of causal attention (the contract is in ops.h), included by
 * attention.c (portable build), attention_avx2.c and attention_avx512.c (built with those ISA flags).
 * Each includer defines at most one of IB_ATTN_AVX512 / IB_ATTN_AVX2 first; everything here is
 * static, so each translation unit gets its own copy.
 *
 * All arithmetic is written on GCC vectors (16 lanes in the AVX-512 copy, 8 elsewhere) whose
 * operations are lane-wise IEEE (products and sums separate: -ffp-contract=off), and every lane of a
 * dot product or of an output walks its elements in the same order whatever the width, so the copies
 * give the same bits. Only three things differ between copies, none of them rounding:
 *   - how 16 half-precision keys or values become floats (an exact conversion: F16C / vcvtph2ps,
 *     NEON vcvt, or the portable bit manipulation of half.h), done in registers as they are used;
 *     likewise q8 codes (an exact int8 -> float conversion; then each lane's one product with its
 *     block's scale, the same IEEE product in every copy: kv_elem.h);
 *   - a key block's maximum score (block_max): the portable copy walks the keys in order, the vector
 *     copies take them in lanes; a maximum is exact in any order, and NaN scores and the sign of a
 *     zero maximum are handled so that the bits are the walk's;
 *   - under the test-only faults, isa-fma (the vector copies fuse the dot products' multiply-adds) and
 *     attn-block-max (their block maxima take NaN scores and lose the walk's zero sign).
 */
#ifndef IB_OPS_ATTENTION_IMPL_H
#define IB_OPS_ATTENTION_IMPL_H
#include <math.h>
#include <stdint.h>

#include "core/fmath.h"
#include "core/half.h"
#include "core/kv_elem.h"
#include "ops/ops.h"

#if defined(IB_ATTN_AVX512) || defined(IB_ATTN_AVX2)
#include <immintrin.h>
#define IB_ATTN_VECTOR_ISA 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

/* The native vector of this copy: 16 float lanes (AVX-512) or 8 (AVX2; portable: two SSE or NEON
 * halves). A 16-lane dot product's lanes are held in NV of them. No vector crosses a call boundary
 * (every helper is inlined). */
#if defined(IB_ATTN_AVX512)
#define VL 16
typedef float vecf __attribute__((vector_size(64)));
#else
#define VL 8
typedef float vecf __attribute__((vector_size(32)));
#endif
#define NV (16 / VL)
/* Query heads of a KV head are taken in pairs, each key and value element read (and converted from
 * half) once per pair, in the AVX-512 copy (18 vs 23 ns per key and KV head with half KV in cache) and
 * the AVX2 copy, whose 16 registers hold a pair's dot products for 2 keys at a time (IB_ATTN_KEYS) where
 * AVX-512 takes 4. The portable copy takes one head at a time. Either way each output's operations are
 * the same. */
#if defined(IB_ATTN_AVX512) || defined(IB_ATTN_AVX2)
#define IB_ATTN_PAIRS 1
#else
#define IB_ATTN_PAIRS 0
#endif
/* Most queries (query heads of one row, or of consecutive rows of one session: ib_attend_rows) that
 * take a key block's loads together: 4 in the vector copies, 1 in the portable one. */
#if defined(IB_ATTN_AVX512) || defined(IB_ATTN_AVX2)
#define IB_ATTN_GROUP 4
#else
#define IB_ATTN_GROUP 1
#endif
/* Keys per dot16_keys call for NQ queries: 4 with 16-lane vectors (NQ x 4 accumulators, at most 16
 * of the 32 AVX-512 registers); with 8-lane ones 4 for one query, 2 for two (2 x 2 keys x 2 vectors
 * = 8 accumulators, with the 2 query and 1 key vectors 11 of the 16 AVX2 registers), 1 for three or
 * four. */
#define IB_ATTN_KEYS(NQ) (VL == 16 || (NQ) == 1 ? 4 : (NQ) == 2 ? 2 : 1)
#pragma GCC diagnostic ignored "-Wpsabi"

#define ATTN_AI static inline __attribute__((always_inline))
#define IB_ATTN_MAX_BLOCK 128   /* largest key block the body takes */
#define IB_ATTN_PF_KEYS 32      /* keys (rows) ahead that are prefetched */

ATTN_AI vecf ldv(const float *p) {
    vecf v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
ATTN_AI void stv(float *p, vecf v) { __builtin_memcpy(p, &v, sizeof v); }

/* VL halves as floats, exactly. */
ATTN_AI vecf ldv_half(const uint16_t *p) {
    vecf v;
#if defined(IB_ATTN_AVX512)
    __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    __builtin_memcpy(&v, &x, sizeof v);
#elif defined(IB_ATTN_AVX2)
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __builtin_memcpy(&v, &x, sizeof v);
#elif defined(__aarch64__)
    float f[VL];
    for (int i = 0; i < VL; i += 4) vst1q_f32(f + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + i))));
    v = ldv(f);
#else
    float f[VL];
    ib_f16_to_f32_row(p, f, VL);
    v = ldv(f);
#endif
    return v;
}

/* VL elements of a q8 plane from logical element i (i a multiple of VL, so inside one block: kv_elem.h),
 * decoded: the block's scale times each code, one float product a lane (exactly ib_kvq8_get's). */
ATTN_AI vecf ldv_q8(const void *p, size_t i) {
    const signed char *c = (const signed char *)p + ib_kvq8_offset(i);
    const float s = ib_kvq8_scale(p, i);
    vecf v;
#if defined(IB_ATTN_AVX512)
    __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)c)));
    __builtin_memcpy(&v, &x, sizeof v);
#elif defined(IB_ATTN_AVX2)
    __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)c)));
    __builtin_memcpy(&v, &x, sizeof v);
#else
    typedef signed char vecc __attribute__((vector_size(VL)));   /* VL codes */
    vecc cv;
    __builtin_memcpy(&cv, c, sizeof cv);
    v = __builtin_convertvector(cv, vecf);   /* exact: every int8 is a float */
#endif
    return v * s;
}

/* Keys and values: VL elements from logical element i of a KV plane of type kvt (IB_KV_F32 floats,
 * IB_KV_F16 halves, IB_KV_Q8 blocks), as floats; kvt is a constant wherever these are inlined. */
ATTN_AI vecf kvv(const void *p, size_t i, const int kvt) {
    return kvt == IB_KV_Q8 ? ldv_q8(p, i) : kvt == IB_KV_F16 ? ldv_half((const uint16_t *)p + i) : ldv((const float *)p + i);
}
/* kvv of element d of the row starting at element row (a multiple of 32 for q8, as every row start
 * is): for q8 the row's byte offset and d's are added apart, so the first is computed once per row and
 * the second once for all the rows a loop reads at the same d. */
ATTN_AI vecf kvv_at(const void *p, size_t row, size_t d, const int kvt) {
    if (kvt == IB_KV_Q8) return ldv_q8((const char *)p + ib_kvq8_offset(row), d);
    return kvv(p, row + d, kvt);
}
ATTN_AI float kv1(const void *p, size_t i, const int kvt) {
    return kvt == IB_KV_Q8 ? ib_kvq8_get(p, i)
           : kvt == IB_KV_F16 ? ib_f16_to_f32(((const uint16_t *)p)[i])
                              : ((const float *)p)[i];
}

/* acc + a*b, lane-wise; fused only in the vector copies under the isa-fma fault. */
ATTN_AI vecf mac(vecf acc, vecf a, vecf b, const int fused) {
#if defined(IB_ATTN_AVX512)
    if (fused) return (vecf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#elif defined(IB_ATTN_AVX2)
    if (fused) return (vecf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#endif
    (void)fused;
    return acc + a * b;
}

/* The 16 lanes (NV vectors) of a partial dot product, finished as ib_dot16_inline does: the tail
 * i..n-1 added into lanes 0.., then the halving tree. */
ATTN_AI float dot16_finish(const vecf *acc, const float *q, const void *k, size_t ko, int i, int n, const int kvt) {
    float lane[16];
#pragma GCC unroll 2
    for (int u = 0; u < NV; u++) stv(lane + u * VL, acc[u]);
    for (int j = 0; i + j < n; j++) lane[j] = lane[j] + q[i + j] * kv1(k, ko + (size_t)(i + j), kvt);
    for (int w = 8; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++) lane[j] = lane[j] + lane[j + w];
    return lane[0];
}

#if defined(IB_ATTN_AVX512) || defined(IB_ATTN_AVX2)
/* The halving trees of four 16-lane partial dot products with no tail (r[t] as dot16_finish gives it):
 * each step adds lane j + w to lane j for w = 8, 4, 2, 1, operands in that order, four keys at a time
 * in the vector unit instead of one lane at a time. Product t's lanes are at[0..NV-1] (a1 is unused
 * where NV = 1): taken by value, so the accumulators stay in registers (passed as an array they went
 * through the stack, 5-7% of a prefill's attention). */
ATTN_AI void finish4(vecf a0_0, vecf a0_1, vecf a1_0, vecf a1_1, vecf a2_0, vecf a2_1, vecf a3_0, vecf a3_1,
                     float r[4]) {
#if defined(IB_ATTN_AVX512)
    (void)a0_1, (void)a1_1, (void)a2_1, (void)a3_1;
    const __m512 x[4] = {(__m512)a0_0, (__m512)a1_0, (__m512)a2_0, (__m512)a3_0};
    /* w = 8: [k0 lanes 0-7 | k1 lanes 0-7] + [k0 lanes 8-15 | k1 lanes 8-15], and keys 2, 3 */
    __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x44), _mm512_shuffle_f32x4(x[0], x[1], 0xee));
    __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x44), _mm512_shuffle_f32x4(x[2], x[3], 0xee));
    /* w = 4: 128-bit lane t = key t's lanes 0-3 plus its lanes 4-7 */
    __m512 r4 = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
    /* w = 2, then w = 1, within each 128-bit lane */
    __m512 r2 = _mm512_add_ps(r4, _mm512_permute_ps(r4, 0xee));
    __m512 r1 = _mm512_add_ps(r2, _mm512_permute_ps(r2, 0x55));
    _mm_storeu_ps(r, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0,
                                                                                      0, 0, 0, 0, 0, 0), r1)));
#else
    const __m256 s8[4] = {_mm256_add_ps((__m256)a0_0, (__m256)a0_1), _mm256_add_ps((__m256)a1_0, (__m256)a1_1),
                          _mm256_add_ps((__m256)a2_0, (__m256)a2_1), _mm256_add_ps((__m256)a3_0, (__m256)a3_1)}; /* w = 8 */
    /* w = 4: [k0 lanes 0-3 | k1 lanes 0-3] + [k0 lanes 4-7 | k1 lanes 4-7], and keys 2, 3 */
    __m256 r01 = _mm256_add_ps(_mm256_permute2f128_ps(s8[0], s8[1], 0x20), _mm256_permute2f128_ps(s8[0], s8[1], 0x31));
    __m256 r23 = _mm256_add_ps(_mm256_permute2f128_ps(s8[2], s8[3], 0x20), _mm256_permute2f128_ps(s8[2], s8[3], 0x31));
    r01 = _mm256_add_ps(r01, _mm256_permute_ps(r01, 0xee)), r23 = _mm256_add_ps(r23, _mm256_permute_ps(r23, 0xee));
    r01 = _mm256_add_ps(r01, _mm256_permute_ps(r01, 0x55)), r23 = _mm256_add_ps(r23, _mm256_permute_ps(r23, 0x55));
    r[0] = _mm256_cvtss_f32(r01), r[1] = _mm_cvtss_f32(_mm256_extractf128_ps(r01, 1));
    r[2] = _mm256_cvtss_f32(r23), r[3] = _mm_cvtss_f32(_mm256_extractf128_ps(r23, 1));
#endif
}
#endif

/* r[h*rs + t] = ib_dot16(q_h, key t, n) for queries h < NQ (NQ <= 4, q_h at q + h*n) and keys
 * t < T (T <= 4, key t at element ko + t*st), bitwise: NQ*T independent chains. Each element of a
 * key is loaded (and decoded, from half or q8) once for all the heads. */
ATTN_AI void dot16_keys(const int T, const int NQ, const int kvt, const int fused, const float *q, const void *k,
                        size_t ko, size_t st, int n, float *r, int rs) {
    vecf a[4][4][NV];
#pragma GCC unroll 4
    for (int h = 0; h < NQ; h++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
#pragma GCC unroll 2
            for (int u = 0; u < NV; u++) a[h][t][u] = (vecf){0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
#pragma GCC unroll 2
        for (int u = 0; u < NV; u++) {
            vecf qv[4];
#pragma GCC unroll 4
            for (int h = 0; h < NQ; h++) qv[h] = ldv(q + (size_t)h * n + i + u * VL);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const vecf kv = kvv_at(k, ko + (size_t)t * st, (size_t)(i + u * VL), kvt);
#pragma GCC unroll 4
                for (int h = 0; h < NQ; h++) a[h][t][u] = mac(a[h][t][u], qv[h], kv, fused);
            }
        }
#if defined(IB_ATTN_AVX512) || defined(IB_ATTN_AVX2)
    if (T == 4 && i == n) {
#pragma GCC unroll 4
        for (int h = 0; h < NQ; h++)
            finish4(a[h][0][0], a[h][0][NV - 1], a[h][1][0], a[h][1][NV - 1], a[h][2][0], a[h][2][NV - 1], a[h][3][0],
                    a[h][3][NV - 1], r + (size_t)h * rs);
        return;
    }
    if (T * NQ <= 4 && i == n) {
        /* up to 4 dot products (the pair's 2 x 2, or a block's last keys) as one finish4: product x =
         * h*T + t in slot x, the unused slots repeating product 0 (each slot's tree is its own) */
        vecf b[4][NV];
        float rr[4];
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
#pragma GCC unroll 2
            for (int u = 0; u < NV; u++) b[x][u] = x < T * NQ ? a[x / T][x % T][u] : a[0][0][u];
        finish4(b[0][0], b[0][NV - 1], b[1][0], b[1][NV - 1], b[2][0], b[2][NV - 1], b[3][0], b[3][NV - 1], rr);
#pragma GCC unroll 4
        for (int x = 0; x < T * NQ; x++) r[(size_t)(x / T) * rs + x % T] = rr[x];
        return;
    }
#endif
#pragma GCC unroll 4
    for (int h = 0; h < NQ; h++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            r[(size_t)h * rs + t] = dot16_finish(a[h][t], q + (size_t)h * n, k, ko + (size_t)t * st, i, n, kvt);
}

/* Where a call has come in asking for a later call's rows (ib_attn_ahead: the next decode task's keys
 * and values): bytes [off, bytes) of each of the planes k and v are still to be asked for. */
typedef struct attn_cursor {
    const char *k, *v;
    size_t off, bytes;
} attn_cursor;

/* Cache lines of each ahead plane asked for at each of a call's own prefetch points (prefetch_row: a
 * key's scores, and each column chunk of a value row) for KV of type kvt: with hd = 128 and 16-lane
 * vectors a row has three such points (its scores and two 64-column value chunks; more with 8-lane
 * vectors), and a row of floats is 8 lines, of halves 4, of q8 a little over 2 — so each plane's rows
 * are all asked for within the call. */
#define IB_ATTN_AHEAD_LINES(kvt) ((kvt) == IB_KV_F32 ? 3 : (kvt) == IB_KV_F16 ? 2 : 1)

/* The next IB_ATTN_AHEAD_LINES cache lines of each of ac's planes asked toward L2 (prefetcht1 on x86: a
 * later call reads them, not this one), a few at each prefetch point of this call rather than a burst:
 * a burst fills the core's miss buffers and the prefetches stall the work between them
 * (bench_attention's memory+ahead case, one thread: f32 92-98 -> 53-56 ns a key, f16 44-47 -> 40-41;
 * docs/cpu.md). ac NULL: none. */
ATTN_AI void ahead_lines(const int kvt, attn_cursor *ac) {
    if (!ac) return;
    for (int t = 0; t < IB_ATTN_AHEAD_LINES(kvt) && ac->off < ac->bytes; t++, ac->off += 64) {
        __builtin_prefetch(ac->k + ac->off, 0, 2);
        __builtin_prefetch(ac->v + ac->off, 0, 2);
    }
}

/* Ask for key or value row j + IB_ATTN_PF_KEYS (bytes [o0, o1) of it) while row j is computed, when
 * that row exists (j + IB_ATTN_PF_KEYS < n_rows), and the next lines of ac's planes (ahead_lines; NULL:
 * none). Row i starts at element base + i*st. One head's keys are a few dozen kilobytes in rows far apart
 * from its values: too short and scattered a stream for the hardware prefetcher, so without this every
 * block waits for memory. */
ATTN_AI void prefetch_row(const int kvt, const void *p, size_t base, size_t st, int j, int n_rows, size_t o0,
                          size_t o1, attn_cursor *ac) {
    ahead_lines(kvt, ac);
    if (j + IB_ATTN_PF_KEYS >= n_rows) return;
    const char *r = (const char *)p + ib_kv_bytes((ib_kv_dtype)kvt, base + (size_t)(j + IB_ATTN_PF_KEYS) * st);
    for (size_t o = o0; o < o1; o += 64) __builtin_prefetch(r + o);
}

/* For each query h < NQ (NQ <= 4; its outputs at out + h*hd, its weights at p + h*rs, its factor c[h]):
 * out[d] = out[d]*c, then out[d] = out[d] + p[j]*v_j[d] for j = j0..nb-1 in order, for every d: the
 * contract's per-element sequence. Columns are walked in register-sized chunks with the values inside,
 * so the accumulators stay in registers, and each value element is loaded (and decoded)
 * once for all the heads; each element's operations are unchanged. A scalar operand of a vector
 * operation is broadcast (a 16-element initializer would not compile to one broadcast). Value j
 * starts at element vo + j*st. */
ATTN_AI void scale_accumulate(const int NQ, const int kvt, float *out, int hd, const float *c, const float *p, int rs,
                              const void *v, size_t vo, size_t st, int j0, int nb, int n_rows, attn_cursor *ac) {
    /* columns per chunk and vectors per chunk per query: NQ x 4 accumulators with 16-lane vectors, at
     * most 8 with 8-lane ones */
    const int CW = VL == 16 || NQ == 1 ? 64 : NQ == 2 ? 32 : 16, NC = CW / VL;
    int d0 = 0;
    for (; d0 + CW <= hd; d0 += CW) {
        vecf o[4][64 / VL];
#pragma GCC unroll 4
        for (int h = 0; h < NQ; h++)
#pragma GCC unroll 8
            for (int u = 0; u < NC; u++) o[h][u] = ldv(out + (size_t)h * hd + d0 + u * VL) * c[h];
        for (int j = j0; j < nb; j++) {
            prefetch_row(kvt, v, vo, st, j, n_rows, ib_kv_bytes((ib_kv_dtype)kvt, (size_t)d0),
                         ib_kv_bytes((ib_kv_dtype)kvt, (size_t)(d0 + CW)), ac);
            const size_t e = vo + (size_t)j * st;   /* row j */
            float pj[4];
#pragma GCC unroll 4
            for (int h = 0; h < NQ; h++) pj[h] = p[(size_t)h * rs + j];
#pragma GCC unroll 8
            for (int u = 0; u < NC; u++) {
                const vecf vv = kvv_at(v, e, (size_t)(d0 + u * VL), kvt);
#pragma GCC unroll 4
                for (int h = 0; h < NQ; h++) o[h][u] = o[h][u] + pj[h] * vv;
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < NQ; h++)
#pragma GCC unroll 8
            for (int u = 0; u < NC; u++) stv(out + (size_t)h * hd + d0 + u * VL, o[h][u]);
    }
    for (int h = 0; h < NQ; h++) {
        float *oh = out + (size_t)h * hd;
        const float *ph = p + (size_t)h * rs;
        int d = d0;
        for (; d + VL <= hd; d += VL) {
            vecf o0 = ldv(oh + d) * c[h];
            for (int j = j0; j < nb; j++) o0 = o0 + ph[j] * kvv_at(v, vo + (size_t)j * st, (size_t)d, kvt);
            stv(oh + d, o0);
        }
        for (; d < hd; d++) {
            float o = oh[d] * c[h];
            for (int j = j0; j < nb; j++) o = o + ph[j] * kv1(v, vo + (size_t)j * st + (size_t)d, kvt);
            oh[d] = o;
        }
    }
}

/* The scaled scores s[h*rs + j] = dot16(q_h, k_j) * scale of queries h < NQ (<= 4) (q_h at q + h*hd) for keys
 * j0..nb-1 of a block (key j at element ko + j*st; the block's keys and those after it number n_rows);
 * ac: a later call's rows to ask for on the way (prefetch_row; NULL: none). */
ATTN_AI void block_scores(const int NQ, const int kvt, const int fused, const float *q, const void *k, size_t ko,
                          size_t st, int hd, float scale, int j0, int nb, int n_rows, float *s, int rs,
                          attn_cursor *ac) {
    const size_t row_bytes = ib_kv_bytes((ib_kv_dtype)kvt, (size_t)hd);
    const int T = IB_ATTN_KEYS(NQ);
    int j = j0;
    for (; j + T <= nb; j += T) {
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) prefetch_row(kvt, k, ko, st, j + t, n_rows, 0, row_bytes, ac);
        dot16_keys(T, NQ, kvt, fused, q, k, ko + (size_t)j * st, st, hd, s + j, rs);
    }
    for (; j < nb; j++) dot16_keys(1, NQ, kvt, fused, q, k, ko + (size_t)j * st, st, hd, s + j, rs);
    for (int h = 0; h < NQ; h++)
        for (j = j0; j < nb; j++) s[(size_t)h * rs + j] = s[(size_t)h * rs + j] * scale;
}

/* The block maximum of one query's scores s[j0..nb) as the key-order walk `mb = s[j] > mb ? s[j] : mb`
 * from mb = -inf gives it, bitwise: the largest score that is not NaN (NaN scores are skipped; -inf
 * when every score is NaN or -inf), and where that maximum is a zero, the zero (+0 or -0) that comes
 * first in key order (a later zero of the other sign is not greater). The portable copy is the walk.
 * The vector copies take VL keys a step, lane-wise: vmaxps(s, acc) is `s > acc ? s : acc` (it returns
 * its second operand when either is NaN or both are zeros), so a NaN score leaves its lane as it was
 * and no lane ever holds a NaN; a maximum that is not a zero is one value whatever order the keys and
 * lanes are combined in, so the lanes fold in any order (masked lanes of the last step hold -inf);
 * only the sign of a zero maximum depends on the order, and there (rare) the walk gives it. Under the
 * test-only attn-block-max fault (maxf, the vector copies only) the operands are swapped (a NaN score
 * wins its lane) and the zero the fold ends on is kept. */
ATTN_AI float block_max(const float *s, int j0, int nb, int maxf) {
    float mb = -INFINITY;
    (void)maxf;
#if defined(IB_ATTN_AVX512)
    __m512 a = _mm512_set1_ps(-INFINITY);
    int j = j0;
    if (__builtin_expect(maxf, 0)) {
        for (; j + 16 <= nb; j += 16) a = _mm512_max_ps(a, _mm512_loadu_ps(s + j));
        if (j < nb) a = _mm512_max_ps(a, _mm512_mask_loadu_ps(a, (__mmask16)((1u << (nb - j)) - 1u), s + j));
        return _mm512_reduce_max_ps(a);
    }
    for (; j + 16 <= nb; j += 16) a = _mm512_max_ps(_mm512_loadu_ps(s + j), a);
    if (j < nb) a = _mm512_max_ps(_mm512_mask_loadu_ps(a, (__mmask16)((1u << (nb - j)) - 1u), s + j), a);
    mb = _mm512_reduce_max_ps(a);
#elif defined(IB_ATTN_AVX2)
    __m256 a = _mm256_set1_ps(-INFINITY);
    int j = j0;
    if (__builtin_expect(maxf, 0)) {
        for (; j + 8 <= nb; j += 8) a = _mm256_max_ps(a, _mm256_loadu_ps(s + j));
        for (; j < nb; j++) a = _mm256_max_ps(a, _mm256_set1_ps(s[j]));
    } else {
        for (; j + 8 <= nb; j += 8) a = _mm256_max_ps(_mm256_loadu_ps(s + j), a);
        if (j < nb) { /* the last 1-7 keys, the lanes past them -inf */
            const __m256 in = _mm256_cmp_ps(_mm256_set1_ps((float)(nb - j)), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7),
                                            _CMP_GT_OQ);
            const __m256 x = _mm256_maskload_ps(s + j, _mm256_castps_si256(in));
            a = _mm256_max_ps(_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, in), a);
        }
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    mb = _mm_cvtss_f32(h);
    if (maxf) return mb;
#endif
#ifdef IB_ATTN_VECTOR_ISA
    if (mb != 0.0f) return mb;
    mb = -INFINITY; /* a zero maximum: its sign is the first zero's in key order, as the walk finds it */
#endif
    for (int j = j0; j < nb; j++) mb = s[j] > mb ? s[j] : mb;
    return mb;
}

/* The softmax side of one block's online update for NQ <= 4 queries from their scores (head h's s[j0..nb)
 * at s + h*rs): per head, the block max, m' = max(m, it), c = exp(m - m') (c[h]: the factor that
 * rescales what the outputs hold so far), the weights pw[j] = exp(s[j] - m') (to pw + h*rs,
 * lane-parallel), l = l*c then l += pw[j] in key order; m[h], l[h] move on. The heads' loops are
 * interleaved: each head's sum (and in the portable copy its max) is a chain of dependent operations
 * (one per key), which the heads run side by side; each head's operations and their order are those
 * of one head alone. The vector copies take each block max across the keys in lanes (block_max, the
 * walk's bits; maxf: the attn-block-max fault). */
ATTN_AI void block_weights_n(const int NQ, const float *s, int rs, int j0, int nb, float *m, float *l, float *pw,
                             float *c, int maxf) {
    /* each head's running block max and sum in a scalar of its own (kept in a register: as an array
     * indexed by head they went through the stack, a store and a reload per key) */
    const float *s0 = s, *s1 = s + (NQ > 1 ? rs : 0), *s2 = s + (NQ > 2 ? 2 * rs : 0), *s3 = s + (NQ > 3 ? 3 * rs : 0);
    float mb0 = -INFINITY, mb1 = -INFINITY, mb2 = -INFINITY, mb3 = -INFINITY, m_new[4], lv[4];
#ifdef IB_ATTN_VECTOR_ISA
    /* the block maxima across the keys in lanes (block_max: the walk's bits) */
    mb0 = block_max(s0, j0, nb, maxf);
    if (NQ > 1) mb1 = block_max(s1, j0, nb, maxf);
    if (NQ > 2) mb2 = block_max(s2, j0, nb, maxf);
    if (NQ > 3) mb3 = block_max(s3, j0, nb, maxf);
#else
    (void)maxf;
    for (int j = j0; j < nb; j++) {
        mb0 = s0[j] > mb0 ? s0[j] : mb0;
        if (NQ > 1) mb1 = s1[j] > mb1 ? s1[j] : mb1;
        if (NQ > 2) mb2 = s2[j] > mb2 ? s2[j] : mb2;
        if (NQ > 3) mb3 = s3[j] > mb3 ? s3[j] : mb3;
    }
#endif
    const float mb[4] = {mb0, mb1, mb2, mb3};
#pragma GCC unroll 4
    for (int h = 0; h < NQ; h++) {
        m_new[h] = mb[h] > m[h] ? mb[h] : m[h];
        c[h] = ib_expf(m[h] - m_new[h]); /* exp(-inf) = 0 on the first block */
        lv[h] = l[h] * c[h];
    }
#pragma GCC unroll 4
    for (int h = 0; h < NQ; h++)
        for (int j = j0; j < nb; j++) pw[(size_t)h * rs + j] = ib_expf_lane(s[(size_t)h * rs + j] - m_new[h]);
    const float *p0 = pw, *p1 = pw + (NQ > 1 ? rs : 0), *p2 = pw + (NQ > 2 ? 2 * rs : 0),
                *p3 = pw + (NQ > 3 ? 3 * rs : 0);
    float l0 = lv[0], l1 = lv[NQ > 1 ? 1 : 0], l2 = lv[NQ > 2 ? 2 : 0], l3 = lv[NQ > 3 ? 3 : 0];
    for (int j = j0; j < nb; j++) {
        l0 = l0 + p0[j];
        if (NQ > 1) l1 = l1 + p1[j];
        if (NQ > 2) l2 = l2 + p2[j];
        if (NQ > 3) l3 = l3 + p3[j];
    }
    const float lf[4] = {l0, l1, l2, l3};
#pragma GCC unroll 4
    for (int h = 0; h < NQ; h++) m[h] = m_new[h], l[h] = lf[h];
}

/* block_weights_n for NQ = 1..4 as functions of their own, for attend_rows_body: inlined into its large
 * body, the running maxima and sums were given stack slots (a store and a reload per key on each chain;
 * the one-row bodies keep it inlined, where a call cost more than it saved). */
#define IB_ATTN_WEIGHTS_FN(NQ)                                                                                   \
    static __attribute__((noinline)) void block_weights_##NQ(const float *s, int rs, int j0, int nb, float *m,  \
                                                             float *l, float *pw, float *c, int maxf) {         \
        block_weights_n(NQ, s, rs, j0, nb, m, l, pw, c, maxf);                                                   \
    }
IB_ATTN_WEIGHTS_FN(1)
IB_ATTN_WEIGHTS_FN(2)
IB_ATTN_WEIGHTS_FN(3)
IB_ATTN_WEIGHTS_FN(4)

/* block_weights_n through the function for NQ (a constant wherever this is inlined). */
ATTN_AI void block_weights(const int NQ, const float *s, int rs, int j0, int nb, float *m, float *l, float *pw,
                           float *c, int maxf) {
    switch (NQ) {
    case 4: block_weights_4(s, rs, j0, nb, m, l, pw, c, maxf); break;
    case 3: block_weights_3(s, rs, j0, nb, m, l, pw, c, maxf); break;
    case 2: block_weights_2(s, rs, j0, nb, m, l, pw, c, maxf); break;
    default: block_weights_1(s, rs, j0, nb, m, l, pw, c, maxf); break;
    }
}

/* One block of keys j0..nb-1 (key and value j at element ko + j*st; with those after it n_rows) for
 * NQ <= 4 queries q [NQ][hd]: their scores, then each head's online-softmax update of its running
 * max m[h], sum l[h] and outputs out [NQ][hd]; the softmax side through block_weights when
 * weights_fn (a constant), inlined otherwise. ac: a later call's rows to ask for on the way (NULL: none). */
ATTN_AI void heads_block(const int NQ, const int weights_fn, const int kvt, const int fused, const float *q,
                         const void *k, const void *v, size_t ko, size_t st, int hd, float scale, int j0, int nb,
                         int n_rows, float *m, float *l, float *out, int maxf, attn_cursor *ac) {
    float s[4 * IB_ATTN_MAX_BLOCK], pw[4 * IB_ATTN_MAX_BLOCK], c[4];
    block_scores(NQ, kvt, fused, q, k, ko, st, hd, scale, j0, nb, n_rows, s, IB_ATTN_MAX_BLOCK, ac);
    if (weights_fn) block_weights(NQ, s, IB_ATTN_MAX_BLOCK, j0, nb, m, l, pw, c, maxf);
    else block_weights_n(NQ, s, IB_ATTN_MAX_BLOCK, j0, nb, m, l, pw, c, maxf);
    scale_accumulate(NQ, kvt, out, hd, c, pw, IB_ATTN_MAX_BLOCK, v, ko, st, j0, nb, n_rows, ac);
}

/* attend_block2_body's work for NQ <= 2 of its heads (q, m, l, out advanced to the first). */
ATTN_AI void block2_heads(const int NQ, const int kvt, const int fused, const float *q, const void *k1,
                         const void *v1, int n1, const void *k2, const void *v2, int n2, size_t st, int hd,
                         float scale, float *m, float *l, float *out, int maxf) {
    enum { RS = IB_ATTN_MAX_BLOCK };
    float s[2 * RS], pw[2 * RS], c[2];
    static const float one[2] = {1.0f, 1.0f};
    block_scores(NQ, kvt, fused, q, k1, 0, st, hd, scale, 0, n1, n1, s, RS, NULL);
    if (n2 > 0) block_scores(NQ, kvt, fused, q, k2, 0, st, hd, scale, 0, n2, n2, s + n1, RS, NULL);
    block_weights_n(NQ, s, RS, 0, n1 + n2, m, l, pw, c, maxf);
    scale_accumulate(NQ, kvt, out, hd, c, pw, RS, v1, 0, st, 0, n1, n1, NULL);
    if (n2 > 0) scale_accumulate(NQ, kvt, out, hd, one, pw + n1, RS, v2, 0, st, 0, n2, n2, NULL);
}

/* One key block for nq heads whose n1 + n2 (<= IB_ATTN_MAX_BLOCK, n1 >= 1) rows lie in two runs: n1
 * at k1 / v1, then n2 at k2 / v2 (row stride st elements; a ring buffer that wraps inside the block).
 * Continues each head's online softmax: running max m[nq], sum l[nq], unnormalized out [nq][hd].
 * Bitwise what attend_heads_body does for the same keys as one block in one run: scores are per key,
 * and the values' pass over the second run goes on from the first's outputs with a factor of 1
 * (x * 1 = x exactly). */
ATTN_AI void attend_block2_body(const int kvt, const int fused, const float *q, int nq, const void *k1,
                                const void *v1, int n1, const void *k2, const void *v2, int n2, size_t st, int hd,
                                float scale, float *m, float *l, float *out, int maxf) {
    int h = 0;
    for (; IB_ATTN_PAIRS && h + 2 <= nq; h += 2)
        block2_heads(2, kvt, fused, q + (size_t)h * hd, k1, v1, n1, k2, v2, n2, st, hd, scale, m + h, l + h,
                     out + (size_t)h * hd, maxf);
    for (; h < nq; h++)
        block2_heads(1, kvt, fused, q + (size_t)h * hd, k1, v1, n1, k2, v2, n2, st, hd, scale, m + h, l + h,
                     out + (size_t)h * hd, maxf);
}

/* ib_attend_heads over a KV plane of type kvt (float, half or q8): nq query heads q [nq][hd] walk
 * each key block in turn while its keys and values are in L1; out [nq][hd]. block <= IB_ATTN_MAX_BLOCK.
 * ac (NULL: none): rows a later call reads, asked for a few cache lines at each of this call's own
 * prefetch points (ahead_lines). */
ATTN_AI void attend_heads_body(const int kvt, const int fused, const float *q, int nq, const void *k, const void *v,
                               int n_keys, int kv_stride, int hd, float scale, int block, int window, float *out,
                               int maxf, attn_cursor *ac) {
    float m[IB_ATTN_MAX_GROUP], l[IB_ATTN_MAX_GROUP];
    const int lo = window > 0 && n_keys > window ? n_keys - window : 0;  /* first attended key */
    const int b_first = lo - lo % block;                                  /* its block's first key */
    const size_t st = (size_t)kv_stride;
    for (int h = 0; h < nq; h++) m[h] = -INFINITY, l[h] = 0.0f;
    for (int d = 0; d < nq * hd; d++) out[d] = 0.0f;
    for (int b0 = b_first; b0 < n_keys; b0 += block) {
        int j0 = lo > b0 ? lo - b0 : 0;
        int nb = n_keys - b0 < block ? n_keys - b0 : block;
        int h = 0;
        for (; IB_ATTN_PAIRS && h + 2 <= nq; h += 2)
            heads_block(2, 0, kvt, fused, q + (size_t)h * hd, k, v, (size_t)b0 * st, st, hd, scale, j0, nb, n_keys - b0,
                        m + h, l + h, out + (size_t)h * hd, maxf, ac);
        for (; h < nq; h++)
            heads_block(1, 0, kvt, fused, q + (size_t)h * hd, k, v, (size_t)b0 * st, st, hd, scale, j0, nb, n_keys - b0,
                        m + h, l + h, out + (size_t)h * hd, maxf, ac);
    }
    for (int h = 0; h < nq; h++)
        for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] = out[(size_t)h * hd + d] / l[h];
}

/* The first key (block-aligned: the first block's start) and the first attended key of a row with
 * n_keys keys, as attend_heads_body walks them. */
ATTN_AI int row_lo(int n_keys, int window) { return window > 0 && n_keys > window ? n_keys - window : 0; }

/* One key block [b0, b0 + block) for the tile's queries: query x (row x / nq, head x % nq) at qt + x*hd,
 * its running max m[x], sum l[x] and unnormalized outputs ot + x*hd. Row t takes the block when
 * attend_heads_body would for its n_keys[t] keys, with the same keys j0..nb-1 of it; up to
 * IB_ATTN_GROUP consecutive queries whose rows take the same keys of the block go through heads_block
 * together (its loads shared, each query's operations its own). */
ATTN_AI void rows_block(const int kvt, const int fused, const float *qt, int nq, int nr, const int *n_keys,
                        const void *k, const void *v, size_t st, int hd, float scale, int block, int window, int b0,
                        float *m, float *l, float *ot, int maxf) {
    const int nx = nr * nq;
    for (int x = 0; x < nx;) {
        const int t = x / nq, n = n_keys[t], lo = row_lo(n, window);
        if (b0 < lo - lo % block || b0 >= n) { /* the block is outside row t's keys */
            x = (t + 1) * nq;
            continue;
        }
        const int j0 = lo > b0 ? lo - b0 : 0, nb = n - b0 < block ? n - b0 : block;
        int g = 1;
        while (g < IB_ATTN_GROUP && x + g < nx) {
            const int u = (x + g) / nq, nu = n_keys[u], lu = row_lo(nu, window);
            if (u != t && ((lu > b0 ? lu - b0 : 0) != j0 || (nu - b0 < block ? nu - b0 : block) != nb ||
                           b0 < lu - lu % block))
                break;
            g++;
        }
        const float *qx = qt + (size_t)x * hd;
        float *ox = ot + (size_t)x * hd;
        const size_t ko = (size_t)b0 * st;
        switch (g) {
        case 4: heads_block(4, 1, kvt, fused, qx, k, v, ko, st, hd, scale, j0, nb, n - b0, m + x, l + x, ox, maxf, NULL); break;
        case 3: heads_block(3, 1, kvt, fused, qx, k, v, ko, st, hd, scale, j0, nb, n - b0, m + x, l + x, ox, maxf, NULL); break;
        case 2: heads_block(2, 1, kvt, fused, qx, k, v, ko, st, hd, scale, j0, nb, n - b0, m + x, l + x, ox, maxf, NULL); break;
        default: heads_block(1, 1, kvt, fused, qx, k, v, ko, st, hd, scale, j0, nb, n - b0, m + x, l + x, ox, maxf, NULL); break;
        }
        x += g;
    }
}

/* ib_attend_rows over a KV plane of type kvt (float, half or q8): the nr rows' nq query heads
 * (row t's q + t*q_stride [nq][hd]) walk the key blocks together, block by block in ascending order,
 * each block's keys and values read from memory once for all of them and from L1 after; row t's
 * outputs (out + t*out_stride [nq][hd]) are attend_heads_body's for its n_keys[t] keys: the same
 * blocks, the same keys of each, each query's operations in the same order.
 * nr*nq <= IB_ATTN_TILE_Q, hd <= IB_ATTN_MAX_HD, block <= IB_ATTN_MAX_BLOCK. */
ATTN_AI void attend_rows_body(const int kvt, const int fused, const float *q, size_t q_stride, int nq, int nr,
                              const int *n_keys, const void *k, const void *v, int kv_stride, int hd, float scale,
                              int block, int window, float *out, size_t out_stride, int maxf) {
    float qt[IB_ATTN_TILE_Q * IB_ATTN_MAX_HD], ot[IB_ATTN_TILE_Q * IB_ATTN_MAX_HD]; /* [nr*nq][hd] each */
    float m[IB_ATTN_TILE_Q], l[IB_ATTN_TILE_Q];                                     /* [nr*nq] */
    const size_t st = (size_t)kv_stride, rowq = (size_t)nq * hd;
    int b_first = n_keys[0], b_end = 0;
    for (int t = 0; t < nr; t++) {
        const int lo = row_lo(n_keys[t], window);
        if (lo - lo % block < b_first) b_first = lo - lo % block;
        if (n_keys[t] > b_end) b_end = n_keys[t];
        for (size_t e = 0; e < rowq; e++) qt[(size_t)t * rowq + e] = q[(size_t)t * q_stride + e];
    }
    for (size_t e = 0; e < (size_t)nr * rowq; e++) ot[e] = 0.0f;
    for (int x = 0; x < nr * nq; x++) m[x] = -INFINITY, l[x] = 0.0f;
    for (int b0 = b_first; b0 < b_end; b0 += block)
        rows_block(kvt, fused, qt, nq, nr, n_keys, k, v, st, hd, scale, block, window, b0, m, l, ot, maxf);
    for (int x = 0; x < nr * nq; x++) {
        float *o = out + (size_t)(x / nq) * out_stride + (size_t)(x % nq) * hd;
        for (int d = 0; d < hd; d++) o[d] = ot[(size_t)x * hd + d] / l[x];
    }
}

/* Whether the test-only attn-block-max fault acts on this copy (the vector ones; block_max): read once
 * per call, a runtime argument (not a constant: the bodies are not built twice for it). */
static int max_fault(ib_fault fault) {
#ifdef IB_ATTN_VECTOR_ISA
    return fault == IB_FAULT_ATTN_BLOCK_MAX;
#else
    (void)fault;
    return 0;
#endif
}

/* CALL (a body call naming its KV type K_) with K_ the constant for kvt (IB_KV_F32, IB_KV_F16 or
 * IB_KV_Q8; anything else is taken as F32), so each type gets its own inlined body. */
#define IB_ATTN_BY_KVT(kvt, CALL)                                                                                \
    do {                                                                                                         \
        switch (kvt) {                                                                                           \
        case IB_KV_Q8: { const int K_ = IB_KV_Q8; CALL; } break;                                                \
        case IB_KV_F16: { const int K_ = IB_KV_F16; CALL; } break;                                              \
        default: { const int K_ = IB_KV_F32; CALL; } break;                                                     \
        }                                                                                                        \
    } while (0)

/* The body for KV of type kvt, the faults read once per call; ahead (NULL: none) as a cursor for
 * attend_heads_body — a copy of its own, so a call without one carries no cursor tests. */
static void attend_copy(const int kvt, const void *k, const void *v, const float *q, int nq, int n_keys, int kv_stride,
                        int hd, float scale, int block, int window, float *out, const ib_attn_ahead *ahead) {
    const ib_fault fault = ib_fault_get();
    const int mf = max_fault(fault);
    attn_cursor cur = {NULL, NULL, 0, 0}, *ac = NULL;
    if (ahead) cur = (attn_cursor){(const char *)ahead->k, (const char *)ahead->v, 0, ahead->bytes}, ac = &cur;
#ifdef IB_ATTN_VECTOR_ISA
    if (fault == IB_FAULT_ISA_FMA) {
        IB_ATTN_BY_KVT(kvt, attend_heads_body(K_, 1, q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out, 0,
                                              ac));
        return;
    }
#endif
    if (ac)
        IB_ATTN_BY_KVT(kvt, attend_heads_body(K_, 0, q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out, mf,
                                              &cur));
    else
        IB_ATTN_BY_KVT(kvt, attend_heads_body(K_, 0, q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out, mf,
                                              NULL));
}

/* attend_block2_body for KV of type kvt, the faults read once per call. */
static void block2_copy(const int kvt, const float *q, int nq, const void *k1, const void *v1, int n1, const void *k2,
                        const void *v2, int n2, int kv_stride, int hd, float scale, float *m, float *l, float *out) {
    const size_t st = (size_t)kv_stride;
    const ib_fault fault = ib_fault_get();
    const int mf = max_fault(fault);
#ifdef IB_ATTN_VECTOR_ISA
    if (fault == IB_FAULT_ISA_FMA) {
        IB_ATTN_BY_KVT(kvt, attend_block2_body(K_, 1, q, nq, k1, v1, n1, k2, v2, n2, st, hd, scale, m, l, out, 0));
        return;
    }
#endif
    IB_ATTN_BY_KVT(kvt, attend_block2_body(K_, 0, q, nq, k1, v1, n1, k2, v2, n2, st, hd, scale, m, l, out, mf));
}

/* attend_rows_body for KV of type kvt, the faults read once per call. Under the test-only
 * attn-tile-range fault every row of a tile of several rows attends the keys of the tile's last row
 * (earlier rows see later positions' keys). */
static void rows_copy(const int kvt, const float *q, size_t q_stride, int nq, int nr, const int *n_keys, const void *k,
                      const void *v, int kv_stride, int hd, float scale, int block, int window, float *out,
                      size_t out_stride) {
    int nk[IB_ATTN_TILE_Q];
    const ib_fault fault = ib_fault_get();
    const int mf = max_fault(fault);
    if (nr < 1) return;
    for (int t = 0; t < nr; t++) nk[t] = fault == IB_FAULT_ATTN_TILE_RANGE ? n_keys[nr - 1] : n_keys[t];
#ifdef IB_ATTN_VECTOR_ISA
    if (fault == IB_FAULT_ISA_FMA) {
        IB_ATTN_BY_KVT(kvt, attend_rows_body(K_, 1, q, q_stride, nq, nr, nk, k, v, kv_stride, hd, scale, block, window,
                                             out, out_stride, 0));
        return;
    }
#endif
    IB_ATTN_BY_KVT(kvt, attend_rows_body(K_, 0, q, q_stride, nq, nr, nk, k, v, kv_stride, hd, scale, block, window, out,
                                         out_stride, mf));
}

/* One block's softmax step (block_weights_n, this copy's) for nq (1..4) queries' scores s + h*rs
 * (keys j0..nb-1, nb <= IB_ATTN_MAX_BLOCK): m[nq], l[nq] move on, the weights to pw + h*rs, the
 * factors to c[nq]; the attn-block-max fault read as the bodies read it. For tests: the attention
 * bodies reach scores such as NaN, -0 or a block of -inf only through extreme inputs, where the outputs
 * no longer show the block max's bits; this compares them directly. */
static void weights_copy(int nq, const float *s, int rs, int j0, int nb, float *m, float *l, float *pw, float *c) {
    const int mf = max_fault(ib_fault_get());
    switch (nq) {
    case 4: block_weights_n(4, s, rs, j0, nb, m, l, pw, c, mf); break;
    case 3: block_weights_n(3, s, rs, j0, nb, m, l, pw, c, mf); break;
    case 2: block_weights_n(2, s, rs, j0, nb, m, l, pw, c, mf); break;
    default: block_weights_n(1, s, rs, j0, nb, m, l, pw, c, mf); break;
    }
}

/* The entry points of a copy, named ib_attend_heads_<sfx>, ib_attend_heads_kv_<sfx>, ib_attend_heads_ahead_<sfx>,
 * ib_attend_block2_<sfx>, ib_attend_rows_<sfx> and (for tests) ib_attend_block_weights_<sfx> (their
 * declarations are in ops.h). */
#define IB_ATTN_DEFINE_COPY(sfx)                                                                                 \
    void ib_attend_heads_##sfx(const float *q, int nq, const float *k, const float *v, int n_keys, int kv_stride, \
                               int hd, float scale, int block, int window, float *out) {                        \
        attend_copy(0, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out, NULL);                     \
    }                                                                                                            \
    void ib_attend_heads_kv_##sfx(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq,         \
                                  int n_keys, int kv_stride, int hd, float scale, int block, int window,         \
                                  float *out) {                                                                  \
        attend_copy(kvt, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out, NULL);                   \
    }                                                                                                            \
    void ib_attend_heads_ahead_##sfx(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq,      \
                                     int n_keys, int kv_stride, int hd, float scale, int block, int window,      \
                                     float *out, const ib_attn_ahead *ahead) {                                   \
        attend_copy(kvt, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out, ahead);                  \
    }                                                                                                            \
    void ib_attend_block2_##sfx(ib_kv_dtype kvt, const float *q, int nq, const void *k1, const void *v1, int n1,         \
                                const void *k2, const void *v2, int n2, int kv_stride, int hd, float scale,      \
                                float *m, float *l, float *out) {                                                \
        block2_copy(kvt, q, nq, k1, v1, n1, k2, v2, n2, kv_stride, hd, scale, m, l, out);                        \
    }                                                                                                            \
    void ib_attend_rows_##sfx(ib_kv_dtype kvt, const float *q, size_t q_stride, int nq, int nr, const int *n_keys,       \
                              const void *k, const void *v, int kv_stride, int hd, float scale, int block,       \
                              int window, float *out, size_t out_stride) {                                       \
        rows_copy(kvt, q, q_stride, nq, nr, n_keys, k, v, kv_stride, hd, scale, block, window, out, out_stride);  \
    }                                                                                                            \
    void ib_attend_block_weights_##sfx(int nq, const float *s, int rs, int j0, int nb, float *m, float *l,       \
                                       float *pw, float *c) {                                                    \
        weights_copy(nq, s, rs, j0, nb, m, l, pw, c);                                                            \
    }

#endif
