/*
 * test_store.c — the session store (src/store/) on SQLite, and the hashes it relies on.
 *
 *   - SHA-256 against FIPS 180-4's examples, fed whole and in odd pieces; the model identity of a
 *     synthetic model: equal for equal files (a copy elsewhere too), different when a weight, the
 *     config or the tokenizer config changes, an I/O error naming the file when config.json is gone.
 *   - Round trips: every field (NaN and extreme floats by their bits, a seed of 2^64-1), appends with
 *     and without progress, updates, list by owner (order, other owners apart), delete, reopen.
 *   - Refusals: a duplicate id, an append at the wrong position, unknown ids, bad ids/owners/flags.
 *   - Kill safety: child processes append and acknowledge each write through a pipe; SIGKILL lands at
 *     varied moments (mid-transaction included); after reopening, every acknowledged write is there,
 *     nothing half-written is, the progress written with an append is there with it, and SQLite's
 *     integrity check passes. Two processes writing one file at once, killed together, too. And a
 *     VFS shim kills the writer at its k-th write or fsync, for k over several transactions: deaths
 *     inside a commit, before and after its fsync, lose nothing acknowledged and leave nothing half.
 *   - Bad files: garbage, a truncated database, an SQLite database of something else, a newer schema
 *     version, history rows that contradict the session row: each a one-line status, never a crash.
 *   - A full disk (the process's file-size limit): the write fails with IB_ERR_IO and a message, the
 *     store stays usable, and every write acknowledged before it is there after reopening.
 *   - Several threads on one store (their appends grouped into shared commits), a stale append
 *     among them refused alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/sha256.h"
#include "model/mkmodel.h"
#include "store/store.h"
#include "store_conformance.h"

static char tmp[] = "/tmp/ib_store_XXXXXX";

/* path of name inside the temporary directory (a static buffer per call slot) */
static const char *tpath(const char *name) {
    static char buf[8][512];
    static int k;
    char *b = buf[k++ & 7];
    snprintf(b, 512, "%s/%s", tmp, name);
    return b;
}

static const char *turi(const char *name) {
    static char buf[4][600];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 600, "sqlite:%s/%s", tmp, name);
    return b;
}

static void rm_db(const char *name) {
    char p[600];
    snprintf(p, sizeof p, "%s", tpath(name));
    unlink(p);
    snprintf(p, sizeof p, "%s-wal", tpath(name));
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", tpath(name));
    unlink(p);
}

static void test_sha256(void) {
    static const struct { const char *msg, *hex; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    uint8_t d[32];
    char hex[65];
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        ib_sha256_bytes(v[i].msg, strlen(v[i].msg), d);
        ib_sha256_hex(d, hex);
        CHECK(!strcmp(hex, v[i].hex), "sha256(\"%s\") = %s, expected %s", v[i].msg, hex, v[i].hex);
    }
    /* one million 'a', fed in pieces of 1, 63, 64, 65, 1000 bytes ... */
    static char a[1000];
    memset(a, 'a', sizeof a);
    static const size_t piece[] = {1, 63, 64, 65, 1000, 7};
    ib_sha256 c;
    ib_sha256_init(&c);
    size_t left = 1000000;
    for (int k = 0; left; k++) {
        size_t n = piece[k % 6] < left ? piece[k % 6] : left;
        ib_sha256_update(&c, a, n);
        left -= n;
    }
    ib_sha256_final(&c, d);
    ib_sha256_hex(d, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "sha256(a*1e6) = %s", hex);
    char o1[65], o2[65], o3[65];
    ib_store_owner_hash("key-1", o1);
    ib_store_owner_hash("key-2", o2);
    ib_store_owner_hash(NULL, o3);
    CHECK(strcmp(o1, o2) != 0 && !strcmp(o3, v[0].hex), "owner hashes %s %s %s", o1, o2, o3);
}

/* Copy file a to b. */
static int copy_file(const char *a, const char *b) {
    FILE *f = fopen(a, "rb"), *g = fopen(b, "wb");
    if (!f || !g) {
        if (f) fclose(f);
        if (g) fclose(g);
        return -1;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, g);
    fclose(f);
    return fclose(g);
}

