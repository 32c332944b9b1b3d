/*
 * pool.h — a persistent thread pool. Threads are created once and parked between jobs.
 *
 * A job is a function called for task indices 0..n_tasks-1. Each thread starts on its own contiguous
 * share of the tasks, in ascending order, and then steals from the ends of the others' shares (so
 * neighbouring tasks should touch neighbouring memory). Results must never depend on which thread runs a task (that is how the engine stays
 * invariant to the thread count): tasks write disjoint outputs and do their own reductions in full.
 */
#ifndef IB_CORE_POOL_H
#define IB_CORE_POOL_H
#include "isobatch.h"

typedef struct ib_pool ib_pool;

/* Work function: run task `task` (0 <= task < n_tasks) on worker `thread` (0 <= thread < threads). */
typedef void (*ib_pool_fn)(void *ctx, int task, int thread);

/* Create a pool with n_threads workers in total (the caller's thread counts as worker 0). */
ib_status ib_pool_create(int n_threads, ib_pool **out, ib_error *err);
void ib_pool_free(ib_pool *p);
int ib_pool_threads(const ib_pool *p);

/* Work (in multiply-adds) below which a job runs on the calling thread alone: waking workers costs
 * microseconds, more than such a job takes. Only speed depends on it, never a result. */
#define IB_MIN_PARALLEL_MACS 262144.0

/* Run fn for every task and return when all are done. p may be NULL (runs inline). */
void ib_pool_run(ib_pool *p, int n_tasks, ib_pool_fn fn, void *ctx);

#endif
