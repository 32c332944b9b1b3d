/*
 * attention.c — causal attention of one query against a session's KV stream, online softmax over
 * fixed key blocks in ascending order. Prefill and decode walk the same blocks, so a prompt fed in
 * one pass, in chunks or token by token gives the same bits. The body is attention_impl.h; this file
 * holds its portable copy and picks between it and the AVX2 / AVX-512 copies, which give the same bits.
 */
#include <stdatomic.h>

#include "ops/attention_impl.h"

int ib_attn_block_for(int n_items) {
    if (ib_fault_get() == IB_FAULT_SPLIT_KV_BY_BATCH && n_items > 1) return IB_ATTN_BLOCK / 2;
    return IB_ATTN_BLOCK;
}

IB_ATTN_DEFINE_COPY(portable)

/* The copy for isa: AUTO means the best this CPU runs; AMX means AVX-512's; an ISA without its own copy
 * (SCALAR, NEON, or one this CPU lacks) gets the portable one. The CPU is asked once (this runs once per attention task). */
static ib_isa attn_isa(ib_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    static _Atomic int has512 = -1, has2 = -1;   /* racing first callers store the same values */
    int a512 = atomic_load_explicit(&has512, memory_order_relaxed), a2 = atomic_load_explicit(&has2, memory_order_relaxed);
    if (a512 < 0 || a2 < 0) {
        a512 = ib_isa_supported(IB_ISA_AVX512), a2 = ib_isa_supported(IB_ISA_AVX2);
        atomic_store_explicit(&has512, a512, memory_order_relaxed);
        atomic_store_explicit(&has2, a2, memory_order_relaxed);
    }
    if ((isa == IB_ISA_AUTO || isa == IB_ISA_AVX512 || isa == IB_ISA_AMX) && a512) return IB_ISA_AVX512;
    if ((isa == IB_ISA_AUTO || isa == IB_ISA_AVX2) && a2) return IB_ISA_AVX2;
#endif
    (void)isa;
    return IB_ISA_SCALAR;
}

int ib_attn_kernels_for(ib_isa isa, ib_attn_kernels *out) {
    if (isa == IB_ISA_AUTO || !ib_isa_supported(isa)) return -1;
    switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case IB_ISA_AVX512:
    case IB_ISA_AMX: /* AMX's attention is AVX-512's (the tiles serve the Q8 products only) */
        *out = (ib_attn_kernels){ib_attend_heads_ahead_avx512, ib_attend_block2_avx512,
                                  ib_attend_rows_avx512};
        return 0;
    case IB_ISA_AVX2:
        *out = (ib_attn_kernels){ib_attend_heads_ahead_avx2, ib_attend_block2_avx2,
                                  ib_attend_rows_avx2};
        return 0;
#endif
    case IB_ISA_SCALAR:
    case IB_ISA_NEON:
        *out = (ib_attn_kernels){ib_attend_heads_ahead_portable, ib_attend_block2_portable,
                                  ib_attend_rows_portable};
        return 0;
    default: return -1;
    }
}

void ib_attend_heads_isa(ib_isa isa, const float *q, int nq, const float *k, const float *v, int n_keys,
                         int kv_stride, int hd, float scale, int block, int window, float *out) {
    switch (attn_isa(isa)) {
#if defined(__x86_64__) || defined(__i386__)
    case IB_ISA_AVX512: ib_attend_heads_avx512(q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out); return;
    case IB_ISA_AVX2: ib_attend_heads_avx2(q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out); return;
#endif
    default: ib_attend_heads_portable(q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out); return;
    }
}

void ib_attend_heads_ahead_isa(ib_isa isa, ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq,
                               int n_keys, int kv_stride, int hd, float scale, int block, int window, float *out,
                               const ib_attn_ahead *ahead) {
    switch (attn_isa(isa)) {
#if defined(__x86_64__) || defined(__i386__)
    case IB_ISA_AVX512:
        ib_attend_heads_ahead_avx512(kvt, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out, ahead);
        return;
    case IB_ISA_AVX2:
        ib_attend_heads_ahead_avx2(kvt, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out, ahead);
        return;
#endif
    default: ib_attend_heads_ahead_portable(kvt, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out, ahead); return;
    }
}