static void test_model_identity(void) {
    ib_error err;
    char d1[600], d2[600], d3[600];
    snprintf(d1, sizeof d1, "%s", tpath("m1"));
    snprintf(d2, sizeof d2, "%s", tpath("m2"));
    snprintf(d3, sizeof d3, "%s", tpath("m3"));
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 5, .bits = 4};
    CHECK(ib_mkmodel(d1, &mo, &err) == IB_OK, "mkmodel: %s", err.msg);
    mo.seed = 6;
    CHECK(ib_mkmodel(d3, &mo, &err) == IB_OK, "mkmodel: %s", err.msg);
    /* a copy elsewhere */
    mkdir(d2, 0755);
    static const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    char a[700], b[700];
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "%s/%s", d1, files[i]);
        snprintf(b, sizeof b, "%s/%s", d2, files[i]);
        CHECK(copy_file(a, b) == 0, "copy %s", a);
    }
    char id1[IB_MODEL_ID_LEN], id2[IB_MODEL_ID_LEN], id3[IB_MODEL_ID_LEN], id4[IB_MODEL_ID_LEN];
    CHECK(ib_model_identity(d1, id1, &err) == IB_OK, "identity: %s", err.msg);
    CHECK(ib_model_identity(d2, id2, &err) == IB_OK, "identity: %s", err.msg);
    CHECK(ib_model_identity(d3, id3, &err) == IB_OK, "identity: %s", err.msg);
    CHECK(!strncmp(id1, "sha256:", 7) && strlen(id1) == 71, "identity form: %s", id1);
    CHECK(!strcmp(id1, id2), "a copy has another identity: %s vs %s", id1, id2);
    CHECK(strcmp(id1, id3) != 0, "other weights, same identity %s", id1);
    /* a tokenizer_config.json change changes it */
    snprintf(b, sizeof b, "%s/tokenizer_config.json", d2);
    FILE *f = fopen(b, "ab");
    if (f) fputs(" ", f), fclose(f);
    CHECK(ib_model_identity(d2, id4, &err) == IB_OK && strcmp(id4, id1) != 0, "tokenizer config not in the identity");
    /* one flipped byte of the weights */
    snprintf(b, sizeof b, "%s/model.safetensors", d2);
    snprintf(a, sizeof a, "%s/tokenizer_config.json", d1);
    char c2[700];
    snprintf(c2, sizeof c2, "%s/tokenizer_config.json", d2);
    CHECK(copy_file(a, c2) == 0, "restore tokenizer_config");
    int fd = open(b, O_RDWR);
    struct stat sb;
    fstat(fd, &sb);
    unsigned char byte;
    off_t at = sb.st_size - 100;
    if (pread(fd, &byte, 1, at) == 1) {
        byte ^= 1;
        if (pwrite(fd, &byte, 1, at) != 1) CHECK(0, "pwrite");
    }
    close(fd);
    CHECK(ib_model_identity(d2, id4, &err) == IB_OK && strcmp(id4, id1) != 0, "a weight byte not in the identity");
    /* config.json gone: an I/O error naming it */
    snprintf(b, sizeof b, "%s/config.json", d2);
    unlink(b);
    ib_status rc = ib_model_identity(d2, id4, &err);
    CHECK(rc == IB_ERR_IO && strstr(err.msg, "config.json"), "missing config.json: %d %s", rc, err.msg);
    /* a model on disk and the record it is named in */
    ib_model *m = NULL;
    CHECK(ib_model_load(d1, NULL, &m, &err) == IB_OK, "load: %s", err.msg);
    ib_model_free(m);
}

/* ---------------------------------------------------------------- round trips */

static void test_round_trip(void) {
    rm_db("rt.db");
    conf_round_trip(turi("rt.db"));
}

/* The URI forms ib_store_open refuses. */
static void test_uri_forms(void) {
    ib_error err;
    ib_store *st = NULL;
    /* the URI forms */
    CHECK(ib_store_open("redis://x", &st, &err) == IB_ERR_UNSUPPORTED && !st, "unknown kind: %s", err.msg);
    /* a PostgreSQL URI whose server cannot be reached: a one-line I/O error, its password not shown */
    CHECK(ib_store_open("postgresql://u:sekrit@127.0.0.1:1/x", &st, &err) == IB_ERR_IO && !st &&
              !strstr(err.msg, "sekrit") && strstr(err.msg, "u:***@") && !strchr(err.msg, '\n'),
          "postgres unreachable: %s", err.msg);
    CHECK(ib_store_open("sqlite:", &st, &err) == IB_ERR_INVALID_ARG, "no path: %s", err.msg);
    CHECK(ib_store_open("sqlite:/nonexistent-dir-ib/x.db", &st, &err) == IB_ERR_IO && strstr(err.msg, "nonexistent"),
          "unopenable: %s", err.msg);
}

