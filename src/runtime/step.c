/*
 * step.c — the batched step: one forward pass over the new tokens of many sessions.
 *
 * Rows are the new tokens of all items, item after item. Each weight matrix is streamed once for all
 * rows (ib_matmul); attention reads each row's own session cache up to that row's own position.
 * Nothing here depends on how many rows there are or which row a token occupies, which is what makes
 * a session's logits independent of its batch.
 */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/half.h"
#include "ops/ops.h"
#include "runtime/kv_policy.h"
#include "runtime/runtime.h"

/* A step's rows are split over the pool for the per-row work between products (head norms, rotary
 * embedding, KV store, SwiGLU, activation quantization) when they hold at least this many elements in
 * all; below it, waking the workers costs more than the work saves. Only speed depends on it. */
#define ROW_JOB_MIN_ELEMS 8192

static ib_pool *rows_pool(const ib_engine *e, double elems) { return elems >= ROW_JOB_MIN_ELEMS ? e->pool : NULL; }

typedef struct {
    ib_engine *e;
    const float *X;   /* [R][K] */
    int K, G;
} quant_job;

static void quant_task(void *ctx, int r, int thread) {
    quant_job *j = ctx;
    ib_act_buf *qa = &j->e->qa;
    const size_t ng = (size_t)(j->K / j->G);
    ib_quantize_act(j->X + (size_t)r * j->K, 1, j->K, j->G, qa->xq + (size_t)r * j->K, qa->d + (size_t)r * ng,
                    qa->ad + (size_t)r * ng);
}

/* The engine's Q8 activations of X [R][K] for weight group G, row by row (each row's own numbers). */
static void quantize(ib_engine *e, const float *X, int R, int K, int G) {
    quant_job j = {e, X, K, G};
    ib_pool_run(rows_pool(e, (double)R * K), R, quant_task, &j);
}

/* Y[R][N] = X[R][K] · W^T under the engine's activation mode. */
static void linear(ib_engine *e, const ib_matrix *w, const float *X, int R, float *Y) {
    ib_act act = e->act;
    if (w->fmt == IB_WF32) act = IB_ACT_F32;
    if (act == IB_ACT_Q8) quantize(e, X, R, w->cols, w->group);
    ib_matmul(w, X, R, &e->qa, act, e->isa, e->pool, Y, w->rows);
}

/* Ys[i][R][N_i] = X[R][K] · W_i^T for products that read the same X, in one pool job. Under Q8
 * activations X is quantized once, with the group of the first quantized W_i (the products of one
 * layer input share it). */
static void linear_many(ib_engine *e, int n, const ib_matrix *const *ws, const float *X, int R, float *const *Ys) {
    if (e->act == IB_ACT_Q8)
        for (int i = 0; i < n; i++)
            if (ws[i]->fmt != IB_WF32) {
                quantize(e, X, R, ws[i]->cols, ws[i]->group);
                break;
            }
    ib_matmul_many(n, ws, X, R, &e->qa, e->act, e->isa, e->pool, Ys);
}

/* Copy row r's keys and values into its session's cache for layer li. */
static void store_kv_row(ib_engine *e, ib_step_item *items, int r, int li) {
    const ib_config *c = &e->model->cfg;
    int KVH = c->n_kv_heads, hd = c->head_dim;
    ib_session *s = items[e->row_item[r]].session;
    size_t slot = (size_t)ib_kv_slot(s, e->pos[r]);
    for (int h = 0; h < KVH; h++) {
        size_t ko = ib_kv_offset(s, li, 0, h) + slot * hd, vo = ib_kv_offset(s, li, 1, h) + slot * hd;
        const float *kr = e->k + ((size_t)r * KVH + h) * hd, *vr = e->v + ((size_t)r * KVH + h) * hd;
        if (s->kv_f16) {
            uint16_t *kd = (uint16_t *)s->kv + ko, *vd = (uint16_t *)s->kv + vo;
            ib_f32_to_f16_rows(kr, kd, hd);
            ib_f32_to_f16_rows(vr, vd, hd);
        } else {
            memcpy((float *)s->kv + ko, kr, hd * sizeof(float));
            memcpy((float *)s->kv + vo, vr, hd * sizeof(float));
        }
    }
}

