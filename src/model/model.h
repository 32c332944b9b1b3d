/*
 * model.h — the in-memory model: config, repacked weights, tokenizer. Read-only after load, shared by
 * every engine and session. Owns everything it points to (the files are unmapped after load).
 */
#ifndef IB_MODEL_MODEL_H
#define IB_MODEL_MODEL_H
#include "isobatch.h"
#include "model/config.h"
#include "ops/matmul.h"
#include "tokenizer/tokenizer.h"

typedef struct ib_layer {
    float *attn_norm;        /* [D]  input_layernorm */
    float *q_norm, *k_norm;  /* [hd] each; NULL without q/k norm (Llama) */
    ib_matrix wq;            /* [H*hd, D] */
    ib_matrix wk;            /* [KVH*hd, D] */
    ib_matrix wv;            /* [KVH*hd, D] */
    ib_matrix wo;            /* [D, H*hd] */
    float *mlp_norm;         /* [D]  post_attention_layernorm */
    ib_matrix w_gate;        /* [F, D] */
    ib_matrix w_up;          /* [F, D] */
    ib_matrix w_down;        /* [D, F] */
    /* Gemma 4 only (docs/gemma4.md): hd / KVH are the layer type's; mlp_norm is
     * pre_feedforward_layernorm; wv is empty (rows 0) on full layers under attention_k_eq_v */
    float *post_attn_norm;   /* [D]  post_attention_layernorm (on the attention output) */
    float *post_mlp_norm;    /* [D]  post_feedforward_layernorm (on the MLP output) */
    float layer_scalar;      /* the residual stream is multiplied by it at the layer's end (1 otherwise) */
    int hd, kvh;             /* this layer's head dim and KV heads (every arch) */
    int sliding;             /* Gemma 4: 1 = sliding_attention layer */
    /* Gemma 4's MoE block (cfg.n_experts > 0; docs/gemma4.md): the dense MLP's output is normed by
     * post_mlp_norm1, the routed experts' by post_moe_norm, their sum by post_mlp_norm */
    float *post_mlp_norm1;   /* [D]  post_feedforward_layernorm_1 */
    float *pre_moe_norm;     /* [D]  pre_feedforward_layernorm_2 (the experts' input) */
    float *post_moe_norm;    /* [D]  post_feedforward_layernorm_2 */
    ib_matrix w_router;      /* [E, D] router.proj */
    float *router_scale;     /* [D]  router.scale */
    float *expert_scale;     /* [E]  router.per_expert_scale */
    ib_matrix *e_gate;       /* [E] each [Fm, D] */
    ib_matrix *e_up;         /* [E] each [Fm, D] */
    ib_matrix *e_down;       /* [E] each [D, Fm] */
    /* Gemma 4's per-layer input block (cfg.ple_dim P > 0; docs/gemma4.md "Per-layer embeddings") */
    ib_matrix ple_gate;      /* [P, D] per_layer_input_gate */
    ib_matrix ple_proj;      /* [D, P] per_layer_projection */
    float *ple_norm;         /* [D]  post_per_layer_input_norm */
} ib_layer;

struct ib_model {
    ib_config cfg;
    ib_model_info info;
    char arch_name[16];
    char dtype_name[16];
    ib_layer *layers;        /* [n_layers] */
    ib_matrix embed;         /* [V, D]; rows read by ib_matrix_row_f32 */
    ib_matrix lm_head_own;   /* [V, D] when untied; unused (zero) when tied */
    const ib_matrix *lm_head;/* &embed when tied, else &lm_head_own */
    float *final_norm;       /* [D] */
    float embed_scale;       /* X = embedding row * embed_scale: (float)sqrt(D) for Gemma 4, else 1 */
    /* Gemma 4 per-layer embeddings (cfg.ple_dim P > 0; L layers) */
    ib_matrix ple_embed;     /* [V, L*P] embed_tokens_per_layer; rows times ple_embed_scale */
    float ple_embed_scale;   /* (float)sqrt(P) */
    ib_matrix ple_model_proj;/* [L*P, D] per_layer_model_projection */
    float *ple_proj_norm;    /* [P]  per_layer_projection_norm */
    ib_tokenizer *tok;
};

#endif