/* ---------------------------------------------------------------- kill safety */

/* A VFS shim for the kill test: the default VFS with its files' xWrite and xSync counted, and the
 * process SIGKILLed at the kill_at-th of them once armed — a death inside a commit, between any two
 * of its writes, before or after its fsync. The shim hands SQLite the real file object with a copy of
 * its method table in which only those two entries differ. */
static sqlite3_vfs *real_vfs;
static sqlite3_vfs shim_vfs;
static int shim_armed, shim_kill_at, shim_events;
static const sqlite3_io_methods *real_methods[4];
static sqlite3_io_methods shim_methods[4];
static int n_methods;

static int shim_index(const sqlite3_file *f) {
    for (int i = 0; i < n_methods; i++)
        if (&shim_methods[i] == f->pMethods) return i;
    return -1;
}

static void shim_event(void) {
    if (shim_armed && ++shim_events == shim_kill_at) kill(getpid(), SIGKILL);
}

static int shim_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off) {
    shim_event();
    return real_methods[shim_index(f)]->xWrite(f, p, n, off);
}

static int shim_sync(sqlite3_file *f, int flags) {
    shim_event();
    return real_methods[shim_index(f)]->xSync(f, flags);
}

static int shim_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out) {
    int rc = real_vfs->xOpen(real_vfs, name, f, flags, out);
    if (rc != SQLITE_OK || !f->pMethods) return rc;
    int i = 0;
    while (i < n_methods && real_methods[i] != f->pMethods) i++;
    if (i == n_methods) {
        if (n_methods == 4) return rc; /* (never: the unix VFS has one or two tables) */
        real_methods[i] = f->pMethods;
        shim_methods[i] = *f->pMethods;
        shim_methods[i].xWrite = shim_write;
        shim_methods[i].xSync = shim_sync;
        n_methods++;
    }
    f->pMethods = &shim_methods[i];
    return rc;
}

/* Make the shim the default VFS of this (child) process. */
static void shim_install(int kill_at) {
    real_vfs = sqlite3_vfs_find(NULL);
    shim_vfs = *real_vfs;
    shim_vfs.zName = "ib-kill-shim";
    shim_vfs.xOpen = shim_open;
    shim_kill_at = kill_at;
    sqlite3_vfs_register(&shim_vfs, 1);
}

/* Child: append chunks to session sid (created first), writing the acknowledged count (an int) to fd
 * after each write returns. Never returns. */
static void arm_shim(void) { shim_armed = 1; }

/* The conformance writer on file name (the VFS shim armed once its session exists). */
static void writer_child(const char *name, const char *sid, int key, int fd) { conf_writer(turi(name), sid, key, fd, arm_shim); }

