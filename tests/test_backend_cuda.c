/*
 * test_backend_cuda.c — the CUDA backend's table (backends/backend.h) against the scalar references of
 * src/ops, bit for bit, op by op.
 *
 * A tiny random model (mkmodel; 4-bit group 64, 8-bit group 32, float32 weights) is uploaded; three
 * sessions join at different steps and bring 1..7 tokens per step (prefill chunks and decode mixed in
 * one batch), for every activation mode (f32, q8), KV dtype (f32, f16, q8) and KV policy (full,
 * sink + window with ring wrap-around). The test drives the table as src/runtime/step.c does and, beside
 * it on the host, runs the same forward pass with the scalar references (ib_matrix_row_f32, ib_rmsnorm,
 * ib_matmul on IB_ISA_SCALAR after ib_quantize_act, ib_rmsnorm_heads, ib_rope, the KV store (q8: kv_elem.h's
 * ib_kvq8_encode_row), ib_attend_heads(_kv)_portable / ib_attend_policy, ib_swiglu, ib_add); after every op the device buffer must equal the host one
 * byte for byte, the KV caches too, and the logits. The batched runs (< 16 rows a step) take the dp4a
 * products and per-query-head attention; the lone runs are told to take the tensor-core products and
 * per-KV-head attention from one row. Then: a session decoded alone gives the logits it got in the
 * batch; whole steps of a CPU engine and a CUDA engine (the public API, src/runtime/step.c over each
 * table) give bitwise equal logits, in the schedule above and in decode steps of 1-4 sessions (also with
 * every one-row product reading its weights in rounds, IB_CUDA_MM_TILE=0 IB_CUDA_MM_STAGE=0, staging its
 * row's codes in shared memory, IB_CUDA_MM_TILE=0 IB_CUDA_MM_STAGE=force, and copying its weight tiles
 * into shared memory, IB_CUDA_MM_TILE=force, the default's kernel); and under the
 * test-only gpu-fma fault (an FMA in the products'
 * epilogue) each of these checks fails, so it can — and under gpu-split-k (Q8 products whose K is split
 * over blocks and added with atomics in any order) the op check, the engine comparison and the staged
 * decode steps fail too, and
 * under gpu-att-block (the attention's key blocks cut at half the canonical size) the op check of every
 * attention path and the engine comparison.
 *
 * Gemma 4 (gemma_checks; `test_backend_cuda --gemma` runs them alone): whole steps of a CPU engine and
 * a CUDA engine on gemma4-tiny, gemma4-moe-tiny (also with 300 and with 1,024 experts, 4-bit only), and gemma4-tiny with KV sharing (and per-layer
 * embeddings, or use_double_wide_mlp), three weight formats, f32/q8 activations, f32/f16/q8 KV, full sessions, sliding-window rings
 * and sink + window, bitwise equal logits; gpu-fma must make them differ. A difference is located: the
 * run is repeated with layer capture on both engines and the first differing (step, layer, point, row,
 * element) printed.
 *
 * Long K (long_k_checks; `test_backend_cuda --long-k` runs them alone): qwen3-0.6b's shapes, one layer,
 * 4-bit group 32 and 64, 8-bit group 128, and gemma4-26b-a4b's, one layer, 4-bit group 64 — the
 * small-grid tensor-core kernels walk many pipeline stages there, and a part of one last —: CPU engine vs CUDA engine with every Q8 product on each of those kernels and by the default
 * rules, bitwise equal logits; gpu-fma and gpu-split-k must make them differ on each. The same for the
 * one-row products with their weight tiles in shared memory (IB_CUDA_MM_TILE=force: 32-, 16- and 8-output
 * blocks by the grids' sizes, and at a 20 KiB bound).
 *
 * No GPU (or a build without CUDA): one SKIP line and no checks. `test_backend_cuda --bench` also
 * checks and times a qwen3-0.6b-shaped 4-bit model (decode B=1, B=128, prefill), `--profile [b1|b128|
 * decode|prefill|all [MODEL_DIR]]` runs one decode step at B=1, one at B=128 and one 128-token prompt's prefill (each
 * between cudaProfilerStart/Stop, for `ncu --profile-from-start off`) — used on the device machine.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "isobatch.h"

#ifndef IB_HAVE_CUDA
int main(void) {
    printf("SKIP test_backend_cuda: this build has no CUDA backend (nvcc not found)\n");
    TEST_MAIN_END("test_backend_cuda");
}
#else
#include "backends/backend.h"
#include "backends/cuda/cuda.h"
#include "core/half.h"
#include "core/kv_elem.h"
#include "core/pool.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "runtime/kv_policy.h"
#include "runtime/runtime.h"
#include "sampling/sampler.h"
#include "test_rng.h"

static const ib_backend_ops *CU = &ib_backend_cuda;

/* A session: its device cache and the host mirror the references compute on. */
typedef struct sess {
    ib_kv *kv;
    ib_kv_desc desc;
    void *hkv;   /* [L][2][KVH][cap][hd] as desc.dtype */
    int pos;
} sess;

/* One configuration's run: the model, the backend, host scratch and the mismatch tally. */
typedef struct run {
    const ib_model *m;
    ib_backend *b;
    ib_act act;
    int R_max;
    float *x, *xn, *q, *k, *v, *att, *o, *g, *u, *cs, *last, *hlog;
    int8_t *xq;
    float *qd, *qad;
    int checks, bad;
    char first_bad[96];
    int verbose;
} run;

/* KV type index kvd of the test loops (0 f32, 1 f16, 2 q8) and its name. */
static ib_kv_dtype kv_of(int kvd) { return kvd == 2 ? IB_KV_Q8 : kvd ? IB_KV_F16 : IB_KV_F32; }
static const char *kv_name(int kvd) { return kvd == 2 ? "q8" : kvd ? "f16" : "f32"; }

static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) abort();
    return p;
}

/* Compare device buffer buf (R rows of width floats) with the host rows h; tally under `what`. */
static void cmp_buf(run *t, ib_buf buf, const float *h, int R, int width, const char *what, int li) {
    const float *d = CU->read_rows(t->b, buf, R, width);
    t->checks++;
    if (d && memcmp(d, h, (size_t)R * width * sizeof(float)) == 0) return;
    if (!t->bad++) {
        size_t i = 0, n = (size_t)R * width;
        while (d && i < n && memcmp(d + i, h + i, 4) == 0) i++;
        snprintf(t->first_bad, sizeof t->first_bad, "%s (layer %d, element %zu: %.9g vs %.9g)", what, li, i,
                 d && i < n ? d[i] : NAN, i < n ? h[i] : NAN);
    }
}

/* Y [R][N] = X · W^T by the scalar reference under t's activation mode (what step.c asks of ib_matmul). */
static void ref_linear(run *t, const ib_matrix *w, const float *X, int R, float *Y) {
    if (t->act == IB_ACT_Q8 && w->fmt != IB_WF32) {
        ib_quantize_act(X, R, w->cols, w->group, t->xq, t->qd, t->qad);
        ib_act_buf q = {t->xq, t->qd, t->qad};
        ib_matmul(w, X, R, &q, IB_ACT_Q8, IB_ISA_SCALAR, NULL, Y, w->rows);
    } else {
        ib_matmul(w, X, R, NULL, IB_ACT_F32, IB_ISA_SCALAR, NULL, Y, w->rows);
    }
}

/* Element offset of (layer, k|v, head, slot 0) in a cache of shape d. */
static size_t plane_off(const ib_kv_desc *d, int li, int kv, int h) {
    return (((size_t)li * 2 + kv) * d->n_kv_heads + h) * (size_t)d->capacity * d->head_dim;
}

/* One step of n items (item i: session ss[i] brings nt[i] tokens toks[i]) through the CUDA table and the
 * host references, compared after every op; logits of each item's last row into lg[i] (V floats). */
