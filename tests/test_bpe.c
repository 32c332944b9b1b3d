/*
 * test_bpe.c — the BPE tokenizer on small hand-made tokenizer.json files whose results are worked out
 * by hand in the comments: merge order (rank first, then leftmost), ignore_merges, both merge forms,
 * the five Split behaviors and invert, regex splits with Oniguruma's \s, ByteLevel prefix space and
 * regex, the normalizers, added tokens (leftmost-longest, lstrip, rstrip, single_word, normalized,
 * special), the template post-processor and add_bos_token, invalid UTF-8, long inputs, the word cache
 * and concurrent encoding.
 *
 * Every tokenizer here has the 256 byte tokens at id = byte value; extra tokens get ids 256, 257, …
 * in the order listed (X(k) below is extra token k).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "tokenizer/tokenizer.h"

#define X(k) (256 + (k))
#define B(c) ((int32_t)(unsigned char)(c))

/* ---------------------------------------------------------------- building tokenizer files */

/* The GPT-2 byte alphabet, written independently of the library. */
static uint32_t t_cp(int b) {
    int direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (direct) return (uint32_t)b;
    uint32_t k = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) k++;
    return 256 + k;
}

/* Alphabet form (UTF-8 of each byte's character) of bytes s into out (NUL-terminated). */
static void alpha(const char *s, char *out) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        uint32_t c = t_cp(*p);
        if (c < 0x80) out[o++] = (char)c;
        else {
            out[o++] = (char)(0xC0 | (c >> 6));
            out[o++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[o] = '\0';
}

static char tmpdir[64];

typedef struct mpair {
    const char *l, *r;   /* byte strings */
} mpair;

/* Write tmpdir/name: vocab = bytes + extra (byte strings), merges (string or pair form), the model
 * options and the top-level fields of `top` (a JSON object text, may be NULL). Returns the path. */
static const char *write_tok(const char *name, const char *const *extra, int n_extra, const mpair *mg, int n_mg,
                             int pair_form, int ignore_merges, const char *top) {
    static char path[256];
    json_t *root = top ? json_loads(top, 0, NULL) : json_object();
    if (!root) {
        fprintf(stderr, "bad test JSON: %s\n", top);
        exit(2);
    }
    json_t *model = json_object(), *vocab = json_object(), *merges = json_array();
    char a[512], b[512];
    for (int i = 0; i < 256; i++) {
        char s[2] = {(char)i, 0};
        if (i == 0) {   /* alpha() stops at NUL: byte 0 is U+0100 */
            json_object_set_new(vocab, "\xC4\x80", json_integer(0));
            continue;
        }
        alpha(s, a);
        json_object_set_new(vocab, a, json_integer(i));
    }
    for (int i = 0; i < n_extra; i++) {
        alpha(extra[i], a);
        json_object_set_new(vocab, a, json_integer(256 + i));
    }
    for (int i = 0; i < n_mg; i++) {
        alpha(mg[i].l, a);
        alpha(mg[i].r, b);
        if (pair_form) {
            json_array_append_new(merges, json_pack("[ss]", a, b));
        } else {
            char s[1100];
            snprintf(s, sizeof s, "%s %s", a, b);
            json_array_append_new(merges, json_string(s));
        }
    }
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    json_object_set_new(model, "ignore_merges", json_boolean(ignore_merges));
    json_object_set_new(root, "model", model);
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    if (json_dump_file(root, path, 0)) {
        perror(path);
        exit(2);
    }
    json_decref(root);
    return path;
}

static ib_tokenizer *load(const char *path) {
    ib_tokenizer *t = NULL;
    ib_error err = {0};
    ib_status st = ib_tokenizer_load(path, 100000, &t, &err);
    CHECK(st == IB_OK, "load %s: %s", path, err.msg);
    return t;
}

/* ---------------------------------------------------------------- checking ids */

static void expect_(const ib_tokenizer *t, const char *text, size_t len, int flags, const int32_t *want, int nw,
                    const char *label, int line) {
    if (!t) {
        CHECK(0, "line %d: %s: no tokenizer", line, label);
        return;
    }
    int32_t got[600];
    int n = ib_tokenizer_encode_ex(t, text, len, flags, got, 600);
    int same = n == nw;
    for (int i = 0; same && i < n; i++) same = got[i] == want[i];
    char g[400] = "", w[400] = "";
    if (!same) {
        for (int i = 0; i < n && i < 40; i++) snprintf(g + strlen(g), sizeof g - strlen(g), "%d ", got[i]);
        for (int i = 0; i < nw && i < 40; i++) snprintf(w + strlen(w), sizeof w - strlen(w), "%d ", want[i]);
    }
    CHECK(same, "line %d: %s: got %d ids [%s], want %d [%s]", line, label, n, g, nw, w);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (int)(sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))
#define EXPECT(t, text, flags, ...) expect_(t, text, strlen(text), flags, IDS(__VA_ARGS__), text, __LINE__)
#define EXPECTN(t, text, len, flags, ...) expect_(t, text, len, flags, IDS(__VA_ARGS__), #text, __LINE__)
#define EXPECT_NONE(t, text, flags) expect_(t, text, strlen(text), flags, NULL, 0, text, __LINE__)

/* ---------------------------------------------------------------- merges */

static const char *const MERGE_EXTRA[] = {"ab", "bc", "abc", "aa", "aaaa", "cd", "abcd"};
static const mpair MERGES[] = {
    {"a", "b"},    /* rank 0 -> ab   (X0) */
    {"b", "c"},    /* rank 1 -> bc   (X1) */
    {"ab", "c"},   /* rank 2 -> abc  (X2) */
    {"a", "a"},    /* rank 3 -> aa   (X3) */
    {"aa", "aa"},  /* rank 4 -> aaaa (X4) */
    {"c", "d"},    /* rank 5 -> cd   (X5) */
};

static void merge_cases(const ib_tokenizer *t) {
    EXPECT(t, "abc", 0, X(2));               /* ab (r0) before bc (r1), then ab+c (r2) */
    EXPECT(t, "bcab", 0, X(1), X(0));        /* ab (r0) first although bc is leftmost; then bc */
    EXPECT(t, "aaa", 0, X(3), B('a'));       /* equal ranks: leftmost first */
    EXPECT(t, "aaaaa", 0, X(4), B('a'));     /* aa aa a, then aa+aa */
    EXPECT(t, "abcd", 0, X(2), B('d'));      /* abc (r2) before cd (r5); no abc+d merge */
    EXPECT(t, "cabc", 0, B('c'), X(2));
    EXPECT(t, "bcd", 0, X(1), B('d'));       /* bc (r1) before cd (r5) */
    EXPECT(t, "dcd", 0, B('d'), X(5));
    EXPECT(t, "x", 0, B('x'));
    EXPECT_NONE(t, "", 0);
}

static void test_merges(void) {
    ib_tokenizer *t = load(write_tok("m1.json", MERGE_EXTRA, 7, MERGES, 6, 0, 0, NULL));
    merge_cases(t);
    if (t) {
        CHECK_EQ_INT(ib_tokenizer_encode(t, "abc", 3, NULL, 0), 1);
        /* decode: merged tokens give their bytes */
        char out[16];
        int k = ib_tokenizer_decode(t, X(2), out, 16);
        CHECK(k == 3 && memcmp(out, "abc", 3) == 0, "decode abc: %d", k);
        CHECK_EQ_INT(ib_tokenizer_n_ids(t), 263);
    }
    ib_tokenizer_free(t);

    /* the pair form ["a", "b"] gives the same */
    t = load(write_tok("m2.json", MERGE_EXTRA, 7, MERGES, 6, 1, 0, NULL));
    merge_cases(t);
    ib_tokenizer_free(t);

    /* ignore_merges: a piece that is itself a token is that token, merges or not */
    t = load(write_tok("m3.json", MERGE_EXTRA, 7, MERGES, 6, 0, 1, NULL));
    EXPECT(t, "abcd", 0, X(6));
    EXPECT(t, "aaa", 0, X(3), B('a'));       /* "aaa" is not a token: merges as usual */
    ib_tokenizer_free(t);
    t = load(write_tok("m4.json", MERGE_EXTRA, 7, MERGES, 6, 0, 0, NULL));
    EXPECT(t, "abcd", 0, X(2), B('d'));
    ib_tokenizer_free(t);

    /* a pair listed twice: the later rank counts (Hugging Face builds its merge map in file order),
     * so here bc (r1) goes before ab (now r6) */
    mpair twice[7];
    memcpy(twice, MERGES, sizeof MERGES);
    twice[6] = (mpair){"a", "b"};
    t = load(write_tok("m5.json", MERGE_EXTRA, 7, twice, 7, 0, 0, NULL));
    EXPECT(t, "abc", 0, B('a'), X(1));
    ib_tokenizer_free(t);

    /* a long piece: 100000 × a -> 50000 aa -> 25000 aaaa (every r3 merge before any r4) */
    t = load(write_tok("m6.json", MERGE_EXTRA, 7, MERGES, 6, 0, 0, NULL));
    if (t) {
        size_t n = 100000;
        char *s = malloc(n);
        int32_t *ids = malloc(n * sizeof *ids);
        memset(s, 'a', n);
        int k = ib_tokenizer_encode(t, s, n, ids, (int)n);
        int all = k == 25000;
        for (int i = 0; all && i < k; i++) all = ids[i] == X(4);
        CHECK(all, "100000 a: %d ids", k);
        free(s);
        free(ids);
    }
    ib_tokenizer_free(t);
}

/* ---------------------------------------------------------------- Split behaviors */

static const char *const SPLIT_EXTRA[] = {"a-", "-b", "--"};
static const mpair SPLIT_MERGES[] = {{"a", "-"}, {"-", "b"}, {"-", "-"}};   /* r0 a-, r1 -b, r2 -- */

static ib_tokenizer *split_tok(const char *name, const char *behavior, int invert, const char *pattern_kind, const char *pattern) {
    char top[512];
    snprintf(top, sizeof top, "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"%s\": \"%s\"}, \"behavior\": \"%s\", \"invert\": %s}}",
             pattern_kind, pattern, behavior, invert ? "true" : "false");
    return load(write_tok(name, SPLIT_EXTRA, 3, SPLIT_MERGES, 3, 0, 0, top));
}

static void test_split(void) {
    ib_tokenizer *t = load(write_tok("s0.json", SPLIT_EXTRA, 3, SPLIT_MERGES, 3, 0, 0, NULL));
    EXPECT(t, "a-b", 0, X(0), B('b'));                  /* no pre-tokenizer: a- (r0) wins */
    ib_tokenizer_free(t);

    t = split_tok("s1.json", "Isolated", 0, "String", "-");
    EXPECT(t, "a-b", 0, B('a'), B('-'), B('b'));
    EXPECT(t, "a--b", 0, B('a'), B('-'), B('-'), B('b'));
    ib_tokenizer_free(t);

    t = split_tok("s2.json", "Removed", 0, "String", "-");
    EXPECT(t, "a-b", 0, B('a'), B('b'));
    EXPECT(t, "a--b", 0, B('a'), B('b'));
    EXPECT_NONE(t, "---", 0);
    ib_tokenizer_free(t);

    t = split_tok("s3.json", "MergedWithPrevious", 0, "String", "-");
    EXPECT(t, "a-b", 0, X(0), B('b'));                  /* "a-" "b" */
    EXPECT(t, "a--b", 0, X(0), B('-'), B('b'));         /* "a-" "-" "b": a match after a match stays alone */
    EXPECT(t, "-a-", 0, B('-'), X(0));                  /* "-" "a-" */
    ib_tokenizer_free(t);

    t = split_tok("s4.json", "MergedWithNext", 0, "String", "-");
    EXPECT(t, "a-b", 0, B('a'), X(1));                  /* "a" "-b" */
    EXPECT(t, "a--b", 0, B('a'), B('-'), X(1));         /* "a" "-" "-b" */
    ib_tokenizer_free(t);

    t = split_tok("s5.json", "Contiguous", 0, "String", "-");
    EXPECT(t, "a-b", 0, B('a'), B('-'), B('b'));
    EXPECT(t, "a--b", 0, B('a'), X(2), B('b'));         /* "a" "--" "b" */
    ib_tokenizer_free(t);

    /* invert: the text between dashes is what matches */
    t = split_tok("s6.json", "Removed", 1, "String", "-");
    EXPECT(t, "a-b", 0, B('-'));
    ib_tokenizer_free(t);
    t = split_tok("s7.json", "MergedWithPrevious", 1, "String", "-");
    EXPECT(t, "a-b", 0, B('a'), X(1));                  /* "a" (match) "-b" (b merges into the dash) */
    ib_tokenizer_free(t);

    /* the same splits by regex */
    t = split_tok("s8.json", "Contiguous", 0, "Regex", "-");
    EXPECT(t, "a--b", 0, B('a'), X(2), B('b'));
    ib_tokenizer_free(t);
}

/* ---------------------------------------------------------------- regexes: Oniguruma's \s */

static void test_regex(void) {
    ib_tokenizer *t = split_tok("r1.json", "Removed", 0, "Regex", "\\\\s+");
    EXPECT(t, "a b\t\nc", 0, B('a'), B('b'), B('c'));
    EXPECT(t, "a\xC2\xA0" "b", 0, B('a'), B('b'));                       /* U+00A0 is \s */
    EXPECT(t, "a\xC2\x85" "b", 0, B('a'), B('b'));                        /* U+0085 is \s (Oniguruma) */
    EXPECT(t, "a\xE3\x80\x80" "b", 0, B('a'), B('b'));                    /* U+3000 */
    EXPECT(t, "a\xE1\xA0\x8E" "b", 0, B('a'), 0xE1, 0xA0, 0x8E, B('b'));  /* U+180E is not (PCRE2 alone would say it is) */
    ib_tokenizer_free(t);

    t = split_tok("r2.json", "Removed", 0, "Regex", "[\\\\s,]+");           /* \s inside a class */
    EXPECT(t, "a, b", 0, B('a'), B('b'));
    EXPECT(t, "a\xE1\xA0\x8E,b", 0, B('a'), 0xE1, 0xA0, 0x8E, B('b'));
    ib_tokenizer_free(t);

    t = split_tok("r3.json", "Removed", 0, "Regex", "\\\\S+");             /* \S outside a class */
    EXPECT(t, "ab \xE1\xA0\x8E cd", 0, B(' '), B(' '));                  /* U+180E is a non-space run */
    ib_tokenizer_free(t);

    t = split_tok("r4.json", "Removed", 0, "Regex", "\\\\\\\\s");          /* regex \\s: a backslash, then s */
    EXPECT(t, "a\\sb c", 0, B('a'), B('b'), B(' '), B('c'));
    ib_tokenizer_free(t);

    t = split_tok("r5.json", "Removed", 0, "Regex", "(?i:'s)");           /* case-insensitive group */
    EXPECT(t, "x's y'S", 0, B('x'), B(' '), B('y'));
    ib_tokenizer_free(t);

    /* a run of a million spaces through a Qwen-style pattern (backtracking lookahead), no merges */
    t = split_tok("r6.json", "Isolated", 0, "Regex", "\\\\s+(?!\\\\S)|\\\\s+");
    if (t) {
        size_t n = 1000000;
        char *s = malloc(n + 1);
        memset(s, ' ', n);
        s[n] = 'x';
        CHECK_EQ_INT(ib_tokenizer_encode(t, s, n + 1, NULL, 0), (int)n + 1);
        free(s);
    }
    ib_tokenizer_free(t);
}

/* ---------------------------------------------------------------- ByteLevel */

static void test_bytelevel(void) {
    static const char *const extra[] = {"o "};
    static const mpair mg[] = {{"o", " "}};
    ib_tokenizer *t = load(write_tok("b1.json", extra, 1, mg, 1, 0, 0, NULL));
    EXPECT(t, "go now", 0, B('g'), X(0), B('n'), B('o'), B('w'));          /* no pre-tokenizer: "o " merges */
    ib_tokenizer_free(t);
    t = load(write_tok("b2.json", extra, 1, mg, 1, 0, 0, "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}}"));
    EXPECT(t, "go now", 0, B('g'), B('o'), B(' '), B('n'), B('o'), B('w'));   /* GPT-2 regex: "go" " now" */
    ib_tokenizer_free(t);
    t = load(write_tok("b3.json", extra, 1, mg, 1, 0, 0, "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": false}}"));
    EXPECT(t, "hi", 0, B(' '), B('h'), B('i'));
    EXPECT(t, " hi", 0, B(' '), B('h'), B('i'));                                /* already starts with a space */
    ib_tokenizer_free(t);
    /* Sequence: Split on "|" (Removed), then ByteLevel with prefix space on every piece */
    t = load(write_tok("b4.json", extra, 1, mg, 1, 0, 0,
                       "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
                       "{\"type\": \"Split\", \"pattern\": {\"String\": \"|\"}, \"behavior\": \"Removed\"},"
                       "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": false}]}}"));
    EXPECT(t, "a|b", 0, B(' '), B('a'), B(' '), B('b'));
    ib_tokenizer_free(t);
}

