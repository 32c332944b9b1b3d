/*
 * backend.h — the seam between the runtime and the kernels.
 *
 * The forward pass (src/runtime/step.c) is written once, as a sequence of calls into a backend's
 * table of operations. A backend owns everything the step computes on: the model's weights in its own
 * layout and memory, the step's activation buffers, and the sessions' KV caches. Nothing the runtime
 * passes across this seam is a pointer into the backend's memory; buffers are named (ib_buf), weights
 * are named (layer, ib_wsel), KV caches are opaque handles (ib_kv). So a backend whose memory is on a
 * GPU fits behind the same table as the CPU one.
 *
 * ASYNCHRONY. A step is enqueued: step_begin hands the backend the step's rows (host arrays it copies),
 * then each operation is enqueued in order, then step_end waits and leaves each wanted row's logits in
 * the host buffers named by step_begin. A backend may run each call at once (CPU) or record the whole
 * sequence and run it later, e.g. as a captured graph (a GPU); the runtime never reads a buffer between
 * step_begin and step_end except through read_rows (diagnostics), which waits.
 *
 * WHAT A BACKEND MUST GUARANTEE. Every operation produces, bit for bit, the numeric definition in
 * src/ops/ (ops.h, matmul.h, the attention and KV-policy definitions): the scalar references there are
 * the spec. Each output row depends on that row's own inputs only (and, for attention, on its own
 * session's KV), never on the number of rows, their order, or the thread/block layout. `isobatch probe
 * --backend NAME` and the invariance tests check this.
 *
 * SHAPES. A step has R rows (tokens) from n_items items (sessions); row r belongs to item row_item[r]
 * and sits at position pos[r] of that session. D = hidden size, H / KVH = query / KV heads, hd = head
 * dim, F = intermediate size (Gemma 4: layer li's own, ib_config_layer_ffn; G and U are sized for the
 * widest and a layer's rows are packed at its F), V = vocabulary. hd and KVH are layer li's own (ib_layer.hd / .kvh: the
 * same for every layer of Qwen3 and Llama, per layer type for Gemma 4); the Q, K, V and ATT rows of a
 * layer are packed at that layer's width (H*hd, KVH*hd), and a KV cache holds each layer at the shape
 * of its kind (ib_kv_desc: full layers, and Gemma 4's sliding-window layers with their own rings).
 *
 * MODEL FAMILIES. The model's arch (ib_config.arch) is fixed at load; a backend that cannot compute a
 * family fails at create naming it. Gemma 4's sequence (step.c) adds post-norms, GeGLU and a layer
 * scalar, and changes what embed, qk_prepare, attention and logits do, as stated at each.
 *
 * OWNERSHIP. The engine owns its backend instance (create/destroy). A session owns its ib_kv
 * (kv_create/kv_free through the backend kind's table, which needs no instance, so sessions can be
 * made from a model alone).
 */
#ifndef IB_BACKENDS_BACKEND_H
#define IB_BACKENDS_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "core/kv_elem.h"
#include "core/pool.h"
#include "isobatch.h"
#include "model/model.h"

/* A step's activation buffers, each [R_max][width] float32 rows owned by the backend instance. */
typedef enum ib_buf {
    IB_BUF_X = 0,   /* [R][D]  residual stream */
    IB_BUF_XN,      /* [R][D]  normed input of a block */
    IB_BUF_Q,       /* [R][H*hd] */
    IB_BUF_K,       /* [R][KVH*hd] */
    IB_BUF_V,       /* [R][KVH*hd] */
    IB_BUF_ATT,     /* [R][H*hd] attention output */
    IB_BUF_O,       /* [R][D]  output of a projection back to D */
    IB_BUF_G,       /* [R][F]  gate, then the MLP activation (F of the layer; sized ib_config_ffn_max) */
    IB_BUF_U,       /* [R][F]  up */
    IB_BUF_E,       /* [R][D]  Gemma 4 MoE: the routed experts' combined output */
    IB_BUF_COUNT
} ib_buf;

/* Matrices of a layer, by name. */
typedef enum ib_wsel { IB_W_Q = 0, IB_W_K, IB_W_V, IB_W_O, IB_W_GATE, IB_W_UP, IB_W_DOWN, IB_W_COUNT } ib_wsel;

