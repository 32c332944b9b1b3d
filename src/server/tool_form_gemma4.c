/*
 * tool_form_gemma4.c — OpenAI function calling in Gemma 4's own tool syntax (its chat template's):
 *
 *   the system turn:  [SYSTEM, trimmed]<|tool>declaration:NAME{description:<|"|>…<|"|>,parameters:{…}}<tool|>…
 *   a call:           <|tool_call>call:NAME{key:VALUE,…}<tool_call|>
 *   a result:         <|tool_response>response:NAME{key:VALUE,…}<tool_response|>   (an object), or
 *                     <|tool_response>response:NAME{value:VALUE}<tool_response|>   (anything else)
 *
 * Values: strings between <|"|> tokens with nothing escaped, numbers as Python prints them, true and
 * false, None for null, [a,b] lists, {k:v} objects with keys in case-insensitive order (Jinja's
 * dictsort) — bare in calls and results, between <|"|> tokens inside declarations. A declaration's
 * parameters follow the template's own walk of the JSON Schema (format_parameters below), quirks
 * included, since that is the text the model was trained on.
 *
 * The results go into the model turn of the calls, after them (a tool message is no turn of its own):
 * an assistant message with tool_calls, the tool messages after it and, when the calls' message has no
 * text and the next assistant message has no calls, that message's text make one model turn; a turn
 * that ends with results is left open, and the model answers in it (tokenizer/chat.c writes the turns
 * from tool_text). Replies are read back by ib_gemma4_tool_calls_read. Contracts in api.h / tool_text.h.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "server/api.h"
#include "server/tool_text.h"

#define Q "<|\"|>"                 /* the string delimiter token */
#define MAX_DEPTH 64                /* nesting of schemas and values written or read */
static const char call_open[] = "<|tool_call>", call_close[] = "<tool_call|>";

/* ------------------------------------------------------------------ values */

/* Jinja truthiness of a JSON value (absent: false). */
static int truthy(json_t *v) {
    if (!v || json_is_null(v) || json_is_false(v)) return 0;
    if (json_is_integer(v)) return json_integer_value(v) != 0;
    if (json_is_real(v)) return json_real_value(v) != 0.0;
    if (json_is_string(v)) return json_string_length(v) > 0;
    if (json_is_array(v)) return json_array_size(v) > 0;
    if (json_is_object(v)) return json_object_size(v) > 0;
    return 1;
}

/* A finite double as Python's repr writes it: the shortest digits that read back to it, positional
 * from 1e-4 up to (not including) 1e16 with at least one digit after the point, else d.ddde±XX. */
static void put_py_float(ib_tbuf *b, double v) {
    char e[40], out[64];
    int prec;
    for (prec = 1; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    snprintf(e, sizeof e, "%.*e", prec - 1, v);
    char digits[24];
    int nd = 0, neg = e[0] == '-';
    const char *p = e + neg;
    for (; *p && *p != 'e'; p++)
        if (isdigit((unsigned char)*p)) digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            o += (size_t)snprintf(out + o, sizeof out - o, "0.");
            for (int k = 0; k < -exp10 - 1; k++) out[o++] = '0';
            o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits);
        } else {
            for (int k = 0; k <= exp10; k++) out[o++] = k < nd ? digits[k] : '0';
            out[o++] = '.';
            if (nd > exp10 + 1) o += (size_t)snprintf(out + o, sizeof out - o, "%s", digits + exp10 + 1);
            else out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) o += (size_t)snprintf(out + o, sizeof out - o, ".%s", digits + 1);
        snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    ib_tbuf_puts(b, out);
}

/* The next code point of s[*i..n) lower-cased (utf8proc's simple mapping; a bad byte as itself). */
static int32_t lower_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t c;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &c);
    if (l < 1) {
        c = (unsigned char)s[*i];
        l = 1;
    }
    *i += (size_t)l;
    return utf8proc_tolower(c);
}

typedef struct key_ref {
    const char *key;
    size_t len, index;
    json_t *value;
} key_ref;

