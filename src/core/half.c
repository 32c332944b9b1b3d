/*
 * half.c — the row conversions of a half-precision KV cache: F16C instructions where the CPU has
 * them, else the portable code of half.h, with the same results. float16 -> float32 is exact either
 * way, so the two agree on every input except signaling NaNs (F16C quiets them); a KV cache never
 * holds one, because ib_f32_to_f16 writes every NaN as the quiet 0x7e00 (with its sign).
 * float32 -> float16 rounds to nearest even either way; NaNs are rewritten to that quiet form.
 */
#include <stdatomic.h>

#include "core/half.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* 8 values per vcvtph2ps, the tail through the portable loop. */
__attribute__((target("avx2,f16c"))) static void rows_f16c(const uint16_t *h, float *f, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    ib_f16_to_f32_row(h + i, f + i, n - i);
}

/* 1 when the CPU has AVX2 and F16C (checked once). */
static int have_f16c(void) {
    static _Atomic int known = -1;   /* racing first callers store the same value */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k;
}

void ib_f16_to_f32_rows(const uint16_t *h, float *f, int n) {
    if (have_f16c()) rows_f16c(h, f, n);
    else ib_f16_to_f32_row(h, f, n);
}

/* 8 values per vcvtps2ph with round-to-nearest-even (the immediate, not MXCSR); a NaN comes out as the
 * quiet NaN with its sign, as ib_f32_to_f16 writes it; the tail through ib_f32_to_f16. */
__attribute__((target("avx2,f16c"))) static void rows_to_f16c(const float *f, uint16_t *h, int n) {
    const __m128i mag = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    const __m128i sign = _mm_set1_epi16((short)0x8000), qnan = _mm_set1_epi16(0x7e00);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i r = _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT);
        __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(r, mag), inf);   /* magnitudes fit in int16 */
        __m128i fixed = _mm_or_si128(_mm_and_si128(r, sign), qnan);
        _mm_storeu_si128((__m128i *)(h + i), _mm_blendv_epi8(r, fixed, nan));
    }
    for (; i < n; i++) h[i] = ib_f32_to_f16(f[i]);
}

void ib_f32_to_f16_rows(const float *f, uint16_t *h, int n) {
    if (have_f16c()) {
        rows_to_f16c(f, h, n);
        return;
    }
    for (int i = 0; i < n; i++) h[i] = ib_f32_to_f16(f[i]);
}
#else
void ib_f16_to_f32_rows(const uint16_t *h, float *f, int n) { ib_f16_to_f32_row(h, f, n); }
void ib_f32_to_f16_rows(const float *f, uint16_t *h, int n) {
    for (int i = 0; i < n; i++) h[i] = ib_f32_to_f16(f[i]);
}
#endif
