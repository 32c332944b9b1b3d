/*
 * cmd_probe.c — `isobatch probe`: the op × shape matrix of src/diag/probe.c as a table or JSON.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "diag/diag.h"
#include "model/mkmodel.h"

static const char help[] =
    "usage: isobatch probe [--backend cpu|cuda|scalar|avx2|avx512|neon|amx] [-m DIR] [--op NAME] [--json] [--inject FAULT]\n"
    "         [--threads N] [--batch-sizes L] [--tokens L] [--positions L] [--seed S] [--verbose]\n"
    "\n"
    "Runs every op alone over [B,H,T,D] shapes, B in {1,2,3,4,8,16,33}, T in {1,2,7,64}, positions\n"
    "{0,1,148,4095}, and checks bitwise: identical input rows give identical output rows; row i of a\n"
    "batched run equals a B=1 run of row i; per-ISA kernels equal the scalar one. Then every op of the\n"
    "backend's table (src/backends/backend.h) is run inside whole steps of a model (several sessions,\n"
    "f32/f16 KV, full and sink+window caches, q8 and f32 activations) and compared with the scalar\n"
    "references of src/ops bitwise. Exit 1 on any failure.\n"
    "\n"
    "  --backend B       cpu (default: every ISA this CPU runs), one ISA, or cuda (the op table only)\n"
    "  -m DIR            the model of the op-table check (default: a tiny random 4-bit model)\n"
    "  --op NAME         one op or family (embed, rmsnorm, qknorm, matmul, rope, attention, swiglu,\n"
    "                    sample); --op list prints the ops\n"
    "  --json            one JSON object: cases, per-op summary, failures\n"
    "  --inject FAULT    test-only: break a kernel on purpose (rope-scalar-offset, rope-skip-rows,\n"
    "                    gemv-gemm, split-k-threads, isa-fma, row-order, shared-rng, split-kv-by-batch,\n"
    "                    gpu-fma: the CUDA backend fuses its products' multiply-adds; gpu-split-k: it\n"
    "                    splits their K over blocks added in any order; moe-capacity,\n"
    "                    moe-combine-by-load: Gemma 4 MoE routing / combine that depend on the batch;\n"
    "                    gpu-att-block: the CUDA attention cuts key blocks at half the canonical size)\n"
    "  --threads N       threads of the batched runs (default: the CPUs online, at least 2);\n"
    "                    B=1 reference runs use one\n"
    "  --batch-sizes L, --tokens L, --positions L   comma lists replacing the default axes (for quick runs)\n"
    "  --seed S          input data seed (default 1)\n"
    "  --verbose         print every case's row of the table (by default: only failing rows, then the\n"
    "                    per-op summary; --failures-only is that default)\n";

/* Parse "1,2,3" into a new array (values in [lo, hi]); 2 after an error message. */
static int parse_list(const char *flag, const char *s, long lo, long hi, int **out, int *n) {
    int k = 1;
    for (const char *c = s; *c; c++) k += *c == ',';
    int *v = malloc((size_t)k * sizeof *v);
    if (!v) return cli_error("out of memory");
    const char *c = s;
    for (int i = 0; i < k; i++) {
        char *end;
        long x = strtol(c, &end, 10);
        if (end == c || (*end && *end != ',') || x < lo || x > hi) {
            free(v);
            return cli_usage_error("%s: bad list '%s' (comma-separated integers from %ld to %ld)", flag, s, lo, hi);
        }
        v[i] = (int)x;
        c = end + (*end == ',');
    }
    free(*out);
    *out = v;
    *n = k;
    return 0;
}

/* Per-op tally for the summary: failing cases and the axis values where they failed. */
typedef struct tally {
    int cases, failed, why;
    int n_isa;
    unsigned long long Bmask, Tmask, Pmask, Imask;   /* bit i: value index i failed */
} tally;

typedef struct pctx {
    int json, failures_only, header_done;
    json_t *cases;
    tally *t;                         /* [n_ops] */
    const int *Bs, *Ts, *Ps;
    int nB, nT, nP;
} pctx;

