/*
 * json_schema.c — response_format {"type": "json_schema"} by constrained decoding: a JSON Schema
 * subset is compiled into a graph of nodes, and a byte-level automaton reads the reply against it;
 * before each draw every token whose bytes the automaton refuses gets -inf for the draw (the
 * vocabulary walk, ib_schema_mask, shares each byte prefix between tokens). As for json_object, the
 * mask is a function of the request's own generated text, its schema and the vocabulary alone, so a
 * constrained request is decoded the same alone or batched.
 *
 * The subset (anything else is refused by name at compile time, never ignored):
 *   type (a name or a list of names), properties, required, additionalProperties (false, true or a
 *   schema), items (one schema), minItems, maxItems, enum and const of any JSON value, anyOf, $ref to
 *   "#", "#/$defs/NAME" or "#/definitions/NAME", $defs / definitions at the root; annotations (title,
 *   description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are
 *   accepted and mean nothing here.
 * What the automaton writes: RFC 8259 JSON of the schema; object keys as the schema spells them
 * (JSON-encoded, no other escapes; each key at most once); enum/const values in compact form; at most
 * 16 whitespace bytes in a row between tokens; at most 16 open containers; numbers of at most 15
 * integer digits, 15 fraction digits and 2 exponent digits (so every parser reads them: jansson
 * refuses integers past 64 bits and reals past DBL_MAX); anyOf keeps at most 8 alternatives alive at
 * once (the first ones, in schema order).
 */
#include "core/error.h"
#include "server/api.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define SC_MAX_NODES 4096
#define SC_MAX_PROPS 64
#define SC_MAX_ENUM 64
#define SC_MAX_ALTS 16
#define SC_MAX_NEST 64     /* schema nesting (the schema document, not the output) */
#define SC_MAX_DEPTH 16    /* open containers in the output */
#define SC_MAX_PATHS 8     /* anyOf alternatives alive at once */
#define SC_MAX_WS 16
/* digits of a number's parts: every number written parses as a double (below 1e115) and every
 * integer as a 64-bit integer, in jansson and JavaScript alike */
#define SC_MAX_INT_DIGITS 15
#define SC_MAX_FRAC_DIGITS 15
#define SC_MAX_EXP_DIGITS 2

enum { K_ANY, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_BOOL, K_NULL, K_ENUM, K_ANYOF, K_REF };

typedef struct snode {
    uint8_t kind;
    int n;            /* object: properties; enum: values; anyOf: alternatives */
    char **lit;       /* object: property names JSON-encoded without quotes; enum: values, compact JSON */
    int *len;         /* [n] bytes of lit[i] */
    int *sub;         /* object: each property's node; anyOf: the alternatives */
    uint64_t required;/* object: bit i = property i is required */
    int addl;         /* object: the node of other keys' values, -1 = no other keys */
    int items;        /* array: the node of every item */
    long min_items, max_items; /* array: max -1 = no bound */
    char *ref;        /* K_REF: the definition's name ("" = the root) until resolved */
    int defs_kind;    /* K_REF: 0 "$defs", 1 "definitions" */
    int target;       /* K_REF: the resolved node */
} snode;

struct ib_schema {
    snode *nd;
    int n, cap;
    json_t *root;     /* borrowed while compiling */
    char **def_name;  /* compiled definitions (name, kind) -> node */
    int *def_kind, *def_node, n_defs;
};

/* ------------------------------------------------------------------ compiling */

typedef struct cctx {
    ib_schema *sc;
    char *msg;
    size_t msz;
    int oom;
} cctx;

