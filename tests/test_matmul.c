/*
 * test_matmul.c — the batched matrix-product kernels (src/ops/matmul.h, src/backends/cpu/).
 *
 *  (a) accuracy: every product against a float64 reference computed here from the same weights,
 *      with a stated rounding-error bound; and, stronger, bit-exactness against the NUMERIC DEFINITION
 *      evaluated here in plain float C (the canonical chain per output).
 *  (b) invariance: every supported ISA equals the scalar kernel; row b of a B-row product equals the
 *      1-row product of row b; any prefix of rows equals the full product's rows; pools of 1, 2, 3
 *      threads give the same bits (a 300-row product over 3 threads split by rows as well as panels
 *      among them); padding columns of Y (ldy > N) are never written.
 *  (c) MLX unpacking of hand-built 4- and 8-bit codes, and argument validation.
 *  (d) fault injection: IB_FAULT_GEMV_GEMM and IB_FAULT_ISA_FMA make the invariance checks fail, and
 *      (where the CPU has AMX) IB_FAULT_AMX_GROUP_ORDER changes the rows the AMX kernel puts on tiles
 *      (most of them: a row can come out the same by chance) and no others.
 * The amx ISA runs every check the others run (its tiles take the Q8 products' rows in multiples of
 * 16: the 17-, 33- and 150-row products and the row counts 1..70 reach them); on a CPU without AMX
 * the test says `SKIP amx: <why>` and runs the rest.
 */
#include <math.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "check.h"
#include "core/half.h"
#include "core/pool.h"
#include "ops/matmul.h"

#define BMAX 33
static const int b_list[] = {1, 2, 3, 5, 6, 7, 8, 17, 33};   /* row-tile tails of 4 and of 8 */
#define N_BLIST ((int)(sizeof b_list / sizeof b_list[0]))

/* ---------------------------------------------------------------- deterministic random numbers */

#define TEST_RNG_SEED 0x9e3779b97f4a7c15ULL
#include "test_rng.h"

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* ---------------------------------------------------------------- test weights */

typedef struct wset {
    ib_matrix m;
    int bits, group, N, K;   /* bits 0 = float */
    float *wf;               /* [N][K] float weights: given floats, or s*(float)q + b computed here */
    uint8_t *codes;          /* [N][K] quantized codes (NULL for float) */
    float *s, *b;            /* [N][K/G] */
} wset;

static void wset_free(wset *w) {
    ib_matrix_free(&w->m);
    free(w->wf);
    free(w->codes);
    free(w->s);
    free(w->b);
    memset(w, 0, sizeof *w);
}

/* Pack codes [N][K] into MLX words [N][K*bits/32]: element j of each 32/bits in bits j*bits.. (low first). */
static uint32_t *mlx_pack(const uint8_t *codes, int N, int K, int bits) {
    int per = 32 / bits, wpr = K / per;
    uint32_t *wq = calloc((size_t)N * wpr, sizeof *wq);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) wq[(size_t)n * wpr + k / per] |= (uint32_t)codes[(size_t)n * K + k] << ((k % per) * bits);
    return wq;
}

/* How wset_make rounds quantized scales and biases: 0 not at all (float32 storage), 1 to bfloat16,
 * 2 to float16 — the storage the packer must then choose (ib_sbfmt). */
static int sb_round;
static const ib_sbfmt sb_expect[3] = {IB_SB_F32, IB_SB_BF16, IB_SB_F16};

static float round_sb(float v) {
    if (sb_round == 1) return ib_bf16_to_f32(ib_f32_to_bf16(v));
    if (sb_round == 2) return ib_f16_to_f32(ib_f32_to_f16(v));
    return v;
}

/* Random weights of the given kind; returns 0 on success. */
static int wset_make(wset *w, int bits, int group, int N, int K) {
    memset(w, 0, sizeof *w);
    w->bits = bits;
    w->group = group;
    w->N = N;
    w->K = K;
    w->wf = malloc(sizeof(float) * N * K);
    ib_error err;
    if (bits == 0) {
        for (size_t i = 0; i < (size_t)N * K; i++) w->wf[i] = rndf() * 0.5f;
        w->wf[0] = 0.0f;
        return ib_matrix_from_f32(&w->m, w->wf, N, K, &err) != IB_OK;
    }
    int ng = K / group, qmax = (1 << bits) - 1;
    w->codes = malloc((size_t)N * K);
    w->s = malloc(sizeof(float) * N * ng);
    w->b = malloc(sizeof(float) * N * ng);
    for (size_t i = 0; i < (size_t)N * K; i++) w->codes[i] = (uint8_t)rndi(qmax + 1);
    for (size_t i = 0; i < (size_t)N * ng; i++) {
        /* MLX-like: positive scale, bias near -scale*qmax/2 (so weights straddle 0) */
        w->s[i] = 0.002f + 0.03f * (rndf() + 1.0f) / (float)(1 << (bits - 4));
        w->b[i] = -w->s[i] * (float)qmax * 0.5f * (1.0f + 0.3f * rndf());
        w->s[i] = round_sb(w->s[i]), w->b[i] = round_sb(w->b[i]);
    }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            size_t gi = (size_t)n * ng + k / group;
            w->wf[(size_t)n * K + k] = w->s[gi] * (float)w->codes[(size_t)n * K + k] + w->b[gi];
        }
    uint32_t *wq = mlx_pack(w->codes, N, K, bits);
    ib_status st = ib_matrix_from_mlx(&w->m, wq, w->s, w->b, N, K, bits, group, &err);
    free(wq);
    if (st != IB_OK) fprintf(stderr, "from_mlx: %s\n", err.msg);
    return st != IB_OK;
}

/* ---------------------------------------------------------------- the definition, evaluated here */

/* Q8 activation quantization per the definition in matmul.h (written independently of matmul.c). */
static void my_quantize(const float *x, int B, int K, int G, int8_t *xq, float *d, float *ad) {
    int ng = K / G;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < ng; g++) {
            float amax = 0.0f;
            for (int k = g * G; k < (g + 1) * G; k++) amax = fmaxf(amax, fabsf(x[(size_t)b * K + k]));
            float dd = amax / 127.0f;
            int sum = 0;
            for (int k = g * G; k < (g + 1) * G; k++) {
                float v = amax == 0.0f ? 0.0f : rintf(x[(size_t)b * K + k] * (127.0f / amax));
                v = fminf(127.0f, fmaxf(-127.0f, v));
                xq[(size_t)b * K + k] = (int8_t)v;
                sum += (int)v;
            }
            d[(size_t)b * ng + g] = amax == 0.0f ? 0.0f : dd;
            ad[(size_t)b * ng + g] = d[(size_t)b * ng + g] * (float)sum;
        }
}

/* ib_quantize_act on inputs the random tests never hold, against the definition in matmul.h written
 * out one element at a time with rintf: NaNs (quantized to 0, not counted in amax), infinities,
 * subnormal and huge amax, exact ties, values that round just past +-127, signed zeros. */
