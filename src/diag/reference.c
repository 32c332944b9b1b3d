/*
 * reference.c — a float64 reference forward pass and the accuracy metrics of `isobatch accuracy`.
 *
 * ib_reference_logits is a textbook forward of one sequence from position 0, written apart from the
 * engine's ops: the only engine function it calls is ib_matrix_row_f32, to read each weight row as the
 * floats the F32 activation path multiplies with (for quantized models: s*q + b, in float). Everything
 * after that — norms, projections, RoPE, attention, softmax, SwiGLU, the residual stream — is double.
 * It follows the architecture the engine implements (src/runtime/step.c): RMSNorm y = x/sqrt(mean(x^2)
 * + eps) * w, per-head q/k RMSNorm when the layer has one (Qwen3), RoPE on split halves, causal GQA
 * attention scaled by 1/sqrt(head_dim), SwiGLU MLP, final norm, m->lm_head (the embedding when tied).
 *
 * The metrics (ib_accuracy_add) compare one token's engine logits against the reference's: argmax
 * agreement, KL(ref || engine) of the log-softmaxes, max |difference|, and sums for the relative L2
 * error over all logits. ib_accuracy_run drives an engine over the tokens one step at a time.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "diag/diag.h"
#include "model/model.h"

/* Threads each weight product's rows are split over: the CPUs online, at most REF_MAX_THREADS (a
 * product of fewer multiply-adds than REF_MIN_PARALLEL runs on the caller alone). Each output is one
 * thread's dot product, so the result does not depend on the split. */
#define REF_MAX_THREADS 64
#define REF_MIN_PARALLEL 1000000.0
/* Gemma 4's router input is one token's [D] on the stack; top-k selections likewise. */
#define IB_REF_MAX_D 16384
#define IB_REF_MAX_TOPK 64

/* ---------------------------------------------------------------- linear layers */

/* One thread's share of a product: rows [n0, n1) of w against all T tokens. */
typedef struct lin_job {
    const ib_matrix *w;
    const double *X;     /* [T][K] */
    int T;
    double *Y;           /* [T][N] */
    int n0, n1;
    float *wf;           /* [K] scratch: the row as floats */
    double *wd;          /* [K] scratch: the row as doubles */
} lin_job;

/* a · b over n doubles with four partial sums (the order is irrelevant at float64 precision against a
 * float32 engine). */
static double dot(const double *a, const double *b, int n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* Rows outer, tokens inner: each weight row is dequantized once and applied to every token. */
static void *lin_run(void *arg) {
    lin_job *j = arg;
    const int K = j->w->cols, N = j->w->rows;
    for (int n = j->n0; n < j->n1; n++) {
        ib_matrix_row_f32(j->w, n, j->wf);
        for (int k = 0; k < K; k++) j->wd[k] = j->wf[k];
        for (int t = 0; t < j->T; t++) j->Y[(size_t)t * N + n] = dot(j->wd, j->X + (size_t)t * K, K);
    }
    return NULL;
}

/* One forward pass's product threads (nt), their scratch rows (nt of float [Kmax] and double [Kmax])
 * and its storage: f32 1 rounds every stored activation to float32 (store below). */
typedef struct ref_pass {
    float *wf[REF_MAX_THREADS];
    double *wd[REF_MAX_THREADS];
    int nt;
    unsigned f32;   /* the parts (ib_ref_store bits) stored as float32 */
} ref_pass;

/* a [n], values of the storage part `part`, as the pass stores them: unchanged, or (that part's bit set)
 * each rounded to float32 — the arithmetic stays double, so the pass then shows what storing these
 * activations as float32 alone costs: the floor of an engine that stores them so. */
static void store(const ref_pass *s, ib_ref_store part, double *a, size_t n) {
    if (s->f32 & (unsigned)part)
        for (size_t i = 0; i < n; i++) a[i] = (double)(float)a[i];
}

const char *ib_ref_store_part_name(ib_ref_store part) {
    switch (part) {
    case IB_REF_F32_RESIDUAL: return "residual";
    case IB_REF_F32_NORMED: return "normed";
    case IB_REF_F32_QKV: return "qkv";
    case IB_REF_F32_ATTENTION: return "attention";
    case IB_REF_F32_BLOCK: return "block";
    case IB_REF_F32_HIDDEN: return "hidden";
    case IB_REF_F32_PRODUCTS: return "products";
    case IB_REF_F32_LOGITS: return "logits";
    default: return NULL;
    }
}

/* Decide the pass's threads (the CPUs online, 1..REF_MAX_THREADS) and give each its row buffers of
 * Kmax elements; 0 when one could not be had (the ones that could are in s, freed with the rest by
 * ref_pass_free). */
static int ref_pass_alloc(ref_pass *s, int Kmax) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    s->nt = cpus < 1 ? 1 : cpus > REF_MAX_THREADS ? REF_MAX_THREADS : (int)cpus;
    int ok = 1;
    for (int i = 0; i < s->nt; i++) {
        s->wf[i] = malloc((size_t)Kmax * sizeof(float));
        s->wd[i] = malloc((size_t)Kmax * sizeof(double));
        ok = ok && s->wf[i] && s->wd[i];
    }
    return ok;
}

