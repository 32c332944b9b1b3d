/*
 * rowinfo.cuh — what a kernel needs to know of a step's row: where its session's cache is and how it
 * is kept (the per-row table cuda_backend.cu uploads before a step's first kernel).
 */
#ifndef IB_BACKENDS_CUDA_ROWINFO_CUH
#define IB_BACKENDS_CUDA_ROWINFO_CUH

/* Per row of a step: where its session's cache is and how it is kept. */
typedef struct rowinfo {
    void *kv;          /* device cache base */
    int cap, sink, window;
    int kvt;           /* its element type (ib_kv_dtype: IB_KV_F32, IB_KV_F16, IB_KV_Q8) */
    int pos;           /* the row's position */
    int scap, swin;    /* Gemma 4: the sliding layers' slots and window (gemma_kernels.cuh) */
    int kvq8_fault;    /* nonzero: the test-only kvq8-step-scale fault (q8 codes up to 126) in this step */
} rowinfo;

#endif
