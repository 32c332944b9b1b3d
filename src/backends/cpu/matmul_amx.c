/*
 * matmul_amx.c — the AMX panel kernel: AVX-512 plus AMX-INT8 tiles for the Q8-activation products
 * of many rows. Same arithmetic as matmul_scalar.c, bit for bit.
 *
 * WHAT RUNS WHERE. A Q8-activation product of B >= 16 rows computes its first 16*floor(B/16) rows on
 * tiles; the remaining B % 16 rows, every product of fewer rows and every F32-activation product run
 * the AVX-512 kernel (ib_matmul_panels_avx512) unchanged. Attention and the other ops of the amx ISA
 * are AVX-512's (kernels.c, ops/attention.c).
 *
 * WHY THE BITS ARE THE DEFINITION'S. TDPBSUD multiplies signed bytes of A (the int8 activations xq)
 * with unsigned bytes of B (the weight codes, 0..15 or 0..255) and adds them into int32 without
 * saturation: a group sum is at most 128 * 127 * 255 < 2^23 in magnitude, so each tile element is the
 * group's exact integer isum, whatever order the hardware adds in. The float epilogue is the AVX-512
 * kernel's and the scalar kernel's, operation for operation: per row, per group ascending,
 *     acc = (acc + (s*d)*(float)isum) + b*ad        (separate multiplies and adds, no fma)
 *
 * TILES (one configuration per kernel call, palette 1; KS = min(G, 64) bytes of K per step):
 *     tmm0..tmm3  C: int32 [16 rows][16 outputs], the group sums of row tiles 0..3 of a row block
 *     tmm4        B: the panel's weights for KS k in the VNNI layout, [KS/4][16 outputs x 4 k] bytes:
 *                 row r, dword j = the codes of output j at k = 4r..4r+3
 *     tmm5, tmm6  A: int8 activations [16 rows][KS k] (alternating, so one loads while one multiplies)
 *     tmm7        B of a second panel, where one row tile takes two panels at a time (amx_row_tile_2p)
 * The 8-bit packed panel (pack.h: block c = k 4c..4c+3, byte 4j+i = code(j, 4c+i)) already is the
 * VNNI layout: B tiles load straight from it with a 64-byte stride. A 4-bit block c (k 8c..8c+7) holds
 * k 8c..8c+3 in its low nibbles and 8c+4..8c+7 in its high nibbles, each in the same byte positions:
 * each group is unpacked, one group ahead of its tile products, into one of two [G/4][64] byte buffers
 * (low nibbles -> VNNI row 2c, high -> row 2c+1).
 *
 * BLOCKING. Panels in the caller's range one at a time; rows in blocks of up to 64 (4 row tiles) whose
 * float accumulators live in a [64][16] stack buffer; all of K per row block, group by group, the
 * tiles two groups ahead of the float epilogue (amx_row_block says why); then
 * the panel's rows past the last full tile on AVX-512. The panel's weights (a few KiB to tens of KiB)
 * stay in cache across its row blocks and that tail. A product of one row tile (16-31 rows) of 4-bit
 * weights takes its panels two at a time instead (amx_row_tile_2p), so that its steps too have two
 * tile products to interleave with the epilogue.
 */
#if defined(IB_AMX_EMULATE)
/* A test (tests/test_amx_emul.c) includes this file with the AMX_* operations below defined as C
 * functions that emulate the tiles, so the kernel's logic runs on any CPU. */
#elif defined(__x86_64__)
#include <immintrin.h>
#define AMX_CONFIG(cfg) _tile_loadconfig(cfg)
#define AMX_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define AMX_DP(c, a, b) _tile_dpbsud(c, a, b) /* C += A (signed bytes) . B (unsigned bytes) */
#define AMX_STORE(t, base, stride) _tile_stored(t, base, stride)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_RELEASE() _tile_release()
#define AMX_KERNEL ib_matmul_panels_amx
#define AMX_TAIL_KERNEL ib_matmul_panels_avx512
#endif

