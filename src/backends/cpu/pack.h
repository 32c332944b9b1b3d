/*
 * pack.h — the private byte layout of ib_matrix (see ops/matmul.h) and small helpers shared by the
 * CPU kernels (matmul_scalar.c, matmul_avx2.c, matmul_avx512.c, matmul_neon.c) and the packer
 * (ops/matmul.c).
 *
 * PANELS. Panel p holds the output rows n = 16p .. 16p+15; lane j of the panel is row 16p+j.
 * Rows n >= N (padding up to a multiple of 16) have weight 0 / code 0, scale 0 and bias 0.
 *
 *   F32: m->packed is float [n_panels][K][16]:
 *          element (p, k, j) = W[16p+j][k]                (a panel is K*64 bytes)
 *
 *   Q4:  m->packed is uint8 [n_panels][K/8][64]: block c of panel p covers k0 = 8c .. 8c+7 and
 *          byte 4j+i (j = lane 0..15, i = 0..3) = q[16p+j][k0+i] | q[16p+j][k0+4+i] << 4
 *        i.e. the little-endian dword j of a block is lane j; its low nibbles are k0..k0+3 (in byte
 *        order) and its high nibbles k0+4..k0+7.                          (a panel is K*8 bytes)
 *
 *   Q8:  m->packed is uint8 [n_panels][K/4][64]: block c of panel p covers k0 = 4c .. 4c+3 and
 *          byte 4j+i = q[16p+j][k0+i]                                    (a panel is K*16 bytes)
 *
 *   Q4/Q8 scales and biases: m->sb is [n_panels][K/G][2][16] elements of m->sb_fmt (bfloat16, float16
 *   or float32): element (p, g, 0, j) = s and (p, g, 1, j) = b of row 16p+j for k in [gG, gG+G), so
 *   one group's 16 scales and 16 biases are adjacent (64 bytes in 16-bit storage).
 *   (q = the unsigned MLX code, 0..15 or 0..255.)
 *
 * Every array starts 64-byte aligned; panels of quantized weights are multiples of 64 bytes because
 * K is a multiple of the group (>= 32).
 *
 * BLOCKING (same in every kernel; it never changes the arithmetic, only where accumulators live):
 *   F32 activations: rows in chunks of IB_RCHUNK whose double accumulators live in a [IB_RCHUNK][16]
 *   stack buffer; K in blocks of IB_KBLOCK (a multiple of every group size) whose weights are, for
 *   quantized matrices, dequantized once per chunk into a [IB_KBLOCK][16] float stack buffer with
 *   w = s*(float)q + b. Storing and reloading a double accumulator is exact; each output is rounded
 *   to float once, by ib_pk_store_f64 at the end of its chain.
 *   Q8 activations: rows in register tiles, all of K per tile, one int32 sum per (row, lane, group);
 *   the AVX-512 kernel, for 4 rows or more, takes 4 adjacent panels at once and the groups outermost,
 *   keeping the float accumulators of up to 64 rows in a stack buffer between groups.
 */
#ifndef IB_BACKENDS_CPU_PACK_H
#define IB_BACKENDS_CPU_PACK_H
#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "ops/matmul.h"

#define IB_KBLOCK 128   /* K block of the F32-activation path (multiple of 32, 64 and 128) */
#define IB_RCHUNK 64    /* rows per accumulator chunk of the F32-activation path */

/* Bytes of one panel of m's packed weights. */
static inline size_t ib_pk_panel_bytes(const ib_matrix *m) {
    size_t K = (size_t)m->cols;
    switch (m->fmt) {
    case IB_WQ4: return K * 8;
    case IB_WQ8: return K * 16;
    default: return K * 16 * sizeof(float);
    }
}

/* Start of panel p's packed weights. */
static inline const uint8_t *ib_pk_panel(const ib_matrix *m, int p) {
    return (const uint8_t *)m->packed + (size_t)p * ib_pk_panel_bytes(m);
}

/* Bytes of one stored scale or bias. */
static inline size_t ib_pk_sb_elem(const ib_matrix *m) { return m->sb_fmt == IB_SB_F32 ? 4 : 2; }

