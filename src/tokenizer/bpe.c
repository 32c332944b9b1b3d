/*
 * bpe.c — the BPE model: vocabulary map, merge table, the merge engine and the word cache.
 *
 * A piece (bytes) starts as one symbol per byte (the byte's token). Every adjacent pair that has a
 * merge is a candidate; the candidate with the lowest rank is applied first, ties to the leftmost
 * (Hugging Face's order). Candidates sit in a binary min-heap keyed by (rank, position); entries made
 * stale by an earlier merge are recognised when popped and skipped, so each merge costs O(log n)
 * instead of a rescan of the word. With ignore_merges, a piece that is itself a vocabulary token is
 * that token. Results for short pieces are kept in a cache.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

/* ---------------------------------------------------------------- vocabulary map */

/* Grow the slot array to new_cap (a power of two) and rehash every entry. */
static int vocab_rehash(tok_vocab *v, size_t new_cap) {
    uint32_t *slot = calloc(new_cap, sizeof *slot);
    if (!slot) return -1;
    for (size_t i = 0; i < v->n; i++) {
        size_t h = (size_t)tok_hash(v->keys + v->koff[i], v->klen[i]) & (new_cap - 1);
        while (slot[h]) h = (h + 1) & (new_cap - 1);
        slot[h] = (uint32_t)i + 1;
    }
    free(v->slot);
    v->slot = slot;
    v->cap = new_cap;
    return 0;
}

int tok_vocab_add(tok_vocab *v, const char *s, size_t n, int32_t id) {
    if (tok_vocab_find(v, s, n) >= 0) return 1;
    if ((v->n + 1) * 2 > v->cap && vocab_rehash(v, v->cap ? v->cap * 2 : 1024)) return -1;
    if (v->n == v->n_alloc) {
        size_t na = v->n_alloc ? v->n_alloc * 2 : 1024;
        uint32_t *ko = realloc(v->koff, na * sizeof *ko);
        if (!ko) return -1;
        v->koff = ko;
        uint32_t *kl = realloc(v->klen, na * sizeof *kl);
        if (!kl) return -1;
        v->klen = kl;
        int32_t *ids = realloc(v->id, na * sizeof *ids);
        if (!ids) return -1;
        v->id = ids;
        v->n_alloc = na;
    }
    if (!v->keys || v->keys_used + n > v->keys_cap) {   /* an empty first key still needs an arena */
        size_t nc = v->keys_cap ? v->keys_cap : 65536;
        while (nc < v->keys_used + n) nc *= 2;
        if (nc > UINT32_MAX) return -1;
        char *k = realloc(v->keys, nc);
        if (!k) return -1;
        v->keys = k;
        v->keys_cap = nc;
    }
    memcpy(v->keys + v->keys_used, s, n);
    v->koff[v->n] = (uint32_t)v->keys_used;
    v->klen[v->n] = (uint32_t)n;
    v->id[v->n] = id;
    v->keys_used += n;
    size_t h = (size_t)tok_hash(s, n) & (v->cap - 1);
    while (v->slot[h]) h = (h + 1) & (v->cap - 1);
    v->slot[h] = (uint32_t)v->n + 1;
    v->n++;
    return 0;
}

int32_t tok_vocab_find(const tok_vocab *v, const char *s, size_t n) {
    if (!v->cap) return -1;
    size_t h = (size_t)tok_hash(s, n) & (v->cap - 1);
    for (uint32_t e; (e = v->slot[h]) != 0; h = (h + 1) & (v->cap - 1)) {
        e--;
        if (v->klen[e] == n && memcmp(v->keys + v->koff[e], s, n) == 0) return v->id[e];
    }
    return -1;
}

