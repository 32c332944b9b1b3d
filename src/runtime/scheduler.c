/*
 * scheduler.c — continuous batching on a loop thread: jobs (a session, a prompt, a token budget)
 * join and leave at any step; prompts are fed in chunks interleaved with the others' decode rows.
 * The contract is in include/isobatch.h ("scheduler"). The same loop also runs without a thread, on
 * its caller's (ib_sched_create_inline / ib_sched_drain, scheduler.h): that is how ib_generate batches.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/fmath.h"
#include "ops/ops.h"
#include "runtime/runtime.h"
#include "runtime/scheduler.h"

const double ib_sched_hist_ms[11] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000};

typedef struct job {
    uint64_t id;
    ib_session *s;
    int32_t *prompt;          /* [n_prompt] (owned copy) */
    int n_prompt, fed;
    int max_new, generated;
    int32_t next;             /* last sampled token, fed at the next step */
    int32_t *stops;           /* [n_stop] (owned copy) */
    int n_stop;
    int want_lp, top;         /* logprob of each token; how many top alternatives */
    float *rows;              /* [IB_PROMPT_LOGITS_ROWS][V] a prompt chunk's logits rows (prompt_logprobs,
                               * until the prompt is fed), else NULL */
    struct draw *pdraw;       /* [IB_PROMPT_LOGITS_ROWS] the chunk's prompt tokens' logprobs (prompt_logprobs) */
    int group;                /* fairness group (ib_sched_job.group) */
    ib_sched_event_fn fn;
    void *ctx;
    int cancel;               /* set under the lock by ib_sched_cancel */
    const char *finish;       /* set when the job ends */
    float *logits;            /* [V] */
    int32_t *bias_ids;        /* [n_bias] logit_bias: ids (owned copy) */
    float *bias;              /* [n_bias] values added to those logits before the draw */
    int n_bias;
    int (*constrain)(void *ctx, float *logits, int vocab);
    void *constrain_ctx;
    int n_replay;             /* prompt tokens [0, n_replay) are fed without being noted */
    int want_digest;          /* ib_sched_job.digest_logits */
    uint64_t digest;          /* the running digest of its tokens' logits rows (want_digest) */
    float *raw;               /* [V] the raw row while a constraint masks it (constrain only) */
    double t_submit;          /* when submitted (CLOCK_MONOTONIC seconds) */
    double queued_s;          /* seconds it waited for a batch slot (set when admitted) */
    uint64_t share_from;      /* the id of its share_with job while its copy is still to come; 0 after */
    int n_shared;
    int hold;                 /* > 0: a job waits to share this one's first `hold` prompt tokens, so its
                               * prompt stops there (recomputed by shares_settle every step) */
    int start_pos;            /* the session's position when the job was admitted */
    struct job *qnext;        /* wait queue link */
} job;

struct ib_sched {
    ib_engine *e;
    ib_sched_opts o;
    pthread_t thread;         /* not started when inline */
    int inline_run;           /* no thread: the loop runs in ib_sched_drain on the caller's thread */
    int draining;             /* inline: ib_sched_drain is running (touched by its thread only) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int joined;               /* ib_sched_stop has joined (or is joining) the thread */
    uint64_t next_id;
    job **active;             /* [max_batch] */
    int n_active;
    job *qhead, *qtail;
    int n_queued;
    int rr;                   /* rotating start for prefill chunks */
    /* fairness: when each recent group last had a job admitted (take_fair) */
    struct { int group; uint64_t seq; } recent[64];
    int n_recent;
    uint64_t admit_seq;
    ib_sched_stats st;
    /* step buffers, loop thread only */
    ib_step_item *items;      /* [max_batch] */
    job **item_job;           /* [max_batch] */
    struct draw *draws;       /* [max_batch]: the sampling pass's results per item */
    job **done;               /* [max_batch]: jobs ending at this step boundary */
    const char **done_why;    /* [max_batch]: their finish reasons */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* out[i] = ib_exp((double)l[i] - m) for i < n; ib_exp_lane gives ib_exp's bits lane by lane, so the
 * vector clones do too. */
IB_VECTOR_CLONES static void exps_(const float *l, int n, double m, double *out) {
    for (int i = 0; i < n; i++) out[i] = ib_exp_lane((double)l[i] - m);
}

/* log(sum exp(logits)) as max + log(sum exp(l - max)), summed in ascending id order; *mx gets the max.
 * The exponentials are taken a block at a time in the vector unit, the sum stays one chain. */
static double log_sum_exp(const float *logits, int vocab, double *mx) {
    enum { BLOCK = 512 };
    double m = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > m) m = logits[i];
    double sum = 0.0, e[BLOCK];
    for (int b0 = 0; b0 < vocab; b0 += BLOCK) {
        const int n = vocab - b0 < BLOCK ? vocab - b0 : BLOCK;
        exps_(logits + b0, n, m, e);
        for (int i = 0; i < n; i++) sum += e[i];
    }
    *mx = m;
    return ib_log(sum);
}

