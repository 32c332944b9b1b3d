/*
 * isobatch.c — the command line tool: dispatches to one subcommand per file (cmd_*.c).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "isobatch.h"

static const char usage[] =
    "usage: isobatch <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate   generate text for prompts, batched, with invariant results\n"
    "  mkmodel    write a synthetic model directory with random weights\n"
    "  info       describe a model directory\n"
    "  bench      prefill and batched-decode throughput against the bandwidth floor\n"
    "  tokenize   print the token ids of a text (Hugging Face tokenizer.json, byte-level BPE)\n"
    "  detokenize print the text of token ids\n"
    "  chat       interactive chat with a model (ChatML / Llama 3 format), streaming the reply\n"
    "  serve      OpenAI-compatible HTTP server with continuous batching and stateful sessions\n"
    "  probe      check every op for batch invariance over a shape matrix (diagnostics)\n"
    "  diff       compare sessions stepped batched vs alone, layer by layer (diagnostics)\n"
    "  recall     multi-tenant needle recall, batched vs serialized (diagnostics)\n"
    "  accuracy   the engine's logits vs a float64 reference forward pass, per activation mode\n"
    "  verify     re-run a served response's verification record alone: match, or the first diverging step\n"
    "\n"
    "`isobatch <command> --help` lists a command's options; `isobatch --version` the version.\n";

/* --version: the version, and the kernels this build has and this CPU runs. */
static int print_version(void) {
    printf("isobatch %s (library %s)\nkernels:", IB_VERSION_STRING, ib_version());
    for (ib_isa i = IB_ISA_SCALAR; i <= IB_ISA_AMX; i++)
        if (ib_isa_supported(i)) printf(" %s", ib_isa_name(i));
    printf(" (this CPU); activation modes f32, q8; KV f32, f16\nbackends: %s\n", ib_backends_compiled());
    return 0;
}

int main(int argc, char **argv) {
    char **split = NULL; /* --flag=value forms become --flag value for every command */
    int n = cli_split_eq(argc, argv, &split);
    if (n < 0) return cli_error("out of memory");
    if (split) argc = n, argv = split; /* lives until exit */
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) return print_version();
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "mkmodel")) return cmd_mkmodel(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "detokenize")) return cmd_detokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "probe")) return cmd_probe(argc - 1, argv + 1);
    if (!strcmp(cmd, "diff")) return cmd_diff(argc - 1, argv + 1);
    if (!strcmp(cmd, "recall")) return cmd_recall(argc - 1, argv + 1);
    if (!strcmp(cmd, "accuracy")) return cmd_accuracy(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
    return cli_usage_error("unknown command '%s' (try --help)", cmd);
}
