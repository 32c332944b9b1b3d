/*
 * matmul_avx2.c — the AVX2 panel kernel. Same arithmetic as matmul_scalar.c, bit for bit: a ymm
 * register holds 8 lanes (outputs) of a panel, every lane walks K (or the groups) in the canonical
 * order; float products and sums are separate vmulps / vaddps (vfmadd only under IB_FAULT_ISA_FMA),
 * the F32 path's double sums of exact products vfmadd231pd (4 lanes a ymm). Integer group sums (Q8 activations) are exact, so their order is free:
 *   Q4 weights: vpmaddubsw(u4 code, s8 x) -> int16 pairs (|.| <= 2*15*127 = 3810); eight of them
 *               are added in int16 (<= 30480 < 32767, no overflow) per 32 k, then vpmaddwd by 1.
 *   Q8 weights: codes up to 255 would saturate vpmaddubsw, so the code bytes are split into even and
 *               odd int16 (and / shift) and multiplied with the sign-extended activations by vpmaddwd.
 */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "backends/cpu/pack.h"

#define AI static inline __attribute__((always_inline))

/* Weights are prefetched this many bytes ahead of the tile that reads them (panels are contiguous, so
 * this runs on into the next panel): the first tile of a panel streams them from memory. The distance
 * covers a DRAM latency at the rate one core consumes weights (about 100 ns x 40 GB/s, with room);
 * at 1 KiB a 1-row product from memory ran 25% slower on a Zen 4 core, its loads waiting on lines. */
#define IB_PF_DIST 8192

/* ---------------------------------------------------------------- dequantization (F32 path) */

/* Input: 8 lanes x 4 bytes (byte 4j+i of lane j). Output: qword i = byte i of lanes 0..7. */
AI __m256i transpose_8x4(__m256i w) {
    const __m256i sh = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m256i t = _mm256_shuffle_epi8(w, sh); /* per 128 bits: dword i = byte i of its 4 lanes */
    return _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The 8 bytes of qword i of t, zero-extended to 8 int32. */
AI __m256i qword_u8(__m256i t, int i) {
    __m128i h = (i < 2) ? _mm256_castsi256_si128(t) : _mm256_extracti128_si256(t, 1);
    if (i & 1) h = _mm_unpackhi_epi64(h, h);
    return _mm256_cvtepu8_epi32(h);
}

/* w = s*(float)q + b for 8 lanes. */
AI __m256 deq8(__m256i q, __m256 s, __m256 b) {
    return _mm256_add_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(q)), b);
}

