/*
 * float_math_avx512.h - core/float_math.h's exp, softplus, sigmoid and tanh on 16 lanes, op for op
 * (MINPS / MAXPS are its dg_fm_min / dg_fm_max), so each lane gives the scalar functions' bits.
 * Include only from AVX-512 translation units compiled with -ffp-contract=off.
 */
#ifndef DG_KERNELS_AVX512_FLOAT_MATH_AVX512_H
#define DG_KERNELS_AVX512_FLOAT_MATH_AVX512_H

#include "../../core/float_math.h"

#include <immintrin.h>

static inline __m512 dg_horner16(__m512 x, const float *c, int n) {
    __m512 q = _mm512_set1_ps(c[0]);
    for (int i = 1; i < n; ++i)
        q = _mm512_fmadd_ps(q, x, _mm512_set1_ps(c[i]));
    return q;
}

static inline __m512 dg_exp16(__m512 x) {
    const __m512 round = _mm512_set1_ps(DG_FM_ROUND);
    const __m512 xc = _mm512_min_ps(_mm512_set1_ps(DG_FM_EXP_HI), _mm512_max_ps(_mm512_set1_ps(DG_FM_EXP_LO), x));
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(DG_FM_LOG2E), round), round);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-DG_FM_LN2_HI), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-DG_FM_LN2_LO), r);
    const __m512 q = dg_horner16(r, dg_fm_exp_poly, DG_FM_LEN(dg_fm_exp_poly));
    const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(q, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __mmask16 num = _mm512_cmp_ps_mask(x, x, _CMP_ORD_Q);
    const __m512i ni = _mm512_maskz_cvttps_epi32(num, n), n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
    const __m512i bias = _mm512_set1_epi32(127);
    const __m512 p1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
    const __m512 p2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
    return _mm512_mask_blend_ps(num, x, _mm512_mul_ps(_mm512_mul_ps(e, p1), p2));
}

static inline __m512 dg_neg_abs16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)));
}

static inline __m512 dg_softplus16(__m512 v) {
    const __m512 u = dg_exp16(dg_neg_abs16(v)), two = _mm512_set1_ps(2.0f);
    const __m512 d = _mm512_add_ps(two, u), err = _mm512_add_ps(_mm512_sub_ps(two, d), u), s0 = _mm512_div_ps(u, d);
    const __m512 s = _mm512_fnmadd_ps(s0, _mm512_div_ps(err, d), s0), w = _mm512_mul_ps(s, s);
    const __m512 p = dg_horner16(w, dg_fm_atanh_poly, DG_FM_LEN(dg_fm_atanh_poly));
    const __m512 l = _mm512_fmadd_ps(s, _mm512_mul_ps(w, p), s);
    return _mm512_add_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_add_ps(l, l));
}

static inline __m512 dg_sigmoid16(__m512 v) {
    const __m512 t = dg_exp16(dg_neg_abs16(v)), d = _mm512_add_ps(_mm512_set1_ps(1.0f), t);
    const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(neg, _mm512_div_ps(_mm512_set1_ps(1.0f), d), _mm512_div_ps(t, d));
}

static inline __m512 dg_tanh16(__m512 x) {
    const __m512i sign = _mm512_set1_epi32(INT32_MIN);
    const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x))), w = _mm512_mul_ps(a, a);
    const __m512 q = dg_horner16(w, dg_fm_tanh_poly, DG_FM_LEN(dg_fm_tanh_poly));
    const __m512 small = _mm512_fmadd_ps(a, _mm512_mul_ps(w, q), a), one = _mm512_set1_ps(1.0f);
    const __m512 big =
        _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(dg_exp16(_mm512_add_ps(a, a)), one)));
    const __mmask16 lo = _mm512_cmp_ps_mask(a, _mm512_set1_ps(DG_FM_TANH_SPLIT), _CMP_LT_OQ);
    const __m512i m = _mm512_castps_si512(_mm512_mask_blend_ps(lo, big, small));
    return _mm512_castsi512_ps(_mm512_or_si512(m, _mm512_and_si512(_mm512_castps_si512(x), sign)));
}

#endif /* DG_KERNELS_AVX512_FLOAT_MATH_AVX512_H */
