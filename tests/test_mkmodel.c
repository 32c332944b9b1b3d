/*
 * test_mkmodel.c — the MLX affine quantizer and the synthetic model writer.
 *
 * Quantizer: hand-worked groups, then random rows checked against an independent reading of the
 * documented formula, independent unpacking of the codes, error bounds, exact edges.
 * Writer: the tiny preset at every bits/group, tied and untied, reopened with ib_st_open_dir; every
 * expected tensor name/dtype/shape, no others; weight statistics; agreement between the 32-, 16- and
 * 4-bit files of one seed; config and tokenizer files; determinism.
 * Set IB_TEST_BIG=1 to also write (and time) the qwen3-0.6b preset at 4 bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "core/half.h"
#include "model/config.h"
#include "model/mkmodel.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rnd01(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static float bf16r(float x) { return ib_bf16_to_f32(ib_f32_to_bf16(x)); }

/* Code j of row n, unpacked independently: word (j*bits)/32, bit offset (j*bits)%32. */
static unsigned code_at(const uint32_t *wq, int K, int bits, int n, int j) {
    const uint32_t *row = wq + (size_t)n * (K * bits / 32);
    unsigned long long bit = (unsigned long long)j * bits;
    return (row[bit / 32] >> (bit % 32)) & ((1u << bits) - 1);
}

/* ---------------------------------------------------------------- quantizer: hand-worked groups */

static void test_quantize_hand(void) {
    float w[32];
    uint32_t wq[4];
    float s, b;
    /* |min| > |max|: edge = min = -1.5, scale = 2.5/15 (positive), q0 = -9, bias = -1.5 */
    for (int j = 0; j < 32; j++) w[j] = 0.0f;
    w[0] = -1.5f; w[1] = 1.0f; w[2] = 0.5f; w[3] = -1.0f;
    ib_mlx_quantize(w, 1, 32, 4, 32, 0, wq, &s, &b);
    CHECK(b == -1.5f, "bias %g", b);
    CHECK(s == -1.5f / -9.0f, "scale %.9g", s);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 0), 0);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 1), 15);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 2), 12);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 3), 3);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 4), 9);      /* zero */
    CHECK(wq[0] == (0u | 15u << 4 | 12u << 8 | 3u << 12 | 9u << 16 | 9u << 20 | 9u << 24 | 9u << 28),
          "packed word 0x%08x", wq[0]);

    /* |max| >= |min|: edge = max = 2, scale negative, q0 = -12, bias = 2 */
    for (int j = 0; j < 32; j++) w[j] = 0.0f;
    w[5] = 2.0f; w[6] = -0.5f;
    ib_mlx_quantize(w, 1, 32, 4, 32, 0, wq, &s, &b);
    CHECK(b == 2.0f && s == 2.0f / -12.0f, "edge=max: scale %.9g bias %g", s, b);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 5), 0);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 6), 15);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 0), 12);

    /* 8 bits, same group: scale = 2.5/255, q0 = rne(2 / -(2.5/255)) = -204 */
    uint32_t wq8[8];
    ib_mlx_quantize(w, 1, 32, 8, 32, 0, wq8, &s, &b);
    CHECK(b == 2.0f && s == 2.0f / -204.0f, "8-bit scale %.9g bias %g", s, b);
    CHECK_EQ_INT(code_at(wq8, 32, 8, 0, 5), 0);
    CHECK_EQ_INT(code_at(wq8, 32, 8, 0, 0), 204);
    CHECK_EQ_INT(code_at(wq8, 32, 8, 0, 6), 255);    /* 2.5/(2/204) = 255 */
    CHECK(((wq8[1] >> 8) & 0xFF) == 0 && ((wq8[1] >> 16) & 0xFF) == 255 && (wq8[0] & 0xFF) == 204,
          "8-bit element 5 is byte 1 of word 1: 0x%08x 0x%08x", wq8[0], wq8[1]);

    /* constant group: scale floor 1e-7 (negated: edge is max), q0 = rne(0.25 / -1e-7) */
    for (int j = 0; j < 32; j++) w[j] = 0.25f;
    ib_mlx_quantize(w, 1, 32, 4, 32, 0, wq, &s, &b);
    float q0 = rintf(0.25f / -1e-7f);
    CHECK(b == 0.25f && s == 0.25f / q0, "constant group: scale %g bias %g", s, b);
    CHECK(wq[0] == 0, "constant group codes 0x%08x", wq[0]);

    /* zero group: q0 = 0 so bias 0, codes 0, dequantizes to exactly 0 */
    for (int j = 0; j < 32; j++) w[j] = 0.0f;
    ib_mlx_quantize(w, 1, 32, 4, 32, 0, wq, &s, &b);
    CHECK(b == 0.0f && s == -1e-7f && wq[0] == 0, "zero group: scale %g bias %g", s, b);

    /* round half to even: codes land on .5 exactly. edge=min=-8, range 15 -> scale 1, q0 = -8:
     * w = -5.5 -> 2.5 -> 2; w = -4.5 -> 3.5 -> 4 */
    for (int j = 0; j < 32; j++) w[j] = 0.0f;
    w[0] = -8.0f; w[1] = 7.0f; w[2] = -5.5f; w[3] = -4.5f;
    ib_mlx_quantize(w, 1, 32, 4, 32, 0, wq, &s, &b);
    CHECK(s == 1.0f && b == -8.0f, "scale %g bias %g", s, b);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 2), 2);
    CHECK_EQ_INT(code_at(wq, 32, 4, 0, 3), 4);
}

