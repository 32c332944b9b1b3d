/*
 * sessions_api.c — stateful sessions, /v1/sessions: the session table (lookup, references,
 * eviction, closing idle ones), create, append, generate, delete and list.
 */
#include "server/server_impl.h"

void sess_free(server *S, sess *ss) {
    ib_session_free(ss->s);
    ib_store_session_free(&ss->rec);
    free(ss->htok);
    free(ss->hfl);
    mem_release(S, ss->tidx, ss->kv_bytes);
    free(ss->pending);
    free(ss->tenant);
    free(ss);
}

void sess_unref(server *S, sess *ss) {
    pthread_mutex_lock(&S->mu);
    int left = --ss->refs;
    pthread_mutex_unlock(&S->mu);
    if (!left) sess_free(S, ss);
}

/* Take ss out of the session table (a DELETE, idle expiry, a failed store write): no request finds it
 * any more; it is freed when its last reference goes. With a store its record stays there, and a
 * later request for its id loads it again. */
void sess_evict(server *S, sess *ss) {
    pthread_mutex_lock(&S->mu);
    int found = 0;
    for (int i = 0; i < S->n_sessions; i++)
        if (S->sessions[i] == ss) {
            S->sessions[i] = S->sessions[--S->n_sessions];
            S->tu[ss->tidx].sessions--;
            found = 1;
            break;
        }
    ss->closed = 1;
    pthread_mutex_unlock(&S->mu);
    if (found) sess_unref(S, ss); /* the table's reference; a running generation keeps its own */
}

/* Tokens session ss's KV holds, or will hold once rebuilt (lock held). */
static int sess_pos(const sess *ss) { return ss->resident ? ib_session_position(ss->s) : ss->rec.progress.n_fed; }

/* Find session id for tenant (a new reference), or NULL. */
sess *sess_get(server *S, const char *id, const char *tenant) {
    sess *r = NULL;
    pthread_mutex_lock(&S->mu);
    for (int i = 0; i < S->n_sessions; i++) {
        sess *ss = S->sessions[i];
        if (!strcmp(ss->id, id) && !strcmp(ss->tenant, tenant) && !ss->closed) {
            ss->refs++;
            ss->last_used = now_s();
            r = ss;
            break;
        }
    }
    pthread_mutex_unlock(&S->mu);
    return r;
}

json_t *sess_info(server *S, sess *ss) {
    json_t *j = json_object();
    pthread_mutex_lock(&S->mu);
    int pos = sess_pos(ss);
    json_object_set_new(j, "id", json_string(ss->id));
    json_object_set_new(j, "object", json_string("session"));
    json_object_set_new(j, "model", json_string(S->model_id));
    json_object_set_new(j, "tokens_held", json_integer(pos + ss->n_pending));
    json_object_set_new(j, "kv_tokens", json_integer(pos));
    json_object_set_new(j, "pending_tokens", json_integer(ss->n_pending));
    json_object_set_new(j, "max_context", json_integer(ib_session_capacity(ss->s)));
    json_object_set_new(j, "kv_bytes", json_integer((json_int_t)ss->kv_bytes));
    json_object_set_new(j, "kv_policy", json_string(ss->policy));
    json_object_set_new(j, "busy", json_boolean(ss->busy));
    /* resident: its KV is in memory; false: loaded from the store, rebuilt by its next generation */
    json_object_set_new(j, "resident", json_boolean(ss->resident));
    /* idle expiry: closed once idle_timeout seconds pass with no request naming it */
    int it = S->o.session_idle_timeout_s;
    json_object_set_new(j, "idle_timeout", json_integer(it));
    json_object_set_new(j, "expires_at", it > 0 ? json_integer((json_int_t)time(NULL) +
                                                                (json_int_t)(ss->last_used + it - now_s() + 0.5))
                                                : json_null());
    pthread_mutex_unlock(&S->mu);
    return j;
}

/* A body with a field the endpoint does not take: the 400 naming it (code unknown_parameter) queued
 * into *r, and 1; else 0. */
static int unknown_field(server *S, struct MHD_Connection *c, json_t *b, const char *const *known, enum MHD_Result *r) {
    const char *param = NULL;
    char msg[256];
    if (!ib_api_known_fields(b, known, &param, msg, sizeof msg)) return 0;
    *r = send_error(S, c, 400, "invalid_request_error", "unknown_parameter", param, "%s", msg);
    return 1;
}

