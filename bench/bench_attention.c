/*
 * bench_attention.c — prints (asserts nothing) the time of decode attention per key and KV head, the
 * shape of a Qwen3-0.6B layer (head_dim 128, two query heads per KV head, 8 KV heads), for each
 * attention copy this CPU runs and float32 / float16 / q8 KV, with the keys either in cache (8 sessions'
 * planes, a few MB) or streamed from memory (448 planes, as 16 sessions x 28 layers: ~290 MB in f16), the
 * latter also with each call asking for the next plane's rows ahead (ib_attend_heads_ahead, as the CPU
 * backend's decode tasks do).
 * One thread. Not built by `make`; after `make build/libisobatch.a`:
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -pthread bench/bench_attention.c build/libisobatch.a \
 *      -lm -pthread -o build/bench_attention && ./build/bench_attention [n_keys]
 *
 * "GB/s" counts the key and value bytes read (n_keys rows of each per KV head).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/half.h"
#include "core/kv_elem.h"
#include "ops/ops.h"

enum { HD = 128, KVH = 8, NQ = 2, CAP = 512 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of `reps` passes over n_planes planes x KVH heads of KV type t, seconds per pass; ahead: each
 * call also asks for the next (plane, head)'s keys and values (ib_attend_heads_ahead, as the CPU backend's
 * decode tasks do), else none. */
static double time_pass(ib_isa isa, ib_kv_dtype t, void *kv, int n_planes, int n_keys, int reps, const float *q,
                        float *out, int ahead) {
    const size_t plane = ib_kv_bytes(t, (size_t)CAP * HD);  /* bytes of one head's K (or V) */
    const size_t rows = ib_kv_bytes(t, (size_t)n_keys * HD);  /* the bytes of them a call reads */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int p = 0; p < n_planes; p++)
            for (int h = 0; h < KVH; h++) {
                const size_t i = (size_t)p * KVH + h, nx = (i + 1) % ((size_t)n_planes * KVH);
                char *k = (char *)kv + i * 2 * plane, *v = k + plane;
                const ib_attn_ahead next = {(char *)kv + nx * 2 * plane, (char *)kv + nx * 2 * plane + plane, rows};
                ib_attend_heads_ahead_isa(isa, t, k, v, q, NQ, n_keys, HD, HD, 0.088f, IB_ATTN_BLOCK, 0, out,
                                          ahead ? &next : NULL);
            }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    int n_keys = argc > 1 ? atoi(argv[1]) : 150;
    if (n_keys < 1 || n_keys > CAP) {
        fprintf(stderr, "bench_attention: n_keys must be 1..%d\n", CAP);
        return 2;
    }
    const int big = 448, small = 8;
    const size_t n = (size_t)big * KVH * 2 * CAP * HD;   /* elements of all planes */
    float *kf = malloc(n * sizeof(float));
    uint16_t *kh = malloc(n * sizeof(uint16_t));
    unsigned char *kq = malloc(ib_kv_bytes(IB_KV_Q8, n));
    if (!kf || !kh || !kq) {
        fprintf(stderr, "bench_attention: out of memory\n");
        return 1;
    }
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        kf[i] = (float)((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        kh[i] = ib_f32_to_f16(kf[i]);
    }
    for (size_t r = 0; r < n / HD; r++) ib_kvq8_encode_row(kf + r * HD, HD, kq + ib_kv_bytes(IB_KV_Q8, r * HD));
    float q[NQ * HD], out[NQ * HD];
    for (int i = 0; i < NQ * HD; i++) q[i] = (float)(i % 7) * 0.1f - 0.3f;
    static const ib_isa isas[] = {IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512};
    printf("decode attention, %d keys, head_dim %d, %d query heads per KV head, 1 thread\n", n_keys, HD, NQ);
    printf("%-8s %-4s %-12s %10s %10s\n", "isa", "kv", "keys", "ns/key/kvh", "GB/s");
    for (int ii = 0; ii < 3; ii++) {
        if (!ib_isa_supported(isas[ii])) continue;
        for (int t = IB_KV_F32; t < IB_KV_DTYPE_COUNT; t++)
            for (int mode = 0; mode < 3; mode++) {   /* in cache; from memory; from memory, the next asked ahead */
                const int mem = mode > 0, planes = mem ? big : small, reps = mem ? 3 : 50;
                void *kv = t == IB_KV_Q8 ? (void *)kq : t == IB_KV_F16 ? (void *)kh : (void *)kf;
                double dt = time_pass(isas[ii], (ib_kv_dtype)t, kv, planes, n_keys, reps, q, out, mode == 2);
                double keys = (double)planes * KVH * n_keys, bytes = keys * 2 * ib_kv_bytes((ib_kv_dtype)t, HD);
                printf("%-8s %-4s %-12s %10.1f %10.1f\n", ib_isa_name(isas[ii]), ib_kv_dtype_name((ib_kv_dtype)t),
                       mode == 0 ? "cache" : mode == 1 ? "memory" : "memory+ahead", dt * 1e9 / keys, bytes / dt * 1e-9);
            }
    }
    free(kf);
    free(kh);
    free(kq);
    return 0;
}