/* 8 stored scales or biases (layout in pack.h) as floats, exactly. */
AI __m256 load_sb8(ib_sbfmt fmt, const uint8_t *p) {
    if (fmt == IB_SB_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    if (fmt == IB_SB_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_loadu_ps((const float *)p);
}

/* Lanes 8*half .. 8*half+7 of the scales (which = 0) or biases (which = 1) of panel p, group g. */
AI __m256 group_sb(const ib_matrix *m, int p, int g, int which, int half) {
    return load_sb8(m->sb_fmt, ib_pk_sb(m, p, g) + (size_t)(which * 16 + half * 8) * ib_pk_sb_elem(m));
}

/* Dequantize columns [k0, k0+kn) of quantized panel p into w [kn][16] (k0, kn multiples of 8). */
static void dequant_block(const ib_matrix *m, int p, int k0, int kn, float *w) {
    const uint8_t *P = ib_pk_panel(m, p);
    const __m256i m4 = _mm256_set1_epi32(15);
    if (m->fmt == IB_WQ4) {
        for (int k = k0; k < k0 + kn; k += 8) {
            const uint8_t *blk = P + (size_t)(k / 8) * 64;
            const int g = k / m->group;
            __m256 s0 = group_sb(m, p, g, 0, 0), s1 = group_sb(m, p, g, 0, 1);
            __m256 b0 = group_sb(m, p, g, 1, 0), b1 = group_sb(m, p, g, 1, 1);
            __m256i t0 = transpose_8x4(_mm256_loadu_si256((const __m256i *)blk));
            __m256i t1 = transpose_8x4(_mm256_loadu_si256((const __m256i *)(blk + 32)));
            float *o = w + (size_t)(k - k0) * 16;
            for (int i = 0; i < 4; i++) {
                __m256i v0 = qword_u8(t0, i), v1 = qword_u8(t1, i);
                _mm256_storeu_ps(o + i * 16, deq8(_mm256_and_si256(v0, m4), s0, b0));
                _mm256_storeu_ps(o + i * 16 + 8, deq8(_mm256_and_si256(v1, m4), s1, b1));
                _mm256_storeu_ps(o + (i + 4) * 16, deq8(_mm256_srli_epi32(v0, 4), s0, b0));
                _mm256_storeu_ps(o + (i + 4) * 16 + 8, deq8(_mm256_srli_epi32(v1, 4), s1, b1));
            }
        }
    } else {
        for (int k = k0; k < k0 + kn; k += 4) {
            const uint8_t *blk = P + (size_t)(k / 4) * 64;
            const int g = k / m->group;
            __m256 s0 = group_sb(m, p, g, 0, 0), s1 = group_sb(m, p, g, 0, 1);
            __m256 b0 = group_sb(m, p, g, 1, 0), b1 = group_sb(m, p, g, 1, 1);
            __m256i t0 = transpose_8x4(_mm256_loadu_si256((const __m256i *)blk));
            __m256i t1 = transpose_8x4(_mm256_loadu_si256((const __m256i *)(blk + 32)));
            float *o = w + (size_t)(k - k0) * 16;
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(o + i * 16, deq8(qword_u8(t0, i), s0, b0));
                _mm256_storeu_ps(o + i * 16 + 8, deq8(qword_u8(t1, i), s1, b1));
            }
        }
    }
}

/* ---------------------------------------------------------------- F32 activations */

/* The 16 weights of one k as doubles, w[i] lanes 4i..4i+3: from the block's doubles (WD) or widened
 * here from its floats. */
AI void load_w16(const int WD, const void *wk, __m256d w[4]) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        w[i] = WD ? _mm256_loadu_pd((const double *)wk + 4 * i) : _mm256_cvtps_pd(_mm_loadu_ps((const float *)wk + 4 * i));
}

/* One k of R rows: a[r] = a[r] + w(k) * x(r, k), lanes 4i..4i+3 in a[r][i], x the rows' activations as
 * doubles (row r at xk + r * ldx), w 16 doubles (WD) or floats at wk. Every value is exactly a float
 * and the product of two floats is exact in double, so vfmadd231pd is the mul then the add. Under a
 * fault (ib_pk_chain) a float32 chain instead: vmulps then vaddps, or vfmadd231ps. */
AI void mac_k(const int R, const ib_pk_chain ch, const int WD, __m256d a[][4], const void *wk, const double *xk,
              size_t ldx) {
    __m256d w[4];
    load_w16(WD, wk, w);
    if (ch != IB_PK_CHAIN_DOUBLE) {
        const __m256 wa = _mm256_set_m128(_mm256_cvtpd_ps(w[1]), _mm256_cvtpd_ps(w[0]));
        const __m256 wb = _mm256_set_m128(_mm256_cvtpd_ps(w[3]), _mm256_cvtpd_ps(w[2]));
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const __m256 xv = _mm256_set1_ps((float)xk[r * ldx]);
            __m256 fa = _mm256_set_m128(_mm256_cvtpd_ps(a[r][1]), _mm256_cvtpd_ps(a[r][0]));
            __m256 fb = _mm256_set_m128(_mm256_cvtpd_ps(a[r][3]), _mm256_cvtpd_ps(a[r][2]));
            if (ch == IB_PK_CHAIN_FLOAT_FMA) fa = _mm256_fmadd_ps(wa, xv, fa), fb = _mm256_fmadd_ps(wb, xv, fb);
            else fa = _mm256_add_ps(fa, _mm256_mul_ps(wa, xv)), fb = _mm256_add_ps(fb, _mm256_mul_ps(wb, xv));
            a[r][0] = _mm256_cvtps_pd(_mm256_castps256_ps128(fa)), a[r][1] = _mm256_cvtps_pd(_mm256_extractf128_ps(fa, 1));
            a[r][2] = _mm256_cvtps_pd(_mm256_castps256_ps128(fb)), a[r][3] = _mm256_cvtps_pd(_mm256_extractf128_ps(fb, 1));
        }
        return;
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        const __m256d xv = _mm256_broadcast_sd(xk + r * ldx);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) a[r][i] = _mm256_fmadd_pd(w[i], xv, a[r][i]);
    }
}

