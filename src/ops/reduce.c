/*
 * reduce.c — the canonical 16-lane reduction order shared by every float reduction outside matmul.
 */
#include "ops/ops.h"

/* sum_i a[i]*b[i]: lane i%16 accumulates in ascending i, then the lanes fold 8,4,2,1. */
float ib_dot16(const float *a, const float *b, int n) { return ib_dot16_inline(a, b, n); }

IB_VECTOR_CLONES void ib_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}
