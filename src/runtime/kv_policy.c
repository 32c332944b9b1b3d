/*
 * kv_policy.c — sliding-window and sink+window attention over a session's slot-indexed KV ring,
 * the policy parser and KV memory accounting (contracts in kv_policy.h and include/isobatch.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fmath.h"
#include "core/half.h"
#include "core/kv_elem.h"
#include "ops/ops.h"
#include "isobatch.h"
#include "runtime/kv_policy.h"

/* Row `slot` of a slot-indexed plane ([capacity][hd] of the session's KV type): a pointer to it, or
 * its values decoded into buf (half: exactly; q8: ib_kvq8_decode_row) when it is not float. */
static const float *kv_row(const ib_kv_desc *d, const void *plane, int slot, int hd, float *buf) {
    switch (d->dtype) {
    case IB_KV_F16: ib_f16_to_f32_row((const uint16_t *)plane + (size_t)slot * hd, buf, hd); return buf;
    case IB_KV_Q8:
        ib_kvq8_decode_row((const char *)plane + ib_kv_bytes(IB_KV_Q8, (size_t)slot * hd), hd, buf);
        return buf;
    default: return (const float *)plane + (size_t)slot * hd;
    }
}

void ib_attend_policy(const ib_kv_desc *s, const float *q, const void *k, const void *v, int p, int hd,
                      float scale, int block, float *out) {
    float sc[128];    /* block <= 128 scores */
    int slot[128];
    float buf[IB_ATTN_MAX_HD];
    float m = -INFINITY, l = 0.0f;
    int S = s->sink < p + 1 ? s->sink : p + 1;
    int lo = p - s->window + 1;
    if (lo < S) lo = S;
    for (int d = 0; d < hd; d++) out[d] = 0.0f;
    /* the sink range [0, S), then the window range [lo, p], each cut at multiples of block */
    int r0[2] = {0, lo}, r1[2] = {S, p + 1};
    for (int r = 0; r < 2; r++)
        for (int b0 = r0[r]; b0 < r1[r];) {
            int end = (b0 / block + 1) * block;
            if (end > r1[r]) end = r1[r];
            int nb = end - b0;
            float mb = -INFINITY;
            for (int j = 0; j < nb; j++) {
                slot[j] = ib_kv_slot(s, b0 + j);
                sc[j] = ib_dot16(q, kv_row(s, k, slot[j], hd, buf), hd) * scale;
                if (sc[j] > mb) mb = sc[j];
            }
            float m_new = mb > m ? mb : m;
            float c = ib_expf(m - m_new); /* exp(-inf) = 0 on the first block */
            l = l * c;
            for (int d = 0; d < hd; d++) out[d] = out[d] * c;
            for (int j = 0; j < nb; j++) {
                float pr = ib_expf(sc[j] - m_new);
                const float *vj = kv_row(s, v, slot[j], hd, buf);
                l = l + pr;
                for (int d = 0; d < hd; d++) out[d] = out[d] + pr * vj[d];
            }
            m = m_new;
            b0 = end;
        }
    for (int d = 0; d < hd; d++) out[d] = out[d] / l;
}

void ib_attend_policy_heads(const ib_kv_desc *s, ib_attend_block2_fn block2, const float *q, int nq, const void *k, const void *v,
                            int p, int hd, float scale, int block, float *out) {
    float m[IB_ATTN_MAX_GROUP], l[IB_ATTN_MAX_GROUP];
    const ib_kv_dtype kvt = s->dtype;
    const size_t row = ib_kv_bytes(kvt, (size_t)hd);
    const char *kb = k, *vb = v;
    for (int h = 0; h < nq; h++) m[h] = -INFINITY, l[h] = 0.0f;
    for (int d = 0; d < nq * hd; d++) out[d] = 0.0f;
    int S = s->sink < p + 1 ? s->sink : p + 1;
    int lo = p - s->window + 1;
    if (lo < S) lo = S;
    /* the same ranges and blocks as ib_attend_policy; a block of the window range whose slots run past
     * the ring's end continues at its start (slot kv_sink) */
    int r0[2] = {0, lo}, r1[2] = {S, p + 1};
    for (int r = 0; r < 2; r++)
        for (int b0 = r0[r]; b0 < r1[r];) {
            int end = (b0 / block + 1) * block;
            if (end > r1[r]) end = r1[r];
            int nb = end - b0, slot = ib_kv_slot(s, b0);
            int n1 = s->capacity - slot < nb ? s->capacity - slot : nb;
            block2(kvt, q, nq, kb + (size_t)slot * row, vb + (size_t)slot * row, n1, kb + (size_t)s->sink * row,
                   vb + (size_t)s->sink * row, nb - n1, hd, hd, scale, m, l, out);
            b0 = end;
        }
    for (int h = 0; h < nq; h++)
        for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] = out[(size_t)h * hd + d] / l[h];
}

/* The positions [r0[0], r1[0]) (sink) and [r0[1], r1[1]) (window) that position p attends (A(p) in
 * kv_policy.h), as ib_attend_policy walks them. */
static void policy_ranges(const ib_kv_desc *s, int p, int r0[2], int r1[2]) {
    int S = s->sink < p + 1 ? s->sink : p + 1;
    int lo = p - s->window + 1;
    if (lo < S) lo = S;
    r0[0] = 0, r1[0] = S, r0[1] = lo, r1[1] = p + 1;
}