static int failf(cctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Write "response_format.json_schema.schema<path>: <message>" as one printable line (the path and
 * the message quote the client's names, which may hold control bytes) and return -1. */
static int failf(cctx *c, const char *path, const char *fmt, ...) {
    char raw[1024];
    int k = snprintf(raw, sizeof raw, "response_format.json_schema.schema%s: ", path);
    if (k >= 0 && (size_t)k < sizeof raw) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(raw + k, sizeof raw - (size_t)k, fmt, ap);
        va_end(ap);
    }
    ib_one_line(c->msg, c->msz, raw);
    return -1;
}

/* A new zeroed node; its index, or -1 (too many, or out of memory). */
static int new_node(cctx *c, const char *path, int kind) {
    ib_schema *sc = c->sc;
    if (sc->n >= SC_MAX_NODES) return failf(c, path, "the schema has more than %d nodes", SC_MAX_NODES);
    if (sc->n == sc->cap) {
        int cap = sc->cap ? sc->cap * 2 : 32;
        snode *nd = realloc(sc->nd, (size_t)cap * sizeof *nd);
        if (!nd) return c->oom = 1, failf(c, path, "out of memory");
        sc->nd = nd;
        sc->cap = cap;
    }
    memset(&sc->nd[sc->n], 0, sizeof sc->nd[0]);
    sc->nd[sc->n].kind = (uint8_t)kind;
    sc->nd[sc->n].addl = -1;
    sc->nd[sc->n].max_items = -1;
    return sc->n++;
}

/* Allocate node i's per-entry arrays for n entries. */
static int node_arrays(cctx *c, int i, int n, int with_sub, const char *path) {
    snode *d = &c->sc->nd[i];
    d->lit = calloc((size_t)n + 1, sizeof *d->lit);
    d->len = calloc((size_t)n + 1, sizeof *d->len);
    d->sub = with_sub ? calloc((size_t)n + 1, sizeof *d->sub) : NULL;
    if (!d->lit || !d->len || (with_sub && !d->sub)) return c->oom = 1, failf(c, path, "out of memory");
    return 0;
}

static const char *const annotations[] = {"title",   "description", "default",    "examples",  "$schema",
                                          "$id",     "$comment",    "deprecated", "readOnly",  "writeOnly", NULL};
static const char *const keywords[] = {"type",  "properties", "required", "additionalProperties", "items",
                                       "minItems", "maxItems", "enum",    "const",  "anyOf",       "$ref",
                                       "$defs", "definitions", NULL};

static int in_set(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static const char *const type_names[] = {"object", "array", "string", "number", "integer", "boolean", "null", NULL};
static const int type_kinds[] = {K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_BOOL, K_NULL};

/* Whether JSON value v is of schema type kind k. */
static int value_has_kind(json_t *v, int k) {
    switch (k) {
    case K_OBJECT: return json_is_object(v);
    case K_ARRAY: return json_is_array(v);
    case K_STRING: return json_is_string(v);
    case K_NUMBER: return json_is_number(v);
    case K_INTEGER: return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    case K_BOOL: return json_is_boolean(v);
    case K_NULL: return json_is_null(v);
    }
    return 1;
}

static int compile(cctx *c, json_t *s, int nest, const char *path);

/* A bound keyword (minItems, maxItems): absent -> dflt; else a non-negative integer. */
static int get_bound(cctx *c, json_t *s, const char *k, long dflt, long *out, const char *path) {
    json_t *v = json_object_get(s, k);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
        return failf(c, path, "'%s' must be an integer in [0, 1000000]", k);
    *out = (long)json_integer_value(v);
    return 0;
}

/* The node of one type of schema s (its keywords that apply to that type). */
static int compile_type(cctx *c, json_t *s, int kind, int nest, const char *path) {
    char sub[512];
    if (kind == K_OBJECT) {
        json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
               *ap = json_object_get(s, "additionalProperties");
        if (props && !json_is_object(props)) return failf(c, path, "'properties' must be an object");
        size_t np = props ? json_object_size(props) : 0;
        if (np > SC_MAX_PROPS) return failf(c, path, "more than %d properties in one object", SC_MAX_PROPS);
        int i = new_node(c, path, K_OBJECT);
        if (i < 0 || node_arrays(c, i, (int)np, 1, path)) return -1;
        const char *k;
        json_t *v;
        int n = 0;
        json_object_foreach(props, k, v) {
            json_t *ks = json_string(k);
            char *enc = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
            json_decref(ks);
            if (!enc) return c->oom = 1, failf(c, path, "out of memory");
            size_t el = strlen(enc);
            memmove(enc, enc + 1, el - 2); /* drop the quotes */
            enc[el - 2] = 0;
            c->sc->nd[i].lit[n] = enc;
            c->sc->nd[i].len[n] = (int)el - 2;
            c->sc->nd[i].n = ++n;
            snprintf(sub, sizeof sub, "%s.properties.%s", path, k);
            int p = compile(c, v, nest + 1, sub);
            if (p < 0) return -1;
            c->sc->nd[i].sub[n - 1] = p;
        }
        if (req) {
            if (!json_is_array(req)) return failf(c, path, "'required' must be an array of property names");
            size_t ri;
            json_array_foreach(req, ri, v) {
                if (!json_is_string(v)) return failf(c, path, "'required'[%zu] must be a string", ri);
                int found = -1;
                size_t pi = 0;
                json_object_foreach(props, k, v) {
                    (void)v;
                    if (!strcmp(k, json_string_value(json_array_get(req, ri)))) found = (int)pi;
                    pi++;
                }
                if (found < 0)
                    return failf(c, path, "required property '%s' is not in 'properties'",
                                 json_string_value(json_array_get(req, ri)));
                c->sc->nd[i].required |= 1ULL << found;
            }
        }
        if (!ap || json_is_true(ap)) {
            c->sc->nd[i].addl = 0; /* node 0: any value */
        } else if (json_is_false(ap)) {
            c->sc->nd[i].addl = -1;
        } else if (json_is_object(ap)) {
            snprintf(sub, sizeof sub, "%s.additionalProperties", path);
            int a = compile(c, ap, nest + 1, sub);
            if (a < 0) return -1;
            c->sc->nd[i].addl = a;
        } else {
            return failf(c, path, "'additionalProperties' must be a boolean or a schema");
        }
        return i;
    }
    if (kind == K_ARRAY) {
        json_t *it = json_object_get(s, "items");
        int items = 0;
        if (it && json_is_object(it)) {
            snprintf(sub, sizeof sub, "%s.items", path);
            if ((items = compile(c, it, nest + 1, sub)) < 0) return -1;
        } else if (it && !json_is_true(it)) {
            return failf(c, path, "'items' must be one schema (tuple forms are not supported)");
        }
        long mn, mx;
        if (get_bound(c, s, "minItems", 0, &mn, path) || get_bound(c, s, "maxItems", -1, &mx, path)) return -1;
        if (mx >= 0 && mn > mx) return failf(c, path, "minItems %ld > maxItems %ld", mn, mx);
        int i = new_node(c, path, K_ARRAY);
        if (i < 0) return -1;
        c->sc->nd[i].items = items;
        c->sc->nd[i].min_items = mn;
        c->sc->nd[i].max_items = mx;
        return i;
    }
    return new_node(c, path, kind);
}

/* The node of schema s (nest: how deep s sits in the schema document). -1 with the message set. */
static int compile(cctx *c, json_t *s, int nest, const char *path) {
    char sub[512];
    if (nest > SC_MAX_NEST) return failf(c, path, "the schema nests deeper than %d", SC_MAX_NEST);
    if (json_is_true(s)) return 0;
    if (!json_is_object(s)) return failf(c, path, "a schema must be an object (or true)");
    const char *k;
    json_t *v;
    int n_constraints = 0;
    json_object_foreach(s, k, v) {
        if (in_set(annotations, k)) continue;
        if (!in_set(keywords, k))
            return failf(c, path, "keyword '%s' is not supported (supported: type, properties, required, "
                                  "additionalProperties, items, minItems, maxItems, enum, const, anyOf, $ref, $defs)", k);
        if ((!strcmp(k, "$defs") || !strcmp(k, "definitions"))) {
            if (nest) return failf(c, path, "'%s' is supported at the schema's root only", k);
            if (!json_is_object(v)) return failf(c, path, "'%s' must be an object of schemas", k);
            continue;
        }
        n_constraints++;
    }
    json_t *ref = json_object_get(s, "$ref"), *any = json_object_get(s, "anyOf"), *type = json_object_get(s, "type");
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (ref) {
        if (n_constraints > 1) return failf(c, path, "'$ref' beside other keywords is not supported");
        const char *r = json_is_string(ref) ? json_string_value(ref) : NULL;
        int kind = 0;
        const char *name = NULL;
        if (r && !strcmp(r, "#")) name = "";
        else if (r && !strncmp(r, "#/$defs/", 8)) name = r + 8;
        else if (r && !strncmp(r, "#/definitions/", 14)) name = r + 14, kind = 1;
        if (!name || strchr(name, '/') || strchr(name, '~') || (r[1] && !name[0]))
            return failf(c, path, "'$ref' must be \"#\", \"#/$defs/NAME\" or \"#/definitions/NAME\"");
        if (name[0] && !json_object_get(json_object_get(c->sc->root, kind ? "definitions" : "$defs"), name))
            return failf(c, path, "'$ref' %s names no definition", r);
        int i = new_node(c, path, K_REF);
        if (i < 0) return -1;
        if (!(c->sc->nd[i].ref = strdup(name))) return c->oom = 1, failf(c, path, "out of memory");
        c->sc->nd[i].defs_kind = kind;
        c->sc->nd[i].target = -1;
        return i;
    }
    if (any) {
        if (n_constraints > 1) return failf(c, path, "'anyOf' beside other keywords is not supported");
        if (!json_is_array(any) || json_array_size(any) < 1 || json_array_size(any) > SC_MAX_ALTS)
            return failf(c, path, "'anyOf' must be an array of 1 to %d schemas", SC_MAX_ALTS);
        int na = (int)json_array_size(any);
        int i = new_node(c, path, K_ANYOF);
        if (i < 0 || node_arrays(c, i, na, 1, path)) return -1;
        for (int a = 0; a < na; a++) {
            snprintf(sub, sizeof sub, "%s.anyOf[%d]", path, a);
            int x = compile(c, json_array_get(any, (size_t)a), nest + 1, sub);
            if (x < 0) return -1;
            c->sc->nd[i].sub[a] = x;
            c->sc->nd[i].n = a + 1;
        }
        return i;
    }
    /* the types asked for */
    int kinds[8], nk = 0;
    if (type) {
        json_t *list = json_is_array(type) ? type : NULL;
        size_t nt = list ? json_array_size(list) : 1;
        if (nt < 1 || nt > 7) return failf(c, path, "'type' must be a type name or a list of 1 to 7 of them");
        for (size_t t = 0; t < nt; t++) {
            json_t *tv = list ? json_array_get(list, t) : type;
            int found = -1;
            for (int q = 0; type_names[q]; q++)
                if (json_is_string(tv) && !strcmp(json_string_value(tv), type_names[q])) found = q;
            if (found < 0)
                return failf(c, path, "'type' must name object, array, string, number, integer, boolean or null");
            for (int q = 0; q < nk; q++)
                if (kinds[q] == type_kinds[found]) found = -1;
            if (found >= 0) kinds[nk++] = type_kinds[found];
        }
    }
    if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) < 1 || json_array_size(en) > SC_MAX_ENUM))
            return failf(c, path, "'enum' must be an array of 1 to %d values", SC_MAX_ENUM);
        static const char *const others[] = {"properties", "required", "additionalProperties", "items", "minItems", "maxItems", NULL};
        for (int q = 0; others[q]; q++)
            if (json_object_get(s, others[q]))
                return failf(c, path, "'%s' beside 'enum'/'const' is not supported", others[q]);
        size_t nv = en ? json_array_size(en) : 1;
        int i = new_node(c, path, K_ENUM);
        if (i < 0 || node_arrays(c, i, (int)nv, 0, path)) return -1;
        int n = 0;
        for (size_t q = 0; q < nv; q++) {
            json_t *val = en ? json_array_get(en, q) : cn;
            if (en && cn && !json_equal(val, cn)) continue;
            int typed = !nk;
            for (int t = 0; t < nk; t++) typed |= value_has_kind(val, kinds[t]);
            if (!typed) continue;
            int dup = 0;
            for (size_t r = 0; r < q; r++) dup |= en && json_equal(json_array_get(en, r), val);
            if (dup) continue;
            char *lit = json_dumps(val, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!lit) return c->oom = 1, failf(c, path, "out of memory");
            c->sc->nd[i].lit[n] = lit;
            c->sc->nd[i].len[n] = (int)strlen(lit);
            c->sc->nd[i].n = ++n;
        }
        if (!n) return failf(c, path, "no value of 'enum'/'const' satisfies the schema's other keywords");
        return i;
    }
    if (!nk) { /* no type: as the keywords say, or any value */
        int obj = json_object_get(s, "properties") || json_object_get(s, "required") ||
                  json_object_get(s, "additionalProperties");
        int arr = json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems");
        if (obj && arr) return failf(c, path, "object and array keywords without a 'type'");
        if (!obj && !arr) return 0;
        kinds[nk++] = obj ? K_OBJECT : K_ARRAY;
    }
    if (nk == 1) return compile_type(c, s, kinds[0], nest, path);
    int i = new_node(c, path, K_ANYOF);
    if (i < 0 || node_arrays(c, i, nk, 1, path)) return -1;
    for (int t = 0; t < nk; t++) {
        int x = compile_type(c, s, kinds[t], nest, path);
        if (x < 0) return -1;
        c->sc->nd[i].sub[t] = x;
        c->sc->nd[i].n = t + 1;
    }
    return i;
}

