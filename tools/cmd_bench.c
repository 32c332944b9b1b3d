/*
 * cmd_bench.c — `isobatch bench`: prefill and batched-decode throughput, memory, and how close decode
 * comes to the machine's bandwidth floor. Every figure is the median of several repetitions, with the
 * spread (min–max) beside it.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bandwidth.h"
#include "cli.h"
#include "isobatch.h"

static const char help[] =
    "usage: isobatch bench [-m DIR] [--batch 1,2,4,8,16,32,64] [--prompt 128] [--gen 32] [--threads T]\n"
    "                      [--act auto|f32|q8] [--isa auto|scalar|avx2|avx512|neon|amx] [--kv-dtype f32|f16|q8]\n"
    "                      [--backend cpu|cuda] [--inject FAULT]\n"
    "                      [--kv full|window:W|sink:S,window:W] [--reps 3] [--host-logits] [--profile] [--json]\n"
    "  prefill: one session, --prompt tokens in one step, after one untimed step of the same prompt (its\n"
    "  figure printed beside; --json: prefill_tok_s.first_step, and each repetition's in .reps).\n"
    "  decode: B sessions holding --prompt tokens\n"
    "  each step together for --gen tokens.  floor: (weight bytes + KV bytes read) per step over the\n"
    "  (MoE: the dense weights and the chosen experts only: top-k per layer at B=1, the expected distinct\n"
    "  experts of B rows routed uniformly at B>1; sliding-window layers read at most their window)\n"
    "  read bandwidth measured with the same thread count in passes taken between the repetitions\n"
    "  (the median of a batch size's passes; --json also gives each repetition's own ratio).\n"
    "  read GB/s: the bytes a step must read over the median step time.\n"
    "  decode chooses each row's next token greedily by ib_step's argmax, where the logits are computed\n"
    "  (on a GPU they stay there); --host-logits: every row's logits come to the host and ib_sample\n"
    "  chooses there, as generate and serve do (they hash the logits).\n"
    "  --kv: the sessions' KV policy (windowed sessions attend at most S + W keys, which the floor counts).\n"
    "  --inject: test-only, measure with a fault injected (gpu-split-k: the CUDA products without the\n"
    "  contract's order, for what the order costs); the header names it.\n"
    "  --profile: after the prefill line and each batch line, where a step's time went: the ms per step of\n"
    "  each backend operation category (qkv, o, gate/up, down: the products; act: SwiGLU/GeGLU; logits:\n"
    "  final norm, lm_head and the copies; step: step_begin + step_end; other: layer scalars, per-layer\n"
    "  embeddings) and its share of the measured step, then their total against it (the rest is the\n"
    "  step's own bookkeeping and, in decode, choosing the next tokens). CPU backend only (a CUDA step\n"
    "  runs as one graph at its end). --json: an object \"profile\" per batch size and \"prefill_profile\".\n";

#define MAX_B 256
#define MAX_REPS 15
/* bandwidth passes before the first decode repetition of a batch size and after each one */
#define GAP_PASSES 3
#define MAX_PASSES (5 + 16 * GAP_PASSES * (MAX_REPS + 1))

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median of v[0..n), n <= MAX_PASSES, leaving v in its order. */
static double median_kept(const double *v, int n) {
    double c[MAX_PASSES];
    memcpy(c, v, sizeof *v * (size_t)n);
    return median(c, n);
}

/* n (<= 5) bandwidth passes now, appended to all[*n_all] (capacity MAX_PASSES): their median, or 0 if
 * the probe failed. */
static double bw_passes(bw_probe *probe, int n, double *all, int *n_all) {
    double v[5];
    for (int i = 0; i < n; i++) {
        v[i] = bw_probe_measure(probe);
        if (v[i] <= 0) return 0;
        if (*n_all < MAX_PASSES) all[(*n_all)++] = v[i];
    }
    return median(v, n);
}

static long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Parse "1,2,4" into b[]; returns the count or -1. */
static int parse_batches(const char *s, int *b, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > MAX_B || (*end && *end != ',')) return -1;
        b[n++] = (int)v;
        s = end + (*end == ',');
    }
    return *s ? -1 : n;
}

