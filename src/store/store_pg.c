/*
 * store_pg.c — the session store on a PostgreSQL server (Debian's libpq), for several isobatch
 * servers sharing their sessions.
 *
 * Durability: every writing call is one transaction, committed with synchronous_commit=on, so the
 * server has flushed its write-ahead log when the call returns (store.h, DURABILITY; a server killed
 * with SIGKILL replays its log at restart). Consistency between servers: an append locks the session
 * row (SELECT ... FOR UPDATE) and checks the stored token count against the caller's position, so two
 * writers never interleave a history; the loser gets IB_ERR_STATE. A load reads the session row and
 * its history in one REPEATABLE READ snapshot.
 *
 * Connections: a small pool (PG_CONNS); a call takes a free connection for its whole transaction, so
 * calls from several threads run at once and the server groups their commits' log flushes. A
 * connection found broken is reset before use; a call whose connection breaks fails with IB_ERR_IO
 * and, when the break came during COMMIT, says that the write's outcome is unknown (an append
 * retried then reports IB_ERR_STATE with the count that shows whether it landed).
 *
 * Schema (version 1, in the connection's default schema; the first open creates it under an
 * advisory lock, so servers starting together do not race):
 *   isobatch_meta(key, value)          'schema_version' -> '1'
 *   isobatch_sessions(seq, id, ...)    the same columns as the SQLite store's sessions table, seq
 *                                      (bigserial) giving creation order
 *   isobatch_history(session_id, first, tokens bytea, flags bytea)
 *                                      one row per append, deleted with its session (ON DELETE CASCADE)
 * Values are encoded as the SQLite back end does (store_codec.h): float settings as IEEE-754 bits,
 * seed and draws as the int64 of their 64 bits, tokens as little-endian int32.
 *
 * Messages name the store by its URI with any password replaced by "***".
 */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "store/store_codec.h"
#include "store/store_impl.h"

#define PG_CONNS 4

typedef struct pg_store {
    ib_store base;
    PGconn *conn[PG_CONNS];
    int busy[PG_CONNS];
    pthread_mutex_t mu; /* guards busy[] */
    pthread_cond_t cv;
    char uri[1024];     /* as given (with its password): what a reset reconnects with */
    char name[1024];    /* as shown in messages (password redacted) */
} pg_store;

/* The key every isobatch store takes its schema-creation advisory lock with ("IBS1"). */
#define PG_SCHEMA_LOCK "1229083441"

static const char SCHEMA[] =
    "CREATE TABLE isobatch_meta(key text PRIMARY KEY, value text NOT NULL);"
    "INSERT INTO isobatch_meta VALUES ('schema_version', '1'), ('application', 'isobatch session store');"
    "CREATE TABLE isobatch_sessions("
    " seq bigserial UNIQUE NOT NULL, id text PRIMARY KEY, owner text NOT NULL, model_id text NOT NULL,"
    " max_context integer NOT NULL, kv_sink integer NOT NULL, kv_window integer NOT NULL,"
    " kv_chunk integer NOT NULL, kv_dtype text NOT NULL,"
    " temperature bigint NOT NULL, top_k integer NOT NULL, top_p bigint NOT NULL, min_p bigint NOT NULL,"
    " repeat_penalty bigint NOT NULL, repeat_last_n integer NOT NULL, seed bigint NOT NULL,"
    " draws bigint NOT NULL, n_fed integer NOT NULL, n_tokens integer NOT NULL,"
    " created bigint NOT NULL, updated bigint NOT NULL);"
    "CREATE INDEX isobatch_sessions_owner ON isobatch_sessions(owner, seq);"
    "CREATE TABLE isobatch_history(session_id text NOT NULL REFERENCES isobatch_sessions(id) ON DELETE CASCADE,"
    " first integer NOT NULL, tokens bytea NOT NULL, flags bytea NOT NULL, PRIMARY KEY(session_id, first));";

/* ---------------------------------------------------------------- errors */

/* The first line of a server or connection message, without its trailing newline, into out. */
static void one_line(const char *msg, char *out, size_t cap) {
    snprintf(out, cap, "%s", msg && *msg ? msg : "unknown error");
    for (char *p = out; *p; p++)
        if (*p == '\n' || *p == '\r') {
            *p = 0;
            break;
        }
}

/* Map a failed statement (res may be NULL: the connection failed) to a status with a one-line message
 * naming the store, what was being done and (when not NULL) the session. */