/* Jinja's dictsort: keys compared lower-cased, code point by code point; equal ones keep their order. */
static int key_cmp(const void *a, const void *b) {
    const key_ref *x = a, *y = b;
    size_t i = 0, j = 0;
    while (i < x->len && j < y->len) {
        int32_t p = lower_cp(x->key, x->len, &i), q = lower_cp(y->key, y->len, &j);
        if (p != q) return p < q ? -1 : 1;
    }
    if (i < x->len || j < y->len) return i < x->len ? 1 : -1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The members of object o in dictsort order, malloc'ed (*n of them); NULL with *n 0 when o is empty
 * or memory runs out (*oom set then). */
static key_ref *sorted_keys(json_t *o, size_t *n, int *oom) {
    *n = json_object_size(o);
    if (!*n) return NULL;
    key_ref *k = malloc(*n * sizeof *k);
    if (!k) {
        *oom = 1;
        *n = 0;
        return NULL;
    }
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        k[i] = (key_ref){key, strlen(key), i, v};
        i++;
    }
    qsort(k, *n, sizeof *k, key_cmp);
    return k;
}

/* The template's format_argument: v in Gemma 4's value syntax, object keys between <|"|> tokens when
 * escape_keys. */
static void put_value(ib_tbuf *b, json_t *v, int escape_keys, int depth) {
    if (depth > MAX_DEPTH) {
        b->oom = 1;   /* callers bound the depth first; never reached from them */
        return;
    }
    if (json_is_string(v)) {
        ib_tbuf_puts(b, Q);
        ib_tbuf_put(b, json_string_value(v), json_string_length(v));
        ib_tbuf_puts(b, Q);
    } else if (json_is_boolean(v)) {
        ib_tbuf_puts(b, json_is_true(v) ? "true" : "false");
    } else if (json_is_object(v)) {
        size_t n;
        int oom = 0;
        key_ref *k = sorted_keys(v, &n, &oom);
        if (oom) b->oom = 1;
        ib_tbuf_puts(b, "{");
        for (size_t i = 0; i < n; i++) {
            if (i) ib_tbuf_puts(b, ",");
            if (escape_keys) ib_tbuf_puts(b, Q);
            ib_tbuf_put(b, k[i].key, k[i].len);
            if (escape_keys) ib_tbuf_puts(b, Q);
            ib_tbuf_puts(b, ":");
            put_value(b, k[i].value, escape_keys, depth + 1);
        }
        ib_tbuf_puts(b, "}");
        free(k);
    } else if (json_is_array(v)) {
        ib_tbuf_puts(b, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) ib_tbuf_puts(b, ",");
            put_value(b, json_array_get(v, i), escape_keys, depth + 1);
        }
        ib_tbuf_puts(b, "]");
    } else if (json_is_integer(v)) {
        char s[32];
        snprintf(s, sizeof s, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        ib_tbuf_puts(b, s);
    } else if (json_is_real(v)) {
        put_py_float(b, json_real_value(v));
    } else {
        ib_tbuf_puts(b, "None");
    }
}

/* How deep v nests below its own level (a scalar or an empty container: 0; {"a":[1]}: 2 - 1 = 1): what
 * is written must be below MAX_DEPTH, so that its containers are at most MAX_DEPTH levels, as the
 * reader takes them. */
static int depth_of(json_t *v) {
    int d = 0;
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            int e = depth_of(x) + 1;
            if (e > d) d = e;
            if (d > MAX_DEPTH) break;
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v) && d <= MAX_DEPTH; i++) {
            int e = depth_of(json_array_get(v, i)) + 1;
            if (e > d) d = e;
        }
    }
    return d;
}

/* ------------------------------------------------------------------ declarations */

typedef struct decl {
    ib_tbuf *b;
    char *why;
    size_t wsz;
} decl;

static int refuse(decl *d, const char *path, const char *what) {
    snprintf(d->why, d->wsz, "%.160s: %s (Gemma 4's tool declarations)", path, what);
    return -1;
}

/* A schema type upper-cased in ASCII, as the template's upper filter gives it for ASCII text. */
static void put_upper(ib_tbuf *b, const char *s) {
    for (; *s; s++) {
        char c = (char)toupper((unsigned char)*s);
        ib_tbuf_put(b, &c, 1);
    }
}

