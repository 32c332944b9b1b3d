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
#define TILE_KEYS 32        /* largest key block it takes: a warp's lane per key */
#define TILE_VW 4           /* most vectors a warp owns (ATT_THREADS / 32 warps x TILE_VW = TILE_QV): 4, or 2 in tiles of at most TILE_QV / 2 vectors */
#define TILE_PIECES 8       /* most staging pieces a thread holds: 2 x TILE_KEYS x TILE_HD floats / 4 a piece / ATT_THREADS */

/* One tile: rows [r0, r0 + n) of the step, consecutive positions of one session (a prompt's chunk). */
struct att_tile {
    int r0, n;
};

/* Shared memory of attention_tile_kernel (dynamic) for head dim hd: q [TILE_QV][hd + 4] (later the
 * outputs), keys [TILE_KEYS][hd + 4] and values [TILE_KEYS][hd] (floats), weights p [TILE_KEYS][TILE_QV].
 * The key rows' pad of 4 floats puts 8 lanes' 16-byte loads of 8 consecutive keys in 8 different bank
 * quads. */
__host__ __device__ __forceinline__ size_t tile_smem_bytes(int hd) {
    return ((size_t)TILE_QV * (hd + 4) + (size_t)TILE_KEYS * (hd + 4) + (size_t)TILE_KEYS * hd +
            (size_t)TILE_KEYS * TILE_QV) * sizeof(float);
}

/* The key block [kb0, kb0 + nk) of both planes as a thread's staging pieces (kv_read): piece x of thread
 * tid is piece i = tid + x * nt of the block, keys' pieces first; loads only (no conversion), so they are
 * in flight together while the thread does other work. */
template <typename T>
__device__ __forceinline__ void tile_stage_load(typename kv_read<T>::piece (&w)[TILE_PIECES],
                                                typename kv_read<T>::ptr kp, typename kv_read<T>::ptr vp, int kb0,
                                                int nk, int hd, int tid, int nt) {
    typedef kv_read<T> KR;
    const int pr = hd / KR::E, total = 2 * nk * pr;
#pragma unroll
    for (int x = 0; x < TILE_PIECES; x++) {
        const int i = tid + x * nt, isv = i >= nk * pr, ii = i - isv * nk * pr;
        if (i < total) w[x] = KR::load((isv ? vp : kp) + (size_t)(kb0 + ii / pr) * hd + (ii % pr) * KR::E);
    }
}

/* The pieces of tile_stage_load converted (each element exactly the host's decoding) into the key
 * stage ks [nk][hd + 4] and the value stage vs [nk][hd]. */
template <typename T>
__device__ __forceinline__ void tile_stage_store(const typename kv_read<T>::piece (&w)[TILE_PIECES], float *ks,
                                                 float *vs, int nk, int hd, int tid, int nt) {
    typedef kv_read<T> KR;
    const int pr = hd / KR::E, total = 2 * nk * pr;
#pragma unroll
    for (int x = 0; x < TILE_PIECES; x++) {
        const int i = tid + x * nt, isv = i >= nk * pr, ii = i - isv * nk * pr;
        if (i < total)
            KR::to_f32s(w[x], isv ? vs + (size_t)(ii / pr) * hd + (ii % pr) * KR::E
                                  : ks + (size_t)(ii / pr) * (hd + 4) + (ii % pr) * KR::E);
    }
}

/* The walk's maximum of a key block's scores, one key a lane (every lane of the warp calls it; ok: lane's
 * key counts): `mb = -INFINITY; for each counted key in order: if (s > mb) mb = s` — the first largest
 * score in key order, NaN never taken, -INFINITY where none is larger. A maximum is exact in any order,
 * so a warp-wide integer maximum over an order-keeping image of the scores (-0 taken as +0, since they
 * compare equal) finds its value, and the lowest lane holding it gives the walk's bits (its zero sign). */
__device__ __forceinline__ float warp_walk_max(float s, bool ok) {
    const float c = ok && s > -INFINITY ? s : -INFINITY;
    int k = __float_as_int(c == 0.0f ? 0.0f : c);
    k ^= (k >> 31) & 0x7fffffff;   /* negative floats: larger magnitude, smaller int */
    const int km = __reduce_max_sync(0xffffffffu, k);
    return __shfl_sync(0xffffffffu, c, __ffs(__ballot_sync(0xffffffffu, k == km)) - 1);
}

