/*
 * safetensors.c — read-only memory-mapped safetensors files (one file or index + shards) and a
 * writer for them. See safetensors.h for the contracts.
 *
 * Layout facts used here: bytes [0, 8) hold the header length N as a little-endian u64; bytes
 * [8, 8+N) hold a UTF-8 JSON object; the data region starts at byte 8+N and each tensor's
 * "data_offsets" [begin, end) are relative to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "model/safetensors.h"

/* Largest JSON header accepted (100 MiB); real headers are well under 10 MiB. */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
/* Most tensors one file may declare (real checkpoints hold a few thousand per shard). */
#define ST_MAX_TENSORS 100000

static const struct {
    const char *name;
    size_t size;
} dtype_info[IB_DT_COUNT] = {
    [IB_DT_F32] = {"F32", 4},  [IB_DT_F16] = {"F16", 2}, [IB_DT_BF16] = {"BF16", 2},
    [IB_DT_F64] = {"F64", 8},  [IB_DT_U32] = {"U32", 4}, [IB_DT_I32] = {"I32", 4},
    [IB_DT_U8] = {"U8", 1},    [IB_DT_I8] = {"I8", 1},   [IB_DT_U16] = {"U16", 2},
    [IB_DT_I16] = {"I16", 2},  [IB_DT_I64] = {"I64", 8}, [IB_DT_U64] = {"U64", 8},
    [IB_DT_BOOL] = {"BOOL", 1},
};

size_t ib_dtype_size(ib_dtype t) {
    return (unsigned)t < IB_DT_COUNT ? dtype_info[t].size : 0;
}

const char *ib_dtype_name(ib_dtype t) {
    return (unsigned)t < IB_DT_COUNT ? dtype_info[t].name : "?";
}

/* The dtype whose header name is `s`; -1 when none. */
static int dtype_from_name(const char *s) {
    for (int i = 0; i < IB_DT_COUNT; i++)
        if (strcmp(s, dtype_info[i].name) == 0) return i;
    return -1;
}

/* Byte count of prod(shape) elements of `elsize` bytes into *out; 0 on overflow of size_t.
 * A zero dimension gives 0 bytes whatever the other dimensions are. */
static int shape_bytes(int ndim, const int64_t *shape, size_t elsize, size_t *out) {
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) {
            *out = 0;
            return 1;
        }
    uint64_t n = elsize;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (n > UINT64_MAX / d) return 0;
        n *= d;
    }
    if (n > SIZE_MAX) return 0;
    *out = (size_t)n;
    return 1;
}

/* ------------------------------------------------------------------ the set */

typedef struct st_file {
    char *path;
    unsigned char *map; /* [size] read-only mapping of the whole file */
    size_t size;
} st_file;

struct ib_st_set {
    st_file *files; /* [n_files] */
    int n_files;
    ib_st_tensor *tensors; /* [n_tensors], sorted by name once the set is complete */
    int n_tensors, cap_tensors;
    char *origin; /* what "tensor X: missing" messages name: the file or the index */
    size_t total_bytes;
    unsigned char *used; /* [n_tensors] set by ib_st_expect (name order), for ib_st_check_used */
};

void ib_st_close(ib_st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
        free(s->files[i].path);
    }
    for (int i = 0; i < s->n_tensors; i++) free(s->tensors[i].name);
    free(s->files);
    free(s->tensors);
    free(s->origin);
    free(s->used);
    free(s);
}

int ib_st_count(const ib_st_set *s) { return s ? s->n_tensors : 0; }

const ib_st_tensor *ib_st_at(const ib_st_set *s, int i) {
    if (!s || i < 0 || i >= s->n_tensors) return NULL;
    return &s->tensors[i];
}

const char *ib_st_file_path(const ib_st_set *s, int file) {
    if (!s || file < 0 || file >= s->n_files) return NULL;
    return s->files[file].path;
}

size_t ib_st_total_bytes(const ib_st_set *s) { return s ? s->total_bytes : 0; }

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const ib_st_tensor *)a)->name, ((const ib_st_tensor *)b)->name);
}

