/*
 * test_store_rebuild.c — a session written to the SQLite store and rebuilt from it (ib_store_rebuild)
 * carries on exactly as the session that never stopped.
 *
 * On the tiny synthetic model, for full and sink+window sessions with float32, half and q8 KV, a
 * conversation runs the way the server drives a session (appended text noted when fed, prompt chunks
 * of 7, sampled tokens fed back as decode rows, the last one left pending and fed as the next
 * prompt's first token), with temperature sampling and a repetition penalty over a short window so
 * that the sampler's history and draw counter matter. Every append and generation is written to the
 * store. Mid-conversation the record is loaded from a reopened store and rebuilt with prefill chunks
 * of 1, 5 and the default; then the original and each rebuilt session get the same next turn. Checked
 * bitwise: the logits after the last fed token, the digest of every logits row that chose a token,
 * and the tokens. Negative controls show the comparison can fail: a record with one history token
 * changed, with the sampler-history flags dropped, or with the draw counter off by one, continues
 * differently; a record of another model is refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "isobatch.h"
#include "model/mkmodel.h"
#include "store/store.h"

#define MAXT 512

static char tmp[] = "/tmp/ib_rebuild_XXXXXX";
static int V;

/* A session as the server holds it: the live session, its history with flags, what is fed, draws. */
typedef struct conv {
    ib_session *s;
    int32_t tok[MAXT];
    uint8_t fl[MAXT];
    int n, n_fed;
    uint64_t draws;
    int stored;     /* tokens written to the store so far */
    float *last;    /* [V] logits after the last fed token */
} conv;

static ib_sampling samp(void) {
    ib_sampling p = ib_sampling_default();
    p.temperature = 0.9f;
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 20;
    p.seed = 1234;
    return p;
}

static void append(conv *c, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) c->tok[c->n] = ids[i], c->fl[c->n++] = IB_STORE_TOK_NOTE_ON_FEED;
}

/* One generation of max_new tokens, as the scheduler runs it: the pending tokens fed in chunks (each
 * chunk noted in the sampler history), then draws, each drawn token but the last fed back. Returns
 * the digest of the logits rows that chose the tokens; out gets the tokens. */
static uint64_t generate(ib_engine *e, conv *c, int max_new, int chunk, int32_t *out, ib_error *err) {
    uint64_t dig = 14695981039346656037ULL;
    while (c->n_fed < c->n) {
        int n = c->n - c->n_fed < chunk ? c->n - c->n_fed : chunk;
        ib_step_item it = {.session = c->s, .tokens = c->tok + c->n_fed, .n_tokens = n, .logits = c->last};
        if (ib_step(e, &it, 1, err)) return 0;
        ib_session_note_tokens(c->s, c->tok + c->n_fed, n);
        c->n_fed += n;
    }
    for (int g = 0; g < max_new; g++) {
        dig = ib_digest_bytes(dig, c->last, (size_t)V * sizeof(float));
        int32_t t = ib_sample(c->s, c->last);
        c->draws++;
        out[g] = t;
        c->tok[c->n] = t;
        c->fl[c->n++] = g < max_new - 1 ? IB_STORE_TOK_SAMPLED : IB_STORE_TOK_SAMPLED | IB_STORE_TOK_NOTE_ON_FEED;
        if (g < max_new - 1) {
            ib_step_item it = {.session = c->s, .tokens = &t, .n_tokens = 1, .logits = c->last};
            if (ib_step(e, &it, 1, err)) return 0;
            c->n_fed++;
        }
    }
    return dig;
}

/* Write what c holds beyond what the store has, with its progress. */
static ib_status persist(ib_store *st, const char *id, conv *c, ib_error *err) {
    ib_store_progress p = {.sampling = samp(), .draws = c->draws, .n_fed = c->n_fed};
    if (c->n == c->stored) return ib_store_update(st, id, &p, err);
    ib_status rc = ib_store_append(st, id, c->stored, c->tok + c->stored, c->fl + c->stored, c->n - c->stored, &p, err);
    if (!rc) c->stored = c->n;
    return rc;
}

/* The pseudo-random prompt tokens of turn k (byte tokens of the tiny model). */
static void turn_tokens(int k, int32_t *ids, int n) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + k * 101 + 11) % 256);
}

/* The next turn on c: 6 appended tokens and 16 generated; tokens into out[16], digest returned. */
static uint64_t next_turn(ib_engine *e, conv *c, int32_t *out, ib_error *err) {
    int32_t ids[6];
    turn_tokens(3, ids, 6);
    append(c, ids, 6);
    return generate(e, c, 16, 7, out, err);
}

