/*
 * config.c — config.json (Hugging Face / MLX fields) parsed, validated and written.
 *
 * Error codes: IB_ERR_IO (cannot open/write), IB_ERR_FORMAT (not JSON, a field missing, of the
 * wrong type or out of range), IB_ERR_MODEL (fields that contradict each other),
 * IB_ERR_UNSUPPORTED (a valid feature isobatch does not implement).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "model/config.h"

/* Default context length when max_position_embeddings is absent. */
#define CFG_DEFAULT_MAX_POSITION 2048

/* A JSON null counts as absent for optional fields. */
static json_t *get_opt(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* Read integer field `key` into *out, within [lo, hi]. Absent: *out = dflt when `required` is 0,
 * else an error. */
static ib_status get_int(const char *path, json_t *o, const char *key, int required, int dflt,
                         long long lo, long long hi, int *out, ib_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || (!required && json_is_null(v))) {
        if (required) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: missing", path, key);
        *out = dflt;
        return IB_OK;
    }
    if (!json_is_integer(v))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: expected an integer", path, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: %lld not in [%lld, %lld]", path, key, x, lo,
                       hi);
    *out = (int)x;
    return IB_OK;
}

/* Read an optional positive finite number (integer or real) into *out, default dflt. */
static ib_status get_pos_number(const char *path, json_t *o, const char *key, double dflt,
                                double *out, ib_error *err) {
    json_t *v = get_opt(o, key);
    if (!v) {
        *out = dflt;
        return IB_OK;
    }
    if (!json_is_number(v))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: expected a number", path, key);
    double x = json_number_value(v);
    if (!(x > 0) || !isfinite(x))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: %g is not a positive number", path, key, x);
    *out = x;
    return IB_OK;
}

/* Read an optional boolean into *out, default dflt. */
static ib_status get_bool(const char *path, json_t *o, const char *key, int dflt, int *out,
                          ib_error *err) {
    json_t *v = get_opt(o, key);
    if (!v) {
        *out = dflt;
        return IB_OK;
    }
    if (!json_is_boolean(v))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: expected true or false", path, key);
    *out = json_is_true(v);
    return IB_OK;
}

/* bos/eos: an integer, a list of integers (the first is used; empty = none), or absent/null (-1).
 * Ids must be in [0, vocab). */
static ib_status get_token_id(const char *path, json_t *o, const char *key, int vocab, int *out,
                              ib_error *err) {
    json_t *v = get_opt(o, key);
    *out = -1;
    if (!v) return IB_OK;
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            if (!json_is_integer(x))
                return ib_fail(err, IB_ERR_FORMAT, "%s: field %s[%zu]: expected an integer", path, key,
                               i);
        }
        if (json_array_size(v) == 0) return IB_OK;
        v = json_array_get(v, 0);
    } else if (!json_is_integer(v)) {
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: expected an integer or a list of integers",
                       path, key);
    }
    long long id = json_integer_value(v);
    if (id < 0 || id >= vocab)
        return ib_fail(err, IB_ERR_MODEL, "%s: field %s: token id %lld not in the vocabulary [0, %d)",
                       path, key, id, vocab);
    *out = (int)id;
    return IB_OK;
}

/* Parse one quantization object `q` (field name `key`) into bits/group. */
static ib_status get_quant(const char *path, const char *key, json_t *q, int *bits, int *group,
                           ib_error *err) {
    if (!json_is_object(q))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: expected an object", path, key);
    json_t *m = get_opt(q, "quant_method");
    if (m)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.quant_method: \"%s\" not supported (MLX "
                       "affine quantization only)",
                       path, key, json_is_string(m) ? json_string_value(m) : "?");
    m = get_opt(q, "mode");
    if (m && (!json_is_string(m) || strcmp(json_string_value(m), "affine") != 0))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.mode: \"%s\" not supported (affine only)",
                       path, key, json_is_string(m) ? json_string_value(m) : "?");
    const char *k;
    json_t *v;
    json_object_foreach(q, k, v) {
        if (json_is_object(v) || json_is_boolean(v))
            return ib_fail(err, IB_ERR_UNSUPPORTED,
                           "%s: field %s.%s: per-layer quantization not supported", path, key, k);
    }
    json_t *b = json_object_get(q, "bits"), *g = json_object_get(q, "group_size");
    if (!b) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.bits: missing", path, key);
    if (!json_is_integer(b))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.bits: expected an integer", path, key);
    if (!g) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.group_size: missing", path, key);
    if (!json_is_integer(g))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.group_size: expected an integer", path, key);
    long long bv = json_integer_value(b), gv = json_integer_value(g);
    if (bv != 4 && bv != 8)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.bits: %lld not supported (4 or 8)", path,
                       key, bv);
    if (gv != 32 && gv != 64 && gv != 128)
        return ib_fail(err, IB_ERR_UNSUPPORTED,
                       "%s: field %s.group_size: %lld not supported (32, 64 or 128)", path, key, gv);
    *bits = (int)bv;
    *group = (int)gv;
    return IB_OK;
}

