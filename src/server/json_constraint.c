/*
 * json_constraint.c — response_format {"type": "json_object"} by constrained decoding: before each
 * draw, every token whose bytes cannot continue the text generated so far towards one JSON object is
 * masked (its logit set to -inf for the draw only), and once the object is complete only the
 * request's stop tokens remain. The mask is a function of the request's own generated text and the
 * vocabulary alone, so a constrained request is decoded the same alone or batched (the batch
 * contract), like its logit_bias.
 *
 * The grammar is RFC 8259 JSON with an object at the top: strings with escapes (\uXXXX included) and
 * UTF-8 checked by lead byte, numbers (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), true/false/null,
 * nesting up to 64 deep, at most 16 whitespace bytes in a row (so a model cannot pad forever).
 *
 * response_format {"type": "json_schema"} goes through the same entry points (ib_json_setup, _step,
 * _mask) to the schema reader of json_schema.c, and a tool_choice "required" reply to tool_pick.c's
 * reader; the vocabulary table built here also serves their walks.
 */
#include "server/api.h"

#include "core/error.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
    J_START,        /* nothing yet: whitespace or '{' */
    J_VALUE,        /* a value (after ':' or ',' in an array) */
    J_ARR_FIRST,    /* after '[': a value or ']' */
    J_OBJ_FIRST,    /* after '{': a key or '}' */
    J_OBJ_KEY,      /* after ',' in an object: a key */
    J_COLON,        /* after a key */
    J_AFTER,        /* after a value: ',' or the closing bracket */
    J_STRING,       /* inside a string */
    J_ESC,          /* after a backslash */
    J_HEX,          /* inside \uXXXX (sub = hex digits left) */
    J_NUM,          /* inside a number (sub = its state) */
    J_LIT,          /* inside true/false/null (sub = next index, lit = which) */
    J_DONE          /* the object is complete */
};

/* number states */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const lits[3] = {"true", "false", "null"};

void ib_json_init(ib_json_state *s) { memset(s, 0, sizeof *s); }

int ib_json_done(const ib_json_state *s) {
    if (s->pick) return ib_tool_pick_done(s->pick);
    return s->run ? ib_schema_run_done(s->run) : s->mode == J_DONE;
}

int ib_json_plain_string(const ib_json_state *s) {
    if (s->pick) return 0;
    return s->run ? ib_schema_run_plain(s->run) : s->mode == J_STRING && !s->utf8_left;
}

/* The "json_schema" member of a json_schema response_format, checked: {"name": 1-64 of
 * [A-Za-z0-9_-], "schema": {...}, "description"?: string, "strict"?: boolean or null}. */
