/*
 * recall.c — `isobatch recall`: the multi-tenant needle test. Benchmark cases are built as
 * spec/needle.md says (strings and lists from spec/needle.json, held-out words, seeds
 * benchmark_seed_base + i), then decoded greedily serialized (one session at a time) and batched
 * (continuous batching), each case to its own new-token limit, the same in both modes; recall,
 * throughput and bitwise agreement are reported per mode.
 *
 * The case generator draws from a splitmix64 stream keyed by the seed, in this order: the word, the
 * number, the depth (one of heldout_depth_percent), then one filler sentence per line. spec/needle.md
 * allows each side its own generator; held-out words and seed ranges keep benchmark and training apart.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "diag/diag.h"

struct ib_needle_spec {
    char *header, *filler_line, *needle_line, *question, *answer_prefix, *answer, *code;
    char **fillers;      /* [n_fillers] */
    int n_fillers;
    char **words;        /* [n_words] the words cases draw from: heldout_words, or train_words */
    int n_words;
    char **train_words;  /* [n_train_words] */
    int n_train_words;
    int *depths;         /* [n_depths] heldout_depth_percent */
    int n_depths;
    int *lengths;        /* [n_lengths] heldout_lengths */
    int n_lengths;
    uint64_t seed_base;
};

static void free_strs(char **v, int n) {
    for (int i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

void ib_needle_spec_free(ib_needle_spec *s) {
    if (!s) return;
    free(s->header);
    free(s->filler_line);
    free(s->needle_line);
    free(s->question);
    free(s->answer_prefix);
    free(s->answer);
    free(s->code);
    free_strs(s->fillers, s->n_fillers);
    free_strs(s->words, s->n_words);
    free_strs(s->train_words, s->n_train_words);
    free(s->depths);
    free(s->lengths);
    free(s);
}

uint64_t ib_needle_seed_base(const ib_needle_spec *s) { return s->seed_base; }

void ib_needle_use_train_words(ib_needle_spec *s) {
    char **w = s->words;
    int n = s->n_words;
    s->words = s->train_words;
    s->n_words = s->n_train_words;
    s->train_words = w;
    s->n_train_words = n;
}

int ib_needle_heldout_length(const ib_needle_spec *s, int i) {
    return i >= 0 && i < s->n_lengths ? s->lengths[i] : -1;
}

/* ---------------------------------------------------------------- templates */

/* A template variable: {name} becomes str, or the integer ival (with "{name:0Nd}": zero-padded to N). */
typedef struct tvar {
    const char *name;
    const char *str;   /* NULL for an integer */
    long long ival;
} tvar;

/* Expand tmpl into a new string; NULL (and *bad set to the offending placeholder's offset) when a
 * placeholder is unknown or malformed, or on out of memory (*bad = -1). */
static char *expand(const char *tmpl, const tvar *v, int nv, long *bad) {
    size_t cap = strlen(tmpl) + 64, len = 0;
    char *out = malloc(cap);
    *bad = -1;
    if (!out) return NULL;
    for (const char *c = tmpl; *c;) {
        char piece[512];
        const char *add = piece;
        size_t n;
        if (*c != '{') {
            piece[0] = *c++;
            n = 1;
        } else {
            const char *end = strchr(c, '}');
            size_t nl = end ? (size_t)(end - c - 1) : 0;
            const char *colon = end ? memchr(c + 1, ':', nl) : NULL;
            size_t name_len = colon ? (size_t)(colon - c - 1) : nl;
            const tvar *hit = NULL;
            for (int i = 0; end && i < nv; i++)
                if (strlen(v[i].name) == name_len && strncmp(v[i].name, c + 1, name_len) == 0) hit = &v[i];
            int width = 0;
            if (hit && colon) {
                /* the only format spec used: 0Nd */
                const char *sp = colon + 1;
                if (hit->str || sp[0] != '0' || sp[1] < '1' || sp[1] > '9' || sp[2] != 'd' || sp + 3 != end) hit = NULL;
                else width = sp[1] - '0';
            }
            if (!hit) {
                *bad = (long)(c - tmpl);
                free(out);
                return NULL;
            }
            if (hit->str) add = hit->str, n = strlen(hit->str);
            else n = (size_t)snprintf(piece, sizeof piece, "%0*lld", width, hit->ival);
            c = end + 1;
        }
        if (len + n + 1 > cap) {
            while (len + n + 1 > cap) cap *= 2;
            char *r = realloc(out, cap);
            if (!r) {
                free(out);
                return NULL;
            }
            out = r;
        }
        memcpy(out + len, add, n);
        len += n;
    }
    out[len] = '\0';
    return out;
}

/* ---------------------------------------------------------------- spec/needle.json */

static ib_status get_str(const char *path, json_t *root, const char *field, char **out, ib_error *err) {
    json_t *v = json_object_get(root, field);
    if (!json_is_string(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: missing or not a string", path, field);
    *out = strdup(json_string_value(v));
    return *out ? IB_OK : ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
}

static ib_status get_strs(const char *path, json_t *root, const char *field, char ***out, int *n, ib_error *err) {
    json_t *a = json_object_get(root, field);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > 100000)
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: missing, empty or not an array", path, field);
    int k = (int)json_array_size(a);
    char **v = calloc((size_t)k, sizeof *v);
    if (!v) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < k; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        if (!json_is_string(e) || json_string_length(e) == 0) {
            free_strs(v, k);
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: element %d is not a non-empty string", path, field, i);
        }
        if (!(v[i] = strdup(json_string_value(e)))) {
            free_strs(v, k);
            return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    *out = v;
    *n = k;
    return IB_OK;
}

static ib_status get_ints(const char *path, json_t *root, const char *field, int lo, int hi, int **out, int *n,
                          ib_error *err) {
    json_t *a = json_object_get(root, field);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > 100000)
        return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: missing, empty or not an array", path, field);
    int k = (int)json_array_size(a);
    int *v = malloc((size_t)k * sizeof *v);
    if (!v) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < k; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) > hi) {
            free(v);
            return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: element %d is not an integer in [%d, %d]", path, field, i,
                           lo, hi);
        }
        v[i] = (int)json_integer_value(e);
    }
    *out = v;
    *n = k;
    return IB_OK;
}

