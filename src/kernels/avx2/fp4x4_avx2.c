/*
 * fp4x4_avx2.c - FP4 x FP4 on AVX2 integer dot products: the microkernel and the K-major
 * packers (panels and order: engine/fp4x4.h; the twins of kernels/avx512_bf16/fp4x4_vnni.c and
 * fp4x4_pack.c, the same bytes and the same bits).
 *
 * Without VPDPBUSD, a 4-element u8 x s8 dot product is VPMADDUBSW (pairs into int16) then
 * VPMADDWD by ones (pairs of pairs into int32). A arrives unsigned (2a + 12 in [0, 24], a_bias
 * 12) and B signed (2b in [-12, 12]): a pair sums to at most 2 * 24 * 12 = 576, far from the
 * int16 saturation of VPMADDUBSW, so every block sum is the exact int32 of the VNNI kernel.
 */
#include "../../engine/fp4x4.h"

#include <immintrin.h>
#include <string.h>

static inline __m256i lut(int bias) {
    const __m128i t = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i b = _mm_add_epi8(t, _mm_set1_epi8((char)bias));
    return _mm256_setr_m128i(b, b);
}

/* 2 x E2M1 (+ bias) of the first `bytes` (<= 16) bytes at p: one k step of 32 codes, k order
 * kept; codes past them are zero (the bias alone). */
static inline __m256i decode32(const uint8_t *p, int64_t bytes, __m256i table) {
    __m128i x;
    if (bytes >= 16) {
        x = _mm_loadu_si128((const __m128i *)(const void *)p);
    } else {
        uint8_t tmp[16] = {0};
        if (bytes > 0)
            memcpy(tmp, p, (size_t)bytes);
        x = _mm_loadu_si128((const __m128i *)(const void *)tmp);
    }
    const __m256i w = _mm256_cvtepu8_epi16(x);
    /* (w | w << 4) & 0x0f0f: the low nibble in the low byte, the high one in the high byte */
    const __m256i v = _mm256_and_si256(_mm256_or_si256(w, _mm256_slli_epi16(w, 4)), _mm256_set1_epi16(0x0f0f));
    return _mm256_shuffle_epi8(table, v);
}

void dg_f4_pack_a_avx2(const uint8_t *src, int64_t ld, int rows, int64_t kbytes, int64_t steps, int bias,
                       int8_t *dst) {
    const __m256i table = lut(bias);
    for (int r = 0; r < DG_F4_MR; ++r)
        for (int64_t s = 0; s < steps; ++s) {
            const int64_t off = s * 16, left = kbytes - off;
            const __m256i v = r < rows ? decode32(src + r * ld + off, left < 0 ? 0 : left, table)
                                       : _mm256_set1_epi8((char)bias);
            _mm256_storeu_si256((__m256i *)(void *)(dst + s * DG_F4_MR * DG_F4_KS + r * DG_F4_KS), v);
        }
}

/* 8 x 8 transpose of 32-bit words: out[e] = word e of in[0..7]. */
static inline void transpose8(const __m256i in[8], __m256i out[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int e = 0; e < 4; ++e) { /* u[e]: words e and e + 4 of rows 0-3 (lanes 0, 1); u[4 + e]: rows 4-7 */
        out[e] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x20);
        out[e + 4] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x31);
    }
}

