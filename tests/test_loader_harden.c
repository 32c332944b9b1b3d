/*
 * test_loader_harden.c — model directories that are broken in ways that used to load silently
 * wrong, hang or burn time, each of which must now fail with a one-line message naming the problem:
 *   - a safetensors header "{}" (used to reach qsort with NULL, UBSan);
 *   - an index naming a FIFO as a shard (used to block in open() for ever), a FIFO config.json;
 *   - a header of 200,000 empty tensors (1.5 s and 250 MB): refused before parsing, fast;
 *   - a NaN scale, an infinite bias, a NaN norm weight; NaN and infinite scales in two experts of a
 *     stacked tensor (loaded one expert per task): the lower expert's message at every thread count;
 *   - model_type llama over a Qwen3 checkpoint (q/k norms were silently dropped) and
 *     num_hidden_layers smaller than the checkpoint (layers dropped): unused tensors are an error;
 *   - trailing bytes after the last tensor, a hole between two tensors;
 *   - an added token whose id is another vocabulary token's id;
 *   - control bytes from a file are escaped in the message.
 * Each starts from a fresh synthetic tiny model (ib_mkmodel) that loads, then breaks one thing.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "isobatch.h"
#include "model/mkmodel.h"

static char root[64];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *pathf(const char *fmt, const char *a, const char *b) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], fmt, a, b);
    return buf[k];
}

/* A fresh tiny model at root/name (4-bit, tied). */
static const char *fresh(const char *name) {
    const char *dir = pathf("%s/%s", root, name);
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 5, .bits = 4, .group = 64, .tied = 1};
    ib_error err = {0};
    if (ib_mkmodel(dir, &mo, &err)) {
        fprintf(stderr, "mkmodel %s: %s\n", dir, err.msg);
        exit(2);
    }
    return dir;
}

static unsigned char *read_all(const char *p, size_t *n) {
    *n = 0;
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    if (sz < 0) sz = 0;
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) sz = 0;
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void write_all(const char *p, const void *b, size_t n) {
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(p);
        exit(2);
    }
    fclose(f);
}

/* Write a safetensors file from a header object and a data section. */
static void write_st(const char *p, json_t *hdr, const unsigned char *data, size_t n) {
    char *h = json_dumps(hdr, JSON_COMPACT);
    size_t hl = strlen(h);
    unsigned char *b = malloc(8 + hl + n + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, h, hl);
    if (n) memcpy(b + 8 + hl, data, n);
    write_all(p, b, 8 + hl + n);
    free(b);
    free(h);
}

/* Read dir's model.safetensors as (header, data). */
static json_t *read_st(const char *dir, unsigned char **data, size_t *n) {
    size_t sz;
    unsigned char *b = read_all(pathf("%s/%s", dir, "model.safetensors"), &sz);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | b[i];
    json_t *h = json_loadb((const char *)b + 8, (size_t)hl, 0, NULL);
    *n = sz - 8 - (size_t)hl;
    *data = malloc(*n + 1);
    memcpy(*data, b + 8 + hl, *n);
    free(b);
    return h;
}

/* Load dir with opts (NULL: the defaults): expect failure within `secs` seconds with a message
 * containing want. */
static void expect_fail_opts(const char *dir, const ib_load_opts *opts, const char *want, double secs, const char *what) {
    ib_model *m = NULL;
    ib_error err = {0};
    double t0 = now();
    ib_status st = ib_model_load(dir, opts, &m, &err);
    double dt = now() - t0;
    CHECK(st != IB_OK && strstr(err.msg, want) != NULL, "%s: status %d, message '%s' (want '%s')", what, (int)st, err.msg, want);
    CHECK(dt < secs, "%s: failed after %.2f s (want < %.1f s)", what, dt, secs);
    int printable = 1;
    for (const char *p = err.msg; *p; p++) printable &= (unsigned char)*p >= 0x20 && *p != 0x7F;
    CHECK(printable, "%s: message has control bytes", what);
    if (m) ib_model_free(m);
}

static void expect_fail(const char *dir, const char *want, double secs, const char *what) {
    expect_fail_opts(dir, NULL, want, secs, what);
}