/* Check that template `field` expands with exactly the variables v. */
static ib_status check_template(const char *path, const char *field, const char *tmpl, const tvar *v, int nv,
                                ib_error *err) {
    long bad;
    char *s = expand(tmpl, v, nv, &bad);
    if (s) {
        free(s);
        return IB_OK;
    }
    if (bad < 0) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: unknown or malformed placeholder at character %ld of \"%s\"", path,
                   field, bad, tmpl);
}

ib_status ib_needle_spec_load(const char *path, ib_needle_spec **out, ib_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        FILE *f = fopen(path, "r");
        if (!f) return ib_fail(err, IB_ERR_IO, "%s: cannot open", path);
        fclose(f);
        return ib_fail(err, IB_ERR_FORMAT, "%s: line %d: not JSON: %s", path, je.line, je.text);
    }
    ib_needle_spec *s = calloc(1, sizeof *s);
    ib_status rc = IB_OK;
    if (!s) {
        rc = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    json_t *ver = json_object_get(root, "version");
    if (!json_is_object(root) || !json_is_integer(ver) || json_integer_value(ver) != 1) {
        rc = ib_fail(err, IB_ERR_FORMAT, "%s: field version: not 1", path);
        goto done;
    }
    if ((rc = get_str(path, root, "header", &s->header, err)) ||
        (rc = get_str(path, root, "filler_line", &s->filler_line, err)) ||
        (rc = get_str(path, root, "needle_line", &s->needle_line, err)) ||
        (rc = get_str(path, root, "question", &s->question, err)) ||
        (rc = get_str(path, root, "answer_prefix", &s->answer_prefix, err)) ||
        (rc = get_str(path, root, "answer", &s->answer, err)) || (rc = get_str(path, root, "code", &s->code, err)) ||
        (rc = get_strs(path, root, "fillers", &s->fillers, &s->n_fillers, err)) ||
        (rc = get_strs(path, root, "heldout_words", &s->words, &s->n_words, err)) ||
        (rc = get_strs(path, root, "train_words", &s->train_words, &s->n_train_words, err)) ||
        (rc = get_ints(path, root, "heldout_depth_percent", 0, 100, &s->depths, &s->n_depths, err)) ||
        (rc = get_ints(path, root, "heldout_lengths", 1, 1 << 24, &s->lengths, &s->n_lengths, err)))
        goto done;
    json_t *base = json_object_get(root, "benchmark_seed_base");
    if (!json_is_integer(base) || json_integer_value(base) < 0) {
        rc = ib_fail(err, IB_ERR_FORMAT, "%s: field benchmark_seed_base: not a non-negative integer", path);
        goto done;
    }
    s->seed_base = (uint64_t)json_integer_value(base);
    const tvar doc[] = {{"doc", NULL, 1}}, line[] = {{"n", NULL, 1}, {"sentence", "x", 0}}, code[] = {{"code", "x", 0}},
               word[] = {{"word", "x", 0}, {"number", NULL, 1}};
    if ((rc = check_template(path, "header", s->header, doc, 1, err)) ||
        (rc = check_template(path, "filler_line", s->filler_line, line, 2, err)) ||
        (rc = check_template(path, "needle_line", s->needle_line, code, 1, err)) ||
        (rc = check_template(path, "question", s->question, NULL, 0, err)) ||
        (rc = check_template(path, "answer_prefix", s->answer_prefix, NULL, 0, err)) ||
        (rc = check_template(path, "answer", s->answer, code, 1, err)) ||
        (rc = check_template(path, "code", s->code, word, 2, err)))
        goto done;
    if (!strstr(s->answer, "{code}")) {
        rc = ib_fail(err, IB_ERR_FORMAT, "%s: field answer: has no {code}", path);
        goto done;
    }
done:
    json_decref(root);
    if (rc) ib_needle_spec_free(s);
    else *out = s;
    return rc;
}

