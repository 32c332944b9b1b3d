/*
 * isa.c — ISA names, parsing, run-time CPU detection and the matmul kernel table.
 * AVX2 / AVX512 / AMX kernels exist only in x86 builds, the NEON kernel only in aarch64 builds; an ISA
 * of the other architecture is a known name that is never supported.
 */
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

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

#define ISA_LAST IB_ISA_AMX

static const char *const isa_names[] = {
    [IB_ISA_AUTO] = "auto", [IB_ISA_SCALAR] = "scalar", [IB_ISA_AVX2] = "avx2", [IB_ISA_AVX512] = "avx512",
    [IB_ISA_NEON] = "neon", [IB_ISA_AMX] = "amx",
};
static const char *const act_names[] = { [IB_ACT_AUTO] = "auto", [IB_ACT_F32] = "f32", [IB_ACT_Q8] = "q8" };

/* Static name of isa; "unknown" for a value outside the enum. */
const char *ib_isa_name(ib_isa isa) {
    return (unsigned)isa <= ISA_LAST ? isa_names[isa] : "unknown";
}

#if IB_HAVE_X86
/* 1 when the CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25), the OS enables the
 * tile configuration and data state (XCR0 bits 17 and 18) and, on Linux, grants this process the
 * tile data (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA = 18; the grant is process-wide
 * and repeating it is harmless). Asked once; racing first callers compute and store the same value.
 * Not Linux: 0 (no way to ask here). */
static int amx_usable(void) {
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v >= 0) return v;
    v = 0;
#if defined(__linux__) && defined(__x86_64__)
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        int tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
        __cpuid(1, a, b, c, d);
        int osxsave = (c >> 27) & 1;
        if (tile && int8 && osxsave) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
            if (((lo >> 17) & 3) == 3 && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0) v = 1;
        }
    }
#endif
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}
#endif

/* 1 when this CPU (and OS) can run isa. SCALAR and AUTO always; AVX2 needs avx2+fma+f16c; AVX512 needs
 * avx512f/bw/vl/dq and vnni (libgcc's detection also checks that the OS saves the vector state); AMX
 * needs AVX512 and AMX-TILE + AMX-INT8 with the tile state granted (amx_usable);
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
    case IB_ISA_AMX: return ib_isa_supported(IB_ISA_AVX512) && amx_usable();
#else
    case IB_ISA_AVX2:
    case IB_ISA_AVX512:
    case IB_ISA_AMX: return 0;
#endif
#if defined(__aarch64__)
    case IB_ISA_NEON: return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
    case IB_ISA_NEON: return 0;
#endif
    }
    return 0;
}

/* Exact lowercase names "auto|scalar|avx2|avx512|neon|amx"; 0 on success, -1 (out untouched) otherwise. */
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
    if (ib_isa_supported(IB_ISA_AMX)) return IB_ISA_AMX;
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
#if defined(__x86_64__)
    case IB_ISA_AMX: return ib_matmul_panels_amx;
#endif
#if defined(__aarch64__)
    case IB_ISA_NEON: return ib_matmul_panels_neon;
#endif
    default: return NULL;
    }
}