void tok_vocab_free(tok_vocab *v) {
    free(v->slot);
    free(v->koff);
    free(v->klen);
    free(v->id);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

/* ---------------------------------------------------------------- merge table */

/* Slot of a pair key: a full 64-bit mix (the MurmurHash3 finalizer's constants), so that both ids
 * reach every bit of the index. (Taking middle bits of key * constant let pairs that share the
 * right id collide in long probe chains.) */
static inline size_t pair_slot(uint64_t key, size_t cap) {
    uint64_t h = key;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 33;
    return (size_t)h & (cap - 1);
}

static inline uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

/* Rank and merged id of pair (a, b); returns 0 when there is no such merge. */
static inline int merge_find(const tok_merges *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    if (!m->n) return 0;
    uint64_t k = pair_key(a, b);
    for (size_t h = pair_slot(k, m->cap);; h = (h + 1) & (m->cap - 1)) {
        const tok_merge_slot *e = &m->slot[h];
        if (e->key == k) {
            *rank = e->rank;
            *merged = e->merged;
            return 1;
        }
        if (e->key == UINT64_MAX) return 0;
    }
}

/* Insert or overwrite (a later merge of the same pair replaces the earlier one, as in Hugging Face,
 * whose merge map is built by inserting in file order). */
static void merge_put(tok_merges *m, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t k = pair_key(a, b);
    size_t h = pair_slot(k, m->cap);
    while (m->slot[h].key != UINT64_MAX && m->slot[h].key != k) h = (h + 1) & (m->cap - 1);
    if (m->slot[h].key == UINT64_MAX) m->n++;
    m->slot[h] = (tok_merge_slot){k, rank, merged};
}

void tok_merges_free(tok_merges *m) {
    free(m->slot);
    memset(m, 0, sizeof *m);
}

/* Look up one side of merge i in the vocabulary. */
static ib_status merge_side(const ib_tokenizer *t, const char *s, size_t n, size_t i, const char *path,
                            int32_t *out, ib_error *err) {
    *out = tok_vocab_find(&t->vocab, s, n);
    if (*out < 0)
        return ib_fail(err, IB_ERR_MODEL, "%s: field model.merges[%zu]: token \"%.*s\" is not in model.vocab", path, i,
                       (int)(n > 64 ? 64 : n), s);
    return IB_OK;
}

/* Read model.merges: each entry "LEFT RIGHT" (one space) or ["LEFT", "RIGHT"]; both sides and their
 * concatenation must be vocabulary tokens. Rank = position in the list. Absent or null = no merges. */
ib_status tok_load_merges(ib_tokenizer *t, const json_t *model, const char *path, ib_error *err) {
    const json_t *ms = json_object_get(model, "merges");
    if (!ms || json_is_null(ms)) return IB_OK;
    if (!json_is_array(ms)) return ib_fail(err, IB_ERR_FORMAT, "%s: field model.merges: not an array", path);
    size_t n = json_array_size(ms);
    if (n == 0) return IB_OK;
    if (n > UINT32_MAX / 4) return ib_fail(err, IB_ERR_FORMAT, "%s: field model.merges: %zu entries is too many", path, n);
    tok_merges *m = &t->merges;
    m->cap = 1024;
    while (m->cap < 2 * n) m->cap *= 2;
    m->slot = malloc(m->cap * sizeof *m->slot);
    char *cat = NULL;
    size_t cat_cap = 0;
    ib_status st = IB_OK;
    if (!m->slot) goto nomem;
    for (size_t i = 0; i < m->cap; i++) m->slot[i].key = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(ms, i);
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(e)) {
            const char *s = json_string_value(e);
            size_t sl = json_string_length(e);
            const char *sp = memchr(s, ' ', sl);
            if (!sp || sp == s || sp + 1 == s + sl || memchr(sp + 1, ' ', (size_t)(s + sl - sp - 1))) {
                st = ib_fail(err, IB_ERR_FORMAT, "%s: field model.merges[%zu]: \"%.64s\" is not \"LEFT RIGHT\" (two tokens, one space)",
                             path, i, s);
                goto fail;
            }
            a = s;
            la = (size_t)(sp - s);
            b = sp + 1;
            lb = sl - la - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            la = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            lb = json_string_length(json_array_get(e, 1));
            if (!la || !lb) {
                st = ib_fail(err, IB_ERR_FORMAT, "%s: field model.merges[%zu]: empty token", path, i);
                goto fail;
            }
        } else {
            st = ib_fail(err, IB_ERR_FORMAT, "%s: field model.merges[%zu]: not a string \"LEFT RIGHT\" or a pair of strings", path, i);
            goto fail;
        }
        int32_t ia, ib, im;
        if ((st = merge_side(t, a, la, i, path, &ia, err)) || (st = merge_side(t, b, lb, i, path, &ib, err))) goto fail;
        if (la + lb > cat_cap) {
            cat_cap = 2 * (la + lb);
            char *c = realloc(cat, cat_cap);
            if (!c) goto nomem;
            cat = c;
        }
        memcpy(cat, a, la);
        memcpy(cat + la, b, lb);
        im = tok_vocab_find(&t->vocab, cat, la + lb);
        if (im < 0) {
            st = ib_fail(err, IB_ERR_MODEL, "%s: field model.merges[%zu]: merged token \"%.*s\" is not in model.vocab", path, i,
                         (int)(la + lb > 64 ? 64 : la + lb), cat);
            goto fail;
        }
        merge_put(m, ia, ib, (uint32_t)i, im);
    }
    free(cat);
    return IB_OK;
