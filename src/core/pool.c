/*
 * pool.c — persistent thread pool (see pool.h).
 *
 * A job is published by bumping an atomic generation counter. Workers spin on it for a short while
 * (a decode step runs hundreds of small jobs back to back, and a sleep/wake round trip per job would
 * cost more than the job), then sleep on a condition variable.
 *
 * Tasks are handed out by shares: the job's task range is cut into one contiguous share per thread.
 * A thread takes the tasks of its own share from the front, one at a time, then steals from the back
 * of the others' shares until every share is empty. So each thread walks memory in one ascending run
 * (a product's weights stream with the hardware and software prefetch running ahead across task
 * boundaries), a slow or descheduled thread delays nobody (its tasks are stolen), and the threads
 * finish within about one task of each other. Each share is one atomic word tagged with the job's
 * generation, so a claim made for an earlier job fails. The caller returns when every task is done.
 * (Which thread runs a task never changes its result: tasks write disjoint outputs and do their own
 * reductions in full.)
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

/* Tasks a job publishes at once (a share's bounds are 16-bit); ib_pool_run cuts larger jobs into
 * consecutive parts of at most this many. */
#define PART_TASKS 65535

/* One thread's share of a job: (generation low 32 bits) << 32 | front << 16 | back, the tasks
 * [front, back) of the current part not yet claimed. Alone on its cache line. Beside it, on a line of
 * its own, the number of tasks of the current part that thread has finished (whoever's share they
 * came from): only that thread writes it, so counting a task moves no cache line between the cores
 * (one count shared by all threads did, for every task: a prefill's attention is about 1,000 tasks a
 * layer), and each task is still counted as soon as it is done (a thread descheduled between two
 * tasks delays nobody: the others steal the rest, and what it finished is already counted). */
typedef struct {
    _Alignas(64) _Atomic uint64_t word;
    _Alignas(64) _Atomic int done;
} share;

struct ib_pool {
    int n_threads;
    pthread_t *threads;
    share *shares;                     /* [n_threads] */
    pthread_mutex_t mu;
    pthread_cond_t start_cv;
    _Atomic unsigned long generation;  /* bumped for each part of a job */
    _Atomic int quit;
    int sleepers;                      /* workers waiting on start_cv (guarded by mu) */
    /* current part: written before generation is bumped, read after it is seen */
    _Atomic(ib_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int base;                  /* task index of the part's first task */
};

typedef struct { ib_pool *pool; int index; } worker_arg;

/* Claim one task of share sh for the part tagged tag: from the front (own share) or the back
 * (stealing). Returns the task's index within the part, or -1 when the share is empty or holds
 * another part. */
static int claim(share *sh, uint64_t tag, int from_back) {
    uint64_t c = atomic_load_explicit(&sh->word, memory_order_acquire);
    for (;;) {
        unsigned front = (unsigned)(c >> 16) & 0xffff, back = (unsigned)c & 0xffff;
        if ((c & 0xffffffff00000000ull) != tag || front >= back) return -1;
        uint64_t next = from_back ? c - 1 : c + (1ull << 16);
        if (atomic_compare_exchange_weak_explicit(&sh->word, &c, next, memory_order_acq_rel, memory_order_acquire))
            return (int)(from_back ? back - 1 : front);
    }
}

/* Run tasks of part `gen` as thread w until none is left: its own share front to back, then the
 * others' shares from their backs. */
static void run_tasks(ib_pool *p, unsigned long gen, ib_pool_fn fn, void *ctx, int base, int w) {
    const uint64_t tag = (uint64_t)(uint32_t)gen << 32;
    const int T = p->n_threads;
    for (int i = 0; i < T; i++) {
        share *sh = &p->shares[(w + i) % T];
        for (int t; (t = claim(sh, tag, i > 0)) >= 0;) {
            fn(ctx, base + t, w);
            /* only thread w writes its count: a plain increment, published with release */
            atomic_store_explicit(&p->shares[w].done,
                                  atomic_load_explicit(&p->shares[w].done, memory_order_relaxed) + 1,
                                  memory_order_release);
        }
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
        /* the part's fields were written before the generation was published; a stale read is caught
         * by the generation tag of the shares */
        run_tasks(p, seen, p->fn, p->ctx, p->base, w);
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
    p->shares = aligned_alloc(_Alignof(share), (size_t)n_threads * sizeof(share));
    if (!p->threads || !p->shares) {
        ib_pool_free(p);
        return ib_fail(err, IB_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 0; i < n_threads; i++) atomic_init(&p->shares[i].word, 0), atomic_init(&p->shares[i].done, 0);
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
    free(p->shares);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    free(p);
}

int ib_pool_threads(const ib_pool *p) { return p ? p->n_threads : 1; }

/* Tasks of the current part finished so far, over all threads' counts. */
static int done_count(ib_pool *p) {
    int sum = 0;
    for (int i = 0; i < p->n_threads; i++) sum += atomic_load_explicit(&p->shares[i].done, memory_order_acquire);
    return sum;
}

/* Publish tasks [base, base + n) (n <= PART_TASKS) as the next part, run them with the workers and
 * return when all are done. */
static void run_part(ib_pool *p, int base, int n, ib_pool_fn fn, void *ctx) {
    const int T = p->n_threads;
    p->fn = fn;
    p->ctx = ctx;
    p->base = base;
    unsigned long gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    const uint64_t tag = (uint64_t)(uint32_t)gen << 32;
    for (int i = 0; i < T; i++) {
        uint64_t front = (uint64_t)((long)n * i / T), back = (uint64_t)((long)n * (i + 1) / T);
        atomic_store_explicit(&p->shares[i].word, tag | front << 16 | back, memory_order_relaxed);
        atomic_store_explicit(&p->shares[i].done, 0, memory_order_relaxed);   /* the last part's were all read */
    }
    atomic_store_explicit(&p->generation, gen, memory_order_release);
    pthread_mutex_lock(&p->mu);
    if (p->sleepers) pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, gen, fn, ctx, base, 0);
    for (int i = 0; done_count(p) < n; i++) {
        if (i < YIELD_AFTER) CPU_RELAX();
        else sched_yield();
    }
}

void ib_pool_run(ib_pool *p, int n_tasks, ib_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    for (int base = 0; base < n_tasks; base += PART_TASKS)
        run_part(p, base, n_tasks - base < PART_TASKS ? n_tasks - base : PART_TASKS, fn, ctx);
}
