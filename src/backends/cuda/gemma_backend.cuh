/*
 * gemma_backend.cuh — the host side of the CUDA backend's Gemma 4 ops: the instance's Gemma state
 * (weights, tables, routing scratch), its creation and upload, and the launches of gemma_kernels.cuh's
 * kernels for each op; included by cuda_backend.cu right after those kernels. The layout of a layer's
 * cache view and the kernels' definitions are described in gemma_kernels.cuh.
 */

/* Gemma 4 state of an instance (b->gm; NULL for other families). Device pointers unless said. */
typedef struct gemma_state {
    float embed_scale;               /* model->embed_scale */
    float softcap;                   /* final_logit_softcapping (0: none) */
    int ghd;                         /* global_head_dim (the full layers' RoPE table width) */
    double theta_full;
    int pairs_full;
    float *d_cs_full, *h_cs_full;    /* [R_max][ghd/2][2]: device, pinned host */
    /* per layer (host arrays [L]) */
    int *sliding, *own_kv, *k_eq_v, *att_head;   /* att_head: G * hd exceeds ATT_QH (per-query-head kernel) */
    int *ffn;                        /* the layer's dense MLP width (ib_config_layer_ffn: 2F when double-wide;
                                      * G / U are sized b->F = the widest) */
    long long *offA, *offB;          /* the layer's (or its source's) key offset = A * cap + B * sliding cap */
    float *layer_scalar;
    const float **qn, **kn;          /* [L] q_norm, k_norm [hd] (NULL: none) */
    const float **nrm;               /* [L][8] the norms by ib_nsel (post-norms, MoE norms) */
    /* MoE (n_experts > 0) */
    int E, K, Fm;
    float rscale;                    /* (float)(1/sqrt(D)): the router input's scale */
    const dmat *router;              /* host [L] */
    const float **router_scale, **expert_scale;   /* [L] device [D], [E] */
    const dmat **egate, **eup, **edown;           /* [L] device arrays of E matrices each */
    int fmt_gu, fmt_dn;              /* the experts' formats (the same for every expert of a kind) */
    int G_gu, G_dn;                  /* and their groups (Q8 activations quantize each input once per group) */
    float *rin;                      /* [R_max][D] router input */
    float *rlog;                     /* [R_max][E] router logits */
    int32_t *sel;                    /* [R_max][K] selected experts in rank order (-1: none) */
    float *w;                        /* [R_max][K] their weights */
    int32_t *ent_row, *ent_slot;     /* [R_max*K] (row, slot r*K + j) of each routed pair, grouped by expert */
    int4 *blk;                       /* [nblk_max] (expert, first pair, pairs) of each product block row */
    int *nblk;                       /* [1] blocks in use this step */
    unsigned *route_cnt;             /* [1] routing blocks finished (zero between launches) */
    int32_t *load;                   /* [E] each expert's pairs this step (the test-only moe-combine-by-load fault) */
    int nblk_max;
    float *mg, *mu;                  /* [R_max*K][Fm] each pair's gate, then its GeGLU; up */
    float *my;                       /* [R_max*K][D] each pair's expert output */
    int8_t *mxq;                     /* [R_max*K][Fm] Q8 codes of the GeGLU rows */
    float *mqd, *mqad;               /* [R_max*K][Fm/32 + 1] */
    /* per-layer embeddings (ple_dim P > 0) */
    int P;
    float ple_escale;                /* ple_embed_scale */
    float ple_s1, ple_s2;            /* (float)(1/sqrt(D)), (float)(1/sqrt(2)) */
    dmat ple_embed, ple_mproj;       /* [V, L*P], [L*P, D] */
    const float *ple_pnorm;          /* [P] per_layer_projection_norm */
    dmat *ple_gate, *ple_proj;       /* host [L]: [P, D], [D, P] */
    const float **ple_norm;          /* [L] device [D] post_per_layer_input_norm */
    float *pli;                      /* [R_max][L*P] the step's per-layer inputs */
    float *pg;                       /* [R_max][P] a layer's gate, then its GeGLU */
    float *py;                       /* [R_max][D] a layer's block output */
} gemma_state;

/* ---------------------------------------------------------------- host side */