#if defined(AMX_KERNEL)

#include "backends/cpu/pack.h"

#define AMX_TILE_ROWS 16                    /* rows of an A / C tile */
#define AMX_ROW_TILES 4                     /* C tiles (row tiles) of a row block */
#define AMX_RBLOCK (AMX_TILE_ROWS * AMX_ROW_TILES)
#define AMX_PF_DIST 8192                    /* weight prefetch distance, as the AVX-512 kernel's */

/* Compiler barrier: the tile instructions are asm statements that do not tell the compiler which
 * memory they read, so stores they must see (the tile configuration, the unpacked 4-bit weights) are
 * fenced in front of them, and the next group's unpacking behind the loads of the last. */
#define AMX_MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

/* The 64-byte tile configuration of LDTILECFG (palette 1). */
typedef struct amx_tilecfg {
    uint8_t palette;      /* 1 */
    uint8_t start_row;    /* 0 */
    uint8_t reserved[14];
    uint16_t colsb[16];   /* bytes per row of tmm i */
    uint8_t rows[16];     /* rows of tmm i */
} amx_tilecfg;
_Static_assert(sizeof(amx_tilecfg) == 64, "LDTILECFG reads 64 bytes");

/* The configuration described above for K-steps of KS bytes: C tiles 0..3 of 16 rows x 64 bytes, B
 * (tile 4) of KS/4 rows x 64 bytes, A (tiles 5, 6) of 16 rows x KS bytes. Constant data: nothing for
 * the compiler to drop or reorder in front of LDTILECFG, whose asm names only the first 8 bytes. */
#define AMX_CFG(KS) { .palette = 1, .colsb = {64, 64, 64, 64, 64, KS, KS}, .rows = {16, 16, 16, 16, KS / 4, 16, 16} }
/* the same with tile 7 as a second B (amx_row_tile_2p), loaded only for products that take that path */
#define AMX_CFG_2P(KS) { .palette = 1, .colsb = {64, 64, 64, 64, 64, KS, KS, 64}, .rows = {16, 16, 16, 16, KS / 4, 16, 16, KS / 4} }
static const amx_tilecfg amx_cfg_ks32 __attribute__((aligned(64))) = AMX_CFG(32);
static const amx_tilecfg amx_cfg_ks64 __attribute__((aligned(64))) = AMX_CFG(64);
static const amx_tilecfg amx_cfg_2p_ks32 __attribute__((aligned(64))) = AMX_CFG_2P(32);
static const amx_tilecfg amx_cfg_2p_ks64 __attribute__((aligned(64))) = AMX_CFG_2P(64);

/* Load the configuration for K-steps of ks bytes (32 or 64), with tile 7 where pairs (the two-panel
 * path) is set. */
static void amx_configure(int ks, int pairs) {
    AMX_MEMORY_BARRIER();
    if (pairs) AMX_CONFIG(ks == 32 ? &amx_cfg_2p_ks32 : &amx_cfg_2p_ks64);
    else AMX_CONFIG(ks == 32 ? &amx_cfg_ks32 : &amx_cfg_ks64);
}

/* Unpack group g of 4-bit panel P (group size G) into VNNI rows: out [G/4][64] bytes, row 2i = the low
 * nibbles of the group's block i (k 8i..8i+3), row 2i+1 = its high nibbles (k 8i+4..8i+7). The bytes pf
 * past each block read are asked for ahead (where the weights read next are). */
static inline void amx_unpack_q4(const uint8_t *P, int g, int G, uint8_t *restrict out, size_t pf) {
    const uint8_t *blk = P + (size_t)g * (size_t)(G / 8) * 64;
    for (int i = 0; i < G / 8; i++) {
        const uint8_t *w = blk + (size_t)i * 64;
        __builtin_prefetch(w + pf, 0, 2);
        uint8_t *lo = out + (size_t)(2 * i) * 64, *hi = lo + 64;
        for (int x = 0; x < 64; x++) lo[x] = (uint8_t)(w[x] & 15), hi[x] = (uint8_t)(w[x] >> 4);
    }
}

