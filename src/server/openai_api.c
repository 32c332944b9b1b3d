/*
 * openai_api.c — the OpenAI-compatible endpoints POST /v1/completions and /v1/chat/completions:
 * the sampling and length parameters, the chat messages, the model and request checks shared with
 * the sessions API, prompt tokenizing, and several prompts in one completions request.
 */
#include "server/server_impl.h"

/* Read an optional number field: 0 = absent (out untouched), 1 = read, -1 = wrong type/range. */
static int get_num(json_t *o, const char *k, double lo, double hi, double *out) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return -1;
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return -1;
    *out = x;
    return 1;
}

int get_int(json_t *o, const char *k, long long lo, long long hi, long long *out) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return -1;
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return -1;
    *out = x;
    return 1;
}

int get_bool(json_t *o, const char *k, int *out) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return -1;
    *out = json_is_true(v);
    return 1;
}

void params_free(gen_params *p) {
    for (int i = 0; i < p->n_stops; i++) free(p->stops[i]);
    p->n_stops = 0;
    ib_api_bias_free(&p->bias);
}

/* Parse the sampling, length, stream, stop and logprobs fields shared by every generating endpoint.
 * On error writes the offending field into *param and a message into msg, returns -1. */
int parse_params(server *S, json_t *b, int chat, int default_max, gen_params *p, const char **param,
                 char *msg, size_t msz) {
    memset(p, 0, sizeof *p);
    p->sp = ib_sampling_default();
    p->sp.temperature = 1.0f;
    double x;
    long long n;
    int r;
    p->max_tokens = default_max;
#define FAIL(field, ...) do { *param = field; snprintf(msg, msz, __VA_ARGS__); params_free(p); return -1; } while (0)
    if ((r = get_num(b, "temperature", 0, 2, &x)) < 0) FAIL("temperature", "temperature must be a number in [0, 2]");
    if (r) p->sp.temperature = (float)x;
    if ((r = get_num(b, "top_p", 0, 1, &x)) < 0 || (r && x <= 0)) FAIL("top_p", "top_p must be a number in (0, 1]");
    if (r) p->sp.top_p = (float)x;
    if ((r = get_num(b, "min_p", 0, 1, &x)) < 0) FAIL("min_p", "min_p must be a number in [0, 1]");
    if (r) p->sp.min_p = (float)x;
    if ((r = get_int(b, "top_k", 0, 1 << 30, &n)) < 0) FAIL("top_k", "top_k must be an integer >= -1 (-1 or 0: off)");
    if (r) p->sp.top_k = (int)n;
    if ((r = get_num(b, "repetition_penalty", 0.01, 100, &x)) < 0)
        FAIL("repetition_penalty", "repetition_penalty must be a number in [0.01, 100]");
    if (r) p->sp.repeat_penalty = (float)x;
    if ((r = get_int(b, "seed", -(1LL << 62), 1LL << 62, &n)) < 0) FAIL("seed", "seed must be an integer");
    if (r) p->sp.seed = (uint64_t)n;
    if ((r = get_num(b, "frequency_penalty", -2, 2, &x)) < 0) FAIL("frequency_penalty", "frequency_penalty must be a number in [-2, 2]");
    if ((r = get_num(b, "presence_penalty", -2, 2, &x)) < 0) FAIL("presence_penalty", "presence_penalty must be a number in [-2, 2]");
    if ((r = get_int(b, "n", 1, MAX_CHOICES, &n)) < 0) FAIL("n", "n must be an integer in [1, %d]", MAX_CHOICES);
    p->n = r ? (int)n : 1;
    const char *mk = chat && json_object_get(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((r = get_int(b, mk, 0, 1LL << 30, &n)) < 0) FAIL(mk, "%s must be an integer >= 0", mk);
    if (r) {
        if (n > S->o.max_tokens)
            FAIL(mk, "%s %lld exceeds this server's limit of %d tokens", mk, n, S->o.max_tokens);
        p->max_tokens = (int)n;
    }
    if ((r = get_bool(b, "stream", &p->stream)) < 0) FAIL("stream", "stream must be a boolean");
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so) || get_bool(so, "include_usage", &p->include_usage) < 0)
            FAIL("stream_options", "stream_options must be an object with a boolean include_usage");
    }
    if (chat) {
        if ((r = get_bool(b, "logprobs", &p->want_lp)) < 0) FAIL("logprobs", "logprobs must be a boolean");
        if ((r = get_int(b, "top_logprobs", 0, IB_MAX_TOP_LOGPROBS, &n)) < 0)
            FAIL("top_logprobs", "top_logprobs must be an integer in [0, %d]", IB_MAX_TOP_LOGPROBS);
        if (r && n > 0 && !p->want_lp) FAIL("top_logprobs", "top_logprobs needs logprobs: true");
        if (r) p->top_lp = (int)n;
    } else {
        if ((r = get_int(b, "logprobs", 0, 5, &n)) < 0) FAIL("logprobs", "logprobs must be an integer in [0, 5]");
        if (r) p->want_lp = 1, p->top_lp = (int)n;
        if (get_bool(b, "echo", &p->echo) < 0) FAIL("echo", "echo must be a boolean");
    }
    json_t *st = json_object_get(b, "stop");
    if (st && !json_is_null(st)) {
        if (json_is_string(st)) {
            json_t *a = json_array();
            json_array_append(a, st);
            st = a;
        } else if (json_is_array(st)) {
            json_incref(st);
        } else
            FAIL("stop", "stop must be a string or an array of strings");
        size_t i;
        json_t *v;
        int bad = json_array_size(st) > MAX_STOPS;
        json_array_foreach(st, i, v) {
            if (bad || !json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > MAX_STOP_LEN) {
                bad = 1;
                break;
            }
            p->stops[p->n_stops++] = strdup(json_string_value(v));
        }
        json_decref(st);
        if (bad) FAIL("stop", "stop: at most %d non-empty strings of at most %d bytes", MAX_STOPS, MAX_STOP_LEN);
    }
    if (ib_api_logit_bias(b, S->info->vocab_size, &p->bias, param, msg, msz)) {
        params_free(p);
        return -1;
    }
