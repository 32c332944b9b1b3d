/*
 * mkmodel.c — synthetic Qwen3 model directories with deterministic random weights (see mkmodel.h).
 *
 * Layout written (mlx-lm key names):
 *   model.embed_tokens.weight [V][D]             (+ .scales/.biases when quantized)
 *   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, model.layers.{i}.mlp.{gate,up,down}_proj.weight
 *                                                (+ .scales/.biases when quantized)
 *   model.layers.{i}.self_attn.{q,k}_norm.weight [head_dim]
 *   model.layers.{i}.{input,post_attention}_layernorm.weight [D]
 *   model.norm.weight [D], lm_head.weight [V][D] only when untied (+ .scales/.biases)
 * Dtypes: quantized weights U32 [N][K*bits/32] with BF16 scales/biases [N][K/group]; norms BF16 for
 * bits 4/8/16 and F32 for bits 32; float weights BF16 (16) or F32 (32).
 *
 * Memory stays bounded: the safetensors file is streamed. Every tensor's name, dtype and shape are
 * known up front, so the header (sorted by name, "__metadata__": {"format": "mlx"}, padded with
 * spaces so the data region starts 8-byte aligned) is written first, and then the tensors are cut
 * into tasks of about 1 MB of output each (a run of rows of one matrix), which a pool of threads
 * (mkmodel's threads) generates, a block of rows at a time, and writes at their offsets with pwrite.
 * The generator is counter-based (every value is a function of the seed, the matrix's generator index
 * and the element's index alone) and quantization is per row, so the bytes written do not depend on
 * the thread count, the cut or which thread runs which task. Tensors are stored contiguously in name
 * order; every size is a multiple of 8 bytes, so every tensor is 8-byte aligned. Peak memory: about
 * 1.2 MB of buffers per thread plus the header, whatever the preset.
 *
 * Weights before storage: for bits 4/8/16 each generated float is first rounded to bfloat16 (as if
 * the source checkpoint were bf16), so the quantized models are quantizations of exactly the weights
 * of the 16-bit model with the same seed; bits 32 keeps the generated floats.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/error.h"
#include "core/half.h"
#include "core/pool.h"
#include "model/config.h"
#include "model/mkmodel.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

/* ---------------------------------------------------------------- quantizer */

/* MLX affine quantization of W[N][K] (contract in mkmodel.h). bits divides 32 and group is a
 * multiple of 32/bits. Codes are packed 32/bits per uint32, element j of a word at bits
 * [j*bits, (j+1)*bits). */
void ib_mlx_quantize(const float *w, int N, int K, int bits, int group, int round_bf16,
                     uint32_t *wq, float *scales, float *biases) {
    const int n_bins = (1 << bits) - 1;
    const int per_word = 32 / bits;
    const int words_per_row = K / per_word;
    const int groups = K / group;
    for (int n = 0; n < N; n++) {
        const float *row = w + (size_t)n * K;                         /* [K] */
        uint32_t *qrow = wq + (size_t)n * words_per_row;              /* [K*bits/32] */
        for (int g = 0; g < groups; g++) {
            const float *x = row + (size_t)g * group;                  /* [group] */
            float mx = x[0], mn = x[0];
            for (int j = 1; j < group; j++) {
                if (x[j] > mx) mx = x[j];
                if (x[j] < mn) mn = x[j];
            }
            float scale = (mx - mn) / (float)n_bins;
            if (!(scale > 1e-7f)) scale = 1e-7f;
            float edge = fabsf(mn) > fabsf(mx) ? mn : mx;
            if (!(fabsf(mn) > fabsf(mx))) scale = -scale;
            float q0 = rintf(edge / scale);
            float bias = 0.0f;
            if (q0 != 0.0f) {
                scale = edge / q0;
                bias = edge;
            }
            if (round_bf16) {
                scale = ib_bf16_to_f32(ib_f32_to_bf16(scale));
                bias = ib_bf16_to_f32(ib_f32_to_bf16(bias));
            }
            scales[(size_t)n * groups + g] = scale;
            biases[(size_t)n * groups + g] = bias;
            /* group is a multiple of 32, so a group fills whole words */
            uint32_t *qw = qrow + (size_t)g * group / per_word;
            for (int j0 = 0; j0 < group; j0 += per_word) {
                uint32_t word = 0;
                for (int j = 0; j < per_word; j++) {
                    float q = rintf((x[j0 + j] - bias) / scale);
                    if (!(q >= 0.0f)) q = 0.0f;                /* NaN -> 0 too */
                    if (q > (float)n_bins) q = (float)n_bins;
                    word |= (uint32_t)q << (j * bits);
                }
                qw[j0 / per_word] = word;
            }
        }
    }
}

/* ---------------------------------------------------------------- generator */

/* SplitMix64's finalizer: a bijective 64-bit mix. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#define GOLDEN 0x9E3779B97F4A7C15ull

/* Key of tensor `index` under `seed`. */
static uint64_t tensor_key(uint64_t seed, int index) {
    return mix64(mix64(seed ^ 0x5851F42D4C957F2Dull) + (uint64_t)(index + 1) * GOLDEN);
}