static void step(run *t, sess **ss, int n, const int32_t *const *toks, const int *nt, float **lg) {
    const ib_model *m = t->m;
    const ib_config *c = &m->cfg;
    const int D = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, F = c->intermediate_size;
    const int V = c->vocab_size, G = H / KVH;
    const float eps = (float)c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    int32_t tok[512], pos[512], item[512], lrow[64];
    ib_kv *kvs[64];
    int R = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < nt[i]; j++, R++) tok[R] = toks[i][j], pos[R] = ss[i]->pos + j, item[R] = i;
        lrow[i] = R - 1;
        kvs[i] = ss[i]->kv;
    }
    ib_step_desc sd = {R, n, tok, pos, pos, item, kvs, ib_attn_block_for(n), n, lrow, lg, NULL};
    ib_error err;
    if (CU->step_begin(t->b, &sd, &err)) {
        CHECK(0, "step_begin: %s", err.msg);
        return;
    }
    ib_rope_table(pos, R, hd, c->rope_theta, t->cs);
    CU->embed(t->b);
    for (int r = 0; r < R; r++) ib_matrix_row_f32(&m->embed, tok[r], t->x + (size_t)r * D);
    cmp_buf(t, IB_BUF_X, t->x, R, D, "embed", -1);
    for (int li = 0; li < c->n_layers; li++) {
        const ib_layer *L = &m->layers[li];
        CU->rmsnorm(t->b, IB_BUF_X, IB_N_ATTN, li, IB_BUF_XN);
        ib_rmsnorm(t->x, L->attn_norm, R, D, eps, t->xn, NULL);
        cmp_buf(t, IB_BUF_XN, t->xn, R, D, "rmsnorm attn", li);
        {
            ib_wsel ws[3] = {IB_W_Q, IB_W_K, IB_W_V};
            ib_buf os[3] = {IB_BUF_Q, IB_BUF_K, IB_BUF_V};
            CU->linear(t->b, li, 3, ws, IB_BUF_XN, os);
        }
        ref_linear(t, &L->wq, t->xn, R, t->q);
        ref_linear(t, &L->wk, t->xn, R, t->k);
        ref_linear(t, &L->wv, t->xn, R, t->v);
        cmp_buf(t, IB_BUF_Q, t->q, R, H * hd, "linear q", li);
        cmp_buf(t, IB_BUF_K, t->k, R, KVH * hd, "linear k", li);
        cmp_buf(t, IB_BUF_V, t->v, R, KVH * hd, "linear v", li);
        CU->qk_prepare(t->b, li, IB_QK_NORM);
        if (L->q_norm) {
            ib_rmsnorm_heads(t->q, L->q_norm, R, H, hd, eps, NULL);
            ib_rmsnorm_heads(t->k, L->k_norm, R, KVH, hd, eps, NULL);
        }
        cmp_buf(t, IB_BUF_Q, t->q, R, H * hd, "q norm", li);
        cmp_buf(t, IB_BUF_K, t->k, R, KVH * hd, "k norm", li);
        CU->qk_prepare(t->b, li, IB_QK_ROPE_STORE);
        ib_rope_step(t->q, R, H, hd, t->cs, n);
        ib_rope_step(t->k, R, KVH, hd, t->cs, n);
        cmp_buf(t, IB_BUF_Q, t->q, R, H * hd, "rope q", li);
        cmp_buf(t, IB_BUF_K, t->k, R, KVH * hd, "rope k", li);
        for (int r = 0; r < R; r++) {
            sess *s = ss[item[r]];
            const size_t slot = (size_t)ib_kv_desc_slot(&s->desc, pos[r]);
            for (int h = 0; h < KVH; h++) {
                if (s->desc.dtype == IB_KV_Q8) { /* the definition's encoder, a row at a time */
                    char *base = (char *)s->hkv;
                    ib_kvq8_encode_row(t->k + ((size_t)r * KVH + h) * hd, hd,
                                       base + ib_kv_bytes(IB_KV_Q8, plane_off(&s->desc, li, 0, h) + slot * hd));
                    ib_kvq8_encode_row(t->v + ((size_t)r * KVH + h) * hd, hd,
                                       base + ib_kv_bytes(IB_KV_Q8, plane_off(&s->desc, li, 1, h) + slot * hd));
                    continue;
                }
                for (int e = 0; e < hd; e++) {
                    const size_t ko = plane_off(&s->desc, li, 0, h) + slot * hd + e;
                    const size_t vo = plane_off(&s->desc, li, 1, h) + slot * hd + e;
                    const float kx = t->k[((size_t)r * KVH + h) * hd + e], vx = t->v[((size_t)r * KVH + h) * hd + e];
                    if (s->desc.dtype == IB_KV_F16) {
                        ((uint16_t *)s->hkv)[ko] = ib_f32_to_f16(kx);
                        ((uint16_t *)s->hkv)[vo] = ib_f32_to_f16(vx);
                    } else {
                        ((float *)s->hkv)[ko] = kx;
                        ((float *)s->hkv)[vo] = vx;
                    }
                }
            }
        }
        CU->attention(t->b, li);
        for (int r = 0; r < R; r++) {
            sess *s = ss[item[r]];
            for (int kh = 0; kh < KVH; kh++) {
                const char *kp = (const char *)s->hkv + ib_kv_bytes(s->desc.dtype, plane_off(&s->desc, li, 0, kh));
                const char *vp = (const char *)s->hkv + ib_kv_bytes(s->desc.dtype, plane_off(&s->desc, li, 1, kh));
                const float *qr = t->q + ((size_t)r * H + kh * G) * hd;
                float *out = t->att + ((size_t)r * H + kh * G) * hd;
                if (s->desc.window > 0) {
                    for (int h = 0; h < G; h++)
                        ib_attend_policy(&s->desc, qr + (size_t)h * hd, kp, vp, pos[r], hd, scale, sd.attn_block,
                                         out + (size_t)h * hd);
                } else if (s->desc.dtype != IB_KV_F32) {
                    ib_attend_heads_kv_portable(s->desc.dtype, kp, vp, qr, G, pos[r] + 1, hd, hd, scale, sd.attn_block, 0,
                                                out);
                } else {
                    ib_attend_heads_portable(qr, G, (const float *)kp, (const float *)vp, pos[r] + 1, hd, hd, scale,
                                             sd.attn_block, 0, out);
                }
            }
        }
        cmp_buf(t, IB_BUF_ATT, t->att, R, H * hd, "attention", li);
        {
            ib_wsel ws[1] = {IB_W_O};
            ib_buf os[1] = {IB_BUF_O};
            CU->linear(t->b, li, 1, ws, IB_BUF_ATT, os);
        }
        ref_linear(t, &L->wo, t->att, R, t->o);
        cmp_buf(t, IB_BUF_O, t->o, R, D, "linear o", li);
        CU->add(t->b, IB_BUF_X, IB_BUF_O);
        ib_add(t->x, t->o, (size_t)R * D);
        cmp_buf(t, IB_BUF_X, t->x, R, D, "add attn", li);
        CU->rmsnorm(t->b, IB_BUF_X, IB_N_MLP, li, IB_BUF_XN);
        ib_rmsnorm(t->x, L->mlp_norm, R, D, eps, t->xn, NULL);
        cmp_buf(t, IB_BUF_XN, t->xn, R, D, "rmsnorm mlp", li);
        {
            ib_wsel ws[2] = {IB_W_GATE, IB_W_UP};
            ib_buf os[2] = {IB_BUF_G, IB_BUF_U};
            CU->linear(t->b, li, 2, ws, IB_BUF_XN, os);
        }
        ref_linear(t, &L->w_gate, t->xn, R, t->g);
        ref_linear(t, &L->w_up, t->xn, R, t->u);
        cmp_buf(t, IB_BUF_G, t->g, R, F, "linear gate", li);
        cmp_buf(t, IB_BUF_U, t->u, R, F, "linear up", li);
        CU->swiglu(t->b);
        ib_swiglu(t->g, t->u, R, F);
        cmp_buf(t, IB_BUF_G, t->g, R, F, "swiglu", li);
        {
            ib_wsel ws[1] = {IB_W_DOWN};
            ib_buf os[1] = {IB_BUF_O};
            CU->linear(t->b, li, 1, ws, IB_BUF_G, os);
        }
        ref_linear(t, &L->w_down, t->g, R, t->o);
        cmp_buf(t, IB_BUF_O, t->o, R, D, "linear down", li);
        CU->add(t->b, IB_BUF_X, IB_BUF_O);
        ib_add(t->x, t->o, (size_t)R * D);
        cmp_buf(t, IB_BUF_X, t->x, R, D, "add mlp", li);
    }
    CU->logits(t->b);
    CHECK(CU->step_end(t->b, &err) == IB_OK, "step_end: %s", err.msg);
    for (int i = 0; i < n; i++) memcpy(t->last + (size_t)i * D, t->x + (size_t)lrow[i] * D, (size_t)D * sizeof(float));
    ib_rmsnorm(t->last, m->final_norm, n, D, eps, t->last, NULL);
    const float *fin = CU->read_rows(t->b, IB_BUF_XN, n, D);
    t->checks++;
    if (!fin || memcmp(fin, t->last, (size_t)n * D * sizeof(float))) {
        if (!t->bad++) snprintf(t->first_bad, sizeof t->first_bad, "final norm");
    }
    ref_linear(t, m->lm_head, t->last, n, t->hlog);
    for (int i = 0; i < n; i++) {
        t->checks++;
        if (memcmp(lg[i], t->hlog + (size_t)i * V, (size_t)V * sizeof(float))) {
            if (!t->bad++) snprintf(t->first_bad, sizeof t->first_bad, "logits of item %d", i);
        }
    }
    /* the caches, byte for byte */
    for (int i = 0; i < n; i++) {
        const size_t bytes = ib_kv_desc_bytes(&ss[i]->desc);
        void *dk = xmalloc(bytes);
        t->checks++;
        if (ib_cuda_kv_read(ss[i]->kv, dk, bytes) || memcmp(dk, ss[i]->hkv, bytes)) {
            if (!t->bad++) snprintf(t->first_bad, sizeof t->first_bad, "KV cache of item %d", i);
        }
        free(dk);
        ss[i]->pos += nt[i];
    }
}

static void sess_init(const ib_model *m, sess *s, ib_kv_dtype dt, int sink, int window, int chunk, int cap) {
    const ib_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    s->desc = (ib_kv_desc){.dtype = dt, .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                           .capacity = window > 0 ? sink + window + chunk : cap, .sink = sink, .window = window};
    ib_error err;
    CHECK(CU->kv_create(&s->desc, &s->kv, &err) == IB_OK, "kv_create: %s", err.msg);
    s->hkv = xmalloc(ib_kv_desc_bytes(&s->desc));
}

static void sess_free(sess *s) {
    CU->kv_free(s->kv);
    free(s->hkv);
}

static run *run_new(const ib_model *m, ib_act act, int R_max) {
    const ib_config *c = &m->cfg;
    run *t = xmalloc(sizeof *t);
    t->m = m, t->act = act, t->R_max = R_max;
    const size_t D = c->hidden_size, Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    const size_t F = c->intermediate_size, Km = (D > F ? D : F) > Q ? (D > F ? D : F) : Q;
    t->x = xmalloc(R_max * D * 4), t->xn = xmalloc(R_max * D * 4), t->o = xmalloc(R_max * D * 4);
    t->q = xmalloc(R_max * Q * 4), t->att = xmalloc(R_max * Q * 4);
    t->k = xmalloc(R_max * KV * 4), t->v = xmalloc(R_max * KV * 4);
    t->g = xmalloc(R_max * F * 4), t->u = xmalloc(R_max * F * 4);
    t->cs = xmalloc((size_t)R_max * c->head_dim * 4);
    t->last = xmalloc(R_max * D * 4);
    t->hlog = xmalloc((size_t)R_max * c->vocab_size * 4);
    t->xq = xmalloc(R_max * Km), t->qd = xmalloc(R_max * Km * 4), t->qad = xmalloc(R_max * Km * 4);
    ib_backend_cfg cfg = {IB_ISA_SCALAR, act, R_max, NULL};
    ib_error err;
    CHECK(CU->create(m, &cfg, &t->b, &err) == IB_OK, "create: %s", err.msg);
    return t;
}

static void run_free(run *t) {
    if (t->b) CU->destroy(t->b);
    free(t->x), free(t->xn), free(t->o), free(t->q), free(t->att), free(t->k), free(t->v), free(t->g), free(t->u);
    free(t->cs), free(t->last), free(t->hlog), free(t->xq), free(t->qd), free(t->qad);
    free(t);
}

#define NSESS 3
#define PAIR_SESS (NSESS + 1)   /* most sessions of engine_pair_open: the decode comparisons take 1..4 */
#define NSTEPS 16

/* Tokens item i brings at step s (0 when it has not joined yet): 1..7. */
static int tokens_at(int s, int i) { return s < i * 2 ? 0 : 1 + (s * 3 + i * 5) % 7; }

/* Tokens session i brings at step st: the ordinary schedule (1..7, joining at different steps), or the
 * wide one (three steps of 34 to 120 rows: the tensor-core products over several 16-row tiles,
 * attention per KV head). */
enum { WIDE_MAX = 48 };
static int count_at(int wide, int st, int i) {
    static const int wc[3][NSESS] = {{48, 24, 11}, {16, 10, 8}, {40, 40, 40}};
    return wide ? wc[st][i] : tokens_at(st, i);
}

/* One configuration: three sessions over nsteps steps (wide: the wide schedule's 3), every op
 * compared. Keeps item 0's logits of each step in lg0 [nsteps][V] (when non-NULL); solo: item 0 alone.
 * Returns the mismatch count. */
static int schedule_run(const ib_model *m, ib_act act, ib_kv_dtype dt, int window, const char *name, float *lg0,
                        int solo, int nsteps, int wide) {
    const int V = m->cfg.vocab_size, W = wide ? WIDE_MAX : 8;
    run *t = run_new(m, act, wide ? NSESS * WIDE_MAX : 64);
    if (!t->b) {
        run_free(t);
        return -1;
    }
    sess s[NSESS];
    for (int i = 0; i < NSESS; i++) sess_init(m, &s[i], dt, window ? 4 : 0, window, 8, 160);
    rng_state = wide ? 0x4321 : 0x1234;
    int32_t tk[NSESS][WIDE_MAX];
    float *lg[NSESS];
    for (int i = 0; i < NSESS; i++) lg[i] = xmalloc((size_t)V * 4);
    for (int st = 0; st < nsteps; st++) {
        sess *ss[NSESS];
        const int32_t *tp[NSESS];
        float *lp[NSESS];
        int nt[NSESS], n = 0;
        for (int i = 0; i < NSESS; i++) {
            int k = count_at(wide, st, i);
            for (int j = 0; j < W; j++) tk[i][j] = rndi(V);   /* same draws whatever joins */
            if (!k || (solo && i)) continue;
            ss[n] = &s[i], tp[n] = tk[i], nt[n] = k, lp[n] = lg[i], n++;
        }
        step(t, ss, n, tp, nt, lp);
        if (lg0) memcpy(lg0 + (size_t)st * V, lg[0], (size_t)V * 4);
    }
    printf("  %-44s %5d ops compared bitwise, %s%s\n", name, t->checks, t->bad ? "first mismatch: " : "all equal",
           t->bad ? t->first_bad : "");
    int bad = t->bad;
    for (int i = 0; i < NSESS; i++) sess_free(&s[i]), free(lg[i]);
    run_free(t);
    return bad;
}