/* Whether following anyOf alternatives and $refs from node i comes back to a node on the way (a
 * value that could never start). on[i]: 1 while i is on the current walk, 2 once i is known clean
 * (so each node is walked once). */
static int alt_cycle(const ib_schema *sc, int i, uint8_t *on) {
    const snode *d = &sc->nd[i];
    if (d->kind != K_REF && d->kind != K_ANYOF) return 0;
    if (on[i]) return on[i] == 1;
    on[i] = 1;
    int bad = 0;
    if (d->kind == K_REF) bad = alt_cycle(sc, d->target, on);
    for (int a = 0; !bad && d->kind == K_ANYOF && a < d->n; a++) bad = alt_cycle(sc, d->sub[a], on);
    on[i] = bad ? 1 : 2;
    return bad;
}

void ib_schema_free(ib_schema *sc) {
    if (!sc) return;
    for (int i = 0; i < sc->n; i++) {
        snode *d = &sc->nd[i];
        if (d->lit)
            for (int k = 0; k < d->n; k++) free(d->lit[k]);
        free(d->lit);
        free(d->len);
        free(d->sub);
        free(d->ref);
    }
    for (int i = 0; i < sc->n_defs; i++) free(sc->def_name[i]);
    free(sc->def_name);
    free(sc->def_kind);
    free(sc->def_node);
    free(sc->nd);
    free(sc);
}

