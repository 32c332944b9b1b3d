/*
 * gemma_kernels.cuh — the CUDA backend's Gemma 4 kernels (backend.h's ops embed scale, qk_prepare,
 * attention, geglu, moe, scale_layer, logits soft-cap, ple_inputs, ple_layer; their host side, the
 * instance's Gemma state and launches, is gemma_backend.cuh), included by cuda_backend.cu after its
 * product, norm and attention kernels, whose helpers they call. Every kernel computes the definitions of src/ops/ bit for bit: element definitions come from
 * the host headers compiled for the device (IB_HD: ops/act_def.h's ib_geglu_elem and ib_softcap_elem,
 * fmath.h's exponentials), the rest is written with the same float
 * operations in the same order as the scalar reference named at each kernel.
 *
 * Per layer li a Gemma 4 model has its own head dim and KV heads (sliding: head_dim x n_kv_heads; full:
 * global_head_dim x global_kv_heads), its RoPE table (sliding: ib_rope_table with rope_theta; full:
 * ib_rope_table_pairs with rope_theta_full and rope_pairs_full) and its cache view (ib_kv_desc_layer):
 * a full layer keeps the session's policy (capacity, sink, window), a sliding layer its ring
 * (sliding_capacity slots, sink 0, window sliding_window). A session's cache holds its layers one
 * after another (ib_kv_desc_bytes' order), each layer [2][KVH][slots][hd]; layer li's keys start at
 * element A[li] * capacity + B[li] * sliding_capacity, where A / B are the elements per slot of the
 * owned full / sliding layers before it (a KV-shared layer has its source's A and B). So a row's view
 * of a layer (gemma_view) is the rowinfo the Qwen kernels take with li = 0, and the attention kernels'
 * per-row code (attend_row_head, attend_row_kvhead) runs unchanged on it.
 */

#define MOE_CH NWARP   /* routed pairs per block of the experts' product (a warp each) */

/* ---------------------------------------------------------------- kernels */

/* Row r's view of one layer: its cache at the layer's first element, and the layer kind's capacity and
 * policy (ib_kv_desc_layer, ib_kv_desc_slot). The attention and store code then takes li = 0. */
__device__ __forceinline__ rowinfo gemma_view(rowinfo v, int sliding, long long A, long long B) {
    v.kv = (char *)v.kv + ib_kv_bytes((ib_kv_dtype)v.kvt, (size_t)(A * v.cap + B * v.scap));
    if (sliding) v.cap = v.scap, v.sink = 0, v.window = v.swin;
    return v;
}

/* x[i] = x[i] * s for i < n (ib_scale: the embedding scale, the layer scalar). */
__global__ void scale_kernel(float *x, size_t n, float s) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * s;
}

/* x[i] = ib_softcap_elem(x[i], cap) for i < n (ib_softcap: the final logit soft-cap, in double). */
__global__ void softcap_kernel(float *x, size_t n, float cap) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = ib_softcap_elem(x[i], cap);
}

/* g = gelu_tanh(g) * u elementwise (ib_geglu: ib_geglu_elem), n elements. */
__global__ void geglu_kernel(float *g, const float *__restrict__ u, size_t n) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = ib_geglu_elem(g[i], u[i]);
}

/* geglu_kernel of the rows of g / u [nrows][F] fused with the quantization of its output for group G
 * (ib_geglu, then ib_quantize_act of the rows; as swiglu_q8_kernel): one warp per (row, group), each
 * lane quantizing the elements it wrote. sel != NULL: row s is skipped when sel[s] < 0 (a routed pair
 * slot no expert took). */
__global__ void geglu_q8_kernel(float *g, const float *__restrict__ u, int nrows, int F, int G, int8_t *__restrict__ xq,
                                float *__restrict__ qd, float *__restrict__ qad, const int32_t *__restrict__ sel) {
    PDL_ENTER();
    const int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int ng = F / G;
    if (wid >= nrows * ng) return;
    const int r = wid / ng, gi = wid % ng;
    if (sel && sel[r] < 0) return;
    const size_t o = (size_t)r * F + (size_t)gi * G;
    float *gp = g + o;
    for (int k = lane; k < G; k += 32) gp[k] = ib_geglu_elem(gp[k], u[o + k]);
    __syncwarp();
    quantize_group(gp, G, xq + o, qd + (size_t)r * ng + gi, qad + (size_t)r * ng + gi, lane);
}

/* geglu_kernel over the rows of g / u [nrows][F] whose sel[row] >= 0 (the routed pairs' slots). */
__global__ void geglu_sel_kernel(float *g, const float *__restrict__ u, int nrows, int F, const int32_t *__restrict__ sel) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)nrows * F || sel[i / F] < 0) return;
    g[i] = ib_geglu_elem(g[i], u[i]);
}

