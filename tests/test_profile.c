/*
 * test_profile.c — the step profile (ib_engine_opts.profile, backends/profile.c): an engine that
 * profiles gives bitwise the logits and argmax of one that does not; each category is called as
 * often as the model's layers say (Qwen3-shaped tiny, and Gemma 4 MoE with per-layer embeddings);
 * the times are non-negative and add up to at most the steps' wall time; reset zeroes them; an engine
 * without profiling and a CUDA engine with it are refused.
 */
#include <string.h>
#include <time.h>

#include "check.h"
#include "isobatch.h"
#include "model/mkmodel.h"

#define N_SESS 3
#define N_STEPS 5

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Run a fixed scenario on e (N_STEPS steps, each wanting logits: prefills of different lengths in one
 * step, an item wanting only its argmax, then decode steps of every session). The logits of each
 * step's items, back to back, go to out (N_STEPS * N_SESS * V floats), argmaxes to am; *wall gets the
 * seconds spent inside ib_step. */
static void scenario(const ib_model *m, ib_engine *e, float *out, int32_t *am, double *wall) {
    int V = ib_model_get_info(m)->vocab_size;
    ib_error err;
    ib_session *s[N_SESS];
    for (int i = 0; i < N_SESS; i++)
        CHECK(ib_session_create(m, &(ib_session_opts){.max_context = 64}, &s[i], &err) == IB_OK, "%s", err.msg);
    int32_t t[3][16];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 16; k++) t[i][k] = (int32_t)((k * 37 + i * 11 + 3) % V);
    memset(out, 0, sizeof(float) * N_STEPS * N_SESS * V);
    memset(am, 0, sizeof(int32_t) * N_STEPS * N_SESS);
    float *o = out;
    *wall = 0;
    for (int step = 0; step < N_STEPS; step++) {
        ib_step_item it[N_SESS];
        int n = 0;
        if (step == 0) {
            it[n++] = (ib_step_item){.session = s[0], .tokens = t[0], .n_tokens = 12, .logits = o, .argmax = NULL};
            it[n++] = (ib_step_item){.session = s[1], .tokens = t[1], .n_tokens = 5, .logits = o + V, .argmax = NULL};
        } else if (step == 1) {
            it[n++] = (ib_step_item){.session = s[0], .tokens = t[0] + 12, .n_tokens = 1, .logits = o, .argmax = NULL};
            it[n++] = (ib_step_item){.session = s[1], .tokens = t[1] + 5, .n_tokens = 1, .logits = NULL, .argmax = &am[step * N_SESS + 1]};
            it[n++] = (ib_step_item){.session = s[2], .tokens = t[2], .n_tokens = 7, .logits = o + 2 * V, .argmax = &am[step * N_SESS + 2]};
        } else {
            for (int i = 0; i < N_SESS; i++)
                it[n++] = (ib_step_item){.session = s[i], .tokens = &t[i][12 + step - 2], .n_tokens = 1, .logits = o + (size_t)i * V, .argmax = &am[step * N_SESS + i]};
        }
        double t0 = now_s();
        CHECK(ib_step(e, it, n, &err) == IB_OK, "step %d: %s", step, err.msg);
        *wall += now_s() - t0;
        o += (size_t)N_SESS * V;
    }
    for (int i = 0; i < N_SESS; i++) ib_session_free(s[i]);
}

/* Expected calls of each category over `steps` steps of model m (every step wanting logits):
 * step.c's sequence per layer. */
static void expected_calls(const ib_model *m, int steps, int gemma, int moe, int ple, uint64_t *c) {
    int L = ib_model_get_info(m)->n_layers;
    memset(c, 0, sizeof(uint64_t) * IB_PROF_COUNT);
    c[IB_PROF_EMBED] = 1;
    c[IB_PROF_RMSNORM] = (uint64_t)L * (gemma ? (moe ? 7 : 4) : 2);
    c[IB_PROF_QKV] = c[IB_PROF_O] = c[IB_PROF_GATE_UP] = c[IB_PROF_DOWN] = (uint64_t)L;
    c[IB_PROF_QK_PREPARE] = c[IB_PROF_ATTENTION] = c[IB_PROF_ACT] = (uint64_t)L;
    c[IB_PROF_MOE] = moe ? (uint64_t)L : 0;
    c[IB_PROF_ADD] = (uint64_t)L * (moe ? 3 : 2);
    c[IB_PROF_LOGITS] = 1;
    c[IB_PROF_STEP] = 2;   /* step_begin, step_end */
    c[IB_PROF_OTHER] = gemma ? (uint64_t)L * (ple ? 2 : 1) + (ple ? 1 : 0) : 0;   /* scale_layer, ple_* */
    for (int i = 0; i < IB_PROF_COUNT; i++) c[i] *= (uint64_t)steps;
}

