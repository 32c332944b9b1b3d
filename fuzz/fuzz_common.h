/*
 * fuzz_common.h — helpers of the libFuzzer targets in fuzz/ (see fuzz/README.md): the loaders read
 * files, so each target writes its input into a private temporary directory made once per process.
 */
#ifndef IB_FUZZ_COMMON_H
#define IB_FUZZ_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fz_dir[64];

/* The process's temporary directory (created on first use; removed at exit). */
static inline void fz_cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fz_dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fz_dir);
}

static inline const char *fz_path(const char *name) {
    static char p[4][160];
    static int k;
    if (!fz_dir[0]) {
        snprintf(fz_dir, sizeof fz_dir, "/tmp/ib_fuzz_XXXXXX");
        if (!mkdtemp(fz_dir)) abort();
        atexit(fz_cleanup);
    }
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", fz_dir, name);
    return p[k];
}

/* Write n bytes to the file `name` of the temporary directory; returns its path. */
static inline const char *fz_write(const char *name, const void *d, size_t n) {
    const char *p = fz_path(name);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (n && fwrite(d, 1, n, f) != n) abort();
    fclose(f);
    return p;
}

#ifdef IB_SERVER_API_H
/* The vocabulary of the 256 single bytes (token t is byte t), built once: the masks' vocabulary in
 * the targets that mask (include server/api.h before this file). */
static inline int fz_one_byte(void *ctx, int32_t t, char *buf, int cap) {
    (void)ctx;
    (void)cap;
    buf[0] = (char)t;
    return 1;
}
static inline const ib_json_vocab *fz_byte_vocab(void) {
    static ib_json_vocab v;
    static int built;
    if (!built) {
        if (ib_json_vocab_build(&v, 256, fz_one_byte, NULL)) abort();
        built = 1;
    }
    return &v;
}
#endif
#endif
