/*
 * sampler.c — token selection from logits, deterministic per (seed, step). Implements sampler.h
 * (whose pipeline comment is the specification), ib_sampling_default (isobatch.h) and the
 * counter-based generator ib_rng_uniform.
 *
 * Details the pipeline in sampler.h leaves open, fixed here:
 *   - Value hygiene: every float produced in the pipeline (copied logit, penalised logit, logit /
 *     temperature) is made canonical: NaN becomes -inf, -0 becomes +0. So NaN logits are treated as
 *     -inf everywhere (ib_argmax included) and "descending logit, ascending id" is a total order.
 *   - Repetition penalty: applied when repeat_penalty > 0, finite and != 1; each history id in the
 *     window is recomputed from the original logit (vals[t] = penalise(logit[t])), so an id that occurs
 *     several times is penalised exactly once. repeat_last_n <= 0 means the whole history. History ids
 *     outside [0, vocab) are ignored.
 *   - temperature <= 0 or NaN: greedy. top_k <= 0 or >= vocab: off. top_p <= 0, >= 1 or NaN: off.
 *     min_p <= 0 or NaN: off.
 *   - Softmax (step 4): d = l - max, taken as exactly 0 when l == max (so an infinite maximum gives
 *     weight 1 to the tokens holding it and 0 to the rest); w = ib_expf(d) (a float), p = w / sum with
 *     sum = the double sum of the w in candidate order. Candidates whose weight w is exactly 0 are
 *     dropped here: they carry no mass (adding +0 leaves the sum unchanged) and a zero-probability
 *     token is never returned, not even by the "rounding leaves none" fallback of step 7.
 *     As a pure speed-up, candidates with d < -104 are skipped before sorting: any e^x with
 *     x < -103.98 rounds to 0 in float (fmath.h: ib_expf returns 0 there), so this changes nothing.
 *   - top-p: p_j = (double)w_j / sum, cumulative in double in candidate order, compared with
 *     (double)top_p; the prefix is never empty.
 *   - min-p: p_max is the largest kept p; candidates with p < min_p * p_max are dropped, but the first
 *     candidate is always kept (min_p > 1 thus degenerates to the single best token).
 *   - Draw: total = sum of the kept p_j in order; u = ib_rng_uniform(seed, step); return the first
 *     candidate whose cumulative p exceeds u * total, else the last kept one.
 *
 * Cost: top-k on uses a k-element heap (O(vocab log k)) and sorts only the k kept; top-k off sorts
 * the whole candidate set (a stable LSD radix sort on the float bits, ids ascending within equal
 * values; insertion sort below 65 candidates), because the spec sums the softmax in candidate order,
 * so no pre-filter can skip tokens that still carry mass. At vocab 151936 on a 2-core test VM: about
 * 0.9 ms per call with top-k, 3.5 ms with a full sort, 0.1 ms greedy. No allocation: all work
 * happens in the scratch, whose arrays ib_sample_scratch_init sizes at 2*vocab (the upper halves are
 * the radix sort's second buffer and the top-k heap), so the scratch must come from that function.
 */
#include "sampling/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fmath.h"
#include "ops/ops.h"

/* ---------------------------------------------------------------- defaults and generator */

/* Greedy defaults: temperature 0, top_k 0, top_p 1, min_p 0, repeat_penalty 1, repeat_last_n 0,
 * seed 0. */
ib_sampling ib_sampling_default(void)
{
    ib_sampling p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 0;
    p.seed = 0;
    return p;
}

/* SplitMix64-style finalizer: a bijection of 64-bit words with good avalanche (xor-shifts and odd
 * multipliers are each invertible). */
static inline uint64_t mix64_(uint64_t z)
{
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z;
}

/* Uniform double in [0,1) from (seed, counter) alone:
 *   z = mix64((seed * 0x9e3779b97f4a7c15) ^ mix64(counter + 0xd1b54a32d192ed03)), u = (z >> 11) * 2^-53.
 * For a fixed seed the map counter -> z is a bijection (add, mix, xor with a constant, mix); for a
 * fixed counter so is seed -> z (multiplication by an odd constant is invertible mod 2^64). */
double ib_rng_uniform(uint64_t seed, uint64_t counter)
{
    uint64_t z = mix64_((seed * 0x9e3779b97f4a7c15ULL) ^ mix64_(counter + 0xd1b54a32d192ed03ULL));
    return (double)(z >> 11) * 0x1p-53;
}

/* ---------------------------------------------------------------- scratch */

