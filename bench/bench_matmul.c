/*
 * bench_matmul.c — prints (asserts nothing) the time of products of B rows (default 1 and 16; the
 * arguments name others: `bench_matmul 1 16 64`) by a 1024 -> 3072 (K = 1024, N = 3072) matrix in Q4
 * and Q8 (group 64) and float32, per supported ISA, activation mode and thread count. Not built by
 * `make`; after `make build/libisobatch.a`:
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -pthread bench/bench_matmul.c build/libisobatch.a \
 *      -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lsqlite3 -lpq -lm -pthread -o build/bench_matmul && ./build/bench_matmul
 *
 * "GB/s" is the matrix's in-memory bytes (packed weights + scales/biases) per second; the
 * matrix is small enough to stay in a large L3, so it can exceed DRAM bandwidth.
 *
 * On a machine shared with other busy processes, `IB_BENCH_SINGLES=N` times N single products
 * instead and keeps the fastest (one product is short enough to often run without being descheduled),
 * `IB_BENCH_ISA=avx2` (any ISA name) leaves the other ISAs out, `IB_BENCH_THREADS=N` makes the second
 * thread count N instead of 2, and `IB_BENCH_K=K` takes K columns instead of 1024.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cpu/cpu.h"
#include "core/pool.h"
#include "ops/matmul.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t st = 12345;
static uint32_t rnd(void) {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(st >> 32);
}

/* Seconds per product: the best of several batches of repetitions, or (singles > 0) the fastest of
 * `singles` products timed one by one. */
