/*
 * writer.c — ib_tokenizer_write_bytelevel: the byte-level tokenizer.json / tokenizer_config.json pair
 * that `isobatch mkmodel` puts in synthetic model directories.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

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
        tok_byte_alphabet(cp);
        for (int b = 0; vocab && b < 256; b++) {
            char s[3] = {0};
            tok_utf8_put(cp[b], s);
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
