/*
 * attention_kernels.cuh — the CUDA backend's q/k preparation (head norms, RoPE, KV store) and attention
 * kernels (ib_attend_heads / ib_attend_policy's definitions, bit for bit: key blocks cut as the CPU
 * cuts them, online softmax in key order), included by cuda_backend.cu after its product, quantization
 * and norm kernels, whose helpers it uses: one block per (row, query head) or per (row, KV head),
 * decode's keys straight into registers or through a stage, a head spread over a cluster of blocks for
 * long contexts, and (attention_tile.cuh, included at the end) a prompt's rows attending in tiles. The
 * launch choices are cuda_backend.cu's; none changes a bit. docs/cuda.md has the picture and the
 * measurements.
 */

#include "backends/cuda/kv_element.cuh"

/* ---------------------------------------------------------------- kernels: RoPE + KV store, attention */

/* Slot of position pos in a cache kept as info says (ib_kv_desc_slot). */
__device__ __forceinline__ int slot_of(const rowinfo &ri, int pos) {
    if (ri.window <= 0 || pos < ri.sink) return pos;
    return ri.sink + (pos - ri.sink) % (ri.cap - ri.sink);
}

/* The head norm's factor 1/sqrt(ss/hd + eps) of head xs [hd] (shared memory), ss as ib_dot16 folds it
 * (lanes 0..15), in every lane of the warp. */
__device__ __forceinline__ float head_norm_factor(const float *xs, int hd, float eps, int lane) {
    const float a = sumsq16(xs, hd, lane);
    float rr = 0.0f;
    if (lane == 0) rr = 1.0f / sqrtf(a / (float)hd + eps);
    return __shfl_sync(0xffffffffu, rr, 0);
}

/* ib_rope's rotation of pair (i, i + half) of xs by (c, s): a*c - b*s, b*c + a*s, products rounded. */
__device__ __forceinline__ void rope_pair(float *xs, int i, int half, float c, float s) {
    const float a = xs[i], b = xs[i + half];
    xs[i] = a * c - b * s;
    xs[i + half] = b * c + a * s;
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
        const float rr = head_norm_factor(xs, hd, eps, lane);
        for (int i = lane; i < hd; i += 32) xs[i] = (xs[i] * rr) * w[i];
        __syncwarp();
    }
    if (rope) {
        for (int i = lane; i < half; i += 32) rope_pair(xs, i, half, t[2 * i], t[2 * i + 1]);
        __syncwarp();
    }
}

/* Store key head ks [hd] (shared memory) and value head vv [hd] of a row into its session's cache
 * (info) at layer li, KV head kh, slot(pos): floats as they are, halves rounded by ib_f32_to_f16, q8 by
 * blocks of 32 (kvq8_store_warp, codes up to 127 — 126 under the test-only kvq8-step-scale fault, as the
 * CPU applies it; hd a multiple of 32). By one warp. kmir != NULL: the key's stored bytes (of the cache's
 * type: a one-row plane) also into kmir and the value as floats (decoded from what was stored) into
 * vmir [hd] — shared memory, so the block reads them without a round trip through the cache. */
