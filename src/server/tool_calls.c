/*
 * tool_calls.c — OpenAI function calling (tools, tool_choice, assistant tool_calls, tool messages) in
 * the chat form of Qwen's templates (ChatML whose template writes <tool_call> blocks):
 *
 *   the system turn:  [SYSTEM\n\n]# Tools\n\nYou may call one or more functions to assist with the user
 *                     query.\n\nYou are provided with function signatures within <tools></tools> XML
 *                     tags:\n<tools>\n{tool 1 as JSON}\n{tool 2}…\n</tools>\n\nFor each function call,
 *                     return a json object with function name and arguments within <tool_call></tool_call>
 *                     XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}
 *                     \n</tool_call>
 *   a call:           <tool_call>\n{"name": "NAME", "arguments": ARGUMENTS}\n</tool_call>   (after the
 *                     turn's text, separated by \n from it and from each other)
 *   tool results:     one user turn per run of tool messages, each result as
 *                     <tool_response>\nCONTENT\n</tool_response>, joined by \n
 *
 * The tools are written as JSON with ", " and ": " separators and non-ASCII characters as they are (the
 * templates' tojson). Requests are checked here (every field named when refused) and the reply's text is
 * read back into tool_calls. Contracts in api.h.
 */
#include "server/api.h"
#include "server/tool_text.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char tools_head[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char tools_tail[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";
static const char call_open[] = "<tool_call>", call_close[] = "</tool_call>";

