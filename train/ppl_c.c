/*
 * ppl_c.c — held-out perplexity and logits of a model run by the isobatch C engine.
 *
 * Reads token ids (decimal, separated by commas/whitespace) from IDS_FILE, cuts them into windows of
 * W tokens, and feeds each window to a fresh session one token per ib_step, so every position's
 * logits are available: NLL of each next token (log-softmax in double), summed over all windows.
 * Optionally writes the float32 logits of the first N positions of the first window (row-major
 * [N][vocab], little-endian) for comparison with PyTorch (train/compare_logits.py).
 *
 * Build:  cc -O2 -std=c11 -Iinclude train/ppl_c.c build/libisobatch.a <Makefile LDLIBS> -o build/ppl_c
 * Usage:  build/ppl_c -m DIR --ids FILE [--window 2048] [--act f32|q8] [--threads T]
 *                     [--logits-out F --logits-n N] [--max-tokens M]
 * Prints one JSON line: {"act", "tokens", "nll", "ppl", "windows", "seconds"}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "isobatch.h"

/* Parse all decimal integers of a file into a malloc'd array; returns the count or -1. */
static long read_ids(const char *path, int32_t **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long cap = 1024, n = 0;
    int32_t *v = malloc(cap * sizeof *v);
    long cur = -1;
    int c;
    while (v && (c = fgetc(f)) != EOF) {
        if (c >= '0' && c <= '9') {
            cur = (cur < 0 ? 0 : cur * 10) + (c - '0');
            continue;
        }
        if (cur >= 0) {
            if (n == cap) { cap *= 2; int32_t *t = realloc(v, cap * sizeof *v); if (!t) { free(v); v = NULL; break; } v = t; }
            v[n++] = (int32_t)cur;
            cur = -1;
        }
    }
    if (v && cur >= 0) {
        if (n == cap) { int32_t *t = realloc(v, (cap + 1) * sizeof *v); if (!t) { free(v); v = NULL; } else v = t; }
        if (v) v[n++] = (int32_t)cur;
    }
    fclose(f);
    if (!v) return -1;
    *out = v;
    return n;
}

/* -log softmax(logits)[target] in double. */
static double nll_of(const float *logits, int V, int target) {
    double mx = logits[0];
    for (int i = 1; i < V; i++) if (logits[i] > mx) mx = logits[i];
    double s = 0.0;
    for (int i = 0; i < V; i++) s += exp((double)logits[i] - mx);
    return -(((double)logits[target] - mx) - log(s));
}

int main(int argc, char **argv) {
    const char *dir = "models/default", *ids_path = NULL, *act_s = "f32", *lout = NULL;
    int window = 2048, threads = 2, logits_n = 0;
    long max_tokens = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "ppl_c: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "-m")) dir = v;
        else if (!strcmp(a, "--ids")) ids_path = v;
        else if (!strcmp(a, "--window")) window = atoi(v);
        else if (!strcmp(a, "--act")) act_s = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--logits-out")) lout = v;
        else if (!strcmp(a, "--logits-n")) logits_n = atoi(v);
        else if (!strcmp(a, "--max-tokens")) max_tokens = atol(v);
        else { fprintf(stderr, "ppl_c: unknown option %s\n", a); return 2; }
        i++;
    }
    if (!ids_path || window < 2) { fprintf(stderr, "usage: ppl_c -m DIR --ids FILE [--window W] [--act f32|q8]\n"); return 2; }
    int32_t *ids = NULL;
    long n = read_ids(ids_path, &ids);
    if (n < 2) { fprintf(stderr, "ppl_c: %s: no token ids\n", ids_path); return 1; }
    if (max_tokens > 0 && n > max_tokens) n = max_tokens;

    ib_error err;
    ib_model *m = NULL;
    ib_engine *e = NULL;
    ib_session *s = NULL;
    ib_act act;
    if (ib_act_parse(act_s, &act)) { fprintf(stderr, "ppl_c: bad --act %s\n", act_s); return 2; }
    if (ib_model_load(dir, NULL, &m, &err)) { fprintf(stderr, "ppl_c: %s\n", err.msg); return 1; }
    int V = ib_model_get_info(m)->vocab_size;
    ib_engine_opts eo = {.threads = threads, .act = act};
    ib_session_opts so = {.max_context = window};
    so.sampling = ib_sampling_default();
    if (ib_engine_create(m, &eo, &e, &err) || ib_session_create(m, &so, &s, &err)) {
        fprintf(stderr, "ppl_c: %s\n", err.msg);
        return 1;
    }
    float *logits = malloc((size_t)V * sizeof *logits);   /* [V] */
    FILE *lf = lout ? fopen(lout, "wb") : NULL;
    if (!logits || (lout && !lf)) { fprintf(stderr, "ppl_c: cannot allocate or open %s\n", lout ? lout : ""); return 1; }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double tot = 0.0;
    long cnt = 0, windows = 0;
    for (long w0 = 0; w0 + 1 < n; w0 += window) {
        long wl = n - w0 < window ? n - w0 : window;
        ib_session_reset(s);
        for (long t = 0; t < wl; t++) {
            ib_step_item it = {.session = s, .tokens = &ids[w0 + t], .n_tokens = 1, .logits = logits};
            if (ib_step(e, &it, 1, &err)) { fprintf(stderr, "ppl_c: %s\n", err.msg); return 1; }
            if (lf && windows == 0 && t < logits_n) fwrite(logits, sizeof *logits, (size_t)V, lf);
            if (t + 1 < wl) { tot += nll_of(logits, V, ids[w0 + t + 1]); cnt++; }
        }
        windows++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (lf) fclose(lf);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("{\"act\":\"%s\",\"tokens\":%ld,\"nll\":%.6f,\"ppl\":%.4f,\"windows\":%ld,\"seconds\":%.1f}\n",
           act_s, cnt, tot / (double)cnt, exp(tot / (double)cnt), windows, secs);
    free(logits);
    free(ids);
    ib_session_free(s);
    ib_engine_free(e);
    ib_model_free(m);
    return 0;
}