/* Resolve every $ref, compiling the definitions they name (once each). */
static int resolve(cctx *c, int root) {
    ib_schema *sc = c->sc;
    for (int i = 0; i < sc->n; i++) {
        if (sc->nd[i].kind != K_REF || sc->nd[i].target >= 0) continue;
        const char *name = sc->nd[i].ref;
        int kind = sc->nd[i].defs_kind, t = -1;
        if (!name[0]) t = root;
        for (int d = 0; t < 0 && d < sc->n_defs; d++)
            if (sc->def_kind[d] == kind && !strcmp(sc->def_name[d], name)) t = sc->def_node[d];
        if (t < 0) {
            char path[512];
            snprintf(path, sizeof path, ".%s.%s", kind ? "definitions" : "$defs", name);
            int nd = sc->n_defs + 1;
            char **dn = realloc(sc->def_name, (size_t)nd * sizeof *dn);
            if (dn) sc->def_name = dn;
            int *dk = realloc(sc->def_kind, (size_t)nd * sizeof *dk);
            if (dk) sc->def_kind = dk;
            int *dd = realloc(sc->def_node, (size_t)nd * sizeof *dd);
            if (dd) sc->def_node = dd;
            char *nm = strdup(name);
            if (!dn || !dk || !dd || !nm) {
                free(nm);
                return c->oom = 1, failf(c, "", "out of memory");
            }
            /* a placeholder first, so a definition that refers to itself finds it */
            int ph = new_node(c, path, K_REF);
            if (ph < 0) {
                free(nm);
                return -1;
            }
            sc->def_name[sc->n_defs] = nm;
            sc->def_kind[sc->n_defs] = kind;
            sc->def_node[sc->n_defs++] = ph;
            json_t *def = json_object_get(json_object_get(sc->root, kind ? "definitions" : "$defs"), name);
            int x = compile(c, def, 1, path);
            if (x < 0) return -1;
            sc->nd[ph].target = x;
            sc->nd[ph].ref = NULL;
            t = ph;
        }
        sc->nd[i].target = t;
    }
    uint8_t *on = calloc((size_t)sc->n, 1);
    if (!on) return c->oom = 1, failf(c, "", "out of memory");
    for (int i = 0; i < sc->n; i++)
        if (alt_cycle(sc, i, on)) {
            free(on);
            return failf(c, "", "a '$ref'/'anyOf' cycle that never reaches a type");
        }
    free(on);
    return 0;
}

int ib_schema_compile(json_t *schema, ib_schema **out, char *msg, size_t msz) {
    *out = NULL;
    ib_schema *sc = calloc(1, sizeof *sc);
    cctx c = {.sc = sc, .msg = msg, .msz = msz};
    if (!sc) {
        snprintf(msg, msz, "out of memory");
        return -2;
    }
    sc->root = schema;
    int root = -1;
    if (new_node(&c, "", K_ANY) == 0) { /* node 0: any value */
        root = compile(&c, schema, 0, "");
        if (root >= 0 && resolve(&c, root)) root = -1;
    }
    if (root < 0) {
        ib_schema_free(sc);
        return c.oom ? -2 : -1;
    }
    /* the root must be node 1 or reachable: keep its index in node 0's items (unused otherwise) */
    sc->nd[0].target = root;
    sc->root = NULL;
    *out = sc;
    return 0;
}

