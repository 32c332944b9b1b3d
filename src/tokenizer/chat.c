/*
 * chat.c — tokenizer_config.json facts (bos/eos/pad tokens, add_bos_token, add_eos_token, which chat
 * format the chat template writes) and chat formatting for the formats known here:
 *
 *   ChatML (Qwen2, Qwen3):  <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
 *   Llama 3:                <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
 *                           ... <|start_header_id|>assistant<|end_header_id|>\n\n
 *   Gemma (2, 3):           <bos><start_of_turn>user\nSYSTEM\n\nCONTENT<end_of_turn>\n
 *                           <start_of_turn>model\nCONTENT<end_of_turn>\n ... <start_of_turn>model\n
 *                           (no system turn: the system text opens the first user turn; roles
 *                           must alternate user / model, as the template demands)
 *   Gemma 4:                <bos><|turn>system\nSYSTEM<turn|>\n<|turn>user\nCONTENT<turn|>\n
 *                           <|turn>model\nCONTENT<turn|>\n ... <|turn>model\n
 *                           (model turns lose their <|channel>…<channel|> thoughts; the 26B/31B
 *                           templates end the prompt with an empty thought, <|channel>thought\n<channel|>;
 *                           a model turn's tool calls and results come before its text, and a turn
 *                           that ends with results stays open for the model to go on in; calls after
 *                           them go on in it where the template says so, the later templates' way)
 *
 * The Jinja template itself is not run; it is read for facts: which of the two formats it writes,
 * whether it knows enable_thinking, and whether it splits assistant turns at </think> (Qwen3, whose
 * rules for that are reproduced in chatml_assistant below).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* ---------------------------------------------------------------- tokenizer_config.json */

/* Id of a token given by its text: an added token, else a vocabulary token (written in the byte
 * alphabet). -1 when neither. */
static int32_t token_by_text(const ib_tokenizer *t, const char *s) {
    int32_t id = ib_tokenizer_special(t, s);
    if (id >= 0) return id;
    size_t n = strlen(s);
    if (t->byte_fallback) return tok_vocab_find(&t->vocab, s, n);   /* raw UTF-8 tokens */
    char *a = malloc(2 * n + 1);
    if (!a) return -1;
    size_t al = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(a + al, t->alpha[(unsigned char)s[i]], t->alpha_len[(unsigned char)s[i]]);
        al += t->alpha_len[(unsigned char)s[i]];
    }
    id = tok_vocab_find(&t->vocab, a, al);
    free(a);
    return id;
}

/* A token field: a string, an object with "content", or null/absent. Sets *id (-1 when absent) and,
 * when text is non-NULL, a malloc'ed copy of the text. */
