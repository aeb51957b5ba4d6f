/*
 * ukr_f32_avx2.c - AVX2 + FMA microkernel, MR = 6, NR = 16 (12 ymm accumulators), on
 * DG_PACK_F32 panels. Contract and per-element order as src/engine/engine.h states: per k
 * pair, fma with the odd k first, then the even k (mirrors one VDPBF16PS lane).
 */
#include "../../engine/engine.h"

#include <immintrin.h>

#define AVX2_MR 6
#define AVX2_NV 2 /* NR / 8 */

/* MR <= 6 and NV <= 2 rows/vectors; constants after inlining. */
static inline void ukr_body(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mode,
                            const float *sa, const float *sb, const int MR, const int NV) {
    const int NR = 8 * NV;
    __m256 acc[AVX2_MR][AVX2_NV];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v)
            acc[r][v] = mode == DG_UKR_ACC ? _mm256_loadu_ps(c + r * ldc + 8 * v) : _mm256_setzero_ps();
    for (int64_t p = 0; p < kc / 2; ++p) {
        _mm_prefetch((const char *)(a + (2 * p + 16) * MR), _MM_HINT_T0); /* A streams from L2 */
#pragma GCC unroll 2
        for (int h = 1; h >= 0; --h) { /* odd k first */
            const float *ak = a + (2 * p + h) * MR, *bk = b + (2 * p + h) * NR;
            __m256 bv[AVX2_NV];
#pragma GCC unroll 2
            for (int v = 0; v < NV; ++v)
                bv[v] = _mm256_loadu_ps(bk + 8 * v);
#pragma GCC unroll 6
            for (int r = 0; r < MR; ++r) {
                const __m256 av = _mm256_broadcast_ss(ak + r);
#pragma GCC unroll 2
                for (int v = 0; v < NV; ++v)
                    acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) {
            float *cp = c + r * ldc + 8 * v;
            if (mode == DG_UKR_SCALE) {
                const __m256 s = _mm256_mul_ps(_mm256_set1_ps(sa[r]), _mm256_loadu_ps(sb + 8 * v));
                _mm256_storeu_ps(cp, _mm256_fmadd_ps(s, acc[r][v], _mm256_loadu_ps(cp)));
            } else {
                _mm256_storeu_ps(cp, acc[r][v]);
            }
        }
}

void dg_ukr_f32_avx2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                     const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, AVX2_MR, AVX2_NV);
}

/* The small-M kernels (smallm.c): the same body for 1, 2 and 4 rows; the table's largest, 6
 * rows, is dg_ukr_f32_avx2 itself. */
void dg_ukr_f32_avx2_mr1(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 1, AVX2_NV);
}

void dg_ukr_f32_avx2_mr2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 2, AVX2_NV);
}

void dg_ukr_f32_avx2_mr4(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 4, AVX2_NV);
}
