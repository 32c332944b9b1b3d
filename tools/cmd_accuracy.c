/*
 * cmd_accuracy.c — `isobatch accuracy`: how close the engine's logits are to a float64 reference
 * forward pass of the same model (src/diag/reference.c), per activation mode: top-1 agreement, KL,
 * max and relative L2 logit error over every position of one token sequence.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "diag/diag.h"

static const char help[] =
    "usage: isobatch accuracy [-m DIR] [-p TEXT | --prompt-ids L] [--tokens N] [--act f32|q8|both]\n"
    "         [--isa I] [--threads N] [--json] [--logits-out F] [--ref-logits-out F] [--no-reference]\n"
    "         [--per-position] [--ref-store f64|f32] [--floor] [--floor-parts] [--kv-dtype f32|f16|q8]\n"
    "\n"
    "Runs a float64 reference forward pass of the model over one token sequence (every position, from\n"
    "position 0), then feeds the same tokens to the engine one step at a time per activation mode and\n"
    "compares the logits after each token: top-1 agreement (argmax, ties to the lowest id), mean and max\n"
    "KL(reference || engine) per token in nats, max |logit difference|, relative L2 error of all logits.\n"
    "\n"
    "  -m DIR            model directory (default models/default)\n"
    "  -p TEXT           the text to encode (default: a built-in English paragraph)\n"
    "  --prompt-ids L    the tokens as comma-separated ids instead\n"
    "  --tokens N        compare the first N tokens (default 64; at least 2 are needed)\n"
    "  --act A           f32, q8 or both (default both; q8 is skipped on float models)\n"
    "  --isa I           engine kernels: auto, scalar, avx2, avx512, neon, amx (default auto)\n"
    "  --kv-dtype T      the engine session's KV element type: f32 (default), f16 or q8\n"
    "  --threads N       engine threads (default: the CPUs online; the reference uses them all, up to 64)\n"
    "  --json            one JSON object\n"
    "  --logits-out F    also write the engine's logits after every token (float32 little-endian,\n"
    "                    [tokens][vocab], row t = after token t); needs --act f32 or --act q8\n"
    "  --ref-logits-out F  also write the float64 reference's logits (float64 little-endian, same layout)\n"
    "  --no-reference    skip the float64 reference (and the comparison): only --logits-out's engine run\n"
    "                    (for models whose float64 pass would take too long, compared elsewhere)\n"
    "  --per-position    also the relative L2 error of each position's logits alone (needs one --act);\n"
    "                    an error that grows with the position points at attention\n"
    "  --ref-store S     how the reference stores its activations: f64 (default) or f32 — every\n"
    "                    value the engine stores as a float rounded to float32, all arithmetic still\n"
    "                    double: the error of that pass against f64 (run both, --ref-logits-out) is\n"
    "                    the floor of an engine storing those values as float32 on this model\n"
    "  --floor           also run the float32-storage reference and print that floor as a row: its\n"
    "                    distance from the float64 reference (with the default --ref-store f64)\n"
    "  --floor-parts     also one such row per stored part alone — residual, normed (norms' outputs the\n"
    "                    products read), qkv, attention (its output), block (block outputs before the\n"
    "                    residual), hidden (the MLPs' gated values), products (their outputs), logits —\n"
    "                    each the reference with only that part rounded to float32: where the floor\n"
    "                    comes from (eight more reference passes; rows compared as floats)\n";

/* Write n elements of size sz from buf to path; 0 or a one-line error (exit status 1). */
static int write_file(const char *path, const void *buf, size_t sz, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return cli_error("%s: cannot create", path);
    size_t w = fwrite(buf, sz, n, f);
    int bad = w != n;
    if (fclose(f) != 0) bad = 1;
    return bad ? cli_error("%s: write failed", path) : 0;
}

static const char default_text[] =
    "The river rises in the hills north of the town and runs south through farmland for about forty "
    "miles before it reaches the sea. In the spring, when the snow melts, it floods the low fields on "
    "both banks, and the farmers move their animals to higher ground until the water goes down. The "
    "old stone bridge in the middle of the town was built more than three hundred years ago, and it has "
    "survived every flood since then, although the wooden mill beside it was swept away twice and had "
    "to be rebuilt. Today the mill is a small museum, and children come from the schools nearby to "
    "learn how grain was once ground into flour by the power of the water.";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The reference logits [T][V] of ids with storage st into a new *out (the caller frees it, also after a
 * failure) and its time in *secs; 0 or a one-line error (exit status 1). */