/* Frees the row buffers of s (any that ref_pass_alloc got). */
static void ref_pass_free(ref_pass *s) {
    for (int i = 0; i < REF_MAX_THREADS; i++) free(s->wf[i]), free(s->wd[i]);
}

/* Y[T][N] = X[T][K] · W^T for W = w ([N][K]), rows split over up to s->nt threads. A thread
 * that cannot be started is run on the caller (same result). */
static void linear(const ib_matrix *w, const double *X, int T, double *Y, ref_pass *s) {
    int nt = (double)w->rows * w->cols * T < REF_MIN_PARALLEL ? 1 : s->nt;
    if (nt > w->rows) nt = w->rows > 0 ? w->rows : 1;
    lin_job jobs[REF_MAX_THREADS];
    pthread_t th[REF_MAX_THREADS];
    int started[REF_MAX_THREADS] = {0};
    for (int i = 0; i < nt; i++) {
        jobs[i] = (lin_job){w, X, T, Y, (int)((long)w->rows * i / nt), (int)((long)w->rows * (i + 1) / nt), s->wf[i],
                            s->wd[i]};
        if (i > 0) started[i] = pthread_create(&th[i], NULL, lin_run, &jobs[i]) == 0;
    }
    lin_run(&jobs[0]);
    for (int i = 1; i < nt; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else lin_run(&jobs[i]);
    }
    store(s, IB_REF_F32_PRODUCTS, Y, (size_t)T * w->rows);
}

/* ---------------------------------------------------------------- the other layers */

/* y[n] = x[n] / sqrt(mean(x^2) + eps) * w[n]; y may be x. */
static void rmsnorm(const double *x, const float *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (w ? (double)w[i] : 1.0);
}

/* Rotate each head of one token's x ([nh][hd]) on split halves: pairs (i, i + hd/2) by the angle
 * whose cos/sin are cs[i][0..1] ([hd/2][2]). */
static void rope(double *x, int nh, int hd, const double *cs) {
    int half = hd / 2;
    for (int h = 0; h < nh; h++) {
        double *v = x + (size_t)h * hd;
        for (int i = 0; i < half; i++) {
            double c = cs[2 * i], s = cs[2 * i + 1], a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

/* Causal GQA attention of all T tokens of one sequence: for token t and head h (kv head
 * h / (H/KVH)), softmax over j <= t of q_t·k_j / sqrt(hd), then the weighted sum of v_j.
 * q, out: [T][H][hd]; k, v: [T][KVH][hd]; p: [T] scratch. */
static void attention(const double *q, const double *k, const double *v, int T, int H, int KVH, int hd, double *p,
                      double *out) {
    double scale = 1.0 / sqrt((double)hd);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int kvh = h / (H / KVH);
            const double *qh = q + ((size_t)t * H + h) * hd;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                p[j] = dot(qh, k + ((size_t)j * KVH + kvh) * hd, hd) * scale;
                if (p[j] > mx) mx = p[j];
            }
            for (int j = 0; j <= t; j++) sum += p[j] = exp(p[j] - mx);
            double *o = out + ((size_t)t * H + h) * hd;
            for (int d = 0; d < hd; d++) o[d] = 0;
            for (int j = 0; j <= t; j++) {
                const double *vj = v + ((size_t)j * KVH + kvh) * hd;
                double wj = p[j] / sum;
                for (int d = 0; d < hd; d++) o[d] += wj * vj[d];
            }
        }
}

/* ---------------------------------------------------------------- Gemma 4 (docs/gemma4.md) */

/* gelu_pytorch_tanh(a) = a/2 (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))). */
static double gelu_tanh(double a) { return 0.5 * a * (1.0 + tanh(sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a))); }

/* The routed experts of layer L for one token: h [D] the residual after attention (the router's
 * input), xe [D] its pre_feedforward_layernorm_2 norm (the experts' input); out [D] = the sum, in rank
 * order, of each chosen expert's GeGLU MLP times its weight (softmax over all experts' router logits,
 * renormalized over the top-k, times per_expert_scale). Scratch: rl [E], gu [2][Fm], y [D]. */