static ib_status pg_fail(pg_store *s, PGconn *c, const PGresult *res, const char *what, const char *id, ib_error *err) {
    char msg[400];
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    one_line(primary ? primary : PQerrorMessage(c), msg, sizeof msg);
    const char *sep = id ? ": session " : "";
    const char *sid = id ? id : "";
    if (PQstatus(c) != CONNECTION_OK)
        return ib_fail(err, IB_ERR_IO, "store %s%s%s: %s: the connection to the server was lost (%s)%s", s->name, sep,
                       sid, what, msg, !strcmp(what, "commit") ? "; whether the write landed is unknown" : "");
    if (!state) return ib_fail(err, IB_ERR_IO, "store %s%s%s: %s: %s", s->name, sep, sid, what, msg);
    if (!strcmp(state, "55P03") || !strcmp(state, "57014") || !strcmp(state, "40001") || !strcmp(state, "40P01"))
        return ib_fail(err, IB_ERR_STATE, "store %s%s%s: %s: locked by another writer or timed out (%s)", s->name, sep,
                       sid, what, msg);
    if (!strcmp(state, "53100"))
        return ib_fail(err, IB_ERR_IO, "store %s%s%s: %s: out of space: the server's disk is full (%s)", s->name, sep,
                       sid, what, msg);
    if (!strcmp(state, "53200"))
        return ib_fail(err, IB_ERR_NOMEM, "store %s%s%s: %s: the server is out of memory", s->name, sep, sid, what);
    if (!strncmp(state, "42", 2) || !strncmp(state, "22", 2) || !strncmp(state, "23", 2))
        return ib_fail(err, IB_ERR_FORMAT, "store %s%s%s: %s: the tables are not an isobatch store's (%s)", s->name, sep,
                       sid, what, msg);
    return ib_fail(err, IB_ERR_IO, "store %s%s%s: %s: %s (SQLSTATE %s)", s->name, sep, sid, what, msg, state);
}

/* ---------------------------------------------------------------- connections */

/* Open one connection to uri with this store's session settings; NULL and *why filled on failure. */
static PGconn *connect_one(const char *uri, char *why, size_t cap) {
    /* connect_timeout first, so one given in the URI (expanded from dbname) overrides it */
    const char *keys[] = {"connect_timeout", "application_name", "dbname", NULL};
    const char *vals[] = {"10", "isobatch", uri, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c) {
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    if (PQstatus(c) != CONNECTION_OK) {
        one_line(PQerrorMessage(c), why, cap);
        PQfinish(c);
        return NULL;
    }
    PGresult *r = PQexec(c, "SET synchronous_commit = on; SET lock_timeout = '5s'; SET statement_timeout = '60s';"
                            " SET client_min_messages = warning");
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok) one_line(PQresultErrorMessage(r), why, cap);
    PQclear(r);
    if (!ok) {
        PQfinish(c);
        return NULL;
    }
    return c;
}

/* Take a free connection (waiting for one), reconnected when it is broken: its index in *ci, or
 * IB_ERR_IO when it cannot be (re)established. */
static ib_status take_conn(pg_store *s, int *ci, ib_error *err) {
    pthread_mutex_lock(&s->mu);
    int i;
    for (;;) {
        for (i = 0; i < PG_CONNS && s->busy[i]; i++) {
        }
        if (i < PG_CONNS) break;
        pthread_cond_wait(&s->cv, &s->mu);
    }
    s->busy[i] = 1;
    pthread_mutex_unlock(&s->mu);
    *ci = i;
    if (s->conn[i] && PQstatus(s->conn[i]) == CONNECTION_OK && PQtransactionStatus(s->conn[i]) == PQTRANS_IDLE)
        return IB_OK;
    if (s->conn[i]) PQfinish(s->conn[i]);
    char why[400];
    s->conn[i] = connect_one(s->uri, why, sizeof why);
    if (s->conn[i]) return IB_OK;
    pthread_mutex_lock(&s->mu);
    s->busy[i] = 0;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ib_fail(err, IB_ERR_IO, "store %s: cannot reach the server (%s)", s->name, why);
}

