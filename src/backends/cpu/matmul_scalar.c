/*
 * matmul_scalar.c — the reference panel kernel in plain C. It computes exactly the NUMERIC
 * DEFINITION of ops/matmul.h (each output one chain: F32 activations a double sum of exact products, Q8
 * a float chain of mul then add; K or groups ascending) with the blocking described in
 * backends/cpu/pack.h (the F32 panel loop is the vector kernels' one, panel_f32_impl.h: the blocking
 * never changes a bit, the arithmetic below is written plainly); the vector kernels must match it bit
 * for bit, and tests/test_matmul.c checks it against its own definition.
 */
#include <math.h>
#include <string.h>

#include "backends/cpu/pack.h"

/* Weight code of lane j at column k of a quantized panel P (layout in pack.h). */
static inline int code_at(const ib_matrix *m, const uint8_t *P, int j, int k) {
    if (m->fmt == IB_WQ4) {
        uint8_t byte = P[(size_t)(k / 8) * 64 + (size_t)j * 4 + (k % 4)];
        return (k % 8) < 4 ? (byte & 15) : (byte >> 4);
    }
    return P[(size_t)(k / 4) * 64 + (size_t)j * 4 + (k % 4)];
}

/* Dequantize columns [k0, k0+kn) of quantized panel p into w [kn][16]: w = s*(float)q + b. */
static void dequant_block(const ib_matrix *m, int p, int k0, int kn, float *w) {
    const uint8_t *P = ib_pk_panel(m, p);
    float s[16], b[16];
    for (int k = k0; k < k0 + kn; k++) {
        if (k == k0 || k % m->group == 0) ib_pk_sb_f32(m, p, k / m->group, s, b);
        float *o = w + (size_t)(k - k0) * 16;
        for (int j = 0; j < 16; j++) o[j] = s[j] * (float)code_at(m, P, j, k) + b[j];
    }
}

/* The chunk's nb rows (row r at x + r*ldx) over one K block: acc[r][j] = acc[r][j] + w(k, j) * x(r, k)
 * as ib_pk_chain ch says (the double sum of exact products; under a fault a float32 chain of mul then
 * add, or fused), k ascending (descending when desc); w [kn][16] doubles (WD) or floats, every value
 * exactly a float. */
static void rows_f32(ib_pk_chain ch, int WD, double (*acc)[16], const float *x, size_t ldx, int nb, const void *w,
                     int kn, int desc) {
    for (int r = 0; r < nb; r++) {
        const float *xr = x + (size_t)r * ldx;
        double *a = acc[r];
        for (int i = 0; i < kn; i++) {
            const int k = desc ? kn - 1 - i : i;
            for (int j = 0; j < 16; j++) {
                const size_t e = (size_t)k * 16 + j;
                const double wj = WD ? ((const double *)w)[e] : (double)((const float *)w)[e];
                if (ch == IB_PK_CHAIN_DOUBLE) {
                    a[j] = a[j] + wj * (double)xr[k];
                } else {
                    const float af = (float)a[j], wf = (float)wj;
                    a[j] = ch == IB_PK_CHAIN_FLOAT_FMA ? fmaf(wf, xr[k], af) : af + wf * xr[k];
                }
            }
        }
    }
}

/* n floats to doubles. */
static void widen_block(const float *w, double *wd, int n) {
    for (int i = 0; i < n; i++) wd[i] = (double)w[i];
}

#define F32_ALIGN 16
#include "backends/cpu/panel_f32_impl.h"

/* Q8 activations, quantized panel p, all B rows: per group an exact int32 sum, then
 * acc = (acc + (s*d)*(float)isum) + b*ad, groups ascending (descending when desc). */
static void panel_q8(const ib_matrix *m, int p, const ib_act_buf *q, int B, int desc, float *Y, int ldy) {
    const int K = m->cols, G = m->group, ng = K / G, lanes = ib_pk_lanes(m, p);
    const uint8_t *P = ib_pk_panel(m, p);
    for (int b = 0; b < B; b++) {
        const int8_t *xq = q->xq + (size_t)b * K;
        const float *d = q->d + (size_t)b * ng, *ad = q->ad + (size_t)b * ng;
        float acc[16] = {0};
        for (int gi = 0; gi < ng; gi++) {
            int g = desc ? ng - 1 - gi : gi;
            int32_t isum[16] = {0};
            if (m->fmt == IB_WQ4) {
                for (int k0 = g * G; k0 < (g + 1) * G; k0 += 8) {
                    const uint8_t *blk = P + (size_t)(k0 / 8) * 64;
                    for (int j = 0; j < 16; j++)
                        for (int i = 0; i < 4; i++) {
                            int byte = blk[j * 4 + i];
                            isum[j] += (byte & 15) * xq[k0 + i] + (byte >> 4) * xq[k0 + 4 + i];
                        }
                }
            } else {
                for (int k0 = g * G; k0 < (g + 1) * G; k0 += 4) {
                    const uint8_t *blk = P + (size_t)(k0 / 4) * 64;
                    for (int j = 0; j < 16; j++)
                        for (int i = 0; i < 4; i++) isum[j] += blk[j * 4 + i] * xq[k0 + i];
                }
            }
            float s[16], bb[16];
            ib_pk_sb_f32(m, p, g, s, bb);
            for (int j = 0; j < 16; j++) {
                float t = (s[j] * d[g]) * (float)isum[j];
                float u = bb[j] * ad[g];
                acc[j] = (acc[j] + t) + u;
            }
        }
        ib_pk_store(Y + (size_t)b * ldy + (size_t)p * 16, acc, lanes);
    }
}

/* Panels [p0, p1) for all B rows (contract in ops/matmul.h). */
void ib_matmul_panels_scalar(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act,
                             int p0, int p1, float *Y, int ldy) {
    const ib_fault fault = ib_fault_get();
    const int desc = B > 1 && fault == IB_FAULT_GEMV_GEMM;
    const int use_q8 = ib_pk_use_q8(m, q, act);
    for (int p = p0; p < p1; p++) {
        if (use_q8) panel_q8(m, p, q, B, desc, Y, ldy);
        else panel_f32(m, p, X, B, desc, ib_pk_f32_chain(fault, desc, 0), Y, ldy);
    }
}
