/*
 * server.h — the HTTP server of `isobatch serve`: OpenAI-compatible completions and chat
 * completions (plain and SSE streaming), stateful sessions, health and Prometheus metrics, over
 * libmicrohttpd, driving one scheduler (continuous batching). docs/server.md is the manual.
 */
#ifndef IB_SERVER_SERVER_H
#define IB_SERVER_SERVER_H
#include <signal.h>
#include <stddef.h>

#include "isobatch.h"

typedef struct ib_server_opts {
    const char *model_dir;
    const char *model_id;        /* the name /v1/models lists and requests must use; NULL = dir's basename */
    const char *host;            /* IPv4 or IPv6 address to bind ("::1", "[::]"); NULL = 127.0.0.1 */
    int port;                    /* 0 = any free port (see port_file) */
    const char *port_file;       /* when set, the bound port is written there once listening */
    int threads, max_batch, prefill_chunk, max_queue;
    int share_prefix;            /* ib_sched_opts.share_min: concurrent requests' common prompt prefixes of
                                  * at least this many tokens are prefilled once; 0 = only a request's n */
    int max_sessions;            /* stateful sessions held at once */
    int session_idle_timeout_s;  /* a session no request has named for this long is closed; 0 = never */
    /* per-API-key quotas; 0 = with several keys an equal share of max_sessions, memory_budget and
     * max_batch + max_queue, with one key or none no quota beyond the server's limits */
    int key_max_sessions;        /* stateful sessions of one key */
    size_t key_memory_budget;    /* KV bytes of one key (its sessions and requests) */
    int key_max_requests;        /* generations of one key queued, waiting for memory or running */
    size_t memory_budget;        /* KV bytes over all sessions (request-scoped and stateful); 0 = derived
                                  * from the machine: half its memory (or cgroup limit) less the weights */
    int session_context;         /* KV capacity of a stateful session (tokens), under the full policy */
    const char *kv_policy;       /* stateful sessions' default KV policy: "full" (NULL), "window:W",
                                  * "sink:S,window:W" (request-scoped sessions are always full) */
    const char *const *api_keys; /* [n_api_keys] accepted Bearer keys; none = no key needed */
    int n_api_keys;
    size_t max_body;             /* request body bytes */
    int max_prompt_tokens, max_tokens;
    int max_connections;         /* open connections over all clients */
    int max_connections_per_client; /* open connections from one IP address */
    int drain_timeout_s;         /* on stop, how long the generations in flight may go on finishing */
    int request_timeout_s;       /* a connection must deliver each whole request (headers and body)
                                  * within this many seconds of opening or of its previous response */
    int timeout_s;               /* the longest a generation may run (queue wait included) */
    int idle_timeout_s;          /* a connection idle this long while sending its request is closed */
    int queue_wait_ms;           /* how long a request waits for memory before 429 */
    ib_isa isa;
    ib_act act;
    ib_backend_kind backend;     /* where the engine computes and the sessions' KV caches live */
    ib_kv_dtype kv_dtype;        /* every session's KV element type (f16: half the memory) */
    int token_delay_ms;          /* tests only: the scheduler sleeps this long on each token (a slow
                                  * model, so a test can hold a batch slot for as long as it needs) */
    int request_log;             /* one line per request on the log: time, request id, method, path,
                                  * status, milliseconds */
    const char *cors_origin;     /* Access-Control-Allow-Origin of every response; NULL or "" = none */
    const char *store_uri;       /* the session store ("sqlite:PATH", store.h); NULL = none: stateful
                                  * sessions live in memory only */
    const char *store_origin;    /* how the store was chosen, shown in the start log after its URI
                                  * (e.g. "default: the data directory, from $HOME"); NULL = nothing */
} ib_server_opts;

/* Defaults for every field (model_dir NULL). */
ib_server_opts ib_server_opts_default(void);

/* Load the model, start the engine, scheduler and HTTP daemon, and serve until *stop becomes
 * non-zero (checked a few times a second); then stop accepting (new requests on open connections
 * get 503), let the generations in flight finish for up to drain_timeout_s, cancel what is left
 * (streams end with their final chunk) and free everything. Progress lines go to `log` (may be
 * NULL). Returns IB_OK after a clean stop. */
ib_status ib_server_run(const ib_server_opts *o, volatile sig_atomic_t *stop, void *log, ib_error *err);

#endif
