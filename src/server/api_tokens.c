/*
 * api_tokens.c — the bodies of POST /tokenize and /detokenize (so clients can count tokens with the
 * served model's own tokenizer, as with llama-server and vLLM) and the model object of /v1/models.
 * Contracts in api.h.
 */
#include "server/api.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

json_t *ib_api_bytes_str(const char *s, size_t n) {
    char *o = malloc(3 * n + 1);
    if (!o) return json_string("");
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + (size_t)len <= n;
        for (int j = 1; ok && j < len; j++) ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
        if (ok && len == 2 && c < 0xC2) ok = 0;
        if (ok) {
            memcpy(o + k, s + i, (size_t)len);
            k += (size_t)len;
            i += (size_t)len;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    json_t *j = json_stringn(o, k);
    free(o);
    return j ? j : json_string("");
}

/* The chat-formatted text of a messages array (contents already strings: ib_api_normalize_messages),
 * as a new string in *out with its length; -1 with a message. */
static int format_messages(const ib_model *m, json_t *msgs, int gen_prompt, char **out, long *len, const char **param,
                           char *msg, size_t msz) {
    size_t nm = json_array_size(msgs);
    if (nm < 1 || nm > 4096) return ib_api_failf(param, "messages", msg, msz, "messages must hold 1 to 4096 messages");
    ib_chat_msg *cm = calloc(nm, sizeof *cm);
    if (!cm) return ib_api_failf(param, NULL, msg, msz, "out of memory");
    for (size_t i = 0; i < nm; i++) {
        json_t *e = json_array_get(msgs, i), *role = json_object_get(e, "role"), *ct = json_object_get(e, "content");
        if (!json_is_string(role) || !json_is_string(ct)) {
            free(cm);
            return ib_api_failf(param, "messages", msg, msz, "messages[%zu] needs a string role and a string content", i);
        }
        cm[i].role = json_string_value(role);
        cm[i].content = json_string_value(ct);
    }
    int rc = ib_api_chat_text(m, cm, (int)nm, gen_prompt ? IB_CHAT_GENERATION_PROMPT : 0, out, len, param, msg, msz);
    free(cm);
    return rc == -2 ? ib_api_failf(param, NULL, msg, msz, "out of memory") : rc;
}

int ib_api_chat_text(const ib_model *m, const ib_chat_msg *cm, int nm, int flags, char **out, long *len,
                     const char **param, char *msg, size_t msz) {
    long need = ib_chat_format(m, cm, nm, flags, NULL, 0);
    if (need < 0)
        return ib_api_failf(param, "messages", msg, msz, "this model has no chat format, or its format refuses these "
                                                         "roles (Gemma 2/3: user and assistant turns must alternate)");
    char *t = malloc((size_t)need + 1);
    if (!t) return -2;
    ib_chat_format(m, cm, nm, flags, t, (size_t)need + 1);
    *out = t;
    *len = need;
    return 0;
}

int ib_api_tokenize(const ib_model *m, json_t *body, int max_tokens, json_t **out, const char **param, char *msg,
                    size_t msz) {
    *out = NULL;
    if (!body) return ib_api_failf(param, NULL, msg, msz, "the body must be a JSON object");
    json_t *text = json_object_get(body, "content");
    const char *tkey = "content";
    if (!text) text = json_object_get(body, "prompt"), tkey = "prompt";
    json_t *msgs = json_object_get(body, "messages");
    int add_special = 0, pieces = 0, gen_prompt = 1;
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        if (strcmp(k, "content") && strcmp(k, "prompt") && strcmp(k, "messages") && strcmp(k, "add_special") &&
            strcmp(k, "with_pieces") && strcmp(k, "add_generation_prompt") && strcmp(k, "model"))
            return ib_api_failf(param, k, msg, msz, "unknown field '%s': /tokenize takes content (or prompt), messages, "
                                             "add_special, with_pieces, add_generation_prompt, model", k);
        if ((!strcmp(k, "add_special") || !strcmp(k, "with_pieces") || !strcmp(k, "add_generation_prompt")) &&
            !json_is_boolean(v))
            return ib_api_failf(param, k, msg, msz, "%s must be a boolean", k);
    }
    add_special = json_is_true(json_object_get(body, "add_special"));
    pieces = json_is_true(json_object_get(body, "with_pieces"));
    if (json_is_false(json_object_get(body, "add_generation_prompt"))) gen_prompt = 0;
    char *owned = NULL;
    const char *s;
    long len = 0;
    if (text && msgs) return ib_api_failf(param, "messages", msg, msz, "give either %s or messages, not both", tkey);
    if (msgs) {
        if (!json_is_array(msgs)) return ib_api_failf(param, "messages", msg, msz, "messages must be an array");
        if (format_messages(m, msgs, gen_prompt, &owned, &len, param, msg, msz)) return -1;
        s = owned;
    } else if (json_is_string(text)) {
        s = json_string_value(text);
        len = (long)json_string_length(text);
    } else
        return ib_api_failf(param, text ? tkey : "content", msg, msz, "content (or prompt) must be a string, or give messages");
    int cap = max_tokens + 1;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? ib_tokenize_ex(m, s, (size_t)len, add_special ? IB_TOKENIZE_ADD_SPECIAL : 0, ids, cap) : -1;
    free(owned);
    if (n < 0) {
        free(ids);
        return ib_api_failf(param, NULL, msg, msz, "tokenization failed");
    }
    if (n > max_tokens) {
        free(ids);
        return ib_api_failf(param, tkey, msg, msz, "the text has more than this server's limit of %d tokens", max_tokens);
    }
    json_t *toks = json_array();
    char buf[256];
    for (int i = 0; i < n; i++) {
        if (!pieces) {
            json_array_append_new(toks, json_integer(ids[i]));
            continue;
        }
        int w = ib_token_bytes(m, ids[i], buf, sizeof buf);
        json_t *e = json_object();
        json_object_set_new(e, "id", json_integer(ids[i]));
        json_object_set_new(e, "piece", ib_api_bytes_str(buf, w > 0 ? (size_t)w : 0));
        json_array_append_new(toks, e);
    }
    free(ids);
    json_t *j = json_object();
    json_object_set_new(j, "tokens", toks);
    json_object_set_new(j, "count", json_integer(n));
    json_object_set_new(j, "max_model_len", json_integer(ib_model_get_info(m)->max_context));
    *out = j;
    return 0;
}

