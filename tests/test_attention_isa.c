/*
 * test_attention_isa.c — the attention copies (portable, AVX2, AVX-512: attention_impl.h) give the
 * same bits on fresh random inputs, and half KV gives the bits of float KV holding its exact values
 * (the contract of ib_attend_heads_f16; on aarch64 this checks the NEON half conversion): float and
 * half KV, 1..16 query heads, head sizes with and without
 * a tail, key counts around the block edges, windows, blocks of 16 and 32, and a stride wider than
 * the head. The isa-fma fault (the vector copies fuse the dot products' multiply-adds) must make the
 * comparison fail on every vector copy this CPU runs. Several rows of one session taking key blocks
 * together (ib_attend_rows) give each row's single-row bits, and the attn-tile-range fault (a tile's
 * rows attend its last row's keys) must make that comparison fail.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/half.h"
#include "ops/ops.h"
#include "test_rng.h"

enum { MAX_KEYS = 300, MAX_HD = 136, MAX_Q = 16 };

static float kf[MAX_KEYS * (MAX_HD + 8)], vf[MAX_KEYS * (MAX_HD + 8)], q[MAX_Q * MAX_HD];
static uint16_t kh[MAX_KEYS * (MAX_HD + 8)], vh[MAX_KEYS * (MAX_HD + 8)];
static float ref[MAX_Q * MAX_HD], got[MAX_Q * MAX_HD];

/* Count the cases where the copy for isa differs from the portable one (both KV types). */
static int compare_isa(ib_isa isa, int *cases) {
    static const int nqs[] = {1, 2, 3, 16}, hds[] = {64, 128, 72, 136}, keys[] = {1, 15, 32, 33, 150, 300};
    int bad = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 6; c++)
                for (int w = 0; w < 3; w++) {
                    int nq = nqs[a], hd = hds[b], nk = keys[c], stride = hd + (b & 1) * 8;
                    int window = w == 0 ? 0 : w == 1 ? 40 : 1 + rndi(60), block = (c & 1) ? 16 : 32;
                    float scale = 1.0f / sqrtf((float)hd);
                    /* float KV = the exact values of the half KV, so the two kinds must agree too */
                    for (int i = 0; i < nk * stride; i++) {
                        kh[i] = ib_f32_to_f16(2 * rndf()), vh[i] = ib_f32_to_f16(rndf());
                        kf[i] = ib_f16_to_f32(kh[i]), vf[i] = ib_f16_to_f32(vh[i]);
                    }
                    for (int i = 0; i < nq * hd; i++) q[i] = 3 * rndf();
                    ib_attend_heads_portable(q, nq, kf, vf, nk, stride, hd, scale, block, window, ref);
                    ib_attend_heads_isa(isa, q, nq, kf, vf, nk, stride, hd, scale, block, window, got);
                    bad += memcmp(ref, got, sizeof(float) * (size_t)(nq * hd)) != 0;
                    ib_attend_heads_f16_isa(isa, kh, vh, q, nq, nk, stride, hd, scale, block, window, got);
                    bad += memcmp(ref, got, sizeof(float) * (size_t)(nq * hd)) != 0;
                    ib_attend_heads_f16_portable(kh, vh, q, nq, nk, stride, hd, scale, block, window, got);
                    bad += memcmp(ref, got, sizeof(float) * (size_t)(nq * hd)) != 0;
                    *cases += 3;
                }
    return bad;
}

/* Count the rows where ib_attend_rows_isa (isa) differs from the portable single-row copy: tiles of
 * nr rows of one session at consecutive positions p0..p0+nr-1 (n_keys p0+1..p0+nr), the tile's first
 * row just before, at and after block edges, so rows of one tile end in different blocks and leave
 * different tails; 1..5 and 8 query heads (GQA groups, tiles of 16 queries with 1, 2 and 3 rows),
 * head sizes with a tail, windows that cut the first block inside and outside the tile, float and
 * half KV, a row stride wider than the tile's heads. */
enum { TILE_ROWS = IB_ATTN_TILE_Q };
static float rq[TILE_ROWS * MAX_Q * MAX_HD], rref[TILE_ROWS * MAX_Q * MAX_HD], rgot[TILE_ROWS * MAX_Q * MAX_HD];