nomem:
    st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory reading model.merges", path);
fail:
    free(cat);
    tok_merges_free(m);
    return st;
}

/* ---------------------------------------------------------------- word cache */

#define CACHE_SLOTS (1u << 16)
#define CACHE_KBYTES (1u << 20)
#define CACHE_VIDS (1u << 18)

int tok_cache_init(tok_cache *c) {
    memset(c, 0, sizeof *c);
    if (pthread_mutex_init(&c->mu, NULL)) return -1;
    c->cap = CACHE_SLOTS;
    c->kcap = CACHE_KBYTES;
    c->vcap = CACHE_VIDS;
    c->slot = calloc(c->cap, sizeof *c->slot);
    c->kbuf = malloc(c->kcap);
    c->vbuf = malloc(c->vcap * sizeof *c->vbuf);
    if (!c->slot || !c->kbuf || !c->vbuf) {
        tok_cache_free(c);
        return -1;
    }
    c->enabled = 1;
    return 0;
}

void tok_cache_free(tok_cache *c) {
    if (c->slot || c->kbuf || c->vbuf) pthread_mutex_destroy(&c->mu);
    free(c->slot);
    free(c->kbuf);
    free(c->vbuf);
    memset(c, 0, sizeof *c);
}

/* Append the cached ids of key to out and return 1, or return 0 on a miss. Caller holds mu. */
static int cache_get(tok_cache *c, uint64_t h, const unsigned char *k, size_t kl, tok_ids *out) {
    for (size_t i = (size_t)h & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
        const tok_cache_slot *s = &c->slot[i];
        if (!s->h) return 0;
        if (s->h == h && s->klen == kl && memcmp(c->kbuf + s->koff, k, kl) == 0) {
            tok_ids_append(out, c->vbuf + s->voff, s->vlen);
            return 1;
        }
    }
}

/* Remember key -> ids (clearing the whole cache first when it is full). Caller holds mu. */
static void cache_put(tok_cache *c, uint64_t h, const unsigned char *k, size_t kl, const int32_t *ids, size_t n) {
    if (n > 0xFFFF || n > c->vcap) return;
    if ((c->n + 1) * 4 > c->cap * 3 || c->kused + kl > c->kcap || c->vused + n > c->vcap) {
        memset(c->slot, 0, c->cap * sizeof *c->slot);
        c->n = c->kused = c->vused = 0;
    }
    size_t i = (size_t)h & (c->cap - 1);
    while (c->slot[i].h) {
        if (c->slot[i].h == h && c->slot[i].klen == kl && memcmp(c->kbuf + c->slot[i].koff, k, kl) == 0) return;
        i = (i + 1) & (c->cap - 1);
    }
    tok_cache_slot *s = &c->slot[i];
    s->h = h;
    s->koff = (uint32_t)c->kused;
    s->klen = (uint16_t)kl;
    s->voff = (uint32_t)c->vused;
    s->vlen = (uint16_t)n;
    memcpy(c->kbuf + c->kused, k, kl);
    memcpy(c->vbuf + c->vused, ids, n * sizeof *ids);
    c->kused += kl;
    c->vused += n;
    c->n++;
}