int ib_tool_name_ok(const char *s, size_t n) {
    if (n < 1 || n > 64 || strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-') return 0;
    return 1;
}

/* tools[i], checked: {"type": "function", "function": {"name", "description"?, "parameters"?,
 * "strict"?}}, nothing else. */
static int tool_check(json_t *t, size_t i, const char **param, char *msg, size_t msz) {
    const char *k;
    json_t *v;
    if (!json_is_object(t) || !json_is_string(json_object_get(t, "type")) ||
        strcmp(json_string_value(json_object_get(t, "type")), "function") || !json_is_object(json_object_get(t, "function")))
        return ib_api_failf(param, "tools", msg, msz, "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
    json_object_foreach(t, k, v) if (strcmp(k, "type") && strcmp(k, "function")) {
        return ib_api_failf(param, "tools", msg, msz, "tools[%zu].%.40s is not a field of a tool", i, k);
    }
    json_t *f = json_object_get(t, "function"), *nm = json_object_get(f, "name");
    json_object_foreach(f, k, v) {
        if (!strcmp(k, "name")) continue;
        if (!strcmp(k, "description") && json_is_string(v)) continue;
        if (!strcmp(k, "parameters") && json_is_object(v)) continue;
        if (!strcmp(k, "strict") && json_is_boolean(v)) continue;
        if (!strcmp(k, "description") || !strcmp(k, "parameters") || !strcmp(k, "strict"))
            return ib_api_failf(param, "tools", msg, msz, "tools[%zu].function.%s must be %s", i, k,
                                !strcmp(k, "parameters") ? "an object (a JSON Schema)" : !strcmp(k, "strict") ? "a boolean" : "a string");
        return ib_api_failf(param, "tools", msg, msz, "tools[%zu].function.%.40s is not a field of a function", i, k);
    }
    if (!json_is_string(nm) || !ib_tool_name_ok(json_string_value(nm), json_string_length(nm)))
        return ib_api_failf(param, "tools", msg, msz, "tools[%zu].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i);
    return 0;
}

/* The tool of tools named name, or NULL. */
static json_t *tool_named(json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *nm = json_object_get(json_object_get(t, "function"), "name");
        if (json_is_string(nm) && !strcmp(json_string_value(nm), name)) return t;
    }
    return NULL;
}

json_t *ib_api_tool_arguments_format(json_t *function) {
    json_t *params = json_object_get(function, "parameters");
    json_t *schema = params ? json_incref(params) : json_pack("{s:s}", "type", "object");
    return schema ? json_pack("{s:s, s:{s:s, s:o}}", "type", "json_schema", "json_schema", "name", "arguments", "schema", schema)
                  : NULL;
}

/* The checks of a tool_choice that makes the reply a call of function (a named one, or each tool
 * under "required"; how: the choice as the messages name it): the body has no response_format but
 * text (the call's arguments follow the function's parameters), and those parameters compile in the
 * json_schema subset. 0; -1 (a bad value) or -2 (a keyword outside the subset) with param and msg;
 * -3 out of memory. */
static int call_checks(json_t *body, json_t *function, const char *how, const char *where, const char **param,
                       char *msg, size_t msz) {
    json_t *rf = json_object_get(body, "response_format");
    const char *rt = json_string_value(json_object_get(rf, "type"));
    if (rf && !json_is_null(rf) && !(rt && !strcmp(rt, "text")))
        return ib_api_failf(param, "response_format", msg, msz, "response_format cannot be combined with %s (the call's "
                            "arguments follow the function's parameters)", how);
    json_t *arf = ib_api_tool_arguments_format(function);
    char fm[256];
    if (!arf) {
        snprintf(msg, msz, "out of memory");
        return -3;
    }
    const int fbad = ib_json_format_check(arf, fm, sizeof fm);
    int object = 0, rc = 0;
    if (!fbad) {   /* a call's arguments are an object: the schema must let one begin */
        ib_json_state st;
        rc = ib_json_setup(&st, arf);
        object = rc == 1 && !ib_json_step(&st, '{');
        ib_json_release(&st);
    }
    json_decref(arf);
    if (fbad) {
        ib_api_failf(param, "tools", msg, msz, "the parameters of '%s' (%s): %s",
                     json_string_value(json_object_get(function, "name")), where, fm);
        return strstr(fm, "not supported") ? -2 : -1;
    }
    if (rc < 0) {
        snprintf(msg, msz, "out of memory");
        return -3;
    }
    if (!object)
        return ib_api_failf(param, "tools", msg, msz, "the parameters of '%s' (%s) must describe an object: a call's "
                            "arguments are one", json_string_value(json_object_get(function, "name")), where);
    return 0;
}

int ib_api_tools(json_t *body, ib_api_tool_use *out, const char **param, char *msg, size_t msz) {
    memset(out, 0, sizeof *out);
    out->parallel = 1;
    json_t *tools = json_object_get(body, "tools"), *tc = json_object_get(body, "tool_choice");
    json_t *par = json_object_get(body, "parallel_tool_calls");
    if (par && !json_is_null(par)) {
        if (!json_is_boolean(par)) return ib_api_failf(param, "parallel_tool_calls", msg, msz, "parallel_tool_calls must be a boolean");
        out->parallel = json_is_true(par);
    }
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return ib_api_failf(param, "tools", msg, msz, "tools must be an array of tools");
    size_t nt = json_is_array(tools) ? json_array_size(tools) : 0, i;
    if (nt > IB_API_MAX_TOOLS) return ib_api_failf(param, "tools", msg, msz, "tools holds %zu tools, more than %d", nt, IB_API_MAX_TOOLS);
    json_t *t;
    for (i = 0; i < nt; i++) {
        if (tool_check(json_array_get(tools, i), i, param, msg, msz)) return -1;
        const char *nm = json_string_value(json_object_get(json_object_get(json_array_get(tools, i), "function"), "name"));
        for (size_t j = 0; j < i; j++) {
            t = json_array_get(tools, j);
            if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), nm))
                return ib_api_failf(param, "tools", msg, msz, "tools[%zu] and tools[%zu] are both named '%s'", j, i, nm);
        }
    }
    const char *choice = json_is_string(tc) ? json_string_value(tc) : NULL;
    if (tc && !json_is_null(tc) && !choice && !json_is_object(tc))
        return ib_api_failf(param, "tool_choice", msg, msz, "tool_choice must be \"none\", \"auto\", \"required\" or "
                                                            "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (choice && strcmp(choice, "none") && strcmp(choice, "auto") && strcmp(choice, "required"))
        return ib_api_failf(param, "tool_choice", msg, msz, "tool_choice must be \"none\", \"auto\", \"required\" or "
                                                            "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (!nt && choice && strcmp(choice, "none"))
        return ib_api_failf(param, "tool_choice", msg, msz, "tool_choice \"%s\" needs tools", choice);
    if (json_is_object(tc)) {
        json_t *f = json_object_get(tc, "function"), *nm = json_object_get(f, "name");
        const char *k;
        json_t *v;
        int shape = json_is_string(json_object_get(tc, "type")) && !strcmp(json_string_value(json_object_get(tc, "type")), "function") &&
                    json_is_object(f) && json_is_string(nm) && json_object_size(f) == 1;
        json_object_foreach(tc, k, v) shape = shape && (!strcmp(k, "type") || !strcmp(k, "function"));
        if (!shape)
            return ib_api_failf(param, "tool_choice", msg, msz, "tool_choice must be \"none\", \"auto\", \"required\" or "
                                                                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!nt) return ib_api_failf(param, "tool_choice", msg, msz, "tool_choice names a function but tools is empty");
        json_t *tool = tool_named(tools, json_string_value(nm));
        if (!tool) return ib_api_failf(param, "tool_choice", msg, msz, "tool_choice names '%.64s', which is not in tools", json_string_value(nm));
        out->mode = IB_TOOLS_FORCED;
        out->forced = json_object_get(tool, "function");
        snprintf(out->name, sizeof out->name, "%s", json_string_value(nm));
        int rc = call_checks(body, out->forced, "a named tool_choice", "tool_choice", param, msg, msz);
        if (rc) return rc;
    } else if (choice && !strcmp(choice, "required")) {
        out->mode = IB_TOOLS_REQUIRED;
        for (i = 0; i < nt; i++) {
            int rc = call_checks(body, json_object_get(json_array_get(tools, i), "function"), "tool_choice \"required\"",
                                 "tool_choice \"required\"", param, msg, msz);
            if (rc) return rc;
        }
    } else if (nt && (!choice || !strcmp(choice, "auto"))) {
        out->mode = IB_TOOLS_AUTO;
    }
    if (out->mode != IB_TOOLS_OFF) out->tools = tools;
    return 0;
}

/* ------------------------------------------------------------------ the messages in Qwen's form */

void ib_tbuf_put(ib_tbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q, b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
void ib_tbuf_puts(ib_tbuf *b, const char *s) { ib_tbuf_put(b, s, strlen(s)); }

/* JSON text of v as the templates' tojson writes it: ", " and ": " separators, keys in their order,
 * non-ASCII characters as they are. */
static void put_json(ib_tbuf *b, json_t *v) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!s) {
        b->oom = 1;
        return;
    }
    ib_tbuf_puts(b, s);
    free(s);
}