/* ------------------------------------------------------------------ the automaton */

enum {
    P_VALUE,     /* a value of node cur (whitespace first) */
    P_OBJ_FIRST, /* after '{': a key or '}' */
    P_OBJ_KEY,   /* after ',' in an object: a key */
    P_KEY,       /* inside a key (cand, pos, other, utf8) */
    P_COLON,     /* after a key */
    P_AFTER,     /* after a value in a container: ',' or the closing bracket */
    P_ARR_FIRST, /* after '[': a value or ']' */
    P_STRING,    /* inside a string value (sub: 0 plain, 1 after '\\', 2..5 hex digits left + 1) */
    P_NUM,       /* inside a number (sub: N_*) */
    P_LIT,       /* inside true/false/null (lit, sub = next index) */
    P_ENUM,      /* inside an enum/const value (cand, pos) */
    P_DONE
};
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
static const char *const lits[3] = {"true", "false", "null"};

typedef struct sframe {
    uint64_t aux;       /* object: properties seen (bit i); array: values begun */
    uint16_t node;
    uint8_t is_obj;
} sframe;

/* One deterministic reading of the text so far. Copied per byte: keep it small (frames last). */
typedef struct spath {
    uint8_t mode, sub, lit, utf8, ws, depth, other;
    uint16_t cur;       /* P_VALUE / P_NUM / P_ENUM: the value's node */
    int16_t prop;       /* after a key: its property, -1 = an other key */
    uint32_t pos;       /* P_KEY / P_ENUM: bytes matched */
    uint64_t cand;      /* P_KEY: property names still matching; P_ENUM: values still matching */
    sframe f[SC_MAX_DEPTH];
} spath;

/* The readings still alive (more than one only under anyOf). */
typedef struct sstate {
    int n;
    spath p[SC_MAX_PATHS];
} sstate;

struct ib_schema_run {
    ib_schema *sc;      /* owned, unless borrowed (a clone's) */
    int borrowed;
    sstate cur;         /* the text generated so far */
    sstate *stk;        /* [maxlen + 1] the vocabulary walk's states by byte depth */
    int stk_len;
};

static size_t path_bytes(const spath *p) { return offsetof(spath, f) + (size_t)p->depth * sizeof(sframe); }

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Follow $refs from node i to a node that is not one. */
static int deref(const ib_schema *sc, int i) {
    while (sc->nd[i].kind == K_REF) i = sc->nd[i].target;
    return i;
}

/* The concrete alternatives of node i (anyOf and $ref expanded, in order) into out, at most max. */
static void expand(const ib_schema *sc, int i, uint16_t *out, int *n, int max) {
    if (*n >= max) return;
    i = deref(sc, i);
    if (sc->nd[i].kind != K_ANYOF) {
        if (*n < max) out[(*n)++] = (uint16_t)i;
        return;
    }
    for (int a = 0; a < sc->nd[i].n; a++) expand(sc, sc->nd[i].sub[a], out, n, max);
}

static void value_end(spath *p) { p->mode = p->depth == 0 ? P_DONE : P_AFTER; }

/* Whether p's enum value matched so far is a whole value. */
static int enum_complete(const ib_schema *sc, const spath *p) {
    const snode *d = &sc->nd[p->cur];
    for (uint64_t m = p->cand; m; m &= m - 1)
        if ((uint32_t)d->len[__builtin_ctzll(m)] == p->pos) return 1;
    return 0;
}

static int num_complete(const spath *p) {
    return p->sub == N_ZERO || p->sub == N_INT || p->sub == N_FRAC || p->sub == N_EXP;
}

static int path_done(const ib_schema *sc, const spath *p) {
    if (p->mode == P_DONE) return 1;
    if (p->depth) return 0;
    return (p->mode == P_NUM && num_complete(p)) || (p->mode == P_ENUM && enum_complete(sc, p));
}

/* Open a container of node (deref'd) at p. */
static int push(spath *p, int node, int is_obj) {
    if (p->depth >= SC_MAX_DEPTH) return -1;
    p->f[p->depth].aux = 0;
    p->f[p->depth].node = (uint16_t)node;
    p->f[p->depth].is_obj = (uint8_t)is_obj;
    p->depth++;
    p->mode = is_obj ? P_OBJ_FIRST : P_ARR_FIRST;
    return 0;
}

/* Container facts of frame f: any-value frames take any keys and items. */
static int f_addl(const ib_schema *sc, const sframe *f) { return sc->nd[f->node].kind == K_ANY ? 0 : sc->nd[f->node].addl; }
static int f_items(const ib_schema *sc, const sframe *f) { return sc->nd[f->node].kind == K_ANY ? 0 : sc->nd[f->node].items; }
static int f_nprops(const ib_schema *sc, const sframe *f) { return sc->nd[f->node].kind == K_ANY ? 0 : sc->nd[f->node].n; }

/* Whether the object of frame f may take another key. */
static int obj_more(const ib_schema *sc, const sframe *f) {
    int np = f_nprops(sc, f);
    uint64_t all = np == 64 ? ~0ULL : (1ULL << np) - 1;
    return f_addl(sc, f) >= 0 || (all & ~f->aux) != 0;
}

