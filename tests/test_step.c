/*
 * test_step.c — the batched step's API contract: sessions at different positions with different
 * token counts in one step; validation errors that leave every session unchanged; context limits;
 * the embedding example's claim (two sessions stepped together equal each alone); ib_generate's kept
 * logits rows and digest (the definition behind `generate --json` and `--logits-out`), per-request
 * limits, its stats, and the checks it makes before any work; every row's logits of a prompt
 * (row_logits) against one token a step.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "isobatch.h"
#include "model/mkmodel.h"
#include "sampling/sampler.h"

static ib_model *m;
static int V;

/* Feed tokens to a fresh session one step at a time (chunk tokens per step); logits of the last. */
static void alone(ib_engine *e, const int32_t *t, int n, int chunk, float *logits) {
    ib_session *s;
    ib_error err;
    ib_session_create(m, &(ib_session_opts){.max_context = 256}, &s, &err);
    for (int i = 0; i < n; i += chunk) {
        int k = n - i < chunk ? n - i : chunk;
        ib_step_item it = {.session = s, .tokens = t + i, .n_tokens = k, .logits = i + k == n ? logits : NULL, .argmax = NULL};
        CHECK(ib_step(e, &it, 1, &err) == IB_OK, "alone step: %s", err.msg);
    }
    ib_session_free(s);
}

/* One step of NS sessions at different positions, each bringing one token and wanting its logits, its
 * argmax or both: more logits rows than one lm_head product takes (the CPU backend computes them up to
 * 32 rows a product, their argmax and copies spread over the pool), so the step runs five products.
 * Counts the sessions whose logits or argmax differ from the same session alone (all its tokens in one
 * step, one row of logits), and failed steps. */
enum { NS = 150 };
static int many_logits_rows(ib_engine *e) {
    static ib_session *s[NS];
    static int32_t tok[NS][6], got_arg[NS];
    ib_step_item items[NS];
    ib_error err;
    float *lg = malloc((size_t)NS * V * 4), *ref = malloc((size_t)V * 4);
    int bad = 0;
    for (int k = 0; k < NS; k++) {
        int pre = k % 5;   /* tokens fed before the shared step: positions 0..4 */
        for (int i = 0; i <= pre; i++) tok[k][i] = (k * 11 + i * 7 + 3) % 256;
        ib_session_create(m, &(ib_session_opts){.max_context = 16}, &s[k], &err);
        if (pre > 0) {
            ib_step_item it = {.session = s[k], .tokens = tok[k], .n_tokens = pre, .logits = NULL, .argmax = NULL};
            bad += ib_step(e, &it, 1, &err) != IB_OK;
        }
        got_arg[k] = -1;
        items[k] = (ib_step_item){.session = s[k], .tokens = tok[k] + pre, .n_tokens = 1,
                                  .logits = k % 3 != 1 ? lg + (size_t)k * V : NULL,
                                  .argmax = k % 3 != 0 ? &got_arg[k] : NULL};
    }
    bad += ib_step(e, items, NS, &err) != IB_OK;
    for (int k = 0; k < NS; k++) {
        ib_session *sa;
        ib_session_create(m, &(ib_session_opts){.max_context = 16}, &sa, &err);
        ib_step_item it = {.session = sa, .tokens = tok[k], .n_tokens = k % 5 + 1, .logits = ref, .argmax = NULL};
        bad += ib_step(e, &it, 1, &err) != IB_OK;
        ib_session_free(sa);
        int differs = 0;
        if (k % 3 != 1) differs |= memcmp(lg + (size_t)k * V, ref, (size_t)V * 4) != 0;
        if (k % 3 != 0) differs |= got_arg[k] != ib_argmax(ref, V);
        bad += differs;
        ib_session_free(s[k]);
    }
    free(lg), free(ref);
    return bad;
}

/* Prompt logits: one step where session p brings NP tokens wanting every row's logits (row_logits, and
 * `logits`), beside session q's decode row. Counts rows that differ, bitwise, from the same session fed
 * one token a step (row t: the logits after tokens[0..t]), plus a `logits` unequal to the last row. */