#undef FAIL
    return 0;
}

/* ib_tokenize_cancel's callback: stop tokenizing for a client that has gone away. */
static int tok_client_gone(void *c) { return client_gone(c); }

/* Tokenize text into a fresh array; *n gets the count. *rc: 0 ok, -1 out of memory, -2 over
 * max_prompt, -3 the client left while it ran (nobody to answer). */
int32_t *tokenize(server *S, struct MHD_Connection *c, const char *text, size_t len, int flags, int *n, int *rc) {
    int cap = S->o.max_prompt_tokens + 1;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    *rc = 0;
    if (!ids) {
        *rc = -1;
        return NULL;
    }
    int k = ib_tokenize_cancel(S->m, text, len, flags, ids, cap, tok_client_gone, c);
    if (k < 0) {
        free(ids);
        *rc = k == -2 ? -3 : -1;
        return NULL;
    }
    *n = k;
    if (k > S->o.max_prompt_tokens) *rc = -2;
    return ids;
}


/* The chat messages of a request (chat/completions, or a session's append): msgs must be an array
 * of 1..IB_API_MAX_MESSAGES objects, each with a string content and a role among system, developer (taken
 * as system), user and assistant — exactly, so no role can carry other text (such as a chat
 * template's markers) into the prompt. On success *out (freed by the caller; its strings belong to
 * msgs) and *n are set and 0 is returned; -1 with a message in why when invalid; -2 out of memory. */
int chat_messages(json_t *msgs, ib_chat_msg **out, size_t *n, char *why, size_t wsz) {
    *out = NULL;
    *n = 0;
    if (!json_is_array(msgs) || json_array_size(msgs) < 1) {
        snprintf(why, wsz, "messages must be a non-empty array");
        return -1;
    }
    size_t nm = json_array_size(msgs);
    if (nm > IB_API_MAX_MESSAGES) {
        snprintf(why, wsz, "messages holds %zu messages, more than the limit of %d", nm, IB_API_MAX_MESSAGES);
        return -1;
    }
    ib_chat_msg *cm = calloc(nm, sizeof *cm);
    if (!cm) return -2;
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role"), *ct = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role) || !json_is_string(ct)) {
            free(cm);
            snprintf(why, wsz, "messages[%zu] needs a string role and a string content", i);
            return -1;
        }
        const char *r = json_string_value(role);
        if (strlen(r) != json_string_length(role) ||
            (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer"))) {
            free(cm);
            snprintf(why, wsz, "messages[%zu].role '%.40s' is not system, developer, user or assistant", i, r);
            return -1;
        }
        cm[i].role = strcmp(r, "developer") ? r : "system";
        cm[i].content = json_string_value(ct);
    }
    *out = cm;
    *n = nm;
    return 0;
}