static int reference_run(const ib_model *m, const int32_t *ids, int T, int V, ib_ref_store st, double **out,
                         double *secs) {
    ib_error err;
    if (!(*out = malloc((size_t)T * V * sizeof **out)))
        return cli_error("out of memory for the %sreference logits (%d x %d)", st == IB_REF_STORE_F32 ? "float32-storage " : "",
                         T, V);
    double t0 = now_s();
    if (ib_reference_logits_stored(m, ids, T, st, *out, &err)) return cli_error("%s", err.msg);
    *secs = now_s() - t0;
    return 0;
}

/* The reference with the float32 storage st (reference_run into *buf, freed first) against the float64
 * reference ref [T][V], row by row into a: each row rounded to floats (row32 [V]) as an engine's are —
 * exact for the whole float32-storage pass, whose logits are floats. */
static int floor_pass(const ib_model *m, const int32_t *ids, int T, int V, ib_ref_store st, const double *ref,
                      float *row32, double **buf, ib_accuracy *a) {
    free(*buf);
    *buf = NULL;
    int rc = reference_run(m, ids, T, V, st, buf, &a->seconds);
    for (int t = 0; !rc && t < T; t++) {
        for (int i = 0; i < V; i++) row32[i] = (float)(*buf)[(size_t)t * V + i];
        ib_accuracy_add(a, ref + (size_t)t * V, row32, V);
    }
    return rc;
}

/* One table row of a floor pass: label, the figures, then the note in parentheses. */
static void print_floor_row(const char *label, const ib_accuracy *a, const char *note) {
    char agree[32];
    snprintf(agree, sizeof agree, "%d/%d = %.3f", a->top1_agree, a->tokens, a->top1_fraction);
    printf("%-5s%6d  %-16s %10.3e %10.3e %13.3e %10.3e %8.2f  (%s)\n", label, a->tokens, agree, a->kl_mean, a->kl_max,
           a->max_abs_diff, a->rel_l2, a->seconds, note);
}

/* A number, or null when it is not finite (JSON has no NaN or infinity). */
static json_t *jnum(double d) { return isfinite(d) ? json_real(d) : json_null(); }

static json_t *mode_json(const char *act, const ib_accuracy *a) {
    return json_pack("{s:s,s:i,s:i,s:o,s:o,s:o,s:o,s:o,s:f}", "act", act, "tokens", a->tokens, "top1_agree",
                     a->top1_agree, "top1_fraction", jnum(a->top1_fraction), "kl_mean", jnum(a->kl_mean), "kl_max",
                     jnum(a->kl_max), "max_abs_diff", jnum(a->max_abs_diff), "rel_l2", jnum(a->rel_l2), "seconds",
                     a->seconds);
}

int cmd_accuracy(int argc, char **argv) {
    const char *dir = NULL, *text = NULL, *idlist = NULL, *acts = "both", *logits_out = NULL, *ref_out = NULL;
    int no_ref = 0, per_pos = 0, floor_row = 0, floor_parts = 0;
    double *ref32 = NULL;   /* [T][V] --floor: the float32-storage reference; --floor-parts: each part's */
    float *row32 = NULL;    /* [V] one of its rows as floats */
    ib_accuracy floor_acc = {0}, part_acc[IB_REF_STORE_PARTS] = {{0}};
    ib_ref_store ref_store = IB_REF_STORE_F64;
    double *pos_l2 = NULL;   /* [T] --per-position: each position's relative L2 */
    float *eng = NULL;
    long n_tokens = 64, threads = sysconf(_SC_NPROCESSORS_ONLN);
    ib_isa isa = IB_ISA_AUTO;
    ib_kv_dtype kvd = IB_KV_F32;
    int json = 0, rc = 0;
    if (threads < 1) threads = 1;
    ib_model *m = NULL;
    int32_t *ids = NULL;
    double *ref = NULL;
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v = NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            return 0;
        }