/* The weightless or weighted head norm of one head xs [hd] (shared memory) by one warp, as qk_kernel
 * computes ib_rmsnorm_heads: lanes 0..15 own ib_dot16's lanes and fold 8, 4, 2, 1, r = 1/sqrt(ss/hd +
 * eps), then x * r (w NULL: Gemma 4's v_norm) or (x * r) * w. Ends with __syncwarp. */
__device__ __forceinline__ void head_norm_warp(float *xs, const float *__restrict__ w, int hd, float eps, int lane) {
    const float rr = head_norm_factor(xs, hd, eps, lane);
    __syncwarp();
    if (w)
        for (int i = lane; i < hd; i += 32) xs[i] = (xs[i] * rr) * w[i];
    else
        for (int i = lane; i < hd; i += 32) xs[i] = xs[i] * rr;
    __syncwarp();
}

/* The rotation of each pair (i, i + hd/2) of xs [hd] by t [hd/2][2] (ib_rope: a*c - b*s, b*c + a*s,
 * products rounded), by one warp. Ends with __syncwarp. */
__device__ __forceinline__ void rope_warp(float *xs, const float *__restrict__ t, int hd, int lane) {
    const int half = hd / 2;
    for (int i = lane; i < half; i += 32) rope_pair(xs, i, half, t[2 * i], t[2 * i + 1]);
    __syncwarp();
}

/* Gemma 4's qk_prepare of layer li (backend.h; cpu_backend.c's qk_task): one warp per (row r =
 * blockIdx.y, head h = QK_WARPS * blockIdx.x + warp) of the row's H query heads (Q [R][H][hd]) then,
 * when the layer has keys of its own (own_kv), its KVH key heads (K, V [R][KVH][hd]); a key head's warp
 * also owns the value head of the same index. Staged in shared memory ([QK_WARPS][2][hd] floats).
 *   IB_QK_NORM (phases & 1): k_eq_v: V = K first (attention_k_eq_v, before any norm); query: q_norm
 *     (qn; NULL: none); key: k_norm (kn), value: the weightless v_norm — ib_rmsnorm_heads each; the
 *     heads written back.
 *   IB_QK_ROPE_STORE (phases & 2): rows r < rope_rows rotate the query and key heads by cs [R][hd/2][2]
 *     (the layer type's table); heads written back; a key head and its value head stored into the
 *     row's cache at the layer's view (gemma_view) and the slot of pos (half by ib_f32_to_f16).
 * The CPU's order (V = K, q, k, v norms, RoPE of q and k, store); each head's operations are its own. */
__global__ void __launch_bounds__(32 * QK_WARPS)
    gemma_qk_kernel(float *Q, float *K, float *V, const float *__restrict__ cs, const rowinfo *__restrict__ ri,
                    const float *__restrict__ qn, const float *__restrict__ kn, int H, int KVH, int hd, int phases,
                    int own_kv, int k_eq_v, int sliding, long long A, long long B, float eps, int rope_rows) {
    PDL_ENTER();
    DYN_SHARED(float, hs);
    const int r = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *xs = hs + (size_t)warp * 2 * hd, *xv = xs + hd;
    const float *t = cs + (size_t)r * (hd / 2) * 2;
    const int h = QK_WARPS * blockIdx.x + warp;
    const int nh = H + (own_kv ? KVH : 0);
    if (h >= nh) return;
    const int norm = phases & IB_QK_NORM, rope = (phases & IB_QK_ROPE_STORE) && r < rope_rows;
    if (h < H) {
        float *q = Q + ((size_t)r * H + h) * hd;
        for (int i = lane; i < hd; i += 32) xs[i] = q[i];
        __syncwarp();
        if (norm && qn) head_norm_warp(xs, qn, hd, eps, lane);
        if (rope) rope_warp(xs, t, hd, lane);
        for (int i = lane; i < hd; i += 32) q[i] = xs[i];
        return;
    }
    const int kh = h - H;
    float *k = K + ((size_t)r * KVH + kh) * hd, *v = V + ((size_t)r * KVH + kh) * hd;
    for (int i = lane; i < hd; i += 32) {
        xs[i] = k[i];
        xv[i] = norm && k_eq_v ? k[i] : v[i];
    }
    __syncwarp();
    if (norm) {
        if (kn) head_norm_warp(xs, kn, hd, eps, lane);
        head_norm_warp(xv, NULL, hd, eps, lane);
    }
    if (rope) rope_warp(xs, t, hd, lane);
    for (int i = lane; i < hd; i += 32) k[i] = xs[i], v[i] = xv[i];
    if (!(phases & IB_QK_ROPE_STORE)) return;
    kv_store_warp(gemma_view(ri[r], sliding, A, B), 0, KVH, kh, hd, xs, xv, lane);   /* a view's layer 0 */
}

