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

/* Copy raw into out[cap] as one printable line: a newline or carriage return becomes a space, any
 * other control byte (0x01-0x1F, 0x7F) is written as \xNN, so a name or value quoted from a hostile
 * file or request cannot move a terminal's cursor or forge log lines. Truncated to fit; out is always
 * terminated (cap >= 1). */
void ib_one_line(char *out, size_t cap, const char *raw) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p && o + 1 < cap; p++) {
        if (*p == '\n' || *p == '\r') {
            out[o++] = ' ';
        } else if (*p < 0x20 || *p == 0x7F) {
            if (o + 5 >= cap) break;
            o += (size_t)snprintf(out + o, cap - o, "\\x%02X", *p);
        } else {
            out[o++] = (char)*p;
        }
    }
    out[o] = '\0';
}

/* vprintf into a buffer of 512 bytes, then ib_one_line into out[cap]. */
static void one_line_v(char *out, size_t cap, const char *fmt, va_list ap) {
    char raw[512];
    vsnprintf(raw, sizeof raw, fmt, ap);
    ib_one_line(out, cap, raw);
}

void ib_one_linef(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    one_line_v(out, cap, fmt, ap);
    va_end(ap);
}

/* Record code and the formatted message in err (may be NULL), as one printable line (ib_one_line),
 * and return code. */
ib_status ib_fail(ib_error *err, ib_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        one_line_v(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void ib_error_clear(ib_error *err) {
    if (!err) return;
    err->code = IB_OK;
    err->msg[0] = '\0';
}
