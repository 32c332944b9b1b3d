/*
 * device_layout.h — a CPU-packed matrix (backends/cpu/pack.h) in the CUDA backend's device layout
 * (cuda.h), written into host memory: what the backend uploads, and what the host tests of the product
 * kernels read.
 */
#ifndef IB_BACKENDS_CUDA_DEVICE_LAYOUT_H
#define IB_BACKENDS_CUDA_DEVICE_LAYOUT_H
#include <stdint.h>
#include <string.h>

#include "backends/cpu/pack.h"
#include "ops/matmul.h"

/* The float matrix cm as w [K][Np] (outputs past cm->rows untouched: the caller zeroes them). */
static inline void ib_cuda_layout_f32(const ib_matrix *cm, int Np, float *w) {
    const int N = cm->rows, K = cm->cols;
    for (int n = 0; n < N; n++) {
        const float *src = (const float *)ib_pk_panel(cm, n / IB_PANEL) + n % IB_PANEL;
        for (int k = 0; k < K; k++) w[(size_t)k * Np + n] = src[(size_t)k * IB_PANEL];
    }
}

/* The quantized matrix cm as code words w [K/KC][Np][4] (KC = 32 k for 4-bit codes, 16 for 8-bit), scales
 * s and biases b [K/group][Np] (outputs past cm->rows untouched: the caller zeroes them). CPU block kb (8 k
 * for Q4, 4 k for Q8): dword j is lane j's word, the same bytes as word i of device chunk c = kb / 4,
 * i = kb % 4. */
static inline void ib_cuda_layout_q(const ib_matrix *cm, int Np, uint32_t *w, float *s, float *b) {
    const int N = cm->rows, K = cm->cols, ng = K / cm->group, nkb = cm->fmt == IB_WQ4 ? K / 8 : K / 4;
    for (int n = 0; n < N; n++) {
        const int p = n / IB_PANEL, j = n % IB_PANEL;
        const uint8_t *P = ib_pk_panel(cm, p);
        for (int kb = 0; kb < nkb; kb++) {
            uint32_t v;
            memcpy(&v, P + (size_t)kb * 64 + (size_t)j * 4, 4);
            w[((size_t)(kb / 4) * Np + n) * 4 + kb % 4] = v;
        }
        for (int g = 0; g < ng; g++) {
            const uint8_t *sb = ib_pk_sb(cm, p, g);
            s[(size_t)g * Np + n] = ib_pk_sb_get(cm, sb, j);
            b[(size_t)g * Np + n] = ib_pk_sb_get(cm, sb, IB_PANEL + j);
        }
    }
}

#endif