/* Whether a session of id is in memory, whoever's (closed ones aside). S->mu held. */
static int id_held(server *S, const char *id) {
    for (int i = 0; i < S->n_sessions; i++)
        if (!strcmp(S->sessions[i]->id, id) && !S->sessions[i]->closed) return 1;
    return 0;
}

/* 409 session_exists: a session of that id is held (here or in the store), whoever's. */
static enum MHD_Result id_taken(server *S, struct MHD_Connection *c, const char *id) {
    return send_error(S, c, 409, "invalid_request_error", "session_exists", NULL,
                      "a session with id '%s' exists; choose another id", id);
}

enum MHD_Result handle_session_create(server *S, struct MHD_Connection *c, json_t *b, const char *tenant, int tidx,
                                      const char *want_id) {
    static const char *const known[] = {"max_context", "kv", NULL};
    enum MHD_Result ur;
    if (unknown_field(S, c, b, known, &ur)) return ur;
    if (want_id) {
        pthread_mutex_lock(&S->mu);
        const int held = id_held(S, want_id);
        pthread_mutex_unlock(&S->mu);
        if (held) return id_taken(S, c, want_id);
    }
    /* the KV a session may hold is bounded by the model's context (a full session never holds more
     * positions; a window wider than the context keeps nothing a full session would not) */
    long long ctx = S->o.session_context < S->info->max_context ? S->o.session_context : S->info->max_context;
    if (b && get_int(b, "max_context", 1, S->info->max_context, &ctx) < 0)
        return BAD("max_context", "max_context must be an integer in [1, %d]", S->info->max_context);
    const char *policy = S->o.kv_policy ? S->o.kv_policy : "full";
    json_t *kv = b ? json_object_get(b, "kv") : NULL;
    if (kv && json_is_null(kv)) kv = NULL; /* null: the server's default, like every other optional field */
    if (kv && !json_is_string(kv)) return BAD("kv", "kv must be a string: full, window:W or sink:S,window:W");
    if (kv) policy = json_string_value(kv);
    int sink = 0, window = 0;
    if (ib_kv_policy_parse(policy, &sink, &window) || strlen(policy) >= 48)
        return BAD("kv", "kv '%.64s' is not full, window:W or sink:S,window:W", policy);
    if (window > 0 && (long long)sink + window > S->info->max_context)
        return BAD("kv", "kv '%s': sink + window = %lld positions exceed the model's context of %d", policy,
                   (long long)sink + window, S->info->max_context);
    long long slots = window > 0 ? (long long)sink + window + S->o.prefill_chunk : ctx;
    ib_session_opts so = {.max_context = (int)ctx, .sampling = ib_sampling_default(), .kv_dtype = S->o.kv_dtype,
                          .backend = S->o.backend, .kv_sink = sink, .kv_window = window, .kv_chunk = S->o.prefill_chunk};
    size_t bytes = ib_session_kv_bytes_for(S->m, &so);   /* sliding-window rings included */
    if (!bytes) return BAD("kv", "kv '%s' cannot be kept for this model (isobatch info says why)", policy);
    if (S->o.memory_budget && bytes > S->o.memory_budget)
        return BAD(window > 0 ? "kv" : "max_context", "a session of %lld KV slots needs %zu bytes, more than this server's memory budget of %zu",
                   slots, bytes, S->o.memory_budget);
    pthread_mutex_lock(&S->mu);
    int full = S->n_sessions >= S->o.max_sessions, key_full = S->key_sessions && S->tu[tidx].sessions >= S->key_sessions;
    pthread_mutex_unlock(&S->mu);
    if (full)
        return send_error(S, c, 429, "rate_limit_error", "too_many_sessions", NULL,
                          "this server holds its limit of %d sessions; close one or retry later", S->o.max_sessions);
    if (key_full)
        return send_error(S, c, 429, "rate_limit_error", "key_session_limit", NULL,
                          "this API key holds its limit of %d sessions; close one or retry later", S->key_sessions);
    int mrc = mem_reserve(S, tidx, bytes, 0);
    if (mrc == -2)
        return BAD(window > 0 ? "kv" : "max_context", "a session of %lld KV slots needs %zu bytes, more than this API key's quota of %zu",
                   slots, bytes, S->key_kv);
    if (mrc == -3)
        return send_error(S, c, 429, "rate_limit_error", "key_memory_quota_exceeded", NULL,
                          "a session of %lld KV slots needs %zu bytes; this API key's quota of %zu is in use", slots, bytes,
                          S->key_kv);
    if (mrc)
        return send_error(S, c, 429, "rate_limit_error", "memory_budget_exceeded", NULL,
                          "a session of %lld tokens needs %zu KV bytes; the memory budget of %zu is in use", ctx, bytes,
                          S->o.memory_budget);
    sess *ss = calloc(1, sizeof *ss);
    ib_error err;
    if (!ss || !(ss->tenant = strdup(tenant)) || (!want_id && random_hex(S, ss->id + 5, 16)) ||
        ib_session_create(S->m, &so, &ss->s, &err)) {
        if (ss) free(ss->tenant);
        free(ss);
        mem_release(S, tidx, bytes);
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL,
                          "cannot allocate a session of %zu KV bytes now; retry later", bytes);
    }
    if (want_id) snprintf(ss->id, sizeof ss->id, "%s", want_id);
    else memcpy(ss->id, "sess_", 5);
    snprintf(ss->policy, sizeof ss->policy, "%s", policy);
    ss->kv_bytes = bytes;
    ss->tidx = tidx;
    ss->last_used = now_s();
    ss->refs = 1; /* the table's */
    ss->cap_pending = (int)(window > 0 || ctx < S->o.max_prompt_tokens ? S->o.max_prompt_tokens : ctx) + 1;
    ss->pending = malloc((size_t)ss->cap_pending * sizeof(int32_t));
    ss->resident = 1;
    ss->kvd = S->o.kv_dtype;
    if (ss->pending && S->store) { /* durable before the client learns the id */
        ib_store_session rec = {.max_context = (int)ctx, .kv_sink = sink, .kv_window = window,
                                .kv_chunk = S->o.prefill_chunk, .kv_dtype = S->o.kv_dtype,
                                .progress = {.sampling = ib_sampling_default()}};
        snprintf(rec.id, sizeof rec.id, "%s", ss->id);
        snprintf(rec.model_id, sizeof rec.model_id, "%s", S->ident);
        ib_store_owner_hash(tenant, rec.owner);
        if (ib_store_create(S->store, &rec, &err)) {
            sess_free(S, ss);
            if (want_id && err.code == IB_ERR_STATE) return id_taken(S, c, want_id);   /* stored already */
            return send_error(S, c, 503, "server_error", "store_error", NULL, "the session could not be stored: %s", err.msg);
        }
    }
    pthread_mutex_lock(&S->mu);
    const int taken = want_id && id_held(S, want_id);   /* (created meanwhile by another request) */
    int ok = !taken && ss->pending && S->n_sessions < S->o.max_sessions && (!S->key_sessions || S->tu[tidx].sessions < S->key_sessions);
    if (ok) {
        S->sessions[S->n_sessions++] = ss;
        S->tu[tidx].sessions++;
    }
    pthread_mutex_unlock(&S->mu);
    if (!ok) {
        if (S->store && ss->pending) ib_store_delete(S->store, ss->id, NULL);   /* (the record this request made) */
        sess_free(S, ss);
        if (taken) return id_taken(S, c, want_id);
        return send_error(S, c, 429, "rate_limit_error", "too_many_sessions", NULL, "session limit reached");
    }
    return send_json(S, c, 200, sess_info(S, ss), 0);
}

