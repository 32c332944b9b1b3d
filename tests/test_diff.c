/*
 * test_diff.c — layer capture (ib_engine_set_capture) and the batched-vs-alone diff
 * (src/diag/capture.c) on tiny synthetic models (Qwen3 with q/k norm, Llama without):
 *   - the hook sees every point of every layer for every row, in forward order, and does not change
 *     the logits;
 *   - clean runs: no divergence at any step;
 *   - each injected fault: the first divergence is in the layer and sub-op the fault breaks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "diag/diag.h"
#include "isobatch.h"
#include "model/mkmodel.h"

#define NS 4
/* prompt lengths: the first is odd, so the second session's rows change parity when batched */
static const int lens[NS] = {23, 40, 57, 18};
static int32_t *prompts[NS];

static int point_of(const char *name) {
    for (int p = 0; p < IB_DIFF_POINTS; p++)
        if (!strcmp(ib_diff_point_name(p), name)) return p;
    return -1;
}

typedef struct hook_log {
    int calls, order_ok, last_layer, last_point, rows_seen[IB_DIFF_POINTS];
} hook_log;

/* Records calls and checks that points arrive in forward order. */
static void hook(void *ctx, int layer, const char *point, int row, const float *data, int n) {
    hook_log *h = ctx;
    int p = point_of(point);
    h->calls++;
    if (p < 0) {
        h->order_ok = 0;
        return;
    }
    if (layer < h->last_layer || (layer == h->last_layer && p < h->last_point)) h->order_ok = 0;
    h->last_layer = layer;
    h->last_point = p;
    if (layer == 0 || p >= IB_DIFF_LAYER_POINTS) h->rows_seen[p]++;
}

static void check_hook(const ib_model *m, int qk_norm) {
    const ib_model_info *info = ib_model_get_info(m);
    ib_engine *e, *plain;
    ib_session *s1, *s2, *t1, *t2;
    ib_error err;
    ib_engine_opts eo = {.threads = 2};
    if (ib_engine_create(m, &eo, &e, &err) || ib_engine_create(m, &eo, &plain, &err) ||
        ib_session_create(m, NULL, &s1, &err) || ib_session_create(m, NULL, &s2, &err) ||
        ib_session_create(m, NULL, &t1, &err) || ib_session_create(m, NULL, &t2, &err)) {
        CHECK(0, "setup: %s", err.msg);
        return;
    }
    int V = info->vocab_size;
    float *a = malloc(2 * V * sizeof(float)), *b = malloc(2 * V * sizeof(float));
    hook_log h = {.order_ok = 1};
    ib_engine_set_capture(e, hook, &h);
    ib_step_item it[2] = {{.session = s1, .tokens = prompts[0], .n_tokens = 5, .logits = a, .argmax = NULL}, {.session = s2, .tokens = prompts[1], .n_tokens = 3, .logits = a + V, .argmax = NULL}};
    ib_step_item pt[2] = {{.session = t1, .tokens = prompts[0], .n_tokens = 5, .logits = b, .argmax = NULL}, {.session = t2, .tokens = prompts[1], .n_tokens = 3, .logits = b + V, .argmax = NULL}};
    CHECK(ib_step(e, it, 2, &err) == IB_OK, "step: %s", err.msg);
    CHECK(ib_step(plain, pt, 2, &err) == IB_OK, "step: %s", err.msg);
    /* Qwen3 / Llama layers lack Gemma 4's six points (post-norms, the MoE block's) */
    int per_layer = (qk_norm ? IB_DIFF_LAYER_POINTS : IB_DIFF_LAYER_POINTS - 2) - 6;
    CHECK_EQ_INT(h.calls, info->n_layers * per_layer * 8 + 2 * 2);
    CHECK(h.order_ok, "capture points out of forward order");
    CHECK_EQ_INT(h.rows_seen[point_of("q")], 8);
    CHECK_EQ_INT(h.rows_seen[point_of("q_norm")], qk_norm ? 8 : 0);
    CHECK_EQ_INT(h.rows_seen[point_of("logits")], 2);
    CHECK(memcmp(a, b, 2 * V * sizeof(float)) == 0, "capture changed the logits");
    /* off again: no more calls */
    ib_engine_set_capture(e, NULL, NULL);
    int before = h.calls;
    it[0].tokens = prompts[0] + 5;
    it[0].n_tokens = 1;
    it[1].tokens = prompts[1] + 3;
    it[1].n_tokens = 1;
    CHECK(ib_step(e, it, 2, &err) == IB_OK, "step: %s", err.msg);
    CHECK_EQ_INT(h.calls, before);
    free(a);
    free(b);
    ib_session_free(s1);
    ib_session_free(s2);
    ib_session_free(t1);
    ib_session_free(t2);
    ib_engine_free(e);
    ib_engine_free(plain);
}