static int compare_rows(ib_isa isa, int *cases) {
    static const int nqs[] = {1, 2, 3, 5, 8}, hds[] = {128, 72, 64}, p0s[] = {0, 5, 30, 31, 32, 63, 100, 250};
    static const int windows[] = {0, 7, 40};
    int bad = 0;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 8; c++)
                for (int w = 0; w < 3; w++) {
                    int nq = nqs[a], hd = hds[b], p0 = p0s[c], window = windows[w];
                    int max_rows = IB_ATTN_TILE_Q / nq, nr = 1 + (c + w + b) % max_rows;
                    int block = (c & 1) && w == 2 ? 16 : 32, stride = hd + (a & 1) * 8;
                    size_t qs = (size_t)(nq + 1) * hd;   /* a row's heads, then a head of another KV group */
                    float scale = 1.0f / sqrtf((float)hd);
                    int n_keys[IB_ATTN_TILE_Q], nk = p0 + nr;
                    if (nk > MAX_KEYS) continue;
                    for (int t = 0; t < nr; t++) n_keys[t] = p0 + t + 1;
                    for (int i = 0; i < nk * stride; i++) {
                        kh[i] = ib_f32_to_f16(2 * rndf()), vh[i] = ib_f32_to_f16(rndf());
                        kf[i] = ib_f16_to_f32(kh[i]), vf[i] = ib_f16_to_f32(vh[i]);
                    }
                    for (size_t i = 0; i < (size_t)nr * qs; i++) rq[i] = 3 * rndf();
                    for (int t = 0; t < nr; t++)
                        ib_attend_heads_portable(rq + t * qs, nq, kf, vf, n_keys[t], stride, hd, scale, block, window,
                                                 rref + t * qs);
                    for (int f16 = 0; f16 < 2; f16++) {
                        memset(rgot, 0, sizeof rgot);
                        ib_attend_rows_isa(isa, f16, rq, qs, nq, nr, n_keys, f16 ? (const void *)kh : kf,
                                           f16 ? (const void *)vh : vf, stride, hd, scale, block, window, rgot, qs);
                        for (int t = 0; t < nr; t++) {
                            bad += memcmp(rref + t * qs, rgot + t * qs, sizeof(float) * (size_t)(nq * hd)) != 0;
                            *cases += 1;
                        }
                    }
                }
    return bad;
}

/* The half-KV copy against the float one over a key set that differs in one value's lowest bit: the
 * comparison must see it. */
static int perturbed_differs(void) {
    enum { NK = 40, HD = 64 };
    for (int i = 0; i < NK * HD; i++) {
        kh[i] = ib_f32_to_f16(2 * rndf()), vh[i] = ib_f32_to_f16(rndf());
        kf[i] = ib_f16_to_f32(kh[i]), vf[i] = ib_f16_to_f32(vh[i]);
    }
    for (int i = 0; i < HD; i++) q[i] = 3 * rndf();
    kh[5 * HD + 3] ^= 1;
    ib_attend_heads_portable(q, 1, kf, vf, NK, HD, HD, 0.125f, IB_ATTN_BLOCK, 0, ref);
    ib_attend_heads_f16_portable(kh, vh, q, 1, NK, HD, HD, 0.125f, IB_ATTN_BLOCK, 0, got);
    return memcmp(ref, got, sizeof(float) * HD) != 0;
}

int main(void) {
    CHECK(perturbed_differs(), "a one-bit change of a half key went unseen");
    static const ib_isa isas[] = {IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512, IB_ISA_NEON, IB_ISA_AUTO};
    for (int i = 0; i < 5; i++) {
        if (!ib_isa_supported(isas[i])) continue;
        int cases = 0, bad = compare_isa(isas[i], &cases);
        CHECK(bad == 0, "attention copy for --isa %s differs from the portable one in %d of %d cases",
              ib_isa_name(isas[i]), bad, cases);
        if (isas[i] == IB_ISA_AVX2 || isas[i] == IB_ISA_AVX512) {
            /* the fault fuses the vector copies' multiply-adds: the comparison must catch it */
            ib_fault_set(IB_FAULT_ISA_FMA);
            cases = 0;
            bad = compare_isa(isas[i], &cases);
            ib_fault_set(IB_FAULT_NONE);
            CHECK(bad > cases / 4, "isa-fma fault on --isa %s changed only %d of %d cases", ib_isa_name(isas[i]), bad,
                  cases);
        }
        cases = 0;
        bad = compare_rows(isas[i], &cases);
        CHECK(bad == 0, "several rows a key block (--isa %s) differ from single rows in %d of %d rows",
              ib_isa_name(isas[i]), bad, cases);
        /* the fault lets a tile's rows attend its last row's keys: every row but the last must differ */
        ib_fault_set(IB_FAULT_ATTN_TILE_RANGE);
        cases = 0;
        bad = compare_rows(isas[i], &cases);
        ib_fault_set(IB_FAULT_NONE);
        CHECK(bad > cases / 3, "attn-tile-range fault on --isa %s changed only %d of %d rows", ib_isa_name(isas[i]),
              bad, cases);
        printf("rows tiles --isa %s: %d rows compared, the attn-tile-range fault changed %d\n", ib_isa_name(isas[i]),
               cases, bad);
    }
    TEST_MAIN_END("test_attention_isa");
}