/* log p(id) given the vocabulary's max and log-sum-exp (from log_sum_exp). */
static double logprob_at(const float *logits, int32_t id, double mx, double lse) {
    return ((double)logits[id] - mx) - lse;
}

double ib_logprob(const float *logits, int vocab, int32_t id) {
    if (id < 0 || id >= vocab) return 0.0;
    double mx, lse = log_sum_exp(logits, vocab, &mx);
    return logprob_at(logits, id, mx, lse);
}

/* The ids of the k largest logits (k clamped to 0..IB_MAX_TOP_LOGPROBS and vocab), largest first, the
 * lower id first among equal logits; returns how many. */
static int top_ids(const float *logits, int vocab, int k, int32_t *ids) {
    if (k > IB_MAX_TOP_LOGPROBS) k = IB_MAX_TOP_LOGPROBS;
    if (k > vocab) k = vocab;
    if (k <= 0) return 0;
    int n = 0;
    /* insertion into a sorted list of at most k: strictly greater logits go first, so among equal
     * logits the earlier (lower) id stays ahead */
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        if (n == k && !(v > logits[ids[n - 1]])) continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && v > logits[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = i;
    }
    return n;
}

int ib_top_logprobs(const float *logits, int vocab, int k, int32_t *ids, double *lp) {
    int n = top_ids(logits, vocab, k, ids);
    if (n == 0) return 0;
    double mx, lse = log_sum_exp(logits, vocab, &mx);
    for (int i = 0; i < n; i++) lp[i] = logprob_at(logits, ids[i], mx, lse);
    return n;
}

static void job_free(job *j) {
    if (!j) return;
    free(j->prompt);
    free(j->stops);
    free(j->logits);
    free(j->bias_ids);
    free(j->bias);
    free(j->raw);
    free(j->rows);
    free(j->pdraw);
    free(j);
}

/* Report DONE for j (outside the lock) and free it; status and msg describe an "error" end. */
static void job_finish(job *j, const char *finish, ib_status status, const char *msg) {
    ib_sched_event ev = {.done = 1, .token = -1, .finish = finish, .prompt_fed = j->fed, .generated = j->generated,
                         .status = status, .message = msg, .queue_seconds = j->queued_s};
    if (j->fn) j->fn(j->ctx, &ev);
    job_free(j);
}

static int is_stop(const job *j, int32_t t) {
    for (int i = 0; i < j->n_stop; i++)
        if (j->stops[i] == t) return 1;
    return 0;
}

/* What the sampling pass decided for one item of a step. */
typedef enum { DRAW_PROMPT_GOES_ON, DRAW_NO_ROOM, DRAW_TOKEN } draw_outcome;

/* One item's outcome of a step and, for DRAW_TOKEN, its token and what its job asked to know (also one
 * prompt token's logprobs, for a prompt_logprobs job's PROMPT events). */
typedef struct draw {
    draw_outcome outcome;
    int32_t tok;
    double logprob;
    int n_top;
    int32_t top_ids[IB_MAX_TOP_LOGPROBS];
    double top_lp[IB_MAX_TOP_LOGPROBS];
} draw;

/* The logprob (and top alternatives as the job asks) of token tok under the logits row lg into d. */
static void draw_logprobs(const job *j, const float *lg, int V, int32_t tok, draw *d) {
    /* ib_logprob's and ib_top_logprobs' numbers, the vocabulary's log-sum-exp taken once */
    double mx, lse = log_sum_exp(lg, V, &mx);
    d->tok = tok;
    d->logprob = logprob_at(lg, tok, mx, lse);
    d->n_top = j->top ? top_ids(lg, V, j->top, d->top_ids) : 0;
    for (int k = 0; k < d->n_top; k++) d->top_lp[k] = logprob_at(lg, d->top_ids[k], mx, lse);
}

/* Sampling pass task for item i of the step just run: a prompt_logprobs job's chunk gets its prompt
 * tokens' logprobs (pdraw, for prompt_events); notes the item's prompt tokens in its session and, when
 * the item ends its prompt or generates, draws its token (with the logprobs its job wants).
 * Every item's work touches only its own job and session, and a draw depends only on the session's
 * own seed, step and history, so items are drawn on any threads in any order with the same result;
 * over a vocabulary of 150k, a temperature draw with logprobs takes milliseconds, and done one item
 * after another it held back every step of a busy server. */
