/*
 * diag.h — the diagnostics behind `isobatch probe`, `isobatch diff` and `isobatch recall`
 * (docs/diagnostics.md shows them at work). Library code: it computes and returns results, the
 * tools print them. Faults are injected with ib_fault_set (isobatch.h) before a run.
 *
 *   probe   every op the model uses, alone, over a [B,H,T,D] shape matrix: identical input rows must
 *           give identical output rows, and each row of a batched run must equal a B = 1 run of that
 *           row, bitwise (probe.c).
 *   diff    sessions stepped batched vs each alone, every layer's sub-outputs captured through
 *           ib_engine_set_capture and compared; names the first divergent layer and sub-op
 *           (capture.c).
 *   recall  the multi-tenant needle test: needle documents built per spec/needle.md, decoded batched
 *           and serialized; recall, tokens/s and bitwise agreement per mode (recall.c).
 *   accuracy  the engine's logits against a float64 reference forward pass of the same model, per
 *           activation mode: top-1 agreement, KL, max and relative L2 logit error (reference.c).
 */
#ifndef IB_DIAG_DIAG_H
#define IB_DIAG_DIAG_H
#include <stdint.h>

#include "isobatch.h"

/* ================================================================ probe */

/* Why a probe case failed (bits of ib_probe_case.fail). */
#define IB_PROBE_FAIL_ROWS 1   /* identical input rows gave different output rows */
#define IB_PROBE_FAIL_BATCH 2  /* a row of the batched run differs from a B = 1 run of that row */
#define IB_PROBE_FAIL_ISA 4    /* a B = 1 run differs from the scalar backend's B = 1 run */

/* One op of the probe: a kernel of the model with one fixed configuration. */
typedef struct ib_probe_op_info {
    const char *name;    /* "rope/halves/row-pos"; the family is the part before the first '/' */
    int H, D;            /* the fixed head count and row width of its [B,H,T,D] shape */
    int uses_pos;        /* 0: the op has no position input, the position axis is skipped */
    int isa_dep;         /* 1: one kernel per ISA (run per backend and compared with scalar);
                          * 0: one C kernel for every ISA (run once, backend "any") */
    int rows_check;      /* 0: identical-row check skipped (the rows get different positions) */
    int int_out;         /* 1: outputs are token ids (the ulp columns count differing ids) */
    const char *about;   /* one line: what a case runs */
} ib_probe_op_info;

/* The probe's ops, in run order. */
int ib_probe_n_ops(void);
const ib_probe_op_info *ib_probe_op(int i);

/* 1 when the op is selected by sel: its full name, or its family ("rope", "matmul", …). */
int ib_probe_op_selected(const ib_probe_op_info *op, const char *sel);

/* The full shape matrix `isobatch probe` runs by default. */
extern const int ib_probe_default_B[7];    /* 1 2 3 4 8 16 33 */
extern const int ib_probe_default_T[4];    /* 1 2 7 64 */
extern const int ib_probe_default_pos[4];  /* 0 1 148 4095 */

/* One case's outcome. */
typedef struct ib_probe_case {
    const ib_probe_op_info *op;
    ib_isa isa;          /* the backend; IB_ISA_AUTO for ops run once ("any") */
    int B, H, T, D;
    int pos;             /* first position of each item; -1 when the op has no position */
    double row_diff;     /* max |y_b - y_0| over rows of identical inputs (inf for NaN); -1 if skipped */
    uint64_t ulp_batch;  /* max ulp distance, batched row vs its B = 1 run (ids: differing count) */
    long long ulp_isa;   /* max ulp distance, B = 1 run vs scalar B = 1 run; -1 when not compared */
    int fail;            /* IB_PROBE_FAIL_* bits, 0 = pass */
} ib_probe_case;

typedef void (*ib_probe_report_fn)(void *ctx, const ib_probe_case *c);

typedef struct ib_probe_opts {
    const ib_isa *isas;  /* backends to run ISA-dependent ops on (each must be supported) */
    int n_isas;
    const char *op;      /* NULL = every op, else a name or family */
    const int *Bs;       /* shape lists; NULL = the defaults above */
    int n_B;
    const int *Ts;
    int n_T;
    const int *pos;
    int n_pos;
    int threads;         /* threads of the batched runs (B = 1 reference runs use one); <= 0: 1 */
    uint64_t seed;       /* input data; each case's data depends on (seed, op, B, T, pos) only */
} ib_probe_opts;

/* Run every selected case, calling fn (may be NULL) for each as it finishes; *n_fail gets the number
 * of failing cases. Fails only on bad options or out of memory. */
ib_status ib_probe_run(const ib_probe_opts *o, ib_probe_report_fn fn, void *ctx, int *n_fail, ib_error *err);

