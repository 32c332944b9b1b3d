/*
 * test_tokenizer.c — the byte-level tokenizer files of `isobatch mkmodel`: written files, round trips,
 * ids; load errors, and malformed or unsupported tokenizer.json / tokenizer_config.json sections
 * (one-line messages naming the field). The BPE itself is tested in test_bpe.c.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "tokenizer/tokenizer.h"

/* The GPT-2 byte alphabet, written independently of the library: printable ranges keep their
 * value, the rest get 256 + k in byte order. */
static uint32_t t_cp(int b) {
    int direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (direct) return (uint32_t)b;
    uint32_t k = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) k++;
    return 256 + k;
}

/* UTF-8 of code point c (< 0x800) as a NUL-terminated string in s[3]. */
static void t_utf8(uint32_t c, char s[3]) {
    memset(s, 0, 3);
    if (c < 0x80) s[0] = (char)c;
    else { s[0] = (char)(0xC0 | (c >> 6)); s[1] = (char)(0x80 | (c & 0x3F)); }
}

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static char tmpdir[64];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

/* Write text to tmpdir/name; returns the path in a static buffer. */
static const char *write_file(const char *name, const char *text) {
    static char p[128];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    if (!f) { perror(p); exit(2); }
    fputs(text, f);
    fclose(f);
    return p;
}

/* Encode text, decode every id, and compare the concatenation to the input. */
static int round_trip(const ib_tokenizer *t, const char *text, size_t len) {
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    char *back = malloc(len + 1);
    int n = ib_tokenizer_encode(t, text, len, ids, (int)len + 1);
    size_t at = 0;
    int ok = n >= 0 && n <= (int)len;
    for (int i = 0; ok && i < n; i++) {
        int k = ib_tokenizer_decode(t, ids[i], back + at, (int)(len - at));
        if (k <= 0) ok = 0;
        else at += (size_t)k;
    }
    ok = ok && at == len && memcmp(back, text, len) == 0;
    free(ids);
    free(back);
    return ok;
}

static void test_written_files(void) {
    static const char *const sp[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    ib_error err = {0};
    CHECK_EQ_INT(ib_tokenizer_write_bytelevel(tmpdir, sp, 3, &err), IB_OK);

    /* read the files back independently */
    char p[128];
    path_in(p, sizeof p, "tokenizer.json");
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    CHECK(root != NULL, "tokenizer.json does not parse: %s", je.text);
    if (root) {
        json_t *model = json_object_get(root, "model");
        CHECK(json_is_string(json_object_get(model, "type")) &&
              strcmp(json_string_value(json_object_get(model, "type")), "BPE") == 0, "model.type");
        json_t *vocab = json_object_get(model, "vocab");
        CHECK_EQ_INT(json_object_size(vocab), 256);
        CHECK_EQ_INT(json_array_size(json_object_get(model, "merges")), 0);
        /* known GPT-2 alphabet facts: space is U+0120 "Ġ", newline U+010A "Ċ", byte 0 U+0100,
         * 0x7F U+0121, 0xAD U+0143; 'A' is itself */
        struct { int b; const char *s; } known[] = {
            {' ', "\xC4\xA0"}, {'\n', "\xC4\x8A"}, {0, "\xC4\x80"}, {0x7F, "\xC4\xA1"}, {0xAD, "\xC5\x83"},
            {'A', "A"}, {0xE9, "\xC3\xA9"}, {0xA0, "\xC5\x82"},
        };
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
            json_t *v = json_object_get(vocab, known[i].s);
            CHECK(json_is_integer(v) && json_integer_value(v) == known[i].b, "byte 0x%02X token", known[i].b);
        }
        for (int b = 0; b < 256; b++) {
            char s[3];
            t_utf8(t_cp(b), s);
            json_t *v = json_object_get(vocab, s);
            CHECK(json_is_integer(v) && json_integer_value(v) == b, "vocab[%s] != %d", s, b);
        }
        json_t *added = json_object_get(root, "added_tokens");
        CHECK_EQ_INT(json_array_size(added), 3);
        for (int i = 0; i < 3 && i < (int)json_array_size(added); i++) {
            json_t *e = json_array_get(added, (size_t)i);
            CHECK_EQ_INT(json_integer_value(json_object_get(e, "id")), 256 + i);
            CHECK(strcmp(json_string_value(json_object_get(e, "content")), sp[i]) == 0, "content %d", i);
            CHECK(json_is_true(json_object_get(e, "special")), "special %d", i);
        }
        json_t *pre = json_object_get(root, "pre_tokenizer");
        CHECK(strcmp(json_string_value(json_object_get(pre, "type")), "ByteLevel") == 0, "pre_tokenizer");
        json_decref(root);
    }
    path_in(p, sizeof p, "tokenizer_config.json");
    root = json_load_file(p, 0, &je);
    CHECK(root != NULL, "tokenizer_config.json does not parse");
    if (root) {
        CHECK(strcmp(json_string_value(json_object_get(root, "eos_token")), "<|im_end|>") == 0, "eos_token");
        CHECK(strcmp(json_string_value(json_object_get(root, "pad_token")), "<|endoftext|>") == 0, "pad_token");
        CHECK(json_is_null(json_object_get(root, "bos_token")), "bos_token");
        CHECK(json_is_false(json_object_get(root, "add_bos_token")), "add_bos_token");
        json_decref(root);
    }
    path_in(p, sizeof p, "tokenizer.json.tmp");
    CHECK(access(p, F_OK) != 0, "temporary file left behind");
}