const char *ib_tool_msgs_keep(ib_api_tool_msgs *o, ib_tbuf *b) {
    if (b->oom) return NULL;
    char **q = realloc(o->own, (o->n_own + 1) * sizeof *q);
    if (!q) return NULL;
    o->own = q;
    o->own[o->n_own++] = b->p ? b->p : strdup("");
    b->p = NULL, b->n = b->cap = 0;
    return o->own[o->n_own - 1];
}

void ib_api_tool_msgs_free(ib_api_tool_msgs *o) {
    for (size_t i = 0; i < o->n_own; i++) free(o->own[i]);
    free(o->own);
    free(o->m);
    memset(o, 0, sizeof *o);
}

int ib_tool_call_check(json_t *calls, size_t i, size_t j, const char **name, json_t **args, char *why, size_t wsz) {
    json_t *c = json_array_get(calls, j), *f = json_object_get(c, "function"), *nm = json_object_get(f, "name");
    json_t *ty = json_object_get(c, "type");
    *args = json_object_get(f, "arguments");
    if (!json_is_object(c) || !json_is_object(f) || (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "function")))) {
        snprintf(why, wsz, "messages[%zu].tool_calls[%zu] must be {\"id\", \"type\": \"function\", \"function\": "
                           "{\"name\", \"arguments\"}}", i, j);
        return -1;
    }
    if (!json_is_string(nm) || !ib_tool_name_ok(json_string_value(nm), json_string_length(nm))) {
        snprintf(why, wsz, "messages[%zu].tool_calls[%zu].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i, j);
        return -1;
    }
    if (!json_is_string(*args)) {
        snprintf(why, wsz, "messages[%zu].tool_calls[%zu].function.arguments must be a string (JSON text)", i, j);
        return -1;
    }
    *name = json_string_value(nm);
    return 0;
}

