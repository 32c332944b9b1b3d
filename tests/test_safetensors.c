/*
 * test_safetensors.c — safetensors reader/writer: writer->reader round trip, shards through a
 * hand-written index, and every malformed input the reader must reject (status code and the
 * file/tensor/field named in the message). Files live in a fresh mkdtemp directory under /tmp that
 * is removed at the end.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "model/safetensors.h"

static char g_dir[64];

/* g_dir/name in a static buffer (one at a time per slot). */
static const char *in_dir(const char *name, int slot) {
    static char buf[4][512];
    snprintf(buf[slot], sizeof buf[slot], "%s/%s", g_dir, name);
    return buf[slot];
}

/* Write raw bytes to a file. */
static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    if (n && fwrite(p, 1, n, f) != n) exit(2);
    fclose(f);
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

/* A safetensors file with header length hlen (written as given), header text and data_len bytes
 * of data (byte i = i & 255). */
static void write_raw_n(const char *path, uint64_t hlen, const char *header, size_t data_len) {
    size_t n = strlen(header);
    unsigned char *buf = malloc(8 + n + data_len + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, n);
    for (size_t i = 0; i < data_len; i++) buf[8 + n + i] = (unsigned char)(i & 255);
    write_bytes(path, buf, 8 + n + data_len);
    free(buf);
}

