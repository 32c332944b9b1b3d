/*
 * attention.c — causal attention of one query against a session's KV stream, online softmax over
 * fixed key blocks in ascending order. Prefill and decode walk the same blocks, so a prompt fed in
 * one pass, in chunks or token by token gives the same bits.
 */
#include <math.h>

#include "core/fmath.h"
#include "ops/ops.h"

void ib_attend_one(const float *q, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                   float scale, int block, float *out) {
    ib_attend_one_window(q, k, v, n_keys, kv_stride, hd, scale, block, 0, out);
}

int ib_attn_block_for(int n_items) {
    if (ib_fault_get() == IB_FAULT_SPLIT_KV_BY_BATCH && n_items > 1) return IB_ATTN_BLOCK / 2;
    return IB_ATTN_BLOCK;
}

IB_VECTOR_CLONES void ib_attend_one_window(const float *q, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                          float scale, int block, int window, float *out) {
    float s[128];  /* block <= 128 scores */
    float m = -INFINITY, l = 0.0f;
    int lo = window > 0 && n_keys > window ? n_keys - window : 0;  /* first attended key */
    for (int d = 0; d < hd; d++) out[d] = 0.0f;
    for (int b0 = lo - lo % block; b0 < n_keys; b0 += block) {
        int j0 = lo > b0 ? lo - b0 : 0;
        int nb = n_keys - b0 < block ? n_keys - b0 : block;
        float mb = -INFINITY;
        for (int j = j0; j < nb; j++) {
            s[j] = ib_dot16_inline(q, k + (size_t)(b0 + j) * kv_stride, hd) * scale;
            if (s[j] > mb) mb = s[j];
        }
        float m_new = mb > m ? mb : m;
        float c = ib_expf(m - m_new); /* exp(-inf) = 0 on the first block */
        l = l * c;
        for (int d = 0; d < hd; d++) out[d] = out[d] * c;
        float pw[128]; /* the block's softmax weights, computed lane-parallel */
        for (int j = j0; j < nb; j++) pw[j] = ib_expf_lane(s[j] - m_new);
        for (int j = j0; j < nb; j++) {
            const float *vj = v + (size_t)(b0 + j) * kv_stride;
            l = l + pw[j];
            for (int d = 0; d < hd; d++) out[d] = out[d] + pw[j] * vj[d];
        }
        m = m_new;
    }
    for (int d = 0; d < hd; d++) out[d] = out[d] / l;
}
