/*
 * cmd_mkmodel.c — `isobatch mkmodel`: a synthetic model directory with random weights.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "isobatch.h"
#include "model/mkmodel.h"

static const char help[] =
    "usage: isobatch mkmodel --preset tiny|qwen3-0.6b|qwen3-8b|gemma4-tiny|gemma4-moe-tiny|gemma4-26b-a4b\n"
    "                        [--seed S] [--bits 4|8|16|32]"
    " [--group 32|64|128] [--untied] [--arch qwen3|llama] [--top-k K] [--experts E]\n"
    "                        [--layers N] [--kv-shared N [--double-wide]] [--ple P] [--threads T] --out DIR\n"
    "  --top-k K   gemma4-moe-tiny (8 experts, top-k 2), gemma4-26b-a4b (128, top-k 8): route each token to K experts\n"
    "  --experts E MoE presets: E experts a layer (1..1024; top-k at most E), every other shape unchanged\n"
    "  --layers N  only the preset's first N layers, every other shape unchanged (Gemma 4: the preset's\n"
    "              sliding/full pattern over N layers, the last one full); e.g. gemma4-26b-a4b --layers 6\n"
    "  --kv-shared N  Gemma 4: the last N layers share keys and values (num_kv_shared_layers): each reads\n"
    "              those of the last earlier layer of its type and has no k_proj, v_proj, k_norm\n"
    "  --double-wide  with --kv-shared: use_double_wide_mlp, the shared layers' MLPs 2 x intermediate_size\n"
    "  --ple P     Gemma 4: per-layer embeddings of width P (hidden_size_per_layer_input)\n"
    "  -t, --threads T  threads that generate and write the weights, 1..256 (default: the CPUs online);\n"
    "              the files are the same bytes for every count\n"
    "  gemma4-26b-a4b: Gemma-4-26B-A4B's real shapes (about 14 GB at 4 bits; for benchmarks)\n"
    "  Writes config.json, model.safetensors (MLX layout), tokenizer.json and tokenizer_config.json.\n";

int cmd_mkmodel(int argc, char **argv) {
    ib_mkmodel_opts o = {.preset = NULL, .seed = 0, .bits = 4, .group = 64, .tied = 1};
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        long x;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if (!strcmp(f, "--untied")) {
            o.tied = 0;
            continue;
        }
        if (!strcmp(f, "--double-wide")) {
            o.double_wide = 1;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(f, "--preset")) o.preset = v;
        else if (!strcmp(f, "--arch")) {
            if (strcmp(v, "qwen3") && strcmp(v, "llama")) return cli_usage_error("--arch: unknown '%s' (qwen3, llama)", v);
            o.arch = v;
        }
        else if (!strcmp(f, "--out")) out = v;
        else if (!strcmp(f, "--seed")) {
            if (cli_u64(f, v, &o.seed)) return 2;
        } else if (!strcmp(f, "--bits")) {
            if (cli_int(f, v, 4, 32, &x)) return 2;
            if (x != 4 && x != 8 && x != 16 && x != 32) return cli_usage_error("--bits: %ld is not 4, 8, 16 or 32", x);
            o.bits = (int)x;
        } else if (!strcmp(f, "--experts")) {
            if (cli_int(f, v, 1, 1024, &x)) return 2;
            o.experts = (int)x;
        } else if (!strcmp(f, "--top-k")) {
            if (cli_int(f, v, 1, 1024, &x)) return 2;
            o.top_k = (int)x;
        } else if (!strcmp(f, "--kv-shared")) {
            if (cli_int(f, v, 1, 4096, &x)) return 2;
            o.kv_shared = (int)x;
        } else if (!strcmp(f, "--ple")) {
            if (cli_int(f, v, 1, 4096, &x)) return 2;
            o.ple_dim = (int)x;
        } else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
            if (cli_int(f, v, 1, IB_MAX_DEFAULT_THREADS, &x)) return 2;
            o.threads = (int)x;
        } else if (!strcmp(f, "--layers")) {
            if (cli_int(f, v, 1, 4096, &x)) return 2;
            o.layers = (int)x;
        } else if (!strcmp(f, "--group")) {
            if (cli_int(f, v, 32, 128, &x)) return 2;
            if (x != 32 && x != 64 && x != 128) return cli_usage_error("--group: %ld is not 32, 64 or 128", x);
            o.group = (int)x;
        } else
            return cli_unknown_option("mkmodel", f, help);
    }
    if (!o.preset) return cli_usage_error("mkmodel: --preset is required (tiny, qwen3-0.6b, qwen3-8b, gemma4-tiny, gemma4-moe-tiny or gemma4-26b-a4b)");
    if (strcmp(o.preset, "tiny") && strcmp(o.preset, "qwen3-0.6b") && strcmp(o.preset, "qwen3-8b") &&
        strcmp(o.preset, "gemma4-tiny") && strcmp(o.preset, "gemma4-moe-tiny") && strcmp(o.preset, "gemma4-26b-a4b"))
        return cli_usage_error("--preset: unknown '%s' (tiny, qwen3-0.6b, qwen3-8b, gemma4-tiny, gemma4-moe-tiny, gemma4-26b-a4b)",
                               o.preset);
    if (!out) return cli_usage_error("mkmodel: --out DIR is required");
    ib_error err;
    if (ib_mkmodel(out, &o, &err)) return cli_error("%s", err.msg);
    if (o.layers)
        printf("wrote %s (preset %s, its first %d layers, %d-bit, seed %llu)\n", out, o.preset, o.layers, o.bits,
               (unsigned long long)o.seed);
    else
        printf("wrote %s (preset %s, %d-bit, seed %llu)\n", out, o.preset, o.bits, (unsigned long long)o.seed);
    return 0;
}
