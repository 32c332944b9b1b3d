/*
 * isa.c — ISA names, parsing, run-time CPU detection and the matmul kernel table.
 */
#include <string.h>

#include "backends/cpu/cpu.h"

static const char *const isa_names[] = {
    [IB_ISA_AUTO] = "auto", [IB_ISA_SCALAR] = "scalar", [IB_ISA_AVX2] = "avx2", [IB_ISA_AVX512] = "avx512",
};
static const char *const act_names[] = { [IB_ACT_AUTO] = "auto", [IB_ACT_F32] = "f32", [IB_ACT_Q8] = "q8" };

/* Static name of isa; "unknown" for a value outside the enum. */
const char *ib_isa_name(ib_isa isa) {
    return (unsigned)isa <= IB_ISA_AVX512 ? isa_names[isa] : "unknown";
}

/* 1 when this CPU (and OS) can run isa. SCALAR and AUTO always; AVX2 needs avx2+fma; AVX512 needs
 * avx512f/bw/vl/dq and vnni (libgcc's detection also checks that the OS saves the vector state). */
int ib_isa_supported(ib_isa isa) {
    __builtin_cpu_init();
    switch (isa) {
    case IB_ISA_AUTO:
    case IB_ISA_SCALAR: return 1;
    case IB_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case IB_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni");
    }
    return 0;
}

/* Exact lowercase names "auto|scalar|avx2|avx512"; 0 on success, -1 (out untouched) otherwise. */
int ib_isa_parse(const char *s, ib_isa *out) {
    for (int i = 0; s && i <= IB_ISA_AVX512; i++)
        if (strcmp(s, isa_names[i]) == 0) {
            *out = (ib_isa)i;
            return 0;
        }
    return -1;
}

/* Exact lowercase names "auto|f32|q8"; 0 on success, -1 (out untouched) otherwise. */
int ib_act_parse(const char *s, ib_act *out) {
    for (int i = 0; s && i <= IB_ACT_Q8; i++)
        if (strcmp(s, act_names[i]) == 0) {
            *out = (ib_act)i;
            return 0;
        }
    return -1;
}

ib_isa ib_isa_best(void) {
    if (ib_isa_supported(IB_ISA_AVX512)) return IB_ISA_AVX512;
    if (ib_isa_supported(IB_ISA_AVX2)) return IB_ISA_AVX2;
    return IB_ISA_SCALAR;
}

ib_matmul_kernel ib_matmul_kernel_for(ib_isa isa) {
    if (isa == IB_ISA_AUTO) isa = ib_isa_best();
    switch (isa) {
    case IB_ISA_SCALAR: return ib_matmul_panels_scalar;
    case IB_ISA_AVX2: return ib_matmul_panels_avx2;
    case IB_ISA_AVX512: return ib_matmul_panels_avx512;
    default: return NULL;
    }
}
