/*
 * server.c — `isobatch serve`: HTTP endpoints over libmicrohttpd (one thread per connection), a
 * scheduler doing the continuous batching, per-request and stateful sessions with KV memory
 * accounting. docs/server.md documents every endpoint, limit and error.
 *
 * Threads: MHD's connection threads parse requests, wait for tokens and write responses; the
 * scheduler thread steps the model and reports tokens through on_event. A `gen` (one generation)
 * is shared by both and reference counted; a `sess` (stateful session) likewise.
 * Lock order: gen->mu, then the scheduler's lock (ib_sched_cancel); srv->mu is never held while
 * taking a gen lock.
 */
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
    int want_json;            /* response_format json_object: decoding constrained to one JSON object */
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

ib_server_opts ib_server_opts_default(void) {
    ib_server_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8080;
    o.threads = 1;
    o.max_batch = 32;
    o.prefill_chunk = 64;
    o.max_queue = 64;
    o.max_sessions = 256;
    o.session_idle_timeout_s = 3600;
    o.session_context = 1024;
    o.max_body = 1 << 20;
    o.max_prompt_tokens = 4096;
    o.max_tokens = 1024;
    o.max_connections = 1024;
    o.max_connections_per_client = 256;
    o.timeout_s = 300;
    o.idle_timeout_s = 30;
    o.request_timeout_s = 30;
    o.drain_timeout_s = 30;
    o.queue_wait_ms = 5000;
    o.request_log = 1;
    o.cors_origin = "*";
    return o;
}

/* ------------------------------------------------------------------ small helpers */

/* Fill buf with 2*n lowercase hex characters of fresh random bytes (n <= 32). */
static int random_hex(server *S, char *buf, int n) {
    unsigned char b[32];
    size_t got = 0;
    while ((int)got < n) {
        ssize_t r = read(S->urandom, b + got, (size_t)n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    for (int i = 0; i < n; i++) sprintf(buf + 2 * i, "%02x", b[i]);
    return 0;
}

/* Length of the longest prefix of s[0..n) that is valid, complete UTF-8. */
static size_t utf8_complete(const char *s, size_t n) {
    size_t i = n;
    int back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--, back++;
    if (i == 0) return n;
    unsigned char c = (unsigned char)s[i - 1];
    int need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return (size_t)back + 1 >= (size_t)need ? n : i - 1;
}

/* ------------------------------------------------------------------ responses */

static enum MHD_Result send_text(server *S, struct MHD_Connection *c, unsigned code, const char *type, const char *body,
                                 size_t len, int retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    pthread_mutex_lock(&S->mu);
    if (code / 100 >= 1 && code / 100 <= 5) S->http_by_class[code / 100]++;
    if (code == 429) S->n_429++;
    pthread_mutex_unlock(&S->mu);
    ib_http_decorate(r, code);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(server *S, struct MHD_Connection *c, unsigned code, json_t *j, int retry_after) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    enum MHD_Result r = send_text(S, c, code, "application/json", s, strlen(s), retry_after);
    free(s);
    return r;
}

/* An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result send_error(server *S, struct MHD_Connection *c, unsigned code, const char *type,
                                  const char *ecode, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *e = json_object();
    json_object_set_new(e, "message", ib_api_bytes_str(msg, strlen(msg)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_object_set_new(e, "code", ecode ? json_string(ecode) : json_null());
    json_t *j = json_object();
    json_object_set_new(j, "error", e);
    return send_json(S, c, code, j, code == 429 || code == 503 ? 1 : 0);
}

#define BAD(param, ...) send_error(S, c, 400, "invalid_request_error", "invalid_value", param, __VA_ARGS__)

/* ------------------------------------------------------------------ request parameters */

/* Read an optional number field: 0 = absent (out untouched), 1 = read, -1 = wrong type/range. */
static int get_num(json_t *o, const char *k, double lo, double hi, double *out) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return -1;
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return -1;
    *out = x;
    return 1;
}

static int get_int(json_t *o, const char *k, long long lo, long long hi, long long *out) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return -1;
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return -1;
    *out = x;
    return 1;
}

static int get_bool(json_t *o, const char *k, int *out) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return -1;
    *out = json_is_true(v);
    return 1;
}

typedef struct gen_params {
    ib_sampling sp;
    int max_tokens;
    int stream, include_usage, want_lp, top_lp;
    char *stops[MAX_STOPS];
    int n_stops;
    ib_api_bias bias;         /* logit_bias */
} gen_params;

static void params_free(gen_params *p) {
    for (int i = 0; i < p->n_stops; i++) free(p->stops[i]);
    p->n_stops = 0;
    ib_api_bias_free(&p->bias);
}

/* Parse the sampling, length, stream, stop and logprobs fields shared by every generating endpoint.
 * On error writes the offending field into *param and a message into msg, returns -1. */
static int parse_params(server *S, json_t *b, int chat, int default_max, gen_params *p, const char **param,
                        char *msg, size_t msz) {
    memset(p, 0, sizeof *p);
    p->sp = ib_sampling_default();
    p->sp.temperature = 1.0f;
    double x;
    long long n;
    int r;
    p->max_tokens = default_max;
#define FAIL(field, ...) do { *param = field; snprintf(msg, msz, __VA_ARGS__); params_free(p); return -1; } while (0)
    if ((r = get_num(b, "temperature", 0, 2, &x)) < 0) FAIL("temperature", "temperature must be a number in [0, 2]");
    if (r) p->sp.temperature = (float)x;
    if ((r = get_num(b, "top_p", 0, 1, &x)) < 0 || (r && x <= 0)) FAIL("top_p", "top_p must be a number in (0, 1]");
    if (r) p->sp.top_p = (float)x;
    if ((r = get_num(b, "min_p", 0, 1, &x)) < 0) FAIL("min_p", "min_p must be a number in [0, 1]");
    if (r) p->sp.min_p = (float)x;
    if ((r = get_int(b, "top_k", 0, 1 << 30, &n)) < 0) FAIL("top_k", "top_k must be an integer >= -1 (-1 or 0: off)");
    if (r) p->sp.top_k = (int)n;
    if ((r = get_num(b, "repetition_penalty", 0.01, 100, &x)) < 0)
        FAIL("repetition_penalty", "repetition_penalty must be a number in [0.01, 100]");
    if (r) p->sp.repeat_penalty = (float)x;
    if ((r = get_int(b, "seed", -(1LL << 62), 1LL << 62, &n)) < 0) FAIL("seed", "seed must be an integer");
    if (r) p->sp.seed = (uint64_t)n;
    if ((r = get_num(b, "frequency_penalty", -2, 2, &x)) < 0) FAIL("frequency_penalty", "frequency_penalty must be a number in [-2, 2]");
    if ((r = get_num(b, "presence_penalty", -2, 2, &x)) < 0) FAIL("presence_penalty", "presence_penalty must be a number in [-2, 2]");
    if ((r = get_int(b, "n", 1, 1, &n)) < 0) FAIL("n", "only n = 1 is supported");
    const char *mk = chat && json_object_get(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((r = get_int(b, mk, 0, 1LL << 30, &n)) < 0) FAIL(mk, "%s must be an integer >= 0", mk);
    if (r) {
        if (n > S->o.max_tokens)
            FAIL(mk, "%s %lld exceeds this server's limit of %d tokens", mk, n, S->o.max_tokens);
        p->max_tokens = (int)n;
    }
    if ((r = get_bool(b, "stream", &p->stream)) < 0) FAIL("stream", "stream must be a boolean");
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so) || get_bool(so, "include_usage", &p->include_usage) < 0)
            FAIL("stream_options", "stream_options must be an object with a boolean include_usage");
    }
    if (chat) {
        if ((r = get_bool(b, "logprobs", &p->want_lp)) < 0) FAIL("logprobs", "logprobs must be a boolean");
        if ((r = get_int(b, "top_logprobs", 0, IB_MAX_TOP_LOGPROBS, &n)) < 0)
            FAIL("top_logprobs", "top_logprobs must be an integer in [0, %d]", IB_MAX_TOP_LOGPROBS);
        if (r && n > 0 && !p->want_lp) FAIL("top_logprobs", "top_logprobs needs logprobs: true");
        if (r) p->top_lp = (int)n;
    } else {
        if ((r = get_int(b, "logprobs", 0, 5, &n)) < 0) FAIL("logprobs", "logprobs must be an integer in [0, 5]");
        if (r) p->want_lp = 1, p->top_lp = (int)n;
    }
    json_t *st = json_object_get(b, "stop");
    if (st && !json_is_null(st)) {
        if (json_is_string(st)) {
            json_t *a = json_array();
            json_array_append(a, st);
            st = a;
        } else if (json_is_array(st)) {
            json_incref(st);
        } else
            FAIL("stop", "stop must be a string or an array of strings");
        size_t i;
        json_t *v;
        int bad = json_array_size(st) > MAX_STOPS;
        json_array_foreach(st, i, v) {
            if (bad || !json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > MAX_STOP_LEN) {
                bad = 1;
                break;
            }
            p->stops[p->n_stops++] = strdup(json_string_value(v));
        }
        json_decref(st);
        if (bad) FAIL("stop", "stop: at most %d non-empty strings of at most %d bytes", MAX_STOPS, MAX_STOP_LEN);
    }
    if (ib_api_logit_bias(b, S->info->vocab_size, &p->bias, param, msg, msz)) {
        params_free(p);
        return -1;
    }
#undef FAIL
    return 0;
}

/* ------------------------------------------------------------------ generations */

static void sess_unref(server *S, sess *ss);

static void gen_unref(gen *g) {
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left) return;
    server *S = g->srv;
    pthread_mutex_lock(&S->mu);
    S->n_gens--;
    pthread_mutex_unlock(&S->mu);
    for (int i = 0; i < g->n_stops; i++) free(g->stops[i]);
    ib_json_release(&g->json);
    free(g->tok);
    free(g->dig);
    free(g->vin);
    free(g->vfl);
    ib_api_bias_free(&g->vbias);
    free(g->lp);
    free(g->top_ids);
    free(g->top_lp);
    free(g->tok_off);
    free(g->text);
    free(g->out);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

/* Append n tokens to session ss's history mirror, each flagged fl, the last one fl | last_extra
 * (S->mu held). 0, or -1 when out of memory (the mirror is then short: later verification records of
 * the session are wrong, so they are left out). */
static int hist_push(sess *ss, const int32_t *t, int n, uint8_t fl, uint8_t last_extra) {
    if (n <= 0) return 0;
    if (ss->n_hist + n > ss->cap_hist) {
        int nc = (ss->n_hist + n) * 2 + 64;
        int32_t *a = realloc(ss->htok, (size_t)nc * sizeof *a);
        if (a) ss->htok = a;
        uint8_t *b = realloc(ss->hfl, (size_t)nc);
        if (b) ss->hfl = b;
        if (!a || !b) {
            ss->hist_broken = 1;
            return -1;
        }
        ss->cap_hist = nc;
    }
    memcpy(ss->htok + ss->n_hist, t, (size_t)n * sizeof *t);
    memset(ss->hfl + ss->n_hist, fl, (size_t)n);
    ss->hfl[ss->n_hist + n - 1] |= last_extra;
    ss->n_hist += n;
    return 0;
}

/* Scheduler callback: record a token, or the end (then free a request-scoped session, release its
 * memory, hand a stateful session its unfed tokens back). */
