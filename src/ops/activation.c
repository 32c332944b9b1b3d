/*
 * activation.c — SwiGLU: silu(gate) * up; GeGLU: gelu_tanh(gate) * up; soft-capping; scaling.
 */
#include "core/fmath.h"
#include "ops/ops.h"

IB_VECTOR_CLONES void ib_swiglu(float *g, const float *u, int R, int F) {
    size_t n = (size_t)R * F;
    for (size_t i = 0; i < n; i++) {
        float x = g[i];
        float silu = x / (1.0f + ib_expf_lane(-x));
        g[i] = silu * u[i];
    }
}

IB_VECTOR_CLONES void ib_geglu(float *g, const float *u, int R, int F) {
    size_t n = (size_t)R * F;
    for (size_t i = 0; i < n; i++) {
        float x = g[i];
        float t = 1.5957691216057308f * (x + 0.044715f * ((x * x) * x));
        float gelu = x / (1.0f + ib_expf_lane(-t));
        g[i] = gelu * u[i];
    }
}

void ib_softcap(float *x, size_t n, float cap) {
    double c = (double)cap;
    for (size_t i = 0; i < n; i++) {
        double y = (double)x[i] / c, a = fabs(y);
        double e = ib_exp_lane(-2.0 * a);
        double t = (1.0 - e) / (1.0 + e);
        x[i] = (float)(c * (y < 0 ? -t : y != y ? y : t));
    }
}

IB_VECTOR_CLONES void ib_scale(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] * s;
}
