/*
 * test_load_threads.c — the thread counts of mkmodel and of the model load change no byte.
 *
 *   - ib_mkmodel with threads 1, 2, 5 and 0 (the CPUs online) writes the same files; a thread count
 *     out of range is refused before anything is written;
 *   - ib_model_load with threads 1, 2, 3, 8 and 0 (the CPUs online) gives the same model: every matrix's format, shape,
 *     scale/bias storage and every packed byte, every vector, the info; on quantized and float MoE
 *     experts (one expert per task), a Gemma 4 model with per-layer embeddings, and a Qwen3-0.6B cut to
 *     one layer (its embedding's 9,496 panels are cut into many repack tasks);
 *   - ib_matrix_from_f32_pool / ib_matrix_from_mlx_pool against the single-threaded builds, with a
 *     partial last panel, and scales whose halves fit bfloat16 only and float16 only (so the storage
 *     the tasks agree on must be float32, as the whole-array answer is); the MLX builds (a word at a
 *     time, from aligned and unaligned codes) against the layout built one code at a time as the
 *     loader did before;
 *   - a load that fails does so with the same message at every thread count.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/half.h"
#include "core/pool.h"
#include "isobatch.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "ops/matmul.h"

static char root[64];
static const char *const FILES[4] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};


static void remove_dir(const char *d) {
    char p[256];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", d, FILES[i]);
        unlink(p);
    }
    rmdir(d);
}

/* ---------------------------------------------------------------- mkmodel */

static void test_mkmodel_threads(void) {
    static const int counts[] = {1, 2, 5, 0};
    static const ib_mkmodel_opts cases[] = {
        {.preset = "gemma4-moe-tiny", .seed = 11, .bits = 4, .group = 32, .tied = 1},
        {.preset = "tiny", .seed = 12, .bits = 32, .tied = 0},
        {.preset = "gemma4-tiny", .seed = 13, .bits = 8, .tied = 1, .kv_shared = 2, .double_wide = 1, .ple_dim = 64},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char ref[128], d[128];
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
            ib_mkmodel_opts o = cases[c];
            o.threads = counts[i];
            snprintf(d, sizeof d, "%s/mk%zu_%d", root, c, counts[i]);
            ib_error err = {0};
            CHECK(ib_mkmodel(d, &o, &err) == IB_OK, "%s threads %d: %s", o.preset, counts[i], err.msg);
            if (i == 0) {
                snprintf(ref, sizeof ref, "%s", d);
                continue;
            }
            for (int f = 0; f < 4; f++)
                CHECK(check_same_file(ref, d, FILES[f]), "%s: %s differs between threads 1 and %d", o.preset, FILES[f], counts[i]);
            remove_dir(d);
        }
        remove_dir(ref);
    }
    /* out of range: refused before anything is written */
    static const int badc[] = {-1, 257, 1 << 30};
    for (size_t i = 0; i < sizeof badc / sizeof badc[0]; i++) {
        char d[128];
        snprintf(d, sizeof d, "%s/mkbad", root);
        ib_mkmodel_opts o = {.preset = "tiny", .seed = 1, .bits = 4, .tied = 1, .threads = badc[i]};
        ib_error err = {0};
        CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
        CHECK(strstr(err.msg, "threads") != NULL, "message: %s", err.msg);
        struct stat sb;
        CHECK(stat(d, &sb) != 0, "threads %d: %s created", badc[i], d);
    }
}

/* ---------------------------------------------------------------- matrices and models */

/* Bytes of m's packed codes or floats (the rest of m->bytes is its scales and biases). */
static size_t packed_bytes(const ib_matrix *m) {
    size_t per = m->fmt == IB_WF32 ? (size_t)IB_PANEL * 4 : m->fmt == IB_WQ4 ? 8 : 16;
    return (size_t)m->n_panels * (size_t)m->cols * per;
}

/* 1 when a and b are the same matrix, byte for byte (both empty counts). */
static int same_matrix(const ib_matrix *a, const ib_matrix *b) {
    if (a->fmt != b->fmt || a->rows != b->rows || a->cols != b->cols || a->group != b->group ||
        a->n_panels != b->n_panels || a->sb_fmt != b->sb_fmt || a->bytes != b->bytes)
        return 0;
    if (!a->packed || !b->packed) return a->packed == b->packed && a->rows == 0;
    size_t pb = packed_bytes(a);
    if (memcmp(a->packed, b->packed, pb) != 0) return 0;
    if ((a->sb == NULL) != (b->sb == NULL)) return 0;
    return !a->sb || memcmp(a->sb, b->sb, a->bytes - pb) == 0;
}

