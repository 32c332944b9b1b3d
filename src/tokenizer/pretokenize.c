/*
 * pretokenize.c — the tokenizer.json pre-tokenizers: Split (regex or literal pattern, the five
 * Hugging Face behaviors, invert), ByteLevel (prefix space, the GPT-2 regex), Metaspace (spaces to
 * "▁", prepend_scheme always / first / never, split), Sequence.
 *
 * Regexes are PCRE2's (Unicode properties from PCRE2, compiled with UTF + UCP and JIT-compiled
 * when the library can). Hugging Face compiles them with Oniguruma; the one difference that
 * matters for these patterns is \s: Oniguruma's Unicode \s is U+0009..U+000D, U+0085 and the
 * separators (\p{Z}), while PCRE2's also takes U+180E. Patterns are therefore rewritten so that
 * \s and \S (outside character classes) and \s (inside them) mean exactly Oniguruma's set.
 *
 * ByteLevel's byte-to-character mapping is not a step here: pieces stay bytes and BPE starts from
 * each byte's token, which is the same thing.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* The GPT-2 pattern that ByteLevel uses when use_regex is true (a fact of the format). */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define SPACE_ITEMS "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}"

/* Rewrite \s / \S as described above. Returns a malloc'ed NUL-terminated pattern (NULL when out of
 * memory). Escapes are copied pairwise so "\\s" (a literal backslash, then s) is left alone;
 * \Q...\E quoting and POSIX [:name:] classes are skipped over. */
