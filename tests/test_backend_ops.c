/*
 * test_backend_ops.c — every operation of every available backend equals the scalar reference of
 * src/ops/, bitwise (ib_backend_check), and the check fails under injected faults.
 *
 *   - CPU backend, every ISA this CPU runs, Q8 and F32 activations, on a 4-bit and a float32 model:
 *     zero mismatching floats, and a non-trivial number compared for every op.
 *   - Faults that break one op make the check fail in that op: isa-fma (vector kernels fuse
 *     multiply-adds: the F32 products and attention), row-order (rmsnorm), rope-skip-rows (rope),
 *     gemv-gemm (products of more than one row).
 *   - Gemma 4 with a KV-shared double-wide layer and per-layer embeddings: the shared layer's ops and
 *     the per-layer ops among the others, every one compared; ple-row0 caught at ple_inputs.
 *   - CUDA backend, when compiled in and a GPU is present; otherwise one SKIP line says why.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "diag/diag.h"
#include "isobatch.h"
#include "model/mkmodel.h"

#define TALLY_MAX 32

typedef struct {
    long per_op_elems[TALLY_MAX], per_op_bad[TALLY_MAX];
    const char *names[TALLY_MAX];
    int n;
} tally;

static void on_op(void *ctx, const ib_opcheck *r) {
    tally *t = ctx;
    int i = 0;
    while (i < t->n && strcmp(t->names[i], r->op)) i++;
    if (i == t->n && t->n < TALLY_MAX) t->names[t->n++] = r->op;
    if (i < TALLY_MAX) t->per_op_elems[i] += r->elems, t->per_op_bad[i] += r->mismatches;
}

/* Mismatching floats of op `op` in the last run (-1 when the op never ran). */
static long bad_of(const tally *t, const char *op) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->names[i], op)) return t->per_op_bad[i];
    return -1;
}

static long run(const ib_model *m, ib_backend_kind be, ib_isa isa, ib_act act, int threads, tally *t) {
    memset(t, 0, sizeof *t);
    ib_backend_check_opts o = {.backend = be, .isa = isa, .act = act, .threads = threads};
    long bad = -1;
    ib_error err;
    if (ib_backend_check(m, &o, on_op, t, &bad, &err)) {
        fprintf(stderr, "backend check: %s\n", err.msg);
        return -1;
    }
    return bad;
}

static const char *const all_ops[] = {"embed", "rmsnorm", "linear q/k/v", "q/k norm", "rope", "kv store + attention",
                                      "linear o", "add", "linear gate/up", "swiglu", "linear down", "final norm",
                                      "logits"};

/* Gemma 4's (dense): post-norms are rmsnorms, GeGLU for SwiGLU, the v norm and the layer scalar. */
static const char *const gemma_ops[] = {"embed", "rmsnorm", "linear q/k/v", "q/k norm", "v norm", "rope",
                                        "kv store + attention", "linear o", "add", "linear gate/up", "geglu",
                                        "linear down", "scale_layer", "final norm", "logits"};

/* Gemma 4 with KV sharing (its last layer), use_double_wide_mlp and per-layer embeddings: the dense
 * ops, the shared layer's own, the per-layer ones. */
static const char *const gemma_kp_ops[] = {"embed", "ple_inputs", "rmsnorm", "linear q/k/v", "q/k norm", "v norm",
                                           "rope", "kv store + attention", "linear o", "add", "linear gate/up",
                                           "geglu", "linear down", "ple_layer", "scale_layer", "linear q (kv-shared)",
                                           "q norm (kv-shared)", "rope q (kv-shared)", "attention (kv-shared)",
                                           "final norm", "logits"};

/* Exact on every op, and every op of ops[0..nops) actually compared something; each op's mismatching
 * floats printed when some differ. */
static void check_exact_ops(const ib_model *m, ib_backend_kind be, ib_isa isa, ib_act act, int threads, const char *what,
                            const char *const *ops, size_t nops) {
    tally t;
    long bad = run(m, be, isa, act, threads, &t);
    CHECK(bad == 0, "%s: %ld floats differ from the scalar reference", what, bad);
    if (bad != 0)
        for (int j = 0; j < t.n; j++)
            if (t.per_op_bad[j]) printf("  %s: op %s: %ld of %ld floats differ\n", what, t.names[j], t.per_op_bad[j], t.per_op_elems[j]);
    for (size_t i = 0; i < nops; i++) {
        long n = 0;
        for (int j = 0; j < t.n; j++)
            if (!strcmp(t.names[j], ops[i])) n = t.per_op_elems[j];
        CHECK(n > 1000, "%s: op %s compared only %ld floats", what, ops[i], n);
    }
}

