/*
 * config.h — the model's config.json (Hugging Face / MLX fields), parsed and validated.
 */
#ifndef IB_MODEL_CONFIG_H
#define IB_MODEL_CONFIG_H
#include "isobatch.h"

typedef enum ib_arch { IB_ARCH_QWEN3 = 1, IB_ARCH_LLAMA, IB_ARCH_GEMMA4 } ib_arch;

/* Most layers a Gemma 4 config may have (its per-layer attention types are held in ib_config). */
#define IB_CONFIG_MAX_TYPED_LAYERS 256

/* Largest head_dim / global_head_dim (attention's IB_ATTN_MAX_HD). */
#define IB_CONFIG_MAX_HD 512

/* Most experts a MoE layer may have. */
#define IB_CONFIG_MAX_EXPERTS 1024

typedef struct ib_config {
    ib_arch arch;             /* from model_type "qwen3" | "llama" (architectures is cross-checked) */
    int vocab_size;
    int hidden_size;          /* D */
    int n_layers;             /* num_hidden_layers */
    int n_heads;              /* num_attention_heads */
    int n_kv_heads;           /* num_key_value_heads (defaults to n_heads) */
    int head_dim;             /* head_dim (defaults to hidden_size / n_heads) */
    int intermediate_size;    /* F */
    int max_position;         /* max_position_embeddings, default 2048 when absent */
    double rope_theta;        /* default 10000 */
    double rms_eps;           /* rms_norm_eps, default 1e-6 */
    int tie_embeddings;       /* tie_word_embeddings, default 0 (as Qwen3Config and LlamaConfig) */
    int qk_norm;              /* 1 for qwen3 */
    int quant_bits;           /* 0 = float weights; 4 or 8 from "quantization" / "quantization_config" */
    int quant_group;          /* 32, 64 or 128 when quantized */
    int bos_id, eos_id;       /* bos_token_id / eos_token_id (first of a list), -1 when absent */
    /* KV geometry every layer fits in: n_kv_heads / head_dim, or for Gemma 4 the larger of the
     * sliding and full layers' (a session's cache is [n_layers][2][kv_heads_max][capacity][kv_hd_max]) */
    int kv_heads_max, kv_hd_max;

    /* ---- Gemma 4 only (arch IB_ARCH_GEMMA4; docs/gemma4.md); zero otherwise ---- */
    int tensor_prefix_lm;     /* 1: tensors under model.language_model. (model_type gemma4), 0: model. */
    int has_towers;           /* gemma4 with vision_config / audio_config: those tensors are ignored */
    int sliding_window;       /* sliding layers attend to the last sliding_window positions (self included) */
    int global_head_dim;      /* head_dim of full-attention layers */
    int global_kv_heads;      /* KV heads of full-attention layers */
    int k_eq_v;               /* attention_k_eq_v: full layers have no v_proj; values = k_proj output */
    double rope_theta_full;   /* full layers' rope_theta (sliding layers: rope_theta) */
    int rope_pairs_full;      /* full layers rotate pairs i < rope_pairs_full of global_head_dim/2 */
    double final_softcap;     /* final_logit_softcapping; 0 = none */
    /* the MoE block (enable_moe_block; docs/gemma4.md "Mixture of experts"); n_experts 0 = dense */
    int n_experts;            /* num_experts */
    int top_k;                /* top_k_experts (1..n_experts) */
    int moe_ffn;              /* moe_intermediate_size: each expert's F */
    unsigned char layer_sliding[IB_CONFIG_MAX_TYPED_LAYERS];   /* 1: sliding_attention, 0: full */
    /* KV sharing (num_kv_shared_layers; docs/gemma4.md): the last kv_shared layers compute no keys or
     * values and attend to those of the last earlier non-shared layer of their type */
    int kv_shared;            /* num_kv_shared_layers (0: none) */
    int double_wide;          /* use_double_wide_mlp: the KV-shared layers' dense MLPs are 2F wide (no effect
                               * without KV sharing) */
    /* per-layer embeddings (hidden_size_per_layer_input; docs/gemma4.md): 0 = none, else P, each
     * layer's slice width of embed_tokens_per_layer [vocab_size][n_layers * P] */
    int ple_dim;
    short kv_from[IB_CONFIG_MAX_TYPED_LAYERS];   /* [li] 0: own keys/values; s > 0: layer s - 1's */
} ib_config;

