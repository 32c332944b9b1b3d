/*
 * product_kernels.cuh — the CUDA backend's products Y = X · W^T (matmul.h's definitions, bit for bit),
 * included by cuda_backend.cu after its device data, launch helpers and PDL helpers, which it uses:
 *   - mm_q8_kernel: Q8 activations, dp4a, steps of 1-4 rows (one-row products may stage the row's codes
 *     in shared memory);
 *   - mm_q8_mma16_kernel, mm_q8_mma_pipe_kernel: Q8 activations on the int8 tensor cores, small grids
 *     (16-row tiles; or 8/16-row blocks through a cp.async pipeline with the weights as the left
 *     operand);
 *   - mm_q8_gemm_kernel: the tiled tensor-core GEMM for many rows on large grids;
 *   - mm_f32_kernel: F32 activations, one ascending chain per (row, output), summed in double.
 * Each computes per (row, output) the exact integer group sums in any order and the float combination
 * in ascending group order; which kernel runs is launch_products' choice (cuda_backend.cu) and never
 * changes a bit. docs/cuda.md has the table and the measurements.
 */

/* ---------------------------------------------------------------- kernels: products */

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

/* Exact group sums as floats without a conversion instruction. An int32 accumulator that starts at
 * ISUM_BIAS (the bits of the float 1.5 * 2^23) and gains an exact integer sum s with |s| < 2^22 holds
 * the bits of the float 1.5 * 2^23 + s (one binade, whose unit in the last place is 1), so isum_float
 * returns (float)s bit for bit (s = 0 gives +0 either way) with one float subtraction, where the
 * int-to-float conversion is an instruction of a fraction of the float rate. Every Q8 group sum is
 * below 2^22: at most 128 codes (G <= 128) of at most 255 (8-bit codes, unsigned) times activation
 * codes of at most 127 in magnitude, 128 * 255 * 127 = 4,145,280 < 4,194,304. The tensor-core kernels
 * start their mma accumulators at ISUM_BIAS (a group summed in several tiles: exactly one of them); the
 * dp4a kernels keep the conversion, which runs beside their dp4a instead of on the same unit as they do
 * (biased there too, Gemma 4's MoE steps of 8 rows measured 1.7% slower). */
#define ISUM_BIAS 0x4B400000
__device__ __forceinline__ float isum_float(int biased) { return __int_as_float(biased) - 12582912.0f; }

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

/* Row r's chain over a pass's gn groups for output lane: acc = (acc + t_g) + u_g in group order, the
 * terms parked in t_s, u_s [rows][groups][outputs]. */
template <int NR, int NG, int NO>
__device__ __forceinline__ float q8_chain(float acc, const float (&t_s)[NR][NG][NO], const float (&u_s)[NR][NG][NO],
                                          int r, int lane, int gn) {
#pragma unroll 8
    for (int gi = 0; gi < gn; gi++) acc = (acc + t_s[r][gi][lane]) + u_s[r][gi][lane];
    return acc;
}

/* Park a group's two terms for q8_chain in lvalues T and U: T = (s*d)*(float)isum and U = b*ad (SD, FI,
 * UB as the caller computed them), or under the test-only gpu-fma fault (`fused` in scope) T = fma(SD,
 * FI, UB) and U = 0. A macro, so each kernel compiles exactly the statements it had written out. */
#define Q8_PARK(T, U, SD, FI, UB) \
    do {                          \
        if (fused) {              \
            T = __fmaf_rn(SD, FI, UB); \
            U = 0.0f;             \
        } else {                  \
            T = SD * FI;          \
            U = UB;               \
        }                         \
    } while (0)

