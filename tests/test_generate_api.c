/*
 * test_generate_api.c — ib_generate's per-request settings and streaming hook, on a tiny synthetic
 * model:
 *   - per-request sampling: greedy and seeded requests mixed in one batched run give each request's
 *     tokens and digest of a run with those settings for every request (and a request's own settings
 *     really are used: the seeded one differs from greedy);
 *   - stop strings: a request ends with the token whose text completes a stop string (finish "stop",
 *     stop_string its index), the tokens a prefix of the run without stops; an empty stop string is a
 *     one-line error;
 *   - on_token: called once per generated token, in order per request, done exactly on the last;
 *   - ib_gen_stats: prefill + decode seconds within the run's, decode tokens <= generated tokens;
 *   - ib_version() equals IB_VERSION_STRING;
 *   - zeroed option structs are the documented defaults: engine threads 0 = the CPUs online, session
 *     max_context 0 = min(model, IB_SESSION_DEFAULT_CONTEXT), ib_sampling's top_p 0 = off (the draws
 *     of top_p 1, not of the top token alone), ib_gen_opts' zero = stop at eos (and ignore_eos = 1
 *     goes past it), batch 0 = IB_GEN_DEFAULT_BATCH with the answers of batch 1, ib_gen_opts_default().
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "isobatch.h"
#include "model/mkmodel.h"
#include "runtime/runtime.h"
#include <float.h>
#include <unistd.h>

#define NP 5
#define GEN 12

static int32_t prompts[NP][40];
static int plen[NP];

typedef struct seen {
    int n[NP];
    int32_t tok[NP][GEN];
    int done_at[NP]; /* token count when done was reported, -1 before */
    int bad_order;
} seen;

static void on_token(void *ctx, int r, int32_t t, int done) {
    seen *s = ctx;
    if (r < 0 || r >= NP || s->n[r] >= GEN || s->done_at[r] >= 0) {
        s->bad_order = 1;
        return;
    }
    s->tok[r][s->n[r]++] = t;
    if (done) s->done_at[r] = s->n[r];
}

/* Run all NP prompts (batch B), request i with sampling sp[i] (NULL: the options' greedy). */
static int run(ib_engine *e, int B, const ib_sampling *const *sp, const char *const *stop, int n_stop, ib_gen_result *res,
               ib_gen_stats *st, seen *sn, ib_error *err) {
    ib_gen_request rq[NP];
    for (int i = 0; i < NP; i++)
        rq[i] = (ib_gen_request){prompts[i], plen[i], 0, sp ? sp[i] : NULL, i == 1 ? stop : NULL, i == 1 ? n_stop : 0};
    ib_gen_opts go = {.ignore_eos = 1, .max_new_tokens = GEN, .batch = B, .sampling = ib_sampling_default(),
                      .on_token = sn ? on_token : NULL, .on_token_ctx = sn};
    return ib_generate(e, rq, NP, &go, res, st, err);
}

