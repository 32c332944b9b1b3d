/*
 * normalize.c — the tokenizer.json normalizers this tokenizer supports: null, NFC, NFD, NFKC, NFKD,
 * and a Sequence of those. Unicode normalization is utf8proc's (Debian libutf8proc), not ours.
 */
#include <stdlib.h>
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
    } else {
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.type: normalizer \"%.64s\" is not supported (NFC, NFD, NFKC, NFKD, Sequence)",
                       path, field, s);
    }
    if (t->n_norm == (int)(sizeof t->norm / sizeof t->norm[0]))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s: too many normalizers", path, field);
    t->norm[t->n_norm++] = kind;
    return IB_OK;
}

ib_status tok_load_normalizer(ib_tokenizer *t, const json_t *v, const char *path, ib_error *err) {
    t->n_norm = 0;
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

/* Normalize (contract in tok_internal.h). */
const char *tok_normalize(const ib_tokenizer *t, const char *s, size_t n, size_t *out_n) {
    *out_n = n;
    if (t->n_norm == 0 || n == 0) return s;
    int only_nfc = 1;
    for (int i = 0; i < t->n_norm; i++) only_nfc &= t->norm[i] == NORM_NFC;
    if (only_nfc && below_0300(s, n)) return s;
    char *cur = NULL;   /* owned result of the previous step */
    const char *in = s;
    size_t in_n = n;
    for (int i = 0; i < t->n_norm; i++) {
        utf8proc_option_t opt = UTF8PROC_STABLE;
        switch (t->norm[i]) {
        case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)in_n, &res, opt);
        free(cur);
        cur = NULL;
        if (r < 0) {          /* only allocation failure is possible: the input is valid UTF-8 */
            free(res);
            return NULL;
        }
        cur = (char *)res;
        in = cur;
        in_n = (size_t)r;
    }
    *out_n = in_n;
    return cur;
}
