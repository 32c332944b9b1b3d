/*
 * test_invariance.c — the contract, bitwise, on the tiny synthetic model: a prompt's generated tokens
 * and the digest of the logits that chose them do not change with the batch size, the thread count,
 * the order of the prompts, the prefill chunking, the ISA, or the sampling mode's neighbours. Each
 * check is then repeated under a deliberate fault that must make it fail.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "isobatch.h"
#include "model/mkmodel.h"

#define N_PROMPTS 13
#define GEN 12

static int32_t *prompt_ids[N_PROMPTS];
static int prompt_len[N_PROMPTS];

typedef struct run_cfg {
    int batch, threads, chunk;
    ib_isa isa;
    ib_act act;
    int sampled;    /* 0 greedy, 1 seeded sampling */
    int shuffled;   /* feed the prompts in a permuted order */
    ib_kv_dtype kv_dtype;   /* the sessions' KV element type */
} run_cfg;

typedef struct outcome {
    uint64_t digest[N_PROMPTS];
    int32_t tokens[N_PROMPTS][GEN];
    int ok;
} outcome;

/* A fixed permutation of the prompts (reversed, then odd/even interleaved). */
static int perm(int i) { return (i * 5 + 3) % N_PROMPTS; }

/* Generate for every prompt under cfg; results indexed by the original prompt index. */
static outcome run(const ib_model *m, run_cfg c) {
    outcome o;
    memset(&o, 0, sizeof o);
    ib_engine_opts eo = {.threads = c.threads, .isa = c.isa, .act = c.act, .max_step_tokens = 2048};
    ib_engine *e;
    ib_error err;
    if (ib_engine_create(m, &eo, &e, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return o;
    }
    ib_gen_request rq[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        int src = c.shuffled ? perm(i) : i;
        rq[i] = (ib_gen_request){.prompt = prompt_ids[src], .n_prompt = prompt_len[src]};
    }
    ib_gen_opts go = {.ignore_eos = 1, .max_new_tokens = GEN, .batch = c.batch, .prefill_chunk = c.chunk, .sampling = ib_sampling_default(),
                      .kv_dtype = c.kv_dtype};
    if (c.sampled) {
        go.sampling.temperature = 0.9f;
        go.sampling.top_k = 50;
        go.sampling.top_p = 0.95f;
        go.sampling.min_p = 0.01f;
        go.sampling.repeat_penalty = 1.1f;
        go.sampling.seed = 1234;
    }
    ib_gen_result res[N_PROMPTS];
    if (ib_generate(e, rq, N_PROMPTS, &go, res, NULL, &err)) {
        fprintf(stderr, "generate: %s\n", err.msg);
        ib_engine_free(e);
        return o;
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        int dst = c.shuffled ? perm(i) : i;
        o.digest[dst] = res[i].digest;
        for (int t = 0; t < GEN && t < res[i].n_tokens; t++) o.tokens[dst][t] = res[i].tokens[t];
    }
    ib_gen_results_free(res, N_PROMPTS);
    ib_engine_free(e);
    o.ok = 1;
    return o;
}

/* Number of prompts whose digest or tokens differ between a and b (N_PROMPTS+1 when a run failed). */
static int differing(const outcome *a, const outcome *b) {
    if (!a->ok || !b->ok) return N_PROMPTS + 1;
    int d = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        d += a->digest[i] != b->digest[i] || memcmp(a->tokens[i], b->tokens[i], sizeof a->tokens[i]) != 0;
    return d;
}

static ib_kv_dtype g_kv_dtype; /* every run of the current section keeps half-precision KV */

static run_cfg base_cfg(ib_act act, int sampled) {
    return (run_cfg){.batch = 1, .threads = 1, .chunk = 0, .isa = IB_ISA_SCALAR, .act = act, .sampled = sampled,
                     .kv_dtype = g_kv_dtype};
}

/* All clean variations against the serialized scalar baseline. */
static void check_clean(const ib_model *m, ib_act act, int sampled, const char *label) {
    outcome base = run(m, base_cfg(act, sampled));
    CHECK(base.ok, "%s: baseline run failed", label);
    static const int batches[] = {2, 3, 5, 8, 16};
    for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
        run_cfg c = base_cfg(act, sampled);
        c.batch = batches[i];
        c.isa = IB_ISA_AUTO;
        outcome o = run(m, c);
        CHECK(differing(&base, &o) == 0, "%s: batch %d changes %d prompts", label, c.batch, differing(&base, &o));
    }
    for (int t = 1; t <= 4; t++) {
        run_cfg c = base_cfg(act, sampled);
        c.threads = t;
        c.batch = 5;
        outcome o = run(m, c);
        CHECK(differing(&base, &o) == 0, "%s: threads %d changes %d prompts", label, t, differing(&base, &o));
    }
    {
        run_cfg c = base_cfg(act, sampled);
        c.shuffled = 1;
        c.batch = 8;
        outcome o = run(m, c);
        CHECK(differing(&base, &o) == 0, "%s: shuffled order changes %d prompts", label, differing(&base, &o));
    }
    static const int chunks[] = {1, 7, 64, 0};
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
        for (int b = 1; b <= 3; b += 2) {
            run_cfg c = base_cfg(act, sampled);
            c.chunk = chunks[i];
            c.batch = b;
            outcome o = run(m, c);
            CHECK(differing(&base, &o) == 0, "%s: prefill chunk %d, batch %d changes %d prompts", label, c.chunk, b,
                  differing(&base, &o));
        }
    }
    /* the ISAs of this build's architecture */
