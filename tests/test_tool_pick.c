/*
 * test_tool_pick.c — the reader of a tool_choice "required" reply (src/server/tool_pick.c):
 *   - replies written out by hand, accepted or refused byte by byte, and where the reply may end: a
 *     declared name and arguments of its schema; a name that is not declared, a prefix of one, a name
 *     past any anyOf limit (20 tools), arguments outside the schema, a second call with parallel off,
 *     a close and a second call with it on, a number no parser reads (a function without parameters);
 *   - the mask over a synthetic vocabulary (multi-byte tokens across the name, the arguments and the
 *     close) against the reference, each token's bytes stepped through a fresh reader, along random
 *     walks; every walk that stops is parsed here (jansson) and checked against its function's schema
 *     by a small validator of this file's own;
 *   - the byte-sorted walk the mask takes outside the arguments (a name, a close) against every token
 *     stepped on its own (ib_tool_pick_mask_stepped, the way the mask was computed before the walk),
 *     bit for bit with the count, on the states of random walks over a vocabulary of a few thousand
 *     tokens cut from replies (prefixes shared across a name, its arguments and the close, a token
 *     with no bytes, duplicates), with logits that are already -inf or NaN, stop lists with
 *     duplicates, ids outside the row and none at all, rows wider and narrower than the vocabulary,
 *     and a refused reply.
 * `test_tool_pick --bench TOKENIZER_JSON [REPS]` times the mask over a real vocabulary (e.g. Qwen3's
 * 151,669 tokens) along a two-call reply, the walk against per-token stepping alternately on each
 * state, by phase (name, arguments, close), and checks the two masks are the same bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "server/api.h"
#include "test_rng.h"
#include "tokenizer/tokenizer.h"

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
        char nm[16];
        snprintf(nm, sizeof nm, "t%d", i);
        json_array_append_new(a, json_pack("{s:s, s:{s:s, s:{s:s, s:b}}}", "type", "function", "function", "name", nm,
                                           "parameters", "type", "object", "additionalProperties", 0));
    }
    return a;
}

/* Step a fresh reader of form over tools, parallel, name_read through text: 1 accepted and may end
 * there, 2 accepted and may not end, 0 refused. */
static int read_form(ib_chat_tool_form form, json_t *tools, int parallel, const char *name_read, const char *text) {
    ib_json_state s;
    if (ib_tool_pick_setup(&s, form, tools, parallel, name_read) != 1) return -1;
    int ok = 1;
    for (const char *p = text; *p && ok; p++) ok = !ib_json_step(&s, (unsigned char)*p);
    int r = !ok ? 0 : ib_json_done(&s) ? 1 : 2;
    ib_json_release(&s);
    return r;
}

static int read_text(json_t *tools, int parallel, const char *text) { return read_form(IB_CHAT_TOOLS_QWEN, tools, parallel, NULL, text); }

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

/* Whether calls[i] is a call of name whose arguments text parses to the JSON of args. */
static int call_is(json_t *calls, size_t i, const char *name, const char *args) {
    json_t *f = json_object_get(json_array_get(calls, i), "function"), *want = J(args);
    const char *nm = json_string_value(json_object_get(f, "name")), *at = json_string_value(json_object_get(f, "arguments"));
    json_t *got = at ? json_loads(at, 0, NULL) : NULL;
    int ok = nm && !strcmp(nm, name) && got && want && json_equal(got, want);
    if (!ok) fprintf(stderr, "call %zu: %s %s, want %s %s\n", i, nm ? nm : "(none)", at ? at : "(none)", name, args);
    json_decref(got);
    json_decref(want);
    return ok;
}