static char *rewrite_space(const char *p, size_t n) {
    size_t o = 0;
    char *out = malloc(n * 17 + 64);   /* each 2-byte \S grows to 28 bytes at most */
    if (!out) return NULL;
    int in_class = 0;
    for (size_t i = 0; i < n;) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if (d == 'Q') {                       /* quoted run up to \E, copied verbatim */
                const char *e = NULL;
                for (size_t j = i + 2; j + 1 < n; j++)
                    if (p[j] == '\\' && p[j + 1] == 'E') { e = p + j; break; }
                size_t end = e ? (size_t)(e - p) + 2 : n;
                memcpy(out + o, p + i, end - i);
                o += end - i;
                i = end;
                continue;
            }
            const char *rep = NULL;
            if (d == 's') rep = in_class ? SPACE_ITEMS : "[" SPACE_ITEMS "]";
            else if (d == 'S' && !in_class) rep = "[^" SPACE_ITEMS "]";
            if (rep) {
                size_t rl = strlen(rep);
                memcpy(out + o, rep, rl);
                o += rl;
            } else {
                out[o++] = c;
                out[o++] = d;
            }
            i += 2;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            out[o++] = p[i++];
            if (i < n && p[i] == '^') out[o++] = p[i++];
            if (i < n && p[i] == ']') out[o++] = p[i++];   /* a leading ] is literal */
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {   /* [:name:] */
            const char *e = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (p[j] == ':' && p[j + 1] == ']') { e = p + j; break; }
            if (e) {
                size_t end = (size_t)(e - p) + 2;
                memcpy(out + o, p + i, end - i);
                o += end - i;
                i = end;
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        out[o++] = p[i++];
    }
    out[o] = '\0';
    return out;
}

/* Compile pattern p (n bytes) into step->re. */
static ib_status compile_regex(pt_step *step, const char *p, size_t n, const char *field, const char *path, ib_error *err) {
    char *rw = rewrite_space(p, n);
    if (!rw) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    int ec;
    PCRE2_SIZE eo;
    step->re = pcre2_compile((PCRE2_SPTR)rw, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    free(rw);
    if (!step->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        /* eo points into the rewritten pattern; report the message and the original pattern */
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: bad regex \"%.80s\": %s", path, field, p, (const char *)msg);
    }
    pcre2_jit_compile(step->re, PCRE2_JIT_COMPLETE);   /* without JIT the interpreter is used */
    return IB_OK;
}

/* Append a step (copied) to t->pt. */
static int add_step(ib_tokenizer *t, const pt_step *s) {
    pt_step *n = realloc(t->pt, (size_t)(t->n_pt + 1) * sizeof *n);
    if (!n) return -1;
    t->pt = n;
    t->pt[t->n_pt++] = *s;
    return 0;
}

static ib_status get_bool(const json_t *o, const char *key, int dflt, int *out, const char *field, const char *path, ib_error *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return IB_OK;
    }
    if (!json_is_boolean(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.%s: not a boolean", path, field, key);
    *out = json_is_true(v);
    return IB_OK;
}

/* Parse one pre-tokenizer object (Sequence recursively) at `field`, appending its steps. */
static ib_status load_one(ib_tokenizer *t, const json_t *v, const char *field, const char *path, int depth, ib_error *err) {
    if (json_is_null(v)) return IB_OK;
    if (!json_is_object(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not an object", path, field);
    const json_t *ty = json_object_get(v, "type");
    if (!json_is_string(ty)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.type: missing or not a string", path, field);
    const char *type = json_string_value(ty);
    ib_status st;
    char sub[200];
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(v, "pretokenizers");
        if (!json_is_array(list))
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.pretokenizers: missing or not an array", path, field);
        if (depth > 4) return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s: Sequence nested too deeply", path, field);
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", field, i);
            if ((st = load_one(t, json_array_get(list, i), sub, path, depth + 1, err))) return st;
        }
        return IB_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        int prefix = 0, use_regex = 1;
        if ((st = get_bool(v, "add_prefix_space", 0, &prefix, field, path, err)) ||
            (st = get_bool(v, "use_regex", 1, &use_regex, field, path, err)))
            return st;
        if (prefix && add_step(t, &(pt_step){.kind = PT_PREFIX_SPACE})) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        if (use_regex) {
            pt_step s = {.kind = PT_SPLIT, .behavior = SB_ISOLATED};
            if ((st = compile_regex(&s, GPT2_PATTERN, strlen(GPT2_PATTERN), field, path, err))) return st;
            if (add_step(t, &s)) {
                pcre2_code_free(s.re);
                return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
            }
        }
        return IB_OK;
    }
    if (!strcmp(type, "Split")) {
        pt_step s = {.kind = PT_SPLIT};
        const json_t *b = json_object_get(v, "behavior");
        if (!json_is_string(b)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.behavior: missing or not a string", path, field);
        const char *bs = json_string_value(b);
        if (!strcmp(bs, "Removed")) s.behavior = SB_REMOVED;
        else if (!strcmp(bs, "Isolated")) s.behavior = SB_ISOLATED;
        else if (!strcmp(bs, "MergedWithPrevious")) s.behavior = SB_MERGED_PREV;
        else if (!strcmp(bs, "MergedWithNext")) s.behavior = SB_MERGED_NEXT;
        else if (!strcmp(bs, "Contiguous")) s.behavior = SB_CONTIGUOUS;
        else
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.behavior: unknown \"%.64s\" (Removed, Isolated, MergedWithPrevious, "
                           "MergedWithNext, Contiguous)", path, field, bs);
        if ((st = get_bool(v, "invert", 0, &s.invert, field, path, err))) return st;
        const json_t *pat = json_object_get(v, "pattern");
        if (!json_is_object(pat)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.pattern: missing or not an object", path, field);
        const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        if (json_is_string(re)) {
            snprintf(sub, sizeof sub, "%s.pattern.Regex", field);
            if (json_string_length(re) == 0) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: empty regex", path, sub);
            if ((st = compile_regex(&s, json_string_value(re), json_string_length(re), sub, path, err))) return st;
        } else if (json_is_string(lit)) {
            if (json_string_length(lit) == 0) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.pattern.String: empty", path, field);
            s.lit_len = json_string_length(lit);
            s.lit = malloc(s.lit_len + 1);
            if (!s.lit) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
            memcpy(s.lit, json_string_value(lit), s.lit_len + 1);
        } else {
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.pattern: needs a string \"Regex\" or \"String\"", path, field);
        }
        if (add_step(t, &s)) {
            pcre2_code_free(s.re);
            free(s.lit);
            return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        }
        return IB_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        pt_step m = {.kind = PT_METASPACE, .prepend = MS_ALWAYS, .split = 1};
        const json_t *rep = json_object_get(v, "replacement"), *ps = json_object_get(v, "prepend_scheme");
        if (!json_is_string(rep) || json_string_length(rep) == 0)
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.replacement: missing, empty or not a string", path, field);
        if (tok_utf8_valid_len((const unsigned char *)json_string_value(rep), json_string_length(rep)) != (int)json_string_length(rep))
            return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.replacement: not one character", path, field);
        if (json_is_string(ps)) {
            const char *p = json_string_value(ps);
            if (!strcmp(p, "always")) m.prepend = MS_ALWAYS;
            else if (!strcmp(p, "first")) m.prepend = MS_FIRST;
            else if (!strcmp(p, "never")) m.prepend = MS_NEVER;
            else return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.prepend_scheme: unknown \"%.64s\" (always, first, never)", path, field, p);
        } else if (ps && !json_is_null(ps)) {
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.prepend_scheme: not a string", path, field);
        } else {   /* older files: add_prefix_space */
            int ap = 1;
            if ((st = get_bool(v, "add_prefix_space", 1, &ap, field, path, err))) return st;
            m.prepend = ap ? MS_ALWAYS : MS_NEVER;
        }
        if ((st = get_bool(v, "split", 1, &m.split, field, path, err))) return st;
        m.rep_len = json_string_length(rep);
        if (!(m.rep = malloc(m.rep_len + 1))) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        memcpy(m.rep, json_string_value(rep), m.rep_len + 1);
        if (add_step(t, &m)) {
            free(m.rep);
            return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        }
        return IB_OK;
    }
    return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.type: pre-tokenizer \"%.64s\" is not supported (ByteLevel, Split, "
                   "Metaspace, Sequence)", path, field, type);
}

ib_status tok_load_pretokenizer(ib_tokenizer *t, const json_t *v, const char *path, ib_error *err) {
    if (!v) return IB_OK;
    return load_one(t, v, "pre_tokenizer", path, 0, err);
}

void tok_pretok_free(ib_tokenizer *t) {
    for (int i = 0; i < t->n_pt; i++) {
        pcre2_code_free(t->pt[i].re);
        free(t->pt[i].lit);
        free(t->pt[i].rep);
    }
    free(t->pt);
    t->pt = NULL;
    t->n_pt = 0;
}

pcre2_match_data *tok_pretok_match_data(const ib_tokenizer *t) {
    for (int i = 0; i < t->n_pt; i++)
        if (t->pt[i].re) return pcre2_match_data_create(16, NULL);
    return NULL;
}

/* ---------------------------------------------------------------- running */

static void run_from(tok_enc *e, int step, const char *s, size_t n);
static void run_metaspace(tok_enc *e, int step, const pt_step *p, const char *s, size_t n);

/* The behavior state machine of one Split: pieces arrive in order as (start, end, is_match) and
 * leave, merged as the behavior says, through run_from(step + 1). */
typedef struct split_state {
    tok_enc *e;
    int next_step;
    const char *s;
    int behavior;
    size_t ps, pe;      /* pending piece [ps, pe) */
    int pending, pending_match;
} split_state;

static void flush(split_state *st) {
    if (st->pending && st->pe > st->ps) run_from(st->e, st->next_step, st->s + st->ps, st->pe - st->ps);
    st->pending = 0;
}

/* Hugging Face SplitDelimiterBehavior, piece by piece:
 *   Removed: matches dropped; Isolated: every piece alone;
 *   MergedWithPrevious: a match joins the piece before it unless that piece is itself a match;
 *   MergedWithNext: a match joins the piece after it unless that piece is itself a match;
 *   Contiguous: consecutive pieces of the same kind join. */
static void piece(split_state *st, size_t a, size_t b, int is_match) {
    switch (st->behavior) {
    case SB_REMOVED:
        if (!is_match) run_from(st->e, st->next_step, st->s + a, b - a);
        break;
    case SB_ISOLATED:
        run_from(st->e, st->next_step, st->s + a, b - a);
        break;
    case SB_MERGED_PREV:
        if (is_match && st->pending && !st->pending_match) {
            st->pe = b;
            st->pending_match = 1;
        } else {
            flush(st);
            st->ps = a, st->pe = b, st->pending = 1, st->pending_match = is_match;
        }
        break;
    case SB_MERGED_NEXT:
        if (!is_match && st->pending && st->pending_match) {
            st->pe = b;
            st->pending_match = 0;
            flush(st);
        } else {
            flush(st);
            if (is_match) st->ps = a, st->pe = b, st->pending = 1, st->pending_match = 1;
            else run_from(st->e, st->next_step, st->s + a, b - a);
        }
        break;
    default: /* SB_CONTIGUOUS */
        if (st->pending && st->pending_match == is_match) {
            st->pe = b;
        } else {
            flush(st);
            st->ps = a, st->pe = b, st->pending = 1, st->pending_match = is_match;
        }
        break;
    }
}

/* Apply Split step k to s[0..n). Empty matches are ignored (they would only yield empty pieces). */
static void run_split(tok_enc *e, int k, const char *s, size_t n) {
    const pt_step *p = &e->t->pt[k];
    split_state st = {.e = e, .next_step = k + 1, .s = s, .behavior = p->behavior};
    size_t prev = 0, at = 0;
    while (at < n) {
        size_t ms, me;
        if (p->re) {
            int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, e->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {           /* a resource limit of the matcher: report failure */
                e->out->oom = 1;
                return;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            ms = ov[0];
            me = ov[1];
        } else {
            const char *f = memmem(s + at, n - at, p->lit, p->lit_len);
            if (!f) break;
            ms = (size_t)(f - s);
            me = ms + p->lit_len;
        }
        if (me == ms) {             /* empty match: step over one character */
            int l = tok_utf8_valid_len((const unsigned char *)s + ms, n - ms);
            at = ms + (l > 0 ? (size_t)l : 1);
            continue;
        }
        if (ms > prev) piece(&st, prev, ms, p->invert);
        piece(&st, ms, me, !p->invert);
        prev = at = me;
    }
    if (prev < n) piece(&st, prev, n, p->invert);
    flush(&st);
}

static void run_from(tok_enc *e, int step, const char *s, size_t n) {
    if (n == 0 || e->out->oom) return;
    if (step == e->t->n_pt) {
        if (tok_cancel_check(&e->cancel, n)) {
            e->out->oom = 1;
            return;
        }
        tok_bpe_piece(e->t, (const unsigned char *)s, n, &e->bpe, e->out);
        return;
    }
    const pt_step *p = &e->t->pt[step];
    if (p->kind == PT_PREFIX_SPACE) {
        if (s[0] == ' ') {
            run_from(e, step + 1, s, n);
            return;
        }
        char *b = malloc(n + 1);
        if (!b) {
            e->out->oom = 1;
            return;
        }
        b[0] = ' ';
        memcpy(b + 1, s, n);
        run_from(e, step + 1, b, n + 1);
        free(b);
        return;
    }
    if (p->kind == PT_METASPACE) {
        run_metaspace(e, step, p, s, n);
        return;
    }
    run_split(e, step, s, n);
}

/* Metaspace, as Hugging Face runs it: every ' ' becomes the replacement; the replacement is put in
 * front when the piece does not already start with it and the scheme says so ("first": only for the
 * text at offset 0 of the input, i.e. not after an added token); with split, the piece is cut before
 * every replacement (MergedWithNext). */
static void run_metaspace(tok_enc *e, int step, const pt_step *p, const char *s, size_t n) {
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    int first = e->seg_at0 && s == e->seg0;
    int pre = (p->prepend == MS_ALWAYS || (p->prepend == MS_FIRST && first)) &&
              s[0] != ' ' && !(n >= p->rep_len && memcmp(s, p->rep, p->rep_len) == 0);   /* after the replace */
    size_t on = n + spaces * (p->rep_len - 1) + (pre ? p->rep_len : 0);
    char *b = malloc(on + 1), *w = b;
    if (!b) {
        e->out->oom = 1;
        return;
    }
    if (pre) memcpy(w, p->rep, p->rep_len), w += p->rep_len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') memcpy(w, p->rep, p->rep_len), w += p->rep_len;
        else *w++ = s[i];
    }
    if (!p->split) {
        run_from(e, step + 1, b, on);
    } else {
        size_t a = 0;
        for (size_t i = 1; i + p->rep_len <= on; i++)
            if (memcmp(b + i, p->rep, p->rep_len) == 0) {
                run_from(e, step + 1, b + a, i - a);
                a = i;
                i += p->rep_len - 1;
            }
        run_from(e, step + 1, b + a, on - a);
    }
    free(b);
}

void tok_pretokenize(tok_enc *e, const char *s, size_t n) { run_from(e, 0, s, n); }
