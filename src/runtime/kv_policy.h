/*
 * kv_policy.h — KV policies of a session (full, sliding window, attention sinks + window): where a
 * position's key/value lives in the session's cache, and attention over the kept positions.
 */
#ifndef IB_RUNTIME_KV_POLICY_H
#define IB_RUNTIME_KV_POLICY_H
#include "ops/ops.h"
#include "runtime/runtime.h"

/* Largest position count a windowed session accepts (positions keep counting past eviction). */
#define IB_WINDOW_MAX_POS (1 << 30)

/* Cache slot of position pos in session s: pos itself for a full session; for a windowed one the
 * first kv_sink positions own slots [0, kv_sink) and later positions share a ring of
 * capacity - kv_sink slots (kv_window + kv_chunk: a step item of up to kv_chunk tokens stores all
 * its keys before any of its queries attends, and never overwrites a key an earlier query of the
 * same item still needs). */
static inline int ib_kv_slot(const ib_kv_desc *d, int pos) { return ib_kv_desc_slot(d, pos); }

/* Attention of query q [hd] at position p of a windowed cache d against one head's keys k and values
 * v ([capacity][hd], slot-indexed). The attended positions are A(p) = [0, min(kv_sink, p + 1)) ∪
 * [max(kv_sink, p - kv_window + 1), p], walked in ascending position order with an online softmax;
 * the sink range and the window range are each cut into blocks at multiples of `block` positions.
 * The arithmetic is a function of p and the kept keys only, so batching and prefill chunking do not
 * change it. With kv_sink 0 it equals
 * ib_attend_one_window bitwise, and ib_attend_one while p < kv_window. */
void ib_attend_policy(const ib_kv_desc *d, const float *q, const void *k, const void *v, int p, int hd,
                      float scale, int block, float *out);

/* ib_attend_policy for nq (1..IB_ATTN_MAX_GROUP) query heads q [nq][hd] sharing the KV head k, v,
 * out [nq][hd], computed by the attention copy `block2` (one of ib_attn_kernels: every copy, and every
 * block cut by the ring's wrap, gives the same bits). Head h's output is bitwise
 * ib_attend_policy(d, q + h*hd, ...); the keys and values are read in place, half KV converted in
 * registers. block <= 128. */
void ib_attend_policy_heads(const ib_kv_desc *d, ib_attend_block2_fn block2, const float *q, int nq, const void *k, const void *v,
                            int p, int hd, float scale, int block, float *out);

/* ib_attend_policy_heads for nr rows of one session at positions pos[t] taking each key block together
 * (a prefill chunk's rows; nr*nq <= IB_ATTN_TILE_Q): row t's nq query heads at q + t*q_stride
 * ([nq][hd]), its output out + t*out_stride ([nq][hd]) bitwise ib_attend_policy_heads(d, block2,
 * q + t*q_stride, nq, k, v, pos[t], ...). The sink ranges' blocks, then the window ranges', go in
 * ascending order; each row takes the part of a block its own range A(pos[t]) holds, and rows taking
 * the same part go through one block2 call (the block's keys and values read from memory once for
 * them). Under the attn-tile-range fault every row takes the last row's range. */
void ib_attend_policy_rows(const ib_kv_desc *d, ib_attend_block2_fn block2, const float *q, size_t q_stride, int nq,
                           int nr, const int *pos, const void *k, const void *v, int hd, float scale, int block,
                           float *out, size_t out_stride);

#endif
