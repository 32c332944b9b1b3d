/*
 * test_cuda_elementwise_host.cc — the CUDA backend's row and element kernels (elementwise_kernels.cuh)
 * run on the host through tests/cuda_host_shim.h, against the CPU's definitions, bitwise: the
 * activation quantization (ib_quantize_act, groups 32, 64, 128), the row norm with the residual add and
 * the quantization fused (ib_add, ib_rmsnorm, ib_quantize_act; blocks of 128, 256 and 1,024 threads),
 * SwiGLU alone and with its quantization (ib_swiglu), the add, the embedding of 4- and 8-bit rows
 * (ib_matrix_row_f32) and the argmax of logits rows split into slices (ib_argmax: ties to the lowest id,
 * NaN never winning, an all -inf or NaN row giving 0). The row-order fault (odd rows summing their
 * squares in reverse) must change the norm's bits. test_backend_cuda and test_backend_ops run the same
 * kernels on a GPU.
 */
#include "cuda_host_shim.h"

extern "C" {
#include "check.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "sampling/sampler.h"
}

#include "backends/cuda/product_types.cuh"
#include "backends/cuda/product_kernels.cuh"
#include "backends/cuda/elementwise_kernels.cuh"
#include "cuda_host_mat.h"

#include <stdio.h>
#include <stdlib.h>

static unsigned blocks_for(size_t n, int per) { return (unsigned)((n + per - 1) / per); }

static int same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* The row norm of R rows of n floats (x += add first, then y = rmsnorm(x) * w, quantized for G) in
 * blocks of nt threads, reverse_odd the row-order fault; whether x, y and the codes equal the CPU's. */
static int norm_case(int R, int n, int nt, int G, int reverse_odd) {
    std::vector<float> x((size_t)R * n), add((size_t)R * n), w(n), y((size_t)R * n), xr, yr((size_t)R * n);
    for (float &v : x) v = rndf() * 3.0f;
    for (float &v : add) v = rndf();
    for (float &v : w) v = 1.0f + 0.5f * rndf();
    xr = x;
    ib_add(xr.data(), add.data(), xr.size());
    ib_rmsnorm(xr.data(), w.data(), R, n, 1e-6f, yr.data(), NULL);
    const size_t ng = (size_t)n / G;
    std::vector<int8_t> q((size_t)R * n), qr((size_t)R * n);
    std::vector<float> d(R * ng), ad(R * ng), dr(R * ng), adr(R * ng);
    ib_quantize_act(yr.data(), R, n, G, qr.data(), dr.data(), adr.data());
    auto body = [&]() {
        rmsnorm_kernel(x.data(), add.data(), w.data(), R, n, 1e-6f, y.data(), reverse_odd, q.data(), d.data(), ad.data(), G);
    };
    cuda_host_grid(R, 1, 1, nt, body);
    return same(x.data(), xr.data(), x.size() * 4) && same(y.data(), yr.data(), y.size() * 4) && same(q.data(), qr.data(), q.size()) &&
           same(d.data(), dr.data(), d.size() * 4) && same(ad.data(), adr.data(), ad.size() * 4);
}

