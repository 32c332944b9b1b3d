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
 * The product kernels are in product_kernels.cuh, the row and element kernels in
 * elementwise_kernels.cuh, the q/k preparation and attention kernels in attention_kernels.cuh (a
 * prompt's tiles in attention_tile.cuh), included in place, with the small headers they share:
 * device_primitives.cuh (every inline PTX), product_types.cuh (a matrix and a product set),
 * device_layout.h (a matrix's device layout), rowinfo.cuh (a row's cache), row_norm.cuh,
 * quantize_group.cuh (the activation quantization), kv_element.cuh (a cached element as a float),
 * attention_limits.cuh. These compile for the host as well, where tests/test_cuda_*_host.cc run the
 * kernels without a GPU. Gemma 4 (per-layer shapes and cache views, GeGLU, the routed experts,
 * per-layer embeddings, the logit soft-cap) is in gemma_kernels.cuh (kernels) and gemma_backend.cuh
 * (host side), included below the product, norm and attention code it reuses.
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
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda.h"
#include "backends/cuda/device_layout.h"
#include "backends/cuda/attention_limits.cuh"

#define RB 8               /* rows per pass of a Q8 product block (one epilogue warp each) */
#define MAX_PASSES 8       /* most 8-row passes one Q8 product block walks (its weight tile stays in L1) */
#define LOGIT_CHUNK 128    /* lm_head rows per product (bounds the logits scratch) */
/* Q8 products of at least this many rows run on the tensor cores (the pipelined kernel's 8-row blocks
 * from 5 rows: on an H100, steps of 5 / 6 / 7 rows of qwen3-0.6b 1.25 / 1.3 / 1.5x, qwen3-8b's layers
 * 1.8 / 2.1 / 2.2x the dp4a kernel's; at 4 rows the dp4a weight tiles stay ahead on qwen3-0.6b and
 * gemma4-26b-a4b — docs/cuda.md "Tensor cores from five rows") */
#define MMA_MIN_ROWS 5
/* ... and so do products of MMA_LONG_ROWS rows whose matrices are all long and whose launch is wide (K
 * and the launch's outputs at least MMA_LONG_KN: every product of qwen3-8b), where the dp4a kernel's
 * 4-row passes fell behind (the whole qwen3-8b at B=4 1.15x on the tensor cores; qwen3-0.6b, K at most
 * 3,072, and gemma4-26b-a4b, K 2,816 or outputs 2,816, 7-9% ahead on dp4a — docs/cuda.md "Four rows on
 * the tensor cores where the matrices are long and wide") */
#define MMA_LONG_ROWS 4
#define MMA_LONG_KN 4096
#define NGRAPH 16          /* step graphs kept per instance */
#define REC_ARGS 10        /* ints of one recorded op */
enum { REPEAT_ATTN = 1, REPEAT_LINEAR = 2, REPEAT_NORM = 4, REPEAT_ACT = 8, REPEAT_EMPTY = 16, REPEAT_MOE = 32 };   /* cuda_backend.repeat: timing diagnostics */
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

/* Whether the per-KV-head attention (attention_kernel) makes the scores and value chains of its 2 or 4
 * query heads from one load of each key and value element (IB_CUDA_ATT_GROUPED=0: a (head, key) pair
 * and a (head, element) chain at a time, for comparisons; the same bits either way) */
enum att_grouped_mode { GROUPED_NEVER, GROUPED_BY_SHAPE };

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

/* Whether a Q8 product of at most 4 rows copies its blocks' whole weight tiles into shared memory
 * before the wait for the previous kernel (mm_q8_tile_kernel), so a tile's bytes are in flight at once
 * instead of in a warp's rounds one after another, with the modes above (IB_CUDA_MM_TILE=0 / unset /
 * force): by shape, wherever a block fits the bound below; forced, wherever one fits MM_TILE_SMEM_CAP.
 * The bound on a block's shared bytes sets its outputs (32, 16 or 8: mm_tile_opb): where the weights
 * were asked of L2 before the wait (mm_prefetch_wanted), blocks of up to MM_TILE_SMEM_MAX, two a
 * multiprocessor; where they come from DRAM, smaller ones (MM_TILE_SMEM_DRAM), more of them in flight.
 * Measured on the H200 (docs/cuda.md): qwen3-0.6b B=1 1,017 -> 1,134 tok/s; qwen3-8b B=1 341 -> 360 with
 * 48 KB blocks (321 with 96 KB, 312 with 200 KB); gemma4-26b-a4b B=1 277 -> 288. */
#define MM_TILE_SMEM_CAP (200 * 1024)   /* most a block may take (IB_CUDA_MM_TILE_KB, force): with its 16 KB
                                         * of terms, within the 227 KB a block may have */
#define MM_TILE_SMEM_MAX (96 * 1024)    /* by default, weights from L2: with its terms, two blocks a multiprocessor */
#define MM_TILE_SMEM_DRAM (48 * 1024)   /* by default, weights from DRAM */

/* Which tensor-core kernel takes the Q8 products on grids too small for the tiled one (launch_products):
 * mm_q8_mma_pipe_kernel (the default, whatever the rows) or mm_q8_mma16_kernel (IB_CUDA_MMA_KERNEL=16:
 * tests and measurements). Measured on the H200 (docs/cuda.md, "The pipelined kernel for every row
 * count"): against mm_q8_mma16_kernel beyond 64 rows, qwen3-0.6b one 128-token prompt 35,539 -> 39,945
 * tok/s, 96 tokens +10.7%, B=96 +4.5%, B=128 +7.5%, B=65 -1.3%; qwen3-8b B=65 +3.4%, B=96 +7.6%. */
enum mma_kernel_mode { MMA_PIPE, MMA_16 };

/* Whether mm_q8_mma_pipe_kernel's blocks take 16 outputs instead of 32: never (IB_CUDA_MMA_NARROW=0),
 * where 32 would leave multiprocessors idle (the default: launch_products), or always (=force: tests) */
enum mma_narrow_mode { NARROW_NEVER, NARROW_BY_GRID, NARROW_FORCED };

/* The KV types of a step's rows: mixed, or all of one type */
enum kv_rows_type { KV_ROWS_MIXED, KV_ROWS_F32, KV_ROWS_F16, KV_ROWS_Q8 };

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

#include "backends/cuda/rowinfo.cuh"
#include "backends/cuda/device_primitives.cuh"

#include "backends/cuda/product_types.cuh"

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
    int R, n_items, n_logits, attn_block, fault, long_keys, n_tiles, tile_vw, kv_rows, nrec, nograph;
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
    int mma_long;                    /* 1: also those of MMA_LONG_ROWS rows over long, wide matrices (the
                                      * default; 0 when IB_CUDA_MMA_ROWS sets the rows alone) */
    int mma_bm;                      /* forced rows per block of the tiled kernel (32, 64; 0: by the grid's size) */
    int n_sm;                        /* the device's multiprocessors */
    int att_group_rows;              /* attention takes a block per KV head from this many rows */
    int repeat;                      /* REPEAT_* kernels launched twice (IB_CUDA_REPEAT: timing by difference) */
    int moe_split;                   /* Q8 expert products split K over a block's warps (IB_CUDA_MOE_SPLIT=0: a warp walks K) */
    mm_prefetch_mode mm_prefetch;    /* which product blocks ask L2 for their weight tiles before the wait */
    mm_stage_mode mm_stage;          /* which one-row products stage the row's codes in shared memory */
    mm_stage_mode mm_tile;           /* which products of at most 4 rows copy their weight tiles into shared memory */
    int mm_lean;                     /* 0 (IB_CUDA_MM_LEAN=0): RB-row dp4a passes keep the general instantiation (mm_q8_pick) */
    int mm_tile_max;                 /* most dynamic shared bytes of such a block (IB_CUDA_MM_TILE_KB; 0: by where its weights come from) */
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
    att_grouped_mode att_grouped;    /* per-KV-head attention's grouped passes (2 or 4 query heads a KV head) */
    att_wide_mode att_wide;          /* direct attention in ATT_THREADS_WIDE blocks: never, small grids (default), always */
    int n_tiles;                     /* the step's tiles when it attends in tiles, else 0 (step_begin) */
    int tile_vw;                     /* vectors a warp of attention_tile_kernel owns this step: 2 or 4 (plan_tiles) */
    int tile_rows;                   /* most rows a tile (<= TILE_ROWS; IB_CUDA_ATT_TILE_ROWS) */
    struct att_tile *h_tiles, *d_tiles;   /* [R_max] pinned staging, device */
    int q_ready_buf, q_ready_G;      /* buffer whose Q8 form (group G) a fused norm just wrote, or -1 */
    struct gcache *gc;               /* [NGRAPH] */
    unsigned long long tick;
    void **alloc_list;               /* [cap_alloc] device allocations (freed at destroy) */
    int n_alloc, cap_alloc;
    int *lhd, *lkvh;                 /* [L] each layer's head dim and KV heads (host) */
    struct gemma_state *gm;          /* Gemma 4's state (gemma_backend.cuh); NULL for other families */
} cuda_backend;

