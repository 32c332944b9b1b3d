/*
 * device_primitives.cuh — what the CUDA backend's kernels reach by inline PTX, each behind a function
 * (programmatic dependent launch, L1/L2 prefetches, cp.async copies, thread block clusters, the
 * products' dp4a and mma.sync), and the declaration of a kernel's dynamic shared memory. Included by
 * cuda_backend.cu before the kernels. The rest of the kernels is CUDA C++, so a host build of them
 * (tests/cuda_host_shim.h gives these same names host meanings) runs their arithmetic.
 */
#ifndef IB_BACKENDS_CUDA_DEVICE_PRIMITIVES_CUH
#define IB_BACKENDS_CUDA_DEVICE_PRIMITIVES_CUH

/* A kernel's dynamic shared memory: name, an array of T (DYN_SHARED_ALIGNED: 16-byte aligned). */
#define DYN_SHARED(T, name) extern __shared__ T name[]
#define DYN_SHARED_ALIGNED(T, name) extern __shared__ __align__(16) T name[]

/* Ask L2 (prefetch_l2) or L1 (prefetch_l1) for the 128-byte line holding p; reads nothing. */
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ void prefetch_l1(const void *p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

/* Programmatic dependent launch: a kernel launched with it may start while the previous kernel of the
 * stream still runs; griddepcontrol.wait then waits for that kernel's completion and its memory. Every
 * kernel here waits first thing (so completion stays transitive down the chain), then lets the next
 * kernel launch — which does only independent work (prefetching its weights) before its own wait. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;"); }
#define PDL_ENTER() \
    do {            \
        pdl_wait(); \
        pdl_launch(); \
    } while (0)

/* Ask L2 for bytes [p, p + n) (128-byte lines), by the block's threads: for data that no kernel of the
 * step writes, read before the wait for the previous kernel. */
__device__ __forceinline__ void prefetch_bytes(const void *p, size_t n) {
    for (size_t o = (size_t)threadIdx.x * 128; o < n; o += (size_t)blockDim.x * 128)
        prefetch_l2((const char *)p + o);
}

/* cp.async: copy n (4 or 16) bytes global -> shared without passing through registers; .cg (16 bytes)
 * skips L1. Completion: cp_commit groups them, cp_wait<N> waits until at most N groups are pending. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }

/* ldmatrix .x4 of 8x8 matrices of 16-bit elements from shared memory (the warp's lanes all call it):
 * lane L gives p, the address of row L % 8 of matrix L / 8 (16 bytes, 16-byte aligned); lane L receives
 * in r[i] the 4 bytes at row L / 4, bytes 4 (L % 4) .. 4 (L % 4) + 3 of matrix i — for 8-bit data, the
 * row-major fragment of mma.sync m16n8k32 when matrices 0..3 are rows 0-7 / 8-15 at bytes 0-15, then
 * rows 0-7 / 8-15 at bytes 16-31. */
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* Thread block clusters (sm_90): this block's rank in its cluster; a barrier of all the cluster's
 * threads split in its two halves (arrive: what this block wrote to shared memory before is visible to
 * the cluster's blocks after their wait; every thread of every block calls both, in turn); a float of
 * block `rank`'s shared memory at the address p has in this block's. */
__device__ __forceinline__ int cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int)r;
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ float ld_cluster(const float *p, int rank) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p), ra;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
    return v;
}

/* a·b over 4 byte lanes, a unsigned (weight codes 0..255), b signed (activation codes), plus c. */
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* d += a · b for one m16n8k32 tile of 8-bit integers: a 16x32 (row major fragment), b 32x8, d 16x8
 * int32; AU / BU: a / b unsigned (uint8), else int8. Integer arithmetic: exact. */
#define MMA_I8(TYPES)                                                                                       \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." TYPES ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
                 "{%0,%1,%2,%3};"                                                                             \
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])                                             \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <bool AU, bool BU>
__device__ __forceinline__ void mma_i8(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if (AU && BU) MMA_I8("u8.u8");
    else if (AU) MMA_I8("u8.s8");
    else if (BU) MMA_I8("s8.u8");
    else MMA_I8("s8.s8");
}
#undef MMA_I8

#endif
