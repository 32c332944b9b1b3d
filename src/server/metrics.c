/*
 * metrics.c — GET /metrics (Prometheus text: requests, latency, memory, sessions, store) and
 * GET /v1/models.
 */
#include "server/server_impl.h"

enum MHD_Result handle_metrics(server *S, struct MHD_Connection *c) {
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
    P("# HELP isobatch_tokens_shared_total Prompt tokens copied from another choice's prefilled session instead of fed.\n"
      "# TYPE isobatch_tokens_shared_total counter\nisobatch_tokens_shared_total %lld\n", st.tokens_shared);
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

enum MHD_Result handle_models(server *S, struct MHD_Connection *c) {
    json_t *m = ib_api_model_json(S->model_id, S->info);
    json_t *d = json_array();
    json_array_append_new(d, m);
    json_t *j = json_object();
    json_object_set_new(j, "object", json_string("list"));
    json_object_set_new(j, "data", d);
    return send_json(S, c, 200, j, 0);
}
