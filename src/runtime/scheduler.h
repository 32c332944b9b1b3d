/*
 * scheduler.h — internal helpers of the scheduler (the API is in include/isobatch.h).
 */
#ifndef IB_RUNTIME_SCHEDULER_H
#define IB_RUNTIME_SCHEDULER_H
#include "runtime/runtime.h"

/* Tokens session s can still take in its KV cache. */
static inline long ib_session_room(const ib_session *s) { return (long)s->capacity - s->pos; }

#endif
