/*
 * tokenizer.c — loading tokenizer.json, the encode driver, and decoding (see tokenizer.h and the
 * pipeline in tok_internal.h).
 *
 * A vocabulary token is a string over the GPT-2 byte alphabet; its decoded bytes are the bytes of
 * its characters. A token with a character outside the alphabet decodes to its raw UTF-8 (what the
 * Hugging Face ByteLevel decoder does). Added tokens decode to their content.
 *
 * With model.byte_fallback (SentencePiece-style BPE: Gemma, Llama 2), vocabulary tokens are raw
 * UTF-8 instead, the 256 tokens <0x00>..<0xFF> stand for the bytes (the ByteFallback decoder), and
 * the decoder's Replace (Gemma's "▁" -> " ") is applied to each token's text at load, added tokens
 * included, as Hugging Face's decoders do token by token. Fuse only joins the pieces.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* ---------------------------------------------------------------- loading */

/* Decode a UTF-8 string s (len bytes) of alphabet characters into bytes at out (at least len bytes
 * of room). Returns the byte count, or -1 when some character is outside the alphabet. */
static long token_to_bytes(const char *s, size_t len, char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    long n = 0;
    while (i < len) {
        int l = tok_utf8_valid_len(p + i, len - i);
        if (l <= 0 || l > 2) return -1;         /* the alphabet is U+0021..U+0143: 1 or 2 bytes */
        int b = tok_alphabet_byte(tok_utf8_decode(p + i, l));
        if (b < 0) return -1;
        out[n++] = (char)b;
        i += (size_t)l;
    }
    return n;
}

void ib_tokenizer_free(ib_tokenizer *t) {
    if (!t) return;
    tok_added_free(t);
    tok_pretok_free(t);
    tok_normalizer_free(t);
    tok_vocab_free(&t->vocab);
    tok_merges_free(&t->merges);
    free(t->pairs);
    tok_cache_free(&t->cache);
    free(t->off);
    free(t->len);
    free(t->text);
    free(t->is_special);
    free(t->post_prefix);
    free(t->post_suffix);
    free(t->bos_text);
    free(t);
}

/* Read an integer id field, checking type and range [0, limit). */
static ib_status get_id(const json_t *v, int limit, const char *path, const char *field,
                        const char *tok, int32_t *out, ib_error *err) {
    if (!json_is_integer(v))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: token \"%.64s\": id is not an integer", path, field, tok);
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= limit)
        return ib_fail(err, IB_ERR_MODEL, "%s: field %s: token \"%.64s\": id %lld out of range [0, %d)",
                       path, field, tok, (long long)id, limit);
    *out = (int32_t)id;
    return IB_OK;
}

/* Check the model section's options this tokenizer does not implement. */
static ib_status check_model_options(const json_t *model, const char *path, ib_error *err) {
    const json_t *ty = json_object_get(model, "type");
    if (ty && !json_is_string(ty)) return ib_fail(err, IB_ERR_FORMAT, "%s: field model.type: not a string", path);
    if (ty && strcmp(json_string_value(ty), "BPE") != 0)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field model.type: \"%.64s\" is not supported (only BPE)", path,
                       json_string_value(ty));
    const json_t *d = json_object_get(model, "dropout");
    if (d && !json_is_null(d)) {
        if (!json_is_number(d)) return ib_fail(err, IB_ERR_FORMAT, "%s: field model.dropout: not a number", path);
        if (json_number_value(d) > 0)
            return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field model.dropout: %g is not supported (random merges)", path,
                           json_number_value(d));
    }
    static const char *const affixes[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && (!json_is_string(v) || json_string_length(v) != 0))
            return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field model.%s: only null or \"\" is supported", path, affixes[i]);
    }
    static const char *const flags[3] = {"ignore_merges", "byte_fallback", "fuse_unk"};
    for (int i = 0; i < 3; i++) {
        const json_t *v = json_object_get(model, flags[i]);
        if (v && !json_is_null(v) && !json_is_boolean(v))
            return ib_fail(err, IB_ERR_FORMAT, "%s: field model.%s: not a boolean", path, flags[i]);
    }
    const json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk) && !json_is_string(unk))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field model.unk_token: not a string or null", path);
    return IB_OK;
}

