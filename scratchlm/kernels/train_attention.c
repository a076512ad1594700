/* Causal self-attention for training at a short context, forward and backward, on a CPU: all that
 * CausalSelfAttention does between c_attn and c_proj (split into heads, RoPE on queries and keys,
 * softmax(q k^T / sqrt(hs)) v under the causal mask, heads side by side again) in one call each
 * way. At the baby models' shapes (T 64, hs 32) the arithmetic is small and PyTorch's version is
 * mostly the overhead of about thirty operations and their tensors; here each (sequence, head)
 * pair is one task for one thread, its data in that thread's cache from start to end.
 *
 * qkv:   (B, T, 3C) float32, [q | k | v] of every position, each C = H * hs wide, heads side by side
 * cos, sin: (T, hs/2) float32, RoPE's angles for positions 0..T-1 (the "rotate half" layout:
 *        dimension d pairs with d + hs/2); both NULL for no rotation
 * probs: (B, H, T, S) float32, S = T rounded up to a multiple of 16: the attention weights, written
 *        by the forward for the backward: row i holds keys 0..i, then zeros up to the next multiple
 *        of 16; the rest of the row is never written nor read (computing the weights again in the
 *        backward from each row's log-sum-exp took 1.6x as long at T 64)
 * y:     (B, T, C) float32, the output
 * dy:    (B, T, C) float32, the gradient reaching y
 * dqkv:  (B, T, 3C) float32, the gradient of qkv, every element written
 *
 * hs must be a multiple of 16 and at most MAX_HS; T at most MAX_T, else -2 (train_ops checks these
 * limits before calling, and uses PyTorch's attention outside them). Float32 throughout; sums in the order of the loops below (PyTorch's order
 * differs, so results agree to float32 rounding, not bit for bit). The loops are written on the
 * vector types of vec.h, as wide as the CPU's registers. Built with the decoding kernels
 * (kernels/__init__.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

#define MAX_T 256
#define MAX_HS 256

/* Rows of scores and head widths come in multiples of PAD floats: whole vectors at every width. */
#define PAD 16

/* A row of scores: T keys, padded. */
static inline int64_t row_stride(int64_t T) { return (T + PAD - 1) / PAD * PAD; }

int64_t scratchlm_train_attention_max_t(void) { return MAX_T; }
int64_t scratchlm_train_attention_max_hs(void) { return MAX_HS; }
int64_t scratchlm_train_attention_hs_multiple(void) { return PAD; }
int64_t scratchlm_train_attention_row_stride(int64_t T) { return row_stride(T); }



/* out = x turned by the angles of one position: (a, b) -> (a cos - b sin, a sin + b cos) for each
 * pair (d, d + half). back != 0 turns the other way (the transpose, for a gradient). */
static inline void rotate(const float *restrict x, const float *restrict cos, const float *restrict sin,
                          int64_t half, int back, float *restrict out)
{
    const float sign = back ? -1.0f : 1.0f;
    for (int64_t d = 0; d < half; d++) {
        const float a = x[d], b = x[d + half], c = cos[d], s = sign * sin[d];
        out[d] = a * c - b * s;
        out[d + half] = a * s + b * c;
    }
}

/* Row t's q (part 0) or k (part 1) of head h, rotated (when cos is not NULL), into out (hs). */
static inline void load_rotated(const float *restrict x, const float *cos, const float *sin, int64_t t,
                                int64_t part, int64_t C, int64_t h, int64_t hs, float *restrict out)
{
    const float *row = x + t * 3 * C + part * C + h * hs;
    if (cos)
        rotate(row, cos + t * (hs / 2), sin + t * (hs / 2), hs / 2, 0, out);
    else
        memcpy(out, row, (size_t)hs * sizeof(float));
}