static void give_conn(pg_store *s, int i) {
    pthread_mutex_lock(&s->mu);
    s->busy[i] = 0;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Run a statement without results (BEGIN, COMMIT, ...): 0 or -1 with *res kept for the error. */
static int cmd(PGconn *c, const char *sql, PGresult **res) {
    PQclear(*res);
    *res = PQexec(c, sql);
    return PQresultStatus(*res) == PGRES_COMMAND_OK ? 0 : -1;
}

/* Run a parameterised statement; text parameters except where fmt (may be NULL) says binary;
 * results in text (binres 0) or binary (1). Returns the result (never NULL: an empty one on OOM). */
static PGresult *run(PGconn *c, const char *sql, int n, const char *const *v, const int *len, const int *fmt,
                     int binres) {
    return PQexecParams(c, sql, n, NULL, v, len, fmt, binres);
}

/* End any open transaction after a failure (its own failure changes nothing more). */
static void rollback(PGconn *c) {
    if (PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) != PQTRANS_IDLE) PQclear(PQexec(c, "ROLLBACK"));
}

/* ---------------------------------------------------------------- operations */

static int64_t now_s(void) { return (int64_t)time(NULL); }

/* Decimal text of v into buf[24]. */
static const char *num(char buf[24], long long v) {
    snprintf(buf, 24, "%lld", v);
    return buf;
}

/* The progress columns of a record as text parameters p[0..9] (buffers b): temperature, top_k, top_p,
 * min_p, repeat_penalty, repeat_last_n, seed, draws, n_fed, updated. */
static void progress_params(const ib_store_progress *pr, char b[10][24], const char *p[10]) {
    const ib_sampling *sp = &pr->sampling;
    p[0] = num(b[0], ib_store_fbits(sp->temperature));
    p[1] = num(b[1], sp->top_k);
    p[2] = num(b[2], ib_store_fbits(sp->top_p));
    p[3] = num(b[3], ib_store_fbits(sp->min_p));
    p[4] = num(b[4], ib_store_fbits(sp->repeat_penalty));
    p[5] = num(b[5], sp->repeat_last_n);
    p[6] = num(b[6], (long long)(int64_t)sp->seed);
    p[7] = num(b[7], (long long)(int64_t)pr->draws);
    p[8] = num(b[8], pr->n_fed);
    p[9] = num(b[9], now_s());
}

/* Insert one history row (tokens [first, first + n)) inside the open transaction: 0 or -1 (*res). */
static int put_history(PGconn *c, const char *id, int first, const int32_t *tokens, const uint8_t *flags, int n,
                       PGresult **res) {
    unsigned char *buf = malloc((size_t)n * 4);
    if (!buf) return -1;
    ib_store_enc_tokens(tokens, n, buf);
    char fb[24];
    const char *v[4] = {id, num(fb, first), (const char *)buf, (const char *)flags};
    int len[4] = {0, 0, n * 4, n}, fmt[4] = {0, 0, 1, 1};
    PQclear(*res);
    *res = run(c, "INSERT INTO isobatch_history(session_id, first, tokens, flags) VALUES ($1, $2, $3, $4)", 4, v, len,
               fmt, 0);
    free(buf);
    return PQresultStatus(*res) == PGRES_COMMAND_OK ? 0 : -1;
}

/* The stored token count of id, row-locked for the open transaction: *n = -1 when absent. 0 or -1. */
static int lock_count(PGconn *c, const char *id, long long *n, PGresult **res) {
    const char *v[1] = {id};
    PQclear(*res);
    *res = run(c, "SELECT n_tokens FROM isobatch_sessions WHERE id = $1 FOR UPDATE", 1, v, NULL, NULL, 0);
    if (PQresultStatus(*res) != PGRES_TUPLES_OK) return -1;
    *n = PQntuples(*res) ? strtoll(PQgetvalue(*res, 0, 0), NULL, 10) : -1;
    return 0;
}

/* ops.create (ib_store_create): the session row and its first history row in one transaction;
 * IB_ERR_STATE when the id is taken. */