/* ---------------------------------------------------------------- quantizer: random rows */

/* Reference scale/bias of one group from the documented formula (round_bf16 applied at the end). */
static void ref_params(const float *x, int group, int bits, int round_bf16, float *s_out, float *b_out) {
    float mx = -INFINITY, mn = INFINITY;
    for (int j = 0; j < group; j++) { mx = fmaxf(mx, x[j]); mn = fminf(mn, x[j]); }
    float s = fmaxf((mx - mn) / (float)((1 << bits) - 1), 1e-7f);
    int edge_is_min = fabsf(mn) > fabsf(mx);
    float edge = edge_is_min ? mn : mx;
    if (!edge_is_min) s = -s;
    float q0 = nearbyintf(edge / s);
    float b = 0.0f;
    if (q0 != 0.0f) { s = edge / q0; b = edge; }
    if (round_bf16) { s = bf16r(s); b = bf16r(b); }
    *s_out = s;
    *b_out = b;
}

static void test_quantize_random(void) {
    const int N = 9, K = 384;
    float *w = malloc(sizeof(float) * N * K);                 /* [N][K] */
    uint32_t *wq = malloc(sizeof(uint32_t) * N * K / 4);     /* [N][K*bits/32], bits <= 8 */
    float *s = malloc(sizeof(float) * N * K / 32), *b = malloc(sizeof(float) * N * K / 32);
    static const int groups[3] = {32, 64, 128};
    long bad_params = 0, bad_code = 0, bad_err = 0, bad_edge = 0, bad_zero = 0, n_clamped = 0, n_checked = 0;
    for (int bits = 4; bits <= 8; bits += 4)
        for (int gi = 0; gi < 3; gi++)
            for (int rb = 0; rb < 2; rb++)
                for (int trial = 0; trial < 4; trial++) {
                    int group = groups[gi];
                    const unsigned nb = (1u << bits) - 1;
                    for (int i = 0; i < N * K; i++) {
                        double u = rnd01() * 2 - 1;
                        /* rows of varied shape: symmetric, skewed positive, skewed negative, tiny */
                        int kind = (i / K + trial) % 4;
                        double v = kind == 0 ? u : kind == 1 ? 0.3 + u * 0.5 : kind == 2 ? -2.0 + u : u * 1e-5;
                        w[i] = (float)v;
                        if (rb) w[i] = bf16r(w[i]);
                    }
                    for (int n = 0; n < N; n++) w[(size_t)n * K + 7] = 0.0f;   /* a zero in group 0 */
                    ib_mlx_quantize(w, N, K, bits, group, rb, wq, s, b);
                    for (int n = 0; n < N; n++)
                        for (int g = 0; g < K / group; g++) {
                            const float *x = w + (size_t)n * K + (size_t)g * group;
                            float rs, rbias;
                            ref_params(x, group, bits, rb, &rs, &rbias);
                            float S = s[n * (K / group) + g], B = b[n * (K / group) + g];
                            if (S != rs || B != rbias) bad_params++;
                            /* the edge: the element of largest magnitude (max on ties) */
                            int e = 0;
                            for (int j = 1; j < group; j++) {
                                float a = fabsf(x[j]), c = fabsf(x[e]);
                                if (a > c || (a == c && x[j] > x[e])) e = j;
                            }
                            for (int j = 0; j < group; j++) {
                                unsigned q = code_at(wq, K, bits, n, g * group + j);
                                float t = (x[j] - B) / S;
                                float want = nearbyintf(t);
                                int clamped = !(want >= 0.0f && want <= (float)nb);
                                want = fminf(fmaxf(want, 0.0f), (float)nb);
                                if ((float)q != want) bad_code++;
                                float deq = S * (float)q + B;
                                float tol = fabsf(S) * (clamped ? 1.0f : 0.5f) * (1.0f + 1e-5f) + 1e-30f;
                                n_checked++;
                                if (clamped) n_clamped++;
                                if (!(fabsf(deq - x[j]) <= tol)) bad_err++;
                                if (j == e && B != 0.0f && !(q == 0 && deq == x[j])) bad_edge++;
                                if (!rb && x[j] == 0.0f && B != 0.0f && !(fabsf(deq) <= fabsf(S) * 1e-4f)) bad_zero++;
                            }
                        }
                }
    CHECK(bad_params == 0, "%ld groups with scale/bias off the documented formula", bad_params);
    CHECK(bad_code == 0, "%ld codes differ from clamp(rne((w - b) / s))", bad_code);
    CHECK(bad_err == 0, "%ld elements outside |s|/2 (|s| when clamped) of w", bad_err);
    CHECK(bad_edge == 0, "%ld edges not exact", bad_edge);
    CHECK(bad_zero == 0, "%ld zeros not dequantized to ~0", bad_zero);
    CHECK(n_checked > 100000, "checked %ld", n_checked);
    CHECK(n_clamped < n_checked / 20, "clamped %ld of %ld", n_clamped, n_checked);
    free(w); free(wq); free(s); free(b);
}

