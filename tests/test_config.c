/*
 * test_config.c — config.json parsing and validation: a real Qwen3 config and a minimal Llama one
 * with defaults, every rejected input (status code and the file/field named in the message), and
 * ib_config_save -> ib_config_load round trips. Files live in a fresh mkdtemp directory under /tmp
 * that is removed at the end.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "model/config.h"

static char g_dir[64];
static char g_path[128]; /* g_dir/config.json */

/* Shaped like Qwen/Qwen3-0.6B's config.json (values typed by hand). */
static const char *const QWEN3 =
    "{\n"
    "  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
    "  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 151643,\n"
    "  \"eos_token_id\": 151645,\n"
    "  \"head_dim\": 128,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 1024,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 3072,\n"
    "  \"max_position_embeddings\": 40960,\n"
    "  \"max_window_layers\": 28,\n"
    "  \"model_type\": \"qwen3\",\n"
    "  \"num_attention_heads\": 16,\n"
    "  \"num_hidden_layers\": 28,\n"
    "  \"num_key_value_heads\": 8,\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000,\n"
    "  \"sliding_window\": null,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.51.0\",\n"
    "  \"use_cache\": true,\n"
    "  \"use_sliding_window\": false,\n"
    "  \"vocab_size\": 151936\n"
    "}\n";

/* Only the required fields: everything else takes its default. */
static const char *const LLAMA_MIN =
    "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 64, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"intermediate_size\": 128}";

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(s, f);
    fclose(f);
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* Load `text` as config.json and expect failure with `code` and the substrings in the message. */
static void expect_fail_text(const char *text, ib_status code, const char *s1, const char *s2) {
    write_text(g_path, text);
    ib_config c;
    memset(&c, 0x5a, sizeof c);
    ib_config before = c;
    ib_error err = {0};
    ib_status st = ib_config_load(g_path, &c, &err);
    CHECK(st == code, "status %d (%s), want %d; msg: %s; text: %.200s", st, ib_strerror(st), code,
          err.msg, text);
    CHECK(contains(err.msg, g_path), "msg lacks path: %s", err.msg);
    if (s1) CHECK(contains(err.msg, s1), "msg lacks \"%s\": %s", s1, err.msg);
    if (s2) CHECK(contains(err.msg, s2), "msg lacks \"%s\": %s", s2, err.msg);
    CHECK(!memcmp(&c, &before, sizeof c), "out changed on failure");
}

/* QWEN3 with `key` set to the JSON `value` (NULL: removed), then expect failure. */
static void expect_fail_edit(const char *key, const char *value, ib_status code, const char *s1,
                             const char *s2) {
    json_error_t jerr;
    json_t *o = json_loads(QWEN3, 0, &jerr);
    if (!o) {
        fprintf(stderr, "base config: %s\n", jerr.text);
        exit(2);
    }
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, &jerr);
        if (!v) {
            fprintf(stderr, "value %s: %s\n", value, jerr.text);
            exit(2);
        }
        json_object_set_new(o, key, v);
    } else {
        json_object_del(o, key);
    }
    char *text = json_dumps(o, JSON_INDENT(2));
    expect_fail_text(text, code, s1, s2);
    free(text);
    json_decref(o);
}

/* Load QWEN3 edited like expect_fail_edit, expecting success. */
static ib_status load_edit(const char *key, const char *value, ib_config *c, ib_error *err) {
    json_error_t jerr;
    json_t *o = json_loads(QWEN3, 0, &jerr);
    if (value)
        json_object_set_new(o, key, json_loads(value, JSON_DECODE_ANY, &jerr));
    else
        json_object_del(o, key);
    char *text = json_dumps(o, JSON_INDENT(2));
    write_text(g_path, text);
    free(text);
    json_decref(o);
    return ib_config_load(g_path, c, err);
}

