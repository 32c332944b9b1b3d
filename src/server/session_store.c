/*
 * session_store.c — the session store's wiring: the history mirror of each session (what the store
 * holds and what verification records carry), writing a stateful generation's tokens before its
 * response ends (gen_commit), and loading a session back from the store (its KV rebuilt by its
 * next generation).
 */
#include "server/server_impl.h"

/* Append n tokens to session ss's history mirror, each flagged fl, the last one fl | last_extra
 * (S->mu held). 0, or -1 when out of memory (the mirror is then short: later verification records of
 * the session are wrong, so they are left out). */
int hist_push(sess *ss, const int32_t *t, int n, uint8_t fl, uint8_t last_extra) {
    if (n <= 0) return 0;
    if (ss->n_hist + n > ss->cap_hist) {
        int nc = (ss->n_hist + n) * 2 + 64;
        int32_t *a = realloc(ss->htok, (size_t)nc * sizeof *a);
        if (a) ss->htok = a;
        uint8_t *b = realloc(ss->hfl, (size_t)nc);
        if (b) ss->hfl = b;
        if (!a || !b) {
            ss->hist_broken = 1;
            return -1;
        }
        ss->cap_hist = nc;
    }
    memcpy(ss->htok + ss->n_hist, t, (size_t)n * sizeof *t);
    memset(ss->hfl + ss->n_hist, fl, (size_t)n);
    ss->hfl[ss->n_hist + n - 1] |= last_extra;
    ss->n_hist += n;
    return 0;
}

/* A stateful session's generation has ended (g->done) and the server has a store: write what the
 * generation added — its tokens (SAMPLED; the last, which stays pending, SAMPLED|NOTE_ON_FEED), the
 * draw counter, the settings and n_fed — as one transaction, then free the session for the next
 * request. Called on the connection's thread before the response's last bytes are sent, so every
 * generation a client saw completed is durable; once per generation (later calls do nothing). On a
 * failed write g->store_failed is set and the session is evicted from memory: its next request
 * loads it from the store as it was before this generation. */
void gen_commit(gen *g) {
    server *S = g->srv;
    pthread_mutex_lock(&g->mu);
    int todo = g->commit && g->done;
    if (todo) g->commit = 0;
    pthread_mutex_unlock(&g->mu);
    if (!todo) return;
    sess *ss = g->ss;
    g->ss = NULL;
    ib_error err = {0};
    ib_status rc = IB_OK;
    pthread_mutex_lock(&S->mu);
    int resident = ss->resident && !ss->deleted, at = g->hist_at;
    ib_store_progress pr = {.sampling = g->sp, .draws = ss->s->sample_step, .n_fed = ib_session_position(ss->s)};
    pthread_mutex_unlock(&S->mu);
    /* (no lock needed for g->tok: the job is done, nothing appends any more) */
    if (resident && g->n > 0) {
        uint8_t *fl = malloc((size_t)g->n);
        if (!fl)
            rc = ib_fail(&err, IB_ERR_NOMEM, "out of memory");
        else {
            memset(fl, IB_STORE_TOK_SAMPLED, (size_t)g->n);
            fl[g->n - 1] |= IB_STORE_TOK_NOTE_ON_FEED;
            rc = ib_store_append(S->store, ss->id, at, g->tok, fl, g->n, &pr, &err);
            free(fl);
        }
    } else if (resident && g->fed > 0)
        rc = ib_store_update(S->store, ss->id, &pr, &err);
    pthread_mutex_lock(&S->mu);
    ss->busy = 0;
    ss->last_used = now_s();
    pthread_mutex_unlock(&S->mu);
    if (rc) {
        g->store_failed = 1;
        if (S->log) {
            fprintf(S->log, "isobatch serve: store: %s\n", err.msg);
            fflush(S->log);
        }
        sess_evict(S, ss);
    }
    sess_unref(S, ss);
}

/* Load session id of tenant from the store into the table, not resident (its KV is rebuilt by its next
 * generation). Returns a new reference, or NULL with *r set to the answer: 404 when the store has no
 * such session of this tenant (another key's session is not found either), 409 session_model_mismatch
 * when another model made it, 429 when the server's or the key's sessions or memory are full, 503 when
 * the store fails. Two requests loading one id at once end with one entry (the later one's is freed). */
