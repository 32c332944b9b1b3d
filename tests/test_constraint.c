/*
 * test_constraint.c — a reply's constraint in and out of verification records (src/server/constraint.c):
 *   - for a json_object and a json_schema response_format, a named tool_choice and "required" (parallel
 *     on and off), the record's fields are the ones written out here by hand;
 *   - read back from the record, the constraint sets up a reader whose mask over a byte vocabulary
 *     equals the request's own at every byte of a reply text (and an edited record's mask differs
 *     somewhere along it: the comparison can fail);
 *   - malformed record constraints are refused with one line naming the field.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/api.h"

/* A check usable in an expression: counted as CHECK counts it; returns cond. */
static int tc(int cond, const char *what, int line) {
    if (cond) check_passed_++;
    else {
        check_failed_++;
        fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, line, what);
    }
    return cond;
}
#define TC(cond) tc((cond) != 0, #cond, __LINE__)

static json_t *J(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fprintf(stderr, "test JSON does not parse: %s: %s\n", je.text, s);
    return j;
}

static int byte_tok(void *ctx, int32_t t, char *buf, int cap) {
    (void)ctx;
    (void)cap;
    buf[0] = (char)t;
    return 1;
}

/* The reader of chat body b (as the server sets it up); 1 when constrained. */
static int setup(json_t *b, ib_json_state *s) {
    ib_api_tool_use tu;
    const char *param = NULL;
    char msg[256];
    if (ib_api_tools(b, &tu, &param, msg, sizeof msg)) {
        fprintf(stderr, "tools refused: %s\n", msg);
        return -1;
    }
    return ib_constraint_setup(s, IB_CHAT_TOOLS_QWEN, b, &tu);
}

/* The number of bytes of text at which the masks of readers a and b (stepped along text) differ,
 * -1 when they never do. Stop id 0 (NUL never occurs in text). */
static int first_mask_diff(ib_json_state *a, ib_json_state *b, const ib_json_vocab *v, const char *text) {
    const int32_t stop = 0;
    size_t n = strlen(text);
    for (size_t i = 0; i <= n; i++) {
        float la[256], lb[256];
        for (int t = 0; t < 256; t++) la[t] = lb[t] = 0.0f;
        ib_json_mask(a, v, la, 256, &stop, 1);
        ib_json_mask(b, v, lb, 256, &stop, 1);
        for (int t = 0; t < 256; t++)
            if (isinf(la[t]) != isinf(lb[t])) return (int)i;
        if (i == n) break;
        int ra = ib_json_step(a, (unsigned char)text[i]), rb = ib_json_step(b, (unsigned char)text[i]);
        if (ra != rb) return (int)i;
        if (ra) break;
    }
    return -1;
}

/* Request body req: its record fields must equal want (JSON); read back, the reader must mask as the
 * request's does along text. */
static void round_trip(const char *name, const char *req, const char *want, const char *text, const ib_json_vocab *v) {
    json_t *b = J(req), *w = J(want);
    ib_json_state s0, s1;
    TC(setup(b, &s0) == 1);
    ib_api_tool_use tu;
    const char *param;
    char msg[256];
    TC(ib_api_tools(b, &tu, &param, msg, sizeof msg) == 0);
    json_t *rec = ib_constraint_record(b, &tu);
    if (!TC(rec && json_equal(rec, w))) {
        char *d = json_dumps(rec, JSON_COMPACT);
        fprintf(stderr, "  %s: record %s\n", name, d ? d : "(null)");
        free(d);
    }
    json_t *back = NULL;
    TC(ib_constraint_from_record(rec, &back, msg, sizeof msg) == 0 && back);
    if (back && TC(setup(back, &s1) == 1)) {
        int d = first_mask_diff(&s0, &s1, v, text);
        if (!TC(d == -1)) fprintf(stderr, "  %s: the masks differ at byte %d\n", name, d);
        ib_json_release(&s1);
    }
    ib_json_release(&s0);
    json_decref(back);
    json_decref(rec);
    json_decref(b);
    json_decref(w);
}

/* Record fields rec, edited: read back, its mask must differ from request req's along text. */
static void edited_differs(const char *name, const char *req, const char *rec, const char *text, const ib_json_vocab *v) {
    json_t *b = J(req), *r = J(rec), *back = NULL;
    char msg[256];
    ib_json_state s0, s1;
    TC(setup(b, &s0) == 1);
    TC(ib_constraint_from_record(r, &back, msg, sizeof msg) == 0 && back);
    if (back && TC(setup(back, &s1) == 1)) {
        if (!TC(first_mask_diff(&s0, &s1, v, text) >= 0)) fprintf(stderr, "  %s: the masks never differ\n", name);
        ib_json_release(&s1);
    }
    ib_json_release(&s0);
    json_decref(back);
    json_decref(r);
    json_decref(b);
}

