/*
 * test_kv_elem.c — the q8 KV element type's bytes (core/kv_elem.h) against values worked out by hand
 * from its definition: codes, scales and their places in a block, rounding ties to even, the clamp of a
 * subnormal scale, blocks with NaN, infinities, zeros and an underflowing scale; the byte offsets of
 * every KV type. Decoding is checked by reading the bytes here (a code times its block's scale), not
 * through the header's decoder.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/kv_elem.h"
#include "model/model.h"

/* The code and scale of element i of an encoded row, read from the bytes as the layout says. */
static int code_at(const unsigned char *row, int i) { return (int8_t)row[(i / 32) * 36 + i % 32]; }
static float scale_at(const unsigned char *row, int i) {
    float s;
    memcpy(&s, row + (i / 32) * 36 + 32, 4);
    return s;
}
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Encode x [64] and compare codes and scales of both blocks with want_c [64] and want_s [2] (scales
 * bitwise); the decoder's values with code * scale. Returns the mismatches. */
static int expect(const char *what, const float *x, const int *want_c, const float *want_s) {
    unsigned char row[72];
    float dec[64];
    memset(row, 0xa5, sizeof row);
    ib_kvq8_encode_row(x, 64, row);
    ib_kvq8_decode_row(row, 64, dec);
    int bad = 0;
    for (int b = 0; b < 2; b++)
        if (bits(scale_at(row, b * 32)) != bits(want_s[b])) {
            fprintf(stderr, "%s: block %d scale %a, want %a\n", what, b, scale_at(row, b * 32), want_s[b]);
            bad++;
        }
    for (int i = 0; i < 64; i++) {
        if (code_at(row, i) != want_c[i]) {
            fprintf(stderr, "%s: element %d code %d, want %d\n", what, i, code_at(row, i), want_c[i]);
            bad++;
        }
        const float want = want_s[i / 32] * (float)want_c[i];
        if (bits(dec[i]) != bits(want) && !(isnan(dec[i]) && isnan(want))) {
            fprintf(stderr, "%s: element %d decodes to %a, want %a\n", what, i, dec[i], want);
            bad++;
        }
    }
    return bad;
}