/* Zeroed option structs mean the documented defaults. */
static void test_zero_defaults(ib_model *m, ib_engine *e) {
    ib_error err;
    /* engine: threads 0 = the CPUs online */
    ib_engine *z;
    CHECK(ib_engine_create(m, &(ib_engine_opts){0}, &z, &err) == IB_OK, "%s", err.msg);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (z) CHECK_EQ_INT(ib_pool_threads(z->pool), cpus < IB_MAX_DEFAULT_THREADS ? cpus : IB_MAX_DEFAULT_THREADS);
    ib_engine *one;
    CHECK(ib_engine_create(m, &(ib_engine_opts){.threads = 1}, &one, &err) == IB_OK, "%s", err.msg);
    if (one) CHECK_EQ_INT(ib_pool_threads(one->pool), 1);
    ib_engine_free(one);
    ib_engine_free(z);
    /* session: max_context 0 = min(model, IB_SESSION_DEFAULT_CONTEXT), not the model's whole context */
    ib_session *s;
    int ctx = ib_model_get_info(m)->max_context;
    CHECK(ib_session_create(m, &(ib_session_opts){0}, &s, &err) == IB_OK, "%s", err.msg);
    CHECK_EQ_INT(ib_session_capacity(s), ctx < IB_SESSION_DEFAULT_CONTEXT ? ctx : IB_SESSION_DEFAULT_CONTEXT);
    ib_session_free(s);
    CHECK(ib_session_create(m, NULL, &s, &err) == IB_OK, "%s", err.msg);
    CHECK_EQ_INT(ib_session_capacity(s), ctx < IB_SESSION_DEFAULT_CONTEXT ? ctx : IB_SESSION_DEFAULT_CONTEXT);
    ib_session_free(s);
    /* sampling: a zeroed ib_sampling (temperature and seed set) draws as the default's; top_p 0 is off,
     * not "the top token only" (which a tiny top_p gives: the check can tell them apart) */
    ib_sampling zs = {.temperature = 1.5f, .seed = 77}, ds = ib_sampling_default(), tiny = ds;
    ds.temperature = tiny.temperature = 1.5f;
    ds.seed = tiny.seed = 77;
    tiny.top_p = FLT_TRUE_MIN;
    const ib_sampling *pz[NP], *pd[NP], *pt[NP];
    for (int i = 0; i < NP; i++) pz[i] = &zs, pd[i] = &ds, pt[i] = &tiny;
    ib_gen_result a[NP], b[NP], c[NP];
    CHECK(run(e, 2, pz, NULL, 0, a, NULL, NULL, &err) == IB_OK && run(e, 2, pd, NULL, 0, b, NULL, NULL, &err) == IB_OK &&
              run(e, 2, pt, NULL, 0, c, NULL, NULL, &err) == IB_OK, "%s", err.msg);
    int same = 0, differs = 0;
    for (int i = 0; i < NP; i++) same += a[i].digest == b[i].digest, differs += a[i].digest != c[i].digest;
    CHECK_EQ_INT(same, NP);
    CHECK(differs > 0, "zeroed top_p drew as the top token alone");
    ib_gen_results_free(a, NP);
    ib_gen_results_free(b, NP);
    ib_gen_results_free(c, NP);
    /* ib_gen_opts: zero = stop at eos. Make the eos the 3rd token request 0 draws greedily. */
    ib_gen_request rq = {prompts[0], plen[0], 0, NULL, NULL, 0};
    ib_gen_opts go = {.max_new_tokens = GEN, .ignore_eos = 1, .sampling = ib_sampling_default()};
    ib_gen_result r1, r2, r3;
    CHECK(ib_generate(e, &rq, 1, &go, &r1, NULL, &err) == IB_OK, "%s", err.msg);
    ib_model_info *info = (ib_model_info *)ib_model_get_info(m);
    int32_t eos = info->eos_id;
    int k = 0;
    while (k < 2 && r1.tokens[k] != r1.tokens[2]) k++; /* the first place token 2's id occurs */
    info->eos_id = r1.tokens[2];
    ib_gen_opts zo = {.max_new_tokens = GEN, .sampling = ib_sampling_default()}; /* ignore_eos 0, batch 0 */
    CHECK(ib_generate(e, &rq, 1, &zo, &r2, NULL, &err) == IB_OK, "%s", err.msg);
    CHECK(r2.n_tokens == k + 1 && !strcmp(r2.finish, "stop"), "zeroed ib_gen_opts: %d tokens, finish %s (want %d, stop)",
          r2.n_tokens, r2.finish, k + 1);
    CHECK(ib_generate(e, &rq, 1, &go, &r3, NULL, &err) == IB_OK, "%s", err.msg);
    CHECK(r3.n_tokens == GEN && r3.digest == r1.digest, "ignore_eos 1: %d tokens", r3.n_tokens);
    info->eos_id = eos;
    ib_gen_results_free(&r1, 1);
    ib_gen_results_free(&r2, 1);
    ib_gen_results_free(&r3, 1);
    /* batch 0 = IB_GEN_DEFAULT_BATCH: the answers of batch 1 */
    ib_gen_request all[NP];
    for (int i = 0; i < NP; i++) all[i] = (ib_gen_request){prompts[i], plen[i], 0, NULL, NULL, 0};
    ib_gen_result x[NP], y[NP];
    ib_gen_opts b0 = {.ignore_eos = 1, .max_new_tokens = GEN}, b1 = b0;
    b1.batch = 1;
    CHECK(ib_generate(e, all, NP, &b0, x, NULL, &err) == IB_OK && ib_generate(e, all, NP, &b1, y, NULL, &err) == IB_OK,
          "%s", err.msg);
    same = 0;
    for (int i = 0; i < NP; i++) same += x[i].digest == y[i].digest && x[i].n_tokens == GEN;
    CHECK_EQ_INT(same, NP);
    ib_gen_results_free(x, NP);
    ib_gen_results_free(y, NP);
    ib_gen_opts d = ib_gen_opts_default();
    CHECK(d.max_new_tokens == IB_GEN_DEFAULT_MAX_NEW_TOKENS && d.batch == 0 && !d.ignore_eos &&
              d.sampling.top_p == 1.0f && d.sampling.repeat_penalty == 1.0f,
          "ib_gen_opts_default: max_new_tokens %d", d.max_new_tokens);
}

