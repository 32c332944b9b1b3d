/*
 * probe.c — `isobatch probe`: every op the model uses, run alone over a [B,H,T,D] shape matrix, with
 * the checks of the MLX batched-RoPE report (ml-explore/mlx #3496):
 *
 *   identical rows   B items with the same input (same data, same position) must give B identical
 *                    output rows;
 *   batched vs B=1   with a different input per item, row i of the batched run must equal a B = 1
 *                    run of item i alone (one thread), bitwise;
 *   ISA              for ops with one kernel per ISA (matmul), a B = 1 run on each backend must equal
 *                    the scalar backend's.
 *
 * Each op is called exactly as src/runtime/step.c calls it (same functions, same argument pattern:
 * positions through ib_rope_positions/ib_rope_step, the attention block through ib_attn_block_for,
 * Q8 activations through ib_quantize_act, sampling through ib_sample on sessions), so a fault injected
 * into the engine's code path shows up here in the op it breaks and nowhere else.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/pool.h"
#include "diag/diag.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "runtime/runtime.h"

const int ib_probe_default_B[7] = {1, 2, 3, 4, 8, 16, 33};
const int ib_probe_default_T[4] = {1, 2, 7, 64};
const int ib_probe_default_pos[4] = {0, 1, 148, 4095};

/* Fixed op shapes. */
#define EMB_V 64          /* embedding rows */
#define EMB_D 128
#define NORM_D 256
#define QK_H 4
#define QK_HD 64
#define MM_K 256          /* matmul: Y[R][40] = X[R][256] · W^T; N = 40 leaves a partial panel */
#define MM_N 40
#define ROPE_H 4
#define ROPE_HD 128
#define ROPE_THETA 10000.0
#define ATT_H 4           /* attention: 4 query heads over 2 KV heads (GQA), head_dim 64 */
#define ATT_KVH 2
#define ATT_HD 64
#define ATT_WINDOW 128
#define SWI_F 128
#define SAMP_V 512
#define EPS 1e-6f
#define ROW_POS_STEP 37   /* per-row positions: item b starts at pos + 37 b */
#define KV_SHIFT 7        /* distinct items read the shared KV buffer from key 7 b on */

typedef enum { K_EMBED, K_RMS, K_QKN, K_MATMUL, K_ROPE, K_ATTN, K_SWIGLU, K_SAMPLE } op_kind;

typedef struct op_def {
    ib_probe_op_info info;   /* first member: ib_probe_op() returns &op->info */
    op_kind kind;
    int wf;                  /* embed, matmul: 0 f32, 1 q4 (group 64), 2 q8 (group 32) */
    ib_act act;              /* matmul */
    ib_rope_layout layout;   /* rope */
    int row_pos;             /* rope: each item its own position */
    int window;              /* attention: sliding window (0 = off) */
    int seeded;              /* sample: temperature sampling instead of greedy */
    int in_w, out_w;         /* floats per row in and out */
} op_def;