#if defined(__aarch64__)
    static const ib_isa isas[] = {IB_ISA_SCALAR, IB_ISA_NEON};
#else
    static const ib_isa isas[] = {IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512, IB_ISA_AMX};
#endif
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!ib_isa_supported(isas[i])) {
            printf("skip: %s: isa %s not supported by this CPU\n", label, ib_isa_name(isas[i]));
            continue;
        }
        run_cfg c = base_cfg(act, sampled);
        c.isa = isas[i];
        c.batch = 4;
        c.threads = 2;
        outcome o = run(m, c);
        CHECK(differing(&base, &o) == 0, "%s: isa %s changes %d prompts", label, ib_isa_name(c.isa),
              differing(&base, &o));
    }
}

/* The check "variation c gives the serialized scalar baseline's answers" must fail under fault f:
 * both runs under the fault, as they would be with a real bug (a fault that merely changed every
 * answer the same way would pass such a check and prove nothing). When base_unaffected is set, the
 * fault must also leave the baseline itself bitwise unchanged: it breaks only what the check varies.
 * Returns the number of differing prompts. */
static int check_fault(const ib_model *m, ib_fault f, run_cfg c, int base_unaffected) {
    run_cfg b = base_cfg(c.act, c.sampled);
    outcome clean = base_unaffected ? run(m, b) : (outcome){0};
    ib_fault_set(f);
    outcome base = run(m, b);
    outcome o = run(m, c);
    ib_fault_set(IB_FAULT_NONE);
    int d = differing(&base, &o);
    CHECK(d > 0 && d <= N_PROMPTS, "fault %s was not caught (batch %d threads %d chunk %d isa %s shuffled %d sampled %d)",
          ib_fault_name(f), c.batch, c.threads, c.chunk, ib_isa_name(c.isa), c.shuffled, c.sampled);
    if (base_unaffected)
        CHECK(differing(&clean, &base) == 0, "fault %s changed the serialized scalar baseline (%d prompts)",
              ib_fault_name(f), differing(&clean, &base));
    printf("fault %-20s %s (%s, batch %2d threads %d chunk %2d isa %-6s%s%s): %d of %d prompts differ\n",
           ib_fault_name(f), d > 0 ? "caught" : "NOT caught", c.act == IB_ACT_F32 ? "f32" : "q8", c.batch, c.threads, c.chunk, ib_isa_name(c.isa),
           c.shuffled ? " shuffled" : "", c.sampled ? " sampled" : "", d, N_PROMPTS);
    return d;
}

