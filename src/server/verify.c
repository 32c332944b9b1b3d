/*
 * verify.c — replay verification records (verify.h): built by the server for every generation,
 * parsed and re-run by `isobatch verify` and POST /v1/verify. Nothing here computes a number of its
 * own: the re-run is an ordinary scheduler job on an ordinary session.
 */
#include "server/verify.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"
#include "store/store.h"

static void hex16(uint64_t v, char out[17]) { snprintf(out, 17, "%016" PRIx64, v); }

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

void ib_verify_fingerprint(const char *model_id, char *buf, size_t n) {
    snprintf(buf, n, "%s/contract-%d", model_id, IB_VERIFY_CONTRACT);
}

json_t *ib_verify_json(const char *model_id, ib_act act, ib_kv_dtype kvd, const char *kv, int max_context, int kv_chunk, const int32_t *hist,
                       int n_hist, const uint8_t *flags, uint64_t draws, const int32_t *prompt, int n_prompt,
                       const ib_sampling *sp, const ib_api_bias *bias, json_t *constraint, const int32_t *stop_ids,
                       int n_stop, const int32_t *tokens, const uint64_t *digests, int n_tokens) {
    json_t *v = json_object();
    json_object_set_new(v, "contract", json_integer(IB_VERIFY_CONTRACT));
    json_object_set_new(v, "model", json_string(model_id));
    json_object_set_new(v, "act", json_string(act == IB_ACT_F32 ? "f32" : "q8"));
    json_object_set_new(v, "kv_dtype", json_string(ib_kv_dtype_name(kvd)));
    json_object_set_new(v, "kv", json_string(kv));
    if (strcmp(kv, "full"))
        json_object_set_new(v, "kv_chunk", json_integer(kv_chunk));
    else
        json_object_set_new(v, "max_context", json_integer(max_context));
    if (n_hist > 0) json_object_set_new(v, "history", ids_json(hist, n_hist));
    if (flags) {
        json_t *f = json_array();
        for (int i = 0; i < n_hist + n_prompt; i++) json_array_append_new(f, json_integer(flags[i]));
        json_object_set_new(v, "flags", f);
    }
    if (draws) json_object_set_new(v, "draws", json_integer((json_int_t)draws));
    json_object_set_new(v, "prompt", ids_json(prompt, n_prompt));
    json_object_set_new(v, "sampling",
                        json_pack("{s:f, s:i, s:f, s:f, s:f, s:i, s:I}", "temperature", (double)sp->temperature, "top_k",
                                  sp->top_k, "top_p", (double)sp->top_p, "min_p", (double)sp->min_p,
                                  "repetition_penalty", (double)sp->repeat_penalty, "repeat_last_n", sp->repeat_last_n,
                                  "seed", (json_int_t)sp->seed));
    if (bias && bias->n > 0) {
        json_t *b = json_array();
        for (int i = 0; i < bias->n; i++)
            json_array_append_new(b, json_pack("[i, f]", bias->ids[i], (double)bias->vals[i]));
        json_object_set_new(v, "logit_bias", b);
    }
    if (constraint && json_object_size(constraint) > 0) {
        json_object_update(v, constraint);
        json_object_set_new(v, "stop_ids", ids_json(stop_ids, n_stop));
    }
    json_object_set_new(v, "tokens", ids_json(tokens, n_tokens));
    char h[17];
    json_t *sd = json_array();
    for (int i = 0; i < n_tokens; i++) {
        hex16(digests[i], h);
        json_array_append_new(sd, json_string(h));
    }
    hex16(n_tokens > 0 ? digests[n_tokens - 1] : IB_DIGEST_INIT, h);
    json_object_set_new(v, "digest", json_string(h));
    json_object_set_new(v, "step_digests", sd);
    return v;
}

void ib_verify_free(ib_vrec *r) {
    if (!r) return;
    free(r->hist);
    free(r->flags);
    free(r->bias_ids);
    free(r->bias);
    free(r->tokens);
    free(r->digests);
    json_decref(r->constraint);
    memset(r, 0, sizeof *r);
}

/* Read array field k of o as token ids in [0, vocab) into a malloc'ed array (at least min entries);
 * absent with min 0: none. 0 or -1 with msg. */
