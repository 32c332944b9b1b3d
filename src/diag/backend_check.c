/*
 * backend_check.c — every operation of a backend's table checked against the scalar references of
 * src/ops/, bitwise (`isobatch probe --backend B`, tests/test_backend_ops.c).
 *
 * The check drives a backend instance through whole steps of a model exactly as src/runtime/step.c
 * does, over several sessions at different positions bringing different numbers of tokens, with
 * float and half KV caches, full and sink+window policies. Before each operation it reads the
 * operation's inputs back from the backend; after it, the outputs; and it compares them with what
 * the scalar reference computes from those same inputs on the host (faults switched off). So each
 * operation is judged on its own, errors never compound, and a wrong KV store shows up in the
 * attention that reads it (the host keeps a mirror of every cache, written by the reference store).
 * Gemma 4 (dense): its layer sequence (post-norms, GeGLU, layer scalar, soft-capped logits), each
 * layer at its type's widths, RoPE table and window, sliding layers' caches as rings; and the MoE
 * block (its norms, the routed experts against ref_moe — each row routed and its experts run alone —
 * and the sum). KV sharing: a shared layer's q-only product, q norm and RoPE, and its attention over its
 * source layer's mirror (which that layer's store wrote earlier in the step); its MLP at its own F
 * (2F when double-wide). Per-layer embeddings: `ple_inputs` against ref_ple_inputs (read back through
 * read_ple_inputs where the backend has it; otherwise it is judged through ple_layer) and each layer's
 * `ple_layer` against ref_ple_layer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "diag/diag.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "runtime/kv_policy.h"
#include "runtime/runtime.h"

#define N_ITEMS 4
#define N_STEPS 6
#define KV_CHUNK 16
#define WIN_SINK 2
#define WIN_WINDOW 9

/* Tokens each item brings at each step (<= KV_CHUNK, so windowed sessions take them too); item 0
 * reaches position 51, past one attention block of 32 keys. */
static const int step_tokens[N_STEPS][N_ITEMS] = {
    {16, 1, 3, 16}, {1, 16, 2, 1}, {16, 16, 16, 16}, {1, 1, 16, 1}, {16, 16, 16, 16}, {1, 1, 1, 1},
};

typedef struct check {
    const ib_model *m;
    const ib_backend_ops *ops;
    ib_backend *be;
    ib_act act;
    ib_opcheck_fn fn;
    void *ctx;
    long mismatches;
    const char *config;
    /* host copies, [R_max][width] */
    float *in, *in2, *ref, *got, *v;
    ib_act_buf qa;
    float *cs;                       /* [R][hd/2][2] RoPE table (Gemma 4: of the sliding layers) */
    float *cs_full;                  /* Gemma 4: [R][global_hd/2][2] of the full layers */
    int hd, kvh;                     /* the current layer's head size and KV heads */
    int ffn;                         /* the current layer's MLP width (ib_config_layer_ffn) */
    /* Gemma 4 per-layer embeddings (ple_dim P > 0; else NULL) */
    float *pli;                      /* [R][L*P] the step's per-layer inputs as the backend holds them */
    float *pli_ref;                  /* [R][L*P] their reference */
    float *ple_row;                  /* [L*P] one row of embed_tokens_per_layer */
    /* the step */
    int R, n_items;
    int32_t tok[N_ITEMS * KV_CHUNK], pos[N_ITEMS * KV_CHUNK], row_item[N_ITEMS * KV_CHUNK];
    /* mirrors of the caches, laid out as the caches (ib_kv_desc: each layer at its kind's shape), float
     * (half values converted) */
    float *mirror[N_ITEMS];
    ib_kv_desc desc;
} check;

/* Floats per row of buffer b at the current layer (k->hd, k->kvh). */
static size_t width_of(const check *k, ib_buf b) {
    const ib_config *c = &k->m->cfg;
    size_t hd = k->hd;
    switch (b) {
    case IB_BUF_Q:
    case IB_BUF_ATT: return (size_t)c->n_heads * hd;
    case IB_BUF_K:
    case IB_BUF_V: return (size_t)k->kvh * hd;
    case IB_BUF_G:
    case IB_BUF_U: return (size_t)k->ffn;
    default: return (size_t)c->hidden_size;
    }
}

/* Run a reference computation with the test-only faults off (the backend keeps the caller's fault). */
#define REF(...)                             \
    do {                                     \
        ib_fault held_ = ib_fault_get();     \
        ib_fault_set(IB_FAULT_NONE);         \
        __VA_ARGS__;                         \
        ib_fault_set(held_);                 \
    } while (0)

