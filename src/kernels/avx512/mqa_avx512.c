/* mqa_avx512.c - AVX-512 MQA logits kernels (see mqa_kernels.h): E4M3 -> FP16 bit trick ->
 * float32 conversion (the panel is the converted kv rows), q transposed once per token, and
 * the FP32 FMA tile with heads in the lanes (see dg_mqa_tile_avx512). */
#include "../mqa_avx512_common.h"

#include <immintrin.h>
#include <string.h>

#define NW DG_MQA_NW_AVX512

/* 32 (or `cnt` < 32) E4M3 bytes -> value * 2^-8 as float: sign-extended byte << 7 puts the
 * exponent and mantissa in FP16's fields (E4M3's bias 7 = FP16's 15 - 8) and the sign in bit
 * 15; bit 14 (a copy of the sign) is cleared. E4M3 subnormals map to FP16 subnormals. The NaN
 * codes 0x7f / 0xff would come out finite and are patched. */
static inline void fp8_32(const uint8_t *src, int cnt, float *out) {
    const __mmask32 m = cnt >= 32 ? 0xffffffffu : (((__mmask32)1 << cnt) - 1);
    const __m512i s = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, src));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi16(s, 7), _mm512_set1_epi16((short)0xbf80));
    __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    const __m512i e = _mm512_set1_epi16(0x3f80);
    const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, e), e);
    if (__builtin_expect(nan != 0, 0)) {
        lo = _mm512_mask_mov_ps(lo, (__mmask16)nan, _mm512_set1_ps(__builtin_nanf("")));
        hi = _mm512_mask_mov_ps(hi, (__mmask16)(nan >> 16), _mm512_set1_ps(__builtin_nanf("")));
    }
    if (cnt >= 32) {
        _mm512_storeu_ps(out, lo);
        _mm512_storeu_ps(out + 16, hi);
    } else {
        _mm512_mask_storeu_ps(out, (__mmask16)m, lo);
        _mm512_mask_storeu_ps(out + 16, (__mmask16)(m >> 16), hi);
    }
}

/* 16 bytes of packed E2M1 (32 elements, one UE8M0 group) -> value * scale. */
static inline void fp4_32(const uint8_t *src, float scale, float *out) {
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                        -2.0f, -3.0f, -4.0f, -6.0f);
    const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src));
    const __m512 lo = _mm512_permutexvar_ps(_mm512_and_si512(x, _mm512_set1_epi32(15)), table);
    const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), table);
    const __m512i i0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512 sc = _mm512_set1_ps(scale);
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i0, hi), sc));
    _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i1, hi), sc));
}

void dg_mqa_convert_avx512(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *out) {
    for (int r = 0; r < n; ++r) {
        float *o = out + (int64_t)r * d;
        if (fmt == DG_MQA_FP4) {
            for (int64_t k = 0; k < d; k += 32)
                fp4_32(rows[r] + k / 2, dg_ue8m0_to_float((uint8_t)(sf[r] >> (8 * (k / 32)))), o + k);
        } else {
            for (int64_t k = 0; k < d; k += 32)
                fp8_32(rows[r] + k, (int)(d - k < 32 ? d - k : 32), o + k);
            if (fmt == DG_MQA_MXFP8)
                dg_mqa_apply_mx_scales(o, d, sf[r]);
        }
    }
}

/* The AVX-512 panel is the converted rows themselves, row-major [NW][d], zeroed past n: the
 * tile broadcasts kv elements, so no transpose is needed. */
void dg_mqa_pack_avx512(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                        float *panel) {
    (void)tmp;
    dg_mqa_convert_avx512(rows, sf, n, d, fmt, panel);
    if (n < NW)
        memset(panel + (int64_t)n * d, 0, (size_t)((NW - n) * d) * sizeof(float));
}

/* q^T with heads padded to a multiple of 16: qt[k * hp + h] = q[h * d + k] (0 for h >= h). */
void dg_mqa_prep_q_avx512(const float *q, int64_t h, int64_t d, float *qt) {
    const int64_t hp = dg_align(h, 16), h16 = h & ~(int64_t)15, d16 = d & ~(int64_t)15;
    for (int64_t h0 = 0; h0 < h16; h0 += 16)
        for (int64_t k0 = 0; k0 < d16; k0 += 16)
            dg_mqa_transpose16(q + h0 * d + k0, d, qt + k0 * hp + h0, hp);
    for (int64_t k = 0; k < d; ++k)
        for (int64_t hh = k < d16 ? h16 : 0; hh < hp; ++hh)
            qt[k * hp + hh] = hh < h ? q[hh * d + k] : 0.0f;
}

