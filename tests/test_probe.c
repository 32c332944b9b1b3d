/*
 * test_probe.c — the op probe (src/diag/probe.c) on a trimmed shape matrix:
 *   - clean: every case of every op passes, and the matrix has the expected number of cases;
 *   - each injected fault is flagged in the op it breaks, at exactly the shapes where the fault's
 *     definition (isobatch.h) says it changes a row, and in no other op or shape;
 *   - the ops added for the probe (interleaved RoPE, windowed attention) against float64 references.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "diag/diag.h"
#include "isobatch.h"
#include "ops/ops.h"

static const int Bs[] = {1, 2, 3}, Ts[] = {1, 2, 7, 64}, Ps[] = {0, 1, 148};
#define NB 3
#define NT 4
#define NP 3

static int starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static int ends(const char *s, const char *p) {
    size_t a = strlen(s), b = strlen(p);
    return a >= b && strcmp(s + a - b, p) == 0;
}

/* Whether fault f changes some row of op at this case, from the fault's definition alone:
 *   rope-scalar-offset  every row rotated with the first row's position: visible when items have
 *                       different positions (row-pos RoPE) and B >= 2;
 *   rope-skip-rows      rows >= 1 not rotated when every item brings one token: T == 1, B >= 2, except
 *                       when all rows sit at position 0 (rotation by 0 is the identity);
 *   gemv-gemm           another order when a product has > 1 row: the batched product has B*T rows, the
 *                       item alone T, so only T == 1 with B >= 2 differs;
 *   split-kv-by-batch   key blocks of 16 instead of 32 when B > 1: differs once a row sees > 16 keys;
 *   row-order           odd rows of an ib_rmsnorm call reversed: item b's rows keep their parity alone
 *                       unless b*T is odd, i.e. B >= 2 and T odd. */
static int expected(ib_fault f, const ib_probe_case *c) {
    const char *op = c->op->name;
    switch (f) {
    case IB_FAULT_ROPE_SCALAR_OFFSET: return starts(op, "rope/") && ends(op, "/row-pos") && c->B >= 2;
    case IB_FAULT_ROPE_SKIP_ROWS:
        return starts(op, "rope/") && c->T == 1 && c->B >= 2 && !(ends(op, "/scalar-pos") && c->pos == 0);
    case IB_FAULT_GEMV_GEMM: return starts(op, "matmul/") && c->B >= 2 && c->T == 1;
    case IB_FAULT_SPLIT_KV_BY_BATCH: return starts(op, "attention") && c->B >= 2 && c->pos + c->T > IB_ATTN_BLOCK / 2;
    case IB_FAULT_ROW_ORDER: return strcmp(op, "rmsnorm") == 0 && c->B >= 2 && (c->T & 1);
    default: return 0;
    }
}

typedef struct tally {
    ib_fault fault;
    int cases, failed, unexpected, missed, wrong_reason;
    int ops_failed[64];   /* per op index: failing cases */
    char first_bad[160];
} tally;

static int op_index(const ib_probe_op_info *op) {
    for (int i = 0; i < ib_probe_n_ops(); i++)
        if (ib_probe_op(i) == op) return i;
    return 63;
}

static void on_case(void *ctx, const ib_probe_case *c) {
    tally *t = ctx;
    t->cases++;
    if (c->fail) {
        t->failed++;
        t->ops_failed[op_index(c->op)]++;
    }
    int exact = t->fault == IB_FAULT_NONE || t->fault == IB_FAULT_ROPE_SCALAR_OFFSET ||
                t->fault == IB_FAULT_ROPE_SKIP_ROWS || t->fault == IB_FAULT_GEMV_GEMM ||
                t->fault == IB_FAULT_SPLIT_KV_BY_BATCH || t->fault == IB_FAULT_ROW_ORDER;
    if (!exact) return;
    int want = expected(t->fault, c), got = c->fail != 0;
    if (want && !got) t->missed++;
    if (!want && got) t->unexpected++;
    /* batch faults are batch failures, never ISA ones */
    if (got && (!(c->fail & IB_PROBE_FAIL_BATCH) || (c->fail & IB_PROBE_FAIL_ISA))) t->wrong_reason++;
    if (want != got && !t->first_bad[0])
        snprintf(t->first_bad, sizeof t->first_bad, "%s %s [%d,%d,%d,%d] pos %d: expected %s, got fail=%d", c->op->name,
                 ib_isa_name(c->isa), c->B, c->H, c->T, c->D, c->pos, want ? "a failure" : "a pass", c->fail);
}

