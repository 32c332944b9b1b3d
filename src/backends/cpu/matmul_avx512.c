/*
 * matmul_avx512.c — the AVX-512 panel kernel (F, BW, VL, DQ, VNNI). Same arithmetic as
 * matmul_scalar.c, bit for bit: one zmm register holds the 16 lanes (outputs) of a panel (two of
 * doubles for F32 activations' sums), every lane walks K (or the groups) in the canonical order; float
 * products and sums are separate vmulps / vaddps (vfmadd only under IB_FAULT_ISA_FMA), the F32 path's
 * double sums of exact products vfmadd231pd. Q8 activations use vpdpbusd (u8 weight code x s8 activation,
 * 4 consecutive k per lane, exact int32 accumulation: the group sum is exact in any order): per panel
 * in tiles of up to 8 rows for fewer than QT_MIN_ROWS rows (tile_q), else in tiles of 4 rows x 4
 * panels, groups outermost (qt_tile; 235 -> 350 GMAC/s on one Zen 5 core at 16-64 rows in cache).
 */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "backends/cpu/pack.h"

#define AI static inline __attribute__((always_inline))

/* Weights are prefetched this many bytes ahead of the tile that reads them (panels are contiguous, so
 * this runs on into the next panel): the first tile of a panel streams them from memory. The distance
 * covers a DRAM latency at the rate one core consumes weights (about 100 ns x 40 GB/s, with room);
 * at 1 KiB a 1-row product from memory ran 20-25% slower on a Zen 4 core, its loads waiting on lines.
 * The Q8 tiles prefetch into L2 only (T1: the deeper L2 miss queue, not L1's few miss buffers, holds
 * the lines in flight; 4-7% faster on one core than into L1). */
#define IB_PF_DIST 8192

/* ---------------------------------------------------------------- dequantization (F32 path) */

/* Input: 16 lanes x 4 bytes (byte 4j+i of lane j). Output: 128-bit chunk i = byte i of lanes 0..15. */
AI __m512i transpose_16x4(__m512i w) {
    const __m512i sh = _mm512_set4_epi32(0x0f0b0703, 0x0e0a0602, 0x0d090501, 0x0c080400);
    __m512i t = _mm512_shuffle_epi8(w, sh); /* per 128 bits: dword i = byte i of its 4 lanes */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(idx, t);
}

/* The 16 bytes of chunk i of t, zero-extended to 16 int32. */
AI __m512i chunk_u8(__m512i t, int i) {
    __m128i c;
    switch (i) {
    case 0: c = _mm512_castsi512_si128(t); break;
    case 1: c = _mm512_extracti32x4_epi32(t, 1); break;
    case 2: c = _mm512_extracti32x4_epi32(t, 2); break;
    default: c = _mm512_extracti32x4_epi32(t, 3); break;
    }
    return _mm512_cvtepu8_epi32(c);
}

/* w = s*(float)q + b for 16 lanes. */
AI __m512 deq16(__m512i q, __m512 s, __m512 b) {
    return _mm512_add_ps(_mm512_mul_ps(s, _mm512_cvtepi32_ps(q)), b);
}

