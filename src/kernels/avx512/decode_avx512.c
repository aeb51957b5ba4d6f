/*
 * decode_avx512.c - AVX-512 F decoding kernels (FP32 FMA; Skylake-SP, Cascade Lake, Ice Lake,
 * and Intel CPUs with AVX-512 BF16, where FP32 FMA is the faster instruction): 1 ..
 * DG_DECODE_MAX_M rows of A against up to 32 rows of B read in place (BF16, E4M3 or E2M1 codes,
 * K contiguous), all of K in one call (contract: dg_decode_job in src/engine/engine.h).
 *
 * The design of decode_avx2.c at twice the width: a group is 16 rows of B, not 8. The 128-bit
 * lane l of a register holds rows j + 4l (j = 0..3), so the in-lane 4 x 4 transposes and byte
 * shuffles of the AVX2 kernels leave 32-bit lane r with row r, and every FMA takes 16 rows.
 * With the AVX2 kernels this level read FP8 weights at M = 1 at 40% of DRAM speed and FP4 ones
 * at 30% on Zen 4: their 256-bit widening issues twice the instructions per weight.
 * Products and sums are exactly the engine's chain (engine.h): per k pair the odd k first, per
 * K block of gblk the scale epilogue; E4M3 values are their bits moved into float32 position
 * (value * 2^-120, subnormal codes included) times fm = 2^120 * folded scale (exact: the
 * driver passes only such multipliers); E2M1 values are BF16 pairs from VPSHUFB tables, folded
 * power-of-two scales subtracted from the biased exponents (e2m1_bf16_tables.h). E4M3 NaN codes
 * are only detected (a running byte maximum): the call returns false and the caller
 * recomputes the block on its exact path; so it does for E2M1 scales past 2^E2M1_EMAX.
 */
#include "../../engine/engine.h"
#include "../decode_blocks.h"
#include "../e2m1_bf16_tables.h"

#include <immintrin.h>
#include <string.h>

/* Everything is instantiated per (M, format, groups): the loops below must unroll into registers. */
#define DG_INLINE static inline __attribute__((always_inline))

/* FMT_E4M3F, FMT_E2M1F: E4M3, E2M1 staged as float32 values [k][W] (the small-M kernels' B
 * slice, dg_decode_stage_e4m3_avx512 / _e2m1_avx512), not as pairs */
enum { FMT_BF16 = 0, FMT_E4M3 = 1, FMT_E2M1 = 2, FMT_E4M3F = 3, FMT_E2M1F = 4 };
#define IS_E2M1(fmt) ((fmt) == FMT_E2M1 || (fmt) == FMT_E2M1F)

#define E2M1_EMAX 125 /* as decode_avx2.c: 6 * 2^e overflows past it */
#define CHUNK_K 128   /* k per staged chunk: [128][32] float32 = 16 KiB, in L1 */

/* Bytes of one row piece per step (8 k of BF16 = 16, of E4M3 = 8, 16 k of E2M1 = 8). */
DG_INLINE int piece_bytes(int fmt) { return fmt == FMT_BF16 ? 16 : 8; }

/* BF16 rows j, j + 4, j + 8, j + 12 of a 16-row group (row stride ld bytes) at p, 8 k each,
 * one per 128-bit lane. */
DG_INLINE __m512i load_quad(const uint8_t *p, int64_t ld, int j) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + j * ld)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (j + 4) * ld)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (j + 8) * ld)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + (j + 12) * ld)), 3);
}

/* The first 8 bytes of rows j + 4l in the low half of lane l (the rest zero), j = 0..3. */
DG_INLINE void load_rows16(const uint8_t *p, int64_t ld, __m512i y[4]) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        __m512i v = _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(p + j * ld)));
        v = _mm512_inserti32x4(v, _mm_loadl_epi64((const __m128i *)(p + (j + 4) * ld)), 1);
        v = _mm512_inserti32x4(v, _mm_loadl_epi64((const __m128i *)(p + (j + 8) * ld)), 2);
        y[j] = _mm512_inserti32x4(v, _mm_loadl_epi64((const __m128i *)(p + (j + 12) * ld)), 3);
    }
}

