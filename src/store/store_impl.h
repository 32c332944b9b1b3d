/*
 * store_impl.h — what a session-store back end implements (store.h is the interface callers use).
 * store.c checks every argument before a back end sees it, so back ends trust theirs.
 */
#ifndef IB_STORE_STORE_IMPL_H
#define IB_STORE_STORE_IMPL_H
#include "store/store.h"

typedef struct ib_store_ops {
    void (*close)(ib_store *st);
    ib_status (*create)(ib_store *st, const ib_store_session *rec, ib_error *err);
    ib_status (*load)(ib_store *st, const char *id, ib_store_session *out, ib_error *err);
    ib_status (*append)(ib_store *st, const char *id, int at, const int32_t *tokens, const uint8_t *flags, int n,
                        const ib_store_progress *p, ib_error *err);
    ib_status (*update)(ib_store *st, const char *id, const ib_store_progress *p, ib_error *err);
    ib_status (*del)(ib_store *st, const char *id, ib_error *err);
    ib_status (*list_owner)(ib_store *st, const char *owner, char ***ids, int *n, ib_error *err);
} ib_store_ops;

/* Every back end's store object starts with this. */
struct ib_store {
    const ib_store_ops *ops;
};

/* The SQLite back end (store_sqlite.c): open or create the database file at path. */
ib_status ib_store_sqlite_open(const char *path, ib_store **out, ib_error *err);
/* The PostgreSQL back end (store_pg.c): connect to the server a postgresql:// URI names (libpq's
 * URI syntax), checking the schema or creating it in a database that has none. */
ib_status ib_store_pg_open(const char *uri, ib_store **out, ib_error *err);

#endif