static void test_valid(void) {
    ib_config c;
    ib_error err = {0};
    write_text(g_path, QWEN3);
    CHECK_EQ_INT(ib_config_load(g_path, &c, &err), IB_OK);
    CHECK_EQ_INT(c.arch, IB_ARCH_QWEN3);
    CHECK_EQ_INT(c.qk_norm, 1);
    CHECK_EQ_INT(c.vocab_size, 151936);
    CHECK_EQ_INT(c.hidden_size, 1024);
    CHECK_EQ_INT(c.n_layers, 28);
    CHECK_EQ_INT(c.n_heads, 16);
    CHECK_EQ_INT(c.n_kv_heads, 8);
    CHECK_EQ_INT(c.head_dim, 128);
    CHECK_EQ_INT(c.intermediate_size, 3072);
    CHECK_EQ_INT(c.max_position, 40960);
    CHECK(c.rope_theta == 1000000.0, "rope_theta %g", c.rope_theta);
    CHECK(c.rms_eps == 1e-6, "rms_eps %g", c.rms_eps);
    CHECK_EQ_INT(c.tie_embeddings, 1);
    CHECK_EQ_INT(c.quant_bits, 0);
    CHECK_EQ_INT(c.quant_group, 0);
    CHECK_EQ_INT(c.bos_id, 151643);
    CHECK_EQ_INT(c.eos_id, 151645);

    write_text(g_path, LLAMA_MIN);
    CHECK_EQ_INT(ib_config_load(g_path, &c, &err), IB_OK);
    CHECK_EQ_INT(c.arch, IB_ARCH_LLAMA);
    CHECK_EQ_INT(c.qk_norm, 0);
    CHECK_EQ_INT(c.n_kv_heads, 4);   /* = n_heads */
    CHECK_EQ_INT(c.head_dim, 16);    /* 64 / 4 */
    CHECK_EQ_INT(c.max_position, 2048);
    CHECK(c.rope_theta == 10000.0, "rope_theta %g", c.rope_theta);
    CHECK(c.rms_eps == 1e-6, "rms_eps %g", c.rms_eps);
    CHECK_EQ_INT(c.tie_embeddings, 0);
    CHECK_EQ_INT(c.bos_id, -1);
    CHECK_EQ_INT(c.eos_id, -1);
    CHECK_EQ_INT(c.quant_bits, 0);

    /* eos as a list takes the first; null bos is -1; a real rope_theta is fine */
    CHECK_EQ_INT(load_edit("eos_token_id", "[151645, 151643]", &c, &err), IB_OK);
    CHECK_EQ_INT(c.eos_id, 151645);
    CHECK_EQ_INT(load_edit("bos_token_id", "null", &c, &err), IB_OK);
    CHECK_EQ_INT(c.bos_id, -1);
    CHECK_EQ_INT(load_edit("rope_theta", "500000.0", &c, &err), IB_OK);
    CHECK(c.rope_theta == 500000.0, "%g", c.rope_theta);
    CHECK_EQ_INT(load_edit("architectures", NULL, &c, &err), IB_OK);

    /* quantization (mlx-lm) and quantization_config alone, and both agreeing */
    CHECK_EQ_INT(load_edit("quantization", "{\"group_size\": 64, \"bits\": 4}", &c, &err), IB_OK);
    CHECK_EQ_INT(c.quant_bits, 4);
    CHECK_EQ_INT(c.quant_group, 64);
    CHECK_EQ_INT(load_edit("quantization_config", "{\"group_size\": 128, \"bits\": 8}", &c, &err), IB_OK);
    CHECK_EQ_INT(c.quant_bits, 8);
    CHECK_EQ_INT(c.quant_group, 128);
    {
        char *t = malloc(strlen(QWEN3) + 200);
        strcpy(t, QWEN3);
        strcpy(strrchr(t, '}'), ", \"quantization\": {\"group_size\": 32, \"bits\": 4},"
                                " \"quantization_config\": {\"group_size\": 32, \"bits\": 4}}");
        write_text(g_path, t);
        CHECK_EQ_INT(ib_config_load(g_path, &c, &err), IB_OK);
        CHECK_EQ_INT(c.quant_bits, 4);
        CHECK_EQ_INT(c.quant_group, 32);
        strcpy(t, QWEN3);
        strcpy(strrchr(t, '}'), ", \"quantization\": {\"group_size\": 32, \"bits\": 4},"
                                " \"quantization_config\": {\"group_size\": 64, \"bits\": 4}}");
        expect_fail_text(t, IB_ERR_MODEL, "quantization_config", "disagree");
        free(t);
    }
}

