/*
 * config.h — the model's config.json (Hugging Face / MLX fields), parsed and validated.
 */
#ifndef IB_MODEL_CONFIG_H
#define IB_MODEL_CONFIG_H
#include "isobatch.h"

typedef enum ib_arch { IB_ARCH_QWEN3 = 1, IB_ARCH_LLAMA } ib_arch;

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
} ib_config;

/* Parse and validate path (a config.json). Rejects: not JSON, not an object, a missing or mistyped
 * required field, non-positive sizes, n_heads not a multiple of n_kv_heads, odd head_dim,
 * quantization bits other than 4/8 or group other than 32/64/128, rope_scaling (unsupported),
 * attention_bias / mlp_bias / use_sliding_window true, hidden_act other than silu, an unknown
 * model_type, a bos/eos id outside [0, vocab_size). A JSON null counts as absent for optional
 * fields. Messages name the file and the field. *out is written only on success. */
ib_status ib_config_load(const char *path, ib_config *out, ib_error *err);

/* Write cfg as a config.json that ib_config_load accepts and mlx-lm would write (model_type,
 * architectures, sizes, rope_theta, rms_norm_eps, tie_word_embeddings, quantization +
 * quantization_config when quantized). */
ib_status ib_config_save(const ib_config *cfg, const char *path, ib_error *err);

#endif
