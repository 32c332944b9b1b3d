/*
 * test_sampler.c — src/sampling/sampler.c: the generator, argmax, each pipeline stage, the
 * distribution of draws against softmax(l/T) computed here with libm, determinism per (seed, step),
 * and a comparison with a plain reference implementation of the pipeline (qsort over the whole
 * vocabulary) written in this file at Qwen's vocabulary size. Also ib_digest_bytes test vectors and
 * ib_sampling_default.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "core/fmath.h"
#include "sampling/sampler.h"

static uint64_t test_rng = 0x9E3779B97F4A7C15ULL;

/* xorshift64*: test inputs only. */
static uint64_t next_u64(void)
{
    test_rng ^= test_rng >> 12;
    test_rng ^= test_rng << 25;
    test_rng ^= test_rng >> 27;
    return test_rng * 0x2545F4914F6CDD1DULL;
}

static double next_unit(void) { return (double)(next_u64() >> 11) * 0x1p-53; }

/* Approximately normal (sum of 4 uniforms), mean 0, sd ~1. */
static float next_gauss(void)
{
    double s = next_unit() + next_unit() + next_unit() + next_unit() - 2.0;
    return (float)(s * 1.7320508);
}

static ib_sampling settings(float temp, int top_k, float top_p, float min_p, uint64_t seed)
{
    ib_sampling p = ib_sampling_default();
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    return p;
}

/* ---------------------------------------------------------------- generator */

/* The formula documented in sampler.h / sampler.c, written out again here. */
static uint64_t spec_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void test_rng_uniform(void)
{
    const int N = 1000000;
    double sum = 0, lo = 1, hi = 0;
    int bucket[64] = {0};
    int out_of_range = 0;
    for (int i = 0; i < N; i++) {
        double u = ib_rng_uniform(12345, (uint64_t)i);
        if (!(u >= 0.0 && u < 1.0)) out_of_range++;
        sum += u;
        if (u < lo) lo = u;
        if (u > hi) hi = u;
        bucket[(int)(u * 64)]++;
    }
    CHECK_EQ_INT(out_of_range, 0);
    double mean = sum / N;
    CHECK(fabs(mean - 0.5) < 0.002, "mean %.5f", mean);
    CHECK(lo < 1e-4 && hi > 1 - 1e-4, "range [%g, %g]", lo, hi);
    double chi = 0, e = N / 64.0;
    for (int b = 0; b < 64; b++) chi += (bucket[b] - e) * (bucket[b] - e) / e;
    CHECK(chi < 130.0, "64-bucket chi-square %.1f (63 dof)", chi); /* p ~ 1e-6 */

    /* consecutive counters and consecutive seeds are uncorrelated */
    double sxy = 0, sxs = 0;
    for (int i = 0; i < 200000; i++) {
        double a = ib_rng_uniform(7, (uint64_t)i) - 0.5, b = ib_rng_uniform(7, (uint64_t)i + 1) - 0.5;
        double c = ib_rng_uniform(8, (uint64_t)i) - 0.5;
        sxy += a * b;
        sxs += a * c;
    }
    CHECK(fabs(sxy / 200000 / (1.0 / 12)) < 0.02, "lag-1 correlation %.4f", sxy / 200000 * 12);
    CHECK(fabs(sxs / 200000 / (1.0 / 12)) < 0.02, "seed-neighbour correlation %.4f", sxs / 200000 * 12);

    /* deterministic, and a pure function of (seed, counter) */
    CHECK(ib_rng_uniform(1, 2) == ib_rng_uniform(1, 2), "not deterministic");
    int same = 0;
    for (int i = 0; i < 1000; i++) same += ib_rng_uniform(1, (uint64_t)i) == ib_rng_uniform(2, (uint64_t)i);
    CHECK(same == 0, "%d equal draws between seeds 1 and 2", same);
    CHECK(ib_rng_uniform(0, 0) != ib_rng_uniform(0, 1), "counter ignored");

    /* the documented formula, so the stream is pinned across platforms and versions */
    const uint64_t seeds[4] = {0, 1, 0xdeadbeefULL, ~0ULL};
    const uint64_t ctrs[4] = {0, 1, 1000000, ~0ULL};
    for (int a = 0; a < 4; a++) {
        for (int b = 0; b < 4; b++) {
            uint64_t z = spec_mix((seeds[a] * 0x9e3779b97f4a7c15ULL) ^ spec_mix(ctrs[b] + 0xd1b54a32d192ed03ULL));
            double want = (double)(z >> 11) / 9007199254740992.0;
            double got = ib_rng_uniform(seeds[a], ctrs[b]);
            CHECK(got == want, "rng(%llu, %llu) = %.17g, formula gives %.17g", (unsigned long long)seeds[a],
                  (unsigned long long)ctrs[b], got, want);
        }
    }
}

