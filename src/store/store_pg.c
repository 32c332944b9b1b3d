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
#include <stdarg.h>
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

/* ---------------------------------------------------------------- transactions */

/* One call's transaction, as its body sees it: the connection, the last statement's result (kept for
 * the error message), what is being done, and the status of a refusal the body decided on. */
typedef struct pg_tx {
    pg_store *s;
    PGconn *c;
    PGresult *res;
    const char *what;
    const char *id;    /* the session named in messages, or NULL */
    ib_status refused; /* set with err by a body that returns TX_REFUSED */
    ib_error *err;
} pg_tx;

/* What a body returns: commit; a statement failed (t->res holds it); refused (t->refused, err set). */
enum { TX_COMMIT = 0, TX_SQL_FAILED = 1, TX_REFUSED = 2 };

typedef int (*pg_body)(pg_tx *t, void *arg);

/* Take a connection, run `begin`, the body, and COMMIT; on a failed statement the error mapped by
 * pg_fail, on a refusal the body's status, in both cases the transaction rolled back (so a failed call
 * changes nothing); the connection given back. */
static ib_status pg_transaction(pg_store *s, const char *begin, const char *what, const char *id, pg_body body,
                                void *arg, ib_error *err) {
    int ci;
    ib_status st = take_conn(s, &ci, err);
    if (st) return st;
    pg_tx t = {s, s->conn[ci], NULL, what, id, IB_OK, err};
    int r = cmd(t.c, begin, &t.res) ? TX_SQL_FAILED : body(&t, arg);
    if (r == TX_COMMIT) {
        t.what = "commit";
        if (cmd(t.c, "COMMIT", &t.res)) r = TX_SQL_FAILED;
    }
    if (r == TX_SQL_FAILED) st = pg_fail(s, t.c, t.res, t.what, id, err);
    else if (r == TX_REFUSED) st = t.refused;
    if (r != TX_COMMIT) rollback(t.c);
    PQclear(t.res);
    give_conn(s, ci);
    return st;
}

/* Run a parameterised statement in t (text parameters except where fmt says binary; text or binary
 * results): TX_COMMIT when it returned `want`, else TX_SQL_FAILED with t->res holding the error. */
static int tx_run(pg_tx *t, ExecStatusType want, const char *sql, int n, const char *const *v, const int *len,
                  const int *fmt, int binres) {
    PQclear(t->res);
    t->res = run(t->c, sql, n, v, len, fmt, binres);
    return PQresultStatus(t->res) == want ? TX_COMMIT : TX_SQL_FAILED;
}

