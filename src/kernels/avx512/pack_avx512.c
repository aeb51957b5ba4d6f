/*
 * pack_avx512.c - AVX-512 packing of a K-major BF16 operand (unit stride along K) into the
 * engine's panels (format: src/engine/engine.h). The panel layout is a transpose of the source
 * (rows become lanes), done 16 rows x 16 k pairs at a time as a 16 x 16 transpose of 32-bit
 * words, so each word keeps its (k even, k odd) BF16 pair:
 *   DG_PACK_BF16: the word is stored as is;
 *   DG_PACK_F32:  it is split into float32 (even = word << 16, odd = word & 0xffff0000).
 * Rows past `rows` and k past `k` are zero. Any panel width r <= 32.
 */
#include "../../engine/engine.h"
#include "../transpose16_avx512.h"

#include <immintrin.h>

/*
 * Rows [0, rows) of src (row i at src + i * ld, BF16, k contiguous), k in [k0, k0 + kc)
 * (kc even, values at k >= k are zero), into the panel slice dst of width r: element
 * (i, kk) at (kk - k0) * r + i (F32) or word ((kk - k0) / 2) * r + i (BF16 pairs).
 */
void dg_pack_bf16_kmajor_avx512(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0,
                                int64_t kc, int64_t k, dg_pack_fmt fmt, void *dst) {
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    for (int i0 = 0; i0 < r; i0 += 16) {
        const int lanes = r - i0 < 16 ? r - i0 : 16;
        const __mmask16 store_mask = (__mmask16)((1u << lanes) - 1);
        for (int64_t kk = k0; kk < k0 + kc; kk += 32) {
            const int64_t valid = k - kk < 0 ? 0 : k - kk > 32 ? 32 : k - kk;
            const __mmask32 load_mask = (__mmask32)(valid >= 32 ? 0xffffffffu : (1u << valid) - 1);
            __m512i in[16], out[16];
            for (int i = 0; i < 16; ++i)
                in[i] = i0 + i < rows ? _mm512_maskz_loadu_epi16(load_mask, src + (i0 + i) * ld + kk)
                                      : _mm512_setzero_si512();
            dg_transpose16_epi32(in, out);
            const int pairs = (int)((k0 + kc - kk) / 2 < 16 ? (k0 + kc - kk) / 2 : 16);
            for (int p = 0; p < pairs; ++p) {
                const int64_t q = (kk - k0) / 2 + p; /* pair index inside the slice */
                if (fmt != DG_PACK_F32) { /* BF16 pairs (DG_PACK_BF16, DG_PACK_AMX_B) */
                    _mm512_mask_storeu_epi32((uint32_t *)dst + q * r + i0, store_mask, out[p]);
                } else {
                    float *d = (float *)dst + 2 * q * r + i0;
                    _mm512_mask_storeu_ps(d, store_mask, _mm512_castsi512_ps(_mm512_slli_epi32(out[p], 16)));
                    _mm512_mask_storeu_ps(d + r, store_mask,
                                          _mm512_castsi512_ps(_mm512_and_si512(out[p], hi_mask)));
                }
            }
        }
    }
}

/* Word w of a k-pair interleave of rows x (k) and y (k + 1): x[w / 2] for even w, y[w / 2] for odd
 * (kPairIdx0: elements 0..15; kPairIdx1: 16..31), as _mm512_permutex2var_epi16 indices. Static
 * tables, not stack arrays: GCC 12's AddressSanitizer with detect_stack_use_after_return moved
 * such an array into a fake frame that the 64-byte load then faulted on (CI on Zen 5). */