/* 4 x 4 word transpose inside each lane: w[q] = word q of rows 0..15. */
DG_INLINE void transpose4(const __m512i y[4], __m512i w[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(y[0], y[1]), t1 = _mm512_unpackhi_epi32(y[0], y[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(y[2], y[3]), t3 = _mm512_unpackhi_epi32(y[2], y[3]);
    w[0] = _mm512_unpacklo_epi64(t0, t2), w[1] = _mm512_unpackhi_epi64(t0, t2);
    w[2] = _mm512_unpacklo_epi64(t1, t3), w[3] = _mm512_unpackhi_epi64(t1, t3);
}

/*
 * One step of a 16-row E2M1 group (16 k: 8 bytes per row) into dst as 8 registers of BF16
 * pairs (pair b at dst + b * W; 32-bit lane r: row r, k 2b low, 2b + 1 high): decode_avx2.c's
 * stage_step_e2m1 with rows 4l .. 4l + 3 in lane l. sub: the rows' VPSUBUSW subtrahends.
 */
DG_INLINE void stage_step_e2m1(const uint8_t *p, int64_t ld, __m512i sub, const bool scaled, uint32_t *dst,
                                const int W, const bool f32) {
    __m512i y[4];
    load_rows16(p, ld, y);
    /* u[h], lane l: bytes 4h .. 4h + 3 of rows 4l .. 4l + 3, byte-major */
    const __m512i t01 = _mm512_unpacklo_epi8(y[0], y[1]), t23 = _mm512_unpacklo_epi8(y[2], y[3]);
    const __m512i u[2] = {_mm512_unpacklo_epi16(t01, t23), _mm512_unpackhi_epi16(t01, t23)};
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i tlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kE2m1Bf16Lo));
    const __m512i thi =
        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(scaled ? kE2m1Bf16HiBiased : kE2m1Bf16Hi)));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        const __m512i lo = _mm512_and_si512(u[h], low4), hi = _mm512_and_si512(_mm512_srli_epi16(u[h], 4), low4);
        const __m512i c[2] = {_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)}; /* bytes 4h + 2i, + 1 */
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const __m512i l = _mm512_shuffle_epi8(tlo, c[i]), hb = _mm512_shuffle_epi8(thi, c[i]);
            const __m512i w[2] = {_mm512_unpacklo_epi8(l, hb), _mm512_unpackhi_epi8(l, hb)};
#pragma GCC unroll 2
            for (int e = 0; e < 2; ++e) {
                const int b = 4 * h + 2 * i + e; /* byte b of the rows: k pair b */
                const __m512i v = scaled ? _mm512_subs_epu16(w[e], sub) : w[e];
                if (!f32) {
                    _mm512_store_si512(dst + b * W, v);
                } else { /* float32 [k][W]: the pair's halves */
                    _mm512_storeu_si512(dst + 2 * b * W, _mm512_slli_epi32(v, 16));
                    _mm512_storeu_si512(dst + (2 * b + 1) * W, _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
                }
            }
        }
    }
}

/* One step of a 16-row E4M3 group (8 k) into dst as 4 registers of BF16 pairs (pair q at
 * dst + q * W; lane r: row r), each code's sign and 7 other bits in BF16 position (value *
 * 2^-120), for the FMA loop to widen and multiply: decode_avx2.c's stage_step_e4m3_pairs. */
