/*
 * mqa_fp8_pairs.c - the AVX-512 BF16 level's FP8 MQA tiles (see mqa_kernels.h): the dot
 * products over k pairs, on VDPBF16PS where it is the faster instruction (AMD: twice the FP32
 * FMA rate on Zen 4), else on FP32 FMA in the same order (Intel, where VDPBF16PS runs at half
 * the FMA rate); the choice follows the engine's (dg_engine_dpbf16).
 *
 * Order, per lane (head) and kv row: for each k pair j (increasing), acc += q[2j+1] * kv[2j+1],
 * then acc += q[2j] * kv[2j], each rounded once; a pair past an odd d is zeros. That is one
 * VDPBF16PS per pair (converted E4M3 values, value * 2^-8, are exact in BF16 and their products
 * exact in float32; no input, product or partial sum is a denormal: every nonzero sum is a
 * multiple of 2^-34, so the instruction's flushing never applies), and two FMAs per pair in
 * the FMA tile, which therefore gives the same bits. The heads' relu/weight chain is the other
 * kernels' (dg_mqa_head_chain_avx512). Bits differ from the AVX-512 level's tile (one FMA per
 * k in increasing k), as every level's may (mqa_kernels.h).
 *
 * Layouts: VDPBF16PS tile: q as k pairs, qp[j * hp + h] = (q[h][2j] | q[h][2j+1] << 16) as
 * BF16 (zero past d and for h >= h); the panel as BF16 rows [NW][dp], dp = d rounded up to even
 * (zero past d and past n rows). FMA tile: the AVX-512 level's q^T and float rows.
 */
#include "../dpbf16_avx512.h"
#include "../e4m3_bf16_avx512.h"
#include "../mqa_avx512_common.h"

#include <string.h>

#define NW DG_MQA_NW_AVX512
#define NR 6    /* kv rows per register block; NW is a multiple */
#define KC 512  /* d per pass (even), as the AVX-512 tile */

static inline uint32_t bf16_bits(float v) { /* exact: v is a converted E4M3 value (or NaN) */
    uint32_t u;
    memcpy(&u, &v, 4);
    return u >> 16;
}

void dg_mqa_prep_q_pairs(const float *q, int64_t h, int64_t d, float *out) {
    const int64_t hp = dg_align(h, 16), np = (d + 1) / 2;
    uint32_t *qp = (uint32_t *)out;
    for (int64_t j = 0; j < np; ++j)
        for (int64_t hh = 0; hh < hp; ++hh) {
            const uint32_t lo = hh < h ? bf16_bits(q[hh * d + 2 * j]) : 0;
            const uint32_t hi = hh < h && 2 * j + 1 < d ? bf16_bits(q[hh * d + 2 * j + 1]) : 0;
            qp[j * hp + hh] = lo | hi << 16;
        }
}

/* E4M3 codes straight to BF16 rows (no float32 staging): each code's BF16 value by table
 * (dg_e4m3_bf16_avx512), times 2^-8 (the kernels' FP8 unit) and, for MXFP8, its group's scale,
 * by adding to the exponent of every nonzero, non-NaN value: exact, as the values are normal
 * BF16 numbers (FP8; MXFP8 calls take this tile only with in-range scales, mqa_logits.c). NaN
 * codes give the float path's positive quiet NaN. Rows past n, and the pad of an odd d, zero. */
void dg_mqa_pack_pairs(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                       float *panel) {
    (void)tmp;
    const int64_t dp = d + (d & 1);
    uint16_t *p = (uint16_t *)panel;
    const __m512i mag = _mm512_set1_epi16(0x7fff), expo = _mm512_set1_epi16(0x7f80), qnan = _mm512_set1_epi16(0x7fc0);
    for (int r = 0; r < n; ++r) {
        uint16_t *dst = p + (int64_t)r * dp;
        for (int64_t k0 = 0; k0 < d; k0 += 32) {
            const int cnt = d - k0 < 32 ? (int)(d - k0) : 32;
            const __mmask32 m = cnt >= 32 ? 0xffffffffu : (((__mmask32)1 << cnt) - 1);
            __m512i v = dg_e4m3_bf16_avx512(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, rows[r] + k0)));
            const int e = (fmt == DG_MQA_MXFP8 ? (int)((sf[r] >> (8 * (k0 / 32))) & 0xff) - 127 : 0) - 8;
            const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, expo), expo);
            const __mmask32 keep = _mm512_test_epi16_mask(v, mag) & ~nan;
            v = _mm512_mask_add_epi16(v, keep, v, _mm512_set1_epi16((short)(e * 128)));
            v = _mm512_mask_mov_epi16(v, nan, qnan);
            _mm512_mask_storeu_epi16(dst + k0, m, v);
        }
        if (d & 1)
            dst[d] = 0;
    }
    if (n < NW)
        memset(p + (int64_t)n * dp, 0, (size_t)((NW - n) * dp) * sizeof(uint16_t));
}

/* dots[r * hp + 16 v + l] (+)= the pair chain over pairs [0, np) of kv rows r < nr (pairs at
 * kv + r * ldk, in 32-bit words) and qp's head vectors v < nv; from 0 when `first`. */