/* ---------------------------------------------------------------- normalizers */

static void test_normalizers(void) {
    ib_tokenizer *t = load(write_tok("n1.json", NULL, 0, NULL, 0, 0, 0, "{\"normalizer\": {\"type\": \"NFC\"}}"));
    EXPECT(t, "e\xCC\x81", 0, 0xC3, 0xA9);                 /* e + U+0301 -> é */
    EXPECT(t, "\xE2\x84\xAB", 0, 0xC3, 0x85);              /* U+212B ANGSTROM SIGN -> U+00C5 */
    EXPECT(t, "A\xCC\x8A", 0, 0xC3, 0x85);
    EXPECT(t, "\xC3\xA9", 0, 0xC3, 0xA9);
    EXPECT(t, "\xEF\xAC\x81", 0, 0xEF, 0xAC, 0x81);        /* U+FB01 ligature: unchanged by NFC */
    EXPECT(t, "\xE1\x84\x80\xE1\x85\xA1", 0, 0xEA, 0xB0, 0x80);   /* jamo U+1100 U+1161 -> U+AC00 */
    EXPECT(t, "plain ascii", 0, B('p'), B('l'), B('a'), B('i'), B('n'), B(' '), B('a'), B('s'), B('c'), B('i'), B('i'));
    ib_tokenizer_free(t);
    t = load(write_tok("n2.json", NULL, 0, NULL, 0, 0, 0, "{\"normalizer\": {\"type\": \"NFD\"}}"));
    EXPECT(t, "\xC3\xA9", 0, B('e'), 0xCC, 0x81);
    ib_tokenizer_free(t);
    t = load(write_tok("n3.json", NULL, 0, NULL, 0, 0, 0, "{\"normalizer\": {\"type\": \"NFKC\"}}"));
    EXPECT(t, "\xEF\xAC\x81", 0, B('f'), B('i'));         /* ﬁ -> fi */
    EXPECT(t, "x\xC2\xB2", 0, B('x'), B('2'));            /* ² -> 2 (below U+0300, still mapped) */
    ib_tokenizer_free(t);
    t = load(write_tok("n4.json", NULL, 0, NULL, 0, 0, 0, "{\"normalizer\": {\"type\": \"NFKD\"}}"));
    EXPECT(t, "\xC3\xA9", 0, B('e'), 0xCC, 0x81);
    ib_tokenizer_free(t);
    t = load(write_tok("n5.json", NULL, 0, NULL, 0, 0, 0,
                       "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFD\"}, {\"type\": \"NFC\"}]}}"));
    EXPECT(t, "e\xCC\x81", 0, 0xC3, 0xA9);
    ib_tokenizer_free(t);
}

