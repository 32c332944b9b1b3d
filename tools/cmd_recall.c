/*
 * cmd_recall.c — `isobatch recall`: the multi-tenant needle test (src/diag/recall.c). N sessions, each
 * its own haystack and needle (spec/needle.md), decoded serialized and batched; recall per mode,
 * tokens/s per mode, and whether every session's output matched bitwise.
 */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "diag/diag.h"

static const char help[] =
    "usage: isobatch recall [-m DIR] [--sessions N] [--length L] [--batch B] [--threads N] [--isa I]\n"
    "         [--act A] [--spec FILE] [--first-case K] [--words heldout|train] [--json] [--progress] [--inject FAULT]\n"
    "\n"
    "Builds N needle-in-a-haystack benchmark cases (spec/needle.md: held-out words, seeds\n"
    "benchmark_seed_base + K + i, each document at most L tokens), decodes each greedily alone and then\n"
    "B sessions per step, and prints recall, tokens/s and bitwise agreement for both modes. Each case\n"
    "generates up to the longest expected answer's tokens + 1, fewer when its own prompt leaves less\n"
    "room in the model's context; the same in both modes.\n"
    "Exit 1 when a batched output differs from its serialized one.\n"
    "\n"
    "  -m DIR            model directory (default models/default)\n"
    "  --sessions N      cases, one session each (default 8)\n"
    "  --length L        document length in tokens (default 512; the benchmark's are 512 and 2048)\n"
    "  --batch B         sessions per step in the batched mode (default: N)\n"
    "  --threads N       engine threads (default: the CPUs online)\n"
    "  --isa, --act      kernels and activation mode (as generate)\n"
    "  --backend B       cpu (default) or cuda\n"
    "  --max-step-tokens N  tokens per step over all sessions (default: enough to prefill the batch's\n"
    "                    whole prompts in one step, at most 16384; decode steps then carry one token each)\n"
    "  --spec FILE       the needle spec (default spec/needle.json, else beside the executable's ../spec)\n"
    "  --first-case K    start at case K (seed benchmark_seed_base + K; default 0)\n"
    "  --words W         heldout (the benchmark, default) or train: code words the model was trained on,\n"
    "                    a diagnostic for models that only retrieve those (not a recall benchmark)\n"
    "  --json            one JSON object\n"
    "  --progress        cases done and the running recall on stderr as they finish (the default when\n"
    "                    stderr is a terminal; --no-progress turns it off)\n"
    "  --inject FAULT    test-only: break a kernel on purpose (see `isobatch generate --help`)\n";

/* Default spec path: ./spec/needle.json, else <dir of the executable>/../spec/needle.json. */
static const char *find_spec(char *buf, size_t cap) {
    if (access("spec/needle.json", R_OK) == 0) return "spec/needle.json";
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(buf, cap, "%s/../spec/needle.json", exe);
            if (access(buf, R_OK) == 0) return buf;
        }
    }
    return "spec/needle.json";
}

