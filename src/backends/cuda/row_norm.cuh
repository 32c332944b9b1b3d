/*
 * row_norm.cuh — a vector's sum of squares in ib_dot16's order by one warp, and a row's norm factor
 * 1/sqrt(ss/n + eps) by a block: what the row norms, the q/k head norms and Gemma's norms share.
 */
#ifndef IB_BACKENDS_CUDA_ROW_NORM_CUH
#define IB_BACKENDS_CUDA_ROW_NORM_CUH

/* The sum of squares of xs [n] (shared memory) in ib_dot16's order: lane j < 16 sums elements j, j+16, …
 * in order, then the 16 lanes fold 8, 4, 2, 1. Called by a whole warp (lane = its lane); lane 0 gets
 * the sum. */
__device__ __forceinline__ float sumsq16(const float *xs, int n, int lane) {
    float a = 0.0f;
    if (lane < 16) {
#pragma unroll 8
        for (int i = lane; i < n; i += 16) a = a + xs[i] * xs[i];
    }
    for (int wd = 8; wd >= 1; wd >>= 1) {
        const float o = __shfl_down_sync(0xffffffffu, a, wd, 16);
        if (lane < wd) a = a + o;
    }
    return a;
}

/* The norm factor 1/sqrt(ss/n + eps) of the vector xs [n] staged in shared memory (every thread's writes
 * before the call), ss its sum of squares in ib_dot16's order (sumsq16, by warp 0) or, with rev (the
 * test-only row-order fault), serially in reverse; r_s: shared scratch. Called by the whole block (two
 * barriers); every thread gets the factor. */
__device__ __forceinline__ float row_norm_factor(const float *xs, int n, float eps, int rev, float *r_s) {
    const int tid = threadIdx.x;
    if (tid < 32) {
        float a = 0.0f;
        if (rev) {
            if (tid == 0)
                for (int i = n - 1; i >= 0; i--) a = a + xs[i] * xs[i];
        } else {
            a = sumsq16(xs, n, tid);
        }
        if (tid == 0) *r_s = 1.0f / sqrtf(a / (float)n + eps);
    }
    __syncthreads();
    return *r_s;
}

#endif
