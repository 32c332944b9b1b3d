/*
 * test_cuda_decode_host.cc — the CUDA backend's decode attention kernels (attention_kernels.cuh) run on
 * the host through tests/cuda_host_shim.h (a block's threads as coroutines), against the CPU's scalar
 * definitions, bitwise: the q/k head norms (ib_rmsnorm_heads), RoPE (ib_rope over ib_rope_table's
 * table), the KV store (floats as they are, halves by ib_f32_to_f16, q8 by ib_kvq8_encode_row) and
 * attention (ib_attend_heads_kv, --isa scalar's copy), each output also quantized for the o product
 * (ib_quantize_act). Every path a decode step can take: the per-head kernel with its keys in registers
 * (attention_direct_kernel, blocks of 256 and 512 threads), the per-head kernel through a stage of
 * 160 KiB or 6 KiB or none (attention_head_kernel), the per-KV-head kernel (attention_kernel, its grouped
 * passes for 2 and 4 query heads a KV head and its (head, key) pair at a time ones) — each
 * with the q/k norm, RoPE and store inside it (qk_fuse) and after qk_kernel did them. Steps of 1 and 3
 * rows, each its own session at positions 0 to 300 (and 600 for the per-KV-head kernel: two chunks);
 * head dims 64 and 128; 1, 2 and 4 query heads a KV head; float, half and q8 caches; key blocks of 32
 * and 16. The cache's new key and value (every kernel that stores them) must be the reference's too. A kernel that cuts key blocks at half the reference's size, one that skips the
 * rotation of every row but the first (rope_rows 1, as the rope-skip-rows fault), and a q8 store with
 * codes up to 126 (the kvq8-step-scale fault), must differ. test_backend_cuda runs the same kernels on a GPU.
 */
#include "cuda_host_shim.h"

extern "C" {
#include "check.h"
#include "test_rng.h"
#include "ops/matmul.h"
#include "ops/ops.h"
}

#include "backends/cuda/attention_limits.cuh"
#include "backends/cuda/rowinfo.cuh"
#include "backends/cuda/row_norm.cuh"
#include "backends/cuda/kv_element.cuh"
#include "backends/cuda/quantize_group.cuh"
#include "backends/cuda/attention_kernels.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <vector>


enum kernel_kind { K_DIRECT, K_DIRECT_WIDE, K_STAGED, K_STAGED_SMALL, K_UNSTAGED, K_KVHEAD, K_KVHEAD_PAIRS, K_COUNT };
static const char *const kernel_name[K_COUNT] = {"keys in registers", "keys in registers, 512 threads",
                                                 "staged 160 KiB", "staged 6 KiB", "cache read directly",
                                                 "a block per KV head", "a block per KV head, a (head, key) pair at a time"};

/* A step's inputs and outputs, and how to launch one kernel over it. */
struct step {
    int R, H, KVH, hd, block, qG, kvt, rope_rows;
    float scale, eps;
    std::vector<float> Q, K, V, cs, qn, kn, ATT, qd, qad;
    std::vector<int8_t> xq;
    std::vector<rowinfo> ri;
    std::vector<std::vector<unsigned char>> kv;   /* each row's session cache: [2][KVH][cap][hd] of its type */
    qk_fuse fz;
    int kind, stage;
};

static void run_attention(void *p) {
    step *s = (step *)p;
    switch (s->kind) {
    case K_DIRECT:
    case K_DIRECT_WIDE:
        direct_attention_kernel_for((ib_kv_dtype)s->kvt, s->kind == K_DIRECT_WIDE)(s->Q.data(), s->ATT.data(), s->ri.data(), s->H, s->KVH, s->hd, 0, s->scale, s->block, s->qG, s->xq.data(), s->qd.data(), s->qad.data(), s->stage, s->fz);
        break;
    case K_STAGED:
    case K_STAGED_SMALL:
    case K_UNSTAGED:
        attention_head_kernel<false>(s->Q.data(), s->ATT.data(), s->ri.data(), s->H, s->KVH, s->hd, 0, s->scale, s->block, s->qG, s->xq.data(), s->qd.data(), s->qad.data(), s->stage, 1, s->fz);
        break;
    default:
        attention_kernel(s->Q.data(), s->ATT.data(), s->ri.data(), s->H, s->KVH, s->hd, 0, s->scale, s->block, s->qG, s->xq.data(), s->qd.data(), s->qad.data(), s->fz,
                         s->kind == K_KVHEAD);
    }
}

