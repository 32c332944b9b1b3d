/*
 * two_sessions.c — embedding isobatch: load a model, open two sessions, prefill both in one batched
 * step, then decode them together and show that each session's tokens match a run of it alone.
 *
 *   make examples && build/examples/two_sessions MODEL_DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isobatch.h"

#define NEW_TOKENS 8

/* Decode NEW_TOKENS greedy tokens for the sessions in `s` together; tokens out: [n][NEW_TOKENS]. */
static int decode(ib_engine *e, ib_session **s, const char **prompts, int n, const ib_model *m, int32_t out[][NEW_TOKENS]) {
    int V = ib_model_get_info(m)->vocab_size;
    ib_error err;
    ib_step_item items[2];
    int32_t ids[2][256], next[2];
    float *logits = malloc(sizeof(float) * V * 2);
    if (!logits) return 1;
    for (int i = 0; i < n; i++) {
        int k = ib_tokenize(m, prompts[i], strlen(prompts[i]), ids[i], 256);
        if (k < 1 || k > 256) return 1;
        items[i] = (ib_step_item){.session = s[i], .tokens = ids[i], .n_tokens = k, .logits = logits + (size_t)i * V};
    }
    for (int t = 0; t < NEW_TOKENS; t++) {
        if (ib_step(e, items, n, &err)) { /* prefill at t == 0, one decode token after */
            fprintf(stderr, "step: %s\n", err.msg);
            free(logits);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            next[i] = ib_sample(s[i], logits + (size_t)i * V);
            out[i][t] = next[i];
            items[i].tokens = &next[i];
            items[i].n_tokens = 1;
        }
    }
    free(logits);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
        return 2;
    }
    ib_error err;
    ib_model *m;
    ib_engine *e;
    if (ib_model_load(argv[1], NULL, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ib_engine_opts eo = {.threads = 2};
    if (ib_engine_create(m, &eo, &e, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const char *prompts[2] = {"Once upon a time", "The answer is"};
    ib_session_opts so = {.max_context = 512, .sampling = ib_sampling_default()};
    ib_session *s[2];
    for (int i = 0; i < 2; i++)
        if (ib_session_create(m, &so, &s[i], &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    int32_t together[2][NEW_TOKENS], alone[1][NEW_TOKENS];
    int rc = decode(e, s, prompts, 2, m, together);
    for (int i = 0; i < 2 && !rc; i++) {
        ib_session_reset(s[i]);
        rc = decode(e, &s[i], &prompts[i], 1, m, alone);
        int same = memcmp(alone[0], together[i], sizeof alone[0]) == 0;
        printf("session %d (\"%s\"): batched tokens", i, prompts[i]);
        for (int t = 0; t < NEW_TOKENS; t++) printf(" %d", together[i][t]);
        printf(" — %s\n", same ? "identical to decoding alone" : "DIFFERENT from decoding alone");
        if (!same) rc = 1;
    }
    for (int i = 0; i < 2; i++) ib_session_free(s[i]);
    ib_engine_free(e);
    ib_model_free(m);
    return rc;
}