static void sample_task(void *ctx, int i, int thread) {
    ib_sched *S = ctx;
    job *j = S->item_job[i];
    draw *d = &S->draws[i];
    const int V = S->e->model->cfg.vocab_size;
    if (j->rows && j->fed < j->n_prompt) {
        /* PROMPT events: row t of the chunk (prompt token fed + t) scores prompt token fed + t + 1 */
        const int n = S->items[i].n_tokens;
        for (int t = 0; t < n && j->fed + t + 1 < j->n_prompt; t++)
            draw_logprobs(j, j->rows + (size_t)t * V, V, j->prompt[j->fed + t + 1], &j->pdraw[t]);
    }
    if (j->fed < j->n_prompt) {
        /* replayed tokens (a rebuild) were noted by the caller; the rest as they are fed */
        int skip = j->n_replay - j->fed;
        if (skip < 0) skip = 0;
        if (skip < S->items[i].n_tokens)
            ib_session_note_tokens(j->s, S->items[i].tokens + skip, S->items[i].n_tokens - skip);
        d->outcome = DRAW_PROMPT_GOES_ON;
        if (j->fed + S->items[i].n_tokens < j->n_prompt) return;
    }
    d->outcome = DRAW_NO_ROOM;
    if (j->generated >= j->max_new) return;
    d->outcome = DRAW_TOKEN;
    /* logit_bias: added to the job's own logits row for the draw only, then the raw values are put
     * back, so logprobs stay those of the raw logits. Bias values and order are the job's alone. */
    float saved[IB_MAX_LOGIT_BIAS];
    if (j->constrain) memcpy(j->raw, j->logits, (size_t)V * sizeof(float));
    for (int k = 0; k < j->n_bias; k++) {
        saved[k] = j->logits[j->bias_ids[k]];
        j->logits[j->bias_ids[k]] = saved[k] + j->bias[k];
    }
    if (j->constrain && j->constrain(j->constrain_ctx, j->logits, V) == 0) { /* nothing left: unconstrained */
        memcpy(j->logits, j->raw, (size_t)V * sizeof(float));
        for (int k = 0; k < j->n_bias; k++) j->logits[j->bias_ids[k]] += j->bias[k];
    }
    d->tok = ib_sample(j->s, j->logits);
    if (j->constrain)
        memcpy(j->logits, j->raw, (size_t)V * sizeof(float));
    else
        for (int k = j->n_bias - 1; k >= 0; k--) j->logits[j->bias_ids[k]] = saved[k];
    if (j->want_digest) j->digest = ib_digest_bytes(j->digest, j->logits, (size_t)V * sizeof(float));
    d->logprob = 0.0;
    d->n_top = 0;
    if (j->want_lp || j->top) draw_logprobs(j, j->logits, V, d->tok, d);
}

/* Deliver the PROMPT events of the chunk item it just fed for job j (prompt tokens from + 1 ..), on the
 * loop thread without the lock. */
static void prompt_events(const ib_sched *S, job *j, const ib_step_item *it, int from) {
    const int V = S->e->model->cfg.vocab_size;
    for (int t = 0; t < it->n_tokens && from + t + 1 < j->n_prompt; t++) {
        const draw *p = &j->pdraw[t];
        ib_sched_event ev = {.prompt = 1, .prompt_index = from + t + 1, .token = p->tok, .logprob = p->logprob,
                             .logits = j->rows + (size_t)t * V, .queue_seconds = j->queued_s};
        if (j->top) ev.n_top = p->n_top, ev.top_ids = p->top_ids, ev.top_logprob = p->top_lp;
        if (j->fn) j->fn(j->ctx, &ev);
    }
}

/* When group g last had a job admitted (0: not among the 64 most recent groups). Lock held. */
static uint64_t group_last(const ib_sched *S, int g) {
    for (int i = 0; i < S->n_recent; i++)
        if (S->recent[i].group == g) return S->recent[i].seq;
    return 0;
}

/* Record an admission of group g (the least recent entry makes room). Lock held. */
static void group_admitted(ib_sched *S, int g) {
    uint64_t seq = ++S->admit_seq;
    int k = -1;
    for (int i = 0; i < S->n_recent && k < 0; i++)
        if (S->recent[i].group == g) k = i;
    if (k < 0 && S->n_recent < 64) k = S->n_recent++;
    if (k < 0) {
        k = 0;
        for (int i = 1; i < 64; i++)
            if (S->recent[i].seq < S->recent[k].seq) k = i;
    }
    S->recent[k].group = g;
    S->recent[k].seq = seq;
}

/* Unlink and return the queued job to admit next (queue not empty, lock held): among the groups
 * with the fewest active jobs, the one whose last admission is the oldest, and its longest-waiting
 * job. So groups take turns, and one group's backlog cannot keep another out of the batch.
 * O(queued x active), both bounded by the options. */
