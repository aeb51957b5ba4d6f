/*
 * quant_avx512.c - AVX-512 row kernels of the fast quantization path (see quant_kernels.h):
 * 16 columns per step, block and row tails through masked loads. max and mul on NaN-free
 * float32 give the bits of the scalar code; the amax of NaN rows is left to the caller.
 */
#include "../quant_kernels.h"

#include <immintrin.h>
#include <string.h>

static inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* 16 (or fewer, masked: zeros) values as float32; BF16 is the upper half of its float32. */
static inline __m512 load16(const void *row, bool bf16, int64_t j, __mmask16 m) {
    if (bf16) {
        const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + j);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(m, (const float *)row + j);
}

static inline __m512 abs16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

bool dg_quant_row_block_amax_avx512(const void *row, bool bf16, int64_t k, int64_t bk, float *acc) {
    __mmask16 nan = 0;
    if (bk == 1) { /* one block per column: acc is a row of column maxima */
        for (int64_t j = 0; j < k; j += 16) {
            const __mmask16 m = tail_mask(k - j);
            const __m512 v = load16(row, bf16, j, m);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            _mm512_mask_storeu_ps(acc + j, m, _mm512_max_ps(_mm512_maskz_loadu_ps(m, acc + j), abs16(v)));
        }
        return nan != 0;
    }
    /* Blocks: max of the magnitude bits as unsigned integers, which orders non-negative floats
     * as float max does and puts NaN (above the infinity bits) on top; BF16 stays 16-bit. */
    bool any_nan = false;
    for (int64_t c = 0, j0 = 0; j0 < k; ++c, j0 += bk) {
        const int64_t j1 = j0 + bk < k ? j0 + bk : k;
        uint32_t bits;
        if (bf16) {
            const uint16_t *p = (const uint16_t *)row;
            __m512i mx = _mm512_setzero_si512();
            for (int64_t j = j0; j < j1; j += 32) {
                const __mmask32 m = j1 - j >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (j1 - j)) - 1);
                mx = _mm512_max_epu16(mx, _mm512_and_si512(_mm512_maskz_loadu_epi16(m, p + j), _mm512_set1_epi16(0x7fff)));
            }
            mx = _mm512_max_epu32(_mm512_and_si512(mx, _mm512_set1_epi32(0xffff)), _mm512_srli_epi32(mx, 16));
            bits = (uint32_t)_mm512_reduce_max_epu32(mx) << 16;
        } else {
            const float *p = (const float *)row;
            __m512i mx = _mm512_setzero_si512();
            for (int64_t j = j0; j < j1; j += 16)
                mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(tail_mask(j1 - j), p + j)),
                                                           _mm512_set1_epi32(0x7fffffff)));
            bits = (uint32_t)_mm512_reduce_max_epu32(mx);
        }
        any_nan |= bits > 0x7f800000u;
        float b;
        memcpy(&b, &bits, 4);
        if (b > acc[c])
            acc[c] = b;
    }
    return any_nan;
}

/* x * r, but x itself where x is NaN: the reference's scalar multiply keeps x's NaN (and so
 * its sign, which the E4M3 code keeps) when r is NaN too, whichever operand order the
 * compiler picks for the vector multiply. */
static inline __m512 mul_keep_nan(__m512 x, __m512 r) {
    return _mm512_mask_mov_ps(_mm512_mul_ps(x, r), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

void dg_quant_row_scale_avx512(const void *row, bool bf16, int64_t k, int64_t bk, const float *r, float *y) {
    if (bk == 1) {
        for (int64_t j = 0; j < k; j += 16) {
            const __mmask16 m = tail_mask(k - j);
            _mm512_mask_storeu_ps(y + j, m, mul_keep_nan(load16(row, bf16, j, m), _mm512_maskz_loadu_ps(m, r + j)));
        }
        return;
    }
    for (int64_t c = 0, j0 = 0; j0 < k; ++c, j0 += bk) {
        const int64_t j1 = j0 + bk < k ? j0 + bk : k;
        const __m512 rc = _mm512_set1_ps(r[c]);
        for (int64_t j = j0; j < j1; j += 16) {
            const __mmask16 m = tail_mask(j1 - j);
            _mm512_mask_storeu_ps(y + j, m, mul_keep_nan(load16(row, bf16, j, m), rc));
        }
    }
}

/* dg_float_to_e2m1: the magnitude code counts the midpoints |x| exceeds (NaN exceeds none,
 * ties go down), the sign bit only on a nonzero code of a negative x. */
static inline __m512i e2m1_from_f32x16(__m512 x) {
    static const float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const __m512 ax = abs16(x);
    const __m512i one = _mm512_set1_epi32(1);
    __m512i code = _mm512_setzero_si512();
    for (int i = 0; i < 7; ++i)
        code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(ax, _mm512_set1_ps(kMid[i]), _CMP_GT_OQ), code, one);
    const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ) &
                          _mm512_test_epi32_mask(code, code);
    return _mm512_mask_or_epi32(code, neg, code, _mm512_set1_epi32(8));
}

void dg_quant_f32_to_e2m1x2_avx512(const float *y, uint8_t *dst, int64_t k) {
    for (int64_t j = 0; j < k; j += 16) {
        const __mmask16 m = tail_mask(k - j);
        const __m512i c = e2m1_from_f32x16(_mm512_maskz_loadu_ps(m, y + j));
        /* each 64-bit lane holds codes 2i (bits 0..3) and 2i+1 (bits 32..35): fold to a byte */
        const __m512i b = _mm512_or_si512(c, _mm512_srli_epi64(c, 28));
        const int64_t n = (k - j < 16 ? k - j : 16) / 2;
        _mm512_mask_cvtepi64_storeu_epi8(dst + j / 2, (__mmask8)((1u << n) - 1), b);
    }
}