/* Binary search over the name-sorted tensors; NULL when absent. */
const ib_st_tensor *ib_st_find(const ib_st_set *s, const char *name) {
    if (!s || !name) return NULL;
    int lo = 0, hi = s->n_tensors;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(s->tensors[mid].name, name);
        if (c == 0) return &s->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* An empty set whose messages name `origin`; NULL when out of memory. */
static ib_st_set *set_new(const char *origin) {
    ib_st_set *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->origin = strdup(origin);
    if (!s->origin) {
        free(s);
        return NULL;
    }
    return s;
}

/* "dir/name" in a new string (no doubled '/'); NULL when out of memory. */
static char *path_join(const char *dir, const char *name) {
    size_t dl = strlen(dir), nl = strlen(name);
    int slash = dl > 0 && dir[dl - 1] != '/';
    char *p = malloc(dl + (size_t)slash + nl + 1);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (slash) p[dl] = '/';
    memcpy(p + dl + (size_t)slash, name, nl + 1);
    return p;
}

/* A tensor's byte range in its file's data region, for the overlap check. */
typedef struct st_span {
    uint64_t begin, end;
    const char *name;
} st_span;

static int cmp_span(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Read a JSON integer field that must be >= 0 into *out; 0 when it is not one. */
static int json_nonneg(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < 0) return 0;
    *out = (uint64_t)x;
    return 1;
}

/* Validate one header entry `key` -> `val` of file `path` (data region of `data_size` bytes) and
 * fill *t (name not set) and its [begin, end) span. */
static ib_status parse_entry(const char *path, const char *key, json_t *val, uint64_t data_size,
                             ib_st_tensor *t, uint64_t *begin, uint64_t *end, ib_error *err) {
    if (!json_is_object(val))
        return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: expected an object", path, key);

    json_t *jd = json_object_get(val, "dtype");
    if (!jd) return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: field dtype: missing", path, key);
    if (!json_is_string(jd))
        return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: field dtype: expected a string", path, key);
    int dt = dtype_from_name(json_string_value(jd));
    if (dt < 0)
        return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: dtype \"%s\" unknown", path, key,
                       json_string_value(jd));
    t->dtype = (ib_dtype)dt;

    json_t *js = json_object_get(val, "shape");
    if (!js) return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: field shape: missing", path, key);
    if (!json_is_array(js))
        return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: field shape: expected an array", path, key);
    size_t nd = json_array_size(js);
    if (nd > IB_ST_MAX_DIMS)
        return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: field shape: %zu dimensions, at most %d",
                       path, key, nd, IB_ST_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_nonneg(json_array_get(js, i), &d) || d > (uint64_t)INT64_MAX)
            return ib_fail(err, IB_ERR_FORMAT,
                           "%s: tensor %s: field shape[%zu]: expected a non-negative integer", path,
                           key, i);
        t->shape[i] = (int64_t)d;
    }

    json_t *jo = json_object_get(val, "data_offsets");
    if (!jo)
        return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: field data_offsets: missing", path, key);
    uint64_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_nonneg(json_array_get(jo, 0), &b) ||
        !json_nonneg(json_array_get(jo, 1), &e))
        return ib_fail(err, IB_ERR_FORMAT,
                       "%s: tensor %s: field data_offsets: expected [begin, end], two non-negative "
                       "integers",
                       path, key);
    if (b > e)
        return ib_fail(err, IB_ERR_FORMAT,
                       "%s: tensor %s: data_offsets [%llu, %llu]: begin is after end", path, key,
                       (unsigned long long)b, (unsigned long long)e);
    if (e > data_size)
        return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] past data end %llu",
                       path, key, (unsigned long long)b, (unsigned long long)e,
                       (unsigned long long)data_size);
    size_t need;
    if (!shape_bytes(t->ndim, t->shape, ib_dtype_size(t->dtype), &need))
        return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: field shape: byte size overflows", path,
                       key);
    if ((uint64_t)need != e - b)
        return ib_fail(err, IB_ERR_FORMAT,
                       "%s: tensor %s: data_offsets [%llu, %llu] hold %llu bytes but shape of %s "
                       "needs %zu",
                       path, key, (unsigned long long)b, (unsigned long long)e,
                       (unsigned long long)(e - b), dtype_info[t->dtype].name, need);
    t->nbytes = need;
    *begin = b;
    *end = e;
    return IB_OK;
}

/* Map `path`, validate its header and append the file and its tensors to s. On failure s may hold
 * part of the file (owned, released by ib_st_close); the caller discards s. */
