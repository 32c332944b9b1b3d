/*
 * fmath.h — the few transcendental functions the engine needs, written once in plain C so every
 * platform (and a CUDA build) computes the same bits. Never call libm's exp/sin/cos/pow/log in the
 * engine: they differ across platforms and versions. Only IEEE-exact operations (+ - * / sqrt,
 * rint, floor, fabs, ldexp-style bit assembly) are used inside.
 */
#ifndef IB_CORE_FMATH_H
#define IB_CORE_FMATH_H

/* e^x in float: max error <= 2 ulp over the normal range; returns +inf above ~88.72, 0 below
 * ~-103.97 (subnormal results flushed to 0 are allowed below -87.3), NaN for NaN, 0 for -inf. */
float ib_expf(float x);

/* e^x in double: relative error < 4e-16 for |x| < 700; +inf / 0 outside. */
double ib_exp(double x);

/* Natural log in double: relative error < 4e-16 for x > 0 normal; -inf for 0, NaN for x < 0. */
double ib_log(double x);

/* sin and cos of x in double, absolute error < 1e-15 * max(1, |x| / 1e4) for |x| <= 1e7
 * (Cody–Waite reduction by pi/2 in three parts). */
void ib_sincos(double x, double *s, double *c);

/* x^y = exp(y * log(x)) for x > 0. */
double ib_pow(double x, double y);

#endif