/* attention_head_kernel on Gemma 4 layer views: one block (SPLIT: a cluster of cl) per (row, query
 * head), the row's view of the layer (gemma_view: a KV-shared layer reads its source's keys and values)
 * then attend_row_head with li = 0 — the same arithmetic (ib_attend_heads order for a full view with
 * window 0, ib_attend_policy order for a windowed one: a sliding layer's last sliding_window keys);
 * stage_bytes and cl as attention_head_kernel. */
template <bool SPLIT>
__global__ void __launch_bounds__(ATT_THREADS)
    gemma_attention_head_kernel(const float *__restrict__ Q, float *__restrict__ ATT, const rowinfo *__restrict__ ri,
                                int H, int KVH, int hd, int sliding, long long A, long long B, float scale, int block,
                                int qG, int8_t *__restrict__ xq, float *__restrict__ qd, float *__restrict__ qad,
                                int stage_bytes, int cl) {
    if (!SPLIT) cl = 1;
    const int rh = (int)blockIdx.x / cl, r = rh / H, h = rh % H;
    const att_split sp = {cl, SPLIT ? cluster_rank() : 0};
    const rowinfo info = gemma_view(ri[r], sliding, A, B);   /* uploaded before the step's first kernel */
    prefetch_kv(info, 0, KVH, h / (H / KVH), hd);
    PDL_ENTER();
    __shared__ att_smem1 sm;
    DYN_SHARED_ALIGNED(unsigned char, att_stage);
    unsigned char *st = stage_bytes > 0 ? att_stage : NULL;
    if (info.kvt == IB_KV_F16) attend_row_head<uint16_t, SPLIT>(sm, Q, ATT, info, r, h, H, KVH, hd, 0, scale, block, qG, xq, qd, qad, st, stage_bytes, sp, qk_fuse{});
    else if (info.kvt == IB_KV_Q8) attend_row_head<kvq8, SPLIT>(sm, Q, ATT, info, r, h, H, KVH, hd, 0, scale, block, qG, xq, qd, qad, st, stage_bytes, sp, qk_fuse{});
    else attend_row_head<float, SPLIT>(sm, Q, ATT, info, r, h, H, KVH, hd, 0, scale, block, qG, xq, qd, qad, st, stage_bytes, sp, qk_fuse{});
}

/* attention_kernel on Gemma 4 layer views: one block per (row, KV head); as above (G * hd <= ATT_QH); its
 * passes a (head, key) pair at a time (the grouped ones are not measured on Gemma's shapes). */
__global__ void __launch_bounds__(ATT_THREADS)
    gemma_attention_kernel(const float *__restrict__ Q, float *__restrict__ ATT, const rowinfo *__restrict__ ri, int H,
                           int KVH, int hd, int sliding, long long A, long long B, float scale, int block, int qG,
                           int8_t *__restrict__ xq, float *__restrict__ qd, float *__restrict__ qad) {
    const int r = blockIdx.x / KVH, kvh = blockIdx.x % KVH;
    const rowinfo info = gemma_view(ri[r], sliding, A, B);
    prefetch_kv(info, 0, KVH, kvh, hd);
    PDL_ENTER();
    __shared__ att_smem sm;
    if (info.kvt == IB_KV_F16) attend_row_kvhead<uint16_t>(sm, Q, ATT, info, r, kvh, H, KVH, hd, 0, scale, block, qG, xq, qd, qad, qk_fuse{}, 0);
    else if (info.kvt == IB_KV_Q8) attend_row_kvhead<kvq8>(sm, Q, ATT, info, r, kvh, H, KVH, hd, 0, scale, block, qG, xq, qd, qad, qk_fuse{}, 0);
    else attend_row_kvhead<float>(sm, Q, ATT, info, r, kvh, H, KVH, hd, 0, scale, block, qG, xq, qd, qad, qk_fuse{}, 0);
}

#define ROUTE_WARPS_MAX 8   /* rows a routing block (a warp each) */
#define ROUTE_SCRATCH_BYTES (48 * 1024)   /* dynamic shared memory a routing block may take (no opt-in needed) */

/* Exclusive prefix sums over a block of (x, y) int pairs, one a thread in thread order; *tot gets the
 * block's sums (every thread). ws: [32] shared scratch. Called by the whole block (blockDim a multiple of
 * 32, at most 1024). */
