/*
 * cmd_tokenize.c — `isobatch tokenize` (text to ids, and an encode benchmark) and
 * `isobatch detokenize` (ids to the exact bytes), for checking against other tools.
 */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "isobatch.h"
#include "server/api.h"
#include "tokenizer/tokenizer.h"

static const char help_tok[] =
    "usage: isobatch tokenize [-m DIR | --tokenizer FILE] [--file F | TEXT] [--json]\n"
    "                         [--add-special] [--split-special] [--bench [--seconds S] [--no-cache]]\n"
    "                         [--chat [--system TEXT] | --messages FILE [--tools FILE]] [--no-think | --think]\n"
    "                         [--render]\n"
    "\n"
    "  -m DIR            model directory whose tokenizer.json (and tokenizer_config.json) to use\n"
    "                    (default models/default)\n"
    "  --tokenizer FILE  a tokenizer.json file (tokenizer_config.json is read beside it when the\n"
    "                    file is named tokenizer.json)\n"
    "  --file F          encode the bytes of file F ('-' for stdin) instead of TEXT\n"
    "  --json            print the ids as a JSON array (default: separated by spaces)\n"
    "  --add-special     add what the tokenizer adds around a text (BOS of the post-processor or of\n"
    "                    add_bos_token); default off, like add_special_tokens=False\n"
    "  --split-special   encode special-token text (\"<|im_end|>\") as ordinary text\n"
    "  --bench           time encoding (one thread) and print MB/s instead of the ids\n"
    "  --seconds S       how long to repeat the encoding for --bench (default 2)\n"
    "  --no-cache        --bench without the word cache\n"
    "  --chat            the text is a user message: encode it in the model's chat format, with\n"
    "                    the assistant header after it (as `generate --chat` does)\n"
    "  --system TEXT     with --chat: a system message before it\n"
    "  --messages FILE   encode a conversation (a JSON array of {\"role\", \"content\"}) in the chat\n"
    "                    format, with the assistant header after it\n"
    "  --tools FILE      with --messages: a JSON array of OpenAI tools declared in the prompt, and the\n"
    "                    messages in OpenAI's shape (assistant tool_calls, tool results), written in\n"
    "                    the model's tool form (Qwen's or Gemma 4's) as the server writes them\n"
    "  --no-think        chat format with Qwen3's enable_thinking=false\n"
    "  --think           chat format with Gemma 4's enable_thinking=true\n"
    "  --render          print the chat-formatted text instead of the ids\n";

static const char help_detok[] =
    "usage: isobatch detokenize [-m DIR | --tokenizer FILE] [--skip-special] [--hex] (IDS... | --json)\n"
    "\n"
    "  Writes the exact bytes of the tokens to stdout (no newline added).\n"
    "  IDS...            ids as arguments, separated by spaces or commas\n"
    "  --json            read JSON arrays of ids from stdin (one or more, e.g. one per line)\n"
    "  --hex             write each array's bytes as lowercase hex and a newline\n"
    "  --skip-special    leave out tokens marked special\n";

/* Read a whole file (or stdin for "-") into a malloc'ed buffer. */
static char *read_all(const char *path, size_t *n) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        cli_error("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (len < cap) break;
        char *b = realloc(buf, cap * 2);
        if (!b) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b;
        cap *= 2;
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf) {
        cli_error("out of memory");
        return NULL;
    }
    if (bad) {
        free(buf);
        cli_error("%s: read error", path);
        return NULL;
    }
    *n = len;
    return buf;
}

/* Load the tokenizer of --tokenizer FILE or of the model directory (-m DIR / models/default). */
static ib_tokenizer *load_tok(const char *file, const char *dir) {
    char path[4096];
    if (!file) {
        if (!(dir = cli_model_dir(dir))) return NULL;
        if (snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path) {
            cli_usage_error("%s: path too long", dir);
            return NULL;
        }
        file = path;
    }
    ib_tokenizer *t;
    ib_error err;
    if (ib_tokenizer_load(file, INT32_MAX, &t, &err)) {
        cli_error("%s", err.msg);
        return NULL;
    }
    return t;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Encode text repeatedly for about `seconds` and print the rate. */
static int bench(ib_tokenizer *t, const char *text, size_t len, int flags, double seconds, int cache) {
    ib_tokenizer_set_cache(t, cache);
    double t0 = now();
    int n = ib_tokenizer_encode_ex(t, text, len, flags, NULL, 0);   /* first pass: cold cache */
    double first = now() - t0;
    if (n < 0) return cli_error("encode failed (out of memory)");
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) return cli_error("out of memory");
    long passes = 0;
    double start = now(), el = 0;
    do {
        if (ib_tokenizer_encode_ex(t, text, len, flags, ids, n) != n) {
            free(ids);
            return cli_error("encode gave a different count on a later pass");
        }
        passes++;
        el = now() - start;
    } while (el < seconds);
    unsigned long hits, misses;
    ib_tokenizer_cache_stats(t, &hits, &misses);
    printf("encode: %zu bytes -> %d tokens (%.2f bytes/token), 1 thread, cache %s\n", len, n, n ? (double)len / n : 0.0,
           cache ? "on" : "off");
    printf("first pass %.3f s = %.2f MB/s; %ld more passes in %.3f s = %.2f MB/s; cache hits %lu, misses %lu\n", first,
           first > 0 ? len / first / 1e6 : 0.0, passes, el, el > 0 ? (double)len * passes / el / 1e6 : 0.0, hits, misses);
    free(ids);
    return 0;
}