/* A "required" list: [<|"|>a<|"|>,…] of strings. */
static int put_required(decl *d, json_t *req, const char *path) {
    if (!json_is_array(req)) return refuse(d, path, "required must be an array of strings");
    ib_tbuf_puts(d->b, "[");
    for (size_t i = 0; i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) return refuse(d, path, "required must be an array of strings");
        if (i) ib_tbuf_puts(d->b, ",");
        ib_tbuf_puts(d->b, Q);
        ib_tbuf_put(d->b, json_string_value(r), json_string_length(r));
        ib_tbuf_puts(d->b, Q);
    }
    ib_tbuf_puts(d->b, "]");
    return 0;
}

static int put_params(decl *d, json_t *props, const char *path, int depth);

/* The template's items block of an array property (items an object with members): its members in
 * dictsort order, nulls skipped; properties, required and type written its way, the rest as values. */
static int put_items(decl *d, json_t *items, const char *path, int depth) {
    size_t n;
    int oom = 0, first = 1;
    key_ref *k = sorted_keys(items, &n, &oom);
    if (oom) return -2;
    ib_tbuf_puts(d->b, ",items:{");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *v = k[i].value;
        if (json_is_null(v)) continue;
        if (!first) ib_tbuf_puts(d->b, ",");
        first = 0;
        if (!strcmp(k[i].key, "properties")) {
            ib_tbuf_puts(d->b, "properties:{");
            if (json_is_object(v)) rc = put_params(d, v, path, depth + 1);
            ib_tbuf_puts(d->b, "}");
        } else if (!strcmp(k[i].key, "required")) {
            ib_tbuf_puts(d->b, "required:");
            rc = put_required(d, v, path);
        } else if (!strcmp(k[i].key, "type")) {
            ib_tbuf_puts(d->b, "type:");
            if (json_is_string(v)) {
                ib_tbuf_puts(d->b, Q);
                put_upper(d->b, json_string_value(v));
                ib_tbuf_puts(d->b, Q);
            } else if (json_is_array(v)) {
                ib_tbuf_puts(d->b, "[");
                for (size_t j = 0; j < json_array_size(v) && !rc; j++) {
                    json_t *t = json_array_get(v, j);
                    if (!json_is_string(t)) rc = refuse(d, path, "items.type must be a string or an array of strings");
                    else {
                        if (j) ib_tbuf_puts(d->b, ",");
                        ib_tbuf_puts(d->b, Q);
                        put_upper(d->b, json_string_value(t));
                        ib_tbuf_puts(d->b, Q);
                    }
                }
                ib_tbuf_puts(d->b, "]");
            } else {
                rc = refuse(d, path, "items.type must be a string or an array of strings");
            }
        } else {
            ib_tbuf_put(d->b, k[i].key, k[i].len);
            ib_tbuf_puts(d->b, ":");
            put_value(d->b, v, 1, 0);
        }
    }
    free(k);
    ib_tbuf_puts(d->b, "}");
    return rc;
}

/* The template's format_parameters: the members of props (each a property's schema) in dictsort
 * order, those named description, type, properties, required or nullable skipped, each as
 * NAME:{description:…,nullable:true,enum:[…] / ,properties:{…},required:[…] / ,items:{…},type:<|"|>T<|"|>}
 * (the template's commas, which it leaves out before type after properties or items, kept). T: the
 * type, or an array type's first element, upper-cased; a property without one (anyOf, say) or that is
 * no object (additionalProperties: false, say) gets the empty type, as the templates that do not stop
 * there write it. A description that is an array or an object is refused. 0; -1 refused (d->why); -2
 * out of memory. */