void dg_f4_pack_b_avx2(const uint8_t *src, int64_t ld, int rows, int64_t kbytes, int64_t steps, int spb,
                       int8_t *dst, int32_t *bsum, const uint8_t *next, int next_rows) {
    const __m256i table = lut(0), ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const int64_t nkb = (steps + spb - 1) / spb;
    memset(bsum, 0, (size_t)(nkb * DG_F4_NR) * sizeof(int32_t));
    for (int h = 0; h < 4; ++h) /* 8 columns of the panel at a time */
        for (int64_t s = 0; s < steps; ++s) {
            const int64_t off = s * 16, left = kbytes - off;
            __m256i in[8], r[8]; /* r[e]: dword e (k 4e .. 4e + 3 of the step) of every row */
            for (int rr = 0; next && off % 64 == 0 && rr < 8 && 8 * h + rr < next_rows; ++rr)
                _mm_prefetch((const char *)(next + (8 * h + rr) * ld + off), _MM_HINT_T1);
            for (int rr = 0; rr < 8; ++rr)
                in[rr] = 8 * h + rr < rows ? decode32(src + (8 * h + rr) * ld + off, left < 0 ? 0 : left, table)
                                           : _mm256_setzero_si256();
            transpose8(in, r);
            __m256i cs = _mm256_setzero_si256();
            for (int e = 0; e < 8; ++e) {
                _mm256_storeu_si256((__m256i *)(void *)(dst + (s * 8 + e) * 128 + h * 32), r[e]);
                cs = _mm256_add_epi32(cs, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, r[e]), ones16));
            }
            int32_t *bs = bsum + (s / spb) * DG_F4_NR + 8 * h;
            _mm256_storeu_si256((__m256i *)(void *)bs, _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(void *)bs), cs));
        }
    for (int64_t i = 0; i < nkb * DG_F4_NR; ++i)
        bsum[i] *= -12;
}

/* Rows [r0, r0 + rg) of one block over k steps [s0, s1): int32 sums from the bias correction,
 * then acc = fmaf((float)dot, sa4 * sb, acc). rg (1 or 2) is a constant at each call: 4 rg
 * int32 accumulators in registers. */
static inline __attribute__((always_inline)) void rows_block(int rg, int64_t s0, int64_t s1, int r0, const int8_t *a,
                                                             const int8_t *b, const __m256i c[4], const float *sa4,
                                                             const __m256 sb[4], float *acc) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256i dot[2][4];
    for (int r = 0; r < rg; ++r)
        for (int v = 0; v < 4; ++v)
            dot[r][v] = c[v];
    for (int64_t s = s0; s < s1; ++s) {
        const int8_t *as = a + s * DG_F4_MR * DG_F4_KS + r0 * DG_F4_KS;
        const int8_t *bs = b + s * DG_F4_KS * DG_F4_NR;
        for (int g = 0; g < DG_F4_KS / 4; ++g) {
            __m256i bv[4];
            for (int v = 0; v < 4; ++v)
                bv[v] = _mm256_loadu_si256((const __m256i *)(const void *)(bs + g * 128 + 32 * v));
            for (int r = 0; r < rg; ++r) {
                int32_t w;
                memcpy(&w, as + r * DG_F4_KS + 4 * g, 4);
                const __m256i ab = _mm256_set1_epi32(w);
                for (int v = 0; v < 4; ++v)
                    dot[r][v] = _mm256_add_epi32(dot[r][v], _mm256_madd_epi16(_mm256_maddubs_epi16(ab, bv[v]), ones16));
            }
        }
    }
    for (int r = 0; r < rg; ++r) {
        const __m256 sa = _mm256_set1_ps(sa4[r0 + r]);
        float *ar = acc + (r0 + r) * DG_F4_NR;
        for (int v = 0; v < 4; ++v)
            _mm256_storeu_ps(ar + 8 * v, _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][v]), _mm256_mul_ps(sa, sb[v]),
                                                         _mm256_loadu_ps(ar + 8 * v)));
    }
}

void dg_f4_ukr_avx2(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                    const float *sb, const int32_t *bsum, float *acc) {
    for (int64_t s0 = 0, kb = 0; s0 < steps; s0 += spb, ++kb) {
        const int64_t s1 = s0 + spb < steps ? s0 + spb : steps;
        __m256i c[4];
        __m256 sbv[4];
        for (int v = 0; v < 4; ++v) {
            c[v] = _mm256_loadu_si256((const __m256i *)(const void *)(bsum + kb * DG_F4_NR + 8 * v));
            sbv[v] = _mm256_loadu_ps(sb + kb * DG_F4_NR + 8 * v);
        }
        const float *sak = sa4 + kb * DG_F4_MR;
        int r0 = 0;
        for (; r0 + 2 <= rows; r0 += 2)
            rows_block(2, s0, s1, r0, a, b, c, sak, sbv, acc);
        if (r0 < rows)
            rows_block(1, s0, s1, r0, a, b, c, sak, sbv, acc);
    }
}
