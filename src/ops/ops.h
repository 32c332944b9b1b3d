/*
 * ops.h — the non-matmul ops of a decoder layer, in float32, each with one canonical order.
 *
 * Reductions (dot products, sums of squares) use the fixed "16-lane" order of ib_dot16: lane i
 * accumulates elements i, i+16, i+32, … in ascending order, then lanes fold pairwise (lane i += lane
 * i+8, then +4, +2, +1). The order depends on the length alone, so the compiler may vectorize the lane
 * loop at any width and every ISA gives the same bits. Elementwise ops have no order to keep.
 * Each function computes rows independently: a row's output never depends on the other rows.
 */
#ifndef IB_OPS_OPS_H
#define IB_OPS_OPS_H
#include <stdint.h>
#include "core/pool.h"
#include "isobatch.h"

/* sum_i a[i]*b[i] in the 16-lane order (mul, then add; no fma). */
float ib_dot16(const float *a, const float *b, int n);

/* The same, inline, so callers compiled for a wider vector unit vectorize the lanes (the bits do
 * not change: lanes are independent chains). */
static inline float ib_dot16_inline(const float *a, const float *b, int n) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] = lane[j] + a[i + j] * b[i + j];
    for (int j = 0; i + j < n; j++) lane[j] = lane[j] + a[i + j] * b[i + j];
    for (int w = 8; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++) lane[j] = lane[j] + lane[j + w];
    return lane[0];
}

/* IB_VECTOR_CLONES: compile a function three times, for the baseline ISA, AVX2 and AVX-512, and pick
 * at load time. Only for code whose vector lanes are independent (elementwise ops, the 16-lane order),
 * so every clone gives the same bits; -ffp-contract=off keeps multiplies and adds separate in all. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(IB_NO_CLONES)
#define IB_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define IB_VECTOR_CLONES
#endif

/* RMSNorm of R rows: y[r] = (x[r] * (1 / sqrt(mean(x[r]^2) + eps))) * w.
 * x, y: [R][D] (may alias); w: [D]. Splits rows over the pool. The test-only row-order fault breaks
 * this op alone (not ib_rmsnorm_heads): odd rows r of the call sum their squares in reverse. */
void ib_rmsnorm(const float *x, const float *w, int R, int D, float eps, float *y, ib_pool *pool);

/* Per-head RMSNorm (Qwen3's q_norm / k_norm): x [R][H][hd] normalised per (row, head) with w [hd],
 * in place. w NULL: no weight (Gemma 4's v_norm), y = x * (1 / sqrt(mean(x^2) + eps)). */
void ib_rmsnorm_heads(float *x, const float *w, int R, int H, int hd, float eps, ib_pool *pool);

/* RoPE tables for R tokens: cs [R][hd/2][2] = {cos, sin} of pos[r] * theta^(-2i/hd), computed in
 * double with ib_sincos / ib_pow and rounded to float. */
void ib_rope_table(const int32_t *pos, int R, int hd, double theta, float *cs);

/* ib_rope_table in which only pairs i < n_rot rotate; pairs i >= n_rot get {cos, sin} = {1, 0}, so
 * ib_rope leaves them as they are (Gemma 4's proportional RoPE: frequencies theta^(-2i/hd) of the
 * whole head for the first n_rot pairs, zero for the rest). n_rot = hd/2 is ib_rope_table. */
void ib_rope_table_pairs(const int32_t *pos, int R, int hd, double theta, int n_rot, float *cs);

/* Rotate x [R][H][hd] in place, split halves (not interleaved): for i < hd/2,
 *   a = x[i], b = x[i + hd/2];  x[i] = a*c - b*s;  x[i + hd/2] = b*c + a*s   (products rounded).
 * cs from ib_rope_table for the same rows. */
void ib_rope(float *x, int R, int H, int hd, const float *cs);

/* Positions RoPE uses for the R rows of a step, whose items bring item_len[i] rows each, in order:
 * a copy of pos — or, under the test-only rope-scalar-offset fault, every item's rows numbered from
 * the first item's first position (one offset for the whole batch). */
void ib_rope_positions(const int32_t *pos, const int *item_len, int n_items, int32_t *out);

/* ib_rope over the R rows of a step with n_items items — or, under the test-only rope-skip-rows
 * fault (MLX #3496), when every item brings one token and there are several, only row 0 rotated. */
void ib_rope_step(float *x, int R, int H, int hd, const float *cs, int n_items);