static ib_status parse_gemma4(const char *path, json_t *top, ib_config *c, ib_error *err);

/* All fields of the top-level object `o` into *c (path names the file in messages). */
static ib_status parse_config(const char *path, json_t *o, ib_config *c, ib_error *err) {
    ib_status st;
    memset(c, 0, sizeof *c);

    json_t *mt = json_object_get(o, "model_type");
    if (!mt) return ib_fail(err, IB_ERR_FORMAT, "%s: field model_type: missing", path);
    if (!json_is_string(mt))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field model_type: expected a string", path);
    const char *mts = json_string_value(mt), *arch_name;
    if (strcmp(mts, "gemma4_text") == 0 || strcmp(mts, "gemma4") == 0) return parse_gemma4(path, o, c, err);
    if (strcmp(mts, "qwen3") == 0) {
        c->arch = IB_ARCH_QWEN3;
        c->qk_norm = 1;
        arch_name = "Qwen3ForCausalLM";
    } else if (strcmp(mts, "llama") == 0) {
        c->arch = IB_ARCH_LLAMA;
        c->qk_norm = 0;
        arch_name = "LlamaForCausalLM";
    } else {
        return ib_fail(err, IB_ERR_UNSUPPORTED,
                       "%s: field model_type: \"%s\" not supported (qwen3, llama, gemma4_text or gemma4)", path, mts);
    }
    json_t *ar = get_opt(o, "architectures");
    if (ar) {
        if (!json_is_array(ar))
            return ib_fail(err, IB_ERR_FORMAT, "%s: field architectures: expected a list of strings",
                           path);
        int found = 0;
        size_t i;
        json_t *x;
        json_array_foreach(ar, i, x) {
            if (!json_is_string(x))
                return ib_fail(err, IB_ERR_FORMAT, "%s: field architectures[%zu]: expected a string",
                               path, i);
            found |= strcmp(json_string_value(x), arch_name) == 0;
        }
        if (!found && json_array_size(ar) > 0)
            return ib_fail(err, IB_ERR_MODEL,
                           "%s: field architectures: \"%s\" does not match model_type %s (%s)", path,
                           json_string_value(json_array_get(ar, 0)), mts, arch_name);
    }

    if ((st = get_int(path, o, "vocab_size", 1, 0, 1, 1 << 24, &c->vocab_size, err)) ||
        (st = get_int(path, o, "hidden_size", 1, 0, 1, 65536, &c->hidden_size, err)) ||
        (st = get_int(path, o, "num_hidden_layers", 1, 0, 1, 4096, &c->n_layers, err)) ||
        (st = get_int(path, o, "num_attention_heads", 1, 0, 1, 4096, &c->n_heads, err)) ||
        (st = get_int(path, o, "intermediate_size", 1, 0, 1, 1 << 20, &c->intermediate_size, err)) ||
        (st = get_int(path, o, "num_key_value_heads", 0, c->n_heads, 1, 4096, &c->n_kv_heads, err)) ||
        (st = get_int(path, o, "max_position_embeddings", 0, CFG_DEFAULT_MAX_POSITION, 1, 1 << 24,
                      &c->max_position, err)))
        return st;
    if (c->n_heads % c->n_kv_heads != 0)
        return ib_fail(err, IB_ERR_MODEL,
                       "%s: field num_key_value_heads: num_attention_heads %d is not a multiple of %d",
                       path, c->n_heads, c->n_kv_heads);
    if (!get_opt(o, "head_dim") && c->hidden_size % c->n_heads != 0)
        return ib_fail(err, IB_ERR_MODEL,
                       "%s: field head_dim: absent and hidden_size %d is not a multiple of "
                       "num_attention_heads %d",
                       path, c->hidden_size, c->n_heads);
    if ((st = get_int(path, o, "head_dim", 0, c->hidden_size / c->n_heads, 1, 512, &c->head_dim, err)))
        return st;
    if (c->head_dim % 2 != 0)
        return ib_fail(err, IB_ERR_FORMAT, "%s: field head_dim: %d is odd (rotary needs pairs)", path,
                       c->head_dim);

    if ((st = get_pos_number(path, o, "rope_theta", 10000.0, &c->rope_theta, err)) ||
        (st = get_pos_number(path, o, "rms_norm_eps", 1e-6, &c->rms_eps, err)) ||
        (st = get_bool(path, o, "tie_word_embeddings", 0, &c->tie_embeddings, err)))
        return st;

    if (get_opt(o, "rope_scaling"))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field rope_scaling: not supported", path);
    static const char *const no_bias[] = {"attention_bias", "mlp_bias", "use_sliding_window"};
    for (int i = 0; i < 3; i++) {
        int on;
        if ((st = get_bool(path, o, no_bias[i], 0, &on, err))) return st;
        if (on) return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s: true not supported", path, no_bias[i]);
    }
    json_t *act = get_opt(o, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field hidden_act: \"%s\" not supported (silu)",
                       path, json_is_string(act) ? json_string_value(act) : "?");

    json_t *q1 = get_opt(o, "quantization"), *q2 = get_opt(o, "quantization_config");
    if (q1 || q2) {
        int b1 = 0, g1 = 0;
        if ((st = get_quant(path, q1 ? "quantization" : "quantization_config", q1 ? q1 : q2,
                            &c->quant_bits, &c->quant_group, err)))
            return st;
        if (q1 && q2) {
            if ((st = get_quant(path, "quantization_config", q2, &b1, &g1, err))) return st;
            if (b1 != c->quant_bits || g1 != c->quant_group)
                return ib_fail(err, IB_ERR_MODEL,
                               "%s: field quantization_config: bits %d group_size %d disagree with "
                               "quantization (bits %d group_size %d)",
                               path, b1, g1, c->quant_bits, c->quant_group);
        }
        const char *what[3] = {"hidden_size", "intermediate_size", "num_attention_heads*head_dim"};
        long long dim[3] = {c->hidden_size, c->intermediate_size, (long long)c->n_heads * c->head_dim};
        for (int i = 0; i < 3; i++)
            if (dim[i] % c->quant_group != 0)
                return ib_fail(err, IB_ERR_MODEL,
                               "%s: field %s: %lld is not a multiple of quantization group_size %d",
                               path, what[i], dim[i], c->quant_group);
    }

    if ((st = get_token_id(path, o, "bos_token_id", c->vocab_size, &c->bos_id, err)) ||
        (st = get_token_id(path, o, "eos_token_id", c->vocab_size, &c->eos_id, err)))
        return st;
    c->kv_heads_max = c->n_kv_heads;
    c->kv_hd_max = c->head_dim;
    return IB_OK;
}