static void run_qk(void *p) {
    step *s = (step *)p;
    qk_kernel(s->Q.data(), s->K.data(), s->V.data(), s->cs.data(), s->ri.data(), s->qn.data(), s->kn.data(), s->H, s->KVH, s->hd, 0, s->eps, s->rope_rows);
}

/* The reference of a step: each row's q heads and key head normed and rotated, the key and value stored
 * at the row's position, each query head's attention over its session's keys 0..pos in key blocks of
 * ref_block; outputs into att [R][H][hd], caches into kv. */
static void reference(const step &s, int ref_block, std::vector<float> &att, std::vector<std::vector<unsigned char>> &kv) {
    const int hd = s.hd, G = s.H / s.KVH;
    for (int r = 0; r < s.R; r++) {
        std::vector<float> q(s.Q.begin() + (size_t)r * s.H * hd, s.Q.begin() + (size_t)(r + 1) * s.H * hd);
        std::vector<float> k(s.K.begin() + (size_t)r * s.KVH * hd, s.K.begin() + (size_t)(r + 1) * s.KVH * hd);
        ib_rmsnorm_heads(q.data(), s.qn.data(), 1, s.H, hd, s.eps, NULL);
        ib_rmsnorm_heads(k.data(), s.kn.data(), 1, s.KVH, hd, s.eps, NULL);
        ib_rope(q.data(), 1, s.H, hd, s.cs.data() + (size_t)r * hd);
        ib_rope(k.data(), 1, s.KVH, hd, s.cs.data() + (size_t)r * hd);
        const rowinfo &ri = s.ri[r];
        const ib_kv_dtype t = (ib_kv_dtype)s.kvt;
        const size_t plane = (size_t)ri.cap * hd;
        unsigned char *base = kv[r].data();
        for (int h = 0; h < s.KVH; h++) {
            const size_t ko = (size_t)h * plane + (size_t)ri.pos * hd, vo = ko + (size_t)s.KVH * plane;
            const float *kr = k.data() + (size_t)h * hd, *vr = s.V.data() + ((size_t)r * s.KVH + h) * hd;
            if (t == IB_KV_Q8) {
                ib_kvq8_encode_row(kr, hd, base + ib_kv_bytes(t, ko));
                ib_kvq8_encode_row(vr, hd, base + ib_kv_bytes(t, vo));
                continue;
            }
            for (int i = 0; i < hd; i++) {
                if (t == IB_KV_F16) ((uint16_t *)base)[ko + i] = ib_f32_to_f16(kr[i]), ((uint16_t *)base)[vo + i] = ib_f32_to_f16(vr[i]);
                else ((float *)base)[ko + i] = kr[i], ((float *)base)[vo + i] = vr[i];
            }
        }
        for (int h = 0; h < s.H; h++) {
            const int kvh = h / G;
            const unsigned char *kp = base + ib_kv_bytes(t, (size_t)kvh * plane), *vp = base + ib_kv_bytes(t, (size_t)(s.KVH + kvh) * plane);
            float *o = att.data() + ((size_t)r * s.H + h) * hd;
            ib_attend_heads_kv_isa(IB_ISA_SCALAR, t, kp, vp, q.data() + (size_t)h * hd, 1, ri.pos + 1, hd, hd, s.scale,
                                   ref_block, 0, o);
        }
    }
}

/* One step of R rows (row r at position pos[r] of its own session, caches of KV type kvt) through kernel
 * `kind`, fused or after qk_kernel; the kernel's key block `block`, the reference's ref_block;
 * rope_rows < R: the kernel rotates only that many rows; kvq8_fault: the kernel's q8 store has codes up to
 * 126. Returns whether outputs, their quantization and the caches equal the reference's bitwise. */