static int put_params(decl *d, json_t *props, const char *path, int depth) {
    static const char *const standard[] = {"description", "type", "properties", "required", "nullable"};
    if (depth > MAX_DEPTH) return refuse(d, path, "nested more than 64 deep");
    size_t n;
    int oom = 0, first = 1, rc = 0;
    key_ref *k = sorted_keys(props, &n, &oom);
    if (oom) return -2;
    for (size_t i = 0; i < n && !rc; i++) {
        int skip = 0;
        for (size_t s = 0; s < sizeof standard / sizeof standard[0]; s++) skip |= !strcmp(k[i].key, standard[s]);
        if (skip) continue;
        char sub[200];
        snprintf(sub, sizeof sub, "%s.%.*s", path, (int)(k[i].len > 48 ? 48 : k[i].len), k[i].key);
        /* a member that is no object reads as an empty one; no type (an anyOf, say) as the empty type */
        json_t *v = k[i].value, *ty = json_object_get(v, "type");
        const char *type = json_is_string(ty) ? json_string_value(ty)
                           : json_is_array(ty) && json_is_string(json_array_get(ty, 0)) ? json_string_value(json_array_get(ty, 0))
                                                                                        : "";
        json_t *desc = json_object_get(v, "description");
        if (truthy(desc) && (json_is_array(desc) || json_is_object(desc))) {
            rc = refuse(d, sub, "description must be a string");
            break;
        }
        if (!first) ib_tbuf_puts(d->b, ",");
        first = 0;
        ib_tbuf_put(d->b, k[i].key, k[i].len);
        ib_tbuf_puts(d->b, ":{");
        int comma = 0;
        if (truthy(desc)) {   /* (a number or a boolean as Python prints it) */
            ib_tbuf_puts(d->b, "description:" Q);
            if (json_is_string(desc)) ib_tbuf_put(d->b, json_string_value(desc), json_string_length(desc));
            else if (json_is_boolean(desc)) ib_tbuf_puts(d->b, "True");
            else put_value(d->b, desc, 0, 0);
            ib_tbuf_puts(d->b, Q);
            comma = 1;
        }
        if (truthy(json_object_get(v, "nullable"))) {
            ib_tbuf_puts(d->b, comma ? ",nullable:true" : "nullable:true");
            comma = 1;
        }
        ib_tbuf up = {0};
        put_upper(&up, type);
        const char *T = up.p ? up.p : "";
        if (up.oom) rc = -2;
        else if (!strcmp(T, "STRING")) {
            json_t *en = json_object_get(v, "enum");
            if (truthy(en)) {
                if (depth_of(en) >= MAX_DEPTH) {
                    rc = refuse(d, sub, "enum nested more than 64 deep");
                } else {
                    ib_tbuf_puts(d->b, comma ? ",enum:" : "enum:");
                    put_value(d->b, en, 1, 0);
                    comma = 1;
                }
            }
        } else if (!strcmp(T, "OBJECT")) {
            json_t *pp = json_object_get(v, "properties");
            ib_tbuf_puts(d->b, ",properties:{");
            rc = put_params(d, json_is_object(pp) ? pp : v, sub, depth + 1);
            ib_tbuf_puts(d->b, "}");
            json_t *req = json_object_get(v, "required");
            if (!rc && truthy(req)) {
                ib_tbuf_puts(d->b, ",required:");
                rc = put_required(d, req, sub);
            }
        } else if (!strcmp(T, "ARRAY")) {
            json_t *it = json_object_get(v, "items");
            if (json_is_object(it) && json_object_size(it)) {
                if (depth_of(it) >= MAX_DEPTH) rc = refuse(d, sub, "items nested more than 64 deep");
                else rc = put_items(d, it, sub, depth);
            }
        }
        if (!rc) {
            ib_tbuf_puts(d->b, comma ? ",type:" Q : "type:" Q);
            ib_tbuf_puts(d->b, T);
            ib_tbuf_puts(d->b, Q "}");
        }
        free(up.p);
    }
    free(k);
    return rc;
}

/* <|tool>declaration:NAME{…}<tool|> of tools[i] (checked by ib_api_tools), as the template's
 * format_function_declaration writes it. 0; -1 refused; -2 out of memory. */