/* ---------------------------------------------------------------- model files */

typedef struct spec { const char *name; const char *dtype; int ndim; int64_t shape[2]; } spec;

/* The expected tensors of the tiny preset (vocab 320, D 128, 2 layers, 4 heads, 2 kv, hd 32,
 * ffn 384), written out from the brief. Returns the count. */
static int expected_tiny(int bits, int group, int tied, spec *out) {
    const int V = 320, D = 128, L = 2, hd = 32, qd = 4 * 32, kvd = 2 * 32, F = 384;
    int n = 0, quant = bits == 4 || bits == 8;
    const char *fdt = bits == 32 ? "F32" : "BF16";
    static char names[200][96];
#define LIN(NN, KK, ...)                                                                   \
    do {                                                                                   \
        char base_[80];                                                                    \
        snprintf(base_, sizeof base_, __VA_ARGS__);                                        \
        snprintf(names[n], 96, "%s.weight", base_);                                        \
        out[n] = (spec){names[n], quant ? "U32" : fdt, 2, {NN, quant ? (KK) * bits / 32 : (KK)}}; \
        n++;                                                                               \
        if (quant) {                                                                       \
            snprintf(names[n], 96, "%s.scales", base_);                                    \
            out[n] = (spec){names[n], "BF16", 2, {NN, (KK) / group}};                      \
            n++;                                                                           \
            snprintf(names[n], 96, "%s.biases", base_);                                    \
            out[n] = (spec){names[n], "BF16", 2, {NN, (KK) / group}};                      \
            n++;                                                                           \
        }                                                                                  \
    } while (0)
#define NORM(DIM, ...)                                                                     \
    do {                                                                                   \
        snprintf(names[n], 96, __VA_ARGS__);                                               \
        out[n] = (spec){names[n], fdt, 1, {DIM, 0}};                                       \
        n++;                                                                               \
    } while (0)
    LIN(V, D, "model.embed_tokens");
    for (int i = 0; i < L; i++) {
        LIN(qd, D, "model.layers.%d.self_attn.q_proj", i);
        LIN(kvd, D, "model.layers.%d.self_attn.k_proj", i);
        LIN(kvd, D, "model.layers.%d.self_attn.v_proj", i);
        LIN(D, qd, "model.layers.%d.self_attn.o_proj", i);
        NORM(hd, "model.layers.%d.self_attn.q_norm.weight", i);
        NORM(hd, "model.layers.%d.self_attn.k_norm.weight", i);
        NORM(D, "model.layers.%d.input_layernorm.weight", i);
        NORM(D, "model.layers.%d.post_attention_layernorm.weight", i);
        LIN(F, D, "model.layers.%d.mlp.gate_proj", i);
        LIN(F, D, "model.layers.%d.mlp.up_proj", i);
        LIN(D, F, "model.layers.%d.mlp.down_proj", i);
    }
    NORM(D, "model.norm.weight");
    if (!tied) LIN(V, D, "lm_head");
#undef LIN
#undef NORM
    return n;
}

static const char *const FILES[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};

/* Remove the four model files and the directory. */
static void remove_model_dir(const char *dir) {
    char p[256];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, FILES[i]);
        unlink(p);
    }
    CHECK(rmdir(dir) == 0, "%s: not empty after removing the model files", dir);
}


