/*
 * test_weights.c — weight storage formats end to end: the same numbers stored as float32, float16 or
 * bfloat16, in one file or in shards with model.safetensors.index.json, give bitwise the same
 * generation (tokens and logits digests).
 *
 * Each case rewrites a synthetic model directory (isobatch mkmodel) tensor by tensor:
 *   - float32 weights -> float16, against float32 weights holding the float16-rounded values;
 *   - 4-bit MLX weights with bfloat16 scales, biases and norms -> float16 ones, against float32 ones
 *     holding the same float16-rounded values (mostly the bfloat16 values themselves: 8 significant
 *     bits fit in float16's 11, but the parsing of each dtype is what is compared);
 *   - bfloat16 weights -> float32 (exact widening), against the bfloat16 file;
 *   - the 4-bit model split into two shards with an index, against the single file;
 * and checks ib_model_info's weight_dtype for each storage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/half.h"
#include "isobatch.h"
#include "model/mkmodel.h"
#include "model/safetensors.h"

#define N_PROMPTS 3
#define GEN 8

typedef enum conv {
    CONV_COPY,        /* every tensor as stored */
    CONV_F16,         /* float tensors -> F16 */
    CONV_F32_VIA_F16, /* float tensors -> F32 holding the F16-rounded values */
    CONV_F32,         /* float tensors -> F32 (exact widening) */
} conv;

static char root[64];

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int ok = a && b;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b && fclose(b)) ok = 0;
    return ok ? 0 : -1;
}

