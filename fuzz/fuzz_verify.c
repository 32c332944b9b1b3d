/*
 * fuzz_verify.c — libFuzzer target: verification records (src/server/verify.c), as POST /v1/verify
 * and `isobatch verify` read them, for a model of 320 tokens and a context of 2048. The input is a
 * record (JSON), then after a NUL byte a reply's text. A record must get a verdict with a one-line
 * message; an accepted one's constraint (response_format, tools, tool_choice, parallel_tool_calls:
 * src/server/constraint.c) must pass the server's tool check again and set up a mask as the re-run
 * would, and the text is then fed byte by byte through that reader (its mask taken once at the start
 * and once at the end, over the 256 single bytes). No crash, leak or undefined behaviour.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "fuzz_common.h"
#include "server/verify.h"

/* The reader's mask over the byte vocabulary with stop id 0; abort when the count is out of range. */
static void mask_once(ib_json_state *s, const ib_json_vocab *v) {
    float logits[256];
    for (int t = 0; t < 256; t++) logits[t] = 0.0f;
    const int32_t stop = 0;
    int n = ib_json_mask(s, v, logits, 256, &stop, 1);
    if (n < 0 || n > 256) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const ib_json_vocab *v = fz_byte_vocab();
    const uint8_t *nul = memchr(data, 0, size);
    size_t jl = nul ? (size_t)(nul - data) : size;
    json_t *j = json_loadb((const char *)data, jl, 0, NULL);
    if (!j) return 0;
    ib_vrec rec;
    char msg[256];
    if (ib_verify_parse(j, 320, 2048, &rec, msg, sizeof msg)) {
        if (!msg[0] || strchr(msg, '\n')) abort();
        json_decref(j);
        return 0;
    }
    if (rec.n_tokens < 1 || rec.n_prompt < 1 || rec.n_stop > 8) abort();
    if (rec.constraint) {
        ib_api_tool_use tu;
        const char *param = NULL;
        char m[256];
        int trc = ib_api_tools(rec.constraint, &tu, &param, m, sizeof m);
        if (trc && trc != -3) abort(); /* the parse checked it: only memory may fail now */
        ib_json_state s;
        if (!trc && ib_constraint_setup(&s, IB_CHAT_TOOLS_QWEN, rec.constraint, &tu) == 1) {
            mask_once(&s, v);
            const uint8_t *text = nul ? nul + 1 : data + size;
            size_t tl = nul ? size - jl - 1 : 0;
            for (size_t i = 0; i < tl && i < 4096; i++)
                if (ib_json_step(&s, text[i])) break;
            mask_once(&s, v);
            ib_json_release(&s);
        }
    }
    ib_verify_free(&rec);
    json_decref(j);
    return 0;
}