static void on_event(void *ctx, const ib_sched_event *ev) {
    gen *g = ctx;
    server *S = g->srv;
    if (!ev->done) {
        double t = now_s();
        if (g->n == 0) /* only this thread appends tokens: g->n is stable here */
            ib_latency_first(&S->lat, t - g->t_arrive, ev->queue_seconds);
        else
            ib_latency_next(&S->lat, t - g->t_last);
        g->t_last = t;
        ib_latency_token(&S->lat, t);
        g->h = ib_digest_bytes(g->h, ev->logits, (size_t)S->info->vocab_size * sizeof(float));
        if (g->want_json) { /* advance the JSON reader past this token (its mask allowed it) */
            int stop = 0;
            for (int i = 0; i < g->n_stop_ids; i++) stop |= g->stop_ids[i] == ev->token;
            for (size_t k = S->jv.off[ev->token]; !stop && k < S->jv.off[ev->token + 1]; k++)
                if (ib_json_step(&g->json, (unsigned char)S->jv.bytes[k])) break;
        }
    }
    if (!ev->done && S->o.token_delay_ms > 0) nanosleep(&(struct timespec){S->o.token_delay_ms / 1000, (long)(S->o.token_delay_ms % 1000) * 1000000L}, NULL);
    if (ev->done) {
        if (g->own) {
            ib_session_free(g->own);
            g->own = NULL;
            pthread_mutex_lock(&S->mu);
            S->kv_used -= g->reserved;
            S->tu[g->tidx].kv -= g->reserved;
            pthread_cond_broadcast(&S->mem_cv);
            pthread_mutex_unlock(&S->mu);
        }
        if (g->inflight) {
            pthread_mutex_lock(&S->mu);
            S->tu[g->tidx].inflight--;
            g->inflight = 0;
            pthread_mutex_unlock(&S->mu);
        }
        if (g->ss) {
            sess *ss = g->ss;
            pthread_mutex_lock(&S->mu);
            /* the prompt was kept at pending[0, n_prompt) (appends are refused while busy): its unfed
             * tail goes back to the front; after generation the last sampled token is the pending one.
             * A rebuild's job fed n_replay stored tokens first: short of them, the KV is incomplete and
             * is forgotten (the session stays not resident, its pending tokens untouched). */
            int pf = ev->prompt_fed - g->n_replay;
            if (!ss->resident && pf < 0) {
                ib_session_reset(ss->s);
                ss->n_pending = g->n_prompt;
            } else {
                if (!ss->resident) {
                    ss->resident = 1;
                    ib_store_session_free(&ss->rec);
                }
                pthread_mutex_lock(&g->mu);
                hist_push(ss, g->tok, g->n, IB_STORE_TOK_SAMPLED, IB_STORE_TOK_NOTE_ON_FEED);
                pthread_mutex_unlock(&g->mu);
                int unfed = g->n_prompt - pf;
                ss->n_pending = 0;
                if (unfed > 0) {
                    memmove(ss->pending, ss->pending + pf, (size_t)unfed * sizeof(int32_t));
                    ss->n_pending = unfed;
                } else if (ev->generated > 0) {
                    pthread_mutex_lock(&g->mu);
                    ss->pending[ss->n_pending++] = g->tok[g->n - 1];
                    pthread_mutex_unlock(&g->mu);
                }
            }
            ss->last_used = now_s();
            if (!g->commit) { /* no store: the session is free now; with one, gen_commit frees it */
                ss->busy = 0;
                pthread_mutex_unlock(&S->mu);
                sess_unref(S, ss);
                g->ss = NULL;
            } else
                pthread_mutex_unlock(&S->mu);
        }
        pthread_mutex_lock(&g->mu);
        g->done = 1;
        snprintf(g->finish, sizeof g->finish, "%s", ev->finish);
        g->fed = ev->prompt_fed;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        gen_unref(g);
        return;
    }
    pthread_mutex_lock(&g->mu);
    if (g->n == g->cap) {
        int nc = g->cap ? 2 * g->cap : 64;
        int32_t *t = realloc(g->tok, (size_t)nc * sizeof *t);
        if (t) g->tok = t;
        double *l = realloc(g->lp, (size_t)nc * sizeof *l);
        if (l) g->lp = l;
        int *o = realloc(g->tok_off, ((size_t)nc + 1) * sizeof *o);
        if (o) g->tok_off = o;
        uint64_t *dg = realloc(g->dig, (size_t)nc * sizeof *dg);
        if (dg) g->dig = dg;
        int32_t *ti = g->top_ids;
        double *tl = g->top_lp;
        if (g->n_top) {
            if ((ti = realloc(g->top_ids, (size_t)nc * g->n_top * sizeof *ti))) g->top_ids = ti;
            if ((tl = realloc(g->top_lp, (size_t)nc * g->n_top * sizeof *tl))) g->top_lp = tl;
        }
        if (t && l && o && dg && (!g->n_top || (ti && tl))) g->cap = nc;
    }
    if (g->n < g->cap) {
        g->tok[g->n] = ev->token;
        g->dig[g->n] = g->h;
        g->lp[g->n] = ev->logprob;
        for (int i = 0; i < g->n_top; i++) { /* the scheduler gives exactly n_top (vocab >= 20) */
            g->top_ids[(size_t)g->n * g->n_top + i] = i < ev->n_top ? ev->top_ids[i] : -1;
            g->top_lp[(size_t)g->n * g->n_top + i] = i < ev->n_top ? ev->top_logprob[i] : 0.0;
        }
        g->n++;
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void sess_evict(server *S, sess *ss);

/* A stateful session's generation has ended (g->done) and the server has a store: write what the
 * generation added — its tokens (SAMPLED; the last, which stays pending, SAMPLED|NOTE_ON_FEED), the
 * draw counter, the settings and n_fed — as one transaction, then free the session for the next
 * request. Called on the connection's thread before the response's last bytes are sent, so every
 * generation a client saw completed is durable; once per generation (later calls do nothing). On a
 * failed write g->store_failed is set and the session is evicted from memory: its next request
 * loads it from the store as it was before this generation. */
static void gen_commit(gen *g) {
    server *S = g->srv;
    pthread_mutex_lock(&g->mu);
    int todo = g->commit && g->done;
    if (todo) g->commit = 0;
    pthread_mutex_unlock(&g->mu);
    if (!todo) return;
    sess *ss = g->ss;
    g->ss = NULL;
    ib_error err = {0};
    ib_status rc = IB_OK;
    pthread_mutex_lock(&S->mu);
    int resident = ss->resident && !ss->deleted, at = g->hist_at;
    ib_store_progress pr = {.sampling = g->sp, .draws = ss->s->sample_step, .n_fed = ib_session_position(ss->s)};
    pthread_mutex_unlock(&S->mu);
    /* (no lock needed for g->tok: the job is done, nothing appends any more) */
    if (resident && g->n > 0) {
        uint8_t *fl = malloc((size_t)g->n);
        if (!fl)
            rc = ib_fail(&err, IB_ERR_NOMEM, "out of memory");
        else {
            memset(fl, IB_STORE_TOK_SAMPLED, (size_t)g->n);
            fl[g->n - 1] |= IB_STORE_TOK_NOTE_ON_FEED;
            rc = ib_store_append(S->store, ss->id, at, g->tok, fl, g->n, &pr, &err);
            free(fl);
        }
    } else if (resident && g->fed > 0)
        rc = ib_store_update(S->store, ss->id, &pr, &err);
    pthread_mutex_lock(&S->mu);
    ss->busy = 0;
    ss->last_used = now_s();
    pthread_mutex_unlock(&S->mu);
    if (rc) {
        g->store_failed = 1;
        if (S->log) {
            fprintf(S->log, "isobatch serve: store: %s\n", err.msg);
            fflush(S->log);
        }
        sess_evict(S, ss);
    }
    sess_unref(S, ss);
}

static int text_append(gen *g, const char *s, size_t n) {
    if (g->text_len + n + 1 > g->text_cap) {
        size_t nc = (g->text_len + n + 1) * 2;
        char *t = realloc(g->text, nc);
        if (!t) return -1;
        g->text = t;
        g->text_cap = nc;
    }
    memcpy(g->text + g->text_len, s, n);
    g->text_len += n;
    g->text[g->text_len] = 0;
    return 0;
}

static int is_stop_id(const gen *g, int32_t t) {
    for (int i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == t) return 1;
    return 0;
}

/* Render tokens [rendered, n) into text (stop ids add no text), look for stop strings; return how
 * many bytes of text may be shown now. Called with g->mu held. */
static size_t render(gen *g) {
    const ib_model *m = g->srv->m;
    char buf[512];
    while (g->rendered < g->n && !g->stopped) {
        int32_t t = g->tok[g->rendered];
        g->tok_off[g->rendered] = (int)g->text_len;
        if (!is_stop_id(g, t)) {
            int w = ib_text_stream_push(m, &g->ts, t, buf, sizeof buf);
            if (w > 0) text_append(g, buf, (size_t)w);
        }
        g->rendered++;
        for (int i = 0; i < g->n_stops; i++) {
            size_t sl = strlen(g->stops[i]);
            size_t from = g->emitted > sl ? g->emitted - sl : 0;
            char *hit = g->text_len >= sl ? memmem(g->text + from, g->text_len - from, g->stops[i], sl) : NULL;
            if (hit) {
                g->text_len = (size_t)(hit - g->text);
                g->text[g->text_len] = 0;
                g->stopped = 1;
            }
        }
    }
    if (g->stopped) return g->text_len;
    if (g->done && g->rendered == g->n) {
        int w = ib_text_stream_flush(&g->ts, buf, sizeof buf);
        if (w > 0) text_append(g, buf, (size_t)w);
        return g->text_len;
    }
    size_t hold = 0;
    for (int i = 0; i < g->n_stops; i++)
        if (strlen(g->stops[i]) - 1 > hold) hold = strlen(g->stops[i]) - 1;
    size_t safe = g->text_len > hold ? g->text_len - hold : 0;
    if (safe < g->emitted) safe = g->emitted;
    return g->emitted + utf8_complete(g->text + g->emitted, safe - g->emitted);
}

static const char *finish_reason(const gen *g) {
    if (g->stopped) return "stop";
    if (!strcmp(g->finish, "stop") || !strcmp(g->finish, "length")) return g->finish;
    return g->finish; /* "cancelled" or "error" */
}

/* Tokens covered by the shown text (a stop id is not shown; tokens after a stop string are not). */
static int tokens_shown(const gen *g) {
    int k = g->rendered;
    if (g->stopped) {
        while (k > 0 && (size_t)g->tok_off[k - 1] >= g->text_len) k--;
    }
    if (k > 0 && is_stop_id(g, g->tok[k - 1])) k--;
    return k;
}

/* Logprobs of tokens [a, b) in the completions format or the chat format. */
static json_t *logprobs_json(const gen *g, int a, int b) {
    char buf[256];
    if (g->chat) {
        json_t *content = json_array();
        for (int i = a; i < b; i++) {
            int w = ib_token_bytes(g->srv->m, g->tok[i], buf, sizeof buf);
            if (w < 0) w = 0;
            json_t *bytes = json_array();
            for (int k = 0; k < w; k++) json_array_append_new(bytes, json_integer((unsigned char)buf[k]));
            json_t *e = json_object();
            json_object_set_new(e, "token", ib_api_bytes_str(buf, (size_t)w));
            json_object_set_new(e, "logprob", json_real(g->lp[i]));
            json_object_set_new(e, "bytes", bytes);
            json_t *top = json_array();
            for (int t = 0; t < g->n_top; t++) {
                int32_t id = g->top_ids[(size_t)i * g->n_top + t];
                if (id < 0) continue;
                int tw = ib_token_bytes(g->srv->m, id, buf, sizeof buf);
                if (tw < 0) tw = 0;
                json_t *tb = json_array();
                for (int q = 0; q < tw; q++) json_array_append_new(tb, json_integer((unsigned char)buf[q]));
                json_t *te = json_object();
                json_object_set_new(te, "token", ib_api_bytes_str(buf, (size_t)tw));
                json_object_set_new(te, "logprob", json_real(g->top_lp[(size_t)i * g->n_top + t]));
                json_object_set_new(te, "bytes", tb);
                json_object_set_new(te, "token_id", json_integer(id));
                json_array_append_new(top, te);
            }
            json_object_set_new(e, "top_logprobs", top);
            json_object_set_new(e, "token_id", json_integer(g->tok[i]));
            json_array_append_new(content, e);
        }
        json_t *o = json_object();
        json_object_set_new(o, "content", content);
        return o;
    }
    json_t *toks = json_array(), *lps = json_array(), *offs = json_array(), *ids = json_array();
    json_t *tops = g->n_top ? json_array() : json_null();
    for (int i = a; i < b; i++) {
        int w = ib_token_bytes(g->srv->m, g->tok[i], buf, sizeof buf);
        json_array_append_new(toks, ib_api_bytes_str(buf, w > 0 ? (size_t)w : 0));
        json_array_append_new(lps, json_real(g->lp[i]));
        json_array_append_new(offs, json_integer(g->tok_off[i]));
        json_array_append_new(ids, json_integer(g->tok[i]));
        if (!g->n_top) continue;
        /* {token text: logprob}; tokens whose text repeats keep the first (the more likely) entry */
        json_t *m = json_object();
        for (int t = 0; t < g->n_top; t++) {
            int32_t id = g->top_ids[(size_t)i * g->n_top + t];
            if (id < 0) continue;
            int tw = ib_token_bytes(g->srv->m, id, buf, sizeof buf);
            json_t *key = ib_api_bytes_str(buf, tw > 0 ? (size_t)tw : 0);
            const char *ks = key ? json_string_value(key) : NULL;
            if (ks && !json_object_get(m, ks)) json_object_set_new(m, ks, json_real(g->top_lp[(size_t)i * g->n_top + t]));
            json_decref(key);
        }
        json_array_append_new(tops, m);
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    json_object_set_new(o, "token_ids", ids);
    return o;
}

static json_t *usage_json(const gen *g) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(g->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(g->n));
    json_object_set_new(u, "total_tokens", json_integer(g->n_prompt + g->n));
    return u;
}

static json_t *envelope(const gen *g, const char *object) {
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(g->id));
    json_object_set_new(j, "object", json_string(object));
    json_object_set_new(j, "created", json_integer(g->created));
    json_object_set_new(j, "model", json_string(g->srv->model_id));
    json_object_set_new(j, "seed", json_integer((json_int_t)g->seed));
    char fp[IB_MODEL_ID_LEN + 32];
    ib_verify_fingerprint(g->srv->ident, fp, sizeof fp);
    json_object_set_new(j, "system_fingerprint", json_string(fp));
    return j;
}

/* The verification record of a finished generation (verify.h), or null when it drew no token or its
 * prompt could not be recorded. g->mu held (or the generation done). */
static json_t *verification_json(const gen *g) {
    server *S = g->srv;
    if (g->n < 1 || g->n_vprompt < 1) return json_null();
    return ib_verify_json(S->ident, ib_engine_act(S->e), g->vkvd, g->vkv, g->vcap, g->vchunk, g->vin, g->n_vhist, g->vfl, g->draws0,
                          g->vin + g->n_vhist, g->n_vprompt, &g->sp, &g->vbias, g->want_json, g->stop_ids,
                          g->n_stop_ids, g->tok, g->dig, g->n);
}

/* The non-streaming body of a finished generation. */
static json_t *final_json(gen *g) {
    size_t show = render(g);
    (void)show;
    int k = tokens_shown(g);
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    json_t *j;
    if (g->chat) {
        j = envelope(g, "chat.completion");
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        json_object_set_new(msg, "content", ib_api_bytes_str(g->text, g->text_len));
        json_object_set_new(ch, "message", msg);
    } else {
        j = envelope(g, g->session_gen ? "session.generation" : "text_completion");
        json_object_set_new(ch, "text", ib_api_bytes_str(g->text, g->text_len));
    }
    json_object_set_new(ch, "logprobs", g->want_lp ? logprobs_json(g, 0, k) : json_null());
    json_object_set_new(ch, "finish_reason", json_string(finish_reason(g)));
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(j, "choices", choices);
    json_object_set_new(j, "usage", usage_json(g));
    json_object_set_new(j, "verification", verification_json(g));
    return j;
}

static int out_append(gen *g, const char *s, size_t n) {
    if (g->out_len + n > g->out_cap) {
        size_t nc = (g->out_len + n) * 2 + 256;
        char *t = realloc(g->out, nc);
        if (!t) return -1;
        g->out = t;
        g->out_cap = nc;
    }
    memcpy(g->out + g->out_len, s, n);
    g->out_len += n;
    return 0;
}

static void out_event(gen *g, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return;
    out_append(g, "data: ", 6);
    out_append(g, s, strlen(s));
    out_append(g, "\n\n", 2);
    free(s);
}

/* One SSE chunk with text delta [a, b) of the text, logprobs of tokens [ta, tb), and a finish reason. */
static void out_chunk(gen *g, size_t a, size_t b, int ta, int tb, const char *finish) {
    json_t *j = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    if (g->chat) {
        json_t *delta = json_object();
        if (!g->sent_role) {
            json_object_set_new(delta, "role", json_string("assistant"));
            g->sent_role = 1;
        }
        if (b > a) json_object_set_new(delta, "content", ib_api_bytes_str(g->text + a, b - a));
        json_object_set_new(ch, "delta", delta);
    } else
        json_object_set_new(ch, "text", ib_api_bytes_str(g->text + a, b - a));
    json_object_set_new(ch, "logprobs", g->want_lp && tb > ta ? logprobs_json(g, ta, tb) : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(j, "choices", choices);
    if (g->include_usage) json_object_set_new(j, "usage", json_null());
    if (finish) json_object_set_new(j, "verification", verification_json(g));
    out_event(g, j);
}

/* MHD content reader for SSE: blocks until there is something to send. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    gen *g = cls;
    server *S = g->srv;
    pthread_mutex_lock(&g->mu);
    double t_end = now_s() + S->o.timeout_s;
    while (g->out_pos == g->out_len) {
        g->out_pos = g->out_len = 0;
        if (g->sent_done) {
            pthread_mutex_unlock(&g->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        size_t show = render(g);
        int finished = g->stopped || (g->done && g->rendered == g->n);
        if (finished && g->stored_gen && !g->done) { /* a stop string: end the job, store it, then finish */
            if (!g->stop_cancelled) ib_sched_cancel(S->sched, g->job);
            g->stop_cancelled = 1;
            finished = 0;
        }
        if (finished && g->commit) { /* the tokens are durable before the final chunk goes out */
            pthread_mutex_unlock(&g->mu);
            gen_commit(g);
            pthread_mutex_lock(&g->mu);
        }
        int k = tokens_shown(g);
        if (show > g->emitted || (k > g->lp_emitted && g->want_lp) || (g->chat && !g->sent_role)) {
            out_chunk(g, g->emitted, show, g->lp_emitted, k, NULL);
            g->emitted = show;
            g->lp_emitted = k;
        }
        if (finished) {
            if (g->stopped && !g->done) ib_sched_cancel(S->sched, g->job);
            if (g->store_failed) {
                static const char se[] = "data: {\"error\":{\"message\":\"the session's tokens could not be stored; "
                                          "the session is back at its last stored state\",\"type\":\"server_error\","
                                          "\"code\":\"store_error\"}}\n\n";
                out_append(g, se, sizeof se - 1);
            } else if (!strcmp(finish_reason(g), "error")) {
                out_append(g, "data: {\"error\":{\"message\":\"generation failed\",\"type\":\"server_error\"}}\n\n", 72);
            } else
                out_chunk(g, show, show, k, k, finish_reason(g));
            if (g->include_usage) {
                json_t *j = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
                json_object_set_new(j, "choices", json_array());
                json_object_set_new(j, "usage", usage_json(g));
                out_event(g, j);
            }
            out_append(g, "data: [DONE]\n\n", 14);
            g->sent_done = 1;
        }
        if (g->out_len) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (now_s() > t_end) { /* the request ran too long: stop it */
            ib_sched_cancel(S->sched, g->job);
            t_end = now_s() + 3600;
        }
    }
    size_t n = g->out_len - g->out_pos;
    if (n > max) n = max;
    memcpy(buf, g->out + g->out_pos, n);
    g->out_pos += n;
    pthread_mutex_unlock(&g->mu);
    return (ssize_t)n;
}

