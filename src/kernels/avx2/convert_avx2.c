/*
 * convert_avx2.c - AVX2 run kernels for dg_cast and the quantizers, 8 elements per step, the
 * tail through the scalar functions. Same signatures and bits as convert_generic.c (scalar.c's
 * functions) and the same arithmetic as convert_avx512.c, which documents it; only the lane
 * plumbing differs (no mask registers: compares and blends; no down-converting stores: byte
 * shuffles). tests/test_formats.c sweeps every float32 bit pattern through f32_to_e4m3 and
 * every E4M3 code through the widening kernels. Integer arithmetic throughout, except the E4M3
 * subnormal rounding, which uses an explicit round-to-nearest-even (independent of MXCSR).
 */
#include "../../formats/convert.h"
#include "bf16_avx2.h"

#include <immintrin.h>

#define F32_2POW_M6 0x3C800000 /* 2^-6: smallest E4M3 normal */
#define F32_448 0x43E00000     /* 448: larger magnitudes (and infinity) saturate */
#define F32_INF 0x7F800000     /* above it: NaN -> 0x7f */

/* 8 floats -> 8 E4M3 codes in the low bytes of 32-bit lanes (convert_avx512.c's recipe). The
 * magnitudes have the sign bit clear, so signed compares order them as unsigned ones. */
static inline __m256i e4m3_from_f32x8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));

    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(mag, 20), _mm256_set1_epi32(1));
    __m256i normal = _mm256_add_epi32(mag, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), odd));
    normal = _mm256_sub_epi32(_mm256_srli_epi32(normal, 20), _mm256_set1_epi32(120 << 3));

    const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(512.0f));
    const __m256i sub = _mm256_cvttps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));

    const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(F32_2POW_M6), mag);
    const __m256i is_sat = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(F32_448 - 1));
    const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(F32_INF));
    __m256i code = _mm256_blendv_epi8(normal, sub, is_sub);
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7e), is_sat);
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), is_nan);
    return _mm256_or_si256(code, sign);
}

/* The low bytes of the 8 lanes, in order, as 8 bytes. */
static inline void store_low_bytes(uint8_t *dst, __m256i v) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, /* lane 0 */
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, pick), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm_storel_epi64((__m128i *)dst, _mm256_castsi256_si128(b));
}

void dg_f32_to_e4m3_avx2(const float *src, uint8_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        store_low_bytes(dst + i, e4m3_from_f32x8(_mm256_loadu_ps(src + i)));
    for (; i < n; ++i)
        dst[i] = dg_float_to_e4m3(src[i]);
}

void dg_f32_to_bf16_avx2(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        dg_avx2_store_low_halves(dst + i, dg_avx2_bf16_from_f32x8(_mm256_loadu_ps(src + i)));
    for (; i < n; ++i)
        dst[i] = dg_float_to_bf16(src[i]);
}

/* 8 E4M3 codes (zero-extended) -> float32 bits (convert_avx512.c's recipe). */
static inline __m256i f32_from_e4m3x8(__m256i b) {
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
    const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f)));
    const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag);
    const __m256i is_nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f));
    __m256i r = _mm256_blendv_epi8(normal, sub, is_sub);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), is_nan);
    return _mm256_or_si256(r, sign);
}

static inline __m256i load_e4m3x8(const uint8_t *src) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)src));
}

void dg_e4m3_to_f32_avx2(const uint8_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_si256((__m256i *)(dst + i), f32_from_e4m3x8(load_e4m3x8(src + i)));
    for (; i < n; ++i)
        dst[i] = dg_e4m3_to_float(src[i]);
}

/* The float32 value of an E4M3 code is exact in BF16: its upper half (NaN 0x7fc0, as
 * dg_float_to_bf16 gives). */
void dg_e4m3_to_bf16_avx2(const uint8_t *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        dg_avx2_store_low_halves(dst + i, _mm256_srli_epi32(f32_from_e4m3x8(load_e4m3x8(src + i)), 16));
    for (; i < n; ++i)
        dst[i] = dg_float_to_bf16(dg_e4m3_to_float(src[i]));
}
