/*
 * cmd_diff.c — `isobatch diff`: sessions stepped batched vs each alone, compared at every capture point
 * of every layer (src/diag/capture.c); prints per layer and session the max abs diff, then the first
 * divergent layer and sub-op.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "diag/diag.h"

static const char help[] =
    "usage: isobatch diff [-m DIR] [-p TEXT]... [--prompt-ids L]... [--step K] [--batch B] [--threads N]\n"
    "         [--isa I] [--act A] [--json] [--inject FAULT]\n"
    "\n"
    "Steps the sessions (one per prompt) together and each alone: step 0 prefills each prompt, steps\n"
    "1..K decode the token the alone run chose. Every layer's input, output and sub-outputs (norms, q/k/v\n"
    "projections, q/k after norm and RoPE, attention, MLP) are captured per row and compared bitwise.\n"
    "Prints a line per step, the per-layer table of step K, then the first divergent layer and sub-op.\n"
    "Exit 1 when anything diverged.\n"
    "\n"
    "  -m DIR            model directory (default models/default)\n"
    "  -p TEXT           a prompt (repeatable; default: four built-in prompts of different lengths)\n"
    "  --prompt-ids L    a prompt as comma-separated token ids (repeatable)\n"
    "  --step K          the step whose per-layer table is printed; steps 0..K run (default 1)\n"
    "  --batch B         sessions per batched step (default: all)\n"
    "  --threads N       engine threads (default: the CPUs online)\n"
    "  --isa, --act      kernels and activation mode (as generate)\n"
    "  --backend B       cpu (default) or cuda\n"
    "  --json            one JSON object instead of the tables\n"
    "  --inject FAULT    test-only: break a kernel on purpose (see `isobatch generate --help`)\n";

/* Prompts of different lengths (so sessions sit at different positions) and longer than an
 * attention block. */
static const char *const default_prompts[] = {
    "In the beginning God created the heaven and the earth. And the earth was without form, and void.",
    "The quick brown fox jumps over the lazy dog, and the dog does not mind at all.",
    "A merchant walked to the market with three baskets of figs, and sold them all before noon, and "
    "walked home again in the evening light, counting his silver as he went.",
    "Question: what is the secret code? Answer: the code is written on the wall of the old tower.",
};


static const char *layer_name(int l, int L, char *buf, size_t cap) {
    if (l == L) snprintf(buf, cap, "final");
    else snprintf(buf, cap, "%d", l);
    return buf;
}

static void fmt_diff(double d, int differs, char *buf, size_t cap) {
    if (d < 0) snprintf(buf, cap, "-");
    else if (!differs) snprintf(buf, cap, "0");
    else if (isinf(d)) snprintf(buf, cap, "inf");
    else if (d == 0) snprintf(buf, cap, "(bits)");   /* +0 vs -0 */
    else snprintf(buf, cap, "%.3g", d);
}

static json_t *jnum(double d) { return d < 0 ? json_null() : json_real(isinf(d) ? 1e300 : d); }

int cmd_diff(int argc, char **argv) {
    const char *dir = NULL;
    long step = 1, batch = 0, threads = sysconf(_SC_NPROCESSORS_ONLN);
    ib_isa isa = IB_ISA_AUTO;
    ib_backend_kind backend = IB_BACKEND_CPU;
    ib_act act = IB_ACT_AUTO;
    int json = 0, rc = 0, nt = 0, ni = 0, n = 0;
    if (threads < 1) threads = 1;
    const char **texts = calloc((size_t)argc + 4, sizeof *texts), **idl = calloc((size_t)argc + 1, sizeof *idl);
    int32_t **ids = calloc((size_t)argc + 4, sizeof *ids);
    int *lens = calloc((size_t)argc + 4, sizeof *lens);
    ib_model *m = NULL;
    ib_diff_result r = {0};
    if (!texts || !idl || !ids || !lens) {
        rc = cli_error("out of memory");
        goto out;
    }
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v = NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            goto out;
        }
#define VAL() (v = cli_value(argc, argv, &i))
        if (!strcmp(f, "-m")) rc = VAL() ? (dir = v, 0) : 2;
        else if (!strcmp(f, "-p")) rc = VAL() ? (texts[nt++] = v, 0) : 2;
        else if (!strcmp(f, "--prompt-ids")) rc = VAL() ? (idl[ni++] = v, 0) : 2;
        else if (!strcmp(f, "--step")) rc = VAL() ? cli_int(f, v, 0, 4096, &step) : 2;
        else if (!strcmp(f, "--batch")) rc = VAL() ? cli_int(f, v, 1, 4096, &batch) : 2;
        else if ((!strcmp(f, "--threads") || !strcmp(f, "-t"))) rc = VAL() ? cli_int(f, v, 1, 256, &threads) : 2;
        else if (!strcmp(f, "--isa")) rc = VAL() ? cli_isa(v, &isa) : 2;
        else if (!strcmp(f, "--backend")) rc = VAL() ? cli_backend(v, &backend) : 2;
        else if (!strcmp(f, "--act")) {
            rc = VAL() ? cli_act(v, &act) : 2;
        } else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--inject")) rc = VAL() ? cli_inject(v) : 2;
        else rc = cli_unknown_option("diff", f, help);
