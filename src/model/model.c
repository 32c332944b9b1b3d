/*
 * model.c — load a Hugging Face / MLX model directory into an ib_model.
 *
 * Every tensor is checked against config.json (dtype, shape) before use and converted or repacked
 * into the engine's layouts; the mapped files are closed at the end, so the model owns plain memory.
 * The repacking runs on a pool of the load's threads (ib_load_opts.threads): a stacked expert tensor
 * one expert per task, any other matrix by ranges of panels. Every byte of the model is written from
 * its own source bytes alone, so the loaded model is the same bytes whatever the thread count.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/half.h"
#include "core/pool.h"
#include "model/model.h"
#include "model/safetensors.h"

static const ib_dtype float_dtypes[] = {IB_DT_F32, IB_DT_BF16, IB_DT_F16};

/* Copy n elements of a float tensor (F32/BF16/F16, possibly unaligned) into out as float32. */
static void to_f32(const ib_st_tensor *t, size_t n, float *out) {
    const unsigned char *p = t->data;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == IB_DT_F32) {
            memcpy(&out[i], p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = t->dtype == IB_DT_BF16 ? ib_bf16_to_f32(h) : ib_f16_to_f32(h);
        }
    }
}

/* Fail unless every v[0..n) is finite: a NaN or infinite scale, bias or norm weight would load
 * without a word and make every answer garbage. */
static ib_status check_finite(const ib_st_set *st, const char *name, const float *v, size_t n, ib_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            const ib_st_tensor *t = ib_st_find(st, name);
            return ib_fail(err, IB_ERR_MODEL, "%s: tensor %s: element %zu is %s (scales, biases and norms must be finite)",
                           t ? ib_st_file_path(st, t->file) : "model", name, i, isnan(v[i]) ? "NaN" : "infinite");
        }
    return IB_OK;
}

/* Load a float vector tensor `name` of length n into a new array. */
static ib_status load_vec(const ib_st_set *st, const char *name, int n, float **out, ib_error *err) {
    const ib_st_tensor *t;
    int64_t shape[1] = {n};
    ib_status rc = ib_st_expect(st, name, float_dtypes, 3, 1, shape, &t, err);
    if (rc) return rc;
    *out = malloc((size_t)n * sizeof(float));
    if (!*out) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", name);
    to_f32(t, (size_t)n, *out);
    return check_finite(st, name, *out, (size_t)n, err); /* *out is the caller's to free either way */
}

/* Load the linear weight `prefix`.weight of shape [N, K] (float) or its MLX-quantized triple
 * (.weight U32 [N, K*bits/32], .scales/.biases [N, K/group]) into m, as config.json says. */
static ib_status load_linear(const ib_st_set *st, const ib_config *cfg, const char *prefix, int N, int K,
                             ib_matrix *m, ib_pool *pool, ib_error *err) {
    char name[256];
    const ib_st_tensor *t;
    ib_status rc;
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (cfg->quant_bits == 0) {
        const ib_st_tensor *w = ib_st_find(st, name);
        if (w && w->dtype == IB_DT_U32)
            return ib_fail(err, IB_ERR_MODEL,
                           "%s: tensor %s is quantized (U32) but config.json has no quantization",
                           ib_st_file_path(st, w->file), name);
        int64_t shape[2] = {N, K};
        rc = ib_st_expect(st, name, float_dtypes, 3, 2, shape, &t, err);
        if (rc) return rc;
        float *buf = malloc((size_t)N * K * sizeof(float));
        if (!buf) return ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", name);
        to_f32(t, (size_t)N * K, buf);
        rc = ib_matrix_from_f32_pool(m, buf, N, K, pool, err);
        free(buf);
        return rc;
    }
    int bits = cfg->quant_bits, G = cfg->quant_group;
    if (K % G != 0)
        return ib_fail(err, IB_ERR_MODEL, "%s: input size %d is not a multiple of group_size %d", prefix, K, G);
    static const ib_dtype u32[] = {IB_DT_U32};
    int64_t wshape[2] = {N, (int64_t)K * bits / 32};
    const ib_st_tensor *sc, *bi;
    char sname[256], bname[256];
    snprintf(sname, sizeof sname, "%s.scales", prefix);
    snprintf(bname, sizeof bname, "%s.biases", prefix);
    int64_t gshape[2] = {N, K / G};
    if ((rc = ib_st_expect(st, name, u32, 1, 2, wshape, &t, err))) return rc;
    if ((rc = ib_st_expect(st, sname, float_dtypes, 3, 2, gshape, &sc, err))) return rc;
    if ((rc = ib_st_expect(st, bname, float_dtypes, 3, 2, gshape, &bi, err))) return rc;
    size_t ng = (size_t)N * (K / G);
    float *s = malloc(ng * sizeof(float)), *b = malloc(ng * sizeof(float));
    if (!s || !b) {
        rc = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", prefix);
    } else { /* the codes are repacked from the mapped file as they are (any alignment) */
        to_f32(sc, ng, s);
        to_f32(bi, ng, b);
        if (!(rc = check_finite(st, sname, s, ng, err)) && !(rc = check_finite(st, bname, b, ng, err)))
            rc = ib_matrix_from_mlx_pool(m, t->data, s, b, N, K, bits, G, pool, err);
    }
    free(s);
    free(b);
    return rc;
}

