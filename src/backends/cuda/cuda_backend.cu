/*
 * cuda_backend.cu — the CUDA backend: backend.h's table of operations over device memory, every op
 * producing the numeric definitions of src/ops/ bit for bit (the spec; see the contract in backend.h).
 *
 * How each definition maps onto the GPU (device layout in cuda.h):
 *   - Q8-activation products: the per-group integer sums are exact in any order, so they are
 *     computed with dp4a by the K-slices (warps) of a block in parallel, each with its group's two
 *     float terms t = (s*d)*(float)isum and u = b*ad, parked in shared memory; then one thread per
 *     (row, output) combines the groups in ascending order in float32, as matmul.h writes it:
 *     acc = (acc + t) + u. Many rows: mma.sync int8 tensor cores for the integer sums.
 *   - F32-activation products: one thread per (row, output) walks K in ascending order,
 *     acc = acc + (s*(float)q + b) * x.
 *   - Row norms and dot products: 16 lanes of a warp own the 16 lanes of ib_dot16's order (lane j
 *     sums elements j, j+16, … in order) and fold 8, 4, 2, 1 with shuffles.
 *   - Attention: one block per (row, query head); one thread per key computes that key's score in
 *     the 16-lane order, one warp takes each key block's max (a maximum: any order) and the running
 *     max, one thread the running sum in key order, one thread per output dimension accumulates the
 *     values in key order (their rows asked into L1 while the max is taken); key blocks are cut exactly as
 *     ib_attend_heads (full) and ib_attend_policy (sink + window) cut them.
 *   - exp is fmath.h's ib_expf_lane (the same bits as ib_expf), half conversions are half.h's,
 *     compiled for the device from the same source (IB_HD).
 * The build gives nvcc -fmad=false, IEEE division and square root, denormals kept, so no product and
 * sum is fused unless written (__fmaf_rn: only under the test-only gpu-fma fault).
 *
 * A step's ops are recorded by the table's calls and enqueued at step_end on the instance's one stream
 * — from the second step of the same shape as a captured CUDA graph — with neighbouring ops fused where
 * the fused kernel performs the same operations in the same order (flush_step, exec_records): an add
 * with the row norm after it, q/k norms with RoPE and the KV store, and the Q8 quantization of a
 * product's input with the op that writes it (a row norm, SwiGLU, attention). Kernels are launched with
 * programmatic dependent launch: each waits for its predecessor first thing (PDL_ENTER), after asking
 * L2 for what no kernel of the step writes (weights, norm weights, earlier keys and values). Every
 * output row depends only on its own row (and its own session's cache): grids are sized by R, never the
 * arithmetic. docs/cuda.md has the whole picture and what was verified on an H200.
 *
 * Gemma 4 (per-layer shapes and cache views, GeGLU, the routed experts, per-layer embeddings, the logit
 * soft-cap) is in gemma_kernels.cuh, included below the product, norm and attention code it reuses.
 */
extern "C" {
#include "backends/backend.h"
#include "backends/cpu/pack.h"
#include "core/error.h"
#include "core/fmath.h"
#include "core/half.h"
#include "ops/act_def.h"
#include "ops/ops.h"
}
#include <cuda_profiler_api.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda.h"

#define NT 32              /* outputs per product tile: one warp's lanes */
#define NWARP 8            /* warps per product block (256 threads) */
#define RB 8               /* rows per pass of a Q8 product block (one epilogue warp each) */
#define MAX_PASSES 8       /* most 8-row passes one Q8 product block walks (its weight tile stays in L1) */
#define LOGIT_CHUNK 128    /* lm_head rows per product (bounds the logits scratch) */
#define MMA_MIN_ROWS 8     /* Q8 products of at least this many rows run on the tensor cores */
#define NGRAPH 16          /* step graphs kept per instance */
#define REC_ARGS 10        /* ints of one recorded op */
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
#define ARGMAX_THREADS 256  /* threads of an argmax block */
#define ARGMAX_SLICES 32    /* argmax blocks per logits row (each a slice of the vocabulary) */
enum { REPEAT_ATTN = 1, REPEAT_LINEAR = 2, REPEAT_NORM = 4, REPEAT_ACT = 8, REPEAT_EMPTY = 16 };   /* cuda_backend.repeat: timing diagnostics */
/* When a step's attention runs in tiles of a prompt's rows (plan_tiles): never (IB_CUDA_ATT_TILE=0), by the
 * step's shape (the default), or wherever the tile kernel can (IB_CUDA_ATT_TILE=force: tests) */
enum att_tiles_mode { TILES_NEVER, TILES_BY_SHAPE, TILES_FORCED };

/* When a decode step's q/k norm, RoPE and KV store run inside its attention (qk_fusable): never
 * (IB_CUDA_FUSE_QK=0), by the step's shape (the default), or wherever they can (IB_CUDA_FUSE_QK=force:
 * tests) */
enum fuse_qk_mode { FUSE_QK_NEVER, FUSE_QK_BY_SHAPE, FUSE_QK_FORCED };

/* Whether the per-head attention reads its keys straight into registers where they fit
 * (attend_row_head_direct) or through its stage (IB_CUDA_ATT_DIRECT=0: always the stage; by shape:
 * the direct path wherever it applies — there is nothing more to force) */
enum att_direct_mode { DIRECT_NEVER, DIRECT_BY_SHAPE };

/* The block size of the direct decode attention (attention_direct_kernel): ATT_THREADS always
 * (IB_CUDA_ATT_WIDE=0), ATT_THREADS_WIDE where the grid fills at most a quarter of the multiprocessors
 * (the default: measured 1-2% faster at B=1-2, docs/cuda.md), or always (=force: tests) */
enum att_wide_mode { WIDE_NEVER, WIDE_SMALL_GRIDS, WIDE_FORCED };

/* Whether the blocks of a small-step product ask L2 for their weight tiles before their wait for the
 * previous kernel (prefetch_tile): by the step's rows and the grid's weights (mm_prefetch_wanted: the
 * default), always, or never (IB_CUDA_MM_PREFETCH unset / all / 0: measurements in docs/cuda.md) */
enum mm_prefetch_mode { MM_PF_AUTO, MM_PF_ALL, MM_PF_NONE };

/* Whether a one-row product stages the row's activation codes in shared memory (mm_q8_kernel's XS):
 * never (IB_CUDA_MM_STAGE=0), by the step's shape (the default: products whose weights were not asked
 * of L2 before the wait, so each round's come from DRAM — measured on the H200, qwen3-8b B=1 +6%;
 * where the weights were asked of L2 the copy's round trip costs about what it saves), or wherever it
 * can (=force: tests) */
enum mm_stage_mode { STAGE_NEVER, STAGE_BY_SHAPE, STAGE_FORCED };

/* Which tensor-core kernel takes the Q8 products of a few rows on small grids (launch_products): by the
 * step's rows (the default: mm_q8_mma_pipe_kernel up to MMA_PIPE_MAX_ROWS, mm_q8_mma16_kernel beyond —
 * measured on the H200, docs/cuda.md: decode steps of 8-64 rows 6-65% faster on the first, 128-row
 * prefill 10% slower), or always one of them (IB_CUDA_MMA_KERNEL=pipe / 16: tests and measurements) */
#define MMA_PIPE_MAX_ROWS 64
enum mma_kernel_mode { MMA_BY_ROWS, MMA_PIPE, MMA_16 };

/* Whether mm_q8_mma_pipe_kernel's blocks take 16 outputs instead of 32: never (IB_CUDA_MMA_NARROW=0),
 * where 32 would leave multiprocessors idle (the default: launch_products), or always (=force: tests) */
enum mma_narrow_mode { NARROW_NEVER, NARROW_BY_GRID, NARROW_FORCED };

/* The KV types of a step's rows: mixed, all float, or all half (the direct attention kernel is
 * compiled for one) */
enum kv_rows_type { KV_ROWS_MIXED, KV_ROWS_F32, KV_ROWS_F16 };

/* A never / by-shape / forced choice from environment variable `name` ("0", unset or anything else,
 * "force"), as 0 / 1 / 2 — the order of the never / by-shape / forced modes below. */
static int env_mode(const char *name) {
    const char *v = getenv(name);
    return !v ? 1 : !strcmp(v, "0") ? 0 : !strcmp(v, "force") ? 2 : 1;
}
static_assert(TILES_NEVER == 0 && TILES_BY_SHAPE == 1 && TILES_FORCED == 2 && FUSE_QK_NEVER == 0 &&
                  FUSE_QK_BY_SHAPE == 1 && FUSE_QK_FORCED == 2 && DIRECT_NEVER == 0 && DIRECT_BY_SHAPE == 1 &&
                  WIDE_NEVER == 0 && WIDE_SMALL_GRIDS == 1 && WIDE_FORCED == 2 && STAGE_NEVER == 0 &&
                  STAGE_BY_SHAPE == 1 && STAGE_FORCED == 2 && NARROW_NEVER == 0 && NARROW_BY_GRID == 1 &&
                  NARROW_FORCED == 2,
              "env_mode's values are the modes'");

/* ---------------------------------------------------------------- device data */

/* A matrix in device memory (layout in cuda.h). */
typedef struct dmat {
    int fmt;          /* ib_wfmt */
    int N, K, G, Np, ng;
    const uint4 *w;   /* quantized codes */
    const float *wf;  /* F32 weights */
    const float *s, *b;
} dmat;

/* Per row of a step: where its session's cache is and how it is kept. */
typedef struct rowinfo {
    void *kv;          /* device cache base */
    int cap, sink, window, f16;
    int pos;           /* the row's position */
    int scap, swin;    /* Gemma 4: the sliding layers' slots and window (gemma_kernels.cuh) */
} rowinfo;

/* Up to three products that read the same input, run as one grid: matrix i owns the 32-output tiles
 * [t0[i], t0[i+1]) of blockIdx.x and writes Y[i] (row stride its N). Which block computes an output
 * never changes how. */
typedef struct mset {
    dmat m[3];
    float *Y[3];
    int t0[4];
    int n;
    int prefetch;      /* the blocks ask L2 for their weight tiles before the wait (prefetch_tile) */
} mset;

/* The product of mset ms that 32-output tile `tile` belongs to, its matrix, output and local tile. */
__device__ __forceinline__ int mset_pick(const mset &ms, int tile, dmat &m, float *&Y) {
    int i = 0;
    if (ms.n > 1 && tile >= ms.t0[1]) i = 1;
    if (ms.n > 2 && tile >= ms.t0[2]) i = 2;
    m = i == 0 ? ms.m[0] : i == 1 ? ms.m[1] : ms.m[2];
    Y = i == 0 ? ms.Y[0] : i == 1 ? ms.Y[1] : ms.Y[2];
    return tile - (i == 0 ? ms.t0[0] : i == 1 ? ms.t0[1] : ms.t0[2]);
}

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
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
}

/* When on: ask L2 for the weights of this block's outputs of mset ms — block x holds OPB outputs, part
 * x % (NT / OPB) of 32-output tile x / (NT / OPB) — (codes, then scales and biases), so the loads after the
 * wait for the previous kernel hit L2. Reads nothing it computes with. */
template <int OPB = NT>
__device__ __forceinline__ void prefetch_tile(const mset &ms, bool on) {
    if (!on || !ms.prefetch) return;
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.x / (NT / OPB), m, Y);
    const size_t n0 = (size_t)tile * NT + (size_t)(blockIdx.x % (NT / OPB)) * OPB;
    const char *base[3];
    size_t stride[3];
    int rows[3], per[3];   /* rows of each array, 128-byte lines per row */
    int na = 0;
    if (m.fmt == IB_WF32) {
        base[0] = (const char *)(m.wf + n0), stride[0] = (size_t)m.Np * 4, rows[0] = m.K, per[0] = 1, na = 1;
    } else {
        const int kc = m.fmt == IB_WQ4 ? 32 : 16;
        base[0] = (const char *)(m.w + n0), stride[0] = (size_t)m.Np * 16, rows[0] = m.K / kc, per[0] = OPB / 8;
        base[1] = (const char *)(m.s + n0), stride[1] = (size_t)m.Np * 4, rows[1] = m.ng, per[1] = 1;
        base[2] = (const char *)(m.b + n0), stride[2] = (size_t)m.Np * 4, rows[2] = m.ng, per[2] = 1;
        na = 3;
    }
    for (int a = 0; a < na; a++)
        for (int i = threadIdx.x; i < rows[a] * per[a]; i += blockDim.x) {
            const char *p = base[a] + (size_t)(i / per[a]) * stride[a] + 128 * (i % per[a]);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
        }
}

/* A KV cache on the device. */
typedef struct cuda_kv {
    ib_kv pub;
    void *dev;
} cuda_kv;

/* One recorded op of a step: its kind and arguments (all it needs besides the instance's fixed state). */
typedef struct oprec {
    int op, a[REC_ARGS];
} oprec;
enum { OP_UPLOAD = 1, OP_EMBED, OP_RMSNORM, OP_LINEAR, OP_QK, OP_ATTN, OP_SWIGLU, OP_ADD, OP_LOGITS, OP_GEGLU, OP_MOE,
       OP_SCALE, OP_PLE_INPUTS, OP_PLE_LAYER };

/* A step shape seen before: the key (row counts, key block, fault, the op records) and, once it came
 * twice, its captured graph. */
typedef struct gcache {
    int R, n_items, n_logits, attn_block, fault, long_keys, n_tiles, kv_rows, nrec, nograph;
    oprec *rec;
    cudaGraph_t g;
    cudaGraphExec_t x;
    unsigned long long used;
} gcache;

/* One backend instance. */
typedef struct cuda_backend {
    ib_backend base;                 /* ops first: the runtime calls through it */
    int D, H, KVH, hd, F, V, L, R_max, Kmax;
    ib_act act;
    float eps, scale;
    double theta;
    cudaStream_t st;
    cudaError_t err;                 /* first failure since step_begin */
    const char *err_where;
    dmat *mats;                      /* [L][IB_W_COUNT] */
    dmat embed, lm_own;
    const dmat *lm_head;
    float *norms;                    /* [L][2][D] attn, mlp; then final [D]; then [L][2][hd] q, k */
    int has_qk_norm;
    float *buf[IB_BUF_COUNT];        /* [R_max][width] each */
    int8_t *xq;                      /* [R_max][Kmax] */
    float *qd, *qad;                 /* [R_max][Kmax/32] */
    float *logits;                   /* [LOGIT_CHUNK][V] */
    int32_t *d_tok, *d_lrow;         /* [R_max] */
    rowinfo *d_ri;                   /* [R_max] */
    float *d_cs;                     /* [R_max][hd/2][2] */
    /* pinned host staging of step_begin */
    int32_t *h_tok, *h_lrow, *h_pos;
    rowinfo *h_ri;
    float *h_cs;
    /* the step */
    int R, n_items, n_logits, attn_block;
    float **lout;                    /* [R_max] host logits buffers (NULL: argmax only) */
    int32_t **aout;                  /* [R_max] where each wanted row's argmax goes (NULL: none) */
    int want_logits, want_argmax;    /* some wanted row's logits / argmax go to the host this step */
    int32_t *d_amax, *h_amax;        /* [R_max] the wanted rows' argmax: device, pinned host */
    float *amax_v;                   /* [LOGIT_CHUNK][ARGMAX_SLICES] argmax_kernel's partial maxima, */
    int *amax_i;                     /* their ids [LOGIT_CHUNK][ARGMAX_SLICES], */
    unsigned *amax_cnt;              /* and [LOGIT_CHUNK] its finished blocks (zero between launches) */
    float *h_rows;                   /* read_rows / read_final scratch */
    size_t h_rows_n;
    int fault;                       /* ib_fault_get() at step_begin */
    ib_pool *pool;                   /* host threads for the logits copy (may be NULL) */
    float *h_logits;                 /* pinned [h_logits_rows][V]: the step's logits come back here */
    int h_logits_rows;
    /* the step's ops, recorded, then run at step_end as a cached graph (or directly) */
    struct oprec *rec;
    int nrec, caprec;
    int use_graphs;
    int pdl;                         /* launch with programmatic dependent launch (IB_CUDA_PDL=0: off) */
    int mma_rows;                    /* Q8 products of at least this many rows use the tensor cores */
    int mma_bm;                      /* forced rows per block of the tiled kernel (32, 64; 0: by the grid's size) */
    int n_sm;                        /* the device's multiprocessors */
    int att_group_rows;              /* attention takes a block per KV head from this many rows */
    int repeat;                      /* REPEAT_* kernels launched twice (IB_CUDA_REPEAT: timing by difference) */
    int moe_split;                   /* Q8 expert products split K over a block's warps (IB_CUDA_MOE_SPLIT=0: a warp walks K) */
    mm_prefetch_mode mm_prefetch;    /* which product blocks ask L2 for their weight tiles before the wait */
    mm_stage_mode mm_stage;          /* which one-row products stage the row's codes in shared memory */
    mma_kernel_mode mma_kernel;      /* which tensor-core kernel takes few rows on small grids */
    mma_narrow_mode mma_narrow;      /* where that kernel's blocks take 16 outputs */
    size_t l2_bytes;                 /* the device's L2 cache */
    int att_stage;                   /* most bytes per-head attention stages keys and values in (0: none) */
    int att_cl;                      /* blocks (a cluster) a head of the per-head attention, where the grid allows */
    int att_split_keys;              /* ... and where some row of the step attends at least this many keys */
    int long_keys;                   /* the step has such a row (step_begin) */
    kv_rows_type kv_rows;            /* the step's rows' KV types (step_begin) */
    att_tiles_mode att_tiles;        /* prompts' rows attending in tiles (attention_tile_kernel) */
    fuse_qk_mode fuse_qk;            /* decode steps' q/k preparation done by their attention (qk_fusable) */
    att_direct_mode att_direct;      /* per-head attention's keys into registers where they fit, or staged */
    att_wide_mode att_wide;          /* direct attention in ATT_THREADS_WIDE blocks: never, small grids (default), always */
    int n_tiles;                     /* the step's tiles when it attends in tiles, else 0 (step_begin) */
    int tile_rows;                   /* most rows a tile (<= TILE_ROWS; IB_CUDA_ATT_TILE_ROWS) */
    struct att_tile *h_tiles, *d_tiles;   /* [R_max] pinned staging, device */
    int q_ready_buf, q_ready_G;      /* buffer whose Q8 form (group G) a fused norm just wrote, or -1 */
    struct gcache *gc;               /* [NGRAPH] */
    unsigned long long tick;
    void **alloc_list;               /* [cap_alloc] device allocations (freed at destroy) */
    int n_alloc, cap_alloc;
    int *lhd, *lkvh;                 /* [L] each layer's head dim and KV heads (host) */
    struct gemma_state *gm;          /* Gemma 4's state (gemma_kernels.cuh); NULL for other families */
} cuda_backend;

static void drop_graphs(cuda_backend *b);
/* Gemma 4 (gemma_kernels.cuh, included before the op records' execution) */
struct gemma_state;
static ib_status gemma_create(cuda_backend *b, const ib_model *m, ib_error *err);
static void gemma_free(struct gemma_state *g);
static const float *gemma_norm(const cuda_backend *b, int n, int li);
static void gemma_step_begin(cuda_backend *b);
static void gemma_upload(cuda_backend *b);
static void gemma_after_embed(cuda_backend *b);
static void gemma_softcap(cuda_backend *b, float *L, int n);
static void gemma_launch_attention(cuda_backend *b, int li, int qG);

/* Record the first CUDA failure of a step (reported by step_end). */
static void note(cuda_backend *b, cudaError_t e, const char *where) {
    if (e != cudaSuccess && b->err == cudaSuccess) b->err = e, b->err_where = where;
}
#define LAUNCHED(b, what) note((b), cudaGetLastError(), (what))

/* Enqueue kernel k on b's stream (grid, block, dynamic shared bytes, its arguments) in clusters of cl
 * blocks along x (cl > 1: thread block clusters; the grid a multiple of cl), with programmatic dependent
 * launch when b->pdl (each kernel waits for its predecessor itself: PDL_ENTER). */
/* How many times a kernel of kind `kind` (REPEAT_*) is launched: twice under IB_CUDA_REPEAT, else once. */
static int launches(const cuda_backend *b, int kind) { return b->repeat & kind ? 2 : 1; }

template <typename... KArgs, typename... Args>
static void launch_cl(cuda_backend *b, int cl, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = b->st;
    cudaLaunchAttribute at[2];
    memset(at, 0, sizeof at);
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = b->pdl ? 1 : 0;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = (unsigned)cl, at[1].val.clusterDim.y = 1, at[1].val.clusterDim.z = 1;
    cfg.attrs = at, cfg.numAttrs = cl > 1 ? 2 : 1;
    note(b, cudaLaunchKernelEx(&cfg, k, (KArgs)args...), "launch");
}
template <typename... KArgs, typename... Args>
static void launch(cuda_backend *b, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
    launch_cl(b, 1, k, grid, block, smem, args...);
}

/* ---------------------------------------------------------------- kernels: products */

/* a·b over 4 byte lanes, a unsigned (weight codes 0..255), b signed (activation codes), plus c. */
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* Code q(n, k) of a quantized device matrix. */
__device__ __forceinline__ int code_at(const dmat &m, int n, int k) {
    if (m.fmt == IB_WQ4) {
        const uint4 v = m.w[(size_t)(k >> 5) * m.Np + n];
        const int i = (k & 31) >> 3, e = k & 7;
        const unsigned w = i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
        return e < 4 ? (int)((w >> (8 * e)) & 15u) : (int)((w >> (8 * (e - 4) + 4)) & 15u);
    }
    const uint4 v = m.w[(size_t)(k >> 4) * m.Np + n];
    const int i = (k & 15) >> 2, e = k & 3;
    const unsigned w = i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
    return (int)((w >> (8 * e)) & 255u);
}

/* Weight (n, k) as float: stored float, or s*(float)q + b (mul, then add) — ib_matrix_row_f32's formula. */
__device__ __forceinline__ float weight_at(const dmat &m, int n, int k) {
    if (m.fmt == IB_WF32) return m.wf[(size_t)k * m.Np + n];
    const size_t gi = (size_t)(k / m.G) * m.Np + n;
    return m.s[gi] * (float)code_at(m, n, k) + m.b[gi];
}

/* The weights of output n in group g of quantized matrix m: its cpg (<= MAXC) 16-byte code words into
 * wl, its scale and bias — one group's loads, issued together. */
template <int MAXC>
__device__ __forceinline__ void group_weights(const dmat &m, int g, int n, int cpg, uint4 (&wl)[MAXC], float &sc,
                                              float &bi) {
#pragma unroll
    for (int c = 0; c < MAXC; c++)
        if (c < cpg) wl[c] = m.w[(size_t)(g * cpg + c) * m.Np + n];
    sc = m.s[(size_t)g * m.Np + n], bi = m.b[(size_t)g * m.Np + n];
}

/* k per 16-byte code word (32 4-bit codes, 16 8-bit ones), and the most code words of a group (groups of
 * 128: 4 or 8). */
#define MM_KC(FMT) ((FMT) == IB_WQ4 ? 32 : 16)
#define MM_MAXC(FMT) ((FMT) == IB_WQ4 ? 4 : 8)

/* The exact integer sum of one group's codes (the uint4 words wg[0..cpg)) with one row's activation
 * codes xr [G] (int8), by dp4a. */
template <int FMT, int MAXC = MM_MAXC(FMT)>
__device__ __forceinline__ int group_isum(const uint4 *wg, int cpg, const int8_t *__restrict__ xr) {
    constexpr int KC = MM_KC(FMT);
    int a = 0;
#pragma unroll
    for (int c = 0; c < MAXC; c++) {
        if (c >= cpg) break;
        const uint4 wv = wg[c];
        const int4 *xp = (const int4 *)(xr + c * KC);
        if (FMT == IB_WQ4) {
            const int4 xa = xp[0], xb = xp[1];
            a = __dp4a((int)(wv.x & 0x0f0f0f0fu), xa.x, a);
            a = __dp4a((int)((wv.x >> 4) & 0x0f0f0f0fu), xa.y, a);
            a = __dp4a((int)(wv.y & 0x0f0f0f0fu), xa.z, a);
            a = __dp4a((int)((wv.y >> 4) & 0x0f0f0f0fu), xa.w, a);
            a = __dp4a((int)(wv.z & 0x0f0f0f0fu), xb.x, a);
            a = __dp4a((int)((wv.z >> 4) & 0x0f0f0f0fu), xb.y, a);
            a = __dp4a((int)(wv.w & 0x0f0f0f0fu), xb.z, a);
            a = __dp4a((int)((wv.w >> 4) & 0x0f0f0f0fu), xb.w, a);
        } else {
            const int4 xa = xp[0];
            a = dp4a_us(wv.x, xa.x, a);
            a = dp4a_us(wv.y, xa.y, a);
            a = dp4a_us(wv.z, xa.z, a);
            a = dp4a_us(wv.w, xa.w, a);
        }
    }
    return a;
}

/* Y[r][n] (row stride ldy) for r < R, n < N, Q8 activations (matmul.h): per (row, output) the groups'
 * terms t_g = (s*d)*(float)isum and u_g = b*ad, combined in ascending group order as
 * acc = (acc + t_g) + u_g.
 * Block (x: OPB outputs — 32, one per lane, or 8 when the grid would be small: part x % (32 / OPB) of
 * 32-output tile x / (32 / OPB), lane l taking output l % OPB of the group set l / OPB; y: rpb rows, a
 * multiple of RBT chosen from the grid's size only: it never changes the arithmetic). In each pass of
 * RBT rows and GC = 128/RBT groups, the warps' group sets (8 * 32 / OPB of them) take groups one each,
 * two rounds at a time (weights, scales, biases and the rows' d, ad loaded together, so a warp's loads
 * are in flight at once), compute each row's exact int32 sum by dp4a and the two terms, and park them in
 * shared memory; then warp r's lanes < OPB run row r's chains over the pass's groups in order.
 * xq [R][K] int8, d/ad [R][K/G]. fused: the test-only gpu-fma fault (t_g = fma(s*d, isum, u_g), u_g 0:
 * a fused multiply-add in the epilogue). splits > 1: the test-only gpu-split-k fault — block z takes only
 * the z-th of `splits` group ranges and adds its partial chain into Y (zeroed) with atomics, in whatever
 * order the blocks finish (1: the canonical product).
 * MAXC: the most 16-byte code words a group (MM_MAXC; fewer registers where the groups are short).
 * XS: one row a block (RBT = rpb = 1) whose K activation codes the block first copies into dynamic
 * shared memory (K bytes), so each round's sums read them there and not from L2 after its weights
 * arrive — which one-row products do: mm_stage_mode; the same sums. */
#define MM_XS_MAX_K 12288   /* most activation codes a block stages (with 32 KB of static shared memory) */
template <int FMT, int RBT, int OPB, int MAXC = MM_MAXC(FMT), bool XS = false>
__global__ void __launch_bounds__(256) mm_q8_kernel(mset ms, const int8_t *__restrict__ xq, const float *__restrict__ d,
                                                    const float *__restrict__ ad, int R, int rpb, int fused,
                                                    int splits) {
    prefetch_tile<OPB>(ms, blockIdx.y == 0 && blockIdx.z == 0);
    PDL_ENTER();
    constexpr int GC = 128 / RBT;
    constexpr int SETS = NWARP * (NT / OPB);   /* group sets of the block: one group each per round */
    constexpr int KC = MM_KC(FMT);   /* k per uint4 */
    __shared__ float t_s[RBT][GC][OPB], u_s[RBT][GC][OPB];
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.x / (NT / OPB), m, Y), ldy = m.N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o = lane % OPB, set = warp * (NT / OPB) + lane / OPB;
    const int n = tile * NT + (blockIdx.x % (NT / OPB)) * OPB + o;
    const int K = m.K, G = m.G, ng = m.ng;
    const int cpg = G / KC;
    const int rbeg = blockIdx.y * rpb, rend = min(R, rbeg + rpb);
    const int gs = (ng + splits - 1) / splits, gb = blockIdx.z * gs, ge = min(ng, gb + gs);
    extern __shared__ __align__(16) int8_t x_s[];   /* XS: [K] the row's activation codes */
    if (XS) {
        const int4 *src = (const int4 *)(xq + (size_t)rbeg * K);
        for (int i = threadIdx.x; i < K / 16; i += blockDim.x) ((int4 *)x_s)[i] = src[i];
        __syncthreads();
    }
    for (int r0 = rbeg; r0 < rend; r0 += RBT) {
        const int nr = min(RBT, rend - r0);
        float acc = 0.0f;   /* row r0 + warp, output n (lanes < OPB) */
        for (int g0 = gb; g0 < ge; g0 += GC) {
            const int gn = min(GC, ge - g0);
            for (int gi0 = set; gi0 < gn; gi0 += 2 * SETS) {
                /* groups gi0 and gi0 + SETS: every load first */
                uint4 wg[2][MAXC];
                float sc[2], bi[2], dd[2][RBT], aa[2][RBT];
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    const int gi = gi0 + x * SETS, g = g0 + gi;
                    if (gi >= gn) break;
                    group_weights<MAXC>(m, g, n, cpg, wg[x], sc[x], bi[x]);
#pragma unroll
                    for (int r = 0; r < RBT; r++)
                        if (r < nr) dd[x][r] = d[(size_t)(r0 + r) * ng + g], aa[x][r] = ad[(size_t)(r0 + r) * ng + g];
                }
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    const int gi = gi0 + x * SETS, g = g0 + gi;
                    if (gi >= gn) break;
#pragma unroll
                    for (int r = 0; r < RBT; r++) {
                        if (r >= nr) break;
                        const int is = group_isum<FMT, MAXC>(wg[x], cpg, XS ? x_s + (size_t)g * G : xq + (size_t)(r0 + r) * K + (size_t)g * G);
                        const float sd = sc[x] * dd[x][r], u = bi[x] * aa[x][r], fi = (float)is;
                        if (fused) {
                            t_s[r][gi][o] = __fmaf_rn(sd, fi, u);
                            u_s[r][gi][o] = 0.0f;
                        } else {
                            t_s[r][gi][o] = sd * fi;
                            u_s[r][gi][o] = u;
                        }
                    }
                }
            }
            __syncthreads();
            if (warp < nr && lane < OPB) {
#pragma unroll 8
                for (int gi = 0; gi < gn; gi++) acc = (acc + t_s[warp][gi][lane]) + u_s[warp][gi][lane];
            }
            __syncthreads();
        }
        if (warp < nr && lane < OPB && n < m.N) {
            if (splits > 1) atomicAdd(&Y[(size_t)(r0 + warp) * ldy + n], acc);
            else Y[(size_t)(r0 + warp) * ldy + n] = acc;
        }
    }
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