static ib_status token_field(const ib_tokenizer *t, const json_t *cfg, const char *key, const char *path, int32_t *id,
                             char **text, ib_error *err) {
    *id = -1;
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return IB_OK;
    if (!json_is_string(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not a string, an object with \"content\", or null", path, key);
    *id = token_by_text(t, json_string_value(v));
    if (*id < 0)
        return ib_fail(err, IB_ERR_MODEL, "%s: field %s: \"%.64s\" is not a token of tokenizer.json", path, key, json_string_value(v));
    if (text && !(*text = strdup(json_string_value(v)))) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    return IB_OK;
}

static ib_status bool_field(const json_t *cfg, const char *key, const char *path, int *out, ib_error *err) {
    const json_t *v = json_object_get(cfg, key);
    *out = 0;
    if (!v || json_is_null(v)) return IB_OK;
    if (!json_is_boolean(v)) return ib_fail(err, IB_ERR_FORMAT, "%s: field %s: not a boolean", path, key);
    *out = json_is_true(v);
    return IB_OK;
}

/* Gemma 4's tool tokens, all of which a tokenizer must have for Gemma 4's tool form (without them the
 * prompt would spell them in bytes and no reply could hand over to the tools). */
static int has_gemma4_tool_tokens(const ib_tokenizer *t) {
    static const char *const need[] = {"<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                                       "<tool_response|>", "<|\"|>"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (ib_tokenizer_special(t, need[i]) < 0) return 0;
    return 1;
}

/* Read the facts of a chat template text. */
static void template_facts(ib_tokenizer *t, const char *tpl) {
    if (strstr(tpl, "<|im_start|>")) t->chat = CHAT_CHATML;
    else if (strstr(tpl, "<|start_header_id|>")) t->chat = CHAT_LLAMA3;
    else if (strstr(tpl, "<|turn>")) t->chat = CHAT_GEMMA4;     /* some Gemma 4 files still mention <start_of_turn> */
    else if (strstr(tpl, "<start_of_turn>")) t->chat = CHAT_GEMMA;
    /* the larger Gemma 4 templates: {{- '<|channel>thought\n<channel|>' -}} after the generation
     * prompt unless enable_thinking (the \n is Jinja's escape in the template text) */
    t->chat_empty_thought = t->chat == CHAT_GEMMA4 && (strstr(tpl, "'<|channel>thought\\n<channel|>'") ||
                                                       strstr(tpl, "\"<|channel>thought\\n<channel|>\""));
    t->chat_thinking = strstr(tpl, "enable_thinking") != NULL;
    t->chat_strip_think = strstr(tpl, "</think>") != NULL && t->chat == CHAT_CHATML;
    /* Qwen's templates declare tools in the system turn and write calls as <tool_call> JSON blocks;
     * Gemma 4's declare them as <|tool>declaration:…<tool|> and write calls as <|tool_call>call:… */
    t->chat_tools = t->chat == CHAT_CHATML && strstr(tpl, "<tool_call>") ? IB_CHAT_TOOLS_QWEN
                    : t->chat == CHAT_GEMMA4 && strstr(tpl, "<|tool_call>") && has_gemma4_tool_tokens(t) ? IB_CHAT_TOOLS_GEMMA4
                                                                           : IB_CHAT_TOOLS_NONE;
    /* the later Gemma 4 templates write no header for a model message with calls after one with results:
     * {%- if not (ns.prev_message_type == 'tool_response' and message['tool_calls']) -%} */
    t->chat_tool_turn_goes_on = t->chat_tools == IB_CHAT_TOOLS_GEMMA4 &&
                                (strstr(tpl, "prev_message_type == 'tool_response' and message['tool_calls']") ||
                                 strstr(tpl, "prev_message_type == \"tool_response\" and message[\"tool_calls\"]"));
}

ib_chat_tool_form ib_tokenizer_chat_tools(const ib_tokenizer *t) { return t ? (ib_chat_tool_form)t->chat_tools : IB_CHAT_TOOLS_NONE; }


/* The template from tokenizer_config.json's chat_template (a string, or a list of {name, template}
 * where "default" or else the first is used), else from chat_template.jinja beside it. */
static ib_status load_template(ib_tokenizer *t, const json_t *cfg, const char *dir, const char *path, ib_error *err) {
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) {
        template_facts(t, json_string_value(ct));
        return IB_OK;
    }
    if (json_is_array(ct)) {
        const json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            const json_t *e = json_array_get(ct, i), *nm = json_object_get(e, "name");
            if (!json_is_string(json_object_get(e, "template")))
                return ib_fail(err, IB_ERR_FORMAT, "%s: field chat_template[%zu].template: missing or not a string", path, i);
            if (!pick || (json_is_string(nm) && !strcmp(json_string_value(nm), "default"))) pick = e;
        }
        if (pick) template_facts(t, json_string_value(json_object_get(pick, "template")));
        return IB_OK;
    }
    if (ct && !json_is_null(ct)) return ib_fail(err, IB_ERR_FORMAT, "%s: field chat_template: not a string or a list", path);
    char p[4096];
    if (snprintf(p, sizeof p, "%s/chat_template.jinja", dir) >= (int)sizeof p) return IB_OK;
    struct stat sb;
    if (stat(p, &sb) == 0 && !S_ISREG(sb.st_mode)) return ib_fail(err, IB_ERR_IO, "%s: not a regular file", p);
    FILE *f = fopen(p, "rb");
    if (!f) return IB_OK;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 16384;
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", p);
            }
            buf = b;
        }
        size_t r = fread(buf + n, 1, 4096, f);
        n += r;
        if (r < 4096) break;
    }
    fclose(f);
    buf[n] = '\0';
    template_facts(t, buf);
    free(buf);
    return IB_OK;
}

/* Read tokenizer_config.json beside tokenizer_path when that is named tokenizer.json and the config
 * exists; then fall back to ChatML when the tokenizer has <|im_start|> and <|im_end|>. */
