/*
 * widen_avx512.c - AVX-512 widening of contiguous FP8 (E4M3) and FP4 (E2M1, two per byte, low
 * nibble first) codes to BF16 bits, optionally times a power-of-two scale (exact: the value's
 * mantissa is unchanged; rounding only matters beyond BF16's exponent range, where it is RNE
 * like the portable path). Portable twin: dg_engine_fetch_bf16's scalar loops (pack.c).
 */
#include "../../engine/engine.h"
#include "../e4m3_bf16_avx512.h"

#include <immintrin.h>

/* bf16 bits * s, RNE back to bf16 bits; 32 lanes of 16 bits. */
static inline __m512i scale_bf16(__m512i h, __m512 s) {
    const __m512i rnd = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    __m512i out[2];
    for (int half = 0; half < 2; ++half) {
        const __m256i part = half ? _mm512_extracti64x4_epi64(h, 1) : _mm512_castsi512_si256(h);
        const __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(part), 16)), s);
        const __m512i u = _mm512_castps_si512(f);
        const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(rnd, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        /* NaN stays NaN (quiet) */
        const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
        out[half] = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan,
                                          _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(out[0])), _mm512_cvtepi32_epi16(out[1]), 1);
}

void dg_widen_e4m3_avx512(const uint8_t *src, int64_t n, float scale, uint16_t *out) {
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t i = 0; i < n; i += 32) {
        const int64_t c = n - i < 32 ? n - i : 32;
        const __mmask32 mask = (__mmask32)(c >= 32 ? 0xffffffffu : (1u << c) - 1);
        __m512i v = dg_e4m3_bf16_avx512(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask, src + i)));
        if (scale != 1.0f)
            v = scale_bf16(v, s);
        _mm512_mask_storeu_epi16(out + i, mask, v);
    }
}

/* n E2M1 values (nibble pairs along K, low nibble of src[0] first) -> BF16, value j times
 * scales[(first + j) / blk] (first, blk even): a row's scale blocks in one call (one call per
 * block and its scale lookup cost more than an FP4 block's widening: measured on Zen 5, 40% of
 * an M = 1 FP8 x FP4 GEMM). Per block the 16 values times the scale are rounded to BF16 once
 * (exact unless beyond BF16's range), then looked up. */
void dg_widen_e2m1_blocks_avx512(const uint8_t *src, int64_t n, int64_t first, int64_t blk, const float *scales,
                                 uint16_t *out) {
    static const float kE2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    const __m512 vals = _mm512_loadu_ps(kE2m1);
    for (int64_t q = 0, j0 = 0; j0 < n; ++q) {
        const int64_t end = (q + 1) * blk - first < n ? (q + 1) * blk - first : n;
        const __m512i f = _mm512_castps_si512(_mm512_mul_ps(vals, _mm512_set1_ps(scales[q])));
        const __m512i r = _mm512_add_epi32(
            f, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(f, 16), _mm512_set1_epi32(1))));
        const __m512i lut = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
        for (int64_t i = j0; i < end; i += 32) {
            const int64_t c = end - i < 32 ? end - i : 32;
            const __mmask16 bmask = (__mmask16)(c >= 32 ? 0xffffu : (1u << ((c + 1) / 2)) - 1);
            const __m512i d = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(bmask, src + i / 2));
            const __m512i codes = _mm512_or_si512(_mm512_and_si512(d, _mm512_set1_epi32(15)),
                                                  _mm512_slli_epi32(_mm512_srli_epi32(d, 4), 16));
            const __mmask32 omask = (__mmask32)(c >= 32 ? 0xffffffffu : (1u << c) - 1);
            _mm512_mask_storeu_epi16(out + i, omask, _mm512_permutexvar_epi16(codes, lut));
        }
        j0 = end;
    }
}

/* n E2M1 values starting at the low nibble of src[0], times one scale: a single block. */
void dg_widen_e2m1_avx512(const uint8_t *src, int64_t n, float scale, uint16_t *out) {
    dg_widen_e2m1_blocks_avx512(src, n, 0, n + (n & 1), &scale, out);
}