/* ---------------------------------------------------------------- argmax and greedy */

static void test_argmax(ib_sample_scratch *sc)
{
    const float a[6] = {1, 3, 2, 3, -1, 3};
    CHECK_EQ_INT(ib_argmax(a, 6), 1);
    const float b[4] = {NAN, -INFINITY, 5, NAN};
    CHECK_EQ_INT(ib_argmax(b, 4), 2);
    const float c[3] = {NAN, NAN, NAN};
    CHECK_EQ_INT(ib_argmax(c, 3), 0);
    const float d[3] = {-INFINITY, NAN, -INFINITY};
    CHECK_EQ_INT(ib_argmax(d, 3), 0);
    const float e[4] = {-0.0f, 0.0f, -1.0f, 0.0f};
    CHECK_EQ_INT(ib_argmax(e, 4), 0); /* -0 == +0: a tie, lowest id */
    const float f[3] = {1.0f, INFINITY, INFINITY};
    CHECK_EQ_INT(ib_argmax(f, 3), 1);
    CHECK_EQ_INT(ib_argmax(a, 0), -1);

    /* long vocabularies (blocks of 1024 and a tail) against a one-by-one scan: ties within and across
     * blocks, NaNs, infinities, and values drawn from a few levels so that maxima repeat */
    {
        enum { NV = 5000 };
        static float big[NV];
        uint64_t st = 12345;
        int bad = 0;
        for (int trial = 0; trial < 400; trial++) {
            int n = 1 + trial * 37 % NV;
            for (int i = 0; i < n; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                unsigned r = (unsigned)(st >> 33);
                int kind = (int)(r % 16);
                big[i] = kind == 0 ? NAN : kind == 1 ? -INFINITY : kind == 2 && trial % 5 == 0 ? INFINITY
                       : kind == 3 ? -0.0f : (float)((int)(r >> 8) % (trial % 3 ? 7 : 100000)) - 3.0f;
            }
            if (trial % 7 == 0)
                for (int i = 0; i < n; i++) big[i] = (i % 3) ? -INFINITY : NAN;
            int want = 0;
            float bv = big[0] != big[0] ? -INFINITY : big[0];
            for (int i = 1; i < n; i++)
                if (big[i] > bv) bv = big[i], want = i;
            bad += ib_argmax(big, n) != want;
        }
        CHECK(bad == 0, "argmax differs from the one-by-one scan in %d of 400 long cases", bad);
    }

    ib_sampling g = ib_sampling_default();
    CHECK_EQ_INT(ib_sample_logits(a, 6, &g, 0, NULL, 0, sc), 1);
    CHECK_EQ_INT(ib_sample_logits(b, 4, &g, 3, NULL, 0, sc), 2);
    CHECK_EQ_INT(ib_sample_logits(a, 6, NULL, 0, NULL, 0, sc), 1);
    g.temperature = -1.0f;
    CHECK_EQ_INT(ib_sample_logits(a, 6, &g, 0, NULL, 0, sc), 1);
}

