/*
 * generate.c — ib_generate: a client of the scheduler. It validates every request before any work,
 * keeps `batch` sessions (rows), and runs the scheduler's own loop on the calling thread (an inline
 * scheduler, scheduler.h): each row holds one request's job; when a job ends, its row's session is
 * reset and the next request is submitted on it, so the next step refills the row. The results are
 * gathered from the jobs' events. There is one continuous-batching loop in isobatch: the scheduler's.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "runtime/runtime.h"
#include "runtime/scheduler.h"

typedef struct gen_run gen_run;

/* One row: a session and the request it serves now. */
typedef struct gen_row {
    gen_run *g;
    ib_session *s;
    int req;                  /* request index; -1 when idle */
    uint64_t job;             /* the scheduler's id of its job */
    int stopped;              /* a stop string ended the request (its job is being cancelled) */
    char *text;               /* bytes of the tokens generated so far (requests with stop strings) */
    size_t text_len, text_cap;
} gen_row;

/* What the rows share: the requests, the options and the results being filled. */
struct gen_run {
    const ib_model *m;
    const ib_gen_request *reqs;
    int n;
    const ib_gen_opts *o;
    int vocab;
    ib_gen_result *res;
    ib_sched *S;
    int next_req;             /* next request to hand to a row */
    int32_t stop_id;          /* the model's eos, a stop id unless ignore_eos */
    int n_stop;
    ib_status rc;             /* first failure (IB_OK while none) */
    ib_error *err;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void ib_gen_results_free(ib_gen_result *r, int n) {
    if (!r) return;
    for (int i = 0; i < n; i++) {
        free(r[i].tokens);
        free(r[i].logits);
        r[i].tokens = NULL;
        r[i].logits = NULL;
    }
}

/* Request r's new-token limit: its own, or the options' when it sets none. */
static int limit_of(const ib_gen_request *r, const ib_gen_opts *o) {
    return r->max_new_tokens > 0 ? r->max_new_tokens : o->max_new_tokens;
}

static void on_event(void *ctx, const ib_sched_event *ev);

/* Append token tok's bytes to the row's text and return the index of a stop string of rq that the
 * text now contains in a position that reaches into these bytes (so each is found once, when it
 * completes), or -1. -2 when out of memory. */
static int stop_hit(const ib_model *m, gen_row *r, const ib_gen_request *rq, int32_t tok) {
    char b[512];
    int w = ib_token_bytes(m, tok, b, sizeof b);
    if (w < 0) w = 0;
    if (r->text_len + (size_t)w > r->text_cap) {
        size_t nc = (r->text_len + (size_t)w) * 2 + 64;
        char *t = realloc(r->text, nc);
        if (!t) return -2;
        r->text = t;
        r->text_cap = nc;
    }
    size_t before = r->text_len;
    memcpy(r->text + before, b, (size_t)w);
    r->text_len += (size_t)w;
    for (int i = 0; i < rq->n_stop; i++) {
        size_t k = strlen(rq->stop[i]);
        if (!k || k > r->text_len) continue;
        size_t from = before + 1 > k ? before + 1 - k : 0; /* a match must end after `before` */
        if (memmem(r->text + from, r->text_len - from, rq->stop[i], k)) return i;
    }
    return -1;
}

/* Give row r the next request that has tokens to generate (one with a limit of 0 needs no work: its
 * result stays empty, "length"), on the row's reset session; the row goes idle when none is left.
 * A submit failure (none is expected: the requests were validated) is recorded and stops the run. */
static void row_next(gen_row *r) {
    gen_run *g = r->g;
    r->req = -1;
    if (g->rc) return;
    while (g->next_req < g->n) {
        int q = g->next_req++;
        const ib_gen_request *rq = &g->reqs[q];
        int lim = limit_of(rq, g->o);
        if (lim == 0) continue;
        ib_session_reset(r->s);
        ib_session_set_sampling(r->s, rq->sampling ? rq->sampling : &g->o->sampling);
        r->stopped = 0;
        r->text_len = 0;
        ib_sched_job jb = {.session = r->s, .prompt = rq->prompt, .n_prompt = rq->n_prompt, .max_new_tokens = lim,
                           .stop_ids = &g->stop_id, .n_stop = g->n_stop, .on_event = on_event, .ctx = r,
                           .digest_logits = 1};
        ib_error e2;
        ib_status rc = ib_sched_submit(g->S, &jb, &r->job, &e2);
        if (rc) {
            g->rc = ib_fail(g->err, rc, "generate: request %d: %s", q, e2.msg);
            ib_sched_stop(g->S);
            return;
        }
        r->req = q;
        return;
    }
}

/* A job's event: a token goes into its request's result (digest of the row that chose it, the row
 * itself when keep_logits) and to on_token; a token completing a stop string ends the request
 * ("stop": its job is cancelled). The end sets the finish reason and hands the row the next request. */
static void on_event(void *ctx, const ib_sched_event *ev) {
    gen_row *r = ctx;
    gen_run *g = r->g;
    const int req = r->req;
    ib_gen_result *res = &g->res[req];
    const ib_gen_request *rq = &g->reqs[req];
    const size_t row_bytes = (size_t)g->vocab * sizeof(float);
    if (!ev->done) {
        if (r->stopped || g->rc) return;
        res->digest = ev->logits_digest;   /* the job's running digest (digest_logits) */
        if (res->logits) memcpy(res->logits + (size_t)res->n_tokens * g->vocab, ev->logits, row_bytes);
        res->tokens[res->n_tokens++] = ev->token;
        const int eos = g->n_stop && ev->token == g->stop_id;
        int fin = res->n_tokens >= limit_of(rq, g->o) || eos;
        if (rq->n_stop > 0 && !eos) {
            int hit = stop_hit(g->m, r, rq, ev->token);
            if (hit == -2) {
                g->rc = ib_fail(g->err, IB_ERR_NOMEM, "generate: out of memory for stop strings");
                ib_sched_stop(g->S);
                return;
            }
            if (hit >= 0) {
                fin = 1;
                r->stopped = 1;
                res->finish = "stop";
                res->stop_string = hit;
                ib_sched_cancel(g->S, r->job);
            }
        }
        if (g->o->on_token) g->o->on_token(g->o->on_token_ctx, req, ev->token, fin);
        return;
    }
    if (!strcmp(ev->finish, "error")) {
        if (!g->rc) g->rc = ib_fail(g->err, ev->status ? ev->status : IB_ERR_STATE, "%s", ev->message);
        ib_sched_stop(g->S);
    }
    if (g->rc) return; /* the run is over: the other jobs end "cancelled" */
    if (!r->stopped) res->finish = ev->finish; /* "stop" or "length": the only ends of a job nobody cancels */
    row_next(r);
}

ib_gen_opts ib_gen_opts_default(void) {
    ib_gen_opts o = {.max_new_tokens = IB_GEN_DEFAULT_MAX_NEW_TOKENS, .sampling = ib_sampling_default()};
    return o;
}

ib_status ib_generate(ib_engine *e, const ib_gen_request *reqs, int n, const ib_gen_opts *o, ib_gen_result *res,
                      ib_gen_stats *stats, ib_error *err) {
    const ib_model *m = e->model;
    const ib_model_info *info = ib_model_get_info(m);
    int V = info->vocab_size;
    if (n < 0 || o->batch < 0 || o->max_new_tokens < 0 || o->prefill_chunk < 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "generate: bad options (batch %d, max_new_tokens %d, prefill_chunk %d)",
                       o->batch, o->max_new_tokens, o->prefill_chunk);
    memset(res, 0, (size_t)n * sizeof *res);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < reqs[i].n_stop; k++)
            if (!reqs[i].stop || !reqs[i].stop[k] || !reqs[i].stop[k][0])
                return ib_fail(err, IB_ERR_INVALID_ARG, "generate: request %d: stop string %d is NULL or empty", i, k);
    /* every check first: nothing runs when a request cannot fit or is malformed */
    int need = 1, longest = 1;
    for (int i = 0; i < n; i++) {
        if (reqs[i].n_prompt < 1)
            return ib_fail(err, IB_ERR_INVALID_ARG, "generate: prompt %d is empty", i);
        if (reqs[i].max_new_tokens < 0)
            return ib_fail(err, IB_ERR_INVALID_ARG, "generate: request %d: max_new_tokens %d is negative", i,
                           reqs[i].max_new_tokens);
        int lim = limit_of(&reqs[i], o);
        int want = reqs[i].n_prompt + (lim > 0 ? lim - 1 : 0);
        int cap = o->max_context > 0 ? o->max_context : info->max_context;
        if (want > cap || want > info->max_context)
            return ib_fail(err, IB_ERR_CONTEXT, "prompt %d: %d tokens + %d new exceed the context of %d tokens", i,
                           reqs[i].n_prompt, lim, cap < info->max_context ? cap : info->max_context);
        if (want > need) need = want;
        if (lim == 0) continue; /* never fed */
        for (int t = 0; t < reqs[i].n_prompt; t++)
            if (reqs[i].prompt[t] < 0 || reqs[i].prompt[t] >= V)
                return ib_fail(err, IB_ERR_INVALID_ARG, "generate: prompt %d: token %d is %d, outside the vocabulary [0, %d)",
                               i, t, reqs[i].prompt[t], V);
        if (reqs[i].n_prompt > longest) longest = reqs[i].n_prompt;
    }
    /* rows: no more than the requests, nor than a step can hold with one token each */
    int B = o->batch > 0 ? o->batch : IB_GEN_DEFAULT_BATCH;
    B = B < n ? B : (n > 0 ? n : 1);
    if (B > e->max_tokens) B = e->max_tokens;
    gen_row *rows = calloc((size_t)B, sizeof *rows);
    ib_status rc = IB_OK;
    gen_run g = {.m = m, .reqs = reqs, .n = n, .o = o, .vocab = V, .res = res, .stop_id = info->eos_id,
                 .n_stop = !o->ignore_eos && info->eos_id >= 0, .err = err};
    if (!rows) {
        rc = ib_fail(err, IB_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    /* kv_chunk: the scheduler's prefill chunk bounds every item, so sliding-window layers (Gemma 4) keep
     * rings of sliding_window + chunk - 1 slots when those are fewer than the context */
    int chunk = o->prefill_chunk > 0 ? o->prefill_chunk : longest;
    if (chunk > e->max_tokens) chunk = e->max_tokens;
    ib_session_opts so = {.max_context = o->max_context > 0 ? o->max_context : need, .sampling = o->sampling,
                          .kv_dtype = o->kv_dtype, .backend = ib_engine_backend(e), .kv_chunk = chunk > 0 ? chunk : 1,
                          .kv_sink = o->kv_sink, .kv_window = o->kv_window};
    for (int b = 0; b < B; b++) {
        rows[b].g = &g;
        rows[b].req = -1;
        if ((rc = ib_session_create(m, &so, &rows[b].s, err))) goto done;
    }
    for (int i = 0; i < n; i++) {
        res[i].digest = IB_DIGEST_INIT;
        res[i].finish = "length";
        res[i].stop_string = -1;
        int lim = limit_of(&reqs[i], o);
        res[i].tokens = malloc(((size_t)lim + 1) * sizeof(int32_t));
        if (o->keep_logits && lim > 0) res[i].logits = malloc((size_t)lim * V * sizeof(float));
        if (!res[i].tokens || (o->keep_logits && lim > 0 && !res[i].logits)) {
            rc = ib_fail(err, IB_ERR_NOMEM, "generate: out of memory for results");
            goto done;
        }
    }
    /* whole prompts (prefill_chunk 0) are the longest prompt's length: the step budget still cuts them */
    ib_sched_opts sched_o = {.max_batch = B, .prefill_chunk = o->prefill_chunk > 0 ? o->prefill_chunk : longest,
                             .max_queue = B};
    if ((rc = ib_sched_create_inline(e, &sched_o, &g.S, err))) goto done;
    double t0 = now_s();
    for (int b = 0; b < B; b++) row_next(&rows[b]);
    ib_sched_drain(g.S);
    if ((rc = g.rc)) goto done;
    if (stats) {
        ib_sched_stats st;
        ib_sched_get_stats(g.S, &st);
        stats->seconds = now_s() - t0;
        stats->prompt_tokens = (long)st.tokens_prefilled;
        stats->generated_tokens = (long)st.tokens_generated;
        stats->steps = (int)st.steps;
        stats->prefill_seconds = st.prefill_seconds;
        stats->decode_seconds = st.step_seconds - st.prefill_seconds;
        stats->decode_tokens = (long)st.decode_tokens;
    }
done:
    ib_sched_free(g.S); /* after an error: cancels what is left, on this thread */
    if (rows)
        for (int b = 0; b < B; b++) ib_session_free(rows[b].s), free(rows[b].text);
    free(rows);
    if (rc) ib_gen_results_free(res, n);
    return rc;
}
