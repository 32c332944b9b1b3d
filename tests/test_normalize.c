/*
 * test_normalize.c — Unicode normalization of the tokenizer (src/tokenizer/normalize.c):
 *   - every form (NFC, NFD, NFKC, NFKD) equals utf8proc_map on thousands of random strings drawn
 *     from starters, combining marks of many classes, Hangul, compatibility and singleton
 *     characters, and on long mixed runs of marks;
 *   - the time on a run of 65,536 combining marks in the worst order for an exchange sort is that of
 *     ordinary text (it was about 10 s: quadratic canonical reordering), and the whole encode of such
 *     a text through the default model's NFC tokenizer likewise;
 *   - an encode can be cancelled: the callback is asked while a long text is being worked on, and a
 *     "stop" answer makes it return -2 promptly; a "go on" answer gives the plain encode's ids.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "check.h"
#include "test_rng.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Code points chosen to exercise decomposition, reordering and composition. */
static const int32_t pool[] = {
    'a', 'e', 'o', 'A', 'K', ' ', 'z', 0x00E9, 0x00C5, 0x212B, 0x2126, 0x1E9B, 0x0344, 0x0F73, 0x1F80,
    0x0300, 0x0301, 0x0308, 0x0316, 0x0327, 0x0328, 0x031B, 0x0345, 0x05B0, 0x05B7, 0x0F71, 0x0F72,
    0x093C, 0x094D, 0x0334, 0x0E38, 0x0E48, 0x3099, 0x309A, 0x304B, 0x30AB,
    0xAC00, 0xD7A3, 0x1100, 0x1161, 0x11A8, 0x11C2, 0xFB01, 0x2460, 0x00B2, 0xFDFA, 0x3300, 0x1D160,
    0x4E00, 0x1F600, 0x0928, 0x0915, 0x0061, 0x0065,
};
#define NPOOL ((int)(sizeof pool / sizeof pool[0]))

static int put(int32_t c, char *o) { return (int)utf8proc_encode_char(c, (utf8proc_uint8_t *)o); }

static const char *form_name(int k) {
    return k == NORM_NFC ? "NFC" : k == NORM_NFD ? "NFD" : k == NORM_NFKC ? "NFKC" : "NFKD";
}

static utf8proc_option_t form_opt(int k) {
    utf8proc_option_t o = UTF8PROC_STABLE;
    if (k == NORM_NFC) o |= UTF8PROC_COMPOSE;
    else if (k == NORM_NFD) o |= UTF8PROC_DECOMPOSE;
    else if (k == NORM_NFKC) o |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else o |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    return o;
}

/* Compare tok_normalize_form with utf8proc_map on s[0..n); 1 when equal. */
static int same_as_utf8proc(int kind, const char *s, size_t n) {
    size_t got_n = 0;
    char *got = tok_normalize_form(kind, s, n, &got_n, NULL);
    utf8proc_uint8_t *want = NULL;
    utf8proc_ssize_t wn = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &want, form_opt(kind));
    int ok = got && wn >= 0 && (size_t)wn == got_n && !memcmp(got, want, got_n) && got[got_n] == 0;
    free(got);
    free(want);
    return ok;
}

static void random_strings(void) {
    char s[64 * 4 + 1];
    int bad[5] = {0}, cases = 4000;
    for (int c = 0; c < cases; c++) {
        int len = 1 + (int)(rnd64() % 48), k = 0;
        for (int i = 0; i < len; i++) k += put(pool[rnd64() % (uint64_t)NPOOL], s + k);
        for (int f = NORM_NFC; f <= NORM_NFKD; f++)
            if (!same_as_utf8proc(f, s, (size_t)k) && bad[f]++ < 3) fprintf(stderr, "differs (%s) on case %d\n", form_name(f), c);
    }
    for (int f = NORM_NFC; f <= NORM_NFKD; f++)
        CHECK(bad[f] == 0, "%s: %d of %d random strings differ from utf8proc_map", form_name(f), bad[f], cases);
}

/* A long run of marks of several classes in random order (2,000 marks: utf8proc's own sort takes
 * milliseconds here) must reorder exactly as utf8proc does. */
static void long_mixed_run(void) {
    static const int32_t marks[] = {0x0301, 0x0316, 0x0327, 0x031B, 0x0345, 0x05B0, 0x0F71, 0x093C, 0x0334, 0x0308};
    size_t cap = 4 * 2100;
    char *s = malloc(cap);
    int k = put('a', s);
    for (int i = 0; i < 2000; i++) k += put(marks[rnd64() % 10], s + k);
    k += put(0x00E9, s + k);
    for (int f = NORM_NFC; f <= NORM_NFKD; f++)
        CHECK(same_as_utf8proc(f, s, (size_t)k), "%s: 2,000 mixed marks differ from utf8proc_map", form_name(f));
    free(s);
}

/* 'a' then n marks alternating U+0301 (class 230) and U+0316 (class 220): every 0316 must move in
 * front of every 0301 before it, ~n^2/8 exchanges for a one-swap-at-a-time sort. */
