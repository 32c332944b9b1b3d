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
 *     tmm0, tmm1  C: int32 [16 rows][16 outputs], one group's sums of one row tile (alternating steps)
 *     tmm2, tmm3  A: int8 activations [16 rows][KS k]
 *     tmm4, tmm5  B: the panel's weights for KS k in the VNNI layout, [KS/4][16 outputs x 4 k] bytes:
 *                 row r, dword j = the codes of output j at k = 4r..4r+3
 * (A and B alternate with C, so one step's loads need not wait for the previous step's products.)
 * The 8-bit packed panel (pack.h: block c = k 4c..4c+3, byte 4j+i = code(j, 4c+i)) already is the
 * VNNI layout: B tiles load straight from it with a 64-byte stride. A 4-bit block c (k 8c..8c+7) holds
 * k 8c..8c+3 in its low nibbles and 8c+4..8c+7 in its high nibbles, each in the same byte positions:
 * each group is unpacked into [G/4][64] bytes (low nibbles -> VNNI row 2c, high -> row 2c+1).
 *
 * BLOCKING. Panels in the caller's range one at a time; each panel's groups in chunks of up to 1,024 k,
 * unpacked once and then used by every row tile of 16 rows; a row tile's float accumulators are 16
 * vector registers over the chunk's groups (amx_panel says how the tile unit and the epilogue
 * overlap); then the panel's rows past the last full tile on AVX-512, while its weights are in cache.
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

/* The configuration described above for K-steps of KS bytes: C tiles 0, 1 of 16 rows x 64 bytes, A
 * (tiles 2, 3) of 16 rows x KS bytes, B (tiles 4, 5) of KS/4 rows x 64 bytes. Constant data: nothing for
 * the compiler to drop or reorder in front of LDTILECFG, whose asm names only the first 8 bytes. */
#define AMX_CFG(KS) { .palette = 1, .colsb = {64, 64, KS, KS, 64, 64}, .rows = {16, 16, 16, 16, KS / 4, KS / 4} }
static const amx_tilecfg amx_cfg_ks32 __attribute__((aligned(64))) = AMX_CFG(32);
static const amx_tilecfg amx_cfg_ks64 __attribute__((aligned(64))) = AMX_CFG(64);

/* Load the configuration for K-steps of ks bytes (32 or 64). */
static void amx_configure(int ks) {
    AMX_MEMORY_BARRIER();
    AMX_CONFIG(ks == 32 ? &amx_cfg_ks32 : &amx_cfg_ks64);
}

/* Unpack group g of 4-bit panel P (group size G) into VNNI rows: out [G/4][64] bytes, row 2i = the low
 * nibbles of the group's block i (k 8i..8i+3), row 2i+1 = its high nibbles (k 8i+4..8i+7). */