static void test_defaults_and_scratch(void)
{
    ib_sampling d = ib_sampling_default();
    CHECK(d.temperature == 0.0f, "temperature %g", d.temperature);
    CHECK_EQ_INT(d.top_k, 0);
    CHECK(d.top_p == 1.0f, "top_p %g", d.top_p);
    CHECK(d.min_p == 0.0f, "min_p %g", d.min_p);
    CHECK(d.repeat_penalty == 1.0f, "repeat_penalty %g", d.repeat_penalty);
    CHECK_EQ_INT(d.repeat_last_n, 0);
    CHECK_EQ_INT(d.seed, 0);

    ib_sample_scratch s;
    memset(&s, 0, sizeof s);
    ib_error err;
    memset(&err, 0, sizeof err);
    CHECK_EQ_INT(ib_sample_scratch_init(&s, 0, &err), IB_ERR_INVALID_ARG);
    CHECK_EQ_INT(err.code, IB_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "vocab") != NULL, "message: %s", err.msg);
    CHECK(s.vals == NULL && s.ids == NULL, "partial state after failure");
    ib_sample_scratch_free(&s); /* zeroed: fine */
    CHECK_EQ_INT(ib_sample_scratch_init(&s, 10, &err), IB_OK);
    CHECK(s.vocab == 10 && s.vals && s.ids, "scratch not set up");
    ib_sample_scratch_free(&s);
    CHECK(s.vals == NULL && s.vocab == 0, "scratch not cleared");

    /* a missing or too small scratch falls back to greedy instead of overrunning */
    const float l[4] = {0, 1, 5, 2};
    ib_sampling p = settings(1.0f, 0, 1.0f, 0.0f, 1);
    CHECK_EQ_INT(ib_sample_logits(l, 4, &p, 0, NULL, 0, NULL), 2);
    CHECK_EQ_INT(ib_sample_logits(NULL, 4, &p, 0, NULL, 0, NULL), -1);
}

static void test_digest(void)
{
    /* published FNV-1a 64-bit test vectors */
    CHECK(ib_digest_bytes(IB_DIGEST_INIT, "", 0) == 0xcbf29ce484222325ULL, "empty");
    CHECK(ib_digest_bytes(IB_DIGEST_INIT, "a", 1) == 0xaf63dc4c8601ec8cULL, "\"a\": %llx",
          (unsigned long long)ib_digest_bytes(IB_DIGEST_INIT, "a", 1));
    CHECK(ib_digest_bytes(IB_DIGEST_INIT, "foobar", 6) == 0x85944171f73967e8ULL, "\"foobar\": %llx",
          (unsigned long long)ib_digest_bytes(IB_DIGEST_INIT, "foobar", 6));
    /* continuing from h equals hashing the concatenation */
    uint64_t h = ib_digest_bytes(ib_digest_bytes(IB_DIGEST_INIT, "foo", 3), "bar", 3);
    CHECK(h == 0x85944171f73967e8ULL, "chained: %llx", (unsigned long long)h);
}

/* ---------------------------------------------------------------- stages */