/* Free the Gemma state's host arrays (device memory is in b's allocation list). */
static void gemma_free(gemma_state *g) {
    if (!g) return;
    cudaFreeHost(g->h_cs_full);
    free(g->sliding), free(g->own_kv), free(g->k_eq_v), free(g->att_head), free(g->offA), free(g->offB), free(g->ffn);
    free(g->layer_scalar), free((void *)g->qn), free((void *)g->kn), free((void *)g->nrm);
    free((void *)g->router), free((void *)g->router_scale), free((void *)g->expert_scale);
    free((void *)g->egate), free((void *)g->eup), free((void *)g->edown);
    free(g->ple_gate), free(g->ple_proj), free((void *)g->ple_norm);
    free(g);
}

/* Upload a host float array (n floats; NULL: NULL). *ok cleared on failure. */
static const float *gemma_upf(cuda_backend *b, const float *h, size_t n, int *ok) {
    if (!h) return NULL;
    const float *p = (const float *)dupload(b, h, n * sizeof(float));
    if (!p) *ok = 0;
    return p;
}

/* The E matrices ms[0..E) uploaded (upload_matrix) and their descriptors as a device array in *out. */
static ib_status gemma_experts(cuda_backend *b, const ib_matrix *ms, int E, const dmat **out, int *fmt, ib_error *err) {
    dmat *h = (dmat *)calloc((size_t)E, sizeof(dmat));
    if (!h) return ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
    ib_status rc = IB_OK;
    for (int e = 0; e < E && !rc; e++) {
        if (ms[e].fmt != ms[0].fmt || ms[e].group != ms[0].group || ms[e].rows != ms[0].rows || ms[e].cols != ms[0].cols)
            rc = ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: gemma4 experts of one layer in different formats are not supported");
        else rc = upload_matrix(b, &ms[e], &h[e], err);
    }
    if (!rc) {
        *fmt = ms[0].fmt;
        *out = (const dmat *)dupload(b, h, (size_t)E * sizeof(dmat));
        if (!*out) rc = ib_fail(err, IB_ERR_NOMEM, "cuda: out of device memory for the experts' descriptors");
    }
    free(h);
    return rc;
}

/* b's Gemma 4 state for model m (called by cuda_create after the layers' matrices are uploaded):
 * per-layer shapes and cache offsets, norms, RoPE staging, the MoE block's and the per-layer
 * embeddings' matrices and scratch. Refuses with one line a shape the kernels do not take. */
