/*
 * isobatch.h — the public C API of isobatch.
 *
 * isobatch serves a decoder-only LLM (Qwen3, Llama 3) to many sessions at once, and batching never
 * changes an answer: a session's logits at every step are bit-for-bit what it would get decoded alone,
 * whatever the batch size, the other sessions, the thread count, the prefill chunking or the
 * instruction set used.
 *
 * OVERVIEW
 *
 *   ib_model    read-only weights + config, loaded from a Hugging Face / MLX model directory.
 *               Shared by every engine and session; free it last.
 *   ib_engine   the compute side: a persistent thread pool, the chosen ISA and activation mode, and
 *               scratch buffers sized for a maximum number of tokens per step. One engine steps many
 *               sessions together. Not thread-safe: one caller at a time.
 *   ib_session  one user's state: its KV cache, its position and its sampling settings/seed.
 *
 *   Typical use (dir: a model directory; ids[n]: prompt token ids; tests/t_lib.sh compiles and runs
 *   this block, so it cannot go stale):
 *
 *     ib_error err;
 *     ib_model *m;   if (ib_model_load(dir, NULL, &m, &err)) { puts(err.msg); return 1; }
 *     ib_engine *e;  ib_engine_create(m, NULL, &e, &err);
 *     ib_session *s; ib_session_create(m, NULL, &s, &err);
 *     float *buf = malloc(ib_model_get_info(m)->vocab_size * sizeof *buf);
 *     ib_step_item it = { .session = s, .tokens = ids, .n_tokens = n, .logits = buf };
 *     ib_step(e, &it, 1, &err);      // buf now holds the logits after the last of the n tokens
 *     int32_t next = ib_sample(s, buf);
 *     ib_session_free(s); ib_engine_free(e); ib_model_free(m); free(buf);
 *
 * LINKING
 *
 *   `make install` (PREFIX=/usr/local, DESTDIR for staging) installs this header, libisobatch.a,
 *   libisobatch.so and a pkg-config file:
 *
 *     cc app.c $(pkg-config --cflags --libs isobatch)          # shared (libisobatch.so.0)
 *     cc app.c $(pkg-config --cflags --libs isobatch-static)   # static: libisobatch.a with jansson,
 *                                                              # pcre2-8, utf8proc, microhttpd, m
 *
 * THE BATCHED STEP
 *
 *   ib_step() takes any set of distinct sessions, each at its own position, each with its own
 *   number of new tokens (a prefill chunk or one decode token), runs them through the model in one
 *   pass — each weight matrix is streamed once for all rows — appends their keys/values to each
 *   session's KV cache, advances each position, and writes each item's logits for its last token
 *   (and/or their argmax: with a GPU backend the logits then need not leave the device).
 *
 * INVARIANCE CONTRACT
 *
 *   For one model, one activation mode and one session's inputs, the logits written by ib_step and
 *   the tokens chosen by ib_sample are bitwise identical regardless of batch composition, row order,
 *   thread count, prefill chunking, and ISA (scalar / AVX2 / AVX-512 / NEON). The tests prove it, and
 *   each test is shown to fail under a deliberate fault (see ib_fault below).
 *
 * ERRORS AND OWNERSHIP
 *
 *   Every fallible call returns an ib_status (IB_OK == 0) and, when `err` is non-NULL, fills it with
 *   the code and a one-line message naming what was wrong (file, tensor, field, byte offset).
 *   The library never exits or prints. On failure nothing is allocated or changed ("no partial
 *   state"): output pointers are set to NULL. Objects returned through `**out` are owned by the
 *   caller and released by the matching _free function (which accepts NULL).
 */
#ifndef ISOBATCH_H
#define ISOBATCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- version */

#define IB_VERSION_MAJOR 0
#define IB_VERSION_MINOR 1
#define IB_VERSION_PATCH 0
#define IB_VERSION_STRING "0.1.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons */
#define IB_VERSION_NUMBER (IB_VERSION_MAJOR * 10000 + IB_VERSION_MINOR * 100 + IB_VERSION_PATCH)

/* The version of the library actually linked ("0.1.0"), which may differ from IB_VERSION_STRING
 * of the header a program was compiled with. */
const char *ib_version(void);

/* ---------------------------------------------------------------- status codes */

typedef enum ib_status {
    IB_OK = 0,
    IB_ERR_INVALID_ARG,   /* a caller passed an impossible argument */
    IB_ERR_NOMEM,         /* an allocation failed */
    IB_ERR_IO,            /* a file could not be opened, read, mapped or written */
    IB_ERR_FORMAT,        /* a file is malformed (safetensors header, JSON syntax, …) */
    IB_ERR_MODEL,         /* a well-formed model contradicts itself or lacks a tensor */
    IB_ERR_UNSUPPORTED,   /* a valid feature isobatch does not implement */
    IB_ERR_CONTEXT,       /* a session's context is full */
    IB_ERR_STATE,         /* the call is not valid now (e.g. a session twice in one step) */
    IB_ERR_NOT_FOUND,     /* a named thing does not exist (a stored session id) */
    IB_STATUS_COUNT
} ib_status;

/* Static English name of a status code ("invalid argument", …); never NULL. */
const char *ib_strerror(ib_status code);

/* A status with its one-line message. Library calls fill it on failure. */
typedef struct ib_error {
    ib_status code;
    char msg[512];
} ib_error;

/* ---------------------------------------------------------------- numeric options */

/* Instruction set for the CPU kernels. AUTO picks the best the CPU supports. All give the same bits.
 * AVX2, AVX512 and AMX exist on x86-64 builds, NEON (AArch64 Advanced SIMD) on aarch64 builds. AMX is
 * AVX512 whose Q8-activation products of 16 rows or more run on AMX-INT8 tiles (Linux grants the tile
 * state on request). */
typedef enum ib_isa { IB_ISA_AUTO = 0, IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512, IB_ISA_NEON, IB_ISA_AMX } ib_isa;

/* Activation mode for matrix products. F32: float activations against dequantized weights (the
 * accuracy path). Q8: activations quantized to int8 per weight group, exact integer block dot
 * products (the fast path for quantized weights). Results differ between modes, never within one.
 * AUTO: Q8 for quantized models, F32 for float ones. */
typedef enum ib_act { IB_ACT_AUTO = 0, IB_ACT_F32, IB_ACT_Q8 } ib_act;

/* Name of an ISA ("scalar", …), and whether this CPU can run it. */
const char *ib_isa_name(ib_isa isa);
int ib_isa_supported(ib_isa isa);
/* Parse "auto|scalar|avx2|avx512|neon|amx" / "auto|f32|q8"; return 0 on success, -1 on an unknown name. */
int ib_isa_parse(const char *s, ib_isa *out);
int ib_act_parse(const char *s, ib_act *out);

