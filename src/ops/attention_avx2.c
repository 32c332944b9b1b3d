/*
 * attention_avx2.c — the AVX2 copy of attention (attention_impl.h), built with the AVX2 flags and
 * called only when the CPU has them (attention.c checks). Same bits as the portable copy.
 */
#if defined(__x86_64__) || defined(__i386__)
#define IB_ATTN_AVX2 1
#include "ops/attention_impl.h"

IB_ATTN_DEFINE_COPY(avx2)
#else
/* Not x86: no AVX2 copy (ISO C wants a translation unit to declare something). */
typedef int ib_attention_avx2_unused;
#endif