/* MHD: the stream's response is gone (finished or the client went away): stop the job. */
static void sse_free(void *cls) {
    gen *g = cls;
    pthread_mutex_lock(&g->mu);
    int done = g->done;
    pthread_mutex_unlock(&g->mu);
    if (!done) ib_sched_cancel(g->srv->sched, g->job);
    if (g->stored_gen) { /* the client left: the session's tokens are stored all the same */
        pthread_mutex_lock(&g->mu);
        while (!g->done) pthread_cond_wait(&g->cv, &g->mu);
        pthread_mutex_unlock(&g->mu);
        gen_commit(g);
    }
    gen_unref(g);
}

/* KV bytes of one token of one session of this server. */
static size_t kv_token_bytes(const server *S) { return ib_kv_bytes_per_token(S->m, S->o.kv_dtype); }

/* Reserve `bytes` of KV memory for key t: within the server's budget and the key's quota, waiting
 * up to queue_wait_ms in a bounded queue when wait is set. 0 on success; -2 when the bytes exceed
 * the whole budget or the key's whole quota (it can never fit); -1 the budget is in use; -3 the
 * key's quota is in use (other keys' work is not what holds it up). */
static int mem_reserve(server *S, int t, size_t bytes, int wait) {
    size_t budget = S->o.memory_budget, kq = S->key_kv;
    pthread_mutex_lock(&S->mu);
    if ((budget && bytes > budget) || (kq && bytes > kq)) {
        pthread_mutex_unlock(&S->mu);
        return -2;
    }
#define GLOBAL_FITS (!budget || S->kv_used + bytes <= budget)
#define KEY_FITS (!kq || S->tu[t].kv + bytes <= kq)
    if (!GLOBAL_FITS || !KEY_FITS) {
        if (!wait || S->mem_waiters >= S->o.max_queue) {
            int r = KEY_FITS ? -1 : -3;
            pthread_mutex_unlock(&S->mu);
            return r;
        }
        S->mem_waiters++;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + (long long)S->o.queue_wait_ms * 1000000LL;
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        int rc = 0;
        while ((!GLOBAL_FITS || !KEY_FITS) && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&S->mem_cv, &S->mu, &ts);
        S->mem_waiters--;
        if (!GLOBAL_FITS || !KEY_FITS) {
            int r = KEY_FITS ? -1 : -3;
            pthread_mutex_unlock(&S->mu);
            return r;
        }
    }
#undef GLOBAL_FITS
#undef KEY_FITS
    S->kv_used += bytes;
    S->tu[t].kv += bytes;
    pthread_mutex_unlock(&S->mu);
    return 0;
}

/* Give back bytes reserved by mem_reserve for key t. */
static void mem_release(server *S, int t, size_t bytes) {
    pthread_mutex_lock(&S->mu);
    S->kv_used -= bytes;
    S->tu[t].kv -= bytes;
    pthread_cond_broadcast(&S->mem_cv);
    pthread_mutex_unlock(&S->mu);
}

/* Take one of key t's in-flight requests (generations queued, waiting or running). 0 on success,
 * -1 when the key holds its quota already. */
static int inflight_take(server *S, int t) {
    pthread_mutex_lock(&S->mu);
    int ok = !S->key_requests || S->tu[t].inflight < S->key_requests;
    if (ok) S->tu[t].inflight++;
    pthread_mutex_unlock(&S->mu);
    return ok ? 0 : -1;
}

static void inflight_put(server *S, int t) {
    pthread_mutex_lock(&S->mu);
    S->tu[t].inflight--;
    pthread_mutex_unlock(&S->mu);
}

/* Whether the client of connection c has closed its end (it gave up on a request it is waiting for).
 * Looks at the socket without reading from it: a half-close or reset counts as gone. */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd pf = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* ib_sched_job.constrain of a response_format json_object generation (json_constraint.c). */
static int json_constrain(void *ctx, float *logits, int vocab) {
    gen *g = ctx;
    return ib_json_mask(&g->json, &g->srv->jv, logits, vocab, g->stop_ids, g->n_stop_ids);
}

/* Start generation g on session s (prompt ids) and answer: an SSE stream, or wait and send the body.
 * Consumes the caller's reference to g. */
static enum MHD_Result run_gen(server *S, struct MHD_Connection *c, gen *g, ib_session *s, const int32_t *ids,
                               int n_ids, gen_params *p) {
    g->vcap = s->capacity;
    g->vchunk = s->kv_chunk;
    ib_session_set_sampling(s, &p->sp);
    ib_sched_job jb = {.session = s, .prompt = ids, .n_prompt = n_ids, .max_new_tokens = p->max_tokens, .n_replay = g->n_replay,
                       .stop_ids = g->stop_ids, .n_stop = g->n_stop_ids, .want_logprobs = p->want_lp,
                       .top_logprobs = g->n_top, .group = g->tidx,
                       .on_event = on_event, .ctx = g,
                       .logit_bias_ids = p->bias.ids, .logit_bias = p->bias.vals, .n_logit_bias = p->bias.n,
                       .constrain = g->want_json ? json_constrain : NULL, .constrain_ctx = g};
    g->refs = 2; /* the connection, the scheduler */
    ib_error err;
    uint64_t id;
    if (ib_sched_submit(S->sched, &jb, &id, &err)) {
        /* nothing was started: undo as the DONE event would have */
        ib_sched_event ev = {.done = 1, .finish = "error", .prompt_fed = 0, .generated = 0};
        on_event(g, &ev);
        gen_commit(g);
        gen_unref(g);
        if (err.code == IB_ERR_STATE)
            return send_error(S, c, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                              "the server is at capacity (%d running, queue full); retry later", S->o.max_batch);
        if (err.code == IB_ERR_CONTEXT)
            return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens", "%s", err.msg);
        return send_error(S, c, 500, "server_error", NULL, NULL, "%s", err.msg);
    }
    pthread_mutex_lock(&g->mu);
    g->job = id;
    pthread_mutex_unlock(&g->mu);
    /* the idle timeout guards reading the request; while the generation runs (queued, or streaming
     * with gaps) its own time limit applies, so the connection must not be dropped as idle first */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)S->o.timeout_s + 30u);
    if (g->stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, g, sse_free);
        if (!r) {
            ib_sched_cancel(S->sched, id);
            gen_unref(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        ib_http_decorate(r, 200);
        pthread_mutex_lock(&S->mu);
        S->http_by_class[2]++;
        pthread_mutex_unlock(&S->mu);
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    /* wait for the end, a stop string, the time limit, or the client going away */
    pthread_mutex_lock(&g->mu);
    double t_end = now_s() + S->o.timeout_s;
    int cancelled = 0, gone = 0;
    for (;;) {
        render(g);
        if (g->done) break;
        if (!gone && client_gone(c)) gone = 1;
        if (g->stopped || gone || now_s() > t_end) {
            if (!cancelled) ib_sched_cancel(S->sched, g->job);
            cancelled = 1;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + 200000000LL; /* 0.2 s: how soon a client's leaving is noticed */
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    if (g->commit) { /* the tokens are durable before the response is sent */
        pthread_mutex_unlock(&g->mu);
        gen_commit(g);
        pthread_mutex_lock(&g->mu);
    }
    enum MHD_Result ret;
    if (gone && !strcmp(g->finish, "cancelled")) {
        pthread_mutex_unlock(&g->mu);
        ret = MHD_NO; /* nobody to answer: close the connection */
    } else if (g->store_failed) {
        pthread_mutex_unlock(&g->mu);
        ret = send_error(S, c, 503, "server_error", "store_error", NULL,
                         "the session's tokens could not be stored; the session is back at its last stored state");
    } else if (!strcmp(g->finish, "error")) {
        pthread_mutex_unlock(&g->mu);
        ret = send_error(S, c, 500, "server_error", NULL, NULL, "generation failed");
    } else if (!strcmp(g->finish, "cancelled") && !g->stopped) {
        pthread_mutex_unlock(&g->mu);
        if (S->draining)
            ret = send_error(S, c, 503, "server_error", "server_shutting_down", NULL,
                             "the server is shutting down and its drain time ran out; retry on another server");
        else
            ret = send_error(S, c, 504, "server_error", "timeout", NULL, "generation cancelled (time limit)");
    } else {
        json_t *j = final_json(g);
        pthread_mutex_unlock(&g->mu);
        ret = send_json(S, c, 200, j, 0);
    }
    gen_unref(g);
    return ret;
}

/* Record a request-scoped generation's prompt for its verification record (no history, no draws).
 * An allocation failure leaves the record's prompt empty (verification null). */
static void gen_set_prompt(gen *g, const int32_t *ids, int n) {
    if (!(g->vin = malloc((size_t)n * sizeof *ids))) return;
    memcpy(g->vin, ids, (size_t)n * sizeof *ids);
    g->n_vprompt = n;
}

static gen *gen_new(server *S, int chat, gen_params *p) {
    gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = 1;
    g->srv = S;
    pthread_mutex_lock(&S->mu);
    S->n_gens++;
    pthread_mutex_unlock(&S->mu);
    g->chat = chat;
    g->stream = p->stream;
    g->include_usage = p->include_usage;
    g->want_lp = p->want_lp;
    g->n_top = p->want_lp ? p->top_lp : 0;
    for (int i = 0; i < p->n_stops; i++) g->stops[i] = p->stops[i];
    g->n_stops = p->n_stops;
    p->n_stops = 0;
    g->created = (long)time(NULL);
    g->seed = p->sp.seed;
    g->sp = p->sp;
    g->h = IB_DIGEST_INIT;
    g->vkvd = S->o.kv_dtype;
    snprintf(g->vkv, sizeof g->vkv, "full");
    if (p->bias.n > 0) { /* kept for the verification record */
        g->vbias.ids = malloc((size_t)p->bias.n * sizeof *g->vbias.ids);
        g->vbias.vals = malloc((size_t)p->bias.n * sizeof *g->vbias.vals);
        if (g->vbias.ids && g->vbias.vals) {
            memcpy(g->vbias.ids, p->bias.ids, (size_t)p->bias.n * sizeof *g->vbias.ids);
            memcpy(g->vbias.vals, p->bias.vals, (size_t)p->bias.n * sizeof *g->vbias.vals);
            g->vbias.n = p->bias.n;
        }
    }
    g->t_arrive = g->t_last = now_s();
    char hex[33];
    if (random_hex(S, hex, 12)) snprintf(hex, sizeof hex, "0");
    snprintf(g->id, sizeof g->id, "%s-%s", chat ? "chatcmpl" : "cmpl", hex);
    return g;
}

/* ------------------------------------------------------------------ completions and chat */

/* ib_tokenize_cancel's callback: stop tokenizing for a client that has gone away. */
static int tok_client_gone(void *c) { return client_gone(c); }

/* Tokenize text into a fresh array; *n gets the count. *rc: 0 ok, -1 out of memory, -2 over
 * max_prompt, -3 the client left while it ran (nobody to answer). */
static int32_t *tokenize(server *S, struct MHD_Connection *c, const char *text, size_t len, int flags, int *n, int *rc) {
    int cap = S->o.max_prompt_tokens + 1;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    *rc = 0;
    if (!ids) {
        *rc = -1;
        return NULL;
    }
    int k = ib_tokenize_cancel(S->m, text, len, flags, ids, cap, tok_client_gone, c);
    if (k < 0) {
        free(ids);
        *rc = k == -2 ? -3 : -1;
        return NULL;
    }
    *n = k;
    if (k > S->o.max_prompt_tokens) *rc = -2;
    return ids;
}

#define MAX_MESSAGES 4096

/* The chat messages of a request (chat/completions, or a session's append): msgs must be an array
 * of 1..MAX_MESSAGES objects, each with a string content and a role among system, developer (taken
 * as system), user and assistant — exactly, so no role can carry other text (such as a chat
 * template's markers) into the prompt. On success *out (freed by the caller; its strings belong to
 * msgs) and *n are set and 0 is returned; -1 with a message in why when invalid; -2 out of memory. */
static int chat_messages(json_t *msgs, ib_chat_msg **out, size_t *n, char *why, size_t wsz) {
    *out = NULL;
    *n = 0;
    if (!json_is_array(msgs) || json_array_size(msgs) < 1) {
        snprintf(why, wsz, "messages must be a non-empty array");
        return -1;
    }
    size_t nm = json_array_size(msgs);
    if (nm > MAX_MESSAGES) {
        snprintf(why, wsz, "messages holds %zu messages, more than the limit of %d", nm, MAX_MESSAGES);
        return -1;
    }
    ib_chat_msg *cm = calloc(nm, sizeof *cm);
    if (!cm) return -2;
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role"), *ct = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role) || !json_is_string(ct)) {
            free(cm);
            snprintf(why, wsz, "messages[%zu] needs a string role and a string content", i);
            return -1;
        }
        const char *r = json_string_value(role);
        if (strlen(r) != json_string_length(role) ||
            (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer"))) {
            free(cm);
            snprintf(why, wsz, "messages[%zu].role '%.40s' is not system, developer, user or assistant", i, r);
            return -1;
        }
        cm[i].role = strcmp(r, "developer") ? r : "system";
        cm[i].content = json_string_value(ct);
    }
    *out = cm;
    *n = nm;
    return 0;
}

/* 0 when the body names the served model; else the error response has been queued into *r. */
static int check_model(server *S, struct MHD_Connection *c, json_t *b, enum MHD_Result *r) {
    json_t *mv = json_object_get(b, "model");
    if (!mv)
        *r = send_error(S, c, 400, "invalid_request_error", "missing_required_parameter", "model", "model is required");
    else if (!json_is_string(mv))
        *r = BAD("model", "model must be a string");
    else if (strcmp(json_string_value(mv), S->model_id))
        *r = send_error(S, c, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%s' does not exist (this server serves '%s')", json_string_value(mv), S->model_id);
    else
        return 0;
    return -1;
}


/* The request-field checks of api_request.c for endpoint ep: unknown or unimplemented fields, then
 * the rewriting of accepted forms (content parts, top_k -1, a fresh seed). 0 when b may go on; else
 * the 400 has been queued into *r. */
static int check_request(server *S, struct MHD_Connection *c, json_t *b, ib_api_endpoint ep, enum MHD_Result *r) {
    const char *param = NULL, *code = "invalid_value";
    char msg[256];
    if (ib_api_check_fields(b, ep, &param, &code, msg, sizeof msg) ||
        ib_api_normalize(b, ep, &param, msg, sizeof msg)) {
        *r = send_error(S, c, 400, "invalid_request_error", code, param, "%s", msg);
        return -1;
    }
    return 0;
}

/* Copy p with its own stop strings and bias (gen_new takes a params' stops); -1 when out of memory. */
static int params_copy(const gen_params *p, gen_params *q) {
    *q = *p;
    q->n_stops = 0;
    memset(&q->bias, 0, sizeof q->bias);
    for (int i = 0; i < p->n_stops; i++) {
        if (!(q->stops[i] = strdup(p->stops[i]))) {
            params_free(q);
            return -1;
        }
        q->n_stops = i + 1;
    }
    return 0;
}

/* POST /v1/completions whose prompt is a list of np prompts (strings, or arrays of token ids): one
 * generation per prompt with the same parameters, all submitted at once so they batch together (each
 * in its own session, so each is what it would be alone), answered as one body with choice i for
 * prompt i and the usage of all. Not streamed (stream: true is refused with a 400). */
static enum MHD_Result handle_completions_multi(server *S, struct MHD_Connection *c, json_t *b, int np, int tidx) {
    json_t *pr = json_object_get(b, "prompt");
    if (np > S->o.max_batch + (S->o.max_queue > 0 ? S->o.max_queue : 0))
        return BAD("prompt", "%d prompts: more than this server runs or queues at once (%d)", np,
                   S->o.max_batch + (S->o.max_queue > 0 ? S->o.max_queue : 0));
    gen_params p;
    const char *param = NULL;
    char msg[256];
    if (parse_params(S, b, 0, 16, &p, &param, msg, sizeof msg)) return BAD(param, "%s", msg);
    if (p.stream) {
        params_free(&p);
        return BAD("stream", "stream is not supported with several prompts: send one request per prompt to stream");
    }
    gen **gs = calloc((size_t)np, sizeof *gs);
    if (!gs) {
        params_free(&p);
        return send_error(S, c, 500, "server_error", NULL, NULL, "out of memory");
    }
    enum MHD_Result ret = MHD_YES;
    int failed = 0, ng = 0;
    for (int i = 0; i < np && !failed; i++) {
        json_t *pi = json_array_get(pr, (size_t)i);
        int32_t *ids = NULL;
        int n_ids = 0, trc = 0;
        if (json_is_string(pi)) {
            ids = tokenize(S, c, json_string_value(pi), json_string_length(pi), IB_TOKENIZE_ADD_SPECIAL, &n_ids, &trc);
        } else {
            size_t nt = json_array_size(pi);
            if (nt > (size_t)S->o.max_prompt_tokens) trc = -2;
            else if (!(ids = malloc(nt * sizeof *ids))) trc = -1;
            for (size_t k = 0; !trc && k < nt; k++) {
                json_t *v = json_array_get(pi, k);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= S->info->vocab_size) {
                    ret = BAD("prompt", "prompt[%d][%zu] must be a token id in [0, %d)", i, k, S->info->vocab_size);
                    failed = 1;
                    break;
                }
                ids[k] = (int32_t)json_integer_value(v);
            }
            n_ids = (int)nt;
        }
        if (failed) {
            free(ids);
            break;
        }
        const char *why = NULL;
        if (trc == -1) ret = send_error(S, c, 500, "server_error", NULL, NULL, "tokenization failed"), why = "";
        else if (trc == -2)
            ret = send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "prompt",
                             "prompt %d has more than this server's limit of %d tokens", i, S->o.max_prompt_tokens),
            why = "";
        else if (n_ids < 1)
            ret = BAD("prompt", "prompt %d is empty", i), why = "";
        else if ((long)n_ids + p.max_tokens > S->info->max_context)
            ret = send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                             "prompt %d: %d tokens + max_tokens %d exceed the model's context of %d", i, n_ids,
                             p.max_tokens, S->info->max_context),
            why = "";
        if (why) {
            free(ids);
            failed = 1;
            break;
        }
        int cap = n_ids + (p.max_tokens > 0 ? p.max_tokens : 1);
        size_t bytes = (size_t)cap * kv_token_bytes(S);
        if (inflight_take(S, tidx)) {
            free(ids);
            ret = send_error(S, c, 429, "rate_limit_error", "key_request_limit", NULL,
                             "this API key has its limit of %d requests in flight; retry later", S->key_requests);
            failed = 1;
            break;
        }
        int mrc = mem_reserve(S, tidx, bytes, 1);
        if (mrc) {
            inflight_put(S, tidx);
            free(ids);
            ret = mrc == -2 ? send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", NULL,
                                         "prompt %d needs %zu KV bytes, more than the memory budget of %zu", i, bytes,
                                         S->o.memory_budget)
                  : mrc == -3 ? send_error(S, c, 429, "rate_limit_error", "key_memory_quota_exceeded", NULL,
                                           "this API key's KV quota of %zu bytes is in use; retry later", S->key_kv)
                              : send_error(S, c, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                                           "the KV memory budget is in use; retry later");
            failed = 1;
            break;
        }
        ib_session_opts so = {.max_context = cap, .sampling = p.sp, .kv_dtype = S->o.kv_dtype, .backend = S->o.backend};
        ib_session *s = NULL;
        ib_error err;
        gen_params q;
        gen *g = NULL;
        if (params_copy(&p, &q) || ib_session_create(S->m, &so, &s, &err) || !(g = gen_new(S, 0, &q))) {
            if (s) ib_session_free(s);
            params_free(&q);
            free(ids);
            mem_release(S, tidx, bytes);
            inflight_put(S, tidx);
            ret = send_error(S, c, 503, "server_error", "out_of_memory", NULL, "cannot create a session now; retry later");
            failed = 1;
            break;
        }
        params_free(&q);
        g->own = s;
        g->reserved = bytes;
        g->tidx = tidx;
        g->inflight = 1;
        g->n_prompt = n_ids;
        gen_set_prompt(g, ids, n_ids);
        g->vcap = s->capacity;
        if (S->info->eos_id >= 0) g->stop_ids[g->n_stop_ids++] = S->info->eos_id;
        ib_session_set_sampling(s, &p.sp);
        ib_sched_job jb = {.session = s, .prompt = ids, .n_prompt = n_ids, .max_new_tokens = p.max_tokens,
                           .stop_ids = g->stop_ids, .n_stop = g->n_stop_ids, .want_logprobs = p.want_lp,
                           .top_logprobs = g->n_top, .group = tidx, .on_event = on_event, .ctx = g,
                           .logit_bias_ids = p.bias.ids, .logit_bias = p.bias.vals, .n_logit_bias = p.bias.n};
        g->refs = 2; /* the connection, the scheduler */
        uint64_t id;
        if (ib_sched_submit(S->sched, &jb, &id, &err)) {
            ib_sched_event ev = {.done = 1, .finish = "error"};
            on_event(g, &ev);
            gen_unref(g);
            free(ids);
            ret = err.code == IB_ERR_STATE
                      ? send_error(S, c, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                                   "the server is at capacity (%d running, queue full); retry later", S->o.max_batch)
                      : send_error(S, c, 500, "server_error", NULL, NULL, "%s", err.msg);
            failed = 1;
            break;
        }
        free(ids);
        pthread_mutex_lock(&g->mu);
        g->job = id;
        pthread_mutex_unlock(&g->mu);
        gs[ng++] = g;
    }
    if (!failed) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)S->o.timeout_s + 30u);
    /* wait for every generation (a stop string, the time limit or the client leaving cancels) */
    double t_end = now_s() + S->o.timeout_s;
    int gone = 0;
    for (int i = 0; i < ng; i++) {
        gen *g = gs[i];
        pthread_mutex_lock(&g->mu);
        int cancelled = 0;
        for (;;) {
            render(g);
            if (g->done) break;
            if (!gone && client_gone(c)) gone = 1;
            if (failed || g->stopped || gone || now_s() > t_end) {
                if (!cancelled) ib_sched_cancel(S->sched, g->job);
                cancelled = 1;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long long ns = ts.tv_nsec + 200000000LL;
            ts.tv_sec += ns / 1000000000LL;
            ts.tv_nsec = ns % 1000000000LL;
            pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        }
        pthread_mutex_unlock(&g->mu);
    }
    if (!failed) {
        json_t *choices = json_array();
        long long pt = 0, ct = 0;
        const char *bad = NULL;
        for (int i = 0; i < ng; i++) {
            gen *g = gs[i];
            pthread_mutex_lock(&g->mu);
            if (!strcmp(g->finish, "error")) bad = "error";
            else if (!strcmp(g->finish, "cancelled") && !g->stopped && !bad) bad = "cancelled";
            json_t *one = final_json(g);
            pthread_mutex_unlock(&g->mu);
            json_t *ch = json_incref(json_array_get(json_object_get(one, "choices"), 0));
            json_object_set_new(ch, "index", json_integer(i));
            json_object_set(ch, "verification", json_object_get(one, "verification")); /* one record per prompt */
            json_array_append_new(choices, ch);
            pt += g->n_prompt;
            ct += g->n;
            json_decref(one);
        }
        if (gone) {
            json_decref(choices);
            ret = MHD_NO;
        } else if (bad) {
            json_decref(choices);
            ret = !strcmp(bad, "error") ? send_error(S, c, 500, "server_error", NULL, NULL, "generation failed")
                                        : send_error(S, c, 504, "server_error", "timeout", NULL,
                                                     "generation cancelled (time limit or shutdown)");
        } else {
            json_t *j = envelope(gs[0], "text_completion");
            json_object_set_new(j, "choices", choices);
            json_t *u = json_object();
            json_object_set_new(u, "prompt_tokens", json_integer(pt));
            json_object_set_new(u, "completion_tokens", json_integer(ct));
            json_object_set_new(u, "total_tokens", json_integer(pt + ct));
            json_object_set_new(j, "usage", u);
            ret = send_json(S, c, 200, j, 0);
        }
    }
    for (int i = 0; i < ng; i++) gen_unref(gs[i]);
    free(gs);
    params_free(&p);
    return ret;
}

