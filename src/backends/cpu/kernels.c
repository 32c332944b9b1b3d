/*
 * kernels.c — the one place the CPU backend's kernels are chosen for an ISA (at engine creation).
 */
#include "backends/cpu/cpu.h"
#include "core/error.h"

ib_status ib_cpu_kernels_for(ib_isa isa, ib_cpu_kernels *out, ib_error *err) {
    ib_cpu_kernels k = {.isa = isa};
    if (isa == IB_ISA_AUTO || !ib_isa_supported(isa) || !(k.matmul = ib_matmul_kernel_for(isa)) ||
        ib_attn_kernels_for(isa, &k.attn))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "isa %s: not supported by this CPU or build", ib_isa_name(isa));
    k.quant = ib_quantize_act;
#if defined(__x86_64__) || defined(__i386__)
    if (isa == IB_ISA_AVX512 || isa == IB_ISA_AMX) k.quant = ib_quantize_act_avx512;
#endif
    *out = k;
    return IB_OK;
}
