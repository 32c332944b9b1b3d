/*
 * test_ops.c — every non-matmul op against a float64 reference on fresh random inputs, with the
 * error bound stated per op (u = 2^-24, the float32 unit roundoff). Matmul has its own test.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/fmath.h"
#include "ops/act_def.h"
#include "ops/ops.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static double urand(void) { /* [0,1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static float frand(float a) { return (float)((urand() * 2 - 1) * a); }

#define U 5.9604644775390625e-08 /* 2^-24 */

static void test_dot16(void) {
    for (int n = 1; n <= 300; n += 7) {
        float a[300], b[300];
        double ref = 0, mag = 0;
        for (int i = 0; i < n; i++) {
            a[i] = frand(2), b[i] = frand(2);
            ref += (double)a[i] * b[i];
            mag += fabs((double)a[i] * b[i]);
        }
        double err = fabs(ib_dot16(a, b, n) - ref);
        /* bound: (n/16 + 4 + 1) * u * sum|a_i b_i| (lane chains of n/16, 4 fold levels, products) */
        CHECK(err <= (n / 16.0 + 5) * U * mag * 1.01 + 1e-30, "dot16 n=%d err %g bound %g", n, err, (n / 16.0 + 5) * U * mag);
    }
}

static void test_rmsnorm(void) {
    int R = 5, D = 384;
    float *x = malloc(R * D * 4), *w = malloc(D * 4), *y = malloc(R * D * 4);
    for (int i = 0; i < R * D; i++) x[i] = frand(3);
    for (int i = 0; i < D; i++) w[i] = 1 + frand(0.2f);
    ib_rmsnorm(x, w, R, D, 1e-6f, y, NULL);
    double worst = 0;
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[r * D + i] * x[r * D + i];
        double inv = 1 / sqrt(ss / D + 1e-6);
        for (int i = 0; i < D; i++) {
            double ref = x[r * D + i] * inv * w[i];
            double rel = fabs(y[r * D + i] - ref) / (fabs(ref) + 1e-30);
            if (rel > worst) worst = rel;
        }
    }
    /* bound: relative (D/16 + 10) u — the sum of squares, a division, a sqrt, two products */
    CHECK(worst <= (D / 16.0 + 10) * U, "rmsnorm rel err %g", worst);
    /* rows independent: row 3 alone gives the same bits */
    float y1[384];
    ib_rmsnorm(x + 3 * D, w, 1, D, 1e-6f, y1, NULL);
    CHECK(memcmp(y1, y + 3 * D, D * 4) == 0, "rmsnorm row 3 depends on its batch");
    free(x), free(w), free(y);
}

static void test_rope(void) {
    int R = 6, H = 3, hd = 128;
    int32_t pos[6] = {0, 1, 148, 4095, 40000, 131071};
    float *x = malloc(R * H * hd * 4), *x0 = malloc(R * H * hd * 4), *cs = malloc(R * hd * 4);
    for (int i = 0; i < R * H * hd; i++) x0[i] = x[i] = frand(2);
    ib_rope_table(pos, R, hd, 1e6, cs);
    ib_rope(x, R, H, hd, cs);
    double worst = 0;
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < hd / 2; i++) {
                double ang = pos[r] * pow(1e6, -2.0 * i / hd);
                double c = cos(ang), s = sin(ang);
                const float *v = x0 + (r * H + h) * hd;
                double ra = v[i] * c - v[i + hd / 2] * s, rb = v[i + hd / 2] * c + v[i] * s;
                double mag = fabs(v[i]) + fabs(v[i + hd / 2]);
                double e1 = fabs(x[(r * H + h) * hd + i] - ra) / mag, e2 = fabs(x[(r * H + h) * hd + i + hd / 2] - rb) / mag;
                if (e1 > worst) worst = e1;
                if (e2 > worst) worst = e2;
            }
    /* bound: 4u relative to |a|+|b| (cos/sin rounded to float, two products, one sum) */
    CHECK(worst <= 4 * U, "rope err %g", worst);
    free(x), free(x0), free(cs);
}

static void test_swiglu(void) {
    int n = 4096;
    float *g = malloc(n * 4), *u = malloc(n * 4), *g0 = malloc(n * 4);
    for (int i = 0; i < n; i++) g0[i] = g[i] = frand(12), u[i] = frand(3);
    ib_swiglu(g, u, 1, n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double ref = g0[i] / (1 + exp(-(double)g0[i])) * u[i];
        double rel = fabs(g[i] - ref) / (fabs(ref) + 1e-30);
        if (rel > worst) worst = rel;
    }
    /* bound: 8u relative (exp <= 2 ulp, a sum, a division, a product) */
    CHECK(worst <= 8 * U, "swiglu rel err %g", worst);
    free(g), free(u), free(g0);
}

