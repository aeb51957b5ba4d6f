/*
 * widen_avx2.c - AVX2 widening of contiguous FP8 (E4M3) and FP4 (E2M1, two per byte, low
 * nibble first) codes to BF16 bits, optionally times a power-of-two scale; the values of
 * kernels/avx512/widen_avx512.c and of the portable loops in dg_engine_fetch_bf16 (pack.c),
 * bit for bit (tests/test_engine_gemm.c compares the ISA levels).
 *
 * 16 codes per step in 16-bit lanes. Lookups of eight or sixteen 16-bit entries use PSHUFB
 * (a byte shuffle inside each 128-bit lane): either a table of 16-bit entries indexed by byte
 * pairs (2c, 2c + 1), or two byte tables (low, high byte) whose results are interleaved.
 */
#include "../../engine/engine.h"

#include <immintrin.h>
#include <string.h>

/* bf16 bits (16 per register) times s, rounded to nearest even back to bf16; NaN stays a
 * (quiet) NaN. */
static inline __m256i scale_bf16(__m256i h, __m256 s) {
    const __m256i rnd = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    __m256i out[2];
    for (int half = 0; half < 2; ++half) {
        const __m128i part = half ? _mm256_extracti128_si256(h, 1) : _mm256_castsi256_si128(h);
        const __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(part), 16)), s);
        const __m256i u = _mm256_castps_si256(f);
        const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(rnd, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
        out[half] = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16),
                                       _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    }
    /* packus interleaves the 128-bit lanes: (a0 b0 a1 b1) -> restore (a0 a1 b0 b1) */
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(out[0], out[1]), 0xd8);
}

/* 16 E4M3 codes (16-bit lanes) to BF16 bits. */
static inline __m256i e4m3_bf16(__m256i w) {
    /* subnormals m * 2^-9, m = 0..7, as BF16, looked up by the byte pair (2m, 2m + 1) */
    const __m256i sub_lut = _mm256_setr_epi16(0x0000, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60, 0x0000,
                                              0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60);
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
    const __m256i e = _mm256_and_si256(_mm256_srli_epi16(w, 3), _mm256_set1_epi16(15));
    const __m256i m = _mm256_and_si256(w, _mm256_set1_epi16(7));
    const __m256i normal = _mm256_or_si256(_mm256_slli_epi16(_mm256_add_epi16(e, _mm256_set1_epi16(120)), 7),
                                           _mm256_slli_epi16(m, 4));
    const __m256i pair = _mm256_or_si256(_mm256_slli_epi16(m, 1), _mm256_slli_epi16(m, 9));
    const __m256i sub = _mm256_shuffle_epi8(sub_lut, _mm256_add_epi16(pair, _mm256_set1_epi16(0x100)));
    const __m256i is_sub = _mm256_cmpeq_epi16(e, _mm256_setzero_si256());
    const __m256i is_nan = _mm256_cmpeq_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7f));
    __m256i v = _mm256_blendv_epi8(normal, sub, is_sub);
    v = _mm256_blendv_epi8(v, _mm256_set1_epi16(0x7fc0), is_nan);
    return _mm256_or_si256(v, sign);
}

void dg_widen_e4m3_avx2(const uint8_t *src, int64_t n, float scale, uint16_t *out) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int64_t i = 0; i < n; i += 16) {
        const int64_t c = n - i < 16 ? n - i : 16;
        uint8_t in[16] = {0};
        uint16_t tail[16];
        const uint8_t *p = src + i;
        if (c < 16) {
            memcpy(in, p, (size_t)c);
            p = in;
        }
        __m256i v = e4m3_bf16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)));
        if (scale != 1.0f)
            v = scale_bf16(v, s);
        if (c == 16) {
            _mm256_storeu_si256((__m256i *)(out + i), v);
        } else {
            _mm256_storeu_si256((__m256i *)tail, v);
            memcpy(out + i, tail, (size_t)c * 2);
        }
    }
}

/* n E2M1 values starting at the low nibble of src[0] (n even, or the last high nibble unused). */
void dg_widen_e2m1_avx2(const uint8_t *src, int64_t n, float scale, uint16_t *out) {
    static const float kE2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    /* the 16 values times the scale, rounded to BF16, split into low and high byte tables */
    uint8_t lo_t[32], hi_t[32];
    for (int c = 0; c < 16; ++c) {
        const uint16_t h = dg_engine_f32_bf16(kE2m1[c] * scale);
        lo_t[c] = lo_t[c + 16] = (uint8_t)h;
        hi_t[c] = hi_t[c + 16] = (uint8_t)(h >> 8);
    }
    const __m256i tlo = _mm256_loadu_si256((const __m256i *)lo_t), thi = _mm256_loadu_si256((const __m256i *)hi_t);
    const __m128i nib = _mm_set1_epi8(15);
    for (int64_t i = 0; i < n; i += 32) {
        const int64_t c = n - i < 32 ? n - i : 32; /* values; (c + 1) / 2 bytes */
        uint8_t in[16] = {0};
        uint16_t tail[32];
        const uint8_t *p = src + i / 2;
        if (c < 32) {
            memcpy(in, p, (size_t)(c + 1) / 2);
            p = in;
        }
        const __m128i b = _mm_loadu_si128((const __m128i *)p);
        const __m128i lo = _mm_and_si128(b, nib), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
        /* codes of values 0..15 | 16..31, one byte each, in value order */
        const __m256i codes = _mm256_setr_m128i(_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi));
        const __m256i l = _mm256_shuffle_epi8(tlo, codes), h = _mm256_shuffle_epi8(thi, codes);
        const __m256i w0 = _mm256_unpacklo_epi8(l, h), w1 = _mm256_unpackhi_epi8(l, h); /* (0-7 | 16-23), (8-15 | 24-31) */
        const __m256i v0 = _mm256_permute2x128_si256(w0, w1, 0x20), v1 = _mm256_permute2x128_si256(w0, w1, 0x31);
        if (c == 32) {
            _mm256_storeu_si256((__m256i *)(out + i), v0);
            _mm256_storeu_si256((__m256i *)(out + i + 16), v1);
        } else {
            _mm256_storeu_si256((__m256i *)tail, v0);
            _mm256_storeu_si256((__m256i *)(tail + 16), v1);
            memcpy(out + i, tail, (size_t)c * 2);
        }
    }
}