static ib_status gemma_create(cuda_backend *b, const ib_model *m, ib_error *err) {
    const ib_config *c = &m->cfg;
    const int L = c->n_layers, D = c->hidden_size, Rm = b->R_max, H = c->n_heads;
    gemma_state *g = (gemma_state *)calloc(1, sizeof *g);
    if (!g) return ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
    b->gm = g;
    g->embed_scale = m->embed_scale;
    g->softcap = (float)c->final_softcap;
    g->ghd = c->global_head_dim;
    g->theta_full = c->rope_theta_full;
    g->pairs_full = c->rope_pairs_full;
    g->sliding = (int *)calloc(L, sizeof(int)), g->own_kv = (int *)calloc(L, sizeof(int));
    g->k_eq_v = (int *)calloc(L, sizeof(int)), g->att_head = (int *)calloc(L, sizeof(int));
    g->offA = (long long *)calloc(L, sizeof(long long)), g->offB = (long long *)calloc(L, sizeof(long long));
    g->layer_scalar = (float *)calloc(L, sizeof(float));
    g->ffn = (int *)calloc(L, sizeof(int));
    g->qn = (const float **)calloc(L, sizeof(float *)), g->kn = (const float **)calloc(L, sizeof(float *));
    g->nrm = (const float **)calloc((size_t)L * 8, sizeof(float *));
    if (!g->sliding || !g->own_kv || !g->k_eq_v || !g->att_head || !g->offA || !g->offB || !g->layer_scalar || !g->ffn || !g->qn ||
        !g->kn || !g->nrm)
        return ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
    if (cudaMallocHost((void **)&g->h_cs_full, (size_t)Rm * g->ghd * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        g->h_cs_full = NULL;
        return ib_fail(err, IB_ERR_NOMEM, "cuda: out of pinned host memory");
    }
    /* the per-head attention's stage (att_stage_bytes) takes more than the default 48 KB */
    if (cudaFuncSetAttribute(gemma_attention_head_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             ATT_STAGE_MAX) != cudaSuccess ||
        cudaFuncSetAttribute(gemma_attention_head_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             ATT_STAGE_MAX) != cudaSuccess) {
        cudaGetLastError();
        return ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: could not give the attention its shared memory");
    }
    g->d_cs_full = (float *)dalloc(b, (size_t)Rm * g->ghd * sizeof(float));
    int ok = g->d_cs_full != NULL;
    long long A = 0, B = 0;   /* elements per (full, sliding) slot of the owned layers so far */
    for (int li = 0; li < L; li++) {
        const ib_layer *ly = &m->layers[li];
        const int hd = ly->hd, KVH = ly->kvh, own = ly->wk.rows > 0;
        if (hd > IB_ATTN_MAX_HD || hd % 2 || KVH < 1 || H % KVH || (own ? 0 : ib_config_kv_layer(c, li) >= li))
            return ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: gemma4 layer %d: head_dim %d / KV heads %d not supported", li,
                           hd, KVH);
        g->sliding[li] = ly->sliding != 0;
        g->own_kv[li] = own;
        g->k_eq_v[li] = own && ly->wv.rows == 0;
        g->att_head[li] = H / KVH > IB_ATTN_MAX_GROUP || (H / KVH) * hd > ATT_QH;
        g->layer_scalar[li] = ly->layer_scalar;
        g->ffn[li] = ly->w_gate.rows;   /* ib_config_layer_ffn(c, li), as loaded */
        if (g->ffn[li] > b->F)
            return ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: gemma4 layer %d: MLP width %d above the scratch's %d", li,
                           g->ffn[li], b->F);
        if (own) {
            g->offA[li] = A, g->offB[li] = B;
            if (g->sliding[li]) B += 2LL * KVH * hd;
            else A += 2LL * KVH * hd;
        } else {
            const int src = ib_config_kv_layer(c, li);
            g->offA[li] = g->offA[src], g->offB[li] = g->offB[src];
        }
        g->qn[li] = gemma_upf(b, ly->q_norm, hd, &ok);
        g->kn[li] = own ? gemma_upf(b, ly->k_norm, hd, &ok) : NULL;
        const float *hn[8] = {NULL, NULL, NULL, ly->post_attn_norm, ly->post_mlp_norm, ly->post_mlp_norm1,
                              ly->pre_moe_norm, ly->post_moe_norm};
        for (int k = IB_N_POST_ATTN; k <= IB_N_POST_MOE; k++) g->nrm[(size_t)li * 8 + k] = gemma_upf(b, hn[k], D, &ok);
    }
    if (!ok) return ib_fail(err, IB_ERR_NOMEM, "cuda: out of device memory for the gemma4 norms");
    if (c->n_experts > 0) {
        const int E = c->n_experts, K = c->top_k, Fm = c->moe_ffn;
        g->E = E, g->K = K, g->Fm = Fm;
        g->rscale = (float)(1.0 / sqrt((double)D));
        dmat *router = (dmat *)calloc(L, sizeof(dmat));
        g->router = router;
        g->router_scale = (const float **)calloc(L, sizeof(float *));
        g->expert_scale = (const float **)calloc(L, sizeof(float *));
        g->egate = (const dmat **)calloc(L, sizeof(dmat *));
        g->eup = (const dmat **)calloc(L, sizeof(dmat *));
        g->edown = (const dmat **)calloc(L, sizeof(dmat *));
        if (!router || !g->router_scale || !g->expert_scale || !g->egate || !g->eup || !g->edown)
            return ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
        ib_status rc;
        for (int li = 0; li < L; li++) {
            const ib_layer *ly = &m->layers[li];
            int fg, fu, fd;
            if ((rc = upload_matrix(b, &ly->w_router, &router[li], err))) return rc;
            if ((rc = gemma_experts(b, ly->e_gate, E, &g->egate[li], &fg, err))) return rc;
            if ((rc = gemma_experts(b, ly->e_up, E, &g->eup[li], &fu, err))) return rc;
            if ((rc = gemma_experts(b, ly->e_down, E, &g->edown[li], &fd, err))) return rc;
            if (fg != fu || ly->e_gate[0].group != ly->e_up[0].group || (li > 0 && (fg != g->fmt_gu || fd != g->fmt_dn)))
                return ib_fail(err, IB_ERR_UNSUPPORTED, "cuda: gemma4 experts whose gate, up and down formats differ "
                               "between layers or from each other are not supported");
            g->fmt_gu = fg, g->fmt_dn = fd, g->G_gu = ly->e_gate[0].group, g->G_dn = ly->e_down[0].group;
            g->router_scale[li] = gemma_upf(b, ly->router_scale, D, &ok);
            g->expert_scale[li] = gemma_upf(b, ly->expert_scale, E, &ok);
        }
        const size_t RK = (size_t)Rm * K;
        g->nblk_max = (int)((RK + MOE_CH - 1) / MOE_CH) + E;
        g->rin = (float *)dalloc(b, (size_t)Rm * D * sizeof(float));
        g->rlog = (float *)dalloc(b, (size_t)Rm * E * sizeof(float));
        g->sel = (int32_t *)dalloc(b, RK * sizeof(int32_t));
        g->w = (float *)dalloc(b, RK * sizeof(float));
        g->ent_row = (int32_t *)dalloc(b, RK * sizeof(int32_t));
        g->ent_slot = (int32_t *)dalloc(b, RK * sizeof(int32_t));
        g->blk = (int4 *)dalloc(b, (size_t)g->nblk_max * sizeof(int4));
        g->nblk = (int *)dalloc(b, sizeof(int));
        g->route_cnt = (unsigned *)dalloc(b, sizeof(unsigned));
        g->load = (int32_t *)dalloc(b, (size_t)E * sizeof(int32_t));
        if (g->route_cnt && cudaMemset(g->route_cnt, 0, sizeof(unsigned)) != cudaSuccess) g->route_cnt = NULL;
        g->mg = (float *)dalloc(b, RK * Fm * sizeof(float));
        g->mu = (float *)dalloc(b, RK * Fm * sizeof(float));
        g->my = (float *)dalloc(b, RK * D * sizeof(float));
        g->mxq = (int8_t *)dalloc(b, RK * Fm);
        g->mqd = (float *)dalloc(b, RK * (Fm / 32 + 1) * sizeof(float));
        g->mqad = (float *)dalloc(b, RK * (Fm / 32 + 1) * sizeof(float));
        if (!ok || !g->rin || !g->rlog || !g->sel || !g->w || !g->ent_row || !g->ent_slot || !g->blk ||
            !g->nblk || !g->route_cnt || !g->load || !g->mg || !g->mu || !g->my || !g->mxq || !g->mqd || !g->mqad)
            return ib_fail(err, IB_ERR_NOMEM, "cuda: out of device memory for the gemma4 MoE scratch of %d rows", Rm);
    }
    if (c->ple_dim > 0) {
        const int P = c->ple_dim;
        const size_t LP = (size_t)L * P;
        g->P = P;
        g->ple_escale = m->ple_embed_scale;
        g->ple_s1 = (float)(1.0 / sqrt((double)D));
        g->ple_s2 = (float)(1.0 / sqrt(2.0));
        ib_status rc;
        if ((rc = upload_matrix(b, &m->ple_embed, &g->ple_embed, err))) return rc;
        if ((rc = upload_matrix(b, &m->ple_model_proj, &g->ple_mproj, err))) return rc;
        g->ple_pnorm = gemma_upf(b, m->ple_proj_norm, P, &ok);
        g->ple_gate = (dmat *)calloc(L, sizeof(dmat));
        g->ple_proj = (dmat *)calloc(L, sizeof(dmat));
        g->ple_norm = (const float **)calloc(L, sizeof(float *));
        if (!g->ple_gate || !g->ple_proj || !g->ple_norm) return ib_fail(err, IB_ERR_NOMEM, "cuda: out of host memory");
        for (int li = 0; li < L; li++) {
            if ((rc = upload_matrix(b, &m->layers[li].ple_gate, &g->ple_gate[li], err))) return rc;
            if ((rc = upload_matrix(b, &m->layers[li].ple_proj, &g->ple_proj[li], err))) return rc;
            g->ple_norm[li] = gemma_upf(b, m->layers[li].ple_norm, D, &ok);
        }
        g->pli = (float *)dalloc(b, (size_t)Rm * LP * sizeof(float));
        g->pg = (float *)dalloc(b, (size_t)Rm * P * sizeof(float));
        g->py = (float *)dalloc(b, (size_t)Rm * D * sizeof(float));
        if (!ok || !g->pli || !g->pg || !g->py)
            return ib_fail(err, IB_ERR_NOMEM, "cuda: out of device memory for the gemma4 per-layer embeddings of %d rows", Rm);
    }
    return IB_OK;
}