/* Rows [r0, r1) of ib_rope_step over a step of R rows (x and cs hold the whole step): those rows come
 * out exactly as ib_rope_step leaves them, the test-only fault included, so a step's rows can be
 * split over tasks. */
void ib_rope_step_rows(float *x, int r0, int r1, int R, int H, int hd, const float *cs, int n_items);

/* RoPE pair layouts. HALVES pairs x[i] with x[i + hd/2] (Qwen3, Llama: what the engine uses);
 * INTERLEAVED pairs x[2i] with x[2i + 1] (GPT-J style), with the same table and arithmetic. */
typedef enum ib_rope_layout { IB_ROPE_HALVES = 0, IB_ROPE_INTERLEAVED } ib_rope_layout;

/* ib_rope in the interleaved layout: for i < hd/2, a = x[2i], b = x[2i+1];
 * x[2i] = a*c - b*s;  x[2i+1] = b*c + a*s   (products rounded). */
void ib_rope_interleaved(float *x, int R, int H, int hd, const float *cs);

/* ib_rope_step in either layout (ib_rope_step is the HALVES case); the same test-only fault applies. */
void ib_rope_step_layout(float *x, int R, int H, int hd, const float *cs, int n_items, ib_rope_layout layout);

/* SwiGLU in place: g[r][f] = silu(g) * u with silu(g) = g / (1 + exp(-g)) (ib_expf). g, u: [R][F]. */
void ib_swiglu(float *g, const float *u, int R, int F);

/* GeGLU in place (Gemma's MLP, gelu_pytorch_tanh): g[r][f] = gelu(g) * u with
 *   gelu(x) = x / (1 + exp(-t)),  t = 1.5957691216057308 * (x + 0.044715 * ((x * x) * x))
 * in float32, products and sums rounded in that order, exp = ib_expf_lane. (The tanh form
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) is the same function: 1 + tanh(a) = 2 / (1 + e^(-2a)),
 * and 1.5957691216057308 = 2 sqrt(2/pi); this form has no cancellation.) g, u: [R][F]. */
void ib_geglu(float *g, const float *u, int R, int F);

/* Soft-capping of n values in place: x = cap * tanh(x / cap), computed in double as
 *   y = x / cap, a = |y|, e = ib_exp_lane(-2a), t = (1 - e) / (1 + e), x = (float)(cap * (y < 0 ? -t : t))
 * (Gemma's final_logit_softcapping). NaN stays NaN. */
void ib_softcap(float *x, size_t n, float cap);

/* Gemma 4's MoE routing of one row (docs/gemma4.md), from its router logits [E] (the product of
 * the router input with router.proj, matmul.h):
 *   sel[0..k) = the k largest logits in rank order: rank j takes the largest logit not yet taken,
 *               ties to the lowest expert id (NaN logits never taken);
 *   p = softmax(logits): m = logits[sel[0]], p_e = ib_expf_lane(l_e - m), s = sum of p_e in the
 *       16-lane order (ib_dot16's, over e ascending), p_e = p_e / s;
 *   t = p[sel[0]] + p[sel[1]] + … in rank order;  w[j] = (p[sel[j]] / t) * expert_scale[sel[j]].
 * p: [E] scratch (left holding the softmax). Returns 0, or -1 when fewer than k logits are numbers. */
int ib_moe_route(const float *logits, int E, int k, const float *expert_scale, float *p, int32_t *sel, float *w);

/* Gemma 4's MoE combine of one row: out[d] = 0, then for rank j = 0..k-1 in order (ranks with
 * sel[j] < 0 skipped — only the test-only capacity fault makes any): out[d] = out[d] + w[j] * y[j][d]
 * (mul, then add). y: [k][D], the row's selected experts' outputs in rank order. */
void ib_moe_combine(const float *y, const float *w, const int32_t *sel, int k, int D, float *out);

/* Test-only, the moe-capacity fault (routing that depends on the batch, as capacity-limited engines
 * route): of a step's routed pairs sel [n] (rows x k, row-major; -1: none), each expert e of E keeps the
 * first ceil(n / E) in that order and the rest become -1. */
void ib_moe_fault_capacity(int32_t *sel, int n, int E);

/* load [E] = how many of a step's routed pairs sel [n] (-1: none) each expert of E has. */
void ib_moe_loads(const int32_t *sel, int n, int E, int *load);

/* Test-only, the moe-combine-by-load fault (expert outputs summed in an order the batch decides): order
 * [E] = the expert ids by descending load [E] (ib_moe_loads), ties to the lower id — the order in which
 * the faulty combine adds each expert's outputs to their rows, from 0. */
