/*
 * e4m3_bf16_avx512.h - E4M3 codes to BF16 bits in 16-bit lanes, shared by the AVX-512 row
 * widening (widen_avx512.c) and the AVX-512 BF16 decode kernels. Include only from translation
 * units compiled for AVX-512 (BW).
 */
#ifndef DG_KERNELS_E4M3_BF16_AVX512_H
#define DG_KERNELS_E4M3_BF16_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* 32 E4M3 codes (as 16-bit lanes) to BF16 bits, exactly (NaN codes to a quiet NaN). */
static inline __m512i dg_e4m3_bf16_avx512(__m512i w) {
    /* subnormals m * 2^-9, m = 0..7, as BF16 */
    static const uint16_t kSub[32] = {0x0000, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60};
    const __m512i sub_lut = _mm512_loadu_si512(kSub);
    const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8);
    const __m512i e = _mm512_and_si512(_mm512_srli_epi16(w, 3), _mm512_set1_epi16(15));
    const __m512i m = _mm512_and_si512(w, _mm512_set1_epi16(7));
    const __m512i normal = _mm512_or_si512(_mm512_slli_epi16(_mm512_add_epi16(e, _mm512_set1_epi16(120)), 7),
                                           _mm512_slli_epi16(m, 4));
    const __mmask32 is_sub = _mm512_cmpeq_epi16_mask(e, _mm512_setzero_si512());
    const __mmask32 is_nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, _mm512_set1_epi16(0x7f)), _mm512_set1_epi16(0x7f));
    __m512i v = _mm512_mask_mov_epi16(normal, is_sub, _mm512_permutexvar_epi16(m, sub_lut));
    v = _mm512_mask_mov_epi16(v, is_nan, _mm512_set1_epi16(0x7fc0));
    return _mm512_or_si512(v, sign);
}

#endif /* DG_KERNELS_E4M3_BF16_AVX512_H */