/* Element type of a session's KV cache. F32: float32. F16: IEEE half, rounded to nearest even when
 * written and converted exactly when read: half the memory and the bandwidth attention reads; answers
 * differ slightly from F32's, but never between batchings, thread counts, chunkings, ISAs or backends
 * (the rounding is a function of the value alone). Q8: 8-bit codes with a float scale per 32
 * elements of a row (src/core/kvq8.h), 1.125 bytes an element (56% of F16's memory and attention
 * bandwidth); answers differ more from F32's than F16's do (docs/cpu.md measures by how much), and
 * likewise never between batchings (each block's scale is a function of its own 32 values). Q8 needs
 * head dims that are multiples of 32, and the CPU backend (a session refuses it elsewhere). */
typedef enum ib_kv_dtype { IB_KV_F32 = 0, IB_KV_F16, IB_KV_Q8, IB_KV_DTYPE_COUNT } ib_kv_dtype;
/* "f32" / "f16" / "q8"; parse returns 0, or -1 on an unknown name. */
const char *ib_kv_dtype_name(ib_kv_dtype t);
int ib_kv_dtype_parse(const char *s, ib_kv_dtype *out);

/* Where an engine computes and a session's KV cache lives. CPU: host memory and the CPU kernels of
 * the engine's ISA. CUDA: one NVIDIA GPU's memory and kernels (when compiled in and a GPU is
 * present). Every backend gives the same bits: the numeric definitions are in src/ops/. */
typedef enum ib_backend_kind { IB_BACKEND_CPU = 0, IB_BACKEND_CUDA, IB_BACKEND_COUNT } ib_backend_kind;
/* "cpu" / "cuda"; parse returns 0, or -1 on an unknown name. */
const char *ib_backend_name(ib_backend_kind k);
int ib_backend_parse(const char *s, ib_backend_kind *out);
/* 1 when backend k is compiled into this build and can run on this machine; else 0 and, when why is
 * not NULL, *why gets a static one-line reason ("not compiled in (built without nvcc)", "no CUDA
 * device: ..."). */
int ib_backend_available(ib_backend_kind k, const char **why);
/* Where backend k keeps its KV caches when that is its own device (a GPU): that memory's free and total
 * bytes now, 0; -1 when its caches live in host memory (cpu) or the backend is not available. */
int ib_backend_device_memory(ib_backend_kind k, size_t *free_bytes, size_t *total_bytes);
/* The backends compiled into this build, as a static string ("cpu" or "cpu cuda"). */
const char *ib_backends_compiled(void);

/* ---------------------------------------------------------------- model */

typedef struct ib_model ib_model;

/* Facts about a loaded model (read-only view, valid while the model lives). */
typedef struct ib_model_info {
    const char *arch;          /* "qwen3" or "llama" */
    int vocab_size;
    int hidden_size;           /* d_model */
    int n_layers;
    int n_heads, n_kv_heads, head_dim;
    int intermediate_size;
    int max_context;           /* max_position_embeddings */
    float rope_theta, rms_eps;
    int tied_embeddings;       /* 1 when lm_head reuses the embedding */
    int quant_bits;            /* 0 for float weights, else 4 or 8 */
    int quant_group;           /* group size along the input dimension, 0 for float */
    const char *weight_dtype;  /* "float32", "float16", "bfloat16" or "mlx-affine" */
    size_t n_params;           /* parameter count (unpadded, logical) */
    size_t file_bytes;         /* bytes of the mapped safetensors files */
    size_t weight_bytes;       /* bytes of the in-memory (repacked) weights */
    size_t expert_bytes;       /* of those, the routed experts' matrices (all layers, all experts; 0 for dense
                                * models): a token reads top_k / n_experts of them */
    size_t kv_bytes_per_token; /* KV cache bytes for one token of one session */
    int bos_id, eos_id;        /* -1 when the model has none */
    int n_experts, top_k;      /* Gemma 4's MoE block: experts per layer and per token; 0 for dense models */
    int sliding_window;        /* Gemma 4: the sliding layers' window (0: no sliding layers) */
    size_t kv_bytes_per_token_sliding; /* of kv_bytes_per_token, the sliding layers' share */
    int moe_intermediate_size; /* each expert's intermediate size (0 for dense models) */
    int n_double_wide;         /* Gemma 4 use_double_wide_mlp: layers whose loaded dense MLP is 2 x
                                * intermediate_size (the KV-shared ones); 0 otherwise */
} ib_model_info;

typedef struct ib_load_opts {
    int threads;  /* threads that repack the weights, at most IB_MAX_DEFAULT_THREADS; 0 (or less) = the
                   * CPUs online, as ib_engine_opts.threads; the loaded model is the same for every count */
} ib_load_opts;

/* Load a model directory (config.json, model.safetensors or shards with model.safetensors.index.json,
 * tokenizer.json). Every header field, dtype, shape and byte range is validated before use.
 * opts may be NULL. On success *out owns the model; free with ib_model_free. */
ib_status ib_model_load(const char *dir, const ib_load_opts *opts, ib_model **out, ib_error *err);
void ib_model_free(ib_model *m);
const ib_model_info *ib_model_get_info(const ib_model *m);

/* Model identity: what a stored session or a recorded answer names to say which model made it.
 * "sha256:" and 64 lower-case hex digits of a SHA-256 over the files of model directory dir that
 * decide its answers, in a fixed order: config.json, then each of tokenizer.json,
 * tokenizer_config.json, chat_template.jinja and model.safetensors.index.json that exists, then the
 * weight files ib_model_load reads (model.safetensors or the index's shards), sorted by name. Each
 * file enters as its name, a NUL, its length (8 bytes, little-endian) and its bytes, after the tag
 * "isobatch-model-identity-v1". So any change of a weight, a config field or the tokenizer changes
 * it, and a copy of the directory elsewhere has the same one. Computed on demand (it reads every
 * byte of the weights: about a second per few hundred MB); compute it once per process. out gets
 * IB_MODEL_ID_LEN bytes (NUL-terminated). Fails (IB_ERR_IO, naming the file) when a file cannot be
 * read, or as ib_model_load does when the weight files are malformed. */
#define IB_MODEL_ID_LEN 72
ib_status ib_model_identity(const char *dir, char out[IB_MODEL_ID_LEN], ib_error *err);

/* ---------------------------------------------------------------- engine */

typedef struct ib_engine ib_engine;

