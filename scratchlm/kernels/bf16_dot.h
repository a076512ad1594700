/* The dot products every kernel is built on: one bfloat16 weight row (as nn.Linear stores it,
 * (out, in) row-major) against up to MAX_ROWS input rows, summed in float32; and the same for a
 * float32 weight row (dot_rows_f32).
 *
 * The input is first put in the form the loop reads (`prepare_input`), once per matrix, then
 * `dot_rows` is called for each weight row. Which loop is compiled depends on the instruction set
 * the file is compiled for (scratchlm/kernels/__init__.py: VARIANTS); KERNEL_PATH names it and
 * ROUNDS_INPUT says how it rounds, which is what the tests check:
 *   - "avx512-bf16" (AVX512-BF16): the input is rounded to bfloat16 (round to nearest even, as
 *     torch's .to(torch.bfloat16) and autocast do), 32 values to a vector, and VDPBF16PS
 *     multiplies 32 weight/input pairs (each product exact in float32) and adds them into 16
 *     float32 sums. ROUNDS_INPUT 1.
 *   - "avx512f" (AVX-512F and BW, no BF16), "avx2" (AVX2 and FMA): each bfloat16 weight is widened
 *     to float32 in registers (a bfloat16 is the top half of a float32, so this is exact: a shift
 *     or a mask per pair of weights) and multiplied into the float32 input with fused
 *     multiply-adds, 16 (8) lanes at a time. The input is not rounded. ROUNDS_INPUT 0.
 *   - "portable" (anything else): the same arithmetic in plain C, which the compiler vectorises
 *     as far as the target allows (not at all in the "scalar" variant). ROUNDS_INPUT 0.
 * In every path the sums are float32, in lanes added up at the end, so the order differs from a
 * sequential sum by float32 rounding only.
 * Included by gemv_bf16.c and decode_step.c; everything here is static.
 */
#ifndef SCRATCHLM_BF16_DOT_H
#define SCRATCHLM_BF16_DOT_H

#include <stdint.h>
#include <string.h>

#define MAX_ROWS 8 /* input rows per call; more rows is a matmul, which oneDNN does well */

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define HAVE_DPBF16 1
#define KERNEL_PATH "avx512-bf16"
#define ROUNDS_INPUT 1

typedef __m512bh input_t; /* 32 bfloat16 inputs */

/* input_t elements per input row of k values */
static inline int64_t input_len(int64_t k) { return (k + 31) / 32; }

/* x (m, k) float32 -> xb (m, input_len(k)), each row padded with zeros */
static inline void prepare_input(const float *x, int64_t m, int64_t k, input_t *xb)
{
    const int64_t n_chunks = input_len(k);
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * k;
        int64_t c = 0;
        for (; c < k / 32; c++)
            xb[r * n_chunks + c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + c * 32 + 16),
                                                      _mm512_loadu_ps(row + c * 32));
        if (c < n_chunks) { /* the last k % 32 values, the rest zero */
            float lo[16], hi[16];
            for (int l = 0; l < 16; l++) {
                int64_t i = c * 32 + l;
                lo[l] = i < k ? row[i] : 0.0f;
                hi[l] = i + 16 < k ? row[i + 16] : 0.0f;
            }
            xb[r * n_chunks + c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo));
        }
    }
}

/* sums[r] = w_row . x[r] for r < m */
static inline __attribute__((always_inline)) void dot_rows(const uint16_t *w_row, const input_t *xb, int64_t k,
                                                           float *sums, const int m)
{
    const int64_t n_chunks = input_len(k);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < m; r++) acc[r] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c < k / 32; c++) {
        /* With 6 or more rows the products take about as long as the reads, and the hardware
         * prefetcher alone no longer keeps them apart: asking for the weights 2 KB ahead lets the
         * two overlap. With fewer rows it costs time instead (benchmarks/measurements.md). */
        if (m >= 6) _mm_prefetch((const char *)(w_row + c * 32) + 2048, _MM_HINT_T0);
        __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(w_row + c * 32));
        for (int r = 0; r < m; r++) acc[r] = _mm512_dpbf16_ps(acc[r], wv, xb[r * n_chunks + c]);
    }
    if (c < n_chunks) { /* the last k % 32 weights; the masked lanes read as zero */
        __mmask32 mask = (__mmask32)((1ULL << (k % 32)) - 1);
        __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, (const void *)(w_row + c * 32));
        for (int r = 0; r < m; r++) acc[r] = _mm512_dpbf16_ps(acc[r], wv, xb[r * n_chunks + c]);
    }
    for (int r = 0; r < m; r++) sums[r] = _mm512_reduce_add_ps(acc[r]);
}

#else
#define HAVE_DPBF16 0
#define ROUNDS_INPUT 0

typedef float input_t; /* the input stays float32 */

