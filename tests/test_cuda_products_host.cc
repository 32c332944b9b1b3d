/*
 * test_cuda_products_host.cc — the CUDA backend's product kernels (product_kernels.cuh) run on the host
 * through tests/cuda_host_shim.h (a block's 256 threads as coroutines; dp4a and mma.sync m16n8k32
 * emulated from their definitions), on matrices in the device layout (device_layout.h), against the
 * CPU's scalar product (ib_matmul --isa scalar), bitwise: Q8-activation products of 4-bit and 8-bit
 * weights (groups 32, 64, 128) on every kernel — dp4a in passes of 1, 2, 4 and 8 rows (32- and 8-output
 * blocks, one pass or several a block, one row's codes staged), the weight tiles in shared memory (32,
 * 16 and 8 outputs; 1, 2 and 4 rows), the 16-row tensor-core kernel, the pipelined one (8- and 16-row
 * blocks of 16 or 32 outputs, 3 to 5 stages) and the tiled GEMM (32- and 64-row blocks) — and the F32
 * path on float, 4-bit and 8-bit weights; 80 outputs (a padded 32-output tile) and K = 512 — and every
 * Q8 kernel again with group sums at their extremes (largest codes, inputs of +-1, G = 128), where the
 * integer sums' float form (ISUM_BIAS, isum_float) is exact only by its bound. Under the
 * gpu-fma change (a fused multiply-add in the group terms) and the gpu-split-k one (the groups split
 * over blocks and added in any order) each kernel must differ. The device tests run the same kernels on
 * a GPU (test_backend_cuda, test_backend_ops).
 */
#include "cuda_host_shim.h"

extern "C" {
#include "check.h"
#include "ops/matmul.h"
#include "ops/ops.h"
}

#include "backends/cuda/device_layout.h"
#include "backends/cuda/product_types.cuh"
#include "backends/cuda/product_kernels.cuh"
#include "cuda_host_mat.h"

#include <stdio.h>
#include <stdlib.h>

enum { N_OUT = 80, K_IN = 512, NP = 96 };

/* The rows' inputs: random (0), or +1 in even rows and -1 in odd ones (1: with a matrix of largest codes,
 * every group sum at its extreme, +-G * qmax * 127 — for 8-bit codes and G = 128, 4,145,280, just below
 * the 2^22 that ISUM_BIAS's exactness needs). */
static int extreme_rows;

/* The product of one launch: the kernel (as a closure over its template arguments) and its grid. */
struct launch {
    mset ms;
    const int8_t *xq;
    const float *qd, *qad, *X;
    int R, rpb, fused, splits;
    void (*q8)(mset, const int8_t *, const float *, const float *, int, int, int, int);   /* dp4a kernels */
    void (*mma)(mset, const int8_t *, const float *, const float *, int, int, int);       /* tensor-core kernels */
    void (*f32)(mset, const float *, int, int);
};

static void run_product(void *p) {
    const launch *l = (const launch *)p;
    if (l->q8) l->q8(l->ms, l->xq, l->qd, l->qad, l->R, l->rpb, l->fused, l->splits);
    else if (l->mma) l->mma(l->ms, l->xq, l->qd, l->qad, l->R, l->fused, l->splits);
    else l->f32(l->ms, l->X, l->R, l->fused);
}

/* Y = X · W^T of R rows through one kernel configuration on grid (gx, gy, splits), dynamic shared bytes
 * smem; the matrix in 32-output tiles (tile64: in 64-output tiles, the GEMM's). Returns whether every
 * output equals the scalar reference bitwise. */