/* POST /v1/completions and /v1/chat/completions. */
static enum MHD_Result handle_generate(server *S, struct MHD_Connection *c, json_t *b, int chat, int tidx) {
    enum MHD_Result mr;
    if (check_model(S, c, b, &mr)) return mr;
    if (check_request(S, c, b, chat ? IB_API_CHAT : IB_API_COMPLETIONS, &mr)) return mr;
    if (!chat) {
        char pmsg[256];
        int np = ib_api_prompt_count(json_object_get(b, "prompt"), pmsg, sizeof pmsg);
        if (np < 0) return BAD("prompt", "%s", pmsg);
        if (np > 0) return handle_completions_multi(S, c, b, np, tidx);
    }
    int32_t *ids = NULL;
    int n_ids = 0, trc = 0;
    if (chat) {
        json_t *msgs = json_object_get(b, "messages");
        ib_chat_msg *cm = NULL;
        size_t nm = 0;
        char why[256];
        int mrc = chat_messages(msgs, &cm, &nm, why, sizeof why);
        if (mrc == -2) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
        if (mrc) return BAD("messages", "%s", why);
        int flags = IB_CHAT_GENERATION_PROMPT, think = 1;
        int given = get_bool(b, "enable_thinking", &think);
        if (given < 0) {
            free(cm);
            return BAD("enable_thinking", "enable_thinking must be a boolean");
        }
        if (!think) flags |= IB_CHAT_NO_THINKING;
        else if (given) flags |= IB_CHAT_THINKING;   /* asked for: Gemma 4 thinks only then */
        long need = ib_chat_format(S->m, cm, (int)nm, flags, NULL, 0);
        if (need < 0) {
            free(cm);
            return BAD("messages", "this model has no chat format, or its format refuses these roles "
                                   "(Gemma 2/3: user and assistant turns must alternate)");
        }
        char *text = malloc((size_t)need + 1);
        if (!text) {
            free(cm);
            return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
        }
        ib_chat_format(S->m, cm, (int)nm, flags, text, (size_t)need + 1);
        free(cm);
        ids = tokenize(S, c, text, (size_t)need, 0, &n_ids, &trc);
        free(text);
    } else {
        json_t *pr = json_object_get(b, "prompt");
        if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
            pr = json_array_get(pr, 0);
        if (json_is_string(pr)) {
            ids = tokenize(S, c, json_string_value(pr), json_string_length(pr), IB_TOKENIZE_ADD_SPECIAL, &n_ids, &trc);
        } else if (json_is_array(pr) && json_array_size(pr) > 0) {
            size_t np = json_array_size(pr);
            if (np > (size_t)S->o.max_prompt_tokens) {
                trc = -2;
                n_ids = (int)(np < 1u << 30 ? np : 1u << 30);
            } else {
                ids = malloc(np * sizeof *ids);
                if (!ids) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
                for (size_t i = 0; i < np; i++) {
                    json_t *v = json_array_get(pr, i);
                    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= S->info->vocab_size) {
                        free(ids);
                        return BAD("prompt", "prompt[%zu] must be a token id in [0, %d)", i, S->info->vocab_size);
                    }
                    ids[i] = (int32_t)json_integer_value(v);
                }
                n_ids = (int)np;
            }
        } else
            return BAD("prompt", "prompt must be a string, a non-empty array of token ids, or a list of prompts "
                                 "(strings or arrays of token ids)");
    }
    if (trc == -3) return MHD_NO; /* the client left while its text was tokenized: close */
    if (trc == -1) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory while tokenizing; retry later");
    if (trc == -2) {
        free(ids);
        return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt",
                          "the prompt has more than this server's limit of %d tokens", S->o.max_prompt_tokens);
    }
    if (n_ids < 1) {
        free(ids);
        return BAD(chat ? "messages" : "prompt", "the prompt is empty");
    }
    gen_params p;
    const char *param = NULL;
    char msg[256];
    int room = S->info->max_context - n_ids;
    int def = chat ? (room < S->o.max_tokens ? room : S->o.max_tokens) : 16;
    if (def < 0) def = 0;
    if (parse_params(S, b, chat, def, &p, &param, msg, sizeof msg)) {
        free(ids);
        return BAD(param, "%s", msg);
    }
    if ((long)n_ids + p.max_tokens > S->info->max_context) {
        free(ids);
        params_free(&p);
        return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                          "%d prompt tokens + max_tokens %d exceed the model's context of %d", n_ids, p.max_tokens,
                          S->info->max_context);
    }
    int cap = n_ids + (p.max_tokens > 0 ? p.max_tokens : 1);
    size_t bytes = (size_t)cap * kv_token_bytes(S);
    if (inflight_take(S, tidx)) {
        free(ids);
        params_free(&p);
        return send_error(S, c, 429, "rate_limit_error", "key_request_limit", NULL,
                          "this API key has its limit of %d requests in flight; retry later", S->key_requests);
    }
    int mrc = mem_reserve(S, tidx, bytes, 1);
    if (mrc) {
        inflight_put(S, tidx);
        free(ids);
        params_free(&p);
        if (mrc == -2)
            return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", NULL,
                              "this request needs %zu KV bytes, more than the memory budget of %zu (%zu per key)", bytes,
                              S->o.memory_budget, S->key_kv ? S->key_kv : S->o.memory_budget);
        if (mrc == -3)
            return send_error(S, c, 429, "rate_limit_error", "key_memory_quota_exceeded", NULL,
                              "this API key's KV quota of %zu bytes is in use; retry later", S->key_kv);
        return send_error(S, c, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                          "the KV memory budget is in use; retry later");
    }
    ib_session_opts so = {.max_context = cap, .sampling = p.sp, .kv_dtype = S->o.kv_dtype,
                          .backend = S->o.backend};
    ib_session *s;
    ib_error err;
    gen *g = NULL;
    s = NULL;
    if (ib_session_create(S->m, &so, &s, &err) || !(g = gen_new(S, chat, &p))) {
        ib_session_free(s);
        free(ids);
        params_free(&p);
        mem_release(S, tidx, bytes);
        inflight_put(S, tidx);
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL,
                          "cannot allocate %zu KV bytes for this request now; retry later", bytes);
    }
    g->own = s;
    g->reserved = bytes;
    g->tidx = tidx;
    g->inflight = 1;
    g->n_prompt = n_ids;
    gen_set_prompt(g, ids, n_ids);
    if (chat)
        g->n_stop_ids = ib_chat_stop_ids(S->m, g->stop_ids, MAX_STOP_IDS);
    else if (S->info->eos_id >= 0)
        g->stop_ids[g->n_stop_ids++] = S->info->eos_id;
    /* response_format json_object / json_schema (checked by ib_api_check_fields; json_constraint.c) */
    if ((g->want_json = chat ? ib_json_setup(&g->json, json_object_get(b, "response_format")) : 0) < 0) {
        ib_sched_event ev = {.done = 1, .finish = "error"}; /* undo as run_gen's failure does (g's one ref) */
        on_event(g, &ev);
        free(ids);
        params_free(&p);
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory for the schema; retry later");
    }
    enum MHD_Result r = run_gen(S, c, g, s, ids, n_ids, &p);
    free(ids);
    params_free(&p);
    return r;
}

