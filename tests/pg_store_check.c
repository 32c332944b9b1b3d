/*
 * pg_store_check.c — the session store on PostgreSQL (src/store/store_pg.c), against a real server
 * that tests/t_store_pg.sh starts on loopback. Modes:
 *
 *   pg_store_check all URI
 *       - the conformance checks every back end passes (store_conformance.h): round trips of every
 *         field, appends, updates, lists, refusals, delete, reopen; threads on one store;
 *       - two stores on one database (two servers): each sees the other's sessions, a stale append
 *         from one after the other's is refused, so histories never interleave;
 *       - writer processes SIGKILLed at varied moments: every acknowledged write is there, nothing
 *         half-written is, progress never apart from its tokens;
 *       - tables that are not a store (no schema version, a newer version, a history row that does not
 *         continue the session): one-line IB_ERR_FORMAT / IB_ERR_UNSUPPORTED, never a crash;
 *       - the server ending the store's connections: a call fails at most once with IB_ERR_IO, the next
 *         reconnects; an unreachable server: IB_ERR_IO with the password not shown.
 *   pg_store_check write URI SID KEY
 *       create session SID and append the conformance writer's sequence until a call fails, printing
 *       each acknowledged length on its own line (for the server-kill test).
 *   pg_store_check verify URI SID KEY ACKED
 *       session SID holds every one of the ACKED tokens acknowledged before the server was killed,
 *       and nothing half-written.
 */
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "store/store.h"
#include "store_conformance.h"

static const char *URI;

/* Run SQL on a connection of our own (setup and sabotage); 0 when it succeeded. */
static int raw_sql(const char *sql) {
    PGconn *c = PQconnectdb(URI);
    int ok = PQstatus(c) == CONNECTION_OK;
    if (ok) {
        PGresult *r = PQexec(c, sql);
        ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
        if (!ok) fprintf(stderr, "pg_store_check: %s: %s", sql, PQresultErrorMessage(r));
        PQclear(r);
    } else {
        fprintf(stderr, "pg_store_check: connect: %s", PQerrorMessage(c));
    }
    PQfinish(c);
    return ok ? 0 : -1;
}

/* Drop the store's tables: the next open makes an empty store. */
static const char *fresh(void) {
    raw_sql("DROP TABLE IF EXISTS isobatch_history, isobatch_sessions, isobatch_meta CASCADE");
    return URI;
}

/* Two stores (two servers) on one database. */
static void test_two_servers(void) {
    ib_error err;
    ib_store *a = NULL, *b = NULL;
    const char *uri = fresh();
    CHECK(ib_store_open(uri, &a, &err) == IB_OK, "open a: %s", err.msg);
    CHECK(ib_store_open(uri, &b, &err) == IB_OK, "open b: %s", err.msg);
    if (!a || !b) {
        ib_store_close(a);
        ib_store_close(b);
        return;
    }
    ib_store_session r = make_rec("shared", "tenant", 10);
    CHECK(ib_store_create(a, &r, &err) == IB_OK, "create on a: %s", err.msg);
    CHECK(ib_store_create(b, &r, &err) == IB_ERR_STATE, "the same id on b: %s", err.msg);
    ib_store_session l;
    CHECK(ib_store_load(b, "shared", &l, &err) == IB_OK && l.n_tokens == 10 && !memcmp(l.tokens, r.tokens, 40),
          "b sees a's session: %s", err.msg);
    ib_store_session_free(&l);
    int32_t t[5];
    uint8_t f[5];
    for (int i = 0; i < 5; i++) t[i] = tok_at(1, 10 + i), f[i] = flag_at(10 + i);
    CHECK(ib_store_append(b, "shared", 10, t, f, 5, NULL, &err) == IB_OK, "append on b: %s", err.msg);
    CHECK(ib_store_append(a, "shared", 10, t, f, 5, NULL, &err) == IB_ERR_STATE && strstr(err.msg, "holds 15"),
          "a's append at the position b already filled: %s", err.msg);
    CHECK(ib_store_load(a, "shared", &l, &err) == IB_OK && l.n_tokens == 15 && l.tokens[14] == tok_at(1, 14),
          "a sees b's append: %d tokens", l.n_tokens);
    ib_store_session_free(&l);
    char **ids;
    int n;
    CHECK(ib_store_list_owner(b, r.owner, &ids, &n, &err) == IB_OK && n == 1, "b lists it: %d", n);
    ib_store_ids_free(ids, n);
    CHECK(ib_store_delete(b, "shared", &err) == IB_OK, "delete on b: %s", err.msg);
    CHECK(ib_store_load(a, "shared", &l, &err) == IB_ERR_NOT_FOUND, "gone for a too: %s", err.msg);
    ib_store_session_free(&l);
    ib_store_session_free(&r);
    ib_store_close(a);
    ib_store_close(b);
}

