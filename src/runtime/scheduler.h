/*
 * scheduler.h — internal helpers of the scheduler (the API is in include/isobatch.h).
 */
#ifndef IB_RUNTIME_SCHEDULER_H
#define IB_RUNTIME_SCHEDULER_H
#include "runtime/runtime.h"

/* Tokens session s can still take (positions, for a windowed session). */
static inline long ib_session_room(const ib_session *s) { return (long)ib_session_capacity(s) - s->pos; }

/* Most tokens one step item of session s may bring (0 = no limit of its own). */
static inline int ib_session_max_item(const ib_session *s) { return s->kv_window > 0 ? s->kv_chunk : 0; }

#endif