static void test_stages(ib_sample_scratch *sc)
{
    enum { V = 1000 };
    static float l[V];
    int fails_k1 = 0, fails_p = 0, fails_m = 0;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < V; i++) l[i] = next_gauss() * 3.0f;
        int am = ib_argmax(l, V);
        ib_sampling p = settings(1.5f, 1, 1.0f, 0.0f, (uint64_t)trial);
        fails_k1 += ib_sample_logits(l, V, &p, (uint64_t)trial, NULL, 0, sc) != am;
        p = settings(1.0f, 0, 1e-6f, 0.0f, (uint64_t)trial);
        fails_p += ib_sample_logits(l, V, &p, (uint64_t)trial, NULL, 0, sc) != am;
        p = settings(2.0f, 0, 1.0f, 1.0f, (uint64_t)trial);
        fails_m += ib_sample_logits(l, V, &p, (uint64_t)trial, NULL, 0, sc) != am;
    }
    CHECK_EQ_INT(fails_k1, 0);
    CHECK_EQ_INT(fails_p, 0);
    CHECK_EQ_INT(fails_m, 0);

    /* top_k = 1 with ties keeps the lowest id */
    const float t[5] = {0, 4, 1, 4, 4};
    ib_sampling p = settings(1.0f, 1, 1.0f, 0.0f, 5);
    for (int s = 0; s < 50; s++) CHECK_EQ_INT(ib_sample_logits(t, 5, &p, (uint64_t)s, NULL, 0, sc), 1);
    /* top_k = 2 with a 3-way tie keeps ids 1 and 3, never 4 */
    p.top_k = 2;
    int seen[5] = {0};
    for (int s = 0; s < 2000; s++) seen[ib_sample_logits(t, 5, &p, (uint64_t)s, NULL, 0, sc)]++;
    CHECK(seen[0] == 0 && seen[2] == 0 && seen[4] == 0 && seen[1] > 800 && seen[3] > 800,
          "top-2 of a tie: %d %d %d %d %d", seen[0], seen[1], seen[2], seen[3], seen[4]);

    /* top-p boundary: four equal logits have p = 0.25 exactly; top_p = 0.5 is reached (>=) after two */
    const float four[4] = {2.0f, 2.0f, 2.0f, 2.0f};
    p = settings(1.0f, 0, 0.5f, 0.0f, 6);
    int four_seen[4] = {0};
    for (int s = 0; s < 2000; s++) four_seen[ib_sample_logits(four, 4, &p, (uint64_t)s, NULL, 0, sc)]++;
    CHECK(four_seen[2] == 0 && four_seen[3] == 0 && four_seen[0] > 850 && four_seen[1] > 850,
          "top-p 0.5 of four equal: %d %d %d %d", four_seen[0], four_seen[1], four_seen[2], four_seen[3]);

    /* NaN logits are -inf: never drawn; +inf logits take all the mass */
    const float nanl[4] = {NAN, 0.0f, NAN, 0.0f};
    const float infl[4] = {1.0f, INFINITY, 2.0f, INFINITY};
    int bad_nan = 0, bad_inf = 0, inf1 = 0;
    p = settings(1.0f, 0, 1.0f, 0.0f, 9);
    for (int s = 0; s < 2000; s++) {
        int a = ib_sample_logits(nanl, 4, &p, (uint64_t)s, NULL, 0, sc);
        bad_nan += a != 1 && a != 3;
        int b = ib_sample_logits(infl, 4, &p, (uint64_t)s, NULL, 0, sc);
        bad_inf += b != 1 && b != 3;
        inf1 += b == 1;
    }
    CHECK_EQ_INT(bad_nan, 0);
    CHECK_EQ_INT(bad_inf, 0);
    CHECK(inf1 > 850 && inf1 < 1150, "two +inf logits: %d of 2000 to the first", inf1);
    /* all -inf: still a valid id */
    const float ninf[3] = {-INFINITY, -INFINITY, NAN};
    int a = ib_sample_logits(ninf, 3, &p, 0, NULL, 0, sc);
    CHECK(a >= 0 && a < 3, "all -inf gave %d", a);

    /* repetition penalty */
    const float r[4] = {5.0f, 3.0f, -1.0f, 4.0f};
    ib_sampling g = ib_sampling_default();
    g.repeat_penalty = 1.5f;
    const int32_t h1[1] = {0};
    CHECK_EQ_INT(ib_sample_logits(r, 4, &g, 0, h1, 1, sc), 3); /* 5/1.5 = 3.33 < 4 */
    const int32_t h2[3] = {0, 0, 0};                            /* once: 3.33 > 3 ... */
    g.repeat_penalty = 1.3f;                                    /* 5/1.3 = 3.85 < 4 */
    const float r2[4] = {5.0f, 3.0f, -1.0f, 3.5f};
    CHECK_EQ_INT(ib_sample_logits(r2, 4, &g, 0, h2, 3, sc), 0); /* 3.85 > 3.5 (3 times: 2.28 < 3.5) */
    g.repeat_penalty = 1.5f;
    const int32_t h3[3] = {0, 1, 3};
    g.repeat_last_n = 1; /* only id 3 penalised: 4/1.5 = 2.67; id 0 stays best */
    CHECK_EQ_INT(ib_sample_logits(r, 4, &g, 0, h3, 3, sc), 0);
    g.repeat_last_n = 0; /* whole history: 3.33, 2, -1, 2.67 -> id 0 */
    CHECK_EQ_INT(ib_sample_logits(r, 4, &g, 0, h3, 3, sc), 0);
    const float neg[3] = {-1.0f, -1.2f, -5.0f};
    const int32_t h4[1] = {0};
    CHECK_EQ_INT(ib_sample_logits(neg, 3, &g, 0, h4, 1, sc), 1); /* -1 * 1.5 = -1.5 < -1.2 */
    const int32_t hbad[2] = {-4, 99};                            /* out-of-range ids ignored */
    CHECK_EQ_INT(ib_sample_logits(r, 4, &g, 0, hbad, 2, sc), 0);
    g.repeat_penalty = 1.0f;
    CHECK_EQ_INT(ib_sample_logits(r, 4, &g, 0, h1, 1, sc), 0);
    /* the penalty moves the sampled argmax too (top_k = 1) */
    ib_sampling s1 = settings(0.7f, 1, 1.0f, 0.0f, 3);
    s1.repeat_penalty = 1.5f;
    CHECK_EQ_INT(ib_sample_logits(r, 4, &s1, 11, h1, 1, sc), 3);
    /* logits are not modified */
    CHECK(r[0] == 5.0f && r[3] == 4.0f, "logits modified");
}

