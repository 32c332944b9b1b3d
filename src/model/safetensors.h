/*
 * safetensors.h — read-only, memory-mapped safetensors files (one file or shards).
 *
 * Format (facts of the published layout): 8-byte little-endian header length N, then N bytes of
 * UTF-8 JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}, then the data region; offsets are relative to the data region.
 *
 * ib_st_open_dir validates everything before anything is used: header length within the file,
 * JSON syntax, each entry's dtype/shape/offsets types, begin <= end, end within the file, byte size
 * equal to prod(shape) * dtype size, no two tensors overlapping, no bytes of the data region outside
 * every tensor (no hole, nothing after the last: as strict readers of the format require), at most
 * 100,000 tensors per file (counted before the JSON is parsed), no duplicate names across shards.
 * Errors name the file, the tensor and the field (IB_ERR_IO: cannot open/map; IB_ERR_FORMAT: a
 * malformed header, index or duplicate name; IB_ERR_MODEL: a tensor the index or ib_st_expect asks
 * for is missing or has the wrong dtype/shape).
 *
 * ALIGNMENT: tensor data pointers are NOT guaranteed to be aligned (the format allows any byte
 * offset). Callers must memcpy or use unaligned-safe loads. Files written by ib_st_writer_write lay
 * the tensors end to end (no padding: the format allows none), so most are unaligned.
 */
#ifndef IB_MODEL_SAFETENSORS_H
#define IB_MODEL_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "isobatch.h"

typedef enum ib_dtype {
    IB_DT_F32, IB_DT_F16, IB_DT_BF16, IB_DT_F64,
    IB_DT_U32, IB_DT_I32, IB_DT_U8, IB_DT_I8, IB_DT_U16, IB_DT_I16, IB_DT_I64, IB_DT_U64, IB_DT_BOOL,
    IB_DT_COUNT
} ib_dtype;

#define IB_ST_MAX_DIMS 8

typedef struct ib_st_tensor {
    char *name;                      /* owned by the set */
    ib_dtype dtype;
    int ndim;
    int64_t shape[IB_ST_MAX_DIMS];
    const void *data;                /* points into the mapping; valid while the set is open; may be
                                        unaligned */
    size_t nbytes;
    int file;                        /* index into the set's files */
} ib_st_tensor;

typedef struct ib_st_set ib_st_set;

/* Size in bytes of one element; name as in the header ("F32", …). */
size_t ib_dtype_size(ib_dtype t);
const char *ib_dtype_name(ib_dtype t);

/* Open one safetensors file. On success *out owns the mapping. */
ib_status ib_st_open_file(const char *path, ib_st_set **out, ib_error *err);

/* Open a model directory: model.safetensors, or the shards listed in model.safetensors.index.json
 * ("weight_map": tensor -> file). Every tensor of the index must be found in the file it names. */
ib_status ib_st_open_dir(const char *dir, ib_st_set **out, ib_error *err);

void ib_st_close(ib_st_set *s);

/* Tensors are indexed 0..count-1 in strcmp order of their names (NULL when i is out of range). */
int ib_st_count(const ib_st_set *s);
const ib_st_tensor *ib_st_at(const ib_st_set *s, int i);
const char *ib_st_file_path(const ib_st_set *s, int file);
size_t ib_st_total_bytes(const ib_st_set *s);  /* sum of file sizes */

/* Find a tensor by name; NULL when absent. */
const ib_st_tensor *ib_st_find(const ib_st_set *s, const char *name);

/* Fail (IB_ERR_MODEL) naming the first tensor of s that no successful ib_st_expect has asked for,
 * saying it is not used by `what` (e.g. "model_type qwen3 with 2 layers"): a checkpoint holding
 * tensors the configuration does not use (a wrong model_type, too few layers) is refused rather
 * than loaded with parts silently dropped. */
ib_status ib_st_check_used(const ib_st_set *s, const char *what, ib_error *err);

/* Find a tensor and check its dtype (any of the `n_dtypes` listed) and shape (ndim dims; a shape
 * entry of -1 matches anything). On mismatch or absence, fail with a message naming the file,
 * the tensor and the field, e.g.
 *   "dir/model.safetensors: tensor model.norm.weight: shape [64], expected [128]".
 * n_dtypes <= 0 accepts any dtype; ndim < 0 accepts any shape. out may be NULL. A missing tensor is
 * reported against the file (or, for shards, the index) the set was opened from. */
ib_status ib_st_expect(const ib_st_set *s, const char *name, const ib_dtype *dtypes, int n_dtypes,
                       int ndim, const int64_t *shape, const ib_st_tensor **out, ib_error *err);

/* ---- writing (used by `isobatch mkmodel` and the tests) ---- */

typedef struct ib_st_writer ib_st_writer;

ib_status ib_st_writer_create(ib_st_writer **out, ib_error *err);
/* Add a tensor; data (nbytes = prod(shape) * size) is copied. Names must be unique, non-empty and
 * not "__metadata__" (else IB_ERR_INVALID_ARG). */
ib_status ib_st_writer_add(ib_st_writer *w, const char *name, ib_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, ib_error *err);
/* Write all tensors to path (header sorted by name, data end to end in that order, with
 * "__metadata__": {"format": "mlx"}, header padded with spaces to a multiple of 8). Writes path.tmp
 * then renames it over path; on failure the .tmp is removed and path is untouched. */
ib_status ib_st_writer_write(ib_st_writer *w, const char *path, ib_error *err);
void ib_st_writer_free(ib_st_writer *w);

#endif