static ib_status append_file(ib_st_set *s, const char *path, ib_error *err) {
    ib_status st;
    json_t *root = NULL;
    st_span *spans = NULL;
    int fd = -1;

    st_file *nf = realloc(s->files, sizeof *nf * (size_t)(s->n_files + 1));
    if (!nf) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    s->files = nf;
    st_file *f = &s->files[s->n_files];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    int file_index = s->n_files++;
    const char *p = f->path;

    /* O_NONBLOCK: a FIFO (or device) named as a shard must not block open(); it is refused below */
    fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot stat: %s", p, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = ib_fail(err, IB_ERR_IO, "%s: not a regular file", p);
        goto fail;
    }
    if (sb.st_size < 8) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: file is %lld bytes, shorter than the 8-byte header length",
                     p, (long long)sb.st_size);
        goto fail;
    }
    if ((unsigned long long)sb.st_size > SIZE_MAX) {
        st = ib_fail(err, IB_ERR_IO, "%s: file too large to map", p);
        goto fail;
    }
    size_t size = (size_t)sb.st_size;
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot map %zu bytes: %s", p, size, strerror(errno));
        goto fail;
    }
    f->map = m;
    f->size = size;
    s->total_bytes += size;
    close(fd);
    fd = -1;

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->map[i];
    if (n > size - 8) {
        st = ib_fail(err, IB_ERR_FORMAT,
                     "%s: header length %llu at byte 0 runs past end of file (size %zu)", p,
                     (unsigned long long)n, size);
        goto fail;
    }
    if (n > ST_MAX_HEADER) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: header length %llu at byte 0 exceeds the %llu-byte limit",
                     p, (unsigned long long)n, (unsigned long long)ST_MAX_HEADER);
        goto fail;
    }
    uint64_t data_size = size - 8 - n;
    const unsigned char *data = f->map + 8 + n;
    /* the tensor count, before parsing: every entry has a "data_offsets" key, so counting those
     * bounds it, and a header of a million empty tensors fails in milliseconds instead of seconds */
    size_t n_keys = 0;
    for (const unsigned char *q = f->map + 8, *qe = f->map + 8 + n; q + 12 <= qe; q++)
        if (*q == 'd' && !memcmp(q, "data_offsets", 12) && ++n_keys > ST_MAX_TENSORS) {
            st = ib_fail(err, IB_ERR_FORMAT, "%s: header holds more than %d tensors", p, ST_MAX_TENSORS);
            goto fail;
        }

    json_error_t jerr;
    root = json_loadb((const char *)f->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: header JSON at byte %lld (line %d, column %d): %s", p,
                     8 + (long long)jerr.position, jerr.line, jerr.column, jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: header at byte 8 is not a JSON object", p);
        goto fail;
    }

    size_t n_obj = json_object_size(root);
    if (n_obj > (size_t)(INT_MAX - s->n_tensors)) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: too many tensors (%zu)", p, n_obj);
        goto fail;
    }
    spans = malloc(sizeof *spans * (n_obj ? n_obj : 1));
    if (!spans) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory for %zu tensors", p, n_obj);
        goto fail;
    }
    if (s->n_tensors + (int)n_obj > s->cap_tensors) {
        int cap = s->n_tensors + (int)n_obj;
        ib_st_tensor *nt = realloc(s->tensors, sizeof *nt * (size_t)cap);
        if (!nt) {
            st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory for %zu tensors", p, n_obj);
            goto fail;
        }
        s->tensors = nt;
        s->cap_tensors = cap;
    }

    int n_spans = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        ib_st_tensor t;
        memset(&t, 0, sizeof t);
        uint64_t b = 0, e = 0;
        st = parse_entry(p, key, val, data_size, &t, &b, &e, err);
        if (st) goto fail;
        t.name = strdup(key);
        if (!t.name) {
            st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", p);
            goto fail;
        }
        t.data = data + b;
        t.file = file_index;
        s->tensors[s->n_tensors++] = t;
        spans[n_spans++] = (st_span){b, e, s->tensors[s->n_tensors - 1].name};
    }

    /* overlap: in begin order, a non-empty tensor must start at or after the furthest end so far;
     * and, as the format requires, the tensors tile the data section: no hole between two of them,
     * nothing after the last (bytes that no tensor describes are a damaged or doctored file) */
    if (n_spans > 1) qsort(spans, (size_t)n_spans, sizeof *spans, cmp_span);
    uint64_t max_end = 0;
    const char *max_name = NULL;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (max_name && spans[i].begin < max_end) {
            st = ib_fail(err, IB_ERR_FORMAT, "%s: tensors %s and %s overlap at data byte %llu", p,
                         max_name, spans[i].name, (unsigned long long)spans[i].begin);
            goto fail;
        }
        if (spans[i].end > max_end || !max_name) {
            max_end = spans[i].end;
            max_name = spans[i].name;
        }
    }
    max_end = 0;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (spans[i].begin > max_end) {
            st = ib_fail(err, IB_ERR_FORMAT, "%s: data bytes [%llu, %llu) before tensor %s belong to no tensor", p,
                         (unsigned long long)max_end, (unsigned long long)spans[i].begin, spans[i].name);
            goto fail;
        }
        if (spans[i].end > max_end) max_end = spans[i].end;
    }
    if (max_end != data_size) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: %llu trailing data bytes after the last tensor (data section %llu bytes)", p,
                     (unsigned long long)(data_size - max_end), (unsigned long long)data_size);
        goto fail;
    }

    free(spans);
    json_decref(root);
    return IB_OK;

