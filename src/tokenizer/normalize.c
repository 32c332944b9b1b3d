/*
 * normalize.c — the tokenizer.json normalizers this tokenizer supports: null, NFC, NFD, NFKC, NFKD,
 * Replace with a String pattern, Prepend (the SentencePiece-style ones: Gemma's Replace(" ", "▁")),
 * and a Sequence of those. Unicode data (decompositions, combining classes, compositions) is
 * utf8proc's (Debian libutf8proc); the canonical ordering is done here (see tok_normalize_form).
 */
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* Parse one normalizer object (or a Sequence, recursively) at field `field`, appending steps. */
static ib_status load_one(ib_tokenizer *t, const json_t *v, const char *field, const char *path, int depth, ib_error *err) {
    if (json_is_null(v)) return IB_OK;
    if (!json_is_object(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not an object", path, field);
    const json_t *ty = json_object_get(v, "type");
    if (!json_is_string(ty)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.type: missing or not a string", path, field);
    const char *s = json_string_value(ty);
    int kind = 0;
    if (!strcmp(s, "NFC")) kind = NORM_NFC;
    else if (!strcmp(s, "NFD")) kind = NORM_NFD;
    else if (!strcmp(s, "NFKC")) kind = NORM_NFKC;
    else if (!strcmp(s, "NFKD")) kind = NORM_NFKD;
    else if (!strcmp(s, "Sequence")) {
        const json_t *list = json_object_get(v, "normalizers");
        if (!json_is_array(list))
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.normalizers: missing or not an array", path, field);
        if (depth > 4) return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s: Sequence nested too deeply", path, field);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[160];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", field, i);
            ib_status st = load_one(t, json_array_get(list, i), sub, path, depth + 1, err);
            if (st) return st;
        }
        return IB_OK;
    } else if (!strcmp(s, "Replace") || !strcmp(s, "Prepend")) {
        kind = s[0] == 'R' ? NORM_REPLACE : NORM_PREPEND;
    } else {
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.type: normalizer \"%.64s\" is not supported (NFC, NFD, NFKC, NFKD, "
                       "Replace, Prepend, Sequence)", path, field, s);
    }
    if (t->n_norm == (int)(sizeof t->norm / sizeof t->norm[0]))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s: too many normalizers", path, field);
    norm_step st = {.kind = kind};
    if (kind == NORM_REPLACE) {
        const json_t *pat = json_object_get(v, "pattern"), *con = json_object_get(v, "content");
        const json_t *lit = json_object_get(pat, "String");
        if (!json_is_object(pat)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.pattern: missing or not an object", path, field);
        if (json_object_get(pat, "Regex"))
            return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.pattern.Regex: a Replace by regex is not supported (only String)", path, field);
        if (!json_is_string(lit) || json_string_length(lit) == 0)
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.pattern.String: missing, empty or not a string", path, field);
        if (!json_is_string(con)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.content: missing or not a string", path, field);
        st.pat_len = json_string_length(lit);
        st.rep_len = json_string_length(con);
        st.pat = malloc(st.pat_len + 1);
        st.rep = malloc(st.rep_len + 1);
        if (!st.pat || !st.rep) {
            free(st.pat);
            free(st.rep);
            return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        }
        memcpy(st.pat, json_string_value(lit), st.pat_len + 1);
        memcpy(st.rep, json_string_value(con), st.rep_len + 1);
    } else if (kind == NORM_PREPEND) {
        const json_t *pre = json_object_get(v, "prepend");
        if (!json_is_string(pre)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.prepend: missing or not a string", path, field);
        st.rep_len = json_string_length(pre);
        if (!(st.rep = malloc(st.rep_len + 1))) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        memcpy(st.rep, json_string_value(pre), st.rep_len + 1);
    }
    t->norm[t->n_norm++] = st;
    return IB_OK;
}

void tok_normalizer_free(ib_tokenizer *t) {
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].pat);
        free(t->norm[i].rep);
    }
    t->n_norm = 0;
}

/* Replace every occurrence of pat in s[0..n) (left to right, not overlapping) by rep, or put rep
 * before s (Prepend; nothing for an empty s). Returns a malloc'ed NUL-terminated buffer, or s itself
 * when nothing changes; NULL when out of memory. */