/* Gemma 4's GeGLU: gelu_pytorch_tanh(g) * u against float64. t = 2 sqrt(2/pi) (x + 0.044715 x^3) carries
 * about 6u relative, which exp turns into |t| * 6u relative: bound (10 + 6|t|) u per element. */
static void test_geglu(void) {
    int n = 4096;
    float *g = malloc(n * 4), *u = malloc(n * 4), *g0 = malloc(n * 4);
    for (int i = 0; i < n; i++) g0[i] = g[i] = frand(8), u[i] = frand(3);
    g0[0] = g[0] = 0.0f, g0[1] = g[1] = -30.0f, g0[2] = g[2] = 30.0f;
    ib_geglu(g, u, 1, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        double x = g0[i], a = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
        /* 0.5 x (1 + tanh a) written as x / (1 + e^(-2a)): the same function, without the cancellation
         * 1 + tanh(a) suffers in double for a << 0 (at x = -8 it is 0) */
        double ref = x / (1.0 + exp(-2.0 * a)) * u[i];
        double rel = fabs(g[i] - ref) / (fabs(ref) + 1e-300);
        if (ref != 0 && rel > (10 + 6 * fabs(2 * a)) * U) bad++;
        if (ref == 0 && g[i] != 0) bad++;
    }
    CHECK(bad == 0, "geglu: %d elements beyond (10 + 6|t|)u", bad);
    free(g), free(u), free(g0);
}

/* Soft-capping: cap * tanh(x / cap) within 2u relative (computed in double, rounded once), odd. */
static void test_softcap(void) {
    int n = 4096;
    float *x = malloc(n * 4), *x0 = malloc(n * 4), *xn = malloc(n * 4);
    for (int i = 0; i < n; i++) x0[i] = x[i] = frand(i < 100 ? 1e-4f : 200.0f), xn[i] = -x[i];
    ib_softcap(x, (size_t)n, 30.0f);
    ib_softcap(xn, (size_t)n, 30.0f);
    double worst = 0;
    int odd = 1;
    for (int i = 0; i < n; i++) {
        double ref = 30.0 * tanh((double)x0[i] / 30.0);
        double rel = fabs(x[i] - ref) / (fabs(ref) + 1e-300);
        if (rel > worst) worst = rel;
        odd &= xn[i] == -x[i];
    }
    CHECK(worst <= 2 * U, "softcap rel err %g", worst);
    CHECK(odd, "softcap(-x) != -softcap(x)");
    float z[3] = {0.0f, INFINITY, NAN};
    ib_softcap(z, 3, 30.0f);
    CHECK(z[0] == 0.0f && z[1] == 30.0f && z[2] != z[2], "softcap(0, inf, nan) = %g %g %g", z[0], z[1], z[2]);
    free(x), free(x0), free(xn);
}

/* ib_softcap (built per ISA: its AVX-512 or AVX2 clone where the CPU has one) gives, element for
 * element, the bits of ib_softcap_elem's definition called one value at a time here: random values
 * over many magnitudes, both signs, and the special ones (zeros, subnormals, the largest floats,
 * infinities, NaNs with payloads), at an odd length (the clone's remainder lanes too). */
static void test_softcap_clone(void) {
    const int n = 40001;
    float *x = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                                0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffc12345u, 0x7f800001u, 0x41f00000u,
                                0xc1f00000u, 0x3f800000u};
    const int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < n; i++) {
        if (i < ns) {
            memcpy(&x[i], &special[i], 4);
        } else {
            const float mag = (i % 7 == 0) ? 1e-30f : (i % 7 == 1) ? 1e-3f : (i % 7 == 2) ? 1.0f : (i % 7 == 3) ? 30.0f
                              : (i % 7 == 4) ? 500.0f : (i % 7 == 5) ? 1e20f : 60.0f;
            x[i] = frand(mag);
        }
        want[i] = ib_softcap_elem(x[i], 30.0f);
    }
    ib_softcap(x, (size_t)n, 30.0f);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += memcmp(&x[i], &want[i], 4) != 0;
    CHECK(bad == 0, "softcap: %d of %d elements differ from the element definition's bits", bad, n);
    free(x), free(want);
}

/* Proportional RoPE tables: all pairs rotated is ib_rope_table bitwise; with n_rot pairs the first
 * n_rot are ib_rope_table's and the rest {1, 0}, which ib_rope leaves unchanged. Weightless head
 * norms equal a weight of ones bitwise. */