static int index_of(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return i;
    return 0;
}

static const char *backend_name(ib_isa isa) { return isa == IB_ISA_AUTO ? "any" : ib_isa_name(isa); }

static void why_text(int fail, char *buf, size_t cap) {
    buf[0] = '\0';
    if (!fail) {
        snprintf(buf, cap, "ok");
        return;
    }
    snprintf(buf, cap, "FAIL(%s%s%s)", fail & IB_PROBE_FAIL_ROWS ? "rows" : "",
             (fail & IB_PROBE_FAIL_ROWS) && (fail & (IB_PROBE_FAIL_BATCH | IB_PROBE_FAIL_ISA)) ? "," : "",
             fail & IB_PROBE_FAIL_BATCH ? (fail & IB_PROBE_FAIL_ISA ? "B=1,isa" : "B=1") : (fail & IB_PROBE_FAIL_ISA ? "isa" : ""));
}

static void on_case(void *vctx, const ib_probe_case *c) {
    pctx *p = vctx;
    int oi = 0;
    while (oi < ib_probe_n_ops() && ib_probe_op(oi) != c->op) oi++;
    tally *t = &p->t[oi];
    t->cases++;
    if (c->fail) {
        t->failed++;
        t->why |= c->fail;
        t->Bmask |= 1ULL << index_of(p->Bs, p->nB, c->B);
        t->Tmask |= 1ULL << index_of(p->Ts, p->nT, c->T);
        if (c->pos >= 0) t->Pmask |= 1ULL << index_of(p->Ps, p->nP, c->pos);
        t->Imask |= 1ULL << c->isa;
    }
    char why[32];
    why_text(c->fail, why, sizeof why);
    if (p->json) {
        json_t *o = json_object();
        json_object_set_new(o, "op", json_string(c->op->name));
        json_object_set_new(o, "backend", json_string(backend_name(c->isa)));
        json_object_set_new(o, "shape", json_pack("[iiii]", c->B, c->H, c->T, c->D));
        json_object_set_new(o, "pos", c->pos >= 0 ? json_integer(c->pos) : json_null());
        json_object_set_new(o, "row_diff", c->row_diff >= 0 ? json_real(isinf(c->row_diff) ? 1e300 : c->row_diff) : json_null());
        json_object_set_new(o, "ulp_batch", json_integer((json_int_t)c->ulp_batch));
        json_object_set_new(o, "ulp_isa", c->ulp_isa >= 0 ? json_integer(c->ulp_isa) : json_null());
        json_object_set_new(o, "ok", json_boolean(!c->fail));
        json_t *w = json_array();
        if (c->fail & IB_PROBE_FAIL_ROWS) json_array_append_new(w, json_string("rows"));
        if (c->fail & IB_PROBE_FAIL_BATCH) json_array_append_new(w, json_string("batch"));
        if (c->fail & IB_PROBE_FAIL_ISA) json_array_append_new(w, json_string("isa"));
        json_object_set_new(o, "fail", w);
        json_array_append_new(p->cases, o);
        return;
    }
    if (p->failures_only && !c->fail) return;
    if (!p->header_done) {
        printf("%-28s %-7s %-16s %5s %10s %10s %11s  %s\n", "op", "backend", "[B,H,T,D]", "pos", "row diff", "ulp(B=1)",
               "ulp(scalar)", "result");
        p->header_done = 1;
    }
    char shape[48], pos[16], rd[16], ui[24];
    snprintf(shape, sizeof shape, "[%d,%d,%d,%d]", c->B, c->H, c->T, c->D);
    if (c->pos >= 0) snprintf(pos, sizeof pos, "%d", c->pos);
    else snprintf(pos, sizeof pos, "-");
    if (c->row_diff < 0) snprintf(rd, sizeof rd, "n/a");
    else if (c->row_diff == 0) snprintf(rd, sizeof rd, "0");
    else snprintf(rd, sizeof rd, "%.3g", c->row_diff);
    if (c->ulp_isa < 0) snprintf(ui, sizeof ui, "-");
    else snprintf(ui, sizeof ui, "%lld", c->ulp_isa);
    printf("%-28s %-7s %-16s %5s %10s %10llu %11s  %s\n", c->op->name, backend_name(c->isa), shape, pos, rd,
           (unsigned long long)c->ulp_batch, ui, why);
    fflush(stdout);
}