static int decode_case(int kind, int fused, int hd, int G, int kvt, int block, int ref_block, int R, const int *pos,
                       int qG, int rope_rows, int kvq8_fault = 0) {
    step s;
    s.R = R, s.KVH = 2, s.H = G * s.KVH, s.hd = hd, s.block = block, s.qG = qG, s.kvt = kvt, s.rope_rows = rope_rows;
    s.scale = 1.0f / sqrtf((float)hd), s.eps = 1e-6f, s.kind = kind;
    const size_t W = (size_t)R * s.H * hd;
    s.Q.resize(W), s.K.resize((size_t)R * s.KVH * hd), s.V.resize((size_t)R * s.KVH * hd), s.cs.resize((size_t)R * hd);
    s.qn.resize(hd), s.kn.resize(hd), s.ATT.assign(W, 0.0f), s.qd.resize(W), s.qad.resize(W), s.xq.resize(W);
    for (float &x : s.Q) x = rndf() * 2.0f;
    for (float &x : s.K) x = rndf() * 2.0f;
    for (float &x : s.V) x = rndf();
    for (int i = 0; i < hd; i++) s.qn[i] = 1.0f + 0.25f * rndf(), s.kn[i] = 1.0f + 0.25f * rndf();
    std::vector<int32_t> p32(pos, pos + R);
    ib_rope_table(p32.data(), R, hd, 1e6, s.cs.data());
    s.ri.resize(R), s.kv.resize(R);
    for (int r = 0; r < R; r++) {
        const int cap = pos[r] + 5;
        const size_t n = 2 * (size_t)s.KVH * cap * hd;
        std::vector<float> x(n);
        for (size_t i = 0; i < n; i++) x[i] = rndf() * (i % 11 == 0 ? 4.0f : 1.0f);
        s.kv[r].assign(ib_kv_bytes((ib_kv_dtype)kvt, n), 0);
        if (kvt == IB_KV_Q8) ib_kvq8_encode_row(x.data(), (int)n, s.kv[r].data());
        for (size_t i = 0; i < n && kvt != IB_KV_Q8; i++) {
            if (kvt == IB_KV_F16) ((uint16_t *)s.kv[r].data())[i] = ib_f32_to_f16(x[i]);
            else ((float *)s.kv[r].data())[i] = x[i];
        }
        s.ri[r] = rowinfo{s.kv[r].data(), cap, 0, 0, kvt, pos[r], 0, 0, kvq8_fault};
    }
    std::vector<float> want(W);
    std::vector<std::vector<unsigned char>> kv_want = s.kv;
    reference(s, ref_block, want, kv_want);
    s.stage = kind == K_STAGED ? 160 * 1024 : kind == K_STAGED_SMALL ? 6 * 1024 : kind == K_UNSTAGED ? 0
              : (int)((size_t)ATT_CHUNK * hd * sizeof(float));
    if (fused) {
        s.fz = qk_fuse{s.K.data(), s.V.data(), s.cs.data(), s.qn.data(), s.kn.data(), s.eps, rope_rows};
    } else {
        s.fz = qk_fuse{};
        const int gx = (s.H + s.KVH + QK_WARPS - 1) / QK_WARPS;
        for (int r = 0; r < R; r++)
            for (int x = 0; x < gx; x++) cuda_host_run_block((unsigned)x, (unsigned)r, 32 * QK_WARPS, run_qk, &s);
    }
    const int blocks = kind == K_KVHEAD || kind == K_KVHEAD_PAIRS ? R * s.KVH : R * s.H;
    const int nt = kind == K_DIRECT_WIDE ? ATT_THREADS_WIDE : ATT_THREADS;
    gridDim = cuda_host_idx{(unsigned)blocks, 1, 1};   /* the per-KV-head kernel maps blocks to rows by it */
    for (int b = 0; b < blocks; b++) cuda_host_run_block((unsigned)b, 0, nt, run_attention, &s);
    int same = memcmp(want.data(), s.ATT.data(), W * sizeof(float)) == 0;
    for (int r = 0; r < R; r++) same = same && s.kv[r] == kv_want[r];
    if (qG > 0) {
        std::vector<int8_t> rq(W);
        std::vector<float> rd(W), rad(W);
        const size_t ng = W / (size_t)qG;
        ib_quantize_act(want.data(), R, s.H * hd, qG, rq.data(), rd.data(), rad.data());
        same = same && memcmp(rq.data(), s.xq.data(), W) == 0 && memcmp(rd.data(), s.qd.data(), ng * 4) == 0 &&
               memcmp(rad.data(), s.qad.data(), ng * 4) == 0;
    }
    return same;
}

