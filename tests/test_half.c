/*
 * test_half.c — float16 / bfloat16 conversions (used when loading F16/BF16 weights and writing
 * synthetic models) against values computed here by definition.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "core/half.h"

/* float16 value by definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals 2^-14 * m/1024. */
static double f16_ref(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m / 1024.0, -14);
    else v = ldexp(1 + m / 1024.0, e - 15);
    return s ? -v : v;
}

int main(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = f16_ref((uint16_t)h);
        float got = ib_f16_to_f32((uint16_t)h);
        if (isnan(ref) ? !isnan(got) : (double)got != ref || !signbit(got) != !signbit(ref)) bad++;
        /* round trip through float32 is exact for every non-NaN half */
        if (!isnan(ref) && ib_f32_to_f16(got) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* the branch-free row conversion (half-precision KV) equals the scalar one bit for bit */
    {
        static uint16_t all[65536];
        static float row[65536];
        for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
        ib_f16_to_f32_row(all, row, 65536);
        int rbad = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            float a = ib_f16_to_f32((uint16_t)h);
            if (memcmp(&a, &row[h], 4)) rbad++;
        }
        CHECK(rbad == 0, "ib_f16_to_f32_row differs from ib_f16_to_f32 at %d inputs", rbad);
        /* its one-value form (the CUDA backend reads half KV with it) too */
        int lbad = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            float a = ib_f16_to_f32((uint16_t)h), b = ib_f16_to_f32_lane((uint16_t)h);
            if (memcmp(&a, &b, 4)) lbad++;
        }
        CHECK(lbad == 0, "ib_f16_to_f32_lane differs from ib_f16_to_f32 at %d inputs", lbad);
        /* the dispatched conversion (F16C where the CPU has it) too, odd lengths and offsets
         * included; a signaling NaN may come back quieted, with its sign */
        for (int off = 0; off < 3; off++) {
            memset(row, 0, sizeof row);
            ib_f16_to_f32_rows(all + off, row, 65536 - off - (off == 1 ? 5 : 0));
            int dbad = 0;
            for (uint32_t h = (uint32_t)off; h < 65536u - (off == 1 ? 5u : 0u); h++) {
                float a = ib_f16_to_f32((uint16_t)h), b = row[h - (uint32_t)off];
                int snan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) && !(h & 0x200u);
                if (snan ? !(isnan(b) && !signbit(a) == !signbit(b)) : memcmp(&a, &b, 4) != 0) dbad++;
            }
            CHECK(dbad == 0, "ib_f16_to_f32_rows (offset %d) differs from ib_f16_to_f32 at %d inputs", off, dbad);
        }
    }
    /* the dispatched float32 -> float16 row conversion (F16C where the CPU has it) equals the scalar
     * one: every sign/exponent/top-mantissa pattern with low mantissa bits around the rounding points
     * of normal results (bit 12 halfway, bit 13 parity) and random ones, NaNs and infinities included */
    {
        static const uint32_t lows[] = {0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001, 0x2fff, 0x3000,
                                        0x3001, 0x7fff, 0x8000, 0x9000, 0xe000, 0xf000, 0xfffe, 0xffff};
        enum { NL = sizeof lows / sizeof lows[0], NR = 4 };
        static float in[65536 + 3];
        static uint16_t out[65536 + 3];
        int cbad = 0;
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (int li = 0; li < NL + NR; li++) {
            for (uint32_t hi = 0; hi < 65536; hi++) {
                uint32_t lo = lows[li % NL];
                if (li >= NL) r = r * 6364136223846793005ull + 1442695040888963407ull, lo = (uint32_t)(r >> 48);
                in[hi] = ib_bits_to_f32(hi << 16 | lo);
            }
            int n = 65536 - (li % 3);   /* odd lengths: the scalar tail */
            ib_f32_to_f16_rows(in, out, n);
            for (int i = 0; i < n; i++) cbad += out[i] != ib_f32_to_f16(in[i]);
        }
        CHECK(cbad == 0, "ib_f32_to_f16_rows differs from ib_f32_to_f16 at %d inputs", cbad);
    }
    /* float32 -> float16 rounds to nearest even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 */
    CHECK_EQ_INT(ib_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);
    CHECK_EQ_INT(ib_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02);
    CHECK_EQ_INT(ib_f32_to_f16(65520.0f), 0x7c00);     /* rounds up to inf */
    CHECK_EQ_INT(ib_f32_to_f16(65519.0f), 0x7bff);     /* largest finite */
    CHECK_EQ_INT(ib_f32_to_f16(ldexpf(1, -25)), 0x0000);   /* half of the smallest subnormal: to even (0) */
    CHECK_EQ_INT(ib_f32_to_f16(ldexpf(3, -26)), 0x0001);   /* 0.75 of it: up */
    /* bfloat16: the top 16 bits, rounded to nearest even */
    int bbad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ib_bf16_to_f32((uint16_t)h);
        uint32_t u;
        memcpy(&u, &f, 4);
        if (u != h << 16) bbad++;
        if (!isnan(f) && ib_f32_to_bf16(f) != h) bbad++;
    }
    CHECK_EQ_INT(bbad, 0);
    CHECK_EQ_INT(ib_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80);          /* tie -> even */
    CHECK_EQ_INT(ib_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)), 0x3f82);      /* tie -> even (up) */
    CHECK(isnan(ib_bf16_to_f32(ib_f32_to_bf16(NAN))), "NaN must stay NaN");
    TEST_MAIN_END("test_half");
}