static void test_bytelevel_model(void) {
    char p[128];
    path_in(p, sizeof p, "tokenizer.json");
    ib_tokenizer *t = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_tokenizer_load(p, 320, &t, &err), IB_OK);
    CHECK(t != NULL, "load: %s", err.msg);
    if (!t) return;

    CHECK_EQ_INT(ib_tokenizer_special(t, "<|endoftext|>"), 256);
    CHECK_EQ_INT(ib_tokenizer_special(t, "<|im_start|>"), 257);
    CHECK_EQ_INT(ib_tokenizer_special(t, "<|im_end|>"), 258);
    CHECK_EQ_INT(ib_tokenizer_special(t, "<|nope|>"), -1);

    /* every single byte encodes to its own value */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t id = -1;
        int n = ib_tokenizer_encode(t, &c, 1, &id, 1);
        CHECK(n == 1 && id == b, "byte %d -> n %d id %d", b, n, id);
        char out[4];
        CHECK(ib_tokenizer_decode(t, b, out, 4) == 1 && (unsigned char)out[0] == b, "decode %d", b);
    }
    /* plain ASCII: ids are the byte values */
    const char *ascii = "Hello, world! 123 ~\t\n";
    int32_t ids[64];
    int n = ib_tokenizer_encode(t, ascii, strlen(ascii), ids, 64);
    CHECK_EQ_INT(n, (int)strlen(ascii));
    for (int i = 0; i < n && i < 64; i++) CHECK_EQ_INT(ids[i], (unsigned char)ascii[i]);

    /* specials inside text, longest match, partial specials stay bytes */
    const char *mix = "a<|im_start|>b<|im_end|><|im_end<|endoftext|>";
    n = ib_tokenizer_encode(t, mix, strlen(mix), ids, 64);
    int32_t want[64];
    int nw = 0;
    want[nw++] = 'a'; want[nw++] = 257; want[nw++] = 'b'; want[nw++] = 258;
    for (const char *q = "<|im_end"; *q; q++) want[nw++] = (unsigned char)*q;
    want[nw++] = 256;
    CHECK_EQ_INT(n, nw);
    for (int i = 0; i < nw && i < n; i++) CHECK(ids[i] == want[i], "mix[%d]: %d != %d", i, ids[i], want[i]);
    CHECK(round_trip(t, mix, strlen(mix)), "round trip with specials");

    /* the count is complete even when cap is short; nothing past cap is written */
    int32_t small[3] = {-7, -7, -7};
    n = ib_tokenizer_encode(t, "abcdef", 6, small, 2);
    CHECK_EQ_INT(n, 6);
    CHECK(small[0] == 'a' && small[1] == 'b' && small[2] == -7, "cap respected: %d %d %d", small[0], small[1], small[2]);
    CHECK_EQ_INT(ib_tokenizer_encode(t, "abc", 3, NULL, 0), 3);
    CHECK_EQ_INT(ib_tokenizer_encode(t, "", 0, ids, 64), 0);

    /* UTF-8 text */
    const char *u8 = "h\xC3\xA9llo w\xC3\xB6rld \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x8E\x89<|im_end|>\n";
    CHECK(round_trip(t, u8, strlen(u8)), "utf-8 round trip");
    n = ib_tokenizer_encode(t, u8, 6, ids, 64);
    CHECK(n == 6 && ids[1] == 0xC3 && ids[2] == 0xA9, "utf-8 bytes are ids: %d %d", ids[1], ids[2]);

    /* random bytes with specials spliced in */
    static const char *const sp[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    char buf[600];
    int bad = 0;
    for (int trial = 0; trial < 300; trial++) {
        size_t len = 0, target = rnd() % 500;
        while (len < target) {
            if (rnd() % 20 == 0) {
                const char *s = sp[rnd() % 3];
                memcpy(buf + len, s, strlen(s));
                len += strlen(s);
            } else {
                buf[len++] = (char)(rnd() & 0xFF);
            }
        }
        if (!round_trip(t, buf, len)) bad++;
    }
    CHECK_EQ_INT(bad, 0);

    /* decode edge cases */
    char out[32];
    CHECK_EQ_INT(ib_tokenizer_decode(t, 258, out, 32), 10);
    CHECK(memcmp(out, "<|im_end|>", 10) == 0, "special decodes to content");
    CHECK_EQ_INT(ib_tokenizer_decode(t, 258, out, 9), -1);
    CHECK_EQ_INT(ib_tokenizer_decode(t, 65, out, 0), -1);
    CHECK_EQ_INT(ib_tokenizer_decode(t, 300, out, 32), 0);   /* inside vocab_limit, no token */
    CHECK_EQ_INT(ib_tokenizer_decode(t, 320, out, 32), 0);   /* past vocab_limit */
    CHECK_EQ_INT(ib_tokenizer_decode(t, -1, out, 32), 0);
    ib_tokenizer_free(t);
}

