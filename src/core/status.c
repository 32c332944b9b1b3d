/*
 * status.c — the one table of status codes and the error-message helpers.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

static const char *const status_names[IB_STATUS_COUNT] = {
    [IB_OK] = "ok",
    [IB_ERR_INVALID_ARG] = "invalid argument",
    [IB_ERR_NOMEM] = "out of memory",
    [IB_ERR_IO] = "i/o error",
    [IB_ERR_FORMAT] = "malformed file",
    [IB_ERR_MODEL] = "inconsistent model",
    [IB_ERR_UNSUPPORTED] = "unsupported",
    [IB_ERR_CONTEXT] = "context full",
    [IB_ERR_STATE] = "invalid state",
    [IB_ERR_NOT_FOUND] = "not found",
};

const char *ib_strerror(ib_status code) {
    if ((unsigned)code >= IB_STATUS_COUNT) return "unknown status";
    return status_names[code];
}

ib_status ib_fail(ib_error *err, ib_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        /* one line: fold any newline a caller's string brought in */
        for (char *p = err->msg; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
    }
    return code;
}

void ib_error_clear(ib_error *err) {
    if (!err) return;
    err->code = IB_OK;
    err->msg[0] = '\0';
}
