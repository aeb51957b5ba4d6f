/*
 * bf16_avx2.h - BF16 <-> float32 on 8 AVX2 lanes, shared by the AVX2 kernels that convert rows
 * (convert_avx2.c, mhc_avx2.c). The same bits as dg_bf16_to_float / dg_float_to_bf16.
 */
#ifndef DG_KERNELS_AVX2_BF16_AVX2_H
#define DG_KERNELS_AVX2_BF16_AVX2_H

#include <immintrin.h>
#include <stdint.h>

/* 8 BF16 -> 8 floats (exact: the bits shifted up). */
static inline __m256 dg_avx2_load_bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 8 floats -> BF16 bits in the low halves of 32-bit lanes: round to nearest even on the bits;
 * NaN keeps its sign and upper payload and is made quiet. */
static inline __m256i dg_avx2_bf16_from_f32x8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));
    return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

/* The low halves of the 8 lanes (values below 2^16), in order, as 8 uint16. */
static inline void dg_avx2_store_low_halves(uint16_t *dst, __m256i v) {
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08); /* qwords 0, 2 */
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(packed));
}

#endif /* DG_KERNELS_AVX2_BF16_AVX2_H */
