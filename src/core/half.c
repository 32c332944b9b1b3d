/*
 * half.c — the float16 -> float32 row conversion used when reading a half-precision KV cache:
 * the F16C instruction where the CPU has it, else the portable branch-free loop of half.h. Both are
 * exact, so they agree on every input except signaling NaNs (F16C quiets them); a KV cache never
 * holds one, because ib_f32_to_f16 writes every NaN as the quiet 0x7e00 (with its sign).
 */
#include <stdatomic.h>

#include "core/half.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* 8 values per vcvtph2ps, the tail through the portable loop. */
__attribute__((target("avx,f16c"))) static void rows_f16c(const uint16_t *h, float *f, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    ib_f16_to_f32_row(h + i, f + i, n - i);
}

static int have_f16c(void) {
    static _Atomic int known = -1;   /* racing first callers store the same value */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k;
}

void ib_f16_to_f32_rows(const uint16_t *h, float *f, int n) {
    if (have_f16c()) rows_f16c(h, f, n);
    else ib_f16_to_f32_row(h, f, n);
}
#else
void ib_f16_to_f32_rows(const uint16_t *h, float *f, int n) { ib_f16_to_f32_row(h, f, n); }
#endif