static float elem_f32(const ib_st_tensor *t, size_t i) {
    const unsigned char *p = t->data;
    if (t->dtype == IB_DT_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == IB_DT_BF16 ? ib_bf16_to_f32(h) : ib_f16_to_f32(h);
}

/* Write dst (a new directory) from src: the same config and tokenizer files, the tensors converted
 * by c, in one file (n_shards 1) or n_shards files with model.safetensors.index.json. */
static int rewrite(const char *src, const char *dst, conv c, int n_shards) {
    char a[256], b[256];
    if (mkdir(dst, 0755)) return -1;
    static const char *const files[] = {"config.json", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dst, files[i]);
        if (copy_file(a, b)) return -1;
    }
    ib_st_set *s;
    ib_error err;
    if (ib_st_open_dir(src, &s, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    ib_st_writer *w[4] = {0};
    for (int k = 0; k < n_shards; k++)
        if (ib_st_writer_create(&w[k], &err)) return -1;
    FILE *idx = NULL;
    if (n_shards > 1) {
        snprintf(b, sizeof b, "%s/model.safetensors.index.json", dst);
        if (!(idx = fopen(b, "w"))) return -1;
        fprintf(idx, "{\"metadata\": {\"total_size\": %zu}, \"weight_map\": {", ib_st_total_bytes(s));
    }
    int rc = 0;
    for (int i = 0; i < ib_st_count(s) && !rc; i++) {
        const ib_st_tensor *t = ib_st_at(s, i);
        size_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        int is_float = t->dtype == IB_DT_F32 || t->dtype == IB_DT_BF16 || t->dtype == IB_DT_F16;
        ib_dtype dt = t->dtype;
        void *data = NULL;
        if (is_float && c == CONV_F16) {
            uint16_t *h = malloc(n * 2 + 1);
            for (size_t j = 0; j < n; j++) h[j] = ib_f32_to_f16(elem_f32(t, j));
            data = h, dt = IB_DT_F16;
        } else if (is_float && (c == CONV_F32_VIA_F16 || c == CONV_F32)) {
            float *f = malloc(n * 4 + 1);
            for (size_t j = 0; j < n; j++) {
                float x = elem_f32(t, j);
                f[j] = c == CONV_F32 ? x : ib_f16_to_f32(ib_f32_to_f16(x));
            }
            data = f, dt = IB_DT_F32;
        }
        int k = i % n_shards;
        rc = ib_st_writer_add(w[k], t->name, dt, t->ndim, t->shape, data ? data : t->data, &err) != IB_OK;
        free(data);
        if (idx) fprintf(idx, "%s\"%s\": \"model-%05d-of-%05d.safetensors\"", i ? ", " : "", t->name, k + 1, n_shards);
    }
    ib_st_close(s);
    if (idx) {
        fprintf(idx, "}}\n");
        rc |= fclose(idx) != 0;
    }
    for (int k = 0; k < n_shards; k++) {
        if (n_shards > 1)
            snprintf(b, sizeof b, "%s/model-%05d-of-%05d.safetensors", dst, k + 1, n_shards);
        else
            snprintf(b, sizeof b, "%s/model.safetensors", dst);
        if (!rc && ib_st_writer_write(w[k], b, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            rc = 1;
        }
        ib_st_writer_free(w[k]);
    }
    return rc ? -1 : 0;
}

typedef struct outcome {
    uint64_t digest[N_PROMPTS];
    int32_t tokens[N_PROMPTS][GEN];
    char dtype[16];
    int ok;
} outcome;

/* Load dir and generate GEN tokens greedily for three prompts, three sessions per step. */
static outcome run(const char *dir) {
    outcome o;
    memset(&o, 0, sizeof o);
    ib_model *m;
    ib_engine *e;
    ib_error err;
    if (ib_model_load(dir, NULL, &m, &err)) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        return o;
    }
    snprintf(o.dtype, sizeof o.dtype, "%s", ib_model_get_info(m)->weight_dtype);
    if (ib_engine_create(m, &(ib_engine_opts){.threads = 2}, &e, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        ib_model_free(m);
        return o;
    }
    static const int32_t p0[] = {72, 101, 108, 108, 111}, p1[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37},
                         p2[] = {200};
    ib_gen_request rq[N_PROMPTS] = {{.prompt = p0, .n_prompt = 5}, {.prompt = p1, .n_prompt = 37}, {.prompt = p2, .n_prompt = 1}};
    ib_gen_opts go = {.ignore_eos = 1, .max_new_tokens = GEN, .batch = 3, .sampling = ib_sampling_default()};
    ib_gen_result res[N_PROMPTS];
    if (ib_generate(e, rq, N_PROMPTS, &go, res, NULL, &err) == IB_OK) {
        for (int i = 0; i < N_PROMPTS; i++) {
            o.digest[i] = res[i].digest;
            for (int t = 0; t < GEN && t < res[i].n_tokens; t++) o.tokens[i][t] = res[i].tokens[t];
        }
        ib_gen_results_free(res, N_PROMPTS);
        o.ok = 1;
    } else {
        fprintf(stderr, "generate: %s\n", err.msg);
    }
    ib_engine_free(e);
    ib_model_free(m);
    return o;
}

static int same(const outcome *a, const outcome *b) {
    return a->ok && b->ok && memcmp(a->digest, b->digest, sizeof a->digest) == 0 &&
           memcmp(a->tokens, b->tokens, sizeof a->tokens) == 0;
}

static const char *path(const char *name) {
    static char buf[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static void make(const char *name, int bits) {
    ib_error err;
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 21, .bits = bits, .group = 64, .tied = 1};
    if (ib_mkmodel(path(name), &mo, &err)) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        exit(1);
    }
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/ib_weights_XXXXXX");
    if (!mkdtemp(root)) return 1;

    /* float32 -> float16 */
    make("f32", 32);
    CHECK(rewrite(path("f32"), path("f16"), CONV_F16, 1) == 0, "write the float16 copy");
    CHECK(rewrite(path("f32"), path("f32r"), CONV_F32_VIA_F16, 1) == 0, "write the float32 copy of the float16 values");
    outcome f32 = run(path("f32")), f16 = run(path("f16")), f32r = run(path("f32r"));
    CHECK(f32.ok && f16.ok && f32r.ok, "float models load and generate");
    CHECK(same(&f16, &f32r), "float16 weights differ from float32 weights of the same values");
    CHECK(!same(&f16, &f32), "float16 rounding changed nothing (the conversion did not happen?)");
    CHECK(!strcmp(f32.dtype, "float32") && !strcmp(f16.dtype, "float16") && !strcmp(f32r.dtype, "float32"),
          "weight_dtype %s %s %s", f32.dtype, f16.dtype, f32r.dtype);

    /* bfloat16 -> float32 (exact) */
    make("bf16", 16);
    CHECK(rewrite(path("bf16"), path("bf16w"), CONV_F32, 1) == 0, "write the float32 copy of the bfloat16 model");
    outcome bf16 = run(path("bf16")), bf16w = run(path("bf16w"));
    CHECK(same(&bf16, &bf16w), "bfloat16 weights differ from float32 weights of the same values");
    CHECK(!strcmp(bf16.dtype, "bfloat16"), "weight_dtype %s", bf16.dtype);

    /* 4-bit MLX: float16 scales, biases and norms */
    make("q4", 4);
    CHECK(rewrite(path("q4"), path("q4h"), CONV_F16, 1) == 0, "write the float16-parameter copy");
    CHECK(rewrite(path("q4"), path("q4r"), CONV_F32_VIA_F16, 1) == 0, "write the float32-parameter copy");
    outcome q4 = run(path("q4")), q4h = run(path("q4h")), q4r = run(path("q4r"));
    CHECK(q4.ok && q4h.ok && q4r.ok, "4-bit models load and generate");
    CHECK(same(&q4h, &q4r), "4-bit: float16 scales/biases differ from float32 ones of the same values");
    CHECK(!strcmp(q4h.dtype, "mlx-affine"), "weight_dtype %s", q4h.dtype);

    /* shards with an index */
    CHECK(rewrite(path("q4"), path("q4s"), CONV_COPY, 2) == 0, "write the sharded copy");
    CHECK(access(path("q4s/model.safetensors"), F_OK) != 0 &&
              access(path("q4s/model-00002-of-00002.safetensors"), F_OK) == 0,
          "the sharded copy is not sharded");
    outcome q4s = run(path("q4s"));
    CHECK(same(&q4s, &q4), "two shards + index differ from the single file");
    CHECK(rewrite(path("f32"), path("f16s"), CONV_F16, 3) == 0, "write the sharded float16 copy");
    outcome f16s = run(path("f16s"));
    CHECK(same(&f16s, &f16), "three float16 shards differ from the single float16 file");

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    TEST_MAIN_END("test_weights");
}
