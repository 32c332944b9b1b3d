/*
 * cpu_backend.c — the CPU backend: the backend table (backends/backend.h) over host memory, the
 * engine's thread pool and the kernels of one ISA, chosen once at creation (ib_cpu_kernels_for).
 *
 * Weights are the model's own packed matrices (ops/matmul.h), read in place. Each call runs at once:
 * step_end has nothing left to wait for. Work is split over the pool by rows, (row, KV head) pairs or
 * weight panels — never inside one reduction — so how rows are split over threads changes nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/kv_blocks.h"
#include "core/error.h"
#include "core/half.h"
#include "ops/ops.h"
#include "runtime/kv_policy.h"
#include "sampling/sampler.h"

/* A step's rows are split over the pool for the per-row work between products (head norms, rotary
 * embedding, KV store, SwiGLU, activation quantization) when they hold at least this many elements in
 * all; below it, waking the workers costs more than the work saves. Only speed depends on it. */
#define ROW_JOB_MIN_ELEMS 8192

/* Most rows of logits one lm_head product computes (the scratch holds min(max_rows, this) rows of the
 * vocabulary: 19.4 MB for Qwen3's 151,936). Each product streams the lm_head's weights (88 MB for
 * Qwen3-0.6B at 4 bits, beyond the caches) once for its rows: at 16 rows a step of 64 spent about a
 * fifth more on its logits than at 32, and 64 measured the same as 32. Only speed depends on it (a
 * row's logits are its own whatever rows share the product). */
#define LOGIT_ROWS 32

/* A KV cache in host memory. */
typedef struct cpu_kv {
    ib_kv base;
    void *data;         /* per layer, [2][KVH][slots][hd] elements of base.desc.dtype at the shape of its kind
                         * (ib_kv_desc_layer): keys then values */
    size_t *layer_off;  /* [n_layers] element offset of each layer's keys */
    size_t block;       /* bytes of the block at data (kv_blocks.h: at least the cache's) */
    int used;           /* slots [0, used) of a plane (at most its capacity) may have been written: every
                         * stored position and copied slot is below it */
} cpu_kv;

typedef struct cpu_backend {
    ib_backend base;
    const ib_model *model;
    ib_cpu_kernels k;
    ib_act act;
    ib_pool *pool;
    int max_rows;
    /* the step in progress (copied by step_begin) */
    int R, n_items, attn_block, n_logits;
    int logit_rows;                  /* rows the logits scratch holds: min(max_rows, LOGIT_ROWS) */
    int32_t *tok, *pos, *row_item;   /* [R_max] */
    int32_t *logit_row;              /* [R_max] */
    float **logits_out;              /* [R_max] (entries may be NULL: argmax only) */
    int32_t **argmax_out;            /* [R_max] where each wanted row's argmax goes (NULL: none) */
    cpu_kv **kv;                     /* [R_max] per item */
    /* activations, [R_max][width] each (ib_buf order) */
    float *buf[IB_BUF_COUNT];
    float *cs;                       /* [R][hd/2][2] RoPE cos/sin (Gemma 4: of the sliding layers) */
    float *cs_full;                  /* Gemma 4: [R][global_hd/2][2] of the full layers; else NULL */
    ib_act_buf qa;                   /* quantized activations: xq [R][max(D,F,H*hd)], d/ad [R][max/G] */
    float *logits;                   /* [logit_rows][V] */
    /* Gemma 4 MoE scratch (NULL for dense models) */
    float *moe_rin;                  /* [R][D] router input */
    float *moe_logit;                /* [R][E] router logits */
    float *moe_p;                    /* [E] softmax of one row */
    int32_t *moe_sel;                /* [R][k] selected experts in rank order (-1: dropped, fault only) */
    float *moe_w;                    /* [R][k] their weights */
    int32_t *moe_rows;               /* [R] rows routed to one expert; then the slot (r*k + j) of each */
    int32_t *moe_slot;               /* [R] */
    float *moe_x;                    /* [R][D] those rows' inputs, gathered */
    float *moe_g, *moe_u;            /* [R][Fm] */
    float *moe_y;                    /* [R][k][D] each row's expert outputs in rank order */
    float *ple_in;                   /* [R][L*P] Gemma 4 per-layer inputs of the step's rows */
    float *ple_tok;                  /* [L*P] one row of embed_tokens_per_layer */
    float *ple_g;                    /* [R][P] a layer's per-layer gate, then its activation */
    float *ple_y;                    /* [R][D] a layer's per-layer block output */
} cpu_backend;

static cpu_backend *cb(ib_backend *b) { return (cpu_backend *)b; }

static ib_pool *rows_pool(const cpu_backend *c, double elems) { return elems >= ROW_JOB_MIN_ELEMS ? c->pool : NULL; }

/* Element offset of (layer li, keys kv=0 / values kv=1, KV head h, slot 0) in cache k, whose layer li
 * has the one-layer view v (ib_kv_desc_layer). */
static size_t kv_offset(const cpu_kv *k, const ib_kv_desc *v, int li, int kv, int h) {
    return k->layer_off[li] + ((size_t)kv * v->n_kv_heads + h) * (size_t)v->capacity * v->head_dim;
}

/* ---------------------------------------------------------------- KV caches */

static ib_status cpu_kv_create(const ib_kv_desc *d, ib_kv **out, ib_error *err) {
    *out = NULL;
    cpu_kv *kv = calloc(1, sizeof *kv);
    size_t bytes = ib_kv_desc_bytes(d);
    /* ordinary pages, not ib_big_alloc's huge ones: a cache's pages come as its session fills it, where
     * huge pages would make 2 MiB of each of its planes resident at the first token (no faster either:
     * docs/cpu.md, "Packed weights on huge pages"); an ended session's block of this size up to twice it
     * when the pool has one (kv_blocks.h: the pages its session wrote still mapped, all zero) */
    if (kv) kv->data = ib_kv_block_take(bytes, &kv->block);
    if (kv) kv->layer_off = malloc((d->n_layers > 0 ? (size_t)d->n_layers : 1) * sizeof *kv->layer_off);
    if (!kv || !kv->data || !kv->layer_off) {
        if (kv) ib_kv_block_free(kv->data), free(kv->layer_off);
        free(kv);
        return ib_fail(err, IB_ERR_NOMEM, "session: out of memory for a KV cache of %d tokens (%zu bytes)", d->capacity,
                       bytes);
    }
    size_t off = 0;   /* a KV-shared layer's keys and values are its source layer's (an earlier one) */
    for (int li = 0; li < d->n_layers; li++) {
        int own = ib_kv_desc_owner(d, li);
        kv->layer_off[li] = own == li ? off : kv->layer_off[own];
        off += ib_kv_desc_layer_elems(d, li);
    }
    kv->base.desc = *d;
    kv->base.kind = IB_BACKEND_CPU;
    *out = &kv->base;
    return IB_OK;
}