static job *take_fair(ib_sched *S) {
    job *best = NULL, *best_prev = NULL, *prev = NULL;
    int best_n = 0;
    uint64_t best_last = 0;
    for (job *q = S->qhead; q; prev = q, q = q->qnext) {
        if (best && q->group == best->group) continue;
        int n = 0;
        for (int a = 0; a < S->n_active; a++) n += S->active[a]->group == q->group;
        uint64_t last = group_last(S, q->group);
        if (!best || n < best_n || (n == best_n && last < best_last)) best = q, best_prev = prev, best_n = n, best_last = last;
    }
    if (best_prev) best_prev->qnext = best->qnext;
    else S->qhead = best->qnext;
    if (S->qtail == best) S->qtail = best_prev;
    best->qnext = NULL;
    group_admitted(S, best->group);
    return best;
}

/* The active job of id id, or NULL. Loop thread. */
static job *active_job(ib_sched *S, uint64_t id) {
    for (int a = 0; a < S->n_active; a++)
        if (S->active[a]->id == id) return S->active[a];
    return NULL;
}

/* Whether src's session, once src has fed n_shared prompt tokens, is what j's would be after feeding
 * its own first n_shared: both fresh sessions (nothing fed, nothing replayed), the same tokens, and a
 * source that has not drawn by then (n_shared < its prompt). The KV settings are ib_session_copy's to
 * check. */
static int share_fits(const job *j, const job *src) {
    return j->fed == 0 && j->s->pos == 0 && j->n_replay == 0 && src->start_pos == 0 && src->n_replay == 0 &&
           j->n_shared < j->n_prompt && j->n_shared < src->n_prompt &&
           memcmp(j->prompt, src->prompt, (size_t)j->n_shared * sizeof(int32_t)) == 0;
}

/* share_min (automatic sharing): for job j, just admitted, whose session starts empty and that shares
 * nothing yet, the active job of its own group whose prompt starts with the longest run of j's first
 * tokens — at least share_min, less than both prompts — and that has not fed past it, not itself
 * waiting for a longer copy: j then waits to copy that run from it (share_from, n_shared). Only within
 * a group (a server's API key): across tenants a request's time to first token would tell whether
 * another tenant's running request starts the same way. Loop thread, lock held. */
static void share_find(ib_sched *S, job *j) {
    if (S->o.share_min <= 0 || j->share_from || j->s->pos != 0 || j->n_replay != 0 || j->rows) return;
    job *best = NULL;
    int best_len = 0;
    for (int a = 0; a < S->n_active; a++) {
        job *src = S->active[a];
        if (src == j || src->group != j->group || src->s == j->s || src->start_pos != 0 || src->n_replay != 0) continue;
        int cap = (j->n_prompt < src->n_prompt ? j->n_prompt : src->n_prompt) - 1, len = 0;
        while (len < cap && j->prompt[len] == src->prompt[len]) len++;
        if (len < S->o.share_min || len <= best_len || src->fed > len || (src->share_from && src->n_shared > len))
            continue;
        best = src, best_len = len;
    }
    if (best) j->share_from = best->id, j->n_shared = best_len;
}

/* Prompt sharing, once per step before it is built (loop thread, lock held): every job waiting for a
 * copy (share_from) whose source is active and has fed less than the shared tokens holds that source's
 * prompt there (the source's hold: the smallest such length); a job whose source has fed exactly that
 * many is ready for shares_copy (the count of those is returned); one whose source is gone, past them
 * or unfit feeds its whole prompt itself. Under IB_FAULT_SHARE_EARLY the hold and the copy come one
 * token early. */
static int shares_settle(ib_sched *S) {
    const int early = ib_fault_get() == IB_FAULT_SHARE_EARLY;
    int ready = 0;
    for (int a = 0; a < S->n_active; a++) S->active[a]->hold = 0;
    for (int a = 0; a < S->n_active; a++) {
        job *j = S->active[a];
        if (!j->share_from) continue;
        job *src = active_job(S, j->share_from);
        const int at = j->n_shared - early;   /* where the source's session is copied */
        if (!src || src->fed > at || !share_fits(j, src)) {
            j->share_from = 0;   /* feeds its own */
            continue;
        }
        if (src->fed == at) {
            ready++;
            continue;
        }
        if (!src->hold || at < src->hold) src->hold = at;
    }
    return ready;
}

/* Serve the ready jobs shares_settle found: copy each one's source session into its own, after which it
 * has "fed" the shared tokens (a failed copy: it feeds them itself). Loop thread, lock NOT held (a copy
 * of a long prompt's KV takes milliseconds; nothing else touches these jobs' sessions or fields). */
static void shares_copy(ib_sched *S, job **act, int na) {
    const int early = ib_fault_get() == IB_FAULT_SHARE_EARLY;
    long long copied = 0;
    for (int a = 0; a < na; a++) {
        job *j = act[a];
        if (!j->share_from) continue;
        job *src = NULL;
        for (int b = 0; b < na && !src; b++)
            if (act[b]->id == j->share_from) src = act[b];
        if (!src || src->fed != j->n_shared - early) continue;   /* still waiting */
        ib_error err;
        if (ib_session_copy(j->s, src->s, &err) == IB_OK) {
            j->fed = j->n_shared;
            copied += j->n_shared;
        }
        j->share_from = 0;
    }
    pthread_mutex_lock(&S->mu);
    S->st.tokens_shared += copied;
    pthread_mutex_unlock(&S->mu);
}

