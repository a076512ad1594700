/* e^x's reduction and polynomial (Cephes' expf, float32, within about 2 ulp), shared by the scalar
 * exponential of the decoding kernels (attention.h: exp_vec) and the vector one of the training
 * kernels (vec.h: exp_neg). Written as expressions, so that r may be a float or a vector of them:
 * e^x = 2^n e^r, with n = x log2(e) rounded and r = x - n ln2 (ln2 in two parts, so r is exact). */
#ifndef SCRATCHLM_EXP_POLY_H
#define SCRATCHLM_EXP_POLY_H

#define EXP_LOG2E 1.44269504088896341f
#define EXP_REDUCE(x, n) ((x) - (n) * 0.693359375f + (n) * 2.12194440e-4f)
#define EXP_POLY(r)                                                                                  \
    ((((((1.9875691500e-4f * (r) + 1.3981999507e-3f) * (r) + 8.3334519073e-3f) * (r) + 4.1665795894e-2f) \
       * (r) + 1.6666665459e-1f) * (r) + 5.0000001201e-1f) * (r) * (r) + (r) + 1.0f)

#endif