#define INFO(n, h, d, p, isa, rows, io, a) {n, h, d, p, isa, rows, io, a}
static const op_def ops[] = {
    {INFO("embed/f32", 1, EMB_D, 0, 0, 1, 0, "token ids -> rows of a float32 [64,128] table"), K_EMBED, 0, 0, 0, 0, 0, 0, 1, EMB_D},
    {INFO("embed/q4", 1, EMB_D, 0, 0, 1, 0, "token ids -> dequantized rows of a 4-bit MLX table (group 64)"), K_EMBED, 1, 0, 0, 0, 0, 0, 1, EMB_D},
    {INFO("embed/q8", 1, EMB_D, 0, 0, 1, 0, "token ids -> dequantized rows of an 8-bit MLX table (group 32)"), K_EMBED, 2, 0, 0, 0, 0, 0, 1, EMB_D},
    {INFO("rmsnorm", 1, NORM_D, 0, 0, 1, 0, "ib_rmsnorm over [B*T][256] rows"), K_RMS, 0, 0, 0, 0, 0, 0, NORM_D, NORM_D},
    {INFO("qknorm", QK_H, QK_HD, 0, 0, 1, 0, "ib_rmsnorm_heads over [B*T][4][64] (q_norm / k_norm)"), K_QKN, 0, 0, 0, 0, 0, 0, QK_H * QK_HD, QK_H * QK_HD},
    {INFO("matmul/f32", 1, MM_K, 0, 1, 1, 0, "float32 weights [40,256], f32 activations"), K_MATMUL, 0, IB_ACT_F32, 0, 0, 0, 0, MM_K, MM_N},
    {INFO("matmul/q4-f32", 1, MM_K, 0, 1, 1, 0, "4-bit weights (group 64) [40,256], f32 activations"), K_MATMUL, 1, IB_ACT_F32, 0, 0, 0, 0, MM_K, MM_N},
    {INFO("matmul/q4-q8", 1, MM_K, 0, 1, 1, 0, "4-bit weights (group 64) [40,256], q8 activations"), K_MATMUL, 1, IB_ACT_Q8, 0, 0, 0, 0, MM_K, MM_N},
    {INFO("matmul/q8-f32", 1, MM_K, 0, 1, 1, 0, "8-bit weights (group 32) [40,256], f32 activations"), K_MATMUL, 2, IB_ACT_F32, 0, 0, 0, 0, MM_K, MM_N},
    {INFO("matmul/q8-q8", 1, MM_K, 0, 1, 1, 0, "8-bit weights (group 32) [40,256], q8 activations"), K_MATMUL, 2, IB_ACT_Q8, 0, 0, 0, 0, MM_K, MM_N},
    {INFO("rope/halves/scalar-pos", ROPE_H, ROPE_HD, 1, 0, 1, 0, "split-halves RoPE, every item at the same position"), K_ROPE, 0, 0, IB_ROPE_HALVES, 0, 0, 0, ROPE_H * ROPE_HD, ROPE_H * ROPE_HD},
    {INFO("rope/halves/row-pos", ROPE_H, ROPE_HD, 1, 0, 0, 0, "split-halves RoPE, item b at position pos + 37b"), K_ROPE, 0, 0, IB_ROPE_HALVES, 1, 0, 0, ROPE_H * ROPE_HD, ROPE_H * ROPE_HD},
    {INFO("rope/interleaved/scalar-pos", ROPE_H, ROPE_HD, 1, 0, 1, 0, "interleaved RoPE, every item at the same position"), K_ROPE, 0, 0, IB_ROPE_INTERLEAVED, 0, 0, 0, ROPE_H * ROPE_HD, ROPE_H * ROPE_HD},
    {INFO("rope/interleaved/row-pos", ROPE_H, ROPE_HD, 1, 0, 0, 0, "interleaved RoPE, item b at position pos + 37b"), K_ROPE, 0, 0, IB_ROPE_INTERLEAVED, 1, 0, 0, ROPE_H * ROPE_HD, ROPE_H * ROPE_HD},
    {INFO("attention", ATT_H, ATT_HD, 1, 0, 1, 0, "causal GQA attention (4 heads, 2 KV heads), keys 0..pos+t; T=1 decode, T>1 prefill"), K_ATTN, 0, 0, 0, 0, 0, 0, ATT_H * ATT_HD, ATT_H * ATT_HD},
    {INFO("attention/window", ATT_H, ATT_HD, 1, 0, 1, 0, "the same with a sliding window of 128 keys"), K_ATTN, 0, 0, 0, 0, ATT_WINDOW, 0, ATT_H * ATT_HD, ATT_H * ATT_HD},
    {INFO("swiglu", 1, SWI_F, 0, 0, 1, 0, "silu(gate) * up over [B*T][128]"), K_SWIGLU, 0, 0, 0, 0, 0, 0, 2 * SWI_F, SWI_F},
    {INFO("sample/greedy", 1, SAMP_V, 1, 0, 1, 1, "ib_sample greedy over 512 logits; T draws per session from step pos"), K_SAMPLE, 0, 0, 0, 0, 0, 0, SAMP_V, 1},
    {INFO("sample/seeded", 1, SAMP_V, 1, 0, 1, 1, "ib_sample with temperature, top-k, top-p, min-p, repetition penalty; seed per session"), K_SAMPLE, 0, 0, 0, 0, 0, 1, SAMP_V, 1},
};
#undef INFO
#define N_OPS ((int)(sizeof ops / sizeof ops[0]))