enum MHD_Result handle_session_append(server *S, struct MHD_Connection *c, sess *ss, json_t *b) {
    static const char *const known[] = {"text", "tokens", "messages", "add_special", "add_generation_prompt", NULL};
    enum MHD_Result ur;
    if (unknown_field(S, c, b, known, &ur)) return ur;
    {
        const char *np = NULL;
        char nmsg[256];
        if (ib_api_normalize_messages(b, &np, nmsg, sizeof nmsg)) return BAD(np, "%s", nmsg);
    }
    json_t *text = json_object_get(b, "text"), *toks = json_object_get(b, "tokens"), *msgs = json_object_get(b, "messages");
    if (!!text + !!toks + !!msgs > 1)
        return BAD(text && toks ? "tokens" : "messages", "append takes one of \"text\", \"tokens\" and \"messages\"");
    if (json_object_get(b, "add_special") && !text) return BAD("add_special", "add_special goes with \"text\"");
    if (json_object_get(b, "add_generation_prompt") && !msgs)
        return BAD("add_generation_prompt", "add_generation_prompt goes with \"messages\"");
    int32_t *ids = NULL;
    int n = 0, trc = 0;
    if (json_is_string(text)) {
        int add = 0;
        if (get_bool(b, "add_special", &add) < 0) return BAD("add_special", "add_special must be a boolean");
        ids = tokenize(S, c, json_string_value(text), json_string_length(text), add ? IB_TOKENIZE_ADD_SPECIAL : 0, &n, &trc);
    } else if (json_is_array(msgs)) {
        ib_chat_msg *cm = NULL;
        size_t nm = 0;
        char why[256];
        int mrc = chat_messages(msgs, &cm, &nm, why, sizeof why);
        if (mrc == -2) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
        if (mrc) return BAD("messages", "%s", why);
        int gp = 1;
        if (get_bool(b, "add_generation_prompt", &gp) < 0) {
            free(cm);
            return BAD("add_generation_prompt", "add_generation_prompt must be a boolean");
        }
        enum MHD_Result r;
        if (chat_ids(S, c, cm, nm, gp ? IB_CHAT_GENERATION_PROMPT : 0, NULL, &ids, &n, &trc, &r)) return r;
    } else if (json_is_array(toks)) {
        long bad;
        ids = json_token_ids(S, toks, &n, &trc, &bad);
        if (bad >= 0) return BAD("tokens", "tokens[%ld] must be a token id in [0, %d)", bad, S->info->vocab_size);
    } else
        return BAD(NULL, "append needs \"text\" (a string), \"tokens\" (token ids) or \"messages\"");
    if (trc == -3) return MHD_NO; /* the client left while its text was tokenized: close */
    if (trc == -1) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory while tokenizing; retry later");
    if (trc == -2) {
        free(ids);
        return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", NULL,
                          "more than this server's limit of %d tokens", S->o.max_prompt_tokens);
    }
    pthread_mutex_lock(&S->mu);
    const char *why = NULL;
    if (ss->busy)
        why = "busy";
    else if ((long)sess_pos(ss) + ss->n_pending + n > ib_session_capacity(ss->s) ||
             ss->n_pending + n >= ss->cap_pending)
        why = "full";
    else if (S->store && n > 0) { /* durable before it is acknowledged: the session is busy meanwhile */
        ss->busy = 1;
        int at = ss->n_hist;
        pthread_mutex_unlock(&S->mu);
        uint8_t *fl = malloc((size_t)n);
        ib_error err;
        ib_status rc = fl ? IB_OK : ib_fail(&err, IB_ERR_NOMEM, "out of memory");
        if (fl) memset(fl, IB_STORE_TOK_NOTE_ON_FEED, (size_t)n);
        if (!rc) rc = ib_store_append(S->store, ss->id, at, ids, fl, n, NULL, &err);
        free(fl);
        pthread_mutex_lock(&S->mu);
        ss->busy = 0;
        if (rc) {
            pthread_mutex_unlock(&S->mu);
            free(ids);
            if (err.code == IB_ERR_STATE) {
                /* the store refused the append at this position (store.h: another server sharing the store
                 * wrote to the session, or held its lock past the wait): the copy in memory may be stale.
                 * Forget it; the retried request loads what the store holds. */
                sess_evict(S, ss);
                return send_error(S, c, 409, "invalid_request_error", "session_changed", NULL,
                                  "the session's stored history moved on or is locked by another server; retry: %s",
                                  err.msg);
            }
            return send_error(S, c, 503, "server_error", "store_error", NULL, "the tokens could not be stored: %s", err.msg);
        }
        hist_push(ss, ids, n, IB_STORE_TOK_NOTE_ON_FEED, 0);
        memcpy(ss->pending + ss->n_pending, ids, (size_t)n * sizeof(int32_t));
        ss->n_pending += n;
    } else {
        hist_push(ss, ids, n, IB_STORE_TOK_NOTE_ON_FEED, 0);
        memcpy(ss->pending + ss->n_pending, ids, (size_t)n * sizeof(int32_t));
        ss->n_pending += n;
    }
    pthread_mutex_unlock(&S->mu);
    free(ids);
    if (why && !strcmp(why, "busy"))
        return send_error(S, c, 409, "invalid_request_error", "session_busy", NULL, "the session is generating");
    if (why)
        return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", NULL,
                          "the session's context of %d tokens cannot hold %d more", ib_session_capacity(ss->s), n);
    json_t *j = sess_info(S, ss);
    json_object_set_new(j, "appended", json_integer(n));
    return send_json(S, c, 200, j, 0);
}

