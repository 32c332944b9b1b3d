/*
 * generate.c — ib_generate: continuous batching over ib_step and ib_sample.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "runtime/runtime.h"

typedef struct slot {
    ib_session *s;
    int req;          /* request index, -1 when idle */
    int fed;          /* prompt tokens fed so far */
    int32_t next;     /* last sampled token, fed at the next step */
    int32_t drawn;    /* the token drawn after this step (draw_task) */
    float *logits;    /* [V] */
    char *text;       /* bytes of the tokens generated so far (requests with stop strings) */
    size_t text_len, text_cap;
} slot;

typedef struct {
    const ib_step_item *items;
    slot *slots;
    const int *item_slot;
} draw_job;

/* Draw the token of item i of the step just run, when it asked for logits. Each draw reads and
 * advances only its own session (seed, step, history), so the items are drawn on any threads with
 * the same tokens; a draw at a temperature over a large vocabulary takes milliseconds. */
static void draw_task(void *ctx, int i, int thread) {
    draw_job *j = ctx;
    if (!j->items[i].logits) return;
    slot *sl = &j->slots[j->item_slot[i]];
    sl->drawn = ib_sample(sl->s, sl->logits);
}

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

/* Append token tok's bytes to the slot's text and return the index of a stop string of rq that the
 * text now contains in a position that reaches into these bytes (so each is found once, when it
 * completes), or -1. -2 when out of memory. */
static int stop_hit(const ib_model *m, slot *sl, const ib_gen_request *rq, int32_t tok) {
    char b[512];
    int w = ib_token_bytes(m, tok, b, sizeof b);
    if (w < 0) w = 0;
    if (sl->text_len + (size_t)w > sl->text_cap) {
        size_t nc = (sl->text_len + (size_t)w) * 2 + 64;
        char *t = realloc(sl->text, nc);
        if (!t) return -2;
        sl->text = t;
        sl->text_cap = nc;
    }
    size_t before = sl->text_len;
    memcpy(sl->text + before, b, (size_t)w);
    sl->text_len += (size_t)w;
    for (int i = 0; i < rq->n_stop; i++) {
        size_t k = strlen(rq->stop[i]);
        if (!k || k > sl->text_len) continue;
        size_t from = before + 1 > k ? before + 1 - k : 0; /* a match must end after `before` */
        if (memmem(sl->text + from, sl->text_len - from, rq->stop[i], k)) return i;
    }
    return -1;
}

/* Record the token chosen from `logits` in result res (of a request allowed `limit` tokens); return 1
 * when the request is finished. */
static int take_token(const ib_gen_opts *o, const ib_model_info *info, int limit, ib_gen_result *res,
                      const float *logits, int32_t tok) {
    int V = info->vocab_size;
    res->digest = ib_digest_bytes(res->digest, logits, (size_t)V * sizeof(float));
    if (res->logits) memcpy(res->logits + (size_t)res->n_tokens * V, logits, (size_t)V * sizeof(float));
    res->tokens[res->n_tokens++] = tok;
    if (o->stop_at_eos && tok == info->eos_id) {
        res->finish = "stop";
        return 1;
    }
    if (res->n_tokens >= limit) {
        res->finish = "length";
        return 1;
    }
    return 0;
}

