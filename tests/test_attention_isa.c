/*
 * test_attention_isa.c — the attention copies (portable, AVX2, AVX-512: attention_impl.h) give the
 * same bits on fresh random inputs, and half KV gives the bits of float KV holding its exact values
 * (the contract of ib_attend_heads_f16; on aarch64 this checks the NEON half conversion), and q8 KV
 * the bits of float KV holding its decoded values (ib_attend_heads_kv_isa, ib_attend_rows_isa): float and
 * half KV, 1..16 query heads, head sizes with and without
 * a tail, key counts around the block edges, windows, blocks of 16 and 32, and a stride wider than
 * the head; likewise with rows asked ahead for a later call (ib_attend_heads_ahead_isa). The isa-fma
 * fault (the vector copies fuse the dot products' multiply-adds) must make the comparison fail on
 * every vector copy this CPU runs. Several rows of one session taking key blocks together
 * (ib_attend_rows) give each row's single-row bits, and the attn-tile-range fault (a tile's
 * rows attend its last row's keys) must make that comparison fail. A key block's softmax step
 * (ib_attend_block_weights_isa: block max, rescale factor, weights, sum) gives the portable copy's bits
 * on scores with NaN, zeros of both signs, infinities and denormals, and the attn-block-max fault (the
 * vector block max takes NaN scores and keeps any zero) must make that comparison fail.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/half.h"
#include "core/kv_elem.h"
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
                    ib_attend_heads_kv_portable(IB_KV_F16, kh, vh, q, nq, nk, stride, hd, scale, block, window, got);
                    bad += memcmp(ref, got, sizeof(float) * (size_t)(nq * hd)) != 0;
                    /* with rows asked ahead for a later call (the float planes; a size not a whole
                     * number of cache lines): the same bits */
                    const ib_attn_ahead ahead = {kf, vf, (size_t)nk * (size_t)stride * sizeof(float) - 4 * (size_t)c};
                    ib_attend_heads_ahead_isa(isa, IB_KV_F16, kh, vh, q, nq, nk, stride, hd, scale, block, window, got,
                                              &ahead);
                    bad += memcmp(ref, got, sizeof(float) * (size_t)(nq * hd)) != 0;
                    /* the float copy with a hint (each KV type's hinted body is a copy of its own) */
                    const ib_attn_ahead ahead_h = {kh, vh, (size_t)nk * (size_t)stride * sizeof(uint16_t)};
                    ib_attend_heads_ahead_isa(isa, IB_KV_F32, kf, vf, q, nq, nk, stride, hd, scale, block, window, got,
                                              &ahead_h);
                    bad += memcmp(ref, got, sizeof(float) * (size_t)(nq * hd)) != 0;
                    *cases += 5;
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
    ib_attend_heads_kv_portable(IB_KV_F16, kh, vh, q, 1, NK, HD, HD, 0.125f, IB_ATTN_BLOCK, 0, got);
    return memcmp(ref, got, sizeof(float) * HD) != 0;
}

/* One block's softmax step (ib_attend_block_weights_isa) of the copy for isa against the portable
 * one, bitwise (m, l, c and the weights, zero signs and NaNs included), on scores the attention bodies
 * rarely meet: NaN scores anywhere (the block max skips them; one is always the block's last key in
 * half the cases, where a maximum that takes NaN keeps it), blocks whose maximum is a zero with both
 * zero signs present in either order (the max is the first zero in key order), +inf and -inf scores,
 * blocks of only NaN and -inf, denormals, and plain random scores; 1-4 queries, first keys j0 and
 * block ends around the vector widths, running maxima -inf, finite, +0, -0. Counts the differing
 * cases per kind (kinds: 0 random, 1 NaN, 2 zero max, 3 infinities, 4 NaN / -inf only). */
enum { WKINDS = 5, WRS = 128 };
static const char *const wkind_name[WKINDS] = {"random", "NaN", "zero max", "inf", "NaN/-inf only"};

