/*
 * test_matmul_neon.c — the vector matmul kernels against the scalar reference, bitwise, over a sweep of
 * shapes: every row count B = 1..33 (row tiles of 4 and their tails) plus B = 70 (past the 64-row
 * accumulator chunk), K a multiple of the group (1, 3 and 5 groups: inside one K block and across
 * several), N not a multiple of 16 (a partial last panel), groups 32 / 64 / 128, F32 / Q4 / Q8 weights,
 * f32 and q8 activations, and extreme inputs (codes 0 and the maximum only, activations +-127).
 *
 * Made for the NEON kernel (src/backends/cpu/matmul_neon.c), which the x86 development machine cannot
 * run: `make neon-test` (tests/t_neon.sh) cross-builds this file with the few sources it needs for
 * aarch64 and runs it under qemu, on a CPU with the int8 dot product and on one without. There it
 * checks NEON with SDOT (when the CPU has it) and the plain NEON path (forced with
 * ib_neon_dotprod_disable), that NEON is supported and what `--isa auto` picks, and, when
 * IB_EXPECT_DOTPROD is set to 0 or 1, that the run-time dot-product detection says so.
 * The native build (make, tests/run.sh) runs the same sweep on the x86 vector ISAs this CPU has.
 * Every kernel is also shown to see the gemv-gemm and isa-fma faults (so the comparison can fail).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "check.h"
#include "core/half.h"
#include "core/pool.h"
#include "ops/matmul.h"

#define BMAX 70   /* largest row count (B = 1..33, then 70) */

/* ---------------------------------------------------------------- deterministic random numbers */

#define TEST_RNG_SEED 0x243f6a8885a308d3ULL
#include "test_rng.h"

/* ---------------------------------------------------------------- the kernels under test */

typedef struct kern {
    ib_isa isa;
    int no_dot;        /* NEON: force the plain (no SDOT) path */
    int q8_only;       /* only the Q8-activation path differs from another kernel in the list */
    char name[32];
} kern;

static kern kerns[4];
static int n_kerns;

static void kern_select(const kern *k) {
#if defined(__aarch64__)
    ib_neon_dotprod_disable(k->no_dot);
#else
    (void)k;
#endif
}

/* ---------------------------------------------------------------- one configuration */

/* Scales and biases rounded to bfloat16 (1) or float16 (2) so the packer stores them in 16 bits;
 * 0 leaves them float32. */
static int sb_round;

/* A matrix of `bits` (0 = float32) with group G, N x K; extreme = codes 0 / max only. */
static int make_matrix(ib_matrix *m, int bits, int G, int N, int K, int extreme) {
    ib_error err;
    int rc;
    if (bits == 0) {
        float *w = malloc(sizeof(float) * (size_t)N * K);
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = extreme ? (i % 3 ? 1.0e3f : -1.0e-3f) * rndf() : rndf();
        rc = ib_matrix_from_f32(m, w, N, K, &err) != IB_OK;
        free(w);
    } else {
        const int per = 32 / bits, wpr = K / per, ng = K / G, qmax = (1 << bits) - 1;
        uint32_t *wq = calloc((size_t)N * wpr, sizeof *wq);
        float *s = malloc(sizeof(float) * (size_t)N * ng), *b = malloc(sizeof(float) * (size_t)N * ng);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                uint32_t c = extreme ? (rnd64() & 1 ? (uint32_t)qmax : 0u) : (uint32_t)rndi(qmax + 1);
                wq[(size_t)n * wpr + k / per] |= c << ((k % per) * bits);
            }
        for (size_t i = 0; i < (size_t)N * ng; i++) {
            s[i] = 0.002f + 0.03f * (rndf() + 1.0f);
            b[i] = -s[i] * (float)qmax * 0.5f * (1.0f + 0.3f * rndf());
            if (sb_round == 1) s[i] = ib_bf16_to_f32(ib_f32_to_bf16(s[i])), b[i] = ib_bf16_to_f32(ib_f32_to_bf16(b[i]));
            if (sb_round == 2) s[i] = ib_f16_to_f32(ib_f32_to_f16(s[i])), b[i] = ib_f16_to_f32(ib_f32_to_f16(b[i]));
        }
        rc = ib_matrix_from_mlx(m, wq, s, b, N, K, bits, G, &err) != IB_OK;
        free(wq);
        free(s);
        free(b);
    }
    if (rc) fprintf(stderr, "building a %d-bit [%d, %d] matrix: %s\n", bits, N, K, err.msg);
    return rc;
}

