/*
 * isa.c — ISA names, parsing, run-time CPU detection and the matmul kernel table.
 * AVX2 / AVX512 kernels exist only in x86 builds, the NEON kernel only in aarch64 builds; an ISA of
 * the other architecture is a known name that is never supported.
 */
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#endif

#include "backends/cpu/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#define IB_HAVE_X86 1
#else
#define IB_HAVE_X86 0
#endif

#define ISA_LAST IB_ISA_NEON

static const char *const isa_names[] = {
    [IB_ISA_AUTO] = "auto", [IB_ISA_SCALAR] = "scalar", [IB_ISA_AVX2] = "avx2", [IB_ISA_AVX512] = "avx512",
    [IB_ISA_NEON] = "neon",
};
static const char *const act_names[] = { [IB_ACT_AUTO] = "auto", [IB_ACT_F32] = "f32", [IB_ACT_Q8] = "q8" };

/* Static name of isa; "unknown" for a value outside the enum. */
const char *ib_isa_name(ib_isa isa) {
    return (unsigned)isa <= ISA_LAST ? isa_names[isa] : "unknown";
}

/* 1 when this CPU (and OS) can run isa. SCALAR and AUTO always; AVX2 needs avx2+fma+f16c; AVX512 needs
 * avx512f/bw/vl/dq and vnni (libgcc's detection also checks that the OS saves the vector state);
 * NEON needs an aarch64 build and Advanced SIMD (HWCAP_ASIMD, present on every AArch64 Linux CPU;
 * the kernel checks the optional int8 dot product itself, see matmul_neon.c). */
int ib_isa_supported(ib_isa isa) {
    switch (isa) {
    case IB_ISA_AUTO:
    case IB_ISA_SCALAR: return 1;
#if IB_HAVE_X86
    case IB_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case IB_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni");
#else
    case IB_ISA_AVX2:
    case IB_ISA_AVX512: return 0;
#endif
#if defined(__aarch64__)
    case IB_ISA_NEON: return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
    case IB_ISA_NEON: return 0;
#endif
    }
    return 0;
}

/* Exact lowercase names "auto|scalar|avx2|avx512|neon"; 0 on success, -1 (out untouched) otherwise. */
int ib_isa_parse(const char *s, ib_isa *out) {
    for (int i = 0; s && i <= ISA_LAST; i++)
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
    if (ib_isa_supported(IB_ISA_NEON)) return IB_ISA_NEON;
    return IB_ISA_SCALAR;
}

ib_matmul_kernel ib_matmul_kernel_for(ib_isa isa) {
    if (isa == IB_ISA_AUTO) isa = ib_isa_best();
    switch (isa) {
    case IB_ISA_SCALAR: return ib_matmul_panels_scalar;
#if IB_HAVE_X86
    case IB_ISA_AVX2: return ib_matmul_panels_avx2;
    case IB_ISA_AVX512: return ib_matmul_panels_avx512;
#endif
#if defined(__aarch64__)
    case IB_ISA_NEON: return ib_matmul_panels_neon;
#endif
    default: return NULL;
    }
}
