/*
 * test_amx_emul.c — the AMX kernel's logic (src/backends/cpu/matmul_amx.c) on any CPU: the kernel's
 * source is compiled here with its six tile operations (LDTILECFG, TILELOADD, TDPBSUD, TILESTORED,
 * TILEZERO, TILERELEASE) implemented in C from the instruction set's definition, and its rows past the
 * last full tile sent to the scalar kernel. It checks, against the numeric definition of ops/matmul.h
 * evaluated here:
 *   - every row count 1..70 and 150, 4- and 8-bit weights, groups 32, 64 and 128 (both tile K-steps),
 *     N not a multiple of 16, K from 32 to 2,112 (66 groups), scales stored as float32, bfloat16 and
 *     float16: bitwise equal;
 *   - the panel range split in two gives the same bits; Y's padding columns are never written;
 *   - the tile configuration is one the hardware accepts (palette 1, tiles 0..7, at most 16 rows of 64
 *     bytes, the operand shapes TDPBSUD demands) and is released after each call; the tiles are used
 *     exactly when a product has 16 rows or more;
 *   - the checks can fail: TDPBSSD (weights read as signed bytes) in place of TDPBSUD breaks 8-bit
 *     weights, and the amx-group-order fault breaks exactly the tile rows.
 * What it cannot check: the real instructions and the compiler's treatment of their asm statements
 * (test_matmul does, where the CPU has AMX).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/half.h"
#include "isobatch.h"
#include "ops/matmul.h"

#define TEST_RNG_SEED 0x2545f4914f6cdd1dULL
#include "test_rng.h"

/* ---------------------------------------------------------------- the tile emulator */

/* The state of palette 1: 8 tiles of at most 16 rows x 64 bytes, each with its configured shape. */
static struct {
    int configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t t[8][16][64];
    long loads, dps;
    int errors;
    char first_error[160];
    int signed_b; /* test-only: TDPBSSD semantics (B bytes signed) in place of TDPBSUD */
} emu;

static void emu_error(const char *fmt, ...) {
    if (emu.errors++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(emu.first_error, sizeof emu.first_error, fmt, ap);
        va_end(ap);
    }
}

/* A tile number the instruction may name, configured with a non-empty shape. */
static int emu_tile_ok(int t) {
    if (!emu.configured) return emu_error("tile %d used without a configuration", t), 0;
    if (t < 0 || t > 7 || emu.rows[t] == 0 || emu.colsb[t] == 0) return emu_error("tile %d not configured", t), 0;
    return 1;
}

/* LDTILECFG: palette 1 (tiles 0..7), start_row 0, reserved bytes 0, tiles 8..15 unset, each shape at
 * most 16 rows x 64 bytes; zeroes every tile. */
static void emu_config(const void *cfg) {
    const uint8_t *c = cfg;
    if (c[0] != 1) emu_error("palette %d", c[0]);
    for (int i = 1; i < 16; i++)
        if (c[i]) emu_error("configuration byte %d (start_row / reserved) is %d", i, c[i]);
    for (int i = 0; i < 16; i++) {
        int colsb = c[16 + 2 * i] | c[17 + 2 * i] << 8, rows = c[48 + i];
        if (i >= 8 && (colsb || rows)) emu_error("tile %d configured under palette 1", i);
        if (i < 8) {
            if (rows > 16 || colsb > 64 || (rows == 0) != (colsb == 0)) emu_error("tile %d shape %dx%d", i, rows, colsb);
            emu.rows[i] = (uint8_t)rows, emu.colsb[i] = (uint16_t)colsb;
        }
    }
    memset(emu.t, 0, sizeof emu.t);
    emu.configured = 1;
}

/* TILELOADD: row r of tile t = colsb bytes at base + r*stride; the rest of the tile zero. */
static void emu_load(int t, const void *base, long stride) {
    if (!emu_tile_ok(t)) return;
    memset(emu.t[t], 0, sizeof emu.t[t]);
    for (int r = 0; r < emu.rows[t]; r++) memcpy(emu.t[t][r], (const uint8_t *)base + (long)r * stride, emu.colsb[t]);
    emu.loads++;
}

/* TDPBSUD: C[m][n] += sum over k < colsb(A)/4, i < 4 of (int8) A[m][4k+i] * (uint8) B[k][4n+i],
 * int32 wrapping; shapes: rows(C) = rows(A), colsb(C) = colsb(B), colsb(A) = 4 rows(B). */
