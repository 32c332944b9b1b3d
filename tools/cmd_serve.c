/*
 * cmd_serve.c — `isobatch serve`: the OpenAI-compatible HTTP server (src/server/, docs/server.md).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "serve_store.h"
#include "server/server.h"

static const char help[] =
    "usage: isobatch serve [-m DIR] [--host 127.0.0.1] [--port N] [--max-batch B] [--max-sessions N]\n"
    "                      [--kv full|window:W|sink:S,window:W] [--memory-budget SIZE] [--threads T] [--api-key KEY]...\n"
    "                      [--store sqlite:PATH|postgresql://...|none] [--data-dir DIR]\n"
    "  --host ADDR            IPv4 or IPv6 address to bind (default 127.0.0.1: this machine only;\n"
    "                         ::1 or [::1] for IPv6 loopback, :: or 0.0.0.0 for every interface)\n"
    "  --port N               TCP port (default 8080; 0 = any free port, see --port-file)\n"
    "  --port-file F          write the bound port to F once listening\n"
    "  --model-id NAME        the model name clients use (default: the directory's name)\n"
    "  --max-batch B          generations stepped together (default 32)\n"
    "  --prefill-chunk C      most prompt tokens of one request per step (default 64)\n"
    "  --share-prefix N       requests running together whose prompts start with the same N or more\n"
    "                         tokens prefill them once, the others copying that KV (default 32; 0 =\n"
    "                         only a request's n choices share); never changes an answer\n"
    "  --max-queue Q          generations waiting for a batch slot, and requests waiting for memory\n"
    "                         (default 64); beyond that: 429 with Retry-After\n"
    "  --max-sessions N       stateful sessions held at once (default 256)\n"
    "  --session-context N    KV capacity of a stateful session in tokens (default 1024)\n"
    "  --session-idle-timeout S  close a session no request has named for S seconds (default 3600;\n"
    "                         0 = never); the session object reports idle_timeout and expires_at\n"
    "  --key-max-sessions N, --key-memory-budget SIZE, --key-max-requests N\n"
    "                         per-API-key quotas: sessions, KV bytes, generations in flight (queued,\n"
    "                         waiting for memory or running). Default with several keys: an equal\n"
    "                         share of --max-sessions, the memory budget and --max-batch + --max-queue\n"
    "  --kv POLICY            stateful sessions' KV policy: full (every token, up to --session-context),\n"
    "                         window:W (the last W positions), sink:S,window:W (the first S and the last W;\n"
    "                         positions keep counting, memory is fixed at S + W + prefill-chunk tokens)\n"
    "  --memory-budget SIZE   KV bytes over all sessions, e.g. 512M, 4G (default: half the machine's\n"
    "                         memory, or its cgroup limit, less the weights; --backend cuda: the GPU's\n"
    "                         free memory after the weights less a twentieth, and no more is accepted)\n"
    "  --kv-dtype f32|f16|q8  KV precision of every session (f16: half the memory, q8: 28%;\n"
    "                         answers change slightly)\n"
    "  --threads T            compute threads (default: the CPUs online)\n"
    "  --isa auto|scalar|avx2|avx512|neon|amx, --act auto|f32|q8\n"
    "  --backend cpu|cuda   where the engine computes and sessions' KV caches live (default cpu)\n"
    "  --api-key KEY          require Authorization: Bearer KEY (repeat for several tenants)\n"
    "  --max-body BYTES       request body limit (default 1048576)\n"
    "  --max-prompt-tokens N  prompt limit (default 4096)\n"
    "  --max-tokens N         max_tokens limit (default 1024)\n"
    "  --max-connections N    open connections (default 1024)\n"
    "  --max-client-connections N  open connections from one IP address (default 256)\n"
    "  --request-timeout S    a connection must send each whole request (headers and body) within S\n"
    "                         seconds of opening or of its previous response, else it is closed\n"
    "                         (default 30; stops clients that trickle bytes to hold connections)\n"
    "  --timeout S            longest generation, queue wait included (default 300)\n"
    "  --idle-timeout S       close a connection idle this long while sending its request (default 30)\n"
    "  --cors-origin ORIGIN   Access-Control-Allow-Origin of every response (default *; none: no CORS)\n"
    "  --no-request-log       do not log one line per request on stderr (id, method, path, status, ms)\n"
    "  --drain-timeout S      on SIGTERM/SIGINT: stop accepting, let generations in flight finish for up\n"
    "                         to S seconds, then end the rest (default 30)\n"
    "  --store URI            where stateful sessions are kept, so they survive a restart: sqlite:PATH\n"
    "                         (an SQLite file, created when absent), postgresql://USER@HOST:PORT/DB (a\n"
    "                         PostgreSQL database several servers share), or none (memory only: a\n"
    "                         restart loses them). Default: sqlite:DATA_DIR/sessions.db\n"
    "  --data-dir DIR         the data directory, where the default store lives; default\n"
    "                         $ISOBATCH_DATA_DIR, else $XDG_DATA_HOME/isobatch, else\n"
    "                         ~/.local/share/isobatch (created, mode 0700, when the default store is used)\n"
    "  --inject FAULT         tests only: serve with a deliberate invariance bug (see generate --help)\n"
    "  --token-delay-ms N     tests only: sleep N ms on each generated token (a slow model)\n";

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = 1; }

/* Parse a byte size with an optional K/M/G/T suffix (powers of 1024). 0 on success. */
static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    else if (*end == 'T' || *end == 't') mul = 1024.0 * 1024 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || !(v * mul < 1.8e19)) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