/* Bytes of cache k its session may have written (slots [0, used) of every plane), zeroing them when zero. */
static size_t kv_written(cpu_kv *k, int zero) {
    const ib_kv_desc *d = &k->base.desc;
    size_t bytes = 0;
    for (int l = 0; l < d->n_layers; l++) {
        if (ib_kv_desc_owner(d, l) != l) continue;   /* KV-shared: holds none */
        const ib_kv_desc v = ib_kv_desc_layer(d, l);
        const int n = k->used < v.capacity ? k->used : v.capacity;
        const size_t row = ib_kv_bytes(d->dtype, (size_t)v.head_dim * n);
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < v.n_kv_heads; h++) {
                if (zero) memset((char *)k->data + ib_kv_bytes(d->dtype, kv_offset(k, &v, l, kv, h)), 0, row);
                bytes += row;
            }
    }
    return bytes;
}

/* Free a cache: its block to the pool (its written slots zeroed first) when the pool wants it. */
static void cpu_kv_free(ib_kv *kv) {
    if (!kv) return;
    cpu_kv *k = (cpu_kv *)kv;
    const size_t resident = kv_written(k, 0);
    if (ib_kv_block_wanted(resident)) {
        if (ib_fault_get() != IB_FAULT_KV_POOL_DIRTY) kv_written(k, 1);
        ib_kv_block_give(k->data, k->block, resident);
    } else {
        ib_kv_block_free(k->data);
    }
    free(k->layer_off);
    free(kv);
}

int ib_cpu_kv_read(const ib_kv *kv, void *dst, size_t bytes) {
    if (!kv || kv->kind != IB_BACKEND_CPU || bytes != ib_kv_desc_bytes(&kv->desc)) return -1;
    memcpy(dst, ((const cpu_kv *)kv)->data, bytes);
    return 0;
}

static void cpu_kv_copy(ib_kv *dst, const ib_kv *src, int n_slots) {
    const cpu_kv *s = (const cpu_kv *)src;
    cpu_kv *t = (cpu_kv *)dst;
    const ib_kv_dtype dt = src->desc.dtype;
    for (int l = 0; l < src->desc.n_layers; l++) {
        if (ib_kv_desc_owner(&src->desc, l) != l) continue;   /* KV-shared: its source's are copied */
        ib_kv_desc sv = ib_kv_desc_layer(&src->desc, l), tv = ib_kv_desc_layer(&dst->desc, l);
        int n = n_slots < sv.capacity ? n_slots : sv.capacity;
        if (n > tv.capacity) n = tv.capacity;
        if (n > t->used) t->used = n;
        size_t plane = ib_kv_bytes(dt, (size_t)sv.head_dim * n);
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < sv.n_kv_heads; h++)
                memcpy((char *)t->data + ib_kv_bytes(dt, kv_offset(t, &tv, l, kv, h)),
                       (const char *)s->data + ib_kv_bytes(dt, kv_offset(s, &sv, l, kv, h)), plane);
    }
}

/* ---------------------------------------------------------------- instance */

static void cpu_destroy(ib_backend *b) {
    cpu_backend *c = cb(b);
    if (!c) return;
    free(c->tok);
    free(c->pos);
    free(c->row_item);
    free(c->logit_row);
    free(c->logits_out);
    free(c->argmax_out);
    free(c->kv);
    for (int i = 0; i < IB_BUF_COUNT; i++) free(c->buf[i]);
    free(c->cs);
    free(c->cs_full);
    free(c->qa.xq);
    free(c->qa.d);
    free(c->qa.ad);
    free(c->logits);
    free(c->moe_rin);
    free(c->moe_logit);
    free(c->moe_p);
    free(c->moe_sel);
    free(c->moe_w);
    free(c->moe_rows);
    free(c->moe_slot);
    free(c->moe_x);
    free(c->moe_g);
    free(c->moe_u);
    free(c->moe_y);
    free(c->ple_in);
    free(c->ple_tok);
    free(c->ple_g);
    free(c->ple_y);
    free(c);
}

static int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