void ib_moe_fault_load_order(const int *load, int E, int *order);

/* x *= s elementwise, n floats (Gemma 4's layer scalar, the embedding scale). */
void ib_scale(float *x, size_t n, float s);

/* x += y elementwise, n floats. */
void ib_add(float *x, const float *y, size_t n);

/* Key block size of attention's online softmax. Fixed; never derived from batch or threads. */
#define IB_ATTN_BLOCK 32

/* The key block a step of n_items items uses: IB_ATTN_BLOCK — or, under the test-only
 * split-kv-by-batch fault, IB_ATTN_BLOCK / 2 when n_items > 1 (a split chosen by batch size). */
int ib_attn_block_for(int n_items);

/* Causal attention for one query row and one head against a KV stream.
 * q [hd]; keys k [n_keys][hd] and values v [n_keys][hd] with row stride `kv_stride` floats (keys
 * 0..n_keys-1 are those at positions 0..n_keys-1); out [hd].
 * Online softmax over blocks of `block` keys in ascending order: per block, s_j = dot16(q,k_j)*scale,
 * m' = max(m, max_j s_j), c = exp(m - m'), l = l*c then l += p_j (p_j = exp(s_j - m')), acc = acc*c
 * then acc += p_j * v_j, in key order; out = acc / l. */
void ib_attend_one(const float *q, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                   float scale, int block, float *out);

/* ib_attend_one with a sliding window: only the last `window` keys (keys n_keys-window .. n_keys-1)
 * are attended; window <= 0 means no window (then it equals ib_attend_one bitwise). Blocks stay
 * aligned to multiples of `block` key positions (the block holding the first attended key is
 * partial), so chunked and token-by-token prefill still walk the same blocks. */
void ib_attend_one_window(const float *q, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                          float scale, int block, int window, float *out);

/* Most query heads sharing one KV head that ib_attend_heads takes at once. */
#define IB_ATTN_MAX_GROUP 16

/* ib_attend_one_window for nq (1..IB_ATTN_MAX_GROUP) query heads that share one KV head (GQA):
 * q [nq][hd], out [nq][hd]; head h's output is bitwise ib_attend_one_window(q + h*hd, ...). The heads
 * walk each key block in turn, so the block's keys and values are read from memory once. */
void ib_attend_heads(const float *q, int nq, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                     float scale, int block, int window, float *out);

/* Largest head_dim the config allows. */
#define IB_ATTN_MAX_HD 512

/* ib_attend_heads over keys and values stored as IEEE half (k, v [n_keys][kv_stride] uint16):
 * bitwise ib_attend_heads over their exact float32 conversions (converted as they are read).
 * block <= 128 for both. */
void ib_attend_heads_f16(const uint16_t *k, const uint16_t *v, const float *q, int nq, int n_keys, int kv_stride,
                         int hd, float scale, int block, int window, float *out);

/* ib_attend_heads over keys and values stored as KV type kvt (core/kv_elem.h: IB_KV_F32 floats,
 * IB_KV_F16 halves, IB_KV_Q8 blocks; k, v planes of n_keys rows of kv_stride logical elements, for
 * q8 hd and kv_stride multiples of 32): bitwise ib_attend_heads over the rows' decoded floats (half:
 * exact; q8: ib_kvq8_get's), decoded as they are read. */
void ib_attend_heads_kv_isa(ib_isa isa, ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq,
                            int n_keys, int kv_stride, int hd, float scale, int block, int window, float *out);

/* ib_attend_heads / ib_attend_heads_f16 computed by the copy for isa (attention_impl.h): AUTO picks
 * the best this CPU runs; SCALAR, NEON and an ISA the CPU lacks take the portable copy. Every copy
 * gives the same bits (the test-only isa-fma fault makes the AVX2 / AVX-512 copies fuse the dot
 * products' multiply-adds). */
void ib_attend_heads_isa(ib_isa isa, const float *q, int nq, const float *k, const float *v, int n_keys,
                         int kv_stride, int hd, float scale, int block, int window, float *out);
void ib_attend_heads_f16_isa(ib_isa isa, const uint16_t *k, const uint16_t *v, const float *q, int nq, int n_keys,
                             int kv_stride, int hd, float scale, int block, int window, float *out);

