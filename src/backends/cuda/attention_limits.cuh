/*
 * attention_limits.cuh — the attention kernels' block sizes and bounds, shared by the kernels and the
 * launch code in cuda_backend.cu (and by the host tests that run the kernels).
 */
#ifndef IB_BACKENDS_CUDA_ATTENTION_LIMITS_CUH
#define IB_BACKENDS_CUDA_ATTENTION_LIMITS_CUH

#define ATT_THREADS 256    /* threads of an attention block */
#define ATT_SPLIT_KEYS 256 /* per-head attention splits a head over a cluster from this many keys (B=1 129: -3%, 1,000: +28%) */
#define ATT_CHUNK 512      /* most keys an attention block scores at once */
#define ATT_GROUP_MIN_ROWS 16  /* steps of at least this many rows: one attention block per (row, KV head) */
#define ATT_QH 2048        /* floats of an attention block's per-head arrays: G * head_dim <= ATT_QH */
#define ATT_STAGE_MAX (160 * 1024)   /* most shared bytes a per-head attention block stages keys and values in */
#define ATT_SM_BYTES (224 * 1024)    /* shared bytes of a multiprocessor that per-head attention blocks split */
#define QK_WARPS 4         /* warps (heads) per block of the q/k norm + RoPE + store kernel */
#define ATT_MAX_BLOCKS 64  /* most key blocks in one such chunk */
#define ATT_MAX_BLOCK 128  /* largest key block (ops.h: block <= 128) */

#endif
