/*
 * moe.c — the numeric definition of Gemma 4's mixture-of-experts routing and combine (ops.h,
 * docs/gemma4.md "Mixture of experts"). Each row's routing and combine read that row alone. The CUDA
 * backend's moe_route_kernel runs ib_moe_route's operations with a warp per row.
 */
#include "core/fmath.h"
#include "ops/ops.h"

/* ib_moe_route (ops.h): top-k of the row's E logits (ties to the lowest id, NaN never taken), the
 * softmax over all E (exps of logit - max, their sum in the 16-lane order), renormalised over the
 * selected in rank order, times the per-expert scale. p [E] scratch. 0, or -1 when fewer than k of
 * the logits are numbers. */
int ib_moe_route(const float *logits, int E, int k, const float *expert_scale, float *p, int32_t *sel, float *w) {
    /* top-k on the logits: rank j takes the largest logit not yet taken, ties to the lowest id */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (taken || logits[e] != logits[e]) continue;
            if (best < 0 || logits[e] > logits[best]) best = e;
        }
        if (best < 0) return -1;   /* fewer than k numbers among the logits */
        sel[j] = best;
    }
    /* softmax over all E: the max (exact, any order), exps, their sum in the 16-lane order */
    float m = logits[sel[0]];
    for (int e = 0; e < E; e++) p[e] = logits[e] != logits[e] ? 0.0f : ib_expf_lane(logits[e] - m);
    float lane[16] = {0};
    int e = 0;
    for (; e + 16 <= E; e += 16)
        for (int j = 0; j < 16; j++) lane[j] = lane[j] + p[e + j];
    for (int j = 0; e + j < E; j++) lane[j] = lane[j] + p[e + j];
    for (int h = 8; h >= 1; h >>= 1)
        for (int j = 0; j < h; j++) lane[j] = lane[j] + lane[j + h];
    float s = lane[0];
    for (int i = 0; i < E; i++) p[i] = p[i] / s;
    /* renormalised over the selected, in rank order, then the per-expert scale */
    float t = 0.0f;
    for (int j = 0; j < k; j++) t = t + p[sel[j]];
    for (int j = 0; j < k; j++) w[j] = (p[sel[j]] / t) * expert_scale[sel[j]];
    return 0;
}

void ib_moe_combine(const float *y, const float *w, const int32_t *sel, int k, int D, float *out) {
    for (int d = 0; d < D; d++) out[d] = 0.0f;
    for (int j = 0; j < k; j++) {
        if (sel[j] < 0) continue;
        const float *yj = y + (size_t)j * D;
        for (int d = 0; d < D; d++) out[d] = out[d] + w[j] * yj[d];
    }
}

/* ib_moe_fault_capacity (ops.h): pairs counted per expert in the order of sel. */
void ib_moe_fault_capacity(int32_t *sel, int n, int E) {
    const int cap = (n + E - 1) / E;
    for (int e = 0; e < E; e++) {
        int kept = 0;
        for (int i = 0; i < n; i++)
            if (sel[i] == e && ++kept > cap) sel[i] = -1;
    }
}

/* ib_moe_loads (ops.h). */
void ib_moe_loads(const int32_t *sel, int n, int E, int *load) {
    for (int e = 0; e < E; e++) load[e] = 0;
    for (int i = 0; i < n; i++)
        if (sel[i] >= 0 && sel[i] < E) load[sel[i]]++;
}

/* ib_moe_fault_load_order (ops.h): a stable insertion sort of the ids by descending load. */
void ib_moe_fault_load_order(const int *load, int E, int *order) {
    for (int e = 0; e < E; e++) order[e] = e;
    for (int a = 1; a < E; a++)
        for (int x = a; x > 0 && load[order[x]] > load[order[x - 1]]; x--) {
            const int t = order[x];
            order[x] = order[x - 1];
            order[x - 1] = t;
        }
}