/* ATT[r][h] for the rows of tile t = blockIdx.x / KVH and the G = H/KVH query heads h of KV head kvh =
 * blockIdx.x % KVH: the attention of each (row, head) vector over its session's keys [0, pos] (a full
 * cache), ATT_THREADS threads. The rows of a tile are one session's consecutive positions, so they
 * share their keys: each key block (positions [kb*block, (kb+1)*block), as ib_attend_heads cuts them)
 * is staged in shared memory once (as floats, exactly as the host decodes them) for all the tile's
 * vectors; the next block's loads are issued before this block's value pass, so they arrive while it
 * runs. Warp w owns vectors [VW*w, VW*w + VW) for the whole walk (their running max, sum
 * and outputs never leave it, so a key block needs block-wide barriers only around its staging). For
 * each of them whose row reaches the block (pos >= kb*block) over the block's keys it sees (those <=
 * pos), in the reference's order: every score s_j = dot16(q, k_j) * scale by lane j alone (ib_dot16's 16
 * lanes as 16 accumulators, element d into lane d % 16 in ascending d, folded 8, 4, 2, 1); the block's
 * max (the walk's: the first largest score in key order, NaN never taken — an exact choice, made by
 * warp_walk_max), m' = max(m, block max), c = exp(m - m'); p_j = exp(s_j - m') by
 * lane j; l = l*c then l += p_j in key order (one lane a vector); out = out*c then out += p_j * v_j in key
 * order (lane t the elements t, t + 32, … of each of the warp's vectors); finally out / l. The same
 * operations as attend_row_head and attend_row_kvhead, so the same bits. qG > 0: each (row, head)
 * output also quantized for group qG into xq/qd/qad. T: float, half or q8 KV; VW: 2 or 4. Needs nq = n * G
 * <= VW * ATT_THREADS / 32, hd <= TILE_HD (a multiple of 16), block <= TILE_KEYS, blockDim.x = ATT_THREADS. */