/* Start a value of concrete node p->cur with byte c (not whitespace). */
static int value_start(const ib_schema *sc, spath *p, unsigned char c) {
    const snode *d = &sc->nd[p->cur];
    p->ws = 0;
    switch (d->kind) {
    case K_ANY:
        if (c == '{' || c == '[') return push(p, p->cur, c == '{');
        break;
    case K_OBJECT:
        return c == '{' ? push(p, p->cur, 1) : -1;
    case K_ARRAY:
        return c == '[' ? push(p, p->cur, 0) : -1;
    case K_STRING:
        break;
    case K_NUMBER:
    case K_INTEGER:
        if (c != '-' && !(c >= '0' && c <= '9')) return -1;
        break;
    case K_BOOL:
        if (c != 't' && c != 'f') return -1;
        break;
    case K_NULL:
        if (c != 'n') return -1;
        break;
    case K_ENUM: {
        uint64_t m = 0;
        for (int k = 0; k < d->n; k++)
            if ((unsigned char)d->lit[k][0] == c) m |= 1ULL << k;
        if (!m) return -1;
        p->mode = P_ENUM;
        p->cand = m;
        p->pos = 1;
        return 0;
    }
    default:
        return -1;
    }
    if (c == '"' && (d->kind == K_ANY || d->kind == K_STRING)) {
        p->mode = P_STRING;
        p->sub = 0;
        p->utf8 = 0;
        return 0;
    }
    if (d->kind == K_STRING) return -1;
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (d->kind != K_ANY && d->kind != K_NUMBER && d->kind != K_INTEGER) return -1;
        p->mode = P_NUM;
        p->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        p->pos = 1;
        return 0;
    }
    for (int l = 0; l < 3; l++)
        if (c == (unsigned char)lits[l][0]) {
            p->mode = P_LIT;
            p->lit = (uint8_t)l;
            p->sub = 1;
            return 0;
        }
    return -1;
}

/* Close the innermost container. */
static void pop(spath *p) {
    p->depth--;
    value_end(p);
}

/* Advance the UTF-8 check of a string by byte c (not '"' or '\\' handling): 0 ok, -1 invalid. */
static int utf8_step(uint8_t *left, unsigned char c) {
    if (*left) {
        if ((c & 0xC0) != 0x80) return -1;
        (*left)--;
        return 0;
    }
    if (c < 0x20) return -1;
    if (c < 0x80) return 0;
    if (c >= 0xC2 && c <= 0xDF) *left = 1;
    else if (c >= 0xE0 && c <= 0xEF) *left = 2;
    else if (c >= 0xF0 && c <= 0xF4) *left = 3;
    else return -1;
    return 0;
}

