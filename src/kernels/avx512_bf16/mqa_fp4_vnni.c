/*
 * mqa_fp4_vnni.c - FP4 x FP4 MQA logits on VPDPBUSD (AVX-512 VNNI), see mqa_kernels.h.
 *
 * E2M1 codes times 2 are the integers {0, +-1, +-2, +-3, +-4, +-6, +-8, +-12}, so a 32-element
 * group's dot product I = sum q2 * k2 is exact in int32; with the power-of-two UE8M0 scales the
 * group's contribution I * (sq * sk) (sq = 2^(e_q - 128), likewise sk) is exact in float32 and
 * the groups are added in increasing order, one rounding each. VPDPBUSD takes unsigned q: the
 * tile stores q2 + 12 and subtracts 12 * (sum of the group's k2), exactly, in int32.
 *
 * Layouts (bytes). q (per token): qp[d/4][hp][4] = q2 + 12 (heads padded to hp = align(h, 16)
 * with 12, i.e. zero), then sq[d/32][hp] floats (0 for padded heads). Panel: kv2[nw][d] int8,
 * then U[nw][d/32] int32 (group sums of kv2), then sk[nw][d/32] floats; rows past n are zero.
 */
#include "../mqa_avx512_common.h"

#include <string.h>

#define NW DG_MQA_NW_AVX512
#define NR 6

void dg_mqa_q4_prep_vnni(const uint8_t *const *rows, const uint32_t *sf, int64_t h, int64_t d, void *out) {
    const int64_t hp = dg_align(h, 16), groups = d / 32;
    uint8_t *qp = out;
    float *sq = (float *)(void *)(qp + d * hp);
    const __m128i table = _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    uint32_t tmp[32]; /* d <= 128 bytes */
    for (int64_t hh = 0; hh < hp; ++hh) {
        for (int64_t g = 0; g < groups; ++g) {
            if (hh < h) {
                __m128i e0, e1;
                dg_mqa_e2m1_decode32(rows[hh] + 16 * g, table, &e0, &e1);
                _mm_storeu_si128((__m128i *)(void *)(tmp + 8 * g), e0);
                _mm_storeu_si128((__m128i *)(void *)(tmp + 8 * g + 4), e1);
            } else {
                memset(tmp + 8 * g, 12, 32);
            }
            sq[g * hp + hh] = hh < h ? dg_mqa_half_ue8m0(sf[hh], g) : 0.0f;
        }
        for (int64_t kq = 0; kq < d / 4; ++kq)
            memcpy(qp + (kq * hp + hh) * 4, tmp + kq, 4);
    }
}

void dg_mqa_kv4_pack_vnni(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, void *panel) {
    const int64_t groups = d / 32;
    int8_t *kv = panel;
    int32_t *u = (int32_t *)(void *)(kv + NW * d);
    float *sk = (float *)(u + NW * groups);
    const __m128i table = dg_mqa_e2m1x2_table();
    const __m128i bias = _mm_set1_epi8((char)0x80), zero = _mm_setzero_si128();
    for (int r = 0; r < n; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            __m128i e0, e1;
            dg_mqa_e2m1_decode32(rows[r] + 16 * g, table, &e0, &e1);
            _mm_storeu_si128((__m128i *)(void *)(kv + r * d + 32 * g), e0);
            _mm_storeu_si128((__m128i *)(void *)(kv + r * d + 32 * g + 16), e1);
            /* sum of 32 signed bytes: sums of (x + 128) over 8-byte halves, minus 32 * 128 */
            const __m128i s = _mm_add_epi64(_mm_sad_epu8(_mm_xor_si128(e0, bias), zero),
                                            _mm_sad_epu8(_mm_xor_si128(e1, bias), zero));
            u[r * groups + g] = (int32_t)(_mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1)) - 32 * 128;
            sk[r * groups + g] = dg_mqa_half_ue8m0(sf[r], g);
        }
    if (n < NW) {
        memset(kv + (int64_t)n * d, 0, (size_t)((NW - n) * d));
        memset(u + n * groups, 0, (size_t)((NW - n) * groups) * sizeof(int32_t));
        memset(sk + n * groups, 0, (size_t)((NW - n) * groups) * sizeof(float));
    }
}

