/*
 * admission.c — admission of work: KV memory reservations against the server's budget and each
 * API key's quota (waiting in a bounded queue), and each key's count of generations in flight.
 */
#include "server/server_impl.h"

/* Reserve `bytes` of KV memory for key t: within the server's budget and the key's quota, waiting
 * up to queue_wait_ms in a bounded queue when wait is set. 0 on success; -2 when the bytes exceed
 * the whole budget or the key's whole quota (it can never fit); -1 the budget is in use; -3 the
 * key's quota is in use (other keys' work is not what holds it up). */
int mem_reserve(server *S, int t, size_t bytes, int wait) {
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
void mem_release(server *S, int t, size_t bytes) {
    pthread_mutex_lock(&S->mu);
    S->kv_used -= bytes;
    S->tu[t].kv -= bytes;
    pthread_cond_broadcast(&S->mem_cv);
    pthread_mutex_unlock(&S->mu);
}

/* Take one of key t's in-flight requests (generations queued, waiting or running). 0 on success,
 * -1 when the key holds its quota already. */
int inflight_take(server *S, int t) {
    pthread_mutex_lock(&S->mu);
    int ok = !S->key_requests || S->tu[t].inflight < S->key_requests;
    if (ok) S->tu[t].inflight++;
    pthread_mutex_unlock(&S->mu);
    return ok ? 0 : -1;
}

void inflight_put(server *S, int t) {
    pthread_mutex_lock(&S->mu);
    S->tu[t].inflight--;
    pthread_mutex_unlock(&S->mu);
}

/* Admit one generation of key t that needs `bytes` of KV: one of the key's in-flight requests, then the
 * bytes (waiting as mem_reserve does). 0: admitted (give both back with mem_release and inflight_put).
 * Otherwise nothing is held and the refusal has been sent on c into *ret: 429 key_request_limit; 400
 * context_length_exceeded when the bytes can never fit (`what` names the request: "this request",
 * "prompt 2", …); 429 key_memory_quota_exceeded or rate_limit_exceeded while they are in use. */
int admit_generation(server *S, struct MHD_Connection *c, int t, size_t bytes, const char *what,
                     enum MHD_Result *ret) {
    if (inflight_take(S, t)) {
        *ret = send_error(S, c, 429, "rate_limit_error", "key_request_limit", NULL,
                          "this API key has its limit of %d requests in flight; retry later", S->key_requests);
        return -1;
    }
    int mrc = mem_reserve(S, t, bytes, 1);
    if (!mrc) return 0;
    inflight_put(S, t);
    if (mrc == -2)
        *ret = send_error(S, c, 400, "invalid_request_error", "context_length_exceeded", NULL,
                          "%s needs %zu KV bytes, more than the memory budget of %zu (%zu per key)", what, bytes,
                          S->o.memory_budget, S->key_kv ? S->key_kv : S->o.memory_budget);
    else if (mrc == -3)
        *ret = send_error(S, c, 429, "rate_limit_error", "key_memory_quota_exceeded", NULL,
                          "this API key's KV quota of %zu bytes is in use; retry later", S->key_kv);
    else
        *ret = send_error(S, c, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                          "the KV memory budget is in use; retry later");
    return -1;
}
