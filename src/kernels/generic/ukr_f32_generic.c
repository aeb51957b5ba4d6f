/*
 * ukr_f32_generic.c - the portable microkernel (twin of the SIMD ones, same contract and
 * same per-element operation order; see src/engine/engine.h).
 *   A panel: float a[k][MR], B panel: float b[k][NR] (DG_PACK_F32), kc even.
 *   Per k pair p: acc = fma(a[2p+1], b[2p+1], acc), then acc = fma(a[2p], b[2p], acc).
 * The body takes MR and NR as parameters so that a caller (or a JIT) passing constants gets
 * a fully unrolled register tile; this wrapper instantiates MR = 4, NR = 16.
 */
#include "../../engine/engine.h"

#include <math.h>

#define GEN_MR 4
#define GEN_NR 16

static inline void ukr_f32_body(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                                int mode, const float *sa, const float *sb, const int MR, const int NR) {
    float acc[GEN_MR][GEN_NR];
    for (int r = 0; r < MR; ++r)
        for (int j = 0; j < NR; ++j)
            acc[r][j] = mode == DG_UKR_ACC ? c[r * ldc + j] : 0.0f;
    for (int64_t p = 0; p < kc / 2; ++p) {
        const float *a1 = a + (2 * p + 1) * MR, *a0 = a + 2 * p * MR;
        const float *b1 = b + (2 * p + 1) * NR, *b0 = b + 2 * p * NR;
        for (int r = 0; r < MR; ++r)
            for (int j = 0; j < NR; ++j) {
                acc[r][j] = fmaf(a1[r], b1[j], acc[r][j]);
                acc[r][j] = fmaf(a0[r], b0[j], acc[r][j]);
            }
    }
    for (int r = 0; r < MR; ++r)
        for (int j = 0; j < NR; ++j) {
            float *cp = &c[r * ldc + j];
            *cp = mode == DG_UKR_SCALE ? fmaf(sa[r] * sb[j], acc[r][j], *cp) : acc[r][j];
        }
}

void dg_ukr_f32_generic(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                        const float *sa, const float *sb) {
    ukr_f32_body(kc, a, b, c, ldc, mode, sa, sb, GEN_MR, GEN_NR);
}
