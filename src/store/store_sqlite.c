/*
 * store_sqlite.c — the session store on an SQLite database file (Debian's libsqlite3).
 *
 * Why these settings: journal_mode=WAL lets readers run while a writer commits and makes a commit
 * one sequential append to the log; synchronous=FULL fsyncs the log at every commit, so a write is
 * durable when its call returns (store.h, DURABILITY). Each write call is one BEGIN IMMEDIATE ...
 * COMMIT transaction; any failure rolls it back, so a failed call changes nothing.
 *
 * Schema (version 1, PRAGMA user_version; PRAGMA application_id marks the file as ours):
 *   sessions(id TEXT PRIMARY KEY, owner, model_id, max_context, kv_sink, kv_window, kv_chunk,
 *            kv_dtype TEXT, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
 *            draws, n_fed, n_tokens, created, updated)
 *     float settings are stored as their IEEE-754 bit patterns (INTEGER), so every value — NaN
 *     included — comes back with the same bits; seed and draws as the int64 of their 64 bits.
 *   history(session_id, first, tokens BLOB, flags BLOB) PRIMARY KEY (session_id, first)
 *     one row per append: tokens [first, first + n) as little-endian int32, their flags one byte each.
 * A load checks that the rows tile [0, n_tokens) exactly; anything else is IB_ERR_FORMAT.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "store/store_codec.h"
#include "store/store_impl.h"

/* "IBS1" — marks a database file as an isobatch session store. */
#define APP_ID 0x49425331

typedef struct sq_store {
    ib_store base;
    sqlite3 *db;
    pthread_mutex_t mu;   /* one call at a time: a transaction spans several statements */
    /* group commit of appends (sq_append): the queue of waiting appends, whether one leads a commit */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    struct sq_pending *q_head, *q_tail;
    int leading;
    long n_commits;       /* append transactions so far */
    char path[1024];
} sq_store;

static const char SCHEMA[] =
    "CREATE TABLE sessions("
    " id TEXT PRIMARY KEY NOT NULL, owner TEXT NOT NULL, model_id TEXT NOT NULL,"
    " max_context INTEGER NOT NULL, kv_sink INTEGER NOT NULL, kv_window INTEGER NOT NULL,"
    " kv_chunk INTEGER NOT NULL, kv_dtype TEXT NOT NULL,"
    " temperature INTEGER NOT NULL, top_k INTEGER NOT NULL, top_p INTEGER NOT NULL, min_p INTEGER NOT NULL,"
    " repeat_penalty INTEGER NOT NULL, repeat_last_n INTEGER NOT NULL, seed INTEGER NOT NULL,"
    " draws INTEGER NOT NULL, n_fed INTEGER NOT NULL, n_tokens INTEGER NOT NULL,"
    " created INTEGER NOT NULL, updated INTEGER NOT NULL);"
    "CREATE INDEX sessions_owner ON sessions(owner);"
    "CREATE TABLE history(session_id TEXT NOT NULL, first INTEGER NOT NULL, tokens BLOB NOT NULL,"
    " flags BLOB NOT NULL, PRIMARY KEY(session_id, first)) WITHOUT ROWID;";

/* Map an SQLite result code to a status with a one-line message naming the store, what was being
 * done and (when not NULL) the session. */
static ib_status sq_fail(sq_store *s, int rc, const char *what, const char *id, ib_error *err) {
    int prim = rc & 0xff;
    const char *msg = s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc);
    int sys = s->db ? sqlite3_system_errno(s->db) : 0;
    const char *sep = id ? ": session " : "";
    const char *sid = id ? id : "";
    /* SQLite reports a refused write as SQLITE_FULL (ENOSPC) or SQLITE_IOERR_WRITE (EFBIG, EDQUOT,
     * EIO), and the system errno is often gone by the time the error comes back: say what is known */
    if (prim == SQLITE_FULL || (prim == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT)))
        return ib_fail(err, IB_ERR_IO, "store %s%s%s: %s: out of space: the disk is full (%s)", s->path, sep, sid, what,
                       msg);
    if (rc == SQLITE_IOERR_WRITE)
        return ib_fail(err, IB_ERR_IO,
                       "store %s%s%s: %s: write failed: out of space, over a file size limit or a device error (%s%s%s)",
                       s->path, sep, sid, what, msg, sys ? ": " : "", sys ? strerror(sys) : "");
    switch (prim) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return ib_fail(err, IB_ERR_FORMAT, "store %s%s%s: %s: the database is corrupt or not a database (%s)", s->path,
                       sep, sid, what, msg);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return ib_fail(err, IB_ERR_STATE, "store %s%s%s: %s: locked by another writer (%s)", s->path, sep, sid, what,
                       msg);
    case SQLITE_NOMEM:
        return ib_fail(err, IB_ERR_NOMEM, "store %s%s%s: %s: out of memory", s->path, sep, sid, what);
    default:
        if (sys)
            return ib_fail(err, IB_ERR_IO, "store %s%s%s: %s: %s (%s)", s->path, sep, sid, what, msg, strerror(sys));
        return ib_fail(err, IB_ERR_IO, "store %s%s%s: %s: %s", s->path, sep, sid, what, msg);
    }
}

