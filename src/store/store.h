/*
 * store.h — the session store: what a stateful session needs to survive its process.
 *
 * A session's state is a pure function of its token history (isobatch's contract), so the store
 * never holds a KV cache: it holds, per session, the token history and the few facts that say how
 * to replay it — the model identity, the KV policy and element type, the sampling settings, the seed
 * and the draw counter — and ib_store_rebuild (below) prefills the history through the ordinary
 * ib_step to get back a session whose KV equals the original's bit for bit.
 *
 * One interface, several back ends, picked by ib_store_open's URI:
 *   "sqlite:PATH"   an SQLite database file (store_sqlite.c; WAL journal, synchronous=FULL).
 *   "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB[?PARAMS]" (or postgres://)  a PostgreSQL server
 *                   (store_pg.c; libpq's URI syntax; synchronous_commit=on), for several servers
 *                   sharing their sessions.
 *
 * DURABILITY. Every call that writes (create, append, update, delete) is one transaction, and it is
 * durable when the call returns IB_OK: the transaction's pages are in the write-ahead log and the log
 * has been fsync'ed (SQLite: journal_mode=WAL, synchronous=FULL; PostgreSQL: synchronous_commit=on,
 * the server's log flushed). A process killed at any moment —
 * SIGKILL included — loses no write that was acknowledged, and a power loss none either (as far as
 * the disk honours fsync). A write that has not returned when the process dies is either wholly
 * there or wholly absent when the store is opened again, never half there. A call that fails has
 * changed nothing.
 *
 * ERRORS. Every call returns an ib_status and, with err non-NULL, a one-line message naming the store
 * and, where there is one, the session:
 *   IB_ERR_NOT_FOUND    no session with that id
 *   IB_ERR_STATE        create of an id that exists; an append that does not continue the stored
 *                       history (expected position); the database is locked by another writer for
 *                       longer than the busy timeout
 *   IB_ERR_FORMAT       the file is not a database, is corrupt, is a database of something else, or
 *                       holds a session whose rows contradict each other
 *   IB_ERR_UNSUPPORTED  the store's schema version is not the one this build reads; an unknown URI
 *   IB_ERR_IO           the disk is full or a read/write/fsync failed (the message says which)
 *   IB_ERR_INVALID_ARG  a bad id, owner hash, count or flag
 *   IB_ERR_NOMEM        an allocation failed
 *
 * THREADS. One ib_store may be used from several threads: SQLite serialises calls by its own lock
 * (appends arriving together share a commit); PostgreSQL runs up to four at once, one connection each.
 * Several processes may open the same SQLite file or PostgreSQL database (writers wait up to 5 s for
 * each other's locks).
 */
#ifndef IB_STORE_STORE_H
#define IB_STORE_STORE_H
#include <stdint.h>

#include "isobatch.h"

/* The schema version this build reads and writes (SQLite: PRAGMA user_version). */
#define IB_STORE_SCHEMA_VERSION 1

/* Session ids: 1..IB_STORE_ID_MAX-1 characters of [A-Za-z0-9_.-]. */
#define IB_STORE_ID_MAX 65

/* How a token entered the session, one byte per token of the history (an OR of these):
 *   SAMPLED       it was drawn by ib_sample, which also put it in the sampler's history
 *                 (repetition-penalty window) at that moment;
 *   NOTE_ON_FEED  when it is fed into the KV it is also noted in the sampler's history
 *                 (ib_session_note_tokens), as the scheduler does for prompt tokens.
 * A server's appended text is NOTE_ON_FEED; the tokens of a generation are SAMPLED, except the last,
 * which stays pending and is fed as the next generation's first prompt token: SAMPLED|NOTE_ON_FEED.
 * ib_store_rebuild replays exactly these notes, so the rebuilt sampler history equals the original. */
enum { IB_STORE_TOK_SAMPLED = 1, IB_STORE_TOK_NOTE_ON_FEED = 2 };

/* The mutable part of a stored session: rewritten by ib_store_update and ib_store_append. */
typedef struct ib_store_progress {
    ib_sampling sampling;  /* the settings of the last draw (the seed is in here) */
    uint64_t draws;        /* the draw counter: the session's sample step (ib_sample calls so far) */
    int n_fed;             /* tokens [0, n_fed) of the history are in the KV; the rest are pending */
} ib_store_progress;