static void test_rope_pairs_and_unit_norm(void) {
    enum { R = 5, HD = 64, HALF = HD / 2 };
    int32_t pos[R] = {0, 1, 17, 148, 4095};
    float a[R * HD], b[R * HD];
    ib_rope_table(pos, R, HD, 1e6, a);
    ib_rope_table_pairs(pos, R, HD, 1e6, HALF, b);
    CHECK(memcmp(a, b, sizeof a) == 0, "rope_table_pairs(all) differs from rope_table");
    ib_rope_table_pairs(pos, R, HD, 1e6, 8, b);
    int same = 1;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < HALF; i++) {
            const float *ta = a + ((size_t)r * HALF + i) * 2, *tb = b + ((size_t)r * HALF + i) * 2;
            if (i < 8) same &= ta[0] == tb[0] && ta[1] == tb[1];
            else same &= tb[0] == 1.0f && tb[1] == 0.0f;
        }
    CHECK(same, "rope_table_pairs(8): rotated pairs differ or the others are not {1, 0}");
    float x[R * HD], x0[R * HD];
    for (int i = 0; i < R * HD; i++) x0[i] = x[i] = frand(2);
    ib_rope(x, R, 1, HD, b);
    int kept = 1;
    for (int r = 0; r < R; r++)
        for (int i = 8; i < HALF; i++) kept &= x[r * HD + i] == x0[r * HD + i] && x[r * HD + i + HALF] == x0[r * HD + i + HALF];
    CHECK(kept, "rope with {1, 0} pairs changed them");
    float ones[HD], y1[R * HD], y2[R * HD];
    for (int i = 0; i < HD; i++) ones[i] = 1.0f;
    memcpy(y1, x0, sizeof y1), memcpy(y2, x0, sizeof y2);
    ib_rmsnorm_heads(y1, ones, R, 1, HD, 1e-6f, NULL);
    ib_rmsnorm_heads(y2, NULL, R, 1, HD, 1e-6f, NULL);
    CHECK(memcmp(y1, y2, sizeof y1) == 0, "weightless head norm differs from a weight of ones");
}

static void test_attention(void) {
    int hd = 64;
    for (int n_keys = 1; n_keys <= 200; n_keys += 37) {
        float *k = malloc(n_keys * hd * 4), *v = malloc(n_keys * hd * 4), q[64], out[64];
        for (int i = 0; i < n_keys * hd; i++) k[i] = frand(1), v[i] = frand(1);
        for (int i = 0; i < hd; i++) q[i] = frand(3);
        float scale = 1.0f / sqrtf((float)hd);
        ib_attend_one(q, k, v, n_keys, hd, hd, scale, IB_ATTN_BLOCK, out);
        double *s = malloc(n_keys * sizeof *s), m = -1e300, l = 0, worst = 0;
        for (int j = 0; j < n_keys; j++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[i] * k[j * hd + i];
            s[j] = d * scale;
            if (s[j] > m) m = s[j];
        }
        for (int j = 0; j < n_keys; j++) l += exp(s[j] - m);
        for (int i = 0; i < hd; i++) {
            double ref = 0;
            for (int j = 0; j < n_keys; j++) ref += exp(s[j] - m) / l * v[j * hd + i];
            double e = fabs(out[i] - ref);
            if (e > worst) worst = e;
        }
        /* bound: absolute (hd/16 * |q||k| score error propagated + n_keys accumulation) ~ 64 u * (n_keys/32 + 8),
           with |v| <= 1 */
        double bound = 64 * U * (n_keys / 32.0 + 8);
        CHECK(worst <= bound, "attention n_keys=%d err %g bound %g", n_keys, worst, bound);
        free(k), free(v), free(s);
    }
}

/* the lane-parallel exp used by softmax and SiLU equals ib_expf bit for bit */
static void test_expf_lane(void) {
    long bad = 0;
    for (float x = -120.0f; x < 100.0f; x += 0.000731f) {
        float a = ib_expf(x), b = ib_expf_lane(x);
        if (memcmp(&a, &b, 4)) bad++;
    }
    static const float special[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 88.72283172607421875f, 88.7228393554688f,
                                    -87.33654022216796875f, -87.3365478515625f, 88.0f, 88.5f, -0.0f, 1e-30f, -1e-30f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) {
        float a = ib_expf(special[i]), b = ib_expf_lane(special[i]);
        if (!(isnan(a) && isnan(b)) && memcmp(&a, &b, 4)) bad++;
    }
    CHECK(bad == 0, "ib_expf_lane differs from ib_expf at %ld inputs", bad);
}

