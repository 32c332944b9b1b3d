/*
 * test_pool.c — the persistent thread pool (src/core/pool.c).
 *
 * Checks that every task of a job runs exactly once, on a valid thread, for pools of 1 to 4 threads
 * and jobs from 1 task to past the size the pool publishes at once (so jobs cut into parts are
 * covered); that jobs run back to back reuse the shares correctly; and that a thread stuck in a task
 * of its own share does not stop the others: the rest of its share is stolen.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "core/pool.h"

typedef struct {
    _Atomic int *runs;   /* [n] times each task ran */
    int n, threads;
    _Atomic int bad_thread;
} count_job;

static void count_task(void *ctx, int task, int thread) {
    count_job *j = ctx;
    if (thread < 0 || thread >= j->threads || task < 0 || task >= j->n) {
        atomic_store(&j->bad_thread, 1);
        return;
    }
    atomic_fetch_add_explicit(&j->runs[task], 1, memory_order_relaxed);
}

/* One job of n tasks on pool p: 1 when each task ran exactly once with thread and task indices in range;
 * otherwise 0, with the first wrong task in *wrong (-1: an index out of range). */
static int run_once(ib_pool *p, int threads, int n, int *wrong) {
    count_job j = {calloc((size_t)n, sizeof(_Atomic int)), n, threads, 0};
    *wrong = -1;
    if (!j.runs) return 0;
    ib_pool_run(p, n, count_task, &j);
    int ok = !atomic_load(&j.bad_thread);
    for (int i = 0; i < n && ok; i++)
        if (atomic_load(&j.runs[i]) != 1) ok = 0, *wrong = i;
    free(j.runs);
    return ok;
}

static void check_once(ib_pool *p, int threads, int n) {
    int wrong;
    CHECK(run_once(p, threads, n, &wrong), "%d threads, %d tasks: task %d did not run exactly once (-1: an index "
          "out of range or no memory)", threads, n, wrong);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Task 0 (the first of the calling thread's share) waits until every other task of that share has
 * run: only a thread that steals them can run them. */
typedef struct {
    int first_share;      /* tasks in the calling thread's share: [0, first_share) */
    _Atomic int others_done;
    _Atomic int stolen_by_worker;
    _Atomic int timed_out;
} steal_job;

static void steal_task(void *ctx, int task, int thread) {
    steal_job *j = ctx;
    if (task == 0) {
        double t0 = now_s();
        while (atomic_load(&j->others_done) < j->first_share - 1)
            if (now_s() - t0 > 20.0) {
                atomic_store(&j->timed_out, 1);
                return;
            }
        return;
    }
    if (task < j->first_share) {
        if (thread != 0) atomic_fetch_add(&j->stolen_by_worker, 1);
        atomic_fetch_add(&j->others_done, 1);
    }
}

int main(void) {
    const int sizes[] = {1, 2, 3, 7, 16, 64, 1000, 65535, 65536, 70001, 140000};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    for (int t = 1; t <= 4; t++) {
        ib_pool *p;
        ib_error err;
        if (ib_pool_create(t, &p, &err) != IB_OK) {
            CHECK(0, "pool of %d: %s", t, err.msg);
            continue;
        }
        CHECK_EQ_INT(ib_pool_threads(p), t);
        for (int s = 0; s < n_sizes; s++) check_once(p, t, sizes[s]);
        /* many small jobs back to back: shares of one job must never hand out tasks of another */
        int failed = 0, wrong = -1, n_bad = 0;
        for (int rep = 0, w; rep < 2000; rep++)
            if (!run_once(p, t, 1 + rep % 9, &w) && !failed++) n_bad = 1 + rep % 9, wrong = w;
        CHECK(failed == 0, "%d threads, 2000 small jobs: %d went wrong (first: %d tasks, task %d)", t, failed, n_bad,
              wrong);
        if (t >= 2) {
            /* 8 tasks over t threads: the caller's share is the first 8 / t of them */
            steal_job j = {8 / t, 0, 0, 0};
            ib_pool_run(p, 8, steal_task, &j);
            CHECK(!atomic_load(&j.timed_out), "%d threads: the rest of a stuck thread's share was not stolen", t);
            CHECK_EQ_INT(atomic_load(&j.stolen_by_worker), 8 / t - 1);
        }
        ib_pool_free(p);
    }
    /* no pool: tasks run inline on thread 0 */
    check_once(NULL, 1, 100);
    TEST_MAIN_END("test_pool");
}
