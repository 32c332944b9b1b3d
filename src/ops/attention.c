/*
 * attention.c — causal attention of one query against a session's KV stream, online softmax over
 * fixed key blocks in ascending order. Prefill and decode walk the same blocks, so a prompt fed in
 * one pass, in chunks or token by token gives the same bits.
 */
#include <math.h>

#include "core/fmath.h"
#include "core/half.h"
#include "ops/ops.h"

void ib_attend_one(const float *q, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                   float scale, int block, float *out) {
    ib_attend_one_window(q, k, v, n_keys, kv_stride, hd, scale, block, 0, out);
}

int ib_attn_block_for(int n_items) {
    if (ib_fault_get() == IB_FAULT_SPLIT_KV_BY_BATCH && n_items > 1) return IB_ATTN_BLOCK / 2;
    return IB_ATTN_BLOCK;
}

/* 16 float lanes (GCC/Clang vector extension): each operation is lane-wise IEEE arithmetic, so the
 * baseline clone (four SSE quarters), the AVX2 clone (two halves) and the AVX-512 clone (one zmm)
 * give the same bits. */
typedef float v16f __attribute__((vector_size(64)));
/* the helpers below are inlined into the clones; no vector crosses a call boundary */
#pragma GCC diagnostic ignored "-Wpsabi"

static inline __attribute__((always_inline)) v16f ld16(const float *p) {
    v16f v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
static inline __attribute__((always_inline)) void st16(float *p, v16f v) { __builtin_memcpy(p, &v, sizeof v); }

/* The 16 lanes of a partial dot product, finished as ib_dot16_inline does: the tail i..n-1 added into
 * lanes 0.., then the halving tree. */
static inline float dot16_finish(v16f acc, const float *a, const float *b, int i, int n) {
    float lane[16];
    st16(lane, acc);
    for (int j = 0; i + j < n; j++) lane[j] = lane[j] + a[i + j] * b[i + j];
    for (int w = 8; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++) lane[j] = lane[j] + lane[j + w];
    return lane[0];
}

/* r[t] = ib_dot16_inline(q, k + t*stride, n) for t = 0..3, bitwise: four independent chains. */
static inline __attribute__((always_inline)) void dot16_x4(const float *q, const float *k, size_t stride, int n,
                                                           float r[4]) {
    const float *k0 = k, *k1 = k + stride, *k2 = k + 2 * stride, *k3 = k + 3 * stride;
    v16f a0 = {0}, a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        v16f qv = ld16(q + i);
        a0 = a0 + qv * ld16(k0 + i);
        a1 = a1 + qv * ld16(k1 + i);
        a2 = a2 + qv * ld16(k2 + i);
        a3 = a3 + qv * ld16(k3 + i);
    }
    r[0] = dot16_finish(a0, q, k0, i, n);
    r[1] = dot16_finish(a1, q, k1, i, n);
    r[2] = dot16_finish(a2, q, k2, i, n);
    r[3] = dot16_finish(a3, q, k3, i, n);
}

/* out[d] = out[d]*c, then out[d] = out[d] + p[j]*v_j[d] for j = j0..nb-1 in order, for every d:
 * the contract's per-element sequence. Columns are walked in register-sized chunks with the keys
 * inside, so the accumulators stay in registers; each element's operations are unchanged. */
static inline __attribute__((always_inline)) void scale_accumulate(float *out, int hd, float c, const float *p,
                                                                   const float *v, size_t stride, int j0, int nb) {
    /* a scalar operand of a vector operation is broadcast (a 16-element initializer would not compile
     * to one broadcast) */
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) {
        v16f o0 = ld16(out + d0) * c, o1 = ld16(out + d0 + 16) * c;
        v16f o2 = ld16(out + d0 + 32) * c, o3 = ld16(out + d0 + 48) * c;
        for (int j = j0; j < nb; j++) {
            const float *vj = v + (size_t)j * stride + d0;
            const float pj = p[j];
            o0 = o0 + pj * ld16(vj), o1 = o1 + pj * ld16(vj + 16);
            o2 = o2 + pj * ld16(vj + 32), o3 = o3 + pj * ld16(vj + 48);
        }
        st16(out + d0, o0), st16(out + d0 + 16, o1), st16(out + d0 + 32, o2), st16(out + d0 + 48, o3);
    }
    for (; d0 + 16 <= hd; d0 += 16) {
        v16f o0 = ld16(out + d0) * c;
        for (int j = j0; j < nb; j++) o0 = o0 + p[j] * ld16(v + (size_t)j * stride + d0);
        st16(out + d0, o0);
    }
    for (; d0 < hd; d0++) {
        float o = out[d0] * c;
        for (int j = j0; j < nb; j++) o = o + p[j] * v[(size_t)j * stride + d0];
        out[d0] = o;
    }
}

/* The scaled scores s[j] = dot16(q, k_j) * scale of keys j0..nb-1 of a block (key j at kb + j*st). */
static inline __attribute__((always_inline)) void block_scores(const float *q, const float *kb, size_t st, int hd,
                                                               float scale, int j0, int nb, float *s) {
    int j = j0;
    for (; j + 4 <= nb; j += 4) dot16_x4(q, kb + (size_t)j * st, st, hd, s + j);
    for (; j < nb; j++) s[j] = ib_dot16_inline(q, kb + (size_t)j * st, hd);
    for (j = j0; j < nb; j++) s[j] = s[j] * scale;
}

/* The online-softmax update of one block from its scores s[j0..nb): the running max m and sum l,
 * and out rescaled then accumulated with the values (value j at vb + j*st). */