/* Copy rows [0, R) of a backend buffer into dst. */
static void fetch(check *k, ib_buf b, int R, float *dst) {
    size_t w = width_of(k, b);
    memcpy(dst, k->ops->read_rows(k->be, b, R, (int)w), (size_t)R * w * sizeof(float));
}

/* Compare n floats bitwise and report one line for op. */
static void report(check *k, const char *op, const float *want, const float *have, long n) {
    long bad = 0;
    for (long i = 0; i < n; i++) bad += memcmp(&want[i], &have[i], sizeof(float)) != 0;
    ib_opcheck r = {.op = op, .config = k->config, .elems = n, .mismatches = bad};
    k->mismatches += bad;
    if (k->fn) k->fn(k->ctx, &r);
}

/* Compare rows [0, R) of buffer b with k->ref. */
static void compare_buf(check *k, const char *op, ib_buf b, int R) {
    fetch(k, b, R, k->got);
    report(k, op, k->ref, k->got, (long)R * (long)width_of(k, b));
}

static const ib_matrix *matrix_of(const ib_layer *L, ib_wsel w) {
    const ib_matrix *t[IB_W_COUNT] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return t[w];
}

/* The reference product Y [R][N] = X [R][K] · W^T under the check's activation mode, scalar kernel. */
static void ref_linear(check *k, const ib_matrix *w, const float *X, int R, float *Y) {
    ib_act act = k->act == IB_ACT_Q8 && w->fmt != IB_WF32 ? IB_ACT_Q8 : IB_ACT_F32;
    if (act == IB_ACT_Q8) ib_quantize_act(X, R, w->cols, w->group, k->qa.xq, k->qa.d, k->qa.ad);
    ib_matmul(w, X, R, &k->qa, act, IB_ISA_SCALAR, NULL, Y, w->rows);
}

/* Run linear over matrices ws of layer li reading buffer `in` into outs, checking each output. */
static void check_linear(check *k, int li, int n, const ib_wsel *ws, ib_buf in, const ib_buf *outs, const char *op) {
    fetch(k, in, k->R, k->in);
    k->ops->linear(k->be, li, n, ws, in, outs);
    for (int i = 0; i < n; i++) {
        REF(ref_linear(k, matrix_of(&k->m->layers[li], ws[i]), k->in, k->R, k->ref));
        compare_buf(k, op, outs[i], k->R);
    }
}

/* The reference of Gemma 4's routed experts (backend.h `moe`) for every row of the step, each row
 * alone: the router input rmsnorm(route_in, router.scale) times (float)(1/sqrt(D)), its logits by
 * ref_linear, ib_moe_route (NaN logits: no expert), each selected expert's GeGLU MLP on in (ref_linear,
 * ib_geglu, ref_linear), ib_moe_combine in rank order into out. route_in, in, out [R][D]. 0, or -1 when
 * out of memory. */
static int ref_moe(check *k, int li, const float *route_in, const float *in, float *out) {
    const ib_config *c = &k->m->cfg;
    const ib_layer *L = &k->m->layers[li];
    const int D = c->hidden_size, E = c->n_experts, K = c->top_k, Fm = c->moe_ffn;
    float *rin = malloc((size_t)D * sizeof(float)), *lg = malloc((size_t)E * sizeof(float));
    float *p = malloc((size_t)E * sizeof(float)), *g = malloc((size_t)Fm * sizeof(float));
    float *u = malloc((size_t)Fm * sizeof(float)), *y = malloc((size_t)K * D * sizeof(float));
    float *w = malloc((size_t)K * sizeof(float));
    int32_t *sel = malloc((size_t)K * sizeof(int32_t));
    int rc = rin && lg && p && g && u && y && w && sel ? 0 : -1;
    for (int r = 0; rc == 0 && r < k->R; r++) {
        ib_rmsnorm(route_in + (size_t)r * D, L->router_scale, 1, D, (float)c->rms_eps, rin, NULL);
        ib_scale(rin, (size_t)D, (float)(1.0 / sqrt((double)D)));
        ref_linear(k, &L->w_router, rin, 1, lg);
        if (ib_moe_route(lg, E, K, L->expert_scale, p, sel, w))
            for (int j = 0; j < K; j++) sel[j] = -1;
        for (int j = 0; j < K; j++) {
            if (sel[j] < 0) continue;
            const float *x = in + (size_t)r * D;
            ref_linear(k, &L->e_gate[sel[j]], x, 1, g);
            ref_linear(k, &L->e_up[sel[j]], x, 1, u);
            ib_geglu(g, u, 1, Fm);
            ref_linear(k, &L->e_down[sel[j]], g, 1, y + (size_t)j * D);
        }
        ib_moe_combine(y, w, sel, K, D, out + (size_t)r * D);
    }
    free(rin), free(lg), free(p), free(g), free(u), free(y), free(w), free(sel);
    return rc;
}

