/*
 * matmul_neon.c — the AArch64 Advanced SIMD (NEON) panel kernel. Same arithmetic as matmul_scalar.c,
 * bit for bit: a q register holds 4 lanes (outputs) of a panel, so a panel row is 4 registers; every
 * lane walks K (or the groups) in the canonical order; float products and sums are separate fmul / fadd
 * (fmla only under IB_FAULT_ISA_FMA; the Makefile's -ffp-contract=off keeps GCC from fusing the
 * vmulq_f32 / vaddq_f32 pairs itself), the F32 path's double sums of exact products fmla on float64x2.
 *
 * Compiled only on aarch64 (elsewhere this file is empty). Advanced SIMD is part of every AArch64
 * CPU; the int8 dot product (SDOT, FEAT_DotProd, optional from Armv8.2) is checked at run time with
 * getauxval(AT_HWCAP) & HWCAP_ASIMDDP and used only by the functions marked DOTPROD, which are the
 * only code compiled for armv8.2-a+dotprod (the file itself is built for the base architecture, so
 * nothing else, auto-vectorized code included, can contain a dot-product instruction).
 *
 * Integer group sums (Q8 activations) are exact, so their order is free. Activations are int8 in
 * [-127, 127]; codes are unsigned (Q4 0..15, Q8 0..255); a group has G <= 128 columns.
 *   With SDOT (signed x signed, 4 products per int32 lane; the packed layout puts lane j's 4 codes of
 *   one block in one dword, exactly SDOT's operand shape):
 *     Q4: codes 0..15 are valid int8 as they are: isum += sdot(lo nibbles, x[k..k+3]) + sdot(hi
 *         nibbles, x[k+4..k+7]); |isum| <= 128 * 15 * 127 = 243840.
 *     Q8: a code up to 255 is not an int8, so each code is biased: q = (q ^ 0x80) + 128 with
 *         q ^ 0x80 read as int8 in [-128, 127]. Then sum q*x = sdot(q ^ 0x80, x) + 128 * sum x, where
 *         |sdot part| <= 128 * 128 * 127 = 2080768 and |128 * sum x| <= 128 * 128 * 127 (the same):
 *         every partial sum fits int32, so the result is the exact integer the scalar code computes.
 *   Without SDOT (plain NEON): smull of 8 int8 pairs into int16, addp of neighbouring int16 (two k of
 *   one lane), then sadalp (the remaining pairs of a lane, added into its int32):
 *     Q4: lo*x + hi*x per int16 (smull + smlal), two of them after addp: |.| <= 4 * 15 * 127 = 7620.
 *     Q8: the same bias as above, two biased products after addp: |.| <= 2 * 128 * 127 = 32512, which
 *         fits int16 (32767) because activations stop at -127: (-128) * (-127) = 16256.
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <stdatomic.h>
#include <sys/auxv.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/pack.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif

#define AI static inline __attribute__((always_inline))
/* Functions that may use SDOT. The attribute matches arm_neon.h's own target for vdotq_s32 (so the
 * intrinsic inlines); when the whole build already targets dot product it is not needed. */
#if defined(__ARM_FEATURE_DOTPROD)
#define DOTPROD
#else
#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

/* ---------------------------------------------------------------- dot-product selection */

static _Atomic int dotprod_off;   /* test hook: 1 forces the plain NEON path */

void ib_neon_dotprod_disable(int off) { atomic_store_explicit(&dotprod_off, off != 0, memory_order_relaxed); }

int ib_neon_has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }

/* ---------------------------------------------------------------- dequantization (F32 path) */

/* u8x16 codes of 16 lanes -> 4 float32x4 (lanes 0-3, 4-7, 8-11, 12-15). */
AI void u8_to_f32(uint8x16_t c, float32x4_t f[4]) {
    uint16x8_t lo = vmovl_u8(vget_low_u8(c)), hi = vmovl_high_u8(c);
    f[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    f[1] = vcvtq_f32_u32(vmovl_high_u16(lo));
    f[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    f[3] = vcvtq_f32_u32(vmovl_high_u16(hi));
}

/* o[0..15] = s*(float)q + b for the 16 lanes of codes c. */
AI void deq16(float *o, uint8x16_t c, const float32x4_t s[4], const float32x4_t b[4]) {
    float32x4_t f[4];
    u8_to_f32(c, f);
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) vst1q_f32(o + 4 * i, vaddq_f32(vmulq_f32(s[i], f[i]), b[i]));
}

/* 4 stored scales or biases (layout in pack.h) as floats, exactly. */
AI float32x4_t load_sb4(ib_sbfmt fmt, const uint8_t *p) {
    if (fmt == IB_SB_BF16) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(const void *)p), 16));
    if (fmt == IB_SB_F16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)p)));
    return vld1q_f32((const float *)(const void *)p);
}

