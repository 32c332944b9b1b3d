/*
 * test_cuda_tile_host.cc — the CUDA backend's prompt tile attention (attention_tile_kernel,
 * src/backends/cuda/attention_tile.cuh) run on the host through tests/cuda_host_shim.h (a block's 256
 * threads as coroutines), against the scalar reference (ib_attend_heads_kv with --isa scalar's copy),
 * bitwise: so its order of operations and its indexing are checked on every machine, GPU or not. Head
 * dims 16, 32, 64 and 128; 1, 2 and 4 query heads a KV head; 4 or 2 vectors a warp (the two instantiations); float, half and q8 caches (q8: head dims 64
 * and 128, key blocks of 32); key blocks of 32 and 16; tiles that start at, before and after a key block's start, of 1, 3
 * and the most rows a tile holds; each (row, head) output also quantized for a product (group 32),
 * compared with ib_quantize_act of the reference's outputs. A kernel that cuts its key blocks at half
 * the reference's size (another sequence of online-softmax rescales: the gpu-att-block fault's change)
 * must differ. The device tests (test_backend_cuda) run the same kernel on a GPU.
 */
#include "cuda_host_shim.h"

#include "backends/cuda/attention_limits.cuh"
#include "backends/cuda/rowinfo.cuh"
#include "backends/cuda/kv_element.cuh"
#include "backends/cuda/quantize_group.cuh"
#include "backends/cuda/attention_tile.cuh"