/* Run SQL without results. */
static int exec(sq_store *s, const char *sql) { return sqlite3_exec(s->db, sql, NULL, NULL, NULL); }

/* Roll back the open transaction, if any (after a failure; its own failure changes nothing more). */
static void rollback(sq_store *s) {
    if (!sqlite3_get_autocommit(s->db)) exec(s, "ROLLBACK");
}

/* The first column of the first row of query sql, its one parameter bound to text arg (NULL: none),
 * as an integer: *out, or `absent` when there is no row; SQLITE_OK or the error. */
static int query_int_or(sq_store *s, const char *sql, const char *arg, long long absent, long long *out) {
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &q, NULL);
    if (rc == SQLITE_OK) {
        if (arg) sqlite3_bind_text(q, 1, arg, -1, SQLITE_STATIC);
        rc = sqlite3_step(q);
        if (rc == SQLITE_ROW) {
            *out = sqlite3_column_int64(q, 0);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            *out = absent;
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(q);
    return rc;
}

/* Run statement sql (one that returns no rows) to its end, its one parameter bound to text arg:
 * SQLITE_DONE, or the error. */
static int exec_with_text(sq_store *s, const char *sql, const char *arg) {
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &q, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(q, 1, arg, -1, SQLITE_STATIC);
        rc = sqlite3_step(q);
    }
    sqlite3_finalize(q);
    return rc;
}

/* Integer result of a one-value query (a PRAGMA; 0 without a row); SQLITE_OK or the error. */
static int query_int(sq_store *s, const char *sql, long long *out) { return query_int_or(s, sql, NULL, 0, out); }

/* ops.close: close the connection (SQLite folds the log into the file at the last close) and free. */
static void sq_close(ib_store *st) {
    sq_store *s = (sq_store *)st;
    if (s->db) sqlite3_close_v2(s->db);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    free(s);
}

/* Wall-clock unix seconds, for the created/updated columns (never used by a rebuild). */
static int64_t now_s(void) { return (int64_t)time(NULL); }

/* Insert one history row: tokens [first, first + n). */
static int put_history(sq_store *s, const char *id, int first, const int32_t *tokens, const uint8_t *flags, int n) {
    unsigned char *buf = malloc((size_t)n * 4);
    if (!buf) return SQLITE_NOMEM;
    ib_store_enc_tokens(tokens, n, buf);
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(s->db, "INSERT INTO history(session_id, first, tokens, flags) VALUES(?,?,?,?)", -1, &q,
                                NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 2, first);
        sqlite3_bind_blob(q, 3, buf, n * 4, SQLITE_STATIC);
        sqlite3_bind_blob(q, 4, flags, n, SQLITE_STATIC);
        rc = sqlite3_step(q);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    sqlite3_finalize(q);
    free(buf);
    return rc;
}

/* Commit. On failure the caller reports the error (sq_fail reads the connection's last error) and
 * then rolls back. */
static int commit(sq_store *s) { return exec(s, "COMMIT"); }

/* ops.create (ib_store_create): the session row and its first history row in one transaction;
 * IB_ERR_STATE when the id is taken. */