static void test_quantize_special(void) {
    enum { G = 32, NG = 12, K = G * NG };
    float x[K];
    for (int k = 0; k < K; k++) x[k] = (float)((k * 37) % 41 - 20) * 0.25f;
    x[0] = NAN, x[5] = -NAN;                                               /* group 0: NaNs */
    x[G] = INFINITY;                                                        /* group 1: +inf amax */
    x[2 * G + 3] = -INFINITY, x[2 * G + 4] = NAN;                           /* group 2 */
    for (int k = 0; k < G; k++) x[3 * G + k] = (float)(k + 1) * 1e-40f;    /* group 3: subnormal */
    for (int k = 0; k < G; k++) x[4 * G + k] = (k % 2 ? -3e38f : 2.9e38f);  /* group 4: huge */
    for (int k = 0; k < G; k++) x[5 * G + k] = (float)(k - 16) + 0.5f;      /* group 5: ties */
    x[5 * G + 31] = 127.0f;
    for (int k = 0; k < G; k++) x[6 * G + k] = k % 2 ? -0.0f : 0.0f;        /* group 6: signed zeros */
    for (int k = 0; k < G; k++) x[7 * G + k] = NAN;                         /* group 7: all NaN */
    for (int k = 0; k < G; k++) x[8 * G + k] = 1.0f - (float)k * 0x1p-24f;  /* group 8: just below amax */
    x[9 * G + 7] = -0x1p-149f;                                              /* group 9: tiny next to 5 */
    int8_t xq[K];
    float d[NG], ad[NG];
    ib_quantize_act(x, 1, K, G, xq, d, ad);
    int bad_q = -1, bad_d = -1;
    for (int g = 0; g < NG; g++) {
        float amax = 0.0f;
        for (int k = g * G; k < (g + 1) * G; k++)
            if (fabsf(x[k]) > amax) amax = fabsf(x[k]);
        float dd = amax == 0.0f ? 0.0f : amax / 127.0f, inv = 127.0f / amax;
        int sum = 0;
        for (int k = g * G; k < (g + 1) * G; k++) {
            float v = amax == 0.0f ? 0.0f : rintf(x[k] * inv);
            int iv = v != v ? 0 : v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v;
            if (xq[k] != iv && bad_q < 0) bad_q = k;
            sum += iv;
        }
        float want_ad = amax == 0.0f ? 0.0f : dd * (float)sum;
        if ((memcmp(&d[g], &dd, 4) || memcmp(&ad[g], &want_ad, 4)) && bad_d < 0) bad_d = g;
    }
#if defined(__x86_64__) || defined(__i386__)
    if (ib_isa_supported(IB_ISA_AVX512)) {
        int8_t xq2[K];
        float d2[NG], ad2[NG];
        ib_quantize_act_avx512(x, 1, K, G, xq2, d2, ad2);
        CHECK(!memcmp(xq, xq2, sizeof xq) && !memcmp(d, d2, sizeof d) && !memcmp(ad, ad2, sizeof ad),
              "quantize special values: the avx512 copy differs");
    }
#endif
    CHECK(bad_q < 0, "quantize special values: element %d (x = %g) gave %d", bad_q, bad_q < 0 ? 0.0 : (double)x[bad_q],
          bad_q < 0 ? 0 : xq[bad_q]);
    CHECK(bad_d < 0, "quantize special values: group %d d/ad %g/%g", bad_d, bad_d < 0 ? 0.0 : (double)d[bad_d],
          bad_d < 0 ? 0.0 : (double)ad[bad_d]);
}

/* The AVX-512 copy of ib_quantize_act (matmul_avx512.c), where the CPU runs it: the same bits as the
 * portable function over the special values above (groups 32) and random rows of groups 32, 64, 128
 * with NaNs, infinities and all-zero groups sprinkled in. */
static void test_quantize_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (!ib_isa_supported(IB_ISA_AVX512)) {
        printf("SKIP quantize avx512: the CPU lacks AVX-512\n");
        return;
    }
    enum { B = 5, K = 1536 };
    static float x[B * K], d0[B * K / 32], d1[B * K / 32], a0[B * K / 32], a1[B * K / 32];
    static int8_t q0[B * K], q1[B * K];
    for (int G = 32; G <= 128; G *= 2) {
        for (int i = 0; i < B * K; i++) x[i] = rndf() * (float)(1 + i % 7) * (i % 97 == 0 ? 1e30f : 1.0f);
        x[3] = NAN, x[K + 70] = INFINITY, x[2 * K + 5] = -INFINITY, x[2 * K + 6] = NAN;
        for (int k = 0; k < G; k++) x[3 * K + G + k] = k % 2 ? -0.0f : 0.0f;
        for (int k = 0; k < G; k++) x[4 * K + 2 * G + k] = NAN;
        for (int k = 0; k < G; k++) x[4 * K + k] = (float)(k - G / 2) + 0.5f;
        ib_quantize_act(x, B, K, G, q0, d0, a0);
        ib_quantize_act_avx512(x, B, K, G, q1, d1, a1);
        const size_t nd = (size_t)B * K / G;
        CHECK(!memcmp(q0, q1, sizeof q0) && !memcmp(d0, d1, nd * 4) && !memcmp(a0, a1, nd * 4),
              "quantize avx512 G=%d: differs from ib_quantize_act", G);
    }
#endif
}

/* Canonical F32-activation result: acc = acc + (double)w*(double)x in double, k ascending, rounded
 * to float once. y [B][N]. */
static void canon_f32(const wset *w, const float *x, int B, float *y) {
    for (int b = 0; b < B; b++)
        for (int n = 0; n < w->N; n++) {
            const float *wr = w->wf + (size_t)n * w->K, *xr = x + (size_t)b * w->K;
            double acc = 0.0;
            for (int k = 0; k < w->K; k++) acc = acc + (double)wr[k] * (double)xr[k];
            y[(size_t)b * w->N + n] = (float)acc;
        }
}

/* Canonical Q8-activation result: exact int group sums, acc = (acc + (s*d)*(float)isum) + b*ad. */
static void canon_q8(const wset *w, const int8_t *xq, const float *d, const float *ad, int B, float *y) {
    int K = w->K, G = w->group, ng = K / G;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < w->N; n++) {
            float acc = 0.0f;
            for (int g = 0; g < ng; g++) {
                int32_t isum = 0;
                for (int k = g * G; k < (g + 1) * G; k++)
                    isum += (int32_t)w->codes[(size_t)n * K + k] * xq[(size_t)b * K + k];
                float t = (w->s[(size_t)n * ng + g] * d[(size_t)b * ng + g]) * (float)isum;
                float u = w->b[(size_t)n * ng + g] * ad[(size_t)b * ng + g];
                acc = (acc + t) + u;
            }
            y[(size_t)b * w->N + n] = acc;
        }
}

/* ---------------------------------------------------------------- accuracy checks */

/* F32 activations. Reference: sum_k w*x in float64 (w the same float weights), accumulated in long
 * double where that is wider. Bound: the kernel's products are exact and its K double additions err
 * by at most gamma_K * sum|w*x| (gamma_n = n*u/(1-n*u), u = 2^-53), then one rounding to float, half
 * an ulp: we assert |y - ref| <= 2^-24 * |ref| + 2 * K * 2^-53 * sum|w*x| (a factor 2 of slack on
 * the sum; a float32 chain would err by up to K * 2^-24 * sum|w*x| and fails it on these sizes). */
static void check_accuracy_f32(const wset *w, const float *x, int B, const float *y, const char *what) {
    int bad = 0;
    double worst = 0;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < w->N; n++) {
            long double ref = 0;
            double mag = 0;
            for (int k = 0; k < w->K; k++) {
                double p = (double)w->wf[(size_t)n * w->K + k] * (double)x[(size_t)b * w->K + k];
                ref += p;
                mag += fabs(p);
            }
            double bound = 0x1.0p-24 * fabs((double)ref) + 2.0 * w->K * 0x1.0p-53 * mag;
            double e = fabs((double)((long double)y[(size_t)b * w->N + n] - ref));
            if (!(e <= bound)) bad++;
            if (mag > 0 && e / mag > worst) worst = e / mag;
        }
    CHECK(bad == 0, "%s: %d outputs outside the double-sum bound (worst err/sum|wx| %.3g)", what, bad, worst);
}