/* The 16 scales s[0..3] and 16 biases b[0..3] of panel p, group g. */
AI void group_sb(const ib_matrix *m, int p, int g, float32x4_t s[4], float32x4_t b[4]) {
    const uint8_t *sb = ib_pk_sb(m, p, g);
    const size_t e = ib_pk_sb_elem(m);
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        s[i] = load_sb4(m->sb_fmt, sb + (size_t)(4 * i) * e);
        b[i] = load_sb4(m->sb_fmt, sb + (size_t)(16 + 4 * i) * e);
    }
}

/* Dequantize columns [k0, k0+kn) of quantized panel p into w [kn][16] (k0, kn multiples of 8).
 * vld4q_u8 of a 64-byte block is the transpose: val[i] holds byte i of each of the 16 lanes. */
static void dequant_block(const ib_matrix *m, int p, int k0, int kn, float *w) {
    const uint8_t *P = ib_pk_panel(m, p);
    const int step = m->fmt == IB_WQ4 ? 8 : 4;
    for (int k = k0; k < k0 + kn; k += step) {
        const uint8_t *blk = P + (size_t)(k / step) * 64;
        float32x4_t sv[4], bv[4];
        group_sb(m, p, k / m->group, sv, bv);
        uint8x16x4_t t = vld4q_u8(blk);
        float *o = w + (size_t)(k - k0) * 16;
        if (m->fmt == IB_WQ4) {
            const uint8x16_t m4 = vdupq_n_u8(15);
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) {
                deq16(o + i * 16, vandq_u8(t.val[i], m4), sv, bv);
                deq16(o + (i + 4) * 16, vshrq_n_u8(t.val[i], 4), sv, bv);
            }
        } else {
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) deq16(o + i * 16, t.val[i], sv, bv);
        }
    }
}

/* ---------------------------------------------------------------- F32 activations */

/* The 16 weights of one k as doubles, w[i] lanes 2i, 2i+1: from the block's doubles (WD) or widened
 * here from its floats. */
AI void load_w16(const int WD, const void *wk, float64x2_t w[8]) {
    if (WD) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) w[i] = vld1q_f64((const double *)wk + 2 * i);
    } else {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const float32x4_t f = vld1q_f32((const float *)wk + 4 * i);
            w[2 * i] = vcvt_f64_f32(vget_low_f32(f)), w[2 * i + 1] = vcvt_high_f64_f32(f);
        }
    }
}

/* One k of R rows: a[r] = a[r] + w(k) * x(r, k), lanes 2i, 2i+1 in a[r][i], x the rows' activations
 * (row r at xk + r * ldx), w 16 doubles (WD) or floats at wk. Every value is exactly a float and the
 * product of two floats is exact in double, so fmla (vfmaq_f64) is the mul then the add. Under a fault
 * (ib_pk_chain) a float32 chain instead: fmul then fadd, or fmla. */
AI void mac_k(const int R, const ib_pk_chain ch, const int WD, float64x2_t a[][8], const void *wk, const float *xk,
              size_t ldx) {
    float64x2_t w[8];
    load_w16(WD, wk, w);
    if (ch != IB_PK_CHAIN_DOUBLE) {
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const float32x4_t xv = vld1q_dup_f32(xk + r * ldx);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const float32x4_t wf = vcombine_f32(vcvt_f32_f64(w[2 * i]), vcvt_f32_f64(w[2 * i + 1]));
                float32x4_t af = vcombine_f32(vcvt_f32_f64(a[r][2 * i]), vcvt_f32_f64(a[r][2 * i + 1]));
                af = ch == IB_PK_CHAIN_FLOAT_FMA ? vfmaq_f32(af, wf, xv) : vaddq_f32(af, vmulq_f32(wf, xv));
                a[r][2 * i] = vcvt_f64_f32(vget_low_f32(af));
                a[r][2 * i + 1] = vcvt_high_f64_f32(af);
            }
        }
        return;
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        const float64x2_t xv = vdupq_n_f64((double)xk[r * ldx]);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) a[r][i] = vfmaq_f64(a[r][i], w[i], xv);
    }
}