#undef VAL
    }
    if (rc) goto out;
    if (!(dir = cli_model_dir(dir))) {
        rc = 2;
        goto out;
    }
    ib_error err;
    ib_load_opts lo = {.threads = (int)threads};   /* the weights are repacked on as many threads */
    if (ib_model_load(dir, &lo, &m, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    const ib_model_info *info = ib_model_get_info(m);
    if (nt + ni == 0)
        for (size_t i = 0; i < sizeof default_prompts / sizeof *default_prompts; i++) texts[nt++] = default_prompts[i];
    for (int i = 0; i < nt; i++) {
        int k = ib_tokenize(m, texts[i], strlen(texts[i]), NULL, 0);
        if (k < 1) {
            rc = k < 0 ? cli_error("prompt %d: could not tokenize", n) : cli_usage_error("prompt %d is empty", n);
            goto out;
        }
        if (!(ids[n] = malloc((size_t)k * sizeof(int32_t)))) {
            rc = cli_error("out of memory");
            goto out;
        }
        lens[n] = ib_tokenize(m, texts[i], strlen(texts[i]), ids[n], k);
        n++;
    }
    for (int i = 0; i < ni; i++) {
        if ((rc = cli_parse_ids(idl[i], info->vocab_size, &ids[n], &lens[n]))) goto out;
        n++;
    }
    ib_diff_opts o = {.step = (int)step, .batch = (int)batch, .threads = (int)threads, .isa = isa, .act = act, .backend = backend};
    if (ib_diff_run(m, (const int32_t *const *)ids, lens, n, &o, &r, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    int S = r.n_sessions, L = r.n_layers, K = r.n_steps - 1, B = batch > 0 && batch < n ? (int)batch : n;
    const ib_diff_first *fs = r.first_step >= 0 ? &r.first[r.first_step] : NULL;
    if (json) {
        json_t *o_ = json_object(), *steps = json_array(), *layers = json_array(), *pl = json_array();
        for (int i = 0; i < S; i++) json_array_append_new(pl, json_integer(r.prompt_len[i]));
        json_object_set_new(o_, "sessions", json_integer(S));
        json_object_set_new(o_, "batch", json_integer(B));
        json_object_set_new(o_, "prompt_tokens", pl);
        json_object_set_new(o_, "fault", json_string(ib_fault_name(ib_fault_get())));
        for (int s = 0; s <= K; s++) {
            json_t *st = json_object(), *ld = json_array();
            const ib_diff_first *f = &r.first[s];
            json_object_set_new(st, "step", json_integer(s));
            json_object_set_new(st, "first", f->layer < 0 ? json_null()
                                                          : json_pack("{s:o,s:s,s:s}", "layer", f->layer == L ? json_string("final") : json_integer(f->layer), "point",
                                                                      ib_diff_point_name(f->point), "op",
                                                                      ib_diff_point_op(f->layer, f->point)));
            for (int i = 0; i < S; i++) json_array_append_new(ld, jnum(r.logit_diff[(size_t)s * S + i]));
            json_object_set_new(st, "logit_diff", ld);
            json_array_append_new(steps, st);
        }
        for (int l = 0; l <= L; l++) {
            json_t *lo = json_object(), *pts = json_object(), *mx = json_array();
            int first = -1;
            for (int i = 0; i < S; i++) {
                double m_ = -1;
                for (int p = 0; p < IB_DIFF_POINTS; p++) {
                    double d = r.maxdiff[((size_t)l * IB_DIFF_POINTS + p) * S + i];
                    if (d > m_) m_ = d;
                }
                json_array_append_new(mx, jnum(m_));
            }
            for (int p = 0; p < IB_DIFF_POINTS; p++) {
                size_t k = ((size_t)l * IB_DIFF_POINTS + p) * S;
                if (r.maxdiff[k] < 0) continue;
                json_t *a = json_array();
                for (int i = 0; i < S; i++) {
                    json_array_append_new(a, jnum(r.maxdiff[k + i]));
                    if (r.differs[k + i] && first < 0) first = p;
                }
                json_object_set_new(pts, ib_diff_point_name(p), a);
            }
            json_object_set_new(lo, "layer", l == L ? json_string("final") : json_integer(l));
            json_object_set_new(lo, "max", mx);
            json_object_set_new(lo, "first_point", first < 0 ? json_null() : json_string(ib_diff_point_name(first)));
            json_object_set_new(lo, "points", pts);
            json_array_append_new(layers, lo);
        }
        json_object_set_new(o_, "steps", steps);
        json_object_set_new(o_, "table", json_pack("{s:i,s:o}", "step", K, "layers", layers));
        json_object_set_new(o_, "first_divergence",
                            fs ? json_pack("{s:i,s:o,s:s,s:s}", "step", r.first_step, "layer",
                                           fs->layer == L ? json_string("final") : json_integer(fs->layer), "point",
                                           ib_diff_point_name(fs->point), "op", ib_diff_point_op(fs->layer, fs->point))
                               : json_null());
        char *s = json_dumps(o_, JSON_COMPACT);
        if (s) puts(s);
        free(s);
        json_decref(o_);
    } else {
        char lb[16], cell[32];
        printf("isobatch diff: %d sessions (prompt tokens", S);
        for (int i = 0; i < S; i++) printf(" %d", r.prompt_len[i]);
        printf("), %d per batched step vs each alone; steps 0..%d (0 = prefill)%s%s\n", B, K,
               ib_fault_get() ? "; injected fault: " : "", ib_fault_get() ? ib_fault_name(ib_fault_get()) : "");
        for (int s = 0; s <= K; s++) {
            const ib_diff_first *f = &r.first[s];
            printf("step %d (%s): ", s, s ? "decode" : "prefill");
            if (f->layer < 0) printf("bitwise identical");
            else printf("first divergence at layer %s, %s (%s)", layer_name(f->layer, L, lb, sizeof lb),
                        ib_diff_point_name(f->point), ib_diff_point_op(f->layer, f->point));
            printf("; logits max|diff|");
            for (int i = 0; i < S; i++) {
                double d = r.logit_diff[(size_t)s * S + i];
                printf(" %s", d == 0 ? "0" : (snprintf(cell, sizeof cell, "%.3g", d), cell));
            }
            printf("\n");
        }
        printf("\nstep %d, max |batched - alone| per layer (over its capture points) and session:\n", K);
        printf("%-7s", "layer");
        for (int i = 0; i < S; i++) {
            snprintf(cell, sizeof cell, "s%d", i);
            printf(" %10s", cell);
        }
        printf("  first divergent point\n");
        int first_layer = -1;
        for (int l = 0; l <= L; l++) {
            printf("%-7s", layer_name(l, L, lb, sizeof lb));
            int first = -1;
            for (int p = 0; p < IB_DIFF_POINTS && first < 0; p++)
                for (int i = 0; i < S; i++)
                    if (r.differs[((size_t)l * IB_DIFF_POINTS + p) * S + i]) {
                        first = p;
                        break;
                    }
            for (int i = 0; i < S; i++) {
                double m_ = -1;
                int any = 0;
                for (int p = 0; p < IB_DIFF_POINTS; p++) {
                    size_t k = ((size_t)l * IB_DIFF_POINTS + p) * S + i;
                    if (r.maxdiff[k] > m_) m_ = r.maxdiff[k];
                    any |= r.differs[k];
                }
                fmt_diff(m_, any, cell, sizeof cell);
                printf(" %10s", cell);
            }
            if (first >= 0) printf("  %s (%s)", ib_diff_point_name(first), ib_diff_point_op(l, first));
            else printf("  -");
            printf("\n");
            if (first >= 0 && first_layer < 0) first_layer = l;
        }
        if (first_layer >= 0) {
            printf("\nstep %d, layer %s, each capture point:\n", K, layer_name(first_layer, L, lb, sizeof lb));
            for (int p = 0; p < IB_DIFF_POINTS; p++) {
                size_t k = ((size_t)first_layer * IB_DIFF_POINTS + p) * S;
                if (r.maxdiff[k] < 0) continue;
                printf("  %-11s %-10s", ib_diff_point_name(p), ib_diff_point_op(first_layer, p));
                for (int i = 0; i < S; i++) {
                    fmt_diff(r.maxdiff[k + i], r.differs[k + i], cell, sizeof cell);
                    printf(" %10s", cell);
                }
                printf("\n");
            }
        }
        if (fs)
            printf("\nfirst divergence: step %d, layer %s, point %s: sub-op %s\n", r.first_step,
                   layer_name(fs->layer, L, lb, sizeof lb), ib_diff_point_name(fs->point), ib_diff_point_op(fs->layer, fs->point));
        else
            printf("\nno divergence: every capture point of every layer is bitwise identical batched and alone\n");
    }
    if (r.first_step >= 0) rc = 1;
out:
    ib_diff_result_free(&r);
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids);
    free(lens);
    free(texts);
    free(idl);
    ib_model_free(m);
    return rc;
}
