/*
 * store.c — the session store's front: URI dispatch and argument checks, then the back end's table
 * (store_impl.h). See store.h for the contract.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sha256.h"
#include "store/store_impl.h"

int ib_store_id_valid(const char *id) {
    if (!id) return -1;
    size_t n = strlen(id);
    if (n < 1 || n >= IB_STORE_ID_MAX) return -1;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return -1;
    }
    return 0;
}

/* 0 when s is 64 lower-case hex digits (an owner hash), else -1. */
static int owner_valid(const char *s) {
    if (!s || strlen(s) != 64) return -1;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return -1;
    return 0;
}

void ib_store_owner_hash(const char *key, char hex[65]) {
    uint8_t d[32];
    ib_sha256_bytes(key ? key : "", key ? strlen(key) : 0, d);
    ib_sha256_hex(d, hex);
}

ib_status ib_store_open(const char *uri, ib_store **out, ib_error *err) {
    *out = NULL;
    if (!uri) return ib_fail(err, IB_ERR_INVALID_ARG, "store: no URI");
    if (!strncmp(uri, "sqlite:", 7)) {
        if (!uri[7]) return ib_fail(err, IB_ERR_INVALID_ARG, "store %s: no file name after sqlite:", uri);
        return ib_store_sqlite_open(uri + 7, out, err);
    }
    if (!strncmp(uri, "postgresql://", 13) || !strncmp(uri, "postgres://", 11)) return ib_store_pg_open(uri, out, err);
    return ib_fail(err, IB_ERR_UNSUPPORTED, "store: unknown kind of URI (expected sqlite:PATH or postgresql://...)");
}

void ib_store_close(ib_store *st) {
    if (st) st->ops->close(st);
}

/* Check a progress record against a history of n_tokens tokens. */
static ib_status progress_check(const char *id, const ib_store_progress *p, long n_tokens, ib_error *err) {
    if (p->n_fed < 0 || p->n_fed > n_tokens)
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: n_fed %d is outside [0, %ld]", id, p->n_fed,
                       n_tokens);
    return IB_OK;
}

/* Check n tokens and their flags. */
static ib_status tokens_check(const char *id, const int32_t *tokens, const uint8_t *flags, int n, ib_error *err) {
    if (n < 0 || (n > 0 && (!tokens || !flags)))
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: %d tokens without their arrays", id, n);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0)
            return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: token %d is negative (%d)", id, i,
                           (int)tokens[i]);
        if (flags[i] & ~(IB_STORE_TOK_SAMPLED | IB_STORE_TOK_NOTE_ON_FEED))
            return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: token %d has unknown flags 0x%x", id, i,
                           flags[i]);
    }
    return IB_OK;
}

#define CHECK_ID(id)                                                                            \
    do {                                                                                        \
        if (ib_store_id_valid(id))                                                              \
            return ib_fail(err, IB_ERR_INVALID_ARG, "store: session id is not 1-64 of [A-Za-z0-9_.-]"); \
    } while (0)

ib_status ib_store_create(ib_store *st, const ib_store_session *rec, ib_error *err) {
    CHECK_ID(rec->id);
    if (owner_valid(rec->owner))
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: owner is not a hex SHA-256", rec->id);
    if (!memchr(rec->model_id, 0, sizeof rec->model_id) || !rec->model_id[0])
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: no model identity", rec->id);
    if ((unsigned)rec->kv_dtype >= IB_KV_DTYPE_COUNT)
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: kv_dtype %d is not a KV type", rec->id,
                       (int)rec->kv_dtype);
    if (rec->max_context < 0 || rec->kv_sink < 0 || rec->kv_window < 0 || rec->kv_chunk < 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: negative context or KV policy", rec->id);
    ib_status rc = tokens_check(rec->id, rec->tokens, rec->flags, rec->n_tokens, err);
    if (!rc) rc = progress_check(rec->id, &rec->progress, rec->n_tokens, err);
    return rc ? rc : st->ops->create(st, rec, err);
}

ib_status ib_store_load(ib_store *st, const char *id, ib_store_session *out, ib_error *err) {
    memset(out, 0, sizeof *out);
    CHECK_ID(id);
    return st->ops->load(st, id, out, err);
}

ib_status ib_store_append(ib_store *st, const char *id, int at, const int32_t *tokens, const uint8_t *flags, int n,
                          const ib_store_progress *p, ib_error *err) {
    CHECK_ID(id);
    if (n < 1 || at < 0 || (long)at + n > (1L << 30))
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: append of %d tokens at %d", id, n, at);
    ib_status rc = tokens_check(id, tokens, flags, n, err);
    if (!rc && p) rc = progress_check(id, p, (long)at + n, err);
    return rc ? rc : st->ops->append(st, id, at, tokens, flags, n, p, err);
}

ib_status ib_store_update(ib_store *st, const char *id, const ib_store_progress *p, ib_error *err) {
    CHECK_ID(id);
    if (!p || p->n_fed < 0) return ib_fail(err, IB_ERR_INVALID_ARG, "store: session %s: bad progress", id);
    return st->ops->update(st, id, p, err); /* the back end checks n_fed against the stored count */
}

ib_status ib_store_delete(ib_store *st, const char *id, ib_error *err) {
    CHECK_ID(id);
    return st->ops->del(st, id, err);
}

ib_status ib_store_list_owner(ib_store *st, const char *owner, char ***ids, int *n, ib_error *err) {
    *ids = NULL;
    *n = 0;
    if (owner_valid(owner)) return ib_fail(err, IB_ERR_INVALID_ARG, "store: owner is not a hex SHA-256");
    return st->ops->list_owner(st, owner, ids, n, err);
}

void ib_store_ids_free(char **ids, int n) {
    if (!ids) return;
    for (int i = 0; i < n; i++) free(ids[i]);
    free(ids);
}

void ib_store_session_free(ib_store_session *rec) {
    if (!rec) return;
    free(rec->tokens);
    free(rec->flags);
    rec->tokens = NULL;
    rec->flags = NULL;
    rec->n_tokens = 0;
}