/* One k-step of a row block: B (tmm4) from wb (stride 64), then for each of nt row tiles A from the
 * activations a (row stride K) into tmm5 / tmm6 and C_t += A . B. */
static inline void amx_step(int nt, const uint8_t *wb, const int8_t *a, int K) {
    const size_t rs = (size_t)AMX_TILE_ROWS * (size_t)K;
    AMX_LOAD(4, wb, 64);
    AMX_LOAD(5, a, K);
    AMX_DP(0, 5, 4);
    if (nt > 1) {
        AMX_LOAD(6, a + rs, K);
        AMX_DP(1, 6, 4);
    }
    if (nt > 2) {
        AMX_LOAD(5, a + 2 * rs, K);
        AMX_DP(2, 5, 4);
    }
    if (nt > 3) {
        AMX_LOAD(6, a + 3 * rs, K);
        AMX_DP(3, 6, 4);
    }
}

/* Store C tiles 0..nt-1 to isum [nt*16][16] (tile t's rows at isum + 16t) and zero them. */
static inline void amx_drain(int nt, int32_t (*isum)[16]) {
    AMX_STORE(0, isum[0], 64);
    AMX_ZERO(0);
    if (nt > 1) {
        AMX_STORE(1, isum[16], 64);
        AMX_ZERO(1);
    }
    if (nt > 2) {
        AMX_STORE(2, isum[32], 64);
        AMX_ZERO(2);
    }
    if (nt > 3) {
        AMX_STORE(3, isum[48], 64);
        AMX_ZERO(3);
    }
}

/* Row tile t's part of a step that drains and multiplies: C tile t stored to isum [16][16] (the
 * previous group's sums) and zeroed just before its own product, A from the activations a (row stride
 * K) and C_t += A . B (B already in tmm4). Storing each tile next to its product lets the tile unit
 * overlap one tile's product with the next tile's store (four stores first made the products wait for
 * all four). */
static inline __attribute__((always_inline)) void amx_drain_step_tile(const int t, int32_t (*isum)[16], const int8_t *a,
                                                                      int K) {
    switch (t) {
    case 0: AMX_STORE(0, isum[0], 64); AMX_ZERO(0); AMX_LOAD(5, a, K); AMX_DP(0, 5, 4); break;
    case 1: AMX_STORE(1, isum[0], 64); AMX_ZERO(1); AMX_LOAD(6, a, K); AMX_DP(1, 6, 4); break;
    case 2: AMX_STORE(2, isum[0], 64); AMX_ZERO(2); AMX_LOAD(5, a, K); AMX_DP(2, 5, 4); break;
    default: AMX_STORE(3, isum[0], 64); AMX_ZERO(3); AMX_LOAD(6, a, K); AMX_DP(3, 6, 4); break;
    }
}

/* The 16 scales then the 16 biases of panel p, group g as floats: sbf [32], ib_pk_sb_f32's values
 * (exact conversions), the storage format chosen once so that each conversion loop vectorizes
 * (ib_f16_to_f32_row equals ib_f16_to_f32 on every input). */
static inline void amx_sb_f32(const ib_matrix *m, int p, int g, float *restrict sbf) {
    const uint8_t *sb = ib_pk_sb(m, p, g);
    if (m->sb_fmt == IB_SB_F32) {
        memcpy(sbf, sb, 32 * sizeof(float));
        return;
    }
    uint16_t h[32];
    memcpy(h, sb, sizeof h);
    if (m->sb_fmt == IB_SB_BF16)
        for (int i = 0; i < 32; i++) sbf[i] = ib_bf16_to_f32(h[i]);
    else
        ib_f16_to_f32_row(h, sbf, 32);
}

