/*
 * ukr_f32_avx2.h - the body of the AVX2 + FMA float32 microkernel (MR <= 6 rows, NV <= 2 vectors
 * of 8 columns: 12 ymm accumulators) on DG_PACK_F32 panels, shared by the built-in kernels
 * (ukr_f32_avx2.c, constants MR, NV) and the runtime JIT (ukr_f32_avx2_jit.h, constants MR, NV,
 * kc, ldc): one source, so both give the same bits. Contract and per-element order as
 * src/engine/engine.h states: per k pair, fma with the odd k first, then the even k (mirrors
 * one VDPBF16PS lane).
 *
 * Self-contained for the JIT (which embeds this text): the includer defines DG_UKR_ACC and
 * DG_UKR_SCALE (engine.h's dg_ukr_mode, or the JIT unit's constants).
 */
#ifndef DG_KERNELS_AVX2_UKR_F32_AVX2_H
#define DG_KERNELS_AVX2_UKR_F32_AVX2_H

#include <immintrin.h>
#include <stdint.h>

#define DG_AVX2_UKR_MR 6
#define DG_AVX2_UKR_NV 2 /* NR / 8 */

/* The JIT inlines every instance (each with its own constant kc); the built-in kernels leave it
 * to the compiler (one constant-propagated copy per MR). */
#ifndef DG_UKR_INLINE
#define DG_UKR_INLINE inline
#endif

/* MR <= 6 and NV <= 2 rows/vectors; constants after inlining (kc and ldc too, in the JIT). */
static DG_UKR_INLINE void dg_ukr_f32_avx2_body(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                                               int mode, const float *sa, const float *sb, const int MR,
                                               const int NV) {
    const int NR = 8 * NV;
    __m256 acc[DG_AVX2_UKR_MR][DG_AVX2_UKR_NV];
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
            __m256 bv[DG_AVX2_UKR_NV];
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

#endif /* DG_KERNELS_AVX2_UKR_F32_AVX2_H */
