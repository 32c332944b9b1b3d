/*
 * tok_internal.h — the parts of the BPE tokenizer (byte-level, or SentencePiece-style with byte
 * fallback) shared by its files (not public).
 *
 * Encoding pipeline (the order of Hugging Face tokenizers):
 *   text --(added.c: added tokens that are not "normalized", matched on the raw text)-->
 *   segments --(invalid UTF-8 bytes split off as their own pieces)-->
 *   valid runs --(normalize.c: NFC/NFD/NFKC/NFKD or nothing)-->
 *   --(added.c: "normalized" added tokens, matched on the normalized text)-->
 *   --(pretokenize.c: Split regex/literal with its behavior, ByteLevel prefix space/regex)-->
 *   pieces --(bpe.c: merges by rank over byte tokens, word cache)--> ids
 *
 * Files: tokenizer.c (load, encode driver, decode, writer), bpe.c (vocab and merge tables, the merge
 * engine, the word cache), pretokenize.c, normalize.c, added.c, stream.c (streaming decode),
 * chat.c (tokenizer_config.json facts and chat formatting), api.c (the public ib_* wrappers).
 */
#ifndef IB_TOKENIZER_TOK_INTERNAL_H
#define IB_TOKENIZER_TOK_INTERNAL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

/* ---------------------------------------------------------------- small helpers */

/* A growable vector of ids; oom is set (and pushes stop) when an allocation fails. */
typedef struct tok_ids {
    int32_t *v;   /* [cap] */
    size_t n, cap;
    int oom;
} tok_ids;

void tok_ids_push(tok_ids *a, int32_t id);
void tok_ids_append(tok_ids *a, const int32_t *ids, size_t n);

/* 64-bit hash of n bytes (not cryptographic; for the hash tables below). */
uint64_t tok_hash(const void *p, size_t n);

/* Length of the valid UTF-8 sequence starting at s[0] (1..4), or 0 when s[0..n) does not start
 * with one (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF, no truncation). */
int tok_utf8_valid_len(const unsigned char *s, size_t n);

/* Decode the valid UTF-8 character at s (length from tok_utf8_valid_len). */
uint32_t tok_utf8_decode(const unsigned char *s, int len);

/* UTF-8 of code point c (<= U+10FFFF) into out (4 bytes of room); returns the byte count. */
int tok_utf8_put(uint32_t c, char *out);

/* The GPT-2 byte alphabet (a fact of the format): bytes 33..126, 161..172 and 174..255 stand for
 * the code point of the same value; the other 68 bytes (0..32, 127..160, 173) for 256, 257, … in
 * increasing byte order. tok_byte_alphabet fills cp[256]; tok_alphabet_byte inverts it (-1 when c
 * is not in the alphabet). */
void tok_byte_alphabet(uint32_t cp[256]);
int tok_alphabet_byte(uint32_t c);

/* ---------------------------------------------------------------- vocabulary (bpe.c) */

/* Map from a vocabulary token (its tokenizer.json string, UTF-8 over the GPT-2 byte alphabet) to
 * its id. Open addressing; keys live in an arena. */
typedef struct tok_vocab {
    uint32_t *slot;     /* [cap] entry index + 1; 0 = empty */
    size_t cap;         /* power of two */
    uint32_t *koff;     /* [n] key offset in keys */
    uint32_t *klen;     /* [n] */
    int32_t *id;        /* [n] */
    size_t n, n_alloc;
    char *keys;         /* arena */
    size_t keys_used, keys_cap;
} tok_vocab;

/* Merge table: (left id, right id) -> (rank, merged id); one 16-byte slot per entry so that a
 * lookup touches one cache line. */
typedef struct tok_merge_slot {
    uint64_t key;       /* left << 32 | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t merged;
} tok_merge_slot;

typedef struct tok_merges {
    tok_merge_slot *slot;   /* [cap] */
    size_t cap, n;
} tok_merges;

/* Cache of whole pieces (byte strings up to TOK_CACHE_MAX_KEY bytes) to their ids. Cleared when
 * full. Guarded by mu: encoding is allowed from several threads on one tokenizer. */
#define TOK_CACHE_MAX_KEY 64
typedef struct tok_cache_slot {
    uint64_t h;          /* hash of the key; 0 = empty slot */
    uint32_t koff, voff; /* offsets in kbuf / vbuf */
    uint16_t klen, vlen;
} tok_cache_slot;

typedef struct tok_cache {
    pthread_mutex_t mu;
    int enabled;
    tok_cache_slot *slot; /* [cap] */
    size_t cap, n;        /* cap: power of two */
    char *kbuf;           /* [kcap] */
    int32_t *vbuf;        /* [vcap] */
    size_t kused, kcap, vused, vcap;
    unsigned long hits, misses;
} tok_cache;

/* Scratch memory of one BPE word (per encode call). */
typedef struct tok_bpe_scratch {
    int32_t *sym, *prev, *next;  /* [cap] symbol id, neighbours (-1 none); sym -1 = merged away */
    struct tok_heap_ent *heap;   /* [cap] */
    size_t cap;
    char *alpha;                 /* [2 * cap] the word in alphabet form (ignore_merges lookup) */
} tok_bpe_scratch;

