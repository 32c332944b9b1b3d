/*
 * step.c — the batched step: one forward pass over the new tokens of many sessions.
 *
 * Rows are the new tokens of all items, item after item. The pass is a sequence of calls into the
 * engine's backend (backends/backend.h): each weight matrix is streamed once for all rows; attention
 * reads each row's own session cache up to that row's own position.
 * Nothing here depends on how many rows there are or which row a token occupies, which is what makes
 * a session's logits independent of its batch.
 */
#include <string.h>

#include "core/error.h"
#include "ops/ops.h"
#include "runtime/kv_policy.h"
#include "runtime/runtime.h"

/* Diagnostics: hand rows [R][n] of buffer `buf` (capture point `point`) to the engine's capture hook. */
static void capture_rows(const ib_engine *e, int layer, const char *point, ib_buf buf, int R, int n) {
    const float *x = e->be->ops->read_rows(e->be, buf, R, n);
    for (int r = 0; r < R; r++) e->capture(e->capture_ctx, layer, point, r, x + (size_t)r * n, n);
}
#define CAPTURE(layer, point, buf, n) \
    do { if (e->capture) capture_rows(e, layer, point, buf, R, n); } while (0)

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
        if (it->session->kv->kind != e->kind) {
            rc = ib_fail(err, IB_ERR_INVALID_ARG, "step: item %d: the session's KV cache is on backend %s, the engine's is %s",
                         i, ib_backend_name(it->session->kv->kind), ib_backend_name(e->kind));
            break;
        }
        if (it->session->in_step) {
            rc = ib_fail(err, IB_ERR_STATE, "step: item %d: session listed twice", i);
            break;
        }
        it->session->in_step = 1;
        if (it->session->kv_chunk > 0 && it->n_tokens > it->session->kv_chunk) {
            rc = ib_fail(err, IB_ERR_INVALID_ARG, "step: item %d: %d tokens exceed the session's kv_chunk %d (%s)", i,
                         it->n_tokens, it->session->kv_chunk,
                         it->session->kv_window > 0 ? "a windowed session" : "its sliding-window rings");
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

/* The products every layer sequence shares (the selector arrays are static: a backend may read them
 * after enqueueing). q, k (and v when n = 3) from the normed input. */
static void qkv_proj(ib_backend *be, int li, int n) {
    static const ib_wsel ws[3] = {IB_W_Q, IB_W_K, IB_W_V};
    static const ib_buf ys[3] = {IB_BUF_Q, IB_BUF_K, IB_BUF_V};
    be->ops->linear(be, li, n, ws, IB_BUF_XN, ys);
}

/* The attention output projection: ATT -> O. */
static void out_proj(ib_backend *be, int li) {
    static const ib_wsel w = IB_W_O;
    static const ib_buf y = IB_BUF_O;
    be->ops->linear(be, li, 1, &w, IB_BUF_ATT, &y);
}

/* The MLP's gate and up products from the normed input: XN -> G, U. */
static void gate_up_proj(ib_backend *be, int li) {
    static const ib_wsel ws[2] = {IB_W_GATE, IB_W_UP};
    static const ib_buf ys[2] = {IB_BUF_G, IB_BUF_U};
    be->ops->linear(be, li, 2, ws, IB_BUF_XN, ys);
}

/* The MLP's down product: G -> O. */
static void down_proj(ib_backend *be, int li) {
    static const ib_wsel w = IB_W_DOWN;
    static const ib_buf y = IB_BUF_O;
    be->ops->linear(be, li, 1, &w, IB_BUF_G, &y);
}

/* The layers of Qwen3 and Llama: pre-norm attention and SwiGLU MLP, each added to the residual. */
static void layers_qwen_llama(ib_engine *e, int R) {
    const ib_config *c = &e->model->cfg;
    int D = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, F = c->intermediate_size;
    ib_backend *be = e->be;
    const ib_backend_ops *ops = be->ops;
    for (int li = 0; li < c->n_layers; li++) {
        const int qk_norm = e->model->layers[li].q_norm != NULL;
        /* attention */
        CAPTURE(li, "layer_in", IB_BUF_X, D);
        ops->rmsnorm(be, IB_BUF_X, IB_N_ATTN, li, IB_BUF_XN);
        CAPTURE(li, "attn_norm", IB_BUF_XN, D);
        qkv_proj(be, li, 3);
        CAPTURE(li, "q_proj", IB_BUF_Q, H * hd);
        CAPTURE(li, "k_proj", IB_BUF_K, KVH * hd);
        CAPTURE(li, "v", IB_BUF_V, KVH * hd);
        /* head norms, rotary embedding and KV store (in two calls when captured) */
        if (e->capture) {
            ops->qk_prepare(be, li, IB_QK_NORM);
            if (qk_norm) {
                CAPTURE(li, "q_norm", IB_BUF_Q, H * hd);
                CAPTURE(li, "k_norm", IB_BUF_K, KVH * hd);
            }
            ops->qk_prepare(be, li, IB_QK_ROPE_STORE);
        } else {
            ops->qk_prepare(be, li, IB_QK_NORM | IB_QK_ROPE_STORE);
        }
        CAPTURE(li, "q", IB_BUF_Q, H * hd);
        CAPTURE(li, "k", IB_BUF_K, KVH * hd);
        ops->attention(be, li);
        CAPTURE(li, "attn_out", IB_BUF_ATT, H * hd);
        out_proj(be, li);
        CAPTURE(li, "attn_proj", IB_BUF_O, D);
        ops->add(be, IB_BUF_X, IB_BUF_O);
        /* MLP */
        ops->rmsnorm(be, IB_BUF_X, IB_N_MLP, li, IB_BUF_XN);
        CAPTURE(li, "mlp_norm", IB_BUF_XN, D);
        gate_up_proj(be, li);
        CAPTURE(li, "gate", IB_BUF_G, F);
        CAPTURE(li, "up", IB_BUF_U, F);
        ops->swiglu(be);
        CAPTURE(li, "mlp_act", IB_BUF_G, F);
        down_proj(be, li);
        CAPTURE(li, "mlp_out", IB_BUF_O, D);
        ops->add(be, IB_BUF_X, IB_BUF_O);
        CAPTURE(li, "layer_out", IB_BUF_X, D);
    }
}

/* The layers of Gemma 4 (docs/gemma4.md): per layer type its own head dim, KV heads, RoPE and
 * window; a KV-shared layer (num_kv_shared_layers) computes only its queries and attends to its source
 * layer's keys and values, stored earlier in this step; the attention output and the GeGLU MLP output
 * are normed (post-norms) before they are added; the MLP is the layer's own width (ib_config_layer_ffn);
 * with the MoE block, the routed experts' output (normed) is added to the normed MLP output before
 * the post-norm; with per-layer embeddings, the layer's per-layer input block is added after the MLP;
 * the residual is multiplied by the layer scalar at the end. */
static void layers_gemma4(ib_engine *e, int R) {
    const ib_config *c = &e->model->cfg;
    int D = c->hidden_size, H = c->n_heads;
    ib_backend *be = e->be;
    const ib_backend_ops *ops = be->ops;
    for (int li = 0; li < c->n_layers; li++) {
        const ib_layer *L = &e->model->layers[li];
        const int hd = L->hd, KVH = L->kvh, has_v = L->wv.rows > 0, own_kv = L->wk.rows > 0;
        const int F = ib_config_layer_ffn(c, li);   /* 2F on a double-wide KV-shared layer */
        CAPTURE(li, "layer_in", IB_BUF_X, D);
        ops->rmsnorm(be, IB_BUF_X, IB_N_ATTN, li, IB_BUF_XN);
        CAPTURE(li, "attn_norm", IB_BUF_XN, D);
        qkv_proj(be, li, !own_kv ? 1 : has_v ? 3 : 2);
        CAPTURE(li, "q_proj", IB_BUF_Q, H * hd);
        if (own_kv) CAPTURE(li, "k_proj", IB_BUF_K, KVH * hd);
        if (e->capture) {
            ops->qk_prepare(be, li, IB_QK_NORM);
            CAPTURE(li, "q_norm", IB_BUF_Q, H * hd);
            if (own_kv) {
                CAPTURE(li, "k_norm", IB_BUF_K, KVH * hd);
                CAPTURE(li, "v", IB_BUF_V, KVH * hd);
            }
            ops->qk_prepare(be, li, IB_QK_ROPE_STORE);
        } else {
            ops->qk_prepare(be, li, IB_QK_NORM | IB_QK_ROPE_STORE);
        }
        CAPTURE(li, "q", IB_BUF_Q, H * hd);
        if (own_kv) CAPTURE(li, "k", IB_BUF_K, KVH * hd);
        ops->attention(be, li);
        CAPTURE(li, "attn_out", IB_BUF_ATT, H * hd);
        out_proj(be, li);
        CAPTURE(li, "attn_proj", IB_BUF_O, D);
        ops->rmsnorm(be, IB_BUF_O, IB_N_POST_ATTN, li, IB_BUF_O);
        CAPTURE(li, "post_attn_norm", IB_BUF_O, D);
        ops->add(be, IB_BUF_X, IB_BUF_O);
        ops->rmsnorm(be, IB_BUF_X, IB_N_MLP, li, IB_BUF_XN);
        CAPTURE(li, "mlp_norm", IB_BUF_XN, D);
        gate_up_proj(be, li);
        CAPTURE(li, "gate", IB_BUF_G, F);
        CAPTURE(li, "up", IB_BUF_U, F);
        ops->geglu(be, li);
        CAPTURE(li, "mlp_act", IB_BUF_G, F);
        down_proj(be, li);
        CAPTURE(li, "mlp_out", IB_BUF_O, D);
        if (c->n_experts > 0) { /* the MoE block: dense and routed outputs, each normed, summed */
            ops->rmsnorm(be, IB_BUF_O, IB_N_POST_MLP1, li, IB_BUF_O);
            CAPTURE(li, "post_mlp_norm1", IB_BUF_O, D);
            ops->rmsnorm(be, IB_BUF_X, IB_N_PRE_MOE, li, IB_BUF_XN);
            CAPTURE(li, "moe_norm", IB_BUF_XN, D);
            ops->moe(be, li, IB_BUF_X, IB_BUF_XN, IB_BUF_E);
            CAPTURE(li, "moe_out", IB_BUF_E, D);
            ops->rmsnorm(be, IB_BUF_E, IB_N_POST_MOE, li, IB_BUF_E);
            CAPTURE(li, "post_moe_norm", IB_BUF_E, D);
            ops->add(be, IB_BUF_O, IB_BUF_E);
        }
        ops->rmsnorm(be, IB_BUF_O, IB_N_POST_MLP, li, IB_BUF_O);
        CAPTURE(li, "post_mlp_norm", IB_BUF_O, D);
        ops->add(be, IB_BUF_X, IB_BUF_O);
        if (c->ple_dim > 0) ops->ple_layer(be, li);   /* per-layer embeddings: the layer's own input */
        ops->scale_layer(be, li);
        CAPTURE(li, "layer_out", IB_BUF_X, D);
    }
}

ib_status ib_step(ib_engine *e, ib_step_item *items, int n, ib_error *err) {
    int R = 0;
    ib_status rc = validate(e, items, n, &R, err);
    if (rc) return rc;
    const ib_config *c = &e->model->cfg;
    int D = c->hidden_size;
    ib_backend *be = e->be;
    const ib_backend_ops *ops = be->ops;

    /* rows: tokens, positions, owners; the rows whose logits are wanted (each item's last) */
    int r = 0, n_logits = 0;
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < items[i].n_tokens; t++, r++) {
            e->tok[r] = items[i].tokens[t];
            e->pos[r] = items[i].session->pos + t;
            e->row_item[r] = i;
        }
        e->item_len[i] = items[i].n_tokens;
        e->item_kv[i] = items[i].session->kv;
        if (items[i].row_logits) { /* every row's logits; the last also as `logits` (copied below) */
            const int n_t = items[i].n_tokens;
            for (int t = 0; t < n_t; t++) {
                e->logit_row[n_logits] = r - n_t + t;
                e->argmax_out[n_logits] = t == n_t - 1 ? items[i].argmax : NULL;
                e->logit_out[n_logits++] = items[i].row_logits + (size_t)t * c->vocab_size;
            }
        } else if (items[i].logits || items[i].argmax) {
            e->logit_row[n_logits] = r - 1;
            e->argmax_out[n_logits] = items[i].argmax;
            e->logit_out[n_logits++] = items[i].logits;
        }
    }
    ib_rope_positions(e->pos, e->item_len, n, e->rope_pos);
    ib_step_desc d = {.R = R, .n_items = n, .tok = e->tok, .pos = e->pos, .rope_pos = e->rope_pos,
                      .row_item = e->row_item, .kv = e->item_kv, .attn_block = ib_attn_block_for(n),
                      .n_logits = n_logits, .logit_row = e->logit_row, .logits_out = e->logit_out,
                      .argmax_out = e->argmax_out};
    if ((rc = ops->step_begin(be, &d, err))) return rc;
    ops->embed(be);
    if (c->ple_dim > 0) ops->ple_inputs(be);
    if (c->arch == IB_ARCH_GEMMA4) layers_gemma4(e, R);
    else layers_qwen_llama(e, R);
    if (n_logits > 0) ops->logits(be);
    rc = ops->step_end(be, err);
    if (!rc && e->capture && n_logits > 0) {
        /* the final-normed rows (XN[j] for wanted row j) and their logits, by step row */
        const float *fin = ops->read_rows(be, IB_BUF_XN, n_logits, D);
        for (int j = 0; j < n_logits; j++)
            e->capture(e->capture_ctx, c->n_layers, "final_norm", e->logit_row[j], fin + (size_t)j * D, D);
        for (int j = 0; j < n_logits; j++)
            if (e->logit_out[j])
                e->capture(e->capture_ctx, c->n_layers, "logits", e->logit_row[j], e->logit_out[j], c->vocab_size);
    }
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        if (items[i].row_logits && items[i].logits)
            memcpy(items[i].logits, items[i].row_logits + (size_t)(items[i].n_tokens - 1) * c->vocab_size,
                   (size_t)c->vocab_size * sizeof(float));
        items[i].session->pos += items[i].n_tokens;
    }
    return IB_OK;
}
