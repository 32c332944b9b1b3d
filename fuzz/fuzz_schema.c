/*
 * fuzz_schema.c — libFuzzer target: response_format json_schema (src/server/json_schema.c, through
 * json_constraint.c's entry points). The input is a response_format object (JSON), then after a NUL
 * byte the text a model would write. The format check must give a verdict with a one-line message;
 * an accepted schema is set up and the text fed byte by byte, and at every byte the mask over a
 * vocabulary of the 256 single bytes plus a few multi-byte tokens must agree with the reader: a
 * single-byte token is allowed exactly when the reader takes that byte (over the first 48 bytes; the
 * stop id exactly when the value is whole). No crash,
 * leak, undefined behaviour or disagreement.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static const char *const multi[] = {"{\"", "\":", "\",\"", "true", "null", "\\u00", "\xc3\xa9", "\xe2\x82", "]}", NULL};

static int fz_bytes(void *ctx, int32_t t, char *buf, int cap) {
    if (t < 256) {
        buf[0] = (char)t;
        return 1;
    }
    const char *m = multi[t - 256];
    memcpy(buf, m, strlen(m));
    return (int)strlen(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ib_json_vocab v;
    static int nv;
    if (!nv) {
        while (multi[nv]) nv++;
        nv += 256;
        if (ib_json_vocab_build(&v, nv, fz_bytes, NULL)) abort();
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t jl = nul ? (size_t)(nul - data) : size;
    json_t *rf = json_loadb((const char *)data, jl, JSON_DECODE_ANY, NULL);
    if (!rf) return 0;
    char msg[512] = "";
    if (ib_json_format_check(rf, msg, sizeof msg)) {
        if (!msg[0] || strchr(msg, '\n')) abort(); /* a refusal has a one-line message */
        json_decref(rf);
        return 0;
    }
    ib_json_state st;
    int c = ib_json_setup(&st, rf);
    if (c < 0) abort();
    if (c == 1) {
        float *lg = malloc((size_t)nv * sizeof *lg);
        int32_t stop = 0; /* id 0 (the NUL byte) stands for the stop id */
        const uint8_t *text = nul ? nul + 1 : data + size;
        size_t tl = nul ? size - jl - 1 : 0;
        for (size_t i = 0; i <= tl && i < 300; i++) {
            for (int t = 0; t < nv; t++) lg[t] = 0.25f;
            int n = ib_json_mask(&st, &v, lg, nv, &stop, 1), count = 0;
            int done = ib_json_done(&st);
            for (int t = 0; t < nv; t++) count += !isinf(lg[t]);
            if (n != count) abort();
            if ((!isinf(lg[0])) != (done != 0)) abort();
            for (int b = 1; b < 256 && i < 48; b++) { /* before the value is whole: a byte token iff the reader takes it */
                ib_json_state x = st;
                if (st.run && !(x.run = ib_schema_run_clone(st.run))) abort();
                int takes = !ib_json_step(&x, (unsigned char)b);
                if (st.run) ib_schema_run_free(x.run);
                if (!done && takes != !isinf(lg[b])) abort();
            }
            if (i == tl || ib_json_step(&st, text[i])) break;
        }
        free(lg);
    }
    ib_json_release(&st);
    json_decref(rf);
    return 0;
}