/* 16 stored scales or biases (layout in pack.h) as floats, exactly. */
AI __m512 load_sb16(ib_sbfmt fmt, const uint8_t *p) {
    if (fmt == IB_SB_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    if (fmt == IB_SB_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_loadu_ps((const float *)p);
}

/* The scales (which = 0) or biases (which = 1) of panel p, group g. */
AI __m512 group_sb(const ib_matrix *m, int p, int g, int which) {
    return load_sb16(m->sb_fmt, ib_pk_sb(m, p, g) + (size_t)which * 16 * ib_pk_sb_elem(m));
}

/* Dequantize columns [k0, k0+kn) of quantized panel p into w [kn][16] (k0, kn multiples of 8). */
static void dequant_block(const ib_matrix *m, int p, int k0, int kn, float *w) {
    const uint8_t *P = ib_pk_panel(m, p);
    const __m512i m4 = _mm512_set1_epi32(15);
    const int step = m->fmt == IB_WQ4 ? 8 : 4;
    for (int k = k0; k < k0 + kn; k += step) {
        const uint8_t *blk = P + (size_t)(k / step) * 64;
        __m512 s = group_sb(m, p, k / m->group, 0), b = group_sb(m, p, k / m->group, 1);
        __m512i t = transpose_16x4(_mm512_loadu_si512((const void *)blk));
        float *o = w + (size_t)(k - k0) * 16;
        if (m->fmt == IB_WQ4) {
            for (int i = 0; i < 4; i++) {
                __m512i v = chunk_u8(t, i);
                _mm512_storeu_ps(o + i * 16, deq16(_mm512_and_si512(v, m4), s, b));
                _mm512_storeu_ps(o + (i + 4) * 16, deq16(_mm512_srli_epi32(v, 4), s, b));
            }
        } else {
            for (int i = 0; i < 4; i++) _mm512_storeu_ps(o + i * 16, deq16(chunk_u8(t, i), s, b));
        }
    }
}

/* ---------------------------------------------------------------- F32 activations */

/* The 16 weights of one k as doubles: from the block's doubles (WD) or widened here from its floats. */
AI void load_w16(const int WD, const void *wk, __m512d *w0, __m512d *w1) {
    if (WD) {
        *w0 = _mm512_loadu_pd((const double *)wk), *w1 = _mm512_loadu_pd((const double *)wk + 8);
    } else {
        *w0 = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)wk));
        *w1 = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)wk + 8));
    }
}

/* One k of R rows: a[r] = a[r] + w(k) * x(r, k), lanes 0-7 in a[r][0] and 8-15 in a[r][1], x the rows'
 * activations as doubles (row r at xk + r * ldx), w 16 doubles (WD) or floats at wk. Every value is
 * exactly a float and the product of two floats is exact in double, so vfmadd231pd is the mul then the
 * add. Under a fault (ib_pk_chain) a float32 chain instead: vmulps then vaddps, or vfmadd231ps. */
AI void mac_k(const int R, const ib_pk_chain ch, const int WD, __m512d a[][2], const void *wk, const double *xk,
              size_t ldx) {
    __m512d w0, w1;
    load_w16(WD, wk, &w0, &w1);
    if (ch != IB_PK_CHAIN_DOUBLE) {
        const __m512 wv = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(w0)), _mm512_cvtpd_ps(w1), 1);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 af = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(a[r][0])), _mm512_cvtpd_ps(a[r][1]), 1);
            const __m512 xv = _mm512_set1_ps((float)xk[r * ldx]);
            af = ch == IB_PK_CHAIN_FLOAT_FMA ? _mm512_fmadd_ps(wv, xv, af) : _mm512_add_ps(af, _mm512_mul_ps(wv, xv));
            a[r][0] = _mm512_cvtps_pd(_mm512_castps512_ps256(af));
            a[r][1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(af, 1));
        }
        return;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        const __m512d xv = _mm512_set1_pd(xk[r * ldx]);
        a[r][0] = _mm512_fmadd_pd(w0, xv, a[r][0]);
        a[r][1] = _mm512_fmadd_pd(w1, xv, a[r][1]);
    }
}

/* R rows (R <= 8) of a chunk: acc [R][16] (double) += w [kn][16] (doubles when WD, else floats) times x
 * (row r at x + r*ldx), walking k ascending, or descending when desc. The rows' x are widened to double
 * once (xd), so each row and k costs a broadcast load and two vfmadd231pd. */
AI void tile_f32(const int R, const ib_pk_chain ch, const int WD, double *acc, const float *x, size_t ldx,
                 const void *w, int kn, int desc) {
    const size_t wstep = WD ? 16 * sizeof(double) : 16 * sizeof(float);
    double xd[8][IB_KBLOCK] __attribute__((aligned(64)));   /* [R][kn] */
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        int k = 0;
        for (; k + 8 <= kn; k += 8) _mm512_store_pd(xd[r] + k, _mm512_cvtps_pd(_mm256_loadu_ps(x + r * ldx + k)));
        for (; k < kn; k++) xd[r][k] = (double)x[r * ldx + k];
    }
    __m512d a[8][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) a[r][0] = _mm512_loadu_pd(acc + r * 16), a[r][1] = _mm512_loadu_pd(acc + r * 16 + 8);
    const uint8_t *wb = (const uint8_t *)w;
    if (desc)
        for (int k = kn - 1; k >= 0; k--) mac_k(R, ch, WD, a, wb + (size_t)k * wstep, &xd[0][k], IB_KBLOCK);
    else
        for (int k = 0; k < kn; k++) mac_k(R, ch, WD, a, wb + (size_t)k * wstep, &xd[0][k], IB_KBLOCK);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm512_storeu_pd(acc + r * 16, a[r][0]), _mm512_storeu_pd(acc + r * 16 + 8, a[r][1]);
}