/* The reference of ple_inputs (backend.h) for the step's rows from X [R][D] (the embedded rows) into
 * out [R][L*P]: X · per_layer_model_projection^T (ref_linear) times (float)(1/sqrt(D)), each P-slice
 * rmsnorm'ed with per_layer_projection_norm, plus the token's embed_tokens_per_layer row times
 * ple_embed_scale, all times (float)(1/sqrt(2)). */
static void ref_ple_inputs(check *k, const float *X, float *out) {
    const ib_model *m = k->m;
    const ib_config *c = &m->cfg;
    const int R = k->R, D = c->hidden_size, P = c->ple_dim, L = c->n_layers;
    const size_t LP = (size_t)L * P;
    ref_linear(k, &m->ple_model_proj, X, R, out);
    ib_scale(out, (size_t)R * LP, (float)(1.0 / sqrt((double)D)));
    ib_rmsnorm(out, m->ple_proj_norm, R * L, P, (float)c->rms_eps, out, NULL);
    for (int r = 0; r < R; r++) {
        ib_matrix_row_f32(&m->ple_embed, k->tok[r], k->ple_row);
        ib_scale(k->ple_row, LP, m->ple_embed_scale);
        ib_add(out + (size_t)r * LP, k->ple_row, LP);
    }
    ib_scale(out, (size_t)R * LP, (float)(1.0 / sqrt(2.0)));
}

/* The reference of layer li's ple_layer (backend.h) from X [R][D] and the per-layer inputs pli
 * [R][L*P] into out [R][D]: G = X · per_layer_input_gate^T [R][P], ib_geglu(G, the layer's P-slice of
 * pli) row by row, Y = G · per_layer_projection^T [R][D] rmsnorm'ed with post_per_layer_input_norm,
 * out = X + Y. Scratch: g [R][P], y [R][D]. */
static void ref_ple_layer(check *k, int li, const float *X, const float *pli, float *g, float *y, float *out) {
    const ib_config *c = &k->m->cfg;
    const ib_layer *L = &k->m->layers[li];
    const int R = k->R, D = c->hidden_size, P = c->ple_dim;
    const size_t LP = (size_t)c->n_layers * P;
    ref_linear(k, &L->ple_gate, X, R, g);
    for (int r = 0; r < R; r++) ib_geglu(g + (size_t)r * P, pli + (size_t)r * LP + (size_t)li * P, 1, P);
    ref_linear(k, &L->ple_proj, g, R, y);
    ib_rmsnorm(y, L->ple_norm, R, D, (float)c->rms_eps, y, NULL);
    memcpy(out, X, (size_t)R * D * sizeof(float));
    ib_add(out, y, (size_t)R * D);
}

/* Element offset of (layer, k|v, head, slot 0) in an item's mirror (the cache's layout); a KV-shared
 * layer's is its source layer's. */
static size_t mirror_off(const check *k, int li, int kv, int h) {
    size_t off = 0;
    li = ib_kv_desc_owner(&k->desc, li);
    for (int l = 0; l < li; l++) off += ib_kv_desc_layer_elems(&k->desc, l);
    ib_kv_desc v = ib_kv_desc_layer(&k->desc, li);
    return off + ((size_t)kv * v.n_kv_heads + h) * (size_t)v.capacity * v.head_dim;
}

/* The reference of qk_prepare's ROPE_STORE phase: rotate Q and K (host copies in k->in / k->in2),
 * store each row's K and V into its item's mirror (half caches: rounded as the store rounds). */