static void emu_dp(int c, int a, int b) {
    if (!emu_tile_ok(c) || !emu_tile_ok(a) || !emu_tile_ok(b)) return;
    if (emu.rows[c] != emu.rows[a] || emu.colsb[c] != emu.colsb[b] || emu.colsb[a] != 4 * emu.rows[b] ||
        emu.colsb[c] % 4)
        return emu_error("tdpbsud shapes C %dx%d A %dx%d B %dx%d", emu.rows[c], emu.colsb[c], emu.rows[a],
                         emu.colsb[a], emu.rows[b], emu.colsb[b]);
    if (c == a || c == b || a == b) return emu_error("tdpbsud names tile %d twice", c == a || c == b ? c : a);
    for (int m = 0; m < emu.rows[c]; m++)
        for (int n = 0; n < emu.colsb[c] / 4; n++) {
            int32_t acc;
            memcpy(&acc, &emu.t[c][m][4 * n], 4);
            int64_t sum = acc;
            for (int k = 0; k < emu.colsb[a] / 4; k++)
                for (int i = 0; i < 4; i++) {
                    int bv = emu.signed_b ? (int8_t)emu.t[b][k][4 * n + i] : emu.t[b][k][4 * n + i];
                    sum += (int8_t)emu.t[a][m][4 * k + i] * bv;
                }
            acc = (int32_t)(uint32_t)sum;
            memcpy(&emu.t[c][m][4 * n], &acc, 4);
        }
    emu.dps++;
}

/* TILESTORED: colsb bytes of row r to base + r*stride. */
static void emu_store(int t, void *base, long stride) {
    if (!emu_tile_ok(t)) return;
    for (int r = 0; r < emu.rows[t]; r++) memcpy((uint8_t *)base + (long)r * stride, emu.t[t][r], emu.colsb[t]);
}

static void emu_zero(int t) {
    if (emu_tile_ok(t)) memset(emu.t[t], 0, sizeof emu.t[t]);
}

static void emu_release(void) {
    emu.configured = 0;
    memset(emu.rows, 0, sizeof emu.rows), memset(emu.colsb, 0, sizeof emu.colsb);
}

#define IB_AMX_EMULATE 1
#define AMX_CONFIG(cfg) emu_config(cfg)
#define AMX_LOAD(t, base, stride) emu_load(t, base, (long)(stride))
#define AMX_DP(c, a, b) emu_dp(c, a, b)
#define AMX_STORE(t, base, stride) emu_store(t, base, (long)(stride))
#define AMX_ZERO(t) emu_zero(t)
#define AMX_RELEASE() emu_release()
#define AMX_KERNEL amx_emul_kernel
#define AMX_TAIL_KERNEL ib_matmul_panels_scalar
#include "backends/cpu/matmul_amx.c"

/* ---------------------------------------------------------------- weights and the definition */

typedef struct wq {
    ib_matrix m;
    int bits, G, N, K;
    uint8_t *codes;   /* [N][K] */
    float *s, *b;     /* [N][K/G], as stored (rounded to the storage when sb_round) */
} wq;

/* Random codes (the extremes 0 and 2^bits - 1 included) and MLX-like scales and biases, rounded to
 * bfloat16 (sb_round 1) or float16 (2) so the packer stores them in 16 bits. 0 on success. */
static int wq_make(wq *w, int bits, int G, int N, int K, int sb_round) {
    memset(w, 0, sizeof *w);
    w->bits = bits, w->G = G, w->N = N, w->K = K;
    const int ng = K / G, qmax = (1 << bits) - 1, per = 32 / bits;
    w->codes = malloc((size_t)N * K);
    w->s = malloc(sizeof(float) * N * ng), w->b = malloc(sizeof(float) * N * ng);
    uint32_t *packed = calloc((size_t)N * K / per, sizeof *packed);
    for (size_t i = 0; i < (size_t)N * K; i++) w->codes[i] = (uint8_t)(i % 97 == 0 ? qmax : i % 89 == 0 ? 0 : rndi(qmax + 1));
    for (size_t i = 0; i < (size_t)N * ng; i++) {
        float s = 0.002f + 0.03f * (rndf() + 1.0f) / (float)(1 << (bits - 4));
        float b = -s * (float)qmax * 0.5f * (1.0f + 0.3f * rndf());
        if (sb_round == 1) s = ib_bf16_to_f32(ib_f32_to_bf16(s)), b = ib_bf16_to_f32(ib_f32_to_bf16(b));
        if (sb_round == 2) s = ib_f16_to_f32(ib_f32_to_f16(s)), b = ib_f16_to_f32(ib_f32_to_f16(b));
        w->s[i] = s, w->b[i] = b;
    }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            packed[((size_t)n * K + k) / per] |= (uint32_t)w->codes[(size_t)n * K + k] << ((k % per) * bits);
    ib_error err;
    ib_status st = ib_matrix_from_mlx(&w->m, packed, w->s, w->b, N, K, bits, G, &err);
    free(packed);
    return st != IB_OK;
}