/* Norm weights: per layer (ATTN, MLP; Gemma 4 also POST_ATTN, POST_MLP; its MoE layers also
 * POST_MLP1 = post_feedforward_layernorm_1, PRE_MOE = pre_feedforward_layernorm_2, POST_MOE =
 * post_feedforward_layernorm_2) or the model's final norm (FINAL, layer ignored). */
typedef enum ib_nsel {
    IB_N_ATTN = 0, IB_N_MLP, IB_N_FINAL, IB_N_POST_ATTN, IB_N_POST_MLP, IB_N_POST_MLP1, IB_N_PRE_MOE, IB_N_POST_MOE
} ib_nsel;

/* Most layers whose kind a KV cache records (IB_CONFIG_MAX_TYPED_LAYERS: the typed layers of Gemma 4). */
#define IB_KV_MAX_LAYERS 256

/* Shape and policy of one session's KV cache. Layer after layer, each layer's keys then values, each
 * [KVH][slots][hd] elements of dtype, at the shape of the layer's kind:
 *   full layers (every layer when n_sliding is 0): n_kv_heads x capacity x head_dim; window 0: full
 *     (slot = position); window > 0: the first `sink` positions own slots [0, sink) and later positions
 *     share a ring of capacity - sink slots (runtime/kv_policy.h);
 *   sliding-window layers (Gemma 4; sliding[li] = 1, li < IB_KV_MAX_LAYERS): sliding_kv_heads x
 *     sliding_capacity x sliding_head_dim, the slot of position pos is pos % sliding_capacity (a ring
 *     once positions pass it), and a query at p attends to positions p - sliding_window + 1 .. p. A
 *     ring keeps sliding_window + (the most tokens one step item brings) - 1 slots: an item stores all
 *     its keys before its first query reads, and that query's oldest key is the newest key's distance
 *     sliding_window + n - 2 back, so nothing it still needs is overwritten.
 * Fields after `window` are zero for a cache with no sliding layers. */
typedef struct ib_kv_desc {
    ib_kv_dtype dtype;
    int n_layers, n_kv_heads, head_dim;
    int capacity;       /* slots of a full layer */
    int sink, window;   /* KV policy of the full layers */
    int n_sliding;      /* sliding-window layers (0: none; the fields below unused) */
    int sliding_kv_heads, sliding_head_dim, sliding_capacity, sliding_window;
    unsigned char sliding[IB_KV_MAX_LAYERS];   /* [li] 1: layer li is a sliding-window layer */
    /* [li] 0: layer li has keys and values of its own; s > 0 (KV sharing, Gemma 4's
     * num_kv_shared_layers): it stores none and attends to layer s - 1's, a layer of its kind */
    short kv_from[IB_KV_MAX_LAYERS];
} ib_kv_desc;

/* A session's KV cache on some backend. The descriptor is public to the runtime; the storage is not. */
typedef struct ib_kv {
    ib_kv_desc desc;
    ib_backend_kind kind;   /* the backend whose memory holds it */
} ib_kv;


/* Whether layer li of a cache of this shape is a sliding-window layer. */
static inline int ib_kv_desc_sliding(const ib_kv_desc *d, int li) {
    return d->n_sliding > 0 && li < IB_KV_MAX_LAYERS && d->sliding[li];
}

/* Layer li of a cache as a one-layer cache of its own: its kind's heads, head size and slots, and the
 * policy its slots and attention follow (a sliding layer: sink 0, window sliding_window, so
 * ib_kv_desc_slot is pos % sliding_capacity and ib_attend_policy reads its window). */
static inline ib_kv_desc ib_kv_desc_layer(const ib_kv_desc *d, int li) {
    ib_kv_desc v = {.dtype = d->dtype, .n_layers = 1, .n_kv_heads = d->n_kv_heads, .head_dim = d->head_dim,
                    .capacity = d->capacity, .sink = d->sink, .window = d->window};
    if (ib_kv_desc_sliding(d, li)) {
        v.n_kv_heads = d->sliding_kv_heads;
        v.head_dim = d->sliding_head_dim;
        v.capacity = d->sliding_capacity;
        v.sink = 0;
        v.window = d->sliding_window;
    }
    return v;
}

