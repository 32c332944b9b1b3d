/*
 * attention_tile.cuh — attention for a prompt's rows in tiles of one session's consecutive rows, each
 * key block read once for all of a tile's (row, query head) vectors: ib_attend_heads' definition bit for
 * bit. Included by attention_kernels.cuh; it uses the includer's ATT_THREADS, PDL_ENTER, rowinfo
 * (rowinfo.cuh), the KV element conversions (kv_element.cuh) and quantize_span (quantize_group.cuh).
 */
#ifndef IB_BACKENDS_CUDA_ATTENTION_TILE_CUH
#define IB_BACKENDS_CUDA_ATTENTION_TILE_CUH

#include "core/fmath.h"

/* ---------------------------------------------------------------- attention: tiles of a prompt's rows */

#define TILE_ROWS 16        /* most rows of one session per block of attention_tile_kernel (TILE_QV / G at most) */
#define TILE_QV 32          /* most (row, query head) vectors of such a block: its rows x G */
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
 * is staged in shared memory once (as floats, exactly as the host decodes them) for all the tile's vectors, instead of
 * once per row. For each vector whose row reaches the block (pos >= kb*block) over the block's keys it
 * sees (those <= pos), in the reference's order: every score s_j = dot16(q, k_j) * scale (16 threads own
 * ib_dot16's lanes, each a micro-tile of 2 vectors x 4 keys, folded 8, 4, 2, 1); m' = max(m, the block's
 * max), c = exp(m - m'); p_j = exp(s_j - m'); l = l*c then l += p_j in key order (one thread a vector);
 * out = out*c then out += p_j * v_j in key order (a thread per (vector, element) chain, kept in
 * registers); finally out / l. The same operations as attend_row_head and attend_row_kvhead, so the same
 * bits. qG > 0: each (row, head) output also quantized for group qG into xq/qd/qad. T: float, half or q8 KV.
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
    typedef kv_read<T> KR;
    const typename KR::ptr kp = KR::at(info.kv, (((size_t)li * 2 + 0) * KVH + kvh) * plane);
    const typename KR::ptr vp = KR::at(info.kv, (((size_t)li * 2 + 1) * KVH + kvh) * plane);
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
        /* stage the block's keys and values as floats: pieces (kv_read), eight loads a thread in flight
         * before their conversions (each element exactly the host's decoding) */
        {
            constexpr int E = KR::E;   /* elements a piece */
            const int pr = hd / E, total = 2 * nk * pr;
            for (int i0 = tid; i0 < total; i0 += 8 * nt) {
                typename KR::piece w[8];
#pragma unroll
                for (int x = 0; x < 8; x++) {
                    const int i = i0 + x * nt, isv = i >= nk * pr, ii = i - isv * nk * pr;
                    if (i < total) w[x] = KR::load((isv ? vp : kp) + (size_t)(kb0 + ii / pr) * hd + (ii % pr) * E);
                }
#pragma unroll
                for (int x = 0; x < 8; x++) {
                    const int i = i0 + x * nt, isv = i >= nk * pr, ii = i - isv * nk * pr;
                    if (i >= total) break;
                    KR::to_f32s(w[x], (isv ? vs : ks) + (size_t)(ii / pr) * ldq + (ii % pr) * E);
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
    DYN_SHARED_ALIGNED(float, tile_sh);
    const att_tile tl = tiles[blockIdx.x / KVH];
    const int kvh = blockIdx.x % KVH;
    const rowinfo info = ri[tl.r0];
    if (info.kvt == IB_KV_F16)
        attend_tile<uint16_t>(tile_sh, Q, ATT, info, tl.r0, tl.n, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad);
    else if (info.kvt == IB_KV_Q8)
        attend_tile<kvq8>(tile_sh, Q, ATT, info, tl.r0, tl.n, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad);
    else attend_tile<float>(tile_sh, Q, ATT, info, tl.r0, tl.n, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad);
}

#endif
