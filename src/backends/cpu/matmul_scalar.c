/*
 * matmul_scalar.c — the reference panel kernel in plain C. It computes exactly the NUMERIC
 * DEFINITION of ops/matmul.h (each output one chain: F32 activations a double sum of exact products, Q8
 * a float chain of mul then add; K or groups ascending) with
 * the blocking described in backends/cpu/pack.h; the vector kernels must match it bit for bit.
 */
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

/* F32 activations, panel p, all B rows: y = (float) of the double sum of the exact products w*x, k
 * ascending; when desc (IB_FAULT_GEMV_GEMM) a float32 chain of mul then add, k descending (ib_pk_chain). */
static void panel_f32(const ib_matrix *m, int p, const float *X, int B, int desc, float *Y, int ldy) {
    const int K = m->cols, lanes = ib_pk_lanes(m, p), nblk = (K + IB_KBLOCK - 1) / IB_KBLOCK;
    float wbuf[IB_KBLOCK * 16];    /* [IB_KBLOCK][16] */
    double acc[IB_RCHUNK][16];     /* [rows of the chunk][lane] */
    for (int b0 = 0; b0 < B; b0 += IB_RCHUNK) {
        int nb = B - b0 < IB_RCHUNK ? B - b0 : IB_RCHUNK;
        memset(acc, 0, sizeof acc);
        for (int bi = 0; bi < nblk; bi++) {
            int blk = desc ? nblk - 1 - bi : bi;
            int k0 = blk * IB_KBLOCK, kn = K - k0 < IB_KBLOCK ? K - k0 : IB_KBLOCK;
            const float *w;
            if (m->fmt == IB_WF32) {
                w = (const float *)ib_pk_panel(m, p) + (size_t)k0 * 16;
            } else {
                dequant_block(m, p, k0, kn, wbuf);
                w = wbuf;
            }
            for (int r = 0; r < nb; r++) {
                const float *x = X + (size_t)(b0 + r) * K + k0;
                double *a = acc[r];
                for (int i = 0; i < kn; i++) {
                    int k = desc ? kn - 1 - i : i;
                    const float *wk = w + (size_t)k * 16;
                    if (desc)
                        for (int j = 0; j < 16; j++) a[j] = (double)((float)a[j] + wk[j] * x[k]);
                    else
                        for (int j = 0; j < 16; j++) a[j] = a[j] + (double)wk[j] * (double)x[k];
                }
            }
        }
        for (int r = 0; r < nb; r++) ib_pk_store_f64(Y + (size_t)(b0 + r) * ldy + (size_t)p * 16, acc[r], lanes);
    }
}

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
    const int desc = B > 1 && ib_fault_get() == IB_FAULT_GEMV_GEMM;
    const int use_q8 = ib_pk_use_q8(m, q, act);
    for (int p = p0; p < p1; p++) {
        if (use_q8) panel_q8(m, p, q, B, desc, Y, ldy);
        else panel_f32(m, p, X, B, desc, Y, ldy);
    }
}
