/*
 * capture.c — the engine's layer-capture hook (ib_engine_set_capture) and `isobatch diff`: the same
 * sessions stepped together and each alone, every capture point of every layer compared row by row.
 *
 * Both modes run on one engine, in lockstep: at each step every session is first stepped alone (its
 * captures are stored), then the sessions are stepped together in groups of opts.batch (each capture is
 * compared with the stored one as it arrives). Decode steps feed both modes the token the alone run
 * chose greedily, so a divergence never changes the inputs that follow it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "diag/diag.h"
#include "runtime/runtime.h"

void ib_engine_set_capture(ib_engine *e, ib_capture_fn fn, void *ctx) {
    e->capture = fn;
    e->capture_ctx = fn ? ctx : NULL;
}

/* Capture points in forward order (isobatch.h lists them); the last two exist at layer n_layers. */
static const char *const point_names[IB_DIFF_POINTS] = {
    "layer_in", "attn_norm", "q_proj", "k_proj", "v", "q_norm", "k_norm", "q", "k", "attn_out",
    "attn_proj", "post_attn_norm", "mlp_norm", "gate", "up", "mlp_act", "mlp_out", "post_mlp_norm1",
    "moe_norm", "moe_out", "post_moe_norm", "post_mlp_norm", "layer_out", "final_norm", "logits",
};
/* Points only Gemma 4 has (absent for the other families). */
static int gemma_only(int p) { return p == 11 || (p >= 17 && p <= 21); }
/* Points only Gemma 4's MoE block has. */
static int moe_only(int p) { return p >= 17 && p <= 20; }
/* The op whose output each point is (layer_in of layer 0 is the embedding lookup; of a later layer it
 * equals the previous layer_out, so it is never the first divergence there). */
static const char *const point_ops[IB_DIFF_POINTS] = {
    "embed", "rmsnorm", "matmul", "matmul", "matmul", "qknorm", "qknorm", "rope", "rope", "attention",
    "matmul", "rmsnorm", "rmsnorm", "matmul", "matmul", "swiglu/geglu", "matmul", "rmsnorm",
    "rmsnorm", "moe", "rmsnorm", "rmsnorm", "add", "rmsnorm", "matmul",
};

const char *ib_diff_point_name(int p) { return p >= 0 && p < IB_DIFF_POINTS ? point_names[p] : "?"; }
const char *ib_diff_point_op(int layer, int p) {
    if (p == 0 && layer > 0) return "previous layer";
    return p >= 0 && p < IB_DIFF_POINTS ? point_ops[p] : "?";
}

static int point_index(const char *name) {
    for (int p = 0; p < IB_DIFF_POINTS; p++)
        if (strcmp(name, point_names[p]) == 0) return p;
    return -1;
}

enum { MODE_ALONE, MODE_BATCHED };

typedef struct dctx {
    int L, S;                  /* layers, sessions */
    int *width;                /* [L + 1][P] floats per row of each point at each layer (Gemma 4's q, k and
                                * attention widths are its layer type's) */
    unsigned char present[IB_DIFF_POINTS];
    size_t *off;               /* [L + 1][P] start of block (layer, point) in store */
    float *store;              /* block (l, p) = [rows][width[l][p]]: the alone captures of this step */
    int *row_sess;             /* [max_rows] session of each global row of this step */
    int *map;                  /* [max_rows] batched mode: step row -> global row */
    int mode;
    int cur_base;              /* alone mode: global row of the stepped session's row 0 */
    double *md;                /* [L + 1][P][S] this step's max |diff| */
    unsigned char *df;         /* [L + 1][P][S] this step's "some bit differs" */
} dctx;

/* ib_capture_fn: store (alone) or compare (batched) one row of one point. */
static void on_capture(void *vctx, int layer, const char *point, int row, const float *data, int n) {
    dctx *d = vctx;
    int p = point_index(point);
    if (p < 0 || layer < 0 || layer > d->L || n != d->width[(size_t)layer * IB_DIFF_POINTS + p]) return;
    if ((layer == d->L) != (p >= IB_DIFF_LAYER_POINTS)) return;
    float *slot = d->store + d->off[(size_t)layer * IB_DIFF_POINTS + p];
    if (d->mode == MODE_ALONE) {
        memcpy(slot + (size_t)(d->cur_base + row) * n, data, (size_t)n * sizeof(float));
        return;
    }
    int g = d->map[row], s = d->row_sess[g];
    const float *ref = slot + (size_t)g * n;
    size_t k = ((size_t)layer * IB_DIFF_POINTS + p) * d->S + s;
    double m = d->md[k];
    for (int i = 0; i < n; i++) {
        if (memcmp(&ref[i], &data[i], sizeof(float)) == 0) continue;
        d->df[k] = 1;
        double x = fabs((double)ref[i] - (double)data[i]);
        if (x != x) x = INFINITY;
        if (x > m) m = x;
    }
    d->md[k] = m;
}

void ib_diff_result_free(ib_diff_result *r) {
    if (!r) return;
    free(r->prompt_len);
    free(r->maxdiff);
    free(r->differs);
    free(r->first);
    free(r->logit_diff);
    free(r->tokens);
    memset(r, 0, sizeof *r);
}