/* "{2,3,33}" from the values whose bit is set. */
static void mask_text(unsigned long long mask, const int *v, int n, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "{");
    int first = 1;
    for (int i = 0; i < n && o < cap; i++)
        if (mask >> i & 1) {
            o += (size_t)snprintf(buf + o, cap - o, first ? "%d" : ",%d", v[i]);
            first = 0;
        }
    if (o < cap) snprintf(buf + o, cap - o, "}");
}

#define OPTAB_MAX 32   /* distinct op names of one check (gemma4 with every feature: about 20) */

typedef struct optab {
    const char *names[OPTAB_MAX];
    long elems[OPTAB_MAX], bad[OPTAB_MAX];
    int n;
} optab;

static void on_op(void *ctx, const ib_opcheck *r) {
    optab *t = ctx;
    int i = 0;
    while (i < t->n && strcmp(t->names[i], r->op)) i++;
    if (i == t->n && t->n < OPTAB_MAX) t->names[t->n++] = r->op;
    if (i < OPTAB_MAX) t->elems[i] += r->elems, t->bad[i] += r->mismatches;
}

/* The backend op-table check (ib_backend_check) of `kind` — for the CPU once per ISA in isas — under
 * Q8 and F32 activations, on the model in dir or a tiny random 4-bit one. Text: one line per op;
 * json: objects appended to arr (or, without arr, printed as one object); text: one line per
 * (backend, activation mode), and one per op when verbose or when it differs. Returns 0, 1 when an op
 * differs from the reference, or a negative value after an error message. */
static int op_table(ib_backend_kind kind, const ib_isa *isas, int n_isa, const char *dir, int json, json_t *arr,
                    int verbose) {
    char tmp[] = "/tmp/ib_probe_XXXXXX";
    ib_error err;
    ib_model *m = NULL;
    int rc = 0, made = 0, errored = 0;
    const char *why = NULL;
    if (!ib_backend_available(kind, &why)) return -cli_error("backend %s: %s", ib_backend_name(kind), why);
    if (!dir) {
        if (!mkdtemp(tmp)) return -cli_error("probe: cannot make a temporary model directory");
        made = 1;
        ib_mkmodel_opts mo = {.preset = "tiny", .seed = 3, .bits = 4, .group = 32, .tied = 1};
        if (ib_mkmodel(tmp, &mo, &err)) {
            rc = -cli_error("%s", err.msg);
            goto done;
        }
        dir = tmp;
    }
    if (ib_model_load(dir, NULL, &m, &err)) {
        rc = -cli_error("%s", err.msg);
        goto done;
    }
    const ib_isa one = IB_ISA_AUTO;
    if (kind != IB_BACKEND_CPU) isas = &one, n_isa = 1;
    const int quantized = ib_model_get_info(m)->quant_bits != 0;
    if (!json) printf("\nbackend op table (every op inside whole steps vs the scalar reference, bitwise):\n");
    json_t *own = json && !arr ? json_array() : NULL;
    for (int i = 0; i < n_isa && !errored; i++)
        for (int a = quantized ? 0 : 1; a < 2 && !errored; a++) {
            ib_act act = a ? IB_ACT_F32 : IB_ACT_Q8;
            optab t = {0};
            long bad = 0;
            ib_backend_check_opts o = {.backend = kind, .isa = isas[i], .act = act, .threads = 2};
            if (ib_backend_check(m, &o, on_op, &t, &bad, &err)) {
                rc = -cli_error("%s", err.msg);
                errored = 1;
                break;
            }
            char who[48];
            snprintf(who, sizeof who, "%s%s%s", ib_backend_name(kind), kind == IB_BACKEND_CPU ? " " : "",
                     kind == IB_BACKEND_CPU ? ib_isa_name(isas[i]) : "");
            for (int k = 0; k < t.n; k++) {
                if (json) {
                    json_t *r = json_pack("{s:s, s:s, s:s, s:I, s:I}", "backend", who, "act", a ? "f32" : "q8", "op",
                                          t.names[k], "floats", (json_int_t)t.elems[k], "mismatches",
                                          (json_int_t)t.bad[k]);
                    json_array_append_new(arr ? arr : own, r);
                } else if (verbose || t.bad[k]) {
                    printf("  %-10s %-4s %-22s %10ld floats  %s\n", who, a ? "f32" : "q8", t.names[k], t.elems[k],
                           t.bad[k] ? "DIFFER" : "bitwise equal");
                    if (t.bad[k]) printf("    %ld floats differ\n", t.bad[k]);
                }
            }
            if (!json) {
                long floats = 0;
                for (int k2 = 0; k2 < t.n; k2++) floats += t.elems[k2];
                printf("  %-10s %-4s %d ops, %ld floats: %s\n", who, a ? "f32" : "q8", t.n, floats,
                       bad ? "SOME DIFFER" : "every op bitwise equal");
            }
            if (bad) rc = 1;
        }
    if (own && !errored) {
        json_t *o = json_pack("{s:o, s:b}", "backend_ops", own, "ok", rc == 0);
        char *s = json_dumps(o, JSON_COMPACT);
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else if (!json && !errored) {
        printf("%s\n", rc ? "backend op table: FAILED" : "backend op table: every op bitwise equal");
    }
    json_decref(errored ? own : NULL);
done:
    ib_model_free(m);
    if (made) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd) != 0) fprintf(stderr, "isobatch: could not remove %s\n", tmp);
    }
    return rc;
}