/* R rows (R <= 2: 8 double accumulators and 4 weight vectors of 16 ymm) of a chunk: acc [R][16]
 * (double) += w [kn][16] (doubles when WD, else floats) times x (row r at x + r*ldx), walking k
 * ascending, or descending when desc. The rows' x are widened to double once (xd). */
AI void tile_f32(const int R, const ib_pk_chain ch, const int WD, double *acc, const float *x, size_t ldx,
                 const void *w, int kn, int desc) {
    const size_t wstep = WD ? 16 * sizeof(double) : 16 * sizeof(float);
    double xd[2][IB_KBLOCK] __attribute__((aligned(32)));   /* [R][kn] */
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        int k = 0;
        for (; k + 4 <= kn; k += 4) _mm256_store_pd(xd[r] + k, _mm256_cvtps_pd(_mm_loadu_ps(x + r * ldx + k)));
        for (; k < kn; k++) xd[r][k] = (double)x[r * ldx + k];
    }
    __m256d a[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) a[r][i] = _mm256_loadu_pd(acc + r * 16 + 4 * i);
    const uint8_t *wb = (const uint8_t *)w;
    if (desc)
        for (int k = kn - 1; k >= 0; k--) mac_k(R, ch, WD, a, wb + (size_t)k * wstep, &xd[0][k], IB_KBLOCK);
    else
        for (int k = 0; k < kn; k++) mac_k(R, ch, WD, a, wb + (size_t)k * wstep, &xd[0][k], IB_KBLOCK);
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) _mm256_storeu_pd(acc + r * 16 + 4 * i, a[r][i]);
}

/* All rows of one K block, in tiles of 2 (then 1). */
AI void rows_f32(const ib_pk_chain ch, const int WD, double (*acc)[16], const float *x, size_t ldx, int nb,
                 const void *w, int kn, int desc) {
    int r = 0;
    for (; r + 2 <= nb; r += 2) tile_f32(2, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc);
    if (r < nb) tile_f32(1, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc);
}

/* n floats (a multiple of 16) to doubles. */
AI void widen_block(const float *w, double *wd, int n) {
    for (int i = 0; i < n; i += 4) _mm256_store_pd(wd + i, _mm256_cvtps_pd(_mm_loadu_ps(w + i)));
}

#define F32_ALIGN 32
#include "backends/cpu/panel_f32_impl.h"

/* ---------------------------------------------------------------- Q8 activations */

/* acc = (acc + (s*d)*(float)isum) + b*ad for the two halves of a row. */
AI void combine(__m256 f[2], const __m256i is[2], __m256 s0, __m256 s1, __m256 b0, __m256 b1, float d, float ad) {
    __m256 dv = _mm256_set1_ps(d), av = _mm256_set1_ps(ad);
    __m256 t0 = _mm256_mul_ps(_mm256_mul_ps(s0, dv), _mm256_cvtepi32_ps(is[0]));
    __m256 t1 = _mm256_mul_ps(_mm256_mul_ps(s1, dv), _mm256_cvtepi32_ps(is[1]));
    f[0] = _mm256_add_ps(_mm256_add_ps(f[0], t0), _mm256_mul_ps(b0, av));
    f[1] = _mm256_add_ps(_mm256_add_ps(f[1], t1), _mm256_mul_ps(b1, av));
}

/* Write R rows of finished outputs (f[r][0..1]) of panel p. */
AI void store_rows(const int R, __m256 f[][2], float *y, int ldy, int lanes) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float *yr = y + (size_t)r * ldy;
        if (lanes == 16) {
            _mm256_storeu_ps(yr, f[r][0]);
            _mm256_storeu_ps(yr + 8, f[r][1]);
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, f[r][0]);
            _mm256_storeu_ps(tmp + 8, f[r][1]);
            ib_pk_store(yr, tmp, lanes);
        }
    }
}

/* R rows (R <= 4) of a Q4 panel against Q8 activations: xq row r at xq + r*K, d/ad row r at
 * d + r*ng; outputs to y + r*ldy. Groups ascending (descending when desc). */