/* ------------------------------------------------------------------ stateful sessions */

static void sess_free(server *S, sess *ss) {
    ib_session_free(ss->s);
    ib_store_session_free(&ss->rec);
    free(ss->htok);
    free(ss->hfl);
    mem_release(S, ss->tidx, ss->kv_bytes);
    free(ss->pending);
    free(ss->tenant);
    free(ss);
}

static void sess_unref(server *S, sess *ss) {
    pthread_mutex_lock(&S->mu);
    int left = --ss->refs;
    pthread_mutex_unlock(&S->mu);
    if (!left) sess_free(S, ss);
}

/* Take ss out of the session table (a DELETE, idle expiry, a failed store write): no request finds it
 * any more; it is freed when its last reference goes. With a store its record stays there, and a
 * later request for its id loads it again. */
static void sess_evict(server *S, sess *ss) {
    pthread_mutex_lock(&S->mu);
    int found = 0;
    for (int i = 0; i < S->n_sessions; i++)
        if (S->sessions[i] == ss) {
            S->sessions[i] = S->sessions[--S->n_sessions];
            S->tu[ss->tidx].sessions--;
            found = 1;
            break;
        }
    ss->closed = 1;
    pthread_mutex_unlock(&S->mu);
    if (found) sess_unref(S, ss); /* the table's reference; a running generation keeps its own */
}

/* Tokens session ss's KV holds, or will hold once rebuilt (lock held). */
static int sess_pos(const sess *ss) { return ss->resident ? ib_session_position(ss->s) : ss->rec.progress.n_fed; }

/* Find session id for tenant (a new reference), or NULL. */
static sess *sess_get(server *S, const char *id, const char *tenant) {
    sess *r = NULL;
    pthread_mutex_lock(&S->mu);
    for (int i = 0; i < S->n_sessions; i++) {
        sess *ss = S->sessions[i];
        if (!strcmp(ss->id, id) && !strcmp(ss->tenant, tenant) && !ss->closed) {
            ss->refs++;
            ss->last_used = now_s();
            r = ss;
            break;
        }
    }
    pthread_mutex_unlock(&S->mu);
    return r;
}

static json_t *sess_info(server *S, sess *ss) {
    json_t *j = json_object();
    pthread_mutex_lock(&S->mu);
    int pos = sess_pos(ss);
    json_object_set_new(j, "id", json_string(ss->id));
    json_object_set_new(j, "object", json_string("session"));
    json_object_set_new(j, "model", json_string(S->model_id));
    json_object_set_new(j, "tokens_held", json_integer(pos + ss->n_pending));
    json_object_set_new(j, "kv_tokens", json_integer(pos));
    json_object_set_new(j, "pending_tokens", json_integer(ss->n_pending));
    json_object_set_new(j, "max_context", json_integer(ib_session_capacity(ss->s)));
    json_object_set_new(j, "kv_bytes", json_integer((json_int_t)ss->kv_bytes));
    json_object_set_new(j, "kv_policy", json_string(ss->policy));
    json_object_set_new(j, "busy", json_boolean(ss->busy));
    /* resident: its KV is in memory; false: loaded from the store, rebuilt by its next generation */
    json_object_set_new(j, "resident", json_boolean(ss->resident));
    /* idle expiry: closed once idle_timeout seconds pass with no request naming it */
    int it = S->o.session_idle_timeout_s;
    json_object_set_new(j, "idle_timeout", json_integer(it));
    json_object_set_new(j, "expires_at", it > 0 ? json_integer((json_int_t)time(NULL) +
                                                                (json_int_t)(ss->last_used + it - now_s() + 0.5))
                                                : json_null());
    pthread_mutex_unlock(&S->mu);
    return j;
}

static enum MHD_Result handle_session_create(server *S, struct MHD_Connection *c, json_t *b, const char *tenant, int tidx) {
    /* the KV a session may hold is bounded by the model's context (a full session never holds more
     * positions; a window wider than the context keeps nothing a full session would not) */
    long long ctx = S->o.session_context < S->info->max_context ? S->o.session_context : S->info->max_context;
    if (b && get_int(b, "max_context", 1, S->info->max_context, &ctx) < 0)
        return BAD("max_context", "max_context must be an integer in [1, %d]", S->info->max_context);
    const char *policy = S->o.kv_policy ? S->o.kv_policy : "full";
    json_t *kv = b ? json_object_get(b, "kv") : NULL;
    if (kv && json_is_null(kv)) kv = NULL; /* null: the server's default, like every other optional field */
    if (kv && !json_is_string(kv)) return BAD("kv", "kv must be a string: full, window:W or sink:S,window:W");
    if (kv) policy = json_string_value(kv);
    int sink = 0, window = 0;
    if (ib_kv_policy_parse(policy, &sink, &window) || strlen(policy) >= 48)
        return BAD("kv", "kv '%.64s' is not full, window:W or sink:S,window:W", policy);
    if (window > 0 && (long long)sink + window > S->info->max_context)
        return BAD("kv", "kv '%s': sink + window = %lld positions exceed the model's context of %d", policy,
                   (long long)sink + window, S->info->max_context);
    long long slots = window > 0 ? (long long)sink + window + S->o.prefill_chunk : ctx;
    size_t bytes = (size_t)slots * kv_token_bytes(S);
    if (S->o.memory_budget && bytes > S->o.memory_budget)
        return BAD(window > 0 ? "kv" : "max_context", "a session of %lld KV slots needs %zu bytes, more than this server's memory budget of %zu",
                   slots, bytes, S->o.memory_budget);
    pthread_mutex_lock(&S->mu);
    int full = S->n_sessions >= S->o.max_sessions, key_full = S->key_sessions && S->tu[tidx].sessions >= S->key_sessions;
    pthread_mutex_unlock(&S->mu);
    if (full)
        return send_error(S, c, 429, "rate_limit_error", "too_many_sessions", NULL,
                          "this server holds its limit of %d sessions; close one or retry later", S->o.max_sessions);
    if (key_full)
        return send_error(S, c, 429, "rate_limit_error", "key_session_limit", NULL,
                          "this API key holds its limit of %d sessions; close one or retry later", S->key_sessions);
    int mrc = mem_reserve(S, tidx, bytes, 0);
    if (mrc == -2)
        return BAD(window > 0 ? "kv" : "max_context", "a session of %lld KV slots needs %zu bytes, more than this API key's quota of %zu",
                   slots, bytes, S->key_kv);
    if (mrc == -3)
        return send_error(S, c, 429, "rate_limit_error", "key_memory_quota_exceeded", NULL,
                          "a session of %lld KV slots needs %zu bytes; this API key's quota of %zu is in use", slots, bytes,
                          S->key_kv);
    if (mrc)
        return send_error(S, c, 429, "rate_limit_error", "memory_budget_exceeded", NULL,
                          "a session of %lld tokens needs %zu KV bytes; the memory budget of %zu is in use", ctx, bytes,
                          S->o.memory_budget);
    sess *ss = calloc(1, sizeof *ss);
    ib_error err;
    ib_session_opts so = {.max_context = (int)ctx, .sampling = ib_sampling_default(), .kv_dtype = S->o.kv_dtype, .backend = S->o.backend, .kv_sink = sink,
                          .kv_window = window, .kv_chunk = S->o.prefill_chunk};
    if (!ss || !(ss->tenant = strdup(tenant)) || random_hex(S, ss->id + 5, 16) ||
        ib_session_create(S->m, &so, &ss->s, &err)) {
        if (ss) free(ss->tenant);
        free(ss);
        mem_release(S, tidx, bytes);
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL,
                          "cannot allocate a session of %zu KV bytes now; retry later", bytes);
    }
    memcpy(ss->id, "sess_", 5);
    snprintf(ss->policy, sizeof ss->policy, "%s", policy);
    ss->kv_bytes = bytes;
    ss->tidx = tidx;
    ss->last_used = now_s();
    ss->refs = 1; /* the table's */
    ss->cap_pending = (int)(window > 0 || ctx < S->o.max_prompt_tokens ? S->o.max_prompt_tokens : ctx) + 1;
    ss->pending = malloc((size_t)ss->cap_pending * sizeof(int32_t));
    ss->resident = 1;
    ss->kvd = S->o.kv_dtype;
    if (ss->pending && S->store) { /* durable before the client learns the id */
        ib_store_session rec = {.max_context = (int)ctx, .kv_sink = sink, .kv_window = window,
                                .kv_chunk = S->o.prefill_chunk, .kv_dtype = S->o.kv_dtype,
                                .progress = {.sampling = ib_sampling_default()}};
        snprintf(rec.id, sizeof rec.id, "%s", ss->id);
        snprintf(rec.model_id, sizeof rec.model_id, "%s", S->ident);
        ib_store_owner_hash(tenant, rec.owner);
        if (ib_store_create(S->store, &rec, &err)) {
            sess_free(S, ss);
            return send_error(S, c, 503, "server_error", "store_error", NULL, "the session could not be stored: %s", err.msg);
        }
    }
    pthread_mutex_lock(&S->mu);
    int ok = ss->pending && S->n_sessions < S->o.max_sessions && (!S->key_sessions || S->tu[tidx].sessions < S->key_sessions);
    if (ok) {
        S->sessions[S->n_sessions++] = ss;
        S->tu[tidx].sessions++;
    }
    pthread_mutex_unlock(&S->mu);
    if (!ok) {
        if (S->store && ss->pending) ib_store_delete(S->store, ss->id, NULL);
        sess_free(S, ss);
        return send_error(S, c, 429, "rate_limit_error", "too_many_sessions", NULL, "session limit reached");
    }
    return send_json(S, c, 200, sess_info(S, ss), 0);
}

static enum MHD_Result handle_session_append(server *S, struct MHD_Connection *c, sess *ss, json_t *b) {
    {
        const char *np = NULL;
        char nmsg[256];
        if (ib_api_normalize_messages(b, &np, nmsg, sizeof nmsg)) return BAD(np, "%s", nmsg);
    }
    json_t *text = json_object_get(b, "text"), *toks = json_object_get(b, "tokens"), *msgs = json_object_get(b, "messages");
    int32_t *ids = NULL;
    int n = 0, trc = 0;
    if (json_is_string(text)) {
        int add = 0;
        if (get_bool(b, "add_special", &add) < 0) return BAD("add_special", "add_special must be a boolean");
        ids = tokenize(S, c, json_string_value(text), json_string_length(text), add ? IB_TOKENIZE_ADD_SPECIAL : 0, &n, &trc);
    } else if (json_is_array(msgs)) {
        ib_chat_msg *cm = NULL;
        size_t nm = 0;
        char why[256];
        int mrc = chat_messages(msgs, &cm, &nm, why, sizeof why);
        if (mrc == -2) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
        if (mrc) return BAD("messages", "%s", why);
        int gp = 1;
        if (get_bool(b, "add_generation_prompt", &gp) < 0) {
            free(cm);
            return BAD("add_generation_prompt", "add_generation_prompt must be a boolean");
        }
        long need = ib_chat_format(S->m, cm, (int)nm, gp ? IB_CHAT_GENERATION_PROMPT : 0, NULL, 0);
        char *t = need >= 0 ? malloc((size_t)need + 1) : NULL;
        if (!t) {
            free(cm);
            return BAD("messages", "this model has no chat format, or its format refuses these roles "
                                   "(Gemma 2/3: user and assistant turns must alternate)");
        }
        ib_chat_format(S->m, cm, (int)nm, gp ? IB_CHAT_GENERATION_PROMPT : 0, t, (size_t)need + 1);
        free(cm);
        ids = tokenize(S, c, t, (size_t)need, 0, &n, &trc);
        free(t);
    } else if (json_is_array(toks)) {
        size_t nt = json_array_size(toks);
        if (nt > (size_t)S->o.max_prompt_tokens) trc = -2;
        else if (!(ids = malloc((nt + 1) * sizeof *ids))) trc = -1;
        for (size_t i = 0; !trc && i < nt; i++) {
            json_t *v = json_array_get(toks, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= S->info->vocab_size) {
                free(ids);
                return BAD("tokens", "tokens[%zu] must be a token id in [0, %d)", i, S->info->vocab_size);
            }
            ids[i] = (int32_t)json_integer_value(v);
        }
        n = (int)nt;
    } else
        return BAD(NULL, "append needs \"text\" (a string), \"tokens\" (token ids) or \"messages\"");
    if (trc == -3) return MHD_NO; /* the client left while its text was tokenized: close */
    if (trc == -1) return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory while tokenizing; retry later");
    if (trc == -2) {
        free(ids);
        return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", NULL,
                          "more than this server's limit of %d tokens", S->o.max_prompt_tokens);
    }
    pthread_mutex_lock(&S->mu);
    const char *why = NULL;
    if (ss->busy)
        why = "busy";
    else if ((long)sess_pos(ss) + ss->n_pending + n > ib_session_capacity(ss->s) ||
             ss->n_pending + n >= ss->cap_pending)
        why = "full";
    else if (S->store && n > 0) { /* durable before it is acknowledged: the session is busy meanwhile */
        ss->busy = 1;
        int at = ss->n_hist;
        pthread_mutex_unlock(&S->mu);
        uint8_t *fl = malloc((size_t)n);
        ib_error err;
        ib_status rc = fl ? IB_OK : ib_fail(&err, IB_ERR_NOMEM, "out of memory");
        if (fl) memset(fl, IB_STORE_TOK_NOTE_ON_FEED, (size_t)n);
        if (!rc) rc = ib_store_append(S->store, ss->id, at, ids, fl, n, NULL, &err);
        free(fl);
        pthread_mutex_lock(&S->mu);
        ss->busy = 0;
        if (rc) {
            pthread_mutex_unlock(&S->mu);
            free(ids);
            if (err.code == IB_ERR_STATE && strstr(err.msg, "but it holds")) {
                /* the stored history moved on: another server sharing the store wrote to this session.
                 * Forget the copy in memory; the next request loads what the store holds. */
                sess_evict(S, ss);
                return send_error(S, c, 409, "invalid_request_error", "session_changed", NULL,
                                  "the session was changed by another server sharing the store; retry: %s", err.msg);
            }
            return send_error(S, c, 503, "server_error", "store_error", NULL, "the tokens could not be stored: %s", err.msg);
        }
        hist_push(ss, ids, n, IB_STORE_TOK_NOTE_ON_FEED, 0);
        memcpy(ss->pending + ss->n_pending, ids, (size_t)n * sizeof(int32_t));
        ss->n_pending += n;
    } else {
        hist_push(ss, ids, n, IB_STORE_TOK_NOTE_ON_FEED, 0);
        memcpy(ss->pending + ss->n_pending, ids, (size_t)n * sizeof(int32_t));
        ss->n_pending += n;
    }
    pthread_mutex_unlock(&S->mu);
    free(ids);
    if (why && !strcmp(why, "busy"))
        return send_error(S, c, 409, "invalid_request_error", "session_busy", NULL, "the session is generating");
    if (why)
        return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", NULL,
                          "the session's context of %d tokens cannot hold %d more", ib_session_capacity(ss->s), n);
    json_t *j = sess_info(S, ss);
    json_object_set_new(j, "appended", json_integer(n));
    return send_json(S, c, 200, j, 0);
}