/* Weight bytes one decode step of B rows must read: every weight once, except the routed experts
 * (Gemma 4 MoE), of which only those some row chose are read: B = 1, exactly top_k of n_experts per
 * layer; B > 1, the expected number of distinct experts when each row picks top_k of n_experts
 * uniformly and independently, n_experts (1 - (1 - top_k / n_experts)^B). */
static double step_weight_bytes(const ib_model_info *in, int B) {
    if (in->n_experts <= 0) return (double)in->weight_bytes;
    double E = in->n_experts, k = in->top_k, miss = 1.0;
    for (int b = 0; b < B; b++) miss *= 1.0 - k / E;
    double chosen = B == 1 ? k : E * (1.0 - miss);
    return (double)(in->weight_bytes - in->expert_bytes) + (double)in->expert_bytes * chosen / E;
}

/* KV bytes one row reads attending `keys` keys: each layer at its own shape, a sliding-window layer
 * (Gemma 4) at most its window, the others at most sink + window under a windowed policy (window > 0). */
static double row_kv_bytes(const ib_model_info *in, double keys, int sink, int window, double per_token) {
    double full = keys, sliding = keys;
    if (window > 0 && full > sink + window) full = sink + window;
    if (in->sliding_window > 0 && sliding > in->sliding_window) sliding = in->sliding_window;
    double share = per_token * ((double)in->kv_bytes_per_token_sliding / (double)in->kv_bytes_per_token);
    return (per_token - share) * full + share * sliding;
}

typedef struct stat3 { double med, lo, hi; } stat3;

/* One line of a phase's profile: "  profile LABEL (ms/step):  qkv 3.10 (21%)  ...  total T of M measured",
 * each category that was called, in ms per step and as a share of the measured step (measured_s: the
 * wall time of the phase's p->steps steps). */
static void profile_print(const char *label, const ib_step_profile *p, double measured_s) {
    double n = p->steps ? (double)p->steps : 1, meas_ms = measured_s * 1e3 / n, total = 0;
    printf("  profile %s (ms/step):", label);
    for (int i = 0; i < IB_PROF_COUNT; i++) {
        if (!p->calls[i]) continue;
        double ms = p->seconds[i] * 1e3 / n;
        total += ms;
        printf("  %s %.2f (%.0f%%)", ib_prof_op_name((ib_prof_op)i), ms, meas_ms > 0 ? 100 * ms / meas_ms : 0.0);
    }
    printf("  total %.2f of %.2f measured\n", total, meas_ms);
}

/* A phase's profile as JSON: {"steps", "measured_ms_per_step", "total_ms_per_step", "ops": {NAME:
 * {"ms_per_step", "share", "calls_per_step"}}} with every category (share: of the measured step). */
static json_t *profile_json(const ib_step_profile *p, double measured_s) {
    double n = p->steps ? (double)p->steps : 1, meas_ms = measured_s * 1e3 / n, total = 0;
    json_t *ops = json_object();
    for (int i = 0; i < IB_PROF_COUNT; i++) {
        double ms = p->seconds[i] * 1e3 / n;
        total += ms;
        json_object_set_new(ops, ib_prof_op_name((ib_prof_op)i),
                            json_pack("{s:f, s:f, s:f}", "ms_per_step", ms, "share", meas_ms > 0 ? ms / meas_ms : 0.0,
                                      "calls_per_step", (double)p->calls[i] / n));
    }
    return json_pack("{s:I, s:f, s:f, s:o}", "steps", (json_int_t)p->steps, "measured_ms_per_step", meas_ms,
                     "total_ms_per_step", total, "ops", ops);
}