/* Allocate the sampler scratch for `vocab` tokens: vals and ids with 2*vocab entries each (the
 * declared [vocab] plus a second half used as sort buffer / heap). On failure s holds NULLs (so
 * ib_sample_scratch_free is still safe) and nothing stays allocated. */
ib_status ib_sample_scratch_init(ib_sample_scratch *s, int vocab, ib_error *err)
{
    if (!s) return ib_fail(err, IB_ERR_INVALID_ARG, "sampler: scratch: NULL pointer");
    s->vocab = 0;
    s->vals = NULL;
    s->ids = NULL;
    if (vocab <= 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "sampler: scratch: vocab_size %d must be positive", vocab);
    float *vals = malloc((size_t)vocab * 2 * sizeof *vals);
    int32_t *ids = malloc((size_t)vocab * 2 * sizeof *ids);
    if (!vals || !ids) {
        free(vals);
        free(ids);
        return ib_fail(err, IB_ERR_NOMEM, "sampler: scratch: out of memory for %d tokens (%zu bytes)", vocab,
                       (size_t)vocab * 2 * (sizeof *vals + sizeof *ids));
    }
    s->vocab = vocab;
    s->vals = vals;
    s->ids = ids;
    return IB_OK;
}

/* Release the scratch arrays (NULL or zeroed scratch allowed) and zero the struct. */
void ib_sample_scratch_free(ib_sample_scratch *s)
{
    if (!s) return;
    free(s->vals);
    free(s->ids);
    s->vals = NULL;
    s->ids = NULL;
    s->vocab = 0;
}

/* ---------------------------------------------------------------- helpers */

/* NaN -> -inf, -0 -> +0, everything else unchanged. */
static inline float canon_(float v)
{
    if (v != v) return -INFINITY;
    if (v == 0.0f) return 0.0f;
    return v;
}

/* Repetition penalty of one logit: l > 0 ? l / pen : l * pen (canonical result). */
static inline float penalise_(float l, float pen)
{
    return canon_(l > 0.0f ? l / pen : l * pen);
}