enum { QK_NORM = 1, QK_ROPE_STORE = 2 };

typedef struct {
    ib_engine *e;
    ib_step_item *items;
    const ib_layer *L;
    int li, R, n_items;
    int phases;   /* QK_NORM and/or QK_ROPE_STORE */
} qk_job;

/* Row task between the q/k/v products and attention: the row's q and k head norms (QK_NORM), then
 * its rotary embedding and KV store (QK_ROPE_STORE). Every operation is the row's own, so how rows
 * are split over threads changes nothing. */
static void qk_task(void *ctx, int r, int thread) {
    qk_job *j = ctx;
    ib_engine *e = j->e;
    const ib_config *c = &e->model->cfg;
    const int H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim;
    if ((j->phases & QK_NORM) && j->L->q_norm) {
        ib_rmsnorm_heads(e->q + (size_t)r * H * hd, j->L->q_norm, 1, H, hd, (float)c->rms_eps, e->pool);
        ib_rmsnorm_heads(e->k + (size_t)r * KVH * hd, j->L->k_norm, 1, KVH, hd, (float)c->rms_eps, e->pool);
    }
    if (j->phases & QK_ROPE_STORE) {
        ib_rope_step_rows(e->q, r, r + 1, j->R, H, hd, e->cs, j->n_items);
        ib_rope_step_rows(e->k, r, r + 1, j->R, KVH, hd, e->cs, j->n_items);
        store_kv_row(e, j->items, r, j->li);
    }
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

typedef struct {
    ib_engine *e;
    ib_step_item *items;
    int li;
    int block;
} attn_job;

/* One task = one (row, KV head): attend the row's query heads of that KV head's group to keys
 * 0..pos of its session (each head's result as ib_attend_one's). */
static void attn_task(void *ctx, int task, int thread) {
    attn_job *j = ctx;
    ib_engine *e = j->e;
    const ib_config *c = &e->model->cfg;
    int H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, G = H / KVH;
    int r = task / KVH, kvh = task % KVH, h0 = kvh * G;
    ib_session *s = j->items[e->row_item[r]].session;
    size_t eb = ib_kv_elem_bytes(s);
    const void *kl = (const char *)s->kv + ib_kv_offset(s, j->li, 0, kvh) * eb;
    const void *vl = (const char *)s->kv + ib_kv_offset(s, j->li, 1, kvh) * eb;
    const float *q = e->q + ((size_t)r * H + h0) * hd;
    float *out = e->att + ((size_t)r * H + h0) * hd;
    float scale = 1.0f / sqrtf((float)hd);
    if (s->kv_window > 0) {
        for (int h = 0; h < G; h += IB_ATTN_MAX_GROUP) {
            int nq = G - h < IB_ATTN_MAX_GROUP ? G - h : IB_ATTN_MAX_GROUP;
            ib_attend_policy_heads(s, e->isa, q + (size_t)h * hd, nq, kl, vl, e->pos[r], hd, scale, j->block,
                                   out + (size_t)h * hd);
        }
        return;
    }
    for (int h = 0; h < G; h += IB_ATTN_MAX_GROUP) {
        int nq = G - h < IB_ATTN_MAX_GROUP ? G - h : IB_ATTN_MAX_GROUP;
        if (s->kv_f16)
            ib_attend_heads_f16_isa(e->isa, kl, vl, q + (size_t)h * hd, nq, e->pos[r] + 1, hd, hd, scale, j->block, 0,
                                    out + (size_t)h * hd);
        else
            ib_attend_heads_isa(e->isa, q + (size_t)h * hd, nq, kl, vl, e->pos[r] + 1, hd, hd, scale, j->block, 0,
                                out + (size_t)h * hd);
    }
}

/* Diagnostics: hand rows [R][n] of capture point `point` to the engine's capture hook. */
static void capture_rows(const ib_engine *e, int layer, const char *point, const float *x, int R, int n) {
    for (int r = 0; r < R; r++) e->capture(e->capture_ctx, layer, point, r, x + (size_t)r * n, n);
}
#define CAPTURE(layer, point, x, n) \
    do { if (e->capture) capture_rows(e, layer, point, x, R, n); } while (0)

/* Check the items before anything is changed. */
static ib_status validate(ib_engine *e, ib_step_item *items, int n, int *R_out, ib_error *err) {
    const ib_config *c = &e->model->cfg;
    if (n < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "step: no items");
    long R = 0;
    ib_status rc = IB_OK;
    int i = 0;
    for (; i < n; i++) {
        ib_step_item *it = &items[i];
        if (!it->session || !it->tokens || it->n_tokens < 1) {
            rc = ib_fail(err, IB_ERR_INVALID_ARG, "step: item %d: needs a session and at least one token", i);
            break;
        }
        if (it->session->model != e->model) {
            rc = ib_fail(err, IB_ERR_INVALID_ARG, "step: item %d: session belongs to another model", i);
            break;
        }
        if (it->session->in_step) {
            rc = ib_fail(err, IB_ERR_STATE, "step: item %d: session listed twice", i);
            break;
        }
        it->session->in_step = 1;
        if (it->session->kv_window > 0 && it->n_tokens > it->session->kv_chunk) {
            rc = ib_fail(err, IB_ERR_INVALID_ARG, "step: item %d: %d tokens exceed the windowed session's kv_chunk %d", i,
                         it->n_tokens, it->session->kv_chunk);
            i++;
            break;
        }
        if (it->session->pos + it->n_tokens > ib_session_capacity(it->session)) {
            rc = ib_fail(err, IB_ERR_CONTEXT, "step: item %d: %d + %d tokens exceed the session context of %d", i,
                         it->session->pos, it->n_tokens, ib_session_capacity(it->session));
            i++;
            break;
        }
        for (int t = 0; t < it->n_tokens; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= c->vocab_size) {
                rc = ib_fail(err, IB_ERR_INVALID_ARG, "step: item %d: token %d is %d, outside the vocabulary [0, %d)",
                             i, t, it->tokens[t], c->vocab_size);
                break;
            }
        if (rc) {
            i++;
            break;
        }
        R += it->n_tokens;
    }
    for (int j = 0; j < i && j < n; j++)
        if (items[j].session) items[j].session->in_step = 0;
    if (rc) return rc;
    if (R > e->max_tokens)
        return ib_fail(err, IB_ERR_INVALID_ARG, "step: %ld tokens exceed the engine's max_step_tokens %d", R,
                       e->max_tokens);
    *R_out = (int)R;
    return IB_OK;
}

ib_status ib_step(ib_engine *e, ib_step_item *items, int n, ib_error *err) {
    int R = 0;
    ib_status rc = validate(e, items, n, &R, err);
    if (rc) return rc;
    const ib_model *m = e->model;
    const ib_config *c = &m->cfg;
    int D = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, F = c->intermediate_size;
    float eps = (float)c->rms_eps;

    /* rows: tokens, positions, owners */
    int r = 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < items[i].n_tokens; t++, r++) {
            e->tok[r] = items[i].tokens[t];
            e->pos[r] = items[i].session->pos + t;
            e->row_item[r] = i;
        }
    for (int i = 0; i < n; i++) e->item_len[i] = items[i].n_tokens;
    ib_rope_positions(e->pos, e->item_len, n, e->rope_pos);
    ib_rope_table(e->rope_pos, R, hd, c->rope_theta, e->cs);
    for (r = 0; r < R; r++) ib_matrix_row_f32(&m->embed, e->tok[r], e->x + (size_t)r * D);

    attn_job aj = {e, items, 0, ib_attn_block_for(n)};
    /* multiply-adds of one layer's attention: every row's query against its keys, scores and values */
    double attn_work = 0;
    for (int rr = 0; rr < R; rr++) attn_work += 2.0 * (e->pos[rr] + 1) * H * hd;
    for (int li = 0; li < c->n_layers; li++) {
        const ib_layer *L = &m->layers[li];
        /* attention */
        CAPTURE(li, "layer_in", e->x, D);
        ib_rmsnorm(e->x, L->attn_norm, R, D, eps, e->xn, e->pool);
        CAPTURE(li, "attn_norm", e->xn, D);
        {
            const ib_matrix *ws[3] = {&L->wq, &L->wk, &L->wv};
            float *ys[3] = {e->q, e->k, e->v};
            linear_many(e, 3, ws, e->xn, R, ys);
        }
        CAPTURE(li, "q_proj", e->q, H * hd);
        CAPTURE(li, "k_proj", e->k, KVH * hd);
        CAPTURE(li, "v", e->v, KVH * hd);
        {
            /* head norms, rotary embedding and KV store, row by row (in two jobs when captured) */
            qk_job qj = {e, items, L, li, R, n, QK_NORM | QK_ROPE_STORE};
            ib_pool *rp = rows_pool(e, (double)R * (H + 2 * KVH) * hd);
            if (e->capture) {
                qj.phases = QK_NORM;
                ib_pool_run(rp, R, qk_task, &qj);
                if (L->q_norm) {
                    CAPTURE(li, "q_norm", e->q, H * hd);
                    CAPTURE(li, "k_norm", e->k, KVH * hd);
                }
                qj.phases = QK_ROPE_STORE;
            }
            ib_pool_run(rp, R, qk_task, &qj);
        }
        CAPTURE(li, "q", e->q, H * hd);
        CAPTURE(li, "k", e->k, KVH * hd);
        aj.li = li;
        ib_pool_run(attn_work < IB_MIN_PARALLEL_MACS ? NULL : e->pool, R * KVH, attn_task, &aj);
        CAPTURE(li, "attn_out", e->att, H * hd);
        linear(e, &L->wo, e->att, R, e->o);
        CAPTURE(li, "attn_proj", e->o, D);
        ib_add(e->x, e->o, (size_t)R * D);
        /* MLP */
        ib_rmsnorm(e->x, L->mlp_norm, R, D, eps, e->xn, e->pool);
        CAPTURE(li, "mlp_norm", e->xn, D);
        {
            const ib_matrix *ws[2] = {&L->w_gate, &L->w_up};
            float *ys[2] = {e->g, e->u};
            linear_many(e, 2, ws, e->xn, R, ys);
        }
        CAPTURE(li, "gate", e->g, F);
        CAPTURE(li, "up", e->u, F);
        {
            swiglu_job sj = {e->g, e->u, F};
            ib_pool_run(rows_pool(e, (double)R * F), R, swiglu_task, &sj);
        }
        CAPTURE(li, "mlp_act", e->g, F);
        linear(e, &L->w_down, e->g, R, e->o);
        CAPTURE(li, "mlp_out", e->o, D);
        ib_add(e->x, e->o, (size_t)R * D);
        CAPTURE(li, "layer_out", e->x, D);
    }

    /* logits of each item's last row, IB_LOGIT_ROWS at a time */
    int V = c->vocab_size;
    int pending[IB_LOGIT_ROWS], pending_row[IB_LOGIT_ROWS], np = 0, last_row = -1;
    for (int i = 0; i < n; i++) {
        last_row += items[i].n_tokens;
        if (items[i].logits) {
            memcpy(e->last + (size_t)np * D, e->x + (size_t)last_row * D, (size_t)D * sizeof(float));
            pending_row[np] = last_row;
            pending[np++] = i;
        }
        if (np == IB_LOGIT_ROWS || (i == n - 1 && np > 0)) {
            ib_rmsnorm(e->last, m->final_norm, np, D, eps, e->last, e->pool);
            /* one row goes straight to its item (no copy of V floats); several, through e->logits */
            float *lg = np == 1 ? items[pending[0]].logits : e->logits;
            linear(e, m->lm_head, e->last, np, lg);
            for (int j = 0; e->capture && j < np; j++)
                e->capture(e->capture_ctx, c->n_layers, "final_norm", pending_row[j], e->last + (size_t)j * D, D);
            for (int j = 0; e->capture && j < np; j++)
                e->capture(e->capture_ctx, c->n_layers, "logits", pending_row[j], lg + (size_t)j * V, V);
            for (int j = 0; j < np && lg == e->logits; j++)
                memcpy(items[pending[j]].logits, e->logits + (size_t)j * V, (size_t)V * sizeof(float));
            np = 0;
        }
    }
    for (int i = 0; i < n; i++) items[i].session->pos += items[i].n_tokens;
    return IB_OK;
}