/* d += a · b for one m16n8k32 tile: a 16x32 int8 activations (row major fragment), b 32x8 weight codes
 * (int8 for 4-bit codes, uint8 for 8-bit ones), d 16x8 int32. */
template <int FMT>
__device__ __forceinline__ void mma_k32(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    mma_i8<false, FMT == IB_WQ8>(d, a, b0, b1);
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
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

#define GCH 16             /* groups per pass of mm_q8_mma16_kernel: shared isums [GCH][16][33] */
/* The Q8 product of mm_q8_kernel for many rows, on the tensor cores, where the grid is small (too few
 * blocks for mm_q8_gemm_kernel, which walks K in one block per tile; launch_products chooses between
 * this kernel and mm_q8_mma_pipe_kernel by mma_kernel_mode): block tile 16 rows x 32 outputs whose
 * warps split the groups, their weights loaded straight into the mma fragments.
 * In each pass of GCH groups, the block stages the pass's scales and biases of its 32 outputs and d, ad
 * of its 16 rows in shared memory, and warp w takes groups w, w+8, …: their integer sums come from
 * mma.sync (s8 x s8/u8 -> s32, exact: the same isum as any order) into shared memory; then each thread
 * continues the float chains of two (row, output) pairs over those groups in ascending order:
 * acc = (acc + (s*d)*(float)isum) + b*ad — matmul.h's arithmetic, bit for bit. fused, splits: the
 * test-only faults, as mm_q8_kernel. */
template <int FMT>
__global__ void __launch_bounds__(256) mm_q8_mma16_kernel(mset ms, const int8_t *__restrict__ xq, const float *__restrict__ d,
                                                        const float *__restrict__ ad, int R, int fused, int splits) {
    prefetch_tile(ms, blockIdx.y == 0 && blockIdx.z == 0);
    PDL_ENTER();
    __shared__ int isum_s[GCH][16][33];
    /* the pass's scales and biases of the tile's outputs, and d, ad of its rows */
    __shared__ float s_s[GCH][32], b_s[GCH][32], d_s[GCH][16], ad_s[GCH][16];
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.x, m, Y), ldy = m.N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, t = lane & 3;
    const int K = m.K, G = m.G, ng = m.ng, Np = m.Np;
    const int r0 = blockIdx.y * 16, n0 = tile * 32;
    const int ra = r0 + gq, rb = r0 + gq + 8;
    const bool oka = ra < R, okb = rb < R;
    const int8_t *xa = xq + (size_t)(oka ? ra : 0) * K, *xb = xq + (size_t)(okb ? rb : 0) * K;
    const unsigned *w = (const unsigned *)m.w;
    const int ksteps = G / 32;
    float acc[2] = {0.0f, 0.0f};   /* pairs p = tid, tid + 256: row r0 + p/32, output n0 + p%32 */
    const int gs = (ng + splits - 1) / splits, gb = blockIdx.z * gs, ge = min(ng, gb + gs);
    for (int g0 = gb; g0 < ge; g0 += GCH) {
        const int gn = min(GCH, ge - g0);
        for (int i = threadIdx.x; i < gn * 32; i += blockDim.x) {
            const size_t wi = (size_t)(g0 + i / 32) * Np + n0 + (i & 31);
            s_s[i / 32][i & 31] = m.s[wi], b_s[i / 32][i & 31] = m.b[wi];
        }
        for (int i = threadIdx.x; i < gn * 16; i += blockDim.x) {
            const int row = r0 + (i & 15);
            const size_t ai = (size_t)(row < R ? row : 0) * ng + g0 + i / 16;
            d_s[i / 16][i & 15] = d[ai], ad_s[i / 16][i & 15] = ad[ai];
        }
        /* warp w: groups w and w + NWARP of the pass, each 32 k's loads of both issued before their mma */
        for (int gi0 = warp; gi0 < gn; gi0 += 2 * NWARP) {
            const int nx = gi0 + NWARP < gn ? 2 : 1;
            int is[2][4][4];
#pragma unroll
            for (int x = 0; x < 2; x++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) is[x][nt][e] = 0;
#pragma unroll 2
            for (int ks = 0; ks < ksteps; ks++) {
                unsigned a[2][4], b0[2][4], b1[2][4];
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    if (x >= nx) break;
                    const int k0 = (g0 + gi0 + x * NWARP) * G + ks * 32;
                    a[x][0] = oka ? *(const unsigned *)(xa + k0 + 4 * t) : 0u;
                    a[x][1] = okb ? *(const unsigned *)(xb + k0 + 4 * t) : 0u;
                    a[x][2] = oka ? *(const unsigned *)(xa + k0 + 16 + 4 * t) : 0u;
                    a[x][3] = okb ? *(const unsigned *)(xb + k0 + 16 + 4 * t) : 0u;
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        const int n = n0 + nt * 8 + gq;
                        if (FMT == IB_WQ4) {
                            /* chunk k0/32: word i holds k 8i..8i+7 (low nibbles the first 4) */
                            const size_t base = ((size_t)(k0 >> 5) * Np + n) * 4;
                            const unsigned w0 = w[base + (t >> 1)], w1 = w[base + 2 + (t >> 1)];
                            b0[x][nt] = ((t & 1) ? w0 >> 4 : w0) & 0x0f0f0f0fu;
                            b1[x][nt] = ((t & 1) ? w1 >> 4 : w1) & 0x0f0f0f0fu;
                        } else {
                            b0[x][nt] = w[((size_t)(k0 >> 4) * Np + n) * 4 + t];
                            b1[x][nt] = w[((size_t)((k0 >> 4) + 1) * Np + n) * 4 + t];
                        }
                    }
                }
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    if (x >= nx) break;
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) mma_k32<FMT>(is[x][nt], a[x], b0[x][nt], b1[x][nt]);
                }
            }
#pragma unroll
            for (int x = 0; x < 2; x++) {
                if (x >= nx) break;
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        isum_s[gi0 + x * NWARP][gq + (e >= 2 ? 8 : 0)][nt * 8 + 2 * t + (e & 1)] = is[x][nt][e];
            }
        }
        __syncthreads();
#pragma unroll
        for (int pp = 0; pp < 2; pp++) {
            const int pr = threadIdx.x + pp * 256, rl = pr >> 5, cl = pr & 31, row = r0 + rl;
            if (row < R) {
                float x = acc[pp];
#pragma unroll 8
                for (int gi = 0; gi < gn; gi++) {
                    const float sc = s_s[gi][cl], bi = b_s[gi][cl], dd = d_s[gi][rl], aa = ad_s[gi][rl];
                    const float sd = sc * dd, u = bi * aa, fi = (float)isum_s[gi][rl][cl];
                    if (fused) x = __fmaf_rn(sd, fi, x);
                    else x = x + sd * fi;
                    x = x + u;
                }
                acc[pp] = x;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int pp = 0; pp < 2; pp++) {
        const int pr = threadIdx.x + pp * 256, row = r0 + (pr >> 5), n = n0 + (pr & 31);
        if (row < R && n < m.N) {
            if (splits > 1) atomicAdd(&Y[(size_t)row * ldy + n], acc[pp]);
            else Y[(size_t)row * ldy + n] = acc[pp];
        }
    }
}

/* d += a · b for one m16n8k32 tile with the weights on the left: a 16x32 weight codes (row major
 * fragment: 16 outputs x 32 k; int8 for 4-bit codes, uint8 for 8-bit ones), b 32x8 int8 activations
 * (8 rows), d 16x8 int32 (outputs x rows). */
template <int FMT>
__device__ __forceinline__ void mma_k32_wa(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    mma_i8<FMT == IB_WQ8, false>(d, a, b0, b1);
}

/* One pipeline stage of mm_q8_mma_pipe_kernel: SK_KS = 512 k of the block's NB outputs' weight codes and
 * of its 8 * NR rows' activation codes, with the scales, biases, d and ad of the (at most SK_KS / 32)
 * groups that k range holds. */
#define SK_KS 512                 /* k per stage (16 slots of 32 k, two a warp) */
#define SK_AROW (SK_KS + 16)      /* bytes of a staged activation row (padded: conflict-free fragment reads) */
template <int FMT, int NR, int NB>
struct sk_stage {
    uint4 w[SK_KS / MM_KC(FMT)][NB];   /* weight chunks x outputs */
    uint8_t a[8 * NR][SK_AROW];        /* activation codes: rows x k */
    float s[SK_KS / 32][NB], b[SK_KS / 32][NB];
    float d[SK_KS / 32][8 * NR], ad[SK_KS / 32][8 * NR];
};
/* Dynamic shared bytes of mm_q8_mma_pipe_kernel<FMT, NR, NB, NS>. */
template <int FMT, int NR, int NB, int NS>
constexpr size_t sk_smem_bytes() { return NS * sizeof(sk_stage<FMT, NR, NB>); }
/* (row, output) pairs a thread of mm_q8_mma_pipe_kernel<.., NR, NB, ..> keeps (its NB * 8 * NR pairs over
 * 256 threads; some threads none where there are fewer) */
#define SK_PPT(NR, NB) ((NB) * (NR) >= 32 ? (NB) * (NR) / 32 : 1)

/* The float chains of mm_q8_mma_pipe_kernel's stage for this thread's (row, output) pairs (pair p =
 * threadIdx.x + 256 * i < NB * 8 * NR: row p / NB, output p % NB), over the stage's gn groups in ascending order:
 * acc = (acc + (s*d)*(float)isum) + b*ad, group j's isum the exact sum of its tiles in isum_s — tile j
 * (GPS 16: groups of 32 k, one a slot), or the tiles of warps j * WPG .. (j + 1) * WPG - 1. GPS, WPG:
 * groups a stage and warps a group where they are known when compiled (0: from G at run time). */
template <int FMT, int NR, int NB, int GPS, int WPG, typename IS>
__device__ __forceinline__ void sk_chains(float (&acc)[SK_PPT(NR, NB)], const sk_stage<FMT, NR, NB> &S, const IS &isum_s,
                                          int gn, int G, int fused) {
    const int gps = GPS ? GPS : SK_KS / G, wpg = GPS ? WPG : G / 64;
#pragma unroll
    for (int i = 0; i < SK_PPT(NR, NB); i++) {
        const unsigned p = threadIdx.x + 256u * i;
        const int rl = (int)(p / NB), cl = (int)(p % NB);
        if (NB * NR < 32 && p >= NB * 8 * NR) break;
        float x = acc[i];
#pragma unroll
        for (int j = 0; j < (GPS ? GPS : SK_KS / 32); j++) {
            if (j >= gn || j >= gps) break;
            int isum;
            if (GPS ? GPS == SK_KS / 32 : G == 32) isum = isum_s[j >> 1][j & 1][rl][cl];
            else {
                isum = 0;
#pragma unroll
                for (int w = 0; w < (GPS ? WPG : NWARP); w++)
                    if (w < wpg) isum += isum_s[j * wpg + w][0][rl][cl];
            }
            const float sd = S.s[j][cl] * S.d[j][rl], u = S.b[j][cl] * S.ad[j][rl], fi = (float)isum;
            if (fused) x = __fmaf_rn(sd, fi, x);
            else x = x + sd * fi;
            x = x + u;
        }
        acc[i] = x;
    }
}

/* The Q8 product of mm_q8_kernel for a few rows (at most 16 a block), on the tensor cores, where the
 * grid is small (too few blocks for mm_q8_gemm_kernel, whose blocks hold 32-64 rows: launch_products
 * chooses). Block: NB (32 or 16) outputs of mset ms — part x % (32 / NB) of 32-output tile x / (32 / NB)
 * — x 8 * NR rows (blockIdx.y), 8 warps.
 * K is walked in stages of SK_KS k through an NS-deep cp.async pipeline into shared memory (the
 * weights of the first stages asked for before the wait for the previous kernel), so the weight stream
 * goes on while the chains of earlier stages run. In a stage, warp w takes its two 32-k slots: each
 * slot's integer sums over the block's NB outputs x 8 * NR rows come from mma.sync m16n8k32 with the
 * weights as the left operand (s8/u8 x s8 -> s32, exact: any order gives the group's isum) and go to
 * shared memory — one tile a slot where groups are 32 k, one a warp where they are longer (the warp's
 * two slots lie in one group) — then each thread continues the float chains of its (row, output) pairs
 * over the stage's groups in ascending order, a group's isum the exact sum of its tiles:
 * acc = (acc + (s*d)*(float)isum) + b*ad — matmul.h's arithmetic, bit for bit.
 * Needs G % 32 == 0 and G dividing SK_KS. fused, splits: the test-only faults, as mm_q8_kernel
 * (splits: block z takes the z-th group range and adds its partial chain into Y with atomics). */
template <int FMT, int NR, int NB, int NS>
__global__ void __launch_bounds__(256) mm_q8_mma_pipe_kernel(mset ms, const int8_t *__restrict__ xq, const float *__restrict__ d,
                                                             const float *__restrict__ ad, int R, int fused, int splits) {
    constexpr int KC = MM_KC(FMT), RT = 8 * NR, MT = NB / 16;   /* k per chunk, rows a block, 16-output tiles */
    constexpr int WPT = (SK_KS / KC) * NB / 256;   /* weight chunks a thread a stage: 1-4 */
    constexpr int SBQ = NB / 4;                    /* 16-byte pieces of a group's scales (or biases) */
    extern __shared__ __align__(16) unsigned char sk_smem[];
    sk_stage<FMT, NR, NB> *stg = (sk_stage<FMT, NR, NB> *)sk_smem;
    __shared__ int isum_s[NWARP][2][RT][NB + 1];   /* [warp][slot of the warp or 0][row][output] */
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.x / (NT / NB), m, Y), ldy = m.N;
    const int K = m.K, G = m.G, ng = m.ng, Np = m.Np;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.y * RT, n0 = tile * NT + (blockIdx.x % (NT / NB)) * NB, nib = 4 * (t & 1);   /* nib: this lane's nibbles (Q4) */
    const int gs = (ng + splits - 1) / splits, gb = blockIdx.z * gs, ge = min(ng, gb + gs);
    const int kb = gb * G, ke = ge * G;                              /* the block's k range */
    const int gps = SK_KS / G;                                       /* groups a stage */
    const int nst = ke > kb ? (ke - kb + SK_KS - 1) / SK_KS : 0;     /* stages */

    /* Each thread's share of every stage's copies, fixed over the stages (a stage moves the sources by
     * its k; a copy past the block's k or group range is left out): weight chunks (c, output nl);
     * scale/bias pieces (threads < 2 * gps * SBQ: array, group slot j, 4 outputs); activation pieces (row r,
     * 16 k; rows past R repeat row R - 1, whose sums no one keeps); d/ad floats (array, group slot j,
     * row r). */
    const uint4 *w_src[WPT];
    int w_dst[WPT], w_k[WPT];
#pragma unroll
    for (int u = 0; u < WPT; u++) {
        const int i = tid + 256 * u, c = i / NB, nl = i % NB;
        w_k[u] = c * KC;
        w_src[u] = m.w + (size_t)(kb / KC + c) * Np + n0 + nl;
        w_dst[u] = (int)((char *)&stg[0].w[c][nl] - (char *)stg);
    }
    const int sb_arr = tid / (SBQ * gps), sb_j = (tid / SBQ) % gps, sb_q = tid % SBQ;
    const bool sb_ok = tid < 2 * SBQ * gps;
    const float *sb_src = (sb_arr ? m.b : m.s) + (size_t)(gb + sb_j) * Np + n0 + 4 * sb_q;
    const int sb_dst = (int)((char *)(sb_arr ? &stg[0].b[sb_j][4 * sb_q] : &stg[0].s[sb_j][4 * sb_q]) - (char *)stg);
    const int8_t *x_src[NR];
    int x_dst[NR], x_k[NR];
#pragma unroll
    for (int u = 0; u < NR; u++) {
        const int i = tid + 256 * u, r = i / (SK_KS / 16), c = i % (SK_KS / 16);
        x_src[u] = xq + (size_t)min(r0 + r, R - 1) * K + kb + 16 * c, x_k[u] = 16 * c;
        x_dst[u] = (int)((char *)&stg[0].a[r][16 * c] - (char *)stg);
    }
    const float *d_src[NR];
    int d_dst[NR], d_j[NR];
    bool d_ok[NR];
#pragma unroll
    for (int u = 0; u < NR; u++) {
        const int i = tid + 256 * u, arr = i / (gps * RT), j = (i / RT) % gps, r = i % RT;
        d_ok[u] = i < 2 * gps * RT, d_j[u] = j;
        d_src[u] = (arr ? ad : d) + (size_t)min(r0 + r, R - 1) * ng + gb + j;
        d_dst[u] = (int)((char *)(arr ? &stg[0].ad[j][r] : &stg[0].d[j][r]) - (char *)stg);
    }
    /* the weight side of stage st (codes, scales, biases): independent of earlier kernels */
    auto load_w = [&](int st) {
        char *S = (char *)&stg[st % NS];
        const int k0 = kb + st * SK_KS;
#pragma unroll
        for (int u = 0; u < WPT; u++)
            if (k0 + w_k[u] < ke) cp_async16(S + w_dst[u], w_src[u] + (size_t)st * (SK_KS / KC) * Np);
        if (sb_ok && gb + st * gps + sb_j < ge) cp_async16(S + sb_dst, sb_src + (size_t)(st * gps) * Np);
    };
    /* the activation side of stage st (codes, d, ad): written by the previous kernels */
    auto load_x = [&](int st) {
        char *S = (char *)&stg[st % NS];
        const int k0 = kb + st * SK_KS;
#pragma unroll
        for (int u = 0; u < NR; u++)
            if (k0 + x_k[u] < ke) cp_async16(S + x_dst[u], x_src[u] + (size_t)st * SK_KS);
#pragma unroll
        for (int u = 0; u < NR; u++)
            if (d_ok[u] && gb + st * gps + d_j[u] < ge) cp_async4(S + d_dst[u], d_src[u] + st * gps);
    };

    /* the weights of the first stages before the wait for the previous kernel; each stage one group
     * of copies (the first holds every copy issued before it) */
    for (int st = 0; st < NS - 1; st++)
        if (st < nst) load_w(st);
    PDL_ENTER();
    for (int st = 0; st < NS - 1; st++) {
        if (st < nst) load_x(st);
        cp_commit();
    }

    float acc[SK_PPT(NR, NB)];   /* pairs p = tid + 256 * i: row r0 + p / NB, output n0 + p % NB */
#pragma unroll
    for (int i = 0; i < SK_PPT(NR, NB); i++) acc[i] = 0.0f;
    for (int st = 0; st < nst; st++) {
        cp_wait<NS - 2>();
        __syncthreads();   /* stage st is in; every thread is done with the buffer loaded next and the isums */
        if (st + NS - 1 < nst) {
            load_w(st + NS - 1);
            load_x(st + NS - 1);
        }
        cp_commit();
        const sk_stage<FMT, NR, NB> &S = stg[st % NS];
        const int k0 = kb + st * SK_KS, gA = gb + st * gps;
        /* warp w: slots 2w and 2w + 1 (k 64w .. 64w + 63 of the stage) */
        int is[MT][NR][4];   /* [16-output tile][8-row tile][fragment element] */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nr = 0; nr < NR; nr++)
#pragma unroll
                for (int e = 0; e < 4; e++) is[mt][nr][e] = 0;
#pragma unroll
        for (int sl = 0; sl < 2; sl++) {
            const int kk = 2 * warp + sl;
            if (k0 + kk * 32 >= ke) break;
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {   /* outputs 16 mt + gq and 16 mt + gq + 8 */
                    const int nl = 16 * mt + gq + 8 * h;
                    if (FMT == IB_WQ4) {
                        /* chunk kk: word i holds k 8i..8i+7 (low nibbles the first 4) */
                        const unsigned *wv = (const unsigned *)&S.w[kk][nl];
                        a[mt][h] = (wv[t >> 1] >> nib) & 0x0f0f0f0fu;
                        a[mt][2 + h] = (wv[2 + (t >> 1)] >> nib) & 0x0f0f0f0fu;
                    } else {
                        a[mt][h] = ((const unsigned *)&S.w[2 * kk][nl])[t];
                        a[mt][2 + h] = ((const unsigned *)&S.w[2 * kk + 1][nl])[t];
                    }
                }
#pragma unroll
            for (int nr = 0; nr < NR; nr++) {
                const uint8_t *xr = &S.a[8 * nr + gq][kk * 32];
                const unsigned b0 = *(const unsigned *)(xr + 4 * t), b1 = *(const unsigned *)(xr + 16 + 4 * t);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) mma_k32_wa<FMT>(is[mt][nr], a[mt], b0, b1);
            }
            /* a slot's tile where groups are 32 k; the warp's tile (both slots, one group) otherwise */
            if (G == 32 || sl == 1) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nr = 0; nr < NR; nr++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            isum_s[warp][G == 32 ? sl : 0][8 * nr + 2 * t + (e & 1)][16 * mt + gq + 8 * (e >> 1)] =
                                is[mt][nr][e];
                            is[mt][nr][e] = 0;
                        }
            }
        }
        __syncthreads();
        /* the chains over the stage's groups, in order (unrolled for the usual group sizes) */
        const int gn = min(gps, ge - gA);
        switch (G) {
        case 32: sk_chains<FMT, NR, NB, 16, 0>(acc, S, isum_s, gn, G, fused); break;
        case 64: sk_chains<FMT, NR, NB, 8, 1>(acc, S, isum_s, gn, G, fused); break;
        case 128: sk_chains<FMT, NR, NB, 4, 2>(acc, S, isum_s, gn, G, fused); break;
        default: sk_chains<FMT, NR, NB, 0, 0>(acc, S, isum_s, gn, G, fused); break;
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int i = 0; i < SK_PPT(NR, NB); i++) {
        const unsigned p = tid + 256u * i;
        const int row = r0 + (int)(p / NB), n = n0 + (int)(p % NB);
        if ((NB * NR >= 32 || p < NB * RT) && row < R && n < m.N) {
            if (splits > 1) atomicAdd(&Y[(size_t)row * ldy + n], acc[i]);
            else Y[(size_t)row * ldy + n] = acc[i];
        }
    }
}

/* mm_q8_mma_pipe_kernel for blocks of 8 * nr rows: 16 outputs a block (narrow: 5 stages for 8 rows, 4
 * for 16), or 32 with 5 stages (deep: grids of at most two blocks a multiprocessor) or 3 (more blocks a
 * multiprocessor, and 16-row blocks); its dynamic shared bytes into *sm. */
typedef void (*mm_q8_mma_fn)(mset, const int8_t *, const float *, const float *, int, int, int);
template <int FMT>
static mm_q8_mma_fn mma_pipe_pick_fmt(int nr, int narrow, int deep, size_t *sm) {
    if (narrow) {
        *sm = nr == 2 ? sk_smem_bytes<FMT, 2, 16, 4>() : sk_smem_bytes<FMT, 1, 16, 5>();
        return nr == 2 ? mm_q8_mma_pipe_kernel<FMT, 2, 16, 4> : mm_q8_mma_pipe_kernel<FMT, 1, 16, 5>;
    }
    if (nr == 2) {
        *sm = sk_smem_bytes<FMT, 2, 32, 3>();
        return mm_q8_mma_pipe_kernel<FMT, 2, 32, 3>;
    }
    *sm = deep ? sk_smem_bytes<FMT, 1, 32, 5>() : sk_smem_bytes<FMT, 1, 32, 3>();
    return deep ? mm_q8_mma_pipe_kernel<FMT, 1, 32, 5> : mm_q8_mma_pipe_kernel<FMT, 1, 32, 3>;
}
static mm_q8_mma_fn mma_pipe_pick(int fmt, int nr, int narrow, int deep, size_t *sm) {
    return fmt == IB_WQ4 ? mma_pipe_pick_fmt<IB_WQ4>(nr, narrow, deep, sm) : mma_pipe_pick_fmt<IB_WQ8>(nr, narrow, deep, sm);
}

/* Shared memory of one pipeline stage of mm_q8_gemm_kernel: KS = 128 k of BM rows' activation codes and
 * BN outputs' weight codes, and the scales, biases, d and ad of the (at most 4) groups the stage's k
 * range meets. */
#define MMA_KS 128     /* k per pipeline stage */
#define MMA_BN 64      /* outputs per block */
#define MMA_NS 3       /* pipeline stages */
#define MMA_AROW (MMA_KS + 16)   /* bytes of a staged activation row (padded: conflict-free reads) */
template <int BM>
struct mma_stage {
    uint8_t a[BM][MMA_AROW];       /* activation codes: rows x k */
    uint4 w[8][MMA_BN];            /* weight chunks (Q4: 4 of 32 k; Q8: 8 of 16 k) x outputs */
    float s[4][MMA_BN], b[4][MMA_BN];
    float d[4][BM], ad[4][BM];
};

/* The Q8 product of mm_q8_kernel for many rows, on the tensor cores, shaped as a tiled GEMM: block
 * (x: BM rows, fastest, so a weight tile's row blocks run together; y: MMA_BN outputs of mset ms, in
 * 64-output tiles t0[]), 8 warps as 2 x 4, each warp a tile of BM/2 rows x 16 outputs. K is walked
 * in stages of MMA_KS k through an MMA_NS-deep cp.async pipeline into shared memory (the weights of
 * the first stages are asked for before the wait for the previous kernel). For each 32 k a warp's
 * integer sums grow by mma.sync m16n8k32 (s8 x s8/u8 -> s32: exact, the group's isum in any order);
 * where a group ends, every (row, output) of the warp's tile continues its float chain in registers,
 * acc = (acc + (s*d)*(float)isum) + b*ad — matmul.h's arithmetic, groups in ascending order, bit for
 * bit. Needs G % 32 == 0 and G dividing MMA_KS (32, 64, 128). Each thread's copies are planned once
 * (sources, shared-memory offsets), so a stage's copy issue is a few instructions. fused, splits: the
 * test-only faults, as mm_q8_kernel (splits: block z takes the z-th group range and adds its partial
 * chain into Y with atomics). */
template <int FMT, int BM>
__global__ void __launch_bounds__(256) mm_q8_gemm_kernel(mset ms, const int8_t *__restrict__ xq, const float *__restrict__ d,
                                                        const float *__restrict__ ad, int R, int fused, int splits) {
    constexpr int MT = BM / 32;                       /* 16-row mma tiles per warp */
    constexpr int KC = MM_KC(FMT);       /* k per weight chunk (uint4) */
    constexpr int NCH = MMA_KS / KC;                  /* weight chunks per stage */
    extern __shared__ __align__(16) unsigned char mma_smem[];
    mma_stage<BM> *stg = (mma_stage<BM> *)mma_smem;
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.y, m, Y), ldy = m.N;
    const int K = m.K, G = m.G, ng = m.ng, Np = m.Np;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x * BM, n0 = tile * MMA_BN;
    const int wr = (warp >> 2) * (BM / 2), wn = (warp & 3) * 16;   /* the warp's tile in the block */
    const int gs = (ng + splits - 1) / splits, gb = blockIdx.z * gs, ge = min(ng, gb + gs);
    const int kb = gb * G, ke = ge * G;                              /* the block's k range */
    const int gps = MMA_KS / G;   /* groups a stage (G divides MMA_KS): stage st starts at group gb + st * gps */
    const int nst = ke > kb ? (ke - kb + MMA_KS - 1) / MMA_KS : 0;   /* stages */

    /* Each thread's share of every stage's copies, fixed over the stages: its weight chunks (c, output
     * nl), scale/bias pieces (threads < 128: array, group slot j, 4 outputs), activation pieces (row r, 16
     * k) and d/ad floats (array, group slot j, row r); a stage only moves the sources by its k, and a
     * copy whose k or group lies past the block's range is left out. */
    constexpr int WPT = NCH * MMA_BN / 256;         /* weight chunks a thread: 1 (Q4) or 2 (Q8) */
    constexpr int XPT = BM * (MMA_KS / 16) / 256;   /* activation pieces a thread: BM / 32 */
    constexpr int DPT = 2 * 4 * BM / 256;           /* d / ad floats a thread: BM / 32 */
    const uint4 *w_src[WPT];
    int w_dst[WPT], w_k[WPT];
    bool w_ok[WPT];
#pragma unroll
    for (int u = 0; u < WPT; u++) {
        const int i = tid + 256 * u, c = i / MMA_BN, nl = i % MMA_BN;
        w_ok[u] = n0 + nl < Np, w_k[u] = c * KC;
        w_src[u] = m.w + (size_t)(kb / KC + c) * Np + n0 + nl;
        w_dst[u] = (int)((char *)&stg[0].w[c][nl] - (char *)stg);
    }
    const int sb_j = (tid >> 4) & 3, sb_dst = (int)((char *)((tid >> 6) & 1 ? &stg[0].b[sb_j][4 * (tid & 15)]
                                                                         : &stg[0].s[sb_j][4 * (tid & 15)]) - (char *)stg);
    const float *sb_src = ((tid >> 6) & 1 ? m.b : m.s) + n0 + 4 * (tid & 15);
    const bool sb_ok = tid < 128 && n0 + 4 * (tid & 15) < Np;
    const int8_t *x_src[XPT];
    int x_dst[XPT], x_k[XPT];