static void drop_graphs(cuda_backend *b);
/* Gemma 4 (gemma_kernels.cuh and gemma_backend.cuh, included before the op records' execution) */
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

#include "backends/cuda/product_kernels.cuh"

/* The Q8 dp4a product kernels' signature (mm_q8_kernel, mm_q8_tile_kernel): launch_products picks one. */
typedef void (*mm_q8_fn)(mset, const int8_t *, const float *, const float *, int, int, int, int);

/* mm_q8_tile_kernel for format fmt (IB_WQ4, IB_WQ8), opb (32, 16 or 8) outputs and rbt (1, 2 or 4) rows
 * a block. */
template <int FMT, int OPB>
static mm_q8_fn mm_q8_tile_pick_rows(int rbt) {
    return rbt == 1 ? mm_q8_tile_kernel<FMT, OPB, 1> : rbt == 2 ? mm_q8_tile_kernel<FMT, OPB, 2> : mm_q8_tile_kernel<FMT, OPB, 4>;
}
template <int FMT>
static mm_q8_fn mm_q8_tile_pick_fmt(int opb, int rbt) {
    return opb == NT ? mm_q8_tile_pick_rows<FMT, NT>(rbt) : opb == 16 ? mm_q8_tile_pick_rows<FMT, 16>(rbt)
                                                                    : mm_q8_tile_pick_rows<FMT, 8>(rbt);
}
static mm_q8_fn mm_q8_tile_pick(int fmt, int opb, int rbt) {
    return fmt == IB_WQ4 ? mm_q8_tile_pick_fmt<IB_WQ4>(opb, rbt) : mm_q8_tile_pick_fmt<IB_WQ8>(opb, rbt);
}

