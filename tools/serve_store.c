/*
 * serve_store.c — the session store `isobatch serve` uses: parsing --store, and the default file in
 * the data directory (serve_store.h).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "serve_store.h"

int serve_store_parse(const char *v, serve_store *out) {
    memset(out, 0, sizeof *out);
    if (!strcmp(v, "none")) {
        out->kind = SERVE_STORE_NONE;
        return 0;
    }
    if (!strncmp(v, "sqlite:", 7) && v[7]) out->kind = SERVE_STORE_SQLITE;
    else if (!strncmp(v, "postgresql://", 13) || !strncmp(v, "postgres://", 11)) out->kind = SERVE_STORE_POSTGRESQL;
    else return cli_usage_error("--store: '%s' is not sqlite:PATH, postgresql://... or none", v);
    if (snprintf(out->uri, sizeof out->uri, "%s", v) >= (int)sizeof out->uri)
        return cli_usage_error("--store: the value is longer than %zu bytes", sizeof out->uri - 1);
    return 0;
}

int serve_store_default(const char *data_dir_flag, const data_dir_env *env, serve_store *out) {
    memset(out, 0, sizeof *out);
    char *dir = out->data_dir;
    data_dir_source src;
    int rc = data_dir_resolve(data_dir_flag, env, dir, sizeof out->data_dir, &src);
    if (rc) return rc;
    if (snprintf(out->uri, sizeof out->uri, "sqlite:%s/" SERVE_STORE_FILE, dir) >= (int)sizeof out->uri)
        return cli_usage_error("%s: the data directory's name is too long", data_dir_source_name(src));
    if ((rc = data_dir_create(dir, &out->dirs_made))) return rc;
    out->kind = SERVE_STORE_SQLITE;
    out->is_default = 1;
    out->dir_source = src;
    snprintf(out->origin, sizeof out->origin, "default: the data directory, from %s", data_dir_source_name(src));
    return 0;
}

void serve_store_undo(const serve_store *s) {
    if (s->is_default) data_dir_remove_made(s->data_dir, s->dirs_made);
}

const char *serve_store_uri(const serve_store *s) {
    return s->kind == SERVE_STORE_NONE ? NULL : s->uri;
}