static ib_status cpu_create(const ib_model *m, const ib_backend_cfg *cfg, ib_backend **out, ib_error *err) {
    *out = NULL;
    ib_cpu_kernels k;
    ib_status rc = ib_cpu_kernels_for(cfg->isa, &k, err);
    if (rc) return rc;
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return ib_fail(err, IB_ERR_NOMEM, "engine: out of memory");
    c->base.ops = &ib_backend_cpu;
    c->model = m;
    c->k = k;
    c->act = cfg->act;
    c->pool = cfg->pool;
    c->max_rows = cfg->max_rows;
    const ib_config *mc = &m->cfg;
    size_t R = (size_t)cfg->max_rows, D = mc->hidden_size, hd = mc->head_dim, F = ib_config_ffn_max(mc);
    size_t HD = (size_t)mc->n_heads * hd, KD = (size_t)mc->n_kv_heads * hd;
    if (mc->arch == IB_ARCH_GEMMA4) { /* rows of a layer are packed at its own width: size for the widest */
        size_t ghd = (size_t)mc->global_head_dim;
        HD = (size_t)mc->n_heads * (hd > ghd ? hd : ghd);
        KD = (size_t)mc->kv_heads_max * mc->kv_hd_max;
    }
    size_t widest = (size_t)max3((int)D, (int)F, (int)HD);
    if ((size_t)mc->moe_ffn > widest) widest = (size_t)mc->moe_ffn;
    if ((size_t)mc->ple_dim > widest) widest = (size_t)mc->ple_dim;
    const size_t width[IB_BUF_COUNT] = {
        [IB_BUF_X] = D, [IB_BUF_XN] = D, [IB_BUF_Q] = HD, [IB_BUF_K] = KD, [IB_BUF_V] = KD,
        [IB_BUF_ATT] = HD, [IB_BUF_O] = D > F ? D : F, [IB_BUF_G] = F, [IB_BUF_U] = F, [IB_BUF_E] = D,
    };
    int G = mc->quant_group ? mc->quant_group : 32;
    int ok = 1;
    c->tok = malloc(R * sizeof(int32_t));
    c->pos = malloc(R * sizeof(int32_t));
    c->row_item = malloc(R * sizeof(int32_t));
    c->logit_row = malloc(R * sizeof(int32_t));
    c->logits_out = malloc(R * sizeof(float *));
    c->argmax_out = malloc(R * sizeof(int32_t *));
    c->kv = malloc(R * sizeof(cpu_kv *));
    for (int i = 0; i < IB_BUF_COUNT; i++) ok &= (c->buf[i] = malloc(R * width[i] * sizeof(float))) != NULL;
    c->cs = malloc(R * hd * sizeof(float));
    if (mc->arch == IB_ARCH_GEMMA4) ok &= (c->cs_full = malloc(R * mc->global_head_dim * sizeof(float))) != NULL;
    c->qa.xq = malloc(R * widest);
    c->qa.d = malloc(R * (widest / G + 1) * sizeof(float));
    c->qa.ad = malloc(R * (widest / G + 1) * sizeof(float));
    c->logit_rows = cfg->max_rows < LOGIT_ROWS ? cfg->max_rows : LOGIT_ROWS;
    c->logits = malloc((size_t)c->logit_rows * mc->vocab_size * sizeof(float));
    if (mc->n_experts > 0) {
        size_t E = mc->n_experts, K = mc->top_k, Fm = mc->moe_ffn;
        ok &= (c->moe_rin = malloc(R * D * sizeof(float))) != NULL;
        ok &= (c->moe_logit = malloc(R * E * sizeof(float))) != NULL;
        ok &= (c->moe_p = malloc(E * sizeof(float))) != NULL;
        ok &= (c->moe_sel = malloc(R * K * sizeof(int32_t))) != NULL;
        ok &= (c->moe_w = malloc(R * K * sizeof(float))) != NULL;
        ok &= (c->moe_rows = malloc(R * sizeof(int32_t))) != NULL;
        ok &= (c->moe_slot = malloc(R * sizeof(int32_t))) != NULL;
        ok &= (c->moe_x = malloc(R * D * sizeof(float))) != NULL;
        ok &= (c->moe_g = malloc(R * Fm * sizeof(float))) != NULL;
        ok &= (c->moe_u = malloc(R * Fm * sizeof(float))) != NULL;
        ok &= (c->moe_y = malloc(R * K * D * sizeof(float))) != NULL;
    }
    if (mc->ple_dim > 0) {
        size_t LP = (size_t)mc->n_layers * mc->ple_dim;
        ok &= (c->ple_in = malloc(R * LP * sizeof(float))) != NULL;
        ok &= (c->ple_tok = malloc(LP * sizeof(float))) != NULL;
        ok &= (c->ple_g = malloc(R * (size_t)mc->ple_dim * sizeof(float))) != NULL;
        ok &= (c->ple_y = malloc(R * D * sizeof(float))) != NULL;
    }
    if (!ok || !c->tok || !c->pos || !c->row_item || !c->logit_row || !c->logits_out || !c->argmax_out || !c->kv ||
        !c->cs || !c->qa.xq ||
        !c->qa.d || !c->qa.ad || !c->logits) {
        cpu_destroy(&c->base);
        return ib_fail(err, IB_ERR_NOMEM, "engine: out of memory for %d tokens per step", cfg->max_rows);
    }
    *out = &c->base;
    return IB_OK;
}

/* ---------------------------------------------------------------- the step */

static ib_status cpu_step_begin(ib_backend *b, const ib_step_desc *d, ib_error *err) {
    cpu_backend *c = cb(b);
    const ib_config *mc = &c->model->cfg;
    if (d->R > c->max_rows || d->n_logits > d->R)
        return ib_fail(err, IB_ERR_INVALID_ARG, "step: %d rows exceed the backend's %d", d->R, c->max_rows);
    c->R = d->R;
    c->n_items = d->n_items;
    c->attn_block = d->attn_block;
    c->n_logits = d->n_logits;
    memcpy(c->tok, d->tok, (size_t)d->R * sizeof(int32_t));
    memcpy(c->pos, d->pos, (size_t)d->R * sizeof(int32_t));
    memcpy(c->row_item, d->row_item, (size_t)d->R * sizeof(int32_t));
    memcpy(c->logit_row, d->logit_row, (size_t)d->n_logits * sizeof(int32_t));
    memcpy(c->logits_out, d->logits_out, (size_t)d->n_logits * sizeof(float *));
    for (int j = 0; j < d->n_logits; j++) c->argmax_out[j] = d->argmax_out ? d->argmax_out[j] : NULL;
    for (int i = 0; i < d->n_items; i++) c->kv[i] = (cpu_kv *)d->kv[i];
    for (int r = 0; r < d->R; r++) { /* the slots this step may store at (kv_written) */
        cpu_kv *k = c->kv[d->row_item[r]];
        if (d->pos[r] >= k->used) k->used = d->pos[r] + 1;
    }
    ib_rope_table(d->rope_pos, d->R, mc->head_dim, mc->rope_theta, c->cs);
    if (c->cs_full)
        ib_rope_table_pairs(d->rope_pos, d->R, mc->global_head_dim, mc->rope_theta_full, mc->rope_pairs_full, c->cs_full);
    return IB_OK;
}

/* Row task of cpu_embed: row r of X = the embedding row of the row's token. */
static void embed_task(void *ctx, int r, int thread) {
    const cpu_backend *c = ctx;
    ib_matrix_row_f32(&c->model->embed, c->tok[r], c->buf[IB_BUF_X] + (size_t)r * c->model->cfg.hidden_size);
}