/* Zeroed options are the defaults: every field's 0 says what it means. */
typedef struct ib_engine_opts {
    int threads;          /* worker threads; 0 = the CPUs online (at most IB_MAX_DEFAULT_THREADS); the
                           * answers are the same for every count */
    ib_isa isa;           /* IB_ISA_AUTO by default */
    ib_act act;           /* IB_ACT_AUTO by default */
    int max_step_tokens;  /* most tokens (over all items) one ib_step may carry; 0 means 512 */
    ib_backend_kind backend; /* IB_BACKEND_CPU by default; the isa applies to the CPU backend */
    int profile;          /* 1: time every backend operation of every step (ib_engine_profile); CPU
                           * backend only. 0 (default): off, the step calls the backend directly */
} ib_engine_opts;

/* Most threads threads = 0 picks. */
#define IB_MAX_DEFAULT_THREADS 256

/* Create an engine for model m (which must outlive it). opts may be NULL (defaults above).
 * Fails with IB_ERR_UNSUPPORTED when the requested ISA is not available on this CPU. */
ib_status ib_engine_create(const ib_model *m, const ib_engine_opts *opts, ib_engine **out, ib_error *err);
void ib_engine_free(ib_engine *e);
ib_isa ib_engine_isa(const ib_engine *e);   /* the ISA actually used */
ib_act ib_engine_act(const ib_engine *e);   /* the activation mode actually used */
ib_backend_kind ib_engine_backend(const ib_engine *e);   /* where it computes */

/* ---------------------------------------------------------------- step profile */

/* Where a step's time goes, by backend operation (ib_engine_opts.profile = 1). Each operation the
 * step calls is timed around the call (CLOCK_MONOTONIC) and its time and one call are added to its
 * category. The CPU backend computes each operation before it returns, so the times are where the
 * step's compute went; the time between operations (the step's own bookkeeping) is in no category.
 * A backend that records a step and runs it at step_end (CUDA, as one graph) cannot be profiled
 * this way: ib_engine_create refuses profile = 1 on any backend but the CPU one (IB_ERR_UNSUPPORTED).
 * Profiling only times; the logits are bitwise those of an engine without it. */
typedef enum ib_prof_op {
    IB_PROF_EMBED = 0,   /* embedding rows */
    IB_PROF_RMSNORM,     /* row norms (the final norm is in LOGITS) */
    IB_PROF_QKV,         /* the q, k, v products */
    IB_PROF_O,           /* the attention output product */
    IB_PROF_GATE_UP,     /* the MLP's gate and up products */
    IB_PROF_DOWN,        /* the MLP's down product */
    IB_PROF_QK_PREPARE,  /* head norms, RoPE, KV store */
    IB_PROF_ATTENTION,
    IB_PROF_ACT,         /* SwiGLU / GeGLU */
    IB_PROF_MOE,         /* routed experts (Gemma 4) */
    IB_PROF_ADD,         /* residual adds */
    IB_PROF_LOGITS,      /* final norm, lm_head, softcap, argmax and logits copies */
    IB_PROF_STEP,        /* step_begin + step_end (rows in, waiting, results out) */
    IB_PROF_OTHER,       /* everything else: layer scalars, per-layer embeddings, diagnostics reads */
    IB_PROF_COUNT
} ib_prof_op;

/* Totals since the engine was created or last reset. */
typedef struct ib_step_profile {
    uint64_t steps;                  /* steps begun */
    double seconds[IB_PROF_COUNT];   /* time inside each category's calls */
    uint64_t calls[IB_PROF_COUNT];   /* calls of each category */
} ib_step_profile;

/* Short name of a category ("qkv", "gate/up", …); "?" when out of range. */
const char *ib_prof_op_name(ib_prof_op op);
/* Copy e's totals to *out. IB_ERR_STATE (out zeroed) when e was created without profile = 1. */
ib_status ib_engine_profile(const ib_engine *e, ib_step_profile *out, ib_error *err);
/* Zero e's totals (nothing when e does not profile). */
void ib_engine_profile_reset(ib_engine *e);

/* ---------------------------------------------------------------- sampling */

/* Sampling settings of a session. temperature <= 0 means greedy (argmax, ties to the lowest id).
 * Otherwise, in this order: repetition penalty over the last repeat_last_n tokens of the session's
 * history; temperature; top-k (0 = off); softmax; top-p (0 or 1 = off); min-p (0 = off); then one draw
 * from a counter-based generator keyed by (seed, step), so a draw never depends on other sessions.
 * A zeroed ib_sampling is the default: greedy, every filter off (repeat_penalty 0 or 1 = off). */
typedef struct ib_sampling {
    float temperature;
    int top_k;
    float top_p;           /* keep the smallest prefix of mass >= top_p; 0 or >= 1 = off */
    float min_p;
    float repeat_penalty;  /* 1 = off */
    int repeat_last_n;     /* 0 = the whole history */
    uint64_t seed;
} ib_sampling;

/* Defaults: greedy, top_p 1, repeat_penalty 1, seed 0 (the same draws as a zeroed ib_sampling). */
ib_sampling ib_sampling_default(void);

/* ---------------------------------------------------------------- sessions */

typedef struct ib_session ib_session;

typedef struct ib_session_opts {
    int max_context;       /* KV capacity in tokens, allocated at create (never during a step): say what
                            * the session needs (prompt + tokens to generate). 0 means
                            * min(model max_context, IB_SESSION_DEFAULT_CONTEXT); a step past the
                            * capacity fails with IB_ERR_CONTEXT naming it. Ignored by windowed
                            * sessions (kv_window > 0) */
    ib_sampling sampling;  /* used by ib_sample */
    /* KV policy (zero = full: every position kept, up to max_context). kv_window > 0: a token
     * attends only the kv_sink first positions of the session ("attention sinks") and the last
     * kv_window positions up to its own; the middle is evicted, positions keep counting (up to 2^30)
     * and memory is fixed: kv_sink + kv_window + kv_chunk token slots. kv_chunk (0 = 64) bounds the
     * tokens one ib_step item of this session may bring. Answers differ from a full session once the
     * window slides, never between batchings or prefill chunkings of the same session.
     * Models with sliding-window layers (Gemma 4): those layers keep a ring of sliding_window +
     * kv_chunk - 1 slots each (fewer than max_context when that is smaller), so kv_chunk > 0 on a full
     * session bounds its step items too; kv_chunk 0 on a full session keeps every position there.
     * The policy governs the full-attention layers; the sliding layers always attend their own window
     * (a kv_window below the model's sliding_window is refused). Answers are those of the full cache. */
    int kv_sink, kv_window, kv_chunk;
    ib_kv_dtype kv_dtype;     /* element type of the KV cache (IB_KV_F32 by default; see ib_kv_dtype) */
    ib_backend_kind backend;  /* where the KV cache lives; only an engine of the same backend can step
                               * the session (IB_BACKEND_CPU by default) */
} ib_session_opts;