/* What the decoder does, token by token. */
typedef struct dec_facts {
    int bytelevel;             /* a ByteLevel step */
    int spm;                   /* a ByteFallback, Replace or Metaspace step */
    const char *from, *to;     /* Replace (or Metaspace with prepend_scheme "never"): from -> to */
    size_t from_len, to_len;
    char field[160];           /* the first SentencePiece-style step, for messages */
} dec_facts;

/* decoder: null, ByteLevel, ByteFallback, Fuse, Replace (a String pattern), Metaspace with
 * prepend_scheme "never", or a Sequence of those. Strip, and Metaspace that strips the first
 * token's space, change the start of the whole text, which token-by-token decoding (streams, the
 * CLI, the server) cannot do: refused. */
static ib_status load_decoder(const json_t *v, const char *field, const char *path, int depth, dec_facts *d, ib_error *err) {
    if (!v || json_is_null(v)) return IB_OK;
    if (!json_is_object(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not an object", path, field);
    const json_t *ty = json_object_get(v, "type");
    if (!json_is_string(ty)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.type: missing or not a string", path, field);
    const char *s = json_string_value(ty);
    if (!strcmp(s, "ByteLevel")) {
        d->bytelevel = 1;
        return IB_OK;
    }
    if (!strcmp(s, "Fuse")) return IB_OK;
    if (!d->spm && (!strcmp(s, "ByteFallback") || !strcmp(s, "Replace") || !strcmp(s, "Metaspace")))
        snprintf(d->field, sizeof d->field, "%s", field);
    if (!strcmp(s, "ByteFallback")) {
        d->spm = 1;
        return IB_OK;
    }
    if (!strcmp(s, "Replace") || !strcmp(s, "Metaspace")) {
        const json_t *from, *to = NULL;
        if (s[0] == 'R') {
            const json_t *pat = json_object_get(v, "pattern");
            if (!json_is_object(pat)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.pattern: missing or not an object", path, field);
            if (json_object_get(pat, "Regex"))
                return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.pattern.Regex: a Replace by regex is not supported (only String)",
                               path, field);
            from = json_object_get(pat, "String");
            to = json_object_get(v, "content");
            if (!json_is_string(to)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.content: missing or not a string", path, field);
        } else {
            from = json_object_get(v, "replacement");
            const json_t *ps = json_object_get(v, "prepend_scheme"), *ap = json_object_get(v, "add_prefix_space");
            int strips = json_is_string(ps) ? strcmp(json_string_value(ps), "never") != 0 : !json_is_false(ap);
            if (strips)
                return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.prepend_scheme: a Metaspace decoder that removes the first space "
                               "is not supported (only \"never\")", path, field);
        }
        if (!json_is_string(from) || json_string_length(from) == 0)
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: the pattern is missing, empty or not a string", path, field);
        if (d->from) return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s: a second Replace is not supported", path, field);
        d->spm = 1;
        d->from = json_string_value(from);
        d->from_len = json_string_length(from);
        d->to = to ? json_string_value(to) : " ";
        d->to_len = to ? json_string_length(to) : 1;
        return IB_OK;
    }
    if (!strcmp(s, "Sequence") && depth < 4) {
        const json_t *list = json_object_get(v, "decoders");
        if (!json_is_array(list)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.decoders: missing or not an array", path, field);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[160];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", field, i);
            ib_status st = load_decoder(json_array_get(list, i), sub, path, depth + 1, d, err);
            if (st) return st;
        }
        return IB_OK;
    }
    if (!strcmp(s, "Strip"))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.type: decoder \"Strip\" is not supported (it changes the start of the "
                       "whole text, which token-by-token decoding cannot do)", path, field);
    return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.type: decoder \"%.64s\" is not supported (ByteLevel, ByteFallback, Fuse, "
                   "Replace, Metaspace, Sequence)", path, field, s);
}