/* The ordinary schedule (schedule_run). */
static int schedule(const ib_model *m, ib_act act, ib_kv_dtype dt, int window, const char *name, float *lg0,
                    int solo, int nsteps) {
    return schedule_run(m, act, dt, window, name, lg0, solo, nsteps, 0);
}

/* The wide schedule, full sessions (schedule_run). */
static int wide_schedule(const ib_model *m, ib_act act, ib_kv_dtype dt, const char *name) {
    return schedule_run(m, act, dt, 0, name, NULL, 0, 3, 1);
}

/* Layer capture of one engine's step (ib_engine_set_capture): every (layer, point, row) record and its
 * floats, in the order ib_step hands them over. */
typedef struct caprec {
    int layer, row, n;
    const char *point;
    size_t off;
} caprec;
typedef struct capbuf {
    caprec *r;
    int nr, cap;
    float *f;
    size_t nf, capf;
} capbuf;

static void cap_fn(void *ctx, int layer, const char *point, int row, const float *data, int n) {
    capbuf *c = ctx;
    if (c->nr == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 1024;
        c->r = realloc(c->r, (size_t)c->cap * sizeof *c->r);
        if (!c->r) abort();
    }
    while (c->nf + (size_t)n > c->capf) {
        c->capf = c->capf ? 2 * c->capf : (size_t)1 << 16;
        c->f = realloc(c->f, c->capf * sizeof(float));
        if (!c->f) abort();
    }
    c->r[c->nr++] = (caprec){layer, row, n, point, c->nf};
    memcpy(c->f + c->nf, data, (size_t)n * sizeof(float));
    c->nf += (size_t)n;
}

/* The first record where the CPU's (c[0]) and the CUDA engine's (c[1]) captures of step st differ:
 * printed with its layer, point, row and element; 1 when one was found. */
static int cap_first_diff(const capbuf *c, int st) {
    const int n = c[0].nr < c[1].nr ? c[0].nr : c[1].nr;
    for (int i = 0; i < n; i++) {
        const caprec *a = &c[0].r[i], *b = &c[1].r[i];
        if (a->layer != b->layer || a->row != b->row || a->n != b->n || strcmp(a->point, b->point)) {
            printf("    first difference: step %d: the captures' order differs at record %d (cpu layer %d %s row %d, "
                   "cuda layer %d %s row %d)\n", st, i, a->layer, a->point, a->row, b->layer, b->point, b->row);
            return 1;
        }
        const float *x = c[0].f + a->off, *y = c[1].f + b->off;
        for (int e = 0; e < a->n; e++)
            if (memcmp(&x[e], &y[e], 4)) {
                printf("    first difference: step %d, layer %d, point %s, row %d, element %d: cpu %.9g vs cuda %.9g\n",
                       st, a->layer, a->point, a->row, e, x[e], y[e]);
                return 1;
            }
    }
    if (c[0].nr != c[1].nr) {
        printf("    first difference: step %d: %d capture records on the cpu, %d on cuda\n", st, c[0].nr, c[1].nr);
        return 1;
    }
    return 0;
}

/* A CPU engine (e[0]) and a CUDA engine (e[1]) on m with activations act, each with nsess sessions s[k][i]
 * (max_context ctx, KV dtype dt; window > 0: sink 4 + that window; chunk > 0: that KV chunk), capturing
 * into cb[k] when cb != NULL. Returns 0, or -1 (a failed CHECK) when something could not be made. */
static int engine_pair_open(const ib_model *m, ib_act act, ib_kv_dtype dt, int ctx, int window, int chunk, int nsess,
                            ib_engine *e[2], ib_session *s[2][PAIR_SESS], capbuf *cb) {
    ib_error err;
    for (int k = 0; k < 2; k++) {
        ib_engine_opts eo = {.threads = 2, .act = act, .max_step_tokens = 64,
                             .backend = k ? IB_BACKEND_CUDA : IB_BACKEND_CPU};
        if (ib_engine_create(m, &eo, &e[k], &err)) {
            CHECK(0, "engine %s: %s", k ? "cuda" : "cpu", err.msg);
            return -1;
        }
        if (cb) ib_engine_set_capture(e[k], cap_fn, &cb[k]);
        for (int i = 0; i < nsess; i++) {
            ib_session_opts so = {.max_context = ctx, .kv_dtype = dt, .backend = k ? IB_BACKEND_CUDA : IB_BACKEND_CPU};
            if (window) so.kv_sink = 4, so.kv_window = window, so.kv_chunk = 8;
            if (chunk) so.kv_chunk = chunk;
            if (ib_session_create(m, &so, &s[k][i], &err)) {
                CHECK(0, "session: %s", err.msg);
                return -1;
            }
        }
    }
    return 0;
}

/* Whole steps through the public API: the same sessions and schedule on a CPU engine and a CUDA
 * engine (src/runtime/step.c over each table); every item's logits at every step must be
 * bitwise equal. window > 0: sessions with sink 4 + that window; chunk > 0: items of at most chunk
 * tokens (Gemma 4's sliding layers then keep rings of sliding_window + chunk - 1 slots). locate: both
 * engines capture every op's rows and the first differing (step, layer, point, row, element) is
 * printed (op by op on the GPU: the same arithmetic, no graphs). Returns the number of differing
 * logits rows (and argmax rows). */
static int engine_compare_at(const ib_model *m, ib_act act, ib_kv_dtype dt, int window, int chunk, const char *name,
                             int locate) {
    const int V = m->cfg.vocab_size;
    ib_engine *e[2];
    ib_session *s[2][PAIR_SESS];
    capbuf cb[2];
    memset(cb, 0, sizeof cb);
    ib_error err;
    if (engine_pair_open(m, act, dt, 160, window, chunk, NSESS, e, s, locate ? cb : NULL)) return -1;
    rng_state = 0x777;
    int32_t tk[NSESS][8];
    float *lg[2][NSESS];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NSESS; i++) lg[k][i] = xmalloc((size_t)V * 4);
    int diff = 0, rows = 0, amiss = 0, arows = 0, located = 0;
    int32_t am[NSESS];
    for (int st = 0; st < NSTEPS; st++) {
        ib_step_item it[2][NSESS];
        int n = 0;
        for (int i = 0; i < NSESS; i++) {
            int c = tokens_at(st, i);
            for (int j = 0; j < 8; j++) tk[i][j] = rndi(V);
            if (!c) continue;
            for (int k = 0; k < 2; k++) it[k][n] = (ib_step_item){.session = s[k][i], .tokens = tk[i], .n_tokens = c, .logits = lg[k][i], .argmax = NULL};
            /* the GPU's argmax of every row, its logits kept on the device every third step (not when
             * captured: both sides then capture the same logits rows) */
            am[n] = -1, it[1][n].argmax = &am[n];
            if (st % 3 == 2 && !locate) it[1][n].logits = NULL;
            n++;
        }
        for (int k = 0; k < 2; k++) CHECK(ib_step(e[k], it[k], n, &err) == IB_OK, "ib_step: %s", err.msg);
        for (int j = 0; j < n; j++, arows++) amiss += am[j] != ib_argmax(it[0][j].logits, V);
        if (locate && !located) located = cap_first_diff(cb, st);
        cb[0].nr = cb[1].nr = 0, cb[0].nf = cb[1].nf = 0;
        if (st % 3 == 2) continue;
        for (int j = 0; j < n; j++, rows++) diff += memcmp(it[0][j].logits, it[1][j].logits, (size_t)V * 4) != 0;
    }
    printf("  %-44s %5d logits rows CPU vs CUDA: %s; %d argmax rows: %s\n", name, rows, diff ? "DIFFER" : "all bitwise equal",
           arows, amiss ? "DIFFER" : "equal ib_argmax of the CPU's logits");
    if (locate && !located) printf("    (no captured op differs)\n");
    diff += amiss;
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < NSESS; i++) ib_session_free(s[k][i]), free(lg[k][i]);
        ib_engine_free(e[k]);
        free(cb[k].r), free(cb[k].f);
    }
    return diff;
}

static int engine_compare(const ib_model *m, ib_act act, ib_kv_dtype dt, int window, const char *name) {
    return engine_compare_at(m, act, dt, window, 0, name, 0);
}

/* Whole decode steps of few rows, CPU engine vs CUDA engine: nsess sessions (1..4) take prompts of p0,
 * p0 + 1, … tokens in one step, then decode one token each for 12 steps (steps of nsess rows, each its
 * session's only one: the one-row product kernels, the q/k preparation inside the direct attention, its
 * wide blocks; one session with p0 = 1: every step a single row); every step's logits must be bitwise
 * equal. Returns the rows that differ. */
static int engine_decode_compare(const ib_model *m, ib_act act, ib_kv_dtype dt, int nsess, int p0, const char *name) {
    enum { DSTEPS = 13 };
    const int V = m->cfg.vocab_size;
    ib_engine *e[2];
    ib_session *s[2][PAIR_SESS];
    ib_error err;
    if (nsess > PAIR_SESS || engine_pair_open(m, act, dt, 64, 0, 0, nsess, e, s, NULL)) return -1;
    rng_state = 0x5150 + (uint32_t)nsess;
    int32_t tk[PAIR_SESS][8];
    float *lg[2][PAIR_SESS];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < nsess; i++) lg[k][i] = xmalloc((size_t)V * 4);
    int diff = 0, rows = 0;
    for (int st = 0; st < DSTEPS; st++) {
        ib_step_item it[2][PAIR_SESS];
        for (int i = 0; i < nsess; i++) {
            const int c = st == 0 ? p0 + i : 1;
            for (int j = 0; j < c; j++) tk[i][j] = rndi(V);
            for (int k = 0; k < 2; k++) it[k][i] = (ib_step_item){.session = s[k][i], .tokens = tk[i], .n_tokens = c, .logits = lg[k][i], .argmax = NULL};
        }
        for (int k = 0; k < 2; k++) CHECK(ib_step(e[k], it[k], nsess, &err) == IB_OK, "ib_step: %s", err.msg);
        for (int i = 0; i < nsess; i++, rows++) diff += memcmp(lg[0][i], lg[1][i], (size_t)V * 4) != 0;
    }
    printf("  %-44s %5d logits rows CPU vs CUDA: %s\n", name, rows, diff ? "DIFFER" : "all bitwise equal");
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < nsess; i++) ib_session_free(s[k][i]), free(lg[k][i]);
        ib_engine_free(e[k]);
    }
    return diff;
}

/* Every row's logits of a prompt (ib_step_item.row_logits), CPU engine vs CUDA engine: session 0 brings
 * a 50-token prompt wanting all its rows beside session 1's 9-token prompt (last row only), then the
 * next 4 tokens the same way; session 2 is fed the same tokens as session 0 one a step on each engine.
 * Every row must be bitwise equal across the engines and to the one-token-a-step logits. Returns the
 * rows that differ. */