/* Gemma 4 norm weights of kind n (a post-norm or MoE norm) of layer li. */
static const float *gemma_norm(const cuda_backend *b, int n, int li) { return b->gm->nrm[(size_t)li * 8 + n]; }

/* step_begin's Gemma 4 part: the full layers' RoPE table (ib_rope_table_pairs over global_head_dim). */
static void gemma_step_begin(cuda_backend *b) {
    gemma_state *g = b->gm;
    ib_rope_table_pairs(b->h_pos, b->R, g->ghd, g->theta_full, g->pairs_full, g->h_cs_full);
}

/* The full layers' RoPE table to the device (part of the step's upload). */
static void gemma_upload(cuda_backend *b) {
    gemma_state *g = b->gm;
    note(b, cudaMemcpyAsync(g->d_cs_full, g->h_cs_full, (size_t)b->R * g->ghd * sizeof(float), cudaMemcpyHostToDevice, b->st),
         "upload");
}

/* x *= s over R rows of n floats (ib_scale). */
static void launch_scale(cuda_backend *b, float *x, size_t n, float s) {
    launch(b, scale_kernel, blocks_for(n, 256), 256, 0, x, n, s);
    LAUNCHED(b, "scale");
}

/* Layer li's qk_prepare (gemma_qk_kernel). */
static void gemma_launch_qk(cuda_backend *b, int li, int phases) {
    gemma_state *g = b->gm;
    const int R = b->R, H = b->H, KVH = b->lkvh[li], hd = b->lhd[li], own = g->own_kv[li];
    const int skip = b->fault == IB_FAULT_ROPE_SKIP_ROWS && b->n_items > 1 && b->n_items == R;
    const dim3 grid(blocks_for((size_t)(H + (own ? KVH : 0)), QK_WARPS), (unsigned)R);
    launch(b, gemma_qk_kernel, grid, 32 * QK_WARPS, (size_t)QK_WARPS * 2 * hd * sizeof(float), b->buf[IB_BUF_Q],
           b->buf[IB_BUF_K], b->buf[IB_BUF_V], (const float *)(g->sliding[li] ? b->d_cs : g->d_cs_full),
           (const rowinfo *)b->d_ri, g->qn[li], g->kn[li], H, KVH, hd, phases, own, g->k_eq_v[li], g->sliding[li],
           g->offA[li], g->offB[li], b->eps, skip ? 1 : R);
    LAUNCHED(b, "gemma qk");
}

