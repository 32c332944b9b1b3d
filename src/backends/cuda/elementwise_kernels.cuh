/*
 * elementwise_kernels.cuh — the CUDA backend's kernels that work a row or an element at a time: the
 * activation quantization, the row norms (with the residual add and the quantization fused), the
 * argmax of logits rows, the embedding, SwiGLU (and with its quantization), adds and row gathers — each
 * the numeric definition of its op in src/ops/. Included by cuda_backend.cu after the product kernels
 * (the embedding reads a matrix's weights as they do).
 */
#ifndef IB_BACKENDS_CUDA_ELEMENTWISE_KERNELS_CUH
#define IB_BACKENDS_CUDA_ELEMENTWISE_KERNELS_CUH

#include "core/fmath.h"

#define ARGMAX_THREADS 256  /* threads of an argmax block */
#define ARGMAX_SLICES 32    /* argmax blocks per logits row (each a slice of the vocabulary) */

/* ---------------------------------------------------------------- kernels: activation quantization */

#include "backends/cuda/quantize_group.cuh"

/* ib_quantize_act of X [R][K] for group G: one warp per (row, group). */
__global__ void quantize_kernel(const float *__restrict__ X, int R, int K, int G, int8_t *__restrict__ xq,
                                float *__restrict__ d, float *__restrict__ ad) {
    PDL_ENTER();
    const int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int ng = K / G;
    if (wid >= R * ng) return;
    const int r = wid / ng, g = wid % ng;
    const size_t di = (size_t)r * ng + g;
    quantize_group(X + (size_t)r * K + (size_t)g * G, G, xq + (size_t)r * K + (size_t)g * G, d + di, ad + di, lane);
}

/* ---------------------------------------------------------------- kernels: elementwise and norms */

#include "backends/cuda/row_norm.cuh"

/* RMSNorm of nvec vectors of n floats (x, y [nvec][n], may alias; weights w [n]), one block per vector:
 * the vector is staged in shared memory (n floats of dynamic shared memory), threads 0..15 own
 * ib_dot16's lanes (lane j sums elements j, j+16, … in order) and fold 8, 4, 2, 1; then
 * y = (x * (1/sqrt(ss/n + eps))) * w. reverse_odd: the test-only row-order fault (odd vectors sum
 * their squares in reverse, serially).
 * Fused neighbours (the same operations as the separate ops, in the same order): add_y != NULL first
 * does x = x + add_y (ib_add; x written back); G > 0 then quantizes y for group G into xq/qd/qad
 * (ib_quantize_act of the rows just written). The weights are read before the wait for the previous
 * kernel (no kernel writes them): into registers where a thread's share is at most NORM_WREG of them
 * (qwen3-8b B=1 +1.3% on the H200), else asked of L2. */
#define NORM_WREG 8
__global__ void rmsnorm_kernel(float *x, const float *__restrict__ add_y, const float *__restrict__ w, int nvec, int n,
                               float eps, float *y, int reverse_odd, int8_t *__restrict__ xq, float *__restrict__ qd,
                               float *__restrict__ qad, int G) {
    const int tid = threadIdx.x, wreg = n <= NORM_WREG * (int)blockDim.x;
    float wr[NORM_WREG];
    if (wreg) {
#pragma unroll
        for (int k = 0; k < NORM_WREG; k++) {
            const int i = tid + k * (int)blockDim.x;
            wr[k] = i < n ? w[i] : 0.0f;
        }
    } else {
        prefetch_bytes(w, (size_t)n * sizeof(float));
    }
    PDL_ENTER();
    DYN_SHARED(float, xs);
    __shared__ float r_s;
    const int v = blockIdx.x;
    float *xv = x + (size_t)v * n;
    float *yv = y + (size_t)v * n;
    if (add_y) {
        const float *av = add_y + (size_t)v * n;
        for (int i = tid; i < n; i += blockDim.x) {
            const float t = xv[i] + av[i];
            xv[i] = t;
            xs[i] = t;
        }
    } else {
        for (int i = tid; i < n; i += blockDim.x) xs[i] = xv[i];
    }
    __syncthreads();
    const float r = row_norm_factor(xs, n, eps, reverse_odd && (v & 1), &r_s);
    if (wreg) {
#pragma unroll
        for (int k = 0; k < NORM_WREG; k++) {
            const int i = tid + k * (int)blockDim.x;
            if (i < n) {
                const float t = (xs[i] * r) * wr[k];
                yv[i] = t;
                xs[i] = t;
            }
        }
    } else {
        for (int i = tid; i < n; i += blockDim.x) {
            const float t = (xs[i] * r) * w[i];
            yv[i] = t;
            xs[i] = t;
        }
    }
    if (G <= 0) return;
    __syncthreads();
    const int ng = n / G, lane = tid & 31;
    for (int g = tid >> 5; g < ng; g += blockDim.x >> 5) {
        const size_t di = (size_t)v * ng + g;
        quantize_group(xs + (size_t)g * G, G, xq + (size_t)v * n + (size_t)g * G, qd + di, qad + di, lane);
    }
}

