/*
 * kv_elem.c — the CPU's encoder of q8 KV rows: the definition of kv_elem.h (ib_kvq8_encode_row_qmax)
 * on AVX2 where the CPU has it, else that definition itself. The AVX2 copy performs the definition's
 * operations lane-wise: |x| by clearing the sign bit, the block maximum (exact in any order; only used
 * when every value is finite, so no NaN meets vmaxps), one division per value, the clamp (min/max of
 * non-NaN values), rounding to nearest even (vroundps, which is what the definition's 1.5 * 2^23
 * addition and subtraction compute), an exact conversion and a pack of values inside [-127, 127]. So
 * the bytes are the definition's for every input; tests/test_kv_elem.c compares the two.
 */
#include <stdatomic.h>

#include "core/kv_elem.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx2"))) static void rows_avx2(const float *x, int n, unsigned char *o, float qmax) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), big = _mm256_set1_ps(3.40282347e38f);
    for (int b = 0; b < n / IB_KVQ8_BLOCK; b++, x += IB_KVQ8_BLOCK, o += IB_KVQ8_BLOCK_BYTES) {
        __m256 v[4], a = _mm256_setzero_ps();
        int finite = 1;
        for (int u = 0; u < 4; u++) {
            v[u] = _mm256_loadu_ps(x + 8 * u);
            const __m256 m = _mm256_and_ps(v[u], abs_mask);
            finite &= _mm256_movemask_ps(_mm256_cmp_ps(m, big, _CMP_LE_OQ)) == 0xff;
            a = _mm256_max_ps(a, m);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float s = finite ? _mm_cvtss_f32(h) / qmax : ib_bits_to_f32(0x7fc00000u);
        __m256i c = _mm256_setzero_si256();
        if (finite && s != 0.0f) {
            const __m256 sv = _mm256_set1_ps(s), hi = _mm256_set1_ps(qmax), lo = _mm256_set1_ps(-qmax);
            __m256i q[4];
            for (int u = 0; u < 4; u++) {
                __m256 y = _mm256_div_ps(v[u], sv);
                y = _mm256_max_ps(_mm256_min_ps(y, hi), lo);
                q[u] = _mm256_cvtps_epi32(_mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            }
            /* packs work inside 128-bit lanes: the bytes come out as dwords 0,4,1,5,2,6,3,7 of 4 codes each */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            c = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        }
        _mm256_storeu_si256((__m256i *)o, c);
        memcpy(o + IB_KVQ8_BLOCK, &s, sizeof s);
    }
}

/* 1 when the CPU has AVX2 (checked once). */
static int have_avx2(void) {
    static _Atomic int known = -1;   /* racing first callers store the same value */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx2");
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k;
}

void ib_kvq8_encode_rows_qmax(const float *x, int n, void *dst, float qmax) {
    if (have_avx2()) rows_avx2(x, n, (unsigned char *)dst, qmax);
    else ib_kvq8_encode_row_qmax(x, n, dst, qmax);
}
#else
void ib_kvq8_encode_rows_qmax(const float *x, int n, void *dst, float qmax) { ib_kvq8_encode_row_qmax(x, n, dst, qmax); }
#endif