static ib_status sq_create(ib_store *st, const ib_store_session *r, ib_error *err) {
    sq_store *s = (sq_store *)st;
    pthread_mutex_lock(&s->mu);
    ib_status out = IB_OK;
    const char *what = "create";
    sqlite3_stmt *q = NULL;
    int rc = exec(s, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK) goto fail;
    rc = sqlite3_prepare_v2(s->db,
                            "INSERT OR ABORT INTO sessions(id, owner, model_id, max_context, kv_sink, kv_window, kv_chunk,"
                            " kv_dtype, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, draws,"
                            " n_fed, n_tokens, created, updated) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                            -1, &q, NULL);
    if (rc != SQLITE_OK) goto fail;
    const ib_sampling *sp = &r->progress.sampling;
    int64_t t = now_s();
    sqlite3_bind_text(q, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, r->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, r->model_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 4, r->max_context);
    sqlite3_bind_int(q, 5, r->kv_sink);
    sqlite3_bind_int(q, 6, r->kv_window);
    sqlite3_bind_int(q, 7, r->kv_chunk);
    sqlite3_bind_text(q, 8, ib_kv_dtype_name(r->kv_dtype), -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 9, ib_store_fbits(sp->temperature));
    sqlite3_bind_int(q, 10, sp->top_k);
    sqlite3_bind_int64(q, 11, ib_store_fbits(sp->top_p));
    sqlite3_bind_int64(q, 12, ib_store_fbits(sp->min_p));
    sqlite3_bind_int64(q, 13, ib_store_fbits(sp->repeat_penalty));
    sqlite3_bind_int(q, 14, sp->repeat_last_n);
    sqlite3_bind_int64(q, 15, (int64_t)sp->seed);
    sqlite3_bind_int64(q, 16, (int64_t)r->progress.draws);
    sqlite3_bind_int(q, 17, r->progress.n_fed);
    sqlite3_bind_int(q, 18, r->n_tokens);
    sqlite3_bind_int64(q, 19, t);
    sqlite3_bind_int64(q, 20, t);
    rc = sqlite3_step(q);
    sqlite3_finalize(q);
    q = NULL;
    if ((rc & 0xff) == SQLITE_CONSTRAINT) {
        rollback(s);
        out = ib_fail(err, IB_ERR_STATE, "store %s: session %s exists already", s->path, r->id);
        goto done;
    }
    if (rc != SQLITE_DONE) goto fail;
    if (r->n_tokens > 0) {
        what = "create (history)";
        if ((rc = put_history(s, r->id, 0, r->tokens, r->flags, r->n_tokens)) != SQLITE_OK) goto fail;
    }
    what = "commit";
    if ((rc = commit(s)) != SQLITE_OK) goto fail;
    goto done;
fail:
    out = sq_fail(s, rc, what, r->id, err);
    sqlite3_finalize(q);
    rollback(s);
done:
    pthread_mutex_unlock(&s->mu);
    return out;
}

/* Read the history rows of id into out (n_tokens already set from the sessions row). */
static ib_status load_history(sq_store *s, const char *id, ib_store_session *out, ib_error *err) {
    ib_status st = ib_store_history_alloc(s->path, out, err);
    if (st) return st;
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(s->db, "SELECT first, tokens, flags FROM history WHERE session_id = ? ORDER BY first", -1,
                                &q, NULL);
    if (rc != SQLITE_OK) return sq_fail(s, rc, "load history", id, err);
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    int have = 0;
    while (!st && (rc = sqlite3_step(q)) == SQLITE_ROW)
        st = ib_store_history_add(s->path, out, &have, sqlite3_column_int64(q, 0), sqlite3_column_blob(q, 1),
                                  sqlite3_column_bytes(q, 1), sqlite3_column_blob(q, 2), sqlite3_column_bytes(q, 2), err);
    if (!st && rc != SQLITE_DONE) st = sq_fail(s, rc, "load history", id, err);
    sqlite3_finalize(q);
    if (!st) st = ib_store_history_end(s->path, out, have, err);
    return st;
}

/* ops.load (ib_store_load): the session row and its history in one read transaction (one snapshot),
 * every value range-checked; IB_ERR_FORMAT when the rows contradict each other. */
static ib_status sq_load(ib_store *st, const char *id, ib_store_session *out, ib_error *err) {
    sq_store *s = (sq_store *)st;
    pthread_mutex_lock(&s->mu);
    ib_status res = IB_OK;
    sqlite3_stmt *q = NULL;
    /* one read transaction: the session row and its history are one snapshot */
    int rc = exec(s, "BEGIN");
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(s->db,
                                "SELECT owner, model_id, max_context, kv_sink, kv_window, kv_chunk, kv_dtype, temperature,"
                                " top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, draws, n_fed, n_tokens,"
                                " created, updated FROM sessions WHERE id = ?",
                                -1, &q, NULL);
    if (rc != SQLITE_OK) {
        res = sq_fail(s, rc, "load", id, err);
        goto done;
    }
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) {
        res = ib_fail(err, IB_ERR_NOT_FOUND, "store %s: no session %s", s->path, id);
        goto done;
    }
    if (rc != SQLITE_ROW) {
        res = sq_fail(s, rc, "load", id, err);
        goto done;
    }
    snprintf(out->id, sizeof out->id, "%s", id);
    const char *owner = (const char *)sqlite3_column_text(q, 0);
    const char *model = (const char *)sqlite3_column_text(q, 1);
    const char *dt = (const char *)sqlite3_column_text(q, 6);
    long long ints[6] = {sqlite3_column_int64(q, 2), sqlite3_column_int64(q, 3), sqlite3_column_int64(q, 4),
                         sqlite3_column_int64(q, 5), sqlite3_column_int64(q, 15), sqlite3_column_int64(q, 16)};
    if (ib_store_row_valid(ints, owner, model, dt, &out->kv_dtype)) {
        res = ib_fail(err, IB_ERR_FORMAT, "store %s: session %s: its row holds values out of range", s->path, id);
        goto done;
    }
    snprintf(out->owner, sizeof out->owner, "%s", owner);
    snprintf(out->model_id, sizeof out->model_id, "%s", model);
    out->max_context = (int)ints[0];
    out->kv_sink = (int)ints[1];
    out->kv_window = (int)ints[2];
    out->kv_chunk = (int)ints[3];
    ib_sampling *sp = &out->progress.sampling;
    sp->temperature = ib_store_bitsf(sqlite3_column_int64(q, 7));
    sp->top_k = sqlite3_column_int(q, 8);
    sp->top_p = ib_store_bitsf(sqlite3_column_int64(q, 9));
    sp->min_p = ib_store_bitsf(sqlite3_column_int64(q, 10));
    sp->repeat_penalty = ib_store_bitsf(sqlite3_column_int64(q, 11));
    sp->repeat_last_n = sqlite3_column_int(q, 12);
    sp->seed = (uint64_t)sqlite3_column_int64(q, 13);
    out->progress.draws = (uint64_t)sqlite3_column_int64(q, 14);
    out->progress.n_fed = (int)ints[4];
    out->n_tokens = (int)ints[5];
    out->created = sqlite3_column_int64(q, 17);
    out->updated = sqlite3_column_int64(q, 18);
    sqlite3_finalize(q);
    q = NULL;
    res = load_history(s, id, out, err);
done:
    sqlite3_finalize(q);
    rollback(s); /* ends the read transaction */
    pthread_mutex_unlock(&s->mu);
    return res;
}

