/*
 * runtime.h — internal layout of engines and sessions.
 */
#ifndef IB_RUNTIME_RUNTIME_H
#define IB_RUNTIME_RUNTIME_H
#include "core/pool.h"
#include "model/model.h"
#include "ops/matmul.h"
#include "sampling/sampler.h"

struct ib_session {
    const ib_model *model;
    int capacity;             /* KV slots: tokens for a full session; kv_sink + kv_window + kv_chunk for a
                               * windowed one (kv_policy.h maps positions to slots) */
    int kv_sink, kv_window;   /* KV policy: kv_window 0 = full; else sinks + sliding window */
    int kv_chunk;             /* windowed: most tokens one step item may bring */
    int pos;                  /* tokens held */
    void *kv;                 /* [n_layers][2][KVH][capacity][hd]: keys then values per layer, float or
                               * (kv_f16) uint16 IEEE half */
    int kv_f16;
    int32_t *history;         /* [capacity + 1] tokens fed or sampled, oldest first */
    int n_history;
    uint64_t sample_step;     /* draws made so far: the counter of the (seed, step) generator */
    ib_sampling sampling;
    ib_sample_scratch scratch;
    int in_step;              /* marks a session already listed in the current step */
};

/* Bytes of one KV element of session s. */
static inline size_t ib_kv_elem_bytes(const ib_session *s) { return s->kv_f16 ? 2 : sizeof(float); }

/* Element offset of (layer li, keys kv=0 / values kv=1, KV head h, slot 0) in s->kv. */
static inline size_t ib_kv_offset(const ib_session *s, int li, int kv, int h) {
    const ib_config *c = &s->model->cfg;
    return (((size_t)li * 2 + kv) * c->n_kv_heads + h) * (size_t)s->capacity * c->head_dim;
}

/* Rows of logits computed per lm_head product (bounds the logits scratch). */
#define IB_LOGIT_ROWS 16

struct ib_engine {
    const ib_model *model;
    ib_pool *pool;
    ib_isa isa;
    ib_act act;
    int max_tokens;           /* R_max: tokens per step */
    /* per-step scratch, sized for R_max rows (allocated once at create) */
    int32_t *tok;             /* [R] */
    int32_t *pos;             /* [R] */
    int32_t *rope_pos;        /* [R] position used by RoPE (differs only under faults) */
    int *row_item;            /* [R] item of each row */
    int *item_len;            /* [R] rows of each item (items <= rows) */
    float *x;                 /* [R][D] residual stream */
    float *xn;                /* [R][D] normed */
    float *q;                 /* [R][H*hd] */
    float *k;                 /* [R][KVH*hd] */
    float *v;                 /* [R][KVH*hd] */
    float *att;               /* [R][H*hd] */
    float *o;                 /* [R][max(D, F)] projection outputs */
    float *g;                 /* [R][F] */
    float *u;                 /* [R][F] */
    float *cs;                /* [R][hd/2][2] RoPE cos/sin */
    ib_act_buf qa;            /* quantized activations: xq [R][max(D,F,H*hd)], d/ad [R][max/G] */
    float *last;              /* [IB_LOGIT_ROWS][D] final-normed rows for the lm_head */
    float *logits;            /* [IB_LOGIT_ROWS][V] */
    /* diagnostics: layer capture (ib_engine_set_capture, src/diag/capture.c); NULL = off */
    ib_capture_fn capture;
    void *capture_ctx;
};

#endif