/* ---------------------------------------------------------------- Gemma 4 (docs/gemma4.md) */

/* A Gemma 4 feature isobatch does not implement yet: one line naming the field. */
#define G4_UNSUPPORTED(field, what) \
    ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s%s: %s is not supported yet", path, fp, (field), (what))

/* One layer type's rope_parameters entry `rp` (field name `key`): theta, and for proportional RoPE
 * over head dim hd the number of rotated pairs. default: every pair rotated. */
static ib_status g4_rope(const char *path, const char *fp, const char *key, json_t *rp, int allow_proportional,
                         int hd, double *theta, int *pairs, ib_error *err) {
    char f[96];
    if (!json_is_object(rp)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s%s: expected an object", path, fp, key);
    const char *k;
    json_t *v;
    json_object_foreach(rp, k, v) {
        if (json_is_null(v)) continue;
        if (strcmp(k, "rope_type") && strcmp(k, "rope_theta") && strcmp(k, "partial_rotary_factor") &&
            strcmp(k, "factor"))
            return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s%s.%s: not supported", path, fp, key, k);
    }
    json_t *t = get_opt(rp, "rope_type");
    const char *type = t && json_is_string(t) ? json_string_value(t) : t ? "?" : "default";
    int proportional = strcmp(type, "proportional") == 0;
    if (strcmp(type, "default") != 0 && !(proportional && allow_proportional))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s%s.rope_type: \"%s\" not supported (%s)", path, fp, key,
                       type, allow_proportional ? "default or proportional" : "default");
    ib_status st;
    snprintf(f, sizeof f, "%s%s.rope_theta", fp, key);
    json_t *th = get_opt(rp, "rope_theta");
    if (!th) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: missing", path, f);
    if ((st = get_pos_number(path, rp, "rope_theta", 0, theta, err))) return st;
    double factor = 1.0, frac = 1.0;
    if ((st = get_pos_number(path, rp, "factor", 1.0, &factor, err)) ||
        (st = get_pos_number(path, rp, "partial_rotary_factor", 1.0, &frac, err)))
        return st;
    if (factor != 1.0)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s%s.factor: %g not supported (1)", path, fp, key, factor);
    if (frac > 1.0)
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s%s.partial_rotary_factor: %g is above 1", path, fp, key, frac);
    if (!proportional && frac != 1.0)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s%s.partial_rotary_factor: %g not supported with rope_type "
                       "default", path, fp, key, frac);
    /* proportional: floor(frac * hd / 2) pairs rotate, with frequencies theta^(-2i/hd) of the whole head */
    *pairs = proportional ? (int)floor(frac * (double)hd / 2.0) : hd / 2;
    return IB_OK;
}

