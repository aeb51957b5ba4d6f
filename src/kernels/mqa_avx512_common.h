/*
 * mqa_avx512_common.h - AVX-512 pieces shared by the MQA logits kernels in src/kernels/avx512/
 * and src/kernels/avx512_bf16/ (include only from files compiled with AVX-512 flags).
 */
#ifndef DG_KERNELS_MQA_AVX512_COMMON_H
#define DG_KERNELS_MQA_AVX512_COMMON_H

#include "mqa_kernels.h"

#include <immintrin.h>
#include <string.h>

/* dst[c * ldd + r] = src[r * lds + c] for r, c < 16. */
static inline void dg_mqa_transpose16(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m512 r[16], t[16], u[16];
    for (int i = 0; i < 16; ++i)
        r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* u[i + c]: column 4L + c of rows i..i+3 in lane L */
        u[i + 0] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int c = 0; c < 4; ++c) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        _mm512_storeu_ps(dst + (c + 0) * ldd, _mm512_shuffle_f32x4(v0, w0, 0x88));
        _mm512_storeu_ps(dst + (c + 8) * ldd, _mm512_shuffle_f32x4(v0, w0, 0xdd));
        _mm512_storeu_ps(dst + (c + 4) * ldd, _mm512_shuffle_f32x4(v1, w1, 0x88));
        _mm512_storeu_ps(dst + (c + 12) * ldd, _mm512_shuffle_f32x4(v1, w1, 0xdd));
    }
}

/* E2M1 codes times 2 as signed bytes, by code (the table of dg_mqa_e2m1_decode32 for the integer kernels). */
static inline __m128i dg_mqa_e2m1x2_table(void) {
    return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

/* 16 packed E2M1 bytes (32 elements) -> 32 bytes through a 16-entry table, element order kept
 * (element 2i is the low nibble of byte i): *e0 elements 0-15, *e1 16-31. */
static inline void dg_mqa_e2m1_decode32(const uint8_t *src, __m128i table, __m128i *e0, __m128i *e1) {
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)src), m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(b, m));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), m));
    *e0 = _mm_unpacklo_epi8(lo, hi);
    *e1 = _mm_unpackhi_epi8(lo, hi);
}

/* 2^(e - 128) for byte g of a packed UE8M0 word: the scale of E2M1 codes taken times 2 (exact;
 * e < 2 gives float32 subnormals; 255 gives inf, like dg_ue8m0_to_float). */
static inline float dg_mqa_half_ue8m0(uint32_t word, int64_t g) {
    const uint32_t e = (word >> (8 * g)) & 0xffu;
    const uint32_t bits = e == 255 ? 0x7f800000u : e >= 2 ? (e - 1) << 23 : (uint32_t)0x200000 << e;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/*
 * The fused epilogue on raw dot products dots[r * hp + h] of nr (a multiple of 16) kv rows:
 * per 16 rows, transpose to [head][16 rows] (in dt, 16 * hp floats) and run the chain
 * s = fma(w[h], relu(dot[h]), s) for h = 0, 1, ... in increasing order; sum[r] = s.
 */
static inline void dg_mqa_head_chain_avx512(const float *dots, int64_t hp, int64_t h, const float *w, int nr,
                                            float *dt, float *sum) {
    const __m512 zero = _mm512_setzero_ps();
    for (int g = 0; g < nr / 16; ++g) {
        for (int64_t h0 = 0; h0 < hp; h0 += 16)
            dg_mqa_transpose16(dots + g * 16 * hp + h0, hp, dt + h0 * 16, 16);
        __m512 s = zero;
        for (int64_t hh = 0; hh < h; ++hh)
            s = _mm512_fmadd_ps(_mm512_set1_ps(w[hh]), _mm512_max_ps(_mm512_load_ps(dt + hh * 16), zero), s);
        _mm512_storeu_ps(sum + 16 * g, s);
    }
}

#endif /* DG_KERNELS_MQA_AVX512_COMMON_H */
