/*
 * fp4x4_vnni.c - FP4 x FP4 microkernel on VPDPBUSD (AVX-512 VNNI); panels and order:
 * engine/fp4x4.h. A arrives unsigned (2a + 12, a_bias 12) and is broadcast 4 bytes at a time;
 * B columns are the signed vector operand. Each block's int32 sums start from bsum =
 * -12 * sum(2b), which cancels the bias exactly. Rows in groups of 8 (then 4, 2, 1 for the
 * rest): up to 8 x 2 int32 accumulators; the float accumulators stay in acc (L1).
 */
#include "../../engine/fp4x4.h"

#include <immintrin.h>

/* Rows [r0, r0 + rg) of one block over k steps [s0, s1): int32 sums starting from the bias
 * correction, then acc = fmaf((float)dot, sa4 * sb, acc). rg is a constant at each call
 * (1, 2, 4 or 8) so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void rows_block(int rg, int64_t s0, int64_t s1, int r0, const int8_t *a,
                                                             const int8_t *b, __m512i c0, __m512i c1, const float *sa4,
                                                             __m512 sb0, __m512 sb1, float *acc) {
    __m512i dot[8][2];
    for (int r = 0; r < rg; ++r)
        dot[r][0] = c0, dot[r][1] = c1;
    for (int64_t s = s0; s < s1; ++s) {
        const int8_t *as = a + s * DG_F4_MR * DG_F4_KS + r0 * DG_F4_KS;
        const int8_t *bs = b + s * DG_F4_KS * DG_F4_NR;
        for (int g = 0; g < DG_F4_KS / 4; ++g) {
            const __m512i b0 = _mm512_load_si512(bs + g * 128), b1 = _mm512_load_si512(bs + g * 128 + 64);
            for (int r = 0; r < rg; ++r) {
                const __m512i ab = _mm512_set1_epi32(*(const int32_t *)(const void *)(as + r * DG_F4_KS + 4 * g));
                dot[r][0] = _mm512_dpbusd_epi32(dot[r][0], ab, b0);
                dot[r][1] = _mm512_dpbusd_epi32(dot[r][1], ab, b1);
            }
        }
    }
    for (int r = 0; r < rg; ++r) {
        const __m512 sa = _mm512_set1_ps(sa4[r0 + r]);
        float *ar = acc + (r0 + r) * DG_F4_NR;
        _mm512_storeu_ps(ar, _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][0]), _mm512_mul_ps(sa, sb0), _mm512_loadu_ps(ar)));
        _mm512_storeu_ps(ar + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][1]), _mm512_mul_ps(sa, sb1),
                                                  _mm512_loadu_ps(ar + 16)));
    }
}

void dg_f4_ukr_vnni(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                    const float *sb, const int32_t *bsum, float *acc) {
    for (int64_t s0 = 0, kb = 0; s0 < steps; s0 += spb, ++kb) {
        const int64_t s1 = s0 + spb < steps ? s0 + spb : steps;
        const __m512i c0 = _mm512_loadu_si512(bsum + kb * DG_F4_NR), c1 = _mm512_loadu_si512(bsum + kb * DG_F4_NR + 16);
        const __m512 sb0 = _mm512_loadu_ps(sb + kb * DG_F4_NR), sb1 = _mm512_loadu_ps(sb + kb * DG_F4_NR + 16);
        const float *sak = sa4 + kb * DG_F4_MR;
        int r0 = 0;
        for (; r0 + 8 <= rows; r0 += 8)
            rows_block(8, s0, s1, r0, a, b, c0, c1, sak, sb0, sb1, acc);
        if (rows - r0 >= 4)
            rows_block(4, s0, s1, r0, a, b, c0, c1, sak, sb0, sb1, acc), r0 += 4;
        if (rows - r0 >= 2)
            rows_block(2, s0, s1, r0, a, b, c0, c1, sak, sb0, sb1, acc), r0 += 2;
        if (rows - r0 >= 1)
            rows_block(1, s0, s1, r0, a, b, c0, c1, sak, sb0, sb1, acc);
    }
}