static void fill_scores(float *s, int kind, int j0, int nb) {
    for (int j = 0; j < WRS; j++) s[j] = 4 * rndf();   /* outside j0..nb-1 too: must be ignored */
    switch (kind) {
    case 1: {
        int n = 1 + rndi(4);
        for (int i = 0; i < n; i++) s[j0 + rndi(nb - j0)] = NAN;
        if (rndi(2)) s[nb - 1] = NAN;
        if (rndi(4) == 0) s[j0] = NAN;
        break;
    }
    case 2: {
        for (int j = j0; j < nb; j++) s[j] = -fabsf(s[j]) - 0x1p-20f;
        int a = j0 + rndi(nb - j0), b = j0 + rndi(nb - j0), first_neg = rndi(2);
        if (a > b) { int x = a; a = b; b = x; }
        s[a] = first_neg ? -0.0f : 0.0f;
        s[b] = first_neg ? 0.0f : -0.0f;      /* a == b leaves one zero */
        for (int i = rndi(3); i > 0; i--) s[j0 + rndi(nb - j0)] = rndi(2) ? 0.0f : -0.0f;
        if (rndi(3) == 0) s[j0 + rndi(nb - j0)] = NAN;
        break;
    }
    case 3:
        for (int i = 1 + rndi(3); i > 0; i--) s[j0 + rndi(nb - j0)] = rndi(2) ? INFINITY : -INFINITY;
        if (rndi(3) == 0) s[j0 + rndi(nb - j0)] = NAN;
        break;
    case 4:
        for (int j = j0; j < nb; j++) s[j] = rndi(2) ? NAN : -INFINITY;
        break;
    default:
        if (rndi(4) == 0)
            for (int j = j0; j < nb; j++) s[j] *= 0x1p-140f; /* denormal scores */
        break;
    }
}

static int compare_weights(ib_isa isa, int cases[WKINDS], int bad[WKINDS]) {
    static const int nbs[] = {1, 2, 7, 8, 9, 15, 16, 17, 23, 31, 32, 33, 48, 63, 64, 65, 100, 127, 128};
    static const int j0s[] = {0, 1, 5, 16, 17};
    static float s[4 * WRS], pw_ref[4 * WRS], pw_got[4 * WRS];
    int total = 0;
    for (int a = 0; a < (int)(sizeof nbs / sizeof nbs[0]); a++)
        for (int b = 0; b < 5; b++)
            for (int nq = 1; nq <= 4; nq++)
                for (int kind = 0; kind < WKINDS; kind++)
                    for (int rep = 0; rep < 4; rep++) {
                        const int nb = nbs[a], j0 = j0s[b];
                        if (j0 >= nb) continue;
                        float m0[4], l0[4], m_ref[4], l_ref[4], c_ref[4], m_got[4], l_got[4], c_got[4];
                        for (int h = 0; h < nq; h++) {
                            /* the first query takes the kind, the others a random kind */
                            fill_scores(s + h * WRS, h == 0 ? kind : rndi(WKINDS), j0, nb);
                            const int r = rndi(4);
                            m0[h] = r == 0 ? -INFINITY : r == 1 ? -8 + rndf() : r == 2 ? 0.0f : -0.0f;
                            l0[h] = m0[h] == -INFINITY ? 0.0f : 1 + rndf();
                            m_ref[h] = m_got[h] = m0[h], l_ref[h] = l_got[h] = l0[h];
                        }
                        memset(pw_ref, 0x5a, sizeof pw_ref), memset(pw_got, 0x5a, sizeof pw_got);
                        ib_attend_block_weights_portable(nq, s, WRS, j0, nb, m_ref, l_ref, pw_ref, c_ref);
                        ib_attend_block_weights_isa(isa, nq, s, WRS, j0, nb, m_got, l_got, pw_got, c_got);
                        const size_t n4 = sizeof(float) * (size_t)nq;
                        bad[kind] += memcmp(m_ref, m_got, n4) != 0 || memcmp(l_ref, l_got, n4) != 0 ||
                                     memcmp(c_ref, c_got, n4) != 0 || memcmp(pw_ref, pw_got, sizeof pw_ref) != 0;
                        cases[kind]++, total++;
                    }
    return total;
}

