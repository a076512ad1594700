/* One whole decoding step of a pre-norm GPT in one call: B sequences, one new token each (or a
 * few: B * T <= MAX_ROWS, for a short prompt), from token ids to next-token logits, with every
 * layer's new keys and values written into the KV cache.
 *
 * Why: with bfloat16 weights read by gemv_bf16.c, a GPT-2-small step is mostly the reading of its
 * 250 MB of weights, but through torch modules it also spends a sizeable share on everything else:
 * layer norms, activations, residual adds, module calls and 50 separate parallel regions, each a
 * few microseconds (figures: benchmarks/measurements.md). Here the whole step is one parallel region: the threads share out the
 * rows of each weight matrix, and wait for each other only where the next stage needs a result
 * that all of them wrote (6 barriers per layer).
 *
 * Per layer, for each sequence (x is the residual stream, (B, C)):
 *     h   = norm_1(x)                                   each thread, its own copy
 *     qkv = h W_qkv^T + b                               rows of W_qkv shared out
 *     att = softmax(q K^T / sqrt(hs)) V per head        heads shared out; RoPE, cache write here
 *     x  += att W_o^T + b                               rows shared out
 *     h   = norm_2(x)                                   each thread
 *     f   = h W_fc^T + b                                rows shared out
 *     a   = act(f)     (SwiGLU: silu(first half) * second half)   elements shared out
 *     x  += a W_proj^T + b                              rows shared out
 * then logits = norm_f(x) W_head^T + b.
 *
 * Products use bf16_dot.h (float32 sums; the weights bfloat16, or float32 when weights_f32).
 * Norms, attention and activations are float32, norm statistics summed in double; e^x and erf
 * come from branch-free approximations (relative error about 1e-7; exp_vec in attention.h,
 * erf_vec below), so that softmax and the activations vectorise. One position's attention is
 * attention.h's attend_position, shared with attend_one.c. scratchlm/kernels/decode_step.py fills the structs from a decoding
 * copy of the model (scratchlm.kernels.decoding_copy.decoding_model), and allocates the step's
 * scratch memory once for that copy (Scratch below): a step allocates nothing.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "bf16_dot.h"

#ifdef _OPENMP
#include <omp.h>
#define THREAD_NUM() omp_get_thread_num()
#else
#define THREAD_NUM() 0
#endif

typedef struct {
    const void *weight;     /* (n_out, k) bfloat16 (or float32: StepModel.weights_f32), as nn.Linear keeps it */
    const float *bias;      /* (n_out,) or NULL */
    int64_t n_out, k;
} StepLinear;

typedef struct {
    const float *norm1_weight, *norm1_bias; /* biases NULL for RMSNorm */
    const float *norm2_weight, *norm2_bias;
    StepLinear qkv, attn_out, fc, mlp_out;
} StepLayer;

enum { NORM_LAYER = 0, NORM_RMS = 1 };
enum { ACT_RELU = 0, ACT_GELU = 1, ACT_GELU_TANH = 2, ACT_SWIGLU = 3 };

typedef struct {
    int64_t n_layer, n_head, head_dim, n_embd, t_max, vocab;
    int64_t norm, activation; /* NORM_*, ACT_* */
    int64_t weights_f32;      /* 1: every StepLinear's weight is float32, else bfloat16 */
    double norm_eps;
    const float *tok_emb;             /* (vocab, C) */
    const float *pos_emb;             /* (t_max, C) added to each token's row (learned or sinusoidal), or NULL */
    const float *rope_cos, *rope_sin; /* (t_max, hs / 2) for RoPE, or NULL */
    const StepLayer *layers;          /* n_layer of them */
    const float *final_norm_weight, *final_norm_bias;
    StepLinear head;
} StepModel;

/* erf(x) without a call (Abramowitz and Stegun 7.1.26: absolute error below 1.5e-7), for the
 * same reason as exp_vec (attention.h). */
static inline float erf_vec(float x)
{
    const float a = x < 0.0f ? -x : x, t = 1.0f / (1.0f + 0.3275911f * a);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    const float y = 1.0f - poly * exp_vec(-a * a);
    return x < 0.0f ? -y : y;
}