int main(void) {
    CHECK(!strcmp(ib_version(), IB_VERSION_STRING), "ib_version %s, header %s", ib_version(), IB_VERSION_STRING);
    char dir[] = "/tmp/ib_test_genapi_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    ib_error err;
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 11, .bits = 4, .group = 32, .tied = 1};
    ib_model *m;
    if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
        fprintf(stderr, "model: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < NP; i++) {
        plen[i] = 3 + (i * 7) % 30;
        for (int t = 0; t < plen[i]; t++) prompts[i][t] = (int32_t)(65 + (i * 13 + t * 5) % 26);
    }
    ib_engine *e;
    ib_engine_opts eo = {.threads = 2, .max_step_tokens = 256};
    CHECK(ib_engine_create(m, &eo, &e, &err) == IB_OK, "%s", err.msg);

    /* per-request sampling: odd requests seeded (seed = index), even ones greedy */
    ib_sampling greedy = ib_sampling_default(), hot[NP];
    const ib_sampling *mix[NP], *all_hot[NP];
    for (int i = 0; i < NP; i++) {
        hot[i] = greedy;
        hot[i].temperature = 1.0f;
        hot[i].seed = (uint64_t)i;
        mix[i] = i % 2 ? &hot[i] : &greedy;
        all_hot[i] = &hot[i];
    }
    ib_gen_result rm[NP], rg[NP], rh[NP];
    ib_gen_stats st;
    seen sn;
    memset(&sn, 0, sizeof sn);
    for (int i = 0; i < NP; i++) sn.done_at[i] = -1;
    CHECK(run(e, 3, mix, NULL, 0, rm, &st, &sn, &err) == IB_OK, "%s", err.msg);
    CHECK(run(e, 1, NULL, NULL, 0, rg, NULL, NULL, &err) == IB_OK, "%s", err.msg);
    CHECK(run(e, 1, all_hot, NULL, 0, rh, NULL, NULL, &err) == IB_OK, "%s", err.msg);
    int differs = 0;
    for (int i = 0; i < NP; i++) {
        const ib_gen_result *want = i % 2 ? &rh[i] : &rg[i];
        CHECK(rm[i].digest == want->digest && rm[i].n_tokens == want->n_tokens &&
                  !memcmp(rm[i].tokens, want->tokens, (size_t)want->n_tokens * sizeof(int32_t)),
              "request %d: mixed-settings batch differs from its own settings alone", i);
        if (i % 2) differs |= rh[i].digest != rg[i].digest;
        /* on_token saw exactly the result's tokens, done on the last */
        CHECK(sn.n[i] == rm[i].n_tokens && !memcmp(sn.tok[i], rm[i].tokens, (size_t)sn.n[i] * sizeof(int32_t)) &&
                  sn.done_at[i] == rm[i].n_tokens,
              "request %d: on_token saw %d tokens (done at %d), the result has %d", i, sn.n[i], sn.done_at[i],
              rm[i].n_tokens);
        CHECK_EQ_INT(rm[i].stop_string, -1);
    }
    CHECK(!sn.bad_order, "on_token called after done or out of range");
    CHECK(differs, "the seeded requests gave the greedy tokens: per-request sampling was ignored");
    CHECK(st.prefill_seconds >= 0 && st.decode_seconds >= 0 && st.prefill_seconds + st.decode_seconds <= st.seconds + 1e-6,
          "prefill %g + decode %g > total %g", st.prefill_seconds, st.decode_seconds, st.seconds);
    CHECK(st.decode_tokens > 0 && st.decode_tokens <= st.generated_tokens, "decode tokens %ld of %ld", st.decode_tokens,
          st.generated_tokens);

    /* stop strings: request 1 (greedy) stops at the token completing the text of its tokens 3..4 */
    char want_text[1024];
    size_t wl = 0;
    int k_end = 5; /* tokens [3, 5) */
    for (int t = 3; t < k_end && t < rg[1].n_tokens; t++) {
        int w = ib_token_bytes(m, rg[1].tokens[t], want_text + wl, (int)(sizeof want_text - wl - 1));
        if (w > 0) wl += (size_t)w;
    }
    want_text[wl] = 0;
    if (wl > 0 && !memchr(want_text, 0, wl) && rg[1].n_tokens >= k_end) {
        /* the first token whose text completes that string: at most k_end, earlier if it occurs sooner */
        const char *stops[2] = {"\x01never-there\x02", want_text};
        ib_gen_result rs[NP];
        CHECK(run(e, 2, NULL, stops, 2, rs, NULL, NULL, &err) == IB_OK, "%s", err.msg);
        CHECK(!strcmp(rs[1].finish, "stop") && rs[1].stop_string == 1, "finish %s, stop_string %d", rs[1].finish,
              rs[1].stop_string);
        CHECK(rs[1].n_tokens >= 1 && rs[1].n_tokens <= k_end &&
                  !memcmp(rs[1].tokens, rg[1].tokens, (size_t)rs[1].n_tokens * sizeof(int32_t)),
              "stopped after %d tokens (want <= %d, a prefix of the unstopped run)", rs[1].n_tokens, k_end);
        CHECK(rs[0].digest == rg[0].digest && rs[0].stop_string == -1, "a request without stops was changed");
        ib_gen_results_free(rs, NP);
    } else
        CHECK(0, "the greedy run of request 1 is too short or has NUL bytes for the stop-string check");
    const char *empty[1] = {""};
    ib_gen_result rx[NP];
    CHECK(run(e, 2, NULL, empty, 1, rx, NULL, NULL, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "stop string 0"),
          "an empty stop string: %s", err.msg);

    test_zero_defaults(m, e);
    ib_gen_results_free(rm, NP);
    ib_gen_results_free(rg, NP);
    ib_gen_results_free(rh, NP);
    ib_engine_free(e);
    ib_model_free(m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_MAIN_END("test_generate_api");
}