/* Step one deterministic reading p (at no value start under anyOf: sstep expands those) by byte c. */
static int pstep(const ib_schema *sc, spath *p, unsigned char c) {
    if (p->mode != P_STRING && p->mode != P_KEY && p->mode != P_NUM && p->mode != P_LIT && p->mode != P_ENUM &&
        is_ws(c))
        return ++p->ws > SC_MAX_WS ? -1 : 0;
    sframe *f = p->depth ? &p->f[p->depth - 1] : NULL;
    switch (p->mode) {
    case P_VALUE:
        return value_start(sc, p, c);
    case P_ARR_FIRST: /* only ']' comes here (sstep turns a value start into P_VALUE) */
        p->ws = 0;
        if (c != ']' || sc->nd[f->node].min_items > 0) return -1;
        pop(p);
        return 0;
    case P_OBJ_FIRST:
    case P_OBJ_KEY: {
        p->ws = 0;
        if (c == '}' && p->mode == P_OBJ_FIRST) {
            if (sc->nd[f->node].kind != K_ANY && (sc->nd[f->node].required & ~f->aux)) return -1;
            pop(p);
            return 0;
        }
        if (c != '"' || !obj_more(sc, f)) return -1;
        int np = f_nprops(sc, f);
        p->mode = P_KEY;
        p->cand = np == 64 ? ~0ULL : (1ULL << np) - 1;
        p->pos = 0;
        p->other = f_addl(sc, f) >= 0;
        p->utf8 = 0;
        return 0;
    }
    case P_KEY: {
        const snode *d = &sc->nd[f->node];
        uint64_t m = 0;
        for (uint64_t q = p->cand; q; q &= q - 1) {
            int k = __builtin_ctzll(q);
            if ((uint32_t)d->len[k] > p->pos && (unsigned char)d->lit[k][p->pos] == c) m |= 1ULL << k;
        }
        /* a '"' a name's encoding continues with is escaped (an odd run of backslashes before it,
         * the same for every candidate): it cannot also end the key */
        if (c == '"' && !m) {
            int exact = -1;
            for (uint64_t m = p->cand; m && exact < 0; m &= m - 1)
                if ((uint32_t)d->len[__builtin_ctzll(m)] == p->pos) exact = __builtin_ctzll(m);
            if (exact >= 0) {
                if (f->aux >> exact & 1) return -1; /* each key once */
                f->aux |= 1ULL << exact;
                p->prop = (int16_t)exact;
            } else if (p->other && !p->utf8) {
                p->prop = -1;
            } else {
                return -1;
            }
            p->mode = P_COLON;
            return 0;
        }
        if (p->other && (c == '\\' || c == '"' || utf8_step(&p->utf8, c))) p->other = 0;
        if (!p->other && !(m & ~f->aux)) return -1;
        p->cand = m;
        p->pos++;
        return 0;
    }
    case P_COLON:
        p->ws = 0;
        if (c != ':') return -1;
        p->mode = P_VALUE;
        p->cur = (uint16_t)(p->prop >= 0 ? sc->nd[f->node].sub[p->prop] : f_addl(sc, f));
        return 0;
    case P_AFTER:
        p->ws = 0;
        if (c == ',') {
            if (f->is_obj) {
                if (!obj_more(sc, f)) return -1;
                p->mode = P_OBJ_KEY;
                return 0;
            }
            if (sc->nd[f->node].kind != K_ANY && sc->nd[f->node].max_items >= 0 &&
                (long)f->aux >= sc->nd[f->node].max_items)
                return -1;
            f->aux++;
            p->mode = P_VALUE;
            p->cur = (uint16_t)f_items(sc, f);
            return 0;
        }
        if (c == '}' && f->is_obj) {
            if (sc->nd[f->node].kind != K_ANY && (sc->nd[f->node].required & ~f->aux)) return -1;
            pop(p);
            return 0;
        }
        if (c == ']' && !f->is_obj) {
            if (sc->nd[f->node].kind != K_ANY && (long)f->aux < sc->nd[f->node].min_items) return -1;
            pop(p);
            return 0;
        }
        return -1;
    case P_STRING:
        if (p->sub == 1) { /* after a backslash */
            if (c == 'u') {
                p->sub = 5;
                return 0;
            }
            if (!c || !strchr("\"\\/bfnrt", c)) return -1;
            p->sub = 0;
            return 0;
        }
        if (p->sub >= 2) {
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
            p->sub = p->sub == 2 ? 0 : p->sub - 1;
            return 0;
        }
        if (c == '"' && !p->utf8) {
            value_end(p);
            return 0;
        }
        if (c == '\\' && !p->utf8) {
            p->sub = 1;
            return 0;
        }
        return utf8_step(&p->utf8, c);
    case P_NUM: { /* pos: digits of the current part (integer, fraction, exponent) */
        int digit = c >= '0' && c <= '9', integer = sc->nd[p->cur].kind == K_INTEGER;
        switch (p->sub) {
        case N_MINUS:
            if (!digit) return -1;
            p->sub = c == '0' ? N_ZERO : N_INT;
            p->pos = 1;
            return 0;
        case N_ZERO:
        case N_INT:
            if (digit && p->sub == N_INT) return p->pos++ < SC_MAX_INT_DIGITS ? 0 : -1;
            if (digit) return -1; /* no leading zeros */
            if (c == '.' && !integer) return p->sub = N_DOT, 0;
            if ((c == 'e' || c == 'E') && !integer) return p->sub = N_E, 0;
            break;
        case N_DOT:
            if (!digit) return -1;
            p->sub = N_FRAC;
            p->pos = 1;
            return 0;
        case N_FRAC:
            if (digit) return p->pos++ < SC_MAX_FRAC_DIGITS ? 0 : -1;
            if (c == 'e' || c == 'E') return p->sub = N_E, 0;
            break;
        case N_E:
            if (c == '+' || c == '-') return p->sub = N_ESIGN, 0;
            /* fall through */
        case N_ESIGN:
            if (!digit) return -1;
            p->sub = N_EXP;
            p->pos = 1;
            return 0;
        case N_EXP:
            if (digit) return p->pos++ < SC_MAX_EXP_DIGITS ? 0 : -1;
            break;
        }
        value_end(p); /* the number ended: c belongs to what follows */
        return pstep(sc, p, c);
    }
    case P_LIT:
        if (c != (unsigned char)lits[p->lit][p->sub]) return -1;
        if (!lits[p->lit][++p->sub]) value_end(p);
        return 0;
    case P_ENUM: {
        const snode *d = &sc->nd[p->cur];
        uint64_t m = 0;
        for (uint64_t q = p->cand; q; q &= q - 1) {
            int k = __builtin_ctzll(q);
            if ((uint32_t)d->len[k] > p->pos && (unsigned char)d->lit[k][p->pos] == c) m |= 1ULL << k;
        }
        if (m) {
            p->cand = m;
            p->pos++;
            return 0;
        }
        if (!enum_complete(sc, p)) return -1;
        value_end(p);
        return pstep(sc, p, c);
    }
    case P_DONE:
        return -1; /* only whitespace (above) */
    }
    return -1;
}

/* dst = src advanced by byte c; -1 (dst then empty) when no reading accepts c. */
static int sstep(const ib_schema *sc, const sstate *src, sstate *dst, unsigned char c) {
    dst->n = 0;
    for (int i = 0; i < src->n && dst->n < SC_MAX_PATHS; i++) {
        const spath *p = &src->p[i];
        int start = !is_ws(c) && (p->mode == P_VALUE || (p->mode == P_ARR_FIRST && c != ']'));
        if (!start) {
            spath *q = &dst->p[dst->n];
            memcpy(q, p, path_bytes(p));
            if (pstep(sc, q, c) == 0) dst->n++;
            continue;
        }
        int cur = p->cur;
        if (p->mode == P_ARR_FIRST) {
            const sframe *f = &p->f[p->depth - 1];
            if (sc->nd[f->node].kind != K_ANY && sc->nd[f->node].max_items == 0) continue;
            cur = f_items(sc, f);
        }
        uint16_t alts[SC_MAX_PATHS];
        int na = 0;
        expand(sc, cur, alts, &na, SC_MAX_PATHS);
        for (int a = 0; a < na && dst->n < SC_MAX_PATHS; a++) {
            spath *q = &dst->p[dst->n];
            memcpy(q, p, path_bytes(p));
            if (q->mode == P_ARR_FIRST) {
                q->f[q->depth - 1].aux = 1;
                q->mode = P_VALUE;
            }
            q->cur = alts[a];
            if (pstep(sc, q, c) == 0) dst->n++;
        }
    }
    return dst->n ? 0 : -1;
}

