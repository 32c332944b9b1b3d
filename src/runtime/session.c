/*
 * session.c — sessions: a KV cache, a position, a token history and sampling settings.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "runtime/kv_policy.h"
#include "runtime/runtime.h"


ib_sampling ib_sampling_default(void);

/* The table of the backend that will hold a session's KV: an error naming the backend when this
 * build or machine lacks it or it does not run the dtype, or the dtype is outside the enum. */
static ib_status kv_ops_for(ib_backend_kind kind, ib_kv_dtype dtype, const ib_backend_ops **out, ib_error *err) {
    const char *why = NULL;
    if ((unsigned)dtype >= IB_KV_DTYPE_COUNT)
        return ib_fail(err, IB_ERR_INVALID_ARG, "session: kv_dtype %d is not a KV element type", (int)dtype);
    if (!ib_backend_available(kind, &why))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "session: backend %s: %s", ib_backend_name(kind), why);
    *out = ib_backend_ops_for(kind);
    if (!((*out)->kv_dtypes & 1u << dtype))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "session: backend %s does not run kv_dtype %s", ib_backend_name(kind),
                       ib_kv_dtype_name(dtype));
    return IB_OK;
}

/* What a session of model m with options opts is made of: its KV cache's shape (*kd), the full layers'
 * slots (*cap, also kd->capacity), its policy (*sink, *window), the step-item bound (*chunk, 0: none) and
 * whether its sliding-window layers wrap (*ring). Refuses invalid options with a one-line message.
 * Gemma 4's sliding layers get their own shape and sliding_window + chunk - 1 slots (kv_policy.h, the
 * ring rule in backends/backend.h) when that is fewer than the positions the session can hold; under
 * the test-only kv-ring-short fault, one slot fewer. */
static ib_status session_plan(const ib_model *m, const ib_session_opts *opts, ib_kv_desc *kd, int *cap_out,
                              int *sink_out, int *window_out, int *chunk_out, int *ring_out, ib_error *err) {
    const ib_config *c = &m->cfg;
    int cap = opts && opts->max_context > 0 ? opts->max_context : c->max_position;
    if (!(opts && opts->max_context > 0) && cap > IB_SESSION_DEFAULT_CONTEXT) cap = IB_SESSION_DEFAULT_CONTEXT;
    int sink = opts ? opts->kv_sink : 0, window = opts ? opts->kv_window : 0, chunk = opts ? opts->kv_chunk : 0;
    if (sink < 0 || window < 0 || chunk < 0 || (window == 0 && sink > 0) || window > (1 << 24) || sink > (1 << 20) ||
        chunk > (1 << 20))
        return ib_fail(err, IB_ERR_INVALID_ARG, "session: KV policy sink %d window %d chunk %d is invalid", sink, window,
                       chunk);
    const int gemma = c->arch == IB_ARCH_GEMMA4;
    if (window > 0 && gemma && window < c->sliding_window)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "session: KV window %d is below the model's sliding_window %d (the "
                       "policy governs the full-attention layers; the sliding layers keep their own window)", window,
                       c->sliding_window);
    if (window > 0) cap = sink + window + (chunk > 0 ? chunk : 64);
    else if (cap > c->max_position)
        return ib_fail(err, IB_ERR_INVALID_ARG, "session: max_context %d exceeds the model's %d", cap, c->max_position);
    if (window > 0 && chunk == 0) chunk = 64;
    *kd = (ib_kv_desc){.dtype = opts ? opts->kv_dtype : IB_KV_F32, .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                       .head_dim = c->head_dim, .capacity = cap, .sink = window > 0 ? sink : 0, .window = window};
    int ring = 0;
    if (gemma) { /* full layers at the full shape, sliding layers at theirs */
        kd->n_kv_heads = c->global_kv_heads;
        kd->head_dim = c->global_head_dim;
        for (int li = 0; li < c->n_layers && li < IB_KV_MAX_LAYERS; li++) {
            if (c->layer_sliding[li]) kd->sliding[li] = 1, kd->n_sliding++;
            kd->kv_from[li] = c->kv_from[li];   /* KV-shared layers hold none of their own */
        }
    }
    if (kd->n_sliding > 0) {
        int W = c->sliding_window;
        long slots = chunk > 0 ? (long)W + chunk - 1 : (long)cap;
        if (chunk > 0 && ib_fault_get() == IB_FAULT_KV_RING_SHORT) slots--; /* test-only: one slot too small */
        if (slots < 1) slots = 1;
        ring = window > 0 || slots < cap;
        kd->sliding_kv_heads = c->n_kv_heads;
        kd->sliding_head_dim = c->head_dim;
        kd->sliding_capacity = ring ? (int)slots : cap;
        kd->sliding_window = W;
    }
    if (kd->dtype == IB_KV_Q8) {   /* its rows are whole 32-element blocks (core/kv_elem.h) */
        int bad = kd->head_dim % IB_KVQ8_BLOCK ? kd->head_dim
                  : kd->n_sliding > 0 && kd->sliding_head_dim % IB_KVQ8_BLOCK ? kd->sliding_head_dim : 0;
        if (bad)
            return ib_fail(err, IB_ERR_UNSUPPORTED, "session: kv_dtype q8 needs head dims that are multiples of %d; "
                           "this model has %d", IB_KVQ8_BLOCK, bad);
    }
    *cap_out = cap;
    *sink_out = window > 0 ? sink : 0;
    *window_out = window;
    *chunk_out = window > 0 || ring ? chunk : 0;
    *ring_out = ring;
    return IB_OK;
}