/* Store output y of a Q8 product, or add it with an atomic (splits > 1: the test-only gpu-split-k fault). */
__device__ __forceinline__ void q8_store(float *y, float acc, int splits) {
    if (splits > 1) atomicAdd(y, acc);
    else *y = acc;
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
 * arrive — which one-row products do: mm_stage_mode; the same sums.
 * MINB: blocks a multiprocessor the registers must allow (1: as many registers as the code wants). */
#define MM_XS_MAX_K 12288   /* most activation codes a block stages (with 32 KB of static shared memory) */
template <int FMT, int RBT, int OPB, int MAXC = MM_MAXC(FMT), bool XS = false, int MINB = 1>
__global__ void __launch_bounds__(256, MINB) mm_q8_kernel(mset ms, const int8_t *__restrict__ xq, const float *__restrict__ d,
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
    DYN_SHARED_ALIGNED(int8_t, x_s);   /* XS: [K] the row's activation codes */
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
                        Q8_PARK(t_s[r][gi][o], u_s[r][gi][o], sd, fi, u);
                    }
                }
            }
            __syncthreads();
            if (warp < nr && lane < OPB) acc = q8_chain(acc, t_s, u_s, warp, lane, gn);
            __syncthreads();
        }
        if (warp < nr && lane < OPB && n < m.N) q8_store(&Y[(size_t)(r0 + warp) * ldy + n], acc, splits);
    }
}

/* d += a · b for one m16n8k32 tile: a 16x32 int8 activations (row major fragment), b 32x8 weight codes
 * (int8 for 4-bit codes, uint8 for 8-bit ones), d 16x8 int32. */
template <int FMT>
__device__ __forceinline__ void mma_k32(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    mma_i8<false, FMT == IB_WQ8>(d, a, b0, b1);
}


/* Dynamic shared bytes of mm_q8_tile_kernel for OPB outputs of a matrix of K inputs in ng groups of cpg
 * 16-byte code words and `rows` rows: the codes [ng * cpg][OPB] (16 bytes each), scales and biases
 * [ng][OPB] (floats), then the rows' activation codes [rows][K]. */
__host__ __device__ __forceinline__ size_t mm_tile_smem(int opb, int K, int ng, int cpg, int rows) {
    return (size_t)ng * cpg * opb * 16 + (size_t)ng * opb * 8 + (size_t)rows * K;
}

/* mm_q8_kernel's product for the step's R <= RBT rows (RBT = 1, 2 or 4; one block row: rpb >= R) with
 * the block's whole weight tile in shared memory: before the wait for the previous kernel — the weights
 * are written by no kernel of the step — every thread issues cp.async copies of its share of the tile
 * (the OPB outputs' code words, scales and biases over the block's groups), so the tile's bytes are in
 * flight at once and stream in while the previous kernel ends; after the wait the rows' activation
 * codes are copied too, and each group's integer sums and terms come from shared memory, the group's
 * code words read once for all the rows. The arithmetic is mm_q8_kernel's: per (row, output, group)
 * t_g = (s*d)*(float)isum and u_g = b*ad, the chain acc = (acc + t_g) + u_g in ascending group order
 * by warp r's lanes for row r, 64 / RBT groups a pass (16 KB of terms at 32 outputs); fused and splits
 * are its test-only faults (block z stages and sums only its group range). Dynamic shared memory:
 * mm_tile_smem(OPB, K, the block's groups, cpg, RBT) of the block's matrix. */
