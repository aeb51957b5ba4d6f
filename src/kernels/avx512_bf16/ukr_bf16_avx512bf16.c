/*
 * ukr_bf16_avx512bf16.c - AVX-512 BF16 microkernel, MR = 14, NR = 32, on DG_PACK_BF16 panels
 * (K pairs interleaved: a 32-bit word holds (k even, k odd) of one row).
 * Per k pair: one VDPBF16PS per (row, 16 columns): acc += a_odd * b_odd, then += a_even * b_even,
 * each rounded once (products of BF16 values are exact in float32), i.e. the order stated in
 * src/engine/engine.h; denormal inputs and results are flushed to zero by the instruction.
 * The small-M path (smallm.c, prepack.c) runs the same body with MR = 1, 2, 4, 8, so a row of D
 * gets the same bits whatever M, denormals included.
 */
#include "../../engine/engine.h"

#include <immintrin.h>

#define BF_MR 14
#define BF_NV 2 /* NR / 16 */

static inline void ukr_body(int64_t kc, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc,
                            int mode, const float *sa, const float *sb, const int MR, const int NV) {
    const int NR = 16 * NV;
    __m512 acc[BF_MR][BF_NV];
#pragma GCC unroll 14
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v)
            acc[r][v] = mode == DG_UKR_ACC ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t p = 0; p < kc / 2; ++p) {
        const uint32_t *ap = a + p * MR, *bp = b + p * NR;
        _mm_prefetch((const char *)(ap + 16 * MR), _MM_HINT_T0); /* A streams from L2: 16 pairs ahead */
        /* small M from 4 rows: B streams from memory (pre-packed weights); 32 pairs ahead (Zen 4,
         * B 2112 x 7168, 2 threads: M = 16 1.55 -> 1.19 ms, M = 64 5.2 -> 4.75; at M <= 2 the
         * hardware prefetcher alone is faster, and at the FP32 levels the prefetch lost too) */
        if (MR >= 4 && MR < BF_MR)
            for (int v = 0; v < NV; ++v)
                _mm_prefetch((const char *)(bp + 32 * NR + 16 * v), _MM_HINT_T0);
        __m512bh bv[BF_NV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v)
            bv[v] = (__m512bh)_mm512_loadu_si512(bp + 16 * v);
#pragma GCC unroll 14
        for (int r = 0; r < MR; ++r) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[r]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; ++v)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
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

void dg_ukr_bf16_avx512bf16(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                            const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, BF_MR, BF_NV);
}

/* Small-M instantiations of the same body (decoding: M = 1 .. 8 rows per A panel). */
void dg_ukr_bf16_avx512bf16_mr1(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                                const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 1, BF_NV);
}

void dg_ukr_bf16_avx512bf16_mr2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                                const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 2, BF_NV);
}

void dg_ukr_bf16_avx512bf16_mr4(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                                const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 4, BF_NV);
}

void dg_ukr_bf16_avx512bf16_mr8(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                                const float *sa, const float *sb) {
    ukr_body(kc, a, b, c, ldc, mode, sa, sb, 8, BF_NV);
}
