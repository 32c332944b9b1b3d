/*
 * api.h — the server's OpenAI-facing request handling that needs no server state, and the HTTP
 * decorations every response gets. Internal to src/server/.
 *
 *   api_request.c   request-field checks (unknown and unimplemented fields -> 400 naming the field),
 *                   body normalization (content parts, top_k -1, a fresh seed), logit_bias parsing,
 *                   several prompts of /v1/completions
 *   api_tokens.c    /tokenize and /detokenize bodies, the model object of /v1/models[/{id}]
 *   http_extra.c    request ids, CORS and Allow headers, the request log, the bind address
 *   latency.c       TTFT / inter-token / queue-time histograms and a tokens/s gauge for /metrics
 *
 * Functions that can fail return -1 with the offending field in *param (may be NULL: the whole body)
 * and a one-line message in msg; they never exit and leave no allocation behind on failure.
 */
#ifndef IB_SERVER_API_H
#define IB_SERVER_API_H
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#include "isobatch.h"
#include "tokenizer/tokenizer.h"

/* ------------------------------------------------------------------ requests (api_request.c) */

typedef enum { IB_API_COMPLETIONS, IB_API_CHAT, IB_API_SESSION_GENERATE } ib_api_endpoint;

/* Check body's fields against what endpoint ep implements. Unknown fields fail with code
 * "unknown_parameter"; fields of the OpenAI API this server does not implement (tools, echo, suffix,
 * best_of > 1, non-zero frequency/presence penalties, a json_schema keyword outside the supported
 * subset, ...) fail with "unsupported_parameter"; a malformed response_format and max_tokens 0 on
 * completions and chat fail with "invalid_value".
 * *code gets that code. 0 when the body may go on. */
int ib_api_check_fields(json_t *body, ib_api_endpoint ep, const char **param, const char **code, char *msg,
                        size_t msz);

/* Check that every field of body (NULL: none) is one of known (NULL-terminated): 0; -1 naming the
 * first other one (code "unknown_parameter"). For the session endpoints that take no OpenAI fields. */
int ib_api_known_fields(json_t *body, const char *const *known, const char **param, char *msg, size_t msz);

/* Rewrite body in place into the form the handlers read: chat message contents given as arrays of
 * text parts become one string (parts joined without separator; a non-text part fails naming it);
 * top_k -1 (vLLM's "off") becomes 0; when the request has no seed, a fresh one from the system's
 * random source (in [0, 2^53), exact in JSON numbers of every client) is set. 0 on success. */
int ib_api_normalize(json_t *body, ib_api_endpoint ep, const char **param, char *msg, size_t msz);

/* Rewrite the messages array of body (chat or session append) as ib_api_normalize does. */
int ib_api_normalize_messages(json_t *body, const char **param, char *msg, size_t msz);

/* A fresh seed in [0, 2^53) from getrandom(2); falls back to the clock when it fails. */
uint64_t ib_api_fresh_seed(void);

/* OpenAI logit_bias: {"token id": bias in [-100, 100]}. */
typedef struct ib_api_bias {
    int32_t *ids;   /* [n] (owned) */
    float *vals;    /* [n] (owned) */
    int n;
} ib_api_bias;

/* Parse body's logit_bias (absent or null: n = 0) for a vocabulary of `vocab`; ids in ascending
 * key order of the object as sent. */
int ib_api_logit_bias(json_t *body, int vocab, ib_api_bias *out, const char **param, char *msg, size_t msz);
void ib_api_bias_free(ib_api_bias *b);

/* The number of prompts in a /v1/completions "prompt": 1 for a string, a one-string array or an array
 * of token ids; k for an array of k >= 2 strings or of k >= 1 arrays of token ids (each a prompt);
 * -1 with a message naming the element when the array mixes kinds or holds something else. */
int ib_api_prompt_count(json_t *prompt, char *msg, size_t msz);

/* ------------------------------------------------------------------ function calling (tool_calls.c) */