static int same_vec(const float *a, const float *b, size_t n) {
    if (!a || !b) return a == b;
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Compare two loads of one directory; what: for the messages. Returns the number of differences. */
static int compare_models(const ib_model *a, const ib_model *b, const char *what) {
    int diffs = 0;
    const ib_config *c = &a->cfg;
    const size_t D = (size_t)c->hidden_size;
#define M(field, name)                                                                     \
    do {                                                                                   \
        int s_ = same_matrix(&a->field, &b->field);                                        \
        CHECK(s_, "%s: %s differs", what, name);                                           \
        diffs += !s_;                                                                      \
    } while (0)
#define V(field, n, name)                                                                  \
    do {                                                                                   \
        int s_ = same_vec(a->field, b->field, (n));                                        \
        CHECK(s_, "%s: %s differs", what, name);                                           \
        diffs += !s_;                                                                      \
    } while (0)
    CHECK(a->info.n_params == b->info.n_params && a->info.weight_bytes == b->info.weight_bytes &&
              a->info.expert_bytes == b->info.expert_bytes && a->info.file_bytes == b->info.file_bytes &&
              !strcmp(a->info.weight_dtype, b->info.weight_dtype),
          "%s: info differs", what);
    M(embed, "embed");
    M(lm_head_own, "lm_head");
    M(ple_embed, "ple_embed");
    M(ple_model_proj, "ple_model_proj");
    V(final_norm, D, "final_norm");
    V(ple_proj_norm, (size_t)c->ple_dim, "ple_proj_norm");
    for (int i = 0; i < c->n_layers; i++) {
        const ib_layer *la = &a->layers[i], *lb = &b->layers[i];
        char n[64];
        snprintf(n, sizeof n, "layer %d", i);
        M(layers[i].wq, n);
        M(layers[i].wk, n);
        M(layers[i].wv, n);
        M(layers[i].wo, n);
        M(layers[i].w_gate, n);
        M(layers[i].w_up, n);
        M(layers[i].w_down, n);
        M(layers[i].w_router, n);
        M(layers[i].ple_gate, n);
        M(layers[i].ple_proj, n);
        V(layers[i].attn_norm, D, n);
        V(layers[i].mlp_norm, D, n);
        V(layers[i].q_norm, (size_t)la->hd, n);
        V(layers[i].k_norm, (size_t)la->hd, n);
        V(layers[i].post_attn_norm, D, n);
        V(layers[i].post_mlp_norm, D, n);
        V(layers[i].ple_norm, D, n);
        CHECK(la->layer_scalar == lb->layer_scalar, "%s: layer %d scalar", what, i);
        for (int e = 0; e < c->n_experts; e++) {
            snprintf(n, sizeof n, "layer %d expert %d", i, e);
            int s = same_matrix(&la->e_gate[e], &lb->e_gate[e]) && same_matrix(&la->e_up[e], &lb->e_up[e]) &&
                    same_matrix(&la->e_down[e], &lb->e_down[e]);
            CHECK(s, "%s: %s differs", what, n);
            diffs += !s;
        }
        if (c->n_experts) {
            V(layers[i].router_scale, D, n);
            V(layers[i].expert_scale, (size_t)c->n_experts, n);
            V(layers[i].post_mlp_norm1, D, n);
            V(layers[i].pre_moe_norm, D, n);
            V(layers[i].post_moe_norm, D, n);
        }
    }
#undef M
#undef V
    return diffs;
}

/* Write a model with o, load it with 1 thread and with each other count, compare. */
static void check_load(const ib_mkmodel_opts *o, const char *what) {
    char d[128];
    snprintf(d, sizeof d, "%s/load", root);
    ib_error err = {0};
    if (ib_mkmodel(d, o, &err)) {
        CHECK(0, "%s: mkmodel: %s", what, err.msg);
        return;
    }
    ib_model *ref = NULL;
    ib_load_opts lo = {.threads = 1};
    CHECK(ib_model_load(d, &lo, &ref, &err) == IB_OK, "%s: load (1 thread): %s", what, err.msg);
    static const int counts[] = {2, 3, 8, 0, -1};   /* 0 and less: the CPUs online */
    for (size_t i = 0; ref && i < sizeof counts / sizeof counts[0]; i++) {
        ib_model *m = NULL;
        lo.threads = counts[i];
        CHECK(ib_model_load(d, &lo, &m, &err) == IB_OK, "%s: load (%d threads): %s", what, counts[i], err.msg);
        if (!m) continue;
        char w[96];
        snprintf(w, sizeof w, "%s, %d threads", what, counts[i]);
        CHECK_EQ_INT(compare_models(ref, m, w), 0);
        ib_model_free(m);
    }
    ib_model_free(ref);
    remove_dir(d);
}

static void test_load_threads(void) {
    ib_mkmodel_opts o = {.preset = "gemma4-moe-tiny", .seed = 21, .bits = 4, .group = 32, .tied = 1, .threads = 3};
    check_load(&o, "gemma4-moe-tiny 4-bit");
    o = (ib_mkmodel_opts){.preset = "gemma4-moe-tiny", .seed = 22, .bits = 8, .group = 64, .tied = 1, .layers = 3};
    check_load(&o, "gemma4-moe-tiny 8-bit");
    o = (ib_mkmodel_opts){.preset = "gemma4-moe-tiny", .seed = 23, .bits = 32, .tied = 1};
    check_load(&o, "gemma4-moe-tiny float32");
    o = (ib_mkmodel_opts){.preset = "gemma4-moe-tiny", .seed = 23, .bits = 16, .tied = 1};
    check_load(&o, "gemma4-moe-tiny bfloat16");
    o = (ib_mkmodel_opts){.preset = "gemma4-tiny", .seed = 24, .bits = 4, .tied = 1, .kv_shared = 2, .ple_dim = 64};
    check_load(&o, "gemma4-tiny ple");
    o = (ib_mkmodel_opts){.preset = "tiny", .seed = 25, .bits = 32, .tied = 0};
    check_load(&o, "tiny float32 untied");
    o = (ib_mkmodel_opts){.preset = "qwen3-0.6b", .seed = 26, .bits = 4, .group = 64, .tied = 1, .layers = 1};
    check_load(&o, "qwen3-0.6b 1 layer 4-bit");

    /* more than IB_MAX_DEFAULT_THREADS: refused, before the directory is read */
    ib_model *m = NULL;
    ib_error err = {0};
    ib_load_opts lo = {.threads = IB_MAX_DEFAULT_THREADS + 1};
    CHECK_EQ_INT(ib_model_load("/nonexistent", &lo, &m, &err), IB_ERR_INVALID_ARG);
    CHECK(m == NULL && strstr(err.msg, "threads 257") != NULL, "message: %s", err.msg);
}

/* The panel layout of an MLX matrix as the loader built it before it had threads, one code at a time
 * (kept here as the reference): packed [np][K*bits/8 * 16 / ...] and sb [np][ng][2][16] as sbf. */
static void ref_pack_mlx(const uint32_t *wq, const float *scales, const float *biases, int N, int K, int bits,
                         int group, ib_sbfmt sbf, uint8_t **pk_out, void **sb_out) {
    const int np = (N + IB_PANEL - 1) / IB_PANEL, ng = K / group;
    const size_t wpr = (size_t)K * (size_t)bits / 32;
    const size_t pbytes = (size_t)K * (bits == 4 ? 8 : 16);
    const size_t es = sbf == IB_SB_F32 ? 4 : 2;
    uint8_t *pk = calloc((size_t)np, pbytes);
    unsigned char *sb = calloc((size_t)np * ng * 2 * IB_PANEL, es);
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
            for (int part = 0; part < 2; part++) {
                float v = (part ? biases : scales)[(size_t)n * ng + g];
                size_t at = e + (size_t)part * IB_PANEL;
                if (sbf == IB_SB_F32) memcpy(sb + at * 4, &v, 4);
                else {
                    uint16_t h = sbf == IB_SB_BF16 ? (uint16_t)(ib_f32_to_bits(v) >> 16) : ib_f32_to_f16(v);
                    memcpy(sb + at * 2, &h, 2);
                }
            }
        }
    }
    *pk_out = pk;
    *sb_out = sb;
}