static int get_ids(json_t *o, const char *k, int vocab, int min, int32_t **out, int *n, char *msg, size_t msz) {
    json_t *a = json_object_get(o, k);
    *out = NULL;
    *n = 0;
    if (!a && min == 0) return 0;
    if (!json_is_array(a) || json_array_size(a) < (size_t)min || json_array_size(a) > (1u << 24)) {
        snprintf(msg, msz, "verification.%s must be an array of at least %d token ids", k, min);
        return -1;
    }
    size_t m = json_array_size(a);
    if (!(*out = malloc((m + 1) * sizeof **out))) {
        snprintf(msg, msz, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < m; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            snprintf(msg, msz, "verification.%s[%zu] must be a token id in [0, %d)", k, i, vocab);
            free(*out);
            *out = NULL;
            return -1;
        }
        (*out)[i] = (int32_t)json_integer_value(v);
    }
    *n = (int)m;
    return 0;
}

/* A number field of the sampling object as float (exact for values that came from floats). */
static int get_f(json_t *o, const char *k, float *out, char *msg, size_t msz) {
    json_t *v = json_object_get(o, k);
    if (!json_is_number(v)) {
        snprintf(msg, msz, "verification.sampling.%s must be a number", k);
        return -1;
    }
    *out = (float)json_number_value(v);
    return 0;
}

int ib_verify_parse(json_t *j, int vocab, int max_context, ib_vrec *r, char *msg, size_t msz) {
    memset(r, 0, sizeof *r);
    json_t *v = j;
    if (json_is_object(j) && !json_object_get(j, "contract")) {
        v = json_object_get(j, "verification");
        if (!v) v = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "verification");
    }
    if (!json_is_object(v)) {
        snprintf(msg, msz, "no verification record (a \"verification\" object, or a response carrying one)");
        return -1;
    }