#define IB_API_MAX_TOOLS 128
#define IB_API_MAX_MESSAGES 4096

/* How a chat request uses tools: none; declared, the reply read for calls (tool_choice "auto"); one
 * named function called (tool_choice {"type": "function", ...}): the prompt ends with the call's
 * opening and its arguments are decoded under the function's parameters schema; or a call of some
 * declared function (tool_choice "required"): the prompt ends with "<tool_call>\n{\"name\": \"" and
 * the reply is read by ib_tool_pick (tool_pick.c): a declared name, then arguments under its schema. */
typedef enum ib_api_tool_mode { IB_TOOLS_OFF, IB_TOOLS_AUTO, IB_TOOLS_FORCED, IB_TOOLS_REQUIRED } ib_api_tool_mode;

typedef struct ib_api_tool_use {
    ib_api_tool_mode mode;
    json_t *tools;      /* the request's tools array (borrowed) when mode is not OFF */
    json_t *forced;     /* FORCED: the named tool's "function" object (borrowed) */
    char name[65];      /* FORCED: its name */
    int parallel;       /* parallel_tool_calls (default 1): 0 keeps the reply's first call only */
} ib_api_tool_use;

/* Read tools, tool_choice and parallel_tool_calls of a chat body into *out (tools: every field of each
 * tool checked, names unique; tool_choice "none" or no tools: OFF; "auto" or absent with tools: AUTO;
 * a named function: FORCED; "required": REQUIRED — both with no response_format of the body's own and
 * the parameters of the function called (REQUIRED: of every tool) in the json_schema subset). 0; -1
 * with a message and param for a bad value; -2 for what is not supported (a schema keyword outside the
 * subset); -3 out of memory. */
int ib_api_tools(json_t *body, ib_api_tool_use *out, const char **param, char *msg, size_t msz);

/* A chat request's messages rewritten into chat messages of the model's tool form (form: QWEN or
 * GEMMA4). Qwen's (tool_calls.c's header): plain role/content messages, tools (NULL or empty: none)
 * declared in the system turn, assistant tool_calls written after their text, each run of tool
 * messages one user turn of <tool_response> blocks. Gemma 4's (tool_form_gemma4.c's header): the
 * declarations and each model turn's calls and results in the messages' tool_text; a tool message
 * must follow an assistant message with tool_calls, and a call's arguments must be an object's JSON
 * text; a tool whose parameters the template could not write is refused naming the property. Roles
 * system, developer (as system), user, assistant, tool; an assistant message with tool_calls may have
 * a null content. The rewritten messages may point into msgs (Gemma 4's contents do): keep msgs
 * until o is freed. 0 with *o (free with ib_api_tool_msgs_free); -1 with a message in why and the
 * field it names in *param ("messages", or "tools" for a declaration; param may be NULL); -2 out of
 * memory. */
typedef struct ib_api_tool_msgs {
    ib_chat_msg *m;
    size_t n;
    char **own;         /* the rewritten contents */
    size_t n_own;
} ib_api_tool_msgs;
int ib_api_tool_messages(ib_chat_tool_form form, json_t *msgs, json_t *tools, ib_api_tool_msgs *o, const char **param, char *why,
                         size_t wsz);
void ib_api_tool_msgs_free(ib_api_tool_msgs *o);

/* The response_format a call's arguments are decoded under: a json_schema of the function's
 * "parameters", or of {"type": "object"} when it has none (json_schema rather than json_object: its
 * numbers are bounded so every parser reads them); a new reference, NULL when out of memory. */
json_t *ib_api_tool_arguments_format(json_t *function);

/* The text a call of function name opens with in form's replies ("<tool_call>\n{\"name\": \"NAME\",
 * \"arguments\": "; Gemma 4's: "<|tool_call>call:NAME"), or with name NULL the opening before any name
 * ("<tool_call>\n{\"name\": \""; "<|tool_call>call:"); malloc'ed; NULL when out of memory. */
char *ib_api_tool_call_prefix(ib_chat_tool_form form, const char *name);