/* acc += a (unsigned bytes) . b (signed bytes) per 32-bit lane. Inline asm: this GCC does not
 * tie the intrinsic's accumulator to its output and copies all 24 sums around every step. */
static inline __attribute__((always_inline)) __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpbusd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
    return acc;
}

/* dots[r][16 v + l] (+)= the group's exact integer dot times sq * sk, for NR rows, nv vectors. */
static inline __attribute__((always_inline)) void group_block(const uint8_t *qp, int64_t hp, const int8_t *kv,
                                                              int64_t d, const int32_t *u, const float *sk,
                                                              int64_t groups, const float *sq, int nv, float *dots,
                                                              int first) {
    __m512i acc[NR][4];
    for (int r = 0; r < NR; ++r)
        for (int v = 0; v < nv; ++v)
            acc[r][v] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int kq = 0; kq < 8; ++kq) {
        __m512i a[4];
        for (int v = 0; v < nv; ++v)
            a[v] = _mm512_loadu_si512(qp + (kq * hp + 16 * v) * 4);
        for (int r = 0; r < NR; ++r) {
            int32_t word;
            memcpy(&word, kv + r * d + 4 * kq, 4);
            const __m512i b = _mm512_set1_epi32(word);
            for (int v = 0; v < nv; ++v)
                acc[r][v] = dpbusd(acc[r][v], a[v], b);
        }
    }
    for (int r = 0; r < NR; ++r) {
        const __m512i corr = _mm512_set1_epi32(12 * u[r * groups]);
        const __m512 skr = _mm512_set1_ps(sk[r * groups]);
        for (int v = 0; v < nv; ++v) {
            const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][v], corr));
            const __m512 sc = _mm512_mul_ps(_mm512_loadu_ps(sq + 16 * v), skr);
            const __m512 prev = first ? _mm512_setzero_ps() : _mm512_loadu_ps(dots + r * hp + 16 * v);
            _mm512_storeu_ps(dots + r * hp + 16 * v, _mm512_fmadd_ps(f, sc, prev));
        }
    }
}

static void group_rows(const uint8_t *qp, int64_t hp, const int8_t *kv, int64_t d, const int32_t *u, const float *sk,
                       int64_t groups, const float *sq, int nv, float *dots, int first) {
    switch (nv) {
    case 1: group_block(qp, hp, kv, d, u, sk, groups, sq, 1, dots, first); break;
    case 2: group_block(qp, hp, kv, d, u, sk, groups, sq, 2, dots, first); break;
    case 3: group_block(qp, hp, kv, d, u, sk, groups, sq, 3, dots, first); break;
    default: group_block(qp, hp, kv, d, u, sk, groups, sq, 4, dots, first); break;
    }
}

void dg_mqa_tile4_vnni(const void *q, int64_t h, int64_t d, const float *w, const void *panel, float *sum,
                       const uint8_t *const *pf, int npf) {
    const int64_t hp = dg_align(h, 16), groups = d / 32;
    const uint8_t *qp = q;
    const float *sq = (const float *)(const void *)(qp + d * hp);
    const int8_t *kv = panel;
    const int32_t *u = (const int32_t *)(const void *)(kv + NW * d);
    const float *sk = (const float *)(u + NW * groups);
    float dots[NW * hp] __attribute__((aligned(64)));
    float dt[16 * hp] __attribute__((aligned(64)));
    const int64_t blocks = groups * dg_ceil_div(hp, 64) * (NW / NR);
    int64_t blk = 0, pfi = 0;
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t h0 = 0; h0 < hp; h0 += 64) {
            const int nv = (int)((hp - h0) / 16 < 4 ? (hp - h0) / 16 : 4);
            for (int r0 = 0; r0 < NW; r0 += NR, ++blk) {
                for (const int64_t end = npf * (blk + 1) / blocks; pfi < end; ++pfi)
                    _mm_prefetch((const char *)pf[pfi], _MM_HINT_T0);
                group_rows(qp + (g * 8 * hp + h0) * 4, hp, kv + r0 * d + 32 * g, d, u + r0 * groups + g,
                           sk + r0 * groups + g, groups, sq + g * hp + h0, nv, dots + r0 * hp + h0, g == 0);
            }
        }
    dg_mqa_head_chain_avx512(dots, hp, h, w, NW, dt, sum);
}