static void cpu_embed(ib_backend *b) {
    cpu_backend *c = cb(b);
    int D = c->model->cfg.hidden_size;
    ib_pool_run(rows_pool(c, (double)c->R * D), c->R, embed_task, c);
    if (c->model->embed_scale != 1.0f) ib_scale(c->buf[IB_BUF_X], (size_t)c->R * D, c->model->embed_scale);
}

static const float *norm_weight(const ib_model *m, ib_nsel n, int li) {
    switch (n) {
    case IB_N_FINAL: return m->final_norm;
    case IB_N_ATTN: return m->layers[li].attn_norm;
    case IB_N_POST_ATTN: return m->layers[li].post_attn_norm;
    case IB_N_POST_MLP: return m->layers[li].post_mlp_norm;
    case IB_N_POST_MLP1: return m->layers[li].post_mlp_norm1;
    case IB_N_PRE_MOE: return m->layers[li].pre_moe_norm;
    case IB_N_POST_MOE: return m->layers[li].post_moe_norm;
    default: return m->layers[li].mlp_norm;
    }
}

static void cpu_rmsnorm(ib_backend *b, ib_buf in, ib_nsel n, int li, ib_buf out) {
    cpu_backend *c = cb(b);
    const ib_config *mc = &c->model->cfg;
    ib_rmsnorm(c->buf[in], norm_weight(c->model, n, li), c->R, mc->hidden_size, (float)mc->rms_eps, c->buf[out],
               c->pool);
}

static const ib_matrix *layer_matrix(const ib_layer *L, ib_wsel w) {
    switch (w) {
    case IB_W_Q: return &L->wq;
    case IB_W_K: return &L->wk;
    case IB_W_V: return &L->wv;
    case IB_W_O: return &L->wo;
    case IB_W_GATE: return &L->w_gate;
    case IB_W_UP: return &L->w_up;
    default: return &L->w_down;
    }
}

typedef struct {
    cpu_backend *c;
    const float *X;   /* [R][K] */
    int K, G;
} quant_job;

static void quant_task(void *ctx, int r, int thread) {
    quant_job *j = ctx;
    ib_act_buf *qa = &j->c->qa;
    const size_t ng = (size_t)(j->K / j->G);
    j->c->k.quant(j->X + (size_t)r * j->K, 1, j->K, j->G, qa->xq + (size_t)r * j->K, qa->d + (size_t)r * ng,
                  qa->ad + (size_t)r * ng);
}

/* The Q8 activations of X [R][K] for weight group G, row by row (each row's own numbers). */
static void quantize(cpu_backend *c, const float *X, int R, int K, int G) {
    quant_job j = {c, X, K, G};
    ib_pool_run(rows_pool(c, (double)R * K), R, quant_task, &j);
}

/* Ys[i][R][N_i] = X[R][K] · W_i^T for products that read the same X, in one pool job. Under Q8
 * activations X is quantized once, with the group of the first quantized W_i (the products of one
 * layer input share it); float matrices take the F32 path. */
static void linear_many(cpu_backend *c, int n, const ib_matrix *const *ws, const float *X, int R, float *const *Ys) {
    if (c->act == IB_ACT_Q8)
        for (int i = 0; i < n; i++)
            if (ws[i]->fmt != IB_WF32) {
                quantize(c, X, R, ws[i]->cols, ws[i]->group);
                break;
            }
    ib_matmul_many_k(n, ws, X, R, &c->qa, c->act, c->k.matmul, c->pool, Ys);
}

static void cpu_linear(ib_backend *b, int li, int n, const ib_wsel *ws, ib_buf in, const ib_buf *outs) {
    cpu_backend *c = cb(b);
    const ib_matrix *ms[IB_MATMUL_MAX_MANY];
    float *ys[IB_MATMUL_MAX_MANY];
    for (int i = 0; i < n; i++) ms[i] = layer_matrix(&c->model->layers[li], ws[i]), ys[i] = c->buf[outs[i]];
    linear_many(c, n, ms, c->buf[in], c->R, ys);
}

/* Copy row r's keys and values into its session's cache for layer li (the layer's KVH heads of hd
 * elements, at the slot of the row's position in the layer's view). */
static void store_kv_row(cpu_backend *c, int r, int li) {
    const ib_layer *L = &c->model->layers[li];
    int KVH = L->kvh, hd = L->hd;
    cpu_kv *kv = c->kv[c->row_item[r]];
    const ib_kv_desc lv = ib_kv_desc_layer(&kv->base.desc, li), *d = &lv;
    size_t slot = (size_t)ib_kv_desc_slot(d, c->pos[r]);
    const float qmax = c->R > 1 && ib_fault_get() == IB_FAULT_KVQ8_STEP_SCALE ? 126.0f : 127.0f;
    for (int h = 0; h < KVH; h++) {
        size_t ko = kv_offset(kv, d, li, 0, h) + slot * hd, vo = kv_offset(kv, d, li, 1, h) + slot * hd;
        const float *kr = c->buf[IB_BUF_K] + ((size_t)r * KVH + h) * hd, *vr = c->buf[IB_BUF_V] + ((size_t)r * KVH + h) * hd;
        switch (d->dtype) {
        case IB_KV_F16:
            ib_f32_to_f16_rows(kr, (uint16_t *)kv->data + ko, hd);
            ib_f32_to_f16_rows(vr, (uint16_t *)kv->data + vo, hd);
            break;
        case IB_KV_Q8:
            ib_kvq8_encode_rows_qmax(kr, hd, (char *)kv->data + ib_kv_bytes(IB_KV_Q8, ko), qmax);
            ib_kvq8_encode_rows_qmax(vr, hd, (char *)kv->data + ib_kv_bytes(IB_KV_Q8, vo), qmax);
            break;
        default:
            memcpy((float *)kv->data + ko, kr, hd * sizeof(float));
            memcpy((float *)kv->data + vo, vr, hd * sizeof(float));
            break;
        }
    }
}

typedef struct {
    cpu_backend *c;
    const ib_layer *L;
    int li, phases;   /* IB_QK_NORM and/or IB_QK_ROPE_STORE */
} qk_job;

/* Row task between the q/k/v products and attention: the row's q and k head norms, then its rotary
 * embedding and KV store. Every operation is the row's own. A KV-shared layer (no k_proj) has only
 * its queries: no k/v norms, rotation or store (its attention reads its source layer's cache). */