/* The calls in a reply's text[len]: one or more <tool_call> blocks, each {"name": NAME, "arguments":
 * {...}} and nothing but whitespace between and after them, as an OpenAI tool_calls array (ids
 * "call_<id_base>_<k>", arguments as compact JSON text; at most max_calls when > 0), with
 * *content_len the length of the text before the first block less trailing whitespace. NULL when
 * the text holds no such calls (a block cut off or not of that shape leaves the whole text text). */
json_t *ib_api_tool_calls_read(const char *text, size_t len, const char *id_base, int max_calls, size_t *content_len);

/* The same in Gemma 4's form (tool_form_gemma4.c; the first call looked for outside the thoughts,
 * <|channel>…<channel|>, which stay content): one or more <|tool_call>call:NAME{…}<tool_call|>,
 * the arguments read from Gemma 4's value syntax (strings between <|"|> tokens, bare or quoted keys,
 * numbers, true/false, null or None, lists, objects; no key twice; at most 64 deep) into JSON. */
json_t *ib_gemma4_tool_calls_read(const char *text, size_t len, const char *id_base, int max_calls, size_t *content_len);

/* An "auto" reply's calls in form: ib_api_tool_calls_read or ib_gemma4_tool_calls_read. */
json_t *ib_api_reply_tool_calls(ib_chat_tool_form form, const char *text, size_t len, const char *id_base, int max_calls,
                                size_t *content_len);

/* The text a call opens with in form's replies ("<tool_call>" or "<|tool_call>"): what a stream holds
 * back while it may still become one. */
const char *ib_api_tool_call_marker(ib_chat_tool_form form);

/* A forced call's tool_calls: [{"id": "call_<id_base>_0", "type": "function", "function": {"name":
 * name, "arguments": text[len] as compact JSON}}] when the text is one JSON object; else NULL. */
json_t *ib_api_tool_call_forced(const char *name, const char *text, size_t len, const char *id_base);

/* A tool_choice "required" reply's tool_calls: text[len] follows the opening "<tool_call>\n{\"name\": \""
 * (ib_api_tool_call_prefix(NULL)); it is read as that opening, the text and, unless the text ends with
 * one, the call's close "}\n</tool_call>" (ib_tool_pick lets the reply stop before it), by
 * ib_api_tool_calls_read (at most one call unless parallel). NULL when that is no call. */
json_t *ib_api_tool_calls_required(const char *text, size_t len, const char *id_base, int parallel);

/* A constrained reply's tool_calls in form: a named function's call (name; the prompt ended with
 * ib_api_tool_call_prefix(form, name)) or a "required" reply's calls (name NULL; the prompt ended
 * with the opening before any name), read from that opening and text[len] — Qwen's form by
 * ib_api_tool_call_forced / ib_api_tool_calls_required, Gemma 4's by ib_gemma4_tool_calls_read with
 * the close "<tool_call|>" added when the text does not end with it (one call unless parallel and
 * no name). NULL when that is no call. */
json_t *ib_api_tool_calls_constrained(ib_chat_tool_form form, const char *name, const char *text, size_t len, const char *id_base,
                                      int parallel);
json_t *ib_gemma4_tool_calls_constrained(const char *name, const char *text, size_t len, const char *id_base, int parallel);

/* ------------------------------------------------------------------ tokens and models (api_tokens.c) */

/* The chat-formatted text of messages cm[nm] with flags (IB_CHAT_*), as a new string in *out and its
 * length in *len: 0; -1 with a message (param "messages") when the model has no chat format or its
 * format refuses these roles; -2 when memory runs out. */
int ib_api_chat_text(const ib_model *m, const ib_chat_msg *cm, int nm, int flags, char **out, long *len,
                     const char **param, char *msg, size_t msz);

/* POST /tokenize: {"content" | "prompt": text, "add_special": bool, "with_pieces": bool} or
 * {"messages": [...], "add_generation_prompt": bool} -> {"tokens": [...], "count", "max_model_len"}
 * (with_pieces: tokens are {"id", "piece"} objects). At most max_tokens tokens. *out is the body. */