__device__ __forceinline__ void kv_store_warp(const rowinfo &info, int li, int KVH, int kh, int hd, const float *ks,
                                              const float *__restrict__ vv, int lane, void *kmir = NULL,
                                              float *vmir = NULL) {
    const size_t plane = (size_t)info.cap * hd, slot = (size_t)slot_of(info, info.pos);
    const size_t ko = (((size_t)li * 2 + 0) * KVH + kh) * plane + slot * hd;
    const size_t vo = (((size_t)li * 2 + 1) * KVH + kh) * plane + slot * hd;
    if (info.kvt == IB_KV_Q8) {
        const float qmax = info.kvq8_fault ? 126.0f : 127.0f;
        for (int i = lane; i < hd; i += 32) {   /* the whole warp a block at a time */
            kvq8_store_warp((unsigned char *)info.kv, ko + i - lane, ks[i], lane, qmax, (unsigned char *)kmir, i - lane);
            const float vd = kvq8_store_warp((unsigned char *)info.kv, vo + i - lane, vv[i], lane, qmax);
            if (kmir) vmir[i] = vd;
        }
        return;
    }
    for (int i = lane; i < hd; i += 32) {
        if (info.kvt == IB_KV_F16) {
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
    DYN_SHARED(float, hs);
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

/* What the direct path's two prologue warps read that no kernel of the step writes, loaded before the
 * wait for the previous kernel: warp 0 (the query head) and warp 1 (the key head) each hold, at lane
 * l, its head norm's weights w[k] = norm[l + 32k] (k < 4: hd <= 128) and the row's RoPE entries
 * t[2k], t[2k + 1] = cs[2i], cs[2i + 1] for the pair i = l + 32k (k < 2: i < hd/2). */
struct qk_pre {
    float w[4], t[4];
};

/* The direct path's qk_pre for row r (head dim hd <= 128), by threads 0..63; zeros elsewhere. */
__device__ __forceinline__ qk_pre qk_preload(const qk_fuse &fz, int r, int hd) {
    qk_pre p = {};
    const int lane = threadIdx.x & 31, x = threadIdx.x >> 5;
    if (!fz.K || x > 1 || hd > 128) return p;
    const float *w = fz.qn ? (x == 1 ? fz.kn : fz.qn) : NULL;
    const float *t = fz.cs + (size_t)r * hd;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int i = lane + 32 * k;
        if (w && i < hd) p.w[k] = w[i];
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int i = lane + 32 * k;
        if (i < hd / 2) p.t[2 * k] = t[2 * i], p.t[2 * k + 1] = t[2 * i + 1];
    }
    return p;
}

/* qk_fused_prologue for one query head h (nq = 1, hd <= 128) with the constants already in registers
 * (pre): warp 0 the query head into qs, warp 1 the key head into ks and stored with its value head,
 * which it stages in vs [hd] (shared scratch the block does not read before the closing barrier). Each
 * warp issues all its loads of the step's Q, K, V before any arithmetic. The same operations in the
 * same order as qk_head_warp and kv_store_warp (the norm's (x * r) * w, the rotation's products). */
__device__ __forceinline__ void qk_direct_prologue(const qk_fuse &fz, const float *__restrict__ Q, const rowinfo &info,
                                                   int r, int h, int kvh, int H, int KVH, int hd, int li, float *qs,
                                                   float *ks, float *vs, void *kmir, float *vmir, const qk_pre &pre) {
    const int lane = threadIdx.x & 31, x = threadIdx.x >> 5, half = hd / 2;
    if (x <= 1) {
        const bool key = x == 1;
        float *xs = key ? ks : qs;
        const float *src = key ? fz.K + ((size_t)r * KVH + kvh) * hd : Q + ((size_t)r * H + h) * hd;
        const float *vsrc = fz.V + ((size_t)r * KVH + kvh) * hd;
        float xv[4], vv[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int i = lane + 32 * k;
            xv[k] = i < hd ? src[i] : 0.0f;
            vv[k] = key && i < hd ? vsrc[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int i = lane + 32 * k;
            if (i < hd) {
                xs[i] = xv[k];
                if (key) vs[i] = vv[k];
            }
        }
        __syncwarp();
        if (fz.qn) {
            const float rr = head_norm_factor(xs, hd, fz.eps, lane);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int i = lane + 32 * k;
                if (i < hd) xs[i] = (xs[i] * rr) * pre.w[k];
            }
            __syncwarp();
        }
        if (r < fz.rope_rows) {
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int i = lane + 32 * k;
                if (i < half) rope_pair(xs, i, half, pre.t[2 * k], pre.t[2 * k + 1]);
            }
            __syncwarp();
        }
        if (key) kv_store_warp(info, li, KVH, kvh, hd, xs, vs, lane, kmir, vmir);
    }
    __syncthreads();
}

/* Lane u (0..15) of ib_dot16(q_h, key) for G query heads at once: a[h] sums elements u, u+16, … of
 * q_h * key in ascending order (q_h at q_s + h * hd, shared memory); the key's elements are loaded once
 * for all G heads, 8 loads issued before their products. */
template <typename T, int G>
__device__ __forceinline__ void dot16_lane_heads(float (&a)[G], const float *q_s, typename kv_read<T>::ptr key, int hd,
                                                 int u) {
    typedef kv_read<T> KR;
#pragma unroll
    for (int h = 0; h < G; h++) a[h] = 0.0f;
    for (int i0 = 0; i0 < hd; i0 += 128) {
        typename KR::elem raw[8];   /* every load issued before any conversion (a half's conversion may branch) */
        float k[8];
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int i = i0 + u + 16 * t;
            raw[t] = i < hd ? KR::ld(key, i) : KR::zero();
        }
#pragma unroll
        for (int t = 0; t < 8; t++) k[t] = KR::cvt(raw[t]);
#pragma unroll
        for (int t = 0; t < 8; t++)
            if (i0 + u + 16 * t < hd)
#pragma unroll
                for (int h = 0; h < G; h++) a[h] = a[h] + q_s[h * hd + i0 + u + 16 * t] * k[t];
    }
}

/* Lane u (0..15) of ib_dot16(q, key): dot16_lane_heads for one head. */
template <typename T>
__device__ __forceinline__ float dot16_lane(const float *q_s, typename kv_read<T>::ptr key, int hd, int u) {
    float a[1];
    dot16_lane_heads<T, 1>(a, q_s, key, hd, u);
    return a[0];
}

/* The value pass of one chunk for the block's W output elements out[e] (shared memory; element e belongs
 * to head e / hd, dimension e % hd): per key block k in order o = o * c[k], then o = o + p_j * v_j over the
 * block's keys in order (v_j = vp[slot[j] * ld + d]; loads issued 16 keys at a time before their
 * products) — the reference's operations in its order. A thread takes NG chains at a time: dimension d
 * of NG consecutive heads, so each value element is loaded once for them (NG = 1: a thread per element;
 * NG = G: a thread per dimension for all the query heads of a KV head). pw [heads][pws], c [heads][cs];
 * bt0 [nbk + 1] the blocks' first keys, then the chunk's size. A value's element index slot * ld + d is
 * formed in 32 bits (one multiply-add a key, then one wide address step: the 64-bit form took about
 * seven instructions a key, more than the chain's own): vp is a plane of fewer than 2^32 elements
 * (cuda_kv_create refuses larger ones). Ends with a barrier. */