/* All rows of one K block, in tiles of 8 (then the remainder). */
AI void rows_f32(const ib_pk_chain ch, const int WD, double (*acc)[16], const float *x, size_t ldx, int nb,
                 const void *w, int kn, int desc) {
    int r = 0;
    for (; r + 8 <= nb; r += 8) tile_f32(8, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc);
    switch (nb - r) {
    case 7: tile_f32(7, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc); break;
    case 6: tile_f32(6, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc); break;
    case 5: tile_f32(5, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc); break;
    case 4: tile_f32(4, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc); break;
    case 3: tile_f32(3, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc); break;
    case 2: tile_f32(2, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc); break;
    case 1: tile_f32(1, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc); break;
    default: break;
    }
}

/* n floats (a multiple of 16) to doubles. */
AI void widen_block(const float *w, double *wd, int n) {
    for (int i = 0; i < n; i += 8) _mm512_store_pd(wd + i, _mm512_cvtps_pd(_mm256_loadu_ps(w + i)));
}

#define F32_ALIGN 64
#include "backends/cpu/panel_f32_impl.h"

/* ---------------------------------------------------------------- Q8 activations */

/* R rows (R <= 8) of a quantized panel against Q8 activations: xq row r at xq + r*K, d/ad row r at
 * d + r*ng; outputs to y + r*ldy. Groups ascending (descending when desc); weights prefetched
 * IB_PF_DIST ahead. Per row, A independent int32 accumulators (A = 4 for tiles of up to 2 rows, else
 * 2: enough chains to hide the vpdpbusd latency with the registers there are) each take every A-th
 * 64-byte block of the group's low or high nibbles; the 4-bit high nibble is used in place (w & 0xf0 =
 * 16 * code), so its accumulators hold 16 times the sum. All of it is exact integer arithmetic, so
 *   isum = lo sums + (hi sums >> 4);  acc = (acc + (s*d)*(float)isum) + b*ad
 * gives the canonical value whatever A is. */
