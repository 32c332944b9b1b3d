/*
 * latency.c — the latencies a user of the server feels, as Prometheus histograms: time to first
 * token (request arrival to the first generated token), inter-token latency (between two tokens of
 * one generation) and queue time (waiting for a batch slot); and the generation rate over the last
 * ten whole seconds, which no scrape resets. Contracts in api.h.
 */
#include "server/api.h"

#include <string.h>

/* Upper bounds (seconds) of the buckets; one more bucket holds the rest (+Inf). */
static const double bounds[IB_LAT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

void ib_latency_init(ib_latency *l, double now) {
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    l->sec0 = now;
    for (int i = 0; i < 16; i++) l->sec_of[i] = -1;
}

void ib_latency_destroy(ib_latency *l) { pthread_mutex_destroy(&l->mu); }

/* Count x (seconds; NaN or negative as 0) in histogram h, its sum and its count. */
static void observe(long long *h, double *sum, long long *n, double x) {
    if (!(x >= 0)) x = 0;
    int b = 0;
    while (b < IB_LAT_BUCKETS && x > bounds[b]) b++;
    h[b]++;
    *sum += x;
    (*n)++;
}

void ib_latency_first(ib_latency *l, double ttft, double queue) {
    pthread_mutex_lock(&l->mu);
    observe(l->ttft, &l->ttft_sum, &l->ttft_n, ttft);
    observe(l->queue, &l->queue_sum, &l->queue_n, queue);
    pthread_mutex_unlock(&l->mu);
}

void ib_latency_next(ib_latency *l, double itl) {
    pthread_mutex_lock(&l->mu);
    observe(l->itl, &l->itl_sum, &l->itl_n, itl);
    pthread_mutex_unlock(&l->mu);
}

void ib_latency_token(ib_latency *l, double now) {
    long long s = (long long)(now - l->sec0);
    if (s < 0) s = 0;
    int slot = (int)(s % 16);
    pthread_mutex_lock(&l->mu);
    if (l->sec_of[slot] != s) {
        l->sec_of[slot] = s;
        l->per_sec[slot] = 0;
    }
    l->per_sec[slot]++;
    pthread_mutex_unlock(&l->mu);
}

/* Append one histogram named name (help text help) from h, sum, n. */
static void format_hist(const char *name, const char *help, const long long *h, double sum, long long n, char *buf,
                        int *k, int cap) {
    if (*k >= cap) return;
    *k += snprintf(buf + *k, (size_t)(cap - *k), "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long long cum = 0;
    for (int b = 0; b < IB_LAT_BUCKETS && *k < cap; b++) {
        cum += h[b];
        *k += snprintf(buf + *k, (size_t)(cap - *k), "%s_bucket{le=\"%g\"} %lld\n", name, bounds[b], cum);
    }
    cum += h[IB_LAT_BUCKETS];
    if (*k < cap)
        *k += snprintf(buf + *k, (size_t)(cap - *k), "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", name,
                       cum, name, sum, name, n);
}

void ib_latency_format(ib_latency *l, double now, char *buf, int *k, int cap) {
    pthread_mutex_lock(&l->mu);
    ib_latency c = *l; /* a consistent copy; the mutex member of the copy is never used */
    pthread_mutex_unlock(&l->mu);
    format_hist("isobatch_time_to_first_token_seconds", "From a request's arrival to its first generated token.",
                c.ttft, c.ttft_sum, c.ttft_n, buf, k, cap);
    format_hist("isobatch_inter_token_seconds", "Between two consecutive tokens of one generation.", c.itl, c.itl_sum,
                c.itl_n, buf, k, cap);
    format_hist("isobatch_queue_seconds", "Time a generation waited for a batch slot.", c.queue, c.queue_sum,
                c.queue_n, buf, k, cap);
    long long s = (long long)(now - c.sec0);
    long long w = s < 10 ? s : 10, tok = 0;
    for (int i = 0; i < 16; i++)
        if (c.sec_of[i] >= s - w && c.sec_of[i] < s) tok += c.per_sec[i];
    double rate = w > 0 ? (double)tok / (double)w : 0.0;
    if (*k < cap)
        *k += snprintf(buf + *k, (size_t)(cap - *k),
                       "# HELP isobatch_tokens_per_second Tokens generated per second over the last 10 whole seconds "
                       "(scrapes do not reset it).\n# TYPE isobatch_tokens_per_second gauge\n"
                       "isobatch_tokens_per_second %.3f\n",
                       rate);
}