int ib_probe_n_ops(void) { return N_OPS; }

const ib_probe_op_info *ib_probe_op(int i) { return i >= 0 && i < N_OPS ? &ops[i].info : NULL; }

int ib_probe_op_selected(const ib_probe_op_info *op, const char *sel) {
    if (!sel) return 1;
    size_t n = strlen(sel);
    return strcmp(op->name, sel) == 0 || (strncmp(op->name, sel, n) == 0 && op->name[n] == '/');
}

/* ---------------------------------------------------------------- data */

/* splitmix64: the probe's deterministic generator. */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform float in [-a, a). */
static float unif(uint64_t *s, float a) { return (float)(((double)(mix(s) >> 11) * 0x1p-53 * 2.0 - 1.0) * a); }

/* Shared state of a probe run: weights, the KV buffer, the stand-in model of the sample op. */
typedef struct pstate {
    ib_matrix emb[3];      /* [EMB_V][EMB_D]: f32, q4, q8 */
    ib_matrix mm[3];       /* [MM_N][MM_K]: f32, q4, q8 */
    float norm_w[NORM_D];
    float qk_w[QK_HD];
    float *kbuf, *vbuf;    /* [ATT_KVH][kv_cap][ATT_HD] */
    int kv_cap;
    struct ib_model stub;  /* only cfg's sampler fields are set (ib_session_create / ib_sample) */
} pstate;

static void pstate_free(pstate *ps) {
    for (int i = 0; i < 3; i++) {
        ib_matrix_free(&ps->emb[i]);
        ib_matrix_free(&ps->mm[i]);
    }
    free(ps->kbuf);
    free(ps->vbuf);
}

/* Build a weight matrix [N][K] in format wf (0 f32, 1 q4 g64, 2 q8 g32) from random floats. */
static ib_status make_matrix(ib_matrix *m, int wf, int N, int K, uint64_t *rng, ib_error *err) {
    float *w = malloc((size_t)N * K * sizeof *w);
    if (!w) return ib_fail(err, IB_ERR_NOMEM, "probe: out of memory");
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = unif(rng, 0.125f);
    ib_status rc;
    if (wf == 0) {
        rc = ib_matrix_from_f32(m, w, N, K, err);
    } else {
        int bits = wf == 1 ? 4 : 8, group = wf == 1 ? 64 : 32;
        uint32_t *wq = malloc((size_t)N * K / (32 / bits) * sizeof *wq);
        float *sc = malloc((size_t)N * (K / group) * sizeof *sc), *bi = malloc((size_t)N * (K / group) * sizeof *bi);
        if (!wq || !sc || !bi) {
            rc = ib_fail(err, IB_ERR_NOMEM, "probe: out of memory");
        } else {
            ib_mlx_quantize(w, N, K, bits, group, 1, wq, sc, bi);
            rc = ib_matrix_from_mlx(m, wq, sc, bi, N, K, bits, group, err);
        }
        free(wq);
        free(sc);
        free(bi);
    }
    free(w);
    return rc;
}