/* ---------------------------------------------------------------- distributions */

/* Chi-square of counts[V] against probabilities prob[V] over n draws (cells with prob 0 must be 0). */
static double chi_square(const int *counts, const double *prob, int V, int n, int *impossible)
{
    double chi = 0;
    *impossible = 0;
    for (int i = 0; i < V; i++) {
        if (prob[i] == 0) {
            *impossible += counts[i];
            continue;
        }
        double e = prob[i] * n;
        chi += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi;
}

/* softmax(l / T) over the ids flagged in keep (libm, double). */
static void softmax_ref(const float *l, int V, double T, const int *keep, double *prob)
{
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++)
        if (keep[i] && l[i] / T > mx) mx = l[i] / T;
    for (int i = 0; i < V; i++) {
        prob[i] = keep[i] ? exp(l[i] / T - mx) : 0.0;
        s += prob[i];
    }
    for (int i = 0; i < V; i++) prob[i] /= s;
}

static void test_distribution(ib_sample_scratch *sc)
{
    enum { V = 6, N = 200000 };
    const float l[V] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
    int counts[V], keep[V], imp;
    double prob[V];
    /* chi-square critical values at p = 1e-4: 5 dof 25.7, 2 dof 18.4, 1 dof 15.1, 3 dof 21.1 */

    /* plain temperature, draws over steps of one seed */
    for (int i = 0; i < V; i++) keep[i] = 1;
    softmax_ref(l, V, 0.8, keep, prob);
    ib_sampling p = settings(0.8f, 0, 1.0f, 0.0f, 42);
    memset(counts, 0, sizeof counts);
    for (int s = 0; s < N; s++) counts[ib_sample_logits(l, V, &p, (uint64_t)s, NULL, 0, sc)]++;
    double chi = chi_square(counts, prob, V, N, &imp);
    printf("T=0.8 over steps: chi-square %.2f (5 dof)\n", chi);
    CHECK(chi < 25.7, "T=0.8 steps: chi-square %.2f", chi);

    /* the same over seeds at one step */
    memset(counts, 0, sizeof counts);
    for (int s = 0; s < N; s++) {
        p.seed = (uint64_t)s;
        counts[ib_sample_logits(l, V, &p, 17, NULL, 0, sc)]++;
    }
    chi = chi_square(counts, prob, V, N, &imp);
    printf("T=0.8 over seeds: chi-square %.2f (5 dof)\n", chi);
    CHECK(chi < 25.7, "T=0.8 seeds: chi-square %.2f", chi);

    /* T = 2 with a wrong distribution must be rejected by the same statistic (the test can fail) */
    double wrong[V];
    softmax_ref(l, V, 1.0, keep, wrong);
    p = settings(2.0f, 0, 1.0f, 0.0f, 43);
    memset(counts, 0, sizeof counts);
    for (int s = 0; s < N; s++) counts[ib_sample_logits(l, V, &p, (uint64_t)s, NULL, 0, sc)]++;
    softmax_ref(l, V, 2.0, keep, prob);
    chi = chi_square(counts, prob, V, N, &imp);
    double chi_wrong = chi_square(counts, wrong, V, N, &imp);
    CHECK(chi < 25.7, "T=2: chi-square %.2f", chi);
    CHECK(chi_wrong > 1000, "T=2 draws look like T=1: chi-square %.2f", chi_wrong);

    /* top-k = 3: ids 1, 4, 0 renormalised */
    for (int i = 0; i < V; i++) keep[i] = (i == 1 || i == 4 || i == 0);
    softmax_ref(l, V, 1.0, keep, prob);
    p = settings(1.0f, 3, 1.0f, 0.0f, 44);
    memset(counts, 0, sizeof counts);
    for (int s = 0; s < N; s++) counts[ib_sample_logits(l, V, &p, (uint64_t)s, NULL, 0, sc)]++;
    chi = chi_square(counts, prob, V, N, &imp);
    CHECK(imp == 0 && chi < 18.4, "top-k 3: chi-square %.2f, %d draws outside", chi, imp);

    /* top-p 0.6: at T=1 the sorted probabilities are id1 .420, id4 .255, id0 .154, ...; the prefix
     * (decided here with libm) is {1, 4} with mass .675, far from the 0.6 boundary */
    for (int i = 0; i < V; i++) keep[i] = 1;
    softmax_ref(l, V, 1.0, keep, prob);
    double top_p = 0.6, c = 0;
    int order[V] = {1, 4, 0, 2, 5, 3};
    for (int i = 0; i < V; i++) keep[i] = 0;
    for (int j = 0; j < V; j++) {
        keep[order[j]] = 1;
        c += prob[order[j]];
        if (c >= top_p) break;
    }
    softmax_ref(l, V, 1.0, keep, prob);
    p = settings(1.0f, 0, (float)top_p, 0.0f, 45);
    memset(counts, 0, sizeof counts);
    for (int s = 0; s < N; s++) counts[ib_sample_logits(l, V, &p, (uint64_t)s, NULL, 0, sc)]++;
    chi = chi_square(counts, prob, V, N, &imp);
    CHECK(keep[1] && keep[4] && !keep[2], "test setup: top-p prefix");
    CHECK(imp == 0 && chi < 18.4, "top-p 0.6: chi-square %.2f, %d draws outside", chi, imp);

    /* min-p 0.3: keep p >= 0.3 * p_max, i.e. logits >= 2 + ln 0.3 = 0.796: ids 1, 4, 0 */
    for (int i = 0; i < V; i++) keep[i] = l[i] >= 2.0f + (float)log(0.3);
    softmax_ref(l, V, 1.0, keep, prob);
    p = settings(1.0f, 0, 1.0f, 0.3f, 46);
    memset(counts, 0, sizeof counts);
    for (int s = 0; s < N; s++) counts[ib_sample_logits(l, V, &p, (uint64_t)s, NULL, 0, sc)]++;
    chi = chi_square(counts, prob, V, N, &imp);
    CHECK(keep[0] && keep[1] && keep[4] && !keep[2], "test setup: min-p set");
    CHECK(imp == 0 && chi < 18.4, "min-p 0.3: chi-square %.2f, %d draws outside", chi, imp);
}

