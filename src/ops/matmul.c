/*
 * matmul.c — building ib_matrix (repacking row-major float or MLX-quantized weights into the panel
 * layout of backends/cpu/pack.h), activation quantization, and the threaded product dispatch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/pack.h"
#include "core/error.h"
#include "core/half.h"
#include "ops/matmul.h"
#include "ops/ops.h"

/* Panels per pool task. Each thread walks its own contiguous share of the tasks (core/pool.h), so
 * its weight stream stays sequential across tasks whatever their size; small tasks let the threads
 * end a product together (1-row decode steps: 16 panels per task ran ~5% faster than 64, which the
 * old one-counter pool needed to keep each thread's stream sequential). Many rows make each panel long
 * enough to balance finer. */
#define PANELS_PER_TASK_FEW_ROWS 16
#define PANELS_PER_TASK 4
#define FEW_ROWS 4

/* Panels per task for B rows over np panels and `threads` threads. */
static int panels_per_task(int B, int np, int threads) {
    int per = np / threads, cap = B <= FEW_ROWS ? PANELS_PER_TASK_FEW_ROWS : PANELS_PER_TASK;
    if (per > cap) per = cap;
    return per < 1 ? 1 : per;
}

/* 64-byte aligned, zeroed allocation of n bytes (n rounded up to 64); NULL on failure. */
static void *alloc64(size_t n) {
    size_t r = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, r ? r : 64);
    if (p) memset(p, 0, r ? r : 64);
    return p;
}

void ib_matrix_free(ib_matrix *m) {
    if (!m) return;
    free(m->packed);
    free(m->sb);
    memset(m, 0, sizeof *m);
}

/* The narrowest storage that holds every one of the n values of each array exactly (see ib_sbfmt). */
static ib_sbfmt choose_sb_fmt(const float *a, const float *b, size_t n) {
    int bf16 = 1, f16 = 1;
    for (size_t i = 0; i < 2 * n && (bf16 || f16); i++) {
        float v = i < n ? a[i] : b[i - n];
        uint32_t u = ib_f32_to_bits(v);
        if (u & 0xffffu) bf16 = 0;
        if (v != v || ib_f32_to_bits(ib_f16_to_f32(ib_f32_to_f16(v))) != u) f16 = 0;
    }
    return bf16 ? IB_SB_BF16 : f16 ? IB_SB_F16 : IB_SB_F32;
}

/* Store v at element i of a scale/bias array of format fmt. */
static void put_sb(void *sb, ib_sbfmt fmt, size_t i, float v) {
    if (fmt == IB_SB_F32) {
        ((float *)sb)[i] = v;
    } else {
        ((uint16_t *)sb)[i] = fmt == IB_SB_BF16 ? (uint16_t)(ib_f32_to_bits(v) >> 16) : ib_f32_to_f16(v);
    }
}

