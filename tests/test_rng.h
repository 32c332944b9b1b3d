/*
 * test_rng.h — the deterministic random numbers the matmul tests draw from (splitmix64). Define
 * TEST_RNG_SEED before including to pick the sequence.
 */
#ifndef IB_TESTS_TEST_RNG_H
#define IB_TESTS_TEST_RNG_H
#include <stdint.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ULL
#endif

static uint64_t rng_state = TEST_RNG_SEED;
static uint64_t rnd64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static float rndf(void) { return (float)((double)(rnd64() >> 11) * 0x1.0p-53 * 2.0 - 1.0); } /* [-1, 1) */
static int rndi(int n) { return (int)(rnd64() % (uint64_t)n); }

#endif