static ib_status pstate_init(pstate *ps, uint64_t seed, int kv_cap, ib_error *err) {
    memset(ps, 0, sizeof *ps);
    uint64_t rng = seed ^ 0x5eed5eed5eedULL;
    ib_status rc = IB_OK;
    for (int i = 0; i < 3 && !rc; i++) rc = make_matrix(&ps->emb[i], i, EMB_V, EMB_D, &rng, err);
    for (int i = 0; i < 3 && !rc; i++) rc = make_matrix(&ps->mm[i], i, MM_N, MM_K, &rng, err);
    if (rc) goto fail;
    for (int i = 0; i < NORM_D; i++) ps->norm_w[i] = 1.0f + unif(&rng, 0.1f);
    for (int i = 0; i < QK_HD; i++) ps->qk_w[i] = 1.0f + unif(&rng, 0.1f);
    ps->kv_cap = kv_cap;
    size_t kvn = (size_t)ATT_KVH * kv_cap * ATT_HD;
    ps->kbuf = malloc(kvn * sizeof(float));
    ps->vbuf = malloc(kvn * sizeof(float));
    if (!ps->kbuf || !ps->vbuf) {
        rc = ib_fail(err, IB_ERR_NOMEM, "probe: out of memory for a KV buffer of %d keys", kv_cap);
        goto fail;
    }
    for (size_t i = 0; i < kvn; i++) ps->kbuf[i] = unif(&rng, 1.0f);
    for (size_t i = 0; i < kvn; i++) ps->vbuf[i] = unif(&rng, 1.0f);
    ps->stub.cfg.vocab_size = SAMP_V;
    ps->stub.cfg.n_layers = 1;
    ps->stub.cfg.n_kv_heads = 1;
    ps->stub.cfg.head_dim = 2;
    ps->stub.cfg.max_position = 1 << 16;
    return IB_OK;
fail:
    pstate_free(ps);
    return rc;
}

/* ---------------------------------------------------------------- running one op */

/* n items of T rows each: x [n*T][in_w], item b's first position pos[b] and data tag tag[b]
 * (attention: its KV window starts at key KV_SHIFT*tag; sampling: its seed is 1000 + tag). */
typedef struct run_in {
    int n, T;
    const float *x;
    const int32_t *pos;
    const int *tag;
} run_in;

typedef struct attn_ctx {
    const pstate *ps;
    const op_def *op;
    const run_in *in;
    int block;
    float *out;
} attn_ctx;

/* One (row, head) of attention, as step.c's attn_task. */
static void attn_task(void *vctx, int task, int thread) {
    const attn_ctx *a = vctx;
    const pstate *ps = a->ps;
    int r = task / ATT_H, h = task % ATT_H, b = r / a->in->T, t = r % a->in->T;
    int kvh = h / (ATT_H / ATT_KVH);
    size_t base = ((size_t)kvh * ps->kv_cap + (size_t)KV_SHIFT * a->in->tag[b]) * ATT_HD;
    int n_keys = a->in->pos[b] + t + 1;
    const float *q = a->in->x + ((size_t)r * ATT_H + h) * ATT_HD;
    float *o = a->out + ((size_t)r * ATT_H + h) * ATT_HD;
    float scale = 1.0f / sqrtf((float)ATT_HD);
    if (a->op->window)
        ib_attend_one_window(q, ps->kbuf + base, ps->vbuf + base, n_keys, ATT_HD, ATT_HD, scale, a->block,
                             a->op->window, o);
    else
        ib_attend_one(q, ps->kbuf + base, ps->vbuf + base, n_keys, ATT_HD, ATT_HD, scale, a->block, o);
}

/* Run op over the items of `in` on backend isa with pool (NULL = one thread): out [n*T][out_w].
 * Returns 0, or -1 when out of memory. */