/* ---------------------------------------------------------------- pre-tokenizer (pretokenize.c) */

enum { PT_SPLIT = 1, PT_PREFIX_SPACE, PT_METASPACE };
/* Metaspace prepend_scheme. */
enum { MS_NEVER = 0, MS_ALWAYS, MS_FIRST };
/* Split behaviors (Hugging Face SplitDelimiterBehavior). */
enum { SB_REMOVED = 1, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };

typedef struct pt_step {
    int kind;            /* PT_SPLIT or PT_PREFIX_SPACE */
    pcre2_code *re;      /* PT_SPLIT by regex (NULL for a literal) */
    char *lit;           /* PT_SPLIT by a literal string (owned) */
    size_t lit_len;
    int behavior;        /* SB_* */
    int invert;
    /* PT_METASPACE: spaces become rep (owned, rep_len bytes), rep prepended as prepend says
     * (MS_*), then split before every rep when split is set */
    char *rep;
    size_t rep_len;
    int prepend, split;
} pt_step;

/* ---------------------------------------------------------------- normalizer (normalize.c) */

enum { NORM_NFC = 1, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_REPLACE, NORM_PREPEND };

/* One normalizer step: a Unicode form, Replace (every occurrence of pat, left to right, by rep), or
 * Prepend (rep before a non-empty text). pat and rep are owned. */
typedef struct norm_step {
    int kind;
    char *pat, *rep;
    size_t pat_len, rep_len;
} norm_step;

/* ---------------------------------------------------------------- added tokens (added.c) */

typedef struct added_tok {
    char *content;      /* owned, NUL-terminated */
    size_t len;
    int32_t id;
    unsigned char special, lstrip, rstrip, normalized, single_word;
} added_tok;

/* Byte trie over added-token contents, for leftmost-longest matching. */
typedef struct trie_node {
    int32_t child;      /* first child node, -1 none */
    int32_t sibling;    /* next sibling node, -1 none */
    int32_t tok;        /* index into added[] of the token ending here, -1 none */
    unsigned char byte;
} trie_node;

typedef struct added_trie {
    int32_t root[256];  /* child node of the root for each first byte, -1 none */
    trie_node *node;    /* [n_node] */
    int n_node, cap_node;
    int n_tok;          /* tokens in the trie */
} added_trie;

/* ---------------------------------------------------------------- chat facts (chat.c) */

enum { CHAT_NONE = 0, CHAT_CHATML, CHAT_LLAMA3, CHAT_GEMMA, CHAT_GEMMA4 };

/* ---------------------------------------------------------------- the tokenizer */

struct ib_tokenizer {
    int vocab_limit;
    int32_t n_ids;            /* ids are < n_ids (largest id + 1) */
    int32_t byte_id[256];     /* id of the single-byte token of each byte (<0xXX> with byte_fallback) */
    int byte_fallback;        /* model.byte_fallback: vocabulary tokens are raw UTF-8, BPE starts from
                               * characters, a character without a token becomes its <0xXX> tokens */
    char alpha[256][2];       /* UTF-8 of each byte's alphabet character */
    unsigned char alpha_len[256];

    /* decode: bytes of each id are text[off[id] .. off[id] + len[id]); len 0 = no text */
    size_t *off;              /* [n_ids] (NULL for the bytes tokenizer) */
    uint32_t *len;            /* [n_ids] */
    char *text;               /* arena */
    unsigned char *is_special;/* [n_ids] 1 for added tokens marked special */

    /* model */
    tok_vocab vocab;
    tok_merges merges;
    /* byte_fallback: the pairs of characters (a, b) that occur as "ab" inside some vocabulary token,
     * keys a << 21 | b, plus one (0 = empty). No merge can join symbols across any other adjacent
     * pair, so a word is cut there and its parts are merged (and cached) alone. */
    uint64_t *pairs;
    size_t pairs_cap;
    int ignore_merges;
    tok_cache cache;

    /* normalizer: steps applied in order */
    norm_step norm[8];
    int n_norm;

    /* pre-tokenizer: steps applied in order to every piece */
    pt_step *pt;              /* [n_pt] */
    int n_pt;

    /* added tokens */
    added_tok *added;         /* [n_added] in file order */
    int n_added;
    added_trie trie_raw;      /* normalized == false: matched on the raw text */
    added_trie trie_norm;     /* normalized == true: matched on normalized text */

    /* post-processor (TemplateProcessing "single"): ids around the text when special tokens are added */
    int32_t *post_prefix, *post_suffix;
    int n_post_prefix, n_post_suffix;
    int has_template;

    /* tokenizer_config.json facts */
    int32_t bos_id, eos_id, pad_id;   /* -1 when absent */
    int add_bos, add_eos;
    int chat;                         /* CHAT_* */
    int chat_thinking;                /* the template knows enable_thinking */
    int chat_strip_think;             /* the template drops earlier turns' <think> blocks */
    int chat_tools;                   /* ib_chat_tool_form: Qwen's or Gemma 4's tool form, or none */
    int chat_tool_turn_goes_on;       /* Gemma 4: calls after tool results go on in the open model turn
                                       * (the later templates; the first ones open a new model turn) */
    int chat_empty_thought;           /* Gemma 4: the generation prompt without thinking ends with an
                                       * empty thought channel (<|channel>thought\n<channel|>) */
    char *bos_text;                   /* owned copy of bos_token content (NULL when absent) */
};

