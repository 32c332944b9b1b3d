/*
 * runtime.h — internal layout of engines and sessions.
 */
#ifndef IB_RUNTIME_RUNTIME_H
#define IB_RUNTIME_RUNTIME_H
#include "core/pool.h"
#include "model/model.h"
#include "ops/matmul.h"
#include "sampling/sampler.h"
#include "backends/backend.h"

struct ib_session {
    const ib_model *model;
    ib_kv *kv;                /* the KV cache, on its backend (backends/backend.h): desc.capacity slots;
                               * a full session's tokens, or kv_sink + kv_window + kv_chunk for a
                               * windowed one (kv_policy.h maps positions to slots) */
    const ib_backend_ops *kv_ops; /* the table of the backend holding kv */
    int capacity;             /* KV slots (kv->desc.capacity) */
    int kv_sink, kv_window;   /* KV policy: kv_window 0 = full; else sinks + sliding window */
    int kv_chunk;             /* > 0 (windowed, or sliding-window rings): most tokens one step item may
                               * bring; 0: no bound */
    int ring;                 /* the sliding-window layers' slots are fewer than the positions it can
                               * hold (rewinds are bounded by kv_chunk) */
    int pos;                  /* tokens held */
    int32_t *history;         /* [capacity + 1] tokens fed or sampled, oldest first */
    int n_history;
    uint64_t sample_step;     /* draws made so far: the counter of the (seed, step) generator */
    ib_sampling sampling;
    ib_sample_scratch scratch;
    int in_step;              /* marks a session already listed in the current step */
};

struct ib_engine {
    const ib_model *model;
    ib_pool *pool;            /* host threads: the CPU backend's kernels and the host-side sampling */
    ib_isa isa;               /* the CPU kernels' ISA (resolved once, never AUTO) */
    ib_act act;               /* resolved: F32 or Q8 */
    ib_backend_kind kind;
    ib_backend *be;           /* the backend instance computing the steps (profiling: the wrapper
                               * of backends/profile.h in front of it) */
    int profile;              /* be is a profiling wrapper (ib_engine_opts.profile) */
    int max_tokens;           /* R_max: tokens per step */
    /* per-step host arrays, sized for R_max rows (allocated once at create) */
    int32_t *tok;             /* [R] */
    int32_t *pos;             /* [R] */
    int32_t *rope_pos;        /* [R] position used by RoPE (differs only under faults) */
    int32_t *row_item;        /* [R] item of each row */
    int *item_len;            /* [R] rows of each item (items <= rows) */
    ib_kv **item_kv;          /* [R] KV cache of each item */
    int32_t *logit_row;       /* [R] rows whose logits are wanted */
    float **logit_out;        /* [R] their destinations (NULL: argmax only) */
    int32_t **argmax_out;     /* [R] where their argmax goes (NULL: none) */
    /* diagnostics: layer capture (ib_engine_set_capture, src/diag/capture.c); NULL = off */
    ib_capture_fn capture;
    void *capture_ctx;
};

#endif
