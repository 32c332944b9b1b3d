/*
 * cpu.h — internal entry points of the CPU backend: ISA choice and the kernel table.
 */
#ifndef IB_BACKENDS_CPU_CPU_H
#define IB_BACKENDS_CPU_CPU_H
#include "isobatch.h"
#include "ops/matmul.h"
#include "ops/ops.h"

/* The best ISA this CPU runs: AMX (AVX512 with AMX-INT8 tiles the OS grants), else AVX512 (with VNNI), else AVX2 (with FMA and F16C), else NEON (aarch64), else
 * SCALAR. */
ib_isa ib_isa_best(void);

/* The matmul panel kernel of an ISA (AUTO resolves to ib_isa_best()); NULL for a value outside the
 * enum or an ISA of another architecture than this build's. It does not check that the CPU supports
 * the ISA: that is the caller's job. */
ib_matmul_kernel ib_matmul_kernel_for(ib_isa isa);

/* Every kernel the CPU backend runs, for one ISA, picked once. */
typedef struct ib_cpu_kernels {
    ib_isa isa;
    ib_matmul_kernel matmul;
    ib_attn_kernels attn;
    /* ib_quantize_act or an ISA's copy of it (same bits, any group) */
    void (*quant)(const float *x, int B, int K, int G, int8_t *xq, float *d, float *ad);
} ib_cpu_kernels;

/* The kernels of isa (AUTO is not accepted: the engine resolves it first). IB_ERR_UNSUPPORTED, naming
 * the ISA, when this build or this CPU cannot run it: never a silent fallback to another ISA. */
ib_status ib_cpu_kernels_for(ib_isa isa, ib_cpu_kernels *out, ib_error *err);

/* Copy the bytes of CPU cache kv (bytes: exactly its ib_kv_desc_bytes) into dst, for tests and
 * diagnostics; -1 (nothing copied) for another backend's cache or another size. */
struct ib_kv;
int ib_cpu_kv_read(const struct ib_kv *kv, void *dst, size_t bytes);

#if defined(__aarch64__)
/* NEON kernel (matmul_neon.c): 1 when the CPU has the int8 dot product (HWCAP_ASIMDDP), which the
 * Q8-activation path then uses; ib_neon_dotprod_disable(1) makes it take the plain NEON path anyway
 * (same bits; for tests), ib_neon_dotprod_disable(0) undoes that. */
int ib_neon_has_dotprod(void);
void ib_neon_dotprod_disable(int off);
#endif

#endif