static void qk_task(void *ctx, int r, int thread) {
    qk_job *j = ctx;
    cpu_backend *c = j->c;
    const ib_config *mc = &c->model->cfg;
    const int H = mc->n_heads, KVH = j->L->kvh, hd = j->L->hd;
    const int gemma = mc->arch == IB_ARCH_GEMMA4;
    float *q = c->buf[IB_BUF_Q], *k = c->buf[IB_BUF_K], *v = c->buf[IB_BUF_V];
    if (gemma && j->L->wk.rows == 0) { /* KV-shared layer */
        if ((j->phases & IB_QK_NORM) && j->L->q_norm)
            ib_rmsnorm_heads(q + (size_t)r * H * hd, j->L->q_norm, 1, H, hd, (float)mc->rms_eps, c->pool);
        if (j->phases & IB_QK_ROPE_STORE)
            ib_rope_step_rows(q, r, r + 1, c->R, H, hd, j->L->sliding ? c->cs : c->cs_full, c->n_items);
        return;
    }
    if ((j->phases & IB_QK_NORM) && gemma && j->L->wv.rows == 0) /* attention_k_eq_v: values are k_proj's */
        memcpy(v + (size_t)r * KVH * hd, k + (size_t)r * KVH * hd, (size_t)KVH * hd * sizeof(float));
    if ((j->phases & IB_QK_NORM) && j->L->q_norm) {
        ib_rmsnorm_heads(q + (size_t)r * H * hd, j->L->q_norm, 1, H, hd, (float)mc->rms_eps, c->pool);
        ib_rmsnorm_heads(k + (size_t)r * KVH * hd, j->L->k_norm, 1, KVH, hd, (float)mc->rms_eps, c->pool);
    }
    if ((j->phases & IB_QK_NORM) && gemma)
        ib_rmsnorm_heads(v + (size_t)r * KVH * hd, NULL, 1, KVH, hd, (float)mc->rms_eps, c->pool);
    if (j->phases & IB_QK_ROPE_STORE) {
        const float *cs = gemma && !j->L->sliding ? c->cs_full : c->cs;
        ib_rope_step_rows(q, r, r + 1, c->R, H, hd, cs, c->n_items);
        ib_rope_step_rows(k, r, r + 1, c->R, KVH, hd, cs, c->n_items);
        store_kv_row(c, r, j->li);
    }
}

static void cpu_qk_prepare(ib_backend *b, int li, int phases) {
    cpu_backend *c = cb(b);
    const ib_config *mc = &c->model->cfg;
    const ib_layer *L = &c->model->layers[li];
    qk_job j = {c, L, li, phases};
    ib_pool_run(rows_pool(c, (double)c->R * (mc->n_heads + 2 * L->kvh) * L->hd), c->R, qk_task, &j);
}

typedef struct {
    cpu_backend *c;
    int li;
    int tile;     /* rows per task: 1 (task = row*KVH + KV head) or more (task = KV head*n_tiles + i: the
                   * step's rows [i*tile, i*tile + tile), those of one session taking key blocks together) */
    int n_tiles;  /* ceil(R / tile) */
} attn_job;

/* What row r's attention reads for KV head kvh of layer li: its session's one-layer view of the
 * cache (d.window > 0: a sink/window ring), the key and value planes of that head, and the layer's
 * sliding window over a full cache (0: none; keys pos-window+1 .. pos). */
typedef struct {
    ib_kv_desc d;
    const void *k, *v;
    int window;
} attn_planes;
static attn_planes planes_of(const cpu_backend *c, int li, int r, int kvh) {
    const cpu_kv *kv = c->kv[c->row_item[r]];
    attn_planes p;
    p.d = ib_kv_desc_layer(&kv->base.desc, li);
    p.k = (const char *)kv->data + ib_kv_bytes(p.d.dtype, kv_offset(kv, &p.d, li, 0, kvh));
    p.v = (const char *)kv->data + ib_kv_bytes(p.d.dtype, kv_offset(kv, &p.d, li, 1, kvh));
    p.window = c->model->layers[li].sliding ? c->model->cfg.sliding_window : 0;
    return p;
}

/* The keys and values row r's attention for KV head kvh of layer li reads (from its first attended
 * key to its last) as an ahead hint for the call before it; 0 where none is given (a sink/window
 * ring, whose rows lie in two runs). */
static int attn_ahead_of(const cpu_backend *c, int li, int r, int kvh, ib_attn_ahead *a) {
    const attn_planes p = planes_of(c, li, r, kvh);
    if (p.d.window > 0) return 0;
    const int n = c->pos[r] + 1, lo = p.window > 0 && n > p.window ? n - p.window : 0, hd = c->model->layers[li].hd;
    const size_t first = ib_kv_bytes(p.d.dtype, (size_t)lo * hd);
    a->k = (const char *)p.k + first, a->v = (const char *)p.v + first;
    a->bytes = ib_kv_bytes(p.d.dtype, (size_t)(n - lo) * hd);
    return 1;
}

/* Row r's attention for the query heads of KV head kvh of layer li: the kept keys 0..pos of its
 * session (each head's result as ib_attend_one's / ib_attend_policy's), the heads taken
 * IB_ATTN_MAX_GROUP at a time; the rows of ahead (NULL: none) asked toward the core meanwhile. */
static void attn_row(cpu_backend *c, int li, int r, int kvh, const ib_attn_ahead *ahead) {
    const ib_config *mc = &c->model->cfg;
    const ib_layer *L = &c->model->layers[li];
    int H = mc->n_heads, KVH = L->kvh, hd = L->hd, G = H / KVH, h0 = kvh * G;
    const attn_planes p = planes_of(c, li, r, kvh);
    const ib_kv_desc *d = &p.d;
    const float *q = c->buf[IB_BUF_Q] + ((size_t)r * H + h0) * hd;
    float *out = c->buf[IB_BUF_ATT] + ((size_t)r * H + h0) * hd;
    const int gemma = mc->arch == IB_ARCH_GEMMA4;
    float scale = gemma ? 1.0f : 1.0f / sqrtf((float)hd);
    int pos = c->pos[r];
    for (int h = 0; h < G; h += IB_ATTN_MAX_GROUP) {
        int nq = G - h < IB_ATTN_MAX_GROUP ? G - h : IB_ATTN_MAX_GROUP;
        const float *qh = q + (size_t)h * hd;
        float *oh = out + (size_t)h * hd;
        if (d->window > 0)
            ib_attend_policy_heads(d, c->k.attn.block2, qh, nq, p.k, p.v, pos, hd, scale, c->attn_block, oh);
        else
            c->k.attn.heads_ahead(d->dtype, p.k, p.v, qh, nq, pos + 1, hd, hd, scale, c->attn_block, p.window, oh,
                                  h == 0 ? ahead : NULL);
    }
}