template <typename T, int NG = 1>
__device__ void value_pass(float *out, int W, typename kv_read<T>::ptr vp, const int *slot, const float *pw, int pws,
                           const float *c, int cs, const int *bt0, int nbk, int hd, int ld) {
    typedef kv_read<T> KR;
    for (int e = threadIdx.x; e < W / NG; e += blockDim.x) {
        const int h0 = e / hd * NG, d = e % hd;
        float o[NG];
#pragma unroll
        for (int g = 0; g < NG; g++) o[g] = out[(h0 + g) * hd + d];
        for (int k = 0; k < nbk; k++) {
#pragma unroll
            for (int g = 0; g < NG; g++) o[g] = o[g] * c[(size_t)(h0 + g) * cs + k];
            int j = bt0[k];
            const int je = bt0[k + 1];
            for (; j + 16 <= je; j += 16) {
                typename KR::elem raw[16];
                float v[16];
#pragma unroll
                for (int t = 0; t < 16; t++) raw[t] = KR::ld(vp, (size_t)((unsigned)slot[j + t] * (unsigned)ld + (unsigned)d));
#pragma unroll
                for (int t = 0; t < 16; t++) v[t] = KR::cvt(raw[t]);
#pragma unroll
                for (int t = 0; t < 16; t++)
#pragma unroll
                    for (int g = 0; g < NG; g++) o[g] = o[g] + pw[(size_t)(h0 + g) * pws + j + t] * v[t];
            }
            for (; j + 4 <= je; j += 4) {
                typename KR::elem raw[4];
                float v[4];
#pragma unroll
                for (int t = 0; t < 4; t++) raw[t] = KR::ld(vp, (size_t)((unsigned)slot[j + t] * (unsigned)ld + (unsigned)d));
#pragma unroll
                for (int t = 0; t < 4; t++) v[t] = KR::cvt(raw[t]);
#pragma unroll
                for (int t = 0; t < 4; t++)
#pragma unroll
                    for (int g = 0; g < NG; g++) o[g] = o[g] + pw[(size_t)(h0 + g) * pws + j + t] * v[t];
            }
            for (; j < je; j++) {
                const float v = KR::cvt(KR::ld(vp, (size_t)((unsigned)slot[j] * (unsigned)ld + (unsigned)d)));
#pragma unroll
                for (int g = 0; g < NG; g++) o[g] = o[g] + pw[(size_t)(h0 + g) * pws + j] * v;
            }
        }
#pragma unroll
        for (int g = 0; g < NG; g++) out[(h0 + g) * hd + d] = o[g];
    }
    __syncthreads();
}

/* The scores of one chunk for the G query heads of a KV head: sc[h * nc + j] = scale * ib_dot16(q_h,
 * key j) (q_h at q + h * hd, key j at kp + slot[j] * hd), by 16-thread groups that each take 4 / G keys
 * a round and make every head's score of a key from one load of it (dot16_lane_heads, folded 8, 4, 2, 1
 * as the per-pair loop in attend_row_kvhead folds). Every group runs the same number of rounds, so the
 * shuffles see whole warps. No barrier. */
