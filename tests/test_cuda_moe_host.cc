/*
 * test_cuda_moe_host.cc — the CUDA backend's mixture-of-experts kernels (gemma_kernels.cuh) run on the
 * host through tests/cuda_host_shim.h, against the CPU's definitions, bitwise: the routing of every row
 * with the experts' work lists (moe_route_kernel: ib_moe_route — top-k with ties to the lowest id, NaN
 * never taken —, then the routed pairs grouped by expert), the experts' products over the routed pairs
 * (moe_mm_kernel with Q8 and F32 activations, moe_mm_split_kernel; 4-bit group 32 and 8-bit group 64
 * weights in the device layout: ib_matmul of the pair's input row with its expert's matrix, gate and up
 * in one launch, down reading each pair's own slot) and the combine (moe_combine_kernel:
 * ib_moe_combine). Under the gpu-fma change the products must differ. The test-only MoE faults as the
 * CPU defines them: moe-capacity in the routing (ib_moe_fault_capacity's selections, work lists of the
 * kept pairs only), moe-combine-by-load in the combine (the terms added in ib_moe_fault_load_order's
 * expert order, as cpu_moe adds them; the test also asks that this changes some bits). test_backend_cuda
 * runs the same kernels on a GPU in whole Gemma 4 steps.
 */
#include "cuda_host_shim.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"   /* backend.h's C initializers, read as C++ */
extern "C" {
#include "backends/backend.h"
#include "check.h"
#include "ops/act_def.h"
#include "ops/matmul.h"
#include "ops/ops.h"
}
#pragma GCC diagnostic pop

#include "backends/cuda/attention_limits.cuh"
#include "backends/cuda/device_layout.h"
#include "backends/cuda/rowinfo.cuh"
#include "backends/cuda/row_norm.cuh"
#include "backends/cuda/kv_element.cuh"
#include "backends/cuda/quantize_group.cuh"
#include "backends/cuda/product_types.cuh"
#include "backends/cuda/product_kernels.cuh"
#include "backends/cuda/elementwise_kernels.cuh"
#include "backends/cuda/attention_kernels.cuh"
#include "backends/cuda/gemma_kernels.cuh"
#include "cuda_host_mat.h"

#include <stdio.h>
#include <stdlib.h>

enum { E = 16, TOPK = 4, R = 5, D = 256, FM = 128 };

/* One routed product kind over the step: pairs (row, slot) from the work lists; input rows of X / xq by
 * the pair's row (by_slot 0) or slot (1); kernel 0: moe_mm_kernel (q8 or F32), 1: moe_mm_split_kernel.
 * Returns whether every routed pair's output equals ib_matmul's of its input row and expert. */