int main(void) {
    static const int pos1[][3] = {{0, 0, 0}, {1, 0, 0}, {31, 0, 0}, {32, 0, 0}, {129, 0, 0}, {300, 0, 0}};
    static const int pos3[][3] = {{5, 77, 0}, {130, 2, 64}};
    int cases = 0, differ = 0;
    for (int kind = 0; kind < K_COUNT; kind++)
        for (int fused = 0; fused < 2; fused++)
            for (int hd : {64, 128})
                for (int G : {1, 2, 4})
                    for (int kvt = 0; kvt < IB_KV_DTYPE_COUNT; kvt++) {
                        const int block = (cases % 3 == 2) ? 16 : 32, qG = cases % 2 ? 32 : 0;
                        const int n1 = (int)(sizeof pos1 / sizeof *pos1), np = n1 + (int)(sizeof pos3 / sizeof *pos3);
                        const int pi = cases % np;
                        const int R = pi < n1 ? 1 : 3;
                        const int *pos = pi < n1 ? pos1[pi] : pos3[pi - n1];
                        const int ok = decode_case(kind, fused, hd, G, kvt, block, block, R, pos, qG, R);
                        CHECK(ok, "%s, %s, hd %d, %d heads a KV head, %s KV, key block %d, %d row(s) at %d..: decode "
                              "attention differs from the scalar reference", kernel_name[kind], fused ? "q/k inside" : "q/k kernel first",
                              hd, G, kvt == IB_KV_Q8 ? "q8" : kvt == IB_KV_F16 ? "half" : "float", block, R, pos[0]);
                        cases++, differ += !ok;
                    }
    /* 601 keys: two chunks of the per-KV-head kernel (the running max and sum carried between them) */
    static const int pos_long[3] = {600, 0, 0};
    for (int kind : {K_KVHEAD, K_KVHEAD_PAIRS})
        for (int fused = 0; fused < 2; fused++)
            for (int G : {1, 2, 4}) {
                const int ok = decode_case(kind, fused, 128, G, IB_KV_F16, 32, 32, 1, pos_long, 32, 1);
                CHECK(ok, "%s, %s, %d heads a KV head, one row at 600: decode attention over two chunks differs from "
                          "the scalar reference", kernel_name[kind], fused ? "q/k inside" : "q/k kernel first", G);
                cases++, differ += !ok;
            }
    printf("%d decode steps against the scalar reference: %d differ\n", cases, differ);
    /* faults: key blocks of half the reference's size; RoPE for the first row only; q8 codes up to 126 */
    static const int p3[3] = {130, 2, 64};
    int caught = 0, tried = 0;
    for (int kind = 0; kind < K_COUNT; kind++)
        for (int fused = 0; fused < 2; fused++) {
            caught += !decode_case(kind, fused, 128, 2, IB_KV_F16, 16, 32, 3, p3, 0, 3);
            caught += !decode_case(kind, fused, 128, 2, IB_KV_F16, 32, 32, 3, p3, 0, 1);
            tried += 2;
            caught += !decode_case(kind, fused, 128, 2, IB_KV_Q8, 32, 32, 3, p3, 0, 3, 1);
            tried++;
        }
    CHECK(caught == tried, "faults caught in %d of %d steps", caught, tried);
    printf("key blocks of 16 against 32, RoPE of the first row only, q8 codes up to 126 (must differ): %d of %d steps "
           "differ\n", caught, tried);
    TEST_MAIN_END("test_cuda_decode_host");
}
