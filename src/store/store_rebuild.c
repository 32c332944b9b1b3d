/*
 * store_rebuild.c — ib_store_rebuild (store.h): a stored session back as a live ib_session, by
 * prefilling its history through the ordinary batched step. Nothing here computes a number: the KV
 * comes from ib_step (whose results do not depend on how a history is cut into chunks), the sampler
 * history from ib_session_note_tokens, the draw counter from the record.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "runtime/runtime.h"
#include "store/store.h"

void ib_store_replay_notes(ib_session *s, const ib_store_session *rec) {
    /* the sampler's history, noted in the order the original session noted it: a drawn token when it
     * was drawn, a prompt token when it was fed (a drawn token fed as a prompt token: both, in that
     * order); pending tokens that were drawn were noted already */
    const ib_store_progress *p = &rec->progress;
    for (int i = 0; i < rec->n_tokens; i++) {
        if (rec->flags[i] & IB_STORE_TOK_SAMPLED) ib_session_note_tokens(s, &rec->tokens[i], 1);
        if (i < p->n_fed && (rec->flags[i] & IB_STORE_TOK_NOTE_ON_FEED)) ib_session_note_tokens(s, &rec->tokens[i], 1);
    }
    s->sample_step = p->draws;
    s->sampling = p->sampling;
}

ib_status ib_store_rebuild(ib_engine *e, const char *model_id, const ib_store_session *rec, int chunk,
                           ib_session **out, float *last_logits, ib_error *err) {
    *out = NULL;
    if (!model_id || strcmp(model_id, rec->model_id) != 0)
        return ib_fail(err, IB_ERR_STATE, "rebuild: session %s was made by model %s, this engine runs %s", rec->id,
                       rec->model_id, model_id ? model_id : "(unknown)");
    const ib_store_progress *p = &rec->progress;
    if (rec->n_tokens < 0 || p->n_fed < 0 || p->n_fed > rec->n_tokens || (rec->n_tokens > 0 && (!rec->tokens || !rec->flags)))
        return ib_fail(err, IB_ERR_INVALID_ARG, "rebuild: session %s: n_fed %d of %d tokens", rec->id, p->n_fed,
                       rec->n_tokens);
    ib_session_opts so = {.max_context = rec->max_context, .sampling = p->sampling, .kv_sink = rec->kv_sink,
                          .kv_window = rec->kv_window, .kv_chunk = rec->kv_chunk, .kv_dtype = rec->kv_dtype,
                          .backend = ib_engine_backend(e)};
    ib_session *s = NULL;
    ib_status rc = ib_session_create(e->model, &so, &s, err);
    if (rc) return rc;
    int step = chunk > 0 ? chunk : 64;
    if (step > e->max_tokens) step = e->max_tokens;
    if (s->kv_chunk > 0 && step > s->kv_chunk) step = s->kv_chunk;
    for (int at = 0; at < p->n_fed; at += step) {
        int n = p->n_fed - at < step ? p->n_fed - at : step;
        int last = at + n == p->n_fed;
        ib_step_item it = {.session = s, .tokens = rec->tokens + at, .n_tokens = n,
                           .logits = last ? last_logits : NULL};
        if ((rc = ib_step(e, &it, 1, err))) goto fail;
    }
    ib_store_replay_notes(s, rec);
    *out = s;
    return IB_OK;
fail:
    ib_session_free(s);
    return rc;
}