/* s as valid UTF-8 (invalid bytes as U+FFFD) with control characters as '.', in a new string. */
static char *clean(const char *s) {
    size_t n = s ? strlen(s) : 0;
    char *out = malloc(3 * n + 8);
    if (!out) return NULL;
    cli_utf8_sanitize(s ? s : "", n, out, 3 * n + 8);
    for (char *c = out; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '.';
    return out;
}

/* s quoted into buf, cut to about `chars` characters. */
static void show(const char *s, char *buf, size_t cap, int chars) {
    size_t o = 0;
    buf[o++] = '"';
    for (int k = 0; s && *s && o + 6 < cap; s++) {
        if (((unsigned char)*s & 0xc0) != 0x80 && k++ == chars) break;
        buf[o++] = *s;
    }
    while (o > 1 && ((unsigned char)buf[o - 1] & 0xc0) == 0xc0) o--;  /* no cut lead byte */
    buf[o++] = '"';
    buf[o] = '\0';
}

/* Print s left-aligned in a field of w characters (UTF-8 aware). */
static void put_padded(const char *s, int w) {
    int k = 0;
    for (const char *c = s; *c; c++) k += ((unsigned char)*c & 0xc0) != 0x80;
    fputs(s, stdout);
    for (; k < w; k++) putchar(' ');
}

static double rate(const ib_recall_mode *m) {
    return m->seconds > 0 ? (double)(m->prompt_tokens + m->generated_tokens) / m->seconds : 0.0;
}

static json_t *mode_json(const ib_recall_mode *m, int n) {
    return json_pack("{s:i,s:i,s:f,s:f,s:I,s:I,s:f}", "recalled", m->recalled, "cases", n, "recall",
                     n ? (double)m->recalled / n : 0.0, "seconds", m->seconds, "prompt_tokens",
                     (json_int_t)m->prompt_tokens, "generated_tokens", (json_int_t)m->generated_tokens, "tokens_per_s",
                     rate(m));
}

/* Progress on stderr: one line rewritten in place ("\r") as cases finish, ended by a newline when a
 * mode is done. */
static void show_progress(void *ctx, const char *mode, int done, int n, int ok) {
    fprintf(stderr, "\rrecall: %-10s %d/%d cases done, running recall %d/%d", mode, done, n, ok, done);
    if (done == n) fputc('\n', stderr);
    fflush(stderr);
}

int cmd_recall(int argc, char **argv) {
    const char *dir = NULL, *spec_path = NULL;
    long sessions = 8, length = 512, batch = 0, threads = sysconf(_SC_NPROCESSORS_ONLN), first = 0, max_step = 0;
    ib_isa isa = IB_ISA_AUTO;
    ib_backend_kind backend = IB_BACKEND_CPU;
    ib_act act = IB_ACT_AUTO;
    int json = 0, rc = 0, train_words = 0, progress = isatty(2); /* progress on a terminal by default */
    if (threads < 1) threads = 1;
    ib_model *m = NULL;
    ib_needle_spec *sp = NULL;
    ib_needle_case *cases = NULL;
    ib_recall_result r = {0};
    char specbuf[PATH_MAX + 32];
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v = NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            return 0;
        }
#define VAL() (v = cli_value(argc, argv, &i))
        if (!strcmp(f, "-m")) rc = VAL() ? (dir = v, 0) : 2;
        else if (!strcmp(f, "--sessions")) rc = VAL() ? cli_int(f, v, 1, 4096, &sessions) : 2;
        else if (!strcmp(f, "--length")) rc = VAL() ? cli_int(f, v, 16, 1 << 20, &length) : 2;
        else if (!strcmp(f, "--batch")) rc = VAL() ? cli_int(f, v, 1, 4096, &batch) : 2;
        else if ((!strcmp(f, "--threads") || !strcmp(f, "-t"))) rc = VAL() ? cli_int(f, v, 1, 256, &threads) : 2;
        else if (!strcmp(f, "--max-step-tokens")) rc = VAL() ? cli_int(f, v, 1, 1 << 20, &max_step) : 2;
        else if (!strcmp(f, "--first-case")) rc = VAL() ? cli_int(f, v, 0, 1L << 40, &first) : 2;
        else if (!strcmp(f, "--spec")) rc = VAL() ? (spec_path = v, 0) : 2;
        else if (!strcmp(f, "--words")) {
            if (!VAL()) rc = 2;
            else if (!strcmp(v, "train")) train_words = 1;
            else if (strcmp(v, "heldout")) rc = cli_usage_error("--words: unknown '%s' (heldout, train)", v);
        }
        else if (!strcmp(f, "--isa")) rc = VAL() ? cli_isa(v, &isa) : 2;
        else if (!strcmp(f, "--backend")) rc = VAL() ? cli_backend(v, &backend) : 2;
        else if (!strcmp(f, "--act")) {
            rc = VAL() ? cli_act(v, &act) : 2;
        } else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--progress")) progress = 1;
        else if (!strcmp(f, "--no-progress")) progress = 0;
        else if (!strcmp(f, "--inject")) rc = VAL() ? cli_inject(v) : 2;
        else rc = cli_unknown_option("recall", f, help);
#undef VAL
    }
    if (rc) return rc;
    if (!batch) batch = sessions;
    if (!spec_path) spec_path = find_spec(specbuf, sizeof specbuf);
    if (!(dir = cli_model_dir(dir))) return 2;
    ib_error err;
    ib_load_opts lo = {.threads = (int)threads};   /* the weights are repacked on as many threads */
    if (ib_needle_spec_load(spec_path, &sp, &err) || ib_model_load(dir, &lo, &m, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    if (train_words) ib_needle_use_train_words(sp);
    cases = calloc((size_t)sessions, sizeof *cases);
    if (!cases) {
        rc = cli_error("out of memory");
        goto out;
    }
    uint64_t base = ib_needle_seed_base(sp) + (uint64_t)first;
    for (long i = 0; i < sessions; i++)
        if (ib_needle_case_make(sp, m, base + (uint64_t)i, (int)length, &cases[i], &err)) {
            rc = cli_error("%s", err.msg);
            goto out;
        }
    ib_recall_opts o = {.batch = (int)batch, .threads = (int)threads, .isa = isa, .act = act, .backend = backend,
                        .max_step_tokens = (int)max_step, .progress = progress ? show_progress : NULL};
    if (ib_recall_run(m, cases, (int)sessions, &o, &r, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    int n = (int)sessions, same = 0;
    for (int i = 0; i < n; i++) same += r.match[i];
    /* printable, valid UTF-8 copies of the outputs (JSON strings must be UTF-8) */
    for (int i = 0; i < n; i++) {
        char *a = clean(r.text_serial[i]), *b = clean(r.text_batched[i]);
        if (!a || !b) {
            free(a);
            free(b);
            rc = cli_error("out of memory");
            goto out;
        }
        free(r.text_serial[i]);
        free(r.text_batched[i]);
        r.text_serial[i] = a;
        r.text_batched[i] = b;
    }
    int heldout = 0;
    for (int k = 0; ib_needle_heldout_length(sp, k) >= 0; k++) heldout |= ib_needle_heldout_length(sp, k) == length;
    if (json) {
        json_t *o_ = json_object(), *cs = json_array();
        for (int i = 0; i < n; i++) {
            const ib_needle_case *c = &cases[i];
            json_array_append_new(cs, json_pack("{s:I,s:i,s:i,s:i,s:i,s:s,s:s,s:s,s:b,s:b,s:b}", "seed",
                                                (json_int_t)c->seed, "depth", c->depth, "doc_tokens", c->doc_tokens,
                                                "prompt_tokens", c->n_ids, "max_new_tokens", r.max_new[i], "code",
                                                c->code, "serialized", r.text_serial[i], "batched",
                                                r.text_batched[i], "recalled_serialized", r.ok_serial[i],
                                                "recalled_batched", r.ok_batched[i], "match", r.match[i]));
        }
        json_object_set_new(o_, "sessions", json_integer(n));
        json_object_set_new(o_, "length", json_integer(length));
        json_object_set_new(o_, "heldout_length", json_boolean(heldout));
        json_object_set_new(o_, "batch", json_integer(batch));
        json_object_set_new(o_, "fault", json_string(ib_fault_name(ib_fault_get())));
        json_object_set_new(o_, "serialized", mode_json(&r.serial, n));
        json_object_set_new(o_, "batched", mode_json(&r.batched, n));
        json_object_set_new(o_, "matched", json_integer(same));
        json_object_set_new(o_, "bitwise_match", json_boolean(r.all_match));
        json_object_set_new(o_, "cases", cs);
        char *s = json_dumps(o_, JSON_COMPACT);
        if (s) puts(s);
        free(s);
        json_decref(o_);
    } else {
        printf("isobatch recall: %d sessions, documents of at most %ld tokens%s, seeds %llu..%llu, batched %ld per step%s%s\n",
               n, length, heldout ? "" : " (not a held-out benchmark length)", (unsigned long long)base,
               (unsigned long long)(base + n - 1), batch, ib_fault_get() ? "; injected fault: " : "",
               ib_fault_get() ? ib_fault_name(ib_fault_get()) : "");
        printf("%-4s %-11s %5s %6s  %-12s %-24s %-24s %s\n", "case", "seed", "depth", "tokens", "code", "serialized",
               "batched", "bitwise");
        for (int i = 0; i < n; i++) {
            char a[64], b[64], sa[80], sb[80];
            show(r.text_serial[i], a, sizeof a, 16);
            show(r.text_batched[i], b, sizeof b, 16);
            snprintf(sa, sizeof sa, "%s %s", a, r.ok_serial[i] ? "ok" : "miss");
            snprintf(sb, sizeof sb, "%s %s", b, r.ok_batched[i] ? "ok" : "miss");
            printf("%-4d %-11llu %5d %6d  %-12s ", i, (unsigned long long)cases[i].seed, cases[i].depth, cases[i].n_ids,
                   cases[i].code);
            put_padded(sa, 24);
            putchar(' ');
            put_padded(sb, 24);
            printf(" %s\n", r.match[i] ? "same" : "DIFFERS");
        }
        const ib_recall_mode *ms[2] = {&r.serial, &r.batched};
        const char *names[2] = {"serialized", "batched"};
        for (int k = 0; k < 2; k++)
            printf("%-10s  recall %d/%d = %.3f   %ld prompt + %ld generated tokens in %.2f s = %.1f tok/s\n", names[k],
                   ms[k]->recalled, n, (double)ms[k]->recalled / n, ms[k]->prompt_tokens, ms[k]->generated_tokens,
                   ms[k]->seconds, rate(ms[k]));
        printf("bitwise: %d of %d sessions identical batched and serialized%s\n", same, n,
               r.all_match ? "" : " -- batching changed answers");
    }
    if (!r.all_match) rc = 1;
out:
    ib_recall_result_free(&r);
    for (long i = 0; cases && i < sessions; i++) ib_needle_case_free(&cases[i]);
    free(cases);
    ib_needle_spec_free(sp);
    ib_model_free(m);
    return rc;
}