/* Raw header checks independent of the reader: length, 8-byte aligned data start, metadata. */
static void check_raw_header(const char *dir) {
    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    size_t len = 0;
    char *buf = check_read_file(p, &len);
    CHECK(buf && len > 8, "%s: unreadable", p);
    if (!buf) return;
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | (unsigned char)buf[i];
    CHECK(h + 8 <= len && (h + 8) % 8 == 0, "header length %llu", (unsigned long long)h);
    if (h + 8 <= len) {
        json_error_t je;
        json_t *root = json_loadb(buf + 8, (size_t)h, 0, &je);
        CHECK(root != NULL, "header JSON: %s", je.text);
        json_t *fmt = json_object_get(json_object_get(root, "__metadata__"), "format");
        CHECK(json_is_string(fmt) && strcmp(json_string_value(fmt), "mlx") == 0, "metadata format");
        /* data region exactly covered: sizes add up to the file */
        unsigned long long total = 0;
        const char *k;
        json_t *v;
        json_object_foreach(root, k, v) {
            if (strcmp(k, "__metadata__") == 0) continue;
            json_t *o = json_object_get(v, "data_offsets");
            total += (unsigned long long)(json_integer_value(json_array_get(o, 1)) - json_integer_value(json_array_get(o, 0)));
            CHECK(json_integer_value(json_array_get(o, 0)) % 8 == 0, "%s: begin not 8-aligned", k);
        }
        CHECK(total == len - 8 - h, "data bytes %llu vs file %llu", total, (unsigned long long)(len - 8 - h));
        json_decref(root);
    }
    free(buf);
}

static char tmproot[64];
static int dir_counter;

/* Write a tiny model into a fresh directory under tmproot; returns the path (static storage, 8 slots). */
static const char *make(const char *preset, uint64_t seed, int bits, int group, int tied) {
    static char paths[8][128];
    char *d = paths[dir_counter % 8];
    snprintf(d, 128, "%s/m%d", tmproot, dir_counter++);
    ib_mkmodel_opts o = {.preset = preset, .seed = seed, .bits = bits, .group = group, .tied = tied};
    ib_error err = {0};
    ib_status st = ib_mkmodel(d, &o, &err);
    CHECK(st == IB_OK, "mkmodel %s bits %d group %d tied %d: %s", preset, bits, group, tied, err.msg);
    return st == IB_OK ? d : NULL;
}

static float elem(const ib_st_tensor *t, size_t i) {
    if (t->dtype == IB_DT_F32) return ((const float *)t->data)[i];
    return ib_bf16_to_f32(((const uint16_t *)t->data)[i]);
}

/* Mean of squares and extremes of a float tensor. */
static void stats(const ib_st_tensor *t, double *ms, float *mn, float *mx) {
    size_t n = t->nbytes / ib_dtype_size(t->dtype);
    double acc = 0;
    *mn = INFINITY; *mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float v = elem(t, i);
        acc += (double)v * v;
        if (v < *mn) *mn = v;
        if (v > *mx) *mx = v;
    }
    *ms = acc / (double)n;
}

static void check_layout(const char *dir, int bits, int group, int tied) {
    ib_st_set *s = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_st_open_dir(dir, &s, &err), IB_OK);
    if (!s) { fprintf(stderr, "open %s: %s\n", dir, err.msg); return; }
    static spec want[200];
    int n = expected_tiny(bits, group ? group : 64, tied, want);
    CHECK(ib_st_count(s) == n, "bits %d group %d tied %d: %d tensors, want %d", bits, group, tied, ib_st_count(s), n);
    for (int i = 0; i < n; i++) {
        const ib_st_tensor *t = ib_st_find(s, want[i].name);
        CHECK(t != NULL, "bits %d group %d: %s missing", bits, group, want[i].name);
        if (!t) continue;
        CHECK(strcmp(ib_dtype_name(t->dtype), want[i].dtype) == 0, "%s: dtype %s want %s", want[i].name,
              ib_dtype_name(t->dtype), want[i].dtype);
        CHECK(t->ndim == want[i].ndim && t->shape[0] == want[i].shape[0] &&
              (t->ndim == 1 || t->shape[1] == want[i].shape[1]),
              "%s: shape [%lld, %lld] want [%lld, %lld]", want[i].name, (long long)t->shape[0],
              (long long)(t->ndim > 1 ? t->shape[1] : -1), (long long)want[i].shape[0], (long long)want[i].shape[1]);
        CHECK(((uintptr_t)t->data & 7) == 0, "%s: data not 8-byte aligned", want[i].name);
    }
    /* float weights: statistics of the documented distributions */
    if (bits >= 16) {
        double ms; float mn, mx;
        const ib_st_tensor *t = ib_st_find(s, "model.embed_tokens.weight");
        if (t) {
            stats(t, &ms, &mn, &mx);
            /* uniform with std 1/sqrt(hidden = 128): range +-sqrt(3/128) ~ 0.153 */
            CHECK(fabs(ms * 128 - 1) < 0.05 && mn > -0.1535f && mx < 0.1535f && mn < -0.15f && mx > 0.15f,
                  "embedding: mean square * 128 = %g, range [%g, %g] (uniform, std 1/sqrt(128))", ms * 128, mn, mx);
        }
        t = ib_st_find(s, "model.layers.1.mlp.down_proj.weight");
        if (t) {
            stats(t, &ms, &mn, &mx);
            CHECK(fabs(ms * 384 - 1) < 0.05, "down_proj: mean square * fan_in %g", ms * 384);
            CHECK(mx <= sqrtf(3.0f / 384) * 1.01f, "down_proj max %g", mx);
        }
        t = ib_st_find(s, "model.layers.0.self_attn.q_proj.weight");
        if (t) {
            stats(t, &ms, &mn, &mx);
            CHECK(fabs(ms * 128 - 1) < 0.05, "q_proj: mean square * fan_in %g", ms * 128);
        }
    }
    const ib_st_tensor *t = ib_st_find(s, "model.layers.0.input_layernorm.weight");
    if (t) {
        double ms; float mn, mx;
        stats(t, &ms, &mn, &mx);
        CHECK(mn >= 0.898f && mx <= 1.102f && mx - mn > 0.15f, "norm range [%g, %g]", mn, mx);
    }
    ib_st_close(s);
}

