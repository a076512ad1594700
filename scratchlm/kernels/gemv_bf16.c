/* y = x W^T + b for a handful of rows x, with W in bfloat16 (or float32: scratchlm_gemv_f32),
 * stored (out, in) row-major as nn.Linear keeps it. This is the whole cost of a decoding step on a CPU: one token per sequence
 * meets every weight once, so the step takes as long as reading the weights from memory.
 *
 * Each weight row is read once, front to back, and multiplied into every row of x while it is
 * in cache (bf16_dot.h); when the caller asks (`parallel`: scratchlm.kernels does from
 * GEMV_PARALLEL_MIN multiply-adds per row of x), the rows are split between the threads in
 * contiguous blocks, one per thread, in thread order, sizes differing by at most one (OpenMP's
 * static schedule, in the runtime torch uses, so torch.set_num_threads applies). Products are
 * summed in float32.
 *
 * Built on first use by scratchlm/kernels/__init__.py (gcc -O3 -march=..., -fopenmp) and called
 * through ctypes; nothing here knows about torch. decode_step.c uses the same dot products for a
 * whole decoding step in one call.
 */
#include <stdint.h>
#include <stdlib.h>

#include "bf16_dot.h"

#ifdef _OPENMP
#include <omp.h>
#define THREAD_NUM() omp_get_thread_num()
#else
#define THREAD_NUM() 0
#endif

int scratchlm_gemv_max_rows(void) { return MAX_ROWS; }
int scratchlm_gemv_uses_dpbf16(void) { return HAVE_DPBF16; }
const char *scratchlm_kernel_path(void) { return KERNEL_PATH; } /* which loop bf16_dot.h compiled */
int scratchlm_kernel_rounds_input(void) { return ROUNDS_INPUT; } /* 1: bfloat16 products round x */

/* y = x W^T + b: w (n_out, k) bfloat16 bits, or float32 when `f32`; x: (m, k) float32; bias:
 * (n_out,) float32 or NULL; y: (m, n_out) float32. All contiguous. Returns 0, or -1 for an m
 * outside 1..MAX_ROWS or a failed allocation. */
static int gemv(const void *w, int f32, const float *x, const float *bias, float *y, int64_t m, int64_t n_out,
                int64_t k, int parallel, int32_t *owner)
{
    if (m < 1 || m > MAX_ROWS) return -1;
    input_t *xb = NULL;
    if (!f32) {
        xb = aligned_alloc(64, ((size_t)(m * input_len(k)) * sizeof(input_t) + 63) / 64 * 64);
        if (!xb) return -1;
        prepare_input(x, m, k, xb);
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t o = 0; o < n_out; o++) {
        product_column(w, f32, xb, x, k, o, bias, y, n_out, (int)m, 0);
        if (owner) owner[o] = THREAD_NUM(); /* which thread took the row: for the tests of the split */
    }
    free(xb);
    return 0;
}

int scratchlm_gemv_bf16(const uint16_t *w, const float *x, const float *bias, float *y,
                        int64_t m, int64_t n_out, int64_t k, int parallel)
{
    return gemv(w, 0, x, bias, y, m, n_out, k, parallel, NULL);
}

int scratchlm_gemv_f32(const float *w, const float *x, const float *bias, float *y,
                       int64_t m, int64_t n_out, int64_t k, int parallel)
{
    return gemv(w, 1, x, bias, y, m, n_out, k, parallel, NULL);
}

/* scratchlm_gemv_f32 that also writes, for each output row o, the OpenMP thread that computed it
 * into owner[o] (n_out int32): how the rows were shared out, for tests. */
int scratchlm_gemv_f32_owners(const float *w, const float *x, const float *bias, float *y,
                              int64_t m, int64_t n_out, int64_t k, int parallel, int32_t *owner)
{
    return gemv(w, 1, x, bias, y, m, n_out, k, parallel, owner);
}