static void ref_rope_store(check *k, int li, float *q, float *kk, const float *v) {
    const ib_config *c = &k->m->cfg;
    int H = c->n_heads, KVH = k->kvh, hd = k->hd;
    const float *cs = c->arch == IB_ARCH_GEMMA4 && !k->m->layers[li].sliding ? k->cs_full : k->cs;
    ib_rope(q, k->R, H, hd, cs);
    ib_rope(kk, k->R, KVH, hd, cs);
    const ib_kv_desc lv = ib_kv_desc_layer(&k->desc, li);
    for (int r = 0; r < k->R; r++) {
        float *mir = k->mirror[k->row_item[r]];
        size_t slot = (size_t)ib_kv_desc_slot(&lv, k->pos[r]);
        for (int h = 0; h < KVH; h++)
            for (int d = 0; d < hd; d++) {
                float kv2[2] = {kk[((size_t)r * KVH + h) * hd + d], v[((size_t)r * KVH + h) * hd + d]};
                for (int t = 0; t < 2; t++) {
                    float x = kv2[t];
                    if (k->desc.dtype == IB_KV_F16) x = ib_f16_to_f32(ib_f32_to_f16(x));
                    mir[mirror_off(k, li, t, h) + slot * hd + d] = x;
                }
            }
    }
}

/* The reference attention of every row of the step at layer li, from the mirrors, into out. */
static void ref_attention(check *k, int li, const float *q, float *out) {
    const ib_config *c = &k->m->cfg;
    int H = c->n_heads, KVH = k->kvh, hd = k->hd, G = H / KVH;
    float scale = c->arch == IB_ARCH_GEMMA4 ? 1.0f : 1.0f / sqrtf((float)hd);
    ib_kv_desc fd = ib_kv_desc_layer(&k->desc, li);
    fd.dtype = IB_KV_F32;   /* the mirror holds the exact float values of half caches */
    for (int r = 0; r < k->R; r++)
        for (int h = 0; h < H; h++) {
            const float *mir = k->mirror[k->row_item[r]];
            const float *kp = mir + mirror_off(k, li, 0, h / G), *vp = mir + mirror_off(k, li, 1, h / G);
            const float *qh = q + ((size_t)r * H + h) * hd;
            float *oh = out + ((size_t)r * H + h) * hd;
            if (fd.window > 0) ib_attend_policy(&fd, qh, kp, vp, k->pos[r], hd, scale, IB_ATTN_BLOCK, oh);
            else ib_attend_one(qh, kp, vp, k->pos[r] + 1, hd, hd, scale, IB_ATTN_BLOCK, oh);
        }
}

/* The residual add X += O, checked. */
static void check_add(check *k) {
    size_t n = (size_t)k->R * k->m->cfg.hidden_size;
    fetch(k, IB_BUF_X, k->R, k->in);
    fetch(k, IB_BUF_O, k->R, k->in2);
    k->ops->add(k->be, IB_BUF_X, IB_BUF_O);
    memcpy(k->ref, k->in, n * sizeof(float));
    REF(ib_add(k->ref, k->in2, n));
    compare_buf(k, "add", IB_BUF_X, k->R);
}

/* rmsnorm with norm n of layer li (weights w) from buffer in to out, checked. */
static void check_norm(check *k, ib_buf in, ib_nsel n, int li, const float *w, ib_buf out) {
    int D = k->m->cfg.hidden_size;
    fetch(k, in, k->R, k->in);
    k->ops->rmsnorm(k->be, in, n, li, out);
    REF(ib_rmsnorm(k->in, w, k->R, D, (float)k->m->cfg.rms_eps, k->ref, NULL));
    compare_buf(k, "rmsnorm", out, k->R);
}

