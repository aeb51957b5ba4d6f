/*
 * fp4x4_pack.c - AVX-512 packers of K-major FP4 rows into the int8 panels of engine/fp4x4.h
 * (the same bytes as the portable packer in fp4x4.c). A row chunk of 32 bytes (64 k, two k
 * steps) is widened to 16-bit words, its nibbles split into bytes (element order kept) and
 * mapped to 2 x E2M1 by one byte shuffle. B panels then need the VNNI-4 transpose: 16 rows of
 * 16 dwords (4 k each) become 16 vectors of one dword from each row.
 */
#include "../../engine/fp4x4.h"
#include "../transpose16_avx512.h"

#include <immintrin.h>
#include <string.h>

static inline __m512i lut(int bias) {
    const __m128i t = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    return _mm512_broadcast_i32x4(_mm_add_epi8(t, _mm_set1_epi8((char)bias)));
}

/* 2 x E2M1 (+ bias) of the first `bytes` (<= 32) bytes at p, k order kept; zero codes past them. */
static inline __m512i decode64(const uint8_t *p, int64_t bytes, __m512i table) {
    const __m256i x = bytes >= 32 ? _mm256_loadu_si256((const __m256i *)(const void *)p)
                                  : _mm256_maskz_loadu_epi8((__mmask32)((1ull << bytes) - 1), p);
    const __m512i w = _mm512_cvtepu8_epi16(x);
    const __m512i v = _mm512_ternarylogic_epi32(w, _mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x0f0f), 0xA8);
    return _mm512_shuffle_epi8(table, v); /* (w | w << 4) & 0x0f0f: low nibble, then high */
}

void dg_f4_pack_a_avx512(const uint8_t *src, int64_t ld, int rows, int64_t kbytes, int64_t steps, int bias,
                         int8_t *dst) {
    const __m512i table = lut(bias);
    for (int r = 0; r < DG_F4_MR; ++r)
        for (int64_t s = 0; s < steps; s += 2) {
            const int64_t off = s * 16, left = kbytes - off;
            const __m512i v = r < rows ? decode64(src + r * ld + off, left < 0 ? 0 : left, table) : _mm512_set1_epi8((char)bias);
            int8_t *o = dst + s * DG_F4_MR * DG_F4_KS + r * DG_F4_KS;
            _mm256_storeu_si256((__m256i *)(void *)o, _mm512_castsi512_si256(v));
            if (s + 1 < steps)
                _mm256_storeu_si256((__m256i *)(void *)(o + DG_F4_MR * DG_F4_KS), _mm512_extracti64x4_epi64(v, 1));
        }
}

void dg_f4_pack_b_avx512(const uint8_t *src, int64_t ld, int rows, int64_t kbytes, int64_t steps, int spb,
                         int8_t *dst, int32_t *bsum, const uint8_t *next, int next_rows) {
    const __m512i table = lut(0), ones = _mm512_set1_epi8(1);
    const int64_t nkb = (steps + spb - 1) / spb;
    memset(bsum, 0, (size_t)(nkb * DG_F4_NR) * sizeof(int32_t));
    for (int h = 0; h < 2; ++h)
        for (int64_t s = 0; s < steps; s += 2) {
            const int64_t off = s * 16, left = kbytes - off;
            __m512i in[16], r[16]; /* r[e]: dword e of every row */
            for (int rr = 0; next && off % 64 == 0 && rr < 16 && 16 * h + rr < next_rows; ++rr)
                _mm_prefetch((const char *)(next + (16 * h + rr) * ld + off), _MM_HINT_T1);
            for (int rr = 0; rr < 16; ++rr)
                in[rr] = 16 * h + rr < rows ? decode64(src + (16 * h + rr) * ld + off, left < 0 ? 0 : left, table)
                                            : _mm512_setzero_si512();
            dg_transpose16_epi32(in, r);
            const int ne = s + 1 < steps ? 16 : 8;
            __m512i cs[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
            for (int e = 0; e < ne; ++e) {
                _mm512_store_si512(dst + (s * 8 + e) * 128 + h * 64, r[e]);
                cs[e >> 3] = _mm512_dpbusd_epi32(cs[e >> 3], ones, r[e]);
            }
            for (int q = 0; q < ne / 8; ++q) {
                int32_t *bs = bsum + ((s + q) / spb) * DG_F4_NR + 16 * h;
                _mm512_storeu_si512(bs, _mm512_add_epi32(_mm512_loadu_si512(bs), cs[q]));
            }
        }
    for (int64_t i = 0; i < nkb * DG_F4_NR; ++i)
        bsum[i] *= -12;
}