sess *sess_load(server *S, struct MHD_Connection *c, const char *id, const char *tenant, int tidx,
                enum MHD_Result *r) {
    ib_store_session rec;
    ib_error err;
    ib_status rc = ib_store_load(S->store, id, &rec, &err);
    char owner[65];
    ib_store_owner_hash(tenant, owner);
    if (rc == IB_ERR_NOT_FOUND || (!rc && strcmp(rec.owner, owner))) {
        ib_store_session_free(&rec);
        *r = send_error(S, c, 404, "invalid_request_error", "session_not_found", NULL, "no such session");
        return NULL;
    }
    if (rc) {
        ib_store_session_free(&rec);
        *r = send_error(S, c, 503, "server_error", "store_error", NULL, "the session could not be loaded: %s", err.msg);
        return NULL;
    }
    if (strcmp(rec.model_id, S->ident)) {
        *r = send_error(S, c, 409, "invalid_request_error", "session_model_mismatch", NULL,
                        "session %s was made by model %s; this server runs %s (another model, or changed weights or "
                        "tokenizer), so it cannot continue it", id, rec.model_id, S->ident);
        ib_store_session_free(&rec);
        return NULL;
    }
    int window = rec.kv_window, sink = rec.kv_sink;
    ib_session_opts so = {.max_context = rec.max_context, .sampling = rec.progress.sampling, .kv_dtype = rec.kv_dtype,
                          .backend = S->o.backend, .kv_sink = sink, .kv_window = window, .kv_chunk = rec.kv_chunk};
    size_t bytes = ib_session_kv_bytes_for(S->m, &so);   /* 0: refused; ib_session_create below says why */
    pthread_mutex_lock(&S->mu);
    int full = S->n_sessions >= S->o.max_sessions, key_full = S->key_sessions && S->tu[tidx].sessions >= S->key_sessions;
    pthread_mutex_unlock(&S->mu);
    int mrc = full || key_full ? 0 : mem_reserve(S, tidx, bytes, 0);
    if (full || key_full || mrc) {
        ib_store_session_free(&rec);
        *r = send_error(S, c, 429, "rate_limit_error", full ? "too_many_sessions" : key_full ? "key_session_limit"
                                                                                : "memory_budget_exceeded",
                        NULL, "session %s is stored but cannot be loaded now (sessions or KV memory in use); close one "
                              "or retry later", id);
        return NULL;
    }
    sess *ss = calloc(1, sizeof *ss);
    int n_pend = rec.n_tokens - rec.progress.n_fed;
    long long cap = window > 0 || rec.max_context < S->o.max_prompt_tokens ? S->o.max_prompt_tokens : rec.max_context;
    if (cap < n_pend) cap = n_pend;
    if (!ss || !(ss->tenant = strdup(tenant)) || !(ss->pending = malloc(((size_t)cap + 1) * sizeof(int32_t))) ||
        (rc = ib_session_create(S->m, &so, &ss->s, &err))) {
        if (ss) {
            free(ss->tenant);
            free(ss->pending);
        }
        free(ss);
        ib_store_session_free(&rec);
        mem_release(S, tidx, bytes);
        *r = send_error(S, c, rc == IB_ERR_NOMEM || !rc ? 503 : 500, "server_error", rc == IB_ERR_NOMEM || !rc ? "out_of_memory" : NULL, NULL,
                        "session %s could not be loaded: %s", id, rc && rc != IB_ERR_NOMEM ? err.msg : "out of memory");
        return NULL;
    }
    snprintf(ss->id, sizeof ss->id, "%s", id);
    if (window > 0 && sink > 0) snprintf(ss->policy, sizeof ss->policy, "sink:%d,window:%d", sink, window);
    else if (window > 0) snprintf(ss->policy, sizeof ss->policy, "window:%d", window);
    else snprintf(ss->policy, sizeof ss->policy, "full");
    ss->cap_pending = (int)cap + 1;
    if (n_pend > 0) memcpy(ss->pending, rec.tokens + rec.progress.n_fed, (size_t)n_pend * sizeof(int32_t));
    ss->n_pending = n_pend;
    ss->kvd = rec.kv_dtype;
    if (rec.n_tokens > 0 && hist_push(ss, rec.tokens, rec.n_tokens, 0, 0) == 0)
        memcpy(ss->hfl, rec.flags, (size_t)rec.n_tokens);
    ss->n_hist = rec.n_tokens; /* (the next append's place even when the mirror could not be made) */
    ss->kv_bytes = bytes;
    ss->tidx = tidx;
    ss->last_used = now_s();
    ss->refs = 2; /* the table's, the caller's */
    ss->rec = rec;
    pthread_mutex_lock(&S->mu);
    sess *dup = NULL;
    for (int i = 0; i < S->n_sessions && !dup; i++)
        if (!strcmp(S->sessions[i]->id, id) && !strcmp(S->sessions[i]->tenant, tenant) && !S->sessions[i]->closed)
            dup = S->sessions[i];
    int ok = !dup && S->n_sessions < S->o.max_sessions && (!S->key_sessions || S->tu[tidx].sessions < S->key_sessions);
    if (dup) dup->refs++;
    if (ok) {
        S->sessions[S->n_sessions++] = ss;
        S->tu[tidx].sessions++;
    }
    pthread_mutex_unlock(&S->mu);
    if (!ok) {
        sess_free(S, ss);
        if (dup) return dup;
        *r = send_error(S, c, 429, "rate_limit_error", "too_many_sessions", NULL, "session limit reached");
        return NULL;
    }
    return ss;
}