DG_INLINE void e4m3_step_pairs(const uint8_t *p, int64_t ld, __m512i *nanmax, __m512i out[4], __mmask64 *tiny) {
    __m512i y[4];
    load_rows16(p, ld, y);
    /* u[h], lane l: code pairs 2h, 2h + 1 of rows 4l .. 4l + 3, pair-major */
    const __m512i t01 = _mm512_unpacklo_epi16(y[0], y[1]), t23 = _mm512_unpacklo_epi16(y[2], y[3]);
    const __m512i u[2] = {_mm512_unpacklo_epi32(t01, t23), _mm512_unpackhi_epi32(t01, t23)};
    const __m512i zero = _mm512_setzero_si512(), m7f = _mm512_set1_epi8(0x7f);
    if (tiny) /* subnormal codes: exponent bits 0, mantissa bits not */
        *tiny = _mm512_mask_test_epi8_mask(_mm512_testn_epi8_mask(u[0], _mm512_set1_epi8(0x78)), u[0],
                                           _mm512_set1_epi8(0x07)) |
                _mm512_mask_test_epi8_mask(_mm512_testn_epi8_mask(u[1], _mm512_set1_epi8(0x78)), u[1],
                                           _mm512_set1_epi8(0x07));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        *nanmax = _mm512_max_epu8(*nanmax, _mm512_and_si512(u[h], m7f));
        const __m512i c[2] = {_mm512_unpacklo_epi8(u[h], zero), _mm512_unpackhi_epi8(u[h], zero)};
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const __m512i v = _mm512_srai_epi16(_mm512_slli_epi16(c[i], 8), 4); /* sign copies above bit 10 */
            out[2 * h + i] = _mm512_and_si512(v, _mm512_set1_epi16((short)0x87f0));
        }
    }
}

DG_INLINE void stage_step_e4m3_pairs(const uint8_t *p, int64_t ld, uint32_t *dst, __m512i *nanmax, const int W) {
    __m512i v[4];
    e4m3_step_pairs(p, ld, nanmax, v, NULL);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
        _mm512_store_si512(dst + q * W, v[q]);
}

/* An E4M3 value from its code's sign and 7 other bits in float32 position (t: value * 2^-120),
 * exactly, for codes with exponent bits 0 (zero and subnormals) as well, without arithmetic on
 * a subnormal float: exponent + 120 for the others; for those, y = +-2^-7 (1 + m / 8) and the
 * value +-m 2^-9 = 2y -+ 2^-6 (exact), the sign put back for -0. */
DG_INLINE __m512 e4m3_f32_exact(__m512i t) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __mmask16 e0 = _mm512_testn_epi32_mask(t, _mm512_set1_epi32(0x7f800000));
    const __m512 y = _mm512_castsi512_ps(_mm512_add_epi32(t, _mm512_set1_epi32(120 << 23)));
    const __m512 c = _mm512_castsi512_ps(
        _mm512_ternarylogic_epi32(t, sign, _mm512_set1_epi32(0x3c800000), 0xea)); /* (t & sign) | 2^-6 */
    const __m512 v = _mm512_mask_fmsub_ps(y, e0, _mm512_set1_ps(2.0f), c);
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(v), t, sign, 0xf8)); /* v | (t & sign) */
}

/* The same step as float32 values [k][W] (value * 2^-120 times 2^120: exact), for the small-M
 * kernels' B slice. A step with a subnormal code converts every value by e4m3_f32_exact instead
 * of the product: on Intel cores a multiply with a subnormal operand takes a microcode assist
 * (N(0, 1) weights cast to E4M3 without scales, about 1% subnormal codes, staged at half speed
 * on a Sapphire Rapids VM); zeros are not subnormal. The test (a few mask operations per 128
 * codes) runs where such multiplies are slow (guard: dg_decode_job.subnormal_guard). */
DG_INLINE void stage_step_e4m3_f32(const uint8_t *p, int64_t ld, float *dst, __m512i *nanmax, const int W,
                                    const bool guard) {
    __m512i v[4];
    __mmask64 tiny = 0;
    e4m3_step_pairs(p, ld, nanmax, v, guard ? &tiny : NULL);
    const __m512i hi16 = _mm512_set1_epi32((int)0xffff0000u);
    if (tiny) {
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
            _mm512_storeu_ps(dst + 2 * q * W, e4m3_f32_exact(_mm512_slli_epi32(v[q], 16)));
            _mm512_storeu_ps(dst + (2 * q + 1) * W, e4m3_f32_exact(_mm512_and_si512(v[q], hi16)));
        }
        return;
    }
    const __m512 unit = _mm512_set1_ps(0x1p120f);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
        _mm512_storeu_ps(dst + 2 * q * W, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v[q], 16)), unit));
        _mm512_storeu_ps(dst + (2 * q + 1) * W, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(v[q], hi16)), unit));
    }
}

/* The subtrahends of stage_step_e2m1 for 16 rows' power-of-two scales f; *big gets the rows
 * whose scale exceeds 2^E2M1_EMAX. */