static void wq_free(wq *w) {
    ib_matrix_free(&w->m);
    free(w->codes), free(w->s), free(w->b);
}

/* y [B][N]: the Q8 definition (exact group sums, acc = (acc + (s*d)*(float)isum) + b*ad ascending). */
static void canon_q8(const wq *w, const ib_act_buf *q, int B, float *y) {
    const int K = w->K, G = w->G, ng = K / G;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < w->N; n++) {
            float acc = 0.0f;
            for (int g = 0; g < ng; g++) {
                int32_t isum = 0;
                for (int k = g * G; k < (g + 1) * G; k++) isum += (int32_t)w->codes[(size_t)n * K + k] * q->xq[(size_t)b * K + k];
                float t = (w->s[(size_t)n * ng + g] * q->d[(size_t)b * ng + g]) * (float)isum;
                float u = w->b[(size_t)n * ng + g] * q->ad[(size_t)b * ng + g];
                acc = (acc + t) + u;
            }
            y[(size_t)b * w->N + n] = acc;
        }
}

/* ---------------------------------------------------------------- the checks */

#define SENTINEL -1234.5f

/* The emulated kernel over panels [0, n_panels) (split at `split` when 0 < split < n_panels) into
 * y [B][ldy], sentinel-filled first. Returns 0, or 1 when a padding column was written. */
static int run_kernel(const wq *w, const ib_act_buf *q, int B, int split, float *y, int ldy) {
    for (size_t i = 0; i < (size_t)B * ldy; i++) y[i] = SENTINEL;
    const int np = w->m.n_panels;
    if (split > 0 && split < np) {
        amx_emul_kernel(&w->m, NULL, B, q, IB_ACT_Q8, 0, split, y, ldy);
        amx_emul_kernel(&w->m, NULL, B, q, IB_ACT_Q8, split, np, y, ldy);
    } else {
        amx_emul_kernel(&w->m, NULL, B, q, IB_ACT_Q8, 0, np, y, ldy);
    }
    for (int b = 0; b < B; b++)
        for (int n = w->N; n < ldy; n++)
            if (y[(size_t)b * ldy + n] != SENTINEL) return 1;
    return 0;
}

/* Rows [0, B) of y (stride ldy) bitwise equal to canon (stride N)? Returns the first differing row, or -1. */
static int first_diff_row(const float *y, int ldy, const float *canon, int N, int B) {
    for (int b = 0; b < B; b++)
        if (memcmp(y + (size_t)b * ldy, canon + (size_t)b * N, sizeof(float) * N)) return b;
    return -1;
}

