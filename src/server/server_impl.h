/*
 * server_impl.h — what the files of the server in src/server/ share: the server, a generation
 * (`gen`) and a stateful session (`sess`), and the functions one file calls in another. Each function's
 * contract is at its definition.
 *
 * Threads: MHD's connection threads parse requests, wait for tokens and write responses; the
 * scheduler thread steps the model and reports tokens through on_event. A `gen` (one generation)
 * is shared by both and reference counted; a `sess` (stateful session) likewise.
 * Lock order: gen->mu, then the scheduler's lock (ib_sched_cancel); srv->mu is never held while
 * taking a gen lock.
 */
#ifndef IB_SERVER_SERVER_IMPL_H
#define IB_SERVER_SERVER_IMPL_H
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <poll.h>
#include <sys/socket.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "runtime/runtime.h"
#include "server/api.h"
#include "server/verify.h"
#include "store/store.h"

#define MAX_STOPS 4
#define MAX_STOP_LEN 64
#define MAX_STOP_IDS 8
#define MAX_CHOICES 128   /* a request's n */

typedef struct server server;

/* A stateful session (POST /v1/sessions). */
typedef struct sess {
    char id[IB_STORE_ID_MAX];
    char *tenant;             /* the Bearer key that created it ("" without one) */
    int tidx;                 /* its index in server.tu */
    double last_used;         /* now_s() of the last request that named it or its last generation's end */
    ib_session *s;
    int32_t *pending;         /* [n_pending] tokens appended but not yet fed */
    int n_pending, cap_pending;
    int busy;                 /* a generation runs on it */
    int closed;               /* out of the table: freed when the last reference goes */
    int deleted;              /* DELETEd (its stored record is gone too) */
    int refs;
    size_t kv_bytes;
    char policy[48];          /* "full" | "window:W" | "sink:S,window:W" */
    /* with a store (server.store): */
    int n_hist;               /* tokens of its history (fed + pending): the next append's place */
    int32_t *htok;            /* [n_hist] the history, oldest first (verification records; with a store,
                               * what the store holds) */
    uint8_t *hfl;             /* [n_hist] IB_STORE_TOK_* flags of each */
    int cap_hist;
    ib_kv_dtype kvd;          /* its KV element type */
    int hist_broken;          /* the mirror missed tokens (out of memory): no verification records */
    int resident;             /* its KV holds its history; 0: loaded from the store, KV not rebuilt yet */
    ib_store_session rec;     /* not resident: the stored record (tokens [0, n_fed) are replayed into
                               * the KV by the next generation, inside the scheduler's prefill) */
} sess;

