/* One new position of causal self-attention against a KV cache, for every sequence and head: all
 * that CausalSelfAttention does between c_attn and c_proj in a decoding step. In torch that is
 * about twenty small operations (split, views, transposes, two cache writes, SDPA, transpose
 * back); each costs a few microseconds of overhead, together about as long as reading a layer's
 * weights. Here it is one call.
 *
 * qkv:      (B, 3C) float32, the new position's [q | k | v], each C = H * hs wide, heads side by side
 * k_cache:  (B, H, t_max, hs) float32, this layer's keys; the new key is written at position pos
 * v_cache:  (B, H, t_max, hs) float32, the same for values
 * out:      (B, C) float32, each head's softmax(q k^T / sqrt(hs)) v over positions 0..pos
 *
 * Plain C, float32 throughout, built together with gemv_bf16.c (see scratchlm/kernels/__init__.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

int scratchlm_attend_one(const float *qkv, float *k_cache, float *v_cache, float *out,
                         int64_t B, int64_t H, int64_t hs, int64_t t_max, int64_t pos, int parallel)
{
    if (pos < 0 || pos >= t_max) return -1;
    const int64_t C = H * hs, n_keys = pos + 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t row = ((b * H + h) * t_max + pos) * hs;
            memcpy(k_cache + row, qkv + b * 3 * C + C + h * hs, (size_t)hs * sizeof(float));
            memcpy(v_cache + row, qkv + b * 3 * C + 2 * C + h * hs, (size_t)hs * sizeof(float));
        }
    int failed = 0;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H;
        const float *q = qkv + b * 3 * C + h * hs;
        const float *keys = k_cache + bh * t_max * hs, *values = v_cache + bh * t_max * hs;
        float *o = out + b * C + h * hs;
        float *w = malloc((size_t)n_keys * sizeof(float));
        if (!w) {
            failed = 1;
            continue;
        }
        attend_position(q, keys, values, n_keys, hs, w, o);
        free(w);
    }
    return failed ? -1 : 0;
}