/* Q8 activations. Reference: sum over groups of sum_k (s*q + b) * (d*xq) in float64 (exact weights,
 * the quantized activations). The kernel rounds (s*d), t = (s*d)*isum, ad = d*sum(xq), u = b*ad (each
 * <= 2 roundings per term, isum exact) and adds 2 terms per group: |error| <= (2*ng + 3) * u *
 * sum_g (|s*d*isum_g| + |b*d*sum_g(xq)|) to first order; we assert twice that. Separately, against
 * the unquantized activations (sum_k (s*q+b)*x in float64) we print the errors and only assert a
 * loose relative L2 error < 2e-2 over the output (without make_x's outlier rows 2, 3). */
static void check_accuracy_q8(const wset *w, const float *x, const int8_t *xq, const float *d, int B,
                              const float *y, const char *what) {
    int K = w->K, G = w->group, ng = K / G, bad = 0;
    double e2 = 0, r2 = 0, emax = 0, rmax = 0;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < w->N; n++) {
            double ref = 0, mag = 0, ref_x = 0;
            for (int g = 0; g < ng; g++) {
                double s = w->s[(size_t)n * ng + g], bb = w->b[(size_t)n * ng + g], dd = d[(size_t)b * ng + g];
                long long isum = 0, xsum = 0;
                for (int k = g * G; k < (g + 1) * G; k++) {
                    int q = w->codes[(size_t)n * K + k], xv = xq[(size_t)b * K + k];
                    isum += (long long)q * xv;
                    xsum += xv;
                    ref += (s * q + bb) * (dd * xv);
                    ref_x += (s * q + bb) * (double)x[(size_t)b * K + k];
                }
                mag += fabs(s * dd * (double)isum) + fabs(bb * dd * (double)xsum);
            }
            double yv = y[(size_t)b * w->N + n];
            double bound = 2.0 * (2 * ng + 3) * 0x1.0p-24 * mag;
            if (!(fabs(yv - ref) <= bound)) bad++;
            if (b == 2 || b == 3) continue; /* make_x's outlier rows: deliberately coarse quantization */
            e2 += (yv - ref_x) * (yv - ref_x);
            r2 += ref_x * ref_x;
            if (fabs(yv - ref_x) > emax) emax = fabs(yv - ref_x);
            if (fabs(ref_x) > rmax) rmax = fabs(ref_x);
        }
    CHECK(bad == 0, "%s: %d outputs outside the Q8 rounding bound", what, bad);
    double rel = r2 > 0 ? sqrt(e2 / r2) : 0;
    CHECK(rel < 2e-2, "%s: relative L2 error vs unquantized activations %.4g", what, rel);
    if (getenv("IB_TEST_VERBOSE"))
        printf("  %s: vs unquantized x: rel L2 %.3g, max |err| / max |ref| %.3g\n", what, rel, rmax > 0 ? emax / rmax : 0);
}

/* ---------------------------------------------------------------- the invariance checks */

static ib_pool *pools[4]; /* [t] = pool of t threads, t = 1..3 */
static ib_isa isas[6];
static int n_isas;

/* Run one product into y [B][ldy] (sentinel-filled first); check that the padding columns stay. */
static void run_product(const ib_matrix *m, const float *x, int B, const ib_act_buf *q, ib_act act, ib_isa isa,
                        ib_pool *pool, float *y, int ldy, int *pad_ok) {
    for (size_t i = 0; i < (size_t)B * ldy; i++) y[i] = -1234.5f;
    ib_matmul(m, x, B, q, act, isa, pool, y, ldy);
    for (int b = 0; b < B; b++)
        for (int n = m->rows; n < ldy; n++)
            if (y[(size_t)b * ldy + n] != -1234.5f) *pad_ok = 0;
}

/* Compare rows [0, B) of y (stride ldy) with canon (stride N). */
static int rows_equal(const float *y, int ldy, const float *canon, int N, int B) {
    for (int b = 0; b < B; b++)
        if (!same_bits(y + (size_t)b * ldy, canon + (size_t)b * N, (size_t)N)) return 0;
    return 1;
}

/* All invariance checks of one (weights, activation mode) pair against the canonical result. */
static void check_invariance(const wset *w, const float *x, const ib_act_buf *q, ib_act act, const float *canon,
                             const char *what) {
    const int N = w->N, K = w->K, ng = w->group ? K / w->group : 0, ldy = N + 3;
    float *y = malloc(sizeof(float) * BMAX * ldy), *ys = malloc(sizeof(float) * BMAX * ldy);
    int pad_ok = 1;
    for (int ii = 0; ii < n_isas; ii++) {
        ib_isa isa = isas[ii];
        const char *in = ib_isa_name(isa);
        /* full product, single thread: the canonical bits (and the scalar kernel's) */
        run_product(&w->m, x, BMAX, q, act, isa, NULL, y, ldy, &pad_ok);
        CHECK(rows_equal(y, ldy, canon, N, BMAX), "%s %s: B=%d differs from the numeric definition", what, in, BMAX);
        if (isa == IB_ISA_SCALAR) memcpy(ys, y, sizeof(float) * BMAX * ldy);
        else CHECK(same_bits(y, ys, (size_t)BMAX * ldy), "%s %s: differs from scalar", what, in);
        /* prefixes of the rows: the B-row product of the first B rows */
        for (int bi = 0; bi < N_BLIST - 1; bi++) {
            int B = b_list[bi];
            run_product(&w->m, x, B, q, act, isa, NULL, y, ldy, &pad_ok);
            CHECK(rows_equal(y, ldy, canon, N, B), "%s %s: product of the first %d rows differs", what, in, B);
        }
        /* each row alone */
        int rows_ok = 1;
        for (int b = 0; b < BMAX; b++) {
            ib_act_buf q1;
            if (q) q1 = (ib_act_buf){ q->xq + (size_t)b * K, q->d + (size_t)b * ng, q->ad + (size_t)b * ng };
            run_product(&w->m, x + (size_t)b * K, 1, q ? &q1 : NULL, act, isa, NULL, y, ldy, &pad_ok);
            if (!rows_equal(y, ldy, canon + (size_t)b * N, N, 1)) rows_ok = 0;
        }
        CHECK(rows_ok, "%s %s: a 1-row product differs from its row of the %d-row product", what, in, BMAX);
        /* thread counts */
        for (int t = 1; t <= 3; t++) {
            run_product(&w->m, x, BMAX, q, act, isa, pools[t], y, ldy, &pad_ok);
            CHECK(rows_equal(y, ldy, canon, N, BMAX), "%s %s: %d threads differ", what, in, t);
        }
    }
    CHECK(pad_ok, "%s: a product wrote past column N of Y", what);
    free(y);
    free(ys);
}

/* Random activations [BMAX][K] with rows of different magnitudes, an all-zero first group in row 1,
 * an outlier in row 2 and round-half-to-even cases (x*127/amax = 2.5, -3.5) in row 3. */