template <typename T, int VW>
__device__ void attend_tile(float *sh, const float *__restrict__ Q, float *__restrict__ ATT, const rowinfo &info, int r0,
                            int n, int kvh, int H, int KVH, int hd, int li, float scale, int block, int qG,
                            int8_t *__restrict__ xq, float *__restrict__ qd, float *__restrict__ qad) {
    static_assert((VW == 2 || VW == 4) && TILE_VW * (ATT_THREADS / 32) == TILE_QV, "a warp owns 2 or 4 vectors");
    const int G = H / KVH, nq = n * G, tid = threadIdx.x, nt = blockDim.x, ldq = hd + 4, ldk = hd + 4;
    const int lane = tid & 31, w = tid >> 5, vb = w * VW;
    float *qs = sh, *ks = qs + (size_t)TILE_QV * ldq, *vs = ks + (size_t)TILE_KEYS * ldk, *ps = vs + (size_t)TILE_KEYS * hd;
    typedef kv_read<T> KR;
    const size_t plane = (size_t)info.cap * hd;
    const typename KR::ptr kp = KR::at(info.kv, (((size_t)li * 2 + 0) * KVH + kvh) * plane);
    const typename KR::ptr vp = KR::at(info.kv, (((size_t)li * 2 + 1) * KVH + kvh) * plane);
    const int p0 = info.pos, plast = p0 + n - 1;
    typename KR::piece pc[TILE_PIECES];
    tile_stage_load<T>(pc, kp, vp, 0, block <= plast + 1 ? block : plast + 1, hd, tid, nt);
    /* q vectors: v = i * G + g is row r0 + i, head kvh * G + g */
    for (int e = tid; e < nq * hd; e += nt) {
        const int v = e / hd, d = e % hd;
        qs[(size_t)v * ldq + d] = Q[((size_t)(r0 + v / G) * H + (size_t)kvh * G + v % G) * hd + d];
    }
    tile_stage_store<T>(pc, ks, vs, block <= plast + 1 ? block : plast + 1, hd, tid, nt);
    float m[VW], l[VW], o[VW][TILE_HD / 32];
#pragma unroll
    for (int x = 0; x < VW; x++) {
        m[x] = -INFINITY, l[x] = 0.0f;
#pragma unroll
        for (int i = 0; i < TILE_HD / 32; i++) o[x][i] = 0.0f;
    }
    const int nw = nq - vb < 0 ? 0 : nq - vb < VW ? nq - vb : VW;   /* the warp's vectors */
    for (int kb0 = 0; kb0 <= plast; kb0 += block) {
        const int nk = (kb0 + block <= plast + 1 ? block : plast + 1 - kb0);   /* keys staged: up to the last row's */
        const int nb = plast + 1 - (kb0 + block) < block ? plast + 1 - (kb0 + block) : block;   /* the next block's keys */
        __syncthreads();   /* the block's stage written */
        int nv[VW], any = 0;   /* each vector's keys in this block (0: its row does not reach it, or no such vector) */
#pragma unroll
        for (int x = 0; x < VW; x++) {
            const int p = p0 + (vb + x) / G;
            nv[x] = x >= nw || p < kb0 ? 0 : (p + 1 - kb0 < block ? p + 1 - kb0 : block);
            any |= nv[x] > 0;
        }
        if (any) {   /* the warp has work in this block */
            /* scores: lane j the key j's dot products with the warp's vectors */
            const int j = lane < nk ? lane : 0;
            /* ib_dot16's first fold pairs lane u with u + 8: lanes 0-3 and 8-11 (element quads 0 and 2 of
             * every 16) are walked first and folded into b[0..4), then lanes 4-7 and 12-15 into b[4..8) —
             * every element still loaded once, and 12 accumulators a vector live instead of 16 */
            float b[VW][8];
#pragma unroll
            for (int half = 0; half < 2; half++) {
                float a[VW][8];   /* lanes 4*half + (0..3) and 8 + 4*half + (0..3) */
#pragma unroll
                for (int x = 0; x < VW; x++)
#pragma unroll
                    for (int u = 0; u < 8; u++) a[x][u] = 0.0f;
                const float *kr = ks + (size_t)j * ldk + 4 * half;
                const float *qr = qs + (size_t)vb * ldq + 4 * half;
                for (int d0 = 0; d0 < hd; d0 += 16) {
#pragma unroll
                    for (int g = 0; g < 2; g++) {
                        const float4 k4 = *(const float4 *)(kr + d0 + 8 * g);
#pragma unroll
                        for (int x = 0; x < VW; x++) {
                            const float4 q4 = *(const float4 *)(qr + (size_t)x * ldq + d0 + 8 * g);
                            a[x][4 * g + 0] = a[x][4 * g + 0] + q4.x * k4.x;
                            a[x][4 * g + 1] = a[x][4 * g + 1] + q4.y * k4.y;
                            a[x][4 * g + 2] = a[x][4 * g + 2] + q4.z * k4.z;
                            a[x][4 * g + 3] = a[x][4 * g + 3] + q4.w * k4.w;
                        }
                    }
                }
#pragma unroll
                for (int x = 0; x < VW; x++)
#pragma unroll
                    for (int u = 0; u < 4; u++) b[x][4 * half + u] = a[x][u] + a[x][u + 4];
            }
            float s[VW];
#pragma unroll
            for (int x = 0; x < VW; x++) {
#pragma unroll
                for (int u = 0; u < 4; u++) b[x][u] = b[x][u] + b[x][u + 4];
#pragma unroll
                for (int u = 0; u < 2; u++) b[x][u] = b[x][u] + b[x][u + 2];
                s[x] = (b[x][0] + b[x][1]) * scale;
            }
            /* per vector: the block max, m' = max(m, block max), c = exp(m - m'), p_j = exp(s_j - m') */
            float c[VW];
#pragma unroll
            for (int x = 0; x < VW; x++) {
                const float mb = warp_walk_max(s[x], lane < nv[x]);
                const float m_new = mb > m[x] ? mb : m[x];
                c[x] = ib_expf_lane(m[x] - m_new);
                if (nv[x] > 0) m[x] = m_new;   /* uniform over the warp */
                if (lane < nv[x]) ps[(size_t)lane * TILE_QV + vb + x] = ib_expf_lane(s[x] - m_new);
            }
            __syncwarp();
            /* l = l*c then l += p_j in key order: lane x walks vector x's (the four at once), then every
             * lane holds them */
            {
                float lx = 0.0f;
                if (lane < VW) {
                    int nx = nv[0];
                    float lo = l[0], co = c[0];
#pragma unroll
                    for (int x = 1; x < VW; x++)
                        if (lane == x) nx = nv[x], lo = l[x], co = c[x];
                    if (nx > 0) {
                        lx = lo * co;
                        const float *pl = ps + vb + lane;
                        for (int jj = 0; jj < nx; jj++) lx = lx + pl[(size_t)jj * TILE_QV];
                    }
                }
#pragma unroll
                for (int x = 0; x < VW; x++) {
                    const float t = __shfl_sync(0xffffffffu, lx, x);
                    if (nv[x] > 0) l[x] = t;
                }
            }
            /* the next key block's loads, in flight during the value pass */
            if (kb0 + block <= plast) {
                tile_stage_load<T>(pc, kp, vp, kb0 + block, nb, hd, tid, nt);
            }
            /* out = out*c then out += p_j * v_j in key order; lane the elements lane + 32 i */
#pragma unroll
            for (int x = 0; x < VW; x++)
                if (nv[x] > 0)
#pragma unroll
                    for (int i = 0; i < TILE_HD / 32; i++) o[x][i] = o[x][i] * c[x];
            for (int jj = 0; jj < nk; jj++) {
                float pv[VW];
                if constexpr (VW == 4) {
                    const float4 p4 = *(const float4 *)(ps + (size_t)jj * TILE_QV + vb);
                    pv[0] = p4.x, pv[1] = p4.y, pv[2] = p4.z, pv[3] = p4.w;
                } else {
                    const float2 p2 = *(const float2 *)(ps + (size_t)jj * TILE_QV + vb);
                    pv[0] = p2.x, pv[1] = p2.y;
                }
                float xv[TILE_HD / 32];
#pragma unroll
                for (int i = 0; i < TILE_HD / 32; i++) xv[i] = lane + 32 * i < hd ? vs[(size_t)jj * hd + lane + 32 * i] : 0.0f;
#pragma unroll
                for (int x = 0; x < VW; x++)
                    if (jj < nv[x])
#pragma unroll
                        for (int i = 0; i < TILE_HD / 32; i++) o[x][i] = o[x][i] + pv[x] * xv[i];
            }
        } else if (kb0 + block <= plast) {
            tile_stage_load<T>(pc, kp, vp, kb0 + block, nb, hd, tid, nt);
        }
        __syncthreads();   /* every warp done with this block's stage */
        if (kb0 + block <= plast) {
            tile_stage_store<T>(pc, ks, vs, nb, hd, tid, nt);
        }
    }
    /* out / l, into ATT and (for the quantization) over q */
#pragma unroll
    for (int x = 0; x < VW; x++) {
        const int v = vb + x;
        if (x < nw)
#pragma unroll
            for (int i = 0; i < TILE_HD / 32; i++) {
                const int d = lane + 32 * i;
                if (d < hd) {
                    const float y = o[x][i] / l[x];
                    ATT[((size_t)(r0 + v / G) * H + (size_t)kvh * G + v % G) * hd + d] = y;
                    qs[(size_t)v * ldq + d] = y;
                }
            }
    }
    if (qG > 0) {
        __syncthreads();
        for (int v = 0; v < nq; v++)
            quantize_span(qs + (size_t)v * ldq, hd, r0 + v / G, (kvh * G + v % G) * hd, H * hd, qG, xq, qd, qad);
    }
}

/* One block per (tile, KV head): attend_tile for the tile's KV dtype (tiles [n_tiles], ri as the step's),
 * VW vectors a warp (2: tiles of at most TILE_QV / 2 vectors, so all the block's warps have some). */
template <int VW>
__global__ void __launch_bounds__(ATT_THREADS, 2) attention_tile_kernel(const float *__restrict__ Q, float *__restrict__ ATT,
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
        attend_tile<uint16_t, VW>(tile_sh, Q, ATT, info, tl.r0, tl.n, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad);
    else if (info.kvt == IB_KV_Q8)
        attend_tile<kvq8, VW>(tile_sh, Q, ATT, info, tl.r0, tl.n, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad);
    else attend_tile<float, VW>(tile_sh, Q, ATT, info, tl.r0, tl.n, kvh, H, KVH, hd, li, scale, block, qG, xq, qd, qad);
}

#endif
