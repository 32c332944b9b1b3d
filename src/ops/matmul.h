/*
 * matmul.h — batched matrix products Y[B,N] = X[B,K] · W[N,K]^T, the engine's hot path.
 *
 * NUMERIC DEFINITION (the canonical order; every ISA and thread count produces exactly these bits).
 * Each output y[b][n] is one independent chain; vector lanes own different outputs n and every lane
 * walks K in ascending order. Float32 arithmetic has no fused multiply-add anywhere (separate mul then
 * add, each rounded to float32), unless a test-only fault asks for one.
 *
 *   F32 activations (IB_ACT_F32), any weight format:
 *       w(n,k) = float weight; for quantized: w = s(n,g)*(float)q(n,k) + b(n,g)   (float32 mul, then add)
 *       acc = 0.0 (double); for k = 0..K-1: acc = acc + (double)w(n,k) * (double)x(b,k);   y = (float)acc
 *     The product of two floats is exact in double, so each step rounds once (the add, to double) and
 *     a fused multiply-add gives the same bits as a mul then an add; y is rounded to float32 once.
 *     (Float32 chains over K in the thousands were the largest error at Gemma 4 26B's widths:
 *     docs/gemma4.md, "Float32 error at the real shapes".)
 *
 *   Q8 activations (IB_ACT_Q8), quantized weights only (group size G = the weight's group):
 *       per row b and group g (k in [gG, gG+G)), computed by ib_quantize_act from that row alone:
 *           amax = max |x(b,k)|;  d = amax / 127.0f  (0 when amax == 0)
 *           xq(b,k) = clamp(rne(x(b,k) * (127.0f / amax)), -127, 127)   (0 when amax == 0; rne =
 *                     round to nearest even, as rintf in the default rounding mode)
 *           ad(b,g) = d * (float)sum_k xq(b,k)
 *       per output: acc = 0.0f; for g = 0..K/G-1 ascending:
 *           isum = sum_k q(n,k) * xq(b,k)          (exact int32: any order gives the same value)
 *           t = (s(n,g) * d(b,g)) * (float)isum;   u = b(n,g) * ad(b,g)
 *           acc = (acc + t) + u
 *       y = acc
 *   (q = the unsigned MLX code 0..15 or 0..255; s, b = the MLX scale and bias as float32.)
 *
 * LAYOUT. ib_matrix holds W repacked at load time into panels of IB_PANEL (16) output rows so that
 * a vector register holds 16 (AVX-512), 8 (AVX2) or 4 (NEON) outputs of one k; N is padded up to a multiple of
 * 16 with zero rows (their outputs are computed and dropped). The exact byte layout is private to
 * src/backends/cpu/ and documented there.
 *
 * BATCHING. A product streams each panel once for all B rows (rows are tiled inside the kernel while
 * the panel is hot in cache); threads split the panels, never K.
 */
#ifndef IB_OPS_MATMUL_H
#define IB_OPS_MATMUL_H
#include <stddef.h>
#include <stdint.h>
#include "core/pool.h"
#include "isobatch.h"

#define IB_PANEL 16

typedef enum ib_wfmt { IB_WF32 = 0, IB_WQ4, IB_WQ8 } ib_wfmt;

/* Storage of a quantized matrix's scales and biases: the narrowest of bfloat16, float16, float32 that
 * holds every one of them exactly (MLX files store them as bfloat16 or float16), so the values the
 * kernels compute with are the file's values either way. */
typedef enum ib_sbfmt { IB_SB_F32 = 0, IB_SB_BF16, IB_SB_F16 } ib_sbfmt;

typedef struct ib_matrix {
    ib_wfmt fmt;
    int rows;          /* N, output features */
    int cols;          /* K, input features */
    int group;         /* quantization group along K (0 for F32) */
    int n_panels;      /* ceil(N / 16) */
    void *packed;      /* panel data, 64-byte aligned; layout private to the CPU backend */
    ib_sbfmt sb_fmt;   /* how scales and biases are stored (quantized only) */
    void *sb;          /* [n_panels][K/group][2][16] scales then biases, as sb_fmt; NULL for F32 */
    size_t bytes;      /* total bytes owned */
} ib_matrix;

/* Build from row-major float32 W[N][K]. On failure m is left zeroed. */
ib_status ib_matrix_from_f32(ib_matrix *m, const float *w, int N, int K, ib_error *err);