/* One weight configuration: every row count 1..70 and 150 against the definition. */
static void check_config(int bits, int G, int N, int K, int sb_round) {
    enum { BMAX = 150 };
    wq w;
    if (wq_make(&w, bits, G, N, K, sb_round)) {
        CHECK(0, "bits %d g%d N=%d K=%d: building the matrix failed", bits, G, N, K);
        wq_free(&w);
        return;
    }
    const int ng = K / G, ldy = N + 3;
    float *x = malloc(sizeof(float) * BMAX * K), *canon = malloc(sizeof(float) * BMAX * N);
    float *y = malloc(sizeof(float) * BMAX * ldy);
    ib_act_buf q = {malloc((size_t)BMAX * K), malloc(sizeof(float) * BMAX * ng), malloc(sizeof(float) * BMAX * ng)};
    for (int i = 0; i < BMAX * K; i++) x[i] = rndf() * (float)(1 + i % 5);
    for (int k = 0; k < K; k++) x[(size_t)1 * K + k] = k < G ? 0.0f : x[(size_t)1 * K + k]; /* a zero group */
    ib_quantize_act(x, BMAX, K, G, q.xq, q.d, q.ad);
    canon_q8(&w, &q, BMAX, canon);
    int bad_rows = 0, bad_pad = 0, tiles_wrong = 0, released = 1;
    for (int B = 1; B <= BMAX; B = B < 70 ? B + 1 : BMAX) {
        long dps0 = emu.dps;
        bad_pad |= run_kernel(&w, &q, B, B % 3 ? 0 : w.m.n_panels / 2, y, ldy);
        int d = first_diff_row(y, ldy, canon, N, B);
        if (d >= 0 && !bad_rows) {
            fprintf(stderr, "  bits %d g%d N=%d K=%d sb%d: B=%d row %d differs (%.9g vs %.9g)\n", bits, G, N, K, sb_round,
                    B, d, (double)y[(size_t)d * ldy], (double)canon[(size_t)d * N]);
            bad_rows = B;
        }
        if ((emu.dps > dps0) != (B >= 16)) tiles_wrong = B;
        if (emu.configured) released = 0;
        if (B == BMAX) break;
    }
    CHECK(!bad_rows, "bits %d g%d N=%d K=%d sb%d: the %d-row product differs from the definition", bits, G, N, K,
          sb_round, bad_rows);
    CHECK(!bad_pad, "bits %d g%d N=%d K=%d: a padding column of Y was written", bits, G, N, K);
    CHECK(!tiles_wrong, "bits %d g%d: the %d-row product %s the tiles", bits, G, tiles_wrong,
          tiles_wrong >= 16 ? "did not use" : "used");
    CHECK(released, "bits %d g%d: the tile configuration outlived a call", bits, G);
    CHECK(emu.errors == 0, "bits %d g%d: the tiles were misused: %s", bits, G, emu.first_error);

    /* the checks can fail: weights read as signed bytes (TDPBSSD) break 8-bit codes >= 128 */
    if (bits == 8) {
        emu.signed_b = 1;
        run_kernel(&w, &q, 32, 0, y, ldy);
        emu.signed_b = 0;
        CHECK(first_diff_row(y, ldy, canon, N, 32) >= 0, "bits 8 g%d: signed weight bytes not caught", G);
    }
    /* the kernel's fault: descending groups on the tile rows (the first 32 of 40), not on the rest */
    if (ng > 1) {
        ib_fault_set(IB_FAULT_AMX_GROUP_ORDER);
        run_kernel(&w, &q, 40, 0, y, ldy);
        ib_fault_set(IB_FAULT_NONE);
        int tile_rows_differ = 0;
        for (int b = 0; b < 32; b++) tile_rows_differ += first_diff_row(y + (size_t)b * ldy, ldy, canon + (size_t)b * N, N, 1) >= 0;
        /* (a row can come out the same by chance when there are few groups and outputs) */
        CHECK(tile_rows_differ >= 24, "bits %d g%d: amx-group-order changed only %d of the 32 tile rows", bits, G,
              tile_rows_differ);
        CHECK(first_diff_row(y + (size_t)32 * ldy, ldy, canon + (size_t)32 * N, N, 8) < 0,
              "bits %d g%d: amx-group-order reached the rows past the last tile", bits, G);
        /* one row tile (20 rows): with 4-bit weights its panels two at a time, the fault on them as well */
        if (N > 16) {
            ib_fault_set(IB_FAULT_AMX_GROUP_ORDER);
            run_kernel(&w, &q, 20, 0, y, ldy);
            ib_fault_set(IB_FAULT_NONE);
            tile_rows_differ = 0;
            for (int b = 0; b < 16; b++)
                tile_rows_differ += first_diff_row(y + (size_t)b * ldy, ldy, canon + (size_t)b * N, N, 1) >= 0;
            CHECK(tile_rows_differ >= 12, "bits %d g%d: amx-group-order changed only %d of a 20-row product's 16 tile rows",
                  bits, G, tile_rows_differ);
            CHECK(first_diff_row(y + (size_t)16 * ldy, ldy, canon + (size_t)16 * N, N, 4) < 0,
                  "bits %d g%d: amx-group-order reached a 20-row product's last 4 rows", bits, G);
        }
    }
    free(x), free(canon), free(y), free(q.xq), free(q.d), free(q.ad);
    wq_free(&w);
}

int main(void) {
    static const struct { int bits, G, N, K; } cfgs[] = {
        {4, 32, 40, 256}, {4, 64, 50, 512}, {4, 128, 33, 384}, {4, 64, 16, 64},
        {8, 32, 40, 256}, {8, 64, 17, 128}, {8, 128, 40, 512}, {8, 32, 7, 32},
        /* long K: many groups through the pipeline (66 of 32; 25 of 64) */
        {4, 32, 24, 2112}, {8, 64, 17, 1600},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_config(cfgs[i].bits, cfgs[i].G, cfgs[i].N, cfgs[i].K, 0);
    check_config(4, 64, 40, 256, 1);   /* scales and biases stored as bfloat16 */
    check_config(8, 32, 40, 128, 2);   /* as float16 */
    printf("test_amx_emul: %ld tile loads, %ld tile products emulated\n", emu.loads, emu.dps);
    TEST_MAIN_END("test_amx_emul");
}
