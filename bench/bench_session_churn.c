/*
 * bench_session_churn.c — what a server's session churn costs on the CPU backend: N times, a session of
 * --context slots is created, its --prompt tokens prefilled in one step, and freed (as a completions
 * request does). Prints the median of the N create + prefill + free times, and of the prefill steps
 * alone. Run it with IB_KV_POOL_MB=0 and without (src/backends/cpu/kv_blocks.h) to see what reusing
 * ended sessions' cache memory saves.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude bench/bench_session_churn.c build/libisobatch.a <libs> -o churn
 *   ./churn MODEL_DIR [--context 4096] [--prompt 128] [--n 9] [--threads 2] [--kv-dtype f16]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "isobatch.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [--context N] [--prompt N] [--n N] [--threads N] [--kv-dtype f32|f16|q8]\n", argv[0]);
        return 2;
    }
    int context = 4096, prompt = 128, n = 9, threads = 2;
    ib_kv_dtype kvt = IB_KV_F16;
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--context")) context = atoi(v);
        else if (!strcmp(k, "--prompt")) prompt = atoi(v);
        else if (!strcmp(k, "--n")) n = atoi(v);
        else if (!strcmp(k, "--threads")) threads = atoi(v);
        else if (!strcmp(k, "--kv-dtype")) kvt = !strcmp(v, "q8") ? IB_KV_Q8 : !strcmp(v, "f32") ? IB_KV_F32 : IB_KV_F16;
        else {
            fprintf(stderr, "unknown option %s\n", k);
            return 2;
        }
    }
    if (n < 1 || n > 1000 || prompt < 1 || context < prompt) {
        fprintf(stderr, "bad --n, --prompt or --context\n");
        return 2;
    }
    ib_error err;
    ib_model *m;
    ib_engine *e;
    if (ib_model_load(argv[1], NULL, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ib_engine_opts eo = {.threads = threads};
    if (ib_engine_create(m, &eo, &e, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int V = ib_model_get_info(m)->vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *ids = malloc((size_t)prompt * sizeof *ids);
    double *whole = malloc((size_t)n * sizeof *whole), *pre = malloc((size_t)n * sizeof *pre);
    if (!logits || !ids || !whole || !pre) return 1;
    for (int i = 0; i < prompt; i++) ids[i] = (int32_t)((i * 7919 + 13) % V);
    ib_session_opts so = {.max_context = context, .sampling = ib_sampling_default(), .kv_dtype = kvt};
    for (int r = 0; r < n; r++) {
        const double t0 = now();
        ib_session *s;
        if (ib_session_create(m, &so, &s, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        ib_step_item it = {.session = s, .tokens = ids, .n_tokens = prompt, .logits = logits};
        const double t1 = now();
        if (ib_step(e, &it, 1, &err)) {
            fprintf(stderr, "step: %s\n", err.msg);
            return 1;
        }
        const double t2 = now();
        ib_session_free(s);
        whole[r] = now() - t0, pre[r] = t2 - t1;
    }
    qsort(whole, (size_t)n, sizeof *whole, cmp_d);
    qsort(pre, (size_t)n, sizeof *pre, cmp_d);
    printf("sessions of %d slots (%.1f MB of KV each), %d-token prefill, %d times: create+prefill+free median %.2f ms, "
           "prefill step median %.2f ms (%.1f tok/s)\n",
           context, (double)ib_session_kv_bytes_for(m, &so) / 1e6, prompt, n, whole[n / 2] * 1e3, pre[n / 2] * 1e3,
           prompt / pre[n / 2]);
    free(logits), free(ids), free(whole), free(pre);
    ib_engine_free(e);
    ib_model_free(m);
    return 0;
}