/* The layer whose keys and values layer li attends to: li itself, or (KV sharing) its source layer. */
static inline int ib_config_kv_layer(const ib_config *c, int li) { return c->kv_from[li] ? c->kv_from[li] - 1 : li; }

/* Fill c->kv_from for kv_shared (c->n_layers and c->layer_sliding set): each of the last kv_shared
 * layers reads the last layer before them (index < n_layers - kv_shared) of its own type. Returns -1 on
 * success, else the first shared layer with no such source (nothing useful written then). */
static inline int ib_config_set_kv_sharing(ib_config *c, int kv_shared) {
    int first = c->n_layers - kv_shared;
    c->kv_shared = kv_shared;
    for (int li = 0; li < c->n_layers; li++) c->kv_from[li] = 0;
    for (int li = first; li < c->n_layers; li++) {
        int src = -1;
        for (int j = first - 1; j >= 0 && src < 0; j--)
            if (c->layer_sliding[j] == c->layer_sliding[li]) src = j;
        if (src < 0) return li;
        c->kv_from[li] = (short)(src + 1);
    }
    return -1;
}

/* The dense MLP's intermediate size of layer li: F, or 2F on a KV-shared layer of a use_double_wide_mlp
 * model (transformers' Gemma4TextDecoderLayer / Gemma 3n). */
static inline int ib_config_layer_ffn(const ib_config *c, int li) {
    return c->double_wide && c->kv_from[li] ? 2 * c->intermediate_size : c->intermediate_size;
}

/* The widest dense MLP of any layer (scratch sizing): 2F when some layer is double-wide, else F. */
static inline int ib_config_ffn_max(const ib_config *c) {
    return c->double_wide && c->kv_shared > 0 ? 2 * c->intermediate_size : c->intermediate_size;
}

/* Head dim and KV heads of layer li (per layer type for Gemma 4). */
static inline int ib_config_layer_hd(const ib_config *c, int li) {
    return c->arch == IB_ARCH_GEMMA4 && !c->layer_sliding[li] ? c->global_head_dim : c->head_dim;
}
static inline int ib_config_layer_kvh(const ib_config *c, int li) {
    return c->arch == IB_ARCH_GEMMA4 && !c->layer_sliding[li] ? c->global_kv_heads : c->n_kv_heads;
}

/* Parse and validate path (a config.json). Rejects: not JSON, not an object, a missing or mistyped
 * required field, non-positive sizes, n_heads not a multiple of n_kv_heads, odd head_dim,
 * quantization bits other than 4/8 or group other than 32/64/128, rope_scaling (unsupported),
 * attention_bias / mlp_bias / use_sliding_window true, hidden_act other than silu, an unknown
 * model_type, a bos/eos id outside [0, vocab_size). model_type gemma4_text (or gemma4 with a
 * text_config) is parsed as docs/gemma4.md says; each Gemma 4 feature not implemented yet is a
 * one-line error naming its field. A JSON null counts as absent for optional fields. Messages name the file and the field. *out is written only on success. */
ib_status ib_config_load(const char *path, ib_config *out, ib_error *err);

/* Write cfg as a config.json that ib_config_load accepts and mlx-lm would write (model_type,
 * architectures, sizes, rope_theta, rms_norm_eps, tie_word_embeddings, quantization +
 * quantization_config when quantized); for IB_ARCH_GEMMA4 a gemma4_text config with every
 * Gemma 4 field above (the unsupported ones at their "off" values). */
ib_status ib_config_save(const ib_config *cfg, const char *path, ib_error *err);

#endif
