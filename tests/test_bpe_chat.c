/*
 * test_bpe_chat.c — streaming decode (held partial UTF-8, U+FFFD for ill-formed bytes, the Unicode
 * standard's example of maximal subparts) and chat formatting (ChatML with and without the Qwen3
 * template's facts, Llama 3 headers, end-of-turn ids). Expected strings are written out by hand from
 * the formats and templates.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "tokenizer/tokenizer.h"

static char tmpdir[64];

/* Push ids one by one through a stream (then flush) and return the concatenated output. */
static size_t stream_all(const ib_tokenizer *t, const int32_t *ids, int n, char *out, size_t cap) {
    ib_text_stream s = {0};
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        int w = ib_tokenizer_stream_push(t, &s, ids[i], out + o, (int)(cap - o));
        CHECK(w >= 0, "push %d failed", i);
        if (w > 0) o += (size_t)w;
    }
    int w = ib_tokenizer_stream_flush(&s, out + o, (int)(cap - o));
    if (w > 0) o += (size_t)w;
    out[o] = '\0';
    return o;
}

/* Stream bytes through the byte tokenizer (id = byte) one id at a time. */
static void expect_stream(const ib_tokenizer *bytes, const char *in, size_t n, const char *want, int line) {
    int32_t ids[256];
    for (size_t i = 0; i < n; i++) ids[i] = (unsigned char)in[i];
    char out[1024];
    size_t o = stream_all(bytes, ids, (int)n, out, sizeof out);
    CHECK(o == strlen(want) && memcmp(out, want, o) == 0, "line %d: stream gave %zu bytes \"%s\", want \"%s\"", line, o, out, want);
}

#define FFFD "\xEF\xBF\xBD"
#define MSG(r, c) {.role = (r), .content = (c)}
#define TOOLMSG(c, tt) {.role = "assistant", .content = (c), .tool_text = (tt)}