static int product_case(cuda_host_mat &a, int R, const launch &proto, unsigned gx, unsigned gy, size_t smem, int tile64) {
    const int q8 = proto.f32 == NULL, G = a.d.G;
    std::vector<float> X((size_t)R * K_IN), want((size_t)R * N_OUT), got((size_t)R * N_OUT, 0.0f);
    for (size_t i = 0; i < X.size(); i++) X[i] = extreme_rows ? (i / K_IN % 2 ? -1.0f : 1.0f) : rndf() * 2.0f;
    std::vector<int8_t> xq((size_t)R * K_IN);
    std::vector<float> qd((size_t)R * K_IN / 32 + 1), qad((size_t)R * K_IN / 32 + 1);
    ib_act_buf q = {xq.data(), qd.data(), qad.data()};
    if (q8) ib_quantize_act(X.data(), R, K_IN, G, xq.data(), qd.data(), qad.data());
    ib_matmul(&a.m, X.data(), R, q8 ? &q : NULL, q8 ? IB_ACT_Q8 : IB_ACT_F32, IB_ISA_SCALAR, NULL, want.data(), N_OUT);
    if (smem > sizeof cuda_host_dyn_smem) return 0;
    launch l = proto;
    memset(&l.ms, 0, sizeof l.ms);
    l.ms.n = 1, l.ms.m[0] = a.d, l.ms.Y[0] = got.data();
    l.ms.t0[0] = 0, l.ms.t0[1] = tile64 ? (NP + 63) / 64 : NP / NT;
    l.xq = xq.data(), l.qd = qd.data(), l.qad = qad.data(), l.X = X.data(), l.R = R;
    for (unsigned z = 0; z < (unsigned)l.splits; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) cuda_host_run_block_z(x, y, z, 256, run_product, &l);
    return memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
}

static unsigned blocks_of(int n, int per) { return (unsigned)((n + per - 1) / per); }

/* Every kernel configuration on matrix a (quantized) for R rows; fault: 0, or 1 (gpu-fma), 2 (gpu-split-k).
 * Adds the cases run and those equal to the reference. */