typedef struct tok_opts {
    int flags, as_json, chat, chat_flags, render, bench, cache;
    double seconds;
    const char *system;
} tok_opts;

/* Print the ids of one text (a JSON array or ids separated by spaces) and a newline. */
static int print_ids(ib_tokenizer *t, const char *text, size_t len, int flags, int as_json) {
    int n = ib_tokenizer_encode_ex(t, text, len, flags, NULL, 0);
    int32_t *ids = n >= 0 ? malloc(((size_t)n + 1) * sizeof *ids) : NULL;
    if (!ids) return cli_error("encode failed (out of memory)");
    ib_tokenizer_encode_ex(t, text, len, flags, ids, n);
    if (as_json) putchar('[');
    for (int i = 0; i < n; i++) printf(i ? (as_json ? ",%d" : " %d") : "%d", ids[i]);
    puts(as_json ? "]" : "");
    free(ids);
    return 0;
}

/* Render msgs in the chat format into a new string (length in *len). */
static char *render(const ib_tokenizer *t, const ib_chat_msg *msgs, int n, int flags, size_t *len) {
    long need = ib_tokenizer_chat_format(t, msgs, n, flags, NULL, 0);
    if (need < 0) {
        cli_error("the tokenizer has no chat format (no chat template, no <|im_start|>/<|im_end|>)");
        return NULL;
    }
    char *s = malloc((size_t)need + 1);
    if (!s) {
        cli_error("out of memory");
        return NULL;
    }
    ib_tokenizer_chat_format(t, msgs, n, flags, s, (size_t)need + 1);
    *len = (size_t)need;
    return s;
}

/* Encode (or benchmark, or render) one input text. */
static int process(ib_tokenizer *t, const char *text, size_t len, const tok_opts *o) {
    char *chat = NULL;
    if (o->chat) {
        ib_chat_msg m[2] = {{.role = "system", .content = o->system ? o->system : ""}, {.role = "user", .content = text}};
        int k = o->system ? 0 : 1;
        if (!(chat = render(t, m + k, 2 - k, o->chat_flags, &len))) return 1;
        text = chat;
    }
    int rc;
    if (o->render) rc = fwrite(text, 1, len, stdout) == len ? 0 : cli_error("write error");
    else if (o->bench) rc = bench(t, text, len, o->flags, o->seconds, o->cache);
    else rc = print_ids(t, text, len, o->flags, o->as_json);
    free(chat);
    return rc;
}

/* Encode the conversation of a JSON file [{"role", "content"}, ...]; with tools_path (a JSON array of
 * OpenAI tools, possibly empty), the messages in OpenAI's shape written in the model's tool form by the
 * server's own rewrite (ib_api_tool_messages). */