/* A hand-made tokenizer.json: byte tokens at permuted ids, merged tokens, a non-alphabet token and
 * an added token that is not special. */
static void test_custom_vocab(void) {
    json_t *root = json_object(), *model = json_object(), *vocab = json_object(), *added = json_array();
    for (int b = 0; b < 256; b++) {
        char s[3];
        t_utf8(t_cp(b), s);
        json_object_set_new(vocab, s, json_integer((b * 7 + 3) % 256));   /* 7 is invertible mod 256 */
    }
    json_object_set_new(vocab, "\xC4\xA0Hello", json_integer(260));              /* "ĠHello" */
    json_object_set_new(vocab, "\xE6\x97\xA5\xE6\x9C\xAC", json_integer(261));   /* outside the alphabet */
    json_object_set_new(vocab, "\xC4\x8A\xC4\x8A", json_integer(262));           /* "\n\n" */
    json_t *a = json_object();
    json_object_set_new(a, "id", json_integer(270));
    json_object_set_new(a, "content", json_string("<tool>"));
    json_object_set_new(a, "special", json_false());
    json_array_append_new(added, a);
    a = json_object();
    json_object_set_new(a, "id", json_integer(271));
    json_object_set_new(a, "content", json_string("<tool>x"));
    json_object_set_new(a, "special", json_true());
    json_array_append_new(added, a);
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(root, "model", model);
    json_object_set_new(root, "added_tokens", added);
    char p[128];
    path_in(p, sizeof p, "custom.json");
    CHECK_EQ_INT(json_dump_file(root, p, 0), 0);
    json_decref(root);

    ib_tokenizer *t = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_tokenizer_load(p, 300, &t, &err), IB_OK);
    if (!t) { fprintf(stderr, "custom load: %s\n", err.msg); return; }
    int32_t ids[32];
    int n = ib_tokenizer_encode(t, "Hi", 2, ids, 32);
    CHECK(n == 2 && ids[0] == ('H' * 7 + 3) % 256 && ids[1] == ('i' * 7 + 3) % 256, "permuted ids %d %d", ids[0], ids[1]);
    char out[32];
    int k = ib_tokenizer_decode(t, 260, out, 32);
    CHECK(k == 6 && memcmp(out, " Hello", 6) == 0, "merged token decodes to bytes (%d)", k);
    k = ib_tokenizer_decode(t, 261, out, 32);
    CHECK(k == 6 && memcmp(out, "\xE6\x97\xA5\xE6\x9C\xAC", 6) == 0, "non-alphabet token decodes raw (%d)", k);
    k = ib_tokenizer_decode(t, 262, out, 32);
    CHECK(k == 2 && memcmp(out, "\n\n", 2) == 0, "newline pair (%d)", k);
    /* longest added match: "<tool>x" beats "<tool>" */
    n = ib_tokenizer_encode(t, "<tool>x<tool>y", 14, ids, 32);
    CHECK(n == 3 && ids[0] == 271 && ids[1] == 270 && ids[2] == ('y' * 7 + 3) % 256, "longest match n=%d", n);
    CHECK_EQ_INT(ib_tokenizer_special(t, "<tool>"), 270);
    CHECK(round_trip(t, " Hello\n\n<tool>x", 15), "custom round trip");
    ib_tokenizer_free(t);
}