#include "backends/cuda/elementwise_kernels.cuh"

#include "backends/cuda/attention_kernels.cuh"

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

/* Device 0's free and total memory now (cudaMemGetInfo), where this backend's KV caches live; called
 * only where the backend is available (ib_backend_device_memory checks that first). */
static int cuda_device_memory(size_t *free_bytes, size_t *total_bytes) {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    *free_bytes = f, *total_bytes = t;
    return 0;
}

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
        ib_cuda_layout_f32(cm, Np, w);
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
    ib_cuda_layout_q(cm, Np, w, s, bb);
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


/* Let tensor-core product kernel k (its pipeline stages in sm bytes of dynamic shared memory, more than
 * the default 48 KB) take sm bytes, and ask for the multiprocessor's largest shared-memory carveout, so
 * shared memory does not hold fewer of its blocks on a multiprocessor than its registers allow.
 * Returns whether both were accepted. */
static int give_pipeline_smem(mm_q8_mma_fn k, size_t sm) {
    return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) == cudaSuccess &&
           cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) == cudaSuccess;
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
        b->mma_long = !(t && atoi(t) > 0);
        /* rows from which attention takes a block per KV head (tests set it to compare both kernels) */
        /* 32 or 64: every tensor-core product takes the tiled kernel with that many rows per block
         * (tests; unset: the kernel and its rows follow the grid's size) */
        const char *bm = getenv("IB_CUDA_MMA_BM");
        b->mma_bm = bm && (atoi(bm) == 32 || atoi(bm) == 64) ? atoi(bm) : 0;
        const char *mk = getenv("IB_CUDA_MMA_KERNEL");
        b->mma_kernel = mk && !strcmp(mk, "16") ? MMA_16 : MMA_PIPE;
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
        /* "0": the per-KV-head attention a (head, key) pair at a time; else grouped where G is 2 or 4 */
        b->att_grouped = env_mode("IB_CUDA_ATT_GROUPED") ? GROUPED_BY_SHAPE : GROUPED_NEVER;
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
        b->mm_tile = (mm_stage_mode)env_mode("IB_CUDA_MM_TILE");
        /* "0": RB-row Q8 passes of the dp4a kernel always in its general instantiation (comparisons) */
        b->mm_lean = env_mode("IB_CUDA_MM_LEAN") != 0;
        /* N: a tile block's dynamic shared memory at most N KiB (measurements, tests; unset: by where its
         * weights come from, mm_tile_opb) */
        const char *tk = getenv("IB_CUDA_MM_TILE_KB");
        b->mm_tile_max = tk && atoi(tk) >= 16 && atoi(tk) * 1024 <= MM_TILE_SMEM_CAP ? atoi(tk) * 1024 : 0;
        const char *rp = getenv("IB_CUDA_REPEAT");
        b->repeat = (rp && strstr(rp, "attn") ? REPEAT_ATTN : 0) | (rp && strstr(rp, "linear") ? REPEAT_LINEAR : 0) |
                    (rp && strstr(rp, "norm") ? REPEAT_NORM : 0) | (rp && strstr(rp, "act") ? REPEAT_ACT : 0) |
                    (rp && strstr(rp, "empty") ? REPEAT_EMPTY : 0) | (rp && strstr(rp, "moe") ? REPEAT_MOE : 0);
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
        for (int v = 0; v < 12; v++) {   /* every (format, rows, group size) of the tiled GEMM */
            size_t sm;
            const mm_q8_mma_fn k = mma_gemm_pick(v & 1 ? IB_WQ8 : IB_WQ4, v & 2 ? 64 : 32, 32 << (v >> 2), &sm);
            ok = ok && give_pipeline_smem(k, sm);
        }
        for (int v = 0; v < 16; v++) {   /* every (format, rows, narrow, deep) */
            size_t sm;
            const mm_q8_mma_fn k = mma_pipe_pick(v & 1 ? IB_WQ8 : IB_WQ4, v & 2 ? 2 : 1, (v >> 2) & 1, v >> 3, &sm);
            ok = ok && give_pipeline_smem(k, sm);
        }
        for (int v = 0; v < 18; v++)   /* every (format, outputs, rows) of the tile kernel: up to MM_TILE_SMEM_CAP */
            ok = ok && cudaFuncSetAttribute(mm_q8_tile_pick(v & 1 ? IB_WQ8 : IB_WQ4, NT >> (v / 2 % 3), 1 << (v / 6)),
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, MM_TILE_SMEM_CAP) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_head_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_head_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        for (int kvt = 0; kvt < IB_KV_DTYPE_COUNT; kvt++)
            for (int wide = 0; wide < 2; wide++)
                ok = ok && cudaFuncSetAttribute(direct_attention_kernel_for((ib_kv_dtype)kvt, wide),
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_STAGE_MAX) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_tile_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)tile_smem_bytes(TILE_HD)) == cudaSuccess;
        ok = ok && cudaFuncSetAttribute(attention_tile_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)tile_smem_bytes(TILE_HD)) == cudaSuccess;
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