static void gemma4_moe(const ib_config *c, const ib_layer *L, const double *h, const double *xe, double *out,
                       double *rl, double *gu, double *y, ref_pass *s) {
    const int D = c->hidden_size, E = c->n_experts, K = c->top_k, Fm = c->moe_ffn;
    double r[IB_REF_MAX_D];
    rmsnorm(h, NULL, D, c->rms_eps, r);
    for (int d = 0; d < D; d++) r[d] = r[d] * (double)L->router_scale[d] / sqrt((double)D);
    store(s, IB_REF_F32_NORMED, r, (size_t)D);
    linear(&L->w_router, r, 1, rl, s);
    int sel[IB_REF_MAX_TOPK] = {0};
    for (int j = 0; j < K; j++) { /* rank j: the largest logit not yet taken, ties to the lowest id */
        int b = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (b < 0 || rl[e] > rl[b])) b = e;
        }
        sel[j] = b;
    }
    double mx = rl[sel[0]], z = 0, zk = 0;
    for (int e = 0; e < E; e++) z += exp(rl[e] - mx);
    for (int j = 0; j < K; j++) zk += exp(rl[sel[j]] - mx) / z;
    for (int d = 0; d < D; d++) out[d] = 0;
    for (int j = 0; j < K; j++) {
        int e = sel[j];
        double w = exp(rl[e] - mx) / z / zk * (double)L->expert_scale[e];
        linear(&L->e_gate[e], xe, 1, gu, s);
        linear(&L->e_up[e], xe, 1, gu + Fm, s);
        for (int f = 0; f < Fm; f++) gu[f] = gelu_tanh(gu[f]) * gu[Fm + f];
        store(s, IB_REF_F32_HIDDEN, gu, (size_t)Fm);
        linear(&L->e_down[e], gu, 1, y, s);
        for (int d = 0; d < D; d++) out[d] += w * y[d];
        store(s, IB_REF_F32_BLOCK, out, (size_t)D);
    }
}

/* The Gemma 4 forward pass of one sequence (docs/gemma4.md "The forward pass" and "Mixture of
 * experts"), in double: embedding times sqrt(D); per layer its type's head size, KV heads, RoPE
 * (sliding: theta^(-2i/hd) on every pair; full: proportional, the first rope_pairs_full pairs with
 * theta_full^(-2i/global_head_dim), the rest not rotated) and window; q/k/v head norms (v without a
 * weight; v = the raw k on full layers under attention_k_eq_v), attention scale 1, post-norms, GeGLU,
 * the MoE block, the layer scalar; final norm, lm_head, soft-cap. Each layer's MLP at its own F
 * (ib_config_layer_ffn: 2F on a double-wide KV-shared layer). A KV-shared layer (num_kv_shared_layers)
 * attends to its source layer's normed and rotated keys and values, kept from that layer. Per-layer
 * embeddings (ple_dim P > 0): each token's [L][P] inputs from the projection of its embedding (scaled
 * 1/sqrt(D), normed per P-slice) plus its per-layer table row (times sqrt(P)), times 1/sqrt(2); after
 * each layer's MLP, X += rmsnorm(proj(gelu_tanh(gate(X)) * input of the layer)). logits [T][V]; st: the
 * parts stored as float32 (ib_ref_store). */