/* ================================================================ diff */

/* Capture points, in forward order: IB_DIFF_LAYER_POINTS per layer, then the final ones. Gemma 4 has
 * points the other families lack (post-norms, the MoE block's), and its "v" is captured after the
 * head norms (its values are normed there), so for it "v" sits before q_norm in this list but comes
 * after k_norm in the step. */
#define IB_DIFF_LAYER_POINTS 23
#define IB_DIFF_POINTS 25
/* Name of capture point p (0 <= p < IB_DIFF_POINTS), as ib_capture_fn receives it. */
const char *ib_diff_point_name(int p);
/* The op that produces point p at layer `layer` ("rmsnorm", "matmul", "rope", "attention", …;
 * layer_in is "embed" at layer 0 and "previous layer" after). */
const char *ib_diff_point_op(int layer, int p);

typedef struct ib_diff_opts {
    int step;            /* K: the step whose per-layer table is kept; steps 0..K run (0 = prefill) */
    int batch;           /* sessions per batched step; 0 = all */
    int threads;         /* engine threads (both modes use the same engine) */
    ib_isa isa;
    ib_act act;
    ib_backend_kind backend;
} ib_diff_opts;

/* Where a step first diverged, in forward order (layer n_layers holds final_norm and logits). */
typedef struct ib_diff_first {
    int layer;           /* -1 when the step matched bitwise everywhere */
    int point;           /* index for ib_diff_point_name */
} ib_diff_first;

typedef struct ib_diff_result {
    int n_sessions, n_layers, n_steps;   /* n_steps = K + 1 */
    int *prompt_len;                     /* [n_sessions] */
    /* at step K, per (layer 0..n_layers, point, session): max |batched - alone| over the session's
     * rows (inf for NaN), or -1 where the point does not exist (a Llama's q_norm, a final point
     * inside a layer, a per-layer point at layer n_layers) */
    double *maxdiff;                     /* [n_layers + 1][IB_DIFF_POINTS][n_sessions] */
    unsigned char *differs;              /* same shape: 1 when any bit differs */
    ib_diff_first *first;                /* [n_steps] per step */
    double *logit_diff;                  /* [n_steps][n_sessions] max |logits batched - alone| */
    int32_t *tokens;                     /* [n_steps][n_sessions] token fed at each decode step
                                          * (the alone run's greedy choice; step 0 unused) */
    int first_step;                      /* earliest step that diverged, -1 when none */
} ib_diff_result;

/* Step n sessions (prompts[i], lens[i] tokens) batched and each alone, steps 0..o->step: step 0
 * prefills each whole prompt, step s >= 1 feeds each session the token its alone run chose greedily
 * at step s-1 (both modes, so their inputs stay equal). Fills r (free with ib_diff_result_free). */
ib_status ib_diff_run(const ib_model *m, const int32_t *const *prompts, const int *lens, int n,
                      const ib_diff_opts *o, ib_diff_result *r, ib_error *err);
void ib_diff_result_free(ib_diff_result *r);

/* ================================================================ recall */

/* spec/needle.json, parsed (see spec/needle.md). */
typedef struct ib_needle_spec ib_needle_spec;
ib_status ib_needle_spec_load(const char *path, ib_needle_spec **out, ib_error *err);
void ib_needle_spec_free(ib_needle_spec *s);
/* The spec's benchmark_seed_base and heldout_lengths (for defaults and notices). */
uint64_t ib_needle_seed_base(const ib_needle_spec *s);
int ib_needle_heldout_length(const ib_needle_spec *s, int i);  /* -1 past the end */
/* Draw case words from train_words instead of heldout_words (a diagnostic for models that only
 * retrieve codes they were trained on; not the benchmark). */
void ib_needle_use_train_words(ib_needle_spec *s);

/* One benchmark case (spec/needle.md). */
typedef struct ib_needle_case {
    uint64_t seed;
    int length;          /* target L in tokens */
    int depth;           /* percent */
    int n_lines;         /* filler lines */
    int needle_at;       /* filler lines before the needle */
    int doc_tokens;      /* tokens of the whole document (<= length) */
    char code[64];       /* "WORD-NNNN" */
    char *prompt;        /* the document up to and including "Answer:" */
    char *answer;        /* the expected continuation " WORD-NNNN." */
    int32_t *ids;        /* [n_ids] prompt tokens (model tokenizer, no BOS) */
    int n_ids;
} ib_needle_case;

/* Build the benchmark case of seed `seed` at length L with the model's tokenizer: held-out words,
 * the depth drawn from heldout_depth_percent; n = the most filler lines that keep the whole
 * document within L tokens. Fails (IB_ERR_INVALID_ARG) when even n = 0 exceeds L. */
