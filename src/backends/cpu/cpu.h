/*
 * cpu.h — internal entry points of the CPU backend: ISA choice and the kernel table.
 */
#ifndef IB_BACKENDS_CPU_CPU_H
#define IB_BACKENDS_CPU_CPU_H
#include "isobatch.h"
#include "ops/matmul.h"

/* The best ISA this CPU runs: AVX512 (with VNNI), else AVX2 (with FMA), else SCALAR. */
ib_isa ib_isa_best(void);

/* The matmul panel kernel of an ISA (AUTO resolves to ib_isa_best()); NULL for a value outside the
 * enum. It does not check that the CPU supports the ISA: that is the caller's job. */
ib_matmul_kernel ib_matmul_kernel_for(ib_isa isa);

#endif
