/*
 * cmd_generate.c — `isobatch generate`: prompts in, generated text/tokens/digests out.
 */
#include <float.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "isobatch.h"

static const char help[] =
    "usage: isobatch generate [-m DIR] (-p TEXT)... [--prompts-file F] [--prompt-ids 1,2,3]... [-n N]\n"
    "         [--batch B] [--threads T] [--prefill-chunk C|whole] [--isa auto|scalar|avx2|avx512|neon|amx]\n"
    "         [--act auto|f32|q8] [--kv-dtype f32|f16|q8] [--kv full|window:W|sink:S,window:W] [--temp X] [--top-k K] [--top-p P] [--min-p M] [--repeat-penalty R]\n"
    "         [--seed S] [--ignore-eos] [--json] [--stream] [--logits-out FILE] [--check-serial] [--inject FAULT]\n"
    "         [--chat [--think | --no-think]]\n"
    "\n"
    "  -m DIR            model directory (default models/default)\n"
    "  -p TEXT           a prompt (repeatable)\n"
    "  --prompts-file F  one prompt per line\n"
    "  --prompt-ids L    a prompt given as comma-separated token ids (repeatable)\n"
    "  -n N              tokens to generate per prompt (default 32)\n"
    "  --batch B         sessions stepped together (default 8); 1 decodes prompts one at a time\n"
    "  -t, --threads T   worker threads (default: the CPUs online)\n"
    "  --prefill-chunk C prompt tokens per step per session (default whole)\n"
    "  --max-step-tokens N  tokens per step over all sessions (default 512)\n"
    "  --isa, --act      kernels and activation mode (results never depend on --isa)\n"
    "  --backend B       cpu (default) or cuda: where the engine computes (same bits on both)\n"
    "  --kv-dtype T      keys/values as f32 (default), f16 (IEEE half: half the KV memory) or q8 (8-bit\n"
    "                    codes, a scale per 32: 28% of f32's memory; CPU backend); answers change slightly\n"
    "  --kv POLICY       KV policy: full (default), window:W (each token attends the last W positions),\n"
    "                    sink:S,window:W (and the first S): fixed memory, the same answers batched or alone\n"
    "  --temp ... --seed sampling (default greedy); draws keyed by (seed, step). Sampling without\n"
    "                    --seed draws a fresh seed and prints it on stderr (and in --json), so a run can\n"
    "                    be repeated\n"
    "  --ignore-eos      do not stop at the end-of-sequence token\n"
    "  --chat            wrap each text prompt as a user turn in the model's chat format (ChatML,\n"
    "                    Llama 3, Gemma) followed by the assistant header\n"
    "  --think           with --chat: Gemma 4's enable_thinking=true (<|think|> in the system turn)\n"
    "  --no-think        with --chat: Qwen3's enable_thinking=false (an empty <think></think> block)\n"
    "  --json            one JSON line per prompt: index, prompt_tokens, tokens, text, digest, seed\n"
    "  --stream          print text as it is generated (the default with one prompt); several prompts\n"
    "                    are shown in order, each live once those before it are done\n"
    "                    Output: the generated text on stdout (one prompt: the text alone; several:\n"
    "                    '[i] prompt | text' lines); digests and statistics on stderr\n"
    "  --logits-out F    write the logits rows that chose each token (float32 LE, prompt-major)\n"
    "  --check-serial    also decode every prompt alone and verify bitwise equality\n"
    "  --inject FAULT    test-only: break a kernel on purpose (rope-scalar-offset, rope-skip-rows,\n"
    "                    gemv-gemm, split-k-threads, isa-fma, row-order, shared-rng, split-kv-by-batch,\n"
    "                    gpu-fma: the CUDA backend fuses its products' multiply-adds; gpu-split-k: it\n"
    "                    splits their K over blocks added in any order; moe-capacity,\n"
    "                    moe-combine-by-load: Gemma 4 MoE routing / combine that depend on the batch;\n"
    "                    kv-ring-short: sliding-window KV rings one slot too small;\n"
    "                    amx-group-order: --isa amx adds its tile rows' groups in descending order;\n"
    "                    ple-row0: Gemma 4 per-layer embeddings of every row from the first row's token;\n"
    "                    attn-tile-range: prefill attention rows of a tile attend its last row's keys;\n"
    "                    gpu-att-block: the CUDA attention cuts key blocks at half the canonical size;\n"
    "                    attn-block-max: vector attention's key-block maxima take NaN scores;\n"
    "                    kvq8-step-scale: q8 KV encoded with another code range in steps of several rows;\n"
    "                    kv-pool-dirty: ended sessions' KV memory reused without zeroing it;\n"
    "                    share-early: serve's n choices copy the first choice's prefilled session a\n"
    "                    token early)\n";