/* The loop: admit, drop cancelled jobs, build one step, run it, hand out tokens; until stopped (then
 * every job still known ends "cancelled") or, inline, until no job is active or queued. Events are
 * delivered without the lock held, so callbacks may submit and cancel. */
static void run_loop(ib_sched *S) {
    ib_engine *e = S->e;
    job **done = S->done;
    const char **done_why = S->done_why;
    pthread_mutex_lock(&S->mu);
    for (;;) {
        while (S->n_active < S->o.max_batch && S->qhead) {
            job *j = take_fair(S);
            S->n_queued--;
            j->queued_s = now_s() - j->t_submit;
            j->start_pos = j->s->pos;
            S->active[S->n_active++] = j;
            share_find(S, j);
        }
        if (S->stop) break;
        /* cancelled jobs leave now */
        int nd = 0;
        for (int a = 0; a < S->n_active;) {
            if (S->active[a]->cancel) {
                done[nd] = S->active[a];
                done_why[nd++] = "cancelled";
                S->active[a] = S->active[--S->n_active];
            } else
                a++;
        }
        S->st.active = S->n_active;
        S->st.queued = S->n_queued;
        if (nd) {
            pthread_mutex_unlock(&S->mu);
            for (int i = 0; i < nd; i++) job_finish(done[i], done_why[i], IB_OK, NULL);
            pthread_mutex_lock(&S->mu);
            continue;
        }
        if (S->n_active == 0) {
            if (S->inline_run) break; /* idle: nothing queued either (admission above took it) */
            pthread_cond_wait(&S->cv, &S->mu);
            continue;
        }
        /* prompt sharing: serve the jobs whose copies are ready (unlocked), then look again */
        if (shares_settle(S)) {
            const int na = S->n_active;
            pthread_mutex_unlock(&S->mu);
            shares_copy(S, S->active, na);
            pthread_mutex_lock(&S->mu);
            continue;
        }
        /* one decode row per decoding job, then prompt chunks from a rotating start (a job waiting for
         * a copy brings none; a source others wait for stops its prompt at their shared length) */
        int ni = 0, budget = e->max_tokens, na = S->n_active;
        for (int a = 0; a < na && budget > 0; a++) {
            job *j = S->active[a];
            if (j->fed < j->n_prompt) continue;
            S->items[ni] = (ib_step_item){.session = j->s, .tokens = &j->next, .n_tokens = 1, .logits = j->logits};
            S->item_job[ni++] = j;
            budget--;
        }
        for (int k = 0; k < na && budget > 0; k++) {
            job *j = S->active[(S->rr + k) % na];
            if (j->fed >= j->n_prompt || j->share_from) continue;
            int chunk = (j->hold > 0 ? j->hold : j->n_prompt) - j->fed;
            if (chunk > S->o.prefill_chunk) chunk = S->o.prefill_chunk;
            if (j->rows && chunk > IB_PROMPT_LOGITS_ROWS) chunk = IB_PROMPT_LOGITS_ROWS;
            if (ib_session_max_item(j->s) > 0 && chunk > ib_session_max_item(j->s)) chunk = ib_session_max_item(j->s);
            if (chunk > budget) chunk = budget;
            int last = j->fed + chunk == j->n_prompt;
            S->items[ni] = (ib_step_item){.session = j->s, .tokens = j->prompt + j->fed, .n_tokens = chunk,
                                          .logits = last && j->max_new > 0 ? j->logits : NULL, .row_logits = j->rows};
            S->item_job[ni++] = j;
            budget -= chunk;
        }
        S->rr = (S->rr + 1) % (na > 0 ? na : 1);
        pthread_mutex_unlock(&S->mu);

        ib_error err;
        double t0 = now_s();
        ib_status rc = ib_step(e, S->items, ni, &err);
        double dt = now_s() - t0;
        long long pre = 0, gen = 0;
        nd = 0;
        if (!rc) ib_pool_run(ni > 1 ? e->pool : NULL, ni, sample_task, S);
        for (int i = 0; i < ni; i++) {
            job *j = S->item_job[i];
            if (rc) {
                done[nd] = j;
                done_why[nd++] = "error";
                continue;
            }
            const draw *d = &S->draws[i];
            if (j->fed < j->n_prompt) {
                if (j->rows) prompt_events(S, j, &S->items[i], j->fed);
                j->fed += S->items[i].n_tokens;   /* noted in the session by sample_task */
                if (j->rows && j->fed >= j->n_prompt) { /* the prompt is scored: its rows' memory goes */
                    free(j->rows), free(j->pdraw);
                    j->rows = NULL, j->pdraw = NULL;
                }
                pre += S->items[i].n_tokens;
            }
            if (d->outcome == DRAW_PROMPT_GOES_ON) continue;
            if (d->outcome == DRAW_NO_ROOM) {
                done[nd] = j;
                done_why[nd++] = "length";
                continue;
            }
            int32_t t = d->tok;
            j->generated++;
            gen++;
            ib_sched_event ev = {.done = 0, .token = t, .logprob = d->logprob, .logits = j->logits,
                                 .logits_digest = j->want_digest ? j->digest : 0, .queue_seconds = j->queued_s};
            if (j->top) {
                ev.n_top = d->n_top;
                ev.top_ids = d->top_ids;
                ev.top_logprob = d->top_lp;
            }
            if (j->fn) j->fn(j->ctx, &ev);
            j->next = t;
            if (is_stop(j, t) || j->generated >= j->max_new) {
                done[nd] = j;
                done_why[nd++] = is_stop(j, t) ? "stop" : "length";
            }
        }
        pthread_mutex_lock(&S->mu);
        S->st.steps++;
        S->st.last_batch = ni;
        S->st.tokens_prefilled += pre;
        S->st.tokens_generated += gen;
        S->st.step_seconds += dt;
        if (pre > 0) S->st.prefill_seconds += dt;
        else S->st.decode_tokens += gen;
        int b = 0;
        while (b < 11 && dt * 1000.0 > ib_sched_hist_ms[b]) b++;
        S->st.step_hist[b]++;
        for (int i = 0; i < nd; i++)
            for (int a = 0; a < S->n_active; a++)
                if (S->active[a] == done[i]) {
                    S->active[a] = S->active[--S->n_active];
                    break;
                }
        S->st.active = S->n_active;
        if (nd) {
            pthread_mutex_unlock(&S->mu);
            for (int i = 0; i < nd; i++) job_finish(done[i], done_why[i], rc, rc ? err.msg : NULL);
            pthread_mutex_lock(&S->mu);
        }
    }
    /* stopping (or idle, inline: nothing is left): everything still known is cancelled */
    job *q = S->qhead;
    S->qhead = S->qtail = NULL;
    S->n_queued = 0;
    int na = S->n_active;
    S->n_active = 0;
    pthread_mutex_unlock(&S->mu);
    for (int a = 0; a < na; a++) job_finish(S->active[a], "cancelled", IB_OK, NULL);
    while (q) {
        job *n = q->qnext;
        job_finish(q, "cancelled", IB_OK, NULL);
        q = n;
    }
}

