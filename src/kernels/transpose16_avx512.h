/*
 * transpose16_avx512.h - the 16 x 16 transpose of 32-bit words that the AVX-512 and AMX packing
 * kernels share (rows become lanes: panels, VNNI tiles): out[c] word r = in[r] word c.
 * Include only from translation units compiled for AVX-512.
 */
#ifndef DG_KERNELS_TRANSPOSE16_AVX512_H
#define DG_KERNELS_TRANSPOSE16_AVX512_H

#include <immintrin.h>

static inline void dg_transpose16_epi32(const __m512i in[16], __m512i out[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    /* u[4i + c], 128-bit lane j: word 4j + c of rows 4i .. 4i + 3 */
    for (int i = 0; i < 4; ++i) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; ++c) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                      y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        out[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        out[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
        out[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        out[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
    }
}

#endif /* DG_KERNELS_TRANSPOSE16_AVX512_H */