static inline __attribute__((always_inline)) void dot_block_dp(const uint32_t *qp, int64_t hp, const uint32_t *kv,
                                                               int64_t ldk, int64_t np, int nr, int nv, float *dots,
                                                               int first) {
    __m512 acc[NR][4];
    for (int r = 0; r < nr; ++r)
        for (int v = 0; v < nv; ++v)
            acc[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(dots + r * hp + 16 * v);
    for (int64_t j = 0; j < np; ++j) {
        __m512i a[4];
        for (int v = 0; v < nv; ++v)
            a[v] = _mm512_loadu_si512(qp + j * hp + 16 * v);
        for (int r = 0; r < nr; ++r)
            for (int v = 0; v < nv; ++v)
                acc[r][v] = dg_dpbf16_bcast(acc[r][v], a[v], kv + r * ldk + j);
    }
    for (int r = 0; r < nr; ++r)
        for (int v = 0; v < nv; ++v)
            _mm512_storeu_ps(dots + r * hp + 16 * v, acc[r][v]);
}

/* The same sums from float q^T (qt[k * hp + h]) and float rows (kv[r * ldk + k]), k in [0, kc),
 * two FMAs per pair, odd k first; an odd kc ends with the zero pair's + 0 then its even k. */
static inline __attribute__((always_inline)) void dot_block_fma(const float *qt, int64_t hp, const float *kv,
                                                                int64_t ldk, int64_t kc, int nr, int nv, float *dots,
                                                                int first) {
    __m512 acc[NR][4];
    for (int r = 0; r < nr; ++r)
        for (int v = 0; v < nv; ++v)
            acc[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(dots + r * hp + 16 * v);
    int64_t k = 0;
    for (; k + 1 < kc; k += 2)
        for (int h = 1; h >= 0; --h) { /* odd k first */
            __m512 a[4];
            for (int v = 0; v < nv; ++v)
                a[v] = _mm512_loadu_ps(qt + (k + h) * hp + 16 * v);
            for (int r = 0; r < nr; ++r) {
                const __m512 b = _mm512_set1_ps(kv[r * ldk + k + h]);
                for (int v = 0; v < nv; ++v)
                    acc[r][v] = _mm512_fmadd_ps(b, a[v], acc[r][v]);
            }
        }
    if (k < kc) /* the zero pair's odd product first (+0: it turns a -0 sum into +0), then k */
        for (int r = 0; r < nr; ++r) {
            const __m512 b = _mm512_set1_ps(kv[r * ldk + k]);
            for (int v = 0; v < nv; ++v)
                acc[r][v] = _mm512_fmadd_ps(b, _mm512_loadu_ps(qt + k * hp + 16 * v),
                                            _mm512_add_ps(acc[r][v], _mm512_setzero_ps()));
        }
    for (int r = 0; r < nr; ++r)
        for (int v = 0; v < nv; ++v)
            _mm512_storeu_ps(dots + r * hp + 16 * v, acc[r][v]);
}

#define DISPATCH_NV(call_nv)                                                                       \
    switch (nv) {                                                                                  \
    case 1: call_nv(1); break;                                                                     \
    case 2: call_nv(2); break;                                                                     \
    case 3: call_nv(3); break;                                                                     \
    default: call_nv(4); break;                                                                    \
    }

/* The tiles: 6 kv rows x 4 head vectors per pass over a KC slice of d (as the AVX-512 tile),
 * then the head chain per 16 rows. */
static inline __attribute__((always_inline)) void tile_pairs(const float *q, int64_t h, int64_t d, const float *w,
                                                             const float *panel, float *sum,
                                                             const uint8_t *const *pf, int npf, const int dp_tile) {
    const int64_t hp = dg_align(h, 16), dp = d + (d & 1);
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
                float *dd = dots + r0 * hp + h0;
                if (dp_tile) {
                    const uint32_t *qp = (const uint32_t *)q + k0 / 2 * hp + h0;
                    const uint32_t *kv = (const uint32_t *)panel + r0 * dp / 2 + k0 / 2;
#define DP(NV) dot_block_dp(qp, hp, kv, dp / 2, (kc + 1) / 2, NR, NV, dd, k0 == 0)
                    DISPATCH_NV(DP)
#undef DP
                } else {
                    const float *qt = q + k0 * hp + h0, *kv = panel + r0 * d + k0;
#define FM(NV) dot_block_fma(qt, hp, kv, d, kc, NR, NV, dd, k0 == 0)
                    DISPATCH_NV(FM)
#undef FM
                }
            }
        }
    }
    dg_mqa_head_chain_avx512(dots, hp, h, w, NW, dt, sum);
}

void dg_mqa_tile_pairs_dp(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                          const uint8_t *const *pf, int npf) {
    tile_pairs(q, h, d, w, panel, sum, pf, npf, 1);
}

void dg_mqa_tile_pairs_fma(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                           const uint8_t *const *pf, int npf) {
    tile_pairs(q, h, d, w, panel, sum, pf, npf, 0);
}
