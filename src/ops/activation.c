/*
 * activation.c — SwiGLU: silu(gate) * up; GeGLU: gelu_tanh(gate) * up; soft-capping; scaling.
 */
#include "core/fmath.h"
#include "ops/act_def.h"
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
        g[i] = ib_geglu_elem(g[i], u[i]);
    }
}

IB_VECTOR_CLONES void ib_softcap(float *x, size_t n, float cap) {
    for (size_t i = 0; i < n; i++) x[i] = ib_softcap_elem(x[i], cap);
}

IB_VECTOR_CLONES void ib_scale(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] * s;
}
