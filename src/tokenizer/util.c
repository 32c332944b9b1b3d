/*
 * util.c — small helpers of the tokenizer: id vectors, a hash, UTF-8 validation.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* Grow a to hold at least need ids; sets a->oom on failure. */
static int ids_reserve(tok_ids *a, size_t need) {
    if (a->oom) return -1;
    if (need <= a->cap) return 0;
    size_t nc = a->cap ? a->cap : 64;
    while (nc < need) nc *= 2;
    int32_t *v = realloc(a->v, nc * sizeof *v);
    if (!v) {
        a->oom = 1;
        return -1;
    }
    a->v = v;
    a->cap = nc;
    return 0;
}

void tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n < a->cap || ids_reserve(a, a->n + 1) == 0) a->v[a->n++] = id;
}

void tok_ids_append(tok_ids *a, const int32_t *ids, size_t n) {
    if (n == 0 || ids_reserve(a, a->n + n)) return;
    memcpy(a->v + a->n, ids, n * sizeof *ids);
    a->n += n;
}

/* A multiply-xorshift hash over 8-byte words (the mixing constants are the splitmix64 ones). */
uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h;
}

/* RFC 3629 well-formed sequences: the allowed second byte depends on the first. */
int tok_utf8_valid_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;                     /* continuation byte or overlong 2-byte lead */
    if (c < 0xE0) return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (n < 3) return 0;
        unsigned lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;               /* overlong */
        if (c == 0xED) hi = 0x9F;               /* surrogates */
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4) return 0;
        unsigned lo = 0x80, hi = 0xBF;
        if (c == 0xF0) lo = 0x90;               /* overlong */
        if (c == 0xF4) hi = 0x8F;               /* above U+10FFFF */
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        return 4;
    }
    return 0;
}

uint32_t tok_utf8_decode(const unsigned char *s, int len) {
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default: return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

int tok_utf8_put(uint32_t c, char *out) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static int byte_is_direct(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

void tok_byte_alphabet(uint32_t cp[256]) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) cp[b] = byte_is_direct(b) ? (uint32_t)b : next++;
}

/* The 68 indirect bytes are 0..32, 127..160 and 173, in that order, at code points 256..323. */
int tok_alphabet_byte(uint32_t c) {
    if (c < 256) return byte_is_direct((int)c) ? (int)c : -1;
    if (c >= 324) return -1;
    uint32_t k = c - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(127 + (k - 33));
    return 173;
}