/* Gemma 4's form: NAME{ARGS in its value syntax}, the close, the next call (gemma4_args.c). */
#define GQ "<|\"|>"
static void test_gemma_texts(void) {
    json_t *tools = J(TOOLS);
    const ib_chat_tool_form G = IB_CHAT_TOOLS_GEMMA4;
    static const struct {
        const char *name_read, *text;
        int parallel, want; /* want: 1 whole, 2 a prefix, 0 refused */
    } c[] = {
        {NULL, "get_weather{city:" GQ "Rome" GQ "}", 0, 1},
        {NULL, "get_weather{city:" GQ "Rome" GQ "}<tool_call|>", 0, 1},   /* the close may follow, then the end */
        {NULL, "get_weather{city:" GQ "Rome" GQ "}<tool_call|><", 0, 0},
        {NULL, "get_weather{city:" GQ "Rome" GQ "}<tool_call|><|tool_call>call:", 1, 2},
        {NULL, "get_weather{city:" GQ "Rome" GQ "}<tool_call|><|tool_call>call:set{on:true,n:-12}", 1, 1},
        {NULL, "get_weather{city:" GQ "Rome" GQ "}<tool_call|><|tool_call>call:set{on:true,n:-12}<tool_call|>", 1, 1},
        {NULL, "get_weather{city:" GQ "Paris" GQ "}<tool_call|><|tool_call>call:get_weather{}", 1, 0},
        {NULL, "get_weather{" GQ "city" GQ ":" GQ "Paris" GQ "}", 0, 1},   /* a key between delimiters */
        {NULL, "get_weather{city:" GQ "Berlin", 0, 0},                     /* the enum */
        {NULL, "get_weather{city:" GQ "Par", 0, 2},
        {NULL, "get_weather{city:" GQ "Par<", 0, 0},      /* a '<' neither of the text nor a close the enum takes */
        {NULL, "get_weather{city:" GQ "Paris<", 0, 2},    /* a close the enum takes */
        {NULL, "get_weather{city:" GQ "Paris<x", 0, 0},
        {NULL, "get_weather{}", 0, 0},                                     /* city is required */
        {NULL, "get_weather{city:\"Rome\"}", 0, 0},                       /* no JSON strings */
        {NULL, "get_weather{ city:" GQ "Rome" GQ "}", 0, 0},               /* no whitespace outside texts */
        {NULL, "get_weather{city:" GQ "Rome" GQ "} ", 0, 0},
        {NULL, "get_weather{", 0, 2},
        {NULL, "get_", 0, 2},
        {NULL, "get_time:", 0, 0},
        {NULL, "nope", 0, 0},
        {NULL, "get_time{}", 0, 1},
        {NULL, "get_time{}}", 0, 0},
        {NULL, "get_time{a:None,b:null,c:[1,2.5,-3e+20],d:{e:false,f:[]}}", 0, 1},
        {NULL, "get_time{a:Nonx", 0, 0},
        {NULL, "get_time{s:" GQ "a<b \"q\" \\ \xc3\xa9\n\t<" GQ "}", 0, 1},   /* '<', quotes, a backslash, control bytes */
        {NULL, "get_time{s:" GQ "a<|b", 0, 0},                                /* "<|" only closes */
        {NULL, "get_time{s:" GQ "\xc3" GQ "}", 0, 0},                         /* not UTF-8 */
        {NULL, "get_time{a b:1}", 0, 0},                                      /* a bare key has no blank */
        {NULL, "get_time{" GQ "a b" GQ ":1}", 0, 1},
        {NULL, "get_time{a\"b:1}", 0, 0},
        {NULL, "get_time{k-1.x:[" GQ GQ "]}", 0, 1},
        {NULL, "set{on:1}", 0, 0},
        {NULL, "set{on:true,x:1}", 0, 0},
        {NULL, "set{n:7,on:false}<tool_call|>", 0, 1},
        {NULL, "get_time{}<tool_call|><|tool_call>", 0, 0},                   /* one call with parallel off */
        /* a named function: the prompt holds its name */
        {"get_weather", "{city:" GQ "Paris" GQ "}<tool_call|>", 0, 1},
        {"get_weather", "set{", 0, 0},
        {"get_weather", "", 0, 2},
        {"set", "{on:false}", 0, 1},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        int got = read_form(G, tools, c[i].parallel, c[i].name_read, c[i].text);
        CHECK(got == c[i].want, "Gemma 4 '%s' then '%s' (parallel %d): %d, want %d", c[i].name_read ? c[i].name_read : "", c[i].text,
              c[i].parallel, got, c[i].want);
    }
    ib_json_state st;
    CHECK(ib_tool_pick_setup(&st, G, tools, 0, "nope") == -1 && !st.pick, "a name read that is no declared name's beginning is refused");
    /* the replies read back as the calls they hold */
    static const char two[] = "get_weather{city:" GQ "a<b \"q\"\n" GQ "}<tool_call|><|tool_call>call:set{on:true,n:None}";
    json_t *calls = ib_api_tool_calls_constrained(G, NULL, two, strlen(two), "X", 1);
    CHECK(call_is(calls, 0, "get_weather", "{\"city\": \"a<b \\\"q\\\"\\n\"}") && call_is(calls, 1, "set", "{\"on\": true, \"n\": null}") &&
              json_array_size(calls) == 2,
          "a Gemma 4 \"required\" reply read back as its two calls");
    json_decref(calls);
    calls = ib_api_tool_calls_constrained(G, NULL, two, strlen(two), "X", 0);
    CHECK(call_is(calls, 0, "get_weather", "{\"city\": \"a<b \\\"q\\\"\\n\"}") && json_array_size(calls) == 1,
          "parallel off: the first call only");
    json_decref(calls);
    calls = ib_api_tool_calls_constrained(G, "set", "{on:false}", 10, "X", 1);
    CHECK(call_is(calls, 0, "set", "{\"on\": false}") && json_array_size(calls) == 1, "a Gemma 4 named call read back");
    json_decref(calls);
    CHECK(!ib_api_tool_calls_constrained(G, "set", "{on:fal", 7, "X", 1), "a Gemma 4 call cut off is no call");
    json_decref(tools);
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
    if (ib_tool_pick_setup(&s, IB_CHAT_TOOLS_QWEN, tools, parallel, NULL) != 1) return -1;
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
        CHECK_EQ_INT(ib_tool_pick_setup(&st, IB_CHAT_TOOLS_QWEN, tl, parallel, NULL), 1);
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
    ib_tool_pick_setup(&st, IB_CHAT_TOOLS_QWEN, tools, 0, NULL);
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

/* ---------------------------------------------------------------- the walk against per-token stepping */

/* A vocabulary for the walk's test: token t is tok[t], len[t] bytes (n of them). */
typedef struct bvocab {
    char **tok;
    int *len, n;
} bvocab;

/* b = n tokens (ids from 0): "<eos>", the bytes \t \n \r 0x20..0x7e and a few UTF-8 ones (whole and
 * split), one token with no bytes, then pieces of 1..max_piece bytes cut at random from texts (so
 * tokens cross from a name into its arguments and the close, and share prefixes; duplicates left
 * in), the last one texts[0] whole. */
static void bv_make(bvocab *b, int n, const char *const *texts, int max_piece) {
    b->tok = malloc((size_t)n * sizeof *b->tok);
    b->len = malloc((size_t)n * sizeof *b->len);
    int k = 0, nt = 0;
    b->tok[k] = strdup("<eos>"), b->len[k++] = 5;
    static const char singles[] = "\t\n\r";
    for (int i = 0; singles[i]; i++) b->tok[k] = strndup(singles + i, 1), b->len[k++] = 1;
    for (int c = 0x20; c < 0x7f; c++) {
        char one[2] = {(char)c, 0};
        b->tok[k] = strdup(one), b->len[k++] = 1;
    }
    static const char *const utf[] = {"\xc3\xa9", "\xc3", "\xa9", "\xe2\x82\xac", NULL};
    for (int i = 0; utf[i]; i++) b->tok[k] = strdup(utf[i]), b->len[k] = (int)strlen(utf[i]), k++;
    b->tok[k] = strdup(""), b->len[k++] = 0;
    while (texts[nt]) nt++;
    while (k < n - 1) {
        const char *x = texts[rndi(nt)];
        int xl = (int)strlen(x), a = rndi(xl), l = 1 + rndi(max_piece);
        if (a + l > xl) l = xl - a;
        b->tok[k] = strndup(x + a, (size_t)l), b->len[k++] = l;
    }
    b->tok[k] = strdup(texts[0]), b->len[k++] = (int)strlen(texts[0]);
    b->n = n;
}

/* The id bv_make gives the one-byte token of c (\t \n \r or 0x20..0x7e). */
#define BV_ID(c) ((c) == '\t' ? 1 : (c) == '\n' ? 2 : (c) == '\r' ? 3 : 4 + (c) - 0x20)

static void bv_free(bvocab *b) {
    for (int i = 0; i < b->n; i++) free(b->tok[i]);
    free(b->tok);
    free(b->len);
}

static int bv_bytes(void *ctx, int32_t id, char *buf, int cap) {
    bvocab *b = ctx;
    memcpy(buf, b->tok[id], (size_t)b->len[id]);
    return b->len[id];
}

/* Mask state s both ways over row width vocab (stop ids stop[n_stop]) from the same logits row (random,
 * some -inf, some NaN), and compare the rows bit for bit and the counts. Returns 1 when they agree. */
static int same_masks(ib_json_state *s, const ib_json_vocab *v, int vocab, const int32_t *stop, int n_stop, int *allowed_out) {
    float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
    for (int t = 0; t < vocab; t++) {
        int r = rndi(40);
        a[t] = r == 0 ? -INFINITY : r == 1 ? NAN : rndf();
    }
    memcpy(b, a, (size_t)vocab * sizeof *a);
    int na = ib_json_mask(s, v, a, vocab, stop, n_stop), nb = ib_tool_pick_mask_stepped(s->pick, v, b, vocab, stop, n_stop);
    int same = na == nb && !memcmp(a, b, (size_t)vocab * sizeof *a);
    *allowed_out = na;
    free(a);
    free(b);
    return same;
}

/* Whether a reply of form that may stop at text[len] reads back as calls of declared functions whose
 * arguments are valid for their parameters. */
static int reply_valid(ib_chat_tool_form form, json_t *tools, const char *text, size_t len, int parallel) {
    json_t *calls = ib_api_tool_calls_constrained(form, NULL, text, len, "W", parallel), *c, *t;
    size_t i, j;
    int good = json_array_size(calls) > 0;
    json_array_foreach(calls, i, c) {
        json_t *f = json_object_get(c, "function"), *fn = NULL;
        const char *nm = json_string_value(json_object_get(f, "name"));
        json_array_foreach(tools, j, t) if (nm && !strcmp(nm, json_string_value(json_object_get(json_object_get(t, "function"), "name"))))
            fn = json_object_get(t, "function");
        json_t *args = json_loads(json_string_value(json_object_get(f, "arguments")), 0, NULL), *params = json_object_get(fn, "parameters");
        if (!fn || !json_is_object(args) || (params && !valid(args, params))) good = 0;
        json_decref(args);
    }
    if (!good) fprintf(stderr, "not valid calls: %.*s\n", (int)len, text);
    json_decref(calls);
    return good;
}

static void test_walk(ib_chat_tool_form form) {
    const int gemma = form == IB_CHAT_TOOLS_GEMMA4;
    static const char *const gemma_texts[] = {
        "get_weather{city:" GQ "Rome" GQ "}<tool_call|><|tool_call>call:set{on:true,n:-12}<tool_call|>",
        "get_time{any:[1,{x:None}],s:" GQ "a<b \"q\" \\ \xc3\xa9\n<" GQ "}<tool_call|><|tool_call>call:get_weather{city:" GQ "Paris" GQ "}",
        "set{n:3,on:false}<tool_call|><|tool_call>call:get_time{" GQ "a b" GQ ":null}<tool_call|>",
        "t19{}<tool_call|><|tool_call>call:t1{}<tool_call|><|tool_call>call:t0{}",
        "ab{k:" GQ "v<|\"|>}<tool_call|><|tool_call>call:abc{q:[" GQ "x" GQ "," GQ "y<z" GQ "]}<tool_call|><|tool_call>call:a{}",
        "{" GQ "}}<<|<tool_call|><|tool_call>call:k:[" GQ GQ "]None,<|\"|<|\"|>|>{}}}",
        NULL};
    static const char *const qwen_texts[] = {
        "get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"set\", \"arguments\": {\"on\": true, \"n\": -12}}\n</tool_call>",
        "get_time\", \"arguments\": {\"any\": [1, {\"x\": null}], \"s\": \"\\u00e9\xc3\xa9\"} }\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}",
        "set\", \"arguments\": {\"n\": 3, \"on\": false}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "t19\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"t1\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"t0\", \"arguments\": { }}",
        "ab\", \"arguments\": {\"k\": \"v\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"abc\", \"arguments\": {\"q\": [\"x\", \"y\"]}}\n</tool_call>\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}",
        " {\"}}\"\n\t  \r</tool_call><tool_call>\"name\": \"\", \"arguments\": {}}}}}\n",
        NULL};
    const char *const *texts = gemma ? gemma_texts : qwen_texts;
    json_t *sets[4] = {J(TOOLS), twenty(),
                       J("[{\"type\":\"function\",\"function\":{\"name\":\"abc\",\"parameters\":{\"type\":\"object\",\"properties\":"
                         "{\"q\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"q\"]}}},"
                         "{\"type\":\"function\",\"function\":{\"name\":\"a\"}},"
                         "{\"type\":\"function\",\"function\":{\"name\":\"ab\",\"parameters\":{\"type\":\"object\",\"properties\":"
                         "{\"k\":{\"type\":\"string\"}},\"additionalProperties\":false}}},"
                         "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]"),
                       NULL};
    sets[3] = json_array();   /* all the tools above in one list */
    for (int i = 0; i < 3; i++) {
        size_t j;
        json_t *f;
        json_array_foreach(sets[i], j, f) {
            const char *nm = json_string_value(json_object_get(json_object_get(f, "function"), "name"));
            int dup = 0;
            size_t q;
            json_t *g;
            json_array_foreach(sets[3], q, g) dup |= !strcmp(nm, json_string_value(json_object_get(json_object_get(g, "function"), "name")));
            if (!dup) json_array_append(sets[3], f);
        }
    }
    bvocab bv;
    bv_make(&bv, 3000, texts, 24);
    ib_json_vocab v;
    CHECK_EQ_INT(ib_json_vocab_build(&v, bv.n, bv_bytes, &bv), 0);
    /* stop lists: the stop alone; with ids the walk takes ('}', '\n', 'g', '"'), a duplicate, ids outside
     * the row; none */
    const int32_t one[1] = {EOS}, many[8] = {EOS, BV_ID('}'), EOS, -1, 1 << 20, BV_ID('\n'), BV_ID('g'), BV_ID('"')},
                  *stops[3] = {one, many, NULL};
    const int n_stops[3] = {1, 8, 0};
    int compared = 0, differ = 0, dead = 0, ends = 0, read_back = 0;
    char text[8192];
    for (int w = 0; w < 64; w++) {
        json_t *tl = sets[w % 4];
        const int parallel = w % 5 != 4;
        ib_json_state st;
        CHECK_EQ_INT(ib_tool_pick_setup(&st, form, tl, parallel, NULL), 1);
        size_t len = 0;
        for (int step = 0; step < 120; step++) {
            int which = rndi(3), vocab = (int)v.n + (rndi(4) == 0 ? 5 : 0) - (rndi(4) == 0 ? 3 : 0), allowed = 0;
            int same = same_masks(&st, &v, vocab, stops[which], n_stops[which], &allowed);
            compared++;
            if (!same && differ++ < 5) fprintf(stderr, "walk %d step %d (stops %d, row %d): the walk's mask differs\n", w, step, which, vocab);
            /* draw the next token from the full mask */
            float *lg = malloc(v.n * sizeof *lg);
            for (int t = 0; t < v.n; t++) lg[t] = 1.0f;
            int left = ib_json_mask(&st, &v, lg, v.n, one, 1), pick = -1;
            if (!isinf(lg[EOS])) {
                ends++;
                if (gemma) {   /* a reply that may stop here reads back as valid calls */
                    CHECK(reply_valid(form, tl, text, len, parallel), "walk %d step %d: a reply that may stop is no valid call", w, step);
                    read_back++;
                }
            }
            if (left > 0 && !(left == 1 && !isinf(lg[EOS])))
                for (int tries = 0; tries < 100000; tries++) {
                    int c = rndi(3) ? bv.n - 1 - rndi(bv.n - 200) : rndi(bv.n);   /* mostly the pieces */
                    if (!isinf(lg[c]) && c != EOS) {
                        pick = c;
                        break;
                    }
                }
            free(lg);
            if (pick < 0 || (rndi(60) == 0 && step > 5) || len + (size_t)bv.len[pick] >= sizeof text) {   /* a refused byte: the reader ends, only the stop left */
                CHECK(ib_json_step(&st, 0x00) == -1, "a NUL refused");
                CHECK(same_masks(&st, &v, v.n, many, 8, &allowed), "a refused reply: the masks differ");
                float *d = malloc(v.n * sizeof *d);
                for (int t = 0; t < v.n; t++) d[t] = 1.0f;
                allowed = ib_json_mask(&st, &v, d, v.n, one, 1);
                CHECK(allowed == 1 && d[EOS] == 1.0f, "a refused reply: the stop alone (%d left)", allowed);
                free(d);
                dead++;
                break;
            }
            for (int i = 0; i < bv.len[pick]; i++) CHECK(ib_json_step(&st, (unsigned char)bv.tok[pick][i]) == 0, "step");
            memcpy(text + len, bv.tok[pick], (size_t)bv.len[pick]);
            len += (size_t)bv.len[pick];
        }
        ib_json_release(&st);
    }
    CHECK(differ == 0, "%s: %d of %d masks differ between the walk and per-token stepping", gemma ? "Gemma 4" : "Qwen", differ, compared);
    CHECK(compared >= 2000 && dead >= 20 && ends >= 20 && (!gemma || read_back >= 20),
          "%s coverage: %d states, %d refused replies, %d where the reply may end", gemma ? "Gemma 4" : "Qwen", compared, dead, ends);
    ib_json_vocab_free(&v);
    bv_free(&bv);
    for (int i = 0; i < 4; i++) json_decref(sets[i]);
}

/* ---------------------------------------------------------------- --bench */

static int tok_bytes(void *ctx, int32_t t, char *buf, int cap) { return ib_tokenizer_decode(ctx, t, buf, cap); }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int dbl_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of x[n] (sorts x). */
static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, dbl_cmp);
    return n ? (n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2) : 0;
}