/* Rows r0..r1-1 (r1 - r0 <= IB_ATTN_TILE_Q / query heads per KV head, all of one session) for KV head
 * kvh of layer li, through the kernels that walk each key block once for all of them (ib_attend_rows,
 * or ib_attend_policy_rows for a sink/window ring); each row's result is attn_row's bitwise. */
static void attn_rows(cpu_backend *c, int li, int r0, int r1, int kvh) {
    const ib_config *mc = &c->model->cfg;
    const ib_layer *L = &c->model->layers[li];
    int H = mc->n_heads, KVH = L->kvh, hd = L->hd, G = H / KVH, h0 = kvh * G, nr = r1 - r0;
    const attn_planes p = planes_of(c, li, r0, kvh);
    const ib_kv_desc *d = &p.d;
    const float *q = c->buf[IB_BUF_Q] + ((size_t)r0 * H + h0) * hd;   /* row t's heads at q + t*H*hd */
    float *out = c->buf[IB_BUF_ATT] + ((size_t)r0 * H + h0) * hd;
    const int gemma = mc->arch == IB_ARCH_GEMMA4;
    float scale = gemma ? 1.0f : 1.0f / sqrtf((float)hd);
    int n_keys[IB_ATTN_TILE_Q];   /* [nr] */
    for (int t = 0; t < nr; t++) n_keys[t] = c->pos[r0 + t] + 1;
    for (int h = 0; h < G; h += IB_ATTN_MAX_GROUP) {
        int nq = G - h < IB_ATTN_MAX_GROUP ? G - h : IB_ATTN_MAX_GROUP;
        if (d->window > 0)
            ib_attend_policy_rows(d, c->k.attn.block2, q + (size_t)h * hd, (size_t)H * hd, nq, nr, c->pos + r0, p.k, p.v,
                                  hd, scale, c->attn_block, out + (size_t)h * hd, (size_t)H * hd);
        else
            c->k.attn.rows(d->dtype, q + (size_t)h * hd, (size_t)H * hd, nq, nr, n_keys, p.k, p.v, hd,
                           hd, scale, c->attn_block, p.window, out + (size_t)h * hd, (size_t)H * hd);
    }
}

/* One task = one (row, KV head), or (tile > 1) one KV head for a tile of consecutive rows: each run of
 * rows of one session in it goes through attn_rows (a run of one row through attn_row). */
static void attn_task(void *ctx, int task, int thread) {
    attn_job *j = ctx;
    cpu_backend *c = j->c;
    const int KVH = c->model->layers[j->li].kvh;
    if (j->tile == 1) {
        /* a thread takes its tasks in ascending order (pool.h): the next one's keys and values come
         * in while this one runs (decode reads each task's few dozen KB from memory) */
        ib_attn_ahead a;
        const int next = task + 1, ok = next < c->R * KVH && attn_ahead_of(c, j->li, next / KVH, next % KVH, &a);
        attn_row(c, j->li, task / KVH, task % KVH, ok ? &a : NULL);
        return;
    }
    const int kvh = task / j->n_tiles, r0 = task % j->n_tiles * j->tile;
    const int r_end = r0 + j->tile < c->R ? r0 + j->tile : c->R;
    for (int a = r0, b; a < r_end; a = b) {
        for (b = a + 1; b < r_end && c->row_item[b] == c->row_item[a];) b++;
        if (b - a > 1) attn_rows(c, j->li, a, b, kvh);
        else attn_row(c, j->li, a, kvh, NULL);
    }
}

static void cpu_attention(ib_backend *b, int li) {
    cpu_backend *c = cb(b);
    const ib_config *mc = &c->model->cfg;
    /* multiply-adds of one layer's attention: every row's query against its keys, scores and values */
    double work = 0;
    const ib_layer *L = &c->model->layers[li];
    for (int r = 0; r < c->R; r++) work += 2.0 * (c->pos[r] + 1) * mc->n_heads * L->hd;
    /* tiles of rows when some session brings several rows (a prefill chunk); one row a task otherwise */
    const int G = mc->n_heads / L->kvh, nq = G < IB_ATTN_MAX_GROUP ? G : IB_ATTN_MAX_GROUP;
    int tile = 1;
    for (int r = 1; r < c->R && tile == 1; r++)
        if (c->row_item[r] == c->row_item[r - 1]) tile = IB_ATTN_TILE_Q / nq;
    attn_job j = {c, li, tile, (c->R + tile - 1) / tile};
    ib_pool_run(work < IB_MIN_PARALLEL_MACS ? NULL : c->pool, tile == 1 ? c->R * L->kvh : j.n_tiles * L->kvh,
                attn_task, &j);
}

typedef struct {
    float *g;
    const float *u;   /* [R][F] each */
    int F;
} swiglu_job;

static void swiglu_task(void *ctx, int r, int thread) {
    swiglu_job *j = ctx;
    ib_swiglu(j->g + (size_t)r * j->F, j->u + (size_t)r * j->F, 1, j->F);
}

static void cpu_swiglu(ib_backend *b) {
    cpu_backend *c = cb(b);
    int F = c->model->cfg.intermediate_size;
    swiglu_job j = {c->buf[IB_BUF_G], c->buf[IB_BUF_U], F};
    ib_pool_run(rows_pool(c, (double)c->R * F), c->R, swiglu_task, &j);
}

static void geglu_task(void *ctx, int r, int thread) {
    swiglu_job *j = ctx;
    ib_geglu(j->g + (size_t)r * j->F, j->u + (size_t)r * j->F, 1, j->F);
}

