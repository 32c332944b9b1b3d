// cuda_read_patterns: how fast one GPU reads a 4-bit weight matrix in the access patterns a one-row
// product can use, without the product's arithmetic — the ceiling each layout and each amount of
// loads in flight allows.
//
// A matrix of N outputs and K inputs in groups of 64 (the shapes' MLX 4-bit form): per 32-input chunk
// and output a 16-byte code word, per group and output a float scale and a float bias. Each block
// reads the codes, scales and biases of 32 outputs (a tile), 8 warps, lane = output, the warps taking
// the groups in turn, `inflight` groups a warp at a time (loads issued together, then consumed), and
// folds what it read into one word it writes (so nothing is optimized away). Layouts:
//   strip: the device layout of the CUDA backend (cuda.h): code word (chunk c, output n) at
//          c * N + n, scale and bias (group g, output n) at g * N + n — a tile's bytes are 512-byte
//          (codes) and 128-byte (scales, biases) strips a matrix row apart;
//   tile:  the same words with each tile's bytes contiguous: (tile t, chunk c, lane o) at
//          (t * chunks + c) * 32 + o, scales and biases (t * groups + g) * 32 + o.
// Prints, per shape, layout and loads in flight, the median over REPS timed batches (6 launches
// back to back, each on its own copy of the matrix, so that L2 holds none of them) of the bytes
// read per second.
//
// usage: cuda_read_patterns [REPS]     (nvcc -O3 -arch=sm_90a cuda_read_patterns.cu)
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "cuda_read_patterns: %s: %s\n", #x, cudaGetErrorString(e_));           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { LAYOUT_STRIP, LAYOUT_TILE };

// One tile's read, `IN` groups a warp at a time. w [chunks][N] or [tiles][chunks][32] uint4;
// s, b [groups][N] or [tiles][groups][32] float. out [tiles] one folded word a block.
template <int LAYOUT, int IN>
__global__ void __launch_bounds__(256) read_tile(const uint4 *__restrict__ w, const float *__restrict__ s,
                                                 const float *__restrict__ b, int N, int K, unsigned *out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = blockIdx.x;
    const int groups = K / 64, chunks = K / 32;
    unsigned acc = 0;
    for (int g0 = warp; g0 < groups; g0 += 8 * IN) {
        uint4 c0[IN], c1[IN];
        float sc[IN], bi[IN];
#pragma unroll
        for (int x = 0; x < IN; x++) {
            const int g = g0 + 8 * x;
            if (g >= groups) break;
            size_t i0, i1, is;
            if (LAYOUT == LAYOUT_STRIP) {
                const size_t n = (size_t)t * 32 + lane;
                i0 = (size_t)(2 * g) * N + n, i1 = i0 + N, is = (size_t)g * N + n;
            } else {
                i0 = ((size_t)t * chunks + 2 * g) * 32 + lane, i1 = i0 + 32, is = ((size_t)t * groups + g) * 32 + lane;
            }
            c0[x] = w[i0], c1[x] = w[i1], sc[x] = s[is], bi[x] = b[is];
        }
#pragma unroll
        for (int x = 0; x < IN; x++) {
            if (g0 + 8 * x >= groups) break;
            acc ^= c0[x].x ^ c0[x].y ^ c0[x].z ^ c0[x].w ^ c1[x].x ^ c1[x].y ^ c1[x].z ^ c1[x].w ^
                   __float_as_uint(sc[x]) ^ __float_as_uint(bi[x]);
        }
    }
    __shared__ unsigned red[256];
    red[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned a = 0;
        for (int i = 0; i < 256; i++) a ^= red[i];
        out[t] = a;
    }
}

typedef void (*kern)(const uint4 *, const float *, const float *, int, int, unsigned *);

template <int LAYOUT>
static kern pick(int in) {
    return in == 1 ? read_tile<LAYOUT, 1> : in == 2 ? read_tile<LAYOUT, 2> : in == 4 ? read_tile<LAYOUT, 4>
                                                                                     : read_tile<LAYOUT, 8>;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 30;
    if (reps < 1) {
        fprintf(stderr, "cuda_read_patterns: REPS must be a positive integer\n");
        return 2;
    }
    // qwen3-8b's B=1 products: q/k/v (one grid), o, gate/up (one grid), down
    const struct { const char *name; int N, K; } shapes[] = {
        {"qkv 6144x4096", 6144, 4096}, {"o 4096x4096", 4096, 4096},
        {"gate/up 24576x4096", 24576, 4096}, {"down 4096x12288", 4096, 12288}};
    const int ins[] = {1, 2, 4, 8};
    const int NBUF = 6;   // matrices read in turn: 6 x 16 MB or more exceed the 50 MB L2
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%-20s %-6s %-9s %10s %10s\n", "shape", "layout", "in flight", "MB", "GB/s");
    for (const auto &sh : shapes) {
        const size_t cw = (size_t)(sh.K / 32) * sh.N, sw = (size_t)(sh.K / 64) * sh.N;
        const size_t bytes = cw * 16 + sw * 8;
        std::vector<uint4 *> w(NBUF);
        std::vector<float *> s(NBUF), b(NBUF);
        for (int i = 0; i < NBUF; i++) {
            CK(cudaMalloc(&w[i], cw * 16));
            CK(cudaMalloc(&s[i], sw * 4));
            CK(cudaMalloc(&b[i], sw * 4));
            CK(cudaMemset(w[i], i + 1, cw * 16));
            CK(cudaMemset(s[i], i + 2, sw * 4));
            CK(cudaMemset(b[i], i + 3, sw * 4));
        }
        unsigned *out;
        CK(cudaMalloc(&out, (size_t)sh.N / 32 * 4));
        for (int layout = 0; layout < 2; layout++)
            for (int in : ins) {
                kern k = layout == LAYOUT_STRIP ? pick<LAYOUT_STRIP>(in) : pick<LAYOUT_TILE>(in);
                std::vector<float> gbs;
                for (int r = -1; r < reps; r++) {   // a batch of NBUF launches, one matrix each
                    CK(cudaEventRecord(e0));
                    for (int i = 0; i < NBUF; i++) k<<<sh.N / 32, 256>>>(w[i], s[i], b[i], sh.N, sh.K, out);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 0) gbs.push_back((float)(NBUF * bytes / (ms * 1e6)));
                }
                std::sort(gbs.begin(), gbs.end());
                printf("%-20s %-6s %-9d %10.2f %10.0f\n", sh.name, layout == LAYOUT_STRIP ? "strip" : "tile", in,
                       bytes / 1e6, gbs[gbs.size() / 2]);
            }
        for (int i = 0; i < NBUF; i++) {
            CK(cudaFree(w[i]));
            CK(cudaFree(s[i]));
            CK(cudaFree(b[i]));
        }
        CK(cudaFree(out));
    }
    return 0;
}