static ib_status pg_create(ib_store *st, const ib_store_session *r, ib_error *err) {
    pg_store *s = (pg_store *)st;
    int ci;
    ib_status tc = take_conn(s, &ci, err);
    if (tc) return tc;
    PGconn *c = s->conn[ci];
    PGresult *res = NULL;
    ib_status out = IB_OK;
    const char *what = "create";
    char b[10][24], pb[5][24];
    const char *p[10];
    progress_params(&r->progress, b, p);
    const char *v[20] = {r->id, r->owner, r->model_id, num(pb[0], r->max_context), num(pb[1], r->kv_sink),
                         num(pb[2], r->kv_window), num(pb[3], r->kv_chunk), ib_kv_dtype_name(r->kv_dtype),
                         p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], num(pb[4], r->n_tokens), p[9], p[9]};
    if (cmd(c, "BEGIN", &res)) goto fail;
    PQclear(res);
    res = run(c,
              "INSERT INTO isobatch_sessions(id, owner, model_id, max_context, kv_sink, kv_window, kv_chunk, kv_dtype,"
              " temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, draws, n_fed, n_tokens, created,"
              " updated) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20)",
              20, v, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (state && !strcmp(state, "23505")) {
            rollback(c);
            out = ib_fail(err, IB_ERR_STATE, "store %s: session %s exists already", s->name, r->id);
            goto done;
        }
        goto fail;
    }
    if (r->n_tokens > 0) {
        what = "create (history)";
        if (put_history(c, r->id, 0, r->tokens, r->flags, r->n_tokens, &res)) goto fail;
    }
    what = "commit";
    if (cmd(c, "COMMIT", &res)) goto fail;
    goto done;
fail:
    out = pg_fail(s, c, res, what, r->id, err);
    rollback(c);
done:
    PQclear(res);
    give_conn(s, ci);
    return out;
}

/* The history rows of id (binary results: first int4, tokens, flags) into out. */
static ib_status load_history(pg_store *s, PGconn *c, const char *id, ib_store_session *out, ib_error *err) {
    ib_status st = ib_store_history_alloc(s->name, out, err);
    if (st) return st;
    const char *v[1] = {id};
    PGresult *res = run(c, "SELECT first, tokens, flags FROM isobatch_history WHERE session_id = $1 ORDER BY first", 1,
                        v, NULL, NULL, 1);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        st = pg_fail(s, c, res, "load history", id, err);
        PQclear(res);
        return st;
    }
    int have = 0;
    for (int row = 0; !st && row < PQntuples(res); row++) {
        const unsigned char *f = (const unsigned char *)PQgetvalue(res, row, 0);
        long long first = PQgetlength(res, row, 0) == 4
                              ? (long long)(int32_t)((uint32_t)f[0] << 24 | (uint32_t)f[1] << 16 | (uint32_t)f[2] << 8 | f[3])
                              : -1;
        st = ib_store_history_add(s->name, out, &have, first, (const unsigned char *)PQgetvalue(res, row, 1),
                                  PQgetlength(res, row, 1), (const unsigned char *)PQgetvalue(res, row, 2),
                                  PQgetlength(res, row, 2), err);
    }
    PQclear(res);
    if (!st) st = ib_store_history_end(s->name, out, have, err);
    return st;
}