ib_status tok_load_config(ib_tokenizer *t, const char *tokenizer_path, ib_error *err) {
    char dir[4096], path[4096 + 32];
    const char *slash = strrchr(tokenizer_path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - tokenizer_path > 4000 ? 4000 : slash - tokenizer_path), tokenizer_path);
    if (slash == tokenizer_path) snprintf(dir, sizeof dir, "/");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    ib_status st = IB_OK;
    json_t *cfg = NULL;
    /* the pair is tokenizer.json + tokenizer_config.json; a tokenizer file of another name stands alone */
    int paired = strcmp(slash ? slash + 1 : tokenizer_path, "tokenizer.json") == 0;
    struct stat sb;
    if (paired && stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) /* a FIFO would block the read for ever */
        return ib_fail(err, IB_ERR_IO, "%s: not a regular file", path);
    FILE *f = paired ? fopen(path, "rb") : NULL;
    if (f) {
        fclose(f);
        json_error_t je;
        cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);   /* model_max_length can be 1e30 */
        if (!cfg)
            return ib_fail(err, IB_ERR_FORMAT, "%s: JSON error at line %d column %d (byte offset %d): %s", path, je.line, je.column,
                           je.position, je.text);
        if (!json_is_object(cfg)) {
            st = ib_fail(err, IB_ERR_FORMAT, "%s: top level is not an object", path);
            goto out;
        }
        if ((st = token_field(t, cfg, "bos_token", path, &t->bos_id, &t->bos_text, err)) ||
            (st = token_field(t, cfg, "eos_token", path, &t->eos_id, NULL, err)) ||
            (st = token_field(t, cfg, "pad_token", path, &t->pad_id, NULL, err)) ||
            (st = bool_field(cfg, "add_bos_token", path, &t->add_bos, err)) ||
            (st = bool_field(cfg, "add_eos_token", path, &t->add_eos, err)) ||
            (st = load_template(t, cfg, dir, path, err)))
            goto out;
    }
    /* no template: ChatML, Gemma 4 or Gemma when the tokenizer has the format's two markers */
    if (t->chat == CHAT_NONE && ib_tokenizer_special(t, "<|im_start|>") >= 0 && ib_tokenizer_special(t, "<|im_end|>") >= 0)
        t->chat = CHAT_CHATML;
    if (t->chat == CHAT_NONE && ib_tokenizer_special(t, "<|turn>") >= 0 && ib_tokenizer_special(t, "<turn|>") >= 0) {
        t->chat = CHAT_GEMMA4;
        if (has_gemma4_tool_tokens(t)) t->chat_tools = IB_CHAT_TOOLS_GEMMA4, t->chat_tool_turn_goes_on = 1;
    }
    if (t->chat == CHAT_NONE && ib_tokenizer_special(t, "<start_of_turn>") >= 0 && ib_tokenizer_special(t, "<end_of_turn>") >= 0)
        t->chat = CHAT_GEMMA;
out:
    json_decref(cfg);
    return st;
}

/* ---------------------------------------------------------------- formatting */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Last occurrence of needle in hay (NULL when none). */
static const char *last_of(const char *hay, const char *needle) {
    const char *r = NULL, *p = hay;
    while ((p = strstr(p, needle))) r = p++;
    return r;
}

/* [s, e) without leading / trailing '\n' (Python's lstrip('\n') / rstrip('\n')). */
static void trim_nl(const char **s, const char **e, int left, int right) {
    while (left && *s < *e && **s == '\n') (*s)++;
    while (right && *e > *s && (*e)[-1] == '\n') (*e)--;
}

/* An assistant turn as the Qwen3 template writes it (index i, last user query at last_query):
 * content after the last </think> (leading newlines dropped); the reasoning between <think> and
 * </think>; turns after the last user query keep their reasoning in a <think> block (always for the
 * final message), earlier turns lose it. */
static void chatml_assistant(sbuf *b, const char *c, int i, int n, int last_query) {
    const char *cs = c, *ce = c + strlen(c), *rs = "", *re = rs;
    const char *end_think = strstr(c, "</think>");
    if (end_think) {
        cs = last_of(c, "</think>") + strlen("</think>");
        trim_nl(&cs, &ce, 1, 0);
        rs = c;
        re = end_think;                                /* split('</think>')[0] */
        trim_nl(&rs, &re, 0, 1);
        const char *open = NULL;                       /* .split('<think>')[-1] */
        for (const char *p = rs; (p = strstr(p, "<think>")) && p < re; p++) open = p;
        if (open && open + strlen("<think>") <= re) rs = open + strlen("<think>");
        trim_nl(&rs, &re, 1, 0);
    }
    puts_(b, "<|im_start|>assistant\n");
    if (i > last_query && (i == n - 1 || re > rs)) {
        trim_nl(&rs, &re, 1, 1);
        puts_(b, "<think>\n");
        put(b, rs, (size_t)(re - rs));
        puts_(b, "\n</think>\n\n");
        trim_nl(&cs, &ce, 1, 0);
    }
    put(b, cs, (size_t)(ce - cs));
    puts_(b, "<|im_end|>\n");
}