/* A stacked expert tensor's load over the pool: task e builds expert e's matrix from its rows of the
 * stored tensors with its thread's buffer. Each expert's status and error are kept apart, and the one
 * reported is the lowest failing expert's, as a load of one expert after another reports it (experts
 * above a failed one are skipped; those built are freed with the model). */
typedef struct stack_job {
    const ib_st_set *st;
    const ib_st_tensor *t, *sc, *bi;   /* weight; scales and biases (quantized) */
    const char *sname, *bname;
    int quant, N, K, take, rows0, bits, G;
    ib_matrix *ms;                     /* [E] */
    unsigned char **buf;               /* [threads] */
    ib_status *rc;                     /* [E] */
    ib_error *errs;                    /* [E] */
    _Atomic int first_failed;          /* lowest failed expert so far (E: none) */
} stack_job;

static void stack_task(void *ctx, int e, int thread) {
    stack_job *j = ctx;
    if (e > atomic_load_explicit(&j->first_failed, memory_order_relaxed)) return;
    const int N = j->N, K = j->K;
    ib_status rc;
    if (!j->quant) {
        const ib_st_tensor *t = j->t;
        size_t per = (size_t)j->take * K, n = (size_t)N * K;
        float *buf = (float *)j->buf[thread];
        ib_st_tensor sub = *t; /* expert e's rows: to_f32 reads from sub.data */
        size_t eb = t->dtype == IB_DT_F32 ? 4 : 2;
        sub.data = (const unsigned char *)t->data + ((size_t)e * per + (size_t)j->rows0 * K) * eb;
        to_f32(&sub, n, buf);
        rc = ib_matrix_from_f32(&j->ms[e], buf, N, K, &j->errs[e]);
    } else {
        size_t nw = (size_t)N * K * j->bits / 32, ng = (size_t)N * (K / j->G);
        float *s = (float *)j->buf[thread], *b = s + ng;
        ib_st_tensor ss = *j->sc, bb = *j->bi;
        size_t sbe = j->sc->dtype == IB_DT_F32 ? 4 : 2, bbe = j->bi->dtype == IB_DT_F32 ? 4 : 2;
        ss.data = (const unsigned char *)j->sc->data + (size_t)e * ng * sbe;
        bb.data = (const unsigned char *)j->bi->data + (size_t)e * ng * bbe;
        to_f32(&ss, ng, s);
        to_f32(&bb, ng, b);
        /* the codes are repacked from the mapped file as they are (any alignment) */
        if (!(rc = check_finite(j->st, j->sname, s, ng, &j->errs[e])) &&
            !(rc = check_finite(j->st, j->bname, b, ng, &j->errs[e])))
            rc = ib_matrix_from_mlx_pool(&j->ms[e], (const unsigned char *)j->t->data + (size_t)e * nw * 4, s, b, N, K,
                                         j->bits, j->G, NULL, &j->errs[e]);
    }
    j->rc[e] = rc;
    if (rc) { /* lower first_failed to e */
        int f = atomic_load_explicit(&j->first_failed, memory_order_relaxed);
        while (e < f && !atomic_compare_exchange_weak(&j->first_failed, &f, e)) {}
    }
}