/* ---------------------------------------------------------------- determinism */

static void test_determinism(ib_sample_scratch *sc)
{
    enum { V = 5000, STEPS = 300 };
    static float l[V], other[V];
    static int32_t first[STEPS];
    for (int i = 0; i < V; i++) l[i] = next_gauss() * 2.0f;
    for (int i = 0; i < V; i++) other[i] = next_gauss() * 5.0f;
    ib_sampling p = settings(1.0f, 0, 0.95f, 0.0f, 77);
    for (int s = 0; s < STEPS; s++) first[s] = ib_sample_logits(l, V, &p, (uint64_t)s, NULL, 0, sc);
    /* again, in reverse step order, with unrelated calls in between */
    int diff = 0;
    ib_sampling q = settings(0.5f, 40, 0.9f, 0.05f, 5);
    for (int s = STEPS - 1; s >= 0; s--) {
        (void)ib_sample_logits(other, V, &q, (uint64_t)(s * 7), NULL, 0, sc);
        diff += ib_sample_logits(l, V, &p, (uint64_t)s, NULL, 0, sc) != first[s];
    }
    CHECK_EQ_INT(diff, 0);
    /* different seeds differ somewhere, and steps differ somewhere */
    ib_sampling p2 = p;
    p2.seed = 78;
    int seed_diff = 0, step_diff = 0;
    for (int s = 0; s < STEPS; s++) {
        seed_diff += ib_sample_logits(l, V, &p2, (uint64_t)s, NULL, 0, sc) != first[s];
        step_diff += first[s] != first[0];
    }
    CHECK(seed_diff > STEPS / 2, "seeds 77 and 78 differ at only %d of %d steps", seed_diff, STEPS);
    CHECK(step_diff > STEPS / 2, "steps give the same token %d times", STEPS - step_diff);
}

