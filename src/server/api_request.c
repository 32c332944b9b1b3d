/*
 * api_request.c — what a request body may say, before the handlers (openai_api.c, sessions_api.c)
 * read it: the fields each endpoint implements (anything else is a 400 naming the field, never
 * silently ignored), the rewriting of accepted alternative forms into the one form the handlers
 * read (content parts, top_k -1, a fresh seed for unseeded requests), logit_bias, and the
 * several-prompt form of /v1/completions. See api.h for the contracts.
 */
#include "server/api.h"

#include "core/error.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* Fields every generating endpoint implements. */
static const char *const common_fields[] = {
    "max_tokens", "temperature", "top_p", "min_p", "top_k", "repetition_penalty", "seed", "n", "stream",
    "stream_options", "logprobs", "stop", "logit_bias", "user", "frequency_penalty", "presence_penalty", NULL};
static const char *const completion_fields[] = {"model", "prompt", "echo", "suffix", "best_of", NULL};
static const char *const chat_fields[] = {"model",         "messages",      "max_completion_tokens", "top_logprobs",
                                          "enable_thinking", "response_format", "tools", "tool_choice",
                                          "parallel_tool_calls", "functions", "function_call", "store",
                                          "metadata",      "service_tier",  "reasoning_effort", "modalities",
                                          "audio",         "prediction",    "web_search_options", NULL};
static const char *const session_fields[] = {"chat", "model", NULL};

/* Whether k is one of the NULL-terminated list l. */
static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

int ib_api_failf(const char **param, const char *p, char *msg, size_t msz, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msz, fmt, ap);
    va_end(ap);
    *param = p;
    return -1;
}

/* Whether value v of an unimplemented field asks for nothing (null, or the value that means "off"),
 * so it can be accepted: best_of 1, suffix "", functions [], function_call "none", penalties 0,
 * store false. */
static int is_noop(const char *k, json_t *v) {
    if (json_is_null(v)) return 1;
    if (!strcmp(k, "store")) return json_is_false(v);
    if (!strcmp(k, "best_of")) return json_is_integer(v) && json_integer_value(v) == 1;
    if (!strcmp(k, "suffix")) return json_is_string(v) && json_string_length(v) == 0;
    if (!strcmp(k, "functions")) return json_is_array(v) && json_array_size(v) == 0;
    if (!strcmp(k, "function_call")) return json_is_string(v) && !strcmp(json_string_value(v), "none");
    if (!strcmp(k, "frequency_penalty") || !strcmp(k, "presence_penalty"))
        return json_is_number(v) && json_number_value(v) == 0.0;
    return 0;
}

/* Fields that are OpenAI's but not implemented here: accepted only with a no-op value. */
static const char *const unimplemented[] = {"suffix", "best_of", "functions", "function_call", "store",
                                            "metadata", "service_tier", "reasoning_effort", "modalities", "audio",
                                            "prediction", "web_search_options",
                                            "frequency_penalty", "presence_penalty", NULL};

int ib_api_known_fields(json_t *body, const char *const *known, const char **param, char *msg, size_t msz) {
    const char *k;
    json_t *v;
    if (!body) return 0;
    json_object_foreach(body, k, v) {
        (void)v;
        if (!in_list(known, k)) return ib_api_failf(param, k, msg, msz, "unknown field '%s': this endpoint does not take it", k);
    }
    return 0;
}

int ib_api_check_fields(json_t *body, ib_api_endpoint ep, const char **param, const char **code, char *msg,
                        size_t msz) {
    const char *k;
    json_t *v;
    *code = "invalid_value";
    if (!body) return 0;
    const char *const *own = ep == IB_API_COMPLETIONS ? completion_fields : ep == IB_API_CHAT ? chat_fields : session_fields;
    json_object_foreach(body, k, v) {
        if (!in_list(common_fields, k) && !in_list(own, k)) {
            *code = "unknown_parameter";
            return ib_api_failf(param, k, msg, msz, "unknown field '%s': this endpoint does not take it", k);
        }
        if (!strcmp(k, "response_format") && ib_json_format_check(v, msg, msz)) {
            /* text, json_object or a json_schema of the supported subset (json_constraint.c) */
            *code = strstr(msg, "not supported") ? "unsupported_parameter" : "invalid_value";
            *param = k;
            return -1;
        }
        if (in_list(unimplemented, k) && !is_noop(k, v)) {
            *code = "unsupported_parameter";
            if (!strcmp(k, "frequency_penalty") || !strcmp(k, "presence_penalty"))
                return ib_api_failf(param, k, msg, msz, "%s is not supported (only 0); use repetition_penalty", k);
            return ib_api_failf(param, k, msg, msz, "%s is not supported by this server", k);
        }
    }
    if (ep != IB_API_SESSION_GENERATE) {
        const char *mk = json_object_get(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
        json_t *mt = json_object_get(body, mk);
        /* 0 new tokens: only a completion that echoes its prompt (scoring with logprobs) */
        if (json_is_integer(mt) && json_integer_value(mt) == 0 && !json_is_true(json_object_get(body, "echo")))
            return ib_api_failf(param, mk, msg, msz, "%s must be at least 1 (0 only with echo: true)", mk);
    }
    return 0;
}

uint64_t ib_api_fresh_seed(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = (uint64_t)ts.tv_sec * 1000000007ULL ^ (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL;
    }
    return x & ((1ULL << 53) - 1);
}

/* One message's content as a string: a string stays; an array of {"type":"text","text":s} parts is
 * joined. Returns a new reference, or NULL with the message. */
static json_t *content_string(json_t *ct, size_t i, char *msg, size_t msz) {
    if (json_is_string(ct)) return json_incref(ct);
    if (!json_is_array(ct)) {
        snprintf(msg, msz, "messages[%zu].content must be a string or an array of text parts", i);
        return NULL;
    }
    size_t total = 0, j;
    json_t *part;
    json_array_foreach(ct, j, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type)) {
            snprintf(msg, msz, "messages[%zu].content[%zu] must be an object with a string type", i, j);
            return NULL;
        }
        if (strcmp(json_string_value(type), "text")) {
            /* the type is the client's: the refusal is made one printable line */
            ib_one_linef(msg, msz, "messages[%zu].content[%zu]: part type '%s' is not supported (text parts only)", i,
                         j, json_string_value(type));
            return NULL;
        }
        if (!json_is_string(text)) {
            snprintf(msg, msz, "messages[%zu].content[%zu].text must be a string", i, j);
            return NULL;
        }
        total += json_string_length(text);
    }
    char *s = malloc(total + 1);
    if (!s) {
        snprintf(msg, msz, "out of memory");
        return NULL;
    }
    size_t at = 0;
    json_array_foreach(ct, j, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    json_t *r = json_stringn(s, at);
    free(s);
    if (!r) snprintf(msg, msz, "messages[%zu].content is not valid UTF-8", i);
    return r;
}