/* The same seed's models agree: bf16 file = bf16 of the f32 file; the quantized file dequantizes
 * to within a step of the bf16 file and its edges are exact. */
static void check_consistency(const char *d32, const char *d16, const char *dq, int bits, int group) {
    ib_st_set *a = NULL, *b = NULL, *q = NULL;
    ib_error err = {0};
    if (ib_st_open_dir(d32, &a, &err) || ib_st_open_dir(d16, &b, &err) || ib_st_open_dir(dq, &q, &err)) {
        CHECK(0, "open: %s", err.msg);
        ib_st_close(a); ib_st_close(b); ib_st_close(q);
        return;
    }
    long mism = 0, far = 0, edge_bad = 0, n_el = 0;
    for (int i = 0; i < ib_st_count(a); i++) {
        const ib_st_tensor *ta = ib_st_at(a, i);
        const ib_st_tensor *tb = ib_st_find(b, ta->name);
        CHECK(tb != NULL, "%s missing in the 16-bit model", ta->name);
        if (!tb) continue;
        size_t n = ta->nbytes / 4;
        for (size_t k = 0; k < n; k++)
            if (ib_f32_to_bf16(((const float *)ta->data)[k]) != ((const uint16_t *)tb->data)[k]) mism++;
        if (ta->ndim != 2) {
            const ib_st_tensor *tq = ib_st_find(q, ta->name);
            CHECK(tq && tq->nbytes == tb->nbytes && memcmp(tq->data, tb->data, tb->nbytes) == 0,
                  "%s: norm differs between 16-bit and quantized models", ta->name);
            continue;
        }
        char base[128];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(ta->name) - strlen(".weight")), ta->name);
        char ns[160], nb[160];
        snprintf(ns, sizeof ns, "%s.scales", base);
        snprintf(nb, sizeof nb, "%s.biases", base);
        const ib_st_tensor *wq = ib_st_find(q, ta->name), *sc = ib_st_find(q, ns), *bi = ib_st_find(q, nb);
        CHECK(wq && sc && bi, "%s: quantized parts missing", base);
        if (!wq || !sc || !bi) continue;
        int N = (int)ta->shape[0], K = (int)ta->shape[1], G = K / group;
        for (int r = 0; r < N; r++)
            for (int g = 0; g < G; g++) {
                float S = ib_bf16_to_f32(((const uint16_t *)sc->data)[r * G + g]);
                float B = ib_bf16_to_f32(((const uint16_t *)bi->data)[r * G + g]);
                const uint16_t *wr = (const uint16_t *)tb->data + (size_t)r * K + (size_t)g * group;  /* [group] */
                int e = 0;          /* the edge: largest magnitude, the positive one on ties */
                for (int j = 0; j < group; j++) {
                    float w = ib_bf16_to_f32(wr[j]), we = ib_bf16_to_f32(wr[e]);
                    unsigned c = code_at(wq->data, K, bits, r, g * group + j);
                    float deq = S * (float)c + B;
                    n_el++;
                    if (!(fabsf(deq - w) <= fabsf(S) * 1.0001f)) far++;
                    if (fabsf(w) > fabsf(we) || (fabsf(w) == fabsf(we) && w > we)) e = j;
                }
                if (!(code_at(wq->data, K, bits, r, g * group + e) == 0 && B == ib_bf16_to_f32(wr[e]))) edge_bad++;
            }
    }
    CHECK(mism == 0, "%ld elements of the 16-bit model are not bf16 of the 32-bit model", mism);
    CHECK(far == 0, "%ld of %ld quantized elements further than one step from the bf16 weights", far, n_el);
    CHECK(edge_bad == 0, "%ld groups whose edge is not stored exactly", edge_bad);
    ib_st_close(a); ib_st_close(b); ib_st_close(q);
}

