/*
 * test_fmath.c — accuracy and special values of src/core/fmath.c against libm (libm is allowed in
 * tests only: it is the reference, never the engine's math).
 *
 *   ib_expf : dense sweep of float bit patterns over [-110, 90] plus a uniform grid: <= 2 ulp against
 *             exp((double)x) for normal results, +inf above the overflow threshold, 0 where the
 *             header says so, exact specials.
 *   ib_exp  : relative error < 4e-16 against exp() over [-700, 700], specials.
 *   ib_log  : relative error < 4e-16 over random normal doubles of every binade and near 1, specials.
 *   ib_sincos: absolute error < 1e-15 * max(1, |x|/1e4) over [-1e5, 1e5], up to 1e7, and RoPE angles
 *             pos * theta^(-2i/d) for pos up to 131072 and frequencies down to ~1e-6.
 *   ib_pow  : pow(10000, -i/64) and RoPE-style exponents, relative error <= 4e-16 * (1 + |y ln x|).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/fmath.h"

/* One ulp of a float result near ref (ref > 0, normal float range). */
static double ulp_of_float(double ref)
{
    int e;
    frexp(ref, &e);
    return ldexp(1.0, e - 24);
}

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;

/* xorshift64 for test inputs only. */
static uint64_t next_u64(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Check ib_expf(x) against the double reference; returns the ulp error seen (0 for specials). */
static double check_expf_one(float x, long *bad)
{
    double ref = exp((double)x);
    float y = ib_expf(x);
    if (x > 88.72284f) {   /* e^x >= FLT_MAX + half ulp: must overflow */
        if (!(y == INFINITY)) (*bad)++;
        return 0;
    }
    if ((float)ref == INFINITY) { /* within the rounding boundary: inf or FLT_MAX both fine */
        if (!(y == INFINITY || y == FLT_MAX)) (*bad)++;
        return 0;
    }
    if (ref < FLT_MIN) {
        /* subnormal result: 0 allowed (flush) below -87.3, else within 2 subnormal ulps; below
         * -103.98 it must be 0 */
        if (x < -103.98f) {
            if (y != 0.0f) (*bad)++;
        } else if (!(y == 0.0f || fabs((double)y - ref) <= 2.0 * 0x1p-149)) {
            (*bad)++;
        }
        return 0;
    }
    if (!(y > 0.0f) || y == INFINITY) {
        (*bad)++;
        return 1e9;
    }
    return fabs((double)y - ref) / ulp_of_float(ref);
}

static void test_expf(void)
{
    double worst = 0;
    float worst_x = 0;
    long bad = 0, n = 0;
    /* every 101st float bit pattern (both signs) that lies in [-110, 90] */
    for (uint64_t b = 0; b < (1ULL << 32); b += 101) {
        uint32_t u = (uint32_t)b;
        float x;
        memcpy(&x, &u, sizeof x);
        if (!(x >= -110.0f && x <= 90.0f)) continue;
        double e = check_expf_one(x, &bad);
        n++;
        if (e > worst) { worst = e; worst_x = x; }
    }
    /* a uniform grid (the bit sweep above is dense near 0, sparse near the ends) */
    for (int i = 0; i <= 2000000; i++) {
        float x = (float)(-110.0 + 200.0 * i / 2000000.0);
        double e = check_expf_one(x, &bad);
        n++;
        if (e > worst) { worst = e; worst_x = x; }
    }
    printf("ib_expf: %ld inputs, max error %.3f ulp at %a\n", n, worst, worst_x);
    CHECK(n > 10000000, "sweep too small: %ld", n);
    CHECK(worst <= 2.0, "max error %.3f ulp at x=%a (%.9g)", worst, worst_x, worst_x);
    CHECK(bad == 0, "%ld inputs with wrong overflow/underflow handling", bad);

    /* specials and exact points */
    CHECK(ib_expf(0.0f) == 1.0f, "expf(0) = %a", ib_expf(0.0f));
    CHECK(ib_expf(-0.0f) == 1.0f, "expf(-0) = %a", ib_expf(-0.0f));
    CHECK(isnan(ib_expf(NAN)), "expf(NaN) = %a", ib_expf(NAN));
    CHECK(ib_expf(INFINITY) == INFINITY, "expf(inf) = %a", ib_expf(INFINITY));
    CHECK(ib_expf(-INFINITY) == 0.0f, "expf(-inf) = %a", ib_expf(-INFINITY));
    CHECK(ib_expf(88.73f) == INFINITY, "expf(88.73) = %a", ib_expf(88.73f));
    CHECK(ib_expf(1e30f) == INFINITY, "expf(1e30) = %a", ib_expf(1e30f));
    CHECK(ib_expf(-104.0f) == 0.0f, "expf(-104) = %a", ib_expf(-104.0f));
    CHECK(ib_expf(-1e30f) == 0.0f, "expf(-1e30) = %a", ib_expf(-1e30f));
    float big = ib_expf(88.72283f);
    CHECK(big > 3.4e38f && big <= FLT_MAX, "expf(88.72283) = %a", big);
    float small = ib_expf(-87.33f);
    CHECK(small >= FLT_MIN && small < 1.2e-38f, "expf(-87.33) = %a", small);
    /* e^1 to within 1 ulp of the correctly rounded float e */
    CHECK(fabsf(ib_expf(1.0f) - 2.7182817f) <= 2.4e-7f, "expf(1) = %.9g", ib_expf(1.0f));
}

static void test_exp(void)
{
    double worst = 0, worst_x = 0;
    for (long i = 0; i <= 4000000; i++) {
        double x = -700.0 + 1400.0 * (double)i / 4000000.0 + 1e-7 * (double)(i % 7);
        double y = ib_exp(x), r = exp(x);
        double e = fabs(y - r) / r;
        if (!(e <= worst)) { worst = e; worst_x = x; }
    }
    for (long i = 0; i < 2000000; i++) { /* small |x| with full mantissas */
        uint64_t u = next_u64();
        double x = ((double)(u >> 11) * 0x1p-53 - 0.5) * 4.0;
        double y = ib_exp(x), r = exp(x);
        double e = fabs(y - r) / r;
        if (!(e <= worst)) { worst = e; worst_x = x; }
    }
    printf("ib_exp: max relative error %.3g at %.17g\n", worst, worst_x);
    CHECK(worst < 4e-16, "exp relative error %.3g at x=%.17g", worst, worst_x);
    CHECK(ib_exp(0.0) == 1.0, "exp(0) = %a", ib_exp(0.0));
    CHECK(isnan(ib_exp(NAN)), "exp(NaN) = %a", ib_exp(NAN));
    CHECK(ib_exp(INFINITY) == INFINITY, "exp(inf) = %a", ib_exp(INFINITY));
    CHECK(ib_exp(-INFINITY) == 0.0, "exp(-inf) = %a", ib_exp(-INFINITY));
    CHECK(ib_exp(710.0) == INFINITY, "exp(710) = %a", ib_exp(710.0));
    CHECK(ib_exp(-746.0) == 0.0, "exp(-746) = %a", ib_exp(-746.0));
    double big = ib_exp(709.78);
    CHECK(fabs(big - exp(709.78)) / exp(709.78) < 4e-16, "exp(709.78) = %a vs %a", big, exp(709.78));
    double sub = ib_exp(-740.0), subr = exp(-740.0); /* subnormal: within a few subnormal ulps */
    CHECK(fabs(sub - subr) <= 4.0 * 0x1p-1074, "exp(-740) = %a vs %a", sub, subr);
}

static void test_log(void)
{
    double worst = 0, worst_x = 0;
    for (long i = 0; i < 4000000; i++) {
        uint64_t s = next_u64();
        uint64_t u = (s & 0x000fffffffffffffULL) | ((uint64_t)(1 + (s >> 52) % 2046) << 52);
        double x;
        memcpy(&x, &u, sizeof x);
        if (i % 4 == 1) x = 1.0 + (x - floor(x)) * 1e-3;
        if (i % 4 == 3) x = 1.0 - (x - floor(x)) * 1e-3;
        double y = ib_log(x), r = log(x);
        double e = (r != 0.0) ? fabs(y - r) / fabs(r) : fabs(y);
        if (!(e <= worst)) { worst = e; worst_x = x; }
    }
    for (int i = 1; i < 100000; i++) { /* a dense grid over [0.5, 4) */
        double x = 0.5 + 3.5 * i / 100000.0;
        double y = ib_log(x), r = log(x);
        double e = (r != 0.0) ? fabs(y - r) / fabs(r) : fabs(y);
        if (!(e <= worst)) { worst = e; worst_x = x; }
    }
    printf("ib_log: max relative error %.3g at %.17g\n", worst, worst_x);
    CHECK(worst < 4e-16, "log relative error %.3g at x=%.17g", worst, worst_x);
    CHECK(ib_log(1.0) == 0.0, "log(1) = %a", ib_log(1.0));
    CHECK(ib_log(0.0) == -INFINITY, "log(0) = %a", ib_log(0.0));
    CHECK(isnan(ib_log(-1.0)), "log(-1) = %a", ib_log(-1.0));
    CHECK(isnan(ib_log(NAN)), "log(NaN) = %a", ib_log(NAN));
    CHECK(ib_log(INFINITY) == INFINITY, "log(inf) = %a", ib_log(INFINITY));
    double d = 0x1p-1060; /* subnormal */
    CHECK(fabs(ib_log(d) - log(d)) / fabs(log(d)) < 4e-16, "log(2^-1060) = %.17g vs %.17g", ib_log(d), log(d));
    CHECK(fabs(ib_log(DBL_MAX) - log(DBL_MAX)) / log(DBL_MAX) < 4e-16, "log(DBL_MAX) = %.17g", ib_log(DBL_MAX));
    CHECK(fabs(ib_log(10000.0) - log(10000.0)) / log(10000.0) < 4e-16, "log(1e4) = %.17g", ib_log(10000.0));
}

/* Returns max over the inputs of error / (1e-15 * max(1, |x|/1e4)): must stay below 1. */
static double sincos_err(double x)
{
    double s, c;
    ib_sincos(x, &s, &c);
    double e = fmax(fabs(s - sin(x)), fabs(c - cos(x)));
    return e / (1e-15 * fmax(1.0, fabs(x) / 1e4));
}

static void test_sincos(void)
{
    double worst = 0, worst_x = 0;
    for (long i = 0; i <= 4000000; i++) {
        double x = -1e5 + 2e5 * (double)i / 4000000.0 + 1e-6 * (double)(i % 13);
        double e = sincos_err(x);
        if (!(e <= worst)) { worst = e; worst_x = x; }
    }
    for (long i = 0; i < 1000000; i++) { /* random up to 1e7, and near multiples of pi/2 */
        double x = ((double)(next_u64() >> 11) * 0x1p-53 * 2.0 - 1.0) * 1e7;
        if (i % 2) x = rint(x / 1.5707963267948966) * 1.5707963267948966;
        double e = sincos_err(x);
        if (!(e <= worst)) { worst = e; worst_x = x; }
    }
    printf("ib_sincos: max error %.3g of the bound at %.17g\n", worst, worst_x);
    CHECK(worst < 1.0, "sincos error %.3g x bound at x=%.17g", worst, worst_x);

    /* RoPE: angle = pos * theta^(-2i/d), theta 1e4 and 1e6, d = 128 (frequencies down to ~1.2e-6) */
    double rope_worst = 0, rope_x = 0;
    const double thetas[2] = {10000.0, 1000000.0};
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 64; i++) {
            double freq = ib_pow(thetas[t], -2.0 * i / 128.0);
            for (int pos = 0; pos <= 131072; pos += (pos < 4096 ? 1 : 61)) {
                double x = (double)pos * freq;
                double e = sincos_err(x);
                if (!(e <= rope_worst)) { rope_worst = e; rope_x = x; }
            }
        }
    }
    printf("ib_sincos RoPE: max error %.3g of the bound at %.17g\n", rope_worst, rope_x);
    CHECK(rope_worst < 1.0, "RoPE sincos error %.3g x bound at x=%.17g", rope_worst, rope_x);

    double s, c;
    ib_sincos(0.0, &s, &c);
    CHECK(s == 0.0 && c == 1.0, "sincos(0) = %a %a", s, c);
    ib_sincos(-0.0, &s, &c);
    CHECK(s == 0.0 && signbit(s) && c == 1.0, "sincos(-0) = %a %a", s, c);
    ib_sincos(NAN, &s, &c);
    CHECK(isnan(s) && isnan(c), "sincos(NaN) = %a %a", s, c);
    ib_sincos(INFINITY, &s, &c);
    CHECK(isnan(s) && isnan(c), "sincos(inf) = %a %a", s, c);
    ib_sincos(1e-300, &s, &c);
    CHECK(s == 1e-300 && c == 1.0, "sincos(1e-300) = %a %a", s, c);
    /* sin^2 + cos^2 = 1 at a few quadrants */
    for (int q = -8; q <= 8; q++) {
        ib_sincos(q * 0.9, &s, &c);
        CHECK(fabs(s * s + c * c - 1.0) < 1e-15, "q=%d: s^2+c^2-1 = %g", q, s * s + c * c - 1.0);
    }
}