template <int FMT, int OPB, int RBT>
__global__ void __launch_bounds__(256) mm_q8_tile_kernel(mset ms, const int8_t *__restrict__ xq, const float *__restrict__ d,
                                                         const float *__restrict__ ad, int R, int rpb, int fused,
                                                         int splits) {
    constexpr int GC = 64 / RBT, SETS = NWARP * (NT / OPB), KC = MM_KC(FMT), MAXC = MM_MAXC(FMT);
    __shared__ float t_s[RBT][GC][OPB], u_s[RBT][GC][OPB];
    DYN_SHARED_ALIGNED(unsigned char, tile_s);
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.x / (NT / OPB), m, Y), ldy = m.N;
    const int n0 = tile * NT + (blockIdx.x % (NT / OPB)) * OPB;   /* the block's first output */
    const int K = m.K, G = m.G, ng = m.ng, cpg = G / KC, nr = min(R, RBT);
    const int gs = (ng + splits - 1) / splits, gb = min(ng, (int)blockIdx.z * gs), ge = min(ng, gb + gs), gnb = ge - gb;
    uint4 *wc = (uint4 *)tile_s;                        /* [gnb * cpg][OPB] code words */
    float *sc_s = (float *)(wc + (size_t)gnb * cpg * OPB), *bi_s = sc_s + (size_t)gnb * OPB;   /* [gnb][OPB] */
    int8_t *x_s = (int8_t *)(bi_s + (size_t)gnb * OPB);  /* [nr][K] */
    /* the tile: code word row w of the block's groups is 16 * OPB contiguous bytes at row gb * cpg + w */
    for (int i = threadIdx.x; i < gnb * cpg * OPB; i += blockDim.x)
        cp_async16(wc + i, m.w + (size_t)(gb * cpg + i / OPB) * m.Np + n0 + i % OPB);
    for (int i = threadIdx.x; i < gnb * (OPB / 4); i += blockDim.x) {
        const size_t src = (size_t)(gb + i / (OPB / 4)) * m.Np + n0 + 4 * (i % (OPB / 4));
        cp_async16(sc_s + 4 * i, m.s + src);
        cp_async16(bi_s + 4 * i, m.b + src);
    }
    cp_commit();
    PDL_ENTER();
    {
        const int4 *src = (const int4 *)xq;   /* rows 0 .. nr - 1, K bytes each */
        for (int i = threadIdx.x; i < nr * (K / 16); i += blockDim.x) ((int4 *)x_s)[i] = src[i];
    }
    cp_wait<0>();
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o = lane % OPB, set = warp * (NT / OPB) + lane / OPB, n = n0 + o;
    float acc = 0.0f;   /* row `warp`, output n (warps < nr, lanes < OPB) */
    for (int g0 = 0; g0 < gnb; g0 += GC) {
        const int gn = min(GC, gnb - g0);
        for (int gi = set; gi < gn; gi += SETS) {
            const int gl = g0 + gi, g = gb + gl;
            uint4 wl[MAXC];
#pragma unroll
            for (int c = 0; c < MAXC; c++)
                if (c < cpg) wl[c] = wc[(size_t)(gl * cpg + c) * OPB + o];
            const float sc = sc_s[(size_t)gl * OPB + o], bi = bi_s[(size_t)gl * OPB + o];
#pragma unroll
            for (int r = 0; r < RBT; r++) {
                if (r >= nr) break;
                const int is = group_isum<FMT, MAXC>(wl, cpg, x_s + (size_t)r * K + (size_t)g * G);
                const float sd = sc * d[(size_t)r * ng + g], u = bi * ad[(size_t)r * ng + g], fi = (float)is;
                Q8_PARK(t_s[r][gi][o], u_s[r][gi][o], sd, fi, u);
            }
        }
        __syncthreads();
        if (warp < nr && lane < OPB) acc = q8_chain(acc, t_s, u_s, warp, lane, gn);
        __syncthreads();
    }
    if (warp < nr && lane < OPB && n < m.N) q8_store(&Y[(size_t)warp * ldy + n], acc, splits);
}

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
                    for (int e = 0; e < 4; e++) is[x][nt][e] = ISUM_BIAS;
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
                    const float sd = sc * dd, u = bi * aa, fi = isum_float(isum_s[gi][rl][cl]);
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

/* Each thread's share of a pipeline stage's activation codes, for the tensor-core kernels' stages (type
 * STG, whose a[rows][..] holds KS k of each row): piece i = threadIdx.x + 256 u (u < N) is row i / (KS /
 * 16) of the block's (rows past R repeat row R - 1, whose sums no one keeps), 16 bytes at k 16 * (i % (KS
 * / 16)) from the block's first k, kb — its source for the first stage, its k offset, and its byte
 * offset in a stage. */