/* Row t's gradient for q (part 0) or k (part 1) of head h, turned back, into dx's row t. */
static inline void store_rotated_back(const float *restrict g, const float *cos, const float *sin, int64_t t,
                                      int64_t part, int64_t C, int64_t h, int64_t hs, float *restrict dx)
{
    float *row = dx + t * 3 * C + part * C + h * hs;
    if (cos)
        rotate(g, cos + t * (hs / 2), sin + t * (hs / 2), hs / 2, 1, row);
    else
        memcpy(row, g, (size_t)hs * sizeof(float));
}

/* kt (hs, S): the rotated keys of head h as columns, zero past T. */
static inline void keys_as_columns(const float *restrict x, const float *cos, const float *sin, int64_t T,
                                   int64_t C, int64_t h, int64_t hs, float *restrict kt, float *restrict tmp)
{
    const int64_t S = row_stride(T);
    for (int64_t j = 0; j < T; j++) {
        load_rotated(x, cos, sin, j, 1, C, h, hs, tmp);
        for (int64_t d = 0; d < hs; d++) kt[d * S + j] = tmp[d];
    }
    for (int64_t d = 0; d < hs; d++)
        for (int64_t j = T; j < S; j++) kt[d * S + j] = 0.0f;
}

/* s[0..m) = (q . k_j) * scale for the keys in kt's columns, then -infinity from key n on (the
 * keys after the query). m: n rounded up to whole vectors. */
static inline __attribute__((always_inline)) void scores(const float *restrict q, const float *restrict kt,
                                                         int64_t S, int64_t n, int64_t m, const int64_t hs,
                                                         float scale, float *restrict s)
{
    for (int64_t j = 0; j < m; j += VEC) {
        vf acc = splat(0.0f);
        for (int64_t d = 0; d < hs; d++) acc += (q[d] * scale) * load(kt + d * S + j);
        store(s + j, acc);
    }
    for (int64_t j = n; j < m; j++) s[j] = -INFINITY;
}

/* One (sequence, head) pair's forward. x: the sequence's qkv rows; p: its weights (T, S); y: the
 * sequence's output rows; work: hs S + hs floats. Inlined with hs a constant where it is
 * a common width, so that a row of hs floats stays in vector registers. */
static inline __attribute__((always_inline)) void head_forward(
    const float *restrict x, const float *cos, const float *sin, float *restrict p, float *restrict y,
    int64_t T, int64_t C, int64_t h, const int64_t hs, float scale, float *restrict work)
{
    const int64_t S = row_stride(T), nv = hs / VEC;
    float *kt = work, *q = kt + hs * S;
    keys_as_columns(x, cos, sin, T, C, h, hs, kt, q);
    for (int64_t i = 0; i < T; i++, p += S) {
        const int64_t n = i + 1, m = row_stride(n);  /* keys 0..i, whole vectors */
        load_rotated(x, cos, sin, i, 0, C, h, hs, q);
        scores(q, kt, S, n, m, hs, scale, p);
        float top = p[0];
        for (int64_t j = 1; j < n; j++) top = p[j] > top ? p[j] : top;
        vf sums = splat(0.0f);
        for (int64_t j = 0; j < m; j += VEC) {
            const vf e = exp_neg(load(p + j) - top);
            store(p + j, e);
            sums += e;
        }
        const float inv = 1.0f / sum_lanes(sums);
        for (int64_t j = 0; j < m; j += VEC) store(p + j, load(p + j) * inv);
        vf acc[MAX_HS / VEC];
        for (int64_t c = 0; c < nv; c++) acc[c] = splat(0.0f);
        for (int64_t j = 0; j < n; j++) {
            const float w = p[j], *v = x + j * 3 * C + 2 * C + h * hs;
            for (int64_t c = 0; c < nv; c++) acc[c] += w * load(v + c * VEC);
        }
        for (int64_t c = 0; c < nv; c++) store(y + i * C + h * hs + c * VEC, acc[c]);
    }
}

/* One pass of either direction over the (sequence, head) pairs: the arrays described at the top
 * (those of the other direction NULL), shapes, and 1 / sqrt(hs). */