static void write_raw(const char *path, const char *header, size_t data_len) {
    write_raw_n(path, strlen(header), header, data_len);
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* Open path, expect failure with `code` and every non-NULL substring in the message. */
static void expect_open_fail(const char *path, ib_status code, const char *s1, const char *s2,
                             const char *s3) {
    ib_st_set *s = (ib_st_set *)1;
    ib_error err = {0};
    ib_status st = ib_st_open_file(path, &s, &err);
    CHECK(st == code, "%s: status %d (%s), want %d; msg: %s", path, st, ib_strerror(st), code, err.msg);
    CHECK_EQ_INT(err.code, code);
    CHECK(s == NULL, "out not NULL on failure");
    CHECK(contains(err.msg, path), "msg lacks path %s: %s", path, err.msg);
    if (s1) CHECK(contains(err.msg, s1), "msg lacks \"%s\": %s", s1, err.msg);
    if (s2) CHECK(contains(err.msg, s2), "msg lacks \"%s\": %s", s2, err.msg);
    if (s3) CHECK(contains(err.msg, s3), "msg lacks \"%s\": %s", s3, err.msg);
    if (st == IB_OK) ib_st_close(s);
}

/* Open dir, expect failure with `code` and the substrings. */
static void expect_dir_fail(const char *dir, ib_status code, const char *s1, const char *s2) {
    ib_st_set *s = NULL;
    ib_error err = {0};
    ib_status st = ib_st_open_dir(dir, &s, &err);
    CHECK(st == code, "%s: status %d, want %d; msg: %s", dir, st, code, err.msg);
    CHECK(s == NULL, "out not NULL on failure");
    if (s1) CHECK(contains(err.msg, s1), "msg lacks \"%s\": %s", s1, err.msg);
    if (s2) CHECK(contains(err.msg, s2), "msg lacks \"%s\": %s", s2, err.msg);
    if (st == IB_OK) ib_st_close(s);
}

/* Remove every file in dir (no subdirectories are made), then dir. */
static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_dir(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* ------------------------------------------------------------------ round trip */

static void test_round_trip(void) {
    const char *path = in_dir("rt.safetensors", 0);
    float w[2][3] = {{1.5f, -2.0f, 3.25f}, {0.0f, 1e-3f, -7.0f}}; /* [2][3] */
    uint16_t bias[5] = {0x3f80, 0x4000, 0xbf80, 0x0000, 0x7f80}; /* [5] bf16 */
    int8_t odd[3] = {-1, 2, -3};                                  /* [3] */
    int64_t scalar = -1234567890123LL;
    uint8_t nothing = 0;
    int64_t sw[2] = {2, 3}, sb[1] = {5}, so[1] = {3}, se[2] = {0, 4};

    ib_st_writer *wr = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_st_writer_create(&wr, &err), IB_OK);
    /* added out of name order on purpose */
    CHECK_EQ_INT(ib_st_writer_add(wr, "b.weight", IB_DT_F32, 2, sw, w, &err), IB_OK);
    CHECK_EQ_INT(ib_st_writer_add(wr, "z.odd", IB_DT_I8, 1, so, odd, &err), IB_OK);
    CHECK_EQ_INT(ib_st_writer_add(wr, "a.bias", IB_DT_BF16, 1, sb, bias, &err), IB_OK);
    CHECK_EQ_INT(ib_st_writer_add(wr, "c.empty", IB_DT_U8, 2, se, &nothing, &err), IB_OK);
    CHECK_EQ_INT(ib_st_writer_add(wr, "s.scalar", IB_DT_I64, 0, NULL, &scalar, &err), IB_OK);
    /* writer rejects a duplicate name, a negative dim, too many dims, a reserved name */
    int64_t neg[1] = {-2}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_EQ_INT(ib_st_writer_add(wr, "a.bias", IB_DT_BF16, 1, sb, bias, &err), IB_ERR_INVALID_ARG);
    CHECK(contains(err.msg, "a.bias"), "%s", err.msg);
    CHECK_EQ_INT(ib_st_writer_add(wr, "neg", IB_DT_F32, 1, neg, w, &err), IB_ERR_INVALID_ARG);
    CHECK_EQ_INT(ib_st_writer_add(wr, "nine", IB_DT_F32, 9, nine, w, &err), IB_ERR_INVALID_ARG);
    CHECK_EQ_INT(ib_st_writer_add(wr, "__metadata__", IB_DT_F32, 1, sb, w, &err), IB_ERR_INVALID_ARG);
    CHECK_EQ_INT(ib_st_writer_write(wr, path, &err), IB_OK);
    /* writing into a missing directory fails with IB_ERR_IO and leaves no .tmp */
    CHECK_EQ_INT(ib_st_writer_write(wr, "/tmp/ib_no_such_dir_x/y.safetensors", &err), IB_ERR_IO);
    CHECK(contains(err.msg, "/tmp/ib_no_such_dir_x/y.safetensors"), "%s", err.msg);
    ib_st_writer_free(wr);

    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(file_size(tmp) < 0, "tmp file left behind");

    /* the raw bytes: header length multiple of 8, metadata, names in sorted order */
    FILE *f = fopen(path, "rb");
    unsigned char le[8];
    CHECK(f && fread(le, 1, 8, f) == 8, "read header length");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | le[i];
    CHECK(n % 8 == 0 && n > 0 && n < 4096, "header length %llu", (unsigned long long)n);
    char *hdr = calloc(1, n + 1);
    CHECK(fread(hdr, 1, n, f) == n, "read header");
    fclose(f);
    CHECK(contains(hdr, "\"__metadata__\":{\"format\":\"mlx\"}"), "%s", hdr);
    const char *pa = strstr(hdr, "\"a.bias\""), *pb = strstr(hdr, "\"b.weight\""),
               *pc = strstr(hdr, "\"c.empty\""), *ps = strstr(hdr, "\"s.scalar\""),
               *pz = strstr(hdr, "\"z.odd\"");
    CHECK(pa && pb && pc && ps && pz && pa < pb && pb < pc && pc < ps && ps < pz, "order: %s", hdr);
    /* data layout by hand: a.bias [0,10) pad->16; b.weight [16,40); c.empty [40,40);
     * s.scalar [40,48); z.odd [48,51) */
    CHECK(contains(hdr, "\"a.bias\":{\"data_offsets\":[0,10],\"dtype\":\"BF16\",\"shape\":[5]}"), "%s",
          hdr);
    CHECK(contains(hdr, "\"b.weight\":{\"data_offsets\":[10,34],\"dtype\":\"F32\",\"shape\":[2,3]}"),
          "%s", hdr);
    CHECK(contains(hdr, "\"c.empty\":{\"data_offsets\":[34,34],\"dtype\":\"U8\",\"shape\":[0,4]}"),
          "%s", hdr);
    CHECK(contains(hdr, "\"s.scalar\":{\"data_offsets\":[34,42],\"dtype\":\"I64\",\"shape\":[]}"),
          "%s", hdr);
    CHECK(contains(hdr, "\"z.odd\":{\"data_offsets\":[42,45],\"dtype\":\"I8\",\"shape\":[3]}"), "%s",
          hdr);
    CHECK(hdr[n - 1] == ' ' || hdr[n - 1] == '}', "padding: '%c'", hdr[n - 1]);
    free(hdr);
    CHECK_EQ_INT(file_size(path), (long)(8 + n + 45)); /* data end to end: no padding */

    ib_st_set *s = NULL;
    CHECK_EQ_INT(ib_st_open_file(path, &s, &err), IB_OK);
    if (!s) return;
    CHECK_EQ_INT(ib_st_count(s), 5);
    const char *names[5] = {"a.bias", "b.weight", "c.empty", "s.scalar", "z.odd"};
    for (int i = 0; i < 5; i++) CHECK(!strcmp(ib_st_at(s, i)->name, names[i]), "at %d", i);
    CHECK(ib_st_at(s, 5) == NULL && ib_st_at(s, -1) == NULL, "at out of range");
    CHECK(!strcmp(ib_st_file_path(s, 0), path), "file path");
    CHECK(ib_st_file_path(s, 1) == NULL, "file 1");
    CHECK_EQ_INT(ib_st_total_bytes(s), file_size(path));

    const ib_st_tensor *t = ib_st_find(s, "b.weight");
    CHECK(t && t->dtype == IB_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
              t->nbytes == 24 && !memcmp(t->data, w, 24) && t->file == 0,
          "b.weight");
    t = ib_st_find(s, "a.bias");
    CHECK(t && t->dtype == IB_DT_BF16 && t->ndim == 1 && t->shape[0] == 5 && t->nbytes == 10 &&
              !memcmp(t->data, bias, 10),
          "a.bias");
    t = ib_st_find(s, "z.odd");
    CHECK(t && t->dtype == IB_DT_I8 && t->nbytes == 3 && !memcmp(t->data, odd, 3), "z.odd");
    t = ib_st_find(s, "c.empty");
    CHECK(t && t->dtype == IB_DT_U8 && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 4 &&
              t->nbytes == 0,
          "c.empty");
    t = ib_st_find(s, "s.scalar");
    int64_t sv = 0;
    if (t) memcpy(&sv, t->data, 8);
    CHECK(t && t->dtype == IB_DT_I64 && t->ndim == 0 && t->nbytes == 8 && sv == scalar, "scalar");
    CHECK(ib_st_find(s, "b.weigh") == NULL && ib_st_find(s, "zz") == NULL &&
              ib_st_find(s, "") == NULL,
          "absent names");

    /* ib_st_expect */
    const ib_st_tensor *got = NULL;
    ib_dtype f32bf16[2] = {IB_DT_F32, IB_DT_BF16}, f16bf16[2] = {IB_DT_F16, IB_DT_BF16};
    int64_t want[2] = {2, 3}, wild[2] = {-1, 3}, wrong[2] = {4, 3};
    CHECK_EQ_INT(ib_st_expect(s, "b.weight", f32bf16, 2, 2, want, &got, &err), IB_OK);
    CHECK(got == ib_st_find(s, "b.weight"), "expect out");
    CHECK_EQ_INT(ib_st_expect(s, "b.weight", f32bf16, 2, 2, wild, NULL, &err), IB_OK);
    CHECK_EQ_INT(ib_st_expect(s, "b.weight", NULL, 0, -1, NULL, NULL, &err), IB_OK);
    CHECK_EQ_INT(ib_st_expect(s, "model.layers.0.mlp.up_proj.weight", f32bf16, 2, 2, want, &got, &err),
                 IB_ERR_MODEL);
    CHECK(got == NULL, "out NULL on failure");
    CHECK(contains(err.msg, path) &&
              contains(err.msg, "tensor model.layers.0.mlp.up_proj.weight: missing"),
          "%s", err.msg);
    CHECK_EQ_INT(ib_st_expect(s, "b.weight", f16bf16, 2, 2, want, NULL, &err), IB_ERR_MODEL);
    CHECK(contains(err.msg, path) && contains(err.msg, "tensor b.weight: dtype F32, expected F16 or BF16"),
          "%s", err.msg);
    CHECK_EQ_INT(ib_st_expect(s, "b.weight", f32bf16, 2, 2, wrong, NULL, &err), IB_ERR_MODEL);
    CHECK(contains(err.msg, path) && contains(err.msg, "tensor b.weight: shape [2,3], expected [4,3]"),
          "%s", err.msg);
    CHECK_EQ_INT(ib_st_expect(s, "b.weight", f32bf16, 2, 1, want, NULL, &err), IB_ERR_MODEL);
    CHECK(contains(err.msg, "shape [2,3], expected [2]"), "%s", err.msg);
    ib_st_close(s);

    /* open_dir with a single model.safetensors */
    CHECK_EQ_INT(rename(path, in_dir("model.safetensors", 1)), 0);
    s = NULL;
    CHECK_EQ_INT(ib_st_open_dir(g_dir, &s, &err), IB_OK);
    CHECK_EQ_INT(ib_st_count(s), 5);
    t = ib_st_find(s, "b.weight");
    CHECK(t && !memcmp(t->data, w, 24), "dir b.weight");
    ib_st_close(s);
    unlink(in_dir("model.safetensors", 1));
}

/* A valid hand-made file with unaligned offsets, metadata and a zero-size tensor sharing an offset. */
static void test_raw_valid(void) {
    const char *p = in_dir("raw_ok.safetensors", 0);
    write_raw(p,
              "{\"__metadata__\":{\"k\":\"v\"},\"h\":{\"dtype\":\"F16\",\"shape\":[3],"
              "\"data_offsets\":[1,7]},\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[3,3]},"
              "\"b\":{\"dtype\":\"BOOL\",\"shape\":[1,1],\"data_offsets\":[7,8]},"
              "\"u0\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
              "\"u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[8,9]}}",
              9);
    ib_st_set *s = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_st_open_file(p, &s, &err), IB_OK);
    CHECK_EQ_INT(ib_st_count(s), 5);
    const ib_st_tensor *t = ib_st_find(s, "h");
    unsigned char want[6] = {1, 2, 3, 4, 5, 6}; /* data byte i is i */
    CHECK(t && t->dtype == IB_DT_F16 && t->nbytes == 6 && !memcmp(t->data, want, 6), "h");
    t = ib_st_find(s, "b");
    CHECK(t && t->dtype == IB_DT_BOOL && t->nbytes == 1 && *(const unsigned char *)t->data == 7, "b");
    ib_st_close(s);
    unlink(p);
}

