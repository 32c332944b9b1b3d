/*
 * scheduler.h — internal helpers of the scheduler (the API is in include/isobatch.h).
 */
#ifndef IB_RUNTIME_SCHEDULER_H
#define IB_RUNTIME_SCHEDULER_H
#include "runtime/runtime.h"

/* Tokens session s can still take (positions, for a windowed session). */
static inline long ib_session_room(const ib_session *s) { return (long)ib_session_capacity(s) - s->pos; }

/* Most tokens one step item of session s may bring (0 = no limit of its own). */
static inline int ib_session_max_item(const ib_session *s) { return s->kv_chunk; }

/* A scheduler without a thread (ib_generate uses one): jobs are submitted as to any scheduler, and its
 * loop — the same loop, step for step — runs only inside ib_sched_drain, on the caller's thread. The
 * caller is then the engine's one user, and the one thread that drains, stops and frees it.
 * ib_sched_stop and ib_sched_free work as for a threaded one (a stop with jobs queued delivers their
 * DONE "cancelled" on the calling thread; a stop from inside an event ends the drain that way). */
ib_status ib_sched_create_inline(ib_engine *e, const ib_sched_opts *opts, ib_sched **out, ib_error *err);

/* Inline schedulers only (else a no-op): run the loop on the calling thread until no job is active or
 * queued, or until ib_sched_stop (then every job left ends "cancelled"). Events are delivered on this
 * thread without the scheduler's lock held; they may submit further jobs (taken at the next step, so
 * a finished job's row is refilled at once) and call ib_sched_cancel or ib_sched_stop. Not reentrant:
 * a call from inside an event returns at once. */
void ib_sched_drain(ib_sched *s);

#endif