void ib_attend_policy_rows(const ib_kv_desc *s, ib_attend_block2_fn block2, const float *q, size_t q_stride, int nq,
                           int nr, const int *pos, const void *k, const void *v, int hd, float scale, int block,
                           float *out, size_t out_stride) {
    float qt[IB_ATTN_TILE_Q * IB_ATTN_MAX_HD], ot[IB_ATTN_TILE_Q * IB_ATTN_MAX_HD]; /* [nr*nq][hd] each */
    float m[IB_ATTN_TILE_Q], l[IB_ATTN_TILE_Q];                                     /* [nr*nq] */
    int r0[IB_ATTN_TILE_Q][2], r1[IB_ATTN_TILE_Q][2];                               /* [nr] rows' ranges */
    const ib_kv_dtype kvt = s->dtype;
    const int fault = ib_fault_get() == IB_FAULT_ATTN_TILE_RANGE;
    const size_t row = ib_kv_bytes(kvt, (size_t)hd), rowq = (size_t)nq * hd;
    const char *kb = k, *vb = v;
    if (nr < 1) return;
    for (int t = 0; t < nr; t++) {
        policy_ranges(s, fault ? pos[nr - 1] : pos[t], r0[t], r1[t]);
        for (size_t e = 0; e < rowq; e++) qt[(size_t)t * rowq + e] = q[(size_t)t * q_stride + e];
    }
    for (size_t e = 0; e < (size_t)nr * rowq; e++) ot[e] = 0.0f;
    for (int x = 0; x < nr * nq; x++) m[x] = -INFINITY, l[x] = 0.0f;
    for (int r = 0; r < 2; r++) {
        /* the block cells (positions [c*block, (c+1)*block)) that some row's range r reaches */
        int c0 = -1, c1 = -1;
        for (int t = 0; t < nr; t++)
            if (r0[t][r] < r1[t][r]) {
                if (c0 < 0 || r0[t][r] / block < c0) c0 = r0[t][r] / block;
                if ((r1[t][r] - 1) / block > c1) c1 = (r1[t][r] - 1) / block;
            }
        for (int c = c0; c >= 0 && c <= c1; c++)
            for (int t = 0, u; t < nr; t = u) {
                /* row t's part of the cell, and the rows after it taking the same part */
                int b0 = c * block > r0[t][r] ? c * block : r0[t][r];
                int end = (c + 1) * block < r1[t][r] ? (c + 1) * block : r1[t][r];
                for (u = t + 1; u < nr; u++) {
                    int ub0 = c * block > r0[u][r] ? c * block : r0[u][r];
                    int uend = (c + 1) * block < r1[u][r] ? (c + 1) * block : r1[u][r];
                    if (ub0 != b0 || uend != end) break;
                }
                if (b0 >= end) continue;
                int nb = end - b0, slot = ib_kv_slot(s, b0), x = t * nq;
                int n1 = s->capacity - slot < nb ? s->capacity - slot : nb;
                block2(kvt, qt + (size_t)x * hd, (u - t) * nq, kb + (size_t)slot * row, vb + (size_t)slot * row, n1,
                       kb + (size_t)s->sink * row, vb + (size_t)s->sink * row, nb - n1, hd, hd, scale, m + x, l + x,
                       ot + (size_t)x * hd);
            }
    }
    for (int x = 0; x < nr * nq; x++) {
        float *o = out + (size_t)(x / nq) * out_stride + (size_t)(x % nq) * hd;
        for (int d = 0; d < hd; d++) o[d] = ot[(size_t)x * hd + d] / l[x];
    }
}

int ib_kv_policy_parse(const char *str, int *sink, int *window) {
    char *end;
    long a, b;
    if (!str) return -1;
    if (!strcmp(str, "full")) {
        *sink = *window = 0;
        return 0;
    }
    if (!strncmp(str, "window:", 7)) {
        a = strtol(str + 7, &end, 10);
        if (end == str + 7 || *end || a < 1 || a > (1 << 24)) return -1;
        *sink = 0;
        *window = (int)a;
        return 0;
    }
    if (!strncmp(str, "sink:", 5)) {
        a = strtol(str + 5, &end, 10);
        if (end == str + 5 || a < 0 || a > (1 << 20) || strncmp(end, ",window:", 8)) return -1;
        const char *w = end + 8;
        b = strtol(w, &end, 10);
        if (end == w || *end || b < 1 || b > (1 << 24)) return -1;
        *sink = (int)a;
        *window = (int)b;
        return 0;
    }
    return -1;
}

size_t ib_session_kv_bytes(const ib_session *s) { return ib_kv_desc_bytes(&s->kv->desc); }

size_t ib_kv_bytes_per_token(const ib_model *m, ib_kv_dtype t) {
    const ib_config *c = &m->cfg;
    size_t n = 0;
    for (int li = 0; li < c->n_layers; li++)   /* KV-shared layers store nothing */
        if (!c->kv_from[li]) n += (size_t)2 * ib_config_layer_kvh(c, li) * ib_config_layer_hd(c, li);
    return ib_kv_bytes(t, n);
}