/* Layer li's attention (scale 1): a block per (row, KV head) from att_group_rows rows when the layer's
 * G * hd fits one block, else a block per (row, query head) — the same arithmetic. qG as
 * launch_attention. */
static void gemma_launch_attention(cuda_backend *b, int li, int qG) {
    gemma_state *g = b->gm;
    float *Q = b->buf[IB_BUF_Q], *ATT = b->buf[IB_BUF_ATT];
    const int KVH = b->lkvh[li], hd = b->lhd[li];
    if (b->R >= b->att_group_rows && !g->att_head[li])
        launch(b, gemma_attention_kernel, b->R * KVH, ATT_THREADS, 0, (const float *)Q, ATT, (const rowinfo *)b->d_ri, b->H,
               KVH, hd, g->sliding[li], g->offA[li], g->offB[li], 1.0f, b->attn_block, qG, b->xq, b->qd, b->qad);
    else {
        const int cl = att_cluster(b, b->R * b->H, hd), blocks = b->R * b->H * cl, st = att_stage_bytes(b, blocks);
        launch_cl(b, cl, cl > 1 ? gemma_attention_head_kernel<true> : gemma_attention_head_kernel<false>, blocks, ATT_THREADS, (size_t)st, (const float *)Q, ATT,
                  (const rowinfo *)b->d_ri, b->H, KVH, hd, g->sliding[li], g->offA[li], g->offB[li], 1.0f, b->attn_block,
                  qG, b->xq, b->qd, b->qad, st, cl);
    }
    LAUNCHED(b, "gemma attention");
}

/* Layer li's dense MLP width (its G / U rows are packed at it). */
static int gemma_ffn(const cuda_backend *b, int li) { return b->gm->ffn[li]; }

/* G = geglu(G, U) over layer li's F (rows [R][F of li]); qG > 0: its rows also quantized for group qG. */
static void launch_geglu(cuda_backend *b, int li, int qG) {
    const int F = gemma_ffn(b, li);
    if (qG > 0) {
        const size_t warps = (size_t)b->R * (F / qG);
        launch(b, geglu_q8_kernel, blocks_for(warps * 32, 256), 256, 0, b->buf[IB_BUF_G], (const float *)b->buf[IB_BUF_U],
               b->R, F, qG, b->xq, b->qd, b->qad, (const int32_t *)NULL);
    } else {
        const size_t n = (size_t)b->R * F;
        launch(b, geglu_kernel, blocks_for(n, 256), 256, 0, b->buf[IB_BUF_G], (const float *)b->buf[IB_BUF_U], n);
    }
    LAUNCHED(b, "geglu");
}