static void check_aux_files(const char *dir, int bits, int group, int tied) {
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", dir);
    ib_config c;
    ib_error err = {0};
    CHECK_EQ_INT(ib_config_load(p, &c, &err), IB_OK);
    if (err.code == IB_OK) {
        int quant = bits == 4 || bits == 8;
        CHECK(c.arch == IB_ARCH_QWEN3 && c.vocab_size == 320 && c.hidden_size == 128 && c.n_layers == 2 &&
              c.n_heads == 4 && c.n_kv_heads == 2 && c.head_dim == 32 && c.intermediate_size == 384 &&
              c.max_position == 2048, "config sizes");
        CHECK(c.rope_theta == 1e6 && c.rms_eps == 1e-6, "rope_theta %g rms_eps %g", c.rope_theta, c.rms_eps);
        CHECK(c.tie_embeddings == tied, "tie %d", c.tie_embeddings);
        CHECK(c.qk_norm == 1, "qk_norm");
        CHECK(c.quant_bits == (quant ? bits : 0), "quant bits %d", c.quant_bits);
        CHECK(!quant || c.quant_group == (group ? group : 64), "quant group %d", c.quant_group);
        CHECK(c.bos_id == -1 && c.eos_id == 258, "bos %d eos %d", c.bos_id, c.eos_id);
    } else {
        fprintf(stderr, "config: %s\n", err.msg);
    }
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    ib_tokenizer *t = NULL;
    CHECK_EQ_INT(ib_tokenizer_load(p, 320, &t, &err), IB_OK);
    if (t) {
        CHECK_EQ_INT(ib_tokenizer_special(t, "<|im_end|>"), 258);
        CHECK_EQ_INT(ib_tokenizer_special(t, "<|endoftext|>"), 256);
        int32_t id[2];
        CHECK(ib_tokenizer_encode(t, "A", 1, id, 2) == 1 && id[0] == 65, "A -> %d", id[0]);
        ib_tokenizer_free(t);
    }
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    CHECK(access(p, R_OK) == 0, "tokenizer_config.json missing");
    snprintf(p, sizeof p, "%s/model.safetensors.tmp", dir);
    CHECK(access(p, F_OK) != 0, "temporary file left behind");
}

static void test_models(void) {
    static const struct { int bits, group, tied; } cases[] = {
        {4, 32, 1}, {4, 64, 1}, {4, 128, 1}, {4, 0, 0}, {8, 32, 1}, {8, 64, 0}, {8, 128, 1},
        {16, 0, 1}, {16, 0, 0}, {32, 0, 1}, {32, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *d = make("tiny", 42, cases[i].bits, cases[i].group, cases[i].tied);
        if (!d) continue;
        check_layout(d, cases[i].bits, cases[i].group, cases[i].tied);
        check_raw_header(d);
        check_aux_files(d, cases[i].bits, cases[i].group, cases[i].tied);
        remove_model_dir(d);
    }

    /* one seed across bit widths (untied, so lm_head is covered too) */
    char d32[128], d16[128], d4[128], d8[128];
    const char *x;
    if ((x = make("tiny", 7, 32, 0, 0))) snprintf(d32, sizeof d32, "%s", x); else return;
    if ((x = make("tiny", 7, 16, 0, 0))) snprintf(d16, sizeof d16, "%s", x); else return;
    if ((x = make("tiny", 7, 4, 32, 0))) snprintf(d4, sizeof d4, "%s", x); else return;
    if ((x = make("tiny", 7, 8, 128, 0))) snprintf(d8, sizeof d8, "%s", x); else return;
    check_consistency(d32, d16, d4, 4, 32);
    check_consistency(d32, d16, d8, 8, 128);

    /* determinism */
    char d4b[128], d4c[128];
    if ((x = make("tiny", 7, 4, 32, 0))) snprintf(d4b, sizeof d4b, "%s", x); else return;
    if ((x = make("tiny", 8, 4, 32, 0))) snprintf(d4c, sizeof d4c, "%s", x); else return;
    for (int i = 0; i < 4; i++) CHECK(check_same_file(d4, d4b, FILES[i]), "same seed: %s differs", FILES[i]);
    CHECK(!check_same_file(d4, d4c, "model.safetensors"), "different seeds gave the same weights");
    CHECK(check_same_file(d4, d4c, "config.json"), "config depends on the seed");
    const char *all[] = {d32, d16, d4, d8, d4b, d4c};
    for (int i = 0; i < 6; i++) remove_model_dir(all[i]);
}

static void test_bad_options(void) {
    char d[128];
    snprintf(d, sizeof d, "%s/bad", tmproot);
    ib_error err = {0};
    ib_mkmodel_opts o = {.preset = "tiny", .seed = 1, .bits = 5};
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "bits") != NULL, "message: %s", err.msg);
    o.bits = 4; o.group = 48;
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "group") != NULL, "message: %s", err.msg);
    o.group = 0; o.preset = "qwen3-7b";
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "qwen3-7b") != NULL, "message: %s", err.msg);
    CHECK_EQ_INT(ib_mkmodel(d, NULL, &err), IB_ERR_INVALID_ARG);
    struct stat sb;
    CHECK(stat(d, &sb) != 0, "rejected options still created %s", d);
    /* a path below a regular file cannot be created */
    char f[160];
    snprintf(f, sizeof f, "%s/plainfile", tmproot);
    FILE *fp = fopen(f, "w");
    if (fp) fclose(fp);
    char sub[200];
    snprintf(sub, sizeof sub, "%s/m", f);
    o.preset = "tiny";
    CHECK_EQ_INT(ib_mkmodel(sub, &o, &err), IB_ERR_IO);
    unlink(f);
}

