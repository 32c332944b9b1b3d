/*
 * sampler.h — token selection from logits, deterministic per (seed, step).
 *
 * The pipeline (ib_sampling in isobatch.h documents the fields):
 *   temperature <= 0            -> greedy argmax, ties to the lowest id (repetition penalty applied
 *                                  first when != 1).
 *   otherwise, over float32 copies of the logits:
 *   1. repetition penalty over the last repeat_last_n history tokens (each distinct id once):
 *      l > 0 ? l / penalty : l * penalty
 *   2. l / temperature
 *   3. top-k (0 = off): keep the k largest (ties broken by lower id)
 *   4. softmax over the kept set: p = exp(l - max) / sum, with ib_expf and the sum taken in
 *      candidate order (descending logit, ascending id) in double precision
 *   5. top-p (>= 1 = off): keep the smallest prefix of that order whose mass >= top_p
 *   6. min-p (<= 0 = off): drop p < min_p * p_max
 *   7. draw u = ib_rng_uniform(seed, step) in [0,1), walk the kept candidates in order accumulating
 *      their (renormalised) mass in double, return the first whose cumulative mass exceeds u * total
 *      (the last one if rounding leaves none).
 * Everything is a function of (logits, settings, history, seed, step) alone.
 */
#ifndef IB_SAMPLING_SAMPLER_H
#define IB_SAMPLING_SAMPLER_H
#include <stdint.h>
#include "isobatch.h"

/* Counter-based generator: a uniform double in [0,1) from (seed, counter) alone (53 random bits),
 * from a bijective 64-bit mix of both. No state. */
double ib_rng_uniform(uint64_t seed, uint64_t counter);

/* Scratch for one sampler call: the caller allocates it once per session (no allocation in the
 * decode loop). */
typedef struct ib_sample_scratch {
    int vocab;
    float *vals;     /* [vocab] */
    int32_t *ids;    /* [vocab] */
} ib_sample_scratch;

ib_status ib_sample_scratch_init(ib_sample_scratch *s, int vocab, ib_error *err);
void ib_sample_scratch_free(ib_sample_scratch *s);

/* Choose a token by the pipeline above. logits: [vocab] (not modified). history: the session's
 * previous tokens (oldest first), n_hist of them. */
int32_t ib_sample_logits(const float *logits, int vocab, const ib_sampling *p, uint64_t step,
                         const int32_t *history, int n_hist, ib_sample_scratch *scratch);

/* Greedy argmax, ties to the lowest id. */
int32_t ib_argmax(const float *logits, int vocab);

#endif
