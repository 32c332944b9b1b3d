/*
 * added.c — added tokens (tokenizer.json "added_tokens"): parsing, a byte trie, and the split of a
 * text at them before BPE.
 *
 * Matching follows Hugging Face: leftmost-longest, non-overlapping, scanning left to right. A match
 * of a special token is skipped when the caller asks to treat special tokens as text; a single_word
 * token is skipped when a word character (\w) touches it; lstrip / rstrip make the token swallow
 * the whitespace (Unicode White_Space) on its left / right. Tokens with normalized == false are
 * matched on the raw text, the others on the normalized text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* ---------------------------------------------------------------- trie */

static void trie_init(added_trie *tr) {
    for (int i = 0; i < 256; i++) tr->root[i] = -1;
    tr->node = NULL;
    tr->n_node = tr->cap_node = tr->n_tok = 0;
}

static int32_t trie_new_node(added_trie *tr, unsigned char b) {
    if (tr->n_node == tr->cap_node) {
        int nc = tr->cap_node ? 2 * tr->cap_node : 256;
        trie_node *n = realloc(tr->node, (size_t)nc * sizeof *n);
        if (!n) return -1;
        tr->node = n;
        tr->cap_node = nc;
    }
    tr->node[tr->n_node] = (trie_node){.child = -1, .sibling = -1, .tok = -1, .byte = b};
    return tr->n_node++;
}

/* Insert token index k with bytes s[0..n) (n >= 1). 0 ok, -1 no memory. */
static int trie_insert(added_trie *tr, const char *s, size_t n, int32_t k) {
    const unsigned char *p = (const unsigned char *)s;
    int32_t cur = tr->root[p[0]];
    if (cur < 0) {
        if ((cur = trie_new_node(tr, p[0])) < 0) return -1;
        tr->root[p[0]] = cur;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = tr->node[cur].child;
        while (c >= 0 && tr->node[c].byte != p[i]) c = tr->node[c].sibling;
        if (c < 0) {
            if ((c = trie_new_node(tr, p[i])) < 0) return -1;
            tr->node[c].sibling = tr->node[cur].child;
            tr->node[cur].child = c;
        }
        cur = c;
    }
    tr->node[cur].tok = k;
    tr->n_tok++;
    return 0;
}

/* Index of the longest token starting at s[0..n), with its length in *len; -1 when none. */
static int32_t trie_longest(const added_trie *tr, const unsigned char *s, size_t n, size_t *len) {
    int32_t cur = tr->root[s[0]], best = -1;
    size_t i = 1;
    while (cur >= 0) {
        if (tr->node[cur].tok >= 0) {
            best = tr->node[cur].tok;
            *len = i;
        }
        if (i == n) break;
        int32_t c = tr->node[cur].child;
        while (c >= 0 && tr->node[c].byte != s[i]) c = tr->node[c].sibling;
        cur = c;
        i++;
    }
    return best;
}

/* ---------------------------------------------------------------- parsing */

