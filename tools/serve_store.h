/*
 * serve_store.h — which session store `isobatch serve` uses, decided once at start from --store,
 * --data-dir and the environment into one typed value; the rest of the command reads that value.
 */
#ifndef IB_TOOLS_SERVE_STORE_H
#define IB_TOOLS_SERVE_STORE_H

#include "data_dir.h"

/* The default store's file in the data directory. */
#define SERVE_STORE_FILE "sessions.db"

typedef enum serve_store_kind {
    SERVE_STORE_NONE,       /* sessions live in memory only (--store none) */
    SERVE_STORE_SQLITE,     /* an SQLite file: --store sqlite:PATH, or the default in the data directory */
    SERVE_STORE_POSTGRESQL, /* --store postgresql://... (or postgres://...) */
} serve_store_kind;

typedef struct serve_store {
    serve_store_kind kind;
    int is_default;             /* 1: the default file in the data directory (no --store given) */
    data_dir_source dir_source; /* where that directory's name came from, when is_default */
    char uri[4200];             /* ib_store_open's argument: "sqlite:PATH" or the PostgreSQL URI; "" for none */
    char origin[160];           /* how it was chosen, for the start log: "" or "default: ..." */
    char data_dir[4096];        /* the data directory, when is_default */
    int dirs_made;              /* directories this start created for it (data_dir_create) */
} serve_store;

/* Parse a --store value ("none", "sqlite:PATH", "postgresql://...", "postgres://...") into *out.
 * Returns 0, or 2 after a one-line usage error naming the value. */
int serve_store_parse(const char *v, serve_store *out);

/* The store when no --store was given: sqlite:DIR/sessions.db, DIR the data directory
 * (data_dir_resolve over data_dir_flag and env), which it creates when absent (data_dir_create).
 * Returns 0; 2 after a usage error (no data directory can be named); 1 after a one-line error when
 * the directory cannot be created (nothing is left behind then). */
int serve_store_default(const char *data_dir_flag, const data_dir_env *env, serve_store *out);

/* After a start that failed: remove the data directory and the parents serve_store_default created,
 * when they are still empty (data_dir_remove_made), so a failed start leaves nothing behind. */
void serve_store_undo(const serve_store *s);

/* The URI for ib_server_opts.store_uri: NULL when the store is none. */
const char *serve_store_uri(const serve_store *s);

#endif
