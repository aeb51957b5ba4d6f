/*
 * e4m3_bf16_avx512.h - E4M3 codes to BF16 bits in 16-bit lanes, shared by the AVX-512 row
 * widening (widen_avx512.c), the AVX-512 BF16 decode kernels and the AMX widening without VBMI. Include only from translation
 * units compiled for AVX-512 (BW).
 */
#ifndef DG_KERNELS_E4M3_BF16_AVX512_H
#define DG_KERNELS_E4M3_BF16_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* BF16 bits of E4M3 magnitudes 0 .. 127 (code & 0x7f; 127 is NaN: a quiet NaN). */
static const uint16_t dg_kE4m3Bf16Mag[128] __attribute__((aligned(64))) = {
    0x0000, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60,
    0x3c80, 0x3c90, 0x3ca0, 0x3cb0, 0x3cc0, 0x3cd0, 0x3ce0, 0x3cf0,
    0x3d00, 0x3d10, 0x3d20, 0x3d30, 0x3d40, 0x3d50, 0x3d60, 0x3d70,
    0x3d80, 0x3d90, 0x3da0, 0x3db0, 0x3dc0, 0x3dd0, 0x3de0, 0x3df0,
    0x3e00, 0x3e10, 0x3e20, 0x3e30, 0x3e40, 0x3e50, 0x3e60, 0x3e70,
    0x3e80, 0x3e90, 0x3ea0, 0x3eb0, 0x3ec0, 0x3ed0, 0x3ee0, 0x3ef0,
    0x3f00, 0x3f10, 0x3f20, 0x3f30, 0x3f40, 0x3f50, 0x3f60, 0x3f70,
    0x3f80, 0x3f90, 0x3fa0, 0x3fb0, 0x3fc0, 0x3fd0, 0x3fe0, 0x3ff0,
    0x4000, 0x4010, 0x4020, 0x4030, 0x4040, 0x4050, 0x4060, 0x4070,
    0x4080, 0x4090, 0x40a0, 0x40b0, 0x40c0, 0x40d0, 0x40e0, 0x40f0,
    0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
    0x4180, 0x4190, 0x41a0, 0x41b0, 0x41c0, 0x41d0, 0x41e0, 0x41f0,
    0x4200, 0x4210, 0x4220, 0x4230, 0x4240, 0x4250, 0x4260, 0x4270,
    0x4280, 0x4290, 0x42a0, 0x42b0, 0x42c0, 0x42d0, 0x42e0, 0x42f0,
    0x4300, 0x4310, 0x4320, 0x4330, 0x4340, 0x4350, 0x4360, 0x4370,
    0x4380, 0x4390, 0x43a0, 0x43b0, 0x43c0, 0x43d0, 0x43e0, 0x7fc0,
};

/* 32 E4M3 codes (as 16-bit lanes, upper bytes zero) to BF16 bits, exactly (NaN codes to a quiet NaN
 * with the code's sign): two 64-entry word tables (VPERMT2W looks at index bits 0-5; bit 6 picks
 * the table), then the sign. Half the operations of decoding exponent and mantissa fields
 * (measured on Zen 5: the widening had cost more than the VDPBF16PS work at M = 20). */
static inline __m512i dg_e4m3_bf16_avx512(__m512i w) {
    const __m512i lo = _mm512_permutex2var_epi16(_mm512_loadu_si512(dg_kE4m3Bf16Mag), w,
                                                 _mm512_loadu_si512(dg_kE4m3Bf16Mag + 32));
    const __m512i hi = _mm512_permutex2var_epi16(_mm512_loadu_si512(dg_kE4m3Bf16Mag + 64), w,
                                                 _mm512_loadu_si512(dg_kE4m3Bf16Mag + 96));
    const __m512i v = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), lo, hi);
    /* v | (w << 8 & 0x8000): the sign bit */
    return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(w, 8), _mm512_set1_epi16((short)0x8000), 0xf8);
}

#endif /* DG_KERNELS_E4M3_BF16_AVX512_H */
