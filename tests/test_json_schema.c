/*
 * test_json_schema.c — response_format json_schema's compiler and reader (src/server/json_schema.c):
 *   - schemas outside the subset refused with a message naming the keyword or value;
 *   - texts accepted or refused byte by byte against hand-written schemas (positive and negative);
 *   - the vocabulary walk (ib_schema_mask, with its shared prefixes and its plain-string shortcut)
 *     against a token-by-token reference on a synthetic vocabulary, along seeded random walks whose
 *     finished texts must parse (jansson) and satisfy the schema (a validator written here apart);
 *   - stop ids allowed exactly when the value is whole.
 * `test_json_schema --bench TOKENIZER_JSON` times the mask over a real vocabulary (e.g. Qwen3's
 * 151,669 tokens) along a realistic reply, for json_schema and json_object.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "server/api.h"
#include "test_rng.h"
#include "tokenizer/tokenizer.h"

/* A compiled reader over schema text js; NULL (and the message in msg) when it does not compile. */
static ib_schema_run *run_of(const char *js, char *msg, size_t msz) {
    json_error_t je;
    json_t *j = json_loads(js, JSON_DECODE_ANY, &je);
    if (!j) {
        snprintf(msg, msz, "test schema is not JSON: %s", je.text);
        return NULL;
    }
    ib_schema *sc;
    msg[0] = 0;
    int rc = ib_schema_compile(j, &sc, msg, msz);
    json_decref(j);
    return rc ? NULL : ib_schema_run_new(sc);
}

/* 1 when text is a whole value of schema js (every byte accepted, done at the end), 0 otherwise. */
static int accepts(const char *js, const char *text) {
    char msg[256];
    ib_schema_run *r = run_of(js, msg, sizeof msg);
    if (!r) {
        fprintf(stderr, "schema does not compile: %s\n", msg);
        return -1;
    }
    int ok = 1;
    for (const char *p = text; *p && ok; p++) ok = ib_schema_run_step(r, (unsigned char)*p) == 0;
    ok = ok && ib_schema_run_done(r);
    ib_schema_run_free(r);
    return ok;
}

/* The compile message for schema js ("" when it compiles). */
static const char *compile_msg(const char *js) {
    static char msg[512];
    ib_schema_run *r = run_of(js, msg, sizeof msg);
    if (r) {
        ib_schema_run_free(r);
        return "";
    }
    return msg;
}

/* ---------------------------------------------------------------- an independent validator */