/* One generation: a scheduler job and what it produced. */
typedef struct gen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    server *srv;
    uint64_t job;
    int32_t *tok;             /* [n] generated tokens */
    double *lp;               /* [n] their logprobs */
    int n_top;                /* alternatives asked for per token (top_logprobs) */
    int32_t *top_ids;         /* [n][n_top] the most likely tokens at each step */
    double *top_lp;           /* [n][n_top] their logprobs */
    int n, cap;
    int oom;                  /* a token could not be recorded (out of memory): the job was cancelled
                               * and the generation ends as an error, never as a shorter answer */
    int done;
    char finish[16];
    int fed;
    /* request */
    int chat, stream, want_lp, include_usage;
    int session_gen;          /* a stateful session's generation */
    int n_prompt;
    int32_t stop_ids[MAX_STOP_IDS];
    int n_stop_ids;
    char *stops[MAX_STOPS];
    int n_stops;
    char id[IB_STORE_ID_MAX + 16];
    long created;
    int choice;               /* its index among the response's choices (streamed chunks' "index") */
    const struct gen *head;   /* a streamed choice of several: the first choice, whose id, created and
                               * seed every chunk of the response shows (it outlives this one's
                               * stream); NULL: itself */
    ib_session *own;          /* request-scoped session, freed at DONE */
    ib_sampling sp;           /* the sampling settings of the generation (seed included) */
    /* the verification record's inputs (verify.h) */
    uint64_t *dig;            /* [n] running digest of the logits rows that chose tokens [0, i] */
    uint64_t h;               /* the running digest (scheduler thread) */
    int32_t *vin;             /* [n_vhist + n_vprompt] history then prompt tokens */
    uint8_t *vfl;             /* [n_vhist + n_vprompt] their flags (sessions), NULL for completions */
    int n_vhist, n_vprompt;
    uint64_t draws0;          /* the draw counter before the first draw */
    char vkv[48];             /* the KV policy */
    ib_kv_dtype vkvd;         /* the KV element type */
    int vcap, vchunk;         /* the session's KV slots (full) and chunk slots (windowed) */
    ib_api_bias vbias;        /* the logit bias (a copy) */
    int hist_at;              /* a session generation: its history's length when it began */
    int n_replay;             /* a rebuild: stored tokens fed (unnoted) before the pending prompt */
    int commit;               /* stateful session with a store: its tokens still to be written
                               * (gen_commit, on the connection's thread, before the response ends) */
    int store_failed;         /* that write failed: the answer is an error, the session is evicted */
    int stored_gen;           /* commit was set: the response ends only after gen_commit */
    int stop_cancelled;       /* a stop string ended it: its job was asked to stop */
    size_t reserved;          /* its KV bytes, released at DONE */
    int tidx;                 /* the key (server.tu index) it counts against */
    int inflight;             /* it holds one of its key's in-flight requests, returned at DONE */
    sess *ss;                 /* stateful session, or NULL */
    /* echo (completions): the prompt (vin, the verification record's copy) and, with want_lp, its
     * tokens' logprobs from PROMPT events (scheduler thread, under mu); echo_lp[0] and a token without
     * its event are NaN (JSON null) */
    int echo;
    double *echo_lp;          /* [n_prompt] */
    int32_t *echo_top_ids;    /* [n_prompt][n_top] */
    double *echo_top_lp;      /* [n_prompt][n_top] */
    int echo_sent;            /* streamed: the echo's chunk went out (before the first token's) */
    size_t echo_len;          /* streamed: the echo's text bytes (the completion's text offsets follow it) */
    /* rendering (connection thread only, under mu) */
    ib_text_stream ts;
    char *text;               /* rendered text of tokens [0, rendered) */
    size_t text_len, text_cap;
    int *tok_off;             /* [n] byte offset of each token's text */
    int rendered;             /* tokens rendered */
    int stopped;              /* a stop string was found: text_len cut there */
    size_t emitted;           /* bytes already streamed */
    int lp_emitted;           /* tokens whose logprobs were streamed */
    int sent_role, sent_final, sent_done;
    uint64_t seed;            /* the sampling seed used (reported: fresh when the request gave none) */
    int want_json;            /* decoding constrained (response_format, a forced call: constraint.c) */
    json_t *vcons;            /* that constraint's verification record fields (ib_constraint_record), or NULL */
    ib_api_tool_mode tool_mode;   /* chat with tools: the reply read for calls (AUTO), one forced call, or "required" */
    ib_chat_tool_form tool_form;  /* the model's tool syntax the reply is read in (Qwen's or Gemma 4's) */
    int tool_parallel;        /* parallel_tool_calls: 0 keeps the first call only */
    char tool_name[65];       /* FORCED: the function called */
    ib_json_state json;       /* the JSON reader over the tokens generated so far (scheduler thread) */
    double t_arrive, t_last;  /* when it was accepted; when its last token came (latency metrics) */
    char *out;                /* SSE bytes waiting to be written */
    size_t out_len, out_pos, out_cap;
} gen;

struct server {
    ib_server_opts o;
    ib_model *m;
    const ib_model_info *info;
    ib_engine *e;
    ib_sched *sched;
    struct MHD_Daemon *d;
    char model_id[128];
    pthread_mutex_t mu;
    pthread_cond_t mem_cv;
    size_t kv_used;
    int mem_waiters;
    sess **sessions;          /* [max_sessions] */
    int n_sessions;
    int urandom;
    double t_start;
    long long http_by_class[6];  /* responses by status class 1xx..5xx (index 1..5) */
    long long n_429;
    ib_latency lat;           /* TTFT, inter-token and queue-time histograms, tokens/s (latency.c) */
    ib_json_vocab jv;         /* the vocabulary's bytes, for response_format json_object */
    /* connections, for the whole-request deadline (watch_*): guarded by watch_mu, an entry lives
     * from MHD's STARTED notice to its CLOSED notice, which comes before MHD closes the socket */
    pthread_mutex_t watch_mu;
    struct cwatch *watch;     /* doubly linked */
    long long n_req_timeouts; /* connections cut off for not delivering a request in time */
    /* per-key use (under mu): index i is api key i; one entry for everyone without keys */
    struct tenant_use *tu;
    int n_tenants;
    int key_sessions;         /* limits per key (0 = none) */
    size_t key_kv;
    const char *budget_rule;   /* how the KV budget was set when none was given (kv_budget) */
    int key_requests;
    long long n_expired;      /* sessions closed for being idle */
    volatile int draining;    /* stopping: no new work, the work in flight may finish */
    int n_gens;               /* generations not yet freed */
    int n_answering;          /* requests begun whose response MHD has not finished sending */
    ib_store *store;          /* the session store (NULL: --store none) */
    FILE *log;                /* progress and store errors (may be NULL) */
    char ident[IB_MODEL_ID_LEN]; /* ib_model_identity of the served model */
};

