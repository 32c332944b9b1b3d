/*
 * store_codec.h — how every session-store back end writes a record's values and reads them back
 * checked: float settings as their IEEE-754 bits, tokens as little-endian int32, the history as rows
 * that must tile [0, n_tokens) exactly, and the range checks a loaded session row must pass. One
 * definition, so a session written by one back end means the same on another.
 */
#ifndef IB_STORE_STORE_CODEC_H
#define IB_STORE_STORE_CODEC_H
#include <stdint.h>

#include "store/store.h"

/* A float's IEEE-754 bits as an integer column value, and back: exact for every value, NaN included. */
int64_t ib_store_fbits(float f);
float ib_store_bitsf(int64_t v);

/* Encode n tokens as little-endian int32 into buf [4n]. */
void ib_store_enc_tokens(const int32_t *t, int n, unsigned char *buf);

/* Allocate out->tokens and out->flags for out->n_tokens tokens (at least one element each).
 * IB_ERR_NOMEM (naming store and session) when that fails. */
ib_status ib_store_history_alloc(const char *store, ib_store_session *out, ib_error *err);

/* Add one stored history row to out: it must start at *have, hold tn token bytes (a positive multiple
 * of 4) and tn / 4 flag bytes, and not run past out->n_tokens; its tokens and flags are decoded into
 * out at *have, and *have grows. IB_ERR_FORMAT naming store, session and row otherwise. */
ib_status ib_store_history_add(const char *store, ib_store_session *out, int *have, long long first,
                               const unsigned char *tb, long tn, const unsigned char *fb, long fn, ib_error *err);

/* After the last row: IB_ERR_FORMAT unless the rows held exactly out->n_tokens tokens. */
ib_status ib_store_history_end(const char *store, const ib_store_session *out, int have, ib_error *err);

/* The integer columns of a loaded session row, before they are trusted: max_context, kv_sink,
 * kv_window, kv_chunk, n_fed, n_tokens (in that order) each in [0, 2^30] and n_fed <= n_tokens, the
 * owner 64 characters, the model identity non-empty and shorter than IB_MODEL_ID_LEN, the KV type a
 * known name (parsed into *dtype). 0 when all hold, -1 otherwise. */
int ib_store_row_valid(const long long ints[6], const char *owner, const char *model, const char *dtype_name,
                       ib_kv_dtype *dtype);

#endif