template <int FMT>
static void q8_kernels(cuda_host_mat &a, int fault, int &cases, int &equal, const char *what) {
    const int tiles = NP / NT, fused = fault == 1, splits = fault == 2 ? 4 : 1, G = a.d.G;
    const int cpg = G / MM_KC(FMT);
    auto run = [&](const char *name, int R, launch l, unsigned gx, unsigned gy, size_t sm, int t64) {
        l.fused = fused, l.splits = splits;
        const int ok = product_case(a, R, l, gx, gy, sm, t64);
        if (!fault) CHECK(ok, "%s, %s, %d rows: the product differs from the scalar reference", what, name, R);
        cases++, equal += ok;
    };
    /* dp4a in passes of RBT rows, 32-output blocks (one pass, and three a block) and 8-output ones */
    {
        launch l = {};
        l.q8 = mm_q8_kernel<FMT, 1, NT>, l.rpb = 1;
        run("dp4a, 1 row a pass", 1, l, tiles, 1, 0, 0);
        l.q8 = mm_q8_kernel<FMT, 1, 8>;
        run("dp4a, 1 row, 8-output blocks", 1, l, tiles * 4, 1, 0, 0);
        l.q8 = mm_q8_kernel<FMT, 2, NT>, l.rpb = 2;
        run("dp4a, 2 rows a pass", 2, l, tiles, 1, 0, 0);
        l.q8 = mm_q8_kernel<FMT, 4, NT>, l.rpb = 12;
        run("dp4a, 4 rows a pass, 3 passes a block", 11, l, tiles, blocks_of(11, 12), 0, 0);
        l.q8 = mm_q8_kernel<FMT, 8, 8>, l.rpb = 8;
        run("dp4a, 8 rows a pass, 8-output blocks", 21, l, tiles * 4, blocks_of(21, 8), 0, 0);
        if (cpg <= MM_MAXC(FMT) / 2) {   /* the lean instantiation (mm_q8_pick: short groups, bounded registers) */
            l.q8 = mm_q8_kernel<FMT, 8, NT, MM_MAXC(FMT) / 2, false, 2>, l.rpb = 8;
            run("dp4a, 8 rows a pass, lean", 13, l, tiles, blocks_of(13, 8), 0, 0);
            l.q8 = mm_q8_kernel<FMT, 8, 8, MM_MAXC(FMT) / 2, false, 2>;
            run("dp4a, 8 rows a pass, lean, 8-output blocks", 6, l, tiles * 4, 1, 0, 0);
        }
        if (K_IN <= MM_XS_MAX_K) {
            l.q8 = cpg <= MM_MAXC(FMT) / 2 ? mm_q8_kernel<FMT, 1, NT, MM_MAXC(FMT) / 2, true> : mm_q8_kernel<FMT, 1, NT, MM_MAXC(FMT), true>;
            l.rpb = 1;
            run("dp4a, the row's codes staged", 1, l, tiles, 1, K_IN, 0);
        }
    }
    /* the weight tiles in shared memory: 32, 16, 8 outputs; 1, 2, 4 rows */
    {
        static const int rows[3] = {1, 2, 4};
        for (int opb = NT; opb >= 8; opb /= 2)
            for (int ri = 0; ri < 3; ri++) {
                launch l = {};
                const int rbt = rows[ri];
                l.q8 = opb == 32 ? (rbt == 1 ? mm_q8_tile_kernel<FMT, 32, 1> : rbt == 2 ? mm_q8_tile_kernel<FMT, 32, 2> : mm_q8_tile_kernel<FMT, 32, 4>)
                     : opb == 16 ? (rbt == 1 ? mm_q8_tile_kernel<FMT, 16, 1> : rbt == 2 ? mm_q8_tile_kernel<FMT, 16, 2> : mm_q8_tile_kernel<FMT, 16, 4>)
                                 : (rbt == 1 ? mm_q8_tile_kernel<FMT, 8, 1> : rbt == 2 ? mm_q8_tile_kernel<FMT, 8, 2> : mm_q8_tile_kernel<FMT, 8, 4>);
                l.rpb = rbt;
                char name[64];
                snprintf(name, sizeof name, "weight tiles of %d outputs, %d rows a pass", opb, rbt);
                run(name, rbt == 1 ? 1 : rbt - 1 + (opb == 8), l, tiles * (NT / opb), 1, mm_tile_smem(opb, K_IN, a.d.ng, cpg, rbt), 0);
            }
    }
    if (G % 32 != 0 || MMA_KS % G != 0) return;   /* the tensor-core kernels walk whole groups of 32 k */
    {
        launch l = {};
        l.mma = mm_q8_mma16_kernel<FMT>;
        run("tensor cores, 16-row tiles", 21, l, tiles, blocks_of(21, 16), 0, 0);
        for (int v = 0; v < 6; v++) {
            const int nr = v < 3 ? 1 : 2, narrow = v % 3 == 1, deep = v % 3 == 2;
            size_t sm;
            l.mma = mma_pipe_pick(FMT, nr, narrow, deep, &sm);
            char name[80];
            snprintf(name, sizeof name, "pipelined tensor cores, %d-row blocks%s%s", 8 * nr, narrow ? ", 16 outputs" : "",
                     deep ? ", deep" : "");
            const int R = nr == 1 ? 7 : 27;
            run(name, R, l, tiles * (narrow ? 2 : 1), blocks_of(R, 8 * nr), sm, 0);
        }
        for (int bm : {32, 64}) {
            size_t sm;
            l.mma = mma_gemm_pick(FMT, bm, G, &sm);
            char name[48];
            snprintf(name, sizeof name, "tiled GEMM, %d-row blocks", bm);
            run(name, bm == 32 ? 40 : 70, l, blocks_of(bm == 32 ? 40 : 70, bm), (NP + 63) / 64, sm, 1);
        }
    }
}