/* Time the "required" mask over tokenizer file path's vocabulary along a two-call reply (tokenized as
 * a whole), reps times on each state, the walk (ib_json_mask) and per-token stepping
 * (ib_tool_pick_mask_stepped) alternately (which goes first alternates too). Prints per phase (the
 * state's byte offset: in a name, in the arguments, in a close) the median over the steps of each
 * step's median, the mean and the slowest, in ms; checks the two masks are the same bits. 0 when they
 * all are and the reply is allowed throughout. */
static int bench(const char *path, int reps, ib_chat_tool_form form) {
    const int gemma = form == IB_CHAT_TOOLS_GEMMA4;
    ib_tokenizer *tk;
    ib_error err;
    if (ib_tokenizer_load(path, INT32_MAX, &tk, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ib_json_vocab v;
    if (ib_json_vocab_build(&v, ib_tokenizer_n_ids(tk), tok_bytes, tk)) return 1;
    json_t *tools = J(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Current weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":[\"city\"],"
        "\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{\"tz\":{\"type\":\"string\"}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"search_web\",\"parameters\":{\"type\":\"object\",\"properties\":{\"query\":{\"type\":"
        "\"string\"},\"max_results\":{\"type\":\"integer\"}},\"required\":[\"query\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"send_email\",\"parameters\":{\"type\":\"object\",\"properties\":{\"to\":{\"type\":"
        "\"string\"},\"subject\":{\"type\":\"string\"},\"body\":{\"type\":\"string\"}},\"required\":[\"to\",\"body\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"create_event\",\"parameters\":{\"type\":\"object\",\"properties\":{\"title\":{\"type\":"
        "\"string\"},\"start\":{\"type\":\"string\"},\"minutes\":{\"type\":\"integer\"},\"attendees\":{\"type\":\"array\",\"items\":{\"type\":"
        "\"string\"}}},\"required\":[\"title\",\"start\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"set_alarm\",\"parameters\":{\"type\":\"object\",\"properties\":{\"hour\":{\"type\":"
        "\"integer\"},\"days\":{\"type\":\"array\",\"items\":{\"enum\":[\"mon\",\"tue\",\"wed\"]}}},\"required\":[\"hour\"]}}}]");
    /* the reply in parts: names, arguments, closes (a phase each) */
    typedef struct {
        const char *text;
        int phase; /* 0 a name, 1 arguments, 2 a close */
    } bench_part;
    static const bench_part qwen_part[] = {{"get_weather\", \"arguments\": ", 0},
                                           {"{\"city\": \"Paris\", \"unit\": \"celsius\"}", 1},
                                           {"}\n</tool_call>\n<tool_call>\n{\"name\": \"", 2},
                                           {"search_web\", \"arguments\": ", 0},
                                           {"{\"query\": \"concerts in Paris this weekend\", \"max_results\": 5}", 1},
                                           {"}\n</tool_call>", 2}};
    static const bench_part gemma_part[] = {{"get_weather{", 0},
                                            {"city:" GQ "Paris" GQ ",unit:" GQ "celsius" GQ "}", 1},
                                            {"<tool_call|><|tool_call>call:", 2},
                                            {"search_web{", 0},
                                            {"max_results:5,query:" GQ "concerts in Paris this weekend" GQ "}", 1},
                                            {"<tool_call|>", 2}};
    const bench_part *part = gemma ? gemma_part : qwen_part;
    const int n_part = 6;
    char reply[1024];
    int phase_at[1024], rl = 0;
    for (int i = 0; i < n_part; i++)
        for (const char *p = part[i].text; *p; p++) phase_at[rl] = part[i].phase, reply[rl++] = *p;
    phase_at[rl] = 2;   /* after the last close: the reply may end */
    reply[rl] = 0;
    int32_t ids[1024], stop[2] = {ib_tokenizer_eos(tk), ib_tokenizer_special(tk, gemma ? "<turn|>" : "<|im_end|>")};
    int n = ib_tokenizer_encode(tk, reply, (size_t)rl, ids, 1024), n_stop = stop[1] >= 0 ? 2 : 1;
    ib_json_state st;
    if (ib_tool_pick_setup(&st, form, tools, 1, NULL) != 1) return 1;
    float *a = malloc((size_t)v.n * sizeof *a), *b = malloc((size_t)v.n * sizeof *b);
    double *tw = malloc((size_t)reps * sizeof *tw), *ts = malloc((size_t)reps * sizeof *ts);
    double *step_w[3], *step_s[3], mean_w[3] = {0}, mean_s[3] = {0}, max_w[3] = {0}, max_s[3] = {0};
    int n_ph[3] = {0}, same = 0, ok = 1, off = 0;
    for (int p = 0; p < 3; p++) step_w[p] = malloc((size_t)(n + 1) * sizeof(double)), step_s[p] = malloc((size_t)(n + 1) * sizeof(double));
    for (int i = 0; i <= n && ok; i++) {   /* the state before token i; i == n: after the reply */
        int na = 0, nb = 0;
        for (int r = 0; r < reps; r++) {
            for (int t = 0; t < v.n; t++) a[t] = b[t] = 0.0f;
            for (int o = 0; o < 2; o++) {
                double t0 = now();
                if ((r + o + i) % 2 == 0) {
                    na = ib_json_mask(&st, &v, a, v.n, stop, n_stop);
                    tw[r] = now() - t0;
                } else {
                    nb = ib_tool_pick_mask_stepped(st.pick, &v, b, v.n, stop, n_stop);
                    ts[r] = now() - t0;
                }
            }
        }
        same += na == nb && !memcmp(a, b, (size_t)v.n * sizeof *a);
        int ph = phase_at[off];
        double mw = median(tw, reps), ms = median(ts, reps);
        step_w[ph][n_ph[ph]] = mw, step_s[ph][n_ph[ph]++] = ms;
        mean_w[ph] += mw, mean_s[ph] += ms;
        if (mw > max_w[ph]) max_w[ph] = mw;
        if (ms > max_s[ph]) max_s[ph] = ms;
        if (i == n) {
            ok = !isinf(a[stop[0]]);
            break;
        }
        ok = !isinf(a[ids[i]]);
        for (size_t k = v.off[ids[i]]; ok && k < v.off[ids[i] + 1]; k++, off++) ok = !ib_json_step(&st, (unsigned char)v.bytes[k]);
    }
    printf("%s form; vocabulary %d tokens (longest %d bytes); a two-call reply of %d tokens, %d masks a state, each way alternately\n",
           gemma ? "Gemma 4's" : "Qwen's", v.n, v.maxlen, n, reps);
    static const char *const ph_name[3] = {"name", "arguments", "close"};
    for (int p = 0; p < 3; p++) {
        if (!n_ph[p]) continue;
        double k = n_ph[p];
        printf("%-9s %2d steps: per-token stepping median %6.3f ms (mean %6.3f, max %6.3f); walk median %6.3f ms (mean %6.3f, max %6.3f)%s\n",
               ph_name[p], n_ph[p], 1e3 * median(step_s[p], n_ph[p]), 1e3 * mean_s[p] / k, 1e3 * max_s[p],
               1e3 * median(step_w[p], n_ph[p]), 1e3 * mean_w[p] / k, 1e3 * max_w[p], p == 1 && !gemma ? "  (the same code both ways)" : "");
    }
    printf("masks the same bits: %d of %d states%s\n", same, n_ph[0] + n_ph[1] + n_ph[2], ok ? "" : "  (the reply was refused!)");
    int bad = !ok || same != n_ph[0] + n_ph[1] + n_ph[2];
    for (int p = 0; p < 3; p++) free(step_w[p]), free(step_s[p]);
    free(tw), free(ts), free(a), free(b);
    ib_json_release(&st);
    json_decref(tools);
    ib_json_vocab_free(&v);
    ib_tokenizer_free(tk);
    return bad;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "--bench"))   /* --bench TOKENIZER_JSON [REPS [gemma4]] */
        return bench(argv[2], argc >= 4 ? atoi(argv[3]) : 5, argc >= 5 && !strcmp(argv[4], "gemma4") ? IB_CHAT_TOOLS_GEMMA4 : IB_CHAT_TOOLS_QWEN);
    test_texts();
    test_mask();
    test_gemma_texts();
    test_walk(IB_CHAT_TOOLS_QWEN);
    test_walk(IB_CHAT_TOOLS_GEMMA4);
    TEST_MAIN_END("test_tool_pick");
}