/* One step through the backend, every op checked. logits_out: [N_ITEMS][V] host buffers. */
static ib_status check_step(check *k, int step, ib_kv *const *kvs, int *item_pos, float *const *logits_out,
                            ib_error *err) {
    const ib_model *m = k->m;
    const ib_config *c = &m->cfg;
    const ib_backend_ops *ops = k->ops;
    int D = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim;
    float eps = (float)c->rms_eps;
    int32_t logit_row[N_ITEMS];
    float *lo[N_ITEMS];
    int n_logits = 0;
    k->R = 0;
    for (int i = 0; i < N_ITEMS; i++) {
        for (int t = 0; t < step_tokens[step][i]; t++, k->R++) {
            k->tok[k->R] = (int32_t)((step * 131 + i * 31 + t * 7) % c->vocab_size);
            k->pos[k->R] = item_pos[i] + t;
            k->row_item[k->R] = i;
        }
        if ((step + i) % 3 != 1) {
            logit_row[n_logits] = k->R - 1;
            lo[n_logits++] = logits_out[i];
        }
    }
    int R = k->R;
    ib_step_desc d = {.R = R, .n_items = N_ITEMS, .tok = k->tok, .pos = k->pos, .rope_pos = k->pos,
                      .row_item = k->row_item, .kv = kvs, .attn_block = IB_ATTN_BLOCK, .n_logits = n_logits,
                      .logit_row = logit_row, .logits_out = lo};
    ib_status rc = ops->step_begin(k->be, &d, err);
    if (rc) return rc;
    const int gemma = c->arch == IB_ARCH_GEMMA4;
    REF(ib_rope_table(k->pos, R, hd, c->rope_theta, k->cs));
    if (gemma) REF(ib_rope_table_pairs(k->pos, R, c->global_head_dim, c->rope_theta_full, c->rope_pairs_full, k->cs_full));

    k->hd = hd;
    k->kvh = KVH;
    ops->embed(k->be);
    REF(for (int r = 0; r < R; r++) ib_matrix_row_f32(&m->embed, k->tok[r], k->ref + (size_t)r * D);
        if (m->embed_scale != 1.0f) ib_scale(k->ref, (size_t)R * D, m->embed_scale));
    compare_buf(k, "embed", IB_BUF_X, R);
    if (c->ple_dim > 0) { /* the per-layer inputs, from the embedded rows */
        const size_t n = (size_t)R * c->n_layers * c->ple_dim;
        fetch(k, IB_BUF_X, R, k->in);
        ops->ple_inputs(k->be);
        REF(ref_ple_inputs(k, k->in, k->pli_ref));
        const float *got = ops->read_ple_inputs ? ops->read_ple_inputs(k->be, R) : NULL;
        if (got) report(k, "ple_inputs", k->pli_ref, got, (long)n);
        /* the layers' ple_layer checks read the inputs as the backend holds them (its own when it can
         * show them: errors do not compound), else the reference's */
        memcpy(k->pli, got ? got : k->pli_ref, n * sizeof(float));
    }

    for (int li = 0; li < c->n_layers; li++) {
        const ib_layer *L = &m->layers[li];
        const int has_v = L->wv.rows > 0, own_kv = L->wk.rows > 0 || !gemma;   /* KV-shared: no k_proj */
        hd = k->hd = L->hd;
        KVH = k->kvh = L->kvh;
        k->ffn = ib_config_layer_ffn(c, li);
        fetch(k, IB_BUF_X, R, k->in);
        ops->rmsnorm(k->be, IB_BUF_X, IB_N_ATTN, li, IB_BUF_XN);
        REF(ib_rmsnorm(k->in, L->attn_norm, R, D, eps, k->ref, NULL));
        compare_buf(k, "rmsnorm", IB_BUF_XN, R);

        static const ib_wsel qkv[3] = {IB_W_Q, IB_W_K, IB_W_V};
        static const ib_buf qkv_out[3] = {IB_BUF_Q, IB_BUF_K, IB_BUF_V};
        if (own_kv) check_linear(k, li, has_v ? 3 : 2, qkv, IB_BUF_XN, qkv_out, "linear q/k/v");
        else check_linear(k, li, 1, qkv, IB_BUF_XN, qkv_out, "linear q (kv-shared)");

        if (!own_kv) { /* a KV-shared layer: its queries alone are normed and rotated, nothing is stored */
            fetch(k, IB_BUF_Q, R, k->in);
            ops->qk_prepare(k->be, li, IB_QK_NORM);
            REF(ib_rmsnorm_heads(k->in, L->q_norm, R, H, hd, eps, NULL));
            memcpy(k->ref, k->in, (size_t)R * H * hd * sizeof(float));
            compare_buf(k, "q norm (kv-shared)", IB_BUF_Q, R);
            fetch(k, IB_BUF_Q, R, k->in);
            ops->qk_prepare(k->be, li, IB_QK_ROPE_STORE);
            REF(ib_rope(k->in, R, H, hd, L->sliding ? k->cs : k->cs_full));
            memcpy(k->ref, k->in, (size_t)R * H * hd * sizeof(float));
            compare_buf(k, "rope q (kv-shared)", IB_BUF_Q, R);
        }
        if (own_kv && L->q_norm) {
            fetch(k, IB_BUF_Q, R, k->in);
            fetch(k, IB_BUF_K, R, k->in2);
            if (gemma) { /* V = the raw K under k_eq_v, then normed without a weight */
                if (has_v) fetch(k, IB_BUF_V, R, k->got);
                else memcpy(k->got, k->in2, (size_t)R * KVH * hd * sizeof(float));
                memcpy(k->v, k->got, (size_t)R * KVH * hd * sizeof(float));
            }
            ops->qk_prepare(k->be, li, IB_QK_NORM);
            REF(ib_rmsnorm_heads(k->in, L->q_norm, R, H, hd, eps, NULL));
            memcpy(k->ref, k->in, (size_t)R * H * hd * sizeof(float));
            compare_buf(k, "q/k norm", IB_BUF_Q, R);
            REF(ib_rmsnorm_heads(k->in2, L->k_norm, R, KVH, hd, eps, NULL));
            memcpy(k->ref, k->in2, (size_t)R * KVH * hd * sizeof(float));
            compare_buf(k, "q/k norm", IB_BUF_K, R);
            if (gemma) {
                REF(ib_rmsnorm_heads(k->v, NULL, R, KVH, hd, eps, NULL));
                memcpy(k->ref, k->v, (size_t)R * KVH * hd * sizeof(float));
                compare_buf(k, "v norm", IB_BUF_V, R);
            }
        }
        if (own_kv) {
            fetch(k, IB_BUF_Q, R, k->in);
            fetch(k, IB_BUF_K, R, k->in2);
            fetch(k, IB_BUF_V, R, k->ref);
            ops->qk_prepare(k->be, li, IB_QK_ROPE_STORE);
            REF(ref_rope_store(k, li, k->in, k->in2, k->ref));
            memcpy(k->ref, k->in, (size_t)R * H * hd * sizeof(float));
            compare_buf(k, "rope", IB_BUF_Q, R);
            memcpy(k->ref, k->in2, (size_t)R * KVH * hd * sizeof(float));
            compare_buf(k, "rope", IB_BUF_K, R);
        }

        fetch(k, IB_BUF_Q, R, k->in);
        ops->attention(k->be, li);
        REF(ref_attention(k, li, k->in, k->ref));   /* a KV-shared layer: over its source's mirror */
        compare_buf(k, own_kv ? "kv store + attention" : "attention (kv-shared)", IB_BUF_ATT, R);

        static const ib_wsel wo = IB_W_O, wd = IB_W_DOWN;
        static const ib_buf yo = IB_BUF_O;
        check_linear(k, li, 1, &wo, IB_BUF_ATT, &yo, "linear o");
        if (gemma) check_norm(k, IB_BUF_O, IB_N_POST_ATTN, li, L->post_attn_norm, IB_BUF_O);

        check_add(k);

        fetch(k, IB_BUF_X, R, k->in);
        ops->rmsnorm(k->be, IB_BUF_X, IB_N_MLP, li, IB_BUF_XN);
        REF(ib_rmsnorm(k->in, L->mlp_norm, R, D, eps, k->ref, NULL));
        compare_buf(k, "rmsnorm", IB_BUF_XN, R);

        static const ib_wsel gu[2] = {IB_W_GATE, IB_W_UP};
        static const ib_buf gu_out[2] = {IB_BUF_G, IB_BUF_U};
        check_linear(k, li, 2, gu, IB_BUF_XN, gu_out, "linear gate/up");

        fetch(k, IB_BUF_G, R, k->ref);
        fetch(k, IB_BUF_U, R, k->in2);
        if (gemma) {
            ops->geglu(k->be, li);
            REF(ib_geglu(k->ref, k->in2, R, k->ffn));
            compare_buf(k, "geglu", IB_BUF_G, R);
        } else {
            ops->swiglu(k->be);
            REF(ib_swiglu(k->ref, k->in2, R, k->ffn));
            compare_buf(k, "swiglu", IB_BUF_G, R);
        }

        check_linear(k, li, 1, &wd, IB_BUF_G, &yo, "linear down");
        if (c->n_experts > 0) { /* the MoE block (step.c): dense and routed outputs, each normed, summed */
            check_norm(k, IB_BUF_O, IB_N_POST_MLP1, li, L->post_mlp_norm1, IB_BUF_O);
            check_norm(k, IB_BUF_X, IB_N_PRE_MOE, li, L->pre_moe_norm, IB_BUF_XN);
            fetch(k, IB_BUF_X, R, k->in);
            fetch(k, IB_BUF_XN, R, k->in2);
            ops->moe(k->be, li, IB_BUF_X, IB_BUF_XN, IB_BUF_E);
            int bad = 0;
            REF(bad = ref_moe(k, li, k->in, k->in2, k->ref));
            if (bad) return ib_fail(err, IB_ERR_NOMEM, "backend check: out of memory");
            compare_buf(k, "moe", IB_BUF_E, R);
            check_norm(k, IB_BUF_E, IB_N_POST_MOE, li, L->post_moe_norm, IB_BUF_E);
            fetch(k, IB_BUF_O, R, k->in);
            fetch(k, IB_BUF_E, R, k->in2);
            ops->add(k->be, IB_BUF_O, IB_BUF_E);
            memcpy(k->ref, k->in, (size_t)R * D * sizeof(float));
            REF(ib_add(k->ref, k->in2, (size_t)R * D));
            compare_buf(k, "add", IB_BUF_O, R);
        }
        if (gemma) check_norm(k, IB_BUF_O, IB_N_POST_MLP, li, L->post_mlp_norm, IB_BUF_O);

        check_add(k);
        if (c->ple_dim > 0) { /* the layer's per-layer input block on the residual */
            fetch(k, IB_BUF_X, R, k->in);
            ops->ple_layer(k->be, li);
            REF(ref_ple_layer(k, li, k->in, k->pli, k->v, k->in2, k->ref));
            compare_buf(k, "ple_layer", IB_BUF_X, R);
        }
        if (gemma) {
            fetch(k, IB_BUF_X, R, k->ref);
            ops->scale_layer(k->be, li);
            REF(ib_scale(k->ref, (size_t)R * D, L->layer_scalar));
            compare_buf(k, "scale_layer", IB_BUF_X, R);
        }
    }

    /* logits of the wanted rows: final norm, then the lm_head */
    fetch(k, IB_BUF_X, R, k->in);
    if (n_logits > 0) ops->logits(k->be);
    if ((rc = ops->step_end(k->be, err))) return rc;
    if (n_logits > 0) {
        for (int j = 0; j < n_logits; j++)
            memcpy(k->in2 + (size_t)j * D, k->in + (size_t)logit_row[j] * D, (size_t)D * sizeof(float));
        REF(ib_rmsnorm(k->in2, m->final_norm, n_logits, D, eps, k->in2, NULL));
        memcpy(k->ref, k->in2, (size_t)n_logits * D * sizeof(float));
        fetch(k, IB_BUF_XN, n_logits, k->got);
        report(k, "final norm", k->ref, k->got, (long)n_logits * D);
        int V = c->vocab_size;
        float *want = malloc((size_t)n_logits * V * sizeof(float));
        if (!want) return ib_fail(err, IB_ERR_NOMEM, "backend check: out of memory");
        REF(ref_linear(k, m->lm_head, k->in2, n_logits, want);
            if (c->final_softcap > 0) ib_softcap(want, (size_t)n_logits * V, (float)c->final_softcap));
        for (int j = 0; j < n_logits; j++) report(k, "logits", want + (size_t)j * V, lo[j], V);
        free(want);
    }
    for (int i = 0; i < N_ITEMS; i++) item_pos[i] += step_tokens[step][i];
    return IB_OK;
}