/* the lane-parallel double exp used by log-sum-exp equals ib_exp bit for bit: a sweep, both range
 * ends, the subnormal results (k < -1022) and the k = 1024 case, specials */
static void test_exp_lane(void) {
    long bad = 0;
    for (double x = -760.0; x < 720.0; x += 0.0137) {
        double a = ib_exp(x), b = ib_exp_lane(x);
        if (memcmp(&a, &b, 8)) bad++;
    }
    for (double x = -1.0; x < 1.0; x += 0.000123) {
        double a = ib_exp(x), b = ib_exp_lane(x);
        if (memcmp(&a, &b, 8)) bad++;
    }
    static const double special[] = {INFINITY, -INFINITY, NAN, 0.0, -0.0, 0x1.62e42fefa39efp+9,
                                     0x1.62e42fefa39f0p+9, 709.5, 709.0, -745.2, -745.19999, -745.2000001,
                                     -708.4, -708.39, -709.09, -744.0, -740.5, 1e-300, -1e-300, 0.5, -0.5};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) {
        double a = ib_exp(special[i]), b = ib_exp_lane(special[i]);
        if (!(isnan(a) && isnan(b)) && memcmp(&a, &b, 8)) bad++;
    }
    CHECK(bad == 0, "ib_exp_lane differs from ib_exp at %ld inputs", bad);
}

static void test_fmath_in_ops(void) {
    /* ib_expf as used by softmax: exp(-inf) = 0, exp(0) = 1 exactly */
    CHECK(ib_expf(-INFINITY) == 0.0f, "expf(-inf) = %g", ib_expf(-INFINITY));
    CHECK(ib_expf(0.0f) == 1.0f, "expf(0) = %g", ib_expf(0.0f));
}

/* Gemma 4's MoE routing: top-k in rank order with ties to the lowest id, NaN never taken, weights
 * against float64 (softmax renormalised over the selected, times per_expert_scale), and the combine
 * in rank order. */
static void test_moe_route(void) {
    float lg[8] = {0.5f, 2.0f, -1.0f, 2.0f, 0.25f, 1.0f, NAN, -3.0f}, sc[8], p[8], w[3];
    int32_t sel[3];
    for (int e = 0; e < 8; e++) sc[e] = 0.5f + 0.125f * e;
    CHECK(ib_moe_route(lg, 8, 3, sc, p, sel, w) == 0, "route failed");
    CHECK(sel[0] == 1 && sel[1] == 3 && sel[2] == 5, "ranks %d %d %d, expected 1 3 5 (tie to the lower id)", sel[0],
          sel[1], sel[2]);
    double ex[3], t = 0;
    for (int j = 0; j < 3; j++) t += ex[j] = exp((double)lg[sel[j]] - 2.0);
    double worst = 0;
    for (int j = 0; j < 3; j++) {
        double ref = ex[j] / t * sc[sel[j]], d = fabs(w[j] - ref) / ref;
        if (d > worst) worst = d;
    }
    CHECK(worst <= 1e-6, "moe weights: relative error %g > 1e-6 against float64", worst);
    CHECK(p[1] == p[3] && p[6] == 0.0f, "softmax: tied logits %g %g, NaN logit %g", p[1], p[3], p[6]);
    float only_nan[2] = {NAN, NAN};
    CHECK(ib_moe_route(only_nan, 2, 1, sc, p, sel, w) == -1, "all-NaN logits routed");
    /* combine: rank order, skipped ranks, mul then add */
    float y[3][4], out[4];
    for (int j = 0; j < 3; j++)
        for (int d = 0; d < 4; d++) y[j][d] = (float)(j + 1) * (d - 1.5f);
    int32_t s3[3] = {4, -1, 2};
    float w3[3] = {0.25f, 100.0f, 0.5f};
    ib_moe_combine(&y[0][0], w3, s3, 3, 4, out);
    int same = 1;
    for (int d = 0; d < 4; d++) same &= out[d] == (0.0f + 0.25f * y[0][d]) + 0.5f * y[2][d];
    CHECK(same, "combine differs from rank order with rank 1 skipped");
}

int main(void) {
    test_moe_route();
    test_dot16();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_geglu();
    test_softcap();
    test_softcap_clone();
    test_rope_pairs_and_unit_norm();
    test_attention();
    test_expf_lane();
    test_exp_lane();
    test_fmath_in_ops();
    TEST_MAIN_END("test_ops");
}