/* A refusal: roll back with status st and a one-line message. */
static int tx_refuse(pg_tx *t, ib_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int tx_refuse(pg_tx *t, ib_status st, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t->refused = ib_fail(t->err, st, "store %s: %s", t->s->name, msg);
    return TX_REFUSED;
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

/* Insert one history row (tokens [first, first + n)) of session t->id. */
static int put_history(pg_tx *t, int first, const int32_t *tokens, const uint8_t *flags, int n) {
    unsigned char *buf = malloc((size_t)n * 4);
    if (!buf) return tx_refuse(t, IB_ERR_NOMEM, "session %s: out of memory", t->id);
    ib_store_enc_tokens(tokens, n, buf);
    char fb[24];
    const char *v[4] = {t->id, num(fb, first), (const char *)buf, (const char *)flags};
    int len[4] = {0, 0, n * 4, n}, fmt[4] = {0, 0, 1, 1};
    int r = tx_run(t, PGRES_COMMAND_OK,
                   "INSERT INTO isobatch_history(session_id, first, tokens, flags) VALUES ($1, $2, $3, $4)", 4, v, len,
                   fmt, 0);
    free(buf);
    return r;
}

/* The stored token count of session t->id, row-locked for the transaction: *n = -1 when absent. */
static int lock_count(pg_tx *t, long long *n) {
    const char *v[1] = {t->id};
    int r = tx_run(t, PGRES_TUPLES_OK, "SELECT n_tokens FROM isobatch_sessions WHERE id = $1 FOR UPDATE", 1, v, NULL,
                   NULL, 0);
    if (r == TX_COMMIT) *n = PQntuples(t->res) ? strtoll(PQgetvalue(t->res, 0, 0), NULL, 10) : -1;
    return r;
}

/* Set the progress columns of session t->id. */
static int put_progress(pg_tx *t, const ib_store_progress *pr) {
    char b[10][24];
    const char *p[11];
    progress_params(pr, b, p);
    p[10] = t->id;
    return tx_run(t, PGRES_COMMAND_OK,
                  "UPDATE isobatch_sessions SET temperature=$1, top_k=$2, top_p=$3, min_p=$4, repeat_penalty=$5,"
                  " repeat_last_n=$6, seed=$7, draws=$8, n_fed=$9, updated=$10 WHERE id=$11",
                  11, p, NULL, NULL, 0);
}

/* create: the session row, then its first history row. */
static int create_body(pg_tx *t, void *arg) {
    const ib_store_session *r = arg;
    char b[10][24], pb[5][24];
    const char *p[10];
    progress_params(&r->progress, b, p);
    const char *v[20] = {r->id, r->owner, r->model_id, num(pb[0], r->max_context), num(pb[1], r->kv_sink),
                         num(pb[2], r->kv_window), num(pb[3], r->kv_chunk), ib_kv_dtype_name(r->kv_dtype),
                         p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], num(pb[4], r->n_tokens), p[9], p[9]};
    if (tx_run(t, PGRES_COMMAND_OK,
               "INSERT INTO isobatch_sessions(id, owner, model_id, max_context, kv_sink, kv_window, kv_chunk, kv_dtype,"
               " temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, draws, n_fed, n_tokens, created,"
               " updated) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20)",
               20, v, NULL, NULL, 0)) {
        const char *state = PQresultErrorField(t->res, PG_DIAG_SQLSTATE);
        if (state && !strcmp(state, "23505")) return tx_refuse(t, IB_ERR_STATE, "session %s exists already", r->id);
        return TX_SQL_FAILED;
    }
    t->what = "create (history)";
    return r->n_tokens > 0 ? put_history(t, 0, r->tokens, r->flags, r->n_tokens) : TX_COMMIT;
}

/* ops.create (ib_store_create): one transaction; IB_ERR_STATE when the id is taken. */
static ib_status pg_create(ib_store *st, const ib_store_session *r, ib_error *err) {
    return pg_transaction((pg_store *)st, "BEGIN", "create", r->id, create_body, (void *)r, err);
}

/* load: the session row, every value checked, then its history rows (binary: first int4, tokens,
 * flags). */
static int load_body(pg_tx *t, void *arg) {
    ib_store_session *out = arg;
    const char *v[1] = {t->id};
    if (tx_run(t, PGRES_TUPLES_OK,
               "SELECT owner, model_id, max_context, kv_sink, kv_window, kv_chunk, kv_dtype, temperature, top_k, top_p,"
               " min_p, repeat_penalty, repeat_last_n, seed, draws, n_fed, n_tokens, created, updated"
               " FROM isobatch_sessions WHERE id = $1",
               1, v, NULL, NULL, 0))
        return TX_SQL_FAILED;
    if (PQntuples(t->res) == 0) return tx_refuse(t, IB_ERR_NOT_FOUND, "no session %s", t->id);
    PGresult *res = t->res;
#define COL_LL(k) strtoll(PQgetvalue(res, 0, (k)), NULL, 10)
    snprintf(out->id, sizeof out->id, "%s", t->id);
    long long ints[6] = {COL_LL(2), COL_LL(3), COL_LL(4), COL_LL(5), COL_LL(15), COL_LL(16)};
    const char *owner = PQgetvalue(res, 0, 0), *model = PQgetvalue(res, 0, 1), *dt = PQgetvalue(res, 0, 6);
    if (ib_store_row_valid(ints, owner, model, dt, &out->kv_dtype))
        return tx_refuse(t, IB_ERR_FORMAT, "session %s: its row holds values out of range", t->id);
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
    ib_status st = ib_store_history_alloc(t->s->name, out, t->err);
    if (st) return t->refused = st, TX_REFUSED;
    t->what = "load history";
    if (tx_run(t, PGRES_TUPLES_OK, "SELECT first, tokens, flags FROM isobatch_history WHERE session_id = $1 ORDER BY first",
               1, v, NULL, NULL, 1))
        return TX_SQL_FAILED;
    res = t->res;
    int have = 0;
    for (int row = 0; !st && row < PQntuples(res); row++) {
        const unsigned char *f = (const unsigned char *)PQgetvalue(res, row, 0);
        long long first = PQgetlength(res, row, 0) == 4
                              ? (long long)(int32_t)((uint32_t)f[0] << 24 | (uint32_t)f[1] << 16 | (uint32_t)f[2] << 8 | f[3])
                              : -1;
        st = ib_store_history_add(t->s->name, out, &have, first, (const unsigned char *)PQgetvalue(res, row, 1),
                                  PQgetlength(res, row, 1), (const unsigned char *)PQgetvalue(res, row, 2),
                                  PQgetlength(res, row, 2), t->err);
    }
    if (!st) st = ib_store_history_end(t->s->name, out, have, t->err);
    if (st) return t->refused = st, TX_REFUSED;
    return TX_COMMIT;
}

/* ops.load (ib_store_load): the session row and its history in one REPEATABLE READ snapshot. */
static ib_status pg_load(ib_store *st, const char *id, ib_store_session *out, ib_error *err) {
    return pg_transaction((pg_store *)st, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "load", id, load_body, out,
                          err);
}

typedef struct append_arg {
    int at, n;
    const int32_t *tokens;
    const uint8_t *flags;
    const ib_store_progress *p;
} append_arg;

/* append: under the session row's lock, the count checked against `at`, the history row, the new
 * count and (p) the progress. */
static int append_body(pg_tx *t, void *arg) {
    const append_arg *a = arg;
    long long have = 0;
    if (lock_count(t, &have)) return TX_SQL_FAILED;
    if (have < 0) return tx_refuse(t, IB_ERR_NOT_FOUND, "no session %s", t->id);
    if (have != a->at)
        return tx_refuse(t, IB_ERR_STATE, "session %s: append at %d, but it holds %lld tokens", t->id, a->at, have);
    int r = put_history(t, a->at, a->tokens, a->flags, a->n);
    if (r) return r;
    char nb[24], tb[24];
    const char *v[3] = {num(nb, (long long)a->at + a->n), num(tb, now_s()), t->id};
    if (tx_run(t, PGRES_COMMAND_OK, "UPDATE isobatch_sessions SET n_tokens = $1, updated = $2 WHERE id = $3", 3, v,
               NULL, NULL, 0))
        return TX_SQL_FAILED;
    return a->p ? put_progress(t, a->p) : TX_COMMIT;
}

/* ops.append (ib_store_append): one transaction. */
static ib_status pg_append(ib_store *st, const char *id, int at, const int32_t *tokens, const uint8_t *flags, int n,
                           const ib_store_progress *p, ib_error *err) {
    append_arg a = {at, n, tokens, flags, p};
    return pg_transaction((pg_store *)st, "BEGIN", "append", id, append_body, &a, err);
}

/* update: the progress columns, n_fed checked against the locked count. */
static int update_body(pg_tx *t, void *arg) {
    const ib_store_progress *p = arg;
    long long have = 0;
    if (lock_count(t, &have)) return TX_SQL_FAILED;
    if (have < 0) return tx_refuse(t, IB_ERR_NOT_FOUND, "no session %s", t->id);
    if (p->n_fed > have)
        return tx_refuse(t, IB_ERR_INVALID_ARG, "session %s: n_fed %d is past its %lld tokens", t->id, p->n_fed, have);
    return put_progress(t, p);
}

/* ops.update (ib_store_update): one transaction. */
static ib_status pg_update(ib_store *st, const char *id, const ib_store_progress *p, ib_error *err) {
    return pg_transaction((pg_store *)st, "BEGIN", "update", id, update_body, (void *)p, err);
}

/* delete: the session row, and with it (ON DELETE CASCADE) its history. */
static int delete_body(pg_tx *t, void *arg) {
    const char *v[1] = {t->id};
    if (tx_run(t, PGRES_COMMAND_OK, "DELETE FROM isobatch_sessions WHERE id = $1", 1, v, NULL, NULL, 0))
        return TX_SQL_FAILED;
    return strcmp(PQcmdTuples(t->res), "0") ? TX_COMMIT : tx_refuse(t, IB_ERR_NOT_FOUND, "no session %s", t->id);
}

/* ops.del (ib_store_delete). */
static ib_status pg_delete(ib_store *st, const char *id, ib_error *err) {
    return pg_transaction((pg_store *)st, "BEGIN", "delete", id, delete_body, NULL, err);
}

typedef struct list_arg {
    const char *owner;
    char **ids;
    int n;
} list_arg;

/* list: ids of an owner's sessions in creation order (seq), copied out. */
static int list_body(pg_tx *t, void *arg) {
    list_arg *l = arg;
    const char *v[1] = {l->owner};
    if (tx_run(t, PGRES_TUPLES_OK, "SELECT id FROM isobatch_sessions WHERE owner = $1 ORDER BY seq", 1, v, NULL, NULL, 0))
        return TX_SQL_FAILED;
    int n = PQntuples(t->res);
    if (n == 0) return TX_COMMIT;
    if (!(l->ids = calloc((size_t)n, sizeof *l->ids))) return tx_refuse(t, IB_ERR_NOMEM, "list: out of memory");
    l->n = n;
    for (int i = 0; i < n; i++)
        if (!(l->ids[i] = strdup(PQgetvalue(t->res, i, 0)))) return tx_refuse(t, IB_ERR_NOMEM, "list: out of memory");
    return TX_COMMIT;
}

/* ops.list_owner (ib_store_list_owner). */
static ib_status pg_list_owner(ib_store *st, const char *owner, char ***ids, int *n, ib_error *err) {
    list_arg l = {owner, NULL, 0};
    ib_status rc = pg_transaction((pg_store *)st, "BEGIN READ ONLY", "list", NULL, list_body, &l, err);
    if (rc) {
        ib_store_ids_free(l.ids, l.n);
        return rc;
    }
    *ids = l.ids;
    *n = l.n;
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

/* init: under an advisory lock (so that servers opening one new database together create it once),
 * check the tables are an isobatch store of this version, or create them where there are none. */
static int init_body(pg_tx *t, void *arg) {
    (void)arg;
    if (tx_run(t, PGRES_TUPLES_OK, "SELECT pg_advisory_xact_lock(" PG_SCHEMA_LOCK ")", 0, NULL, NULL, NULL, 0) ||
        tx_run(t, PGRES_TUPLES_OK,
               "SELECT to_regclass('isobatch_meta') IS NOT NULL, to_regclass('isobatch_sessions') IS NOT NULL,"
               " to_regclass('isobatch_history') IS NOT NULL",
               0, NULL, NULL, NULL, 0))
        return TX_SQL_FAILED;
    int meta = !strcmp(PQgetvalue(t->res, 0, 0), "t"), sess = !strcmp(PQgetvalue(t->res, 0, 1), "t"),
        hist = !strcmp(PQgetvalue(t->res, 0, 2), "t");
    if (!meta) {
        if (sess || hist)
            return tx_refuse(t, IB_ERR_FORMAT, "tables named isobatch_sessions/isobatch_history exist without "
                                               "isobatch_meta: not an isobatch session store");
        t->what = "create schema";
        return cmd(t->c, SCHEMA, &t->res) ? TX_SQL_FAILED : TX_COMMIT;
    }
    if (tx_run(t, PGRES_TUPLES_OK, "SELECT value FROM isobatch_meta WHERE key = 'schema_version'", 0, NULL, NULL, NULL, 0))
        return TX_SQL_FAILED;
    if (PQntuples(t->res) != 1 || !sess || !hist)
        return tx_refuse(t, IB_ERR_FORMAT, "the isobatch_* tables are incomplete (no schema version, or a table "
                                           "missing): not an isobatch session store");
    long ver = strtol(PQgetvalue(t->res, 0, 0), NULL, 10);
    if (ver != IB_STORE_SCHEMA_VERSION)
        return tx_refuse(t, IB_ERR_UNSUPPORTED, "schema version %ld, this build reads version %d", ver,
                         IB_STORE_SCHEMA_VERSION);
    return TX_COMMIT;
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
    if ((st = pg_transaction(s, "BEGIN", "open", NULL, init_body, NULL, err))) goto fail;
    *out = &s->base;
    return IB_OK;
fail:
    pg_close(&s->base);
    return st;
}
