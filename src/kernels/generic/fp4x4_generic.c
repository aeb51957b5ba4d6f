/*
 * fp4x4_generic.c - portable FP4 x FP4 microkernel (panels and order: engine/fp4x4.h).
 * A holds signed 2a (a_bias 0). Integer block sums are exact, so the bits equal the SIMD
 * kernels'; the float epilogue is written exactly as the order says (fmaf per block).
 * Written for auto-vectorization with baseline SSE2: each k step's B is transposed to int16
 * [k][j] rows, and one step's 32 products per element are summed in int16 (|sum| <= 32 * 144
 * < 2^15, exact) before widening into the int32 block sums.
 */
#include "../../engine/fp4x4.h"

#include <math.h>
#include <string.h>

void dg_f4_ukr_generic(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                       const float *sb, const int32_t *bsum, float *acc) {
    (void)bsum;
    int32_t dot[DG_F4_MR][DG_F4_NR];
    int16_t bk[DG_F4_KS][DG_F4_NR], part[DG_F4_NR];
    for (int64_t s0 = 0, kb = 0; s0 < steps; s0 += spb, ++kb) {
        const int64_t s1 = s0 + spb < steps ? s0 + spb : steps;
        memset(dot, 0, sizeof dot);
        for (int64_t s = s0; s < s1; ++s) {
            const int8_t *bs = b + s * DG_F4_KS * DG_F4_NR;
            for (int g = 0; g < DG_F4_KS / 4; ++g)
                for (int j = 0; j < DG_F4_NR; ++j)
                    for (int q = 0; q < 4; ++q)
                        bk[4 * g + q][j] = bs[(g * DG_F4_NR + j) * 4 + q];
            for (int r = 0; r < rows; ++r) {
                const int8_t *ar = a + s * DG_F4_MR * DG_F4_KS + r * DG_F4_KS;
                memset(part, 0, sizeof part);
                for (int k = 0; k < DG_F4_KS; ++k) {
                    const int16_t av = ar[k];
                    for (int j = 0; j < DG_F4_NR; ++j)
                        part[j] = (int16_t)(part[j] + av * bk[k][j]);
                }
                for (int j = 0; j < DG_F4_NR; ++j)
                    dot[r][j] += part[j];
            }
        }
        const float *sak = sa4 + kb * DG_F4_MR, *sbk = sb + kb * DG_F4_NR;
        for (int r = 0; r < rows; ++r)
            for (int j = 0; j < DG_F4_NR; ++j)
                acc[r * DG_F4_NR + j] = fmaf((float)dot[r][j], sak[r] * sbk[j], acc[r * DG_F4_NR + j]);
    }
}