#define VAL() (v = cli_value(argc, argv, &i))
        if (!strcmp(f, "-m")) rc = VAL() ? (dir = v, 0) : 2;
        else if (!strcmp(f, "-p")) rc = VAL() ? (text = v, 0) : 2;
        else if (!strcmp(f, "--prompt-ids")) rc = VAL() ? (idlist = v, 0) : 2;
        else if (!strcmp(f, "--tokens")) rc = VAL() ? cli_int(f, v, 2, 1 << 20, &n_tokens) : 2;
        else if ((!strcmp(f, "--threads") || !strcmp(f, "-t"))) rc = VAL() ? cli_int(f, v, 1, 256, &threads) : 2;
        else if (!strcmp(f, "--isa")) rc = VAL() ? cli_isa(v, &isa) : 2;
        else if (!strcmp(f, "--kv-dtype")) rc = VAL() ? cli_kv_dtype(v, &kvd) : 2;
        else if (!strcmp(f, "--act")) {
            if (!VAL()) rc = 2;
            else if (strcmp(v, "f32") && strcmp(v, "q8") && strcmp(v, "both"))
                rc = cli_usage_error("--act: unknown '%s' (f32, q8, both)", v);
            else acts = v;
        } else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--logits-out")) rc = VAL() ? (logits_out = v, 0) : 2;
        else if (!strcmp(f, "--ref-logits-out")) rc = VAL() ? (ref_out = v, 0) : 2;
        else if (!strcmp(f, "--no-reference")) no_ref = 1;
        else if (!strcmp(f, "--per-position")) per_pos = 1;
        else if (!strcmp(f, "--floor")) floor_row = 1;
        else if (!strcmp(f, "--floor-parts")) floor_parts = 1;
        else if (!strcmp(f, "--ref-store")) {
            if (!VAL()) rc = 2;
            else if (!strcmp(v, "f64")) ref_store = IB_REF_STORE_F64;
            else if (!strcmp(v, "f32")) ref_store = IB_REF_STORE_F32;
            else rc = cli_usage_error("--ref-store: unknown '%s' (f64, f32)", v);
        }
        else rc = cli_unknown_option("accuracy", f, help);