extern "C" {
#include "check.h"
#include "test_rng.h"
#include "ops/matmul.h"
#include "ops/ops.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <vector>

/* ---------------------------------------------------------------- one case */


struct launch {
    int vw;   /* vectors a warp: the kernel instantiation */
    const float *Q;
    float *ATT;
    const rowinfo *ri;
    const att_tile *tiles;
    int H, KVH, hd, block, qG;
    float scale;
    int8_t *xq;
    float *qd, *qad;
};

static void tile_block(void *p) {
    const launch *l = (const launch *)p;
    (l->vw == 2 ? attention_tile_kernel<2> : attention_tile_kernel<4>)(l->Q, l->ATT, l->ri, l->tiles, l->H, l->KVH, l->hd, 0, l->scale, l->block, l->qG, l->xq, l->qd,
                          l->qad);
}

/* One tile of n rows at positions p0 .. p0 + n - 1 of a session (two KV heads of G query heads, head
 * dim hd, a float or half cache of one layer), the kernel's key block `block`, the reference's `ref_block`;
 * qG > 0: the outputs also quantized for that group. Returns whether every output (and code, scale and
 * offset) equals the reference's bitwise. */
static int tile_case(int hd, int G, int kvt, int block, int ref_block, int p0, int n, int qG, bool ties = false,
                     int vw = 4) {
    const int KVH = 2, H = G * KVH, cap = p0 + n + 3;
    const ib_kv_dtype t = (ib_kv_dtype)kvt;
    const size_t plane = (size_t)cap * hd, W = (size_t)n * H * hd;
    std::vector<unsigned char> kv(ib_kv_bytes(t, 2 * KVH * plane));
    std::vector<float> x(2 * KVH * plane);
    for (size_t i = 0; i < x.size(); i++)
        x[i] = ties ? (float)(int)(rndf() * 2.5f) : rndf() * (i % 7 == 0 ? 6.0f : 1.0f);
    if (t == IB_KV_Q8) ib_kvq8_encode_row(x.data(), (int)x.size(), kv.data());
    for (size_t i = 0; i < x.size() && t != IB_KV_Q8; i++) {
        if (t == IB_KV_F16) ((uint16_t *)kv.data())[i] = ib_f32_to_f16(x[i]);
        else ((float *)kv.data())[i] = x[i];
    }
    std::vector<float> Q(W), got(W, 0.0f), want(W);
    for (float &x : Q) x = ties ? (float)(int)(rndf() * 2.5f) : rndf() * 3.0f;
    std::vector<int8_t> xq(W), rq(W);
    std::vector<float> qd(W), qad(W), rd(W), rad(W);
    std::vector<rowinfo> ri(n);
    for (int i = 0; i < n; i++) ri[i] = rowinfo{kv.data(), cap, 0, 0, kvt, p0 + i, 0, 0, 0};
    const att_tile tl = {0, n};
    const float scale = 1.0f / sqrtf((float)hd);
    launch l = {vw, Q.data(), got.data(), ri.data(), &tl, H, KVH, hd, block, qG, scale, xq.data(), qd.data(), qad.data()};
    if (tile_smem_bytes(hd) > sizeof cuda_host_dyn_smem) return 0;
    for (int kvh = 0; kvh < KVH; kvh++) cuda_host_run_block((unsigned)kvh, 0, ATT_THREADS, tile_block, &l);
    for (int i = 0; i < n; i++)
        for (int kvh = 0; kvh < KVH; kvh++) {
            const unsigned char *kp = kv.data() + ib_kv_bytes(t, (size_t)kvh * plane);
            const unsigned char *vp = kv.data() + ib_kv_bytes(t, (size_t)(KVH + kvh) * plane);
            const float *q = Q.data() + ((size_t)i * H + (size_t)kvh * G) * hd;
            float *o = want.data() + ((size_t)i * H + (size_t)kvh * G) * hd;
            ib_attend_heads_kv_isa(IB_ISA_SCALAR, t, kp, vp, q, G, p0 + i + 1, hd, hd, scale, ref_block, 0, o);
        }
    int same = memcmp(want.data(), got.data(), W * sizeof(float)) == 0;
    if (qG > 0) {
        const size_t ng = W / (size_t)qG;
        ib_quantize_act(want.data(), n, H * hd, qG, rq.data(), rd.data(), rad.data());
        same = same && memcmp(rq.data(), xq.data(), W) == 0 && memcmp(rd.data(), qd.data(), ng * 4) == 0 &&
               memcmp(rad.data(), qad.data(), ng * 4) == 0;
    }
    return same;
}

int main(void) {
    static const int hds[] = {16, 32, 64, 128}, Gs[] = {1, 2, 4}, blocks[] = {32, 16}, p0s[] = {0, 29, 100};
    int cases = 0, differ = 0;
    for (int vw : {4, 2})   /* vectors a warp: tiles of up to 32 or 16 vectors */
        for (int hd : hds)
            for (int G : Gs)
                for (int kvt = 0; kvt < IB_KV_DTYPE_COUNT; kvt++)
                    for (int block : blocks)
                        for (int p0 : p0s) {
                            const int most = 8 * vw / G < TILE_ROWS ? 8 * vw / G : TILE_ROWS;
                            const int ns[] = {1, 3, most};
                            for (int n : ns) {
                                if (kvt == IB_KV_Q8 && (hd % IB_KVQ8_BLOCK || block != 32)) continue;   /* q8: fewer, for time */
                                if (vw == 2 && (hd == 32 || hd == 64 || p0 == 29)) continue;          /* 2 a warp: fewer */
                                const int qG = hd >= 32 && cases % 2 == 0 ? 32 : 0;
                                const int ok = tile_case(hd, G, kvt, block, block, p0, n, qG, false, vw);
                                CHECK(ok, "%d vectors a warp, hd %d, %d heads a KV head, %s KV, key block %d, rows %d..%d%s: "
                                      "tile attention differs from the scalar reference", vw, hd, G,
                                      kvt == IB_KV_Q8 ? "q8" : kvt ? "half" : "float", block, p0, p0 + n - 1,
                                      qG ? ", quantized" : "");
                                cases++, differ += !ok;
                            }
                        }
    printf("%d tiles against the scalar reference: %d differ\n", cases, differ);
    /* small integers: exact scores, many of them negative and tied within a key block (the block
     * maximum's order-keeping integer image and its choice among equal lanes) */
    int tdiff = 0;
    for (int G : Gs)
        for (int kvt = 0; kvt < IB_KV_DTYPE_COUNT; kvt++) {
            const int ok = tile_case(128, G, kvt, 32, 32, 29, TILE_QV / G < TILE_ROWS ? TILE_QV / G : TILE_ROWS, 32, true) &&
                           tile_case(128, G, kvt, 32, 32, 29, 16 / G, 32, true, 2);
            CHECK(ok, "tied scores, %d heads a KV head, KV type %d: tile attention differs from the scalar reference", G, kvt);
            tdiff += !ok;
        }
    printf("tiles of tied integer scores against the scalar reference: %d differ\n", tdiff);
    /* the fault: key blocks of half the reference's size must change the bits */
    int caught = 0, tried = 0;
    for (int kvt = 0; kvt < IB_KV_DTYPE_COUNT; kvt++)
        for (int G : Gs) {
            caught += !tile_case(128, G, kvt, 16, 32, 100, TILE_QV / G < TILE_ROWS ? TILE_QV / G : TILE_ROWS, 0);
            caught += !tile_case(128, G, kvt, 16, 32, 100, 16 / G, 0, false, 2);
            tried += 2;
        }
    CHECK(caught == tried, "key blocks of 16 against the reference's 32: %d of %d tiles differ", caught, tried);
    printf("key blocks of 16 against the reference's 32 (must differ): %d of %d tiles differ\n", caught, tried);
    TEST_MAIN_END("test_cuda_tile_host");
}