static void make_x(float *x, int K) {
    for (int b = 0; b < BMAX; b++) {
        float sc = ldexpf(1.0f, rndi(7) - 3);
        for (int k = 0; k < K; k++) x[(size_t)b * K + k] = rndf() * sc;
    }
    for (int k = 0; k < K && k < 128; k++) x[(size_t)1 * K + k] = 0.0f;   /* a zero group at any G */
    x[(size_t)2 * K + 5] = 40.0f;
    x[(size_t)3 * K + 0] = 127.0f;   /* amax of the first group of row 3: inv = 1, x = 2.5 -> 2, 3.5 -> 4 */
    x[(size_t)3 * K + 1] = 2.5f;
    x[(size_t)3 * K + 2] = -3.5f;
    for (int k = 3; k < 32; k++) x[(size_t)3 * K + k] = (float)(k % 7) - 3.0f;
}

/* One weight configuration: accuracy and invariance for F32 and (quantized) Q8 activations. */
static void test_config(int bits, int group, int N, int K) {
    char what[96];
    snprintf(what, sizeof what, "%s%d g%d N=%d K=%d", bits ? "Q" : "F32", bits, group, N, K);
    wset w;
    if (wset_make(&w, bits, group, N, K)) {
        CHECK(0, "%s: building the matrix failed", what);
        wset_free(&w);
        return;
    }
    /* the stored weights read back exactly (s*q+b for quantized) */
    float *row = malloc(sizeof(float) * K);
    int rows_ok = 1;
    for (int n = 0; n < N; n++) {
        ib_matrix_row_f32(&w.m, n, row);
        if (!same_bits(row, w.wf + (size_t)n * K, (size_t)K)) rows_ok = 0;
    }
    CHECK(rows_ok, "%s: ib_matrix_row_f32 differs from the weights", what);
    CHECK_EQ_INT(w.m.n_panels, (N + 15) / 16);
    if (bits) CHECK(w.m.sb_fmt == sb_expect[sb_round], "%s: scales stored as %d, expected %d", what, (int)w.m.sb_fmt,
                    (int)sb_expect[sb_round]);
    free(row);

    float *x = malloc(sizeof(float) * BMAX * K), *canon = malloc(sizeof(float) * BMAX * N);
    make_x(x, K);
    char what2[128];

    /* F32 activations */
    canon_f32(&w, x, BMAX, canon);
    snprintf(what2, sizeof what2, "%s f32-act", what);
    check_accuracy_f32(&w, x, BMAX, canon, what2);
    check_invariance(&w, x, NULL, IB_ACT_F32, canon, what2);

    if (bits) {
        int ng = K / group;
        int8_t *xq = malloc((size_t)BMAX * K), *myxq = malloc((size_t)BMAX * K);
        float *d = malloc(sizeof(float) * BMAX * ng), *ad = malloc(sizeof(float) * BMAX * ng);
        float *myd = malloc(sizeof(float) * BMAX * ng), *myad = malloc(sizeof(float) * BMAX * ng);
        ib_quantize_act(x, BMAX, K, group, xq, d, ad);
        my_quantize(x, BMAX, K, group, myxq, myd, myad);
        CHECK(memcmp(xq, myxq, (size_t)BMAX * K) == 0, "%s: ib_quantize_act codes differ from the definition", what);
        CHECK(same_bits(d, myd, (size_t)BMAX * ng) && same_bits(ad, myad, (size_t)BMAX * ng),
              "%s: ib_quantize_act d/ad differ from the definition", what);
        CHECK(d[(size_t)1 * ng] == 0.0f && ad[(size_t)1 * ng] == 0.0f, "%s: zero group: d %g ad %g", what,
              d[(size_t)1 * ng], ad[(size_t)1 * ng]);
        if (group == 32)
            CHECK(myxq[(size_t)3 * K + 1] == 2 && myxq[(size_t)3 * K + 2] == -4, "%s: rne: 2.5 -> %d, -3.5 -> %d", what,
                  myxq[(size_t)3 * K + 1], myxq[(size_t)3 * K + 2]);
        ib_act_buf q = { xq, d, ad };
        canon_q8(&w, xq, d, ad, BMAX, canon);
        snprintf(what2, sizeof what2, "%s q8-act", what);
        check_accuracy_q8(&w, x, xq, d, BMAX, canon, what2);
        check_invariance(&w, x, &q, IB_ACT_Q8, canon, what2);
        free(xq);
        free(myxq);
        free(d);
        free(ad);
        free(myd);
        free(myad);
    }
    free(x);
    free(canon);
    wset_free(&w);
}

/* More rows than one accumulator chunk (IB_RCHUNK = 64) of the F32 path, and several row tiles of
 * the Q8 path: every ISA and 1 or 3 threads give the definition's bits. */
static void test_big_batch(int bits, int group) {
    /* 300 rows: with 3 threads the pool splits the rows as well as the 3 panels (ops/matmul.c: blocks
     * of 128, 128 and 44 rows), with 1 it does not */
    const int N = 40, K = 384, B = 300, ng = group ? K / group : 0;
    wset w;
    if (wset_make(&w, bits, group, N, K)) {
        CHECK(0, "big batch: building the matrix failed");
        wset_free(&w);
        return;
    }
    float *x = malloc(sizeof(float) * B * K), *canon = malloc(sizeof(float) * B * N), *y = malloc(sizeof(float) * B * N);
    for (int i = 0; i < B * K; i++) x[i] = rndf();
    int8_t *xq = malloc((size_t)B * K);
    float *d = malloc(sizeof(float) * B * (ng + 1)), *ad = malloc(sizeof(float) * B * (ng + 1));
    ib_act_buf q = { xq, d, ad };
    for (int act = IB_ACT_F32; act <= (bits ? IB_ACT_Q8 : IB_ACT_F32); act++) {
        if (act == IB_ACT_Q8) {
            ib_quantize_act(x, B, K, group, xq, d, ad);
            canon_q8(&w, xq, d, ad, B, canon);
        } else {
            canon_f32(&w, x, B, canon);
        }
        for (int ii = 0; ii < n_isas; ii++)
            for (int t = 1; t <= 3; t += 2) {
                memset(y, 0, sizeof(float) * B * N);
                ib_matmul(&w.m, x, B, &q, (ib_act)act, isas[ii], pools[t], y, N);
                CHECK(same_bits(y, canon, (size_t)B * N), "big batch B=%d bits %d %s-act %s %d threads", B, bits,
                      act == IB_ACT_Q8 ? "q8" : "f32", ib_isa_name(isas[ii]), t);
            }
    }
    free(x);
    free(canon);
    free(y);
    free(xq);
    free(d);
    free(ad);
    wset_free(&w);
}

/* A Q8 product's inputs and its definition: B random rows x [B][K], quantized for group G into
 * xq/d/ad, canon [B][N] = the numeric definition's product with w, y [B][N] scratch. */
typedef struct q8case {
    float *x, *canon, *y, *d, *ad;
    int8_t *xq;
    ib_act_buf q;
} q8case;

static void q8case_make(q8case *c, const wset *w, int B, int N, int K, int G) {
    const int ng = K / G;
    c->x = malloc(sizeof(float) * B * K), c->canon = malloc(sizeof(float) * B * N), c->y = malloc(sizeof(float) * B * N);
    c->xq = malloc((size_t)B * K);
    c->d = malloc(sizeof(float) * B * ng), c->ad = malloc(sizeof(float) * B * ng);
    for (int i = 0; i < B * K; i++) c->x[i] = rndf();
    ib_quantize_act(c->x, B, K, G, c->xq, c->d, c->ad);
    canon_q8(w, c->xq, c->d, c->ad, B, c->canon);
    c->q = (ib_act_buf){c->xq, c->d, c->ad};
}

static void q8case_free(q8case *c) {
    free(c->x), free(c->canon), free(c->y), free(c->xq), free(c->d), free(c->ad);
}