static int put_declaration(decl *d, json_t *tool, size_t i) {
    json_t *f = json_object_get(tool, "function"), *desc = json_object_get(f, "description");
    json_t *params = json_object_get(f, "parameters");
    char path[64];
    snprintf(path, sizeof path, "tools[%zu].function.parameters", i);
    ib_tbuf_puts(d->b, "<|tool>declaration:");
    ib_tbuf_puts(d->b, json_string_value(json_object_get(f, "name")));
    ib_tbuf_puts(d->b, "{description:" Q);
    if (json_is_string(desc)) ib_tbuf_put(d->b, json_string_value(desc), json_string_length(desc));
    ib_tbuf_puts(d->b, Q);
    if (truthy(params)) {
        json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
        json_t *ty = json_object_get(params, "type");
        ib_tbuf_puts(d->b, ",parameters:{");
        if (truthy(props)) {
            if (!json_is_object(props)) return refuse(d, path, "properties must be an object");
            ib_tbuf_puts(d->b, "properties:{");
            int rc = put_params(d, props, path, 0);
            if (rc) return rc;
            ib_tbuf_puts(d->b, "},");
        }
        if (truthy(req)) {
            ib_tbuf_puts(d->b, "required:");
            if (put_required(d, req, path)) return -1;
            ib_tbuf_puts(d->b, ",");
        }
        if (truthy(ty)) {
            if (!json_is_string(ty)) return refuse(d, path, "type must be a string");
            ib_tbuf_puts(d->b, "type:" Q);
            put_upper(d->b, json_string_value(ty));
            ib_tbuf_puts(d->b, Q "}");
        }
    }
    ib_tbuf_puts(d->b, "}<tool|>");
    return d->b->oom ? -2 : 0;
}

/* ------------------------------------------------------------------ the messages */

/* <|tool_call>call:NAME{…}<tool_call|> for each call of messages[i] (checked: arguments must be the
 * JSON text of an object). 0; -1 with why. */
static int put_calls(ib_tbuf *b, json_t *calls, size_t i, char *why, size_t wsz) {
    for (size_t j = 0; j < json_array_size(calls); j++) {
        const char *name;
        json_t *args;
        if (ib_tool_call_check(calls, i, j, &name, &args, why, wsz)) return -1;
        json_t *a = json_loadb(json_string_value(args), json_string_length(args), JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(a) || depth_of(a) >= MAX_DEPTH) {
            json_decref(a);
            snprintf(why, wsz, "messages[%zu].tool_calls[%zu].function.arguments must be the JSON text of an object "
                               "(Gemma 4 writes a call's arguments as its members)", i, j);
            return -1;
        }
        ib_tbuf_puts(b, call_open);
        ib_tbuf_puts(b, "call:");
        ib_tbuf_puts(b, name);
        put_value(b, a, 0, 0);   /* {k:v,…}: the arguments' members, keys bare */
        ib_tbuf_puts(b, call_close);
        json_decref(a);
    }
    return 0;
}

typedef struct call_id {
    const char *id;
    size_t len, k;   /* the id's length; the call's index */
} call_id;