int ib_api_normalize_messages(json_t *body, const char **param, char *msg, size_t msz) {
    json_t *msgs = body ? json_object_get(body, "messages") : NULL;
    if (!json_is_array(msgs)) return 0; /* the handler names what is wrong */
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *ct = json_is_object(m) ? json_object_get(m, "content") : NULL;
        if (!json_is_array(ct)) continue;
        json_t *s = content_string(ct, i, msg, msz);
        if (!s) {
            *param = "messages";
            return -1;
        }
        json_object_set_new(m, "content", s);
    }
    return 0;
}

int ib_api_normalize(json_t *body, ib_api_endpoint ep, const char **param, char *msg, size_t msz) {
    if (!body) return 0;
    if (ep == IB_API_CHAT && ib_api_normalize_messages(body, param, msg, msz)) return -1;
    json_t *tk = json_object_get(body, "top_k");
    if (json_is_integer(tk) && json_integer_value(tk) == -1) json_object_set_new(body, "top_k", json_integer(0));
    json_t *seed = json_object_get(body, "seed");
    if (!seed || json_is_null(seed)) json_object_set_new(body, "seed", json_integer((json_int_t)ib_api_fresh_seed()));
    return 0;
}

/* Whether s is a token id written canonically (digits, no sign, no leading zero) below vocab. */
static int parse_id(const char *s, int vocab, int32_t *out) {
    if (!*s || (s[0] == '0' && s[1]) || strlen(s) > 10) return 0;
    long long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        v = v * 10 + (*p - '0');
    }
    if (v >= vocab) return 0;
    *out = (int32_t)v;
    return 1;
}

int ib_api_logit_bias(json_t *body, int vocab, ib_api_bias *out, const char **param, char *msg, size_t msz) {
    memset(out, 0, sizeof *out);
    json_t *lb = body ? json_object_get(body, "logit_bias") : NULL;
    if (!lb || json_is_null(lb)) return 0;
    if (!json_is_object(lb))
        return ib_api_failf(param, "logit_bias", msg, msz, "logit_bias must be an object of {\"token id\": bias}");
    size_t n = json_object_size(lb);
    if (n > IB_MAX_LOGIT_BIAS)
        return ib_api_failf(param, "logit_bias", msg, msz, "logit_bias has %zu entries, more than %d", n, IB_MAX_LOGIT_BIAS);
    if (!n) return 0;
    out->ids = malloc(n * sizeof *out->ids);
    out->vals = malloc(n * sizeof *out->vals);
    if (!out->ids || !out->vals) {
        ib_api_bias_free(out);
        return ib_api_failf(param, "logit_bias", msg, msz, "out of memory");
    }
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        int32_t id;
        if (!parse_id(k, vocab, &id)) {
            ib_api_bias_free(out);
            return ib_api_failf(param, "logit_bias", msg, msz, "logit_bias key '%.40s' is not a token id in [0, %d)", k, vocab);
        }
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100)) {
            ib_api_bias_free(out);
            return ib_api_failf(param, "logit_bias", msg, msz, "logit_bias['%s'] must be a number in [-100, 100]", k);
        }
        out->ids[out->n] = id;
        out->vals[out->n++] = (float)json_number_value(v);
    }
    return 0;
}

void ib_api_bias_free(ib_api_bias *b) {
    free(b->ids);
    free(b->vals);
    memset(b, 0, sizeof *b);
}

int ib_api_prompt_count(json_t *pr, char *msg, size_t msz) {
    if (!json_is_array(pr) || json_array_size(pr) == 0) return 0;
    json_t *first = json_array_get(pr, 0);
    size_t n = json_array_size(pr), i;
    json_t *v;
    if (json_is_integer(first)) return 0; /* one prompt of token ids: the handler checks each */
    if (json_is_string(first)) {
        if (n == 1) return 0;
        json_array_foreach(pr, i, v) if (!json_is_string(v)) {
            snprintf(msg, msz, "prompt[%zu] must be a string like prompt[0] (a list of prompts)", i);
            return -1;
        }
        return (int)(n > 1u << 20 ? 1u << 20 : n);
    }
    if (json_is_array(first)) {
        json_array_foreach(pr, i, v) if (!json_is_array(v) || json_array_size(v) == 0) {
            snprintf(msg, msz, "prompt[%zu] must be a non-empty array of token ids like prompt[0]", i);
            return -1;
        }
        return (int)(n > 1u << 20 ? 1u << 20 : n);
    }
    snprintf(msg, msz, "prompt[0] must be a string, a token id or an array of token ids");
    return -1;
}