template <int FMT, int CPG>
static int routed_case(int kernel, int q8, int fused, std::vector<cuda_host_mat> &ex0, std::vector<cuda_host_mat> &ex1, int N, int K, int G,
                       int by_slot, const std::vector<int32_t> &sel, const std::vector<int32_t> &ent_row,
                       const std::vector<int32_t> &ent_slot, const std::vector<int4> &blk, int nblk) {
    const int rows_in = by_slot ? R * TOPK : R, two = !ex1.empty();
    std::vector<float> X((size_t)rows_in * K);
    for (float &v : X) v = rndf() * 2.0f;
    std::vector<int8_t> xq((size_t)rows_in * K);
    std::vector<float> qd((size_t)rows_in * (K / G)), qad((size_t)rows_in * (K / G));
    ib_quantize_act(X.data(), rows_in, K, G, xq.data(), qd.data(), qad.data());
    std::vector<dmat> m0(E), m1(E);
    for (int e = 0; e < E; e++) m0[e] = ex0[e].d, m1[e] = two ? ex1[e].d : ex0[e].d;
    std::vector<float> Y0((size_t)R * TOPK * N, 0.0f), Y1((size_t)R * TOPK * N, 0.0f);
    const int nby = (R * TOPK + MOE_CH - 1) / MOE_CH + (E < R * TOPK ? E : R * TOPK);
    auto body = [&]() {
        if (kernel == 0)
            moe_mm_kernel<FMT, CPG>(m0.data(), m1.data(), Y0.data(), Y1.data(), blk.data(), &nblk, ent_row.data(), ent_slot.data(),
                                    by_slot, X.data(), xq.data(), qd.data(), qad.data(), q8, fused);
        else
            moe_mm_split_kernel<FMT, CPG>(m0.data(), m1.data(), Y0.data(), Y1.data(), blk.data(), &nblk, ent_row.data(),
                                          ent_slot.data(), by_slot, xq.data(), qd.data(), qad.data(), fused);
    };
    const unsigned gx = kernel == 0 ? (unsigned)((N + NT * NWARP - 1) / (NT * NWARP)) : (unsigned)((N + NT - 1) / NT);
    cuda_host_grid(gx, (unsigned)nby, two ? 2u : 1u, 256, body);
    int ok = 1;
    std::vector<float> want(N);
    for (int slot = 0; slot < R * TOPK; slot++) {
        const int e = sel[slot];
        if (e < 0) continue;
        const int xr = by_slot ? slot : slot / TOPK;
        for (int z = 0; z < 1 + two; z++) {
            const ib_matrix *m = z ? &ex1[e].m : &ex0[e].m;
            ib_act_buf q = {xq.data() + (size_t)xr * K, qd.data() + (size_t)xr * (K / G), qad.data() + (size_t)xr * (K / G)};
            ib_matmul(m, X.data() + (size_t)xr * K, 1, q8 ? &q : NULL, q8 ? IB_ACT_Q8 : IB_ACT_F32, IB_ISA_SCALAR, NULL, want.data(), N);
            ok &= memcmp(want.data(), (z ? Y1 : Y0).data() + (size_t)slot * N, (size_t)N * 4) == 0;
        }
    }
    return ok;
}