/* The scheduler thread's body. */
static void *loop_thread(void *arg) {
    run_loop(arg);
    return NULL;
}

/* Free S's arrays and S itself (the thread, if any, is gone; the lock and condition are destroyed by
 * the caller when they were initialized). */
static void sched_free_mem(ib_sched *S) {
    free(S->active);
    free(S->items);
    free(S->item_job);
    free(S->draws);
    free(S->done);
    free(S->done_why);
    free(S);
}

/* ib_sched_create and ib_sched_create_inline: a scheduler over e with opts (defaults filled in), its
 * loop on a new thread unless inline_run. */
static ib_status sched_create(ib_engine *e, const ib_sched_opts *opts, int inline_run, ib_sched **out, ib_error *err) {
    *out = NULL;
    ib_sched_opts o = {0};
    if (opts) o = *opts;
    if (o.max_batch <= 0) o.max_batch = 32;
    if (o.prefill_chunk <= 0) o.prefill_chunk = 64;
    if (o.max_queue == 0) o.max_queue = 64;
    if (o.max_queue < 0) o.max_queue = 0;
    if (o.max_batch > e->max_tokens)
        return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: max_batch %d exceeds the engine's max_step_tokens %d",
                       o.max_batch, e->max_tokens);
    ib_sched *S = calloc(1, sizeof *S);
    if (!S) return ib_fail(err, IB_ERR_NOMEM, "scheduler: out of memory");
    S->e = e;
    S->o = o;
    S->next_id = 1;
    S->active = calloc((size_t)o.max_batch, sizeof *S->active);
    S->items = calloc((size_t)o.max_batch, sizeof *S->items);
    S->item_job = calloc((size_t)o.max_batch, sizeof *S->item_job);
    S->draws = calloc((size_t)o.max_batch, sizeof *S->draws);
    S->done = calloc((size_t)o.max_batch, sizeof *S->done);
    S->done_why = calloc((size_t)o.max_batch, sizeof *S->done_why);
    if (!S->active || !S->items || !S->item_job || !S->draws || !S->done || !S->done_why) {
        sched_free_mem(S);
        return ib_fail(err, IB_ERR_NOMEM, "scheduler: out of memory");
    }
    S->inline_run = inline_run;
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    if (!inline_run && pthread_create(&S->thread, NULL, loop_thread, S)) {
        pthread_mutex_destroy(&S->mu);
        pthread_cond_destroy(&S->cv);
        sched_free_mem(S);
        return ib_fail(err, IB_ERR_NOMEM, "scheduler: cannot start its thread");
    }
    *out = S;
    return IB_OK;
}