fail:
    if (fd >= 0) close(fd);
    free(spans);
    json_decref(root);
    return st;
}

/* Sort s by name and reject a name present in two files. */
static ib_status set_finish(ib_st_set *s, ib_error *err) {
    if (s->n_tensors > 1) qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, cmp_tensor_name);
    if (!(s->used = calloc((size_t)s->n_tensors + 1, 1))) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", s->origin);
    for (int i = 1; i < s->n_tensors; i++)
        if (strcmp(s->tensors[i - 1].name, s->tensors[i].name) == 0)
            return ib_fail(err, IB_ERR_FORMAT, "%s: tensor %s: present in both %s and %s", s->origin,
                           s->tensors[i].name, s->files[s->tensors[i - 1].file].path,
                           s->files[s->tensors[i].file].path);
    return IB_OK;
}

ib_status ib_st_open_file(const char *path, ib_st_set **out, ib_error *err) {
    if (out) *out = NULL;
    if (!path || !out) return ib_fail(err, IB_ERR_INVALID_ARG, "ib_st_open_file: NULL argument");
    ib_status st;
    ib_st_set *s = set_new(path);
    if (!s) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
    if ((st = append_file(s, path, err)) != IB_OK) goto fail;
    if ((st = set_finish(s, err)) != IB_OK) goto fail;
    *out = s;
    return IB_OK;
fail:
    ib_st_close(s);
    return st;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name must be a plain file name in the model directory. */
static int plain_file_name(const char *s) {
    return s[0] != '\0' && strchr(s, '/') == NULL && strchr(s, '\\') == NULL && strcmp(s, ".") != 0 &&
           strcmp(s, "..") != 0;
}

/* Open the shards named by the index at idx (in directory dir). */
static ib_status open_index(const char *dir, const char *idx, ib_st_set **out, ib_error *err) {
    ib_status st;
    json_t *root = NULL;
    const char **names = NULL; /* [n_map] shard names, sorted, then made distinct */
    char *shard_path = NULL;
    ib_st_set *s = NULL;

    struct stat isb;
    if (stat(idx, &isb) == 0 && !S_ISREG(isb.st_mode)) return ib_fail(err, IB_ERR_IO, "%s: not a regular file", idx);
    FILE *fp = fopen(idx, "rb");
    if (!fp) return ib_fail(err, IB_ERR_IO, "%s: cannot open: %s", idx, strerror(errno));
    json_error_t jerr;
    root = json_loadf(fp, JSON_REJECT_DUPLICATES, &jerr);
    fclose(fp);
    if (!root)
        return ib_fail(err, IB_ERR_FORMAT, "%s: not valid JSON (line %d, column %d): %s", idx,
                       jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: expected a JSON object", idx);
        goto fail;
    }
    json_t *map = json_object_get(root, "weight_map");
    if (!map) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: field weight_map: missing", idx);
        goto fail;
    }
    if (!json_is_object(map)) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: field weight_map: expected an object", idx);
        goto fail;
    }
    size_t n_map = json_object_size(map);
    if (n_map == 0) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: field weight_map: empty", idx);
        goto fail;
    }
    names = malloc(sizeof *names * n_map);
    if (!names) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", idx);
        goto fail;
    }
    size_t k = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        if (!json_is_string(val)) {
            st = ib_fail(err, IB_ERR_FORMAT, "%s: weight_map: tensor %s: expected a file name string",
                         idx, key);
            goto fail;
        }
        const char *fn = json_string_value(val);
        if (!plain_file_name(fn)) {
            st = ib_fail(err, IB_ERR_FORMAT,
                         "%s: weight_map: tensor %s: shard \"%s\" is not a plain file name", idx, key,
                         fn);
            goto fail;
        }
        names[k++] = fn;
    }
    qsort(names, n_map, sizeof *names, cmp_str_ptr);
    size_t n_shards = 0;
    for (size_t i = 0; i < n_map; i++)
        if (n_shards == 0 || strcmp(names[n_shards - 1], names[i]) != 0) names[n_shards++] = names[i];
    if (n_shards > INT_MAX) {
        st = ib_fail(err, IB_ERR_FORMAT, "%s: too many shards", idx);
        goto fail;
    }

    s = set_new(idx);
    if (!s) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", idx);
        goto fail;
    }
    /* file i of the set is names[i] */
    for (size_t i = 0; i < n_shards; i++) {
        shard_path = path_join(dir, names[i]);
        if (!shard_path) {
            st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", idx);
            goto fail;
        }
        if ((st = append_file(s, shard_path, err)) != IB_OK) goto fail;
        free(shard_path);
        shard_path = NULL;
    }
    if ((st = set_finish(s, err)) != IB_OK) goto fail;

    json_object_foreach(map, key, val) {
        const char *fn = json_string_value(val);
        const char **hit = bsearch(&fn, names, n_shards, sizeof *names, cmp_str_ptr);
        int want = (int)(hit - names);
        const ib_st_tensor *t = ib_st_find(s, key);
        if (!t) {
            st = ib_fail(err, IB_ERR_MODEL, "%s: tensor %s: not found in shard %s", idx, key, fn);
            goto fail;
        }
        if (t->file != want) {
            st = ib_fail(err, IB_ERR_MODEL, "%s: tensor %s: index names shard %s but it is in %s", idx,
                         key, fn, s->files[t->file].path);
            goto fail;
        }
    }

    free(names);
    json_decref(root);
    *out = s;
    return IB_OK;