/* dots[r * hp + 16 v + l] (+)= sum over k < kc (increasing, one FMA each) of kv[r * ldk + k] *
 * qt[k * hp + 16 v + l], for r < nr rows and v < nv head vectors (constants after inlining);
 * starts from 0 when `first`, else continues the sums stored in dots (exact float32 round trip). */
static inline __attribute__((always_inline)) void dot_block(const float *qt, int64_t hp, const float *kv, int64_t ldk,
                                                            int64_t kc, int nr, int nv, float *dots, int first) {
    __m512 acc[6][4];
    for (int r = 0; r < nr; ++r)
        for (int v = 0; v < nv; ++v)
            acc[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(dots + r * hp + 16 * v);
    for (int64_t k = 0; k < kc; ++k) {
        __m512 a[4];
        for (int v = 0; v < nv; ++v)
            a[v] = _mm512_loadu_ps(qt + k * hp + 16 * v);
        for (int r = 0; r < nr; ++r) {
            const __m512 b = _mm512_set1_ps(kv[r * ldk + k]);
            for (int v = 0; v < nv; ++v)
                acc[r][v] = _mm512_fmadd_ps(b, a[v], acc[r][v]);
        }
    }
    for (int r = 0; r < nr; ++r)
        for (int v = 0; v < nv; ++v)
            _mm512_storeu_ps(dots + r * hp + 16 * v, acc[r][v]);
}

#define KC 512 /* d per pass (a slice when d is larger); measured: slicing d = 128 into 32s or 64s is slower */
#define NR 6  /* kv rows per register block; NW is a multiple */

static void dots_rows(const float *qt, int64_t hp, const float *kv, int64_t ldk, int64_t kc, int nv, float *dots,
                      int first) {
    switch (nv) {
    case 1: dot_block(qt, hp, kv, ldk, kc, NR, 1, dots, first); break;
    case 2: dot_block(qt, hp, kv, ldk, kc, NR, 2, dots, first); break;
    case 3: dot_block(qt, hp, kv, ldk, kc, NR, 3, dots, first); break;
    default: dot_block(qt, hp, kv, ldk, kc, NR, 4, dots, first); break;
    }
}

/*
 * Heads in the lanes: 6 kv rows x 4 head vectors (24 zmm sums) per pass over a KC slice of d,
 * kv elements broadcast, q^T rows loaded; the sums of the whole panel live in `dots` between
 * slices. Then per 16 kv rows the dot products are transposed to [head][16 rows] and the
 * epilogue runs the same chain as every other kernel: s = fma(w[h], relu(dot[h]), s) for
 * h = 0, 1, ... in increasing order.
 */
void dg_mqa_tile_avx512(const float *qt, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                        const uint8_t *const *pf, int npf) {
    const int64_t hp = dg_align(h, 16);
    float dots[NW * hp] __attribute__((aligned(64)));
    float dt[16 * hp] __attribute__((aligned(64)));
    const int64_t blocks = dg_ceil_div(d, KC) * dg_ceil_div(hp, 64) * (NW / NR);
    int64_t blk = 0, pfi = 0;
    for (int64_t k0 = 0; k0 < d; k0 += KC) {
        const int64_t kc = d - k0 < KC ? d - k0 : KC;
        for (int64_t h0 = 0; h0 < hp; h0 += 64) {
            const int nv = (int)((hp - h0) / 16 < 4 ? (hp - h0) / 16 : 4);
            for (int r0 = 0; r0 < NW; r0 += NR, ++blk) {
                for (const int64_t end = npf * (blk + 1) / blocks; pfi < end; ++pfi)
                    _mm_prefetch((const char *)pf[pfi], _MM_HINT_T0);
                dots_rows(qt + k0 * hp + h0, hp, panel + r0 * d + k0, d, kc, nv, dots + r0 * hp + h0, k0 == 0);
            }
        }
    }
    dg_mqa_head_chain_avx512(dots, hp, h, w, NW, dt, sum);
}
