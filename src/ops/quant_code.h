/*
 * quant_code.h — the int8 code of one activation element for the Q8 products (matmul.h's
 * definition), written once for the CPU (ib_quantize_act and its vector clones) and the CUDA backend
 * (quantize_group.cuh): IB_HD, so both compile the same operations.
 */
#ifndef IB_OPS_QUANT_CODE_H
#define IB_OPS_QUANT_CODE_H
#include <stdint.h>

#include "core/hd.h"

/* clamp(rne(x * inv), -127, 127), and 0 for NaN: rne as (v + 1.5*2^23) - 1.5*2^23, which is exact
 * for |v| < 2^22 and passes infinities and NaNs through, so it equals rintf wherever the clamps that
 * follow can tell. */
IB_HD static inline int32_t ib_quant_code(float x, float inv) {
    const float rne = 12582912.0f; /* 1.5 * 2^23 */
    float v = (x * inv + rne) - rne;
    v = v > 127.0f ? 127.0f : v;
    v = v < -127.0f ? -127.0f : v;
    v = v == v ? v : 0.0f;
    return (int32_t)v;
}

#endif