/* Load a stacked expert tensor [E, N, K] into E matrices, the experts split over the pool. MLX layout
 * (SwitchGLU): `prefix`.weight of shape [E, N, K] (float) or its quantized triple (.weight U32
 * [E, N, K*bits/32], .scales/.biases [E, N, K/group]). With `bare` the float tensor is stored under
 * `prefix` itself (transformers' experts.down_proj). rows0 / take: expert e's matrix is rows
 * [rows0, rows0 + N) of a stored [E, Ns, K] tensor of Ns = take rows per expert (transformers'
 * gate_up_proj holds gate then up: Ns = 2N). */
static ib_status load_stacked(const ib_st_set *st, const ib_config *cfg, const char *prefix, int bare, int E, int N,
                              int K, int take, int rows0, ib_matrix *ms, ib_pool *pool, ib_error *err) {
    char name[256], sname[256], bname[256];
    stack_job j = {.st = st, .sname = sname, .bname = bname, .N = N, .K = K, .take = take, .rows0 = rows0, .ms = ms};
    ib_status rc = IB_OK;
    size_t buf_bytes;
    snprintf(name, sizeof name, bare ? "%s" : "%s.weight", prefix);
    if (cfg->quant_bits == 0 || bare) {
        int64_t shape[3] = {E, take, K};
        if ((rc = ib_st_expect(st, name, float_dtypes, 3, 3, shape, &j.t, err))) return rc;
        buf_bytes = (size_t)N * K * sizeof(float);
    } else {
        int bits = cfg->quant_bits, G = cfg->quant_group;
        if (K % G != 0) return ib_fail(err, IB_ERR_MODEL, "%s: input size %d is not a multiple of group_size %d", prefix, K, G);
        static const ib_dtype u32[] = {IB_DT_U32};
        snprintf(sname, sizeof sname, "%s.scales", prefix);
        snprintf(bname, sizeof bname, "%s.biases", prefix);
        int64_t wshape[3] = {E, N, (int64_t)K * bits / 32}, gshape[3] = {E, N, K / G};
        if ((rc = ib_st_expect(st, name, u32, 1, 3, wshape, &j.t, err))) return rc;
        if ((rc = ib_st_expect(st, sname, float_dtypes, 3, 3, gshape, &j.sc, err))) return rc;
        if ((rc = ib_st_expect(st, bname, float_dtypes, 3, 3, gshape, &j.bi, err))) return rc;
        j.quant = 1;
        j.bits = bits;
        j.G = G;
        buf_bytes = 2 * (size_t)N * (K / G) * sizeof(float);
    }
    const int T = ib_pool_threads(pool);
    j.buf = calloc((size_t)T, sizeof *j.buf);
    j.rc = calloc((size_t)E, sizeof *j.rc);
    j.errs = calloc((size_t)E, sizeof *j.errs);
    int ok = j.buf && j.rc && j.errs;
    for (int t = 0; t < T && ok; t++) ok = (j.buf[t] = malloc(buf_bytes)) != NULL;
    if (!ok) {
        rc = ib_fail(err, IB_ERR_NOMEM, "%s: out of memory", j.quant ? prefix : name);
    } else {
        atomic_init(&j.first_failed, E);
        ib_pool_run(pool, E, stack_task, &j);
        int f = atomic_load(&j.first_failed);
        if (f < E) {
            rc = j.rc[f];
            *err = j.errs[f];
        }
    }
    for (int t = 0; j.buf && t < T; t++) free(j.buf[t]);
    free(j.buf);
    free(j.rc);
    free(j.errs);
    return rc;
}

/* Load layer i's MoE block (docs/gemma4.md): router, three norms, the experts either as mlx-lm stores
 * them (experts.switch_glu.{gate,up,down}_proj, float or quantized) or as transformers does
 * (experts.gate_up_proj [E, 2Fm, D] gate rows then up rows, experts.down_proj [E, D, Fm]; float). */