/* Every row count R = 1..70 (ragged row tiles of 4 and row blocks of the vector kernels' cache
 * blocking: at K = 1024 a block holds 16 rows, at K = 4096 4 rows) over a matrix of more panels than one
 * L2-sized panel chunk (27 panels, the last partial): the first R rows' product, on every ISA with 1
 * and 3 threads, equals the numeric definition's rows bit for bit. */
static void test_row_counts(int bits, int group, int N, int K) {
    const int RMAX = 70;
    wset w;
    if (wset_make(&w, bits, group, N, K)) {
        CHECK(0, "row counts: building the matrix failed");
        wset_free(&w);
        return;
    }
    q8case c;
    q8case_make(&c, &w, RMAX, N, K, group);
    for (int ii = 0; ii < n_isas; ii++)
        for (int t = 1; t <= 3; t += 2) {
            int bad = 0;
            for (int R = 1; R <= RMAX && !bad; R++) {
                memset(c.y, 0, sizeof(float) * RMAX * N);
                ib_matmul(&w.m, c.x, R, &c.q, IB_ACT_Q8, isas[ii], pools[t], c.y, N);
                if (!same_bits(c.y, c.canon, (size_t)R * N)) bad = R;
            }
            CHECK(!bad, "row counts bits %d K=%d %s %d threads: the first %d rows differ from the definition", bits,
                  K, ib_isa_name(isas[ii]), t, bad);
        }
    q8case_free(&c);
    wset_free(&w);
}

/* Group sums at their extremes: weight rows of all-qmax codes against activation rows of all +127 or
 * all -127 codes give |isum| = G * qmax * 127 (4,145,280 for 8 bits at G = 128, the largest any group
 * can reach); other rows mix qmax, 0 and random codes. Every ISA, at row counts up to 20 (an AMX tile
 * of 16 rows and a tail), equals the definition. */
static void test_extreme_sums(int bits, int group) {
    const int N = 40, K = 2 * group, B = 20, ng = K / group, qmax = (1 << bits) - 1;
    wset w;
    if (wset_make(&w, bits, group, N, K)) {
        CHECK(0, "extreme sums: building the matrix failed");
        wset_free(&w);
        return;
    }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            uint8_t *c = &w.codes[(size_t)n * K + k];
            if (n % 4 == 0) *c = (uint8_t)qmax;
            else if (n % 4 == 1) *c = 0;
            else if (n % 4 == 2) *c = (uint8_t)(k % 2 ? qmax : 0);
        }
    ib_matrix_free(&w.m);
    uint32_t *wq = mlx_pack(w.codes, N, K, bits);
    ib_error err;
    CHECK(ib_matrix_from_mlx(&w.m, wq, w.s, w.b, N, K, bits, group, &err) == IB_OK, "extreme sums: from_mlx");
    free(wq);
    float *x = malloc(sizeof(float) * B * K), *canon = malloc(sizeof(float) * B * N), *y = malloc(sizeof(float) * B * N);
    int8_t *xq = malloc((size_t)B * K);
    float *d = malloc(sizeof(float) * B * ng), *ad = malloc(sizeof(float) * B * ng);
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++)
            x[(size_t)b * K + k] = b % 4 == 0 ? (k < group ? 1.0f : -1.0f) : b % 4 == 1 ? -1.0f
                                   : b % 4 == 2 ? (k % 2 ? 1.0f : -1.0f) : rndf();
    ib_quantize_act(x, B, K, group, xq, d, ad);
    int32_t lo = 0, hi = 0; /* the extreme group sums reached */
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++)
            for (int g = 0; g < ng; g++) {
                int32_t isum = 0;
                for (int k = g * group; k < (g + 1) * group; k++)
                    isum += w.codes[(size_t)n * K + k] * xq[(size_t)b * K + k];
                lo = isum < lo ? isum : lo, hi = isum > hi ? isum : hi;
            }
    CHECK(hi == group * qmax * 127 && lo == -hi, "extreme sums bits %d g%d: sums reach %d..%d", bits, group, lo, hi);
    canon_q8(&w, xq, d, ad, B, canon);
    const ib_act_buf q = {xq, d, ad};
    static const int Rs[] = {1, 3, 4, 8, 16, 20};
    for (int ii = 0; ii < n_isas; ii++)
        for (int ri = 0; ri < 6; ri++) {
            memset(y, 0, sizeof(float) * B * N);
            ib_matmul(&w.m, x, Rs[ri], &q, IB_ACT_Q8, isas[ii], pools[1], y, N);
            CHECK(same_bits(y, canon, (size_t)Rs[ri] * N), "extreme sums bits %d g%d %s: %d rows differ from the definition",
                  bits, group, ib_isa_name(isas[ii]), Rs[ri]);
        }
    free(x), free(canon), free(y), free(xq), free(d), free(ad);
    wset_free(&w);
}

/* ---------------------------------------------------------------- (c) MLX unpacking, validation */

static void test_mlx_unpack(void) {
    for (int bits = 4; bits <= 8; bits += 4) {
        const int N = 3, K = 64, G = 32, ng = 2, per = 32 / bits, wpr = K / per;
        uint8_t codes[3][64];
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) codes[n][k] = (uint8_t)((n * 5 + k * 3 + (k >> 3)) % (1 << bits));
        for (int k = 0; k < 8; k++) codes[0][k] = (uint8_t)k;
        if (bits == 8) {
            codes[1][0] = 255;
            codes[1][1] = 128;
            codes[1][2] = 127;
            codes[1][3] = 1;
        }
        uint32_t wq[3 * 16] = {0}; /* [N][K*bits/32] */
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) wq[n * wpr + k / per] |= (uint32_t)codes[n][k] << ((k % per) * bits);
        /* the packing above is the MLX layout: spot-check literal words */
        if (bits == 4) CHECK(wq[0] == 0x76543210u, "4-bit word 0 = %08x", wq[0]);
        else {
            CHECK(wq[0] == 0x03020100u, "8-bit word 0 = %08x", wq[0]);
            CHECK(wq[wpr] == 0x017F80FFu, "8-bit row 1 word 0 = %08x", wq[wpr]);
        }
        float s[3 * 2], b[3 * 2];
        for (int n = 0; n < N; n++)
            for (int g = 0; g < ng; g++) {
                s[n * ng + g] = 0.25f * (float)(n + 1) + 0.5f * (float)g;
                b[n * ng + g] = -1.5f * (float)(g + 1) + (float)n;
            }
        ib_matrix m;
        ib_error err;
        CHECK_EQ_INT(ib_matrix_from_mlx(&m, wq, s, b, N, K, bits, G, &err), IB_OK);
        CHECK_EQ_INT(m.fmt, bits == 4 ? IB_WQ4 : IB_WQ8);
        int ok = 1;
        float row[64];
        for (int n = 0; n < N; n++) {
            ib_matrix_row_f32(&m, n, row);
            for (int k = 0; k < K; k++) {
                /* small exact values: s*q + b is exact here, so the expected value is the real one */
                float want = s[n * ng + k / G] * (float)codes[n][k] + b[n * ng + k / G];
                if (row[k] != want) {
                    if (ok) fprintf(stderr, "bits %d row %d k %d: %g != %g\n", bits, n, k, row[k], want);
                    ok = 0;
                }
            }
        }
        CHECK(ok, "%d-bit MLX unpacking", bits);
        ib_matrix_row_f32(&m, 0, row);
        CHECK(row[7] == 0.25f * 7.0f - 1.5f, "%d-bit row 0 k 7 = %g", bits, row[7]);
        if (bits == 8) {
            ib_matrix_row_f32(&m, 1, row);
            CHECK(row[0] == 0.5f * 255.0f - 0.5f && row[1] == 0.5f * 128.0f - 0.5f, "8-bit row 1: %g %g", row[0], row[1]);
        }
        ib_matrix_free(&m);
        CHECK(m.packed == NULL && m.sb == NULL, "free clears the matrix");
    }
    /* F32 round trip with N not a multiple of 16 */
    float w[5 * 7], row[7];
    for (int i = 0; i < 35; i++) w[i] = (float)i * 0.5f - 3.0f;
    ib_matrix m;
    CHECK_EQ_INT(ib_matrix_from_f32(&m, w, 5, 7, NULL), IB_OK);
    ib_matrix_row_f32(&m, 4, row);
    CHECK(same_bits(row, w + 28, 7), "f32 row 4 round trip");
    ib_matrix_free(&m);
    ib_matrix_free(NULL);
}

