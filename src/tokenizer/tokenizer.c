/*
 * tokenizer.c — the byte-level fallback tokenizer (see tokenizer.h).
 *
 * GPT-2 byte-to-unicode alphabet (a fact of the format): bytes 33..126, 161..172 and 174..255 stand
 * for the code point of the same value; the other 68 bytes (0..32, 127..160, 173) stand for the code
 * points 256, 257, … in increasing byte order. A vocabulary token is a string over this alphabet.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

typedef struct added_tok {
    char *content;   /* owned, NUL-terminated (no NUL inside: jansson strings without JSON_ALLOW_NUL) */
    size_t len;
    int32_t id;
} added_tok;

struct ib_tokenizer {
    int vocab_limit;
    int32_t byte_id[256];     /* id of the single-byte token of each byte */
    /* decoded bytes of each id: text[off[id] .. off[id] + len[id]); len 0 = no text */
    size_t *off;              /* [vocab_limit] (NULL for the bytes tokenizer) */
    uint32_t *len;            /* [vocab_limit] */
    char *text;               /* arena of decoded bytes */
    added_tok *added;         /* [n_added], sorted by length, longest first (for longest match) */
    int n_added;
};

/* ---------------------------------------------------------------- the byte alphabet */

static int byte_is_direct(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* Fill cp[256] with the code point of each byte (the GPT-2 alphabet). */
static void byte_alphabet(uint32_t cp[256]) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) cp[b] = byte_is_direct(b) ? (uint32_t)b : next++;
}

/* Inverse of the alphabet: byte of code point c, or -1 when c is not in it. The 68 indirect bytes
 * are 0..32, 127..160 and 173, in that order, at code points 256..323. */
static int alphabet_byte(uint32_t c) {
    if (c < 256) return byte_is_direct((int)c) ? (int)c : -1;
    if (c >= 324) return -1;
    uint32_t k = c - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(127 + (k - 33));
    return 173;
}

/* UTF-8 encoding of code point c (< 0x800 here) into out; returns the byte count. */
static int utf8_put(uint32_t c, char *out) {
    if (c < 0x80) { out[0] = (char)c; return 1; }
    out[0] = (char)(0xC0 | (c >> 6));
    out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

/* Decode a valid UTF-8 string s (len bytes) of alphabet characters into bytes at out (at least
 * len bytes of room). Returns the byte count, or -1 when some character is outside the alphabet
 * (the caller then keeps the raw UTF-8). */
static long token_to_bytes(const char *s, size_t len, char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    long n = 0;
    while (i < len) {
        uint32_t c;
        if (p[i] < 0x80) { c = p[i]; i += 1; }
        else if ((p[i] & 0xE0) == 0xC0 && i + 1 < len) { c = ((uint32_t)(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F); i += 2; }
        else return -1;         /* 3- and 4-byte sequences are never in the alphabet */
        int b = alphabet_byte(c);
        if (b < 0) return -1;
        out[n++] = (char)b;
    }
    return n;
}

/* ---------------------------------------------------------------- loading */

static int cmp_added_len_desc(const void *a, const void *b) {
    const added_tok *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void ib_tokenizer_free(ib_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->off);
    free(t->len);
    free(t->text);
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

/* Load a tokenizer.json (contract in tokenizer.h). Vocabulary tokens decode through the byte
 * alphabet (raw UTF-8 when a character is outside it); added tokens decode to their content and
 * win over a vocabulary entry with the same id. Two vocabulary tokens with one id are an error. */
ib_status ib_tokenizer_load(const char *path, int vocab_limit, ib_tokenizer **out, ib_error *err) {
    ib_status st = IB_OK;
    json_t *root = NULL;
    ib_tokenizer *t = NULL;
    unsigned char *seen = NULL;   /* [vocab_limit] ids taken by a vocabulary token */
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
    json_t *vocab = json_object_get(model, "vocab");
    if (!vocab) { st = ib_fail(err, IB_ERR_FORMAT, "%s: field model.vocab: missing", path); goto fail; }
    if (!json_is_object(vocab)) { st = ib_fail(err, IB_ERR_FORMAT, "%s: field model.vocab: not an object", path); goto fail; }
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added)) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: field added_tokens: not an array", path);
        goto fail;
    }

    t = calloc(1, sizeof *t);
    if (!t) goto nomem;
    t->vocab_limit = vocab_limit;
    t->off = calloc((size_t)vocab_limit, sizeof *t->off);
    t->len = calloc((size_t)vocab_limit, sizeof *t->len);
    seen = calloc((size_t)vocab_limit, 1);
    if (!t->off || !t->len || !seen) goto nomem;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;

    /* arena size: every token's decoded text is at most its UTF-8 length */
    size_t arena = 1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) arena += strlen(key);
    size_t n_added = added && json_is_array(added) ? json_array_size(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_t *c = json_object_get(json_array_get(added, i), "content");
        if (json_is_string(c)) arena += json_string_length(c);
    }
    t->text = malloc(arena);
    if (!t->text) goto nomem;
    size_t used = 0;

    uint32_t cp[256];
    byte_alphabet(cp);
    json_object_foreach(vocab, key, val) {
        int32_t id;
        if ((st = get_id(val, vocab_limit, path, "model.vocab", key, &id, err))) goto fail;
        if (seen[id]) {
            st = ib_fail(err, IB_ERR_MODEL, "%s: field model.vocab: token \"%.64s\": id %d used by two tokens", path, key, id);
            goto fail;
        }
        size_t klen = strlen(key);
        seen[id] = 1;
        long n = token_to_bytes(key, klen, t->text + used);
        int raw = n < 0;            /* a character outside the alphabet: keep the raw UTF-8 */
        if (raw) { memcpy(t->text + used, key, klen); n = (long)klen; }
        t->off[id] = used;
        t->len[id] = (uint32_t)n;
        used += (size_t)n;
        if (!raw && n == 1) t->byte_id[(unsigned char)t->text[t->off[id]]] = id;  /* single-byte token */
    }
    if (n_added) {
        t->added = calloc(n_added, sizeof *t->added);
        if (!t->added) goto nomem;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *e = json_array_get(added, i);
        char field[64];
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        if (!json_is_object(e)) { st = ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not an object", path, field); goto fail; }
        json_t *c = json_object_get(e, "content");
        if (!json_is_string(c) || json_string_length(c) == 0) {
            st = ib_fail(err, IB_ERR_FORMAT, "%s: field %s.content: missing, not a string or empty", path, field);
            goto fail;
        }
        const char *s = json_string_value(c);
        size_t sl = json_string_length(c);
        if (strlen(s) != sl) {
            st = ib_fail(err, IB_ERR_FORMAT, "%s: field %s.content: contains a NUL character", path, field);
            goto fail;
        }
        int32_t id;
        strncat(field, ".id", sizeof field - strlen(field) - 1);
        if ((st = get_id(json_object_get(e, "id"), vocab_limit, path, field, s, &id, err))) goto fail;
        for (int j = 0; j < t->n_added; j++)
            if (t->added[j].id == id || strcmp(t->added[j].content, s) == 0) {
                st = ib_fail(err, IB_ERR_MODEL, "%s: field %s: token \"%.64s\" id %d duplicates added token \"%.64s\" id %d",
                             path, field, s, id, t->added[j].content, t->added[j].id);
                goto fail;
            }
        added_tok *a = &t->added[t->n_added];
        a->content = strdup(s);
        if (!a->content) goto nomem;
        a->len = sl;
        a->id = id;
        t->n_added++;
        memcpy(t->text + used, s, sl);
        t->off[id] = used;
        t->len[id] = (uint32_t)sl;
        used += sl;
    }
    if (t->n_added > 1) qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added_len_desc);
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0) {
            char enc[3] = {0};
            utf8_put(cp[b], enc);
            st = ib_fail(err, IB_ERR_MODEL, "%s: field model.vocab: byte 0x%02X has no token (\"%s\")", path, b, enc);
            goto fail;
        }
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
    for (int b = 0; b < 256; b++) t->byte_id[b] = b;
    *out = t;
    return IB_OK;
}