/* R rows (R <= 2: 16 double accumulators and 8 weight vectors of the 32 registers) of a chunk: acc
 * [R][16] (double) += w [kn][16] (doubles when WD, else floats) times x (row r at x + r*ldx), walking k
 * ascending, or descending when desc. */
AI void tile_f32(const int R, const ib_pk_chain ch, const int WD, double *acc, const float *x, size_t ldx,
                 const void *w, int kn, int desc) {
    const size_t wstep = WD ? 16 * sizeof(double) : 16 * sizeof(float);
    const uint8_t *wb = (const uint8_t *)w;
    float64x2_t a[2][8];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) a[r][i] = vld1q_f64(acc + r * 16 + 2 * i);
    if (desc)
        for (int k = kn - 1; k >= 0; k--) mac_k(R, ch, WD, a, wb + (size_t)k * wstep, x + k, ldx);
    else
        for (int k = 0; k < kn; k++) mac_k(R, ch, WD, a, wb + (size_t)k * wstep, x + k, ldx);
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) vst1q_f64(acc + r * 16 + 2 * i, a[r][i]);
}

/* All rows of one K block, in tiles of 2 (then 1). */
AI void rows_f32(const ib_pk_chain ch, const int WD, double (*acc)[16], const float *x, size_t ldx, int nb,
                 const void *w, int kn, int desc) {
    int r = 0;
    for (; r + 2 <= nb; r += 2) tile_f32(2, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc);
    if (r < nb) tile_f32(1, ch, WD, acc[r], x + r * ldx, ldx, w, kn, desc);
}

/* n floats (a multiple of 16) to doubles. */
AI void widen_block(const float *w, double *wd, int n) {
    for (int i = 0; i < n; i += 4) {
        const float32x4_t f = vld1q_f32(w + i);
        vst1q_f64(wd + i, vcvt_f64_f32(vget_low_f32(f)));
        vst1q_f64(wd + i + 2, vcvt_high_f64_f32(f));
    }
}

#define F32_ALIGN 16
#include "backends/cpu/panel_f32_impl.h"

/* ---------------------------------------------------------------- Q8 activations */

/* acc = (acc + (s*d)*(float)isum) + b*ad for the 16 lanes of a row. */
AI void combine(float32x4_t f[4], const int32x4_t is[4], const float32x4_t s[4], const float32x4_t b[4], float d,
                float ad) {
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        float32x4_t t = vmulq_f32(vmulq_n_f32(s[i], d), vcvtq_f32_s32(is[i]));
        float32x4_t u = vmulq_n_f32(b[i], ad);
        f[i] = vaddq_f32(vaddq_f32(f[i], t), u);
    }
}

/* Write R rows of finished outputs (f[r][0..3]) of panel p. */
AI void store_rows(const int R, float32x4_t f[][4], float *y, int ldy, int lanes) {
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        float *yr = y + (size_t)r * ldy;
        if (lanes == 16) {
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) vst1q_f32(yr + 4 * i, f[r][i]);
        } else {
            float tmp[16];
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) vst1q_f32(tmp + 4 * i, f[r][i]);
            ib_pk_store(yr, tmp, lanes);
        }
    }
}

/* Exact sum of the G int8 activations at x (G a multiple of 16): saddlv gives each 16-byte chunk's sum
 * (|.| <= 16 * 127) as int16. */
AI int32_t sum_g(const int8_t *x, int G) {
    int32_t s = 0;
    for (int k = 0; k < G; k += 16) s += vaddlvq_s8(vld1q_s8(x + k));
    return s;
}

/* 4 int8 activations x[k..k+3] repeated into all four dwords. */
AI int8x16_t x4(const int8_t *x) { return vreinterpretq_s8_s32(vdupq_n_s32(ib_pk_load4(x))); }

/* The exact int32 group sums of R rows (R <= 4) for group g of panel P, with SDOT:
 * is[r][i] holds lanes 4i..4i+3 of row r (xq row r at xq + r*K). */
