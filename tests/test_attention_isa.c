/*
 * test_attention_isa.c — the attention copies (portable, AVX2, AVX-512: attention_impl.h) give the
 * same bits on fresh random inputs, and half KV gives the bits of float KV holding its exact values
 * (the contract of ib_attend_heads_f16; on aarch64 this checks the NEON half conversion): float and
 * half KV, 1..16 query heads, head sizes with and without
 * a tail, key counts around the block edges, windows, blocks of 16 and 32, and a stride wider than
 * the head. The isa-fma fault (the vector copies fuse the dot products' multiply-adds) must make the
 * comparison fail on every vector copy this CPU runs.
 */
#include <math.h>
#include <stdint.h>
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
    }
    TEST_MAIN_END("test_attention_isa");
}