#define FAIL(...) do { snprintf(msg, msz, __VA_ARGS__); ib_verify_free(r); return -1; } while (0)
    json_t *c = json_object_get(v, "contract");
    if (!json_is_integer(c) || json_integer_value(c) != IB_VERIFY_CONTRACT)
        FAIL("verification.contract must be %d (this build's contract version)", IB_VERIFY_CONTRACT);
    json_t *m = json_object_get(v, "model");
    if (!json_is_string(m) || json_string_length(m) >= IB_MODEL_ID_LEN || strncmp(json_string_value(m), "sha256:", 7))
        FAIL("verification.model must be a model identity (sha256:...)");
    snprintf(r->model, sizeof r->model, "%s", json_string_value(m));
    const char *act = json_string_value(json_object_get(v, "act")), *kvd = json_string_value(json_object_get(v, "kv_dtype"));
    if (!act || (strcmp(act, "f32") && strcmp(act, "q8"))) FAIL("verification.act must be \"f32\" or \"q8\"");
    r->act = !strcmp(act, "f32") ? IB_ACT_F32 : IB_ACT_Q8;
    if (!kvd || ib_kv_dtype_parse(kvd, &r->kv_dtype)) FAIL("verification.kv_dtype must be \"f32\", \"f16\" or \"q8\"");
    const char *kv = json_string_value(json_object_get(v, "kv"));
    if (!kv || ib_kv_policy_parse(kv, &r->kv_sink, &r->kv_window))
        FAIL("verification.kv must be full, window:W or sink:S,window:W");
    if (r->kv_window > 0 && (long)r->kv_sink + r->kv_window > max_context)
        FAIL("verification.kv: sink + window exceed the model's context of %d", max_context);
    json_t *mc = json_object_get(v, r->kv_window > 0 ? "kv_chunk" : "max_context");
    long lim = r->kv_window > 0 ? 4096 : max_context;
    if (!json_is_integer(mc) || json_integer_value(mc) < 1 || json_integer_value(mc) > lim)
        FAIL("verification.%s must be an integer in [1, %ld]", r->kv_window > 0 ? "kv_chunk" : "max_context", lim);
    if (r->kv_window > 0) r->kv_chunk = (int)json_integer_value(mc);
    else r->max_context = (int)json_integer_value(mc);
    int32_t *h = NULL, *p = NULL;
    int nh = 0, np = 0;
    if (get_ids(v, "history", vocab, 0, &h, &nh, msg, msz) || get_ids(v, "prompt", vocab, 1, &p, &np, msg, msz)) {
        free(h);
        ib_verify_free(r);
        return -1;
    }
    r->hist = malloc(((size_t)nh + np) * sizeof *r->hist);
    r->flags = malloc((size_t)nh + np);
    if (!r->hist || !r->flags) {
        free(h);
        free(p);
        FAIL("out of memory");
    }
    if (nh) memcpy(r->hist, h, (size_t)nh * sizeof *h);
    memcpy(r->hist + nh, p, (size_t)np * sizeof *p);
    free(h);
    free(p);
    r->n_hist = nh;
    r->n_prompt = np;
    json_t *fl = json_object_get(v, "flags");
    if (fl) {
        if (!json_is_array(fl) || json_array_size(fl) != (size_t)(nh + np))
            FAIL("verification.flags must hold one flag per history and prompt token (%d)", nh + np);
        for (int i = 0; i < nh + np; i++) {
            json_t *f = json_array_get(fl, (size_t)i);
            if (!json_is_integer(f) || json_integer_value(f) < 0 || json_integer_value(f) > 3)
                FAIL("verification.flags[%d] must be an integer in [0, 3]", i);
            r->flags[i] = (uint8_t)json_integer_value(f);
        }
    } else
        memset(r->flags, IB_STORE_TOK_NOTE_ON_FEED, (size_t)nh + np);
    json_t *d = json_object_get(v, "draws");
    if (d && (!json_is_integer(d) || json_integer_value(d) < 0)) FAIL("verification.draws must be an integer >= 0");
    r->draws = d ? (uint64_t)json_integer_value(d) : 0;
    json_t *s = json_object_get(v, "sampling");
    if (!json_is_object(s)) FAIL("verification.sampling must be an object");
    r->sp = ib_sampling_default();
    if (get_f(s, "temperature", &r->sp.temperature, msg, msz) || get_f(s, "top_p", &r->sp.top_p, msg, msz) ||
        get_f(s, "min_p", &r->sp.min_p, msg, msz) || get_f(s, "repetition_penalty", &r->sp.repeat_penalty, msg, msz)) {
        ib_verify_free(r);
        return -1;
    }
    json_t *tk = json_object_get(s, "top_k"), *rl = json_object_get(s, "repeat_last_n"), *sd = json_object_get(s, "seed");
    if (!json_is_integer(tk) || json_integer_value(tk) < -1 || json_integer_value(tk) > (1 << 30))
        FAIL("verification.sampling.top_k must be an integer");
    if (!json_is_integer(rl) || json_integer_value(rl) < 0 || json_integer_value(rl) > (1 << 30))
        FAIL("verification.sampling.repeat_last_n must be an integer >= 0");
    if (!json_is_integer(sd)) FAIL("verification.sampling.seed must be an integer");
    r->sp.top_k = (int)json_integer_value(tk);
    r->sp.repeat_last_n = (int)json_integer_value(rl);
    r->sp.seed = (uint64_t)json_integer_value(sd);
    json_t *lb = json_object_get(v, "logit_bias");
    if (lb) {
        if (!json_is_array(lb) || json_array_size(lb) > IB_MAX_LOGIT_BIAS)
            FAIL("verification.logit_bias must be an array of at most %d [id, bias] pairs", IB_MAX_LOGIT_BIAS);
        size_t nb = json_array_size(lb);
        r->bias_ids = malloc((nb + 1) * sizeof *r->bias_ids);
        r->bias = malloc((nb + 1) * sizeof *r->bias);
        if (!r->bias_ids || !r->bias) FAIL("out of memory");
        for (size_t i = 0; i < nb; i++) {
            json_t *e = json_array_get(lb, i), *id = json_array_get(e, 0), *b = json_array_get(e, 1);
            if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_integer(id) || json_integer_value(id) < 0 ||
                json_integer_value(id) >= vocab || !json_is_number(b))
                FAIL("verification.logit_bias[%zu] must be [token id, bias]", i);
            r->bias_ids[i] = (int32_t)json_integer_value(id);
            r->bias[i] = (float)json_number_value(b);
        }
        r->n_bias = (int)nb;
    }
    int crc = ib_constraint_from_record(v, &r->constraint, msg, msz);
    if (crc) {
        ib_verify_free(r);
        return -1;
    }
    if (r->constraint) {
        int32_t *st = NULL;
        int ns = 0;
        if (get_ids(v, "stop_ids", vocab, 0, &st, &ns, msg, msz)) {
            ib_verify_free(r);
            return -1;
        }
        if (ns > 8) {
            free(st);
            FAIL("verification.stop_ids: at most 8");
        }
        if (ns) memcpy(r->stop_ids, st, (size_t)ns * sizeof *st);
        free(st);
        r->n_stop = ns;
    }
    if (get_ids(v, "tokens", vocab, 1, &r->tokens, &r->n_tokens, msg, msz)) {
        ib_verify_free(r);
        return -1;
    }
    json_t *sds = json_object_get(v, "step_digests");
    if (!json_is_array(sds) || json_array_size(sds) != (size_t)r->n_tokens)
        FAIL("verification.step_digests must hold one digest per token (%d)", r->n_tokens);
    if (!(r->digests = malloc((size_t)r->n_tokens * sizeof *r->digests))) FAIL("out of memory");
    for (int i = 0; i < r->n_tokens; i++) {
        const char *x = json_string_value(json_array_get(sds, (size_t)i));
        char *end = NULL;
        if (!x || strlen(x) != 16 || (r->digests[i] = strtoull(x, &end, 16), *end))
            FAIL("verification.step_digests[%d] must be 16 hex digits", i);
    }
    const char *dg = json_string_value(json_object_get(v, "digest"));
    char last[17];
    hex16(r->digests[r->n_tokens - 1], last);
    if (!dg || strcmp(dg, last)) FAIL("verification.digest must be the last of step_digests");
    if (r->kv_window == 0 && (long)nh + np + r->n_tokens - 1 > r->max_context)
        FAIL("the record's %d tokens exceed its max_context of %d", nh + np + r->n_tokens, r->max_context);
