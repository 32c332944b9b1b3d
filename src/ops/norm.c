/*
 * norm.c — RMSNorm over rows and over heads (Qwen3's q_norm / k_norm).
 */
#include <math.h>

#include "ops/ops.h"

/* Sum of squares of x[0..n) in the canonical order, or — under a test-only fault — in an order that
 * depends on the row index or the thread count (the bugs the invariance tests must catch).
 * row < 0: no row index (the row-order fault does not apply). Inlined into each clone of rms_row, so
 * the 16-lane order runs on that clone's vectors (a separate function was built for the baseline ISA
 * only); the order, and so every bit, is the same in all of them. */
static inline __attribute__((always_inline)) float sum_squares(const float *x, int n, int row, int n_threads) {
    ib_fault f = ib_fault_get();
    if (f == IB_FAULT_ROW_ORDER && row >= 0 && (row & 1)) {
        float s = 0.0f;
        for (int i = n - 1; i >= 0; i--) s = s + x[i] * x[i];
        return s;
    }
    if (f == IB_FAULT_SPLIT_K_THREADS && n_threads > 1) {
        float total = 0.0f;
        for (int t = 0; t < n_threads; t++) {
            int lo = n * t / n_threads, hi = n * (t + 1) / n_threads;
            total = total + ib_dot16_inline(x + lo, x + lo, hi - lo);
        }
        return total;
    }
    return ib_dot16_inline(x, x, n);
}

/* y = x * (1/sqrt(ss/n + eps)) * w for one vector of n. */
IB_VECTOR_CLONES static void rms_row(const float *x, const float *w, int n, float eps, float *y, int row, int n_threads) {
    float ss = sum_squares(x, n, row, n_threads);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    if (!w) {
        for (int i = 0; i < n; i++) y[i] = x[i] * r;
        return;
    }
    for (int i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}

typedef struct {
    const float *x;
    const float *w;
    float *y;
    int D;
    float eps;
    int n_threads;
} rms_job;

static void rms_task(void *ctx, int r, int thread) {
    rms_job *j = ctx;
    rms_row(j->x + (size_t)r * j->D, j->w, j->D, j->eps, j->y + (size_t)r * j->D, r, j->n_threads);
}

void ib_rmsnorm(const float *x, const float *w, int R, int D, float eps, float *y, ib_pool *pool) {
    rms_job j = {x, w, y, D, eps, ib_pool_threads(pool)};
    ib_pool_run((double)R * D * 8 < IB_MIN_PARALLEL_MACS ? NULL : pool, R, rms_task, &j);
}

void ib_rmsnorm_heads(float *x, const float *w, int R, int H, int hd, float eps, ib_pool *pool) {
    /* each (row, head) vector is its own norm; the row-order fault breaks ib_rmsnorm only (row -1) */
    rms_job j = {x, w, x, hd, eps, ib_pool_threads(pool)};
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) {
            float *v = x + ((size_t)r * H + h) * hd;
            rms_row(v, w, hd, eps, v, -1, j.n_threads);
        }
}