AI DOTPROD void gsum_dot(const int R, const int q4, const uint8_t *P, const int8_t *xq, int K, int G, int g,
                         int32x4_t is[][4]) {
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int i = 0; i < 4; i++) is[r][i] = vdupq_n_s32(0);
    if (q4) {
        const uint8x16_t m4 = vdupq_n_u8(15);
        const uint8_t *blk = P + (size_t)g * G * 8;   /* block k/8, 64 bytes each */
        for (int k = g * G; k < (g + 1) * G; k += 8, blk += 64) {
            int8x16_t lo[4], hi[4];
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) {
                uint8x16_t w = vld1q_u8(blk + 16 * i);
                lo[i] = vreinterpretq_s8_u8(vandq_u8(w, m4));
                hi[i] = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int8x16_t xl = x4(xq + (size_t)r * K + k), xh = x4(xq + (size_t)r * K + k + 4);
#pragma GCC unroll 8
                for (int i = 0; i < 4; i++) is[r][i] = vdotq_s32(vdotq_s32(is[r][i], lo[i], xl), hi[i], xh);
            }
        }
    } else {
        const uint8x16_t bias = vdupq_n_u8(0x80);
        const uint8_t *blk = P + (size_t)g * G * 16;   /* block k/4, 64 bytes each */
        for (int k = g * G; k < (g + 1) * G; k += 4, blk += 64) {
            int8x16_t w[4];
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) w[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(blk + 16 * i), bias));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int8x16_t xv = x4(xq + (size_t)r * K + k);
#pragma GCC unroll 8
                for (int i = 0; i < 4; i++) is[r][i] = vdotq_s32(is[r][i], w[i], xv);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32x4_t c = vdupq_n_s32(128 * sum_g(xq + (size_t)r * K + (size_t)g * G, G));
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) is[r][i] = vaddq_s32(is[r][i], c);
        }
    }
}

/* The same sums without SDOT. For the 4 lanes 4i..4i+3 (16 bytes, 4 codes each): smull / smull2 give
 * the int16 products of lanes 4i, 4i+1 and of 4i+2, 4i+3; addp adds neighbours (two k of one lane)
 * in int16, and sadalp adds the remaining pairs into the lane's int32. */
AI void gsum_plain(const int R, const int q4, const uint8_t *P, const int8_t *xq, int K, int G, int g,
                   int32x4_t is[][4]) {
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int i = 0; i < 4; i++) is[r][i] = vdupq_n_s32(0);
    if (q4) {
        const uint8x16_t m4 = vdupq_n_u8(15);
        const uint8_t *blk = P + (size_t)g * G * 8;
        for (int k = g * G; k < (g + 1) * G; k += 8, blk += 64) {
            int8x16_t lo[4], hi[4];
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) {
                uint8x16_t w = vld1q_u8(blk + 16 * i);
                lo[i] = vreinterpretq_s8_u8(vandq_u8(w, m4));
                hi[i] = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int8x16_t xl = x4(xq + (size_t)r * K + k), xh = x4(xq + (size_t)r * K + k + 4);
#pragma GCC unroll 8
                for (int i = 0; i < 4; i++) {
                    /* lo*x + hi*x per int16, then two of those: |.| <= 4 * 15 * 127 = 7620 */
                    int16x8_t a = vmlal_s8(vmull_s8(vget_low_s8(lo[i]), vget_low_s8(xl)), vget_low_s8(hi[i]),
                                           vget_low_s8(xh));
                    int16x8_t b = vmlal_high_s8(vmull_high_s8(lo[i], xl), hi[i], xh);
                    is[r][i] = vpadalq_s16(is[r][i], vpaddq_s16(a, b));
                }
            }
        }
    } else {
        const uint8x16_t bias = vdupq_n_u8(0x80);
        const uint8_t *blk = P + (size_t)g * G * 16;
        for (int k = g * G; k < (g + 1) * G; k += 4, blk += 64) {
            int8x16_t w[4];
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) w[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(blk + 16 * i), bias));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int8x16_t xv = x4(xq + (size_t)r * K + k);
#pragma GCC unroll 8
                for (int i = 0; i < 4; i++) {
                    /* two biased products per int16: |.| <= 2 * 128 * 127 = 32512 <= 32767 */
                    int16x8_t pr = vpaddq_s16(vmull_s8(vget_low_s8(w[i]), vget_low_s8(xv)), vmull_high_s8(w[i], xv));
                    is[r][i] = vpadalq_s16(is[r][i], pr);
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32x4_t c = vdupq_n_s32(128 * sum_g(xq + (size_t)r * K + (size_t)g * G, G));
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) is[r][i] = vaddq_s32(is[r][i], c);
        }
    }
}

/* R rows (R <= 4) of a quantized panel against Q8 activations: xq row r at xq + r*K, d/ad row r at
 * d + r*ng; outputs to y + r*ldy. Groups ascending (descending when desc). Written once, instantiated
 * with (tile_q_dot, +dotprod, gsum_dot) and (tile_q_plain, base, gsum_plain). */
