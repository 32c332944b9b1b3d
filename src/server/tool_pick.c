/*
 * tool_pick.c — tool_choice "required" by constrained decoding. The prompt ends with a call's opening
 * up to its name, "<tool_call>\n{\"name\": \"", and the reply is read byte by byte as
 *
 *   NAME", "arguments": ARGS                     NAME one of the tools' names, ARGS a JSON object
 *                                                the function's arguments format allows
 *   [}\n</tool_call>                             (parallel only) the call closed, and then either the
 *    [\n<tool_call>\n{"name": "NAME", "arguments": ARGS ...]]   end or the next call, and so on
 *
 * with the stop ids allowed right after an ARGS and after a close. The names with their
 * '", "arguments": ' are kept sorted by bytes, so the names the reply can still be spelling are one
 * range [lo, hi) of them, narrowed by each byte; a function's ARGS are read by json_constraint.c's
 * reader (json_schema.c's for a parameters schema), one per function compiled at set-up. Every rule
 * depends only on the reply so far, the tools and the vocabulary, so a "required" request is decoded
 * the same alone and batched (the batch contract).
 *
 * Masking: while ARGS are open the function's own mask (the schema walk) serves — with parallel calls
 * plus the tokens that end the ARGS and go on into the close, which all hold "}}" (ARGS end with '}',
 * the close begins with one): those few are stepped through a copy of the reader. Elsewhere — spelling
 * a name, after ARGS with parallel calls, in a close — the vocabulary is walked in byte order
 * (ib_json_vocab.ord/lcp, as json_schema.c's walk): the reader's states by byte depth are kept, so a
 * byte prefix the tokens share is stepped once and every token under a refused prefix is skipped (a
 * name's bytes are a binary search in the range; a token that gets into ARGS steps a copy of that
 * function's reader, one per depth). The mask allows exactly the tokens whose bytes the reader takes —
 * the same bits as stepping each token on its own (ib_tool_pick_mask_stepped, kept as the reference
 * and as the fallback; tests/test_tool_pick.c compares the two).
 *
 * Memory: the schema readers the reply and the mask step (the reply's ARGS reader, the mask's scratch
 * copy) are made at set-up and copied into in place (ib_schema_run_copy), so a decode step allocates
 * nothing here (the vocabulary's "}}" tokens and the walk's states by depth are made once, at the
 * first mask: a schema reader for each byte of the vocabulary's longest token, about 290 KB for
 * Qwen3's 128 bytes).
 */