/* layers N: the preset's first N layers, every other shape unchanged; the same generator indices, so
 * the layers kept are bitwise those of the whole preset; the layer types are the preset's pattern over
 * N layers (the last one full); N above the preset's count refused. */
static void test_layers_cut(void) {
    char d2[128], d4[128], p[192];
    snprintf(d2, sizeof d2, "%s/cut2", tmproot);
    snprintf(d4, sizeof d4, "%s/cut4", tmproot);
    ib_error err = {0};
    ib_mkmodel_opts o = {.preset = "gemma4-moe-tiny", .seed = 3, .bits = 8, .tied = 1, .layers = 3};
    CHECK_EQ_INT(ib_mkmodel(d2, &o, &err), IB_OK);
    o.layers = 0;
    CHECK_EQ_INT(ib_mkmodel(d4, &o, &err), IB_OK);
    ib_config c;
    snprintf(p, sizeof p, "%s/config.json", d2);
    CHECK_EQ_INT(ib_config_load(p, &c, &err), IB_OK);
    CHECK(c.n_layers == 3 && c.hidden_size == 128 && c.n_experts == 8 && c.global_head_dim == 64 &&
              c.sliding_window == 16,
          "cut config: layers %d D %d experts %d ghd %d window %d", c.n_layers, c.hidden_size, c.n_experts,
          c.global_head_dim, c.sliding_window);
    CHECK(c.layer_sliding[0] == 1 && c.layer_sliding[1] == 0 && c.layer_sliding[2] == 0, "cut layer types %d %d %d",
          c.layer_sliding[0], c.layer_sliding[1], c.layer_sliding[2]);
    ib_st_set *a = NULL, *b = NULL;
    CHECK_EQ_INT(ib_st_open_dir(d2, &a, &err), IB_OK);
    CHECK_EQ_INT(ib_st_open_dir(d4, &b, &err), IB_OK);
    if (a && b) {
        static const char *const same[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                           "model.layers.1.experts.switch_glu.down_proj.scales",
                                           "model.layers.2.router.proj.weight", "model.layers.2.layer_scalar"};
        for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
            const ib_st_tensor *ta = ib_st_find(a, same[i]), *tb = ib_st_find(b, same[i]);
            CHECK(ta && tb && ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, ta->nbytes) == 0,
                  "%s differs between the cut and the whole preset", same[i]);
        }
        CHECK(ib_st_find(a, "model.layers.3.input_layernorm.weight") == NULL, "layer 3 written in a 3-layer cut");
    }
    ib_st_close(a);
    ib_st_close(b);
    remove_model_dir(d2);
    remove_model_dir(d4);
    char d[128];
    snprintf(d, sizeof d, "%s/cutbad", tmproot);
    o.layers = 5;
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "layers 5") != NULL, "message: %s", err.msg);
}

/* kv_shared N: the last N layers written without k_proj, v_proj, k_norm, config.json's
 * num_kv_shared_layers read back with each shared layer's source (the last earlier layer of its type);
 * counts with no source, or on a preset that is not gemma4, refused. */