static void test_pow(void)
{
    double worst = 0;
    int worst_i = 0;
    for (int i = 0; i <= 64; i++) {
        double y = -(double)i / 64.0;
        double v = ib_pow(10000.0, y), r = pow(10000.0, y);
        double e = fabs(v - r) / r / (1.0 + fabs(y * log(10000.0)));
        if (e > worst) { worst = e; worst_i = i; }
    }
    printf("ib_pow: max relative error / (1+|y ln x|) %.3g at i=%d\n", worst, worst_i);
    CHECK(worst <= 4e-16, "pow(10000, -i/64) scaled error %.3g at i=%d", worst, worst_i);
    double wx = 0, wy = 0;
    worst = 0;
    for (int i = 0; i < 100000; i++) {
        double x = 0.01 + (double)(next_u64() >> 11) * 0x1p-53 * 1e6;
        double y = ((double)(next_u64() >> 11) * 0x1p-53 - 0.5) * 8.0;
        double v = ib_pow(x, y), r = pow(x, y);
        double e = fabs(v - r) / r / (1.0 + fabs(y * log(x)));
        if (e > worst) { worst = e; wx = x; wy = y; }
    }
    printf("ib_pow random: max scaled error %.3g at pow(%.17g, %.17g)\n", worst, wx, wy);
    CHECK(worst <= 4e-16, "pow(%.17g, %.17g) scaled error %.3g", wx, wy, worst);
    CHECK(ib_pow(10000.0, 0.0) == 1.0, "pow(1e4, 0) = %a", ib_pow(10000.0, 0.0));
    CHECK(ib_pow(1.0, 123.5) == 1.0, "pow(1, 123.5) = %a", ib_pow(1.0, 123.5));
    CHECK(ib_pow(2.0, 10.0) == 1024.0 || fabs(ib_pow(2.0, 10.0) - 1024.0) < 1024.0 * 4e-15,
          "pow(2,10) = %.17g", ib_pow(2.0, 10.0));
}

int main(void)
{
    test_expf();
    test_exp();
    test_log();
    test_sincos();
    test_pow();
    TEST_MAIN_END("test_fmath");
}