static inline void amx_unpack_q4(const uint8_t *P, int g, int G, uint8_t *restrict out) {
    const uint8_t *blk = P + (size_t)g * (size_t)(G / 8) * 64;
    for (int i = 0; i < G / 8; i++) {
        const uint8_t *w = blk + (size_t)i * 64;
        __builtin_prefetch(w + AMX_PF_DIST, 0, 2);
        uint8_t *lo = out + (size_t)(2 * i) * 64, *hi = lo + 64;
        for (int x = 0; x < 64; x++) lo[x] = (uint8_t)(w[x] & 15), hi[x] = (uint8_t)(w[x] >> 4);
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

/* 16 floats / 16 int32s as one value (GCC vector extensions: element-wise IEEE operations, the same bits
 * in any vector width; zmm registers where AVX-512 is on, plain C elsewhere, e.g. in test_amx_emul). */
typedef float amx_v16f __attribute__((vector_size(64)));
typedef int32_t amx_v16i __attribute__((vector_size(64)));

/* A chunk: the groups whose 4-bit weights are unpacked together (at most AMX_CHUNK_K k: [K/4][64] bytes
 * = 16 KiB of VNNI rows) and then used by every row tile, so each weight is unpacked once per product. */
#define AMX_CHUNK_K 1024
#define AMX_DEPTH 2   /* the float epilogue runs this many steps behind the tile products (amx_panel) */
#define AMX_RING 4    /* the slots a one-row-tile panel's groups cycle through (> AMX_DEPTH + 1, a power of 2) */
_Static_assert(AMX_DEPTH == 2 && AMX_RING > AMX_DEPTH + 1 && (AMX_RING & (AMX_RING - 1)) == 0 &&
                   AMX_RING * 128 <= AMX_CHUNK_K && (AMX_CHUNK_K & (AMX_CHUNK_K - 1)) == 0 && AMX_CHUNK_K >= 128,
               "two isum slots; a chunk holds a ring of the largest groups (128) and whole groups of 32, 64, 128");

/* The tile products of one step: C tile `par` (0 or 1) = the group's integer sums of a row tile, k-steps
 * of ks, B from the group's VNNI rows wb [G/4][64] (stride 64), A from the row tile's activations a
 * (its 16 rows at stride K, the group's first k). Tiles 2 + par (A) and 4 + par (B) alternate with the
 * parity too, so one step's loads do not wait for the previous step's products to read their tiles. */
static inline void amx_group_products(int par, const uint8_t *wb, const int8_t *a, int K, int G, int ks) {
    for (int k = 0; k < G; k += ks) {
        const uint8_t *w = wb + (size_t)(k / 4) * 64;
        if (par) {
            AMX_LOAD(5, w, 64);
            AMX_LOAD(3, a + k, K);
            AMX_DP(1, 3, 5);
        } else {
            AMX_LOAD(4, w, 64);
            AMX_LOAD(2, a + k, K);
            AMX_DP(0, 2, 4);
        }
    }
}

/* Store C tile `par` to isum [16][16] and zero it. */
static inline void amx_drain(int par, int32_t (*isum)[16]) {
    if (par) {
        AMX_STORE(1, isum[0], 64);
        AMX_ZERO(1);
    } else {
        AMX_STORE(0, isum[0], 64);
        AMX_ZERO(0);
    }
}

/* The float epilogue of one group for a row tile's 16 rows: acc[r] = (acc[r] + (s*d_r)*(float)isum[r]) +
 * b*ad_r over the 16 outputs, with sb [32] the group's scales s then biases b, d_r = d[r*ng], ad_r =
 * ad[r*ng]: the scalar kernel's formula, term for term (separate multiplies and adds). Unrolled, so the
 * accumulators stay in registers across a row tile's groups. */
static inline void amx_epilogue(amx_v16f acc[16], const float *restrict sb, const float *d, const float *ad, size_t ng,
                                const int32_t (*restrict isum)[16]) {
    amx_v16f s, b;
    memcpy(&s, sb, sizeof s);
    memcpy(&b, sb + 16, sizeof b);
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        amx_v16i is;
        memcpy(&is, isum[r], sizeof is);
        const float dr = d[(size_t)r * ng], adr = ad[(size_t)r * ng];
        const amx_v16f t = (s * dr) * __builtin_convertvector(is, amx_v16f);
        const amx_v16f u = b * adr;
        acc[r] = (acc[r] + t) + u;
    }
}

/* A row tile's accumulators: zero (its first chunk) or the partial sums parked in Y (16 lanes at
 * y0, row stride ldy; lanes past `lanes` are padding, never stored, read as 0). */
static inline void amx_acc_load(amx_v16f acc[16], int first, const float *y0, size_t ldy, int lanes) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        float v[16] = {0};
        if (!first) memcpy(v, y0 + (size_t)r * ldy, sizeof(float) * (size_t)lanes);
        memcpy(&acc[r], v, sizeof v);
    }
}

/* Store a row tile's accumulators to Y (the final values, or a later chunk's starting point). */
static inline void amx_acc_store(const amx_v16f acc[16], float *y0, size_t ldy, int lanes) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        float v[16];
        memcpy(v, &acc[r], sizeof v);
        ib_pk_store(y0 + (size_t)r * ldy, v, lanes);
    }
}

/* Group g of panel p made ready for a chunk: its 4-bit weights (q4) unpacked into VNNI rows wq [G/4][64]
 * (8-bit ones are read from the panel as they are), its 16 scales and 16 biases as floats into sb [32]. */
static inline void amx_chunk_group(const ib_matrix *m, int p, int g, int q4, uint8_t *wq, float *sb) {
    if (q4) amx_unpack_q4(ib_pk_panel(m, p), g, m->group, wq);
    amx_sb_f32(m, p, g, sb);
}

/* Quantized panel p, rows 0 .. 16*T - 1 of the Q8 activations q, outputs to Y (row stride ldy) columns
 * 16p.. . Groups ascending (descending when desc). The tiles are configured for K-steps of min(G, 64)
 * and C tiles 0 and 1 are zero on entry and on return.
 *
 * The groups are taken in chunks (AMX_CHUNK_K): a chunk's 4-bit weights are unpacked into VNNI rows once
 * and its scales and biases converted once (by its first row tile's pass, a group ahead); the chunk's
 * steps — (row tile, group) pairs, row tile by row tile — run through a pipeline two steps deep. Step i,
 * in program order:
 *     drain C tile (i-1)&1 (step i-1's sums) to isum[(i-1)&1];
 *     the tile products of step i into C tile i&1;
 *     the float epilogue of step i-2 from isum[i&1], drained one step earlier,
 * so the epilogue overlaps the tile unit, and no vector load reads a tile store issued just before it
 * (forwarding from a tile store to vector loads is not to be counted on: such a load may wait until the
 * store has reached the cache). A row tile's 16 accumulators stay in registers over its groups of the
 * chunk and are parked in Y between chunks. Every row's groups reach its accumulators one at a time, in
 * order. */