/* (bv, bi) becomes (v, i) when v is larger, or equal with a lower id (NaN never: both tests fail). */
__device__ __forceinline__ void argmax_pick(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

/* The best (value, lowest id) of a block's threads by argmax_pick: lane 0 of warp 0 ends with it (sv, si:
 * [blockDim.x / 32] shared scratch). */
__device__ __forceinline__ void argmax_block(float &bv, int &bi, float *sv, int *si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, o);
        const int i = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_pick(bv, bi, v, i);
    }
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) argmax_pick(bv, bi, sv[w], si[w]);
}

/* out[r] = ib_argmax of row r of L [rows][V]: the first id holding the largest logit, NaN never
 * winning, and 0 when nothing exceeds -inf (an all NaN / -inf row) — as the scan of ib_argmax gives it.
 * Grid (ARGMAX_SLICES, rows): block (s, r) keeps the best (value, lowest id) of slice s of row r in
 * pv / pi [rows][ARGMAX_SLICES]; the last of a row's blocks to finish (cnt [rows], zero between
 * launches: that block sets it back) combines the slices. Every combination uses argmax_pick — a
 * maximum, and the lowest id among equal values (+0 and -0 equal, as ib_argmax's search for the first
 * id equal to the maximum) — so neither the split nor the order of finishing can change the answer. */
__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(const float *__restrict__ L, int V, int32_t *out,
                                                                float *pv, int *pi, unsigned *cnt) {
    PDL_ENTER();
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    __shared__ unsigned done_s;
    const int r = blockIdx.y, sl = blockIdx.x;
    const float *row = L + (size_t)r * V;
    const int len = (V + ARGMAX_SLICES - 1) / ARGMAX_SLICES, i0 = sl * len, i1 = min(V, i0 + len);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) argmax_pick(bv, bi, row[i], i);
    argmax_block(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        pv[(size_t)r * ARGMAX_SLICES + sl] = bv, pi[(size_t)r * ARGMAX_SLICES + sl] = bi;
        __threadfence();
        done_s = atomicAdd(&cnt[r], 1u);
    }
    __syncthreads();
    if (done_s != ARGMAX_SLICES - 1) return;
    /* the row's last block: every slice's partial is visible (each was fenced before its count) */
    __threadfence();
    bv = -INFINITY, bi = 0x7fffffff;
    for (int x = threadIdx.x; x < ARGMAX_SLICES; x += blockDim.x)
        argmax_pick(bv, bi, ((volatile float *)pv)[(size_t)r * ARGMAX_SLICES + x],
                    ((volatile int *)pi)[(size_t)r * ARGMAX_SLICES + x]);
    __syncthreads();   /* sv, si reused */
    argmax_block(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        out[r] = bv == -INFINITY ? 0 : bi;
        cnt[r] = 0;
    }
}

/* X[r] = embedding row tok[r] (ib_matrix_row_f32's formula). X [R][D]. */
__global__ void embed_kernel(dmat m, const int32_t *__restrict__ tok, int R, float *__restrict__ X) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * m.K) return;
    const int r = (int)(i / m.K), k = (int)(i % m.K);
    X[i] = weight_at(m, tok[r], k);
}

/* g = silu(g) * u with silu(g) = g / (1 + ib_expf(-g)); n elements. */
__global__ void swiglu_kernel(float *g, const float *__restrict__ u, size_t n) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = g[i];
    const float silu = x / (1.0f + ib_expf_lane(-x));
    g[i] = silu * u[i];
}

/* swiglu_kernel of X [R][F] fused with the quantization of its output for group G (ib_swiglu, then
 * ib_quantize_act of the rows): one warp per (row, group); each lane computes the elements it then
 * reads for the group's codes, so the values quantized are those written. */
__global__ void swiglu_q8_kernel(float *g, const float *__restrict__ u, int R, int F, int G, int8_t *__restrict__ xq,
                                 float *__restrict__ qd, float *__restrict__ qad) {
    PDL_ENTER();
    const int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int ng = F / G;
    if (wid >= R * ng) return;
    const int r = wid / ng, gi = wid % ng;
    const size_t o = (size_t)r * F + (size_t)gi * G;
    float *gp = g + o;
    for (int k = lane; k < G; k += 32) {
        const float x = gp[k];
        const float silu = x / (1.0f + ib_expf_lane(-x));
        gp[k] = silu * u[o + k];
    }
    quantize_group(gp, G, xq + o, qd + (size_t)r * ng + gi, qad + (size_t)r * ng + gi, lane);
}

/* Nothing but the wait for the previous kernel (IB_CUDA_REPEAT=empty: what a kernel boundary costs). */
__global__ void empty_kernel() { PDL_ENTER(); }

/* x += y, n elements. */
__global__ void add_kernel(float *x, const float *__restrict__ y, size_t n) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + y[i];
}

/* out[j] = X[rows[j]] for j < n (rows of width D). */
__global__ void gather_kernel(const float *__restrict__ X, const int32_t *__restrict__ rows, int n, int D,
                              float *__restrict__ out) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * D) return;
    out[i] = X[(size_t)rows[i / D] * D + i % D];
}

#endif
