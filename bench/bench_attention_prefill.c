/*
 * bench_attention_prefill.c — prints (asserts nothing but equal outputs) the time of a prefill's
 * attention for one session and one layer of Qwen3-0.6B's shape (head_dim 128, 8 KV heads, two query
 * heads each, half KV), P rows at positions 0..P-1, one thread, two ways alternating: each row alone
 * (ib_attend_heads_f16_isa, rows outer and KV heads inner, as decode's tasks run) and tiles of
 * IB_ATTN_TILE_Q / 2 rows taking each key block together (ib_attend_rows_isa, KV heads outer, as a
 * prefill's tasks run). Not built by `make`; after `make build/libisobatch.a`:
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -pthread bench/bench_attention_prefill.c \
 *      build/libisobatch.a -lm -pthread -o build/bench_attention_prefill && \
 *      ./build/bench_attention_prefill [P [rounds [isa]]]
 *
 * "ns/pair" is nanoseconds per (row, attended key, KV head).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/half.h"
#include "ops/ops.h"

enum { HD = 128, KVH = 8, NQ = 2, H = KVH * NQ };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int P = argc > 1 ? atoi(argv[1]) : 512, rounds = argc > 2 ? atoi(argv[2]) : 9;
    ib_isa isa = IB_ISA_AUTO;
    if (P < 1 || P > 4096 || rounds < 1 || rounds > 99 || (argc > 3 && ib_isa_parse(argv[3], &isa) != 0)) {
        fprintf(stderr, "bench_attention_prefill: P 1..4096, rounds 1..99, an isa name\n");
        return 2;
    }
    /* kv [KVH][2][P][HD] halves (a head's keys, then its values); q, out [P][H][HD] */
    uint16_t *kv = malloc((size_t)KVH * 2 * P * HD * sizeof(uint16_t));
    float *q = malloc((size_t)P * H * HD * sizeof(float)), *o1 = malloc((size_t)P * H * HD * sizeof(float));
    float *o2 = malloc((size_t)P * H * HD * sizeof(float));
    if (!kv || !q || !o1 || !o2) return 1;
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)KVH * 2 * P * HD; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        kv[i] = ib_f32_to_f16((float)((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0));
    }
    for (size_t i = 0; i < (size_t)P * H * HD; i++) q[i] = (float)(i % 7) * 0.1f - 0.3f;
    const int tile = IB_ATTN_TILE_Q / NQ;
    const float scale = 0.088f;
    double ta[99], tb[99], pairs = (double)P * (P + 1) / 2 * KVH;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (int p = 0; p < P; p++)
            for (int h = 0; h < KVH; h++) {
                const uint16_t *k = kv + (size_t)h * 2 * P * HD, *v = k + (size_t)P * HD;
                ib_attend_heads_f16_isa(isa, k, v, q + ((size_t)p * H + h * NQ) * HD, NQ, p + 1, HD, HD, scale,
                                        IB_ATTN_BLOCK, 0, o1 + ((size_t)p * H + h * NQ) * HD);
            }
        ta[r] = now() - t0;
        t0 = now();
        for (int h = 0; h < KVH; h++)
            for (int p0 = 0; p0 < P; p0 += tile) {
                const uint16_t *k = kv + (size_t)h * 2 * P * HD, *v = k + (size_t)P * HD;
                int nr = P - p0 < tile ? P - p0 : tile, n_keys[IB_ATTN_TILE_Q];
                for (int t = 0; t < nr; t++) n_keys[t] = p0 + t + 1;
                ib_attend_rows_isa(isa, 1, q + ((size_t)p0 * H + h * NQ) * HD, (size_t)H * HD, NQ, nr, n_keys,
                                   k, v, HD, HD, scale, IB_ATTN_BLOCK, 0, o2 + ((size_t)p0 * H + h * NQ) * HD,
                                   (size_t)H * HD);
            }
        tb[r] = now() - t0;
    }
    int same = memcmp(o1, o2, (size_t)P * H * HD * sizeof(float)) == 0;
    for (int r = 0; r < rounds; r++)
        printf("round %d: rows alone %.2f ns/pair, tiles of %d rows %.2f ns/pair\n", r + 1, ta[r] * 1e9 / pairs, tile,
               tb[r] * 1e9 / pairs);
    qsort(ta, (size_t)rounds, sizeof(double), cmp_double);
    qsort(tb, (size_t)rounds, sizeof(double), cmp_double);
    printf("P %d, --isa %s, 1 thread: median rows alone %.2f, tiles %.2f ns/pair (min %.2f, %.2f); outputs %s\n", P, ib_isa_name(isa),
           ta[rounds / 2] * 1e9 / pairs, tb[rounds / 2] * 1e9 / pairs, ta[0] * 1e9 / pairs, tb[0] * 1e9 / pairs,
           same ? "bitwise equal" : "DIFFER");
    free(kv), free(q), free(o1), free(o2);
    return !same;
}
