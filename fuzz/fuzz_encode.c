/*
 * fuzz_encode.c — libFuzzer target: the tokenizer's encode on arbitrary bytes, with the default
 * model's tokenizer (NFC, Qwen-style regex, ByteLevel; IB_FUZZ_TOKENIZER names another). The first
 * byte picks the flags and a cancellation point. Checks: a count past the buffer's capacity is
 * the count a buffer of that size then gets; ids in range; for text with nothing to normalize
 * (bytes below 0x80) decoding gives back the exact bytes; a cancelled encode returns -2 and an
 * uncancelled one the plain encode's count.
 */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

static ib_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *p = getenv("IB_FUZZ_TOKENIZER");
    ib_error err = {0};
    if (ib_tokenizer_load(p ? p : "models/default/tokenizer.json", 1 << 20, &tok, &err) != IB_OK) {
        fprintf(stderr, "fuzz_encode: %s (run from the repository root or set IB_FUZZ_TOKENIZER)\n", err.msg);
        exit(1);
    }
    return 0;
}

static int stop_after(void *ctx) { return --*(int *)ctx <= 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int flags = data[0] & 3, budget = 1 + (data[0] >> 2);
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    /* normalization may lengthen text (NFC up to 3x its bytes), so the count can pass n: a first
     * guess of n + 4 ids, then exactly the count the encode asked for, which must not change */
    int cap = (int)n + 4;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int k = ib_tokenizer_encode_ex(tok, s, n, flags, ids, cap);
    if (k < 0) abort();
    if (k > cap) {
        free(ids);
        ids = malloc((size_t)k * sizeof *ids);
        if (ib_tokenizer_encode_ex(tok, s, n, flags, ids, k) != k) abort();
    }
    int ascii = 1;
    for (size_t i = 0; i < n; i++) ascii &= data[1 + i] < 0x80;
    char *back = malloc(((size_t)k + 1) * 64);   /* 64 bytes per id (BOS/EOS included: k may exceed n) */
    size_t bl = 0;
    for (int i = 0; i < k; i++) {
        if (ids[i] < 0 || ids[i] >= ib_tokenizer_n_ids(tok)) abort();
        int w = ib_tokenizer_decode(tok, ids[i], back + bl, 64);
        if (w > 0) bl += (size_t)w;
    }
    if (ascii && !(flags & IB_TOKENIZE_ADD_SPECIAL) && (bl != n || memcmp(back, s, n))) abort();
    int c = ib_tokenizer_encode_cancel(tok, s, n, flags, NULL, 0, stop_after, &budget);
    if (c != -2 && c != k) abort();
    free(back);
    free(ids);
    return 0;
}