AI void tile_q(const int R, const int q4, const ib_matrix *m, int p, const int8_t *xq, const float *d,
               const float *ad, int desc, float *y, int ldy) {
    const int K = m->cols, G = m->group, ng = K / G;
    enum { AMAX = 4 };
    const int A = R <= 2 ? 4 : 2; /* accumulators per row: A/2 for low nibbles (or even blocks), A/2 high */
    const uint8_t *P = ib_pk_panel(m, p);
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi4 = _mm512_set1_epi8((char)0xf0);
    __m512 f[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
    for (int gi = 0; gi < ng; gi++) {
        const int g = desc ? ng - 1 - gi : gi;
        __m512i a[8][AMAX];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int i = 0; i < A; i++) a[r][i] = _mm512_setzero_si512();
        if (q4) {
            /* block j (8 k) -> accumulators (j % (A/2)) for low, A/2 + (j % (A/2)) for high */
            for (int k = g * G; k < (g + 1) * G; k += 4 * A) {
#pragma GCC unroll 2
                for (int h = 0; h < A / 2; h++) {
                    const uint8_t *blk = P + (size_t)(k / 8 + h) * 64;
                    _mm_prefetch((const char *)(blk + IB_PF_DIST), _MM_HINT_T1);
                    __m512i w = _mm512_loadu_si512((const void *)blk);
                    __m512i lo = _mm512_and_si512(w, lo4), hi = _mm512_and_si512(w, hi4);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const int8_t *xr = xq + (size_t)r * K + k + 8 * h;
                        a[r][h] = _mm512_dpbusd_epi32(a[r][h], lo, _mm512_set1_epi32(ib_pk_load4(xr)));
                        a[r][A / 2 + h] = _mm512_dpbusd_epi32(a[r][A / 2 + h], hi, _mm512_set1_epi32(ib_pk_load4(xr + 4)));
                    }
                }
            }
        } else {
            /* block pair j (8 k) -> accumulators 2*(j % (A/2)) and 2*(j % (A/2)) + 1 */
            for (int k = g * G; k < (g + 1) * G; k += 4 * A) {
#pragma GCC unroll 2
                for (int h = 0; h < A / 2; h++) {
                    const uint8_t *blk = P + (size_t)(k / 4 + 2 * h) * 64;
                    _mm_prefetch((const char *)(blk + IB_PF_DIST), _MM_HINT_T1);
                    _mm_prefetch((const char *)(blk + 64 + IB_PF_DIST), _MM_HINT_T1);
                    __m512i w0 = _mm512_loadu_si512((const void *)blk);
                    __m512i w1 = _mm512_loadu_si512((const void *)(blk + 64));
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const int8_t *xr = xq + (size_t)r * K + k + 8 * h;
                        a[r][2 * h] = _mm512_dpbusd_epi32(a[r][2 * h], w0, _mm512_set1_epi32(ib_pk_load4(xr)));
                        a[r][2 * h + 1] = _mm512_dpbusd_epi32(a[r][2 * h + 1], w1, _mm512_set1_epi32(ib_pk_load4(xr + 4)));
                    }
                }
            }
        }
        ib_pk_sb_prefetch(m, p, g);
        __m512 s = group_sb(m, p, g, 0), b = group_sb(m, p, g, 1);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512i lo_sum = a[r][0], hi_sum = a[r][A / 2];
            if (A == 4) lo_sum = _mm512_add_epi32(lo_sum, a[r][1]), hi_sum = _mm512_add_epi32(hi_sum, a[r][3]);
            __m512i tot = q4 ? _mm512_add_epi32(lo_sum, _mm512_srai_epi32(hi_sum, 4)) : _mm512_add_epi32(lo_sum, hi_sum);
            __m512 isum = _mm512_cvtepi32_ps(tot);
            __m512 t = _mm512_mul_ps(_mm512_mul_ps(s, _mm512_set1_ps(d[(size_t)r * ng + g])), isum);
            __m512 u = _mm512_mul_ps(b, _mm512_set1_ps(ad[(size_t)r * ng + g]));
            f[r] = _mm512_add_ps(_mm512_add_ps(f[r], t), u);
        }
    }
    const int lanes = ib_pk_lanes(m, p);
    const __mmask16 mask = (__mmask16)((1u << lanes) - 1);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (size_t)r * ldy, mask, f[r]);
}

/* Q8 activations, panel p, all B rows in tiles of 8 (then the remainder). */
AI void panel_q8_fmt(const int q4, const ib_matrix *m, int p, const ib_act_buf *q, int B, int desc, float *Y,
                     int ldy) {
    const int K = m->cols, ng = K / m->group;
    int r = 0;
#define Q_TILE(R) tile_q(R, q4, m, p, q->xq + (size_t)r * K, q->d + (size_t)r * ng, q->ad + (size_t)r * ng, desc, \
                         Y + (size_t)r * ldy + (size_t)p * 16, ldy)
    for (; r + 8 <= B; r += 8) Q_TILE(8);
    switch (B - r) {
    case 7: Q_TILE(7); break;
    case 6: Q_TILE(6); break;
    case 5: Q_TILE(5); break;
    case 4: Q_TILE(4); break;
    case 3: Q_TILE(3); break;
    case 2: Q_TILE(2); break;
    case 1: Q_TILE(1); break;
    default: break;
    }
#undef Q_TILE
}

static void panel_q8(const ib_matrix *m, int p, const ib_act_buf *q, int B, int desc, float *Y, int ldy) {
    if (m->fmt == IB_WQ4) panel_q8_fmt(1, m, p, q, B, desc, Y, ldy);
    else panel_q8_fmt(0, m, p, q, B, desc, Y, ldy);
}