/* The text of a token under the decoder's Replace into out (room for len * max(1, to_len) bytes). */
static size_t dec_replace(const dec_facts *d, const char *s, size_t len, char *out) {
    if (!d->from) {
        memcpy(out, s, len);
        return len;
    }
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (len - i >= d->from_len && memcmp(s + i, d->from, d->from_len) == 0) {
            memcpy(out + o, d->to, d->to_len);
            o += d->to_len;
            i += d->from_len;
        } else {
            out[o++] = s[i++];
        }
    }
    return o;
}

/* Byte of a byte-fallback token "<0xHH>" (upper-case hex, as Hugging Face writes them), or -1. */
static int fallback_byte(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
        else if (c >= 'A' && c <= 'F') v = v * 16 + (c - 'A' + 10);
        else return -1;
    }
    return v;
}

/* Append ids to a malloc'ed array. */
static int ids_cat(int32_t **a, int *n, const int32_t *ids, int k) {
    int32_t *v = realloc(*a, (size_t)(*n + k + 1) * sizeof *v);
    if (!v) return -1;
    memcpy(v + *n, ids, (size_t)k * sizeof *ids);
    *a = v;
    *n += k;
    return 0;
}

/* post_processor: null, ByteLevel (no effect on ids), TemplateProcessing (its "single" template
 * gives the ids put before and after the text), or a Sequence of those. */