AI void tile_q4(const int R, const ib_matrix *m, int p, const int8_t *xq, const float *d, const float *ad,
                int desc, float *y, int ldy) {
    const int K = m->cols, G = m->group, ng = K / G;
    const uint8_t *P = ib_pk_panel(m, p);
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 f[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
    for (int gi = 0; gi < ng; gi++) {
        const int g = desc ? ng - 1 - gi : gi;
        __m256i is[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) is[r][0] = is[r][1] = _mm256_setzero_si256();
        for (int kc = g * G; kc < (g + 1) * G; kc += 32) {
            __m256i h[4][2];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) h[r][0] = h[r][1] = _mm256_setzero_si256();
            const uint8_t *blk = P + (size_t)kc * 8;   /* block kc/8, 64 bytes each */
            /* unrolled: fewer register copies of the int16 sums (measured 5-10% faster for 16+ rows) */
#pragma GCC unroll 4
            for (int k = kc; k < kc + 32; k += 8, blk += 64) {
                _mm_prefetch((const char *)(blk + IB_PF_DIST), _MM_HINT_T0);
                __m256i w0 = _mm256_loadu_si256((const __m256i *)blk);
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(blk + 32));
                __m256i l0 = _mm256_and_si256(w0, m4), h0 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), m4);
                __m256i l1 = _mm256_and_si256(w1, m4), h1 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), m4);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const int8_t *xr = xq + (size_t)r * K + k;
                    __m256i xl = _mm256_set1_epi32(ib_pk_load4(xr)), xh = _mm256_set1_epi32(ib_pk_load4(xr + 4));
                    h[r][0] = _mm256_add_epi16(h[r][0], _mm256_add_epi16(_mm256_maddubs_epi16(l0, xl),
                                                                         _mm256_maddubs_epi16(h0, xh)));
                    h[r][1] = _mm256_add_epi16(h[r][1], _mm256_add_epi16(_mm256_maddubs_epi16(l1, xl),
                                                                         _mm256_maddubs_epi16(h1, xh)));
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                is[r][0] = _mm256_add_epi32(is[r][0], _mm256_madd_epi16(h[r][0], ones));
                is[r][1] = _mm256_add_epi32(is[r][1], _mm256_madd_epi16(h[r][1], ones));
            }
        }
        ib_pk_sb_prefetch(m, p, g);
        __m256 s0 = group_sb(m, p, g, 0, 0), s1 = group_sb(m, p, g, 0, 1);
        __m256 b0 = group_sb(m, p, g, 1, 0), b1 = group_sb(m, p, g, 1, 1);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) combine(f[r], is[r], s0, s1, b0, b1, d[(size_t)r * ng + g], ad[(size_t)r * ng + g]);
    }
    store_rows(R, f, y, ldy, ib_pk_lanes(m, p));
}

/* R rows (R <= 4) of a Q8 panel against Q8 activations (arguments as tile_q4). */
AI void tile_q8(const int R, const ib_matrix *m, int p, const int8_t *xq, const float *d, const float *ad,
                int desc, float *y, int ldy) {
    const int K = m->cols, G = m->group, ng = K / G;
    const uint8_t *P = ib_pk_panel(m, p);
    const __m256i lo8 = _mm256_set1_epi16(0x00FF);
    __m256 f[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
    for (int gi = 0; gi < ng; gi++) {
        const int g = desc ? ng - 1 - gi : gi;
        __m256i is[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) is[r][0] = is[r][1] = _mm256_setzero_si256();
        const uint8_t *blk = P + (size_t)g * G * 16;   /* block k/4, 64 bytes each */
        for (int k = g * G; k < (g + 1) * G; k += 4, blk += 64) {
            _mm_prefetch((const char *)(blk + IB_PF_DIST), _MM_HINT_T0);
            __m256i w0 = _mm256_loadu_si256((const __m256i *)blk);
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(blk + 32));
            /* int16 words of lane j: e = (q[k], q[k+2]), o = (q[k+1], q[k+3]) */
            __m256i e0 = _mm256_and_si256(w0, lo8), o0 = _mm256_srli_epi16(w0, 8);
            __m256i e1 = _mm256_and_si256(w1, lo8), o1 = _mm256_srli_epi16(w1, 8);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i v = _mm256_set1_epi32(ib_pk_load4(xq + (size_t)r * K + k));
                __m256i xe = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8); /* (x[k], x[k+2]) */
                __m256i xo = _mm256_srai_epi16(v, 8);                       /* (x[k+1], x[k+3]) */
                is[r][0] = _mm256_add_epi32(is[r][0], _mm256_add_epi32(_mm256_madd_epi16(e0, xe),
                                                                       _mm256_madd_epi16(o0, xo)));
                is[r][1] = _mm256_add_epi32(is[r][1], _mm256_add_epi32(_mm256_madd_epi16(e1, xe),
                                                                       _mm256_madd_epi16(o1, xo)));
            }
        }
        ib_pk_sb_prefetch(m, p, g);
        __m256 s0 = group_sb(m, p, g, 0, 0), s1 = group_sb(m, p, g, 0, 1);
        __m256 b0 = group_sb(m, p, g, 1, 0), b1 = group_sb(m, p, g, 1, 1);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) combine(f[r], is[r], s0, s1, b0, b1, d[(size_t)r * ng + g], ad[(size_t)r * ng + g]);
    }
    store_rows(R, f, y, ldy, ib_pk_lanes(m, p));
}

