/*
 * cuda_host_mat.h — a random matrix in both layouts for the host tests of the CUDA kernels: the CPU's
 * ib_matrix (the reference computes with it) and the device layout (device_layout.h) in host memory of
 * exactly the device's size, so a sanitizer build catches a kernel reading past it. Random numbers from
 * test_rng.h. Include after cuda_host_shim.h and product_types.cuh.
 */
#ifndef IB_TESTS_CUDA_HOST_MAT_H
#define IB_TESTS_CUDA_HOST_MAT_H

#include <vector>

#include "backends/cuda/device_layout.h"
#include "test_rng.h"

struct cuda_host_mat {
    ib_matrix m;
    std::vector<uint32_t> w;      /* quantized codes [K/KC][Np][4] */
    std::vector<float> s, b, wf;  /* scales, biases [K/G][Np]; float weights [K][Np] */
    dmat d;                       /* the device view of w, s, b or wf */
};

/* x := a random N x K matrix, MLX-quantized with `bits` (4, 8) and `group`, or float (bits 32), Np = N
 * rounded up to 32; top: every code the largest (15 or 255), scales and biases still random. Returns 0
 * when ib_matrix refused it (x.m then zeroed). */
static inline int cuda_host_mat_make(cuda_host_mat &x, int N, int K, int bits, int group, int top = 0) {
    ib_error err;
    const int Np = (N + 31) / 32 * 32;
    memset(&x.m, 0, sizeof x.m);
    memset(&x.d, 0, sizeof x.d);
    x.d.N = N, x.d.K = K, x.d.Np = Np;
    if (bits == 32) {
        std::vector<float> w((size_t)N * K);
        for (float &v : w) v = rndf() * 0.1f;
        if (ib_matrix_from_f32(&x.m, w.data(), N, K, &err) != IB_OK) return 0;
        x.wf.assign((size_t)K * Np, 0.0f);
        ib_cuda_layout_f32(&x.m, Np, x.wf.data());
        x.d.fmt = IB_WF32, x.d.wf = x.wf.data();
        return 1;
    }
    const int ng = K / group, kc = bits == 4 ? 32 : 16;
    std::vector<uint32_t> wq((size_t)N * K / (32 / bits));
    for (uint32_t &v : wq) v = top ? 0xffffffffu : (uint32_t)rnd64();
    std::vector<float> sc((size_t)N * ng), bi((size_t)N * ng);
    for (size_t i = 0; i < sc.size(); i++) sc[i] = 0.01f + 0.02f * (rndf() + 1.0f), bi[i] = 0.1f * rndf();
    if (ib_matrix_from_mlx(&x.m, wq.data(), sc.data(), bi.data(), N, K, bits, group, &err) != IB_OK) return 0;
    x.w.assign((size_t)(K / kc) * Np * 4, 0u);
    x.s.assign((size_t)ng * Np, 0.0f), x.b.assign((size_t)ng * Np, 0.0f);
    ib_cuda_layout_q(&x.m, Np, x.w.data(), x.s.data(), x.b.data());
    x.d.fmt = x.m.fmt, x.d.G = group, x.d.ng = ng;
    x.d.w = (const uint4 *)x.w.data(), x.d.s = x.s.data(), x.d.b = x.b.data();
    return 1;
}

#endif
