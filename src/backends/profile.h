/*
 * profile.h — a backend that times another: every step operation of the inner backend, called through
 * it, is timed (CLOCK_MONOTONIC) and counted by category (ib_prof_op, include/isobatch.h), and
 * otherwise forwarded unchanged: the same calls, arguments and order, so the numbers are the inner
 * backend's. The engine puts one in front of its backend when ib_engine_opts.profile is set.
 *
 * Meaningful only for a backend that computes each operation before returning (CPU); the engine
 * refuses to profile any other.
 */
#ifndef IB_BACKENDS_PROFILE_H
#define IB_BACKENDS_PROFILE_H
#include "backends/backend.h"

/* Wrap `inner` (an instance) in a profiling instance. On success *out owns inner: destroying *out
 * destroys inner. On failure (IB_ERR_NOMEM) *out is NULL and the caller still owns inner. */
ib_status ib_profile_wrap(ib_backend *inner, ib_backend **out, ib_error *err);

/* The totals of a profiling instance b (made by ib_profile_wrap) since it was made or last reset. */
void ib_profile_read(const ib_backend *b, ib_step_profile *out);
/* Zero the totals of a profiling instance b. */
void ib_profile_reset(ib_backend *b);

#endif