static void cpu_geglu(ib_backend *b, int li) {
    cpu_backend *c = cb(b);
    int F = ib_config_layer_ffn(&c->model->cfg, li);   /* rows of G and U packed at the layer's F */
    swiglu_job j = {c->buf[IB_BUF_G], c->buf[IB_BUF_U], F};
    ib_pool_run(rows_pool(c, (double)c->R * F), c->R, geglu_task, &j);
}

/* Gemma 4's routed experts (backend.h `moe`). Routing and combine are each row's own; the experts
 * run one after another, each on the rows routed to it (gathered in ascending row order), so each
 * expert's matrices are streamed once per step. Rows never routed to an expert cost it nothing. */
static void cpu_moe(ib_backend *b, int li, ib_buf route_in, ib_buf in, ib_buf out) {
    cpu_backend *c = cb(b);
    const ib_model *m = c->model;
    const ib_config *mc = &m->cfg;
    const ib_layer *L = &m->layers[li];
    const int R = c->R, D = mc->hidden_size, E = mc->n_experts, K = mc->top_k, Fm = mc->moe_ffn;
    const ib_fault fault = ib_fault_get();
    /* router: rmsnorm with router.scale, times 1/sqrt(D), the product with router.proj */
    ib_rmsnorm(c->buf[route_in], L->router_scale, R, D, (float)mc->rms_eps, c->moe_rin, c->pool);
    ib_scale(c->moe_rin, (size_t)R * D, (float)(1.0 / sqrt((double)D)));
    linear_many(c, 1, (const ib_matrix *const[]){&L->w_router}, c->moe_rin, R, &c->moe_logit);
    for (int r = 0; r < R; r++)
        if (ib_moe_route(c->moe_logit + (size_t)r * E, E, K, L->expert_scale, c->moe_p, c->moe_sel + (size_t)r * K,
                         c->moe_w + (size_t)r * K))
            for (int j = 0; j < K; j++) c->moe_sel[(size_t)r * K + j] = -1; /* NaN logits: no expert */
    if (fault == IB_FAULT_MOE_CAPACITY) ib_moe_fault_capacity(c->moe_sel, R * K, E);   /* test-only */
    /* the order the experts run in: ascending id — or, under the test-only combine-by-load fault, the
     * busiest of this step first (then each output is added to its row as its expert finishes) */
    int order[IB_CONFIG_MAX_EXPERTS], load[IB_CONFIG_MAX_EXPERTS];
    ib_moe_loads(c->moe_sel, R * K, E, load);
    const int by_load = fault == IB_FAULT_MOE_COMBINE_BY_LOAD;
    if (by_load) {
        ib_moe_fault_load_order(load, E, order);
        memset(c->buf[out], 0, (size_t)R * D * sizeof(float));
    } else {
        for (int e = 0; e < E; e++) order[e] = e;
    }
    for (int oi = 0; oi < E; oi++) {
        const int e = order[oi];
        if (load[e] == 0) continue;
        int n = 0;
        for (int r = 0; r < R; r++)
            for (int j = 0; j < K; j++)
                if (c->moe_sel[(size_t)r * K + j] == e) {
                    c->moe_rows[n] = r;
                    c->moe_slot[n++] = r * K + j;
                }
        for (int i = 0; i < n; i++)
            memcpy(c->moe_x + (size_t)i * D, c->buf[in] + (size_t)c->moe_rows[i] * D, (size_t)D * sizeof(float));
        const ib_matrix *gu[2] = {&L->e_gate[e], &L->e_up[e]};
        float *gy[2] = {c->moe_g, c->moe_u};
        linear_many(c, 2, gu, c->moe_x, n, gy);
        ib_geglu(c->moe_g, c->moe_u, n, Fm);
        float *yd = c->moe_x; /* the gathered inputs are spent: the down product's rows go there */
        linear_many(c, 1, (const ib_matrix *const[]){&L->e_down[e]}, c->moe_g, n, &yd);
        for (int i = 0; i < n; i++) {
            const float *y = yd + (size_t)i * D;
            if (by_load) {
                float w = c->moe_w[c->moe_slot[i]], *o = c->buf[out] + (size_t)c->moe_rows[i] * D;
                for (int d = 0; d < D; d++) o[d] = o[d] + w * y[d];
            } else {
                memcpy(c->moe_y + (size_t)c->moe_slot[i] * D, y, (size_t)D * sizeof(float));
            }
        }
    }
    if (!by_load)
        for (int r = 0; r < R; r++)
            ib_moe_combine(c->moe_y + (size_t)r * K * D, c->moe_w + (size_t)r * K, c->moe_sel + (size_t)r * K, K, D,
                           c->buf[out] + (size_t)r * D);
}

/* Gemma 4's per-layer inputs of the step's rows (backend.h `ple_inputs`). */
static void cpu_ple_inputs(ib_backend *b) {
    cpu_backend *c = cb(b);
    const ib_model *m = c->model;
    const ib_config *mc = &m->cfg;
    const int R = c->R, D = mc->hidden_size, P = mc->ple_dim, L = mc->n_layers;
    const size_t LP = (size_t)L * P;
    linear_many(c, 1, (const ib_matrix *const[]){&m->ple_model_proj}, c->buf[IB_BUF_X], R, &c->ple_in);
    ib_scale(c->ple_in, (size_t)R * LP, (float)(1.0 / sqrt((double)D)));
    ib_rmsnorm(c->ple_in, m->ple_proj_norm, R * L, P, (float)mc->rms_eps, c->ple_in, c->pool);  /* [R*L][P] */
    const int row0 = ib_fault_get() == IB_FAULT_PLE_ROW0;   /* test-only: every row reads row 0's token */
    for (int r = 0; r < R; r++) {
        ib_matrix_row_f32(&m->ple_embed, c->tok[row0 ? 0 : r], c->ple_tok);
        ib_scale(c->ple_tok, LP, m->ple_embed_scale);
        ib_add(c->ple_in + (size_t)r * LP, c->ple_tok, LP);
    }
    ib_scale(c->ple_in, (size_t)R * LP, (float)(1.0 / sqrt(2.0)));
}