/* ---------------------------------------------------------------- merge engine */

struct tok_heap_ent {
    uint32_t rank;
    int32_t pos;      /* left symbol */
    int32_t right;    /* right symbol at push time */
    int32_t lid, rid; /* their ids at push time */
    int32_t merged;
};

static inline int heap_less(const struct tok_heap_ent *a, const struct tok_heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct tok_heap_ent *h, size_t *n, struct tok_heap_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct tok_heap_ent heap_pop(struct tok_heap_ent *h, size_t *n) {
    struct tok_heap_ent top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

/* Make room for a word of n bytes; 0 ok, -1 no memory. */
static int scratch_reserve(tok_bpe_scratch *s, size_t n) {
    if (n <= s->cap) return 0;
    size_t nc = s->cap ? s->cap : 64;
    while (nc < n) nc *= 2;
    tok_bpe_scratch ns = {0};
    ns.sym = malloc(nc * sizeof *ns.sym);
    ns.prev = malloc(nc * sizeof *ns.prev);
    ns.next = malloc(nc * sizeof *ns.next);
    ns.heap = malloc(3 * nc * sizeof *ns.heap);
    ns.alpha = malloc(2 * nc);
    if (!ns.sym || !ns.prev || !ns.next || !ns.heap || !ns.alpha) {
        tok_bpe_scratch_free(&ns);
        return -1;
    }
    ns.cap = nc;
    tok_bpe_scratch_free(s);
    *s = ns;
    return 0;
}

void tok_bpe_scratch_free(tok_bpe_scratch *s) {
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    free(s->alpha);
    memset(s, 0, sizeof *s);
}

/* Push the candidate merge of symbols l and r (adjacent, alive) when the pair has a merge. */
static inline void push_pair(const tok_merges *m, tok_bpe_scratch *s, size_t *nh, int32_t l, int32_t r) {
    uint32_t rank;
    int32_t merged;
    if (merge_find(m, s->sym[l], s->sym[r], &rank, &merged))
        heap_push(s->heap, nh, (struct tok_heap_ent){rank, l, r, s->sym[l], s->sym[r], merged});
}

/* Short words (the common case) skip the heap: each live symbol keeps the rank of the pair it
 * starts, the lowest is found by a scan in position order (strict <, so the leftmost wins a tie), and
 * after a merge only the two pairs touching the new symbol are looked up again. Same order as the
 * heap, fewer instructions while the word is short. sym/prev/next as in bpe_word, n <= SMALL_WORD. */
#define SMALL_WORD 32
static void small_word(const tok_merges *m, int32_t *sym, int32_t *prev, int32_t *next) {
    uint32_t rank[SMALL_WORD];
    int32_t merged[SMALL_WORD];
    for (int32_t i = 0; i >= 0; i = next[i])
        if (next[i] < 0 || !merge_find(m, sym[i], sym[next[i]], &rank[i], &merged[i])) rank[i] = UINT32_MAX;
    for (;;) {
        int32_t best = -1;
        uint32_t br = UINT32_MAX;
        for (int32_t i = 0; i >= 0; i = next[i])
            if (rank[i] < br) br = rank[i], best = i;
        if (best < 0) return;
        int32_t r = next[best];
        sym[best] = merged[best];
        next[best] = next[r];
        if (next[r] >= 0) prev[next[r]] = best;
        if (next[best] < 0 || !merge_find(m, sym[best], sym[next[best]], &rank[best], &merged[best])) rank[best] = UINT32_MAX;
        int32_t p = prev[best];
        if (p >= 0 && !merge_find(m, sym[p], sym[best], &rank[p], &merged[p])) rank[p] = UINT32_MAX;
    }
}

/* Merge the ns symbols of s->sym (prev/next not yet set; the scratch holds ns) by the merge ranks, the
 * lowest rank first and, among equal ranks, the leftmost pair first, and append the resulting ids to
 * out. The one merge loop of both BPE front ends (bytes, and characters with byte fallback). */
static void merge_symbols(const ib_tokenizer *t, size_t ns, tok_bpe_scratch *s, tok_ids *out) {
    int32_t *sym = s->sym, *prev = s->prev, *next = s->next;
    for (size_t i = 0; i < ns; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    if (ns > 1 && t->merges.n && ns <= SMALL_WORD) {
        small_word(&t->merges, sym, prev, next);
    } else if (ns > 1 && t->merges.n) {
        size_t nh = 0;
        for (size_t i = 0; i + 1 < ns; i++) push_pair(&t->merges, s, &nh, (int32_t)i, (int32_t)i + 1);
        while (nh) {
            struct tok_heap_ent e = heap_pop(s->heap, &nh);
            int32_t l = e.pos, r = e.right;
            if (sym[l] != e.lid || next[l] != r || sym[r] != e.rid) continue;   /* stale */
            sym[l] = e.merged;
            sym[r] = -1;
            int32_t nx = next[r];
            next[l] = nx;
            if (nx >= 0) prev[nx] = l;
            if (prev[l] >= 0) push_pair(&t->merges, s, &nh, prev[l], l);
            if (nx >= 0) push_pair(&t->merges, s, &nh, l, nx);
        }
    }
    for (int32_t i = 0; i >= 0; i = next[i]) tok_ids_push(out, sym[i]);
}

/* BPE with byte fallback (SentencePiece style): the symbols start as the word's characters, each
 * its vocabulary token, or the <0xXX> tokens of its bytes when it has none (so do bytes that are
 * not valid UTF-8); then the merges as usual. */
static void bpe_word_chars(const ib_tokenizer *t, const unsigned char *w, size_t n, tok_bpe_scratch *s, tok_ids *out) {
    if (n > INT32_MAX / 4 || scratch_reserve(s, n)) {
        out->oom = 1;
        return;
    }
    if (t->ignore_merges) {
        int32_t id = tok_vocab_find(&t->vocab, (const char *)w, n);
        if (id >= 0) {
            tok_ids_push(out, id);
            return;
        }
    }
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_valid_len(w + i, n - i);
        int32_t id = l > 0 ? tok_vocab_find(&t->vocab, (const char *)w + i, (size_t)l) : -1;
        if (id >= 0) {
            s->sym[ns++] = id;
            i += (size_t)l;
            continue;
        }
        for (size_t k = l > 0 ? (size_t)l : 1; k > 0; k--) s->sym[ns++] = t->byte_id[w[i++]];
    }
    merge_symbols(t, ns, s, out);
}

/* BPE of w[0..n) without the cache: append ids to out. */
static void bpe_word(const ib_tokenizer *t, const unsigned char *w, size_t n, tok_bpe_scratch *s, tok_ids *out) {
    if (t->byte_fallback) {
        bpe_word_chars(t, w, n, s, out);
        return;
    }
    if (n == 1 || t->merges.n == 0) {
        for (size_t i = 0; i < n; i++) tok_ids_push(out, t->byte_id[w[i]]);
        return;
    }
    if (n > INT32_MAX / 4 || scratch_reserve(s, n)) {
        out->oom = 1;
        return;
    }
    if (t->ignore_merges) {
        size_t al = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(s->alpha + al, t->alpha[w[i]], t->alpha_len[w[i]]);
            al += t->alpha_len[w[i]];
        }
        int32_t id = tok_vocab_find(&t->vocab, s->alpha, al);
        if (id >= 0) {
            tok_ids_push(out, id);
            return;
        }
    }
    for (size_t i = 0; i < n; i++) s->sym[i] = t->byte_id[w[i]];
    merge_symbols(t, n, s, out);
}

/* ---------------------------------------------------------------- character pairs (byte fallback) */

static inline size_t pair_hash(uint64_t k, size_t cap) { return pair_slot(k, cap); }

static int pairs_put(ib_tokenizer *t, uint64_t k) {
    if (t->pairs_cap == 0) return -1;
    size_t h = pair_hash(k, t->pairs_cap);
    while (t->pairs[h] && t->pairs[h] != k) h = (h + 1) & (t->pairs_cap - 1);
    t->pairs[h] = k;
    return 0;
}

static inline int pairs_has(const ib_tokenizer *t, uint64_t k) {
    for (size_t h = pair_hash(k, t->pairs_cap);; h = (h + 1) & (t->pairs_cap - 1)) {
        if (t->pairs[h] == k) return 1;
        if (!t->pairs[h]) return 0;
    }
}

static inline uint64_t pair_key2(uint32_t a, uint32_t b) { return ((uint64_t)a << 21 | b) + 1; }

int tok_pairs_build(ib_tokenizer *t) {
    const tok_vocab *v = &t->vocab;
    size_t total = 0;   /* an upper bound of the pairs: characters of every token */
    for (size_t i = 0; i < v->n; i++) total += v->klen[i];
    size_t cap = 1024;
    while (cap < 2 * total) cap *= 2;
    t->pairs = calloc(cap, sizeof *t->pairs);
    if (!t->pairs) return -1;
    t->pairs_cap = cap;
    for (size_t i = 0; i < v->n; i++) {
        const unsigned char *k = (const unsigned char *)v->keys + v->koff[i];
        size_t n = v->klen[i], j = 0;
        uint32_t prev = 0;
        int have = 0;
        while (j < n) {
            int l = tok_utf8_valid_len(k + j, n - j);
            if (l <= 0) {   /* not UTF-8 (cannot come from JSON): no pair across it */
                have = 0;
                j++;
                continue;
            }
            uint32_t c = tok_utf8_decode(k + j, l);
            if (have) pairs_put(t, pair_key2(prev, c));
            prev = c;
            have = 1;
            j += (size_t)l;
        }
    }
    return 0;
}

static void piece_cached(const ib_tokenizer *t, const unsigned char *w, size_t n, tok_bpe_scratch *s, tok_ids *out);

/* BPE of one piece through the cache (contract in tok_internal.h). With byte fallback the piece is
 * first cut between adjacent characters that no vocabulary token holds together (both with a token
 * of their own: next to a character that falls back to bytes nothing is cut); each part is merged
 * alone, which gives the same ids (no merge could cross a cut) and lets the cache work on them. */
void tok_bpe_piece(const ib_tokenizer *t, const unsigned char *w, size_t n, tok_bpe_scratch *s, tok_ids *out) {
    if (n == 0) return;
    if (!t->byte_fallback || !t->pairs || t->ignore_merges) {   /* ignore_merges looks at the whole word */
        piece_cached(t, w, n, s, out);
        return;
    }
    size_t start = 0, i = 0;
    uint32_t prev = 0;
    int prev_known = 0;
    while (i < n) {
        int l = tok_utf8_valid_len(w + i, n - i);
        int known = l > 0 && tok_vocab_find(&t->vocab, (const char *)w + i, (size_t)l) >= 0;
        uint32_t c = known ? tok_utf8_decode(w + i, l) : 0;
        if (known && prev_known && !pairs_has(t, pair_key2(prev, c))) {
            piece_cached(t, w + start, i - start, s, out);
            start = i;
        }
        prev = c;
        prev_known = known;
        i += l > 0 ? (size_t)l : 1;
    }
    piece_cached(t, w + start, n - start, s, out);
}

static void piece_cached(const ib_tokenizer *t, const unsigned char *w, size_t n, tok_bpe_scratch *s, tok_ids *out) {
    if (n == 0) return;
    tok_cache *c = (tok_cache *)&t->cache;   /* the cache is the one mutable part, guarded by its mutex */
    if (n == 1 || !c->enabled || n > TOK_CACHE_MAX_KEY || t->merges.n == 0) {
        bpe_word(t, w, n, s, out);
        return;
    }
    uint64_t h = tok_hash(w, n);
    if (!h) h = 1;
    pthread_mutex_lock(&c->mu);
    int hit = cache_get(c, h, w, n, out);
    if (hit) c->hits++;
    else c->misses++;
    pthread_mutex_unlock(&c->mu);
    if (hit) return;
    size_t start = out->n;
    bpe_word(t, w, n, s, out);
    if (out->oom) return;
    pthread_mutex_lock(&c->mu);
    cache_put(c, h, w, n, out->v + start, out->n - start);
    pthread_mutex_unlock(&c->mu);
}