/* ---------------------------------------------------------------- added tokens */

static const char ADDED_TOP[] =
    "{\"normalizer\": {\"type\": \"NFC\"}, \"added_tokens\": ["
    "{\"id\": 300, \"content\": \"<x>\", \"lstrip\": true, \"rstrip\": false, \"single_word\": false, \"normalized\": false, \"special\": true},"
    "{\"id\": 301, \"content\": \"<y>\", \"lstrip\": false, \"rstrip\": true, \"single_word\": false, \"normalized\": false, \"special\": true},"
    "{\"id\": 302, \"content\": \"<w>\", \"lstrip\": false, \"rstrip\": false, \"single_word\": true, \"normalized\": false, \"special\": false},"
    "{\"id\": 303, \"content\": \"<s>\", \"lstrip\": false, \"rstrip\": false, \"single_word\": false, \"normalized\": false, \"special\": true},"
    "{\"id\": 304, \"content\": \"\\u00e9\", \"lstrip\": false, \"rstrip\": false, \"single_word\": false, \"normalized\": true, \"special\": false},"
    "{\"id\": 305, \"content\": \"ab\", \"special\": false, \"normalized\": false},"
    "{\"id\": 306, \"content\": \"bcd\", \"special\": false, \"normalized\": false},"
    "{\"id\": 307, \"content\": \"<s><s>\", \"special\": true, \"normalized\": false}]}";

