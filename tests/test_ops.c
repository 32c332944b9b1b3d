/*
 * test_ops.c — every non-matmul op against a float64 reference on fresh random inputs, with the
 * error bound stated per op (u = 2^-24, the float32 unit roundoff). Matmul has its own test.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/fmath.h"
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

int main(void) {
    test_dot16();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_attention();
    test_expf_lane();
    test_exp_lane();
    test_fmath_in_ops();
    TEST_MAIN_END("test_ops");
}