fail:
    free(shard_path);
    ib_st_close(s);
    free(names);
    json_decref(root);
    return st;
}

ib_status ib_st_open_dir(const char *dir, ib_st_set **out, ib_error *err) {
    if (out) *out = NULL;
    if (!dir || !out) return ib_fail(err, IB_ERR_INVALID_ARG, "ib_st_open_dir: NULL argument");
    ib_status st;
    struct stat sb;
    char *idx = path_join(dir, "model.safetensors.index.json");
    char *single = path_join(dir, "model.safetensors");
    if (!idx || !single) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    if (stat(idx, &sb) == 0) {
        st = open_index(dir, idx, out, err);
        goto done;
    }
    if (errno != ENOENT) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot stat: %s", idx, strerror(errno));
        goto done;
    }
    if (stat(single, &sb) != 0 && errno == ENOENT) {
        st = ib_fail(err, IB_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
        goto done;
    }
    st = ib_st_open_file(single, out, err);
done:
    free(idx);
    free(single);
    return st;
}

/* Append "[a,b,c]" (a -1 entry as "*") to buf of cap bytes. */
static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, cap - at, "[");
    for (int i = 0; i < ndim && at < cap; i++) {
        if (shape[i] < 0)
            at += (size_t)snprintf(buf + at, cap - at, "%s*", i ? "," : "");
        else
            at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? "," : "", (long long)shape[i]);
    }
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

