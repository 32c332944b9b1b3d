/*
 * act_def.h — the element definitions of GeGLU and the logit soft-cap (ops.h ib_geglu, ib_softcap), as
 * inline functions callable from host code and from CUDA device code (IB_HD), so the CUDA backend
 * computes them with the very same operations. activation.c's loops call these.
 */
#ifndef IB_OPS_ACT_DEF_H
#define IB_OPS_ACT_DEF_H
#include <math.h>

#include "core/fmath.h"
#include "core/hd.h"

/* gelu_tanh(x) * u: t = 1.5957691216057308 * (x + 0.044715 * x^3) (products rounded in this order),
 * gelu = x / (1 + exp(-t)) with ib_expf_lane — x * sigmoid(2 * sqrt(2/pi) * (x + 0.044715 x^3)). */
IB_HD static inline float ib_geglu_elem(float x, float u) {
    float t = 1.5957691216057308f * (x + 0.044715f * ((x * x) * x));
    float gelu = x / (1.0f + ib_expf_lane(-t));
    return gelu * u;
}

/* cap * tanh(x / cap) in double (tanh(a) = (1 - e^-2a) / (1 + e^-2a) on |y|, the sign put back, NaN
 * kept), rounded to float. */
IB_HD static inline float ib_softcap_elem(float x, float cap) {
    double c = (double)cap;
    double y = (double)x / c, a = fabs(y);
    double e = ib_exp_lane(-2.0 * a);
    double t = (1.0 - e) / (1.0 + e);
    return (float)(c * (y < 0 ? -t : y != y ? y : t));
}

#endif