/* The float epilogue of one group for nr rows: acc[r][j] = (acc + (s_j*d_r)*(float)isum[r][j]) +
 * b_j*ad_r, with sbf [32] the group's scales s then biases b, d_r = d[r*ng] and ad_r = ad[r*ng] —
 * plain C over the 16 lanes (the compiler vectorizes it; lane-wise IEEE multiplies and adds give the
 * same bits in any vector width): the scalar kernel's formula, term for term. The rows are unrolled by
 * 4, so fewer loop instructions per row compete with the vector operations for the ALU ports. FIRST:
 * the row block's first group, whose acc is the chain's start 0.0f — written as the constant (0.0f + t
 * keeps IEEE's sign of zero: no operation changes), so acc need not be cleared before. */
static inline void amx_epilogue(const int FIRST, const float *restrict sbf, const float *d, const float *ad, size_t ng,
                                int nr, const int32_t (*restrict isum)[16], float (*restrict acc)[16]) {
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        const float dr = d[(size_t)r * ng], adr = ad[(size_t)r * ng];
        float *f = acc[r];
        const int32_t *is = isum[r];
        for (int j = 0; j < 16; j++) {
            float t = (sbf[j] * dr) * (float)is[j];
            float u = sbf[16 + j] * adr;
            f[j] = ((FIRST ? 0.0f : f[j]) + t) + u;
        }
    }
}

/* amx_epilogue with FIRST = first (each value its own inlined copy, FIRST a constant in each). */
static inline __attribute__((always_inline)) void amx_epilogue_at(int first, const float *restrict sbf, const float *d,
                                                                  const float *ad, size_t ng, int nr,
                                                                  const int32_t (*restrict isum)[16],
                                                                  float (*restrict acc)[16]) {
    if (first) amx_epilogue(1, sbf, d, ad, ng, nr, isum, acc);
    else amx_epilogue(0, sbf, d, ad, ng, nr, isum, acc);
}

/* Group g's B rows for step i: the unpacked buffer wq4[i&1] (4-bit) or the panel P itself (8-bit,
 * whose weights further on are asked for ahead). [G/4][64] bytes. */
static inline const uint8_t *amx_group_b(const uint8_t *P, const uint8_t *wq4, int q4, int i, int g, int G) {
    const size_t wq_bytes = (size_t)(G / 4) * 64;
    const uint8_t *wg = q4 ? wq4 + (size_t)(i & 1) * wq_bytes : P + (size_t)g * wq_bytes;
    if (!q4)
        for (int c = 0; c < G / 4; c += 4) __builtin_prefetch(wg + (size_t)c * 64 + AMX_PF_DIST, 0, 2);
    return wg;
}

/* After step i's tile products of group g of panel p: scales and group gn's 4-bit weights (gn >= 0)
 * unpacked into wq4[(i+1)&1] — after the tile loads of that buffer (step i-1) and before the next
 * step's. ahead: 0 where panels are taken one at a time (the scales IB_SB_PF_DIST and the weights
 * AMX_PF_DIST bytes on are asked for: the next panel's, as the stream goes); 2 where they are taken in
 * pairs (p's and p+1's bytes are read together, so those of the panel two on, read with the next pair,
 * are asked for instead). */
static inline __attribute__((always_inline)) void amx_after_products(const ib_matrix *m, int p, const uint8_t *P,
                                                                     uint8_t *wq4, int q4, int i, int g, int gn, int G,
                                                                     int ahead) {
    if (ahead) __builtin_prefetch(ib_pk_sb(m, p + ahead, g));
    else ib_pk_sb_prefetch(m, p, g);
    if (q4 && gn >= 0) {
        AMX_MEMORY_BARRIER();
        amx_unpack_q4(P, gn, G, wq4 + (size_t)((i + 1) & 1) * (size_t)(G / 4) * 64,
                      ahead ? (size_t)ahead * ib_pk_panel_bytes(m) : (size_t)AMX_PF_DIST);
        AMX_MEMORY_BARRIER();
    }
}