/* Whitespace as Jinja's trim (Python str.strip) sees it, close enough: ASCII space and controls
 * 0x09..0x0D, 0x1C..0x1F, U+0085, and the Unicode separators. */
static int strip_ws(const unsigned char *s, size_t n, size_t *len) {
    int l = tok_utf8_valid_len(s, n);
    if (l <= 0) return 0;
    uint32_t c = tok_utf8_decode(s, l);
    *len = (size_t)l;
    if (c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x1F) || c == 0x85) return 1;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

static void put_trimmed(sbuf *b, const char *c) {
    const unsigned char *s = (const unsigned char *)c, *e = s + strlen(c);
    size_t l;
    while (s < e && strip_ws(s, (size_t)(e - s), &l)) s += l;
    while (e > s) {   /* back up one character and test it */
        const unsigned char *q = e - 1;
        while (q > s && (*q & 0xC0) == 0x80 && e - q < 4) q--;
        if (!strip_ws(q, (size_t)(e - q), &l) || q + l != e) break;
        e = q;
    }
    put(b, (const char *)s, (size_t)(e - s));
}

/* Gemma 4's strip_thinking: the text of each part between <channel|> markers up to its <|channel>
 * (all of a part without one), joined, then trimmed. */
static void put_gemma4_model(sbuf *b, const char *c) {
    sbuf k = {0};
    const char *p = c;
    for (;;) {
        const char *e = strstr(p, "<channel|>");
        const char *end = e ? e : p + strlen(p);
        const char *open = NULL;
        for (const char *q = p; (q = strstr(q, "<|channel>")) && q < end; q++) {
            open = q;
            break;
        }
        put(&k, p, (size_t)((open ? open : end) - p));
        if (!e) break;
        p = e + strlen("<channel|>");
    }
    if (k.oom) b->oom = 1;
    else put_trimmed(b, k.p ? k.p : "");
    free(k.p);
}

/* Whether s ends with suffix. */
static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

