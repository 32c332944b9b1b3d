/*
 * test_gemma4_kv.c — Gemma 4's per-layer KV caches. Sliding-window layers kept as rings of
 * sliding_window + kv_chunk - 1 slots must give bitwise the logits of a cache that keeps every
 * position: sessions far past the window, prefill chunks smaller and larger than the window, one token
 * at a time, batched with another session. Also: the bytes a session takes (and the admission figure
 * ib_session_kv_bytes_for), step items over kv_chunk refused, rewinds bounded by kv_chunk, sink+window
 * policies on gemma4 (they govern the full layers; a window below sliding_window is refused), and the
 * test-only kv-ring-short fault (rings one slot too small), which these comparisons must catch.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "isobatch.h"
#include "model/mkmodel.h"

#define PROMPT 90   /* prompt tokens: more than five windows of the preset (16) */
#define GEN 30      /* greedy tokens after it */
#define CTX 128

static ib_model *m;
static ib_engine *e;
static int V;
static int32_t prompt[PROMPT];

/* Index of the largest logit (ties to the lowest id). */
static int32_t argmax(const float *x) {
    int32_t b = 0;
    for (int32_t i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Make a session with options o (max_context CTX unless windowed); NULL after a failed check. */
static ib_session *make(int chunk, int sink, int window) {
    ib_session *s = NULL;
    ib_error err;
    ib_session_opts o = {.max_context = CTX, .kv_chunk = chunk, .kv_sink = sink, .kv_window = window};
    CHECK(ib_session_create(m, &o, &s, &err) == IB_OK, "session chunk %d sink %d window %d: %s", chunk, sink, window,
          err.msg);
    return s;
}

/* Feed the prompt to s in steps of `chunk` tokens, then GEN greedy tokens one a step; out [GEN + 1][V]:
 * the logits after the prompt, then after each generated token. */
static void run(ib_session *s, int chunk, float *out) {
    ib_error err;
    for (int i = 0; i < PROMPT; i += chunk) {
        int k = PROMPT - i < chunk ? PROMPT - i : chunk;
        ib_step_item it = {.session = s, .tokens = prompt + i, .n_tokens = k, .logits = i + k == PROMPT ? out : NULL, .argmax = NULL};
        CHECK(ib_step(e, &it, 1, &err) == IB_OK, "prefill step at %d (%d tokens): %s", i, k, err.msg);
    }
    for (int g = 0; g < GEN; g++) {
        int32_t t = argmax(out + (size_t)g * V);
        ib_step_item it = {.session = s, .tokens = &t, .n_tokens = 1, .logits = out + (size_t)(g + 1) * V, .argmax = NULL};
        CHECK(ib_step(e, &it, 1, &err) == IB_OK, "decode step %d: %s", g, err.msg);
    }
}

/* Whether a and b ([GEN + 1][V] each) are bitwise equal. */
static int same(const float *a, const float *b) { return memcmp(a, b, (size_t)(GEN + 1) * V * sizeof(float)) == 0; }

int main(void) {
    char dir[] = "/tmp/ib_g4kv_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    ib_error err;
    ib_mkmodel_opts mo = {.preset = "gemma4-tiny", .seed = 3, .bits = 32, .group = 64, .tied = 1};
    if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err) ||
        ib_engine_create(m, &(ib_engine_opts){.threads = 2, .max_step_tokens = 256}, &e, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const ib_model_info *in = ib_model_get_info(m);
    V = in->vocab_size;
    const int W = in->sliding_window;
    CHECK_EQ_INT(W, 16);
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((i * 37 + 11) % 300);
    size_t n = (size_t)(GEN + 1) * V;
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)), *two = malloc(n * sizeof(float));
    if (!ref || !got || !two) return 1;

    /* the reference: kv_chunk 0 keeps every position in every layer; the whole prompt in one step */
    ib_session *full = make(0, 0, 0);
    run(full, PROMPT, ref);

    /* rings: chunks of 5 (20 slots), 40 > the window (55 slots), 1 (16 slots: the window itself) */
    static const int chunks[] = {5, 40, 1, 7};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        ib_session *s = make(chunks[c], 0, 0);
        if (!s) continue;
        run(s, chunks[c], got);
        CHECK(same(ref, got), "ring of kv_chunk %d: logits differ from the full cache's", chunks[c]);
        /* its memory: full layers CTX slots, sliding layers W + chunk - 1, each at its own shape */
        size_t want = (in->kv_bytes_per_token - in->kv_bytes_per_token_sliding) * CTX +
                      in->kv_bytes_per_token_sliding * (size_t)(W + chunks[c] - 1);
        CHECK(ib_session_kv_bytes(s) == want, "kv_chunk %d: %zu bytes, want %zu", chunks[c], ib_session_kv_bytes(s), want);
        ib_session_opts o = {.max_context = CTX, .kv_chunk = chunks[c]};
        CHECK(ib_session_kv_bytes_for(m, &o) == want, "kv_chunk %d: ib_session_kv_bytes_for %zu, want %zu", chunks[c],
              ib_session_kv_bytes_for(m, &o), want);
        ib_session_free(s);
    }
    CHECK(ib_session_kv_bytes(full) == in->kv_bytes_per_token * CTX, "full session: %zu bytes, want %zu",
          ib_session_kv_bytes(full), in->kv_bytes_per_token * CTX);
    /* each layer at its own shape: sliding 2 x 2 heads x 32, full 2 x 1 head x 64, float */
    CHECK_EQ_INT(in->kv_bytes_per_token, 2 * (2 * 2 * 32 * 4) + 2 * (2 * 1 * 64 * 4));

    /* batched: a ring session (chunks of 5) and another (chunks of 7, other tokens) in the same steps */
    {
        ib_session *a = make(5, 0, 0), *b = make(7, 0, 0);
        int32_t other[PROMPT];
        for (int i = 0; i < PROMPT; i++) other[i] = (int32_t)((i * 13 + 5) % 300);
        int pa = 0, pb = 0, ok = 1;
        while (a && b && pa < PROMPT) {
            int ka = PROMPT - pa < 5 ? PROMPT - pa : 5, kb = pb < PROMPT ? (PROMPT - pb < 7 ? PROMPT - pb : 7) : 1;
            int32_t t = 1;
            ib_step_item it[2] = {{.session = a, .tokens = prompt + pa, .n_tokens = ka, .logits = pa + ka == PROMPT ? got : NULL, .argmax = NULL},
                                  {.session = b, .tokens = pb < PROMPT ? other + pb : &t, .n_tokens = kb, .logits = two, .argmax = NULL}};
            if (ib_step(e, it, 2, &err) != IB_OK) ok = 0;
            pa += ka;
            pb += kb;
        }
        CHECK(ok, "batched prefill failed: %s", err.msg);
        for (int g = 0; a && b && g < GEN; g++) {
            int32_t ta = argmax(got + (size_t)g * V), tb = argmax(two);
            ib_step_item it[2] = {{.session = b, .tokens = &tb, .n_tokens = 1, .logits = two, .argmax = NULL}, {.session = a, .tokens = &ta, .n_tokens = 1, .logits = got + (size_t)(g + 1) * V, .argmax = NULL}};
            if (ib_step(e, it, 2, &err) != IB_OK) ok = 0;
        }
        CHECK(ok && same(ref, got), "a ring session batched with another differs from the full cache alone");
        ib_session_free(a);
        ib_session_free(b);
    }

    /* an item over kv_chunk is refused; rewinds go back at most kv_chunk tokens */
    {
        ib_session *s = make(5, 0, 0);
        ib_step_item it = {.session = s, .tokens = prompt, .n_tokens = 6, .logits = NULL, .argmax = NULL};
        CHECK(s && ib_step(e, &it, 1, &err) == IB_ERR_INVALID_ARG && strstr(err.msg, "kv_chunk 5"), "6 tokens into kv_chunk 5: %s",
              err.msg);
        run(s, 5, got); /* at PROMPT + GEN */
        int at = PROMPT + GEN;
        CHECK(ib_session_rewind(s, at - 6, &err) == IB_ERR_UNSUPPORTED, "rewind by 6 of a kv_chunk 5 ring accepted");
        CHECK(ib_session_rewind(s, at - 5, &err) == IB_OK, "rewind by 5: %s", err.msg);
        /* refeed the 5 tokens: the logits after them are those of the first pass */
        int32_t t5[5];
        for (int g = 0; g < 5; g++) t5[g] = argmax(got + (size_t)(GEN - 5 + g) * V);
        float *last = malloc((size_t)V * sizeof(float));
        ib_step_item re = {.session = s, .tokens = t5, .n_tokens = 5, .logits = last, .argmax = NULL};
        CHECK(last && ib_step(e, &re, 1, &err) == IB_OK, "refeed: %s", err.msg);
        CHECK(last && !memcmp(last, got + (size_t)GEN * V, (size_t)V * sizeof(float)), "logits after a rewind and refeed differ");
        free(last);
        ib_session_free(s);
    }

    /* sink+window sessions: the policy governs the full layers */
    {
        ib_session *s = NULL;
        ib_session_opts o = {.kv_sink = 2, .kv_window = W - 1};
        CHECK(ib_session_create(m, &o, &s, &err) == IB_ERR_UNSUPPORTED && strstr(err.msg, "sliding_window"),
              "window below sliding_window: %s", err.msg);
        ib_session *a = make(5, 2, 40), *b = make(1, 2, 40);
        float *ga = malloc(n * sizeof(float)), *gb = malloc(n * sizeof(float));
        if (a && b && ga && gb) {
            run(a, 5, ga);
            run(b, 1, gb);
            CHECK(same(ga, gb), "sink 2 window 40: chunks of 5 differ from one token a step");
            CHECK(!same(ga, ref), "sink 2 window 40: equals the full cache 80 positions past its window");
            /* before the window slides a sink-0 window is the full cache, bitwise (the same key blocks;
             * sinks cut the blocks elsewhere): 40 tokens */
            ib_session *c = make(5, 0, 40), *f = make(0, 0, 0);
            float *lc = malloc((size_t)V * sizeof(float)), *lf = malloc((size_t)V * sizeof(float));
            ib_step_item ic = {.session = c, .tokens = prompt, .n_tokens = 5, .logits = NULL, .argmax = NULL}, iff = {.session = f, .tokens = prompt, .n_tokens = 40, .logits = lf, .argmax = NULL};
            int ok = c && f && lc && lf;
            for (int i = 0; ok && i < 40; i += 5) {
                ic.tokens = prompt + i;
                ic.logits = i + 5 == 40 ? lc : NULL;
                ok = ib_step(e, &ic, 1, &err) == IB_OK;
            }
            ok = ok && ib_step(e, &iff, 1, &err) == IB_OK;
            CHECK(ok && !memcmp(lc, lf, (size_t)V * sizeof(float)), "window 40 at 40 tokens differs from the full cache");
            free(lc);
            free(lf);
            ib_session_free(c);
            ib_session_free(f);
        }
        free(ga);
        free(gb);
        ib_session_free(a);
        ib_session_free(b);
    }

    /* the fault these comparisons must catch: rings one slot too small */
    ib_fault_set(IB_FAULT_KV_RING_SHORT);
    {
        ib_session *s = make(5, 0, 0);
        if (s) {
            run(s, 5, got);
            CHECK(!same(ref, got), "kv-ring-short: a ring one slot too small still equals the full cache");
            ib_session_free(s);
        }
    }
    ib_fault_set(IB_FAULT_NONE);

    ib_session_free(full);
    free(ref);
    free(got);
    free(two);
    ib_engine_free(e);
    ib_model_free(m);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_MAIN_END("test_gemma4_kv");
}