ib_status ib_diff_run(const ib_model *m, const int32_t *const *prompts, const int *lens, int n, const ib_diff_opts *o,
                      ib_diff_result *r, ib_error *err) {
    memset(r, 0, sizeof *r);
    const ib_config *c = &m->cfg;
    const int gemma = c->arch == IB_ARCH_GEMMA4;
    if (n < 1) return ib_fail(err, IB_ERR_INVALID_ARG, "diff: no prompts");
    if (o->step < 0 || o->step > 100000) return ib_fail(err, IB_ERR_INVALID_ARG, "diff: step %d out of range", o->step);
    int batch = o->batch > 0 && o->batch < n ? o->batch : n;
    int L = c->n_layers, S = n, K = o->step, V = c->vocab_size, D = c->hidden_size;
    long total = 0, max_len = 0, step_tokens = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1 || !prompts[i]) return ib_fail(err, IB_ERR_INVALID_ARG, "diff: prompt %d is empty", i);
        total += lens[i];
        if (lens[i] > max_len) max_len = lens[i];
    }
    for (int g = 0; g < n; g += batch) {
        long t = 0;
        for (int i = g; i < n && i < g + batch; i++) t += lens[i];
        if (t > step_tokens) step_tokens = t;
    }
    if (max_len + K + 1 > c->max_position)
        return ib_fail(err, IB_ERR_CONTEXT, "diff: a prompt of %ld tokens + %d steps exceeds the context of %d", max_len, K,
                       c->max_position);

    dctx d = {.L = L, .S = S};
    d.width = malloc((size_t)(L + 1) * IB_DIFF_POINTS * sizeof *d.width);
    if (!d.width) return ib_fail(err, IB_ERR_NOMEM, "diff: out of memory");
    for (int l = 0; l <= L; l++) {
        int li = l < L ? l : 0, HD = c->n_heads * ib_config_layer_hd(c, li);
        int KD = ib_config_layer_kvh(c, li) * ib_config_layer_hd(c, li);
        int F = ib_config_layer_ffn(c, li);   /* the layer's MLP width (2F when double-wide) */
        const int widths[IB_DIFF_POINTS] = {D, D, HD, KD, KD, HD, KD, HD, KD, HD, D, D, D, F, F, F, D, D, D, D, D, D, D, D, V};
        memcpy(d.width + (size_t)l * IB_DIFF_POINTS, widths, sizeof widths);
    }
    for (int p = 0; p < IB_DIFF_POINTS; p++)
        d.present[p] = gemma ? !moe_only(p) || c->n_experts > 0 : !gemma_only(p);
    if (!c->qk_norm && !gemma) d.present[5] = d.present[6] = 0;

    ib_engine *e = NULL;
    ib_session **alone = calloc((size_t)n, sizeof *alone), **bat = calloc((size_t)n, sizeof *bat);
    float *lg_alone = malloc((size_t)n * V * sizeof(float)), *lg_bat = malloc((size_t)n * V * sizeof(float));
    ib_step_item *items = malloc((size_t)n * sizeof *items);
    int32_t *next = malloc((size_t)n * sizeof *next);
    int *row_base = malloc((size_t)n * sizeof *row_base);
    size_t cells = (size_t)(L + 1) * IB_DIFF_POINTS * S;
    d.off = malloc((size_t)(L + 1) * IB_DIFF_POINTS * sizeof *d.off);
    d.row_sess = malloc((size_t)total * sizeof *d.row_sess);
    d.map = malloc((size_t)total * sizeof *d.map);
    d.md = malloc(cells * sizeof *d.md);
    d.df = malloc(cells);
    r->n_sessions = S;
    r->n_layers = L;
    r->n_steps = K + 1;
    r->first_step = -1;
    r->prompt_len = malloc((size_t)n * sizeof *r->prompt_len);
    r->maxdiff = malloc(cells * sizeof *r->maxdiff);
    r->differs = calloc(cells, 1);
    r->first = malloc((size_t)(K + 1) * sizeof *r->first);
    r->logit_diff = calloc((size_t)(K + 1) * S, sizeof *r->logit_diff);
    r->tokens = calloc((size_t)(K + 1) * S, sizeof *r->tokens);
    ib_status rc = IB_OK;
    if (!alone || !bat || !lg_alone || !lg_bat || !items || !next || !row_base || !d.off || !d.row_sess || !d.map ||
        !d.md || !d.df || !r->prompt_len || !r->maxdiff || !r->differs || !r->first || !r->logit_diff || !r->tokens) {
        rc = ib_fail(err, IB_ERR_NOMEM, "diff: out of memory");
        goto done;
    }
    size_t store_floats = 0;
    for (int l = 0; l <= L; l++)
        for (int p = 0; p < IB_DIFF_POINTS; p++) {
            d.off[(size_t)l * IB_DIFF_POINTS + p] = store_floats;
            if ((l == L) == (p >= IB_DIFF_LAYER_POINTS) && d.present[p])
                store_floats += (size_t)total * d.width[(size_t)l * IB_DIFF_POINTS + p];
        }
    d.store = malloc(store_floats * sizeof(float));
    if (!d.store) {
        rc = ib_fail(err, IB_ERR_NOMEM, "diff: out of memory for %zu captured floats", store_floats);
        goto done;
    }
    for (int i = 0; i < n; i++) r->prompt_len[i] = lens[i];

    ib_engine_opts eo = {.threads = o->threads, .isa = o->isa, .act = o->act, .backend = o->backend,
                         .max_step_tokens = (int)(step_tokens > 512 ? step_tokens : 512)};
    if ((rc = ib_engine_create(m, &eo, &e, err))) goto done;
    ib_session_opts so = {.max_context = (int)(max_len + K + 1), .sampling = ib_sampling_default(), .backend = o->backend};
    for (int i = 0; i < n; i++)
        if ((rc = ib_session_create(m, &so, &alone[i], err)) || (rc = ib_session_create(m, &so, &bat[i], err))) goto done;
    ib_engine_set_capture(e, on_capture, &d);

    for (int step = 0; step <= K; step++) {
        /* this step's rows: each whole prompt at step 0, one token after */
        int rows = 0;
        for (int i = 0; i < n; i++) {
            row_base[i] = rows;
            int T = step == 0 ? lens[i] : 1;
            for (int t = 0; t < T; t++) d.row_sess[rows + t] = i;
            rows += T;
        }
        for (int l = 0; l <= L; l++)
            for (int p = 0; p < IB_DIFF_POINTS; p++)
                for (int s = 0; s < S; s++) {
                    size_t k = ((size_t)l * IB_DIFF_POINTS + p) * S + s;
                    int exists = d.present[p] && (l == L) == (p >= IB_DIFF_LAYER_POINTS);
                    d.md[k] = exists ? 0.0 : -1.0;
                    d.df[k] = 0;
                }
        /* every session alone */
        d.mode = MODE_ALONE;
        for (int i = 0; i < n; i++) {
            d.cur_base = row_base[i];
            ib_step_item it = {.session = alone[i], .tokens = step == 0 ? prompts[i] : &next[i],
                               .n_tokens = step == 0 ? lens[i] : 1, .logits = lg_alone + (size_t)i * V};
            if ((rc = ib_step(e, &it, 1, err))) goto done;
        }
        /* the same sessions together, `batch` per step */
        d.mode = MODE_BATCHED;
        for (int g = 0; g < n; g += batch) {
            int ni = 0, row = 0;
            for (int i = g; i < n && i < g + batch; i++, ni++) {
                items[ni] = (ib_step_item){.session = bat[i], .tokens = step == 0 ? prompts[i] : &next[i],
                                           .n_tokens = step == 0 ? lens[i] : 1, .logits = lg_bat + (size_t)i * V};
                for (int t = 0; t < items[ni].n_tokens; t++) d.map[row++] = row_base[i] + t;
            }
            if ((rc = ib_step(e, items, ni, err))) goto done;
        }
        /* summary of the step */
        ib_diff_first *f = &r->first[step];
        f->layer = -1;
        f->point = -1;
        for (int l = 0; l <= L && f->layer < 0; l++)
            for (int p = 0; p < IB_DIFF_POINTS && f->layer < 0; p++)
                for (int s = 0; s < S; s++)
                    if (d.df[((size_t)l * IB_DIFF_POINTS + p) * S + s]) {
                        f->layer = l;
                        f->point = p;
                        break;
                    }
        for (int i = 0; i < n; i++) {
            const float *a = lg_alone + (size_t)i * V, *b = lg_bat + (size_t)i * V;
            double mx = 0;
            for (int v = 0; v < V; v++) {
                double x = fabs((double)a[v] - (double)b[v]);
                if (x != x) x = memcmp(&a[v], &b[v], sizeof(float)) ? INFINITY : 0;
                if (x > mx) mx = x;
            }
            r->logit_diff[(size_t)step * S + i] = mx;
        }
        if (f->layer >= 0 && r->first_step < 0) r->first_step = step;
        if (step == K) {
            memcpy(r->maxdiff, d.md, cells * sizeof *d.md);
            memcpy(r->differs, d.df, cells);
        }
        /* next inputs: the alone run's greedy choice */
        for (int i = 0; i < n; i++) {
            next[i] = ib_argmax(lg_alone + (size_t)i * V, V);
            if (step < K) r->tokens[(size_t)(step + 1) * S + i] = next[i];
        }
    }
done:
    if (e) ib_engine_set_capture(e, NULL, NULL);
    ib_engine_free(e);
    for (int i = 0; i < n; i++) {
        if (alone) ib_session_free(alone[i]);
        if (bat) ib_session_free(bat[i]);
    }
    free(alone);
    free(bat);
    free(lg_alone);
    free(lg_bat);
    free(items);
    free(next);
    free(row_base);
    free(d.off);
    free(d.width);
    free(d.store);
    free(d.row_sess);
    free(d.map);
    free(d.md);
    free(d.df);
    if (rc) ib_diff_result_free(r);
    return rc;
}