/* Whether JSON value v satisfies schema s (the subset; $ref through root). */
static int valid(json_t *v, json_t *s, json_t *root, int depth) {
    if (depth > 64) return 0;
    if (json_is_true(s)) return 1;
    json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const char *r = json_string_value(x);
        if (!strcmp(r, "#")) return valid(v, root, root, depth + 1);
        const char *pre = !strncmp(r, "#/$defs/", 8) ? "$defs" : "definitions";
        return valid(v, json_object_get(json_object_get(root, pre), strchr(r + 2, '/') + 1), root, depth + 1);
    }
    if ((x = json_object_get(s, "anyOf"))) {
        size_t i;
        json_t *a;
        json_array_foreach(x, i, a) if (valid(v, a, root, depth + 1)) return 1;
        return 0;
    }
    if ((x = json_object_get(s, "const")) && !json_equal(x, v)) return 0;
    if ((x = json_object_get(s, "enum"))) {
        int any = 0;
        size_t i;
        json_t *a;
        json_array_foreach(x, i, a) any |= json_equal(a, v);
        if (!any) return 0;
    }
    if ((x = json_object_get(s, "type"))) {
        int any = 0;
        for (size_t i = 0; i < (json_is_array(x) ? json_array_size(x) : 1); i++) {
            const char *t = json_string_value(json_is_array(x) ? json_array_get(x, i) : x);
            any |= (!strcmp(t, "object") && json_is_object(v)) || (!strcmp(t, "array") && json_is_array(v)) ||
                   (!strcmp(t, "string") && json_is_string(v)) || (!strcmp(t, "number") && json_is_number(v)) ||
                   (!strcmp(t, "integer") && json_is_integer(v)) || (!strcmp(t, "boolean") && json_is_boolean(v)) ||
                   (!strcmp(t, "null") && json_is_null(v));
        }
        if (!any) return 0;
    }
    if (json_is_object(v)) {
        json_t *props = json_object_get(s, "properties"), *ap = json_object_get(s, "additionalProperties");
        const char *k;
        json_t *a;
        json_object_foreach(v, k, a) {
            json_t *ps = json_object_get(props, k);
            if (ps ? !valid(a, ps, root, depth + 1) : ap && (json_is_false(ap) || !valid(a, ap, root, depth + 1)))
                return 0;
        }
        size_t i;
        json_array_foreach(json_object_get(s, "required"), i, a) if (!json_object_get(v, json_string_value(a))) return 0;
    }
    if (json_is_array(v)) {
        json_t *it = json_object_get(s, "items"), *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        if (mn && (long long)json_array_size(v) < json_integer_value(mn)) return 0;
        if (mx && (long long)json_array_size(v) > json_integer_value(mx)) return 0;
        size_t i;
        json_t *a;
        json_array_foreach(v, i, a) if (it && !valid(a, it, root, depth + 1)) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- a synthetic vocabulary */

static const char *const extra_tokens[] = {
    "{", "}", "[", "]", "\"", "\":", "\": \"", "\",", "\", \"", "{\"", "\"}", "\"]", "[\"", "\":\"", ", ", ",\"",
    "name", "na", "me", "\"name\"", "age", "\"age\":", "tags", "kind", "id", "children", "value", "true", "false",
    "null", "nu", "ll", "tr", "12", "-1", "0.5", "e+", "1e", "007", "\\n", "\\u00", "\\\"", "\\", "  ", "\n",
    " \"", "\xc3\xa9", "\xc3", "\xa9", "\xe2\x82\xac", "\xe2\x82", "\xf0\x9f\x98\x80", "hello world", "\"hello",
    "red", "green", "\"red\"", "\"gr", "blue\"", "}}", "]}", "}]", "},{", "\x01", "\x7f", "<eos>", "a\"b", "}\"",
    NULL};
#define VOCAB_EOS 0

typedef struct tvocab {
    char **tok;
    int *len;
    int n;
} tvocab;

/* id 0 "<eos>" (stop id, its text like a special token's), then bytes 0x20..0x7e, then extra_tokens. */
static void tvocab_make(tvocab *t) {
    t->tok = calloc(256, sizeof *t->tok);
    t->len = calloc(256, sizeof *t->len);
    t->n = 0;
    t->tok[t->n] = strdup("<eos>"), t->len[t->n++] = 5;
    for (int c = 0x20; c < 0x7f; c++) {
        char b[2] = {(char)c, 0};
        t->tok[t->n] = strdup(b), t->len[t->n++] = 1;
    }
    for (int i = 0; extra_tokens[i]; i++) t->tok[t->n] = strdup(extra_tokens[i]), t->len[t->n] = (int)strlen(extra_tokens[i]), t->n++;
}

static int tvocab_bytes(void *ctx, int32_t id, char *buf, int cap) {
    tvocab *t = ctx;
    memcpy(buf, t->tok[id], (size_t)t->len[id]);
    return t->len[id];
}

/* The reference: token id's verdict after text (len bytes), stepping a fresh reader byte by byte. */
static int ref_ok(const char *js, const char *text, size_t len, const tvocab *tv, int id) {
    char msg[256];
    ib_schema_run *r = run_of(js, msg, sizeof msg);
    int ok = 1;
    for (size_t i = 0; i < len && ok; i++) ok = !ib_schema_run_step(r, (unsigned char)text[i]);
    for (int i = 0; i < tv->len[id] && ok; i++) ok = !ib_schema_run_step(r, (unsigned char)tv->tok[id][i]);
    ib_schema_run_free(r);
    return ok && tv->len[id] > 0;
}

/* Random walks over schema js: at each step the mask must equal the reference for every token; the
 * walk draws an allowed token. A walk that gets to a whole value is parsed and validated. Returns the
 * walks that finished. */
static int walks(const char *js, const tvocab *tv, const ib_json_vocab *v, int n_walks, int max_steps) {
    int finished = 0;
    json_t *schema = json_loads(js, 0, NULL);
    for (int w = 0; w < n_walks; w++) {
        char msg[256];
        ib_schema_run *r = run_of(js, msg, sizeof msg);
        ib_json_state st;
        ib_json_init(&st);
        st.run = r;
        char text[8192];
        size_t len = 0;
        float logits[256];
        int mismatches = 0;
        for (int step = 0; step < max_steps; step++) {
            for (int t = 0; t < tv->n; t++) logits[t] = 1.0f;
            int32_t stop = VOCAB_EOS;
            int allowed = ib_json_mask(&st, v, logits, tv->n, &stop, 1);
            int done = ib_json_done(&st), count = 0;
            for (int t = 0; t < tv->n; t++) {
                int want = t == VOCAB_EOS ? done : ref_ok(js, text, len, tv, t);
                int got = !isinf(logits[t]);
                /* once nothing but whitespace can follow, only the stop id stays: the reference's
                 * whitespace tokens are then refused in favour of the stop */
                if (done && t != VOCAB_EOS && want && !got) {
                    int ws_only = 1;
                    for (int i = 0; i < tv->len[t]; i++) ws_only &= strchr(" \t\n\r", tv->tok[t][i]) != NULL;
                    if (ws_only) want = 0;
                }
                if (want != got && mismatches++ < 3)
                    fprintf(stderr, "walk %d step %d token %d '%s' after '%.*s': mask %d reference %d\n", w, step, t,
                            tv->tok[t], (int)len, text, got, want);
                count += got;
            }
            CHECK_EQ_INT(allowed, count);
            if (!count || mismatches) break;
            if (!isinf(logits[VOCAB_EOS]) && rndi(3) == 0) { /* end here */
                json_error_t je;
                text[len] = 0;
                json_t *val = json_loadb(text, len, JSON_DECODE_ANY, &je);
                CHECK(val != NULL, "finished text is not JSON: %s (%s)", text, je.text);
                CHECK(val && valid(val, schema, schema, 0), "finished text does not satisfy the schema: %s", text);
                json_decref(val);
                finished++;
                break;
            }
            int pick, tries = 0;
            do pick = rndi(tv->n);
            while ((isinf(logits[pick]) || pick == VOCAB_EOS) && ++tries < 100000);
            if (isinf(logits[pick]) || pick == VOCAB_EOS) break;
            if (len + (size_t)tv->len[pick] >= sizeof text - 1) break;
            for (int i = 0; i < tv->len[pick]; i++) CHECK(ib_json_step(&st, (unsigned char)tv->tok[pick][i]) == 0, "step");
            memcpy(text + len, tv->tok[pick], (size_t)tv->len[pick]);
            len += (size_t)tv->len[pick];
        }
        CHECK(mismatches == 0, "walk %d over %s: %d mask mismatches", w, js, mismatches);
        ib_json_release(&st);
    }
    json_decref(schema);
    return finished;
}

/* ---------------------------------------------------------------- schemas */

static const char *const PERSON =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"red\",\"green\"]},\"maxItems\":2},"
    "\"kind\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"boolean\"},{\"const\":{\"k\":[1,\"x\"]}}]}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
static const char *const TREE =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"number\"},"
    "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"value\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
static const char *const FREE = "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":[\"integer\",\"null\"]}},"
                                "\"additionalProperties\":{\"type\":\"string\"}}";

static void test_compile_errors(void) {
    struct { const char *schema, *needle; } bad[] = {
        {"{\"type\":\"integer\",\"minimum\":3}", "keyword 'minimum' is not supported"},
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "'pattern'"},
        {"{\"type\":\"string\",\"format\":\"date\"}", "'format'"},
        {"{\"oneOf\":[{\"type\":\"string\"}]}", "'oneOf'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3}}}", ".properties.a: keyword 'maxLength'"},
        {"{\"$ref\":\"#/$defs/missing\"}", "names no definition"},
        {"{\"$ref\":\"http://x/y\"}", "'$ref' must be"},
        {"{\"type\":\"object\",\"properties\":{\"a\":true},\"required\":[\"b\"]}", "required property 'b'"},
        {"{\"type\":\"strin\"}", "'type' must name"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems 3 > maxItems 2"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", "tuple"},
        {"{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}", "cycle"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$defs\":{}}}}", "root only"},
        {"{\"enum\":[]}", "'enum' must be"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", "no value"},
        {"{\"anyOf\":[{\"type\":\"string\"}],\"type\":\"string\"}", "'anyOf' beside"},
        {"3", "must be an object"},
        /* names quoted from the schema come back printable: a newline a space, a control byte \xNN */
        {"{\"type\":\"string\",\"x\\nkey\":1}", "keyword 'x key'"},
        {"{\"type\":\"object\",\"properties\":{\"p\\u0001\":{\"type\":\"string\",\"maxLength\":1}}}", ".properties.p\\x01: keyword"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *m = compile_msg(bad[i].schema);
        CHECK(strstr(m, bad[i].needle) != NULL, "%s: message '%s' lacks '%s'", bad[i].schema, m, bad[i].needle);
        CHECK(!strchr(m, '\n'), "one line: %s", m);
    }
    const char *good[] = {PERSON, TREE, FREE, "{}", "true", "{\"type\":\"string\",\"title\":\"t\",\"description\":\"d\"}",
                          "{\"definitions\":{\"x\":{\"type\":\"integer\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/x\"}}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) CHECK(!*compile_msg(good[i]), "%s: %s", good[i], compile_msg(good[i]));
    /* the response_format wrapper */
    struct { const char *rf, *needle; } fmt[] = {
        {"{\"type\":\"json_schema\"}", "must be an object with a name"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}", "name must be"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a b\",\"schema\":{}}}", "name must be"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{},\"strict\":1}}", "strict must be"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{},\"extra\":1}}", "json_schema.extra"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"number\",\"maximum\":1}}}", "'maximum'"},
        {"{\"type\":\"xml\"}", "response_format must be"},
        {"{\"type\":\"json_object\",\"json_schema\":{}}", "response_format.json_schema is not a field"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{}},\"strict\":true}", "response_format.strict"},
        /* a field name of the client's with a newline or a control byte comes back on one printable line */
        {"{\"type\":\"json_schema\",\"js\\n_schema\":{}}", "response_format.js _schema is not a field"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{},\"a\\u0001\\rb\":1}}",
         "json_schema.a\\x01 b is not a field"},
    };
    for (size_t i = 0; i < sizeof fmt / sizeof fmt[0]; i++) {
        char msg[512] = "";
        json_t *j = json_loads(fmt[i].rf, 0, NULL);
        int rc = ib_json_format_check(j, msg, sizeof msg);
        json_decref(j);
        CHECK(rc == -1 && strstr(msg, fmt[i].needle), "%s: rc %d message '%s' lacks '%s'", fmt[i].rf, rc, msg, fmt[i].needle);
        CHECK(!strchr(msg, '\n') && !strchr(msg, '\r'), "%s: message on one line: %s", fmt[i].rf, msg);
    }
    json_t *j = json_loads("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"P_1-x\",\"strict\":true,\"schema\":{\"type\":\"object\"}}}", 0, NULL);
    char msg[256] = "";
    CHECK_EQ_INT(ib_json_format_check(j, msg, sizeof msg), 0);
    ib_json_state s;
    CHECK_EQ_INT(ib_json_setup(&s, j), 1);
    CHECK(s.run != NULL, "a schema reader");
    ib_json_release(&s);
    json_decref(j);
}

static void test_accept(void) {
    struct { const char *schema, *text; int want; } cases[] = {
        {PERSON, "{\"name\":\"Ann\",\"age\":31}", 1},
        {PERSON, "{ \"age\" : -4 ,\n \"name\" : \"\\u00e9t\xc3\xa9\\n\" }", 1},
        {PERSON, "{\"name\":\"a\",\"age\":1,\"tags\":[\"red\",\"green\"],\"kind\":{\"k\":[1,\"x\"]}}", 1},
        {PERSON, "{\"name\":\"a\",\"age\":1,\"kind\":null}", 1},
        {PERSON, "{\"name\":\"a\",\"age\":1,\"kind\":false}", 1},
        {PERSON, "{\"name\":\"a\",\"age\":1,\"tags\":[]}", 1},
        {PERSON, "{\"name\":\"Ann\"}", 0},                              /* age required */
        {PERSON, "{\"name\":\"Ann\",\"age\":3.5}", 0},                  /* integer */
        {PERSON, "{\"name\":\"Ann\",\"age\":012}", 0},                  /* leading zero */
        {PERSON, "{\"name\":\"Ann\",\"age\":1,\"x\":1}", 0},            /* additionalProperties false */
        {PERSON, "{\"name\":\"Ann\",\"name\":\"Bo\",\"age\":1}", 0},    /* a key twice */
        {PERSON, "{\"name\":5,\"age\":1}", 0},
        {PERSON, "{\"name\":\"a\",\"age\":1,\"tags\":[\"blue\"]}", 0},  /* enum */
        {PERSON, "{\"name\":\"a\",\"age\":1,\"tags\":[\"red\",\"red\",\"red\"]}", 0}, /* maxItems */
        {PERSON, "{\"name\":\"a\",\"age\":1,\"kind\":{\"k\":[1]}}", 0}, /* const */
        {PERSON, "{\"name\":\"a\",\"age\":1,\"kind\":0}", 0},           /* anyOf */
        {PERSON, "{\"name\":\"\x01\",\"age\":1}", 0},                   /* control byte in a string */
        {PERSON, "{\"name\":\"\xc3\",\"age\":1}", 0},                   /* broken UTF-8 */
        {PERSON, "[]", 0},
        {PERSON, "{\"name\":\"a\",\"age\":1}x", 0},
        {TREE, "{\"value\":1.5e-3,\"children\":[{\"value\":-0},{\"value\":2,\"children\":[]}]}", 1},
        {TREE, "{\"value\":1,\"children\":[{\"value\":1},{\"value\":2},{\"value\":3}]}", 0},
        {TREE, "{\"children\":[]}", 0},
        {TREE, "{\"value\":1.}", 0},
        {FREE, "{\"id\":null,\"anything\":\"goes\",\"i\":\"x\"}", 1},
        {FREE, "{\"id\":7}", 1},
        {FREE, "{}", 1},
        {FREE, "{\"other\":1}", 0},                                     /* additionalProperties: string */
        {FREE, "{\"id\":\"7\"}", 0},
        {FREE, "{\"id\":1,\"id\":2}", 0},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}", "[1, 2]", 1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}", "[1]", 0},
        {"{\"type\":\"array\",\"maxItems\":0}", "[]", 1},
        {"{\"type\":\"array\",\"maxItems\":0}", "[1]", 0},
        {"{\"enum\":[\"a\",1,12,null,[true]]}", "12", 1},
        {"{\"enum\":[\"a\",1,12,null,[true]]}", "1", 1},
        {"{\"enum\":[\"a\",1,12,null,[true]]}", "[true]", 1},
        {"{\"enum\":[\"a\",1,12,null,[true]]}", "13", 0},
        {"{\"enum\":[\"a\",1,12,null,[true]]}", "\"b\"", 0},
        {"{\"type\":\"number\"}", "-12.5E+7", 1},
        {"{\"type\":\"number\"}", "-", 0},
        {"{\"type\":\"number\"}", "123456789012345", 1},
        {"{\"type\":\"number\"}", "1234567890123456", 0},           /* 16 integer digits */
        {"{\"type\":\"number\"}", "1e99", 1},
        {"{\"type\":\"number\"}", "1e100", 0},
        {"{\"type\":\"number\"}", "0.123456789012345", 1},
        {"{\"type\":\"number\"}", "0.1234567890123456", 0},
        {"{\"type\":\"boolean\"}", "true", 1},
        {"{\"type\":\"boolean\"}", "null", 0},
        {"{\"type\":\"null\"}", "null", 1},
        {"{}", "{\"a\":[1,{\"b\":null}],\"c\":\"\\\\\"}", 1},
        {"{\"type\":\"object\"}", "{\"a\" \"b\"}", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"integer\"}},\"additionalProperties\":false}", "{\"a\\\"b\":1}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"integer\"}},\"additionalProperties\":false}", "{\"a\":1}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = accepts(cases[i].schema, cases[i].text);
        CHECK(got == cases[i].want, "case %zu: %s on '%s': got %d, want %d", i, cases[i].schema, cases[i].text, got,
              cases[i].want);
    }
    /* more readings than fit: the first 8 kept (here 8 alternatives of one reading fill the set while a
     * second reading is still to be stepped: it must be dropped, not written past the set) */
    CHECK_EQ_INT(accepts("{\"anyOf\":[{\"type\":\"array\",\"items\":{\"anyOf\":[{},{},{},{},{},{},{},{},{}]}},"
                         "{\"type\":\"array\"}]}", "[1,[2],{\"a\":3}]"), 1);
    /* 17 open containers: the reader refuses the 17th */
    CHECK_EQ_INT(accepts("{}", "[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]"), 0);
    CHECK_EQ_INT(accepts("{}", "[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]"), 1);
    /* whitespace is bounded (16 in a row) */
    CHECK_EQ_INT(accepts("{}", "                {}"), 1);
    CHECK_EQ_INT(accepts("{}", "                 {}"), 0);
}

static void test_mask(void) {
    tvocab tv;
    tvocab_make(&tv);
    ib_json_vocab v;
    CHECK_EQ_INT(ib_json_vocab_build(&v, tv.n, tvocab_bytes, &tv), 0);
    CHECK(v.n_np > 0 && v.n_np < v.n, "plain tokens split: %d of %d", v.n_np, v.n);
    const char *schemas[] = {PERSON, TREE, FREE, "{\"enum\":[\"a\",1,12,null,[true]]}",
                             "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}}"};
    int finished = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) finished += walks(schemas[i], &tv, &v, 8, 60);
    CHECK(finished >= 10, "only %d walks reached a whole value", finished);
    /* json_object mode (json_constraint.c's walk) against the token-by-token reference */
    int obj_mismatch = 0, obj_done = 0;
    for (int w = 0; w < 10; w++) {
        ib_json_state st;
        ib_json_init(&st);
        float lg[256];
        int32_t stop = VOCAB_EOS;
        for (int step = 0; step < 60; step++) {
            for (int t = 0; t < tv.n; t++) lg[t] = 1.0f;
            int allowed = ib_json_mask(&st, &v, lg, tv.n, &stop, 1), count = 0, done = ib_json_done(&st);
            for (int t = 0; t < tv.n; t++) {
                ib_json_state x = st;
                int want = t == VOCAB_EOS ? done : !done && tv.len[t] > 0;
                for (int i = 0; i < tv.len[t] && want && t != VOCAB_EOS; i++) want = !ib_json_step(&x, (unsigned char)tv.tok[t][i]);
                int got = !isinf(lg[t]);
                if (want != got && obj_mismatch++ < 3) fprintf(stderr, "json_object walk %d step %d token '%s': mask %d reference %d\n", w, step, tv.tok[t], got, want);
                count += got;
            }
            CHECK_EQ_INT(allowed, count);
            if (done) {
                obj_done++;
                break;
            }
            int pick;
            do pick = rndi(tv.n);
            while (isinf(lg[pick]));
            for (int i = 0; i < tv.len[pick]; i++) ib_json_step(&st, (unsigned char)tv.tok[pick][i]);
        }
    }
    CHECK(obj_mismatch == 0, "json_object: %d mask mismatches", obj_mismatch);
    CHECK(obj_done >= 1, "json_object: no walk completed an object");
    /* the stop id: refused until the value is whole, then alone */
    char msg[256];
    ib_json_state st;
    ib_json_init(&st);
    st.run = run_of("{\"type\":\"boolean\"}", msg, sizeof msg);
    float lg[256];
    int32_t stop = VOCAB_EOS;
    for (int t = 0; t < tv.n; t++) lg[t] = 0.5f;
    int n = ib_json_mask(&st, &v, lg, tv.n, &stop, 1);
    CHECK(isinf(lg[VOCAB_EOS]) && n > 0, "stop refused at the start (%d left)", n);
    for (const char *p = "false"; *p; p++) ib_json_step(&st, (unsigned char)*p);
    for (int t = 0; t < tv.n; t++) lg[t] = 0.5f;
    n = ib_json_mask(&st, &v, lg, tv.n, &stop, 1);
    CHECK(n == 1 && lg[VOCAB_EOS] == 0.5f, "only the stop after a whole value (%d left)", n);
    ib_json_release(&st);
    ib_json_vocab_free(&v);
    for (int i = 0; i < tv.n; i++) free(tv.tok[i]);
    free(tv.tok);
    free(tv.len);
}