enum MHD_Result handle_session_generate(server *S, struct MHD_Connection *c, sess *ss, json_t *b) {
    gen_params p;
    const char *param = NULL;
    char msg[256];
    enum MHD_Result cr;
    if (check_request(S, c, b, IB_API_SESSION_GENERATE, &cr)) return cr;
    if (parse_params(S, b, 0, 16, &p, &param, msg, sizeof msg)) return BAD(param, "%s", msg);
    int chat = 0;
    if (get_bool(b, "chat", &chat) < 0) {
        params_free(&p);
        return BAD("chat", "chat must be a boolean");
    }
    if (inflight_take(S, ss->tidx)) {
        params_free(&p);
        return send_error(S, c, 429, "rate_limit_error", "key_request_limit", NULL,
                          "this API key has its limit of %d requests in flight; retry later", S->key_requests);
    }
    pthread_mutex_lock(&S->mu);
    const char *why = NULL;
    int n = ss->n_pending, nr = 0, hist_at = 0;
    int32_t *ids = NULL, *pend = NULL, *vin = NULL;
    uint8_t *vfl = NULL;
    uint64_t draws0 = 0;
    if (!ss->resident) { /* a rebuild: the stored tokens [0, n_fed) are fed first, without notes */
        nr = ss->rec.progress.n_fed;
        if (ib_fault_get() == IB_FAULT_REBUILD_DROP_TOKEN && nr > 0) nr--; /* tests only: a broken rebuild */
    }
    if (ss->busy)
        why = "busy";
    else if (n < 1)
        why = "empty";
    else if (!(ids = malloc(((size_t)nr + n) * sizeof *ids)))
        why = "nomem";
    else if ((long)sess_pos(ss) + n + (p.max_tokens > 0 ? p.max_tokens - 1 : 0) > ib_session_capacity(ss->s))
        why = "full";
    else {
        pend = ids + nr;
        if (!ss->resident) {
            const ib_store_session *r = &ss->rec;
            for (int i = 0, k = 0; i < r->progress.n_fed && k < nr; i++)
                if (!(nr < r->progress.n_fed && i == r->progress.n_fed / 2)) ids[k++] = r->tokens[i];
            ib_session_reset(ss->s);
            ib_store_replay_notes(ss->s, r);
        }
        memcpy(pend, ss->pending, (size_t)n * sizeof *ids);
        ss->n_pending = 0;
        ss->busy = 1;
        ss->refs++; /* the generation's */
        /* the verification record's inputs: the history before the request, its flags, the draw
         * counter; the prompt is the pending tokens (the mirror's tail) */
        hist_at = ss->n_hist;
        draws0 = ss->resident ? ss->s->sample_step : ss->rec.progress.draws;
        if (!ss->hist_broken && ss->n_hist >= n && (vin = malloc((size_t)ss->n_hist * sizeof *vin + 1)) &&
            (vfl = malloc((size_t)ss->n_hist + 1))) {
            memcpy(vin, ss->htok, (size_t)ss->n_hist * sizeof *vin);
            memcpy(vfl, ss->hfl, (size_t)ss->n_hist);
        }
    }
    int pos = sess_pos(ss);
    pthread_mutex_unlock(&S->mu);
    if (why) {
        inflight_put(S, ss->tidx);
        free(ids);
        params_free(&p);
        if (!strcmp(why, "busy"))
            return send_error(S, c, 409, "invalid_request_error", "session_busy", NULL, "the session is generating");
        if (!strcmp(why, "empty"))
            return BAD(NULL, "the session has no pending tokens: append text or tokens first");
        if (!strcmp(why, "full"))
            return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                              "%d held + %d pending + max_tokens %d exceed the session's context of %d", pos, n,
                              p.max_tokens, ib_session_capacity(ss->s));
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
    }
    gen *g = gen_new(S, 0, &p);
    if (!g) {
        pthread_mutex_lock(&S->mu);
        if (!ss->resident) ib_session_reset(ss->s);
        memcpy(ss->pending, pend, (size_t)n * sizeof *ids);
        ss->n_pending = n;
        ss->busy = 0;
        ss->refs--;
        pthread_mutex_unlock(&S->mu);
        inflight_put(S, ss->tidx);
        free(ids);
        free(vin);
        free(vfl);
        params_free(&p);
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
    }
    snprintf(g->id, sizeof g->id, "%s", ss->id);
    g->tidx = ss->tidx;
    g->inflight = 1;
    g->ss = ss;
    g->session_gen = 1;
    g->n_prompt = n;
    g->n_replay = nr;
    g->commit = g->stored_gen = S->store != NULL;
    g->hist_at = hist_at;
    g->draws0 = draws0;
    g->vkvd = ss->kvd;
    snprintf(g->vkv, sizeof g->vkv, "%s", ss->policy);
    if (vin && vfl) {
        g->vin = vin;
        g->vfl = vfl;
        g->n_vhist = hist_at - n;
        g->n_vprompt = n;
        vin = NULL;
        vfl = NULL;
    }
    if (chat)
        g->n_stop_ids = ib_chat_stop_ids(S->m, g->stop_ids, MAX_STOP_IDS);
    else if (S->info->eos_id >= 0)
        g->stop_ids[g->n_stop_ids++] = S->info->eos_id;
    /* keep the prompt at the front of pending (unused while busy) so an unfed tail can be restored */
    pthread_mutex_lock(&S->mu);
    memcpy(ss->pending, pend, (size_t)n * sizeof *ids);
    ss->n_pending = 0;
    pthread_mutex_unlock(&S->mu);
    enum MHD_Result r = run_gen(S, c, g, ss->s, ids, nr + n, &p);
    free(ids);
    free(vin); /* (NULL unless half allocated) */
    free(vfl);
    params_free(&p);
    return r;
}