static void amx_panel(const ib_matrix *m, int p, const ib_act_buf *q, int T, int desc, float *Y, int ldy) {
    const int K = m->cols, G = m->group, ng = K / G, ks = G < 64 ? G : 64, q4 = m->fmt == IB_WQ4;
    const size_t wq_bytes = (size_t)(G / 4) * 64; /* one group's VNNI rows */
    /* groups per chunk: with one row tile, each group is used once, so the whole of K is one chunk whose
     * groups take slots of a ring (AMX_RING: the products' and the epilogue's groups stay in it) */
    const int one = T == 1, cmax = one ? ng : AMX_CHUNK_K / G;
    const int smask = one ? AMX_RING - 1 : AMX_CHUNK_K / 32 - 1; /* chunk group j's slot: j & smask */
    const uint8_t *P = ib_pk_panel(m, p);
    const int lanes = ib_pk_lanes(m, p);
    float *yp = Y + (size_t)p * 16;
    uint8_t wq4[AMX_CHUNK_K / 4 * 64] __attribute__((aligned(64)));   /* [slot][G/4][64] */
    float sbc[AMX_CHUNK_K / 32][32] __attribute__((aligned(64)));     /* [slot][s, b] */
    int32_t isum[AMX_DEPTH][16][16] __attribute__((aligned(64)));                          /* [slot][row][lane] */
    amx_v16f acc[16];
#define AMX_GROUP(i) (desc ? ng - 1 - (i) : (i))
    const long gdir = desc ? -1 : 1; /* chunk group j is group gbase + gdir * j */
    for (int c0 = 0; c0 < ng; c0 += cmax) {
        const int cg = ng - c0 < cmax ? ng - c0 : cmax, S = T * cg;
        const long gbase = AMX_GROUP(c0);
        /* the chunk's first group as VNNI rows (4-bit; an 8-bit panel already is) and its scales and
         * biases as floats; the previous chunk's tile loads come before these stores */
        AMX_MEMORY_BARRIER();
        amx_chunk_group(m, p, (int)gbase, q4, wq4, sbc[0]);
        AMX_MEMORY_BARRIER();
        /* the step whose products issue: row tile pt (its activations at arow), chunk group pj */
        const int8_t *arow = q->xq;
        int pt = 0, pj = 0;
        /* the step whose epilogue runs: its row tile's d, ad and Y rows, chunk group ej */
        const float *drow = q->d, *adrow = q->ad;
        float *yrow = yp;
        int ej = 0;
        const size_t dstep = (size_t)16 * (size_t)ng, ystep = (size_t)16 * (size_t)ldy;
        for (int i = 0; i < S + AMX_DEPTH; i++) {
            if (i >= 1 && i <= S) {
                /* the epilogue's reads of this slot (step i-1-AMX_DEPTH) came before */
                AMX_MEMORY_BARRIER();
                amx_drain((i - 1) & 1, isum[(i - 1) & 1]);
                AMX_MEMORY_BARRIER();
            }
            if (i < S) {
                const long g = gbase + gdir * pj;
                const uint8_t *wb = q4 ? wq4 + (size_t)(pj & smask) * wq_bytes : P + (size_t)g * wq_bytes;
                amx_group_products(i & 1, wb, arow + g * G, K, G, ks);
                if (pt == 0 && pj + 1 < cg) {
                    /* the first row tile's pass prepares the chunk's next group, one step ahead of its
                     * products (so the weights' reads overlap the tile unit where there is one row
                     * tile); this step's tile loads come before the stores */
                    const int sl = (pj + 1) & smask;
                    AMX_MEMORY_BARRIER();
                    amx_chunk_group(m, p, (int)(g + gdir), q4, wq4 + (size_t)sl * wq_bytes, sbc[sl]);
                    AMX_MEMORY_BARRIER();
                }
                if (++pj == cg) pj = 0, pt++, arow += (size_t)16 * (size_t)K;
            }
            if (i >= AMX_DEPTH) {
                const long g = gbase + gdir * ej;
                if (ej == 0) amx_acc_load(acc, c0 == 0, yrow, (size_t)ldy, lanes);
                amx_epilogue(acc, sbc[ej & smask], drow + g, adrow + g, (size_t)ng, (const int32_t(*)[16])isum[i & 1]);
                if (ej == cg - 1) amx_acc_store(acc, yrow, (size_t)ldy, lanes);
                if (++ej == cg) ej = 0, drow += dstep, adrow += dstep, yrow += ystep;
            }
        }
    }
#undef AMX_GROUP
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
    amx_configure(G < 64 ? G : 64);
    /* the C tiles start zeroed; amx_drain re-zeroes the one it stores */
    AMX_ZERO(0);
    AMX_ZERO(1);
    const ib_act_buf qt = {q->xq + (size_t)BA * K, q->d + (size_t)BA * ng, q->ad + (size_t)BA * ng}; /* tail rows */
    for (int p = p0; p < p1; p++) {
        amx_panel(m, p, q, BA / AMX_TILE_ROWS, desc, Y, ldy);
        /* the rows past the last full tile, while the panel is in cache (the AVX-512 code touches no tile) */
        if (BA < B) AMX_TAIL_KERNEL(m, X ? X + (size_t)BA * K : NULL, B - BA, &qt, act, p, p + 1, Y + (size_t)BA * ldy, ldy);
    }
    AMX_RELEASE();
}

#else
/* Not x86-64: no AMX kernel (ISO C wants a translation unit to declare something). */
typedef int ib_matmul_amx_unused;
#endif