/* ---------------------------------------------------------------- Q8 activations, many rows
 *
 * With QT_MIN_ROWS or more rows, the Q8 path walks the caller's panels in groups of up to QT_P (the
 * panels are adjacent in memory) and, inside a chunk of up to QT_RCHUNK rows, the weight groups in the
 * canonical order, outermost: for each group, every row tile of up to QT_R rows computes the group's
 * exact int32 sums for its rows x the QT_P panels' 16 outputs each in QT_R x QT_P zmm accumulators,
 * then folds them into the chunk's float accumulators f [rows][QT_P][16] (kept in a stack buffer:
 * storing and reloading a float is exact). So one 64-byte weight load and unpack serves QT_R rows, one
 * activation broadcast serves QT_P panels, and a group's weights (QT_P x G/2 or G bytes) stay in L1
 * across all the row tiles. Per output the arithmetic is tile_q's, operation for operation:
 *     isum = the group's exact sum;  acc = (acc + (s*d)*(float)isum) + b*ad,  groups ascending
 * (descending under IB_FAULT_GEMV_GEMM, as tile_q). A 4-bit block's high nibbles are shifted down to
 * codes, so low and high nibbles add into one accumulator (exact int32: a group sum is below 2^23). */
#define QT_R 4          /* rows per register tile */
#define QT_P 4          /* panels per tile (adjacent) */
#define QT_RCHUNK 64    /* rows whose float accumulators live in the stack buffer at once */
#define QT_MIN_ROWS 4   /* fewer rows take the per-panel tiles above (decode of a few sessions) */

/* a + the dot products of w's unsigned and x's signed byte quadruples (vpdpbusd), as an asm statement
 * whose accumulator stays in one register: with the intrinsic, GCC copies the loop-carried
 * accumulators of a tile between registers on every iteration. */
AI __m512i qt_dp(__m512i a, __m512i w, __m512i x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(a) : "v"(w), "v"(x));
    return a;
}

/* Group g of R rows (R <= QT_R) x P panels (P <= QT_P): xq row r at x + r*K; panel i's weights at
 * w0 + i*pstride; the group's scales s[i] and biases b[i]; d/ad row r at d + r*ng; float accumulators
 * f [R][P][16] (row r at f + r*P*16), which the first group (first) starts from 0.0f instead of
 * reading; for the last group, y (else NULL) takes the outputs instead of f: row r, panel i at
 * y + r*ldy + 16i, lanes mask[i]. No software prefetch: the 4 sequential weight streams are the
 * hardware prefetcher's (prefetching the next panel group in the first tile, into L1 or L2, or 8 KiB
 * on, ran 0-7% slower over the 151,936-row lm_head at 16 and 64 rows). */