/* Build from MLX affine quantization: wq is [N][K*bits/32] uint32 (element j of each 32/bits in bits
 * j*bits..j*bits+bits-1, low bits first), scales and biases are [N][K/group] float32 (the loader
 * converts bf16/f16 first). bits 4 or 8, group 32, 64 or 128, K % group == 0. */
ib_status ib_matrix_from_mlx(ib_matrix *m, const uint32_t *wq, const float *scales, const float *biases,
                             int N, int K, int bits, int group, ib_error *err);

/* The same two builds with the repack split over pool's threads by ranges of panels (every panel's
 * bytes are written by one task from its own rows, so the matrix is bitwise the one built alone);
 * pool may be NULL (this thread alone). Not to be called from a task of the same pool. The MLX build
 * reads wq as little-endian uint32 words at any alignment (a tensor in a mapped file as it is). */
ib_status ib_matrix_from_f32_pool(ib_matrix *m, const float *w, int N, int K, ib_pool *pool, ib_error *err);
ib_status ib_matrix_from_mlx_pool(ib_matrix *m, const void *wq, const float *scales, const float *biases,
                                  int N, int K, int bits, int group, ib_pool *pool, ib_error *err);

void ib_matrix_free(ib_matrix *m);

/* Dequantize row n of m into out[K] with the F32-path formula (used for tests and embeddings). */
void ib_matrix_row_f32(const ib_matrix *m, int n, float *out);

/* Quantized activations of B rows for a weight group size G (K % G == 0).
 * xq [B][K] int8, d [B][K/G] float, ad [B][K/G] float. */
void ib_quantize_act(const float *x, int B, int K, int G, int8_t *xq, float *d, float *ad);

/* Scratch the caller provides for one product: activations quantized for Q8 mode. */
typedef struct ib_act_buf {
    int8_t *xq;   /* [B][K] */
    float *d;     /* [B][K/G] */
    float *ad;    /* [B][K/G] */
} ib_act_buf;

/* ---- kernels (src/backends/cpu/), one per ISA, same signature ----
 * Compute panels [p0, p1) for all B rows. */
typedef void (*ib_matmul_kernel)(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                                 int p0, int p1, float *Y, int ldy);

/* ib_matmul_many with the panel kernel given (the CPU backend picks it once, at engine creation). */
void ib_matmul_many_k(int n, const ib_matrix *const *ms, const float *X, int B, const ib_act_buf *q, ib_act act,
                      ib_matmul_kernel kern, ib_pool *pool, float *const *Ys);

/* Y[b][n] for b < B, n < N (ldy = row stride of Y, >= N), by the definition above.
 * act must be IB_ACT_F32 or IB_ACT_Q8 (Q8 requires a quantized m and a filled `q` from
 * ib_quantize_act with m->group; q is ignored for F32). isa must be supported (not AUTO).
 * Work is split over the pool by panels. Allocates nothing. */
void ib_matmul(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act, ib_isa isa,
               ib_pool *pool, float *Y, int ldy);

/* Most products ib_matmul_many runs in one pool job (more are split into several jobs). */
#define IB_MATMUL_MAX_MANY 4

/* Ys[i][b][n] = (X · W_i^T)[b][n] for the n products W_i = ms[i] that read the same X [B][K] (all
 * ms[i]->cols equal, and the same group size when q holds X quantized for them), each output with
 * row stride ms[i]->rows. One pool job covers the panels of all of them, so a decode step waits once
 * instead of n times; every output is bitwise what ib_matmul gives for that product alone. */
void ib_matmul_many(int n, const ib_matrix *const *ms, const float *X, int B, const ib_act_buf *q, ib_act act,
                    ib_isa isa, ib_pool *pool, float *const *Ys);


void ib_matmul_panels_scalar(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                             int p0, int p1, float *Y, int ldy);
void ib_matmul_panels_avx2(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                           int p0, int p1, float *Y, int ldy);
void ib_matmul_panels_avx512(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                             int p0, int p1, float *Y, int ldy);
/* ib_quantize_act on AVX-512 (matmul_avx512.c; x86 builds only), the same bits (a group that is not a
 * multiple of 16 by ib_quantize_act itself). */
void ib_quantize_act_avx512(const float *x, int B, int K, int G, int8_t *xq, float *d, float *ad);
/* AMX (matmul_amx.c): the AVX-512 kernel, except that Q8-activation products run their rows in
 * multiples of 16 on AMX-INT8 tiles (the rest of the rows, and F32 activations, on AVX-512). */
void ib_matmul_panels_amx(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                          int p0, int p1, float *Y, int ldy);
void ib_matmul_panels_neon(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                           int p0, int p1, float *Y, int ldy);

#endif