/* The body of a DELETE's answer for session id. */
static json_t *deleted_json(const char *id) {
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(id));
    json_object_set_new(j, "object", json_string("session"));
    json_object_set_new(j, "deleted", json_true());
    return j;
}

enum MHD_Result handle_session_delete(server *S, struct MHD_Connection *c, sess *ss) {
    ib_error err;
    ib_status rc = S->store ? ib_store_delete(S->store, ss->id, &err) : IB_OK;
    if (rc && rc != IB_ERR_NOT_FOUND)
        return send_error(S, c, 503, "server_error", "store_error", NULL, "the session could not be deleted: %s", err.msg);
    pthread_mutex_lock(&S->mu);
    ss->deleted = 1;
    pthread_mutex_unlock(&S->mu);
    sess_evict(S, ss);
    return send_json(S, c, 200, deleted_json(ss->id), 0);
}

/* Close the sessions idle (no request naming them, no generation) for session_idle_timeout_s, as a
 * DELETE would; a generation running on one keeps it. Called from the main loop. */
void expire_sessions(server *S) {
    if (S->o.session_idle_timeout_s <= 0) return;
    for (;;) {
        sess *victim = NULL;
        double t = now_s();
        pthread_mutex_lock(&S->mu);
        for (int i = 0; i < S->n_sessions && !victim; i++) {
            sess *ss = S->sessions[i];
            if (!ss->busy && t - ss->last_used > S->o.session_idle_timeout_s) {
                victim = ss;
                S->sessions[i] = S->sessions[--S->n_sessions];
                S->tu[ss->tidx].sessions--;
                ss->closed = 1;
                S->n_expired++;
            }
        }
        pthread_mutex_unlock(&S->mu);
        if (!victim) return;
        sess_unref(S, victim); /* the table's reference (with a store, its record stays: it can come back) */
    }
}