#pragma unroll
    for (int u = 0; u < XPT; u++) {
        const int i = tid + 256 * u, r = i / (MMA_KS / 16), c = i % (MMA_KS / 16);
        x_src[u] = xq + (size_t)min(rb + r, R - 1) * K + kb + 16 * c, x_k[u] = 16 * c;
        x_dst[u] = (int)((char *)&stg[0].a[r][16 * c] - (char *)stg);
    }
    const float *d_src[DPT];
    int d_dst[DPT], d_j[DPT];
#pragma unroll
    for (int u = 0; u < DPT; u++) {
        const int i = tid + 256 * u, arr = i / (4 * BM), j = (i / BM) % 4, r = i % BM;
        d_src[u] = (arr ? ad : d) + (size_t)min(rb + r, R - 1) * ng, d_j[u] = j;
        d_dst[u] = (int)((char *)(arr ? &stg[0].ad[j][r] : &stg[0].d[j][r]) - (char *)stg);
    }
    /* the weight side of stage st (codes, scales, biases): independent of earlier kernels */
    auto load_w = [&](int st) {
        char *S = (char *)&stg[st % MMA_NS];
        const int k0 = kb + st * MMA_KS;
#pragma unroll
        for (int u = 0; u < WPT; u++)
            if (w_ok[u] && k0 + w_k[u] < ke) cp_async16(S + w_dst[u], w_src[u] + (size_t)st * NCH * Np);
        const int g = gb + st * gps + sb_j;
        if (sb_ok && g < ge && g * G < k0 + MMA_KS) cp_async16(S + sb_dst, sb_src + (size_t)g * Np);
    };
    /* the activation side of stage st (codes, d, ad): written by the previous kernels */
    auto load_x = [&](int st) {
        char *S = (char *)&stg[st % MMA_NS];
        const int k0 = kb + st * MMA_KS;
#pragma unroll
        for (int u = 0; u < XPT; u++)
            if (k0 + x_k[u] < ke) cp_async16(S + x_dst[u], x_src[u] + (size_t)st * MMA_KS);
        const int gA = gb + st * gps;
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int g = gA + d_j[u];
            if (g < ge && g * G < k0 + MMA_KS) cp_async4(S + d_dst[u], d_src[u] + g);
        }
    };

    /* the weights of the first stages before the wait for the previous kernel; each stage one group
     * of copies (the first holds every copy issued before it) */
    for (int st = 0; st < MMA_NS - 1; st++)
        if (st < nst) load_w(st);
    PDL_ENTER();
    for (int st = 0; st < MMA_NS - 1; st++) {
        if (st < nst) load_x(st);
        cp_commit();
    }

    float acc[MT][2][4];   /* [mma row tile][8-output tile][fragment element] */
    int is[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f, is[mt][nt][e] = 0;

    for (int st = 0; st < nst; st++) {
        cp_wait<MMA_NS - 2>();
        __syncthreads();   /* stage st is in; every warp is done with the buffer loaded next */
        if (st + MMA_NS - 1 < nst) {
            load_w(st + MMA_NS - 1);
            load_x(st + MMA_NS - 1);
        }
        cp_commit();
        const mma_stage<BM> &S = stg[st % MMA_NS];
        const int k0 = kb + st * MMA_KS, gA = gb + st * gps;
        int j = 0, left = (gA + 1) * G - k0;   /* the staged group being summed, its k still to come */
#pragma unroll
        for (int kk = 0; kk < MMA_KS / 32; kk++) {
            if (k0 + kk * 32 >= ke) break;
            unsigned b0[2], b1[2];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const int nl = wn + nt * 8 + gq;
                if (FMT == IB_WQ4) {
                    /* chunk kk: word i holds k 8i..8i+7 (low nibbles the first 4) */
                    const unsigned *wv = (const unsigned *)&S.w[kk][nl];
                    const unsigned w0 = wv[t >> 1], w1 = wv[2 + (t >> 1)];
                    b0[nt] = ((t & 1) ? w0 >> 4 : w0) & 0x0f0f0f0fu;
                    b1[nt] = ((t & 1) ? w1 >> 4 : w1) & 0x0f0f0f0fu;
                } else {
                    b0[nt] = ((const unsigned *)&S.w[2 * kk][nl])[t];
                    b1[nt] = ((const unsigned *)&S.w[2 * kk + 1][nl])[t];
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int r = wr + mt * 16 + gq;
                unsigned a[4];
                a[0] = *(const unsigned *)&S.a[r][kk * 32 + 4 * t];
                a[1] = *(const unsigned *)&S.a[r + 8][kk * 32 + 4 * t];
                a[2] = *(const unsigned *)&S.a[r][kk * 32 + 16 + 4 * t];
                a[3] = *(const unsigned *)&S.a[r + 8][kk * 32 + 16 + 4 * t];
#pragma unroll
                for (int nt = 0; nt < 2; nt++) mma_k32<FMT>(is[mt][nt], a, b0[nt], b1[nt]);
            }
            left -= 32;
            if (left == 0) {
                /* group gA + j ends here: its terms join every chain of the warp's tile, in group order */
                float sc[2][2], bi[2][2], dd[MT][2], aa[MT][2];
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int nl = wn + nt * 8 + 2 * t + c;
                        sc[nt][c] = S.s[j][nl], bi[nt][c] = S.b[j][nl];
                    }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int rl = wr + mt * 16 + gq + 8 * h;
                        dd[mt][h] = S.d[j][rl], aa[mt][h] = S.ad[j][rl];
                    }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float sd = sc[nt][e & 1] * dd[mt][e >> 1], u = bi[nt][e & 1] * aa[mt][e >> 1];
                            const float fi = (float)is[mt][nt][e];
                            float x = acc[mt][nt][e];
                            if (fused) x = __fmaf_rn(sd, fi, x);
                            else x = x + sd * fi;
                            acc[mt][nt][e] = x + u;
                            is[mt][nt][e] = 0;
                        }
                j++, left = G;
            }
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = rb + wr + mt * 16 + gq + 8 * (e >> 1), n = n0 + wn + nt * 8 + 2 * t + (e & 1);
                if (row < R && n < m.N) {
                    if (splits > 1) atomicAdd(&Y[(size_t)row * ldy + n], acc[mt][nt][e]);
                    else Y[(size_t)row * ldy + n] = acc[mt][nt][e];
                }
            }
}

/* Output n of x · W^T for one row x [K] with F32 activations: acc = acc + w*x over k ascending, w the
 * stored float or s*(float)q + b (matmul.h). fused: the test-only gpu-fma fault (acc = fma(w, x, acc)). */
template <int FMT>
__device__ __forceinline__ float f32_chain(const dmat &m, int n, const float *__restrict__ x, int fused) {
    const int Np = m.Np;
    float acc = 0.0f;
    if (FMT == IB_WF32) {
        for (int k = 0; k < m.K; k++) {
            const float w = m.wf[(size_t)k * Np + n];
            acc = fused ? __fmaf_rn(w, x[k], acc) : acc + w * x[k];
        }
        return acc;
    }
    constexpr int KC = MM_KC(FMT);
    for (int c = 0; c < m.K / KC; c++) {
        const size_t gi = (size_t)(c * KC / m.G) * Np + n;
        const float sc = m.s[gi], bi = m.b[gi];
        const uint4 v = m.w[(size_t)c * Np + n];
        const unsigned wd[4] = {v.x, v.y, v.z, v.w};
        const float *xc = x + c * KC;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < KC / 4; e++) {
                int q;
                if (FMT == IB_WQ4) q = e < 4 ? (int)((wd[i] >> (8 * e)) & 15u) : (int)((wd[i] >> (8 * (e - 4) + 4)) & 15u);
                else q = (int)((wd[i] >> (8 * e)) & 255u);
                const float w = sc * (float)q + bi;
                const float xv = xc[i * (KC / 4) + e];
                acc = fused ? __fmaf_rn(w, xv, acc) : acc + w * xv;
            }
    }
    return acc;
}

/* Y[r][n] for r < R, n < N, F32 activations: one thread per (row, output), f32_chain. Block: 32
 * outputs x 8 rows. X [R][K]. fused: the test-only gpu-fma fault. */
template <int FMT>
__global__ void __launch_bounds__(256) mm_f32_kernel(mset ms, const float *__restrict__ X, int R, int fused) {
    prefetch_tile(ms, blockIdx.y == 0);
    PDL_ENTER();
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.x, m, Y), ldy = m.N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = tile * NT + lane, row = blockIdx.y * NWARP + warp;
    if (row >= R) return;
    const float acc = f32_chain<FMT>(m, n, X + (size_t)row * m.K, fused);
    if (n < m.N) Y[(size_t)row * ldy + n] = acc;
}

/* ---------------------------------------------------------------- kernels: activation quantization */

/* clamp(rne(x * inv), -127, 127), 0 for NaN: the same float operations as matmul.c's quant_code. */
__device__ __forceinline__ int quant_code(float x, float inv) {
    const float rne = 12582912.0f; /* 1.5 * 2^23 */
    float v = (x * inv + rne) - rne;
    v = v > 127.0f ? 127.0f : v;
    v = v < -127.0f ? -127.0f : v;
    v = v == v ? v : 0.0f;
    return (int)v;
}

/* ib_quantize_act of one group of G floats xs (any memory) by one warp: codes into qs, d and ad into *d,
 * *ad (written by lane 0). amax is a maximum of non-NaN magnitudes (the same in any order); the code sum
 * is an exact integer. */
__device__ __forceinline__ void quantize_group(const float *xs, int G, int8_t *qs, float *d, float *ad, int lane) {
    float amax = 0.0f;
    for (int k = lane; k < G; k += 32) {
        const float a = fabsf(xs[k]);
        amax = a > amax ? a : amax;
    }
    for (int o = 16; o; o >>= 1) {
        const float b = __shfl_xor_sync(0xffffffffu, amax, o);
        amax = b > amax ? b : amax;
    }
    if (amax == 0.0f) {
        for (int k = lane; k < G; k += 32) qs[k] = 0;
        if (lane == 0) *d = 0.0f, *ad = 0.0f;
        return;
    }
    const float dd = amax / 127.0f, inv = 127.0f / amax;
    int sum = 0;
    for (int k = lane; k < G; k += 32) {
        const int c = quant_code(xs[k], inv);
        qs[k] = (int8_t)c;
        sum += c;
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) *d = dd, *ad = dd * (float)sum;
}

/* ib_quantize_act of X [R][K] for group G: one warp per (row, group). */
__global__ void quantize_kernel(const float *__restrict__ X, int R, int K, int G, int8_t *__restrict__ xq,
                                float *__restrict__ d, float *__restrict__ ad) {
    PDL_ENTER();
    const int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int ng = K / G;
    if (wid >= R * ng) return;
    const int r = wid / ng, g = wid % ng;
    const size_t di = (size_t)r * ng + g;
    quantize_group(X + (size_t)r * K + (size_t)g * G, G, xq + (size_t)r * K + (size_t)g * G, d + di, ad + di, lane);
}

/* ---------------------------------------------------------------- kernels: elementwise and norms */

/* The sum of squares of xs [n] (shared memory) in ib_dot16's order: lane j < 16 sums elements j, j+16, …
 * in order, then the 16 lanes fold 8, 4, 2, 1. Called by a whole warp (lane = its lane); lane 0 gets
 * the sum. */
__device__ __forceinline__ float sumsq16(const float *xs, int n, int lane) {
    float a = 0.0f;
    if (lane < 16) {
#pragma unroll 8
        for (int i = lane; i < n; i += 16) a = a + xs[i] * xs[i];
    }
    for (int wd = 8; wd >= 1; wd >>= 1) {
        const float o = __shfl_down_sync(0xffffffffu, a, wd, 16);
        if (lane < wd) a = a + o;
    }
    return a;
}

/* The norm factor 1/sqrt(ss/n + eps) of the vector xs [n] staged in shared memory (every thread's writes
 * before the call), ss its sum of squares in ib_dot16's order (sumsq16, by warp 0) or, with rev (the
 * test-only row-order fault), serially in reverse; r_s: shared scratch. Called by the whole block (two
 * barriers); every thread gets the factor. */
__device__ __forceinline__ float row_norm_factor(const float *xs, int n, float eps, int rev, float *r_s) {
    const int tid = threadIdx.x;
    if (tid < 32) {
        float a = 0.0f;
        if (rev) {
            if (tid == 0)
                for (int i = n - 1; i >= 0; i--) a = a + xs[i] * xs[i];
        } else {
            a = sumsq16(xs, n, tid);
        }
        if (tid == 0) *r_s = 1.0f / sqrtf(a / (float)n + eps);
    }
    __syncthreads();
    return *r_s;
}

/* RMSNorm of nvec vectors of n floats (x, y [nvec][n], may alias; weights w [n]), one block per vector:
 * the vector is staged in shared memory (n floats of dynamic shared memory), threads 0..15 own
 * ib_dot16's lanes (lane j sums elements j, j+16, … in order) and fold 8, 4, 2, 1; then
 * y = (x * (1/sqrt(ss/n + eps))) * w. reverse_odd: the test-only row-order fault (odd vectors sum
 * their squares in reverse, serially).
 * Fused neighbours (the same operations as the separate ops, in the same order): add_y != NULL first
 * does x = x + add_y (ib_add; x written back); G > 0 then quantizes y for group G into xq/qd/qad
 * (ib_quantize_act of the rows just written). The weights are read before the wait for the previous
 * kernel (no kernel writes them): into registers where a thread's share is at most NORM_WREG of them
 * (qwen3-8b B=1 +1.3% on the H200), else asked of L2. */
#define NORM_WREG 8
__global__ void rmsnorm_kernel(float *x, const float *__restrict__ add_y, const float *__restrict__ w, int nvec, int n,
                               float eps, float *y, int reverse_odd, int8_t *__restrict__ xq, float *__restrict__ qd,
                               float *__restrict__ qad, int G) {
    const int tid = threadIdx.x, wreg = n <= NORM_WREG * (int)blockDim.x;
    float wr[NORM_WREG];
    if (wreg) {
#pragma unroll
        for (int k = 0; k < NORM_WREG; k++) {
            const int i = tid + k * (int)blockDim.x;
            wr[k] = i < n ? w[i] : 0.0f;
        }
    } else {
        prefetch_bytes(w, (size_t)n * sizeof(float));
    }
    PDL_ENTER();
    extern __shared__ float xs[];
    __shared__ float r_s;
    const int v = blockIdx.x;
    float *xv = x + (size_t)v * n;
    float *yv = y + (size_t)v * n;
    if (add_y) {
        const float *av = add_y + (size_t)v * n;
        for (int i = tid; i < n; i += blockDim.x) {
            const float t = xv[i] + av[i];
            xv[i] = t;
            xs[i] = t;
        }
    } else {
        for (int i = tid; i < n; i += blockDim.x) xs[i] = xv[i];
    }
    __syncthreads();
    const float r = row_norm_factor(xs, n, eps, reverse_odd && (v & 1), &r_s);
    if (wreg) {
#pragma unroll
        for (int k = 0; k < NORM_WREG; k++) {
            const int i = tid + k * (int)blockDim.x;
            if (i < n) {
                const float t = (xs[i] * r) * wr[k];
                yv[i] = t;
                xs[i] = t;
            }
        }
    } else {
        for (int i = tid; i < n; i += blockDim.x) {
            const float t = (xs[i] * r) * w[i];
            yv[i] = t;
            xs[i] = t;
        }
    }
    if (G <= 0) return;
    __syncthreads();
    const int ng = n / G, lane = tid & 31;
    for (int g = tid >> 5; g < ng; g += blockDim.x >> 5) {
        const size_t di = (size_t)v * ng + g;
        quantize_group(xs + (size_t)g * G, G, xq + (size_t)v * n + (size_t)g * G, qd + di, qad + di, lane);
    }
}

/* (bv, bi) becomes (v, i) when v is larger, or equal with a lower id (NaN never: both tests fail). */
__device__ __forceinline__ void argmax_pick(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

/* The best (value, lowest id) of a block's threads by argmax_pick: lane 0 of warp 0 ends with it (sv, si:
 * [blockDim.x / 32] shared scratch). */
__device__ __forceinline__ void argmax_block(float &bv, int &bi, float *sv, int *si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, o);
        const int i = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_pick(bv, bi, v, i);
    }
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) argmax_pick(bv, bi, sv[w], si[w]);
}

/* out[r] = ib_argmax of row r of L [rows][V]: the first id holding the largest logit, NaN never
 * winning, and 0 when nothing exceeds -inf (an all NaN / -inf row) — as the scan of ib_argmax gives it.
 * Grid (ARGMAX_SLICES, rows): block (s, r) keeps the best (value, lowest id) of slice s of row r in
 * pv / pi [rows][ARGMAX_SLICES]; the last of a row's blocks to finish (cnt [rows], zero between
 * launches: that block sets it back) combines the slices. Every combination uses argmax_pick — a
 * maximum, and the lowest id among equal values (+0 and -0 equal, as ib_argmax's search for the first
 * id equal to the maximum) — so neither the split nor the order of finishing can change the answer. */
__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(const float *__restrict__ L, int V, int32_t *out,
                                                                float *pv, int *pi, unsigned *cnt) {
    PDL_ENTER();
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    __shared__ unsigned done_s;
    const int r = blockIdx.y, sl = blockIdx.x;
    const float *row = L + (size_t)r * V;
    const int len = (V + ARGMAX_SLICES - 1) / ARGMAX_SLICES, i0 = sl * len, i1 = min(V, i0 + len);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) argmax_pick(bv, bi, row[i], i);
    argmax_block(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        pv[(size_t)r * ARGMAX_SLICES + sl] = bv, pi[(size_t)r * ARGMAX_SLICES + sl] = bi;
        __threadfence();
        done_s = atomicAdd(&cnt[r], 1u);
    }
    __syncthreads();
    if (done_s != ARGMAX_SLICES - 1) return;
    /* the row's last block: every slice's partial is visible (each was fenced before its count) */
    __threadfence();
    bv = -INFINITY, bi = 0x7fffffff;
    for (int x = threadIdx.x; x < ARGMAX_SLICES; x += blockDim.x)
        argmax_pick(bv, bi, ((volatile float *)pv)[(size_t)r * ARGMAX_SLICES + x],
                    ((volatile int *)pi)[(size_t)r * ARGMAX_SLICES + x]);
    __syncthreads();   /* sv, si reused */
    argmax_block(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        out[r] = bv == -INFINITY ? 0 : bi;
        cnt[r] = 0;
    }
}

/* X[r] = embedding row tok[r] (ib_matrix_row_f32's formula). X [R][D]. */
__global__ void embed_kernel(dmat m, const int32_t *__restrict__ tok, int R, float *__restrict__ X) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * m.K) return;
    const int r = (int)(i / m.K), k = (int)(i % m.K);
    X[i] = weight_at(m, tok[r], k);
}

/* g = silu(g) * u with silu(g) = g / (1 + ib_expf(-g)); n elements. */
__global__ void swiglu_kernel(float *g, const float *__restrict__ u, size_t n) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = g[i];
    const float silu = x / (1.0f + ib_expf_lane(-x));
    g[i] = silu * u[i];
}

/* swiglu_kernel of X [R][F] fused with the quantization of its output for group G (ib_swiglu, then
 * ib_quantize_act of the rows): one warp per (row, group); each lane computes the elements it then
 * reads for the group's codes, so the values quantized are those written. */
__global__ void swiglu_q8_kernel(float *g, const float *__restrict__ u, int R, int F, int G, int8_t *__restrict__ xq,
                                 float *__restrict__ qd, float *__restrict__ qad) {
    PDL_ENTER();
    const int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int ng = F / G;
    if (wid >= R * ng) return;
    const int r = wid / ng, gi = wid % ng;
    const size_t o = (size_t)r * F + (size_t)gi * G;
    float *gp = g + o;
    for (int k = lane; k < G; k += 32) {
        const float x = gp[k];
        const float silu = x / (1.0f + ib_expf_lane(-x));
        gp[k] = silu * u[o + k];
    }
    quantize_group(gp, G, xq + o, qd + (size_t)r * ng + gi, qad + (size_t)r * ng + gi, lane);
}

/* Nothing but the wait for the previous kernel (IB_CUDA_REPEAT=empty: what a kernel boundary costs). */
__global__ void empty_kernel() { PDL_ENTER(); }

/* x += y, n elements. */
__global__ void add_kernel(float *x, const float *__restrict__ y, size_t n) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + y[i];
}

/* out[j] = X[rows[j]] for j < n (rows of width D). */
__global__ void gather_kernel(const float *__restrict__ X, const int32_t *__restrict__ rows, int n, int D,
                              float *__restrict__ out) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * D) return;
    out[i] = X[(size_t)rows[i / D] * D + i % D];
}

/* ---------------------------------------------------------------- kernels: RoPE + KV store, attention */

/* Slot of position pos in a cache kept as info says (ib_kv_desc_slot). */
__device__ __forceinline__ int slot_of(const rowinfo &ri, int pos) {
    if (ri.window <= 0 || pos < ri.sink) return pos;
    return ri.sink + (pos - ri.sink) % (ri.cap - ri.sink);
}

/* One head of one row by one warp, in place in xs [hd] (shared memory): with w (the head norm's weights
 * [hd]; NULL: none) ib_rmsnorm_heads as rmsnorm_kernel computes it — lanes 0..15 own ib_dot16's lanes
 * and fold 8, 4, 2, 1, then r = 1/sqrt(ss/hd + eps) and (x * r) * w —; then, with rope, the rotation of
 * each pair (i, i + hd/2) by t [hd/2][2] (ib_rope: a*c - b*s, b*c + a*s, products rounded). Ends with
 * the warp's writes visible to the warp. */
__device__ __forceinline__ void qk_head_warp(float *xs, const float *__restrict__ w, const float *__restrict__ t,
                                             bool rope, int hd, float eps, int lane) {
    const int half = hd / 2;
    if (w) {
        const float a = sumsq16(xs, hd, lane);
        float rr = 0.0f;
        if (lane == 0) rr = 1.0f / sqrtf(a / (float)hd + eps);
        rr = __shfl_sync(0xffffffffu, rr, 0);
        for (int i = lane; i < hd; i += 32) xs[i] = (xs[i] * rr) * w[i];
        __syncwarp();
    }
    if (rope) {
        for (int i = lane; i < half; i += 32) {
            const float a = xs[i], b = xs[i + half], c = t[2 * i], s = t[2 * i + 1];
            xs[i] = a * c - b * s;
            xs[i + half] = b * c + a * s;
        }
        __syncwarp();
    }
}

/* A KV element as float, exactly: a half by the conversion instruction, which is exact for every finite
 * half (subnormals included: denormals are kept), or, for infinities and NaNs (exponent bits all set),
 * by half.h's conversion, so a NaN keeps the bits the host gives it. */
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(uint16_t h) {
    return (h & 0x7c00u) == 0x7c00u ? ib_f16_to_f32_lane(h) : __half2float(__ushort_as_half(h));
}

/* Store key head ks [hd] (shared memory) and value head vv [hd] of a row into its session's cache
 * (info) at layer li, KV head kh, slot(pos): floats as they are, halves rounded by ib_f32_to_f16. By
 * one warp. kmir != NULL: the key's stored elements (their bits, of the cache's type) also into kmir
 * [hd] and the value's as floats (to_f32 of what was stored) into vmir [hd] — shared memory, so the
 * block reads them without a round trip through the cache. */
__device__ __forceinline__ void kv_store_warp(const rowinfo &info, int li, int KVH, int kh, int hd, const float *ks,
                                              const float *__restrict__ vv, int lane, void *kmir = NULL,
                                              float *vmir = NULL) {
    const size_t plane = (size_t)info.cap * hd, slot = (size_t)slot_of(info, info.pos);
    const size_t ko = (((size_t)li * 2 + 0) * KVH + kh) * plane + slot * hd;
    const size_t vo = (((size_t)li * 2 + 1) * KVH + kh) * plane + slot * hd;
    for (int i = lane; i < hd; i += 32) {
        if (info.f16) {
            const uint16_t kh16 = ib_f32_to_f16(ks[i]), vh16 = ib_f32_to_f16(vv[i]);
            ((uint16_t *)info.kv)[ko + i] = kh16;
            ((uint16_t *)info.kv)[vo + i] = vh16;
            if (kmir) ((uint16_t *)kmir)[i] = kh16, vmir[i] = to_f32(vh16);
        } else {
            const float kf = ks[i], vf = vv[i];
            ((float *)info.kv)[ko + i] = kf;
            ((float *)info.kv)[vo + i] = vf;
            if (kmir) ((float *)kmir)[i] = kf, vmir[i] = vf;
        }
    }
}

/* One warp per (row r = blockIdx.y, head h = QK_WARPS * blockIdx.x + warp) of the row's H query heads
 * (Q [R][H][hd]) then KVH key heads (K [R][KVH][hd]), the head staged in shared memory
 * ([QK_WARPS][hd] floats, dynamic): qk_head_warp with qn (query) or kn (key) when qn != NULL, and the
 * rotation by the row's cs [R][hd/2][2] when r < rope_rows; the head written back, and a key head stored
 * with the row's V head into its session's cache at layer li, slot(pos) (kv_store_warp). The separate
 * ops' operations in their order (q/k norm, RoPE, store). */
__global__ void __launch_bounds__(32 * QK_WARPS) qk_kernel(float *Q, float *K, const float *__restrict__ V, const float *__restrict__ cs,
                                                 const rowinfo *__restrict__ ri, const float *__restrict__ qn,
                                                 const float *__restrict__ kn, int H, int KVH, int hd, int li, float eps,
                                                 int rope_rows) {
    if (qn) prefetch_bytes(qn, (size_t)hd * sizeof(float)), prefetch_bytes(kn, (size_t)hd * sizeof(float));
    prefetch_bytes(cs + (size_t)blockIdx.y * hd, (size_t)hd * sizeof(float));
    PDL_ENTER();
    extern __shared__ float hs[];
    const int r = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *xs = hs + (size_t)warp * hd;
    const rowinfo info = ri[r];
    const int h = QK_WARPS * blockIdx.x + warp;
    if (h < H + KVH) {
        float *v = h < H ? Q + ((size_t)r * H + h) * hd : K + ((size_t)r * KVH + (h - H)) * hd;
        for (int i = lane; i < hd; i += 32) xs[i] = v[i];
        __syncwarp();
        qk_head_warp(xs, qn ? (h < H ? qn : kn) : NULL, cs + (size_t)r * hd, r < rope_rows, hd, eps, lane);
        for (int i = lane; i < hd; i += 32) v[i] = xs[i];
        if (h >= H) kv_store_warp(info, li, KVH, h - H, hd, xs, V + ((size_t)r * KVH + (h - H)) * hd, lane);
    }
}

#ifdef IB_CUDA_ATT_TRACE
/* Diagnostic build only: thread 0 of per-head attention blocks < 64 at layer 3 records clock64() at its
 * phases' ends (the last chunk's), printed when the instance is destroyed. */
__device__ long long att_trace[64][12];
__device__ int att_trace_twice;   /* IB_CUDA_ATT_TWICE=1: the direct kernel's layer-3 blocks run twice, traced the second time */
#define ATT_MARK(i)                                                                  \
    do {                                                                             \
        if (li == 3 && threadIdx.x == 0 && blockIdx.x < 64) att_trace[blockIdx.x][i] = clock64(); \
    } while (0)
#else
#define ATT_MARK(i) \
    do {            \
    } while (0)
#endif

/* The q/k norm, RoPE and KV store of a decode step done by its attention blocks (every row its session's
 * only row in the step, so a block needs no other row's key): the step's K, V [R][KVH][hd] and RoPE
 * table cs [R][hd/2][2], the head norms' weights qn, kn [hd] (NULL: none), eps, and the rows that rotate
 * (rope_rows: R, or 1 under the rope-skip-rows fault). K == NULL: not fused (Q holds the prepared
 * queries). */
struct qk_fuse {
    const float *K, *V, *cs, *qn, *kn;
    float eps;
    int rope_rows;
};

/* The fused prologue of an attention block for row r: query heads h0 .. h0 + nq - 1 (Q [R][H][hd], as the
 * q/k/v product wrote them) normed and rotated into qs [nq][hd] (shared memory), and the row's key head
 * kvh normed, rotated (in ks [hd], shared scratch) and stored with its value head into the cache —
 * qk_kernel's operations, a warp per head. Every block that attends with KV head kvh stores the same
 * bits at the same place; each reads the cache only after its own store (the barrier at the end). */