/* ---------------------------------------------------------------- --bench */

static int tok_bytes(void *ctx, int32_t t, char *buf, int cap) { return ib_tokenizer_decode(ctx, t, buf, cap); }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Time ib_json_mask over the vocabulary of tokenizer file path along reply text (tokenized), for
 * format rf. Prints per-mask mean and max. */
static int bench_one(const ib_tokenizer *tk, const ib_json_vocab *v, const char *rf_text, const char *reply) {
    json_t *rf = json_loads(rf_text, 0, NULL);
    ib_json_state st;
    if (ib_json_setup(&st, rf) != 1) return 1;
    int32_t ids[4096];
    int n = ib_tokenizer_encode(tk, reply, strlen(reply), ids, 4096);
    float *lg = malloc((size_t)v->n * sizeof *lg);
    double total = 0, mx = 0, t_str = 0;
    int n_str = 0, ok = 1;
    int32_t stop = ib_tokenizer_eos(tk);
    for (int i = 0; i < n && ok; i++) {
        for (int t = 0; t < v->n; t++) lg[t] = 0.0f;
        double t0 = now();
        int left = ib_json_mask(&st, v, lg, v->n, &stop, 1);
        double dt = now() - t0;
        total += dt;
        if (dt > mx) mx = dt;
        if (st.run == NULL ? 0 : left > v->n / 2) t_str += dt, n_str++;
        ok = !isinf(lg[ids[i]]);
        for (size_t k = v->off[ids[i]]; ok && k < v->off[ids[i] + 1]; k++) ok = !ib_json_step(&st, (unsigned char)v->bytes[k]);
    }
    printf("%-11s %3d tokens: mask mean %7.1f us, max %7.1f us%s", st.run ? "json_schema" : "json_object", n,
           1e6 * total / n, 1e6 * mx, ok ? "" : "  (the reply was refused!)");
    if (n_str) printf("; inside strings (most tokens allowed) mean %.1f us over %d", 1e6 * t_str / n_str, n_str);
    printf("\n");
    ib_json_release(&st);
    json_decref(rf);
    free(lg);
    return !ok;
}