static int call_id_cmp(const void *a, const void *b) {
    const call_id *x = a, *y = b;
    int c = memcmp(x->id, y->id, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* The calls' string ids sorted (by bytes, then by index), malloc'ed; *n of them. NULL with *n 0 when
 * there are none or memory runs out (the names then come by position: the caller checks *oom). */
static call_id *call_ids(json_t *calls, size_t *n, int *oom) {
    *n = 0;
    call_id *c = malloc((json_array_size(calls) + 1) * sizeof *c);
    if (!c) {
        *oom = 1;
        return NULL;
    }
    for (size_t j = 0; j < json_array_size(calls); j++) {
        json_t *id = json_object_get(json_array_get(calls, j), "id");
        if (json_is_string(id)) c[(*n)++] = (call_id){json_string_value(id), json_string_length(id), j};
    }
    qsort(c, *n, sizeof *c, call_id_cmp);
    return c;
}

/* The name a result answers: the first call of calls (its ids sorted in idx[n]) with the message's
 * tool_call_id, else the k-th call, else the tool_call_id itself, else "unknown" (as the template's
 * default). */
static const char *result_name(json_t *calls, const call_id *idx, size_t n, json_t *msg, size_t k) {
    json_t *id = json_object_get(msg, "tool_call_id");
    if (json_is_string(id) && n) {
        call_id key = {json_string_value(id), json_string_length(id), 0};
        size_t lo = 0, hi = n;   /* the first entry not below (id, 0) */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (call_id_cmp(&idx[mid], &key) < 0) lo = mid + 1;
            else hi = mid;
        }
        if (lo < n && idx[lo].len == key.len && !memcmp(idx[lo].id, key.id, key.len)) k = idx[lo].k;
        else if (k >= json_array_size(calls)) return json_string_value(id);
    } else if (k >= json_array_size(calls)) {
        return json_is_string(id) ? json_string_value(id) : "unknown";
    }
    return json_string_value(json_object_get(json_object_get(json_array_get(calls, k), "function"), "name"));
}

/* <|tool_response>response:NAME{…}<tool_response|> of a tool message's content: the JSON it holds
 * when it is JSON text (an object's members, anything else as value:…), else the text as a string. */
static void put_result(ib_tbuf *b, const char *name, json_t *content) {
    json_t *r = json_loadb(json_string_value(content), json_string_length(content), JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (r && depth_of(r) >= MAX_DEPTH) {
        json_decref(r);
        r = NULL;
    }
    ib_tbuf_puts(b, "<|tool_response>response:");
    ib_tbuf_puts(b, name);
    if (json_is_object(r)) {
        put_value(b, r, 0, 0);
    } else {
        ib_tbuf_puts(b, "{value:");
        put_value(b, r ? r : content, 0, 0);
        ib_tbuf_puts(b, "}");
    }
    ib_tbuf_puts(b, "<tool_response|>");
    json_decref(r);
}

int ib_gemma4_tool_messages(json_t *msgs, json_t *tools, ib_api_tool_msgs *o, const char **param, char *why, size_t wsz) {
    const size_t nm = json_array_size(msgs);
    ib_tbuf b = {0};
    size_t i = 0;
    const char *r;
    json_t *ct, *calls;
    if (ib_tool_msg_check(msgs, 0, &r, &ct, &calls, why, wsz)) return -1;
    const int sys0 = !strcmp(r, "system") || !strcmp(r, "developer");
    if (json_is_array(tools) && json_array_size(tools)) { /* the system turn: its text, then the declarations */
        decl d = {&b, why, wsz};
        for (size_t k = 0; k < json_array_size(tools); k++) {
            int rc = put_declaration(&d, json_array_get(tools, k), k);
            if (rc) {
                if (rc == -1 && param) *param = "tools";
                free(b.p);
                return rc;
            }
        }
        o->m[0].role = "system";
        o->m[0].content = sys0 ? json_string_value(ct) : "";
        if (!(o->m[0].tool_text = ib_tool_msgs_keep(o, &b))) {
            free(b.p);
            return -2;
        }
        o->n = 1;
        i = sys0 ? 1 : 0;
    }
    for (; i < nm; i++) {
        if (ib_tool_msg_check(msgs, i, &r, &ct, &calls, why, wsz)) return -1;
        ib_chat_msg *m = &o->m[o->n];
        m->role = !strcmp(r, "developer") ? "system" : r;
        m->content = ct ? json_string_value(ct) : "";
        if (!strcmp(r, "tool")) {
            snprintf(why, wsz, "messages[%zu]: a tool message must follow an assistant message with tool_calls "
                               "(Gemma 4 writes the results into that turn)", i);
            return -1;
        }
        if (calls) { /* the calls, the results after them and maybe the answer: one model turn */
            if (put_calls(&b, calls, i, why, wsz)) {
                free(b.p);
                return -1;
            }
            size_t k = 0, n_idx = 0;
            int oom = 0;
            call_id *idx = call_ids(calls, &n_idx, &oom);
            if (oom) {
                free(b.p);
                return -2;
            }
            for (; i + 1 < nm; i++, k++) {
                json_t *nr = json_object_get(json_array_get(msgs, i + 1), "role"), *rc_;
                const char *r2;
                if (!json_is_string(nr) || strcmp(json_string_value(nr), "tool")) break;
                if (ib_tool_msg_check(msgs, i + 1, &r2, &ct, &rc_, why, wsz)) {
                    free(idx);
                    free(b.p);
                    return -1;
                }
                put_result(&b, result_name(calls, idx, n_idx, json_array_get(msgs, i + 1), k), ct);
            }
            if (k && !m->content[0] && i + 1 < nm) { /* the next assistant message's text answers in this turn */
                const char *r3;
                json_t *c3, *k3;
                json_t *nr = json_object_get(json_array_get(msgs, i + 1), "role");
                if (json_is_string(nr) && !strcmp(json_string_value(nr), "assistant")) {
                    if (ib_tool_msg_check(msgs, i + 1, &r3, &c3, &k3, why, wsz)) {
                        free(idx);
                        free(b.p);
                        return -1;
                    }
                    if (!k3 && c3 && json_string_length(c3)) m->content = json_string_value(c3), i++;
                }
            }
            free(idx);
            if (!(m->tool_text = ib_tool_msgs_keep(o, &b))) {
                free(b.p);
                return -2;
            }
        }
        o->n++;
    }
    return 0;
}

/* ------------------------------------------------------------------ reading calls back */

typedef struct reader {
    const char *p, *end;
    int last_key_wins;   /* a key twice in an object: the last value kept (else no value) */
} reader;

static void skip_ws(reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int eat(reader *r, const char *s) {
    size_t n = strlen(s);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, s, n)) return 0;
    r->p += n;
    return 1;
}

static json_t *read_value(reader *r, int depth);

/* A string: <|"|>…<|"|>, the bytes between as they are (valid UTF-8, no delimiter or NUL inside). */
static json_t *read_string(reader *r) {
    if (!eat(r, Q)) return NULL;
    const char *s = r->p, *e = NULL;
    for (const char *q = s; q + strlen(Q) <= r->end; q++)
        if (!memcmp(q, Q, strlen(Q))) {
            e = q;
            break;
        }
    if (!e || memchr(s, 0, (size_t)(e - s))) return NULL;   /* (a NUL would end the text in C) */
    r->p = e + strlen(Q);
    return json_stringn(s, (size_t)(e - s));   /* NULL for bytes that are not UTF-8 */
}

/* A number in JSON's syntax: an integer when it has no fraction or exponent and fits, else a finite
 * double. */
static json_t *read_number(reader *r) {
    const char *s = r->p, *q = s;
    int real = 0;
    if (q < r->end && *q == '-') q++;
    if (q >= r->end || !isdigit((unsigned char)*q)) return NULL;
    if (*q == '0') q++;
    else
        while (q < r->end && isdigit((unsigned char)*q)) q++;
    if (q < r->end && *q == '.') {
        real = 1;
        if (++q >= r->end || !isdigit((unsigned char)*q)) return NULL;
        while (q < r->end && isdigit((unsigned char)*q)) q++;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        real = 1;
        q++;
        if (q < r->end && (*q == '+' || *q == '-')) q++;
        if (q >= r->end || !isdigit((unsigned char)*q)) return NULL;
        while (q < r->end && isdigit((unsigned char)*q)) q++;
    }
    char buf[64];
    if (q - s >= (long)sizeof buf) return NULL;
    memcpy(buf, s, (size_t)(q - s));
    buf[q - s] = 0;
    r->p = q;
    if (!real) {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (!errno) return json_integer((json_int_t)v);
    }
    double d = strtod(buf, NULL);
    return isfinite(d) ? json_real(d) : NULL;
}

/* {key:value,…}: keys bare (up to ':', none of {}[], or <|"|> inside, trailing blanks dropped) or
 * between <|"|> tokens; no key twice unless r->last_key_wins. */
static json_t *read_object(reader *r, int depth) {
    if (!eat(r, "{")) return NULL;
    json_t *o = json_object();
    if (!o) return NULL;
    skip_ws(r);
    if (eat(r, "}")) return o;
    for (;;) {
        skip_ws(r);
        char *key = NULL;
        if (r->end - r->p >= (long)strlen(Q) && !memcmp(r->p, Q, strlen(Q))) {
            json_t *ks = read_string(r);
            if (ks) key = strdup(json_string_value(ks));
            json_decref(ks);
        } else {
            const char *s = r->p;
            while (r->p < r->end && *r->p != ':' && !strchr("{}[],", *r->p)) r->p++;
            const char *e = r->p;
            while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) e--;
            if (e > s && !memchr(s, 0, (size_t)(e - s)) && !memmem(s, (size_t)(e - s), Q, strlen(Q)) &&
                (key = malloc((size_t)(e - s) + 1))) {
                memcpy(key, s, (size_t)(e - s));
                key[e - s] = 0;
            }
        }
        skip_ws(r);
        json_t *v = key && key[0] && eat(r, ":") ? (skip_ws(r), read_value(r, depth + 1)) : NULL;
        int ok = 0;
        if (v && json_object_get(o, key) && !r->last_key_wins) json_decref(v);     /* a key twice */
        else if (v) ok = !json_object_set_new(o, key, v);   /* (takes v; refuses a key that is not UTF-8) */
        free(key);
        if (!ok) break;
        skip_ws(r);
        if (eat(r, "}")) return o;
        if (!eat(r, ",")) break;
    }
    json_decref(o);
    return NULL;
}