template <typename T, int G>
__device__ __forceinline__ void kvhead_scores_grouped(float *sc, const float *q, typename kv_read<T>::ptr kp,
                                                      const int *slot, int nc, int hd, float scale) {
    constexpr int KX = 4 / G;
    const int tid = threadIdx.x, grp = tid >> 4, u = tid & 15, ngrp = blockDim.x >> 4;
    for (int j0 = 0; j0 < nc; j0 += KX * ngrp) {
        float a[KX][G];
#pragma unroll
        for (int x = 0; x < KX; x++) {
            const int j = j0 + x * ngrp + grp;
            if (j < nc) dot16_lane_heads<T, G>(a[x], q, kp + (size_t)slot[j] * hd, hd, u);
            else
#pragma unroll
                for (int h = 0; h < G; h++) a[x][h] = 0.0f;
        }
#pragma unroll
        for (int w = 8; w >= 1; w >>= 1)
#pragma unroll
            for (int x = 0; x < KX; x++)
#pragma unroll
                for (int h = 0; h < G; h++) {
                    const float o = __shfl_down_sync(0xffffffffu, a[x][h], w, 16);
                    if (u < w) a[x][h] = a[x][h] + o;
                }
#pragma unroll
        for (int x = 0; x < KX; x++) {
            const int j = j0 + x * ngrp + grp;
            if (u == 0 && j < nc)
#pragma unroll
                for (int h = 0; h < G; h++) sc[h * nc + j] = a[x][h] * scale;
        }
    }
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
__device__ __forceinline__ void prefetch_values_l1(typename kv_read<T>::ptr vp, const int *slot, int nc, int hd, int t,
                                                   int nt) {
    typedef kv_read<T> KR;
    const int lines = (int)((KR::bytes(hd) + 127) / 128);
    for (int i = t; i < nc * lines; i += nt) prefetch_l1(KR::addr(vp + (size_t)slot[i / lines] * hd) + 128 * (i % lines));
}

/* Stage a chunk: key and value rows slot[j] (hd elements of T) of the cache planes kp, vp as floats
 * into stk, stv [nc][ld] (shared memory; ld a multiple of 4), each element exactly to_f32 of the cache
 * (a float is copied as it is). All threads, each keeping one 16-byte column of the rows (the block's
 * threads a multiple of a row's pieces), eight loads in flight each. */
template <typename T>
__device__ __forceinline__ void stage_rows_f32(float *stk, float *stv, typename kv_read<T>::ptr kp,
                                               typename kv_read<T>::ptr vp, const int *slot, int nc, int hd, int ld) {
    typedef kv_read<T> KR;
    constexpr int E = KR::E;   /* elements per piece */
    const int pieces = hd / E;   /* pieces of a row: they divide the block's threads */
    /* each thread one 16-byte column of rows r0, r0 + rstep, …: rows < nc keys, then values */
    const int col = (int)threadIdx.x % pieces, rstep = (int)blockDim.x / pieces, rows = 2 * nc;
    for (int r0 = (int)threadIdx.x / pieces; r0 < rows; r0 += 8 * rstep) {
        typename KR::piece w[8];
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int rr = r0 + t * rstep, isv = rr >= nc;
            if (rr < rows) w[t] = KR::load((isv ? vp : kp) + (size_t)slot[rr - isv * nc] * hd + col * E);
        }
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int rr = r0 + t * rstep, isv = rr >= nc;
            if (rr >= rows) break;
            KR::to_f32s(w[t], (isv ? stv : stk) + (size_t)(rr - isv * nc) * ld + col * E);
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


/* A float's order as an int: for floats a, b that are not NaN, a < b exactly when max_order(a) <
 * max_order(b) — non-negative floats keep their bits, negative ones have the low 31 bits flipped — except
 * that -0 orders just below +0. max_unorder undoes it. So a maximum found by atomicMax on these ints, in
 * any order, is the reference's compare-and-keep maximum, bit for bit, but for the sign of a zero
 * maximum (+0 where the reference could keep -0; no score is -0, as a score's dot chain starts at +0,
 * and every use gives the same bits for either: comparisons, exp(s - m), exp(m - m')). */
__device__ __forceinline__ int max_order(float f) {
    const int i = __float_as_int(f);
    return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float max_unorder(int i) { return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff); }

/* The reference's running max after key block k of a chunk that starts from m = -inf: m'_k = max(m'_{k-1},
 * block max k), from bmo [k + 1] (each block's maximum as max_order ints; the same maxima as floats);
 * k = -1 gives -inf. */
__device__ __forceinline__ float chained_max(const int *bmo, int k) {
    int mr = max_order(-INFINITY);
    for (int i = 0; i <= k; i++) mr = max(mr, bmo[i]);
    return max_unorder(mr);
}

/* Shared memory of a per-head attention block. */
struct __align__(16) att_smem1 {   /* 16-byte aligned: the direct path reads a key row of sm.slot by 16-byte pieces */
    float q[IB_ATTN_MAX_HD], out[IB_ATTN_MAX_HD];
    float sc[ATT_CHUNK], pw[ATT_CHUNK], mk[ATT_CHUNK];
    int slot[ATT_CHUNK];
    int bt0[ATT_MAX_BLOCKS + 1];   /* chunk index of each key block's first key, then the chunk's size */
    float c[ATT_MAX_BLOCKS];       /* each key block's rescale factor */
    float bm[ATT_MAX_BLOCKS];      /* block_maxima_par's scratch */
    int bmo[ATT_MAX_BLOCKS];       /* the direct path's key-block maxima as max_order ints (full sessions) */
    float l, m;                    /* the running sum (at the end), the running max */
};

/* sc[j] = dot16(q, key j) * scale for nc keys, key j at kc + sm.slot[j] * ld (the cache, or a stage with
 * identity slots): 16 threads per key own ib_dot16's lanes and fold them 8, 4, 2, 1; four keys per group
 * per round, every group the same number of rounds (whole warps in the shuffles). */
template <typename T>
__device__ __forceinline__ void head_scores(att_smem1 &sm, float *sc, typename kv_read<T>::ptr kc, int nc, int ld, int hd,
                                            float scale) {
    const int grp = threadIdx.x >> 4, u = threadIdx.x & 15, ngrp = blockDim.x >> 4;
    for (int j0 = 0; j0 < nc; j0 += 4 * ngrp) {
        float a[4];
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int j = j0 + x * ngrp + grp;
            a[x] = j < nc ? dot16_lane<T>(sm.q, kc + (size_t)sm.slot[j] * ld, hd, u) : 0.0f;
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

/* Stage this block's part of a chunk split over a cluster: the chunk's key rows [k0, k1) whole (slot[j]'s
 * hd elements of T of the cache plane kp) into stk [k1 - k0][ldk], and the value columns [d0, d0 + dc)
 * of all nc rows (plane vp) into stv [nc][dc], as floats, each element exactly to_f32 of the cache. All
 * threads, a 16-byte piece each per round (hd, dc multiples of a piece's elements), eight loads in
 * flight each. */
template <typename T>
__device__ __forceinline__ void stage_split_f32(float *stk, int ldk, float *stv, typename kv_read<T>::ptr kp,
                                                typename kv_read<T>::ptr vp, const int *slot, int k0, int k1, int nc,
                                                int hd, int d0, int dc) {
    typedef kv_read<T> KR;
    constexpr int E = KR::E;   /* elements per piece */
    const int pk = hd / E, pv = dc / E, nkp = (k1 - k0) * pk, total = nkp + nc * pv, nt = (int)blockDim.x;
    for (int i0 = (int)threadIdx.x; i0 < total; i0 += 8 * nt) {
        typename KR::piece w[8];
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int i = i0 + t * nt, iv = i - nkp;
            if (i < nkp) w[t] = KR::load(kp + (size_t)slot[k0 + i / pk] * hd + (i % pk) * E);
            else if (i < total) w[t] = KR::load(vp + (size_t)slot[iv / pv] * hd + d0 + (iv % pv) * E);
        }
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int i = i0 + t * nt, iv = i - nkp;
            if (i >= total) break;
            KR::to_f32s(w[t], i < nkp ? stk + (size_t)(i / pk) * ldk + (i % pk) * E
                                      : stv + (size_t)(iv / pv) * dc + (iv % pv) * E);
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
 * the reference's operations, in its order, staged, split or not. T: float, half or q8 KV; SPLIT: sp.cl > 1
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
    typedef kv_read<T> KR;
    const int pieces = hd / KR::E;   /* stage_rows_f32's columns */
    const bool staged = kpc >= block && hd % KR::E == 0 &&
                        (cl == 1 ? (int)blockDim.x % pieces == 0 : dc % KR::E == 0);
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
    const typename kv_read<T>::ptr kp = kv_read<T>::at(info.kv, (((size_t)li * 2 + 0) * KVH + kvh) * plane);
    const typename kv_read<T>::ptr vp = kv_read<T>::at(info.kv, (((size_t)li * 2 + 1) * KVH + kvh) * plane);
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
            stage_split_f32<T>(stk, ld, stv, kp, vp, sm.slot, k0, k1, nc, hd, d0, dc);
            __syncthreads();
            for (int j = tid; j < nc; j += blockDim.x) sm.slot[j] = j;
            __syncthreads();
            ATT_MARK(3);
            /* xs is written once every block has read the previous chunk's (its arrive after that) */
            if (nchunk > 0) cluster_wait();
            head_scores<float>(sm, xs + k0, (const float *)stk, k1 - k0, ld, hd, scale);
            __syncthreads();
            cluster_arrive();
            cluster_wait();
            for (int j = tid; j < nc; j += blockDim.x) sm.sc[j] = ld_cluster(xs + j, j / nck);
            __syncthreads();
            cluster_arrive();
        } else if (staged) {
            stage_rows_f32<T>(stk, stv, kp, vp, sm.slot, nc, hd, ld);
            __syncthreads();
            /* the stage's rows are the chunk's in order */
            for (int j = tid; j < nc; j += blockDim.x) sm.slot[j] = j;
            __syncthreads();
            ATT_MARK(3);
            head_scores<float>(sm, sm.sc, (const float *)stk, nc, ld, hd, scale);
        } else {
            ATT_MARK(3);
            head_scores<T>(sm, sm.sc, kp, nc, hd, hd, scale);
        }
        __syncthreads();
        ATT_MARK(4);
        block_maxima_par(sm.sc, sm.mk, sm.c, sm.bt0, nbk, &sm.m, sm.bm);
        if (tid >= 32 && !staged) prefetch_values_l1<T>(vp, sm.slot, nc, hd, tid - 32, (int)blockDim.x - 32);
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
        if (staged) value_pass<float>(sm.out + e0, ne, (const float *)stv, sm.slot, sm.pw, 0, sm.c, 0, sm.bt0, nbk, ne, ldv);
        else value_pass<T>(sm.out, hd, vp, sm.slot, sm.pw, 0, sm.c, 0, sm.bt0, nbk, hd, hd);
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
 * element 16 t + DL v of each of the key's hd / 16 segments t. q8: 8 lanes, 8 codes and their block's
 * scale a segment. */
template <typename T>
struct direct_lanes {
    static constexpr int DL = 16 / (int)sizeof(T), DTPK = 16 / DL;
};
template <>
struct direct_lanes<kvq8> {
    static constexpr int DL = 8, DTPK = 2;
};
#define DIRECT_SEGS 8   /* most 16-element segments of a key the direct path holds (hd <= 128) */

/* Thread v's pieces of the key row `key` (hd elements of T) into kr [hd / 16]. */
template <typename T>
__device__ __forceinline__ void direct_key_load(uint4 (&kr)[DIRECT_SEGS], typename kv_read<T>::ptr key, int v, int nseg) {
    constexpr int DL = direct_lanes<T>::DL;
#pragma unroll
    for (int t = 0; t < DIRECT_SEGS; t++)
        if (t < nseg) kr[t] = *(const uint4 *)(key + 16 * t + DL * v);
}

/* The q8 form: segment t's 8 codes of thread v (elements 16 t + 8 v ..: bytes (t / 2) * 36 + (t % 2) * 16 +
 * 8 v of the row, 4-byte aligned) into kr[t].x, .y and its block's scale's bits into .z (.w unused). The
 * row's first element is a multiple of 32 (a cache row, or the prologue's mirror of one). */
template <>
__device__ __forceinline__ void direct_key_load<kvq8>(uint4 (&kr)[DIRECT_SEGS], kvq8_ptr key, int v, int nseg) {
    const unsigned char *row = key.b + ib_kvq8_offset(key.e);
#pragma unroll
    for (int t = 0; t < DIRECT_SEGS; t++)
        if (t < nseg) {
            const unsigned char *blk = row + (t >> 1) * IB_KVQ8_BLOCK_BYTES;
            const unsigned *w = (const unsigned *)(blk + (t & 1) * 16 + 8 * v);
            kr[t] = make_uint4(w[0], w[1], *(const unsigned *)(blk + IB_KVQ8_BLOCK), 0u);
        }
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
            if constexpr (kv_is_q8<T>::value) {
                const float sc = __uint_as_float(kr[t].z);
#pragma unroll
                for (int e = 0; e < DL; e++) k[e] = kvq8_value(sc, (int)(signed char)((e < 4 ? kr[t].x : kr[t].y) >> (8 * (e & 3))));
            } else if constexpr (sizeof(T) == 2) halves8_regs(kr[t], *(float(*)[8])k);
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
__device__ __forceinline__ void stage_value_rows(float *vst, typename kv_read<T>::ptr vp, const rowinfo &info,
                                                 const key_chunk &ch, int hd, int n, int t, int nt) {
    typedef kv_read<T> KR;
    constexpr int E = KR::E;
    const int rp = hd / E, col = t % rp, rstep = nt / rp;   /* pieces a row; this thread's column, row step */
    const typename KR::ptr src = vp + col * E;
    float *dst = vst + col * E;
    for (int j0 = t / rp; j0 < n; j0 += VSTAGE_LOADS * rstep) {
        typename KR::piece w[VSTAGE_LOADS];
#pragma unroll
        for (int k = 0; k < VSTAGE_LOADS; k++) {
            const int j = j0 + k * rstep;
            if (j < n) w[k] = KR::load(src + (size_t)slot_of(info, chunk_pos(ch, j)) * hd);
        }
#pragma unroll
        for (int k = 0; k < VSTAGE_LOADS; k++) {
            const int j = j0 + k * rstep;
            if (j < n) KR::to_f32s(w[k], dst + (size_t)j * hd);
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
 * come from the registers (direct_score), then attend_row_head's phases: the key blocks' maxima (a full
 * session's found as the scores are made, by atomicMax on max_order ints, each thread then chaining them
 * up to its key's block: no barrier or serial chain between the scores and p_j; a windowed one's by
 * block_maxima_par), p_j, one thread's l, the value pass over the stage (value_pass_stage), out / l.
 * Every score, maximum, p, l and output is made by the same operations in the same order as
 * attend_row_head's. */
template <typename T>
__device__ bool attend_row_head_direct(att_smem1 &sm, const float *__restrict__ Q, float *__restrict__ ATT,
                                       const rowinfo &info, int r, int h, int H, int KVH, int hd, int li, float scale,
                                       int block, int qG, int8_t *__restrict__ xq, float *__restrict__ qd,
                                       float *__restrict__ qad, unsigned char *stage, int stage_bytes,
                                       const qk_fuse &fz, const qk_pre &pre) {
    constexpr int DTPK = direct_lanes<T>::DTPK, E = kv_read<T>::E;
    const int nseg = hd / 16, tid = threadIdx.x, p = info.pos;
    if (!stage || hd % 16 != 0 || nseg > DIRECT_SEGS || hd >= (int)blockDim.x || 64 % (hd / E) != 0 ||
        ((int)blockDim.x - 64) % (hd / E) != 0)
        return false;
    key_chunk ch;
    const bool full = info.window <= 0;
    if (full) {
        /* a full session: next_chunk's walk in closed form (positions 0 .. p, blocks cut at multiples of
         * block; one chunk when they fit) — a serial walk here is a long chain of dependent instructions */
        const int nk = p + 1, nb = p / block + 1;
        if (nk > ATT_CHUNK || nb > ATT_MAX_BLOCKS || (long)nk * hd * (long)sizeof(float) > stage_bytes) return false;
        for (int k = tid; k <= nb; k += blockDim.x) {
            sm.bt0[k] = k < nb ? k * block : nk;
            if (k < nb) sm.bmo[k] = max_order(-INFINITY);
        }
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
    const typename kv_read<T>::ptr kp = kv_read<T>::at(info.kv, (((size_t)li * 2 + 0) * KVH + kvh) * plane);
    const typename kv_read<T>::ptr vp = kv_read<T>::at(info.kv, (((size_t)li * 2 + 1) * KVH + kvh) * plane);
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
    const typename kv_read<T>::ptr kpos = kv_read<T>::at(sm.slot, 0);
    if (fused) qk_direct_prologue(fz, Q, info, r, h, kvh, H, KVH, hd, li, sm.q, sm.out, sm.pw, sm.slot, vst + (size_t)(nc - 1) * hd, pre);
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
        if (v == 0 && j < nc) {
            sm.sc[j] = sc;
            /* a full session's key block j / block: its maximum as the reference's strided compare
             * finds it (a NaN never wins; a block of only NaN keeps -inf) */
            if (full && sc == sc) atomicMax(&sm.bmo[j / block], max_order(sc));
        }
    }
    __syncthreads();
    ATT_MARK(4);
    if (full) {
        ATT_MARK(5);   /* (the maxima were found with the scores) */
        /* the reference's chain m'_k = max(m'_{k-1}, block max k) from m = -inf, taken by each thread up to
         * the block it needs (as ints: the same maxima); p_j = exp(s_j - m'_{block of j}); the last nbk
         * threads each make one block's c[k] = exp(m'_{k-1} - m'_k) */
        for (int j = tid; j < nc; j += blockDim.x) sm.pw[j] = ib_expf_lane(sm.sc[j] - chained_max(sm.bmo, j / block));
        const int kc = tid - ((int)blockDim.x - nbk);
        if (kc >= 0) sm.c[kc] = ib_expf_lane(chained_max(sm.bmo, kc - 1) - chained_max(sm.bmo, kc));
    } else {
        block_maxima_par(sm.sc, sm.mk, sm.c, sm.bt0, nbk, &sm.m, sm.bm);
        __syncthreads();
        ATT_MARK(5);
        for (int j = tid; j < nc; j += blockDim.x) sm.pw[j] = ib_expf_lane(sm.sc[j] - sm.mk[j]);
    }
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
    const ib_kv_dtype t = (ib_kv_dtype)info.kvt;
    const size_t plane = ib_kv_bytes(t, (size_t)info.cap * hd);
    int n = info.pos + 1 < info.cap ? info.pos + 1 : info.cap;
    if (n > ATT_CHUNK) n = ATT_CHUNK;
    const char *kp = (const char *)info.kv + (((size_t)li * 2 + 0) * KVH + kvh) * plane;
    const char *vp = (const char *)info.kv + (((size_t)li * 2 + 1) * KVH + kvh) * plane;
    prefetch_bytes(kp, ib_kv_bytes(t, (size_t)n * hd));
    prefetch_bytes(vp, ib_kv_bytes(t, (size_t)n * hd));
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
    DYN_SHARED_ALIGNED(unsigned char, att_stage);
    unsigned char *st = stage_bytes > 0 ? att_stage : NULL;
    if (info.kvt == IB_KV_F16) attend_row_head<uint16_t, SPLIT>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, sp, fz);
    else if (info.kvt == IB_KV_Q8) attend_row_head<kvq8, SPLIT>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, sp, fz);
    else attend_row_head<float, SPLIT>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, sp, fz);
}

/* attention_head_kernel<false>'s work for steps whose rows all keep T (float, half or q8) KV: each block
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
    const qk_pre pre = qk_preload(fz, r, hd);
    PDL_ENTER();
    ATT_MARK(9);
    __shared__ att_smem1 sm;
    DYN_SHARED_ALIGNED(unsigned char, att_stage);
    unsigned char *st = stage_bytes > 0 ? att_stage : NULL;
#ifdef IB_CUDA_ATT_TRACE
    if (att_trace_twice && li == 3) {   /* idempotent: the same stores and outputs twice */
        attend_row_head_direct<T>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, fz, pre);
        __syncthreads();
        ATT_MARK(0);
    }
#endif
    if (!attend_row_head_direct<T>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes, fz, pre))
        attend_row_head<T, false>(sm, Q, ATT, info, r, h, H, KVH, hd, li, scale, block, qG, xq, qd, qad, st, stage_bytes,
                                  att_split{1, 0}, fz);
}

/* The direct attention kernel for rows that all keep KV type kvt, in wide blocks (ATT_THREADS_WIDE) or not. */
typedef void (*direct_attention_fn)(const float *, float *, const rowinfo *, int, int, int, int, float, int, int, int8_t *,
                                    float *, float *, int, qk_fuse);
static inline direct_attention_fn direct_attention_kernel_for(ib_kv_dtype kvt, int wide) {
    if (kvt == IB_KV_F16) return wide ? attention_direct_kernel<uint16_t, ATT_THREADS_WIDE> : attention_direct_kernel<uint16_t, ATT_THREADS>;
    if (kvt == IB_KV_Q8) return wide ? attention_direct_kernel<kvq8, ATT_THREADS_WIDE> : attention_direct_kernel<kvq8, ATT_THREADS>;
    return wide ? attention_direct_kernel<float, ATT_THREADS_WIDE> : attention_direct_kernel<float, ATT_THREADS>;
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
 * out / l. Exactly the reference's operations, in its order, for each head. T: float, half or q8 KV. */
template <typename T>
__device__ void attend_row_kvhead(att_smem &sm, const float *__restrict__ Q, float *__restrict__ ATT,
                                  const rowinfo &info, int r, int kvh, int H, int KVH, int hd, int li, float scale,
                                  int block, int qG, int8_t *__restrict__ xq, float *__restrict__ qd,
                                  float *__restrict__ qad, const qk_fuse &fz, int grouping) {
    const int G = H / KVH, tid = threadIdx.x, grp = tid >> 4, u = tid & 15, ngrp = blockDim.x >> 4;
    const int gw = G * hd;
    if (fz.K) qk_fused_prologue(fz, Q, info, r, kvh * G, G, kvh, H, KVH, hd, li, sm.q, sm.out);
    for (int e = tid; e < gw; e += blockDim.x) {
        if (!fz.K) sm.q[e] = Q[((size_t)r * H + (size_t)kvh * G) * hd + e];
        sm.out[e] = 0.0f;
    }
    const size_t plane = (size_t)info.cap * hd;
    const typename kv_read<T>::ptr kp = kv_read<T>::at(info.kv, (((size_t)li * 2 + 0) * KVH + kvh) * plane);
    const typename kv_read<T>::ptr vp = kv_read<T>::at(info.kv, (((size_t)li * 2 + 1) * KVH + kvh) * plane);
    const int p = info.pos;
    int S, lo;
    attended_ranges(info, S, lo);
    const int ra[2] = {0, lo}, rb[2] = {S, p + 1};
    const int chunk = ATT_QH / G < ATT_CHUNK ? ATT_QH / G : ATT_CHUNK;
    /* warp h (h < G, then h + warps): head h's running max (sm.m[h]); thread lbase + h: its running sum
     * (threads without value-pass work when there are enough) */
    /* 2 or 4 query heads a KV head: the grouped passes (each key and value element loaded once for them
     * all; a thread per value element d); else a (pair, element) at a time */
    const int grouped = grouping && (G == 2 || G == 4) ? G : 0;
    const int busy = grouped ? hd : gw;   /* threads with value-pass work */
    const int lbase = busy + G <= (int)blockDim.x ? (int)blockDim.x - G : 0;
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
        if (grouped == 2) kvhead_scores_grouped<T, 2>(sm.sc, sm.q, kp, sm.slot, nc, hd, scale);
        else if (grouped == 4) kvhead_scores_grouped<T, 4>(sm.sc, sm.q, kp, sm.slot, nc, hd, scale);
        else for (int e0 = 0; e0 < npair; e0 += 4 * ngrp) {
            float a[4];
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int e = e0 + x * ngrp + grp;
                a[x] = e < npair ? dot16_lane<T>(sm.q + (size_t)(e / nc) * hd, kp + (size_t)sm.slot[e % nc] * hd, hd, u)
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
            if (G < nwarp && warp >= G) prefetch_values_l1<T>(vp, sm.slot, nc, hd, tid - 32 * G, (int)blockDim.x - 32 * G);
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
        if (grouped == 2) value_pass<T, 2>(sm.out, gw, vp, sm.slot, sm.pw, nc, sm.c, ATT_MAX_BLOCKS, sm.bt0, nbk, hd, hd);
        else if (grouped == 4) value_pass<T, 4>(sm.out, gw, vp, sm.slot, sm.pw, nc, sm.c, ATT_MAX_BLOCKS, sm.bt0, nbk, hd, hd);
        else value_pass<T>(sm.out, gw, vp, sm.slot, sm.pw, nc, sm.c, ATT_MAX_BLOCKS, sm.bt0, nbk, hd, hd);
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

/* One block per (row, KV head): attend_row_kvhead for the row's KV dtype; qG as attention_head_kernel;
 * grouping: 1 for the grouped score and value passes where G is 2 or 4 (IB_CUDA_ATT_GROUPED=0: 0). The
 * step's last row takes the first blocks: a prompt's later rows attend more keys, so its longest blocks
 * start first and its short ones fill the last wave (which block computes a row never changes a number). */
__global__ void __launch_bounds__(ATT_THREADS, 4) attention_kernel(const float *__restrict__ Q, float *__restrict__ ATT,
                                                                const rowinfo *__restrict__ ri, int H, int KVH, int hd,
                                                                int li, float scale, int block, int qG,
                                                                int8_t *__restrict__ xq, float *__restrict__ qd,
                                                                float *__restrict__ qad, qk_fuse fz, int grouping) {
    const int r = (int)(gridDim.x / KVH) - 1 - (int)blockIdx.x / KVH, kvh = blockIdx.x % KVH;
    const rowinfo info = ri[r];   /* uploaded before the step's first kernel */
    prefetch_kv(info, li, KVH, kvh, hd);
    PDL_ENTER();
    __shared__ att_smem sm;
    if (info.kvt == IB_KV_F16) attend_row_kvhead<uint16_t>(sm, Q, ATT, info, r, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad, fz, grouping);
    else if (info.kvt == IB_KV_Q8) attend_row_kvhead<kvq8>(sm, Q, ATT, info, r, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad, fz, grouping);
    else attend_row_kvhead<float>(sm, Q, ATT, info, r, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad, fz, grouping);
}

#include "backends/cuda/attention_tile.cuh"