/* The experts' products of one kind over the routed pairs: z = 2 (gate and up into mg / mu, input the
 * pair's row of X / xq) or 1 (down into my, input the pair's slot of mg / mxq). */
static void launch_moe_mm(cuda_backend *b, int fmt, const dmat *m0, const dmat *m1, float *Y0, float *Y1, int N, int by_slot,
                          const float *X, const int8_t *xq, const float *qd, const float *qad, int q8) {
    gemma_state *g = b->gm;
    const int fused = b->fault == IB_FAULT_GPU_FMA;
    /* block rows: at most ceil(R*K / MOE_CH) + min(E, R*K) (sized by R, never by the routing) */
    const int RK = b->R * g->K, nby = (RK + MOE_CH - 1) / MOE_CH + (g->E < RK ? g->E : RK);
    const dim3 grid((unsigned)((N + NT * NWARP - 1) / (NT * NWARP)), (unsigned)nby, m1 ? 2u : 1u);
    /* uint4 words of codes per group: G / 32 (4-bit) or G / 16 (8-bit) */
    const int G = by_slot ? g->G_dn : g->G_gu, cpg = fmt == IB_WQ4 ? G / 32 : G / 16;
    void (*k)(const dmat *, const dmat *, float *, float *, const int4 *, const int *, const int32_t *,
              const int32_t *, int, const float *, const int8_t *, const float *, const float *, int, int) =
        fmt == IB_WF32                ? moe_mm_kernel<IB_WF32, 1>
        : fmt == IB_WQ4 && cpg == 1   ? moe_mm_kernel<IB_WQ4, 1>
        : fmt == IB_WQ4 && cpg == 2   ? moe_mm_kernel<IB_WQ4, 2>
        : fmt == IB_WQ4               ? moe_mm_kernel<IB_WQ4, 4>
        : cpg == 2                    ? moe_mm_kernel<IB_WQ8, 2>
        : cpg == 4                    ? moe_mm_kernel<IB_WQ8, 4>
                                      : moe_mm_kernel<IB_WQ8, 8>;
    if (q8 && fmt != IB_WF32 && b->moe_split) {
        /* the warps of a block split the groups: a block a 32-output tile */
        void (*ks)(const dmat *, const dmat *, float *, float *, const int4 *, const int *, const int32_t *,
                   const int32_t *, int, const int8_t *, const float *, const float *, int) =
            fmt == IB_WQ4 && cpg == 1   ? moe_mm_split_kernel<IB_WQ4, 1>
            : fmt == IB_WQ4 && cpg == 2 ? moe_mm_split_kernel<IB_WQ4, 2>
            : fmt == IB_WQ4             ? moe_mm_split_kernel<IB_WQ4, 4>
            : cpg == 2                  ? moe_mm_split_kernel<IB_WQ8, 2>
            : cpg == 4                  ? moe_mm_split_kernel<IB_WQ8, 4>
                                        : moe_mm_split_kernel<IB_WQ8, 8>;
        const dim3 gs((unsigned)((N + NT - 1) / NT), (unsigned)nby, m1 ? 2u : 1u);
        launch(b, ks, gs, 256, 0, m0, m1, Y0, Y1, (const int4 *)g->blk, (const int *)g->nblk, (const int32_t *)g->ent_row,
               (const int32_t *)g->ent_slot, by_slot, xq, qd, qad, fused);
    } else {
        launch(b, k, grid, 256, 0, m0, m1, Y0, Y1, (const int4 *)g->blk, (const int *)g->nblk, (const int32_t *)g->ent_row,
               (const int32_t *)g->ent_slot, by_slot, X, xq, qd, qad, q8, fused);
    }
    LAUNCHED(b, "moe products");
}

/* Layer li's routed experts (backend.h `moe`; cpu_moe's numbers): router input rmsnorm(route_in,
 * router.scale) then ib_scale by 1/sqrt(D); router logits (a product); ib_moe_route per row and the
 * work lists on the device (moe_route_kernel: no host round trip, the step stays one graph); gate and
 * up of every routed pair in one launch, GeGLU (+ the down product's Q8 quantization), down; then
 * ib_moe_combine per row in rank order into out. Each selected expert's matrices are read by its own
 * block rows, for all its rows at once. The CPU's test-only MoE faults are modelled as cpu_moe applies
 * them: moe-capacity in the routing kernel (ib_moe_fault_capacity), moe-combine-by-load in the combine
 * (the step's experts by descending load: ib_moe_fault_load_order). */