ib_status ib_st_expect(const ib_st_set *s, const char *name, const ib_dtype *dtypes, int n_dtypes,
                       int ndim, const int64_t *shape, const ib_st_tensor **out, ib_error *err) {
    if (out) *out = NULL;
    if (!s || !name || (n_dtypes > 0 && !dtypes) || ndim > IB_ST_MAX_DIMS || (ndim > 0 && !shape))
        return ib_fail(err, IB_ERR_INVALID_ARG, "ib_st_expect: invalid argument");
    const ib_st_tensor *t = ib_st_find(s, name);
    if (!t) return ib_fail(err, IB_ERR_MODEL, "%s: tensor %s: missing", s->origin, name);
    const char *file = s->files[t->file].path;
    if (n_dtypes > 0) {
        int ok = 0;
        for (int i = 0; i < n_dtypes; i++) ok |= dtypes[i] == t->dtype;
        if (!ok) {
            char want[256];
            size_t at = 0;
            want[0] = '\0';
            for (int i = 0; i < n_dtypes && at < sizeof want; i++)
                at += (size_t)snprintf(want + at, sizeof want - at, "%s%s", i ? " or " : "",
                                       ib_dtype_name(dtypes[i]));
            return ib_fail(err, IB_ERR_MODEL, "%s: tensor %s: dtype %s, expected %s", file, name,
                           ib_dtype_name(t->dtype), want);
        }
    }
    if (ndim >= 0) {
        int ok = t->ndim == ndim;
        for (int i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || shape[i] == t->shape[i];
        if (!ok) {
            char have[200], want[200];
            fmt_shape(have, sizeof have, t->ndim, t->shape);
            fmt_shape(want, sizeof want, ndim, shape);
            return ib_fail(err, IB_ERR_MODEL, "%s: tensor %s: shape %s, expected %s", file, name, have,
                           want);
        }
    }
    if (s->used) s->used[t - s->tensors] = 1;
    if (out) *out = t;
    return IB_OK;
}

ib_status ib_st_check_used(const ib_st_set *s, const char *what, ib_error *err) {
    int first = -1, n = 0;
    for (int i = 0; s && s->used && i < s->n_tensors; i++)
        if (!s->used[i]) {
            if (first < 0) first = i;
            n++;
        }
    if (first < 0) return IB_OK;
    return ib_fail(err, IB_ERR_MODEL, "%s: tensor %s%s is not used by %s: a checkpoint with unused tensors is refused",
                   s->files[s->tensors[first].file].path, s->tensors[first].name,
                   n > 1 ? " (and others)" : "", what);
}

/* ------------------------------------------------------------------ writer */

typedef struct wr_entry {
    char *name;
    ib_dtype dtype;
    int ndim;
    int64_t shape[IB_ST_MAX_DIMS];
    unsigned char *data; /* [nbytes] copy */
    size_t nbytes;
} wr_entry;

struct ib_st_writer {
    wr_entry *e; /* [n] */
    int n, cap;
};

ib_status ib_st_writer_create(ib_st_writer **out, ib_error *err) {
    if (!out) return ib_fail(err, IB_ERR_INVALID_ARG, "ib_st_writer_create: NULL argument");
    *out = calloc(1, sizeof **out);
    if (!*out) return ib_fail(err, IB_ERR_NOMEM, "safetensors writer: out of memory");
    return IB_OK;
}

void ib_st_writer_free(ib_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    free(w->e);
    free(w);
}

ib_status ib_st_writer_add(ib_st_writer *w, const char *name, ib_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, ib_error *err) {
    if (!w || !name)
        return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: NULL writer or name");
    if (name[0] == '\0' || strcmp(name, "__metadata__") == 0)
        return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: tensor \"%s\": reserved or empty name",
                       name);
    if ((unsigned)dtype >= IB_DT_COUNT)
        return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: tensor %s: dtype %d unknown", name,
                       (int)dtype);
    if (ndim < 0 || ndim > IB_ST_MAX_DIMS || (ndim > 0 && !shape))
        return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: tensor %s: ndim %d not in 0..%d",
                       name, ndim, IB_ST_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: tensor %s: shape[%d] is %lld",
                           name, i, (long long)shape[i]);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0)
            return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: tensor %s: added twice", name);
    size_t nbytes;
    if (!shape_bytes(ndim, shape, ib_dtype_size(dtype), &nbytes))
        return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: tensor %s: byte size overflows",
                       name);
    if (nbytes > 0 && !data)
        return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: tensor %s: NULL data", name);
    if (w->n == INT_MAX)
        return ib_fail(err, IB_ERR_INVALID_ARG, "safetensors writer: too many tensors");

    wr_entry e;
    memset(&e, 0, sizeof e);
    e.dtype = dtype;
    e.ndim = ndim;
    for (int i = 0; i < ndim; i++) e.shape[i] = shape[i];
    e.nbytes = nbytes;
    e.name = strdup(name);
    e.data = malloc(nbytes ? nbytes : 1);
    if (!e.name || !e.data) goto nomem;
    if (nbytes) memcpy(e.data, data, nbytes);
    if (w->n == w->cap) {
        int cap = w->cap ? (w->cap > INT_MAX / 2 ? INT_MAX : w->cap * 2) : 16;
        wr_entry *ne = realloc(w->e, sizeof *ne * (size_t)cap);
        if (!ne) goto nomem;
        w->e = ne;
        w->cap = cap;
    }
    w->e[w->n++] = e;
    return IB_OK;
