/* moe_act_avx2.c - the Mega MoE's SwiGLU and SiTU rows on 8 lanes (see moe_act_kernels.h); the
 * tails run the reference's element functions. */
#include "../moe_act_kernels.h"
#include "../../reference/ref_mega_moe.h"
#include "float_math_avx2.h"

void dg_swiglu_row_avx2(const float *h, int64_t inter, float clamp, float weight, float *a) {
    const int has_clamp = !isinf(clamp);
    const __m256 hi = _mm256_set1_ps(clamp), lo = _mm256_set1_ps(-clamp), w = _mm256_set1_ps(weight);
    int64_t i = 0;
    for (; i + 8 <= inter; i += 8) {
        __m256 g = _mm256_loadu_ps(h + i), u = _mm256_loadu_ps(h + inter + i);
        if (has_clamp) {
            g = _mm256_min_ps(g, hi);
            u = _mm256_min_ps(_mm256_max_ps(u, lo), hi);
        }
        const __m256 neg = _mm256_xor_ps(g, _mm256_set1_ps(-0.0f));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), dg_exp8(neg)));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_mul_ps(silu, u), w));
    }
    for (; i < inter; ++i)
        a[i] = dg_ref_swiglu_elem(h[i], h[inter + i], clamp, weight);
}

void dg_situ_row_avx2(const float *h, int64_t inter, float beta, float linear_beta, float weight, float *a) {
    const __m256 b = _mm256_set1_ps(beta), lb = _mm256_set1_ps(linear_beta), w = _mm256_set1_ps(weight);
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= inter; i += 8) {
        const __m256 g = _mm256_loadu_ps(h + i), u = _mm256_loadu_ps(h + inter + i);
        const __m256 neg = _mm256_xor_ps(g, _mm256_set1_ps(-0.0f));
        const __m256 sigmoid = _mm256_div_ps(one, _mm256_add_ps(one, dg_exp8(neg)));
        const __m256 gt = _mm256_mul_ps(sigmoid, _mm256_mul_ps(b, dg_tanh8(_mm256_div_ps(g, b))));
        const __m256 ut = _mm256_mul_ps(lb, dg_tanh8(_mm256_div_ps(u, lb)));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_mul_ps(gt, ut), w));
    }
    for (; i < inter; ++i)
        a[i] = dg_ref_situ_elem(h[i], h[inter + i], beta, linear_beta, weight);
}