/* The layer whose keys and values layer li reads: li, or its KV-sharing source. */
static inline int ib_kv_desc_owner(const ib_kv_desc *d, int li) {
    return li < IB_KV_MAX_LAYERS && d->kv_from[li] > 0 ? d->kv_from[li] - 1 : li;
}

/* Elements of layer li's keys and values (2 x KVH x slots x hd) in a cache of this shape; 0 for a
 * KV-shared layer (it holds none). */
static inline size_t ib_kv_desc_layer_elems(const ib_kv_desc *d, int li) {
    if (ib_kv_desc_owner(d, li) != li) return 0;
    if (ib_kv_desc_sliding(d, li))
        return (size_t)2 * d->sliding_kv_heads * (size_t)d->sliding_capacity * d->sliding_head_dim;
    return (size_t)2 * d->n_kv_heads * (size_t)d->capacity * d->head_dim;
}

/* Elements (keys and values) of a KV cache of this shape. */
static inline size_t ib_kv_desc_elems(const ib_kv_desc *d) {
    size_t n = 0;
    for (int li = 0; li < d->n_layers; li++) n += ib_kv_desc_layer_elems(d, li);
    return n;
}

/* Bytes of a KV cache of this shape. */
static inline size_t ib_kv_desc_bytes(const ib_kv_desc *d) { return ib_kv_bytes(d->dtype, ib_kv_desc_elems(d)); }

/* Slot of position pos in a one-layer view (ib_kv_desc_layer) or a cache with no sliding layers. */
static inline int ib_kv_desc_slot(const ib_kv_desc *d, int pos) {
    if (d->window <= 0 || pos < d->sink) return pos;
    return d->sink + (pos - d->sink) % (d->capacity - d->sink);
}

/* The rows of one step, as the runtime hands them to step_begin (host arrays, copied by the backend
 * before step_begin returns, so the caller may reuse them at once). */
typedef struct ib_step_desc {
    int R, n_items;
    const int32_t *tok;        /* [R] token ids (validated: inside the vocabulary) */
    const int32_t *pos;        /* [R] position of each row in its session */
    const int32_t *rope_pos;   /* [R] position RoPE rotates by (pos, except under test-only faults) */
    const int32_t *row_item;   /* [R] item of each row; rows of an item are consecutive, in order */
    ib_kv *const *kv;          /* [n_items] each item's KV cache, of this backend's kind */
    int attn_block;            /* key block of attention's online softmax (ib_attn_block_for) */
    int n_logits;              /* rows whose logits are wanted (<= R) */
    const int32_t *logit_row;  /* [n_logits] those rows, ascending */
    float *const *logits_out;  /* [n_logits] host buffers of V floats each, filled by step_end; an entry
                                * may be NULL where argmax_out's is not (those logits stay where they are) */
    int32_t *const *argmax_out;/* [n_logits] where step_end writes ib_argmax of each wanted row's logits
                                * (NULL entries: not wanted) */
} ib_step_desc;

/* Engine-level settings a backend instance is created with. */
typedef struct ib_backend_cfg {
    ib_isa isa;          /* CPU: resolved (never AUTO) and supported; others ignore it */
    ib_act act;          /* resolved: IB_ACT_F32 or IB_ACT_Q8 */
    int max_rows;        /* R_max: most rows a step may bring */
    ib_pool *pool;       /* the engine's host thread pool (a CPU backend computes on it) */
} ib_backend_cfg;

typedef struct ib_backend ib_backend;   /* an instance: one per engine */

/* Phases of qk_prepare. */
enum { IB_QK_NORM = 1, IB_QK_ROPE_STORE = 2 };