/* Record fields rec must be refused, the message one line starting with field. */
static void refused(const char *rec, const char *field) {
    json_t *r = J(rec), *back = NULL;
    char msg[256] = "";
    int rc = ib_constraint_from_record(r, &back, msg, sizeof msg);
    if (!TC(rc == -1 && !back && !strncmp(msg, field, strlen(field)) && !strchr(msg, '\n')))
        fprintf(stderr, "  record %s: rc %d, message '%s' (want one naming %s)\n", rec, rc, msg, field);
    json_decref(back);
    json_decref(r);
}

#define WEATHER "{\"type\":\"object\",\"properties\":{\"city\":{\"enum\":[\"Paris\",\"Rome\"]}},\"required\":[\"city\"],\"additionalProperties\":false}"
#define TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\",\"strict\":true,\"parameters\":" WEATHER "}}," \
              "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]"
#define MIN_TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":" WEATHER "}}," \
                  "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]"
#define SCHEMA_RF "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":{\"type\":\"object\",\"properties\":" \
                  "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false}}}"

int main(void) {
    ib_json_vocab v;
    TC(ib_json_vocab_build(&v, 256, byte_tok, NULL) == 0);
    round_trip("json_object", "{\"response_format\":{\"type\":\"json_object\"}}", "{\"response_format\":\"json_object\"}",
               "{\"x\": [1, true]}", &v);
    round_trip("json_schema", "{\"response_format\":" SCHEMA_RF "}", "{\"response_format\":" SCHEMA_RF "}", "{\"a\": 12}", &v);
    round_trip("named", "{" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}",
               "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":" WEATHER "}}],"
               "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}",
               "{\"city\": \"Rome\"}", &v);
    const char *two = "get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}";
    round_trip("required", "{" TOOLS ",\"tool_choice\":\"required\"}",
               "{" MIN_TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":true}", two, &v);
    round_trip("required, parallel off", "{" TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
               "{" MIN_TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
               "get_time\", \"arguments\": {}", &v);
    round_trip("auto with a json_schema", "{" TOOLS ",\"response_format\":" SCHEMA_RF "}", "{\"response_format\":" SCHEMA_RF "}",
               "{\"a\": 1}", &v);

    /* edited records mask otherwise (so the round trips above could fail) */
    edited_differs("schema property renamed", "{\"response_format\":" SCHEMA_RF "}",
                   "{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":{\"type\":\"object\","
                   "\"properties\":{\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"],\"additionalProperties\":false}}}}",
                   "{\"a\": 12}", &v);
    edited_differs("a function removed", "{" TOOLS ",\"tool_choice\":\"required\"}",
                   "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":" WEATHER "}}],"
                   "\"tool_choice\":\"required\",\"parallel_tool_calls\":true}", two, &v);
    edited_differs("parallel made false", "{" TOOLS ",\"tool_choice\":\"required\"}",
                   "{" MIN_TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false}", two, &v);
    edited_differs("json_object for a named call", "{" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}",
                   "{\"response_format\":\"json_object\"}", "{\"city\": \"Rome\"}", &v);

    /* malformed constraints */
    refused("{\"response_format\":\"json_schema\"}", "verification.response_format");
    refused("{\"response_format\":{\"type\":\"text\"}}", "verification.response_format");
    refused("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":{\"type\":\"string\",\"pattern\":\"x\"}}}}",
            "verification.response_format.json_schema.schema");
    refused("{" MIN_TOOLS ",\"tool_choice\":\"auto\"}", "verification.tool_choice");
    refused("{" MIN_TOOLS "}", "verification.tool_choice");
    refused("{\"tool_choice\":\"required\",\"parallel_tool_calls\":true}", "verification.tools");
    refused("{" MIN_TOOLS ",\"tool_choice\":\"required\"}", "verification.parallel_tool_calls");
    refused("{" MIN_TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"parallel_tool_calls\":true}",
            "verification.parallel_tool_calls");
    refused("{" MIN_TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\\nx\"}}}", "verification.tool_choice");
    refused("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
            "\"tool_choice\":\"required\",\"parallel_tool_calls\":true}", "verification.tools");
    refused("{" MIN_TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":true,\"response_format\":\"json_object\"}",
            "verification.response_format");
    /* none: NULL, no error */
    json_t *none = J("{\"prompt\":[1]}"), *back = (json_t *)1;
    char msg[256];
    TC(ib_constraint_from_record(none, &back, msg, sizeof msg) == 0 && back == NULL);
    json_decref(none);
    ib_json_vocab_free(&v);
    TEST_MAIN_END("test_constraint");
}