DG_INLINE __m512i e2m1_subs(const float *f, __mmask16 *big) {
    const __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(f)), 23),
                                       _mm512_set1_epi32(127));
    *big |= _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(E2M1_EMAX));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(E2M1_BIAS), e), 7),
                                       _mm512_set1_epi32(0xffff));
    return _mm512_or_si512(h, _mm512_slli_epi32(h, 16));
}

/* One step of a 16-row BF16 group (8 k) into dst as 4 registers of BF16 pairs (pair q at
 * dst + q * W; lane r: row r): the rows' words are pairs already, so the 4 x 4 word transposes
 * are the whole step; fma_pairs widens them in registers (float32 staging stored twice the
 * bytes and widened every value in the staging pass). */
DG_INLINE void stage_step_bf16(const uint8_t *p, int64_t ld, uint32_t *dst, const int W) {
    __m512i y[4], w[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
        y[j] = load_quad(p, ld, j);
    transpose4(y, w);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
        _mm512_store_si512(dst + q * W, w[q]);
}

/*
 * NB K blocks side by side: acc[b M + m][g] chained over kc (even) k of block b, which starts
 * kblk k after block b - 1, from the BF16-pair slice buf + b * slice ([kc / 2][16 G] words,
 * each pair widened here: E4M3 then times its multiplier, folded when fold) against A's value
 * (k, row m, block b) at a[k sk + m sm + b sb]. Per pair the odd k first. NB G M independent
 * chains, all rows of A in one pass (up to 16 accumulators), so that from M = 3 on the FMAs
 * issue at their throughput rather than wait on their latency (two rows per pass, as
 * decode_avx2.c's M > 2 kernel, took 1.7 ms at M = 4 for FP8 N 2112, K 7168 on Zen 4, 4x the
 * time to read B); blocks end in their order (decode_body), so the bits are those of one block
 * at a time.
 */
DG_INLINE void fma_pairs(const dg_decode_job *j, const uint32_t *buf, int64_t slice, int64_t k0, int64_t kblk,
                         int64_t kc, const float *a, int64_t sk, int64_t sm, int64_t sb, __m512 acc[][2], const int M,
                         const int G, const int fmt, const int NB, const bool fold) {
    const __m512i hi16 = _mm512_set1_epi32((int)0xffff0000u);
    const __m512 unit = _mm512_set1_ps(0x1p120f);
    __m512 mul[4][2];
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 2
        for (int g = 0; g < G; ++g)
            mul[b][g] = unit;
    for (int64_t kk = 0; kk < kc; kk += 2) {
        if (fold && kk % 16 == 0) /* folded scales: per DG_DECODE_STEP (a divisor of fblk) */
#pragma GCC unroll 4
            for (int b = 0; b < NB; ++b)
#pragma GCC unroll 2
                for (int g = 0; g < G; ++g)
                    mul[b][g] = _mm512_loadu_ps(j->fm + (k0 + b * kblk + kk) / j->fblk * j->lanes + 16 * g);
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) {
            __m512 bv[2][2];
#pragma GCC unroll 2
            for (int g = 0; g < G; ++g) {
                const __m512i w = _mm512_load_si512(buf + b * slice + kk / 2 * 16 * G + 16 * g);
                bv[1][g] = _mm512_castsi512_ps(_mm512_and_si512(w, hi16));
                bv[0][g] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
                if (fmt == FMT_E4M3) {
                    const __m512 f = fold ? mul[b][g] : unit;
                    bv[1][g] = _mm512_mul_ps(bv[1][g], f), bv[0][g] = _mm512_mul_ps(bv[0][g], f);
                }
            }
#pragma GCC unroll 2
            for (int u = 1; u >= 0; --u)
#pragma GCC unroll 8
                for (int m = 0; m < M; ++m) {
                    const __m512 av = _mm512_set1_ps(a[(kk + u) * sk + m * sm + b * sb]);
#pragma GCC unroll 2
                    for (int g = 0; g < G; ++g)
                        acc[b * M + m][g] = _mm512_fmadd_ps(av, bv[u][g], acc[b * M + m][g]);
                }
        }
    }
}

