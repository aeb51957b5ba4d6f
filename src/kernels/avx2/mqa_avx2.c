/* mqa_avx2.c - AVX2/FMA/F16C MQA logits kernels (see mqa_kernels.h): E4M3 conversion through
 * FP16, a register-blocked transposing pack and the FP32 FMA tile of 6 heads x 16 kv rows
 * (12 ymm sums) per pass over d. */
#include "../mqa_kernels.h"

#include <immintrin.h>
#include <string.h>

#define NW DG_MQA_NW_AVX2
#define MH 6

/* 16 E4M3 bytes -> value * 2^-8 (see mqa_avx512.c for the FP16 trick); NaN codes patched. */
static inline void fp8_16(const uint8_t *src, float *out) {
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(s, 7), _mm256_set1_epi16((short)0xbf80));
    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    const __m256i e = _mm256_set1_epi16(0x3f80);
    if (__builtin_expect(!_mm256_testz_si256(_mm256_cmpeq_epi16(_mm256_and_si256(h, e), e), _mm256_set1_epi8(-1)),
                         0)) {
        const __m256i nan16 = _mm256_cmpeq_epi16(_mm256_and_si256(h, e), e);
        const __m256 nlo = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(nan16)));
        const __m256 nhi = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(nan16, 1)));
        lo = _mm256_blendv_ps(lo, _mm256_set1_ps(__builtin_nanf("")), nlo);
        hi = _mm256_blendv_ps(hi, _mm256_set1_ps(__builtin_nanf("")), nhi);
    }
    _mm256_storeu_ps(out, lo);
    _mm256_storeu_ps(out + 8, hi);
}

/* 32 E2M1 codes (16 bytes, low nibble first) times scale s -> out[0 .. 32): the magnitude from
 * an 8-entry table (VPERMPS reads the index's low 3 bits), the sign bit moved to bit 31, one
 * float32 product: the values of the portable convert. */
static inline void fp4_32(const uint8_t *src, float s, float *out) {
    const __m256 lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), sv = _mm256_set1_ps(s);
    const __m128i b = _mm_loadu_si128((const __m128i *)src), nib = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, nib), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
    const __m128i c[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)}; /* k order */
    for (int q = 0; q < 4; ++q) {
        const __m256i idx = _mm256_cvtepu8_epi32(q & 1 ? _mm_unpackhi_epi64(c[q >> 1], c[q >> 1]) : c[q >> 1]);
        const __m256 mag = _mm256_permutevar8x32_ps(lut, idx);
        const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
        _mm256_storeu_ps(out + 8 * q, _mm256_mul_ps(_mm256_or_ps(mag, _mm256_castsi256_ps(sign)), sv));
    }
}

void dg_mqa_convert_avx2(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *out) {
    if (fmt == DG_MQA_FP4) {
        if (d % 32 != 0) { /* one UE8M0 scale per 32 elements: whole blocks only */
            dg_mqa_convert_generic(rows, sf, n, d, fmt, out);
            return;
        }
        for (int r = 0; r < n; ++r)
            for (int64_t k = 0; k < d; k += 32)
                fp4_32(rows[r] + k / 2, dg_ue8m0_to_float((uint8_t)(sf[r] >> (8 * (k / 32)))), out + (int64_t)r * d + k);
        return;
    }
    const int64_t d16 = d & ~(int64_t)15;
    for (int r = 0; r < n; ++r) {
        float *o = out + (int64_t)r * d;
        for (int64_t k = 0; k < d16; k += 16)
            fp8_16(rows[r] + k, o + k);
        if (d16 < d) {
            const uint8_t *tail = rows[r] + d16;
            dg_mqa_convert_generic(&tail, sf, 1, d - d16, DG_MQA_FP8, o + d16);
        }
        if (fmt == DG_MQA_MXFP8)
            dg_mqa_apply_mx_scales(o, d, sf[r]);
    }
}

/* dst[c * ldd + r] = src[r * lds + c] for r, c < 8 (unpack / shuffle / 128-bit lane swaps). */
static inline void transpose8(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* u[i + c]: column c (and c + 4) of rows i..i+3 */
        u[i + 0] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int c = 0; c < 4; ++c) {
        _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
        _mm256_storeu_ps(dst + (c + 4) * ldd, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
    }
}

/* The default panel [d][NW] (mqa_kernels.h), the rows converted first, then transposed in 8 x 8
 * register blocks: the scalar transpose cost about as much as a tile when every panel serves
 * one query (sparse indexer, paged decode with next_n = 1). Rows n..NW-1 are zero. */
void dg_mqa_pack_avx2(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                      float *panel) {
    dg_mqa_convert_avx2(rows, sf, n, d, fmt, tmp);
    memset(tmp + (int64_t)n * d, 0, (size_t)((NW - n) * d) * sizeof(float));
    const int64_t d8 = d & ~(int64_t)7;
    for (int64_t k0 = 0; k0 < d8; k0 += 8)
        for (int c0 = 0; c0 < NW; c0 += 8)
            transpose8(tmp + c0 * d + k0, d, panel + k0 * NW + c0, NW);
    for (int64_t k = d8; k < d; ++k)
        for (int c = 0; c < NW; ++c)
            panel[k * NW + c] = tmp[c * d + k];
}

static inline __attribute__((always_inline)) void heads(const float *q, int64_t d, const float *w,
                                                        const float *panel, int mh, float *sum) {
    __m256 acc[MH][2];
    for (int h = 0; h < mh; ++h)
        acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < d; ++k) {
        const __m256 b0 = _mm256_loadu_ps(panel + k * NW), b1 = _mm256_loadu_ps(panel + k * NW + 8);
        for (int h = 0; h < mh; ++h) {
            const __m256 a = _mm256_broadcast_ss(q + h * d + k);
            acc[h][0] = _mm256_fmadd_ps(a, b0, acc[h][0]);
            acc[h][1] = _mm256_fmadd_ps(a, b1, acc[h][1]);
        }
    }
    __m256 s0 = _mm256_loadu_ps(sum), s1 = _mm256_loadu_ps(sum + 8);
    const __m256 zero = _mm256_setzero_ps();
    for (int h = 0; h < mh; ++h) {
        const __m256 wv = _mm256_set1_ps(w[h]);
        s0 = _mm256_fmadd_ps(wv, _mm256_max_ps(acc[h][0], zero), s0);
        s1 = _mm256_fmadd_ps(wv, _mm256_max_ps(acc[h][1], zero), s1);
    }
    _mm256_storeu_ps(sum, s0);
    _mm256_storeu_ps(sum + 8, s1);
}

void dg_mqa_tile_avx2(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                      const uint8_t *const *pf, int npf) {
    for (int i = 0; i < npf; ++i)
        __builtin_prefetch(pf[i]);
    _mm256_storeu_ps(sum, _mm256_setzero_ps());
    _mm256_storeu_ps(sum + 8, _mm256_setzero_ps());
    for (int64_t h0 = 0; h0 < h; h0 += MH) {
        const float *qh = q + h0 * d, *wh = w + h0;
        switch (h - h0 < MH ? (int)(h - h0) : MH) {
        case 1: heads(qh, d, wh, panel, 1, sum); break;
        case 2: heads(qh, d, wh, panel, 2, sum); break;
        case 3: heads(qh, d, wh, panel, 3, sum); break;
        case 4: heads(qh, d, wh, panel, 4, sum); break;
        case 5: heads(qh, d, wh, panel, 5, sum); break;
        default: heads(qh, d, wh, panel, 6, sum); break;
        }
    }
}