/* The 16 scales of panel p, group g (the 16 biases follow them: ib_pk_sb_elem(m) * 16 bytes on). */
static inline const uint8_t *ib_pk_sb(const ib_matrix *m, int p, int g) {
    size_t ng = (size_t)(m->cols / m->group);
    return (const uint8_t *)m->sb + ((size_t)p * ng + (size_t)g) * 32 * ib_pk_sb_elem(m);
}

/* Ask for the scales and biases IB_SB_PF_DIST bytes after those of panel p, group g (a tile reading the
 * groups in order stays that far ahead of their stream; 1-row products from memory ran 2-3% faster). */
#define IB_SB_PF_DIST 1024
static inline void ib_pk_sb_prefetch(const ib_matrix *m, int p, int g) {
    __builtin_prefetch(ib_pk_sb(m, p, g) + IB_SB_PF_DIST);
}

/* Element i (0..31: scales 0..15, biases 16..31) of a group's scales and biases, as float (exact). */
static inline float ib_pk_sb_get(const ib_matrix *m, const uint8_t *sb, int i) {
    uint16_t h;
    if (m->sb_fmt == IB_SB_F32) {
        float f;
        memcpy(&f, sb + 4 * (size_t)i, 4);
        return f;
    }
    memcpy(&h, sb + 2 * (size_t)i, 2);
    return m->sb_fmt == IB_SB_BF16 ? ib_bf16_to_f32(h) : ib_f16_to_f32(h);
}

/* The 16 scales (s) and 16 biases (b) of panel p, group g, as floats. */
static inline void ib_pk_sb_f32(const ib_matrix *m, int p, int g, float s[16], float b[16]) {
    const uint8_t *sb = ib_pk_sb(m, p, g);
    for (int j = 0; j < 16; j++) s[j] = ib_pk_sb_get(m, sb, j), b[j] = ib_pk_sb_get(m, sb, 16 + j);
}

/* Real (unpadded) output rows of panel p: 1..16. */
static inline int ib_pk_lanes(const ib_matrix *m, int p) {
    int r = m->rows - p * IB_PANEL;
    return r < IB_PANEL ? r : IB_PANEL;
}

/* 4 int8 activations as one int32 (any alignment). */
static inline int32_t ib_pk_load4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Copy the first `lanes` of a panel's 16 outputs to y. */
static inline void ib_pk_store(float *y, const float *v /* [16] */, int lanes) {
    memcpy(y, v, (size_t)lanes * sizeof(float));
}

/* How an F32-activation kernel accumulates: the canonical double sum of exact products, or, under a
 * test-only fault, a float32 chain of mul then add (IB_FAULT_GEMV_GEMM's many-row order, K descending:
 * a double sum taken in another order almost never rounds to another float, a float chain does) or of
 * fused multiply-adds (IB_FAULT_ISA_FMA in the vector kernels). Decided once a product, by
 * ib_pk_f32_chain. The double accumulators hold a float chain's values exactly. */
typedef enum ib_pk_chain { IB_PK_CHAIN_DOUBLE = 0, IB_PK_CHAIN_FLOAT, IB_PK_CHAIN_FLOAT_FMA } ib_pk_chain;

/* The chain for this product: fault the process's fault, desc 1 when IB_FAULT_GEMV_GEMM reverses it,
 * vector 1 for the vector kernels (the scalar kernel never fuses). */
static inline ib_pk_chain ib_pk_f32_chain(ib_fault fault, int desc, int vector) {
    if (vector && fault == IB_FAULT_ISA_FMA) return IB_PK_CHAIN_FLOAT_FMA;
    return desc ? IB_PK_CHAIN_FLOAT : IB_PK_CHAIN_DOUBLE;
}

/* Lanes [0, lanes) of the double accumulators v [16] rounded to float (once, round to nearest) into y. */
static inline void ib_pk_store_f64(float *y, const double *v /* [16] */, int lanes) {
    for (int j = 0; j < lanes; j++) y[j] = (float)v[j];
}

/* 1 when the kernel should use the Q8-activation path: Q8 asked, a quantized matrix, buffers given. */
static inline int ib_pk_use_q8(const ib_matrix *m, const ib_act_buf *q, ib_act act) {
    return act == IB_ACT_Q8 && m->fmt != IB_WF32 && q != NULL;
}

#endif
