/*
 * verify_api.c — POST /v1/verify: re-running a replay verification record (verify.h) on this
 * server's scheduler.
 */
#include "server/server_impl.h"

/* POST /v1/verify: re-run a verification record (the body: a response carrying one, or the record)
 * as a job of this server's scheduler — alone in its own session, among whatever else runs, which
 * cannot change its numbers — and answer {"match", "first_diverging_step", ...} (verify.h). 400 for
 * a malformed record; 409 for a record of another model or activation mode (isobatch verify -m DIR
 * re-runs any). */
enum MHD_Result handle_verify(server *S, struct MHD_Connection *c, json_t *b, int tidx) {
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
    ib_session_opts vso = {.max_context = rec.max_context, .kv_dtype = rec.kv_dtype, .backend = S->o.backend,
                           .kv_sink = rec.kv_sink, .kv_window = rec.kv_window, .kv_chunk = rec.kv_chunk};
    size_t bytes = ib_session_kv_bytes_for(S->m, &vso);   /* 0: refused; the re-run's session says why */
    enum MHD_Result ar;
    if (admit_generation(S, c, tidx, bytes, "the re-run", &ar)) {
        ib_verify_free(&rec);
        return ar;
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