ib_status ib_sched_create(ib_engine *e, const ib_sched_opts *opts, ib_sched **out, ib_error *err) {
    return sched_create(e, opts, 0, out, err);
}

ib_status ib_sched_create_inline(ib_engine *e, const ib_sched_opts *opts, ib_sched **out, ib_error *err) {
    return sched_create(e, opts, 1, out, err);
}

void ib_sched_drain(ib_sched *S) {
    if (!S->inline_run || S->draining) return;
    S->draining = 1;
    run_loop(S);
    S->draining = 0;
}

void ib_sched_stop(ib_sched *S) {
    pthread_mutex_lock(&S->mu);
    int joined = S->joined;
    S->stop = 1;
    S->joined = 1;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    if (joined) return;
    if (!S->inline_run)
        pthread_join(S->thread, NULL);
    else if (!S->draining)
        run_loop(S); /* inline and idle: the loop sees the stop at once and cancels what is queued */
    /* inline and called from an event of ib_sched_drain: that loop sees the stop at its next turn */
}

void ib_sched_free(ib_sched *S) {
    if (!S) return;
    ib_sched_stop(S);
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->cv);
    sched_free_mem(S);
}

/* *out = a job for jb, checked as ib_sched_submit documents (share_with is resolved by the caller);
 * on failure the status, *err set and *out NULL. */
static ib_status job_make(ib_sched *S, const ib_sched_job *jb, job **out, ib_error *err) {
    *out = NULL;
    if (!jb || !jb->session || !jb->prompt || jb->n_prompt < 1 || jb->max_new_tokens < 0 || jb->n_stop < 0 ||
        (jb->n_stop > 0 && !jb->stop_ids) || jb->n_logit_bias < 0 || jb->n_logit_bias > IB_MAX_LOGIT_BIAS ||
        (jb->n_logit_bias > 0 && (!jb->logit_bias_ids || !jb->logit_bias)) || jb->n_replay < 0 ||
        jb->n_replay > jb->n_prompt || (jb->share_with && (jb->n_shared < 1 || jb->n_shared >= jb->n_prompt)))
        return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: a job needs a session, a prompt of >= 1 token, "
                                                "max_new_tokens >= 0, at most IB_MAX_LOGIT_BIAS biases, "
                                                "0 < n_shared < n_prompt when sharing");
    if (jb->prompt_logprobs && jb->n_replay > 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: prompt_logprobs with a replay (n_replay %d)", jb->n_replay);
    ib_session *s = jb->session;
    if (s->model != S->e->model)
        return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: session of another model");
    long need = (long)jb->n_prompt + (jb->max_new_tokens > 0 ? jb->max_new_tokens - 1 : 0);
    if (need > ib_session_room(s))
        return ib_fail(err, IB_ERR_CONTEXT, "scheduler: %d prompt + %d new tokens exceed the session's room of %ld",
                       jb->n_prompt, jb->max_new_tokens, ib_session_room(s));
    int V = S->e->model->cfg.vocab_size;
    for (int i = 0; i < jb->n_prompt; i++)
        if (jb->prompt[i] < 0 || jb->prompt[i] >= V)
            return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: prompt token %d is %d, outside [0, %d)", i, jb->prompt[i], V);
    for (int i = 0; i < jb->n_logit_bias; i++)
        if (jb->logit_bias_ids[i] < 0 || jb->logit_bias_ids[i] >= V || !(jb->logit_bias[i] == jb->logit_bias[i]))
            return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: logit bias %d: id %d outside [0, %d) or value NaN", i,
                           jb->logit_bias_ids[i], V);
    job *j = calloc(1, sizeof *j);
    if (!j) goto oom;
    j->t_submit = now_s();
    j->s = s;
    j->constrain = jb->constrain;
    j->constrain_ctx = jb->constrain_ctx;
    j->n_replay = jb->n_replay;
    j->want_digest = jb->digest_logits != 0;
    j->digest = IB_DIGEST_INIT;
    j->n_shared = jb->share_with && !jb->prompt_logprobs ? jb->n_shared : 0;
    if (j->constrain && !(j->raw = malloc((size_t)V * sizeof(float)))) goto oom;
    j->n_prompt = jb->n_prompt;
    j->max_new = jb->max_new_tokens;
    j->n_stop = jb->n_stop;
    j->want_lp = jb->want_logprobs;
    j->top = jb->top_logprobs < 0 ? 0 : jb->top_logprobs > IB_MAX_TOP_LOGPROBS ? IB_MAX_TOP_LOGPROBS : jb->top_logprobs;
    j->group = jb->group;
    j->fn = jb->on_event;
    j->ctx = jb->ctx;
    j->prompt = malloc((size_t)jb->n_prompt * sizeof(int32_t));
    j->stops = malloc(((size_t)jb->n_stop + 1) * sizeof(int32_t));
    j->logits = malloc((size_t)V * sizeof(float));
    if (!j->prompt || !j->stops || !j->logits) goto oom;
    if (jb->prompt_logprobs && jb->n_prompt > 1) {
        j->rows = malloc((size_t)IB_PROMPT_LOGITS_ROWS * V * sizeof(float));
        j->pdraw = malloc(IB_PROMPT_LOGITS_ROWS * sizeof *j->pdraw);
        if (!j->rows || !j->pdraw) goto oom;
    }
    if (jb->n_logit_bias > 0) {
        j->bias_ids = malloc((size_t)jb->n_logit_bias * sizeof *j->bias_ids);
        j->bias = malloc((size_t)jb->n_logit_bias * sizeof *j->bias);
        if (!j->bias_ids || !j->bias) goto oom;
        memcpy(j->bias_ids, jb->logit_bias_ids, (size_t)jb->n_logit_bias * sizeof *j->bias_ids);
        memcpy(j->bias, jb->logit_bias, (size_t)jb->n_logit_bias * sizeof *j->bias);
        j->n_bias = jb->n_logit_bias;
    }
    memcpy(j->prompt, jb->prompt, (size_t)jb->n_prompt * sizeof(int32_t));
    if (jb->n_stop) memcpy(j->stops, jb->stop_ids, (size_t)jb->n_stop * sizeof(int32_t));
    *out = j;
    return IB_OK;