int cmd_serve(int argc, char **argv) {
    ib_server_opts o = ib_server_opts_default();
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    const char *keys[64];
    int nk = 0, rc = 0;
    const char *dir = NULL, *data_dir = NULL;
    serve_store store;
    int store_given = 0;
    long port = o.port, batch = o.max_batch, chunk = o.prefill_chunk, share = o.share_prefix, queue = o.max_queue, sessions = o.max_sessions,
         sctx = o.session_context, maxp = o.max_prompt_tokens, maxt = o.max_tokens, conns = o.max_connections,
         tmo = o.timeout_s, idle = o.idle_timeout_s, rto = o.request_timeout_s,
         cconns = o.max_connections_per_client, sidle = o.session_idle_timeout_s, drain = o.drain_timeout_s, kses = 0, kreq = 0, body = (long)o.max_body, delay = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v = NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            return 0;
        }
#define VAL() (v = cli_value(argc, argv, &i))
        if (!strcmp(f, "-m")) rc = VAL() ? (dir = v, 0) : 2;
        else if (!strcmp(f, "--host")) rc = VAL() ? (o.host = v, 0) : 2;
        else if (!strcmp(f, "--port")) rc = VAL() ? cli_int(f, v, 0, 65535, &port) : 2;
        else if (!strcmp(f, "--port-file")) rc = VAL() ? (o.port_file = v, 0) : 2;
        else if (!strcmp(f, "--store")) {
            if (!VAL()) rc = 2;
            else if (!(rc = serve_store_parse(v, &store))) store_given = 1;
        } else if (!strcmp(f, "--data-dir")) {
            if (!VAL()) rc = 2;
            else if (!*v) rc = cli_usage_error("--data-dir: empty directory name");
            else data_dir = v;
        }
        else if (!strcmp(f, "--model-id")) rc = VAL() ? (o.model_id = v, 0) : 2;
        else if (!strcmp(f, "--max-batch")) rc = VAL() ? cli_int(f, v, 1, 1024, &batch) : 2;
        else if (!strcmp(f, "--prefill-chunk")) rc = VAL() ? cli_int(f, v, 1, 4096, &chunk) : 2;
        else if (!strcmp(f, "--share-prefix")) rc = VAL() ? cli_int(f, v, 0, 1 << 24, &share) : 2;
        else if (!strcmp(f, "--max-queue")) rc = VAL() ? cli_int(f, v, 0, 100000, &queue) : 2;
        else if (!strcmp(f, "--max-sessions")) rc = VAL() ? cli_int(f, v, 1, 1000000, &sessions) : 2;
        else if (!strcmp(f, "--session-context")) rc = VAL() ? cli_int(f, v, 1, 1 << 24, &sctx) : 2;
        else if ((!strcmp(f, "--threads") || !strcmp(f, "-t"))) rc = VAL() ? cli_int(f, v, 1, 256, &threads) : 2;
        else if (!strcmp(f, "--max-body")) rc = VAL() ? cli_int(f, v, 1, 1L << 30, &body) : 2;
        else if (!strcmp(f, "--max-prompt-tokens")) rc = VAL() ? cli_int(f, v, 1, 1 << 24, &maxp) : 2;
        else if (!strcmp(f, "--max-tokens")) rc = VAL() ? cli_int(f, v, 1, 1 << 24, &maxt) : 2;
        else if (!strcmp(f, "--max-connections")) rc = VAL() ? cli_int(f, v, 1, 100000, &conns) : 2;
        else if (!strcmp(f, "--timeout")) rc = VAL() ? cli_int(f, v, 1, 86400, &tmo) : 2;
        else if (!strcmp(f, "--idle-timeout")) rc = VAL() ? cli_int(f, v, 1, 3600, &idle) : 2;
        else if (!strcmp(f, "--request-timeout")) rc = VAL() ? cli_int(f, v, 1, 3600, &rto) : 2;
        else if (!strcmp(f, "--drain-timeout")) rc = VAL() ? cli_int(f, v, 0, 86400, &drain) : 2;
        else if (!strcmp(f, "--session-idle-timeout")) rc = VAL() ? cli_int(f, v, 0, 1 << 30, &sidle) : 2;
        else if (!strcmp(f, "--key-max-sessions")) rc = VAL() ? cli_int(f, v, 1, 1000000, &kses) : 2;
        else if (!strcmp(f, "--key-max-requests")) rc = VAL() ? cli_int(f, v, 1, 1000000, &kreq) : 2;
        else if (!strcmp(f, "--key-memory-budget")) {
            if (!VAL()) rc = 2;
            else if (parse_size(v, &o.key_memory_budget) || !o.key_memory_budget)
                rc = cli_usage_error("--key-memory-budget: bad size '%s' (e.g. 512M, 4G; more than 0)", v);
        }
        else if (!strcmp(f, "--max-client-connections")) rc = VAL() ? cli_int(f, v, 1, 100000, &cconns) : 2;
        else if (!strcmp(f, "--memory-budget")) {
            if (!VAL()) rc = 2;
            else if (parse_size(v, &o.memory_budget) || !o.memory_budget)
                rc = cli_usage_error("--memory-budget: bad size '%s' (e.g. 512M, 4G; more than 0)", v);
        } else if (!strcmp(f, "--kv")) {
            if (!VAL()) rc = 2;
            else if (ib_kv_policy_parse(v, &(int){0}, &(int){0}))
                rc = cli_usage_error("--kv: '%s' is not full, window:W or sink:S,window:W", v);
            else o.kv_policy = v;
        } else if (!strcmp(f, "--api-key")) {
            if (!VAL()) rc = 2;
            else if (!*v || nk == 64) rc = cli_usage_error("--api-key: empty key, or more than 64 keys");
            else keys[nk++] = v;
        } else if (!strcmp(f, "--inject")) { /* tests only: a deliberate invariance bug (see ib_fault) */
            rc = VAL() ? cli_inject(v) : 2;
        } else if (!strcmp(f, "--token-delay-ms")) { /* tests only: a slow model */
            rc = VAL() ? cli_int(f, v, 0, 10000, &delay) : 2;
        } else if (!strcmp(f, "--kv-dtype")) {
            rc = VAL() ? cli_kv_dtype(v, &o.kv_dtype) : 2;
        } else if (!strcmp(f, "--isa")) rc = VAL() ? cli_isa(v, &o.isa) : 2;
        else if (!strcmp(f, "--backend")) rc = VAL() ? cli_backend(v, &o.backend) : 2;
        else if (!strcmp(f, "--act")) {
            rc = VAL() ? cli_act(v, &o.act) : 2;
        } else if (!strcmp(f, "--cors-origin")) {
            if (!VAL()) rc = 2;
            else if (!*v || strlen(v) > 200 || strpbrk(v, "\r\n"))
                rc = cli_usage_error("--cors-origin: '%s' is not an origin (e.g. https://app.example, *, none)", v);
            else o.cors_origin = strcmp(v, "none") ? v : NULL;
        } else if (!strcmp(f, "--no-request-log")) o.request_log = 0;
        else
            rc = cli_unknown_option("serve", f, help);