/* GET /v1/sessions: the key's sessions — from the store when there is one (each with resident: whether
 * its KV is in memory now), else those in memory. */
enum MHD_Result handle_session_list(server *S, struct MHD_Connection *c, const char *tenant) {
    json_t *data = json_array();
    if (S->store) {
        char owner[65], **ids = NULL;
        int n = 0;
        ib_error err;
        ib_store_owner_hash(tenant, owner);
        if (ib_store_list_owner(S->store, owner, &ids, &n, &err)) {
            json_decref(data);
            return send_error(S, c, 503, "server_error", "store_error", NULL, "the sessions could not be listed: %s", err.msg);
        }
        pthread_mutex_lock(&S->mu);
        for (int i = 0; i < n; i++) {
            int res = 0;
            for (int k = 0; k < S->n_sessions; k++)
                if (!strcmp(S->sessions[k]->id, ids[i]) && !strcmp(S->sessions[k]->tenant, tenant))
                    res = S->sessions[k]->resident;
            json_array_append_new(data, json_pack("{s:s, s:s, s:b}", "id", ids[i], "object", "session", "resident", res));
        }
        pthread_mutex_unlock(&S->mu);
        ib_store_ids_free(ids, n);
    } else {
        pthread_mutex_lock(&S->mu);
        for (int k = 0; k < S->n_sessions; k++)
            if (!strcmp(S->sessions[k]->tenant, tenant))
                json_array_append_new(data, json_pack("{s:s, s:s, s:b}", "id", S->sessions[k]->id, "object", "session",
                                                      "resident", 1));
        pthread_mutex_unlock(&S->mu);
    }
    return send_json(S, c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data), 0);
}
