/*
 * backend.c — the registry of backends compiled into this build: names, parsing, availability.
 */
#include <string.h>

#include "backends/backend.h"

static const char *const backend_names[IB_BACKEND_COUNT] = {"cpu", "cuda"};

const char *ib_backend_name(ib_backend_kind k) {
    return (unsigned)k < IB_BACKEND_COUNT ? backend_names[k] : "unknown";
}

int ib_backend_parse(const char *s, ib_backend_kind *out) {
    for (int i = 0; s && i < IB_BACKEND_COUNT; i++)
        if (!strcmp(s, backend_names[i])) {
            *out = (ib_backend_kind)i;
            return 0;
        }
    return -1;
}

const ib_backend_ops *ib_backend_ops_for(ib_backend_kind kind) {
    switch (kind) {
    case IB_BACKEND_CPU: return &ib_backend_cpu;
#ifdef IB_HAVE_CUDA
    case IB_BACKEND_CUDA: return &ib_backend_cuda;
#endif
    default: return NULL;
    }
}

int ib_backend_available(ib_backend_kind k, const char **why) {
    const char *reason = NULL;
    const ib_backend_ops *ops = ib_backend_ops_for(k);
    if ((unsigned)k >= IB_BACKEND_COUNT) reason = "not a backend";
    else if (!ops) reason = "not compiled into this build (built without nvcc)";
    else if (ops->available && !ops->available(&reason)) {
        if (!reason) reason = "not available on this machine";
    }
    if (why) *why = reason;
    return reason == NULL;
}

int ib_backend_device_memory(ib_backend_kind k, size_t *free_bytes, size_t *total_bytes) {
    const ib_backend_ops *ops = ib_backend_ops_for(k);
    if (!ops || !ops->device_memory || (ops->available && !ops->available(NULL))) return -1;
    return ops->device_memory(free_bytes, total_bytes);
}

const char *ib_backends_compiled(void) {
#ifdef IB_HAVE_CUDA
    return "cpu cuda";
#else
    return "cpu";
#endif
}

static const char *const kv_dtype_names[IB_KV_DTYPE_COUNT] = {"f32", "f16", "q8"};

const char *ib_kv_dtype_name(ib_kv_dtype t) { return (unsigned)t < IB_KV_DTYPE_COUNT ? kv_dtype_names[t] : "unknown"; }

int ib_kv_dtype_parse(const char *s, ib_kv_dtype *out) {
    for (int i = 0; s && i < IB_KV_DTYPE_COUNT; i++)
        if (!strcmp(s, kv_dtype_names[i])) {
            *out = (ib_kv_dtype)i;
            return 0;
        }
    return -1;
}