/* out[r] = norm(x[r]) for rows r of C values, x's rows `stride` floats apart, out's C apart */
static void norm_rows(const StepModel *md, const float *x, int64_t stride, float *out, const float *w, const float *b,
                      int64_t rows)
{
    const int64_t C = md->n_embd;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * stride;
        float *o = out + r * C;
        if (md->norm == NORM_LAYER) {
            double sum = 0.0, sq = 0.0;
#pragma omp simd reduction(+ : sum) /* the sums in vector lanes, added up at the end */
            for (int64_t i = 0; i < C; i++) sum += xr[i];
            const double mean = sum / (double)C;
#pragma omp simd reduction(+ : sq)
            for (int64_t i = 0; i < C; i++) sq += (xr[i] - mean) * (xr[i] - mean);
            const float fmean = (float)mean, inv = (float)(1.0 / sqrt(sq / (double)C + md->norm_eps));
            for (int64_t i = 0; i < C; i++) o[i] = (xr[i] - fmean) * inv * w[i] + (b ? b[i] : 0.0f);
        } else {
            double sq = 0.0;
#pragma omp simd reduction(+ : sq)
            for (int64_t i = 0; i < C; i++) sq += (double)xr[i] * xr[i];
            const float inv = (float)(1.0 / sqrt(sq / (double)C + md->norm_eps));
            for (int64_t i = 0; i < C; i++) o[i] = xr[i] * inv * w[i];
        }
    }
}

/* Where one thread of the team works: its own copies of the normed rows (h) and of a matrix's input
 * in the dot products' layout (xb), and room for one head's scores. rows_counted: NULL, or where
 * this thread adds up the (weight row, input row) products it computed (for the tests of how the
 * work is shared out: scratchlm_decode_step_counted). */
typedef struct {
    float *h, *scores;
    input_t *xb;
    int64_t *rows_counted;
} Own;

/* out (B, n_out) = in (B, k) W^T + b, or out += that when `add`. Called by every thread of the
 * team: each puts `in` into its own xb, then the rows of W are shared out; the barrier at the end
 * of the loop means out is complete when any thread returns. */
static void linear_team(const StepLinear *L, const float *in, const Own *me, float *out, int64_t B, int add, int f32)
{
    const int64_t n = L->n_out, k = L->k;
    if (!f32) prepare_input(in, B, k, me->xb);
    /* guided: big blocks first, small ones last, so a thread slowed by another tenant of the
     * machine holds the others up less at the barrier (2-3% over static on the benchmark VM) */
    int64_t mine = 0; /* rows this thread took */
#pragma omp for schedule(guided, 32)
    for (int64_t o = 0; o < n; o++) {
        product_column(L->weight, f32, me->xb, in, k, o, L->bias, out, n, (int)B, add);
        mine++;
    }
    if (me->rows_counted) *me->rows_counted += mine * B;
}

/* The new positions' attention for every (sequence, head), shared out among the team. Row
 * b * T + t of qkv and att is sequence b at position p = pos + t; in order of t, its q and k get
 * RoPE (in place in qkv), its k and v go into the cache at p, and it attends over positions
 * 0..p, so each new position sees the ones before it and itself. att: (B * T, C). scores: this
 * thread's t_max floats. */
static void attend_team(const StepModel *md, float *qkv, float *k_cache, float *v_cache, float *att, float *scores,
                        int64_t B, int64_t T, int64_t start)
{
    const int64_t H = md->n_head, hs = md->head_dim, C = md->n_embd, t_max = md->t_max, half = hs / 2;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; bh++) for (int64_t t = 0; t < T; t++) {
        const int64_t b = bh / H, h = bh % H, row = b * T + t, pos = start + t;
        float *q = qkv + row * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
        if (md->rope_cos) { /* rotate each pair (i, i + hs/2) by this position's angle */
            const float *cs = md->rope_cos + pos * half, *sn = md->rope_sin + pos * half;
            for (int64_t i = 0; i < half; i++) {
                const float q1 = q[i], q2 = q[i + half], k1 = k[i], k2 = k[i + half];
                q[i] = q1 * cs[i] - q2 * sn[i];
                q[i + half] = q1 * sn[i] + q2 * cs[i];
                k[i] = k1 * cs[i] - k2 * sn[i];
                k[i + half] = k1 * sn[i] + k2 * cs[i];
            }
        }
        float *keys = k_cache + bh * t_max * hs, *values = v_cache + bh * t_max * hs;
        memcpy(keys + pos * hs, k, (size_t)hs * sizeof(float));
        memcpy(values + pos * hs, v, (size_t)hs * sizeof(float));
        attend_position(q, keys, values, pos + 1, hs, scores, att + row * C + h * hs);
    }
}