/* Element e of the tensor keyed `key`: uniform on (-1, 1), symmetric, an odd multiple of 2^-24
 * (exact in float32). */
static inline float uniform_pm1(uint64_t key, uint64_t e) {
    uint64_t x = mix64(key + (e + 1) * GOLDEN);
    int32_t v = (int32_t)(2 * (x >> 40)) + 1 - (1 << 24);         /* odd, in [-(2^24-1), 2^24-1] */
    return (float)v * (1.0f / 16777216.0f);
}

/* ---------------------------------------------------------------- model layout */

typedef struct preset {
    const char *name;
    int vocab, hidden, layers, heads, kv_heads, head_dim, ffn, ctx;
    /* Gemma 4 presets only: full layers' head dim and KV heads (attention_k_eq_v), sliding window;
     * every full_every-th layer is full, the others sliding (the last is full) */
    int gemma, global_head_dim, global_kv_heads, window;
    /* Gemma 4 MoE presets only: experts, top-k (mkmodel's top_k may override), each expert's F */
    int experts, top_k, moe_ffn;
    int untied;   /* 1: the model's own lm_head whatever the options (the real model does not tie) */
    int full_every;
} preset;

static const preset presets[] = {
    {"tiny", 320, 128, 2, 4, 2, 32, 384, 2048, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-0.6b", 151936, 1024, 28, 16, 8, 128, 3072, 40960, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-8b", 151936, 4096, 36, 32, 8, 128, 12288, 40960, 0, 0, 0, 0, 0, 0, 0, 1, 0},
    {"gemma4-tiny", 320, 128, 4, 4, 2, 32, 256, 2048, 1, 64, 1, 16, 0, 0, 0, 0, 2},
    {"gemma4-moe-tiny", 320, 128, 4, 4, 2, 32, 256, 2048, 1, 64, 1, 16, 8, 2, 64, 0, 2},
    /* Gemma-4-26B-A4B's text decoder (docs/gemma4.md, "The gemma4-26b-a4b preset"): 30 layers, 5
     * sliding to 1 full, D 2816, 16 heads; sliding hd 256 x 8 KV heads, window 1024; full hd 512 x 2 KV
     * heads; dense F 2112; 128 experts, top-8, expert F 704; vocabulary 262144 (tied); context 262144 */
    {"gemma4-26b-a4b", 262144, 2816, 30, 16, 8, 256, 2112, 262144, 1, 512, 2, 1024, 128, 8, 704, 0, 6},
};

/* Layer i of Gemma 4 preset p is a sliding-window layer. */
static int gemma_sliding(const preset *p, int i) {
    return i != p->layers - 1 && i % p->full_every != p->full_every - 1;
}

enum { K_LINEAR, K_EMBED, K_NORM };         /* what a generated matrix is */
enum { P_WEIGHT, P_SCALES, P_BIASES };      /* which stored part of it a tensor entry holds */

/* One generated matrix W[N][K] (a norm is N = 1). */
typedef struct gen_mat {
    char base[80];          /* name without ".weight" */
    int bare;               /* stored under base itself, no ".weight" (Gemma 4's layer_scalar) */
    int stack;              /* > 0: stored as [stack, N / stack, K] (stacked experts); rows as 2-D */
    int kind, index;        /* kind; generator index (stable: independent of bits and tying) */
    int pair_rows;          /* 1: each odd row is a copy of the even row before it */
    int N, K;
    int quantized;
    size_t off[3];          /* data-region offsets of weight, scales, biases */
} gen_mat;

/* One stored tensor (header entry). */
typedef struct tensor_ent {
    char name[96];
    const char *dtype;      /* "U32" | "BF16" | "F32" */
    int64_t shape[3];
    int ndim;
    size_t nbytes;
    gen_mat *mat;
    int part;
} tensor_ent;

static int cmp_ent(const void *a, const void *b) {
    return strcmp(((const tensor_ent *)a)->name, ((const tensor_ent *)b)->name);
}

/* ---------------------------------------------------------------- file helpers */

/* mkdir -p dir. */
static ib_status mkdir_p(const char *dir, ib_error *err) {
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            ib_status st = ib_fail(err, IB_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
            free(p);
            return st;
        }
        p[i] = c;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        free(p);
        return ib_fail(err, IB_ERR_IO, "%s: not a directory", dir);
    }
    free(p);
    return IB_OK;
}

/* Write all of buf at offset off of fd. */
static int pwrite_all(int fd, const void *buf, size_t n, off_t off) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* ---------------------------------------------------------------- safetensors streaming */

/* Output bytes per block of rows (8 KB): a block is generated, quantized and staged while it sits in
 * cache. Blocks therefore hold different row counts at different bit widths, which the tests use to
 * show the generator does not depend on the blocking. */
#define BLOCK_BYTES (1 << 13)
/* Output bytes per task (1 MB, whole blocks, at least one): a task is a run of rows of one matrix that
 * one thread generates into its own buffers and writes with one pwrite per stored part. */
#define TASK_BYTES (1 << 20)

/* One thread's buffers. */
typedef struct gen_bufs {
    float *w;                   /* [block rows][K] generated (and bf16-rounded) values */
    float *s, *b;               /* [block rows][K/group] */
    void *out;                  /* the task's weight part as stored: U32 codes, BF16 or F32 */
    uint16_t *so, *bo;          /* the task's scales and biases as stored (BF16) */
} gen_bufs;