int cmd_probe(int argc, char **argv) {
    ib_probe_opts po = {.threads = (int)sysconf(_SC_NPROCESSORS_ONLN), .seed = 1};
    if (po.threads < 2) po.threads = 2;
    const char *backend = "cpu", *model_dir = NULL;
    int *Bs = NULL, *Ts = NULL, *Ps = NULL, rc = 0, list = 0;
    pctx p = {.failures_only = 1}; /* every row with --verbose */
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v = NULL;
        long n;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            goto out;
        }
#define VAL() (v = cli_value(argc, argv, &i))
        if (!strcmp(f, "--backend")) rc = VAL() ? (backend = v, 0) : 2;
        else if (!strcmp(f, "-m")) rc = VAL() ? (model_dir = v, 0) : 2;
        else if (!strcmp(f, "--op")) {
            if (!VAL()) rc = 2;
            else if (!strcmp(v, "list")) list = 1;
            else po.op = v;
        }
        else if (!strcmp(f, "--json")) p.json = 1;
        else if (!strcmp(f, "--failures-only")) p.failures_only = 1;
        else if (!strcmp(f, "--verbose") || !strcmp(f, "-v")) p.failures_only = 0;
        else if ((!strcmp(f, "--threads") || !strcmp(f, "-t"))) {
            if (!VAL() || cli_int(f, v, 1, 256, &n)) rc = 2;
            else po.threads = (int)n;
        }
        else if (!strcmp(f, "--seed")) rc = VAL() ? cli_u64(f, v, &po.seed) : 2;
        else if (!strcmp(f, "--batch-sizes")) rc = VAL() ? parse_list(f, v, 1, 4096, &Bs, &po.n_B) : 2;
        else if (!strcmp(f, "--tokens")) rc = VAL() ? parse_list(f, v, 1, 4096, &Ts, &po.n_T) : 2;
        else if (!strcmp(f, "--positions")) rc = VAL() ? parse_list(f, v, 0, 1 << 20, &Ps, &po.n_pos) : 2;
        else if (!strcmp(f, "--inject")) rc = VAL() ? cli_inject(v) : 2;
        else rc = cli_unknown_option("probe", f, help);