/* SQLite's own consistency check of the database file: "ok" or the first problem. */
static void integrity(const char *name, char *out, size_t cap) {
    sqlite3 *db = NULL;
    snprintf(out, cap, "cannot open");
    if (sqlite3_open_v2(tpath(name), &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        sqlite3_stmt *q = NULL;
        if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
            snprintf(out, cap, "%s", (const char *)sqlite3_column_text(q, 0));
        sqlite3_finalize(q);
    }
    sqlite3_close(db);
}

static void test_kill(void) {
    static const int targets[] = {0, 1, 3, 8, 20, 45};
    for (int run = 0; run < 6; run++) {
        rm_db("kill.db");
        int pfd[2];
        if (pipe(pfd)) return;
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            writer_child("kill.db", "k", run, pfd[1]);
        }
        close(pfd[1]);
        int v = -1, got = -1;
        while (got < 0 || got < targets[run]) {
            if (read(pfd[0], &v, sizeof v) != sizeof v) break;
            /* acks count writes, not tokens: stop after targets[run] writes */
            got = got < 0 ? 0 : got + 1;
        }
        /* land the kill at varied moments of the next write */
        struct timespec ts = {0, (long)(run * 377 % 1500) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        int acked = drain_acks(pfd[0]);
        close(pfd[0]);
        if (acked < 0) acked = v; /* nothing more came after the target */
        char what[64];
        snprintf(what, sizeof what, "kill run %d", run);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "%s: child ended otherwise (status %d)", what, status);
        char ic[128];
        integrity("kill.db", ic, sizeof ic);
        CHECK(!strcmp(ic, "ok"), "%s: integrity_check: %s", what, ic);
        ib_error err;
        ib_store *st = NULL;
        CHECK(ib_store_open(turi("kill.db"), &st, &err) == IB_OK, "%s: reopen: %s", what, err.msg);
        if (st) {
            check_survivor(st, "k", run, acked, what);
            ib_store_close(st);
        }
    }
    /* two processes writing one file, killed together */
    rm_db("kill2.db");
    {
        ib_error err;
        ib_store *st = NULL;
        CHECK(ib_store_open(turi("kill2.db"), &st, &err) == IB_OK, "create kill2: %s", err.msg);
        ib_store_close(st);
    }
    int pf[2][2];
    pid_t pids[2];
    for (int c = 0; c < 2; c++) {
        if (pipe(pf[c])) return;
        pids[c] = fork();
        if (pids[c] == 0) {
            close(pf[c][0]);
            writer_child("kill2.db", c ? "two" : "one", 10 + c, pf[c][1]);
        }
        close(pf[c][1]);
    }
    int last[2] = {-1, -1}, v;
    for (int k = 0; k < 15; k++)
        for (int c = 0; c < 2; c++)
            if (read(pf[c][0], &v, sizeof v) == sizeof v) last[c] = v;
    kill(pids[0], SIGKILL);
    kill(pids[1], SIGKILL);
    for (int c = 0; c < 2; c++) {
        int status;
        waitpid(pids[c], &status, 0);
        int more = drain_acks(pf[c][0]);
        if (more >= 0) last[c] = more;
        close(pf[c][0]);
    }
    char ic[128];
    integrity("kill2.db", ic, sizeof ic);
    CHECK(!strcmp(ic, "ok"), "two writers: integrity_check: %s", ic);
    ib_error err;
    ib_store *st = NULL;
    CHECK(ib_store_open(turi("kill2.db"), &st, &err) == IB_OK, "two writers: reopen: %s", err.msg);
    if (st) {
        CHECK(last[0] > 0 && last[1] > 0, "both writers acknowledged writes (%d, %d)", last[0], last[1]);
        check_survivor(st, "one", 10, last[0], "two writers, first");
        check_survivor(st, "two", 11, last[1], "two writers, second");
        ib_store_close(st);
    }
}

/* Deaths inside commits: the child is SIGKILLed at its k-th write or fsync after arming, for k
 * spread over the first several transactions (each append is a few writes and fsyncs). */
static void test_kill_in_commit(void) {
    static const int at[] = {1, 2, 3, 4, 5, 6, 7, 9, 12, 16, 23, 31, 42, 57};
    for (size_t run = 0; run < sizeof at / sizeof *at; run++) {
        rm_db("kc.db");
        int pfd[2];
        if (pipe(pfd)) return;
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            shim_install(at[run]);
            writer_child("kc.db", "k", 30, pfd[1]);
        }
        close(pfd[1]);
        int status = 0;
        waitpid(pid, &status, 0);
        int acked = drain_acks(pfd[0]);
        close(pfd[0]);
        char what[64];
        snprintf(what, sizeof what, "killed at I/O event %d", at[run]);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && acked >= 0, "%s: child status %d, acked %d", what,
              status, acked);
        char ic[128];
        integrity("kc.db", ic, sizeof ic);
        CHECK(!strcmp(ic, "ok"), "%s: integrity_check: %s", what, ic);
        ib_error err;
        ib_store *st = NULL;
        CHECK(ib_store_open(turi("kc.db"), &st, &err) == IB_OK, "%s: reopen: %s", what, err.msg);
        if (st) {
            check_survivor(st, "k", 30, acked, what);
            ib_store_close(st);
        }
    }
}

/* ---------------------------------------------------------------- bad files */

/* Run SQL on a test database directly. */
static int raw_sql(const char *name, const char *sql) {
    sqlite3 *db = NULL;
    int rc = sqlite3_open(tpath(name), &db);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc;
}