typedef struct ib_backend_ops {
    const char *name;                    /* "cpu", "cuda" */
    ib_backend_kind kind;

    /* Whether this build and machine can run the backend (a GPU present, …); when not, *why gets a
     * static one-line reason. */
    int (*available)(const char **why);
    /* The KV element types its caches and attention run: bit (1u << t) for each ib_kv_dtype t. */
    unsigned kv_dtypes;
    /* Where its KV caches live when that is not host memory (a GPU's): the bytes free and in all now;
     * 0 when read, -1 when they cannot be. NULL: the caches live in host memory. */
    int (*device_memory)(size_t *free_bytes, size_t *total_bytes);

    /* ---- instance: weights and step scratch ---- */
    /* Make an instance for model m: weights in the backend's memory and layout, scratch for
     * cfg->max_rows rows. Fails cleanly (nothing left allocated) with a one-line message. */
    ib_status (*create)(const ib_model *m, const ib_backend_cfg *cfg, ib_backend **out, ib_error *err);
    void (*destroy)(ib_backend *b);

    /* ---- KV caches (no instance needed) ---- */
    /* Allocate a zeroed KV cache of this shape. */
    ib_status (*kv_create)(const ib_kv_desc *d, ib_kv **out, ib_error *err);
    void (*kv_free)(ib_kv *kv);
    /* Copy slots [0, min(n_slots, the layer's slots)) of every (layer, k|v, head) plane from src to dst
     * (same dtype, layers, layer kinds, heads, head sizes; capacities may differ, and a layer whose
     * capacities differ has at most its smaller capacity of slots copied). */
    void (*kv_copy)(ib_kv *dst, const ib_kv *src, int n_slots);

    /* ---- one step, enqueued in this order by src/runtime/step.c ---- */
    /* Take the step's rows; RoPE tables for rope_pos. */
    ib_status (*step_begin)(ib_backend *b, const ib_step_desc *d, ib_error *err);
    /* X[r] = embedding row tok[r] (dequantized as ib_matrix_row_f32); times model->embed_scale
     * (ib_scale) when that is not 1 (Gemma 4). */
    void (*embed)(ib_backend *b);
    /* out[r] = rmsnorm(in[r]) with norm `n` of layer li (ops.h ib_rmsnorm; in and out may be equal). */
    void (*rmsnorm)(ib_backend *b, ib_buf in, ib_nsel n, int li, ib_buf out);
    /* outs[i] = in · W_i^T for the n (1..3) matrices ws[i] of layer li that read the same input
     * (matmul.h, under the engine's activation mode; Q8 quantizes `in` once, ib_quantize_act). */
    void (*linear)(ib_backend *b, int li, int n, const ib_wsel *ws, ib_buf in, const ib_buf *outs);
    /* Layer li's q/k head norms (IB_QK_NORM: ib_rmsnorm_heads, when the model has them) and/or the
     * rotary embedding of Q and K followed by the store of each row's K and V into its session's
     * cache at the slot of pos[r] in the layer's view (ib_kv_desc_layer, ib_kv_desc_slot) (IB_QK_ROPE_STORE:
     * ib_rope_step_rows; half KV rounded by ib_f32_to_f16).
     * Gemma 4, IB_QK_NORM: first V = K when the layer has no v_proj (attention_k_eq_v), then q_norm,
     * k_norm and the weightless v_norm (ib_rmsnorm_heads with w NULL); IB_QK_ROPE_STORE: the RoPE
     * table of the layer's type (sliding: ib_rope_table with rope_theta; full: ib_rope_table_pairs
     * over global_head_dim with rope_theta_full and rope_pairs_full). A KV-shared layer (no k_proj;
     * kv_from in ib_kv_desc): Q alone (q_norm, RoPE), nothing stored. */
    void (*qk_prepare)(ib_backend *b, int li, int phases);
    /* ATT[r] = attention of Q[r] over keys 0..pos[r] of its session at layer li (the layer's view,
     * ib_kv_desc_layer: window 0: ib_attend_heads order; window > 0: ib_attend_policy order, which for
     * a sliding layer is its last sliding_window keys), key block attn_block. Scale 1/sqrt(hd); Gemma 4:
     * scale 1. A KV-shared layer reads the keys and values of its source layer (ib_kv_desc_owner). */
    void (*attention)(ib_backend *b, int li);
    /* G = silu(G) * U (ib_swiglu). */
    void (*swiglu)(ib_backend *b);
    /* G = gelu_tanh(G) * U (ib_geglu; Gemma 4) over layer li's F (ib_config_layer_ffn: 2F on a
     * double-wide KV-shared layer), the width its gate/up products packed G and U's rows at. */
    void (*geglu)(ib_backend *b, int li);
    /* Gemma 4's routed experts of layer li (docs/gemma4.md "Mixture of experts"; NULL in a backend
     * that cannot run them). Per row r: the router input rmsnorm(route_in[r], router.scale) then
     * ib_scale by (float)(1/sqrt(D)); its logits = that · router.proj^T (matmul.h, the engine's
     * activation mode); ib_moe_route; each selected expert's GeGLU MLP on in[r] (gate, up: matmul.h
     * products, ib_geglu, down: a product); out[r] = ib_moe_combine of those outputs in rank order.
     * Batched: every expert's three matrices are streamed once for all the rows routed to it (a
     * product's rows are independent, so each row's numbers are those of the row alone). */
    void (*moe)(ib_backend *b, int li, ib_buf route_in, ib_buf in, ib_buf out);
    /* X *= layer li's layer_scalar (ib_scale; Gemma 4). */
    void (*scale_layer)(ib_backend *b, int li);
    /* x += y (ib_add), all R rows. */
    void (*add)(ib_backend *b, ib_buf x, ib_buf y);
    /* For each wanted row j (< n_logits): XN[j] = final norm of X[logit_row[j]] (XN's other rows are
     * left undefined), then that row's logits = XN[j] · lm_head^T, delivered by step_end; then
     * ib_softcap with final_logit_softcapping when the config has one (Gemma 4). */
    void (*logits)(ib_backend *b);
    /* Wait for the step; every logits_out buffer is filled. */
    ib_status (*step_end)(ib_backend *b, ib_error *err);

    /* ---- diagnostics ---- */
    /* Rows [0, R) of buffer `buf` (width floats each) as host memory, valid until the next call on b.
     * Waits for the work enqueued so far. */
    const float *(*read_rows)(ib_backend *b, ib_buf buf, int R, int width);
    /* Set rows [0, R) of buffer `buf` (width floats each) from host memory x, in stream order with the
     * enqueued work (the op checker feeds every op its inputs this way). */
    void (*write_rows)(ib_backend *b, ib_buf buf, int R, int width, const float *x);

    /* ---- Gemma 4 per-layer embeddings (cfg.ple_dim P > 0; docs/gemma4.md "Per-layer embeddings");
     * NULL in a backend that cannot run them (ib_engine_create then refuses such a model) ---- */
    /* After embed: each row's per-layer inputs PLI[r] ([L][P], kept by the backend for the step) =
     * (A + B) then ib_scale by (float)(1/sqrt(2)), where A = X[r] · per_layer_model_projection^T
     * (matmul.h), ib_scale by (float)(1/sqrt(D)), then each P-slice rmsnorm'ed with
     * per_layer_projection_norm, and B = embed_tokens_per_layer row tok[r] (ib_matrix_row_f32) ib_scale'd
     * by ple_embed_scale. Each row's own numbers. */
    void (*ple_inputs)(ib_backend *b);
    /* Layer li's per-layer input block on the residual: G[r] = X[r] · per_layer_input_gate^T, then
     * ib_geglu(G[r], PLI[r][li]) (gelu_tanh(G) * PLI), Y[r] = G[r] · per_layer_projection^T,
     * rmsnorm'ed with post_per_layer_input_norm, X[r] += Y[r] (ib_add). */
    void (*ple_layer)(ib_backend *b, int li);
    /* Diagnostics (the op checker): rows [0, R) of the per-layer inputs PLI ([R][L*P]) that ple_inputs
     * left, as host memory valid until the next call on b; waits for the work enqueued so far. NULL in a
     * backend that cannot show them (the checker then judges ple_inputs through ple_layer). */
    const float *(*read_ple_inputs)(ib_backend *b, int R);
} ib_backend_ops;

/* An instance starts with a pointer to its kind's table, so the runtime can call through it. */
struct ib_backend {
    const ib_backend_ops *ops;
};

/* The table of a backend kind; NULL when the kind is not compiled into this build. */
const ib_backend_ops *ib_backend_ops_for(ib_backend_kind kind);

/* The backends compiled in. */
extern const ib_backend_ops ib_backend_cpu;
#ifdef IB_HAVE_CUDA
extern const ib_backend_ops ib_backend_cuda;
#endif

#endif
