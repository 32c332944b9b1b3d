/*
 * profile.c — the profiling backend (profile.h): each step operation of the inner backend timed
 * around its call and counted by category; everything else forwarded unchanged.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/profile.h"
#include "core/error.h"

typedef struct prof_backend {
    ib_backend base;           /* base.ops points at ops below */
    ib_backend_ops ops;        /* the inner table, its instance operations replaced by the timed ones */
    ib_backend *inner;
    uint64_t steps;
    uint64_t ns[IB_PROF_COUNT];
    uint64_t calls[IB_PROF_COUNT];
} prof_backend;

static const char *const op_names[IB_PROF_COUNT] = {
    "embed", "rmsnorm", "qkv", "o", "gate/up", "down", "qk_prepare", "attention", "act", "moe", "add",
    "logits", "step", "other",
};

const char *ib_prof_op_name(ib_prof_op op) { return (unsigned)op < IB_PROF_COUNT ? op_names[op] : "?"; }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static prof_backend *P(ib_backend *b) { return (prof_backend *)b; }
static ib_backend *IN(ib_backend *b) { return ((prof_backend *)b)->inner; }

/* Add the time since t0 and one call to category op of p. */
static void charge(prof_backend *p, ib_prof_op op, uint64_t t0) {
    uint64_t t1 = now_ns();
    p->ns[op] += t1 > t0 ? t1 - t0 : 0;
    p->calls[op]++;
}

/* Run `call` (an expression on the inner instance) and charge its time to category op. */
#define TIMED(b, op, call)            \
    do {                              \
        uint64_t t0_ = now_ns();      \
        call;                         \
        charge(P(b), (op), t0_);      \
    } while (0)

/* The category of a product, from the first matrix it computes (step.c groups q/k/v and gate/up). */
static ib_prof_op linear_op(int n, const ib_wsel *ws) {
    if (n < 1) return IB_PROF_OTHER;
    switch (ws[0]) {
    case IB_W_Q: case IB_W_K: case IB_W_V: return IB_PROF_QKV;
    case IB_W_O: return IB_PROF_O;
    case IB_W_GATE: case IB_W_UP: return IB_PROF_GATE_UP;
    case IB_W_DOWN: return IB_PROF_DOWN;
    default: return IB_PROF_OTHER;
    }
}

static void p_destroy(ib_backend *b) {
    if (!b) return;
    ib_backend *in = IN(b);
    in->ops->destroy(in);
    free(b);
}

static ib_status p_step_begin(ib_backend *b, const ib_step_desc *d, ib_error *err) {
    ib_status rc;
    TIMED(b, IB_PROF_STEP, rc = IN(b)->ops->step_begin(IN(b), d, err));
    if (!rc) P(b)->steps++;
    return rc;
}

static void p_embed(ib_backend *b) { TIMED(b, IB_PROF_EMBED, IN(b)->ops->embed(IN(b))); }

static void p_rmsnorm(ib_backend *b, ib_buf in, ib_nsel n, int li, ib_buf out) {
    TIMED(b, IB_PROF_RMSNORM, IN(b)->ops->rmsnorm(IN(b), in, n, li, out));
}

static void p_linear(ib_backend *b, int li, int n, const ib_wsel *ws, ib_buf in, const ib_buf *outs) {
    TIMED(b, linear_op(n, ws), IN(b)->ops->linear(IN(b), li, n, ws, in, outs));
}

static void p_qk_prepare(ib_backend *b, int li, int phases) {
    TIMED(b, IB_PROF_QK_PREPARE, IN(b)->ops->qk_prepare(IN(b), li, phases));
}

static void p_attention(ib_backend *b, int li) { TIMED(b, IB_PROF_ATTENTION, IN(b)->ops->attention(IN(b), li)); }
static void p_swiglu(ib_backend *b) { TIMED(b, IB_PROF_ACT, IN(b)->ops->swiglu(IN(b))); }
static void p_geglu(ib_backend *b, int li) { TIMED(b, IB_PROF_ACT, IN(b)->ops->geglu(IN(b), li)); }

static void p_moe(ib_backend *b, int li, ib_buf route_in, ib_buf in, ib_buf out) {
    TIMED(b, IB_PROF_MOE, IN(b)->ops->moe(IN(b), li, route_in, in, out));
}