/* Set one element of tensor `name` (bf16 or f32) in dir's model.safetensors to v. */
static void poke(const char *dir, const char *name, size_t elem, float v) {
    unsigned char *data;
    size_t n;
    json_t *h = read_st(dir, &data, &n);
    json_t *t = json_object_get(h, name);
    const char *dt = json_string_value(json_object_get(t, "dtype"));
    size_t off = (size_t)json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
    if (!strcmp(dt, "F32")) {
        memcpy(data + off + 4 * elem, &v, 4);
    } else { /* BF16: the high half of the float */
        uint32_t u;
        memcpy(&u, &v, 4);
        uint16_t hb = (uint16_t)(u >> 16);
        memcpy(data + off + 2 * elem, &hb, 2);
    }
    write_st(pathf("%s/%s", dir, "model.safetensors"), h, data, n);
    json_decref(h);
    free(data);
}

static void edit_config(const char *dir, const char *key, json_t *v) {
    const char *p = pathf("%s/%s", dir, "config.json");
    json_t *c = json_load_file(p, 0, NULL);
    json_object_set_new(c, key, v);
    json_dump_file(c, p, JSON_INDENT(2));
    json_decref(c);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: a load blocked for 20 s (FIFO?)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/ib_loadh_XXXXXX");
    if (!mkdtemp(root)) return 1;
    signal(SIGALRM, on_alarm);
    alarm(120);
    {   /* the untouched model loads */
        ib_model *m = NULL;
        ib_error err = {0};
        CHECK(ib_model_load(fresh("ok"), NULL, &m, &err) == IB_OK, "a fresh tiny model: %s", err.msg);
        ib_model_free(m);
    }
    {   /* header {} */
        const char *d = fresh("empty");
        json_t *e = json_object();
        write_st(pathf("%s/%s", d, "model.safetensors"), e, NULL, 0);
        json_decref(e);
        expect_fail(d, "tensor model.embed_tokens.weight: missing", 2, "header {}");
    }
    {   /* a FIFO shard named by an index; a FIFO config.json */
        const char *d = fresh("fifo");
        unlink(pathf("%s/%s", d, "model.safetensors"));
        mkfifo(pathf("%s/%s", d, "shard.safetensors"), 0600);
            static const char idx[] = "{\"weight_map\":{\"model.embed_tokens.weight\":\"shard.safetensors\"}}";
        write_all(pathf("%s/%s", d, "model.safetensors.index.json"), idx, strlen(idx));
        alarm(20);
        expect_fail(d, "not a regular file", 2, "FIFO shard");
        const char *d2 = fresh("fifo_config");
        unlink(pathf("%s/%s", d2, "config.json"));
        mkfifo(pathf("%s/%s", d2, "config.json"), 0600);
        expect_fail(d2, "config.json: not a regular file", 2, "FIFO config.json");
        const char *d3 = fresh("fifo_tokconfig");
        unlink(pathf("%s/%s", d3, "tokenizer_config.json"));
        mkfifo(pathf("%s/%s", d3, "tokenizer_config.json"), 0600);
        expect_fail(d3, "tokenizer_config.json: not a regular file", 2, "FIFO tokenizer_config.json");
        alarm(120);
    }
    {   /* 200,000 empty tensors */
        const char *d = fresh("many");
        size_t cap = 200000 * 70 + 16, k = 0;
        char *h = malloc(cap);
        h[k++] = '{';
        for (int i = 0; i < 200000; i++)
            k += (size_t)snprintf(h + k, cap - k, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", i ? "," : "", i);
        h[k++] = '}';
        unsigned char *b = malloc(8 + k);
        for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)k >> (8 * i));
        memcpy(b + 8, h, k);
        write_all(pathf("%s/%s", d, "model.safetensors"), b, 8 + k);
        free(b);
        free(h);
        expect_fail(d, "more than 100000 tensors", 0.3, "200,000 empty tensors");
    }
    {   /* non-finite scale, bias, norm */
        const char *d = fresh("nan_scale");
        poke(d, "model.layers.1.mlp.down_proj.scales", 3, 0.0f / 0.0f);
        expect_fail(d, "model.layers.1.mlp.down_proj.scales: element 3 is NaN", 5, "NaN scale");
        d = fresh("inf_bias");
        poke(d, "model.layers.0.self_attn.q_proj.biases", 0, 1.0f / 0.0f);
        expect_fail(d, "model.layers.0.self_attn.q_proj.biases: element 0 is infinite", 5, "infinite bias");
        d = fresh("nan_norm");
        poke(d, "model.norm.weight", 7, 0.0f / 0.0f);
        expect_fail(d, "model.norm.weight: element 7 is NaN", 5, "NaN norm");
    }
    {   /* non-finite scales in experts 2 and 5 of a stacked tensor, loaded one expert per task: the
         * message is expert 2's (the one a load expert after expert reports) at every thread count */
        char d[128];   /* pathf's buffers are reused by poke */
        snprintf(d, sizeof d, "%s/nan_experts", root);
        ib_mkmodel_opts mo = {.preset = "gemma4-moe-tiny", .seed = 5, .bits = 4, .group = 64, .tied = 1};
        ib_error err = {0};
        CHECK(ib_mkmodel(d, &mo, &err) == IB_OK, "mkmodel gemma4-moe-tiny: %s", err.msg);
        /* [8 experts, 64 rows, 128/64 groups]: 128 scales an expert */
        poke(d, "model.layers.1.experts.switch_glu.up_proj.scales", 2 * 128 + 7, 0.0f / 0.0f);
        poke(d, "model.layers.1.experts.switch_glu.up_proj.scales", 5 * 128 + 3, 1.0f / 0.0f);
        static const int counts[] = {1, 2, 3, 8};
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
            ib_load_opts lo = {.threads = counts[i]};
            char what[64];
            snprintf(what, sizeof what, "NaN expert scale, %d threads", counts[i]);
            expect_fail_opts(d, &lo, "model.layers.1.experts.switch_glu.up_proj.scales: element 7 is NaN", 5, what);
        }
    }
    {   /* a configuration that leaves tensors unused */
        const char *d = fresh("llama");
        edit_config(d, "model_type", json_string("llama"));
        edit_config(d, "architectures", json_pack("[s]", "LlamaForCausalLM"));
        expect_fail(d, "k_norm.weight (and others) is not used by this model (model_type llama", 5, "model_type llama over qwen3");
        d = fresh("layers");
        edit_config(d, "num_hidden_layers", json_integer(1));
        expect_fail(d, "tensor model.layers.1.", 5, "num_hidden_layers 1 of 2");
        expect_fail(d, "is not used by this model", 5, "num_hidden_layers 1 of 2 (message)");
    }
    {   /* trailing bytes; a hole */
        const char *d = fresh("trailing");
        unsigned char *data;
        size_t n;
        json_t *h = read_st(d, &data, &n);
        unsigned char *more = calloc(n + 16, 1);
        memcpy(more, data, n);
        write_st(pathf("%s/%s", d, "model.safetensors"), h, more, n + 16);
        expect_fail(d, "16 trailing data bytes", 5, "trailing bytes");
        /* move the last tensor 4 bytes on: a hole before it, the data 4 bytes longer */
        d = fresh("hole");
        const char *key, *last = NULL;
        json_t *v;
        json_int_t best = -1;
        json_decref(h);
        free(data);
        h = read_st(d, &data, &n);
        json_object_foreach(h, key, v) {
            json_int_t b = json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 0));
            if (b > best) best = b, last = key;
        }
        json_t *off = json_object_get(json_object_get(h, last), "data_offsets");
        json_int_t e = json_integer_value(json_array_get(off, 1));
        json_array_set_new(off, 0, json_integer(best + 4));
        json_array_set_new(off, 1, json_integer(e + 4));
        unsigned char *shifted = calloc(n + 4, 1);
        memcpy(shifted, data, (size_t)best);
        memcpy(shifted + best + 4, data + best, n - (size_t)best);
        write_st(pathf("%s/%s", d, "model.safetensors"), h, shifted, n + 4);
        expect_fail(d, "belong to no tensor", 5, "a hole in the data section");
        json_decref(h);
        free(data);
        free(more);
        free(shifted);
    }
    {   /* an added token taking a vocabulary token's id */
        const char *d = fresh("collide");
        const char *p = pathf("%s/%s", d, "tokenizer.json");
        json_t *t = json_load_file(p, 0, NULL);
        json_t *added = json_object_get(t, "added_tokens");
        json_t *a = json_deep_copy(json_array_get(added, 2)); /* <|im_end|> */
        json_object_set_new(a, "id", json_integer(112));      /* the byte token "p" */
        json_array_set_new(added, 2, a);
        json_dump_file(t, p, 0);
        json_decref(t);
        expect_fail(d, "has id 112, which model.vocab gives to \"p\"", 5, "added token id collision");
    }
    {   /* control bytes in a dtype name come out escaped */
        const char *d = fresh("ctrl");
        unsigned char *data;
        size_t n;
        json_t *h = read_st(d, &data, &n);
        json_object_set_new(json_object_get(h, "model.norm.weight"), "dtype", json_string("F\x1b[2J\x07"));
        write_st(pathf("%s/%s", d, "model.safetensors"), h, data, n);
        json_decref(h);
        free(data);
        expect_fail(d, "dtype \"F\\x1B[2J\\x07\" unknown", 5, "control bytes escaped");
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    TEST_MAIN_END("test_loader_harden");
}
