/*
 * mqa_avx512_common.h - AVX-512 pieces shared by the MQA logits kernels in src/kernels/avx512/
 * and src/kernels/avx512_bf16/ (include only from files compiled with AVX-512 flags).
 */
#ifndef DG_KERNELS_MQA_AVX512_COMMON_H
#define DG_KERNELS_MQA_AVX512_COMMON_H

#include "mqa_kernels.h"

#include <immintrin.h>

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