static enum MHD_Result handle_session_generate(server *S, struct MHD_Connection *c, sess *ss, json_t *b) {
    gen_params p;
    const char *param = NULL;
    char msg[256];
    enum MHD_Result cr;
    if (check_request(S, c, b, IB_API_SESSION_GENERATE, &cr)) return cr;
    if (parse_params(S, b, 0, 16, &p, &param, msg, sizeof msg)) return BAD(param, "%s", msg);
    int chat = 0;
    if (get_bool(b, "chat", &chat) < 0) {
        params_free(&p);
        return BAD("chat", "chat must be a boolean");
    }
    if (inflight_take(S, ss->tidx)) {
        params_free(&p);
        return send_error(S, c, 429, "rate_limit_error", "key_request_limit", NULL,
                          "this API key has its limit of %d requests in flight; retry later", S->key_requests);
    }
    pthread_mutex_lock(&S->mu);
    const char *why = NULL;
    int n = ss->n_pending, nr = 0, hist_at = 0;
    int32_t *ids = NULL, *pend = NULL, *vin = NULL;
    uint8_t *vfl = NULL;
    uint64_t draws0 = 0;
    if (!ss->resident) { /* a rebuild: the stored tokens [0, n_fed) are fed first, without notes */
        nr = ss->rec.progress.n_fed;
        if (ib_fault_get() == IB_FAULT_REBUILD_DROP_TOKEN && nr > 0) nr--; /* tests only: a broken rebuild */
    }
    if (ss->busy)
        why = "busy";
    else if (n < 1)
        why = "empty";
    else if (!(ids = malloc(((size_t)nr + n) * sizeof *ids)))
        why = "nomem";
    else if ((long)sess_pos(ss) + n + (p.max_tokens > 0 ? p.max_tokens - 1 : 0) > ib_session_capacity(ss->s))
        why = "full";
    else {
        pend = ids + nr;
        if (!ss->resident) {
            const ib_store_session *r = &ss->rec;
            for (int i = 0, k = 0; i < r->progress.n_fed && k < nr; i++)
                if (!(nr < r->progress.n_fed && i == r->progress.n_fed / 2)) ids[k++] = r->tokens[i];
            ib_session_reset(ss->s);
            ib_store_replay_notes(ss->s, r);
        }
        memcpy(pend, ss->pending, (size_t)n * sizeof *ids);
        ss->n_pending = 0;
        ss->busy = 1;
        ss->refs++; /* the generation's */
        /* the verification record's inputs: the history before the request, its flags, the draw
         * counter; the prompt is the pending tokens (the mirror's tail) */
        hist_at = ss->n_hist;
        draws0 = ss->resident ? ss->s->sample_step : ss->rec.progress.draws;
        if (!ss->hist_broken && ss->n_hist >= n && (vin = malloc((size_t)ss->n_hist * sizeof *vin + 1)) &&
            (vfl = malloc((size_t)ss->n_hist + 1))) {
            memcpy(vin, ss->htok, (size_t)ss->n_hist * sizeof *vin);
            memcpy(vfl, ss->hfl, (size_t)ss->n_hist);
        }
    }
    int pos = sess_pos(ss);
    pthread_mutex_unlock(&S->mu);
    if (why) {
        inflight_put(S, ss->tidx);
        free(ids);
        params_free(&p);
        if (!strcmp(why, "busy"))
            return send_error(S, c, 409, "invalid_request_error", "session_busy", NULL, "the session is generating");
        if (!strcmp(why, "empty"))
            return BAD(NULL, "the session has no pending tokens: append text or tokens first");
        if (!strcmp(why, "full"))
            return send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                              "%d held + %d pending + max_tokens %d exceed the session's context of %d", pos, n,
                              p.max_tokens, ib_session_capacity(ss->s));
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
    }
    gen *g = gen_new(S, 0, &p);
    if (!g) {
        pthread_mutex_lock(&S->mu);
        if (!ss->resident) ib_session_reset(ss->s);
        memcpy(ss->pending, pend, (size_t)n * sizeof *ids);
        ss->n_pending = n;
        ss->busy = 0;
        ss->refs--;
        pthread_mutex_unlock(&S->mu);
        inflight_put(S, ss->tidx);
        free(ids);
        free(vin);
        free(vfl);
        params_free(&p);
        return send_error(S, c, 503, "server_error", "out_of_memory", NULL, "out of memory; retry later");
    }
    snprintf(g->id, sizeof g->id, "%s", ss->id);
    g->tidx = ss->tidx;
    g->inflight = 1;
    g->ss = ss;
    g->session_gen = 1;
    g->n_prompt = n;
    g->n_replay = nr;
    g->commit = g->stored_gen = S->store != NULL;
    g->hist_at = hist_at;
    g->draws0 = draws0;
    g->vkvd = ss->kvd;
    snprintf(g->vkv, sizeof g->vkv, "%s", ss->policy);
    if (vin && vfl) {
        g->vin = vin;
        g->vfl = vfl;
        g->n_vhist = hist_at - n;
        g->n_vprompt = n;
        vin = NULL;
        vfl = NULL;
    }
    if (chat)
        g->n_stop_ids = ib_chat_stop_ids(S->m, g->stop_ids, MAX_STOP_IDS);
    else if (S->info->eos_id >= 0)
        g->stop_ids[g->n_stop_ids++] = S->info->eos_id;
    /* keep the prompt at the front of pending (unused while busy) so an unfed tail can be restored */
    pthread_mutex_lock(&S->mu);
    memcpy(ss->pending, pend, (size_t)n * sizeof *ids);
    ss->n_pending = 0;
    pthread_mutex_unlock(&S->mu);
    enum MHD_Result r = run_gen(S, c, g, ss->s, ids, nr + n, &p);
    free(ids);
    free(vin); /* (NULL unless half allocated) */
    free(vfl);
    params_free(&p);
    return r;
}

/* The body of a DELETE's answer for session id. */
static json_t *deleted_json(const char *id) {
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(id));
    json_object_set_new(j, "object", json_string("session"));
    json_object_set_new(j, "deleted", json_true());
    return j;
}

static enum MHD_Result handle_session_delete(server *S, struct MHD_Connection *c, sess *ss) {
    ib_error err;
    ib_status rc = S->store ? ib_store_delete(S->store, ss->id, &err) : IB_OK;
    if (rc && rc != IB_ERR_NOT_FOUND)
        return send_error(S, c, 503, "server_error", "store_error", NULL, "the session could not be deleted: %s", err.msg);
    pthread_mutex_lock(&S->mu);
    ss->deleted = 1;
    pthread_mutex_unlock(&S->mu);
    sess_evict(S, ss);
    return send_json(S, c, 200, deleted_json(ss->id), 0);
}

/* Load session id of tenant from the store into the table, not resident (its KV is rebuilt by its next
 * generation). Returns a new reference, or NULL with *r set to the answer: 404 when the store has no
 * such session of this tenant (another key's session is not found either), 409 session_model_mismatch
 * when another model made it, 429 when the server's or the key's sessions or memory are full, 503 when
 * the store fails. Two requests loading one id at once end with one entry (the later one's is freed). */
static sess *sess_load(server *S, struct MHD_Connection *c, const char *id, const char *tenant, int tidx,
                       enum MHD_Result *r) {
    ib_store_session rec;
    ib_error err;
    ib_status rc = ib_store_load(S->store, id, &rec, &err);
    char owner[65];
    ib_store_owner_hash(tenant, owner);
    if (rc == IB_ERR_NOT_FOUND || (!rc && strcmp(rec.owner, owner))) {
        ib_store_session_free(&rec);
        *r = send_error(S, c, 404, "invalid_request_error", "session_not_found", NULL, "no such session");
        return NULL;
    }
    if (rc) {
        ib_store_session_free(&rec);
        *r = send_error(S, c, 503, "server_error", "store_error", NULL, "the session could not be loaded: %s", err.msg);
        return NULL;
    }
    if (strcmp(rec.model_id, S->ident)) {
        *r = send_error(S, c, 409, "invalid_request_error", "session_model_mismatch", NULL,
                        "session %s was made by model %s; this server runs %s (another model, or changed weights or "
                        "tokenizer), so it cannot continue it", id, rec.model_id, S->ident);
        ib_store_session_free(&rec);
        return NULL;
    }
    int window = rec.kv_window, sink = rec.kv_sink;
    long long slots = window > 0 ? (long long)sink + window + rec.kv_chunk : rec.max_context;
    size_t bytes = (size_t)slots * ib_kv_bytes_per_token(S->m, rec.kv_dtype);
    pthread_mutex_lock(&S->mu);
    int full = S->n_sessions >= S->o.max_sessions, key_full = S->key_sessions && S->tu[tidx].sessions >= S->key_sessions;
    pthread_mutex_unlock(&S->mu);
    int mrc = full || key_full ? 0 : mem_reserve(S, tidx, bytes, 0);
    if (full || key_full || mrc) {
        ib_store_session_free(&rec);
        *r = send_error(S, c, 429, "rate_limit_error", full ? "too_many_sessions" : key_full ? "key_session_limit"
                                                                                : "memory_budget_exceeded",
                        NULL, "session %s is stored but cannot be loaded now (sessions or KV memory in use); close one "
                              "or retry later", id);
        return NULL;
    }
    sess *ss = calloc(1, sizeof *ss);
    ib_session_opts so = {.max_context = rec.max_context, .sampling = rec.progress.sampling, .kv_dtype = rec.kv_dtype,
                          .backend = S->o.backend, .kv_sink = sink, .kv_window = window, .kv_chunk = rec.kv_chunk};
    int n_pend = rec.n_tokens - rec.progress.n_fed;
    long long cap = window > 0 || rec.max_context < S->o.max_prompt_tokens ? S->o.max_prompt_tokens : rec.max_context;
    if (cap < n_pend) cap = n_pend;
    if (!ss || !(ss->tenant = strdup(tenant)) || !(ss->pending = malloc(((size_t)cap + 1) * sizeof(int32_t))) ||
        (rc = ib_session_create(S->m, &so, &ss->s, &err))) {
        if (ss) {
            free(ss->tenant);
            free(ss->pending);
        }
        free(ss);
        ib_store_session_free(&rec);
        mem_release(S, tidx, bytes);
        *r = send_error(S, c, rc == IB_ERR_NOMEM || !rc ? 503 : 500, "server_error", rc == IB_ERR_NOMEM || !rc ? "out_of_memory" : NULL, NULL,
                        "session %s could not be loaded: %s", id, rc && rc != IB_ERR_NOMEM ? err.msg : "out of memory");
        return NULL;
    }
    snprintf(ss->id, sizeof ss->id, "%s", id);
    if (window > 0 && sink > 0) snprintf(ss->policy, sizeof ss->policy, "sink:%d,window:%d", sink, window);
    else if (window > 0) snprintf(ss->policy, sizeof ss->policy, "window:%d", window);
    else snprintf(ss->policy, sizeof ss->policy, "full");
    ss->cap_pending = (int)cap + 1;
    if (n_pend > 0) memcpy(ss->pending, rec.tokens + rec.progress.n_fed, (size_t)n_pend * sizeof(int32_t));
    ss->n_pending = n_pend;
    ss->kvd = rec.kv_dtype;
    if (rec.n_tokens > 0 && hist_push(ss, rec.tokens, rec.n_tokens, 0, 0) == 0)
        memcpy(ss->hfl, rec.flags, (size_t)rec.n_tokens);
    ss->n_hist = rec.n_tokens; /* (the next append's place even when the mirror could not be made) */
    ss->kv_bytes = bytes;
    ss->tidx = tidx;
    ss->last_used = now_s();
    ss->refs = 2; /* the table's, the caller's */
    ss->rec = rec;
    pthread_mutex_lock(&S->mu);
    sess *dup = NULL;
    for (int i = 0; i < S->n_sessions && !dup; i++)
        if (!strcmp(S->sessions[i]->id, id) && !strcmp(S->sessions[i]->tenant, tenant) && !S->sessions[i]->closed)
            dup = S->sessions[i];
    int ok = !dup && S->n_sessions < S->o.max_sessions && (!S->key_sessions || S->tu[tidx].sessions < S->key_sessions);
    if (dup) dup->refs++;
    if (ok) {
        S->sessions[S->n_sessions++] = ss;
        S->tu[tidx].sessions++;
    }
    pthread_mutex_unlock(&S->mu);
    if (!ok) {
        sess_free(S, ss);
        if (dup) return dup;
        *r = send_error(S, c, 429, "rate_limit_error", "too_many_sessions", NULL, "session limit reached");
        return NULL;
    }
    return ss;
}

/* GET /v1/sessions: the key's sessions — from the store when there is one (each with resident: whether
 * its KV is in memory now), else those in memory. */
static enum MHD_Result handle_session_list(server *S, struct MHD_Connection *c, const char *tenant) {
    json_t *data = json_array();
    if (S->store) {
        char owner[65], **ids = NULL;
        int n = 0;
        ib_error err;
        ib_store_owner_hash(tenant, owner);
        if (ib_store_list_owner(S->store, owner, &ids, &n, &err)) {
            json_decref(data);
            return send_error(S, c, 503, "server_error", "store_error", NULL, "the sessions could not be listed: %s", err.msg);
        }
        pthread_mutex_lock(&S->mu);
        for (int i = 0; i < n; i++) {
            int res = 0;
            for (int k = 0; k < S->n_sessions; k++)
                if (!strcmp(S->sessions[k]->id, ids[i]) && !strcmp(S->sessions[k]->tenant, tenant))
                    res = S->sessions[k]->resident;
            json_array_append_new(data, json_pack("{s:s, s:s, s:b}", "id", ids[i], "object", "session", "resident", res));
        }
        pthread_mutex_unlock(&S->mu);
        ib_store_ids_free(ids, n);
    } else {
        pthread_mutex_lock(&S->mu);
        for (int k = 0; k < S->n_sessions; k++)
            if (!strcmp(S->sessions[k]->tenant, tenant))
                json_array_append_new(data, json_pack("{s:s, s:s, s:b}", "id", S->sessions[k]->id, "object", "session",
                                                      "resident", 1));
        pthread_mutex_unlock(&S->mu);
    }
    return send_json(S, c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data), 0);
}

/* POST /v1/verify: re-run a verification record (the body: a response carrying one, or the record)
 * as a job of this server's scheduler — alone in its own session, among whatever else runs, which
 * cannot change its numbers — and answer {"match", "first_diverging_step", ...} (verify.h). 400 for
 * a malformed record; 409 for a record of another model or activation mode (isobatch verify -m DIR
 * re-runs any). */