static const uint16_t kPairIdx0[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
static const uint16_t kPairIdx1[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

/*
 * The same panels from an MN-major BF16 operand (unit stride along MN, k stride ld): rows
 * [0, rows) start at src, element (i, kk) at src[i + kk * ld]. The panel order is nearly the
 * source order, so this is a copy with widening (F32) or with k pairs interleaved (BF16).
 */
void dg_pack_bf16_mnmajor_avx512(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0,
                                 int64_t kc, int64_t k, dg_pack_fmt fmt, void *dst) {
    const __mmask32 load_mask = (__mmask32)(rows >= 32 ? 0xffffffffu : (1u << rows) - 1);
    const __mmask32 store_mask = (__mmask32)(r >= 32 ? 0xffffffffu : (1u << r) - 1);
    if (fmt == DG_PACK_F32) {
        for (int64_t kk = k0; kk < k0 + kc; ++kk) {
            const __m512i x = kk < k ? _mm512_maskz_loadu_epi16(load_mask, src + kk * ld) : _mm512_setzero_si512();
            const __m512i lo = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(x)), 16);
            const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(x, 1)), 16);
            float *d = (float *)dst + (kk - k0) * r;
            _mm512_mask_storeu_ps(d, (__mmask16)store_mask, _mm512_castsi512_ps(lo));
            if (r > 16)
                _mm512_mask_storeu_ps(d + 16, (__mmask16)(store_mask >> 16), _mm512_castsi512_ps(hi));
        }
        return;
    }
    /* word w of out0 = x[w / 2] (w even) or y[w / 2] (w odd); out1 the same from element 16 */
    const __m512i idx0 = _mm512_loadu_si512(kPairIdx0), idx1 = _mm512_loadu_si512(kPairIdx1);
    for (int64_t kk = k0; kk < k0 + kc; kk += 2) {
        const __m512i x = kk < k ? _mm512_maskz_loadu_epi16(load_mask, src + kk * ld) : _mm512_setzero_si512();
        const __m512i y =
            kk + 1 < k ? _mm512_maskz_loadu_epi16(load_mask, src + (kk + 1) * ld) : _mm512_setzero_si512();
        uint32_t *d = (uint32_t *)dst + (kk - k0) / 2 * r;
        _mm512_mask_storeu_epi32(d, (__mmask16)store_mask, _mm512_permutex2var_epi16(x, idx0, y));
        if (r > 16)
            _mm512_mask_storeu_epi32(d + 16, (__mmask16)(store_mask >> 16), _mm512_permutex2var_epi16(x, idx1, y));
    }
}

/*
 * One DG_PACK_AMX_A k step from an MN-major BF16 operand: element (i, kk) at src[i + kk * ld]
 * for rows i < rows (<= r, r = 16 or 32) and kk in [k0, k0 + 32), zero at kk >= k or i >= rows,
 * into dst[32 * i + kk - k0]. Pairs of source rows are interleaved into words (k pair, row), as
 * DG_PACK_BF16 has them, then 16 x 16 word blocks are transposed: row i's 16 pairs are its 32 k.
 */
void dg_pack_bf16_mn_amx_a_avx512(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t k,
                                  uint16_t *dst) {
    const __mmask32 load_mask = (__mmask32)(rows >= 32 ? 0xffffffffu : (1u << rows) - 1);
    const __m512i idx0 = _mm512_loadu_si512(kPairIdx0), idx1 = _mm512_loadu_si512(kPairIdx1);
    __m512i lo[16], hi[16], out[16];
    for (int p = 0; p < 16; ++p) {
        const int64_t kk = k0 + 2 * p;
        const __m512i x = kk < k ? _mm512_maskz_loadu_epi16(load_mask, src + kk * ld) : _mm512_setzero_si512();
        const __m512i y =
            kk + 1 < k ? _mm512_maskz_loadu_epi16(load_mask, src + (kk + 1) * ld) : _mm512_setzero_si512();
        lo[p] = _mm512_permutex2var_epi16(x, idx0, y);
        hi[p] = _mm512_permutex2var_epi16(x, idx1, y);
    }
    dg_transpose16_epi32(lo, out);
    for (int i = 0; i < 16; ++i)
        _mm512_storeu_si512(dst + 32 * i, out[i]);
    if (r > 16) {
        dg_transpose16_epi32(hi, out);
        for (int i = 0; i < 16; ++i)
            _mm512_storeu_si512(dst + 32 * (16 + i), out[i]);
    }
}
