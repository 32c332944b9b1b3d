/*
 * mkmodel.h — synthetic model directories with random weights (for tests and benchmarks).
 *
 * Presets (Qwen3 architecture, tied embeddings, byte-level tokenizer with specials
 * <|endoftext|> (256), <|im_start|> (257), <|im_end|> (258)):
 *   tiny:       vocab 320, hidden 128, 2 layers, 4 heads, 2 kv heads, head_dim 32, ffn 384, ctx 2048
 *   qwen3-0.6b: vocab 151936, hidden 1024, 28 layers, 16 heads, 8 kv heads, head_dim 128, ffn 3072,
 *               ctx 40960, rope_theta 1e6 (Qwen3-0.6B's shapes)
 *   qwen3-8b:   vocab 151936, hidden 4096, 36 layers, 32 heads, 8 kv heads, head_dim 128, ffn 12288,
 *               ctx 40960, rope_theta 1e6, its own lm_head (Qwen3-8B's shapes; always untied)
 * bits: 4 or 8 -> MLX affine quantized (group 64 unless given), bf16 scales/biases, float norms;
 *       16 -> bfloat16 weights; 32 -> float32 weights.
 * Weights are drawn from a deterministic generator keyed by seed: linear weights uniform with
 * standard deviation 1/sqrt(fan_in), embeddings std 1/sqrt(hidden) (so tied logits have std ~1,
 * a broad next-token distribution), norm weights 1 + U(-0.1, 0.1).
 * Quantization follows MLX's affine quantizer exactly (see ib_mlx_quantize).
 */
#ifndef IB_MODEL_MKMODEL_H
#define IB_MODEL_MKMODEL_H
#include <stdint.h>
#include "isobatch.h"

typedef struct ib_mkmodel_opts {
    const char *preset;   /* "tiny" | "qwen3-0.6b" | "qwen3-8b" | "gemma4-tiny" | "gemma4-moe-tiny" */
    uint64_t seed;
    int bits;             /* 4, 8, 16, 32 */
    int group;            /* 32, 64, 128 (quantized only); 0 means 64 */
    int tied;             /* 1 = tie_word_embeddings (default for both presets); 0 writes lm_head */
    const char *arch;     /* NULL or "qwen3"; "llama" = the same shapes without q/k norm */
    int top_k;            /* MoE presets: experts per token (0: the preset's) */
    int experts;          /* MoE presets: experts a layer (0: the preset's; 1..IB_CONFIG_MAX_EXPERTS), for
                           * tests of routing over many experts; top-k is then at most this */
    int layers;           /* 0: the preset's layer count; 1..the preset's: only its first `layers`
                           * layers, every other shape unchanged (Gemma 4: the layer types are the
                           * preset's pattern over the new count, so the last layer is full) */
    int kv_shared;        /* Gemma 4 presets: num_kv_shared_layers (0: none); the last kv_shared layers
                           * are written without k_proj, v_proj and k_norm */
    int double_wide;      /* with kv_shared: use_double_wide_mlp, the KV-shared layers' gate/up [2F, D] and
                           * down [D, 2F] */
    int ple_dim;          /* Gemma 4 presets: hidden_size_per_layer_input P (0: none): writes
                           * embed_tokens_per_layer [V, L*P], per_layer_model_projection [L*P, D],
                           * per_layer_projection_norm [P] and per layer per_layer_input_gate [P, D],
                           * per_layer_projection [D, P], post_per_layer_input_norm [D] */
    int router_ties;      /* MoE presets, for tests of the routing's tie rule: 1 writes each odd expert's
                           * router row equal to the even one before it, so every row's logits tie in
                           * pairs */
    int threads;          /* threads that generate and write the weights: 1..IB_MAX_DEFAULT_THREADS, or 0
                           * for the CPUs online (at most IB_MAX_DEFAULT_THREADS). The files are the same
                           * bytes for every count */
} ib_mkmodel_opts;

/* Create dir (mkdir -p) and write config.json, model.safetensors, tokenizer.json,
 * tokenizer_config.json into it. */
ib_status ib_mkmodel(const char *dir, const ib_mkmodel_opts *opts, ib_error *err);

/* MLX affine quantization of one row-major W[N][K] (K % group == 0), per group along K:
 *   scale = max((max - min) / (2^bits - 1), 1e-7); edge = |min| > |max| ? min : max, and when edge
 *   is max the scale is negated; q0 = rne(edge / scale); if q0 != 0 { scale = edge / q0; bias = edge }
 *   else bias = 0; q = clamp(rne((w - bias) / scale), 0, 2^bits - 1).
 * Outputs: wq [N][K*bits/32] uint32 packed low bits first; scales, biases [N][K/group] float32
 * (the caller rounds them to bf16 when writing; pass round_bf16 = 1 to quantize against the rounded
 * scale/bias so codes and stored parameters agree). */
void ib_mlx_quantize(const float *w, int N, int K, int bits, int group, int round_bf16,
                     uint32_t *wq, float *scales, float *biases);

#endif