__device__ __forceinline__ void qk_fused_prologue(const qk_fuse &fz, const float *__restrict__ Q, const rowinfo &info,
                                                  int r, int h0, int nq, int kvh, int H, int KVH, int hd, int li,
                                                  float *qs, float *ks, void *kmir = NULL, float *vmir = NULL) {
    const int lane = threadIdx.x & 31, nw = (int)blockDim.x >> 5;
    const float *t = fz.cs + (size_t)r * hd;
    const bool rope = r < fz.rope_rows;
    for (int x = (int)threadIdx.x >> 5; x <= nq; x += nw) {
        const bool key = x == nq;
        float *xs = key ? ks : qs + (size_t)x * hd;
        const float *src = key ? fz.K + ((size_t)r * KVH + kvh) * hd : Q + ((size_t)r * H + h0 + x) * hd;
        for (int i = lane; i < hd; i += 32) xs[i] = src[i];
        __syncwarp();
        qk_head_warp(xs, fz.qn ? (key ? fz.kn : fz.qn) : NULL, t, rope, hd, fz.eps, lane);
        if (key) kv_store_warp(info, li, KVH, kvh, hd, xs, fz.V + ((size_t)r * KVH + kvh) * hd, lane, kmir, vmir);
    }
#ifdef IB_CUDA_ATT_TRACE
    if (li == 3 && (threadIdx.x == 0 || threadIdx.x == 32) && blockIdx.x < 64) att_trace[blockIdx.x][10 + (threadIdx.x >> 5)] = clock64();
#endif
    __syncthreads();
}

/* Lane u (0..15) of ib_dot16(q, key): elements u, u+16, … in ascending order (q in shared memory). The
 * loads of 8 elements are issued before their products. */
template <typename T>
__device__ __forceinline__ float dot16_lane(const float *q_s, const T *__restrict__ key, int hd, int u) {
    float a = 0.0f;
    for (int i0 = 0; i0 < hd; i0 += 128) {
        T raw[8];   /* every load issued before any conversion (a half's conversion may branch) */
        float k[8];
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int i = i0 + u + 16 * t;
            raw[t] = i < hd ? key[i] : (T)0;
        }
#pragma unroll
        for (int t = 0; t < 8; t++) k[t] = to_f32(raw[t]);
#pragma unroll
        for (int t = 0; t < 8; t++)
            if (i0 + u + 16 * t < hd) a = a + q_s[i0 + u + 16 * t] * k[t];
    }
    return a;
}

/* The value pass of one chunk for the block's W output elements out[e] (shared memory; element e belongs
 * to head e / hd, dimension e % hd), a thread per element: per key block k in order o = o * c[k], then
 * o = o + p_j * v_j over the block's keys in order (v_j = vp[slot[j] * ld + d]; loads issued 16 keys at a
 * time before their products) — the reference's operations in its order. pw [heads][pws], c [heads][cs];
 * bt0 [nbk + 1] the blocks' first keys, then the chunk's size. Ends with a barrier. */
template <typename T>
__device__ void value_pass(float *out, int W, const T *__restrict__ vp, const int *slot, const float *pw, int pws,
                           const float *c, int cs, const int *bt0, int nbk, int hd, int ld) {
    for (int e = threadIdx.x; e < W; e += blockDim.x) {
        const int h = e / hd, d = e % hd;
        const float *ph = pw + (size_t)h * pws, *ch = c + (size_t)h * cs;
        float o = out[e];
        for (int k = 0; k < nbk; k++) {
            o = o * ch[k];
            int j = bt0[k];
            const int je = bt0[k + 1];
            for (; j + 16 <= je; j += 16) {
                T raw[16];
                float v[16];
#pragma unroll
                for (int t = 0; t < 16; t++) raw[t] = vp[(size_t)slot[j + t] * ld + d];
#pragma unroll
                for (int t = 0; t < 16; t++) v[t] = to_f32(raw[t]);
#pragma unroll
                for (int t = 0; t < 16; t++) o = o + ph[j + t] * v[t];
            }
            for (; j + 4 <= je; j += 4) {
                T raw[4];
                float v[4];
#pragma unroll
                for (int t = 0; t < 4; t++) raw[t] = vp[(size_t)slot[j + t] * ld + d];
#pragma unroll
                for (int t = 0; t < 4; t++) v[t] = to_f32(raw[t]);
#pragma unroll
                for (int t = 0; t < 4; t++) o = o + ph[j + t] * v[t];
            }
            for (; j < je; j++) o = o + ph[j] * to_f32(vp[(size_t)slot[j] * ld + d]);
        }
        out[e] = o;
    }
    __syncthreads();
}

/* value_pass for W <= blockDim.x elements over a stage of float rows in chunk order (row j at vst + j *
 * ld, element e at + e): per key block k in order o = o * c[k], then o = o + pw[j] * v_j over the block's
 * keys in order (the next 8 keys' loads issued before these 8 are added) — value_pass's operations, without
 * its slot lookups (a decode block's stage, where the walk is short and every instruction counts). Ends
 * with a barrier. */
__device__ void value_pass_stage(float *out, int W, const float *vst, int ld, const float *pw, const float *c,
                                 const int *bt0, int nbk) {
    const int e = threadIdx.x;
    if (e < W) {
        float o = out[e];
        const float *vr = vst + e;
        for (int k = 0; k < nbk; k++) {
            o = o * c[k];
            int j = bt0[k];
            const int je = bt0[k + 1];
            float v[8], q[8];   /* the next 8 keys' loads in flight while these 8 are added */
            if (j + 8 <= je) {
#pragma unroll
                for (int t = 0; t < 8; t++) v[t] = vr[(size_t)(j + t) * ld], q[t] = pw[j + t];
            }
            for (; j + 8 <= je; j += 8) {
                float vn[8], qn[8];
                const bool more = j + 16 <= je;
                if (more) {
#pragma unroll
                    for (int t = 0; t < 8; t++) vn[t] = vr[(size_t)(j + 8 + t) * ld], qn[t] = pw[j + 8 + t];
                }
#pragma unroll
                for (int t = 0; t < 8; t++) o = o + q[t] * v[t];
                if (more) {
#pragma unroll
                    for (int t = 0; t < 8; t++) v[t] = vn[t], q[t] = qn[t];
                }
            }
            for (; j < je; j++) o = o + pw[j] * vr[(size_t)j * ld];
        }
        out[e] = o;
    }
    __syncthreads();
}

/* Quantize (ib_quantize_act, group G) the n floats ys (shared memory) that are elements [e0, e0 + n) of
 * row r's K-wide input: its groups e0/G .. into xq [R][K], qd/qad [R][K/G]; e0 and n multiples of G.
 * All threads of the block take part (a warp per group). */
__device__ __forceinline__ void quantize_span(const float *ys, int n, int r, int e0, int K, int G, int8_t *__restrict__ xq,
                                              float *__restrict__ qd, float *__restrict__ qad) {
    const int ng = K / G, lane = threadIdx.x & 31;
    for (int q = threadIdx.x >> 5; q < n / G; q += blockDim.x >> 5) {
        const int g = e0 / G + q;
        quantize_group(ys + (size_t)q * G, G, xq + (size_t)r * K + (size_t)g * G, qd + (size_t)r * ng + g,
                       qad + (size_t)r * ng + g, lane);
    }
}

/* Per key block k < nbk of one head's chunk, in order, by one whole warp: the block's max of its
 * scores sc[bt0[k] .. bt0[k+1]) (each lane a strided part, then folded by shuffles: a maximum of the
 * non-NaN scores, the same in any order — only the sign of a zero maximum may differ, and every use
 * below gives the same bits for +0 and -0: comparisons, and exp(x - m) with exp(+0) = exp(-0) = 1),
 * m' = max(*m, block max) as the reference takes it, c[k] = exp(*m - m'), mk[j] = m' for the
 * block's keys; *m (shared memory) ends as the running max. */
__device__ __forceinline__ void block_maxima_warp(const float *sc, float *mk, float *c, const int *bt0, int nbk,
                                                  float *m, int lane) {
    float mr = *m;
    for (int k = 0; k < nbk; k++) {
        const int j0 = bt0[k], j1 = bt0[k + 1];
        float mb = -INFINITY;
        for (int j = j0 + lane; j < j1; j += 32)
            if (sc[j] > mb) mb = sc[j];
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float t = __shfl_xor_sync(0xffffffffu, mb, o);
            if (t > mb) mb = t;
        }
        const float m_new = mb > mr ? mb : mr;
        if (lane == 0) c[k] = ib_expf_lane(mr - m_new);
        mr = m_new;
        for (int j = j0 + lane; j < j1; j += 32) mk[j] = m_new;
    }
    __syncwarp();
    if (lane == 0) *m = mr;
}

/* Ask L1 for the value rows of the chunk's nc keys (vp + slot[j] * hd, hd elements of T each), by
 * threads t0.. of the block (stride nt): the value pass then finds them there. Reads nothing it
 * computes with. */
template <typename T>
__device__ __forceinline__ void prefetch_values_l1(const T *vp, const int *slot, int nc, int hd, int t, int nt) {
    const int lines = (int)((hd * sizeof(T) + 127) / 128);
    for (int i = t; i < nc * lines; i += nt)
        asm volatile("prefetch.global.L1 [%0];" ::"l"((const char *)(vp + (size_t)slot[i / lines] * hd) + 128 * (i % lines)));
}

/* The 8 halves of w (element 2k in the low half of word k) as floats into f, each exactly to_f32's:
 * when no half has all exponent bits set — ((h & 0x7c00) + 0x400) & 0x8000 is then 0 for each — by
 * paired conversion instructions, else one by one. */
__device__ __forceinline__ void halves8_regs(uint4 w, float (&f)[8]) {
    const unsigned ws[4] = {w.x, w.y, w.z, w.w};
    unsigned sp = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) sp |= ((ws[k] & 0x7c007c00u) + 0x04000400u) & 0x80008000u;
    if (sp == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 t = __half22float2(*(const __half2 *)&ws[k]);
            f[2 * k] = t.x, f[2 * k + 1] = t.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = to_f32((uint16_t)(ws[e >> 1] >> (16 * (e & 1))));
    }
}

/* The 8 halves of w (element 2k in the low half of word k) as floats into o [8] (shared memory, 16-byte
 * aligned), each exactly to_f32's (halves8_regs). */
__device__ __forceinline__ void halves8_to_f32(uint4 w, float *o) {
    float f[8];
    halves8_regs(w, f);
    ((float4 *)o)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4 *)o)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

/* Stage a chunk: key and value rows slot[j] (hd elements of T) of the cache planes kp, vp as floats
 * into stk, stv [nc][ld] (shared memory; ld a multiple of 4), each element exactly to_f32 of the cache
 * (a float is copied as it is). All threads, each keeping one 16-byte column of the rows (the block's
 * threads a multiple of a row's pieces), eight loads in flight each. */
template <typename T>
__device__ __forceinline__ void stage_rows_f32(float *stk, float *stv, const T *__restrict__ kp, const T *__restrict__ vp,
                                               const int *slot, int nc, int hd, int ld) {
    constexpr int E = 16 / (int)sizeof(T);   /* elements per 16 bytes */
    const int pieces = hd / E;   /* 16-byte pieces of a row: they divide the block's threads */
    /* each thread one 16-byte column of rows r0, r0 + rstep, …: rows < nc keys, then values */
    const int col = (int)threadIdx.x % pieces, rstep = (int)blockDim.x / pieces, rows = 2 * nc;
    for (int r0 = (int)threadIdx.x / pieces; r0 < rows; r0 += 8 * rstep) {
        uint4 w[8];
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int rr = r0 + t * rstep, isv = rr >= nc;
            if (rr < rows) w[t] = *(const uint4 *)((isv ? vp : kp) + (size_t)slot[rr - isv * nc] * hd + col * E);
        }
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int rr = r0 + t * rstep, isv = rr >= nc;
            if (rr >= rows) break;
            float *o = (isv ? stv : stk) + (size_t)(rr - isv * nc) * ld + col * E;
            if (sizeof(T) == 2) halves8_to_f32(w[t], o);
            else *(uint4 *)o = w[t];
        }
    }
}

/* block_maxima_warp's results with the key blocks' maxima found in parallel: warp w takes blocks
 * w, w + warps, … (each the same lanes' strided maximum and shuffle fold); after a barrier, lane 0 of
 * warp 0 chains m' = max(m, block max) over the blocks in order as the reference takes it (into bm),
 * then warp 0's lanes give c[k] = exp(m'_{k-1} - m'_k) and mk of the blocks' keys. Every thread calls it;
 * bm [ATT_MAX_BLOCKS] shared scratch. Ends without a barrier (warp 0 writes c, mk, *m). */
__device__ __forceinline__ void block_maxima_par(const float *sc, float *mk, float *c, const int *bt0, int nbk,
                                                 float *m, float *bm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int k = warp; k < nbk; k += nw) {
        const int j0 = bt0[k], j1 = bt0[k + 1];
        float mb = -INFINITY;
        for (int j = j0 + lane; j < j1; j += 32)
            if (sc[j] > mb) mb = sc[j];
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float t = __shfl_xor_sync(0xffffffffu, mb, o);
            if (t > mb) mb = t;
        }
        if (lane == 0) bm[k] = mb;
    }
    __syncthreads();
    if (warp != 0) return;
    const float m0 = *m;
    if (lane == 0) {
        float mr = m0;
        for (int k = 0; k < nbk; k++) {
            const float mb = bm[k];
            mr = mb > mr ? mb : mr;
            bm[k] = mr;
        }
    }
    __syncwarp();
    for (int k = lane; k < nbk; k += 32) c[k] = ib_expf_lane((k ? bm[k - 1] : m0) - bm[k]);
    for (int k = 0; k < nbk; k++)
        for (int j = bt0[k] + lane; j < bt0[k + 1]; j += 32) mk[j] = bm[k];
    __syncwarp();
    if (lane == 0) *m = bm[nbk - 1];
}


/* Shared memory of a per-head attention block. */
struct __align__(16) att_smem1 {   /* 16-byte aligned: the direct path reads a key row of sm.slot by 16-byte pieces */
    float q[IB_ATTN_MAX_HD], out[IB_ATTN_MAX_HD];
    float sc[ATT_CHUNK], pw[ATT_CHUNK], mk[ATT_CHUNK];
    int slot[ATT_CHUNK];
    int bt0[ATT_MAX_BLOCKS + 1];   /* chunk index of each key block's first key, then the chunk's size */
    float c[ATT_MAX_BLOCKS];       /* each key block's rescale factor */
    float bm[ATT_MAX_BLOCKS];      /* block_maxima_par's scratch */
    float l, m;                    /* the running sum (at the end), the running max */
};

/* sc[j] = dot16(q, key j) * scale for nc keys, key j at kc + sm.slot[j] * ld (the cache, or a stage with
 * identity slots): 16 threads per key own ib_dot16's lanes and fold them 8, 4, 2, 1; four keys per group
 * per round, every group the same number of rounds (whole warps in the shuffles). */
template <typename T>
__device__ __forceinline__ void head_scores(att_smem1 &sm, float *sc, const T *__restrict__ kc, int nc, int ld, int hd,
                                            float scale) {
    const int grp = threadIdx.x >> 4, u = threadIdx.x & 15, ngrp = blockDim.x >> 4;
    for (int j0 = 0; j0 < nc; j0 += 4 * ngrp) {
        float a[4];
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int j = j0 + x * ngrp + grp;
            a[x] = j < nc ? dot16_lane(sm.q, kc + (size_t)sm.slot[j] * ld, hd, u) : 0.0f;
        }
#pragma unroll
        for (int w = 8; w >= 1; w >>= 1)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const float o = __shfl_down_sync(0xffffffffu, a[x], w, 16);
                if (u < w) a[x] = a[x] + o;
            }
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int j = j0 + x * ngrp + grp;
            if (u == 0 && j < nc) sc[j] = a[x] * scale;
        }
    }
}

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

/* Stage this block's part of a chunk split over a cluster: the chunk's key rows [k0, k1) whole (slot[j]'s
 * hd elements of T of the cache plane kp) into stk [k1 - k0][ldk], and the value columns [d0, d0 + dc)
 * of all nc rows (plane vp) into stv [nc][dc], as floats, each element exactly to_f32 of the cache. All
 * threads, a 16-byte piece each per round (hd, dc multiples of a piece's elements), eight loads in
 * flight each. */
template <typename T>
__device__ __forceinline__ void stage_split_f32(float *stk, int ldk, float *stv, const T *__restrict__ kp,
                                                const T *__restrict__ vp, const int *slot, int k0, int k1, int nc,
                                                int hd, int d0, int dc) {
    constexpr int E = 16 / (int)sizeof(T);   /* elements per 16 bytes */
    const int pk = hd / E, pv = dc / E, nkp = (k1 - k0) * pk, total = nkp + nc * pv, nt = (int)blockDim.x;
    for (int i0 = (int)threadIdx.x; i0 < total; i0 += 8 * nt) {
        uint4 w[8];
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int i = i0 + t * nt, iv = i - nkp;
            if (i < nkp) w[t] = *(const uint4 *)(kp + (size_t)slot[k0 + i / pk] * hd + (i % pk) * E);
            else if (i < total) w[t] = *(const uint4 *)(vp + (size_t)slot[iv / pv] * hd + d0 + (iv % pv) * E);
        }
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int i = i0 + t * nt, iv = i - nkp;
            if (i >= total) break;
            float *o = i < nkp ? stk + (size_t)(i / pk) * ldk + (i % pk) * E : stv + (size_t)(iv / pv) * dc + (iv % pv) * E;
            if (sizeof(T) == 2) halves8_to_f32(w[t], o);
            else *(uint4 *)o = w[t];
        }
    }
}

/* The two ranges of positions a row attends (ib_attend_policy): [0, S) then [lo, pos] — a full session's
 * [0, pos] (lo = pos + 1: the second empty); a windowed one's sink range [0, min(sink, pos + 1)) then
 * its window range [max(pos - window + 1, S), pos]. */
__device__ __forceinline__ void attended_ranges(const rowinfo &info, int &S, int &lo) {
    const int p = info.pos;
    if (info.window <= 0) {
        S = p + 1, lo = p + 1;
    } else {
        S = info.sink < p + 1 ? info.sink : p + 1;
        lo = p - info.window + 1;
        if (lo < S) lo = S;
    }
}

/* The positions a row attends (ib_attend_policy), as ranges [ra[i], rb[i]): a full session [0, pos] (the
 * second range empty); a windowed one the sink range [0, min(sink, pos + 1)) then the window range
 * [max(pos - window + 1, that), pos]. rg, b0: the range and first position of the walk's next key block
 * (next_chunk; the same in every thread). attend_row_head and attend_row_kvhead walk the same way written
 * inline: on this form their code grew by 40 KB and the per-head kernel's B=1 step got 10% slower (a
 * decode step's kernels run each path once, and wait on instruction fetch: ncu's "no instruction"
 * stall was 40% of that kernel's). */
struct key_walk {
    int b0r, a1, b1r;   /* rb[0], ra[1], rb[1] (ra[0] is 0; scalars: selected, never indexed, so in registers) */
    int rg, b0;
};

__device__ __forceinline__ key_walk key_walk_of(const rowinfo &info) {
    const int p = info.pos;
    int S, lo;
    attended_ranges(info, S, lo);
    return key_walk{S, lo, p + 1, 0, 0};
}

/* A chunk of a key walk: nc keys in nbk whole key blocks, positions pa.. for its first na keys, then
 * pb.. (the second range). */
struct key_chunk {
    int nc, nbk, na, pa, pb;
};

/* The walk's next chunk: whole key blocks (cut at multiples of `block`), at most ATT_MAX_BLOCKS of them
 * and cap keys; nc 0 when the walk is done. Thread 0 writes bt0 [nbk + 1] (shared memory: each key
 * block's first chunk index, then nc); every thread computes the same chunk. */
__device__ __forceinline__ key_chunk next_chunk(key_walk &w, int block, int cap, int *bt0) {
    key_chunk c = {0, 0, -1, 0, 0};
    while (w.rg < 2 && c.nbk < ATT_MAX_BLOCKS) {
        const int rb = w.rg ? w.b1r : w.b0r;
        if (w.b0 >= rb) {
            if (++w.rg < 2) w.b0 = w.a1;
            continue;
        }
        int end = (w.b0 / block + 1) * block;
        if (end > rb) end = rb;
        if (c.nc + (end - w.b0) > cap) break;
        if (c.nbk == 0) c.pa = w.b0;
        else if (c.na < 0 && w.rg == 1 && w.a1 == w.b0 && w.b0 != c.pa + c.nc) c.na = c.nc, c.pb = w.b0;
        if (threadIdx.x == 0) bt0[c.nbk] = c.nc;
        c.nbk++, c.nc += end - w.b0, w.b0 = end;
    }
    if (c.nc == 0) return c;
    if (c.na < 0) c.na = c.nc;
    if (threadIdx.x == 0) bt0[c.nbk] = c.nc;
    return c;
}

/* The position of chunk index j. */
__device__ __forceinline__ int chunk_pos(const key_chunk &c, int j) { return j < c.na ? c.pa + j : c.pb + (j - c.na); }

/* How a per-head attention is spread over a cluster of `cl` blocks (1: one block does it all). */
struct att_split {
    int cl, rank;
};

/* ATT[r][h] = attention of Q[r][h] over its session's kept keys at layer li; one block per (row,
 * query head), ATT_THREADS threads — or a cluster of sp.cl blocks per (row, query head). The attended
 * positions — a full session [0, pos]; a windowed one the sink range [0, min(sink, pos+1)) then the
 * window range [max(pos-window+1, that), pos] — are cut into key blocks at multiples of `block`
 * (ib_attend_heads / ib_attend_policy) and walked in chunks of whole key blocks (at most ATT_CHUNK keys,
 * and what the stage holds). Per chunk: with a stage (stage_bytes of shared memory holding at least one
 * key block: stage_rows_f32), the chunk's key and value rows copied into it as floats first; every key's
 * score s_j = dot16(q, k_j) * scale in parallel (head_scores; a score does not depend on the softmax
 * state); the key blocks' maxima in parallel, then per key block in order m' = max(m, block max), c =
 * exp(m - m') (block_maxima_par; without a stage the other warps ask L1 for the value rows meanwhile);
 * every key's p_j = exp(s_j - m') in parallel; one thread: l = l*c then l += p_j in key order; a thread
 * per output element: out = out*c then out += p_j * v_j in key order (value_pass); finally out / l.
 * Split over a cluster (staged only; stage_split_f32): block `rank` stages and scores the chunk's keys
 * [rank * ceil(nc/cl), …) and stages the value columns [rank * hd/cl, …); the scores are exchanged
 * through the cluster's shared memory, so every block holds all of them and takes the maxima, the
 * p_j and l itself (the same operations on the same numbers: the same bits in each); each block's
 * value pass and division give its own hd/cl output elements; with qG, rank 0 gathers the head's outputs
 * and quantizes them. A score and an output element are each made by one thread, as unsplit: exactly
 * the reference's operations, in its order, staged, split or not. T: float or half KV; SPLIT: sp.cl > 1
 * (without it the split's code is compiled out). */
template <typename T, bool SPLIT>
__device__ void attend_row_head(att_smem1 &sm, const float *__restrict__ Q, float *__restrict__ ATT, const rowinfo &info,
                                int r, int h, int H, int KVH, int hd, int li, float scale, int block, int qG,
                                int8_t *__restrict__ xq, float *__restrict__ qd, float *__restrict__ qad,
                                unsigned char *stage, int stage_bytes, att_split sp, const qk_fuse &fz) {
    const int kvh = h / (H / KVH), tid = threadIdx.x;
    /* staged: each chunk's key and value rows are first copied into shared memory as floats, when a
     * stage holds a whole key block (kpc keys). Unsplit: stk, stv [kpc][ld], rows padded by 16 floats
     * (two 16-lane groups reading different keys hit different banks). Split: this block's keys stk
     * [ceil(kpc/cl)][ld], its dc value columns stv [kpc][dc], and at the stage's end xs [ATT_CHUNK] the
     * scores it makes for the cluster's other blocks. */
    const int ld = hd + 16, cl = SPLIT ? sp.cl : 1, dc = hd / cl, d0 = sp.rank * dc;
    const int F = stage ? stage_bytes / (int)sizeof(float) - (cl > 1 ? ATT_CHUNK : 0) : 0;
    const int kpc = cl == 1 ? F / (2 * ld) : (F > ld ? (int)((long)(F - ld) * cl / (ld + cl * dc)) : 0);
    const int pieces = hd * (int)sizeof(T) / 16;   /* stage_rows_f32's columns */
    const bool staged = kpc >= block && (hd * (int)sizeof(T)) % 16 == 0 &&
                        (cl == 1 ? (int)blockDim.x % pieces == 0 : (dc * (int)sizeof(T)) % 16 == 0);
    if (cl > 1 && !staged && sp.rank != 0) return;   /* not splittable: rank 0 alone, unsplit, no cluster barriers */
    const bool split = cl > 1 && staged;
    const int chunk_cap = staged && kpc < ATT_CHUNK ? kpc : ATT_CHUNK;
    float *stk = (float *)stage, *xs = stk + F;
    float *stv = stk + (size_t)(split ? (kpc + cl - 1) / cl : kpc) * ld;
    const int ldv = split ? dc : ld, e0 = split ? d0 : 0, ne = split ? dc : hd;   /* this block's outputs */
    if (fz.K) qk_fused_prologue(fz, Q, info, r, h, 1, kvh, H, KVH, hd, li, sm.q, sm.out);
    for (int d = tid; d < hd; d += blockDim.x) {
        if (!fz.K) sm.q[d] = Q[((size_t)r * H + h) * hd + d];
        sm.out[d] = 0.0f;
    }
    const size_t plane = (size_t)info.cap * hd;
    const T *kp = (const T *)info.kv + (((size_t)li * 2 + 0) * KVH + kvh) * plane;
    const T *vp = (const T *)info.kv + (((size_t)li * 2 + 1) * KVH + kvh) * plane;
    const int p = info.pos;
    int S, lo;
    attended_ranges(info, S, lo);
    const int ra[2] = {0, lo}, rb[2] = {S, p + 1};
    /* warp 0's running max (sm.m); thread lt's running sum (a thread without value-pass work when there
     * is one) */
    const int lt = hd < (int)blockDim.x ? (int)blockDim.x - 1 : 0;
    ATT_MARK(1);
    float l = 0.0f;
    if (tid == 0) sm.m = -INFINITY;
    int rg = 0, b0 = 0, nchunk = 0;  /* the next key block: range rg, position b0 (uniform over threads) */
    while (rg < 2) {
        /* the chunk: whole key blocks, positions pa.. for its first na keys, then pb.. (second range) */
        int nc = 0, nbk = 0, na = -1, pa = 0, pb = 0;
        while (rg < 2 && nbk < ATT_MAX_BLOCKS) {
            if (b0 >= rb[rg]) {
                if (++rg < 2) b0 = ra[rg];
                continue;
            }
            int end = (b0 / block + 1) * block;
            if (end > rb[rg]) end = rb[rg];
            if (nc + (end - b0) > chunk_cap) break;
            if (nbk == 0) pa = b0;
            else if (na < 0 && rg == 1 && ra[1] == b0 && b0 != pa + nc) na = nc, pb = b0;
            if (tid == 0) sm.bt0[nbk] = nc;
            nbk++, nc += end - b0, b0 = end;
        }
        if (nc == 0) break;
        if (na < 0) na = nc;
        if (tid == 0) sm.bt0[nbk] = nc;
        for (int j = tid; j < nc; j += blockDim.x) sm.slot[j] = slot_of(info, j < na ? pa + j : pb + (j - na));
        __syncthreads();
        ATT_MARK(2);
        /* this block's keys [k0, k1) of the chunk (split; else all) */
        const int nck = (nc + cl - 1) / cl, k0 = sp.rank * nck < nc ? sp.rank * nck : nc;
        const int k1 = nc - k0 < nck ? nc : k0 + nck;
        if (split) {
            /* the scores of this block's keys exchanged through xs */
            stage_split_f32(stk, ld, stv, kp, vp, sm.slot, k0, k1, nc, hd, d0, dc);
            __syncthreads();
            for (int j = tid; j < nc; j += blockDim.x) sm.slot[j] = j;
            __syncthreads();
            ATT_MARK(3);
            /* xs is written once every block has read the previous chunk's (its arrive after that) */
            if (nchunk > 0) cluster_wait();
            head_scores(sm, xs + k0, (const float *)stk, k1 - k0, ld, hd, scale);
            __syncthreads();
            cluster_arrive();
            cluster_wait();
            for (int j = tid; j < nc; j += blockDim.x) sm.sc[j] = ld_cluster(xs + j, j / nck);
            __syncthreads();
            cluster_arrive();
        } else if (staged) {
            stage_rows_f32(stk, stv, kp, vp, sm.slot, nc, hd, ld);
            __syncthreads();
            /* the stage's rows are the chunk's in order */
            for (int j = tid; j < nc; j += blockDim.x) sm.slot[j] = j;
            __syncthreads();
            ATT_MARK(3);
            head_scores(sm, sm.sc, (const float *)stk, nc, ld, hd, scale);
        } else {
            ATT_MARK(3);
            head_scores(sm, sm.sc, kp, nc, hd, hd, scale);
        }
        __syncthreads();
        ATT_MARK(4);
        block_maxima_par(sm.sc, sm.mk, sm.c, sm.bt0, nbk, &sm.m, sm.bm);
        if (tid >= 32 && !staged) prefetch_values_l1(vp, sm.slot, nc, hd, tid - 32, (int)blockDim.x - 32);
        __syncthreads();
        ATT_MARK(5);
        for (int j = tid; j < nc; j += blockDim.x) sm.pw[j] = ib_expf_lane(sm.sc[j] - sm.mk[j]);
        __syncthreads();
        ATT_MARK(6);
        if (tid == lt)
            for (int k = 0; k < nbk; k++) {
                l = l * sm.c[k];
#pragma unroll 8
                for (int j = sm.bt0[k]; j < sm.bt0[k + 1]; j++) l = l + sm.pw[j];
            }
        if (staged) value_pass(sm.out + e0, ne, (const float *)stv, sm.slot, sm.pw, 0, sm.c, 0, sm.bt0, nbk, ne, ldv);
        else value_pass(sm.out, hd, vp, sm.slot, sm.pw, 0, sm.c, 0, sm.bt0, nbk, hd, hd);
        ATT_MARK(7);
        nchunk++;
    }
    if (tid == lt) sm.l = l;
    __syncthreads();
    for (int d = e0 + tid; d < e0 + ne; d += blockDim.x) {
        const float o = sm.out[d] / sm.l;
        ATT[((size_t)r * H + h) * hd + d] = o;
        sm.out[d] = o;
    }
    if (split) {
        /* the last chunk's scores read by all (its arrive above); then, with qG, the outputs */
        cluster_wait();
        if (qG > 0) {
            __syncthreads();
            cluster_arrive();
            cluster_wait();
            if (sp.rank == 0) {
                for (int d = tid; d < hd; d += blockDim.x) sm.q[d] = ld_cluster(sm.out + d, d / dc);
                __syncthreads();
                quantize_span(sm.q, hd, r, h * hd, H * hd, qG, xq, qd, qad);
            }
            /* no block leaves while rank 0 reads its outputs */
            cluster_arrive();
            cluster_wait();
        }
    } else if (qG > 0) {
        __syncthreads();
        quantize_span(sm.out, hd, r, h * hd, H * hd, qG, xq, qd, qad);
    }
    ATT_MARK(8);
}

