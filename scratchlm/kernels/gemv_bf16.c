/* y = x W^T + b for a handful of rows x, with W in bfloat16, stored (out, in) row-major as
 * nn.Linear keeps it. This is the whole cost of a decoding step on a CPU: one token per sequence
 * meets every weight once, so the step takes as long as reading the weights from memory.
 *
 * Each weight row is read once, front to back, and multiplied into every row of x while it is
 * in cache; rows are split between threads in two contiguous halves (OpenMP, the same runtime
 * torch uses, so torch.set_num_threads applies). Products are summed in float32.
 *
 * Two versions of the inner loop, chosen when this file is compiled for the machine at hand:
 *   - CPUs with AVX512-BF16: x is rounded to bfloat16 once per call (as oneDNN and autocast do)
 *     and VDPBF16PS multiplies 32 weight/input pairs and adds them into 16 float32 sums.
 *   - any other CPU: plain C that widens each bfloat16 weight to float32 (the top 16 bits of a
 *     float32), x stays float32; the compiler vectorises it.
 *
 * Built on first use by scratchlm/kernels/__init__.py (gcc -O3 -march=native -fopenmp) and called
 * through ctypes; nothing here knows about torch.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 8 /* rows of x per call; more rows is a matmul, which oneDNN does well */

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define HAVE_DPBF16 1
#else
#define HAVE_DPBF16 0
#endif

int scratchlm_gemv_max_rows(void) { return MAX_ROWS; }
int scratchlm_gemv_uses_dpbf16(void) { return HAVE_DPBF16; }

#if HAVE_DPBF16

/* One weight row against m rows of x (bfloat16, each padded with zeros to n_chunks * 32). */
static inline __attribute__((always_inline)) void dot_rows(
    const uint16_t *w_row, const __m512bh *xb, int64_t k, int64_t n_chunks, float *out, int64_t out_stride,
    float bias, const int m)
{
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < m; r++) acc[r] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c < k / 32; c++) {
        __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(w_row + c * 32));
        for (int r = 0; r < m; r++) acc[r] = _mm512_dpbf16_ps(acc[r], wv, xb[r * n_chunks + c]);
    }
    if (c < n_chunks) { /* the last k % 32 weights; the masked lanes read as zero */
        __mmask32 mask = (__mmask32)((1ULL << (k % 32)) - 1);
        __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, (const void *)(w_row + c * 32));
        for (int r = 0; r < m; r++) acc[r] = _mm512_dpbf16_ps(acc[r], wv, xb[r * n_chunks + c]);
    }
    for (int r = 0; r < m; r++) out[r * out_stride] = _mm512_reduce_add_ps(acc[r]) + bias;
}

#define ROWS_CASE(M) \
    case M: \
        _Pragma("omp parallel for schedule(static) if (parallel)") \
        for (int64_t o = 0; o < n_out; o++) \
            dot_rows(w + o * k, xb, k, n_chunks, y + o, n_out, bias ? bias[o] : 0.0f, M); \
        break;

#else

static inline __attribute__((always_inline)) float bf16_to_float(uint16_t v)
{
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define LANES 16

static inline __attribute__((always_inline)) void dot_rows(
    const uint16_t *w_row, const float *x, int64_t k, float *out, int64_t out_stride, float bias, const int m)
{
    float acc[MAX_ROWS][LANES];
    for (int r = 0; r < m; r++)
        for (int l = 0; l < LANES; l++) acc[r][l] = 0.0f;
    int64_t i = 0;
    for (; i + LANES <= k; i += LANES)
        for (int r = 0; r < m; r++)
            for (int l = 0; l < LANES; l++) acc[r][l] += bf16_to_float(w_row[i + l]) * x[r * k + i + l];
    for (int r = 0; r < m; r++) {
        float sum = bias;
        for (int l = 0; l < LANES; l++) sum += acc[r][l];
        for (int64_t j = i; j < k; j++) sum += bf16_to_float(w_row[j]) * x[r * k + j];
        out[r * out_stride] = sum;
    }
}

#define ROWS_CASE(M) \
    case M: \
        _Pragma("omp parallel for schedule(static) if (parallel)") \
        for (int64_t o = 0; o < n_out; o++) \
            dot_rows(w + o * k, x, k, y + o, n_out, bias ? bias[o] : 0.0f, M); \
        break;

#endif

/* w: (n_out, k) bfloat16 bits; x: (m, k) float32; bias: (n_out,) float32 or NULL; y: (m, n_out)
 * float32. All contiguous. Returns 0, or -1 for an m outside 1..MAX_ROWS or a failed allocation. */
int scratchlm_gemv_bf16(const uint16_t *w, const float *x, const float *bias, float *y,
                        int64_t m, int64_t n_out, int64_t k, int parallel)
{
    if (m < 1 || m > MAX_ROWS) return -1;
#if HAVE_DPBF16
    int64_t n_chunks = (k + 31) / 32;
    __m512bh *xb = aligned_alloc(64, (size_t)(m * n_chunks) * sizeof(__m512bh));
    if (!xb) return -1;
    for (int64_t r = 0; r < m; r++) {
        for (int64_t c = 0; c < n_chunks; c++) {
            float lo[16], hi[16];
            for (int l = 0; l < 16; l++) {
                int64_t i = c * 32 + l;
                lo[l] = i < k ? x[r * k + i] : 0.0f;
                hi[l] = i + 16 < k ? x[r * k + i + 16] : 0.0f;
            }
            /* round to nearest even, as torch's .to(torch.bfloat16) */
            xb[r * n_chunks + c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo));
        }
    }
#endif
    switch (m) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4)
        ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
    }
#if HAVE_DPBF16
    free(xb);
#endif
    return 0;
}