int main(void) {
    float x[64];
    int c[64];
    float s[2];

    /* scale 1: codes are the values rounded, ties to even (-63.5 -> -64, 0.5 -> 0, 2.5 -> 2, -2.5 -> -2);
     * block 2, scale 2 (254 / 127): 3 / 2 = 1.5 -> 2, 5 / 2 = 2.5 -> 2, -7 / 2 = -3.5 -> -4, 1 / 2 -> 0 */
    memset(x, 0, sizeof x), memset(c, 0, sizeof c);
    static const float v0[] = {127, -63.5f, 1, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 3.25f, -126.75f};
    static const int c0[] = {127, -64, 1, 0, 2, 2, 0, -2, 3, -127};
    for (int i = 0; i < 10; i++) x[i] = v0[i], c[i] = c0[i];
    static const float v1[] = {254, 3, 5, -7, 1, -254};
    static const int c1[] = {127, 2, 2, -4, 0, -127};
    for (int i = 0; i < 6; i++) x[32 + 3 * i] = v1[i], c[32 + 3 * i] = c1[i];
    s[0] = 1.0f, s[1] = 2.0f;
    CHECK(expect("scales 1 and 2", x, c, s) == 0, "codes or scales differ from the worked values");

    /* NaN in block 1, +inf in block 2: scale NaN (0x7fc00000), every code 0, every value NaN */
    memset(x, 0, sizeof x), memset(c, 0, sizeof c);
    x[0] = 3, x[5] = NAN, x[40] = INFINITY, x[41] = 2;
    s[0] = s[1] = NAN;
    CHECK(expect("NaN and inf blocks", x, c, s) == 0, "non-finite blocks are not NaN-scaled zero codes");
    {
        unsigned char row[72];
        ib_kvq8_encode_row(x, 64, row);
        CHECK(bits(scale_at(row, 0)) == 0x7fc00000u && bits(scale_at(row, 32)) == 0x7fc00000u,
              "a non-finite block's scale is %08x / %08x, not the quiet NaN 7fc00000", bits(scale_at(row, 0)),
              bits(scale_at(row, 32)));
    }

    /* zeros (either sign) and an underflowing scale: 2^-149 / 127 rounds to 0, so scale +0, codes 0 */
    memset(x, 0, sizeof x), memset(c, 0, sizeof c);
    x[1] = -0.0f, x[33] = 0x1p-149f, x[40] = -0x1p-149f;
    s[0] = s[1] = 0.0f;
    CHECK(expect("zero and underflow", x, c, s) == 0, "a zero or underflowing block is not zero-scaled");

    /* a subnormal scale: 2^-140 / 127 = 4.03 units of 2^-149, so s = 2^-147, and 2^-140 / s = 128 is
     * clamped to 127; -2^-141 / s = -64; 2^-148 / s = 0.5 -> 0; 3 * 2^-148 / s = 1.5 -> 2 */
    memset(x, 0, sizeof x), memset(c, 0, sizeof c);
    x[0] = 0x1p-140f, x[1] = -0x1p-141f, x[2] = 0x1p-148f, x[3] = 0x1.8p-147f;
    c[0] = 127, c[1] = -64, c[2] = 0, c[3] = 2;
    x[32] = 1.0f;   /* block 2: 1 / 127, codes of 1 -> 127 */
    c[32] = 127;
    s[0] = 0x1p-147f, s[1] = 1.0f / 127.0f;
    CHECK(expect("subnormal scale", x, c, s) == 0, "the subnormal scale's codes are not clamped to 127");

    /* layout: offsets of each type's elements */
    CHECK(ib_kv_bytes(IB_KV_F32, 64) == 256 && ib_kv_bytes(IB_KV_F16, 64) == 128 && ib_kv_bytes(IB_KV_Q8, 64) == 72,
          "64 elements take %zu / %zu / %zu bytes (want 256, 128, 72)", ib_kv_bytes(IB_KV_F32, 64),
          ib_kv_bytes(IB_KV_F16, 64), ib_kv_bytes(IB_KV_Q8, 64));
    CHECK(ib_kv_bytes(IB_KV_Q8, 40) == 44 && ib_kv_bytes(IB_KV_Q8, 31) == 31 && ib_kv_bytes(IB_KV_Q8, 128 * 7) == 36 * 28,
          "q8 offsets: element 40 at %zu (want 44), 31 at %zu (31), 896 at %zu (1008)", ib_kv_bytes(IB_KV_Q8, 40),
          ib_kv_bytes(IB_KV_Q8, 31), ib_kv_bytes(IB_KV_Q8, 128 * 7));

    /* the fault's code range: 126 where the definition has 127 (scale 254 / 126, codes up to 126) */
    {
        unsigned char a[72], b[72];
        memset(x, 0, sizeof x);
        x[0] = 254, x[1] = 100;
        ib_kvq8_encode_row(x, 64, a);
        ib_kvq8_encode_row_qmax(x, 64, b, 126.0f);
        CHECK(code_at(a, 0) == 127 && code_at(b, 0) == 126 && memcmp(a, b, sizeof a) != 0,
              "codes up to 126 give %d (definition %d)", code_at(b, 0), code_at(a, 0));
    }
    /* the CPU's SIMD encoder (ib_kvq8_encode_rows_qmax) against the definition, byte for byte, on rows
     * of random magnitudes (2^-150 .. 2^60 a block), values on rounding ties (k + 1/2 times a power of
     * two scale), and NaN, infinities, signed zeros and subnormals dropped in; codes up to 127 and 126 */
    {
        enum { N = 256, ROWS = 4000 };
        static float r[N];
        static unsigned char want[N / 32 * 36], got[N / 32 * 36];
        uint64_t st = 0x9e3779b97f4a7c15ull;
        int differ = 0, rows = 0;
        for (int row = 0; row < ROWS; row++) {
            for (int b = 0; b < N / 32; b++) {
                st ^= st << 13, st ^= st >> 7, st ^= st << 17;
                const int kind = (int)(st % 8), e = (int)((st >> 8) % 211) - 150;
                for (int i = 0; i < 32; i++) {
                    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
                    const double u = (double)(st >> 11) * 0x1.0p-53 * 2.0 - 1.0;
                    float v = ldexpf((float)u, e);
                    if (kind == 1) v = ldexpf((float)((int)(u * 127) + 0.5), e - 7);   /* ties */
                    if (kind == 2 && i == (int)(st >> 40) % 32) v = (st >> 50) & 1 ? NAN : -INFINITY;
                    if (kind == 3 && i % 3 == 0) v = (st >> 50) & 1 ? -0.0f : 0x1p-149f * (float)(st >> 60);
                    if (kind == 4) v = 0.0f;
                    r[b * 32 + i] = v;
                }
            }
            const float qmax = row % 5 == 0 ? 126.0f : 127.0f;
            memset(want, 0x11, sizeof want), memset(got, 0x22, sizeof got);
            ib_kvq8_encode_row_qmax(r, N, want, qmax);
            ib_kvq8_encode_rows_qmax(r, N, got, qmax);
            differ += memcmp(want, got, sizeof want) != 0;
            rows++;
        }
        CHECK(differ == 0, "the SIMD q8 encoder differs from the definition on %d of %d rows", differ, rows);
    }
    /* sessions: q8 needs head dims that are multiples of 32 (a one-line refusal naming them); an unknown
     * dtype is refused too, and a q8 cache takes 36/32 bytes an element */
    {
        ib_model m;
        memset(&m, 0, sizeof m);
        m.cfg.n_layers = 2, m.cfg.n_heads = 2, m.cfg.n_kv_heads = 1, m.cfg.head_dim = 48;
        m.cfg.max_position = 64, m.cfg.vocab_size = 16;
        ib_session *ses = NULL;
        ib_error err = {0};
        ib_session_opts o = {.max_context = 16, .kv_dtype = IB_KV_Q8, .sampling = ib_sampling_default()};
        ib_status rc = ib_session_create(&m, &o, &ses, &err);
        CHECK(rc == IB_ERR_UNSUPPORTED && strstr(err.msg, "multiples of 32") && strstr(err.msg, "48") && !ses,
              "q8 session with head_dim 48: status %d, '%s'", (int)rc, err.msg);
        ib_error err2 = {0};
        rc = ib_session_check(&m, &o, &err2);   /* the same verdict without a session */
        CHECK(rc == IB_ERR_UNSUPPORTED && !strcmp(err.msg, err2.msg), "ib_session_check, head_dim 48: %d '%s'", (int)rc,
              err2.msg);
        o.kv_dtype = IB_KV_F16;
        CHECK(ib_session_check(&m, &o, &err2) == IB_OK, "f16 with head_dim 48 refused: %s", err2.msg);
        o.kv_dtype = IB_KV_Q8;
        o.kv_dtype = (ib_kv_dtype)7;
        rc = ib_session_create(&m, &o, &ses, &err);
        CHECK(rc == IB_ERR_INVALID_ARG && strstr(err.msg, "kv_dtype 7") && !ses, "dtype 7: status %d, '%s'", (int)rc,
              err.msg);
        m.cfg.head_dim = 64;
        o.kv_dtype = IB_KV_Q8;
        rc = ib_session_create(&m, &o, &ses, &err);
        CHECK(rc == IB_OK && ses && ib_session_kv_bytes(ses) == (size_t)2 * 2 * 16 * 64 / 32 * 36,
              "q8 session with head_dim 64: status %d '%s', %zu KV bytes (want %d)", (int)rc, err.msg,
              ses ? ib_session_kv_bytes(ses) : 0, 2 * 2 * 16 * 64 / 32 * 36);
        CHECK(ib_session_check(&m, &o, &err) == IB_OK, "ib_session_check, q8 with head_dim 64: %s", err.msg);
        ib_session_free(ses);
    }
    TEST_MAIN_END("test_kv_elem");
}