static ib_status load_moe(const ib_st_set *st, const ib_config *c, const char *pre, int i, ib_layer *l,
                          ib_pool *pool, ib_error *err) {
    char p[192], n[224];
    int D = c->hidden_size, E = c->n_experts, Fm = c->moe_ffn;
    ib_status rc;
#define VEC(field, sub, n_)                                                       \
    snprintf(n, sizeof n, "%slayers.%d.%s", pre, i, sub);                         \
    if ((rc = load_vec(st, n, (n_), &l->field, err))) return rc;
    VEC(post_mlp_norm1, "post_feedforward_layernorm_1.weight", D)
    VEC(pre_moe_norm, "pre_feedforward_layernorm_2.weight", D)
    VEC(post_moe_norm, "post_feedforward_layernorm_2.weight", D)
    VEC(router_scale, "router.scale", D)
    VEC(expert_scale, "router.per_expert_scale", E)
#undef VEC
    snprintf(p, sizeof p, "%slayers.%d.router.proj", pre, i);
    if ((rc = load_linear(st, c, p, E, D, &l->w_router, pool, err))) return rc;
    l->e_gate = calloc((size_t)E, sizeof(ib_matrix));
    l->e_up = calloc((size_t)E, sizeof(ib_matrix));
    l->e_down = calloc((size_t)E, sizeof(ib_matrix));
    if (!l->e_gate || !l->e_up || !l->e_down) return ib_fail(err, IB_ERR_NOMEM, "model: out of memory for experts");
    snprintf(p, sizeof p, "%slayers.%d.experts.gate_up_proj", pre, i);
    if (ib_st_find(st, p)) {
        if ((rc = load_stacked(st, c, p, 1, E, Fm, D, 2 * Fm, 0, l->e_gate, pool, err)) ||
            (rc = load_stacked(st, c, p, 1, E, Fm, D, 2 * Fm, Fm, l->e_up, pool, err)))
            return rc;
        snprintf(p, sizeof p, "%slayers.%d.experts.down_proj", pre, i);
        return load_stacked(st, c, p, 1, E, D, Fm, D, 0, l->e_down, pool, err);
    }
    snprintf(p, sizeof p, "%slayers.%d.experts.switch_glu.gate_proj", pre, i);
    if ((rc = load_stacked(st, c, p, 0, E, Fm, D, Fm, 0, l->e_gate, pool, err))) return rc;
    snprintf(p, sizeof p, "%slayers.%d.experts.switch_glu.up_proj", pre, i);
    if ((rc = load_stacked(st, c, p, 0, E, Fm, D, Fm, 0, l->e_up, pool, err))) return rc;
    snprintf(p, sizeof p, "%slayers.%d.experts.switch_glu.down_proj", pre, i);
    return load_stacked(st, c, p, 0, E, D, Fm, D, 0, l->e_down, pool, err);
}

static void free_experts(ib_matrix *ms, int E) {
    if (!ms) return;
    for (int e = 0; e < E; e++) ib_matrix_free(&ms[e]);
    free(ms);
}

static void free_layer(ib_layer *l) {
    free(l->attn_norm);
    free(l->q_norm);
    free(l->k_norm);
    free(l->mlp_norm);
    free(l->post_attn_norm);
    free(l->post_mlp_norm);
    ib_matrix_free(&l->wq);
    ib_matrix_free(&l->wk);
    ib_matrix_free(&l->wv);
    ib_matrix_free(&l->wo);
    ib_matrix_free(&l->w_gate);
    ib_matrix_free(&l->w_up);
    ib_matrix_free(&l->w_down);
    free(l->post_mlp_norm1);
    free(l->pre_moe_norm);
    free(l->post_moe_norm);
    free(l->router_scale);
    free(l->expert_scale);
    ib_matrix_free(&l->w_router);
    ib_matrix_free(&l->ple_gate);
    ib_matrix_free(&l->ple_proj);
    free(l->ple_norm);
}

void ib_model_free(ib_model *m) {
    if (!m) return;
    if (m->layers)
        for (int i = 0; i < m->cfg.n_layers; i++) {
            free_experts(m->layers[i].e_gate, m->cfg.n_experts);
            free_experts(m->layers[i].e_up, m->cfg.n_experts);
            free_experts(m->layers[i].e_down, m->cfg.n_experts);
            free_layer(&m->layers[i]);
        }
    free(m->layers);
    ib_matrix_free(&m->embed);
    ib_matrix_free(&m->lm_head_own);
    ib_matrix_free(&m->ple_embed);
    ib_matrix_free(&m->ple_model_proj);
    free(m->ple_proj_norm);
    free(m->final_norm);
    ib_tokenizer_free(m->tok);
    free(m);
}