AI void qt_tile(const int R, const int P, const int q4, const uint8_t *w0, size_t pstride, const int8_t *x,
                size_t K, int g, int G, const __m512 *s, const __m512 *b, const float *d, const float *ad,
                size_t ng, float *f, int first, float *y, size_t ldy, const __mmask16 *mask) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512i a[QT_R][QT_P];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < P; i++) a[r][i] = _mm512_setzero_si512();
    const int k0 = g * G;
    if (q4) {
        for (int k = k0; k < k0 + G; k += 8) {
            const size_t off = (size_t)((unsigned)k / 8) * 64;
            __m512i lo[QT_P], hi[QT_P];
#pragma GCC unroll 4
            for (int i = 0; i < P; i++) {
                const uint8_t *blk = w0 + (size_t)i * pstride + off;
                __m512i w = _mm512_loadu_si512((const void *)blk);
                lo[i] = _mm512_and_si512(w, lo4);
                hi[i] = _mm512_and_si512(_mm512_srli_epi16(w, 4), lo4);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512i x0 = _mm512_set1_epi32(ib_pk_load4(x + (size_t)r * K + k));
                const __m512i x1 = _mm512_set1_epi32(ib_pk_load4(x + (size_t)r * K + k + 4));
#pragma GCC unroll 4
                for (int i = 0; i < P; i++) a[r][i] = qt_dp(a[r][i], lo[i], x0);
#pragma GCC unroll 4
                for (int i = 0; i < P; i++) a[r][i] = qt_dp(a[r][i], hi[i], x1);
            }
        }
    } else {
#pragma GCC unroll 2
        for (int k = k0; k < k0 + G; k += 4) {
            const size_t off = (size_t)((unsigned)k / 4) * 64;
            __m512i w[QT_P];
#pragma GCC unroll 4
            for (int i = 0; i < P; i++) {
                const uint8_t *blk = w0 + (size_t)i * pstride + off;
                w[i] = _mm512_loadu_si512((const void *)blk);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512i x0 = _mm512_set1_epi32(ib_pk_load4(x + (size_t)r * K + k));
#pragma GCC unroll 4
                for (int i = 0; i < P; i++) a[r][i] = qt_dp(a[r][i], w[i], x0);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512 dv = _mm512_set1_ps(d[(size_t)r * ng + g]), av = _mm512_set1_ps(ad[(size_t)r * ng + g]);
#pragma GCC unroll 4
        for (int i = 0; i < P; i++) {
            float *fr = f + ((size_t)r * P + i) * 16;
            __m512 t = _mm512_mul_ps(_mm512_mul_ps(s[i], dv), _mm512_cvtepi32_ps(a[r][i]));
            __m512 u = _mm512_mul_ps(b[i], av);
            __m512 acc = _mm512_add_ps(_mm512_add_ps(first ? _mm512_setzero_ps() : _mm512_load_ps(fr), t), u);
            if (y) _mm512_mask_storeu_ps(y + (size_t)r * ldy + (size_t)i * 16, mask[i], acc);
            else _mm512_store_ps(fr, acc);
        }
    }
}

/* Panels [p, p+P) (P <= QT_P) for all B rows (B >= 1): the loop order described above. */
AI void qt_panels(const int P, const int q4, const ib_matrix *m, int p, const ib_act_buf *q, int B, int desc,
                  float *Y, int ldy) {
    const int K = m->cols, G = m->group, ng = K / G;
    const size_t pstride = ib_pk_panel_bytes(m);
    const uint8_t *w0 = ib_pk_panel(m, p);
    float f[QT_RCHUNK * QT_P * 16] __attribute__((aligned(64))); /* [rows of the chunk][P][16] */
    __mmask16 mask[QT_P];                                          /* real lanes of each panel */
    for (int i = 0; i < P; i++) mask[i] = (__mmask16)((1u << ib_pk_lanes(m, p + i)) - 1);
    for (int b0 = 0; b0 < B; b0 += QT_RCHUNK) {
        const int nb = B - b0 < QT_RCHUNK ? B - b0 : QT_RCHUNK;
        const int8_t *xq = q->xq + (size_t)b0 * K;
        const float *d = q->d + (size_t)b0 * ng, *ad = q->ad + (size_t)b0 * ng;
        for (int gi = 0; gi < ng; gi++) {
            const int g = desc ? ng - 1 - gi : gi;
            __m512 s[QT_P], b[QT_P];
#pragma GCC unroll 4
            for (int i = 0; i < P; i++) {
                ib_pk_sb_prefetch(m, p + i, g);
                s[i] = group_sb(m, p + i, g, 0), b[i] = group_sb(m, p + i, g, 1);
            }
            int r = 0;
#define QT_TILE(R) qt_tile(R, P, q4, w0, pstride, xq + (size_t)r * K, (size_t)K, g, G, s, b, d + (size_t)r * ng, \
                           ad + (size_t)r * ng, (size_t)ng, f + (size_t)r * P * 16, gi == 0,                      \
                           gi == ng - 1 ? Y + (size_t)(b0 + r) * ldy + (size_t)p * 16 : NULL, (size_t)ldy, mask)
            for (; r + QT_R <= nb; r += QT_R) QT_TILE(QT_R);
            switch (nb - r) {
            case 3: QT_TILE(3); break;
            case 2: QT_TILE(2); break;
            case 1: QT_TILE(1); break;
            default: break;
            }
#undef QT_TILE
        }
    }
}

