/*
 * bench_store.c — prints (asserts nothing) what the session store costs:
 *   1. write latency: appends of 32 tokens with progress (one per completed response), each durable
 *      when it returns, from 1 thread and from W threads on one store (whose appends share commits:
 *      one fsync for every append that arrived while the previous commit ran);
 *   2. rebuild: the time to rebuild an N-token full session by prefill (ib_store_rebuild, chunks of
 *      C) against the KV memory a resident session holds instead.
 * Not built by `make`; after `make build/libisobatch.a`:
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -pthread bench/bench_store.c build/libisobatch.a \
 *      -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lsqlite3 -lm -pthread -o build/bench_store
 *   ./build/bench_store [-m DIR] [--tokens N] [--chunk C] [--threads T] [--writers W] [--db PATH]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "isobatch.h"
#include "store/store.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { APPENDS = 100, CHUNK = 32 };

typedef struct warg {
    ib_store *st;
    int k;
    double *lat; /* [APPENDS] seconds */
} warg;

static void *writer(void *p) {
    warg *a = p;
    ib_error err;
    ib_store_session r;
    memset(&r, 0, sizeof r);
    snprintf(r.id, sizeof r.id, "bench-%d", a->k);
    ib_store_owner_hash("bench", r.owner);
    snprintf(r.model_id, sizeof r.model_id, "sha256:bench");
    r.progress.sampling = ib_sampling_default();
    ib_store_delete(a->st, r.id, &err);
    if (ib_store_create(a->st, &r, &err)) {
        fprintf(stderr, "create: %s\n", err.msg);
        return NULL;
    }
    int32_t t[CHUNK];
    uint8_t f[CHUNK];
    for (int i = 0; i < CHUNK; i++) t[i] = i, f[i] = IB_STORE_TOK_SAMPLED;
    for (int i = 0; i < APPENDS; i++) {
        ib_store_progress pr = r.progress;
        pr.draws = (uint64_t)(i + 1) * CHUNK;
        pr.n_fed = (i + 1) * CHUNK - 1;
        double t0 = now();
        if (ib_store_append(a->st, r.id, i * CHUNK, t, f, CHUNK, &pr, &err)) {
            fprintf(stderr, "append: %s\n", err.msg);
            return NULL;
        }
        a->lat[i] = now() - t0;
    }
    return NULL;
}

/* Run W writer threads; print per-append latency percentiles and the total rate. */
static void bench_writes(const char *uri, int w) {
    ib_error err;
    ib_store *st;
    if (ib_store_open(uri, &st, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    pthread_t th[128];
    warg a[128];
    double *lat = malloc(sizeof(double) * APPENDS * (size_t)w);
    double t0 = now();
    for (int i = 0; i < w; i++) {
        a[i] = (warg){st, i, lat + (size_t)i * APPENDS};
        pthread_create(&th[i], NULL, writer, &a[i]);
    }
    for (int i = 0; i < w; i++) pthread_join(th[i], NULL);
    double secs = now() - t0;
    int n = APPENDS * w;
    qsort(lat, (size_t)n, sizeof *lat, cmp_d);
    printf("writes: %2d thread(s), %d appends of %d tokens: p50 %.2f ms, p99 %.2f ms, %.0f appends/s, %.0f tokens/s\n",
           w, n, CHUNK, 1e3 * lat[n / 2], 1e3 * lat[n * 99 / 100], n / secs, n * (double)CHUNK / secs);
    free(lat);
    ib_store_close(st);
}

int main(int argc, char **argv) {
    const char *dir = "models/default", *db = "build/bench_store.db";
    int n_tok = 2048, chunk = 64, threads = 2, writers = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens")) n_tok = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--chunk")) chunk = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--writers")) writers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--db")) db = argv[i + 1];
    }
    if (writers > 128) writers = 128;
    char uri[1100];
    snprintf(uri, sizeof uri, "sqlite:%s", db);
    bench_writes(uri, 1);
    bench_writes(uri, writers);

    ib_error err;
    ib_model *m;
    ib_engine *e;
    char id[IB_MODEL_ID_LEN];
    double t0 = now();
    if (ib_model_identity(dir, id, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double t_id = now() - t0;
    if (ib_model_load(dir, NULL, &m, &err) ||
        ib_engine_create(m, &(ib_engine_opts){.threads = threads, .max_step_tokens = chunk > 512 ? chunk : 512}, &e,
                         &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const ib_model_info *in = ib_model_get_info(m);
    printf("model %s: identity %.2f s (%.0f MB of files)\n", dir, t_id, in->file_bytes / 1e6);
    if (n_tok > in->max_context) n_tok = in->max_context;
    ib_store_session r;
    memset(&r, 0, sizeof r);
    snprintf(r.id, sizeof r.id, "rebuild");
    snprintf(r.model_id, sizeof r.model_id, "%s", id);
    r.max_context = n_tok;
    r.progress.sampling = ib_sampling_default();
    r.progress.n_fed = n_tok;
    r.n_tokens = n_tok;
    r.tokens = malloc(sizeof(int32_t) * (size_t)n_tok);
    r.flags = calloc((size_t)n_tok, 1);
    for (int i = 0; i < n_tok; i++) r.tokens[i] = (int32_t)((i * 7919 + 13) % (in->vocab_size < 256 ? in->vocab_size : 256));
    for (int rep = 0; rep < 2; rep++) {
        ib_session *s;
        t0 = now();
        if (ib_store_rebuild(e, id, &r, chunk, &s, NULL, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double secs = now() - t0;
        printf("rebuild: %d tokens in chunks of %d, %d threads: %.3f s (%.0f tokens/s); a resident session holds "
               "%.1f MB of f32 KV instead\n",
               n_tok, chunk, threads, secs, n_tok / secs, ib_session_kv_bytes(s) / 1e6);
        ib_session_free(s);
    }
    ib_store_session_free(&r);
    ib_engine_free(e);
    ib_model_free(m);
    return 0;
}
