/*
 * dpbf16_avx512.h - VDPBF16PS with a broadcast memory operand, shared by the AVX-512 BF16 decode
 * and MQA kernels. Include only from translation units compiled with AVX-512 BF16.
 */
#ifndef DG_KERNELS_DPBF16_AVX512_H
#define DG_KERNELS_DPBF16_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* acc + w . (the BF16 pair at p, broadcast): the load unit broadcasts the pair (GCC 12 keeps
 * _mm512_set1_epi32 a separate VPBROADCASTD, which competes with shuffles for their pipes).
 * The pair's two products are added odd k first whichever operand holds it, so the bits are
 * those of _mm512_dpbf16_ps(acc, set1(*p), w). */
static inline __attribute__((always_inline)) __m512 dg_dpbf16_bcast(__m512 acc, __m512i w, const uint32_t *p) {
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
    return acc;
}

#endif /* DG_KERNELS_DPBF16_AVX512_H */
