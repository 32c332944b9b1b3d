/*
 * constraint.c — the constraint a chat reply is decoded under, one definition for the server and the
 * verifier: set up from a request's fields (response_format, or a tool_choice that forces calls), and
 * written into / read back from a verification record, so that a re-run rebuilds the very mask the
 * server used through the same set-up (ib_constraint_setup) and the same checks (ib_json_format_check,
 * ib_api_tools).
 *
 * In both places the constraint is a chat body, or the part of one that decides the mask:
 *   response_format   {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}
 *   tools, tool_choice, parallel_tool_calls   a named tool_choice, or "required" (tool_calls.c)
 * A record writes the same fields (verify.h): response_format "json_object" as a string (the form
 * records had before), a json_schema one as the request's object; a forced call's tools as the
 * function(s) whose schemas build the mask, each reduced to its name and parameters (a description or
 * "strict" changes no mask), with the request's tool_choice and, for "required", its
 * parallel_tool_calls.
 */
#include "server/api.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

int ib_constraint_setup(ib_json_state *s, ib_chat_tool_form form, json_t *b, const ib_api_tool_use *tu) {
    if (tu->mode == IB_TOOLS_FORCED && form == IB_CHAT_TOOLS_GEMMA4) {   /* the prompt ends with the name */
        json_t *one = json_pack("[{s:s, s:O}]", "type", "function", "function", tu->forced);
        int rc = one ? ib_tool_pick_setup(s, form, one, 0, tu->name) : -1;
        json_decref(one);
        return rc;
    }
    if (tu->mode == IB_TOOLS_FORCED) {
        json_t *arf = ib_api_tool_arguments_format(tu->forced);
        int rc = arf ? ib_json_setup(s, arf) : -1;
        json_decref(arf);
        return rc;
    }
    if (tu->mode == IB_TOOLS_REQUIRED) return ib_tool_pick_setup(s, form, tu->tools, tu->parallel, NULL);
    return ib_json_setup(s, json_object_get(b, "response_format"));
}

/* {"type": "function", "function": {"name", "parameters"?}} of a tool's function object f; NULL when
 * out of memory. */
static json_t *tool_min(json_t *f) {
    json_t *fn = json_pack("{s:O}", "name", json_object_get(f, "name"));
    json_t *p = json_object_get(f, "parameters");
    if (fn && p && json_object_set(fn, "parameters", p)) {
        json_decref(fn);
        return NULL;
    }
    return fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
}

json_t *ib_constraint_record(json_t *b, const ib_api_tool_use *tu) {
    json_t *o = json_object();
    if (!o) return NULL;
    int bad = 0;
    if (tu->mode == IB_TOOLS_FORCED) {
        json_t *tools = json_array();
        bad = !tools || json_object_set_new(o, "tools", tools) || json_array_append_new(tools, tool_min(tu->forced)) ||
              json_object_set_new(o, "tool_choice", json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", tu->name));
    } else if (tu->mode == IB_TOOLS_REQUIRED) {
        json_t *tools = json_array(), *t;
        size_t i;
        bad = !tools || json_object_set_new(o, "tools", tools);
        json_array_foreach(tu->tools, i, t) bad = bad || json_array_append_new(tools, tool_min(json_object_get(t, "function")));
        bad = bad || json_object_set_new(o, "tool_choice", json_string("required")) ||
              json_object_set_new(o, "parallel_tool_calls", json_boolean(tu->parallel));
    } else {
        json_t *rf = json_object_get(b, "response_format");
        const char *ty = json_string_value(json_object_get(rf, "type"));
        if (ty && !strcmp(ty, "json_object")) bad = json_object_set_new(o, "response_format", json_string("json_object"));
        else if (ty && !strcmp(ty, "json_schema")) bad = json_object_set(o, "response_format", rf);
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Fail with "verification.<msg>" made one line, or "verification.<param>: <msg>" when msg (a request
 * check's message) does not begin with the field it is about. */
static int refuse(char *out, size_t osz, const char *param, const char *msg) {
    if (param && strncmp(msg, param, strlen(param))) ib_one_linef(out, osz, "verification.%s: %s", param, msg);
    else ib_one_linef(out, osz, "verification.%s", msg);
    return -1;
}

int ib_constraint_from_record(json_t *v, json_t **out, char *msg, size_t msz) {
    *out = NULL;
    json_t *rf = json_object_get(v, "response_format"), *tools = json_object_get(v, "tools"),
           *tc = json_object_get(v, "tool_choice"), *par = json_object_get(v, "parallel_tool_calls");
    if (!rf && !tools && !tc && !par) return 0;
    json_t *b = json_object();
    if (!b) return snprintf(msg, msz, "out of memory"), -2;
    char m[256];
    int rc = 0;
    if (rf) {
        const char *ty = json_string_value(json_object_get(rf, "type"));
        if (json_is_string(rf) && !strcmp(json_string_value(rf), "json_object"))
            rc = json_object_set_new(b, "response_format", json_pack("{s:s}", "type", "json_object")) ? -2 : 0;
        else if (!json_is_object(rf) || !ty || (strcmp(ty, "json_object") && strcmp(ty, "json_schema")))
            rc = refuse(msg, msz, NULL, "response_format must be \"json_object\" or a json_schema response_format "
                                  "({\"type\": \"json_schema\", \"json_schema\": {...}})");
        else if (ib_json_format_check(rf, m, sizeof m))
            rc = refuse(msg, msz, "response_format", m);
        else
            rc = json_object_set(b, "response_format", rf) ? -2 : 0;
    }
    if (!rc && (tools || tc || par)) {
        const char *choice = json_string_value(tc);
        if (!json_is_array(tools) || !json_array_size(tools))
            rc = refuse(msg, msz, NULL, "tools must be the non-empty array of the functions a forced call was decoded under");
        else if (!(json_is_object(tc) || (choice && !strcmp(choice, "required"))))
            rc = refuse(msg, msz, NULL, "tool_choice must be \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}} "
                                  "(the only tool choices that constrain a reply)");
        else if (choice && !json_is_boolean(par))
            rc = refuse(msg, msz, NULL, "parallel_tool_calls must be a boolean with tool_choice \"required\"");
        else if (!choice && par)
            rc = refuse(msg, msz, NULL, "parallel_tool_calls is not part of a named tool_choice's record");
        else if (json_object_set(b, "tools", tools) || json_object_set(b, "tool_choice", tc) ||
                 (par && json_object_set(b, "parallel_tool_calls", par)))
            rc = -2;
        else {
            ib_api_tool_use tu;
            const char *param = NULL;
            int trc = ib_api_tools(b, &tu, &param, m, sizeof m);
            if (trc == -3) rc = -2;
            else if (trc) rc = refuse(msg, msz, param, m);
        }
    }
    if (rc == -2) snprintf(msg, msz, "out of memory");
    if (rc) {
        json_decref(b);
        return rc;
    }
    *out = b;
    return 0;
}
