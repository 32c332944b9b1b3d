/*
 * cli.c — helpers shared by the subcommands (see cli.h).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static int vreport(int code, const char *fmt, va_list ap) {
    fputs("isobatch: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    return code;
}

int cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = vreport(2, fmt, ap);
    va_end(ap);
    return rc;
}

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = vreport(1, fmt, ap);
    va_end(ap);
    return rc;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_usage_error("%s: missing value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_int(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_usage_error("%s: bad value '%s' (an integer from %ld to %ld)", flag, s, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

int cli_float(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        cli_usage_error("%s: bad value '%s' (a number from %g to %g)", flag, s, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

int cli_u64(const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        cli_usage_error("%s: bad value '%s' (a non-negative integer)", flag, s);
        return 2;
    }
    *out = v;
    return 0;
}

const char *cli_model_dir(const char *dir) {
    if (dir) return dir;
    struct stat sb;
    if (stat("models/default/config.json", &sb) == 0) return "models/default";
    /* installed: <prefix>/bin/isobatch finds <prefix>/share/isobatch/models/default */
    static char installed[4160];
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, 4000);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            char cfg[4200];
            snprintf(installed, sizeof installed, "%s/../share/isobatch/models/default", exe);
            snprintf(cfg, sizeof cfg, "%s/config.json", installed);
            if (stat(cfg, &sb) == 0) return installed;
        }
    }
    cli_usage_error("no model: pass -m DIR (no models/default here or in the installed share/isobatch; "
                    "`isobatch mkmodel --preset tiny --out DIR` makes one)");
    return NULL;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

size_t cli_utf8_sanitize(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n && o + 4 < cap;) {
        size_t l = utf8_len(u + i, n - i);
        if (l == 0) {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += 1;
        } else {
            memcpy(out + o, s + i, l);
            o += l;
            i += l;
        }
    }
    out[o] = '\0';
    return o;
}

int cli_isa(const char *v, ib_isa *out) {
    if (ib_isa_parse(v, out) == 0) return 0;
    return cli_usage_error("--isa: unknown '%s' (auto, scalar, avx2, avx512, neon, amx)", v);
}

int cli_backend(const char *v, ib_backend_kind *out) {
    if (ib_backend_parse(v, out) == 0) return 0;
    return cli_usage_error("--backend: unknown '%s' (cpu, cuda)", v);
}

int cli_act(const char *v, ib_act *out) {
    if (ib_act_parse(v, out) == 0) return 0;
    return cli_usage_error("--act: unknown '%s' (auto, f32, q8)", v);
}

int cli_kv_dtype(const char *v, ib_kv_dtype *out) {
    if (ib_kv_dtype_parse(v, out) == 0) return 0;
    return cli_usage_error("--kv-dtype: unknown '%s' (f32, f16, q8)", v);
}

int cli_kv_policy(const char *v, int *sink, int *window) {
    if (ib_kv_policy_parse(v, sink, window) == 0) return 0;
    return cli_usage_error("--kv: '%s' is not full, window:W or sink:S,window:W", v);
}

int cli_inject(const char *v) {
    ib_fault f;
    if (ib_fault_parse(v, &f)) return cli_usage_error("--inject: unknown fault '%s'", v);
    ib_fault_set(f);
    return 0;
}

int cli_parse_ids(const char *list, int vocab, int32_t **out, int *n) {
    int k = 1;
    for (const char *c = list; *c; c++) k += *c == ',';
    int32_t *v = malloc((size_t)k * sizeof *v);
    if (!v) return cli_error("out of memory");
    const char *c = list;
    for (int i = 0; i < k; i++) {
        char *end;
        long x = strtol(c, &end, 10);
        if (end == c || (*end && *end != ',') || x < 0 || x >= vocab) {
            free(v);
            return cli_usage_error("--prompt-ids: bad id at '%s' (ids are integers in [0, %d))", c, vocab);
        }
        v[i] = (int32_t)x;
        c = end + (*end == ',');
    }
    *out = v;
    *n = k;
    return 0;
}

/* Edit distance between a[0..na) and b[0..nb) (insertions, deletions, substitutions), capped at 9. */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    if (na > 40 || nb > 40) return 9;
    int d[41][41];
    for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            d[i][j] = best;
        }
    return d[na][nb] > 9 ? 9 : d[na][nb];
}

int cli_unknown_option(const char *cmd, const char *flag, const char *help) {
    const char *best = NULL;
    size_t best_len = 0, fl = strlen(flag);
    int best_d = 3; /* suggest only within two edits */
    for (const char *p = help; (p = strstr(p, "-")) != NULL;) {
        int at_word = p == help || p[-1] == ' ' || p[-1] == '[' || p[-1] == '(' || p[-1] == '|' || p[-1] == ',';
        size_t n = 0;
        while (p[n] == '-' || (p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z') || (p[n] >= '0' && p[n] <= '9')) n++;
        if (at_word && n >= 2 && p[1] != ' ') {
            int d = edit_distance(flag, fl, p, n);
            if (d > 0 && d < best_d && (d == 1 || fl > 4)) {
                best_d = d;
                best = p;
                best_len = n;
            }
        }
        p += n ? n : 1;
    }
    if (best)
        return cli_usage_error("%s: unknown option '%s' (did you mean %.*s? try --help)", cmd, flag, (int)best_len, best);
    return cli_usage_error("%s: unknown option '%s' (try --help)", cmd, flag);
}

int cli_split_eq(int argc, char **argv, char ***out) {
    *out = NULL;
    int extra = 0;
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--", 2) && argv[i][2] && strchr(argv[i], '=')) extra++;
    if (!extra) return argc;
    char **v = calloc((size_t)(argc + extra + 1), sizeof *v);
    if (!v) return -1;
    int k = 0;
    for (int i = 0; i < argc; i++) {
        char *eq = i > 0 && !strncmp(argv[i], "--", 2) && argv[i][2] ? strchr(argv[i], '=') : NULL;
        if (eq) {
            *eq = 0; /* argv strings are ours to modify (C11 5.1.2.2.1) */
            v[k++] = argv[i];
            v[k++] = eq + 1;
        } else
            v[k++] = argv[i];
    }
    *out = v;
    return k;
}