static int op_run(const pstate *ps, const op_def *op, const run_in *in, ib_isa isa, ib_pool *pool, float *out) {
    const int R = in->n * in->T;
    const float *x = in->x;
    int rc = 0;
    switch (op->kind) {
    case K_EMBED:
        for (int r = 0; r < R; r++) ib_matrix_row_f32(&ps->emb[op->wf], (int)x[r], out + (size_t)r * EMB_D);
        break;
    case K_RMS:
        ib_rmsnorm(x, ps->norm_w, R, NORM_D, EPS, out, pool);
        break;
    case K_QKN:
        memcpy(out, x, (size_t)R * op->in_w * sizeof(float));
        ib_rmsnorm_heads(out, ps->qk_w, R, QK_H, QK_HD, EPS, pool);
        break;
    case K_MATMUL: {
        const ib_matrix *m = &ps->mm[op->wf];
        ib_act_buf qa = {0};
        if (op->act == IB_ACT_Q8) {
            int G = m->group;
            qa.xq = malloc((size_t)R * MM_K);
            qa.d = malloc((size_t)R * (MM_K / G) * sizeof(float));
            qa.ad = malloc((size_t)R * (MM_K / G) * sizeof(float));
            if (!qa.xq || !qa.d || !qa.ad) rc = -1;
            else ib_quantize_act(x, R, MM_K, G, qa.xq, qa.d, qa.ad);
        }
        if (!rc) ib_matmul(m, x, R, &qa, op->act, isa, pool, out, MM_N);
        free(qa.xq);
        free(qa.d);
        free(qa.ad);
        break;
    }
    case K_ROPE: {
        int32_t *p = malloc((size_t)R * sizeof *p), *rp = malloc((size_t)R * sizeof *rp);
        int *len = malloc((size_t)in->n * sizeof *len);
        float *cs = malloc((size_t)R * ROPE_HD * sizeof *cs);
        if (!p || !rp || !len || !cs) {
            rc = -1;
        } else {
            for (int b = 0; b < in->n; b++) {
                len[b] = in->T;
                for (int t = 0; t < in->T; t++) p[b * in->T + t] = in->pos[b] + t;
            }
            ib_rope_positions(p, len, in->n, rp);
            ib_rope_table(rp, R, ROPE_HD, ROPE_THETA, cs);
            memcpy(out, x, (size_t)R * op->in_w * sizeof(float));
            ib_rope_step_layout(out, R, ROPE_H, ROPE_HD, cs, in->n, op->layout);
        }
        free(p);
        free(rp);
        free(len);
        free(cs);
        break;
    }
    case K_ATTN: {
        attn_ctx a = {ps, op, in, ib_attn_block_for(in->n), out};
        ib_pool_run(pool, R * ATT_H, attn_task, &a);
        break;
    }
    case K_SWIGLU: {
        float *u = malloc((size_t)R * SWI_F * sizeof *u);
        if (!u) {
            rc = -1;
            break;
        }
        for (int r = 0; r < R; r++) {
            memcpy(out + (size_t)r * SWI_F, x + (size_t)r * 2 * SWI_F, SWI_F * sizeof(float));
            memcpy(u + (size_t)r * SWI_F, x + (size_t)r * 2 * SWI_F + SWI_F, SWI_F * sizeof(float));
        }
        ib_swiglu(out, u, R, SWI_F);
        free(u);
        break;
    }
    case K_SAMPLE: {
        ib_session **s = calloc((size_t)in->n, sizeof *s);
        if (!s) return -1;
        for (int b = 0; b < in->n && !rc; b++) {
            ib_session_opts so = {.max_context = in->T + 1, .sampling = ib_sampling_default()};
            if (op->seeded) {
                so.sampling.temperature = 0.8f;
                so.sampling.top_k = 40;
                so.sampling.top_p = 0.95f;
                so.sampling.min_p = 0.02f;
                so.sampling.repeat_penalty = 1.1f;
                so.sampling.seed = 1000 + (uint64_t)in->tag[b];
            }
            if (ib_session_create(&ps->stub, &so, &s[b], NULL)) rc = -1;
            else s[b]->sample_step = (uint64_t)in->pos[b];  /* the session has drawn pos tokens before */
        }
        /* step-major, as ib_generate draws: every session's draw t before any draw t + 1 */
        for (int t = 0; t < in->T && !rc; t++)
            for (int b = 0; b < in->n; b++) {
                size_t r = (size_t)b * in->T + t;
                out[r] = (float)ib_sample(s[b], x + r * SAMP_V);
            }
        for (int b = 0; b < in->n; b++) ib_session_free(s[b]);
        free(s);
        break;
    }
    }
    return rc;
}

/* ---------------------------------------------------------------- comparing */

/* Distance in units in the last place between two floats (their order on the number line); any
 * difference in bits counts at least 1 (+0 vs -0, NaN payloads). */