static void test_added(void) {
    ib_tokenizer *t = load(write_tok("a1.json", NULL, 0, NULL, 0, 0, 0, ADDED_TOP));
    EXPECT(t, "abcd", 0, 305, B('c'), B('d'));            /* leftmost wins over the longer bcd */
    EXPECT(t, "xbcd", 0, B('x'), 306);
    EXPECT(t, "a <s> b", 0, B('a'), B(' '), 303, B(' '), B('b'));
    EXPECT(t, "<s><s><s>", 0, 307, 303);                  /* longest at each position */
    EXPECT(t, "a  <x>b", 0, B('a'), 300, B('b'));         /* lstrip swallows the spaces before */
    EXPECT(t, "\xE3\x80\x80<x>", 0, 300);                 /* … Unicode spaces too */
    EXPECT(t, "a<y> \t b", 0, B('a'), 301, B('b'));       /* rstrip swallows the spaces after */
    EXPECT(t, "<y>  <x>", 0, 301, 300);
    EXPECT(t, " <w> ", 0, B(' '), 302, B(' '));           /* single_word: alone */
    EXPECT(t, "<w>", 0, 302);
    EXPECT(t, "a<w>", 0, B('a'), B('<'), B('w'), B('>'));  /* touching a word character: text */
    EXPECT(t, "<w>b", 0, B('<'), B('w'), B('>'), B('b'));
    EXPECT(t, "-<w>.", 0, B('-'), 302, B('.'));
    EXPECT(t, "e\xCC\x81", 0, 304);                       /* normalized token, matched after NFC */
    EXPECT(t, "\xC3\xA9", 0, 304);
    EXPECT(t, "<s", 0, B('<'), B('s'));
    /* split_special: special tokens are text; added tokens that are not special still match */
    EXPECT(t, "<s>ab", IB_TOKENIZE_SPLIT_SPECIAL, B('<'), B('s'), B('>'), 305);
    EXPECT(t, "<w>", IB_TOKENIZE_SPLIT_SPECIAL, 302);
    if (t) {
        CHECK(ib_tokenizer_is_special(t, 303) && !ib_tokenizer_is_special(t, 305) && !ib_tokenizer_is_special(t, 65),
              "is_special");
        CHECK_EQ_INT(ib_tokenizer_special(t, "<w>"), 302);
        char out[8];
        CHECK(ib_tokenizer_decode(t, 300, out, 8) == 3 && !memcmp(out, "<x>", 3), "added token decodes to content");
    }
    ib_tokenizer_free(t);
}

