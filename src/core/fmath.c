/*
 * fmath.c — deterministic transcendental functions (see fmath.h).
 *
 * Every function here uses only IEEE-754 operations that are exactly specified (+ - * / on float or
 * double, rint/rintf with the default round-to-nearest mode, fabs) plus exponent assembly through the
 * bit pattern, evaluated in a fixed order (the build has -ffp-contract=off, no long double). So the
 * same inputs give the same bits on every platform. A vector kernel that needs ib_expf in SIMD must
 * repeat exactly the float operations of ib_expf below, in the same order, to get the same bits.
 *
 * Constants were derived for this file with 300-bit arithmetic:
 *   - ln2 split in a "hi" part with few significant bits (so n * hi is exact for every n we use) and
 *     the rounded remainder "lo";
 *   - pi/2 split in three parts, the first two with 30 significant bits each;
 *   - polynomial coefficients are plain Taylor coefficients (1/k!, 2/(2k+1)) rounded to nearest,
 *     with enough terms that the truncation error is far below the rounding error.
 */
#include "core/fmath.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- bit helpers */

/* 2^k as a float for -126 <= k <= 127 (normal range), by building the exponent field. */
static inline float pow2f_(int k)
{
    uint32_t u = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 2^k as a double for -1022 <= k <= 1023 (normal range). */
static inline double pow2d_(int k)
{
    uint64_t u = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* ---------------------------------------------------------------- expf */

/* ln2 = EXPF_LN2_HI + EXPF_LN2_LO; HI has 15 significant bits, so n * HI is exact for |n| <= 511. */
#define EXPF_LN2_HI 0x1.62e4p-1f
#define EXPF_LN2_LO 0x1.7f7d1cp-20f
#define EXPF_LOG2E 0x1.715476p+0f
/* Above this (the largest float whose e^x rounds below FLT_MAX) the result is +inf. */
#define EXPF_X_MAX 0x1.62e42ep+6f /* 88.72283172607421875 */
/* Below this (the smallest float >= ln(FLT_MIN) = -87.3365447...) the result would be subnormal: 0. */
#define EXPF_X_MIN (-0x1.5d589ep+6f) /* -87.33654022216796875 */

/* Round-to-nearest-even of t for |t| < 2^22 by adding and removing 1.5 * 2^23 (two exact float
 * operations; the same in SIMD). */
#define EXPF_SHIFTER 0x1.8p23f

/* e^x in float (contract in fmath.h). Steps, all in float, in exactly this order:
 *   n  = (x * LOG2E + SHIFTER) - SHIFTER                   (rint; -126 <= n <= 128)
 *   r  = (x - n * LN2_HI) - n * LN2_LO                     (|r| <= ~0.347, error ~1e-8 absolute)
 *   r2 = r * r
 *   q  = (C2 + C3*r) + r2 * ((C4 + C5*r) + r2 * (C6 + C7*r))   (Ck = 1/k!, Taylor to degree 7)
 *   p  = 1 + (r + r2 * q)                                  (e^r)
 *   result = p * 2^n by exponent assembly (2^128 as 2 * 2^127).
 * The split evaluation of q keeps the dependency chain short. Results that would be subnormal
 * (x < EXPF_X_MIN) are flushed to +0; x > EXPF_X_MAX gives +inf. NaN in gives NaN out; -inf gives 0;
 * +inf gives +inf. Max error measured 1.0 ulp (tests check <= 2). */
float ib_expf(float x)
{
    if (x != x) return x + x;              /* NaN */
    if (x > EXPF_X_MAX) return INFINITY;   /* includes +inf */
    if (x < EXPF_X_MIN) return 0.0f;       /* includes -inf; subnormal results flushed */
    float n = (x * EXPF_LOG2E + EXPF_SHIFTER) - EXPF_SHIFTER;
    float r = (x - n * EXPF_LN2_HI) - n * EXPF_LN2_LO;
    float r2 = r * r;
    float a = 0.5f + 0x1.555556p-3f * r;                 /* 1/2! + r/3! */
    float b = 0x1.555556p-5f + 0x1.111112p-7f * r;       /* 1/4! + r/5! */
    float c = 0x1.6c16c2p-10f + 0x1.a01a02p-13f * r;     /* 1/6! + r/7! */
    float q = a + r2 * (b + r2 * c);
    float p = 1.0f + (r + r2 * q);
    int k = (int)n;
    if (k > 127) return (p * 2.0f) * pow2f_(127);
    return p * pow2f_(k);
}

/* ---------------------------------------------------------------- exp (double) */

/* ln2 = EXP_LN2_HI + EXP_LN2_LO; HI has 42 significant bits, so n * HI is exact for |n| <= 2047. */
#define EXP_LN2_HI 0x1.62e42fefa38p-1
#define EXP_LN2_LO 0x1.ef35793c7673p-45
#define EXP_LOG2E 0x1.71547652b82fep+0
#define EXP_X_MAX 0x1.62e42fefa39efp+9 /* 709.78271289338397: largest x with finite e^x */
#define EXP_X_MIN (-745.2)             /* below: e^x < half the smallest subnormal, result 0 */

/* e^x in double (contract in fmath.h). n = rint(x*log2e), r = (x - n*HI) - n*LO (|r| <= ~0.347),
 * e^r = 1 + (r + r^2 * q(r)) with q the Taylor series 1/2! + r/3! + ... + r^11/13!, then scaled by
 * 2^n. Subnormal results are produced by scaling in two steps (2^(n+54) exact, then 2^-54, one
 * rounding). NaN -> NaN, +inf -> +inf, -inf -> 0. */
double ib_exp(double x)
{
    if (x != x) return x + x;
    if (x > EXP_X_MAX) return INFINITY;
    if (x < EXP_X_MIN) return 0.0;
    double n = rint(x * EXP_LOG2E);        /* -1075 <= n <= 1024 */
    double r = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO;
    double q = 0x1.6124613a86d09p-33;      /* 1/13! */
    q = q * r + 0x1.1eed8eff8d898p-29;     /* 1/12! */
    q = q * r + 0x1.ae64567f544e4p-26;     /* 1/11! */
    q = q * r + 0x1.27e4fb7789f5cp-22;     /* 1/10! */
    q = q * r + 0x1.71de3a556c734p-19;     /* 1/9! */
    q = q * r + 0x1.a01a01a01a01ap-16;     /* 1/8! */
    q = q * r + 0x1.a01a01a01a01ap-13;     /* 1/7! */
    q = q * r + 0x1.6c16c16c16c17p-10;     /* 1/6! */
    q = q * r + 0x1.1111111111111p-7;      /* 1/5! */
    q = q * r + 0x1.5555555555555p-5;      /* 1/4! */
    q = q * r + 0x1.5555555555555p-3;      /* 1/3! */
    q = q * r + 0.5;
    double y = 1.0 + (r + (r * r) * q);
    int k = (int)n;
    if (k > 1023) return (y * 2.0) * pow2d_(1023);
    if (k < -1022) return (y * pow2d_(k + 54)) * 0x1p-54;
    return y * pow2d_(k);
}

/* ---------------------------------------------------------------- log (double) */

#define LOG_SQRT2_MANT 0x6a09e667f3bcdULL /* mantissa field of sqrt(2) */

/* Natural log in double (contract in fmath.h). x = 2^e * m with m in [sqrt(1/2), sqrt(2)) from the bit
 * pattern; f = m - 1 (exact), s = f / (2 + f), so log(m) = 2 atanh(s) = f - (h - s*(h + R)) with
 * h = f*f/2 and R = 2(s^2/3 + s^4/5 + ... + s^20/21) (|s| <= 0.1716). The large term f is exact, the
 * rounded correction is at most ~f/5. Then log(x) = e*LN2_HI + (log(m) + e*LN2_LO).
 * 0 -> -inf, x < 0 -> NaN, NaN -> NaN, +inf -> +inf; subnormals are scaled by 2^54 first. */
double ib_log(double x)
{
    if (x != x) return x + x;
    if (x < 0.0) return NAN;
    if (x == 0.0) return -INFINITY;
    if (x == INFINITY) return x;
    int e = 0;
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    if ((u >> 52) == 0) {                  /* subnormal */
        x = x * 0x1p54;
        e = -54;
        memcpy(&u, &x, sizeof u);
    }
    e += (int)(u >> 52) - 1023;
    uint64_t mant = u & 0xfffffffffffffULL;
    if (mant >= LOG_SQRT2_MANT) {          /* m in [sqrt2, 2): use m/2 in [sqrt(1/2), 1) */
        u = mant | ((uint64_t)1022 << 52);
        e += 1;
    } else {
        u = mant | ((uint64_t)1023 << 52);
    }
    double m;
    memcpy(&m, &u, sizeof m);
    double f = m - 1.0;                    /* exact (Sterbenz) */
    double s = f / (2.0 + f);
    double z = s * s;
    double R = 0x1.8618618618618p-4;       /* 2/21 */
    R = R * z + 0x1.af286bca1af28p-4;      /* 2/19 */
    R = R * z + 0x1.e1e1e1e1e1e1ep-4;      /* 2/17 */
    R = R * z + 0x1.1111111111111p-3;      /* 2/15 */
    R = R * z + 0x1.3b13b13b13b14p-3;      /* 2/13 */
    R = R * z + 0x1.745d1745d1746p-3;      /* 2/11 */
    R = R * z + 0x1.c71c71c71c71cp-3;      /* 2/9 */
    R = R * z + 0x1.2492492492492p-2;      /* 2/7 */
    R = R * z + 0x1.999999999999ap-2;      /* 2/5 */
    R = R * z + 0x1.5555555555555p-1;      /* 2/3 */
    R = R * z;
    double h = 0.5 * (f * f);
    double logm = f - (h - s * (h + R));
    double de = (double)e;
    return de * EXP_LN2_HI + (logm + de * EXP_LN2_LO);
}

/* ---------------------------------------------------------------- sincos */

/* pi/2 = PIO2_1 + PIO2_2 + PIO2_3 (+ ~2^-114); PIO2_1 and PIO2_2 have 30 significant bits, so n * them
 * is exact for |n| < 2^23 (|x| up to ~1.3e7). */
#define PIO2_1 0x1.921fb54p+0
#define PIO2_2 0x1.10b46118p-30
#define PIO2_3 0x1.313198a2e037p-61
#define INV_PIO2 0x1.45f306dc9c883p-1
#define PIO4 0x1.921fb54442d18p-1

/* sin(r) for |r| <= ~pi/4: r + r^3 * P(r^2), Taylor to r^17. */
static inline double sin_poly_(double r)
{
    double z = r * r;
    double p = 0x1.952c77030ad4ap-49;      /* 1/17! */
    p = p * z - 0x1.ae7f3e733b81fp-41;     /* 1/15! */
    p = p * z + 0x1.6124613a86d09p-33;     /* 1/13! */
    p = p * z - 0x1.ae64567f544e4p-26;     /* 1/11! */
    p = p * z + 0x1.71de3a556c734p-19;     /* 1/9! */
    p = p * z - 0x1.a01a01a01a01ap-13;     /* 1/7! */
    p = p * z + 0x1.1111111111111p-7;      /* 1/5! */
    p = p * z - 0x1.5555555555555p-3;      /* 1/3! */
    return r + (r * z) * p;
}

/* cos(r) for |r| <= ~pi/4: 1 - z/2 + z^2 * Q(z) with z = r^2, Taylor to r^18. */
static inline double cos_poly_(double r)
{
    double z = r * r;
    double q = -0x1.6827863b97d97p-53;     /* 1/18! */
    q = q * z + 0x1.ae7f3e733b81fp-45;     /* 1/16! */
    q = q * z - 0x1.93974a8c07c9dp-37;     /* 1/14! */
    q = q * z + 0x1.1eed8eff8d898p-29;     /* 1/12! */
    q = q * z - 0x1.27e4fb7789f5cp-22;     /* 1/10! */
    q = q * z + 0x1.a01a01a01a01ap-16;     /* 1/8! */
    q = q * z - 0x1.6c16c16c16c17p-10;     /* 1/6! */
    q = q * z + 0x1.5555555555555p-5;      /* 1/4! */
    return 1.0 - (0.5 * z - (z * z) * q);
}

/* sin and cos of x (contract in fmath.h). n = rint(x * 2/pi), r = ((x - n*P1) - n*P2) - n*P3 (the
 * first subtraction exact), quadrant n mod 4 selects +-sin(r)/+-cos(r). |x| < pi/4 skips the
 * reduction. Beyond |x| ~ 1.3e7 the result stays deterministic but loses accuracy; NaN and +-inf
 * give NaN. */
void ib_sincos(double x, double *s, double *c)
{
    if (x == 0.0) {                        /* keeps the sign of -0 */
        *s = x;
        *c = 1.0;
        return;
    }
    if (fabs(x) < PIO4) {
        *s = sin_poly_(x);
        *c = cos_poly_(x);
        return;
    }
    double n = rint(x * INV_PIO2);
    double r = ((x - n * PIO2_1) - n * PIO2_2) - n * PIO2_3;
    double sr = sin_poly_(r), cr = cos_poly_(r);
    double q = n - 4.0 * floor(n * 0.25);  /* n mod 4, exact for any integral n; NaN for inf/NaN */
    if (q != q) {
        *s = *c = NAN;
        return;
    }
    switch ((int)q) {
    case 0: *s = sr; *c = cr; break;
    case 1: *s = cr; *c = -sr; break;
    case 2: *s = -sr; *c = -cr; break;
    default: *s = -cr; *c = sr; break;
    }
}

/* ---------------------------------------------------------------- pow */

/* x^y computed as ib_exp(y * ib_log(x)) for x > 0 (relative error grows with |y * log x|: about
 * 2e-16 * (1 + |y log x|)). x == 1 gives exactly 1, y == 0 gives exactly 1 for finite x > 0. Other x
 * give what the formula gives (x = 0: 0 for y > 0, +inf for y < 0; x < 0: NaN). */
double ib_pow(double x, double y)
{
    return ib_exp(y * ib_log(x));
}