/* Rows per block and per task of matrix m (a task is a whole number of blocks, or all N rows), and
 * the stored bytes of one row's weight part. */
static void mat_blocking(const gen_mat *m, int bits, int *block_rows, int *task_rows, size_t *row_bytes) {
    /* stored bytes per element, times 2 (4-bit codes are half a byte) */
    size_t twice = (size_t)(m->quantized ? bits / 4 : bits == 32 ? 8 : 4), row2 = (size_t)m->K * twice;
    size_t rows = 2 * (size_t)BLOCK_BYTES / row2;
    if (rows < 1) rows = 1;
    size_t blocks = 2 * (size_t)TASK_BYTES / (row2 * rows);
    if (blocks < 1) blocks = 1;
    *block_rows = rows < (size_t)m->N ? (int)rows : m->N;
    *task_rows = rows * blocks < (size_t)m->N ? (int)(rows * blocks) : m->N;
    *row_bytes = row2 / 2;
}

/* Generate rows [r0, r0+nr) of matrix m into w. Every value is a function of (seed, m->index, its
 * element index) alone, so any cut of the rows into blocks, tasks and threads gives the same values. */
static void gen_rows(const gen_mat *m, uint64_t seed, int bits, int r0, int nr, float *w) {
    uint64_t key = tensor_key(seed, m->index);
    float a = 0.0f;
    if (m->kind == K_LINEAR) a = sqrtf(3.0f / (float)m->K);    /* std 1/sqrt(fan_in) */
    else if (m->kind == K_EMBED) a = sqrtf(3.0f / (float)m->K);  /* std 1/sqrt(D): tied logits of std ~1 */
    size_t e0 = (size_t)r0 * m->K, n = (size_t)nr * m->K;
    for (size_t i = 0; i < n; i++) {
        size_t e = e0 + i;
        if (m->pair_rows) e = ((e / m->K) & ~(size_t)1) * m->K + e % m->K;   /* row 2j+1 = row 2j */
        float u = uniform_pm1(key, e);
        float v = m->kind == K_NORM ? 1.0f + 0.1f * u : a * u;
        if (bits != 32) v = ib_bf16_to_f32(ib_f32_to_bf16(v));
        w[i] = v;
    }
}

/* The weights' pool job: tasks [task0[i], task0[i+1]) are matrix i's runs of task_rows rows. */
typedef struct gen_job {
    int fd;
    const char *path;
    off_t data_start;
    const gen_mat *mats;
    int nm;
    const int *task0;           /* [nm + 1] */
    uint64_t seed;
    int bits, group;
    gen_bufs *bufs;             /* [threads]: each thread's own */
    _Atomic int failed;         /* set once a write failed: the tasks left do nothing */
    pthread_mutex_t mu;         /* guards st and err */
    ib_status st;
    ib_error *err;
} gen_job;

/* Task `task`: generate its rows, quantize or convert them, and write each stored part at
 * data_start + m->off[part] + its rows' offset. */
