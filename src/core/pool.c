/*
 * pool.c — persistent thread pool (see pool.h). Workers wait on a condition variable for a new job
 * generation, run their static share of the tasks, and the caller runs share 0 and waits for the rest.
 */
#include <pthread.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/pool.h"

struct ib_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    unsigned long generation;  /* bumped for each job */
    int pending;               /* workers still running the current job */
    int quit;
    /* current job */
    ib_pool_fn fn;
    void *ctx;
    int n_tasks;
};

typedef struct { ib_pool *pool; int index; } worker_arg;

/* Run the tasks of the current job that belong to worker `w`: a contiguous static range. */
static void run_share(ib_pool *p, int w) {
    int n = p->n_tasks, t = p->n_threads;
    int lo = (int)((long long)n * w / t), hi = (int)((long long)n * (w + 1) / t);
    for (int i = lo; i < hi; i++) p->fn(p->ctx, i, w);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    ib_pool *p = wa->pool;
    int w = wa->index;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_share(p, w);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ib_status ib_pool_create(int n_threads, ib_pool **out, ib_error *err) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) return ib_fail(err, IB_ERR_INVALID_ARG, "threads: %d is more than 256", n_threads);
    ib_pool *p = calloc(1, sizeof *p);
    if (!p) return ib_fail(err, IB_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) goto nomem;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) goto nomem_started;
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* only 1..i-1 exist; shut them down */
            ib_pool_free(p);
            return ib_fail(err, IB_ERR_NOMEM, "thread pool: could not start thread %d", i);
        }
        continue;
    nomem_started:
        p->n_threads = i;
        ib_pool_free(p);
        return ib_fail(err, IB_ERR_NOMEM, "thread pool: out of memory");
    }
    *out = p;
    return IB_OK;
nomem:
    ib_pool_free(p);
    return ib_fail(err, IB_ERR_NOMEM, "thread pool: out of memory");
}

void ib_pool_free(ib_pool *p) {
    if (!p) return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        p->quit = 1;
        pthread_cond_broadcast(&p->start_cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
        free(p->threads);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

int ib_pool_threads(const ib_pool *p) { return p ? p->n_threads : 1; }

void ib_pool_run(ib_pool *p, int n_tasks, ib_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