int ib_api_tokenize(const ib_model *m, json_t *body, int max_tokens, json_t **out, const char **param, char *msg,
                    size_t msz);

/* POST /detokenize: {"tokens": [ids]} -> {"content": text} (invalid UTF-8 as U+FFFD). */
int ib_api_detokenize(const ib_model *m, json_t *body, json_t **out, const char **param, char *msg, size_t msz);

/* The model object of /v1/models and /v1/models/{id}. */
json_t *ib_api_model_json(const char *id, const ib_model_info *info);

/* A JSON string of bytes s[0..n) with invalid UTF-8 replaced by U+FFFD (never NULL on success). */
json_t *ib_api_bytes_str(const char *s, size_t n);

/* ------------------------------------------------------------------ HTTP extras (http_extra.c) */

/* Start the request log and CORS settings for this process: log may be NULL (no request log);
 * cors_origin NULL or "" = no Access-Control-Allow-Origin header. */
void ib_http_configure(FILE *log, const char *cors_origin);

/* Called on the first callback of a request (the connection's thread): remember method, url and the
 * start time, and take the request id from the X-Request-Id header (printable, <= 64 bytes) or make
 * one. The context lives in thread-local storage (one request at a time per connection thread). */
void ib_http_request_begin(struct MHD_Connection *c, const char *method, const char *url);

/* Add the headers every response carries (X-Request-Id, CORS; Allow on 405 and OPTIONS) and note the
 * status for the request log. Call before MHD_queue_response. */
void ib_http_decorate(struct MHD_Response *r, unsigned code);

/* The request ended (notify-completed): write its log line (time, id, method, path, status, ms). */
void ib_http_request_end(void);

/* The methods url accepts, as an Allow header value ("GET, OPTIONS"), or NULL for an unknown path. */
const char *ib_http_allowed(const char *url);

/* Parse a --host value into a socket address with port: an IPv4 address, an IPv6 address (bare or
 * in brackets), "localhost" (127.0.0.1) or "::" / "0.0.0.0". *v6 says which. -1 when it is neither. */
int ib_http_bind_addr(const char *host, int port, struct sockaddr_storage *out, int *v6);

/* ------------------------------------------------------------------ JSON mode (json_constraint.c) */

/* A compiled response_format json_schema (json_schema.c) and one generation's reading over it. */
typedef struct ib_schema ib_schema;
typedef struct ib_schema_run ib_schema_run;
/* A tool_choice "required" reply's reader (tool_pick.c). */
typedef struct ib_tool_pick ib_tool_pick;

/* Where a byte-by-byte JSON reader stands in the text generated so far (small: copied per token).
 * run: NULL for json_object; for json_schema the schema reader (owned, ib_json_release). pick: a
 * tool_choice "required" reply's reader (owned), to which _step, _done, _mask and _release go. */
typedef struct ib_json_state {
    uint8_t mode, sub, lit, key, utf8_left, ws, depth;
    uint64_t stack;                /* open containers, innermost in bit 0: 1 object, 0 array */
    ib_schema_run *run;
    ib_tool_pick *pick;
} ib_json_state;

/* Every token's bytes, for masking: token t is bytes[off[t], off[t+1]). For the schema walk the
 * tokens also come sorted by their bytes (ord) with each one's common prefix with the one before
 * (lcp), and again for the tokens that are not "plain" (np_*): a plain token is non-empty, has no
 * '"', '\\' or byte below 0x20, and is whole UTF-8 characters, so inside a string it never changes
 * the reader's state. */
typedef struct ib_json_vocab {
    size_t *off;                   /* [n + 1] */
    char *bytes;
    int n;
    int maxlen;                    /* longest token in bytes */
    int32_t *ord, *lcp;            /* [n] */
    int32_t *np_ord, *np_lcp;      /* [n_np] */
    int n_np;
    int32_t *lt_ord, *lt_lcp;      /* [n_lt] the tokens not plain or holding a '<' (Gemma 4's string
                                    * delimiter begins with one), sorted and with lcp as ord */
    int n_lt;
} ib_json_vocab;