/* A vocab whose first entry is the empty string (tokenizers accepts one): it loads, decodes to no
 * bytes, and encoding never produces it. Under UBSan this was an offset applied to a null key arena. */
static void test_empty_token(void) {
    json_t *root = json_object(), *model = json_object(), *vocab = json_object();
    json_object_set_new(vocab, "", json_integer(256));
    for (int b = 0; b < 256; b++) {
        char s[3];
        t_utf8(t_cp(b), s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(root, "model", model);
    char p[128];
    path_in(p, sizeof p, "empty_token.json");
    CHECK_EQ_INT(json_dump_file(root, p, JSON_PRESERVE_ORDER), 0);
    json_decref(root);
    ib_tokenizer *t = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_tokenizer_load(p, 300, &t, &err), IB_OK);
    if (!t) { fprintf(stderr, "empty token load: %s\n", err.msg); return; }
    char out[8];
    CHECK_EQ_INT(ib_tokenizer_decode(t, 256, out, sizeof out), 0);
    int32_t ids[8];
    int n = ib_tokenizer_encode(t, "Hi", 2, ids, 8);
    CHECK(n == 2 && ids[0] == 'H' && ids[1] == 'i', "encode beside an empty token: n=%d", n);
    ib_tokenizer_free(t);
}

/* Run a load that must fail; check the status, *out cleared and the message naming file and
 * the expected fragments. */
static void expect_load_fail(const char *name, const char *text, int limit, ib_status code,
                             const char *frag1, const char *frag2) {
    const char *p = text ? write_file(name, text) : name;
    char path[128];
    snprintf(path, sizeof path, "%s", p);
    ib_tokenizer *t = (ib_tokenizer *)(uintptr_t)1;
    ib_error err = {0};
    ib_status st = ib_tokenizer_load(path, limit, &t, &err);
    CHECK(st == code, "%s: status %d, want %d (%s)", name, st, code, err.msg);
    CHECK(t == NULL, "%s: out not cleared", name);
    CHECK(strstr(err.msg, path) != NULL, "%s: message lacks the path: %s", name, err.msg);
    CHECK(!frag1 || strstr(err.msg, frag1), "%s: message lacks \"%s\": %s", name, frag1, err.msg);
    CHECK(!frag2 || strstr(err.msg, frag2), "%s: message lacks \"%s\": %s", name, frag2, err.msg);
    CHECK(strchr(err.msg, '\n') == NULL, "%s: message has a newline", name);
}

/* A tokenizer.json text whose vocab has all byte tokens (id = byte) except `skip` (-1 for none). */
static char *vocab_text(int skip) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        if (b == skip) continue;
        char s[3];
        t_utf8(t_cp(b), s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    char *v = json_dumps(vocab, JSON_COMPACT);
    json_decref(vocab);
    size_t n = strlen(v) + 64;
    char *s = malloc(n);
    snprintf(s, n, "{\"model\":{\"vocab\":%s}}", v);
    free(v);
    return s;
}

static void test_load_errors(void) {
    expect_load_fail("missing.json", "{\"model\":{}}", 320, IB_ERR_FORMAT, "model.vocab", "missing");
    expect_load_fail("nomodel.json", "{\"added_tokens\":[]}", 320, IB_ERR_FORMAT, "model", "missing");
    expect_load_fail("array.json", "{\"model\":{\"vocab\":[1,2]}}", 320, IB_ERR_FORMAT, "model.vocab", "not an object");
    expect_load_fail("syntax.json", "{\"model\":", 320, IB_ERR_FORMAT, "JSON", NULL);
    expect_load_fail("/nonexistent/dir/tokenizer.json", NULL, 320, IB_ERR_IO, NULL, NULL);

    char *s = vocab_text(0x41);
    expect_load_fail("nobyte.json", s, 320, IB_ERR_MODEL, "model.vocab", "byte 0x41");
    free(s);
    s = vocab_text(-1);
    expect_load_fail("limit.json", s, 200, IB_ERR_MODEL, "model.vocab", "out of range");   /* byte ids >= 200 */
    free(s);
    /* vocab ok, an extra token out of range */
    json_t *root = json_loads("{\"model\":{\"vocab\":{}}}", 0, NULL);
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    for (int b = 0; b < 256; b++) {
        char c[3];
        t_utf8(t_cp(b), c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_object_set_new(vocab, "zz", json_integer(999));
    char *txt = json_dumps(root, 0);
    expect_load_fail("range.json", txt, 320, IB_ERR_MODEL, "model.vocab", "999");
    free(txt);
    json_object_set_new(vocab, "zz", json_string("7"));
    txt = json_dumps(root, 0);
    expect_load_fail("strid.json", txt, 320, IB_ERR_FORMAT, "model.vocab", "not an integer");
    free(txt);
    json_object_set_new(vocab, "zz", json_integer(5));   /* id 5 is byte 5's */
    txt = json_dumps(root, 0);
    expect_load_fail("dupid.json", txt, 320, IB_ERR_MODEL, "model.vocab", "two tokens");
    free(txt);
    json_object_del(vocab, "zz");
    json_object_set_new(root, "added_tokens", json_loads("[{\"id\": 400, \"content\": \"<x>\"}]", 0, NULL));
    txt = json_dumps(root, 0);
    expect_load_fail("addid.json", txt, 320, IB_ERR_MODEL, "added_tokens[0].id", "400");
    free(txt);
    json_object_set_new(root, "added_tokens", json_loads("[{\"id\": 300, \"content\": 5}]", 0, NULL));
    txt = json_dumps(root, 0);
    expect_load_fail("addcontent.json", txt, 320, IB_ERR_FORMAT, "added_tokens[0].content", NULL);
    free(txt);
    json_object_set_new(root, "added_tokens", json_string("x"));
    txt = json_dumps(root, 0);
    expect_load_fail("addtype.json", txt, 320, IB_ERR_FORMAT, "added_tokens", "not an array");
    free(txt);
    json_decref(root);

    ib_tokenizer *t = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_tokenizer_load("x.json", 0, &t, &err), IB_ERR_INVALID_ARG);
}

/* A root {"model": {"type": "BPE", "vocab": all byte tokens (id = byte) + "ab" (300)}}. */
static json_t *base_root(void) {
    json_t *root = json_object(), *model = json_object(), *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[3];
        t_utf8(t_cp(b), c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_object_set_new(vocab, "ab", json_integer(300));
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(root, "model", model);
    return root;
}

/* base_root with field `key` of the model (model_field) or of the root set to the JSON text v. */
static void fail_with(const char *name, int model_field, const char *key, const char *v, ib_status code, const char *frag1,
                      const char *frag2) {
    json_t *root = base_root();
    json_t *val = json_loads(v, JSON_DECODE_ANY, NULL);
    if (!val) {
        fprintf(stderr, "bad test JSON %s\n", v);
        exit(2);
    }
    json_object_set_new(model_field ? json_object_get(root, "model") : root, key, val);
    char *txt = json_dumps(root, 0);
    expect_load_fail(name, txt, 320, code, frag1, frag2);
    free(txt);
    json_decref(root);
}

/* Malformed and unsupported tokenizer.json sections: one-line errors naming the field. */
static void test_malformed(void) {
    fail_with("mf_type.json", 1, "type", "\"WordPiece\"", IB_ERR_UNSUPPORTED, "field model.type", "WordPiece");
    fail_with("mf_typenum.json", 1, "type", "5", IB_ERR_FORMAT, "field model.type", NULL);
    fail_with("mf_dropout.json", 1, "dropout", "0.1", IB_ERR_UNSUPPORTED, "field model.dropout", NULL);
    fail_with("mf_prefix.json", 1, "continuing_subword_prefix", "\"##\"", IB_ERR_UNSUPPORTED, "field model.continuing_subword_prefix", NULL);
    fail_with("mf_ignore.json", 1, "ignore_merges", "\"yes\"", IB_ERR_FORMAT, "field model.ignore_merges", NULL);
    /* merges */
    fail_with("mf_mtype.json", 1, "merges", "\"a b\"", IB_ERR_FORMAT, "field model.merges", "not an array");
    fail_with("mf_m1.json", 1, "merges", "[\"ab\"]", IB_ERR_FORMAT, "field model.merges[0]", "LEFT RIGHT");
    fail_with("mf_m2.json", 1, "merges", "[\"a b c\"]", IB_ERR_FORMAT, "field model.merges[0]", NULL);
    fail_with("mf_m3.json", 1, "merges", "[[\"a\"]]", IB_ERR_FORMAT, "field model.merges[0]", NULL);
    fail_with("mf_m4.json", 1, "merges", "[5]", IB_ERR_FORMAT, "field model.merges[0]", NULL);
    fail_with("mf_m5.json", 1, "merges", "[\"a zz\"]", IB_ERR_MODEL, "field model.merges[0]", "\"zz\" is not in model.vocab");
    fail_with("mf_m6.json", 1, "merges", "[\"a b\", \"c d\"]", IB_ERR_MODEL, "field model.merges[1]", "merged token \"cd\"");
    fail_with("mf_m7.json", 1, "merges", "[[\"a\", \"\"]]", IB_ERR_FORMAT, "field model.merges[0]", "empty");
    /* pre-tokenizers */
    fail_with("mf_re.json", 0, "pre_tokenizer",
              "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\", \"invert\": false}",
              IB_ERR_FORMAT, "field pre_tokenizer.pattern.Regex", "bad regex");
    fail_with("mf_re2.json", 0, "pre_tokenizer",
              "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", \"pattern\": "
              "{\"Regex\": \"[a-\"}, \"behavior\": \"Isolated\"}]}",
              IB_ERR_FORMAT, "field pre_tokenizer.pretokenizers[1].pattern.Regex", "bad regex");
    fail_with("mf_re3.json", 0, "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{Nope}\"}, \"behavior\": \"Isolated\"}",
              IB_ERR_FORMAT, "field pre_tokenizer.pattern.Regex", NULL);
    fail_with("mf_beh.json", 0, "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"String\": \"x\"}, \"behavior\": \"Sideways\"}",
              IB_ERR_FORMAT, "field pre_tokenizer.behavior", "Sideways");
    fail_with("mf_pat.json", 0, "pre_tokenizer", "{\"type\": \"Split\", \"behavior\": \"Isolated\"}", IB_ERR_FORMAT,
              "field pre_tokenizer.pattern", NULL);
    fail_with("mf_pt.json", 0, "pre_tokenizer", "{\"type\": \"WhitespaceSplit\"}", IB_ERR_UNSUPPORTED, "field pre_tokenizer.type",
              "WhitespaceSplit");
    fail_with("mf_pt2.json", 0, "pre_tokenizer", "{}", IB_ERR_FORMAT, "field pre_tokenizer.type", NULL);
    fail_with("mf_bl.json", 0, "pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": 1}", IB_ERR_FORMAT,
              "field pre_tokenizer.add_prefix_space", NULL);
    /* normalizer, decoder, post-processor */
    fail_with("mf_norm.json", 0, "normalizer", "{\"type\": \"Lowercase\"}", IB_ERR_UNSUPPORTED, "field normalizer.type", "Lowercase");
    fail_with("mf_norm2.json", 0, "normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Strip\"}]}",
              IB_ERR_UNSUPPORTED, "field normalizer.normalizers[1].type", NULL);
    fail_with("mf_dec.json", 0, "decoder", "{\"type\": \"WordPiece\"}", IB_ERR_UNSUPPORTED, "field decoder.type", NULL);
    /* the SentencePiece-style parts: what is not supported, and malformed ones */
    fail_with("mf_bf.json", 1, "byte_fallback", "true", IB_ERR_MODEL, "field model.vocab", "needs the token <0x00>");
    fail_with("mf_bf2.json", 1, "byte_fallback", "\"yes\"", IB_ERR_FORMAT, "field model.byte_fallback", NULL);
    fail_with("mf_unk.json", 1, "unk_token", "3", IB_ERR_FORMAT, "field model.unk_token", NULL);
    fail_with("mf_strip.json", 0, "decoder", "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
              "\"content\": \" \", \"start\": 1, \"stop\": 0}]}", IB_ERR_UNSUPPORTED, "field decoder.decoders[1].type", "Strip");
    fail_with("mf_decrep.json", 0, "decoder", "{\"type\": \"Replace\", \"pattern\": {\"String\": \"_\"}, \"content\": \" \"}",
              IB_ERR_UNSUPPORTED, "field decoder", "needs model.byte_fallback");
    fail_with("mf_decms.json", 0, "decoder", "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"first\"}",
              IB_ERR_UNSUPPORTED, "field decoder.prepend_scheme", NULL);
    fail_with("mf_decre.json", 0, "decoder", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"_\"}, \"content\": \" \"}",
              IB_ERR_UNSUPPORTED, "field decoder.pattern.Regex", NULL);
    fail_with("mf_nrep.json", 0, "normalizer", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" \"}, \"content\": \"_\"}",
              IB_ERR_UNSUPPORTED, "field normalizer.pattern.Regex", NULL);
    fail_with("mf_nrep2.json", 0, "normalizer", "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}}", IB_ERR_FORMAT,
              "field normalizer.content", NULL);
    fail_with("mf_npre.json", 0, "normalizer", "{\"type\": \"Prepend\"}", IB_ERR_FORMAT, "field normalizer.prepend", NULL);
    fail_with("mf_ms.json", 0, "pre_tokenizer", "{\"type\": \"Metaspace\"}", IB_ERR_FORMAT, "field pre_tokenizer.replacement", NULL);
    fail_with("mf_ms2.json", 0, "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"often\"}",
              IB_ERR_FORMAT, "field pre_tokenizer.prepend_scheme", "often");
    fail_with("mf_post.json", 0, "post_processor", "{\"type\": \"BertProcessing\"}", IB_ERR_UNSUPPORTED, "field post_processor.type", NULL);
    fail_with("mf_post2.json", 0, "post_processor",
              "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<bos>\"}}, {\"Sequence\": {\"id\": \"A\"}}],"
              " \"special_tokens\": {}}",
              IB_ERR_FORMAT, "field post_processor.single[0]", "<bos>");
    fail_with("mf_added.json", 0, "added_tokens", "[{\"id\": 301, \"content\": \"<x>\", \"lstrip\": \"yes\"}]", IB_ERR_FORMAT,
              "field added_tokens[0].lstrip", NULL);

    /* tokenizer_config.json beside tokenizer.json */
    static const struct { const char *cfg; ib_status code; const char *frag; } cfgs[] = {
        {"{\"eos_token\": ", IB_ERR_FORMAT, "JSON error"},
        {"{\"eos_token\": \"<nope>\"}", IB_ERR_MODEL, "field eos_token"},
        {"{\"bos_token\": 5}", IB_ERR_FORMAT, "field bos_token"},
        {"{\"add_bos_token\": \"yes\"}", IB_ERR_FORMAT, "field add_bos_token"},
        {"{\"chat_template\": 5}", IB_ERR_FORMAT, "field chat_template"},
        {"[1]", IB_ERR_FORMAT, "top level"},
    };
    char dir[96], p[160], pc[160];
    snprintf(dir, sizeof dir, "%s/cfgbad", tmpdir);
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    snprintf(pc, sizeof pc, "%s/tokenizer_config.json", dir);
    json_t *root = base_root();
    json_dump_file(root, p, 0);
    json_decref(root);
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        FILE *f = fopen(pc, "w");
        fputs(cfgs[i].cfg, f);
        fclose(f);
        ib_tokenizer *t = (ib_tokenizer *)(uintptr_t)1;
        ib_error err = {0};
        ib_status st = ib_tokenizer_load(p, 320, &t, &err);
        CHECK(st == cfgs[i].code, "config %zu: status %d, want %d (%s)", i, st, cfgs[i].code, err.msg);
        CHECK(t == NULL, "config %zu: out not cleared", i);
        CHECK(strstr(err.msg, pc) && strstr(err.msg, cfgs[i].frag) && !strchr(err.msg, '\n'), "config %zu: message: %s", i, err.msg);
    }
    unlink(pc);
    unlink(p);
    rmdir(dir);
}

static void test_bytes_tokenizer(void) {
    ib_tokenizer *t = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_tokenizer_bytes(100, &t, &err), IB_ERR_INVALID_ARG);
    CHECK(t == NULL, "out cleared");
    CHECK_EQ_INT(ib_tokenizer_bytes(256, &t, &err), IB_OK);
    if (!t) return;
    char all[256];
    for (int b = 0; b < 256; b++) all[b] = (char)b;
    int32_t ids[256];
    CHECK_EQ_INT(ib_tokenizer_encode(t, all, 256, ids, 256), 256);
    for (int b = 0; b < 256; b++) CHECK_EQ_INT(ids[b], b);
    CHECK(round_trip(t, all, 256), "bytes round trip");
    CHECK(round_trip(t, "<|im_end|>", 10), "no specials: plain bytes");
    CHECK_EQ_INT(ib_tokenizer_encode(t, "<|im_end|>", 10, ids, 256), 10);
    CHECK_EQ_INT(ib_tokenizer_special(t, "<|im_end|>"), -1);
    char out[2];
    CHECK_EQ_INT(ib_tokenizer_decode(t, 256, out, 2), 0);
    CHECK_EQ_INT(ib_tokenizer_decode(t, 7, out, 0), -1);
    ib_tokenizer_free(t);
    ib_tokenizer_free(NULL);
}