static void test_bad(void) {
    ib_config c;
    ib_error err = {0};
    CHECK_EQ_INT(ib_config_load("/tmp/ib_no_such_dir_x/config.json", &c, &err), IB_ERR_IO);
    CHECK(contains(err.msg, "/tmp/ib_no_such_dir_x/config.json"), "%s", err.msg);

    expect_fail_text("{\"model_type\": \"qwen3\",\n  \"vocab_size\": }", IB_ERR_FORMAT, "line 2",
                     "column");
    expect_fail_text("", IB_ERR_FORMAT, "not valid JSON", NULL);
    expect_fail_text("[1, 2, 3]", IB_ERR_FORMAT, "expected a JSON object", NULL);
    expect_fail_text("\"qwen3\"", IB_ERR_FORMAT, NULL, NULL);

    static const char *const required[] = {"model_type", "vocab_size", "hidden_size",
                                           "num_hidden_layers", "num_attention_heads",
                                           "intermediate_size"};
    for (int i = 0; i < 6; i++) {
        char want[80];
        snprintf(want, sizeof want, "field %s: missing", required[i]);
        expect_fail_edit(required[i], NULL, IB_ERR_FORMAT, want, NULL);
    }

    /* wrong types */
    static const char *const ints[] = {"vocab_size", "hidden_size", "num_hidden_layers",
                                       "num_attention_heads", "intermediate_size",
                                       "num_key_value_heads", "head_dim", "max_position_embeddings"};
    for (int i = 0; i < 8; i++) {
        char want[80];
        snprintf(want, sizeof want, "field %s: expected an integer", ints[i]);
        expect_fail_edit(ints[i], "\"1024\"", IB_ERR_FORMAT, want, NULL);
        expect_fail_edit(ints[i], "1024.0", IB_ERR_FORMAT, want, NULL);
        expect_fail_edit(ints[i], "true", IB_ERR_FORMAT, want, NULL);
        snprintf(want, sizeof want, "field %s: 0 not in", ints[i]);
        expect_fail_edit(ints[i], "0", IB_ERR_FORMAT, want, NULL);
        snprintf(want, sizeof want, "field %s: -8 not in", ints[i]);
        expect_fail_edit(ints[i], "-8", IB_ERR_FORMAT, want, NULL);
    }
    expect_fail_edit("vocab_size", "16777217", IB_ERR_FORMAT, "field vocab_size", "not in");
    expect_fail_edit("hidden_size", "65537", IB_ERR_FORMAT, "field hidden_size", "not in");
    expect_fail_edit("head_dim", "1024", IB_ERR_FORMAT, "field head_dim", "not in");
    expect_fail_text("{\"model_type\": \"qwen3\", \"hidden_size\": 99999999999999999999}", IB_ERR_FORMAT,
                     "not valid JSON", NULL);
    expect_fail_edit("model_type", "3", IB_ERR_FORMAT, "field model_type: expected a string", NULL);
    expect_fail_edit("rope_theta", "\"big\"", IB_ERR_FORMAT, "field rope_theta: expected a number", NULL);
    expect_fail_edit("rope_theta", "0", IB_ERR_FORMAT, "field rope_theta", NULL);
    expect_fail_edit("rms_norm_eps", "-1e-6", IB_ERR_FORMAT, "field rms_norm_eps", NULL);
    expect_fail_edit("tie_word_embeddings", "1", IB_ERR_FORMAT, "field tie_word_embeddings", NULL);
    expect_fail_edit("attention_bias", "\"no\"", IB_ERR_FORMAT, "field attention_bias", NULL);
    expect_fail_edit("eos_token_id", "\"</s>\"", IB_ERR_FORMAT, "field eos_token_id", NULL);
    expect_fail_edit("eos_token_id", "[1, \"x\"]", IB_ERR_FORMAT, "field eos_token_id[1]", NULL);
    expect_fail_edit("bos_token_id", "151936", IB_ERR_MODEL, "field bos_token_id", NULL);
    expect_fail_edit("architectures", "\"Qwen3ForCausalLM\"", IB_ERR_FORMAT, "field architectures", NULL);
    expect_fail_edit("architectures", "[\"LlamaForCausalLM\"]", IB_ERR_MODEL, "field architectures",
                     "LlamaForCausalLM");

    /* unsupported features */
    expect_fail_edit("model_type", "\"mistral\"", IB_ERR_UNSUPPORTED, "field model_type", "\"mistral\"");
    expect_fail_edit("rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", IB_ERR_UNSUPPORTED,
                     "field rope_scaling: not supported", NULL);
    expect_fail_edit("attention_bias", "true", IB_ERR_UNSUPPORTED, "field attention_bias", NULL);
    expect_fail_edit("mlp_bias", "true", IB_ERR_UNSUPPORTED, "field mlp_bias", NULL);
    expect_fail_edit("use_sliding_window", "true", IB_ERR_UNSUPPORTED, "field use_sliding_window", NULL);
    expect_fail_edit("hidden_act", "\"gelu\"", IB_ERR_UNSUPPORTED, "field hidden_act", NULL);

    /* quantization */
    expect_fail_edit("quantization", "{\"group_size\": 64, \"bits\": 3}", IB_ERR_UNSUPPORTED,
                     "field quantization.bits: 3", NULL);
    expect_fail_edit("quantization", "{\"group_size\": 16, \"bits\": 4}", IB_ERR_UNSUPPORTED,
                     "field quantization.group_size: 16", NULL);
    expect_fail_edit("quantization_config", "{\"group_size\": 64, \"bits\": 2}", IB_ERR_UNSUPPORTED,
                     "field quantization_config.bits", NULL);
    expect_fail_edit("quantization", "{\"group_size\": 64}", IB_ERR_FORMAT,
                     "field quantization.bits: missing", NULL);
    expect_fail_edit("quantization", "{\"bits\": 4}", IB_ERR_FORMAT,
                     "field quantization.group_size: missing", NULL);
    expect_fail_edit("quantization", "{\"group_size\": \"64\", \"bits\": 4}", IB_ERR_FORMAT,
                     "field quantization.group_size: expected an integer", NULL);
    expect_fail_edit("quantization", "4", IB_ERR_FORMAT, "field quantization: expected an object", NULL);
    expect_fail_edit("quantization_config",
                     "{\"quant_method\": \"gptq\", \"group_size\": 128, \"bits\": 4}",
                     IB_ERR_UNSUPPORTED, "quant_method", "gptq");
    expect_fail_edit("quantization",
                     "{\"group_size\": 64, \"bits\": 4, \"model.layers.0.mlp.down_proj\": "
                     "{\"group_size\": 64, \"bits\": 8}}",
                     IB_ERR_UNSUPPORTED, "model.layers.0.mlp.down_proj", NULL);
    /* intermediate_size 3072 is not a multiple of 128 after this edit: 3000 */
    {
        json_error_t jerr;
        json_t *o = json_loads(QWEN3, 0, &jerr);
        json_object_set_new(o, "intermediate_size", json_integer(3000));
        json_object_set_new(o, "quantization", json_pack("{s:i,s:i}", "group_size", 64, "bits", 4));
        char *t = json_dumps(o, 0);
        expect_fail_text(t, IB_ERR_MODEL, "field intermediate_size: 3000", "group_size 64");
        free(t);
        /* n_heads * head_dim = 16 * 36 = 576, not a multiple of 128 */
        json_object_set_new(o, "intermediate_size", json_integer(3072));
        json_object_set_new(o, "head_dim", json_integer(36));
        json_object_set_new(o, "quantization", json_pack("{s:i,s:i}", "group_size", 128, "bits", 4));
        t = json_dumps(o, 0);
        expect_fail_text(t, IB_ERR_MODEL, "num_attention_heads*head_dim: 576", NULL);
        free(t);
        json_decref(o);
    }

    /* shapes that contradict each other */
    expect_fail_edit("num_key_value_heads", "5", IB_ERR_MODEL, "field num_key_value_heads", "16");
    expect_fail_edit("head_dim", "63", IB_ERR_FORMAT, "field head_dim", "odd");
    {
        /* head_dim absent and hidden_size not divisible by n_heads */
        json_error_t jerr;
        json_t *o = json_loads(QWEN3, 0, &jerr);
        json_object_del(o, "head_dim");
        json_object_set_new(o, "hidden_size", json_integer(1000));
        json_object_set_new(o, "num_attention_heads", json_integer(24));
        json_object_set_new(o, "num_key_value_heads", json_integer(8));
        char *t = json_dumps(o, 0);
        expect_fail_text(t, IB_ERR_MODEL, "field head_dim", "1000");
        free(t);
        json_decref(o);
    }
    /* duplicate keys */
    expect_fail_text("{\"model_type\": \"qwen3\", \"model_type\": \"llama\"}", IB_ERR_FORMAT,
                     "duplicate", NULL);
}