/* ---------------------------------------------------------------- special tokens added around a text */

static void test_post(void) {
    static const char top[] =
        "{\"added_tokens\": [{\"id\": 310, \"content\": \"<bos>\", \"special\": true}, {\"id\": 311, \"content\": \"<eos>\", \"special\": true}],"
        " \"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\", \"trim_offsets\": false},"
        " {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<bos>\", \"type_id\": 0}},"
        " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<eos>\", \"type_id\": 0}}],"
        " \"pair\": [], \"special_tokens\": {\"<bos>\": {\"id\": \"<bos>\", \"ids\": [310], \"tokens\": [\"<bos>\"]},"
        " \"<eos>\": {\"id\": \"<eos>\", \"ids\": [311], \"tokens\": [\"<eos>\"]}}}]}}";
    ib_tokenizer *t = load(write_tok("p1.json", NULL, 0, NULL, 0, 0, 0, top));
    EXPECT(t, "hi", 0, B('h'), B('i'));
    EXPECT(t, "hi", IB_TOKENIZE_ADD_SPECIAL, 310, B('h'), B('i'), 311);
    EXPECTN(t, "", 0, IB_TOKENIZE_ADD_SPECIAL, 310, 311);
    ib_tokenizer_free(t);

    /* tokenizer_config.json add_bos_token (no template): read beside a file named tokenizer.json */
    char dir[128], p[192];
    snprintf(dir, sizeof dir, "%s/cfg", tmpdir);
    mkdir(dir, 0700);
    static const char top2[] = "{\"added_tokens\": [{\"id\": 310, \"content\": \"<bos>\", \"special\": true},"
                               " {\"id\": 311, \"content\": \"<eos>\", \"special\": true}]}";
    write_tok("cfg/tokenizer.json", NULL, 0, NULL, 0, 0, 0, top2);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"bos_token\": {\"content\": \"<bos>\", \"lstrip\": false}, \"eos_token\": \"<eos>\", \"add_bos_token\": true,"
          " \"model_max_length\": 1000000000000000019884624838656}", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    t = load(p);
    EXPECT(t, "hi", IB_TOKENIZE_ADD_SPECIAL, 310, B('h'), B('i'));
    EXPECT(t, "hi", 0, B('h'), B('i'));
    if (t) CHECK_EQ_INT(ib_tokenizer_eos(t), 311);
    ib_tokenizer_free(t);
    /* the same file under another name stands alone: no config, nothing added */
    write_tok("cfg/other.json", NULL, 0, NULL, 0, 0, 0, top2);
    snprintf(p, sizeof p, "%s/other.json", dir);
    t = load(p);
    EXPECT(t, "hi", IB_TOKENIZE_ADD_SPECIAL, B('h'), B('i'));
    if (t) CHECK_EQ_INT(ib_tokenizer_eos(t), -1);
    ib_tokenizer_free(t);
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "other.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* ---------------------------------------------------------------- invalid UTF-8 */

static void test_invalid_utf8(void) {
    static const char *const extra[] = {"\xFF\xFF", "a\xFF", "\xE6\x97"};
    static const mpair mg[] = {{"\xFF", "\xFF"}, {"a", "\xFF"}, {"\xE6", "\x97"}};
    ib_tokenizer *t = load(write_tok("u1.json", extra, 3, mg, 3, 0, 0, "{\"normalizer\": {\"type\": \"NFC\"}}"));
    EXPECT(t, "\xFF\xFF", 0, X(0));                   /* an invalid run is one piece: merges apply inside it */
    EXPECT(t, "\xFF\xFF\xFF", 0, X(0), 0xFF);
    EXPECT(t, "a\xFF", 0, B('a'), 0xFF);              /* … but never across into valid text */
    EXPECT(t, "\xE6\x97", 0, X(2));                   /* a truncated character */
    EXPECT(t, "\xE6\x97\xA5", 0, X(2), 0xA5);         /* the complete character is valid text (merges as usual) */
    EXPECT(t, "e\xCC\x81\xFF" "e\xCC\x81", 0, 0xC3, 0xA9, 0xFF, 0xC3, 0xA9);   /* valid runs still normalized */
    EXPECTN(t, "a\0b", 3, 0, B('a'), 0, B('b'));      /* NUL is an ordinary character */
    ib_tokenizer_free(t);
    /* any bytes round-trip (no normalizer here: NFC may compose random combining marks) */
    t = load(write_tok("u2.json", extra, 3, mg, 3, 0, 0, NULL));
    if (t) {
        uint64_t st = 99;
        int bad = 0;
        for (int trial = 0; trial < 200; trial++) {
            char buf[300], back[300];
            int32_t ids[300];
            size_t n = (size_t)(trial % 290) + 1;
            for (size_t i = 0; i < n; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                int r = (int)(st >> 56);
                buf[i] = (char)(r < 128 ? "ab\xFF\xE6\x97\xA5 a"[r % 8] : r);   /* bias towards the merges */
            }
            int k = ib_tokenizer_encode(t, buf, n, ids, 300);
            size_t at = 0;
            for (int i = 0; i < k && at <= n; i++) {
                int w = ib_tokenizer_decode(t, ids[i], back + at, (int)(sizeof back - at));
                at += w > 0 ? (size_t)w : 0;
            }
            if (k <= 0 || at != n || memcmp(back, buf, n)) bad++;
        }
        CHECK_EQ_INT(bad, 0);
    }
    ib_tokenizer_free(t);
}

/* ---------------------------------------------------------------- cache and threads */

typedef struct job {
    const ib_tokenizer *t;
    char (*texts)[200];
    int32_t (*want)[200];
    int *nwant;
    int n, bad;
} job;

static void *worker(void *arg) {
    job *j = arg;
    for (int rep = 0; rep < 20; rep++)
        for (int i = 0; i < j->n; i++) {
            int32_t got[200];
            int k = ib_tokenizer_encode(j->t, j->texts[i], strlen(j->texts[i]), got, 200);
            if (k != j->nwant[i] || memcmp(got, j->want[i], (size_t)k * sizeof *got)) j->bad++;
        }
    return NULL;
}

static void test_cache_threads(void) {
    ib_tokenizer *t = load(write_tok("c1.json", MERGE_EXTRA, 7, MERGES, 6, 0, 0,
                                     "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}}"));
    if (!t) return;
    enum { N = 64 };
    static char texts[N][200];
    static int32_t want[N][200];
    static int nwant[N];
    static const char *const words[] = {"abc", "aaaa", "bcd", "cab", "abcd", "a", "dd", "aab", "b"};
    uint64_t st = 7;
    for (int i = 0; i < N; i++) {
        texts[i][0] = '\0';
        for (int w = 0; w < 12; w++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            strcat(texts[i], words[(st >> 40) % 9]);
            strcat(texts[i], (st >> 20) % 3 ? " " : "");
        }
    }
    /* cache off: the reference; cache on (cold, then warm) must agree */
    ib_tokenizer_set_cache(t, 0);
    for (int i = 0; i < N; i++) nwant[i] = ib_tokenizer_encode(t, texts[i], strlen(texts[i]), want[i], 200);
    ib_tokenizer_set_cache(t, 1);
    int bad = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < N; i++) {
            int32_t got[200];
            int k = ib_tokenizer_encode(t, texts[i], strlen(texts[i]), got, 200);
            if (k != nwant[i] || memcmp(got, want[i], (size_t)k * sizeof *got)) bad++;
        }
    CHECK_EQ_INT(bad, 0);
    unsigned long hits, misses;
    ib_tokenizer_cache_stats(t, &hits, &misses);
    CHECK(hits > 0 && misses > 0, "cache used: %lu hits, %lu misses", hits, misses);
    /* spot-check one text by hand: "abc aaaa" -> "abc" " aaaa" -> abc | ' ' aaaa */
    EXPECT(t, "abc aaaa", 0, X(2), B(' '), X(4));
    /* four threads on one tokenizer */
    pthread_t th[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, texts, want, nwant, N, 0};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    int tbad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        tbad += jobs[i].bad;
    }
    CHECK_EQ_INT(tbad, 0);
    ib_tokenizer_free(t);
}