/* Open name and try everything that reads; return the first failure's status (IB_OK if none). */
static ib_status read_all(const char *name, ib_error *err) {
    ib_store *st = NULL;
    ib_status rc = ib_store_open(turi(name), &st, err);
    if (rc) return rc;
    char owner[65];
    ib_store_owner_hash("alice", owner);
    char **ids = NULL;
    int n = 0;
    rc = ib_store_list_owner(st, owner, &ids, &n, err);
    for (int i = 0; !rc && i < 3; i++) {
        ib_store_session l;
        char id[16];
        snprintf(id, sizeof id, "f%d", i);
        rc = ib_store_load(st, id, &l, err);
        ib_store_session_free(&l);
    }
    ib_store_ids_free(ids, n);
    ib_store_close(st);
    return rc;
}

static void test_bad_files(void) {
    ib_error err;
    /* garbage */
    FILE *f = fopen(tpath("garbage.db"), "wb");
    for (int i = 0; i < 8192; i++) fputc((i * 131 + 7) & 255, f);
    fclose(f);
    ib_store *st = NULL;
    ib_status rc = ib_store_open(turi("garbage.db"), &st, &err);
    CHECK(rc == IB_ERR_FORMAT && !st && strstr(err.msg, "garbage.db") && !strchr(err.msg, '\n'), "garbage: %d %s", rc,
          err.msg);
    /* a real store, then truncated at several lengths */
    rm_db("full.db");
    CHECK(ib_store_open(turi("full.db"), &st, &err) == IB_OK, "open: %s", err.msg);
    for (int i = 0; st && i < 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "f%d", i);
        ib_store_session r = make_rec(id, "alice", 6000);
        CHECK(ib_store_create(st, &r, &err) == IB_OK, "create: %s", err.msg);
        ib_store_session_free(&r);
    }
    ib_store_close(st); /* the last close folds the log into the file */
    CHECK(read_all("full.db", &err) == IB_OK, "intact store: %s", err.msg);
    struct stat sb;
    stat(tpath("full.db"), &sb);
    static const long cuts[] = {50, 4096, 6000, 12288, -1};
    for (int k = 0; cuts[k] >= 0; k++) {
        rm_db("cut.db");
        copy_file(tpath("full.db"), tpath("cut.db"));
        long at = cuts[k] < sb.st_size ? cuts[k] : sb.st_size / 2;
        if (truncate(tpath("cut.db"), at)) CHECK(0, "truncate");
        err.msg[0] = 0;
        rc = read_all("cut.db", &err);
        CHECK(rc == IB_ERR_FORMAT && strstr(err.msg, "cut.db") && !strchr(err.msg, '\n'),
              "truncated at %ld of %lld: %d %s", at, (long long)sb.st_size, rc, err.msg);
    }
    /* an SQLite database of something else */
    rm_db("other.db");
    raw_sql("other.db", "CREATE TABLE t(x); INSERT INTO t VALUES(1);");
    rc = ib_store_open(turi("other.db"), &st, &err);
    CHECK(rc == IB_ERR_FORMAT && strstr(err.msg, "not an isobatch session store"), "foreign db: %d %s", rc, err.msg);
    /* a newer schema version */
    rm_db("ver.db");
    copy_file(tpath("full.db"), tpath("ver.db"));
    raw_sql("ver.db", "PRAGMA user_version=99;");
    rc = ib_store_open(turi("ver.db"), &st, &err);
    CHECK(rc == IB_ERR_UNSUPPORTED && strstr(err.msg, "schema version 99"), "schema 99: %d %s", rc, err.msg);
    /* rows that contradict each other */
    rm_db("rows.db");
    copy_file(tpath("full.db"), tpath("rows.db"));
    raw_sql("rows.db", "UPDATE sessions SET n_tokens = 6001 WHERE id = 'f0';"
                       "UPDATE sessions SET n_fed = 7000 WHERE id = 'f1';"
                       "UPDATE history SET flags = x'00' WHERE session_id = 'f2';");
    CHECK(ib_store_open(turi("rows.db"), &st, &err) == IB_OK, "open rows.db: %s", err.msg);
    if (st) {
        ib_store_session l;
        rc = ib_store_load(st, "f0", &l, &err);
        CHECK(rc == IB_ERR_FORMAT && strstr(err.msg, "6001"), "count past history: %d %s", rc, err.msg);
        ib_store_session_free(&l);
        rc = ib_store_load(st, "f1", &l, &err);
        CHECK(rc == IB_ERR_FORMAT && strstr(err.msg, "out of range"), "n_fed past count: %d %s", rc, err.msg);
        ib_store_session_free(&l);
        rc = ib_store_load(st, "f2", &l, &err);
        CHECK(rc == IB_ERR_FORMAT && strstr(err.msg, "does not continue"), "short flags: %d %s", rc, err.msg);
        ib_store_session_free(&l);
        ib_store_close(st);
    }
}