/* Candidate order: a before b when its value is larger, or equal with a lower id. */
static inline int better_(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

/* Sort key: unsigned, ascending in candidate order (descending value) for canonical floats. */
static inline uint32_t desc_key_(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~asc;
}

/* Greedy argmax: the largest logit, ties to the lowest id, NaN treated as -inf (so an all-NaN/-inf
 * row gives 0). Returns -1 when vocab <= 0 or logits is NULL. */
/* v[j] = ib_expf(v[j] - mx), with the difference taken as exactly 0 where v[j] == mx (step 4 of the
 * pipeline), for j < n: ib_expf_lane gives ib_expf's bits lane by lane, so the vector clones do too. */
IB_VECTOR_CLONES static void weights_(float *v, int n, float mx)
{
    for (int j = 0; j < n; j++) v[j] = ib_expf_lane(v[j] == mx ? 0.0f : v[j] - mx);
}

/* The largest of x[0..n), NaNs skipped (-inf when there is nothing larger). Kept in 16 lanes so the
 * vector clones compute it: a maximum is the same in any order once NaNs are skipped. */
IB_VECTOR_CLONES static float block_max_(const float *x, int n)
{
    float lane[16];
    for (int j = 0; j < 16; j++) lane[j] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    for (int j = 0; i + j < n; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    for (int w = 8; w >= 1; w >>= 1)
        for (int j = 0; j < w; j++) lane[j] = lane[j + w] > lane[j] ? lane[j + w] : lane[j];
    return lane[0];
}

/* The first id holding the largest logit (NaN never wins; all NaN or -inf: id 0), as a one-by-one
 * scan keeping the first strict maximum gives it, found block by block: each block's maximum in the
 * vector unit, then the first block that holds the overall one is searched for its first id. */
int32_t ib_argmax(const float *logits, int vocab)
{
    enum { BLOCK = 1024 };
    if (!logits || vocab <= 0) return -1;
    float best = -INFINITY;
    int best_block = -1;
    for (int b0 = 0; b0 < vocab; b0 += BLOCK) {
        float m = block_max_(logits + b0, vocab - b0 < BLOCK ? vocab - b0 : BLOCK);
        if (m > best) best = m, best_block = b0;
    }
    if (best_block < 0) return 0;
    int i = best_block;
    while (logits[i] != best) i++;
    return i;
}

/* Restore the heap property at pos of a heap of n (value, id) pairs whose root is the WORST element
 * in candidate order (every parent is worse than its children). hv, hi: [n]. */
static void heap_sift_down_(float *hv, int32_t *hi, int n, int pos)
{
    for (;;) {
        int l = 2 * pos + 1;
        if (l >= n) return;
        int w = l, r = l + 1;
        if (r < n && better_(hv[l], hi[l], hv[r], hi[r])) w = r; /* the worse child */
        if (!better_(hv[pos], hi[pos], hv[w], hi[w])) return;
        float tv = hv[pos];
        int32_t ti = hi[pos];
        hv[pos] = hv[w];
        hi[pos] = hi[w];
        hv[w] = tv;
        hi[w] = ti;
        pos = w;
    }
}

/* Top-k selection: write the k best (value, id) pairs of vals[0..vocab) (ids implicit = index) into
 * hv/hi [k], sorted in candidate order. 0 < k < vocab. */
static void select_top_k_(const float *vals, int vocab, int k, float *hv, int32_t *hi)
{
    for (int i = 0; i < k; i++) {
        hv[i] = vals[i];
        hi[i] = i;
    }
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down_(hv, hi, k, i);
    for (int i = k; i < vocab; i++) {
        if (better_(vals[i], i, hv[0], hi[0])) {
            hv[0] = vals[i];
            hi[0] = i;
            heap_sift_down_(hv, hi, k, 0);
        }
    }
    /* heap sort: the worst goes to the end each time, leaving the best first */
    for (int end = k - 1; end > 0; end--) {
        float tv = hv[0];
        int32_t ti = hi[0];
        hv[0] = hv[end];
        hi[0] = hi[end];
        hv[end] = tv;
        hi[end] = ti;
        heap_sift_down_(hv, hi, end, 0);
    }
}

#define RADIX_BITS 11
#define RADIX_SIZE (1 << RADIX_BITS)
#define RADIX_PASSES 3 /* 11 + 11 + 10 bits */

/* Stable LSD radix sort of n (value, id) pairs into candidate order (descending value; equal values
 * keep their input order, so ids ascending in gives ids ascending out). v0/i0 hold the input, v1/i1
 * [n] are the second buffer; *out_v and *out_i point at whichever buffer holds the result. */
static void radix_sort_(float *v0, int32_t *i0, float *v1, int32_t *i1, int n, float **out_v, int32_t **out_i)
{
    if (n <= 64) { /* small sets: insertion sort in place (same order: it is a total order) */
        for (int j = 1; j < n; j++) {
            float v = v0[j];
            int32_t id = i0[j];
            int at = j;
            while (at > 0 && better_(v, id, v0[at - 1], i0[at - 1])) {
                v0[at] = v0[at - 1];
                i0[at] = i0[at - 1];
                at--;
            }
            v0[at] = v;
            i0[at] = id;
        }
        *out_v = v0;
        *out_i = i0;
        return;
    }
    uint32_t count[RADIX_PASSES][RADIX_SIZE];
    memset(count, 0, sizeof count);
    for (int j = 0; j < n; j++) {
        uint32_t key = desc_key_(v0[j]);
        for (int p = 0; p < RADIX_PASSES; p++) count[p][(key >> (p * RADIX_BITS)) & (RADIX_SIZE - 1)]++;
    }
    float *sv = v0, *dv = v1;
    int32_t *si = i0, *di = i1;
    for (int p = 0; p < RADIX_PASSES; p++) {
        uint32_t *c = count[p];
        int shift = p * RADIX_BITS;
        /* a pass where every key has the same digit moves nothing */
        if (c[(desc_key_(sv[0]) >> shift) & (RADIX_SIZE - 1)] == (uint32_t)n) continue;
        uint32_t sum = 0;
        for (int b = 0; b < RADIX_SIZE; b++) {
            uint32_t t = c[b];
            c[b] = sum;
            sum += t;
        }
        for (int j = 0; j < n; j++) {
            uint32_t at = c[(desc_key_(sv[j]) >> shift) & (RADIX_SIZE - 1)]++;
            dv[at] = sv[j];
            di[at] = si[j];
        }
        float *tv = sv;
        sv = dv;
        dv = tv;
        int32_t *ti = si;
        si = di;
        di = ti;
    }
    *out_v = sv;
    *out_i = si;
}

/* ---------------------------------------------------------------- the pipeline */

/* Choose a token from logits [vocab] by the pipeline in sampler.h with the details fixed at the top of
 * this file. history [n_hist] (may be NULL when n_hist == 0). scratch must come from
 * ib_sample_scratch_init with at least vocab tokens; when it is missing or too small the sampler
 * falls back to the greedy choice rather than touching memory it does not own. p == NULL means the
 * defaults. Returns -1 only when logits is NULL or vocab <= 0. */
int32_t ib_sample_logits(const float *logits, int vocab, const ib_sampling *p, uint64_t step,
                         const int32_t *history, int n_hist, ib_sample_scratch *scratch)
{
    if (!logits || vocab <= 0) return -1;
    ib_sampling def;
    if (!p) {
        def = ib_sampling_default();
        p = &def;
    }
    const int greedy = !(p->temperature > 0.0f);
    const float pen = p->repeat_penalty;
    const int use_pen = pen > 0.0f && pen <= FLT_MAX && pen != 1.0f && history && n_hist > 0;
    if (greedy && !use_pen) return ib_argmax(logits, vocab);
    if (!scratch || !scratch->vals || !scratch->ids || scratch->vocab < vocab) return ib_argmax(logits, vocab);

    float *vals = scratch->vals; /* [2*vocab]: [0, vocab) working values, [vocab, 2*vocab) buffer */
    int32_t *ids = scratch->ids; /* [2*vocab] */

    /* 1. float copy and repetition penalty (each distinct id once: recomputed from the logit) */
    for (int i = 0; i < vocab; i++) vals[i] = canon_(logits[i]);
    if (use_pen) {
        int from = (p->repeat_last_n > 0 && p->repeat_last_n < n_hist) ? n_hist - p->repeat_last_n : 0;
        for (int h = from; h < n_hist; h++) {
            int32_t t = history[h];
            if (t < 0 || t >= vocab) continue;
            vals[t] = penalise_(canon_(logits[t]), pen);
        }
    }
    if (greedy) return ib_argmax(vals, vocab);

    /* 2. temperature */
    const float temp = p->temperature;
    float vmax = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        float v = canon_(vals[i] / temp);
        vals[i] = v;
        if (v > vmax) vmax = v;
    }

    /* 3. top-k, or the whole (pre-filtered) set, in candidate order */
    float *cv;
    int32_t *ci;
    int n;
    if (p->top_k > 0 && p->top_k < vocab) {
        n = p->top_k;
        cv = vals + vocab;
        ci = ids + vocab;
        select_top_k_(vals, vocab, n, cv, ci);
    } else {
        n = 0;
        for (int i = 0; i < vocab; i++) {
            float v = vals[i];
            float d = (v == vmax) ? 0.0f : v - vmax;
            if (d >= -104.0f) { /* else e^d rounds to 0: weight 0, see the top comment */
                vals[n] = v;
                ids[n] = i;
                n++;
            }
        }
        radix_sort_(vals, ids, vals + vocab, ids + vocab, n, &cv, &ci);
    }

    /* 4. softmax weights over the kept set (max = the first candidate); zero weights dropped */
    const float mx = cv[0];
    weights_(cv, n, mx);
    double sum = 0.0;
    int nw = 0;
    for (int j = 0; j < n; j++) {
        float w = cv[j];
        if (w > 0.0f) {
            cv[nw] = w;
            ci[nw] = ci[j];
            nw++;
            sum += (double)w;
        }
    }
    n = nw; /* >= 1: the first candidate has weight ib_expf(0) = 1 */

    /* 5. top-p: the smallest non-empty prefix whose mass >= top_p */
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        const double tp = (double)p->top_p;
        double c = 0.0;
        for (int j = 0; j < n; j++) {
            c += (double)cv[j] / sum;
            if (c >= tp) {
                n = j + 1;
                break;
            }
        }
    }

    /* 6. min-p: drop p < min_p * p_max (the first candidate always stays) */
    if (p->min_p > 0.0f) {
        float wmax = cv[0];
        for (int j = 1; j < n; j++)
            if (cv[j] > wmax) wmax = cv[j];
        const double thr = (double)p->min_p * ((double)wmax / sum);
        int nk = 1;
        for (int j = 1; j < n; j++) {
            if ((double)cv[j] / sum >= thr) {
                cv[nk] = cv[j];
                ci[nk] = ci[j];
                nk++;
            }
        }
        n = nk;
    }

    /* 7. one draw keyed by (seed, step) */
    double total = 0.0;
    for (int j = 0; j < n; j++) total += (double)cv[j] / sum;
    const double target = ib_rng_uniform(p->seed, step) * total;
    double cum = 0.0;
    for (int j = 0; j < n; j++) {
        cum += (double)cv[j] / sum;
        if (cum > target) return ci[j];
    }
    return ci[n - 1];
}