typedef struct {
    const float *qkv, *cos, *sin, *probs, *dy; /* probs: read by the backward */
    float *probs_out, *y, *dqkv;               /* probs_out: written by the forward */
    int64_t T, H, hs, C, S;
    float scale;
} Pass;

static Pass pass_of(const float *qkv, const float *cos, const float *sin, int64_t T, int64_t H, int64_t hs)
{
    return (Pass){.qkv = qkv, .cos = cos, .sin = sin, .T = T, .H = H, .hs = hs, .C = H * hs, .S = row_stride(T),
                  .scale = 1.0f / sqrtf((float)hs)};
}

/* Calls pair(a, bh, work) for every pair bh = b * H + h of B sequences, the pairs shared out among
 * n_threads threads; work: work_floats floats of the calling thread's own, allocated once per
 * thread. Returns 0, -2 for shapes the loops do not cover, -1 if an allocation failed. */
static int each_pair(const Pass *a, int64_t B, void (*pair)(const Pass *, int64_t, float *), int64_t work_floats,
                     int n_threads)
{
    if (a->T < 1 || a->T > MAX_T || a->hs < PAD || a->hs % PAD || a->hs > MAX_HS) return -2;
    int failed = 0;
#pragma omp parallel num_threads(n_threads)
    {
        float *work = malloc((size_t)work_floats * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * a->H; bh++) {
            if (work) {
                pair(a, bh, work);
            } else {
#pragma omp atomic write
                failed = 1;
            }
        }
        free(work);
    }
    return failed ? -1 : 0;
}

static void forward_pair(const Pass *a, int64_t bh, float *work)
{
    const int64_t b = bh / a->H, h = bh % a->H, T = a->T, C = a->C;
    const float *x = a->qkv + b * T * 3 * C;
    float *p = a->probs_out + bh * T * a->S, *out = a->y + b * T * C;
    switch (a->hs) {
    case 32: head_forward(x, a->cos, a->sin, p, out, T, C, h, 32, a->scale, work); break;
    case 64: head_forward(x, a->cos, a->sin, p, out, T, C, h, 64, a->scale, work); break;
    default: head_forward(x, a->cos, a->sin, p, out, T, C, h, a->hs, a->scale, work); break;
    }
}

int scratchlm_train_attention_forward(const float *qkv, const float *cos, const float *sin, float *probs,
                                      float *y, int64_t B, int64_t T, int64_t H, int64_t hs, int n_threads)
{
    Pass a = pass_of(qkv, cos, sin, T, H, hs);
    a.probs_out = probs;
    a.y = y;
    return each_pair(&a, B, forward_pair, hs * a.S + hs, n_threads);
}

/* One (sequence, head) pair's backward. p: its weights (T, S); g: the sequence's rows of dy; dx:
 * its rows of dqkv; work: 3 T hs + hs + hs S + T S floats. */