static ib_status load_post(ib_tokenizer *t, const json_t *v, const char *field, const char *path, int depth, ib_error *err) {
    if (!v || json_is_null(v)) return IB_OK;
    if (!json_is_object(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not an object", path, field);
    const json_t *ty = json_object_get(v, "type");
    if (!json_is_string(ty)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.type: missing or not a string", path, field);
    const char *s = json_string_value(ty);
    char sub[200];
    if (!strcmp(s, "ByteLevel")) return IB_OK;
    if (!strcmp(s, "Sequence") && depth < 4) {
        const json_t *list = json_object_get(v, "processors");
        if (!json_is_array(list)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.processors: missing or not an array", path, field);
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%s.processors[%zu]", field, i);
            ib_status st = load_post(t, json_array_get(list, i), sub, path, depth + 1, err);
            if (st) return st;
        }
        return IB_OK;
    }
    if (strcmp(s, "TemplateProcessing") != 0)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.type: post-processor \"%.64s\" is not supported "
                       "(ByteLevel, TemplateProcessing, Sequence)", path, field, s);
    if (t->has_template) return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s: a second TemplateProcessing", path, field);
    const json_t *single = json_object_get(v, "single"), *sp = json_object_get(v, "special_tokens");
    if (!json_is_array(single)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.single: missing or not an array", path, field);
    if (sp && !json_is_null(sp) && !json_is_object(sp))
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.special_tokens: not an object", path, field);
    int seen_a = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *it = json_array_get(single, i);
        snprintf(sub, sizeof sub, "%s.single[%zu]", field, i);
        const json_t *seq = json_object_get(it, "Sequence"), *tok = json_object_get(it, "SpecialToken");
        if (json_is_object(seq)) {
            const json_t *id = json_object_get(seq, "id");
            if (!json_is_string(id) || strcmp(json_string_value(id), "A") != 0 || seen_a)
                return ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s.Sequence.id: only one sequence \"A\" is supported", path, sub);
            seen_a = 1;
            continue;
        }
        if (!json_is_object(tok)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not a Sequence or a SpecialToken", path, sub);
        const json_t *name = json_object_get(tok, "id");
        if (!json_is_string(name)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.SpecialToken.id: not a string", path, sub);
        const json_t *def = sp ? json_object_get(sp, json_string_value(name)) : NULL;
        const json_t *ids = json_object_get(def, "ids");
        if (!json_is_array(ids))
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: special token \"%.64s\" has no ids in %s.special_tokens", path, sub,
                           json_string_value(name), field);
        for (size_t j = 0; j < json_array_size(ids); j++) {
            int32_t id;
            ib_status st = get_id(json_array_get(ids, j), t->n_ids, path, sub, json_string_value(name), &id, err);
            if (st) return st;
            if (seen_a ? ids_cat(&t->post_suffix, &t->n_post_suffix, &id, 1) : ids_cat(&t->post_prefix, &t->n_post_prefix, &id, 1))
                return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    if (!seen_a) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s.single: no Sequence \"A\"", path, field);
    t->has_template = 1;
    return IB_OK;
}

/* Load a tokenizer.json (contract in tokenizer.h). Vocabulary tokens decode through the byte
 * alphabet (raw UTF-8 when a character is outside it); added tokens decode to their content and
 * win over a vocabulary entry with the same id. Two vocabulary tokens with one id are an error. */
ib_status ib_tokenizer_load(const char *path, int vocab_limit, ib_tokenizer **out, ib_error *err) {
    ib_status st = IB_OK;
    json_t *root = NULL;
    ib_tokenizer *t = NULL;
    unsigned char *seen = NULL;   /* [n_ids] ids taken by a vocabulary token */
    if (out) *out = NULL;
    if (!path || !out || vocab_limit <= 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "tokenizer: path/out missing or vocab_limit %d <= 0", vocab_limit);

    json_error_t je;
    root = json_load_file(path, 0, &je);
    if (!root) {
        FILE *f = fopen(path, "rb");
        if (!f) return ib_fail(err, IB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        fclose(f);
        return ib_fail(err, IB_ERR_FORMAT, "%s: JSON error at line %d column %d (byte offset %d): %s",
                       path, je.line, je.column, je.position, je.text);
    }
    if (!json_is_object(root)) { st = ib_fail(err, IB_ERR_FORMAT, "%s: top level is not an object", path); goto fail; }
    json_t *model = json_object_get(root, "model");
    if (!model) { st = ib_fail(err, IB_ERR_FORMAT, "%s: field model: missing", path); goto fail; }
    if (!json_is_object(model)) { st = ib_fail(err, IB_ERR_FORMAT, "%s: field model: not an object", path); goto fail; }
    if ((st = check_model_options(model, path, err))) goto fail;
    int byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    dec_facts dec = {0};
    if ((st = load_decoder(json_object_get(root, "decoder"), "decoder", path, 0, &dec, err))) goto fail;
    if (byte_fallback && dec.bytelevel) {
        st = ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field decoder: a ByteLevel decoder with model.byte_fallback is not supported", path);
        goto fail;
    }
    if (!byte_fallback && dec.spm) {
        st = ib_fail(err, IB_ERR_UNSUPPORTED, "%s: field %s: this decoder needs model.byte_fallback true (SentencePiece-style BPE)",
                     path, dec.field);
        goto fail;
    }
    size_t grow = dec.from && dec.to_len > 1 ? dec.to_len : 1;   /* the decoder's Replace may lengthen a token */
    json_t *vocab = json_object_get(model, "vocab");
    if (!vocab) { st = ib_fail(err, IB_ERR_FORMAT, "%s: field model.vocab: missing", path); goto fail; }
    if (!json_is_object(vocab)) { st = ib_fail(err, IB_ERR_FORMAT, "%s: field model.vocab: not an object", path); goto fail; }
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added)) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: field added_tokens: not an array", path);
        goto fail;
    }
    size_t n_added = added && json_is_array(added) ? json_array_size(added) : 0;

    t = calloc(1, sizeof *t);
    if (!t) goto nomem;
    t->vocab_limit = vocab_limit;
    t->byte_fallback = byte_fallback;
    t->bos_id = t->eos_id = t->pad_id = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    uint32_t cp[256];
    tok_byte_alphabet(cp);
    for (int b = 0; b < 256; b++) t->alpha_len[b] = (unsigned char)tok_utf8_put(cp[b], t->alpha[b]);
    t->trie_raw.n_tok = t->trie_norm.n_tok = 0;

    /* first pass: ids in range, the largest id, and the arena size (decoded text is at most the
     * token's UTF-8 length) */
    size_t arena = 1;
    int32_t max_id = -1, id;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if ((st = get_id(val, vocab_limit, path, "model.vocab", key, &id, err))) goto fail;
        if (id > max_id) max_id = id;
        arena += strlen(key) * grow;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *e = json_array_get(added, i);
        json_t *c = json_object_get(e, "content"), *iv = json_object_get(e, "id");
        if (json_is_string(c)) arena += json_string_length(c) * grow;
        if (json_is_integer(iv)) {
            char field[64];
            snprintf(field, sizeof field, "added_tokens[%zu].id", i);
            if ((st = get_id(iv, vocab_limit, path, field, json_is_string(c) ? json_string_value(c) : "?", &id, err))) goto fail;
            if (id > max_id) max_id = id;
        }
    }
    t->n_ids = max_id + 1;
    size_t nid = t->n_ids > 0 ? (size_t)t->n_ids : 1;
    t->off = calloc(nid, sizeof *t->off);
    t->len = calloc(nid, sizeof *t->len);
    t->is_special = calloc(nid, 1);
    seen = calloc(nid, 1);
    t->text = malloc(arena);
    if (!t->off || !t->len || !t->is_special || !seen || !t->text) goto nomem;
    size_t used = 0;

    json_object_foreach(vocab, key, val) {
        id = (int32_t)json_integer_value(val);
        if (seen[id]) {
            st = ib_fail(err, IB_ERR_MODEL, "%s: field model.vocab: token \"%.64s\": id %d used by two tokens", path, key, id);
            goto fail;
        }
        size_t klen = strlen(key);
        seen[id] = 1;
        int r = tok_vocab_add(&t->vocab, key, klen, id);
        if (r < 0) goto nomem;
        long n;
        if (byte_fallback) {
            int fb = fallback_byte(key, klen);
            if (fb >= 0) {
                t->text[used] = (char)fb;
                n = 1;
                if (t->byte_id[fb] < 0) t->byte_id[fb] = id;
            } else {
                n = (long)dec_replace(&dec, key, klen, t->text + used);
            }
        } else {
            n = token_to_bytes(key, klen, t->text + used);
            int raw = n < 0;            /* a character outside the alphabet: keep the raw UTF-8 */
            if (raw) { memcpy(t->text + used, key, klen); n = (long)klen; }
            if (!raw && n == 1) t->byte_id[(unsigned char)t->text[used]] = id;  /* single-byte token */
        }
        t->off[id] = used;
        t->len[id] = (uint32_t)n;
        used += (size_t)n;
    }
    for (int b = 0; b < 256 && byte_fallback; b++)
        if (t->byte_id[b] < 0) {
            st = ib_fail(err, IB_ERR_MODEL, "%s: field model.vocab: model.byte_fallback needs the token <0x%02X>", path, b);
            goto fail;
        }
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0) {
            char enc[4] = {0};
            tok_utf8_put(cp[b], enc);
            st = ib_fail(err, IB_ERR_MODEL, "%s: field model.vocab: byte 0x%02X has no token (\"%s\")", path, b, enc);
            goto fail;
        }
    const json_t *im = json_object_get(model, "ignore_merges");
    t->ignore_merges = json_is_true(im);
    if ((st = tok_load_merges(t, model, path, err))) goto fail;
    if (byte_fallback && t->merges.n && tok_pairs_build(t)) goto nomem;

    if ((st = tok_load_added(t, added, path, err))) goto fail;
    for (int i = 0; i < t->n_added; i++) {
        const added_tok *a = &t->added[i];
        /* an added token may repeat a vocabulary entry (same id, same text), never take another
         * token's id: text would then encode to the added token (" p" to <|im_end|>) */
        size_t dl = a->len;
        if (byte_fallback) dl = dec_replace(&dec, a->content, a->len, t->text + used);   /* decoded like any token */
        else memcpy(t->text + used, a->content, a->len);
        if (seen[a->id] && (t->len[a->id] != dl || memcmp(t->text + t->off[a->id], t->text + used, dl))) {
            st = ib_fail(err, IB_ERR_MODEL, "%s: field added_tokens: token \"%.64s\" has id %d, which model.vocab gives to \"%.*s\"",
                         path, a->content, a->id, (int)(t->len[a->id] < 64 ? t->len[a->id] : 64), t->text + t->off[a->id]);
            goto fail;
        }
        t->off[a->id] = used;
        t->len[a->id] = (uint32_t)dl;
        t->is_special[a->id] = a->special;
        used += dl;
    }
    if ((st = tok_load_normalizer(t, json_object_get(root, "normalizer"), path, err))) goto fail;
    if ((st = tok_load_pretokenizer(t, json_object_get(root, "pre_tokenizer"), path, err))) goto fail;
    if ((st = load_post(t, json_object_get(root, "post_processor"), "post_processor", path, 0, err))) goto fail;
    if ((st = tok_load_config(t, path, err))) goto fail;
    if (tok_cache_init(&t->cache)) goto nomem;
    json_decref(root);
    free(seen);
    *out = t;
    return IB_OK;

