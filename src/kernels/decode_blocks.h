/*
 * decode_blocks.h - shared by the AVX2 and AVX-512 F decode kernels (decode_avx2.c,
 * decode_avx512.c), which at small M run several K blocks' FMA chains side by side: A's values of
 * those blocks interleaved, so that the FMA loop reaches all of them through one pointer.
 */
#ifndef DG_KERNELS_DECODE_BLOCKS_H
#define DG_KERNELS_DECODE_BLOCKS_H

#include "../engine/engine.h"

/* ail[(k M + m) NB + b] = A's row m at k of block b, for k < gblk: blocks b = 0 .. NB - 1 of gblk
 * k each from kb0 on (M and NB constants after inlining; ail holds gblk M NB floats). */
static inline void dg_decode_interleave_a(const dg_decode_job *j, int64_t kb0, int64_t gblk, const int M,
                                          const int NB, float *ail) {
    for (int64_t k = 0; k < gblk; ++k)
        for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
            for (int b = 0; b < NB; ++b)
                ail[(k * M + m) * NB + b] = j->a[m * j->lda + kb0 + b * gblk + k];
}

#endif /* DG_KERNELS_DECODE_BLOCKS_H */