/* ---------------------------------------------------------------- reference comparison */

typedef struct cand {
    float v;
    int32_t id;
} cand;

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

static float ref_canon(float v)
{
    if (isnan(v)) return -INFINITY;
    return v == 0.0f ? 0.0f : v;
}

/* The pipeline of sampler.h (with sampler.c's documented details) written plainly: qsort of the whole
 * vocabulary. Fills ids[n]/prob[n] (the kept candidates with their unnormalised p) and returns n.
 * Only for temperature > 0. */
static int ref_prepare(const float *logits, int V, const ib_sampling *p, const int32_t *hist, int nh, cand *c,
                       double *prob, int32_t *kept, unsigned char *mark)
{
    for (int i = 0; i < V; i++) {
        c[i].v = ref_canon(logits[i]);
        c[i].id = i;
        mark[i] = 0;
    }
    if (p->repeat_penalty != 1.0f) {
        int from = p->repeat_last_n > 0 && p->repeat_last_n < nh ? nh - p->repeat_last_n : 0;
        for (int h = from; h < nh; h++) {
            int t = hist[h];
            if (t < 0 || t >= V || mark[t]) continue;
            mark[t] = 1;
            float l = c[t].v;
            c[t].v = ref_canon(l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty);
        }
    }
    for (int i = 0; i < V; i++) c[i].v = ref_canon(c[i].v / p->temperature);
    qsort(c, (size_t)V, sizeof *c, cand_cmp);
    int n = (p->top_k > 0 && p->top_k < V) ? p->top_k : V;
    float mx = c[0].v;
    double sum = 0;
    int m = 0;
    for (int j = 0; j < n; j++) {
        float w = ib_expf(c[j].v == mx ? 0.0f : c[j].v - mx);
        sum += w;
        if (w > 0) {
            prob[m] = w;
            kept[m] = c[j].id;
            m++;
        }
    }
    for (int j = 0; j < m; j++) prob[j] /= sum;
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double cum = 0;
        for (int j = 0; j < m; j++) {
            cum += prob[j];
            if (cum >= (double)p->top_p) {
                m = j + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        double pmax = prob[0];
        for (int j = 1; j < m; j++) pmax = prob[j] > pmax ? prob[j] : pmax;
        int k = 1;
        for (int j = 1; j < m; j++) {
            if (prob[j] >= (double)p->min_p * pmax) {
                prob[k] = prob[j];
                kept[k] = kept[j];
                k++;
            }
        }
        m = k;
    }
    return m;
}

static int32_t ref_draw(const double *prob, const int32_t *kept, int m, uint64_t seed, uint64_t step)
{
    double total = 0, cum = 0;
    for (int j = 0; j < m; j++) total += prob[j];
    double target = ib_rng_uniform(seed, step) * total;
    for (int j = 0; j < m; j++) {
        cum += prob[j];
        if (cum > target) return kept[j];
    }
    return kept[m - 1];
}

static void test_reference(ib_sample_scratch *sc)
{
    enum { V = 151936, DRAWS = 60 };
    static float l[V];
    static cand c[V];
    static double prob[V];
    static int32_t kept[V];
    static unsigned char mark[V];
    int32_t hist[64];
    for (int i = 0; i < 64; i++) hist[i] = (int32_t)(next_u64() % 300);
    struct {
        float temp;
        int k;
        float top_p, min_p, pen;
        int last_n;
        float scale;
    } cfg[] = {
        {1.0f, 40, 1.0f, 0.0f, 1.0f, 0, 3.0f},      {0.7f, 0, 0.9f, 0.0f, 1.0f, 0, 3.0f},
        {1.0f, 0, 1.0f, 0.0f, 1.0f, 0, 3.0f},       {1.3f, 0, 0.95f, 0.05f, 1.1f, 32, 3.0f},
        {0.6f, 20, 0.8f, 0.1f, 1.2f, 0, 2.0f},      {1.0f, 1000, 0.99f, 0.0f, 1.0f, 0, 1.0f},
        {1.0f, 0, 0.999f, 0.0f, 1.0f, 0, 0.25f},    {5.0f, 0, 1.0f, 0.001f, 0.8f, 10, 8.0f},
        {0.05f, 0, 0.5f, 0.0f, 1.0f, 0, 3.0f},      {1.0f, 7, 1.0f, 0.0f, 1.0f, 0, 0.0f},
    };
    int n_cfg = (int)(sizeof cfg / sizeof cfg[0]);
    double t_full = 0, t_topk = 0;
    int n_full = 0, n_topk = 0;
    for (int ci = 0; ci < n_cfg; ci++) {
        /* logits: scaled noise, quantised so equal values (ties) are common, a few NaN / -inf */
        for (int i = 0; i < V; i++) l[i] = roundf(next_gauss() * 64.0f) / 64.0f * cfg[ci].scale;
        for (int i = 0; i < 50; i++) l[next_u64() % V] = NAN;
        for (int i = 0; i < 50; i++) l[next_u64() % V] = -INFINITY;
        if (cfg[ci].scale == 0.0f) l[12345] = 1.0f; /* all equal but one */
        ib_sampling p = settings(cfg[ci].temp, cfg[ci].k, cfg[ci].top_p, cfg[ci].min_p, 1000 + (uint64_t)ci);
        p.repeat_penalty = cfg[ci].pen;
        p.repeat_last_n = cfg[ci].last_n;
        int m = ref_prepare(l, V, &p, hist, 64, c, prob, kept, mark);
        int mismatch = 0, distinct = 0;
        int32_t prev = -1;
        for (int d = 0; d < DRAWS; d++) {
            uint64_t step = (uint64_t)d * 3 + 1;
            clock_t t0 = clock();
            int32_t got = ib_sample_logits(l, V, &p, step, hist, 64, sc);
            double dt = (double)(clock() - t0) / CLOCKS_PER_SEC;
            if (cfg[ci].k > 0) { t_topk += dt; n_topk++; } else { t_full += dt; n_full++; }
            int32_t want = ref_draw(prob, kept, m, p.seed, step);
            if (got != want) {
                if (mismatch == 0)
                    fprintf(stderr, "config %d step %llu: got %d want %d (kept %d)\n", ci, (unsigned long long)step,
                            got, want, m);
                mismatch++;
            }
            distinct += got != prev;
            prev = got;
        }
        CHECK(mismatch == 0, "config %d: %d of %d draws differ from the reference", ci, mismatch, DRAWS);
        if (m > 20) CHECK(distinct > 10, "config %d: only %d token changes over %d draws", ci, distinct, DRAWS);
    }
    printf("vocab %d: %.3f ms per call with top-k, %.3f ms per call with a full sort\n", V,
           1e3 * t_topk / (n_topk ? n_topk : 1), 1e3 * t_full / (n_full ? n_full : 1));
}

int main(void)
{
    ib_sample_scratch sc;
    ib_error err;
    if (ib_sample_scratch_init(&sc, 151936, &err) != IB_OK) {
        fprintf(stderr, "scratch: %s\n", err.msg);
        return 1;
    }
    test_rng_uniform();
    test_argmax(&sc);
    test_defaults_and_scratch();
    test_digest();
    test_stages(&sc);
    test_distribution(&sc);
    test_determinism(&sc);
    test_reference(&sc);
    ib_sample_scratch_free(&sc);
    TEST_MAIN_END("test_sampler");
}