/* ---------------------------------------------------------------- disk full */

static void test_disk_full(void) {
    rm_db("fullfs.db");
    int pfd[2];
    if (pipe(pfd)) return;
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        ib_error err;
        ib_store *st = NULL;
        if (ib_store_open(turi("fullfs.db"), &st, &err)) _exit(2);
        ib_store_session r = make_rec("big", "alice", 0);
        r.progress.n_fed = 0;
        if (ib_store_create(st, &r, &err)) _exit(3);
        /* files may grow 256 KiB from here; writing past that fails with EFBIG */
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {256 << 10, 256 << 10};
        rl.rlim_cur = rl.rlim_max = (rlim_t)(256 << 10) + 65536;
        if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(4);
        static int32_t t[4096];
        static uint8_t fl[4096];
        int have = 0;
        ib_status rc = IB_OK;
        for (int i = 0; i < 200 && !rc; i++) {
            for (int k = 0; k < 4096; k++) t[k] = tok_at(3, have + k), fl[k] = flag_at(have + k);
            rc = ib_store_append(st, "big", have, t, fl, 4096, NULL, &err);
            if (!rc) have += 4096;
        }
        /* report: acknowledged count, the failure's code and message; then the store still reads */
        ib_store_session l;
        ib_error e2;
        ib_status lr = ib_store_load(st, "big", &l, &e2);
        int rep[4] = {have, (int)rc, (int)lr, lr ? -1 : l.n_tokens};
        ib_store_session_free(&l);
        if (write(pfd[1], rep, sizeof rep) != sizeof rep) _exit(5);
        if (write(pfd[1], err.msg, sizeof err.msg) != sizeof err.msg) _exit(6);
        ib_store_close(st);
        _exit(0);
    }
    close(pfd[1]);
    int rep[4] = {0};
    char msg[512] = "";
    int ok = read(pfd[0], rep, sizeof rep) == sizeof rep && read(pfd[0], msg, sizeof msg) == sizeof msg;
    close(pfd[0]);
    int status;
    waitpid(pid, &status, 0);
    msg[511] = 0;
    CHECK(ok && WIFEXITED(status) && WEXITSTATUS(status) == 0, "disk-full child: status %d", status);
    CHECK(rep[0] > 0, "nothing written before the limit (%d)", rep[0]);
    CHECK(rep[1] == IB_ERR_IO && strstr(msg, "out of space") && strstr(msg, "commit") && !strchr(msg, '\n'), "disk full: %d %s", rep[1], msg);
    CHECK(rep[2] == IB_OK && rep[3] == rep[0], "after the failure the store reads %d tokens (status %d), %d acknowledged",
          rep[3], rep[2], rep[0]);
    ib_error err;
    ib_store *st = NULL;
    CHECK(ib_store_open(turi("fullfs.db"), &st, &err) == IB_OK, "reopen after disk full: %s", err.msg);
    if (st) {
        ib_store_session l;
        CHECK(ib_store_load(st, "big", &l, &err) == IB_OK && l.n_tokens == rep[0], "after reopen %d tokens, %d acked",
              l.n_tokens, rep[0]);
        int same = 1;
        for (int i = 0; i < l.n_tokens && same; i++) same = l.tokens[i] == tok_at(3, i);
        CHECK(same, "history after disk full");
        ib_store_session_free(&l);
        ib_store_close(st);
    }
    char ic[128];
    integrity("fullfs.db", ic, sizeof ic);
    CHECK(!strcmp(ic, "ok"), "disk full: integrity_check: %s", ic);
}

/* ---------------------------------------------------------------- threads */

static void test_threads(void) {
    rm_db("thr.db");
    conf_threads(turi("thr.db"));
}

int main(void) {
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_sha256();
    test_model_identity();
    test_round_trip();
    test_uri_forms();
    test_kill();
    test_kill_in_commit();
    test_bad_files();
    test_disk_full();
    test_threads();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp);
    TEST_MAIN_END("test_store");
}
