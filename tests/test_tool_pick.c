/*
 * test_tool_pick.c — the reader of a tool_choice "required" reply (src/server/tool_pick.c):
 *   - replies written out by hand, accepted or refused byte by byte, and where the reply may end: a
 *     declared name and arguments of its schema; a name that is not declared, a prefix of one, a name
 *     past any anyOf limit (20 tools), arguments outside the schema, a second call with parallel off,
 *     a close and a second call with it on, a number no parser reads (a function without parameters);
 *   - the mask over a synthetic vocabulary (multi-byte tokens across the name, the arguments and the
 *     close) against the reference, each token's bytes stepped through a fresh reader, along random
 *     walks; every walk that stops is parsed here (jansson) and checked against its function's schema
 *     by a small validator of this file's own.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/api.h"
#include "test_rng.h"

/* (rndf is not drawn here) */
static float (*const unused_rndf)(void) __attribute__((unused)) = rndf;

static json_t *J(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fprintf(stderr, "test JSON does not parse: %s: %s\n", je.text, s);
    return j;
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"enum\":[\"Paris\",\"Rome\"]}},\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"set\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"on\":{\"type\":\"boolean\"},\"n\":{\"type\":\"integer\"}},\"required\":[\"on\"],\"additionalProperties\":false}}}]";

/* 20 tools t0..t19, each taking {} only. */
static json_t *twenty(void) {
    json_t *a = json_array();
    for (int i = 0; i < 20; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "t%d", i);
        json_array_append_new(a, json_pack("{s:s, s:{s:s, s:{s:s, s:b}}}", "type", "function", "function", "name", nm,
                                           "parameters", "type", "object", "additionalProperties", 0));
    }
    return a;
}

/* Step a fresh reader over tools, parallel, through text: 1 accepted and may end there, 2 accepted
 * and may not end, 0 refused. */
static int read_text(json_t *tools, int parallel, const char *text) {
    ib_json_state s;
    if (ib_tool_pick_setup(&s, tools, parallel) != 1) return -1;
    int ok = 1;
    for (const char *p = text; *p && ok; p++) ok = !ib_json_step(&s, (unsigned char)*p);
    int r = !ok ? 0 : ib_json_done(&s) ? 1 : 2;
    ib_json_release(&s);
    return r;
}