static char *pathological(int n, size_t *len) {
    char *s = malloc(2 * (size_t)n + 2);
    size_t k = 0;
    s[k++] = 'a';
    for (int i = 0; i < n; i++) k += (size_t)put(i % 2 ? 0x0316 : 0x0301, s + k);
    *len = k;
    return s;
}

static void long_runs_are_fast(void) {
    size_t n;
    char *s = pathological(65536, &n);
    for (int f = NORM_NFC; f <= NORM_NFKD; f++) {
        double t0 = now();
        size_t on = 0;
        char *o = tok_normalize_form(f, s, n, &on, NULL);
        double dt = now() - t0;
        /* the result: 'a' (NFC: composed with the first 0301 into U+00E1) then the 220s then the 230s */
        int ok = o != NULL;
        size_t p = 0;
        if (ok && (f == NORM_NFC || f == NORM_NFKC)) ok = on >= 2 && !memcmp(o, "\xC3\xA1", 2), p = 2;
        else if (ok) ok = o[0] == 'a', p = 1;
        int n316 = 0, n301 = 0, order = 1;
        for (; ok && p + 1 < on; p += 2) {
            if (!memcmp(o + p, "\xCC\x96", 2)) n316++, order &= n301 == 0;
            else if (!memcmp(o + p, "\xCC\x81", 2)) n301++;
            else ok = 0;
        }
        int want301 = f == NORM_NFC || f == NORM_NFKC ? 32767 : 32768;
        CHECK(ok && order && n316 == 32768 && n301 == want301 && p == on,
              "%s of 65,536 alternating marks: %d x U+0316 then %d x U+0301 (order %d)", form_name(f), n316, n301, order);
        CHECK(dt < 0.5, "%s of 65,536 alternating marks took %.3f s (must be near-linear: < 0.5 s)", form_name(f), dt);
        printf("%s: 65,536 combining marks normalized in %.4f s\n", form_name(f), dt);
        free(o);
    }
    free(s);
}

typedef struct calls {
    int n, stop_after;
} calls;

static int cancel_cb(void *ctx) {
    calls *c = ctx;
    return ++c->n >= c->stop_after;
}

/* The default model's tokenizer (NFC, Qwen-style regex, ByteLevel): a 0.5 MB body of combining marks
 * is encoded fast, can be cancelled, and a callback that never says stop changes nothing. */
static void encode_and_cancel(void) {
    ib_tokenizer *t = NULL;
    ib_error err = {0};
    if (ib_tokenizer_load("models/default/tokenizer.json", 1 << 20, &t, &err)) {
        CHECK(0, "load models/default/tokenizer.json: %s", err.msg);
        return;
    }
    size_t n;
    char *s = pathological(262144, &n);   /* 0.5 MB: ~10 min of CPU with the quadratic sort */
    double t0 = now();
    int plain = ib_tokenizer_encode_ex(t, s, n, 0, NULL, 0);
    double dt = now() - t0;
    printf("encode of %zu bytes of combining marks: %d ids in %.3f s\n", n, plain, dt);
    CHECK(plain > 0 && dt < 2.0, "encode of 262,144 marks: %d ids in %.3f s (< 2 s)", plain, dt);
    calls go = {0, 1 << 30};
    int32_t *a = malloc((size_t)(plain > 0 ? plain : 1) * sizeof *a), *b = malloc((size_t)(plain > 0 ? plain : 1) * sizeof *b);
    int na = ib_tokenizer_encode_ex(t, s, n, 0, a, plain);
    int nb = ib_tokenizer_encode_cancel(t, s, n, 0, b, plain, cancel_cb, &go);
    CHECK(na == plain && nb == na && !memcmp(a, b, (size_t)(na > 0 ? na : 0) * sizeof *a),
          "a callback that never cancels changes the ids (%d vs %d)", nb, na);
    CHECK(go.n >= 4, "the cancel callback was asked %d times over %zu bytes (want one per 64 KiB or so)", go.n, n);
    calls stop = {0, 1};
    t0 = now();
    int nc = ib_tokenizer_encode_cancel(t, s, n, 0, b, plain, cancel_cb, &stop);
    dt = now() - t0;
    CHECK(nc == -2 && stop.n == 1, "cancelled encode returned %d after %d calls (want -2 after 1)", nc, stop.n);
    CHECK(dt < 0.5, "cancelled encode took %.3f s", dt);
    /* plain text: cancellation is checked there too */
    size_t pn = 1 << 20;
    char *p = malloc(pn);
    for (size_t i = 0; i < pn; i++) p[i] = "the quick brown fox "[i % 20];
    calls stop2 = {0, 3};
    nc = ib_tokenizer_encode_cancel(t, p, pn, 0, NULL, 0, cancel_cb, &stop2);
    CHECK(nc == -2 && stop2.n == 3, "cancelled encode of 1 MiB of prose returned %d after %d calls", nc, stop2.n);
    free(p);
    free(a);
    free(b);
    free(s);
    ib_tokenizer_free(t);
}

int main(void) {
    (void)rndf;
    (void)rndi;
    random_strings();
    long_mixed_run();
    long_runs_are_fast();
    encode_and_cancel();
    TEST_MAIN_END("test_normalize");
}