static int process_messages(ib_tokenizer *t, const char *path, const char *tools_path, tok_opts o) {
    json_error_t je;
    json_t *a = json_load_file(path, 0, &je), *tools = NULL;
    if (!json_is_array(a)) {
        json_decref(a);
        return cli_error("%s: not a JSON array of messages (%s)", path, a ? "not an array" : je.text);
    }
    size_t n = json_array_size(a);
    ib_chat_msg *m = NULL;
    ib_api_tool_msgs tm = {0};
    int rc = 0;
    if (tools_path) {
        char why[256];
        const char *param = NULL;
        tools = json_load_file(tools_path, 0, &je);
        if (!json_is_array(tools)) rc = cli_error("%s: not a JSON array of tools (%s)", tools_path, tools ? "not an array" : je.text);
        else if (ib_tokenizer_chat_tools(t) == IB_CHAT_TOOLS_NONE)
            rc = cli_error("the tokenizer's chat format has no tool form (Qwen's <tool_call> or Gemma 4's <|tool_call>)");
        else if ((rc = ib_api_tool_messages(ib_tokenizer_chat_tools(t), a, json_array_size(tools) ? tools : NULL, &tm, &param, why,
                                            sizeof why)))
            rc = rc == -2 ? cli_error("out of memory") : cli_error("%s: %s", param && !strcmp(param, "tools") ? tools_path : path, why);
        m = tm.m;
        n = tm.n;
    } else {
        m = calloc(n + 1, sizeof *m);
        rc = m ? 0 : cli_error("out of memory");
        for (size_t i = 0; !rc && i < n; i++) {
            json_t *e = json_array_get(a, i), *r = json_object_get(e, "role"), *c = json_object_get(e, "content");
            if (!json_is_string(r) || !json_is_string(c)) rc = cli_error("%s: message %zu: needs string role and content", path, i);
            else m[i] = (ib_chat_msg){.role = json_string_value(r), .content = json_string_value(c)};
        }
    }
    size_t len = 0;
    char *text = rc ? NULL : render(t, m, (int)n, o.chat_flags, &len);
    if (!rc && !text) rc = 1;
    o.chat = 0;
    if (!rc) rc = process(t, text, len, &o);
    free(text);
    if (tools_path) ib_api_tool_msgs_free(&tm);
    else free(m);
    json_decref(tools);
    json_decref(a);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *file = NULL, *dir = NULL, *text = NULL, *messages = NULL, *tools = NULL;
    tok_opts o = {.cache = 1, .seconds = 2, .chat_flags = IB_CHAT_GENERATION_PROMPT};
    int rc = 0, n_in = 0;
    const char **ins = calloc((size_t)argc, sizeof *ins);   /* --file arguments */
    if (!ins) return cli_error("out of memory");
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help_tok, stdout);
            free(ins);
            return 0;
        }
        if (!strcmp(f, "--json")) o.as_json = 1;
        else if (!strcmp(f, "--add-special")) o.flags |= IB_TOKENIZE_ADD_SPECIAL;
        else if (!strcmp(f, "--split-special")) o.flags |= IB_TOKENIZE_SPLIT_SPECIAL;
        else if (!strcmp(f, "--bench")) o.bench = 1;
        else if (!strcmp(f, "--no-cache")) o.cache = 0;
        else if (!strcmp(f, "--chat")) o.chat = 1;
        else if (!strcmp(f, "--no-think")) o.chat_flags |= IB_CHAT_NO_THINKING;
        else if (!strcmp(f, "--think")) o.chat_flags |= IB_CHAT_THINKING;
        else if (!strcmp(f, "--render")) o.render = 1;
        else if (!strcmp(f, "--seconds")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_float(f, v, 0, 3600, &o.seconds)) rc = 2;
        } else if (!strcmp(f, "-m") || !strcmp(f, "--tokenizer") || !strcmp(f, "--file") || !strcmp(f, "--system") ||
                   !strcmp(f, "--messages") || !strcmp(f, "--tools")) {
            if (!(v = cli_value(argc, argv, &i))) rc = 2;
            else if (f[1] == 'm') dir = v;
            else if (!strcmp(f, "--tools")) tools = v;
            else if (f[2] == 't') file = v;
            else if (f[2] == 's') o.system = v;
            else if (f[2] == 'm') messages = v;
            else ins[n_in++] = v;
        } else if (f[0] == '-' && f[1]) {
            rc = cli_unknown_option("tokenize", f, help_tok);
        } else if (text) {
            rc = cli_usage_error("tokenize: one TEXT argument only (quote it, or use --file)");
        } else {
            text = f;
        }
    }
    if (!rc && !!text + !!n_in + !!messages != 1) rc = cli_usage_error("tokenize: give TEXT, --file F or --messages FILE (try --help)");
    if (!rc && file && dir) rc = cli_usage_error("tokenize: -m and --tokenizer exclude each other");
    if (!rc && o.bench && n_in > 1) rc = cli_usage_error("tokenize: --bench takes one text");
    if (!rc && (o.system || o.render) && !o.chat && !messages) rc = cli_usage_error("tokenize: --system and --render go with --chat or --messages");
    if (!rc && tools && !messages) rc = cli_usage_error("tokenize: --tools goes with --messages");
    ib_tokenizer *t = rc ? NULL : load_tok(file, dir);
    if (!rc && !t) rc = 1;
    if (!rc && text) rc = process(t, text, strlen(text), &o);
    if (!rc && messages) rc = process_messages(t, messages, tools, o);
    for (int i = 0; !rc && i < n_in; i++) {
        size_t len = 0;
        char *buf = read_all(ins[i], &len);
        if (!buf) rc = 1;
        else rc = process(t, buf, len, &o);
        free(buf);
    }
    if (!rc && fflush(stdout)) rc = cli_error("write error");
    ib_tokenizer_free(t);
    free(ins);
    return rc;
}