nomem:
    st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
fail:
    ib_tokenizer_free(t);
    free(seen);
    json_decref(root);
    return st;
}

/* Byte tokenizer: id b (0..255) is byte b; no added tokens. vocab_limit must be >= 256. */
ib_status ib_tokenizer_bytes(int vocab_limit, ib_tokenizer **out, ib_error *err) {
    if (out) *out = NULL;
    if (!out || vocab_limit < 256)
        return ib_fail(err, IB_ERR_INVALID_ARG, "tokenizer: byte tokenizer needs vocab_size >= 256 (got %d)", vocab_limit);
    ib_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ib_fail(err, IB_ERR_NOMEM, "tokenizer: out of memory");
    t->vocab_limit = vocab_limit;
    t->n_ids = 256;
    t->bos_id = t->eos_id = t->pad_id = -1;
    for (int i = 0; i < 256; i++) t->trie_raw.root[i] = t->trie_norm.root[i] = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = b;
    *out = t;
    return IB_OK;
}

/* ---------------------------------------------------------------- encoding */

/* Text between normalized added tokens: pre-tokenize and BPE (a piece is at the start of the input
 * when it starts at seg0, the normalized run, and that run does). */
static void norm_gap(tok_enc *e, const char *s, size_t n) { tok_pretokenize(e, s, n); }