/* model_type gemma4_text (top = the text config itself) or gemma4 (top holds text_config). */
static ib_status parse_gemma4(const char *path, json_t *top, ib_config *c, ib_error *err) {
    ib_status st;
    const char *mts = json_string_value(json_object_get(top, "model_type"));
    json_t *o = top;
    const char *fp = "";
    c->arch = IB_ARCH_GEMMA4;
    const char *arch_name = "Gemma4ForCausalLM";
    if (strcmp(mts, "gemma4") == 0) {
        o = get_opt(top, "text_config");
        if (!o) return ib_fail(err, IB_ERR_FORMAT, "%s: field text_config: missing (model_type gemma4)", path);
        if (!json_is_object(o)) return ib_fail(err, IB_ERR_FORMAT, "%s: field text_config: expected an object", path);
        json_t *tm = get_opt(o, "model_type");
        if (tm && (!json_is_string(tm) || strcmp(json_string_value(tm), "gemma4_text") != 0))
            return ib_fail(err, IB_ERR_MODEL, "%s: field text_config.model_type: expected \"gemma4_text\"", path);
        fp = "text_config.";
        c->tensor_prefix_lm = 1;
        c->has_towers = get_opt(top, "vision_config") != NULL || get_opt(top, "audio_config") != NULL;
        arch_name = "Gemma4ForConditionalGeneration";
    }
    json_t *ar = get_opt(top, "architectures");
    if (ar) {
        if (!json_is_array(ar))
            return ib_fail(err, IB_ERR_FORMAT, "%s: field architectures: expected a list of strings", path);
        int found = 0;
        size_t i;
        json_t *x;
        json_array_foreach(ar, i, x) {
            if (!json_is_string(x))
                return ib_fail(err, IB_ERR_FORMAT, "%s: field architectures[%zu]: expected a string", path, i);
            found |= strcmp(json_string_value(x), arch_name) == 0 ||
                     strcmp(json_string_value(x), "Gemma4ForCausalLM") == 0;
        }
        if (!found && json_array_size(ar) > 0)
            return ib_fail(err, IB_ERR_MODEL, "%s: field architectures: \"%s\" does not match model_type %s (%s)", path,
                           json_string_value(json_array_get(ar, 0)), mts, arch_name);
    }

    /* the features not implemented yet, each by name */
    int on = 0;
    int moe = 0;
    if ((st = get_bool(path, o, "enable_moe_block", 0, &moe, err))) return st;
    int ple = 0, shared = 0;
    if ((st = get_int(path, o, "hidden_size_per_layer_input", 0, 0, 0, 1 << 20, &ple, err)) ||
        (st = get_int(path, o, "num_kv_shared_layers", 0, 0, 0, 4096, &shared, err)))
        return st;
    if ((st = get_bool(path, o, "attention_bias", 0, &on, err))) return st;
    if (on) return G4_UNSUPPORTED("attention_bias", "true");
    static const char *const absent_only[] = {"use_bidirectional_attention", "attn_logit_softcapping",
                                              "query_pre_attn_scalar", "rope_scaling"};
    for (int i = 0; i < 4; i++)
        if (get_opt(o, absent_only[i])) return G4_UNSUPPORTED(absent_only[i], "a non-null value");
    json_t *act = get_opt(o, "hidden_activation");
    if (!act) act = get_opt(o, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "gelu_pytorch_tanh") != 0))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %shidden_activation: \"%s\" not supported (gelu_pytorch_tanh)",
                       path, fp, json_is_string(act) ? json_string_value(act) : "?");

    /* sizes (transformers' Gemma4TextConfig defaults where a field may be absent) */
    if ((st = get_int(path, o, "vocab_size", 0, 262144, 1, 1 << 24, &c->vocab_size, err)) ||
        (st = get_int(path, o, "hidden_size", 1, 0, 1, 65536, &c->hidden_size, err)) ||
        (st = get_int(path, o, "num_hidden_layers", 1, 0, 1, IB_CONFIG_MAX_TYPED_LAYERS, &c->n_layers, err)) ||
        (st = get_int(path, o, "num_attention_heads", 1, 0, 1, 4096, &c->n_heads, err)) ||
        (st = get_int(path, o, "intermediate_size", 1, 0, 1, 1 << 20, &c->intermediate_size, err)) ||
        (st = get_int(path, o, "num_key_value_heads", 0, c->n_heads, 1, 4096, &c->n_kv_heads, err)) ||
        (st = get_int(path, o, "head_dim", 0, 256, 2, IB_CONFIG_MAX_HD, &c->head_dim, err)) ||
        (st = get_int(path, o, "global_head_dim", 0, c->head_dim, 2, IB_CONFIG_MAX_HD, &c->global_head_dim, err)) ||
        (st = get_int(path, o, "sliding_window", 0, 512, 1, 1 << 24, &c->sliding_window, err)) ||
        (st = get_int(path, o, "max_position_embeddings", 0, 131072, 1, 1 << 24, &c->max_position, err)) ||
        (st = get_pos_number(path, o, "rms_norm_eps", 1e-6, &c->rms_eps, err)) ||
        (st = get_bool(path, o, "tie_word_embeddings", 1, &c->tie_embeddings, err)) ||
        (st = get_bool(path, o, "attention_k_eq_v", 0, &c->k_eq_v, err)))
        return st;
    /* the MoE block: num_experts, top_k_experts, moe_intermediate_size, all required when enabled */
    if (moe) {
        if ((st = get_int(path, o, "num_experts", 1, 0, 1, IB_CONFIG_MAX_EXPERTS, &c->n_experts, err)) ||
            (st = get_int(path, o, "top_k_experts", 1, 0, 1, IB_CONFIG_MAX_EXPERTS, &c->top_k, err)) ||
            (st = get_int(path, o, "moe_intermediate_size", 1, 0, 1, 1 << 20, &c->moe_ffn, err)))
            return st;
        if (c->top_k > c->n_experts)
            return ib_fail(err, IB_ERR_MODEL, "%s: field %stop_k_experts: %d exceeds num_experts %d", path, fp, c->top_k,
                           c->n_experts);
    } else {
        static const char *const moe_only[] = {"num_experts", "top_k_experts", "moe_intermediate_size"};
        for (int i = 0; i < 3; i++) { /* harmless when null; a number without the block is a mistake */
            json_t *x = get_opt(o, moe_only[i]);
            if (x && !json_is_null(x) && !(json_is_integer(x) && json_integer_value(x) == 0))
                return ib_fail(err, IB_ERR_MODEL, "%s: field %s%s: set but enable_moe_block is false", path, fp,
                               moe_only[i]);
        }
    }
    /* MoE variants of other families that Gemma 4 does not have, refused by name when present */
    static const char *const moe_refused[] = {"num_shared_experts", "n_shared_experts", "norm_topk_prob",
                                              "router_aux_loss_coef", "moe_layer_freq", "first_k_dense_replace",
                                              "routed_scaling_factor", "expert_capacity", "capacity_factor"};
    for (size_t i = 0; i < sizeof moe_refused / sizeof moe_refused[0]; i++) {
        json_t *x = get_opt(o, moe_refused[i]);
        if (x && !json_is_null(x)) return G4_UNSUPPORTED(moe_refused[i], "a MoE field Gemma 4 does not define");
    }
    /* tie_word_embeddings may sit on the outer gemma4 object */
    if (o != top && !get_opt(o, "tie_word_embeddings") && (st = get_bool(path, top, "tie_word_embeddings", 1,
                                                                          &c->tie_embeddings, err)))
        return st;
    c->global_kv_heads = c->n_kv_heads;
    if (c->k_eq_v && (st = get_int(path, o, "num_global_key_value_heads", 0, c->n_kv_heads, 1, 4096,
                                   &c->global_kv_heads, err)))
        return st;
    /* newer transformers writes the full layers' overrides as per_layer_config {"<layer>": {head_dim,
     * num_key_value_heads}} instead of global_head_dim / num_global_key_value_heads: read them (after
     * layer_types, below) and check they agree with those fields when both are present */
    json_t *plc = get_opt(o, "per_layer_config");
    if (plc && !json_is_object(plc))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %sper_layer_config: expected an object", path, fp);
    if (c->head_dim % 2 || c->global_head_dim % 2)
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s%s: %d is odd (rotary needs pairs)", path, fp,
                       c->head_dim % 2 ? "head_dim" : "global_head_dim",
                       c->head_dim % 2 ? c->head_dim : c->global_head_dim);
    if (c->n_heads % c->n_kv_heads || c->n_heads % c->global_kv_heads)
        return ib_fail(err, IB_ERR_MODEL, "%s: field %s%s: num_attention_heads %d is not a multiple of %d", path, fp,
                       c->n_heads % c->n_kv_heads ? "num_key_value_heads" : "num_global_key_value_heads", c->n_heads,
                       c->n_heads % c->n_kv_heads ? c->n_kv_heads : c->global_kv_heads);

    /* layer_types: one per layer, the last full_attention (transformers forces it; here it is checked) */
    json_t *lt = get_opt(o, "layer_types");
    if (lt) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)c->n_layers)
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %slayer_types: expected a list of %d strings", path, fp,
                           c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            json_t *x = json_array_get(lt, (size_t)i);
            const char *s = json_is_string(x) ? json_string_value(x) : "";
            if (strcmp(s, "sliding_attention") == 0) c->layer_sliding[i] = 1;
            else if (strcmp(s, "full_attention") == 0) c->layer_sliding[i] = 0;
            else
                return ib_fail(err, IB_ERR_FORMAT, "%s: field %slayer_types[%d]: expected \"sliding_attention\" or "
                               "\"full_attention\"", path, fp, i);
        }
    } else {
        int pattern = 6;
        if ((st = get_int(path, o, "sliding_window_pattern", 0, 6, 1, 4096, &pattern, err))) return st;
        if (pattern != 6) /* transformers ignores it and uses 6: the two would build different models */
            return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %ssliding_window_pattern: %d without layer_types is not "
                           "supported (give layer_types)", path, fp, pattern);
        for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = (i + 1) % 6 != 0;
        c->layer_sliding[c->n_layers - 1] = 0;
    }
    if (c->layer_sliding[c->n_layers - 1])
        return ib_fail(err, IB_ERR_MODEL, "%s: field %slayer_types[%d]: the last layer must be full_attention", path,
                       fp, c->n_layers - 1);
    /* per-layer embeddings: a [vocab_size_per_layer_input][layers * P] table, one row per token id;
     * only the table of the main vocabulary's size is read here */
    c->ple_dim = ple;
    if (ple) {
        int vp = 0;
        if ((st = get_int(path, o, "vocab_size_per_layer_input", 0, 262144, 1, 1 << 24, &vp, err))) return st;
        if (vp != c->vocab_size)
            return G4_UNSUPPORTED("vocab_size_per_layer_input", "a per-layer embedding vocabulary other than vocab_size");
        if ((long long)c->n_layers * ple > (1 << 24))
            return ib_fail(err, IB_ERR_MODEL, "%s: field %shidden_size_per_layer_input: %d x %d layers is too wide", path,
                           fp, ple, c->n_layers);
    }
    /* KV sharing: the last num_kv_shared_layers layers reuse the keys and values of the last earlier
     * layer of their type (transformers' Gemma4TextAttention); use_double_wide_mlp widens their MLPs */
    if (shared >= c->n_layers)
        return ib_fail(err, IB_ERR_MODEL, "%s: field %snum_kv_shared_layers: %d leaves no layer with keys and values "
                       "of its own (num_hidden_layers %d)", path, fp, shared, c->n_layers);
    int unsourced = ib_config_set_kv_sharing(c, shared);
    if (unsourced >= 0)
        return ib_fail(err, IB_ERR_MODEL, "%s: field %snum_kv_shared_layers: layer %d (%s) has no earlier non-shared "
                       "layer of its type to take keys and values from", path, fp, unsourced,
                       c->layer_sliding[unsourced] ? "sliding_attention" : "full_attention");
    /* use_double_wide_mlp: the KV-shared layers' dense MLPs have 2 x intermediate_size (ib_config_layer_ffn) */
    if ((st = get_bool(path, o, "use_double_wide_mlp", 0, &c->double_wide, err))) return st;

    if (plc) {
        int ghd = -1, gkv = -1;
        const char *k;
        json_t *v;
        json_object_foreach(plc, k, v) {
            char *end;
            long li = strtol(k, &end, 10);
            if (*k == '\0' || *end || li < 0 || li >= c->n_layers || !json_is_object(v))
                return ib_fail(err, IB_ERR_FORMAT, "%s: field %sper_layer_config.%s: expected a layer index of an "
                               "object", path, fp, k);
            const char *kk;
            json_t *x;
            json_object_foreach(v, kk, x) {
                int is_hd = strcmp(kk, "head_dim") == 0, is_kv = strcmp(kk, "num_key_value_heads") == 0;
                if (!is_hd && !is_kv)
                    return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %sper_layer_config.%s.%s: not supported", path,
                                   fp, k, kk);
                if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > IB_CONFIG_MAX_HD * 8)
                    return ib_fail(err, IB_ERR_FORMAT, "%s: field %sper_layer_config.%s.%s: expected a positive integer",
                                   path, fp, k, kk);
                int val = (int)json_integer_value(x), *slot = is_hd ? &ghd : &gkv;
                if (c->layer_sliding[li])
                    return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %sper_layer_config.%s: overrides on a sliding "
                                   "layer are not supported", path, fp, k);
                if (*slot >= 0 && *slot != val)
                    return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %sper_layer_config.%s.%s: %d differs from another "
                                   "full layer's %d (one shape per layer type only)", path, fp, k, kk, val, *slot);
                *slot = val;
            }
        }
        if ((ghd >= 0 && get_opt(o, "global_head_dim") && ghd != c->global_head_dim) ||
            (gkv >= 0 && get_opt(o, "num_global_key_value_heads") && gkv != c->global_kv_heads))
            return ib_fail(err, IB_ERR_MODEL, "%s: field %sper_layer_config: disagrees with global_head_dim / "
                           "num_global_key_value_heads", path, fp);
        if (ghd >= 0) c->global_head_dim = ghd;
        if (gkv >= 0) c->global_kv_heads = gkv;
        if (c->global_head_dim % 2 || c->n_heads % c->global_kv_heads || c->global_head_dim > IB_CONFIG_MAX_HD)
            return ib_fail(err, IB_ERR_MODEL, "%s: field %sper_layer_config: head_dim %d / num_key_value_heads %d do "
                           "not fit %d heads", path, fp, c->global_head_dim, c->global_kv_heads, c->n_heads);
    }

    /* rope_parameters per layer type; absent: sliding default theta 1e4, full proportional 0.25 theta 1e6 */
    json_t *rps = get_opt(o, "rope_parameters");
    if (rps) {
        if (!json_is_object(rps))
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %srope_parameters: expected an object", path, fp);
        json_t *rs = get_opt(rps, "sliding_attention"), *rf = get_opt(rps, "full_attention");
        if (!rs || !rf)
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %srope_parameters.%s: missing", path, fp,
                           rs ? "full_attention" : "sliding_attention");
        int pairs_s = 0;
        if ((st = g4_rope(path, fp, "rope_parameters.sliding_attention", rs, 0, c->head_dim, &c->rope_theta, &pairs_s,
                          err)) ||
            (st = g4_rope(path, fp, "rope_parameters.full_attention", rf, 1, c->global_head_dim, &c->rope_theta_full,
                          &c->rope_pairs_full, err)))
            return st;
        json_t *rt = get_opt(rf, "rope_type");
        int prop = rt && json_is_string(rt) && strcmp(json_string_value(rt), "proportional") == 0;
        if (!prop && c->global_head_dim != c->head_dim)
            return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %srope_parameters.full_attention.rope_type: default with "
                           "global_head_dim %d != head_dim %d is not supported", path, fp, c->global_head_dim, c->head_dim);
    } else {
        c->rope_theta = 10000.0;
        c->rope_theta_full = 1000000.0;
        c->rope_pairs_full = (int)floor(0.25 * c->global_head_dim / 2.0);
    }
    json_t *sc = get_opt(o, "final_logit_softcapping");
    if (sc && (st = get_pos_number(path, o, "final_logit_softcapping", 0, &c->final_softcap, err))) return st;

    json_t *q1 = get_opt(top, "quantization"), *q2 = get_opt(top, "quantization_config");
    if (q1 || q2) {
        int b1 = 0, g1 = 0;
        if ((st = get_quant(path, q1 ? "quantization" : "quantization_config", q1 ? q1 : q2, &c->quant_bits,
                            &c->quant_group, err)))
            return st;
        if (q1 && q2) {
            if ((st = get_quant(path, "quantization_config", q2, &b1, &g1, err))) return st;
            if (b1 != c->quant_bits || g1 != c->quant_group)
                return ib_fail(err, IB_ERR_MODEL, "%s: field quantization_config: bits %d group_size %d disagree with "
                               "quantization (bits %d group_size %d)", path, b1, g1, c->quant_bits, c->quant_group);
        }
        const char *what[4] = {"hidden_size", "intermediate_size", "num_attention_heads*head_dim",
                               "num_attention_heads*global_head_dim"};
        long long dim[4] = {c->hidden_size, c->intermediate_size, (long long)c->n_heads * c->head_dim,
                            (long long)c->n_heads * c->global_head_dim};
        for (int i = 0; i < 4; i++)
            if (dim[i] % c->quant_group != 0)
                return ib_fail(err, IB_ERR_MODEL, "%s: field %s%s: %lld is not a multiple of quantization group_size %d",
                               path, fp, what[i], dim[i], c->quant_group);
    }
    json_t *ids = get_opt(o, "eos_token_id") || get_opt(o, "bos_token_id") ? o : top;
    if ((st = get_token_id(path, ids, "bos_token_id", c->vocab_size, &c->bos_id, err)) ||
        (st = get_token_id(path, ids, "eos_token_id", c->vocab_size, &c->eos_id, err)))
        return st;
    c->qk_norm = 1;
    c->kv_heads_max = c->n_kv_heads > c->global_kv_heads ? c->n_kv_heads : c->global_kv_heads;
    c->kv_hd_max = c->head_dim > c->global_head_dim ? c->head_dim : c->global_head_dim;
    return IB_OK;
}
#undef G4_UNSUPPORTED