/* The pool builds against the single-threaded ones, on matrices of many repack tasks, and the MLX
 * builds against the reference layout above, from aligned and unaligned codes. */
static void test_matrix_pool(void) {
    ib_pool *pool = NULL;
    ib_error err = {0};
    if (ib_pool_create(3, &pool, &err)) {
        CHECK(0, "pool: %s", err.msg);
        return;
    }
    uint64_t x = 0x243F6A8885A308D3ull;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    {   /* float32: 157 panels, the last with 4 rows */
        const int N = 2500, K = 48;
        float *w = malloc((size_t)N * K * sizeof *w);
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = (float)(int32_t)(NEXT() >> 40) * 1e-7f;
        ib_matrix a, b;
        CHECK_EQ_INT(ib_matrix_from_f32(&a, w, N, K, &err), IB_OK);
        CHECK_EQ_INT(ib_matrix_from_f32_pool(&b, w, N, K, pool, &err), IB_OK);
        CHECK(same_matrix(&a, &b), "float32 matrix differs with a pool");
        ib_matrix_free(&a);
        ib_matrix_free(&b);
        free(w);
    }
    for (int bits = 4; bits <= 8; bits += 4)
        for (int mixed = 0; mixed < 3; mixed++) {
            /* 4100 rows (257 panels, the last with 4 rows), K 2048, group 32: 64 groups a row, 262,400
             * scales, more than one share of the storage choice */
            const int N = 4100, K = 2048, G = 32, ng = K / G;
            const size_t nw = (size_t)N * K * bits / 32, n = (size_t)N * ng;
            uint32_t *wq = malloc(nw * sizeof *wq);
            float *s = malloc(n * sizeof *s), *b = malloc(n * sizeof *b);
            for (size_t i = 0; i < nw; i++) wq[i] = (uint32_t)NEXT();
            for (size_t i = 0; i < n; i++) {
                /* mixed 0: every value bf16; 1: the first 2^18 (one share of the storage choice) bf16
                 * only (1e-20 does not fit f16), the rest f16 only (1 + 2^-10 does not fit bf16):
                 * neither holds all, so f32; 2: every value f16 and bf16 except one f16-only value at
                 * the end: f16 */
                float v = ib_bf16_to_f32(ib_f32_to_bf16((float)(int32_t)(NEXT() >> 48) * 1e-4f));
                if (mixed == 1) v = i < ((size_t)1 << 18) ? ib_bf16_to_f32(ib_f32_to_bf16(1e-20f)) : 1.0f + 1.0f / 1024.0f;
                if (mixed == 2) v = i + 1 == n ? 1.0f + 1.0f / 1024.0f : (float)(int)(NEXT() % 64) / 8.0f;
                s[i] = v;
                b[i] = -v;
            }
            ib_matrix m1, m2, m3;
            CHECK_EQ_INT(ib_matrix_from_mlx(&m1, wq, s, b, N, K, bits, G, &err), IB_OK);
            CHECK_EQ_INT(ib_matrix_from_mlx_pool(&m2, wq, s, b, N, K, bits, G, pool, &err), IB_OK);
            unsigned char *odd = malloc(nw * 4 + 2);   /* the codes 2 bytes off alignment, as in a file */
            memcpy(odd + 2, wq, nw * 4);
            CHECK_EQ_INT(ib_matrix_from_mlx_pool(&m3, odd + 2, s, b, N, K, bits, G, pool, &err), IB_OK);
            static const ib_sbfmt want[3] = {IB_SB_BF16, IB_SB_F32, IB_SB_F16};
            CHECK(m1.sb_fmt == want[mixed], "%d-bit case %d: storage %d, want %d", bits, mixed, (int)m1.sb_fmt,
                  (int)want[mixed]);
            CHECK(same_matrix(&m1, &m2), "%d-bit case %d: matrix differs with a pool", bits, mixed);
            CHECK(same_matrix(&m1, &m3), "%d-bit case %d: matrix differs from unaligned codes", bits, mixed);
            uint8_t *rpk;
            void *rsb;
            ref_pack_mlx(wq, s, b, N, K, bits, G, want[mixed], &rpk, &rsb);
            size_t pb = packed_bytes(&m1);
            CHECK(memcmp(m1.packed, rpk, pb) == 0, "%d-bit case %d: codes differ from the reference layout", bits, mixed);
            CHECK(memcmp(m1.sb, rsb, m1.bytes - pb) == 0, "%d-bit case %d: scales/biases differ from the reference layout",
                  bits, mixed);
            free(rpk);
            free(rsb);
            free(odd);
            ib_matrix_free(&m1);
            ib_matrix_free(&m2);
            ib_matrix_free(&m3);
            free(wq);
            free(s);
            free(b);
        }
#undef NEXT
    ib_pool_free(pool);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/ib_loadthr_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    test_mkmodel_threads();
    test_matrix_pool();
    test_load_threads();
    CHECK(rmdir(root) == 0, "%s not empty at the end", root);
    TEST_MAIN_END("test_load_threads");
}