/* One row block of a quantized panel p: rows b0 .. b0 + 16*nt - 1 (nt = 1..4 full row tiles) of the
 * Q8 activations q, outputs to Y (row stride ldy) columns 16p.. . Groups ascending (descending when
 * desc). wq4 is a [2][G/4][64] scratch for two 4-bit groups' VNNI rows. The tiles are configured for
 * K-steps of min(G, 64) and C tiles 0..nt-1 are zero on entry and on return.
 *
 * Software-pipelined two groups deep, so that no load reads a store issued just before it (forwarding
 * from a tile store to vector loads, or from vector stores to a tile load, is not to be counted on:
 * such a load may wait until the store has retired and reached the cache, which puts the tile unit and
 * the epilogue one after the other). Step i, in program order:
 *     drain the C tiles (group i-1's sums) to isum[(i-1)&1] and issue group i's tile products, its B
 *     tiles from wq4[i&1] (4-bit) or the panel (8-bit), each C tile stored and zeroed just before its
 *     own first product (amx_drain_step_tile);
 *     unpack group i+1's 4-bit weights to wq4[(i+1)&1];
 *     run group i-2's float epilogue from isum[i&1], stored one step earlier,
 * so the epilogue of step i overlaps the tile products of group i, and the stores that step i's
 * loads read were issued one step (a whole epilogue) before. Where a group is one k-step and the block
 * has several row tiles, a middle step (2 <= i < ng) runs row tile by row tile instead: tile t's drain
 * and product, then the epilogue of its 16 rows, so the tile instructions are spread through the
 * epilogue rather than all waiting ahead of it (64-128 rows 5-12% faster than the order above, 512 a few
 * percent). Every row's groups still reach its accumulators one at a time, in order. */
static void amx_row_block(const ib_matrix *m, int p, const ib_act_buf *q, int b0, int nt, int desc, float *Y,
                          int ldy, uint8_t *wq4) {
    const int K = m->cols, G = m->group, ng = K / G, ks = G < 64 ? G : 64, nr = nt * AMX_TILE_ROWS, q4 = m->fmt == IB_WQ4;
    const uint8_t *P = ib_pk_panel(m, p);
    float acc[AMX_RBLOCK][16] __attribute__((aligned(64)));        /* [row of the block][lane] */
    int32_t isum[2][AMX_RBLOCK][16] __attribute__((aligned(64)));  /* [step parity][row of the block][lane] */
    float sbf[32] __attribute__((aligned(64)));                    /* the epilogue's group: 16 scales, 16 biases */
#define AMX_GROUP(i) (desc ? ng - 1 - (i) : (i))
    if (q4) {
        amx_unpack_q4(P, AMX_GROUP(0), G, wq4, AMX_PF_DIST);
        AMX_MEMORY_BARRIER();
    }
    for (int i = 0; i < ng + 2; i++) {
        if (i == ng) {
            /* the epilogue's reads of isum[(i-1)&1] (step i-1) come before the stores that overwrite it */
            AMX_MEMORY_BARRIER();
            amx_drain(nt, isum[(i - 1) & 1]);
            AMX_MEMORY_BARRIER();
        }
        if (i < ng) {
            const int g = AMX_GROUP(i), gn = i + 1 < ng ? AMX_GROUP(i + 1) : -1;
            const uint8_t *wg = amx_group_b(P, wq4, q4, i, g, G);
            const int8_t *a = q->xq + (size_t)b0 * K + (size_t)g * G;
            if (i >= 2 && ks == G && nt > 1) {
                /* a middle step of one k-step a group: row tile by row tile, C tile t out and its product
                 * of group i in, then group i-2's epilogue of that tile's 16 rows, so the tile instructions
                 * are spread through the epilogue instead of all waiting ahead of it */
                const int ge = AMX_GROUP(i - 2);
                amx_sb_f32(m, p, ge, sbf);
                const float *dg = q->d + (size_t)b0 * ng + ge, *adg = q->ad + (size_t)b0 * ng + ge;
                AMX_MEMORY_BARRIER();
                AMX_LOAD(4, wg, 64);
#pragma GCC unroll 4
                for (int t = 0; t < AMX_ROW_TILES; t++) {
                    if (t >= nt) break;
                    const size_t r0 = (size_t)t * AMX_TILE_ROWS;
                    AMX_MEMORY_BARRIER();
                    amx_drain_step_tile(t, isum[(i - 1) & 1] + r0, a + r0 * (size_t)K, K);
                    AMX_MEMORY_BARRIER();
                    amx_epilogue_at(i == 2, sbf, dg + r0 * ng, adg + r0 * ng, (size_t)ng, AMX_TILE_ROWS,
                                    (const int32_t(*)[16])isum[i & 1] + r0, acc + r0);
                }
                amx_after_products(m, p, P, wq4, q4, i, g, gn, G, 0);
                continue;
            }
            int k = 0;
            if (i >= 1) {
                /* group i-1's sums out (the epilogue's reads of that buffer, step i-1, come before), each
                 * C tile just ahead of its first product of group i */
                AMX_MEMORY_BARRIER();
                AMX_LOAD(4, wg, 64);
#pragma GCC unroll 4
                for (int t = 0; t < AMX_ROW_TILES; t++) {
                    if (t >= nt) break;
                    const size_t r0 = (size_t)t * AMX_TILE_ROWS;
                    amx_drain_step_tile(t, isum[(i - 1) & 1] + r0, a + r0 * (size_t)K, K);
                }
                AMX_MEMORY_BARRIER();
                k = ks;
            }
            for (; k < G; k += ks) amx_step(nt, wg + (size_t)(k / 4) * 64, a + k, K);
            amx_after_products(m, p, P, wq4, q4, i, g, gn, G, 0);
        }
        if (i >= 2) {
            const int g = AMX_GROUP(i - 2);
            amx_sb_f32(m, p, g, sbf);
            amx_epilogue_at(i == 2, sbf, q->d + (size_t)b0 * ng + g, q->ad + (size_t)b0 * ng + g, (size_t)ng, nr,
                            (const int32_t(*)[16])isum[i & 1], acc);
        }
    }
#undef AMX_GROUP
    const int lanes = ib_pk_lanes(m, p);
    for (int r = 0; r < nr; r++) ib_pk_store(Y + (size_t)(b0 + r) * ldy + (size_t)p * 16, acc[r], lanes);
}