static ib_isa isas[3];
static int n_isa;

static tally run(ib_fault f, int threads) {
    tally t;
    memset(&t, 0, sizeof t);
    t.fault = f;
    ib_probe_opts o = {.isas = isas, .n_isas = n_isa, .Bs = Bs, .n_B = NB, .Ts = Ts, .n_T = NT, .pos = Ps, .n_pos = NP,
                       .threads = threads, .seed = 1};
    ib_error err;
    int n_fail = -1;
    ib_fault_set(f);
    ib_status rc = ib_probe_run(&o, on_case, &t, &n_fail, &err);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(rc == IB_OK, "probe under %s: %s", ib_fault_name(f), err.msg);
    CHECK_EQ_INT(n_fail, t.failed);
    return t;
}

/* Cases the trimmed matrix must hold: per op, backends (ISA-dependent ops) x B x T x positions (ops
 * with a position). */
static int expected_cases(void) {
    int n = 0;
    for (int i = 0; i < ib_probe_n_ops(); i++) {
        const ib_probe_op_info *op = ib_probe_op(i);
        n += (op->isa_dep ? n_isa : 1) * NB * NT * (op->uses_pos ? NP : 1);
    }
    return n;
}

static int find_op(const char *name) {
    for (int i = 0; i < ib_probe_n_ops(); i++)
        if (!strcmp(ib_probe_op(i)->name, name)) return i;
    return -1;
}

/* ---- the probe's own ops against float64 references ---- */