/* One configuration (KV dtype, policy): fresh caches, N_STEPS steps. */
static ib_status check_config(check *k, ib_kv_dtype dtype, int windowed, ib_error *err) {
    const ib_config *c = &k->m->cfg;
    ib_kv *kvs[N_ITEMS] = {0};
    float *lg[N_ITEMS] = {0};
    int item_pos[N_ITEMS] = {0};
    ib_status rc = IB_OK;
    /* Gemma 4: a window no smaller than the sliding layers' (session.c refuses smaller ones) */
    int win = c->arch == IB_ARCH_GEMMA4 && WIN_WINDOW < c->sliding_window ? c->sliding_window + 2 : WIN_WINDOW;
    k->desc = (ib_kv_desc){.dtype = dtype, .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                           .capacity = windowed ? WIN_SINK + win + KV_CHUNK : N_STEPS * KV_CHUNK,
                           .sink = windowed ? WIN_SINK : 0, .window = windowed ? win : 0};
    if (c->arch == IB_ARCH_GEMMA4) { /* as session.c lays it out: full layers at theirs, sliding ones as rings */
        k->desc.n_kv_heads = c->global_kv_heads;
        k->desc.head_dim = c->global_head_dim;
        for (int li = 0; li < c->n_layers && li < IB_KV_MAX_LAYERS; li++)
            if (c->layer_sliding[li]) k->desc.sliding[li] = 1, k->desc.n_sliding++;
        for (int li = 0; li < c->n_layers && li < IB_KV_MAX_LAYERS; li++)
            k->desc.kv_from[li] = c->kv_from[li];   /* KV-shared layers hold none of their own */
        k->desc.sliding_kv_heads = c->n_kv_heads;
        k->desc.sliding_head_dim = c->head_dim;
        k->desc.sliding_capacity = c->sliding_window + KV_CHUNK - 1;
        k->desc.sliding_window = c->sliding_window;
    }
    k->config = dtype == IB_KV_F16 ? (windowed ? "f16 KV, sink+window" : "f16 KV, full")
                                   : (windowed ? "f32 KV, sink+window" : "f32 KV, full");
    size_t mirror_floats = ib_kv_desc_elems(&k->desc);
    for (int i = 0; i < N_ITEMS && !rc; i++) {
        rc = k->ops->kv_create(&k->desc, &kvs[i], err);
        if (!rc && (!(k->mirror[i] = calloc(mirror_floats, sizeof(float))) ||
                    !(lg[i] = malloc((size_t)c->vocab_size * sizeof(float)))))
            rc = ib_fail(err, IB_ERR_NOMEM, "backend check: out of memory");
    }
    for (int s = 0; s < N_STEPS && !rc; s++) rc = check_step(k, s, kvs, item_pos, lg, err);
    for (int i = 0; i < N_ITEMS; i++) {
        if (kvs[i]) k->ops->kv_free(kvs[i]);
        free(k->mirror[i]);
        k->mirror[i] = NULL;
        free(lg[i]);
    }
    return rc;
}

