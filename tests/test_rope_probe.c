/*
 * test_rope_probe.c — the regression probe from the MLX batched-RoPE report (ml-explore/mlx #3496):
 * a [B, H, T, D] input whose batch rows are identical must give identical output rows, each equal to
 * the B = 1 result, for B in {2,4,8}, H in {1,4,7}, D in {64,128}, offsets 0 and 148, T in {1,2}.
 * A second probe gives each batch row its own offset and compares it with its own B = 1 run. Both
 * probes must fail under the rope-skip-rows and rope-scalar-offset faults.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "isobatch.h"
#include "ops/ops.h"

/* Apply the step's RoPE path (positions, table, rotation) to x [B*T][H][D] where batch row b starts
 * at position off[b]. */
static void rope_batch(float *x, int B, int T, int H, int D, const int32_t *off) {
    int R = B * T;
    int32_t *pos = malloc(R * sizeof *pos), *rp = malloc(R * sizeof *rp);
    int *len = malloc(B * sizeof *len);
    float *cs = malloc((size_t)R * D * sizeof *cs);
    for (int b = 0; b < B; b++) {
        len[b] = T;
        for (int t = 0; t < T; t++) pos[b * T + t] = off[b] + t;
    }
    ib_rope_positions(pos, len, B, rp);
    ib_rope_table(rp, R, D, 10000.0, cs);
    ib_rope_step(x, R, H, D, cs, B);
    free(pos);
    free(rp);
    free(len);
    free(cs);
}

/* Run both probes over the whole matrix; return the number of failing cases (and CHECK each case when
 * expect_clean). */
static int probe(int expect_clean) {
    static const int Bs[] = {2, 4, 8}, Hs[] = {1, 4, 7}, Ds[] = {64, 128}, offs[] = {0, 148}, Ts[] = {1, 2};
    int failures = 0;
    uint64_t seed = 12345;
    for (int bi = 0; bi < 3; bi++)
        for (int hi = 0; hi < 3; hi++)
            for (int di = 0; di < 2; di++)
                for (int oi = 0; oi < 2; oi++)
                    for (int ti = 0; ti < 2; ti++) {
                        int B = Bs[bi], H = Hs[hi], D = Ds[di], T = Ts[ti], off = offs[oi];
                        size_t row = (size_t)H * D, n1 = (size_t)T * row;
                        float *one = malloc(n1 * sizeof *one), *x = malloc(B * n1 * sizeof *x);
                        float *y = malloc(B * n1 * sizeof *y), *ref = malloc(B * n1 * sizeof *ref);
                        for (size_t i = 0; i < n1; i++) {
                            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                            one[i] = (float)((int64_t)(seed >> 33) % 2001 - 1000) / 500.0f;
                        }
                        /* probe 1: identical rows, identical offsets */
                        int32_t offv[8], off1[1] = {off};
                        for (int b = 0; b < B; b++) {
                            memcpy(x + b * n1, one, n1 * sizeof *x);
                            offv[b] = off;
                        }
                        memcpy(ref, one, n1 * sizeof *ref);
                        rope_batch(ref, 1, T, H, D, off1);
                        rope_batch(x, B, T, H, D, offv);
                        int bad1 = 0;
                        for (int b = 0; b < B; b++) bad1 |= memcmp(x + b * n1, ref, n1 * sizeof *x) != 0;
                        /* probe 2: identical rows, each its own offset, vs each row alone */
                        for (int b = 0; b < B; b++) {
                            memcpy(y + b * n1, one, n1 * sizeof *y);
                            offv[b] = off + 37 * b;
                        }
                        rope_batch(y, B, T, H, D, offv);
                        int bad2 = 0;
                        for (int b = 0; b < B; b++) {
                            int32_t ob[1] = {offv[b]};
                            memcpy(ref, one, n1 * sizeof *ref);
                            rope_batch(ref, 1, T, H, D, ob);
                            bad2 |= memcmp(y + b * n1, ref, n1 * sizeof *y) != 0;
                        }
                        if (expect_clean) {
                            CHECK(!bad1, "identical rows differ: B=%d H=%d T=%d D=%d offset=%d", B, H, T, D, off);
                            CHECK(!bad2, "row != its B=1 run: B=%d H=%d T=%d D=%d offset=%d+37b", B, H, T, D, off);
                        }
                        failures += bad1 + bad2;
                        free(one);
                        free(x);
                        free(y);
                        free(ref);
                    }
    return failures;
}

int main(void) {
    int clean = probe(1);
    CHECK_EQ_INT(clean, 0);
    /* the probe must catch the MLX bug (rows >= 1 skipped at T = 1) … */
    ib_fault_set(IB_FAULT_ROPE_SKIP_ROWS);
    int skip = probe(0);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(skip > 0, "rope-skip-rows fault not detected");
    /* … and one offset applied to the whole batch */
    ib_fault_set(IB_FAULT_ROPE_SCALAR_OFFSET);
    int scalar = probe(0);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(scalar > 0, "rope-scalar-offset fault not detected");
    printf("rope probe: 144 cases clean; faults flagged %d (skip-rows) and %d (scalar-offset) cases\n", skip, scalar);
    TEST_MAIN_END("test_rope_probe");
}
