/*
 * cli.h — small helpers shared by the isobatch subcommands: flag parsing, number parsing,
 * printable text.
 */
#ifndef IB_TOOLS_CLI_H
#define IB_TOOLS_CLI_H
#include <stddef.h>
#include <stdint.h>

#include "isobatch.h"

/* Subcommand entry points: argv[0] is the subcommand name. Return the process exit code. */
int cmd_generate(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_recall(int argc, char **argv);
int cmd_accuracy(int argc, char **argv);
int cmd_verify(int argc, char **argv);

/* Print "isobatch: <message>" to stderr and return 2 (usage) or 1 (runtime failure). */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Flag value: argv[*i + 1], advancing *i; prints an error and returns NULL when missing. */
const char *cli_value(int argc, char **argv, int *i);

/* Parse a whole decimal integer / float; 0 on success, 2 (the usage exit code, after printing
 * "flag: bad value") otherwise. */
int cli_int(const char *flag, const char *s, long lo, long hi, long *out);
int cli_float(const char *flag, const char *s, double lo, double hi, double *out);
int cli_u64(const char *flag, const char *s, uint64_t *out);

/* Flag values shared by the commands that run the engine: parse --isa / --act into *out, or --inject
 * (switching the fault on); 0 on success, 2 (after a one-line error naming the flag) otherwise. */
int cli_isa(const char *v, ib_isa *out);
int cli_act(const char *v, ib_act *out);
/* --backend cpu|cuda. */
int cli_backend(const char *v, ib_backend_kind *out);
int cli_inject(const char *v);
/* --kv-dtype f32|f16|q8 into *out (ib_kv_dtype_parse). 0, or 2 after a usage error. */
int cli_kv_dtype(const char *v, ib_kv_dtype *out);
/* --kv POLICY: "full" | "window:W" | "sink:S,window:W" into (sink, window); 0, or a usage error (2). */
int cli_kv_policy(const char *v, int *sink, int *window);

/* Parse a comma-separated id list ("1,2,3", each in [0, vocab)) into a new array *out of *n ids;
 * 0 on success, 1 or 2 after an error message. */
int cli_parse_ids(const char *list, int vocab, int32_t **out, int *n);

/* The model directory to use: dir when given, else models/default beside the working directory,
 * else NULL after printing an error. */
const char *cli_model_dir(const char *dir);

/* The usage error for an unknown option of command cmd: names it and, when a flag of help is within
 * two edits of it, suggests that one ("did you mean --temp?"). Returns 2. */
int cli_unknown_option(const char *cmd, const char *flag, const char *help);

/* argv with every "--name=value" split into "--name" "value" (the first '=' only; argv[0] and other
 * arguments untouched). Returns the new count and sets *out to a new array (free it; the strings are
 * argv's), or returns argc with *out NULL when nothing needed splitting, -1 when out of memory. */
int cli_split_eq(int argc, char **argv, char ***out);

/* Append to out (cap bytes, NUL-terminated) the bytes of s with invalid UTF-8 replaced by U+FFFD. */
size_t cli_utf8_sanitize(const char *s, size_t n, char *out, size_t cap);

#endif