static stat3 summarize(double *v, int n) {
    stat3 s;
    s.med = median(v, n);
    s.lo = v[0];
    s.hi = v[n - 1];
    return s;
}

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL;
    int batches[16] = {1, 2, 4, 8, 16, 32, 64}, nb = 7, as_json = 0;
    long prompt = 128, gen = 32, threads = sysconf(_SC_NPROCESSORS_ONLN), reps = 3;
    ib_isa isa = IB_ISA_AUTO;
    ib_backend_kind backend = IB_BACKEND_CPU;
    ib_act act = IB_ACT_AUTO;
    ib_kv_dtype kv_dtype = IB_KV_F32;
    int kv_sink = 0, kv_window = 0;
    const char *kv_policy = "full";
    int host_logits = 0;   /* decode: logits to the host and ib_sample (else ib_step's argmax) */
    int profile = 0;       /* --profile: the engine times each backend operation (ib_engine_profile) */
    if (threads < 1) threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if (!strcmp(f, "--json")) {
            as_json = 1;
            continue;
        }
        if (!strcmp(f, "--host-logits")) {
            host_logits = 1;
            continue;
        }
        if (!strcmp(f, "--profile")) {
            profile = 1;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(f, "-m")) dir = v;
        else if (!strcmp(f, "--batch")) {
            if ((nb = parse_batches(v, batches, 16)) < 1)
                return cli_usage_error("--batch: bad list '%s' (e.g. 1,2,4; each 1..%d)", v, MAX_B);
        } else if (!strcmp(f, "--prompt")) {
            if (cli_int(f, v, 1, 8192, &prompt)) return 2;
        } else if (!strcmp(f, "--gen")) {
            if (cli_int(f, v, 1, 4096, &gen)) return 2;
        } else if ((!strcmp(f, "--threads") || !strcmp(f, "-t"))) {
            if (cli_int(f, v, 1, 256, &threads)) return 2;
        } else if (!strcmp(f, "--reps")) {
            if (cli_int(f, v, 1, MAX_REPS, &reps)) return 2;
        } else if (!strcmp(f, "--act")) {
            if (cli_act(v, &act)) return 2;
        } else if (!strcmp(f, "--kv-dtype")) {
            if (cli_kv_dtype(v, &kv_dtype)) return 2;
        } else if (!strcmp(f, "--kv")) {
            if (cli_kv_policy(v, &kv_sink, &kv_window)) return 2;
            kv_policy = v;
        } else if (!strcmp(f, "--backend")) {
            if (cli_backend(v, &backend)) return 2;
        } else if (!strcmp(f, "--inject")) {
            if (cli_inject(v)) return 2;
        } else if (!strcmp(f, "--isa")) {
            if (cli_isa(v, &isa)) return 2;
        } else
            return cli_unknown_option("bench", f, help);
    }
    if (profile && backend != IB_BACKEND_CPU)   /* refused before any work, on any machine */
        return cli_usage_error("--profile: backend %s records a step and runs it as one graph at its end, so "
                               "per-operation host times would be meaningless (use --backend cpu)",
                               ib_backend_name(backend));
    if (!(dir = cli_model_dir(dir))) return 2;
    /* started before anything large is allocated: the probe's process then copies no page tables of
     * the model and the benchmark never pays copy-on-write faults for pages it shares with it */
    bw_probe *probe = bw_probe_start((int)threads, backend == IB_BACKEND_CUDA);
    if (!probe) return cli_error("bench: could not start the bandwidth probe process");
    ib_error err;
    ib_model *m = NULL;
    ib_engine *e = NULL;
    ib_session *s[MAX_B] = {0}, *proto = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    int rc = 0;
    json_t *out = NULL;
    ib_load_opts lo = {.threads = (int)threads};   /* the weights are repacked on as many threads */
    if (ib_model_load(dir, &lo, &m, &err)) {
        bw_probe_stop(probe);
        return cli_error("%s", err.msg);
    }
    const ib_model_info *info = ib_model_get_info(m);
    int V = info->vocab_size, maxb = 1;
    for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    ib_engine_opts eo = {.threads = (int)threads, .isa = isa, .act = act, .backend = backend,
                         .max_step_tokens = (int)(prompt > maxb ? prompt : maxb), .profile = profile};
    if (ib_engine_create(m, &eo, &e, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    int ctx = (int)(prompt + gen);
    if (ctx > info->max_context) {
        rc = cli_usage_error("bench: --prompt + --gen = %d exceeds the model's context %d", ctx, info->max_context);
        goto out;
    }
    logits = malloc((size_t)V * maxb * sizeof(float));
    ids = malloc((size_t)(prompt > maxb ? prompt : maxb) * sizeof(int32_t));
    if (!logits || !ids) {
        rc = cli_error("out of memory");
        goto out;
    }
    for (long i = 0; i < prompt; i++) ids[i] = (int32_t)((i * 7919 + 13) % (V < 256 ? V : 256));
    /* a windowed session takes the whole prompt in one step and rewinds by --gen between repetitions */
    ib_session_opts so = {.max_context = ctx, .sampling = ib_sampling_default(), .kv_dtype = kv_dtype, .backend = backend,
                          .kv_sink = kv_sink, .kv_window = kv_window,
                          .kv_chunk = (int)(prompt > gen ? prompt : gen)};   /* also sizes sliding-window rings */
    size_t kv_per_token = ib_kv_bytes_per_token(m, kv_dtype);
    if (ib_session_create(m, &so, &proto, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    for (int b = 0; b < maxb; b++)
        if (ib_session_create(m, &so, &s[b], &err)) {
            rc = cli_error("%s", err.msg);
            goto out;
        }
    /* bandwidth passes: five now (the header's figure), then GAP_PASSES before and after every decode
     * repetition */
    double bw_all[MAX_PASSES];
    int n_bw = 0;
    double bw = bw_passes(probe, 5, bw_all, &n_bw);
    if (bw <= 0) {
        rc = cli_error("bench: the bandwidth probe process failed");
        goto out;
    }

    /* prefill: the whole prompt in one step, from position 0; one untimed step first (r = -1), so the
     * repetitions do not carry what only a first step of this shape pays (the session's fresh pages on a
     * CPU, a GPU's kernels loaded on their first launch) */
    double tp[MAX_REPS], tp_order[MAX_REPS], first_tps = 0, prefill_s = 0;
    for (int r = -1; r < reps; r++) {
        if (r == 0) ib_engine_profile_reset(e);
        ib_session_rewind(proto, 0, NULL);
        ib_step_item it = {.session = proto, .tokens = ids, .n_tokens = (int)prompt, .logits = logits};
        double t0 = now_s();
        if (ib_step(e, &it, 1, &err)) {
            rc = cli_error("%s", err.msg);
            goto out;
        }
        double dt = now_s() - t0;
        if (r < 0) {
            first_tps = prompt / dt;
            continue;
        }
        prefill_s += dt;
        tp[r] = tp_order[r] = prompt / dt;
    }
    ib_step_profile prefill_prof;
    if (profile && ib_engine_profile(e, &prefill_prof, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    stat3 pre = summarize(tp, (int)reps);
    const char *act_name = ib_engine_act(e) == IB_ACT_Q8 ? "q8" : "f32";
    if (as_json) {
        out = json_object();
        json_object_set_new(out, "model", json_string(dir));
        json_object_set_new(out, "threads", json_integer(threads));
        json_object_set_new(out, "isa", json_string(ib_isa_name(ib_engine_isa(e))));
        json_object_set_new(out, "act", json_string(act_name));
        json_object_set_new(out, "read_bandwidth_gbs", json_real(bw / 1e9));
        json_object_set_new(out, "weight_bytes", json_integer((json_int_t)info->weight_bytes));
        json_object_set_new(out, "expert_bytes", json_integer((json_int_t)info->expert_bytes));
        json_object_set_new(out, "session_kv_bytes", json_integer((json_int_t)ib_session_kv_bytes(proto)));
        json_object_set_new(out, "kv_dtype", json_string(ib_kv_dtype_name(kv_dtype)));
        json_object_set_new(out, "kv_policy", json_string(kv_policy));
        json_object_set_new(out, "decode_tokens", json_string(host_logits ? "host_logits" : "step_argmax"));
        json_object_set_new(out, "kv_bytes_per_token", json_integer((json_int_t)kv_per_token));
        if (ib_fault_get()) json_object_set_new(out, "fault", json_string(ib_fault_name(ib_fault_get())));
        json_t *pre_reps = json_array();
        for (int r = 0; r < reps; r++) json_array_append_new(pre_reps, json_real(tp_order[r]));
        json_object_set_new(out, "prefill_tok_s", json_pack("{s:f, s:f, s:f, s:i, s:o, s:f}", "median", pre.med, "min",
                                                            pre.lo, "max", pre.hi, "tokens", (int)prompt, "reps",
                                                            pre_reps, "first_step", first_tps));
        if (profile) json_object_set_new(out, "prefill_profile", profile_json(&prefill_prof, prefill_s));
        json_object_set_new(out, "decode", json_array());
    } else {
        printf("model %s: %.1f MB weights, %zu KV bytes/token (%s, kv %s); %ld threads, isa %s, act %s\n", dir,
               info->weight_bytes / 1e6, kv_per_token, ib_kv_dtype_name(kv_dtype), kv_policy, threads,
               ib_isa_name(ib_engine_isa(e)), act_name);
        if (ib_fault_get()) printf("injected fault: %s (not the canonical numbers)\n", ib_fault_name(ib_fault_get()));
        if (info->n_experts > 0)
            printf("experts: %.1f MB of the weights; a B=1 decode step reads %.1f MB of weights (top-%d of %d)\n",
                   info->expert_bytes / 1e6, step_weight_bytes(info, 1) / 1e6, info->top_k, info->n_experts);
        printf("session KV: %.1f MB each\n", ib_session_kv_bytes(proto) / 1e6);
        printf("decode tokens: %s\n", host_logits ? "logits to the host, ib_sample there (--host-logits)"
                                                   : "ib_step's argmax where the logits are computed");
        if (backend == IB_BACKEND_CUDA)
            printf("device read bandwidth %.1f GB/s (measured on the GPU; again between the repetitions below)\n",
                   bw / 1e9);
        else
            printf("read bandwidth %.1f GB/s (measured, %ld threads; again between the repetitions below)\n", bw / 1e9,
                   threads);
        printf("prefill %ld tokens: %.1f tok/s (min %.1f, max %.1f; the untimed first step %.1f)\n", prompt, pre.med,
               pre.lo, pre.hi, first_tps);
        if (profile) profile_print("prefill", &prefill_prof, prefill_s);
        printf("%5s %12s %22s %10s %9s %12s %9s\n", "batch", "decode tok/s", "(min-max)", "ms/step", "read GB/s",
               "floor tok/s", "of floor");
    }
    /* the prompt's KV, copied into every session (identical prompts cost the same as distinct ones) */
    for (int b = 0; b < maxb; b++)
        if (ib_session_copy(s[b], proto, &err)) {
            rc = cli_error("%s", err.msg);
            goto out;
        }
    ib_step_item items[MAX_B];
    int32_t next[MAX_B], chosen[MAX_B];
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        double tput[MAX_REPS], ms[MAX_REPS], frac[MAX_REPS], bw_rep[MAX_REPS + 1], bw_mid[MAX_REPS];
        int first_pass = n_bw;
        double decode_s = 0;   /* inside the steps' loop, all repetitions (what the profile covers) */
        ib_engine_profile_reset(e);
        /* bytes one step must read: the weights it uses once, and the keys and values each session attends */
        double keys = prompt + gen / 2.0; /* keys a row attends, on average over the repetition */
        double step_bytes = step_weight_bytes(info, B) + B * row_kv_bytes(info, keys, kv_sink, kv_window, kv_per_token);
        for (int r = 0;; r++) {
            bw_rep[r] = bw_passes(probe, GAP_PASSES, bw_all, &n_bw);
            if (bw_rep[r] <= 0) {
                rc = cli_error("bench: the bandwidth probe process failed");
                goto out;
            }
            if (r > 0) {
                /* the floor of repetition r - 1 alone: the bandwidth read just before and just after it */
                bw_mid[r - 1] = 0.5 * (bw_rep[r - 1] + bw_rep[r]);
                frac[r - 1] = tput[r - 1] / (B / (step_bytes / bw_mid[r - 1]));
            }
            if (r == reps) break;
            for (int b = 0; b < B; b++) {
                ib_session_rewind(s[b], (int)prompt, NULL);
                next[b] = (int32_t)((b * 31 + 7) % (V < 256 ? V : 256));
                /* greedy sessions: ib_sample's choice is the argmax of the logits */
                items[b] = host_logits ? (ib_step_item){.session = s[b], .tokens = &next[b], .n_tokens = 1, .logits = logits + (size_t)b * V}
                                       : (ib_step_item){.session = s[b], .tokens = &next[b], .n_tokens = 1, .argmax = &chosen[b]};
            }
            double t0 = now_s();
            for (long g = 0; g < gen; g++) {
                if (ib_step(e, items, B, &err)) {
                    rc = cli_error("%s", err.msg);
                    goto out;
                }
                for (int b = 0; b < B; b++)
                    if (host_logits) next[b] = ib_sample(s[b], logits + (size_t)b * V);
                    else next[b] = chosen[b], ib_session_note_tokens(s[b], &next[b], 1);
            }
            double dt = now_s() - t0;
            decode_s += dt;
            tput[r] = B * gen / dt;
            ms[r] = dt * 1e3 / gen;
        }
        double step_ms = median(ms, (int)reps);
        ib_step_profile prof;
        if (profile && ib_engine_profile(e, &prof, &err)) {
            rc = cli_error("%s", err.msg);
            goto out;
        }
        /* the row's floor: the median of every pass taken around its repetitions */
        double floor_tps = B / (step_bytes / median_kept(bw_all + first_pass, n_bw - first_pass));
        double tput_sorted[MAX_REPS];
        memcpy(tput_sorted, tput, sizeof tput);
        stat3 d = summarize(tput_sorted, (int)reps);
        double of_floor = d.med / floor_tps;
        double read_gbs = step_bytes / (B / d.med) / 1e9; /* what the median step read per second */
        if (as_json) {
            json_t *per_rep = json_array();
            for (int r = 0; r < reps; r++)
                json_array_append_new(per_rep, json_pack("{s:f, s:f, s:f}", "tok_s", tput[r], "read_bandwidth_gbs",
                                                         bw_mid[r] / 1e9, "fraction_of_floor", frac[r]));
            json_t *row = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:o}", "batch", B, "tok_s", d.med, "min",
                                    d.lo, "max", d.hi, "ms_per_step", step_ms, "read_gbs", read_gbs, "floor_tok_s",
                                    floor_tps, "fraction_of_floor", of_floor, "reps", per_rep);
            if (profile) json_object_set_new(row, "profile", profile_json(&prof, decode_s));
            json_array_append_new(json_object_get(out, "decode"), row);
        } else {
            printf("%5d %12.1f %10.1f - %-10.1f %10.2f %9.1f %12.1f %8.0f%%\n", B, d.med, d.lo, d.hi, step_ms, read_gbs,
                   floor_tps, 100 * of_floor);
            if (profile) {
                char label[24];
                snprintf(label, sizeof label, "B=%d", B);
                profile_print(label, &prof, decode_s);
            }
        }
        fflush(stdout);
    }
    stat3 bws = summarize(bw_all, n_bw);
    if (as_json) {
        json_object_set_new(out, "read_bandwidth_all_gbs", json_pack("{s:f, s:f, s:f, s:i}", "median", bws.med / 1e9,
                                                                     "min", bws.lo / 1e9, "max", bws.hi / 1e9,
                                                                     "passes", n_bw));
        json_object_set_new(out, "peak_rss_mb", json_real(peak_rss_kb() / 1024.0));
        char *txt = json_dumps(out, JSON_COMPACT);
        if (txt) puts(txt);
        free(txt);
    } else {
        printf("read bandwidth over all %d passes: median %.1f GB/s (min %.1f, max %.1f)\n", n_bw, bws.med / 1e9,
               bws.lo / 1e9, bws.hi / 1e9);
        printf("peak RSS %.1f MB\n", peak_rss_kb() / 1024.0);
    }
out:
    bw_probe_stop(probe);
    json_decref(out);
    for (int b = 0; b < maxb; b++) ib_session_free(s[b]);
    ib_session_free(proto);
    free(logits);
    free(ids);
    ib_engine_free(e);
    ib_model_free(m);
    return rc;
}
