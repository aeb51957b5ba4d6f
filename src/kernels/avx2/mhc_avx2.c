/*
 * mhc_avx2.c - AVX2 row kernels of the fast dg_mega_mhc (mhc_kernels.h): mhc_generic.c's
 * loops on 8 lanes, tails through the same scalar expressions. Products and sums are separate
 * roundings as in the reference; CMakeLists.txt compiles this file with -ffp-contract=off so the
 * compiler never fuses them into FMAs (which -mfma would otherwise allow).
 */
#include "../mhc_kernels.h"

#include "../../engine/engine.h"
#include "bf16_avx2.h"

#include <immintrin.h>

/* Eight columns of every output row: the hc residual rows and x are loaded and widened once
 * for all hc outputs (each output's products and sums in the reference's order). */
static inline void post_cols(int hc, int64_t H, int64_t h, const uint16_t *x, const uint16_t *res,
                             const __m256 *pv, const float *comb, uint16_t *out) {
    __m256 r[DG_MEGA_MHC_MAX_HC_MULT];
    for (int i = 0; i < hc; ++i)
        r[i] = dg_avx2_load_bf16x8(res + i * H + h);
    const __m256 xv = dg_avx2_load_bf16x8(x + h);
    for (int j = 0; j < hc; ++j) {
        __m256 e = _mm256_mul_ps(_mm256_set1_ps(comb[j]), r[0]);
        for (int i = 1; i < hc; ++i)
            e = _mm256_add_ps(e, _mm256_mul_ps(_mm256_set1_ps(comb[i * hc + j]), r[i]));
        dg_avx2_store_low_halves(out + j * H + h, dg_avx2_bf16_from_f32x8(_mm256_add_ps(_mm256_mul_ps(xv, pv[j]), e)));
    }
}

void dg_mhc_post_avx2(int hc, int64_t H, const uint16_t *x, const uint16_t *res, const float *post,
                      const float *comb, uint16_t *out) {
    const int64_t body = H / 8 * 8;
    __m256 pv[DG_MEGA_MHC_MAX_HC_MULT];
    for (int j = 0; j < hc; ++j)
        pv[j] = _mm256_set1_ps(post[j]);
    if (hc == 4) /* DeepSeek's hc_mult: the loops unrolled at a constant count */
        for (int64_t h = 0; h < body; h += 8)
            post_cols(4, H, h, x, res, pv, comb, out);
    else
        for (int64_t h = 0; h < body; h += 8)
            post_cols(hc, H, h, x, res, pv, comb, out);
    dg_mhc_post_tail(hc, H, body, x, res, post, comb, out);
}

void dg_mhc_collapse_avx2(int hc, int64_t H, const uint16_t *nr, const float *w, float *s,
                          float lane[DG_MHC_KERNEL_LANES]) {
    const int64_t body = H / 8 * 8;
    __m256 sq = _mm256_setzero_ps();
    for (int64_t h = 0; h < body; h += 8) {
        __m256 v = _mm256_mul_ps(dg_avx2_load_bf16x8(nr + h), _mm256_set1_ps(w[0]));
        for (int j = 1; j < hc; ++j)
            v = _mm256_add_ps(v, _mm256_mul_ps(dg_avx2_load_bf16x8(nr + j * H + h), _mm256_set1_ps(w[j])));
        /* rounded through BF16: the upper half kept, as dg_engine_f32_bf16 then widening */
        v = _mm256_castsi256_ps(_mm256_slli_epi32(dg_avx2_bf16_from_f32x8(v), 16));
        _mm256_storeu_ps(s + h, v);
        sq = _mm256_add_ps(sq, _mm256_mul_ps(v, v)); /* lane l takes h = l mod 8 */
    }
    _mm256_storeu_ps(lane, sq);
    for (int64_t h = body; h < H; ++h) {
        float v = dg_engine_bf16_f32(nr[h]) * w[0];
        for (int j = 1; j < hc; ++j)
            v += dg_engine_bf16_f32(nr[j * H + h]) * w[j];
        s[h] = dg_engine_bf16_f32(dg_engine_f32_bf16(v));
        lane[h - body] += s[h] * s[h];
    }
}

void dg_mhc_scale_avx2(int64_t H, const float *s, float r, const float *ws, uint16_t *y) {
    const int64_t body = H / 8 * 8;
    const __m256 rv = _mm256_set1_ps(r);
    for (int64_t h = 0; h < body; h += 8)
        dg_avx2_store_low_halves(
            y + h, dg_avx2_bf16_from_f32x8(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(s + h), rv), _mm256_loadu_ps(ws + h))));
    for (int64_t h = body; h < H; ++h)
        y[h] = dg_engine_f32_bf16((s[h] * r) * ws[h]);
}