static int engine_prompt_rows_compare(const ib_model *m, ib_act act, ib_kv_dtype dt, const char *name) {
    enum { P0 = 50, P1 = 9, P2 = 4 };
    const int V = m->cfg.vocab_size;
    ib_engine *e[2];
    ib_session *s[2][PAIR_SESS];
    ib_error err;
    if (engine_pair_open(m, act, dt, 64, 0, 0, 3, e, s, NULL)) return -1;
    rng_state = 0x9a11;
    int32_t t0[P0 + P2], t1[P1];
    for (int i = 0; i < P0 + P2; i++) t0[i] = rndi(V);
    for (int i = 0; i < P1; i++) t1[i] = rndi(V);
    float *rows[2], *one[2], *last[2];
    for (int k = 0; k < 2; k++) {
        rows[k] = xmalloc((size_t)(P0 + P2) * V * 4), one[k] = xmalloc((size_t)(P0 + P2) * V * 4);
        last[k] = xmalloc((size_t)V * 4);
    }
    int diff = 0, nrows = 0;
    for (int k = 0; k < 2; k++) {
        ib_step_item it[2] = {{.session = s[k][0], .tokens = t0, .n_tokens = P0, .row_logits = rows[k]},
                              {.session = s[k][1], .tokens = t1, .n_tokens = P1, .logits = last[k]}};
        CHECK(ib_step(e[k], it, 2, &err) == IB_OK, "ib_step: %s", err.msg);
        it[0] = (ib_step_item){.session = s[k][0], .tokens = t0 + P0, .n_tokens = P2,
                               .row_logits = rows[k] + (size_t)P0 * V};
        CHECK(ib_step(e[k], it, 1, &err) == IB_OK, "ib_step: %s", err.msg);
        for (int i = 0; i < P0 + P2; i++) {
            ib_step_item o = {.session = s[k][2], .tokens = t0 + i, .n_tokens = 1, .logits = one[k] + (size_t)i * V};
            CHECK(ib_step(e[k], &o, 1, &err) == IB_OK, "ib_step: %s", err.msg);
        }
    }
    for (int i = 0; i < P0 + P2; i++, nrows++) {
        const size_t o = (size_t)i * V * 4;
        diff += memcmp((char *)rows[0] + o, (char *)rows[1] + o, (size_t)V * 4) != 0 ||
                memcmp((char *)rows[1] + o, (char *)one[1] + o, (size_t)V * 4) != 0 ||
                memcmp((char *)rows[0] + o, (char *)one[0] + o, (size_t)V * 4) != 0;
    }
    printf("  %-44s %5d prompt rows CPU vs CUDA vs one token a step: %s\n", name, nrows,
           diff ? "DIFFER" : "all bitwise equal");
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 3; i++) ib_session_free(s[k][i]);
        ib_engine_free(e[k]);
        free(rows[k]), free(one[k]), free(last[k]);
    }
    return diff;
}

/* engine_decode_compare for 1..PAIR_SESS sessions; returns the rows that differ. */
static int decode_compares(const ib_model *m, ib_act act, ib_kv_dtype dt, const char *what) {
    int bad = 0;
    for (int ns = 1; ns <= PAIR_SESS; ns++) {
        char name[96];
        snprintf(name, sizeof name, "decode, %d session%s, %s", ns, ns > 1 ? "s" : "", what);
        bad += engine_decode_compare(m, act, dt, ns, 3, name);
    }
    return bad;
}

/* engine_compare_at; when the logits differ, the run again with capture on to say where first. */
static int engine_compare_located(const ib_model *m, ib_act act, ib_kv_dtype dt, int window, int chunk, const char *name) {
    int d = engine_compare_at(m, act, dt, window, chunk, name, 0);
    if (d > 0) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s, captured", name);
        engine_compare_at(m, act, dt, window, chunk, nm, 1);
    }
    return d;
}

/* Products over a long K: qwen3-0.6b's shapes, one layer (K of 1,024 and 3,072, so the pipelined
 * tensor-core kernel walks 2 and 6 stages of 512 k — more than its pipeline holds — with 16..4 groups a
 * stage), 4-bit group 32, 8-bit group 128 and 4-bit group 64; and gemma4-26b-a4b's, one (full-attention)
 * layer, 4-bit group 64 (K of 2,816 and 2,112: whole stages, then a part of one): whole steps of a CPU
 * engine and a CUDA engine, bitwise equal logits, with every Q8 product of 1..21 rows on the tensor cores
 * (IB_CUDA_MMA_ROWS=1), on each of the small-grid kernels (IB_CUDA_MMA_KERNEL=pipe — with its blocks of
 * 16 outputs where the grid is small, and with 32 always, IB_CUDA_MMA_NARROW=0 — and 16), and by the
 * default rules; then under gpu-fma and gpu-split-k, on each kernel, the comparison must fail. */
static void long_k_checks(void) {
    static const struct { const char *preset; int bits, group; } cf[] = {
        {"qwen3-0.6b", 4, 32}, {"qwen3-0.6b", 8, 128}, {"qwen3-0.6b", 4, 64}, {"gemma4-26b-a4b", 4, 64}};
    for (int c = 0; c < (int)(sizeof cf / sizeof cf[0]); c++) {
        char dir[] = "/tmp/ib_cuda_lk_XXXXXX";
        if (!mkdtemp(dir)) return;
        ib_error err;
        ib_model *m;
        ib_mkmodel_opts mo = {.preset = cf[c].preset, .seed = 31 + c, .bits = cf[c].bits, .group = cf[c].group,
                              .tied = 1, .layers = 1};
        if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
            CHECK(0, "model %s 1 layer %d-bit g%d: %s", cf[c].preset, cf[c].bits, cf[c].group, err.msg);
            continue;
        }
        printf("model %s shapes, 1 layer, %d-bit group %d:\n", cf[c].preset, cf[c].bits, cf[c].group);
        char name[96];
        /* the small-grid kernels: pipelined (16-output blocks where the grid is small: here q/k/v, o and
         * down), pipelined with 32-output blocks only, 16-row tiles */
        static const char *const kernels[] = {"pipe", "pipe", "16"}, *const narrow[] = {NULL, "0", NULL};
        static const char *const kname[] = {"pipe", "pipe 32-output blocks", "16"};
        for (int mma = 0; mma < 4; mma++) {
            if (mma < 3) {
                setenv("IB_CUDA_MMA_ROWS", "1", 1), setenv("IB_CUDA_MMA_KERNEL", kernels[mma], 1);
                if (narrow[mma]) setenv("IB_CUDA_MMA_NARROW", narrow[mma], 1);
            }
            snprintf(name, sizeof name, "engine, act q8, kv f16, %s%s", mma < 3 ? "tensor cores, kernel " : "default kernels",
                     mma < 3 ? kname[mma] : "");
            CHECK(engine_compare_located(m, IB_ACT_Q8, IB_KV_F16, 0, 0, name) == 0,
                  "%s 1 layer %d-bit g%d, %s: CUDA engine's logits differ from the CPU engine's", cf[c].preset,
                  cf[c].bits, cf[c].group, name);
            unsetenv("IB_CUDA_MMA_ROWS"), unsetenv("IB_CUDA_MMA_KERNEL"), unsetenv("IB_CUDA_MMA_NARROW");
        }
        CHECK(decode_compares(m, IB_ACT_Q8, IB_KV_F16, "act q8, kv f16") == 0,
              "%s 1 layer %d-bit g%d: decode steps differ from the CPU engine's", cf[c].preset, cf[c].bits,
              cf[c].group);
        /* one-row products with their weight tiles in shared memory: 32-, 16- and 8-output blocks by
         * the grids' sizes (and 8- or 16-output ones only, at a 20 KiB bound), the faults caught */
        setenv("IB_CUDA_MM_TILE", "force", 1);
        for (int tb = 0; tb < 2; tb++) {
            if (tb) setenv("IB_CUDA_MM_TILE_KB", "20", 1);
            snprintf(name, sizeof name, "act q8, kv f16, weight tiles in shared memory%s", tb ? " (20 KiB)" : "");
            CHECK(decode_compares(m, IB_ACT_Q8, IB_KV_F16, name) == 0,
                  "%s 1 layer %d-bit g%d, %s: decode steps differ from the CPU engine's", cf[c].preset, cf[c].bits,
                  cf[c].group, name);
        }
        unsetenv("IB_CUDA_MM_TILE_KB");
        for (int f = 0; f < 2; f++) {
            static const ib_fault tf[] = {IB_FAULT_GPU_FMA, IB_FAULT_GPU_SPLIT_K};
            ib_fault_set(tf[f]);
            snprintf(name, sizeof name, "decode, 1 row a step, weight tiles, FAULT %s (must differ)", ib_fault_name(tf[f]));
            CHECK(engine_decode_compare(m, IB_ACT_Q8, IB_KV_F32, 1, 1, name) > 0,
                  "%s 1 layer %d-bit g%d: the decode comparison with weight tiles missed the %s fault", cf[c].preset,
                  cf[c].bits, cf[c].group, ib_fault_name(tf[f]));
            ib_fault_set(IB_FAULT_NONE);
        }
        unsetenv("IB_CUDA_MM_TILE");
        static const ib_fault faults[] = {IB_FAULT_GPU_FMA, IB_FAULT_GPU_SPLIT_K};
        setenv("IB_CUDA_MMA_ROWS", "1", 1);
        for (int mma = 0; mma < 3; mma++)
            for (int f = 0; f < 2; f++) {
                setenv("IB_CUDA_MMA_KERNEL", kernels[mma], 1);
                if (narrow[mma]) setenv("IB_CUDA_MMA_NARROW", narrow[mma], 1);
                ib_fault_set(faults[f]);
                snprintf(name, sizeof name, "engine, kernel %s, FAULT %s (must differ)", kname[mma], ib_fault_name(faults[f]));
                CHECK(engine_compare(m, IB_ACT_Q8, IB_KV_F32, 0, name) > 0,
                      "%s 1 layer %d-bit g%d: the engine comparison missed the %s fault (kernel %s)", cf[c].preset,
                      cf[c].bits, cf[c].group, ib_fault_name(faults[f]), kname[mma]);
                ib_fault_set(IB_FAULT_NONE);
                unsetenv("IB_CUDA_MMA_NARROW");
            }
        unsetenv("IB_CUDA_MMA_ROWS"), unsetenv("IB_CUDA_MMA_KERNEL");
        ib_model_free(m);
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
}

/* Gemma 4 on the CUDA backend (dense gemma4-tiny, MoE gemma4-moe-tiny — also with top-k 3 and router rows
 * equal in pairs, so every routing decides ties (lowest id first) —, gemma4-tiny with KV sharing, with KV
 * sharing and per-layer embeddings, and with KV sharing and double-wide shared MLPs; 4-bit group 32, 8-bit group 64, float32 weights): whole steps of a CPU engine and a CUDA engine, bitwise equal logits, for f32
 * and q8 activations, f32 and f16 KV, full sessions, rings on the sliding layers (kv_chunk 8) and
 * sink + window; wide steps (tensor-core products, per-KV-head attention from one row); and under the
 * test-only gpu-fma fault the comparison fails (located to its first op). A difference is located to
 * its first (step, layer, op, row, element). */
/* A Llama-architecture tiny model (no q/k head norms: the q/k kernel and the fused prologue rotate and
 * store only), q8 activations, f16 and f32 KV, full and sink + window sessions: every step's logits
 * against the scalar reference, with decode's q/k preparation inside attention wherever it can be and
 * as a kernel of its own; under the gpu-fma fault the comparison fails. */