static void test_kv_shared(void) {
    char d[128], p[192];
    snprintf(d, sizeof d, "%s/kvs", tmproot);
    ib_error err = {0};
    ib_mkmodel_opts o = {.preset = "gemma4-tiny", .seed = 2, .bits = 4, .tied = 1, .kv_shared = 2};
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_OK);
    ib_config c;
    snprintf(p, sizeof p, "%s/config.json", d);
    CHECK_EQ_INT(ib_config_load(p, &c, &err), IB_OK);
    CHECK(c.kv_shared == 2 && c.kv_from[0] == 0 && c.kv_from[1] == 0 && ib_config_kv_layer(&c, 2) == 0 &&
              ib_config_kv_layer(&c, 3) == 1,
          "kv sharing read back: %d, from %d %d %d %d", c.kv_shared, c.kv_from[0], c.kv_from[1], c.kv_from[2], c.kv_from[3]);
    ib_st_set *a = NULL;
    CHECK_EQ_INT(ib_st_open_dir(d, &a, &err), IB_OK);
    if (a) {
        CHECK(ib_st_find(a, "model.layers.1.self_attn.k_proj.weight") && ib_st_find(a, "model.layers.0.self_attn.v_proj.weight"),
              "layers 0, 1 lost their keys / values");
        CHECK(!ib_st_find(a, "model.layers.2.self_attn.k_proj.weight") && !ib_st_find(a, "model.layers.2.self_attn.v_proj.weight") &&
                  !ib_st_find(a, "model.layers.3.self_attn.k_norm.weight"),
              "a KV-shared layer has keys / values / k_norm");
        CHECK(ib_st_find(a, "model.layers.3.self_attn.q_proj.weight") && ib_st_find(a, "model.layers.3.self_attn.q_norm.weight"),
              "a KV-shared layer lost its queries");
        ib_st_close(a);
    }
    remove_model_dir(d);
    o.kv_shared = 3;   /* layer 1 (full) would have no earlier full layer */
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "layer 1") != NULL, "message: %s", err.msg);
    o.kv_shared = 4;
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
    o.preset = "tiny";
    o.kv_shared = 1;
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "not gemma4") != NULL, "message: %s", err.msg);
    /* per-layer embeddings: the table, the projection and its norm, each layer's block; config read back */
    o = (ib_mkmodel_opts){.preset = "gemma4-tiny", .seed = 2, .bits = 4, .tied = 1, .ple_dim = 64};
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_OK);
    CHECK_EQ_INT(ib_config_load(p, &c, &err), IB_OK);
    CHECK(c.ple_dim == 64 && c.kv_shared == 0, "ple_dim %d kv_shared %d", c.ple_dim, c.kv_shared);
    a = NULL;
    CHECK_EQ_INT(ib_st_open_dir(d, &a, &err), IB_OK);
    if (a) {
        const ib_st_tensor *t = ib_st_find(a, "model.embed_tokens_per_layer.weight");
        CHECK(t && t->shape[0] == 320 && t->shape[1] == 4 * 64 * 4 / 32, "embed_tokens_per_layer shape");
        CHECK(ib_st_find(a, "model.per_layer_model_projection.scales") && ib_st_find(a, "model.per_layer_projection_norm.weight") &&
                  ib_st_find(a, "model.layers.3.per_layer_input_gate.weight") &&
                  ib_st_find(a, "model.layers.3.per_layer_projection.biases") &&
                  ib_st_find(a, "model.layers.0.post_per_layer_input_norm.weight"),
              "per-layer embedding tensors missing");
        ib_st_close(a);
    }
    remove_model_dir(d);
    o.ple_dim = 32;   /* 4-bit, group 64: per_layer_projection's input would not be whole groups */
    CHECK_EQ_INT(ib_mkmodel(d, &o, &err), IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "quantization group") != NULL, "message: %s", err.msg);
}

/* The large preset: memory stays bounded (streamed); timed. Only with IB_TEST_BIG=1. */
static void test_big(void) {
    const char *env = getenv("IB_TEST_BIG");
    if (!env || !*env || *env == '0') return;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const char *d = make("qwen3-0.6b", 1, 4, 64, 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!d) return;
    printf("qwen3-0.6b 4-bit written in %.2f s\n", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    ib_st_set *s = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_st_open_dir(d, &s, &err), IB_OK);
    if (s) {
        CHECK_EQ_INT(ib_st_count(s), 3 + 28 * (7 * 3 + 4) + 1);
        const ib_st_tensor *t = ib_st_find(s, "model.embed_tokens.weight");
        CHECK(t && t->shape[0] == 151936 && t->shape[1] == 1024 / 8, "embedding shape");
        printf("qwen3-0.6b 4-bit: %zu bytes\n", ib_st_total_bytes(s));
        ib_st_close(s);
    }
    remove_model_dir(d);
}

int main(void) {
    snprintf(tmproot, sizeof tmproot, "/tmp/ib_mkmodel_XXXXXX");
    if (!mkdtemp(tmproot)) { perror("mkdtemp"); return 2; }
    test_quantize_hand();
    test_quantize_random();
    test_models();
    test_bad_options();
    test_layers_cut();
    test_kv_shared();
    test_big();
    CHECK(rmdir(tmproot) == 0, "%s not empty at the end", tmproot);
    TEST_MAIN_END("test_mkmodel");
}