static ib_status get_flag(const json_t *e, const char *key, int dflt, unsigned char *out, const char *field,
                          const char *path, ib_error *err) {
    const json_t *v = json_object_get(e, key);
    if (!v || json_is_null(v)) {
        *out = (unsigned char)dflt;
        return IB_OK;
    }
    if (!json_is_boolean(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.%s: not a boolean", path, field, key);
    *out = (unsigned char)json_is_true(v);
    return IB_OK;
}

/* Parse "added_tokens" into t->added and the two tries. Ids were range-checked by the caller's first
 * pass; here: content a non-empty string without NUL, flags booleans, no id or content twice. The
 * decode text of each id is set by the caller. */
ib_status tok_load_added(ib_tokenizer *t, const json_t *added, const char *path, ib_error *err) {
    trie_init(&t->trie_raw);
    trie_init(&t->trie_norm);
    size_t n = added && json_is_array(added) ? json_array_size(added) : 0;
    if (added && !json_is_array(added) && !json_is_null(added))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field added_tokens: not an array", path);
    if (n == 0) return IB_OK;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(added, i);
        char field[64];
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        if (!json_is_object(e)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not an object", path, field);
        const json_t *c = json_object_get(e, "content");
        if (!json_is_string(c) || json_string_length(c) == 0)
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.content: missing, not a string or empty", path, field);
        const char *s = json_string_value(c);
        size_t sl = json_string_length(c);
        if (strlen(s) != sl) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.content: contains a NUL character", path, field);
        const json_t *idv = json_object_get(e, "id");
        if (!json_is_integer(idv))
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.id: token \"%.64s\": id is not an integer", path, field, s);
        int32_t id = (int32_t)json_integer_value(idv);
        added_tok a = {.len = sl, .id = id};
        ib_status st;
        if ((st = get_flag(e, "special", 0, &a.special, field, path, err)) ||
            (st = get_flag(e, "lstrip", 0, &a.lstrip, field, path, err)) ||
            (st = get_flag(e, "rstrip", 0, &a.rstrip, field, path, err)) ||
            (st = get_flag(e, "single_word", 0, &a.single_word, field, path, err)) ||
            (st = get_flag(e, "normalized", !a.special, &a.normalized, field, path, err)))
            return st;
        for (int j = 0; j < t->n_added; j++)
            if (t->added[j].id == id || strcmp(t->added[j].content, s) == 0)
                return ib_fail(err, IB_ERR_MODEL, "%s: field %s: token \"%.64s\" id %d duplicates added token \"%.64s\" id %d",
                               path, field, s, id, t->added[j].content, t->added[j].id);
        a.content = strdup(s);
        if (!a.content) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        t->added[t->n_added] = a;
        if (trie_insert(a.normalized ? &t->trie_norm : &t->trie_raw, s, sl, t->n_added))
            return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        t->n_added++;
    }
    return IB_OK;
}

void tok_added_free(ib_tokenizer *t) {
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    t->added = NULL;
    t->n_added = 0;
    free(t->trie_raw.node);
    free(t->trie_norm.node);
    t->trie_raw.node = t->trie_norm.node = NULL;
}

/* ---------------------------------------------------------------- splitting */

/* Unicode White_Space: U+0009..U+000D, U+0085 and the separators Zs, Zl, Zp (Rust's char::is_whitespace). */
static int is_ws(uint32_t c) {
    if ((c >= 9 && c <= 13) || c == 0x85) return 1;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

/* A word character (\w): letters, marks, decimal and letter numbers, connector punctuation, ZWNJ/ZWJ. */
static int is_word(uint32_t c) {
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* The character ending at s[end) (end > 0): its start in *start and code point in *c; returns 0
 * (and *start = end - 1) when the bytes before end do not end with a valid character. */
static int char_before(const unsigned char *s, size_t end, size_t *start, uint32_t *c) {
    size_t b = end - 1;
    int k = 0;
    while (b > 0 && k < 3 && (s[b] & 0xC0) == 0x80) {
        b--;
        k++;
    }
    int l = tok_utf8_valid_len(s + b, end - b);
    if (l <= 0 || b + (size_t)l != end) {
        *start = end - 1;
        return 0;
    }
    *start = b;
    *c = tok_utf8_decode(s + b, l);
    return 1;
}

void tok_added_split(tok_enc *e, const added_trie *tr, const char *text, size_t n, tok_gap_fn gap) {
    const unsigned char *s = (const unsigned char *)text;
    const ib_tokenizer *t = e->t;
    size_t done = 0, pos = 0;   /* text before `done` is consumed */
    while (pos < n && !e->out->oom) {
        if (tr->root[s[pos]] < 0) {
            pos++;
            continue;
        }
        size_t ml = 0;
        int32_t k = trie_longest(tr, s + pos, n - pos, &ml);
        if (k < 0) {
            pos++;
            continue;
        }
        const added_tok *a = &t->added[k];
        size_t ms = pos, me = pos + ml;
        if (e->split_special && a->special) {   /* the match is consumed as text */
            pos = me;
            continue;
        }
        if (a->single_word) {
            size_t b;
            uint32_t c;
            int left_word = ms > 0 && char_before(s, ms, &b, &c) && is_word(c);
            int l = me < n ? tok_utf8_valid_len(s + me, n - me) : 0;
            int right_word = l > 0 && is_word(tok_utf8_decode(s + me, l));
            if (left_word || right_word) {
                pos = me;
                continue;
            }
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t b;
            uint32_t c;
            while (start > done && char_before(s, start, &b, &c) && is_ws(c)) start = b;
        }
        if (a->rstrip) {
            int l;
            while (stop < n && (l = tok_utf8_valid_len(s + stop, n - stop)) > 0 && is_ws(tok_utf8_decode(s + stop, l))) stop += (size_t)l;
        }
        if (start > done) gap(e, text + done, start - done);
        tok_ids_push(e->out, a->id);
        done = pos = stop;
    }
    if (n > done && !e->out->oom) gap(e, text + done, n - done);
}