ib_status ib_backend_check(const ib_model *m, const ib_backend_check_opts *o, ib_opcheck_fn fn, void *ctx,
                           long *mismatches, ib_error *err) {
    const ib_config *c = &m->cfg;
    const char *why = NULL;
    *mismatches = 0;
    if (!ib_backend_available(o->backend, &why))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "backend %s: %s", ib_backend_name(o->backend), why);
    ib_engine_opts eo = {.threads = o->threads, .isa = o->isa, .act = o->act, .backend = o->backend};
    ib_engine *e = NULL;
    check k = {.m = m, .ops = ib_backend_ops_for(o->backend), .fn = fn, .ctx = ctx};
    /* the engine decides ISA and activation mode exactly as in serving; its backend is the one checked */
    ib_status rc = ib_engine_create(m, &eo, &e, err);
    if (rc) return rc;
    k.be = e->be;
    k.act = ib_engine_act(e);
    size_t R = N_ITEMS * KV_CHUNK, w = (size_t)c->hidden_size;
    size_t widest = (size_t)c->n_heads * c->kv_hd_max;
    if ((size_t)ib_config_ffn_max(c) > widest) widest = ib_config_ffn_max(c);   /* 2F when double-wide */
    if ((size_t)c->ple_dim > widest) widest = c->ple_dim;
    if (w > widest) widest = w;
    int G = c->quant_group ? c->quant_group : 32;
    k.in = malloc(R * widest * sizeof(float));
    k.in2 = malloc(R * widest * sizeof(float));
    k.ref = malloc(R * widest * sizeof(float));
    k.got = malloc(R * widest * sizeof(float));
    k.qa.xq = malloc(R * widest);
    k.qa.d = malloc(R * (widest / G + 1) * sizeof(float));
    k.qa.ad = malloc(R * (widest / G + 1) * sizeof(float));
    k.v = malloc(R * widest * sizeof(float));
    k.cs = malloc(R * c->head_dim * sizeof(float));
    k.cs_full = c->arch == IB_ARCH_GEMMA4 ? malloc(R * c->global_head_dim * sizeof(float)) : NULL;
    const size_t LP = (size_t)c->n_layers * c->ple_dim;
    if (LP > 0) {
        k.pli = malloc(R * LP * sizeof(float));
        k.pli_ref = malloc(R * LP * sizeof(float));
        k.ple_row = malloc(LP * sizeof(float));
    }
    if (!k.in || !k.in2 || !k.ref || !k.got || !k.v || !k.qa.xq || !k.qa.d || !k.qa.ad || !k.cs ||
        (c->arch == IB_ARCH_GEMMA4 && !k.cs_full) || (LP > 0 && (!k.pli || !k.pli_ref || !k.ple_row)))
        rc = ib_fail(err, IB_ERR_NOMEM, "backend check: out of memory");
    /* the references run fault-free; the backend keeps whatever fault the caller set */
    for (int dt = 0; dt < 2 && !rc; dt++)
        for (int win = 0; win < 2 && !rc; win++) rc = check_config(&k, dt ? IB_KV_F16 : IB_KV_F32, win, err);
    free(k.in);
    free(k.in2);
    free(k.ref);
    free(k.got);
    free(k.qa.xq);
    free(k.qa.d);
    free(k.qa.ad);
    free(k.cs);
    free(k.cs_full);
    free(k.v);
    free(k.pli);
    free(k.pli_ref);
    free(k.ple_row);
    ib_engine_free(e);
    *mismatches = k.mismatches;
    return rc;
}