/* One model: bitwise equality with and without profiling, the call counts, the times, reset. */
static void check_model(const char *label, const ib_mkmodel_opts *mo, int gemma, int moe, int ple) {
    char dir[] = "/tmp/ib_profile_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    ib_error err;
    ib_model *m = NULL;
    if (ib_mkmodel(dir, mo, &err) || ib_model_load(dir, NULL, &m, &err)) {
        CHECK(0, "%s: %s", label, err.msg);
        return;
    }
    int V = ib_model_get_info(m)->vocab_size;
    ib_engine *plain = NULL, *prof = NULL;
    CHECK(ib_engine_create(m, &(ib_engine_opts){.threads = 2, .max_step_tokens = 32}, &plain, &err) == IB_OK, "%s",
          err.msg);
    CHECK(ib_engine_create(m, &(ib_engine_opts){.threads = 2, .max_step_tokens = 32, .profile = 1}, &prof, &err) ==
              IB_OK, "%s", err.msg);
    if (!plain || !prof) goto done;
    size_t nl = (size_t)N_STEPS * N_SESS * V;
    float *la = malloc(nl * sizeof(float)), *lb = malloc(nl * sizeof(float));
    int32_t aa[N_STEPS * N_SESS], ab[N_STEPS * N_SESS];
    double wall_a, wall_b;
    scenario(m, plain, la, aa, &wall_a);
    scenario(m, prof, lb, ab, &wall_b);
    CHECK(memcmp(la, lb, nl * sizeof(float)) == 0, "%s: logits differ with profiling", label);
    CHECK(memcmp(aa, ab, sizeof aa) == 0, "%s: argmax differs with profiling", label);

    ib_step_profile p;
    CHECK(ib_engine_profile(prof, &p, &err) == IB_OK, "%s", err.msg);
    CHECK_EQ_INT(p.steps, N_STEPS);
    uint64_t want[IB_PROF_COUNT];
    expected_calls(m, N_STEPS, gemma, moe, ple, want);
    int counts_ok = 1;
    for (int i = 0; i < IB_PROF_COUNT; i++)
        if (p.calls[i] != want[i]) {
            counts_ok = 0;
            fprintf(stderr, "%s: %s: %llu calls, expected %llu\n", label, ib_prof_op_name((ib_prof_op)i),
                    (unsigned long long)p.calls[i], (unsigned long long)want[i]);
        }
    CHECK(counts_ok, "%s: call counts differ from the layer sequence", label);
    double sum = 0;
    int nonneg = 1;
    for (int i = 0; i < IB_PROF_COUNT; i++) {
        if (!(p.seconds[i] >= 0)) nonneg = 0;
        sum += p.seconds[i];
    }
    CHECK(nonneg, "%s: a negative time", label);
    CHECK(sum > 0 && sum <= wall_b, "%s: categories sum to %.9f s, the steps' wall time is %.9f s", label, sum,
          wall_b);
    CHECK(p.seconds[IB_PROF_QKV] > 0 && p.seconds[IB_PROF_ATTENTION] > 0, "%s: called categories without time",
          label);

    ib_engine_profile_reset(prof);
    CHECK(ib_engine_profile(prof, &p, &err) == IB_OK, "%s", err.msg);
    int zero = p.steps == 0;
    for (int i = 0; i < IB_PROF_COUNT; i++) zero &= p.calls[i] == 0 && p.seconds[i] == 0;
    CHECK(zero, "%s: reset left totals", label);
    /* after a reset the counts restart: the scenario again gives the same counts */
    scenario(m, prof, lb, ab, &wall_b);
    CHECK(memcmp(la, lb, nl * sizeof(float)) == 0, "%s: logits differ on the second run", label);
    CHECK(ib_engine_profile(prof, &p, &err) == IB_OK && p.calls[IB_PROF_ATTENTION] == want[IB_PROF_ATTENTION] &&
              p.steps == N_STEPS, "%s: counts after reset", label);

    /* an engine made without profiling has nothing to read */
    p.steps = 99;
    CHECK(ib_engine_profile(plain, &p, &err) == IB_ERR_STATE && p.steps == 0 && strstr(err.msg, "profile"),
          "%s: plain engine: %s", label, err.msg);
    free(la);
    free(lb);
done:
    ib_engine_free(plain);
    ib_engine_free(prof);
    ib_model_free(m);
}

int main(void) {
    check_model("tiny (qwen3)", &(ib_mkmodel_opts){.preset = "tiny", .seed = 7, .bits = 8, .group = 64, .tied = 1},
                0, 0, 0);
    check_model("tiny (llama)",
                &(ib_mkmodel_opts){.preset = "tiny", .seed = 7, .bits = 4, .group = 32, .tied = 1, .arch = "llama"},
                0, 0, 0);
    check_model("gemma4-moe-tiny, ple",
                &(ib_mkmodel_opts){.preset = "gemma4-moe-tiny", .seed = 3, .bits = 8, .tied = 1, .ple_dim = 64}, 1, 1,
                1);

    /* a backend that runs a step as one graph is refused, naming why, on any machine */
    ib_error err;
    char dir[] = "/tmp/ib_profile_XXXXXX";
    ib_model *m = NULL;
    if (mkdtemp(dir) &&
        !ib_mkmodel(dir, &(ib_mkmodel_opts){.preset = "tiny", .seed = 1, .bits = 8, .tied = 1}, &err) &&
        !ib_model_load(dir, NULL, &m, &err)) {
        ib_engine *e = (ib_engine *)1;
        ib_status rc = ib_engine_create(m, &(ib_engine_opts){.backend = IB_BACKEND_CUDA, .profile = 1}, &e, &err);
        CHECK(rc == IB_ERR_UNSUPPORTED && e == NULL && strstr(err.msg, "graph"), "cuda + profile: %d %s", rc,
              err.msg);
        ib_model_free(m);
    } else {
        CHECK(0, "model: %s", err.msg);
    }
    TEST_MAIN_END("test_profile");
}