typedef struct prompts {
    int n, cap;
    int32_t **ids;
    int *len;
    char **text;  /* NULL for --prompt-ids */
} prompts;

static int prompts_add(prompts *p, int32_t *ids, int len, const char *text) {
    if (p->n == p->cap) {
        int nc = p->cap ? 2 * p->cap : 16;
        int32_t **a = realloc(p->ids, nc * sizeof *a);
        if (a) p->ids = a;
        int *b = realloc(p->len, nc * sizeof *b);
        if (b) p->len = b;
        char **c = realloc(p->text, nc * sizeof *c);
        if (c) p->text = c;
        if (!a || !b || !c) return -1;
        p->cap = nc;
    }
    p->ids[p->n] = ids;
    p->len[p->n] = len;
    p->text[p->n] = text ? strdup(text) : NULL;
    p->n++;
    return 0;
}

static void prompts_free(prompts *p) {
    for (int i = 0; i < p->n; i++) {
        free(p->ids[i]);
        free(p->text[i]);
    }
    free(p->ids);
    free(p->len);
    free(p->text);
}

/* Tokenize text into a new prompt. */
static int add_text(prompts *p, const ib_model *m, const char *text) {
    size_t len = strlen(text);
    int n = ib_tokenize(m, text, len, NULL, 0);
    if (n < 0) return cli_error("prompt: could not tokenize");
    if (n == 0) return cli_usage_error("prompt %d is empty", p->n);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return cli_error("out of memory");
    ib_tokenize(m, text, len, ids, n);
    if (prompts_add(p, ids, n, text)) {
        free(ids);
        return cli_error("out of memory");
    }
    return 0;
}

/* ---- --chat (added with the tokenizer): a text prompt becomes a user turn in the model's chat
 * format followed by the assistant header; the prompt shown stays the user's text. */
static int chat_mode;
static int chat_flags;   /* --think / --no-think: IB_CHAT_THINKING / IB_CHAT_NO_THINKING */

static int add_chat_text(prompts *p, const ib_model *m, const char *text) {
    ib_chat_msg msg = {.role = "user", .content = text};
    const int flags = IB_CHAT_GENERATION_PROMPT | chat_flags;
    long n = ib_chat_format(m, &msg, 1, flags, NULL, 0);
    if (n < 0) return cli_usage_error("--chat: the model has no chat format (no chat template and no chat markers such as <|im_start|>/<|im_end|>)");
    char *s = malloc((size_t)n + 1);
    if (!s) return cli_error("out of memory");
    ib_chat_format(m, &msg, 1, flags, s, (size_t)n + 1);
    int rc = add_text(p, m, s);
    free(s);
    if (!rc) {
        free(p->text[p->n - 1]);
        p->text[p->n - 1] = strdup(text);
    }
    return rc;
}
/* ---- end of --chat */

/* Parse "1,2,3" into a new prompt. */
static int add_ids(prompts *p, const char *list, int vocab) {
    int32_t *ids;
    int n, rc = cli_parse_ids(list, vocab, &ids, &n);
    if (rc) return rc;
    if (prompts_add(p, ids, n, NULL)) {
        free(ids);
        return cli_error("out of memory");
    }
    return 0;
}