int32_t *json_token_ids(server *S, json_t *a, int *n, int *rc, long *bad) {
    const size_t nt = json_array_size(a);
    *rc = 0, *bad = -1, *n = (int)(nt < 1u << 30 ? nt : 1u << 30);
    if (nt > (size_t)S->o.max_prompt_tokens) {
        *rc = -2;
        return NULL;
    }
    int32_t *ids = malloc((nt + 1) * sizeof *ids);
    if (!ids) {
        *rc = -1;
        return NULL;
    }
    for (size_t i = 0; i < nt; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= S->info->vocab_size) {
            free(ids);
            *bad = (long)i;
            return NULL;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    return ids;
}

int chat_ids(server *S, struct MHD_Connection *c, ib_chat_msg *cm, size_t nm, int flags, const char *suffix,
             int32_t **ids, int *n, int *trc, enum MHD_Result *r) {
    char *text = NULL, msg[256];
    long len = 0;
    const char *param = NULL;
    int rc = ib_api_chat_text(S->m, cm, (int)nm, flags, &text, &len, &param, msg, sizeof msg);
    free(cm);
    if (!rc && suffix) {
        const size_t sl = strlen(suffix);
        char *t2 = realloc(text, (size_t)len + sl + 1);
        if (!t2) rc = -2;
        else memcpy(t2 + len, suffix, sl + 1), text = t2, len += (long)sl;
    }
    if (rc == -2) *r = send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
    else if (rc) *r = BAD(param, "%s", msg);
    if (rc) {
        free(text);
        return 1;
    }
    *ids = tokenize(S, c, text, (size_t)len, 0, n, trc);
    free(text);
    return 0;
}

/* 0 when the body names the served model; else the error response has been queued into *r. */
static int check_model(server *S, struct MHD_Connection *c, json_t *b, enum MHD_Result *r) {
    json_t *mv = json_object_get(b, "model");
    if (!mv)
        *r = send_error(S, c, 400, "invalid_request_error", "missing_required_parameter", "model", "model is required");
    else if (!json_is_string(mv))
        *r = BAD("model", "model must be a string");
    else if (strcmp(json_string_value(mv), S->model_id))
        *r = send_error(S, c, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%s' does not exist (this server serves '%s')", json_string_value(mv), S->model_id);
    else
        return 0;
    return -1;
}

/* The request-field checks of api_request.c for endpoint ep: unknown or unimplemented fields, then
 * the rewriting of accepted forms (content parts, top_k -1, a fresh seed). 0 when b may go on; else
 * the 400 has been queued into *r. */
int check_request(server *S, struct MHD_Connection *c, json_t *b, ib_api_endpoint ep, enum MHD_Result *r) {
    const char *param = NULL, *code = "invalid_value";
    char msg[256];
    if (ib_api_check_fields(b, ep, &param, &code, msg, sizeof msg) ||
        ib_api_normalize(b, ep, &param, msg, sizeof msg)) {
        *r = send_error(S, c, 400, "invalid_request_error", code, param, "%s", msg);
        return -1;
    }
    return 0;
}

/* Copy p with its own stop strings and bias (gen_new takes a params' stops); -1 when out of memory. */
static int params_copy(const gen_params *p, gen_params *q) {
    *q = *p;
    q->n_stops = 0;
    memset(&q->bias, 0, sizeof q->bias);
    for (int i = 0; i < p->n_stops; i++) {
        if (!(q->stops[i] = strdup(p->stops[i]))) {
            params_free(q);
            return -1;
        }
        q->n_stops = i + 1;
    }
    return 0;
}

/* What a chat request's generations share beyond gen_params: the body (its constraint), its tool use
 * and the model's tool form, whether its history carries tool traffic. */
typedef struct chat_ctx {
    json_t *b;
    const ib_api_tool_use *tu;
    ib_chat_tool_form form;
    int history_tools;
} chat_ctx;

/* A chat generation's stop ids, tool reading and constraint (cc; constraint.c sets the mask up and
 * writes what the verification record says of it). 0; -1 when out of memory. */
static int chat_gen_setup(server *S, gen *g, const chat_ctx *cc) {
    const ib_api_tool_use *tu = cc->tu;
    g->n_stop_ids = ib_chat_stop_ids(S->m, g->stop_ids, MAX_STOP_IDS);
    /* Gemma 4 with tools: a reply ends where its calls hand over to the tools (the model would go on to
     * write a result itself) */
    const int32_t handover = cc->form == IB_CHAT_TOOLS_GEMMA4 && (tu->mode != IB_TOOLS_OFF || cc->history_tools)
                                 ? ib_tokenizer_special(S->m->tok, "<|tool_response>")
                                 : -1;
    if (handover >= 0 && g->n_stop_ids < MAX_STOP_IDS) g->stop_ids[g->n_stop_ids++] = handover;
    /* response_format json_object / json_schema (checked by ib_api_check_fields; json_constraint.c); a
     * named tool_choice: the call's arguments under the function's parameters; "required": a declared
     * name, then its arguments (tool_pick.c; both checked by ib_api_tools) */
    g->tool_mode = tu->mode, g->tool_parallel = tu->parallel, g->tool_form = cc->form;
    snprintf(g->tool_name, sizeof g->tool_name, "%s", tu->name);
    g->want_json = ib_constraint_setup(&g->json, cc->form, cc->b, tu);
    if (g->want_json > 0 && !(g->vcons = ib_constraint_record(cc->b, tu))) g->want_json = -1;
    return g->want_json < 0 ? -1 : 0;
}

/* Several generations answered as one body: np prompts (ids[i][n_ids[i]], each checked against the
 * context) times n choices each, choice k = i * n + j for prompt i's j-th, each in its own session
 * with the same parameters but the seed, which is p's seed + j (so choice j is what the same request
 * with n 1 and that seed gets), all submitted at once so they batch together; a prompt's choices past
 * the first copy its prefilled session but for the last token (the scheduler's prompt sharing), so a
 * prompt is prefilled once; chat (cc) or completions (cc NULL). The usage is that of all. Streamed
 * (p->stream): the choices' chunks as they come, each with its "index" (stream_choices). */
static enum MHD_Result serve_choices(server *S, struct MHD_Connection *c, const chat_ctx *cc, int32_t **ids, const int *n_ids, int np,
                                     gen_params *p, int tidx) {
    const int n = p->n, total = np * n, chat = cc != NULL;
    gen **gs = calloc((size_t)total, sizeof *gs);
    ib_sched_job *jobs = calloc((size_t)total, sizeof *jobs);
    gen_params *qs = calloc((size_t)total, sizeof *qs);   /* each job's parameters (its seed) */
    if (!gs || !jobs || !qs) {
        free(gs), free(jobs), free(qs);
        return send_error(S, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    enum MHD_Result ret = MHD_YES;
    int failed = 0, ng = 0;
    /* every generation made ready (memory admitted, session, parameters), then all submitted at once */
    for (int k = 0; k < total && !failed; k++) {
        const int i = k / n, j = k % n;
        int cap = n_ids[i] + (p->max_tokens > 0 ? p->max_tokens : 1);
        ib_session_opts so = {.max_context = cap, .sampling = p->sp, .kv_dtype = S->o.kv_dtype, .backend = S->o.backend,
                              .kv_chunk = S->o.prefill_chunk};
        size_t bytes = ib_session_kv_bytes_for(S->m, &so);
        char what[48];
        if (np > 1 && n > 1) snprintf(what, sizeof what, "prompt %d choice %d", i, j);
        else if (np > 1) snprintf(what, sizeof what, "prompt %d", i);
        else snprintf(what, sizeof what, "choice %d", j);
        if (admit_generation(S, c, tidx, bytes, what, &ret)) {
            failed = 1;
            break;
        }
        ib_session *s = NULL;
        ib_error err;
        gen_params q;
        gen *g = NULL;
        int qok = !params_copy(p, &q);
        if (qok) q.sp.seed = p->sp.seed + (uint64_t)j;
        if (!qok || ib_session_create(S->m, &so, &s, &err) || !(g = gen_new(S, chat, &q))) {
            if (s) ib_session_free(s);
            if (qok) params_free(&q);
            mem_release(S, tidx, bytes);
            inflight_put(S, tidx);
            ret = send_error(S, c, 503, "server_error", "out_of_memory", NULL, "cannot create a session now; retry later");
            failed = 1;
            break;
        }
        const uint64_t seed = q.sp.seed;
        params_free(&q);
        g->own = s;
        g->reserved = bytes;
        g->tidx = tidx;
        g->inflight = 1;
        g->n_prompt = n_ids[i];
        const int echo_bad = gen_set_prompt(g, ids[i], n_ids[i]);
        if (k > 0) {   /* one response: its choices' ids (their calls') from its own */
            char idk[sizeof g->id + 16];
            snprintf(idk, sizeof idk, "%s-%d", gs[0]->id, k);
            if (strlen(idk) < sizeof g->id) memcpy(g->id, idk, strlen(idk) + 1);
        }
        if (echo_bad || (chat ? chat_gen_setup(S, g, cc) : 0)) {
            ib_sched_event ev = {.done = 1, .finish = "error"}; /* undo as a failed submission does (g's one ref) */
            on_event(g, &ev);
            ret = send_error(S, c, 503, "server_error", "out_of_memory", NULL,
                             echo_bad ? "out of memory for the echoed prompt; retry later" : "out of memory for the schema; retry later");
            failed = 1;
            break;
        }
        if (!chat && S->info->eos_id >= 0) g->stop_ids[g->n_stop_ids++] = S->info->eos_id;
        qs[k] = *p;   /* (the job reads the sampling, limits and bias; the seed is the choice's) */
        qs[k].sp.seed = seed;
        jobs[k] = gen_job(g, s, ids[i], n_ids[i], &qs[k]);
        if (j > 0 && n_ids[i] > 1) {   /* the prompt but its last token is prefilled once, by choice 0 */
            jobs[k].share_with = k - j + 1;
            jobs[k].n_shared = n_ids[i] - 1;
        }
        gs[ng++] = g;
    }
    if (failed) {   /* the ones made ready are undone as a failed submission does (each one's one ref) */
        for (int k = 0; k < ng; k++) {
            ib_sched_event ev = {.done = 1, .finish = "error"};
            on_event(gs[k], &ev);
        }
        ng = 0;
    } else if (gen_submit_n(S, c, gs, jobs, ng, &ret)) {
        failed = 1;
        ng = 0;
    }
    free(jobs);
    free(qs);
    if (!failed && p->stream) {   /* the stream takes the references over */
        ret = stream_choices(S, c, gs, ng, n);
        free(gs);
        return ret;
    }
    /* wait for every generation (a stop string, the time limit or the client leaving cancels) */
    double t_end = now_s() + S->o.timeout_s;
    int gone = 0;
    for (int k = 0; k < ng; k++) {
        gen *g = gs[k];
        pthread_mutex_lock(&g->mu);
        int cancelled = 0;
        for (;;) {
            render(g);
            if (g->done) break;
            if (!gone && client_gone(c)) gone = 1;
            if (failed || g->stopped || gone || now_s() > t_end) {
                if (!cancelled) ib_sched_cancel(S->sched, g->job);
                cancelled = 1;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long long ns = ts.tv_nsec + 200000000LL;
            ts.tv_sec += ns / 1000000000LL;
            ts.tv_nsec = ns % 1000000000LL;
            pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        }
        pthread_mutex_unlock(&g->mu);
    }
    if (!failed) {
        json_t *choices = json_array();
        long long pt = 0, ct = 0;
        const char *bad = NULL;
        for (int k = 0; k < ng; k++) {
            gen *g = gs[k];
            pthread_mutex_lock(&g->mu);
            if (!strcmp(g->finish, "error")) bad = "error";
            else if (!strcmp(g->finish, "cancelled") && !g->stopped && !bad) bad = "cancelled";
            json_t *one = final_json(g);
            pthread_mutex_unlock(&g->mu);
            json_t *ch = json_incref(json_array_get(json_object_get(one, "choices"), 0));
            json_object_set_new(ch, "index", json_integer(k));
            json_object_set(ch, "verification", json_object_get(one, "verification")); /* one record per choice */
            json_array_append_new(choices, ch);
            pt += k % n == 0 ? g->n_prompt : 0;   /* a prompt counted once, as for n 1 */
            ct += g->n;
            json_decref(one);
        }
        if (gone) {
            json_decref(choices);
            ret = MHD_NO;
        } else if (bad) {
            json_decref(choices);
            ret = !strcmp(bad, "error") ? send_error(S, c, 500, "server_error", NULL, NULL, "generation failed")
                                        : send_error(S, c, 504, "server_error", "timeout", NULL,
                                                     "generation cancelled (time limit or shutdown)");
        } else {
            json_t *j = envelope(gs[0], chat ? "chat.completion" : "text_completion");
            json_object_set_new(j, "choices", choices);
            json_t *u = json_object();
            json_object_set_new(u, "prompt_tokens", json_integer(pt));
            json_object_set_new(u, "completion_tokens", json_integer(ct));
            json_object_set_new(u, "total_tokens", json_integer(pt + ct));
            json_object_set_new(j, "usage", u);
            ret = send_json(S, c, 200, j, 0);
        }
    }
    for (int k = 0; k < ng; k++) gen_unref(gs[k]);
    free(gs);
    return ret;
}

/* The refusal of a request of several generations (np prompts x p->n choices): more than the server
 * runs or queues at once. 0 when it may go on; else the 400 is queued into *r. */
static int choices_check(server *S, struct MHD_Connection *c, int np, const gen_params *p, enum MHD_Result *r) {
    const int room = S->o.max_batch + (S->o.max_queue > 0 ? S->o.max_queue : 0);
    if ((long)np * p->n > room) {
        *r = p->n > 1 && np > 1 ? BAD("n", "%d prompts x n %d: more than this server runs or queues at once (%d)", np, p->n, room)
             : p->n > 1         ? BAD("n", "n %d: more than this server runs or queues at once (%d)", p->n, room)
                      : BAD("prompt", "%d prompts: more than this server runs or queues at once (%d)", np, room);
        return -1;
    }
    return 0;
}

/* POST /v1/completions whose prompt is a list of np prompts (strings, or arrays of token ids): each
 * tokenized (the first that fails answers for all), then serve_choices. */
static enum MHD_Result handle_completions_multi(server *S, struct MHD_Connection *c, json_t *b, int np, int tidx) {
    json_t *pr = json_object_get(b, "prompt");
    gen_params p;
    const char *param = NULL;
    char msg[256];
    if (parse_params(S, b, 0, 16, &p, &param, msg, sizeof msg)) return BAD(param, "%s", msg);
    enum MHD_Result ret = MHD_YES;
    if (choices_check(S, c, np, &p, &ret)) {
        params_free(&p);
        return ret;
    }
    int32_t **ids = calloc((size_t)np, sizeof *ids);
    int *n_ids = calloc((size_t)np, sizeof *n_ids), failed = !ids || !n_ids;
    if (failed) ret = send_error(S, c, 500, "server_error", NULL, NULL, "out of memory");
    for (int i = 0; i < np && !failed; i++) {
        json_t *pi = json_array_get(pr, (size_t)i);
        int trc = 0;
        if (json_is_string(pi)) {
            ids[i] = tokenize(S, c, json_string_value(pi), json_string_length(pi), IB_TOKENIZE_ADD_SPECIAL, &n_ids[i], &trc);
        } else {
            long bad;
            ids[i] = json_token_ids(S, pi, &n_ids[i], &trc, &bad);
            if (bad >= 0) {
                ret = BAD("prompt", "prompt[%d][%ld] must be a token id in [0, %d)", i, bad, S->info->vocab_size);
                failed = 1;
                break;
            }
        }
        if (trc == -3) ret = MHD_NO, failed = 1;   /* the client left while its text was tokenized: close */
        else if (trc == -1) ret = send_error(S, c, 500, "server_error", NULL, NULL, "tokenization failed"), failed = 1;
        else if (trc == -2)
            ret = send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "prompt",
                             "prompt %d has more than this server's limit of %d tokens", i, S->o.max_prompt_tokens),
            failed = 1;
        else if (n_ids[i] < 1)
            ret = BAD("prompt", "prompt %d is empty", i), failed = 1;
        else if ((long)n_ids[i] + p.max_tokens > S->info->max_context)
            ret = send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                             "prompt %d: %d tokens + max_tokens %d exceed the model's context of %d", i, n_ids[i],
                             p.max_tokens, S->info->max_context),
            failed = 1;
    }
    if (!failed) ret = serve_choices(S, c, NULL, ids, n_ids, np, &p, tidx);
    for (int i = 0; ids && i < np; i++) free(ids[i]);
    free(ids);
    free(n_ids);
    params_free(&p);
    return ret;
}

/* Whether a messages array carries tool traffic: a tool message or an assistant's tool_calls. */
static int messages_use_tools(json_t *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *r = json_object_get(m, "role"), *tc = json_object_get(m, "tool_calls");
        if ((json_is_string(r) && !strcmp(json_string_value(r), "tool")) || (tc && !json_is_null(tc))) return 1;
    }
    return 0;
}

/* POST /v1/completions and /v1/chat/completions. */
enum MHD_Result handle_generate(server *S, struct MHD_Connection *c, json_t *b, int chat, int tidx) {
    enum MHD_Result mr;
    if (check_model(S, c, b, &mr)) return mr;
    if (check_request(S, c, b, chat ? IB_API_CHAT : IB_API_COMPLETIONS, &mr)) return mr;
    if (!chat) {
        char pmsg[256];
        int np = ib_api_prompt_count(json_object_get(b, "prompt"), pmsg, sizeof pmsg);
        if (np < 0) return BAD("prompt", "%s", pmsg);
        if (np > 0) return handle_completions_multi(S, c, b, np, tidx);
    }
    int32_t *ids = NULL;
    int n_ids = 0, trc = 0, history_tools = 0;
    ib_api_tool_use tu = {0};
    const ib_chat_tool_form form = ib_tokenizer_chat_tools(S->m->tok);
    if (chat) {
        json_t *msgs = json_object_get(b, "messages");
        ib_chat_msg *cm = NULL;
        size_t nm = 0;
        char why[256];
        const char *tp = NULL;
        int trc0 = ib_api_tools(b, &tu, &tp, why, sizeof why);
        if (trc0 == -3) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
        if (trc0 == -2) return send_error(S, c, 400, "invalid_request_error", "unsupported_parameter", tp, "%s", why);
        if (trc0) return BAD(tp, "%s", why);
        history_tools = messages_use_tools(msgs);
        if ((tu.mode != IB_TOOLS_OFF || history_tools) && form == IB_CHAT_TOOLS_NONE)
            return send_error(S, c, 400, "invalid_request_error", "unsupported_parameter",
                              tu.mode != IB_TOOLS_OFF ? "tools" : "messages",
                              "this model's chat template has no tool calls (tools need a ChatML template that "
                              "writes <tool_call> blocks, as Qwen's do, or Gemma 4's, which writes <|tool_call>)");
        ib_api_tool_msgs tm = {0};
        char *prefix = NULL;
        const char *mparam = "messages";
        int mrc = tu.mode != IB_TOOLS_OFF || history_tools
                      ? ib_api_tool_messages(form, msgs, tu.mode != IB_TOOLS_OFF ? tu.tools : NULL, &tm, &mparam, why, sizeof why)
                      : chat_messages(msgs, &cm, &nm, why, sizeof why);
        if (!mrc && tm.m) cm = tm.m, nm = tm.n, tm.m = NULL;   /* the array goes to chat_ids; the texts stay in tm */
        /* a call the reply must be: the prompt ends with its opening (up to the name for "required") */
        if (!mrc && (tu.mode == IB_TOOLS_FORCED || tu.mode == IB_TOOLS_REQUIRED) &&
            !(prefix = ib_api_tool_call_prefix(form, tu.mode == IB_TOOLS_FORCED ? tu.name : NULL)))
            mrc = -2;
        if (mrc) {
            free(cm);
            ib_api_tool_msgs_free(&tm);
        }
        if (mrc == -2) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
        if (mrc) return BAD(mparam, "%s", why);
        int flags = IB_CHAT_GENERATION_PROMPT, think = 1;
        int given = get_bool(b, "enable_thinking", &think);
        if (given < 0) {
            free(cm);
            free(prefix);
            ib_api_tool_msgs_free(&tm);
            return BAD("enable_thinking", "enable_thinking must be a boolean");
        }
        if (!think) flags |= IB_CHAT_NO_THINKING;
        else if (given) flags |= IB_CHAT_THINKING;   /* asked for: Gemma 4 thinks only then */
        enum MHD_Result r;
        const int bad = chat_ids(S, c, cm, nm, flags, prefix, &ids, &n_ids, &trc, &r);
        free(prefix);
        ib_api_tool_msgs_free(&tm);
        if (bad) return r;
    } else {
        json_t *pr = json_object_get(b, "prompt");
        if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
            pr = json_array_get(pr, 0);
        if (json_is_string(pr)) {
            ids = tokenize(S, c, json_string_value(pr), json_string_length(pr), IB_TOKENIZE_ADD_SPECIAL, &n_ids, &trc);
        } else if (json_is_array(pr) && json_array_size(pr) > 0) {
            long bad;
            ids = json_token_ids(S, pr, &n_ids, &trc, &bad);
            if (bad >= 0) return BAD("prompt", "prompt[%ld] must be a token id in [0, %d)", bad, S->info->vocab_size);
        } else
            return BAD("prompt", "prompt must be a string, a non-empty array of token ids, or a list of prompts "
                                 "(strings or arrays of token ids)");
    }
    if (trc == -3) return MHD_NO; /* the client left while its text was tokenized: close */
    if (trc == -1) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory while tokenizing; retry later");
    if (trc == -2) {
        free(ids);
        return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt",
                          "the prompt has more than this server's limit of %d tokens", S->o.max_prompt_tokens);
    }
    if (n_ids < 1) {
        free(ids);
        return BAD(chat ? "messages" : "prompt", "the prompt is empty");
    }
    gen_params p;
    const char *param = NULL;
    char msg[256];
    int room = S->info->max_context - n_ids;
    int def = chat ? (room < S->o.max_tokens ? room : S->o.max_tokens) : 16;
    if (def < 0) def = 0;
    if (parse_params(S, b, chat, def, &p, &param, msg, sizeof msg)) {
        free(ids);
        return BAD(param, "%s", msg);
    }
    if ((long)n_ids + p.max_tokens > S->info->max_context) {
        free(ids);
        params_free(&p);
        return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                          "%d prompt tokens + max_tokens %d exceed the model's context of %d", n_ids, p.max_tokens,
                          S->info->max_context);
    }
    const chat_ctx cc = {b, &tu, form, history_tools};
    if (p.n > 1) {   /* n choices: one body */
        enum MHD_Result r = MHD_YES;
        if (!choices_check(S, c, 1, &p, &r)) r = serve_choices(S, c, chat ? &cc : NULL, &ids, &n_ids, 1, &p, tidx);
        free(ids);
        params_free(&p);
        return r;
    }
    int cap = n_ids + (p.max_tokens > 0 ? p.max_tokens : 1);
    ib_session_opts so = {.max_context = cap, .sampling = p.sp, .kv_dtype = S->o.kv_dtype, .backend = S->o.backend,
                          .kv_chunk = S->o.prefill_chunk};
    size_t bytes = ib_session_kv_bytes_for(S->m, &so);
    enum MHD_Result ret;
    if (admit_generation(S, c, tidx, bytes, "this request", &ret)) {
        free(ids);
        params_free(&p);
        return ret;
    }
    ib_session *s;
    ib_error err;
    gen *g = NULL;
    s = NULL;
    if (ib_session_create(S->m, &so, &s, &err) || !(g = gen_new(S, chat, &p))) {
        ib_session_free(s);
        free(ids);
        params_free(&p);
        mem_release(S, tidx, bytes);
        inflight_put(S, tidx);
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL,
                          "cannot allocate %zu KV bytes for this request now; retry later", bytes);
    }
    g->own = s;
    g->reserved = bytes;
    g->tidx = tidx;
    g->inflight = 1;
    g->n_prompt = n_ids;
    const int echo_bad = gen_set_prompt(g, ids, n_ids);
    if (!chat && S->info->eos_id >= 0) g->stop_ids[g->n_stop_ids++] = S->info->eos_id;
    if (echo_bad || (chat && chat_gen_setup(S, g, &cc))) {
        ib_sched_event ev = {.done = 1, .finish = "error"}; /* undo as run_gen's failure does (g's one ref) */
        on_event(g, &ev);
        free(ids);
        params_free(&p);
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL,
                          echo_bad ? "out of memory for the echoed prompt; retry later" : "out of memory for the schema; retry later");
    }
    enum MHD_Result r = run_gen(S, c, g, s, ids, n_ids, &p);
    free(ids);
    params_free(&p);
    return r;
}
