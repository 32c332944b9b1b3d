/*
 * test_tool_form_gemma4.c — function calling in Gemma 4's tool syntax (src/server/tool_form_gemma4.c),
 * every expected text written out here by hand from the Gemma 4 chat template's rules:
 *   - declarations: members in case-insensitive key order, descriptions, nullable, enums, nested
 *     objects and array items, the template's own commas (none before type after properties or items;
 *     a parameters object without a type left unclosed), numbers as Python prints them;
 *   - a conversation rewritten: the declarations in the system message's tool_text, a model turn's
 *     calls and results (named by tool_call_id, else by position) in its tool_text, the next
 *     assistant text merged into the turn, chains of calls, a calls message's own text kept;
 *   - refusals naming the message or the property: a tool message with no calls before it, arguments
 *     that are no object, a property without a type or not an object, a non-string description;
 *   - reply texts read back into tool_calls: values of every kind, whitespace, quoted keys, content
 *     before the calls, parallel off, and every malformed or cut-off call leaving the whole text text.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/api.h"

#define Q "<|\"|>"

/* strcmp that takes NULL (a missing text) as different from any text. */
static int same(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static json_t *J(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fprintf(stderr, "test JSON does not parse: %s: %s\n", je.text, s);
    return j;
}

static const char *last_param;   /* the field the last refusal named */

/* The rewrite of messages msgs with tools (NULL: none) in Gemma 4's form: 0 and *tm, or -1 and why.
 * The rewritten contents may point into the messages' JSON: it is kept until the next call. */
static int rewrite(const char *msgs, const char *tools, ib_api_tool_msgs *tm, char *why, size_t wsz) {
    static json_t *held;
    json_decref(held);
    held = NULL;
    if (!msgs) return 0;
    json_t *m = J(msgs), *t = tools ? J(tools) : NULL;
    why[0] = 0;
    int rc = m ? ib_api_tool_messages(IB_CHAT_TOOLS_GEMMA4, m, t, tm, &last_param, why, wsz) : -9;
    held = m;
    json_decref(t);
    return rc;
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather, in \\u00b0C\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"],\"description\":\"Unit\"},"
    "\"City\":{\"type\":\"string\",\"description\":\"The city\"},\"days\":{\"type\":\"integer\",\"nullable\":true}},"
    "\"required\":[\"City\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"o\":{\"type\":\"object\","
    "\"properties\":{\"b\":{\"type\":\"number\"}},\"required\":[\"b\"]},\"a\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
    "\"minimum\":1.5e-05}}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"description\":\"d\"}}]";

static const char DECLS[] =
    "<|tool>declaration:get_weather{description:" Q "Weather, in \xc2\xb0" "C" Q ",parameters:{properties:{City:{description:" Q
    "The city" Q ",type:" Q "STRING" Q "},days:{nullable:true,type:" Q "INTEGER" Q "},unit:{description:" Q "Unit" Q ",enum:[" Q
    "c" Q "," Q "f" Q "],type:" Q "STRING" Q "}},required:[" Q "City" Q "],type:" Q "OBJECT" Q "}}<tool|>"
    "<|tool>declaration:f{description:" Q Q ",parameters:{properties:{a:{,items:{minimum:1.5e-05,type:" Q "STRING" Q "}type:" Q
    "ARRAY" Q "},o:{,properties:{b:{type:" Q "NUMBER" Q "}},required:[" Q "b" Q "]type:" Q "OBJECT" Q "}},}<tool|>"
    "<|tool>declaration:g{description:" Q "d" Q "}<tool|>";

static void test_declarations(void) {
    ib_api_tool_msgs tm;
    char why[256];
    int rc = rewrite("[{\"role\":\"system\",\"content\":\"  Be brief. \"},{\"role\":\"user\",\"content\":\"u\"}]", TOOLS, &tm, why,
                     sizeof why);
    CHECK(rc == 0 && tm.n == 2 && !strcmp(tm.m[0].role, "system") && !strcmp(tm.m[0].content, "  Be brief. ") &&
              same(tm.m[0].tool_text, DECLS) && !strcmp(tm.m[1].content, "u") && !tm.m[1].tool_text,
          "declarations: rc %d (%s)\n%s\nwant\n%s", rc, why, rc ? "" : tm.m[0].tool_text ? tm.m[0].tool_text : "(none)", DECLS);
    if (!rc) ib_api_tool_msgs_free(&tm);
    /* tools, no system message: a system message of the declarations alone; a developer one counts */
    rc = rewrite("[{\"role\":\"user\",\"content\":\"u\"}]", TOOLS, &tm, why, sizeof why);
    CHECK(rc == 0 && tm.n == 2 && !strcmp(tm.m[0].role, "system") && !strcmp(tm.m[0].content, "") &&
              same(tm.m[0].tool_text, DECLS), "declarations without a system message: rc %d (%s)", rc, why);
    if (!rc) ib_api_tool_msgs_free(&tm);
    rc = rewrite("[{\"role\":\"developer\",\"content\":\"D\"},{\"role\":\"user\",\"content\":\"u\"}]", TOOLS, &tm, why, sizeof why);
    CHECK(rc == 0 && tm.n == 2 && !strcmp(tm.m[0].role, "system") && !strcmp(tm.m[0].content, "D"), "developer: rc %d", rc);
    if (!rc) ib_api_tool_msgs_free(&tm);
    /* numbers as Python prints them; enum values keep their kinds; object keys between <|"|> tokens */
    rc = rewrite("[{\"role\":\"user\",\"content\":\"u\"}]",
                 "[{\"type\":\"function\",\"function\":{\"name\":\"n\",\"parameters\":{\"properties\":{\"x\":{\"type\":\"array\","
                 "\"items\":{\"type\":\"number\",\"enum\":[1e16,1e15,1e-05,0.0001,123.0,-0.0,1.5e300,5,0.1,true,null,{\"K\":\"v\"}]}}}}}}]",
                 &tm, why, sizeof why);
    static const char nums[] = "<|tool>declaration:n{description:" Q Q ",parameters:{properties:{x:{,items:{enum:[1e+16,"
                               "1000000000000000.0,1e-05,0.0001,123.0,-0.0,1.5e+300,5,0.1,true,None,{" Q "K" Q ":" Q "v" Q
                               "}],type:" Q "NUMBER" Q "}type:" Q "ARRAY" Q "}},}<tool|>";
    CHECK(rc == 0 && same(tm.m[0].tool_text, nums), "numbers: rc %d (%s)\n%s\nwant\n%s", rc, why, rc ? "" : tm.m[0].tool_text, nums);
    if (!rc) ib_api_tool_msgs_free(&tm);
    /* an object property without properties: its own members other than the standard keys */
    rc = rewrite("[{\"role\":\"user\",\"content\":\"u\"}]",
                 "[{\"type\":\"function\",\"function\":{\"name\":\"m\",\"parameters\":{\"type\":\"object\",\"properties\":{\"meta\":"
                 "{\"type\":\"object\",\"description\":\"free\",\"additionalProperties\":{\"type\":\"string\"}}}}}}]",
                 &tm, why, sizeof why);
    static const char own[] = "<|tool>declaration:m{description:" Q Q ",parameters:{properties:{meta:{description:" Q "free" Q
                              ",properties:{additionalProperties:{type:" Q "STRING" Q "}},type:" Q "OBJECT" Q "}},type:" Q "OBJECT" Q
                              "}}<tool|>";
    CHECK(rc == 0 && same(tm.m[0].tool_text, own), "own members: rc %d (%s)\n%s\nwant\n%s", rc, why, rc ? "" : tm.m[0].tool_text, own);
    if (!rc) ib_api_tool_msgs_free(&tm);
    /* no type (an anyOf), a member that is no object, a number or true as description: written as the
     * templates that go on write them (the empty type; Python's text) */
    rc = rewrite("[{\"role\":\"user\",\"content\":\"u\"}]",
                 "[{\"type\":\"function\",\"function\":{\"name\":\"l\",\"parameters\":{\"properties\":{\"o\":{\"anyOf\":[{\"type\":"
                 "\"string\"},{\"type\":\"null\"}],\"description\":7},\"p\":{\"type\":\"object\",\"additionalProperties\":false},"
                 "\"q\":{\"type\":[],\"description\":true},\"r\":{\"type\":[\"integer\",\"null\"]}}}}}]",
                 &tm, why, sizeof why);
    static const char lenient[] = "<|tool>declaration:l{description:" Q Q ",parameters:{properties:{o:{description:" Q "7" Q ",type:" Q Q "},p:{,properties:{additionalProperties:{type:" Q Q
                                  "}}type:" Q "OBJECT" Q "},q:{description:" Q "True" Q ",type:" Q Q "},r:{type:" Q "INTEGER" Q
                                  "}},}<tool|>";
    CHECK(rc == 0 && same(tm.m[0].tool_text, lenient), "lenient types: rc %d (%s)\n%s\nwant\n%s", rc, why,
          rc ? "" : tm.m[0].tool_text, lenient);
    if (!rc) ib_api_tool_msgs_free(&tm);
    /* what the template cannot write is refused, naming the property */
    static const struct {
        const char *params, *needle;
    } bad[] = {
        {"{\"properties\":{\"x\":{\"type\":\"string\",\"description\":[7]}}}", "tools[0].function.parameters.x: description must be a string"},
        {"{\"properties\":[1]}", "parameters: properties must be an object"},
        {"{\"required\":\"x\"}", "required must be an array of strings"},
        {"{\"type\":[\"object\"]}", "type must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char tools[512];
        snprintf(tools, sizeof tools, "[{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":%s}}]", bad[i].params);
        rc = rewrite("[{\"role\":\"user\",\"content\":\"u\"}]", tools, &tm, why, sizeof why);
        CHECK(rc == -1 && strstr(why, bad[i].needle) && last_param && !strcmp(last_param, "tools"),
              "bad parameters %zu (%s): rc %d, '%s' naming %s", i, bad[i].params, rc, why, last_param ? last_param : "nothing");
        if (!rc) ib_api_tool_msgs_free(&tm);
    }
}

static void test_messages(void) {
    ib_api_tool_msgs tm;
    char why[256];
    /* calls, results (named by tool_call_id, in the tool messages' order), the answer merged */
    int rc = rewrite("[{\"role\":\"user\",\"content\":\"weather?\"},"
                     "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
                     "{\"name\":\"get_weather\",\"arguments\":\"{\\\"days\\\": 2, \\\"City\\\": \\\"Paris\\\"}\"}},{\"id\":\"c2\","
                     "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                     "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"{\\\"t\\\": 1.0, \\\"ok\\\": true, \\\"l\\\": [1, \\\"a\\\"]}\"},"
                     "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},"
                     "{\"role\":\"assistant\",\"content\":\"It is sunny.\"},{\"role\":\"user\",\"content\":\"thanks\"}]",
                     NULL, &tm, why, sizeof why);
    static const char t1[] = "<|tool_call>call:get_weather{City:" Q "Paris" Q ",days:2}<tool_call|><|tool_call>call:f{}<tool_call|>"
                             "<|tool_response>response:f{l:[1," Q "a" Q "],ok:true,t:1.0}<tool_response|>"
                             "<|tool_response>response:get_weather{value:" Q "sunny" Q "}<tool_response|>";
    CHECK(rc == 0 && tm.n == 3 && !strcmp(tm.m[1].role, "assistant") && same(tm.m[1].tool_text, t1) &&
              !strcmp(tm.m[1].content, "It is sunny.") && !strcmp(tm.m[2].content, "thanks"),
          "a model turn: rc %d (%s) %zu messages\n%s\nwant\n%s", rc, why, rc ? 0 : tm.n, rc || !tm.m[1].tool_text ? "" : tm.m[1].tool_text, t1);
    if (!rc) ib_api_tool_msgs_free(&tm);
    /* results named by position when the id matches no call, then by the id, then "unknown"; JSON
     * scalars as value:…, a null as None */
    rc = rewrite("[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":"
                 "\"f\",\"arguments\":\"{\\\"k\\\":null}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"15\"},"
                 "{\"role\":\"tool\",\"tool_call_id\":\"yy\",\"content\":\"null\"},{\"role\":\"tool\",\"content\":\"\\\"s\\\"\"}]",
                 NULL, &tm, why, sizeof why);
    static const char t2[] = "<|tool_call>call:f{k:None}<tool_call|><|tool_response>response:f{value:15}<tool_response|>"
                             "<|tool_response>response:yy{value:None}<tool_response|><|tool_response>response:unknown{value:" Q "s" Q
                             "}<tool_response|>";
    CHECK(rc == 0 && tm.n == 2 && same(tm.m[1].tool_text, t2) && !strcmp(tm.m[1].content, ""),
          "names: rc %d (%s)\n%s\nwant\n%s", rc, why, rc ? "" : tm.m[1].tool_text, t2);
    if (!rc) ib_api_tool_msgs_free(&tm);
    /* a chain: each calls message its own entry (tokenizer/chat.c continues the open turn); a calls
     * message with text keeps it, and the next answer stays a message of its own; calls with no results */
    rc = rewrite("[{\"role\":\"user\",\"content\":\"u\"},"
                 "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                 "{\"role\":\"tool\",\"content\":\"1\"},"
                 "{\"role\":\"assistant\",\"content\":\"Checking.\",\"tool_calls\":[{\"id\":\"b\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},"
                 "{\"role\":\"tool\",\"content\":\"2\"},{\"role\":\"assistant\",\"content\":\"Done.\"},"
                 "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"h\",\"arguments\":\"{}\"}}]}]",
                 NULL, &tm, why, sizeof why);
    CHECK(rc == 0 && tm.n == 5 &&
              same(tm.m[1].tool_text, "<|tool_call>call:f{}<tool_call|><|tool_response>response:f{value:1}<tool_response|>") &&
              !strcmp(tm.m[1].content, "") &&
              same(tm.m[2].tool_text, "<|tool_call>call:g{}<tool_call|><|tool_response>response:g{value:2}<tool_response|>") &&
              !strcmp(tm.m[2].content, "Checking.") && !tm.m[3].tool_text && !strcmp(tm.m[3].content, "Done.") &&
              same(tm.m[4].tool_text, "<|tool_call>call:h{}<tool_call|>"),
          "a chain: rc %d (%s)", rc, why);
    if (!rc) ib_api_tool_msgs_free(&tm);
    /* refused */
    static const struct {
        const char *msgs, *needle;
    } bad[] = {
        {"[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"tool\",\"content\":\"x\"}]",
         "messages[1]: a tool message must follow an assistant message with tool_calls"},
        {"[{\"role\":\"assistant\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"x\"}]", "messages[1]: a tool message must follow"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]",
         "messages[0].tool_calls[0].function.arguments must be the JSON text of an object"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1,\\\"a\\\":2}\"}}]}]",
         "arguments must be the JSON text of an object"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"content\":3}]",
         "messages[1] needs a string content"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f g\",\"arguments\":\"{}\"}}]}]", "name must be 1 to 64"},
        {"[{\"role\":\"robot\",\"content\":\"x\"}]", "is not system, developer, user, assistant or tool"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rc = rewrite(bad[i].msgs, NULL, &tm, why, sizeof why);
        CHECK(rc == -1 && strstr(why, bad[i].needle) && last_param && !strcmp(last_param, "messages"),
              "bad messages %zu (%s): rc %d, '%s' naming %s", i, bad[i].msgs, rc, why, last_param ? last_param : "nothing");
        if (!rc) ib_api_tool_msgs_free(&tm);
    }
}

/* ib_gemma4_tool_calls_read on text: the calls as compact JSON text and the content length, or none. */
static void read_case(const char *text, int max_calls, const char *want_calls, long want_cl) {
    size_t cl = 12345;
    json_t *calls = ib_gemma4_tool_calls_read(text, strlen(text), "X", max_calls, &cl);
    char *got = calls ? json_dumps(calls, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    int ok = want_calls ? got && !strcmp(got, want_calls) && (long)cl == want_cl : !calls;
    CHECK(ok, "read '%s': got %s (content %zu), want %s (%ld)", text, got ? got : "none", cl, want_calls ? want_calls : "none",
          want_cl);
    free(got);
    json_decref(calls);
}

#define CALL(k, name, args) "{\"id\":\"call_X_" #k "\",\"type\":\"function\",\"function\":{\"name\":\"" name "\",\"arguments\":\"" args "\"}}"

static void test_read(void) {
    read_case("<|tool_call>call:get_weather{City:" Q "Paris" Q ",days:2}<tool_call|>", 0,
              "[" CALL(0, "get_weather", "{\\\"City\\\":\\\"Paris\\\",\\\"days\\\":2}") "]", 0);
    read_case("Sure.\n<|tool_call>call:f{}<tool_call|>\n", 0, "[" CALL(0, "f", "{}") "]", 5);
    read_case("<|tool_call>call:f{}<tool_call|> \n<|tool_call>call:g-2{a:1}<tool_call|>", 0,
              "[" CALL(0, "f", "{}") "," CALL(1, "g-2", "{\\\"a\\\":1}") "]", 0);
    read_case("<|tool_call>call:f{}<tool_call|><|tool_call>call:g{}<tool_call|>", 1, "[" CALL(0, "f", "{}") "]", 0);
    /* every kind of value; blanks around the punctuation; quoted keys; strings as they are */
    read_case("<|tool_call>call:f{ a : [1, -2.5e3,true,false,null,None] , b:{c:" Q "x, y: {z}\n" Q "}," Q "q k" Q ":0,e:[],d:{}}"
              "<tool_call|>",
              0,
              "[" CALL(0, "f", "{\\\"a\\\":[1,-2500.0,true,false,null,null],\\\"b\\\":{\\\"c\\\":\\\"x, y: {z}\\\\n\\\"},"
                               "\\\"q k\\\":0,\\\"e\\\":[],\\\"d\\\":{}}") "]",
              0);
    read_case("<|tool_call>call:f{\xc3\xa9tat:" Q "\xe2\x9c\x93" Q ",big:123456789012345678901}<tool_call|>", 0,
              "[" CALL(0, "f", "{\\\"\xc3\xa9tat\\\":\\\"\xe2\x9c\x93\\\",\\\"big\\\":1.2345678901234568e20}") "]", 0);
    /* not calls: the text stays text */
    static const char *const none[] = {
        "no call here",
        "<|tool_call>call:f{a:1}",                                   /* cut off */
        "<|tool_call>call:f{a:1}<tool_call|> and then text",           /* text after */
        "<|tool_call>call:f g{}<tool_call|>",                         /* bad name */
        "<|tool_call>call:{}<tool_call|>",                            /* no name */
        "<|tool_call>f{}<tool_call|>",                                /* no call: */
        "<|tool_call>call:f{a:1,a:2}<tool_call|>",                    /* a key twice */
        "<|tool_call>call:f{a:}<tool_call|>",
        "<|tool_call>call:f{a:1,}<tool_call|>",
        "<|tool_call>call:f{:1}<tool_call|>",
        "<|tool_call>call:f{a:" Q "open}<tool_call|>",                  /* unterminated string */
        "<|tool_call>call:f{a:inf}<tool_call|>",
        "<|tool_call>call:f{a:1e999}<tool_call|>",
        "<|tool_call>call:f{a:01}<tool_call|>",
        "<|tool_call>call:f{a:[1 2]}<tool_call|>",
        "<|tool_call>call:f[1]<tool_call|>",
        "<|tool_call>call:f{a:1}<tool_call|><|tool_call>call:g{",     /* the second cut off */
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", /* Qwen's form */
        "<|tool_call>call:f{a:\"x\"}<tool_call|>",                     /* JSON quotes are no string here */
        "<|tool_call>call:f{k" Q ":1}<tool_call|>",                    /* a delimiter in a bare key */
    };
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) read_case(none[i], 0, NULL, 0);
    /* no text at all (a reply with no token yet): none */
    size_t ecl;
    CHECK(!ib_gemma4_tool_calls_read(NULL, 0, "X", 0, &ecl), "no text: no call");
    /* a NUL inside a string (the byte tokens can write one) makes no call */
    static const char nul[] = "<|tool_call>call:f{a:" Q "x\0y" Q "}<tool_call|>";
    size_t ncl;
    json_t *nc = ib_gemma4_tool_calls_read(nul, sizeof nul - 1, "X", 0, &ncl);
    CHECK(!nc, "a NUL in a string: no call");
    json_decref(nc);
    /* a call opening inside a thought is no call: the first one after it is */
    read_case("<|channel>thought\nmaybe <|tool_call>call:f{}<tool_call|>?<channel|>\n<|tool_call>call:g{}<tool_call|>", 0,
              "[" CALL(0, "g", "{}") "]", (long)strlen("<|channel>thought\nmaybe <|tool_call>call:f{}<tool_call|>?<channel|>"));
    read_case("<|channel>thought\n<|tool_call>call:f{}<tool_call|>", 0, NULL, 0);
    /* nesting: 64 levels read, deeper refused */
    char deep[400];
    for (int depth = 63; depth <= 64; depth++) {
        size_t o = (size_t)snprintf(deep, sizeof deep, "<|tool_call>call:f{a:");
        for (int k = 0; k < depth; k++) deep[o++] = '[';
        for (int k = 0; k < depth; k++) deep[o++] = ']';
        snprintf(deep + o, sizeof deep - o, "}<tool_call|>");
        size_t cl;
        json_t *calls = ib_gemma4_tool_calls_read(deep, strlen(deep), "X", 0, &cl);
        CHECK((calls != NULL) == (depth == 63), "nesting %d: %s", depth, calls ? "read" : "refused");
        json_decref(calls);
    }
}

int main(void) {
    test_declarations();
    test_messages();
    test_read();
    rewrite(NULL, NULL, NULL, NULL, 0);
    TEST_MAIN_END("test_tool_form_gemma4");
}