/* Direct scores: a thread owns DL = 16 / sizeof(T) of ib_dot16's 16 lanes of one key (halves 8, floats
 * 4; DTPK = 16 / DL threads a key, thread v of its key the lanes DL*v ..), i.e. the 16-byte piece at
 * element 16 t + DL v of each of the key's hd / 16 segments t. */
template <typename T>
struct direct_lanes {
    static constexpr int DL = 16 / (int)sizeof(T), DTPK = 16 / DL;
};
#define DIRECT_SEGS 8   /* most 16-element segments of a key the direct path holds (hd <= 128) */

/* Thread v's pieces of the key row `key` (hd elements of T) into kr [hd / 16]. */
template <typename T>
__device__ __forceinline__ void direct_key_load(uint4 (&kr)[DIRECT_SEGS], const T *key, int v, int nseg) {
    constexpr int DL = direct_lanes<T>::DL;
#pragma unroll
    for (int t = 0; t < DIRECT_SEGS; t++)
        if (t < nseg) kr[t] = *(const uint4 *)(key + 16 * t + DL * v);
}

/* ib_dot16(q, key) * scale for the key whose pieces kr the DTPK threads v = 0 .. of a key group hold
 * (direct_key_load; q [hd] in shared memory): each lane's chain over its elements in ascending order
 * (a = a + q_i * k_i from 0), then the fold of lane u + w into lane u for w = 8, 4, 2, 1 — partners in
 * another thread by shuffles, the rest within the thread —, exactly head_scores' operations. Every
 * thread of the warp calls it (valid: kr holds a key; else zeros take part); the score is thread v = 0's. */
template <typename T>
__device__ __forceinline__ float direct_score(const uint4 (&kr)[DIRECT_SEGS], const float *q_s, int v, int nseg,
                                              bool valid, float scale) {
    constexpr int DL = direct_lanes<T>::DL;
    float a[DL];
#pragma unroll
    for (int e = 0; e < DL; e++) a[e] = 0.0f;
    if (valid) {
#pragma unroll
        for (int t = 0; t < DIRECT_SEGS; t++) {
            if (t >= nseg) break;
            float k[DL];
            if (sizeof(T) == 2) halves8_regs(kr[t], *(float(*)[8])k);
            else {
                k[0] = __uint_as_float(kr[t].x), k[1] = __uint_as_float(kr[t].y);
                k[2] = __uint_as_float(kr[t].z), k[3] = __uint_as_float(kr[t].w);
            }
            const float *qs = q_s + 16 * t + DL * v;
#pragma unroll
            for (int e = 0; e < DL; e++) a[e] = a[e] + qs[e] * k[e];
        }
    }
#pragma unroll
    for (int w = 8; w >= 1; w >>= 1) {
        if (w >= DL) {
            const int off = w / DL;   /* the partner thread holding lanes u + w */
#pragma unroll
            for (int e = 0; e < DL; e++) {
                const float o = __shfl_down_sync(0xffffffffu, a[e], off);
                if (v < off) a[e] = a[e] + o;
            }
        } else {
#pragma unroll
            for (int e = 0; e < DL && e < w; e++) a[e] = a[e] + a[e + w];
        }
    }
    return a[0] * scale;
}

/* Copy the value rows of a chunk's first n keys (hd elements of T each, the cache plane vp; chunk index
 * j at position chunk_pos(ch, j)) into vst [n][hd] (shared memory) as floats, each exactly to_f32 of the
 * cache (a float copied as it is; halves by halves8_to_f32): threads t = 0 .. nt - 1 (nt a multiple of a
 * row's 16-byte pieces), each one 16-byte column of rows t / pieces, + nt / pieces, …, VSTAGE_LOADS
 * loads in flight (more would spill: the kernel also holds its keys in registers). */
#define VSTAGE_LOADS 4
template <typename T>
__device__ __forceinline__ void stage_value_rows(float *vst, const T *vp, const rowinfo &info, const key_chunk &ch, int hd,
                                                 int n, int t, int nt) {
    constexpr int E = 16 / (int)sizeof(T);
    const int rp = hd / E, col = t % rp, rstep = nt / rp;   /* pieces a row; this thread's column, row step */
    const T *src = vp + col * E;
    float *dst = vst + col * E;
    for (int j0 = t / rp; j0 < n; j0 += VSTAGE_LOADS * rstep) {
        uint4 w[VSTAGE_LOADS];
#pragma unroll
        for (int k = 0; k < VSTAGE_LOADS; k++) {
            const int j = j0 + k * rstep;
            if (j < n) w[k] = *(const uint4 *)(src + (size_t)slot_of(info, chunk_pos(ch, j)) * hd);
        }
#pragma unroll
        for (int k = 0; k < VSTAGE_LOADS; k++) {
            const int j = j0 + k * rstep;
            if (j < n) {
                if (sizeof(T) == 2) halves8_to_f32(w[k], dst + (size_t)j * hd);
                else *(uint4 *)(dst + (size_t)j * hd) = w[k];
            }
        }
    }
}

/* attend_row_head's computation for one (row, query head) when its keys fit one chunk (ATT_CHUNK keys in
 * at most ATT_MAX_BLOCKS key blocks), their value rows fit the stage (stage_bytes) as floats, hd is a
 * multiple of 16 of at most 128 and a row's 16-byte pieces divide 64 and the block's threads; returns
 * false, having changed nothing the caller reads, otherwise. A full session's chunk is planned in closed
 * form. Before the q/k preparation (the fused prologue or the prepared queries' load) the block asks for
 * what it can already: the first two rounds' keys this step does not write straight into registers
 * (DTPK threads a key: direct_key_load), and, by the threads the prologue leaves free, the value rows
 * into the stage (stage_value_rows), so these loads overlap the prologue; when fused, the prologue's key
 * warp also leaves position p's key (as stored) and value row (as floats) in shared memory. The scores
 * come from the registers (direct_score), then attend_row_head's phases: the key blocks' maxima
 * (block_maxima_par), p_j, one thread's l, the value pass over the stage (value_pass_stage), out / l.
 * Every score, maximum, p, l and output is made by the same operations in the same order as
 * attend_row_head's. */
template <typename T>
__device__ bool attend_row_head_direct(att_smem1 &sm, const float *__restrict__ Q, float *__restrict__ ATT,
                                       const rowinfo &info, int r, int h, int H, int KVH, int hd, int li, float scale,
                                       int block, int qG, int8_t *__restrict__ xq, float *__restrict__ qd,
                                       float *__restrict__ qad, unsigned char *stage, int stage_bytes,
                                       const qk_fuse &fz) {
    constexpr int DTPK = direct_lanes<T>::DTPK, E = 16 / (int)sizeof(T);
    const int nseg = hd / 16, tid = threadIdx.x, p = info.pos;
    if (!stage || hd % 16 != 0 || nseg > DIRECT_SEGS || hd >= (int)blockDim.x || 64 % (hd / E) != 0 ||
        ((int)blockDim.x - 64) % (hd / E) != 0)
        return false;
    key_chunk ch;
    if (info.window <= 0) {
        /* a full session: next_chunk's walk in closed form (positions 0 .. p, blocks cut at multiples of
         * block; one chunk when they fit) — a serial walk here is a long chain of dependent instructions */
        const int nk = p + 1, nb = p / block + 1;
        if (nk > ATT_CHUNK || nb > ATT_MAX_BLOCKS || (long)nk * hd * (long)sizeof(float) > stage_bytes) return false;
        for (int k = tid; k <= nb; k += blockDim.x) sm.bt0[k] = k < nb ? k * block : nk;
        ch = key_chunk{nk, nb, nk, 0, 0};
    } else {
        key_walk kw = key_walk_of(info);
        ch = next_chunk(kw, block, ATT_CHUNK, sm.bt0);
        if (ch.nc == 0 || (long)ch.nc * hd * (long)sizeof(float) > stage_bytes || chunk_pos(ch, ch.nc - 1) != p ||
            next_chunk(kw, block, ATT_CHUNK, sm.bt0).nc != 0)
            return false;
    }
    ATT_MARK(1);
    const int nc = ch.nc, nbk = ch.nbk, kvh = h / (H / KVH);
    const size_t plane = (size_t)info.cap * hd;
    const T *kp = (const T *)info.kv + (((size_t)li * 2 + 0) * KVH + kvh) * plane;
    const T *vp = (const T *)info.kv + (((size_t)li * 2 + 1) * KVH + kvh) * plane;
    float *vst = (float *)stage;       /* [nc][hd] the value rows in chunk order, as floats */
    const bool fused = fz.K != NULL;   /* this block stores position p's key and value (chunk index nc - 1) */
    const int kpr = (int)blockDim.x / DTPK, jk = tid / DTPK, v = tid % DTPK;   /* keys a round; this thread's */
    /* the first two rounds' keys (this thread's jk and jk + kpr) asked for now, but the one being stored */
    uint4 kr[DIRECT_SEGS], kr2[DIRECT_SEGS];
    const bool early = jk < nc && !(fused && jk == nc - 1), early2 = jk + kpr < nc && !(fused && jk + kpr == nc - 1);
    if (early) direct_key_load<T>(kr, kp + (size_t)slot_of(info, chunk_pos(ch, jk)) * hd, v, nseg);
    if (early2) direct_key_load<T>(kr2, kp + (size_t)slot_of(info, chunk_pos(ch, jk + kpr)) * hd, v, nseg);
    /* the prologue's warps: one per query head and one for the key head */
    const int vt0 = fused ? 64 : 0;
    if (tid >= vt0) stage_value_rows<T>(vst, vp, info, ch, hd, fused ? nc - 1 : nc, tid - vt0, (int)blockDim.x - vt0);
#ifdef IB_CUDA_ATT_TRACE
    if (li == 3 && tid == 64 && blockIdx.x < 64) att_trace[blockIdx.x][3] = clock64();
#endif
    /* position p's key as stored (its bits) into sm.slot, unused here, and its value row as floats into
     * the stage's last row, by the prologue's key warp: no round trip through the cache after it */
    T *kpos = (T *)sm.slot;
    if (fused) qk_fused_prologue(fz, Q, info, r, h, 1, kvh, H, KVH, hd, li, sm.q, sm.out, kpos, vst + (size_t)(nc - 1) * hd);
    for (int d = tid; d < hd; d += blockDim.x) {
        if (!fused) sm.q[d] = Q[((size_t)r * H + h) * hd + d];
        sm.out[d] = 0.0f;
    }
    if (tid == 0) sm.m = -INFINITY;
    __syncthreads();
    ATT_MARK(2);
    for (int jb = 0; jb < nc; jb += kpr) {
        const int j = jb + jk;
        if (jb + (tid & ~31) / DTPK >= nc) break;   /* none of this warp's keys is left (warp-uniform) */
        if (jb == kpr) {
#pragma unroll
            for (int t = 0; t < DIRECT_SEGS; t++) kr[t] = kr2[t];
        }
        if (j < nc && !(jb == 0 ? early : jb == kpr ? early2 : false))
            direct_key_load<T>(kr, fused && j == nc - 1 ? kpos : kp + (size_t)slot_of(info, chunk_pos(ch, j)) * hd, v, nseg);
        const float sc = direct_score<T>(kr, sm.q, v, nseg, j < nc, scale);
        if (v == 0 && j < nc) sm.sc[j] = sc;
    }
    __syncthreads();
    ATT_MARK(4);
    block_maxima_par(sm.sc, sm.mk, sm.c, sm.bt0, nbk, &sm.m, sm.bm);
    __syncthreads();
    ATT_MARK(5);
    for (int j = tid; j < nc; j += blockDim.x) sm.pw[j] = ib_expf_lane(sm.sc[j] - sm.mk[j]);
    __syncthreads();
    ATT_MARK(6);
    /* thread lt's running sum (no value-pass work: hd < blockDim.x) */
    const int lt = (int)blockDim.x - 1;
    if (tid == lt) {
        float l = 0.0f;
        for (int k = 0; k < nbk; k++) {
            l = l * sm.c[k];
#pragma unroll 8
            for (int j = sm.bt0[k]; j < sm.bt0[k + 1]; j++) l = l + sm.pw[j];
        }
        sm.l = l;
    }
    value_pass_stage(sm.out, hd, vst, hd, sm.pw, sm.c, sm.bt0, nbk);
    ATT_MARK(7);
    for (int d = tid; d < hd; d += blockDim.x) {
        const float o = sm.out[d] / sm.l;
        ATT[((size_t)r * H + h) * hd + d] = o;
        sm.out[d] = o;
    }
    if (qG > 0) {
        __syncthreads();
        quantize_span(sm.out, hd, r, h * hd, H * hd, qG, xq, qd, qad);
    }
    ATT_MARK(8);
    return true;
}

/* Ask L2 for the keys and values a row's attention at layer li, KV head kvh reads first (the cache's
 * slots [0, min(pos + 1, capacity, ATT_CHUNK))): its earlier positions, which this step does not write;
 * a line this step writes later stays coherent in L2. */
__device__ __forceinline__ void prefetch_kv(const rowinfo &info, int li, int KVH, int kvh, int hd) {
    const size_t elt = info.f16 ? 2 : 4, plane = (size_t)info.cap * hd * elt;
    int n = info.pos + 1 < info.cap ? info.pos + 1 : info.cap;
    if (n > ATT_CHUNK) n = ATT_CHUNK;
    const char *kp = (const char *)info.kv + (((size_t)li * 2 + 0) * KVH + kvh) * plane;
    const char *vp = (const char *)info.kv + (((size_t)li * 2 + 1) * KVH + kvh) * plane;
    prefetch_bytes(kp, (size_t)n * hd * elt);
    prefetch_bytes(vp, (size_t)n * hd * elt);
}

/* One block per (row, query head) — SPLIT: a cluster of cl blocks (launched with that cluster size) —:
 * attend_row_head for the row's KV dtype (few rows: more blocks than attention_kernel's for the
 * latency-bound case; the same arithmetic). qG > 0: the output rows are also quantized for group qG (hd
 * a multiple of qG) into xq/qd/qad for the product that reads them. The unsplit instantiation has no
 * cluster code at all (cl is ignored). */
template <bool SPLIT>
__global__ void __launch_bounds__(ATT_THREADS) attention_head_kernel(const float *__restrict__ Q, float *__restrict__ ATT,
                                                                const rowinfo *__restrict__ ri, int H, int KVH, int hd,
                                                                int li, float scale, int block, int qG,
                                                                int8_t *__restrict__ xq, float *__restrict__ qd,
                                                                float *__restrict__ qad, int stage_bytes, int cl, qk_fuse fz) {
    ATT_MARK(0);
    if (!SPLIT) cl = 1;
    const int rh = (int)blockIdx.x / cl, r = rh / H, h = rh % H;
    const att_split sp = {cl, SPLIT ? cluster_rank() : 0};
    const rowinfo info = ri[r];   /* uploaded before the step's first kernel */
    prefetch_kv(info, li, KVH, h / (H / KVH), hd);
    PDL_ENTER();
    ATT_MARK(9);
    __shared__ att_smem1 sm;
    extern __shared__ __align__(16) unsigned char att_stage[];
    unsigned char *st = stage_bytes > 0 ? att_stage : NULL;
    if (info.f16) attend_row_head<uint16_t, SPLIT>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, sp, fz);
    else attend_row_head<float, SPLIT>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, sp, fz);
}

/* attention_head_kernel<false>'s work for steps whose rows all keep T (float or half) KV: each block
 * takes attend_row_head_direct where its row fits it, else attend_row_head (the same arithmetic). A
 * kernel of its own so a decode step runs only this code (one KV type, no cluster code). NTH threads a
 * block: ATT_THREADS, or ATT_THREADS_WIDE (att_wide_mode) for grids that
 * leave most multiprocessors idle (B=1: one round of keys instead of two, the value rows staged by twice
 * the threads) — the operations are the same whatever the block's size. */
#define DIRECT_MIN_BLOCKS 2   /* 2 blocks a multiprocessor at most 128 registers: B=15's 240 blocks in one wave */
#define ATT_THREADS_WIDE 512  /* threads of a direct attention block in small grids (at most 128 registers) */
template <typename T, int NTH>
__global__ void __launch_bounds__(NTH, NTH == ATT_THREADS ? DIRECT_MIN_BLOCKS : 1) attention_direct_kernel(const float *__restrict__ Q, float *__restrict__ ATT,
                                                                  const rowinfo *__restrict__ ri, int H, int KVH, int hd,
                                                                  int li, float scale, int block, int qG,
                                                                  int8_t *__restrict__ xq, float *__restrict__ qd,
                                                                  float *__restrict__ qad, int stage_bytes, qk_fuse fz) {
    ATT_MARK(0);
    const int r = (int)blockIdx.x / H, h = (int)blockIdx.x % H;
    const rowinfo info = ri[r];   /* uploaded before the step's first kernel */
    prefetch_kv(info, li, KVH, h / (H / KVH), hd);
    PDL_ENTER();
    ATT_MARK(9);
    __shared__ att_smem1 sm;
    extern __shared__ __align__(16) unsigned char att_stage[];
    unsigned char *st = stage_bytes > 0 ? att_stage : NULL;
#ifdef IB_CUDA_ATT_TRACE
    if (att_trace_twice && li == 3) {   /* idempotent: the same stores and outputs twice */
        attend_row_head_direct<T>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, fz);
        __syncthreads();
        ATT_MARK(0);
    }
#endif
    if (!attend_row_head_direct<T>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, fz))
        attend_row_head<T, false>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes,
                                  att_split{1, 0}, fz);
}

/* Shared memory of an attention block: ATT_QH floats hold the G query heads' q and outputs, ATT_QH
 * scores (G heads x the chunk's keys). */
struct att_smem {
    float q[ATT_QH], out[ATT_QH];
    float sc[ATT_QH], pw[ATT_QH], mk[ATT_QH];
    int slot[ATT_CHUNK];
    int bt0[ATT_MAX_BLOCKS + 1];            /* chunk index of each key block's first key, then the chunk's size */
    float c[IB_ATTN_MAX_GROUP * ATT_MAX_BLOCKS];   /* [head][key block] rescale factors */
    float l[IB_ATTN_MAX_GROUP], m[IB_ATTN_MAX_GROUP];   /* per head: the running sum (at the end), max */
};

/* ATT[r][h] for the G = H/KVH query heads h of KV head kvh = attention of Q[r][h] over its session's
 * kept keys at layer li; one block per (row, KV head), ATT_THREADS threads, the keys and values read
 * once for the G heads. The attended positions — a full session [0, pos]; a windowed one the sink range
 * [0, min(sink, pos+1)) then the window range [max(pos-window+1, that), pos] — are cut into key blocks
 * at multiples of `block` (ib_attend_heads / ib_attend_policy) and walked in chunks of whole key blocks
 * (at most ATT_CHUNK keys, and ATT_QH / G). Per chunk: every (head, key) score s = dot16(q, k) * scale
 * in parallel (16 threads own ib_dot16's lanes and fold them 8, 4, 2, 1; a score does not depend on
 * the softmax state); then per head (warp h) and key block in order: m' = max(m, block max), c = exp(m -
 * m') (block_maxima_warp; warps without a head ask L1 for the chunk's value rows); every p = exp(s - m') in parallel; thread h: l = l*c then l += p_j in key
 * order; a thread per (head, output element): out = out*c then out += p_j * v_j in key order; finally
 * out / l. Exactly the reference's operations, in its order, for each head. T: float or half KV. */
template <typename T>
__device__ void attend_row_kvhead(att_smem &sm, const float *__restrict__ Q, float *__restrict__ ATT,
                                  const rowinfo &info, int r, int kvh, int H, int KVH, int hd, int li, float scale,
                                  int block, int qG, int8_t *__restrict__ xq, float *__restrict__ qd,
                                  float *__restrict__ qad, const qk_fuse &fz) {
    const int G = H / KVH, tid = threadIdx.x, grp = tid >> 4, u = tid & 15, ngrp = blockDim.x >> 4;
    const int gw = G * hd;
    if (fz.K) qk_fused_prologue(fz, Q, info, r, kvh * G, G, kvh, H, KVH, hd, li, sm.q, sm.out);
    for (int e = tid; e < gw; e += blockDim.x) {
        if (!fz.K) sm.q[e] = Q[((size_t)r * H + (size_t)kvh * G) * hd + e];
        sm.out[e] = 0.0f;
    }
    const size_t plane = (size_t)info.cap * hd;
    const T *kp = (const T *)info.kv + (((size_t)li * 2 + 0) * KVH + kvh) * plane;
    const T *vp = (const T *)info.kv + (((size_t)li * 2 + 1) * KVH + kvh) * plane;
    const int p = info.pos;
    int S, lo;
    attended_ranges(info, S, lo);
    const int ra[2] = {0, lo}, rb[2] = {S, p + 1};
    const int chunk = ATT_QH / G < ATT_CHUNK ? ATT_QH / G : ATT_CHUNK;
    /* warp h (h < G, then h + warps): head h's running max (sm.m[h]); thread lbase + h: its running sum
     * (threads without value-pass work when there are enough) */
    const int lbase = gw + G <= (int)blockDim.x ? (int)blockDim.x - G : 0;
    float l = 0.0f;
    if (tid < G) sm.m[tid] = -INFINITY;
    int rg = 0, b0 = 0;              /* the next key block: range rg, position b0 (uniform over threads) */
    while (rg < 2) {
        /* the chunk: whole key blocks, positions pa.. for its first na keys, then pb.. (second range) */
        int nc = 0, nbk = 0, na = -1, pa = 0, pb = 0;
        while (rg < 2 && nbk < ATT_MAX_BLOCKS) {
            if (b0 >= rb[rg]) {
                if (++rg < 2) b0 = ra[rg];
                continue;
            }
            int end = (b0 / block + 1) * block;
            if (end > rb[rg]) end = rb[rg];
            if (nc + (end - b0) > chunk) break;
            if (nbk == 0) pa = b0;
            else if (na < 0 && rg == 1 && ra[1] == b0 && b0 != pa + nc) na = nc, pb = b0;
            if (tid == 0) sm.bt0[nbk] = nc;
            nbk++, nc += end - b0, b0 = end;
        }
        if (nc == 0) break;
        if (na < 0) na = nc;
        if (tid == 0) sm.bt0[nbk] = nc;
        for (int j = tid; j < nc; j += blockDim.x) sm.slot[j] = slot_of(info, j < na ? pa + j : pb + (j - na));
        __syncthreads();
        /* scores of the (head, key) pairs e = h*nc + j: four per group per round, every group the same
         * number of rounds, so the shuffles see whole warps */
        const int npair = G * nc;
        for (int e0 = 0; e0 < npair; e0 += 4 * ngrp) {
            float a[4];
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int e = e0 + x * ngrp + grp;
                a[x] = e < npair ? dot16_lane(sm.q + (size_t)(e / nc) * hd, kp + (size_t)sm.slot[e % nc] * hd, hd, u)
                                 : 0.0f;
            }
#pragma unroll
            for (int w = 8; w >= 1; w >>= 1)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const float o = __shfl_down_sync(0xffffffffu, a[x], w, 16);
                    if (u < w) a[x] = a[x] + o;
                }
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int e = e0 + x * ngrp + grp;
                if (u == 0 && e < npair) sm.sc[e] = a[x] * scale;
            }
        }
        __syncthreads();
        {
            const int warp = tid >> 5, nwarp = (int)blockDim.x >> 5;
            for (int h = warp; h < G; h += nwarp)
                block_maxima_warp(sm.sc + (size_t)h * nc, sm.mk + (size_t)h * nc, sm.c + h * ATT_MAX_BLOCKS, sm.bt0,
                                  nbk, &sm.m[h], tid & 31);
            if (G < nwarp && warp >= G) prefetch_values_l1(vp, sm.slot, nc, hd, tid - 32 * G, (int)blockDim.x - 32 * G);
        }
        __syncthreads();
        for (int e = tid; e < npair; e += blockDim.x) sm.pw[e] = ib_expf_lane(sm.sc[e] - sm.mk[e]);
        __syncthreads();
        if (tid >= lbase && tid < lbase + G) {
            const int h = tid - lbase;
            const float *pw = sm.pw + (size_t)h * nc;
            for (int k = 0; k < nbk; k++) {
                l = l * sm.c[h * ATT_MAX_BLOCKS + k];
#pragma unroll 8
                for (int j = sm.bt0[k]; j < sm.bt0[k + 1]; j++) l = l + pw[j];
            }
        }
        value_pass(sm.out, gw, vp, sm.slot, sm.pw, nc, sm.c, ATT_MAX_BLOCKS, sm.bt0, nbk, hd, hd);
    }
    if (tid >= lbase && tid < lbase + G) sm.l[tid - lbase] = l;
    __syncthreads();
    for (int e = tid; e < gw; e += blockDim.x) {
        const float o = sm.out[e] / sm.l[e / hd];
        ATT[((size_t)r * H + (size_t)kvh * G) * hd + e] = o;
        sm.out[e] = o;
    }
    if (qG > 0) {
        __syncthreads();
        quantize_span(sm.out, gw, r, kvh * G * hd, H * hd, qG, xq, qd, qad);
    }
}

/* One block per (row, KV head): attend_row_kvhead for the row's KV dtype; qG as attention_head_kernel. */
__global__ void __launch_bounds__(ATT_THREADS, 4) attention_kernel(const float *__restrict__ Q, float *__restrict__ ATT,
                                                                const rowinfo *__restrict__ ri, int H, int KVH, int hd,
                                                                int li, float scale, int block, int qG,
                                                                int8_t *__restrict__ xq, float *__restrict__ qd,
                                                                float *__restrict__ qad, qk_fuse fz) {
    const int r = blockIdx.x / KVH, kvh = blockIdx.x % KVH;
    const rowinfo info = ri[r];   /* uploaded before the step's first kernel */
    prefetch_kv(info, li, KVH, kvh, hd);
    PDL_ENTER();
    __shared__ att_smem sm;
    if (info.f16) attend_row_kvhead<uint16_t>(sm, Q, ATT, info, r, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad, fz);
    else attend_row_kvhead<float>(sm, Q, ATT, info, r, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad, fz);
}

/* ---------------------------------------------------------------- attention: tiles of a prompt's rows */

#define TILE_ROWS 8         /* rows of one session per block of attention_tile_kernel */
#define TILE_QV 32          /* most (row, query head) vectors of such a block: TILE_ROWS * G */
#define TILE_HD 128         /* largest head dim it takes */

/* One tile: rows [r0, r0 + n) of the step, consecutive positions of one session (a prompt's chunk). */
struct att_tile {
    int r0, n;
};

/* Shared memory of attention_tile_kernel (dynamic): q [NQ][hd + 16], keys and values [block][hd + 16]
 * (floats), scores then weights [NQ][block], and per vector its running max m, sum l, this
 * key block's rescale factor c and keys nv. */
__host__ __device__ __forceinline__ size_t tile_smem_bytes(int nq, int hd, int block) {
    return ((size_t)nq * (hd + 16) + 2 * (size_t)block * (hd + 16) + (size_t)nq * block + 4 * (size_t)nq) *
           sizeof(float);
}

/* ATT[r][h] for the rows of tile t = blockIdx.x / KVH and the G = H/KVH query heads h of KV head kvh =
 * blockIdx.x % KVH: the attention of each (row, head) vector over its session's keys [0, pos] (a full
 * cache), ATT_THREADS threads. The rows of a tile are one session's consecutive positions, so they
 * share their keys: each key block (positions [kb*block, (kb+1)*block), as ib_attend_heads cuts them)
 * is staged in shared memory once (as floats, exactly to_f32) for all the tile's vectors, instead of
 * once per row. For each vector whose row reaches the block (pos >= kb*block) over the block's keys it
 * sees (those <= pos), in the reference's order: every score s_j = dot16(q, k_j) * scale (16 threads own
 * ib_dot16's lanes, each a micro-tile of 2 vectors x 4 keys, folded 8, 4, 2, 1); m' = max(m, the block's
 * max), c = exp(m - m'); p_j = exp(s_j - m'); l = l*c then l += p_j in key order (one thread a vector);
 * out = out*c then out += p_j * v_j in key order (a thread per (vector, element) chain, kept in
 * registers); finally out / l. The same operations as attend_row_head and attend_row_kvhead, so the same
 * bits. qG > 0: each (row, head) output also quantized for group qG into xq/qd/qad. T: float or half KV.
 * Needs nq = n * G <= TILE_QV, hd <= TILE_HD (a multiple of 16), block <= ATT_MAX_BLOCK. */
