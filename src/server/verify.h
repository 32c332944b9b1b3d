/*
 * verify.h — replay verification: the record every generating response carries ("verification"),
 * and re-running one alone to say whether it holds.
 *
 * A record holds everything a generation's numbers are a function of: the model identity, the
 * contract version, the numeric mode (activation mode, KV element type, KV policy), the tokens in the
 * session before the request ("history", with their IB_STORE_TOK_* flags, which say how the sampler's
 * repetition history was built) and the draw counter, the prompt tokens fed by the request, the
 * sampling settings and seed, the logit bias, the JSON constraint and its stop ids — and what came
 * out: every token drawn (the stop token included), and after each one the running digest (64-bit
 * FNV-1a, ib_digest_bytes) over the float32 logits rows that chose the tokens so far; the last is
 * "digest", what `isobatch generate --json` reports for the same generation.
 *
 * Re-running (ib_verify_submit) builds a fresh session with the record's KV policy, replays the
 * history's sampler notes and draw counter (ib_store_replay_notes), feeds history and prompt as one
 * scheduler job whose history part is not noted (ib_sched_job.n_replay) and samples as many tokens as
 * the record holds. Because every answer is batch-invariant, the re-run — alone or among a server's
 * other work — gives the same tokens and digests exactly when the record is what this model produced;
 * the first step whose token or running digest differs is the first diverging step.
 *
 * JSON form ("verification" object; every field required unless noted):
 *   contract      IB_VERIFY_CONTRACT
 *   model         ib_model_identity ("sha256:" + 64 hex)
 *   act           "f32" | "q8"          kv_dtype "f32" | "f16"
 *   kv            "full" | "window:W" | "sink:S,window:W"
 *   max_context   a full session's KV capacity; kv_chunk: a windowed one's chunk slots. Both size the
 *                 sampler's repetition history (a full history stops noting at capacity + 1 entries;
 *                 a windowed one keeps its latest half when it passes its slots), so they are part of
 *                 the numbers of a session with a repetition penalty
 *   history       [ids] (optional, default [])   flags: [int] for history + prompt (optional: history
 *                 tokens NOTE_ON_FEED, prompt tokens NOTE_ON_FEED)
 *   draws         the draw counter before the first draw (optional, default 0)
 *   prompt        [ids], at least one
 *   sampling      {temperature, top_k, top_p, min_p, repetition_penalty, repeat_last_n, seed}
 *                 (seed as an integer; floats as JSON numbers, exact for float32 values)
 *   logit_bias    [[id, bias], ...] in the order applied (optional)
 *   the constraint the reply was decoded under (optional; constraint.c writes and reads it back,
 *   checked as a request's fields, and the re-run builds its mask with the server's own set-up):
 *     response_format   "json_object", or the request's {"type": "json_schema", "json_schema": {...}}
 *     tools, tool_choice   a forced call: the functions whose schemas build the mask, each
 *                   {"type": "function", "function": {"name", "parameters"?}} (the named one, or every
 *                   tool under "required"), and the tool_choice ({"type": "function", "function":
 *                   {"name"}} or "required")
 *     parallel_tool_calls   with "required" (required there): whether the reply may go on to more calls
 *   with stop_ids [ids] (optional): the ids the constrained reply may end with
 *   tokens        [ids] drawn          digest "16 hex"     step_digests ["16 hex", ...] per token
 */
#ifndef IB_SERVER_VERIFY_H
#define IB_SERVER_VERIFY_H
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "isobatch.h"
#include "server/api.h"

/* The contract version: bump when a change of the numerics (or of what a record means) makes old
 * records unverifiable. system_fingerprint = model identity + "/contract-" + this. */
#define IB_VERIFY_CONTRACT 1

/* A parsed record (owned arrays). */
typedef struct ib_vrec {
    char model[IB_MODEL_ID_LEN];
    ib_act act;
    ib_kv_dtype kv_dtype;
    int kv_sink, kv_window;
    int max_context;  /* the session's KV capacity (full) */
    int kv_chunk;     /* windowed: its chunk slots */
    int32_t *hist;  /* [n_hist + n_prompt]: history then prompt */
    uint8_t *flags; /* [n_hist + n_prompt] */
    int n_hist, n_prompt;
    uint64_t draws;
    ib_sampling sp;
    int32_t *bias_ids;
    float *bias;
    int n_bias;
    json_t *constraint; /* the reply's constraint as a chat body (ib_constraint_from_record), or NULL: unconstrained */
    int32_t stop_ids[8];
    int n_stop;
    int32_t *tokens; /* [n_tokens] */
    uint64_t *digests; /* [n_tokens] running digests */
    int n_tokens;
} ib_vrec;

/* Build the JSON record (a new object) from a generation's facts. flags may be NULL (all
 * NOTE_ON_FEED). kv: the policy string. constraint: the record fields of the reply's constraint
 * (ib_constraint_record; borrowed), or NULL / empty when it was unconstrained. */
json_t *ib_verify_json(const char *model_id, ib_act act, ib_kv_dtype kvd, const char *kv, int max_context, int kv_chunk, const int32_t *hist,
                       int n_hist, const uint8_t *flags, uint64_t draws, const int32_t *prompt, int n_prompt,
                       const ib_sampling *sp, const ib_api_bias *bias, json_t *constraint, const int32_t *stop_ids,
                       int n_stop, const int32_t *tokens, const uint64_t *digests, int n_tokens);

/* Parse a record (the "verification" object, or a response holding one at its top or in its first
 * choice) for a model of `vocab` tokens and context max_context. 0, or -1 with a one-line message
 * naming the field. */
int ib_verify_parse(json_t *j, int vocab, int max_context, ib_vrec *out, char *msg, size_t msz);
void ib_verify_free(ib_vrec *r);

/* One re-run's results (filled by its job's events). */
typedef struct ib_vrun {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ib_session *s;
    const ib_json_vocab *jv;
    ib_json_state json;
    const ib_vrec *rec;
    int32_t *tokens;    /* [rec->n_tokens] */
    uint64_t *digests;  /* [rec->n_tokens] */
    uint64_t h;
    int n, done, vocab;
    char finish[16];
} ib_vrun;

/* Create the session (on m, the backend's), replay the record's history notes and draw counter and
 * submit the re-run as a job of sched (which must run the model the record names, in its act mode:
 * the caller checks). jv: the vocabulary's bytes for a constrained record (may be NULL otherwise);
 * the mask is rebuilt from rec->constraint by ib_constraint_setup, as the server built it.
 * On success the run's DONE will set run->done (wait with ib_verify_wait); ib_verify_run_free
 * afterwards. */
ib_status ib_verify_submit(ib_sched *sched, const ib_model *m, ib_backend_kind backend, const ib_json_vocab *jv,
                           const ib_vrec *rec, ib_vrun *run, ib_error *err);
/* Wait for the run's end. */
void ib_verify_wait(ib_vrun *run);
void ib_verify_run_free(ib_vrun *run);

/* Compare a finished run with its record: {"match": bool, "steps": n, "first_diverging_step": k or
 * null, "expected": {"token", "digest"}, "got": {"token", "digest"}} (the last two at the first
 * diverging step; a token of null where one side has none). */
json_t *ib_verify_compare(const ib_vrec *rec, const ib_vrun *run);

/* The system_fingerprint: the model identity, "/contract-", the contract version ("sha256:…/contract-1"). */
void ib_verify_fingerprint(const char *model_id, char *buf, size_t n);

#endif