/* A run of valid UTF-8: normalize, then the normalized added tokens, then pre-tokenize. */
static void valid_run(tok_enc *e, const char *s, size_t n) {
    size_t nn;
    if (tok_cancel_check(&e->cancel, n)) {
        e->out->oom = 1;
        return;
    }
    const char *ns = tok_normalize(e->t, s, n, &nn, &e->cancel);
    if (!ns) {
        e->out->oom = 1;
        return;
    }
    e->seg0 = ns;
    e->seg_at0 = s == e->text0;
    if (e->t->trie_norm.n_tok) tok_added_split(e, &e->t->trie_norm, ns, nn, norm_gap);
    else tok_pretokenize(e, ns, nn);
    if (ns != s) free((char *)ns);
}

/* Text between raw added tokens: runs of invalid UTF-8 bytes become their own pieces (BPE over
 * their bytes); the valid runs between them go on through valid_run. */
static void raw_gap(tok_enc *e, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int l = tok_utf8_valid_len(p + i, n - i);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        if (i > run) valid_run(e, s + run, i - run);
        size_t j = i + 1;
        while (j < n && p[j] >= 0x80 && tok_utf8_valid_len(p + j, n - j) == 0) j++;
        if (tok_cancel_check(&e->cancel, j - i)) {
            e->out->oom = 1;
            return;
        }
        tok_bpe_piece(e->t, p + i, j - i, &e->bpe, e->out);
        i = run = j;
    }
    if (n > run) valid_run(e, s + run, n - run);
}