/* One stored session. Loaded records own tokens and flags (ib_store_session_free). */
typedef struct ib_store_session {
    char id[IB_STORE_ID_MAX];
    char owner[65];              /* hex SHA-256 of the owner's key (ib_store_owner_hash); never the key */
    char model_id[IB_MODEL_ID_LEN]; /* ib_model_identity of the model that made it */
    int max_context;             /* full sessions: KV capacity (ib_session_opts.max_context) */
    int kv_sink, kv_window, kv_chunk; /* KV policy (ib_session_opts); window 0 = full */
    ib_kv_dtype kv_dtype;
    ib_store_progress progress;
    int64_t created, updated;    /* unix seconds (set by the store) */
    int32_t *tokens;             /* [n_tokens] the history, oldest first: fed tokens then pending ones */
    uint8_t *flags;              /* [n_tokens] IB_STORE_TOK_* of each token */
    int n_tokens;
} ib_store_session;

typedef struct ib_store ib_store;

/* Open (creating when absent) the store named by uri ("sqlite:PATH"). A new file gets the current
 * schema; an existing one must be an isobatch session store of IB_STORE_SCHEMA_VERSION. */
ib_status ib_store_open(const char *uri, ib_store **out, ib_error *err);
/* Close (NULL allowed). Acknowledged writes were durable already; closing adds nothing to that. */
void ib_store_close(ib_store *st);

/* Hex SHA-256 of an owner's key (the server's Bearer key; "" when it has none) into hex[65]. */
void ib_store_owner_hash(const char *key, char hex[65]);

/* Store a new session: every field of rec but created/updated, with its first rec->n_tokens tokens
 * (may be 0). IB_ERR_STATE when the id exists. */
ib_status ib_store_create(ib_store *st, const ib_store_session *rec, ib_error *err);
/* Load session id into *out (zeroed first; its arrays owned by *out even on failure, so
 * ib_store_session_free is always safe). IB_ERR_NOT_FOUND when absent. */
ib_status ib_store_load(ib_store *st, const char *id, ib_store_session *out, ib_error *err);
/* Append n >= 1 tokens (with their flags) to session id's history, which must hold exactly `at`
 * tokens now (else IB_ERR_STATE: a writer that lost track never appends in the wrong place), and,
 * when p is not NULL, set its progress in the same transaction. */
ib_status ib_store_append(ib_store *st, const char *id, int at, const int32_t *tokens, const uint8_t *flags, int n,
                          const ib_store_progress *p, ib_error *err);
/* Set session id's progress (p->n_fed <= its token count). */
ib_status ib_store_update(ib_store *st, const char *id, const ib_store_progress *p, ib_error *err);
/* Delete session id and its history. IB_ERR_NOT_FOUND when absent. */
ib_status ib_store_delete(ib_store *st, const char *id, ib_error *err);
/* The ids of owner's sessions, oldest first: *ids gets a malloc'ed array of *n malloc'ed strings
 * (ib_store_ids_free), NULL when there are none. */
ib_status ib_store_list_owner(ib_store *st, const char *owner, char ***ids, int *n, ib_error *err);
void ib_store_ids_free(char **ids, int n);
/* Free a loaded record's arrays and zero it (NULL allowed). */
void ib_store_session_free(ib_store_session *rec);

/* Check that id is a valid session id (0) or not (-1). */
int ib_store_id_valid(const char *id);

/* ---- rebuilding a session from its record (store_rebuild.c) ---- */

/* Recreate the session rec describes on engine e (whose model must be the one named by model_id,
 * that model's ib_model_identity): a new ib_session with rec's KV policy, KV element type, capacity
 * and sampling settings, on e's backend; tokens [0, n_fed) fed through ib_step in chunks of at most
 * `chunk` tokens (0 = 64; also bounded by the engine's step size and a windowed session's kv_chunk),
 * the sampler's history replayed from the flags, and the draw counter set. Because ib_step's results
 * do not depend on chunking, the new session's KV, history and draw counter equal those of the
 * session that wrote the record, bit for bit, and so does every later logit and draw. When
 * last_logits is not NULL and n_fed > 0 it gets the [vocab] logits after token n_fed - 1.
 * The engine is the call's alone while it runs. IB_ERR_STATE when model_id differs from the
 * record's; the errors of ib_session_create and ib_step otherwise (nothing is left allocated). */
ib_status ib_store_rebuild(ib_engine *e, const char *model_id, const ib_store_session *rec, int chunk,
                           ib_session **out, float *last_logits, ib_error *err);

/* The sampler half of a rebuild, for a caller that feeds the KV itself (a server feeds tokens
 * [0, n_fed) through its scheduler as a job with n_replay = n_fed, which notes none of them): on s, a
 * session at position 0 with an empty history, note rec's history as the original session noted it
 * (SAMPLED tokens when drawn, NOTE_ON_FEED ones of [0, n_fed) when fed, in history order), set the
 * draw counter to rec's and the sampling settings to rec's. Once the tokens are fed, s equals
 * ib_store_rebuild's session bit for bit. */
void ib_store_replay_notes(ib_session *s, const ib_store_session *rec);

#endif