/* The capacity of a session whose max_context is 0: small, so that a zeroed ib_session_opts does not
 * reserve the model's whole context (4096 tokens of float KV are ~940 MB on a Qwen3-0.6B-shaped model;
 * 512 are ~117 MB). ib_generate sizes its sessions to what its requests need instead. */
#define IB_SESSION_DEFAULT_CONTEXT 512

/* Create a session on model m with an empty KV cache at position 0. opts may be NULL (greedy,
 * IB_SESSION_DEFAULT_CONTEXT tokens, float32 KV in host memory). The KV cache is allocated here, never during a step;
 * IB_ERR_UNSUPPORTED when opts->backend is not available. */
ib_status ib_session_create(const ib_model *m, const ib_session_opts *opts, ib_session **out, ib_error *err);
void ib_session_free(ib_session *s);
int ib_session_position(const ib_session *s);  /* tokens held in the KV cache */
int ib_session_capacity(const ib_session *s);  /* max tokens it can hold (positions, for windowed ones) */
/* KV cache bytes one token of one session takes with this element type, every layer at its own shape
 * (a full session's cache of N positions with no sliding-window rings is N times this). */
size_t ib_kv_bytes_per_token(const ib_model *m, ib_kv_dtype t);
/* Bytes of the session's KV cache (allocated at create, fixed for its life). */
size_t ib_session_kv_bytes(const ib_session *s);
/* Bytes of the KV cache ib_session_create would allocate on model m for opts (NULL: the defaults);
 * 0 when ib_session_create would refuse them. For admission: sliding-window rings included. */
size_t ib_session_kv_bytes_for(const ib_model *m, const ib_session_opts *opts);
/* Whether ib_session_create would accept opts (NULL: the defaults) on model m — the KV policy, the
 * backend and whether it runs the KV type, the head dims q8 needs — without allocating anything:
 * IB_OK, or the error (and one-line message) ib_session_create would give. */
ib_status ib_session_check(const ib_model *m, const ib_session_opts *opts, ib_error *err);
/* Parse a KV policy "full" | "window:W" | "sink:S,window:W" into (sink, window); 0 or -1. */
int ib_kv_policy_parse(const char *s, int *sink, int *window);
/* Forget everything (position 0, empty history, sample step 0); keeps the allocation. */
void ib_session_reset(ib_session *s);
/* Replace the session's sampling settings (takes effect at the next ib_sample). */
void ib_session_set_sampling(ib_session *s, const ib_sampling *p);
/* Make dst a copy of src's state: KV cache, position, history and sample step (dst keeps its own
 * sampling settings). Both on the same model; dst's capacity must hold src's position. */
ib_status ib_session_copy(ib_session *dst, const ib_session *src, ib_error *err);
/* Rewind s to its first n tokens (0 <= n <= position): later keys/values are forgotten and the
 * history is cut to n tokens; the sample step is kept. A windowed session, or one whose sliding-window
 * layers keep rings, can rewind by at most kv_chunk tokens (older window keys are overwritten), or to
 * 0; else IB_ERR_UNSUPPORTED. */
ib_status ib_session_rewind(ib_session *s, int n, ib_error *err);

/* ---------------------------------------------------------------- the batched step */

typedef struct ib_step_item {
    ib_session *session;    /* distinct within one step */
    const int32_t *tokens;  /* [n_tokens] new token ids, appended at the session's position */
    int n_tokens;           /* >= 1 */
    float *logits;          /* [vocab_size] out: logits after the last token; NULL to skip */
    int32_t *argmax;        /* out: ib_argmax of those logits (the largest, ties to the lowest id, NaN
                             * never wins), chosen where the logits are computed — on a GPU they need
                             * not come back to the host when `logits` is NULL; NULL to skip */
    float *row_logits;      /* [n_tokens][vocab_size] out: row t holds the logits after tokens[0..t] —
                             * what a step of tokens[t] alone would write, bit for bit (prompt
                             * logprobs, scoring); its last row equals `logits`. NULL to skip */
} ib_step_item;

/* Run one batched forward pass over all items (see THE BATCHED STEP above). Validates everything
 * first (token ids in range, sessions distinct, capacity, total tokens <= max_step_tokens); on error
 * no session is changed. */
ib_status ib_step(ib_engine *e, ib_step_item *items, int n_items, ib_error *err);

/* Choose the next token of session s from its logits (vocab_size floats, not modified) with the
 * session's sampling settings, record it in the session's history and advance its sample step.
 * Greedy ties go to the lowest id. */
int32_t ib_sample(ib_session *s, const float *logits);

/* Record tokens in the session's history without sampling (prompt tokens, for repetition penalty). */
void ib_session_note_tokens(ib_session *s, const int32_t *tokens, int n);

/* ---------------------------------------------------------------- generation runner */

/* A whole batch of prompts run to completion by the scheduler's loop (below), on the calling thread:
 * up to `batch` sessions (rows; at most the engine's max_step_tokens) are stepped together, each
 * prompt a job on a row's session; a finished row is refilled with the next prompt at once. Prompts
 * are prefilled in chunks of `prefill_chunk` tokens (0 = whole, within the step's token budget),
 * interleaved with the other rows' decode. Every session uses `sampling` (the same seed), so a
 * prompt's result does not depend on its place in the list. The engine is the call's alone while it
 * runs. */
typedef struct ib_gen_request {
    const int32_t *prompt;  /* [n_prompt] token ids */
    int n_prompt;           /* >= 1 */
    int max_new_tokens;     /* this request's limit (>= 0); 0 = ib_gen_opts.max_new_tokens */
    const ib_sampling *sampling;  /* this request's sampling settings; NULL = ib_gen_opts.sampling */
    const char *const *stop;      /* [n_stop] stop strings (non-empty): the request ends with the token
                                   * whose text completes one of them (finish "stop", stop_string set) */
    int n_stop;
} ib_gen_request;

/* Zeroed fields are the defaults, except max_new_tokens (0 = prefill only, nothing generated):
 * ib_gen_opts_default() gives IB_GEN_DEFAULT_MAX_NEW_TOKENS. */