/* Read a prompts file, one prompt per line (empty lines skipped). */
static int add_file(prompts *p, const ib_model *m, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return cli_error("%s: cannot open", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while (!rc && (n = getline(&line, &cap, f)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (n > 0) rc = chat_mode ? add_chat_text(p, m, line) : add_text(p, m, line);
    }
    free(line);
    fclose(f);
    return rc;
}

/* Decoded, sanitized text of tokens into a new string. */
static char *decode_text(const ib_model *m, const int32_t *toks, int n) {
    size_t cap = 64, len = 0;
    char *raw = malloc(cap);
    for (int i = 0; raw && i < n; i++) {
        char buf[256];
        int b = ib_token_bytes(m, toks[i], buf, sizeof buf);
        if (b < 0) b = 0;
        if (len + b + 1 > cap) {
            while (len + b + 1 > cap) cap *= 2;
            char *r = realloc(raw, cap);
            if (!r) {
                free(raw);
                return NULL;
            }
            raw = r;
        }
        memcpy(raw + len, buf, b);
        len += b;
    }
    if (!raw) return NULL;
    char *out = malloc(len * 3 + 8);
    if (out) cli_utf8_sanitize(raw, len, out, len * 3 + 8);
    free(raw);
    return out;
}

typedef struct gen_args {
    const char *model_dir, *logits_out, *prompts_file;
    long n, batch, threads, chunk, max_step;
    ib_isa isa;
    ib_backend_kind backend;  /* --backend */
    ib_act act;
    ib_sampling sampling;
    int json, ignore_eos, check_serial;
    ib_kv_dtype kv_dtype;     /* --kv-dtype */
    int kv_sink, kv_window;   /* --kv (0, 0: full) */
    int stream;               /* --stream, or one prompt in text mode */
    int seeded;               /* --seed was given */
} gen_args;

/* ---- streaming output: prompts are shown in index order; the current one is written as its tokens
 * come, later ones are buffered until every earlier one is done. */
typedef struct streamer {
    const ib_model *m;
    const prompts *p;
    int multi;                /* several prompts: '[i] prompt | ' before each */
    int stop_eos;             /* the eos token that ends a row is not shown */
    int32_t eos;
    ib_text_stream *ts;       /* [n] */
    char **buf;               /* [n] text of prompts not yet shown */
    size_t *len, *cap;        /* [n] */
    int *done;                /* [n] */
    int cur;                  /* the prompt being shown */
    int oom;
} streamer;

/* Buffer n bytes of prompt r's text (shown when r's turn comes); sets st->oom when out of memory. */
static void st_append(streamer *st, int r, const char *s, size_t n) {
    if (st->len[r] + n > st->cap[r]) {
        size_t nc = (st->len[r] + n) * 2 + 64;
        char *b = realloc(st->buf[r], nc);
        if (!b) {
            st->oom = 1;
            return;
        }
        st->buf[r] = b;
        st->cap[r] = nc;
    }
    memcpy(st->buf[r] + st->len[r], s, n);
    st->len[r] += n;
}

/* Write prompt r's header (several prompts) to stdout. */
static void st_header(streamer *st, int r) {
    if (!st->multi) return;
    char *pt = NULL;
    if (!st->p->text[r]) pt = decode_text(st->m, st->p->ids[r], st->p->len[r]);
    const char *shown = st->p->text[r] ? st->p->text[r] : pt ? pt : "";
    fprintf(stdout, "[%d] ", r);
    for (const char *c = shown; *c; c++) fputc((unsigned char)*c < 0x20 && *c != '\t' ? '.' : *c, stdout);
    fputs(" | ", stdout);
    free(pt);
}

/* Show what can be shown: the current prompt's buffered text; then, while it is done, move on. */
static void st_advance(streamer *st) {
    while (st->cur < st->p->n) {
        int r = st->cur;
        if (st->len[r]) {
            fwrite(st->buf[r], 1, st->len[r], stdout);
            st->len[r] = 0;
        }
        if (!st->done[r]) break;
        fputc('\n', stdout);
        if (++st->cur < st->p->n) st_header(st, st->cur);
    }
    fflush(stdout);
}

/* ib_gen_opts.on_token: text of request r's token, to stdout when r is shown now, else buffered. */
static void st_token(void *ctx, int r, int32_t tok, int done) {
    streamer *st = ctx;
    char piece[3 * (256 + 4)];
    int w = 0;
    if (!(done && st->stop_eos && tok == st->eos)) w = ib_text_stream_push(st->m, &st->ts[r], tok, piece, sizeof piece);
    if (w > 0) st_append(st, r, piece, (size_t)w);
    if (done) {
        w = ib_text_stream_flush(&st->ts[r], piece, sizeof piece);
        if (w > 0) st_append(st, r, piece, (size_t)w);
        st->done[r] = 1;
    }
    if (r == st->cur) st_advance(st);
}

/* Set up streaming output for prompts p and show prompt 0's header; -1 when out of memory (then
 * st_finish frees what was made). */
static int st_init(streamer *st, const ib_model *m, const prompts *p, const gen_args *a) {
    memset(st, 0, sizeof *st);
    st->m = m;
    st->p = p;
    st->multi = p->n > 1;
    st->stop_eos = !a->ignore_eos;
    st->eos = ib_model_get_info(m)->eos_id;
    st->ts = calloc((size_t)p->n, sizeof *st->ts);
    st->buf = calloc((size_t)p->n, sizeof *st->buf);
    st->len = calloc((size_t)p->n, sizeof *st->len);
    st->cap = calloc((size_t)p->n, sizeof *st->cap);
    st->done = calloc((size_t)p->n, sizeof *st->done);
    if (!st->ts || !st->buf || !st->len || !st->cap || !st->done) return -1;
    if (p->n > 0) st_header(st, 0);
    fflush(stdout);
    return 0;
}

/* After the run: rows that produced nothing (-n 0) are done too; show the rest; free. */
static void st_finish(streamer *st, int ok) {
    if (ok && st->done) {
        for (int r = 0; r < st->p->n; r++) st->done[r] = 1;
        st_advance(st);
    }
    for (int r = 0; st->buf && r < st->p->n; r++) free(st->buf[r]);
    free(st->ts);
    free(st->buf);
    free(st->len);
    free(st->cap);
    free(st->done);
}
/* ---- end of streaming output */

/* Run one generation with the given batch; with out, stream its text as it comes. */
static int run(ib_model *m, const gen_args *a, const prompts *p, long batch, ib_gen_result *res, ib_gen_stats *st,
               streamer *out) {
    ib_error err;
    ib_engine_opts eo = {.threads = (int)a->threads, .isa = a->isa, .act = a->act, .backend = a->backend, .max_step_tokens = (int)a->max_step};
    ib_engine *e;
    if (ib_engine_create(m, &eo, &e, &err)) return cli_error("%s", err.msg);
    ib_gen_request *rq = malloc((size_t)p->n * sizeof *rq);
    if (!rq) {
        ib_engine_free(e);
        return cli_error("out of memory");
    }
    for (int i = 0; i < p->n; i++) rq[i] = (ib_gen_request){.prompt = p->ids[i], .n_prompt = p->len[i]};
    ib_gen_opts go = {.max_new_tokens = (int)a->n, .batch = (int)batch, .prefill_chunk = (int)a->chunk,
                      .ignore_eos = a->ignore_eos, .keep_logits = a->logits_out != NULL, .sampling = a->sampling,
                      .kv_dtype = a->kv_dtype, .on_token = out ? st_token : NULL, .on_token_ctx = out,
                      .kv_sink = a->kv_sink, .kv_window = a->kv_window};
    ib_status rc = ib_generate(e, rq, p->n, &go, res, st, &err);
    free(rq);
    ib_engine_free(e);
    if (rc) return cli_error("%s", err.msg);
    return 0;
}

static int write_logits(const char *path, const ib_gen_result *res, int n, int vocab) {
    FILE *f = fopen(path, "wb");
    if (!f) return cli_error("%s: cannot open for writing", path);
    for (int i = 0; i < n; i++)
        if (res[i].n_tokens && fwrite(res[i].logits, sizeof(float) * vocab, res[i].n_tokens, f) != (size_t)res[i].n_tokens) {
            fclose(f);
            return cli_error("%s: write failed", path);
        }
    if (fclose(f)) return cli_error("%s: write failed", path);
    return 0;
}

/* Replace control characters (other than newline and tab) by '.', for terminal display. */
static void printable(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 && *s != '\n' && *s != '\t') *s = '.';
        else if (*s == 0x7f) *s = '.';
}

/* --json lines, or (text mode) '[i] prompt | text' lines on stdout unless the text was streamed; in
 * text mode the per-prompt digest lines go to stderr. */
static void print_results(const ib_model *m, const gen_args *a, const prompts *p, const ib_gen_result *res) {
    for (int i = 0; i < p->n; i++) {
        char *text = decode_text(m, res[i].tokens, res[i].n_tokens);
        char digest[17];
        snprintf(digest, sizeof digest, "%016llx", (unsigned long long)res[i].digest);
        if (a->json) {
            json_t *o = json_object(), *toks = json_array();
            for (int t = 0; t < res[i].n_tokens; t++) json_array_append_new(toks, json_integer(res[i].tokens[t]));
            json_object_set_new(o, "index", json_integer(i));
            json_object_set_new(o, "prompt_tokens", json_integer(p->len[i]));
            json_object_set_new(o, "tokens", toks);
            json_object_set_new(o, "text", json_string(text ? text : ""));
            json_object_set_new(o, "finish_reason", json_string(res[i].finish));
            json_object_set_new(o, "digest", json_string(digest));
            if (a->sampling.temperature > 0) json_object_set_new(o, "seed", json_integer((json_int_t)a->sampling.seed));
            char *s = json_dumps(o, JSON_COMPACT);
            if (s) puts(s);
            free(s);
            json_decref(o);
        } else {
            if (!a->stream) {
                char *ptext = p->text[i] ? NULL : decode_text(m, p->ids[i], p->len[i]);
                if (text) printable(text);
                if (ptext) printable(ptext);
                printf("[%d] %s", i, p->text[i] ? p->text[i] : ptext ? ptext : "");
                printf(" | %s\n", text ? text : "");
                free(ptext);
            }
            fprintf(stderr, "[%d] digest %s, %d tokens, %s\n", i, digest, res[i].n_tokens, res[i].finish);
        }
        free(text);
    }
}

int cmd_generate(int argc, char **argv) {
    gen_args a = {.n = 32, .batch = 8, .threads = sysconf(_SC_NPROCESSORS_ONLN), .chunk = 0, .max_step = 512,
                  .sampling = ib_sampling_default()};
    if (a.threads < 1) a.threads = 1;
    const char **texts = calloc((size_t)argc, sizeof *texts), **idlists = calloc((size_t)argc, sizeof *idlists);
    int nt = 0, ni = 0, rc = 0;
    ib_model *m = NULL;
    prompts p = {0};
    ib_gen_result *res = NULL, *ser = NULL;
    if (!texts || !idlists) {
        rc = cli_error("out of memory");
        goto out;
    }
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v = NULL;
        double d;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            goto out;
        }
#define VAL() (v = cli_value(argc, argv, &i))
        if (!strcmp(f, "-m")) rc = VAL() ? (a.model_dir = v, 0) : 2;
        else if (!strcmp(f, "-p")) rc = VAL() ? (texts[nt++] = v, 0) : 2;
        else if (!strcmp(f, "--prompts-file")) rc = VAL() ? (a.prompts_file = v, 0) : 2;
        else if (!strcmp(f, "--prompt-ids")) rc = VAL() ? (idlists[ni++] = v, 0) : 2;
        else if (!strcmp(f, "-n")) rc = VAL() ? cli_int(f, v, 0, 1 << 20, &a.n) : 2;
        else if (!strcmp(f, "--batch")) rc = VAL() ? cli_int(f, v, 1, 4096, &a.batch) : 2;
        else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) rc = VAL() ? cli_int(f, v, 1, 256, &a.threads) : 2;
        else if (!strcmp(f, "--max-step-tokens")) rc = VAL() ? cli_int(f, v, 1, 1 << 20, &a.max_step) : 2;
        else if (!strcmp(f, "--prefill-chunk")) {
            if (!VAL()) rc = 2;
            else if (!strcmp(v, "whole")) a.chunk = 0;
            else rc = cli_int(f, v, 0, 1 << 20, &a.chunk);
        } else if (!strcmp(f, "--isa")) rc = VAL() ? cli_isa(v, &a.isa) : 2;
        else if (!strcmp(f, "--backend")) rc = VAL() ? cli_backend(v, &a.backend) : 2;
        else if (!strcmp(f, "--act")) {
            rc = VAL() ? cli_act(v, &a.act) : 2;
        } else if (!strcmp(f, "--kv-dtype")) {
            rc = VAL() ? cli_kv_dtype(v, &a.kv_dtype) : 2;
        } else if (!strcmp(f, "--kv")) {
            rc = VAL() ? cli_kv_policy(v, &a.kv_sink, &a.kv_window) : 2;
        } else if (!strcmp(f, "--temp")) {
            if (!VAL() || cli_float(f, v, 0, 100, &d)) rc = 2;
            else a.sampling.temperature = (float)d;
        } else if (!strcmp(f, "--top-k")) {
            long k;
            if (!VAL() || cli_int(f, v, 0, 1 << 24, &k)) rc = 2;
            else a.sampling.top_k = (int)k;
        } else if (!strcmp(f, "--top-p")) {
            if (!VAL() || cli_float(f, v, 0, 1, &d)) rc = 2;
            else a.sampling.top_p = d > 0 ? (float)d : FLT_TRUE_MIN; /* 0: only the most likely token, as
                                                                         * always (0 in ib_sampling is "off") */
        } else if (!strcmp(f, "--min-p")) {
            if (!VAL() || cli_float(f, v, 0, 1, &d)) rc = 2;
            else a.sampling.min_p = (float)d;
        } else if (!strcmp(f, "--repeat-penalty")) {
            if (!VAL() || cli_float(f, v, 0.01, 100, &d)) rc = 2;
            else a.sampling.repeat_penalty = (float)d;
        } else if (!strcmp(f, "--seed")) {
            if (!VAL() || cli_u64(f, v, &a.sampling.seed)) rc = 2;
            a.seeded = 1;
        } else if (!strcmp(f, "--json")) a.json = 1;
        else if (!strcmp(f, "--stream")) a.stream = 1;
        else if (!strcmp(f, "--ignore-eos")) a.ignore_eos = 1;
        else if (!strcmp(f, "--chat")) chat_mode = 1;
        else if (!strcmp(f, "--think")) chat_flags |= IB_CHAT_THINKING;
        else if (!strcmp(f, "--no-think")) chat_flags |= IB_CHAT_NO_THINKING;
        else if (!strcmp(f, "--check-serial")) a.check_serial = 1;
        else if (!strcmp(f, "--logits-out")) rc = VAL() ? (a.logits_out = v, 0) : 2;
        else if (!strcmp(f, "--inject")) rc = VAL() ? cli_inject(v) : 2;
        else rc = cli_unknown_option("generate", f, help);