/* One step of the online softmax that ib_attend_heads runs, for callers whose keys are not one
 * contiguous run (a ring buffer): one key block of n1 + n2 keys (1 <= n1, 0 <= n2, n1 + n2 <= 128) for
 * nq (<= IB_ATTN_MAX_GROUP) query heads q [nq][hd], the keys and values stored as KV type kvt
 * (as in ib_attend_heads_kv_isa) in two runs: n1 rows at k1 / v1 then n2 rows at k2 / v2, row stride
 * kv_stride logical elements. Updates each head's running max m[nq] (start: -INFINITY), running sum l[nq] (start: 0)
 * and unnormalized output out [nq][hd] (start: 0); after the last block out / l is the attention
 * output. Walking a query's blocks in order through this gives bitwise what ib_attend_heads gives for
 * the same keys in one run cut into the same blocks, with the copy for isa as in
 * ib_attend_heads_isa. */
void ib_attend_block2_isa(ib_isa isa, ib_kv_dtype kvt, const float *q, int nq, const void *k1, const void *v1, int n1,
                          const void *k2, const void *v2, int n2, int kv_stride, int hd, float scale, float *m,
                          float *l, float *out);

/* Most queries (rows x query heads) that ib_attend_rows takes at once. */
#define IB_ATTN_TILE_Q 16

/* Several query rows of one session taking each key block together (a prefill chunk's rows): rows
 * t < nr (nr*nq <= IB_ATTN_TILE_Q), row t's nq query heads at q + t*q_stride ([nq][hd]) attending its
 * keys 0..n_keys[t]-1 of the KV plane k, v ([n][kv_stride] of KV type kvt, as in
 * ib_attend_heads_kv_isa); row t's output out + t*out_stride ([nq][hd]) is bitwise ib_attend_heads_kv's for
 * (q + t*q_stride, nq, n_keys[t] keys, window): the same key blocks in the same order, each row
 * taking only the keys of each block it would take alone (its own causal range and window), each
 * query's operations unchanged. Each block's keys and values are read from memory once for the rows
 * (and their loads into registers shared by up to 4 queries in the vector copies). hd <=
 * IB_ATTN_MAX_HD, block <= 128. The copy for isa as in ib_attend_heads_isa. */
void ib_attend_rows_isa(ib_isa isa, ib_kv_dtype kvt, const float *q, size_t q_stride, int nq, int nr, const int *n_keys,
                        const void *k, const void *v, int kv_stride, int hd, float scale, int block, int window,
                        float *out, size_t out_stride);

/* For tests: one key block's softmax step (the part after the scores) of the copy for isa, as its
 * attention bodies run it: for nq (1..4) queries with scores s + h*rs (keys j0..nb-1, 0 <= j0 < nb <=
 * 128), each query's block max (the largest score that is not NaN; a zero maximum is the first zero in
 * key order), m' = max(m[h], it), c[h] = exp(m[h] - m'), the weights pw[h*rs + j] = exp(s[j] - m'),
 * l[h] = l[h]*c[h] + the weights in key order, m[h] = m'. Every copy gives the portable one's bits
 * for any scores, NaN, infinities and zeros of either sign included. */
void ib_attend_block_weights_isa(ib_isa isa, int nq, const float *s, int rs, int j0, int nb, float *m, float *l,
                                 float *pw, float *c);

/* KV rows a later attention call will read (its keys from k, its values from v, `bytes` bytes of
 * each), asked toward this core's L2 while the current call runs: a hint that changes no result. */
typedef struct ib_attn_ahead {
    const void *k, *v;
    size_t bytes;
} ib_attn_ahead;

/* ib_attend_heads_kv_isa's copy that also brings the rows of *ahead (NULL: none) toward the core, a
 * share with each key block it walks, so a later call finds them there; bitwise ib_attend_heads_kv's.
 * Decode attention's tasks each read a few dozen KB of keys and values from memory: short streams,
 * each of which started cold without it. */
void ib_attend_heads_ahead_isa(ib_isa isa, ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq,
                               int n_keys, int kv_stride, int hd, float scale, int block, int window, float *out,
                               const ib_attn_ahead *ahead);

/* The copies as function pointers, picked once (an engine's CPU backend does at creation). */
typedef void (*ib_attend_block2_fn)(ib_kv_dtype kvt, const float *q, int nq, const void *k1, const void *v1, int n1,
                                    const void *k2, const void *v2, int n2, int kv_stride, int hd, float scale,
                                    float *m, float *l, float *out);
typedef void (*ib_attend_rows_fn)(ib_kv_dtype kvt, const float *q, size_t q_stride, int nq, int nr, const int *n_keys,
                                  const void *k, const void *v, int kv_stride, int hd, float scale, int block,
                                  int window, float *out, size_t out_stride);