/* Panels [p0, p1) of a quantized matrix for B >= QT_MIN_ROWS rows of Q8 activations, QT_P at a time. */
AI void qt_range_fmt(const int q4, const ib_matrix *m, int p0, int p1, const ib_act_buf *q, int B, int desc,
                     float *Y, int ldy) {
    int p = p0;
    for (; p + QT_P <= p1; p += QT_P) qt_panels(QT_P, q4, m, p, q, B, desc, Y, ldy);
    switch (p1 - p) {
    case 3: qt_panels(3, q4, m, p, q, B, desc, Y, ldy); break;
    case 2: qt_panels(2, q4, m, p, q, B, desc, Y, ldy); break;
    case 1: qt_panels(1, q4, m, p, q, B, desc, Y, ldy); break;
    default: break;
    }
}

static void qt_range(const ib_matrix *m, int p0, int p1, const ib_act_buf *q, int B, int desc, float *Y, int ldy) {
    if (m->fmt == IB_WQ4) qt_range_fmt(1, m, p0, p1, q, B, desc, Y, ldy);
    else qt_range_fmt(0, m, p0, p1, q, B, desc, Y, ldy);
}

/* Panels [p0, p1) for all B rows (contract in ops/matmul.h). */
void ib_matmul_panels_avx512(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                             int p0, int p1, float *Y, int ldy) {
    const ib_fault fault = ib_fault_get();
    const int desc = B > 1 && fault == IB_FAULT_GEMV_GEMM;
    const int use_q8 = ib_pk_use_q8(m, q, act);
    if (use_q8 && B >= QT_MIN_ROWS) {
        qt_range(m, p0, p1, q, B, desc, Y, ldy);
        return;
    }
    for (int p = p0; p < p1; p++) {
        if (use_q8) panel_q8(m, p, q, B, desc, Y, ldy);
        else panel_f32(m, p, X, B, desc, ib_pk_f32_chain(fault, desc, 1), Y, ldy);
    }
}

/* ---------------------------------------------------------------- activation quantization */

/* ib_quantize_act (ops/matmul.h), bit for bit: for G a multiple of 16 the same operations on 16 lanes,
 * other groups by ib_quantize_act itself.
 * amax: vmaxps(|x|, lane) is (|x| > lane ? |x| : lane), so NaNs are skipped as there, and a maximum is
 * the same in any order; codes: v = (x*inv + 1.5*2^23) - 1.5*2^23 (separate vmulps, vaddps, vsubps),
 * vminps(127, v) = (v > 127 ? 127 : v) and vmaxps(-127, v) = (v < -127 ? -127 : v) keep a NaN, which
 * then becomes 0; the codes' sum is an exact int32. */
void ib_quantize_act_avx512(const float *x, int B, int K, int G, int8_t *xq, float *d, float *ad) {
    if (G % 16) {
        ib_quantize_act(x, B, K, G, xq, d, ad);
        return;
    }
    const int ng = K / G;
    const __m512 rne = _mm512_set1_ps(12582912.0f), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < ng; g++) {
            const float *xs = x + (size_t)b * K + (size_t)g * G;
            int8_t *qs = xq + (size_t)b * K + (size_t)g * G;
            const size_t di = (size_t)b * ng + (size_t)g;
            __m512 lane = _mm512_setzero_ps();
            for (int k = 0; k < G; k += 16) lane = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xs + k)), lane);
            const float amax = _mm512_reduce_max_ps(lane); /* no NaN in lane: any order gives the maximum */
            if (amax == 0.0f) {
                memset(qs, 0, (size_t)G);
                d[di] = 0.0f;
                ad[di] = 0.0f;
                continue;
            }
            const float dd = amax / 127.0f;
            const __m512 inv = _mm512_set1_ps(127.0f / amax);
            __m512i sum = _mm512_setzero_si512();
            for (int k = 0; k < G; k += 16) {
                __m512 v = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(xs + k), inv), rne), rne);
                v = _mm512_max_ps(lo, _mm512_min_ps(hi, v));
                __m512i c = _mm512_maskz_cvttps_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
                _mm_storeu_si128((__m128i *)(qs + k), _mm512_cvtepi32_epi8(c));
                sum = _mm512_add_epi32(sum, c);
            }
            d[di] = dd;
            ad[di] = dd * (float)_mm512_reduce_add_epi32(sum);
        }
}

#else
/* Not x86: no AVX-512 kernel (ISO C wants a translation unit to declare something). */
typedef int ib_matmul_avx512_unused;
#endif
