/*
 * http_extra.c — what every HTTP exchange of `isobatch serve` carries besides its body: a request id
 * (X-Request-Id, taken from the client or made here), CORS headers and OPTIONS preflight answers,
 * Allow on 405, a one-line request log, and the listening address (IPv4 or IPv6). Contracts in api.h.
 *
 * libmicrohttpd runs each connection on its own thread (MHD_USE_THREAD_PER_CONNECTION) and a
 * connection handles one request at a time, so the request being served is kept in thread-local
 * storage between the first callback, the response and the completion notice.
 */
#include "server/api.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static FILE *g_log;
static char g_cors[256];

typedef struct reqctx {
    int active;
    char id[72];
    char method[16];
    char path[160];
    unsigned status;
    struct timespec t0;
} reqctx;

static _Thread_local reqctx cur;

void ib_http_configure(FILE *log, const char *cors_origin) {
    g_log = log;
    snprintf(g_cors, sizeof g_cors, "%s", cors_origin ? cors_origin : "");
}

/* Whether s (from a client header) is a usable request id: 1..64 printable ASCII bytes. */
static int good_id(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e) return 0;
    return 1;
}

void ib_http_request_begin(struct MHD_Connection *c, const char *method, const char *url) {
    memset(&cur, 0, sizeof cur);
    cur.active = 1;
    clock_gettime(CLOCK_MONOTONIC, &cur.t0);
    snprintf(cur.method, sizeof cur.method, "%s", method);
    /* the path is logged, so keep it printable */
    size_t i = 0;
    for (; url[i] && i + 1 < sizeof cur.path; i++) cur.path[i] = url[i] >= 0x20 && url[i] < 0x7f ? url[i] : '?';
    cur.path[i] = 0;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    if (good_id(h)) {
        snprintf(cur.id, sizeof cur.id, "%s", h);
    } else {
        unsigned char b[8];
        if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) memset(b, 0, sizeof b);
        for (int k = 0; k < 8; k++) sprintf(cur.id + 2 * k, "%02x", b[k]);
    }
}

const char *ib_http_allowed(const char *url) {
    if (!strcmp(url, "/healthz") || !strcmp(url, "/health") || !strcmp(url, "/metrics") || !strcmp(url, "/v1/models") ||
        !strncmp(url, "/v1/models/", 11))
        return "GET, OPTIONS";
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/tokenize") ||
        !strcmp(url, "/detokenize") || !strcmp(url, "/v1/verify"))
        return "POST, OPTIONS";
    if (!strcmp(url, "/v1/sessions")) return "GET, POST, OPTIONS";
    if (!strncmp(url, "/v1/sessions/", 13)) {
        const char *slash = strchr(url + 13, '/');
        if (!slash) return "GET, POST, DELETE, OPTIONS";
        if (!strcmp(slash, "/append") || !strcmp(slash, "/generate")) return "POST, OPTIONS";
    }
    return NULL;
}

void ib_http_decorate(struct MHD_Response *r, unsigned code) {
    if (!cur.active) return;
    cur.status = code;
    MHD_add_response_header(r, "X-Request-Id", cur.id);
    const char *allow = ib_http_allowed(cur.path);
    int options = !strcmp(cur.method, "OPTIONS");
    if (allow && (code == 405 || options)) MHD_add_response_header(r, "Allow", allow);
    if (g_cors[0]) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", g_cors);
        MHD_add_response_header(r, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
        if (strcmp(g_cors, "*")) MHD_add_response_header(r, "Vary", "Origin");
        if (options) {
            MHD_add_response_header(r, "Access-Control-Allow-Methods", allow ? allow : "GET, POST, DELETE, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        }
    }
}

void ib_http_request_end(void) {
    if (!cur.active) return;
    cur.active = 0;
    if (!g_log) return;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - cur.t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - cur.t0.tv_nsec) * 1e-6;
    time_t now = time(NULL);
    struct tm tm;
    char ts[32];
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(g_log, "isobatch serve: %s %s %s %s %u %.1f ms\n", ts, cur.id, cur.method, cur.path,
            cur.status ? cur.status : 0u, ms);
    fflush(g_log);
}

int ib_http_bind_addr(const char *host, int port, struct sockaddr_storage *out, int *v6) {
    char h[64];
    memset(out, 0, sizeof *out);
    if (!host || !strcmp(host, "localhost")) host = "127.0.0.1";
    size_t n = strlen(host);
    if (n >= sizeof h) return -1;
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        memcpy(h, host + 1, n - 2);
        h[n - 2] = 0;
    } else
        memcpy(h, host, n + 1);
    struct sockaddr_in *a4 = (struct sockaddr_in *)out;
    if (inet_pton(AF_INET, h, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *v6 = 0;
        return 0;
    }
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
    if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *v6 = 1;
        return 0;
    }
    return -1;
}
