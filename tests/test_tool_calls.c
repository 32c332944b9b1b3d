/*
 * test_tool_calls.c — function calling in Qwen's chat form (src/server/tool_calls.c):
 *   - tools / tool_choice / parallel_tool_calls read into a tool use, every bad value refused with a
 *     message and the field named ("required" without tools, with a response_format, with a tool whose
 *     parameters are outside the schema subset; the 128-tool limit);
 *   - a conversation with tools, an assistant's tool_calls and a run of tool messages rewritten into
 *     role/content messages whose texts are the ones written out here by hand from the format (the
 *     tools block, the <tool_call> lines, the <tool_response> user turn);
 *   - reply texts read back into tool_calls: one call, several, text before them, parallel off,
 *     and every malformed or cut-off block leaving the whole text text;
 *   - a forced call's arguments; a "required" reply (after the opening up to the name) read back into
 *     one or more calls, or none when cut off.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/api.h"

static json_t *J(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fprintf(stderr, "test JSON does not parse: %s: %s\n", je.text, s);
    return j;
}

/* ib_api_tools on body text b: its return, and param/mode through the pointers. */
static int tools_rc(const char *b, ib_api_tool_use *tu, const char **param, char *msg, size_t msz) {
    json_t *j = J(b);
    int rc = j ? ib_api_tools(j, tu, param, msg, msz) : -9;
    json_decref(j);
    return rc;
}

