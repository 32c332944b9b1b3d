/*
 * api.c — the public tokenizer calls of include/isobatch.h that take a model: thin wrappers over the
 * model's tokenizer (ib_tokenize and ib_token_bytes themselves live in model.c).
 */
#include "model/model.h"
#include "tokenizer/tokenizer.h"

int ib_tokenize_ex(const ib_model *m, const char *text, size_t len, int flags, int32_t *ids, int cap) {
    return m ? ib_tokenizer_encode_ex(m->tok, text, len, flags, ids, cap) : -1;
}

int ib_tokenize_cancel(const ib_model *m, const char *text, size_t len, int flags, int32_t *ids, int cap,
                       int (*cancelled)(void *ctx), void *ctx) {
    return m ? ib_tokenizer_encode_cancel(m->tok, text, len, flags, ids, cap, cancelled, ctx) : -1;
}

int32_t ib_token_id(const ib_model *m, const char *content) { return m ? ib_tokenizer_special(m->tok, content) : -1; }

int ib_token_is_special(const ib_model *m, int32_t id) { return m ? ib_tokenizer_is_special(m->tok, id) : 0; }

int ib_text_stream_push(const ib_model *m, ib_text_stream *s, int32_t id, char *out, int cap) {
    return m ? ib_tokenizer_stream_push(m->tok, s, id, out, cap) : -1;
}

int ib_text_stream_flush(ib_text_stream *s, char *out, int cap) { return ib_tokenizer_stream_flush(s, out, cap); }

long ib_chat_format(const ib_model *m, const ib_chat_msg *msgs, int n, int flags, char *out, size_t cap) {
    return m ? ib_tokenizer_chat_format(m->tok, msgs, n, flags, out, cap) : -1;
}

int ib_chat_stop_ids(const ib_model *m, int32_t *ids, int cap) { return m ? ib_tokenizer_chat_stops(m->tok, ids, cap) : 0; }
