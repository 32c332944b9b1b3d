/*
 * cmd_chat.c — `isobatch chat`: an interactive chat REPL. Each stdin line is a user turn; the whole
 * conversation is rendered in the model's chat format (ChatML for Qwen, headers for Llama 3),
 * tokenized, and only the tokens after the longest common prefix with what the session already
 * holds are prefilled (the session is rewound to that prefix: the rendering can differ from the
 * generated tokens, e.g. Qwen3 drops an earlier turn's <think> block). The reply streams to stdout through the streaming decoder and ends at the
 * format's end-of-turn token.
 */
#include <float.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cli.h"
#include "isobatch.h"

static const char help[] =
    "usage: isobatch chat [-m DIR] [--system TEXT] [-n N] [--no-think | --think] [--threads T] [--context N]\n"
    "                     [--temp X] [--top-k K] [--top-p P] [--min-p M] [--repeat-penalty R] [--seed S]\n"
    "\n"
    "  Reads one user message per line from stdin and streams each reply to stdout. Ctrl-C stops the\n"
    "  reply being written (the conversation goes on); at the prompt, Ctrl-C twice or Ctrl-D leaves.\n"
    "  Commands: /help, /reset (forget the conversation), /quit; start a message with // to send a\n"
    "  line that begins with /. (models/default is a King James Bible text model, not a chat model:\n"
    "  it continues text in that style and rarely ends a turn by itself; -n bounds each reply.)\n"
    "  -m DIR            model directory (default models/default)\n"
    "  --system TEXT     a system message first\n"
    "  -n N              most tokens per reply (default 512)\n"
    "  --no-think        Qwen3: enable_thinking=false (an empty <think></think> block)\n"
    "  --think           Gemma 4: enable_thinking=true (<|think|> in the system turn)\n"
    "  --threads T       worker threads (default: the CPUs online)\n"
    "  --context N       KV capacity in tokens (default min(model, 4096))\n"
    "  --temp ... --seed sampling (default greedy); without --seed a fresh seed, printed on stderr\n";

static const char commands[] =
    "commands:\n"
    "  /help    this list\n"
    "  /reset   forget the conversation (the system message stays)\n"
    "  /quit    leave (also /exit, Ctrl-D, or Ctrl-C twice at the prompt)\n"
    "  //text   send a message that begins with /text\n"
    "Ctrl-C while a reply is written stops that reply; the conversation goes on.\n";

/* Set by SIGINT: stops the reply being generated, or (at the prompt) asks to leave. */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { interrupted = 1; }

typedef struct chat {
    ib_model *m;
    ib_engine *e;
    ib_session *s;
    float *logits;       /* [vocab] */
    int32_t *fed;        /* [cap_fed] tokens in the session's KV cache, in order */
    int n_fed, cap_fed;
    int max_step;
    ib_chat_msg *msgs;   /* conversation; contents owned */
    int n_msgs, cap_msgs;
    int32_t stops[8];
    int n_stops;
} chat;

static int add_msg(chat *c, const char *role, const char *text, size_t len) {
    if (c->n_msgs == c->cap_msgs) {
        int nc = c->cap_msgs ? 2 * c->cap_msgs : 16;
        ib_chat_msg *m = realloc(c->msgs, (size_t)nc * sizeof *m);
        if (!m) return -1;
        c->msgs = m;
        c->cap_msgs = nc;
    }
    char *s = malloc(len + 1);
    if (!s) return -1;
    memcpy(s, text, len);
    s[len] = '\0';
    c->msgs[c->n_msgs++] = (ib_chat_msg){.role = role, .content = s};
    return 0;
}

static void drop_msgs(chat *c, int keep) {
    while (c->n_msgs > keep) free((char *)c->msgs[--c->n_msgs].content);
}

/* Step tokens into the session (chunks of max_step), the logits of the last one into c->logits. */
static int feed(chat *c, const int32_t *toks, int n) {
    ib_error err;
    if (c->n_fed + n > c->cap_fed) {
        int nc = c->n_fed + n + 256;
        int32_t *f = realloc(c->fed, (size_t)nc * sizeof *f);
        if (!f) return cli_error("out of memory");
        c->fed = f;
        c->cap_fed = nc;
    }
    for (int at = 0; at < n;) {
        int k = n - at < c->max_step ? n - at : c->max_step;
        ib_step_item it = {.session = c->s, .tokens = toks + at, .n_tokens = k, .logits = at + k == n ? c->logits : NULL};
        if (ib_step(c->e, &it, 1, &err)) return cli_error("%s", err.msg);
        at += k;
    }
    memcpy(c->fed + c->n_fed, toks, (size_t)n * sizeof *toks);
    c->n_fed += n;
    return 0;
}