ib_status ib_needle_case_make(const ib_needle_spec *sp, const ib_model *m, uint64_t seed, int length,
                              ib_needle_case *c, ib_error *err);
void ib_needle_case_free(ib_needle_case *c);

typedef struct ib_recall_opts {
    int batch;           /* sessions per step in the batched mode (>= 1) */
    int threads;
    ib_isa isa;
    ib_act act;
    ib_backend_kind backend;
    int max_step_tokens; /* 0 = enough to prefill `batch` whole prompts in one step (512 .. 16384) */
    /* Called as each case finishes in each mode ("serialized", then "batched"): cases done of n and
     * how many of those recalled the code. NULL = none. On the calling thread. */
    void (*progress)(void *ctx, const char *mode, int done, int n, int recalled);
    void *progress_ctx;
} ib_recall_opts;

typedef struct ib_recall_mode {
    int recalled;        /* cases whose greedy continuation starts with " CODE" */
    double seconds;
    long prompt_tokens, generated_tokens;
} ib_recall_mode;

typedef struct ib_recall_result {
    int n;
    ib_recall_mode serial, batched;
    int *max_new;                        /* [n] new-token limit of each case (the same in both modes) */
    int *ok_serial, *ok_batched;         /* [n] recalled per case */
    int *match;                          /* [n] 1 when tokens and logits digests agree bitwise */
    char **text_serial, **text_batched;  /* [n] generated text (raw bytes, NUL-terminated) */
    int all_match;
} ib_recall_result;

/* Decode every case greedily in both modes — serialized (batch 1) and batched (o->batch sessions
 * per step, continuous batching) — each with its own engine. Case i generates until the model's eos
 * or r->max_new[i] tokens: the answer budget (the longest expected answer of the set in tokens, + 1),
 * or fewer when its own prompt leaves less room in the model's context (P prompt tokens leave
 * max_context - P + 1: the last token is not fed); the same limit in both modes, so outputs compare
 * bitwise. Fails (IB_ERR_CONTEXT) before any work when a prompt exceeds the context. Fills r
 * (ib_recall_result_free). */
ib_status ib_recall_run(const ib_model *m, const ib_needle_case *cases, int n, const ib_recall_opts *o,
                        ib_recall_result *r, ib_error *err);
void ib_recall_result_free(ib_recall_result *r);

/* ================================================================ accuracy */

/* The logits of every position of one sequence, tokens[0..T) fed from position 0, by a float64 forward
 * pass written apart from the engine's ops (weights read as floats through ib_matrix_row_f32, the values
 * the F32 activation path uses; everything else in double). logits: [T][vocab], row t = the logits
 * after token t. Fails (nothing written) when T < 1, T > max_position_embeddings or a token id is
 * outside the vocabulary, or on out of memory. Splits each product's rows over the CPUs online (at most
 * 64; each output is one thread's, so the split changes nothing). */
ib_status ib_reference_logits(const ib_model *m, const int32_t *tokens, int T, double *logits, ib_error *err);

/* How the reference pass stores its activations: as doubles (IB_REF_STORE_F64, ib_reference_logits), or
 * rounded to float32 at the engine's storage points of the parts set in a mask of the bits below, while
 * every operation stays double — what float32 storage of those values alone costs: with every part
 * (IB_REF_STORE_F32), the floor of an engine that stores its activations as float32 (`accuracy
 * --ref-store f32`, `--floor`); one part at a time, that part's share of it (`--floor-parts`). */
#define IB_REF_STORE_PARTS 8   /* the part bits below: 1 << 0 .. 1 << (IB_REF_STORE_PARTS - 1) */
typedef enum ib_ref_store {
    IB_REF_STORE_F64 = 0,
    IB_REF_F32_RESIDUAL = 1 << 0,   /* the residual stream (after each block joins it, and the embedding) */
    IB_REF_F32_NORMED = 1 << 1,     /* norms' outputs that products read (the MoE router's input too) */
    IB_REF_F32_QKV = 1 << 2,        /* q, k, v after their norms, and after RoPE */
    IB_REF_F32_ATTENTION = 1 << 3,  /* attention's output */
    IB_REF_F32_BLOCK = 1 << 4,      /* a block's normed output before it joins the residual, the MoE sums,
                                     * Gemma 4's per-layer inputs */
    IB_REF_F32_HIDDEN = 1 << 5,     /* the MLPs' gated hidden values (GeLU/SiLU times up), experts' too */
    IB_REF_F32_PRODUCTS = 1 << 6,   /* every product's output */
    IB_REF_F32_LOGITS = 1 << 7,     /* the logits */
    IB_REF_STORE_F32 = (1 << IB_REF_STORE_PARTS) - 1 /* every part */
} ib_ref_store;