/* Rows b0 .. b0 + 15 (one row tile) of two quantized panels p and p + 1 at a time: C tiles 0 and 1
 * hold the two panels' group sums, B tiles 4 and 7 their weights, and each A tile is loaded once for
 * both products, so a block of one row tile still has two tile products a step to spread its epilogue
 * around (amx_row_block's order otherwise: two groups deep, each C tile stored and zeroed just before
 * its product, and where a group is one k-step each panel's 16-row epilogue of the group two back
 * right after that panel's product). The tiles are configured with tile 7 (amx_configure's pairs). C tiles
 * 0 and 1 are zero on entry and on return. Each panel's outputs are amx_row_block's, bit for bit. */
static void amx_row_tile_2p(const ib_matrix *m, int p, const ib_act_buf *q, int b0, int desc, float *Y, int ldy) {
    const int K = m->cols, G = m->group, ng = K / G, ks = G < 64 ? G : 64, q4 = m->fmt == IB_WQ4;
    const size_t wq_pan = (size_t)2 * (size_t)(G / 4) * 64; /* one panel's two groups of VNNI rows */
    const uint8_t *P0 = ib_pk_panel(m, p), *P1 = ib_pk_panel(m, p + 1);
    uint8_t wq4[2 * 2 * 128 / 4 * 64] __attribute__((aligned(64)));     /* [panel][2][G/4][64], G <= 128 */
    uint8_t *wq0 = wq4, *wq1 = wq4 + wq_pan;
    float acc[2][AMX_TILE_ROWS][16] __attribute__((aligned(64)));            /* [panel][row][lane] */
    int32_t isum[2][2][AMX_TILE_ROWS][16] __attribute__((aligned(64)));      /* [panel][step parity][row][lane] */
    float sbf[2][32] __attribute__((aligned(64)));                           /* [panel]: 16 scales, 16 biases */
#define AMX_GROUP(i) (desc ? ng - 1 - (i) : (i))
    if (q4) {
        amx_unpack_q4(P0, AMX_GROUP(0), G, wq0, 2 * ib_pk_panel_bytes(m));
        amx_unpack_q4(P1, AMX_GROUP(0), G, wq1, 2 * ib_pk_panel_bytes(m));
        AMX_MEMORY_BARRIER();
    }
    for (int i = 0; i < ng + 2; i++) {
        const int prod = i < ng, drain = i >= 1 && i <= ng, epi = i >= 2, spread = prod && epi && ks == G;
        const int ge = epi ? AMX_GROUP(i - 2) : 0;
        const float *dg = q->d + (size_t)b0 * ng + ge, *adg = q->ad + (size_t)b0 * ng + ge;
        if (epi) {
            amx_sb_f32(m, p, ge, sbf[0]);
            amx_sb_f32(m, p + 1, ge, sbf[1]);
        }
        /* the epilogue's reads of isum[.][(i-1)&1] (step i-1) come before the tile stores that overwrite it */
        AMX_MEMORY_BARRIER();
        if (prod) {
            const int g = AMX_GROUP(i), gn = i + 1 < ng ? AMX_GROUP(i + 1) : -1;
            const uint8_t *w0 = amx_group_b(P0, wq0, q4, i, g, G), *w1 = amx_group_b(P1, wq1, q4, i, g, G);
            const int8_t *a = q->xq + (size_t)b0 * K + (size_t)g * G;
            AMX_LOAD(4, w0, 64);
            AMX_LOAD(7, w1, 64);
            AMX_LOAD(5, a, K);
/* panel PAN (0 or 1; its C tile has the same number, its B tile is BT): the previous group's sums out,
 * this group's product in, then (spread) its epilogue of the group two back. A macro: tile numbers
 * must be constants. */
#define AMX_PAIR_PANEL(PAN, BT)                                                                          \
    do {                                                                                                 \
        if (drain) {                                                                                     \
            AMX_STORE(PAN, isum[PAN][(i - 1) & 1][0], 64);                                               \
            AMX_ZERO(PAN);                                                                               \
        }                                                                                                \
        AMX_DP(PAN, 5, BT);                                                                              \
        if (spread) {                                                                                    \
            AMX_MEMORY_BARRIER();                                                                        \
            amx_epilogue_at(i == 2, sbf[PAN], dg, adg, (size_t)ng, AMX_TILE_ROWS,                        \
                            (const int32_t(*)[16])isum[PAN][i & 1], acc[PAN]);                           \
            AMX_MEMORY_BARRIER();                                                                        \
        }                                                                                                \
    } while (0)
            AMX_PAIR_PANEL(0, 4);
            AMX_PAIR_PANEL(1, 7);
#undef AMX_PAIR_PANEL
            for (int k = ks; k < G; k += ks) {
                AMX_LOAD(4, w0 + (size_t)(k / 4) * 64, 64);
                AMX_LOAD(7, w1 + (size_t)(k / 4) * 64, 64);
                AMX_LOAD(6, a + k, K);
                AMX_DP(0, 6, 4);
                AMX_DP(1, 6, 7);
            }
            AMX_MEMORY_BARRIER();
            amx_after_products(m, p, P0, wq0, q4, i, g, gn, G, 2);
            amx_after_products(m, p + 1, P1, wq1, q4, i, g, gn, G, 2);
        } else if (drain) {
            AMX_STORE(0, isum[0][(i - 1) & 1][0], 64);
            AMX_ZERO(0);
            AMX_STORE(1, isum[1][(i - 1) & 1][0], 64);
            AMX_ZERO(1);
            AMX_MEMORY_BARRIER();
        }
        if (epi && !spread)
            for (int pan = 0; pan < 2; pan++)
                amx_epilogue_at(i == 2, sbf[pan], dg, adg, (size_t)ng, AMX_TILE_ROWS,
                                (const int32_t(*)[16])isum[pan][i & 1], acc[pan]);
    }
#undef AMX_GROUP
    for (int pan = 0; pan < 2; pan++) {
        const int lanes = ib_pk_lanes(m, p + pan);
        for (int r = 0; r < AMX_TILE_ROWS; r++)
            ib_pk_store(Y + (size_t)(b0 + r) * ldy + (size_t)(p + pan) * 16, acc[pan][r], lanes);
    }
}