/* What one API key holds now (its quotas: server.key_*). */
typedef struct tenant_use {
    int sessions;             /* stateful sessions in the table */
    size_t kv;                /* KV bytes reserved (sessions and requests) */
    int inflight;             /* generations queued, waiting for memory or running */
} tenant_use;

/* One open connection: when it began waiting for its current request, and whether that request
 * has arrived whole (then the deadline no longer applies until its response is done). */
typedef struct cwatch {
    struct cwatch *prev, *next;
    int fd;
    double t_wait;            /* when the connection began waiting for its current request */
    int receiving;            /* 1 while a request is expected and not yet whole */
    int cut;                  /* shut down for missing the deadline */
} cwatch;

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct gen_params {
    ib_sampling sp;
    int max_tokens;
    int stream, include_usage, want_lp, top_lp;
    int echo;                 /* completions: the prompt comes back before the completion (and with
                               * want_lp its tokens' logprobs: the scheduler's PROMPT events) */
    int n;                    /* choices (n): 1 to MAX_CHOICES */
    char *stops[MAX_STOPS];
    int n_stops;
    ib_api_bias bias;         /* logit_bias */
} gen_params;

#define BAD(param, ...) send_error(S, c, 400, "invalid_request_error", "invalid_value", param, __VA_ARGS__)

/* Internal to the server: not exported from the shared library. */
#pragma GCC visibility push(hidden)

/* reply.c */
int random_hex(server *S, char *buf, int n);
enum MHD_Result send_text(server *S, struct MHD_Connection *c, unsigned code, const char *type, const char *body,
                          size_t len, int retry_after);
enum MHD_Result send_json(server *S, struct MHD_Connection *c, unsigned code, json_t *j, int retry_after);
enum MHD_Result send_error(server *S, struct MHD_Connection *c, unsigned code, const char *type,
                           const char *ecode, const char *param, const char *fmt, ...);

/* gen.c */
void gen_unref(gen *g);
void on_event(void *ctx, const ib_sched_event *ev);
size_t render(gen *g);
json_t *envelope(const gen *g, const char *object);
json_t *final_json(gen *g);
int client_gone(struct MHD_Connection *c);
/* Submit g's job (session s, prompt ids[n_ids], p's sampling and limits; the scheduler takes g's second
 * reference): 0; -1 when it could not be (g's references dropped, the error response sent, its result
 * in *ret). */
int gen_submit(server *S, struct MHD_Connection *c, gen *g, ib_session *s, const int32_t *ids, int n_ids, gen_params *p,
               enum MHD_Result *ret);
/* The scheduler job of generation g on session s (prompt ids[n_ids], p's sampling, limits and bias:
 * they must outlive the submission); sets s's sampling and g's KV facts for its verification record. */
ib_sched_job gen_job(gen *g, ib_session *s, const int32_t *ids, int n_ids, const gen_params *p);
/* Submit n generations at once (gs[k] with jobs[k], from gen_job; ib_sched_submit_n: all or none, so
 * share_with holds): 0, each g's second reference taken by the scheduler; -1 when they could not be
 * (every g's references dropped, the error response sent, its result in *ret). */
int gen_submit_n(server *S, struct MHD_Connection *c, gen **gs, const ib_sched_job *jobs, int n, enum MHD_Result *ret);
/* The SSE response of generations gs[0..n) (submitted, one reference each taken over): their chunks
 * as they come, each with its choice's "index", then one usage chunk (include_usage: np prompts' tokens
 * counted once each, every choice's completion) and [DONE]. MHD_NO when it cannot be made (the
 * generations cancelled, the references dropped). */