/* Tensor-name prefix of the decoder (model. or, for model_type gemma4, model.language_model.). */
static const char *lm_prefix(const ib_config *c) { return c->tensor_prefix_lm ? "model.language_model." : "model."; }

/* Load Gemma 4 layer i (docs/gemma4.md): four norms, q/k norms, q/k/v/o (no v on full layers under
 * attention_k_eq_v), the GeGLU MLP (its width ib_config_layer_ffn: 2F on a KV-shared layer under
 * use_double_wide_mlp, each of gate/up/down shape-checked at it), the layer scalar. A KV-shared layer (num_kv_shared_layers) has
 * only q_proj, q_norm and o_proj for attention: its k_proj, v_proj and k_norm are not read (a file
 * may still hold them, accepted unread as transformers ignores them), and wk / wv stay empty. */
static ib_status load_layer_gemma4(const ib_st_set *st, const ib_config *c, int i, ib_layer *l, ib_pool *pool,
                                   ib_error *err) {
    char p[160], n[192];
    const char *pre = lm_prefix(c);
    int D = c->hidden_size, H = c->n_heads, F = ib_config_layer_ffn(c, i);
    int hd = l->hd, KVH = l->kvh;
    ib_status rc;
#define LIN(field, sub, N_, K_)                                                   \
    snprintf(p, sizeof p, "%slayers.%d.%s", pre, i, sub);                         \
    if ((rc = load_linear(st, c, p, (N_), (K_), &l->field, pool, err))) return rc;
#define VEC(field, sub, n_)                                                       \
    snprintf(n, sizeof n, "%slayers.%d.%s.weight", pre, i, sub);                  \
    if ((rc = load_vec(st, n, (n_), &l->field, err))) return rc;
    VEC(attn_norm, "input_layernorm", D)
    VEC(post_attn_norm, "post_attention_layernorm", D)
    VEC(mlp_norm, "pre_feedforward_layernorm", D)
    VEC(post_mlp_norm, "post_feedforward_layernorm", D)
    VEC(q_norm, "self_attn.q_norm", hd)
    LIN(wq, "self_attn.q_proj", H * hd, D)
    if (!c->kv_from[i]) {
        VEC(k_norm, "self_attn.k_norm", hd)
        LIN(wk, "self_attn.k_proj", KVH * hd, D)
        if (!(c->k_eq_v && !l->sliding)) {
            LIN(wv, "self_attn.v_proj", KVH * hd, D)
        }
    } else { /* a KV-shared layer's own k/v tensors, when a file has them: accepted, never read */
        static const char *const unread[] = {"self_attn.k_proj.weight", "self_attn.k_proj.scales",
                                             "self_attn.k_proj.biases", "self_attn.v_proj.weight",
                                             "self_attn.v_proj.scales", "self_attn.v_proj.biases",
                                             "self_attn.k_norm.weight"};
        for (size_t u = 0; u < sizeof unread / sizeof unread[0]; u++) {
            snprintf(n, sizeof n, "%slayers.%d.%s", pre, i, unread[u]);
            if (ib_st_find(st, n) && (rc = ib_st_expect(st, n, NULL, 0, -1, NULL, NULL, err))) return rc;
        }
    }
    LIN(wo, "self_attn.o_proj", D, H * hd)
    LIN(w_gate, "mlp.gate_proj", F, D)
    LIN(w_up, "mlp.up_proj", F, D)
    LIN(w_down, "mlp.down_proj", D, F)
    if (c->ple_dim > 0) { /* the per-layer input block */
        LIN(ple_gate, "per_layer_input_gate", c->ple_dim, D)
        LIN(ple_proj, "per_layer_projection", D, c->ple_dim)
        VEC(ple_norm, "post_per_layer_input_norm", D)
    }
#undef LIN
#undef VEC
    float *s = NULL;
    snprintf(n, sizeof n, "%slayers.%d.layer_scalar", pre, i);
    if ((rc = load_vec(st, n, 1, &s, err))) {
        free(s);
        return rc;
    }
    l->layer_scalar = s[0];
    free(s);
    return c->n_experts > 0 ? load_moe(st, c, pre, i, l, pool, err) : IB_OK;
}