typedef struct ib_gen_opts {
    int max_new_tokens;     /* tokens to generate per prompt (>= 0), unless its request sets its own */
    int batch;              /* sessions per step; 0 = IB_GEN_DEFAULT_BATCH (never more than the requests) */
    int prefill_chunk;      /* 0 = whole prompt in one item */
    int ignore_eos;         /* 0 (default): a row stops at the model's eos id; 1: it goes on past it */
    int keep_logits;        /* keep each chosen token's logits row in the result */
    int max_context;        /* per-session KV capacity; 0 = what the longest request needs (its prompt +
                             * max_new_tokens), not the model's whole context */
    ib_sampling sampling;
    ib_kv_dtype kv_dtype;   /* the sessions' KV element type (ib_session_opts.kv_dtype); they live on
                             * the engine's backend */
    /* Called on the calling thread for each generated token as soon as it is drawn, in the order
     * the tokens are produced (request index, token id; done = 1 when this token ends its request).
     * NULL = none. Streaming output uses it; it must not call back into this generation. */
    void (*on_token)(void *ctx, int request, int32_t token, int done);
    void *on_token_ctx;
    /* The sessions' KV policy (ib_session_opts.kv_sink / kv_window): 0, 0 = full. With kv_window > 0
     * max_context is ignored and each session keeps kv_sink + kv_window + prefill chunk slots. */
    int kv_sink, kv_window;
} ib_gen_opts;

typedef struct ib_gen_result {
    int32_t *tokens;        /* [n_tokens] generated ids (owned; ib_gen_results_free) */
    int n_tokens;
    uint64_t digest;        /* ib_digest_bytes over the float32 logits rows that chose each token */
    float *logits;          /* [n_tokens][vocab] when keep_logits, else NULL */
    const char *finish;     /* "length" or "stop" */
    int stop_string;        /* index of the request's stop string that ended it, else -1 */
} ib_gen_result;

typedef struct ib_gen_stats {
    double seconds;         /* wall time of the whole run */
    long prompt_tokens, generated_tokens;
    int steps;
    /* The split llama.cpp users know as prompt eval / eval: steps that fed any prompt tokens (their
     * decode rows included) count as prefill; steps that only decoded count as generation. */
    double prefill_seconds; /* time of the steps that fed prompt tokens */
    double decode_seconds;  /* time of the steps that only decoded */
    long decode_tokens;     /* tokens drawn in those decode-only steps */
} ib_gen_stats;

#define IB_GEN_DEFAULT_BATCH 8
#define IB_GEN_DEFAULT_MAX_NEW_TOKENS 128

/* A zeroed ib_gen_opts with max_new_tokens = IB_GEN_DEFAULT_MAX_NEW_TOKENS and ib_sampling_default(). */
ib_gen_opts ib_gen_opts_default(void);

/* Run every request to completion. results: [n] (zeroed by the call). stats may be NULL.
 * Fails before any work when a request does not fit the context, or when a prompt that is to be fed
 * (its limit is > 0) holds a token outside the vocabulary.
 * On failure the results own no memory. */
ib_status ib_generate(ib_engine *e, const ib_gen_request *reqs, int n, const ib_gen_opts *opts,
                      ib_gen_result *results, ib_gen_stats *stats, ib_error *err);
void ib_gen_results_free(ib_gen_result *results, int n);

/* ---------------------------------------------------------------- scheduler (continuous batching) */

/* A scheduler owns one loop thread that steps every active job of an engine together: jobs join and
 * leave at any step; a prompt is fed in chunks of at most `prefill_chunk` tokens, interleaved with the
 * other jobs' one-token decode rows (each step first takes one decode row per decoding job, then
 * prompt chunks, starting from a rotating job so that long prompts share the step fairly); at most
 * `max_batch` jobs are active, further ones wait in a FIFO queue of `max_queue`. Since each job has
 * its own session and ib_step's logits do not depend on the batch, a job's tokens and logprobs are
 * the same whatever else runs. Thread-safe: submit and cancel may be called from any thread. While a
 * scheduler runs, its engine must not be used by anyone else. */
typedef struct ib_sched ib_sched;

typedef struct ib_sched_opts {
    int max_batch;      /* jobs stepped together, >= 1; 0 means 32 */
    int prefill_chunk;  /* most prompt tokens of one job per step; 0 means 64 */
    int max_queue;      /* jobs waiting beyond max_batch; 0 means 64, < 0 means none */
    int share_min;      /* > 0: a job admitted while another active job of its group (ib_sched_job.group)
                         * has a prompt that starts with at least share_min of its own first tokens (and
                         * has not fed past them) shares them as share_with would: that job stops there,
                         * its session is copied into this one's. For bursts of requests with one long
                         * prefix (a system prompt, few-shot examples). Never changes a number; never
                         * across groups (a request's latency would tell another tenant's prompt). 0 =
                         * only share_with. */
} ib_sched_opts;

/* What a job reports, in order: one TOKEN event per generated token, then exactly one DONE event.
 * After DONE the scheduler never touches the job, its session or its ctx again. */
#define IB_MAX_TOP_LOGPROBS 20

typedef struct ib_sched_event {
    int done;              /* 0: a token; 1: the job ended */
    int prompt;            /* 1: a PROMPT event (jobs with prompt_logprobs): `token` is the prompt's token
                            * at prompt_index, with logprob / top_* / logits of the row before it */
    int prompt_index;      /* PROMPT events: that index, 1 .. n_prompt - 1, ascending */
    int32_t token;         /* the generated token (token events) */
    double logprob;        /* its log-probability under the raw logits (log-softmax), when asked */
    const char *finish;    /* DONE: "stop" (a stop id was generated), "length", "cancelled", "error" */
    int prompt_fed;        /* DONE: prompt tokens fed into the session (those a share copied included) */
    int generated;         /* DONE: tokens generated */
    ib_status status;      /* DONE with "error": the failure's status code (IB_OK otherwise) */
    const char *message;   /* DONE with "error": what failed (valid during the call) */
    int n_top;             /* token events of a job with top_logprobs > 0: entries in top_ids/top_logprob */
    const int32_t *top_ids;     /* [n_top] the most likely tokens, by logit descending, ties -> lowest id */
    const double *top_logprob;  /* [n_top] their log-probabilities (valid during the call) */
    const float *logits;   /* token events: the [vocab_size] float32 logits the token was drawn from
                            * (the row ib_step wrote; valid during the call) */
    uint64_t logits_digest; /* token events of a job with digest_logits: ib_digest_bytes chained from
                             * IB_DIGEST_INIT over the logits rows of the job's tokens so far, this one
                             * included (computed on the engine's pool); 0 otherwise */
    double queue_seconds;  /* token events and DONE: seconds the job waited in the queue for a batch slot
                            * (0 until it was admitted) */
} ib_sched_event;

/* Called from the scheduler thread without its lock held; it must not block for long. It may call
 * ib_sched_cancel. */
typedef void (*ib_sched_event_fn)(void *ctx, const ib_sched_event *ev);

