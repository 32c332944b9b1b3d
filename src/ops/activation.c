/*
 * activation.c — SwiGLU: silu(gate) * up.
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
