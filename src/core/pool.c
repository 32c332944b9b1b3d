/*
 * pool.c — persistent thread pool (see pool.h).
 *
 * A job is published by bumping an atomic generation counter. Workers spin on it for a short while
 * (a decode step runs hundreds of small jobs back to back, and a sleep/wake round trip per job would
 * cost more than the job), then sleep on a condition variable. Each worker runs its static share of
 * the tasks and decrements `pending`; the caller runs share 0 and spins until pending reaches zero.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin iterations before a worker sleeps (tens of microseconds), and before a waiting caller starts
 * yielding its core (so a preempted worker on a busy machine can finish its share). */
#define SPIN_LIMIT 4000
#define YIELD_AFTER 2000

struct ib_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start_cv;
    _Atomic unsigned long generation;  /* bumped for each job */
    _Atomic int pending;               /* workers still running the current job */
    _Atomic int quit;
    int sleepers;                      /* workers waiting on start_cv (guarded by mu) */
    /* current job: written before generation is bumped, read after it is seen */
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

/* Wait until the generation differs from seen (or quit); return the new generation. */
static unsigned long wait_job(ib_pool *p, unsigned long seen) {
    for (int i = 0; i < SPIN_LIMIT; i++) {
        unsigned long g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->quit, memory_order_relaxed)) return g;
        CPU_RELAX();
    }
    pthread_mutex_lock(&p->mu);
    p->sleepers++;
    unsigned long g;
    while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen && !atomic_load(&p->quit))
        pthread_cond_wait(&p->start_cv, &p->mu);
    p->sleepers--;
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    ib_pool *p = wa->pool;
    int w = wa->index;
    free(wa);
    unsigned long seen = 0;
    for (;;) {
        seen = wait_job(p, seen);
        if (atomic_load(&p->quit)) break;
        run_share(p, w);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

ib_status ib_pool_create(int n_threads, ib_pool **out, ib_error *err) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) return ib_fail(err, IB_ERR_INVALID_ARG, "threads: %d is more than 256", n_threads);
    ib_pool *p = calloc(1, sizeof *p);
    if (!p) return ib_fail(err, IB_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = 1; /* workers that exist; raised as they start */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        ib_pool_free(p);
        return ib_fail(err, IB_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){p, i};
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            ib_pool_free(p);
            return ib_fail(err, IB_ERR_NOMEM, "thread pool: could not start thread %d", i);
        }
        p->n_threads = i + 1;
    }
    *out = p;
    return IB_OK;
}

void ib_pool_free(ib_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    free(p);
}

int ib_pool_threads(const ib_pool *p) { return p ? p->n_threads : 1; }

void ib_pool_run(ib_pool *p, int n_tasks, ib_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    if (p->sleepers) pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        if (i < YIELD_AFTER) CPU_RELAX();
        else sched_yield();
    }
}