/* Set the progress columns of id (inside a transaction); SQLite status. */
static int put_progress(sq_store *s, const char *id, const ib_store_progress *p) {
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(s->db,
                                "UPDATE sessions SET temperature=?, top_k=?, top_p=?, min_p=?, repeat_penalty=?,"
                                " repeat_last_n=?, seed=?, draws=?, n_fed=?, updated=? WHERE id=?",
                                -1, &q, NULL);
    if (rc == SQLITE_OK) {
        const ib_sampling *sp = &p->sampling;
        sqlite3_bind_int64(q, 1, ib_store_fbits(sp->temperature));
        sqlite3_bind_int(q, 2, sp->top_k);
        sqlite3_bind_int64(q, 3, ib_store_fbits(sp->top_p));
        sqlite3_bind_int64(q, 4, ib_store_fbits(sp->min_p));
        sqlite3_bind_int64(q, 5, ib_store_fbits(sp->repeat_penalty));
        sqlite3_bind_int(q, 6, sp->repeat_last_n);
        sqlite3_bind_int64(q, 7, (int64_t)sp->seed);
        sqlite3_bind_int64(q, 8, (int64_t)p->draws);
        sqlite3_bind_int(q, 9, p->n_fed);
        sqlite3_bind_int64(q, 10, now_s());
        sqlite3_bind_text(q, 11, id, -1, SQLITE_STATIC);
        rc = sqlite3_step(q);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    sqlite3_finalize(q);
    return rc;
}

/* The stored token count of id inside the open transaction: *n = -1 when absent. */
static int get_count(sq_store *s, const char *id, long long *n) {
    return query_int_or(s, "SELECT n_tokens FROM sessions WHERE id = ?", id, -1, n);
}

/* One append call waiting for (or in) a group commit. */
typedef struct sq_pending {
    const char *id;
    int at, n;
    const int32_t *tokens;
    const uint8_t *flags;
    const ib_store_progress *p;
    ib_error *err;
    ib_status rc;
    int done;
    struct sq_pending *next;
} sq_pending;

/* One append inside the open transaction, under its own savepoint, so that its failure (a stale
 * position, an unknown id) leaves the batch's other appends in. */
static void append_one(sq_store *s, sq_pending *a) {
    long long have = 0;
    const char *what = "append";
    int rc = exec(s, "SAVEPOINT one");
    if (rc != SQLITE_OK) {
        a->rc = sq_fail(s, rc, what, a->id, a->err);
        return;
    }
    rc = get_count(s, a->id, &have);
    if (rc == SQLITE_OK && (have < 0 || have != a->at)) {
        a->rc = have < 0 ? ib_fail(a->err, IB_ERR_NOT_FOUND, "store %s: no session %s", s->path, a->id)
                         : ib_fail(a->err, IB_ERR_STATE, "store %s: session %s: append at %d, but it holds %lld tokens",
                                   s->path, a->id, a->at, have);
        exec(s, "ROLLBACK TO one");
        exec(s, "RELEASE one");
        return;
    }
    if (rc == SQLITE_OK) rc = put_history(s, a->id, a->at, a->tokens, a->flags, a->n);
    if (rc == SQLITE_OK) {
        sqlite3_stmt *q = NULL;
        rc = sqlite3_prepare_v2(s->db, "UPDATE sessions SET n_tokens = ?, updated = ? WHERE id = ?", -1, &q, NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_int(q, 1, a->at + a->n);
            sqlite3_bind_int64(q, 2, now_s());
            sqlite3_bind_text(q, 3, a->id, -1, SQLITE_STATIC);
            rc = sqlite3_step(q);
            if (rc == SQLITE_DONE) rc = SQLITE_OK;
        }
        sqlite3_finalize(q);
    }
    if (rc == SQLITE_OK && a->p) rc = put_progress(s, a->id, a->p);
    if (rc == SQLITE_OK) rc = exec(s, "RELEASE one");
    if (rc != SQLITE_OK) {
        a->rc = sq_fail(s, rc, what, a->id, a->err);
        exec(s, "ROLLBACK TO one");
        exec(s, "RELEASE one");
        return;
    }
    a->rc = IB_OK;
}

/* Group commit: appends from several threads that arrive while a commit is under way are written
 * together in the next transaction, so its one fsync makes them all durable; each call still returns
 * only after the commit that holds its write (store.h, DURABILITY). The first caller to find no
 * commit under way leads: it takes the queue, writes and commits it, marks every entry done. */
static ib_status sq_append(ib_store *st, const char *id, int at, const int32_t *tokens, const uint8_t *flags, int n,
                           const ib_store_progress *p, ib_error *err) {
    sq_store *s = (sq_store *)st;
    sq_pending me = {.id = id, .at = at, .n = n, .tokens = tokens, .flags = flags, .p = p, .err = err};
    pthread_mutex_lock(&s->qmu);
    if (s->q_tail) s->q_tail->next = &me;
    else s->q_head = &me;
    s->q_tail = &me;
    while (!me.done) {
        if (s->leading) {
            pthread_cond_wait(&s->qcv, &s->qmu);
            continue;
        }
        s->leading = 1;
        pthread_mutex_unlock(&s->qmu);
        pthread_mutex_lock(&s->mu);
        pthread_mutex_lock(&s->qmu);
        sq_pending *batch = s->q_head;
        s->q_head = s->q_tail = NULL;
        pthread_mutex_unlock(&s->qmu);
        int rc = exec(s, "BEGIN IMMEDIATE");
        const char *what = "append";
        if (rc == SQLITE_OK) {
            int wrote = 0;
            for (sq_pending *a = batch; a; a = a->next) {
                append_one(s, a);
                wrote += a->rc == IB_OK;
            }
            what = "commit";
            rc = wrote ? commit(s) : SQLITE_OK;
        }
        if (rc != SQLITE_OK) /* the transaction is lost: every append that was in it fails */
            for (sq_pending *a = batch; a; a = a->next)
                if (a->rc == IB_OK) a->rc = sq_fail(s, rc, what, a->id, a->err);
        rollback(s); /* nothing open after a commit; after a failure, end the transaction */
        s->n_commits++;
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&s->qmu);
        for (sq_pending *a = batch, *nx; a; a = nx) {
            nx = a->next;
            a->done = 1;
        }
        s->leading = 0;
        pthread_cond_broadcast(&s->qcv);
    }
    pthread_mutex_unlock(&s->qmu);
    return me.rc;
}