__device__ int2 block_exclusive_scan2(int2 v, int2 *ws, int2 *tot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int2 in = v;   /* inclusive within the warp */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, in.x, o), y = __shfl_up_sync(0xffffffffu, in.y, o);
        if (lane >= o) in.x += x, in.y += y;
    }
    if (lane == 31) ws[warp] = in;
    __syncthreads();
    if (warp == 0) {
        int2 t = lane < nw ? ws[lane] : make_int2(0, 0);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, t.x, o), y = __shfl_up_sync(0xffffffffu, t.y, o);
            if (lane >= o) t.x += x, t.y += y;
        }
        if (lane < nw) ws[lane] = t;   /* inclusive over warps */
    }
    __syncthreads();
    const int2 before = warp ? ws[warp - 1] : make_int2(0, 0);
    *tot = ws[nw - 1];
    __syncthreads();   /* ws free for the next call */
    return make_int2(before.x + in.x - v.x, before.y + in.y - v.y);
}

/* The experts' work lists (one block; cnt_s: 2E ints of shared memory): the routed pairs (r, j) with
 * sel[r*K + j] >= 0 grouped by expert: ent_row / ent_slot (the row r and the slot r*K + j); and the
 * product's block rows: for each expert with n pairs, ceil(n / MOE_CH) entries (expert, first pair,
 * pairs), in ascending expert order, *nblk of them. Counts and places come from shared-memory atomics,
 * so the order of the pairs inside an expert's list may change from run to run: it decides only which
 * warp computes a pair, never a number (every pair's output is its own chain, written to its own
 * slot). The experts' first places and first block rows are prefix sums over the block's threads
 * (block_exclusive_scan2), not one thread's walk. sel is read through L2 (other blocks wrote it).
 * Test-only: capacity != 0 (the moe-capacity fault) first drops, by one thread's walk, each pair past
 * its expert's capacity (ib_moe_fault_capacity: sel becomes -1 there); load != NULL receives each
 * expert's pairs [E] (the moe-combine-by-load fault's combine order comes from them). */
__device__ void moe_dispatch_block(int32_t *sel, int R, int K, int E, int32_t *ent_row, int32_t *ent_slot,
                                   int4 *blk, int *nblk, int *cnt_s, int capacity, int32_t *load) {
    __shared__ int2 ws[32];
    int *cur_s = cnt_s + E;   /* [E] counts, then [E] each expert's next free place */
    const int n = R * K;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt_s[e] = 0;
    __syncthreads();
    if (capacity) {
        if (threadIdx.x == 0) {
            const int cap = (n + E - 1) / E;
            for (int i = 0; i < n; i++) {
                const int e = __ldcg(sel + i);
                if (e >= 0 && e < E && ++cnt_s[e] > cap) __stcg(sel + i, -1);
            }
        }
        __threadfence();
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x) cnt_s[e] = 0;
        __syncthreads();
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int e = __ldcg(sel + i);
        if (e >= 0 && e < E) atomicAdd(&cnt_s[e], 1);
    }
    __syncthreads();
    if (load)
        for (int e = threadIdx.x; e < E; e += blockDim.x) load[e] = cnt_s[e];
    int2 base = make_int2(0, 0);   /* (pairs, block rows) of the experts before this pass */
    for (int e0 = 0; e0 < E; e0 += blockDim.x) {
        const int e = e0 + (int)threadIdx.x, c = e < E ? cnt_s[e] : 0;
        int2 tot;
        const int2 at = block_exclusive_scan2(make_int2(c, (c + MOE_CH - 1) / MOE_CH), ws, &tot);
        if (e < E) {
            const int s = base.x + at.x;
            cur_s[e] = s;
            for (int i0 = 0, nb = base.y + at.y; i0 < c; i0 += MOE_CH, nb++)
                blk[nb] = make_int4(e, s + i0, c - i0 < MOE_CH ? c - i0 : MOE_CH, 0);
        }
        base.x += tot.x, base.y += tot.y;
    }
    if (threadIdx.x == 0) *nblk = base.y;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int e = __ldcg(sel + i);
        if (e >= 0 && e < E) {
            const int o = atomicAdd(&cur_s[e], 1);
            ent_row[o] = i / K, ent_slot[o] = i;
        }
    }
}