/* h = act(f), f (B, width), elements shared out among the team; SwiGLU halves the width. The
 * barrier at the end of each loop means h is complete when any thread returns. */
static void activate_team(const float *f, float *h, int64_t B, int64_t width, int64_t act)
{
    const int64_t n_out = act == ACT_SWIGLU ? width / 2 : width;
    for (int64_t r = 0; r < B; r++) { /* one loop per row and activation, each vectorised */
        const float *fr = f + r * width;
        float *hr = h + r * n_out;
        if (act == ACT_SWIGLU) {
#pragma omp for simd schedule(static)
            for (int64_t i = 0; i < n_out; i++) hr[i] = fr[i] / (1.0f + exp_vec(-fr[i])) * fr[n_out + i];
        } else if (act == ACT_RELU) {
#pragma omp for simd schedule(static)
            for (int64_t i = 0; i < n_out; i++) hr[i] = fr[i] > 0.0f ? fr[i] : 0.0f;
        } else if (act == ACT_GELU) {
#pragma omp for simd schedule(static)
            for (int64_t i = 0; i < n_out; i++) hr[i] = 0.5f * fr[i] * (1.0f + erf_vec(fr[i] * 0.70710678118654752f));
        } else { /* tanh form: 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), tanh u = 1 - 2 / (e^2u + 1) */
#pragma omp for simd schedule(static)
            for (int64_t i = 0; i < n_out; i++) {
                const float x = fr[i], u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
                hr[i] = 0.5f * x * (2.0f - 2.0f / (exp_vec(2.0f * u) + 1.0f));
            }
        }
    }
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static size_t whole_lines(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* The step's scratch memory, carved out of one block that the caller allocates once per decoding
 * copy (scratchlm_decode_scratch_bytes says how large), so that a step allocates nothing. Sized for
 * MAX_ROWS rows; every buffer starts on a 64-byte line, so no two threads share a line. */
typedef struct {
    float *x, *qkv, *att, *f, *act; /* the team's: the residual stream (rows, C), and each stage's output */
    char *own;                      /* then each thread's Own, own_bytes apart */
    size_t own_bytes, h_bytes, scores_bytes;
} Scratch;

/* Lays out the scratch of a step on n_threads threads from `base` (may be NULL: only the size is
 * wanted). Returns the bytes it takes from base on. */
static size_t lay_out(const StepModel *md, int64_t n_threads, char *base, Scratch *s)
{
    const int64_t C = md->n_embd;
    int64_t widest = max64(C, md->head.k), fc_width = 0; /* the widest input of any matrix */
    for (int64_t l = 0; l < md->n_layer; l++) {
        const StepLayer *L = md->layers + l;
        widest = max64(widest, max64(max64(L->qkv.k, L->attn_out.k), max64(L->fc.k, L->mlp_out.k)));
        fc_width = max64(fc_width, L->fc.n_out);
    }
    const size_t row = sizeof(float) * MAX_ROWS, sizes[5] = {row * C, row * 3 * C, row * C, row * fc_width,
                                                              row * fc_width};
    float **shared[5] = {&s->x, &s->qkv, &s->att, &s->f, &s->act};
    size_t used = 0;
    for (int i = 0; i < 5; i++) {
        *shared[i] = base ? (float *)(base + used) : NULL;
        used += whole_lines(sizes[i]);
    }
    s->own = base ? base + used : NULL;
    s->h_bytes = whole_lines(row * C);
    s->scores_bytes = whole_lines(sizeof(float) * md->t_max);
    s->own_bytes = s->h_bytes + s->scores_bytes + whole_lines(sizeof(input_t) * MAX_ROWS * input_len(widest));
    return used + (size_t)n_threads * s->own_bytes;
}

/* Thread t's part of the scratch. */
static Own own_part(const Scratch *s, int t, int64_t *rows_of_thread)
{
    char *mine = s->own + (size_t)t * s->own_bytes;
    return (Own){.h = (float *)mine, .scores = (float *)(mine + s->h_bytes),
                 .xb = (input_t *)(mine + s->h_bytes + s->scores_bytes),
                 .rows_counted = rows_of_thread ? rows_of_thread + t : NULL};
}

/* The bytes of scratch a step of `md` on up to n_threads threads needs (scratchlm_decode_step's
 * `scratch`), 64 of them spare to start it on a 64-byte line. */
int64_t scratchlm_decode_scratch_bytes(const StepModel *md, int64_t n_threads)
{
    Scratch s;
    return (int64_t)lay_out(md, n_threads > 0 ? n_threads : 1, NULL, &s) + 64;
}

/* The step; rows_of_thread: NULL, or (n_threads,) counts that each thread adds its products to. */
static int decode_step(const StepModel *md, const int64_t *ids, int64_t B, int64_t T, int64_t pos, float *k_cache,
                       float *v_cache, float *logits, int n_threads, void *scratch, int64_t scratch_bytes,
                       int64_t *rows_of_thread)
{
    if (B < 1 || T < 1 || B * T > MAX_ROWS || pos < 0 || pos + T > md->t_max) return -2;
    const int64_t R = B * T; /* rows through every matrix: sequence b, position pos + t is row b * T + t */
    for (int64_t r = 0; r < R; r++)
        if (ids[r] < 0 || ids[r] >= md->vocab) return -2;
    n_threads = n_threads > 0 ? n_threads : 1;
    if (scratch_bytes < scratchlm_decode_scratch_bytes(md, n_threads)) return -1;
    Scratch s;
    lay_out(md, n_threads, (char *)(((uintptr_t)scratch + 63) / 64 * 64), &s);
    const int64_t C = md->n_embd, H = md->n_head, hs = md->head_dim;
    float *x = s.x, *qkv = s.qkv, *att = s.att, *f = s.f, *act = s.act;
    for (int64_t r = 0; r < R; r++) {
        const int64_t p = pos + r % T;
        for (int64_t i = 0; i < C; i++)
            x[r * C + i] = md->tok_emb[ids[r] * C + i] + (md->pos_emb ? md->pos_emb[p * C + i] : 0.0f);
    }
    const int f32 = md->weights_f32 != 0;
    const int64_t per_layer = B * H * md->t_max * hs;

#pragma omp parallel num_threads(n_threads)
    {
        const Own me = own_part(&s, THREAD_NUM(), rows_of_thread); /* OpenMP gives at most n_threads */
        for (int64_t l = 0; l < md->n_layer; l++) {
            const StepLayer *L = md->layers + l;
            norm_rows(md, x, C, me.h, L->norm1_weight, L->norm1_bias, R);
            linear_team(&L->qkv, me.h, &me, qkv, R, 0, f32);
            attend_team(md, qkv, k_cache + l * per_layer, v_cache + l * per_layer, att, me.scores, B, T, pos);
            linear_team(&L->attn_out, att, &me, x, R, 1, f32);
            norm_rows(md, x, C, me.h, L->norm2_weight, L->norm2_bias, R);
            linear_team(&L->fc, me.h, &me, f, R, 0, f32);
            activate_team(f, act, R, L->fc.n_out, md->activation);
            linear_team(&L->mlp_out, act, &me, x, R, 1, f32);
        }
        if (logits) { /* only each sequence's last position goes on to the head */
            norm_rows(md, x + (T - 1) * C, T * C, me.h, md->final_norm_weight, md->final_norm_bias, B);
            linear_team(&md->head, me.h, &me, logits, B, 0, f32);
        }
    }
    return 0;
}

/* ids (B, T) -> logits (B, vocab) of each sequence's last position, B * T <= MAX_ROWS (T > 1: a
 * short prompt, or its next piece). k_cache, v_cache: (n_layer, B, H, t_max, hs) float32,
 * positions 0..pos-1 filled; positions pos..pos+T-1 are written. logits NULL: the final norm and
 * the head are skipped (a piece of a prompt before its last needs only the cache). scratch:
 * scratchlm_decode_scratch_bytes(md, n_threads) bytes or more, the step's working memory. Returns
 * 0, -1 for too little scratch, -2 for arguments out of range (B * T, pos + T, an id); nothing is
 * written then. */
int scratchlm_decode_step(const StepModel *md, const int64_t *ids, int64_t B, int64_t T, int64_t pos, float *k_cache,
                          float *v_cache, float *logits, int n_threads, void *scratch, int64_t scratch_bytes)
{
    return decode_step(md, ids, B, T, pos, k_cache, v_cache, logits, n_threads, scratch, scratch_bytes, NULL);
}

/* scratchlm_decode_step that also adds, for each thread t of the team, the (weight row, input
 * row) products it computed to rows_of_thread[t] (n_threads int64): how the work was shared
 * out, counted in the loop that computes it. For tests; the step itself counts nothing. */
int scratchlm_decode_step_counted(const StepModel *md, const int64_t *ids, int64_t B, int64_t T, int64_t pos,
                                  float *k_cache, float *v_cache, float *logits, int n_threads, void *scratch,
                                  int64_t scratch_bytes, int64_t *rows_of_thread)
{
    return decode_step(md, ids, B, T, pos, k_cache, v_cache, logits, n_threads, scratch, scratch_bytes,
                       rows_of_thread);
}

/* The index of the largest of n scores: the first of equal maxima, or the first NaN if there is
 * one (as NumPy's argmax, which scratchlm.generation.sampling.greedy_ids uses). */
static int64_t argmax_scores(const float *v, int64_t n)
{
    float top = v[0];
    int nan = 0;
#pragma omp simd reduction(max : top) reduction(| : nan)
    for (int64_t i = 0; i < n; i++) {
        top = v[i] > top ? v[i] : top;
        nan |= v[i] != v[i];
    }
    for (int64_t i = 0; i < n; i++)
        if (nan ? v[i] != v[i] : v[i] == top) return i;
    return 0;
}

/* `steps` greedy steps in one call: from ids (B,), the last token of each sequence (not yet in
 * the cache, which holds positions 0..pos-1), each step runs scratchlm_decode_step on one new
 * token per sequence, writes its scores to logits[s] (B, vocab) and the most likely next token to
 * out[s] (B,), which the next step reads. Returns as scratchlm_decode_step does; -2 (nothing
 * written) also when pos + steps > t_max.
 *
 * Why not one step per call from Python: a step streams the whole model through the caches, so
 * whatever Python runs between two steps finds its own data evicted and runs many times slower
 * than usual (benchmarks/measurements.md). */
int scratchlm_decode_greedy(const StepModel *md, const int64_t *ids, int64_t B, int64_t steps, int64_t pos,
                            float *k_cache, float *v_cache, float *logits, int64_t *out, int n_threads, void *scratch,
                            int64_t scratch_bytes)
{
    if (steps < 1 || pos + steps > md->t_max) return -2;
    const int64_t *in = ids;
    for (int64_t s = 0; s < steps; s++) {
        float *scores = logits + s * B * md->vocab;
        const int rc = scratchlm_decode_step(md, in, B, 1, pos + s, k_cache, v_cache, scores, n_threads, scratch,
                                             scratch_bytes);
        if (rc != 0) return rc; /* -2 only at s == 0: the ids it picks are always in range */
        for (int64_t b = 0; b < B; b++) out[s * B + b] = argmax_scores(scores + b * md->vocab, md->vocab);
        in = out + s * B;
    }
    return 0;
}