/* ---------------------------------------------------------------- use */

/* Encode: at each position the longest added token that matches literally, else the byte's token.
 * Returns the full count; writes at most cap ids. */
int ib_tokenizer_encode(const ib_tokenizer *t, const char *text, size_t len, int32_t *ids, int cap) {
    int n = 0;
    size_t i = 0;
    while (i < len) {
        int32_t id = -1;
        size_t step = 1;
        for (int a = 0; a < t->n_added; a++) {   /* longest first */
            const added_tok *x = &t->added[a];
            if (x->len <= len - i && memcmp(text + i, x->content, x->len) == 0) {
                id = x->id;
                step = x->len;
                break;
            }
        }
        if (id < 0) id = t->byte_id[(unsigned char)text[i]];
        if (n < cap && ids) ids[n] = id;
        n++;
        i += step;
    }
    return n;
}

/* Bytes of id into out; -1 when cap is too small, 0 for ids without text. */
int ib_tokenizer_decode(const ib_tokenizer *t, int32_t id, char *out, int cap) {
    if (id < 0 || id >= t->vocab_limit) return 0;
    if (!t->off) {                               /* bytes tokenizer */
        if (id >= 256) return 0;
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

/* ---------------------------------------------------------------- writing */

/* Write root to path through path.tmp + rename, so a failure leaves no file behind. */
static ib_status dump_json(json_t *root, const char *path, ib_error *err) {
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    ib_status st = IB_OK;
    if (json_dump_file(root, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno ? errno : EIO));
        unlink(tmp);
    } else if (rename(tmp, path) != 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return st;
}

/* json_object_set_new that remembers an allocation failure in *bad. */
static void put(json_t *obj, const char *key, json_t *v, int *bad) {
    if (!v || json_object_set_new(obj, key, v) != 0) *bad = 1;
}

/* Write tokenizer.json (byte tokens at ids 0..255 in byte order, specials at 256.. as added tokens,
 * no merges; Hugging Face layout) and tokenizer_config.json (eos_token "<|im_end|>" when among the
 * specials, else the last special; pad_token "<|endoftext|>" when among them; bos_token null).
 * Specials must be non-empty and distinct. On failure neither file is left behind. */
ib_status ib_tokenizer_write_bytelevel(const char *dir, const char *const *specials, int n_specials, ib_error *err) {
    if (!dir || n_specials < 0 || (n_specials > 0 && !specials))
        return ib_fail(err, IB_ERR_INVALID_ARG, "tokenizer: write_bytelevel: bad arguments");
    for (int i = 0; i < n_specials; i++) {
        if (!specials[i] || !specials[i][0])
            return ib_fail(err, IB_ERR_INVALID_ARG, "tokenizer: write_bytelevel: special %d is empty", i);
        for (int j = 0; j < i; j++)
            if (strcmp(specials[i], specials[j]) == 0)
                return ib_fail(err, IB_ERR_INVALID_ARG, "tokenizer: write_bytelevel: special \"%s\" given twice", specials[i]);
    }
    ib_status st = IB_OK;
    int bad = 0;
    size_t dl = strlen(dir);
    char *p_tok = malloc(dl + 32), *p_cfg = malloc(dl + 32);
    json_t *root = json_object(), *cfg = json_object();
    if (!p_tok || !p_cfg || !root || !cfg) { bad = 1; goto done; }
    snprintf(p_tok, dl + 32, "%s/tokenizer.json", dir);
    snprintf(p_cfg, dl + 32, "%s/tokenizer_config.json", dir);

    put(root, "version", json_string("1.0"), &bad);
    put(root, "truncation", json_null(), &bad);
    put(root, "padding", json_null(), &bad);
    json_t *added = json_array();
    put(root, "added_tokens", added, &bad);
    for (int i = 0; added && i < n_specials; i++) {
        json_t *e = json_object();
        if (!e || json_array_append_new(added, e) != 0) { bad = 1; break; }
        put(e, "id", json_integer(256 + i), &bad);
        put(e, "content", json_string(specials[i]), &bad);
        put(e, "single_word", json_false(), &bad);
        put(e, "lstrip", json_false(), &bad);
        put(e, "rstrip", json_false(), &bad);
        put(e, "normalized", json_false(), &bad);
        put(e, "special", json_true(), &bad);
    }
    put(root, "normalizer", json_null(), &bad);
    json_t *pre = json_object();
    put(root, "pre_tokenizer", pre, &bad);
    if (pre) {
        put(pre, "type", json_string("ByteLevel"), &bad);
        put(pre, "add_prefix_space", json_false(), &bad);
        put(pre, "trim_offsets", json_true(), &bad);
        put(pre, "use_regex", json_true(), &bad);
    }
    put(root, "post_processor", json_null(), &bad);
    json_t *dec = json_object();
    put(root, "decoder", dec, &bad);
    if (dec) {
        put(dec, "type", json_string("ByteLevel"), &bad);
        put(dec, "add_prefix_space", json_true(), &bad);
        put(dec, "trim_offsets", json_true(), &bad);
        put(dec, "use_regex", json_true(), &bad);
    }
    json_t *model = json_object();
    put(root, "model", model, &bad);
    if (model) {
        put(model, "type", json_string("BPE"), &bad);
        put(model, "dropout", json_null(), &bad);
        put(model, "unk_token", json_null(), &bad);
        put(model, "continuing_subword_prefix", json_string(""), &bad);
        put(model, "end_of_word_suffix", json_string(""), &bad);
        put(model, "fuse_unk", json_false(), &bad);
        put(model, "byte_fallback", json_false(), &bad);
        json_t *vocab = json_object();
        put(model, "vocab", vocab, &bad);
        uint32_t cp[256];
        byte_alphabet(cp);
        for (int b = 0; vocab && b < 256; b++) {
            char s[3] = {0};
            utf8_put(cp[b], s);
            put(vocab, s, json_integer(b), &bad);
        }
        put(model, "merges", json_array(), &bad);
    }

    const char *eos = NULL, *pad = NULL;
    for (int i = 0; i < n_specials; i++) {
        if (strcmp(specials[i], "<|im_end|>") == 0) eos = specials[i];
        if (strcmp(specials[i], "<|endoftext|>") == 0) pad = specials[i];
    }
    if (!eos && n_specials > 0) eos = specials[n_specials - 1];
    put(cfg, "add_bos_token", json_false(), &bad);
    put(cfg, "bos_token", json_null(), &bad);
    put(cfg, "eos_token", eos ? json_string(eos) : json_null(), &bad);
    put(cfg, "pad_token", pad ? json_string(pad) : json_null(), &bad);
    put(cfg, "tokenizer_class", json_string("Qwen2Tokenizer"), &bad);

done:
    if (bad) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory building tokenizer files", dir);
    } else if ((st = dump_json(root, p_tok, err)) == IB_OK) {
        if ((st = dump_json(cfg, p_cfg, err)) != IB_OK) unlink(p_tok);
    }
    json_decref(root);
    json_decref(cfg);
    free(p_tok);
    free(p_cfg);
    return st;
}