template <int N, int KS, typename STG>
__device__ __forceinline__ void plan_act_copies(const int8_t *xq, int K, int R, int r0, int kb, const STG *stg,
                                                const int8_t *(&src)[N], int (&k)[N], int (&dst)[N]) {
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int i = threadIdx.x + 256 * u, r = i / (KS / 16), c = i % (KS / 16);
        src[u] = xq + (size_t)min(r0 + r, R - 1) * K + kb + 16 * c, k[u] = 16 * c;
        dst[u] = (int)((const char *)&stg[0].a[r][16 * c] - (const char *)stg);
    }
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
 * (G 32: one a slot), or the tiles of warps j * G / 64 .. (j + 1) * G / 64 - 1 (a warp's two slots are
 * 64 k). G: 32, 64 or 128 (the only group sizes launch_products gives the tensor-core kernels). */
template <int FMT, int NR, int NB, int G, typename IS>
__device__ __forceinline__ void sk_chains(float (&acc)[SK_PPT(NR, NB)], const sk_stage<FMT, NR, NB> &S, const IS &isum_s,
                                          int gn, int fused) {
    static_assert(G == 32 || G == 64 || G == 128, "sk_chains: G is 32, 64 or 128");
    constexpr int GPS = SK_KS / G, WPG = G / 64;   /* groups a stage; warps a group (G >= 64) */
#pragma unroll
    for (int i = 0; i < SK_PPT(NR, NB); i++) {
        const unsigned p = threadIdx.x + 256u * i;
        const int rl = (int)(p / NB), cl = (int)(p % NB);
        if (NB * NR < 32 && p >= NB * 8 * NR) break;
        float x = acc[i];
#pragma unroll
        for (int j = 0; j < GPS; j++) {
            if (j >= gn) break;
            int isum;   /* biased: the group's first tile holds ISUM_BIAS */
            if (G == 32) isum = isum_s[j >> 1][j & 1][rl][cl];
            else {
                isum = isum_s[j * WPG][0][rl][cl];
#pragma unroll
                for (int w = 1; w < WPG; w++) isum += isum_s[j * WPG + w][0][rl][cl];
            }
            const float sd = S.s[j][cl] * S.d[j][rl], u = S.b[j][cl] * S.ad[j][rl], fi = isum_float(isum);
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
 * xq [R][K] int8 activation codes, d / ad [R][K/G]; the block's matrix writes Y [R][N] (row stride N).
 * Needs G of 32, 64 or 128. fused, splits: the test-only faults, as mm_q8_kernel
 * (splits: block z takes the z-th group range and adds its partial chain into Y with atomics). */
template <int FMT, int NR, int NB, int NS>
__global__ void __launch_bounds__(256) mm_q8_mma_pipe_kernel(mset ms, const int8_t *__restrict__ xq, const float *__restrict__ d,
                                                             const float *__restrict__ ad, int R, int fused, int splits) {
    constexpr int KC = MM_KC(FMT), RT = 8 * NR, MT = NB / 16;   /* k per chunk, rows a block, 16-output tiles */
    constexpr int WPT = (SK_KS / KC) * NB / 256;   /* weight chunks a thread a stage: 1-4 */
    constexpr int SBQ = NB / 4;                    /* 16-byte pieces of a group's scales (or biases) */
    DYN_SHARED_ALIGNED(unsigned char, sk_smem);
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
    plan_act_copies<NR, SK_KS>(xq, K, R, r0, kb, stg, x_src, x_k, x_dst);
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
        /* warp w: slots 2w and 2w + 1 (k 64w .. 64w + 63 of the stage); its tiles start at ISUM_BIAS,
         * except where groups of 128 k take two warps' tiles (2j and 2j + 1: the first holds the bias) */
        const int is0 = G > 64 && (warp & 1) ? 0 : ISUM_BIAS;
        int is[MT][NR][4];   /* [16-output tile][8-row tile][fragment element] */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nr = 0; nr < NR; nr++)
#pragma unroll
                for (int e = 0; e < 4; e++) is[mt][nr][e] = is0;
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
                            is[mt][nr][e] = is0;
                        }
            }
        }
        __syncthreads();
        /* the chains over the stage's groups, in order (unrolled for the usual group sizes) */
        const int gn = min(gps, ge - gA);
        if (G == 32) sk_chains<FMT, NR, NB, 32>(acc, S, isum_s, gn, fused);
        else if (G == 64) sk_chains<FMT, NR, NB, 64>(acc, S, isum_s, gn, fused);
        else sk_chains<FMT, NR, NB, 128>(acc, S, isum_s, gn, fused);   /* G is 128: launch_products' rule */
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
 * BN outputs' weight codes, and the scales, biases and (d, ad) pairs of the (at most 4) groups the
 * stage's k range meets. */