/* ---------------------------------------------------------------- SentencePiece style */

/* A byte-fallback tokenizer: <0x00>..<0xFF> at ids 0..255, then ▁ 256, a 257, b 258, ▁a 259, ab 260,
 * ▁ab 261, a▁ 262; merges a▁ (rank 0), a b (1), ▁ ab (2), ▁ a (3). pre_tokenizer (or normalizer) as given. */
static ib_tokenizer *spm_tok(const char *name, const char *normalizer, const char *pre) {
    char path[160], json[8192];
    int o = snprintf(json, sizeof json, "{\"normalizer\": %s, \"pre_tokenizer\": %s, \"decoder\": {\"type\": \"Sequence\", "
                     "\"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"}, \"content\": \" \"}, "
                     "{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}, \"added_tokens\": [{\"id\": 263, \"content\": \"<x>\", "
                     "\"special\": true}], \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": null, "
                     "\"vocab\": {", normalizer, pre);
    for (int b = 0; b < 256; b++) o += snprintf(json + o, sizeof json - (size_t)o, "\"<0x%02X>\": %d, ", b, b);
    snprintf(json + o, sizeof json - (size_t)o, "\"\u2581\": 256, \"a\": 257, \"b\": 258, \"\u2581a\": 259, \"ab\": 260, "
             "\"\u2581ab\": 261, \"a\u2581\": 262, \"<x>\": 263}, \"merges\": [[\"a\", \"\u2581\"], [\"a\", \"b\"], "
             "[\"\u2581\", \"ab\"], [\"\u2581\", \"a\"]]}}");
    snprintf(path, sizeof path, "%s/%s.json", tmpdir, name);
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
    return load(path);
}