/* ops.update (ib_store_update): the progress columns, n_fed checked against the stored count, in one
 * transaction. */
static ib_status sq_update(ib_store *st, const char *id, const ib_store_progress *p, ib_error *err) {
    sq_store *s = (sq_store *)st;
    pthread_mutex_lock(&s->mu);
    ib_status out = IB_OK;
    const char *what = "update";
    long long have = 0;
    int rc = exec(s, "BEGIN IMMEDIATE");
    if (rc == SQLITE_OK) rc = get_count(s, id, &have);
    if (rc != SQLITE_OK) goto fail;
    if (have < 0 || p->n_fed > have) {
        rollback(s);
        out = have < 0 ? ib_fail(err, IB_ERR_NOT_FOUND, "store %s: no session %s", s->path, id)
                       : ib_fail(err, IB_ERR_INVALID_ARG, "store %s: session %s: n_fed %d is past its %lld tokens",
                                 s->path, id, p->n_fed, have);
        goto done;
    }
    if ((rc = put_progress(s, id, p)) != SQLITE_OK) goto fail;
    what = "commit";
    if ((rc = commit(s)) != SQLITE_OK) goto fail;
    goto done;
fail:
    out = sq_fail(s, rc, what, id, err);
    rollback(s);
done:
    pthread_mutex_unlock(&s->mu);
    return out;
}