#define MMA_KS 128     /* k per pipeline stage */
#define MMA_BN 64      /* outputs per block */
#define MMA_NS 3       /* pipeline stages */
#define MMA_AROW (MMA_KS + 16)   /* bytes of a staged activation row (padded: conflict-free ldmatrix rows) */
template <int BM>
struct mma_stage {
    uint8_t a[BM][MMA_AROW];       /* activation codes: rows x k */
    uint4 w[8][MMA_BN];            /* weight chunks (Q4: 4 of 32 k; Q8: 8 of 16 k) x outputs */
    float s[4][MMA_BN], b[4][MMA_BN];
    float2 dad[4][BM];             /* (d, ad) of each row */
};

/* The Q8 product of mm_q8_kernel for many rows, on the tensor cores, shaped as a tiled GEMM: block
 * (x: BM rows, fastest, so a weight tile's row blocks run together; y: MMA_BN outputs of mset ms, in
 * 64-output tiles t0[]), 8 warps as 2 x 4, each warp a tile of BM/2 rows x 16 outputs. K is walked
 * in stages of MMA_KS k through an MMA_NS-deep cp.async pipeline into shared memory (the weights of
 * the first stages are asked for before the wait for the previous kernel). For each 32 k a warp's
 * integer sums grow by mma.sync m16n8k32 (s8 x s8/u8 -> s32: exact, the group's isum in any order;
 * the activation fragments by ldmatrix), from ISUM_BIAS at the group's first 32 k; where a group ends,
 * every (row, output) of the warp's tile continues its float chain in registers,
 * acc = (acc + (s*d)*(float)isum) + b*ad — matmul.h's arithmetic, groups in ascending order, bit for
 * bit. G, every matrix's group size (32, 64 or 128: a stage holds MMA_KS / G whole groups), is a
 * template argument, so where groups start and end is known when compiling. Each thread's copies are
 * planned once (sources, shared-memory offsets), so a stage's copy issue is a few instructions. fused,
 * splits: the test-only faults, as mm_q8_kernel (splits: block z takes the z-th group range and adds
 * its partial chain into Y with atomics). Dynamic shared memory: MMA_NS * sizeof(mma_stage<BM>). */