static void test_spm(void) {
    const char *ms = "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"%s\", \"split\": %s}";
    char pre[200];
    /* Gemma: Replace(" ", "▁") and no pre-tokenizer: one word; "a▁" merges first */
    ib_tokenizer *t = spm_tok("sp1", "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}", "null");
    EXPECT(t, "a  b", 0, 262, 256, 258);
    EXPECT(t, " ab", 0, 261);
    EXPECT(t, "\xC3\xA9" "b", 0, 0xC3, 0xA9, 258);         /* é has no token: its bytes */
    EXPECTN(t, "a\xFF", 2, 0, 257, 0xFF);               /* an invalid byte: its byte token */
    EXPECT(t, "<x> ab", 0, 263, 261);
    char out[16];
    CHECK(ib_tokenizer_decode(t, 261, out, 16) == 3 && !memcmp(out, " ab", 3), "decode of \u2581ab is \" ab\"");
    CHECK(ib_tokenizer_decode(t, 0xC3, out, 16) == 1 && (unsigned char)out[0] == 0xC3, "<0xC3> decodes to the byte");
    ib_tokenizer_free(t);
    /* Metaspace split: the word is cut before every ▁ (Hugging Face's MergedWithNext), so "a▁" cannot form */
    snprintf(pre, sizeof pre, ms, "never", "true");
    t = spm_tok("sp2", "null", pre);
    EXPECT(t, "a  b", 0, 257, 256, 256, 258);
    EXPECT(t, " ab ", 0, 261, 256);
    ib_tokenizer_free(t);
    snprintf(pre, sizeof pre, ms, "never", "false");
    t = spm_tok("sp3", "null", pre);
    EXPECT(t, "a  b", 0, 262, 256, 258);
    ib_tokenizer_free(t);
    /* prepend_scheme: always before every piece of text; first only at the start of the input */
    snprintf(pre, sizeof pre, ms, "always", "true");
    t = spm_tok("sp4", "null", pre);
    EXPECT(t, "ab", 0, 261);
    EXPECT(t, " ab", 0, 261);                             /* already starts with ▁ */
    EXPECT(t, "ab<x>ab", 0, 261, 263, 261);
    ib_tokenizer_free(t);
    snprintf(pre, sizeof pre, ms, "first", "true");
    t = spm_tok("sp5", "null", pre);
    EXPECT(t, "ab<x>ab", 0, 261, 263, 260);
    EXPECT(t, "<x>ab", 0, 263, 260);
    ib_tokenizer_free(t);
    /* Prepend + Replace (Llama 2's normalizer): every run of text gets the ▁ */
    t = spm_tok("sp6", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"}, "
                "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]}", "null");
    EXPECT(t, "ab<x>ab", 0, 261, 263, 261);
    ib_tokenizer_free(t);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ib_bpe_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_merges();
    test_split();
    test_regex();
    test_bytelevel();
    test_normalizers();
    test_added();
    test_post();
    test_invalid_utf8();
    test_cache_threads();
    test_spm();
    static const char *const files[] = {"sp1", "sp2", "sp3", "sp4", "sp5", "sp6","m1", "m2", "m3", "m4", "m5", "m6", "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8",
                                        "r1", "r2", "r3", "r4", "r5", "r6", "b1", "b2", "b3", "b4", "n1", "n2", "n3", "n4", "n5",
                                        "a1", "p1", "u1", "u2", "c1"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s/%s.json", tmpdir, files[i]);
        unlink(p);
    }
    CHECK(rmdir(tmpdir) == 0, "temporary directory %s not empty", tmpdir);
    TEST_MAIN_END("test_bpe");
}
