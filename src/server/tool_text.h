/*
 * tool_text.h — what the two tool forms of the server (Qwen's in tool_calls.c, Gemma 4's in
 * tool_form_gemma4.c) share: a growing text buffer, the checks of a request's messages and calls, the
 * kept strings of rewritten messages and the OpenAI tool_calls entry. Internal to src/server.
 */
#ifndef IB_SERVER_TOOL_TEXT_H
#define IB_SERVER_TOOL_TEXT_H

#include <stddef.h>

#include <jansson.h>

#include "server/api.h"

/* A growing NUL-terminated text; oom set (and the text left as it was) when memory runs out. */
typedef struct ib_tbuf {
    char *p;
    size_t n, cap;
    int oom;
} ib_tbuf;

void ib_tbuf_put(ib_tbuf *b, const char *s, size_t n);
void ib_tbuf_puts(ib_tbuf *b, const char *s);

/* Move b's text into o's kept strings (b left empty) and return it; NULL when out of memory (b->oom
 * set before, or the list cannot grow). */
const char *ib_tool_msgs_keep(ib_api_tool_msgs *o, ib_tbuf *b);

/* A function name as OpenAI takes it: 1 to 64 of a-z, A-Z, 0-9, _ and -, no NUL inside (n is the
 * JSON string's length). */
int ib_tool_name_ok(const char *s, size_t n);

/* messages[i] checked: an object with a string role among system, developer, user, assistant and
 * tool; a string content, or a null / absent one on an assistant message with tool_calls; tool_calls
 * on assistant messages only, and then a non-empty array. Its role, content (NULL when null) and
 * tool_calls (NULL when none or null) through the pointers. 0; -1 with why naming the message. */
int ib_tool_msg_check(json_t *msgs, size_t i, const char **role, json_t **content, json_t **calls, char *why, size_t wsz);

/* messages[i].tool_calls[j] checked ({"id"?, "type"?: "function", "function": {"name", "arguments"}},
 * a valid name, arguments a string): its name and arguments (the JSON string) through the pointers. 0;
 * -1 with why naming the field. */
int ib_tool_call_check(json_t *calls, size_t i, size_t j, const char **name, json_t **args, char *why, size_t wsz);

/* One tool_calls entry of a reply: {"id": id, "type": "function", "function": {"name", "arguments":
 * args as compact JSON text}}; NULL when out of memory. */
json_t *ib_tool_call_json(const char *id, const char *name, json_t *args);

/* The first opening open in text[len] (NULL: none) outside the thoughts, th_open…th_close (a model
 * may write the opening while it plans; a thought never closed hides everything after it): NULL when
 * there is none. */
const char *ib_tool_first_call(const char *text, size_t len, const char *open, const char *th_open, const char *th_close);

/* A reply's content when its calls begin at first: the length of the text before them, less trailing
 * whitespace. */
size_t ib_tool_content_len(const char *text, const char *first);

/* ib_api_tool_messages in Gemma 4's form (tool_form_gemma4.c): o->m allocated for every message (and
 * one more) and empty, *param (when param is not NULL) "messages". 0; -1 with why (and *param "tools"
 * for a declaration the template could not write); -2 out of memory (o freed by the caller). */
int ib_gemma4_tool_messages(json_t *msgs, json_t *tools, ib_api_tool_msgs *o, const char **param, char *why, size_t wsz);

#endif
