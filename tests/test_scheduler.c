/*
 * test_scheduler.c — the continuous-batching scheduler on the tiny synthetic model: every job's
 * tokens, logprobs and the logits rows its events expose equal those of the same prompt decoded alone
 * with plain ib_step/ib_sample (greedy and seeded sampling), whatever the batch size, prefill chunk and
 * arrival order; stop ids, length, cancellation, a full queue, a context overflow and prefill-only jobs
 * behave as documented; prompt sharing (ib_sched_submit_n, share_with) gives each choice its lone run's bits, prefills a
 * prompt once, and fails under the share-early fault; prompt logprobs (PROMPT events) equal the logprobs
 * of one token a step, and fail under the row-order fault.
 * KV policies: sink+window attention equals a float64 reference over exactly the kept positions;
 * windowed sessions give the same bits batched in chunks as alone token by token; a window wider
 * than the sequence equals a full session bitwise; memory is fixed at sink + window + chunk slots;
 * the step's windowed attention (ib_attend_policy_heads, every --isa copy, blocks cut by the ring's
 * wrap) equals ib_attend_policy bitwise, and the isa-fma fault breaks that on the vector copies.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>

#include "check.h"
#include "backends/cpu/cpu.h"
#include "core/half.h"
#include "isobatch.h"
#include "model/mkmodel.h"
#include "runtime/kv_policy.h"

#define NP 12
#define GEN 10

static int32_t prompts[NP][200];
static int plen[NP];

static int g_vocab; /* the tiny model's vocabulary, for digesting the events' logits rows */

typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tok[64];
    double lp[64];
    int n;
    int n_top[64];              /* per token: top alternatives reported, the two of them, their logprobs */
    int32_t top_id[64][2];
    double top_lp[64][2];
    uint64_t dig;               /* ib_digest_bytes over the token events' logits rows */
    int want_sdig;              /* the job asked for the scheduler's running digest (digest_logits) */
    int sdig_seen, sdig_bad;    /* token events whose logits_digest was compared with dig / differed */
    int done;
    char finish[16];
    int fed, generated;
    ib_session *s;
} rec;