static void scopy(sstate *dst, const sstate *src) {
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) memcpy(&dst->p[i], &src->p[i], path_bytes(&src->p[i]));
}

ib_schema_run *ib_schema_run_new(ib_schema *sc) {
    ib_schema_run *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->sc = sc;
    r->cur.n = 1;
    r->cur.p[0].mode = P_VALUE;
    r->cur.p[0].cur = (uint16_t)sc->nd[0].target;
    return r;
}

ib_schema_run *ib_schema_run_clone(const ib_schema_run *r) {
    ib_schema_run *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->sc = r->sc;
    c->borrowed = 1;
    scopy(&c->cur, &r->cur);
    return c;
}

void ib_schema_run_copy(ib_schema_run *dst, const ib_schema_run *src) {
    dst->sc = src->sc;
    scopy(&dst->cur, &src->cur);
}

void ib_schema_run_free(ib_schema_run *r) {
    if (!r) return;
    if (!r->borrowed) ib_schema_free(r->sc);
    free(r->stk);
    free(r);
}

int ib_schema_run_step(ib_schema_run *r, unsigned char c) {
    sstate next;
    if (sstep(r->sc, &r->cur, &next, c)) {
        r->cur.n = 0;
        return -1;
    }
    scopy(&r->cur, &next);
    return 0;
}

int ib_schema_run_done(const ib_schema_run *r) {
    for (int i = 0; i < r->cur.n; i++)
        if (path_done(r->sc, &r->cur.p[i])) return 1;
    return 0;
}

/* Whether every reading of st is inside a string that any plain token (ib_json_vocab.plain) leaves
 * as it is: a string value with no escape or UTF-8 sequence open, or a key that matches no property
 * name any more and may be any other key. */
static int plain_string(const sstate *st) {
    for (int i = 0; i < st->n; i++) {
        const spath *p = &st->p[i];
        if (p->mode == P_STRING ? p->sub || p->utf8 : p->mode != P_KEY || p->cand || !p->other || p->utf8) return 0;
    }
    return st->n > 0;
}

int ib_schema_run_plain(const ib_schema_run *r) { return plain_string(&r->cur); }

int ib_schema_mask(ib_schema_run *r, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop,
                   int n_stop) {
    if (v->n > vocab) return 0; /* not this vocabulary: no constraint (never in the server) */
    if (!r->stk || r->stk_len < v->maxlen + 1) {
        free(r->stk);
        r->stk_len = v->maxlen + 1;
        if (!(r->stk = malloc((size_t)r->stk_len * sizeof *r->stk))) {
            r->stk_len = 0;
            return 0; /* out of memory: the caller draws unconstrained (never happens in practice) */
        }
    }
    int done = ib_schema_run_done(r), all_done = r->cur.n > 0;
    for (int i = 0; i < r->cur.n; i++) all_done &= r->cur.p[i].mode == P_DONE;
    float saved[64];
    int ns = n_stop < 64 ? n_stop : 64, allowed = 0;
    for (int k = 0; k < ns; k++)
        if (stop[k] >= 0 && stop[k] < vocab) {
            saved[k] = logits[stop[k]];
            logits[stop[k]] = 0.0f; /* finite: the walk below sets -inf where it refuses */
        }
    for (int t = v->n; t < vocab; t++) logits[t] = -INFINITY;
    if (all_done && ns) { /* only the stop ids */
        for (int t = 0; t < v->n; t++) logits[t] = -INFINITY;
    } else if (r->cur.n == 0) {
        for (int t = 0; t < v->n; t++) logits[t] = -INFINITY;
    } else {
        int fast = plain_string(&r->cur);
        const int32_t *ord = fast ? v->np_ord : v->ord, *lcp = fast ? v->np_lcp : v->lcp;
        int N = fast ? v->n_np : v->n;
        if (fast) allowed += v->n - v->n_np;
        sstate *S = r->stk;
        scopy(&S[0], &r->cur);
        int valid = 0, fail_at = INT_MAX;
        for (int k = 0; k < N; k++) {
            int32_t t = ord[k];
            const unsigned char *b = (const unsigned char *)v->bytes + v->off[t];
            int L = (int)(v->off[t + 1] - v->off[t]), l = lcp[k];
            if (fail_at < l) { /* shares the byte prefix an earlier token failed on */
                logits[t] = -INFINITY;
                continue;
            }
            fail_at = INT_MAX;
            int d = l < valid ? l : valid, ok = L > 0;
            for (; d < L; d++)
                if (sstep(r->sc, &S[d], &S[d + 1], b[d])) {
                    fail_at = d;
                    ok = 0;
                    break;
                }
            valid = d;
            if (ok)
                allowed++;
            else
                logits[t] = -INFINITY;
        }
    }
    for (int k = 0; k < ns; k++) {
        int32_t s = stop[k];
        if (s < 0 || s >= vocab) continue;
        int dup = 0;
        for (int q = 0; q < k; q++) dup |= stop[q] == s;
        if (dup) continue;
        if (s < v->n && !isinf(logits[s])) allowed--; /* the walk counted it */
        logits[s] = done ? saved[k] : -INFINITY;
        allowed += done;
    }
    return allowed;
}