#undef VAL
    }
    if (rc) return rc;
    if (!(dir = cli_model_dir(dir))) return 2;
    /* a set but empty variable is a mistake (an unset secret), never a request for no authentication */
    const char *env_key = getenv("ISOBATCH_API_KEY");
    if (env_key && !*env_key) return cli_usage_error("ISOBATCH_API_KEY is set but empty: unset it to serve without a key");
    if (env_key && nk == 64) return cli_usage_error("ISOBATCH_API_KEY: more than 64 keys");
    if (env_key) keys[nk++] = env_key;
    /* the store, decided once (after every other argument is known good, so a bad one creates no
     * directory): --store, else the default file in the data directory, created when absent */
    if (!store_given) {
        data_dir_env env = data_dir_env_get();
        if ((rc = serve_store_default(data_dir, &env, &store))) return rc;
    }
    o.store_uri = serve_store_uri(&store);
    o.store_origin = store.origin[0] ? store.origin : NULL;
    o.model_dir = dir;
    o.port = (int)port;
    o.threads = (int)threads;
    o.max_batch = (int)batch;
    o.prefill_chunk = (int)chunk;
    o.share_prefix = (int)share;
    o.max_queue = (int)queue;
    o.max_sessions = (int)sessions;
    o.session_context = (int)sctx;
    o.max_body = (size_t)body;
    o.max_prompt_tokens = (int)maxp;
    o.max_tokens = (int)maxt;
    o.max_connections = (int)conns;
    o.timeout_s = (int)tmo;
    o.idle_timeout_s = (int)idle;
    o.request_timeout_s = (int)rto;
    o.session_idle_timeout_s = (int)sidle;
    o.drain_timeout_s = (int)drain;
    o.key_max_sessions = (int)kses;
    o.key_max_requests = (int)kreq;
    o.max_connections_per_client = (int)cconns;
    o.token_delay_ms = (int)delay;
    o.api_keys = keys;
    o.n_api_keys = nk;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    ib_error err;
    if (ib_server_run(&o, &stop_flag, stderr, &err)) {
        serve_store_undo(&store); /* a failed start leaves no empty data directory behind */
        return cli_error("%s", err.msg);
    }
    return 0;
}
