/*
 * fault.c — test-only fault injection (see ib_fault in isobatch.h). One process-wide switch, off by
 * default; kernels read it once per call. Each fault reproduces a kind of bug real engines shipped,
 * so the invariance tests can show that they catch it.
 */
#include <string.h>

#include "isobatch.h"

static const char *const fault_names[IB_FAULT_COUNT] = {
    [IB_FAULT_NONE] = "none",
    [IB_FAULT_ROPE_SCALAR_OFFSET] = "rope-scalar-offset",
    [IB_FAULT_ROPE_SKIP_ROWS] = "rope-skip-rows",
    [IB_FAULT_GEMV_GEMM] = "gemv-gemm",
    [IB_FAULT_SPLIT_K_THREADS] = "split-k-threads",
    [IB_FAULT_ISA_FMA] = "isa-fma",
    [IB_FAULT_ROW_ORDER] = "row-order",
    [IB_FAULT_SAMPLE_BY_ROW] = "shared-rng",
    [IB_FAULT_SPLIT_KV_BY_BATCH] = "split-kv-by-batch",
    [IB_FAULT_GPU_FMA] = "gpu-fma",
    [IB_FAULT_REBUILD_DROP_TOKEN] = "rebuild-drop-token",
    [IB_FAULT_MOE_CAPACITY] = "moe-capacity",
    [IB_FAULT_MOE_COMBINE_BY_LOAD] = "moe-combine-by-load",
    [IB_FAULT_GPU_SPLIT_K] = "gpu-split-k",
    [IB_FAULT_KV_RING_SHORT] = "kv-ring-short",
    [IB_FAULT_AMX_GROUP_ORDER] = "amx-group-order",
    [IB_FAULT_PLE_ROW0] = "ple-row0",
    [IB_FAULT_ATTN_TILE_RANGE] = "attn-tile-range",
    [IB_FAULT_GPU_ATT_BLOCK] = "gpu-att-block",
    [IB_FAULT_ATTN_BLOCK_MAX] = "attn-block-max",
    [IB_FAULT_KVQ8_STEP_SCALE] = "kvq8-step-scale",
    [IB_FAULT_KV_POOL_DIRTY] = "kv-pool-dirty",
    [IB_FAULT_SHARE_EARLY] = "share-early",
};

static ib_fault current_fault = IB_FAULT_NONE;

int ib_fault_parse(const char *name, ib_fault *out) {
    for (int i = 0; i < IB_FAULT_COUNT; i++)
        if (name && strcmp(name, fault_names[i]) == 0) {
            *out = (ib_fault)i;
            return 0;
        }
    return -1;
}

const char *ib_fault_name(ib_fault f) {
    return (unsigned)f < IB_FAULT_COUNT ? fault_names[f] : "unknown";
}

void ib_fault_set(ib_fault f) { current_fault = (unsigned)f < IB_FAULT_COUNT ? f : IB_FAULT_NONE; }

ib_fault ib_fault_get(void) { return current_fault; }