#undef VAL
    }
    if (rc) goto out;
    if (chat_flags && !chat_mode) {
        rc = cli_usage_error("generate: --think and --no-think shape the chat format: they need --chat");
        goto out;
    }
    if (nt + ni == 0 && !a.prompts_file) {
        rc = cli_usage_error("generate: no prompt (use -p TEXT, --prompts-file F or --prompt-ids 1,2,3)");
        goto out;
    }
    const char *dir = cli_model_dir(a.model_dir);
    if (!dir) {
        rc = 2;
        goto out;
    }
    ib_error err;
    ib_load_opts lo = {.threads = (int)a.threads};   /* the weights are repacked on as many threads */
    if (ib_model_load(dir, &lo, &m, &err)) {
        rc = cli_error("%s", err.msg);
        goto out;
    }
    const ib_model_info *info = ib_model_get_info(m);
    if (nt > 0 || a.prompts_file) {
        /* without tokenizer.json the model would fall back to raw bytes: text prompts would be garbage */
        char tp[4200];
        struct stat sb;
        snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
        if (stat(tp, &sb) != 0) {
            rc = cli_error("%s: missing: text prompts need the model's tokenizer (--prompt-ids works without one)", tp);
            goto out;
        }
    }
    for (int i = 0; i < nt && !rc; i++) rc = chat_mode ? add_chat_text(&p, m, texts[i]) : add_text(&p, m, texts[i]);
    for (int i = 0; i < ni && !rc; i++) rc = add_ids(&p, idlists[i], info->vocab_size);
    if (!rc && a.prompts_file) rc = add_file(&p, m, a.prompts_file);
    if (rc) goto out;
    if (a.max_step < a.batch) a.max_step = a.batch; /* every row can always take its decode token */
    res = calloc((size_t)p.n, sizeof *res);
    if (!res) {
        rc = cli_error("out of memory");
        goto out;
    }
    if (a.sampling.temperature > 0 && !a.seeded) {
        /* unseeded sampling: a fresh seed, told so the run can be repeated */
        uint64_t seed = 0;
        if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)time(NULL) * 2654435761u;
        a.sampling.seed = seed & ((1ULL << 53) - 1);
        fprintf(stderr, "isobatch: sampling with seed %llu (--seed %llu repeats this run)\n",
                (unsigned long long)a.sampling.seed, (unsigned long long)a.sampling.seed);
    }
    if (!a.json && p.n == 1) a.stream = 1;
    if (a.json) a.stream = 0;
    ib_gen_stats st;
    streamer sm;
    if (a.stream && st_init(&sm, m, &p, &a)) {
        st_finish(&sm, 0);
        rc = cli_error("out of memory");
        goto out;
    }
    rc = run(m, &a, &p, a.batch, res, &st, a.stream ? &sm : NULL);
    if (a.stream) st_finish(&sm, rc == 0);
    if (rc) goto out;
    print_results(m, &a, &p, res);
    if (a.logits_out && (rc = write_logits(a.logits_out, res, p.n, info->vocab_size))) goto out;
    fprintf(stderr,
            "%d prompts, batch %ld, %ld threads: %ld prompt + %ld generated tokens in %.3f s (%.1f tok/s generated, %d steps)\n",
            p.n, a.batch, a.threads, st.prompt_tokens, st.generated_tokens, st.seconds,
            st.seconds > 0 ? st.generated_tokens / st.seconds : 0.0, st.steps);
    fprintf(stderr, "prompt: %ld tokens, %.1f tok/s (%.3f s of steps that fed prompt tokens); "
                    "generation: %ld tokens, %.1f tok/s (%.3f s of decode-only steps)\n",
            st.prompt_tokens, st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0.0, st.prefill_seconds,
            st.decode_tokens, st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds : 0.0, st.decode_seconds);
    if (a.check_serial) {
        ser = calloc((size_t)p.n, sizeof *ser);
        ib_gen_stats st1;
        if (!ser) {
            rc = cli_error("out of memory");
            goto out;
        }
        if ((rc = run(m, &a, &p, 1, ser, &st1, NULL))) goto out;
        int bad = 0;
        for (int i = 0; i < p.n; i++)
            if (ser[i].digest != res[i].digest || ser[i].n_tokens != res[i].n_tokens ||
                memcmp(ser[i].tokens, res[i].tokens, (size_t)res[i].n_tokens * sizeof(int32_t))) {
                fprintf(stderr, "isobatch: prompt %d: batched result differs from its serialized run\n", i);
                bad++;
            }
        fprintf(stderr,
                "serialized check: %d of %d prompts bitwise identical to decoding alone (serial %.1f tok/s, batched %.2fx)\n",
                p.n - bad, p.n, st1.seconds > 0 ? st1.generated_tokens / st1.seconds : 0.0,
                st.seconds > 0 ? st1.seconds / st.seconds : 0.0);
        if (bad) rc = 1;
    }
out:
    if (res) ib_gen_results_free(res, p.n);
    if (ser) ib_gen_results_free(ser, p.n);
    free(res);
    free(ser);
    prompts_free(&p);
    ib_model_free(m);
    free(texts);
    free(idlists);
    return rc;
}