int ib_tool_msg_check(json_t *msgs, size_t i, const char **role, json_t **content, json_t **calls, char *why, size_t wsz) {
    json_t *m = json_array_get(msgs, i), *rv = json_object_get(m, "role"), *ct = json_object_get(m, "content");
    json_t *tc = json_object_get(m, "tool_calls");
    const char *r = json_is_string(rv) ? json_string_value(rv) : "";
    if (!json_is_object(m) || !json_is_string(rv) || strlen(r) != json_string_length(rv)) {
        snprintf(why, wsz, "messages[%zu] needs a string role", i);
        return -1;
    }
    const int is_asst = !strcmp(r, "assistant");
    if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && !is_asst && strcmp(r, "tool")) {
        snprintf(why, wsz, "messages[%zu].role '%.40s' is not system, developer, user, assistant or tool", i, r);
        return -1;
    }
    if (tc && json_is_null(tc)) tc = NULL;
    if (!json_is_string(ct) && !(is_asst && tc && (!ct || json_is_null(ct)))) {
        snprintf(why, wsz, "messages[%zu] needs a string content", i);
        return -1;
    }
    if (tc && !is_asst) {
        snprintf(why, wsz, "messages[%zu]: only assistant messages carry tool_calls", i);
        return -1;
    }
    if (tc && (!json_is_array(tc) || json_array_size(tc) < 1)) {
        snprintf(why, wsz, "messages[%zu].tool_calls must be a non-empty array", i);
        return -1;
    }
    *role = r;
    *content = json_is_string(ct) ? ct : NULL;
    *calls = tc;
    return 0;
}

/* Message i's tool_calls, checked, written after what b holds (as the template writes them). */
static int put_calls(ib_tbuf *b, json_t *calls, size_t i, int had_text, char *why, size_t wsz) {
    for (size_t j = 0; j < json_array_size(calls); j++) {
        const char *name;
        json_t *args;
        if (ib_tool_call_check(calls, i, j, &name, &args, why, wsz)) return -1;
        if (had_text || j > 0) ib_tbuf_puts(b, "\n");
        ib_tbuf_puts(b, call_open);
        ib_tbuf_puts(b, "\n{\"name\": \"");
        ib_tbuf_puts(b, name);
        ib_tbuf_puts(b, "\", \"arguments\": ");
        ib_tbuf_put(b, json_string_value(args), json_string_length(args));
        ib_tbuf_puts(b, "}\n");
        ib_tbuf_puts(b, call_close);
    }
    return 0;
}

/* ib_api_tool_messages in Qwen's form (this file's header). */
static int qwen_messages(json_t *msgs, json_t *tools, ib_api_tool_msgs *o, char *why, size_t wsz) {
    const size_t nm = json_array_size(msgs);
    ib_tbuf b = {0};
    size_t i = 0;
    int rc = 0;
    const int ntools = json_is_array(tools) ? (int)json_array_size(tools) : 0;
    const char *first_role = json_string_value(json_object_get(json_array_get(msgs, 0), "role"));
    const int sys0 = first_role && (!strcmp(first_role, "system") || !strcmp(first_role, "developer"));
    if (ntools) { /* the system turn: the system message's text, then the tools */
        json_t *ct = sys0 ? json_object_get(json_array_get(msgs, 0), "content") : NULL;
        if (sys0 && !json_is_string(ct)) {
            snprintf(why, wsz, "messages[0] needs a string content");
            rc = -1;
            goto out;
        }
        if (sys0) {
            ib_tbuf_put(&b, json_string_value(ct), json_string_length(ct));
            ib_tbuf_puts(&b, "\n\n");
        }
        ib_tbuf_puts(&b, tools_head);
        size_t k;
        json_t *t;
        json_array_foreach(tools, k, t) {
            ib_tbuf_puts(&b, "\n");
            put_json(&b, t);
        }
        ib_tbuf_puts(&b, tools_tail);
        o->m[o->n].role = "system";
        if (!(o->m[o->n++].content = ib_tool_msgs_keep(o, &b))) goto oom;
        i = sys0 ? 1 : 0;
    }
    for (; i < nm; i++) {
        const char *r;
        json_t *ct, *calls;
        if (ib_tool_msg_check(msgs, i, &r, &ct, &calls, why, wsz)) {
            rc = -1;
            goto out;
        }
        if (!strcmp(r, "tool")) { /* a run of tool messages: one user turn */
            for (;;) {
                ib_tbuf_puts(&b, "<tool_response>\n");
                ib_tbuf_put(&b, json_string_value(ct), json_string_length(ct));
                ib_tbuf_puts(&b, "\n</tool_response>");
                json_t *nr = json_object_get(json_array_get(msgs, i + 1), "role");
                if (i + 1 >= nm || !json_is_string(nr) || strcmp(json_string_value(nr), "tool")) break;
                if (ib_tool_msg_check(msgs, ++i, &r, &ct, &calls, why, wsz)) {
                    rc = -1;
                    goto out;
                }
                ib_tbuf_puts(&b, "\n");
            }
            o->m[o->n].role = "user";
        } else {
            if (ct) ib_tbuf_put(&b, json_string_value(ct), json_string_length(ct));
            if (calls && put_calls(&b, calls, i, ct && json_string_length(ct) > 0, why, wsz)) {
                rc = -1;
                goto out;
            }
            o->m[o->n].role = !strcmp(r, "developer") ? "system" : r;
        }
        if (!(o->m[o->n++].content = ib_tool_msgs_keep(o, &b))) goto oom;
    }
out:
    free(b.p);
    return rc;
oom:
    free(b.p);
    return -2;
}

