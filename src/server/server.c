/*
 * server.c — `isobatch serve`: the daemon's lifecycle and request dispatch. Options and their
 * defaults, the HTTP daemon (libmicrohttpd, one thread per connection) and its access and
 * completion callbacks, routing each request to its handler, the main loop (session expiry, the
 * request deadline's sweep), the graceful stop (drain) and teardown. docs/server.md documents every
 * endpoint, limit and error; server_impl.h describes the threads and the lock order.
 */
#include "server/server_impl.h"

ib_server_opts ib_server_opts_default(void) {
    ib_server_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8080;
    o.threads = 1;
    o.max_batch = 32;
    o.prefill_chunk = 64;
    o.share_prefix = 32;
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
        /* a session's creation may come without a body: POST /v1/sessions, POST /v1/sessions/{id} */
        const int creation = !strcmp(url, "/v1/sessions") || (!strncmp(url, "/v1/sessions/", 13) && !strchr(url + 13, '/'));
        if (!b && (cn->len || !creation))
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
        r = post ? handle_session_create(S, c, b, tenant, tidx, NULL)
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
        }
        if (!*action && post) {   /* POST /v1/sessions/{id}: create a session of the client's id */
            r = il < sizeof id && !ib_store_id_valid(id)
                    ? handle_session_create(S, c, b, tenant, tidx, id)
                    : BAD(NULL, "a session id is 1 to %d of A-Z, a-z, 0-9, _, . and -", (int)sizeof id - 1);
            json_decref(b);
            return r;
        }
        if (il < sizeof id) ss = sess_get(S, id, tenant);
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

/* The KV memory budget when none is given, for caches in host memory: half of the machine's memory
 * (machine_memory) less the weights, so that KV caches, weights and the rest of the process fit; at
 * least 64 MiB. */
static size_t default_memory_budget(const ib_model_info *mi) {
    size_t mem = machine_memory(), floor = (size_t)64 << 20;
    if (!mem) return (size_t)4 << 30;
    size_t half = mem / 2, w = mi->weight_bytes;
    return half > w + floor ? half - w : floor;
}

/* The share of a GPU's memory its KV budget leaves free (step graphs, allocation granularity, the
 * driver): a twentieth of the total. */
#define DEVICE_KV_RESERVE_DIV 20

/* S->o.memory_budget for caches of backend k, read once the engine holds its weights and step scratch.
 * Caches on the host: as given, or default_memory_budget. Caches on a GPU (ib_backend_device_memory):
 * as given when it fits the GPU's free memory less the reserve — more is refused in one line, since
 * sessions past what the GPU holds would fail at creation instead of waiting for memory —, or by
 * default that free memory less the reserve (at least 64 MiB). S->budget_rule names the default taken. */
static ib_status kv_budget(server *S, ib_backend_kind k, ib_error *err) {
    size_t fr = 0, tot = 0;
    if (ib_backend_device_memory(k, &fr, &tot)) {
        S->budget_rule = "half the machine's memory less the weights";
        if (!S->o.memory_budget) S->o.memory_budget = default_memory_budget(S->info);
        return IB_OK;
    }
    const size_t reserve = tot / DEVICE_KV_RESERVE_DIV, floor = (size_t)64 << 20;
    const size_t room = fr > reserve + floor ? fr - reserve : floor;
    if (S->o.memory_budget > room)
        return ib_fail(err, IB_ERR_INVALID_ARG,
                       "serve: --memory-budget %zu MiB is more than the %s backend's device holds for KV caches "
                       "(%zu MiB free after the weights, less %zu MiB kept free)",
                       S->o.memory_budget >> 20, ib_backend_name(k), fr >> 20, reserve >> 20);
    S->budget_rule = "the GPU's free memory after the weights, less a twentieth of it";
    if (!S->o.memory_budget) S->o.memory_budget = room;
    return IB_OK;
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
    ib_load_opts lo = {.threads = o->threads};   /* the weights are repacked on the engine's threads */
    if ((rc = ib_model_load(o->model_dir, &lo, &S->m, err))) goto done;
    S->info = ib_model_get_info(S->m);
    /* the model's identity (a SHA-256 of its files): stored with each session, so that a session is
     * continued only by the model that made it */
    if ((rc = ib_model_identity(o->model_dir, S->ident, err))) goto done;
    if (o->store_uri && (rc = ib_store_open(o->store_uri, &S->store, err))) goto done;
    if (ib_json_vocab_init(&S->jv, S->m)) {
        rc = ib_fail(err, IB_ERR_NOMEM, "serve: out of memory");
        goto done;
    }
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
    /* a session of the server's KV options must be possible (a backend that lacks the KV type, q8 with
     * head dims it cannot take): refused now in one line, not at every request */
    if ((rc = ib_session_check(S->m, &(ib_session_opts){.max_context = 1, .kv_dtype = o->kv_dtype, .backend = o->backend},
                               err)))
        goto done;
    if ((rc = kv_budget(S, o->backend, err))) goto done;
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
    ib_sched_opts so = {.max_batch = o->max_batch, .prefill_chunk = o->prefill_chunk, .max_queue = o->max_queue > 0 ? o->max_queue : -1,
                        .share_min = o->share_prefix};
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
        char rule[128] = ""; /* how a default budget was set */
        if (!o->memory_budget) snprintf(rule, sizeof rule, " (default: %s)", S->budget_rule);
        fprintf(log, "isobatch serve: model '%s' (%s), http://%s:%d, batch %d, %d threads, ISA %s, backend %s, KV budget %zu MiB%s%s\n",
                S->model_id, S->info->arch, shown, port, o->max_batch, o->threads, ib_isa_name(ib_engine_isa(S->e)),
                ib_backend_name(o->backend), S->o.memory_budget >> 20, rule, o->n_api_keys ? ", API key required" : "");
        fprintf(log, "isobatch serve: model identity %s; session store %s%s%s%s\n", S->ident,
                o->store_uri ? o->store_uri : "none (sessions live only in memory)", o->store_origin ? " (" : "",
                o->store_origin ? o->store_origin : "", o->store_origin ? ")" : "");
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
