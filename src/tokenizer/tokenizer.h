/*
 * tokenizer.h — the model's tokenizer (tokenizer.json).
 *
 * This is the byte-level fallback: it reads the vocabulary ("model": {"vocab": {token: id}}) and
 * "added_tokens" of a Hugging Face byte-level tokenizer.json, maps each UTF-8 byte of the text to
 * the id of its single-byte token (GPT-2 byte-to-unicode alphabet), and applies no merges. It decodes
 * any id of the vocabulary (merged tokens too) back to its bytes. Exact for models whose vocabulary
 * has no merges (the synthetic models of `isobatch mkmodel`); for real BPE models it yields a valid
 * but longer encoding than Hugging Face's.
 */
#ifndef IB_TOKENIZER_TOKENIZER_H
#define IB_TOKENIZER_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "isobatch.h"

typedef struct ib_tokenizer ib_tokenizer;

/* Load path (a tokenizer.json). Ids must be < vocab_limit (the model's vocab_size). Errors name the
 * file and the field ("tok.json: field model.vocab: missing", "…: byte 0x41 has no token"). */
ib_status ib_tokenizer_load(const char *path, int vocab_limit, ib_tokenizer **out, ib_error *err);

/* A tokenizer for models without tokenizer.json: id b (0..255) is byte b. */
ib_status ib_tokenizer_bytes(int vocab_limit, ib_tokenizer **out, ib_error *err);

void ib_tokenizer_free(ib_tokenizer *t);

/* Encode text (len bytes, any bytes) into ids; returns the count (may exceed cap: only cap written). */
int ib_tokenizer_encode(const ib_tokenizer *t, const char *text, size_t len, int32_t *ids, int cap);

/* Bytes of token id into out (cap bytes); returns the byte count (0 for ids without text, e.g. unknown
 * ids), or -1 when cap is too small. Special tokens decode to their content. */
int ib_tokenizer_decode(const ib_tokenizer *t, int32_t id, char *out, int cap);

/* Id of a special/added token by content ("<|im_end|>"), -1 when absent. */
int32_t ib_tokenizer_special(const ib_tokenizer *t, const char *content);

/* Write a byte-level tokenizer.json (vocab: the 256 byte tokens at ids 0..255, then the given
 * special tokens at ids 256.. as added_tokens; no merges) and a tokenizer_config.json beside it
 * (eos_token, bos_token null, add_bos_token false). dir must exist. */
ib_status ib_tokenizer_write_bytelevel(const char *dir, const char *const *specials, int n_specials, ib_error *err);

#endif