typedef void (*ib_attend_heads_ahead_fn)(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq,
                                         int n_keys, int kv_stride, int hd, float scale, int block, int window,
                                         float *out, const ib_attn_ahead *ahead);
typedef struct ib_attn_kernels {
    ib_attend_heads_ahead_fn heads_ahead;   /* every KV type, float included; ahead may be NULL */
    ib_attend_block2_fn block2;
    ib_attend_rows_fn rows;
} ib_attn_kernels;

/* The attention copies for isa (not AUTO): the AVX2 / AVX-512 ones on x86, the portable one for SCALAR
 * and NEON. Returns 0, or -1 (out untouched) when this build or this CPU cannot run isa. */
int ib_attn_kernels_for(ib_isa isa, ib_attn_kernels *out);

/* The copies themselves (same arguments as ib_attend_heads / ib_attend_heads_kv_isa / ib_attend_block2_isa /
 * ib_attend_rows_isa without isa); the AVX2 and AVX-512 ones exist on x86 only and need a CPU that runs them. */
void ib_attend_heads_portable(const float *q, int nq, const float *k, const float *v, int n_keys, int kv_stride,
                              int hd, float scale, int block, int window, float *out);
void ib_attend_heads_kv_portable(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq, int n_keys,
                            int kv_stride, int hd, float scale, int block, int window, float *out);
void ib_attend_heads_ahead_portable(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq, int n_keys,
                                int kv_stride, int hd, float scale, int block, int window, float *out,
                                const ib_attn_ahead *ahead);
void ib_attend_block2_portable(ib_kv_dtype kvt, const float *q, int nq, const void *k1, const void *v1, int n1,
                               const void *k2, const void *v2, int n2, int kv_stride, int hd, float scale, float *m,
                               float *l, float *out);
void ib_attend_rows_portable(ib_kv_dtype kvt, const float *q, size_t q_stride, int nq, int nr, const int *n_keys, const void *k,
                             const void *v, int kv_stride, int hd, float scale, int block, int window, float *out,
                             size_t out_stride);
void ib_attend_block_weights_portable(int nq, const float *s, int rs, int j0, int nb, float *m, float *l, float *pw,
                                     float *c);
#if defined(__x86_64__) || defined(__i386__)
void ib_attend_heads_avx2(const float *q, int nq, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                          float scale, int block, int window, float *out);
void ib_attend_heads_kv_avx2(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq, int n_keys,
                            int kv_stride, int hd, float scale, int block, int window, float *out);
void ib_attend_heads_ahead_avx2(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq, int n_keys,
                                int kv_stride, int hd, float scale, int block, int window, float *out,
                                const ib_attn_ahead *ahead);
void ib_attend_heads_avx512(const float *q, int nq, const float *k, const float *v, int n_keys, int kv_stride,
                            int hd, float scale, int block, int window, float *out);
void ib_attend_heads_kv_avx512(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq, int n_keys,
                            int kv_stride, int hd, float scale, int block, int window, float *out);
void ib_attend_heads_ahead_avx512(ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq, int n_keys,
                                int kv_stride, int hd, float scale, int block, int window, float *out,
                                const ib_attn_ahead *ahead);
void ib_attend_block2_avx2(ib_kv_dtype kvt, const float *q, int nq, const void *k1, const void *v1, int n1, const void *k2,
                           const void *v2, int n2, int kv_stride, int hd, float scale, float *m, float *l, float *out);
void ib_attend_block2_avx512(ib_kv_dtype kvt, const float *q, int nq, const void *k1, const void *v1, int n1,
                             const void *k2, const void *v2, int n2, int kv_stride, int hd, float scale, float *m,
                             float *l, float *out);
void ib_attend_rows_avx2(ib_kv_dtype kvt, const float *q, size_t q_stride, int nq, int nr, const int *n_keys, const void *k,
                         const void *v, int kv_stride, int hd, float scale, int block, int window, float *out,
                         size_t out_stride);
void ib_attend_rows_avx512(ib_kv_dtype kvt, const float *q, size_t q_stride, int nq, int nr, const int *n_keys, const void *k,
                           const void *v, int kv_stride, int hd, float scale, int block, int window, float *out,
                           size_t out_stride);
void ib_attend_block_weights_avx2(int nq, const float *s, int rs, int j0, int nb, float *m, float *l, float *pw,
                                 float *c);
void ib_attend_block_weights_avx512(int nq, const float *s, int rs, int j0, int nb, float *m, float *l, float *pw,
                                   float *c);
#endif

#endif