static void p_scale_layer(ib_backend *b, int li) { TIMED(b, IB_PROF_OTHER, IN(b)->ops->scale_layer(IN(b), li)); }
static void p_add(ib_backend *b, ib_buf x, ib_buf y) { TIMED(b, IB_PROF_ADD, IN(b)->ops->add(IN(b), x, y)); }
static void p_logits(ib_backend *b) { TIMED(b, IB_PROF_LOGITS, IN(b)->ops->logits(IN(b))); }

static ib_status p_step_end(ib_backend *b, ib_error *err) {
    ib_status rc;
    TIMED(b, IB_PROF_STEP, rc = IN(b)->ops->step_end(IN(b), err));
    return rc;
}

static const float *p_read_rows(ib_backend *b, ib_buf buf, int R, int width) {
    const float *x;
    TIMED(b, IB_PROF_OTHER, x = IN(b)->ops->read_rows(IN(b), buf, R, width));
    return x;
}

static void p_write_rows(ib_backend *b, ib_buf buf, int R, int width, const float *x) {
    TIMED(b, IB_PROF_OTHER, IN(b)->ops->write_rows(IN(b), buf, R, width, x));
}

static void p_ple_inputs(ib_backend *b) { TIMED(b, IB_PROF_OTHER, IN(b)->ops->ple_inputs(IN(b))); }
static void p_ple_layer(ib_backend *b, int li) { TIMED(b, IB_PROF_OTHER, IN(b)->ops->ple_layer(IN(b), li)); }

static const float *p_read_ple_inputs(ib_backend *b, int R) {
    const float *x;
    TIMED(b, IB_PROF_OTHER, x = IN(b)->ops->read_ple_inputs(IN(b), R));
    return x;
}

/* Replace slot f of table t by w when the inner table has it (a NULL operation stays NULL, so the
 * runtime's "backend cannot" checks see the inner backend's answer). */
#define WRAP(t, f, w) ((t)->f = (t)->f ? (w) : NULL)

ib_status ib_profile_wrap(ib_backend *inner, ib_backend **out, ib_error *err) {
    *out = NULL;
    prof_backend *p = calloc(1, sizeof *p);
    if (!p) return ib_fail(err, IB_ERR_NOMEM, "profile: out of memory");
    p->inner = inner;
    p->ops = *inner->ops;   /* name, kind and the kind-level operations (create, kv_*) unchanged */
    ib_backend_ops *t = &p->ops;
    WRAP(t, destroy, p_destroy);
    WRAP(t, step_begin, p_step_begin);
    WRAP(t, embed, p_embed);
    WRAP(t, rmsnorm, p_rmsnorm);
    WRAP(t, linear, p_linear);
    WRAP(t, qk_prepare, p_qk_prepare);
    WRAP(t, attention, p_attention);
    WRAP(t, swiglu, p_swiglu);
    WRAP(t, geglu, p_geglu);
    WRAP(t, moe, p_moe);
    WRAP(t, scale_layer, p_scale_layer);
    WRAP(t, add, p_add);
    WRAP(t, logits, p_logits);
    WRAP(t, step_end, p_step_end);
    WRAP(t, read_rows, p_read_rows);
    WRAP(t, write_rows, p_write_rows);
    WRAP(t, ple_inputs, p_ple_inputs);
    WRAP(t, ple_layer, p_ple_layer);
    WRAP(t, read_ple_inputs, p_read_ple_inputs);
    p->base.ops = t;
    *out = &p->base;
    return IB_OK;
}

void ib_profile_read(const ib_backend *b, ib_step_profile *out) {
    const prof_backend *p = (const prof_backend *)b;
    memset(out, 0, sizeof *out);
    out->steps = p->steps;
    for (int i = 0; i < IB_PROF_COUNT; i++) {
        out->seconds[i] = (double)p->ns[i] * 1e-9;
        out->calls[i] = p->calls[i];
    }
}

void ib_profile_reset(ib_backend *b) {
    prof_backend *p = P(b);
    p->steps = 0;
    memset(p->ns, 0, sizeof p->ns);
    memset(p->calls, 0, sizeof p->calls);
}