/* ------------------------------------------------------------------ malformed files */

static void test_bad_files(void) {
    char msg[128];
    const char *p = in_dir("bad.safetensors", 0);

    expect_open_fail(in_dir("does_not_exist.safetensors", 1), IB_ERR_IO, "cannot open", NULL, NULL);

    write_bytes(p, "\x05\0\0\0\0", 5);
    expect_open_fail(p, IB_ERR_FORMAT, "5 bytes", "shorter than", NULL);
    write_bytes(p, "", 0);
    expect_open_fail(p, IB_ERR_FORMAT, "0 bytes", NULL, NULL);

    /* header length past EOF: 8 + 20 + 100 bytes in the file */
    write_raw_n(p, 999999, "{                   }", 100);
    snprintf(msg, sizeof msg, "size %ld", file_size(p));
    expect_open_fail(p, IB_ERR_FORMAT, "header length 999999 at byte 0 runs past end of file", msg, NULL);
    write_raw_n(p, UINT64_MAX, "{}", 0);
    expect_open_fail(p, IB_ERR_FORMAT, "header length 18446744073709551615", "past end", NULL);

    /* header length over the 100 MiB limit, inside a (sparse) 120 MiB file */
    {
        unsigned char le[8];
        uint64_t big = (uint64_t)110 << 20;
        for (int i = 0; i < 8; i++) le[i] = (unsigned char)(big >> (8 * i));
        write_bytes(p, le, 8);
        CHECK_EQ_INT(truncate(p, (off_t)120 << 20), 0);
        expect_open_fail(p, IB_ERR_FORMAT, "header length 115343360", "limit", NULL);
    }

    write_raw(p, "{\"a\": {\"dtype\": ", 16);
    expect_open_fail(p, IB_ERR_FORMAT, "header JSON", "line 1", NULL);
    write_raw(p, "not json at all", 0);
    expect_open_fail(p, IB_ERR_FORMAT, "header JSON", NULL, NULL);
    write_raw(p, "[1, 2]", 0);
    expect_open_fail(p, IB_ERR_FORMAT, "not a JSON object", NULL, NULL);
    /* the JSON must end at the header length: trailing garbage inside it is an error */
    write_raw(p, "{} x", 0);
    expect_open_fail(p, IB_ERR_FORMAT, "header JSON", NULL, NULL);
    /* duplicate key inside one header */
    write_raw(p,
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
              "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
              2);
    expect_open_fail(p, IB_ERR_FORMAT, "duplicate", NULL, NULL);

    write_raw(p, "{\"x\": 5}", 0);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x: expected an object", NULL, NULL);
    write_raw(p, "{\"x\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "dtype: missing", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "shape: missing", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "data_offsets: missing", NULL);

    write_raw(p, "{\"x\": {\"dtype\": \"Q9\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x: dtype \"Q9\" unknown", NULL, NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"f32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x: dtype \"f32\" unknown", NULL, NULL);
    write_raw(p, "{\"x\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "dtype: expected a string", NULL);

    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "shape[1]", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1.0], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "shape[0]", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "shape[0]", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "shape: expected an array", NULL);
    write_raw(p,
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}",
              4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "9 dimensions", NULL);
    /* prod(shape) * 4 overflows 64 bits */
    write_raw(p,
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
              "\"data_offsets\": [0, 4]}}",
              4);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "overflow", NULL);

    write_raw(p, "{\"model.norm.weight\": {\"dtype\": \"U8\", \"shape\": [1990], \"data_offsets\": [10, 2000]}}",
              1500);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor model.norm.weight: data_offsets [10, 2000] past data end 1500",
                     NULL, NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [20, 10]}}", 30);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "data_offsets [20, 10]", "begin is after end");
    write_raw(p, "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0]}}", 30);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "data_offsets: expected", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [-1, 0]}}", 30);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "data_offsets: expected", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0.0, 1]}}", 30);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "data_offsets: expected", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": {}}}", 30);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "data_offsets: expected", NULL);

    /* byte size != prod(shape) * dtype size: [2,3] F32 = 24 bytes, offsets give 20 */
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24);
    expect_open_fail(p, IB_ERR_FORMAT, "tensor x", "hold 20 bytes", "needs 24");

    /* overlap: a = [0,128), b = [64,192) */
    write_raw(p,
              "{\"b\": {\"dtype\": \"F32\", \"shape\": [32], \"data_offsets\": [64, 192]},"
              " \"a\": {\"dtype\": \"F32\", \"shape\": [32], \"data_offsets\": [0, 128]}}",
              192);
    expect_open_fail(p, IB_ERR_FORMAT, "tensors a and b overlap at data byte 64", NULL, NULL);
    /* overlap hidden behind a short tensor: big = [0,100), small = [10,12), late = [50,60) */
    write_raw(p,
              "{\"big\": {\"dtype\": \"U8\", \"shape\": [100], \"data_offsets\": [0, 100]},"
              " \"small\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [10, 12]},"
              " \"late\": {\"dtype\": \"U8\", \"shape\": [10], \"data_offsets\": [50, 60]}}",
              100);
    expect_open_fail(p, IB_ERR_FORMAT, "tensors big and small overlap at data byte 10", NULL, NULL);
    /* identical ranges */
    write_raw(p,
              "{\"p\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]},"
              " \"q\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]}}",
              8);
    expect_open_fail(p, IB_ERR_FORMAT, "tensors p and q overlap at data byte 4", NULL, NULL);
    /* adjacent ranges are fine */
    write_raw(p,
              "{\"p\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
              " \"q\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]}}",
              8);
    {
        ib_st_set *s = NULL;
        ib_error err = {0};
        CHECK_EQ_INT(ib_st_open_file(p, &s, &err), IB_OK);
        CHECK_EQ_INT(ib_st_count(s), 2);
        ib_st_close(s);
    }
    unlink(p);
}