static void test_validation(void) {
    ib_matrix m;
    ib_error err;
    uint32_t wq[64] = {0};
    float s[64] = {0}, b[64] = {0}, w[64] = {0};
    err.msg[0] = 0;
    CHECK_EQ_INT(ib_matrix_from_mlx(&m, wq, s, b, 2, 64, 3, 32, &err), IB_ERR_UNSUPPORTED);
    CHECK(m.packed == NULL && m.rows == 0 && err.msg[0], "bits 3: %s", err.msg);
    CHECK_EQ_INT(ib_matrix_from_mlx(&m, wq, s, b, 2, 64, 4, 48, &err), IB_ERR_UNSUPPORTED);
    CHECK_EQ_INT(ib_matrix_from_mlx(&m, wq, s, b, 2, 96, 4, 64, &err), IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "96") != NULL, "message names K: %s", err.msg);
    CHECK_EQ_INT(ib_matrix_from_mlx(&m, wq, s, b, 0, 64, 4, 32, &err), IB_ERR_INVALID_ARG);
    CHECK_EQ_INT(ib_matrix_from_mlx(&m, NULL, s, b, 2, 64, 4, 32, &err), IB_ERR_INVALID_ARG);
    CHECK_EQ_INT(ib_matrix_from_f32(&m, w, 0, 4, &err), IB_ERR_INVALID_ARG);
    CHECK_EQ_INT(ib_matrix_from_f32(&m, w, 4, -1, &err), IB_ERR_INVALID_ARG);
    CHECK(m.packed == NULL, "failed build leaves m zeroed");
}

static void test_isa_api(void) {
    ib_isa i = IB_ISA_AUTO;
    ib_act a = IB_ACT_AUTO;
    CHECK(ib_isa_parse("avx2", &i) == 0 && i == IB_ISA_AVX2, "parse avx2");
    CHECK(ib_isa_parse("avx512", &i) == 0 && i == IB_ISA_AVX512, "parse avx512");
    CHECK(ib_isa_parse("neon", &i) == 0 && i == IB_ISA_NEON, "parse neon");
    CHECK(ib_isa_parse("amx", &i) == 0 && i == IB_ISA_AMX, "parse amx");
    CHECK(ib_isa_parse("scalar", &i) == 0 && i == IB_ISA_SCALAR, "parse scalar");
    CHECK(ib_isa_parse("auto", &i) == 0 && i == IB_ISA_AUTO, "parse auto");
    CHECK(ib_isa_parse("sse9", &i) == -1 && i == IB_ISA_AUTO, "parse unknown");
    CHECK(ib_isa_parse(NULL, &i) == -1, "parse NULL");
    CHECK(ib_act_parse("q8", &a) == 0 && a == IB_ACT_Q8, "parse q8");
    CHECK(ib_act_parse("f32", &a) == 0 && a == IB_ACT_F32, "parse f32");
    CHECK(ib_act_parse("auto", &a) == 0 && a == IB_ACT_AUTO, "parse auto act");
    CHECK(ib_act_parse("f16", &a) == -1, "parse unknown act");
    CHECK(strcmp(ib_isa_name(IB_ISA_AVX512), "avx512") == 0, "name avx512");
    CHECK(strcmp(ib_isa_name(IB_ISA_NEON), "neon") == 0, "name neon");
    CHECK(strcmp(ib_isa_name(IB_ISA_AMX), "amx") == 0, "name amx");
    CHECK(strcmp(ib_isa_name((ib_isa)99), "unknown") == 0, "name unknown");
    CHECK(ib_isa_supported(IB_ISA_SCALAR) == 1, "scalar supported");
    CHECK(ib_isa_supported((ib_isa)99) == 0, "bogus isa unsupported");
    CHECK(ib_isa_supported(ib_isa_best()), "best isa supported");
    if (ib_isa_supported(IB_ISA_AMX)) CHECK_EQ_INT(ib_isa_best(), IB_ISA_AMX);
    else if (ib_isa_supported(IB_ISA_AVX512)) CHECK_EQ_INT(ib_isa_best(), IB_ISA_AVX512);
    CHECK(!ib_isa_supported(IB_ISA_AMX) || ib_isa_supported(IB_ISA_AVX512), "amx without avx512");
    CHECK(ib_matmul_kernel_for(IB_ISA_SCALAR) == ib_matmul_panels_scalar, "kernel table scalar");
#if defined(__x86_64__) || defined(__i386__)
    CHECK(ib_matmul_kernel_for(IB_ISA_AVX2) == ib_matmul_panels_avx2, "kernel table avx2");
    CHECK(ib_matmul_kernel_for(IB_ISA_AVX512) == ib_matmul_panels_avx512, "kernel table avx512");
    CHECK(ib_matmul_kernel_for(IB_ISA_NEON) == NULL && !ib_isa_supported(IB_ISA_NEON), "no NEON on x86");
#if defined(__x86_64__)
    CHECK(ib_matmul_kernel_for(IB_ISA_AMX) == ib_matmul_panels_amx, "kernel table amx");
#endif
#elif defined(__aarch64__)
    CHECK(ib_matmul_kernel_for(IB_ISA_NEON) == ib_matmul_panels_neon, "kernel table neon");
    CHECK(ib_matmul_kernel_for(IB_ISA_AVX2) == NULL && !ib_isa_supported(IB_ISA_AVX2), "no AVX2 on aarch64");
    CHECK_EQ_INT(ib_isa_best(), IB_ISA_NEON);
    CHECK(ib_matmul_kernel_for(IB_ISA_AMX) == NULL && !ib_isa_supported(IB_ISA_AMX), "no AMX on aarch64");
#endif
    CHECK(ib_matmul_kernel_for((ib_isa)7) == NULL, "kernel table bogus");
}

/* ---------------------------------------------------------------- (d) fault injection */

/* 1 when the B=3 product equals the three 1-row products (bitwise). */
static int batch_matches_rows(const ib_matrix *m, const float *x, const ib_act_buf *q, ib_act act, ib_isa isa,
                              int nb) {
    const int N = m->rows, K = m->cols, ng = m->group ? K / m->group : 0;
    float *yb = malloc(sizeof(float) * nb * N), *y1 = malloc(sizeof(float) * N);
    int same = 1;
    ib_matmul(m, x, nb, q, act, isa, NULL, yb, N);
    for (int b = 0; b < nb; b++) {
        ib_act_buf q1;
        if (q) q1 = (ib_act_buf){ q->xq + (size_t)b * K, q->d + (size_t)b * ng, q->ad + (size_t)b * ng };
        ib_matmul(m, x + (size_t)b * K, 1, q ? &q1 : NULL, act, isa, NULL, y1, N);
        if (!same_bits(y1, yb + (size_t)b * N, (size_t)N)) same = 0;
    }
    free(yb);
    free(y1);
    return same;
}

