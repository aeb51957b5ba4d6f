/*
 * pack_avx2.c - AVX2 packing of BF16 operands into the engine's panels (format:
 * src/engine/engine.h), the twin of kernels/avx512/pack_avx512.c for 256-bit registers.
 *
 * K-major source: the panel is a transpose of the source (rows become lanes). One step takes
 * 8 rows x 8 k: the 16-byte pieces of rows j and j + 4 share a register (one per 128-bit lane),
 * so a 4 x 4 transpose of 32-bit words inside each lane leaves, in register q, the word (k pair
 * q) of rows 0..7 in lane order; no cross-lane shuffle is needed. Each word keeps its
 * (k even, k odd) BF16 pair:
 *   DG_PACK_BF16: the word is stored as is;
 *   DG_PACK_F32:  it is split into float32 (even = word << 16, odd = word & 0xffff0000).
 * Rows past `rows` and k past `k` are zero. Any panel width r (stores are masked to r lanes).
 */
#include "../../engine/engine.h"

#include <immintrin.h>
#include <string.h>

/* Lanes [0, n) of 8 set (n <= 8), for masked stores of a panel narrower than 8 at i0. */
static inline __m256i lane_mask(int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

/* Stores the 8 words w (rows i0..i0 + 7 of one k pair q) into the slice. */
static inline void store_pair(__m256i w, dg_pack_fmt fmt, void *dst, int64_t q, int r, int i0, int lanes) {
    if (fmt != DG_PACK_F32) {
        int32_t *d = (int32_t *)dst + q * r + i0;
        if (lanes == 8)
            _mm256_storeu_si256((__m256i *)d, w);
        else
            _mm256_maskstore_epi32(d, lane_mask(lanes), w);
        return;
    }
    const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
    float *d = (float *)dst + 2 * q * r + i0;
    if (lanes == 8) {
        _mm256_storeu_ps(d, even);
        _mm256_storeu_ps(d + r, odd);
    } else {
        const __m256i m = lane_mask(lanes);
        _mm256_maskstore_ps(d, m, even);
        _mm256_maskstore_ps(d + r, m, odd);
    }
}

/* The 8 x 8 block at (rows i0.., k kk..) as 4 registers of words: w[q] = pair q of rows 0..7. */
static inline void block8(const uint16_t *s, int64_t ld, __m256i w[4]) {
    __m256i y[4];
    for (int j = 0; j < 4; ++j)
        y[j] = _mm256_loadu2_m128i((const __m128i *)(s + (j + 4) * ld), (const __m128i *)(s + j * ld));
    /* per lane: words (row j, pair q) -> (pair q, row j) */
    const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    w[0] = _mm256_unpacklo_epi64(t0, t2), w[1] = _mm256_unpackhi_epi64(t0, t2);
    w[2] = _mm256_unpacklo_epi64(t1, t3), w[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* A block with row or k tails: the rows' pieces copied into a zeroed 8 x 8 block first. */
static __attribute__((noinline)) void block8_tail(const uint16_t *src, int64_t ld, int64_t rows, int i0, int64_t kk,
                                                  int64_t k, __m256i w[4]) {
    uint16_t tmp[8 * 8] = {0};
    for (int j = 0; j < 8; ++j)
        if (i0 + j < rows && kk < k)
            memcpy(tmp + 8 * j, src + (i0 + j) * ld + kk, (size_t)(k - kk < 8 ? k - kk : 8) * 2);
    block8(tmp, 8, w);
}

/*
 * Panels narrower than 8 (the small-M path's A, M = 1 .. 7): a row at a time, k in order. The
 * 8 x 8 transposes spent most of their work on padding rows there (M = 1, K 7168: about 50 us
 * a call on Zen 4 through block8_tail, half of a decoding call's time with B in L2; one-row
 * panels take pack.c's copy before they get here).
 */
static void pack_narrow(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t kc, int64_t k,
                        dg_pack_fmt fmt, void *dst) {
    const int64_t valid = k - k0 < kc ? (k - k0 > 0 ? k - k0 : 0) : kc; /* k in [k0, k0 + valid) are read */
    for (int i = 0; i < r; ++i)
        for (int64_t kk = 0; kk < kc; ++kk) {
            const uint16_t v = i < rows && kk < valid ? src[i * ld + k0 + kk] : 0;
            if (fmt == DG_PACK_F32) {
                const uint32_t bits = (uint32_t)v << 16;
                memcpy((float *)dst + kk * r + i, &bits, 4);
            } else { /* word (pair kk / 2, row i): the even k in its low half */
                ((uint16_t *)dst)[(kk / 2 * r + i) * 2 + (kk & 1)] = v;
            }
        }
}

/*
 * Rows [0, rows) of src (row i at src + i * ld, BF16, k contiguous), k in [k0, k0 + kc)
 * (kc even, values at k >= k are zero), into the panel slice dst of width r: element
 * (i, kk) at (kk - k0) * r + i (F32) or word ((kk - k0) / 2) * r + i (BF16 pairs).
 */
void dg_pack_bf16_kmajor_avx2(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t kc,
                              int64_t k, dg_pack_fmt fmt, void *dst) {
    if (r < 8) {
        pack_narrow(src, ld, rows, r, k0, kc, k, fmt, dst);
        return;
    }
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int i0 = 0; i0 < r; i0 += 8) {
        const int lanes = r - i0 < 8 ? r - i0 : 8;
        /* whole 8 x 8 blocks, F32 panels of full lanes: the common case, no branches inside */
        int64_t kk = k0;
        if (fmt == DG_PACK_F32 && lanes == 8 && i0 + 8 <= rows) {
            const uint16_t *s = src + i0 * ld;
            float *d = (float *)dst + i0;
            for (; kk + 8 <= k0 + kc && kk + 8 <= k; kk += 8) {
                __m256i w[4];
                block8(s + kk, ld, w);
                float *o = d + (kk - k0) * r;
                for (int p = 0; p < 4; ++p) {
                    _mm256_storeu_ps(o + 2 * p * r, _mm256_castsi256_ps(_mm256_slli_epi32(w[p], 16)));
                    _mm256_storeu_ps(o + (2 * p + 1) * r, _mm256_castsi256_ps(_mm256_and_si256(w[p], hi)));
                }
            }
        }
        for (; kk < k0 + kc; kk += 8) {
            __m256i w[4];
            if (i0 + 8 <= rows && kk + 8 <= k)
                block8(src + i0 * ld + kk, ld, w);
            else
                block8_tail(src, ld, rows, i0, kk, k, w);
            const int pairs = (int)((k0 + kc - kk) / 2 < 4 ? (k0 + kc - kk) / 2 : 4);
            for (int p = 0; p < pairs; ++p)
                store_pair(w[p], fmt, dst, (kk - k0) / 2 + p, r, i0, lanes);
        }
    }
}

/* 8 BF16 of an MN-major row kk (elements i0 .. i0 + 7), zero past `rows` and for kk >= k. */
static inline __m128i load_mn(const uint16_t *src, int64_t ld, int64_t kk, int64_t k, int i0, int64_t rows) {
    if (kk >= k || i0 >= rows)
        return _mm_setzero_si128();
    const uint16_t *p = src + kk * ld + i0;
    if (rows - i0 >= 8)
        return _mm_loadu_si128((const __m128i *)p);
    uint16_t tmp[8] = {0};
    memcpy(tmp, p, (size_t)(rows - i0) * 2);
    return _mm_loadu_si128((const __m128i *)tmp);
}

/*
 * The same panels from an MN-major BF16 operand (unit stride along MN, k stride ld): rows
 * [0, rows) start at src, element (i, kk) at src[i + kk * ld]. The panel order is nearly the
 * source order: a copy with widening (F32) or with the two k of a pair interleaved (BF16).
 */
void dg_pack_bf16_mnmajor_avx2(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t kc,
                               int64_t k, dg_pack_fmt fmt, void *dst) {
    for (int i0 = 0; i0 < r; i0 += 8) {
        const int lanes = r - i0 < 8 ? r - i0 : 8;
        for (int64_t kk = k0; kk < k0 + kc; kk += 2) {
            const __m128i x = load_mn(src, ld, kk, k, i0, rows), y = load_mn(src, ld, kk + 1, k, i0, rows);
            if (fmt == DG_PACK_F32) {
                float *d = (float *)dst + (kk - k0) * r + i0;
                const __m256 fx = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
                const __m256 fy = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(y), 16));
                if (lanes == 8) {
                    _mm256_storeu_ps(d, fx);
                    _mm256_storeu_ps(d + r, fy);
                } else {
                    _mm256_maskstore_ps(d, lane_mask(lanes), fx);
                    _mm256_maskstore_ps(d + r, lane_mask(lanes), fy);
                }
            } else {
                const __m256i w = _mm256_setr_m128i(_mm_unpacklo_epi16(x, y), _mm_unpackhi_epi16(x, y));
                int32_t *d = (int32_t *)dst + (kk - k0) / 2 * r + i0;
                if (lanes == 8)
                    _mm256_storeu_si256((__m256i *)d, w);
                else
                    _mm256_maskstore_epi32(d, lane_mask(lanes), w);
            }
        }
    }
}

/* BF16 pair panels (word (q, i) at q * r + i) -> float32 [2q][r], [2q + 1][r] (exact); the
 * AVX2 twin of dg_widen_pairs_avx512 (pre-packed BF16 panels under float32 kernels). */
void dg_widen_pairs_avx2(const uint32_t *src, int64_t pairs, int r, uint32_t *dst) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int64_t q = 0; q < pairs; ++q) {
        const uint32_t *s = src + q * r;
        uint32_t *lo = dst + 2 * q * r, *up = lo + r;
        int i = 0;
        for (; i + 8 <= r; i += 8) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(s + i));
            _mm256_storeu_si256((__m256i *)(lo + i), _mm256_slli_epi32(w, 16));
            _mm256_storeu_si256((__m256i *)(up + i), _mm256_and_si256(w, hi));
        }
        for (; i < r; ++i) {
            lo[i] = s[i] << 16;
            up[i] = s[i] & 0xffff0000u;
        }
    }
}