static inline __attribute__((always_inline)) void head_backward(
    const float *restrict x, const float *cos, const float *sin, const float *restrict p,
    const float *restrict g, float *restrict dx, int64_t T, int64_t C, int64_t h, const int64_t hs, float scale,
    float *restrict work)
{
    const int64_t S = row_stride(T), nv = hs / VEC;
    /* qr, kr (T, hs): rotated queries and keys; gr (T, hs): this head's rows of dy; vt (hs, S):
     * values as columns; ds (T, S): the gradient of the scores */
    float *qr = work, *kr = qr + T * hs, *gr = kr + T * hs, *row = gr + T * hs, *vt = row + hs, *ds = vt + hs * S;
    for (int64_t t = 0; t < T; t++) {
        load_rotated(x, cos, sin, t, 0, C, h, hs, qr + t * hs);
        load_rotated(x, cos, sin, t, 1, C, h, hs, kr + t * hs);
        const float *v = x + t * 3 * C + 2 * C + h * hs;
        for (int64_t d = 0; d < hs; d++) vt[d * S + t] = v[d];
        memcpy(gr + t * hs, g + t * C + h * hs, (size_t)hs * sizeof(float));
    }
    for (int64_t d = 0; d < hs; d++)
        for (int64_t t = T; t < S; t++) vt[d * S + t] = 0.0f;
    for (int64_t i = 0; i < T; i++) {  /* ds row i = p * (dp - the sum of p dp), scaled, dp = g v^T */
        const int64_t m = row_stride(i + 1);  /* p is 0 from key i + 1 on: so is ds */
        const float *gi = gr + i * hs, *pi = p + i * S;
        float *dsi = ds + i * S;
        vf dots = splat(0.0f);
        for (int64_t j = 0; j < m; j += VEC) {
            vf dp = splat(0.0f);
            for (int64_t d = 0; d < hs; d++) dp += gi[d] * load(vt + d * S + j);
            store(dsi + j, dp);
            dots += load(pi + j) * dp;
        }
        const float dot = sum_lanes(dots);
        for (int64_t j = 0; j < m; j += VEC) store(dsi + j, load(pi + j) * (load(dsi + j) - dot) * scale);
    }
    vf acc[MAX_HS / VEC], acc2[MAX_HS / VEC];
    for (int64_t i = 0; i < T; i++) {  /* dq row i: the sum over keys j <= i of ds[i, j] k_j */
        for (int64_t c = 0; c < nv; c++) acc[c] = splat(0.0f);
        for (int64_t j = 0; j <= i; j++) {
            const float s = ds[i * S + j];
            for (int64_t c = 0; c < nv; c++) acc[c] += s * load(kr + j * hs + c * VEC);
        }
        for (int64_t c = 0; c < nv; c++) store(row + c * VEC, acc[c]);
        store_rotated_back(row, cos, sin, i, 0, C, h, hs, dx);
    }
    for (int64_t j = 0; j < T; j++) {  /* dk, dv row j: sums over the queries i >= j */
        for (int64_t c = 0; c < nv; c++) acc[c] = acc2[c] = splat(0.0f);
        for (int64_t i = j; i < T; i++) {
            const float s = ds[i * S + j], w = p[i * S + j];
            for (int64_t c = 0; c < nv; c++) {
                acc[c] += s * load(qr + i * hs + c * VEC);
                acc2[c] += w * load(gr + i * hs + c * VEC);
            }
        }
        for (int64_t c = 0; c < nv; c++) store(row + c * VEC, acc[c]);
        store_rotated_back(row, cos, sin, j, 1, C, h, hs, dx);
        for (int64_t c = 0; c < nv; c++) store(dx + j * 3 * C + 2 * C + h * hs + c * VEC, acc2[c]);
    }
}

static void backward_pair(const Pass *a, int64_t bh, float *work)
{
    const int64_t b = bh / a->H, h = bh % a->H, T = a->T, C = a->C;
    const float *x = a->qkv + b * T * 3 * C, *p = a->probs + bh * T * a->S, *g = a->dy + b * T * C;
    float *dx = a->dqkv + b * T * 3 * C;
    switch (a->hs) {
    case 32: head_backward(x, a->cos, a->sin, p, g, dx, T, C, h, 32, a->scale, work); break;
    case 64: head_backward(x, a->cos, a->sin, p, g, dx, T, C, h, 64, a->scale, work); break;
    default: head_backward(x, a->cos, a->sin, p, g, dx, T, C, h, a->hs, a->scale, work); break;
    }
}

int scratchlm_train_attention_backward(const float *qkv, const float *cos, const float *sin, const float *probs,
                                       const float *dy, float *dqkv, int64_t B, int64_t T, int64_t H, int64_t hs,
                                       int n_threads)
{
    Pass a = pass_of(qkv, cos, sin, T, H, hs);
    a.probs = probs;
    a.dy = dy;
    a.dqkv = dqkv;
    return each_pair(&a, B, backward_pair, 3 * T * hs + hs + hs * a.S + T * a.S, n_threads);
}