void ib_attend_heads_kv_isa(ib_isa isa, ib_kv_dtype kvt, const void *k, const void *v, const float *q, int nq,
                            int n_keys, int kv_stride, int hd, float scale, int block, int window, float *out) {
    ib_attend_heads_ahead_isa(isa, kvt, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out, NULL);
}

void ib_attend_heads_f16_isa(ib_isa isa, const uint16_t *k, const uint16_t *v, const float *q, int nq, int n_keys,
                             int kv_stride, int hd, float scale, int block, int window, float *out) {
    ib_attend_heads_kv_isa(isa, IB_KV_F16, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out);
}

void ib_attend_block2_isa(ib_isa isa, ib_kv_dtype kvt, const float *q, int nq, const void *k1, const void *v1, int n1,
                          const void *k2, const void *v2, int n2, int kv_stride, int hd, float scale, float *m,
                          float *l, float *out) {
    switch (attn_isa(isa)) {
#if defined(__x86_64__) || defined(__i386__)
    case IB_ISA_AVX512:
        ib_attend_block2_avx512(kvt, q, nq, k1, v1, n1, k2, v2, n2, kv_stride, hd, scale, m, l, out);
        return;
    case IB_ISA_AVX2: ib_attend_block2_avx2(kvt, q, nq, k1, v1, n1, k2, v2, n2, kv_stride, hd, scale, m, l, out); return;
#endif
    default: ib_attend_block2_portable(kvt, q, nq, k1, v1, n1, k2, v2, n2, kv_stride, hd, scale, m, l, out); return;
    }
}

void ib_attend_rows_isa(ib_isa isa, ib_kv_dtype kvt, const float *q, size_t q_stride, int nq, int nr, const int *n_keys,
                        const void *k, const void *v, int kv_stride, int hd, float scale, int block, int window,
                        float *out, size_t out_stride) {
    switch (attn_isa(isa)) {
#if defined(__x86_64__) || defined(__i386__)
    case IB_ISA_AVX512:
        ib_attend_rows_avx512(kvt, q, q_stride, nq, nr, n_keys, k, v, kv_stride, hd, scale, block, window, out,
                              out_stride);
        return;
    case IB_ISA_AVX2:
        ib_attend_rows_avx2(kvt, q, q_stride, nq, nr, n_keys, k, v, kv_stride, hd, scale, block, window, out,
                            out_stride);
        return;
#endif
    default:
        ib_attend_rows_portable(kvt, q, q_stride, nq, nr, n_keys, k, v, kv_stride, hd, scale, block, window, out,
                                out_stride);
        return;
    }
}

void ib_attend_block_weights_isa(ib_isa isa, int nq, const float *s, int rs, int j0, int nb, float *m, float *l,
                                 float *pw, float *c) {
    switch (attn_isa(isa)) {
#if defined(__x86_64__) || defined(__i386__)
    case IB_ISA_AVX512: ib_attend_block_weights_avx512(nq, s, rs, j0, nb, m, l, pw, c); return;
    case IB_ISA_AVX2: ib_attend_block_weights_avx2(nq, s, rs, j0, nb, m, l, pw, c); return;
#endif
    default: ib_attend_block_weights_portable(nq, s, rs, j0, nb, m, l, pw, c); return;
    }
}

void ib_attend_heads(const float *q, int nq, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                     float scale, int block, int window, float *out) {
    ib_attend_heads_isa(IB_ISA_AUTO, q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out);
}

void ib_attend_heads_f16(const uint16_t *k, const uint16_t *v, const float *q, int nq, int n_keys, int kv_stride,
                         int hd, float scale, int block, int window, float *out) {
    ib_attend_heads_f16_isa(IB_ISA_AUTO, k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out);
}

void ib_attend_one(const float *q, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                   float scale, int block, float *out) {
    ib_attend_heads(q, 1, k, v, n_keys, kv_stride, hd, scale, block, 0, out);
}

void ib_attend_one_window(const float *q, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                          float scale, int block, int window, float *out) {
    ib_attend_heads(q, 1, k, v, n_keys, kv_stride, hd, scale, block, window, out);
}