static enum MHD_Result handle_verify(server *S, struct MHD_Connection *c, json_t *b, int tidx) {
    ib_vrec rec;
    char msg[256];
    if (ib_verify_parse(b, S->info->vocab_size, S->info->max_context, &rec, msg, sizeof msg))
        return BAD("verification", "%s", msg);
    ib_act act = ib_engine_act(S->e);
    if (strcmp(rec.model, S->ident) || rec.act != act) {
        enum MHD_Result r = send_error(S, c, 409, "invalid_request_error", "model_mismatch", "verification",
                                       "the record was made by model %s with act %s; this server runs %s with act %s "
                                       "(isobatch verify -m DIR re-runs a record of any model)", rec.model,
                                       rec.act == IB_ACT_F32 ? "f32" : "q8", S->ident, act == IB_ACT_F32 ? "f32" : "q8");
        ib_verify_free(&rec);
        return r;
    }
    size_t bytes = (size_t)(rec.kv_window > 0 ? rec.kv_sink + rec.kv_window + rec.kv_chunk : rec.max_context) *
                   ib_kv_bytes_per_token(S->m, rec.kv_dtype);
    if (inflight_take(S, tidx)) {
        ib_verify_free(&rec);
        return send_error(S, c, 429, "rate_limit_error", "key_request_limit", NULL,
                          "this API key has its limit of %d requests in flight; retry later", S->key_requests);
    }
    int mrc = mem_reserve(S, tidx, bytes, 1);
    if (mrc) {
        inflight_put(S, tidx);
        ib_verify_free(&rec);
        return send_error(S, c, mrc == -2 ? 400 : 429, mrc == -2 ? "invalid_request_error" : "rate_limit_error",
                          mrc == -2 ? "context_length_exceeded" : "rate_limit_exceeded", NULL,
                          "the re-run needs %zu KV bytes; the memory budget %s", bytes,
                          mrc == -2 ? "is smaller" : "is in use, retry later");
    }
    ib_vrun run;
    ib_error err;
    enum MHD_Result r;
    if (ib_verify_submit(S->sched, S->m, S->o.backend, &S->jv, &rec, &run, &err)) {
        r = err.code == IB_ERR_STATE ? send_error(S, c, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                                                  "the server is at capacity; retry later")
                                     : send_error(S, c, 500, "server_error", NULL, NULL, "%s", err.msg);
    } else {
        ib_verify_wait(&run);
        if (strcmp(run.finish, "length") && strcmp(run.finish, "stop"))
            r = send_error(S, c, 503, "server_error", "verify_incomplete", NULL, "the re-run ended early (%s); retry",
                           run.finish);
        else
            r = send_json(S, c, 200, ib_verify_compare(&rec, &run), 0);
    }
    ib_verify_run_free(&run);
    mem_release(S, tidx, bytes);
    inflight_put(S, tidx);
    ib_verify_free(&rec);
    return r;
}

/* ------------------------------------------------------------------ health, models, metrics */

static enum MHD_Result handle_metrics(server *S, struct MHD_Connection *c) {
    ib_sched_stats st;
    ib_sched_get_stats(S->sched, &st);
    pthread_mutex_lock(&S->mu);
    int n_sessions = S->n_sessions;
    long long n_expired = S->n_expired;
    size_t kv = S->kv_used;
    long long cls[6];
    memcpy(cls, S->http_by_class, sizeof cls);
    long long n429 = S->n_429;
    int waiters = S->mem_waiters;
    pthread_mutex_unlock(&S->mu);
    pthread_mutex_lock(&S->watch_mu);
    long long n_cut = S->n_req_timeouts;
    int n_conn = 0;
    for (cwatch *w = S->watch; w; w = w->next) n_conn++;
    pthread_mutex_unlock(&S->watch_mu);
    enum { CAP = 24576 };
    char *buf = malloc(CAP);
    if (!buf) return MHD_NO;
    int k = 0;
#define P(...) k += snprintf(buf + k, (size_t)(CAP - k), __VA_ARGS__)
    P("# HELP isobatch_sessions Stateful sessions held.\n# TYPE isobatch_sessions gauge\nisobatch_sessions %d\n", n_sessions);
    P("# HELP isobatch_jobs_active Generations being stepped.\n# TYPE isobatch_jobs_active gauge\nisobatch_jobs_active %d\n", st.active);
    P("# HELP isobatch_queue_length Generations waiting for a batch slot, and requests waiting for KV memory.\n"
      "# TYPE isobatch_queue_length gauge\nisobatch_queue_length{queue=\"batch\"} %d\nisobatch_queue_length{queue=\"memory\"} %d\n",
      st.queued, waiters);
    P("# HELP isobatch_batch_size Items in the last step.\n# TYPE isobatch_batch_size gauge\nisobatch_batch_size %d\n", st.last_batch);
    P("# HELP isobatch_tokens_generated_total Tokens sampled.\n# TYPE isobatch_tokens_generated_total counter\n"
      "isobatch_tokens_generated_total %lld\n", st.tokens_generated);
    P("# HELP isobatch_tokens_prefilled_total Prompt tokens fed.\n# TYPE isobatch_tokens_prefilled_total counter\n"
      "isobatch_tokens_prefilled_total %lld\n", st.tokens_prefilled);
    ib_latency_format(&S->lat, now_s(), buf, &k, CAP);
    P("# HELP isobatch_kv_bytes KV cache bytes reserved by live sessions.\n# TYPE isobatch_kv_bytes gauge\nisobatch_kv_bytes %zu\n", kv);
    P("# HELP isobatch_kv_budget_bytes The memory budget (0 = none).\n# TYPE isobatch_kv_budget_bytes gauge\n"
      "isobatch_kv_budget_bytes %zu\n", S->o.memory_budget);
    P("# HELP isobatch_step_seconds Time of one batched step.\n# TYPE isobatch_step_seconds histogram\n");
    long long cum = 0;
    for (int i = 0; i < 11; i++) {
        cum += st.step_hist[i];
        P("isobatch_step_seconds_bucket{le=\"%g\"} %lld\n", ib_sched_hist_ms[i] / 1000.0, cum);
    }
    cum += st.step_hist[11];
    P("isobatch_step_seconds_bucket{le=\"+Inf\"} %lld\nisobatch_step_seconds_sum %.6f\nisobatch_step_seconds_count %lld\n", cum,
      st.step_seconds, st.steps);
    P("# HELP isobatch_http_responses_total Responses by status class.\n# TYPE isobatch_http_responses_total counter\n");
    for (int i = 2; i <= 5; i++) P("isobatch_http_responses_total{class=\"%dxx\"} %lld\n", i, cls[i]);
    P("# HELP isobatch_rejected_total 429 responses.\n# TYPE isobatch_rejected_total counter\nisobatch_rejected_total %lld\n", n429);
    P("# HELP isobatch_sessions_expired_total Sessions closed for being idle.\n# TYPE isobatch_sessions_expired_total counter\n"
      "isobatch_sessions_expired_total %lld\n", n_expired);
    P("# HELP isobatch_connections Open HTTP connections.\n# TYPE isobatch_connections gauge\nisobatch_connections %d\n", n_conn);
    P("# HELP isobatch_request_timeouts_total Connections closed for not sending a whole request in time.\n"
      "# TYPE isobatch_request_timeouts_total counter\nisobatch_request_timeouts_total %lld\n", n_cut);
#undef P
    enum MHD_Result r = send_text(S, c, 200, "text/plain; version=0.0.4", buf, (size_t)k, 0);
    free(buf);
    return r;
}

static enum MHD_Result handle_models(server *S, struct MHD_Connection *c) {
    json_t *m = ib_api_model_json(S->model_id, S->info);
    json_t *d = json_array();
    json_array_append_new(d, m);
    json_t *j = json_object();
    json_object_set_new(j, "object", json_string("list"));
    json_object_set_new(j, "data", d);
    return send_json(S, c, 200, j, 0);
}

/* Close the sessions idle (no request naming them, no generation) for session_idle_timeout_s, as a
 * DELETE would; a generation running on one keeps it. Called from the main loop. */
static void expire_sessions(server *S) {
    if (S->o.session_idle_timeout_s <= 0) return;
    for (;;) {
        sess *victim = NULL;
        double t = now_s();
        pthread_mutex_lock(&S->mu);
        for (int i = 0; i < S->n_sessions && !victim; i++) {
            sess *ss = S->sessions[i];
            if (!ss->busy && t - ss->last_used > S->o.session_idle_timeout_s) {
                victim = ss;
                S->sessions[i] = S->sessions[--S->n_sessions];
                S->tu[ss->tidx].sessions--;
                ss->closed = 1;
                S->n_expired++;
            }
        }
        pthread_mutex_unlock(&S->mu);
        if (!victim) return;
        sess_unref(S, victim); /* the table's reference (with a store, its record stays: it can come back) */
    }
}

static void watch_sweep(server *S);

/* The graceful stop: close the listening socket (new connections are refused), answer new requests
 * on open connections 503, and let the generations in flight finish for up to drain_timeout_s;
 * the caller then cancels what is left (streams get their final chunk and [DONE], waiting
 * non-streaming clients a 503). */
static void drain(server *S) {
    S->draining = 1;
    MHD_socket ls = MHD_quiesce_daemon(S->d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    double end = now_s() + S->o.drain_timeout_s;
    for (;;) {
        ib_sched_stats st;
        ib_sched_get_stats(S->sched, &st);
        pthread_mutex_lock(&S->mu);
        int waiting = S->mem_waiters;
        pthread_mutex_unlock(&S->mu);
        if ((st.active == 0 && st.queued == 0 && waiting == 0) || now_s() >= end) break;
        usleep(50000);
        watch_sweep(S);
    }
}

/* ------------------------------------------------------------------ the whole-request deadline */

/* MHD's connection notices: register a connection when it opens (waiting for its first request),
 * forget it when it closes (MHD closes the socket only after this returns). */
static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    server *S = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cwatch *w = calloc(1, sizeof *w);
        if (!w || !ci) {
            free(w);
            *socket_context = NULL;
            return;
        }
        w->fd = ci->connect_fd;
        w->t_wait = now_s();
        w->receiving = 1;
        pthread_mutex_lock(&S->watch_mu);
        w->next = S->watch;
        if (S->watch) S->watch->prev = w;
        S->watch = w;
        pthread_mutex_unlock(&S->watch_mu);
        *socket_context = w;
    } else if (*socket_context) {
        cwatch *w = *socket_context;
        pthread_mutex_lock(&S->watch_mu);
        if (w->prev) w->prev->next = w->next;
        else S->watch = w->next;
        if (w->next) w->next->prev = w->prev;
        pthread_mutex_unlock(&S->watch_mu);
        free(w);
        *socket_context = NULL;
    }
}

/* The request on connection c has arrived whole: its deadline stops counting. */
static void watch_arrived(server *S, struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (!ci || !ci->socket_context) return;
    pthread_mutex_lock(&S->watch_mu);
    ((cwatch *)ci->socket_context)->receiving = 0;
    pthread_mutex_unlock(&S->watch_mu);
}

/* Shut down every connection that has waited longer than request_timeout_s for a whole request
 * (headers and body): a client trickling bytes keeps MHD's idle timeout from ever firing, so this
 * deadline is what frees its connection and thread. Called from the main loop. */
static void watch_sweep(server *S) {
    double t = now_s();
    pthread_mutex_lock(&S->watch_mu);
    for (cwatch *w = S->watch; w; w = w->next)
        if (w->receiving && !w->cut && t - w->t_wait > S->o.request_timeout_s) {
            shutdown(w->fd, SHUT_RDWR);
            w->cut = 1;
            S->n_req_timeouts++;
        }
    pthread_mutex_unlock(&S->watch_mu);
}

/* ------------------------------------------------------------------ dispatch */

typedef struct conn {
    char *body;
    size_t len, cap;
    int too_big;
} conn;

/* The Bearer key of the request ("" when none): NULL when keys are configured and it is not one.
 * *tidx gets the key's index in server.tu (0 when no keys are configured). */
static const char *tenant_of(server *S, struct MHD_Connection *c, int *tidx) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *key = "";
    if (h && !strncasecmp(h, "Bearer ", 7)) key = h + 7;
    *tidx = 0;
    if (S->o.n_api_keys == 0) return key;
    const char *found = NULL;
    for (int i = 0; i < S->o.n_api_keys; i++) { /* every key compared in full: no early exit */
        const char *k = S->o.api_keys[i];
        size_t a = strlen(k), b = strlen(key);
        unsigned diff = (unsigned)(a ^ b);
        for (size_t j = 0; j < a; j++) diff |= (unsigned char)k[j] ^ (unsigned char)(j < b ? key[j] : 0);
        if (!diff && !found) found = key, *tidx = i;
    }
    return found;
}

/* The endpoints added beside the core ones (dispatch asks first): OPTIONS preflight, /health,
 * GET /v1/models/{id}, POST /tokenize and /detokenize. Returns 1 and sets *r when it answered; the
 * authenticated ones need tenant (non-NULL) and a parsed body. */
static int dispatch_extra(server *S, struct MHD_Connection *c, const char *url, const char *method, conn *cn,
                          enum MHD_Result *r) {
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS")) {
        const char *allow = ib_http_allowed(url);
        *r = allow ? send_text(S, c, 204, "text/plain", "", 0, 0)
                   : send_error(S, c, 404, "invalid_request_error", "not_found", NULL, "unknown endpoint %s", url);
        return 1;
    }
    if (!strcmp(url, "/health")) {
        *r = get ? send_text(S, c, 200, "application/json", "{\"status\":\"ok\"}", 15, 0)
                 : send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use GET");
        return 1;
    }
    int models = !strncmp(url, "/v1/models/", 11), tok = !strcmp(url, "/tokenize"), detok = !strcmp(url, "/detokenize");
    if (!models && !tok && !detok) return 0;
    int tidx = 0;
    if (!tenant_of(S, c, &tidx)) {
        *r = send_error(S, c, 401, "invalid_request_error", "invalid_api_key", NULL,
                        "Incorrect or missing API key: send Authorization: Bearer <key>");
        return 1;
    }
    if (models) {
        if (!get) *r = send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use GET");
        else if (strcmp(url + 11, S->model_id))
            *r = send_error(S, c, 404, "invalid_request_error", "model_not_found", "model",
                            "The model '%s' does not exist (this server serves '%s')", url + 11, S->model_id);
        else
            *r = send_json(S, c, 200, ib_api_model_json(S->model_id, S->info), 0);
        return 1;
    }
    if (!post) {
        *r = send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use POST");
        return 1;
    }
    if (cn->too_big) {
        *r = send_error(S, c, 413, "invalid_request_error", "request_too_large", NULL,
                        "the request body exceeds this server's limit of %zu bytes", S->o.max_body);
        return 1;
    }
    json_error_t je;
    json_t *b = json_loadb(cn->body ? cn->body : "", cn->len, 0, &je);
    if (!json_is_object(b)) {
        *r = send_error(S, c, 400, "invalid_request_error", "invalid_json", NULL,
                        b ? "the body must be a JSON object" : "the body is not valid JSON: %s", je.text);
        json_decref(b);
        return 1;
    }
    const char *param = NULL;
    char msg[256];
    json_t *out = NULL;
    if (tok && ib_api_normalize_messages(b, &param, msg, sizeof msg) == 0 &&
        ib_api_tokenize(S->m, b, S->o.max_prompt_tokens, &out, &param, msg, sizeof msg) == 0)
        *r = send_json(S, c, 200, out, 0);
    else if (detok && ib_api_detokenize(S->m, b, &out, &param, msg, sizeof msg) == 0)
        *r = send_json(S, c, 200, out, 0);
    else
        *r = BAD(param, "%s", msg);
    json_decref(b);
    return 1;
}

