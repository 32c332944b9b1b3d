/*
 * fmath.h — the few transcendental functions the engine needs, written once in plain C so every
 * platform (and a CUDA build) computes the same bits. Never call libm's exp/sin/cos/pow/log in the
 * engine: they differ across platforms and versions. Only IEEE-exact operations (+ - * / sqrt,
 * rint, floor, fabs, ldexp-style bit assembly) are used inside.
 */
#ifndef IB_CORE_FMATH_H
#define IB_CORE_FMATH_H
#include <math.h>
#include <stdint.h>

#include "core/hd.h"

/* e^x in float: max error <= 2 ulp over the normal range; returns +inf above ~88.72, 0 below
 * ~-103.97 (subnormal results flushed to 0 are allowed below -87.3), NaN for NaN, 0 for -inf. */
float ib_expf(float x);

/* ib_expf with the same bits for every input, written without branches or calls so a loop over
 * independent elements vectorizes (softmax weights, SiLU). Steps as in fmath.c's ib_expf; the two
 * range ends and NaN are selected at the end, and 2^n is applied as (p * e) * 2^min(n, 127) with
 * e = 2 when n = 128, else 1 (multiplying by 1 is exact). Callable from CUDA device code (IB_HD): the
 * CUDA backend's softmax and SiLU use it, so GPU and CPU exponentials are one definition. */
IB_HD static inline float ib_expf_lane(float x) {
    const float x_max = 0x1.62e42ep+6f, x_min = -0x1.5d589ep+6f, shifter = 0x1.8p23f;
    float xc = x > x_max ? x_max : x;
    xc = xc < x_min ? x_min : xc;
    xc = x != x ? 0.0f : xc;
    float n = (xc * 0x1.715476p+0f + shifter) - shifter;
    float r = (xc - n * 0x1.62e4p-1f) - n * 0x1.7f7d1cp-20f;
    float r2 = r * r;
    float a = 0.5f + 0x1.555556p-3f * r;
    float b = 0x1.555556p-5f + 0x1.111112p-7f * r;
    float c = 0x1.6c16c2p-10f + 0x1.a01a02p-13f * r;
    float q = a + r2 * (b + r2 * c);
    float p = 1.0f + (r + r2 * q);
    int k = (int)n;
    float extra = k > 127 ? 2.0f : 1.0f;
    k = k > 127 ? 127 : k;
    union { uint32_t u; float f; } two_k = {(uint32_t)(k + 127) << 23};
    float res = (p * extra) * two_k.f;
    res = x > x_max ? (float)INFINITY : res;
    res = x < x_min ? 0.0f : res;
    return x != x ? x + x : res;
}

/* e^x in double: relative error < 4e-16 for |x| < 700; +inf / 0 outside. */
double ib_exp(double x);

/* ib_exp with the same bits for every input, written without branches or calls so a loop over
 * independent elements vectorizes (log-sum-exp over a vocabulary). Steps as in fmath.c's ib_exp: n =
 * rint(x * log2 e) as (v + 1.5*2^52) - 1.5*2^52 on x clamped to ib_exp's range (exact there), whose
 * low bits also give the integer k for 2^k; the three ways ib_exp applies 2^k are one product
 * ((y * pre) * 2^kk) * post with factors of 1 where a case does not apply (multiplying by 1 is
 * exact); the range ends and NaN are selected at the end. Callable from CUDA device code (IB_HD):
 * the CUDA backend's logit soft-cap (ib_softcap's definition) uses it. */
IB_HD static inline double ib_exp_lane(double x) {
    const double x_max = 0x1.62e42fefa39efp+9, x_min = -745.2, shifter = 0x1.8p52;
    double xc = x > x_max ? x_max : x;
    xc = xc < x_min ? x_min : xc;
    xc = x != x ? 0.0 : xc;
    double s = xc * 0x1.71547652b82fep+0 + shifter, n = s - shifter;
    double r = (xc - n * 0x1.62e42fefa38p-1) - n * 0x1.ef35793c7673p-45;
    double q = 0x1.6124613a86d09p-33;
    q = q * r + 0x1.1eed8eff8d898p-29;
    q = q * r + 0x1.ae64567f544e4p-26;
    q = q * r + 0x1.27e4fb7789f5cp-22;
    q = q * r + 0x1.71de3a556c734p-19;
    q = q * r + 0x1.a01a01a01a01ap-16;
    q = q * r + 0x1.a01a01a01a01ap-13;
    q = q * r + 0x1.6c16c16c16c17p-10;
    q = q * r + 0x1.1111111111111p-7;
    q = q * r + 0x1.5555555555555p-5;
    q = q * r + 0x1.5555555555555p-3;
    q = q * r + 0.5;
    double y = 1.0 + (r + (r * r) * q);
    union { double d; int64_t i; } sb = {s}, shb = {shifter};
    int64_t k = sb.i - shb.i; /* n as an integer: s and the shifter share their exponent */
    int64_t kk = k > 1023 ? 1023 : (k < -1022 ? k + 54 : k);
    double pre = k > 1023 ? 2.0 : 1.0, post = k < -1022 ? 0x1p-54 : 1.0;
    union { int64_t i; double d; } two_kk = {(kk + 1023) << 52};
    double res = ((y * pre) * two_kk.d) * post;
    res = x > x_max ? (double)INFINITY : res;
    res = x < x_min ? 0.0 : res;
    return x != x ? x + x : res;
}

/* Natural log in double: relative error < 4e-16 for x > 0 normal; -inf for 0, NaN for x < 0. */
double ib_log(double x);

/* sin and cos of x in double, absolute error < 1e-15 * max(1, |x| / 1e4) for |x| <= 1e7
 * (Cody–Waite reduction by pi/2 in three parts). */
void ib_sincos(double x, double *s, double *c);

/* x^y = exp(y * log(x)) for x > 0. */
double ib_pow(double x, double y);

#endif