/* One step of group g (rows at p, stride ld) into dst as BF16 pairs: E2M1 by stage_step_e2m1
 * (scales fm[s] as subtrahends), E4M3 with fma_pairs to scale them, BF16 transposed. */
DG_INLINE void stage_group_step(const uint8_t *p, int64_t ld, const float *const *fm, int64_t s, int g, float *dst,
                                __m512i *nanmax, __mmask16 *big, const int fmt, const int W,
                                const bool guard) { /* all as pairs */
    if (IS_E2M1(fmt))
        stage_step_e2m1(p, ld, fm ? e2m1_subs(fm[s] + 16 * g, big) : _mm512_setzero_si512(), fm != NULL,
                        (uint32_t *)dst, W, fmt == FMT_E2M1F);
    else if (fmt == FMT_E4M3)
        stage_step_e4m3_pairs(p, ld, (uint32_t *)dst, nanmax, W);
    else if (fmt == FMT_E4M3F)
        stage_step_e4m3_f32(p, ld, dst, nanmax, W, guard);
    else
        stage_step_bf16(p, ld, (uint32_t *)dst, W);
}

/* Chunk [kk, kk + kc) of the 16 G rows into buf as BF16 pairs [kc / 2][16 G] (FMT_E4M3F:
 * float32 [kc][16 G]). Whole steps of
 * whole rows are read in place, the chunk `ahead` chunks on of every row prefetched into L2
 * meanwhile (the one staged after the FMAs that follow: decode_avx2.c measured one chunk ahead
 * of one staged chunk best); partial ones are copied into a zeroed block first. */
DG_INLINE void stage_chunk(const dg_decode_job *j, int64_t kk, int64_t kc, int64_t full, int64_t bytes, float *buf,
                           uint8_t *tail, __m512i *nanmax, __mmask16 *big, const int fmt, const int G,
                           const int ahead) {
    const int64_t kstep = IS_E2M1(fmt) ? 16 : 8, pb = piece_bytes(fmt), ld = j->ldb;
    const int64_t vpk = fmt == FMT_E4M3F || fmt == FMT_E2M1F ? 1 : 2; /* k per entry: BF16 pairs, or float32 */
    const float *fmrow[2 * CHUNK_K / 8], *const *fm = j->fm ? fmrow : NULL; /* kc <= 2 CHUNK_K (G = 1) */
    for (int64_t s = 0; j->fm && s < kc; s += kstep)
        fmrow[s / kstep] = j->fm + (kk + s) / j->fblk * j->lanes;
    if (kk + kc <= full) {
        const int64_t off = kk / kstep * pb;
        for (int r = 0; r < 16 * G; ++r)
            for (int64_t o = 0; o < kc / kstep * pb; o += 64)
                _mm_prefetch((const char *)(j->b + r * ld + off + ahead * (kc / kstep * pb) + o), _MM_HINT_T1);
        for (int g = 0; g < G; ++g) /* 16 rows' lines at a time */
            for (int64_t s = 0; s < kc; s += kstep)
                stage_group_step(j->b + (int64_t)(16 * g) * ld + off + s / kstep * pb, ld, fm, s / kstep, g,
                                 buf + s / vpk * 16 * G + 16 * g, nanmax, big, fmt, 16 * G, j->subnormal_guard);
        return;
    }
    for (int64_t s = 0; s < kc; s += kstep) {
        const int64_t off = (kk + s) / kstep * pb, valid = bytes - off < pb ? bytes - off : pb;
        memset(tail, 0, 32 * 16);
        for (int r = 0; r < j->rows && valid > 0; ++r)
            memcpy(tail + r * pb, j->b + r * ld + off, (size_t)valid);
        for (int g = 0; g < G; ++g)
            stage_group_step(tail + 16 * g * pb, pb, fm, s / kstep, g, buf + s / vpk * 16 * G + 16 * g, nanmax, big,
                             fmt, 16 * G, j->subnormal_guard);
    }
}

