/*
 * cuda.h — the CUDA backend's private layout and the few entry points beside its table
 * (ib_backend_cuda, declared in backends/backend.h when the build has IB_HAVE_CUDA).
 *
 * DEVICE LAYOUT OF A MATRIX W[N][K] (repacked at create from the CPU panels of backends/cpu/pack.h;
 * N is padded to Np, a multiple of 32, with zero rows):
 *   Q4: uint4 [K/32][Np]: the 4 words of (c, n) cover k = 32c .. 32c+31, word i k = 32c+8i .. +7,
 *       its low nibbles (bytes 0..3) k..k+3 and its high nibbles k+4..k+7 (a CPU panel's lane dword);
 *   Q8: uint4 [K/16][Np]: word i of (c, n) holds codes k = 16c+4i .. +3, one byte each;
 *   F32: float [K][Np];
 *   scales and biases (quantized): float [K/G][Np] each (exact: the stored bf16/f16/f32 values).
 * One warp's 32 lanes own 32 consecutive outputs n, so every weight load is coalesced, and each
 * output's arithmetic is the one of ops/matmul.h whatever thread computes it.
 *
 * KV caches: device memory laid out as ib_kv_desc says ([n_layers][2][KVH][capacity][hd], float or
 * IEEE half), so a cache can be compared with the CPU's byte for byte.
 */
#ifndef IB_BACKENDS_CUDA_CUDA_H
#define IB_BACKENDS_CUDA_CUDA_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One line naming the device the backend would use ("NVIDIA H200, 132 SMs, sm_90"), or why none;
 * written into buf (n bytes). Returns 1 when a usable device is present. */
int ib_cuda_describe(char *buf, size_t n);

/* Copy `bytes` of a CUDA KV cache's device storage into host memory dst (tests compare caches). */
int ib_cuda_kv_read(const void *kv, void *dst, size_t bytes);

/* The GPU's read bandwidth now, in bytes per second: one timed pass of a streaming kernel over a 1 GiB
 * device buffer read four times (the buffer is made on the first call and kept for the process; not
 * thread-safe: for `isobatch bench`). 0 when no device or memory. */
double ib_cuda_read_bandwidth(void);

/* Start (1) or stop (0) the profiler's collection (ncu --profile-from-start off). */
void ib_cuda_profile(int on);

#ifdef __cplusplus
}
#endif
#endif