typedef struct ib_sched_job {
    ib_session *session;     /* fed then sampled from; in no other job while this one runs */
    const int32_t *prompt;   /* [n_prompt] tokens fed at the session's position (copied by submit) */
    int n_prompt;            /* >= 1 */
    int max_new_tokens;      /* >= 0: tokens to sample; the last one is not fed (it is the next
                              * prompt's first token when the session continues) */
    const int32_t *stop_ids; /* [n_stop] ids that end generation (the stop token is reported); copied */
    int n_stop;
    int want_logprobs;       /* fill ib_sched_event.logprob */
    int top_logprobs;        /* 0..IB_MAX_TOP_LOGPROBS: also report that many most likely tokens */
    /* 1: before its first token event, one PROMPT event for each prompt token but the first (index
     * 1 .. n_prompt - 1, in order): its log-probability under the logits after the tokens before it
     * (ib_step's row_logits; the same bits a step of one token at a time gives), with top_logprobs'
     * alternatives — a scoring or evaluation job (max_new_tokens may be 0). Such a job feeds its whole
     * prompt itself (it takes no share: share_with is ignored), in chunks of at most
     * IB_PROMPT_LOGITS_ROWS tokens; n_replay must be 0. */
    int prompt_logprobs;
    int group;               /* fairness group (a server's API key; 0 for all when unused): a free
                              * batch slot goes to the queued job whose group runs the fewest jobs,
                              * the longest-waiting one among equals. Never changes a job's numbers. */
    ib_sched_event_fn on_event;
    void *ctx;
    /* logit bias (OpenAI's logit_bias): before each draw, logit_bias[i] is added (in float) to the logit
     * of logit_bias_ids[i], in order; logprobs stay those of the raw logits. Copied by submit. */
    const int32_t *logit_bias_ids;  /* [n_logit_bias] ids in [0, vocab) */
    const float *logit_bias;        /* [n_logit_bias] */
    int n_logit_bias;               /* 0..IB_MAX_LOGIT_BIAS */
    /* Constrained decoding: before each draw (after the logit bias), constrain(constrain_ctx, logits,
     * vocab) may set logits to -inf; it returns the tokens left, and 0 means "no constraint this time"
     * (the row is put back). The raw row is restored after the draw, so logprobs stay raw. Called on a
     * worker thread, never concurrently for one job, and after the job's previous TOKEN event. */
    int (*constrain)(void *ctx, float *logits, int vocab);
    void *constrain_ctx;
    /* Replay (a session rebuilt from its stored history): the first n_replay prompt tokens are fed
     * into the KV like any prompt tokens (chunked, batched) but not noted in the sampler's history;
     * the caller has replayed that history and set the draw counter already (ib_store_replay_notes).
     * Tokens after them are noted as usual. 0 = none; at most n_prompt. */
    int n_replay;
    /* 1: keep the running digest of the job's logits rows (ib_sched_event.logits_digest), hashed beside
     * the draws on the engine's threads rather than in on_event on the scheduler's thread */
    int digest_logits;
    /* Prompt sharing (several choices of one prompt; ib_sched_submit_n only): share_with = k + 1 names
     * job k of the same call, an earlier one, whose prompt starts with this job's first n_shared
     * tokens; both sessions start empty. That job stops its prompt at n_shared tokens until this one is
     * served: its session is copied into this job's (ib_session_copy) and this job feeds only the rest,
     * 1 token at least (0 < n_shared < both prompts' lengths). It never changes a number: the copy holds
     * the bits feeding those tokens would (chunking does not change them). Where it cannot be served —
     * that job gone or past n_shared, admitted after it went on (no batch room), sessions that do not
     * start empty or differ in KV settings, a replay — this job feeds its whole prompt itself.
     * 0 = none. */
    int share_with;
    int n_shared;
} ib_sched_job;

/* Most prompt tokens of a prompt_logprobs job fed in one step (its logits rows: this many x vocab floats). */
#define IB_PROMPT_LOGITS_ROWS 32

/* Most logit_bias entries of one job. */
#define IB_MAX_LOGIT_BIAS 1024

typedef struct ib_sched_stats {
    int active, queued;          /* jobs now */
    int last_batch;              /* items in the last step */
    long long steps, tokens_prefilled, tokens_generated;
    long long tokens_shared;     /* prompt tokens copied from another job's session (share_from) instead of fed */
    double step_seconds;         /* total time inside ib_step */
    double prefill_seconds;      /* of it, steps that fed prompt tokens (their decode rows included) */
    long long decode_tokens;     /* tokens drawn in the steps that only decoded */
    long long step_hist[12];     /* steps by duration: <= 1,2,5,10,20,50,100,200,500,1000,2000 ms, more */
} ib_sched_stats;

/* Upper bounds (ms) of ib_sched_stats.step_hist's first 11 buckets. */
extern const double ib_sched_hist_ms[11];

/* Create a scheduler over e (which must outlive it) and start its thread. opts may be NULL. */
ib_status ib_sched_create(ib_engine *e, const ib_sched_opts *opts, ib_sched **out, ib_error *err);
/* Cancel every job (each gets its DONE "cancelled") and stop the thread; later submits fail with
 * IB_ERR_STATE, cancel and stats still work. Idempotent; call it from one thread. */
void ib_sched_stop(ib_sched *s);
/* ib_sched_stop, then free. NULL allowed. */
void ib_sched_free(ib_sched *s);
/* Queue a job; *id (may be NULL) gets its id (> 0). Fails without side effects when the arguments are
 * bad, when the session's context cannot hold n_prompt + max_new_tokens - 1 more tokens
 * (IB_ERR_CONTEXT), or when max_batch jobs are active and the queue is full (IB_ERR_STATE, message
 * "scheduler: queue full"). On failure on_event is never called. */
ib_status ib_sched_submit(ib_sched *s, const ib_sched_job *job, uint64_t *id, ib_error *err);
/* Queue n jobs at once, all or none (the same checks and failures as ib_sched_submit, for each job and
 * for the room of all n): they wait in the queue in order and are admitted together as far as the
 * batch has room, so a job's share_with source has not started when its sharers arrive. ids (may be
 * NULL) gets their ids. */
ib_status ib_sched_submit_n(ib_sched *s, const ib_sched_job *jobs, int n, uint64_t *ids, ib_error *err);
/* Ask job id to stop: it ends with DONE "cancelled" at the next step boundary. Returns 1 when the
 * job was still known, 0 otherwise. */
int ib_sched_cancel(ib_sched *s, uint64_t id);
void ib_sched_get_stats(ib_sched *s, ib_sched_stats *out);