static inline __attribute__((always_inline)) float bf16_to_float(uint16_t v)
{
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

/* The widening loops read a vector of bfloat16 weights as 32-bit lanes, each holding two: shifted
 * left by 16, a lane is the float32 of its even weight; masked to its top half, of its odd one.
 * So the input is laid out once per matrix to match (`prepare_input`): in each chunk of CHUNK
 * values, the even-indexed values first, then the odd ones, zero-padded to whole chunks. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define KERNEL_PATH "avx512f"
#define CHUNK 32
#else
#define KERNEL_PATH "avx2"
#define CHUNK 16
#endif

static inline int64_t input_len(int64_t k) { return (k + CHUNK - 1) / CHUNK * CHUNK; }

static inline void prepare_input(const float *x, int64_t m, int64_t k, input_t *xb)
{
    const int64_t len = input_len(k);
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < len; c += CHUNK)
            for (int j = 0; j < CHUNK / 2; j++) {
                const int64_t even = c + 2 * j, odd = even + 1;
                xb[r * len + c + j] = even < k ? x[r * k + even] : 0.0f;
                xb[r * len + c + CHUNK / 2 + j] = odd < k ? x[r * k + odd] : 0.0f;
            }
}

#if CHUNK == 32
/* sums[r] = w_row . x[r] for r < m: per 32 weights one 64-byte load, a shift and a mask, and two
 * fused multiply-adds per row (into two sums, so two chains are in flight). */
static inline __attribute__((always_inline)) void dot_rows(const uint16_t *w_row, const input_t *xb, int64_t k,
                                                           float *sums, const int m)
{
    const int64_t len = input_len(k), full = k / 32;
    const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 acc[MAX_ROWS][2];
    for (int r = 0; r < m; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c <= full; c++) {
        __m512i raw;
        if (c < full) {
            /* as in the BF16 loop: with 6 or more rows, the weights asked for 2 KB ahead */
            if (m >= 6) _mm_prefetch((const char *)(w_row + c * 32) + 2048, _MM_HINT_T0);
            raw = _mm512_loadu_si512((const void *)(w_row + c * 32));
        } else if (k % 32) { /* the last k % 32 weights; the masked lanes read as zero */
            raw = _mm512_maskz_loadu_epi16((__mmask32)((1ULL << (k % 32)) - 1), (const void *)(w_row + c * 32));
        } else {
            break;
        }
        const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(raw, top));
        for (int r = 0; r < m; r++) {
            acc[r][0] = _mm512_fmadd_ps(even, _mm512_loadu_ps(xb + r * len + c * 32), acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(odd, _mm512_loadu_ps(xb + r * len + c * 32 + 16), acc[r][1]);
        }
    }
    for (int r = 0; r < m; r++) sums[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

#else
static inline __attribute__((always_inline)) float sum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One chunk of 16 weights (raw) into the sums acc[r][slot] (even products) and acc[r][slot + 1]
 * (odd ones); with more than 4 rows both go into acc[r][0] (16 ymm registers hold no more). */
static inline __attribute__((always_inline)) void avx2_chunk(__m256i raw, const input_t *xb, int64_t len, int64_t c,
                                                             __m256 acc[][4], const int m, const int slot)
{
    const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32((int)0xFFFF0000u)));
    for (int r = 0; r < m; r++) {
        const float *x = xb + r * len + c * 16;
        if (m <= 4) {
            acc[r][slot] = _mm256_fmadd_ps(even, _mm256_loadu_ps(x), acc[r][slot]);
            acc[r][slot + 1] = _mm256_fmadd_ps(odd, _mm256_loadu_ps(x + 8), acc[r][slot + 1]);
        } else {
            acc[r][0] = _mm256_fmadd_ps(even, _mm256_loadu_ps(x), acc[r][0]);
            acc[r][0] = _mm256_fmadd_ps(odd, _mm256_loadu_ps(x + 8), acc[r][0]);
        }
    }
}

/* sums[r] = w_row . x[r] for r < m, as the AVX-512 loop with 16 weights a chunk, two chunks a
 * turn. A multiply-add waits about 4 cycles for the one before it in its chain, so one or two rows
 * keep four chains (sums) in flight, or the loop, not memory, would set the pace. */
static inline __attribute__((always_inline)) void dot_rows(const uint16_t *w_row, const input_t *xb, int64_t k,
                                                           float *sums, const int m)
{
    const int64_t len = input_len(k), full = k / 16;
    const int second = m <= 2 ? 2 : 0; /* where the second chunk of a turn sums */
    __m256 acc[MAX_ROWS][4];
    for (int r = 0; r < m; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 2 <= full; c += 2) {
        if (m >= 6) _mm_prefetch((const char *)(w_row + c * 16) + 2048, _MM_HINT_T0);
        avx2_chunk(_mm256_loadu_si256((const __m256i *)(w_row + c * 16)), xb, len, c, acc, m, 0);
        avx2_chunk(_mm256_loadu_si256((const __m256i *)(w_row + c * 16 + 16)), xb, len, c + 1, acc, m, second);
    }
    if (c < full) {
        avx2_chunk(_mm256_loadu_si256((const __m256i *)(w_row + c * 16)), xb, len, c, acc, m, 0);
        c++;
    }
    if (k % 16) { /* the last k % 16 weights, through a zero-padded copy */
        uint16_t tail[16] = {0};
        memcpy(tail, w_row + c * 16, (size_t)(k % 16) * sizeof(uint16_t));
        avx2_chunk(_mm256_loadu_si256((const __m256i *)tail), xb, len, c, acc, m, 0);
    }
    for (int r = 0; r < m; r++)
        sums[r] = sum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
}
#endif

#else
#define KERNEL_PATH "portable"

static inline int64_t input_len(int64_t k) { return k; }

static inline void prepare_input(const float *x, int64_t m, int64_t k, input_t *xb)
{
    memcpy(xb, x, (size_t)(m * k) * sizeof(float));
}

#define LANES 16

static inline __attribute__((always_inline)) void dot_rows(const uint16_t *w_row, const input_t *x, int64_t k,
                                                           float *sums, const int m)
{
    float acc[MAX_ROWS][LANES];
    for (int r = 0; r < m; r++)
        for (int l = 0; l < LANES; l++) acc[r][l] = 0.0f;
    int64_t i = 0;
    for (; i + LANES <= k; i += LANES)
        for (int r = 0; r < m; r++)
            for (int l = 0; l < LANES; l++) acc[r][l] += bf16_to_float(w_row[i + l]) * x[r * k + i + l];
    for (int r = 0; r < m; r++) {
        float sum = 0.0f;
        for (int l = 0; l < LANES; l++) sum += acc[r][l];
        for (int64_t j = i; j < k; j++) sum += bf16_to_float(w_row[j]) * x[r * k + j];
        sums[r] = sum;
    }
}

#endif /* the widening loops */
#endif /* HAVE_DPBF16 */

/* The same for float32 weights (decoding without bfloat16): sums[r] = w_row . x[r], x float32
 * (m, k). Sixteen independent lanes per row, which the compiler turns into vector FMAs. */
static inline __attribute__((always_inline)) void dot_rows_f32(const float *w_row, const float *x, int64_t k,
                                                               float *sums, const int m)
{
    float acc[MAX_ROWS][16];
    for (int r = 0; r < m; r++)
        for (int l = 0; l < 16; l++) acc[r][l] = 0.0f;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        /* as in dot_rows, but from 2 rows on: float32 rows are twice the bytes per product */
        if (m >= 2) __builtin_prefetch((const char *)(w_row + i) + 2048);
        for (int r = 0; r < m; r++)
            for (int l = 0; l < 16; l++) acc[r][l] += w_row[i + l] * x[r * k + i + l];
    }
    for (int r = 0; r < m; r++) {
        float sum = 0.0f;
        for (int l = 0; l < 16; l++) sum += acc[r][l];
        for (int64_t j = i; j < k; j++) sum += w_row[j] * x[r * k + j];
        sums[r] = sum;
    }
}