/* The empty text: expecting an object. */
void ib_json_init(ib_json_state *s);
/* Set s up for body field response_format rf (NULL, null, {"type":"text"}: nothing): 1 when the
 * reply is constrained (json_object, or json_schema compiled into s->run), 0 when not, -1 when out of
 * memory. rf must have passed ib_json_format_check. */
int ib_json_setup(ib_json_state *s, json_t *rf);
/* Free what ib_json_setup allocated (s->run); s is then unconstrained-empty. */
void ib_json_release(ib_json_state *s);
/* Check response_format rf: text, json_object, or json_schema whose schema compiles (an unsupported
 * keyword, a bad value, a $ref to nothing: -1 with a one-line message naming it). 0 when usable. */
int ib_json_format_check(json_t *rf, char *msg, size_t msz);
/* Feed one byte: 0 when the text so far can still become one JSON object (then s advanced), -1 when
 * not (s is then undefined: step a copy to try a byte). */
int ib_json_step(ib_json_state *s, unsigned char c);
/* Whether the object is complete (only whitespace may follow). */
int ib_json_done(const ib_json_state *s);
/* Whether s is inside a string that every plain token (ib_json_vocab) leaves as it is: a string
 * with no escape or UTF-8 sequence open (json_schema: every reading of it, ib_schema_run_plain).
 * 0 for a tool_choice "required" reader. */
int ib_json_plain_string(const ib_json_state *s);
/* The byte table of m's vocabulary; -1 when out of memory. */
int ib_json_vocab_init(ib_json_vocab *v, const ib_model *m);
/* The same from a function giving token t's bytes (into buf, cap bytes; returns the count, < 0 =
 * none) for t in [0, n). */
int ib_json_vocab_build(ib_json_vocab *v, int n, int (*bytes_of)(void *ctx, int32_t t, char *buf, int cap), void *ctx);
void ib_json_vocab_free(ib_json_vocab *v);
/* Set logits[t] = -inf for every token t that cannot follow s: before completion a stop id, or a
 * token with a byte the grammar refuses (or with no bytes); after it, every token but the stop ids
 * (all but whitespace-only ones when there are no stop ids). Returns the tokens left; 0 leaves the row
 * all -inf, which the caller must undo. Dispatches to ib_schema_mask for json_schema. */
int ib_json_mask(const ib_json_state *s, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop,
                 int n_stop);

/* json_schema.c. Compile schema (the "schema" member of response_format.json_schema) into *out:
 * 0; -1 with a one-line message naming the keyword or value refused and where; -2 out of memory. */
int ib_schema_compile(json_t *schema, ib_schema **out, char *msg, size_t msz);
void ib_schema_free(ib_schema *sc);
/* A reader at the empty text over sc (which it then owns); NULL when out of memory (sc not freed). */
ib_schema_run *ib_schema_run_new(ib_schema *sc);
/* A copy of r at the same text, sharing r's schema (free it before r); NULL when out of memory. */
ib_schema_run *ib_schema_run_clone(const ib_schema_run *r);
/* dst (a clone: it borrows its schema) set to src's text over src's schema, in place — no allocation
 * (its walk stack, if any, is kept for its own next mask). */
void ib_schema_run_copy(ib_schema_run *dst, const ib_schema_run *src);
void ib_schema_run_free(ib_schema_run *r);
/* Feed one byte: 0 when the text can still become a value of the schema, -1 when not (the reader is
 * then dead: every later byte is refused too). */
int ib_schema_run_step(ib_schema_run *r, unsigned char c);
/* Whether the text so far is a whole value of the schema (whitespace or, for a top-level number,
 * more digits may follow). */