/* q8 KV: the copy for isa over q8 planes (ib_attend_heads_kv_isa, and ib_attend_rows_isa for tiles of
 * rows of one session) gives the bits of the portable float attention over the planes' decoded values,
 * decoded here from the bytes as core/kv_elem.h lays them out (a code times its block's scale): 1..16
 * query heads, head sizes 32..128, rows wider than the head, windows, blocks of 16 and 32, key counts
 * around the block edges; the rows' blocks take magnitudes from 2^-6 to 2^3, and some are zero. */
enum { Q8_MAX_STRIDE = 160 };
static unsigned char kq[MAX_KEYS * Q8_MAX_STRIDE / 32 * 36], vq[MAX_KEYS * Q8_MAX_STRIDE / 32 * 36];
static float kqf[MAX_KEYS * Q8_MAX_STRIDE], vqf[MAX_KEYS * Q8_MAX_STRIDE];   /* their decoded values */

static float q8_decoded(const unsigned char *plane, size_t e) {
    float s;
    memcpy(&s, plane + (e / 32) * 36 + 32, 4);
    return s * (float)(int8_t)plane[(e / 32) * 36 + e % 32];
}

/* nk rows of `stride` random floats per plane, encoded into kq / vq, their decoded values into kqf / vqf. */
static void fill_q8(int nk, int stride) {
    float row[Q8_MAX_STRIDE];
    for (int j = 0; j < nk; j++)
        for (int pl = 0; pl < 2; pl++) {
            for (int b = 0; b < stride / 32; b++) {
                const float mag = rndi(8) == 0 ? 0.0f : ldexpf(1.0f, rndi(10) - 6);
                for (int i = 0; i < 32; i++) row[b * 32 + i] = mag * rndf();
            }
            unsigned char *dst = (pl ? vq : kq) + (size_t)j * stride / 32 * 36;
            ib_kvq8_encode_row(row, stride, dst);
        }
    for (size_t e = 0; e < (size_t)nk * stride; e++) kqf[e] = q8_decoded(kq, e), vqf[e] = q8_decoded(vq, e);
}

