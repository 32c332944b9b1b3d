/*
 * fuzz_tool_pick.c — libFuzzer target: a tool_choice "required" or named reply's reader
 * (src/server/tool_pick.c, and gemma4_args.c for Gemma 4's form). The input: one byte of flags (bit
 * 0: Gemma 4's form, else Qwen's; bit 1: parallel_tool_calls; bit 2: the first tool named instead of
 * "required"), then a tools array (JSON), then after a NUL byte a reply. Tools the server refuses are
 * skipped; otherwise the reader is set up as the server sets it up (ib_constraint_setup) and the reply
 * fed byte by byte; before each byte (the first 64) the byte-sorted walk's mask and every byte
 * stepped on its own (ib_tool_pick_mask_stepped) must be the same bits over the 256 single bytes, and
 * a byte the mask allowed must be one the reader takes. A reply the reader says
 * may end must read back as calls (ib_api_tool_calls_constrained). No crash, leak,
 * undefined behaviour or disagreement.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const ib_json_vocab *v = fz_byte_vocab();
    if (size < 2) return 0;
    const int gemma = data[0] & 1, parallel = (data[0] >> 1) & 1, named = (data[0] >> 2) & 1;
    const ib_chat_tool_form form = gemma ? IB_CHAT_TOOLS_GEMMA4 : IB_CHAT_TOOLS_QWEN;
    data++, size--;
    const uint8_t *nul = memchr(data, 0, size);
    size_t jl = nul ? (size_t)(nul - data) : size;
    json_t *tools = json_loadb((const char *)data, jl, 0, NULL);
    if (!json_is_array(tools) || !json_array_size(tools)) {
        json_decref(tools);
        return 0;
    }
    const char *first = json_string_value(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "name"));
    json_t *body = json_pack("{s:O, s:o, s:b}", "tools", tools, "tool_choice",
                             named && first ? json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", first)
                                            : json_string("required"),
                             "parallel_tool_calls", parallel);
    json_decref(tools);
    if (!body) abort();
    ib_api_tool_use tu;
    const char *param = NULL;
    char msg[256];
    ib_json_state s;
    if (ib_api_tools(body, &tu, &param, msg, sizeof msg) || ib_constraint_setup(&s, form, body, &tu) != 1) {
        json_decref(body);
        return 0;
    }
    const uint8_t *reply = nul ? nul + 1 : data + size;
    size_t rl = nul ? size - jl - 1 : 0;
    if (rl > 4096) rl = 4096;
    const int32_t stop = 0;
    for (size_t i = 0; i <= rl; i++) {
        float a[256], b[256];
        if (i < 64 && s.pick) {
            for (int t = 0; t < 256; t++) a[t] = b[t] = (float)(t % 7);
            int na = ib_json_mask(&s, v, a, 256, &stop, 1), nb = ib_tool_pick_mask_stepped(s.pick, v, b, 256, &stop, 1);
            if (na != nb || memcmp(a, b, sizeof a)) abort();
        }
        if (i == rl) break;
        /* a byte the mask allows (byte 0 is the stop id here) is one the reader takes */
        const int allowed_by_mask = i < 64 && s.pick && reply[i] != 0 && !isinf(a[reply[i]]);
        int took = !ib_json_step(&s, reply[i]);
        if (allowed_by_mask && !took) abort();
        if (!took) break;
        if (ib_json_done(&s) && (s.pick || !gemma)) {
            json_t *calls = ib_api_tool_calls_constrained(form, tu.mode == IB_TOOLS_FORCED ? tu.name : NULL, (const char *)reply, i + 1, "f",
                                                          tu.parallel);
            if (!calls) abort();
            json_decref(calls);
        }
    }
    ib_json_release(&s);
    json_decref(body);
    return 0;
}