/* ops.load (ib_store_load): the session row and its history in one snapshot, every value checked. */
static ib_status pg_load(ib_store *st, const char *id, ib_store_session *out, ib_error *err) {
    pg_store *s = (pg_store *)st;
    int ci;
    ib_status tc = take_conn(s, &ci, err);
    if (tc) return tc;
    PGconn *c = s->conn[ci];
    PGresult *res = NULL;
    ib_status o = IB_OK;
    if (cmd(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", &res)) {
        o = pg_fail(s, c, res, "load", id, err);
        goto done;
    }
    PQclear(res);
    const char *v[1] = {id};
    res = run(c,
              "SELECT owner, model_id, max_context, kv_sink, kv_window, kv_chunk, kv_dtype, temperature, top_k, top_p,"
              " min_p, repeat_penalty, repeat_last_n, seed, draws, n_fed, n_tokens, created, updated"
              " FROM isobatch_sessions WHERE id = $1",
              1, v, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        o = pg_fail(s, c, res, "load", id, err);
        goto done;
    }
    if (PQntuples(res) == 0) {
        o = ib_fail(err, IB_ERR_NOT_FOUND, "store %s: no session %s", s->name, id);
        goto done;
    }
#define COL_LL(k) strtoll(PQgetvalue(res, 0, (k)), NULL, 10)
    snprintf(out->id, sizeof out->id, "%s", id);
    long long ints[6] = {COL_LL(2), COL_LL(3), COL_LL(4), COL_LL(5), COL_LL(15), COL_LL(16)};
    const char *owner = PQgetvalue(res, 0, 0), *model = PQgetvalue(res, 0, 1), *dt = PQgetvalue(res, 0, 6);
    if (ib_store_row_valid(ints, owner, model, dt, &out->kv_dtype)) {
        o = ib_fail(err, IB_ERR_FORMAT, "store %s: session %s: its row holds values out of range", s->name, id);
        goto done;
    }
    snprintf(out->owner, sizeof out->owner, "%s", owner);
    snprintf(out->model_id, sizeof out->model_id, "%s", model);
    out->max_context = (int)ints[0];
    out->kv_sink = (int)ints[1];
    out->kv_window = (int)ints[2];
    out->kv_chunk = (int)ints[3];
    ib_sampling *sp = &out->progress.sampling;
    sp->temperature = ib_store_bitsf(COL_LL(7));
    sp->top_k = (int)COL_LL(8);
    sp->top_p = ib_store_bitsf(COL_LL(9));
    sp->min_p = ib_store_bitsf(COL_LL(10));
    sp->repeat_penalty = ib_store_bitsf(COL_LL(11));
    sp->repeat_last_n = (int)COL_LL(12);
    sp->seed = (uint64_t)COL_LL(13);
    out->progress.draws = (uint64_t)COL_LL(14);
    out->progress.n_fed = (int)ints[4];
    out->n_tokens = (int)ints[5];
    out->created = COL_LL(17);
    out->updated = COL_LL(18);
#undef COL_LL
    PQclear(res);
    res = NULL;
    o = load_history(s, c, id, out, err);
done:
    PQclear(res);
    rollback(c); /* ends the read transaction */
    give_conn(s, ci);
    return o;
}

/* Set the progress columns of id inside the open transaction: 0 or -1 (*res). */
static int put_progress(PGconn *c, const char *id, const ib_store_progress *pr, PGresult **res) {
    char b[10][24];
    const char *p[11];
    progress_params(pr, b, p);
    p[10] = id;
    PQclear(*res);
    *res = run(c,
               "UPDATE isobatch_sessions SET temperature=$1, top_k=$2, top_p=$3, min_p=$4, repeat_penalty=$5,"
               " repeat_last_n=$6, seed=$7, draws=$8, n_fed=$9, updated=$10 WHERE id=$11",
               11, p, NULL, NULL, 0);
    return PQresultStatus(*res) == PGRES_COMMAND_OK ? 0 : -1;
}

/* ops.append (ib_store_append): under the session row's lock, the count checked against `at`, the
 * history row, the new count and (p) the progress, in one transaction. */
static ib_status pg_append(ib_store *st, const char *id, int at, const int32_t *tokens, const uint8_t *flags, int n,
                           const ib_store_progress *p, ib_error *err) {
    pg_store *s = (pg_store *)st;
    int ci;
    ib_status tc = take_conn(s, &ci, err);
    if (tc) return tc;
    PGconn *c = s->conn[ci];
    PGresult *res = NULL;
    ib_status out = IB_OK;
    const char *what = "append";
    long long have = 0;
    if (cmd(c, "BEGIN", &res) || lock_count(c, id, &have, &res)) goto fail;
    if (have < 0 || have != at) {
        rollback(c);
        out = have < 0 ? ib_fail(err, IB_ERR_NOT_FOUND, "store %s: no session %s", s->name, id)
                       : ib_fail(err, IB_ERR_STATE, "store %s: session %s: append at %d, but it holds %lld tokens",
                                 s->name, id, at, have);
        goto done;
    }
    if (put_history(c, id, at, tokens, flags, n, &res)) goto fail;
    char nb[24], tb[24];
    const char *v[3] = {num(nb, (long long)at + n), num(tb, now_s()), id};
    PQclear(res);
    res = run(c, "UPDATE isobatch_sessions SET n_tokens = $1, updated = $2 WHERE id = $3", 3, v, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) goto fail;
    if (p && put_progress(c, id, p, &res)) goto fail;
    what = "commit";
    if (cmd(c, "COMMIT", &res)) goto fail;
    goto done;
fail:
    out = pg_fail(s, c, res, what, id, err);
    rollback(c);
done:
    PQclear(res);
    give_conn(s, ci);
    return out;
}

/* ops.update (ib_store_update): the progress columns, n_fed checked against the locked count. */
static ib_status pg_update(ib_store *st, const char *id, const ib_store_progress *p, ib_error *err) {
    pg_store *s = (pg_store *)st;
    int ci;
    ib_status tc = take_conn(s, &ci, err);
    if (tc) return tc;
    PGconn *c = s->conn[ci];
    PGresult *res = NULL;
    ib_status out = IB_OK;
    const char *what = "update";
    long long have = 0;
    if (cmd(c, "BEGIN", &res) || lock_count(c, id, &have, &res)) goto fail;
    if (have < 0 || p->n_fed > have) {
        rollback(c);
        out = have < 0 ? ib_fail(err, IB_ERR_NOT_FOUND, "store %s: no session %s", s->name, id)
                       : ib_fail(err, IB_ERR_INVALID_ARG, "store %s: session %s: n_fed %d is past its %lld tokens",
                                 s->name, id, p->n_fed, have);
        goto done;
    }
    if (put_progress(c, id, p, &res)) goto fail;
    what = "commit";
    if (cmd(c, "COMMIT", &res)) goto fail;
    goto done;
fail:
    out = pg_fail(s, c, res, what, id, err);
    rollback(c);
done:
    PQclear(res);
    give_conn(s, ci);
    return out;
}

/* ops.del (ib_store_delete): the session row, and with it (ON DELETE CASCADE) its history. */
static ib_status pg_delete(ib_store *st, const char *id, ib_error *err) {
    pg_store *s = (pg_store *)st;
    int ci;
    ib_status tc = take_conn(s, &ci, err);
    if (tc) return tc;
    PGconn *c = s->conn[ci];
    const char *v[1] = {id};
    PGresult *res = run(c, "DELETE FROM isobatch_sessions WHERE id = $1", 1, v, NULL, NULL, 0);
    ib_status out = IB_OK;
    if (PQresultStatus(res) != PGRES_COMMAND_OK) out = pg_fail(s, c, res, "delete", id, err);
    else if (!strcmp(PQcmdTuples(res), "0")) out = ib_fail(err, IB_ERR_NOT_FOUND, "store %s: no session %s", s->name, id);
    PQclear(res);
    give_conn(s, ci);
    return out;
}

/* ops.list_owner (ib_store_list_owner): ids of owner's sessions in creation order (seq). */
static ib_status pg_list_owner(ib_store *st, const char *owner, char ***ids, int *n, ib_error *err) {
    pg_store *s = (pg_store *)st;
    int ci;
    ib_status tc = take_conn(s, &ci, err);
    if (tc) return tc;
    PGconn *c = s->conn[ci];
    const char *v[1] = {owner};
    PGresult *res = run(c, "SELECT id FROM isobatch_sessions WHERE owner = $1 ORDER BY seq", 1, v, NULL, NULL, 0);
    ib_status out = IB_OK;
    char **list = NULL;
    int nl = 0;
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        out = pg_fail(s, c, res, "list", NULL, err);
    } else if (PQntuples(res) > 0) {
        nl = PQntuples(res);
        if (!(list = calloc((size_t)nl, sizeof *list))) out = ib_fail(err, IB_ERR_NOMEM, "store %s: list: out of memory", s->name);
        for (int i = 0; !out && i < nl; i++)
            if (!(list[i] = strdup(PQgetvalue(res, i, 0))))
                out = ib_fail(err, IB_ERR_NOMEM, "store %s: list: out of memory", s->name);
    }
    PQclear(res);
    give_conn(s, ci);
    if (out) {
        ib_store_ids_free(list, nl);
        return out;
    }
    *ids = list;
    *n = nl;
    return IB_OK;
}