/* SWITCH_ROWS(m, BODY): BODY with the row count M a compile-time constant, so the loops over
 * rows in dot_rows unroll and the accumulators stay in registers. */
#define SWITCH_ROWS(m, BODY)                                                                    \
    switch (m) {                                                                                \
    case 1: { const int M = 1; BODY; } break;                                                   \
    case 2: { const int M = 2; BODY; } break;                                                   \
    case 3: { const int M = 3; BODY; } break;                                                   \
    case 4: { const int M = 4; BODY; } break;                                                   \
    case 5: { const int M = 5; BODY; } break;                                                   \
    case 6: { const int M = 6; BODY; } break;                                                   \
    case 7: { const int M = 7; BODY; } break;                                                   \
    case 8: { const int M = 8; BODY; } break;                                                   \
    default: __builtin_unreachable(); /* callers check 1 <= m <= MAX_ROWS */                    \
    }

/* One output column of y = x W^T + b for m input rows: out[r * n + o] = w_o . x_r + bias_o, or
 * added to what is there when `add`. W (n, k) row-major, bfloat16 (xb: the input as
 * prepare_input left it) or float32 when `f32` (x: the input as it is). The row count becomes a
 * compile-time constant inside, so dot_rows' loops over rows unroll. */
static inline __attribute__((always_inline)) void product_column(const void *w, int f32, const input_t *xb,
                                                                 const float *x, int64_t k, int64_t o,
                                                                 const float *bias, float *out, int64_t n, int m,
                                                                 int add)
{
    const float b = bias ? bias[o] : 0.0f;
    float sums[MAX_ROWS];
    SWITCH_ROWS(m, {
        if (f32)
            dot_rows_f32((const float *)w + o * k, x, k, sums, M);
        else
            dot_rows((const uint16_t *)w + o * k, xb, k, sums, M);
        for (int r = 0; r < M; r++) out[r * n + o] = (add ? out[r * n + o] : 0.0f) + sums[r] + b;
    });
}

#endif