/* Writer processes killed at varied moments; what they acknowledged survives. */
static void test_kill_writers(void) {
    const char *uri = fresh();
    for (int run = 0; run < 4; run++) {
        char sid[16];
        snprintf(sid, sizeof sid, "kw%d", run);
        int pfd[2];
        if (pipe(pfd)) return;
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            conf_writer(uri, sid, 40 + run, pfd[1], NULL);
        }
        close(pfd[1]);
        int v, acked = -1;
        for (int k = 0; k < 3 + run * 4; k++)
            if (read(pfd[0], &v, sizeof v) == sizeof v) acked = v;
        struct timespec ts = {0, (long)(run * 611 % 2000) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        int more = drain_acks(pfd[0]);
        close(pfd[0]);
        if (more >= 0) acked = more;
        char what[64];
        snprintf(what, sizeof what, "killed writer %d", run);
        CHECK(WIFSIGNALED(status) && acked > 0, "%s: ended otherwise (status %d, %d acknowledged)", what, status, acked);
        ib_error err;
        ib_store *st = NULL;
        CHECK(ib_store_open(uri, &st, &err) == IB_OK, "%s: reopen: %s", what, err.msg);
        if (st) {
            check_survivor(st, sid, 40 + run, acked, what);
            ib_store_close(st);
        }
    }
}

/* Tables that are not a store, and stored rows that contradict each other. */
static void test_bad_tables(void) {
    ib_error err;
    ib_store *st = NULL;
    fresh();
    raw_sql("CREATE TABLE isobatch_sessions(x int)");
    CHECK(ib_store_open(URI, &st, &err) == IB_ERR_FORMAT && !st && strstr(err.msg, "not an isobatch"),
          "someone else's isobatch_sessions: %s", err.msg);
    fresh();
    CHECK(ib_store_open(URI, &st, &err) == IB_OK, "create: %s", err.msg);
    ib_store_close(st);
    st = NULL;
    raw_sql("UPDATE isobatch_meta SET value = '99' WHERE key = 'schema_version'");
    CHECK(ib_store_open(URI, &st, &err) == IB_ERR_UNSUPPORTED && strstr(err.msg, "version 99") && !strchr(err.msg, '\n'),
          "a newer schema: %s", err.msg);
    raw_sql("DELETE FROM isobatch_meta");
    CHECK(ib_store_open(URI, &st, &err) == IB_ERR_FORMAT, "no schema version: %s", err.msg);
    fresh();
    CHECK(ib_store_open(URI, &st, &err) == IB_OK, "create: %s", err.msg);
    if (!st) return;
    ib_store_session r = make_rec("c", "owner", 8);
    CHECK(ib_store_create(st, &r, &err) == IB_OK, "create: %s", err.msg);
    ib_store_session l;
    /* a history row past the session's count; then a count that the rows do not reach; then a range */
    raw_sql("INSERT INTO isobatch_history VALUES ('c', 8, '\\x01000000'::bytea, '\\x00'::bytea)");
    CHECK(ib_store_load(st, "c", &l, &err) == IB_ERR_FORMAT && strstr(err.msg, "does not continue"),
          "a row past the count: %s", err.msg);
    ib_store_session_free(&l);
    raw_sql("DELETE FROM isobatch_history WHERE first = 8");
    raw_sql("UPDATE isobatch_sessions SET n_tokens = 9 WHERE id = 'c'");
    CHECK(ib_store_load(st, "c", &l, &err) == IB_ERR_FORMAT && strstr(err.msg, "holds 8 tokens"),
          "rows short of the count: %s", err.msg);
    ib_store_session_free(&l);
    raw_sql("UPDATE isobatch_sessions SET n_tokens = 8, n_fed = 9 WHERE id = 'c'");
    CHECK(ib_store_load(st, "c", &l, &err) == IB_ERR_FORMAT && strstr(err.msg, "out of range"), "n_fed > n: %s", err.msg);
    ib_store_session_free(&l);
    raw_sql("UPDATE isobatch_sessions SET n_fed = 4, kv_dtype = 'q3' WHERE id = 'c'");
    CHECK(ib_store_load(st, "c", &l, &err) == IB_ERR_FORMAT, "an unknown KV type: %s", err.msg);
    ib_store_session_free(&l);
    raw_sql("UPDATE isobatch_sessions SET kv_dtype = 'f16' WHERE id = 'c'");
    CHECK(ib_store_load(st, "c", &l, &err) == IB_OK && l.n_tokens == 8, "repaired: %s", err.msg);
    ib_store_session_free(&l);
    ib_store_session_free(&r);
    ib_store_close(st);
}