static void test_stream(void) {
    ib_tokenizer *b = NULL;
    ib_error err;
    CHECK_EQ_INT(ib_tokenizer_bytes(256, &b, &err), IB_OK);
    if (!b) return;
    /* The Unicode standard's example (chapter 3, "U+FFFD Substitution of Maximal Subparts"):
     * 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d */
    static const char ex[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    expect_stream(b, ex, 13, "a" FFFD FFFD FFFD "b" FFFD "c" FFFD FFFD "d", __LINE__);
    expect_stream(b, "\xE6\x97\xA5\xE6\x9C\xAC", 6, "\xE6\x97\xA5\xE6\x9C\xAC", __LINE__);          /* 日本 byte by byte */
    expect_stream(b, "\xF0\x9F\x98\x80!", 5, "\xF0\x9F\x98\x80!", __LINE__);
    expect_stream(b, "\xED\xA0\x80", 3, FFFD FFFD FFFD, __LINE__);          /* surrogate: ED alone, then A0, 80 */
    expect_stream(b, "\xE0\x80\x80", 3, FFFD FFFD FFFD, __LINE__);          /* overlong */
    expect_stream(b, "\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD, __LINE__); /* above U+10FFFF */
    expect_stream(b, "ab\xE6\x97", 4, "ab" FFFD, __LINE__);                 /* truncated at the end: one FFFD at flush */
    expect_stream(b, "\xC3", 1, FFFD, __LINE__);
    expect_stream(b, "\xFF\xFE", 2, FFFD FFFD, __LINE__);
    expect_stream(b, "\xE6\x97" "x", 3, FFFD "x", __LINE__);

    /* nothing comes out while a character is incomplete */
    ib_text_stream s = {0};
    char out[64];
    CHECK_EQ_INT(ib_tokenizer_stream_push(b, &s, 0xE6, out, 64), 0);
    CHECK_EQ_INT(ib_tokenizer_stream_push(b, &s, 0x97, out, 64), 0);
    CHECK_EQ_INT(s.n_held, 2);
    /* too little room: -1 and the state is unchanged */
    CHECK_EQ_INT(ib_tokenizer_stream_push(b, &s, 0xA5, out, 2), -1);
    CHECK_EQ_INT(s.n_held, 2);
    CHECK_EQ_INT(ib_tokenizer_stream_push(b, &s, 0xA5, out, 64), 3);
    CHECK(memcmp(out, "\xE6\x97\xA5", 3) == 0, "completed character");
    CHECK_EQ_INT(ib_tokenizer_stream_flush(&s, out, 64), 0);
    CHECK_EQ_INT(ib_tokenizer_stream_push(b, &s, 999, out, 64), 0);     /* no such token: nothing */
    ib_tokenizer_free(b);

    /* tokens that split characters: 日本 = E6 97 | A5 E6 | 9C AC */
    char p[128];
    snprintf(p, sizeof p, "%s/split.json", tmpdir);
    FILE *f = fopen(p, "w");
    /* vocabulary: the byte alphabet plus three multi-byte tokens written in it:
     * E6 97 = "æĹ", A5 E6 = "¥æ", 9C AC = "ľ¬" (0x97 -> U+0139, 0x9C -> U+013E, others themselves) */
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {", f);
    for (int c = 0; c < 256; c++) {
        int direct = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        unsigned cp = (unsigned)c;
        if (!direct) {
            unsigned k = 0;
            for (int d = 0; d < c; d++)
                if (!((d >= '!' && d <= '~') || (d >= 0xA1 && d <= 0xAC) || (d >= 0xAE && d <= 0xFF))) k++;
            cp = 256 + k;
        }
        if (cp == '"' || cp == '\\') fprintf(f, "\"\\%c\": %d, ", (char)cp, c);
        else if (cp < 0x80) fprintf(f, "\"%c\": %d, ", (char)cp, c);
        else fprintf(f, "\"%c%c\": %d, ", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)), c);
    }
    fputs("\"\xC3\xA6\xC4\xB9\": 256, \"\xC2\xA5\xC3\xA6\": 257, \"\xC4\xBE\xC2\xAC\": 258}, \"merges\": []}}", f);
    fclose(f);
    ib_tokenizer *t = NULL;
    CHECK_EQ_INT(ib_tokenizer_load(p, 1000, &t, &err), IB_OK);
    if (t) {
        s = (ib_text_stream){0};
        CHECK_EQ_INT(ib_tokenizer_stream_push(t, &s, 256, out, 64), 0);
        int w = ib_tokenizer_stream_push(t, &s, 257, out, 64);
        CHECK(w == 3 && memcmp(out, "\xE6\x97\xA5", 3) == 0, "日 after the second token (%d)", w);
        CHECK_EQ_INT(s.n_held, 1);
        w = ib_tokenizer_stream_push(t, &s, 258, out, 64);
        CHECK(w == 3 && memcmp(out, "\xE6\x9C\xAC", 3) == 0, "本 after the third (%d)", w);
        int32_t ids[3] = {256, 257, 258};
        char all[64];
        size_t o = stream_all(t, ids, 3, all, sizeof all);
        CHECK(o == 6 && memcmp(all, "\xE6\x97\xA5\xE6\x9C\xAC", 6) == 0, "whole stream");
        ib_tokenizer_free(t);
    }
    unlink(p);
}

/* ---------------------------------------------------------------- chat */

static ib_tokenizer *load_dir_sp(const char *sub, const char *config, const char *const *sp, int nsp) {
    char dir[128], p[192];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    mkdir(dir, 0700);
    ib_error err;
    CHECK_EQ_INT(ib_tokenizer_write_bytelevel(dir, sp, nsp, &err), IB_OK);
    if (config) {
        snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(p, "w");
        fputs(config, f);
        fclose(f);
    }
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    ib_tokenizer *t = NULL;
    CHECK_EQ_INT(ib_tokenizer_load(p, 1000, &t, &err), IB_OK);
    if (!t) fprintf(stderr, "load %s: %s\n", p, err.msg);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    rmdir(dir);
    return t;
}

static ib_tokenizer *load_dir(const char *sub, const char *config) {
    static const char *const sp[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                                     "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"};
    return load_dir_sp(sub, config, sp, 8);
}

static void expect_chat(const ib_tokenizer *t, const ib_chat_msg *m, int n, int flags, const char *want, int line);

/* Gemma's specials at 256..: <bos> 256, <eos> 257, <start_of_turn> 258, <end_of_turn> 259, <|turn> 260,
 * <turn|> 261, <|channel> 262, <channel|> 263 */
static const char *const gemma_sp[] = {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<|turn>", "<turn|>", "<|channel>",
                                       "<channel|>"};

/* Gemma 4's tool form: which tokenizers have it, and model turns with tool_text (calls and results in
 * Gemma 4's syntax) — written before the content; a turn ending with results and no content left
 * open, continued by the next model message with tool_text and by the generation prompt. */
static void test_chat_gemma4_tools(void) {
    static const char *const sp[] = {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<|turn>", "<turn|>", "<|channel>",
                                     "<channel|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                                     "<tool_response|>", "<|\"|>"};
#define G4_CHAIN "{%- if not (ns.prev_message_type == 'tool_response' and message['tool_calls']) -%}"
    ib_tokenizer *t = load_dir_sp("g4tools", "{\"chat_template\": \"{{ '<|turn>' + role }}{{ '<|tool_call>call:' }}" G4_CHAIN
                                             "{{- '<|channel>thought\\\\n<channel|>' -}}\", \"bos_token\": \"<bos>\"}", sp, 15);
    if (!t) return;
    CHECK(ib_tokenizer_chat_tools(t) == IB_CHAT_TOOLS_GEMMA4, "a Gemma 4 template writing <|tool_call>: Gemma 4's tools");
    static const char C1[] = "<|tool_call>call:f{a:1}<tool_call|>", R1[] = "<|tool_response>response:f{r:2}<tool_response|>";
    static const char C2[] = "<|tool_call>call:h{}<tool_call|>", R2[] = "<|tool_response>response:h{value:3}<tool_response|>";
    char c1r1[256], c2r2[256];
    snprintf(c1r1, sizeof c1r1, "%s%s", C1, R1);
    snprintf(c2r2, sizeof c2r2, "%s%s", C2, R2);
    /* results, no content: the turn stays open and the generation prompt goes on in it (no header) */
    ib_chat_msg a[2] = {MSG("user", "q"), TOOLMSG("", c1r1)};
    expect_chat(t, a, 2, IB_CHAT_GENERATION_PROMPT,
                "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|tool_call>call:f{a:1}<tool_call|>"
                "<|tool_response>response:f{r:2}<tool_response|><|channel>thought\n<channel|>", __LINE__);
    /* the answer after the results: content trimmed, thoughts dropped, the turn closed; then a new one */
    ib_chat_msg b[2] = {MSG("user", "q"), TOOLMSG(" <|channel>thought\nx<channel|>It is 2. ", c1r1)};
    expect_chat(t, b, 2, IB_CHAT_GENERATION_PROMPT,
                "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|tool_call>call:f{a:1}<tool_call|>"
                "<|tool_response>response:f{r:2}<tool_response|>It is 2.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
                __LINE__);
    /* calls after results continue the open turn; a user message after an open turn opens its own */
    ib_chat_msg c[4] = {MSG("user", "q"), TOOLMSG("", c1r1), TOOLMSG("done", c2r2), MSG("user", "more")};
    expect_chat(t, c, 4, 0,
                "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|tool_call>call:f{a:1}<tool_call|>"
                "<|tool_response>response:f{r:2}<tool_response|><|tool_call>call:h{}<tool_call|>"
                "<|tool_response>response:h{value:3}<tool_response|>done<turn|>\n<|turn>user\nmore<turn|>\n", __LINE__);
    ib_chat_msg d[3] = {MSG("user", "q"), TOOLMSG("", c1r1), MSG("user", "more")};
    expect_chat(t, d, 3, 0,
                "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|tool_call>call:f{a:1}<tool_call|>"
                "<|tool_response>response:f{r:2}<tool_response|><|turn>user\nmore<turn|>\n", __LINE__);
    /* calls without results close the turn; a plain model message after an open turn has a header */
    ib_chat_msg e[2] = {MSG("user", "q"), TOOLMSG("", C1)};
    expect_chat(t, e, 2, 0, "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|tool_call>call:f{a:1}<tool_call|><turn|>\n", __LINE__);
    ib_chat_msg f[3] = {MSG("user", "q"), TOOLMSG("", c1r1), MSG("assistant", "x")};
    expect_chat(t, f, 3, 0,
                "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|tool_call>call:f{a:1}<tool_call|>"
                "<|tool_response>response:f{r:2}<tool_response|><|turn>model\nx<turn|>\n", __LINE__);
    /* tool_text belongs to model turns only */
    ib_chat_msg u[1] = {{.role = "user", .content = "q", .tool_text = C1}};
    CHECK_EQ_INT(ib_tokenizer_chat_format(t, u, 1, 0, NULL, 0), -1);
    ib_tokenizer_free(t);
    /* the first templates open a new model turn for calls after results (the open one never closed) */
    t = load_dir_sp("g4toolsold", "{\"chat_template\": \"{{ '<|turn>' + role }}{{ '<|tool_call>call:' }}\", \"bos_token\": \"<bos>\"}",
                    sp, 15);
    if (!t) return;
    expect_chat(t, c, 4, IB_CHAT_GENERATION_PROMPT,
                "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|tool_call>call:f{a:1}<tool_call|>"
                "<|tool_response>response:f{r:2}<tool_response|><|turn>model\n<|tool_call>call:h{}<tool_call|>"
                "<|tool_response>response:h{value:3}<tool_response|>done<turn|>\n<|turn>user\nmore<turn|>\n<|turn>model\n", __LINE__);
    expect_chat(t, a, 2, IB_CHAT_GENERATION_PROMPT,
                "<bos><|turn>user\nq<turn|>\n<|turn>model\n<|tool_call>call:f{a:1}<tool_call|>"
                "<|tool_response>response:f{r:2}<tool_response|>", __LINE__);
    ib_tokenizer_free(t);
    /* no template: the tool tokens decide; the template of the plain Gemma 4 test has no <|tool_call> */
    t = load_dir_sp("g4toolsn", NULL, sp, 15);
    if (!t) return;
    CHECK(ib_tokenizer_chat_tools(t) == IB_CHAT_TOOLS_GEMMA4, "Gemma 4's tool tokens without a template: Gemma 4's tools");
    ib_tokenizer_free(t);
    t = load_dir_sp("g4toolsm", NULL, sp, 14);   /* no <|"|> */
    if (!t) return;
    CHECK(ib_tokenizer_chat_tools(t) == IB_CHAT_TOOLS_NONE, "a tool token missing: no tools");
    ib_tokenizer_free(t);
    t = load_dir_sp("g4toolst", "{\"chat_template\": \"{{ '<|turn>' + role }}\"}", sp, 15);
    if (!t) return;
    CHECK(ib_tokenizer_chat_tools(t) == IB_CHAT_TOOLS_NONE, "a Gemma 4 template without <|tool_call>: no tools");
    ib_tokenizer_free(t);
    t = load_dir_sp("g4toolstm", "{\"chat_template\": \"{{ '<|turn>' + role }}{{ '<|tool_call>call:' }}\"}", sp, 14);
    if (!t) return;
    CHECK(ib_tokenizer_chat_tools(t) == IB_CHAT_TOOLS_NONE, "a template writing <|tool_call>, a tool token missing: no tools");
    ib_tokenizer_free(t);
    /* other formats refuse tool_text */
    t = load_dir("plainq", NULL);
    if (!t) return;
    ib_chat_msg q[2] = {MSG("user", "q"), TOOLMSG("", C1)};
    CHECK_EQ_INT(ib_tokenizer_chat_format(t, q, 2, 0, NULL, 0), -1);
    CHECK_EQ_INT(ib_tokenizer_chat_format(t, q, 1, 0, NULL, 0), (long)strlen("<|im_start|>user\nq<|im_end|>\n"));
    ib_tokenizer_free(t);
}

static void test_chat_gemma(void) {
    /* Gemma 3: the system text opens the first user turn (untrimmed, then a blank line); content
     * trimmed; assistant is "model"; <bos> first */
    ib_tokenizer *t = load_dir_sp("gemma3", "{\"chat_template\": \"{{ bos_token }}{{ '<start_of_turn>' + role + '\\\\n' }}\","
                                            " \"bos_token\": \"<bos>\", \"eos_token\": \"<eos>\"}", gemma_sp, 8);
    if (!t) return;
    ib_chat_msg m[4] = {MSG("system", " Be brief. "), MSG("user", " hi\n"), MSG("assistant", "Hello!\n\n"), MSG("user", "2+2?")};
    expect_chat(t, m, 4, IB_CHAT_GENERATION_PROMPT,
                "<bos><start_of_turn>user\n Be brief. \n\nhi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n", __LINE__);
    expect_chat(t, m + 1, 1, 0, "<bos><start_of_turn>user\nhi<end_of_turn>\n", __LINE__);
    /* the template refuses turns that do not alternate user / model */
    ib_chat_msg bad[2] = {MSG("user", "a"), MSG("user", "b")};
    CHECK_EQ_INT(ib_tokenizer_chat_format(t, bad, 2, 0, NULL, 0), -1);
    CHECK_EQ_INT(ib_tokenizer_chat_format(t, m + 2, 1, 0, NULL, 0), -1);
    int32_t stops[4];
    int ns = ib_tokenizer_chat_stops(t, stops, 4);
    CHECK(ns == 2 && stops[0] == 259 && stops[1] == 257, "gemma stops: %d (%d %d)", ns, stops[0], stops[1]);
    ib_tokenizer_free(t);

    /* Gemma 4: a system turn of its own; model turns lose their thoughts; the larger models' template
     * ends the generation prompt with an empty thought */
    t = load_dir_sp("gemma4", "{\"chat_template\": \"{{ bos_token }}{{ '<|turn>' + role + '\\\\n' }}{%- if not "
                              "enable_thinking | default(false) -%}{{- '<|channel>thought\\\\n<channel|>' -}}{%- endif -%}\","
                              " \"bos_token\": \"<bos>\", \"eos_token\": \"<eos>\"}", gemma_sp, 8);
    if (!t) return;
    ib_chat_msg g[4] = {MSG("system", " Be brief.\n"), MSG("user", "hi "), MSG("assistant", "<|channel>thought\nhm<channel|> Hello! "),
                        MSG("user", "2+2?")};
    expect_chat(t, g, 4, IB_CHAT_GENERATION_PROMPT,
                "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\nHello!<turn|>\n"
                "<|turn>user\n2+2?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>", __LINE__);
    /* strip_thinking: each part between <channel|> markers up to its <|channel>, joined */
    ib_chat_msg h[2] = {MSG("user", "u"), MSG("assistant", "a<|channel>x<channel|>b<|channel>y")};
    expect_chat(t, h, 2, 0, "<bos><|turn>user\nu<turn|>\n<|turn>model\nab<turn|>\n", __LINE__);
    /* thinking on: <|think|> opens the system turn (written even without a system message), no empty thought */
    expect_chat(t, g, 2, IB_CHAT_GENERATION_PROMPT | IB_CHAT_THINKING,
                "<bos><|turn>system\n<|think|>Be brief.<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n", __LINE__);
    expect_chat(t, g + 1, 1, IB_CHAT_GENERATION_PROMPT | IB_CHAT_THINKING,
                "<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n", __LINE__);
    ns = ib_tokenizer_chat_stops(t, stops, 4);
    CHECK(ns == 2 && stops[0] == 261 && stops[1] == 257, "gemma 4 stops: %d (%d %d)", ns, stops[0], stops[1]);
    ib_tokenizer_free(t);

    /* the small models' template (no empty thought); without any template the markers decide */
    t = load_dir_sp("gemma4s", "{\"chat_template\": \"{{ '<|turn>' + role }}\", \"bos_token\": \"<bos>\"}", gemma_sp, 8);
    if (!t) return;
    expect_chat(t, g + 1, 1, IB_CHAT_GENERATION_PROMPT, "<bos><|turn>user\nhi<turn|>\n<|turn>model\n", __LINE__);
    ib_tokenizer_free(t);
    t = load_dir_sp("gemma4n", NULL, gemma_sp, 8);
    if (!t) return;
    expect_chat(t, g + 1, 1, IB_CHAT_GENERATION_PROMPT, "<|turn>user\nhi<turn|>\n<|turn>model\n", __LINE__);
    ib_tokenizer_free(t);
    static const char *const g3sp[] = {"<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"};
    test_chat_gemma4_tools();
    t = load_dir_sp("gemma3n", NULL, g3sp, 4);
    if (!t) return;
    expect_chat(t, g + 1, 1, IB_CHAT_GENERATION_PROMPT, "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", __LINE__);
    ib_tokenizer_free(t);
}

static void expect_chat(const ib_tokenizer *t, const ib_chat_msg *m, int n, int flags, const char *want, int line) {
    char out[2048];
    long k = ib_tokenizer_chat_format(t, m, n, flags, out, sizeof out);
    CHECK(k == (long)strlen(want) && strcmp(out, want) == 0, "line %d: chat gave %ld bytes:\n%s\nwant:\n%s", line, k, out, want);
}

static void test_chat(void) {
    /* ChatML from the special tokens alone (the files `isobatch mkmodel` writes have no template) */
    ib_tokenizer *t = load_dir("plain", NULL);
    if (!t) return;
    ib_chat_msg m[4] = {MSG("system", "S"), MSG("user", "U"), MSG("assistant", "<think>\nr\n</think>\n\nA"), MSG("user", "V")};
    expect_chat(t, m, 2, IB_CHAT_GENERATION_PROMPT,
                "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n", __LINE__);
    expect_chat(t, m + 1, 1, 0, "<|im_start|>user\nU<|im_end|>\n", __LINE__);
    /* without the Qwen3 template nothing is stripped and no-thinking adds nothing */
    expect_chat(t, m, 4, IB_CHAT_GENERATION_PROMPT | IB_CHAT_NO_THINKING,
                "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA"
                "<|im_end|>\n<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n", __LINE__);
    int32_t stops[4];
    int ns = ib_tokenizer_chat_stops(t, stops, 4);
    /* specials were written at 256.. in order: <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258;
     * eos_token is <|im_end|>: the stops are {258, 256} */
    CHECK(ns == 2 && stops[0] == 258 && stops[1] == 256, "stops: %d (%d %d)", ns, stops[0], stops[1]);
    /* the length is returned whole; the text is cut to the room given, NUL-terminated */
    char small[8];
    long k = ib_tokenizer_chat_format(t, m + 1, 1, 0, small, sizeof small);
    CHECK(k == 29 && strcmp(small, "<|im_st") == 0, "truncated: %ld \"%s\"", k, small);
    CHECK_EQ_INT(ib_tokenizer_chat_format(t, m + 1, 1, 0, NULL, 0), 29);
    ib_tokenizer_free(t);

    /* Qwen3: the template mentions enable_thinking and </think> */
    t = load_dir("qwen3", "{\"chat_template\": \"{{- '<|im_start|>' + message.role }} {%- if enable_thinking is defined and "
                          "enable_thinking is false %}{{- '<think>\\\\n\\\\n</think>\\\\n\\\\n' }}{%- endif %} "
                          "{%- set content = message.content.split('</think>')[-1] %}\", \"eos_token\": \"<|im_end|>\"}");
    if (!t) return;
    expect_chat(t, m + 1, 1, IB_CHAT_GENERATION_PROMPT | IB_CHAT_NO_THINKING,
                "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", __LINE__);
    /* THINKING is Gemma 4's; Qwen3 thinks by default and ignores it */
    expect_chat(t, m + 1, 1, IB_CHAT_GENERATION_PROMPT | IB_CHAT_THINKING, "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n",
                __LINE__);
    /* an assistant turn before the last user turn loses its reasoning */
    expect_chat(t, m, 4, IB_CHAT_GENERATION_PROMPT,
                "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                "<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n", __LINE__);
    /* the final assistant turn after the last user turn keeps a (possibly empty) think block */
    ib_chat_msg c[2] = {MSG("user", "U"), MSG("assistant", "\n\nplain")};
    expect_chat(t, c, 2, 0, "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nplain<|im_end|>\n",
                __LINE__);
    ib_chat_msg d[2] = {MSG("user", "U"), MSG("assistant", "<think>\n\nwhy\n\n</think>\n\nso")};
    expect_chat(t, d, 2, 0, "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nso<|im_end|>\n", __LINE__);
    /* a user turn that is a tool response does not count as the last query */
    ib_chat_msg e[3] = {MSG("user", "U"), MSG("assistant", "<think>r</think>A"), MSG("user", "<tool_response>x</tool_response>")};
    expect_chat(t, e, 3, 0,
                "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n"
                "<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n", __LINE__);
    ib_tokenizer_free(t);

    /* Llama 3: headers, trimmed content, bos_token first */
    t = load_dir("llama3", "{\"chat_template\": \"{% set content = '<|start_header_id|>' + message['role'] %}\","
                           " \"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|end_of_text|>\"}");
    if (!t) return;
    ib_chat_msg l[2] = {MSG("system", " Be brief.\n"), MSG("user", "\t hi \xE3\x80\x80")};
    expect_chat(t, l, 2, IB_CHAT_GENERATION_PROMPT,
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                __LINE__);
    ns = ib_tokenizer_chat_stops(t, stops, 4);
    /* <|eot_id|> is 262, <|end_of_text|> 263 (the eos) */
    CHECK(ns == 2 && stops[0] == 262 && stops[1] == 263, "llama stops: %d (%d %d)", ns, stops[0], stops[1]);
    ib_tokenizer_free(t);

    /* no chat format */
    ib_tokenizer *b = NULL;
    ib_error err;
    ib_tokenizer_bytes(256, &b, &err);
    CHECK_EQ_INT(ib_tokenizer_chat_format(b, m, 1, 0, NULL, 0), -1);
    CHECK_EQ_INT(ib_tokenizer_chat_stops(b, stops, 4), 0);
    ib_tokenizer_free(b);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ib_bpec_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_stream();
    test_chat();
    test_chat_gemma();
    CHECK(rmdir(tmpdir) == 0, "temporary directory %s not empty", tmpdir);
    TEST_MAIN_END("test_bpe_chat");
}