int main(void) {
    static const struct { int bits, group; } qm[] = {{4, 32}, {4, 64}, {4, 128}, {8, 32}, {8, 64}, {8, 128}};
    int cases = 0, equal = 0;
    for (const auto &c : qm) {
        cuda_host_mat a;
        CHECK(cuda_host_mat_make(a, N_OUT, K_IN, c.bits, c.group), "%d-bit group %d matrix", c.bits, c.group);
        char what[48];
        snprintf(what, sizeof what, "%d-bit group %d", c.bits, c.group);
        if (c.bits == 4) q8_kernels<IB_WQ4>(a, 0, cases, equal, what);
        else q8_kernels<IB_WQ8>(a, 0, cases, equal, what);
        ib_matrix_free(&a.m);
    }
    /* group sums at their extremes (largest codes, inputs of +-1), the two formats at G = 128: the
     * biased integer sums (ISUM_BIAS) stay exact */
    extreme_rows = 1;
    for (int bits : {4, 8}) {
        cuda_host_mat a;
        CHECK(cuda_host_mat_make(a, N_OUT, K_IN, bits, 128, 1), "%d-bit group 128 matrix of largest codes", bits);
        char what[64];
        snprintf(what, sizeof what, "%d-bit group 128, group sums at their extremes", bits);
        if (bits == 4) q8_kernels<IB_WQ4>(a, 0, cases, equal, what);
        else q8_kernels<IB_WQ8>(a, 0, cases, equal, what);
        ib_matrix_free(&a.m);
    }
    extreme_rows = 0;
    /* the F32 path: float, 4-bit and 8-bit weights, one chain a (row, output) */
    for (int bits : {32, 4, 8}) {
        cuda_host_mat a;
        CHECK(cuda_host_mat_make(a, N_OUT, K_IN, bits, 64), "%d-bit matrix", bits);
        launch l = {};
        l.f32 = bits == 32 ? mm_f32_kernel<IB_WF32> : bits == 4 ? mm_f32_kernel<IB_WQ4> : mm_f32_kernel<IB_WQ8>;
        l.splits = 1;
        const int ok = product_case(a, 13, l, NP / NT, blocks_of(13, NWARP), 0, 0);
        CHECK(ok, "F32 path, %d-bit weights: the product differs from the scalar reference", bits);
        cases++, equal += ok;
        ib_matrix_free(&a.m);
    }
    printf("%d products against the scalar reference: %d equal\n", cases, equal);
    /* gpu-fma on the F32 path (a float32 chain of fused multiply-adds instead of the double sum): each
     * product must differ */
    for (int bits : {32, 4, 8}) {
        cuda_host_mat a;
        cuda_host_mat_make(a, N_OUT, K_IN, bits, 64);
        launch l = {};
        l.f32 = bits == 32 ? mm_f32_kernel<IB_WF32> : bits == 4 ? mm_f32_kernel<IB_WQ4> : mm_f32_kernel<IB_WQ8>;
        l.splits = 1, l.fused = 1;
        CHECK(!product_case(a, 13, l, NP / NT, blocks_of(13, NWARP), 0, 0),
              "F32 path, %d-bit weights: the gpu-fma fault (a float32 chain) went unnoticed", bits);
        ib_matrix_free(&a.m);
    }
    /* the faults, on every Q8 kernel: none may equal the reference */
    for (int fault = 1; fault <= 2; fault++) {
        int fc = 0, fe = 0;
        for (const auto &c : qm) {
            cuda_host_mat a;
            cuda_host_mat_make(a, N_OUT, K_IN, c.bits, c.group);
            if (c.bits == 4) q8_kernels<IB_WQ4>(a, fault, fc, fe, "fault");
            else q8_kernels<IB_WQ8>(a, fault, fc, fe, "fault");
            ib_matrix_free(&a.m);
        }
        CHECK(fe == 0, "%s: %d of %d products still equal the reference", fault == 1 ? "gpu-fma" : "gpu-split-k", fe, fc);
        printf("%s (must differ): %d of %d products differ\n", fault == 1 ? "gpu-fma" : "gpu-split-k", fc - fe, fc);
    }
    TEST_MAIN_END("test_cuda_products_host");
}