/* Load layer i's tensors. */
static ib_status load_layer(const ib_st_set *st, const ib_config *c, int i, ib_layer *l, ib_pool *pool,
                            ib_error *err) {
    char p[128], n[160];
    int D = c->hidden_size, hd = c->head_dim, H = c->n_heads, KVH = c->n_kv_heads, F = c->intermediate_size;
    ib_status rc;
    l->hd = ib_config_layer_hd(c, i);
    l->kvh = ib_config_layer_kvh(c, i);
    l->sliding = c->arch == IB_ARCH_GEMMA4 && c->layer_sliding[i];
    l->layer_scalar = 1.0f;
    if (c->arch == IB_ARCH_GEMMA4) return load_layer_gemma4(st, c, i, l, pool, err);
#define LIN(field, sub, N_, K_)                                                   \
    snprintf(p, sizeof p, "model.layers.%d.%s", i, sub);                          \
    if ((rc = load_linear(st, c, p, (N_), (K_), &l->field, pool, err))) return rc;
#define VEC(field, sub, n_)                                                       \
    snprintf(n, sizeof n, "model.layers.%d.%s.weight", i, sub);                   \
    if ((rc = load_vec(st, n, (n_), &l->field, err))) return rc;
    VEC(attn_norm, "input_layernorm", D)
    VEC(mlp_norm, "post_attention_layernorm", D)
    if (c->qk_norm) {
        VEC(q_norm, "self_attn.q_norm", hd)
        VEC(k_norm, "self_attn.k_norm", hd)
    }
    LIN(wq, "self_attn.q_proj", H * hd, D)
    LIN(wk, "self_attn.k_proj", KVH * hd, D)
    LIN(wv, "self_attn.v_proj", KVH * hd, D)
    LIN(wo, "self_attn.o_proj", D, H * hd)
    LIN(w_gate, "mlp.gate_proj", F, D)
    LIN(w_up, "mlp.up_proj", F, D)
    LIN(w_down, "mlp.down_proj", D, F)
#undef LIN
#undef VEC
    return IB_OK;
}

static size_t matrix_bytes(const ib_matrix *m) { return m->bytes; }

static const char *arch_label(const ib_config *c) {
    return c->arch == IB_ARCH_GEMMA4 ? "gemma4" : c->arch == IB_ARCH_QWEN3 ? "qwen3" : "llama";
}