/* Activations [BMAX][K]: rows of different magnitudes, a zero first group in row 1; extreme: row 0
 * all +1 (xq = +127), row 1 all -1 (xq = -127), row 2 alternating +-1. */
static void make_x(float *x, int K, int extreme) {
    for (int b = 0; b < BMAX; b++) {
        float sc = ldexpf(1.0f, rndi(7) - 3);
        for (int k = 0; k < K; k++) x[(size_t)b * K + k] = rndf() * sc;
    }
    for (int k = 0; k < K && k < 32; k++) x[(size_t)1 * K + k] = 0.0f;
    if (extreme)
        for (int k = 0; k < K; k++) {
            x[k] = 1.0f;
            x[(size_t)1 * K + k] = -1.0f;
            x[(size_t)2 * K + k] = k & 1 ? -1.0f : 1.0f;
        }
}

/* Y [B][ldy] of one product, columns N..ldy-1 sentinel-filled first; 0 when a sentinel was written. */
static int product(const ib_matrix *m, const float *x, int B, const ib_act_buf *q, ib_act act, ib_isa isa,
                   ib_pool *pool, float *y, int ldy) {
    for (size_t i = 0; i < (size_t)B * ldy; i++) y[i] = -777.0f;
    ib_matmul(m, x, B, q, act, isa, pool, y, ldy);
    for (int b = 0; b < B; b++)
        for (int n = m->rows; n < ldy; n++)
            if (y[(size_t)b * ldy + n] != -777.0f) return 0;
    return 1;
}

static int configs, products;

/* All kernels against scalar for one matrix and activation mode. B = 1..33 and 70 when all_b, else a
 * few row counts (every row-tile tail). The scalar product of BMAX rows is the reference (a B-row
 * product must equal its first B rows: rows never interact); the BMAX-row scalar product is also
 * compared with the scalar products of fewer rows at B = 1, 3 and 33. */
