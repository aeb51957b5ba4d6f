/*
 * convert_avx512.c - AVX-512 (F/BW/VL) run kernels for dg_cast, 16 elements per step, the
 * tail through masked loads and stores. Same signatures and bits as convert_generic.c (the
 * scalar functions of scalar.c); tests/test_formats.c checks every E4M3 code and every
 * float32 bit pattern of the ranges that matter. Integer arithmetic wherever possible, so the
 * results do not depend on MXCSR (only the E4M3 subnormal rounding uses an explicit
 * round-to-nearest-even conversion, as nearbyintf does in the default mode).
 */
#include "../../formats/convert.h"

#include <immintrin.h>

/* float32 bit patterns (magnitudes) that bound the E4M3 cases. */
#define F32_2POW_M6 0x3C800000u /* 2^-6: smallest E4M3 normal */
#define F32_448 0x43E00000u     /* 448: the largest finite; beyond it (and infinity) saturate */
#define F32_INF 0x7F800000u     /* above it: NaN, which becomes 0x7f with its sign */

/*
 * 16 floats -> 16 E4M3 codes in the low bytes of 32-bit lanes.
 * Normal range: keep exponent and 3 mantissa bits, rounding the 20 dropped bits to nearest
 * even with the usual add-then-truncate, and rebias the exponent from 127 to 7 (subtract 120
 * in the exponent field, i.e. 120 << 3 in the 11-bit exponent:mantissa value); a carry out of
 * the mantissa correctly bumps the exponent. Below 2^-6 the codes are round(|x| * 2^9), exact
 * in float32 before the rounding. As PyTorch 2.13 (and scalar.c): magnitudes >= 448 and
 * infinities saturate to 448 (0x7e), NaN gives 0x7f.
 */
static inline __m512i e4m3_from_f32x16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));

    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(mag, 20), _mm512_set1_epi32(1));
    __m512i normal = _mm512_add_epi32(mag, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff), odd));
    normal = _mm512_sub_epi32(_mm512_srli_epi32(normal, 20), _mm512_set1_epi32(120 << 3));

    const __m512 scaled = _mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(512.0f));
    const __m512i sub = _mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);

    const __mmask16 is_sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32((int)F32_2POW_M6));
    const __mmask16 is_sat = _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32((int)F32_448));
    const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32((int)F32_INF));
    __m512i code = _mm512_mask_blend_epi32(is_sub, normal, sub);
    code = _mm512_mask_mov_epi32(code, is_sat, _mm512_set1_epi32(0x7e));
    code = _mm512_mask_mov_epi32(code, is_nan, _mm512_set1_epi32(0x7f));
    return _mm512_or_si512(code, sign);
}

void dg_f32_to_e4m3_avx512(const float *src, uint8_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtepi32_epi8(e4m3_from_f32x16(_mm512_loadu_ps(src + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_cvtepi32_storeu_epi8(dst + i, m, e4m3_from_f32x16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

/* 16 floats -> 16 BF16 in 32-bit lanes: round to nearest even on the bits; NaN keeps its sign
 * and upper payload and is made quiet. */
static inline __m512i bf16_from_f32x16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_blend_epi32(is_nan, rounded, quiet);
}

void dg_f32_to_bf16_avx512(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(bf16_from_f32x16(_mm512_loadu_ps(src + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, bf16_from_f32x16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

/*
 * 16 E4M3 codes (zero-extended to 32 bits) -> float32 bits. Normal codes: the 7 magnitude bits
 * shifted to the float32 exponent:mantissa position plus the bias difference (120 << 23).
 * Exponent 0: mantissa * 2^-9 (exact). 0x7f: the quiet NaN 0x7fc00000. Sign ORed on top.
 */
static inline __m512i f32_from_e4m3x16(__m512i b) {
    const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
    const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
    const __m512i sub = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f)));
    const __mmask16 is_sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(8));
    const __mmask16 is_nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f));
    __m512i r = _mm512_mask_blend_epi32(is_sub, normal, sub);
    r = _mm512_mask_mov_epi32(r, is_nan, _mm512_set1_epi32(0x7fc00000));
    return _mm512_or_si512(r, sign);
}

static inline __m512i load_e4m3x16(const uint8_t *src, size_t left) {
    if (left >= 16)
        return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src));
    return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)((1u << left) - 1), src));
}

void dg_e4m3_to_f32_avx512(const uint8_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        const __m512i v = f32_from_e4m3x16(load_e4m3x16(src + i, n - i));
        if (n - i >= 16)
            _mm512_storeu_si512(dst + i, v);
        else
            _mm512_mask_storeu_epi32(dst + i, (__mmask16)((1u << (n - i)) - 1), v);
    }
}

/* The float32 value of an E4M3 code is exact in BF16, so BF16 is its upper half (and the NaN
 * 0x7fc00000 becomes 0x7fc0, as dg_float_to_bf16 gives). */
void dg_e4m3_to_bf16_avx512(const uint8_t *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        const __m512i v = _mm512_srli_epi32(f32_from_e4m3x16(load_e4m3x16(src + i, n - i)), 16);
        if (n - i >= 16)
            _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(v));
        else
            _mm512_mask_cvtepi32_storeu_epi16(dst + i, (__mmask16)((1u << (n - i)) - 1), v);
    }
}