/* The stream new caches are zeroed on: its own, non-blocking. A server makes caches on its request
 * threads while the scheduler's thread may be capturing a step into a graph; a memset on the legacy
 * default stream would synchronize with the capturing (blocking) step stream, which a capture does not
 * allow: the memset failed (the request got "out of device memory") and the capture broke. */
static pthread_once_t zero_once = PTHREAD_ONCE_INIT;
static cudaStream_t zero_st;
static void zero_stream_make(void) {
    if (cudaStreamCreateWithFlags(&zero_st, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        zero_st = NULL;
    }
}

/* n bytes at p set to zero and finished, off the step stream (zero_st; the legacy stream when that
 * could not be made). 0, or -1 on a CUDA error. */
static int zero_device(void *p, size_t n) {
    pthread_once(&zero_once, zero_stream_make);
    if (!zero_st) return cudaMemset(p, 0, n) == cudaSuccess ? 0 : -1;
    return cudaMemsetAsync(p, 0, n, zero_st) == cudaSuccess && cudaStreamSynchronize(zero_st) == cudaSuccess ? 0 : -1;
}

/* A zeroed cache of d's shape in device memory (the layout of ib_kv_desc). */
static ib_status cuda_kv_create(const ib_kv_desc *d, ib_kv **out, ib_error *err) {
    *out = NULL;
    const char *why;
    if (!device_ok(&why)) return ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: %s", why);
    /* the attention kernels index a (layer, k|v, head) plane's elements in 32 bits (value_pass) */
    if ((uint64_t)d->capacity * (uint64_t)d->head_dim > UINT32_MAX)
        return ib_fail(err, IB_ERR_INVALID_ARG, "cuda: KV cache of %d positions x head dim %d: a plane of more than 2^32 elements",
                       d->capacity, d->head_dim);
    if ((uint64_t)d->sliding_capacity * (uint64_t)d->sliding_head_dim > UINT32_MAX)
        return ib_fail(err, IB_ERR_INVALID_ARG, "cuda: sliding KV of %d positions x head dim %d: a plane of more than 2^32 elements",
                       d->sliding_capacity, d->sliding_head_dim);
    cuda_kv *kv = (cuda_kv *)calloc(1, sizeof *kv);
    if (!kv) return ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
    kv->pub.desc = *d;
    kv->pub.kind = IB_BACKEND_CUDA;
    const size_t n = ib_kv_desc_bytes(d);
    if (cudaMalloc(&kv->dev, n ? n : 16) != cudaSuccess || zero_device(kv->dev, n)) {
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
        const ib_kv_dtype dt = sd->dtype;
        size_t so = 0, to = 0;   /* bytes of the layers before li in src, dst */
        for (int li = 0; li < sd->n_layers; li++) {
            if (ib_kv_desc_owner(sd, li) != li) continue;   /* KV-shared: holds none */
            const ib_kv_desc sv = ib_kv_desc_layer(sd, li), tv = ib_kv_desc_layer(dd, li);
            int n = n_slots < sv.capacity ? n_slots : sv.capacity;
            if (n > tv.capacity) n = tv.capacity;
            const size_t row = ib_kv_bytes(dt, (size_t)sv.head_dim);
            if (n > 0)
                cudaMemcpy2D((char *)((cuda_kv *)dst)->dev + to, (size_t)tv.capacity * row,
                             (const char *)((const cuda_kv *)src)->dev + so, (size_t)sv.capacity * row, (size_t)n * row,
                             (size_t)2 * sv.n_kv_heads, cudaMemcpyDeviceToDevice);
            so += ib_kv_bytes(dt, ib_kv_desc_layer_elems(sd, li)), to += ib_kv_bytes(dt, ib_kv_desc_layer_elems(dd, li));
        }
        return;
    }
    const size_t row = ib_kv_bytes(sd->dtype, (size_t)sd->head_dim);
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

/* The step's rows cut into tiles of at most `rows` consecutive rows of one session, into b->h_tiles,
 * the step's last tile first (a prompt's later rows attend more keys: its longest blocks start first and
 * its short ones fill the last wave; which block computes a tile never changes a number); returns how
 * many, or -1 where a row's session keeps a window (the tile kernel needs full caches). */
static int cut_tiles(cuda_backend *b, const ib_step_desc *d, int rows) {
    int n = 0;
    for (int r = 0; r < d->R;) {
        if (b->h_ri[r].window > 0) return -1;
        int e = r + 1;
        while (e < d->R && d->row_item[e] == d->row_item[r] && e - r < rows) e++;
        b->h_tiles[n].r0 = r, b->h_tiles[n].n = e - r;
        n++, r = e;
    }
    for (int i = 0, j = n - 1; i < j; i++, j--) {
        const att_tile t = b->h_tiles[i];
        b->h_tiles[i] = b->h_tiles[j], b->h_tiles[j] = t;
    }
    return n;
}

/* Whether the step's attention runs in tiles of one session's consecutive rows (attention_tile_kernel),
 * and its tiles into b->h_tiles / b->n_tiles (0: not). Where the kernel can — not Gemma 4, every session
 * a full cache, head dim 16, 32, 64 or 128, key blocks of at most TILE_KEYS, at most TILE_QV query vectors
 * a block (rows x G) — and the step's shape asks for it: four or more rows a tile on average (prompts'
 * chunks; decode rows are one a session) and at least a block a multiprocessor (tiles x KV heads): tiles
 * of up to TILE_ROWS rows (TILE_QV / G) where some row attends TILE_LONG_KEYS keys or more (each key
 * block staged once for twice the rows), else of TILE_ROWS_SHORT. Measured on an H100 (one qwen3-0.6b
 * prompt a step, f16 KV, tok/s; the kernel with a warp per 2 or 4 vectors, docs/cuda.md "Prompt tiles
 * with a warp per vector group"): 8-row tiles / 16-row tiles / a block per (row, KV head): 256 rows
 * 44,173 / - / 40,023, 512 45,374 / 41,203 / -, 1,024 40,409 / 43,069 / -, 2,048 27,091 / 31,371 / -;
 * 128 rows (128 blocks) keep the block per (row, KV head). IB_CUDA_ATT_TILE=force: whenever the kernel
 * can (tiles of TILE_ROWS rows, or IB_CUDA_ATT_TILE_ROWS), 0: never. Only the grid depends on it, never
 * an operation. */
#define TILE_ROWS_SHORT 8
#define TILE_LONG_KEYS 1024
static void plan_tiles(cuda_backend *b, const ib_step_desc *d) {
    b->n_tiles = 0;
    const int G = b->H / b->KVH;
    const int rows = b->tile_rows < TILE_QV / G ? b->tile_rows : TILE_QV / G;   /* most rows a tile */
    if (b->att_tiles == TILES_NEVER || b->gm || rows < 1 || d->attn_block > TILE_KEYS ||
        (b->hd != 16 && b->hd != 32 && b->hd != 64 && b->hd != 128))
        return;
    if (b->att_tiles == TILES_FORCED) {
        const int n = cut_tiles(b, d, rows);
        b->n_tiles = n > 0 ? n : 0;
        return;
    }
    int keys = 0;
    for (int r = 0; r < d->R; r++)
        if (b->h_ri[r].pos + 1 > keys) keys = b->h_ri[r].pos + 1;
    if (keys >= TILE_LONG_KEYS && rows > TILE_ROWS_SHORT) {
        const int n = cut_tiles(b, d, rows);
        if (n < 0) return;
        if (d->R >= 4 * n && (long)n * b->KVH >= b->n_sm) {
            b->n_tiles = n;
            return;
        }
    }
    const int n = cut_tiles(b, d, rows < TILE_ROWS_SHORT ? rows : TILE_ROWS_SHORT);
    if (n > 0 && d->R >= 4 * n && (long)n * b->KVH >= b->n_sm) b->n_tiles = n;
}

/* The vectors a warp of attention_tile_kernel owns for the step's tiles (plan_tiles' b->h_tiles): 2 where
 * every tile has at most TILE_QV / 2 vectors (rows x G), so all the block's warps have some; else 4. */
static int tile_vectors_a_warp(const cuda_backend *b) {
    int most = 0;
    for (int i = 0; i < b->n_tiles; i++)
        if (b->h_tiles[i].n > most) most = b->h_tiles[i].n;
    return most * (b->H / b->KVH) <= TILE_QV / 2 ? 2 : 4;
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
    int rows_of[IB_KV_DTYPE_COUNT] = {0};
    for (int r = 0; r < d->R; r++) {
        const cuda_kv *kv = (const cuda_kv *)d->kv[d->row_item[r]];
        if (kv->pub.kind != IB_BACKEND_CUDA)
            return ib_fail(err, IB_ERR_INVALID_ARG, "cuda: row %d: its session's KV cache is not on the GPU", r);
        rowinfo *ri = &b->h_ri[r];
        ri->kv = kv->dev;
        ri->cap = kv->pub.desc.capacity, ri->sink = kv->pub.desc.sink, ri->window = kv->pub.desc.window;
        ri->kvt = kv->pub.desc.dtype;
        rows_of[ri->kvt]++;
        ri->pos = d->pos[r];
        {
            const int keys = d->pos[r] + 1, kept = ri->window > 0 ? ri->sink + ri->window : keys;
            b->long_keys |= (keys < kept ? keys : kept) >= b->att_split_keys;
        }
        ri->scap = kv->pub.desc.sliding_capacity, ri->swin = kv->pub.desc.sliding_window;
        ri->kvq8_fault = d->R > 1 && b->fault == IB_FAULT_KVQ8_STEP_SCALE;
        b->h_tok[r] = d->tok[r];
        b->h_pos[r] = d->rope_pos[r];
    }
    b->kv_rows = rows_of[IB_KV_F16] == d->R ? KV_ROWS_F16 : rows_of[IB_KV_F32] == d->R ? KV_ROWS_F32
                 : rows_of[IB_KV_Q8] == d->R ? KV_ROWS_Q8 : KV_ROWS_MIXED;
    b->want_logits = b->want_argmax = 0;
    for (int j = 0; j < d->n_logits; j++) {
        b->h_lrow[j] = d->logit_row[j], b->lout[j] = d->logits_out[j];
        b->aout[j] = d->argmax_out ? d->argmax_out[j] : NULL;
        b->want_logits |= b->lout[j] != NULL, b->want_argmax |= b->aout[j] != NULL;
    }
    plan_tiles(b, d);
    b->tile_vw = tile_vectors_a_warp(b);
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

/* mm_q8_kernel for format fmt (IB_WQ4, IB_WQ8), rbt rows per pass (1, 2, 4, RB) and 8-output blocks
 * (narrow) or 32-output ones; lean (RB rows, groups of at most half MM_MAXC's code words): the
 * instantiation with those code words and registers for RB_LEAN_MINB blocks a multiprocessor. */
#define RB_LEAN_MINB 2
template <int FMT>
static mm_q8_fn mm_q8_pick_fmt(int rbt, int narrow, int lean) {
    constexpr int H = MM_MAXC(FMT) / 2, F = MM_MAXC(FMT);
    if (rbt == RB && lean)
        return narrow ? mm_q8_kernel<FMT, RB, 8, H, false, RB_LEAN_MINB> : mm_q8_kernel<FMT, RB, NT, H, false, RB_LEAN_MINB>;
    if (narrow)
        return rbt == 1 ? mm_q8_kernel<FMT, 1, 8> : rbt == 2 ? mm_q8_kernel<FMT, 2, 8>
                        : rbt == 4 ? mm_q8_kernel<FMT, 4, 8> : mm_q8_kernel<FMT, RB, 8, F>;
    return rbt == 1 ? mm_q8_kernel<FMT, 1, NT> : rbt == 2 ? mm_q8_kernel<FMT, 2, NT>
                    : rbt == 4 ? mm_q8_kernel<FMT, 4, NT> : mm_q8_kernel<FMT, RB, NT, F>;
}
static mm_q8_fn mm_q8_pick(int fmt, int rbt, int narrow, int lean) {
    return fmt == IB_WQ4 ? mm_q8_pick_fmt<IB_WQ4>(rbt, narrow, lean) : mm_q8_pick_fmt<IB_WQ8>(rbt, narrow, lean);
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

/* Outputs a block of mm_q8_tile_kernel for the n matrices of a product of `rows` rows (its RBT) and
 * `tiles` 32-output tiles whose weights were asked of L2 before the wait or not (l2): the most of 32,
 * 16, 8 whose block fits the bound in shared memory (*smem: its bytes) — b->mm_tile_max; forced,
 * MM_TILE_SMEM_CAP; else MM_TILE_SMEM_MAX or MM_TILE_SMEM_DRAM by l2 — and, but for 8, gives at least a
 * block a multiprocessor; 0 where even 8 do not fit. Only the grid depends on it, never an operation. */
static int mm_tile_opb(const cuda_backend *b, int n, const dmat *const *m, int tiles, int rows, int l2, size_t *smem) {
    const size_t bound = b->mm_tile_max                ? (size_t)b->mm_tile_max
                         : b->mm_tile == STAGE_FORCED ? (size_t)MM_TILE_SMEM_CAP
                         : l2                          ? (size_t)MM_TILE_SMEM_MAX
                                                       : (size_t)MM_TILE_SMEM_DRAM;
    for (int opb = NT; opb >= 8; opb /= 2) {
        size_t need = 0;
        for (int i = 0; i < n; i++) {
            const size_t s = mm_tile_smem(opb, m[i]->K, m[i]->ng, m[i]->G / MM_KC(m[i]->fmt), rows);
            if (s > need) need = s;
        }
        if (need > bound) continue;
        if (opb > 8 && (long)tiles * (NT / opb) < b->n_sm) continue;
        *smem = need;
        return opb;
    }
    return 0;
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

/* Ys[i] [R][N_i] = X [R][K] · W_i^T for n (1..3) device matrices of one format read as one grid, with X
 * already quantized into b->xq/qd/qad when q8. The Q8 dp4a kernel's rows per block grow with the work
 * (about 4 blocks per multiprocessor); many rows take the tensor-core kernel. Neither choice changes
 * any output's arithmetic. */
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
    /* g32: the tensor-core kernels walk groups in steps of 32 k, whole groups a stage; same_g: the
     * tiled GEMM is compiled for one group size, every matrix's */
    int g32 = 1, same_g = 1, long_k = 1;
    for (int i = 0; i < n; i++) {
        g32 &= m[i]->G > 0 && m[i]->G % 32 == 0 && MMA_KS % m[i]->G == 0;
        same_g &= m[i]->G == m[0]->G;
        long_k &= m[i]->K >= MMA_LONG_KN;
    }
    const int mma = R >= b->mma_rows || (b->mma_long && R == MMA_LONG_ROWS && long_k && (long)tiles * NT >= MMA_LONG_KN);
    if (q8 && fmt != IB_WF32 && mma && g32) {
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
        const int bm = !same_g                                ? 0
                       : b->mma_bm                            ? b->mma_bm
                       : R >= 64 && b64 >= 2L * b->n_sm       ? 64
                       : R >= 32 && 2 * b32 >= 3L * b->n_sm   ? 32
                                                              : 0;
        if (bm) {
            dim3 grid(blocks_for((size_t)R, bm), (unsigned)t64, (unsigned)splits);
            size_t sm;
            const mm_q8_mma_fn k = mma_gemm_pick(fmt, bm, m[0]->G, &sm);
            launch(b, k, grid, 256, sm, m64, b->xq, b->qd, b->qad, R, fused, splits);
        } else {
            if (b->mma_kernel == MMA_PIPE) {
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
        /* a step of at most 4 rows: its weight tiles copied into shared memory before the wait (b->mm_tile)
         * where a block's rows take one pass (rpb == rbt: grids of fewer than 1,056 tiles; the lm_head's
         * larger grid, which the kernel above reads at 3.8 TB/s, keeps it) */
        size_t tsm = 0;
        const int tile_opb = rbt <= 4 && rpb == rbt && b->mm_tile != STAGE_NEVER
                                 ? mm_tile_opb(b, n, m, tiles, rbt, ms.prefetch, &tsm) : 0;
        if (tile_opb) {
            dim3 tgrid((unsigned)tiles * (NT / tile_opb), 1, (unsigned)splits);
            launch(b, mm_q8_tile_pick(fmt, tile_opb, rbt), tgrid, 256, tsm, ms, b->xq, b->qd, b->qad, R, rpb, fused, splits);
            LAUNCHED(b, "linear");
            return;
        }
        const int can_stage = R == 1 && rpb == 1 && m[0]->K <= MM_XS_MAX_K;
        const int staged = can_stage && (b->mm_stage == STAGE_FORCED || (b->mm_stage == STAGE_BY_SHAPE && !ms.prefetch));
        const int lean = short_groups && b->mm_lean;
        mm_q8_fn k = staged ? mm_q8_pick_staged(fmt, narrow, short_groups) : mm_q8_pick(fmt, rbt, narrow, lean);
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
        launch(b, b->tile_vw == 2 ? attention_tile_kernel<2> : attention_tile_kernel<4>, b->n_tiles * b->KVH, ATT_THREADS,
               tile_smem_bytes(b->hd), Q, ATT, b->d_ri,
               (const att_tile *)b->d_tiles, b->H, b->KVH, b->hd, li, b->scale, b->attn_block, qG, b->xq, b->qd, b->qad);
    else if (b->R >= b->att_group_rows)
        launch(b, attention_kernel, b->R * b->KVH, ATT_THREADS, 0, Q, ATT, b->d_ri, b->H, b->KVH, b->hd, li, b->scale,
                                                                     b->attn_block, qG, b->xq, b->qd, b->qad, *fz,
               (int)(b->att_grouped == GROUPED_BY_SHAPE));
    else {
        const int cl = att_cluster(b, b->R * b->H, b->hd), blocks = b->R * b->H * cl, st = att_stage_bytes(b, blocks);
        /* the direct kernel has one form per KV type: a step of mixed rows takes the per-head kernel */
        if (cl == 1 && b->att_direct == DIRECT_BY_SHAPE && b->kv_rows != KV_ROWS_MIXED) {
            /* wide blocks where the grid fills at most a quarter of the multiprocessors (att_wide_mode) */
            const int wide = b->att_wide == WIDE_FORCED || (b->att_wide == WIDE_SMALL_GRIDS && 4L * blocks <= b->n_sm);
            const ib_kv_dtype kvt = b->kv_rows == KV_ROWS_F16 ? IB_KV_F16 : b->kv_rows == KV_ROWS_Q8 ? IB_KV_Q8 : IB_KV_F32;
            launch(b, direct_attention_kernel_for(kvt, wide), blocks, wide ? ATT_THREADS_WIDE : ATT_THREADS, (size_t)st, Q, ATT, b->d_ri, b->H, b->KVH, b->hd,
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
#include "backends/cuda/gemma_backend.cuh"

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
            c->fault == b->fault && c->long_keys == b->long_keys && c->n_tiles == b->n_tiles && c->tile_vw == b->tile_vw && c->kv_rows == b->kv_rows && c->nrec == b->nrec && !memcmp(c->rec, b->rec, (size_t)b->nrec * sizeof(oprec)))
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
            c->fault = b->fault, c->long_keys = b->long_keys, c->n_tiles = b->n_tiles, c->tile_vw = b->tile_vw, c->kv_rows = b->kv_rows, c->nrec = b->nrec, c->used = ++b->tick;
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
    1u << IB_KV_F32 | 1u << IB_KV_F16 | 1u << IB_KV_Q8,
    cuda_device_memory,
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
