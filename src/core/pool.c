/*
 * pool.c — persistent thread pool (see pool.h).
 *
 * A job is published by bumping an atomic generation counter. Workers spin on it for a short while
 * (a decode step runs hundreds of small jobs back to back, and a sleep/wake round trip per job would
 * cost more than the job), then sleep on a condition variable. Tasks are claimed one at a time from
 * a counter tagged with the job's generation, by the caller and by whichever workers are awake: on a
 * busy machine a descheduled worker delays nobody, because the caller takes the tasks it has not
 * claimed. The caller returns when every task is done. (Which thread runs a task never changes its
 * result: tasks write disjoint outputs and do their own reductions in full.)
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
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
    _Atomic uint64_t claim;            /* (generation low 32 bits) << 32 | next unclaimed task */
    _Atomic int done;                  /* tasks finished in the current job */
    _Atomic int quit;
    int sleepers;                      /* workers waiting on start_cv (guarded by mu) */
    /* current job: written before generation is bumped, read after it is seen */
    _Atomic(ib_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int n_tasks;
};

typedef struct { ib_pool *pool; int index; } worker_arg;

/* Claim and run tasks of job `gen` until none is left; a claim made after the job changed fails. */
static void run_tasks(ib_pool *p, unsigned long gen, ib_pool_fn fn, void *ctx, int n_tasks, int w) {
    uint64_t tag = (uint64_t)(uint32_t)gen << 32;
    for (;;) {
        uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
        if ((c & 0xffffffff00000000ull) != tag || (int)(uint32_t)c >= n_tasks) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel, memory_order_relaxed))
            continue;
        fn(ctx, (int)(uint32_t)c, w);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
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
        /* the job's fields were written before the generation was published; a stale read is caught
         * by the generation tag of the claim counter */
        run_tasks(p, seen, p->fn, p->ctx, p->n_tasks, w);
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
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    unsigned long gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    atomic_store_explicit(&p->claim, (uint64_t)(uint32_t)gen << 32, memory_order_release);
    atomic_store_explicit(&p->generation, gen, memory_order_release);
    pthread_mutex_lock(&p->mu);
    if (p->sleepers) pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, gen, fn, ctx, n_tasks, 0);
    for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if (i < YIELD_AFTER) CPU_RELAX();
        else sched_yield();
    }
}
