/*
 * test_reference.c — the float64 reference forward pass (ib_reference_logits) and the accuracy metrics
 * of `isobatch accuracy`, on tiny synthetic models (4-bit Qwen3, float32 Qwen3, 4-bit untied Llama):
 * the engine's f32 path agrees with the reference to float rounding (top-1 100%, relative L2 < 1e-5,
 * mean KL < 1e-9); q8 is close but measurably lossy; the metrics flag a reference of a different
 * sequence; the reference is causal (a prefix gives the same rows bitwise); the metrics on a
 * hand-worked example; bad inputs fail with a message naming the problem; the float32-storage pass
 * (floats everywhere the engine stores one, double arithmetic) on Qwen3 and Gemma 4 MoE.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "diag/diag.h"
#include "isobatch.h"
#include "model/mkmodel.h"

#define T 48

/* The model mo written to dir and loaded; NULL (a failed check) when it could not be. */
static ib_model *make_model(const char *dir, const ib_mkmodel_opts *mo, const char *name) {
    ib_error err;
    ib_model *m = NULL;
    if (ib_mkmodel(dir, mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return NULL;
    }
    return m;
}

/* One model: engine f32 (and q8 when quantized) vs the reference, and the checks that must fail. */
static void check_model(const char *dir, const ib_mkmodel_opts *mo, const char *name) {
    ib_error err;
    ib_model *m = make_model(dir, mo, name);
    if (!m) return;
    const int V = ib_model_get_info(m)->vocab_size;
    const int quant = ib_model_get_info(m)->quant_bits;
    int32_t tok[T], other[T];
    for (int i = 0; i < T; i++) tok[i] = other[i] = (i * 37 + 11) % 256;
    other[0] = (tok[0] + 101) % 256;
    double *ref = malloc((size_t)T * V * sizeof *ref), *ref2 = malloc((size_t)T * V * sizeof *ref2);
    double *pre = malloc((size_t)T * V * sizeof *pre);
    CHECK(ib_reference_logits(m, tok, T, ref, &err) == IB_OK, "%s: reference: %s", name, err.msg);
    CHECK(ib_reference_logits(m, other, T, ref2, &err) == IB_OK, "%s: reference (other): %s", name, err.msg);

    /* causal: the reference of the first 17 tokens equals the first 17 rows, bitwise */
    CHECK(ib_reference_logits(m, tok, 17, pre, &err) == IB_OK, "%s: reference prefix: %s", name, err.msg);
    CHECK(memcmp(pre, ref, (size_t)17 * V * sizeof *pre) == 0, "%s: a prefix's reference rows differ", name);

    /* f32 activations: float rounding only */
    ib_accuracy a;
    ib_engine_opts f32 = {.threads = 2, .act = IB_ACT_F32};
    CHECK(ib_accuracy_run(m, &f32, IB_KV_F32, tok, T, ref, &a, &err) == IB_OK, "%s: f32: %s", name, err.msg);
    CHECK_EQ_INT(a.tokens, T);
    CHECK(a.top1_agree == T && a.top1_fraction == 1.0, "%s: f32 top-1 %d/%d", name, a.top1_agree, T);
    CHECK(a.rel_l2 < 1e-5, "%s: f32 relative L2 %g", name, a.rel_l2);
    CHECK(a.kl_mean < 1e-9 && a.kl_max < 1e-8, "%s: f32 KL mean %g max %g", name, a.kl_mean, a.kl_max);
    CHECK(a.max_abs_diff < 1e-4, "%s: f32 max |dlogit| %g", name, a.max_abs_diff);
    printf("%s f32: top-1 %d/%d, KL mean %.3g max %.3g, max |d| %.3g, rel L2 %.3g\n", name, a.top1_agree, a.tokens,
           a.kl_mean, a.kl_max, a.max_abs_diff, a.rel_l2);

    /* the metric can fail: the engine on tok against the reference of a sequence that differs at
     * position 0 (which every later position attends to) */
    ib_accuracy w;
    CHECK(ib_accuracy_run(m, &f32, IB_KV_F32, tok, T, ref2, &w, &err) == IB_OK, "%s: f32 vs other: %s", name, err.msg);
    CHECK(w.rel_l2 > 1e-2, "%s: the reference of another sequence not flagged: relative L2 %g", name, w.rel_l2);
    CHECK(w.kl_max > 1e-4, "%s: the reference of another sequence not flagged: KL max %g", name, w.kl_max);
    printf("%s f32 vs another sequence's reference: rel L2 %.3g, KL max %.3g, top-1 %d/%d\n", name, w.rel_l2,
           w.kl_max, w.top1_agree, w.tokens);

    /* q8 activations: lossy but close (quantized weights only; a float model refuses q8) */
    ib_engine_opts q8 = {.threads = 2, .act = IB_ACT_Q8};
    if (quant) {
        CHECK(ib_accuracy_run(m, &q8, IB_KV_F32, tok, T, ref, &a, &err) == IB_OK, "%s: q8: %s", name, err.msg);
        CHECK(a.kl_mean > 1e-9 && a.kl_mean < 1e-2, "%s: q8 KL mean %g", name, a.kl_mean);
        CHECK(a.rel_l2 > 1e-5 && a.rel_l2 < 0.1, "%s: q8 relative L2 %g", name, a.rel_l2);
        CHECK(a.top1_fraction >= 0.9, "%s: q8 top-1 %d/%d", name, a.top1_agree, a.tokens);
        printf("%s q8:  top-1 %d/%d, KL mean %.3g max %.3g, max |d| %.3g, rel L2 %.3g\n", name, a.top1_agree, a.tokens,
               a.kl_mean, a.kl_max, a.max_abs_diff, a.rel_l2);
    } else {
        CHECK(ib_accuracy_run(m, &q8, IB_KV_F32, tok, T, ref, &a, &err) == IB_ERR_UNSUPPORTED && strstr(err.msg, "not quantized"),
              "%s: q8 on a float model: %s", name, err.msg);
        CHECK(a.tokens == 0, "%s: a failed run left %d tokens", name, a.tokens);
    }

    /* bad input: nothing written, a message naming the problem */
    pre[0] = 12345.0;
    CHECK(ib_reference_logits(m, tok, 0, pre, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "0 tokens"),
          "%s: T = 0: %s", name, err.msg);
    int32_t bad[3] = {1, V, 2};
    CHECK(ib_reference_logits(m, bad, 3, pre, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "token 1") &&
              strstr(err.msg, "outside the vocabulary"),
          "%s: id = vocab: %s", name, err.msg);
    bad[1] = -1;
    CHECK(ib_reference_logits(m, bad, 3, pre, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "-1"),
          "%s: id -1: %s", name, err.msg);
    CHECK(ib_reference_logits(m, tok, 1 << 20, pre, &err) == IB_ERR_CONTEXT && strstr(err.msg, "max_position"),
          "%s: T past the context: %s", name, err.msg);
    CHECK(ib_reference_logits(m, NULL, 3, pre, &err) == IB_ERR_INVALID_ARG, "%s: NULL tokens accepted", name);
    CHECK(pre[0] == 12345.0, "%s: a failed call wrote logits", name);
    CHECK(ib_accuracy_run(m, &f32, IB_KV_F32, tok, 0, ref, &a, &err) == IB_ERR_INVALID_ARG, "%s: accuracy T = 0 accepted", name);

    free(ref);
    free(ref2);
    free(pre);
    ib_model_free(m);
}

/* The float32-storage pass (ib_reference_logits_stored): every logit a float (the products' outputs are
 * stored), close to the float64 pass but not equal to it, causal like it; an unknown storage refused
 * with nothing written. */
static void check_store(const char *dir, const ib_mkmodel_opts *mo, const char *name) {
    ib_error err;
    ib_model *m = make_model(dir, mo, name);
    if (!m) return;
    const int V = ib_model_get_info(m)->vocab_size;
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (i * 53 + 5) % 256;
    double *r64 = malloc((size_t)T * V * sizeof *r64), *r32 = malloc((size_t)T * V * sizeof *r32);
    double *pre = malloc((size_t)T * V * sizeof *pre);
    CHECK(ib_reference_logits(m, tok, T, r64, &err) == IB_OK, "%s: reference: %s", name, err.msg);
    CHECK(ib_reference_logits_stored(m, tok, T, IB_REF_STORE_F32, r32, &err) == IB_OK, "%s: f32 storage: %s", name,
          err.msg);
    size_t n = (size_t)T * V, not_float = 0;
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        not_float += (double)(float)r32[i] != r32[i];
        d2 += (r32[i] - r64[i]) * (r32[i] - r64[i]);
        r2 += r64[i] * r64[i];
    }
    const double rel = sqrt(d2 / r2);
    CHECK(not_float == 0, "%s: %zu logits of the float32-storage pass are not floats", name, not_float);
    CHECK(rel > 0 && rel < 1e-5, "%s: float32 storage against float64: relative L2 %g", name, rel);
    printf("%s: float32-storage reference against float64: relative L2 %.3g\n", name, rel);
    CHECK(ib_reference_logits_stored(m, tok, 19, IB_REF_STORE_F32, pre, &err) == IB_OK &&
              memcmp(pre, r32, (size_t)19 * V * sizeof *pre) == 0,
          "%s: a prefix's float32-storage rows differ", name);
    /* each part alone (accuracy --floor-parts): a pass of its own — every part the architecture stores
     * moves the logits off the float64 pass (its storage points are wired); the block and logits parts
     * only where the Gemma 4 pass has such storage points (the MoE model here: post-normed block outputs,
     * the soft-capped logits; the Qwen3 pass's logits are the lm_head product's output, the products
     * part), and there the logits part leaves every logit a float */
    const int gemma = ib_model_get_info(m)->n_experts > 0;   /* the Gemma 4 MoE model of main() */
    for (int i = 0; i < IB_REF_STORE_PARTS; i++) {
        const ib_ref_store part = (ib_ref_store)(1 << i);
        const char *pn = ib_ref_store_part_name(part);
        CHECK(pn != NULL, "%s: part %d has no name", name, i);
        if (ib_reference_logits_stored(m, tok, T, part, pre, &err) != IB_OK) {
            CHECK(0, "%s: part %s: %s", name, pn ? pn : "?", err.msg);
            continue;
        }
        size_t moved = 0, floats = 0;
        for (size_t k = 0; k < n; k++) moved += pre[k] != r64[k], floats += (double)(float)pre[k] == pre[k];
        const int expect_moved = (part != IB_REF_F32_BLOCK && part != IB_REF_F32_LOGITS) || gemma;
        CHECK(expect_moved ? moved > 0 : moved == 0, "%s: part %s alone moved %zu of %zu logits", name, pn ? pn : "?",
              moved, n);
        if (part == IB_REF_F32_LOGITS && gemma)
            CHECK(floats == n, "%s: the logits part alone: %zu of %zu logits are floats", name, floats, n);
    }
    CHECK(ib_ref_store_part_name(IB_REF_STORE_F32) == NULL && ib_ref_store_part_name(IB_REF_STORE_F64) == NULL,
          "%s: a mask of several parts or none has a part's name", name);
    /* every part but one: not the whole float32-storage pass (each part is its own storage points) */
    CHECK(ib_reference_logits_stored(m, tok, T, (ib_ref_store)(IB_REF_STORE_F32 & ~IB_REF_F32_QKV), pre, &err) == IB_OK &&
              memcmp(pre, r32, n * sizeof *pre) != 0,
          "%s: all parts but qkv gave the whole float32-storage pass", name);
    pre[0] = 12345.0;
    CHECK(ib_reference_logits_stored(m, tok, T, (ib_ref_store)(1 << IB_REF_STORE_PARTS), pre, &err) == IB_ERR_INVALID_ARG &&
              strstr(err.msg, "unknown storage"),
          "%s: a storage bit past the parts: %s", name, err.msg);
    CHECK(pre[0] == 12345.0, "%s: a failed call wrote logits", name);
    free(r64);
    free(r32);
    free(pre);
    ib_model_free(m);
}