int main(void) {
    /* activation quantization */
    for (int G : {32, 64, 128}) {
        const int R = 5, K = 1024, ng = K / G;
        std::vector<float> X((size_t)R * K);
        for (size_t i = 0; i < X.size(); i++) X[i] = i % 97 == 0 ? 0.0f : rndf() * (i % 13 == 0 ? 40.0f : 1.0f);
        for (int k = 0; k < G; k++) X[(size_t)2 * K + k] = 0.0f;   /* an all-zero group */
        std::vector<int8_t> q((size_t)R * K), qr((size_t)R * K);
        std::vector<float> d((size_t)R * ng), ad((size_t)R * ng), dr((size_t)R * ng), adr((size_t)R * ng);
        ib_quantize_act(X.data(), R, K, G, qr.data(), dr.data(), adr.data());
        auto body = [&]() { quantize_kernel(X.data(), R, K, G, q.data(), d.data(), ad.data()); };
        cuda_host_grid(blocks_for((size_t)R * ng * 32, 256), 1, 1, 256, body);
        CHECK(same(q.data(), qr.data(), q.size()) && same(d.data(), dr.data(), d.size() * 4) && same(ad.data(), adr.data(), ad.size() * 4),
              "quantize_kernel, group %d: differs from ib_quantize_act", G);
    }
    /* row norms: 1,024 and 3,072 floats; 128, 256 and 1,024 threads a block */
    for (int n : {1024, 3072})
        for (int nt : {128, 256, 1024}) CHECK(norm_case(3, n, nt, 64, 0), "rmsnorm_kernel, %d floats, %d threads: differs from ib_add, ib_rmsnorm, ib_quantize_act", n, nt);
    CHECK(!norm_case(8, 1024, 256, 64, 1), "rmsnorm_kernel under the row-order fault (4 odd rows of 8): the same bits as the reference");
    /* SwiGLU, alone and with its quantization */
    {
        const int R = 3, F = 3072, G = 64, ng = F / G;
        std::vector<float> g((size_t)R * F), u((size_t)R * F), gr, g2;
        for (float &v : g) v = rndf() * 8.0f;
        for (float &v : u) v = rndf() * 2.0f;
        gr = g, g2 = g;
        ib_swiglu(gr.data(), u.data(), R, F);
        auto body = [&]() { swiglu_kernel(g.data(), u.data(), (size_t)R * F); };
        cuda_host_grid(blocks_for((size_t)R * F, 256), 1, 1, 256, body);
        CHECK(same(g.data(), gr.data(), g.size() * 4), "swiglu_kernel: differs from ib_swiglu");
        std::vector<int8_t> q((size_t)R * F), qr((size_t)R * F);
        std::vector<float> d((size_t)R * ng), ad((size_t)R * ng), dr((size_t)R * ng), adr((size_t)R * ng);
        ib_quantize_act(gr.data(), R, F, G, qr.data(), dr.data(), adr.data());
        auto body2 = [&]() { swiglu_q8_kernel(g2.data(), u.data(), R, F, G, q.data(), d.data(), ad.data()); };
        cuda_host_grid(blocks_for((size_t)R * ng * 32, 256), 1, 1, 256, body2);
        CHECK(same(g2.data(), gr.data(), g2.size() * 4) && same(q.data(), qr.data(), q.size()) && same(d.data(), dr.data(), d.size() * 4) &&
                  same(ad.data(), adr.data(), ad.size() * 4),
              "swiglu_q8_kernel: differs from ib_swiglu then ib_quantize_act");
        /* the add */
        std::vector<float> x(u), xr(u);
        ib_add(xr.data(), gr.data(), xr.size());
        auto body3 = [&]() { add_kernel(x.data(), gr.data(), x.size()); };
        cuda_host_grid(blocks_for(x.size(), 256), 1, 1, 256, body3);
        CHECK(same(x.data(), xr.data(), x.size() * 4), "add_kernel: differs from ib_add");
    }
    /* the embedding of 4- and 8-bit rows */
    for (int bits : {4, 8}) {
        const int K = 256;
        cuda_host_mat a;
        CHECK(cuda_host_mat_make(a, 100, K, bits, 64), "%d-bit embedding", bits);
        const int32_t tok[4] = {0, 99, 37, 37};
        std::vector<float> X(4 * (size_t)K), Xr(4 * (size_t)K);
        for (int r = 0; r < 4; r++) ib_matrix_row_f32(&a.m, tok[r], Xr.data() + (size_t)r * K);
        auto body = [&]() { embed_kernel(a.d, tok, 4, X.data()); };
        cuda_host_grid(blocks_for(4 * (size_t)K, 256), 1, 1, 256, body);
        CHECK(same(X.data(), Xr.data(), X.size() * 4), "embed_kernel, %d-bit rows: differs from ib_matrix_row_f32", bits);
        ib_matrix_free(&a.m);
    }
    /* the argmax of logits rows: random, ties (the lowest id), NaN, all -inf, all NaN, the maximum last */
    {
        const int V = 5003, rows = 6;
        std::vector<float> L((size_t)rows * V);
        for (float &v : L) v = rndf();
        float *r1 = &L[(size_t)1 * V], *r2 = &L[(size_t)2 * V], *r3 = &L[(size_t)3 * V], *r4 = &L[(size_t)4 * V], *r5 = &L[(size_t)5 * V];
        r1[4000] = 7.0f, r1[17] = 7.0f, r1[3000] = 7.0f;               /* ties: 17 */
        r2[10] = NAN, r2[2500] = 5.0f, r2[4999] = NAN;                  /* NaN never wins: 2500 */
        for (int i = 0; i < V; i++) r3[i] = -INFINITY, r4[i] = NAN;    /* all -inf, all NaN: 0 */
        r5[V - 1] = 9.0f;                                               /* the last id */
        std::vector<int32_t> out(rows, -1);
        std::vector<float> pv((size_t)rows * ARGMAX_SLICES);
        std::vector<int> pi((size_t)rows * ARGMAX_SLICES);
        std::vector<unsigned> cnt(rows, 0u);
        auto body = [&]() { argmax_kernel(L.data(), V, out.data(), pv.data(), pi.data(), cnt.data()); };
        cuda_host_grid(ARGMAX_SLICES, rows, 1, ARGMAX_THREADS, body);
        int ok = 1;
        for (int r = 0; r < rows; r++) ok &= out[r] == ib_argmax(&L[(size_t)r * V], V) && cnt[r] == 0;
        CHECK(ok, "argmax_kernel: rows differ from ib_argmax (got %d %d %d %d %d %d)", out[0], out[1], out[2], out[3], out[4], out[5]);
        CHECK(out[1] == 17 && out[2] == 2500 && out[3] == 0 && out[4] == 0 && out[5] == V - 1,
              "argmax_kernel: the chosen ids are not 17, 2500, 0, 0, %d", V - 1);
    }
    TEST_MAIN_END("test_cuda_elementwise_host");
}