static void test_texts(void) {
    json_t *tools = J(TOOLS), *t20 = twenty();
    static const struct {
        const char *text;
        int parallel, want; /* want: 1 whole, 2 a prefix, 0 refused */
    } c[] = {
        {"get_weather\", \"arguments\": {\"city\": \"Rome\"}", 0, 1},
        {"get_weather\", \"arguments\": {\"city\":\"Paris\"}", 1, 1},
        {"get_weather\", \"arguments\": {\"city\": \"Rome\"", 0, 2},
        {"get_weather\", \"arguments\": ", 0, 2},
        {"get_", 0, 2},
        {"", 0, 2},
        {"get_weathe\"", 0, 0},              /* a prefix of a name is no name */
        {"nope", 0, 0},
        {"Get_time", 0, 0},
        {"get_weather\",\"arguments\":{}", 0, 0}, /* the key's spelling is the template's */
        {"get_weather\", \"arguments\": {\"city\": \"Berlin\"}", 0, 0},
        {"get_weather\", \"arguments\": {}", 0, 0},  /* city is required */
        {"get_weather\", \"arguments\": []", 0, 0},
        {"set\", \"arguments\": {\"on\": true, \"n\": -12}", 0, 1},
        {"set\", \"arguments\": {\"on\": 1}", 0, 0},
        {"set\", \"arguments\": {\"on\": true, \"x\": 1}", 0, 0},
        {"get_time\", \"arguments\": {\"any\": [1, {\"x\": null}], \"s\": \"\\u00e9\"}", 0, 1},
        {"get_time\", \"arguments\": {\"a\": 1e123", 0, 0},   /* bounded numbers: every parser reads them */
        {"get_time\", \"arguments\": {\"a\": 1234567890123456", 0, 0},
        /* after the arguments: with parallel off only the end; with it on the close, then the end or the next call */
        {"get_time\", \"arguments\": {}}", 0, 0},
        {"get_time\", \"arguments\": {} ", 0, 1},     /* whitespace after the arguments, as JSON readers take */
        {"get_time\", \"arguments\": {}                 ", 0, 0}, /* at most 16 bytes of it */
        {"get_time\", \"arguments\": {}}", 1, 2},
        {"get_time\", \"arguments\": {}}\n</tool_call>", 1, 1},
        {"get_time\", \"arguments\": {}}\n</tool_call>\n", 1, 2},
        {"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"", 1, 2},
        {"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"set\", \"arguments\": {\"on\": false}", 1, 1},
        {"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}", 1, 0},
        {"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"nope", 1, 0},
        {"get_time\", \"arguments\": {}}\n</tool_call>x", 1, 0},
        {"get_time\", \"arguments\": {}} ", 1, 0},
        {"get_time\", \"arguments\": {} }\n</tool_call>", 1, 1},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        int got = read_text(tools, c[i].parallel, c[i].text);
        CHECK(got == c[i].want, "'%s' (parallel %d): %d, want %d", c[i].text, c[i].parallel, got, c[i].want);
    }
    /* 20 tools (more than anyOf's 16 schemas or 8 live readings): every name reachable, t1 and t19 alike */
    static const struct {
        const char *text;
        int want;
    } d[] = {{"t19\", \"arguments\": {}", 1}, {"t1\", \"arguments\": {}", 1}, {"t0\", \"arguments\": {}", 1},
             {"t1", 2}, {"t20", 0}, {"t19\", \"arguments\": {\"a\": 1}", 0}, {"t\"", 0}};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++) {
        int got = read_text(t20, 0, d[i].text);
        CHECK(got == d[i].want, "20 tools, '%s': %d, want %d", d[i].text, got, d[i].want);
    }
    json_decref(tools);
    json_decref(t20);
}

/* ---------------------------------------------------------------- the mask against the reference */

static const char *const extra[] = {
    "get", "_weather", "get_weather\"", "get_time\", \"arguments\": {}", "\", \"", "arguments", "\": ", "\": {",
    "\": {\"", "\"city\": \"", "Rome", "Paris", "\"}", "}}", "}}\n", "\"}}", "}\n", "</tool_call>", "\n<tool_call>\n",
    "{\"name\": \"", "set\"", "true", "false", "\"on\": ", ", \"n\": ", "12", "-3", "}\n</tool_call>", "t19", "_", "  ",
    "<eos>", "\xc3\xa9", "get_time", "\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"set", NULL};
#define EOS 0

typedef struct tvocab {
    char *tok[256];
    int len[256], n;
} tvocab;

/* id 0 "<eos>" (the stop id), the bytes 0x20..0x7e and "\n", then the multi-byte tokens above. */
static void tv_make(tvocab *t) {
    t->n = 0;
    t->tok[t->n] = strdup("<eos>"), t->len[t->n++] = 5;
    for (int c = 0x20; c < 0x7f; c++) {
        char b[2] = {(char)c, 0};
        t->tok[t->n] = strdup(b), t->len[t->n++] = 1;
    }
    t->tok[t->n] = strdup("\n"), t->len[t->n++] = 1;
    for (int i = 0; extra[i]; i++) t->tok[t->n] = strdup(extra[i]), t->len[t->n] = (int)strlen(extra[i]), t->n++;
}

static int tv_bytes(void *ctx, int32_t id, char *buf, int cap) {
    tvocab *t = ctx;
    memcpy(buf, t->tok[id], (size_t)t->len[id]);
    return t->len[id];
}

/* The reference verdict on token id after text[len]: a fresh reader steps text, then the token; once
 * arguments are whole (the text does not end with a close) a token that begins with whitespace is
 * refused in favour of the stop (or the close), as json_schema replies end. */
static int ref_ok(json_t *tools, int parallel, const char *text, size_t len, const tvocab *tv, int id) {
    ib_json_state s;
    if (ib_tool_pick_setup(&s, tools, parallel) != 1) return -1;
    int ok = 1;
    for (size_t i = 0; i < len && ok; i++) ok = !ib_json_step(&s, (unsigned char)text[i]);
    if (ok && id != EOS && ib_json_done(&s) && !(len >= 12 && !memcmp(text + len - 12, "</tool_call>", 12)) &&
        strchr(" \t\n\r", tv->tok[id][0]))
        ok = 0;
    if (id == EOS) ok = ok && ib_json_done(&s);
    else
        for (int i = 0; i < tv->len[id] && ok; i++) ok = !ib_json_step(&s, (unsigned char)tv->tok[id][i]);
    ib_json_release(&s);
    return ok;
}

/* Whether JSON value v satisfies schema s of the subset the tools here use (type, properties, required,
 * additionalProperties false, enum of strings). */
static int valid(json_t *v, json_t *s) {
    const char *ty = json_string_value(json_object_get(s, "type"));
    if (ty && !strcmp(ty, "object") && !json_is_object(v)) return 0;
    if (ty && !strcmp(ty, "boolean") && !json_is_boolean(v)) return 0;
    if (ty && !strcmp(ty, "integer") && !json_is_integer(v)) return 0;
    json_t *en = json_object_get(s, "enum");
    if (en) {
        size_t i;
        json_t *e;
        int hit = 0;
        json_array_foreach(en, i, e) hit |= json_equal(e, v);
        if (!hit) return 0;
    }
    if (!json_is_object(v)) return 1;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"), *x;
    size_t i;
    json_array_foreach(req, i, x) if (!json_object_get(v, json_string_value(x))) return 0;
    const char *k;
    json_object_foreach(v, k, x) {
        json_t *ps = json_object_get(props, k);
        if (!ps && json_is_false(json_object_get(s, "additionalProperties"))) return 0;
        if (ps && !valid(x, ps)) return 0;
    }
    return 1;
}

/* A stopped reply read as the calls it holds: each declared, its arguments valid. Returns the calls,
 * 0 when one is not. */
static int calls_valid(json_t *tools, const char *text, size_t len) {
    char *full = malloc(len + 64);
    memcpy(full, "[{\"name\": \"", 11);
    size_t n = 11;
    /* the calls as one JSON array: "}\n</tool_call>\n<tool_call>\n{" joins two of them */
    for (size_t i = 0; i < len;) {
        static const char join[] = "}\n</tool_call>\n<tool_call>\n{";
        if (!strncmp(text + i, join, sizeof join - 1)) {
            memcpy(full + n, "}, {", 4), n += 4, i += sizeof join - 1;
            full = realloc(full, len + 64 + n);
        } else if (!strncmp(text + i, "}\n</tool_call>", 14) && i + 14 == len) {
            full[n++] = '}', i = len;
        } else
            full[n++] = text[i++];
    }
    if (len < 14 || strncmp(text + len - 14, "}\n</tool_call>", 14)) full[n++] = '}';
    full[n++] = ']';
    json_t *a = json_loadb(full, n, 0, NULL);
    int good = json_is_array(a) ? (int)json_array_size(a) : 0;
    size_t i, j;
    json_t *c, *t;
    json_array_foreach(a, i, c) {
        const char *nm = json_string_value(json_object_get(c, "name"));
        json_t *fn = NULL;
        json_array_foreach(tools, j, t) if (nm && !strcmp(nm, json_string_value(json_object_get(json_object_get(t, "function"), "name"))))
            fn = json_object_get(t, "function");
        json_t *params = json_object_get(fn, "parameters"), *args = json_object_get(c, "arguments");
        if (!fn || json_object_size(c) != 2 || !json_is_object(args) || (params && !valid(args, params))) good = 0;
    }
    if (!good) fprintf(stderr, "not valid calls: %.*s\n", (int)n, full);
    json_decref(a);
    free(full);
    return good;
}

static void test_mask(void) {
    tvocab tv;
    tv_make(&tv);
    ib_json_vocab v;
    CHECK_EQ_INT(ib_json_vocab_build(&v, tv.n, tv_bytes, &tv), 0);
    json_t *tools = J(TOOLS), *t20 = twenty();
    int stopped = 0, multi = 0, mismatches = 0;
    for (int w = 0; w < 48; w++) {
        json_t *tl = w % 4 == 3 ? t20 : tools;
        const int parallel = w % 2;
        ib_json_state st;
        CHECK_EQ_INT(ib_tool_pick_setup(&st, tl, parallel), 1);
        char text[4096];
        size_t len = 0;
        float lg[256];
        for (int step = 0; step < 200; step++) {
            for (int t = 0; t < tv.n; t++) lg[t] = 1.0f;
            int32_t stop = EOS;
            int allowed = ib_json_mask(&st, &v, lg, tv.n, &stop, 1), count = 0;
            for (int t = 0; t < tv.n; t++) {
                int want = ref_ok(tl, parallel, text, len, &tv, t), got = !isinf(lg[t]);
                if (want != got && mismatches++ < 5)
                    fprintf(stderr, "walk %d step %d token %d '%s' after '%.*s': mask %d, reference %d\n", w, step, t,
                            tv.tok[t], (int)len, text, got, want);
                count += got;
            }
            CHECK_EQ_INT(allowed, count);
            if (!count) break;
            if (!isinf(lg[EOS]) && rndi(3) == 0) {
                stopped++;
                multi += calls_valid(tl, text, len) > 1;
                CHECK(calls_valid(tl, text, len) >= 1, "walk %d stopped on no valid calls: %.*s", w, (int)len, text);
                break;
            }
            int pick, tries = 0;
            /* prefer the multi-byte tokens, so names and keys get written */
            do pick = rndi(4) ? 97 + rndi(tv.n - 97) : rndi(tv.n);
            while ((isinf(lg[pick]) || pick == EOS) && ++tries < 100000);
            if (isinf(lg[pick]) || pick == EOS || len + (size_t)tv.len[pick] >= sizeof text) break;
            for (int i = 0; i < tv.len[pick]; i++) CHECK(ib_json_step(&st, (unsigned char)tv.tok[pick][i]) == 0, "step");
            memcpy(text + len, tv.tok[pick], (size_t)tv.len[pick]);
            len += (size_t)tv.len[pick];
        }
        ib_json_release(&st);
    }
    CHECK(mismatches == 0, "%d mask mismatches", mismatches);
    CHECK(stopped >= 12, "only %d walks got to a reply that may end", stopped);
    CHECK(multi >= 1, "no walk wrote two calls (parallel)");
    /* the stop id alone after arguments with parallel off; refused while a name is spelled */
    ib_json_state st;
    ib_tool_pick_setup(&st, tools, 0);
    int32_t stop = EOS;
    float lg[256];
    for (int t = 0; t < tv.n; t++) lg[t] = 0.5f;
    int n = ib_json_mask(&st, &v, lg, tv.n, &stop, 1);
    /* at the start: the names' first bytes and tokens ('g', 's', "get", "get_weather\"", "set\"", "get_time", the
     * whole "get_time\", \"arguments\": {}"), nothing else */
    CHECK(isinf(lg[EOS]) && n == 7 && !isinf(lg[1 + 'g' - 0x20]) && !isinf(lg[1 + 's' - 0x20]) && isinf(lg[1 + 't' - 0x20]),
          "the start: the stop refused, 7 tokens left (%d)", n);
    for (const char *p = "get_time\", \"arguments\": {}"; *p; p++) ib_json_step(&st, (unsigned char)*p);
    for (int t = 0; t < tv.n; t++) lg[t] = 0.5f;
    n = ib_json_mask(&st, &v, lg, tv.n, &stop, 1);
    CHECK(n == 1 && lg[EOS] == 0.5f, "after the arguments, parallel off: the stop alone (%d left)", n);
    ib_json_release(&st);
    json_decref(tools);
    json_decref(t20);
    ib_json_vocab_free(&v);
    for (int i = 0; i < tv.n; i++) free(tv.tok[i]);
}

int main(void) {
    test_texts();
    test_mask();
    TEST_MAIN_END("test_tool_pick");
}