static inline __attribute__((always_inline)) void block_update(const float *s, const float *vb, size_t st, int hd,
                                                               int j0, int nb, float *m, float *l, float *out) {
    float mb = -INFINITY;
    for (int j = j0; j < nb; j++)
        if (s[j] > mb) mb = s[j];
    float m_new = mb > *m ? mb : *m;
    float c = ib_expf(*m - m_new); /* exp(-inf) = 0 on the first block */
    float lv = *l * c;
    float pw[128]; /* the block's softmax weights, computed lane-parallel */
    for (int j = j0; j < nb; j++) pw[j] = ib_expf_lane(s[j] - m_new);
    for (int j = j0; j < nb; j++) lv = lv + pw[j];
    scale_accumulate(out, hd, c, pw, vb, st, j0, nb);
    *m = m_new;
    *l = lv;
}

/* One key block for one query head: scores, the running max m and sum l, and out updated. */
static inline __attribute__((always_inline)) void attend_block(const float *q, const float *kb, const float *vb,
                                                               size_t st, int hd, float scale, int j0, int nb,
                                                               float *m, float *l, float *out) {
    float s[128];  /* block <= 128 scores */
    block_scores(q, kb, st, hd, scale, j0, nb, s);
    block_update(s, vb, st, hd, j0, nb, m, l, out);
}

/* Ask for the keys and values of the block starting at key b (if any) to be brought into the cache
 * while the current block is computed: rows of row_bytes, stride_bytes apart. A session's keys are
 * only a few dozen kilobytes per head, too short a stream for the hardware prefetcher to ramp up. */
static inline __attribute__((always_inline)) void prefetch_block(const void *k, const void *v, int b, int n_keys,
                                                                 int block, size_t stride_bytes, size_t row_bytes) {
    int e = b + block < n_keys ? b + block : n_keys;
    for (int j = b; j < e; j++)
        for (size_t o = 0; o < row_bytes; o += 64) {
            __builtin_prefetch((const char *)k + (size_t)j * stride_bytes + o);
            __builtin_prefetch((const char *)v + (size_t)j * stride_bytes + o);
        }
}

IB_VECTOR_CLONES void ib_attend_heads(const float *q, int nq, const float *k, const float *v, int n_keys,
                                      int kv_stride, int hd, float scale, int block, int window, float *out) {
    float m[IB_ATTN_MAX_GROUP], l[IB_ATTN_MAX_GROUP];
    int lo = window > 0 && n_keys > window ? n_keys - window : 0;  /* first attended key */
    const size_t st = (size_t)kv_stride;
    for (int h = 0; h < nq; h++) m[h] = -INFINITY, l[h] = 0.0f;
    for (int d = 0; d < nq * hd; d++) out[d] = 0.0f;
    for (int b0 = lo - lo % block; b0 < n_keys; b0 += block) {
        int j0 = lo > b0 ? lo - b0 : 0;
        int nb = n_keys - b0 < block ? n_keys - b0 : block;
        prefetch_block(k, v, b0 + block, n_keys, block, st * sizeof(float), hd * sizeof(float));
        /* every head of the group walks this block while its keys and values are in L1 */
        for (int h = 0; h < nq; h++)
            attend_block(q + (size_t)h * hd, k + (size_t)b0 * st, v + (size_t)b0 * st, st, hd, scale, j0, nb, &m[h],
                         &l[h], out + (size_t)h * hd);
    }
    for (int h = 0; h < nq; h++)
        for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] = out[(size_t)h * hd + d] / l[h];
}

IB_VECTOR_CLONES void ib_attend_heads_f16(const uint16_t *k, const uint16_t *v, const float *q, int nq, int n_keys,
                                          int kv_stride, int hd, float scale, int block, int window, float *out) {
    float m[IB_ATTN_MAX_GROUP], l[IB_ATTN_MAX_GROUP];
    float s[IB_ATTN_MAX_GROUP][IB_ATTN_BLOCK];  /* scores of the block per head */
    float buf[IB_ATTN_BLOCK * IB_ATTN_MAX_HD];  /* [block][hd]: the block's keys, then its values */
    int lo = window > 0 && n_keys > window ? n_keys - window : 0;
    const size_t st = (size_t)kv_stride;
    for (int h = 0; h < nq; h++) m[h] = -INFINITY, l[h] = 0.0f;
    for (int d = 0; d < nq * hd; d++) out[d] = 0.0f;
    for (int b0 = lo - lo % block; b0 < n_keys; b0 += block) {
        int j0 = lo > b0 ? lo - b0 : 0;
        int nb = n_keys - b0 < block ? n_keys - b0 : block;
        prefetch_block(k, v, b0 + block, n_keys, block, st, hd * sizeof(uint16_t));
        for (int j = j0; j < nb; j++) ib_f16_to_f32_rows(k + (size_t)(b0 + j) * st, buf + (size_t)j * hd, hd);
        for (int h = 0; h < nq; h++) block_scores(q + (size_t)h * hd, buf, (size_t)hd, hd, scale, j0, nb, s[h]);
        for (int j = j0; j < nb; j++) ib_f16_to_f32_rows(v + (size_t)(b0 + j) * st, buf + (size_t)j * hd, hd);
        for (int h = 0; h < nq; h++) block_update(s[h], buf, (size_t)hd, hd, j0, nb, &m[h], &l[h], out + (size_t)h * hd);
    }
    for (int h = 0; h < nq; h++)
        for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] = out[(size_t)h * hd + d] / l[h];
}

void ib_attend_one_window(const float *q, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                          float scale, int block, int window, float *out) {
    ib_attend_heads(q, 1, k, v, n_keys, kv_stride, hd, scale, block, window, out);
}
