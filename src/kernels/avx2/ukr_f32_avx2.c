/*
 * ukr_f32_avx2.c - AVX2 + FMA microkernel, MR = 6, NR = 16 (12 ymm accumulators), on
 * DG_PACK_F32 panels, and its 1-, 2- and 4-row instances for the small-M path. The body is
 * ukr_f32_avx2.h, which the runtime JIT compiles too (with kc constant: src/engine/jit_ukr.c).
 */
#include "../../engine/engine.h"

#include "ukr_f32_avx2.h"

void dg_ukr_f32_avx2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                     const float *sa, const float *sb) {
    dg_ukr_f32_avx2_body(kc, a, b, c, ldc, mode, sa, sb, DG_AVX2_UKR_MR, DG_AVX2_UKR_NV);
}

/* The small-M kernels (smallm.c): the same body for 1, 2 and 4 rows; the table's largest, 6
 * rows, is dg_ukr_f32_avx2 itself. */
void dg_ukr_f32_avx2_mr1(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb) {
    dg_ukr_f32_avx2_body(kc, a, b, c, ldc, mode, sa, sb, 1, DG_AVX2_UKR_NV);
}

void dg_ukr_f32_avx2_mr2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb) {
    dg_ukr_f32_avx2_body(kc, a, b, c, ldc, mode, sa, sb, 2, DG_AVX2_UKR_NV);
}

void dg_ukr_f32_avx2_mr4(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb) {
    dg_ukr_f32_avx2_body(kc, a, b, c, ldc, mode, sa, sb, 4, DG_AVX2_UKR_NV);
}