static int cfg_equal(const ib_config *a, const ib_config *b) {
    return a->arch == b->arch && a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
           a->n_layers == b->n_layers && a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->intermediate_size == b->intermediate_size &&
           a->max_position == b->max_position && a->rope_theta == b->rope_theta &&
           a->rms_eps == b->rms_eps && a->tie_embeddings == b->tie_embeddings &&
           a->qk_norm == b->qk_norm && a->quant_bits == b->quant_bits &&
           a->quant_group == b->quant_group && a->bos_id == b->bos_id && a->eos_id == b->eos_id;
}

static void test_round_trip(void) {
    ib_config a = {
        .arch = IB_ARCH_QWEN3, .vocab_size = 1000, .hidden_size = 256, .n_layers = 3, .n_heads = 8,
        .n_kv_heads = 2, .head_dim = 64, .intermediate_size = 640, .max_position = 4096,
        .rope_theta = 1000000.0, .rms_eps = 1e-6, .tie_embeddings = 1, .qk_norm = 1,
        .quant_bits = 4, .quant_group = 64, .bos_id = -1, .eos_id = 7,
    };
    ib_config b = {
        .arch = IB_ARCH_LLAMA, .vocab_size = 300, .hidden_size = 96, .n_layers = 1, .n_heads = 6,
        .n_kv_heads = 6, .head_dim = 16, .intermediate_size = 200, .max_position = 77,
        .rope_theta = 12345.678901234567, .rms_eps = 0.1 + 0.2, .tie_embeddings = 0, .qk_norm = 0,
        .quant_bits = 0, .quant_group = 0, .bos_id = 0, .eos_id = 299,
    };
    const ib_config *cs[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        ib_config got;
        ib_error err = {0};
        CHECK_EQ_INT(ib_config_save(cs[i], g_path, &err), IB_OK);
        CHECK_EQ_INT(ib_config_load(g_path, &got, &err), IB_OK);
        CHECK(cfg_equal(cs[i], &got), "round trip %d differs (%s)", i, err.msg);
        CHECK(got.rms_eps == cs[i]->rms_eps && got.rope_theta == cs[i]->rope_theta,
              "reals %.17g %.17g", got.rms_eps, got.rope_theta);
        char tmp[200];
        snprintf(tmp, sizeof tmp, "%s.tmp", g_path);
        CHECK(access(tmp, F_OK) != 0, "tmp left behind");

        /* the written JSON has the fields mlx-lm writes */
        json_error_t jerr;
        json_t *o = json_load_file(g_path, 0, &jerr);
        CHECK(o != NULL, "saved file is JSON: %s", jerr.text);
        if (!o) continue;
        const char *arch = json_string_value(json_array_get(json_object_get(o, "architectures"), 0));
        CHECK(arch && !strcmp(arch, i == 0 ? "Qwen3ForCausalLM" : "LlamaForCausalLM"), "arch %s",
              arch ? arch : "(null)");
        CHECK(!strcmp(json_string_value(json_object_get(o, "model_type")), i == 0 ? "qwen3" : "llama"),
              "model_type");
        CHECK(!strcmp(json_string_value(json_object_get(o, "hidden_act")), "silu"), "hidden_act");
        CHECK(!strcmp(json_string_value(json_object_get(o, "torch_dtype")), "bfloat16"), "torch_dtype");
        CHECK(json_is_boolean(json_object_get(o, "tie_word_embeddings")), "tie bool");
        CHECK(json_is_real(json_object_get(o, "rope_theta")), "rope_theta real");
        if (i == 0) {
            json_t *q = json_object_get(o, "quantization"), *qc = json_object_get(o, "quantization_config");
            CHECK(q && qc, "both quantization objects");
            CHECK_EQ_INT(json_integer_value(json_object_get(q, "bits")), 4);
            CHECK_EQ_INT(json_integer_value(json_object_get(q, "group_size")), 64);
            CHECK_EQ_INT(json_integer_value(json_object_get(qc, "bits")), 4);
            CHECK_EQ_INT(json_integer_value(json_object_get(qc, "group_size")), 64);
            CHECK(json_object_get(o, "bos_token_id") == NULL, "bos absent when -1");
            CHECK_EQ_INT(json_integer_value(json_object_get(o, "eos_token_id")), 7);
        } else {
            CHECK(json_object_get(o, "quantization") == NULL &&
                      json_object_get(o, "quantization_config") == NULL,
                  "no quantization");
            CHECK_EQ_INT(json_integer_value(json_object_get(o, "bos_token_id")), 0);
        }
        json_decref(o);
    }
    /* saving into a missing directory fails with IB_ERR_IO */
    ib_error err = {0};
    CHECK_EQ_INT(ib_config_save(&a, "/tmp/ib_no_such_dir_x/config.json", &err), IB_ERR_IO);
    CHECK(contains(err.msg, "/tmp/ib_no_such_dir_x/config.json"), "%s", err.msg);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ib_test_cfg_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 2;
    }
    snprintf(g_path, sizeof g_path, "%s/config.json", g_dir);
    test_valid();
    test_bad();
    test_round_trip();
    unlink(g_path);
    CHECK_EQ_INT(rmdir(g_dir), 0);
    TEST_MAIN_END("test_config");
}