size_t ib_session_kv_bytes_for(const ib_model *m, const ib_session_opts *opts) {
    ib_kv_desc kd;
    int cap, sink, window, chunk, ring;
    if (session_plan(m, opts, &kd, &cap, &sink, &window, &chunk, &ring, NULL)) return 0;
    return ib_kv_desc_bytes(&kd);
}

ib_status ib_session_check(const ib_model *m, const ib_session_opts *opts, ib_error *err) {
    ib_kv_desc kd;
    int cap, sink, window, chunk, ring;
    const ib_backend_ops *ops;
    ib_status rc = session_plan(m, opts, &kd, &cap, &sink, &window, &chunk, &ring, err);
    return rc ? rc : kv_ops_for(opts ? opts->backend : IB_BACKEND_CPU, kd.dtype, &ops, err);
}

ib_status ib_session_create(const ib_model *m, const ib_session_opts *opts, ib_session **out, ib_error *err) {
    *out = NULL;
    const ib_config *c = &m->cfg;
    ib_kv_desc kd;
    int cap, sink, window, chunk, ring;
    ib_status rc = session_plan(m, opts, &kd, &cap, &sink, &window, &chunk, &ring, err);
    if (rc) return rc;
    ib_session *s = calloc(1, sizeof *s);
    if (!s) return ib_fail(err, IB_ERR_NOMEM, "session: out of memory");
    s->model = m;
    s->capacity = cap;
    s->kv_sink = sink;
    s->kv_window = window;
    s->kv_chunk = chunk;
    s->ring = ring;
    s->sampling = opts ? opts->sampling : ib_sampling_default();
    if ((rc = kv_ops_for(opts ? opts->backend : IB_BACKEND_CPU, kd.dtype, &s->kv_ops, err))) goto fail;
    if ((rc = s->kv_ops->kv_create(&kd, &s->kv, err))) goto fail;
    s->history = malloc(((size_t)cap + 1) * sizeof(int32_t));
    if (!s->history) {
        rc = ib_fail(err, IB_ERR_NOMEM, "session: out of memory for a history of %d tokens", cap);
        goto fail;
    }
    if ((rc = ib_sample_scratch_init(&s->scratch, c->vocab_size, err))) goto fail;
    *out = s;
    return IB_OK;
fail:
    ib_session_free(s);
    return rc;
}

void ib_session_free(ib_session *s) {
    if (!s) return;
    if (s->kv) s->kv_ops->kv_free(s->kv);
    free(s->history);
    ib_sample_scratch_free(&s->scratch);
    free(s);
}

