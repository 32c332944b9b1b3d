/*
 * store_codec.c — the value encodings and load-time checks the session-store back ends share
 * (contracts in store_codec.h).
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "store/store_codec.h"

int64_t ib_store_fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (int64_t)u;
}

float ib_store_bitsf(int64_t v) {
    uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void ib_store_enc_tokens(const int32_t *t, int n, unsigned char *buf) {
    for (int i = 0; i < n; i++) {
        uint32_t u = (uint32_t)t[i];
        buf[4 * i] = (unsigned char)u;
        buf[4 * i + 1] = (unsigned char)(u >> 8);
        buf[4 * i + 2] = (unsigned char)(u >> 16);
        buf[4 * i + 3] = (unsigned char)(u >> 24);
    }
}

ib_status ib_store_history_alloc(const char *store, ib_store_session *out, ib_error *err) {
    int n = out->n_tokens;
    out->tokens = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    out->flags = malloc((size_t)(n ? n : 1));
    if (!out->tokens || !out->flags)
        return ib_fail(err, IB_ERR_NOMEM, "store %s: session %s: out of memory", store, out->id);
    return IB_OK;
}

ib_status ib_store_history_add(const char *store, ib_store_session *out, int *have, long long first,
                               const unsigned char *tb, long tn, const unsigned char *fb, long fn, ib_error *err) {
    int n = out->n_tokens, h = *have;
    if (first != h || tn <= 0 || tn % 4 || fn != tn / 4 || (long long)h + fn > n || !tb || !fb)
        return ib_fail(err, IB_ERR_FORMAT,
                       "store %s: session %s: history row at %lld (%ld token bytes, %ld flag bytes) does not continue "
                       "the %d tokens before it of %d",
                       store, out->id, first, tn, fn, h, n);
    for (long i = 0; i < fn; i++) {
        uint32_t u = (uint32_t)tb[4 * i] | (uint32_t)tb[4 * i + 1] << 8 | (uint32_t)tb[4 * i + 2] << 16 |
                     (uint32_t)tb[4 * i + 3] << 24;
        out->tokens[h + i] = (int32_t)u;
        out->flags[h + i] = fb[i];
    }
    *have = h + (int)fn;
    return IB_OK;
}

ib_status ib_store_history_end(const char *store, const ib_store_session *out, int have, ib_error *err) {
    if (have != out->n_tokens)
        return ib_fail(err, IB_ERR_FORMAT, "store %s: session %s: history holds %d tokens, the session says %d", store,
                       out->id, have, out->n_tokens);
    return IB_OK;
}

int ib_store_row_valid(const long long ints[6], const char *owner, const char *model, const char *dtype_name,
                       ib_kv_dtype *dtype) {
    int bad = !owner || strlen(owner) != 64 || !model || !model[0] || strlen(model) >= IB_MODEL_ID_LEN ||
              !dtype_name || ib_kv_dtype_parse(dtype_name, dtype) != 0;
    for (int i = 0; i < 6; i++) bad |= ints[i] < 0 || ints[i] > (1LL << 30);
    bad |= ints[4] > ints[5]; /* n_fed <= n_tokens */
    return bad ? -1 : 0;
}