template <typename T>
__device__ void attend_tile(float *sh, const float *__restrict__ Q, float *__restrict__ ATT, const rowinfo &info, int r0,
                            int n, int kvh, int H, int KVH, int hd, int li, float scale, int block, int qG,
                            int8_t *__restrict__ xq, float *__restrict__ qd, float *__restrict__ qad) {
    const int G = H / KVH, nq = n * G, tid = threadIdx.x, nt = blockDim.x, ldq = hd + 16;
    float *qs = sh, *ks = qs + (size_t)nq * ldq, *vs = ks + (size_t)block * ldq, *ps = vs + (size_t)block * ldq;
    float *mv = ps + (size_t)nq * block, *lv = mv + nq, *cv = lv + nq;
    int *nvv = (int *)(cv + nq);
    /* q vectors: v = i * G + g is row r0 + i, head kvh * G + g */
    for (int e = tid; e < nq * hd; e += nt) {
        const int v = e / hd, d = e % hd;
        qs[(size_t)v * ldq + d] = Q[((size_t)(r0 + v / G) * H + (size_t)kvh * G + v % G) * hd + d];
    }
    for (int v = tid; v < nq; v += nt) mv[v] = -INFINITY, lv[v] = 0.0f;
    const size_t plane = (size_t)info.cap * hd;
    const T *kp = (const T *)info.kv + (((size_t)li * 2 + 0) * KVH + kvh) * plane;
    const T *vp = (const T *)info.kv + (((size_t)li * 2 + 1) * KVH + kvh) * plane;
    const int p0 = info.pos, plast = p0 + n - 1;
    /* the value chains: thread tid owns element d = tid % hd of the vectors tid / hd, + nt / hd, … */
    constexpr int QPT = TILE_QV / (ATT_THREADS / TILE_HD);   /* most chains a thread holds */
    const int d = tid % hd, vstep = nt / hd, v0 = tid / hd;
    float o[QPT];
#pragma unroll
    for (int i = 0; i < QPT; i++) o[i] = 0.0f;
    const int grp = tid >> 4, u = tid & 15, ngrp = nt >> 4;
    for (int kb0 = 0; kb0 <= plast; kb0 += block) {
        const int nk = (kb0 + block <= plast + 1 ? block : plast + 1 - kb0);   /* keys staged: up to the last row's */
        /* stage the block's keys and values as floats: 16-byte pieces, eight loads a thread in flight
         * before their conversions (each element exactly to_f32) */
        {
            constexpr int E = 16 / (int)sizeof(T);   /* elements a piece */
            const int pr = hd / E, total = 2 * nk * pr;
            for (int i0 = tid; i0 < total; i0 += 8 * nt) {
                uint4 w[8];
#pragma unroll
                for (int x = 0; x < 8; x++) {
                    const int i = i0 + x * nt, isv = i >= nk * pr, ii = i - isv * nk * pr;
                    if (i < total)
                        w[x] = *(const uint4 *)((isv ? vp : kp) + (size_t)(kb0 + ii / pr) * hd + (ii % pr) * E);
                }
#pragma unroll
                for (int x = 0; x < 8; x++) {
                    const int i = i0 + x * nt, isv = i >= nk * pr, ii = i - isv * nk * pr;
                    if (i >= total) break;
                    float *o = (isv ? vs : ks) + (size_t)(ii / pr) * ldq + (ii % pr) * E;
                    if (sizeof(T) == 2) halves8_to_f32(w[x], o);
                    else *(uint4 *)o = w[x];
                }
            }
        }
        /* each vector's keys in this block (0: its row does not reach it) */
        for (int v = tid; v < nq; v += nt) {
            const int p = p0 + v / G;
            nvv[v] = p < kb0 ? 0 : (p + 1 - kb0 < block ? p + 1 - kb0 : block);
        }
        __syncthreads();
        /* scores: micro-tiles of 2 vectors x 4 keys, one per 16-thread group per round */
        const int mq = (nq + 1) / 2, mk = (nk + 3) / 4;
        for (int t0 = 0; t0 < mq * mk; t0 += ngrp) {
            const int t = t0 + grp, tq = t / mk, tk = t % mk;
            float a[2][4];
#pragma unroll
            for (int x = 0; x < 2; x++)
#pragma unroll
                for (int y = 0; y < 4; y++) a[x][y] = 0.0f;
            if (t < mq * mk) {
                const int va = 2 * tq, vb = 2 * tq + 1 < nq ? 2 * tq + 1 : 2 * tq;
                const float *qa = qs + (size_t)va * ldq, *qb = qs + (size_t)vb * ldq;
                const float *kr[4];
#pragma unroll
                for (int y = 0; y < 4; y++) kr[y] = ks + (size_t)(4 * tk + y < nk ? 4 * tk + y : 4 * tk) * ldq;
                for (int i = u; i < hd; i += 16) {
                    const float xa = qa[i], xb = qb[i];
#pragma unroll
                    for (int y = 0; y < 4; y++) {
                        const float k = kr[y][i];
                        a[0][y] = a[0][y] + xa * k;
                        a[1][y] = a[1][y] + xb * k;
                    }
                }
            }
#pragma unroll
            for (int w = 8; w >= 1; w >>= 1)
#pragma unroll
                for (int x = 0; x < 2; x++)
#pragma unroll
                    for (int y = 0; y < 4; y++) {
                        const float s = __shfl_down_sync(0xffffffffu, a[x][y], w, 16);
                        if (u < w) a[x][y] = a[x][y] + s;
                    }
            if (u == 0 && t < mq * mk)
#pragma unroll
                for (int x = 0; x < 2; x++)
#pragma unroll
                    for (int y = 0; y < 4; y++) {
                        const int v = 2 * tq + x, j = 4 * tk + y;
                        if (v < nq && j < nk) ps[(size_t)v * block + j] = a[x][y] * scale;
                    }
        }
        __syncthreads();
        /* per vector: the block's max over its keys, m' = max(m, block max), c = exp(m - m') */
        for (int v = tid; v < nq; v += nt) {
            const int nv = nvv[v];
            if (nv == 0) continue;
            const float *s = ps + (size_t)v * block;
            float mb = -INFINITY;
            for (int j = 0; j < nv; j++)
                if (s[j] > mb) mb = s[j];
            const float mr = mv[v], m_new = mb > mr ? mb : mr;
            cv[v] = ib_expf_lane(mr - m_new);
            mv[v] = m_new;
        }
        __syncthreads();
        /* p_j = exp(s_j - m') in place, every pair in parallel */
        for (int e = tid; e < nq * block; e += nt) {
            const int v = e / block, j = e % block;
            if (j < nvv[v]) ps[e] = ib_expf_lane(ps[e] - mv[v]);
        }
        __syncthreads();
        /* l = l*c then l += p_j in key order, one thread a vector */
        for (int v = tid; v < nq; v += nt) {
            const int nv = nvv[v];
            if (nv == 0) continue;
            const float *pw = ps + (size_t)v * block;
            float l = lv[v] * cv[v];
            for (int j = 0; j < nv; j++) l = l + pw[j];
            lv[v] = l;
        }
        /* out = out*c then out += p_j * v_j in key order, a thread per (vector, element) chain */
        int nvr[QPT];   /* keys of this block each chain takes (0: none, or no such vector) */
#pragma unroll
        for (int i = 0; i < QPT; i++) {
            const int v = v0 + i * vstep;
            nvr[i] = v < nq ? nvv[v] : 0;
            if (nvr[i] > 0) o[i] = o[i] * cv[v];
        }
        for (int j = 0; j < nk; j++) {
            const float x = vs[(size_t)j * ldq + d];
#pragma unroll
            for (int i = 0; i < QPT; i++)
                if (j < nvr[i]) o[i] = o[i] + ps[(size_t)(v0 + i * vstep) * block + j] * x;
        }
        __syncthreads();
    }
    /* out / l, into ATT and (for the quantization) over q */
#pragma unroll
    for (int i = 0; i < QPT; i++) {
        const int v = v0 + i * vstep;
        if (v < nq) {
            const float y = o[i] / lv[v];
            ATT[((size_t)(r0 + v / G) * H + (size_t)kvh * G + v % G) * hd + d] = y;
            qs[(size_t)v * ldq + d] = y;
        }
    }
    if (qG > 0) {
        __syncthreads();
        for (int v = 0; v < nq; v++)
            quantize_span(qs + (size_t)v * ldq, hd, r0 + v / G, (kvh * G + v % G) * hd, H * hd, qG, xq, qd, qad);
    }
}

/* One block per (tile, KV head): attend_tile for the tile's KV dtype (tiles [n_tiles], ri as the step's). */
__global__ void __launch_bounds__(ATT_THREADS) attention_tile_kernel(const float *__restrict__ Q, float *__restrict__ ATT,
                                                                     const rowinfo *__restrict__ ri,
                                                                     const att_tile *__restrict__ tiles, int H, int KVH,
                                                                     int hd, int li, float scale, int block, int qG,
                                                                     int8_t *__restrict__ xq, float *__restrict__ qd,
                                                                     float *__restrict__ qad) {
    PDL_ENTER();
    extern __shared__ __align__(16) float tile_sh[];
    const att_tile tl = tiles[blockIdx.x / KVH];
    const int kvh = blockIdx.x % KVH;
    const rowinfo info = ri[tl.r0];
    if (info.f16)
        attend_tile<uint16_t>(tile_sh, Q, ATT, info, tl.r0, tl.n, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad);
    else attend_tile<float>(tile_sh, Q, ATT, info, tl.r0, tl.n, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad);
}

/* ---------------------------------------------------------------- availability */

/* 1 when device 0 exists and is compute capability 9.0 (this build's kernels are sm_90a); else 0 and
 * *why says why in one static line. */
static int device_ok(const char **why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError();
        if (why) *why = "no CUDA device";
        return 0;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess || p.major != 9 || p.minor != 0) {
        if (why) *why = "the CUDA device is not compute capability 9.0 (this build's kernels are sm_90a)";
        return 0;
    }
    if (why) *why = NULL;
    return 1;
}

/* cuda.h */
extern "C" int ib_cuda_describe(char *buf, size_t n) {
    const char *why;
    if (!device_ok(&why)) {
        snprintf(buf, n, "%s", why);
        return 0;
    }
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    snprintf(buf, n, "%s, %d SMs, sm_%d%d, %.1f GiB", p.name, p.multiProcessorCount, p.major, p.minor,
             (double)p.totalGlobalMem / (1 << 30));
    return 1;
}

/* ---- the table (contracts in backend.h) ---- */

static int cuda_available(const char **why) { return device_ok(why); }

/* ---------------------------------------------------------------- create / destroy */

/* Device allocation of n bytes recorded in b's list (freed at destroy); NULL on failure. */
static void *dalloc(cuda_backend *b, size_t n) {
    void *p = NULL;
    if (b->n_alloc == b->cap_alloc) {
        int cap = b->cap_alloc ? 2 * b->cap_alloc : 256;
        void **l = (void **)realloc(b->alloc_list, (size_t)cap * sizeof(void *));
        if (!l) return NULL;
        b->alloc_list = l, b->cap_alloc = cap;
    }
    if (cudaMalloc(&p, n ? n : 16) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    b->alloc_list[b->n_alloc++] = p;
    return p;
}

/* Upload src (n bytes) into a new device allocation; NULL on failure. */
static void *dupload(cuda_backend *b, const void *src, size_t n) {
    void *p = dalloc(b, n);
    if (p && cudaMemcpy(p, src, n, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    return p;
}

/* Repack the CPU-packed matrix cm into the device layout of cuda.h and upload it into *dm. */
static ib_status upload_matrix(cuda_backend *b, const ib_matrix *cm, dmat *dm, ib_error *err) {
    const int N = cm->rows, K = cm->cols, Np = (N + NT - 1) / NT * NT;
    memset(dm, 0, sizeof *dm);
    dm->fmt = cm->fmt, dm->N = N, dm->K = K, dm->G = cm->group, dm->Np = Np;
    if (cm->fmt == IB_WF32) {
        float *w = (float *)calloc((size_t)K * Np, sizeof(float));   /* [K][Np] */
        if (!w) return ib_fail(err, IB_ERR_NOMEM, "cuda: repacking a [%d, %d] matrix: out of host memory", N, K);
        for (int n = 0; n < N; n++) {
            const float *src = (const float *)ib_pk_panel(cm, n / IB_PANEL) + n % IB_PANEL;
            for (int k = 0; k < K; k++) w[(size_t)k * Np + n] = src[(size_t)k * IB_PANEL];
        }
        dm->wf = (const float *)dupload(b, w, (size_t)K * Np * sizeof(float));
        free(w);
        if (!dm->wf) return ib_fail(err, IB_ERR_NOMEM, "cuda: uploading a [%d, %d] float matrix failed", N, K);
        return IB_OK;
    }
    const int G = cm->group, ng = K / G, q4 = cm->fmt == IB_WQ4, KC = q4 ? 32 : 16;
    dm->ng = ng;
    const size_t nwords = (size_t)(K / KC) * Np * 4;
    uint32_t *w = (uint32_t *)calloc(nwords, 4);            /* [K/KC][Np][4] */
    float *s = (float *)calloc((size_t)ng * Np, sizeof(float)), *bb = (float *)calloc((size_t)ng * Np, sizeof(float));
    if (!w || !s || !bb) {
        free(w), free(s), free(bb);
        return ib_fail(err, IB_ERR_NOMEM, "cuda: repacking a [%d, %d] matrix: out of host memory", N, K);
    }
    for (int n = 0; n < N; n++) {
        const int p = n / IB_PANEL, j = n % IB_PANEL;
        const uint8_t *P = ib_pk_panel(cm, p);
        /* CPU block kb (8 k for Q4, 4 k for Q8): dword j is lane j's word, the same bytes as word i of
         * device chunk c = kb / 4, i = kb % 4 */
        const int nkb = q4 ? K / 8 : K / 4;
        for (int kb = 0; kb < nkb; kb++) {
            uint32_t v;
            memcpy(&v, P + (size_t)kb * 64 + (size_t)j * 4, 4);
            w[((size_t)(kb / 4) * Np + n) * 4 + kb % 4] = v;
        }
        for (int g = 0; g < ng; g++) {
            const uint8_t *sb = ib_pk_sb(cm, p, g);
            s[(size_t)g * Np + n] = ib_pk_sb_get(cm, sb, j);
            bb[(size_t)g * Np + n] = ib_pk_sb_get(cm, sb, IB_PANEL + j);
        }
    }
    dm->w = (const uint4 *)dupload(b, w, nwords * 4);
    dm->s = (const float *)dupload(b, s, (size_t)ng * Np * sizeof(float));
    dm->b = (const float *)dupload(b, bb, (size_t)ng * Np * sizeof(float));
    free(w), free(s), free(bb);
    if (!dm->w || !dm->s || !dm->b) return ib_fail(err, IB_ERR_NOMEM, "cuda: uploading a [%d, %d] matrix failed", N, K);
    return IB_OK;
}

/* Device bytes of matrix m as upload_matrix lays it out: [K][Np] floats, or [K/KC][Np] 16-byte code
 * chunks (KC = 32 k for 4-bit codes, 16 for 8-bit) and [ng][Np] scales and biases. */
static size_t dmat_bytes(const dmat *m) {
    if (m->fmt == IB_WF32) return (size_t)m->K * m->Np * sizeof(float);
    return (size_t)(m->K / MM_KC(m->fmt)) * m->Np * 16 + (size_t)2 * m->ng * m->Np * sizeof(float);
}

/* Free everything an instance holds (NULL and partly built instances too): graphs, device and pinned
 * memory, the stream. */
static void cuda_destroy(ib_backend *base) {
    cuda_backend *b = (cuda_backend *)base;
    if (!b) return;
    if (b->st) cudaStreamSynchronize(b->st);
#ifdef IB_CUDA_ATT_TRACE
    {
        long long t[64][12];
        if (cudaMemcpyFromSymbol(t, att_trace, sizeof t) == cudaSuccess)
            for (int i = 0; i < 4; i++)
                fprintf(stderr, "att trace block %d (cycles from its start, last chunk): waited %lld, q ready %lld, slots %lld, "
                                "staged %lld, scored %lld, maxima %lld, exp %lld, values %lld, end %lld; prologue q %lld k %lld\n", i,
                        t[i][9] - t[i][0], t[i][1] - t[i][0], t[i][2] - t[i][0], t[i][3] - t[i][0], t[i][4] - t[i][0], t[i][5] - t[i][0], t[i][6] - t[i][0],
                        t[i][7] - t[i][0], t[i][8] - t[i][0], t[i][10] - t[i][0], t[i][11] - t[i][0]);
    }
#endif
    drop_graphs(b);
    free(b->gc), free(b->rec);
    cudaFreeHost(b->h_logits);
    for (int i = 0; i < b->n_alloc; i++) cudaFree(b->alloc_list[i]);
    cudaFreeHost(b->h_tok), cudaFreeHost(b->h_lrow), cudaFreeHost(b->h_pos), cudaFreeHost(b->h_ri);
    cudaFreeHost(b->h_tiles);
    cudaFreeHost(b->h_cs), cudaFreeHost(b->h_amax);
    if (b->st) cudaStreamDestroy(b->st);
    free(b->mats), free(b->lout), free(b->aout), free(b->h_rows), free(b->alloc_list);
    free(b->lhd), free(b->lkvh);
    gemma_free(b->gm);
    free(b);
}


/* An instance for m: every matrix repacked and uploaded (upload_matrix), norms, step scratch for
 * cfg->max_rows rows, pinned staging; on failure nothing stays allocated. */
static ib_status cuda_create(const ib_model *m, const ib_backend_cfg *cfg, ib_backend **out, ib_error *err) {
    *out = NULL;
    const char *why;
    if (!device_ok(&why)) return ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: %s", why);
    const ib_config *c = &m->cfg;
    const int gemma = c->arch == IB_ARCH_GEMMA4;   /* per-layer shapes: checked by gemma_create */
    if (!gemma && (c->head_dim > IB_ATTN_MAX_HD || c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > IB_ATTN_MAX_GROUP ||
        (c->n_heads / c->n_kv_heads) * c->head_dim > ATT_QH))
        return ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: head_dim %d / heads %d, %d not supported", c->head_dim,
                       c->n_heads, c->n_kv_heads);
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof *b);
    if (!b) return ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
    b->base.ops = &ib_backend_cuda;
    b->D = c->hidden_size, b->H = c->n_heads, b->KVH = c->n_kv_heads, b->hd = c->head_dim;
    b->F = ib_config_ffn_max(c), b->V = c->vocab_size, b->L = c->n_layers;   /* F: the widest layer's MLP */
    b->R_max = cfg->max_rows > 0 ? cfg->max_rows : 1;
    b->act = cfg->act == IB_ACT_Q8 ? IB_ACT_Q8 : IB_ACT_F32;
    b->eps = (float)c->rms_eps;
    b->scale = 1.0f / sqrtf((float)c->head_dim);
    b->theta = c->rope_theta;
    b->pool = cfg->pool;
    b->q_ready_buf = -1;
    {
        const char *g = getenv("IB_CUDA_GRAPHS");   /* "0": run every step op by op (for comparisons) */
        b->use_graphs = !(g && !strcmp(g, "0"));
        const char *pd = getenv("IB_CUDA_PDL");      /* "0": every kernel waits for the previous one's end */
        b->pdl = !(pd && !strcmp(pd, "0"));
        /* rows from which Q8 products use the tensor cores (tests set it to compare both kernels) */
        const char *t = getenv("IB_CUDA_MMA_ROWS");
        b->mma_rows = t && atoi(t) > 0 ? atoi(t) : MMA_MIN_ROWS;
        /* rows from which attention takes a block per KV head (tests set it to compare both kernels) */
        /* 32 or 64: every tensor-core product takes the tiled kernel with that many rows per block
         * (tests; unset: the kernel and its rows follow the grid's size) */
        const char *bm = getenv("IB_CUDA_MMA_BM");
        b->mma_bm = bm && (atoi(bm) == 32 || atoi(bm) == 64) ? atoi(bm) : 0;
        const char *mk = getenv("IB_CUDA_MMA_KERNEL");
        b->mma_kernel = !mk ? MMA_BY_ROWS : !strcmp(mk, "pipe") ? MMA_PIPE : !strcmp(mk, "16") ? MMA_16 : MMA_BY_ROWS;
        b->mma_narrow = (mma_narrow_mode)env_mode("IB_CUDA_MMA_NARROW");
        const char *a = getenv("IB_CUDA_ATT_GROUP_ROWS");
        b->att_group_rows = a && atoi(a) > 0 ? atoi(a) : ATT_GROUP_MIN_ROWS;
        /* "attn", "linear" (comma-separated): those kernels, which recompute their outputs from inputs they
         * do not write, run twice in every step — the difference in step time is their cost inside the
         * graph (ncu times each kernel alone, with cold caches). The same bits. */
        /* "0": per-head attention reads the cache directly; N > 0: its stage holds at most N KiB (tests:
         * small stages walk many chunks) */
        const char *as = getenv("IB_CUDA_ATT_STAGE");
        const long ask = as ? atol(as) : -1;
        b->att_stage = ask < 0 ? ATT_STAGE_MAX : ask < ATT_STAGE_MAX / 1024 ? (int)ask * 1024 : ATT_STAGE_MAX;
        /* "1", "2", "4", "8": blocks a head of the per-head attention where the grid allows (default 4) */
        const char *asp = getenv("IB_CUDA_ATT_SPLIT");
        const int spn = asp ? atoi(asp) : 4;
        b->att_cl = spn == 1 || spn == 2 || spn == 8 ? spn : 4;
        /* N: the split from N attended keys on (default ATT_SPLIT_KEYS) */
        const char *ask2 = getenv("IB_CUDA_ATT_SPLIT_KEYS");
        b->att_split_keys = ask2 && atoi(ask2) > 0 ? atoi(ask2) : ATT_SPLIT_KEYS;
        /* "0": never attend in tiles; "force": whenever the tile kernel can (tests) */
        b->att_tiles = (att_tiles_mode)env_mode("IB_CUDA_ATT_TILE");
        /* N (1..TILE_ROWS): rows a tile (measurements) */
        const char *atr = getenv("IB_CUDA_ATT_TILE_ROWS");
        b->tile_rows = atr && atoi(atr) >= 1 && atoi(atr) <= TILE_ROWS ? atoi(atr) : TILE_ROWS;
        /* "0": a decode step's q/k norm, RoPE and KV store stay a kernel of their own; "force": inside
         * the attention wherever they can be (tests; qk_fusable) */
        b->fuse_qk = (fuse_qk_mode)env_mode("IB_CUDA_FUSE_QK");
        /* "0": per-head attention always through its stage; else its keys into registers where they fit */
        b->att_direct = env_mode("IB_CUDA_ATT_DIRECT") ? DIRECT_BY_SHAPE : DIRECT_NEVER;
        /* "0": direct attention always in ATT_THREADS blocks; "force": always in ATT_THREADS_WIDE ones
         * (tests); unset: wide blocks where the grid is small (att_wide_mode) */
        b->att_wide = (att_wide_mode)env_mode("IB_CUDA_ATT_WIDE");
        /* "0": the experts' Q8 products with a warp walking K alone (moe_mm_kernel: comparisons) */
        const char *ms = getenv("IB_CUDA_MOE_SPLIT");
        b->moe_split = !(ms && !strcmp(ms, "0"));
        /* "all" / "0": every product's blocks ask L2 for their weights before the wait / none do
         * (measurements; unset: mm_prefetch_wanted decides) */
        const char *mp = getenv("IB_CUDA_MM_PREFETCH");
        b->mm_prefetch = !mp ? MM_PF_AUTO : !strcmp(mp, "0") ? MM_PF_NONE : !strcmp(mp, "all") ? MM_PF_ALL : MM_PF_AUTO;
        b->mm_stage = (mm_stage_mode)env_mode("IB_CUDA_MM_STAGE");
        const char *rp = getenv("IB_CUDA_REPEAT");
        b->repeat = (rp && strstr(rp, "attn") ? REPEAT_ATTN : 0) | (rp && strstr(rp, "linear") ? REPEAT_LINEAR : 0) |
                    (rp && strstr(rp, "norm") ? REPEAT_NORM : 0) | (rp && strstr(rp, "act") ? REPEAT_ACT : 0) |
                    (rp && strstr(rp, "empty") ? REPEAT_EMPTY : 0);
#ifdef IB_CUDA_ATT_TRACE
        {
            const char *tw = getenv("IB_CUDA_ATT_TWICE");
            const int twice = tw && tw[0] == '1';
            cudaMemcpyToSymbol(att_trace_twice, &twice, sizeof twice);
        }
#endif
    }
    /* Gemma 4: Q / ATT rows at the widest layer's H * hd, K / V at the widest KV shape */
    const int hd_max = gemma && c->global_head_dim > b->hd ? c->global_head_dim : b->hd;
    const int kvw = gemma ? c->kv_heads_max * c->kv_hd_max : b->KVH * b->hd;
    int Kmax = b->D > b->F ? b->D : b->F;
    if (b->H * hd_max > Kmax) Kmax = b->H * hd_max;
    if (gemma && c->moe_ffn > Kmax) Kmax = c->moe_ffn;
    if (gemma && c->ple_dim > Kmax) Kmax = c->ple_dim;
    b->Kmax = Kmax;
    const int D = b->D, Rm = b->R_max, L = b->L, hd = b->hd;
    ib_status rc = IB_OK;
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&b->st) != cudaSuccess) {
        rc = ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: could not start a stream on device 0");
        goto fail;
    }
    {
        /* the tensor-core product's pipeline takes more than the default 48 KB of shared memory */
        cudaDeviceProp p;
        int ok = cudaGetDeviceProperties(&p, 0) == cudaSuccess;
        b->n_sm = ok ? p.multiProcessorCount : 132;
        b->l2_bytes = ok ? (size_t)p.l2CacheSize : (size_t)50 << 20;
        const int s64 = (int)(MMA_NS * sizeof(mma_stage<64>)), s32 = (int)(MMA_NS * sizeof(mma_stage<32>));
        ok = ok && cudaFuncSetAttribute(mm_q8_gemm_kernel<IB_WQ4, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, s64) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(mm_q8_gemm_kernel<IB_WQ8, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, s64) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(mm_q8_gemm_kernel<IB_WQ4, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, s32) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(mm_q8_gemm_kernel<IB_WQ8, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, s32) == cudaSuccess;
        for (int v = 0; v < 16; v++) {   /* every (format, rows, narrow, deep) */
            size_t sm;
            const mm_q8_mma_fn k = mma_pipe_pick(v & 1 ? IB_WQ8 : IB_WQ4, v & 2 ? 2 : 1, (v >> 2) & 1, v >> 3, &sm);
            ok = ok && cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) == cudaSuccess;
        }
        ok = ok && cudaFuncSetAttribute(attention_head_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_head_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_direct_kernel<uint16_t, ATT_THREADS>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_direct_kernel<float, ATT_THREADS>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_direct_kernel<uint16_t, ATT_THREADS_WIDE>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_direct_kernel<float, ATT_THREADS_WIDE>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)tile_smem_bytes(TILE_QV, TILE_HD, ATT_MAX_BLOCK)) == cudaSuccess;
        if (!ok) {
            cudaGetLastError();
            rc = ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: could not give the tensor-core product its shared memory");
            goto fail;
        }
    }
    b->mats = (dmat *)calloc((size_t)L * IB_W_COUNT, sizeof(dmat));
    b->lout = (float **)calloc((size_t)Rm, sizeof(float *));
    b->aout = (int32_t **)calloc((size_t)Rm, sizeof(int32_t *));
    b->gc = (gcache *)calloc(NGRAPH, sizeof(gcache));
    b->lhd = (int *)calloc((size_t)L, sizeof(int));
    b->lkvh = (int *)calloc((size_t)L, sizeof(int));
    if (!b->mats || !b->lout || !b->aout || !b->gc || !b->lhd || !b->lkvh) {
        rc = ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
        goto fail;
    }
    for (int li = 0; li < L; li++) {
        const ib_layer *ly = &m->layers[li];
        const ib_matrix *ws[IB_W_COUNT] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        b->lhd[li] = gemma ? ly->hd : b->hd, b->lkvh[li] = gemma ? ly->kvh : b->KVH;
        for (int i = 0; i < IB_W_COUNT; i++)
            if (ws[i]->rows > 0 && (rc = upload_matrix(b, ws[i], &b->mats[(size_t)li * IB_W_COUNT + i], err))) goto fail;
    }
    if ((rc = upload_matrix(b, &m->embed, &b->embed, err))) goto fail;
    if (m->lm_head == &m->embed) {
        b->lm_head = &b->embed;
    } else {
        if ((rc = upload_matrix(b, m->lm_head, &b->lm_own, err))) goto fail;
        b->lm_head = &b->lm_own;
    }
    {
        /* norms: [L][2][D], final [D], [L][2][hd] */
        const size_t nn = (size_t)L * 2 * D + D + (size_t)L * 2 * hd;
        float *h = (float *)calloc(nn, sizeof(float));
        if (!h) {
            rc = ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
            goto fail;
        }
        b->has_qk_norm = m->layers[0].q_norm != NULL;
        for (int li = 0; li < L; li++) {
            memcpy(h + ((size_t)li * 2 + 0) * D, m->layers[li].attn_norm, (size_t)D * sizeof(float));
            memcpy(h + ((size_t)li * 2 + 1) * D, m->layers[li].mlp_norm, (size_t)D * sizeof(float));
            if (m->layers[li].q_norm && !gemma) {   /* Gemma 4's: gemma_create */
                memcpy(h + (size_t)L * 2 * D + D + ((size_t)li * 2 + 0) * hd, m->layers[li].q_norm, (size_t)hd * 4);
                memcpy(h + (size_t)L * 2 * D + D + ((size_t)li * 2 + 1) * hd, m->layers[li].k_norm, (size_t)hd * 4);
            }
        }
        memcpy(h + (size_t)L * 2 * D, m->final_norm, (size_t)D * sizeof(float));
        b->norms = (float *)dupload(b, h, nn * sizeof(float));
        free(h);
    }
    {
        const int widths[IB_BUF_COUNT] = {D, D, b->H * hd_max, kvw, kvw, b->H * hd_max, D, b->F, b->F, D};
        for (int i = 0; i < IB_BUF_COUNT; i++) b->buf[i] = (float *)dalloc(b, (size_t)Rm * widths[i] * sizeof(float));
    }
    b->xq = (int8_t *)dalloc(b, (size_t)Rm * Kmax);
    b->qd = (float *)dalloc(b, (size_t)Rm * (Kmax / 32 + 1) * sizeof(float));
    b->qad = (float *)dalloc(b, (size_t)Rm * (Kmax / 32 + 1) * sizeof(float));
    b->logits = (float *)dalloc(b, (size_t)LOGIT_CHUNK * b->V * sizeof(float));
    b->d_tok = (int32_t *)dalloc(b, (size_t)Rm * 4);
    b->d_lrow = (int32_t *)dalloc(b, (size_t)Rm * 4);
    b->d_amax = (int32_t *)dalloc(b, (size_t)Rm * 4);
    b->amax_v = (float *)dalloc(b, (size_t)LOGIT_CHUNK * ARGMAX_SLICES * sizeof(float));
    b->amax_i = (int *)dalloc(b, (size_t)LOGIT_CHUNK * ARGMAX_SLICES * sizeof(int));
    b->amax_cnt = (unsigned *)dalloc(b, (size_t)LOGIT_CHUNK * sizeof(unsigned));
    if (b->amax_cnt && cudaMemset(b->amax_cnt, 0, (size_t)LOGIT_CHUNK * sizeof(unsigned)) != cudaSuccess)
        b->amax_cnt = NULL;
    b->d_ri = (rowinfo *)dalloc(b, (size_t)Rm * sizeof(rowinfo));
    b->d_tiles = (att_tile *)dalloc(b, (size_t)Rm * sizeof(att_tile));
    b->d_cs = (float *)dalloc(b, (size_t)Rm * hd * sizeof(float));
    if (!b->norms || !b->buf[IB_BUF_COUNT - 1] || !b->buf[0] || !b->xq || !b->qd || !b->qad || !b->logits ||
        !b->d_tok || !b->d_lrow || !b->d_amax || !b->amax_v || !b->amax_i || !b->amax_cnt || !b->d_ri || !b->d_cs || !b->d_tiles) {
        rc = ib_fail(err, IB_ERR_NOMEM, "cuda: out of device memory for %d rows of scratch", Rm);
        goto fail;
    }
    for (int i = 0; i < IB_BUF_COUNT; i++)
        if (!b->buf[i]) {
            rc = ib_fail(err, IB_ERR_NOMEM, "cuda: out of device memory for %d rows of scratch", Rm);
            goto fail;
        }
    if (cudaMallocHost((void **)&b->h_tok, (size_t)Rm * 4) != cudaSuccess ||
        cudaMallocHost((void **)&b->h_lrow, (size_t)Rm * 4) != cudaSuccess ||
        cudaMallocHost((void **)&b->h_amax, (size_t)Rm * 4) != cudaSuccess ||
        cudaMallocHost((void **)&b->h_pos, (size_t)Rm * 4) != cudaSuccess ||
        cudaMallocHost((void **)&b->h_ri, (size_t)Rm * sizeof(rowinfo)) != cudaSuccess ||
        cudaMallocHost((void **)&b->h_tiles, (size_t)Rm * sizeof(att_tile)) != cudaSuccess ||
        cudaMallocHost((void **)&b->h_cs, (size_t)Rm * hd * sizeof(float)) != cudaSuccess) {
        rc = ib_fail(err, IB_ERR_NOMEM, "cuda: out of pinned host memory");
        goto fail;
    }
    if (gemma && (rc = gemma_create(b, m, err))) goto fail;
    *out = &b->base;
    return IB_OK;
