/*
 * prepack_avx512.c - widening of BF16-pair panels (format: src/engine/engine.h) to float32
 * panels for the pre-packed B's small-M path (src/engine/prepack.c). Word (k pair q, row i)
 * holds k = 2q in its low half and k = 2q + 1 in its high half; the float32 panel is
 * [2 * pairs][r]: even k = word << 16, odd k = word & 0xffff0000 (exact).
 */
#include "../../engine/prepack.h"

#include <immintrin.h>

void dg_widen_pairs_avx512(const uint32_t *src, int64_t pairs, int r, uint32_t *dst) {
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t q = 0; q < pairs; ++q) {
        const uint32_t *s = src + q * r;
        uint32_t *lo = dst + 2 * q * r, *hi = lo + r;
        int i = 0;
        for (; i + 16 <= r; i += 16) {
            const __m512i w = _mm512_loadu_si512(s + i);
            _mm512_storeu_si512(lo + i, _mm512_slli_epi32(w, 16));
            _mm512_storeu_si512(hi + i, _mm512_and_si512(w, hi_mask));
        }
        if (i < r) {
            const __mmask16 m = (__mmask16)((1u << (r - i)) - 1);
            const __m512i w = _mm512_maskz_loadu_epi32(m, s + i);
            _mm512_mask_storeu_epi32(lo + i, m, _mm512_slli_epi32(w, 16));
            _mm512_mask_storeu_epi32(hi + i, m, _mm512_and_si512(w, hi_mask));
        }
    }
}