#undef FAIL
    return 0;
}

/* The re-run job's events: the running digest of each drawn token's logits row; the JSON reader. */
static void run_event(void *ctx, const ib_sched_event *ev) {
    ib_vrun *run = ctx;
    pthread_mutex_lock(&run->mu);
    if (!ev->done) {
        run->h = ev->logits_digest;   /* the job's running digest (digest_logits) */
        if (run->n < run->rec->n_tokens) {
            run->tokens[run->n] = ev->token;
            run->digests[run->n] = run->h;
            run->n++;
        }
        if (run->rec->constraint && run->jv) { /* as the server advances its reader past each token */
            int stop = 0;
            for (int i = 0; i < run->rec->n_stop; i++) stop |= run->rec->stop_ids[i] == ev->token;
            for (size_t k = run->jv->off[ev->token]; !stop && k < run->jv->off[ev->token + 1]; k++)
                if (ib_json_step(&run->json, (unsigned char)run->jv->bytes[k])) break;
        }
    } else {
        run->done = 1;
        snprintf(run->finish, sizeof run->finish, "%s", ev->finish);
        pthread_cond_broadcast(&run->cv);
    }
    pthread_mutex_unlock(&run->mu);
}

/* ib_sched_job.constrain of a constrained record's re-run (json_constraint.c dispatches to the
 * schema or tool_pick reader the set-up made). */
static int run_constrain(void *ctx, float *logits, int vocab) {
    ib_vrun *run = ctx;
    return ib_json_mask(&run->json, run->jv, logits, vocab, run->rec->stop_ids, run->rec->n_stop);
}

