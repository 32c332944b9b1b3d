/*
 * identity.c — ib_model_identity (isobatch.h): a SHA-256 over the files of a model directory that
 * decide its answers, so a stored session or a recorded answer can name the model that made it and
 * another process (or machine) can check it has the same one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/sha256.h"
#include "model/safetensors.h"

#define ID_TAG "isobatch-model-identity-v1"

/* Feed one file into c as name, NUL, 8-byte little-endian length, bytes. IB_ERR_IO naming the file
 * when it cannot be opened or read, or changes length while being read. */
static ib_status hash_file(ib_sha256 *c, const char *path, const char *name, unsigned char *buf, size_t cap,
                           ib_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ib_fail(err, IB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fclose(f);
        return ib_fail(err, IB_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    uint64_t len = (uint64_t)sb.st_size;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
    ib_sha256_update(c, name, strlen(name) + 1);
    ib_sha256_update(c, le, 8);
    uint64_t got = 0;
    size_t n;
    while ((n = fread(buf, 1, cap, f)) > 0) {
        ib_sha256_update(c, buf, n);
        got += n;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return ib_fail(err, IB_ERR_IO, "%s: read error", path);
    if (got != len) return ib_fail(err, IB_ERR_IO, "%s: changed while being read (%llu of %llu bytes)", path,
                                   (unsigned long long)got, (unsigned long long)len);
    return IB_OK;
}

/* Last path component of p. */
static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* qsort order of paths by their last component. */
static int cmp_base(const void *a, const void *b) {
    return strcmp(base_name(*(const char *const *)a), base_name(*(const char *const *)b));
}

ib_status ib_model_identity(const char *dir, char out[IB_MODEL_ID_LEN], ib_error *err) {
    static const char *const meta[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                       "chat_template.jinja", "model.safetensors.index.json"};
    out[0] = '\0';
    if (!dir) return ib_fail(err, IB_ERR_INVALID_ARG, "model identity: no directory");
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    const char **files = NULL;
    ib_st_set *st = NULL;
    char path[4096];
    ib_status rc = IB_OK;
    if (!buf) return ib_fail(err, IB_ERR_NOMEM, "model identity: out of memory");
    ib_sha256 c;
    ib_sha256_init(&c);
    ib_sha256_update(&c, ID_TAG, sizeof ID_TAG);
    for (size_t i = 0; i < sizeof meta / sizeof *meta; i++) {
        if (snprintf(path, sizeof path, "%s/%s", dir, meta[i]) >= (int)sizeof path) {
            rc = ib_fail(err, IB_ERR_INVALID_ARG, "%s: path too long", dir);
            goto done;
        }
        struct stat sb;
        if (i > 0 && stat(path, &sb) != 0) continue; /* optional files; config.json must exist */
        if ((rc = hash_file(&c, path, meta[i], buf, cap, err))) goto done;
    }
    /* the weight files, as the loader finds them (one file or the index's shards), by name */
    if ((rc = ib_st_open_dir(dir, &st, err))) goto done;
    int nf = 0;
    while (ib_st_file_path(st, nf)) nf++;
    files = malloc((size_t)(nf ? nf : 1) * sizeof *files);
    if (!files) {
        rc = ib_fail(err, IB_ERR_NOMEM, "model identity: out of memory");
        goto done;
    }
    for (int i = 0; i < nf; i++) files[i] = ib_st_file_path(st, i);
    qsort(files, (size_t)nf, sizeof *files, cmp_base);
    for (int i = 0; i < nf; i++)
        if ((rc = hash_file(&c, files[i], base_name(files[i]), buf, cap, err))) goto done;
    uint8_t d[32];
    char hex[65];
    ib_sha256_final(&c, d);
    ib_sha256_hex(d, hex);
    snprintf(out, IB_MODEL_ID_LEN, "sha256:%s", hex);
done:
    free(files);
    ib_st_close(st);
    free(buf);
    return rc;
}