/* The end of K block kb: total = fma(sa * sb, acc, total) per row of A. */
DG_INLINE void block_end(const dg_decode_job *j, int64_t kb, __m512 acc[][2], __m512 total[][2], const int M,
                         const int G) {
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 2
        for (int g = 0; g < G; ++g) {
            const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(j->sa[m * j->sa_stride + kb]),
                                            _mm512_loadu_ps(j->sb + kb * j->lanes + 16 * g));
            total[m][g] = _mm512_fmadd_ps(sc, acc[m][g], total[m][g]);
        }
}

DG_INLINE bool finish(const dg_decode_job *j, __m512 total[DG_DECODE_MAX_M][2], const int M, const int G, const int fmt,
                      __m512i nanmax, __mmask16 big) {
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 2
        for (int g = 0; g < G; ++g)
            _mm512_storeu_ps(j->out + m * j->lanes + 16 * g, total[m][g]);
    if (fmt == FMT_E4M3) /* a byte 0x7f: a NaN code was read */
        return !_mm512_cmpeq_epi8_mask(nanmax, _mm512_set1_epi8(0x7f));
    return !big;
}

static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }

/* K blocks whose chains decode_body runs side by side at M rows of A and G groups of 16 rows,
 * for BF16 rows below 4 chains: toward 8 (two 512-bit FMA pipes on Intel server cores, latency
 * 4) where the slices stay within 16 KiB (4 KiB per block and group). Measured on Zen 4
 * (DG_ISA=avx512): BF16 M = 1 (32 rows, one thread, B in L2) 55 -> 40 us with two blocks; at
 * M = 2 two blocks were slower than one (BF16 62 -> 72 us, FP8 117 -> 121-126). Codes (their FMA
 * loop has more work per chain) only below 2 chains: FP8 M = 1 with 32 rows from DRAM (2
 * threads) took 1.03 ms with two blocks against 0.94 with one, pre-packed 1.00 against 0.91. */
#define BLOCKS_IN_FLIGHT(M, G, fmt)                                                          \
    ((M) * (G) >= ((fmt) == FMT_BF16 ? 4 : 2) ? 1                                          \
     : 8 / ((M) * (G)) < 4 / (G)              ? 8 / ((M) * (G))                            \
                                              : 4 / (G))

/*
 * The body for M rows of A (1 .. DG_DECODE_MAX_M), format fmt and G groups of 16 rows
 * (constants after inlining). Per chunk of gcd(gblk, CHUNK_K) k (whole chunks per K block):
 * the G groups staged into a slice of BF16 pairs in L1, 16 rows at a time (their lines in
 * flight together: DeepSeek's K make row strides that put all rows of a call in few L1 sets),
 * then G M independent FMA chains over it. Where a K block is one chunk and G M is small,
 * NB = BLOCKS_IN_FLIGHT blocks are staged and their chains interleaved (fma_pairs), A's
 * blocks interleaved into ail so that one pointer serves them; the blocks end in their order.
 * Codes as pairs: E4M3 staged as float32 instead measured alike at M = 4 and 8 (1.46 vs 1.40
 * ms, 2.07 vs 2.02 for N 2112, K 7168 on Zen 4).
 */