static uint64_t rs = 99;
static float rnd(void) {
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rs >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static void check_new_ops(void) {
    /* interleaved RoPE: pairs (2i, 2i+1) rotated by pos * theta^(-2i/hd) */
    enum { R = 3, H = 2, HD = 16 };
    float x[R * H * HD], y[R * H * HD], cs[R * HD];
    int32_t pos[R] = {0, 5, 4000};
    for (int i = 0; i < R * H * HD; i++) x[i] = y[i] = rnd();
    ib_rope_table(pos, R, HD, 10000.0, cs);
    ib_rope_interleaved(y, R, H, HD, cs);
    double worst = 0;
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HD / 2; i++) {
                double ang = pos[r] * pow(10000.0, -2.0 * i / HD);
                const float *v = x + (r * H + h) * HD;
                double a = v[2 * i], b = v[2 * i + 1];
                double e0 = a * cos(ang) - b * sin(ang), e1 = b * cos(ang) + a * sin(ang);
                const float *w = y + (r * H + h) * HD;
                worst = fmax(worst, fmax(fabs(w[2 * i] - e0), fabs(w[2 * i + 1] - e1)));
            }
    CHECK(worst < 1e-5, "interleaved rope: max error %g vs float64", worst);
    /* rope_step_layout HALVES == ib_rope_step */
    memcpy(y, x, sizeof x);
    float z[R * H * HD];
    memcpy(z, x, sizeof x);
    ib_rope_step(y, R, H, HD, cs, R);
    ib_rope_step_layout(z, R, H, HD, cs, R, IB_ROPE_HALVES);
    CHECK(memcmp(y, z, sizeof y) == 0, "ib_rope_step_layout(HALVES) differs from ib_rope_step");
    /* ib_rope_step_rows one row at a time == ib_rope_step on the whole step, with and without the
     * rope-skip-rows fault (which must still leave rows 1.. unrotated) */
    for (int f = 0; f < 2; f++) {
        ib_fault_set(f ? IB_FAULT_ROPE_SKIP_ROWS : IB_FAULT_NONE);
        memcpy(y, x, sizeof x);
        memcpy(z, x, sizeof x);
        ib_rope_step(y, R, H, HD, cs, R);
        for (int r = 0; r < R; r++) ib_rope_step_rows(z, r, r + 1, R, H, HD, cs, R);
        CHECK(memcmp(y, z, sizeof y) == 0, "ib_rope_step_rows row by row differs from ib_rope_step (fault %d)", f);
        CHECK((memcmp(z + H * HD, x + H * HD, sizeof(float) * H * HD) == 0) == f,
              "rope-skip-rows %s row 1 under ib_rope_step_rows", f ? "rotated" : "left unrotated");
    }
    ib_fault_set(IB_FAULT_NONE);

    /* windowed attention: softmax over the last `window` keys only */
    enum { NK = 100, D = 32 };
    static float k[NK * D], v[NK * D], q[D], out[D], ref[D];
    for (int i = 0; i < NK * D; i++) k[i] = rnd(), v[i] = rnd();
    for (int i = 0; i < D; i++) q[i] = rnd();
    float scale = 1.0f / sqrtf((float)D);
    const int windows[] = {1, 7, 32, 33, 70, 99};
    for (int wi = 0; wi < 6; wi++) {
        int w = windows[wi], lo = NK - w;
        double s[NK], mx = -1e300, l = 0;
        for (int j = lo; j < NK; j++) {
            double d = 0;
            for (int t = 0; t < D; t++) d += (double)q[t] * k[j * D + t];
            s[j] = d * scale;
            mx = fmax(mx, s[j]);
        }
        double acc[D] = {0};
        for (int j = lo; j < NK; j++) {
            double p = exp(s[j] - mx);
            l += p;
            for (int t = 0; t < D; t++) acc[t] += p * v[j * D + t];
        }
        ib_attend_one_window(q, k, v, NK, D, D, scale, IB_ATTN_BLOCK, w, out);
        double e = 0;
        for (int t = 0; t < D; t++) e = fmax(e, fabs(out[t] - acc[t] / l));
        CHECK(e < 1e-5, "windowed attention, window %d: max error %g vs float64", w, e);
    }
    /* window 0 and window >= keys are the plain op, bitwise */
    ib_attend_one(q, k, v, NK, D, D, scale, IB_ATTN_BLOCK, ref);
    ib_attend_one_window(q, k, v, NK, D, D, scale, IB_ATTN_BLOCK, 0, out);
    CHECK(memcmp(out, ref, sizeof out) == 0, "window 0 differs from ib_attend_one");
    ib_attend_one_window(q, k, v, NK, D, D, scale, IB_ATTN_BLOCK, NK, out);
    CHECK(memcmp(out, ref, sizeof out) == 0, "window = n_keys differs from ib_attend_one");
    /* decode vs prefill walk the same blocks: key count grows one by one, same as a fresh call */
    CHECK_EQ_INT(ib_attn_block_for(1), IB_ATTN_BLOCK);
    CHECK_EQ_INT(ib_attn_block_for(7), IB_ATTN_BLOCK);
}