enum { NP = 40 };
static int prompt_rows(ib_engine *e) {
    int32_t t[NP], qt[3] = {7, 9, 11};
    for (int i = 0; i < NP; i++) t[i] = (i * 29 + 3) % 256;
    float *rows = malloc((size_t)NP * V * 4), *last = malloc((size_t)V * 4), *ref = malloc((size_t)V * 4);
    ib_session *p, *q, *one;
    ib_error err;
    ib_session_create(m, &(ib_session_opts){.max_context = 64}, &p, &err);
    ib_session_create(m, &(ib_session_opts){.max_context = 64}, &q, &err);
    ib_session_create(m, &(ib_session_opts){.max_context = 64}, &one, &err);
    int bad = 0;
    ib_step_item pre = {.session = q, .tokens = qt, .n_tokens = 2, .logits = NULL, .argmax = NULL};
    bad += ib_step(e, &pre, 1, &err) != IB_OK;
    ib_step_item two[2] = {{.session = q, .tokens = qt + 2, .n_tokens = 1, .logits = NULL, .argmax = NULL}, {.session = p, .tokens = t, .n_tokens = NP, .logits = last,
                                                         .row_logits = rows}};
    bad += ib_step(e, two, 2, &err) != IB_OK;
    for (int i = 0; i < NP; i++) {
        ib_step_item it = {.session = one, .tokens = t + i, .n_tokens = 1, .logits = ref, .argmax = NULL};
        bad += ib_step(e, &it, 1, &err) != IB_OK;
        bad += memcmp(rows + (size_t)i * V, ref, (size_t)V * 4) != 0;
    }
    bad += memcmp(last, rows + (size_t)(NP - 1) * V, (size_t)V * 4) != 0;
    ib_session_free(p), ib_session_free(q), ib_session_free(one);
    free(rows), free(last), free(ref);
    return bad;
}