/* Routing of row r: ib_moe_route (ops/moe.c) by one warp, the same operations giving the same bits.
 * logits [R][E]; sel [R][K] (all -1 when fewer than K logits are numbers, as cpu_moe), w [R][K]; ws: the
 * warp's shared scratch, E + K words.
 *   - rank j takes the largest logit not yet taken, ties to the lowest id, NaN never: each lane the best
 *     of its strided ids, then the warp's best by argmax_pick (a maximum and, among equal values, the
 *     lowest id: the order of the comparisons cannot change the winner); a ranked id's copy becomes NaN;
 *   - p[e] = NaN ? 0 : ib_expf_lane(logit[e] - logit[sel[0]]) per id (independent);
 *   - their sum in the 16-lane order: lane j < 16 chains ids j, j+16, … ascending (the definition's
 *     lane j), then lanes fold 8, 4, 2, 1 (lane[j] + lane[j + h]);
 *   - lane 0: t = sum over ranks in order of p[sel[j]] / s, then w[j] = ((p[sel[j]] / s) / t) * scale. */
__device__ void moe_route_row(const float *__restrict__ logits, int r, int E, int K, const float *__restrict__ escale,
                              int32_t *sel, float *w, float *ws) {
    const int lane = threadIdx.x & 31;
    float *p = ws;                 /* [E] the logits (ranked ones NaN), then their exps */
    int *rk = (int *)(ws + E);     /* [K] the ranks' ids */
    const float *lg = logits + (size_t)r * E;
    int32_t *so = sel + (size_t)r * K;
    for (int e = lane; e < E; e += 32) p[e] = lg[e];
    __syncwarp();
    float m = 0.0f;   /* rank 0's logit */
    for (int j = 0; j < K; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32)
            if (p[e] == p[e]) argmax_pick(bv, bi, p[e], e);
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, bv, o);
            const int i = __shfl_xor_sync(0xffffffffu, bi, o);
            argmax_pick(bv, bi, v, i);
        }
        if (bi == 0x7fffffff) {   /* no number left: fewer than K (the warp agrees) */
            for (int i = lane; i < K; i += 32) so[i] = -1;
            return;
        }
        if (j == 0) m = bv;
        __syncwarp();
        if (lane == 0) rk[j] = bi, p[bi] = __int_as_float(0x7fc00000);
        __syncwarp();
    }
    for (int e = lane; e < E; e += 32) {
        const float x = lg[e];
        p[e] = x != x ? 0.0f : ib_expf_lane(x - m);
    }
    __syncwarp();
    float a = 0.0f;
    if (lane < 16)
        for (int e = lane; e < E; e += 16) a = a + p[e];
    for (int h = 8; h >= 1; h >>= 1) {
        const float o = __shfl_down_sync(0xffffffffu, a, h, 16);
        if (lane < h) a = a + o;
    }
    if (lane == 0) {
        const float s = a;
        float t = 0.0f;
        for (int j = 0; j < K; j++) t = t + p[rk[j]] / s;
        for (int j = 0; j < K; j++) {
            so[j] = rk[j];
            w[(size_t)r * K + j] = ((p[rk[j]] / s) / t) * escale[rk[j]];
        }
    }
}

/* Every row's routing (moe_route_row, a warp a row: block x takes rows x * (blockDim / 32) ...), then, by
 * the last block to finish (cnt: zero between launches; that block sets it back), the experts' work lists
 * (moe_dispatch_block) — one launch: no host round trip, the step stays one graph. Dynamic shared
 * memory: E + K words a warp, and at least 2E words (the work lists' counts). capacity, load: the
 * test-only MoE faults' (moe_dispatch_block; 0 and NULL otherwise). */
__global__ void __launch_bounds__(32 * ROUTE_WARPS_MAX) moe_route_kernel(const float *__restrict__ logits, int R, int E, int K,
                                                                         const float *__restrict__ escale, int32_t *sel,
                                                                         float *w, int32_t *ent_row, int32_t *ent_slot,
                                                                         int4 *blk, int *nblk, unsigned *cnt, int capacity,
                                                                         int32_t *load) {
    PDL_ENTER();
    DYN_SHARED(float, route_s);
    __shared__ unsigned done_s;
    const int warp = threadIdx.x >> 5, r = (int)blockIdx.x * (int)(blockDim.x >> 5) + warp;
    if (r < R) moe_route_row(logits, r, E, K, escale, sel, w, route_s + (size_t)warp * (E + K));
    __threadfence();   /* this block's sel and w before its count */
    __syncthreads();
    if (threadIdx.x == 0) done_s = atomicAdd(cnt, 1u);
    __syncthreads();
    if (done_s != gridDim.x - 1) return;
    __threadfence();
    moe_dispatch_block(sel, R, K, E, ent_row, ent_slot, blk, nblk, (int *)route_s, capacity, load);
    if (threadIdx.x == 0) *cnt = 0;
}