/* Panels [p0, p1) for all B rows (contract in ops/matmul.h): rows 0 .. 16*floor(B/16)-1 of a
 * Q8-activation product on tiles, the rest by the AVX-512 kernel, panel by panel (each panel's
 * weights are read from memory once for all its rows). The tiles are configured on entry and released
 * on return, so the thread holds no tile state between products. */
void AMX_KERNEL(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act, int p0, int p1, float *Y,
                int ldy) {
    const int BA = B / AMX_TILE_ROWS * AMX_TILE_ROWS; /* rows on tiles */
    if (!ib_pk_use_q8(m, q, act) || BA == 0 || p1 <= p0) {
        AMX_TAIL_KERNEL(m, X, B, q, act, p0, p1, Y, ldy);
        return;
    }
    const ib_fault fault = ib_fault_get();
    const int desc = fault == IB_FAULT_GEMV_GEMM || fault == IB_FAULT_AMX_GROUP_ORDER; /* B >= 16 here */
    const int K = m->cols, G = m->group, ng = K / G;
    uint8_t wq4[2 * 128 / 4 * 64] __attribute__((aligned(64))); /* two 4-bit groups' VNNI rows, G <= 128 */
    const int pairs = BA == AMX_TILE_ROWS && m->fmt == IB_WQ4; /* one row tile of 4-bit weights: panels in pairs */
    amx_configure(G < 64 ? G : 64, pairs);
    /* the C tiles start zeroed; amx_drain re-zeroes the ones it stores */
    AMX_ZERO(0);
    AMX_ZERO(1);
    AMX_ZERO(2);
    AMX_ZERO(3);
    const ib_act_buf qt = {q->xq + (size_t)BA * K, q->d + (size_t)BA * ng, q->ad + (size_t)BA * ng}; /* tail rows */
    for (int p = p0; p < p1; p++) {
        if (pairs && p + 1 < p1) {
            /* one row tile of 4-bit weights: two panels at a time (their rows past the tile next, while both
             * are in cache). With 8-bit weights, whose B tiles load from memory rather than from the
             * unpacked buffer in L1, the pair measured 10% slower at 16 rows, so they keep one panel. */
            amx_row_tile_2p(m, p, q, 0, desc, Y, ldy);
            if (BA < B) AMX_TAIL_KERNEL(m, X ? X + (size_t)BA * K : NULL, B - BA, &qt, act, p, p + 2, Y + (size_t)BA * ldy, ldy);
            p++;
            continue;
        }
        for (int b0 = 0; b0 < BA; b0 += AMX_RBLOCK) {
            int nt = (BA - b0) / AMX_TILE_ROWS;
            amx_row_block(m, p, q, b0, nt < AMX_ROW_TILES ? nt : AMX_ROW_TILES, desc, Y, ldy, wq4);
        }
        /* the rows past the last full tile, while the panel is in cache (the AVX-512 code touches no tile) */
        if (BA < B) AMX_TAIL_KERNEL(m, X ? X + (size_t)BA * K : NULL, B - BA, &qt, act, p, p + 1, Y + (size_t)BA * ldy, ldy);
    }
    AMX_RELEASE();
}

#else
/* Not x86-64: no AMX kernel (ISO C wants a translation unit to declare something). */
typedef int ib_matmul_amx_unused;
#endif