static ib_status reference_gemma4(const ib_model *m, const int32_t *tokens, int T, ib_ref_store st, double *logits,
                                  ib_error *err) {
    const ib_config *c = &m->cfg;
    /* F: the widest layer's MLP (2 x intermediate_size with double-wide KV-shared layers) */
    const int D = c->hidden_size, H = c->n_heads, F = ib_config_ffn_max(c), V = c->vocab_size, E = c->n_experts;
    const int hdm = c->kv_hd_max, kvm = c->kv_heads_max, Fm = c->moe_ffn;
    const double eps = c->rms_eps;
    if (D > IB_REF_MAX_D || c->top_k > IB_REF_MAX_TOPK)
        return ib_fail(err, IB_ERR_UNSUPPORTED, "reference: gemma4 with hidden size %d or top-k %d above %d / %d", D,
                       c->top_k, IB_REF_MAX_D, IB_REF_MAX_TOPK);
    int Kmax = D > F ? D : F;
    if (H * hdm > Kmax) Kmax = H * hdm;
    if (Fm > Kmax) Kmax = Fm;
    const int P = c->ple_dim, LP = c->n_layers * c->ple_dim;
    if (P > Kmax) Kmax = P;
    size_t TT = (size_t)T;
    double *x = malloc(TT * D * sizeof *x), *xn = malloc(TT * D * sizeof *xn), *o = malloc(TT * D * sizeof *o);
    double *q = malloc(TT * H * hdm * sizeof *q), *k = malloc(TT * kvm * hdm * sizeof *k);
    double *v = malloc(TT * kvm * hdm * sizeof *v), *att = malloc(TT * H * hdm * sizeof *att);
    double *g = malloc(TT * F * sizeof *g), *u = malloc(TT * F * sizeof *u), *p = malloc(TT * sizeof *p);
    double *cs = malloc(TT * (hdm / 2) * 2 * sizeof *cs);
    double *rl = malloc(((size_t)E + 1) * sizeof *rl), *gu = malloc(((size_t)2 * Fm + 1) * sizeof *gu);
    double *y = malloc((size_t)D * sizeof *y), *me = malloc((size_t)D * sizeof *me);
    /* [li] keys and values [T][KVH][hd] of a layer that KV-shared layers read (NULL for the others) */
    double **sk = calloc((size_t)c->n_layers, sizeof *sk), **sv = calloc((size_t)c->n_layers, sizeof *sv);
    /* per-layer embeddings: inputs [T][L*P], a table row [L*P], a layer's gate [T][P] */
    double *pli = P ? malloc(TT * LP * sizeof *pli) : NULL, *pg = P ? malloc(TT * P * sizeof *pg) : NULL;
    float *prow = P ? malloc((size_t)LP * sizeof *prow) : NULL;
    ref_pass s = {{0}, {0}, 0, (unsigned)st};
    int ok = x && xn && o && q && k && v && att && g && u && p && cs && rl && gu && y && me && sk && sv &&
             (!P || (pli && pg && prow));
    ok = ref_pass_alloc(&s, Kmax) && ok;
    ib_status rc = IB_OK;
    if (!ok) {
        rc = ib_fail(err, IB_ERR_NOMEM, "reference: out of memory for %d tokens", T);
        goto out;
    }
    for (int t = 0; t < T; t++) {
        ib_matrix_row_f32(&m->embed, tokens[t], s.wf[0]);
        for (int d = 0; d < D; d++) x[(size_t)t * D + d] = (double)s.wf[0][d] * (double)m->embed_scale;
    }
    store(&s, IB_REF_F32_RESIDUAL, x, TT * D);
    if (P > 0) { /* each token's per-layer inputs [L][P] */
        linear(&m->ple_model_proj, x, T, pli, &s);
        for (size_t i = 0; i < TT * LP; i++) pli[i] /= sqrt((double)D);
        for (size_t i = 0; i < TT * c->n_layers; i++) rmsnorm(pli + i * P, m->ple_proj_norm, P, eps, pli + i * P);
        for (int t = 0; t < T; t++) {
            ib_matrix_row_f32(&m->ple_embed, tokens[t], prow);
            for (int i = 0; i < LP; i++) {
                double *e = pli + (size_t)t * LP + i;
                *e = (*e + (double)prow[i] * (double)m->ple_embed_scale) / sqrt(2.0);
            }
        }
        store(&s, IB_REF_F32_BLOCK, pli, TT * LP);
    }
    for (int li = 0; li < c->n_layers; li++) {
        const ib_layer *L = &m->layers[li];
        const int hd = L->hd, KVH = L->kvh, HD = H * hd, KD = KVH * hd, half = hd / 2;
        const int W = L->sliding ? c->sliding_window : 0;
        /* this layer type's RoPE angles */
        for (int i = 0; i < half; i++) {
            double f = L->sliding ? pow(c->rope_theta, -(double)(2 * i) / hd)
                                  : i < c->rope_pairs_full ? pow(c->rope_theta_full, -(double)(2 * i) / c->global_head_dim) : 0.0;
            for (int t = 0; t < T; t++) {
                cs[((size_t)t * half + i) * 2] = cos(t * f);
                cs[((size_t)t * half + i) * 2 + 1] = sin(t * f);
            }
        }
        for (int t = 0; t < T; t++) rmsnorm(x + (size_t)t * D, L->attn_norm, D, eps, xn + (size_t)t * D);
        store(&s, IB_REF_F32_NORMED, xn, TT * D);
        linear(&L->wq, xn, T, q, &s);
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) rmsnorm(q + ((size_t)t * H + h) * hd, L->q_norm, hd, eps, q + ((size_t)t * H + h) * hd);
            store(&s, IB_REF_F32_QKV, q + (size_t)t * HD, (size_t)HD);
            rope(q + (size_t)t * HD, H, hd, cs + (size_t)t * half * 2);
        }
        store(&s, IB_REF_F32_QKV, q, TT * HD);
        const int src = ib_config_kv_layer(c, li);
        const double *kk = k, *vv = v;   /* [T][KVH][hd] the keys and values this layer attends to */
        if (src != li) {
            kk = sk[src], vv = sv[src];
        } else {
            linear(&L->wk, xn, T, k, &s);
            if (L->wv.rows > 0) linear(&L->wv, xn, T, v, &s);
            else memcpy(v, k, TT * KD * sizeof *v);
            for (int t = 0; t < T; t++) {
                for (int h = 0; h < KVH; h++) {
                    rmsnorm(k + ((size_t)t * KVH + h) * hd, L->k_norm, hd, eps, k + ((size_t)t * KVH + h) * hd);
                    rmsnorm(v + ((size_t)t * KVH + h) * hd, NULL, hd, eps, v + ((size_t)t * KVH + h) * hd);
                }
                store(&s, IB_REF_F32_QKV, k + (size_t)t * KD, (size_t)KD);
                rope(k + (size_t)t * KD, KVH, hd, cs + (size_t)t * half * 2);
            }
            store(&s, IB_REF_F32_QKV, k, TT * KD);
            store(&s, IB_REF_F32_QKV, v, TT * KD);
            int is_source = 0;
            for (int j = li + 1; j < c->n_layers; j++) is_source |= ib_config_kv_layer(c, j) == li;
            if (is_source) {
                sk[li] = malloc(TT * KD * sizeof **sk);
                sv[li] = malloc(TT * KD * sizeof **sv);
                if (!sk[li] || !sv[li]) {
                    rc = ib_fail(err, IB_ERR_NOMEM, "reference: out of memory for %d tokens", T);
                    goto out;
                }
                memcpy(sk[li], k, TT * KD * sizeof *k);
                memcpy(sv[li], v, TT * KD * sizeof *v);
            }
        }
        /* causal attention, scale 1; a sliding layer's query at t sees keys t-W+1 .. t */
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                int kvh = h / (H / KVH), j0 = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
                const double *qh = q + ((size_t)t * H + h) * hd;
                double mx = -INFINITY, sum = 0;
                for (int j = j0; j <= t; j++) {
                    p[j] = dot(qh, kk + ((size_t)j * KVH + kvh) * hd, hd);
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = j0; j <= t; j++) sum += p[j] = exp(p[j] - mx);
                double *oh = att + ((size_t)t * H + h) * hd;
                for (int d = 0; d < hd; d++) oh[d] = 0;
                for (int j = j0; j <= t; j++)
                    for (int d = 0; d < hd; d++) oh[d] += p[j] / sum * vv[((size_t)j * KVH + kvh) * hd + d];
            }
        store(&s, IB_REF_F32_ATTENTION, att, TT * HD);
        linear(&L->wo, att, T, o, &s);
        for (int t = 0; t < T; t++) {
            rmsnorm(o + (size_t)t * D, L->post_attn_norm, D, eps, o + (size_t)t * D);
            store(&s, IB_REF_F32_BLOCK, o + (size_t)t * D, (size_t)D);
            for (int d = 0; d < D; d++) x[(size_t)t * D + d] += o[(size_t)t * D + d];
        }
        store(&s, IB_REF_F32_RESIDUAL, x, TT * D);
        for (int t = 0; t < T; t++) rmsnorm(x + (size_t)t * D, L->mlp_norm, D, eps, xn + (size_t)t * D);
        store(&s, IB_REF_F32_NORMED, xn, TT * D);
        linear(&L->w_gate, xn, T, g, &s);
        linear(&L->w_up, xn, T, u, &s);
        for (size_t i = 0; i < TT * ib_config_layer_ffn(c, li); i++) g[i] = gelu_tanh(g[i]) * u[i];   /* [T][F of li] */
        store(&s, IB_REF_F32_HIDDEN, g, TT * ib_config_layer_ffn(c, li));
        linear(&L->w_down, g, T, o, &s);
        for (int t = 0; t < T; t++) {
            double *ot = o + (size_t)t * D, *xt = x + (size_t)t * D;
            if (E > 0) { /* the MoE block: dense and routed outputs, each normed, summed */
                rmsnorm(ot, L->post_mlp_norm1, D, eps, ot);
                rmsnorm(xt, L->pre_moe_norm, D, eps, y);
                store(&s, IB_REF_F32_BLOCK, ot, (size_t)D);
                store(&s, IB_REF_F32_NORMED, y, (size_t)D);
                gemma4_moe(c, L, xt, y, me, rl, gu, xn, &s);
                rmsnorm(me, L->post_moe_norm, D, eps, me);
                store(&s, IB_REF_F32_BLOCK, me, (size_t)D);
                for (int d = 0; d < D; d++) ot[d] += me[d];
                store(&s, IB_REF_F32_BLOCK, ot, (size_t)D);
            }
            rmsnorm(ot, L->post_mlp_norm, D, eps, ot);
            store(&s, IB_REF_F32_BLOCK, ot, (size_t)D);
            for (int d = 0; d < D; d++) xt[d] += ot[d];
            store(&s, IB_REF_F32_RESIDUAL, xt, (size_t)D);
        }
        if (P > 0) { /* the per-layer input block */
            linear(&L->ple_gate, x, T, pg, &s);
            for (int t = 0; t < T; t++)
                for (int i = 0; i < P; i++)
                    pg[(size_t)t * P + i] = gelu_tanh(pg[(size_t)t * P + i]) * pli[(size_t)t * LP + (size_t)li * P + i];
            store(&s, IB_REF_F32_HIDDEN, pg, TT * P);
            linear(&L->ple_proj, pg, T, o, &s);
            for (int t = 0; t < T; t++) {
                rmsnorm(o + (size_t)t * D, L->ple_norm, D, eps, o + (size_t)t * D);
                store(&s, IB_REF_F32_BLOCK, o + (size_t)t * D, (size_t)D);
                for (int d = 0; d < D; d++) x[(size_t)t * D + d] += o[(size_t)t * D + d];
            }
            store(&s, IB_REF_F32_RESIDUAL, x, TT * D);
        }
        for (size_t i = 0; i < TT * D; i++) x[i] *= (double)L->layer_scalar;
        store(&s, IB_REF_F32_RESIDUAL, x, TT * D);
    }
    for (int t = 0; t < T; t++) rmsnorm(x + (size_t)t * D, m->final_norm, D, eps, xn + (size_t)t * D);
    store(&s, IB_REF_F32_NORMED, xn, TT * D);
    linear(m->lm_head, xn, T, logits, &s);
    if (c->final_softcap > 0)
        for (size_t i = 0; i < TT * V; i++) logits[i] = c->final_softcap * tanh(logits[i] / c->final_softcap);
    store(&s, IB_REF_F32_LOGITS, logits, TT * V);