/* Append the ids of s (integers separated by spaces or commas) to *ids. */
static int parse_ids(const char *s, int32_t **ids, size_t *n, size_t *cap) {
    while (*s) {
        if (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ' ' && *end != ',' && *end != '\t' && *end != '\n'))
            return cli_usage_error("detokenize: bad id at '%.20s'", s);
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 256;
            int32_t *r = realloc(*ids, *cap * sizeof *r);
            if (!r) return cli_error("out of memory");
            *ids = r;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
    }
    return 0;
}

/* Write the bytes of ids[0..n) to stdout (as lowercase hex plus a newline when hex). */
static int write_text(const ib_tokenizer *t, const int32_t *ids, size_t n, int skip, int hex, char **buf, int *bcap) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= ib_tokenizer_n_ids(t))
            return cli_error("detokenize: id %d is not a token (ids are < %d)", ids[i], ib_tokenizer_n_ids(t));
        if (skip && ib_tokenizer_is_special(t, ids[i])) continue;
        int k;
        while ((k = ib_tokenizer_decode(t, ids[i], *buf, *bcap)) < 0) {
            int nc = *bcap ? 2 * *bcap : 4096;
            char *b = realloc(*buf, (size_t)nc);
            if (!b) return cli_error("out of memory");
            *buf = b;
            *bcap = nc;
        }
        if (hex) {
            for (int j = 0; j < k; j++) printf("%02x", (unsigned char)(*buf)[j]);
        } else if (k > 0 && fwrite(*buf, 1, (size_t)k, stdout) != (size_t)k) {
            return cli_error("write error");
        }
    }
    if (hex) putchar('\n');
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *file = NULL, *dir = NULL;
    int from_json = 0, skip = 0, hex = 0, rc = 0, bcap = 0;
    int32_t *ids = NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help_detok, stdout);
            free(ids);
            return 0;
        }
        if (!strcmp(f, "--json")) from_json = 1;
        else if (!strcmp(f, "--skip-special")) skip = 1;
        else if (!strcmp(f, "--hex")) hex = 1;
        else if (!strcmp(f, "-m") || !strcmp(f, "--tokenizer")) {
            if (!(v = cli_value(argc, argv, &i))) rc = 2;
            else if (f[1] == 'm') dir = v;
            else file = v;
        } else if (f[0] == '-' && f[1] && !(f[1] >= '0' && f[1] <= '9')) {
            rc = cli_unknown_option("detokenize", f, help_detok);
        } else {
            rc = parse_ids(f, &ids, &n, &cap);
        }
    }
    if (!rc && from_json && n) rc = cli_usage_error("detokenize: give IDS or --json, not both");
    if (!rc && !from_json && !n) rc = cli_usage_error("detokenize: no ids (try --help)");
    if (!rc && file && dir) rc = cli_usage_error("detokenize: -m and --tokenizer exclude each other");
    ib_tokenizer *t = rc ? NULL : load_tok(file, dir);
    if (!rc && !t) rc = 1;
    if (!rc && !from_json) rc = write_text(t, ids, n, skip, hex, &buf, &bcap);
    /* --json: one or more JSON arrays on stdin, each written in turn */
    for (int k = 0; !rc && from_json; k++) {
        json_error_t je;
        json_t *a = json_loadf(stdin, JSON_DISABLE_EOF_CHECK, &je);
        if (!a) {
            int c;
            while ((c = getchar()) == ' ' || c == '\n' || c == '\t' || c == '\r') {}
            if (c == EOF && k > 0) break;
            rc = cli_usage_error("detokenize: stdin: not a JSON array of ids (%s)", je.text);
            break;
        }
        n = 0;
        if (!json_is_array(a)) rc = cli_usage_error("detokenize: stdin: value %d is not an array", k);
        for (size_t i = 0; !rc && i < json_array_size(a); i++) {
            json_t *e = json_array_get(a, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX) {
                rc = cli_usage_error("detokenize: stdin: element %zu is not an id", i);
                break;
            }
            char num[24];
            snprintf(num, sizeof num, "%lld", (long long)json_integer_value(e));
            rc = parse_ids(num, &ids, &n, &cap);
        }
        json_decref(a);
        if (!rc) rc = write_text(t, ids, n, skip, hex, &buf, &bcap);
    }
    if (!rc && fflush(stdout)) rc = cli_error("write error");
    free(buf);
    free(ids);
    ib_tokenizer_free(t);
    return rc;
}