int ib_schema_run_done(const ib_schema_run *r);
/* Whether every reading of r is inside a string any plain token leaves as it is (a string value with
 * no escape or UTF-8 sequence open, or a key that matches no property name any more and may be any
 * other key): where ib_schema_mask walks only the tokens that are not plain. */
int ib_schema_run_plain(const ib_schema_run *r);
/* ib_json_mask for a schema: -inf for every token whose bytes the reader refuses and for the stop ids
 * until the value is whole; once nothing but whitespace can follow, only the stop ids stay. Cost: one
 * reader step per distinct byte prefix the reader accepts (shared by the tokens that have it), and
 * inside a free string only the non-plain tokens are walked. Returns the tokens left (0: all refused;
 * the caller undoes the row). */
int ib_schema_mask(ib_schema_run *r, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop,
                   int n_stop);

/* tool_pick.c. tool_choice "required": the reply that follows the prompt's "<tool_call>\n{\"name\": \""
 * is NAME", "arguments": ARGS — NAME one of the tools' names, ARGS a JSON object that function's
 * arguments format allows (ib_api_tool_arguments_format: its parameters schema, or any object) — and
 * then ends; with parallel, it may instead go on with "}\n</tool_call>" and end there, or with
 * "\n<tool_call>\n{\"name\": \"" and another NAME", "arguments": ARGS, and so on. In Gemma 4's form
 * (form IB_CHAT_TOOLS_GEMMA4) the prompt ends with "<|tool_call>call:" and the reply is NAME{ARGS}
 * with ARGS in Gemma 4's value syntax (gemma4_args.c), then it ends or goes on with "<tool_call|>" and
 * ends there (with parallel: or goes on with "<|tool_call>call:" and the next call). The mask is a
 * function of the reply so far, the tools and the vocabulary only.
 * Set s up for tools (checked by ib_api_tools: names valid and unique, every parameters schema in the
 * subset); name_read (NULL: none) is a text the prompt already holds after its opening, read first —
 * a named tool_choice in Gemma 4's form is the one tool with its name read: 1; -1 out of memory, or
 * name_read no declared name's beginning (s is then unconstrained-empty). */
int ib_tool_pick_setup(ib_json_state *s, ib_chat_tool_form form, json_t *tools, int parallel, const char *name_read);
void ib_tool_pick_free(ib_tool_pick *pk);
/* Feed one byte of the reply: 0 when accepted, -1 when not (the reader then ends: only the stop ids). */
int ib_tool_pick_step(ib_tool_pick *pk, unsigned char c);
/* Whether the reply may end here (the stop ids allowed). */
int ib_tool_pick_done(const ib_tool_pick *pk);
/* ib_json_mask for the reader: -inf for every token whose bytes it refuses, the stop ids allowed
 * exactly where the reply may end. Returns the tokens left. */
int ib_tool_pick_mask(ib_tool_pick *pk, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop, int n_stop);
/* The same bits, every token stepped on its own outside ARGS rather than the byte-sorted walk: the
 * walk's reference (tests/test_tool_pick.c compares the two) and its fallback. */
int ib_tool_pick_mask_stepped(ib_tool_pick *pk, const ib_json_vocab *v, float *logits, int vocab, const int32_t *stop,
                              int n_stop);

/* gemma4_args.c. A Gemma 4 call's arguments ({key:VALUE,…} in its value syntax, after the opening
 * '{') read byte by byte as the JSON text they stand for, fed to a JSON reader (a function's
 * arguments format); the mapping and what is refused are in the file's header. Small: copied with
 * the reader. */
typedef struct ib_g4args {
    uint8_t mode, sub, key, depth;
    uint64_t stack;      /* open containers, innermost in bit 0: 1 object, 0 array */
} ib_g4args;
/* The reader right after the arguments' '{' (which the caller has fed to the JSON reader). */
void ib_g4args_init(ib_g4args *g);
/* Feed byte c: the JSON bytes it stands for go to js (never a tool_choice reader). probe: a schema
 * reader a held-back '<' is tried on (a copy of js->run goes there; js->run itself is not stepped);
 * NULL when js has no schema. 0 when c is taken; -1 when not (g and js are then undefined). */