#undef VAL
    }
    if (rc) return rc;
    if (text && idlist) return cli_usage_error("accuracy: give -p or --prompt-ids, not both");
    if (logits_out && !strcmp(acts, "both")) return cli_usage_error("--logits-out: give one --act (f32 or q8)");
    if (no_ref && !logits_out) return cli_usage_error("--no-reference: only with --logits-out (nothing else to do)");
    if (no_ref && ref_out) return cli_usage_error("--ref-logits-out: not with --no-reference");
    if (per_pos && !strcmp(acts, "both")) return cli_usage_error("--per-position: give one --act (f32 or q8)");
    if (per_pos && no_ref) return cli_usage_error("--per-position: not with --no-reference (nothing to compare)");
    if (floor_row && (no_ref || ref_store != IB_REF_STORE_F64))
        return cli_usage_error("--floor: needs the float64 reference (not with --no-reference or --ref-store f32)");
    if (floor_parts && (no_ref || ref_store != IB_REF_STORE_F64))
        return cli_usage_error("--floor-parts: needs the float64 reference (not with --no-reference or --ref-store f32)");
    if (!(dir = cli_model_dir(dir))) return 2;
    ib_error err;
    ib_load_opts lo = {.threads = (int)threads};   /* the weights are repacked on as many threads */
    if (ib_model_load(dir, &lo, &m, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    const ib_model_info *info = ib_model_get_info(m);
    const int V = info->vocab_size;
    int T = 0;
    if (idlist) {
        if ((rc = cli_parse_ids(idlist, V, &ids, &T))) goto out;
    } else {
        const char *s = text ? text : default_text;
        int k = ib_tokenize(m, s, strlen(s), NULL, 0);
        if (k < 0) {
            rc = cli_error("-p: could not tokenize");
            goto out;
        }
        if (!(ids = malloc((size_t)(k > 0 ? k : 1) * sizeof *ids))) {
            rc = cli_error("out of memory");
            goto out;
        }
        T = ib_tokenize(m, s, strlen(s), ids, k);
    }
    if (T > n_tokens) T = (int)n_tokens;
    if (T < 2) {
        rc = cli_usage_error("accuracy: %d token%s; at least 2 are needed", T, T == 1 ? "" : "s");
        goto out;
    }
    double ref_s = 0;
    if (!no_ref) {
        if ((rc = reference_run(m, ids, T, V, ref_store, &ref, &ref_s))) goto out;
        if (ref_out && (rc = write_file(ref_out, ref, sizeof *ref, (size_t)T * V))) goto out;
    }
    if ((floor_row || floor_parts) && !(row32 = malloc((size_t)V * sizeof *row32))) {
        rc = cli_error("out of memory");
        goto out;
    }
    if (floor_row && (rc = floor_pass(m, ids, T, V, IB_REF_STORE_F32, ref, row32, &ref32, &floor_acc))) goto out;
    for (int i = 0; floor_parts && i < IB_REF_STORE_PARTS; i++) /* one part alone */
        if ((rc = floor_pass(m, ids, T, V, (ib_ref_store)(1 << i), ref, row32, &ref32, &part_acc[i]))) goto out;
    if ((logits_out || per_pos) && !(eng = malloc((size_t)T * V * sizeof *eng))) {
        rc = cli_error("out of memory for the engine logits (%d x %d)", T, V);
        goto out;
    }
    if (per_pos && !(pos_l2 = malloc((size_t)T * sizeof *pos_l2))) {
        rc = cli_error("out of memory");
        goto out;
    }

    /* the modes asked for; q8 of "both" is skipped on a float model (q8 needs quantized weights) */
    const char *names[2] = {"f32", "q8"};
    ib_act modes[2] = {IB_ACT_F32, IB_ACT_Q8};
    int run[2] = {strcmp(acts, "q8") != 0, strcmp(acts, "f32") != 0};
    int skipped_q8 = 0;
    if (!strcmp(acts, "both") && !info->quant_bits) run[1] = 0, skipped_q8 = 1;
    ib_accuracy acc[2] = {{0}};
    ib_isa isa_used = isa;
    for (int k = 0; k < 2; k++) {
        if (!run[k]) continue;
        ib_engine_opts eo = {.threads = (int)threads, .isa = isa, .act = modes[k], .max_step_tokens = 1};
        if (eng) { /* one mode (checked above): keep every row, compare them when there is a reference */
            if (ib_engine_logits_all(m, &eo, kvd, ids, T, eng, &acc[k].isa, &acc[k].seconds, &err)) {
                rc = cli_error("%s", err.msg);
                goto out;
            }
            for (int t = 0; ref && t < T; t++) {
                ib_accuracy_add(&acc[k], ref + (size_t)t * V, eng + (size_t)t * V, V);
                if (pos_l2) { /* this position alone */
                    ib_accuracy one = {0};
                    ib_accuracy_add(&one, ref + (size_t)t * V, eng + (size_t)t * V, V);
                    pos_l2[t] = one.rel_l2;
                }
            }
            if (logits_out && (rc = write_file(logits_out, eng, sizeof *eng, (size_t)T * V))) goto out;
        } else if (ib_accuracy_run(m, &eo, kvd, ids, T, ref, &acc[k], &err)) {
            rc = cli_error("%s", err.msg);
            goto out;
        }
        isa_used = acc[k].isa;
    }
    if (no_ref) {
        const char *an = run[0] ? names[0] : names[1];
        const ib_accuracy *a = &acc[run[0] ? 0 : 1];
        if (json) {
            json_t *o = json_pack("{s:s,s:i,s:i,s:i,s:s,s:i,s:s,s:b,s:f}", "model", dir, "tokens", T, "vocab", V,
                                  "quant_bits", info->quant_bits, "isa", ib_isa_name(isa_used), "threads", (int)threads,
                                  "act", an, "reference", 0, "seconds", a->seconds);
            char *js = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
            if (js) puts(js);
            free(js);
            json_decref(o);
        } else
            printf("isobatch accuracy: %d tokens, vocab %d, %s weights; no reference; engine (act %s, isa %s, %ld "
                   "thread%s) logits of every position written to %s in %.2f s\n",
                   T, V, info->weight_dtype, an, ib_isa_name(isa_used), threads, threads == 1 ? "" : "s", logits_out,
                   a->seconds);
        goto out;
    }
    if (json) {
        json_t *o = json_object(), *ms = json_array();
        json_object_set_new(o, "model", json_string(dir));
        json_object_set_new(o, "tokens", json_integer(T));
        json_object_set_new(o, "vocab", json_integer(V));
        json_object_set_new(o, "quant_bits", json_integer(info->quant_bits));
        json_object_set_new(o, "isa", json_string(ib_isa_name(isa_used)));
        json_object_set_new(o, "threads", json_integer(threads));
        json_object_set_new(o, "kv_dtype", json_string(ib_kv_dtype_name(kvd)));
        json_object_set_new(o, "reference_seconds", json_real(ref_s));
        json_object_set_new(o, "reference_store", json_string(ref_store == IB_REF_STORE_F32 ? "f32" : "f64"));
        for (int k = 0; k < 2; k++)
            if (run[k]) json_array_append_new(ms, mode_json(names[k], &acc[k]));
        if (skipped_q8)
            json_array_append_new(ms, json_pack("{s:s,s:s}", "act", "q8", "skipped", "the model's weights are not quantized"));
        json_object_set_new(o, "modes", ms);
        if (floor_row) json_object_set_new(o, "floor", mode_json("floor", &floor_acc));
        if (floor_parts) {
            json_t *fp = json_object();
            for (int i = 0; i < IB_REF_STORE_PARTS; i++) {
                const char *pn = ib_ref_store_part_name((ib_ref_store)(1 << i));
                json_object_set_new(fp, pn, mode_json(pn, &part_acc[i]));
            }
            json_object_set_new(o, "floor_parts", fp);
        }
        if (pos_l2) {
            json_t *pl = json_array();
            for (int t = 0; t < T; t++) json_array_append_new(pl, jnum(pos_l2[t]));
            json_object_set_new(o, "rel_l2_per_position", pl);
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("isobatch accuracy: %d tokens, vocab %d, %s weights; float64 reference%s in %.2f s; engine isa %s, %ld "
               "thread%s, %s KV\n",
               T, V, info->weight_dtype, ref_store == IB_REF_STORE_F32 ? " (float32 storage)" : "", ref_s,
               ib_isa_name(isa_used), threads, threads == 1 ? "" : "s", ib_kv_dtype_name(kvd));
        printf("%-4s %6s  %-16s %10s %10s %13s %10s %8s\n", "act", "tokens", "top-1 agree", "KL mean", "KL max",
               "max |dlogit|", "rel L2", "seconds");
        for (int k = 0; k < 2; k++) {
            if (!run[k]) continue;
            const ib_accuracy *a = &acc[k];
            char agree[32];
            snprintf(agree, sizeof agree, "%d/%d = %.3f", a->top1_agree, a->tokens, a->top1_fraction);
            printf("%-4s %6d  %-16s %10.3e %10.3e %13.3e %10.3e %8.2f\n", names[k], a->tokens, agree, a->kl_mean,
                   a->kl_max, a->max_abs_diff, a->rel_l2, a->seconds);
        }
        if (skipped_q8) printf("q8   skipped: the model's weights are not quantized\n");
        if (floor_row) print_floor_row("floor", &floor_acc, "float32 storage, double arithmetic");
        for (int i = 0; floor_parts && i < IB_REF_STORE_PARTS; i++) {
            char note[64];
            snprintf(note, sizeof note, "only %s stored as float32", ib_ref_store_part_name((ib_ref_store)(1 << i)));
            print_floor_row("part", &part_acc[i], note);
        }
        printf("(KL in nats per token, KL(reference || engine); rel L2 = ||engine - ref|| / ||ref|| over all logits)\n");
        if (pos_l2) {
            printf("rel L2 per position:");
            for (int t = 0; t < T; t++) printf("%s%d:%.2e", t % 8 ? " " : "\n  ", t, pos_l2[t]);
            printf("\n");
        }
    }
out:
    free(pos_l2);
    free(eng);
    free(ref);
    free(ref32);
    free(row32);
    free(ids);
    ib_model_free(m);
    return rc;
}