ib_status ib_config_load(const char *path, ib_config *out, ib_error *err) {
    if (!path || !out) return ib_fail(err, IB_ERR_INVALID_ARG, "ib_config_load: NULL argument");
    FILE *fp = fopen(path, "rb");
    if (!fp) return ib_fail(err, IB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    json_error_t jerr;
    json_t *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &jerr);
    fclose(fp);
    if (!root)
        return ib_fail(err, IB_ERR_FORMAT, "%s: not valid JSON (line %d, column %d): %s", path,
                       jerr.line, jerr.column, jerr.text);
    ib_status st;
    ib_config c;
    if (!json_is_object(root))
        st = ib_fail(err, IB_ERR_FORMAT, "%s: expected a JSON object at the top level", path);
    else
        st = parse_config(path, root, &c, err);
    json_decref(root);
    if (st == IB_OK) *out = c;
    return st;
}

/* Smallest %g precision (up to 17) that reads back as exactly x, and at least the number of
 * integer digits of a whole x below 1e15 (so 10000 prints as 10000.0, not 1e+04). */
static int real_digits(double x) {
    char buf[40];
    int p = 1;
    if (x == floor(x) && fabs(x) < 1e15)
        for (double t = fabs(x); t >= 10; t /= 10) p++;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x) return p;
    }
    return 17;
}