template <int FMT, int BM, int G>
__global__ void __launch_bounds__(256) mm_q8_gemm_kernel(mset ms, const int8_t *__restrict__ xq, const float *__restrict__ d,
                                                        const float *__restrict__ ad, int R, int fused, int splits) {
    static_assert(G == 32 || G == 64 || G == 128, "mm_q8_gemm_kernel: G is 32, 64 or 128");
    constexpr int MT = BM / 32;                       /* 16-row mma tiles per warp */
    constexpr int KC = MM_KC(FMT);                    /* k per weight chunk (uint4) */
    constexpr int NCH = MMA_KS / KC;                  /* weight chunks per stage */
    constexpr int GPS = MMA_KS / G, SPG = G / 32;     /* groups a stage, 32-k steps a group */
    DYN_SHARED_ALIGNED(unsigned char, mma_smem);
    mma_stage<BM> *stg = (mma_stage<BM> *)mma_smem;
    dmat m;
    float *Y;
    const int tile = mset_pick(ms, blockIdx.y, m, Y), ldy = m.N;
    const int K = m.K, ng = m.ng, Np = m.Np;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x * BM, n0 = tile * MMA_BN;
    const int wr = (warp >> 2) * (BM / 2), wn = (warp & 3) * 16;   /* the warp's tile in the block */
    const int gs = (ng + splits - 1) / splits, gb = blockIdx.z * gs, ge = min(ng, gb + gs);
    const int kb = gb * G, ke = ge * G;                              /* the block's k range */
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
    plan_act_copies<XPT, MMA_KS>(xq, K, R, rb, kb, stg, x_src, x_k, x_dst);
    const float *d_src[DPT];
    int d_dst[DPT], d_j[DPT];
#pragma unroll
    for (int u = 0; u < DPT; u++) {
        const int i = tid + 256 * u, arr = i / (4 * BM), j = (i / BM) % 4, r = i % BM;
        d_src[u] = (arr ? ad : d) + (size_t)min(rb + r, R - 1) * ng, d_j[u] = j;
        d_dst[u] = (int)((char *)(arr ? &stg[0].dad[j][r].y : &stg[0].dad[j][r].x) - (char *)stg);
    }
    /* the weight side of stage st (codes, scales, biases): independent of earlier kernels */
    auto load_w = [&](int st) {
        char *S = (char *)&stg[st % MMA_NS];
        const int k0 = kb + st * MMA_KS;
#pragma unroll
        for (int u = 0; u < WPT; u++)
            if (w_ok[u] && k0 + w_k[u] < ke) cp_async16(S + w_dst[u], w_src[u] + (size_t)st * NCH * Np);
        if (sb_ok && sb_j < GPS && gb + st * GPS + sb_j < ge) cp_async16(S + sb_dst, sb_src + (size_t)(gb + st * GPS + sb_j) * Np);
    };
    /* the activation side of stage st (codes, d, ad): written by the previous kernels */
    auto load_x = [&](int st) {
        char *S = (char *)&stg[st % MMA_NS];
        const int k0 = kb + st * MMA_KS;
#pragma unroll
        for (int u = 0; u < XPT; u++)
            if (k0 + x_k[u] < ke) cp_async16(S + x_dst[u], x_src[u] + (size_t)st * MMA_KS);
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int g = gb + st * GPS + d_j[u];
            if (d_j[u] < GPS && g < ge) cp_async4(S + d_dst[u], d_src[u] + g);
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
    int is[MT][2][4];      /* the group's integer sums, from ISUM_BIAS */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    /* lane's ldmatrix row: matrix lane / 8 is rows +0 / +8 (bit 0) at bytes +0 / +16 (bit 1) */
    const int a_row = wr + (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 16 * (lane >> 4);
    const int nib = 4 * (t & 1);   /* Q4: this lane's nibbles of a code word */

    for (int st = 0; st < nst; st++) {
        cp_wait<MMA_NS - 2>();
        __syncthreads();   /* stage st is in; every warp is done with the buffer loaded next */
        if (st + MMA_NS - 1 < nst) {
            load_w(st + MMA_NS - 1);
            load_x(st + MMA_NS - 1);
        }
        cp_commit();
        const mma_stage<BM> &S = stg[st % MMA_NS];
        const int k0 = kb + st * MMA_KS;
#pragma unroll
        for (int kk = 0; kk < MMA_KS / 32; kk++) {
            if (k0 + kk * 32 >= ke) break;   /* the block's last stage: its groups end here */
            if (kk % SPG == 0)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) is[mt][nt][e] = ISUM_BIAS;
            unsigned b0[2], b1[2];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const int nl = wn + nt * 8 + gq;
                if (FMT == IB_WQ4) {
                    /* chunk kk: word i holds k 8i..8i+7 (low nibbles the first 4) */
                    const unsigned *wv = (const unsigned *)&S.w[kk][nl];
                    b0[nt] = (wv[t >> 1] >> nib) & 0x0f0f0f0fu;
                    b1[nt] = (wv[2 + (t >> 1)] >> nib) & 0x0f0f0f0fu;
                } else {
                    b0[nt] = ((const unsigned *)&S.w[2 * kk][nl])[t];
                    b1[nt] = ((const unsigned *)&S.w[2 * kk + 1][nl])[t];
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                unsigned a[4];
                ldmatrix_x4(a, &S.a[a_row + 16 * mt][kk * 32 + a_col]);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) mma_k32<FMT>(is[mt][nt], a, b0[nt], b1[nt]);
            }
            if (kk % SPG == SPG - 1) {
                /* group kk / SPG of the stage ends here: its terms join every chain of the warp's
                 * tile, in group order */
                const int j = kk / SPG;
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
                        const float2 da = S.dad[j][wr + mt * 16 + gq + 8 * h];
                        dd[mt][h] = da.x, aa[mt][h] = da.y;
                    }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float sd = sc[nt][e & 1] * dd[mt][e >> 1], u = bi[nt][e & 1] * aa[mt][e >> 1];
                            const float fi = isum_float(is[mt][nt][e]);
                            float x = acc[mt][nt][e];
                            if (fused) x = __fmaf_rn(sd, fi, x);
                            else x = x + sd * fi;
                            acc[mt][nt][e] = x + u;
                        }
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

/* mm_q8_gemm_kernel for format fmt, bm-row blocks (32 or 64) and group size G (32, 64 or 128); its
 * dynamic shared bytes into *sm. (mm_q8_mma_fn: the tensor-core kernels' common signature.) */
template <int FMT, int BM>
static mm_q8_mma_fn mma_gemm_pick_g(int G) {
    return G == 32 ? mm_q8_gemm_kernel<FMT, BM, 32> : G == 64 ? mm_q8_gemm_kernel<FMT, BM, 64> : mm_q8_gemm_kernel<FMT, BM, 128>;
}
static mm_q8_mma_fn mma_gemm_pick(int fmt, int bm, int G, size_t *sm) {
    *sm = MMA_NS * (bm == 64 ? sizeof(mma_stage<64>) : sizeof(mma_stage<32>));
    if (bm == 64) return fmt == IB_WQ4 ? mma_gemm_pick_g<IB_WQ4, 64>(G) : mma_gemm_pick_g<IB_WQ8, 64>(G);
    return fmt == IB_WQ4 ? mma_gemm_pick_g<IB_WQ4, 32>(G) : mma_gemm_pick_g<IB_WQ8, 32>(G);
}

/* acc + (double)w * (double)x: the product of two floats is exact in double, so this is one rounding
 * (matmul.h's F32 step). fused: the test-only gpu-fma fault — a float32 chain of fused multiply-adds
 * instead (the double holds its floats exactly). */
__device__ __forceinline__ double f32_step(double acc, float w, float x, int fused) {
    return fused ? (double)__fmaf_rn(w, x, (float)acc) : acc + (double)w * (double)x;
}

/* Output n of x · W^T for one row x [K] with F32 activations: acc = acc + (double)w*(double)x over k
 * ascending in double, w the stored float or s*(float)q + b, rounded to float once (matmul.h). fused:
 * the test-only gpu-fma fault (f32_step). */
template <int FMT>
__device__ __forceinline__ float f32_chain(const dmat &m, int n, const float *__restrict__ x, int fused) {
    const int Np = m.Np;
    double acc = 0.0;
    if (FMT == IB_WF32) {
        for (int k = 0; k < m.K; k++) acc = f32_step(acc, m.wf[(size_t)k * Np + n], x[k], fused);
        return (float)acc;
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
                acc = f32_step(acc, sc * (float)q + bi, xc[i * (KC / 4) + e], fused);
            }
    }
    return (float)acc;
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
