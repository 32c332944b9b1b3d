/*
 * error.h — internal helpers to report an ib_status with a one-line message.
 */
#ifndef IB_CORE_ERROR_H
#define IB_CORE_ERROR_H
#include <stddef.h>

#include "isobatch.h"

/* Copy raw into out[cap] as one printable line (newlines become spaces, other control bytes \xNN). */
void ib_one_line(char *out, size_t cap, const char *raw);
/* printf into out[cap], then ib_one_line: for messages that quote a client's or a file's names. */
void ib_one_linef(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Fill err (when non-NULL) with code and a printf-formatted one-line message; return code.
 * Usage: return ib_fail(err, IB_ERR_FORMAT, "%s: header length %llu past end of file", path, n); */
ib_status ib_fail(ib_error *err, ib_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clear err to IB_OK with an empty message (NULL allowed). */
void ib_error_clear(ib_error *err);

#endif