static void gemma_launch_moe(cuda_backend *b, int li, int route_in, int in, int out) {
    gemma_state *g = b->gm;
    const int R = b->R, D = b->D, E = g->E, K = g->K, Fm = g->Fm;
    const int q8 = b->act == IB_ACT_Q8;
    const int capacity = b->fault == IB_FAULT_MOE_CAPACITY;
    int32_t *by_load = b->fault == IB_FAULT_MOE_COMBINE_BY_LOAD ? g->load : NULL;
    /* router */
    launch_rmsnorm(b, b->buf[route_in], g->router_scale[li], R, D, g->rin, 1);
    launch_scale(b, g->rin, (size_t)R * D, g->rscale);
    const dmat *rt = &g->router[li];
    const int rq8 = q8 && rt->fmt != IB_WF32;
    if (rq8) launch_quantize(b, g->rin, R, rt->K, rt->G);
    launch_product(b, rt, g->rin, R, rq8, g->rlog);
    /* warps a block: as many as ROUTE_SCRATCH_BYTES hold (E + K words each; 6 or more, E <= 1024) */
    const int fit = (int)(ROUTE_SCRATCH_BYTES / ((size_t)(E + K) * sizeof(float)));
    const int rw = fit < ROUTE_WARPS_MAX ? fit : ROUTE_WARPS_MAX;
    launch(b, moe_route_kernel, (R + rw - 1) / rw, 32 * rw, (size_t)rw * (E + K) * sizeof(float), (const float *)g->rlog, R,
           E, K, g->expert_scale[li], g->sel, g->w, g->ent_row, g->ent_slot, g->blk, g->nblk, g->route_cnt, capacity, by_load);
    LAUNCHED(b, "moe route");
    /* gate and up: the input rows quantized once (each row's own numbers) */
    const int gq8 = q8 && g->fmt_gu != IB_WF32;
    if (gq8) launch_quantize(b, b->buf[in], R, D, g->G_gu);
    for (int t = 0; t < launches(b, REPEAT_MOE); t++)
        launch_moe_mm(b, g->fmt_gu, g->egate[li], g->eup[li], g->mg, g->mu, Fm, 0, b->buf[in], b->xq, b->qd, b->qad, gq8);
    /* GeGLU of each routed pair (+ the down product's quantization) */
    const int dq8 = q8 && g->fmt_dn != IB_WF32;
    if (dq8) {
        const size_t warps = (size_t)R * K * (Fm / g->G_dn);
        launch(b, geglu_q8_kernel, blocks_for(warps * 32, 256), 256, 0, g->mg, (const float *)g->mu, R * K, Fm, g->G_dn,
               g->mxq, g->mqd, g->mqad, (const int32_t *)g->sel);
    } else {
        launch(b, geglu_sel_kernel, blocks_for((size_t)R * K * Fm, 256), 256, 0, g->mg, (const float *)g->mu, R * K, Fm,
               (const int32_t *)g->sel);
    }
    LAUNCHED(b, "moe geglu");
    for (int t = 0; t < launches(b, REPEAT_MOE); t++)
        launch_moe_mm(b, g->fmt_dn, g->edown[li], NULL, g->my, NULL, D, 1, g->mg, g->mxq, g->mqd, g->mqad, dq8);
    launch(b, moe_combine_kernel, blocks_for((size_t)R * D, 256), 256, 0, (const float *)g->my, (const float *)g->w,
           (const int32_t *)g->sel, R, K, D, b->buf[out], (const int32_t *)by_load);
    LAUNCHED(b, "moe combine");
}

/* After embed: X *= embed_scale (ib_scale) when it is not 1. */
static void gemma_after_embed(cuda_backend *b) {
    if (b->gm->embed_scale != 1.0f) launch_scale(b, b->buf[IB_BUF_X], (size_t)b->R * b->D, b->gm->embed_scale);
}

/* n rows of logits L [n][V] soft-capped (ib_softcap) when the model has final_logit_softcapping. */
static void gemma_softcap(cuda_backend *b, float *L, int n) {
    if (b->gm->softcap <= 0) return;
    const size_t cnt = (size_t)n * b->V;
    launch(b, softcap_kernel, blocks_for(cnt, 256), 256, 0, L, cnt, b->gm->softcap);
    LAUNCHED(b, "softcap");
}

