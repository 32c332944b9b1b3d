/*
 * matmul.c — building ib_matrix (repacking row-major float or MLX-quantized weights into the panel
 * layout of backends/cpu/pack.h), activation quantization, and the threaded product dispatch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/pack.h"
#include "core/bigalloc.h"
#include "core/error.h"
#include "core/half.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/quant_code.h"

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

void ib_matrix_free(ib_matrix *m) {
    if (!m) return;
    ib_big_free(m->packed);
    ib_big_free(m->sb);
    memset(m, 0, sizeof *m);
}

/* Panels per repack task: a task is this many panels of 16 rows (at K = 2816, 4 bits: 1.4 MB of
 * packed bytes), so a thread has enough to do between two claims. */
#define REPACK_PANELS_PER_TASK 64

/* Tasks that repack np panels. Only the speed depends on the split: every panel's bytes are written
 * by exactly one task, from its own rows alone. */
static int repack_tasks(int np, ib_pool *pool) {
    return ib_pool_threads(pool) > 1 ? (np + REPACK_PANELS_PER_TASK - 1) / REPACK_PANELS_PER_TASK : 1;
}

/* Which storages hold every one of the n values of each array exactly: bit 0 bfloat16, bit 1 float16. */
static unsigned sb_fits(const float *a, const float *b, size_t n) {
    int bf16 = 1, f16 = 1;
    for (size_t i = 0; i < 2 * n && (bf16 || f16); i++) {
        float v = i < n ? a[i] : b[i - n];
        uint32_t u = ib_f32_to_bits(v);
        if (u & 0xffffu) bf16 = 0;
        if (v != v || ib_f32_to_bits(ib_f16_to_f32(ib_f32_to_f16(v))) != u) f16 = 0;
    }
    return (unsigned)bf16 | (unsigned)f16 << 1;
}

/* sb_fits over the pool: each task finds which storages hold its share of both arrays, and the
 * storages that hold them all are those that hold every share (a logical AND: the same whatever the
 * split). */
typedef struct sbfits_job {
    const float *a, *b;
    size_t n, per_task;
    unsigned char *fits;   /* [tasks] */
} sbfits_job;

static void sbfits_task(void *ctx, int task, int thread) {
    const sbfits_job *j = ctx;
    size_t i0 = (size_t)task * j->per_task, i1 = i0 + j->per_task < j->n ? i0 + j->per_task : j->n;
    j->fits[task] = (unsigned char)sb_fits(j->a + i0, j->b + i0, i1 - i0);
}

/* The narrowest storage that holds every one of the n values of each array exactly (see ib_sbfmt). */
static ib_sbfmt choose_sb_fmt(const float *a, const float *b, size_t n, ib_pool *pool) {
    const size_t per = (size_t)1 << 18;
    const size_t tasks = (n + per - 1) / per;
    unsigned fits;
    unsigned char *share = tasks > 1 && tasks <= 0x7fffffff && ib_pool_threads(pool) > 1 ? malloc(tasks) : NULL;
    if (share) {
        sbfits_job j = {a, b, n, per, share};
        ib_pool_run(pool, (int)tasks, sbfits_task, &j);
        fits = 3;
        for (size_t t = 0; t < tasks; t++) fits &= share[t];
        free(share);
    } else {
        fits = sb_fits(a, b, n);
    }
    return fits & 1 ? IB_SB_BF16 : fits & 2 ? IB_SB_F16 : IB_SB_F32;
}

/* Store v at element i of a scale/bias array of format fmt. */
static void put_sb(void *sb, ib_sbfmt fmt, size_t i, float v) {
    if (fmt == IB_SB_F32) {
        ((float *)sb)[i] = v;
    } else {
        ((uint16_t *)sb)[i] = fmt == IB_SB_BF16 ? (uint16_t)(ib_f32_to_bits(v) >> 16) : ib_f32_to_f16(v);
    }
}

/* A repack: the source rows and the matrix being filled. */
typedef struct pack_job {
    ib_matrix *m;
    const float *w;                        /* float32 source [N][K] */
    const unsigned char *wq;               /* MLX source: [N][K*bits/32] little-endian uint32 words
                                            * (any alignment), scales and biases [N][K/group] */
    const float *scales, *biases;
    int N, K, bits;
    size_t pbytes;                         /* bytes of one packed panel */
    int per_task;                          /* panels per task */
} pack_job;