int main(void) {
    char dir[] = "/tmp/ib_inv_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    ib_error err;
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 11, .bits = 4, .group = 32, .tied = 1};
    if (ib_mkmodel(dir, &mo, &err)) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return 1;
    }
    ib_model *m;
    if (ib_model_load(dir, NULL, &m, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    /* prompts of different lengths, 1 to ~100 tokens, from a fixed generator */
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < N_PROMPTS; i++) {
        prompt_len[i] = 1 + (i * 37) % 97;
        prompt_ids[i] = malloc(prompt_len[i] * sizeof(int32_t));
        for (int t = 0; t < prompt_len[i]; t++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            prompt_ids[i][t] = (int32_t)(x % 256);
        }
    }
    check_clean(m, IB_ACT_Q8, 0, "q8 greedy");
    check_clean(m, IB_ACT_Q8, 1, "q8 sampled");
    check_clean(m, IB_ACT_F32, 0, "f32 greedy");
    check_clean(m, IB_ACT_F32, 1, "f32 sampled");

    /* every check above must be able to fail: each kind of variation (batch size, threads, order,
     * prefill chunking, ISA, sampling) against the serialized baseline, with a fault that breaks it */
    run_cfg b8 = base_cfg(IB_ACT_Q8, 0);
    b8.batch = 8;
    b8.isa = IB_ISA_AUTO;
    check_fault(m, IB_FAULT_ROPE_SCALAR_OFFSET, b8, 1);
    check_fault(m, IB_FAULT_ROPE_SKIP_ROWS, b8, 1);
    check_fault(m, IB_FAULT_GEMV_GEMM, b8, 0);       /* the baseline's whole-prompt prefill has > 1 row */
    check_fault(m, IB_FAULT_SPLIT_KV_BY_BATCH, b8, 1);
    run_cfg thr = base_cfg(IB_ACT_Q8, 0);
    thr.threads = 3;
    check_fault(m, IB_FAULT_SPLIT_K_THREADS, thr, 1);
    run_cfg shuf = base_cfg(IB_ACT_Q8, 0);
    shuf.batch = 8;
    shuf.shuffled = 1;
    check_fault(m, IB_FAULT_ROW_ORDER, shuf, 0);      /* odd rows of a whole-prompt prefill too */
    {
        /* the order alone, at one batch size, changes answers under row-order */
        run_cfg plain = shuf;
        plain.shuffled = 0;
        ib_fault_set(IB_FAULT_ROW_ORDER);
        outcome a = run(m, plain), z = run(m, shuf);
        ib_fault_set(IB_FAULT_NONE);
        int d = differing(&a, &z);
        CHECK(d > 0 && d <= N_PROMPTS, "row-order: shuffling at batch 8 changes nothing (%d)", d);
    }
    /* chunked against whole-prompt prefill, serialized: 1-row products (chunk 1) against the
     * multi-row whole prompt, in both modes; token by token attention takes one row at a time, the
     * whole prompt's rows take key blocks in tiles (the attn-tile-range fault breaks the tiles) */
    for (int a = 0; a < 2; a++) {
        run_cfg chunk = base_cfg(a ? IB_ACT_F32 : IB_ACT_Q8, 0);
        chunk.chunk = 1;
        check_fault(m, IB_FAULT_GEMV_GEMM, chunk, 0);
        check_fault(m, IB_FAULT_ATTN_TILE_RANGE, chunk, 0);
    }
    run_cfg samp = base_cfg(IB_ACT_Q8, 1);
    samp.batch = 8;
    check_fault(m, IB_FAULT_SAMPLE_BY_ROW, samp, 0);  /* one process-wide stream: runs differ too */
#if defined(__aarch64__)
    static const ib_isa vec_isas[] = {IB_ISA_NEON};
#else
    static const ib_isa vec_isas[] = {IB_ISA_AVX2, IB_ISA_AVX512, IB_ISA_AMX};
#endif
    int n_vec = 0;
    for (size_t i = 0; i < sizeof vec_isas / sizeof vec_isas[0]; i++) {
        if (!ib_isa_supported(vec_isas[i])) continue;
        /* both modes (in q8 the products' per-group dot products are exact integers; the fault
         * reaches q8 runs through the float kernels: attention, the products' group sums) */
        for (int a = 0; a < 2; a++) {
            run_cfg isa = base_cfg(a ? IB_ACT_F32 : IB_ACT_Q8, 0);
            isa.isa = vec_isas[i];
            check_fault(m, IB_FAULT_ISA_FMA, isa, 1);
        }
        n_vec++;
    }
    if (!n_vec) printf("skip: isa-fma fault needs a vector ISA\n");

    /* half-precision KV: the same contract; it changes the answers (the option is in effect), and a
     * batch-dependent attention split still breaks it */
    {
        outcome f32kv = run(m, base_cfg(IB_ACT_F32, 0));
        g_kv_dtype = IB_KV_F16;
        outcome f16kv = run(m, base_cfg(IB_ACT_F32, 0));
        CHECK(differing(&f32kv, &f16kv) > 0, "f16 KV gives the same digests as f32 KV");
        check_clean(m, IB_ACT_F32, 0, "f32 greedy, f16 KV");
        check_clean(m, IB_ACT_Q8, 1, "q8 sampled, f16 KV");
        run_cfg h8 = base_cfg(IB_ACT_Q8, 0);
        h8.batch = 8;
        h8.isa = IB_ISA_AUTO;
        check_fault(m, IB_FAULT_SPLIT_KV_BY_BATCH, h8, 1);
        check_fault(m, IB_FAULT_ROPE_SKIP_ROWS, h8, 1);
        run_cfg hc = base_cfg(IB_ACT_Q8, 0);
        hc.chunk = 3;   /* tiles of 3 rows against the whole prompt's */
        check_fault(m, IB_FAULT_ATTN_TILE_RANGE, hc, 0);

        /* q8 KV: likewise, and its encoding must not depend on the step (kvq8-step-scale: steps of
         * several rows encode with another code range) */
        g_kv_dtype = IB_KV_Q8;
        outcome q8kv = run(m, base_cfg(IB_ACT_F32, 0));
        CHECK(differing(&f16kv, &q8kv) > 0 && differing(&f32kv, &q8kv) > 0,
              "q8 KV gives the digests of f16 KV (%d differ) or f32 KV (%d)", differing(&f16kv, &q8kv),
              differing(&f32kv, &q8kv));
        check_clean(m, IB_ACT_F32, 0, "f32 greedy, q8 KV");
        check_clean(m, IB_ACT_Q8, 1, "q8 sampled, q8 KV");
        check_fault(m, IB_FAULT_KVQ8_STEP_SCALE, h8, 0);   /* the baseline's whole-prompt prefill has > 1 row */
        check_fault(m, IB_FAULT_SPLIT_KV_BY_BATCH, h8, 1);
        check_fault(m, IB_FAULT_ATTN_TILE_RANGE, hc, 0);
        g_kv_dtype = IB_KV_F32;
    }

    for (int i = 0; i < N_PROMPTS; i++) free(prompt_ids[i]);
    ib_model_free(m);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    TEST_MAIN_END("test_invariance");
}
