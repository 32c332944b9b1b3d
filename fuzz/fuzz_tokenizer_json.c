/*
 * fuzz_tokenizer_json.c — libFuzzer target: tokenizer.json and tokenizer_config.json. The input is
 * split at its first NUL byte: before it tokenizer.json, after it tokenizer_config.json (absent
 * when there is no NUL). A tokenizer that loads must encode a fixed text and its own input, with
 * ids in range, and decode every id; one that does not must leave a one-line message.
 */
#include <stdint.h>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t n1 = nul ? (size_t)(nul - data) : size;
    const char *p = fz_write("tokenizer.json", data, n1);
    if (nul) fz_write("tokenizer_config.json", nul + 1, size - n1 - 1);
    else unlink(fz_path("tokenizer_config.json"));
    ib_tokenizer *t = NULL;
    ib_error err = {0};
    if (ib_tokenizer_load(p, 1 << 16, &t, &err) != IB_OK) {
        if (!err.msg[0] || strchr(err.msg, '\n')) abort();
        return 0;
    }
    static const char text[] = "Hello, world! <|im_end|> caf\xC3\xA9 e\xCC\x81\xCC\x96 \xF0\x9F\x98\x80 \xFF\xFE 123";
    int32_t ids[512];
    for (int k = 0; k < 2; k++) {
        const char *s = k ? (const char *)data : text;
        size_t len = k ? (n1 < 2048 ? n1 : 2048) : sizeof text - 1;
        int n = ib_tokenizer_encode_ex(t, s, len, k ? IB_TOKENIZE_SPLIT_SPECIAL : IB_TOKENIZE_ADD_SPECIAL, ids, 512);
        for (int i = 0; i < n && i < 512; i++) {
            if (ids[i] < 0 || ids[i] >= ib_tokenizer_n_ids(t)) abort();
            char buf[256];
            ib_tokenizer_decode(t, ids[i], buf, sizeof buf);
        }
    }
    ib_tokenizer_free(t);
    return 0;
}