/* Q8 activations, panel p, all B rows in tiles of 4 (then 3, 2, 1). */
static void panel_q8(const ib_matrix *m, int p, const ib_act_buf *q, int B, int desc, float *Y, int ldy) {
    const int K = m->cols, ng = K / m->group;
    int r = 0;
#define Q_TILE(R)                                                                                        \
    do {                                                                                                 \
        const int8_t *xq = q->xq + (size_t)r * K;                                                        \
        const float *d = q->d + (size_t)r * ng, *ad = q->ad + (size_t)r * ng;                             \
        float *y = Y + (size_t)r * ldy + (size_t)p * 16;                                                 \
        if (m->fmt == IB_WQ4) tile_q4(R, m, p, xq, d, ad, desc, y, ldy);                                 \
        else tile_q8(R, m, p, xq, d, ad, desc, y, ldy);                                                  \
    } while (0)
    for (; r + 4 <= B; r += 4) Q_TILE(4);
    switch (B - r) {
    case 3: Q_TILE(3); break;
    case 2: Q_TILE(2); break;
    case 1: Q_TILE(1); break;
    default: break;
    }
#undef Q_TILE
}

/* Cache blocking of the Q8-activation path for many rows (it changes only the order in which whole
 * (row tile, panel) products run, never a product's arithmetic): rows in blocks whose quantized
 * activations fit in about IB_XQ_BLOCK_BYTES (a multiple of 4 rows, at least 4), so each block stays
 * in L1 while it meets a chunk of panels; panels in chunks of about IB_PANEL_CHUNK_BYTES of weights,
 * so a chunk stays in L2 while every row block passes over it. */
#define IB_XQ_BLOCK_BYTES 16384
#define IB_PANEL_CHUNK_BYTES (192 * 1024)

/* Panels [p0, p1) for all B rows (contract in ops/matmul.h). */
void ib_matmul_panels_avx2(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                           int p0, int p1, float *Y, int ldy) {
    const ib_fault fault = ib_fault_get();
    const int desc = B > 1 && fault == IB_FAULT_GEMV_GEMM;
    if (!ib_pk_use_q8(m, q, act)) {
        for (int p = p0; p < p1; p++) panel_f32(m, p, X, B, desc, ib_pk_f32_chain(fault, desc, 1), Y, ldy);
        return;
    }
    const int K = m->cols, ng = K / m->group;
    int rb = (IB_XQ_BLOCK_BYTES / K) & ~3;
    if (rb < 4) rb = 4;
    int pc = (int)(IB_PANEL_CHUNK_BYTES / ib_pk_panel_bytes(m));
    if (pc < 1) pc = 1;
    if (B <= rb) pc = p1 - p0;   /* one row block: panels in order, as they stream from memory */
    for (int c0 = p0; c0 < p1; c0 += pc) {
        const int c1 = p1 - c0 < pc ? p1 : c0 + pc;
        for (int r0 = 0; r0 < B; r0 += rb) {
            const int nb = B - r0 < rb ? B - r0 : rb;
            const ib_act_buf qb = { q->xq + (size_t)r0 * K, q->d + (size_t)r0 * ng, q->ad + (size_t)r0 * ng };
            for (int p = c0; p < c1; p++) panel_q8(m, p, &qb, nb, desc, Y + (size_t)r0 * ldy, ldy);
        }
    }
}

#else
/* Not x86: no AVX2 kernel (ISO C wants a translation unit to declare something). */
typedef int ib_matmul_avx2_unused;
#endif
