/*
 * rope.c — rotary position embedding on split halves, with one position per token.
 */
#include "core/fmath.h"
#include "ops/ops.h"

void ib_rope_table(const int32_t *pos, int R, int hd, double theta, float *cs) {
    ib_rope_table_pairs(pos, R, hd, theta, hd / 2, cs);
}

void ib_rope_table_pairs(const int32_t *pos, int R, int hd, double theta, int n_rot, float *cs) {
    int half = hd / 2;
    if (n_rot < 0) n_rot = 0;
    if (n_rot > half) n_rot = half;
    double log_theta = ib_log(theta);
    for (int i = 0; i < half; i++) {
        /* inv_freq_i = theta^(-2i/hd) for rotated pairs; the others keep {1, 0} */
        double inv_freq = i < n_rot ? ib_exp(-(double)(2 * i) / (double)hd * log_theta) : 0.0;
        for (int r = 0; r < R; r++) {
            double s = 0.0, c = 1.0;
            if (i < n_rot) ib_sincos((double)pos[r] * inv_freq, &s, &c);
            cs[((size_t)r * half + i) * 2 + 0] = (float)c;
            cs[((size_t)r * half + i) * 2 + 1] = (float)s;
        }
    }
}

void ib_rope(float *x, int R, int H, int hd, const float *cs) {
    int half = hd / 2;
    for (int r = 0; r < R; r++) {
        const float *t = cs + (size_t)r * half * 2;
        for (int h = 0; h < H; h++) {
            float *v = x + ((size_t)r * H + h) * hd;
            for (int i = 0; i < half; i++) {
                float c = t[2 * i], s = t[2 * i + 1];
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

void ib_rope_positions(const int32_t *pos, const int *item_len, int n_items, int32_t *out) {
    int R = 0;
    for (int i = 0; i < n_items; i++) R += item_len[i];
    for (int r = 0; r < R; r++) out[r] = pos[r];
    if (ib_fault_get() != IB_FAULT_ROPE_SCALAR_OFFSET) return;
    for (int i = 0, r = 0; i < n_items; i++)
        for (int t = 0; t < item_len[i]; t++, r++) out[r] = pos[0] + t;
}

void ib_rope_step(float *x, int R, int H, int hd, const float *cs, int n_items) {
    ib_rope_step_layout(x, R, H, hd, cs, n_items, IB_ROPE_HALVES);
}

void ib_rope_interleaved(float *x, int R, int H, int hd, const float *cs) {
    int half = hd / 2;
    for (int r = 0; r < R; r++) {
        const float *t = cs + (size_t)r * half * 2;
        for (int h = 0; h < H; h++) {
            float *v = x + ((size_t)r * H + h) * hd;
            for (int i = 0; i < half; i++) {
                float c = t[2 * i], s = t[2 * i + 1];
                float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * c - b * s;
                v[2 * i + 1] = b * c + a * s;
            }
        }
    }
}

void ib_rope_step_rows(float *x, int r0, int r1, int R, int H, int hd, const float *cs, int n_items) {
    if (ib_fault_get() == IB_FAULT_ROPE_SKIP_ROWS && n_items > 1 && n_items == R && r1 > 1) r1 = 1;
    if (r0 < r1) ib_rope(x + (size_t)r0 * H * hd, r1 - r0, H, hd, cs + (size_t)r0 * (size_t)(hd / 2) * 2);
}

void ib_rope_step_layout(float *x, int R, int H, int hd, const float *cs, int n_items, ib_rope_layout layout) {
    if (ib_fault_get() == IB_FAULT_ROPE_SKIP_ROWS && n_items > 1 && n_items == R) R = 1;
    if (layout == IB_ROPE_INTERLEAVED) ib_rope_interleaved(x, R, H, hd, cs);
    else ib_rope(x, R, H, hd, cs);
}
