/*
 * panel_f32_impl.h — the F32-activation panel loop of the matmul kernels, one body for matmul_scalar.c,
 * matmul_avx2.c, matmul_avx512.c and matmul_neon.c (each includes it once, after defining its own pieces). The
 * blocking is pack.h's: rows in chunks of IB_RCHUNK whose double accumulators live on the stack, K in
 * blocks of IB_KBLOCK whose weights are dequantized (or read) as floats; a chunk of F32_WIDEN_MIN_ROWS
 * rows or more widens each block's weights to doubles once for all its row tiles, a smaller one
 * widens them in each tile (one row: B=1 decode). The blocking never changes a bit.
 *
 * The includer defines, before the #include:
 *   F32_ALIGN                          the stack buffers' alignment (its vector size)
 *   void dequant_block(const ib_matrix *m, int p, int k0, int kn, float *w)
 *                                      columns [k0, k0+kn) of quantized panel p as floats, w [kn][16]
 *   void widen_block(const float *w, double *wd, int n)
 *                                      n floats (a multiple of 16) to doubles, exactly
 *   void rows_f32(ib_pk_chain ch, int WD, double (*acc)[16], const float *x, size_t ldx, int nb,
 *                 const void *w, int kn, int desc)
 *                                      the chunk's nb rows' tiles over one K block, w [kn][16] doubles
 *                                      (WD) or floats, k ascending (descending when desc)
 */

/* Chunks of at least this many rows widen each K block's weights to doubles once for all their tiles;
 * fewer widen them in each tile (qwen3-0.6b 16-bit, 2 AVX-512 threads: B=1 9.8 tok/s with the pass
 * for one row, 11.6 without). */
#define F32_WIDEN_MIN_ROWS 3

/* F32 activations, panel p, all B rows: Y[b][16p + j] for the panel's lanes, by the chain ch. */
static void panel_f32(const ib_matrix *m, int p, const float *X, int B, int desc, ib_pk_chain ch, float *Y, int ldy) {
    const int K = m->cols, lanes = ib_pk_lanes(m, p), nblk = (K + IB_KBLOCK - 1) / IB_KBLOCK;
    float wbuf[IB_KBLOCK * 16] __attribute__((aligned(F32_ALIGN)));   /* [IB_KBLOCK][16] */
    double wd[IB_KBLOCK * 16] __attribute__((aligned(F32_ALIGN)));    /* [IB_KBLOCK][16]: the block's w as doubles */
    double acc[IB_RCHUNK][16] __attribute__((aligned(F32_ALIGN)));    /* [rows of the chunk][lane] */
    for (int b0 = 0; b0 < B; b0 += IB_RCHUNK) {
        int nb = B - b0 < IB_RCHUNK ? B - b0 : IB_RCHUNK;
        memset(acc, 0, sizeof(double) * 16 * (size_t)nb);
        for (int bi = 0; bi < nblk; bi++) {
            int blk = desc ? nblk - 1 - bi : bi;
            int k0 = blk * IB_KBLOCK, kn = K - k0 < IB_KBLOCK ? K - k0 : IB_KBLOCK;
            const float *w;
            if (m->fmt == IB_WF32) {
                w = (const float *)ib_pk_panel(m, p) + (size_t)k0 * 16;
            } else {
                dequant_block(m, p, k0, kn, wbuf);
                w = wbuf;
            }
            const float *x = X + (size_t)b0 * K + k0;
            if (ch == IB_PK_CHAIN_DOUBLE && nb < F32_WIDEN_MIN_ROWS) {
                rows_f32(IB_PK_CHAIN_DOUBLE, 0, acc, x, (size_t)K, nb, w, kn, desc);
                continue;
            }
            widen_block(w, wd, kn * 16);
            switch (ch) {
            case IB_PK_CHAIN_DOUBLE: rows_f32(IB_PK_CHAIN_DOUBLE, 1, acc, x, (size_t)K, nb, wd, kn, desc); break;
            case IB_PK_CHAIN_FLOAT: rows_f32(IB_PK_CHAIN_FLOAT, 1, acc, x, (size_t)K, nb, wd, kn, desc); break;
            default: rows_f32(IB_PK_CHAIN_FLOAT_FMA, 1, acc, x, (size_t)K, nb, wd, kn, desc); break;
            }
        }
        for (int r = 0; r < nb; r++) ib_pk_store_f64(Y + (size_t)(b0 + r) * ldy + (size_t)p * 16, acc[r], lanes);
    }
}