static void check_config(int bits, int G, int N, int K, int extreme, int all_b) {
    ib_matrix m;
    if (make_matrix(&m, bits, G, N, K, extreme)) {
        CHECK(0, "matrix bits %d G %d [%d, %d]", bits, G, N, K);
        return;
    }
    const int ldy = N + 3, ng = bits ? K / G : 1;
    float *x = malloc(sizeof(float) * (size_t)BMAX * K);
    float *ref = malloc(sizeof(float) * (size_t)BMAX * ldy), *y = malloc(sizeof(float) * (size_t)BMAX * ldy);
    int8_t *xq = malloc((size_t)BMAX * K);
    float *d = malloc(sizeof(float) * (size_t)BMAX * ng), *ad = malloc(sizeof(float) * (size_t)BMAX * ng);
    make_x(x, K, extreme);
    if (bits) ib_quantize_act(x, BMAX, K, G, xq, d, ad);
    ib_act_buf q = { xq, d, ad };
    static const int b_few[] = {1, 2, 3, 4, 5, 6, 7, 8, 33};
    int b_list[40], nb = 0;
    if (all_b)
        for (int b = 1; b <= 33; b++) b_list[nb++] = b;
    else
        for (int i = 0; i < (int)(sizeof b_few / sizeof b_few[0]); i++) b_list[nb++] = b_few[i];
    if (all_b) b_list[nb++] = BMAX;

    for (int act = IB_ACT_F32; act <= IB_ACT_Q8; act++) {
        if (act == IB_ACT_Q8 && !bits) continue;
        const ib_act_buf *qp = act == IB_ACT_Q8 ? &q : NULL;
        char what[128];
        snprintf(what, sizeof what, "%s%s G%d N=%d K=%d %s-act", bits ? (bits == 4 ? "Q4" : "Q8") : "F32",
                 extreme ? " extreme" : "", G, N, K, act == IB_ACT_Q8 ? "q8" : "f32");
        configs++;
        int pad = product(&m, x, BMAX, qp, (ib_act)act, IB_ISA_SCALAR, NULL, ref, ldy);
        for (int bi = 0; bi < 3; bi++) {
            static const int bs[3] = {1, 3, 33};
            pad &= product(&m, x, bs[bi], qp, (ib_act)act, IB_ISA_SCALAR, NULL, y, ldy);
            CHECK(memcmp(y, ref, sizeof(float) * (size_t)bs[bi] * ldy) == 0, "%s scalar: B=%d != first rows of B=%d",
                  what, bs[bi], BMAX);
        }
        for (int ki = 0; ki < n_kerns; ki++) {
            if (kerns[ki].q8_only && act != IB_ACT_Q8) continue;
            kern_select(&kerns[ki]);
            int bad_b = 0, n_bad = 0;
            for (int i = 0; i < nb; i++) {
                const int B = b_list[i];
                pad &= product(&m, x, B, qp, (ib_act)act, kerns[ki].isa, NULL, y, ldy);
                products++;
                if (memcmp(y, ref, sizeof(float) * (size_t)B * ldy) != 0) {
                    if (!n_bad++) bad_b = B;
                    if (n_bad == 1)
                        for (size_t e = 0; e < (size_t)B * ldy; e++)
                            if (memcmp(&y[e], &ref[e], sizeof(float))) {
                                fprintf(stderr, "  %s %s B=%d: first difference at row %zu col %zu: %a != scalar %a\n",
                                        what, kerns[ki].name, B, e / (size_t)ldy, e % (size_t)ldy, y[e], ref[e]);
                                break;
                            }
                }
            }
            CHECK(n_bad == 0, "%s %s: %d of %d row counts differ from scalar (first B=%d)", what, kerns[ki].name,
                  n_bad, nb, bad_b);
        }
        CHECK(pad, "%s: a product wrote past column N of Y", what);
    }
    kern_select(&(kern){IB_ISA_AUTO, 0, 0, ""});
    free(x);
    free(ref);
    free(y);
    free(xq);
    free(d);
    free(ad);
    ib_matrix_free(&m);
}

/* ---------------------------------------------------------------- threads and faults */

/* A product split over a pool of 3 threads equals the single-thread scalar product, per kernel. */
static void check_threads(void) {
    const int N = 200, K = 256, B = 33, G = 64;
    ib_pool *pool;
    ib_error err;
    if (ib_pool_create(3, &pool, &err) != IB_OK) {
        CHECK(0, "pool: %s", err.msg);
        return;
    }
    ib_matrix m;
    if (make_matrix(&m, 8, G, N, K, 0)) {
        CHECK(0, "threads matrix");
        ib_pool_free(pool);
        return;
    }
    float *x = malloc(sizeof(float) * (size_t)BMAX * K), *ref = malloc(sizeof(float) * B * N),
          *y = malloc(sizeof(float) * B * N);
    int8_t *xq = malloc((size_t)BMAX * K);
    float *d = malloc(sizeof(float) * BMAX * (K / G)), *ad = malloc(sizeof(float) * BMAX * (K / G));
    make_x(x, K, 0);
    ib_quantize_act(x, B, K, G, xq, d, ad);
    ib_act_buf q = { xq, d, ad };
    for (int act = IB_ACT_F32; act <= IB_ACT_Q8; act++) {
        ib_matmul(&m, x, B, &q, (ib_act)act, IB_ISA_SCALAR, NULL, ref, N);
        for (int ki = 0; ki < n_kerns; ki++) {
            kern_select(&kerns[ki]);
            ib_matmul(&m, x, B, &q, (ib_act)act, kerns[ki].isa, pool, y, N);
            CHECK(memcmp(y, ref, sizeof(float) * B * N) == 0, "%s %s-act, 3 threads: differs from scalar",
                  kerns[ki].name, act == IB_ACT_Q8 ? "q8" : "f32");
        }
    }
    kern_select(&(kern){IB_ISA_AUTO, 0, 0, ""});
    free(x);
    free(ref);
    free(y);
    free(xq);
    free(d);
    free(ad);
    ib_matrix_free(&m);
    ib_pool_free(pool);
}