static void test_faults(void) {
    /* 3 rows (the few-row tiles) and 6 (the AVX-512 kernel's many-row tiles, from 4 rows) */
    const int N = 40, K = 1024, NB = 6;
    wset wf, wq, wq8;
    if (wset_make(&wf, 0, 0, N, K) || wset_make(&wq, 4, 32, N, K) || wset_make(&wq8, 8, 64, N, K)) {
        CHECK(0, "fault test matrices");
        return;
    }
    float *x = malloc(sizeof(float) * NB * K);
    for (int i = 0; i < NB * K; i++) x[i] = rndf();
    int8_t *xq = malloc((size_t)NB * K), *xq8 = malloc((size_t)NB * K);
    float *d = malloc(sizeof(float) * NB * K / 32), *ad = malloc(sizeof(float) * NB * K / 32);
    float *d8 = malloc(sizeof(float) * NB * K / 64), *ad8 = malloc(sizeof(float) * NB * K / 64);
    ib_quantize_act(x, NB, K, 32, xq, d, ad);
    ib_quantize_act(x, NB, K, 64, xq8, d8, ad8);
    ib_act_buf q = { xq, d, ad }, q8 = { xq8, d8, ad8 };

    for (int ii = 0; ii < n_isas; ii++) {
        ib_isa isa = isas[ii];
        const char *in = ib_isa_name(isa);
        for (int nb = 3; nb <= NB; nb += NB - 3) {
            ib_fault_set(IB_FAULT_NONE);
            CHECK(batch_matches_rows(&wf.m, x, NULL, IB_ACT_F32, isa, nb), "%s f32: B=%d != 1-row products without fault", in, nb);
            CHECK(batch_matches_rows(&wq.m, x, NULL, IB_ACT_F32, isa, nb), "%s q4 f32-act: B=%d != rows without fault", in, nb);
            CHECK(batch_matches_rows(&wq.m, x, &q, IB_ACT_Q8, isa, nb), "%s q4 q8-act: B=%d != rows without fault", in, nb);
            CHECK(batch_matches_rows(&wq8.m, x, &q8, IB_ACT_Q8, isa, nb), "%s q8 q8-act: B=%d != rows without fault", in, nb);
            ib_fault_set(IB_FAULT_GEMV_GEMM);
            CHECK(!batch_matches_rows(&wf.m, x, NULL, IB_ACT_F32, isa, nb), "%s f32: B=%d gemv-gemm fault not seen", in, nb);
            CHECK(!batch_matches_rows(&wq.m, x, NULL, IB_ACT_F32, isa, nb), "%s q4 f32-act: B=%d gemv-gemm fault not seen", in, nb);
            CHECK(!batch_matches_rows(&wq.m, x, &q, IB_ACT_Q8, isa, nb), "%s q4 q8-act: B=%d gemv-gemm fault not seen", in, nb);
            CHECK(!batch_matches_rows(&wq8.m, x, &q8, IB_ACT_Q8, isa, nb), "%s q8 q8-act: B=%d gemv-gemm fault not seen", in, nb);
        }
        ib_fault_set(IB_FAULT_NONE);
    }

    float *ys = malloc(sizeof(float) * 3 * N), *yv = malloc(sizeof(float) * 3 * N);
    for (int ii = 0; ii < n_isas; ii++) {
        ib_isa isa = isas[ii];
        if (isa == IB_ISA_SCALAR) continue;
        ib_fault_set(IB_FAULT_ISA_FMA);
        ib_matmul(&wf.m, x, 3, NULL, IB_ACT_F32, IB_ISA_SCALAR, NULL, ys, N);
        ib_matmul(&wf.m, x, 3, NULL, IB_ACT_F32, isa, NULL, yv, N);
        CHECK(!same_bits(ys, yv, (size_t)3 * N), "%s: isa-fma fault not seen", ib_isa_name(isa));
        ib_fault_set(IB_FAULT_NONE);
        ib_matmul(&wf.m, x, 3, NULL, IB_ACT_F32, isa, NULL, yv, N);
        CHECK(same_bits(ys, yv, (size_t)3 * N), "%s: differs from scalar without fault", ib_isa_name(isa));
    }
    ib_fault_set(IB_FAULT_NONE);
    free(ys);
    free(yv);
    free(x);
    free(xq);
    free(d);
    free(ad);
    free(xq8);
    free(d8);
    free(ad8);
    wset_free(&wf);
    wset_free(&wq);
    wset_free(&wq8);
}

/* The AMX kernel's own fault: under IB_FAULT_AMX_GROUP_ORDER the rows it computes on tiles (the first
 * 16*floor(B/16) of a Q8 product) add their groups in descending order, so they must differ from the
 * definition while the other rows (on AVX-512) and products of fewer than 16 rows still equal it;
 * without the fault all rows equal it. 4-bit and 8-bit weights, groups 32 and 128 (both tile
 * K-steps). Runs only where the CPU has AMX. */
static void test_amx_fault(void) {
    enum { N = 40, K = 512, B = 40 };
    static const int kinds[2][2] = {{4, 32}, {8, 128}};
    for (int c = 0; c < 2; c++) {
        const int bits = kinds[c][0], G = kinds[c][1];
        wset w;
        if (wset_make(&w, bits, G, N, K)) {
            CHECK(0, "amx fault: building the matrix failed");
            wset_free(&w);
            return;
        }
        q8case qc;
        q8case_make(&qc, &w, B, N, K, G);
        float *x = qc.x, *canon = qc.canon, *y = qc.y;
        const ib_act_buf q = qc.q;
        ib_fault_set(IB_FAULT_NONE);
        ib_matmul(&w.m, x, B, &q, IB_ACT_Q8, IB_ISA_AMX, pools[2], y, N);
        CHECK(same_bits(y, canon, (size_t)B * N), "amx bits %d g%d: differs from the definition without fault", bits, G);
        ib_fault_set(IB_FAULT_AMX_GROUP_ORDER);
        ib_matmul(&w.m, x, B, &q, IB_ACT_Q8, IB_ISA_AMX, pools[2], y, N);
        int tile_rows_differ = 0;
        for (int b = 0; b < 32; b++) tile_rows_differ += !same_bits(y + (size_t)b * N, canon + (size_t)b * N, N);
        /* (a row of 40 outputs could come out the same by chance: most must not) */
        CHECK(tile_rows_differ >= 24, "amx bits %d g%d: amx-group-order changed only %d of the 32 tile rows", bits, G,
              tile_rows_differ);
        CHECK(same_bits(y + (size_t)32 * N, canon + (size_t)32 * N, (size_t)(B - 32) * N),
              "amx bits %d g%d: amx-group-order reached the AVX-512 tail rows", bits, G);
        ib_matmul(&w.m, x, 15, &q, IB_ACT_Q8, IB_ISA_AMX, pools[2], y, N);
        CHECK(same_bits(y, canon, (size_t)15 * N), "amx bits %d g%d: amx-group-order reached a 15-row product", bits, G);
        /* one row tile (20 rows): with 4-bit weights its panels two at a time, the fault on them as well (one thread, so panels
         * 0 and 1 are a pair) */
        ib_matmul(&w.m, x, 20, &q, IB_ACT_Q8, IB_ISA_AMX, pools[1], y, N);
        tile_rows_differ = 0;
        /* (outputs 0..31: the first two panels, which take the two-panel path; N = 40 leaves a third alone) */
        for (int b = 0; b < 16; b++) tile_rows_differ += !same_bits(y + (size_t)b * N, canon + (size_t)b * N, 32);
        CHECK(tile_rows_differ >= 12,
              "amx bits %d g%d: amx-group-order changed only %d of a 20-row product's 16 tile rows in its panel pair", bits,
              G, tile_rows_differ);
        CHECK(same_bits(y + (size_t)16 * N, canon + (size_t)16 * N, (size_t)4 * N),
              "amx bits %d g%d: amx-group-order reached a 20-row product's last 4 rows", bits, G);
        ib_fault_set(IB_FAULT_NONE);
        q8case_free(&qc);
        wset_free(&w);
    }
}

