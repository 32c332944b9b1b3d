/*
 * engine.c — engine creation: the one place the backend, the ISA, the activation mode and profiling
 * are decided, the host thread pool, the backend instance (behind the profiling wrapper when asked)
 * and the per-step host arrays, sized once so a step allocates nothing.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/cpu/cpu.h"
#include "backends/profile.h"
#include "core/error.h"
#include "runtime/runtime.h"

#define DEFAULT_STEP_TOKENS 512

void ib_engine_free(ib_engine *e) {
    if (!e) return;
    if (e->be) e->be->ops->destroy(e->be);
    ib_pool_free(e->pool);
    free(e->tok);
    free(e->pos);
    free(e->rope_pos);
    free(e->row_item);
    free(e->item_len);
    free(e->item_kv);
    free(e->logit_row);
    free(e->logit_out);
    free(e->argmax_out);
    free(e);
}

ib_status ib_engine_create(const ib_model *m, const ib_engine_opts *opts, ib_engine **out, ib_error *err) {
    *out = NULL;
    ib_engine_opts o = {0};
    if (opts) o = *opts;
    if (o.threads <= 0) { /* 0: every online CPU */
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o.threads = n < 1 ? 1 : n > IB_MAX_DEFAULT_THREADS ? IB_MAX_DEFAULT_THREADS : (int)n;
    }
    if (o.max_step_tokens <= 0) o.max_step_tokens = DEFAULT_STEP_TOKENS;
    if (o.max_step_tokens > (1 << 20))
        return ib_fail(err, IB_ERR_INVALID_ARG, "engine: max_step_tokens %d is too large", o.max_step_tokens);
    if (o.profile && o.backend != IB_BACKEND_CPU)   /* decided first: the reason holds on any machine */
        return ib_fail(err, IB_ERR_UNSUPPORTED, "profile: backend %s records a step and runs it as one graph at "
                       "step_end, so per-operation host times would be meaningless (profile the cpu backend)",
                       ib_backend_name(o.backend));
    const char *why = NULL;
    if (!ib_backend_available(o.backend, &why))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "backend %s: %s", ib_backend_name(o.backend), why);
    if ((unsigned)o.isa > IB_ISA_AMX) return ib_fail(err, IB_ERR_INVALID_ARG, "isa %d: not an ISA", (int)o.isa);
    ib_isa isa = o.isa == IB_ISA_AUTO ? ib_isa_best() : o.isa;
    if (!ib_isa_supported(isa))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "isa %s: not supported by this CPU or build", ib_isa_name(isa));
    const ib_config *c = &m->cfg;
    ib_act act = o.act;
    if (act == IB_ACT_AUTO) act = c->quant_bits ? IB_ACT_Q8 : IB_ACT_F32;
    if (act == IB_ACT_Q8 && !c->quant_bits)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "act q8: the model's weights are not quantized (use f32)");
    if (c->ple_dim > 0) { /* Gemma 4 per-layer embeddings need the backend's two ops */
        const ib_backend_ops *bo = ib_backend_ops_for(o.backend);
        if (!bo || !bo->ple_inputs || !bo->ple_layer)
            return ib_fail(err, IB_ERR_UNSUPPORTED, "backend %s: gemma4 per-layer embeddings (hidden_size_per_layer_input) "
                           "are not supported there", ib_backend_name(o.backend));
    }

    ib_engine *e = calloc(1, sizeof *e);
    if (!e) return ib_fail(err, IB_ERR_NOMEM, "engine: out of memory");
    e->model = m;
    e->isa = isa;
    e->act = act;
    e->kind = o.backend;
    e->max_tokens = o.max_step_tokens;
    ib_status rc = ib_pool_create(o.threads, &e->pool, err);
    if (rc) goto fail;
    size_t R = (size_t)o.max_step_tokens;
    e->tok = malloc(R * sizeof(int32_t));
    e->pos = malloc(R * sizeof(int32_t));
    e->rope_pos = malloc(R * sizeof(int32_t));
    e->row_item = malloc(R * sizeof(int32_t));
    e->item_len = malloc(R * sizeof(int));
    e->item_kv = malloc(R * sizeof(ib_kv *));
    e->logit_row = malloc(R * sizeof(int32_t));
    e->logit_out = malloc(R * sizeof(float *));
    e->argmax_out = malloc(R * sizeof(int32_t *));
    if (!e->tok || !e->pos || !e->rope_pos || !e->row_item || !e->item_len || !e->item_kv || !e->logit_row ||
        !e->logit_out || !e->argmax_out) {
        rc = ib_fail(err, IB_ERR_NOMEM, "engine: out of memory for %d tokens per step", o.max_step_tokens);
        goto fail;
    }
    ib_backend_cfg bc = {.isa = isa, .act = act, .max_rows = o.max_step_tokens, .pool = e->pool};
    if ((rc = ib_backend_ops_for(o.backend)->create(m, &bc, &e->be, err))) goto fail;
    if (o.profile) {
        ib_backend *timed = NULL;
        if ((rc = ib_profile_wrap(e->be, &timed, err))) goto fail;   /* e->be still the inner: freed below */
        e->be = timed;
        e->profile = 1;
    }
    *out = e;
    return IB_OK;
fail:
    ib_engine_free(e);
    return rc;
}

ib_isa ib_engine_isa(const ib_engine *e) { return e->isa; }
ib_act ib_engine_act(const ib_engine *e) { return e->act; }
ib_backend_kind ib_engine_backend(const ib_engine *e) { return e->kind; }

ib_status ib_engine_profile(const ib_engine *e, ib_step_profile *out, ib_error *err) {
    memset(out, 0, sizeof *out);
    if (!e->profile) return ib_fail(err, IB_ERR_STATE, "profile: the engine was created without profile = 1");
    ib_profile_read(e->be, out);
    return IB_OK;
}

void ib_engine_profile_reset(ib_engine *e) {
    if (e->profile) ib_profile_reset(e->be);
}