ib_status ib_verify_submit(ib_sched *sched, const ib_model *m, ib_backend_kind backend, const ib_json_vocab *jv,
                           const ib_vrec *rec, ib_vrun *run, ib_error *err) {
    memset(run, 0, sizeof *run);
    if (rec->constraint && !jv) return ib_fail(err, IB_ERR_INVALID_ARG, "verify: a constrained record needs the vocabulary");
    pthread_mutex_init(&run->mu, NULL);
    pthread_cond_init(&run->cv, NULL);
    run->rec = rec;
    run->jv = jv;
    run->h = IB_DIGEST_INIT;
    run->vocab = ib_model_get_info(m)->vocab_size;
    ib_json_init(&run->json);
    if (rec->constraint) { /* the mask the server used, built by the server's own set-up */
        const ib_chat_tool_form form = ib_tokenizer_chat_tools(m->tok);
        ib_api_tool_use tu;
        const char *param;
        char m[256];
        int trc = ib_api_tools(rec->constraint, &tu, &param, m, sizeof m);
        if (trc) return ib_fail(err, trc == -3 ? IB_ERR_NOMEM : IB_ERR_INVALID_ARG, "verify: %s", m);
        if (ib_constraint_setup(&run->json, form, rec->constraint, &tu) != 1)
            return ib_fail(err, IB_ERR_NOMEM, "verify: out of memory for the record's constraint");
    }
    run->tokens = malloc((size_t)rec->n_tokens * sizeof *run->tokens);
    run->digests = malloc((size_t)rec->n_tokens * sizeof *run->digests);
    if (!run->tokens || !run->digests) return ib_fail(err, IB_ERR_NOMEM, "verify: out of memory");
    int total = rec->n_hist + rec->n_prompt;
    ib_session_opts so = {.max_context = rec->max_context, .sampling = rec->sp, .kv_sink = rec->kv_sink,
                          .kv_window = rec->kv_window, .kv_chunk = rec->kv_chunk, .kv_dtype = rec->kv_dtype,
                          .backend = backend};
    ib_status rc = ib_session_create(m, &so, &run->s, err);
    if (rc) return rc;
    ib_store_session sr = {.tokens = rec->hist, .flags = rec->flags, .n_tokens = total,
                           .progress = {.sampling = rec->sp, .draws = rec->draws, .n_fed = rec->n_hist}};
    ib_store_replay_notes(run->s, &sr);
    ib_sched_job jb = {.session = run->s, .prompt = rec->hist, .n_prompt = total, .n_replay = rec->n_hist,
                       .max_new_tokens = rec->n_tokens, .on_event = run_event, .ctx = run,
                       .logit_bias_ids = rec->bias_ids, .logit_bias = rec->bias, .n_logit_bias = rec->n_bias,
                       .constrain = rec->constraint ? run_constrain : NULL, .constrain_ctx = run, .digest_logits = 1};
    return ib_sched_submit(sched, &jb, NULL, err);
}

void ib_verify_wait(ib_vrun *run) {
    pthread_mutex_lock(&run->mu);
    while (!run->done) pthread_cond_wait(&run->cv, &run->mu);
    pthread_mutex_unlock(&run->mu);
}

void ib_verify_run_free(ib_vrun *run) {
    if (!run->rec) return; /* never set up */
    ib_session_free(run->s);
    ib_json_release(&run->json);
    free(run->tokens);
    free(run->digests);
    pthread_mutex_destroy(&run->mu);
    pthread_cond_destroy(&run->cv);
    memset(run, 0, sizeof *run);
}

json_t *ib_verify_compare(const ib_vrec *rec, const ib_vrun *run) {
    int k = 0;
    while (k < rec->n_tokens && k < run->n && run->tokens[k] == rec->tokens[k] && run->digests[k] == rec->digests[k]) k++;
    int match = k == rec->n_tokens;
    json_t *o = json_object();
    json_object_set_new(o, "match", json_boolean(match));
    json_object_set_new(o, "steps", json_integer(rec->n_tokens));
    json_object_set_new(o, "model", json_string(rec->model));
    if (match) {
        char h[17];
        hex16(rec->digests[rec->n_tokens - 1], h);
        json_object_set_new(o, "digest", json_string(h));
        json_object_set_new(o, "first_diverging_step", json_null());
        return o;
    }
    json_object_set_new(o, "first_diverging_step", json_integer(k));
    char a[17], b[17];
    hex16(rec->digests[k], a);
    json_object_set_new(o, "expected", json_pack("{s:i, s:s}", "token", rec->tokens[k], "digest", a));
    if (k < run->n) {
        hex16(run->digests[k], b);
        json_object_set_new(o, "got", json_pack("{s:i, s:s}", "token", run->tokens[k], "digest", b));
    } else
        json_object_set_new(o, "got", json_pack("{s:n, s:n, s:s}", "token", "digest", "finish", run->finish));
    return o;
}