int main(void) {
    char dir[] = "/tmp/ib_step_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    ib_error err;
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 5, .bits = 8, .group = 64, .tied = 1};
    if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    V = ib_model_get_info(m)->vocab_size;
    ib_engine *e;
    CHECK(ib_engine_create(m, &(ib_engine_opts){.threads = 2, .max_step_tokens = 64}, &e, &err) == IB_OK, "%s", err.msg);

    int32_t a[40], b[40];
    for (int i = 0; i < 40; i++) a[i] = (i * 7 + 1) % 256, b[i] = (i * 13 + 5) % 256;
    float *la = malloc(V * 4), *lb = malloc(V * 4), *ra = malloc(V * 4), *rb = malloc(V * 4);

    /* a at position 10 brings 1 token, b at position 0 brings 30: one step */
    ib_session *sa, *sb;
    ib_session_create(m, &(ib_session_opts){.max_context = 40}, &sa, &err);
    ib_session_create(m, &(ib_session_opts){.max_context = 40}, &sb, &err);
    ib_step_item pre = {.session = sa, .tokens = a, .n_tokens = 10, .logits = NULL, .argmax = NULL};
    CHECK(ib_step(e, &pre, 1, &err) == IB_OK, "%s", err.msg);
    ib_step_item two[2] = {{.session = sa, .tokens = a + 10, .n_tokens = 1, .logits = la, .argmax = NULL}, {.session = sb, .tokens = b, .n_tokens = 30, .logits = lb, .argmax = NULL}};
    CHECK(ib_step(e, two, 2, &err) == IB_OK, "%s", err.msg);
    CHECK_EQ_INT(ib_session_position(sa), 11);
    CHECK_EQ_INT(ib_session_position(sb), 30);
    alone(e, a, 11, 11, ra);
    alone(e, b, 30, 4, rb);
    CHECK(memcmp(la, ra, V * 4) == 0, "session a: batched logits differ from alone");
    CHECK(memcmp(lb, rb, V * 4) == 0, "session b: batched logits differ from alone (chunks of 4)");

    /* errors leave every session unchanged */
    ib_step_item dup[2] = {{.session = sa, .tokens = a, .n_tokens = 1, .logits = NULL, .argmax = NULL}, {.session = sa, .tokens = a, .n_tokens = 1, .logits = NULL, .argmax = NULL}};
    CHECK(ib_step(e, dup, 2, &err) == IB_ERR_STATE && strstr(err.msg, "listed twice"), "dup: %s", err.msg);
    int32_t badtok[2] = {1, V + 3};
    ib_step_item bad[2] = {{.session = sb, .tokens = a, .n_tokens = 1, .logits = NULL, .argmax = NULL}, {.session = sa, .tokens = badtok, .n_tokens = 2, .logits = NULL, .argmax = NULL}};
    CHECK(ib_step(e, bad, 2, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "outside the vocabulary"), "tok: %s", err.msg);
    ib_step_item full = {.session = sb, .tokens = a, .n_tokens = 11, .logits = NULL, .argmax = NULL}; /* 30 + 11 > 40 */
    CHECK(ib_step(e, &full, 1, &err) == IB_ERR_CONTEXT && strstr(err.msg, "exceed"), "ctx: %s", err.msg);
    ib_step_item big[2] = {{.session = sa, .tokens = a, .n_tokens = 29, .logits = NULL, .argmax = NULL}, {.session = sb, .tokens = b, .n_tokens = 1, .logits = NULL, .argmax = NULL}};
    ib_session *sc;
    ib_session_create(m, &(ib_session_opts){.max_context = 100}, &sc, &err);
    int32_t many[70] = {0};
    ib_step_item toomany = {.session = sc, .tokens = many, .n_tokens = 70, .logits = NULL, .argmax = NULL}; /* > max_step_tokens 64 */
    CHECK(ib_step(e, &toomany, 1, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "max_step_tokens"), "R: %s", err.msg);
    ib_step_item empty = {.session = sa, .tokens = a, .n_tokens = 0, .logits = NULL, .argmax = NULL};
    CHECK(ib_step(e, &empty, 1, &err) == IB_ERR_INVALID_ARG, "empty item accepted");
    CHECK_EQ_INT(ib_session_position(sa), 11);
    CHECK_EQ_INT(ib_session_position(sb), 30);
    CHECK_EQ_INT(ib_session_position(sc), 0);
    (void)big;

    /* after the failed steps the sessions continue exactly as an uninterrupted run */
    ib_step_item next = {.session = sa, .tokens = a + 11, .n_tokens = 1, .logits = la, .argmax = NULL};
    CHECK(ib_step(e, &next, 1, &err) == IB_OK, "%s", err.msg);
    alone(e, a, 12, 5, ra);
    CHECK(memcmp(la, ra, V * 4) == 0, "session a changed by a failed step");

    /* copy and rewind: a copy continues exactly as the original; a rewound session re-fed the same
     * tokens gives the same logits */
    ib_session *sd;
    ib_session_create(m, &(ib_session_opts){.max_context = 40}, &sd, &err);
    CHECK(ib_session_copy(sd, sa, &err) == IB_OK && ib_session_position(sd) == 12, "copy: %s", err.msg);
    ib_step_item cont[2] = {{.session = sa, .tokens = a + 12, .n_tokens = 3, .logits = la, .argmax = NULL}, {.session = sd, .tokens = a + 12, .n_tokens = 3, .logits = lb, .argmax = NULL}};
    CHECK(ib_step(e, cont, 2, &err) == IB_OK, "%s", err.msg);
    CHECK(memcmp(la, lb, V * 4) == 0, "copied session diverged from its original");
    CHECK(ib_session_rewind(sd, 5, &err) == IB_OK && ib_session_position(sd) == 5, "rewind");
    ib_step_item refeed = {.session = sd, .tokens = a + 5, .n_tokens = 10, .logits = lb, .argmax = NULL};
    CHECK(ib_step(e, &refeed, 1, &err) == IB_OK, "%s", err.msg);
    CHECK(memcmp(la, lb, V * 4) == 0, "rewound and re-fed session differs");
    CHECK(ib_session_rewind(sd, 99, &err) == IB_ERR_INVALID_ARG, "rewind past the end accepted");
    ib_session *small;
    ib_session_create(m, &(ib_session_opts){.max_context = 4}, &small, &err);
    CHECK(ib_session_copy(small, sa, &err) == IB_ERR_CONTEXT && ib_session_position(small) == 0, "copy into a small session");
    ib_session_free(small);
    ib_session_free(sd);
    { /* q8 KV: a copy into a session of another capacity (its planes at other byte offsets) continues
       * exactly as the original; a copy between KV types is refused */
        ib_session *qa, *qd, *qf;
        ib_session_create(m, &(ib_session_opts){.max_context = 100, .kv_dtype = IB_KV_Q8}, &qa, &err);
        ib_session_create(m, &(ib_session_opts){.max_context = 40, .kv_dtype = IB_KV_Q8}, &qd, &err);
        ib_session_create(m, &(ib_session_opts){.max_context = 40, .kv_dtype = IB_KV_F16}, &qf, &err);
        ib_step_item pre = {.session = qa, .tokens = a, .n_tokens = 12, .logits = NULL, .argmax = NULL};
        CHECK(qa && qd && qf && ib_step(e, &pre, 1, &err) == IB_OK, "q8 prefill: %s", err.msg);
        CHECK(ib_session_copy(qd, qa, &err) == IB_OK && ib_session_position(qd) == 12, "q8 copy: %s", err.msg);
        ib_step_item qc[2] = {{.session = qa, .tokens = a + 12, .n_tokens = 3, .logits = la, .argmax = NULL}, {.session = qd, .tokens = a + 12, .n_tokens = 3, .logits = lb, .argmax = NULL}};
        CHECK(ib_step(e, qc, 2, &err) == IB_OK, "%s", err.msg);
        CHECK(memcmp(la, lb, V * 4) == 0, "copied q8 session diverged from its original");
        CHECK(ib_session_copy(qf, qa, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "KV types"),
              "q8 -> f16 copy: %s", err.msg);
        ib_session_free(qa), ib_session_free(qd), ib_session_free(qf);
    }

    /* an item may ask for ib_argmax of its logits, with the logits or without them */
    {
        ib_session *s1, *s2;
        ib_session_create(m, &(ib_session_opts){.max_context = 40}, &s1, &err);
        ib_session_create(m, &(ib_session_opts){.max_context = 40}, &s2, &err);
        int32_t g1 = -1, g2 = -1;
        ib_step_item am[2] = {{.session = s1, .tokens = a, .n_tokens = 7, .logits = la, .argmax = &g1}, {.session = s2, .tokens = a, .n_tokens = 7, .logits = NULL, .argmax = &g2}};
        CHECK(ib_step(e, am, 2, &err) == IB_OK, "%s", err.msg);
        CHECK(g1 >= 0 && g1 == ib_argmax(la, V), "argmax with logits: %d, ib_argmax %d", g1, ib_argmax(la, V));
        CHECK(g2 == g1, "argmax without logits: %d, with: %d", g2, g1);
        ib_session_free(s1);
        ib_session_free(s2);
    }

    /* options: a session longer than the model; an ISA the CPU lacks; q8 on a float model */
    ib_session *sx;
    CHECK(ib_session_create(m, &(ib_session_opts){.max_context = 1 << 20}, &sx, &err) == IB_ERR_INVALID_ARG && !sx,
          "oversized session accepted");
    if (!ib_isa_supported(IB_ISA_AVX512)) {
        ib_engine *ex;
        CHECK(ib_engine_create(m, &(ib_engine_opts){.isa = IB_ISA_AVX512}, &ex, &err) == IB_ERR_UNSUPPORTED && !ex,
              "avx512 engine on a CPU without it");
    }
    if (!ib_isa_supported(IB_ISA_AMX)) {
        ib_engine *ex;
        CHECK(ib_engine_create(m, &(ib_engine_opts){.isa = IB_ISA_AMX}, &ex, &err) == IB_ERR_UNSUPPORTED && !ex &&
                  strstr(err.msg, "isa amx: not supported by this CPU or build"),
              "amx engine on a CPU without it: %s", err.msg);
    }
    {
        ib_engine *ex;
        CHECK(ib_engine_create(m, &(ib_engine_opts){.isa = (ib_isa)(IB_ISA_AMX + 1)}, &ex, &err) == IB_ERR_INVALID_ARG && !ex,
              "an isa past the last accepted");
    }

    /* ib_generate's results: each kept logits row is the one a lone session computes at that token,
     * its greedy argmax is the token, and the digest is 64-bit FNV-1a (offset basis 0xcbf29ce484222325,
     * prime 0x100000001b3) over the rows' float32 bytes in order, written out here from its definition */
    {
        ib_gen_request rq[2] = {{.prompt = a, .n_prompt = 9, .max_new_tokens = 0}, {.prompt = b, .n_prompt = 23, .max_new_tokens = 0}};
        ib_gen_opts go = {.ignore_eos = 1, .max_new_tokens = 6, .batch = 2, .keep_logits = 1, .sampling = ib_sampling_default()};
        ib_gen_result res[2];
        CHECK(ib_generate(e, rq, 2, &go, res, NULL, &err) == IB_OK, "%s", err.msg);
        for (int i = 0; i < 2; i++) {
            const int32_t *p = i ? b : a;
            int plen = i ? 23 : 9;
            CHECK(res[i].logits != NULL && res[i].n_tokens == 6, "prompt %d: %d tokens, logits %p", i, res[i].n_tokens,
                  (void *)res[i].logits);
            if (!res[i].logits || res[i].n_tokens != 6) continue;
            uint64_t h = 0xcbf29ce484222325ULL;
            const unsigned char *bytes = (const unsigned char *)res[i].logits;
            for (size_t k = 0; k < (size_t)6 * V * sizeof(float); k++) h = (h ^ bytes[k]) * 0x100000001b3ULL;
            CHECK(h == res[i].digest, "prompt %d: digest %016llx, FNV-1a of the rows %016llx", i,
                  (unsigned long long)res[i].digest, (unsigned long long)h);
            int32_t seq[40];
            memcpy(seq, p, plen * sizeof *seq);
            for (int t = 0; t < 6; t++) {
                const float *row = res[i].logits + (size_t)t * V;
                int best = 0;
                for (int v = 1; v < V; v++)
                    if (row[v] > row[best]) best = v;
                CHECK(res[i].tokens[t] == best, "prompt %d token %d: %d, argmax of its row %d", i, t, res[i].tokens[t], best);
                alone(e, seq, plen + t, plen + t, ra);
                CHECK(memcmp(ra, row, V * 4) == 0, "prompt %d token %d: kept row differs from a lone session's", i, t);
                seq[plen + t] = res[i].tokens[t];
            }
        }
        ib_gen_results_free(res, 2);
    }

    /* per-request limits: a request's own max_new_tokens wins over the options' (0 = the options'),
     * and its tokens are the first ones of the same request under the larger limit; a negative limit
     * is refused before any work */
    {
        ib_gen_request rq[3] = {{.prompt = a, .n_prompt = 9, .max_new_tokens = 2}, {.prompt = b, .n_prompt = 23, .max_new_tokens = 0}, {.prompt = a, .n_prompt = 9, .max_new_tokens = 5}};
        ib_gen_opts go = {.ignore_eos = 1, .max_new_tokens = 4, .batch = 2, .sampling = ib_sampling_default()};
        ib_gen_result res[3], full[1];
        CHECK(ib_generate(e, rq, 3, &go, res, NULL, &err) == IB_OK, "%s", err.msg);
        CHECK(res[0].n_tokens == 2 && res[1].n_tokens == 4 && res[2].n_tokens == 5, "limits 2/4/5 gave %d/%d/%d tokens",
              res[0].n_tokens, res[1].n_tokens, res[2].n_tokens);
        CHECK(memcmp(res[0].tokens, res[2].tokens, 2 * sizeof(int32_t)) == 0, "limit 2 is not a prefix of limit 5");
        ib_gen_request neg = {.prompt = a, .n_prompt = 9, .max_new_tokens = -1};
        CHECK(ib_generate(e, &neg, 1, &go, full, NULL, &err) == IB_ERR_INVALID_ARG, "a negative limit was accepted");
        ib_gen_results_free(res, 3);
    }

    /* a request with nothing to generate (limit 0) does no work and ends "length" with no tokens; the
     * stats count the others' prompt and generated tokens; a token outside the vocabulary is refused
     * before any work */
    {
        ib_gen_request rq[3] = {{.prompt = a, .n_prompt = 9, .max_new_tokens = 0}, {.prompt = b, .n_prompt = 23, .max_new_tokens = 3}, {.prompt = a, .n_prompt = 9, .max_new_tokens = 2}};
        ib_gen_opts go = {.ignore_eos = 1, .max_new_tokens = 0, .batch = 2, .prefill_chunk = 5, .sampling = ib_sampling_default()};
        ib_gen_result res[3];
        ib_gen_stats st = {0};
        CHECK(ib_generate(e, rq, 3, &go, res, &st, &err) == IB_OK, "%s", err.msg);
        CHECK(res[0].n_tokens == 0 && !strcmp(res[0].finish, "length") && res[0].digest == IB_DIGEST_INIT,
              "limit 0: %d tokens, %s", res[0].n_tokens, res[0].finish);
        CHECK(res[1].n_tokens == 3 && res[2].n_tokens == 2, "limits 3/2 gave %d/%d tokens", res[1].n_tokens,
              res[2].n_tokens);
        CHECK(st.prompt_tokens == 23 + 9 && st.generated_tokens == 5, "stats: %ld prompt, %ld generated tokens",
              st.prompt_tokens, st.generated_tokens);
        /* b's 23 prompt tokens take 5 steps in chunks of 5, the last drawing its first token, then 2
         * decode steps; a's prompt and its 2 tokens ride along in the first 3 */
        CHECK(st.steps == 7, "stats: %d steps", st.steps);
        ib_gen_results_free(res, 3);
        int32_t bad[3] = {1, V, 2};
        ib_gen_request rb[2] = {{.prompt = a, .n_prompt = 9, .max_new_tokens = 0}, {.prompt = bad, .n_prompt = 3, .max_new_tokens = 0}};
        go.max_new_tokens = 2;
        CHECK(ib_generate(e, rb, 2, &go, res, &st, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "vocabulary"),
              "a token outside the vocabulary: code %d, %s", err.code, err.msg);
    }

    /* more logits rows in one step than one lm_head product takes: each row as alone; the gemv-gemm
     * fault (products of several rows accumulate in another order) must break that */
    {
        ib_engine *eb;
        CHECK(ib_engine_create(m, &(ib_engine_opts){.threads = 2, .max_step_tokens = 2 * NS}, &eb, &err) == IB_OK,
              "%s", err.msg);
        int bad = many_logits_rows(eb);
        CHECK(bad == 0, "%d of %d sessions' logits or argmax in a step of %d logits rows differ from alone", bad, NS,
              NS);
        ib_fault_set(IB_FAULT_GEMV_GEMM);
        int fbad = many_logits_rows(eb);
        ib_fault_set(IB_FAULT_NONE);
        CHECK(fbad > NS / 2, "gemv-gemm fault: only %d of %d sessions differ in a step of many logits rows", fbad, NS);
        printf("a step of %d logits rows: %d sessions differ from alone, under gemv-gemm %d\n", NS, bad, fbad);
        ib_engine_free(eb);
    }

    /* every row's logits of a prompt (row_logits, more rows than one lm_head product takes) equal the
     * session fed one token a step; the row-order fault (odd rows' norms summed in another order) must
     * break that */
    {
        int bad = prompt_rows(e);
        CHECK(bad == 0, "prompt logits rows: %d of %d differ from one token a step", bad, NP);
        ib_fault_set(IB_FAULT_ROW_ORDER);
        int fbad = prompt_rows(e);
        ib_fault_set(IB_FAULT_NONE);
        CHECK(fbad >= NP / 4, "row-order fault: only %d of %d prompt logits rows differ", fbad, NP);
        printf("a prompt's %d logits rows: %d differ from one token a step, under row-order %d\n", NP, bad, fbad);
    }

    ib_session_free(sa);
    ib_session_free(sb);
    ib_session_free(sc);
    free(la), free(lb), free(ra), free(rb);
    ib_engine_free(e);
    ib_model_free(m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    TEST_MAIN_END("test_step");
}