int ib_api_detokenize(const ib_model *m, json_t *body, json_t **out, const char **param, char *msg, size_t msz) {
    *out = NULL;
    if (!body) return ib_api_failf(param, NULL, msg, msz, "the body must be a JSON object");
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) if (strcmp(k, "tokens") && strcmp(k, "model"))
        return ib_api_failf(param, k, msg, msz, "unknown field '%s': /detokenize takes tokens (and model)", k);
    json_t *toks = json_object_get(body, "tokens");
    if (!json_is_array(toks)) return ib_api_failf(param, "tokens", msg, msz, "tokens must be an array of token ids");
    int vocab = ib_model_get_info(m)->vocab_size;
    size_t n = json_array_size(toks), cap = 256, len = 0;
    char *text = malloc(cap);
    if (!text) return ib_api_failf(param, NULL, msg, msz, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(toks, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab) {
            free(text);
            return ib_api_failf(param, "tokens", msg, msz, "tokens[%zu] must be a token id in [0, %d)", i, vocab);
        }
        char buf[256];
        int w = ib_token_bytes(m, (int32_t)json_integer_value(t), buf, sizeof buf);
        if (w < 0) w = 0;
        if (len + (size_t)w > cap) {
            while (len + (size_t)w > cap) cap *= 2;
            char *nt = realloc(text, cap);
            if (!nt) {
                free(text);
                return ib_api_failf(param, NULL, msg, msz, "out of memory");
            }
            text = nt;
        }
        memcpy(text + len, buf, (size_t)w);
        len += (size_t)w;
    }
    json_t *j = json_object();
    json_object_set_new(j, "content", ib_api_bytes_str(text, len));
    free(text);
    *out = j;
    return 0;
}

json_t *ib_api_model_json(const char *id, const ib_model_info *info) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(id));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(0));
    json_object_set_new(m, "owned_by", json_string("isobatch"));
    json_object_set_new(m, "context_length", json_integer(info->max_context));
    json_object_set_new(m, "max_model_len", json_integer(info->max_context));
    return m;
}
