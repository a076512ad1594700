/* One new position's attention against the keys and values before it, shared by attend_one.c
 * and decode_step.c, and the vectorisable e^x its softmax uses. Everything here is static.
 */
#ifndef SCRATCHLM_ATTENTION_H
#define SCRATCHLM_ATTENTION_H

#include <math.h>
#include <stdint.h>

#include "exp_poly.h"

/* e^x in float32 without a call or a branch, so that loops over it vectorise (libm's expf and
 * tanhf are scalar calls unless -ffast-math, which would loosen every other line here too).
 * Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts, so r is exact), e^r
 * from a polynomial, 2^n written into the exponent bits. Relative error below 1e-7 (8e-8 against
 * double exp over [-87, 88] in steps of 0.001); x is clamped to [-87, 88], so the result stays a
 * normal float (e^-200 gives 1.6e-38). */
static inline float exp_vec(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float n = (x * EXP_LOG2E + 12582912.0f) - 12582912.0f; /* + 1.5 * 2^23: rounds to an integer */
    const float r = EXP_REDUCE(x, n);
    const float p = EXP_POLY(r);
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* out (hs) = softmax(q . keys[t] / sqrt(hs) over t < n_keys) weighted sum of values[t]: one head
 * of one query. keys, values: (n_keys, hs) rows; scores: room for n_keys floats. */
static inline void attend_position(const float *q, const float *keys, const float *values, int64_t n_keys,
                                   int64_t hs, float *scores, float *out)
{
    const float scale = 1.0f / sqrtf((float)hs);
    float top = -INFINITY;
    for (int64_t t = 0; t < n_keys; t++) { /* scores */
        float s = 0.0f;
#pragma omp simd reduction(+ : s) /* the sum in vector lanes */
        for (int64_t d = 0; d < hs; d++) s += q[d] * keys[t * hs + d];
        scores[t] = s * scale;
        top = scores[t] > top ? scores[t] : top;
    }
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t t = 0; t < n_keys; t++) { /* softmax, shifted by the largest score */
        scores[t] = exp_vec(scores[t] - top);
        total += scores[t];
    }
    for (int64_t d = 0; d < hs; d++) out[d] = 0.0f;
    for (int64_t t = 0; t < n_keys; t++) { /* the weighted sum of values */
        const float p = scores[t] / total;
#pragma omp simd
        for (int64_t d = 0; d < hs; d++) out[d] += p * values[t * hs + d];
    }
}

#endif