static void test_tool_use(void) {
    ib_api_tool_use tu;
    const char *param;
    char msg[256];
    static const char T1[] = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                             "{\"type\":\"object\"}}},{\"type\":\"function\",\"function\":{\"name\":\"f-2\"}}]";
    char b[1024];
    snprintf(b, sizeof b, "{%s}", T1);
    json_t *j = J(b);
    CHECK(ib_api_tools(j, &tu, &param, msg, sizeof msg) == 0 && tu.mode == IB_TOOLS_AUTO && tu.parallel == 1 &&
              json_array_size(tu.tools) == 2, "tools alone: auto (%s)", msg);
    json_decref(j);
    snprintf(b, sizeof b, "{%s,\"tool_choice\":\"none\"}", T1);
    CHECK(tools_rc(b, &tu, &param, msg, sizeof msg) == 0 && tu.mode == IB_TOOLS_OFF, "tool_choice none: off");
    snprintf(b, sizeof b, "{%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f-2\"}},\"parallel_tool_calls\":false}", T1);
    CHECK(tools_rc(b, &tu, &param, msg, sizeof msg) == 0 && tu.mode == IB_TOOLS_FORCED && !strcmp(tu.name, "f-2") &&
              tu.parallel == 0, "a named function: forced (%s)", msg);
    CHECK(tools_rc("{\"messages\":[]}", &tu, &param, msg, sizeof msg) == 0 && tu.mode == IB_TOOLS_OFF, "no tools: off");
    CHECK(tools_rc("{\"tools\":[]}", &tu, &param, msg, sizeof msg) == 0 && tu.mode == IB_TOOLS_OFF, "empty tools: off");
    snprintf(b, sizeof b, "{%s,\"tool_choice\":\"required\"}", T1);
    CHECK(tools_rc(b, &tu, &param, msg, sizeof msg) == 0 && tu.mode == IB_TOOLS_REQUIRED && tu.parallel == 1,
          "required: a call of some tool (%s)", msg);
    snprintf(b, sizeof b, "{%s,\"tool_choice\":\"required\",\"parallel_tool_calls\":false,\"response_format\":"
                          "{\"type\":\"text\"}}", T1);
    CHECK(tools_rc(b, &tu, &param, msg, sizeof msg) == 0 && tu.mode == IB_TOOLS_REQUIRED && tu.parallel == 0,
          "required, parallel off, response_format text (%s)", msg);
    /* required: no response_format of its own, every tool's parameters in the subset (the second's here) */
    snprintf(b, sizeof b, "{%s,\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}", T1);
    CHECK(tools_rc(b, &tu, &param, msg, sizeof msg) == -1 && !strcmp(param, "response_format") &&
              strstr(msg, "tool_choice \"required\""), "required with a response_format: %s", msg);
    CHECK(tools_rc("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":"
                   "{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                   "\"pattern\":\"x\"}}}}}],\"tool_choice\":\"required\"}", &tu, &param, msg, sizeof msg) == -2 &&
              !strcmp(param, "tools") && strstr(msg, "the parameters of 'g' (tool_choice \"required\")") && strstr(msg, "pattern"),
          "required, a tool's parameters outside the subset: %s", msg);
    CHECK(tools_rc("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"$ref\":\"#/$defs/x\"}}}],"
                   "\"tool_choice\":\"required\"}", &tu, &param, msg, sizeof msg) == -1 && !strcmp(param, "tools") &&
              strstr(msg, "the parameters of 'f'"), "required, a $ref to nothing: %s", msg);
    /* the tools limit holds for required too: 128 taken, 129 refused */
    {
        char *big = malloc(64 * 1024);
        for (int nt = 128; big && nt <= 129; nt++) {
            size_t o = (size_t)snprintf(big, 64 * 1024, "{\"tool_choice\":\"required\",\"tools\":[");
            for (int i = 0; i < nt; i++)
                o += (size_t)snprintf(big + o, 64 * 1024 - o, "%s{\"type\":\"function\",\"function\":{\"name\":\"t%d\"}}",
                                      i ? "," : "", i);
            snprintf(big + o, 64 * 1024 - o, "]}");
            int rc = tools_rc(big, &tu, &param, msg, sizeof msg);
            CHECK(nt == 128 ? rc == 0 && tu.mode == IB_TOOLS_REQUIRED
                            : rc == -1 && !strcmp(param, "tools") && strstr(msg, "129 tools, more than 128"),
                  "required with %d tools: rc %d (%s)", nt, rc, msg);
        }
        free(big);
    }
    /* a named function: its parameters must compile in the schema subset, and no response_format of its own */
    CHECK(tools_rc("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                   "\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0}}}}}],\"tool_choice\":{\"type\":\"function\","
                   "\"function\":{\"name\":\"f\"}}}", &tu, &param, msg, sizeof msg) == -2 && !strcmp(param, "tools") &&
              strstr(msg, "the parameters of 'f'") && strstr(msg, "minimum"), "forced parameters outside the subset: %s", msg);
    CHECK(tools_rc("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":"
                   "\"function\",\"function\":{\"name\":\"f\"}},\"response_format\":{\"type\":\"json_object\"}}", &tu, &param,
                   msg, sizeof msg) == -1 && !strcmp(param, "response_format"), "forced with a response_format: %s", msg);
    CHECK(tools_rc("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":"
                   "\"function\",\"function\":{\"name\":\"f\"}},\"response_format\":{\"type\":\"text\"}}", &tu, &param,
                   msg, sizeof msg) == 0 && tu.mode == IB_TOOLS_FORCED, "forced with response_format text: %s", msg);
    /* bad values: -1, the field named, a message */
    static const struct {
        const char *body, *param, *needle;
    } bad[] = {
        {"{\"tools\":{}}", "tools", "must be an array"},
        {"{\"tools\":[1]}", "tools", "tools[0] must be"},
        {"{\"tools\":[{\"type\":\"func\",\"function\":{\"name\":\"a\"}}]}", "tools", "tools[0] must be"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", "tools", "name must be 1 to 64"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}", "tools", "name must be 1 to 64"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":[]}}]}", "tools", "parameters must be an object"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"strict\":1}}]}", "tools", "strict must be a boolean"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"zz\":1}}]}", "tools", "zz is not a field of a function"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"},\"x\":1}]}", "tools", "x is not a field of a tool"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":{\"name\":\"a\"}}]}", "tools", "both named 'a'"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":\"any\"}", "tool_choice", "tool_choice must be"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}}}", "tool_choice", "'b', which is not in tools"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":{\"type\":\"function\"}}", "tool_choice", "tool_choice must be"},
        {"{\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}}}", "tool_choice", "tools is empty"},
        {"{\"tool_choice\":\"auto\"}", "tool_choice", "needs tools"},
        {"{\"tool_choice\":\"required\"}", "tool_choice", "tool_choice \"required\" needs tools"},
        {"{\"tools\":[],\"tool_choice\":\"required\"}", "tool_choice", "tool_choice \"required\" needs tools"},
        {"{\"tools\":null,\"tool_choice\":\"required\"}", "tool_choice", "needs tools"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"parallel_tool_calls\":1}", "parallel_tool_calls", "must be a boolean"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        param = NULL, msg[0] = 0;
        int rc = tools_rc(bad[i].body, &tu, &param, msg, sizeof msg);
        CHECK(rc == -1 && param && !strcmp(param, bad[i].param) && strstr(msg, bad[i].needle), "bad tools %zu (%s): rc %d, "
              "param %s, message '%s'", i, bad[i].body, rc, param ? param : "(none)", msg);
    }
}

