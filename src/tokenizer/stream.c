/*
 * stream.c — streaming decode: token ids in, always-valid UTF-8 out.
 *
 * The bytes of a token are appended to the bytes held from earlier tokens. Complete, well-formed
 * characters are written; a trailing sequence that is a proper prefix of a well-formed character is
 * held for the next token; anything that can never become a character is written as U+FFFD, one
 * per maximal ill-formed subpart (the rule of Unicode §3.9, also WHATWG TextDecoder's and Python's
 * errors="replace"), so the streamed text equals the lossy decoding of all the bytes at once.
 */
#include <string.h>

#include "tokenizer/tok_internal.h"

/* Length of the longest prefix of s[0..n) (n >= 1) that could still begin a well-formed character
 * (1..3 for a partial sequence), or 0 when s[0] cannot begin one. Complete characters are not asked. */
static int partial_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0xC2 || c > 0xF4) return 0;
    int need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    int k = 1;
    if (n > 1 && k < need) {
        if (s[1] < lo || s[1] > hi) return 1;
        k = 2;
    }
    while ((size_t)k < n && k < need && (s[k] & 0xC0) == 0x80) k++;
    return k;
}

/* Decode held + bytes into out; the new held bytes go to nh/n_nh. Returns the count or -1. */
static int convert(const unsigned char *held, int n_held, const unsigned char *p, size_t n, char *out, int cap,
                   unsigned char nh[4], int *n_nh) {
    unsigned char tmp[8];
    size_t o = 0, i = 0;
    *n_nh = 0;
    /* first finish the held sequence with up to 3 bytes of the token */
    if (n_held) {
        size_t k = 0;
        memcpy(tmp, held, (size_t)n_held);
        while (k < 3 && k < n) tmp[n_held + k] = p[k], k++;
        size_t m = (size_t)n_held + k;
        int l = tok_utf8_valid_len(tmp, m);
        if (l > 0) {                                    /* completed (l > n_held: held was a prefix) */
            if (o + (size_t)l > (size_t)cap) return -1;
            memcpy(out + o, tmp, (size_t)l);
            o += (size_t)l;
            i = (size_t)l - (size_t)n_held;
        } else {
            int pl = partial_len(tmp, m);
            if ((size_t)pl == m) {                      /* still incomplete: hold all */
                memcpy(nh, tmp, m);
                *n_nh = (int)m;
                return 0;
            }
            if (o + 3 > (size_t)cap) return -1;         /* held prefix broken: one U+FFFD */
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i = (size_t)pl > (size_t)n_held ? (size_t)pl - (size_t)n_held : 0;
        }
    }
    while (i < n) {
        int l = p[i] < 0x80 ? 1 : tok_utf8_valid_len(p + i, n - i);
        if (l > 0) {
            if (o + (size_t)l > (size_t)cap) return -1;
            memcpy(out + o, p + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
            continue;
        }
        int pl = partial_len(p + i, n - i);
        if (pl > 0 && i + (size_t)pl == n) {            /* an incomplete character at the end: hold it */
            memcpy(nh, p + i, (size_t)pl);
            *n_nh = pl;
            break;
        }
        if (o + 3 > (size_t)cap) return -1;
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += pl > 0 ? (size_t)pl : 1;
    }
    return (int)o;
}

int ib_tokenizer_stream_push(const ib_tokenizer *t, ib_text_stream *s, int32_t id, char *out, int cap) {
    if (!t || !s || cap < 0) return -1;
    const unsigned char *p = NULL;
    size_t n = 0;
    unsigned char one;
    if (id >= 0 && id < t->n_ids && id < t->vocab_limit) {
        if (!t->off) {
            one = (unsigned char)id;
            p = &one;
            n = 1;
        } else {
            p = (const unsigned char *)t->text + t->off[id];
            n = t->len[id];
        }
    }
    if (n == 0) return 0;
    unsigned char nh[4];
    int n_nh;
    int r = convert(s->held, s->n_held, p, n, out, cap, nh, &n_nh);
    if (r < 0) return -1;
    memcpy(s->held, nh, (size_t)n_nh);
    s->n_held = n_nh;
    return r;
}

int ib_tokenizer_stream_flush(ib_text_stream *s, char *out, int cap) {
    if (!s || s->n_held == 0) {
        if (s) s->n_held = 0;
        return 0;
    }
    if (cap < 3) return -1;
    memcpy(out, "\xEF\xBF\xBD", 3);
    s->n_held = 0;
    return 3;
}