DG_INLINE bool decode_body(const dg_decode_job *j, const int M, const int fmt, const int G, const bool fold) {
    const int NB = BLOCKS_IN_FLIGHT(M, G, fmt);
    const int64_t kstep = fmt == FMT_E2M1 ? 16 : 8, pb = piece_bytes(fmt);
    const int64_t kend = (j->k + kstep - 1) / kstep * kstep;
    const int64_t bytes = fmt == FMT_E2M1 ? (j->k + 1) / 2 : fmt == FMT_E4M3 ? j->k : 2 * j->k; /* per row */
    const int64_t gblk = j->gblk, full = j->rows == 16 * G ? bytes / pb * kstep : 0;
    const int64_t chunk = gcd64(gblk, CHUNK_K), slice = CHUNK_K / 2 * 16 * G; /* words per block's slice */
    __m512 total[DG_DECODE_MAX_M][2], acc[DG_DECODE_MAX_M][2]; /* acc: NB M <= 8 rows */
    __m512i nanmax = _mm512_setzero_si512();
    __mmask16 big = 0;
    uint32_t buf[4 * CHUNK_K / 2 * 16] __attribute__((aligned(64))); /* NB G <= 4: 16 KiB */
    float ail[CHUNK_K * 8];                                          /* [k][m][block] */
    uint8_t tail[32 * 16];
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 2
        for (int g = 0; g < G; ++g)
            total[m][g] = _mm512_setzero_ps();
    int64_t kb0 = 0;
    if (NB > 1 && chunk == gblk) /* NB whole blocks at a time */
        for (; kb0 + NB * gblk <= kend; kb0 += NB * gblk) {
#pragma GCC unroll 4
            for (int b = 0; b < NB; ++b)
                stage_chunk(j, kb0 + b * gblk, gblk, full, bytes, (float *)(buf + b * slice), tail, &nanmax, &big, fmt,
                            G, NB);
            dg_decode_interleave_a(j, kb0, gblk, M, NB, ail); /* one pointer for the FMA loop */
#pragma GCC unroll 8
            for (int r = 0; r < NB * M; ++r)
#pragma GCC unroll 2
                for (int g = 0; g < G; ++g)
                    acc[r][g] = _mm512_setzero_ps();
            fma_pairs(j, buf, slice, kb0, gblk, gblk, ail, M * NB, NB, 1, acc, M, G, fmt, NB, fold);
#pragma GCC unroll 4
            for (int b = 0; b < NB; ++b)
                block_end(j, kb0 / gblk + b, acc + b * M, total, M, G);
        }
    for (; kb0 < kend; kb0 += gblk) { /* the rest one block at a time */
        const int64_t kb1 = kb0 + gblk < kend ? kb0 + gblk : kend;
        for (int m = 0; m < M; ++m)
#pragma GCC unroll 2
            for (int g = 0; g < G; ++g)
                acc[m][g] = _mm512_setzero_ps();
        for (int64_t kk = kb0; kk < kb1; kk += chunk) {
            const int64_t kc = kb1 - kk < chunk ? kb1 - kk : chunk;
            stage_chunk(j, kk, kc, full, bytes, (float *)buf, tail, &nanmax, &big, fmt, G, 1);
            fma_pairs(j, buf, 0, kk, 0, kc, j->a + kk, 1, j->lda, 0, acc, M, G, fmt, 1, fold);
        }
        block_end(j, kb0 / gblk, acc, total, M, G);
    }
    return finish(j, total, M, G, fmt, nanmax, big);
}

/* 16 rows per call: one group (one chain per row of A); up to 32: two (measured at M = 1 on
 * Zen 4 from DRAM, N 2112, K 7168: FP8 16 rows 1.04-1.10 ms, 32 0.91-0.92; four groups of 16
 * at M <= 2 were no faster for FP8 and FP4 and 1.5x slower for BF16). Each shape is a function
 * of its own (inlined into one dispatcher, GCC allocates registers over all of them); E4M3 at
 * M <= 2 also with its folded scales as a constant choice (fold: mul registers per block),
 * from M = 3 on as a run-time one. */
#define SHAPE(name, body) \
    static __attribute__((noinline)) bool name(const dg_decode_job *j) { return body; }