/* The terms of one (pair, group) of a routed product under Q8 activations: the group's exact isum of the
 * weights wl (CPG uint4 words of output n) with the pair's input row xr (xq [][K], d / ad [][ng]), then
 * t = (s*d)*(float)isum and u = b*ad — the chain goes on as acc = (acc + t) + u; fused (the test-only
 * gpu-fma fault): t = fma(s*d, isum, b*ad), u = 0. */
template <int FMT, int CPG>
__device__ __forceinline__ void pair_group_terms(const uint4 (&wl)[CPG], float sc, float bi, const int8_t *__restrict__ xq,
                                                 const float *__restrict__ qd, const float *__restrict__ qad, int xr,
                                                 int K, int G, int ng, int g, int fused, float &t, float &u) {
    const int is = group_isum<FMT>(wl, CPG, xq + (size_t)xr * K + (size_t)g * G);
    const float sd = sc * qd[(size_t)xr * ng + g], uu = bi * qad[(size_t)xr * ng + g], fi = (float)is;
    if (fused) t = __fmaf_rn(sd, fi, uu), u = 0.0f;
    else t = sd * fi, u = uu;
}

/* The routed experts' products (matmul.h), one launch for every expert: Y_z[slot][n] = x · W_e^T for
 * each routed pair (row, slot) of expert e, z = blockIdx.z picking (mats0, Y0) or (mats1, Y1) (gate and
 * up read the same input). Block (blockIdx.x, blockIdx.y): the pairs of block row blk[blockIdx.y] (at
 * most MOE_CH), and NWARP tiles of 32 outputs, warp w taking tile blockIdx.x * NWARP + w (one output per
 * lane) for every pair of the block row: each group's weights are loaded once into registers and used
 * for all the pairs. Block rows past *nblk and tiles past the matrix do nothing. The input row of a pair:
 * in_by_slot ? its slot : its row, of X [][K] (F32 activations) or xq [][K], d / ad [][K/G] (Q8). Each
 * (pair, output) is one chain in matmul.h's order, as the product kernels compute it:
 *   Q8 activations, quantized weights: per group g ascending, isum exact (dp4a: group_isum), then
 *     acc = (acc + (s*d)*(float)isum) + b*ad (mm_q8_kernel's epilogue);
 *   otherwise: acc = acc + w*x over k ascending, w = s*(float)q + b or the float weight (mm_f32_kernel).
 * Each expert's weights are read by its block rows only (once when it has at most MOE_CH pairs); a
 * pair's numbers depend on its own input row alone. fused: the test-only gpu-fma fault. */
template <int FMT, int CPG>
__global__ void __launch_bounds__(256)
    moe_mm_kernel(const dmat *__restrict__ mats0, const dmat *__restrict__ mats1, float *Y0, float *Y1,
                  const int4 *__restrict__ blk, const int *__restrict__ nblk, const int32_t *__restrict__ ent_row,
                  const int32_t *__restrict__ ent_slot, int in_by_slot, const float *__restrict__ X,
                  const int8_t *__restrict__ xq, const float *__restrict__ qd, const float *__restrict__ qad, int q8,
                  int fused) {
    PDL_ENTER();
    if ((int)blockIdx.y >= *nblk) return;
    const int4 bk = blk[blockIdx.y];
    const dmat m = (blockIdx.z ? mats1 : mats0)[bk.x];
    float *Y = blockIdx.z ? Y1 : Y0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tile = blockIdx.x * NWARP + warp, n = tile * NT + lane, Np = m.Np, K = m.K;
    if (tile * NT >= Np) return;
    const int np = bk.z;   /* pairs of the block row, 1..MOE_CH */
    int xr[MOE_CH], slot[MOE_CH];
    float acc[MOE_CH];
#pragma unroll
    for (int p = 0; p < MOE_CH; p++) {
        acc[p] = 0.0f;
        slot[p] = p < np ? ent_slot[bk.y + p] : 0;
        xr[p] = p < np ? (in_by_slot ? slot[p] : ent_row[bk.y + p]) : 0;
    }
    if (q8 && FMT != IB_WF32) {
        /* GPI groups a round: their weights (CPG uint4 words a group, G = CPG * k per word) and scales
         * loaded first, so a warp has GPI * CPG words in flight */
        constexpr int GPI = CPG >= 8 ? 1 : CPG >= 4 ? 2 : 4;
        const int G = m.G, ng = m.ng;
        for (int g0 = 0; g0 < ng; g0 += GPI) {
            uint4 wl[GPI][CPG];
            float sc[GPI], bi[GPI];
#pragma unroll
            for (int x = 0; x < GPI; x++) {
                const int g = g0 + x;
                if (g >= ng) break;
#pragma unroll
                for (int c = 0; c < CPG; c++) wl[x][c] = m.w[(size_t)(g * CPG + c) * Np + n];
                sc[x] = m.s[(size_t)g * Np + n], bi[x] = m.b[(size_t)g * Np + n];
            }
#pragma unroll
            for (int x = 0; x < GPI; x++) {
                const int g = g0 + x;
                if (g >= ng) break;
#pragma unroll
                for (int p = 0; p < MOE_CH; p++) {
                    if (p >= np) break;
                    float t, u;
                    pair_group_terms<FMT, CPG>(wl[x], sc[x], bi[x], xq, qd, qad, xr[p], K, G, ng, g, fused, t, u);
                    acc[p] = (acc[p] + t) + u;
                }
            }
        }
    } else {
#pragma unroll
        for (int p = 0; p < MOE_CH; p++)
            if (p < np) acc[p] = f32_chain<FMT>(m, n, X + (size_t)xr[p] * K, fused);
    }
    if (n >= m.N) return;
#pragma unroll
    for (int p = 0; p < MOE_CH; p++)
        if (p < np) Y[(size_t)slot[p] * m.N + n] = acc[p];
}