static void llama_checks(void) {
    char dir[] = "/tmp/ib_cuda_llama_XXXXXX";
    if (!mkdtemp(dir)) return;
    ib_error err;
    ib_model *m = NULL;
    ib_mkmodel_opts mo = {.preset = "tiny", .arch = "llama", .seed = 5, .bits = 4, .group = 32, .tied = 1};
    if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
        CHECK(0, "model tiny llama: %s", err.msg);
        return;
    }
    printf("model tiny llama:\n");
    for (int fz = 0; fz < 2; fz++)
        for (int kvd = 0; kvd < 3; kvd++)
            for (int win = 0; win < 2; win++) {
                char name[96];
                snprintf(name, sizeof name, "llama, q/k preparation %s, kv %s, %s", fz ? "fused" : "unfused",
                         kv_name(kvd), win ? "window 40" : "full");
                setenv("IB_CUDA_FUSE_QK", fz ? "force" : "0", 1);
                const int bad = schedule(m, IB_ACT_Q8, kv_of(kvd), win ? 40 : 0, name, NULL, 0, NSTEPS);
                unsetenv("IB_CUDA_FUSE_QK");
                CHECK(bad == 0, "model tiny llama, %s: CUDA differs from the scalar reference", name);
            }
    /* and the comparison can fail: gpu-fma on the CUDA side only */
    ib_fault_set(IB_FAULT_GPU_FMA);
    const int bad = schedule(m, IB_ACT_Q8, IB_KV_F16, 0, "llama, FAULT gpu-fma (must mismatch)", NULL, 0, NSTEPS);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(bad > 0, "model tiny llama: the gpu-fma fault went unnoticed");
    ib_model_free(m);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void gemma_checks(void) {
    /* experts > 0: that many experts a layer — the routing's work lists over more experts than a routing
     * block has threads (300), and rows of 600 routed pairs whose scratch leaves 7 warps a routing block
     * (1,024 experts): 4-bit weights, q8 activations, f16 KV, full sessions only (heavy: 1), the CPU
     * engine being slow there */
    static const struct { const char *preset, *name; int kv_shared, ple, top_k, ties, wide, experts, heavy; } presets[] = {
        {"gemma4-tiny", "gemma4-tiny", 0, 0, 0, 0, 0, 0, 0},
        {"gemma4-moe-tiny", "gemma4-moe-tiny", 0, 0, 0, 0, 0, 0, 0},
        {"gemma4-moe-tiny", "gemma4-moe-tiny --top-k 3, router rows equal in pairs", 0, 0, 3, 1, 0, 0, 0},
        {"gemma4-moe-tiny", "gemma4-moe-tiny --experts 300 --top-k 8", 0, 0, 8, 0, 0, 300, 1},
        {"gemma4-moe-tiny", "gemma4-moe-tiny --experts 1024 --top-k 600", 0, 0, 600, 0, 0, 1024, 1},
        {"gemma4-tiny", "gemma4-tiny --kv-shared 2", 2, 0, 0, 0, 0, 0, 0},
        {"gemma4-tiny", "gemma4-tiny --kv-shared 2 --ple 64", 2, 64, 0, 0, 0, 0, 0},
        {"gemma4-tiny", "gemma4-tiny --kv-shared 2 --double-wide", 2, 0, 0, 0, 1, 0, 0}};
    static const struct { int bits, group; const char *name; } models[] = {{4, 32, "q4 g32"}, {8, 64, "q8 g64"}, {32, 0, "f32"}};
    for (int pi = 0; pi < (int)(sizeof presets / sizeof *presets); pi++)
        for (int mi = 0; mi < (presets[pi].heavy ? 1 : 3); mi++) {
            char dir[] = "/tmp/ib_cuda_g4_XXXXXX";
            if (!mkdtemp(dir)) return;
            ib_error err;
            ib_model *m = NULL;
            ib_mkmodel_opts mo = {.preset = presets[pi].preset, .seed = 11 + mi, .bits = models[mi].bits,
                                   .group = models[mi].group, .tied = 1, .kv_shared = presets[pi].kv_shared,
                                   .ple_dim = presets[pi].ple, .top_k = presets[pi].top_k,
                                   .router_ties = presets[pi].ties, .double_wide = presets[pi].wide,
                                   .experts = presets[pi].experts};
            if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
                CHECK(0, "model %s %s: %s", presets[pi].name, models[mi].name, err.msg);
                continue;
            }
            if (presets[pi].ties) { /* the routing's ties are real: experts 0 and 1 have one router row */
                const int D = m->cfg.hidden_size;
                float *r0 = malloc((size_t)2 * D * sizeof(float));
                if (r0) {
                    ib_matrix_row_f32(&m->layers[0].w_router, 0, r0);
                    ib_matrix_row_f32(&m->layers[0].w_router, 1, r0 + D);
                    CHECK(!memcmp(r0, r0 + D, (size_t)D * sizeof(float)), "model %s %s: router rows 0 and 1 differ",
                          presets[pi].name, models[mi].name);
                }
                free(r0);
            }
            printf("model %s %s:\n", presets[pi].name, models[mi].name);
            const int q8ok = models[mi].bits != 32, heavy = presets[pi].heavy;
            for (int act = heavy; act < 1 + q8ok; act++)
                for (int kvd = heavy; kvd < (heavy ? 2 : 3); kvd++)
                    for (int pol = 0; pol < (heavy ? 1 : 3); pol++) {
                        char name[96];
                        snprintf(name, sizeof name, "engine: act %s, kv %s, %s", act ? "q8" : "f32", kv_name(kvd),
                                 pol == 2 ? "sink 4 + window 40" : pol == 1 ? "sliding rings (chunk 8)" : "full");
                        int d = engine_compare_located(m, act ? IB_ACT_Q8 : IB_ACT_F32, kv_of(kvd),
                                                       pol == 2 ? 40 : 0, pol == 1 ? 8 : 0, name);
                        CHECK(d == 0, "model %s %s, %s: CUDA engine's logits differ from the CPU engine's", presets[pi].name,
                              models[mi].name, name);
                    }
            int d;
            if (!heavy) {
                /* one row takes the tensor-core products and the per-KV-head attention */
                setenv("IB_CUDA_MMA_ROWS", "1", 1);
                setenv("IB_CUDA_ATT_GROUP_ROWS", "1", 1);
                d = engine_compare_located(m, q8ok ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F16, 0, 8, "engine, mma + per-KV-head attention");
                CHECK(d == 0, "model %s %s, mma + per-KV-head attention: CUDA engine's logits differ from the CPU engine's",
                      presets[pi].name, models[mi].name);
                /* its q8 rows, and its passes a (head, key) pair at a time (IB_CUDA_ATT_GROUPED=0) */
                for (int grouped = 1; grouped >= 0; grouped--) {
                    if (!grouped) setenv("IB_CUDA_ATT_GROUPED", "0", 1);
                    d = engine_compare_located(m, q8ok ? IB_ACT_Q8 : IB_ACT_F32, grouped ? IB_KV_Q8 : IB_KV_F32, 0, 8,
                                               grouped ? "engine, per-KV-head attention, q8 KV"
                                                       : "engine, per-KV-head attention a pair at a time, f32 KV");
                    CHECK(d == 0, "model %s %s, per-KV-head attention (%s): CUDA engine's logits differ from the CPU "
                          "engine's", presets[pi].name, models[mi].name, grouped ? "grouped, q8 KV" : "pairs, f32 KV");
                }
                unsetenv("IB_CUDA_ATT_GROUPED");
                unsetenv("IB_CUDA_MMA_ROWS");
                unsetenv("IB_CUDA_ATT_GROUP_ROWS");
                /* the experts' Q8 products with a warp walking K (IB_CUDA_MOE_SPLIT=0; the default splits K over
                 * a block's warps) */
                setenv("IB_CUDA_MOE_SPLIT", "0", 1);
                d = engine_compare_located(m, q8ok ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F16, 0, 8, "engine, experts by K walk");
                unsetenv("IB_CUDA_MOE_SPLIT");
                CHECK(d == 0, "model %s %s, experts by K walk: CUDA engine's logits differ from the CPU engine's",
                      presets[pi].name, models[mi].name);
            }
            /* and the comparison can fail: gpu-fma on the CUDA side only */
            ib_fault_set(IB_FAULT_GPU_FMA);
            d = engine_compare_at(m, q8ok ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F32, 0, 0, "engine, FAULT gpu-fma (must differ)", 1);
            ib_fault_set(IB_FAULT_NONE);
            CHECK(d > 0, "model %s %s: the engine comparison missed the gpu-fma fault", presets[pi].name, models[mi].name);
            ib_model_free(m);
            char cmd[96];
            snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
            if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
        }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The forward pass of one step through the table alone (as step.c enqueues it), no checks. */