/* The metrics on values worked by hand. */
static void check_metrics(void) {
    /* ref (1, 1): uniform. eng (1 + ln 3, 1): p = (3/4, 1/4).
     * KL(ref || eng) = 1/2 ln((1/2)/(3/4)) + 1/2 ln((1/2)/(1/4)) = 1/2 ln(4/3);
     * argmax: ref ties -> id 0, eng -> id 0 (agree); max |d| = ln 3; rel L2 = ln 3 / sqrt(2). */
    ib_accuracy a = {0};
    double ref[2] = {1, 1};
    float eng[2] = {(float)(1 + log(3.0)), 1};
    ib_accuracy_add(&a, ref, eng, 2);
    double d = (double)eng[0] - 1;
    CHECK(fabs(a.kl_mean - 0.5 * (log(0.5 / (1 / (1 + exp(-d)))) + log(0.5 / (1 / (1 + exp(d)))))) < 1e-13,
          "KL %.17g", a.kl_mean);
    CHECK(fabs(a.kl_mean - 0.5 * log(4.0 / 3.0)) < 1e-7, "KL %.17g vs 1/2 ln(4/3)", a.kl_mean);
    CHECK(a.top1_agree == 1 && a.tokens == 1, "top-1 %d/%d", a.top1_agree, a.tokens);
    CHECK(fabs(a.max_abs_diff - d) < 1e-15 && fabs(a.rel_l2 - d / sqrt(2.0)) < 1e-15, "max %g rel %g", a.max_abs_diff,
          a.rel_l2);
    /* second token: ref (0, 2, 2) ties -> id 1; eng (0, 2, 2.5) -> id 2: disagree. Identical logits
     * would give KL 0. */
    double r3[3] = {0, 2, 2};
    float e3[3] = {0, 2, 2.5f};
    ib_accuracy_add(&a, r3, e3, 3);
    CHECK(a.tokens == 2 && a.top1_agree == 1 && a.top1_fraction == 0.5, "top-1 %d/%d", a.top1_agree, a.tokens);
    CHECK(a.max_abs_diff == d, "max |d| %g (the first token's ln 3 stays the max)", a.max_abs_diff);
    CHECK(fabs(a.rel_l2 - sqrt((d * d + 0.25) / (2 + 8))) < 1e-15, "rel L2 %.17g", a.rel_l2);
    ib_accuracy z = {0};
    float e0[3] = {0, 2, 2};
    ib_accuracy_add(&z, r3, e0, 3);
    CHECK(z.kl_mean == 0 && z.rel_l2 == 0 && z.max_abs_diff == 0 && z.top1_agree == 1, "identical: KL %g rel %g",
          z.kl_mean, z.rel_l2);
}

