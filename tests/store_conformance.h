/*
 * store_conformance.h — the session-store checks every back end must pass, shared by
 * tests/test_store.c (SQLite) and tests/pg_store_check.c (PostgreSQL). Each takes the URI of an empty
 * store; the including file defines the harness (check.h) first.
 *
 *   conf_round_trip  every field (NaN and extreme floats by their bits, a seed of 2^64-1), appends with
 *                    and without progress, updates, list by owner, refusals (duplicate id, stale or
 *                    unknown appends, bad ids/owners/flags), delete, reopen.
 *   conf_writer      a child process's writer for kill tests: appends a known sequence, acknowledging
 *                    each write's new length through a pipe; check_survivor checks what was kept.
 *   conf_threads     several threads appending to one store, a stale append among them refused alone.
 */
#ifndef IB_TESTS_STORE_CONFORMANCE_H
#define IB_TESTS_STORE_CONFORMANCE_H
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

/* The deterministic token at position i of a test session with key k. */
static int32_t tok_at(int k, int i) { return (int32_t)((uint32_t)(i * 2654435761u + (uint32_t)k * 40503u) % 151936u); }
static uint8_t flag_at(int i) { return (uint8_t)(i % 4); }

/* A record with every field set to something unusual. */
static ib_store_session make_rec(const char *id, const char *owner_key, int n) {
    ib_store_session r;
    memset(&r, 0, sizeof r);
    snprintf(r.id, sizeof r.id, "%s", id);
    ib_store_owner_hash(owner_key, r.owner);
    snprintf(r.model_id, sizeof r.model_id, "sha256:%064d", 7);
    r.max_context = 2048;
    r.kv_sink = 4;
    r.kv_window = 1024;
    r.kv_chunk = 16;
    r.kv_dtype = IB_KV_F16;
    r.progress.sampling = ib_sampling_default();
    r.progress.sampling.temperature = 0.7f;
    r.progress.sampling.top_k = 40;
    r.progress.sampling.top_p = nanf("");
    r.progress.sampling.min_p = 1e-38f;
    r.progress.sampling.repeat_penalty = -0.0f;
    r.progress.sampling.repeat_last_n = 64;
    r.progress.sampling.seed = UINT64_MAX;
    r.progress.draws = (1ULL << 62) + 3;
    r.progress.n_fed = n / 2;
    r.n_tokens = n;
    r.tokens = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    r.flags = malloc((size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) r.tokens[i] = tok_at(1, i), r.flags[i] = flag_at(i);
    return r;
}

static int bits_eq(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static int same_sampling(const ib_sampling *a, const ib_sampling *b) {
    return bits_eq(a->temperature, b->temperature) && a->top_k == b->top_k && bits_eq(a->top_p, b->top_p) &&
           bits_eq(a->min_p, b->min_p) && bits_eq(a->repeat_penalty, b->repeat_penalty) &&
           a->repeat_last_n == b->repeat_last_n && a->seed == b->seed;
}

/* ---------------------------------------------------------------- hashes */

static void conf_round_trip(const char *uri) {
    ib_error err;
    ib_store *st = NULL;
    CHECK(ib_store_open(uri, &st, &err) == IB_OK, "open: %s", err.msg);
    if (!st) return;
    ib_store_session r = make_rec("s-1", "alice", 1000);
    CHECK(ib_store_create(st, &r, &err) == IB_OK, "create: %s", err.msg);
    ib_store_session l;
    CHECK(ib_store_load(st, "s-1", &l, &err) == IB_OK, "load: %s", err.msg);
    CHECK(!strcmp(l.id, r.id) && !strcmp(l.owner, r.owner) && !strcmp(l.model_id, r.model_id), "names");
    CHECK(l.max_context == 2048 && l.kv_sink == 4 && l.kv_window == 1024 && l.kv_chunk == 16 && l.kv_dtype == IB_KV_F16,
          "policy %d %d %d %d %d", l.max_context, l.kv_sink, l.kv_window, l.kv_chunk, (int)l.kv_dtype);
    CHECK(same_sampling(&l.progress.sampling, &r.progress.sampling), "sampling settings changed bits");
    CHECK(l.progress.draws == r.progress.draws && l.progress.n_fed == 500, "draws %llu n_fed %d",
          (unsigned long long)l.progress.draws, l.progress.n_fed);
    CHECK(l.n_tokens == 1000 && !memcmp(l.tokens, r.tokens, 4000) && !memcmp(l.flags, r.flags, 1000), "history");
    CHECK(l.created > 0 && l.updated >= l.created, "times %lld %lld", (long long)l.created, (long long)l.updated);
    ib_store_session_free(&l);

    /* appends: with progress, without */
    int32_t t[300];
    uint8_t fl[300];
    for (int i = 0; i < 300; i++) t[i] = tok_at(1, 1000 + i), fl[i] = flag_at(1000 + i);
    ib_store_progress p = r.progress;
    p.draws = 17;
    p.n_fed = 1100;
    p.sampling.seed = 42;
    CHECK(ib_store_append(st, "s-1", 1000, t, fl, 100, &p, &err) == IB_OK, "append: %s", err.msg);
    CHECK(ib_store_append(st, "s-1", 1100, t + 100, fl + 100, 200, NULL, &err) == IB_OK, "append: %s", err.msg);
    CHECK(ib_store_append(st, "s-1", 1100, t, fl, 1, NULL, &err) == IB_ERR_STATE && strstr(err.msg, "holds 1300"),
          "append at a stale position: %s", err.msg);
    CHECK(ib_store_append(st, "nope", 0, t, fl, 1, NULL, &err) == IB_ERR_NOT_FOUND, "append to nothing: %s", err.msg);
    CHECK(ib_store_load(st, "s-1", &l, &err) == IB_OK, "load: %s", err.msg);
    int ok = l.n_tokens == 1300;
    for (int i = 0; ok && i < 1300; i++) ok = l.tokens[i] == tok_at(1, i) && l.flags[i] == flag_at(i);
    CHECK(ok, "history after appends (%d tokens)", l.n_tokens);
    CHECK(l.progress.draws == 17 && l.progress.n_fed == 1100 && l.progress.sampling.seed == 42, "progress with append");
    ib_store_session_free(&l);
    /* update */
    p.n_fed = 1300;
    p.draws = 99;
    CHECK(ib_store_update(st, "s-1", &p, &err) == IB_OK, "update: %s", err.msg);
    p.n_fed = 1301;
    CHECK(ib_store_update(st, "s-1", &p, &err) == IB_ERR_INVALID_ARG, "n_fed past the history: %s", err.msg);
    CHECK(ib_store_update(st, "nope", &p, &err) == IB_ERR_NOT_FOUND, "update of nothing");

    /* more sessions, list by owner */
    ib_store_session r2 = make_rec("s-2", "bob", 0), r3 = make_rec("s-3", "alice", 3);
    r2.progress.n_fed = 0;
    r3.progress.n_fed = 3;
    CHECK(ib_store_create(st, &r2, &err) == IB_OK, "create empty: %s", err.msg);
    CHECK(ib_store_create(st, &r3, &err) == IB_OK, "create: %s", err.msg);
    CHECK(ib_store_create(st, &r3, &err) == IB_ERR_STATE && strstr(err.msg, "exists"), "duplicate: %s", err.msg);
    char **ids = NULL;
    int n = 0;
    CHECK(ib_store_list_owner(st, r.owner, &ids, &n, &err) == IB_OK && n == 2 && !strcmp(ids[0], "s-1") &&
              !strcmp(ids[1], "s-3"),
          "alice's list: %d", n);
    ib_store_ids_free(ids, n);
    char nobody[65];
    ib_store_owner_hash("nobody", nobody);
    CHECK(ib_store_list_owner(st, nobody, &ids, &n, &err) == IB_OK && n == 0 && !ids, "nobody's list: %d", n);
    CHECK(ib_store_list_owner(st, "alice", &ids, &n, &err) == IB_ERR_INVALID_ARG, "a raw key as owner");

    /* refusals of bad arguments */
    ib_store_session bad = make_rec("bad id!", "x", 1);
    CHECK(ib_store_create(st, &bad, &err) == IB_ERR_INVALID_ARG, "bad id: %s", err.msg);
    snprintf(bad.id, sizeof bad.id, "ok");
    bad.flags[0] = 8;
    CHECK(ib_store_create(st, &bad, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "flags"), "bad flags: %s", err.msg);
    bad.flags[0] = 0;
    bad.progress.n_fed = 2;
    CHECK(ib_store_create(st, &bad, &err) == IB_ERR_INVALID_ARG, "n_fed > n: %s", err.msg);
    ib_store_session_free(&bad);
    CHECK(ib_store_load(st, "", &l, &err) == IB_ERR_INVALID_ARG, "empty id");
    char longid[100];
    memset(longid, 'a', 99);
    longid[99] = 0;
    CHECK(ib_store_load(st, longid, &l, &err) == IB_ERR_INVALID_ARG, "long id");

    /* delete, then reopen: what was acknowledged is there */
    CHECK(ib_store_delete(st, "s-3", &err) == IB_OK, "delete: %s", err.msg);
    CHECK(ib_store_delete(st, "s-3", &err) == IB_ERR_NOT_FOUND, "delete twice: %s", err.msg);
    CHECK(ib_store_load(st, "s-3", &l, &err) == IB_ERR_NOT_FOUND && strstr(err.msg, "s-3"), "deleted: %s", err.msg);
    ib_store_session_free(&l);
    /* the deleted session's tokens went with it: the same id created again, empty, loads empty */
    ib_store_session r3b = make_rec("s-3", "alice", 0);
    CHECK(ib_store_create(st, &r3b, &err) == IB_OK, "create again after delete: %s", err.msg);
    CHECK(ib_store_load(st, "s-3", &l, &err) == IB_OK && l.n_tokens == 0, "re-created session holds %d old tokens (%s)",
          l.n_tokens, err.msg);
    ib_store_session_free(&l);
    ib_store_session_free(&r3b);
    CHECK(ib_store_delete(st, "s-3", &err) == IB_OK, "delete again: %s", err.msg);
    ib_store_close(st);
    st = NULL;
    CHECK(ib_store_open(uri, &st, &err) == IB_OK, "reopen: %s", err.msg);
    if (st) {
        CHECK(ib_store_load(st, "s-1", &l, &err) == IB_OK && l.n_tokens == 1300 && l.progress.n_fed == 1300 &&
                  l.progress.draws == 99,
              "after reopen: %d", l.n_tokens);
        ib_store_session_free(&l);
        CHECK(ib_store_load(st, "s-2", &l, &err) == IB_OK && l.n_tokens == 0, "empty session after reopen");
        ib_store_session_free(&l);
        CHECK(ib_store_load(st, "s-3", &l, &err) == IB_ERR_NOT_FOUND, "deleted after reopen");
        ib_store_close(st);
    }
    ib_store_session_free(&r);
    ib_store_session_free(&r2);
    ib_store_session_free(&r3);
}

static void conf_writer(const char *uri, const char *sid, int key, int fd, void (*armed)(void)) {
    ib_error err;
    ib_store *st = NULL;
    if (ib_store_open(uri, &st, &err)) {
        fprintf(stderr, "writer %s: %s\n", sid, err.msg);
        _exit(2);
    }
    ib_store_session r = make_rec(sid, "killer", 0);
    r.progress.n_fed = 0;
    r.progress.draws = 0;
    if (ib_store_create(st, &r, &err)) {
        fprintf(stderr, "writer %s: %s\n", sid, err.msg);
        _exit(3);
    }
    int have = 0;
    if (write(fd, &have, sizeof have) != sizeof have) _exit(4);
    if (armed) armed();
    int32_t t[64];
    uint8_t f[64];
    for (int i = 0;; i++) {
        int n = 1 + (i * 7) % 40;
        for (int k = 0; k < n; k++) t[k] = tok_at(key, have + k), f[k] = flag_at(have + k);
        ib_store_progress p = r.progress;
        p.draws = (uint64_t)(have + n); /* written with the tokens: must never be seen apart from them */
        p.n_fed = have + n;
        if (ib_store_append(st, sid, have, t, f, n, &p, &err)) {
            fprintf(stderr, "writer %s: %s\n", sid, err.msg);
            _exit(5);
        }
        have += n;
        if (write(fd, &have, sizeof have) != sizeof have) _exit(6);
        /* a pause between writes, as a server's sessions have (SQLite's locks are polled, so a writer
         * that never pauses would starve another process's writer) */
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

/* Check session sid holds a valid prefix of conf_writer's sequence with at least `acked` tokens and
 * at most acked + 40 (one write in flight), its progress equal to its length. */
static void check_survivor(ib_store *st, const char *sid, int key, int acked, const char *what) {
    ib_error err;
    ib_store_session l;
    ib_status rc = ib_store_load(st, sid, &l, &err);
    CHECK(rc == IB_OK, "%s: load: %s", what, err.msg);
    if (rc == IB_OK) {
        int ok = l.n_tokens >= acked && l.n_tokens <= acked + 40;
        CHECK(ok, "%s: %d tokens stored, %d acknowledged", what, l.n_tokens, acked);
        int same = 1;
        for (int i = 0; i < l.n_tokens && same; i++) same = l.tokens[i] == tok_at(key, i) && l.flags[i] == flag_at(i);
        CHECK(same, "%s: stored history differs from what was written", what);
        CHECK(l.progress.draws == (uint64_t)l.n_tokens && l.progress.n_fed == l.n_tokens,
              "%s: progress %llu/%d apart from its %d tokens", what, (unsigned long long)l.progress.draws,
              l.progress.n_fed, l.n_tokens);
    }
    ib_store_session_free(&l);
}

/* Read every int the child wrote to fd until EOF; the last is its acknowledged count (-1: none). */
static int drain_acks(int fd) {
    int v, last = -1;
    while (read(fd, &v, sizeof v) == sizeof v) last = v;
    return last;
}

typedef struct targ {
    ib_store *st;
    int k;
    ib_status rc;
} targ;

static void *thread_writer(void *p) {
    targ *a = p;
    ib_error err;
    char id[16];
    snprintf(id, sizeof id, "t%d", a->k);
    ib_store_session r = make_rec(id, "threads", 0);
    r.progress.n_fed = 0;
    a->rc = ib_store_create(a->st, &r, &err);
    int32_t t[5];
    uint8_t f[5];
    for (int i = 0; i < 20 && !a->rc; i++) {
        for (int k = 0; k < 5; k++) t[k] = tok_at(a->k, i * 5 + k), f[k] = flag_at(i * 5 + k);
        a->rc = ib_store_append(a->st, id, i * 5, t, f, 5, NULL, &err);
        /* a stale append among the others' (a group commit's other appends must not notice it) */
        if (!a->rc && i == a->k % 20 && ib_store_append(a->st, id, i * 5, t, f, 5, NULL, &err) != IB_ERR_STATE)
            a->rc = IB_ERR_INVALID_ARG;
    }
    ib_store_session_free(&r);
    return NULL;
}

/* NTH threads on one store, appends coalesced into group commits. */
#define NTH 12
static void conf_threads(const char *uri) {
    ib_error err;
    ib_store *st = NULL;
    CHECK(ib_store_open(uri, &st, &err) == IB_OK, "open: %s", err.msg);
    if (!st) return;
    pthread_t th[NTH];
    targ a[NTH];
    for (int i = 0; i < NTH; i++) {
        a[i] = (targ){st, 20 + i, IB_OK};
        pthread_create(&th[i], NULL, thread_writer, &a[i]);
    }
    for (int i = 0; i < NTH; i++) pthread_join(th[i], NULL);
    char owner[65];
    ib_store_owner_hash("threads", owner);
    char **ids;
    int n;
    CHECK(ib_store_list_owner(st, owner, &ids, &n, &err) == IB_OK && n == NTH, "%d threads' sessions: %d", NTH, n);
    ib_store_ids_free(ids, n);
    for (int i = 0; i < NTH; i++) {
        CHECK(a[i].rc == IB_OK, "thread %d failed", i);
        char id[16];
        snprintf(id, sizeof id, "t%d", 20 + i);
        ib_store_session l;
        int same = ib_store_load(st, id, &l, &err) == IB_OK && l.n_tokens == 100;
        for (int k = 0; same && k < 100; k++) same = l.tokens[k] == tok_at(20 + i, k);
        CHECK(same, "thread %d's history", i);
        ib_store_session_free(&l);
    }
    ib_store_close(st);
}

#endif