/* Fill m->info from the config and the loaded weights. */
static void fill_info(ib_model *m, const ib_st_set *st) {
    const ib_config *c = &m->cfg;
    ib_model_info *in = &m->info;
    snprintf(m->arch_name, sizeof m->arch_name, "%s", arch_label(c));
    in->arch = m->arch_name;
    in->vocab_size = c->vocab_size;
    in->hidden_size = c->hidden_size;
    in->n_layers = c->n_layers;
    in->n_heads = c->n_heads;
    in->n_kv_heads = c->n_kv_heads;
    in->head_dim = c->head_dim;
    in->intermediate_size = c->intermediate_size;
    in->max_context = c->max_position;
    in->rope_theta = (float)c->rope_theta;
    in->rms_eps = (float)c->rms_eps;
    in->tied_embeddings = c->tie_embeddings;
    in->quant_bits = c->quant_bits;
    in->quant_group = c->quant_group;
    const ib_st_tensor *e = ib_st_find(st, "model.embed_tokens.weight");
    snprintf(m->dtype_name, sizeof m->dtype_name, "%s",
             c->quant_bits ? "mlx-affine" : e && e->dtype == IB_DT_BF16 ? "bfloat16" : e && e->dtype == IB_DT_F16 ? "float16" : "float32");
    in->weight_dtype = m->dtype_name;
    size_t D = c->hidden_size, hd = c->head_dim, F = c->intermediate_size, V = c->vocab_size;
    size_t per_layer = 2 * D + (c->qk_norm ? 2 * hd : 0) + D * hd * (c->n_heads * 2 + c->n_kv_heads * 2) + 3 * D * F;
    in->n_params = V * D * (c->tie_embeddings ? 1 : 2) + D + per_layer * c->n_layers;
    if (c->arch == IB_ARCH_GEMMA4) { /* per-layer shapes: count each layer's own */
        in->n_params = V * D * (c->tie_embeddings ? 1 : 2) + D;
        for (int i = 0; i < c->n_layers; i++) {
            const ib_layer *l = &m->layers[i];
            in->n_params += 4 * D + (l->k_norm ? 2 : 1) * (size_t)l->hd + 1 + (size_t)l->wq.rows * l->wq.cols +
                            (size_t)l->wk.rows * l->wk.cols +
                            (size_t)l->wv.rows * l->wv.cols + (size_t)l->wo.rows * l->wo.cols +
                            3 * D * (size_t)l->w_gate.rows;   /* the layer's own F (2F when double-wide) */
            in->n_double_wide += (size_t)l->w_gate.rows == 2 * F;
            if (c->ple_dim > 0) /* the per-layer input block */
                in->n_params += 2 * D * (size_t)c->ple_dim + D;
            if (c->n_experts > 0) /* router, its scales, three norms, the experts */
                in->n_params += (size_t)c->n_experts * (D + 1 + 3 * D * (size_t)c->moe_ffn) + 4 * D;
        }
    }
    in->file_bytes = ib_st_total_bytes(st);
    size_t wb = matrix_bytes(&m->embed) + matrix_bytes(&m->lm_head_own) + D * 4, eb = 0;
    for (int i = 0; i < c->n_layers; i++) {
        const ib_layer *l = &m->layers[i];
        wb += matrix_bytes(&l->wq) + matrix_bytes(&l->wk) + matrix_bytes(&l->wv) + matrix_bytes(&l->wo) +
              matrix_bytes(&l->w_gate) + matrix_bytes(&l->w_up) + matrix_bytes(&l->w_down) + (2 * D + 2 * hd) * 4;
        wb += matrix_bytes(&l->w_router);
        for (int e = 0; e < c->n_experts; e++)
            eb += matrix_bytes(&l->e_gate[e]) + matrix_bytes(&l->e_up[e]) + matrix_bytes(&l->e_down[e]);
    }
    wb += eb;
    if (c->arch == IB_ARCH_GEMMA4) wb += (size_t)c->n_layers * (2 * D + 4) * 4; /* post-norms, layer scalar */
    if (c->ple_dim > 0) { /* per-layer embeddings: the table, the projection, the per-layer blocks */
        size_t P = (size_t)c->ple_dim, LP = P * c->n_layers;
        in->n_params += V * LP + LP * D + P;
        wb += matrix_bytes(&m->ple_embed) + matrix_bytes(&m->ple_model_proj) + P * 4;
        for (int i = 0; i < c->n_layers; i++)
            wb += matrix_bytes(&m->layers[i].ple_gate) + matrix_bytes(&m->layers[i].ple_proj) + D * 4;
    }
    in->weight_bytes = wb;
    in->expert_bytes = eb;
    in->kv_bytes_per_token = in->kv_bytes_per_token_sliding = 0;   /* every layer at its own shape */
    for (int li = 0; li < c->n_layers; li++) {
        if (c->kv_from[li]) continue;   /* a KV-shared layer stores nothing */
        size_t b = (size_t)2 * ib_config_layer_kvh(c, li) * ib_config_layer_hd(c, li) * sizeof(float);
        in->kv_bytes_per_token += b;
        if (c->arch == IB_ARCH_GEMMA4 && c->layer_sliding[li]) in->kv_bytes_per_token_sliding += b;
    }
    in->sliding_window = c->arch == IB_ARCH_GEMMA4 ? c->sliding_window : 0;
    in->n_experts = c->n_experts;
    in->top_k = c->top_k;
    in->moe_intermediate_size = c->moe_ffn;
    in->bos_id = c->bos_id;
    in->eos_id = c->eos_id;
}

