/*
 * product_types.cuh — what the product kernels take: a matrix in device memory (its layout in cuda.h),
 * up to three products over one input run as one grid, and the L2 prefetch of a block's weight tile;
 * shared by the kernels, the launch code in cuda_backend.cu and the host tests that run the kernels.
 */
#ifndef IB_BACKENDS_CUDA_PRODUCT_TYPES_CUH
#define IB_BACKENDS_CUDA_PRODUCT_TYPES_CUH

#define NT 32              /* outputs per product tile: one warp's lanes */
#define NWARP 8            /* warps per product block (256 threads) */

/* A matrix in device memory (layout in cuda.h). */
typedef struct dmat {
    int fmt;          /* ib_wfmt */
    int N, K, G, Np, ng;
    const uint4 *w;   /* quantized codes */
    const float *wf;  /* F32 weights */
    const float *s, *b;
} dmat;

/* Up to three products that read the same input, run as one grid: matrix i owns the 32-output tiles
 * [t0[i], t0[i+1]) of blockIdx.x and writes Y[i] (row stride its N). Which block computes an output
 * never changes how. */
typedef struct mset {
    dmat m[3];
    float *Y[3];
    int t0[4];
    int n;
    int prefetch;      /* the blocks ask L2 for their weight tiles before the wait (prefetch_tile) */
} mset;

/* The product of mset ms that 32-output tile `tile` belongs to, its matrix, output and local tile. */
__device__ __forceinline__ int mset_pick(const mset &ms, int tile, dmat &m, float *&Y) {
    int i = 0;
    if (ms.n > 1 && tile >= ms.t0[1]) i = 1;
    if (ms.n > 2 && tile >= ms.t0[2]) i = 2;
    m = i == 0 ? ms.m[0] : i == 1 ? ms.m[1] : ms.m[2];
    Y = i == 0 ? ms.Y[0] : i == 1 ? ms.Y[1] : ms.Y[2];
    return tile - (i == 0 ? ms.t0[0] : i == 1 ? ms.t0[1] : ms.t0[2]);
}

/* When on: ask L2 for the weights of this block's outputs of mset ms — block x holds OPB outputs, part
 * x % (NT / OPB) of 32-output tile x / (NT / OPB) — (codes, then scales and biases), so the loads after the
 * wait for the previous kernel hit L2. Reads nothing it computes with. */
template <int OPB = NT>
__device__ __forceinline__ void prefetch_tile(const mset &ms, bool on) {
    if (!on || !ms.prefetch) return;
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.x / (NT / OPB), m, Y);
    const size_t n0 = (size_t)tile * NT + (size_t)(blockIdx.x % (NT / OPB)) * OPB;
    const char *base[3];
    size_t stride[3];
    int rows[3], per[3];   /* rows of each array, 128-byte lines per row */
    int na = 0;
    if (m.fmt == IB_WF32) {
        base[0] = (const char *)(m.wf + n0), stride[0] = (size_t)m.Np * 4, rows[0] = m.K, per[0] = 1, na = 1;
    } else {
        const int kc = m.fmt == IB_WQ4 ? 32 : 16;
        base[0] = (const char *)(m.w + n0), stride[0] = (size_t)m.Np * 16, rows[0] = m.K / kc, per[0] = OPB / 8;
        base[1] = (const char *)(m.s + n0), stride[1] = (size_t)m.Np * 4, rows[1] = m.ng, per[1] = 1;
        base[2] = (const char *)(m.b + n0), stride[2] = (size_t)m.Np * 4, rows[2] = m.ng, per[2] = 1;
        na = 3;
    }
    for (int a = 0; a < na; a++)
        for (int i = threadIdx.x; i < rows[a] * per[a]; i += blockDim.x) {
            const char *p = base[a] + (size_t)(i / per[a]) * stride[a] + 128 * (i % per[a]);
            prefetch_l2(p);
        }
}

#endif