int main(void) {
    /* the ISAs of this build's architecture */
#if defined(__aarch64__)
    const ib_isa all[] = {IB_ISA_SCALAR, IB_ISA_NEON};
#else
    const ib_isa all[] = {IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512};
    if (!ib_isa_supported(IB_ISA_AVX512)) printf("test_probe: AVX-512 not on this CPU: its probe cases skipped\n");
#endif
    for (int i = 0; i < (int)(sizeof all / sizeof all[0]); i++)
        if (ib_isa_supported(all[i])) isas[n_isa++] = all[i];
    int has_vec = n_isa > 1;

    check_new_ops();

    /* option checks */
    {
        ib_probe_opts o = {.isas = isas, .n_isas = n_isa, .op = "no-such-op", .threads = 1};
        ib_error err;
        int nf;
        CHECK(ib_probe_run(&o, NULL, NULL, &nf, &err) == IB_ERR_INVALID_ARG, "unknown op accepted");
        ib_isa auto_isa = IB_ISA_AUTO;
        o.op = NULL;
        o.isas = &auto_isa;
        o.n_isas = 1;
        CHECK(ib_probe_run(&o, NULL, NULL, &nf, &err) != IB_OK, "backend auto accepted");
        int zero = 0;
        o.isas = isas;
        o.n_isas = n_isa;
        o.Bs = &zero;
        o.n_B = 1;
        CHECK(ib_probe_run(&o, NULL, NULL, &nf, &err) == IB_ERR_INVALID_ARG, "batch size 0 accepted");
        CHECK(ib_probe_op_selected(ib_probe_op(find_op("rope/halves/row-pos")), "rope"), "family selection");
        CHECK(!ib_probe_op_selected(ib_probe_op(find_op("rmsnorm")), "rms"), "a name prefix is not a family");
    }

    /* clean: everything passes, the whole trimmed matrix ran */
    tally clean = run(IB_FAULT_NONE, 2);
    CHECK_EQ_INT(clean.failed, 0);
    CHECK_EQ_INT(clean.cases, expected_cases());
    if (clean.first_bad[0]) fprintf(stderr, "  clean: %s\n", clean.first_bad);

    /* the five batch faults: flagged exactly where their definition says, nowhere else */
    const ib_fault batch_faults[] = {IB_FAULT_ROPE_SCALAR_OFFSET, IB_FAULT_ROPE_SKIP_ROWS, IB_FAULT_GEMV_GEMM,
                                     IB_FAULT_SPLIT_KV_BY_BATCH, IB_FAULT_ROW_ORDER};
    for (int i = 0; i < 5; i++) {
        tally t = run(batch_faults[i], 2);
        CHECK(t.failed > 0, "%s: not flagged", ib_fault_name(batch_faults[i]));
        CHECK(t.unexpected == 0 && t.missed == 0, "%s: %d unexpected, %d missed failures (first: %s)",
              ib_fault_name(batch_faults[i]), t.unexpected, t.missed, t.first_bad);
        CHECK_EQ_INT(t.wrong_reason, 0);
        printf("  %-20s flagged %3d of %d cases:", ib_fault_name(batch_faults[i]), t.failed, t.cases);
        for (int k = 0; k < ib_probe_n_ops(); k++)
            if (t.ops_failed[k]) printf(" %s(%d)", ib_probe_op(k)->name, t.ops_failed[k]);
        printf("\n");
    }

    /* split-k-threads: a thread-count dependence in the norms' sum of squares. The batched runs use 2
     * threads, the references one; only rmsnorm and qknorm may fail (a split sum can still round to
     * the same output, so not necessarily at every shape), and both must fail somewhere. */
    {
        tally t = run(IB_FAULT_SPLIT_K_THREADS, 2);
        int rms = find_op("rmsnorm"), qk = find_op("qknorm");
        CHECK(t.ops_failed[rms] > 0 && t.ops_failed[qk] > 0, "split-k-threads: norms not flagged (%d, %d)",
              t.ops_failed[rms], t.ops_failed[qk]);
        CHECK_EQ_INT(t.failed, t.ops_failed[rms] + t.ops_failed[qk]);
        tally one = run(IB_FAULT_SPLIT_K_THREADS, 1);
        CHECK_EQ_INT(one.failed, 0); /* one thread everywhere: nothing to see */
    }
    /* isa-fma: the vector kernels' f32-activation matmuls differ from scalar at every shape */
    {
        tally t = run(IB_FAULT_ISA_FMA, 2);
        int f = find_op("matmul/f32"), q4 = find_op("matmul/q4-f32"), q8 = find_op("matmul/q8-f32");
        int per_backend = NB * NT;
        if (has_vec) {
            CHECK_EQ_INT(t.ops_failed[f], per_backend * (n_isa - 1));
            CHECK_EQ_INT(t.ops_failed[q4], per_backend * (n_isa - 1));
            CHECK_EQ_INT(t.ops_failed[q8], per_backend * (n_isa - 1));
        }
        CHECK_EQ_INT(t.failed, t.ops_failed[f] + t.ops_failed[q4] + t.ops_failed[q8]);
    }
    /* shared-rng: seeded sampling draws from a process-wide stream: only sample/seeded fails */
    {
        tally t = run(IB_FAULT_SAMPLE_BY_ROW, 2);
        int s = find_op("sample/seeded");
        CHECK(t.ops_failed[s] > 0, "shared-rng not flagged");
        CHECK_EQ_INT(t.failed, t.ops_failed[s]);
    }
    TEST_MAIN_END("test_probe");
}
