/*
 * cuda_host_shim.h — just enough of CUDA to run the backend's kernels on the host, for the tests that
 * check their arithmetic and indexing where no GPU is (tests/test_cuda_*_host.cc): the names of
 * src/backends/cuda/device_primitives.cuh (PDL, prefetches, cp.async, clusters, dp4a, mma.sync, dynamic
 * shared memory) with host meanings, the CUDA types and intrinsics the kernels use, and
 * cuda_host_run_block, which runs one block: its threads (up to 1,024) are coroutines of one host
 * thread (ucontext) switched at barriers only — __syncthreads waits for the block's threads, __syncwarp
 * for the warp's, a shuffle or an mma passes values through per-warp slots between two warp barriers.
 * A static __shared__ is one instance for the block; cp.async copies at once; prefetches do nothing; a
 * cluster is the one block; halves convert by half.h. A barrier that not every thread of its block or
 * warp reaches stops the run with a message (a kernel's divergent barrier). The arithmetic is the
 * host's IEEE single precision, built without contraction (-ffp-contract=off), as the device build
 * (-fmad=false). What this cannot show: timing, races between threads that skip a barrier, register or
 * shared-memory limits, the GPU's NaN bits — the device tests do.
 */
#ifndef IB_TESTS_CUDA_HOST_SHIM_H
#define IB_TESTS_CUDA_HOST_SHIM_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "core/fmath.h"
#include "core/half.h"
}

#define __device__
#define __host__
#define __global__
#define __shared__ static   /* one instance for the block: its threads are coroutines of one thread */
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define IB_BACKENDS_CUDA_DEVICE_PRIMITIVES_CUH   /* this file gives device_primitives.cuh's names */
#define PDL_ENTER() \
    do {            \
    } while (0)

