/*
 * clang_compat.h - forced into src/kernels/avx2/mqa_avx2.c in fuzz builds (DG_FUZZ, clang only;
 * top-level CMakeLists.txt). That file calls _mm_srli_si128 with a shift that is constant only
 * after loop unrolling, which GCC accepts and clang rejects ("argument to
 * '__builtin_ia32_psrldqi128_byteshift' must be a constant integer"). This replaces the macro
 * with a switch over constant shifts (the same instruction for each value) so the harnesses
 * can be built until that kernel is fixed.
 */
#ifndef DG_FUZZ_CLANG_COMPAT_H
#define DG_FUZZ_CLANG_COMPAT_H
#include <immintrin.h>
static inline __m128i dg_fuzz_srli_si128(__m128i a, int n) {
    switch (n) {
#define DG_FUZZ_SRLI_CASE(k) case k: return _mm_srli_si128(a, k); /* the original macro, literal k */
    DG_FUZZ_SRLI_CASE(0) DG_FUZZ_SRLI_CASE(1) DG_FUZZ_SRLI_CASE(2) DG_FUZZ_SRLI_CASE(3)
    DG_FUZZ_SRLI_CASE(4) DG_FUZZ_SRLI_CASE(5) DG_FUZZ_SRLI_CASE(6) DG_FUZZ_SRLI_CASE(7)
    DG_FUZZ_SRLI_CASE(8) DG_FUZZ_SRLI_CASE(9) DG_FUZZ_SRLI_CASE(10) DG_FUZZ_SRLI_CASE(11)
    DG_FUZZ_SRLI_CASE(12) DG_FUZZ_SRLI_CASE(13) DG_FUZZ_SRLI_CASE(14) DG_FUZZ_SRLI_CASE(15)
#undef DG_FUZZ_SRLI_CASE
    default: return _mm_setzero_si128();
    }
}
#undef _mm_srli_si128
#define _mm_srli_si128(a, n) dg_fuzz_srli_si128((a), (n))
#endif