ib_status ib_config_save(const ib_config *cfg, const char *path, ib_error *err) {
    if (!cfg || !path) return ib_fail(err, IB_ERR_INVALID_ARG, "ib_config_save: NULL argument");
    if (cfg->arch != IB_ARCH_QWEN3 && cfg->arch != IB_ARCH_LLAMA && cfg->arch != IB_ARCH_GEMMA4)
        return ib_fail(err, IB_ERR_INVALID_ARG, "%s: arch %d unknown", path, (int)cfg->arch);
    if (!(cfg->rope_theta > 0) || !isfinite(cfg->rope_theta) || !(cfg->rms_eps > 0) ||
        !isfinite(cfg->rms_eps))
        return ib_fail(err, IB_ERR_INVALID_ARG, "%s: rope_theta %g / rms_norm_eps %g not positive", path,
                       cfg->rope_theta, cfg->rms_eps);
    ib_status st = IB_OK;
    char *tmp = NULL;
    int is_qwen = cfg->arch == IB_ARCH_QWEN3, is_gemma = cfg->arch == IB_ARCH_GEMMA4;
    json_t *o = json_object(), *ar = json_array();
    int bad = !o || json_object_set_new(o, "architectures", ar);
    bad = bad || json_array_append_new(ar, json_string(is_gemma ? "Gemma4ForCausalLM"
                                                       : is_qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM"));
#define SET(k, v) bad = bad || json_object_set_new(o, (k), (v))
    SET("model_type", json_string(is_gemma ? "gemma4_text" : is_qwen ? "qwen3" : "llama"));
    SET("vocab_size", json_integer(cfg->vocab_size));
    SET("hidden_size", json_integer(cfg->hidden_size));
    SET("num_hidden_layers", json_integer(cfg->n_layers));
    SET("num_attention_heads", json_integer(cfg->n_heads));
    SET("num_key_value_heads", json_integer(cfg->n_kv_heads));
    SET("head_dim", json_integer(cfg->head_dim));
    SET("intermediate_size", json_integer(cfg->intermediate_size));
    SET("max_position_embeddings", json_integer(cfg->max_position));
    if (is_gemma) {
        json_t *lt = json_array(), *rp = json_object(), *rs = json_object(), *rf = json_object();
        SET("layer_types", lt);
        SET("rope_parameters", rp);
        bad = bad || !rs || !rf || json_object_set_new(rp, "sliding_attention", rs) ||
              json_object_set_new(rp, "full_attention", rf);
        for (int i = 0; i < cfg->n_layers && !bad; i++)
            bad = json_array_append_new(lt, json_string(cfg->layer_sliding[i] ? "sliding_attention" : "full_attention"));
        bad = bad || json_object_set_new(rs, "rope_type", json_string("default")) ||
              json_object_set_new(rs, "rope_theta", json_real(cfg->rope_theta)) ||
              json_object_set_new(rf, "rope_type", json_string("proportional")) ||
              json_object_set_new(rf, "rope_theta", json_real(cfg->rope_theta_full)) ||
              json_object_set_new(rf, "partial_rotary_factor",
                                  json_real(2.0 * cfg->rope_pairs_full / (double)cfg->global_head_dim));
        SET("global_head_dim", json_integer(cfg->global_head_dim));
        SET("num_global_key_value_heads", json_integer(cfg->global_kv_heads));
        SET("attention_k_eq_v", json_boolean(cfg->k_eq_v));
        SET("sliding_window", json_integer(cfg->sliding_window));
        SET("hidden_activation", json_string("gelu_pytorch_tanh"));
        SET("hidden_size_per_layer_input", json_integer(cfg->ple_dim));
        if (cfg->ple_dim > 0) SET("vocab_size_per_layer_input", json_integer(cfg->vocab_size));
        SET("num_kv_shared_layers", json_integer(cfg->kv_shared));
        SET("use_double_wide_mlp", json_boolean(cfg->double_wide));
        SET("enable_moe_block", json_boolean(cfg->n_experts > 0));
        if (cfg->n_experts > 0) {
            SET("num_experts", json_integer(cfg->n_experts));
            SET("top_k_experts", json_integer(cfg->top_k));
            SET("moe_intermediate_size", json_integer(cfg->moe_ffn));
        }
        if (cfg->final_softcap > 0) SET("final_logit_softcapping", json_real(cfg->final_softcap));
    } else {
        SET("rope_theta", json_real(cfg->rope_theta));
        SET("hidden_act", json_string("silu"));
    }
    SET("rms_norm_eps", json_real(cfg->rms_eps));
    SET("tie_word_embeddings", json_boolean(cfg->tie_embeddings));
    SET("torch_dtype", json_string("bfloat16"));
    SET("attention_bias", json_false());
    if (cfg->bos_id >= 0) SET("bos_token_id", json_integer(cfg->bos_id));
    if (cfg->eos_id >= 0) SET("eos_token_id", json_integer(cfg->eos_id));
    if (cfg->quant_bits) {
        for (int i = 0; i < 2; i++) {
            json_t *q = json_object();
            SET(i ? "quantization_config" : "quantization", q);
            bad = bad || json_object_set_new(q, "group_size", json_integer(cfg->quant_group)) ||
                  json_object_set_new(q, "bits", json_integer(cfg->quant_bits));
        }
    }
#undef SET
    if (bad) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t plen = strlen(path);
    tmp = malloc(plen + 5);
    if (!tmp) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    int d1 = real_digits(cfg->rope_theta), d2 = real_digits(cfg->rms_eps);
    if (is_gemma) {
        int d3 = real_digits(cfg->rope_theta_full), d4 = cfg->final_softcap > 0 ? real_digits(cfg->final_softcap) : 1;
        d1 = d1 > d3 ? d1 : d3;
        d1 = d1 > d4 ? d1 : d4;
    }
    size_t flags = JSON_INDENT(4) | JSON_SORT_KEYS | JSON_REAL_PRECISION(d1 > d2 ? d1 : d2);
    if (json_dump_file(o, tmp, flags) != 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        goto done;
    }
done:
    free(tmp);
    json_decref(o);
    if (!o) json_decref(ar);
    return st;
}