/* Run the diff (steps 0..1) under fault f. */
static ib_diff_result run(const ib_model *m, ib_fault f, int batch) {
    ib_diff_result r;
    ib_diff_opts o = {.step = 1, .batch = batch, .threads = 2};
    ib_error err;
    ib_fault_set(f);
    ib_status rc = ib_diff_run(m, (const int32_t *const *)prompts, lens, NS, &o, &r, &err);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(rc == IB_OK, "diff under %s: %s", ib_fault_name(f), err.msg);
    if (rc) memset(&r, 0, sizeof r);
    return r;
}

/* Expect the first divergence of step `step` at (layer, point name); layer -1 = none. */
static void expect_first(const ib_diff_result *r, const char *what, int step, int layer, const char *point) {
    if (!r->first) return;
    const ib_diff_first *f = &r->first[step];
    if (layer < 0) {
        CHECK(f->layer < 0, "%s: step %d diverged at layer %d %s", what, step, f->layer, ib_diff_point_name(f->point));
        return;
    }
    CHECK(f->layer == layer && !strcmp(ib_diff_point_name(f->point), point),
          "%s: step %d: first divergence layer %d %s, expected layer %d %s", what, step, f->layer,
          f->layer >= 0 ? ib_diff_point_name(f->point) : "-", layer, point);
}

