/*
 * cmd_verify.c — `isobatch verify RECORD.json`: re-run a response's verification record alone
 * (src/server/verify.h) and say whether it holds: exit 0 "match", 1 "no match" with the first
 * diverging step, 2 for a bad record, a missing model or a model other than the record's.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "runtime/scheduler.h"
#include "server/api.h"
#include "server/verify.h"

static const char help[] =
    "usage: isobatch verify [-m DIR] [--threads T] [--json] RECORD.json\n"
    "  RECORD.json   a response of isobatch serve (completion, chat or session generation; a stream's\n"
    "                final chunk) or its \"verification\" object; - reads stdin\n"
    "  -m DIR        the model (default: models/default); its identity must be the record's\n"
    "  --json        print the result object ({\"match\", \"first_diverging_step\", ...})\n"
    "Re-runs the record's generation alone and compares every drawn token and the running digest of\n"
    "the logits rows that chose them. Exit 0: match; 1: no match (the first diverging step is named);\n"
    "2: bad input.\n";

int cmd_verify(int argc, char **argv) {
    const char *dir = NULL, *file = NULL;
    long threads = 1;
    int as_json = 0, rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v = NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if (!strcmp(f, "-m")) rc = (v = cli_value(argc, argv, &i)) ? (dir = v, 0) : 2;
        else if (!strcmp(f, "--threads") || !strcmp(f, "-t"))
            rc = (v = cli_value(argc, argv, &i)) ? cli_int(f, v, 1, 256, &threads) : 2;
        else if (!strcmp(f, "--json")) as_json = 1;
        else if ((f[0] != '-' || !strcmp(f, "-")) && !file) file = f;
        else rc = cli_unknown_option("verify", f, help);
    }
    if (rc) return rc;
    if (!file) return cli_usage_error("verify: no record file (try --help)");
    if (!(dir = cli_model_dir(dir))) return 2;
    json_error_t je;
    json_t *j = !strcmp(file, "-") ? json_loadf(stdin, 0, &je) : json_load_file(file, 0, &je);
    if (!j) return cli_error("verify: %s: not JSON: %s (line %d)", file, je.text, je.line), 2;
    ib_error err;
    char ident[IB_MODEL_ID_LEN];
    if (ib_model_identity(dir, ident, &err)) {
        json_decref(j);
        return cli_error("verify: %s", err.msg), 2;
    }
    ib_model *m = NULL;
    ib_load_opts lo = {.threads = (int)threads};   /* the weights are repacked on as many threads */
    if (ib_model_load(dir, &lo, &m, &err)) {
        json_decref(j);
        return cli_error("verify: %s", err.msg), 2;
    }
    const ib_model_info *mi = ib_model_get_info(m);
    ib_vrec rec;
    char msg[256];
    int bad = ib_verify_parse(j, mi->vocab_size, mi->max_context, &rec, msg, sizeof msg);
    json_decref(j);
    if (bad) {
        ib_model_free(m);
        return cli_error("verify: %s: %s", file, msg), 2;
    }
    if (strcmp(rec.model, ident)) {
        cli_error("verify: the record was made by model %s; %s is %s", rec.model, dir, ident);
        ib_verify_free(&rec);
        ib_model_free(m);
        return 2;
    }
    ib_engine *e = NULL;
    ib_sched *sc = NULL;
    ib_json_vocab jv = {0};
    int jv_ok = 0;
    ib_vrun run = {0};
    ib_engine_opts eo = {.threads = (int)threads, .act = rec.act, .max_step_tokens = 64};
    ib_sched_opts so = {.max_batch = 1, .prefill_chunk = 64};
    rc = 2;
    if (rec.constraint) {
        if (ib_json_vocab_init(&jv, m)) {
            cli_error("verify: out of memory");
            goto done;
        }
        jv_ok = 1;
    }
    if (ib_engine_create(m, &eo, &e, &err) || ib_sched_create_inline(e, &so, &sc, &err) ||
        ib_verify_submit(sc, m, ib_engine_backend(e), jv_ok ? &jv : NULL, &rec, &run, &err)) {
        cli_error("verify: %s", err.msg);
        goto done;
    }
    ib_sched_drain(sc);
    json_t *res = ib_verify_compare(&rec, &run);
    int match = json_is_true(json_object_get(res, "match"));
    if (as_json) {
        char *s = json_dumps(res, JSON_COMPACT);
        if (s) puts(s);
        free(s);
    } else if (match)
        printf("match: %d tokens, digest %s\n", rec.n_tokens, json_string_value(json_object_get(res, "digest")));
    else {
        json_t *ex = json_object_get(res, "expected"), *got = json_object_get(res, "got");
        json_t *gt = json_object_get(got, "token");
        printf("no match: first diverging step %lld of %d: expected token %lld (digest %s), got %s%lld (digest %s)\n",
               (long long)json_integer_value(json_object_get(res, "first_diverging_step")), rec.n_tokens,
               (long long)json_integer_value(json_object_get(ex, "token")),
               json_string_value(json_object_get(ex, "digest")), json_is_null(gt) ? "no token " : "token ",
               json_is_null(gt) ? -1LL : (long long)json_integer_value(gt),
               json_is_string(json_object_get(got, "digest")) ? json_string_value(json_object_get(got, "digest")) : "-");
    }
    json_decref(res);
    rc = match ? 0 : 1;
done:
    ib_verify_run_free(&run);
    ib_sched_free(sc);
    ib_engine_free(e);
    if (jv_ok) ib_json_vocab_free(&jv);
    ib_verify_free(&rec);
    ib_model_free(m);
    return rc;
}