/* The name of one part bit of ib_ref_store ("residual", "normed", "qkv", "attention", "block", "hidden",
 * "products", "logits"); NULL for anything else. */
const char *ib_ref_store_part_name(ib_ref_store part);

/* ib_reference_logits with the storage st (a mask of the part bits); the same failures, and a bit
 * outside IB_REF_STORE_F32. */
ib_status ib_reference_logits_stored(const ib_model *m, const int32_t *tokens, int T, ib_ref_store st,
                                     double *logits, ib_error *err);

/* Engine logits against reference logits, accumulated token by token. */
typedef struct ib_accuracy {
    int tokens;             /* tokens compared */
    int top1_agree;         /* tokens whose argmax (ties to the lowest id) agrees */
    double top1_fraction;   /* top1_agree / tokens */
    double kl_mean, kl_max; /* KL(ref || engine) per token in nats, log-softmax in double for both */
    double max_abs_diff;    /* max |engine - ref| over all logits */
    double rel_l2;          /* ||engine - ref||_2 / ||ref||_2 over all logits of all tokens */
    double seconds;         /* ib_accuracy_run: time stepping the engine */
    ib_isa isa;             /* ib_accuracy_run: the ISA the engine used */
    double kl_sum, sum_sq_diff, sum_sq_ref;  /* running sums behind the fields above */
} ib_accuracy;

/* Add one token's comparison (ref [V] doubles, eng [V] floats) to a (zero-initialised first) and
 * update its derived fields. */
void ib_accuracy_add(ib_accuracy *a, const double *ref, const float *eng, int V);
/* Recompute the derived fields (fraction, mean, relative L2) from the counts and sums. */
void ib_accuracy_finish(ib_accuracy *a);

/* Create an engine with opts (NULL: defaults) and one session keeping KV of type kvd, feed
 * tokens[0..T) one ib_step at a time, and compare the logits after each token with ref ([T][vocab],
 * e.g. from ib_reference_logits) into *out. Fails with the engine's, the session's or the step's error
 * (e.g. act q8 on a float model). */
ib_status ib_accuracy_run(const ib_model *m, const ib_engine_opts *opts, ib_kv_dtype kvd, const int32_t *tokens, int T,
                          const double *ref, ib_accuracy *out, ib_error *err);

/* Create an engine with opts (NULL: defaults) and one session keeping KV of type kvd, feed tokens[0..T)
 * one ib_step at a time (as ib_accuracy_run does) and store the logits after each token: logits [T][vocab] floats, row t =
 * after token t. *isa_out (may be NULL): the ISA the engine used; *seconds (may be NULL): the stepping
 * time. Fails with the engine's or the step's error; logits is then undefined. */
ib_status ib_engine_logits_all(const ib_model *m, const ib_engine_opts *opts, ib_kv_dtype kvd, const int32_t *tokens,
                               int T, float *logits, ib_isa *isa_out, double *seconds, ib_error *err);

/* ---- the backend op check (backend_check.c): every op of a backend's table against the scalar
 * references of src/ops/, bitwise, inside whole steps of the model (several sessions at different
 * positions and lengths; f32 and f16 KV; full and sink+window caches). */
typedef struct ib_opcheck {
    const char *op;       /* "embed", "rmsnorm", "linear q/k/v", "q/k norm", "rope", "kv store + attention",
                           * "linear o", "add", "linear gate/up", "swiglu", "linear down", "final norm", "logits" */
    const char *config;   /* "f32 KV, full", "f16 KV, sink+window", ... */
    long elems;           /* floats compared in this call */
    long mismatches;      /* of them, not bitwise equal to the reference */
} ib_opcheck;
typedef void (*ib_opcheck_fn)(void *ctx, const ib_opcheck *r);

typedef struct ib_backend_check_opts {
    ib_backend_kind backend;
    ib_isa isa;           /* the CPU backend's ISA (AUTO: the best this CPU runs) */
    ib_act act;           /* AUTO: as an engine would choose for the model */
    int threads;
} ib_backend_check_opts;

/* Run the check on model m; fn (may be NULL) gets one result per op call. *mismatches = the total
 * count of floats that differ from the reference (0: the backend is exact). The references run with
 * the test-only faults off; the backend runs with whatever fault is set. Errors (backend unavailable,
 * out of memory) return non-OK. */
ib_status ib_backend_check(const ib_model *m, const ib_backend_check_opts *o, ib_opcheck_fn fn, void *ctx,
                           long *mismatches, ib_error *err);

#endif