/* The faults reach every kernel: under gemv-gemm a 3-row product differs from its 1-row products (each
 * path), under isa-fma the vector F32 path differs from scalar. */
static void check_faults(void) {
    const int N = 40, K = 512, G = 32;
    ib_matrix mf, mq;
    if (make_matrix(&mf, 0, 0, N, K, 0) || make_matrix(&mq, 4, G, N, K, 0)) {
        CHECK(0, "fault matrices");
        return;
    }
    float *x = malloc(sizeof(float) * (size_t)BMAX * K), *y3 = malloc(sizeof(float) * 3 * N),
          *y1 = malloc(sizeof(float) * N), *ys = malloc(sizeof(float) * 3 * N);
    int8_t *xq = malloc((size_t)BMAX * K);
    float *d = malloc(sizeof(float) * BMAX * (K / G)), *ad = malloc(sizeof(float) * BMAX * (K / G));
    make_x(x, K, 0);
    ib_quantize_act(x, 3, K, G, xq, d, ad);
    ib_act_buf q = { xq, d, ad };
    for (int ki = 0; ki < n_kerns; ki++) {
        const kern *k = &kerns[ki];
        kern_select(k);
        for (int c = 0; c < 3; c++) {
            const ib_matrix *m = c == 0 ? &mf : &mq;
            const ib_act act = c == 2 ? IB_ACT_Q8 : IB_ACT_F32;
            int same[2];
            for (int f = 0; f < 2; f++) {
                ib_fault_set(f ? IB_FAULT_GEMV_GEMM : IB_FAULT_NONE);
                ib_matmul(m, x, 3, &q, act, k->isa, NULL, y3, N);
                same[f] = 1;
                for (int b = 0; b < 3; b++) {
                    ib_act_buf q1 = { xq + (size_t)b * K, d + (size_t)b * (K / G), ad + (size_t)b * (K / G) };
                    ib_matmul(m, x + (size_t)b * K, 1, &q1, act, k->isa, NULL, y1, N);
                    if (memcmp(y1, y3 + (size_t)b * N, sizeof(float) * N)) same[f] = 0;
                }
            }
            ib_fault_set(IB_FAULT_NONE);
            CHECK(same[0] && !same[1], "%s case %d: B=3 vs rows: %d without fault, %d under gemv-gemm (want 1, 0)",
                  k->name, c, same[0], same[1]);
        }
        ib_matmul(&mf, x, 3, NULL, IB_ACT_F32, IB_ISA_SCALAR, NULL, ys, N);
        ib_fault_set(IB_FAULT_ISA_FMA);
        ib_matmul(&mf, x, 3, NULL, IB_ACT_F32, k->isa, NULL, y3, N);
        ib_fault_set(IB_FAULT_NONE);
        CHECK(memcmp(ys, y3, sizeof(float) * 3 * N) != 0, "%s: isa-fma fault not seen", k->name);
    }
    kern_select(&(kern){IB_ISA_AUTO, 0, 0, ""});
    free(x);
    free(y3);
    free(y1);
    free(ys);
    free(xq);
    free(d);
    free(ad);
    ib_matrix_free(&mf);
    ib_matrix_free(&mq);
}

/* ---------------------------------------------------------------- main */

