/*
 * quantize_group.cuh — ib_quantize_act on the GPU, a warp per group: the activation quantization that the
 * quantize kernel, the row norms, SwiGLU and attention (for the product that reads their output) share.
 */
#ifndef IB_BACKENDS_CUDA_QUANTIZE_GROUP_CUH
#define IB_BACKENDS_CUDA_QUANTIZE_GROUP_CUH

#include "ops/quant_code.h"

/* ib_quantize_act of one group of G floats xs (any memory) by one warp: codes into qs, d and ad into *d,
 * *ad (written by lane 0). amax is a maximum of non-NaN magnitudes (the same in any order); the code sum
 * is an exact integer. */
__device__ __forceinline__ void quantize_group(const float *xs, int G, int8_t *qs, float *d, float *ad, int lane) {
    float amax = 0.0f;
    for (int k = lane; k < G; k += 32) {
        const float a = fabsf(xs[k]);
        amax = a > amax ? a : amax;
    }
    for (int o = 16; o; o >>= 1) {
        const float b = __shfl_xor_sync(0xffffffffu, amax, o);
        amax = b > amax ? b : amax;
    }
    if (amax == 0.0f) {
        for (int k = lane; k < G; k += 32) qs[k] = 0;
        if (lane == 0) *d = 0.0f, *ad = 0.0f;
        return;
    }
    const float dd = amax / 127.0f, inv = 127.0f / amax;
    int sum = 0;
    for (int k = lane; k < G; k += 32) {
        const int c = ib_quant_code(xs[k], inv);
        qs[k] = (int8_t)c;
        sum += c;
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) *d = dd, *ad = dd * (float)sum;
}

/* Quantize (ib_quantize_act, group G) the n floats ys (shared memory) that are elements [e0, e0 + n) of
 * row r's K-wide input: its groups e0/G .. into xq [R][K], qd/qad [R][K/G]; e0 and n multiples of G.
 * All threads of the block take part (a warp per group). */
__device__ __forceinline__ void quantize_span(const float *ys, int n, int r, int e0, int K, int G, int8_t *__restrict__ xq,
                                              float *__restrict__ qd, float *__restrict__ qad) {
    const int ng = K / G, lane = threadIdx.x & 31;
    for (int q = threadIdx.x >> 5; q < n / G; q += blockDim.x >> 5) {
        const int g = e0 / G + q;
        quantize_group(ys + (size_t)q * G, G, xq + (size_t)r * K + (size_t)g * G, qd + (size_t)r * ng + g,
                       qad + (size_t)r * ng + g, lane);
    }
}

#endif