/* moe_mm_kernel's Q8 products (Q8 activations, quantized weights) with each block's groups split over
 * its warps: block (blockIdx.x, blockIdx.y, blockIdx.z) takes the pairs of block row blk[blockIdx.y]
 * (at most MOE_CH) and the 32 outputs of tile blockIdx.x (a lane each) of matrix z. In each pass of
 * MOE_GC groups, warp w takes groups w and w + NWARP (both groups' weights, scales and biases loaded
 * first), and for every pair the group's exact isum (group_isum) and the terms t = (s*d)*(float)isum,
 * u = b*ad go to shared memory; then warp p continues pair p's chains over the pass's groups in
 * ascending order, acc = (acc + t) + u — moe_mm_kernel's numbers for every (pair, output), with K
 * walked by eight warps at once instead of one (the latency of a warp's walk over K was the kernel's
 * time). fused: the test-only gpu-fma fault (t = fma(s*d, isum, u), u = 0, as moe_mm_kernel). */
#define MOE_GC (2 * NWARP)
template <int FMT, int CPG>
__global__ void __launch_bounds__(256, CPG >= 4 ? 2 : 4)   /* 4 blocks a multiprocessor where 64 registers do */
    moe_mm_split_kernel(const dmat *__restrict__ mats0, const dmat *__restrict__ mats1, float *Y0, float *Y1,
                        const int4 *__restrict__ blk, const int *__restrict__ nblk, const int32_t *__restrict__ ent_row,
                        const int32_t *__restrict__ ent_slot, int in_by_slot, const int8_t *__restrict__ xq,
                        const float *__restrict__ qd, const float *__restrict__ qad, int fused) {
    PDL_ENTER();
    if ((int)blockIdx.y >= *nblk) return;
    __shared__ float t_s[MOE_CH][MOE_GC][NT], u_s[MOE_CH][MOE_GC][NT];
    const int4 bk = blk[blockIdx.y];
    const dmat m = (blockIdx.z ? mats1 : mats0)[bk.x];
    float *Y = blockIdx.z ? Y1 : Y0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = blockIdx.x * NT + lane, Np = m.Np, K = m.K, G = m.G, ng = m.ng;
    if ((int)blockIdx.x * NT >= Np) return;   /* the whole block: uniform */
    const int np = bk.z;   /* pairs of the block row, 1..MOE_CH */
    int xr[MOE_CH];
#pragma unroll
    for (int p = 0; p < MOE_CH; p++) xr[p] = p < np ? (in_by_slot ? ent_slot[bk.y + p] : ent_row[bk.y + p]) : 0;
    float acc = 0.0f;   /* pair `warp`, output n (warps < np) */
    for (int g0 = 0; g0 < ng; g0 += MOE_GC) {
        const int gn = min(MOE_GC, ng - g0);
        uint4 wl[2][CPG];
        float sc[2], bi[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const int gi = warp + x * NWARP, g = g0 + gi;
            if (gi >= gn) break;
            group_weights<CPG>(m, g, n, CPG, wl[x], sc[x], bi[x]);
        }
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const int gi = warp + x * NWARP, g = g0 + gi;
            if (gi >= gn) break;
#pragma unroll
            for (int p = 0; p < MOE_CH; p++) {
                if (p >= np) break;
                pair_group_terms<FMT, CPG>(wl[x], sc[x], bi[x], xq, qd, qad, xr[p], K, G, ng, g, fused, t_s[p][gi][lane],
                                           u_s[p][gi][lane]);
            }
        }
        __syncthreads();
        if (warp < np) {
#pragma unroll 4
            for (int gi = 0; gi < gn; gi++) acc = (acc + t_s[warp][gi][lane]) + u_s[warp][gi][lane];
        }
        __syncthreads();
    }
    if (warp < np && n < m.N) Y[(size_t)ent_slot[bk.y + warp] * m.N + n] = acc;
}