#include "server/api.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A tool form's fixed texts and rules: what follows a NAME up to its ARGS (a name never holds its
 * first byte, so no name's text is a prefix of another's); after ARGS the close (the reply may end
 * after it) and the next call's opening up to its name (tail_len bytes, the close tail_close of
 * them); whether the close may follow ARGS without parallel calls; whether ARGS are Gemma 4's value
 * syntax (read through gemma4_args.c; their '{' ends the name's text and is fed before them). */
typedef struct pick_form {
    const char *name_end, *tail;
    int tail_len, tail_close, close_alone, gemma_args;
} pick_form;
static const char qwen_tail[] = "}\n</tool_call>\n<tool_call>\n{\"name\": \"", gemma4_tail[] = "<tool_call|><|tool_call>call:";
static const pick_form qwen_form = {"\", \"arguments\": ", qwen_tail, sizeof qwen_tail - 1, 14, 0, 0};
static const pick_form gemma4_form = {"{", gemma4_tail, sizeof gemma4_tail - 1, 12, 1, 1};

enum { AT_NAME, AT_ARGS, AT_TAIL, AT_DEAD };

/* Where the reader stands: AT_NAME, the names [lo, hi) match the pos bytes read of this call's
 * NAME and name_end; AT_ARGS, function lo's arguments (in the reader's args; Gemma 4's form: their
 * bytes read into it through g), and once they are whole ws whitespace bytes after them (at most 16,
 * as the JSON readers take; none in Gemma 4's form); AT_TAIL, pos bytes of the tail read; AT_DEAD, a
 * byte refused (or memory ran out): only the end is left. */
typedef struct pick_at {
    int phase, lo, hi, pos, ws;
    ib_g4args g;
} pick_at;

/* One depth of the walk: the position and the ARGS reader (as pk->at and pk->args). */
typedef struct pick_frame {
    pick_at a;
    ib_json_state args;
} pick_frame;

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

typedef struct pick_fn {
    char *lit;           /* NAME and the form's name_end */
    int len;
    ib_json_state start; /* its arguments' reader at the empty text, or after the '{' in Gemma 4's form
                          * (run: the compiled schema, owned) */
} pick_fn;

struct ib_tool_pick {
    const pick_form *form;
    pick_fn *fn;         /* [n] sorted by lit's bytes */
    int n, parallel;
    pick_at at;          /* the reply so far */
    ib_json_state args;  /* AT_ARGS: fn[at.lo]'s reader over this call's ARGS (run: reply_run) */
    ib_schema_run *reply_run, *scratch;   /* the reply's ARGS schema reader; the mask's copy (borrowed
                                           * schemas; NULL when no function has a schema) */
    ib_schema_run *probe;                 /* Gemma 4's form: where a held-back '<' is tried */
    int32_t *cc;         /* parallel: the vocabulary's tokens holding "}}" (built at the first mask) */
    float *cc_logit;     /* [n_cc] their logits kept across the ARGS' own mask */
    int n_cc, cc_built;
    /* the byte-sorted walk (walk_build, at the first mask outside ARGS): w[d] the reader after the d
     * first bytes of the token walked, for d < w_len (the vocabulary's longest token + 1); w_run[d], d >= 1,
     * the schema reader w[d].args reads when it is in a schema's ARGS (clones; w_run NULL when no function
     * has a schema); w_failed: out of memory once, each token is stepped on its own from then on */
    pick_frame *w;
    ib_schema_run **w_run;
    int w_len, w_failed;
};

static int fn_cmp(const void *a, const void *b) { return strcmp(((const pick_fn *)a)->lit, ((const pick_fn *)b)->lit); }

void ib_tool_pick_free(ib_tool_pick *pk) {
    if (!pk) return;
    ib_schema_run_free(pk->reply_run);   /* they borrow the functions' schemas: first */
    ib_schema_run_free(pk->scratch);
    ib_schema_run_free(pk->probe);
    for (int d = 0; pk->w_run && d < pk->w_len; d++) ib_schema_run_free(pk->w_run[d]);
    free(pk->w_run);
    free(pk->w);
    for (int i = 0; i < pk->n; i++) {
        free(pk->fn[i].lit);
        ib_json_release(&pk->fn[i].start);
    }
    free(pk->fn);
    free(pk->cc);
    free(pk->cc_logit);
    free(pk);
}

int ib_tool_pick_setup(ib_json_state *s, ib_chat_tool_form form, json_t *tools, int parallel, const char *name_read) {
    ib_json_init(s);
    ib_tool_pick *pk = calloc(1, sizeof *pk);
    size_t nt = json_array_size(tools);
    if (!pk || !nt || !(pk->fn = calloc(nt, sizeof *pk->fn))) goto oom;
    pk->form = form == IB_CHAT_TOOLS_GEMMA4 ? &gemma4_form : &qwen_form;
    pk->parallel = parallel;
    const size_t el = strlen(pk->form->name_end);
    for (size_t i = 0; i < nt; i++) {
        json_t *f = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        pick_fn *e = &pk->fn[pk->n++];   /* (counted first: ib_tool_pick_free frees what it holds) */
        ib_json_init(&e->start);
        size_t nl = name ? strlen(name) : 0;
        if (!name || !(e->lit = malloc(nl + el + 1))) goto oom;
        memcpy(e->lit, name, nl);
        memcpy(e->lit + nl, pk->form->name_end, el + 1);
        e->len = (int)(nl + el);
        json_t *rf = ib_api_tool_arguments_format(f);
        int rc = rf ? ib_json_setup(&e->start, rf) : -1;
        json_decref(rf);
        if (rc != 1) goto oom;
        if (pk->form->gemma_args && ib_json_step(&e->start, '{')) goto oom;   /* (never: ib_api_tools refuses parameters that are no object) */
    }
    qsort(pk->fn, (size_t)pk->n, sizeof *pk->fn, fn_cmp);
    for (int i = 0; i < pk->n && !pk->reply_run; i++)
        if (pk->fn[i].start.run && (!(pk->reply_run = ib_schema_run_clone(pk->fn[i].start.run)) ||
                                    !(pk->scratch = ib_schema_run_clone(pk->fn[i].start.run)) ||
                                    (pk->form->gemma_args && !(pk->probe = ib_schema_run_clone(pk->fn[i].start.run)))))
            goto oom;
    pk->at = (pick_at){.phase = AT_NAME, .lo = 0, .hi = pk->n};
    s->pick = pk;
    for (const char *p = name_read; p && *p; p++)   /* a name the prompt already holds */
        if (ib_tool_pick_step(pk, (unsigned char)*p)) goto oom;
    return 1;
oom:
    ib_tool_pick_free(pk);
    s->pick = NULL;
    return -1;
}

/* Whether the ARGS read at a (a->phase AT_ARGS), args, are whole. */
static int args_whole(const ib_tool_pick *pk, const pick_at *a, const ib_json_state *args) {
    return pk->form->gemma_args ? ib_g4args_done(&a->g, args) : ib_json_done(args);
}

/* Step the position a by byte c, with args the reader of the ARGS being read. Entering ARGS sets args
 * to the function's reader at the empty text, its schema reader (if any) copied into run (reply_run or
 * scratch); leaving them leaves args as it is. 0 when c is accepted; -1 when not (a is then
 * undefined). */
static int feed(const ib_tool_pick *pk, pick_at *a, ib_json_state *args, ib_schema_run *run, unsigned char c) {
    const char *tail = pk->form->tail;
    switch (a->phase) {
    case AT_NAME: {
        /* the names in [lo, hi) share their first pos bytes, none ends there: their byte at pos grows */
        int lo = a->lo, hi = a->hi, l = lo, h = hi;
        while (l < h) { /* the first with a byte >= c */
            int m = l + (h - l) / 2;
            if ((unsigned char)pk->fn[m].lit[a->pos] < c) l = m + 1;
            else h = m;
        }
        lo = l, h = hi;
        while (l < h) { /* the first with a byte > c */
            int m = l + (h - l) / 2;
            if ((unsigned char)pk->fn[m].lit[a->pos] <= c) l = m + 1;
            else h = m;
        }
        if (lo == l) return -1;
        a->lo = lo, a->hi = l, a->pos++;
        if (a->pos < pk->fn[lo].len) return 0;
        /* NAME and name_end whole (no other name has it as a prefix: names never hold name_end[0]) */
        *args = pk->fn[lo].start;
        if (args->run) {
            ib_schema_run_copy(run, pk->fn[lo].start.run);
            args->run = run;
        }
        a->phase = AT_ARGS, a->ws = 0;
        ib_g4args_init(&a->g);
        return 0;
    }
    case AT_ARGS:
        if (!args_whole(pk, a, args)) {
            a->ws = 0;
            return pk->form->gemma_args ? ib_g4args_step(&a->g, args, pk->probe, c) : ib_json_step(args, c);
        }
        if (!pk->form->gemma_args && is_ws(c)) return ++a->ws > 16 ? -1 : 0;   /* (not fed: the reader stays as it is) */
        if ((!pk->parallel && !pk->form->close_alone) || c != (unsigned char)tail[0]) return -1;
        a->phase = AT_TAIL, a->pos = 1;
        return 0;
    case AT_TAIL:
        if ((!pk->parallel && a->pos == pk->form->tail_close) || c != (unsigned char)tail[a->pos]) return -1;
        if (++a->pos == pk->form->tail_len) *a = (pick_at){.phase = AT_NAME, .lo = 0, .hi = pk->n};
        return 0;
    default:
        return -1;
    }
}

/* Whether the reply may end at a (its ARGS, args, whole; or the close read). */
static int at_done(const ib_tool_pick *pk, const pick_at *a, const ib_json_state *args) {
    return a->phase == AT_DEAD || (a->phase == AT_ARGS && args_whole(pk, a, args)) ||
           (a->phase == AT_TAIL && a->pos == pk->form->tail_close);
}

int ib_tool_pick_step(ib_tool_pick *pk, unsigned char c) {
    if (!feed(pk, &pk->at, &pk->args, pk->reply_run, c)) return 0;
    ib_json_init(&pk->args);
    pk->at = (pick_at){.phase = AT_DEAD};
    return -1;
}

int ib_tool_pick_done(const ib_tool_pick *pk) { return at_done(pk, &pk->at, &pk->args); }

/* Whether token t's bytes all step a copy of the reader. copy: the reply's ARGS reader is stepped
 * through pk->scratch (inside ARGS); else it is only read (whole ARGS: the token can only leave them),
 * and a token that gets into new ARGS steps them in pk->scratch. */
static int token_ok(const ib_tool_pick *pk, const ib_json_vocab *v, int32_t t, int copy) {
    pick_at a = pk->at;
    ib_json_state args = pk->args;
    if (copy && args.run) {
        ib_schema_run_copy(pk->scratch, args.run);
        args.run = pk->scratch;
    }
    int ok = v->off[t + 1] > v->off[t];
    for (size_t k = v->off[t]; ok && k < v->off[t + 1]; k++) ok = !feed(pk, &a, &args, pk->scratch, (unsigned char)v->bytes[k]);
    return ok;
}

/* The tokens of v holding "}}" into pk->cc (once); -1 when out of memory. */
static int cc_build(ib_tool_pick *pk, const ib_json_vocab *v) {
    if (pk->cc_built) return 0;
    for (int pass = 0; pass < 2; pass++) {
        pk->n_cc = 0;
        for (int t = 0; t < v->n; t++) {
            const char *b = v->bytes + v->off[t];
            size_t len = v->off[t + 1] - v->off[t];
            if (len >= 2 && memmem(b, len, "}}", 2)) {
                if (pass) pk->cc[pk->n_cc] = t;
                pk->n_cc++;
            }
        }
        if (!pass && (!(pk->cc = malloc(((size_t)pk->n_cc + 1) * sizeof *pk->cc)) ||
                      !(pk->cc_logit = malloc(((size_t)pk->n_cc + 1) * sizeof *pk->cc_logit))))
            return -1;
    }
    pk->cc_built = 1;
    return 0;
}

/* Inside ARGS with parallel calls: the ARGS' own mask, and the tokens holding "}}" that end them and
 * go on into the close put back. */
static int args_mask(ib_tool_pick *pk, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop, int n_stop) {
    if (cc_build(pk, v)) return ib_json_mask(&pk->args, v, logits, vocab, stop, n_stop);   /* (fewer tokens) */
    const int n = v->n < vocab ? v->n : vocab;
    for (int i = 0; i < pk->n_cc; i++)
        if (pk->cc[i] < n) pk->cc_logit[i] = logits[pk->cc[i]];
    int allowed = ib_json_mask(&pk->args, v, logits, vocab, stop, n_stop);
    for (int i = 0; i < pk->n_cc; i++) {
        int32_t t = pk->cc[i];
        if (t >= n || !isinf(logits[t]) || isinf(pk->cc_logit[i])) continue;
        int is_stop = 0;
        for (int k = 0; k < n_stop; k++) is_stop |= stop[k] == t;
        if (is_stop) continue;
        if (token_ok(pk, v, t, 1)) {
            logits[t] = pk->cc_logit[i];
            allowed++;
        }
    }
    return allowed;
}

/* Outside ARGS (or after whole ARGS with parallel calls; in Gemma 4's form inside them too; done:
 * whether the reply may end here): each token of v stepped on its own through a copy of the reader,
 * in id order. The reference the walk (walk_mask) must match bit for bit, and its fallback. */
static int stepped_mask(ib_tool_pick *pk, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop, int n_stop,
                        int done) {
    const int in_args = pk->at.phase == AT_ARGS, args_end = in_args && args_whole(pk, &pk->at, &pk->args);
    const int n = v->n < vocab ? v->n : vocab;
    int allowed = 0;
    for (int t = n; t < vocab; t++) logits[t] = -INFINITY;
    for (int t = 0; t < n; t++) {
        int is_stop = 0;
        for (int k = 0; k < n_stop; k++) is_stop |= stop[k] == t;
        /* a copy stepped; its ARGS reader, when whole, only read */
        int ok = is_stop ? done
                         : pk->at.phase != AT_DEAD && !(args_end && v->off[t + 1] > v->off[t] && is_ws((unsigned char)v->bytes[v->off[t]])) &&
                               token_ok(pk, v, t, in_args && !args_end);
        if (!ok) logits[t] = -INFINITY;
        allowed += !isinf(logits[t]);
    }
    return allowed;
}

/* The walk's states by depth for v (pk->w, pk->w_run: v->maxlen + 1 of each), made once; kept when
 * they are deep enough already. 0 when they are there, -1 when out of memory (then pk->w_failed, and
 * the mask steps each token on its own from then on: the same bits, slower). */
static int walk_build(ib_tool_pick *pk, const ib_json_vocab *v) {
    if (pk->w_failed) return -1;
    if (pk->w && pk->w_len >= v->maxlen + 1) return 0;
    for (int d = 0; pk->w_run && d < pk->w_len; d++) ib_schema_run_free(pk->w_run[d]);
    free(pk->w_run);
    free(pk->w);
    pk->w_run = NULL;
    pk->w_len = v->maxlen + 1;
    if (!(pk->w = malloc((size_t)pk->w_len * sizeof *pk->w))) goto oom;
    if (pk->reply_run) {   /* some function has a schema: a reader to copy into at each depth */
        if (!(pk->w_run = calloc((size_t)pk->w_len, sizeof *pk->w_run))) goto oom;
        for (int d = 1; d < pk->w_len; d++)   /* (w[0] reads pk->reply_run) */
            if (!(pk->w_run[d] = ib_schema_run_clone(pk->reply_run))) goto oom;
    }
    return 0;
oom:
    for (int d = 0; pk->w_run && d < pk->w_len; d++) ib_schema_run_free(pk->w_run[d]);
    free(pk->w_run);
    free(pk->w);
    pk->w_run = NULL;
    pk->w = NULL;
    pk->w_len = 0;
    pk->w_failed = 1;
    return -1;
}

/* w[d + 1] = w[d] advanced by byte c: its ARGS reader, when it reads a schema's ARGS, copied into
 * w_run[d + 1] first (so w[d] stays as it is for the tokens after), and new ARGS entered there too. 0
 * when c is accepted, -1 when not (w[d + 1] then undefined). */
static int walk_step(ib_tool_pick *pk, int d, unsigned char c) {
    pick_frame *f = &pk->w[d + 1];
    ib_schema_run *run = pk->w_run ? pk->w_run[d + 1] : NULL;
    *f = pk->w[d];
    if (f->a.phase == AT_ARGS && f->args.run) {
        ib_schema_run_copy(run, f->args.run);
        f->args.run = run;
    }
    return feed(pk, &f->a, &f->args, run, c);
}

/* stepped_mask's verdicts (same bits, same count) with the tokens of v taken in byte order (v->ord,
 * v->lcp): a byte prefix is stepped once from the state at the depth before it (pk->w), and the
 * tokens that share a prefix the reader refused get -inf unstepped. Inside a text of Gemma 4's ARGS
 * where every plain token without a '<' leaves the reader as it is (ib_g4args_plain), only the other
 * tokens (v->lt_ord, v->lt_lcp) are walked. Needs walk_build done and n_stop <= 64. At whole ARGS
 * with parallel calls (args_end) a token beginning with whitespace is refused, as in stepped_mask.
 * Cost: one step per distinct byte prefix the reader accepts (plus one refused step under each), and
 * one pass over the vocabulary. */
static int walk_mask(ib_tool_pick *pk, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop, int n_stop,
                     int done) {
    const int in_args = pk->at.phase == AT_ARGS, args_end = in_args && args_whole(pk, &pk->at, &pk->args);
    const int fast = pk->form->gemma_args && in_args && !args_end && ib_g4args_plain(&pk->at.g, &pk->args);
    const int32_t *ord = fast ? v->lt_ord : v->ord, *lcp = fast ? v->lt_lcp : v->lcp;
    const int N = fast ? v->n_lt : v->n;
    const int n = v->n < vocab ? v->n : vocab;
    float saved[64];   /* the stop ids' logits: the walk may set -inf on them, the stop rule decides */
    for (int k = 0; k < n_stop; k++)
        if (stop[k] >= 0 && stop[k] < n) saved[k] = logits[stop[k]];
    for (int t = n; t < vocab; t++) logits[t] = -INFINITY;
    if (pk->at.phase == AT_DEAD) {   /* every byte refused */
        for (int t = 0; t < n; t++) logits[t] = -INFINITY;
    } else {
        /* w[0] is the reply's own position; its schema reader (pk->reply_run) is only read: walk_step
         * copies before it steps */
        pk->w[0] = (pick_frame){pk->at, pk->args};
        int valid = 0, fail_at = INT_MAX;   /* w[0..valid] hold the last token walked's prefixes */
        for (int k = 0; k < N; k++) {     /* (tokens past the row, t >= n: walked, not written) */
            int32_t t = ord[k];
            const unsigned char *b = (const unsigned char *)v->bytes + v->off[t];
            int L = (int)(v->off[t + 1] - v->off[t]), l = lcp[k];
            if (fail_at < l) {   /* shares the prefix an earlier token was refused on */
                if (t < n) logits[t] = -INFINITY;
                continue;
            }
            fail_at = INT_MAX;
            int d = l < valid ? l : valid, ok = L > 0;
            for (; d < L; d++)
                if ((d == 0 && args_end && is_ws(b[0])) || walk_step(pk, d, b[d])) {
                    fail_at = d;
                    ok = 0;
                    break;
                }
            valid = d;
            if (t < n && !ok) logits[t] = -INFINITY;
        }
    }
    /* the stop ids: allowed (their own logits) exactly where the reply may end */
    for (int k = 0; k < n_stop; k++) {
        int32_t s = stop[k];
        if (s >= 0 && s < n) logits[s] = done ? saved[k] : -INFINITY;
    }
    int allowed = 0;   /* (stepped_mask's count: the row's logits not -inf) */
    for (int t = 0; t < n; t++) allowed += !isinf(logits[t]);
    return allowed;
}

/* ib_tool_pick_mask, with walk: 1 the byte-sorted walk outside ARGS (falling back to stepped_mask when
 * it cannot serve), 0 stepped_mask. */
static int pick_mask(ib_tool_pick *pk, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop, int n_stop,
                     int walk) {
    const int done = ib_tool_pick_done(pk);
    if (pk->form->gemma_args) {   /* ARGS in Gemma 4's syntax: no JSON mask reads them; the walk everywhere */
        if (walk && n_stop <= 64 && !walk_build(pk, v)) return walk_mask(pk, v, logits, vocab, stop, n_stop, done);
        return stepped_mask(pk, v, logits, vocab, stop, n_stop, done);
    }
    if (pk->at.phase == AT_ARGS && !done)   /* inside ARGS */
        return pk->parallel ? args_mask(pk, v, logits, vocab, stop, n_stop) : ib_json_mask(&pk->args, v, logits, vocab, stop, n_stop);
    /* their end: as for a json_schema reply, no whitespace once they are whole (the reply ends, or, with
     * parallel calls, goes on into the close): only the stop ids, or those and the close */
    if (pk->at.phase == AT_ARGS && !pk->parallel) return ib_json_mask(&pk->args, v, logits, vocab, stop, n_stop);
    if (walk && n_stop <= 64 && !walk_build(pk, v)) return walk_mask(pk, v, logits, vocab, stop, n_stop, done);
    return stepped_mask(pk, v, logits, vocab, stop, n_stop, done);
}

int ib_tool_pick_mask(ib_tool_pick *pk, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop, int n_stop) {
    return pick_mask(pk, v, logits, vocab, stop, n_stop, 1);
}

int ib_tool_pick_mask_stepped(ib_tool_pick *pk, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop,
                              int n_stop) {
    return pick_mask(pk, v, logits, vocab, stop, n_stop, 0);
}