int ib_g4args_step(ib_g4args *g, ib_json_state *js, ib_schema_run *probe, unsigned char c);
/* Whether the arguments are whole: their '{' closed and js's object whole. */
int ib_g4args_done(const ib_g4args *g, const ib_json_state *js);
/* Whether every token that is plain (ib_json_vocab) and holds no '<' leaves g and js as they are:
 * inside a text, with nothing held back, where js is in a plain string. */
int ib_g4args_plain(const ib_g4args *g, const ib_json_state *js);

/* ------------------------------------------------------------------ a reply's constraint (constraint.c) */

/* Set s up for the constraint of chat body b whose tool use is tu (b passed ib_api_check_fields and
 * ib_api_tools), for a model of tool form form: a forced call's arguments under its function's
 * parameters (Gemma 4's form: ib_tool_pick over that one tool, its name read), a "required" reply
 * under ib_tool_pick, else b's response_format. 1 when the reply is constrained, 0 when not, -1 when
 * out of memory. The server and the verifier both build their masks here. */
int ib_constraint_setup(ib_json_state *s, ib_chat_tool_form form, json_t *b, const ib_api_tool_use *tu);

/* The verification record's fields for that constraint (a new object, to merge into the record; empty
 * when the reply is unconstrained): "response_format" ("json_object", or the json_schema object), or
 * a forced call's "tools" (name and parameters of each function that builds the mask: the named one,
 * or all under "required"), "tool_choice" and, for "required", "parallel_tool_calls". NULL when out
 * of memory. */
json_t *ib_constraint_record(json_t *b, const ib_api_tool_use *tu);

/* Read a record's constraint fields (those ib_constraint_record writes) back into a chat body for
 * ib_constraint_setup (*out, a new object; NULL when the record has none), checked as the server
 * checks a request (ib_json_format_check, ib_api_tools) and more strictly (only a constraining
 * tool_choice; "required" with its parallel_tool_calls). 0; -1 with a one-line message naming the
 * field ("verification.tools..."); -2 out of memory. */
int ib_constraint_from_record(json_t *v, json_t **out, char *msg, size_t msz);

/* ------------------------------------------------------------------ latency metrics (latency.c) */

#define IB_LAT_BUCKETS 14
typedef struct ib_latency {
    pthread_mutex_t mu;
    long long ttft[IB_LAT_BUCKETS + 1], itl[IB_LAT_BUCKETS + 1], queue[IB_LAT_BUCKETS + 1];
    double ttft_sum, itl_sum, queue_sum;
    long long ttft_n, itl_n, queue_n;
    double sec0;                 /* start of the rate window's clock */
    long long per_sec[16];       /* tokens generated in each of the last 16 whole seconds (ring) */
    long long sec_of[16];        /* which second each slot holds */
} ib_latency;

void ib_latency_init(ib_latency *l, double now);
void ib_latency_destroy(ib_latency *l);
/* Record a first token (ttft seconds since the request arrived, queue seconds it waited for a slot). */
void ib_latency_first(ib_latency *l, double ttft, double queue);
/* Record a later token, itl seconds after the previous one of the same generation. */
void ib_latency_next(ib_latency *l, double itl);
/* Count one generated token at time now (for the rate gauge). */
void ib_latency_token(ib_latency *l, double now);
/* Append the histograms and the gauge isobatch_tokens_per_second (tokens of the last 10 whole seconds
 * over 10: a scrape never resets it) in Prometheus text to buf[*k, cap). */
void ib_latency_format(ib_latency *l, double now, char *buf, int *k, int cap);

/* Write the message (fmt) into msg (msz bytes), name the offending field p (NULL: the body) in
 * *param, and return -1: the tail of every request-checking failure path. */
int ib_api_failf(const char **param, const char *p, char *msg, size_t msz, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