/* [value,…] */
static json_t *read_array(reader *r, int depth) {
    if (!eat(r, "[")) return NULL;
    json_t *a = json_array();
    if (!a) return NULL;
    skip_ws(r);
    if (eat(r, "]")) return a;
    for (;;) {
        skip_ws(r);
        json_t *v = read_value(r, depth + 1);
        if (!v || json_array_append_new(a, v)) break;
        skip_ws(r);
        if (eat(r, "]")) return a;
        if (!eat(r, ",")) break;
    }
    json_decref(a);
    return NULL;
}

/* One value in Gemma 4's syntax (None and null both read as null), at most MAX_DEPTH deep. */
static json_t *read_value(reader *r, int depth) {
    if (depth > MAX_DEPTH || r->p >= r->end) return NULL;
    if (*r->p == '{') return read_object(r, depth);
    if (*r->p == '[') return read_array(r, depth);
    if (*r->p == '<') return read_string(r);
    if (eat(r, "true")) return json_true();
    if (eat(r, "false")) return json_false();
    if (eat(r, "null") || eat(r, "None")) return json_null();
    return read_number(r);
}

/* ib_gemma4_tool_calls_read, a key twice in an object read as its last value when last_key_wins. */
static json_t *read_calls(const char *text, size_t len, const char *id_base, int max_calls, size_t *content_len, int last_key_wins) {
    const char *first = ib_tool_first_call(text, len, call_open, "<|channel>", "<channel|>");   /* (thoughts) */
    if (!first) return NULL;
    json_t *calls = json_array();
    if (!calls) return NULL;
    reader r = {first, text + len, last_key_wins};
    while (r.p < r.end) {
        if (!eat(&r, call_open) || !eat(&r, "call:")) goto none;
        const char *name = r.p;
        while (r.p < r.end && *r.p != '{') r.p++;
        const size_t nl = (size_t)(r.p - name);
        char nm[65];
        if (nl < 1 || nl > 64) goto none;
        memcpy(nm, name, nl);
        nm[nl] = 0;
        if (!ib_tool_name_ok(nm, nl)) goto none;
        json_t *args = read_object(&r, 1);
        if (!args || !eat(&r, call_close)) {
            json_decref(args);
            goto none;   /* cut off (max_tokens) or not a call: the text stays text */
        }
        if (max_calls <= 0 || (int)json_array_size(calls) < max_calls) {
            char id[160];
            snprintf(id, sizeof id, "call_%s_%zu", id_base, json_array_size(calls));
            json_t *c = ib_tool_call_json(id, nm, args);
            if (!c || json_array_append_new(calls, c)) {
                json_decref(args);
                goto none;
            }
        }
        json_decref(args);
        skip_ws(&r);
    }
    *content_len = ib_tool_content_len(text, first);
    return calls;
none:
    json_decref(calls);
    return NULL;
}

json_t *ib_gemma4_tool_calls_read(const char *text, size_t len, const char *id_base, int max_calls, size_t *content_len) {
    return read_calls(text, len, id_base, max_calls, content_len, 0);
}

json_t *ib_gemma4_tool_calls_constrained(const char *name, const char *text, size_t len, const char *id_base, int parallel) {
    const size_t cl = strlen(call_close);
    ib_tbuf b = {0};
    ib_tbuf_puts(&b, call_open);
    ib_tbuf_puts(&b, "call:");
    if (name) ib_tbuf_puts(&b, name);
    ib_tbuf_put(&b, text, len);
    if (len < cl || memcmp(text + len - cl, call_close, cl)) ib_tbuf_puts(&b, call_close);
    size_t content_len = 0;
    /* (the mask holds a key the schema spells to once, not another key of an open object: such a key
     * written twice keeps its last value, as JSON.parse and Python's json read it) */
    json_t *calls = !b.oom ? read_calls(b.p, b.n, id_base, name || !parallel ? 1 : 0, &content_len, 1) : NULL;
    free(b.p);
    return calls;
}