int main(void) {
    ib_isa i = IB_ISA_AUTO;
    CHECK(ib_isa_parse("neon", &i) == 0 && i == IB_ISA_NEON, "parse neon");
    CHECK(strcmp(ib_isa_name(IB_ISA_NEON), "neon") == 0, "name neon");
#if defined(__aarch64__)
    const int dot = ib_neon_has_dotprod();
    printf("test_matmul_neon: aarch64, Advanced SIMD %s, int8 dot product %s\n",
           ib_isa_supported(IB_ISA_NEON) ? "yes" : "NO", dot ? "yes" : "no");
    CHECK(ib_isa_supported(IB_ISA_NEON), "NEON supported on aarch64");
    CHECK(!ib_isa_supported(IB_ISA_AVX2) && !ib_isa_supported(IB_ISA_AVX512), "no x86 ISA on aarch64");
    CHECK_EQ_INT(ib_isa_best(), IB_ISA_NEON);
    CHECK(ib_matmul_kernel_for(IB_ISA_AUTO) == ib_matmul_panels_neon, "auto picks the NEON kernel");
    CHECK(ib_matmul_kernel_for(IB_ISA_NEON) == ib_matmul_panels_neon, "kernel table neon");
    CHECK(ib_matmul_kernel_for(IB_ISA_AVX2) == NULL, "no avx2 kernel on aarch64");
    const char *want = getenv("IB_EXPECT_DOTPROD");
    if (want && *want) CHECK(dot == atoi(want), "dot product detected %d, expected %s", dot, want);
    if (dot) kerns[n_kerns++] = (kern){IB_ISA_NEON, 0, 0, "neon(sdot)"};
    kerns[n_kerns++] = (kern){IB_ISA_NEON, 1, dot, "neon(plain)"};   /* F32 path: the same code as sdot's */
#else
    CHECK(!ib_isa_supported(IB_ISA_NEON), "no NEON off aarch64");
    CHECK(ib_matmul_kernel_for(IB_ISA_NEON) == NULL, "no NEON kernel off aarch64");
    if (ib_isa_supported(IB_ISA_AVX2)) kerns[n_kerns++] = (kern){IB_ISA_AVX2, 0, 0, "avx2"};
    if (ib_isa_supported(IB_ISA_AVX512)) kerns[n_kerns++] = (kern){IB_ISA_AVX512, 0, 0, "avx512"};
    printf("test_matmul_neon: not aarch64 (NEON is tested by tests/t_neon.sh under qemu); checking the %d vector "
           "ISA(s) of this CPU instead\n", n_kerns);
#endif

    /* F32 weights: K not a multiple of 4 or 8, one partial K block, several K blocks plus a tail */
    check_config(0, 0, 13, 7, 0, 1);
    check_config(0, 0, 40, 300, 0, 0);
    check_config(0, 0, 21, 129, 1, 0);
    /* quantized: per format and group, K = 1, 3 and 5 groups (all row counts at 3 groups) */
    for (int bits = 4; bits <= 8; bits += 4)
        for (int G = 32; G <= 128; G *= 2) {
            check_config(bits, G, 40, G, 0, 0);
            check_config(bits, G, 29, 3 * G, 0, 1);
            check_config(bits, G, 5, 5 * G, 0, 0);
            check_config(bits, G, 40, 2 * G, 1, 0);
        }
    /* scales and biases stored as bfloat16 and as float16 */
    for (sb_round = 1; sb_round <= 2; sb_round++)
        for (int bits = 4; bits <= 8; bits += 4) {
            check_config(bits, 64, 29, 192, 0, 1);
            check_config(bits, 32, 40, 64, 1, 0);
        }
    sb_round = 0;
    check_threads();
    check_faults();
    printf("test_matmul_neon: %d kernel(s):", n_kerns);
    for (int k = 0; k < n_kerns; k++) printf(" %s", kerns[k].name);
    printf("; %d configurations, %d products compared bitwise with scalar\n", configs, products);
    TEST_MAIN_END("test_matmul_neon");
}