ib_status ib_matrix_from_f32(ib_matrix *m, const float *w, int N, int K, ib_error *err) {
    memset(m, 0, sizeof *m);
    if (!w) return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: weights: NULL data");
    if (N < 1 || K < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: shape: [%d, %d] is not positive", N, K);
    int np = (N + IB_PANEL - 1) / IB_PANEL;
    size_t bytes = (size_t)np * (size_t)K * IB_PANEL * sizeof(float);
    float *pk = alloc64(bytes);   /* [np][K][16] */
    if (!pk) return ib_fail(err, IB_ERR_NOMEM, "matrix: [%d, %d] float32: out of memory (%zu bytes)", N, K, bytes);
    for (int n = 0; n < N; n++) {
        const float *row = w + (size_t)n * K;
        float *dst = pk + (size_t)(n / IB_PANEL) * K * IB_PANEL + (n % IB_PANEL);
        for (int k = 0; k < K; k++) dst[(size_t)k * IB_PANEL] = row[k];
    }
    m->fmt = IB_WF32;
    m->rows = N;
    m->cols = K;
    m->group = 0;
    m->n_panels = np;
    m->packed = pk;
    m->bytes = bytes;
    return IB_OK;
}

ib_status ib_matrix_from_mlx(ib_matrix *m, const uint32_t *wq, const float *scales, const float *biases,
                             int N, int K, int bits, int group, ib_error *err) {
    memset(m, 0, sizeof *m);
    if (!wq || !scales || !biases) return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: weights/scales/biases: NULL data");
    if (N < 1 || K < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: shape: [%d, %d] is not positive", N, K);
    if (bits != 4 && bits != 8) return ib_fail(err, IB_ERR_UNSUPPORTED, "matrix: bits: %d is not 4 or 8", bits);
    if (group != 32 && group != 64 && group != 128)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "matrix: group_size: %d is not 32, 64 or 128", group);
    if (K % group != 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: shape: K = %d is not a multiple of group_size %d", K, group);
    const int np = (N + IB_PANEL - 1) / IB_PANEL, ng = K / group;
    const size_t wpr = (size_t)K * (size_t)bits / 32;   /* uint32 words per MLX row */
    const size_t pbytes = (size_t)K * (bits == 4 ? 8 : 16);
    const ib_sbfmt sbf = choose_sb_fmt(scales, biases, (size_t)N * (size_t)ng);
    const size_t sbytes = (size_t)np * (size_t)ng * 2 * IB_PANEL * (sbf == IB_SB_F32 ? 4 : 2);
    uint8_t *pk = alloc64((size_t)np * pbytes);
    void *sb = alloc64(sbytes);   /* [np][ng][2][16] */
    if (!pk || !sb) {
        free(pk);
        free(sb);
        return ib_fail(err, IB_ERR_NOMEM, "matrix: [%d, %d] %d-bit: out of memory", N, K, bits);
    }
    const uint32_t mask = bits == 4 ? 15u : 255u;
    const int per_word = 32 / bits;
    for (int n = 0; n < N; n++) {
        const uint32_t *row = wq + (size_t)n * wpr;
        uint8_t *panel = pk + (size_t)(n / IB_PANEL) * pbytes;
        const int j = n % IB_PANEL;
        for (int k = 0; k < K; k++) {
            uint32_t q = (row[k / per_word] >> ((k % per_word) * bits)) & mask;
            if (bits == 4) {
                uint8_t *byte = panel + (size_t)(k / 8) * 64 + (size_t)j * 4 + (k % 4);
                *byte |= (uint8_t)((k % 8) < 4 ? q : q << 4);
            } else {
                panel[(size_t)(k / 4) * 64 + (size_t)j * 4 + (k % 4)] = (uint8_t)q;
            }
        }
        for (int g = 0; g < ng; g++) {
            size_t e = ((size_t)(n / IB_PANEL) * ng + (size_t)g) * 2 * IB_PANEL + (size_t)j;
            put_sb(sb, sbf, e, scales[(size_t)n * ng + g]);
            put_sb(sb, sbf, e + IB_PANEL, biases[(size_t)n * ng + g]);
        }
    }
    m->fmt = bits == 4 ? IB_WQ4 : IB_WQ8;
    m->rows = N;
    m->cols = K;
    m->group = group;
    m->n_panels = np;
    m->packed = pk;
    m->sb_fmt = sbf;
    m->sb = sb;
    m->bytes = (size_t)np * pbytes + sbytes;
    return IB_OK;
}

/* Row n of m as floats: the stored float, or s*(float)q + b (mul, then add) for quantized. */
void ib_matrix_row_f32(const ib_matrix *m, int n, float *out) {
    const int K = m->cols, p = n / IB_PANEL, j = n % IB_PANEL;
    if (m->fmt == IB_WF32) {
        const float *src = (const float *)ib_pk_panel(m, p) + j;
        for (int k = 0; k < K; k++) out[k] = src[(size_t)k * IB_PANEL];
        return;
    }
    const uint8_t *P = ib_pk_panel(m, p);
    for (int k = 0; k < K; k++) {
        int q;
        if (m->fmt == IB_WQ4) {
            uint8_t byte = P[(size_t)(k / 8) * 64 + (size_t)j * 4 + (k % 4)];
            q = (k % 8) < 4 ? (byte & 15) : (byte >> 4);
        } else {
            q = P[(size_t)(k / 4) * 64 + (size_t)j * 4 + (k % 4)];
        }
        const uint8_t *sb = ib_pk_sb(m, p, k / m->group);
        out[k] = ib_pk_sb_get(m, sb, j) * (float)q + ib_pk_sb_get(m, sb, IB_PANEL + j);
    }
}

/* clamp(rne(x * inv), -127, 127), and 0 for NaN: rne as (v + 1.5*2^23) - 1.5*2^23 (see below). */
static inline int32_t quant_code(float x, float inv) {
    const float rne = 12582912.0f; /* 1.5 * 2^23 */
    float v = (x * inv + rne) - rne;
    v = v > 127.0f ? 127.0f : v;
    v = v < -127.0f ? -127.0f : v;
    v = v == v ? v : 0.0f;
    return (int32_t)v;
}

/* Per row and group: amax, d = amax/127, xq = clamp(rne(x * (127/amax)), -127, 127), ad = d*sum(xq).
 * A NaN input quantizes to 0 (it does not count in amax); an all-zero group gives d = ad = 0.
 *
 * Written lane-parallel so that the vector clones compute it with the same bits: amax over 16 lanes
 * (a maximum is the same in any order once NaNs are skipped), and round-to-nearest-even as
 * (v + 1.5*2^23) - 1.5*2^23, which is exact for |v| < 2^22 and passes infinities and NaNs through,
 * so it equals rintf wherever the clamps that follow can tell. */
IB_VECTOR_CLONES void ib_quantize_act(const float *x, int B, int K, int G, int8_t *xq, float *d, float *ad) {
    const int ng = K / G;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < ng; g++) {
            const float *xs = x + (size_t)b * K + (size_t)g * G;
            int8_t *qs = xq + (size_t)b * K + (size_t)g * G;
            float lane[16] = {0};
            int k = 0;
            for (; k + 16 <= G; k += 16)
                for (int j = 0; j < 16; j++) {
                    float a = fabsf(xs[k + j]);
                    lane[j] = a > lane[j] ? a : lane[j];
                }
            for (int j = 0; k + j < G; j++) {
                float a = fabsf(xs[k + j]);
                lane[j] = a > lane[j] ? a : lane[j];
            }
            for (int w = 8; w >= 1; w >>= 1)
                for (int j = 0; j < w; j++) lane[j] = lane[j + w] > lane[j] ? lane[j + w] : lane[j];
            const float amax = lane[0];
            size_t di = (size_t)b * ng + g;
            if (amax == 0.0f) {
                memset(qs, 0, (size_t)G);
                d[di] = 0.0f;
                ad[di] = 0.0f;
                continue;
            }
            const float dd = amax / 127.0f, inv = 127.0f / amax;
            /* 16 codes at a time: converted into t, then stored and summed (GCC vectorizes neither
             * loop when they are one, and summing the int8 stores just made stalls on them) */
            int32_t sum = 0, t[16];
            for (k = 0; k < G; k += 16) {
                const int n = G - k < 16 ? G - k : 16;
                if (n == 16)
                    for (int j = 0; j < 16; j++) t[j] = quant_code(xs[k + j], inv);
                else
                    for (int j = 0; j < n; j++) t[j] = quant_code(xs[k + j], inv);
                for (int j = 0; j < n; j++) qs[k + j] = (int8_t)t[j], sum += t[j];
            }
            d[di] = dd;
            ad[di] = dd * (float)sum;
        }
}

/* One product of a (possibly fused) dispatch: its matrix, mode, kernel, output and first task. */
typedef struct mm_part {
    const ib_matrix *m;
    ib_act act;
    float *Y;
    int ldy;
    int task0;   /* first task of this product */
} mm_part;

typedef struct mm_job {
    const float *X;
    int B;
    const ib_act_buf *q;
    ib_matmul_kernel kern;
    int per_task;   /* panels per task */
    int n_parts;
    mm_part part[IB_MATMUL_MAX_MANY];
} mm_job;

/* Pool task: a contiguous range of panels of one product. */
static void mm_task(void *ctx, int task, int thread) {
    const mm_job *j = ctx;
    int i = j->n_parts - 1;
    while (i > 0 && j->part[i].task0 > task) i--;
    const mm_part *pt = &j->part[i];
    int p0 = (task - pt->task0) * j->per_task, p1 = p0 + j->per_task;
    if (p1 > pt->m->n_panels) p1 = pt->m->n_panels;
    j->kern(pt->m, j->X, j->B, j->q, pt->act, p0, p1, pt->Y, pt->ldy);
}

/* Ys[i] (row stride ldys[i]) = X · W_i^T for n <= IB_MATMUL_MAX_MANY products sharing X, split over
 * the pool by panel ranges in one run (each panel's arithmetic is the same whichever task or thread
 * computes it, and whichever products share the run). A Q8 request on float weights, or without
 * buffers, runs the F32 path. */
static void run_products(int n, const ib_matrix *const *ms, const float *X, int B, const ib_act_buf *q, ib_act act,
                         ib_matmul_kernel kern, ib_pool *pool, float *const *Ys, const int *ldys) {
    mm_job job;
    job.X = X;
    job.B = B;
    job.q = q;
    job.kern = kern;
    int panels = 0;
    double macs = 0;
    for (int i = 0; i < n; i++) {
        panels += ms[i]->n_panels;
        macs += (double)B * ms[i]->rows * ms[i]->cols;
    }
    const int per = panels_per_task(B, panels, ib_pool_threads(pool));
    job.per_task = per;
    job.n_parts = 0;
    int n_tasks = 0;
    for (int i = 0; i < n; i++) {
        if (ms[i]->n_panels <= 0) continue;
        mm_part *pt = &job.part[job.n_parts++];
        pt->m = ms[i];
        pt->act = ib_pk_use_q8(ms[i], q, act) ? act : IB_ACT_F32;
        pt->Y = Ys[i];
        pt->ldy = ldys[i];
        pt->task0 = n_tasks;
        n_tasks += (ms[i]->n_panels + per - 1) / per;
    }
    if (job.n_parts == 0) return;
    /* a product too small to repay waking the workers runs on the caller alone */
    if (macs < IB_MIN_PARALLEL_MACS) pool = NULL;
    ib_pool_run(pool, n_tasks, mm_task, &job);
}

void ib_matmul_many_k(int n, const ib_matrix *const *ms, const float *X, int B, const ib_act_buf *q, ib_act act,
                      ib_matmul_kernel kern, ib_pool *pool, float *const *Ys) {
    for (int i0 = 0; i0 < n && B > 0; i0 += IB_MATMUL_MAX_MANY) {
        int k = n - i0 < IB_MATMUL_MAX_MANY ? n - i0 : IB_MATMUL_MAX_MANY, ldys[IB_MATMUL_MAX_MANY];
        for (int i = 0; i < k; i++) ldys[i] = ms[i0 + i]->rows;
        run_products(k, ms + i0, X, B, q, act, kern, pool, Ys + i0, ldys);
    }
}

/* The kernel of isa for the isa-taking entry points (tests, diagnostics): AUTO resolves to the best
 * this CPU runs; an ISA of another architecture than this build's gets the scalar kernel. */
static ib_matmul_kernel kernel_of(ib_isa isa) {
    ib_matmul_kernel k = ib_matmul_kernel_for(isa);
    return k ? k : ib_matmul_panels_scalar;
}

void ib_matmul_many(int n, const ib_matrix *const *ms, const float *X, int B, const ib_act_buf *q, ib_act act,
                    ib_isa isa, ib_pool *pool, float *const *Ys) {
    ib_matmul_many_k(n, ms, X, B, q, act, kernel_of(isa), pool, Ys);
}

/* Y = X · W^T split over the pool by panel ranges (one product, any row stride ldy). */
void ib_matmul(const ib_matrix *m, const float *X, int B, const ib_act_buf *q, ib_act act, ib_isa isa,
               ib_pool *pool, float *Y, int ldy) {
    if (B <= 0) return;
    run_products(1, &m, X, B, q, act, kernel_of(isa), pool, &Y, &ldy);
}