static void test_write_errors(void) {
    ib_error err = {0};
    static const char *const dup[2] = {"<a>", "<a>"};
    CHECK_EQ_INT(ib_tokenizer_write_bytelevel(tmpdir, dup, 2, &err), IB_ERR_INVALID_ARG);
    static const char *const sp[1] = {"<|im_end|>"};
    CHECK_EQ_INT(ib_tokenizer_write_bytelevel("/nonexistent/dir", sp, 1, &err), IB_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/dir") != NULL, "message names the path: %s", err.msg);
}

/* Remove every file of tmpdir, then tmpdir. */
static void cleanup(void) {
    static const char *const names[] = {
        "tokenizer.json", "tokenizer_config.json", "custom.json", "empty_token.json", "missing.json", "nomodel.json", "array.json",
        "syntax.json", "nobyte.json", "limit.json", "range.json", "strid.json", "dupid.json", "addid.json",
        "addcontent.json", "addtype.json", "mf_type.json", "mf_typenum.json", "mf_dropout.json", "mf_prefix.json",
        "mf_ignore.json", "mf_mtype.json", "mf_m1.json", "mf_m2.json", "mf_m3.json", "mf_m4.json", "mf_m5.json", "mf_m6.json",
        "mf_m7.json", "mf_re.json", "mf_re2.json", "mf_re3.json", "mf_beh.json", "mf_pat.json", "mf_pt.json", "mf_pt2.json",
        "mf_bf.json", "mf_bf2.json", "mf_unk.json", "mf_strip.json", "mf_decrep.json", "mf_decms.json", "mf_decre.json", "mf_nrep.json", "mf_nrep2.json", "mf_npre.json", "mf_ms.json", "mf_ms2.json",
        "mf_bl.json", "mf_norm.json", "mf_norm2.json", "mf_dec.json", "mf_post.json", "mf_post2.json", "mf_added.json",
    };
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        path_in(p, sizeof p, names[i]);
        unlink(p);
    }
    CHECK(rmdir(tmpdir) == 0, "temporary directory %s not empty", tmpdir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ib_tok_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 2; }
    test_written_files();
    test_bytelevel_model();
    test_custom_vocab();
    test_empty_token();
    test_load_errors();
    test_malformed();
    test_bytes_tokenizer();
    test_write_errors();
    cleanup();
    TEST_MAIN_END("test_tokenizer");
}