/* ops.del (ib_store_delete): the session row and its history rows in one transaction. */
static ib_status sq_delete(ib_store *st, const char *id, ib_error *err) {
    sq_store *s = (sq_store *)st;
    pthread_mutex_lock(&s->mu);
    ib_status out = IB_OK;
    const char *what = "delete";
    int rc = exec(s, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK) goto fail;
    if ((rc = exec_with_text(s, "DELETE FROM sessions WHERE id = ?", id)) != SQLITE_DONE) goto fail;
    if (sqlite3_changes(s->db) == 0) {
        rollback(s);
        out = ib_fail(err, IB_ERR_NOT_FOUND, "store %s: no session %s", s->path, id);
        goto done;
    }
    if ((rc = exec_with_text(s, "DELETE FROM history WHERE session_id = ?", id)) != SQLITE_DONE) goto fail;
    what = "commit";
    if ((rc = commit(s)) != SQLITE_OK) goto fail;
    goto done;
fail:
    out = sq_fail(s, rc, what, id, err);
    rollback(s);
done:
    pthread_mutex_unlock(&s->mu);
    return out;
}

/* ops.list_owner (ib_store_list_owner): ids of owner's sessions in creation order (rowid). */
static ib_status sq_list_owner(ib_store *st, const char *owner, char ***ids, int *n, ib_error *err) {
    sq_store *s = (sq_store *)st;
    pthread_mutex_lock(&s->mu);
    ib_status out = IB_OK;
    char **v = NULL;
    int nv = 0, cap = 0;
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(s->db, "SELECT id FROM sessions WHERE owner = ? ORDER BY rowid", -1, &q, NULL);
    if (rc != SQLITE_OK) {
        out = sq_fail(s, rc, "list", NULL, err);
        goto done;
    }
    sqlite3_bind_text(q, 1, owner, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(q, 0);
        if (nv == cap) {
            int nc = cap ? 2 * cap : 16;
            char **nv2 = realloc(v, (size_t)nc * sizeof *v);
            if (!nv2) {
                out = ib_fail(err, IB_ERR_NOMEM, "store %s: list: out of memory", s->path);
                goto done;
            }
            v = nv2;
            cap = nc;
        }
        if (!(v[nv] = strdup(id ? id : ""))) {
            out = ib_fail(err, IB_ERR_NOMEM, "store %s: list: out of memory", s->path);
            goto done;
        }
        nv++;
    }
    if (rc != SQLITE_DONE) out = sq_fail(s, rc, "list", NULL, err);
done:
    sqlite3_finalize(q);
    if (out) {
        ib_store_ids_free(v, nv);
    } else {
        *ids = v;
        *n = nv;
    }
    pthread_mutex_unlock(&s->mu);
    return out;
}