nomem:
    free(e.name);
    free(e.data);
    return ib_fail(err, IB_ERR_NOMEM, "safetensors writer: tensor %s: out of memory", name);
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const wr_entry *)a)->name, ((const wr_entry *)b)->name);
}

/* Header JSON for the name-sorted entries with their data laid end to end (the format allows no
 * gap: readers, this one included, refuse bytes that belong to no tensor), padded with spaces to a
 * multiple of 8 bytes; *len gets its length. NULL when out of memory. */
static char *build_header(const ib_st_writer *w, size_t *len) {
    json_t *root = json_object(), *meta = json_object();
    char *text = NULL, *padded = NULL;
    /* every json_*_set_new / append_new takes its value even when it fails, so each new value is
     * attached at once and released with root */
    if (!root || json_object_set_new(root, "__metadata__", meta) ||
        json_object_set_new(meta, "format", json_string("mlx")))
        goto done;
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const wr_entry *e = &w->e[i];
        json_t *o = json_object(), *shape, *offs;
        if (json_object_set_new(root, e->name, o)) goto done;
        if (json_object_set_new(o, "dtype", json_string(ib_dtype_name(e->dtype)))) goto done;
        if (json_object_set_new(o, "shape", shape = json_array())) goto done;
        if (json_object_set_new(o, "data_offsets", offs = json_array())) goto done;
        for (int d = 0; d < e->ndim; d++)
            if (json_array_append_new(shape, json_integer(e->shape[d]))) goto done;
        if (json_array_append_new(offs, json_integer((json_int_t)off)) ||
            json_array_append_new(offs, json_integer((json_int_t)(off + e->nbytes))))
            goto done;
        off += e->nbytes;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) goto done;
    size_t n = strlen(text), np = (n + 7) & ~(size_t)7;
    padded = malloc(np + 1);
    if (padded) {
        memcpy(padded, text, n);
        memset(padded + n, ' ', np - n);
        padded[np] = '\0';
        *len = np;
    }
done:
    free(text);
    json_decref(root);
    if (!root) json_decref(meta);
    return padded;
}

ib_status ib_st_writer_write(ib_st_writer *w, const char *path, ib_error *err) {
    if (!w || !path) return ib_fail(err, IB_ERR_INVALID_ARG, "ib_st_writer_write: NULL argument");
    ib_status st;
    FILE *fp = NULL;
    char *header = NULL, *tmp = NULL;
    int made_tmp = 0;

    qsort(w->e, (size_t)w->n, sizeof *w->e, cmp_entry_name);
    size_t hlen = 0;
    header = build_header(w, &hlen);
    size_t plen = strlen(path);
    tmp = malloc(plen + 5);
    if (!header || !tmp) {
        st = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);

    fp = fopen(tmp, "wb");
    if (!fp) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto fail;
    }
    made_tmp = 1;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(le, 1, 8, fp) == 8 && fwrite(header, 1, hlen, fp) == hlen;
    for (int i = 0; ok && i < w->n; i++) ok = fwrite(w->e[i].data, 1, w->e[i].nbytes, fp) == w->e[i].nbytes;
    ok = ok && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    int saved = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    fp = NULL;
    if (!ok) {
        st = ib_fail(err, IB_ERR_IO, "%s: write failed: %s", tmp, strerror(saved));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        st = ib_fail(err, IB_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    free(header);
    free(tmp);
    return IB_OK;

fail:
    if (fp) fclose(fp);
    if (made_tmp) unlink(tmp);
    free(header);
    free(tmp);
    return st;
}