/* The rewritten messages of a conversation, against the texts of the format written out by hand. */
static void test_messages(void) {
    json_t *msgs = J("[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"weather?\"},"
                     "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
                     "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}},{\"id\":\"c2\",\"type\":\"function\","
                     "\"function\":{\"name\":\"get_time\",\"arguments\":\"{}\"}}]},"
                     "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},{\"role\":\"tool\",\"content\":\"noon\"},"
                     "{\"role\":\"assistant\",\"content\":\"Sunny at noon.\",\"tool_calls\":[{\"id\":\"c3\",\"type\":\"function\","
                     "\"function\":{\"name\":\"log\",\"arguments\":\"{\\\"ok\\\":true}\"}}]},{\"role\":\"developer\",\"content\":\"d\"}]");
    json_t *tools = J("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather, in \\u00b0C\","
                      "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]");
    ib_api_tool_msgs tm;
    char why[256] = "";
    int rc = ib_api_tool_messages(IB_CHAT_TOOLS_QWEN, msgs, tools, &tm, NULL, why, sizeof why);
    static const char *const want_role[] = {"system", "user", "assistant", "user", "assistant", "system"};
    static const char *const want[] = {
        "Be brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather, in \xc2\xb0" "C\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call>",
        "weather?",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nnoon\n</tool_response>",
        "Sunny at noon.\n<tool_call>\n{\"name\": \"log\", \"arguments\": {\"ok\":true}}\n</tool_call>",
        "d",
    };
    CHECK(rc == 0 && tm.n == 6, "rewritten conversation: rc %d, %zu messages (%s)", rc, rc ? 0 : tm.n, why);
    for (size_t i = 0; rc == 0 && i < tm.n && i < 6; i++)
        CHECK(!strcmp(tm.m[i].role, want_role[i]) && !strcmp(tm.m[i].content, want[i]), "message %zu: %s '%s', want %s '%s'",
              i, tm.m[i].role, tm.m[i].content, want_role[i], want[i]);
    if (rc == 0) ib_api_tool_msgs_free(&tm);
    /* without tools, no system message: no tools block, the history's calls still written */
    json_t *m2 = J("[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                   "[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]");
    rc = ib_api_tool_messages(IB_CHAT_TOOLS_QWEN, m2, NULL, &tm, NULL, why, sizeof why);
    CHECK(rc == 0 && tm.n == 2 && !strcmp(tm.m[0].content, "u") &&
              !strcmp(tm.m[1].content, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"),
          "history without tools: rc %d (%s)", rc, why);
    if (rc == 0) ib_api_tool_msgs_free(&tm);
    json_decref(m2);
    /* tools and no system message: a system turn of the tools block alone */
    m2 = J("[{\"role\":\"user\",\"content\":\"u\"}]");
    rc = ib_api_tool_messages(IB_CHAT_TOOLS_QWEN, m2, tools, &tm, NULL, why, sizeof why);
    CHECK(rc == 0 && tm.n == 2 && !strcmp(tm.m[0].role, "system") && !strncmp(tm.m[0].content, "# Tools\n\n", 9) &&
              !strcmp(tm.m[1].content, "u"), "tools without a system message: rc %d (%s)", rc, why);
    if (rc == 0) ib_api_tool_msgs_free(&tm);
    json_decref(m2);
    /* refused messages */
    static const struct {
        const char *msgs, *needle;
    } bad[] = {
        {"[]", "non-empty"},
        {"[{\"role\":\"robot\",\"content\":\"x\"}]", "is not system, developer, user, assistant or tool"},
        {"[{\"role\":\"user\",\"content\":null}]", "needs a string content"},
        {"[{\"role\":\"tool\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":3}]", "messages[1] needs a string content"},
        {"[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]", "only assistant messages carry tool_calls"},
        {"[{\"role\":\"tool\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"y\",\"tool_calls\":[]}]", "messages[1]: only assistant"},
        {"[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]}]", "must be a non-empty array"},
        {"[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]", "arguments must be a string"},
        {"[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{\"name\":\"f g\",\"arguments\":\"{}\"}}]}]", "name must be 1 to 64"},
        {"[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"x\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]", "tool_calls[0] must be"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *mb = J(bad[i].msgs);
        why[0] = 0;
        rc = ib_api_tool_messages(IB_CHAT_TOOLS_QWEN, mb, NULL, &tm, NULL, why, sizeof why);
        CHECK(rc == -1 && strstr(why, bad[i].needle), "bad messages %zu (%s): rc %d, '%s'", i, bad[i].msgs, rc, why);
        if (rc == 0) ib_api_tool_msgs_free(&tm);
        json_decref(mb);
    }
    json_decref(msgs);
    json_decref(tools);
}

/* ib_api_tool_calls_read on text: the calls as compact JSON text and the content length, or "none". */
static void read_case(const char *text, int max_calls, const char *want_calls, long want_cl) {
    size_t cl = 12345;
    json_t *calls = ib_api_tool_calls_read(text, strlen(text), "X", max_calls, &cl);
    char *got = calls ? json_dumps(calls, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    int ok = want_calls ? got && !strcmp(got, want_calls) && (long)cl == want_cl : !calls;
    CHECK(ok, "read '%s': got %s (content %zu), want %s (content %ld)", text, got ? got : "none", calls ? cl : 0,
          want_calls ? want_calls : "none", want_cl);
    free(got);
    json_decref(calls);
}

static void test_read(void) {
    const char *one = "[{\"id\":\"call_X_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]";
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", 0, one, 0);
    read_case("Let me look.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n", 0, one, 12);
    read_case("<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>", 0, one, 0);
    /* a string of the arguments may hold the close: the call is read as JSON, not cut there */
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x</tool_call>y\"}}\n</tool_call>", 0,
              "[{\"id\":\"call_X_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":\\\"x</tool_call>y\\\"}\"}}]", 0);
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}} x\n</tool_call>", 0, NULL, 0);
    /* a call written inside the thoughts is no call; the one after them is (content: the thoughts) */
    read_case("<think>\nI could <tool_call> here.\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", 0,
              one, 42);
    read_case("<think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n</think>\n\nDone.", 0, NULL, 0);
    read_case("<think>\nno end <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", 0, NULL, 0);
    const char *two_t = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", "
                        "\"arguments\": {}}\n</tool_call>";
    read_case(two_t, 0,
              "[{\"id\":\"call_X_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}},"
              "{\"id\":\"call_X_1\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]",
              0);
    read_case(two_t, 1, one, 0);   /* parallel_tool_calls false: the first only */
    /* none: no block, a block cut off, not JSON, not that shape, text after or between the blocks */
    read_case("just text", 0, NULL, 0);
    read_case("", 0, NULL, 0);
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}", 0, NULL, 0);
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>", 0, NULL, 0);
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>", 0, NULL, 0);
    read_case("<tool_call>\n{\"name\": \"f g\", \"arguments\": {}}\n</tool_call>", 0, NULL, 0);
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {}, \"x\": 1}\n</tool_call>", 0, NULL, 0);
    read_case("<tool_call>\n{\"name\": \"f\", \"name\": \"g\", \"arguments\": {}}\n</tool_call>", 0, NULL, 0);
    read_case("<tool_call>\n[1]\n</tool_call>", 0, NULL, 0);
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> and more", 0, NULL, 0);
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> x <tool_call>\n{\"name\": \"g\", "
              "\"arguments\": {}}\n</tool_call>", 0, NULL, 0);
    /* forced: the arguments object, else nothing */
    json_t *c = ib_api_tool_call_forced("f", "{ \"a\" : 1 }", 11, "X");
    char *s = c ? json_dumps(c, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    CHECK(s && !strcmp(s, one), "forced call: %s", s ? s : "none");
    free(s);
    json_decref(c);
    c = ib_api_tool_call_forced("f", "{\"a\": ", 6, "X");
    CHECK(!c, "a forced call cut off is no call");
    json_decref(c);
    char *pre = ib_api_tool_call_prefix(IB_CHAT_TOOLS_QWEN, "get_weather");
    CHECK(pre && !strcmp(pre, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "), "forced prefix: %s", pre ? pre : "none");
    free(pre);
    json_t *fn = J("{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"required\":[]}}"), *rf = ib_api_tool_arguments_format(fn);
    s = rf ? json_dumps(rf, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    CHECK(s && !strcmp(s, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"arguments\",\"schema\":{\"type\":\"object\","
                          "\"required\":[]}}}"),
          "a function's arguments format: %s", s ? s : "none");
    free(s);
    json_decref(rf);
    json_decref(fn);
    /* no parameters: any object, as a schema (bounded numbers), not json_object */
    fn = J("{\"name\":\"f\"}"), rf = ib_api_tool_arguments_format(fn);
    s = rf ? json_dumps(rf, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    CHECK(s && !strcmp(s, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"arguments\",\"schema\":{\"type\":\"object\"}}}"),
          "a function without parameters: %s", s ? s : "none");
    free(s);
    json_decref(rf);
    json_decref(fn);
    /* required: the opening before the name, and the reply after it read back */
    pre = ib_api_tool_call_prefix(IB_CHAT_TOOLS_QWEN, NULL);
    CHECK(pre && !strcmp(pre, "<tool_call>\n{\"name\": \""), "required prefix: %s", pre ? pre : "none");
    free(pre);
}

/* ib_api_tool_calls_required on text: the calls as compact JSON text, or "none". */
static void required_case(const char *text, int parallel, const char *want_calls) {
    json_t *calls = ib_api_tool_calls_required(text, strlen(text), "X", parallel);
    char *got = calls ? json_dumps(calls, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    CHECK(want_calls ? got && !strcmp(got, want_calls) : !calls, "required read '%s': got %s, want %s", text,
          got ? got : "none", want_calls ? want_calls : "none");
    free(got);
    json_decref(calls);
}

static void test_required_read(void) {
    const char *one = "[{\"id\":\"call_X_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]";
    const char *two = "[{\"id\":\"call_X_0\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}},"
                      "{\"id\":\"call_X_1\",\"type\":\"function\",\"function\":{\"name\":\"g-2\",\"arguments\":\"{}\"}}]";
    required_case("f\", \"arguments\": {\"a\": 1}", 1, one);              /* stopped after the arguments */
    required_case("f\", \"arguments\": {\"a\": 1}}\n</tool_call>", 1, one); /* stopped after the close */
    required_case("f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g-2\", \"arguments\": {}", 1, two);
    required_case("f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g-2\", \"arguments\": {}", 0, one);
    /* a key the schema leaves open written twice (the mask allows it): its last value, still a call; a
     * reply read for calls ("auto") with it is no call */
    required_case("f\", \"arguments\": {\"a\": 2, \"a\": 1}", 1, one);
    read_case("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 2, \"a\": 1}}\n</tool_call>", 0, NULL, 0);
    json_t *fc = ib_api_tool_call_forced("f", "{\"a\": 2, \"a\": 1}", 16, "X");
    char *fs = fc ? json_dumps(fc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    CHECK(fs && !strcmp(fs, one), "a forced call with a key twice: its last value (%s)", fs ? fs : "none");
    free(fs);
    json_decref(fc);
    /* cut off (max_tokens, a stop string): no call */
    required_case("f\", \"arguments\": {\"a\": ", 1, NULL);
    required_case("f\", \"argu", 1, NULL);
    required_case("", 1, NULL);
    required_case("f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g", 1, NULL);
}

int main(void) {
    test_tool_use();
    test_messages();
    test_read();
    test_required_read();
    TEST_MAIN_END("test_tool_calls");
}