/* ---------------------------------------------------------------- cases */

static uint64_t mix(uint64_t *st) {
    uint64_t z = (*st += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform index in [0, n). */
static int pick(uint64_t *st, int n) { return (int)((double)(mix(st) >> 11) * 0x1p-53 * n); }

/* A growing text buffer. */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (b->len + n + 1 > nc) nc *= 2;
        char *r = realloc(b->s, nc);
        if (!r) {
            b->oom = 1;
            return;
        }
        b->s = r;
        b->cap = nc;
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

/* Everything a case's documents are made of. */
typedef struct case_parts {
    char *header, *needle, *answer;
    char **lines;        /* [cap] filler lines, drawn in order */
    int n_lines, cap;
    uint64_t rng;
} case_parts;

/* Make sure filler lines 0..n-1 exist (each draws its sentence from the case's stream). */
static int ensure_lines(const ib_needle_spec *sp, case_parts *cp, int n) {
    if (n > cp->cap) {
        int nc = cp->cap ? cp->cap : 64;
        while (nc < n) nc *= 2;
        char **r = realloc(cp->lines, (size_t)nc * sizeof *r);
        if (!r) return -1;
        cp->lines = r;
        cp->cap = nc;
    }
    while (cp->n_lines < n) {
        long bad;
        tvar v[] = {{"n", NULL, cp->n_lines + 1}, {"sentence", sp->fillers[pick(&cp->rng, sp->n_fillers)], 0}};
        char *l = expand(sp->filler_line, v, 2, &bad);
        if (!l) return -1;
        cp->lines[cp->n_lines++] = l;
    }
    return 0;
}

/* The document with n filler lines (needle after round(depth*n/100) of them), into b; with_answer 0
 * stops after the answer prefix (the prompt). */
static void build_doc(const ib_needle_spec *sp, const case_parts *cp, int n, int depth, int with_answer, sbuf *b) {
    int at = (depth * n + 50) / 100;
    b->len = 0;
    sb_add(b, "");
    sb_add(b, cp->header);
    sb_add(b, "\n");
    for (int i = 0; i <= n; i++) {
        if (i == at) {
            sb_add(b, cp->needle);
            sb_add(b, "\n");
        }
        if (i < n) {
            sb_add(b, cp->lines[i]);
            sb_add(b, "\n");
        }
    }
    sb_add(b, sp->question);
    sb_add(b, "\n");
    sb_add(b, sp->answer_prefix);
    if (with_answer) {
        sb_add(b, cp->answer);
        sb_add(b, "\n");
    }
}

/* Tokens of the document with n filler lines; -1 on failure. */
static int doc_tokens(const ib_needle_spec *sp, const ib_model *m, case_parts *cp, int n, int depth, sbuf *b) {
    if (ensure_lines(sp, cp, n)) return -1;
    build_doc(sp, cp, n, depth, 1, b);
    if (b->oom) return -1;
    return ib_tokenize(m, b->s, b->len, NULL, 0);
}

void ib_needle_case_free(ib_needle_case *c) {
    if (!c) return;
    free(c->prompt);
    free(c->answer);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

ib_status ib_needle_case_make(const ib_needle_spec *sp, const ib_model *m, uint64_t seed, int length,
                              ib_needle_case *c, ib_error *err) {
    memset(c, 0, sizeof *c);
    case_parts cp = {0};
    sbuf b = {0};
    ib_status rc = IB_OK;
    long bad;
    cp.rng = seed ^ 0x6e6565646c65ULL; /* "needle" */
    const char *word = sp->words[pick(&cp.rng, sp->n_words)];
    int number = pick(&cp.rng, 10000);
    int depth = sp->depths[pick(&cp.rng, sp->n_depths)];
    tvar wv[] = {{"word", word, 0}, {"number", NULL, number}};
    char *code = expand(sp->code, wv, 2, &bad);
    tvar cv[] = {{"code", code, 0}};
    tvar dv[] = {{"doc", NULL, (long long)(seed % 1000)}};
    cp.header = expand(sp->header, dv, 1, &bad);
    cp.needle = code ? expand(sp->needle_line, cv, 1, &bad) : NULL;
    cp.answer = code ? expand(sp->answer, cv, 1, &bad) : NULL;
    if (!code || !cp.header || !cp.needle || !cp.answer || strlen(code) >= sizeof c->code) {
        rc = ib_fail(err, IB_ERR_NOMEM, "needle: seed %llu: cannot build the case", (unsigned long long)seed);
        goto done;
    }
    /* n: the most filler lines that keep the whole document within `length` tokens */
    int base = doc_tokens(sp, m, &cp, 0, depth, &b);
    if (base < 0) {
        rc = ib_fail(err, IB_ERR_NOMEM, "needle: seed %llu: cannot tokenize the document", (unsigned long long)seed);
        goto done;
    }
    if (base > length) {
        rc = ib_fail(err, IB_ERR_INVALID_ARG, "needle: length %d is below the empty document's %d tokens", length, base);
        goto done;
    }
    sbuf one = {0};
    tvar lv[] = {{"n", NULL, 10}, {"sentence", sp->fillers[0], 0}};
    char *l10 = expand(sp->filler_line, lv, 2, &bad);
    if (l10) {
        sb_add(&one, l10);
        sb_add(&one, "\n");
    }
    int per_line = l10 && !one.oom ? ib_tokenize(m, one.s, one.len, NULL, 0) : 1;
    free(l10);
    free(one.s);
    int n = (length - base) / (per_line > 0 ? per_line : 1), t;
    while ((t = doc_tokens(sp, m, &cp, n + 1, depth, &b)) >= 0 && t <= length) n++;
    while (n > 0 && (t = doc_tokens(sp, m, &cp, n, depth, &b)) >= 0 && t > length) n--;
    int total = doc_tokens(sp, m, &cp, n, depth, &b);
    if (t < 0 || total < 0) {
        rc = ib_fail(err, IB_ERR_NOMEM, "needle: seed %llu: cannot tokenize the document", (unsigned long long)seed);
        goto done;
    }
    build_doc(sp, &cp, n, depth, 0, &b);
    c->prompt = b.oom ? NULL : strdup(b.s);
    c->answer = strdup(cp.answer);
    int k = c->prompt ? ib_tokenize(m, c->prompt, strlen(c->prompt), NULL, 0) : -1;
    c->ids = k > 0 ? malloc((size_t)k * sizeof *c->ids) : NULL;
    if (!c->prompt || !c->answer || !c->ids) {
        rc = ib_fail(err, IB_ERR_NOMEM, "needle: seed %llu: out of memory", (unsigned long long)seed);
        goto done;
    }
    c->n_ids = ib_tokenize(m, c->prompt, strlen(c->prompt), c->ids, k);
    c->seed = seed;
    c->length = length;
    c->depth = depth;
    c->n_lines = n;
    c->needle_at = (depth * n + 50) / 100;
    c->doc_tokens = total;
    strcpy(c->code, code);
done:
    free(code);
    free(cp.header);
    free(cp.needle);
    free(cp.answer);
    for (int i = 0; i < cp.n_lines; i++) free(cp.lines[i]);
    free(cp.lines);
    free(b.s);
    if (rc) ib_needle_case_free(c);
    return rc;
}

/* ---------------------------------------------------------------- the runner */

void ib_recall_result_free(ib_recall_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        if (r->text_serial) free(r->text_serial[i]);
        if (r->text_batched) free(r->text_batched[i]);
    }
    free(r->text_serial);
    free(r->text_batched);
    free(r->max_new);
    free(r->ok_serial);
    free(r->ok_batched);
    free(r->match);
    memset(r, 0, sizeof *r);
}

/* Raw bytes of n tokens as a new NUL-terminated string (NULL on out of memory). */
static char *token_text(const ib_model *m, const int32_t *t, int n) {
    sbuf b = {0};
    sb_add(&b, "");
    for (int i = 0; i < n; i++) {
        char buf[512];
        int k = ib_token_bytes(m, t[i], buf, (int)sizeof buf - 1);
        if (k < 0) k = 0;
        buf[k] = '\0';
        /* token bytes may hold a NUL: keep the text printable up to it */
        sb_add(&b, buf);
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

static int recalled(const ib_needle_case *c, const char *text);

/* Progress of one mode: each case's tokens so far, to tell whether a finished case recalled. */
typedef struct progress {
    const ib_model *m;
    const ib_needle_case *cases;
    const ib_recall_opts *o;
    const char *mode;
    int n, done, ok;
    int32_t **tok;   /* [n][limit[i]] */
    int *n_tok;      /* [n] */
} progress;

/* ib_gen_opts.on_token: record the token; when its case ends, check it and report. */
static void progress_token(void *ctx, int req, int32_t t, int done) {
    progress *p = ctx;
    if (p->tok[req]) p->tok[req][p->n_tok[req]++] = t;
    if (!done) return;
    char *text = p->tok[req] ? token_text(p->m, p->tok[req], p->n_tok[req]) : NULL;
    p->done++;
    p->ok += text && recalled(&p->cases[req], text);
    free(text);
    p->o->progress(p->o->progress_ctx, p->mode, p->done, p->n, p->ok);
}

/* One mode: every case through ib_generate (greedy, stop at eos) with `batch` sessions per step, case i
 * generating at most limit[i] tokens; progress reported when o->progress is set. */
static ib_status run_mode(const ib_model *m, const ib_needle_case *cases, int n, const ib_recall_opts *o, int batch,
                          const int *limit, ib_gen_result *res, ib_gen_stats *st, ib_error *err) {
    ib_engine_opts eo = {.threads = o->threads, .isa = o->isa, .act = o->act, .backend = o->backend,
                         .max_step_tokens = o->max_step_tokens};
    if (eo.max_step_tokens <= 0) {
        /* default: room to prefill `batch` whole prompts in one step, so decode steps carry one token
         * per session (the shape of a batched-decode bug), within 512 .. 16384 rows of scratch */
        long most = 0;
        for (int i = 0; i < n; i++)
            if (cases[i].n_ids > most) most = cases[i].n_ids;
        long want = (long)batch * (most + 1);
        eo.max_step_tokens = (int)(want < 512 ? 512 : want > 16384 ? 16384 : want);
    }
    if (eo.max_step_tokens < batch) eo.max_step_tokens = batch;
    ib_engine *e;
    ib_status rc = ib_engine_create(m, &eo, &e, err);
    if (rc) return rc;
    ib_gen_request *rq = malloc((size_t)n * sizeof *rq);
    if (!rq) {
        ib_engine_free(e);
        return ib_fail(err, IB_ERR_NOMEM, "recall: out of memory");
    }
    for (int i = 0; i < n; i++) rq[i] = (ib_gen_request){.prompt = cases[i].ids, .n_prompt = cases[i].n_ids, .max_new_tokens = limit[i]};
    ib_gen_opts go = {.max_new_tokens = 1, .batch = batch, .sampling = ib_sampling_default()};
    progress pg = {m, cases, o, batch == 1 ? "serialized" : "batched", n, 0, 0, NULL, NULL};
    if (o->progress) {
        pg.tok = calloc((size_t)n, sizeof *pg.tok);
        pg.n_tok = calloc((size_t)n, sizeof *pg.n_tok);
        for (int i = 0; pg.tok && i < n; i++) pg.tok[i] = malloc(((size_t)limit[i] + 1) * sizeof(int32_t));
        if (pg.tok && pg.n_tok) {
            go.on_token = progress_token;
            go.on_token_ctx = &pg;
        }
    }
    rc = ib_generate(e, rq, n, &go, res, st, err);
    for (int i = 0; pg.tok && i < n; i++) free(pg.tok[i]);
    free(pg.tok);
    free(pg.n_tok);
    free(rq);
    ib_engine_free(e);
    return rc;
}

/* 1 when text starts with the answer up to the end of its code (" WORD-NNNN"). */
static int recalled(const ib_needle_case *c, const char *text) {
    const char *at = strstr(c->answer, c->code);
    size_t n = at ? (size_t)(at - c->answer) + strlen(c->code) : strlen(c->answer);
    return text && strncmp(text, c->answer, n) == 0;
}

ib_status ib_recall_run(const ib_model *m, const ib_needle_case *cases, int n, const ib_recall_opts *o,
                        ib_recall_result *r, ib_error *err) {
    memset(r, 0, sizeof *r);
    if (n < 1 || o->batch < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "recall: needs at least one case and batch >= 1");
    /* the answer budget: the longest expected answer's tokens + 1 (room for what follows it) */
    int budget = 2, ctx = ib_model_get_info(m)->max_context;
    for (int i = 0; i < n; i++) {
        int k = ib_tokenize(m, cases[i].answer, strlen(cases[i].answer), NULL, 0);
        if (k + 1 > budget) budget = k + 1;
        if (cases[i].n_ids > ctx)
            return ib_fail(err, IB_ERR_CONTEXT, "recall: case %d: a prompt of %d tokens exceeds the context of %d tokens",
                           i, cases[i].n_ids, ctx);
    }
    ib_gen_result *rs = calloc((size_t)n, sizeof *rs), *rb = calloc((size_t)n, sizeof *rb);
    ib_gen_stats ss = {0}, sb = {0};
    ib_status rc = IB_OK;
    r->n = n;
    r->max_new = calloc((size_t)n, sizeof(int));
    r->ok_serial = calloc((size_t)n, sizeof(int));
    r->ok_batched = calloc((size_t)n, sizeof(int));
    r->match = calloc((size_t)n, sizeof(int));
    r->text_serial = calloc((size_t)n, sizeof(char *));
    r->text_batched = calloc((size_t)n, sizeof(char *));
    if (!rs || !rb || !r->max_new || !r->ok_serial || !r->ok_batched || !r->match || !r->text_serial ||
        !r->text_batched) {
        rc = ib_fail(err, IB_ERR_NOMEM, "recall: out of memory");
        goto done;
    }
    /* each case's limit: the budget, or what its own prompt leaves in the context (the last generated
     * token is not fed, so a prompt of P tokens leaves room for ctx - P + 1); one list for both modes */
    for (int i = 0; i < n; i++) r->max_new[i] = ctx - cases[i].n_ids + 1 < budget ? ctx - cases[i].n_ids + 1 : budget;
    if ((rc = run_mode(m, cases, n, o, 1, r->max_new, rs, &ss, err))) goto done;
    if ((rc = run_mode(m, cases, n, o, o->batch, r->max_new, rb, &sb, err))) {
        ib_gen_results_free(rs, n);
        goto done;
    }
    r->serial = (ib_recall_mode){0, ss.seconds, ss.prompt_tokens, ss.generated_tokens};
    r->batched = (ib_recall_mode){0, sb.seconds, sb.prompt_tokens, sb.generated_tokens};
    r->all_match = 1;
    for (int i = 0; i < n; i++) {
        r->text_serial[i] = token_text(m, rs[i].tokens, rs[i].n_tokens);
        r->text_batched[i] = token_text(m, rb[i].tokens, rb[i].n_tokens);
        if (!r->text_serial[i] || !r->text_batched[i]) rc = ib_fail(err, IB_ERR_NOMEM, "recall: out of memory");
        r->ok_serial[i] = recalled(&cases[i], r->text_serial[i]);
        r->ok_batched[i] = recalled(&cases[i], r->text_batched[i]);
        r->serial.recalled += r->ok_serial[i];
        r->batched.recalled += r->ok_batched[i];
        r->match[i] = rs[i].digest == rb[i].digest && rs[i].n_tokens == rb[i].n_tokens &&
                      memcmp(rs[i].tokens, rb[i].tokens, (size_t)rs[i].n_tokens * sizeof(int32_t)) == 0;
        if (!r->match[i]) r->all_match = 0;
    }
    ib_gen_results_free(rs, n);
    ib_gen_results_free(rb, n);
done:
    free(rs);
    free(rb);
    if (rc) ib_recall_result_free(r);
    return rc;
}