int main(void) {
    char dir[] = "/tmp/ib_reference_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char sub[64];
    check_metrics();
    snprintf(sub, sizeof sub, "%s/q4", dir);
    check_model(sub, &(ib_mkmodel_opts){.preset = "tiny", .seed = 7, .bits = 4, .tied = 1}, "tiny qwen3 4-bit");
    snprintf(sub, sizeof sub, "%s/f32", dir);
    check_model(sub, &(ib_mkmodel_opts){.preset = "tiny", .seed = 8, .bits = 32, .tied = 1}, "tiny qwen3 f32");
    snprintf(sub, sizeof sub, "%s/llama", dir);
    check_model(sub, &(ib_mkmodel_opts){.preset = "tiny", .seed = 9, .bits = 4, .group = 32, .tied = 0, .arch = "llama"},
                "tiny llama 4-bit untied");
    snprintf(sub, sizeof sub, "%s/store_q", dir);
    check_store(sub, &(ib_mkmodel_opts){.preset = "tiny", .seed = 7, .bits = 4, .tied = 1}, "tiny qwen3 4-bit");
    snprintf(sub, sizeof sub, "%s/store_g", dir);
    check_store(sub, &(ib_mkmodel_opts){.preset = "gemma4-moe-tiny", .seed = 5, .bits = 4}, "gemma4-moe-tiny 4-bit");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    TEST_MAIN_END("test_reference");
}