int ib_api_tool_messages(ib_chat_tool_form form, json_t *msgs, json_t *tools, ib_api_tool_msgs *o, const char **param, char *why,
                         size_t wsz) {
    memset(o, 0, sizeof *o);
    if (param) *param = "messages";
    size_t nm = json_is_array(msgs) ? json_array_size(msgs) : 0;
    if (nm < 1) {
        snprintf(why, wsz, "messages must be a non-empty array");
        return -1;
    }
    if (nm > IB_API_MAX_MESSAGES) {
        snprintf(why, wsz, "messages holds %zu messages, more than the limit of %d", nm, IB_API_MAX_MESSAGES);
        return -1;
    }
    if (!(o->m = calloc(nm + 1, sizeof *o->m))) return -2;
    int rc = form == IB_CHAT_TOOLS_GEMMA4 ? ib_gemma4_tool_messages(msgs, tools, o, param, why, wsz)
                                          : qwen_messages(msgs, tools, o, why, wsz);
    if (rc) ib_api_tool_msgs_free(o);
    return rc;
}

const char *ib_api_tool_call_marker(ib_chat_tool_form form) { return form == IB_CHAT_TOOLS_GEMMA4 ? "<|tool_call>" : call_open; }

char *ib_api_tool_call_prefix(ib_chat_tool_form form, const char *name) {
    ib_tbuf b = {0};
    if (form == IB_CHAT_TOOLS_GEMMA4) {
        ib_tbuf_puts(&b, "<|tool_call>call:");
        if (name) ib_tbuf_puts(&b, name);
        return b.oom ? (free(b.p), NULL) : b.p;
    }
    ib_tbuf_puts(&b, call_open);
    ib_tbuf_puts(&b, "\n{\"name\": \"");
    if (name) {
        ib_tbuf_puts(&b, name);
        ib_tbuf_puts(&b, "\", \"arguments\": ");
    }
    return b.oom ? (free(b.p), NULL) : b.p;
}

/* ------------------------------------------------------------------ reading calls back */

json_t *ib_tool_call_json(const char *id, const char *name, json_t *args) {
    char *a = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_t *c = a ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", name,
                              "arguments", a)
                  : NULL;
    free(a);
    return c;
}

const char *ib_tool_first_call(const char *text, size_t len, const char *open, const char *th_open, const char *th_close) {
    const char *p = text, *end = text ? text + len : NULL;
    while (p && p < end) {
        const char *c = memmem(p, (size_t)(end - p), open, strlen(open));
        const char *t = memmem(p, (size_t)(end - p), th_open, strlen(th_open));
        if (!c || !t || c < t) return c;
        const char *e = memmem(t, (size_t)(end - t), th_close, strlen(th_close));   /* a call inside: skip the thought */
        p = e ? e + strlen(th_close) : NULL;
    }
    return NULL;
}

/* ib_api_tool_calls_read; a key twice in an object is refused unless constrained (a reply decoded under
 * a mask, which holds a key the schema spells to once but not another key of an open object: such a
 * key written twice keeps its last value, as JSON.parse and Python's json read it). */