int main(void) {
    /* router logits: random, a row with tied logits, a row with a NaN */
    std::vector<float> logits((size_t)R * E), escale(E);
    for (float &v : logits) v = rndf() * 3.0f;
    for (float &v : escale) v = 0.5f + rndf() * 0.25f;
    logits[1 * E + 3] = logits[1 * E + 9] = logits[1 * E + 12] = 5.0f;   /* ties: 3, 9, 12 in that order */
    logits[2 * E + 7] = NAN;
    std::vector<int32_t> sel((size_t)R * TOPK, -2), ent_row((size_t)R * TOPK, -1), ent_slot((size_t)R * TOPK, -1);
    std::vector<float> w((size_t)R * TOPK);
    const int nby = (R * TOPK + MOE_CH - 1) / MOE_CH + (E < R * TOPK ? E : R * TOPK);
    std::vector<int4> blk(nby);
    int nblk = -1;
    unsigned cnt = 0;
    const int rw = 2;   /* rows a routing block: three blocks, so the last one builds the lists */
    std::vector<int32_t> load(E, -1);
    auto route_with = [&](const std::vector<float> &lg, int capacity, int32_t *ld) {
        auto body = [&]() {
            moe_route_kernel(lg.data(), R, E, TOPK, escale.data(), sel.data(), w.data(), ent_row.data(), ent_slot.data(), blk.data(),
                             &nblk, &cnt, capacity, ld);
        };
        cuda_host_grid((R + rw - 1) / rw, 1, 1, 32 * rw, body);
    };
    /* the work lists: every routed pair once, grouped by expert, block rows covering them */
    auto lists_ok = [&]() {
        std::vector<int> seen((size_t)R * TOPK, 0);
        int ok = nblk > 0 && nblk <= nby;
        for (int bI = 0; ok && bI < nblk; bI++) {
            const int4 bk = blk[bI];
            ok &= bk.z >= 1 && bk.z <= MOE_CH;
            for (int q = 0; ok && q < bk.z; q++) {
                const int slot = ent_slot[bk.y + q];
                ok &= slot >= 0 && slot < R * TOPK && sel[slot] == bk.x && ent_row[bk.y + q] == slot / TOPK;
                if (ok) seen[slot]++;
            }
        }
        for (int s = 0; s < R * TOPK; s++) ok &= seen[s] == (sel[s] >= 0);
        return ok;
    };
    route_with(logits, 0, NULL);
    int route_ok = cnt == 0;
    std::vector<float> p(E);
    for (int r = 0; r < R; r++) {
        int32_t s[TOPK];
        float ww[TOPK];
        ib_moe_route(&logits[(size_t)r * E], E, TOPK, escale.data(), p.data(), s, ww);
        route_ok &= memcmp(s, &sel[(size_t)r * TOPK], sizeof s) == 0 && memcmp(ww, &w[(size_t)r * TOPK], sizeof ww) == 0;
    }
    CHECK(route_ok, "moe_route_kernel: selections or weights differ from ib_moe_route");
    CHECK(sel[1 * TOPK] == 3 && sel[1 * TOPK + 1] == 9 && sel[1 * TOPK + 2] == 12, "tied logits: ranks %d %d %d, not 3 9 12",
          sel[1 * TOPK], sel[1 * TOPK + 1], sel[1 * TOPK + 2]);
    CHECK(lists_ok(), "moe_route_kernel: the work lists do not hold every routed pair once under its expert (%d block rows)", nblk);
    /* the moe-capacity fault: expert 5 every row's first choice (5 pairs against a capacity of
     * ceil(20 / 16) = 2): the selections ib_moe_fault_capacity leaves, lists of the kept pairs only */
    {
        std::vector<float> lc(logits);
        for (int r = 0; r < R; r++) lc[(size_t)r * E + 5] = 20.0f;
        std::vector<int32_t> want((size_t)R * TOPK);
        for (int r = 0; r < R; r++) {
            float ww[TOPK];
            ib_moe_route(&lc[(size_t)r * E], E, TOPK, escale.data(), p.data(), &want[(size_t)r * TOPK], ww);
        }
        ib_moe_fault_capacity(want.data(), R * TOPK, E);
        int dropped = 0;
        for (int32_t s : want) dropped += s < 0;
        route_with(lc, 1, NULL);
        CHECK(dropped >= 3 && sel == want && cnt == 0, "moe-capacity: the routing kernel's selections differ from "
              "ib_moe_fault_capacity's (%d pairs dropped there)", dropped);
        CHECK(lists_ok(), "moe-capacity: the work lists do not hold exactly the kept pairs");
        route_with(lc, 0, NULL);
        int all = 1;
        for (int32_t s : sel) all &= s >= 0;
        CHECK(all, "without the fault every pair keeps its expert");
        route_with(logits, 0, NULL);   /* the first routing again, for the products and the combine */
    }
    /* the experts' products: gate and up (N = FM from D), down (N = D from FM) */
    int cases = 0, equal = 0;
    for (int bits : {4, 8}) {
        const int G = bits == 4 ? 32 : 64;
        std::vector<cuda_host_mat> gate(E), up(E), down(E), none;
        int made = 1;
        for (int e = 0; e < E; e++)
            made &= cuda_host_mat_make(gate[e], FM, D, bits, G) & cuda_host_mat_make(up[e], FM, D, bits, G) &
                    cuda_host_mat_make(down[e], D, FM, bits, G);
        CHECK(made, "%d-bit experts", bits);
        for (int kernel = 0; kernel < 2; kernel++)
            for (int q8 = 1; q8 >= (kernel ? 1 : 0); q8--) {
                int ok;
                if (bits == 4) {
                    ok = routed_case<IB_WQ4, 1>(kernel, q8, 0, gate, up, FM, D, G, 0, sel, ent_row, ent_slot, blk, nblk) &&
                         routed_case<IB_WQ4, 1>(kernel, q8, 0, down, none, D, FM, G, 1, sel, ent_row, ent_slot, blk, nblk);
                } else {
                    ok = routed_case<IB_WQ8, 4>(kernel, q8, 0, gate, up, FM, D, G, 0, sel, ent_row, ent_slot, blk, nblk) &&
                         routed_case<IB_WQ8, 4>(kernel, q8, 0, down, none, D, FM, G, 1, sel, ent_row, ent_slot, blk, nblk);
                }
                CHECK(ok, "%s, %s activations, %d-bit experts: routed products differ from ib_matmul", kernel ? "moe_mm_split_kernel" : "moe_mm_kernel",
                      q8 ? "Q8" : "F32", bits);
                cases++, equal += ok;
                /* gpu-fma: the Q8 products must change */
                if (q8) {
                    const int f = bits == 4 ? routed_case<IB_WQ4, 1>(kernel, 1, 1, gate, up, FM, D, G, 0, sel, ent_row, ent_slot, blk, nblk)
                                            : routed_case<IB_WQ8, 4>(kernel, 1, 1, gate, up, FM, D, G, 0, sel, ent_row, ent_slot, blk, nblk);
                    CHECK(!f, "%s, %d-bit experts: the gpu-fma change left the products equal", kernel ? "moe_mm_split_kernel" : "moe_mm_kernel", bits);
                }
            }
        for (int e = 0; e < E; e++) ib_matrix_free(&gate[e].m), ib_matrix_free(&up[e].m), ib_matrix_free(&down[e].m);
    }
    printf("%d routed product launches against ib_matmul: %d equal\n", cases, equal);
    /* the combine */
    {
        std::vector<float> y((size_t)R * TOPK * D), out((size_t)R * D), want((size_t)R * D);
        for (float &v : y) v = rndf();
        std::vector<int32_t> sc(sel);
        sc[2] = -1;   /* a slot without an expert */
        for (int r = 0; r < R; r++) ib_moe_combine(&y[(size_t)r * TOPK * D], &w[(size_t)r * TOPK], &sc[(size_t)r * TOPK], TOPK, D, &want[(size_t)r * D]);
        auto body = [&]() { moe_combine_kernel(y.data(), w.data(), sc.data(), R, TOPK, D, out.data(), (const int32_t *)NULL); };
        cuda_host_grid((unsigned)((R * D + 255) / 256), 1, 1, 256, body);
        CHECK(memcmp(out.data(), want.data(), out.size() * 4) == 0, "moe_combine_kernel differs from ib_moe_combine");
        /* the moe-combine-by-load fault: the loads the routing kernel counts, and each row's terms
         * added in the step's expert order (cpu_moe's loop: experts in order, each adding to its rows) */
        route_with(logits, 0, load.data());   /* the same routing, its loads counted */
        std::vector<int> lw(E), order(E);
        ib_moe_loads(sel.data(), R * TOPK, E, lw.data());
        int lok = 1;
        for (int e = 0; e < E; e++) lok &= load[e] == lw[e];
        CHECK(lok, "moe_route_kernel: the experts' loads differ from ib_moe_loads'");
        /* the combine's loads are those of sc (slot 2 without an expert), as cpu_moe counts them */
        ib_moe_loads(sc.data(), R * TOPK, E, lw.data());
        ib_moe_fault_load_order(lw.data(), E, order.data());
        for (int e = 0; e < E; e++) load[e] = lw[e];
        std::vector<float> wl((size_t)R * D, 0.0f), ol((size_t)R * D);
        for (int oi = 0; oi < E; oi++)
            for (int s = 0; s < R * TOPK; s++)
                if (sc[s] == order[oi])
                    for (int d = 0; d < D; d++) wl[(size_t)(s / TOPK) * D + d] = wl[(size_t)(s / TOPK) * D + d] + w[s] * y[(size_t)s * D + d];
        auto by_load = [&]() { moe_combine_kernel(y.data(), w.data(), sc.data(), R, TOPK, D, ol.data(), load.data()); };
        cuda_host_grid((unsigned)((R * D + 255) / 256), 1, 1, 256, by_load);
        CHECK(memcmp(ol.data(), wl.data(), ol.size() * 4) == 0, "moe-combine-by-load: the combine differs from the CPU's order");
        CHECK(memcmp(ol.data(), want.data(), ol.size() * 4) != 0, "moe-combine-by-load: no bit changed (the check could not fail)");
    }
    TEST_MAIN_END("test_cuda_moe_host");
}
