/*
 * reply.c — the server's HTTP responses: a body with its status, headers (CORS, Retry-After) and
 * the per-status-class counts; JSON bodies; OpenAI-style error objects; fresh random ids.
 */
#include "server/server_impl.h"

/* Fill buf with 2*n lowercase hex characters of fresh random bytes (n <= 32). */
int random_hex(server *S, char *buf, int n) {
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

enum MHD_Result send_text(server *S, struct MHD_Connection *c, unsigned code, const char *type, const char *body,
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

enum MHD_Result send_json(server *S, struct MHD_Connection *c, unsigned code, json_t *j, int retry_after) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    enum MHD_Result r = send_text(S, c, code, "application/json", s, strlen(s), retry_after);
    free(s);
    return r;
}

/* An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}. */
enum MHD_Result send_error(server *S, struct MHD_Connection *c, unsigned code, const char *type,
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