#define SHAPES_G(fmt, s, G, fold)                                        \
    SHAPE(s##_m1_g##G, decode_body(j, 1, fmt, G, fold))                  \
    SHAPE(s##_m2_g##G, decode_body(j, 2, fmt, G, fold))                  \
    SHAPE(s##_m3_g##G, decode_body(j, 3, fmt, G, fmt == FMT_E4M3 && j->fm)) \
    SHAPE(s##_m4_g##G, decode_body(j, 4, fmt, G, fmt == FMT_E4M3 && j->fm)) \
    SHAPE(s##_m5_g##G, decode_body(j, 5, fmt, G, fmt == FMT_E4M3 && j->fm)) \
    SHAPE(s##_m6_g##G, decode_body(j, 6, fmt, G, fmt == FMT_E4M3 && j->fm)) \
    SHAPE(s##_m7_g##G, decode_body(j, 7, fmt, G, fmt == FMT_E4M3 && j->fm)) \
    SHAPE(s##_m8_g##G, decode_body(j, 8, fmt, G, fmt == FMT_E4M3 && j->fm))
#define SHAPES(fmt, s) SHAPES_G(fmt, s, 1, false) SHAPES_G(fmt, s, 2, false)
/* Shape (j->m, groups) of s; M <= 2 of sf instead when fold. */
#define PICK_G(s, sf, G, fold)                                                         \
    switch (j->m) {                                                                    \
    case 1: return (fold) ? sf##_m1_g##G(j) : s##_m1_g##G(j);                          \
    case 2: return (fold) ? sf##_m2_g##G(j) : s##_m2_g##G(j);                          \
    case 3: return s##_m3_g##G(j);                                                     \
    case 4: return s##_m4_g##G(j);                                                     \
    case 5: return s##_m5_g##G(j);                                                     \
    case 6: return s##_m6_g##G(j);                                                     \
    case 7: return s##_m7_g##G(j);                                                     \
    default: return s##_m8_g##G(j);                                                    \
    }
#define DECODE_FN(name, s, sf, fold)  \
    bool name(const dg_decode_job *j) { \
        if (j->rows <= 16) {            \
            PICK_G(s, sf, 1, fold)      \
        }                               \
        PICK_G(s, sf, 2, fold)          \
    }

SHAPES(FMT_BF16, bf16)
SHAPES(FMT_E4M3, e4m3)
SHAPE(e4m3f_m1_g1, decode_body(j, 1, FMT_E4M3, 1, true))
SHAPE(e4m3f_m2_g1, decode_body(j, 2, FMT_E4M3, 1, true))
SHAPE(e4m3f_m1_g2, decode_body(j, 1, FMT_E4M3, 2, true))
SHAPE(e4m3f_m2_g2, decode_body(j, 2, FMT_E4M3, 2, true))
SHAPES(FMT_E2M1, e2m1)

DECODE_FN(dg_decode_bf16_avx512, bf16, bf16, false)
DECODE_FN(dg_decode_e4m3_avx512, e4m3, e4m3f, j->fm != NULL)
DECODE_FN(dg_decode_e2m1_avx512, e2m1, e2m1, false)

/* The small-M kernels' B slice (smallm.c, stage_b) from E4M3 codes: rows [0, j->rows) (<= 32)
 * for k in [k0, k0 + kc) (k0 a multiple of 8) as float32 [kc][32] at dst, which has room for kc
 * rounded up to 8; unfolded scales (j->fm NULL). False: an E4M3 NaN code was read (dst is then
 * garbage; the caller stages the slice its exact way). decode_avx2.c's dg_decode_stage_e4m3_avx2
 * at twice the width. */
bool dg_decode_stage_e4m3_avx512(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst) {
    uint8_t tail[32 * 16];
    __m512i nanmax = _mm512_setzero_si512();
    __mmask16 big = 0;
    const int64_t full = j->rows == 32 ? j->k / 8 * 8 : 0;
    stage_chunk(j, k0, kc, full, j->k, dst, tail, &nanmax, &big, FMT_E4M3F, 2, 1);
    return !_mm512_cmpeq_epi8_mask(nanmax, _mm512_set1_epi8(0x7f));
}

/* The same slice from E2M1 codes (k0 and kc multiples of 16), each 16 k in one pass
 * (stage_step_e2m1 into float32), with folded power-of-two scales (j->fm [k / fblk][j->lanes],
 * lanes 32) or none. False: a scale past 2^E2M1_EMAX (the caller stages the slice its exact way).
 * decode_avx2.c's dg_decode_stage_e2m1_avx2 at twice the width. */
bool dg_decode_stage_e2m1_avx512(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst) {
    uint8_t tail[32 * 16];
    __m512i nanmax = _mm512_setzero_si512();
    __mmask16 big = 0;
    const int64_t bytes = (j->k + 1) / 2, full = j->rows == 32 ? bytes / 8 * 16 : 0;
    for (int64_t kk = k0; kk < k0 + kc; kk += CHUNK_K) /* stage_chunk's scale rows: CHUNK_K at most */
        stage_chunk(j, kk, k0 + kc - kk < CHUNK_K ? k0 + kc - kk : CHUNK_K, full, bytes, dst + (kk - k0) * 32, tail,
                    &nanmax, &big, FMT_E2M1F, 2, 1);
    return !big;
}
