/*
 * reduce.c — the canonical 16-lane reduction order shared by every float reduction outside matmul.
 */
#include "ops/ops.h"

/* sum_i a[i]*b[i]: lane i%16 accumulates in ascending i, then the lanes fold 8,4,2,1. */
float ib_dot16(const float *a, const float *b, int n) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] = lane[j] + a[i + j] * b[i + j];
    for (int j = 0; i + j < n; j++) lane[j] = lane[j] + a[i + j] * b[i + j];
    for (int w = 8; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++) lane[j] = lane[j] + lane[j + w];
    return lane[0];
}

void ib_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}
