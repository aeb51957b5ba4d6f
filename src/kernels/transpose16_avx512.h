/*
 * transpose16_avx512.h - the 16 x 16 transpose of 32-bit words that the AVX-512 and AMX packing
 * kernels share (rows become lanes: panels, VNNI tiles): out[c] word r = in[r] word c.
 * Include only from translation units compiled for AVX-512.
 */
#ifndef DG_KERNELS_TRANSPOSE16_AVX512_H
#define DG_KERNELS_TRANSPOSE16_AVX512_H

#include <immintrin.h>
#include <stdint.h>

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

/* The 16 x 16 transpose of 16-bit units held two rows per register (the VNNI k pairs of byte
 * codes, before widening: half the bytes of transposing the widened words): in[i] holds rows 2i
 * (bytes 0-31) and 2i + 1 (bytes 32-63), 16 units each; out[j] holds unit 2j of rows 0-15
 * (bytes 0-31), then unit 2j + 1 of rows 0-15. Three rounds of two-source permutes, each
 * exchanging one row bit of the register index with a unit bit of the position (24 one-uop
 * VPERMT2D/Q/B against the 64 shuffles of dg_transpose16_epi32 on the widened words). Needs AVX512-VBMI
 * (every CPU with AMX has it). */
__attribute__((target("avx512vbmi"))) static inline void dg_transpose16_epi16_pairs(const __m512i in[8],
                                                                                   __m512i out[8]) {
    /* round 1, dwords: registers 2i, 2i + 1 -> unit bit 1 into the register index */
    const __m512i d0 = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i d1 = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    /* round 2, qwords: registers i, i + 2 -> unit bit 2 */
    const __m512i q0 = _mm512_setr_epi64(0, 8, 2, 10, 4, 12, 6, 14);
    const __m512i q1 = _mm512_setr_epi64(1, 9, 3, 11, 5, 13, 7, 15);
    /* round 3, bytes: registers i, i + 4 -> unit bit 3, and the units reordered to (bit 0, row) */
    static const uint8_t b0[64] __attribute__((aligned(64))) = {
        0,  1,  32, 33, 4,  5,  36, 37, 8,  9,  40, 41, 12, 13, 44, 45, 64, 65, 96, 97, 68, 69,
        100, 101, 72, 73, 104, 105, 76, 77, 108, 109, 2, 3, 34, 35, 6, 7, 38, 39, 10, 11, 42, 43,
        14, 15, 46, 47, 66, 67, 98, 99, 70, 71, 102, 103, 74, 75, 106, 107, 78, 79, 110, 111};
    static const uint8_t b1[64] __attribute__((aligned(64))) = {
        16, 17, 48, 49, 20, 21, 52, 53, 24, 25, 56, 57, 28, 29, 60, 61, 80, 81, 112, 113, 84, 85,
        116, 117, 88, 89, 120, 121, 92, 93, 124, 125, 18, 19, 50, 51, 22, 23, 54, 55, 26, 27, 58, 59,
        30, 31, 62, 63, 82, 83, 114, 115, 86, 87, 118, 119, 90, 91, 122, 123, 94, 95, 126, 127};
    __m512i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_permutex2var_epi32(in[i], d0, in[i + 1]);
        t[i + 1] = _mm512_permutex2var_epi32(in[i], d1, in[i + 1]);
    }
    for (int m = 0; m < 4; ++m) {
        const int i = m + (m & 2); /* 0, 1, 4, 5 */
        u[i] = _mm512_permutex2var_epi64(t[i], q0, t[i + 2]);
        u[i + 2] = _mm512_permutex2var_epi64(t[i], q1, t[i + 2]);
    }
    const __m512i x0 = _mm512_load_si512(b0), x1 = _mm512_load_si512(b1);
    for (int i = 0; i < 4; ++i) {
        out[i] = _mm512_permutex2var_epi8(u[i], x0, u[i + 4]);
        out[i + 4] = _mm512_permutex2var_epi8(u[i], x1, u[i + 4]);
    }
}

#endif /* DG_KERNELS_TRANSPOSE16_AVX512_H */