/* ------------------------------------------------------------------ shards */

/* Write a shard with U8 tensors named in `names` (each [k+1] bytes filled with k+base). */
static void write_shard(const char *path, const char *const *names, int n, int base) {
    ib_st_writer *w = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_st_writer_create(&w, &err), IB_OK);
    for (int k = 0; k < n; k++) {
        unsigned char buf[16];
        memset(buf, k + base, sizeof buf);
        int64_t shape[1] = {k + 1};
        CHECK_EQ_INT(ib_st_writer_add(w, names[k], IB_DT_U8, 1, shape, buf, &err), IB_OK);
    }
    CHECK_EQ_INT(ib_st_writer_write(w, path, &err), IB_OK);
    ib_st_writer_free(w);
}

static void test_shards(void) {
    char sub[600];
    snprintf(sub, sizeof sub, "%s/sharded", g_dir);
    CHECK_EQ_INT(mkdir(sub, 0700), 0);
    char p1[700], p2[700], idx[700];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", sub);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", sub);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", sub);
    const char *n1[2] = {"x.a", "x.b"}, *n2[1] = {"y.c"};
    write_shard(p1, n1, 2, 10);
    write_shard(p2, n2, 1, 20);

    /* neither file present yet */
    char empty[600];
    snprintf(empty, sizeof empty, "%s/empty", g_dir);
    CHECK_EQ_INT(mkdir(empty, 0700), 0);
    expect_dir_fail(empty, IB_ERR_IO, empty, "no model.safetensors or model.safetensors.index.json");

    write_text(idx,
               "{\"metadata\": {\"total_size\": 6}, \"weight_map\": {"
               "\"x.a\": \"model-00001-of-00002.safetensors\","
               "\"y.c\": \"model-00002-of-00002.safetensors\","
               "\"x.b\": \"model-00001-of-00002.safetensors\"}}");
    ib_st_set *s = NULL;
    ib_error err = {0};
    CHECK_EQ_INT(ib_st_open_dir(sub, &s, &err), IB_OK);
    if (s) {
        CHECK_EQ_INT(ib_st_count(s), 3);
        CHECK_EQ_INT(ib_st_total_bytes(s), file_size(p1) + file_size(p2));
        const ib_st_tensor *a = ib_st_find(s, "x.a"), *b = ib_st_find(s, "x.b"),
                           *c = ib_st_find(s, "y.c");
        CHECK(a && a->nbytes == 1 && ((const unsigned char *)a->data)[0] == 10, "x.a");
        CHECK(b && b->nbytes == 2 && ((const unsigned char *)b->data)[1] == 11, "x.b");
        CHECK(c && c->nbytes == 1 && ((const unsigned char *)c->data)[0] == 20, "y.c");
        CHECK(a && c && !strcmp(ib_st_file_path(s, a->file), p1) &&
                  !strcmp(ib_st_file_path(s, c->file), p2),
              "files");
        /* a missing tensor is reported against the index */
        CHECK_EQ_INT(ib_st_expect(s, "nope", NULL, 0, -1, NULL, NULL, &err), IB_ERR_MODEL);
        CHECK(contains(err.msg, idx) && contains(err.msg, "tensor nope: missing"), "%s", err.msg);
        /* dtype mismatch is reported against the shard holding the tensor */
        ib_dtype f32 = IB_DT_F32;
        CHECK_EQ_INT(ib_st_expect(s, "y.c", &f32, 1, -1, NULL, NULL, &err), IB_ERR_MODEL);
        CHECK(contains(err.msg, p2) && contains(err.msg, "tensor y.c: dtype U8, expected F32"), "%s",
              err.msg);
        ib_st_close(s);
    }

    /* index names a shard that does not exist */
    write_text(idx, "{\"weight_map\": {\"x.a\": \"model-00001-of-00002.safetensors\","
                    "\"y.c\": \"model-00003-of-00002.safetensors\"}}");
    expect_dir_fail(sub, IB_ERR_IO, "model-00003-of-00002.safetensors", "cannot open");

    /* index names a tensor absent from its shard */
    write_text(idx, "{\"weight_map\": {\"x.a\": \"model-00001-of-00002.safetensors\","
                    "\"x.zzz\": \"model-00001-of-00002.safetensors\"}}");
    expect_dir_fail(sub, IB_ERR_MODEL, "tensor x.zzz: not found in shard model-00001-of-00002.safetensors",
                    idx);

    /* index names the wrong shard for a tensor */
    write_text(idx, "{\"weight_map\": {\"x.a\": \"model-00002-of-00002.safetensors\","
                    "\"y.c\": \"model-00001-of-00002.safetensors\"}}");
    expect_dir_fail(sub, IB_ERR_MODEL, "index names shard", "tensor ");

    /* shard file names must be plain */
    write_text(idx, "{\"weight_map\": {\"x.a\": \"../model-00001-of-00002.safetensors\"}}");
    expect_dir_fail(sub, IB_ERR_FORMAT, "\"../model-00001-of-00002.safetensors\"", "tensor x.a");
    write_text(idx, "{\"weight_map\": {\"x.a\": \"..\"}}");
    expect_dir_fail(sub, IB_ERR_FORMAT, "not a plain file name", NULL);
    write_text(idx, "{\"weight_map\": {\"x.a\": \"/etc/passwd\"}}");
    expect_dir_fail(sub, IB_ERR_FORMAT, "not a plain file name", NULL);
    write_text(idx, "{\"weight_map\": {\"x.a\": 3}}");
    expect_dir_fail(sub, IB_ERR_FORMAT, "tensor x.a", "expected a file name");

    /* malformed index */
    write_text(idx, "{\"weight_map\": {\"x.a\": ");
    expect_dir_fail(sub, IB_ERR_FORMAT, idx, "not valid JSON");
    write_text(idx, "{\"metadata\": {}}");
    expect_dir_fail(sub, IB_ERR_FORMAT, idx, "weight_map: missing");
    write_text(idx, "{\"weight_map\": []}");
    expect_dir_fail(sub, IB_ERR_FORMAT, idx, "weight_map: expected an object");
    write_text(idx, "[]");
    expect_dir_fail(sub, IB_ERR_FORMAT, idx, "expected a JSON object");

    /* the same tensor in two shards */
    const char *n2dup[2] = {"x.a", "y.c"};
    write_shard(p2, n2dup, 2, 30);
    write_text(idx, "{\"weight_map\": {\"x.a\": \"model-00001-of-00002.safetensors\","
                    "\"y.c\": \"model-00002-of-00002.safetensors\"}}");
    expect_dir_fail(sub, IB_ERR_FORMAT, "tensor x.a", "present in both");

    /* a bad shard is reported with its own path */
    write_raw(p2, "{\"y.c\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 9]}}", 1);
    expect_dir_fail(sub, IB_ERR_FORMAT, p2, "tensor y.c: data_offsets [0, 9] past data end 1");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ib_test_st_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_round_trip();
    test_raw_valid();
    test_bad_files();
    test_shards();
    rm_dir(g_dir);
    struct stat sb;
    CHECK(stat(g_dir, &sb) != 0, "temp dir removed");
    TEST_MAIN_END("test_safetensors");
}