/* Loaders, one per JSON section. path is the file name for messages. Each returns IB_OK or fails
 * with a one-line message naming the field. */
ib_status tok_load_merges(ib_tokenizer *t, const json_t *model, const char *path, ib_error *err);
void tok_normalizer_free(ib_tokenizer *t);
ib_status tok_load_normalizer(ib_tokenizer *t, const json_t *v, const char *path, ib_error *err);
ib_status tok_load_pretokenizer(ib_tokenizer *t, const json_t *v, const char *path, ib_error *err);
ib_status tok_load_added(ib_tokenizer *t, const json_t *v, const char *path, ib_error *err);
ib_status tok_load_config(ib_tokenizer *t, const char *tokenizer_path, ib_error *err);

/* Vocabulary map. */
int tok_vocab_add(tok_vocab *v, const char *s, size_t n, int32_t id);  /* 0 ok, 1 duplicate, -1 no memory */
int32_t tok_vocab_find(const tok_vocab *v, const char *s, size_t n);   /* -1 when absent */
void tok_vocab_free(tok_vocab *v);
void tok_merges_free(tok_merges *m);

/* Word cache. */
int tok_cache_init(tok_cache *c);   /* 0 ok, -1 no memory */
void tok_cache_free(tok_cache *c);

/* Build t->pairs from the vocabulary (byte_fallback tokenizers); 0 ok, -1 no memory. */
int tok_pairs_build(ib_tokenizer *t);

/* BPE of one piece (any bytes, n >= 1): append its ids to out (through the cache). */
void tok_bpe_piece(const ib_tokenizer *t, const unsigned char *w, size_t n, tok_bpe_scratch *s, tok_ids *out);
void tok_bpe_scratch_free(tok_bpe_scratch *s);

/* Cancellation of one encode: fn(ctx) is asked, every TOK_CANCEL_EVERY units of work (bytes of
 * input, code points), whether the caller still wants the result; once it says no, hit stays set and
 * the encode unwinds and fails. fn NULL: never cancelled. */
#define TOK_CANCEL_EVERY 65536
typedef struct tok_cancel {
    int (*fn)(void *ctx);
    void *ctx;
    size_t work;   /* units since the last call of fn */
    int hit;
} tok_cancel;

/* Count `work` units against c and return 1 when the encode is cancelled (c may be NULL: 0). */
int tok_cancel_check(tok_cancel *c, size_t work);

/* Normalize s[0..n) (valid UTF-8) with the tokenizer's normalizer. Returns s itself (and *out_n = n)
 * when nothing changes, else a malloc'ed buffer the caller frees; NULL on allocation failure or
 * when cancel (may be NULL) says stop. Time O(n log n) in the longest run of combining marks,
 * linear otherwise. */
const char *tok_normalize(const ib_tokenizer *t, const char *s, size_t n, size_t *out_n, tok_cancel *cancel);

/* One normalization form (NORM_*) of s[0..n) (valid UTF-8) into a new malloc'ed NUL-terminated
 * buffer (*out_n bytes before the NUL), equal to utf8proc_map with the same options; NULL on
 * allocation failure, invalid UTF-8 or cancellation. */
char *tok_normalize_form(int kind, const char *s, size_t n, size_t *out_n, tok_cancel *cancel);

/* Pre-tokenize s[0..n) (valid UTF-8) and BPE every piece into out. md: match data from
 * tok_pretok_match_data (NULL when the tokenizer has no regex step). */
typedef struct tok_enc {
    const ib_tokenizer *t;
    tok_ids *out;
    tok_bpe_scratch bpe;
    pcre2_match_data *md;
    int split_special;        /* do not match added tokens marked special */
    const char *text0;        /* the input text (its first byte is offset 0) */
    const char *seg0;         /* the text tok_pretokenize was last given, and whether it starts at */
    int seg_at0;              /* offset 0 of the input (Metaspace's prepend_scheme "first") */
    tok_cancel cancel;        /* the caller's cancellation (fn NULL: none) */
} tok_enc;
void tok_pretokenize(tok_enc *e, const char *s, size_t n);
void tok_pretok_free(ib_tokenizer *t);
pcre2_match_data *tok_pretok_match_data(const ib_tokenizer *t);

/* Added tokens: split s[0..n) at the tokens of trie (leftmost-longest, with lstrip/rstrip/single_word),
 * calling gap(e, piece, len) for text between tokens and pushing token ids to e->out. */
typedef void (*tok_gap_fn)(tok_enc *e, const char *s, size_t n);
void tok_added_split(tok_enc *e, const added_trie *trie, const char *s, size_t n, tok_gap_fn gap);
void tok_added_free(ib_tokenizer *t);

#endif
