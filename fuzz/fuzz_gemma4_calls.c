/*
 * fuzz_gemma4_calls.c — libFuzzer target: a reply read for calls in Gemma 4's tool syntax
 * (ib_gemma4_tool_calls_read, src/server/tool_form_gemma4.c). The input is the reply's text. Calls
 * read back must be well formed (a valid name, arguments the JSON text of an object, the content no
 * longer than the text), and where the arguments can be written unambiguously (no string holding the
 * <|"|> delimiter, no key that is empty, padded or holds one of :{}[],) writing them as the server
 * writes a history's call and reading that text again must give the same arguments. No crash, leak,
 * undefined behaviour or disagreement.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

/* Whether v can be written and read back as the same value. */
static int writable(json_t *v) {
    if (json_is_string(v)) return !strstr(json_string_value(v), "<|\"|>") && strlen(json_string_value(v)) == json_string_length(v);
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!writable(json_array_get(v, i))) return 0;
    }
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            size_t n = strlen(k);
            if (!n || strpbrk(k, ":{}[],") || strstr(k, "<|\"|>") || strchr(" \t\n\r", k[0]) || strchr(" \t\n\r", k[n - 1]) ||
                !writable(x))
                return 0;
        }
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t cl = 0;
    json_t *calls = ib_gemma4_tool_calls_read((const char *)data, size, "f", 0, &cl);
    if (!calls) return 0;
    if (cl > size || json_array_size(calls) < 1) abort();
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *f = json_object_get(json_array_get(calls, i), "function");
        const char *name = json_string_value(json_object_get(f, "name")), *a = json_string_value(json_object_get(f, "arguments"));
        json_t *args = a ? json_loads(a, JSON_REJECT_DUPLICATES, NULL) : NULL;
        if (!name || !json_is_object(args)) abort();
        if (writable(args)) { /* written as a history's call, then read again */
            json_t *msgs = json_pack("[{s:s, s:n, s:[{s:s, s:{s:s, s:s}}]}]", "role", "assistant", "content", "tool_calls", "id", "c",
                                     "function", "name", name, "arguments", a);
            ib_api_tool_msgs tm;
            char why[256];
            if (!msgs) abort();
            if (ib_api_tool_messages(IB_CHAT_TOOLS_GEMMA4, msgs, NULL, &tm, NULL, why, sizeof why)) abort();
            const char *text = tm.m[0].tool_text;
            size_t cl2 = 0;
            json_t *again = text ? ib_gemma4_tool_calls_read(text, strlen(text), "f", 0, &cl2) : NULL;
            json_t *args2 = again ? json_loads(json_string_value(json_object_get(json_object_get(json_array_get(again, 0), "function"),
                                                                                 "arguments")),
                                               0, NULL)
                                  : NULL;
            if (!args2 || !json_equal(args, args2) || cl2 != 0) abort();
            json_decref(args2);
            json_decref(again);
            ib_api_tool_msgs_free(&tm);
            json_decref(msgs);
        }
        json_decref(args);
    }
    json_decref(calls);
    return 0;
}