ib_status ib_generate(ib_engine *e, const ib_gen_request *reqs, int n, const ib_gen_opts *o, ib_gen_result *res,
                      ib_gen_stats *stats, ib_error *err) {
    const ib_model *m = e->model;
    const ib_model_info *info = ib_model_get_info(m);
    int V = info->vocab_size;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < reqs[i].n_stop; k++)
            if (!reqs[i].stop || !reqs[i].stop[k] || !reqs[i].stop[k][0])
                return ib_fail(err, IB_ERR_INVALID_ARG, "generate: request %d: stop string %d is NULL or empty", i, k);
    if (n < 0 || o->batch < 1 || o->max_new_tokens < 0 || o->prefill_chunk < 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "generate: bad options (batch %d, max_new_tokens %d, prefill_chunk %d)",
                       o->batch, o->max_new_tokens, o->prefill_chunk);
    memset(res, 0, (size_t)n * sizeof *res);
    /* context check first: nothing runs when a request cannot fit */
    int need = 1;
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
    }
    int B = o->batch < n ? o->batch : (n > 0 ? n : 1);
    slot *slots = calloc((size_t)B, sizeof *slots);
    ib_step_item *items = calloc((size_t)B, sizeof *items);
    int *item_slot = calloc((size_t)B, sizeof *item_slot);
    ib_status rc = IB_OK;
    if (!slots || !items || !item_slot) {
        rc = ib_fail(err, IB_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    ib_session_opts so = {.max_context = o->max_context > 0 ? o->max_context : need, .sampling = o->sampling,
                          .kv_f16 = o->kv_f16};
    for (int b = 0; b < B; b++) {
        slots[b].req = -1;
        if ((rc = ib_session_create(m, &so, &slots[b].s, err))) goto done;
        if (!(slots[b].logits = malloc((size_t)V * sizeof(float)))) {
            rc = ib_fail(err, IB_ERR_NOMEM, "generate: out of memory");
            goto done;
        }
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
    double t0 = now_s();
    int next_req = 0, steps = 0;
    long prompt_tokens = 0, gen_tokens = 0, decode_tokens = 0;
    double prefill_s = 0, decode_s = 0;
    int budget_max = e->max_tokens;
    for (;;) {
        /* refill idle rows */
        for (int b = 0; b < B; b++)
            while (slots[b].req < 0 && next_req < n) {
                int q = next_req++;
                if (limit_of(&reqs[q], o) == 0) continue; /* nothing to generate: no work */
                slots[b].req = q;
                slots[b].fed = 0;
                slots[b].text_len = 0;
                ib_session_reset(slots[b].s);
                ib_session_set_sampling(slots[b].s, reqs[q].sampling ? reqs[q].sampling : &o->sampling);
                ib_session_note_tokens(slots[b].s, reqs[q].prompt, reqs[q].n_prompt);
            }
        int ni = 0, budget = budget_max;
        for (int b = 0; b < B && budget > 0; b++) {
            slot *sl = &slots[b];
            if (sl->req < 0) continue;
            const ib_gen_request *rq = &reqs[sl->req];
            ib_step_item *it = &items[ni];
            it->session = sl->s;
            if (sl->fed < rq->n_prompt) {
                int left = rq->n_prompt - sl->fed;
                int chunk = o->prefill_chunk > 0 && o->prefill_chunk < left ? o->prefill_chunk : left;
                if (chunk > budget) chunk = budget;
                it->tokens = rq->prompt + sl->fed;
                it->n_tokens = chunk;
                it->logits = sl->fed + chunk == rq->n_prompt ? sl->logits : NULL;
            } else {
                it->tokens = &sl->next;
                it->n_tokens = 1;
                it->logits = sl->logits;
            }
            budget -= it->n_tokens;
            item_slot[ni++] = b;
        }
        if (ni == 0) break;
        int has_prompt = 0;
        for (int i = 0; i < ni; i++) has_prompt |= slots[item_slot[i]].fed < reqs[slots[item_slot[i]].req].n_prompt;
        double ts = now_s();
        if ((rc = ib_step(e, items, ni, err))) goto done;
        steps++;
        draw_job dj = {items, slots, item_slot};
        ib_pool_run(ni > 1 ? e->pool : NULL, ni, draw_task, &dj);
        double dt = now_s() - ts;
        if (has_prompt)
            prefill_s += dt;
        else {
            decode_s += dt;
            decode_tokens += ni;
        }
        for (int i = 0; i < ni; i++) {
            slot *sl = &slots[item_slot[i]];
            const ib_gen_request *rq = &reqs[sl->req];
            if (sl->fed < rq->n_prompt) {
                sl->fed += items[i].n_tokens;
                prompt_tokens += items[i].n_tokens;
            }
            if (!items[i].logits) continue;
            int32_t tok = sl->drawn;
            gen_tokens++;
            int req = sl->req;
            int fin = take_token(o, info, limit_of(rq, o), &res[req], sl->logits, tok);
            if (rq->n_stop > 0) {
                int hit = stop_hit(m, sl, rq, tok);
                if (hit == -2) {
                    rc = ib_fail(err, IB_ERR_NOMEM, "generate: out of memory for stop strings");
                    goto done;
                }
                if (hit >= 0 && !(fin && !strcmp(res[req].finish, "stop"))) {
                    fin = 1;
                    res[req].finish = "stop";
                    res[req].stop_string = hit;
                }
            }
            if (fin)
                sl->req = -1;
            else
                sl->next = tok;
            if (o->on_token) o->on_token(o->on_token_ctx, req, tok, fin);
        }
    }
    if (stats) {
        stats->seconds = now_s() - t0;
        stats->prompt_tokens = prompt_tokens;
        stats->generated_tokens = gen_tokens;
        stats->steps = steps;
        stats->prefill_seconds = prefill_s;
        stats->decode_seconds = decode_s;
        stats->decode_tokens = decode_tokens;
    }
done:
    if (slots)
        for (int b = 0; b < B; b++) {
            ib_session_free(slots[b].s);
            free(slots[b].logits);
            free(slots[b].text);
        }
    free(slots);
    free(items);
    free(item_slot);
    if (rc) ib_gen_results_free(res, n);
    return rc;
}