static void gen_task(void *ctx, int task, int thread) {
    gen_job *j = ctx;
    if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return;
    int lo = 0, hi = j->nm - 1;   /* the matrix: the last whose first task is <= task */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (j->task0[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    const gen_mat *m = &j->mats[lo];
    gen_bufs *bf = &j->bufs[thread];
    const int bits = j->bits, group = j->group, K = m->K;
    int block_rows, task_rows;
    size_t row_bytes;
    mat_blocking(m, bits, &block_rows, &task_rows, &row_bytes);
    const int r0 = (task - j->task0[lo]) * task_rows, r1 = m->N - r0 < task_rows ? m->N : r0 + task_rows;
    const size_t g_row = m->quantized ? (size_t)K / group : 0;
    for (int b0 = r0; b0 < r1; b0 += block_rows) {
        const int nr = r1 - b0 < block_rows ? r1 - b0 : block_rows;
        const size_t at = (size_t)(b0 - r0), n = (size_t)nr * K;   /* at: rows of the task before the block */
        unsigned char *out = (unsigned char *)bf->out + at * row_bytes;
        if (bits == 32 && !m->quantized) {
            gen_rows(m, j->seed, bits, b0, nr, (float *)out);
            continue;
        }
        gen_rows(m, j->seed, bits, b0, nr, bf->w);
        if (m->quantized) {
            ib_mlx_quantize(bf->w, nr, K, bits, group, 1, (uint32_t *)out, bf->s, bf->b);
            const size_t ng = (size_t)nr * g_row;
            for (size_t i = 0; i < ng; i++) bf->so[at * g_row + i] = ib_f32_to_bf16(bf->s[i]);
            for (size_t i = 0; i < ng; i++) bf->bo[at * g_row + i] = ib_f32_to_bf16(bf->b[i]);
        } else {
            uint16_t *h = (uint16_t *)out;
            for (size_t i = 0; i < n; i++) h[i] = ib_f32_to_bf16(bf->w[i]);   /* exact: already bf16 */
        }
    }
    const size_t rows = (size_t)(r1 - r0);
    int bad = pwrite_all(j->fd, bf->out, rows * row_bytes, j->data_start + (off_t)(m->off[P_WEIGHT] + (size_t)r0 * row_bytes));
    if (!bad && m->quantized)
        bad = pwrite_all(j->fd, bf->so, rows * g_row * 2, j->data_start + (off_t)(m->off[P_SCALES] + (size_t)r0 * g_row * 2)) ||
              pwrite_all(j->fd, bf->bo, rows * g_row * 2, j->data_start + (off_t)(m->off[P_BIASES] + (size_t)r0 * g_row * 2));
    if (bad) {
        int e = errno;
        pthread_mutex_lock(&j->mu);
        if (!atomic_load(&j->failed))
            j->st = ib_fail(j->err, IB_ERR_IO, "%s: tensor %s: write failed: %s", j->path, m->base, strerror(e));
        atomic_store(&j->failed, 1);
        pthread_mutex_unlock(&j->mu);
    }
}

/* Write every matrix's stored parts with `threads` threads (data_start: the data region's offset). */
static ib_status write_mats(int fd, const char *path, off_t data_start, const gen_mat *mats, int nm, uint64_t seed,
                            int bits, int group, int threads, ib_error *err) {
    ib_status st = IB_OK;
    int *task0 = malloc(((size_t)nm + 1) * sizeof *task0);
    gen_bufs *bufs = NULL;
    ib_pool *pool = NULL;
    if (!task0) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    /* each thread's buffers hold the largest block and the largest task of any matrix */
    size_t w_cap = 1, s_cap = 1, out_cap = 8, so_cap = 1;
    long n_tasks = 0;
    for (int i = 0; i < nm; i++) {
        const gen_mat *m = &mats[i];
        int block_rows, task_rows;
        size_t row_bytes, g_row = m->quantized ? (size_t)m->K / group : 0;
        mat_blocking(m, bits, &block_rows, &task_rows, &row_bytes);
        task0[i] = (int)n_tasks;
        n_tasks += (m->N + task_rows - 1) / task_rows;
        if ((size_t)block_rows * m->K > w_cap) w_cap = (size_t)block_rows * m->K;
        if ((size_t)block_rows * g_row > s_cap) s_cap = (size_t)block_rows * g_row;
        if ((size_t)task_rows * row_bytes > out_cap) out_cap = (size_t)task_rows * row_bytes;
        if ((size_t)task_rows * g_row > so_cap) so_cap = (size_t)task_rows * g_row;
    }
    if (n_tasks > 0x7fffffffL) {
        free(task0);
        return ib_fail(err, IB_ERR_INVALID_ARG, "%s: %ld write tasks are too many", path, n_tasks);
    }
    task0[nm] = (int)n_tasks;
    if (threads > n_tasks) threads = (int)n_tasks;
    if (threads < 1) threads = 1;
    bufs = calloc((size_t)threads, sizeof *bufs);
    if (!bufs) goto nomem;
    for (int t = 0; t < threads; t++) {
        gen_bufs *b = &bufs[t];
        b->w = malloc(w_cap * sizeof *b->w);
        b->s = malloc(s_cap * sizeof *b->s);
        b->b = malloc(s_cap * sizeof *b->b);
        b->out = malloc(out_cap);
        b->so = malloc(so_cap * sizeof *b->so);
        b->bo = malloc(so_cap * sizeof *b->bo);
        if (!b->w || !b->s || !b->b || !b->out || !b->so || !b->bo) goto nomem;
    }
    if ((st = ib_pool_create(threads, &pool, err))) goto done;
    {
        gen_job job = {.fd = fd, .path = path, .data_start = data_start, .mats = mats, .nm = nm, .task0 = task0,
                       .seed = seed, .bits = bits, .group = group, .bufs = bufs, .st = IB_OK, .err = err};
        atomic_init(&job.failed, 0);
        pthread_mutex_init(&job.mu, NULL);
        ib_pool_run(pool, (int)n_tasks, gen_task, &job);
        pthread_mutex_destroy(&job.mu);
        st = job.st;
    }
    goto done;
nomem:
    st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory for %d threads' buffers", path, threads);
done:
    ib_pool_free(pool);
    for (int t = 0; bufs && t < threads; t++) {
        free(bufs[t].w); free(bufs[t].s); free(bufs[t].b); free(bufs[t].out); free(bufs[t].so); free(bufs[t].bo);
    }
    free(bufs);
    free(task0);
    return st;
}

/* Build the header JSON text for ents (sorted), padded with spaces so 8 + length is a multiple
 * of 8. Returns a malloc'd string (length in *len) or NULL when out of memory. */
static char *build_header(const tensor_ent *ents, int n, size_t *len) {
    json_t *root = json_object();
    int bad = !root;
    json_t *meta = json_object();
    if (!meta || json_object_set_new(root, "__metadata__", meta) != 0) bad = 1;
    else if (json_object_set_new(meta, "format", json_string("mlx")) != 0) bad = 1;
    for (int i = 0; i < n && !bad; i++) {
        const tensor_ent *t = &ents[i];
        size_t begin = t->mat->off[t->part];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        if (!e || !shape || !offs) { json_decref(e); json_decref(shape); json_decref(offs); bad = 1; break; }
        for (int d = 0; d < t->ndim; d++) bad |= json_array_append_new(shape, json_integer(t->shape[d]));
        bad |= json_array_append_new(offs, json_integer((json_int_t)begin));
        bad |= json_array_append_new(offs, json_integer((json_int_t)(begin + t->nbytes)));
        bad |= json_object_set_new(e, "dtype", json_string(t->dtype));
        bad |= json_object_set_new(e, "shape", shape);
        bad |= json_object_set_new(e, "data_offsets", offs);
        bad |= json_object_set_new(root, t->name, e);
    }
    char *s = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    if (!s) return NULL;
    size_t l = strlen(s), padded = l + ((8 - (8 + l) % 8) % 8);
    char *out = realloc(s, padded + 1);
    if (!out) { free(s); return NULL; }
    memset(out + l, ' ', padded - l);
    out[padded] = '\0';
    *len = padded;
    return out;
}

/* 1 when the options ask for the Llama architecture (no q/k norm) instead of Qwen3. */
static int is_llama(const ib_mkmodel_opts *o) { return o->arch && strcmp(o->arch, "llama") == 0; }

/* Write model.safetensors of preset p to path (through path + ".tmp"; nothing left on failure). */
static ib_status write_weights(const char *path, const preset *p, const ib_mkmodel_opts *o, int group,
                               int threads, ib_error *err) {
    ib_status st = IB_OK;
    const int L = p->layers, D = p->hidden, qd = p->heads * p->head_dim, kvd = p->kv_heads * p->head_dim;
    const int quant = o->bits == 4 || o->bits == 8;
    const int E = p->experts, Fm = p->moe_ffn;
    const int stride = p->gemma ? (E ? 32 : 16) : 11;   /* generator indices a layer */
    const int n_mats = 1 + (p->gemma ? (E ? 25 : 16) : 11) * L + 1 + (o->tied ? 0 : 1) + (o->ple_dim ? 3 + 3 * L : 0);
    gen_mat *mats = calloc((size_t)n_mats, sizeof *mats);
    tensor_ent *ents = calloc((size_t)n_mats * 3, sizeof *ents);
    char *hdr = NULL, *tmp = NULL;
    int fd = -1;
    if (!mats || !ents) goto nomem;

    /* matrices, in generator-index order */
    int nm = 0;
#define MAT(KIND, IDX, NN, KK, ...)                                                   \
    do {                                                                              \
        gen_mat *m_ = &mats[nm++];                                                    \
        snprintf(m_->base, sizeof m_->base, __VA_ARGS__);                             \
        m_->kind = (KIND); m_->index = (IDX); m_->N = (NN); m_->K = (KK);             \
        m_->quantized = quant && (KIND) != K_NORM;                                    \
    } while (0)
    MAT(K_EMBED, 0, p->vocab, D, "model.embed_tokens");
    for (int i = 0; i < L && p->gemma; i++) { /* Gemma 4 (docs/gemma4.md): 16 generator indices a layer */
        int b = 1 + stride * i, sl = gemma_sliding(p, i);
        int hd = sl ? p->head_dim : p->global_head_dim, kvh = sl ? p->kv_heads : p->global_kv_heads;
        int own_kv = i < L - o->kv_shared;   /* KV-shared layers have no k_proj, v_proj, k_norm */
        int F = o->double_wide && !own_kv ? 2 * p->ffn : p->ffn;   /* use_double_wide_mlp: 2F when shared */
        MAT(K_LINEAR, b + 0, p->heads * hd, D, "model.layers.%d.self_attn.q_proj", i);
        if (own_kv) MAT(K_LINEAR, b + 1, kvh * hd, D, "model.layers.%d.self_attn.k_proj", i);
        if (own_kv && sl) MAT(K_LINEAR, b + 2, kvh * hd, D, "model.layers.%d.self_attn.v_proj", i); /* full: k = v */
        MAT(K_LINEAR, b + 3, D, p->heads * hd, "model.layers.%d.self_attn.o_proj", i);
        MAT(K_NORM, b + 4, 1, hd, "model.layers.%d.self_attn.q_norm", i);
        if (own_kv) MAT(K_NORM, b + 5, 1, hd, "model.layers.%d.self_attn.k_norm", i);
        MAT(K_NORM, b + 6, 1, D, "model.layers.%d.input_layernorm", i);
        MAT(K_NORM, b + 7, 1, D, "model.layers.%d.post_attention_layernorm", i);
        MAT(K_NORM, b + 8, 1, D, "model.layers.%d.pre_feedforward_layernorm", i);
        MAT(K_NORM, b + 9, 1, D, "model.layers.%d.post_feedforward_layernorm", i);
        MAT(K_LINEAR, b + 10, F, D, "model.layers.%d.mlp.gate_proj", i);
        MAT(K_LINEAR, b + 11, F, D, "model.layers.%d.mlp.up_proj", i);
        MAT(K_LINEAR, b + 12, D, F, "model.layers.%d.mlp.down_proj", i);
        MAT(K_NORM, b + 13, 1, 1, "model.layers.%d.layer_scalar", i);
        mats[nm - 1].bare = 1;
        if (!E) continue;
        /* the MoE block: router, norms, experts stacked as mlx-lm's SwitchGLU stores them */
        MAT(K_LINEAR, b + 16, E, D, "model.layers.%d.router.proj", i);
        mats[nm - 1].pair_rows = o->router_ties;
        MAT(K_NORM, b + 17, 1, D, "model.layers.%d.router.scale", i);
        mats[nm - 1].bare = 1;
        MAT(K_NORM, b + 18, 1, E, "model.layers.%d.router.per_expert_scale", i);
        mats[nm - 1].bare = 1;
        MAT(K_NORM, b + 19, 1, D, "model.layers.%d.post_feedforward_layernorm_1", i);
        MAT(K_NORM, b + 20, 1, D, "model.layers.%d.pre_feedforward_layernorm_2", i);
        MAT(K_NORM, b + 21, 1, D, "model.layers.%d.post_feedforward_layernorm_2", i);
        MAT(K_LINEAR, b + 22, E * Fm, D, "model.layers.%d.experts.switch_glu.gate_proj", i);
        mats[nm - 1].stack = E;
        MAT(K_LINEAR, b + 23, E * Fm, D, "model.layers.%d.experts.switch_glu.up_proj", i);
        mats[nm - 1].stack = E;
        MAT(K_LINEAR, b + 24, E * D, Fm, "model.layers.%d.experts.switch_glu.down_proj", i);
        mats[nm - 1].stack = E;
    }
    for (int i = 0; i < L && !p->gemma; i++) {
        int b = 1 + 11 * i;
        MAT(K_LINEAR, b + 0, qd, D, "model.layers.%d.self_attn.q_proj", i);
        MAT(K_LINEAR, b + 1, kvd, D, "model.layers.%d.self_attn.k_proj", i);
        MAT(K_LINEAR, b + 2, kvd, D, "model.layers.%d.self_attn.v_proj", i);
        MAT(K_LINEAR, b + 3, D, qd, "model.layers.%d.self_attn.o_proj", i);
        if (!is_llama(o)) { /* Llama has no q/k norm; generator indices stay the same */
            MAT(K_NORM, b + 4, 1, p->head_dim, "model.layers.%d.self_attn.q_norm", i);
            MAT(K_NORM, b + 5, 1, p->head_dim, "model.layers.%d.self_attn.k_norm", i);
        }
        MAT(K_NORM, b + 6, 1, D, "model.layers.%d.input_layernorm", i);
        MAT(K_NORM, b + 7, 1, D, "model.layers.%d.post_attention_layernorm", i);
        MAT(K_LINEAR, b + 8, p->ffn, D, "model.layers.%d.mlp.gate_proj", i);
        MAT(K_LINEAR, b + 9, p->ffn, D, "model.layers.%d.mlp.up_proj", i);
        MAT(K_LINEAR, b + 10, D, p->ffn, "model.layers.%d.mlp.down_proj", i);
    }
    int last = stride * L;
    MAT(K_NORM, 1 + last, 1, D, "model.norm");
    if (!o->tied) MAT(K_LINEAR, 2 + last, p->vocab, D, "lm_head");
    if (o->ple_dim) { /* Gemma 4 per-layer embeddings: generator indices after the model's others */
        const int P = o->ple_dim;
        MAT(K_EMBED, 3 + last, p->vocab, L * P, "model.embed_tokens_per_layer");
        MAT(K_LINEAR, 4 + last, L * P, D, "model.per_layer_model_projection");
        MAT(K_NORM, 5 + last, 1, P, "model.per_layer_projection_norm");
        for (int i = 0; i < L; i++) {
            MAT(K_LINEAR, 6 + last + 3 * i, P, D, "model.layers.%d.per_layer_input_gate", i);
            MAT(K_LINEAR, 7 + last + 3 * i, D, P, "model.layers.%d.per_layer_projection", i);
            MAT(K_NORM, 8 + last + 3 * i, 1, D, "model.layers.%d.post_per_layer_input_norm", i);
        }
    }
#undef MAT

    /* stored tensors */
    int ne = 0;
    for (int i = 0; i < nm; i++) {
        gen_mat *m = &mats[i];
        for (int part = 0; part < (m->quantized ? 3 : 1); part++) {
            tensor_ent *t = &ents[ne++];
            static const char *const suffix[3] = {"weight", "scales", "biases"};
            if (m->bare) snprintf(t->name, sizeof t->name, "%s", m->base);
            else snprintf(t->name, sizeof t->name, "%s.%s", m->base, suffix[part]);
            t->mat = m;
            t->part = part;
            t->ndim = m->kind == K_NORM ? 1 : 2;
            t->shape[0] = m->kind == K_NORM ? m->K : m->N;
            if (m->stack) { /* [E, N/E, *]: the same bytes as [N, *] */
                t->ndim = 3;
                t->shape[0] = m->stack;
                t->shape[1] = m->N / m->stack;
            }
            int64_t *last_dim = &t->shape[t->ndim == 3 ? 2 : 1];
            size_t elem;
            if (part == P_WEIGHT && m->quantized) {
                t->dtype = "U32";
                *last_dim = (int64_t)m->K * o->bits / 32;
                elem = 4;
            } else if (part != P_WEIGHT) {
                t->dtype = "BF16";
                *last_dim = m->K / group;
                elem = 2;
            } else {
                t->dtype = o->bits == 32 ? "F32" : "BF16";
                *last_dim = m->K;
                elem = o->bits == 32 ? 4 : 2;
            }
            t->nbytes = elem * (size_t)t->shape[0] * (t->ndim >= 2 ? (size_t)t->shape[1] : 1) *
                        (t->ndim == 3 ? (size_t)t->shape[2] : 1);
        }
    }
    qsort(ents, (size_t)ne, sizeof *ents, cmp_ent);
    size_t data_len = 0;
    for (int i = 0; i < ne; i++) {
        ents[i].mat->off[ents[i].part] = data_len;
        /* packed back to back (the loader refuses holes): every size of the Qwen3 presets is a
         * multiple of 8, so their tensors stay 8-byte aligned; a Gemma 4 layer_scalar (2 or 4 bytes)
         * leaves the tensors after it unaligned, which the loader reads by copying */
        data_len += ents[i].nbytes;
    }

    size_t hlen = 0;
    hdr = build_header(ents, ne, &hlen);
    if (!hdr) goto nomem;

    size_t pl = strlen(path);
    tmp = malloc(pl + 5);
    if (!tmp) goto nomem;
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { st = ib_fail(err, IB_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno)); goto fail; }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (pwrite_all(fd, len8, 8, 0) || pwrite_all(fd, hdr, hlen, 8)) {
        st = ib_fail(err, IB_ERR_IO, "%s: header write failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (ftruncate(fd, (off_t)(8 + hlen + data_len)) != 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot size to %zu bytes: %s", tmp, 8 + hlen + data_len, strerror(errno));
        goto fail;
    }
    if ((st = write_mats(fd, tmp, (off_t)(8 + hlen), mats, nm, o->seed, o->bits, group, threads, err))) goto fail;
    if (close(fd) != 0) {
        fd = -1;
        st = ib_fail(err, IB_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    goto done;

nomem:
    st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
fail:
    if (fd >= 0) close(fd);
    if (tmp) unlink(tmp);
done:
    free(tmp);
    free(hdr);
    free(mats);
    free(ents);
    return st;
}

/* ---------------------------------------------------------------- entry point */

/* Create dir and write config.json, model.safetensors, tokenizer.json and tokenizer_config.json.
 * Options are validated first; on failure the files this call wrote are removed, and dir too when
 * this call created it (parents that mkdir -p made stay). */
ib_status ib_mkmodel(const char *dir, const ib_mkmodel_opts *opts, ib_error *err) {
    if (!dir || !opts || !opts->preset)
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: dir, options and preset are required");
    if (opts->arch && strcmp(opts->arch, "qwen3") && strcmp(opts->arch, "llama"))
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: arch '%s' is not qwen3 or llama", opts->arch);
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, opts->preset) == 0) p = &presets[i];
    if (!p)
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: preset \"%s\" unknown (tiny | qwen3-0.6b | qwen3-8b | gemma4-tiny | gemma4-moe-tiny | gemma4-26b-a4b)",
                       opts->preset);
    if (opts->layers < 0 || opts->layers > p->layers)
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: layers %d: preset %s has %d (give 1..%d)", opts->layers,
                       p->name, p->layers, p->layers);
    if (opts->experts && (!p->experts || opts->experts < 1 || opts->experts > IB_CONFIG_MAX_EXPERTS))
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: experts %d: %s", opts->experts,
                       !p->experts ? "only for the MoE presets (gemma4-moe-tiny, gemma4-26b-a4b)" : "not in 1..1024");
    preset cut = *p;                /* the preset with fewer layers or another expert count: every other
                                     * shape unchanged */
    if (opts->layers) cut.layers = opts->layers;
    if (opts->experts) {
        cut.experts = opts->experts;
        if (cut.top_k > cut.experts) cut.top_k = cut.experts;
    }
    if (opts->layers || opts->experts) p = &cut;
    ib_mkmodel_opts own = *opts;
    if (p->untied) own.tied = 0;   /* the real model's layout */
    opts = &own;
    if (p->gemma && opts->arch)
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: preset %s takes no arch (it is gemma4)", p->name);
    if (opts->bits != 4 && opts->bits != 8 && opts->bits != 16 && opts->bits != 32)
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: bits %d not one of 4, 8, 16, 32", opts->bits);
    int group = opts->group ? opts->group : 64;
    if (group != 32 && group != 64 && group != 128)
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: group %d not one of 32, 64, 128", opts->group);
    const int quant = opts->bits == 4 || opts->bits == 8;
    /* every quantized input dimension must be a whole number of groups */
    if (quant && (p->hidden % group || p->ffn % group || (p->heads * p->head_dim) % group ||
                  (p->heads * p->global_head_dim) % group || (p->experts && p->moe_ffn % group)))
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: preset %s: group %d does not divide the input sizes", p->name, group);
    if (opts->kv_shared && (!p->gemma || opts->kv_shared < 0 || opts->kv_shared >= p->layers))
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: kv_shared %d: preset %s %s", opts->kv_shared, p->name,
                       p->gemma ? "needs at least one layer with keys and values of its own" : "is not gemma4");
    if (opts->double_wide && !opts->kv_shared)
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: double_wide: needs kv_shared (it widens the KV-shared layers' MLPs)");
    if (opts->ple_dim && (!p->gemma || opts->ple_dim < 1 || opts->ple_dim > 4096 || (quant && opts->ple_dim % group)))
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: ple_dim %d: %s", opts->ple_dim,
                       !p->gemma                                      ? "only for gemma4 presets"
                       : opts->ple_dim < 1 || opts->ple_dim > 4096 ? "not in 1..4096"
                                                                   : "not a multiple of the quantization group");
    if (opts->kv_shared) { /* every shared layer needs an earlier non-shared layer of its type */
        ib_config probe;
        memset(&probe, 0, sizeof probe);
        probe.n_layers = p->layers;
        for (int i = 0; i < p->layers; i++) probe.layer_sliding[i] = (unsigned char)gemma_sliding(p, i);
        int unsourced = ib_config_set_kv_sharing(&probe, opts->kv_shared);
        if (unsourced >= 0)
            return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: kv_shared %d: layer %d has no earlier non-shared layer of "
                           "its type", opts->kv_shared, unsourced);
    }
    if (opts->threads < 0 || opts->threads > IB_MAX_DEFAULT_THREADS)
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: threads %d not in 1..%d (0: the CPUs online)", opts->threads,
                       IB_MAX_DEFAULT_THREADS);
    int threads = opts->threads;
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : n > IB_MAX_DEFAULT_THREADS ? IB_MAX_DEFAULT_THREADS : (int)n;
    }
    if (opts->top_k && (!p->experts || opts->top_k < 1 || opts->top_k > p->experts))
        return ib_fail(err, IB_ERR_INVALID_ARG, "mkmodel: top_k %d: preset %s has %d experts", opts->top_k, p->name,
                       p->experts);

    struct stat sb;
    int existed = stat(dir, &sb) == 0;
    ib_status st = mkdir_p(dir, err);
    if (st) return st;
    size_t dl = strlen(dir) + 32;
    char *p_cfg = malloc(dl), *p_st = malloc(dl);
    if (!p_cfg || !p_st) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    snprintf(p_cfg, dl, "%s/config.json", dir);
    snprintf(p_st, dl, "%s/model.safetensors", dir);

    ib_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = is_llama(opts) ? IB_ARCH_LLAMA : IB_ARCH_QWEN3;
    cfg.vocab_size = p->vocab;
    cfg.hidden_size = p->hidden;
    cfg.n_layers = p->layers;
    cfg.n_heads = p->heads;
    cfg.n_kv_heads = p->kv_heads;
    cfg.head_dim = p->head_dim;
    cfg.intermediate_size = p->ffn;
    cfg.max_position = p->ctx;
    cfg.rope_theta = 1000000.0;
    cfg.rms_eps = 1e-6;
    cfg.tie_embeddings = opts->tied ? 1 : 0;
    cfg.qk_norm = !is_llama(opts);
    cfg.quant_bits = quant ? opts->bits : 0;
    cfg.quant_group = quant ? group : 0;
    cfg.bos_id = -1;
    cfg.eos_id = 258;               /* <|im_end|> of the byte tokenizer */
    cfg.kv_heads_max = p->kv_heads;
    cfg.kv_hd_max = p->head_dim;
    if (p->gemma) {
        cfg.arch = IB_ARCH_GEMMA4;
        cfg.rope_theta = 10000.0;
        cfg.rope_theta_full = 1000000.0;
        cfg.global_head_dim = p->global_head_dim;
        cfg.global_kv_heads = p->global_kv_heads;
        cfg.rope_pairs_full = p->global_head_dim / 8;   /* partial_rotary_factor 0.25 */
        cfg.k_eq_v = 1;
        cfg.sliding_window = p->window;
        cfg.final_softcap = 30.0;
        for (int i = 0; i < p->layers; i++) cfg.layer_sliding[i] = (unsigned char)gemma_sliding(p, i);
        (void)ib_config_set_kv_sharing(&cfg, opts->kv_shared);   /* checked above */
        cfg.double_wide = opts->double_wide ? 1 : 0;
        cfg.ple_dim = opts->ple_dim;
        cfg.n_experts = p->experts;
        cfg.top_k = opts->top_k ? opts->top_k : p->top_k;
        cfg.moe_ffn = p->moe_ffn;
    }

    static const char *const specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    int wrote_cfg = 0, wrote_st = 0;
    if ((st = ib_config_save(&cfg, p_cfg, err))) goto fail;
    wrote_cfg = 1;
    if ((st = write_weights(p_st, p, opts, group, threads, err))) goto fail;
    wrote_st = 1;
    if ((st = ib_tokenizer_write_bytelevel(dir, specials, 3, err))) goto fail;
    goto done;

fail:
    if (wrote_cfg) unlink(p_cfg);
    if (wrote_st) unlink(p_st);
    if (!existed) rmdir(dir);       /* only the last level, and only when empty */
done:
    free(p_cfg);
    free(p_st);
    return st;
}
