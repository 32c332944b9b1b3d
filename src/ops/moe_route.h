/*
 * moe_route.h — ib_moe_route's definition (ops.h), as an inline function (IB_HD: callable from CUDA
 * device code too). moe.c's ib_moe_route is this function; the CUDA backend's moe_route_kernel runs its
 * operations spread over a block per row (gemma_kernels.cuh), checked against it.
 */
#ifndef IB_OPS_MOE_ROUTE_H
#define IB_OPS_MOE_ROUTE_H
#include <stdint.h>

#include "core/fmath.h"
#include "core/hd.h"

/* ib_moe_route (ops.h): top-k of the row's E logits (ties to the lowest id, NaN never taken), the
 * softmax over all E (exps of logit - max, their sum in the 16-lane order), renormalised over the
 * selected in rank order, times the per-expert scale. p [E] scratch. 0, or -1 when fewer than k of
 * the logits are numbers. */
IB_HD static inline int ib_moe_route_def(const float *logits, int E, int k, const float *expert_scale, float *p,
                                         int32_t *sel, float *w) {
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

#endif
