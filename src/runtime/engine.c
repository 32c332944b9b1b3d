/*
 * engine.c — engine creation: thread pool, ISA/activation choice, and all per-step scratch, sized
 * once so a step allocates nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "core/error.h"
#include "runtime/runtime.h"

#define DEFAULT_STEP_TOKENS 512

static int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

void ib_engine_free(ib_engine *e) {
    if (!e) return;
    ib_pool_free(e->pool);
    free(e->tok);
    free(e->pos);
    free(e->rope_pos);
    free(e->row_item);
    free(e->item_len);
    free(e->x);
    free(e->xn);
    free(e->q);
    free(e->k);
    free(e->v);
    free(e->att);
    free(e->o);
    free(e->g);
    free(e->u);
    free(e->cs);
    free(e->qa.xq);
    free(e->qa.d);
    free(e->qa.ad);
    free(e->last);
    free(e->logits);
    free(e);
}

ib_status ib_engine_create(const ib_model *m, const ib_engine_opts *opts, ib_engine **out, ib_error *err) {
    *out = NULL;
    ib_engine_opts o = {0};
    if (opts) o = *opts;
    if (o.threads <= 0) o.threads = 1;
    if (o.max_step_tokens <= 0) o.max_step_tokens = DEFAULT_STEP_TOKENS;
    if (o.max_step_tokens > (1 << 20))
        return ib_fail(err, IB_ERR_INVALID_ARG, "engine: max_step_tokens %d is too large", o.max_step_tokens);
    ib_isa isa = o.isa == IB_ISA_AUTO ? ib_isa_best() : o.isa;
    if (!ib_isa_supported(isa))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "isa %s: not supported by this CPU", ib_isa_name(isa));
    const ib_config *c = &m->cfg;
    ib_act act = o.act;
    if (act == IB_ACT_AUTO) act = c->quant_bits ? IB_ACT_Q8 : IB_ACT_F32;
    if (act == IB_ACT_Q8 && !c->quant_bits)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "act q8: the model's weights are not quantized (use f32)");

    ib_engine *e = calloc(1, sizeof *e);
    if (!e) return ib_fail(err, IB_ERR_NOMEM, "engine: out of memory");
    e->model = m;
    e->isa = isa;
    e->act = act;
    e->max_tokens = o.max_step_tokens;
    ib_status rc = ib_pool_create(o.threads, &e->pool, err);
    if (rc) goto fail;
    size_t R = (size_t)o.max_step_tokens, D = c->hidden_size, hd = c->head_dim, F = c->intermediate_size;
    size_t HD = (size_t)c->n_heads * hd, KD = (size_t)c->n_kv_heads * hd;
    size_t widest = (size_t)max3((int)D, (int)F, (int)HD);
    int G = c->quant_group ? c->quant_group : 32;
    e->tok = malloc(R * sizeof(int32_t));
    e->pos = malloc(R * sizeof(int32_t));
    e->rope_pos = malloc(R * sizeof(int32_t));
    e->row_item = malloc(R * sizeof(int));
    e->item_len = malloc(R * sizeof(int));
    e->x = malloc(R * D * sizeof(float));
    e->xn = malloc(R * D * sizeof(float));
    e->q = malloc(R * HD * sizeof(float));
    e->k = malloc(R * KD * sizeof(float));
    e->v = malloc(R * KD * sizeof(float));
    e->att = malloc(R * HD * sizeof(float));
    e->o = malloc(R * (D > F ? D : F) * sizeof(float));
    e->g = malloc(R * F * sizeof(float));
    e->u = malloc(R * F * sizeof(float));
    e->cs = malloc(R * hd * sizeof(float));
    e->qa.xq = malloc(R * widest);
    e->qa.d = malloc(R * (widest / G + 1) * sizeof(float));
    e->qa.ad = malloc(R * (widest / G + 1) * sizeof(float));
    e->last = malloc((size_t)IB_LOGIT_ROWS * D * sizeof(float));
    e->logits = malloc((size_t)IB_LOGIT_ROWS * c->vocab_size * sizeof(float));
    if (!e->tok || !e->pos || !e->rope_pos || !e->row_item || !e->item_len || !e->x || !e->xn || !e->q || !e->k || !e->v ||
        !e->att || !e->o || !e->g || !e->u || !e->cs || !e->qa.xq || !e->qa.d || !e->qa.ad || !e->last ||
        !e->logits) {
        rc = ib_fail(err, IB_ERR_NOMEM, "engine: out of memory for %d tokens per step", o.max_step_tokens);
        goto fail;
    }
    *out = e;
    return IB_OK;
fail:
    ib_engine_free(e);
    return rc;
}

ib_isa ib_engine_isa(const ib_engine *e) { return e->isa; }
ib_act ib_engine_act(const ib_engine *e) { return e->act; }