struct cuda_host_idx {
    unsigned x, y, z;
};
static cuda_host_idx threadIdx, blockIdx, blockDim;   /* threadIdx: the running coroutine's */
[[maybe_unused]] static cuda_host_idx gridDim = {1, 1, 1};   /* the caller sets it for kernels that read it */
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct float2 {
    float x, y;
};
struct int2 {
    int x, y;
};
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct __half {
    uint16_t b;
};
struct __half2 {
    uint16_t x, y;
};
static inline __half __ushort_as_half(uint16_t u) { return __half{u}; }
static inline float __half2float(__half h) { return ib_f16_to_f32(h.b); }
static inline float2 __half22float2(__half2 h) { return float2{ib_f16_to_f32(h.x), ib_f16_to_f32(h.y)}; }
static inline void __threadfence() {}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
/* one emulated block runs at a time and its threads switch only at barriers: a plain add is atomic */
static inline float atomicAdd(float *p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
/* the sum of the four byte products of a and b (signed bytes; dp4a_us: a's unsigned) plus c */
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline int dp4a_us(unsigned a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(uint8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
template <class T>
static inline T __ldcg(const T *p) { return *p; }
template <class T>
static inline void __stcg(T *p, T v) { *p = v; }
static inline int atomicAdd(int *p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
static inline int atomicMax(int *p, int v) {
    const int old = *p;
    if (v > old) *p = v;
    return old;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define CUDA_HOST_THREADS 1024  /* most threads of an emulated block (its warps: CUDA_HOST_THREADS / 32) */
#define CUDA_HOST_STACK (64 * 1024)
enum { CUDA_HOST_READY, CUDA_HOST_WAITING, CUDA_HOST_DONE };
static struct {
    ucontext_t main, th[CUDA_HOST_THREADS];
    unsigned char *stacks;
    int state[CUDA_HOST_THREADS];
    int arrived[1 + CUDA_HOST_THREADS / 32];   /* barrier 0: the block's; 1 + w: warp w's */
    void (*fn)(void *);
    void *ctx;
} cuda_host;
static uint64_t cuda_host_slot[CUDA_HOST_THREADS / 32][32];

/* This thread arrives at barrier b (of n threads) and yields; the last to arrive releases them all. */
static inline void cuda_host_barrier(int b, int n) {
    const int t = (int)threadIdx.x;
    cuda_host.state[t] = CUDA_HOST_WAITING;
    if (++cuda_host.arrived[b] == n) {
        cuda_host.arrived[b] = 0;
        const int lo = b == 0 ? 0 : (b - 1) * 32, hi = b == 0 ? (int)blockDim.x : lo + 32;
        for (int i = lo; i < hi; i++) cuda_host.state[i] = CUDA_HOST_READY;
    }
    swapcontext(&cuda_host.th[t], &cuda_host.main);
}
static inline void __syncthreads() { cuda_host_barrier(0, (int)blockDim.x); }
static inline void __syncwarp(unsigned = 0xffffffffu) { cuda_host_barrier(1 + (int)(threadIdx.x >> 5), 32); }

/* v of lane src (of this thread's warp); every lane of the warp calls it. */
template <class T>
static inline T cuda_host_lane_value(T v, int src) {
    const int w = (int)threadIdx.x >> 5, l = (int)threadIdx.x & 31;
    memcpy(&cuda_host_slot[w][l], &v, sizeof v);
    __syncwarp();
    T r;
    memcpy(&r, &cuda_host_slot[w][src & 31], sizeof r);
    __syncwarp();
    return r;
}
template <class T>
static inline T __shfl_sync(unsigned, T v, int src) {
    return cuda_host_lane_value(v, src);
}
template <class T>
static inline T __shfl_xor_sync(unsigned, T v, int m) {
    return cuda_host_lane_value(v, ((int)threadIdx.x & 31) ^ m);
}
/* lane - d within the lane's segment of `width` lanes, else the lane's own value */
template <class T>
static inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
    const int l = (int)threadIdx.x & 31, src = l - (int)d;
    const T r = cuda_host_lane_value(v, src < 0 ? l : src);
    return (src >= 0 && src / width == l / width) ? r : v;
}
/* lane + d within the lane's segment of `width` lanes, else the lane's own value */
template <class T>
static inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    const int l = (int)threadIdx.x & 31, src = l + (int)d;
    const T r = cuda_host_lane_value(v, src);
    return (src / width == l / width && src < 32) ? r : v;
}

/* every lane's v of this thread's warp into all[32] (every lane calls it) */
static inline void cuda_host_lane_all(int v, int (&all)[32]) {
    const int w = (int)threadIdx.x >> 5, l = (int)threadIdx.x & 31;
    memcpy(&cuda_host_slot[w][l], &v, sizeof v);
    __syncwarp();
    for (int src = 0; src < 32; src++) memcpy(&all[src], &cuda_host_slot[w][src], sizeof v);
    __syncwarp();
}
/* the warp's largest v (every lane calls it) */
static inline int __reduce_max_sync(unsigned, int v) {
    int all[32], m = v;
    cuda_host_lane_all(v, all);
    for (int x : all) m = x > m ? x : m;
    return m;
}
/* bit L set where lane L's p is nonzero (every lane calls it) */
static inline unsigned __ballot_sync(unsigned, int p) {
    int all[32];
    unsigned r = 0;
    cuda_host_lane_all(p != 0, all);
    for (int src = 0; src < 32; src++) r |= (all[src] ? 1u : 0u) << src;
    return r;
}
static inline int __ffs(unsigned x) { return x ? __builtin_ffs((int)x) : 0; }
static inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, sizeof i);
    return i;
}

/* device_primitives.cuh's names: prefetches are hints (nothing here), cp.async copies at once, a
 * cluster is the one block (its rank 0, its barriers nothing, its shared memory this block's). */
static inline void prefetch_l2(const void *) {}
static inline void prefetch_l1(const void *) {}
static inline void prefetch_bytes(const void *, size_t) {}
/* d += a · b for one m16n8k32 tile of 8-bit integers, a warp's fragments as mma.sync's: lane L (g = L / 4,
 * t = L % 4) holds a's rows g and g + 8 at k 4t..4t+3 (a[0], a[1]) and 16 + 4t.. (a[2], a[3]), b's
 * column g at k 4t.. (b0) and 16 + 4t.. (b1), d's rows g, g + 8 at columns 2t, 2t + 1 (d[0..3]); AU / BU:
 * a / b unsigned bytes. Every lane of the warp calls it. */
static unsigned cuda_host_mma_frag[CUDA_HOST_THREADS / 32][32][6];
template <bool AU, bool BU>
static inline void mma_i8(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int w = (int)threadIdx.x >> 5, l = (int)threadIdx.x & 31, g = l >> 2, t = l & 3;
    unsigned *f = cuda_host_mma_frag[w][l];
    f[0] = a[0], f[1] = a[1], f[2] = a[2], f[3] = a[3], f[4] = b0, f[5] = b1;
    __syncwarp();
    for (int e = 0; e < 4; e++) {
        const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        int sum = 0;
        for (int k = 0; k < 32; k++) {
            const unsigned aw = cuda_host_mma_frag[w][(row & 7) * 4 + (k & 15) / 4][(row >= 8) + 2 * (k >= 16)];
            const unsigned bw = cuda_host_mma_frag[w][col * 4 + (k & 15) / 4][4 + (k >= 16)];
            const unsigned ab = (aw >> (8 * (k & 3))) & 0xffu, bb = (bw >> (8 * (k & 3))) & 0xffu;
            sum += (AU ? (int)ab : (int)(int8_t)ab) * (BU ? (int)bb : (int)(int8_t)bb);
        }
        d[e] += sum;
    }
    __syncwarp();
}

/* ldmatrix .x4 as device_primitives.cuh's: lane L gives the address of row L % 8 of matrix L / 8 and
 * receives in r[i] the 4 bytes at row L / 4, bytes 4 (L % 4).. of matrix i. Every lane of the warp calls it. */
static const unsigned char *cuda_host_ldsm_row[CUDA_HOST_THREADS / 32][32];
static inline void ldmatrix_x4(unsigned (&r)[4], const void *p) {
    const int w = (int)threadIdx.x >> 5, l = (int)threadIdx.x & 31;
    cuda_host_ldsm_row[w][l] = (const unsigned char *)p;
    __syncwarp();
    for (int i = 0; i < 4; i++) memcpy(&r[i], cuda_host_ldsm_row[w][8 * i + l / 4] + 4 * (l % 4), 4);
    __syncwarp();
}

static inline void cp_async16(void *dst, const void *src) { memcpy(dst, src, 16); }
static inline void cp_async4(void *dst, const void *src) { memcpy(dst, src, 4); }
static inline void cp_commit() {}
template <int N>
static inline void cp_wait() {}
static inline int cluster_rank() { return 0; }
static inline void cluster_arrive() {}
static inline void cluster_wait() {}
static inline float ld_cluster(const float *p, int) { return *p; }
alignas(16) static unsigned char cuda_host_dyn_smem[256 * 1024];   /* a block's dynamic shared memory */
#define DYN_SHARED(T, name) T *const name = (T *)cuda_host_dyn_smem
#define DYN_SHARED_ALIGNED(T, name) T *const name = (T *)cuda_host_dyn_smem

static void cuda_host_entry(void) {
    cuda_host.fn(cuda_host.ctx);
    cuda_host.state[threadIdx.x] = CUDA_HOST_DONE;
    swapcontext(&cuda_host.th[threadIdx.x], &cuda_host.main);
}

/* Run fn(ctx) as block (bx, by) of nt threads (a multiple of 32, at most CUDA_HOST_THREADS): each runs
 * until its next barrier, in thread order, until all have returned. Exits the program when threads wait
 * at a barrier no other thread can reach. */
static void cuda_host_run_block_z(unsigned bx, unsigned by, unsigned bz, int nt, void (*fn)(void *), void *ctx);
static inline void cuda_host_run_block(unsigned bx, unsigned by, int nt, void (*fn)(void *), void *ctx) {
    cuda_host_run_block_z(bx, by, 0, nt, fn, ctx);
}
/* cuda_host_run_block for block (bx, by, bz). */
static void cuda_host_run_block_z(unsigned bx, unsigned by, unsigned bz, int nt, void (*fn)(void *), void *ctx) {
    if (!cuda_host.stacks && !(cuda_host.stacks = (unsigned char *)malloc((size_t)CUDA_HOST_THREADS * CUDA_HOST_STACK))) {
        fprintf(stderr, "cuda_host_run_block: out of memory for the threads' stacks\n");
        exit(1);
    }
    blockIdx = cuda_host_idx{bx, by, bz}, blockDim = cuda_host_idx{(unsigned)nt, 1, 1};
    cuda_host.fn = fn, cuda_host.ctx = ctx;
    memset(cuda_host.arrived, 0, sizeof cuda_host.arrived);
    for (int t = 0; t < nt; t++) {
        getcontext(&cuda_host.th[t]);
        cuda_host.th[t].uc_stack.ss_sp = cuda_host.stacks + (size_t)t * CUDA_HOST_STACK;
        cuda_host.th[t].uc_stack.ss_size = CUDA_HOST_STACK;
        cuda_host.th[t].uc_link = NULL;
        makecontext(&cuda_host.th[t], cuda_host_entry, 0);
        cuda_host.state[t] = CUDA_HOST_READY;
    }
    for (;;) {
        int ran = 0, done = 0;
        for (int t = 0; t < nt; t++) {
            if (cuda_host.state[t] == CUDA_HOST_DONE) done++;
            if (cuda_host.state[t] != CUDA_HOST_READY) continue;
            threadIdx = cuda_host_idx{(unsigned)t, 0, 0}, ran = 1;
            swapcontext(&cuda_host.main, &cuda_host.th[t]);
        }
        if (done == nt) return;
        if (!ran) {
            fprintf(stderr, "cuda_host_run_block: block %u: threads wait at a barrier the others do not reach\n", bx);
            exit(1);
        }
    }
}

/* Run body() (a callable) as every block of grid (gx, gy, gz) of nt threads, gridDim set for the kernels
 * that read it. */
template <class F>
static void cuda_host_grid(unsigned gx, unsigned gy, unsigned gz, int nt, F &body) {
    gridDim = cuda_host_idx{gx, gy, gz};
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) cuda_host_run_block_z(x, y, z, nt, [](void *p) { (*(F *)p)(); }, &body);
}

#endif