static enum MHD_Result dispatch(server *S, struct MHD_Connection *c, const char *url, const char *method, conn *cn) {
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    enum MHD_Result xr;
    if (dispatch_extra(S, c, url, method, cn, &xr)) return xr;
    if (!strcmp(url, "/healthz")) {
        if (!get) return send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use GET");
        return send_text(S, c, 200, "application/json", "{\"status\":\"ok\"}", 15, 0);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use GET");
        return handle_metrics(S, c);
    }
    int tidx = 0;
    if (S->draining && strcmp(url, "/metrics"))
        return send_error(S, c, 503, "server_error", "server_shutting_down", NULL, "the server is shutting down");
    const char *tenant = tenant_of(S, c, &tidx);
    if (!tenant)
        return send_error(S, c, 401, "invalid_request_error", "invalid_api_key", NULL,
                          "Incorrect or missing API key: send Authorization: Bearer <key>");
    if (cn->too_big)
        return send_error(S, c, 413, "invalid_request_error", "request_too_large", NULL,
                          "the request body exceeds this server's limit of %zu bytes", S->o.max_body);
    if (!strcmp(url, "/v1/models")) {
        if (!get) return send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use GET");
        return handle_models(S, c);
    }
    json_t *b = NULL;
    if (post) {
        json_error_t je;
        b = cn->len ? json_loadb(cn->body, cn->len, 0, &je) : NULL;
        if (!b && (cn->len || strcmp(url, "/v1/sessions")))
            return send_error(S, c, 400, "invalid_request_error", "invalid_json", NULL,
                              "the body is not valid JSON: %s (line %d, column %d)", cn->len ? je.text : "empty body",
                              cn->len ? je.line : 0, cn->len ? je.column : 0);
        if (b && !json_is_object(b)) {
            json_decref(b);
            return BAD(NULL, "the body must be a JSON object");
        }
    }
    enum MHD_Result r;
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions")) {
        r = post ? handle_generate(S, c, b, url[4] == 'c' && url[5] == 'h', tidx)
                 : send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use POST");
    } else if (!strcmp(url, "/v1/verify")) {
        r = post ? handle_verify(S, c, b, tidx)
                 : send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use POST");
    } else if (!strcmp(url, "/v1/sessions")) {
        r = post ? handle_session_create(S, c, b, tenant, tidx)
            : get ? handle_session_list(S, c, tenant)
                 : send_error(S, c, 405, "invalid_request_error", "method_not_allowed", NULL, "use GET or POST");
    } else if (!strncmp(url, "/v1/sessions/", 13)) {
        char id[64];
        const char *rest = url + 13, *slash = strchr(rest, '/');
        size_t il = slash ? (size_t)(slash - rest) : strlen(rest);
        const char *action = slash ? slash + 1 : "";
        sess *ss = NULL;
        if (il < sizeof id) {
            memcpy(id, rest, il);
            id[il] = 0;
            ss = sess_get(S, id, tenant);
        }
        int answered = 0;
        if (!ss && S->store && il < sizeof id && !ib_store_id_valid(id)) { /* stored, not in memory: load it */
            ss = sess_load(S, c, id, tenant, tidx, &r);
            answered = !ss;
        }
        if (answered)
            ;
        else if (!ss)
            r = send_error(S, c, 404, "invalid_request_error", "session_not_found", NULL, "no such session");
        else if (!*action && get)
            r = send_json(S, c, 200, sess_info(S, ss), 0);
        else if (!*action && del)
            r = handle_session_delete(S, c, ss);
        else if (!strcmp(action, "append") && post)
            r = handle_session_append(S, c, ss, b);
        else if (!strcmp(action, "generate") && post)
            r = handle_session_generate(S, c, ss, b);
        else
            r = send_error(S, c, 404, "invalid_request_error", "not_found", NULL, "unknown session action");
        if (ss) sess_unref(S, ss);
    } else
        r = send_error(S, c, 404, "invalid_request_error", "not_found", NULL, "unknown endpoint %s %s", method, url);
    json_decref(b);
    return r;
}

/* Write a complete 413 response (the error body of send_error, Connection: close) straight to
 * connection c's socket and stop sending; the caller then closes the connection (returns MHD_NO).
 * For the one case MHD cannot answer itself: a body found too large while it is being received. */
static void send_raw_413(server *S, struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    char body[256], msg[512];
    int bn = snprintf(body, sizeof body,
                      "{\"error\":{\"message\":\"the request body exceeds this server's limit of %zu bytes\","
                      "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"request_too_large\"}}",
                      S->o.max_body);
    int n = snprintf(msg, sizeof msg,
                     "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     "Connection: close\r\n\r\n%s", bn, body);
    size_t off = 0;
    for (int tries = 0; off < (size_t)n && tries < 100; tries++) {
        ssize_t w = send(ci->connect_fd, msg + off, (size_t)n - off, MSG_NOSIGNAL);
        if (w > 0) off += (size_t)w;
        else if (w < 0 && errno != EAGAIN && errno != EINTR) break;
        else poll(&(struct pollfd){.fd = ci->connect_fd, .events = POLLOUT}, 1, 10);
    }
    shutdown(ci->connect_fd, SHUT_WR);
    pthread_mutex_lock(&S->mu);
    S->http_by_class[4]++;
    pthread_mutex_unlock(&S->mu);
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    server *S = cls;
    conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        pthread_mutex_lock(&S->mu);
        S->n_answering++;
        pthread_mutex_unlock(&S->mu);
        ib_http_request_begin(c, method, url);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > S->o.max_body) cn->too_big = 1;
        if (cn->too_big)
            return send_error(S, c, 413, "invalid_request_error", "request_too_large", NULL,
                              "the request body exceeds this server's limit of %zu bytes", S->o.max_body);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_big) {
            if (cn->len + *upload_size > S->o.max_body) {
                /* a chunked body has no Content-Length to refuse it by up front, and MHD takes no
                 * response in the middle of a body: answer 413 on the socket and close, without
                 * reading the rest */
                cn->too_big = 1;
                free(cn->body);
                cn->body = NULL;
                cn->len = 0;
                *upload_size = 0;
                send_raw_413(S, c);
                return MHD_NO;
            } else {
                if (cn->len + *upload_size + 1 > cn->cap) {
                    size_t nc = (cn->len + *upload_size + 1) * 2;
                    if (nc > S->o.max_body + 1) nc = S->o.max_body + 1;
                    char *nb = realloc(cn->body, nc);
                    if (!nb) return MHD_NO;
                    cn->body = nb;
                    cn->cap = nc;
                }
                memcpy(cn->body + cn->len, upload, *upload_size);
                cn->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cn->too_big) return MHD_YES; /* the 413 is queued already */
    watch_arrived(S, c);
    return dispatch(S, c, url, method, cn);
}

static void completed_cb(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    server *S = cls;
    /* the response is done: a kept-alive connection starts waiting for its next request */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context) {
        pthread_mutex_lock(&S->watch_mu);
        cwatch *w = ci->socket_context;
        w->receiving = 1;
        w->t_wait = now_s();
        pthread_mutex_unlock(&S->watch_mu);
    }
    conn *cn = *con_cls;
    if (cn) {
        free(cn->body);
        free(cn);
        ib_http_request_end();
        pthread_mutex_lock(&S->mu);
        S->n_answering--;
        pthread_mutex_unlock(&S->mu);
    }
    *con_cls = NULL;
}

/* ------------------------------------------------------------------ run */

/* Bytes of memory this process may use: the physical memory, or the cgroup (v2 memory.max, v1
 * memory.limit_in_bytes) limit when that is lower. 0 when unknown. */
static size_t machine_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    size_t phys = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
    static const char *const limits[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(limits[i], "r");
        if (!f) continue;
        unsigned long long v = 0;
        int got = fscanf(f, "%llu", &v) == 1;
        fclose(f);
        if (got && v > 0 && (!phys || v < phys)) phys = (size_t)v;
    }
    return phys;
}

/* The KV memory budget when none is given: half of the machine's memory (machine_memory) less the
 * weights, so that KV caches, weights and the rest of the process fit; at least 64 MiB. */
static size_t default_memory_budget(const ib_model_info *mi) {
    size_t mem = machine_memory(), floor = (size_t)64 << 20;
    if (!mem) return (size_t)4 << 30;
    size_t half = mem / 2, w = mi->weight_bytes;
    return half > w + floor ? half - w : floor;
}

ib_status ib_server_run(const ib_server_opts *o, volatile sig_atomic_t *stop, void *logp, ib_error *err) {
    FILE *log = logp;
    server *S = calloc(1, sizeof *S);
    if (!S) return ib_fail(err, IB_ERR_NOMEM, "serve: out of memory");
    ib_status rc = IB_OK;
    int lat_init = 0;
    S->o = *o;
    S->urandom = -1;
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->mem_cv, NULL);
    pthread_mutex_init(&S->watch_mu, NULL);
    if (!o->model_dir) {
        rc = ib_fail(err, IB_ERR_INVALID_ARG, "serve: no model directory");
        goto done;
    }
    if ((S->urandom = open("/dev/urandom", O_RDONLY | O_CLOEXEC)) < 0) {
        rc = ib_fail(err, IB_ERR_IO, "serve: /dev/urandom: %s", strerror(errno));
        goto done;
    }
    S->log = log;
    if ((rc = ib_model_load(o->model_dir, NULL, &S->m, err))) goto done;
    S->info = ib_model_get_info(S->m);
    /* the model's identity (a SHA-256 of its files): stored with each session, so that a session is
     * continued only by the model that made it */
    if ((rc = ib_model_identity(o->model_dir, S->ident, err))) goto done;
    if (o->store_uri && (rc = ib_store_open(o->store_uri, &S->store, err))) goto done;
    if (ib_json_vocab_init(&S->jv, S->m)) {
        rc = ib_fail(err, IB_ERR_NOMEM, "serve: out of memory");
        goto done;
    }
    if (!S->o.memory_budget) S->o.memory_budget = default_memory_budget(S->info);
    /* per-key quotas: given, or with several keys an equal share of each server limit, so that no key
     * can hold what another needs; one key (or none) has the server's limits */
    S->n_tenants = o->n_api_keys > 0 ? o->n_api_keys : 1;
    if (!(S->tu = calloc((size_t)S->n_tenants, sizeof *S->tu))) {
        rc = ib_fail(err, IB_ERR_NOMEM, "serve: out of memory");
        goto done;
    }
    int nt = S->n_tenants;
    S->key_sessions = o->key_max_sessions > 0 ? o->key_max_sessions : nt > 1 ? (o->max_sessions + nt - 1) / nt : 0;
    S->key_kv = o->key_memory_budget > 0 ? o->key_memory_budget : nt > 1 ? S->o.memory_budget / (size_t)nt : 0;
    S->key_requests = o->key_max_requests > 0 ? o->key_max_requests
                      : nt > 1 ? (o->max_batch + o->max_queue + nt - 1) / nt : 0;
    if (o->model_id)
        snprintf(S->model_id, sizeof S->model_id, "%s", o->model_id);
    else {
        const char *d = o->model_dir;
        size_t n = strlen(d);
        while (n > 1 && d[n - 1] == '/') n--;
        size_t a = n;
        while (a > 0 && d[a - 1] != '/') a--;
        snprintf(S->model_id, sizeof S->model_id, "%.*s", (int)(n - a), d + a);
    }
    int step_tokens = o->max_batch + o->prefill_chunk;
    if (step_tokens < 64) step_tokens = 64;
    ib_engine_opts eo = {.threads = o->threads, .isa = o->isa, .act = o->act, .backend = o->backend,
                         .max_step_tokens = step_tokens};
    if ((rc = ib_engine_create(S->m, &eo, &S->e, err))) goto done;
    ib_sched_opts so = {.max_batch = o->max_batch, .prefill_chunk = o->prefill_chunk, .max_queue = o->max_queue > 0 ? o->max_queue : -1};
    if ((rc = ib_sched_create(S->e, &so, &S->sched, err))) goto done;
    if (!(S->sessions = calloc((size_t)(o->max_sessions > 0 ? o->max_sessions : 1), sizeof *S->sessions))) {
        rc = ib_fail(err, IB_ERR_NOMEM, "serve: out of memory");
        goto done;
    }
    struct sockaddr_storage addr;
    int v6 = 0;
    const char *host = o->host ? o->host : "127.0.0.1";
    if (ib_http_bind_addr(host, o->port, &addr, &v6)) {
        rc = ib_fail(err, IB_ERR_INVALID_ARG, "serve: --host %s: not an IPv4 or IPv6 address", host);
        goto done;
    }
    S->t_start = now_s();
    ib_latency_init(&S->lat, S->t_start);
    lat_init = 1;
    ib_http_configure(o->request_log ? log : NULL, o->cors_origin);
    S->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                                (v6 ? MHD_USE_IPv6 : 0),
                            (uint16_t)o->port, NULL,
                            NULL, access_cb, S, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)o->max_connections_per_client, MHD_OPTION_NOTIFY_CONNECTION, notify_conn, S,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
                            completed_cb, S, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512 * 1024), MHD_OPTION_END);
    if (!S->d) {
        rc = ib_fail(err, IB_ERR_IO, "serve: cannot listen on %s:%d (in use, or not allowed)", host, o->port);
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(S->d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : o->port;
    if (log) {
        char shown[80]; /* an IPv6 address goes in brackets in a URL */
        snprintf(shown, sizeof shown, v6 && host[0] != '[' ? "[%s]" : "%s", host);
        fprintf(log, "isobatch serve: model '%s' (%s), http://%s:%d, batch %d, %d threads, ISA %s, backend %s, KV budget %zu MiB%s%s\n",
                S->model_id, S->info->arch, shown, port, o->max_batch, o->threads, ib_isa_name(ib_engine_isa(S->e)),
                ib_backend_name(o->backend), S->o.memory_budget >> 20,
                o->memory_budget ? "" : " (default: half the machine's memory less the weights)",
                o->n_api_keys ? ", API key required" : "");
        fprintf(log, "isobatch serve: model identity %s; session store %s\n", S->ident,
                o->store_uri ? o->store_uri : "none (sessions live only in memory)");
        fflush(log);
    }
    if (o->port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", o->port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) || rename(tmp, o->port_file)) {
            rc = ib_fail(err, IB_ERR_IO, "serve: cannot write the port file %s", o->port_file);
            goto done;
        }
    }
    for (int tick = 0; !*stop; tick++) {
        usleep(100000);
        watch_sweep(S);
        if (tick % 10 == 0) expire_sessions(S);
    }
    if (log) {
        fprintf(log, "isobatch serve: stopping: no new connections; draining for up to %d s\n", o->drain_timeout_s);
        fflush(log);
    }
    drain(S);
done:
    if (S->d && !S->draining) MHD_quiesce_daemon(S->d);
    /* cancel work in flight so streaming connections end, then stop the daemon */
    if (S->sched) ib_sched_stop(S->sched);
    /* give the responses of the ended generations (a stream's final chunk and [DONE], a waiting
     * client's 503) up to 2 s to go out before the daemon closes every connection: a response is
     * out when MHD reports its request completed, not when it was queued */
    for (int i = 0; S->d && i < 40; i++) {
        pthread_mutex_lock(&S->mu);
        int left = S->n_gens + S->n_answering;
        pthread_mutex_unlock(&S->mu);
        if (!left) break;
        usleep(50000);
    }
    if (S->d) MHD_stop_daemon(S->d);
    ib_sched_free(S->sched);
    if (S->sessions)
        for (int i = 0; i < S->n_sessions; i++) sess_unref(S, S->sessions[i]);
    free(S->sessions);
    free(S->tu);
    ib_store_close(S->store);
    ib_engine_free(S->e);
    ib_model_free(S->m);
    if (S->urandom >= 0) close(S->urandom);
    if (lat_init) ib_latency_destroy(&S->lat);
    ib_json_vocab_free(&S->jv);
    ib_http_configure(NULL, NULL);
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->mem_cv);
    pthread_mutex_destroy(&S->watch_mu);
    free(S);
    return rc;
}
