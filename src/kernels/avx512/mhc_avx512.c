/*
 * mhc_avx512.c - AVX-512 row kernels of the fast dg_mega_mhc (mhc_kernels.h): the AVX2 file's
 * post and scale loops on 16 lanes (the collapse keeps the AVX2 kernel: its square sums live in
 * the reference's 8 lanes). Products and sums are separate roundings as in the reference;
 * CMakeLists.txt compiles this file with -ffp-contract=off so that no product and sum fuse.
 */
#include "../mhc_kernels.h"

#include "../../engine/engine.h"

#include <immintrin.h>

/* 16 BF16 -> 16 floats (exact: the bits shifted up). */
static inline __m512 load_bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* 16 floats -> 16 BF16, the bits of dg_engine_f32_bf16: round to nearest even on the bits; a
 * NaN keeps its sign and upper payload and is made quiet. */
static inline void store_bf16x16(uint16_t *dst, __m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(r));
}

/* Sixteen columns of every output row; the hc residual rows and x widened once for all. */
static inline void post_cols(int hc, int64_t H, int64_t h, const uint16_t *x, const uint16_t *res,
                             const __m512 *pv, const float *comb, uint16_t *out) {
    __m512 r[DG_MEGA_MHC_MAX_HC_MULT];
    for (int i = 0; i < hc; ++i)
        r[i] = load_bf16x16(res + i * H + h);
    const __m512 xv = load_bf16x16(x + h);
    for (int j = 0; j < hc; ++j) {
        __m512 e = _mm512_mul_ps(_mm512_set1_ps(comb[j]), r[0]);
        for (int i = 1; i < hc; ++i)
            e = _mm512_add_ps(e, _mm512_mul_ps(_mm512_set1_ps(comb[i * hc + j]), r[i]));
        store_bf16x16(out + j * H + h, _mm512_add_ps(_mm512_mul_ps(xv, pv[j]), e));
    }
}

void dg_mhc_post_avx512(int hc, int64_t H, const uint16_t *x, const uint16_t *res, const float *post,
                        const float *comb, uint16_t *out) {
    const int64_t body = H / 16 * 16;
    __m512 pv[DG_MEGA_MHC_MAX_HC_MULT];
    for (int j = 0; j < hc; ++j)
        pv[j] = _mm512_set1_ps(post[j]);
    if (hc == 4) /* DeepSeek's hc_mult: the loops unrolled at a constant count */
        for (int64_t h = 0; h < body; h += 16)
            post_cols(4, H, h, x, res, pv, comb, out);
    else
        for (int64_t h = 0; h < body; h += 16)
            post_cols(hc, H, h, x, res, pv, comb, out);
    dg_mhc_post_tail(hc, H, body, x, res, post, comb, out);
}

void dg_mhc_scale_avx512(int64_t H, const float *s, float r, const float *ws, uint16_t *y) {
    const int64_t body = H / 16 * 16;
    const __m512 rv = _mm512_set1_ps(r);
    for (int64_t h = 0; h < body; h += 16)
        store_bf16x16(y + h, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(s + h), rv), _mm512_loadu_ps(ws + h)));
    for (int64_t h = body; h < H; ++h)
        y[h] = dg_engine_f32_bf16((s[h] * r) * ws[h]);
}