static int fwd(ib_backend *b, const ib_model *m, ib_kv **kvs, int n, const int32_t *tok, const int32_t *pos,
               const int32_t *item, int R, const int32_t *lrow, float **lg) {
    ib_step_desc sd = {R, n, tok, pos, pos, item, kvs, ib_attn_block_for(n), n, lrow, lg, NULL};
    ib_error err;
    if (CU->step_begin(b, &sd, &err)) return fprintf(stderr, "%s\n", err.msg), -1;
    CU->embed(b);
    for (int li = 0; li < m->cfg.n_layers; li++) {
        ib_wsel qkv[3] = {IB_W_Q, IB_W_K, IB_W_V}, o[1] = {IB_W_O}, gu[2] = {IB_W_GATE, IB_W_UP}, dn[1] = {IB_W_DOWN};
        ib_buf qkvb[3] = {IB_BUF_Q, IB_BUF_K, IB_BUF_V}, ob[1] = {IB_BUF_O}, gub[2] = {IB_BUF_G, IB_BUF_U};
        CU->rmsnorm(b, IB_BUF_X, IB_N_ATTN, li, IB_BUF_XN);
        CU->linear(b, li, 3, qkv, IB_BUF_XN, qkvb);
        CU->qk_prepare(b, li, IB_QK_NORM | IB_QK_ROPE_STORE);
        CU->attention(b, li);
        CU->linear(b, li, 1, o, IB_BUF_ATT, ob);
        CU->add(b, IB_BUF_X, IB_BUF_O);
        CU->rmsnorm(b, IB_BUF_X, IB_N_MLP, li, IB_BUF_XN);
        CU->linear(b, li, 2, gu, IB_BUF_XN, gub);
        CU->swiglu(b);
        CU->linear(b, li, 1, dn, IB_BUF_G, ob);
        CU->add(b, IB_BUF_X, IB_BUF_O);
    }
    CU->logits(b);
    if (CU->step_end(b, &err)) return fprintf(stderr, "%s\n", err.msg), -1;
    return 0;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* --bench: a qwen3-0.6b-shaped 4-bit model; prefill of a 128-token prompt, then decode at B=1 and B=128
 * (median step time), and the B=1 session's logits checked equal to row 0 of the B=128 batch. */
static int bench(const char *dir_in, ib_act act, int profile, const char *which) {
    ib_error err;
    ib_model *m;
    char dir[64] = "/tmp/ib_cuda_bench_XXXXXX";
    const char *d = dir_in;
    double t0 = now_s();
    if (!d) {
        if (!mkdtemp(dir)) return 1;
        ib_mkmodel_opts mo = {.preset = "qwen3-0.6b", .seed = 1, .bits = 4, .group = 64, .tied = 1};
        if (ib_mkmodel(dir, &mo, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        d = dir;
    }
    if (ib_model_load(d, NULL, &m, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    printf("bench model ready in %.1f s\n", now_s() - t0);
    if (!profile) {
        /* every op of 3 steps (17 rows, two sessions) against the scalar references on this model too */
        double a = now_s();
        int bad = schedule(m, act, IB_KV_F16, 0, "qwen3-0.6b-shaped q4, act q8, kv f16, 3 steps", NULL, 0, 3);
        CHECK(bad == 0, "0.6b-shaped model: CUDA differs from the scalar reference");
        printf("  (%.1f s)\n", now_s() - a);
    }
    const ib_config *c = &m->cfg;
    const int V = c->vocab_size, P = 128, BMAX = 128, NDEC = 32, RMAX = 512;
    ib_pool *pool = NULL;
    ib_pool_create((int)sysconf(_SC_NPROCESSORS_ONLN), &pool, &err);
    ib_backend_cfg cfg = {IB_ISA_SCALAR, act, RMAX, pool};
    ib_backend *b;
    if (CU->create(m, &cfg, &b, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    ib_kv *kv[BMAX];
    ib_kv_desc kd = {.dtype = IB_KV_F16, .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                     .capacity = P + NDEC + 8};
    for (int i = 0; i < BMAX; i++)
        if (CU->kv_create(&kd, &kv[i], &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    int32_t *tok = xmalloc(RMAX * 4), *pos = xmalloc(RMAX * 4), *item = xmalloc(RMAX * 4), lrow[BMAX];
    float **lg = xmalloc(BMAX * sizeof(float *)), *solo = xmalloc((size_t)NDEC * V * 4);
    for (int i = 0; i < BMAX; i++) lg[i] = xmalloc((size_t)V * 4);
    int32_t prompt[128], dec[64];
    rng_state = 99;
    for (int i = 0; i < P; i++) prompt[i] = rndi(V);
    for (int i = 0; i < NDEC; i++) dec[i] = rndi(V);
    if (profile) {
        /* 128 sessions prefilled (4 a step), then the profiled steps (`which`: b1, b128, decode (both),
         * prefill or all):
         * one decode step at B = 1, one at B = 128, one 128-token prompt in a step of its own (session
         * 0's positions 0..127 written again with the same tokens) */
        for (int i0 = 0; i0 < BMAX; i0 += 4) {
            int R = 0;
            for (int i = 0; i < 4; i++) {
                for (int r = 0; r < P; r++, R++) tok[R] = prompt[r], pos[R] = r, item[R] = i;
                lrow[i] = R - 1;
            }
            if (fwd(b, m, kv + i0, 4, tok, pos, item, R, lrow, lg)) return 1;
        }
        const int all = !strcmp(which, "all"), decode = all || !strcmp(which, "decode");
        if (decode || !strcmp(which, "b1")) {
            ib_cuda_profile(1);
            tok[0] = dec[0], pos[0] = P, item[0] = 0, lrow[0] = 0;
            if (fwd(b, m, kv, 1, tok, pos, item, 1, lrow, lg)) return 1;
            ib_cuda_profile(0);
        }
        if (decode || !strcmp(which, "b128")) {
            for (int i = 0; i < BMAX; i++) tok[i] = dec[1], pos[i] = P + (i == 0), item[i] = i, lrow[i] = i;
            ib_cuda_profile(1);
            if (fwd(b, m, kv, BMAX, tok, pos, item, BMAX, lrow, lg)) return 1;
            ib_cuda_profile(0);
        }
        if (all || !strcmp(which, "prefill")) {
            for (int r = 0; r < P; r++) tok[r] = prompt[r], pos[r] = r, item[r] = 0;
            lrow[0] = P - 1;
            ib_cuda_profile(1);
            if (fwd(b, m, kv, 1, tok, pos, item, P, lrow, lg)) return 1;
            ib_cuda_profile(0);
        }
        return 0;
    }
    /* B = 1: prefill (timed), then NDEC decode steps (median) */
    double ts[64];
    for (int rep = 0; rep < 3; rep++) {
        for (int r = 0; r < P; r++) tok[r] = prompt[r], pos[r] = r, item[r] = 0;
        lrow[0] = P - 1;
        double a = now_s();
        if (fwd(b, m, kv, 1, tok, pos, item, P, lrow, lg)) return 1;
        ts[rep] = now_s() - a;
    }
    qsort(ts, 3, sizeof(double), cmp_dbl);
    printf("prefill B=1 x %d tokens: %.2f ms  (%.0f tok/s)\n", P, ts[1] * 1e3, P / ts[1]);
    for (int st = 0; st < NDEC; st++) {
        tok[0] = dec[st], pos[0] = P + st, item[0] = 0, lrow[0] = 0;
        double a = now_s();
        if (fwd(b, m, kv, 1, tok, pos, item, 1, lrow, lg)) return 1;
        ts[st] = now_s() - a;
        memcpy(solo + (size_t)st * V, lg[0], (size_t)V * 4);
    }
    qsort(ts, NDEC, sizeof(double), cmp_dbl);
    printf("decode B=1: median step %.3f ms  (%.0f tok/s)\n", ts[NDEC / 2] * 1e3, 1.0 / ts[NDEC / 2]);
    {
        /* the same run op by op (no graphs): the same bits */
        setenv("IB_CUDA_GRAPHS", "0", 1);
        ib_backend *b2;
        ib_kv *kv2;
        if (CU->create(m, &cfg, &b2, &err) || CU->kv_create(&kd, &kv2, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        unsetenv("IB_CUDA_GRAPHS");
        for (int r = 0; r < P; r++) tok[r] = prompt[r], pos[r] = r, item[r] = 0;
        lrow[0] = P - 1;
        if (fwd(b2, m, &kv2, 1, tok, pos, item, P, lrow, lg)) return 1;
        int eq = 1;
        double t2[64];
        for (int st = 0; st < NDEC; st++) {
            tok[0] = dec[st], pos[0] = P + st, item[0] = 0, lrow[0] = 0;
            double a = now_s();
            if (fwd(b2, m, &kv2, 1, tok, pos, item, 1, lrow, lg)) return 1;
            t2[st] = now_s() - a;
            eq &= memcmp(lg[0], solo + (size_t)st * V, (size_t)V * 4) == 0;
        }
        qsort(t2, NDEC, sizeof(double), cmp_dbl);
        printf("decode B=1 without graphs: median step %.3f ms; logits bitwise equal to the graph run: %s\n",
               t2[NDEC / 2] * 1e3, eq ? "yes" : "NO");
        CHECK(eq, "graph replay changed the logits");
        CU->kv_free(kv2);
        CU->destroy(b2);
    }
    /* B = 128: every session prefills the same prompt, 4 sessions (512 rows) per step (timed) */
    double pf = 0;
    for (int i0 = 0; i0 < BMAX; i0 += 4) {
        int R = 0;
        for (int i = 0; i < 4; i++) {
            for (int r = 0; r < P; r++, R++) tok[R] = prompt[r], pos[R] = r, item[R] = i;
            lrow[i] = R - 1;
        }
        double a = now_s();
        if (fwd(b, m, kv + i0, 4, tok, pos, item, R, lrow, lg)) return 1;
        pf += now_s() - a;
    }
    printf("prefill 4 x %d tokens per step: %.0f tok/s over %d sessions\n", P, BMAX * P / pf, BMAX);
    int same = 1;
    for (int st = 0; st < NDEC; st++) {
        for (int i = 0; i < BMAX; i++) tok[i] = dec[st], pos[i] = P + st, item[i] = i, lrow[i] = i;
        double a = now_s();
        if (fwd(b, m, kv, BMAX, tok, pos, item, BMAX, lrow, lg)) return 1;
        ts[st] = now_s() - a;
        for (int i = 0; i < BMAX; i++) same &= memcmp(lg[i], solo + (size_t)st * V, (size_t)V * 4) == 0;
    }
    qsort(ts, NDEC, sizeof(double), cmp_dbl);
    printf("decode B=%d: median step %.3f ms  (%.0f tok/s aggregate)\n", BMAX, ts[NDEC / 2] * 1e3,
           BMAX / ts[NDEC / 2]);
    printf("B=%d decode logits of every row bitwise equal to the B=1 run: %s\n", BMAX, same ? "yes" : "NO");
    /* each op alone: 200 calls inside one step at B = 1 and B = 128 (host wall time per call) */
    for (int bi = 0; bi < 2; bi++) {
        const int B = bi ? BMAX : 1;
        for (int i = 0; i < B; i++) tok[i] = dec[0], pos[i] = P + NDEC, item[i] = i, lrow[i] = i;
        ib_step_desc sd = {B, B, tok, pos, pos, item, kv, 32, B, lrow, lg, NULL};
        static const char *names[] = {"embed", "rmsnorm", "linear qkv", "qk_prepare", "attention", "linear o",
                                      "add", "linear gate+up", "swiglu", "linear down", "logits"};
        printf("op times at B=%d (us per call):", B);
        for (int op = 0; op < 11; op++) {
            const int N = op == 10 ? 20 : 200;
            if (CU->step_begin(b, &sd, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
            ib_wsel qkv[3] = {IB_W_Q, IB_W_K, IB_W_V}, o[1] = {IB_W_O}, gu[2] = {IB_W_GATE, IB_W_UP}, dn[1] = {IB_W_DOWN};
            ib_buf qkvb[3] = {IB_BUF_Q, IB_BUF_K, IB_BUF_V}, ob[1] = {IB_BUF_O}, gub[2] = {IB_BUF_G, IB_BUF_U};
            CU->step_end(b, &err);
            double a = now_s();
            for (int i = 0; i < N; i++) switch (op) {
                case 0: CU->embed(b); break;
                case 1: CU->rmsnorm(b, IB_BUF_X, IB_N_ATTN, 0, IB_BUF_XN); break;
                case 2: CU->linear(b, 0, 3, qkv, IB_BUF_XN, qkvb); break;
                case 3: CU->qk_prepare(b, 0, IB_QK_NORM | IB_QK_ROPE_STORE); break;
                case 4: CU->attention(b, 0); break;
                case 5: CU->linear(b, 0, 1, o, IB_BUF_ATT, ob); break;
                case 6: CU->add(b, IB_BUF_X, IB_BUF_O); break;
                case 7: CU->linear(b, 0, 2, gu, IB_BUF_XN, gub); break;
                case 8: CU->swiglu(b); break;
                case 9: CU->linear(b, 0, 1, dn, IB_BUF_G, ob); break;
                default: CU->logits(b); break;
                }
            CU->step_end(b, &err);
            printf(" %s %.1f", names[op], (now_s() - a) / N * 1e6);
        }
        printf("\n");
    }
    CHECK(same, "batched logits differ from the lone session's");
    for (int i = 0; i < BMAX; i++) CU->kv_free(kv[i]), free(lg[i]);
    CU->destroy(b);
    ib_pool_free(pool);
    ib_model_free(m);
    return 0;
}

/* gpu-fma and gpu-split-k caught by the decode comparison of 1, 2 and 3 sessions from prompts of 1, 2, 3
 * tokens, whose decode steps of 1, 2 and 3 rows take the few-row product kernel the environment selects
 * (`kernel` names it). */
static void few_row_faults_caught(const ib_model *m, const char *model, const char *kernel) {
    static const ib_fault tf[] = {IB_FAULT_GPU_FMA, IB_FAULT_GPU_SPLIT_K};
    for (int ns = 1; ns <= 3; ns++)
        for (int f = 0; f < 2; f++) {
            char what[112];
            snprintf(what, sizeof what, "decode, %d row(s) a step, %s, FAULT %s (must differ)", ns, kernel,
                     ib_fault_name(tf[f]));
            ib_fault_set(tf[f]);
            CHECK(engine_decode_compare(m, IB_ACT_Q8, IB_KV_F32, ns, 1, what) > 0,
                  "model %s: the decode comparison with %s (%d rows) missed the %s fault", model, kernel, ns,
                  ib_fault_name(tf[f]));
            ib_fault_set(IB_FAULT_NONE);
        }
}

int main(int argc, char **argv) {
    const char *why;
    char desc[256];
    (void)rndf;
    if (!CU->available(&why)) {
        printf("SKIP test_backend_cuda: %s\n", why);
        TEST_MAIN_END("test_backend_cuda");
    }
    ib_cuda_describe(desc, sizeof desc);
    printf("device: %s\n", desc);
    if (argc > 1 && !strcmp(argv[1], "--profile")) {   /* --profile [b1|b128|decode|prefill|all [MODEL_DIR]] */
        setenv("IB_CUDA_GRAPHS", "0", 1);
        bench(argc > 3 ? argv[3] : NULL, IB_ACT_Q8, 1, argc > 2 ? argv[2] : "all");
        TEST_MAIN_END("test_backend_cuda --profile");
    }
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        bench(argc > 2 ? argv[2] : NULL, IB_ACT_Q8, 0, "all");
        TEST_MAIN_END("test_backend_cuda --bench");
    }
    if (argc > 1 && !strcmp(argv[1], "--long-k")) { /* the long-K product checks alone */
        long_k_checks();
        TEST_MAIN_END("test_backend_cuda --long-k");
    }
    if (argc > 1 && !strcmp(argv[1], "--gemma")) { /* the Gemma 4 checks alone */
        gemma_checks();
        TEST_MAIN_END("test_backend_cuda --gemma");
    }
    {
        /* a cache whose (layer, k|v, head) plane passes 2^32 elements is refused before any allocation
         * (the attention kernels index a plane in 32 bits) */
        ib_error err;
        ib_kv *kv = NULL;
        const ib_kv_desc big = {.dtype = IB_KV_F16, .n_layers = 1, .n_kv_heads = 1, .head_dim = 128, .capacity = 1 << 25};
        const ib_status st = CU->kv_create(&big, &kv, &err);
        CHECK(st != IB_OK && kv == NULL && strstr(err.msg, "2^32"), "kv_create of a 2^32-element plane: refused (%s)",
              st != IB_OK ? err.msg : "accepted");
    }
    static const struct { int bits, group; const char *name; } models[] = {
        {4, 64, "q4 g64"}, {8, 32, "q8 g32"}, {32, 0, "f32"}};
    for (int mi = 0; mi < 3; mi++) {
        char dir[] = "/tmp/ib_cuda_XXXXXX";
        if (!mkdtemp(dir)) return 1;
        ib_error err;
        ib_model *m;
        ib_mkmodel_opts mo = {.preset = "tiny", .seed = 7 + mi, .bits = models[mi].bits, .group = models[mi].group, .tied = 1};
        if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
            CHECK(0, "model %s: %s", models[mi].name, err.msg);
            continue;
        }
        const int V = m->cfg.vocab_size;
        printf("model tiny %s:\n", models[mi].name);
        for (int act = 0; act < 2; act++)
            for (int kvd = 0; kvd < 3; kvd++)
                for (int win = 0; win < 2; win++) {
                    char name[96];
                    snprintf(name, sizeof name, "act %s, kv %s, %s", act ? "q8" : "f32", kv_name(kvd),
                             win ? "sink 4 + window 40 (ring)" : "full");
                    float *lgb = xmalloc((size_t)NSTEPS * V * 4), *lgs = xmalloc((size_t)NSTEPS * V * 4);
                    int bad = schedule(m, act ? IB_ACT_Q8 : IB_ACT_F32, kv_of(kvd), win ? 40 : 0, name,
                                       lgb, 0, NSTEPS);
                    CHECK(bad == 0, "model %s, %s: CUDA differs from the scalar reference", models[mi].name, name);
                    /* item 0 alone, the same chunks: the same logits at every step */
                    /* the lone runs take the tensor-core products and the per-KV-head attention from 1 row
                     * (the batched ones, with fewer than 16 rows: dp4a and per-query-head attention) */
                    /* (and decode's q/k preparation inside that attention, IB_CUDA_FUSE_QK=force: by shape it
                     * is only where the grid has more than two blocks a multiprocessor) */
                    snprintf(name + strlen(name), sizeof name - strlen(name), ", alone, mma");
                    setenv("IB_CUDA_MMA_ROWS", "1", 1);
                    setenv("IB_CUDA_ATT_GROUP_ROWS", "1", 1);
                    setenv("IB_CUDA_FUSE_QK", "force", 1);
                    bad = schedule(m, act ? IB_ACT_Q8 : IB_ACT_F32, kv_of(kvd), win ? 40 : 0, name,
                                   lgs, 1, NSTEPS);
                    unsetenv("IB_CUDA_MMA_ROWS");
                    unsetenv("IB_CUDA_ATT_GROUP_ROWS");
                    unsetenv("IB_CUDA_FUSE_QK");
                    CHECK(bad == 0, "model %s, %s: CUDA differs from the scalar reference", models[mi].name, name);
                    CHECK(memcmp(lgb, lgs, (size_t)NSTEPS * V * 4) == 0,
                          "model %s, %s: session 0's logits batched differ from alone", models[mi].name, name);
                    free(lgb), free(lgs);
                }
        /* steps of 34..120 rows (tensor-core products over several row blocks), with blocks of 32 and of
         * 64 rows */
        if (models[mi].bits != 32)
            for (int bm = 32; bm <= 64; bm += 32) {
                char name[96];
                snprintf(name, sizeof name, "wide steps (34-120 rows), act q8, kv f16, %d-row product blocks", bm);
                setenv("IB_CUDA_MMA_BM", bm == 32 ? "32" : "64", 1);
                CHECK(wide_schedule(m, IB_ACT_Q8, IB_KV_F16, name) == 0,
                      "model %s, %s: CUDA differs from the scalar reference", models[mi].name, name);
                unsetenv("IB_CUDA_MMA_BM");
            }
        /* per-head attention spread over a cluster of blocks (default: 4 a head where the grid allows and
         * a row attends 256 keys or more; here from the first key, IB_CUDA_ATT_SPLIT_KEYS=1, in steps of up
         * to 4 rows) or not: one block a head (its keys straight into registers, the default where they
         * fit one chunk and their values the stage — with a 6 KiB stage, only the first steps; through its
         * stage, IB_CUDA_ATT_DIRECT=0; or, with a stage too small for a key block, from the cache), 2 blocks a head, chunks of one key block (a 6 KiB stage: the scores
         * exchanged chunk after chunk), and a stage too small for a key block (the cluster's first block
         * alone reads the cache) */
        if (mi == 0) {
            static const struct { const char *split, *stage, *direct, *what; } av[] = {
                {"1", NULL, NULL, "1 block a head (keys into registers)"},
                {"1", NULL, "0", "1 block a head, staged"},
                {"1", "6", NULL, "1 block a head, 6 KiB stage (keys into registers while the values fit it)"},
                {"1", "2", "0", "1 block a head, 2 KiB stage, unstaged"},
                {"2", NULL, NULL, "2 blocks a head"},
                {NULL, "6", NULL, "6 KiB stage, split"},
                {NULL, "2", NULL, "2 KiB stage, unstaged"}};
            for (int a = 0; a < (int)(sizeof av / sizeof av[0]); a++)
                for (int kvd = 0; kvd < 3; kvd++)
                    for (int win = 0; win < 2; win++) {
                        char name[96];
                        snprintf(name, sizeof name, "attention %s, kv %s, %s", av[a].what, kv_name(kvd),
                                 win ? "window 40" : "full");
                        setenv("IB_CUDA_ATT_SPLIT_KEYS", "1", 1);
                        if (av[a].split) setenv("IB_CUDA_ATT_SPLIT", av[a].split, 1);
                        if (av[a].stage) setenv("IB_CUDA_ATT_STAGE", av[a].stage, 1);
                        if (av[a].direct) setenv("IB_CUDA_ATT_DIRECT", av[a].direct, 1);
                        const int bad = schedule(m, IB_ACT_Q8, kv_of(kvd), win ? 40 : 0, name, NULL, 0,
                                                 NSTEPS);
                        unsetenv("IB_CUDA_ATT_SPLIT");
                        unsetenv("IB_CUDA_ATT_SPLIT_KEYS");
                        unsetenv("IB_CUDA_ATT_STAGE");
                        unsetenv("IB_CUDA_ATT_DIRECT");
                        CHECK(bad == 0, "model %s, %s: CUDA differs from the scalar reference", models[mi].name, name);
                    }
        }
        /* decode steps' q/k norm, RoPE and KV store as a kernel of their own (IB_CUDA_FUSE_QK=0) instead
         * of inside their attention (the default): both against the scalar reference */
        if (mi == 0)
            for (int kvd = 0; kvd < 3; kvd++)
                for (int win = 0; win < 2; win++) {
                    char name[96];
                    snprintf(name, sizeof name, "q/k preparation unfused, kv %s, %s", kv_name(kvd),
                             win ? "window 40" : "full");
                    setenv("IB_CUDA_FUSE_QK", "0", 1);
                    const int bad = schedule(m, IB_ACT_Q8, kv_of(kvd), win ? 40 : 0, name, NULL, 0, NSTEPS);
                    unsetenv("IB_CUDA_FUSE_QK");
                    CHECK(bad == 0, "model %s, %s: CUDA differs from the scalar reference", models[mi].name, name);
                }
        /* attention in tiles of a session's consecutive rows (attention_tile_kernel) wherever that kernel
         * can run (IB_CUDA_ATT_TILE=force: every step of full sessions, decode rows a tile each), against the
         * scalar reference; and the wide schedule's prompts (tiles of up to 16 rows) */
        for (int act = 0; act < 2; act++)
            for (int kvd = 0; kvd < 3; kvd++) {
                char name[96];
                snprintf(name, sizeof name, "attention in tiles, act %s, kv %s", act ? "q8" : "f32", kv_name(kvd));
                setenv("IB_CUDA_ATT_TILE", "force", 1);
                int bad = schedule(m, act ? IB_ACT_Q8 : IB_ACT_F32, kv_of(kvd), 0, name, NULL, 0, NSTEPS);
                CHECK(bad == 0, "model %s, %s: CUDA differs from the scalar reference", models[mi].name, name);
                if (models[mi].bits != 32 || !act) {
                    snprintf(name + strlen(name), sizeof name - strlen(name), ", wide steps");
                    bad = wide_schedule(m, act ? IB_ACT_Q8 : IB_ACT_F32, kv_of(kvd), name);
                    CHECK(bad == 0, "model %s, %s: CUDA differs from the scalar reference", models[mi].name, name);
                }
                unsetenv("IB_CUDA_ATT_TILE");
            }
        /* tiles of 3 rows (IB_CUDA_ATT_TILE_ROWS): tiles that start and end inside a prompt's chunk */
        {
            setenv("IB_CUDA_ATT_TILE", "force", 1);
            setenv("IB_CUDA_ATT_TILE_ROWS", "3", 1);
            const int bad = schedule(m, IB_ACT_Q8, IB_KV_F16, 0, "attention in tiles of 3 rows", NULL, 0, NSTEPS);
            unsetenv("IB_CUDA_ATT_TILE_ROWS");
            unsetenv("IB_CUDA_ATT_TILE");
            CHECK(bad == 0, "model %s, attention in tiles of 3 rows: CUDA differs from the scalar reference",
                  models[mi].name);
        }
        /* whole steps, CPU engine vs CUDA engine */
        const int q8ok = models[mi].bits != 32;   /* an engine refuses q8 activations on float weights */
        for (int act = 0; act < 1 + q8ok; act++)
            for (int kvd = 0; kvd < 3; kvd++)
                for (int win = 0; win < 2; win++) {
                    char name[96];
                    snprintf(name, sizeof name, "engine: act %s, kv %s, %s", act ? "q8" : "f32", kv_name(kvd),
                             win ? "sink 4 + window 40" : "full");
                    int d = engine_compare(m, act ? IB_ACT_Q8 : IB_ACT_F32, kv_of(kvd), win ? 40 : 0,
                                           name);
                    CHECK(d == 0, "model %s, %s: CUDA engine's logits differ from the CPU engine's", models[mi].name,
                          name);
                }
        /* every row's logits of a prompt (prompt logprobs, scoring) */
        for (int act = 0; act < 1 + q8ok; act++) {
            char name[96];
            snprintf(name, sizeof name, "prompt rows: act %s, kv f16", act ? "q8" : "f32");
            CHECK(engine_prompt_rows_compare(m, act ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F16, name) == 0,
                  "model %s, %s: a prompt's logits rows differ between the engines or from one token a step",
                  models[mi].name, name);
        }
        /* decode steps of 1-4 rows */
        for (int act = 0; act < 1 + q8ok; act++)
            for (int kvd = 0; kvd < 3; kvd++) {
                char what[64];
                snprintf(what, sizeof what, "act %s, kv %s", act ? "q8" : "f32", kv_name(kvd));
                CHECK(decode_compares(m, act ? IB_ACT_Q8 : IB_ACT_F32, kv_of(kvd), what) == 0,
                      "model %s, decode steps (%s): CUDA engine's logits differ from the CPU engine's",
                      models[mi].name, what);
            }
        /* the kernels of few-row steps: one-row products reading their weights in rounds, staging the
         * row's codes in shared memory wherever they can (IB_CUDA_MM_STAGE=force; by shape where the
         * weights come from DRAM and no weight tile fits its bound), and the weight tiles of steps of at
         * most 4 rows (the default) — with the faults in their epilogue and across their blocks caught */
        if (q8ok) {
            /* few-row products on the kernel that reads its weights in rounds (neither tiles nor staged
             * codes), its faults caught, then staging the row's codes wherever they can */
            setenv("IB_CUDA_MM_TILE", "0", 1);
            setenv("IB_CUDA_MM_STAGE", "0", 1);
            CHECK(decode_compares(m, IB_ACT_Q8, IB_KV_F16, "act q8, kv f16, one-row products in rounds") == 0,
                  "model %s, decode steps with one-row products in rounds: CUDA engine's logits differ from the "
                  "CPU engine's", models[mi].name);
            few_row_faults_caught(m, models[mi].name, "products in rounds");
            setenv("IB_CUDA_MM_STAGE", "force", 1);
            CHECK(decode_compares(m, IB_ACT_Q8, IB_KV_F16, "act q8, kv f16, staged codes") == 0,
                  "model %s, decode steps with staged codes: CUDA engine's logits differ from the CPU engine's",
                  models[mi].name);
            /* one session from a one-token prompt: every step a single row, so every Q8 product is a staged
             * one (steps of more rows take the other kernels, which would differ on their own) */
            ib_fault_set(IB_FAULT_GPU_FMA);
            CHECK(engine_decode_compare(m, IB_ACT_Q8, IB_KV_F32, 1, 1, "decode, 1 row a step, staged codes, FAULT gpu-fma (must differ)") > 0,
                  "model %s: the decode comparison with staged codes missed the gpu-fma fault", models[mi].name);
            ib_fault_set(IB_FAULT_GPU_SPLIT_K);
            CHECK(engine_decode_compare(m, IB_ACT_Q8, IB_KV_F32, 1, 1, "decode, 1 row a step, staged codes, FAULT gpu-split-k (must differ)") > 0,
                  "model %s: the decode comparison with staged codes missed the gpu-split-k fault", models[mi].name);
            ib_fault_set(IB_FAULT_NONE);
            unsetenv("IB_CUDA_MM_STAGE");
            unsetenv("IB_CUDA_MM_TILE");
            /* one-row products whose blocks copy their whole weight tiles into shared memory before the
             * wait, in steps of at most 4 rows (IB_CUDA_MM_TILE=force: wherever a block fits; by shape
             * within a smaller bound), faults too */
            setenv("IB_CUDA_MM_TILE", "force", 1);
            CHECK(decode_compares(m, IB_ACT_Q8, IB_KV_F16, "act q8, kv f16, weight tiles in shared memory") == 0,
                  "model %s, decode steps with weight tiles in shared memory: CUDA engine's logits differ from the "
                  "CPU engine's", models[mi].name);
            few_row_faults_caught(m, models[mi].name, "weight tiles");
            unsetenv("IB_CUDA_MM_TILE");
        }
        /* and the comparison can fail: gpu-fma on the CUDA side only */
        ib_fault_set(IB_FAULT_GPU_FMA);
        CHECK(engine_compare(m, q8ok ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F32, 0, "engine, FAULT gpu-fma (must differ)") > 0,
              "model %s: the engine comparison missed the gpu-fma fault", models[mi].name);
        CHECK(decode_compares(m, q8ok ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F32, "FAULT gpu-fma (must differ)") > 0,
              "model %s: the decode comparison missed the gpu-fma fault", models[mi].name);
        CHECK(engine_prompt_rows_compare(m, q8ok ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F16, "prompt rows, FAULT gpu-fma (must differ)") > 0,
              "model %s: the prompt rows comparison missed the gpu-fma fault", models[mi].name);
        /* row-order on both engines (odd rows of a step norm in another order): the prompt's rows are no
         * longer what one token a step gives */
        ib_fault_set(IB_FAULT_ROW_ORDER);
        CHECK(engine_prompt_rows_compare(m, q8ok ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F16, "prompt rows, FAULT row-order (must differ)") > 0,
              "model %s: the prompt rows comparison missed the row-order fault", models[mi].name);
        ib_fault_set(IB_FAULT_NONE);
        /* the check can fail: an FMA in the products' epilogue (Q8 and F32 paths) */
        ib_fault_set(IB_FAULT_GPU_FMA);
        for (int act = 0; act < 3; act++) {
            if (act == 2) setenv("IB_CUDA_MMA_ROWS", "1", 1), setenv("IB_CUDA_MMA_BM", "64", 1);
            int bad = schedule(m, act ? IB_ACT_Q8 : IB_ACT_F32, IB_KV_F32, 0,
                               act == 2   ? "FAULT gpu-fma, act q8, mma 64-row blocks (must mismatch)"
                               : act == 1 ? "FAULT gpu-fma, act q8 (must mismatch)"
                                          : "FAULT gpu-fma, act f32 (must mismatch)",
                               NULL, 0, NSTEPS);
            unsetenv("IB_CUDA_MMA_ROWS"), unsetenv("IB_CUDA_MMA_BM");
            CHECK(bad > 0, "model %s: the gpu-fma fault went unnoticed (act %d)", models[mi].name, act);
        }
        ib_fault_set(IB_FAULT_NONE);
        /* and a product that splits K over blocks, added in any order (Q8 products; dp4a and mma paths) */
        if (q8ok) {
            ib_fault_set(IB_FAULT_GPU_SPLIT_K);
            CHECK(engine_compare(m, IB_ACT_Q8, IB_KV_F32, 0, "engine, FAULT gpu-split-k (must differ)") > 0,
                  "model %s: the engine comparison missed the gpu-split-k fault", models[mi].name);
            CHECK(wide_schedule(m, IB_ACT_Q8, IB_KV_F32, "FAULT gpu-split-k, wide steps (must mismatch)") > 0,
                  "model %s: the gpu-split-k fault went unnoticed in wide steps", models[mi].name);
            for (int mma = 0; mma < 2; mma++) {
                if (mma) setenv("IB_CUDA_MMA_ROWS", "1", 1);
                int bad = schedule(m, IB_ACT_Q8, IB_KV_F32, 0,
                                   mma ? "FAULT gpu-split-k, act q8, mma (must mismatch)"
                                       : "FAULT gpu-split-k, act q8 (must mismatch)",
                                   NULL, 0, NSTEPS);
                unsetenv("IB_CUDA_MMA_ROWS");
                CHECK(bad > 0, "model %s: the gpu-split-k fault went unnoticed (mma %d)", models[mi].name, mma);
            }
            ib_fault_set(IB_FAULT_NONE);
        }
        /* and an attention that cuts its key blocks at a size of its own (half the canonical one: another
         * sequence of online-softmax rescales): caught on every attention path — keys into registers (the
         * default for decode steps), through the stage, a block per KV head, tiles of a prompt's rows */
        if (mi == 0) {
            static const struct { const char *var, *val, *what; } fv[] = {
                {NULL, NULL, "keys into registers"},
                {"IB_CUDA_ATT_DIRECT", "0", "staged"},
                {"IB_CUDA_ATT_GROUP_ROWS", "1", "a block per KV head"},
                {"IB_CUDA_ATT_TILE", "force", "tiles"},
                {"IB_CUDA_ATT_WIDE", "force", "keys into registers, wide blocks"}};
            const ib_act fa = q8ok ? IB_ACT_Q8 : IB_ACT_F32;
            /* the direct attention in wide blocks (every decode step's) against the scalar references first:
             * half and float caches, full and windowed sessions */
            setenv("IB_CUDA_ATT_WIDE", "force", 1);
            for (int kvd = 0; kvd < 3; kvd++)
                for (int win = 0; win < 2; win++) {
                    char name[96];
                    snprintf(name, sizeof name, "attention in wide blocks, kv %s, %s", kv_name(kvd),
                             win ? "sink 4 + window 40" : "full");
                    CHECK(schedule(m, fa, kv_of(kvd), win ? 40 : 0, name, NULL, 0, NSTEPS) == 0,
                          "model %s: %s differs", models[mi].name, name);
                }
            unsetenv("IB_CUDA_ATT_WIDE");
            ib_fault_set(IB_FAULT_GPU_ATT_BLOCK);
            for (int a = 0; a < (int)(sizeof fv / sizeof fv[0]); a++) {
                char name[96];
                snprintf(name, sizeof name, "FAULT gpu-att-block, %s (must mismatch)", fv[a].what);
                if (fv[a].var) setenv(fv[a].var, fv[a].val, 1);
                const int bad = schedule(m, fa, IB_KV_F16, 0, name, NULL, 0, NSTEPS);
                if (fv[a].var) unsetenv(fv[a].var);
                CHECK(bad > 0, "model %s: the gpu-att-block fault went unnoticed (%s)", models[mi].name, fv[a].what);
            }
            CHECK(engine_compare(m, fa, IB_KV_F16, 0, "engine, FAULT gpu-att-block (must differ)") > 0,
                  "model %s: the engine comparison missed the gpu-att-block fault", models[mi].name);
            ib_fault_set(IB_FAULT_NONE);
            /* the q8 store under the test-only kvq8-step-scale fault (a step of several rows encodes its keys
             * and values with codes up to 126, here as on the CPU): the op check against the definition's
             * encoder must fail, and the two engines, both under it, must still agree */
            ib_fault_set(IB_FAULT_KVQ8_STEP_SCALE);
            CHECK(schedule(m, fa, IB_KV_Q8, 0, "FAULT kvq8-step-scale (must mismatch)", NULL, 0, NSTEPS) > 0,
                  "model %s: the kvq8-step-scale fault went unnoticed by the op check", models[mi].name);
            CHECK(engine_compare(m, fa, IB_KV_Q8, 0, "engine, kvq8-step-scale on both engines") == 0,
                  "model %s: under kvq8-step-scale the CUDA engine's logits differ from the CPU engine's", models[mi].name);
            ib_fault_set(IB_FAULT_NONE);
        }
        ib_model_free(m);
    }
    llama_checks();
    gemma_checks();
    long_k_checks();
    TEST_MAIN_END("test_backend_cuda");
}
#endif