/* Panels [task*per_task, ...) of a float32 matrix: [K][16] each, rows past N zero. */
static void pack_f32_task(void *ctx, int task, int thread) {
    const pack_job *j = ctx;
    const int np = j->m->n_panels, K = j->K, N = j->N;
    const int p0 = task * j->per_task, p1 = p0 + j->per_task < np ? p0 + j->per_task : np;
    float *pk = j->m->packed;
    for (int p = p0; p < p1; p++) {
        float *panel = pk + (size_t)p * K * IB_PANEL;
        if ((p + 1) * IB_PANEL > N) memset(panel, 0, j->pbytes);   /* the last panel's padding rows */
        for (int n = p * IB_PANEL; n < N && n < (p + 1) * IB_PANEL; n++) {
            const float *row = j->w + (size_t)n * K;
            float *dst = panel + (n % IB_PANEL);
            for (int k = 0; k < K; k++) dst[(size_t)k * IB_PANEL] = row[k];
        }
    }
}

/* Nibble t of x (t < 4) to the low nibble of byte t. */
static inline uint32_t spread_nibbles(uint32_t x) {
    x = (x | x << 8) & 0x00FF00FFu;
    return (x | x << 4) & 0x0F0F0F0Fu;
}

/* Panels [task*per_task, ...) of an MLX-quantized matrix: the codes, the scales and biases; rows past
 * N zero. Every byte of each panel is written once, a 64-byte line at a time: line w of a panel holds
 * word w of each of its 16 rows, 4 bytes a row (pack.h). A 4-bit word holds codes 8w..8w+7 (code
 * 8w+t in nibble t); its 4 bytes hold codes 8w+t (low nibble) and 8w+t+4 (high nibble) in byte t. An
 * 8-bit word holds codes 4w..4w+3, one a byte, which are its 4 bytes as they are. */
static void pack_mlx_task(void *ctx, int task, int thread) {
    const pack_job *j = ctx;
    const ib_matrix *m = j->m;
    const int np = m->n_panels, K = j->K, N = j->N, bits = j->bits, ng = K / m->group;
    const int p0 = task * j->per_task, p1 = p0 + j->per_task < np ? p0 + j->per_task : np;
    const size_t wpr = (size_t)K * (size_t)bits / 32;   /* uint32 words per MLX row */
    for (int p = p0; p < p1; p++) {
        const int rows = N - p * IB_PANEL < IB_PANEL ? N - p * IB_PANEL : IB_PANEL;
        const unsigned char *src = j->wq + (size_t)p * IB_PANEL * wpr * 4;   /* the panel's first row */
        uint8_t *line = (uint8_t *)m->packed + (size_t)p * j->pbytes;
        for (size_t w = 0; w < wpr; w++, line += 64) {
            for (int r = 0; r < IB_PANEL; r++) {
                uint32_t v = 0;
                if (r < rows) {
                    const unsigned char *b = src + ((size_t)r * wpr + w) * 4;   /* little-endian word */
                    uint32_t word = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
                    v = bits == 4 ? spread_nibbles(word & 0xFFFFu) | spread_nibbles(word >> 16) << 4 : word;
                }
                line[r * 4 + 0] = (uint8_t)v;
                line[r * 4 + 1] = (uint8_t)(v >> 8);
                line[r * 4 + 2] = (uint8_t)(v >> 16);
                line[r * 4 + 3] = (uint8_t)(v >> 24);
            }
        }
        for (int g = 0; g < ng; g++) {
            const size_t e = ((size_t)p * ng + (size_t)g) * 2 * IB_PANEL;
            for (int r = 0; r < IB_PANEL; r++) {
                const size_t n = (size_t)p * IB_PANEL + (size_t)r;
                put_sb(m->sb, m->sb_fmt, e + r, r < rows ? j->scales[n * ng + g] : 0.0f);
                put_sb(m->sb, m->sb_fmt, e + IB_PANEL + r, r < rows ? j->biases[n * ng + g] : 0.0f);
            }
        }
    }
}

ib_status ib_matrix_from_f32(ib_matrix *m, const float *w, int N, int K, ib_error *err) {
    return ib_matrix_from_f32_pool(m, w, N, K, NULL, err);
}