/* Layer li's per-layer input block (backend.h `ple_layer`). */
static void cpu_ple_layer(ib_backend *b, int li) {
    cpu_backend *c = cb(b);
    const ib_model *m = c->model;
    const ib_config *mc = &m->cfg;
    const ib_layer *L = &m->layers[li];
    const int R = c->R, D = mc->hidden_size, P = mc->ple_dim;
    const size_t LP = (size_t)mc->n_layers * P;
    linear_many(c, 1, (const ib_matrix *const[]){&L->ple_gate}, c->buf[IB_BUF_X], R, &c->ple_g);   /* [R][P] */
    for (int r = 0; r < R; r++) ib_geglu(c->ple_g + (size_t)r * P, c->ple_in + (size_t)r * LP + (size_t)li * P, 1, P);
    linear_many(c, 1, (const ib_matrix *const[]){&L->ple_proj}, c->ple_g, R, &c->ple_y);           /* [R][D] */
    ib_rmsnorm(c->ple_y, L->ple_norm, R, D, (float)mc->rms_eps, c->ple_y, c->pool);
    ib_add(c->buf[IB_BUF_X], c->ple_y, (size_t)R * D);
}

static void cpu_scale_layer(ib_backend *b, int li) {
    cpu_backend *c = cb(b);
    ib_scale(c->buf[IB_BUF_X], (size_t)c->R * c->model->cfg.hidden_size, c->model->layers[li].layer_scalar);
}

typedef struct {
    float *x;
    const float *y;
    size_t n;   /* elements of x and y */
} add_job;

/* Task t of an add_job: x += y over elements [t * ADD_TASK_ELEMS, …) (elementwise: any split gives the
 * same bits). */
#define ADD_TASK_ELEMS 16384
static void add_task(void *ctx, int t, int thread) {
    const add_job *j = ctx;
    const size_t i0 = (size_t)t * ADD_TASK_ELEMS, n = j->n - i0 < ADD_TASK_ELEMS ? j->n - i0 : ADD_TASK_ELEMS;
    ib_add(j->x + i0, j->y + i0, n);
}

/* x += y over the step's rows, split over the pool in ADD_TASK_ELEMS pieces when there are several
 * (one thread reads a prefill's two residual buffers at a fraction of the machine's bandwidth). */
static void cpu_add(ib_backend *b, ib_buf x, ib_buf y) {
    cpu_backend *c = cb(b);
    add_job j = {c->buf[x], c->buf[y], (size_t)c->R * c->model->cfg.hidden_size};
    ib_pool_run(c->pool, (int)((j.n + ADD_TASK_ELEMS - 1) / ADD_TASK_ELEMS), add_task, &j);
}

typedef struct {
    cpu_backend *c;
    float *lg;   /* the product's rows [np][V] */
    int i0;      /* the first of them among the step's wanted rows */
} logit_job;

/* Wanted row i0 + j after the lm_head product: soft-capped where the model says, copied to its
 * destination and/or its ib_argmax taken. Each row's work is its own. */
static void logit_task(void *ctx, int j, int thread) {
    const logit_job *lj = ctx;
    cpu_backend *c = lj->c;
    const ib_config *mc = &c->model->cfg;
    const int V = mc->vocab_size;
    float *row = lj->lg + (size_t)j * V, *dst = c->logits_out[lj->i0 + j];
    if (mc->final_softcap > 0) ib_softcap(row, (size_t)V, (float)mc->final_softcap);
    if (dst && dst != row) memcpy(dst, row, (size_t)V * sizeof(float));
    if (c->argmax_out[lj->i0 + j]) *c->argmax_out[lj->i0 + j] = ib_argmax(row, V);
}

/* The wanted rows' logits: XN[j] = final norm of X[logit_row[j]], then the lm_head product up to
 * logit_rows rows at a time, then each row's logit_task, the rows of a product over the pool. A lone
 * row with a destination goes straight into it (no copy of the vocabulary). */
static void cpu_logits(ib_backend *b) {
    cpu_backend *c = cb(b);
    const ib_model *m = c->model;
    const ib_config *mc = &m->cfg;
    int D = mc->hidden_size;
    float *xn = c->buf[IB_BUF_XN];
    for (int j = 0; j < c->n_logits; j++)
        memcpy(xn + (size_t)j * D, c->buf[IB_BUF_X] + (size_t)c->logit_row[j] * D, (size_t)D * sizeof(float));
    ib_rmsnorm(xn, m->final_norm, c->n_logits, D, (float)mc->rms_eps, xn, c->pool);
    for (int i0 = 0; i0 < c->n_logits; i0 += c->logit_rows) {
        int np = c->n_logits - i0 < c->logit_rows ? c->n_logits - i0 : c->logit_rows;
        float *lg = np == 1 && c->logits_out[i0] ? c->logits_out[i0] : c->logits;
        linear_many(c, 1, &m->lm_head, xn + (size_t)i0 * D, np, &lg);
        logit_job lj = {c, lg, i0};
        ib_pool_run(np > 1 ? c->pool : NULL, np, logit_task, &lj);
    }
}

static ib_status cpu_step_end(ib_backend *b, ib_error *err) { return IB_OK; }

static const float *cpu_read_rows(ib_backend *b, ib_buf buf, int R, int width) { return cb(b)->buf[buf]; }

static const float *cpu_read_ple_inputs(ib_backend *b, int R) { return cb(b)->ple_in; }

static void cpu_write_rows(ib_backend *b, ib_buf buf, int R, int width, const float *x) {
    memcpy(cb(b)->buf[buf], x, (size_t)R * width * sizeof(float));
}

const ib_backend_ops ib_backend_cpu = {
    .name = "cpu",
    .kind = IB_BACKEND_CPU,
    .available = NULL,
    .kv_dtypes = 1u << IB_KV_F32 | 1u << IB_KV_F16 | 1u << IB_KV_Q8,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .kv_create = cpu_kv_create,
    .kv_free = cpu_kv_free,
    .kv_copy = cpu_kv_copy,
    .step_begin = cpu_step_begin,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .linear = cpu_linear,
    .qk_prepare = cpu_qk_prepare,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .moe = cpu_moe,
    .scale_layer = cpu_scale_layer,
    .add = cpu_add,
    .logits = cpu_logits,
    .step_end = cpu_step_end,
    .read_rows = cpu_read_rows,
    .write_rows = cpu_write_rows,
    .ple_inputs = cpu_ple_inputs,
    .ple_layer = cpu_ple_layer,
    .read_ple_inputs = cpu_read_ple_inputs,
};