enum MHD_Result stream_choices(server *S, struct MHD_Connection *c, gen **gs, int n, int n_per_prompt);
/* gen_submit, then the stream's response, or the wait for the end and the body. */
enum MHD_Result run_gen(server *S, struct MHD_Connection *c, gen *g, ib_session *s, const int32_t *ids,
                        int n_ids, gen_params *p);
/* Record a request-scoped generation's prompt ids[n] for its verification record (an allocation failure
 * leaves that empty) and, echoing (g->echo), for its reply; -1 when the echo's memory is not there. */
int gen_set_prompt(gen *g, const int32_t *ids, int n);
gen *gen_new(server *S, int chat, gen_params *p);

/* admission.c */
int mem_reserve(server *S, int t, size_t bytes, int wait);
void mem_release(server *S, int t, size_t bytes);
int inflight_take(server *S, int t);
void inflight_put(server *S, int t);
int admit_generation(server *S, struct MHD_Connection *c, int t, size_t bytes, const char *what,
                     enum MHD_Result *ret);

/* openai_api.c */
int get_int(json_t *o, const char *k, long long lo, long long hi, long long *out);
int get_bool(json_t *o, const char *k, int *out);
void params_free(gen_params *p);
int parse_params(server *S, json_t *b, int chat, int default_max, gen_params *p, const char **param,
                 char *msg, size_t msz);
int32_t *tokenize(server *S, struct MHD_Connection *c, const char *text, size_t len, int flags, int *n, int *rc);
int chat_messages(json_t *msgs, ib_chat_msg **out, size_t *n, char *why, size_t wsz);
/* The token ids of JSON array a (one spare slot after them), *n of them, with tokenize's rc in *rc: 0;
 * -1 out of memory; -2 more than the server's max_prompt_tokens (*n the count, capped). An element that
 * is not an integer in [0, vocab) gives NULL with *bad its index (else *bad is -1). */
int32_t *json_token_ids(server *S, json_t *a, int *n, int *rc, long *bad);
/* Format messages cm[nm] (the array freed here) with flags, append suffix (NULL: nothing; a forced tool
 * call's opening) and tokenize them into *ids and *n (*trc as tokenize's rc): 0; or 1 with the error
 * answer (400 no chat format / refused roles, 503 out of memory) in *r. */
int chat_ids(server *S, struct MHD_Connection *c, ib_chat_msg *cm, size_t nm, int flags, const char *suffix,
             int32_t **ids, int *n, int *trc, enum MHD_Result *r);
int check_request(server *S, struct MHD_Connection *c, json_t *b, ib_api_endpoint ep, enum MHD_Result *r);
enum MHD_Result handle_generate(server *S, struct MHD_Connection *c, json_t *b, int chat, int tidx);

/* sessions_api.c */
void sess_free(server *S, sess *ss);
void sess_unref(server *S, sess *ss);
void sess_evict(server *S, sess *ss);
sess *sess_get(server *S, const char *id, const char *tenant);
json_t *sess_info(server *S, sess *ss);
enum MHD_Result handle_session_create(server *S, struct MHD_Connection *c, json_t *b, const char *tenant, int tidx,
                                      const char *want_id);
enum MHD_Result handle_session_append(server *S, struct MHD_Connection *c, sess *ss, json_t *b);
enum MHD_Result handle_session_generate(server *S, struct MHD_Connection *c, sess *ss, json_t *b);
enum MHD_Result handle_session_delete(server *S, struct MHD_Connection *c, sess *ss);
enum MHD_Result handle_session_list(server *S, struct MHD_Connection *c, const char *tenant);
void expire_sessions(server *S);

/* session_store.c */
int hist_push(sess *ss, const int32_t *t, int n, uint8_t fl, uint8_t last_extra);
void gen_commit(gen *g);
sess *sess_load(server *S, struct MHD_Connection *c, const char *id, const char *tenant, int tidx,
                enum MHD_Result *r);

/* verify_api.c */
enum MHD_Result handle_verify(server *S, struct MHD_Connection *c, json_t *b, int tidx);

/* metrics.c */
enum MHD_Result handle_metrics(server *S, struct MHD_Connection *c);
enum MHD_Result handle_models(server *S, struct MHD_Connection *c);

/* conn_watch.c */
void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);
void watch_arrived(server *S, struct MHD_Connection *c);
void watch_sweep(server *S);

#pragma GCC visibility pop

#endif