/* out[r][d] = ib_moe_combine of row r: 0, then out + w[j] * y[r*K + j][d] for ranks j in order with
 * sel >= 0 (mul, then add). One thread per (row, d); y [R*K][D]. Test-only, load != NULL (the
 * moe-combine-by-load fault, each expert's pairs in the step [E]): the same terms added in the step's
 * expert order instead (ib_moe_fault_load_order: descending load, ties to the lower id) — each next
 * term the row's pair of the smallest (E - load, id) after the last one's. */
__global__ void moe_combine_kernel(const float *__restrict__ y, const float *__restrict__ w, const int32_t *__restrict__ sel,
                                   int R, int K, int D, float *__restrict__ out, const int32_t *__restrict__ load) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * D) return;
    const int r = (int)(i / D), d = (int)(i % D);
    const int32_t *s = sel + (size_t)r * K;
    float o = 0.0f;
    if (!load) {
        for (int j = 0; j < K; j++) {
            if (s[j] < 0) continue;
            o = o + w[(size_t)r * K + j] * y[((size_t)r * K + j) * D + d];
        }
    } else {
        /* a row's experts are distinct, so the keys ((2^31 - 1 - load) << 32 | id) are too */
        long long last = -1;
        for (;;) {
            int jn = -1;
            long long kn = 0;
            for (int j = 0; j < K; j++) {
                if (s[j] < 0) continue;
                const long long kj = ((long long)(0x7fffffff - load[s[j]]) << 32) | (long long)s[j];
                if (kj > last && (jn < 0 || kj < kn)) jn = j, kn = kj;
            }
            if (jn < 0) break;
            o = o + w[(size_t)r * K + jn] * y[((size_t)r * K + jn) * D + d];
            last = kn;
        }
    }
    out[i] = o;
}

/* The per-layer inputs' second half and scale (cpu_ple_inputs after its product, scale and norm): per
 * element i of row r of PLI [R][LP]: b = (embed_tokens_per_layer row tok[r], element k, as
 * ib_matrix_row_f32 gives it) * escale (ib_scale), then PLI = PLI + b (ib_add), then PLI * s2
 * (ib_scale by (float)(1/sqrt(2))). */
__global__ void ple_combine_kernel(float *pli, dmat m, const int32_t *__restrict__ tok, int R, float escale, float s2) {
    PDL_ENTER();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * m.K) return;
    const int r = (int)(i / m.K), k = (int)(i % m.K);
    const float bt = weight_at(m, tok[r], k) * escale;
    const float a = pli[i] + bt;
    pli[i] = a * s2;
}

/* g[r][k] = ib_geglu_elem(g[r][k], pli[r][li*P + k]) for the R rows of g [R][P] (ib_geglu of the gate
 * with the layer's per-layer input); qG > 0: one warp per (row, group), the rows then quantized for
 * group qG into xq [R][P], qd / qad [R][P/qG] (as geglu_q8_kernel). */
__global__ void ple_geglu_kernel(float *g, const float *__restrict__ pli, int R, int P, int LP, int li, int qG,
                                 int8_t *__restrict__ xq, float *__restrict__ qd, float *__restrict__ qad) {
    PDL_ENTER();
    if (qG <= 0) {
        const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= (size_t)R * P) return;
        const int r = (int)(i / P), k = (int)(i % P);
        g[i] = ib_geglu_elem(g[i], pli[(size_t)r * LP + (size_t)li * P + k]);
        return;
    }
    const int wid = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int ng = P / qG;
    if (wid >= R * ng) return;
    const int r = wid / ng, gi = wid % ng;
    float *gp = g + (size_t)r * P + (size_t)gi * qG;
    const float *up = pli + (size_t)r * LP + (size_t)li * P + (size_t)gi * qG;
    for (int k = lane; k < qG; k += 32) gp[k] = ib_geglu_elem(gp[k], up[k]);
    __syncwarp();
    quantize_group(gp, qG, xq + (size_t)r * P + (size_t)gi * qG, qd + (size_t)r * ng + gi, qad + (size_t)r * ng + gi, lane);
}