static json_t *schema_member(json_t *rf, char *msg, size_t msz) {
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js)) {
        snprintf(msg, msz, "response_format.json_schema must be an object with a name and a schema");
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(js, k, v) {
        if (strcmp(k, "name") && strcmp(k, "schema") && strcmp(k, "description") && strcmp(k, "strict")) {
            /* k is the client's: the refusal is made one printable line */
            ib_one_linef(msg, msz, "response_format.json_schema.%s is not a field of json_schema", k);
            return NULL;
        }
    }
    json_t *name = json_object_get(js, "name"), *st = json_object_get(js, "strict"),
           *d = json_object_get(js, "description"), *sc = json_object_get(js, "schema");
    const char *n = json_is_string(name) ? json_string_value(name) : "";
    size_t nl = strlen(n);
    int ok = nl >= 1 && nl <= 64;
    for (size_t i = 0; i < nl; i++)
        ok &= (n[i] >= 'a' && n[i] <= 'z') || (n[i] >= 'A' && n[i] <= 'Z') || (n[i] >= '0' && n[i] <= '9') ||
              n[i] == '_' || n[i] == '-';
    if (!ok) {
        snprintf(msg, msz, "response_format.json_schema.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
        return NULL;
    }
    if (st && !json_is_boolean(st) && !json_is_null(st)) {
        snprintf(msg, msz, "response_format.json_schema.strict must be a boolean");
        return NULL;
    }
    if (d && !json_is_string(d)) {
        snprintf(msg, msz, "response_format.json_schema.description must be a string");
        return NULL;
    }
    if (!json_is_object(sc)) {
        snprintf(msg, msz, "response_format.json_schema.schema must be an object (a JSON Schema)");
        return NULL;
    }
    return sc;
}

int ib_json_format_check(json_t *rf, char *msg, size_t msz) {
    if (!rf || json_is_null(rf)) return 0;
    json_t *t = json_object_get(rf, "type");
    const char *ty = json_is_string(t) ? json_string_value(t) : "";
    if (!json_is_object(rf) || (strcmp(ty, "text") && strcmp(ty, "json_object") && strcmp(ty, "json_schema"))) {
        snprintf(msg, msz, "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                           "{\"type\": \"json_schema\", \"json_schema\": {...}}");
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach(rf, k, v) {
        if (strcmp(k, "type") && (strcmp(k, "json_schema") || strcmp(ty, "json_schema"))) {
            /* k is the client's: the refusal is made one printable line */
            ib_one_linef(msg, msz, "response_format.%s is not a field of a %s response_format", k, ty);
            return -1;
        }
    }
    if (strcmp(ty, "json_schema")) return 0;
    json_t *sm = schema_member(rf, msg, msz);
    if (!sm) return -1;
    ib_schema *sc;
    int rc = ib_schema_compile(sm, &sc, msg, msz);
    ib_schema_free(sc);
    return rc ? -1 : 0;
}

int ib_json_setup(ib_json_state *s, json_t *rf) {
    ib_json_init(s);
    json_t *t = json_object_get(rf, "type");
    const char *ty = json_is_string(t) ? json_string_value(t) : "";
    if (!strcmp(ty, "json_object")) return 1;
    if (strcmp(ty, "json_schema")) return 0;
    char msg[256];
    json_t *sm = schema_member(rf, msg, sizeof msg);
    ib_schema *sc = NULL;
    if (!sm || ib_schema_compile(sm, &sc, msg, sizeof msg)) return -1;
    if (!(s->run = ib_schema_run_new(sc))) {
        ib_schema_free(sc);
        return -1;
    }
    return 1;
}

void ib_json_release(ib_json_state *s) {
    ib_schema_run_free(s->run);
    ib_tool_pick_free(s->pick);
    s->run = NULL;
    s->pick = NULL;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A value ended: back to the enclosing container, or done at depth 0. */
static void value_end(ib_json_state *s) { s->mode = s->depth == 0 ? J_DONE : J_AFTER; }

/* Start a value with byte c; -1 when c cannot start one. */
static int value_start(ib_json_state *s, unsigned char c) {
    if (c == '{' || c == '[') {
        if (s->depth >= 64) return -1;
        s->stack = (s->stack << 1) | (c == '{');
        s->depth++;
        s->mode = c == '{' ? J_OBJ_FIRST : J_ARR_FIRST;
        return 0;
    }
    if (c == '"') {
        s->mode = J_STRING;
        s->key = 0;
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        s->mode = J_NUM;
        s->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        return 0;
    }
    for (int l = 0; l < 3; l++)
        if (c == (unsigned char)lits[l][0]) {
            s->mode = J_LIT;
            s->lit = (uint8_t)l;
            s->sub = 1;
            return 0;
        }
    return -1;
}

/* Close the innermost container with c (']' or '}'); -1 when it is the other kind. */
static int close_with(ib_json_state *s, unsigned char c) {
    if (s->depth == 0 || (int)(s->stack & 1) != (c == '}')) return -1;
    s->stack >>= 1;
    s->depth--;
    value_end(s);
    return 0;
}

int ib_json_step(ib_json_state *s, unsigned char c) {
    if (s->pick) return ib_tool_pick_step(s->pick, c);
    if (s->run) return ib_schema_run_step(s->run, c);
    if (s->mode != J_STRING && s->mode != J_ESC && s->mode != J_HEX && s->mode != J_NUM && s->mode != J_LIT) {
        if (is_ws(c)) return ++s->ws > 16 ? -1 : 0;
    }
    switch (s->mode) {
    case J_START:
        if (c != '{') return -1;
        s->ws = 0;
        return value_start(s, c);
    case J_VALUE:
        s->ws = 0;
        return value_start(s, c);
    case J_ARR_FIRST:
        s->ws = 0;
        return c == ']' ? close_with(s, c) : value_start(s, c);
    case J_OBJ_FIRST:
    case J_OBJ_KEY:
        s->ws = 0;
        if (c == '}' && s->mode == J_OBJ_FIRST) return close_with(s, c);
        if (c != '"') return -1;
        s->mode = J_STRING;
        s->key = 1;
        return 0;
    case J_COLON:
        s->ws = 0;
        if (c != ':') return -1;
        s->mode = J_VALUE;
        return 0;
    case J_AFTER:
        s->ws = 0;
        if (c == ',') {
            s->mode = (s->stack & 1) ? J_OBJ_KEY : J_VALUE;
            return 0;
        }
        return c == ']' || c == '}' ? close_with(s, c) : -1;
    case J_STRING:
        if (s->utf8_left) {
            if ((c & 0xC0) != 0x80) return -1;
            s->utf8_left--;
            return 0;
        }
        if (c == '"') {
            if (s->key)
                s->mode = J_COLON;
            else
                value_end(s);
            return 0;
        }
        if (c == '\\') {
            s->mode = J_ESC;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c < 0x80) return 0;
        if (c >= 0xC2 && c <= 0xDF) s->utf8_left = 1;
        else if (c >= 0xE0 && c <= 0xEF) s->utf8_left = 2;
        else if (c >= 0xF0 && c <= 0xF4) s->utf8_left = 3;
        else return -1;
        return 0;
    case J_ESC:
        if (c == 'u') {
            s->mode = J_HEX;
            s->sub = 4;
            return 0;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return -1;
        s->mode = J_STRING;
        return 0;
    case J_HEX:
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
        if (--s->sub == 0) s->mode = J_STRING;
        return 0;
    case J_NUM: {
        int digit = c >= '0' && c <= '9';
        switch (s->sub) {
        case N_MINUS:
            if (!digit) return -1;
            s->sub = c == '0' ? N_ZERO : N_INT;
            return 0;
        case N_ZERO:
        case N_INT:
            if (digit && s->sub == N_INT) return 0;
            if (c == '.') return s->sub = N_DOT, 0;
            if (c == 'e' || c == 'E') return s->sub = N_E, 0;
            break; /* the number ended: c belongs to what follows */
        case N_DOT:
            if (!digit) return -1;
            s->sub = N_FRAC;
            return 0;
        case N_FRAC:
            if (digit) return 0;
            if (c == 'e' || c == 'E') return s->sub = N_E, 0;
            break;
        case N_E:
            if (c == '+' || c == '-') return s->sub = N_ESIGN, 0;
            if (!digit) return -1;
            s->sub = N_EXP;
            return 0;
        case N_ESIGN:
            if (!digit) return -1;
            s->sub = N_EXP;
            return 0;
        case N_EXP:
            if (digit) return 0;
            break;
        }
        value_end(s); /* numbers are never top-level here, so depth > 0: J_AFTER */
        return ib_json_step(s, c);
    }
    case J_LIT:
        if (c != (unsigned char)lits[s->lit][s->sub]) return -1;
        if (!lits[s->lit][++s->sub]) value_end(s);
        return 0;
    case J_DONE:
        return -1; /* only whitespace (handled above) */
    }
    return -1;
}

/* Whether bytes b[0, n) are a plain token (see ib_json_vocab). */
static int plain_bytes(const unsigned char *b, size_t n) {
    uint8_t left = 0;
    if (!n) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = b[i];
        if (left) {
            if ((c & 0xC0) != 0x80) return 0;
            left--;
            continue;
        }
        if (c < 0x20 || c == '"' || c == '\\') return 0;
        if (c < 0x80) continue;
        if (c >= 0xC2 && c <= 0xDF) left = 1;
        else if (c >= 0xE0 && c <= 0xEF) left = 2;
        else if (c >= 0xF0 && c <= 0xF4) left = 3;
        else return 0;
    }
    return left == 0;
}

/* qsort_r order of token ids by their bytes (shorter first on a common prefix, then by id). */
static int by_bytes(const void *a, const void *b, void *ctx) {
    const ib_json_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* lcp[k] = common prefix of ord[k-1] and ord[k] in bytes (0 for k = 0). */
static void fill_lcp(const ib_json_vocab *v, const int32_t *ord, int32_t *lcp, int n) {
    for (int k = 0; k < n; k++) {
        int l = 0;
        if (k) {
            const char *a = v->bytes + v->off[ord[k - 1]], *b = v->bytes + v->off[ord[k]];
            int la = (int)(v->off[ord[k - 1] + 1] - v->off[ord[k - 1]]), lb = (int)(v->off[ord[k] + 1] - v->off[ord[k]]);
            while (l < la && l < lb && a[l] == b[l]) l++;
        }
        lcp[k] = l;
    }
}

int ib_json_vocab_build(ib_json_vocab *v, int V, int (*bytes_of)(void *ctx, int32_t t, char *buf, int cap), void *ctx) {
    memset(v, 0, sizeof *v);
    v->off = malloc(((size_t)V + 1) * sizeof *v->off);
    size_t cap = (size_t)V * 4 + 64, len = 0;
    v->bytes = malloc(cap);
    v->ord = malloc(((size_t)V + 1) * sizeof *v->ord);
    v->lcp = malloc(((size_t)V + 1) * sizeof *v->lcp);
    v->np_ord = malloc(((size_t)V + 1) * sizeof *v->np_ord);
    v->np_lcp = malloc(((size_t)V + 1) * sizeof *v->np_lcp);
    v->lt_ord = malloc(((size_t)V + 1) * sizeof *v->lt_ord);
    v->lt_lcp = malloc(((size_t)V + 1) * sizeof *v->lt_lcp);
    if (!v->off || !v->bytes || !v->ord || !v->lcp || !v->np_ord || !v->np_lcp || !v->lt_ord || !v->lt_lcp) goto fail;
    for (int t = 0; t < V; t++) {
        char b[512];
        int w = bytes_of(ctx, t, b, sizeof b);
        if (w < 0 || w > (int)sizeof b) w = 0;
        if (len + (size_t)w > cap) {
            cap = (len + (size_t)w) * 2;
            char *nb = realloc(v->bytes, cap);
            if (!nb) goto fail;
            v->bytes = nb;
        }
        v->off[t] = len;
        memcpy(v->bytes + len, b, (size_t)w);
        len += (size_t)w;
        if (w > v->maxlen) v->maxlen = w;
        v->ord[t] = t;
    }
    v->off[V] = len;
    v->n = V;
    qsort_r(v->ord, (size_t)V, sizeof *v->ord, by_bytes, v);
    fill_lcp(v, v->ord, v->lcp, V);
    for (int k = 0; k < V; k++) {
        int32_t t = v->ord[k];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[t];
        const size_t len = v->off[t + 1] - v->off[t];
        const int plain = plain_bytes(b, len);
        if (!plain) v->np_ord[v->n_np++] = t;
        if (!plain || memchr(b, '<', len)) v->lt_ord[v->n_lt++] = t;
    }
    fill_lcp(v, v->np_ord, v->np_lcp, v->n_np);
    fill_lcp(v, v->lt_ord, v->lt_lcp, v->n_lt);
    return 0;
fail:
    ib_json_vocab_free(v);
    return -1;
}

static int model_bytes(void *ctx, int32_t t, char *buf, int cap) { return ib_token_bytes(ctx, t, buf, cap); }

int ib_json_vocab_init(ib_json_vocab *v, const ib_model *m) {
    return ib_json_vocab_build(v, ib_model_get_info(m)->vocab_size, model_bytes, (void *)m);
}

void ib_json_vocab_free(ib_json_vocab *v) {
    free(v->off);
    free(v->bytes);
    free(v->ord);
    free(v->lcp);
    free(v->np_ord);
    free(v->np_lcp);
    free(v->lt_ord);
    free(v->lt_lcp);
    memset(v, 0, sizeof *v);
}

#define WALK_MAX 1024 /* tokens longer than this (bytes) are judged one by one */

/* Whether token t can follow state s: its bytes (at least one) all accepted. */
static int token_ok(const ib_json_state *s, const ib_json_vocab *v, int32_t t) {
    size_t a = v->off[t], b = v->off[t + 1];
    if (a == b) return 0;
    ib_json_state x = *s;
    for (size_t i = a; i < b; i++)
        if (ib_json_step(&x, (unsigned char)v->bytes[i])) return 0;
    return 1;
}

/* -inf for every token of v the reader at s refuses; returns the tokens left. The tokens are taken in
 * byte order, each byte prefix stepped once (the states by depth kept in stk) and every token
 * sharing a refused prefix skipped; inside a string with no escape or UTF-8 sequence open, the plain
 * tokens (which leave the state as it is) are allowed without a walk. */
static int json_walk(const ib_json_state *s, const ib_json_vocab *v, float *logits) {
    if (v->maxlen > WALK_MAX) { /* never with real vocabularies: the plain per-token check */
        int allowed = 0;
        for (int t = 0; t < v->n; t++)
            if (token_ok(s, v, t)) allowed++;
            else logits[t] = -INFINITY;
        return allowed;
    }
    ib_json_state stk[WALK_MAX + 1];
    int fast = s->mode == J_STRING && !s->utf8_left, allowed = fast ? v->n - v->n_np : 0;
    const int32_t *ord = fast ? v->np_ord : v->ord, *lcp = fast ? v->np_lcp : v->lcp;
    int N = fast ? v->n_np : v->n, valid = 0, fail_at = INT_MAX;
    stk[0] = *s;
    for (int k = 0; k < N; k++) {
        int32_t t = ord[k];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[t];
        int L = (int)(v->off[t + 1] - v->off[t]), l = lcp[k];
        if (fail_at < l) {
            logits[t] = -INFINITY;
            continue;
        }
        fail_at = INT_MAX;
        int d = l < valid ? l : valid, ok = L > 0;
        for (; d < L; d++) {
            stk[d + 1] = stk[d];
            if (ib_json_step(&stk[d + 1], b[d])) {
                fail_at = d;
                ok = 0;
                break;
            }
        }
        valid = d;
        if (ok)
            allowed++;
        else
            logits[t] = -INFINITY;
    }
    return allowed;
}

int ib_json_mask(const ib_json_state *s, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop,
                 int n_stop) {
    if (s->pick) return ib_tool_pick_mask(s->pick, v, logits, vocab, stop, n_stop);
    if (s->run) return ib_schema_mask(s->run, v, logits, vocab, stop, n_stop);
    int done = ib_json_done(s), n = v->n < vocab ? v->n : vocab, allowed = 0;
    float saved[64];
    int ns = n_stop < 64 ? n_stop : 64;
    for (int k = 0; k < ns; k++)
        if (stop[k] >= 0 && stop[k] < n) {
            saved[k] = logits[stop[k]];
            logits[stop[k]] = 0.0f; /* finite: the walk sets -inf where it refuses */
        }
    for (int t = n; t < vocab; t++) logits[t] = -INFINITY;
    if (done && n_stop) {
        for (int t = 0; t < n; t++) logits[t] = -INFINITY;
    } else if (n == v->n) {
        allowed = json_walk(s, v, logits);
    } else { /* a vocabulary table larger than the row (never in the server) */
        for (int t = 0; t < n; t++)
            if (token_ok(s, v, t)) allowed++;
            else logits[t] = -INFINITY;
    }
    for (int k = 0; k < ns; k++) { /* stop ids: allowed exactly when the object is complete */
        int32_t t = stop[k];
        if (t < 0 || t >= n) continue;
        int dup = 0;
        for (int q = 0; q < k; q++) dup |= stop[q] == t;
        if (dup) continue;
        if (!isinf(logits[t])) allowed--;
        logits[t] = done ? saved[k] : -INFINITY;
        allowed += done;
    }
    return allowed;
}