static uint64_t ulp_dist(float a, float b) {
    uint32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia == ib) return 0;
    int64_t ka = ia & 0x80000000u ? -(int64_t)(ia & 0x7fffffffu) : (int64_t)ia;
    int64_t kb = ib & 0x80000000u ? -(int64_t)(ib & 0x7fffffffu) : (int64_t)ib;
    uint64_t d = (uint64_t)(ka > kb ? ka - kb : kb - ka);
    return d ? d : 1;
}

/* max ulp distance over n values (int_out: the number of differing values). */
static uint64_t max_ulp(const float *a, const float *b, size_t n, int int_out) {
    uint64_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = ulp_dist(a[i], b[i]);
        if (int_out) m += d != 0;
        else if (d > m) m = d;
    }
    return m;
}

/* max |a - b| (inf when a NaN is involved and the bits differ); *bits |= any bit differs. */
static double max_abs(const float *a, const float *b, size_t n, int *bits) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], 4) == 0) continue;
        *bits = 1;
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) d = INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* Fill rows [T][in_w] of one item with random input for op. */
static void gen_item(const op_def *op, int T, uint64_t *rng, float *x) {
    size_t n = (size_t)T * op->in_w;
    for (size_t i = 0; i < n; i++) {
        switch (op->kind) {
        case K_EMBED: x[i] = (float)(mix(rng) % EMB_V); break;
        case K_SAMPLE: x[i] = unif(rng, 4.0f); break;
        case K_ATTN: x[i] = unif(rng, 1.0f); break;
        default: x[i] = unif(rng, 2.0f); break;
        }
    }
}

typedef struct ref_job {
    const pstate *ps;
    const op_def *op;
    ib_isa isa;
    int T;
    const float *x;        /* [n][T][in_w] */
    const int32_t *pos;    /* [n] */
    const int *tag;        /* [n] */
    float *out;            /* [n][T][out_w] */
    int failed;
} ref_job;

/* Pool task b: item b alone (B = 1, one thread). */
static void ref_task(void *vctx, int b, int thread) {
    ref_job *j = vctx;
    run_in in = {1, j->T, j->x + (size_t)b * j->T * j->op->in_w, j->pos + b, j->tag + b};
    if (op_run(j->ps, j->op, &in, j->isa, NULL, j->out + (size_t)b * j->T * j->op->out_w)) j->failed = 1;
}

typedef struct case_buf {
    float *x, *y, *ref, *alt;   /* [Bmax*Tmax*in_w], [.. out_w] x3 */
    int32_t *pos;
    int *tag;
} case_buf;

/* Run one case (op on backend isa, B items of T rows at position pos) into c. Returns 0 or -1 (out of
 * memory). isa is the backend for ISA-dependent ops (ignored by the others). */