#define TILE_Q(NAME, ATTR, GSUM)                                                                               \
    AI ATTR void NAME(const int R, const ib_matrix *m, int p, const int8_t *xq, const float *d, const float *ad, \
                      int desc, float *y, int ldy) {                                                           \
        const int K = m->cols, G = m->group, ng = K / G, q4 = m->fmt == IB_WQ4;                                \
        const uint8_t *P = ib_pk_panel(m, p);                                                                  \
        float32x4_t f[4][4];                                                                                   \
        _Pragma("GCC unroll 8")                                                                                \
        for (int r = 0; r < R; r++)                                                                            \
            _Pragma("GCC unroll 8")                                                                            \
            for (int i = 0; i < 4; i++) f[r][i] = vdupq_n_f32(0.0f);                                           \
        for (int gi = 0; gi < ng; gi++) {                                                                      \
            const int g = desc ? ng - 1 - gi : gi;                                                             \
            int32x4_t is[4][4];                                                                                \
            GSUM(R, q4, P, xq, K, G, g, is);                                                                   \
            float32x4_t sv[4], bv[4];                                                                          \
            group_sb(m, p, g, sv, bv);                                                                         \
            _Pragma("GCC unroll 8")                                                                            \
            for (int r = 0; r < R; r++)                                                                        \
                combine(f[r], is[r], sv, bv, d[(size_t)r * ng + g], ad[(size_t)r * ng + g]);                   \
        }                                                                                                      \
        store_rows(R, f, y, ldy, ib_pk_lanes(m, p));                                                           \
    }
TILE_Q(tile_q_dot, DOTPROD, gsum_dot)
TILE_Q(tile_q_plain, , gsum_plain)
#undef TILE_Q

/* One tile function per row count, with and without SDOT. */
#define TILE_FNS(R)                                                                                          \
    static DOTPROD void tile_dot_##R(const ib_matrix *m, int p, const int8_t *xq, const float *d,           \
                                     const float *ad, int desc, float *y, int ldy) {                         \
        tile_q_dot(R, m, p, xq, d, ad, desc, y, ldy);                                                        \
    }                                                                                                        \
    static void tile_plain_##R(const ib_matrix *m, int p, const int8_t *xq, const float *d, const float *ad, \
                               int desc, float *y, int ldy) {                                                \
        tile_q_plain(R, m, p, xq, d, ad, desc, y, ldy);                                                      \
    }
TILE_FNS(1)
TILE_FNS(2)
TILE_FNS(3)
TILE_FNS(4)
#undef TILE_FNS

typedef void (*tile_fn)(const ib_matrix *, int, const int8_t *, const float *, const float *, int, float *, int);

/* Q8 activations, panel p, all B rows in tiles of 4 (then 3, 2, 1). */
static void panel_q8(const ib_matrix *m, int p, const ib_act_buf *q, int B, int desc, int dot, float *Y, int ldy) {
    static const tile_fn tiles[2][5] = {
        {NULL, tile_plain_1, tile_plain_2, tile_plain_3, tile_plain_4},
        {NULL, tile_dot_1, tile_dot_2, tile_dot_3, tile_dot_4},
    };
    const int K = m->cols, ng = K / m->group;
    for (int r = 0; r < B; r += 4) {
        const int R = B - r < 4 ? B - r : 4;
        tiles[dot][R](m, p, q->xq + (size_t)r * K, q->d + (size_t)r * ng, q->ad + (size_t)r * ng, desc,
                      Y + (size_t)r * ldy + (size_t)p * 16, ldy);
    }
}

/* Panels [p0, p1) for all B rows (contract in ops/matmul.h). */
void ib_matmul_panels_neon(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act, int p0,
                           int p1, float *Y, int ldy) {
    const ib_fault fault = ib_fault_get();
    const int desc = B > 1 && fault == IB_FAULT_GEMV_GEMM;
    const int use_q8 = ib_pk_use_q8(m, q, act);
    const int dot = use_q8 && !atomic_load_explicit(&dotprod_off, memory_order_relaxed) && ib_neon_has_dotprod();
    for (int p = p0; p < p1; p++) {
        if (use_q8) panel_q8(m, p, q, B, desc, dot, Y, ldy);
        else panel_f32(m, p, X, B, desc, ib_pk_f32_chain(fault, desc, 1), Y, ldy);
    }
}

#else
/* Not aarch64: no NEON kernel (ISO C wants a translation unit to declare something). */
typedef int ib_matmul_neon_unused;
#endif