fail:
    cudaGetLastError();
    cuda_destroy(&b->base);
    return rc;
}

/* ---------------------------------------------------------------- KV caches */

/* A zeroed cache of d's shape in device memory (the layout of ib_kv_desc). */
static ib_status cuda_kv_create(const ib_kv_desc *d, ib_kv **out, ib_error *err) {
    *out = NULL;
    const char *why;
    if (!device_ok(&why)) return ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: %s", why);
    cuda_kv *kv = (cuda_kv *)calloc(1, sizeof *kv);
    if (!kv) return ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
    kv->pub.desc = *d;
    kv->pub.kind = IB_BACKEND_CUDA;
    const size_t n = ib_kv_desc_bytes(d);
    if (cudaMalloc(&kv->dev, n ? n : 16) != cudaSuccess || cudaMemset(kv->dev, 0, n) != cudaSuccess) {
        cudaGetLastError();
        if (kv->dev) cudaFree(kv->dev);
        free(kv);
        return ib_fail(err, IB_ERR_NOMEM, "cuda: KV cache of %zu bytes: out of device memory", n);
    }
    *out = &kv->pub;
    return IB_OK;
}

/* Free a cache from cuda_kv_create (NULL allowed). */
static void cuda_kv_free(ib_kv *k) {
    cuda_kv *kv = (cuda_kv *)k;
    if (!kv) return;
    cudaFree(kv->dev);
    free(kv);
}

/* Slots [0, n_slots) of every (layer, k|v, head) plane, device to device (one strided copy). */
static void cuda_kv_copy(ib_kv *dst, const ib_kv *src, int n_slots) {
    const ib_kv_desc *dd = &dst->desc, *sd = &src->desc;
    int mixed = sd->n_sliding > 0;
    for (int li = 0; li < sd->n_layers && !mixed; li++) mixed = ib_kv_desc_owner(sd, li) != li;
    if (mixed) { /* Gemma 4: layer by layer at each layer's shape (cpu_kv_copy's planes) */
        const size_t eb = ib_kv_dtype_bytes(sd->dtype);
        size_t so = 0, to = 0;   /* bytes of the layers before li in src, dst */
        for (int li = 0; li < sd->n_layers; li++) {
            if (ib_kv_desc_owner(sd, li) != li) continue;   /* KV-shared: holds none */
            const ib_kv_desc sv = ib_kv_desc_layer(sd, li), tv = ib_kv_desc_layer(dd, li);
            int n = n_slots < sv.capacity ? n_slots : sv.capacity;
            if (n > tv.capacity) n = tv.capacity;
            const size_t row = (size_t)sv.head_dim * eb;
            if (n > 0)
                cudaMemcpy2D((char *)((cuda_kv *)dst)->dev + to, (size_t)tv.capacity * row,
                             (const char *)((const cuda_kv *)src)->dev + so, (size_t)sv.capacity * row, (size_t)n * row,
                             (size_t)2 * sv.n_kv_heads, cudaMemcpyDeviceToDevice);
            so += ib_kv_desc_layer_elems(sd, li) * eb, to += ib_kv_desc_layer_elems(dd, li) * eb;
        }
        return;
    }
    const size_t row = (size_t)sd->head_dim * ib_kv_dtype_bytes(sd->dtype);
    cudaMemcpy2D(((cuda_kv *)dst)->dev, (size_t)dd->capacity * row, ((const cuda_kv *)src)->dev,
                 (size_t)sd->capacity * row, (size_t)n_slots * row, (size_t)sd->n_layers * 2 * sd->n_kv_heads,
                 cudaMemcpyDeviceToDevice);
}

/* cuda.h */
/* Reads p [n] reps times (a grid-stride loop of 16-byte loads) and folds the words, so the loads stay. */
__global__ void read_kernel(const uint4 *__restrict__ p, size_t n, int reps, unsigned *sink) {
    unsigned x = 0;
    for (int r = 0; r < reps; r++)
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
            const uint4 v = p[i];
            x ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    if (x == 0x9e3779b9u) *sink = x;
}

extern "C" double ib_cuda_read_bandwidth(void) {
    static uint4 *buf;
    static unsigned *sink;
    const size_t bytes = (size_t)1 << 30;
    const int reps = 4;
    const char *why;
    if (!device_ok(&why)) return 0;
    if (!buf) {
        if (cudaMalloc((void **)&buf, bytes) != cudaSuccess || cudaMalloc((void **)&sink, sizeof(unsigned)) != cudaSuccess ||
            cudaMemset(buf, 1, bytes) != cudaSuccess) {
            cudaGetLastError();
            if (buf) cudaFree(buf);
            buf = NULL;
            return 0;
        }
    }
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaEvent_t a, b;
    if (cudaEventCreate(&a) != cudaSuccess) return 0;
    if (cudaEventCreate(&b) != cudaSuccess) {
        cudaEventDestroy(a);
        return 0;
    }
    float ms = 0;
    cudaEventRecord(a, 0);
    read_kernel<<<sms * 8, 512>>>(buf, bytes / sizeof(uint4), reps, sink);
    cudaEventRecord(b, 0);
    const int ok = cudaEventSynchronize(b) == cudaSuccess && cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms > 0;
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGetLastError();
    return ok ? (double)bytes * reps / (ms * 1e-3) : 0;
}

extern "C" void ib_cuda_profile(int on) {
    if (on) cudaProfilerStart();
    else cudaProfilerStop();
}