static int run_case(const pstate *ps, const op_def *op, int op_index, ib_isa isa, int B, int T, int pos, ib_pool *pool,
                    uint64_t seed, case_buf *cb, ib_probe_case *c) {
    const size_t nin = (size_t)T * op->in_w, nout = (size_t)T * op->out_w;
    const int int_out = op->info.int_out;
    const int cmp_isa = op->info.isa_dep && isa != IB_ISA_SCALAR;
    ib_isa run_isa = op->info.isa_dep ? isa : IB_ISA_SCALAR;
    memset(c, 0, sizeof *c);
    c->op = &op->info;
    c->isa = op->info.isa_dep ? isa : IB_ISA_AUTO;
    c->B = B;
    c->H = op->info.H;
    c->T = T;
    c->D = op->info.D;
    c->pos = op->info.uses_pos ? pos : -1;
    c->row_diff = -1;
    c->ulp_isa = cmp_isa ? 0 : -1;
    int p0 = op->info.uses_pos ? pos : 0;
    uint64_t rng = seed ^ ((uint64_t)(op_index + 1) << 48) ^ ((uint64_t)B << 32) ^ ((uint64_t)T << 16) ^ (uint64_t)p0;
    mix(&rng);
    ref_job rj = {ps, op, run_isa, T, cb->x, cb->pos, cb->tag, cb->ref, 0};

    /* identical rows: the same data and position in every item */
    if (op->info.rows_check) {
        gen_item(op, T, &rng, cb->x);
        for (int b = 0; b < B; b++) {
            if (b) memcpy(cb->x + b * nin, cb->x, nin * sizeof(float));
            cb->pos[b] = p0;
            cb->tag[b] = 0;
        }
        run_in in = {B, T, cb->x, cb->pos, cb->tag};
        if (op_run(ps, op, &in, run_isa, pool, cb->y)) return -1;
        run_in one = {1, T, cb->x, cb->pos, cb->tag};
        if (op_run(ps, op, &one, run_isa, NULL, cb->ref)) return -1;
        int bits = 0;
        c->row_diff = 0;
        for (int b = 1; b < B; b++) {
            double d = max_abs(cb->y + b * nout, cb->y, nout, &bits);
            if (d > c->row_diff) c->row_diff = d;
        }
        if (bits) c->fail |= IB_PROBE_FAIL_ROWS;
        for (int b = 0; b < B; b++) {
            uint64_t u = max_ulp(cb->y + b * nout, cb->ref, nout, int_out);
            if (u > c->ulp_batch) c->ulp_batch = u;
        }
        if (cmp_isa) {
            if (op_run(ps, op, &one, IB_ISA_SCALAR, NULL, cb->alt)) return -1;
            c->ulp_isa = (long long)max_ulp(cb->ref, cb->alt, nout, int_out);
        }
    }

    /* distinct rows: each item its own data (and, for row-pos ops, its own position) */
    for (int b = 0; b < B; b++) {
        gen_item(op, T, &rng, cb->x + b * nin);
        cb->pos[b] = p0 + (op->row_pos ? ROW_POS_STEP * b : 0);
        cb->tag[b] = b;
    }
    run_in in = {B, T, cb->x, cb->pos, cb->tag};
    if (op_run(ps, op, &in, run_isa, pool, cb->y)) return -1;
    /* B = 1 references; items are independent, so they run in parallel (each alone, one thread) —
     * except sampling, whose test-only shared-rng fault keeps a process-wide counter */
    if (op->kind == K_SAMPLE)
        for (int b = 0; b < B; b++) ref_task(&rj, b, 0);
    else
        ib_pool_run(pool, B, ref_task, &rj);
    if (rj.failed) return -1;
    for (int b = 0; b < B; b++) {
        uint64_t u = max_ulp(cb->y + b * nout, cb->ref + b * nout, nout, int_out);
        if (u > c->ulp_batch) c->ulp_batch = u;
    }
    if (cmp_isa) {
        run_in one = {1, T, cb->x, cb->pos, cb->tag};
        if (op_run(ps, op, &one, IB_ISA_SCALAR, NULL, cb->alt)) return -1;
        long long u = (long long)max_ulp(cb->ref, cb->alt, nout, int_out);
        if (u > c->ulp_isa) c->ulp_isa = u;
    }
    if (c->ulp_batch) c->fail |= IB_PROBE_FAIL_BATCH;
    if (c->ulp_isa > 0) c->fail |= IB_PROBE_FAIL_ISA;
    return 0;
}

/* ---------------------------------------------------------------- the matrix */

static int max_of(const int *v, int n) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > m) m = v[i];
    return m;
}