static void on_event(void *ctx, const ib_sched_event *ev) {
    rec *r = ctx;
    pthread_mutex_lock(&r->mu);
    if (!ev->done) {
        r->dig = ib_digest_bytes(r->dig, ev->logits, (size_t)g_vocab * sizeof(float));
        /* the scheduler's running digest: this chain when asked for, 0 when not */
        r->sdig_seen++;
        r->sdig_bad += ev->logits_digest != (r->want_sdig ? r->dig : 0);
        if (r->n < 64) {
            r->tok[r->n] = ev->token;
            r->lp[r->n] = ev->logprob;
            r->n_top[r->n] = ev->n_top;
            for (int k = 0; k < ev->n_top && k < 2; k++)
                r->top_id[r->n][k] = ev->top_ids[k], r->top_lp[r->n][k] = ev->top_logprob[k];
        }
        r->n++;
    } else {
        r->done = 1;
        snprintf(r->finish, sizeof r->finish, "%s", ev->finish);
        r->fed = ev->prompt_fed;
        r->generated = ev->generated;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

/* prompt_logprobs jobs' PROMPT events: index, token, logprob, the top two, the rows' digest; order kept */
typedef struct prec {
    rec r;                      /* its token events and DONE (on_event) */
    int n_p, order_bad;         /* PROMPT events; those out of order (index not n_p + 1, or after a token) */
    int32_t tok[200];
    double lp[200];
    int32_t top_id[200][2];
    double top_lp[200][2];
    uint64_t dig;               /* over the PROMPT events' logits rows */
} prec;

static void on_prompt_event(void *ctx, const ib_sched_event *ev) {
    prec *p = ctx;
    if (!ev->prompt) {
        on_event(&p->r, ev);
        return;
    }
    pthread_mutex_lock(&p->r.mu);
    p->order_bad += ev->prompt_index != p->n_p + 1 || p->r.n > 0 || ev->n_top != 2;
    if (p->n_p < 200) {
        p->tok[p->n_p] = ev->token;
        p->lp[p->n_p] = ev->logprob;
        for (int k = 0; k < 2 && k < ev->n_top; k++) p->top_id[p->n_p][k] = ev->top_ids[k], p->top_lp[p->n_p][k] = ev->top_logprob[k];
    }
    p->dig = ib_digest_bytes(p->dig, ev->logits, (size_t)g_vocab * sizeof(float));
    p->n_p++;
    pthread_mutex_unlock(&p->r.mu);
}

static void rec_wait(rec *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static ib_sampling sampling(int sampled) {
    ib_sampling p = ib_sampling_default();
    if (sampled) {
        p.temperature = 0.9f;
        p.top_k = 40;
        p.top_p = 0.95f;
        p.seed = 1234;
    }
    return p;
}

/* The reference: prompt i decoded alone, token by token after a whole-prompt prefill. */
static int32_t ref_top_id[2][NP][GEN][2];   /* [sampled][prompt][token]: ib_top_logprobs of the lone run */
static double ref_top_lp[2][NP][GEN][2];
static uint64_t ref_dig[2][NP];             /* [sampled][prompt]: digest of the lone run's logits rows */

static void reference(const ib_model *m, ib_engine *e, int i, int sampled, int32_t *tok, double *lp) {
    int V = ib_model_get_info(m)->vocab_size;
    ib_session_opts so = {.max_context = 256, .sampling = sampling(sampled)};
    ib_session *s;
    ib_error err;
    float *logits = malloc((size_t)V * sizeof(float));
    if (ib_session_create(m, &so, &s, &err)) return;
    ib_session_note_tokens(s, prompts[i], plen[i]);
    ib_step_item it = {.session = s, .tokens = prompts[i], .n_tokens = plen[i], .logits = logits};
    ib_step(e, &it, 1, &err);
    ref_dig[sampled][i] = IB_DIGEST_INIT;
    for (int g = 0; g < GEN; g++) {
        ref_dig[sampled][i] = ib_digest_bytes(ref_dig[sampled][i], logits, (size_t)V * sizeof(float));
        tok[g] = ib_sample(s, logits);
        lp[g] = ib_logprob(logits, V, tok[g]);
        ib_top_logprobs(logits, V, 2, ref_top_id[sampled][i][g], ref_top_lp[sampled][i][g]);
        it = (ib_step_item){.session = s, .tokens = &tok[g], .n_tokens = 1, .logits = logits};
        if (g + 1 < GEN) ib_step(e, &it, 1, &err);
    }
    ib_session_free(s);
    free(logits);
}

/* All prompts through a scheduler (batch, chunk), submitted in order `order`; compare with ref. */
static void run_sched(const ib_model *m, ib_engine *e, int batch, int chunk, int sampled, int reversed,
                      int32_t ref_tok[NP][GEN], double ref_lp[NP][GEN]) {
    ib_sched_opts so = {.max_batch = batch, .prefill_chunk = chunk, .max_queue = NP};
    ib_sched *S;
    ib_error err;
    CHECK(ib_sched_create(e, &so, &S, &err) == IB_OK, "%s", err.msg);
    rec r[NP];
    for (int k = 0; k < NP; k++) {
        int i = reversed ? NP - 1 - k : k;
        memset(&r[i], 0, sizeof r[i]);
        r[i].dig = IB_DIGEST_INIT;
        r[i].want_sdig = i % 2 == 0;   /* half the jobs ask for the scheduler's digest */
        pthread_mutex_init(&r[i].mu, NULL);
        pthread_cond_init(&r[i].cv, NULL);
        ib_session_opts sopt = {.max_context = 256, .sampling = sampling(sampled)};
        ib_session_create(m, &sopt, &r[i].s, &err);
        ib_sched_job jb = {.session = r[i].s, .prompt = prompts[i], .n_prompt = plen[i], .max_new_tokens = GEN,
                           .want_logprobs = 1, .top_logprobs = 2, .on_event = on_event, .ctx = &r[i],
                           .digest_logits = r[i].want_sdig};
        CHECK(ib_sched_submit(S, &jb, NULL, &err) == IB_OK, "%s", err.msg);
    }
    int same = 0, same_top = 0, same_rows = 0, sdig_seen = 0, sdig_bad = 0;
    for (int i = 0; i < NP; i++) {
        rec_wait(&r[i]);
        sdig_seen += r[i].sdig_seen, sdig_bad += r[i].sdig_bad;
        int eq = r[i].n == GEN && !strcmp(r[i].finish, "length") && r[i].fed == plen[i];
        for (int g = 0; eq && g < GEN; g++)
            eq = r[i].tok[g] == ref_tok[i][g] && memcmp(&r[i].lp[g], &ref_lp[i][g], sizeof(double)) == 0;
        same += eq;
        int eq_top = r[i].n == GEN;
        for (int g = 0; eq_top && g < GEN; g++)
            eq_top = r[i].n_top[g] == 2 && !memcmp(r[i].top_id[g], ref_top_id[sampled][i][g], sizeof r[i].top_id[g]) &&
                     !memcmp(r[i].top_lp[g], ref_top_lp[sampled][i][g], sizeof r[i].top_lp[g]);
        same_top += eq_top;
        same_rows += r[i].dig == ref_dig[sampled][i];
        ib_session_free(r[i].s);
    }
    CHECK(sdig_seen == NP * GEN && sdig_bad == 0,
          "batch %d chunk %d sampled %d reversed %d: %d of %d token events' logits_digest differ from the chain over "
          "their rows (digest_logits jobs) or are not 0 (the others)", batch, chunk, sampled, reversed, sdig_bad, sdig_seen);
    CHECK(same_rows == NP, "batch %d chunk %d sampled %d reversed %d: %d of %d jobs' event logits rows equal their lone run's",
          batch, chunk, sampled, reversed, same_rows, NP);
    CHECK(same == NP, "batch %d chunk %d sampled %d reversed %d: %d of %d jobs equal their lone run", batch, chunk,
          sampled, reversed, same, NP);
    CHECK(same_top == NP, "batch %d chunk %d sampled %d reversed %d: %d of %d jobs' top logprobs equal their lone run's",
          batch, chunk, sampled, reversed, same_top, NP);
    ib_sched_stats st;
    ib_sched_get_stats(S, &st);
    CHECK(st.tokens_generated == NP * GEN, "generated %lld", st.tokens_generated);
    if (batch > 1 && chunk > 1) CHECK(st.steps < NP * GEN, "no batching: %lld steps", st.steps);
    ib_sched_free(S);
}


/* Prompt pr[n] decoded alone with plain ib_step/ib_sample, sampled with `seed`: its tokens and the
 * digest of its logits rows. */
static void lone_run(const ib_model *m, ib_engine *e, const int32_t *pr, int n, uint64_t seed, int32_t *tok,
                     uint64_t *dig) {
    int V = ib_model_get_info(m)->vocab_size;
    ib_sampling sp = sampling(1);
    sp.seed = seed;
    ib_session_opts so = {.max_context = 256, .sampling = sp};
    ib_session *s;
    ib_error err;
    float *logits = malloc((size_t)V * sizeof(float));
    if (!logits || ib_session_create(m, &so, &s, &err)) {
        free(logits);
        return;
    }
    ib_session_note_tokens(s, pr, n);
    ib_step_item it = {.session = s, .tokens = pr, .n_tokens = n, .logits = logits};
    ib_step(e, &it, 1, &err);
    *dig = IB_DIGEST_INIT;
    for (int g = 0; g < GEN; g++) {
        *dig = ib_digest_bytes(*dig, logits, (size_t)V * sizeof(float));
        tok[g] = ib_sample(s, logits);
        it = (ib_step_item){.session = s, .tokens = &tok[g], .n_tokens = 1, .logits = logits};
        if (g + 1 < GEN) ib_step(e, &it, 1, &err);
    }
    ib_session_free(s);
    free(logits);
}

/* Prompt sharing: C choices of each of prompts `which` (seed 1234 + j for choice j), choice j > 0
 * sharing all but the last prompt token with choice 0 (one ib_sched_submit_n a prompt), through a scheduler
 * of (batch, chunk). Returns how many choices equal their lone run (tokens and logits rows); *shared
 * gets the scheduler's tokens_shared and *prefilled its tokens_prefilled. */
enum { SHARE_C = 4 };
static int run_shared(const ib_model *m, ib_engine *e, const int *which, int nw, int batch, int chunk,
                      long long *shared, long long *prefilled) {
    ib_sched_opts so = {.max_batch = batch, .prefill_chunk = chunk, .max_queue = nw * SHARE_C};
    ib_sched *S;
    ib_error err;
    int same = 0;
    if (ib_sched_create(e, &so, &S, &err)) return -1;
    rec *r = calloc((size_t)nw * SHARE_C, sizeof *r);
    for (int w = 0; w < nw; w++) {
        ib_sched_job jbs[SHARE_C];
        for (int j = 0; j < SHARE_C; j++) {
            rec *q = &r[w * SHARE_C + j];
            q->dig = IB_DIGEST_INIT;
            pthread_mutex_init(&q->mu, NULL);
            pthread_cond_init(&q->cv, NULL);
            ib_sampling sp = sampling(1);
            sp.seed = 1234 + (uint64_t)j;
            ib_session_opts sopt = {.max_context = 256, .sampling = sp};
            ib_session_create(m, &sopt, &q->s, &err);
            const int i = which[w];
            jbs[j] = (ib_sched_job){.session = q->s, .prompt = prompts[i], .n_prompt = plen[i], .max_new_tokens = GEN,
                                    .on_event = on_event, .ctx = q, .share_with = j > 0 ? 1 : 0,
                                    .n_shared = j > 0 ? plen[i] - 1 : 0};
        }
        CHECK(ib_sched_submit_n(S, jbs, SHARE_C, NULL, &err) == IB_OK, "%s", err.msg);
    }
    for (int k = 0; k < nw * SHARE_C; k++) rec_wait(&r[k]);
    ib_sched_stats st;
    ib_sched_get_stats(S, &st);
    *shared = st.tokens_shared;
    *prefilled = st.tokens_prefilled;
    ib_sched_free(S);   /* (before the lone runs: one engine steps for one thread at a time) */
    for (int w = 0; w < nw; w++)
        for (int j = 0; j < SHARE_C; j++) {
            rec *q = &r[w * SHARE_C + j];
            int32_t tok[GEN];
            uint64_t dig = 0;
            lone_run(m, e, prompts[which[w]], plen[which[w]], 1234 + (uint64_t)j, tok, &dig);
            same += q->n == GEN && q->fed == plen[which[w]] && !memcmp(q->tok, tok, sizeof tok) && q->dig == dig;
            ib_session_free(q->s);
        }
    free(r);
    return same;
}

/* Prompt sharing gives every choice its lone run's bits and prefills a prompt once: with every choice
 * in the batch (chunks that do and do not end at the shared length), with the batch too small for the
 * waiting choices (they come after the source has gone on, so they feed their own prompts); and under
 * the share-early fault the copies differ. Bad sharing arguments are refused. */
static void check_sharing(const ib_model *m, ib_engine *e) {
    const int which[3] = {1, 4, 8};   /* 38, 149 and 7 tokens */
    int want_shared = 0, all = 0;
    for (int w = 0; w < 3; w++) want_shared += (SHARE_C - 1) * (plen[which[w]] - 1), all += SHARE_C * plen[which[w]];
    const int chunks[3] = {200, 7, 1};
    for (int c = 0; c < 3; c++) {
        long long sh, pre;
        int same = run_shared(m, e, which, 3, 3 * SHARE_C, chunks[c], &sh, &pre);
        CHECK(same == 3 * SHARE_C, "sharing, chunk %d: %d of %d choices equal their lone run", chunks[c], same,
              3 * SHARE_C);
        CHECK(sh == want_shared && pre == all - want_shared, "sharing, chunk %d: %lld tokens shared (want %d), %lld "
              "prefilled (want %d)", chunks[c], sh, want_shared, pre, all - want_shared);
    }
    {   /* a batch of 2: choice 1 shares, choices 2 and 3 are admitted after the source went on */
        long long sh, pre;
        int same = run_shared(m, e, which, 1, 2, 16, &sh, &pre);
        CHECK(same == SHARE_C, "sharing, batch 2: %d of %d choices equal their lone run", same, SHARE_C);
        CHECK(sh == plen[which[0]] - 1, "sharing, batch 2: %lld tokens shared, want %d (choice 1's only)", sh,
              plen[which[0]] - 1);
    }
    ib_fault_set(IB_FAULT_SHARE_EARLY);
    long long sh, pre;
    int same = run_shared(m, e, which, 3, 3 * SHARE_C, 16, &sh, &pre);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(same == 3, "FAULT share-early: %d of %d choices equal their lone run (want only the 3 sources)", same,
          3 * SHARE_C);
    CHECK(sh > 0, "FAULT share-early: nothing was shared");
    /* arguments */
    ib_sched_opts so = {.max_batch = 2};
    ib_sched *S;
    ib_error err;
    CHECK(ib_sched_create(e, &so, &S, &err) == IB_OK, "%s", err.msg);
    ib_session_opts sopt = {.max_context = 64, .sampling = sampling(0)};
    ib_session *s;
    ib_session_create(m, &sopt, &s, &err);
    ib_sched_job jb[2] = {{.session = s, .prompt = prompts[1], .n_prompt = 5, .max_new_tokens = 1},
                          {.session = s, .prompt = prompts[1], .n_prompt = 5, .max_new_tokens = 1, .share_with = 1,
                           .n_shared = 5}};
    CHECK(ib_sched_submit_n(S, jb, 2, NULL, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "n_shared"),
          "n_shared == n_prompt accepted");
    jb[1].n_shared = 0;
    CHECK(ib_sched_submit_n(S, jb, 2, NULL, &err) == IB_ERR_INVALID_ARG, "n_shared 0 with share_with accepted");
    jb[1].n_shared = 2;
    jb[1].share_with = 2;
    CHECK(ib_sched_submit_n(S, jb, 2, NULL, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "earlier"),
          "a job sharing with itself accepted");
    jb[1].share_with = 1;
    CHECK(ib_sched_submit(S, &jb[1], NULL, &err) == IB_ERR_INVALID_ARG, "share_with through ib_sched_submit accepted");
    ib_sched_stats st;
    ib_sched_get_stats(S, &st);
    CHECK(st.queued == 0 && st.active == 0, "a refused call queued jobs: %d queued, %d active", st.queued, st.active);
    ib_sched_free(S);
    ib_session_free(s);
}

/* Automatic sharing (ib_sched_opts.share_min): 6 jobs submitted one by one, their prompts the same
 * first 100 tokens then each its own tail (job 5's tail starts at token 20, under share_min), all equal
 * their lone runs; returns how many, *shared the tokens the scheduler shared. */
static int run_auto_share(const ib_model *m, ib_engine *e, int share_min, int chunk, int own_groups, long long *shared) {
    enum { J = 6, LEN = 130 };
    static int32_t pr[J][LEN];
    for (int j = 0; j < J; j++)
        for (int t = 0; t < LEN; t++)
            pr[j][t] = t < (j == 5 ? 20 : 100) ? prompts[4][t] : (int32_t)((j * 53 + t * 7) % 250);
    ib_sched_opts so = {.max_batch = J, .prefill_chunk = chunk, .max_queue = J, .share_min = share_min};
    ib_sched *S;
    ib_error err;
    if (ib_sched_create(e, &so, &S, &err)) return -1;
    rec r[J];
    memset(r, 0, sizeof r);
    for (int j = 0; j < J; j++) {
        r[j].dig = IB_DIGEST_INIT;
        pthread_mutex_init(&r[j].mu, NULL);
        pthread_cond_init(&r[j].cv, NULL);
        ib_sampling sp = sampling(1);
        sp.seed = 77 + (uint64_t)j;
        ib_session_opts sopt = {.max_context = 256, .sampling = sp};
        ib_session_create(m, &sopt, &r[j].s, &err);
        ib_sched_job jb = {.session = r[j].s, .prompt = pr[j], .n_prompt = LEN, .max_new_tokens = GEN,
                           .on_event = on_event, .ctx = &r[j], .group = own_groups ? j : 0};
        CHECK(ib_sched_submit(S, &jb, NULL, &err) == IB_OK, "%s", err.msg);
    }
    for (int j = 0; j < J; j++) rec_wait(&r[j]);
    ib_sched_stats st;
    ib_sched_get_stats(S, &st);
    *shared = st.tokens_shared;
    ib_sched_free(S);
    int same = 0;
    for (int j = 0; j < J; j++) {
        int32_t tok[GEN];
        uint64_t dig = 0;
        lone_run(m, e, pr[j], LEN, 77 + (uint64_t)j, tok, &dig);
        same += r[j].n == GEN && r[j].fed == LEN && !memcmp(r[j].tok, tok, sizeof tok) && r[j].dig == dig;
        ib_session_free(r[j].s);
    }
    return same;
}

/* Automatic sharing gives every job its lone run's bits: on (whatever the jobs' arrival order lets it
 * share: the scheduler thread may admit and start the first before the others come), off, and under
 * share-early (then some differ whenever something was shared). */
static void check_auto_sharing(const ib_model *m, ib_engine *e) {
    long long sh;
    int same;
    for (int chunk = 16; chunk <= 200; chunk += 184) {
        same = run_auto_share(m, e, 32, chunk, 0, &sh);
        CHECK(same == 6, "auto sharing, chunk %d: %d of 6 jobs equal their lone run (%lld tokens shared)", chunk, same, sh);
        CHECK(sh % 100 == 0 && sh <= 400, "auto sharing, chunk %d: %lld tokens shared, not a multiple of the 100-token "
              "prefix (at most 4 jobs share it)", chunk, sh);
    }
    same = run_auto_share(m, e, 0, 16, 0, &sh);
    CHECK(same == 6 && sh == 0, "auto sharing off: %d of 6 equal, %lld tokens shared", same, sh);
    same = run_auto_share(m, e, 32, 16, 1, &sh);
    CHECK(same == 6 && sh == 0, "auto sharing, each job its own group: %d of 6 equal, %lld tokens shared (never "
          "across groups)", same, sh);
    /* the first job's 100 tokens take 7 steps at chunk 16: jobs submitted within that share them */
    long long sh_fault = 0;
    int tries = 0;
    ib_fault_set(IB_FAULT_SHARE_EARLY);
    do same = run_auto_share(m, e, 32, 16, 0, &sh_fault);
    while (sh_fault == 0 && ++tries < 5);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(sh_fault > 0 && same < 6, "FAULT share-early (auto): %d of 6 jobs equal their lone run, %lld tokens shared",
          same, sh_fault);
}

/* Feed prompt i then GEN greedy tokens through a windowed session; prefill in chunks of `chunk`,
 * stepped together with a full-session neighbour when `crowd`. Logits of every generated token are
 * digested into *dig. */
/* Prompt logprobs (ib_sched_job.prompt_logprobs): NP prompts through a scheduler (batch 4, prefill chunk
 * `chunk`), every other one a scoring job (no new tokens), one of them also a share_with of another
 * (scoring jobs take no share). Each PROMPT event (prompt index 1 .. n - 1, in order, before any token)
 * must hold the logprob and top two of the prompt's token under the logits the session gives fed one
 * token a step, bitwise, and its row's digest that row's; the jobs that generate must give the tokens
 * of their lone runs. Returns the prompts whose events differ in any way. */
static int run_prompt_lp(const ib_model *m, ib_engine *e, int chunk, const int32_t ref_tok[NP][GEN]) {
    const int V = g_vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    int bad = 0;
    static prec pr[NP];
    ib_sched_opts so = {.max_batch = 4, .prefill_chunk = chunk, .max_queue = NP};
    ib_sched *S;
    ib_error err;
    ib_session *s[NP];
    ib_sched_job jobs[NP];
    static int32_t pp[NP][200];   /* the prompts, job 3's starting with job 1's first token */
    memcpy(pp, prompts, sizeof pp);
    pp[3][0] = pp[1][0];
    if (ib_sched_create(e, &so, &S, &err)) return NP;
    for (int i = 0; i < NP; i++) {
        memset(&pr[i], 0, sizeof pr[i]);
        pthread_mutex_init(&pr[i].r.mu, NULL);
        pthread_cond_init(&pr[i].r.cv, NULL);
        pr[i].r.dig = IB_DIGEST_INIT, pr[i].dig = IB_DIGEST_INIT;
        ib_session_create(m, &(ib_session_opts){.max_context = 256, .sampling = sampling(0)}, &s[i], &err);
        jobs[i] = (ib_sched_job){.session = s[i], .prompt = pp[i], .n_prompt = plen[i],
                                 .max_new_tokens = i % 2 ? 0 : GEN, .top_logprobs = 2, .prompt_logprobs = 1,
                                 .on_event = on_prompt_event, .ctx = &pr[i]};
    }
    /* job 3 (a scoring job) names job 1 for a share of its first token: ignored, it feeds all */
    jobs[3].share_with = 2, jobs[3].n_shared = 1;
    bad += ib_sched_submit_n(S, jobs, NP, NULL, &err) != IB_OK;
    for (int i = 0; i < NP; i++) rec_wait(&pr[i].r);
    for (int i = 0; i < NP; i++) {
        int differs = pr[i].order_bad != 0 || pr[i].n_p != plen[i] - 1 || strcmp(pr[i].r.finish, "length") != 0 ||
                      pr[i].r.fed != plen[i];
        ib_session *one;
        ib_session_create(m, &(ib_session_opts){.max_context = 256}, &one, &err);
        uint64_t dig = IB_DIGEST_INIT;
        for (int t = 0; t + 1 < plen[i]; t++) {
            ib_step_item it = {.session = one, .tokens = &pp[i][t], .n_tokens = 1, .logits = lg};
            differs |= ib_step(e, &it, 1, &err) != IB_OK;
            dig = ib_digest_bytes(dig, lg, (size_t)V * sizeof(float));
            int32_t ti[2];
            double tl[2];
            ib_top_logprobs(lg, V, 2, ti, tl);
            const double lp = ib_logprob(lg, V, pp[i][t + 1]);
            differs |= pr[i].tok[t] != pp[i][t + 1] || memcmp(&pr[i].lp[t], &lp, sizeof lp) != 0 ||
                       memcmp(pr[i].top_id[t], ti, sizeof ti) != 0 || memcmp(pr[i].top_lp[t], tl, sizeof tl) != 0;
        }
        differs |= dig != pr[i].dig;
        if (i % 2 == 0) differs |= pr[i].r.n != GEN || memcmp(pr[i].r.tok, ref_tok[i], GEN * sizeof(int32_t)) != 0;
        else differs |= pr[i].r.n != 0;
        bad += differs;
        ib_session_free(one);
        ib_session_free(s[i]);
        pthread_mutex_destroy(&pr[i].r.mu);
        pthread_cond_destroy(&pr[i].r.cv);
    }
    ib_sched_free(S);
    free(lg);
    return bad;
}

static void check_prompt_logprobs(const ib_model *m, ib_engine *e) {
    int32_t rt[NP][GEN];
    double rl[NP][GEN];
    for (int i = 0; i < NP; i++) reference(m, e, i, 0, rt[i], rl[i]);
    int bad = run_prompt_lp(m, e, 7, rt) + run_prompt_lp(m, e, 200, rt);
    CHECK(bad == 0, "prompt logprobs: %d of %d runs differ from one token a step", bad, 2 * NP);
    ib_fault_set(IB_FAULT_ROW_ORDER);
    int fbad = run_prompt_lp(m, e, 200, rt);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(fbad >= NP / 2, "row-order fault: only %d of %d prompts' logprobs differ", fbad, NP);
    printf("prompt logprobs: %d of %d runs differ from one token a step, under row-order %d of %d\n", bad, 2 * NP,
           fbad, NP);
    /* a replay cannot be scored */
    ib_sched *S;
    ib_error err;
    ib_session *s;
    ib_sched_create(e, NULL, &S, &err);
    ib_session_create(m, &(ib_session_opts){.max_context = 64}, &s, &err);
    ib_sched_job j = {.session = s, .prompt = prompts[1], .n_prompt = 5, .prompt_logprobs = 1, .n_replay = 2};
    CHECK(ib_sched_submit(S, &j, NULL, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "prompt_logprobs"),
          "prompt_logprobs with a replay: %s", err.msg);
    ib_sched_free(S);
    ib_session_free(s);
}

static ib_kv_dtype g_kv_dtype; /* run_window's sessions keep half-precision KV */

static void run_window(const ib_model *m, ib_engine *e, int i, int sink, int window, int kv_chunk, int chunk, int crowd,
                       uint64_t *dig, int32_t *toks) {
    int V = ib_model_get_info(m)->vocab_size;
    ib_error err;
    ib_session_opts so = {.sampling = ib_sampling_default(), .kv_sink = sink, .kv_window = window, .kv_chunk = kv_chunk,
                          .kv_dtype = g_kv_dtype};
    ib_session_opts fo = {.max_context = 1024, .sampling = ib_sampling_default(), .kv_dtype = g_kv_dtype};
    ib_session *s, *other;
    float *lg = malloc((size_t)V * sizeof(float)), *lo = malloc((size_t)V * sizeof(float));
    *dig = IB_DIGEST_INIT;
    if (ib_session_create(m, &so, &s, &err) || ib_session_create(m, &fo, &other, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    int32_t filler[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int fed = 0; fed < plen[i];) {
        int n = plen[i] - fed < chunk ? plen[i] - fed : chunk;
        ib_step_item it[2] = {{.session = other, .tokens = filler, .n_tokens = 1 + fed % 7, .logits = lo, NULL},
                              {.session = s, .tokens = prompts[i] + fed, .n_tokens = n, .logits = lg}};
        CHECK(ib_step(e, crowd ? it : it + 1, crowd ? 2 : 1, &err) == IB_OK, "%s", err.msg);
        fed += n;
    }
    for (int g = 0; g < GEN; g++) {
        toks[g] = ib_argmax(lg, V);
        *dig = ib_digest_bytes(*dig, lg, (size_t)V * sizeof(float));
        ib_step_item it[2] = {{.session = other, .tokens = filler, .n_tokens = 2, .logits = lo, NULL},
                              {.session = s, .tokens = &toks[g], .n_tokens = 1, .logits = lg}};
        CHECK(ib_step(e, crowd ? it : it + 1, crowd ? 2 : 1, &err) == IB_OK, "%s", err.msg);
    }
    size_t per_tok = ib_model_get_info(m)->kv_bytes_per_token;
    if (g_kv_dtype == IB_KV_F16) per_tok /= 2;
    if (window > 0) CHECK(ib_session_kv_bytes(s) == (size_t)(sink + window + kv_chunk) * per_tok, "kv bytes %zu", ib_session_kv_bytes(s));
    ib_session_free(s);
    ib_session_free(other);
    free(lg);
    free(lo);
}

/* Slot sl's key and value rows (hd floats each, and their halves) from the xorshift state *x: keys in
 * [-2, 2), values in [-1, 1). */
static void fill_kv_slot(uint64_t *x, int sl, int hd, float *kf, float *vf, uint16_t *kh, uint16_t *vh) {
    for (int d = 0; d < hd; d++) {
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        float a = (float)((double)(*x >> 11) / 9007199254740992.0 * 4 - 2);
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        float b = (float)((double)(*x >> 11) / 9007199254740992.0 * 2 - 1);
        kh[sl * hd + d] = ib_f32_to_f16(a), vh[sl * hd + d] = ib_f32_to_f16(b);
        kf[sl * hd + d] = a, vf[sl * hd + d] = b;
    }
}

/* Count the (position, config) cases where ib_attend_policy_heads with the copy for isa differs from
 * ib_attend_policy head by head: float and half KV, with and without sinks, blocks that the ring's
 * wrap cuts in two, 1 and 3 query heads. */
static int policy_heads_mismatches(const ib_model *m, ib_isa isa, int *cases) {
    enum { HD = 32, NPOS = 70, NQ = 3 };
    static const int cfg[][3] = {{3, 20, 8}, {0, 20, 8}, {5, 7, 3}}, blocks[] = {8, 32};
    static float kf[64 * HD], vf[64 * HD];
    static uint16_t kh[64 * HD], vh[64 * HD];
    float q[NQ * HD], ref[NQ * HD], got[NQ * HD];
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    int bad = 0;
    ib_attn_kernels ak;
    if (ib_attn_kernels_for(isa == IB_ISA_AUTO ? ib_isa_best() : isa, &ak)) return -1;
    for (int f16 = 0; f16 < 2; f16++)
        for (int c = 0; c < 3; c++)
            for (int bi = 0; bi < 2; bi++)
                for (int nq = 1; nq <= NQ; nq += 2) {
                    ib_kv_desc fake = {.dtype = f16 ? IB_KV_F16 : IB_KV_F32, .n_layers = 1, .n_kv_heads = 1,
                                       .head_dim = HD, .capacity = cfg[c][0] + cfg[c][1] + cfg[c][2],
                                       .sink = cfg[c][0], .window = cfg[c][1]};
                    const void *k = f16 ? (const void *)kh : (const void *)kf, *v = f16 ? (const void *)vh : (const void *)vf;
                    for (int p = 0; p < NPOS; p++) {
                        int sl = ib_kv_slot(&fake, p);
                        fill_kv_slot(&x, sl, HD, kf, vf, kh, vh);
                        for (int i = 0; i < nq * HD; i++) q[i] = kf[(size_t)((i * 7) % (sl * HD + HD))] * 1.5f;
                        for (int h = 0; h < nq; h++)
                            ib_attend_policy(&fake, q + h * HD, k, v, p, HD, 0.25f, blocks[bi], ref + h * HD);
                        ib_attend_policy_heads(&fake, ak.block2, q, nq, k, v, p, HD, 0.25f, blocks[bi], got);
                        bad += memcmp(ref, got, sizeof(float) * (size_t)nq * HD) != 0;
                        (*cases)++;
                    }
                }
    return bad;
}

/* Count the rows where ib_attend_policy_rows (tiles of 1..chunk rows of one session at consecutive
 * positions, the copy for isa) differs from ib_attend_policy head by head: float and half KV, with and
 * without sinks, tiles whose rows' windows start in different blocks and cross the ring's wrap, 1 and
 * 3 query heads. Each tile's keys are stored before its rows attend, as a step stores them. */
static int policy_rows_mismatches(ib_isa isa, int *cases) {
    enum { HD = 32, NPOS = 70, NQ = 3 };
    static const int cfg[][3] = {{3, 20, 8}, {0, 20, 8}, {5, 7, 3}}, blocks[] = {8, 32};
    static float kf[64 * HD], vf[64 * HD];
    static uint16_t kh[64 * HD], vh[64 * HD];
    float q[8 * NQ * HD], ref[8 * NQ * HD], got[8 * NQ * HD];
    int pos[8];
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    int bad = 0;
    ib_attn_kernels ak;
    if (ib_attn_kernels_for(isa == IB_ISA_AUTO ? ib_isa_best() : isa, &ak)) return -1;
    for (int f16 = 0; f16 < 2; f16++)
        for (int c = 0; c < 3; c++)
            for (int bi = 0; bi < 2; bi++)
                for (int nq = 1; nq <= NQ; nq += 2) {
                    ib_kv_desc fake = {.dtype = f16 ? IB_KV_F16 : IB_KV_F32, .n_layers = 1, .n_kv_heads = 1,
                                       .head_dim = HD, .capacity = cfg[c][0] + cfg[c][1] + cfg[c][2],
                                       .sink = cfg[c][0], .window = cfg[c][1]};
                    const void *k = f16 ? (const void *)kh : (const void *)kf, *v = f16 ? (const void *)vh : (const void *)vf;
                    for (int p0 = 0, nr; p0 < NPOS; p0 += nr) {
                        nr = 1 + (p0 + c + bi) % cfg[c][2];   /* 1..chunk rows */
                        if (nr * nq > IB_ATTN_TILE_Q) nr = IB_ATTN_TILE_Q / nq;
                        for (int t = 0; t < nr; t++) {
                            int sl = ib_kv_slot(&fake, p0 + t);
                            pos[t] = p0 + t;
                            fill_kv_slot(&x, sl, HD, kf, vf, kh, vh);
                        }
                        for (int i = 0; i < nr * nq * HD; i++) q[i] = kf[(size_t)((i * 7) % (64 * HD))] * 1.5f;
                        for (int t = 0; t < nr; t++)
                            for (int h = 0; h < nq; h++)
                                ib_attend_policy(&fake, q + (t * nq + h) * HD, k, v, pos[t], HD, 0.25f, blocks[bi],
                                                 ref + (t * nq + h) * HD);
                        ib_attend_policy_rows(&fake, ak.block2, q, (size_t)nq * HD, nq, nr, pos, k, v, HD, 0.25f,
                                              blocks[bi], got, (size_t)nq * HD);
                        for (int t = 0; t < nr; t++) {
                            bad += memcmp(ref + t * nq * HD, got + t * nq * HD, sizeof(float) * (size_t)nq * HD) != 0;
                            (*cases)++;
                        }
                    }
                }
    return bad;
}

/* ib_attend_policy_rows (windowed sessions' prefill rows) equals ib_attend_policy bitwise on every
 * attention copy this CPU runs; the attn-tile-range fault (a tile's rows take its last row's range)
 * must break the comparison. */
static void check_policy_rows(void) {
    static const ib_isa isas[] = {IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512, IB_ISA_NEON, IB_ISA_AUTO};
    for (int i = 0; i < 5; i++) {
        if (!ib_isa_supported(isas[i])) continue;
        int cases = 0, bad = policy_rows_mismatches(isas[i], &cases);
        CHECK(bad == 0, "windowed attention in tiles of rows, --isa %s: %d of %d rows differ from ib_attend_policy",
              ib_isa_name(isas[i]), bad, cases);
        ib_fault_set(IB_FAULT_ATTN_TILE_RANGE);
        int fcases = 0, fbad = policy_rows_mismatches(isas[i], &fcases);
        ib_fault_set(IB_FAULT_NONE);
        CHECK(fbad > fcases / 4, "attn-tile-range fault on windowed tiles, --isa %s, changed only %d of %d rows",
              ib_isa_name(isas[i]), fbad, fcases);
        printf("windowed tiles --isa %s: %d rows equal, the attn-tile-range fault changed %d\n", ib_isa_name(isas[i]),
               cases - bad, fbad);
    }
}

/* ib_attend_policy_heads (the path windowed sessions take) equals ib_attend_policy bitwise on every
 * attention copy this CPU runs; the isa-fma fault must break the comparison on the vector copies. */
static void check_policy_heads(const ib_model *m) {
    static const ib_isa isas[] = {IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512, IB_ISA_NEON, IB_ISA_AUTO};
    for (int i = 0; i < 5; i++) {
        if (!ib_isa_supported(isas[i])) continue;
        int cases = 0, bad = policy_heads_mismatches(m, isas[i], &cases);
        CHECK(bad == 0, "windowed attention, --isa %s: %d of %d cases differ from ib_attend_policy",
              ib_isa_name(isas[i]), bad, cases);
        if (isas[i] == IB_ISA_AVX2 || isas[i] == IB_ISA_AVX512) {
            ib_fault_set(IB_FAULT_ISA_FMA);
            cases = 0;
            bad = policy_heads_mismatches(m, isas[i], &cases);
            ib_fault_set(IB_FAULT_NONE);
            CHECK(bad > cases / 4, "isa-fma fault on windowed attention, --isa %s, changed only %d of %d cases",
                  ib_isa_name(isas[i]), bad, cases);
        }
    }
}

/* ib_attend_policy against a float64 softmax over exactly the positions the policy keeps. */
static void check_attend_policy(const ib_model *m) {
    int hd = 32, S = 3, W = 20, C = 8, cap = S + W + C, n_pos = 90;
    ib_kv_desc fake = {.dtype = IB_KV_F32, .n_layers = 1, .n_kv_heads = 1, .head_dim = hd, .capacity = cap,
                       .sink = S, .window = W};
    static float K[200][32], Vv[200][32]; /* by position */
    float *k = calloc((size_t)cap * hd, sizeof(float)), *v = calloc((size_t)cap * hd, sizeof(float)), q[32], out[32];
    uint64_t x = 88172645463325252ULL;
    for (int p = 0; p < n_pos; p++)
        for (int d = 0; d < hd; d++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            K[p][d] = (float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            Vv[p][d] = (float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1);
        }
    double worst = 0;
    for (int p = 0; p < n_pos; p++) {
        int sl = ib_kv_slot(&fake, p);
        memcpy(k + (size_t)sl * hd, K[p], sizeof K[p]);
        memcpy(v + (size_t)sl * hd, Vv[p], sizeof Vv[p]);
        for (int d = 0; d < hd; d++) q[d] = K[(p * 7) % (p + 1)][d] * 1.5f;
        ib_attend_policy(&fake, q, k, v, p, hd, 0.25f, 32, out);
        double sc[200], mx = -1e300, sum = 0, ref[32] = {0};
        int kept[200], nk = 0;
        for (int t = 0; t <= p; t++)
            if (t < S || t > p - W) kept[nk++] = t;
        for (int a = 0; a < nk; a++) {
            double dot = 0;
            for (int d = 0; d < hd; d++) dot += (double)q[d] * K[kept[a]][d];
            sc[a] = dot * 0.25;
            if (sc[a] > mx) mx = sc[a];
        }
        for (int a = 0; a < nk; a++) sum += exp(sc[a] - mx);
        for (int a = 0; a < nk; a++)
            for (int d = 0; d < hd; d++) ref[d] += exp(sc[a] - mx) / sum * Vv[kept[a]][d];
        for (int d = 0; d < hd; d++)
            if (fabs(out[d] - ref[d]) > worst) worst = fabs(out[d] - ref[d]);
    }
    CHECK(worst < 1e-5, "sink+window attention differs from the reference by %g", worst);
    free(k);
    free(v);
}

int main(void) {
    char dir[] = "/tmp/ib_test_sched_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    ib_error err;
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 5, .bits = 4, .group = 32, .tied = 1};
    if (ib_mkmodel(dir, &mo, &err)) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return 1;
    }
    ib_model *m;
    if (ib_model_load(dir, NULL, &m, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    g_vocab = ib_model_get_info(m)->vocab_size;
    for (int i = 0; i < NP; i++) {
        plen[i] = 1 + (i * 37) % 150;
        for (int t = 0; t < plen[i]; t++) prompts[i][t] = (int32_t)((i * 131 + t * 17) % 250);
    }
    ib_engine_opts eo = {.threads = 2, .max_step_tokens = 256};
    ib_engine *e;
    CHECK(ib_engine_create(m, &eo, &e, &err) == IB_OK, "%s", err.msg);

    for (int sampled = 0; sampled < 2; sampled++) {
        int32_t rt[NP][GEN];
        double rl[NP][GEN];
        for (int i = 0; i < NP; i++) reference(m, e, i, sampled, rt[i], rl[i]);
        run_sched(m, e, 1, 64, sampled, 0, rt, rl);
        run_sched(m, e, 4, 7, sampled, 1, rt, rl);
        run_sched(m, e, 12, 1, sampled, 0, rt, rl);
        run_sched(m, e, 8, 200, sampled, 1, rt, rl);
    }
    check_sharing(m, e);
    check_auto_sharing(m, e);
    check_prompt_logprobs(m, e);


    /* KV policies */
    check_attend_policy(m);
    check_policy_heads(m);
    check_policy_rows();
    {
        int32_t t_full[GEN], t_a[GEN], t_b[GEN], t_c[GEN];
        uint64_t d_full, d_a, d_b, d_c;
        int i = 4; /* prompt of 149 tokens */
        CHECK(plen[i] > 100, "prompt %d has %d tokens", i, plen[i]);
        /* a window wider than everything equals the full session bitwise */
        run_window(m, e, i, 0, 0, 0, 16, 0, &d_full, t_full);
        run_window(m, e, i, 0, 400, 16, 16, 1, &d_a, t_a);
        CHECK(d_a == d_full && !memcmp(t_a, t_full, sizeof t_a), "wide window differs from full");
        /* sink + window: chunks of 16 in a crowd == token by token alone (another ring size) */
        run_window(m, e, i, 4, 48, 16, 16, 1, &d_a, t_a);
        run_window(m, e, i, 4, 48, 1, 1, 0, &d_b, t_b);
        CHECK(d_a == d_b && !memcmp(t_a, t_b, sizeof t_a), "sink+window: batched chunks differ from alone token by token");
        CHECK(d_a != d_full, "sink+window gave the full session's logits: nothing was evicted");
        run_window(m, e, i, 0, 48, 32, 32, 1, &d_c, t_c);
        run_window(m, e, i, 0, 48, 7, 7, 0, &d_b, t_b);
        CHECK(d_c == d_b && !memcmp(t_c, t_b, sizeof t_c), "window: batched chunks differ from alone");
        CHECK(d_c != d_a, "window and sink+window gave the same logits");
        /* the same with half-precision KV: batched chunks equal alone token by token, full and windowed */
        {
            uint64_t h_a, h_b, h_f;
            int32_t u_a[GEN], u_b[GEN], u_f[GEN];
            g_kv_dtype = IB_KV_F16;
            run_window(m, e, i, 4, 48, 16, 16, 1, &h_a, u_a);
            run_window(m, e, i, 4, 48, 1, 1, 0, &h_b, u_b);
            CHECK(h_a == h_b && !memcmp(u_a, u_b, sizeof u_a), "f16 KV sink+window: batched chunks differ from alone");
            CHECK(h_a != d_a, "f16 KV sink+window gave the f32 KV logits");
            run_window(m, e, i, 0, 0, 0, 16, 1, &h_a, u_a);
            run_window(m, e, i, 0, 0, 0, 1, 0, &h_f, u_f);
            CHECK(h_a == h_f && !memcmp(u_a, u_f, sizeof u_a), "f16 KV full session: batched chunks differ from alone");
            g_kv_dtype = IB_KV_F32;
        }
        /* policy parsing, and a chunk larger than kv_chunk is refused */
        int sk, wd;
        CHECK(ib_kv_policy_parse("sink:4,window:1024", &sk, &wd) == 0 && sk == 4 && wd == 1024, "parse sink");
        CHECK(ib_kv_policy_parse("window:64", &sk, &wd) == 0 && sk == 0 && wd == 64, "parse window");
        CHECK(ib_kv_policy_parse("full", &sk, &wd) == 0 && wd == 0, "parse full");
        CHECK(ib_kv_policy_parse("window:0", &sk, &wd) < 0 && ib_kv_policy_parse("sink:4", &sk, &wd) < 0 &&
              ib_kv_policy_parse("sink:x,window:3", &sk, &wd) < 0, "bad policies accepted");
        ib_session_opts so = {.sampling = ib_sampling_default(), .kv_window = 16, .kv_chunk = 8};
        ib_session *s;
        ib_session_create(m, &so, &s, &err);
        ib_step_item it = {.session = s, .tokens = prompts[4], .n_tokens = 9};
        CHECK(ib_step(e, &it, 1, &err) == IB_ERR_INVALID_ARG, "9 tokens into kv_chunk 8 accepted");
        it.n_tokens = 8;
        for (int r = 0; r < 10; r++) CHECK(ib_step(e, &it, 1, &err) == IB_OK, "%s", err.msg);
        CHECK_EQ_INT(ib_session_position(s), 80);
        CHECK(ib_session_rewind(s, 60, &err) == IB_ERR_UNSUPPORTED, "deep rewind of a windowed session");
        CHECK(ib_session_rewind(s, 75, &err) == IB_OK, "%s", err.msg);
        ib_session_free(s);
    }
    /* logprob: a function of the logits; exp of all logprobs sums to 1 */
    {
        float lg[5] = {1.0f, 2.0f, 3.0f, -1.0f, 0.5f};
        double sum = 0;
        for (int i = 0; i < 5; i++) sum += exp(ib_logprob(lg, 5, i));
        CHECK(sum > 0.999999 && sum < 1.000001, "sum %g", sum);
        CHECK(ib_logprob(lg, 5, 2) > ib_logprob(lg, 5, 1), "order");
    }
    /* top logprobs: the k largest by logit, ties to the lowest id, against a selection by brute force */
    {
        enum { NV = 300 };
        float lg[NV];
        unsigned r = 12345;
        for (int i = 0; i < NV; i++) {
            r = r * 1103515245u + 12345u;
            lg[i] = (float)((r >> 16) % 40) * 0.25f; /* many ties */
        }
        for (int k = 0; k <= IB_MAX_TOP_LOGPROBS + 2; k++) {
            int32_t ids[IB_MAX_TOP_LOGPROBS];
            double lp[IB_MAX_TOP_LOGPROBS];
            int n = ib_top_logprobs(lg, NV, k, ids, lp);
            CHECK_EQ_INT(n, k > IB_MAX_TOP_LOGPROBS ? IB_MAX_TOP_LOGPROBS : k);
            char taken[NV] = {0};
            int bad = 0;
            for (int j = 0; j < n; j++) {
                int best = -1;
                for (int i = 0; i < NV; i++)
                    if (!taken[i] && (best < 0 || lg[i] > lg[best])) best = i;
                taken[best] = 1;
                if (ids[j] != best || lp[j] != ib_logprob(lg, NV, best)) bad++;
            }
            CHECK(bad == 0, "k %d: %d entries differ from the brute-force order", k, bad);
        }
        int32_t ids[3];
        double lp[3];
        CHECK_EQ_INT(ib_top_logprobs(lg, 2, 3, ids, lp), 2);
    }

    ib_sched_opts so = {.max_batch = 1, .prefill_chunk = 16, .max_queue = 1};
    ib_sched *S;
    CHECK(ib_sched_create(e, &so, &S, &err) == IB_OK, "%s", err.msg);
    ib_session_opts sopt = {.max_context = 64, .sampling = sampling(0)};

    /* stop ids: stop at the reference's 4th token */
    {
        int32_t rt[GEN];
        double rl[GEN];
        reference(m, e, 3, 0, rt, rl);
        int k = 0;
        while (k < 3 && rt[k] != rt[3]) k++; /* the first occurrence of that id */
        rec r = {0};
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.cv, NULL);
        ib_session_opts so2 = {.max_context = 256, .sampling = sampling(0)};
        ib_session_create(m, &so2, &r.s, &err);
        ib_sched_job jb = {.session = r.s, .prompt = prompts[3], .n_prompt = plen[3], .max_new_tokens = GEN,
                           .stop_ids = &rt[3], .n_stop = 1, .on_event = on_event, .ctx = &r};
        CHECK(ib_sched_submit(S, &jb, NULL, &err) == IB_OK, "%s", err.msg);
        rec_wait(&r);
        CHECK(!strcmp(r.finish, "stop"), "finish %s", r.finish);
        CHECK_EQ_INT(r.n, k + 1);
        CHECK(r.n > 0 && r.tok[r.n - 1] == rt[3], "last token %d", r.tok[r.n - 1]);
        /* the session holds prompt + generated - 1 tokens: the last one was not fed */
        CHECK_EQ_INT(ib_session_position(r.s), plen[3] + r.n - 1);
        ib_session_free(r.s);
    }
    /* context overflow: refused at submit */
    {
        ib_session *s;
        ib_session_create(m, &sopt, &s, &err);
        ib_sched_job jb = {.session = s, .prompt = prompts[5], .n_prompt = 60, .max_new_tokens = 6};
        CHECK(ib_sched_submit(S, &jb, NULL, &err) == IB_ERR_CONTEXT, "code %d", err.code);
        jb.max_new_tokens = 5; /* 60 + 5 - 1 = 64 fits */
        rec r = {0};
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.cv, NULL);
        jb.on_event = on_event;
        jb.ctx = &r;
        CHECK(ib_sched_submit(S, &jb, NULL, &err) == IB_OK, "%s", err.msg);
        rec_wait(&r);
        CHECK_EQ_INT(r.n, 5);
        CHECK_EQ_INT(ib_session_position(s), 64);
        ib_session_free(s);
    }
    /* prefill only */
    {
        rec r = {0};
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.cv, NULL);
        ib_session *s;
        ib_session_create(m, &sopt, &s, &err);
        ib_sched_job jb = {.session = s, .prompt = prompts[2], .n_prompt = 40, .max_new_tokens = 0,
                           .on_event = on_event, .ctx = &r};
        CHECK(ib_sched_submit(S, &jb, NULL, &err) == IB_OK, "%s", err.msg);
        rec_wait(&r);
        CHECK(!strcmp(r.finish, "length") && r.n == 0 && r.fed == 40, "finish %s n %d fed %d", r.finish, r.n, r.fed);
        CHECK_EQ_INT(ib_session_position(s), 40);
        ib_session_free(s);
    }
    /* digest_logits with a logit bias: the scheduler's running digest is that of the raw rows the
     * events show (the bias applies to the draw only) */
    {
        rec r = {0};
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.cv, NULL);
        r.dig = IB_DIGEST_INIT;
        r.want_sdig = 1;
        ib_session *s;
        ib_session_create(m, &sopt, &s, &err);
        const int32_t bid = 5;
        const float bval = 100.0f;
        ib_sched_job jb = {.session = s, .prompt = prompts[3], .n_prompt = 12, .max_new_tokens = 4,
                           .on_event = on_event, .ctx = &r, .logit_bias_ids = &bid, .logit_bias = &bval,
                           .n_logit_bias = 1, .digest_logits = 1};
        CHECK(ib_sched_submit(S, &jb, NULL, &err) == IB_OK, "%s", err.msg);
        rec_wait(&r);
        int biased = r.n == 4;
        for (int k = 0; biased && k < 4; k++) biased = r.tok[k] == bid;
        CHECK(biased, "logit bias +100 on id 5: %d tokens, first %d", r.n, r.n ? r.tok[0] : -1);
        CHECK(r.sdig_seen == 4 && r.sdig_bad == 0, "biased job: %d of %d logits_digest differ from the raw rows' chain",
              r.sdig_bad, r.sdig_seen);
        ib_session_free(s);
    }
    /* cancellation and a full queue: one active, one queued, the third refused */
    {
        rec r[3];
        ib_session *s[3];
        uint64_t id[3];
        ib_session_opts big = {.max_context = 2048, .sampling = sampling(0)};
        for (int i = 0; i < 3; i++) {
            memset(&r[i], 0, sizeof r[i]);
            pthread_mutex_init(&r[i].mu, NULL);
            pthread_cond_init(&r[i].cv, NULL);
            ib_session_create(m, &big, &s[i], &err);
        }
        ib_sched_job jb = {.session = s[0], .prompt = prompts[1], .n_prompt = 5, .max_new_tokens = 2000,
                           .on_event = on_event, .ctx = &r[0]};
        CHECK(ib_sched_submit(S, &jb, &id[0], &err) == IB_OK, "%s", err.msg);
        jb.session = s[1];
        jb.ctx = &r[1];
        CHECK(ib_sched_submit(S, &jb, &id[1], &err) == IB_OK, "%s", err.msg);
        jb.session = s[2];
        jb.ctx = &r[2];
        CHECK(ib_sched_submit(S, &jb, &id[2], &err) == IB_ERR_STATE, "third job accepted");
        CHECK(strstr(err.msg, "queue full") != NULL, "%s", err.msg);
        usleep(20000);
        CHECK(ib_sched_cancel(S, id[1]) == 1, "cancel queued");
        CHECK(ib_sched_cancel(S, id[0]) == 1, "cancel active");
        rec_wait(&r[0]);
        rec_wait(&r[1]);
        CHECK(!strcmp(r[0].finish, "cancelled") && r[0].n < 2000, "%s %d", r[0].finish, r[0].n);
        CHECK(!strcmp(r[1].finish, "cancelled") && r[1].n == 0, "%s %d", r[1].finish, r[1].n);
        CHECK(ib_sched_cancel(S, id[0]) == 0, "cancel a finished job");
        for (int i = 0; i < 3; i++) ib_session_free(s[i]);
    }
    /* freeing with work in flight cancels it */
    {
        rec r = {0};
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.cv, NULL);
        ib_session_opts big = {.max_context = 2048, .sampling = sampling(0)};
        ib_session *s;
        ib_session_create(m, &big, &s, &err);
        ib_sched_job jb = {.session = s, .prompt = prompts[1], .n_prompt = 5, .max_new_tokens = 2000,
                           .on_event = on_event, .ctx = &r};
        CHECK(ib_sched_submit(S, &jb, NULL, &err) == IB_OK, "%s", err.msg);
        ib_sched_free(S);
        CHECK(r.done && !strcmp(r.finish, "cancelled"), "free: done %d finish %s", r.done, r.finish);
        ib_session_free(s);
    }
    ib_engine_free(e);
    ib_model_free(m);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_MAIN_END("test_scheduler");
}