static double time_product(const ib_matrix *m, const float *x, int B, const ib_act_buf *q, ib_act act, ib_isa isa,
                           ib_pool *pool, float *y, int singles) {
    ib_matmul(m, x, B, q, act, isa, pool, y, m->rows); /* warm up */
    if (singles > 0) {
        double best = 1e30;
        for (int i = 0; i < singles; i++) {
            double t0 = now();
            ib_matmul(m, x, B, q, act, isa, pool, y, m->rows);
            double t = now() - t0;
            if (t < best) best = t;
        }
        return best;
    }
    int reps = 1;
    for (;;) {
        double t0 = now();
        for (int i = 0; i < reps; i++) ib_matmul(m, x, B, q, act, isa, pool, y, m->rows);
        double t = now() - t0;
        if (t > 0.05) break;
        reps *= 2;
    }
    double best = 1e30;
    for (int trial = 0; trial < 5; trial++) {
        double t0 = now();
        for (int i = 0; i < reps; i++) ib_matmul(m, x, B, q, act, isa, pool, y, m->rows);
        double t = (now() - t0) / reps;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    const char *k_env = getenv("IB_BENCH_K");
    const int K = k_env ? atoi(k_env) : 1024, N = 3072, G = 64;
    if (K < G || K % G != 0 || K > 16384) {
        fprintf(stderr, "bench_matmul: IB_BENCH_K is a multiple of %d in %d..16384, not '%s'\n", G, G, k_env);
        return 2;
    }
    int Bs[16] = {1, 16}, nB = 2, BMAXR = 16;
    if (argc > 1) {
        nB = 0;
        for (int i = 1; i < argc && nB < 16; i++) {
            int b = atoi(argv[i]);
            if (b < 1 || b > 512) {
                fprintf(stderr, "bench_matmul: a batch size is 1..512, not '%s'\n", argv[i]);
                return 2;
            }
            Bs[nB++] = b;
            if (b > BMAXR) BMAXR = b;
        }
    }
    ib_error err;
    ib_matrix mats[3];
    const char *names[3] = {"q4", "q8", "f32"};
    float *scales = malloc(sizeof(float) * N * (K / G)), *biases = malloc(sizeof(float) * N * (K / G));
    uint32_t *wq = malloc(sizeof(uint32_t) * (size_t)N * K / 4);
    float *wf = malloc(sizeof(float) * (size_t)N * K);
    for (int i = 0; i < N * (K / G); i++) {
        scales[i] = 0.01f + (float)(rnd() % 100) * 1e-4f;
        biases[i] = -0.08f;
    }
    for (size_t i = 0; i < (size_t)N * K / 4; i++) wq[i] = rnd();
    for (size_t i = 0; i < (size_t)N * K; i++) wf[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-4f;
    if (ib_matrix_from_mlx(&mats[0], wq, scales, biases, N, K, 4, G, &err) ||
        ib_matrix_from_mlx(&mats[1], wq, scales, biases, N, K, 8, G, &err) ||
        ib_matrix_from_f32(&mats[2], wf, N, K, &err)) {
        fprintf(stderr, "bench_matmul: %s\n", err.msg);
        return 1;
    }
    float *x = malloc(sizeof(float) * BMAXR * K), *y = malloc(sizeof(float) * (size_t)BMAXR * N);
    for (int i = 0; i < BMAXR * K; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    int8_t *xq = malloc((size_t)BMAXR * K);
    float *d = malloc(sizeof(float) * BMAXR * (K / G)), *ad = malloc(sizeof(float) * BMAXR * (K / G));
    ib_quantize_act(x, BMAXR, K, G, xq, d, ad);
    ib_act_buf q = {xq, d, ad};
    ib_pool *pool2 = NULL;
    const char *threads_env = getenv("IB_BENCH_THREADS");
    const int threads_asked = threads_env ? atoi(threads_env) : 0, nthr = threads_asked > 1 ? threads_asked : 2;
    if (ib_pool_create(nthr, &pool2, &err)) {
        fprintf(stderr, "bench_matmul: %s\n", err.msg);
        return 1;
    }

    const char *singles_env = getenv("IB_BENCH_SINGLES"), *isa_env = getenv("IB_BENCH_ISA");
    const int singles = singles_env ? atoi(singles_env) : 0;
    ib_isa only = IB_ISA_AUTO;
    if (isa_env && ib_isa_parse(isa_env, &only)) {
        fprintf(stderr, "bench_matmul: IB_BENCH_ISA: no ISA '%s'\n", isa_env);
        return 2;
    }
    printf("matrix K=%d -> N=%d, group %d; times per product%s\n", K, N, G,
           singles > 0 ? " (fastest of single products)" : "");
    printf("%-7s %-4s %-4s %3s %3s %10s %9s %9s\n", "isa", "w", "act", "B", "thr", "us", "GB/s", "GMAC/s");
    for (int isa = IB_ISA_SCALAR; isa <= IB_ISA_AMX; isa++) {
        if (!ib_isa_supported((ib_isa)isa) || (only != IB_ISA_AUTO && isa != (int)only)) continue;
        for (int mi = 0; mi < 3; mi++)
            for (int act = IB_ACT_F32; act <= IB_ACT_Q8; act++) {
                if (act == IB_ACT_Q8 && mats[mi].fmt == IB_WF32) continue;
                for (int bi = 0; bi < nB; bi++)
                    for (int th = 1; th <= 2; th++) {
                        int B = Bs[bi];
                        double t = time_product(&mats[mi], x, B, &q, (ib_act)act, (ib_isa)isa, th == 2 ? pool2 : NULL, y,
                                                singles);
                        printf("%-7s %-4s %-4s %3d %3d %10.1f %9.2f %9.2f\n", ib_isa_name((ib_isa)isa), names[mi],
                               act == IB_ACT_Q8 ? "q8" : "f32", B, th == 2 ? nthr : 1, t * 1e6, (double)mats[mi].bytes / t * 1e-9,
                               (double)B * N * K / t * 1e-9);
                    }
            }
    }
    for (int i = 0; i < 3; i++) ib_matrix_free(&mats[i]);
    ib_pool_free(pool2);
    free(scales);
    free(biases);
    free(wq);
    free(wf);
    free(x);
    free(y);
    free(xq);
    free(d);
    free(ad);
    return 0;
}
