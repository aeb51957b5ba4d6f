/*
 * float_math_avx2.h - core/float_math.h's exp, softplus, sigmoid and tanh on 8 lanes, op for op
 * (MINPS / MAXPS are its dg_fm_min / dg_fm_max), so each lane gives the scalar functions' bits.
 * Include only from AVX2 translation units compiled with -ffp-contract=off.
 */
#ifndef DG_KERNELS_AVX2_FLOAT_MATH_AVX2_H
#define DG_KERNELS_AVX2_FLOAT_MATH_AVX2_H

#include "../../core/float_math.h"

#include <immintrin.h>

static inline __m256 dg_horner8(__m256 x, const float *c, int n) {
    __m256 q = _mm256_set1_ps(c[0]);
    for (int i = 1; i < n; ++i)
        q = _mm256_fmadd_ps(q, x, _mm256_set1_ps(c[i]));
    return q;
}

static inline __m256 dg_exp8(__m256 x) {
    const __m256 round = _mm256_set1_ps(DG_FM_ROUND);
    const __m256 xc = _mm256_min_ps(_mm256_set1_ps(DG_FM_EXP_HI), _mm256_max_ps(_mm256_set1_ps(DG_FM_EXP_LO), x));
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(DG_FM_LOG2E), round), round);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-DG_FM_LN2_HI), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-DG_FM_LN2_LO), r);
    const __m256 q = dg_horner8(r, dg_fm_exp_poly, DG_FM_LEN(dg_fm_exp_poly));
    const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256 num = _mm256_cmp_ps(x, x, _CMP_ORD_Q);
    const __m256i ni = _mm256_cvttps_epi32(_mm256_and_ps(n, num)); /* 0 in NaN lanes, as the scalar code */
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1), bias = _mm256_set1_epi32(127);
    const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_blendv_ps(x, _mm256_mul_ps(_mm256_mul_ps(e, p1), p2), num);
}

static inline __m256 dg_neg_abs8(__m256 v) { return _mm256_or_ps(v, _mm256_set1_ps(-0.0f)); }

static inline __m256 dg_softplus8(__m256 v) {
    const __m256 u = dg_exp8(dg_neg_abs8(v)), two = _mm256_set1_ps(2.0f);
    const __m256 d = _mm256_add_ps(two, u), err = _mm256_add_ps(_mm256_sub_ps(two, d), u), s0 = _mm256_div_ps(u, d);
    const __m256 s = _mm256_fnmadd_ps(s0, _mm256_div_ps(err, d), s0), w = _mm256_mul_ps(s, s);
    const __m256 p = dg_horner8(w, dg_fm_atanh_poly, DG_FM_LEN(dg_fm_atanh_poly));
    const __m256 l = _mm256_fmadd_ps(s, _mm256_mul_ps(w, p), s);
    return _mm256_add_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_add_ps(l, l));
}

static inline __m256 dg_sigmoid8(__m256 v) {
    const __m256 t = dg_exp8(dg_neg_abs8(v)), d = _mm256_add_ps(_mm256_set1_ps(1.0f), t);
    const __m256 neg = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), _mm256_div_ps(t, d), neg);
}

static inline __m256 dg_tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_andnot_ps(sign, x), w = _mm256_mul_ps(a, a);
    const __m256 q = dg_horner8(w, dg_fm_tanh_poly, DG_FM_LEN(dg_fm_tanh_poly));
    const __m256 small = _mm256_fmadd_ps(a, _mm256_mul_ps(w, q), a), one = _mm256_set1_ps(1.0f);
    const __m256 big =
        _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(dg_exp8(_mm256_add_ps(a, a)), one)));
    const __m256 lo = _mm256_cmp_ps(a, _mm256_set1_ps(DG_FM_TANH_SPLIT), _CMP_LT_OQ);
    return _mm256_or_ps(_mm256_blendv_ps(big, small, lo), _mm256_and_ps(x, sign));
}

#endif /* DG_KERNELS_AVX2_FLOAT_MATH_AVX2_H */