static void check_exact(const ib_model *m, ib_backend_kind be, ib_isa isa, ib_act act, int threads, const char *what) {
    check_exact_ops(m, be, isa, act, threads, what, all_ops, sizeof all_ops / sizeof *all_ops);
}

/* Under `fault`, op `op` must mismatch. */
static void check_fault(const ib_model *m, ib_isa isa, ib_act act, ib_fault fault, const char *op, const char *what) {
    tally t;
    ib_fault_set(fault);
    run(m, IB_BACKEND_CPU, isa, act, 2, &t);
    ib_fault_set(IB_FAULT_NONE);
    long b = bad_of(&t, op);
    CHECK(b > 0, "fault %s (%s): op %s should mismatch, %ld floats did", ib_fault_name(fault), what, op, b);
    printf("fault %-18s caught in %-22s (%s): %ld floats differ\n", ib_fault_name(fault), op, what, b);
}

static ib_model *make_model_preset(const char *dir, const char *preset, int bits) {
    ib_error err;
    ib_model *m = NULL;
    ib_mkmodel_opts mo = {.preset = preset, .seed = 21, .bits = bits, .group = 32, .tied = 1};
    if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
        fprintf(stderr, "model: %s\n", err.msg);
        return NULL;
    }
    return m;
}

static ib_model *make_model(const char *dir, int bits) { return make_model_preset(dir, "tiny", bits); }

/* gemma4-tiny, 4-bit: its last layer KV-shared with a double-wide MLP, per-layer embeddings of 32. */
static ib_model *make_gemma_kp(const char *dir) {
    ib_error err;
    ib_model *m = NULL;
    ib_mkmodel_opts mo = {.preset = "gemma4-tiny", .seed = 22, .bits = 4, .group = 32, .tied = 1, .kv_shared = 1,
                          .double_wide = 1, .ple_dim = 32};
    if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
        fprintf(stderr, "model: %s\n", err.msg);
        return NULL;
    }
    return m;
}

/* Every op of dense gemma4-tiny (mg) on backend `be`, q8 activations on isa_q8 and f32 on isa_f32
 * (`passes` random passes each), bitwise against the scalar reference; `name` labels the backend. */
static void check_gemma(ib_model *mg, ib_backend_kind be, ib_isa isa_q8, ib_isa isa_f32, int passes, const char *name) {
    char what[96];
    snprintf(what, sizeof what, "%s q8 gemma4-tiny 4-bit (isa %s)", name, ib_isa_name(isa_q8));
    check_exact_ops(mg, be, isa_q8, IB_ACT_Q8, passes, what, gemma_ops, sizeof gemma_ops / sizeof *gemma_ops);
    snprintf(what, sizeof what, "%s f32 gemma4-tiny 4-bit (isa %s)", name, ib_isa_name(isa_f32));
    check_exact_ops(mg, be, isa_f32, IB_ACT_F32, passes, what, gemma_ops, sizeof gemma_ops / sizeof *gemma_ops);
    printf("%s backend: every op of gemma4-tiny bitwise equal to the scalar reference (q8, f32)\n", name);
}