ib_status ib_model_load(const char *dir, const ib_load_opts *opts, ib_model **out, ib_error *err) {
    *out = NULL;
    char path[4096];
    ib_st_set *st = NULL;
    ib_pool *pool = NULL;
    ib_status rc;
    int threads = opts ? opts->threads : 0;
    if (threads > IB_MAX_DEFAULT_THREADS)
        return ib_fail(err, IB_ERR_INVALID_ARG, "model: threads %d is more than %d", threads, IB_MAX_DEFAULT_THREADS);
    if (threads <= 0) { /* as ib_engine_opts.threads: every online CPU */
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : n > IB_MAX_DEFAULT_THREADS ? IB_MAX_DEFAULT_THREADS : (int)n;
    }
    ib_model *m = calloc(1, sizeof *m);
    if (!m) return ib_fail(err, IB_ERR_NOMEM, "model: out of memory");
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path) {
        rc = ib_fail(err, IB_ERR_INVALID_ARG, "%s: path too long", dir);
        goto fail;
    }
    struct stat cs;
    if (stat(path, &cs) == 0 && !S_ISREG(cs.st_mode)) { /* a FIFO would block the read for ever */
        rc = ib_fail(err, IB_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    if ((rc = ib_config_load(path, &m->cfg, err))) goto fail;
    if ((rc = ib_st_open_dir(dir, &st, err))) goto fail;
    if ((rc = ib_pool_create(threads, &pool, err))) goto fail;
    const ib_config *c = &m->cfg;
    int D = c->hidden_size, V = c->vocab_size;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = ib_fail(err, IB_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    char name[96];
    snprintf(name, sizeof name, "%sembed_tokens", lm_prefix(c));
    if ((rc = load_linear(st, c, name, V, D, &m->embed, pool, err))) goto fail;
    m->embed_scale = c->arch == IB_ARCH_GEMMA4 ? (float)sqrt((double)D) : 1.0f;
    if (c->ple_dim > 0) { /* Gemma 4 per-layer embeddings: the table, the projection of X, its norm */
        const int LP = c->n_layers * c->ple_dim;
        snprintf(name, sizeof name, "%sembed_tokens_per_layer", lm_prefix(c));
        if ((rc = load_linear(st, c, name, V, LP, &m->ple_embed, pool, err))) goto fail;
        m->ple_embed_scale = (float)sqrt((double)c->ple_dim);
        snprintf(name, sizeof name, "%sper_layer_model_projection", lm_prefix(c));
        if ((rc = load_linear(st, c, name, LP, D, &m->ple_model_proj, pool, err))) goto fail;
        snprintf(name, sizeof name, "%sper_layer_projection_norm.weight", lm_prefix(c));
        if ((rc = load_vec(st, name, c->ple_dim, &m->ple_proj_norm, err))) goto fail;
    }
    for (int i = 0; i < c->n_layers; i++)
        if ((rc = load_layer(st, c, i, &m->layers[i], pool, err))) goto fail;
    snprintf(name, sizeof name, "%snorm.weight", lm_prefix(c));
    if ((rc = load_vec(st, name, D, &m->final_norm, err))) goto fail;
    if (c->has_towers) /* model_type gemma4: the vision and audio towers' tensors are left unread */
        for (int i = 0; i < ib_st_count(st); i++) {
            const char *tn = ib_st_at(st, i)->name;
            if (strncmp(tn, "model.vision_tower.", 19) == 0 || strncmp(tn, "model.audio_tower.", 18) == 0 ||
                strncmp(tn, "model.embed_vision.", 19) == 0 || strncmp(tn, "model.embed_audio.", 18) == 0)
                if ((rc = ib_st_expect(st, tn, NULL, 0, -1, NULL, NULL, err))) goto fail;
        }
    if (c->tie_embeddings) {
        m->lm_head = &m->embed;
    } else {
        if ((rc = load_linear(st, c, "lm_head", V, D, &m->lm_head_own, pool, err))) goto fail;
        m->lm_head = &m->lm_head_own;
    }
    char what[128];
    snprintf(what, sizeof what, "this model (model_type %s, %d layers, %s embeddings)",
             arch_label(c), c->n_layers, c->tie_embeddings ? "tied" : "untied");
    if ((rc = ib_st_check_used(st, what, err))) goto fail;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        rc = ib_fail(err, IB_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    if (stat(path, &sb) == 0)
        rc = ib_tokenizer_load(path, V, &m->tok, err);
    else
        rc = ib_tokenizer_bytes(V, &m->tok, err);
    if (rc) goto fail;
    fill_info(m, st);
    ib_pool_free(pool);
    ib_st_close(st);
    *out = m;
    return IB_OK;
fail:
    ib_pool_free(pool);
    ib_st_close(st);
    ib_model_free(m);
    return rc;
}

const ib_model_info *ib_model_get_info(const ib_model *m) { return &m->info; }

int ib_tokenize(const ib_model *m, const char *text, size_t len, int32_t *ids, int cap) {
    return ib_tokenizer_encode(m->tok, text, len, ids, cap);
}

int ib_token_bytes(const ib_model *m, int32_t id, char *out, int cap) {
    return ib_tokenizer_decode(m->tok, id, out, cap);
}