static int is_stop(const chat *c, int32_t t) {
    for (int i = 0; i < c->n_stops; i++)
        if (c->stops[i] == t) return 1;
    return 0;
}

/* One turn: render, prefill what is new, generate and stream the reply, record it. */
static int turn(chat *c, int flags, long max_new) {
    long need = ib_chat_format(c->m, c->msgs, c->n_msgs, flags, NULL, 0);
    if (need < 0) return cli_error("this model has no chat format (no chat template and no chat markers such as <|im_start|>/<|im_end|>)");
    char *text = malloc((size_t)need + 1);
    if (!text) return cli_error("out of memory");
    ib_chat_format(c->m, c->msgs, c->n_msgs, flags, text, (size_t)need + 1);
    int n = ib_tokenize(c->m, text, (size_t)need, NULL, 0);
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    if (ids) ib_tokenize(c->m, text, (size_t)need, ids, n);
    free(text);
    if (!ids) return cli_error("could not tokenize the conversation");
    int rc = 0;
    /* keep the longest common prefix of what the session holds and the new rendering (at least one
     * token must be stepped to get logits); rewinding also cuts the history to exactly those tokens */
    int common = 0;
    while (common < c->n_fed && common < n && c->fed[common] == ids[common]) common++;
    if (common == n) common--;
    ib_error err;
    if (ib_session_rewind(c->s, common, &err)) {
        free(ids);
        return cli_error("%s", err.msg);
    }
    c->n_fed = common;
    if (n - common + max_new > ib_session_capacity(c->s) - c->n_fed) {
        free(ids);
        return cli_error("the conversation (%d tokens + %ld new) exceeds the context of %d tokens; /reset to start over", n,
                         max_new, ib_session_capacity(c->s));
    }
    ib_session_note_tokens(c->s, ids + common, n - common);
    rc = feed(c, ids + common, n - common);
    free(ids);
    if (rc) return rc;

    size_t rlen = 0, rcap = 256;
    char *reply = malloc(rcap);
    ib_text_stream ts = {0};
    char out[4096], tb[1024];
    interrupted = 0;
    for (long k = 0; !rc && reply && k < max_new; k++) {
        if (interrupted) {
            fputs("\n[reply interrupted]", stderr);
            break;
        }
        int32_t tok = ib_sample(c->s, c->logits);
        if (is_stop(c, tok)) break;
        int w = ib_text_stream_push(c->m, &ts, tok, out, sizeof out);
        if (w > 0) {
            fwrite(out, 1, (size_t)w, stdout);
            fflush(stdout);
        }
        int b = ib_token_bytes(c->m, tok, tb, sizeof tb);
        if (b > 0) {
            if (rlen + (size_t)b + 1 > rcap) {
                while (rlen + (size_t)b + 1 > rcap) rcap *= 2;
                char *r = realloc(reply, rcap);
                if (!r) break;
                reply = r;
            }
            memcpy(reply + rlen, tb, (size_t)b);
            rlen += (size_t)b;
        }
        rc = feed(c, &tok, 1);
    }
    int w = ib_text_stream_flush(&ts, out, sizeof out);
    if (w > 0) fwrite(out, 1, (size_t)w, stdout);
    putchar('\n');
    fflush(stdout);
    if (!reply) return cli_error("out of memory");
    if (!rc && add_msg(c, "assistant", reply, rlen)) rc = cli_error("out of memory");
    free(reply);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    const char *dir = NULL, *system = NULL;
    long max_new = 512, threads = sysconf(_SC_NPROCESSORS_ONLN), context = 0;
    int flags = IB_CHAT_GENERATION_PROMPT;
    ib_sampling smp = ib_sampling_default();
    int seeded = 0;
    if (threads < 1) threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        double d;
        long k;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if (!strcmp(f, "--think")) {
            flags |= IB_CHAT_THINKING;
            continue;
        }
        if (!strcmp(f, "--no-think")) {
            flags |= IB_CHAT_NO_THINKING;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(f, "-m")) dir = v;
        else if (!strcmp(f, "--system")) system = v;
        else if (!strcmp(f, "-n")) { if (cli_int(f, v, 1, 1 << 20, &max_new)) return 2; }
        else if ((!strcmp(f, "--threads") || !strcmp(f, "-t"))) { if (cli_int(f, v, 1, 256, &threads)) return 2; }
        else if (!strcmp(f, "--context")) { if (cli_int(f, v, 1, 1 << 24, &context)) return 2; }
        else if (!strcmp(f, "--temp")) { if (cli_float(f, v, 0, 100, &d)) return 2; smp.temperature = (float)d; }
        else if (!strcmp(f, "--top-k")) { if (cli_int(f, v, 0, 1 << 24, &k)) return 2; smp.top_k = (int)k; }
        else if (!strcmp(f, "--top-p")) { if (cli_float(f, v, 0, 1, &d)) return 2; smp.top_p = d > 0 ? (float)d : FLT_TRUE_MIN; /* 0: the top token only */ }
        else if (!strcmp(f, "--min-p")) { if (cli_float(f, v, 0, 1, &d)) return 2; smp.min_p = (float)d; }
        else if (!strcmp(f, "--repeat-penalty")) { if (cli_float(f, v, 0.01, 100, &d)) return 2; smp.repeat_penalty = (float)d; }
        else if (!strcmp(f, "--seed")) { if (cli_u64(f, v, &smp.seed)) return 2; seeded = 1; }
        else return cli_unknown_option("chat", f, help);
    }
    if (!(dir = cli_model_dir(dir))) return 2;
    if (smp.temperature > 0 && !seeded) {
        uint64_t seed = 0;
        if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)getpid() * 2654435761u;
        smp.seed = seed & ((1ULL << 53) - 1);
        fprintf(stderr, "isobatch chat: sampling with seed %llu (--seed %llu repeats this conversation)\n",
                (unsigned long long)smp.seed, (unsigned long long)smp.seed);
    }
    chat c = {.max_step = 512};
    ib_error err;
    int rc = 0;
    char *line = NULL;
    size_t lcap = 0;
    ib_load_opts lo = {.threads = (int)threads};   /* the weights are repacked on as many threads */
    if (ib_model_load(dir, &lo, &c.m, &err)) return cli_error("%s", err.msg);
    ib_engine_opts eo = {.threads = (int)threads, .max_step_tokens = c.max_step};
    int model_ctx = ib_model_get_info(c.m)->max_context;
    if (context == 0) context = model_ctx < 4096 ? model_ctx : 4096; /* the documented default, min(model, 4096) */
    ib_session_opts so = {.max_context = (int)context, .sampling = smp};
    if (ib_engine_create(c.m, &eo, &c.e, &err) || ib_session_create(c.m, &so, &c.s, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    c.n_stops = ib_chat_stop_ids(c.m, c.stops, 8);
    if (ib_chat_format(c.m, NULL, 0, 0, NULL, 0) < 0) {
        rc = cli_error("%s: the tokenizer has no chat format (no chat template and no chat markers such as <|im_start|>/<|im_end|>)", dir);
        goto out;
    }
    c.logits = malloc((size_t)ib_model_get_info(c.m)->vocab_size * sizeof *c.logits);
    if (!c.logits || (system && add_msg(&c, "system", system, strlen(system)))) {
        rc = cli_error("out of memory");
        goto out;
    }
    int base = c.n_msgs, tty = isatty(0);
    /* Ctrl-C stops a reply instead of the program (no SA_RESTART: it also wakes a waiting read) */
    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, &old_sa);
    if (tty) fputs("isobatch chat: /help lists the commands\n", stderr);
    ssize_t len;
    int int_at_prompt = 0;
    for (;;) {
        if (tty) fputs("> ", stderr);
        interrupted = 0;
        errno = 0;
        if ((len = getline(&line, &lcap, stdin)) < 0) {
            if (errno == EINTR && interrupted && !int_at_prompt) {
                int_at_prompt = 1;
                clearerr(stdin);
                fputs("\n(Ctrl-C again, Ctrl-D or /quit to leave)\n", stderr);
                continue;
            }
            break;
        }
        int_at_prompt = 0;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        char *msg = line;
        if (line[0] == '/' && line[1] == '/') {
            msg = line + 1; /* "//text" sends "/text" */
            len--;
        } else if (line[0] == '/') {
            if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
            if (!strcmp(line, "/help")) fputs(commands, stderr);
            else if (!strcmp(line, "/reset")) {
                drop_msgs(&c, base);
                ib_session_reset(c.s);
                c.n_fed = 0;
                fputs("(conversation cleared)\n", stderr);
            } else
                fprintf(stderr, "unknown command '%s': /help lists the commands (// sends a line beginning with /)\n", line);
            continue;
        }
        if (add_msg(&c, "user", msg, (size_t)len)) {
            rc = cli_error("out of memory");
            break;
        }
        if ((rc = turn(&c, flags, max_new))) {
            drop_msgs(&c, c.n_msgs - 1);   /* forget the failed turn; keep going when interactive */
            if (!tty) break;
            rc = 0;
        }
    }
    sigaction(SIGINT, &old_sa, NULL);
out:
    free(line);
    drop_msgs(&c, 0);
    free(c.msgs);
    free(c.fed);
    free(c.logits);
    ib_session_free(c.s);
    ib_engine_free(c.e);
    ib_model_free(c.m);
    return rc;
}