oom:
    job_free(j);
    return ib_fail(err, IB_ERR_NOMEM, "scheduler: out of memory");
}

ib_status ib_sched_submit_n(ib_sched *S, const ib_sched_job *jbs, int n, uint64_t *ids, ib_error *err) {
    if (ids)
        for (int k = 0; k < n; k++) ids[k] = 0;
    if (n < 1 || !jbs) return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: no jobs to submit");
    for (int k = 0; k < n; k++)
        if (jbs[k].share_with < 0 || jbs[k].share_with > k)
            return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: job %d shares with job %d, not an earlier one of the call",
                           k, jbs[k].share_with - 1);
    job **js = calloc((size_t)n, sizeof *js);
    if (!js) return ib_fail(err, IB_ERR_NOMEM, "scheduler: out of memory");
    for (int k = 0; k < n; k++) {
        ib_status rc = job_make(S, &jbs[k], &js[k], err);
        if (rc) {
            for (int q = 0; q < k; q++) job_free(js[q]);
            free(js);
            return rc;
        }
    }
    pthread_mutex_lock(&S->mu);
    if (S->stop || S->n_active + S->n_queued + n > S->o.max_batch + S->o.max_queue) {
        pthread_mutex_unlock(&S->mu);
        for (int k = 0; k < n; k++) job_free(js[k]);
        free(js);
        return ib_fail(err, IB_ERR_STATE, "scheduler: queue full");
    }
    for (int k = 0; k < n; k++) {
        job *j = js[k];
        j->id = S->next_id++;
        if (jbs[k].share_with && j->n_shared) j->share_from = js[jbs[k].share_with - 1]->id;
        if (S->qtail)
            S->qtail->qnext = j;
        else
            S->qhead = j;
        S->qtail = j;
        S->n_queued++;
        if (ids) ids[k] = j->id;
    }
    S->st.queued = S->n_queued;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    free(js);
    return IB_OK;
}

ib_status ib_sched_submit(ib_sched *S, const ib_sched_job *jb, uint64_t *id, ib_error *err) {
    if (id) *id = 0;
    if (jb && jb->share_with) return ib_fail(err, IB_ERR_INVALID_ARG, "scheduler: share_with needs ib_sched_submit_n");
    return ib_sched_submit_n(S, jb, 1, id, err);
}

int ib_sched_cancel(ib_sched *S, uint64_t id) {
    int found = 0;
    pthread_mutex_lock(&S->mu);
    for (int a = 0; a < S->n_active && !found; a++)
        if (S->active[a]->id == id) S->active[a]->cancel = found = 1;
    for (job *q = S->qhead; q && !found; q = q->qnext)
        if (q->id == id) q->cancel = found = 1;
    if (found) pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    return found;
}

void ib_sched_get_stats(ib_sched *S, ib_sched_stats *out) {
    pthread_mutex_lock(&S->mu);
    *out = S->st;
    out->active = S->n_active;
    out->queued = S->n_queued;
    pthread_mutex_unlock(&S->mu);
}