#undef VAL
    }
    if (rc) goto out;
    if (list) {
        for (int i = 0; i < ib_probe_n_ops(); i++) {
            const ib_probe_op_info *op = ib_probe_op(i);
            printf("%-28s H=%d D=%-4d %s%s%s\n", op->name, op->H, op->D, op->about,
                   op->uses_pos ? "" : " [no position: position axis skipped]",
                   op->rows_check ? "" : " [identical-row check skipped: rows get their own positions]");
        }
        goto out;
    }
    if (po.op) {
        int any = 0;
        for (int i = 0; i < ib_probe_n_ops(); i++) any |= ib_probe_op_selected(ib_probe_op(i), po.op);
        if (!any) {
            rc = cli_usage_error("--op: no op or family '%s' (try --op list)", po.op);
            goto out;
        }
    }
    ib_isa isas[4];
    int n_isa = 0;
    char skipped[128] = "";
    if (!strcmp(backend, "cuda")) {
        rc = op_table(IB_BACKEND_CUDA, NULL, 0, model_dir, p.json, NULL, !p.failures_only) != 0;
        goto out;
    }
    if (!strcmp(backend, "cpu")) {
        /* the ISAs of this build's architecture (the others are never supported) */
#if defined(__aarch64__)
        const ib_isa all[] = {IB_ISA_SCALAR, IB_ISA_NEON};
#else
        const ib_isa all[] = {IB_ISA_SCALAR, IB_ISA_AVX2, IB_ISA_AVX512, IB_ISA_AMX};
#endif
        for (int i = 0; i < (int)(sizeof all / sizeof all[0]); i++) {
            if (ib_isa_supported(all[i])) isas[n_isa++] = all[i];
            else snprintf(skipped + strlen(skipped), sizeof skipped - strlen(skipped), "%s%s", skipped[0] ? ", " : "",
                          ib_isa_name(all[i]));
        }
    } else {
        ib_isa one;
        if (ib_isa_parse(backend, &one) || one == IB_ISA_AUTO) {
            rc = cli_usage_error("--backend: unknown '%s' (cpu, scalar, avx2, avx512, neon, amx)", backend);
            goto out;
        }
        if (!ib_isa_supported(one)) {
            rc = cli_usage_error("--backend %s: not supported by this CPU", backend);
            goto out;
        }
        isas[n_isa++] = one;
    }
    po.isas = isas;
    po.n_isas = n_isa;
    po.Bs = Bs;
    po.Ts = Ts;
    po.pos = Ps;
    p.Bs = Bs ? Bs : ib_probe_default_B;
    p.nB = Bs ? po.n_B : 7;
    p.Ts = Ts ? Ts : ib_probe_default_T;
    p.nT = Ts ? po.n_T : 4;
    p.Ps = Ps ? Ps : ib_probe_default_pos;
    p.nP = Ps ? po.n_pos : 4;
    p.t = calloc((size_t)ib_probe_n_ops(), sizeof *p.t);
    p.cases = p.json ? json_array() : NULL;
    if (!p.t || (p.json && !p.cases)) {
        rc = cli_error("out of memory");
        goto out;
    }
    char backends[64] = "";
    for (int i = 0; i < n_isa; i++)
        snprintf(backends + strlen(backends), sizeof backends - strlen(backends), "%s%s", i ? " " : "", ib_isa_name(isas[i]));
    if (!p.json)
        printf("isobatch probe: backends %s%s%s%s, threads %d (B=1 references: 1)%s%s\n", backends,
               skipped[0] ? " (not on this CPU: " : "", skipped, skipped[0] ? ")" : "", po.threads,
               ib_fault_get() ? ", injected fault: " : "", ib_fault_get() ? ib_fault_name(ib_fault_get()) : "");
    int n_fail = 0;
    ib_error err;
    if (ib_probe_run(&po, on_case, &p, &n_fail, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    int total = 0;
    for (int i = 0; i < ib_probe_n_ops(); i++) total += p.t[i].cases;
    if (p.json) {
        json_t *o = json_object(), *sum = json_array(), *bk = json_array(), *sk = json_array();
        for (int i = 0; i < n_isa; i++) json_array_append_new(bk, json_string(ib_isa_name(isas[i])));
        for (int i = 0; i < ib_probe_n_ops(); i++) {
            const ib_probe_op_info *op = ib_probe_op(i);
            if (!p.t[i].cases) continue;
            json_t *s = json_object();
            json_object_set_new(s, "op", json_string(op->name));
            json_object_set_new(s, "cases", json_integer(p.t[i].cases));
            json_object_set_new(s, "failed", json_integer(p.t[i].failed));
            json_array_append_new(sum, s);
            if (!op->uses_pos) {
                char b[96];
                snprintf(b, sizeof b, "%s: position axis (the op has no position input)", op->name);
                json_array_append_new(sk, json_string(b));
            }
            if (!op->rows_check) {
                char b[96];
                snprintf(b, sizeof b, "%s: identical-row check (rows get their own positions)", op->name);
                json_array_append_new(sk, json_string(b));
            }
        }
        json_object_set_new(o, "backends", bk);
        json_object_set_new(o, "threads", json_integer(po.threads));
        json_object_set_new(o, "fault", json_string(ib_fault_name(ib_fault_get())));
        json_object_set_new(o, "cases", p.cases);
        p.cases = NULL;
        json_object_set_new(o, "summary", sum);
        json_object_set_new(o, "skipped", sk);
        json_object_set_new(o, "total", json_integer(total));
        json_t *bo = json_array();
        int trc = op_table(IB_BACKEND_CPU, isas, n_isa, model_dir, 1, bo, 1);
        if (trc < 0) {
            json_decref(o);
            json_decref(bo);
            rc = 1;
            goto out;
        }
        json_object_set_new(o, "backend_ops", bo);
        json_object_set_new(o, "backend_ops_ok", json_boolean(trc == 0));
        json_object_set_new(o, "failed", json_integer(n_fail));
        if (trc) rc = 1;
        char *s = json_dumps(o, JSON_COMPACT);
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("\nsummary (ops without a position input skip the position axis; row-pos RoPE skips the\n"
               "identical-row check; ops with one C kernel for every ISA run once, backend \"any\"):\n");
        for (int i = 0; i < ib_probe_n_ops(); i++) {
            tally *t = &p.t[i];
            if (!t->cases) continue;
            const ib_probe_op_info *op = ib_probe_op(i);
            if (!t->failed) {
                printf("  %-28s %4d cases  ok\n", op->name, t->cases);
                continue;
            }
            char bs[96], ts[64], ps[64], why[32];
            mask_text(t->Bmask, p.Bs, p.nB, bs, sizeof bs);
            mask_text(t->Tmask, p.Ts, p.nT, ts, sizeof ts);
            mask_text(t->Pmask, p.Ps, p.nP, ps, sizeof ps);
            why_text(t->why, why, sizeof why);
            printf("  %-28s %4d cases  %d %s at B in %s, T in %s%s%s", op->name, t->cases, t->failed, why, bs, ts,
                   op->uses_pos ? ", pos in " : "", op->uses_pos ? ps : "");
            if (op->isa_dep) {
                printf(", backend");
                for (int k = 0; k < n_isa; k++)
                    if (t->Imask >> isas[k] & 1) printf(" %s", ib_isa_name(isas[k]));
            }
            printf("\n");
        }
        printf("%d cases, %d failed\n", total, n_fail);
        if (op_table(IB_BACKEND_CPU, isas, n_isa, model_dir, 0, NULL, !p.failures_only)) rc = 1;
    }
    if (n_fail) rc = 1;
out:
    json_decref(p.cases);
    free(p.t);
    free(Bs);
    free(Ts);
    free(Ps);
    return rc;
}