/* The server ends the store's connections: one call may fail, the next reconnects. */
static void test_connection_loss(void) {
    ib_error err;
    ib_store *st = NULL;
    CHECK(ib_store_open(fresh(), &st, &err) == IB_OK, "open: %s", err.msg);
    if (!st) return;
    ib_store_session r = make_rec("cl", "owner", 4);
    CHECK(ib_store_create(st, &r, &err) == IB_OK, "create: %s", err.msg);
    raw_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'isobatch'");
    ib_store_session l;
    ib_status first = ib_store_load(st, "cl", &l, &err);
    ib_store_session_free(&l);
    CHECK(first == IB_OK || (first == IB_ERR_IO && strstr(err.msg, "lost") && !strchr(err.msg, '\n')),
          "the call that finds its connection gone: %s", err.msg);
    CHECK(ib_store_load(st, "cl", &l, &err) == IB_OK && l.n_tokens == 4, "the next call reconnects: %s", err.msg);
    ib_store_session_free(&l);
    int32_t t[1] = {7};
    uint8_t f[1] = {0};
    CHECK(ib_store_append(st, "cl", 4, t, f, 1, NULL, &err) == IB_OK, "append after the reconnect: %s", err.msg);
    ib_store_session_free(&r);
    ib_store_close(st);
}

/* `write` mode: append until a call fails, printing each acknowledged length. */
static int mode_write(const char *sid, int key) {
    int fd[2];
    if (pipe(fd)) return 2;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        conf_writer(URI, sid, key, fd[1], NULL); /* exits when a call fails */
    }
    close(fd[1]);
    int v;
    while (read(fd[0], &v, sizeof v) == sizeof v) {
        printf("%d\n", v);
        fflush(stdout);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: pg_store_check all|write|verify URI [SID KEY [ACKED]]\n");
        return 2;
    }
    URI = argv[2];
    if (!strcmp(argv[1], "write") && argc == 5) return mode_write(argv[3], atoi(argv[4]));
    if (!strcmp(argv[1], "verify") && argc == 6) {
        ib_error err;
        ib_store *st = NULL;
        CHECK(ib_store_open(URI, &st, &err) == IB_OK, "reopen after the server's restart: %s", err.msg);
        if (st) {
            check_survivor(st, argv[3], atoi(argv[4]), atoi(argv[5]), "server killed");
            ib_store_close(st);
        }
        TEST_MAIN_END("pg_store_check verify");
    }
    if (strcmp(argv[1], "all")) {
        fprintf(stderr, "pg_store_check: unknown mode or arguments\n");
        return 2;
    }
    conf_round_trip(fresh());
    conf_threads(fresh());
    test_two_servers();
    test_kill_writers();
    test_bad_tables();
    test_connection_loss();
    fresh();
    TEST_MAIN_END("pg_store_check");
}