ib_status ib_matrix_from_f32_pool(ib_matrix *m, const float *w, int N, int K, ib_pool *pool, ib_error *err) {
    memset(m, 0, sizeof *m);
    if (!w) return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: weights: NULL data");
    if (N < 1 || K < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: shape: [%d, %d] is not positive", N, K);
    int np = (N + IB_PANEL - 1) / IB_PANEL;
    size_t bytes = (size_t)np * (size_t)K * IB_PANEL * sizeof(float);
    float *pk = ib_big_alloc(bytes);   /* [np][K][16]; huge pages for large matrices (bigalloc.h) */
    if (!pk) return ib_fail(err, IB_ERR_NOMEM, "matrix: [%d, %d] float32: out of memory (%zu bytes)", N, K, bytes);
    m->fmt = IB_WF32;
    m->rows = N;
    m->cols = K;
    m->group = 0;
    m->n_panels = np;
    m->packed = pk;
    m->bytes = bytes;
    const int tasks = repack_tasks(np, pool);
    pack_job j = {.m = m, .w = w, .N = N, .K = K, .pbytes = (size_t)K * IB_PANEL * sizeof(float),
                  .per_task = (np + tasks - 1) / tasks};
    ib_pool_run(pool, tasks, pack_f32_task, &j);
    return IB_OK;
}

ib_status ib_matrix_from_mlx(ib_matrix *m, const uint32_t *wq, const float *scales, const float *biases,
                             int N, int K, int bits, int group, ib_error *err) {
    return ib_matrix_from_mlx_pool(m, wq, scales, biases, N, K, bits, group, NULL, err);
}

ib_status ib_matrix_from_mlx_pool(ib_matrix *m, const void *wq, const float *scales, const float *biases,
                                  int N, int K, int bits, int group, ib_pool *pool, ib_error *err) {
    memset(m, 0, sizeof *m);
    if (!wq || !scales || !biases) return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: weights/scales/biases: NULL data");
    if (N < 1 || K < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: shape: [%d, %d] is not positive", N, K);
    if (bits != 4 && bits != 8) return ib_fail(err, IB_ERR_UNSUPPORTED, "matrix: bits: %d is not 4 or 8", bits);
    if (group != 32 && group != 64 && group != 128)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "matrix: group_size: %d is not 32, 64 or 128", group);
    if (K % group != 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "matrix: shape: K = %d is not a multiple of group_size %d", K, group);
    const int np = (N + IB_PANEL - 1) / IB_PANEL, ng = K / group;
    const size_t pbytes = (size_t)K * (bits == 4 ? 8 : 16);
    const ib_sbfmt sbf = choose_sb_fmt(scales, biases, (size_t)N * (size_t)ng, pool);
    const size_t sbytes = (size_t)np * (size_t)ng * 2 * IB_PANEL * (sbf == IB_SB_F32 ? 4 : 2);
    uint8_t *pk = ib_big_alloc((size_t)np * pbytes);   /* huge pages for large matrices (bigalloc.h) */
    void *sb = ib_big_alloc(sbytes);   /* [np][ng][2][16] */
    if (!pk || !sb) {
        ib_big_free(pk);
        ib_big_free(sb);
        return ib_fail(err, IB_ERR_NOMEM, "matrix: [%d, %d] %d-bit: out of memory", N, K, bits);
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
    const int tasks = repack_tasks(np, pool);
    pack_job j = {.m = m, .wq = wq, .scales = scales, .biases = biases, .N = N, .K = K, .bits = bits,
                  .pbytes = pbytes, .per_task = (np + tasks - 1) / tasks};
    ib_pool_run(pool, tasks, pack_mlx_task, &j);
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
    const int G = m->group;
    for (int k0 = 0; k0 < K; k0 += G) {   /* the group's scale and bias read once for its codes */
        const uint8_t *sb = ib_pk_sb(m, p, k0 / G);
        const float s = ib_pk_sb_get(m, sb, j), b = ib_pk_sb_get(m, sb, IB_PANEL + j);
        const int k1 = k0 + G < K ? k0 + G : K;
        for (int k = k0; k < k1; k++) {
            int q;
            if (m->fmt == IB_WQ4) {
                uint8_t byte = P[(size_t)(k / 8) * 64 + (size_t)j * 4 + (k % 4)];
                q = (k % 8) < 4 ? (byte & 15) : (byte >> 4);
            } else {
                q = P[(size_t)(k / 4) * 64 + (size_t)j * 4 + (k % 4)];
            }
            out[k] = s * (float)q + b;
        }
    }
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
                    for (int j = 0; j < 16; j++) t[j] = ib_quant_code(xs[k + j], inv);
                else
                    for (int j = 0; j < n; j++) t[j] = ib_quant_code(xs[k + j], inv);
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
    int per_task;    /* panels per task */
    int n_rb;        /* row blocks per panel range (1: every task takes all B rows) */
    int row_block;   /* rows per row block (the last one takes the rest) */
    int n_parts;
    mm_part part[IB_MATMUL_MAX_MANY];
} mm_job;

/* Products of at least this many rows split their rows as well as their panels when the panel ranges
 * alone would give fewer than ROW_SPLIT_TASKS_PER_THREAD tasks a thread (a prefill's o and down
 * products over 16 threads: one task each, so the slowest thread sets the product's time); a row block
 * is a multiple of ROW_SPLIT_ROWS rows. Only the speed depends on the split: each output row's
 * arithmetic is its own, whatever rows share its task. */
#define ROW_SPLIT_MIN_ROWS 256
#define ROW_SPLIT_ROWS 64
#define ROW_SPLIT_TASKS_PER_THREAD 4

/* Pool task: a contiguous range of panels of one product, for one block of its rows. Consecutive tasks
 * take the same panels for consecutive row blocks, so a thread's weights stay in its cache. */
static void mm_task(void *ctx, int task, int thread) {
    const mm_job *j = ctx;
    int i = j->n_parts - 1;
    while (i > 0 && j->part[i].task0 > task) i--;
    const mm_part *pt = &j->part[i];
    const int local = task - pt->task0, rb = local % j->n_rb;
    int p0 = local / j->n_rb * j->per_task, p1 = p0 + j->per_task;
    if (p1 > pt->m->n_panels) p1 = pt->m->n_panels;
    /* rows [r0, r0 + nr): their floats, int8 codes [nr][K] and groups' d, ad [nr][K/G] (r0 = 0, nr = B unsplit) */
    const int r0 = rb * j->row_block, nr = rb == j->n_rb - 1 ? j->B - r0 : j->row_block;
    const size_t K = (size_t)pt->m->cols, ng = pt->m->group > 0 ? K / (size_t)pt->m->group : 0;
    ib_act_buf qv = {NULL, NULL, NULL};
    if (j->q) {
        qv.xq = j->q->xq ? j->q->xq + (size_t)r0 * K : NULL;
        qv.d = j->q->d ? j->q->d + (size_t)r0 * ng : NULL;
        qv.ad = j->q->ad ? j->q->ad + (size_t)r0 * ng : NULL;
    }
    j->kern(pt->m, j->X ? j->X + (size_t)r0 * K : NULL, nr, j->q ? &qv : NULL, pt->act, p0, p1,
            pt->Y + (size_t)r0 * pt->ldy, pt->ldy);
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
    const int threads = ib_pool_threads(pool), per = panels_per_task(B, panels, threads);
    int ranges = 0;   /* panel ranges over all the products */
    for (int i = 0; i < n; i++)
        if (ms[i]->n_panels > 0) ranges += (ms[i]->n_panels + per - 1) / per;
    job.per_task = per;
    job.n_rb = 1;
    job.row_block = B;
    if (B >= ROW_SPLIT_MIN_ROWS && threads > 1 && ranges > 0 && ranges < ROW_SPLIT_TASKS_PER_THREAD * threads) {
        int n_rb = (ROW_SPLIT_TASKS_PER_THREAD * threads + ranges - 1) / ranges;
        if (n_rb > B / ROW_SPLIT_ROWS) n_rb = B / ROW_SPLIT_ROWS;
        const int rows = (B + n_rb - 1) / n_rb;
        job.row_block = (rows + ROW_SPLIT_ROWS - 1) / ROW_SPLIT_ROWS * ROW_SPLIT_ROWS;
        job.n_rb = (B + job.row_block - 1) / job.row_block;
    }
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
        n_tasks += (ms[i]->n_panels + per - 1) / per * job.n_rb;
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