static int compare_q8(ib_isa isa, int *cases) {
    static const int nqs[] = {1, 2, 3, 16}, hds[] = {32, 64, 128}, keys[] = {1, 15, 32, 33, 150, 300};
    int bad = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 6; c++)
                for (int w = 0; w < 3; w++) {
                    int nq = nqs[a], hd = hds[b], nk = keys[c], stride = hd + (c & 1) * 32;
                    int window = w == 0 ? 0 : w == 1 ? 40 : 1 + rndi(60), block = (c & 1) ? 16 : 32;
                    float scale = 1.0f / sqrtf((float)hd);
                    fill_q8(nk, stride);
                    for (int i = 0; i < nq * hd; i++) q[i] = 3 * rndf();
                    ib_attend_heads_portable(q, nq, kqf, vqf, nk, stride, hd, scale, block, window, ref);
                    ib_attend_heads_kv_isa(isa, IB_KV_Q8, kq, vq, q, nq, nk, stride, hd, scale, block, window, got);
                    bad += memcmp(ref, got, sizeof(float) * (size_t)(nq * hd)) != 0;
                    /* with the decoded planes' rows asked ahead for a later call */
                    const ib_attn_ahead ahead = {kqf, vqf, (size_t)nk * (size_t)stride * sizeof(float)};
                    ib_attend_heads_ahead_isa(isa, IB_KV_Q8, kq, vq, q, nq, nk, stride, hd, scale, block, window, got,
                                              &ahead);
                    bad += memcmp(ref, got, sizeof(float) * (size_t)(nq * hd)) != 0;
                    *cases += 2;
                    /* the last rows of the plane as a tile of one session's rows */
                    const int nr = nk < 4 ? nk : 4;
                    if (nr * nq > IB_ATTN_TILE_Q) continue;
                    int n_keys[IB_ATTN_TILE_Q];
                    size_t qs = (size_t)nq * hd;
                    for (int t = 0; t < nr; t++) n_keys[t] = nk - nr + 1 + t;
                    for (size_t i = 0; i < (size_t)nr * qs; i++) rq[i] = 3 * rndf();
                    for (int t = 0; t < nr; t++)
                        ib_attend_heads_portable(rq + t * qs, nq, kqf, vqf, n_keys[t], stride, hd, scale, block,
                                                 window, rref + t * qs);
                    ib_attend_rows_isa(isa, IB_KV_Q8, rq, qs, nq, nr, n_keys, kq, vq, stride, hd, scale, block, window,
                                       rgot, qs);
                    for (int t = 0; t < nr; t++) {
                        bad += memcmp(rref + t * qs, rgot + t * qs, sizeof(float) * qs) != 0;
                        *cases += 1;
                    }
                }
    return bad;
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
    /* after the comparisons above, so their random inputs are the ones they always drew */
    for (int i = 0; i < 5; i++) {
        if (!ib_isa_supported(isas[i])) continue;
        /* the softmax step on NaN, zero and infinite scores; the attn-block-max fault (the vector copies'
         * block max takes NaN scores and keeps the zero its lane fold ends on) must break the NaN and the
         * zero-max kinds */
        int wc[WKINDS] = {0}, wb[WKINDS] = {0}, wbad = 0;
        compare_weights(isas[i], wc, wb);
        for (int kd = 0; kd < WKINDS; kd++) {
            CHECK(wb[kd] == 0, "block softmax step (--isa %s), %s scores: %d of %d cases differ from the portable copy",
                  ib_isa_name(isas[i]), wkind_name[kd], wb[kd], wc[kd]);
            wbad += wb[kd];
        }
        if (isas[i] == IB_ISA_AVX2 || isas[i] == IB_ISA_AVX512) {
            int fc[WKINDS] = {0}, fb[WKINDS] = {0};
            ib_fault_set(IB_FAULT_ATTN_BLOCK_MAX);
            compare_weights(isas[i], fc, fb);
            ib_fault_set(IB_FAULT_NONE);
            CHECK(fb[1] > fc[1] / 8 && fb[2] > fc[2] / 8,
                  "attn-block-max fault on --isa %s changed only %d of %d NaN and %d of %d zero-max cases",
                  ib_isa_name(isas[i]), fb[1], fc[1], fb[2], fc[2]);
            printf("block softmax step --isa %s: %d cases, %d differ; the attn-block-max fault changed %d of %d NaN, "
                   "%d of %d zero-max, %d of %d random cases\n",
                   ib_isa_name(isas[i]), wc[0] + wc[1] + wc[2] + wc[3] + wc[4], wbad, fb[1], fc[1], fb[2], fc[2], fb[0],
                   fc[0]);
        }
    }
    /* q8 KV, after everything above (its random inputs unchanged) */
    for (int i = 0; i < 5; i++) {
        if (!ib_isa_supported(isas[i])) continue;
        int cases = 0, bad = compare_q8(isas[i], &cases);
        CHECK(bad == 0, "q8 KV attention (--isa %s) differs from float attention over its decoded values in %d of %d "
              "cases", ib_isa_name(isas[i]), bad, cases);
        if (isas[i] == IB_ISA_AVX2 || isas[i] == IB_ISA_AVX512) {
            int fcases = 0;
            ib_fault_set(IB_FAULT_ISA_FMA);
            int fbad = compare_q8(isas[i], &fcases);
            ib_fault_set(IB_FAULT_NONE);
            CHECK(fbad > fcases / 4, "isa-fma fault on --isa %s changed only %d of %d q8 cases", ib_isa_name(isas[i]),
                  fbad, fcases);
            printf("q8 KV --isa %s: %d cases, %d differ; the isa-fma fault changed %d\n", ib_isa_name(isas[i]), cases,
                   bad, fbad);
        }
    }
    TEST_MAIN_END("test_attention_isa");
}