static char *replace_step(const norm_step *st, const char *s, size_t n, size_t *out_n) {
    if (st->kind == NORM_PREPEND) {
        if (n == 0) return (char *)s;
        char *o = malloc(st->rep_len + n + 1);
        if (!o) return NULL;
        memcpy(o, st->rep, st->rep_len);
        memcpy(o + st->rep_len, s, n);
        o[st->rep_len + n] = '\0';
        *out_n = st->rep_len + n;
        return o;
    }
    size_t k = 0;
    for (const char *p = s; (p = memmem(p, (size_t)(s + n - p), st->pat, st->pat_len)); p += st->pat_len) k++;
    if (k == 0) return (char *)s;
    size_t on = n - k * st->pat_len + k * st->rep_len;
    char *o = malloc(on + 1), *w = o;
    if (!o) return NULL;
    const char *p = s, *e = s + n;
    for (const char *f; (f = memmem(p, (size_t)(e - p), st->pat, st->pat_len)); p = f + st->pat_len) {
        memcpy(w, p, (size_t)(f - p));
        w += f - p;
        memcpy(w, st->rep, st->rep_len);
        w += st->rep_len;
    }
    memcpy(w, p, (size_t)(e - p));
    o[on] = '\0';
    *out_n = on;
    return o;
}

ib_status tok_load_normalizer(ib_tokenizer *t, const json_t *v, const char *path, ib_error *err) {
    tok_normalizer_free(t);
    if (!v) return IB_OK;
    return load_one(t, v, "normalizer", path, 0, err);
}

/* Every code point below U+0300 is unchanged by NFC and never composes with what precedes it (the
 * first characters with NFC quick-check "No" or "Maybe" are the combining marks from U+0300), so
 * such text needs no call into utf8proc when every step is NFC. (NFD decomposes é, NFKC maps U+00B2.) */
static int below_0300(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < 0x80) continue;
        if (p[i] >= 0xCC) return 0;   /* lead bytes 0xCC.. start U+0300 and above */
    }
    return 1;
}

/* ---------------------------------------------------------------- normalization, near-linear
 *
 * utf8proc_map would do each step in one call, but its canonical reordering is an exchange sort:
 * a run of k combining marks costs O(k^2) (64k marks: about 10 s), so one request could hold a core
 * for minutes. The same result is computed here in three passes over UTF-32 that are each linear or
 * n log n: utf8proc_decompose_char per code point (full canonical or compatibility decomposition,
 * Hangul included), a stable merge sort of every run of non-starters by combining class (the
 * Unicode canonical ordering, which is what the exchange sort computes), then utf8proc_reencode,
 * whose composition pass is one walk that looks back only at the last starter. */

/* Stable sort of v[0..n) by combining class (bits 21.. of each entry; the low 21 bits hold the code
 * point). tmp has room for n entries. Insertion sort for short runs (the common case: one or two
 * marks), bottom-up merge sort otherwise: O(n log n) whatever the order. */
static void sort_marks(uint32_t *v, size_t n, uint32_t *tmp) {
    if (n < 2) return;
    if (n <= 16) {
        for (size_t i = 1; i < n; i++) {
            uint32_t x = v[i];
            size_t j = i;
            while (j > 0 && (v[j - 1] >> 21) > (x >> 21)) v[j] = v[j - 1], j--;
            v[j] = x;
        }
        return;
    }
    uint32_t *a = v, *b = tmp;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) b[k++] = (a[j] >> 21) < (a[i] >> 21) ? a[j++] : a[i++];
            while (i < mid) b[k++] = a[i++];
            while (j < hi) b[k++] = a[j++];
        }
        uint32_t *t = a;
        a = b;
        b = t;
    }
    if (a != v) memcpy(v, a, n * sizeof *v);
}

/* Whether the encode that owns c has been cancelled; calls c's callback at most once per
 * TOK_CANCEL_EVERY units of work (bytes or code points) so the check costs nothing measurable. */
int tok_cancel_check(tok_cancel *c, size_t work) {
    if (!c) return 0;
    if (c->hit) return 1;
    if (!c->fn) return 0;
    c->work += work;
    if (c->work < TOK_CANCEL_EVERY) return 0;
    c->work = 0;
    if (c->fn(c->ctx)) c->hit = 1;
    return c->hit;
}

