// cuda_grid_barrier: what one grid-wide barrier costs inside a resident (persistent) kernel, against
// what a kernel boundary costs — the number that decides whether a decode step's layers could run as
// one kernel looping over its phases instead of one kernel a phase.
//
// Each measurement launches one kernel of B blocks x 256 threads (B = 1, 2, 4 a multiprocessor, all
// resident at once) that passes N barriers, the blocks' threads writing one word between barriers (so
// each barrier also orders memory, as a phase boundary must), and times it with events:
//   cg:      cooperative groups' grid.sync() (a cooperative launch);
//   counter: a hand-made barrier — thread 0 of each block adds 1 to a global counter with release
//            semantics and spins with acquire loads until the counter reaches the round's target; then
//            the block's threads meet at __syncthreads().
// And, for comparison, N launches of an empty kernel (one block) captured in a CUDA graph with
// programmatic dependent launch (each waits for its predecessor with griddepcontrol.wait, as the
// backend's kernels do), replayed: the boundary cost a graph of kernels pays.
// Prints microseconds a barrier (a launch), the median of REPS timings.
//
// usage: cuda_grid_barrier [N [REPS]]     (nvcc -O3 -arch=sm_90a cuda_grid_barrier.cu)
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "cuda_grid_barrier: %s: %s\n", #x, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

// n barriers by grid.sync(); out [blocks * 256] written between them.
__global__ void cg_barriers(int n, unsigned *out) {
    cg::grid_group g = cg::this_grid();
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < n; k++) {
        out[i] = k;
        g.sync();
    }
}

// n barriers on counter (zero before the launch): round k ends when it reaches (k + 1) * gridDim.x.
__global__ void counter_barriers(int n, unsigned *counter, unsigned *out) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < n; k++) {
        out[i] = k;
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned target = (unsigned)(k + 1) * gridDim.x;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
            unsigned v;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
            } while (v < target);
        }
        __syncthreads();
    }
}

__global__ void empty_pdl() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 2000, reps = argc > 2 ? atoi(argv[2]) : 7;
    if (n < 1 || reps < 1) {
        fprintf(stderr, "cuda_grid_barrier: N and REPS must be positive integers\n");
        return 2;
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    int coop = 0;
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    const int sm = p.multiProcessorCount;
    unsigned *out, *counter;
    CK(cudaMalloc(&out, (size_t)4 * sm * 256 * sizeof(unsigned)));
    CK(cudaMalloc(&counter, sizeof(unsigned)));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%s, %d multiprocessors; %d barriers a launch, median of %d\n", p.name, sm, n, reps);
    for (int per = 1; per <= 4; per *= 2) {
        const int blocks = per * sm;
        int fit = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, counter_barriers, 256, 0));
        if (fit < per) {
            printf("%d blocks a multiprocessor: not resident at once, skipped\n", per);
            continue;
        }
        std::vector<float> tc, tk;
        for (int r = -1; r < reps; r++) {
            float ms;
            if (coop) {
                int nn = n;
                void *args[] = {&nn, &out};
                CK(cudaEventRecord(e0));
                CK(cudaLaunchCooperativeKernel((void *)cg_barriers, blocks, 256, args, 0, 0));
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 0) tc.push_back(ms * 1000.0f / n);
            }
            CK(cudaMemset(counter, 0, sizeof(unsigned)));
            CK(cudaEventRecord(e0));
            counter_barriers<<<blocks, 256>>>(n, counter, out);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 0) tk.push_back(ms * 1000.0f / n);
        }
        printf("%4d blocks (%d a multiprocessor): grid.sync %.3f us, counter barrier %.3f us\n", blocks, per,
               coop ? median(tc) : -1.0f, median(tk));
    }
    // n empty kernels in a graph, each launched as a programmatic dependent of the one before
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(1), lc.blockDim = dim3(32), lc.stream = st, lc.attrs = &at, lc.numAttrs = 1;
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < n; k++) CK(cudaLaunchKernelEx(&lc, empty_pdl));
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    std::vector<float> tg;
    for (int r = -1; r < reps; r++) {
        float ms;
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) tg.push_back(ms * 1000.0f / n);
    }
    printf("graph of %d empty kernels with programmatic dependent launch: %.3f us a kernel\n", n, median(tg));
    return 0;
}