int ib_session_position(const ib_session *s) { return s->pos; }
int ib_session_capacity(const ib_session *s) { return s->kv_window > 0 ? IB_WINDOW_MAX_POS : s->capacity; }

void ib_session_reset(ib_session *s) {
    s->pos = 0;
    s->n_history = 0;
    s->sample_step = 0;
}

void ib_session_set_sampling(ib_session *s, const ib_sampling *p) { s->sampling = *p; }

ib_status ib_session_copy(ib_session *dst, const ib_session *src, ib_error *err) {
    if (dst == src) return IB_OK;
    if (dst->model != src->model) return ib_fail(err, IB_ERR_INVALID_ARG, "session copy: sessions of different models");
    if (dst->kv_window != src->kv_window || dst->kv_sink != src->kv_sink ||
        dst->kv->desc.dtype != src->kv->desc.dtype || dst->kv->kind != src->kv->kind ||
        (src->kv_window > 0 && dst->capacity != src->capacity))
        return ib_fail(err, IB_ERR_INVALID_ARG, "session copy: sessions of different KV policies or KV types");
    if ((src->kv_window == 0 && src->pos > dst->capacity) || src->n_history > dst->capacity + 1)
        return ib_fail(err, IB_ERR_CONTEXT, "session copy: %d tokens do not fit a capacity of %d", src->pos, dst->capacity);
    /* sliding-window rings: a position's slot is pos % slots, so rings of different sizes agree only
     * while no position has reached either's size */
    int rs = src->kv->desc.sliding_capacity, rd = dst->kv->desc.sliding_capacity;
    if (src->kv->desc.n_sliding > 0 && rs != rd && (src->pos > rs || src->pos > rd || src->kv_window > 0))
        return ib_fail(err, IB_ERR_INVALID_ARG, "session copy: sliding-window rings of %d and %d slots (different "
                       "kv_chunk) at position %d", rs, rd, src->pos);
    int used = src->pos < src->capacity ? src->pos : src->capacity; /* slots in use */
    src->kv_ops->kv_copy(dst->kv, src->kv, used);
    dst->pos = src->pos;
    memcpy(dst->history, src->history, (size_t)src->n_history * sizeof(int32_t));
    dst->n_history = src->n_history;
    dst->sample_step = src->sample_step;
    return IB_OK;
}

ib_status ib_session_rewind(ib_session *s, int n, ib_error *err) {
    if (n < 0 || n > s->pos)
        return ib_fail(err, IB_ERR_INVALID_ARG, "session rewind: %d is outside [0, %d]", n, s->pos);
    if ((s->kv_window > 0 || s->ring) && n > 0 && s->pos - n > s->kv_chunk)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "session rewind: a %s session can go back at most %d tokens",
                       s->kv_window > 0 ? "windowed" : "sliding-window ring", s->kv_chunk);
    s->pos = n;
    if (s->n_history > n) s->n_history = n;
    return IB_OK;
}

/* A windowed session's history is full: keep its most recent half (a function of the tokens only). */
static void history_slide(ib_session *s) {
    if (s->kv_window <= 0 || s->n_history <= s->capacity) return;
    int keep = (s->capacity + 1) / 2;
    memmove(s->history, s->history + s->n_history - keep, (size_t)keep * sizeof(int32_t));
    s->n_history = keep;
}

void ib_session_note_tokens(ib_session *s, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++) {
        history_slide(s);
        if (s->n_history <= s->capacity) s->history[s->n_history++] = tokens[i];
    }
}

/* The process-wide stream used only under the test-only shared-rng fault. */
static _Atomic uint64_t shared_rng_counter;   /* the fault's one counter; steps may sample on several threads */

int32_t ib_sample(ib_session *s, const float *logits) {
    uint64_t step = s->sample_step++;
    if (ib_fault_get() == IB_FAULT_SAMPLE_BY_ROW) step = shared_rng_counter++;
    int32_t t = ib_sample_logits(logits, s->model->cfg.vocab_size, &s->sampling, step, s->history, s->n_history,
                                 &s->scratch);
    history_slide(s);
    if (s->n_history <= s->capacity) s->history[s->n_history++] = t;
    return t;
}