out:
    free(x), free(xn), free(o), free(q), free(k), free(v), free(att), free(g), free(u), free(p), free(cs);
    free(rl), free(gu), free(y), free(me);
    for (int li = 0; sk && sv && li < c->n_layers; li++) free(sk[li]), free(sv[li]);
    free(pli), free(pg), free(prow);
    free(sk), free(sv);
    ref_pass_free(&s);
    return rc;
}

/* ---------------------------------------------------------------- the forward pass */

ib_status ib_reference_logits(const ib_model *m, const int32_t *tokens, int T, double *logits, ib_error *err) {
    return ib_reference_logits_stored(m, tokens, T, IB_REF_STORE_F64, logits, err);
}

ib_status ib_reference_logits_stored(const ib_model *m, const int32_t *tokens, int T, ib_ref_store st,
                                     double *logits, ib_error *err) {
    if (!m || !tokens || !logits) return ib_fail(err, IB_ERR_INVALID_ARG, "reference: NULL model, tokens or logits");
    if ((unsigned)st & ~(unsigned)IB_REF_STORE_F32)
        return ib_fail(err, IB_ERR_INVALID_ARG, "reference: unknown storage %d", (int)st);
    const ib_config *c = &m->cfg;
    if (T < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "reference: %d tokens (at least 1 is needed)", T);
    if (T > c->max_position)
        return ib_fail(err, IB_ERR_CONTEXT, "reference: %d tokens exceed the model's max_position_embeddings %d", T,
                       c->max_position);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return ib_fail(err, IB_ERR_INVALID_ARG, "reference: token %d is %d, outside the vocabulary [0, %d)", t,
                           tokens[t], c->vocab_size);
    if (c->arch == IB_ARCH_GEMMA4) return reference_gemma4(m, tokens, T, st, logits, err);

    const int D = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, F = c->intermediate_size;
    const int HD = H * hd, KD = KVH * hd, half = hd / 2;
    const double eps = c->rms_eps;
    int Kmax = D > F ? D : F;
    if (HD > Kmax) Kmax = HD;
    size_t TT = (size_t)T;
    double *x = malloc(TT * D * sizeof *x);            /* [T][D] residual stream */
    double *xn = malloc(TT * D * sizeof *xn);          /* [T][D] normed */
    double *q = malloc(TT * HD * sizeof *q);           /* [T][H][hd] */
    double *k = malloc(TT * KD * sizeof *k);           /* [T][KVH][hd] */
    double *v = malloc(TT * KD * sizeof *v);           /* [T][KVH][hd] */
    double *att = malloc(TT * HD * sizeof *att);       /* [T][H][hd] attention output */
    double *o = malloc(TT * D * sizeof *o);            /* [T][D] o_proj / down_proj output */
    double *g = malloc(TT * F * sizeof *g);            /* [T][F] gate, then silu(gate)*up */
    double *u = malloc(TT * F * sizeof *u);            /* [T][F] up */
    double *cs = malloc(TT * half * 2 * sizeof *cs);   /* [T][hd/2][cos, sin] */
    double *p = malloc(TT * sizeof *p);                /* [T] attention weights of one query */
    ref_pass s = {{0}, {0}, 0, (unsigned)st};
    int ok = x && xn && q && k && v && att && o && g && u && cs && p;
    ok = ref_pass_alloc(&s, Kmax) && ok;
    ib_status rc = IB_OK;
    if (!ok) {
        rc = ib_fail(err, IB_ERR_NOMEM, "reference: out of memory for %d tokens", T);
        goto out;
    }

    /* RoPE angles: inv_freq_i = theta^(-2i/hd), angle = pos * inv_freq_i */
    for (int i = 0; i < half; i++) {
        double inv_freq = pow(c->rope_theta, -(double)(2 * i) / hd);
        for (int t = 0; t < T; t++) {
            cs[((size_t)t * half + i) * 2] = cos(t * inv_freq);
            cs[((size_t)t * half + i) * 2 + 1] = sin(t * inv_freq);
        }
    }
    /* embedding rows */
    for (int t = 0; t < T; t++) {
        ib_matrix_row_f32(&m->embed, tokens[t], s.wf[0]);
        for (int d = 0; d < D; d++) x[(size_t)t * D + d] = s.wf[0][d];
    }
    for (int li = 0; li < c->n_layers; li++) {
        const ib_layer *L = &m->layers[li];
        /* attention block */
        for (int t = 0; t < T; t++) rmsnorm(x + (size_t)t * D, L->attn_norm, D, eps, xn + (size_t)t * D);
        store(&s, IB_REF_F32_NORMED, xn, TT * D);
        linear(&L->wq, xn, T, q, &s);
        linear(&L->wk, xn, T, k, &s);
        linear(&L->wv, xn, T, v, &s);
        for (int t = 0; t < T; t++) {
            if (L->q_norm) {
                for (int h = 0; h < H; h++) rmsnorm(q + ((size_t)t * H + h) * hd, L->q_norm, hd, eps, q + ((size_t)t * H + h) * hd);
                for (int h = 0; h < KVH; h++)
                    rmsnorm(k + ((size_t)t * KVH + h) * hd, L->k_norm, hd, eps, k + ((size_t)t * KVH + h) * hd);
            }
            store(&s, IB_REF_F32_QKV, q + (size_t)t * HD, (size_t)HD);
            store(&s, IB_REF_F32_QKV, k + (size_t)t * KD, (size_t)KD);
            rope(q + (size_t)t * HD, H, hd, cs + (size_t)t * half * 2);
            rope(k + (size_t)t * KD, KVH, hd, cs + (size_t)t * half * 2);
        }
        store(&s, IB_REF_F32_QKV, q, TT * HD);
        store(&s, IB_REF_F32_QKV, k, TT * KD);
        attention(q, k, v, T, H, KVH, hd, p, att);
        store(&s, IB_REF_F32_ATTENTION, att, TT * HD);
        linear(&L->wo, att, T, o, &s);
        for (size_t i = 0; i < TT * D; i++) x[i] += o[i];
        store(&s, IB_REF_F32_RESIDUAL, x, TT * D);
        /* MLP block */
        for (int t = 0; t < T; t++) rmsnorm(x + (size_t)t * D, L->mlp_norm, D, eps, xn + (size_t)t * D);
        store(&s, IB_REF_F32_NORMED, xn, TT * D);
        linear(&L->w_gate, xn, T, g, &s);
        linear(&L->w_up, xn, T, u, &s);
        for (size_t i = 0; i < TT * F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        store(&s, IB_REF_F32_HIDDEN, g, TT * F);
        linear(&L->w_down, g, T, o, &s);
        for (size_t i = 0; i < TT * D; i++) x[i] += o[i];
        store(&s, IB_REF_F32_RESIDUAL, x, TT * D);
    }
    for (int t = 0; t < T; t++) rmsnorm(x + (size_t)t * D, m->final_norm, D, eps, xn + (size_t)t * D);
    store(&s, IB_REF_F32_NORMED, xn, TT * D);
    linear(m->lm_head, xn, T, logits, &s);
out:
    free(x);
    free(xn);
    free(q);
    free(k);
    free(v);
    free(att);
    free(o);
    free(g);
    free(u);
    free(cs);
    free(p);
    ref_pass_free(&s);
    return rc;
}

/* ---------------------------------------------------------------- metrics */

/* log-sum-exp of n values (max-shifted). */
static double logsumexp_d(const double *x, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    return mx + log(s);
}

static double logsumexp_f(const float *x, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

void ib_accuracy_add(ib_accuracy *a, const double *ref, const float *eng, int V) {
    int ar = 0, ae = 0;
    double lr = logsumexp_d(ref, V), le = logsumexp_f(eng, V), kl = 0;
    for (int i = 0; i < V; i++) {
        if (ref[i] > ref[ar]) ar = i;   /* strict: ties go to the lowest id */
        if (eng[i] > eng[ae]) ae = i;
        double d = (double)eng[i] - ref[i], lpr = ref[i] - lr, lpe = (double)eng[i] - le;
        kl += exp(lpr) * (lpr - lpe);
        a->sum_sq_diff += d * d;
        a->sum_sq_ref += ref[i] * ref[i];
        if (fabs(d) > a->max_abs_diff || d != d) a->max_abs_diff = fabs(d);
    }
    if (kl < 0) kl = 0;   /* rounding residue below ~1e-16: KL is non-negative */
    a->tokens++;
    a->top1_agree += ar == ae;
    a->kl_sum += kl;
    if (kl > a->kl_max || kl != kl) a->kl_max = kl;
    ib_accuracy_finish(a);
}

void ib_accuracy_finish(ib_accuracy *a) {
    a->top1_fraction = a->tokens ? (double)a->top1_agree / a->tokens : 0.0;
    a->kl_mean = a->tokens ? a->kl_sum / a->tokens : 0.0;
    a->rel_l2 = a->sum_sq_ref > 0 ? sqrt(a->sum_sq_diff / a->sum_sq_ref) : sqrt(a->sum_sq_diff);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

ib_status ib_accuracy_run(const ib_model *m, const ib_engine_opts *opts, ib_kv_dtype kvd, const int32_t *tokens, int T,
                          const double *ref, ib_accuracy *out, ib_error *err) {
    memset(out, 0, sizeof *out);
    if (!m || !tokens || !ref) return ib_fail(err, IB_ERR_INVALID_ARG, "accuracy: NULL model, tokens or reference");
    if (T < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "accuracy: %d tokens (at least 1 is needed)", T);
    const int V = m->cfg.vocab_size;
    ib_engine *e = NULL;
    ib_session *s = NULL;
    float *lg = malloc((size_t)V * sizeof *lg);   /* [V] logits after one token */
    ib_status rc;
    if (!lg) {
        rc = ib_fail(err, IB_ERR_NOMEM, "accuracy: out of memory");
        goto out;
    }
    if ((rc = ib_engine_create(m, opts, &e, err))) goto out;
    if ((rc = ib_session_create(m, &(ib_session_opts){.max_context = T, .kv_dtype = kvd}, &s, err))) goto out;
    double t0 = now_s();
    for (int t = 0; t < T; t++) {
        ib_step_item it = {.session = s, .tokens = tokens + t, .n_tokens = 1, .logits = lg};
        if ((rc = ib_step(e, &it, 1, err))) goto out;
        ib_accuracy_add(out, ref + (size_t)t * V, lg, V);
    }
    out->isa = ib_engine_isa(e);
    out->seconds = now_s() - t0;
out:
    if (rc) memset(out, 0, sizeof *out);
    ib_session_free(s);
    ib_engine_free(e);
    free(lg);
    return rc;
}

ib_status ib_engine_logits_all(const ib_model *m, const ib_engine_opts *opts, ib_kv_dtype kvd, const int32_t *tokens,
                               int T, float *logits, ib_isa *isa_out, double *seconds, ib_error *err) {
    if (!m || !tokens || !logits) return ib_fail(err, IB_ERR_INVALID_ARG, "engine logits: NULL model, tokens or output");
    if (T < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "engine logits: %d tokens (at least 1 is needed)", T);
    const int V = m->cfg.vocab_size;
    ib_engine *e = NULL;
    ib_session *s = NULL;
    ib_status rc;
    if ((rc = ib_engine_create(m, opts, &e, err))) goto out;
    if ((rc = ib_session_create(m, &(ib_session_opts){.max_context = T, .kv_dtype = kvd}, &s, err))) goto out;
    double t0 = now_s();
    for (int t = 0; t < T; t++) {
        ib_step_item it = {.session = s, .tokens = tokens + t, .n_tokens = 1, .logits = logits + (size_t)t * V};
        if ((rc = ib_step(e, &it, 1, err))) goto out;
    }
    if (isa_out) *isa_out = ib_engine_isa(e);
    if (seconds) *seconds = now_s() - t0;
out:
    ib_session_free(s);
    ib_engine_free(e);
    return rc;
}