/* cuda.h */
extern "C" int ib_cuda_kv_read(const void *kv, void *dst, size_t bytes) {
    const cuda_kv *k = (const cuda_kv *)kv;
    return cudaMemcpy(dst, k->dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

/* ---------------------------------------------------------------- the step */

/* Make room for n logits rows in the pinned host buffer; a new buffer invalidates the cached graphs
 * (they copy into the old one). */
static int ensure_host_logits(cuda_backend *b, int n) {
    if (n <= b->h_logits_rows) return 0;
    int rows = b->h_logits_rows ? b->h_logits_rows : 16;
    while (rows < n) rows *= 2;
    if (rows > b->R_max) rows = b->R_max;
    float *p = NULL;
    if (cudaMallocHost((void **)&p, (size_t)rows * b->V * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    drop_graphs(b);
    cudaFreeHost(b->h_logits);
    b->h_logits = p, b->h_logits_rows = rows;
    return 0;
}

/* Append one op to the step's record. */
static void push(cuda_backend *b, int op, int a0 = 0, int a1 = 0, int a2 = 0, int a3 = 0, int a4 = 0, int a5 = 0,
                 int a6 = 0, int a7 = 0, int a8 = 0, int a9 = 0) {
    if (b->nrec == b->caprec) {
        int cap = b->caprec ? 2 * b->caprec : 512;
        oprec *r = (oprec *)realloc(b->rec, (size_t)cap * sizeof(oprec));
        if (!r) {
            note(b, cudaErrorMemoryAllocation, "recording the step");
            return;
        }
        b->rec = r, b->caprec = cap;
    }
    oprec *r = &b->rec[b->nrec++];
    memset(r, 0, sizeof *r);
    r->op = op;
    const int a[REC_ARGS] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9};
    memcpy(r->a, a, sizeof a);
}

/* Whether the step's attention runs in tiles of one session's consecutive rows (attention_tile_kernel),
 * and its tiles into b->h_tiles / b->n_tiles (0: not). Where the kernel can — not Gemma 4, every session
 * a full cache, head dim 16, 32, 64 or 128, G * TILE_ROWS <= TILE_QV query vectors a block — and the
 * step's shape asks for it: four or more rows a tile on average (prompts' chunks; decode rows are one a
 * session) and at least two blocks a multiprocessor (tiles x KV heads). Measured on an H200 (one
 * qwen3-0.6b prompt a step, f16 KV, tiles against a block per (row, KV head)): 128 rows 22,167 against
 * 25,135 tok/s (128 blocks), 256 28,539 / 28,418, 512 26,841 / 22,813, 1,024 19,284 / 14,406, 2,048
 * 12,325 / 8,296. IB_CUDA_ATT_TILE=force: whenever the kernel can, 0: never. Only the grid depends on
 * it, never an operation. */
static void plan_tiles(cuda_backend *b, const ib_step_desc *d) {
    b->n_tiles = 0;
    const int G = b->H / b->KVH;
    if (b->att_tiles == TILES_NEVER || b->gm || G * TILE_ROWS > TILE_QV || (b->hd != 16 && b->hd != 32 && b->hd != 64 && b->hd != 128))
        return;
    int n = 0;
    for (int r = 0; r < d->R;) {
        if (b->h_ri[r].window > 0) return;
        int e = r + 1;
        while (e < d->R && d->row_item[e] == d->row_item[r] && e - r < b->tile_rows) e++;
        b->h_tiles[n].r0 = r, b->h_tiles[n].n = e - r;
        n++, r = e;
    }
    if (b->att_tiles == TILES_FORCED || (d->R >= 4 * n && (long)n * b->KVH >= 2L * b->n_sm)) b->n_tiles = n;
}

/* Copy the step's rows into pinned staging (tokens, per-row cache info, RoPE table computed here with
 * ib_rope_table, logits rows) and record their upload as the step's first op. */
static ib_status cuda_step_begin(ib_backend *base, const ib_step_desc *d, ib_error *err) {
    cuda_backend *b = (cuda_backend *)base;
    if (d->R < 1 || d->R > b->R_max || d->n_logits > d->R || d->attn_block < 1 || d->attn_block > ATT_MAX_BLOCK)
        return ib_fail(err, IB_ERR_INVALID_ARG, "cuda: step of %d rows (at most %d), %d logits rows, key block %d",
                       d->R, b->R_max, d->n_logits, d->attn_block);
    /* the previous step's staging may still be read by its copies */
    cudaStreamSynchronize(b->st);
    b->err = cudaSuccess;
    b->err_where = NULL;
    b->nrec = 0;
    if (ensure_host_logits(b, d->n_logits))
        return ib_fail(err, IB_ERR_NOMEM, "cuda: pinned host memory for %d logits rows", d->n_logits);
    b->R = d->R, b->n_items = d->n_items, b->n_logits = d->n_logits, b->attn_block = d->attn_block;
    b->fault = ib_fault_get();
    /* the test-only gpu-att-block fault: every attention kernel cuts key blocks at half the size */
    if (b->fault == IB_FAULT_GPU_ATT_BLOCK && b->attn_block > 1) b->attn_block /= 2;
    b->long_keys = 0;
    int f16_rows = 0;
    for (int r = 0; r < d->R; r++) {
        const cuda_kv *kv = (const cuda_kv *)d->kv[d->row_item[r]];
        if (kv->pub.kind != IB_BACKEND_CUDA)
            return ib_fail(err, IB_ERR_INVALID_ARG, "cuda: row %d: its session's KV cache is not on the GPU", r);
        rowinfo *ri = &b->h_ri[r];
        ri->kv = kv->dev;
        ri->cap = kv->pub.desc.capacity, ri->sink = kv->pub.desc.sink, ri->window = kv->pub.desc.window;
        ri->f16 = kv->pub.desc.dtype == IB_KV_F16;
        f16_rows += ri->f16;
        ri->pos = d->pos[r];
        {
            const int keys = d->pos[r] + 1, kept = ri->window > 0 ? ri->sink + ri->window : keys;
            b->long_keys |= (keys < kept ? keys : kept) >= b->att_split_keys;
        }
        ri->scap = kv->pub.desc.sliding_capacity, ri->swin = kv->pub.desc.sliding_window;
        b->h_tok[r] = d->tok[r];
        b->h_pos[r] = d->rope_pos[r];
    }
    b->kv_rows = f16_rows == d->R ? KV_ROWS_F16 : f16_rows == 0 ? KV_ROWS_F32 : KV_ROWS_MIXED;
    b->want_logits = b->want_argmax = 0;
    for (int j = 0; j < d->n_logits; j++) {
        b->h_lrow[j] = d->logit_row[j], b->lout[j] = d->logits_out[j];
        b->aout[j] = d->argmax_out ? d->argmax_out[j] : NULL;
        b->want_logits |= b->lout[j] != NULL, b->want_argmax |= b->aout[j] != NULL;
    }
    plan_tiles(b, d);
    ib_rope_table(b->h_pos, d->R, b->hd, b->theta, b->h_cs);
    if (b->gm) gemma_step_begin(b);
    push(b, OP_UPLOAD);
    return IB_OK;
}

/* Blocks of `threads` covering n items. */
static unsigned blocks_for(size_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/* The step's rows from the pinned staging to the device. */
static void launch_upload(cuda_backend *b) {
    note(b, cudaMemcpyAsync(b->d_tok, b->h_tok, (size_t)b->R * 4, cudaMemcpyHostToDevice, b->st), "upload");
    note(b, cudaMemcpyAsync(b->d_ri, b->h_ri, (size_t)b->R * sizeof(rowinfo), cudaMemcpyHostToDevice, b->st), "upload");
    if (b->n_tiles > 0)
        note(b, cudaMemcpyAsync(b->d_tiles, b->h_tiles, (size_t)b->n_tiles * sizeof(att_tile), cudaMemcpyHostToDevice, b->st),
             "upload");
    note(b, cudaMemcpyAsync(b->d_cs, b->h_cs, (size_t)b->R * b->hd * sizeof(float), cudaMemcpyHostToDevice, b->st),
         "upload");
    if (b->n_logits > 0)
        note(b, cudaMemcpyAsync(b->d_lrow, b->h_lrow, (size_t)b->n_logits * 4, cudaMemcpyHostToDevice, b->st), "upload");
    if (b->gm) gemma_upload(b);
}

/* X = embedding rows of the step's tokens. */
static void launch_embed(cuda_backend *b) {
    const size_t n = (size_t)b->R * b->D;
    launch(b, embed_kernel, blocks_for(n, 256), 256, 0, b->embed, b->d_tok, b->R, b->buf[IB_BUF_X]);
    LAUNCHED(b, "embed");
    if (b->gm) gemma_after_embed(b);
}

/* Threads of an rmsnorm_kernel block for nvec vectors of n floats: few long vectors (a small step's row
 * norms, one block each on an otherwise idle GPU) take 1024, so that staging the vector and quantizing its
 * groups take fewer rounds; the sum's 16 lanes are the same whatever the block's size. */
static int norm_threads(const cuda_backend *b, int nvec, int n) {
    if (n >= 1024 && nvec * 4 <= b->n_sm) return 1024;
    return n >= 512 ? 256 : 128;
}

/* nvec vectors of n floats normed with weights w (device), in -> out. rows: a row norm (the row-order
 * fault applies), not a head norm. */
static void launch_rmsnorm(cuda_backend *b, float *in, const float *w, int nvec, int n, float *out, int rows) {
    const int reverse_odd = rows && b->fault == IB_FAULT_ROW_ORDER;
    launch(b, rmsnorm_kernel, nvec, norm_threads(b, nvec, n), (size_t)n * sizeof(float), in, NULL, w, nvec, n, b->eps, out,
                                                                                     reverse_odd, NULL, NULL, NULL, 0);
    LAUNCHED(b, "rmsnorm");
}

/* A row norm of R rows (in -> out) with its fused neighbours: add_y (x += add_y first) and, when G > 0,
 * the quantization of the normed rows for group G. */
static void launch_rmsnorm_fused(cuda_backend *b, int in, const float *add_y, const float *w, int out, int G) {
    const int n = b->D, reverse_odd = b->fault == IB_FAULT_ROW_ORDER;
    launch(b, rmsnorm_kernel, b->R, norm_threads(b, b->R, n), (size_t)n * sizeof(float),
        b->buf[in], add_y, w, b->R, n, b->eps, b->buf[out], reverse_odd, b->xq, b->qd, b->qad, G);
    LAUNCHED(b, "rmsnorm");
}

/* Device weights of norm n (ib_nsel) of layer li. */
static const float *norm_weights(cuda_backend *b, int n, int li) {
    if (b->gm && n >= IB_N_POST_ATTN) return gemma_norm(b, n, li);
    if (n == IB_N_FINAL) return b->norms + (size_t)b->L * 2 * b->D;
    return b->norms + ((size_t)li * 2 + (n == IB_N_MLP)) * b->D;
}

/* Ys[i] [R][N_i] = X [R][K] · W_i^T for n (1..3) device matrices of one format read as one grid, with X
 * already quantized into b->xq/qd/qad when q8. The Q8 dp4a kernel's rows per block grow with the work
 * (about 4 blocks per multiprocessor); many rows take the tensor-core kernel. Neither choice changes
 * any output's arithmetic. */
typedef void (*mm_q8_fn)(mset, const int8_t *, const float *, const float *, int, int, int, int);

/* mm_q8_kernel for format fmt (IB_WQ4, IB_WQ8), rbt rows per pass (1, 2, 4, RB) and 8-output blocks
 * (narrow) or 32-output ones. */
template <int FMT>
static mm_q8_fn mm_q8_pick_fmt(int rbt, int narrow) {
    if (narrow)
        return rbt == 1 ? mm_q8_kernel<FMT, 1, 8> : rbt == 2 ? mm_q8_kernel<FMT, 2, 8>
                        : rbt == 4 ? mm_q8_kernel<FMT, 4, 8> : mm_q8_kernel<FMT, RB, 8>;
    return rbt == 1 ? mm_q8_kernel<FMT, 1, NT> : rbt == 2 ? mm_q8_kernel<FMT, 2, NT>
                    : rbt == 4 ? mm_q8_kernel<FMT, 4, NT> : mm_q8_kernel<FMT, RB, NT>;
}
static mm_q8_fn mm_q8_pick(int fmt, int rbt, int narrow) {
    return fmt == IB_WQ4 ? mm_q8_pick_fmt<IB_WQ4>(rbt, narrow) : mm_q8_pick_fmt<IB_WQ8>(rbt, narrow);
}


/* mm_q8_kernel for one row a block with its codes staged (XS), 8- or 32-output blocks, and half of
 * MM_MAXC's code words a group where every group has at most that many (short). */
template <int FMT>
static mm_q8_fn mm_q8_pick_staged_fmt(int narrow, int short_groups) {
    constexpr int H = MM_MAXC(FMT) / 2, F = MM_MAXC(FMT);
    if (narrow) return short_groups ? mm_q8_kernel<FMT, 1, 8, H, true> : mm_q8_kernel<FMT, 1, 8, F, true>;
    return short_groups ? mm_q8_kernel<FMT, 1, NT, H, true> : mm_q8_kernel<FMT, 1, NT, F, true>;
}
static mm_q8_fn mm_q8_pick_staged(int fmt, int narrow, int short_groups) {
    return fmt == IB_WQ4 ? mm_q8_pick_staged_fmt<IB_WQ4>(narrow, short_groups)
                         : mm_q8_pick_staged_fmt<IB_WQ8>(narrow, short_groups);
}

/* Bytes of the weights of mset ms's matrices (dmat_bytes). */
static size_t mset_weight_bytes(const mset *ms) {
    size_t n = 0;
    for (int i = 0; i < ms->n; i++) n += dmat_bytes(&ms->m[i]);
    return n;
}

/* mset.prefetch for a product of R rows: whether its blocks ask L2 for their weight tiles before their
 * wait, by b->mm_prefetch. By default they do, except in steps of fewer
 * than 8 rows whose grid reads more than an eighth of the L2: measured on the H200 (docs/cuda.md),
 * qwen3-8b's products at B=1 (10-65 MB each) ran 5% faster without, qwen3-0.6b's (1-4 MB) and every
 * product at B=8 and more slower. */
static int mm_prefetch_wanted(const cuda_backend *b, const mset *ms, int R) {
    switch (b->mm_prefetch) {
    case MM_PF_ALL: return 1;
    case MM_PF_NONE: return 0;
    default: return R >= 8 || mset_weight_bytes(ms) * 8 <= b->l2_bytes;
    }
}

static void launch_products(cuda_backend *b, int n, const dmat *const *m, const float *X, int R, int q8,
                            float *const *Y) {
    const int fused = b->fault == IB_FAULT_GPU_FMA;
    mset ms;
    memset(&ms, 0, sizeof ms);
    ms.n = n;
    int tiles = 0;
    for (int i = 0; i < n; i++) {
        ms.m[i] = *m[i], ms.Y[i] = Y[i], ms.t0[i] = tiles;
        tiles += m[i]->Np / NT;
    }
    ms.t0[n] = tiles;
    ms.prefetch = mm_prefetch_wanted(b, &ms, R);
    const int fmt = m[0]->fmt;
    /* the test-only gpu-split-k fault: Q8 products split K into up to 8 group ranges added with atomics */
    int splits = 1;
    if (q8 && fmt != IB_WF32 && b->fault == IB_FAULT_GPU_SPLIT_K) {
        splits = m[0]->ng < 8 ? m[0]->ng : 8;
        for (int i = 0; i < n; i++)
            note(b, cudaMemsetAsync(Y[i], 0, (size_t)R * m[i]->N * sizeof(float), b->st), "split-k zero");
    }
    int g32 = 1;   /* the tensor-core kernels walk groups in steps of 32 k, whole groups a stage */
    for (int i = 0; i < n; i++) g32 &= m[i]->G > 0 && m[i]->G % 32 == 0 && MMA_KS % m[i]->G == 0;
    if (q8 && fmt != IB_WF32 && R >= b->mma_rows && g32) {
        /* the same matrices in 64-output tiles, for the tiled kernel */
        mset m64 = ms;
        int t64 = 0;
        for (int i = 0; i < n; i++) m64.t0[i] = t64, t64 += (m[i]->Np + MMA_BN - 1) / MMA_BN;
        m64.t0[n] = t64;
        /* the tiled kernel walks K in one block per tile, so it needs many tiles to fill the GPU, and
         * rows to fill its blocks: 64-row blocks for at least 64 rows when they give two blocks per
         * multiprocessor, 32-row blocks for at least 32 rows when those give 1.5; otherwise the
         * kernel whose warps split the groups of 16-row tiles */
        const long b64 = (long)blocks_for((size_t)R, 64) * t64, b32 = (long)blocks_for((size_t)R, 32) * t64;
        const int bm = b->mma_bm                              ? b->mma_bm
                       : R >= 64 && b64 >= 2L * b->n_sm       ? 64
                       : R >= 32 && 2 * b32 >= 3L * b->n_sm   ? 32
                                                              : 0;
        if (bm) {
            dim3 grid(blocks_for((size_t)R, bm), (unsigned)t64, (unsigned)splits);
            const size_t sm = MMA_NS * (bm == 64 ? sizeof(mma_stage<64>) : sizeof(mma_stage<32>));
            void (*k)(mset, const int8_t *, const float *, const float *, int, int, int) =
                bm == 64 ? (fmt == IB_WQ4 ? mm_q8_gemm_kernel<IB_WQ4, 64> : mm_q8_gemm_kernel<IB_WQ8, 64>)
                         : (fmt == IB_WQ4 ? mm_q8_gemm_kernel<IB_WQ4, 32> : mm_q8_gemm_kernel<IB_WQ8, 32>);
            launch(b, k, grid, 256, sm, m64, b->xq, b->qd, b->qad, R, fused, splits);
        } else {
            const int pipe = b->mma_kernel == MMA_PIPE || (b->mma_kernel == MMA_BY_ROWS && R <= MMA_PIPE_MAX_ROWS);
            if (pipe) {
                /* blocks of 8 rows where the step has at most 8, else of 16; 16 outputs a block where
                 * 32 would give fewer blocks than multiprocessors — for 8-row blocks, fewer than half
                 * (b->mma_narrow; measured, docs/cuda.md) —, else 32, with the deeper pipeline where that
                 * gives at most two blocks a multiprocessor */
                const int nr = R <= 8 ? 1 : 2;
                const long b32 = (long)tiles * blocks_for((size_t)R, 8 * nr);
                const int small = nr == 2 ? b32 < b->n_sm : 2 * b32 < b->n_sm;
                const int narrow = b->mma_narrow == NARROW_FORCED || (b->mma_narrow == NARROW_BY_GRID && small);
                const int deep = b32 <= 2L * b->n_sm;
                dim3 grid((unsigned)tiles * (narrow ? 2 : 1), blocks_for((size_t)R, 8 * nr), (unsigned)splits);
                size_t sm;
                const mm_q8_mma_fn k = mma_pipe_pick(fmt, nr, narrow, deep, &sm);
                launch(b, k, grid, 256, sm, ms, b->xq, b->qd, b->qad, R, fused, splits);
            } else {
                dim3 grid((unsigned)tiles, blocks_for((size_t)R, 16), (unsigned)splits);
                launch(b, fmt == IB_WQ4 ? mm_q8_mma16_kernel<IB_WQ4> : mm_q8_mma16_kernel<IB_WQ8>, grid, 256, 0, ms, b->xq,
                       b->qd, b->qad, R, fused, splits);
            }
        }
    } else if (q8 && fmt != IB_WF32) {
        /* rows per pass: the fewest of 1, 2, 4, 8 that hold R (fewer rows, more groups per pass) */
        const int rbt = R <= 1 ? 1 : R <= 2 ? 2 : R <= 4 ? 4 : RB;
        long passes = ((long)(R + rbt - 1) / rbt) * (long)tiles / 528;
        passes = passes < 1 ? 1 : passes > MAX_PASSES ? MAX_PASSES : passes;
        const int rpb = (int)passes * rbt;
        /* a grid of fewer blocks than multiprocessors takes 8-output blocks (4x the blocks, each walking a
         * quarter of the groups per warp) */
        const int narrow = (long)tiles * blocks_for((size_t)R, rpb) < b->n_sm;
        dim3 grid((unsigned)tiles * (narrow ? NT / 8 : 1), blocks_for((size_t)R, rpb), (unsigned)splits);
        /* a one-row step's codes staged in shared memory: b->mm_stage */
        int short_groups = 1;   /* every matrix's groups fit half of MM_MAXC's code words */
        for (int i = 0; i < n; i++) short_groups &= m[i]->G / MM_KC(fmt) <= MM_MAXC(fmt) / 2;
        const int can_stage = R == 1 && rpb == 1 && m[0]->K <= MM_XS_MAX_K;
        const int staged = can_stage && (b->mm_stage == STAGE_FORCED || (b->mm_stage == STAGE_BY_SHAPE && !ms.prefetch));
        mm_q8_fn k = staged ? mm_q8_pick_staged(fmt, narrow, short_groups) : mm_q8_pick(fmt, rbt, narrow);
        const size_t xsm = staged ? (size_t)m[0]->K : 0;
        launch(b, k, grid, 256, xsm, ms, b->xq, b->qd, b->qad, R, rpb, fused, splits);
    } else {
        dim3 grid((unsigned)tiles, blocks_for((size_t)R, NWARP));
        if (fmt == IB_WQ4) launch(b, mm_f32_kernel<IB_WQ4>, grid, 256, 0, ms, X, R, fused);
        else if (fmt == IB_WQ8) launch(b, mm_f32_kernel<IB_WQ8>, grid, 256, 0, ms, X, R, fused);
        else launch(b, mm_f32_kernel<IB_WF32>, grid, 256, 0, ms, X, R, fused);
    }
    LAUNCHED(b, "linear");
}

/* One product (launch_products of one matrix). */
static void launch_product(cuda_backend *b, const dmat *m, const float *X, int R, int q8, float *Y) {
    launch_products(b, 1, &m, X, R, q8, &Y);
}

/* Quantize X [R][K] for group G into b's Q8 buffers. */
static void launch_quantize(cuda_backend *b, const float *X, int R, int K, int G) {
    const size_t warps = (size_t)R * (K / G);
    launch(b, quantize_kernel, blocks_for(warps * 32, 256), 256, 0, X, R, K, G, b->xq, b->qd, b->qad);
    LAUNCHED(b, "quantize");
}

/* outs[i] = in · W_i^T for the n matrices ws[i] of layer li; Q8 quantizes `in` once, with the group of
 * the first quantized matrix (as step.c's linear_many). */
static void launch_linear(cuda_backend *b, int li, int n, const int *ws, int in, const int *outs) {
    const dmat *ms[IB_W_COUNT];
    int q8 = 0;
    for (int i = 0; i < n; i++) ms[i] = &b->mats[(size_t)li * IB_W_COUNT + ws[i]];
    if (b->act == IB_ACT_Q8)
        for (int i = 0; i < n; i++)
            if (ms[i]->fmt != IB_WF32) {
                if (b->q_ready_buf != in || b->q_ready_G != ms[i]->G)
                    launch_quantize(b, b->buf[in], b->R, ms[i]->K, ms[i]->G);
                q8 = 1;
                break;
            }
    /* consecutive matrices of one format (and one path) share a grid */
    for (int i0 = 0; i0 < n;) {
        int i1 = i0 + 1;
        while (i1 < n && ms[i1]->fmt == ms[i0]->fmt) i1++;
        float *ys[3];
        for (int i = i0; i < i1; i++) ys[i - i0] = b->buf[outs[i]];
        for (int t = 0; t < launches(b, REPEAT_LINEAR); t++) launch_products(b, i1 - i0, ms + i0, b->buf[in], b->R, q8, ys);
        if (b->repeat & REPEAT_EMPTY) launch(b, empty_kernel, 1, 32, 0);
        i0 = i1;
    }
}

/* Layer li's q/k head norms (IB_QK_NORM, when the model has them) and/or RoPE + KV store. The norms
 * alone (a captured run's first phase) run as the row-norm kernel over head vectors; RoPE + store, with
 * or without the norms before it, as one qk_kernel. */
/* The query head norm's weights [hd] of layer li (the key's follow them) when phases asks for the norm and
 * the model has one; else NULL. */
static const float *qk_norm_weights(const cuda_backend *b, int li, int phases) {
    return (phases & IB_QK_NORM) && b->has_qk_norm ? b->norms + (size_t)b->L * 2 * b->D + b->D + (size_t)li * 2 * b->hd
                                                   : NULL;
}

/* Rows the RoPE rotates this step: all, or only the first under the test-only rope-skip-rows fault (as
 * ib_rope_step_rows applies it: decode steps of several sessions). */
static int rope_rows(const cuda_backend *b) {
    return b->fault == IB_FAULT_ROPE_SKIP_ROWS && b->n_items > 1 && b->n_items == b->R ? 1 : b->R;
}

static void launch_qk(cuda_backend *b, int li, int phases) {
    const int R = b->R, H = b->H, KVH = b->KVH, hd = b->hd;
    const float *qn = qk_norm_weights(b, li, phases);
    if (!(phases & IB_QK_ROPE_STORE)) {
        if (qn) {
            launch_rmsnorm(b, b->buf[IB_BUF_Q], qn, R * H, hd, b->buf[IB_BUF_Q], 0);
            launch_rmsnorm(b, b->buf[IB_BUF_K], qn + hd, R * KVH, hd, b->buf[IB_BUF_K], 0);
        }
        return;
    }
    const dim3 grid(blocks_for((size_t)(H + KVH), QK_WARPS), (unsigned)R);
    launch(b, qk_kernel, grid, 32 * QK_WARPS, (size_t)QK_WARPS * hd * sizeof(float), 
        b->buf[IB_BUF_Q], b->buf[IB_BUF_K], b->buf[IB_BUF_V], b->d_cs, b->d_ri, qn, qn ? qn + hd : NULL, H, KVH, hd, li,
        b->eps, rope_rows(b));
    LAUNCHED(b, "qk");
}

/* Whether the q/k preparation of layer li (phases) is done by the attention right after it, and its
 * description into *fz. It can be for Qwen/Llama layers (not Gemma 4) when the rotation and store are
 * asked for, every row is its session's only row in the step (decode: no block needs a key another
 * block makes) and there are no tiles; by shape it is where it paid on an H200 (qwen3-0.6b, f16 KV,
 * IB_CUDA_FUSE_QK=0 against fused, two rounds, tok/s): the per-head kernel (B=1 842 / 836 against
 * 872 / 871, B=8 4,013 / 4,022 against 4,095 / 4,065), and the per-KV-head kernel with more than two
 * blocks a multiprocessor (B=48 12,767 / 12,889 against 12,943 / 13,066, B=64 +1%, B=128 flat) — not
 * with fewer, where each block's prologue is exposed (B=16 6,690 / 6,704 against 5,937 / 5,914, B=24
 * -8%, B=32 -2%). b->fuse_qk: never, by shape, or wherever it can. The same operations either way. */
static int qk_fusable(const cuda_backend *b, int li, int phases, qk_fuse *fz) {
    if (b->fuse_qk == FUSE_QK_NEVER || b->gm || !(phases & IB_QK_ROPE_STORE) || b->n_items != b->R || b->n_tiles > 0)
        return 0;
    if (b->fuse_qk == FUSE_QK_BY_SHAPE && b->R >= b->att_group_rows && (long)b->R * b->KVH <= 2L * b->n_sm) return 0;
    const float *qn = qk_norm_weights(b, li, phases);
    *fz = qk_fuse{b->buf[IB_BUF_K], b->buf[IB_BUF_V], b->d_cs, qn, qn ? qn + b->hd : NULL, b->eps, rope_rows(b)};
    return 1;
}

/* Bytes a per-head attention block stages its chunks' keys and values in, for a grid of `blocks`: the
 * blocks that share a multiprocessor in one wave split ATT_SM_BYTES (less their static shared memory),
 * at most b->att_stage (ATT_STAGE_MAX unless IB_CUDA_ATT_STAGE says less), in KiB; 0 stages nothing (the
 * same arithmetic either way). */
static int att_stage_bytes(const cuda_backend *b, int blocks) {
    if (!b->att_stage) return 0;
    const int per_sm = (blocks + b->n_sm - 1) / b->n_sm;
    long st = (long)ATT_SM_BYTES / per_sm - (long)sizeof(att_smem1) - 1024;
    if (st > b->att_stage) st = b->att_stage;
    return st > 0 ? (int)(st & ~1023L) : 0;
}

/* Blocks per (row, query head) of the per-head attention over `heads` (row, head) pairs of head dim hd:
 * att_cl (4 unless IB_CUDA_ATT_SPLIT says otherwise) where some row of the step attends at least
 * att_split_keys keys, the grid stays within half the multiprocessors and each block's value columns
 * are whole 16-byte pieces (hd a multiple of 8 * cl); else 1; 1 without a stage. Measured on an H200
 * (qwen3-0.6b, f16 KV, B=1, the two instantiations against one block a head, alternating): 129 keys
 * 828 against 855 tok/s, 1,000 keys 445 against 349; clusters of 8, clusters of 2 (qwen3-8b's 32
 * heads at B=1: 1,302 against 1,337), and grids of two blocks a multiprocessor were slower than one
 * block a head. Only the grid depends on it, never an operation. */
static int att_cluster(const cuda_backend *b, int heads, int hd) {
    const int cl = b->att_stage && b->long_keys ? b->att_cl : 1;
    return (long)heads * cl <= b->n_sm / 2 && hd % (8 * cl) == 0 ? cl : 1;
}

/* ATT = attention of every row and query head at layer li: a block per (row, KV head) from
 * att_group_rows rows, a block per (row, query head) below (same arithmetic, more blocks when few).
 * qG > 0 (dividing hd): ATT's rows are also quantized for group qG. */
static void launch_attention(cuda_backend *b, int li, int qG, const qk_fuse *fz) {
    const qk_fuse nofz = {};
    if (!fz) fz = &nofz;
    if (b->gm) {
        gemma_launch_attention(b, li, qG);
        return;
    }
    float *Q = b->buf[IB_BUF_Q], *ATT = b->buf[IB_BUF_ATT];
    if (b->n_tiles > 0)
        launch(b, attention_tile_kernel, b->n_tiles * b->KVH, ATT_THREADS,
               tile_smem_bytes(TILE_ROWS * (b->H / b->KVH), b->hd, b->attn_block), Q, ATT, b->d_ri,
               (const att_tile *)b->d_tiles, b->H, b->KVH, b->hd, li, b->scale, b->attn_block, qG, b->xq, b->qd, b->qad);
    else if (b->R >= b->att_group_rows)
        launch(b, attention_kernel, b->R * b->KVH, ATT_THREADS, 0, Q, ATT, b->d_ri, b->H, b->KVH, b->hd, li, b->scale,
                                                                     b->attn_block, qG, b->xq, b->qd, b->qad, *fz);
    else {
        const int cl = att_cluster(b, b->R * b->H, b->hd), blocks = b->R * b->H * cl, st = att_stage_bytes(b, blocks);
        if (cl == 1 && b->att_direct == DIRECT_BY_SHAPE && b->kv_rows != KV_ROWS_MIXED) {
            /* wide blocks where the grid fills at most a quarter of the multiprocessors (att_wide_mode) */
            const int wide = b->att_wide == WIDE_FORCED || (b->att_wide == WIDE_SMALL_GRIDS && 4L * blocks <= b->n_sm);
            const int f16 = b->kv_rows == KV_ROWS_F16;
            void (*k)(const float *, float *, const rowinfo *, int, int, int, int, float, int, int, int8_t *, float *,
                      float *, int, qk_fuse) = wide ? (f16 ? attention_direct_kernel<uint16_t, ATT_THREADS_WIDE>
                                                           : attention_direct_kernel<float, ATT_THREADS_WIDE>)
                                                    : (f16 ? attention_direct_kernel<uint16_t, ATT_THREADS>
                                                           : attention_direct_kernel<float, ATT_THREADS>);
            launch(b, k, blocks, wide ? ATT_THREADS_WIDE : ATT_THREADS, (size_t)st, Q, ATT, b->d_ri, b->H, b->KVH, b->hd,
                   li, b->scale, b->attn_block, qG, b->xq, b->qd, b->qad, st, *fz);
        } else
            launch_cl(b, cl, cl > 1 ? attention_head_kernel<true> : attention_head_kernel<false>, blocks, ATT_THREADS, (size_t)st, Q, ATT, b->d_ri, b->H, b->KVH, b->hd, li,
                      b->scale, b->attn_block, qG, b->xq, b->qd, b->qad, st, cl, *fz);
    }
    LAUNCHED(b, "attention");
}

/* G = swiglu(G, U); qG > 0: its rows also quantized for group qG (swiglu_q8_kernel). */
static void launch_swiglu(cuda_backend *b, int qG) {
    if (qG > 0) {
        const size_t warps = (size_t)b->R * (b->F / qG);
        launch(b, swiglu_q8_kernel, blocks_for(warps * 32, 256), 256, 0, b->buf[IB_BUF_G], b->buf[IB_BUF_U], b->R, b->F,
                                                                         qG, b->xq, b->qd, b->qad);
    } else {
        const size_t n = (size_t)b->R * b->F;
        launch(b, swiglu_kernel, blocks_for(n, 256), 256, 0, b->buf[IB_BUF_G], b->buf[IB_BUF_U], n);
    }
    LAUNCHED(b, "swiglu");
}

/* XN[j] = final norm of X[logit_row[j]] for the wanted rows, lm_head in chunks; copy: the logits into
 * the pinned host buffer; amax: each row's argmax (argmax_kernel) into the pinned h_amax. */
static void launch_logits(cuda_backend *b, int copy, int amax) {
    const int nl = b->n_logits, D = b->D, V = b->V;
    float *xn = b->buf[IB_BUF_XN];
    if (nl < 1) return;
    launch(b, gather_kernel, blocks_for((size_t)nl * D, 256), 256, 0, b->buf[IB_BUF_X], b->d_lrow, nl, D, xn);
    LAUNCHED(b, "logits");
    launch_rmsnorm(b, xn, norm_weights(b, IB_N_FINAL, 0), nl, D, xn, 1);
    const dmat *lm = b->lm_head;
    for (int j0 = 0; j0 < nl; j0 += LOGIT_CHUNK) {
        const int n = nl - j0 < LOGIT_CHUNK ? nl - j0 : LOGIT_CHUNK;
        const float *X = xn + (size_t)j0 * D;
        const int q8 = b->act == IB_ACT_Q8 && lm->fmt != IB_WF32;
        if (q8) launch_quantize(b, X, n, lm->K, lm->G);
        launch_product(b, lm, X, n, q8, b->logits);
        if (b->gm) gemma_softcap(b, b->logits, n);
        if (amax) {
            launch(b, argmax_kernel, dim3(ARGMAX_SLICES, (unsigned)n), ARGMAX_THREADS, 0, (const float *)b->logits, V,
                   b->d_amax + j0, b->amax_v, b->amax_i, b->amax_cnt);
            LAUNCHED(b, "argmax");
        }
        if (copy)
            note(b, cudaMemcpyAsync(b->h_logits + (size_t)j0 * V, b->logits, (size_t)n * V * sizeof(float),
                                    cudaMemcpyDeviceToHost, b->st),
                 "logits copy");
    }
    if (amax)
        note(b, cudaMemcpyAsync(b->h_amax, b->d_amax, (size_t)nl * 4, cudaMemcpyDeviceToHost, b->st), "argmax copy");
}

#include "backends/cuda/gemma_kernels.cuh"

/* Enqueue one recorded op (unfused). */
static void exec_rec(cuda_backend *b, const oprec *r) {
    const int *a = r->a;
    switch (r->op) {
    case OP_UPLOAD: launch_upload(b); break;
    case OP_EMBED: launch_embed(b); break;
    case OP_RMSNORM: launch_rmsnorm_fused(b, a[0], NULL, norm_weights(b, a[1], a[2]), a[3], 0); break;
    case OP_LINEAR: launch_linear(b, a[0], a[1], a + 2, a[5], a + 6); break;
    case OP_QK:
        if (b->gm) gemma_launch_qk(b, a[0], a[1]);
        else launch_qk(b, a[0], a[1]);
        break;
    case OP_ATTN: launch_attention(b, a[0], 0, NULL); break;
    case OP_SWIGLU: launch_swiglu(b, 0); break;
    case OP_ADD: {
        const size_t n = (size_t)b->R * b->D;
        launch(b, add_kernel, blocks_for(n, 256), 256, 0, b->buf[a[0]], b->buf[a[1]], n);
        LAUNCHED(b, "add");
        break;
    }
    case OP_LOGITS: launch_logits(b, a[0], a[1]); break;
    case OP_GEGLU: launch_geglu(b, a[0], 0); break;
    case OP_MOE: gemma_launch_moe(b, a[0], a[1], a[2], a[3]); break;
    case OP_SCALE: gemma_scale_layer(b, a[0]); break;
    case OP_PLE_INPUTS: gemma_launch_ple_inputs(b); break;
    case OP_PLE_LAYER: gemma_launch_ple_layer(b, a[0]); break;
    }
}

/* Group size the Q8 linear `next` quantizes its input `buf` (rows of `width` floats) with, when it reads
 * buf under Q8 activations; 0 otherwise. */
static int q8_group_for(const cuda_backend *b, const oprec *next, int buf, int width) {
    if (!next || next->op != OP_LINEAR || b->act != IB_ACT_Q8 || next->a[5] != buf) return 0;
    for (int i = 0; i < next->a[1]; i++) {
        const dmat *m = &b->mats[(size_t)next->a[0] * IB_W_COUNT + next->a[2 + i]];
        if (m->fmt != IB_WF32) return m->K == width ? m->G : 0;
    }
    return 0;
}

/* Enqueue records [0, n) in order, fusing neighbours into one kernel where the same operations allow:
 * a residual add followed by the row norm of its sum; and the Q8 quantization of a linear's input done
 * by the op that writes it (a row norm, SwiGLU, attention), the linear then skipping its own. Every
 * fused kernel performs the separate ops' arithmetic in their order, so fusing changes no bit (and
 * read_rows, which flushes op by op, sees the same values). */
static void exec_records(cuda_backend *b, const oprec *rec, int n) {
    for (int i = 0; i < n; i++) {
        const oprec *r = &rec[i], *nx = i + 1 < n ? &rec[i + 1] : NULL;
        int consumed = 1, ready = -1, G = 0;
        qk_fuse fz;
        if (r->op == OP_ADD && nx && nx->op == OP_RMSNORM && nx->a[0] == r->a[0] && nx->a[3] != r->a[0] &&
            nx->a[3] != r->a[1]) {
            G = q8_group_for(b, i + 2 < n ? &rec[i + 2] : NULL, nx->a[3], b->D);
            for (int t = 0; t < launches(b, REPEAT_NORM); t++)
                launch_rmsnorm_fused(b, r->a[0], b->buf[r->a[1]], norm_weights(b, nx->a[1], nx->a[2]), nx->a[3], G);
            ready = nx->a[3];
            consumed = 2;
        } else if (r->op == OP_RMSNORM && r->a[0] != r->a[3]) {
            G = q8_group_for(b, nx, r->a[3], b->D);
            for (int t = 0; t < launches(b, REPEAT_NORM); t++)
                launch_rmsnorm_fused(b, r->a[0], NULL, norm_weights(b, r->a[1], r->a[2]), r->a[3], G);
            ready = r->a[3];
        } else if (r->op == OP_SWIGLU) {
            G = q8_group_for(b, nx, IB_BUF_G, b->F);
            for (int t = 0; t < launches(b, REPEAT_ACT); t++) launch_swiglu(b, G);
            ready = IB_BUF_G;
        } else if (r->op == OP_GEGLU) {
            G = q8_group_for(b, nx, IB_BUF_G, gemma_ffn(b, r->a[0]));
            launch_geglu(b, r->a[0], G);
            ready = IB_BUF_G;
        } else if (r->op == OP_ATTN || (r->op == OP_QK && nx && nx->op == OP_ATTN && nx->a[0] == r->a[0] &&
                                        qk_fusable(b, r->a[0], r->a[1], &fz))) {
            /* attention, or the q/k preparation and the attention right after it as one kernel */
            const int fused = r->op == OP_QK;
            const oprec *after = fused ? (i + 2 < n ? &rec[i + 2] : NULL) : nx;
            const int lhd = b->lhd[r->a[0]];
            G = q8_group_for(b, after, IB_BUF_ATT, b->H * lhd);
            if (G > 0 && lhd % G) G = 0;
            for (int t = 0; t < launches(b, REPEAT_ATTN); t++) launch_attention(b, r->a[0], G, fused ? &fz : NULL);
            ready = IB_BUF_ATT;
            consumed = fused ? 2 : 1;
        } else {
            exec_rec(b, r);
        }
        /* a fused quantization serves only the linear right after it */
        b->q_ready_buf = G > 0 ? ready : -1, b->q_ready_G = G;
        i += consumed - 1;
    }
}

/* Enqueue the ops recorded so far and forget them. */
static void flush_direct(cuda_backend *b) {
    exec_records(b, b->rec, b->nrec);
    b->nrec = 0;
    b->q_ready_buf = -1;
}

/* Forget one cached step shape and its graph. */
static void drop_entry(gcache *e) {
    if (e->x) cudaGraphExecDestroy(e->x);
    if (e->g) cudaGraphDestroy(e->g);
    free(e->rec);
    memset(e, 0, sizeof *e);
}

/* Forget every cached step graph. */
static void drop_graphs(cuda_backend *b) {
    for (int i = 0; b->gc && i < NGRAPH; i++) drop_entry(&b->gc[i]);
}

/* Enqueue the step's recorded ops: as the cached graph of this exact shape and op sequence when it
 * has one; captured into one when the shape comes the second time; else one by one. A graph runs the
 * same kernels with the same arguments as the direct path (every per-step datum is read from device
 * buffers at fixed addresses), so it changes no bit. */
static void flush_step(cuda_backend *b) {
    if (!b->use_graphs || !b->gc || b->nrec == 0) {
        flush_direct(b);
        return;
    }
    gcache *e = NULL, *free_e = NULL, *old = NULL;
    for (int i = 0; i < NGRAPH; i++) {
        gcache *c = &b->gc[i];
        if (!c->rec) {
            if (!free_e) free_e = c;
            continue;
        }
        if (!old || c->used < old->used) old = c;
        if (c->R == b->R && c->n_items == b->n_items && c->n_logits == b->n_logits && c->attn_block == b->attn_block &&
            c->fault == b->fault && c->long_keys == b->long_keys && c->n_tiles == b->n_tiles && c->kv_rows == b->kv_rows && c->nrec == b->nrec && !memcmp(c->rec, b->rec, (size_t)b->nrec * sizeof(oprec)))
            e = c;
    }
    if (!e) {
        /* first sight: remember the shape, run directly */
        gcache *c = free_e ? free_e : old;
        drop_entry(c);
        c->rec = (oprec *)malloc((size_t)b->nrec * sizeof(oprec));
        if (c->rec) {
            memcpy(c->rec, b->rec, (size_t)b->nrec * sizeof(oprec));
            c->R = b->R, c->n_items = b->n_items, c->n_logits = b->n_logits, c->attn_block = b->attn_block;
            c->fault = b->fault, c->long_keys = b->long_keys, c->n_tiles = b->n_tiles, c->kv_rows = b->kv_rows, c->nrec = b->nrec, c->used = ++b->tick;
        }
        flush_direct(b);
        return;
    }
    e->used = ++b->tick;
    if (!e->x && !e->nograph) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t x = NULL;
        if (cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
            exec_records(b, b->rec, b->nrec);
            b->q_ready_buf = -1;
            if (cudaStreamEndCapture(b->st, &g) == cudaSuccess && g &&
                cudaGraphInstantiate(&x, g, 0) == cudaSuccess) {
                e->g = g, e->x = x;
            } else {
                if (g) cudaGraphDestroy(g);
                e->nograph = 1;
            }
        } else {
            e->nograph = 1;
        }
        if (e->nograph) {
            /* capture failed: what it swallowed never ran; run the step directly */
            cudaGetLastError();
            b->err = cudaSuccess;
            flush_direct(b);
            return;
        }
    }
    if (e->x) {
        note(b, cudaGraphLaunch(e->x, b->st), "graph launch");
        b->nrec = 0;
    } else {
        flush_direct(b);
    }
}

/* The step's ops are recorded here and enqueued by step_end (or by read_rows / write_rows). */
static void cuda_embed(ib_backend *base) { push((cuda_backend *)base, OP_EMBED); }

static void cuda_rmsnorm(ib_backend *base, ib_buf in, ib_nsel n, int li, ib_buf out) {
    push((cuda_backend *)base, OP_RMSNORM, in, n, li, out);
}

static void cuda_linear(ib_backend *base, int li, int n, const ib_wsel *ws, ib_buf in, const ib_buf *outs) {
    int w[3] = {0, 0, 0}, o[3] = {0, 0, 0};
    for (int i = 0; i < n && i < 3; i++) w[i] = ws[i], o[i] = outs[i];
    push((cuda_backend *)base, OP_LINEAR, li, n < 3 ? n : 3, w[0], w[1], w[2], in, o[0], o[1], o[2]);
}

static void cuda_qk_prepare(ib_backend *base, int li, int phases) { push((cuda_backend *)base, OP_QK, li, phases); }

static void cuda_attention(ib_backend *base, int li) { push((cuda_backend *)base, OP_ATTN, li); }

static void cuda_swiglu(ib_backend *base) { push((cuda_backend *)base, OP_SWIGLU); }

static void cuda_geglu(ib_backend *base, int li) { push((cuda_backend *)base, OP_GEGLU, li); }

static void cuda_moe(ib_backend *base, int li, ib_buf route_in, ib_buf in, ib_buf out) {
    push((cuda_backend *)base, OP_MOE, li, route_in, in, out);
}

static void cuda_scale_layer(ib_backend *base, int li) { push((cuda_backend *)base, OP_SCALE, li); }

static void cuda_ple_inputs(ib_backend *base) { push((cuda_backend *)base, OP_PLE_INPUTS); }

static void cuda_ple_layer(ib_backend *base, int li) { push((cuda_backend *)base, OP_PLE_LAYER, li); }

static void cuda_add(ib_backend *base, ib_buf x, ib_buf y) { push((cuda_backend *)base, OP_ADD, x, y); }

static void cuda_logits(ib_backend *base) {
    cuda_backend *b = (cuda_backend *)base;
    push(b, OP_LOGITS, b->want_logits, b->want_argmax);
}

typedef struct copy_job {
    cuda_backend *b;
} copy_job;

/* Pool task: wanted row j's logits from the pinned buffer into its host buffer, and its argmax. */
static void copy_task(void *ctx, int j, int thread) {
    cuda_backend *b = ((copy_job *)ctx)->b;
    if (b->lout[j]) memcpy(b->lout[j], b->h_logits + (size_t)j * b->V, (size_t)b->V * sizeof(float));
    if (b->aout[j]) *b->aout[j] = b->h_amax[j];
}

/* Run the recorded step (flush_step), wait, report the first CUDA failure, copy the logits out. */
static ib_status cuda_step_end(ib_backend *base, ib_error *err) {
    cuda_backend *b = (cuda_backend *)base;
    flush_step(b);
    note(b, cudaStreamSynchronize(b->st), "step_end");
    if (b->err != cudaSuccess)
        return ib_fail(err, IB_ERR_STATE, "cuda: %s: %s", b->err_where ? b->err_where : "step", cudaGetErrorString(b->err));
    copy_job j = {b};
    ib_pool_run(b->n_logits >= 4 && b->want_logits ? b->pool : NULL, b->n_logits, copy_task, &j);
    return IB_OK;
}

/* Host scratch of at least n floats in b (kept across calls); NULL on failure. */
static float *host_rows(cuda_backend *b, size_t n) {
    if (n > b->h_rows_n) {
        float *p = (float *)realloc(b->h_rows, n * sizeof(float));
        if (!p) return NULL;
        b->h_rows = p, b->h_rows_n = n;
    }
    return b->h_rows;
}

/* Run what is recorded, wait, copy R rows of buf into host scratch (valid until the next call). */
static const float *cuda_read_rows(ib_backend *base, ib_buf buf, int R, int width) {
    cuda_backend *b = (cuda_backend *)base;
    float *h = host_rows(b, (size_t)R * width);
    if (!h) return NULL;
    flush_direct(b);
    note(b, cudaStreamSynchronize(b->st), "read_rows");
    note(b, cudaMemcpy(h, b->buf[buf], (size_t)R * width * sizeof(float), cudaMemcpyDeviceToHost), "read_rows");
    return h;
}

/* Run what is recorded, wait, copy R rows from host x into buf. */
static void cuda_write_rows(ib_backend *base, ib_buf buf, int R, int width, const float *x) {
    cuda_backend *b = (cuda_backend *)base;
    flush_direct(b);
    note(b, cudaStreamSynchronize(b->st), "write_rows");
    note(b, cudaMemcpy(b->buf[buf], x, (size_t)R * width * sizeof(float), cudaMemcpyHostToDevice), "write_rows");
}

extern "C" const ib_backend_ops ib_backend_cuda = {
    "cuda",
    IB_BACKEND_CUDA,
    cuda_available,
    cuda_create,
    cuda_destroy,
    cuda_kv_create,
    cuda_kv_free,
    cuda_kv_copy,
    cuda_step_begin,
    cuda_embed,
    cuda_rmsnorm,
    cuda_linear,
    cuda_qk_prepare,
    cuda_attention,
    cuda_swiglu,
    cuda_geglu,
    cuda_moe,
    cuda_scale_layer,
    cuda_add,
    cuda_logits,
    cuda_step_end,
    cuda_read_rows,
    cuda_write_rows,
    cuda_ple_inputs,
    cuda_ple_layer,
    gemma_read_ple_inputs,
};
