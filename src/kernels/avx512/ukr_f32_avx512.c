/*
 * ukr_f32_avx512.c - AVX-512F microkernel, MR = 14, NR = 32 (28 zmm accumulators, 2 for B,
 * A broadcast from memory), on DG_PACK_F32 panels. Contract and per-element order as
 * src/engine/engine.h states: per k pair, fma with the odd k first, then the even k - one
 * VDPBF16PS lane's order, so this kernel and the AVX-512 BF16 one agree bitwise (except that
 * VDPBF16PS flushes denormals).
 */
#include "../../engine/engine.h"

#include <immintrin.h>

#define A512_MR 14
#define A512_NV 2

/* MR <= 14, NV <= 2; constants after inlining. */
static inline void ukr_body(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mode,
                            const float *sa, const float *sb, const int MR, const int NV) {
    const int NR = 16 * NV;
    __m512 acc[A512_MR][A512_NV];
#pragma GCC unroll 14
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v)
            acc[r][v] = mode == DG_UKR_ACC ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t p = 0; p < kc / 2; ++p) {
        /* A streams from L2: fetch ~8 k pairs ahead (past the panel end is harmless) */
        _mm_prefetch((const char *)(a + (2 * p + 16) * MR), _MM_HINT_T0);
        _mm_prefetch((const char *)(a + (2 * p + 16) * MR + 16), _MM_HINT_T0);
#pragma GCC unroll 2
        for (int h = 1; h >= 0; --h) { /* odd k first */
            const float *ak = a + (2 * p + h) * MR, *bk = b + (2 * p + h) * NR;
            __m512 bv[A512_NV];
#pragma GCC unroll 2
            for (int v = 0; v < NV; ++v)
                bv[v] = _mm512_loadu_ps(bk + 16 * v);
#pragma GCC unroll 14
            for (int r = 0; r < MR; ++r) {
                const __m512 av = _mm512_set1_ps(ak[r]);
#pragma GCC unroll 2
                for (int v = 0; v < NV; ++v)
                    acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
            }
        }
    }
#pragma GCC unroll 14
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) {
            float *cp = c + r * ldc + 16 * v;
            if (mode == DG_UKR_SCALE) {
                const __m512 s = _mm512_mul_ps(_mm512_set1_ps(sa[r]), _mm512_loadu_ps(sb + 16 * v));
                _mm512_storeu_ps(cp, _mm512_fmadd_ps(s, acc[r][v], _mm512_loadu_ps(cp)));
            } else {
                _mm512_storeu_ps(cp, acc[r][v]);
            }
        }
}

void dg_ukr_f32_avx512(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                       const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, A512_MR, A512_NV);
}

/* Small-M instantiations of the same body (decoding: M = 1 .. 8 rows per A panel). */
void dg_ukr_f32_avx512_mr1(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                           const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 1, A512_NV);
}

void dg_ukr_f32_avx512_mr2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                           const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 2, A512_NV);
}

void dg_ukr_f32_avx512_mr4(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                           const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 4, A512_NV);
}

void dg_ukr_f32_avx512_mr8(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                           const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 8, A512_NV);
}
