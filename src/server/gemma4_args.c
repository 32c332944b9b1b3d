/*
 * gemma4_args.c — a Gemma 4 call's arguments, {key:VALUE,…} in its value syntax, read byte by byte
 * as the JSON text they stand for, which goes to one of json_constraint.c's readers (json_schema's
 * for a function's parameters). tool_pick.c reads a tool_choice "required" or named reply in Gemma
 * 4's form with it, so the arguments the model writes are valid for the function's schema, and
 * ib_gemma4_tool_calls_read (tool_form_gemma4.c) reads them back as the same JSON.
 *
 *   written                       the JSON reader is fed
 *   <|"|>text<|"|>                "text", with '"', '\\' and the bytes below 0x20 escaped (\u00XX); a NUL
 *                                 is refused. A '<' inside is held back until the next byte says what
 *                                 it is: with a '|' after it, the closing delimiter (so a text never
 *                                 holds "<|"); else a '<' of the text. It is taken where either reading
 *                                 can go on (both tried on a copy of the JSON reader).
 *   key:   (at an object's key)   "key": — a bare word of bytes other than blanks, {}[],:<"\ and the
 *                                 bytes below 0x20; or <|"|>key<|"|>: for any other key
 *   None                          null (null itself passes as it is)
 *   numbers, true, false, [ ] { } , :   as they are
 *
 * Nothing else: no whitespace outside a text (Gemma 4's template writes none) and no JSON string
 * syntax. The reader starts after the arguments' opening '{', which the caller has fed to the JSON
 * reader; the arguments are whole when that '{' is closed and the JSON reader says its object is.
 */
#include "server/api.h"

#include <string.h>

static const char delim[] = "<|\"|>";   /* the string delimiter token's text */
#define DELIM_LEN 5

enum {
    G_OUT,     /* outside texts: a key when key, else a value, ',' ':' or a closing bracket */
    G_OPEN,    /* sub bytes of an opening <|"|> read ('"' already fed) */
    G_TEXT,    /* inside a text */
    G_LT,      /* inside a text, a '<' held back */
    G_CLOSE,   /* sub bytes of a closing <|"|> read ('"' already fed) */
    G_KEY,     /* inside a bare key */
    G_NONE     /* sub bytes of "None" read */
};

void ib_g4args_init(ib_g4args *g) {
    memset(g, 0, sizeof *g);
    g->mode = G_OUT;
    g->key = 1;
    g->depth = 1;
    g->stack = 1;   /* inside the arguments' object */
}

/* Feed the JSON bytes s[0, n) to js: 0, or -1 at the first refused. */
static int put(ib_json_state *js, const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (ib_json_step(js, (unsigned char)s[i])) return -1;
    return 0;
}

/* Feed text byte c as JSON string content: escaped where JSON wants it. -1 when refused (a NUL). */
static int put_text_byte(ib_json_state *js, unsigned char c) {
    static const char hex[] = "0123456789abcdef";
    if (c == 0) return -1;
    if (c == '"' || c == '\\') {
        const char e[2] = {'\\', (char)c};
        return put(js, e, 2);
    }
    if (c < 0x20) {
        const char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        return put(js, e, 6);
    }
    return ib_json_step(js, c);
}

/* Whether js would take the JSON bytes s[0, n) (js itself unchanged; probe: the schema reader the
 * copy steps when js has one). */
static int would_take(const ib_json_state *js, ib_schema_run *probe, const char *s, int n) {
    ib_json_state x = *js;
    if (x.run) {
        if (!probe) return 0;
        ib_schema_run_copy(probe, js->run);
        x.run = probe;
    }
    return !put(&x, s, n);
}

/* A byte a bare key may hold. */
static int bare_ok(unsigned char c) { return c > ' ' && !strchr("{}[],:<\"\\", c); }

/* c read outside texts. */
static int step_out(ib_g4args *g, ib_json_state *js, unsigned char c) {
    if (c == '<') {   /* a text (a value, or a key between delimiters) */
        if (ib_json_step(js, '"')) return -1;
        g->mode = G_OPEN, g->sub = 1, g->key = 0;
        return 0;
    }
    if (g->key && c != '}') {   /* a bare key */
        if (!bare_ok(c) || ib_json_step(js, '"') || put_text_byte(js, c)) return -1;
        g->mode = G_KEY, g->key = 0;
        return 0;
    }
    if (c == 'N') {
        if (ib_json_step(js, 'n')) return -1;
        g->mode = G_NONE, g->sub = 1;
        return 0;
    }
    if (c <= ' ' || c == '"' || c == '\\' || ib_json_step(js, c)) return -1;
    /* the JSON reader took it, so the brackets are balanced: follow them */
    g->key = 0;
    if (c == '{' || c == '[') {
        if (g->depth >= 64) return -1;
        g->stack = (g->stack << 1) | (c == '{');
        g->depth++;
        g->key = c == '{';
    } else if (c == '}' || c == ']') {
        g->stack >>= 1;
        g->depth--;
    } else if (c == ',') {
        g->key = (int)(g->stack & 1);
    }
    return 0;
}

int ib_g4args_step(ib_g4args *g, ib_json_state *js, ib_schema_run *probe, unsigned char c) {
    switch (g->mode) {
    case G_OUT:
        return step_out(g, js, c);
    case G_OPEN:
    case G_CLOSE:
        if (c != (unsigned char)delim[g->sub]) return -1;
        if (++g->sub == DELIM_LEN) g->mode = g->mode == G_OPEN ? G_TEXT : G_OUT;
        return 0;
    case G_LT:
        if (c == '|') {   /* the closing delimiter */
            if (ib_json_step(js, '"')) return -1;
            g->mode = G_CLOSE, g->sub = 2;
            return 0;
        }
        if (ib_json_step(js, '<')) return -1;   /* the held '<' was the text's */
        g->mode = G_TEXT;
        /* c read inside the text */
        __attribute__((fallthrough));
    case G_TEXT:
        if (c == '<') {
            if (!would_take(js, probe, "<", 1) && !would_take(js, probe, "\"", 1)) return -1;
            g->mode = G_LT;
            return 0;
        }
        return put_text_byte(js, c);
    case G_KEY:
        if (c == ':') {
            if (put(js, "\":", 2)) return -1;
            g->mode = G_OUT;
            return 0;
        }
        return bare_ok(c) ? put_text_byte(js, c) : -1;
    case G_NONE:
        if (c != (unsigned char)"None"[g->sub] || ib_json_step(js, (unsigned char)"null"[g->sub])) return -1;
        if (++g->sub == 4) g->mode = G_OUT;
        return 0;
    }
    return -1;
}

int ib_g4args_done(const ib_g4args *g, const ib_json_state *js) {
    return g->mode == G_OUT && g->depth == 0 && ib_json_done(js);
}

int ib_g4args_plain(const ib_g4args *g, const ib_json_state *js) { return g->mode == G_TEXT && ib_json_plain_string(js); }