ib_status ib_probe_run(const ib_probe_opts *o, ib_probe_report_fn fn, void *ctx, int *n_fail, ib_error *err) {
    *n_fail = 0;
    const int *Bs = o->Bs ? o->Bs : ib_probe_default_B, *Ts = o->Ts ? o->Ts : ib_probe_default_T;
    const int *Ps = o->pos ? o->pos : ib_probe_default_pos;
    int nB = o->Bs ? o->n_B : 7, nT = o->Ts ? o->n_T : 4, nP = o->pos ? o->n_pos : 4;
    if (nB < 1 || nT < 1 || nP < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "probe: an empty shape list");
    for (int i = 0; i < nB; i++)
        if (Bs[i] < 1 || Bs[i] > 4096) return ib_fail(err, IB_ERR_INVALID_ARG, "probe: batch size %d is not in [1, 4096]", Bs[i]);
    for (int i = 0; i < nT; i++)
        if (Ts[i] < 1 || Ts[i] > 4096) return ib_fail(err, IB_ERR_INVALID_ARG, "probe: token count %d is not in [1, 4096]", Ts[i]);
    for (int i = 0; i < nP; i++)
        if (Ps[i] < 0 || Ps[i] > (1 << 20)) return ib_fail(err, IB_ERR_INVALID_ARG, "probe: position %d is not in [0, 2^20]", Ps[i]);
    if (o->n_isas < 1 || !o->isas) return ib_fail(err, IB_ERR_INVALID_ARG, "probe: no backend");
    for (int i = 0; i < o->n_isas; i++)
        if (o->isas[i] == IB_ISA_AUTO || !ib_isa_supported(o->isas[i]))
            return ib_fail(err, IB_ERR_UNSUPPORTED, "probe: backend %s: not supported by this CPU", ib_isa_name(o->isas[i]));
    int any = 0;
    for (int i = 0; i < N_OPS; i++) any |= ib_probe_op_selected(&ops[i].info, o->op);
    if (!any) return ib_fail(err, IB_ERR_INVALID_ARG, "probe: op '%s': no such op or family", o->op);

    int Bmax = max_of(Bs, nB), Tmax = max_of(Ts, nT), Pmax = max_of(Ps, nP);
    int kv_cap = Pmax + Tmax + KV_SHIFT * Bmax + 1;
    pstate ps;
    ib_status rc = pstate_init(&ps, o->seed, kv_cap, err);
    if (rc) return rc;
    ib_pool *pool = NULL;
    case_buf cb = {0};
    size_t wmax = 2 * SWI_F > SAMP_V ? 2 * SWI_F : SAMP_V;
    if (wmax < ROPE_H * ROPE_HD) wmax = ROPE_H * ROPE_HD;
    size_t rows = (size_t)Bmax * Tmax;
    cb.x = malloc(rows * wmax * sizeof(float));
    cb.y = malloc(rows * wmax * sizeof(float));
    cb.ref = malloc(rows * wmax * sizeof(float));
    cb.alt = malloc(rows * wmax * sizeof(float));
    cb.pos = malloc((size_t)Bmax * sizeof(int32_t));
    cb.tag = malloc((size_t)Bmax * sizeof(int));
    if (!cb.x || !cb.y || !cb.ref || !cb.alt || !cb.pos || !cb.tag) {
        rc = ib_fail(err, IB_ERR_NOMEM, "probe: out of memory for %zu rows", rows);
        goto done;
    }
    if ((rc = ib_pool_create(o->threads > 0 ? o->threads : 1, &pool, err))) goto done;
    for (int oi = 0; oi < N_OPS; oi++) {
        const op_def *op = &ops[oi];
        if (!ib_probe_op_selected(&op->info, o->op)) continue;
        int n_isa = op->info.isa_dep ? o->n_isas : 1;
        for (int ii = 0; ii < n_isa; ii++)
            for (int bi = 0; bi < nB; bi++)
                for (int ti = 0; ti < nT; ti++)
                    for (int pi = 0; pi < (op->info.uses_pos ? nP : 1); pi++) {
                        ib_probe_case c;
                        if (run_case(&ps, op, oi, o->isas[ii], Bs[bi], Ts[ti], Ps[pi], pool, o->seed, &cb, &c)) {
                            rc = ib_fail(err, IB_ERR_NOMEM, "probe: %s: out of memory", op->info.name);
                            goto done;
                        }
                        if (c.fail) ++*n_fail;
                        if (fn) fn(ctx, &c);
                    }
    }
done:
    ib_pool_free(pool);
    free(cb.x);
    free(cb.y);
    free(cb.ref);
    free(cb.alt);
    free(cb.pos);
    free(cb.tag);
    pstate_free(&ps);
    return rc;
}