static const ib_store_ops SQ_OPS = {sq_close, sq_create, sq_load, sq_append, sq_update, sq_delete, sq_list_owner};

/* Check the file is ours and of our version, creating the schema in an empty database. */
static ib_status sq_init(sq_store *s, ib_error *err) {
    long long app = 0, ver = 0, ntab = 0;
    const char *what = "open";
    int rc = query_int(s, "PRAGMA application_id", &app);
    if (rc == SQLITE_OK) rc = query_int(s, "PRAGMA user_version", &ver);
    if (rc == SQLITE_OK) rc = query_int(s, "SELECT count(*) FROM sqlite_master", &ntab);
    if (rc != SQLITE_OK) return sq_fail(s, rc, what, NULL, err);
    if (app != APP_ID && (app != 0 || ver != 0 || ntab != 0))
        return ib_fail(err, IB_ERR_FORMAT, "store %s: not an isobatch session store (application_id 0x%llx, %lld tables)",
                       s->path, (unsigned long long)app, ntab);
    if (app == APP_ID && ver != IB_STORE_SCHEMA_VERSION)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "store %s: schema version %lld, this build reads version %d", s->path,
                       ver, IB_STORE_SCHEMA_VERSION);
    /* WAL: set outside a transaction; "wal" comes back when it took */
    sqlite3_stmt *q = NULL;
    what = "set WAL journal";
    rc = sqlite3_prepare_v2(s->db, "PRAGMA journal_mode=WAL", -1, &q, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(q);
    int wal = rc == SQLITE_ROW && sqlite3_column_text(q, 0) && !strcmp((const char *)sqlite3_column_text(q, 0), "wal");
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW) return sq_fail(s, rc, what, NULL, err);
    if (!wal) return ib_fail(err, IB_ERR_IO, "store %s: the file system refused the WAL journal", s->path);
    if ((rc = exec(s, "PRAGMA synchronous=FULL")) != SQLITE_OK) return sq_fail(s, rc, "set synchronous", NULL, err);
    if (app == APP_ID) return IB_OK;
    /* a new (empty) database: the schema, the mark and the version in one transaction */
    char sql[64];
    what = "create schema";
    rc = exec(s, "BEGIN IMMEDIATE");
    if (rc == SQLITE_OK) {
        /* another process may have made it meanwhile */
        rc = query_int(s, "PRAGMA application_id", &app);
        if (rc == SQLITE_OK && app == APP_ID) {
            rollback(s);
            return IB_OK;
        }
    }
    if (rc == SQLITE_OK) rc = exec(s, SCHEMA);
    snprintf(sql, sizeof sql, "PRAGMA application_id=%d", APP_ID);
    if (rc == SQLITE_OK) rc = exec(s, sql);
    snprintf(sql, sizeof sql, "PRAGMA user_version=%d", IB_STORE_SCHEMA_VERSION);
    if (rc == SQLITE_OK) rc = exec(s, sql);
    if (rc == SQLITE_OK) rc = commit(s);
    if (rc != SQLITE_OK) {
        ib_status st = sq_fail(s, rc, what, NULL, err);
        rollback(s);
        return st;
    }
    return IB_OK;
}

ib_status ib_store_sqlite_open(const char *path, ib_store **out, ib_error *err) {
    *out = NULL;
    if (strlen(path) >= sizeof ((sq_store *)0)->path)
        return ib_fail(err, IB_ERR_INVALID_ARG, "store: path too long (%zu bytes)", strlen(path));
    sq_store *s = calloc(1, sizeof *s);
    if (!s) return ib_fail(err, IB_ERR_NOMEM, "store %s: out of memory", path);
    s->base.ops = &SQ_OPS;
    snprintf(s->path, sizeof s->path, "%s", path);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL);
    ib_status st = IB_OK;
    if (rc != SQLITE_OK) {
        st = sq_fail(s, rc, "open", NULL, err);
        goto fail;
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, 5000);
    if ((st = sq_init(s, err))) goto fail;
    *out = &s->base;
    return IB_OK;
fail:
    sq_close(&s->base);
    return st;
}