static int bench(const char *path) {
    ib_tokenizer *tk;
    ib_error err;
    if (ib_tokenizer_load(path, INT32_MAX, &tk, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ib_json_vocab v;
    double t0 = now();
    if (ib_json_vocab_build(&v, ib_tokenizer_n_ids(tk), tok_bytes, tk)) return 1;
    printf("vocabulary %d tokens (%d not plain, longest %d bytes), tables built in %.0f ms\n", v.n, v.n_np, v.maxlen,
           1e3 * (now() - t0));
    const char *reply = "{\"name\": \"Ada Lovelace, the first programmer of the Analytical Engine\", \"age\": 36, "
                        "\"tags\": [\"red\", \"green\"], \"kind\": {\"k\":[1,\"x\"]}}";
    char rf[4096];
    snprintf(rf, sizeof rf, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":%s}}", PERSON);
    int bad = bench_one(tk, &v, rf, reply);
    bad |= bench_one(tk, &v, "{\"type\":\"json_object\"}", reply);
    ib_json_vocab_free(&v);
    ib_tokenizer_free(tk);
    return bad;
}

int main(int argc, char **argv) {
    (void)rndf;
    if (argc == 3 && !strcmp(argv[1], "--bench")) return bench(argv[2]);
    test_compile_errors();
    test_accept();
    test_mask();
    TEST_MAIN_END("test_json_schema");
}
