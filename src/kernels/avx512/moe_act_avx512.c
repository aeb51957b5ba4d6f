/* moe_act_avx512.c - the Mega MoE's SwiGLU and SiTU rows on 16 lanes (see moe_act_kernels.h). */
#include "../moe_act_kernels.h"
#include "float_math_avx512.h"

void dg_swiglu_row_avx512(const float *h, int64_t inter, float clamp, float weight, float *a) {
    const int has_clamp = !isinf(clamp);
    const __m512 hi = _mm512_set1_ps(clamp), lo = _mm512_set1_ps(-clamp), w = _mm512_set1_ps(weight);
    const __m512i sign = _mm512_set1_epi32(INT32_MIN);
    for (int64_t i = 0; i < inter; i += 16) {
        const __mmask16 m = inter - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (inter - i)) - 1);
        __m512 g = _mm512_maskz_loadu_ps(m, h + i), u = _mm512_maskz_loadu_ps(m, h + inter + i);
        if (has_clamp) {
            g = _mm512_min_ps(g, hi);
            u = _mm512_min_ps(_mm512_max_ps(u, lo), hi);
        }
        const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), sign));
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), dg_exp16(neg)));
        _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(_mm512_mul_ps(silu, u), w));
    }
}

void dg_situ_row_avx512(const float *h, int64_t inter, float beta, float linear_beta, float weight, float *a) {
    const __m512 b = _mm512_set1_ps(beta), lb = _mm512_set1_ps(linear_beta), w = _mm512_set1_ps(weight);
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32(INT32_MIN);
    for (int64_t i = 0; i < inter; i += 16) {
        const __mmask16 m = inter - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (inter - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(m, h + i), u = _mm512_maskz_loadu_ps(m, h + inter + i);
        const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), sign));
        const __m512 sigmoid = _mm512_div_ps(one, _mm512_add_ps(one, dg_exp16(neg)));
        const __m512 gt = _mm512_mul_ps(sigmoid, _mm512_mul_ps(b, dg_tanh16(_mm512_div_ps(g, b))));
        const __m512 ut = _mm512_mul_ps(lb, dg_tanh16(_mm512_div_ps(u, lb)));
        _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(_mm512_mul_ps(gt, ut), w));
    }
}
