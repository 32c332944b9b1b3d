/*
 * tokenizer.h — the model's tokenizer: a Hugging Face tokenizer.json BPE tokenizer, byte-level
 * (Qwen2/Qwen3, Llama 3, GPT-2 style) or SentencePiece-style with byte fallback (Gemma), encoding and
 * decoding as Hugging Face tokenizers does.
 *
 * Supported tokenizer.json parts: model BPE (vocab; merges as "A B" strings or ["A", "B"] pairs;
 * ignore_merges; dropout null; byte_fallback, unk_token, fuse_unk), normalizer null / NFC / NFD /
 * NFKC / NFKD / Replace (String) / Prepend / Sequence, pre_tokenizer Split (Regex or String pattern,
 * any behavior, invert) / ByteLevel / Metaspace / Sequence, decoder ByteLevel (or null), or with
 * byte_fallback ByteFallback / Fuse / Replace (String) / Metaspace (prepend_scheme "never") /
 * Sequence, post_processor ByteLevel / TemplateProcessing / Sequence, added_tokens with special,
 * lstrip, rstrip, normalized, single_word. Anything else (a Strip decoder among them) fails to load
 * with a one-line message naming the field. Every byte needs a single-byte token: the GPT-2 byte
 * alphabet, or <0x00>..<0xFF> with byte_fallback (Gemma); merges need not exist (the byte-level
 * files of `isobatch mkmodel` have none: there id == byte).
 * tokenizer_config.json beside tokenizer.json, when present, gives bos/eos/pad, add_bos_token,
 * add_eos_token and which chat format the chat template uses.
 *
 * A tokenizer is read-only after load except for its word cache, which has its own lock: encode,
 * decode and the rest may be called from several threads at once.
 */
#ifndef IB_TOKENIZER_TOKENIZER_H
#define IB_TOKENIZER_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "isobatch.h"

typedef struct ib_tokenizer ib_tokenizer;

/* Load path (a tokenizer.json). Ids must be < vocab_limit (the model's vocab_size; INT32_MAX when
 * there is no model). Errors name the file and the field ("tok.json: field model.vocab: missing",
 * "…: byte 0x41 has no token", "…: field model.merges[3]: token \"x\" is not in model.vocab"). */
ib_status ib_tokenizer_load(const char *path, int vocab_limit, ib_tokenizer **out, ib_error *err);

/* A tokenizer for models without tokenizer.json: id b (0..255) is byte b. */
ib_status ib_tokenizer_bytes(int vocab_limit, ib_tokenizer **out, ib_error *err);

void ib_tokenizer_free(ib_tokenizer *t);

/* Encode text (len bytes, any bytes) into ids; returns the count (may exceed cap: only cap written),
 * or -1 when memory runs out (or PCRE2 reports a matching limit). Same as ib_tokenizer_encode_ex
 * with flags 0. Adds no special tokens around the text. */
int ib_tokenizer_encode(const ib_tokenizer *t, const char *text, size_t len, int32_t *ids, int cap);

/* Flags: IB_TOKENIZE_ADD_SPECIAL, IB_TOKENIZE_SPLIT_SPECIAL (include/isobatch.h). */
int ib_tokenizer_encode_ex(const ib_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids, int cap);

/* ib_tokenizer_encode_ex that can be abandoned: cancelled(ctx) (NULL: never) is called every 64 KiB
 * or so of work, and once it returns non-zero the encode stops and returns -2. The work is
 * O(len log len) whatever the text (runs of combining marks included), so a check comes soon. */
int ib_tokenizer_encode_cancel(const ib_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids, int cap,
                               int (*cancelled)(void *ctx), void *ctx);

/* Bytes of token id into out (cap bytes); returns the byte count (0 for ids without text, e.g. unknown
 * ids), or -1 when cap is too small. Special tokens decode to their content. */
int ib_tokenizer_decode(const ib_tokenizer *t, int32_t id, char *out, int cap);

/* Id of a special/added token by content ("<|im_end|>"), -1 when absent. */
int32_t ib_tokenizer_special(const ib_tokenizer *t, const char *content);

/* 1 when id is an added token marked special. */
int ib_tokenizer_is_special(const ib_tokenizer *t, int32_t id);

/* Largest id + 1 (0 for none). */
int32_t ib_tokenizer_n_ids(const ib_tokenizer *t);

/* eos_token of tokenizer_config.json (-1 when absent). */
int32_t ib_tokenizer_eos(const ib_tokenizer *t);

/* Turn the word cache on or off (benchmarks); results never depend on it. Not thread-safe. */
void ib_tokenizer_set_cache(ib_tokenizer *t, int on);

/* Cache hits and misses so far (benchmarks). */
void ib_tokenizer_cache_stats(const ib_tokenizer *t, unsigned long *hits, unsigned long *misses);

/* Streaming decode (contracts of ib_text_stream_push / ib_text_stream_flush in isobatch.h). */
int ib_tokenizer_stream_push(const ib_tokenizer *t, ib_text_stream *s, int32_t id, char *out, int cap);
int ib_tokenizer_stream_flush(ib_text_stream *s, char *out, int cap);

/* Chat formatting and turn-ending ids (contracts of ib_chat_format / ib_chat_stop_ids). */
long ib_tokenizer_chat_format(const ib_tokenizer *t, const ib_chat_msg *msgs, int n, int flags, char *out, size_t cap);
int ib_tokenizer_chat_stops(const ib_tokenizer *t, int32_t *ids, int cap);
/* The tool form of the chat format, decided once when the tokenizer is loaded: Qwen's (ChatML whose
 * template writes <tool_call> blocks: Qwen2.5/Qwen3), Gemma 4's (the tokenizer has Gemma 4's seven
 * tool tokens, and its template, if any, writes <|tool_call>), or none. server/tool_calls.c and
 * server/tool_form_gemma4.c write and read them. */
typedef enum ib_chat_tool_form { IB_CHAT_TOOLS_NONE = 0, IB_CHAT_TOOLS_QWEN, IB_CHAT_TOOLS_GEMMA4 } ib_chat_tool_form;
ib_chat_tool_form ib_tokenizer_chat_tools(const ib_tokenizer *t);

/* Write a byte-level tokenizer.json (vocab: the 256 byte tokens at ids 0..255, then the given
 * special tokens at ids 256.. as added_tokens; no merges) and a tokenizer_config.json beside it
 * (eos_token, bos_token null, add_bos_token false). dir must exist. */
ib_status ib_tokenizer_write_bytelevel(const char *dir, const char *const *specials, int n_specials, ib_error *err);

#endif