static void check_model(const ib_model *m, const char *name) {
    const ib_model_info *info = ib_model_get_info(m);
    int L = info->n_layers, qk = strcmp(info->arch, "llama") != 0;
    check_hook(m, qk);

    /* bad input: no prompts, an empty prompt, more steps than the context holds */
    {
        ib_diff_result r0;
        ib_diff_opts o = {.step = 1, .threads = 1};
        ib_error err;
        int zero[1] = {0};
        CHECK(ib_diff_run(m, (const int32_t *const *)prompts, lens, 0, &o, &r0, &err) == IB_ERR_INVALID_ARG, "no prompts");
        CHECK(ib_diff_run(m, (const int32_t *const *)prompts, zero, 1, &o, &r0, &err) == IB_ERR_INVALID_ARG, "empty prompt");
        o.step = info->max_context;
        CHECK(ib_diff_run(m, (const int32_t *const *)prompts, lens, 1, &o, &r0, &err) == IB_ERR_CONTEXT, "context");
        CHECK(r0.first == NULL && r0.maxdiff == NULL, "failed diff left results");
    }

    ib_diff_result r = run(m, IB_FAULT_NONE, 0);
    CHECK(r.first_step == -1, "%s clean: diverged at step %d", name, r.first_step);
    for (int i = 0; r.logit_diff && i < 2 * NS; i++) CHECK(r.logit_diff[i] == 0, "%s clean: logits differ", name);
    if (r.maxdiff) {
        /* the table covers every existing point with 0, and marks absent ones */
        int qn = point_of("q_norm"), ln = point_of("logits"), q = point_of("q");
        CHECK(r.maxdiff[((size_t)0 * IB_DIFF_POINTS + qn) * NS] == (qk ? 0.0 : -1.0), "%s: q_norm presence", name);
        CHECK(r.maxdiff[((size_t)L * IB_DIFF_POINTS + ln) * NS] == 0.0, "%s: logits entry", name);
        CHECK(r.maxdiff[((size_t)L * IB_DIFF_POINTS + q) * NS] == -1.0, "%s: q at the final layer", name);
    }
    ib_diff_result_free(&r);
    r = run(m, IB_FAULT_NONE, 3); /* groups of 3 and 1 */
    CHECK(r.first_step == -1, "%s clean, batch 3: diverged at step %d", name, r.first_step);
    ib_diff_result_free(&r);

    /* rope faults: prefill starts every session at position 0 (no effect); the first decode step
     * rotates q wrongly in layer 0 for sessions >= 1 */
    r = run(m, IB_FAULT_ROPE_SCALAR_OFFSET, 0);
    expect_first(&r, "rope-scalar-offset", 0, -1, NULL);
    expect_first(&r, "rope-scalar-offset", 1, 0, "q");
    CHECK(r.logit_diff && r.logit_diff[NS + 0] == 0 && r.logit_diff[NS + 1] > 0, "rope-scalar-offset: session 0 is exact, 1 is not");
    ib_diff_result_free(&r);
    r = run(m, IB_FAULT_ROPE_SKIP_ROWS, 0);
    expect_first(&r, "rope-skip-rows", 0, -1, NULL);
    expect_first(&r, "rope-skip-rows", 1, 0, "q");
    ib_diff_result_free(&r);
    /* gemv-gemm: at prefill every product already has > 1 row alone, except the lm_head (one row per
     * session alone, four batched); at decode the first product, q_proj of layer 0 */
    r = run(m, IB_FAULT_GEMV_GEMM, 0);
    expect_first(&r, "gemv-gemm", 0, L, "logits");
    expect_first(&r, "gemv-gemm", 1, 0, "q_proj");
    CHECK(r.first_step == 0, "gemv-gemm: first step %d", r.first_step);
    ib_diff_result_free(&r);
    /* split-kv-by-batch: every prompt is longer than 16 keys: attention of layer 0 at prefill */
    r = run(m, IB_FAULT_SPLIT_KV_BY_BATCH, 0);
    expect_first(&r, "split-kv-by-batch", 0, 0, "attn_out");
    expect_first(&r, "split-kv-by-batch", 1, 0, "attn_out");
    ib_diff_result_free(&r);
    /* row-order: session 1's rows start at row 23 batched (odd), at row 0 alone: layer 0's input norm */
    r = run(m, IB_FAULT_ROW_ORDER, 0);
    expect_first(&r, "row-order", 0, 0, "attn_norm");
    expect_first(&r, "row-order", 1, 0, "attn_norm");
    ib_diff_result_free(&r);
    /* faults the batch composition cannot show: diff compares batch composition only */
    r = run(m, IB_FAULT_SAMPLE_BY_ROW, 0);
    CHECK(r.first_step == -1, "shared-rng: diff uses greedy choices, yet diverged");
    ib_diff_result_free(&r);
}

/* Make a tiny model directory, load it. */
static ib_model *make(char *dir, const char *arch) {
    ib_error err;
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 21, .bits = 4, .group = 32, .tied = 1, .arch = arch};
    ib_model *m = NULL;
    if (!mkdtemp(dir) || ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
        CHECK(0, "model %s: %s", arch ? arch : "qwen3", err.msg);
        return NULL;
    }
    return m;
}

static void rm_dir(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < NS; i++) {
        prompts[i] = malloc((size_t)lens[i] * sizeof(int32_t));
        for (int t = 0; t < lens[i]; t++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            prompts[i][t] = (int32_t)(x % 256);
        }
    }
    char d1[] = "/tmp/ib_diff_XXXXXX", d2[] = "/tmp/ib_diff_XXXXXX";
    ib_model *m = make(d1, NULL);
    if (m) check_model(m, "qwen3");
    ib_model_free(m);
    rm_dir(d1);
    m = make(d2, "llama");
    if (m) check_model(m, "llama");
    ib_model_free(m);
    rm_dir(d2);

    for (int i = 0; i < NS; i++) free(prompts[i]);
    TEST_MAIN_END("test_diff");
}