long ib_tokenizer_chat_format(const ib_tokenizer *t, const ib_chat_msg *msgs, int n, int flags, char *out, size_t cap) {
    if (!t || (n > 0 && !msgs) || n < 0 || t->chat == CHAT_NONE) return -1;
    for (int i = 0; i < n; i++)   /* tool_text: Gemma 4's model turns and its first system message only */
        if (!msgs[i].role || !msgs[i].content ||
            (msgs[i].tool_text &&
             (t->chat != CHAT_GEMMA4 ||
              (strcmp(msgs[i].role, "assistant") && (i || (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "developer")))))))
            return -1;
    sbuf b = {0};
    if (t->chat == CHAT_CHATML) {
        int last_query = n - 1;
        for (int i = n - 1; i >= 0; i--)
            if (!strcmp(msgs[i].role, "user")) {
                size_t cl = strlen(msgs[i].content);
                int tool_resp = cl >= 31 && !strncmp(msgs[i].content, "<tool_response>", 15) &&
                                !strcmp(msgs[i].content + cl - 16, "</tool_response>");
                if (!tool_resp) {
                    last_query = i;
                    break;
                }
            }
        for (int i = 0; i < n; i++) {
            if (t->chat_strip_think && !strcmp(msgs[i].role, "assistant")) {
                chatml_assistant(&b, msgs[i].content, i, n, last_query);
                continue;
            }
            puts_(&b, "<|im_start|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "\n");
            puts_(&b, msgs[i].content);
            puts_(&b, "<|im_end|>\n");
        }
        if (flags & IB_CHAT_GENERATION_PROMPT) {
            puts_(&b, "<|im_start|>assistant\n");
            if ((flags & IB_CHAT_NO_THINKING) && t->chat_thinking) puts_(&b, "<think>\n\n</think>\n\n");
        }
    } else if (t->chat == CHAT_GEMMA) {
        if (t->bos_text) puts_(&b, t->bos_text);
        int first = n > 0 && !strcmp(msgs[0].role, "system");
        for (int i = first; i < n; i++) {
            int user = !strcmp(msgs[i].role, "user");
            if (user != ((i - first) % 2 == 0)) {   /* the template raises: roles must alternate */
                free(b.p);
                return -1;
            }
            puts_(&b, "<start_of_turn>");
            puts_(&b, !strcmp(msgs[i].role, "assistant") ? "model" : msgs[i].role);
            puts_(&b, "\n");
            if (first && i == 1) {
                puts_(&b, msgs[0].content);
                puts_(&b, "\n\n");
            }
            put_trimmed(&b, msgs[i].content);
            puts_(&b, "<end_of_turn>\n");
        }
        if (flags & IB_CHAT_GENERATION_PROMPT) puts_(&b, "<start_of_turn>model\n");
    } else if (t->chat == CHAT_GEMMA4) {
        if (t->bos_text) puts_(&b, t->bos_text);
        int first = n > 0 && (!strcmp(msgs[0].role, "system") || !strcmp(msgs[0].role, "developer"));
        int think = (flags & IB_CHAT_THINKING) != 0;
        if (first || think) {
            puts_(&b, "<|turn>system\n");
            if (think) puts_(&b, "<|think|>");
            if (first) put_trimmed(&b, msgs[0].content);
            if (first && msgs[0].tool_text) puts_(&b, msgs[0].tool_text);   /* the tool declarations */
            puts_(&b, "<turn|>\n");
        }
        int open = 0;   /* the last model turn ended with tool responses and no content: not closed */
        for (int i = first; i < n; i++) {
            int model = !strcmp(msgs[i].role, "assistant");
            if (!(open && model && msgs[i].tool_text && t->chat_tool_turn_goes_on)) {   /* calls after results */
                puts_(&b, "<|turn>");
                puts_(&b, model ? "model" : msgs[i].role);
                puts_(&b, "\n");
            }
            if (model && msgs[i].tool_text) puts_(&b, msgs[i].tool_text);
            if (model) put_gemma4_model(&b, msgs[i].content);
            else put_trimmed(&b, msgs[i].content);
            open = model && msgs[i].tool_text && ends_with(msgs[i].tool_text, "<tool_response|>") && !msgs[i].content[0];
            if (!open) puts_(&b, "<turn|>\n");
        }
        if (flags & IB_CHAT_GENERATION_PROMPT) {
            if (!open) puts_(&b, "<|turn>model\n");
            if (t->chat_empty_thought && !think) puts_(&b, "<|channel>thought\n<channel|>");
        }
    } else {
        if (t->bos_text) puts_(&b, t->bos_text);
        for (int i = 0; i < n; i++) {
            puts_(&b, "<|start_header_id|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, msgs[i].content);
            puts_(&b, "<|eot_id|>");
        }
        if (flags & IB_CHAT_GENERATION_PROMPT) puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    long r = b.oom || b.n > (size_t)LONG_MAX ? -1 : (long)b.n;
    if (r >= 0 && cap > 0) {
        size_t k = b.n < cap - 1 ? b.n : cap - 1;
        if (k) memcpy(out, b.p, k);
        out[k] = '\0';
    }
    free(b.p);
    return r;
}

int ib_tokenizer_chat_stops(const ib_tokenizer *t, int32_t *ids, int cap) {
    if (!t || t->chat == CHAT_NONE) return 0;
    int32_t c[3];
    int n = 0;
    static const char *const turn_end[] = {[CHAT_CHATML] = "<|im_end|>", [CHAT_LLAMA3] = "<|eot_id|>",
                                           [CHAT_GEMMA] = "<end_of_turn>", [CHAT_GEMMA4] = "<turn|>"};
    static const char *const text_end[] = {[CHAT_CHATML] = "<|endoftext|>", [CHAT_LLAMA3] = "<|end_of_text|>",
                                           [CHAT_GEMMA] = "<eos>", [CHAT_GEMMA4] = "<eos>"};
    c[n++] = ib_tokenizer_special(t, turn_end[t->chat]);
    c[n++] = t->eos_id;
    c[n++] = ib_tokenizer_special(t, text_end[t->chat]);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (c[i] < 0) continue;
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= c[j] == c[i];
        if (dup) continue;
        if (k < cap && ids) ids[k] = c[i];
        k++;
    }
    return k < cap ? k : cap;
}