/* One normalization step (contract in tok_internal.h). */
char *tok_normalize_form(int kind, const char *s, size_t n, size_t *out_n, tok_cancel *cancel) {
    utf8proc_option_t opt = UTF8PROC_STABLE;
    switch (kind) {
    case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    /* decompositions are at most 18 code points (U+FDFA under NFKD); grow as needed */
    size_t cap = n + 16, len = 0;
    utf8proc_int32_t *buf = malloc(cap * sizeof *buf);
    uint32_t *key = NULL, *tmp = NULL;
    if (!buf) return NULL;
    size_t i = 0, since = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0) goto fail; /* not valid UTF-8: the caller's contract was broken */
        i += (size_t)l;
        if (len + 32 > cap) {
            size_t nc = cap * 2;
            utf8proc_int32_t *nb = realloc(buf, nc * sizeof *nb);
            if (!nb) goto fail;
            buf = nb;
            cap = nc;
        }
        int bc = 0;
        utf8proc_ssize_t w = utf8proc_decompose_char(cp, buf + len, (utf8proc_ssize_t)(cap - len), opt, &bc);
        if (w < 0 || (size_t)w > cap - len) goto fail;
        len += (size_t)w;
        if (++since == 4096) {
            since = 0;
            if (tok_cancel_check(cancel, 4096)) goto fail;
        }
    }
    /* canonical ordering: each maximal run of code points of non-zero combining class, stably */
    for (size_t a = 0; a < len;) {
        if (utf8proc_get_property(buf[a])->combining_class == 0) {
            a++;
            continue;
        }
        size_t b = a;
        while (b < len && utf8proc_get_property(buf[b])->combining_class != 0) b++;
        if (b - a > 1) {
            if (!key && (!(key = malloc(len * sizeof *key)) || !(tmp = malloc(len * sizeof *tmp)))) goto fail;
            for (size_t k = a; k < b; k++)
                key[k - a] = (uint32_t)utf8proc_get_property(buf[k])->combining_class << 21 | (uint32_t)buf[k];
            sort_marks(key, b - a, tmp);
            for (size_t k = a; k < b; k++) buf[k] = (utf8proc_int32_t)(key[k - a] & 0x1FFFFF);
        }
        a = b;
    }
    free(key);
    free(tmp);
    key = tmp = NULL;
    if (tok_cancel_check(cancel, 0)) goto fail;
    /* composition (NFC/NFKC) and UTF-8 in place: 4 bytes per code point is always enough room */
    utf8proc_ssize_t r = utf8proc_reencode(buf, (utf8proc_ssize_t)len, opt);
    if (r < 0) goto fail;
    *out_n = (size_t)r;
    return (char *)buf;
fail:
    free(buf);
    free(key);
    free(tmp);
    return NULL;
}

/* Normalize (contract in tok_internal.h): each step of the tokenizer's normalizer in turn. */
const char *tok_normalize(const ib_tokenizer *t, const char *s, size_t n, size_t *out_n, tok_cancel *cancel) {
    *out_n = n;
    if (t->n_norm == 0 || n == 0) return s;
    int only_nfc = 1;
    for (int i = 0; i < t->n_norm; i++) only_nfc &= t->norm[i].kind == NORM_NFC;
    if (only_nfc && below_0300(s, n)) return s;
    char *cur = NULL;   /* owned result of the previous step */
    const char *in = s;
    size_t in_n = n;
    for (int i = 0; i < t->n_norm; i++) {
        size_t r_n = 0;
        int k = t->norm[i].kind;
        char *res;
        if (k == NORM_REPLACE || k == NORM_PREPEND) {
            if (tok_cancel_check(cancel, in_n)) res = NULL;
            else res = replace_step(&t->norm[i], in, in_n, &r_n);
            if (res == in) continue;   /* unchanged */
        } else {
            res = tok_normalize_form(k, in, in_n, &r_n, cancel);
        }
        free(cur);
        if (!res) return NULL;   /* out of memory or cancelled */
        cur = res;
        in = cur;
        in_n = r_n;
    }
    *out_n = in_n;
    return cur ? cur : s;   /* no step changed anything: s itself */
}