/* Log-probability of token `id` under log-softmax(logits) ([vocab] floats): computed in double with
 * ib's own exp/log, summing in ascending id order, so the value is a function of the logits only. */
double ib_logprob(const float *logits, int vocab, int32_t id);

/* The k most likely tokens of logits ([vocab] floats), by logit descending with ties to the lowest
 * id, into ids[k] and their log-probabilities (as ib_logprob) into lp[k]. k is clamped to
 * [0, min(vocab, IB_MAX_TOP_LOGPROBS)]; returns the count written. */
int ib_top_logprobs(const float *logits, int vocab, int k, int32_t *ids, double *lp);

/* ---------------------------------------------------------------- tokenizer */

/* The model's tokenizer (owned by the model). encode writes at most cap ids and returns the count
 * (which may exceed cap: call again with a larger buffer), or -1 on error. decode appends the UTF-8
 * bytes of one token to out (cap bytes) and returns the byte count, or -1. */
int ib_tokenize(const ib_model *m, const char *text, size_t len, int32_t *ids, int cap);
int ib_token_bytes(const ib_model *m, int32_t id, char *out, int cap);

/* The tokenizer is the model directory's tokenizer.json: byte-level BPE as Hugging Face tokenizers
 * runs it (added tokens matched in the text first, the normalizer, the Split/ByteLevel
 * pre-tokenizers, merges by rank), giving the same ids as Hugging Face for valid UTF-8 text.
 * Invalid UTF-8 bytes are kept (each run of them is its own piece, encoded with byte tokens), so
 * decoding gives back the exact input bytes; Hugging Face only sees text, where such bytes would
 * have become U+FFFD. ib_tokenize adds no special tokens around the text (no BOS); special-token
 * text such as "<|im_end|>" inside it becomes that token. */

/* Flags of ib_tokenize_ex. ADD_SPECIAL: add what the tokenizer adds around a text (the
 * post-processor's template, else tokenizer_config.json's add_bos_token/add_eos_token).
 * SPLIT_SPECIAL: text of tokens marked special is encoded as ordinary text. */
typedef enum ib_tokenize_flags { IB_TOKENIZE_ADD_SPECIAL = 1, IB_TOKENIZE_SPLIT_SPECIAL = 2 } ib_tokenize_flags;

/* ib_tokenize with flags (an OR of ib_tokenize_flags); same return contract. */
int ib_tokenize_ex(const ib_model *m, const char *text, size_t len, int flags, int32_t *ids, int cap);

/* ib_tokenize_ex that the caller can abandon (a client that left): cancelled(ctx) is asked every
 * 64 KiB or so of work; once it returns non-zero the call stops and returns -2. Tokenizing takes
 * O(n log n) time in the text's length whatever the text. */
int ib_tokenize_cancel(const ib_model *m, const char *text, size_t len, int flags, int32_t *ids, int cap,
                       int (*cancelled)(void *ctx), void *ctx);

/* Id of the added/special token whose text is exactly content ("<|im_end|>"), or -1. */
int32_t ib_token_id(const ib_model *m, const char *content);

/* 1 when id is an added token marked "special" in tokenizer.json, else 0. */
int ib_token_is_special(const ib_model *m, int32_t id);

/* Streaming decode: feed generated ids one at a time and print what comes out; the output is
 * always valid UTF-8. Bytes of a character split across tokens are held until it is complete;
 * bytes that can never form a character are written as U+FFFD. Zero-initialise the state. */
typedef struct ib_text_stream {
    unsigned char held[4];   /* an incomplete UTF-8 sequence waiting for its next byte */
    int n_held;
} ib_text_stream;

/* Append the text that token id completes to out (cap bytes, not NUL-terminated) and return the
 * byte count, or -1 when cap is too small (state unchanged; 3 * (token bytes + 4) always suffices).
 * Ids without text (out of range) add nothing. */
int ib_text_stream_push(const ib_model *m, ib_text_stream *s, int32_t id, char *out, int cap);

/* End of stream: write held bytes as U+FFFD (at most 3 bytes) to out, reset s, return the count. */
int ib_text_stream_flush(ib_text_stream *s, char *out, int cap);

/* Chat formatting from the model's tokenizer_config.json facts. ChatML (Qwen2/Qwen3:
 * "<|im_start|>role\ncontent<|im_end|>\n", also used when the chat template is absent but the
 * tokenizer has <|im_start|> and <|im_end|>) and the Llama 3 header format are known. */
typedef struct ib_chat_msg {
    const char *role;      /* "system", "user", "assistant" */
    const char *content;   /* UTF-8 */
    const char *tool_text; /* Gemma 4 only (NULL elsewhere and by default), in Gemma 4's own syntax,
                            * written as it is: on a model turn, its tool calls and tool responses,
                            * before the content (which still loses its thoughts and is trimmed); on
                            * the first message when it is the system one, the tool declarations,
                            * after the trimmed content */
} ib_chat_msg;

/* GENERATION_PROMPT: end with the assistant header. NO_THINKING: Qwen3's enable_thinking=false
 * (an empty <think></think> block after the header, when the template knows enable_thinking).
 * THINKING: Gemma 4's enable_thinking=true (<|think|> at the top of a system turn, which is then
 * always written, and no empty thought after the header); other formats ignore it. */
typedef enum ib_chat_flags { IB_CHAT_GENERATION_PROMPT = 1, IB_CHAT_NO_THINKING = 2, IB_CHAT_THINKING = 4 } ib_chat_flags;

/* Render n messages into out (cap bytes, NUL-terminated when cap > 0) and return the full length
 * (which may exceed cap - 1: call again with a larger buffer), or -1 when the model has no known chat
 * format, an argument is NULL, or (Gemma 2/3, whose template refuses them) the turns after an optional
 * system message do not alternate user / assistant, or a message has tool_text in a format other than
 * Gemma 4's. As the Qwen3 template does, <think>…</think> is dropped from assistant turns before the
 * last user turn; Gemma 4's drops <|channel>…<channel|> thoughts from model turns. Gemma 4: a model
 * turn whose tool_text ends with a tool response (<tool_response|>) and whose content is empty is left
 * open (no <turn|>): a following model message with tool_text continues it without a new header (the
 * later templates' rule; under a template without it, a new model header opens, and the open turn is
 * never closed, as that template writes it), and so does the generation prompt (the model answers
 * inside the turn the results were written into). Tokenize the result with ib_tokenize (no BOS added: the Llama 3 and
 * Gemma formats write their BOS themselves). */
long ib_chat_format(const ib_model *m, const ib_chat_msg *msgs, int n, int flags, char *out, size_t cap);

