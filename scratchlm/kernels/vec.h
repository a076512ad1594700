/* Vectors of floats for the training kernels (train_attention.c, train_gelu.c), written with
 * GCC/Clang vector types (GCC 4.7 on, any Clang) as wide as the CPU's own registers: 16 floats
 * with AVX-512, 8 with AVX, 4 otherwise (SSE, NEON, or plain C). Wider types than the registers
 * are legal but were compiled to slow code: 16-float vectors on an AVX2 build ran 3-6x slower
 * than PyTorch's operations, where the native width runs faster. Plain loops over floats leave
 * the choice to the auto-vectoriser, which left the exponential below as scalar code (the
 * attention kernel took twice as long). */
#ifndef SCRATCHLM_VEC_H
#define SCRATCHLM_VEC_H

#include <stdint.h>
#include <string.h>

#include "exp_poly.h"

#if defined(__AVX512F__)
#define VEC 16
#elif defined(__AVX__)
#define VEC 8
#else
#define VEC 4
#endif

typedef float vf __attribute__((vector_size(VEC * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VEC * sizeof(int32_t))));

static inline vf load(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf splat(float x)  /* not (vf){0} + x, which turns -0.0 into +0.0 */
{
    vf v;
    for (int k = 0; k < VEC; k++) v[k] = x;
    return v;
}

/* e^x for x <= 0 (or -infinity), VEC at a time: e^x = 2^n e^r with |r| <= ln2/2, e^r by Cephes'
 * degree-6 polynomial for float32 (within about 2 ulp of expf). Below -87 (e^-87 is about 1.6e-38,
 * where float32 turns subnormal) the result is 0. */
static inline vf exp_neg(vf x_in)
{
    const vi below = x_in < -87.0f;
    const vf x = (vf)(((vi)x_in & ~below) | ((vi)splat(-87.0f) & below));
    const vf y = x * EXP_LOG2E - 0.5f;
    vi n_int;
    vf n;
    for (int k = 0; k < VEC; k++) {  /* lane by lane (compiled to one conversion each way) */
        n_int[k] = (int32_t)y[k];  /* truncation; with y <= -0.5 it rounds x log2(e) to nearest */
        n[k] = (float)n_int[k];
    }
    const vf r = EXP_REDUCE(x, n);
    const vf p = EXP_POLY(r);
    const vf two_n = (vf)((n_int + 127) << 23);
    return (vf)((vi)(p * two_n) & ~below);
}

static inline float sum_lanes(vf v)
{
    float s = 0.0f;
    for (int k = 0; k < VEC; k++) s += v[k];
    return s;
}

#endif