static void pg_close(ib_store *st) {
    pg_store *s = (pg_store *)st;
    for (int i = 0; i < PG_CONNS; i++)
        if (s->conn[i]) PQfinish(s->conn[i]);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static const ib_store_ops PG_OPS = {pg_close, pg_create, pg_load, pg_append, pg_update, pg_delete, pg_list_owner};

/* ---------------------------------------------------------------- open */

/* uri with the password of its user-info part ("//user:PASSWORD@") and of a password= parameter
 * replaced by "***", into out. */
static void redact(const char *uri, char *out, size_t cap) {
    snprintf(out, cap, "%s", uri);
    char *auth = strstr(out, "://");
    if (auth) {
        auth += 3;
        char *at = strchr(auth, '@'), *slash = strchr(auth, '/');
        char *colon = strchr(auth, ':');
        if (at && (!slash || at < slash) && colon && colon < at) {
            char rest[1024];
            snprintf(rest, sizeof rest, "%s", at);
            snprintf(colon + 1, cap - (size_t)(colon + 1 - out), "***%s", rest);
        }
    }
    char *pw = strstr(out, "password=");
    if (pw) {
        char *end = strchr(pw, '&');
        char rest[1024];
        snprintf(rest, sizeof rest, "%s", end ? end : "");
        snprintf(pw + 9, cap - (size_t)(pw + 9 - out), "***%s", rest);
    }
}

/* Check the tables are an isobatch store of this version, creating them in a database that has none;
 * under an advisory lock, so that servers opening one new database together create it once. */
static ib_status pg_init(pg_store *s, PGconn *c, ib_error *err) {
    PGresult *res = NULL;
    ib_status out = IB_OK;
    const char *what = "open";
    if (cmd(c, "BEGIN", &res)) goto fail;
    PQclear(res);
    res = PQexec(c, "SELECT pg_advisory_xact_lock(" PG_SCHEMA_LOCK ")");
    if (PQresultStatus(res) != PGRES_TUPLES_OK) goto fail;
    PQclear(res);
    res = PQexec(c, "SELECT to_regclass('isobatch_meta') IS NOT NULL, to_regclass('isobatch_sessions') IS NOT NULL,"
                    " to_regclass('isobatch_history') IS NOT NULL");
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) goto fail;
    int meta = !strcmp(PQgetvalue(res, 0, 0), "t"), sess = !strcmp(PQgetvalue(res, 0, 1), "t"),
        hist = !strcmp(PQgetvalue(res, 0, 2), "t");
    if (meta) {
        PQclear(res);
        res = PQexec(c, "SELECT value FROM isobatch_meta WHERE key = 'schema_version'");
        if (PQresultStatus(res) != PGRES_TUPLES_OK) goto fail;
        if (PQntuples(res) != 1 || !sess || !hist) {
            rollback(c);
            out = ib_fail(err, IB_ERR_FORMAT, "store %s: the isobatch_* tables are incomplete (no schema version, or a "
                                              "table missing): not an isobatch session store", s->name);
            goto done;
        }
        long ver = strtol(PQgetvalue(res, 0, 0), NULL, 10);
        if (ver != IB_STORE_SCHEMA_VERSION) {
            rollback(c);
            out = ib_fail(err, IB_ERR_UNSUPPORTED, "store %s: schema version %ld, this build reads version %d", s->name,
                          ver, IB_STORE_SCHEMA_VERSION);
            goto done;
        }
        rollback(c); /* nothing written: end the read */
        goto done;
    }
    if (sess || hist) {
        rollback(c);
        out = ib_fail(err, IB_ERR_FORMAT, "store %s: tables named isobatch_sessions/isobatch_history exist without "
                                          "isobatch_meta: not an isobatch session store", s->name);
        goto done;
    }
    what = "create schema";
    if (cmd(c, SCHEMA, &res)) goto fail;
    what = "commit";
    if (cmd(c, "COMMIT", &res)) goto fail;
    goto done;
fail:
    out = pg_fail(s, c, res, what, NULL, err);
    rollback(c);
done:
    PQclear(res);
    return out;
}

ib_status ib_store_pg_open(const char *uri, ib_store **out, ib_error *err) {
    *out = NULL;
    if (strlen(uri) >= sizeof ((pg_store *)0)->uri)
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: URI too long (%zu bytes)", strlen(uri));
    pg_store *s = calloc(1, sizeof *s);
    if (!s) return ib_fail(err, IB_ERR_NOMEM, "store: out of memory");
    s->base.ops = &PG_OPS;
    snprintf(s->uri, sizeof s->uri, "%s", uri);
    redact(uri, s->name, sizeof s->name);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    char why[400];
    /* one connection now (it checks or creates the schema); the others when calls first need them */
    s->conn[0] = connect_one(uri, why, sizeof why);
    ib_status st = IB_OK;
    if (!s->conn[0]) {
        st = ib_fail(err, IB_ERR_IO, "store %s: cannot connect (%s)", s->name, why);
        goto fail;
    }
    if ((st = pg_init(s, s->conn[0], err))) goto fail;
    *out = &s->base;
    return IB_OK;
fail:
    pg_close(&s->base);
    return st;
}