int main(void) {
    char d4[] = "/tmp/ib_bops4_XXXXXX", d32[] = "/tmp/ib_bops32_XXXXXX", dg[] = "/tmp/ib_bopsg4_XXXXXX";
    char dk[] = "/tmp/ib_bopsgk_XXXXXX";
    if (!mkdtemp(d4) || !mkdtemp(d32) || !mkdtemp(dg) || !mkdtemp(dk)) return 1;
    ib_model *m4 = make_model(d4, 4), *m32 = make_model(d32, 32), *mg = make_model_preset(dg, "gemma4-tiny", 4);
    ib_model *mk = make_gemma_kp(dk);
    CHECK(m4 && m32 && mg && mk, "tiny models load");
    /* dense Gemma 4 (sliding and full layers, k_eq_v, GeGLU, post-norms, layer scalar, soft-cap) */
    if (mg) check_gemma(mg, IB_BACKEND_CPU, IB_ISA_SCALAR, IB_ISA_AUTO, 2, "cpu");
    const size_t n_kp = sizeof gemma_kp_ops / sizeof *gemma_kp_ops;
    if (mk) { /* KV sharing, double-wide MLP, per-layer embeddings */
        check_exact_ops(mk, IB_BACKEND_CPU, IB_ISA_SCALAR, IB_ACT_Q8, 2, "cpu scalar q8 gemma4 kv-shared/ple", gemma_kp_ops, n_kp);
        check_exact_ops(mk, IB_BACKEND_CPU, IB_ISA_AUTO, IB_ACT_F32, 2, "cpu auto f32 gemma4 kv-shared/ple", gemma_kp_ops, n_kp);
        check_fault(mk, IB_ISA_SCALAR, IB_ACT_F32, IB_FAULT_PLE_ROW0, "ple_inputs", "cpu scalar f32 gemma4 ple");
        check_fault(mk, IB_ISA_SCALAR, IB_ACT_Q8, IB_FAULT_ROPE_SKIP_ROWS, "rope q (kv-shared)", "cpu scalar q8 gemma4");
        printf("cpu backend: every op of gemma4-tiny with a KV-shared double-wide layer and per-layer embeddings "
               "bitwise equal (q8, f32)\n");
    }
    static const ib_isa isas[] = {IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512, IB_ISA_NEON, IB_ISA_AMX};
    for (int i = 0; m4 && m32 && i < 5; i++) {
        if (!ib_isa_supported(isas[i])) continue;
        char what[96];
        snprintf(what, sizeof what, "cpu %s q8 4-bit", ib_isa_name(isas[i]));
        check_exact(m4, IB_BACKEND_CPU, isas[i], IB_ACT_Q8, 2, what);
        snprintf(what, sizeof what, "cpu %s f32 4-bit", ib_isa_name(isas[i]));
        check_exact(m4, IB_BACKEND_CPU, isas[i], IB_ACT_F32, 1, what);
        snprintf(what, sizeof what, "cpu %s f32 float32 weights", ib_isa_name(isas[i]));
        check_exact(m32, IB_BACKEND_CPU, isas[i], IB_ACT_F32, 2, what);
        printf("cpu backend, isa %s: every op bitwise equal to the scalar reference (q8, f32)\n", ib_isa_name(isas[i]));
        if (isas[i] == IB_ISA_AVX2 || isas[i] == IB_ISA_AVX512 || isas[i] == IB_ISA_AMX) {
            snprintf(what, sizeof what, "cpu %s f32", ib_isa_name(isas[i]));
            check_fault(m4, isas[i], IB_ACT_F32, IB_FAULT_ISA_FMA, "linear q/k/v", what);
            check_fault(m4, isas[i], IB_ACT_F32, IB_FAULT_ISA_FMA, "kv store + attention", what);
        }
    }
    if (m4) {
        check_fault(m4, IB_ISA_SCALAR, IB_ACT_Q8, IB_FAULT_ROW_ORDER, "rmsnorm", "cpu scalar q8");
        check_fault(m4, IB_ISA_SCALAR, IB_ACT_Q8, IB_FAULT_ROPE_SKIP_ROWS, "rope", "cpu scalar q8");
        check_fault(m4, IB_ISA_SCALAR, IB_ACT_F32, IB_FAULT_GEMV_GEMM, "linear q/k/v", "cpu scalar f32");
    }
    const char *why = NULL;
    if (m4 && ib_backend_available(IB_BACKEND_CUDA, &why)) {
        check_exact(m4, IB_BACKEND_CUDA, IB_ISA_AUTO, IB_ACT_Q8, 1, "cuda q8 4-bit");
        check_exact(m4, IB_BACKEND_CUDA, IB_ISA_AUTO, IB_ACT_F32, 1, "cuda f32 4-bit");
        check_exact(m32, IB_BACKEND_CUDA, IB_ISA_AUTO, IB_ACT_F32, 1, "cuda f32 float32 weights");
        printf("cuda backend: every op bitwise equal to the scalar reference (q8, f32)\n");
        if (mg) check_gemma(mg, IB_BACKEND_CUDA, IB_ISA_AUTO, IB_ISA_AUTO, 1, "cuda");
        if (mk) {
            check_exact_ops(mk, IB_BACKEND_CUDA, IB_ISA_AUTO, IB_ACT_Q8, 1, "cuda q8 gemma4 kv-shared/ple", gemma_kp_ops, n_kp);
            check_exact_ops(mk, IB_BACKEND_CUDA, IB_ISA_AUTO, IB_ACT_F32, 1, "cuda f32 gemma4 kv-shared/ple", gemma_kp_ops, n_kp);
            printf("cuda backend: every op of gemma4-tiny kv-shared/double-wide/ple bitwise equal (q8, f32)\n");
        }
    } else {
        printf("SKIP: cuda backend not checked: %s\n", why ? why : "no model");
    }
    ib_model_free(m4);
    ib_model_free(m32);
    ib_model_free(mg);
    ib_model_free(mk);
    char cmd[192];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s %s %s", d4, d32, dg, dk);
    if (system(cmd) != 0) fprintf(stderr, "could not remove the test models\n");
    TEST_MAIN_END("test_backend_ops");
}