static json_t *read_calls(const char *text, size_t len, const char *id_base, int max_calls, size_t *content_len, int constrained) {
    const char *first = ib_tool_first_call(text, len, call_open, "<think>", "</think>");
    if (!first) return NULL;
    json_t *calls = json_array();
    if (!calls) return NULL;
    const char *p = first, *end = text + len;
    while (p) {
        /* the call's JSON value, then its close: read as JSON (so a string of its arguments may hold
         * "</tool_call>"), not cut at the first close */
        const char *body = p + strlen(call_open), *close = NULL;
        json_error_t je;
        json_t *o = json_loadb(body, (size_t)(end - body), JSON_DISABLE_EOF_CHECK | (constrained ? 0 : JSON_REJECT_DUPLICATES), &je);
        if (o) {
            const char *q = body + je.position;
            while (q < end && isspace((unsigned char)*q)) q++;
            if ((size_t)(end - q) >= strlen(call_close) && !memcmp(q, call_close, strlen(call_close))) close = q;
        }
        json_t *nm = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
        int ok = close && json_is_object(o) && json_is_string(nm) && ib_tool_name_ok(json_string_value(nm), json_string_length(nm)) &&
                 json_is_object(args) && json_object_size(o) == 2;   /* (no close: cut off by max_tokens, or not a call) */
        if (ok && (max_calls <= 0 || (int)json_array_size(calls) < max_calls)) {
            char id[160];
            snprintf(id, sizeof id, "call_%s_%zu", id_base, json_array_size(calls));
            json_t *c = ib_tool_call_json(id, json_string_value(nm), args);
            ok = c && !json_array_append_new(calls, c);
        }
        json_decref(o);
        if (!ok) goto none;
        const char *after = close + strlen(call_close), *q = after;
        while (q < end && isspace((unsigned char)*q)) q++;
        if (q == end) break;
        if ((size_t)(end - q) < strlen(call_open) || memcmp(q, call_open, strlen(call_open))) goto none;
        p = q;
    }
    *content_len = ib_tool_content_len(text, first);
    return calls;
none:
    json_decref(calls);
    return NULL;
}

json_t *ib_api_tool_calls_read(const char *text, size_t len, const char *id_base, int max_calls, size_t *content_len) {
    return read_calls(text, len, id_base, max_calls, content_len, 0);
}

size_t ib_tool_content_len(const char *text, const char *first) {
    size_t cl = (size_t)(first - text);
    while (cl > 0 && isspace((unsigned char)text[cl - 1])) cl--;
    return cl;
}

json_t *ib_api_tool_call_forced(const char *name, const char *text, size_t len, const char *id_base) {
    json_t *args = json_loadb(text, len, 0, NULL);   /* (constrained: a key twice keeps its last value, as read_calls) */
    json_t *calls = NULL;
    if (json_is_object(args)) {
        char id[160];
        snprintf(id, sizeof id, "call_%s_0", id_base);
        json_t *c = ib_tool_call_json(id, name, args);
        if (c && (calls = json_array())) json_array_append_new(calls, c);
        else json_decref(c);
    }
    json_decref(args);
    return calls;
}

json_t *ib_api_tool_calls_required(const char *text, size_t len, const char *id_base, int parallel) {
    static const char close[] = "}\n</tool_call>";
    const size_t cl = strlen(call_close);
    ib_tbuf b = {0};
    char *open = ib_api_tool_call_prefix(IB_CHAT_TOOLS_QWEN, NULL);
    if (!open) return NULL;
    ib_tbuf_puts(&b, open);
    free(open);
    ib_tbuf_put(&b, text, len);
    if (len < cl || memcmp(text + len - cl, call_close, cl)) ib_tbuf_puts(&b, close);
    size_t content_len = 0;
    json_t *calls = !b.oom ? read_calls(b.p, b.n, id_base, parallel ? 0 : 1, &content_len, 1) : NULL;
    free(b.p);
    return calls;
}

json_t *ib_api_reply_tool_calls(ib_chat_tool_form form, const char *text, size_t len, const char *id_base, int max_calls,
                                 size_t *content_len) {
    return form == IB_CHAT_TOOLS_GEMMA4 ? ib_gemma4_tool_calls_read(text, len, id_base, max_calls, content_len)
                                        : ib_api_tool_calls_read(text, len, id_base, max_calls, content_len);
}

json_t *ib_api_tool_calls_constrained(ib_chat_tool_form form, const char *name, const char *text, size_t len, const char *id_base,
                                      int parallel) {
    if (form == IB_CHAT_TOOLS_GEMMA4) return ib_gemma4_tool_calls_constrained(name, text, len, id_base, parallel);
    return name ? ib_api_tool_call_forced(name, text, len, id_base) : ib_api_tool_calls_required(text, len, id_base, parallel);
}