/* Why this build or CPU cannot run the amx ISA (for the SKIP line). */
static const char *amx_skip_reason(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return "the CPU has no CPUID leaf 7";
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return "the CPU lacks AMX-TILE / AMX-INT8";
    if (!ib_isa_supported(IB_ISA_AVX512)) return "the CPU lacks the AVX-512 subset the kernel needs";
    return "the OS did not grant the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM) or does not enable it";
#else
    return "not an x86-64 build";
#endif
}

/* ---------------------------------------------------------------- main */

/* ib_matmul_many: several products sharing one input in one pool job give, each, the bits of
 * ib_matmul alone, for every ISA, thread count and a few batch sizes; five products (more than one
 * job holds) and a mix of 4-bit, 8-bit and float weights included. The comparison is shown able to
 * fail: one product's output against another product's. */
static void test_many(void) {
    enum { NP = 5, K = 128, G = 64, MANY_B = 20 };
    static const int Ns[NP] = {48, 16, 100, 32, 17}, kinds[NP] = {4, 4, 8, 0, 4};
    wset w[NP];
    for (int i = 0; i < NP; i++)
        if (wset_make(&w[i], kinds[i], kinds[i] ? G : 0, Ns[i], K)) {
            CHECK(0, "wset_make failed");
            return;
        }
    const ib_matrix *ms[NP];
    for (int i = 0; i < NP; i++) ms[i] = &w[i].m;
    float *x = malloc(sizeof(float) * MANY_B * K);
    for (int i = 0; i < MANY_B * K; i++) x[i] = rndf();
    ib_act_buf q = {malloc(MANY_B * K), malloc(sizeof(float) * MANY_B * K / G), malloc(sizeof(float) * MANY_B * K / G)};
    ib_quantize_act(x, MANY_B, K, G, q.xq, q.d, q.ad);
    float *alone[NP], *many[NP];
    for (int i = 0; i < NP; i++) alone[i] = malloc(sizeof(float) * MANY_B * Ns[i]), many[i] = malloc(sizeof(float) * MANY_B * Ns[i]);
    static const int Bs[] = {1, 3, 9, 20};   /* 20: 16 rows on AMX tiles, 4 on AVX-512 */
    int bad = 0, cases = 0;
    for (int ii = 0; ii < n_isas; ii++)
        for (int t = 1; t <= 3; t++)
            for (int bi = 0; bi < 4; bi++)
                for (int act = 0; act < 2; act++) {
                    ib_act a = act ? IB_ACT_Q8 : IB_ACT_F32;
                    for (int i = 0; i < NP; i++) ib_matmul(ms[i], x, Bs[bi], &q, a, isas[ii], pools[t], alone[i], Ns[i]);
                    ib_matmul_many(NP, ms, x, Bs[bi], &q, a, isas[ii], pools[t], many);
                    for (int i = 0; i < NP; i++) bad += !same_bits(alone[i], many[i], (size_t)Bs[bi] * Ns[i]), cases++;
                }
    CHECK(bad == 0, "ib_matmul_many differs from ib_matmul in %d of %d products", bad, cases);
    CHECK(!same_bits(alone[0], many[1], (size_t)Ns[1]), "the comparison cannot tell two products apart");
    for (int i = 0; i < NP; i++) free(alone[i]), free(many[i]), wset_free(&w[i]);
    free(x), free(q.xq), free(q.d), free(q.ad);
}

int main(void) {
    ib_error err;
    for (int t = 1; t <= 3; t++)
        if (ib_pool_create(t, &pools[t], &err) != IB_OK) {
            fprintf(stderr, "pool: %s\n", err.msg);
            return 1;
        }
    isas[n_isas++] = IB_ISA_SCALAR;
    if (ib_isa_supported(IB_ISA_AVX2)) isas[n_isas++] = IB_ISA_AVX2;
    if (ib_isa_supported(IB_ISA_AVX512)) isas[n_isas++] = IB_ISA_AVX512;
    if (ib_isa_supported(IB_ISA_NEON)) isas[n_isas++] = IB_ISA_NEON;
    const int have_amx = ib_isa_supported(IB_ISA_AMX);
    if (have_amx) isas[n_isas++] = IB_ISA_AMX;
    printf("test_matmul: ISAs:");
    for (int i = 0; i < n_isas; i++) printf(" %s", ib_isa_name(isas[i]));
    printf("\n");
    if (!have_amx) printf("SKIP amx: %s\n", amx_skip_reason());

    test_isa_api();
    test_quantize_special();
    test_quantize_avx512();
    test_mlx_unpack();
    test_validation();

    static const int Ks[] = {64, 128, 384, 1024};
    static const int groups[] = {32, 64, 128};
    for (int ki = 0; ki < 4; ki++) test_config(0, 0, 40, Ks[ki]);
    test_config(0, 0, 1000, 128);
    test_config(0, 0, 17, 7);   /* K not a multiple of anything */
    test_config(0, 0, 16, 300); /* K not a multiple of the K block */
    for (int bits = 4; bits <= 8; bits += 4)
        for (int gi = 0; gi < 3; gi++) {
            for (int ki = 0; ki < 4; ki++)
                if (Ks[ki] % groups[gi] == 0) test_config(bits, groups[gi], 40, Ks[ki]);
            test_config(bits, groups[gi], 1000, 384);
        }
    test_config(4, 64, 1000, 1024);
    test_config(8, 128, 1000, 1024);
    /* scales and biases exact in bfloat16 or float16 are stored in 16 bits (as MLX files give them) */
    for (sb_round = 1; sb_round <= 2; sb_round++) {
        test_config(4, 64, 40, 384);
        test_config(8, 32, 40, 128);
        test_config(4, 128, 1000, 384);
        test_big_batch(4, 64);
    }
    sb_round = 0;

    test_big_batch(0, 0);
    test_big_batch(4, 64);
    test_big_batch(8, 32);
    test_row_counts(4, 64, 27 * 16 - 5, 1024);
    test_row_counts(4, 128, 40, 4096);
    test_row_counts(8, 64, 27 * 16 - 5, 1024);
    test_row_counts(4, 32, 50, 256);    /* group 32: the AMX kernel's 32-byte K-steps */
    test_row_counts(8, 32, 50, 256);
    test_row_counts(8, 128, 50, 512);

    test_faults();
    if (have_amx) test_amx_fault();
    test_many();
    test_extreme_sums(8, 128);
    test_extreme_sums(4, 128);
    test_extreme_sums(8, 32);

    for (int t = 1; t <= 3; t++) ib_pool_free(pools[t]);
    TEST_MAIN_END("test_matmul");
}