/* A conv around session s taken from a record (what a restarted server holds after rebuilding). */
static void conv_from(conv *c, ib_session *s, const ib_store_session *r) {
    memset(c->tok, 0, sizeof c->tok);
    c->s = s;
    c->n = r->n_tokens;
    memcpy(c->tok, r->tokens, (size_t)r->n_tokens * sizeof(int32_t));
    memcpy(c->fl, r->flags, (size_t)r->n_tokens);
    c->n_fed = r->progress.n_fed;
    c->draws = r->progress.draws;
    c->stored = r->n_tokens;
}

typedef struct cfg {
    const char *name;
    int sink, window;
    ib_kv_dtype dt;
} cfg;

static void run_cfg(const ib_model *m, ib_engine *e, const char *model_id, const cfg *k, int idx) {
    ib_error err;
    char uri[600], sid[32];
    snprintf(uri, sizeof uri, "sqlite:%s/s.db", tmp);
    snprintf(sid, sizeof sid, "sess-%d", idx);
    ib_store *st = NULL;
    CHECK(ib_store_open(uri, &st, &err) == IB_OK, "open: %s", err.msg);
    if (!st) return;
    ib_session_opts so = {.max_context = 256, .sampling = samp(), .kv_sink = k->sink, .kv_window = k->window,
                          .kv_chunk = k->window ? 8 : 0, .kv_dtype = k->dt};
    conv o;
    memset(&o, 0, sizeof o);
    o.last = malloc((size_t)V * sizeof(float));
    CHECK(ib_session_create(m, &so, &o.s, &err) == IB_OK, "%s: session: %s", k->name, err.msg);
    ib_store_session rec;
    memset(&rec, 0, sizeof rec);
    snprintf(rec.id, sizeof rec.id, "%s", sid);
    ib_store_owner_hash("owner-key", rec.owner);
    snprintf(rec.model_id, sizeof rec.model_id, "%s", model_id);
    rec.max_context = so.max_context;
    rec.kv_sink = so.kv_sink;
    rec.kv_window = so.kv_window;
    rec.kv_chunk = so.kv_chunk;
    rec.kv_dtype = so.kv_dtype;
    rec.progress.sampling = samp();
    CHECK(ib_store_create(st, &rec, &err) == IB_OK, "%s: create: %s", k->name, err.msg);

    /* two turns, each written to the store when it completes */
    int32_t ids[40], gen[32];
    turn_tokens(1, ids, 40);
    append(&o, ids, 40);
    CHECK(persist(st, sid, &o, &err) == IB_OK, "%s: persist: %s", k->name, err.msg);
    generate(e, &o, 12, 7, gen, &err);
    CHECK(persist(st, sid, &o, &err) == IB_OK, "%s: persist: %s", k->name, err.msg);
    turn_tokens(2, ids, 9);
    append(&o, ids, 9);
    generate(e, &o, 10, 7, gen, &err);
    CHECK(persist(st, sid, &o, &err) == IB_OK, "%s: persist: %s", k->name, err.msg);
    /* "restart": the store closed and opened again, the record loaded */
    ib_store_close(st);
    st = NULL;
    CHECK(ib_store_open(uri, &st, &err) == IB_OK, "reopen: %s", err.msg);
    ib_store_session r;
    CHECK(st && ib_store_load(st, sid, &r, &err) == IB_OK, "%s: load: %s", k->name, err.msg);
    CHECK(r.n_tokens == o.n && r.progress.n_fed == o.n_fed && r.progress.draws == o.draws &&
              !memcmp(r.tokens, o.tok, (size_t)o.n * 4) && !memcmp(r.flags, o.fl, (size_t)o.n),
          "%s: the record differs from the session (%d/%d tokens)", k->name, r.n_tokens, o.n);
    CHECK(o.n_fed == o.n - 1, "%s: one pending token expected, %d fed of %d", k->name, o.n_fed, o.n);

    /* rebuilds with several prefill chunkings */
    static const int chunks[] = {1, 5, 0};
    conv rb[3];
    float *ll = malloc((size_t)V * sizeof(float));
    for (int j = 0; j < 3; j++) {
        memset(&rb[j], 0, sizeof rb[j]);
        rb[j].last = malloc((size_t)V * sizeof(float));
        ib_session *s = NULL;
        ib_status rc = ib_store_rebuild(e, model_id, &r, chunks[j], &s, ll, &err);
        CHECK(rc == IB_OK, "%s: rebuild (chunk %d): %s", k->name, chunks[j], err.msg);
        if (rc) continue;
        CHECK(!memcmp(ll, o.last, (size_t)V * sizeof(float)), "%s: chunk %d: logits after the last fed token differ",
              k->name, chunks[j]);
        CHECK(ib_session_position(s) == ib_session_position(o.s), "%s: position %d vs %d", k->name,
              ib_session_position(s), ib_session_position(o.s));
        conv_from(&rb[j], s, &r);
    }
    /* the next turn: uninterrupted vs rebuilt */
    int32_t want[16], got[16];
    uint64_t dw = next_turn(e, &o, want, &err);
    for (int j = 0; j < 3; j++) {
        if (!rb[j].s) continue;
        uint64_t dg = next_turn(e, &rb[j], got, &err);
        CHECK(dg == dw && !memcmp(got, want, sizeof want), "%s: chunk %d: rebuilt session continues differently "
              "(digest %016llx vs %016llx)", k->name, chunks[j], (unsigned long long)dg, (unsigned long long)dw);
        ib_session_free(rb[j].s);
        free(rb[j].last);
    }

    /* negative controls: each tampered record continues differently */
    ib_store_session bad = r;
    int32_t *bt = malloc((size_t)r.n_tokens * sizeof(int32_t));
    uint8_t *bf = malloc((size_t)r.n_tokens);
    for (int ctl = 0; ctl < 3; ctl++) {
        memcpy(bt, r.tokens, (size_t)r.n_tokens * sizeof(int32_t));
        memcpy(bf, r.flags, (size_t)r.n_tokens);
        bad.tokens = bt;
        bad.flags = bf;
        bad.progress = r.progress;
        const char *what = ctl == 0 ? "one history token changed" : ctl == 1 ? "sampler flags dropped" : "draws + 1";
        if (ctl == 0) bt[2] = (bt[2] + 1) % 256; /* a sink position: kept by every policy */
        if (ctl == 1) memset(bf, 0, (size_t)r.n_tokens);
        if (ctl == 2) bad.progress.draws++;
        ib_session *s = NULL;
        conv c;
        memset(&c, 0, sizeof c);
        c.last = malloc((size_t)V * sizeof(float));
        if (ib_store_rebuild(e, model_id, &bad, 0, &s, NULL, &err) == IB_OK) {
            conv_from(&c, s, &bad);
            /* the reference the tampered one is compared with: the rebuilt turn above (== want) */
            uint64_t dg = next_turn(e, &c, got, &err);
            CHECK(dg != dw || memcmp(got, want, sizeof want) != 0, "%s: %s, yet the same continuation", k->name, what);
            ib_session_free(s);
        } else
            CHECK(0, "%s: rebuild of a tampered record: %s", k->name, err.msg);
        free(c.last);
    }
    free(bt);
    free(bf);
    /* another model's record */
    ib_session *s = NULL;
    ib_status rc = ib_store_rebuild(e, "sha256:0000", &r, 0, &s, NULL, &err);
    CHECK(rc == IB_ERR_STATE && !s && strstr(err.msg, "was made by model"), "%s: model mismatch: %d %s", k->name, rc,
          err.msg);
    ib_store_session_free(&r);
    ib_store_close(st);
    ib_session_free(o.s);
    free(o.last);
    free(ll);
}

int main(void) {
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    ib_error err;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/model", tmp);
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 9, .bits = 4};
    ib_model *m = NULL;
    ib_engine *e = NULL;
    char model_id[IB_MODEL_ID_LEN];
    if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err) ||
        ib_engine_create(m, &(ib_engine_opts){.threads = 2}, &e, &err) || ib_model_identity(dir, model_id, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return 1;
    }
    V = ib_model_get_info(m)->vocab_size;
    static const cfg cfgs[] = {
        {"full f32", 0, 0, IB_KV_F32},
        {"full f16", 0, 0, IB_KV_F16},
        {"sink:4,window:24 f32", 4, 24, IB_KV_F32},
        {"sink:4,window:24 f16", 4, 24, IB_KV_F16},
        {"full q8", 0, 0, IB_KV_Q8},
        {"sink:4,window:24 q8", 4, 24, IB_KV_Q8},
    };
    for (int i = 0; i < (int)(sizeof cfgs / sizeof cfgs[0]); i++) run_cfg(m, e, model_id, &cfgs[i], i);
    ib_engine_free(e);
    ib_model_free(m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp);
    TEST_MAIN_END("test_store_rebuild");
}