/* The ids that end an assistant turn (<|im_end|>, <|eot_id|>, <end_of_turn> or <turn|>, and the eos
 * token) into ids (cap);
 * returns the count (0 when there is no chat format). */
int ib_chat_stop_ids(const ib_model *m, int32_t *ids, int cap);

/* ---------------------------------------------------------------- digests */

/* 64-bit FNV-1a over bytes, continuing from h (start with IB_DIGEST_INIT). */
#define IB_DIGEST_INIT 0xcbf29ce484222325ULL
uint64_t ib_digest_bytes(uint64_t h, const void *data, size_t n);

/* ---------------------------------------------------------------- fault injection (tests only) */

/* Deliberate bugs of the kinds real engines shipped, used by tests to prove the invariance checks
 * can fail. Off unless set; process-wide; set it before creating engines and not during a step. */
typedef enum ib_fault {
    IB_FAULT_NONE = 0,
    IB_FAULT_ROPE_SCALAR_OFFSET,  /* every row rotated with the first row's position */
    IB_FAULT_ROPE_SKIP_ROWS,      /* rows >= 1 not rotated when each session brings one token */
    IB_FAULT_GEMV_GEMM,           /* another accumulation order when a product has > 1 row (F32 products:
                                   * a float32 chain, K descending) */
    IB_FAULT_SPLIT_K_THREADS,     /* a reduction split into one chunk per thread */
    IB_FAULT_ISA_FMA,             /* the vector kernels fuse multiply-add, scalar does not (F32 products,
                                   * whose double sums of exact products no fusion changes: a float32
                                   * chain with fused multiply-adds instead) */
    IB_FAULT_ROW_ORDER,           /* a reduction whose order depends on the row index */
    IB_FAULT_SAMPLE_BY_ROW,       /* "shared-rng": draws from one process-wide stream, not (seed, step) */
    IB_FAULT_SPLIT_KV_BY_BATCH,   /* attention key blocks sized by the batch size */
    IB_FAULT_GPU_FMA,             /* the CUDA backend fuses the multiply-adds of its products (epilogue) */
    IB_FAULT_REBUILD_DROP_TOKEN,  /* a server's lazy rebuild of a stored session feeds its history
                                   * without its middle token */
    IB_FAULT_MOE_CAPACITY,        /* MoE: each expert takes at most ceil(R*k/E) rows of a step, later rows dropped */
    IB_FAULT_MOE_COMBINE_BY_LOAD, /* MoE: expert outputs added as each expert finishes, busiest expert first */
    IB_FAULT_GPU_SPLIT_K,         /* the CUDA backend splits its Q8 products' K over blocks, adding the partial
                                   * sums with atomics in whatever order they finish (the "any order" product) */
    IB_FAULT_KV_RING_SHORT,       /* sessions made under it keep sliding-window rings one slot too small */
    IB_FAULT_AMX_GROUP_ORDER,     /* the AMX kernel adds its tiles' groups in descending order (only rows it
                                   * computes on tiles: products of 16 rows or more) */
    IB_FAULT_PLE_ROW0,            /* Gemma 4 per-layer embeddings: every row of a step takes the first row's
                                   * token's embed_tokens_per_layer row (CPU backend) */
    IB_FAULT_ATTN_TILE_RANGE,     /* prefill attention: every row of a tile of one session's rows attends the
                                   * keys of the tile's last row (earlier rows see later positions' keys) */
    IB_FAULT_GPU_ATT_BLOCK,       /* the CUDA attention cuts key blocks at half the canonical size (a kernel
                                   * tuned with a tile of its own: another online-softmax rescale sequence) */
    IB_FAULT_ATTN_BLOCK_MAX,      /* the vector attention copies' key-block maxima take a NaN score and keep
                                   * whichever zero their lane fold ends on (the portable walk skips NaN
                                   * and keeps the first zero in key order) */
    IB_FAULT_KVQ8_STEP_SCALE,     /* q8 KV: a step of more than one row encodes its keys and values with codes
                                   * up to 126 (the definition: 127), as a kernel picked by the step's shape
                                   * would (CPU backend) */
    IB_FAULT_KV_POOL_DIRTY,       /* the CPU backend keeps ended sessions' KV blocks for new caches without
                                   * zeroing what those sessions wrote (another tenant's keys and values
                                   * left in a new session's unwritten slots) */
    IB_FAULT_SHARE_EARLY,         /* scheduler prompt sharing: the source's session is copied one token before
                                   * the shared length, and the copies go on after it (they lack its keys) */
    IB_FAULT_COUNT
} ib_fault;

/* Parse a fault name ("rope-scalar-offset", …); -1 when unknown. */
int ib_fault_parse(const char *name, ib_fault *out);
const char *ib_fault_name(ib_fault f);
void ib_fault_set(ib_fault f);
ib_fault ib_fault_get(void);

/* ---------------------------------------------------------------- diagnostics hooks */

/* Layer capture, used by `isobatch diff` to compare a batched step with the same sessions stepped
 * alone. When set, ib_step calls fn once per row of the step (rows are the items' tokens, item after
 * item, in order) at each capture point, in this order:
 *
 *   per layer (layer = 0 .. n_layers-1):
 *     "layer_in"   [D]       residual stream entering the layer
 *     "attn_norm"  [D]       input RMSNorm
 *     "q_proj"     [H*hd]    x·Wq               "k_proj" [KVH*hd] x·Wk        "v" [KVH*hd] x·Wv
 *     "q_norm"     [H*hd]    q after q_norm     "k_norm" [KVH*hd]  (Qwen3 only; absent for Llama)
 *     "q"          [H*hd]    q after norm and RoPE                  "k" [KVH*hd] likewise
 *     "attn_out"   [H*hd]    attention output (before Wo)
 *     "attn_proj"  [D]       attention output · Wo
 *     "mlp_norm"   [D]       post-attention RMSNorm (of the residual after the attention add)
 *     "gate" [F], "up" [F]   the MLP's input products
 *     "mlp_act"    [F]       SwiGLU(gate, up)
 *     "mlp_out"    [D]       · W_down
 *     "layer_out"  [D]       residual stream leaving the layer
 *   then, with layer = n_layers, for each item that asked for logits (row = its last token's row),
 *   in groups of up to 16 items (all "final_norm" rows of a group, then its "logits" rows):
 *     "final_norm" [D], "logits" [vocab]
 *
 * data holds n floats, valid only during the call. fn must not call back into the engine. NULL fn
 * turns capture off (the default; then a step pays one pointer test per point). */
typedef void (*ib_capture_fn)(void *ctx, int layer, const char *point, int row, const float *data, int n);
void ib_engine_set_capture(ib_engine *e, ib_capture_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* ISOBATCH_H */
