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
 *   - ib_version() equals IB_VERSION_STRING.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "isobatch.h"
#include "model/mkmodel.h"

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
    ib_gen_opts go = {.max_new_tokens = GEN, .batch = B, .sampling = ib_sampling_default(),
                      .on_token = sn ? on_token : NULL, .on_token_ctx = sn};
    return ib_generate(e, rq, NP, &go, res, st, err);
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