/* X *= layer li's layer_scalar (ib_scale). */
static void gemma_scale_layer(cuda_backend *b, int li) {
    launch_scale(b, b->buf[IB_BUF_X], (size_t)b->R * b->D, b->gm->layer_scalar[li]);
}

/* Per-layer inputs of the step's rows (backend.h `ple_inputs`; cpu_ple_inputs' numbers): PLI = X ·
 * per_layer_model_projection^T (a product, the engine's activation mode), times (float)(1/sqrt(D)),
 * each P-slice rmsnorm'ed with per_layer_projection_norm (the row-norm kernel over R*L vectors), then
 * ple_combine_kernel (+ the scaled per-layer embedding row, times (float)(1/sqrt(2))). */
static void gemma_launch_ple_inputs(cuda_backend *b) {
    gemma_state *g = b->gm;
    const int R = b->R, LP = b->L * g->P;
    const dmat *pm = &g->ple_mproj;
    const int q8 = b->act == IB_ACT_Q8 && pm->fmt != IB_WF32;
    if (q8) launch_quantize(b, b->buf[IB_BUF_X], R, pm->K, pm->G);
    launch_product(b, pm, b->buf[IB_BUF_X], R, q8, g->pli);
    launch_scale(b, g->pli, (size_t)R * LP, g->ple_s1);
    launch_rmsnorm(b, g->pli, g->ple_pnorm, R * b->L, g->P, g->pli, 1);
    launch(b, ple_combine_kernel, blocks_for((size_t)R * LP, 256), 256, 0, g->pli, g->ple_embed, (const int32_t *)b->d_tok,
           R, g->ple_escale, g->ple_s2);
    LAUNCHED(b, "ple inputs");
}

/* Layer li's per-layer input block (backend.h `ple_layer`; cpu_ple_layer's numbers): pg = X ·
 * per_layer_input_gate^T, GeGLU with the row's PLI[li] (+ the next product's quantization), py = pg ·
 * per_layer_projection^T, rmsnorm'ed with post_per_layer_input_norm, X += py. */
static void gemma_launch_ple_layer(cuda_backend *b, int li) {
    gemma_state *g = b->gm;
    const int R = b->R, P = g->P, LP = b->L * P;
    const dmat *gt = &g->ple_gate[li], *pj = &g->ple_proj[li];
    const int q8g = b->act == IB_ACT_Q8 && gt->fmt != IB_WF32, q8p = b->act == IB_ACT_Q8 && pj->fmt != IB_WF32;
    if (q8g) launch_quantize(b, b->buf[IB_BUF_X], R, gt->K, gt->G);
    launch_product(b, gt, b->buf[IB_BUF_X], R, q8g, g->pg);
    const int qG = q8p ? pj->G : 0;
    const size_t threads = qG > 0 ? (size_t)R * (P / qG) * 32 : (size_t)R * P;
    launch(b, ple_geglu_kernel, blocks_for(threads, 256), 256, 0, g->pg, (const float *)g->pli, R, P, LP, li, qG, b->xq,
           b->qd, b->qad);
    LAUNCHED(b, "ple geglu");
    launch_product(b, pj, g->pg, R, q8p, g->py);
    launch_rmsnorm(b, g->py, g->ple_norm[li], R, b->D, g->py, 1);
    const size_t n = (size_t)R * b->D;
    launch(b, add_kernel, blocks_for(n, 256), 256, 0, b->buf[IB_BUF_X], (const float *)g->py, n);
    LAUNCHED(b, "ple add");
}

/* Defined after this file's inclusion in cuda_backend.cu. */
static void flush_direct(cuda_backend *b);
static float *host_rows(cuda_backend *b, size_t n);

/* backend.h read_ple_inputs: run what is recorded, wait, copy rows [0, R) of the per-layer inputs
 * ([R][L*P]) into host scratch (valid until the next call); NULL without per-layer embeddings. */
static const float *gemma_read_ple_inputs(ib_backend *base, int R) {
    cuda_backend *b = (cuda_backend *)base;
    if (!b->gm || b->gm->P == 0) return NULL;
    const size_t n = (size_t)R * b->L * b->gm->P;
    float *h = host_rows(b, n);
    if (!h) return NULL;
    flush_direct(b);
    note(b, cudaStreamSynchronize(b->st), "read_ple_inputs");
    note(b, cudaMemcpy(h, b->gm->pli, n * sizeof(float), cudaMemcpyDeviceToHost), "read_ple_inputs");
    return h;
}