int ib_tokenizer_encode_cancel(const ib_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids, int cap,
                               int (*cancelled)(void *ctx), void *ctx) {
    if (!t || (!text && len)) return -1;
    tok_ids out = {0};
    tok_enc e = {.t = t, .out = &out, .split_special = (flags & IB_TOKENIZE_SPLIT_SPECIAL) != 0, .text0 = text,
                 .cancel = {.fn = cancelled, .ctx = ctx}};
    e.md = tok_pretok_match_data(t);
    int need_md = 0;
    for (int i = 0; i < t->n_pt; i++) need_md |= t->pt[i].re != NULL;
    if (need_md && !e.md) return -1;
    int add = (flags & IB_TOKENIZE_ADD_SPECIAL) != 0;
    if (add && t->has_template) tok_ids_append(&out, t->post_prefix, (size_t)t->n_post_prefix);
    else if (add && t->add_bos && t->bos_id >= 0) tok_ids_push(&out, t->bos_id);
    if (len) {
        if (t->trie_raw.n_tok) tok_added_split(&e, &t->trie_raw, text, len, raw_gap);
        else raw_gap(&e, text, len);
    }
    if (add && t->has_template) tok_ids_append(&out, t->post_suffix, (size_t)t->n_post_suffix);
    else if (add && t->add_eos && t->eos_id >= 0) tok_ids_push(&out, t->eos_id);
    pcre2_match_data_free(e.md);
    tok_bpe_scratch_free(&e.bpe);
    int n = e.cancel.hit ? -2 : -1;
    if (!out.oom && out.n <= INT_MAX) {
        n = (int)out.n;
        if (ids && cap > 0 && n > 0) memcpy(ids, out.v, (size_t)(n < cap ? n : cap) * sizeof *ids);
    }
    free(out.v);
    return n;
}

int ib_tokenizer_encode_ex(const ib_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids, int cap) {
    return ib_tokenizer_encode_cancel(t, text, len, flags, ids, cap, NULL, NULL);
}

int ib_tokenizer_encode(const ib_tokenizer *t, const char *text, size_t len, int32_t *ids, int cap) {
    return ib_tokenizer_encode_ex(t, text, len, 0, ids, cap);
}

/* ---------------------------------------------------------------- decoding and facts */

/* Bytes of id into out; -1 when cap is too small, 0 for ids without text. */
int ib_tokenizer_decode(const ib_tokenizer *t, int32_t id, char *out, int cap) {
    if (!t || id < 0 || id >= t->vocab_limit || id >= t->n_ids) return 0;
    if (!t->off) {                               /* bytes tokenizer */
        if (cap < 1) return -1;
        out[0] = (char)id;
        return 1;
    }
    uint32_t n = t->len[id];
    if (n > (uint32_t)(cap < 0 ? 0 : cap)) return -1;
    memcpy(out, t->text + t->off[id], n);
    return (int)n;
}

int32_t ib_tokenizer_special(const ib_tokenizer *t, const char *content) {
    if (!t || !content) return -1;
    for (int a = 0; a < t->n_added; a++)
        if (strcmp(t->added[a].content, content) == 0) return t->added[a].id;
    return -1;
}

int ib_tokenizer_is_special(const ib_tokenizer *t, int32_t id) {
    return t && t->is_special && id >= 0 && id < t->n_ids && t->is_special[id];
}

int32_t ib_tokenizer_n_ids(const ib_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t ib_tokenizer_eos(const ib_tokenizer *t) { return t ? t->eos_id : -1; }

void ib_tokenizer_set_cache(ib_tokenizer *t, int on) {
    if (t && t->cache.slot) t->cache.enabled = on != 0;
}

void ib_tokenizer_cache_stats(const ib_tokenizer *t, unsigned long *hits, unsigned long *misses) {
    *hits = t ? t->cache.hits : 0;
    *misses = t ? t->cache.misses : 0;
}
