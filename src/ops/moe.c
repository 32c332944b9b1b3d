/*
 * moe.c — the numeric definition of Gemma 4's mixture-of-experts routing and combine (ops.h,
 * docs/gemma4.md "Mixture of experts"). Each row's routing and combine read that row alone.
 */
#include "core/fmath.h"
#include "ops/moe_route.h"
#include "ops/ops.h"

int ib_moe_route(const float *logits, int E, int k, const float *expert_scale, float *p, int32_t *sel, float *w) {
    return ib_moe_route_def(logits, E, k, expert_scale, p, sel, w);
}

void ib_moe_combine(const float *y, const float *w, const int32_t *sel, int k, int D, float *out) {
    for (int d = 0; d < D; d++) out[d] = 0.0f;
    for (int j = 0; j < k; j++) {
        if (sel[j] < 0) continue;
        const float *yj = y + (size_t)j * D;
        for (int d = 0; d < D; d++) out[d] = out[d] + w[j] * yj[d];
    }
}
