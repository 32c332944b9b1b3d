/*
 * attention_avx2.c — the AVX2 copy of attention (attention_impl.h), built with the AVX2 flags and
 * called only when the CPU has them (attention.c checks). Same bits as the portable copy.
 */
#if defined(__x86_64__) || defined(__i386__)
#define IB_ATTN_AVX2 1
#include "ops/attention_impl.h"

void ib_attend_heads_avx2(const float *q, int nq, const float *k, const float *v, int n_keys, int kv_stride, int hd,
                         float scale, int block, int window, float *out) {
    attend_heads_f32_copy(q, nq, k, v, n_keys, kv_stride, hd, scale, block, window, out);
}

void ib_attend_heads_f16_avx2(const uint16_t *k, const uint16_t *v, const float *q, int nq, int n_keys, int kv_stride,
                             int hd, float scale, int block, int window, float *out) {
    attend_heads_f16_copy(k, v, q, nq, n_keys, kv_stride, hd, scale, block, window, out);
}
#else
/* Not x86: no AVX2 copy (ISO C wants a translation unit to declare something). */
typedef int ib_attention_avx2_unused;
#endif
