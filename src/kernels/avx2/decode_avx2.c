/*
 * decode_avx2.c - AVX2 decoding kernels: 1 .. DG_DECODE_MAX_M rows of A against DG_DECODE_ROWS rows of B
 * read in place (BF16, E4M3 or E2M1 codes, K contiguous), all of K in one call (contract:
 * dg_decode_job in src/engine/engine.h).
 *
 * Why not the small-M kernels on a staged B: at M = 1 an MR = 1 kernel keeps 2 FMA chains
 * (one per 8 columns) and waits on FMA latency; here G = DG_DECODE_ROWS / 8 groups of 8 rows make G
 * chains per row of A, and B is staged once per call, not once per A panel.
 *
 * One step takes 8 rows of B and 8 k (BF16, E4M3): the 16-byte pieces of rows j and j + 4
 * share a register (one per 128-bit lane; codes zero-extended to 16 bits first), and a 4 x 4
 * transpose of 32-bit words inside each lane leaves in register q the word (k pair q) of rows
 * 0..7 in lane order. Each word then yields float32 values:
 *   BF16: even = w << 16, odd = w & 0xffff0000 (exact);
 *   E4M3: the code's sign to bit 31 and its 7 other bits to bits 26..20, as float32 that is
 *         value * 2^-120 (subnormal codes included), times fm = 2^120 * folded scale (exact:
 *         the driver only passes multipliers for which it is);
 *         Codes with a zero exponent field (E4M3 subnormals) are float32 subnormals there,
 *         which cost the multiply a slow path: rare in quantized weights (|x| < 2^-6 of a
 *         block scaled to 448), common in uniformly random bytes.
 * E2M1 steps take 16 k by byte shuffles (stage_step_e2m1) into BF16 pairs, each exact: the
 * FMA loop takes their halves as float32 values (as BF16 above), the folded power-of-two
 * scales already applied to the exponents. At M <= 2, E4M3 is staged as BF16 pairs too
 * (stage_step_e4m3_pairs: the float32 bits above, halved), and the FMA loop, which waits on
 * FMA latency there, widens and multiplies them (FP8 1D2D M = 1, 2112 x 7168, Zen 3: about
 * 1.1x).
 * Products and sums are then exactly the engine's chain (engine.h): per k pair, the odd k
 * first; per K block of gblk the scale epilogue. E4M3 NaN codes (S.1111.111) are only
 * detected (a running byte maximum): the call returns false and the caller recomputes the
 * block on its exact path.
 */
#include "../../engine/engine.h"
#include "../decode_blocks.h"
#include "../e2m1_bf16_tables.h"

#include <immintrin.h>
#include <string.h>

/* Everything is instantiated per (M, format): the loops below must unroll into registers. */
#define DG_INLINE static inline __attribute__((always_inline))

enum { FMT_BF16 = 0, FMT_E4M3 = 1, FMT_E2M1 = 2 };

/* Bytes of one row piece per step (8 k of BF16 = 16, of E4M3 = 8, 16 k of E2M1 = 8). */
DG_INLINE int piece_bytes(int fmt) { return fmt == FMT_BF16 ? 16 : 8; }

/* Rows j and j + 4 of an 8-row group (row stride ld bytes) at p, as one register of 16-bit
 * lanes: BF16 values, or codes zero-extended. */
DG_INLINE __m256i load_pair(const uint8_t *p, int64_t ld, int j, int fmt) {
    if (fmt == FMT_BF16)
        return _mm256_loadu2_m128i((const __m128i *)(p + (j + 4) * ld), (const __m128i *)(p + j * ld));
    const __m128i lo = _mm_loadl_epi64((const __m128i *)(p + j * ld));
    const __m128i hi = _mm_loadl_epi64((const __m128i *)(p + (j + 4) * ld));
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(lo, hi));
}

/* 4 x 4 word transpose inside each lane: w[q] = word q of rows 0..7. */
DG_INLINE void transpose4(const __m256i y[4], __m256i w[4]) {
    const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    w[0] = _mm256_unpacklo_epi64(t0, t2), w[1] = _mm256_unpackhi_epi64(t0, t2);
    w[2] = _mm256_unpacklo_epi64(t1, t3), w[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* Element t of each word as float32 (before E4M3's multiplier). */
DG_INLINE __m256 expand(__m256i w, int fmt, int t) {
    if (fmt == FMT_BF16)
        return _mm256_castsi256_ps(t ? _mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u))
                                     : _mm256_slli_epi32(w, 16));
    /* E4M3: code t in the low byte of the word's 16-bit half t */
    const __m256i top = _mm256_slli_epi32(w, t ? 8 : 24);
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(top, 4), _mm256_set1_epi32((int)0x87f00000u)));
}

/* E2M1 widening by VPSHUFB tables, scaled rows through the biased one (e2m1_bf16_tables.h);
 * scales past 2^E2M1_EMAX (where 6 * 2^e overflows, the exact path's infinity) make the call
 * return false. */
#define E2M1_EMAX 125

/* The first 8 bytes of 8 rows (p, stride ld): y[j] = row j in the lower lane, row j + 4 in the upper. */
DG_INLINE void load_rows8(const uint8_t *p, int64_t ld, __m256i y[4]) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
        y[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(p + j * ld))),
                                       _mm_loadl_epi64((const __m128i *)(p + (j + 4) * ld)), 1);
}

/*
 * One step of an 8-row E2M1 group (16 k: 8 bytes per row) into dst as 8 registers of BF16
 * pairs (pair b at dst + b * W; 32-bit lane r: row r, k 2b low, 2b + 1 high), by byte
 * shuffles: the rows' bytes are interleaved so that a register holds one byte of 4 rows per
 * 32 bits (rows 4 .. 7 in the upper lane), each byte split into its two codes side by side,
 * and VPSHUFB gives both bytes of each code's BF16 value, interleaved again into the pairs.
 * About 50 instructions per step, where widening to float32 per value through an 8-entry
 * VPERMPS table and storing that took about 120 (FP8 x FP4 at M = 1, 7168 x 2048 from L3, one
 * Zen 3 core: 3.6-4.5 -> 2.2-3.1 ms with 32 rows per call). sub: the rows' VPSUBUSW
 * subtrahends (scaled), in both halves of lane r.
 */
DG_INLINE void stage_step_e2m1(const uint8_t *p, int64_t ld, __m256i sub, const bool scaled, uint32_t *dst,
                                const bool pairs, const int W) {
    __m256i y[4];
    load_rows8(p, ld, y);
    /* u[h], lane l: bytes 4h .. 4h + 3 of rows 4l .. 4l + 3, byte-major */
    const __m256i t01 = _mm256_unpacklo_epi8(y[0], y[1]), t23 = _mm256_unpacklo_epi8(y[2], y[3]);
    const __m256i u[2] = {_mm256_unpacklo_epi16(t01, t23), _mm256_unpackhi_epi16(t01, t23)};
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i tlo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kE2m1Bf16Lo));
    const __m256i thi =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(scaled ? kE2m1Bf16HiBiased : kE2m1Bf16Hi)));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        const __m256i lo = _mm256_and_si256(u[h], low4), hi = _mm256_and_si256(_mm256_srli_epi16(u[h], 4), low4);
        const __m256i c[2] = {_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi)}; /* bytes 4h + 2i, + 1 */
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const __m256i l = _mm256_shuffle_epi8(tlo, c[i]), hb = _mm256_shuffle_epi8(thi, c[i]);
            const __m256i w[2] = {_mm256_unpacklo_epi8(l, hb), _mm256_unpackhi_epi8(l, hb)};
#pragma GCC unroll 2
            for (int e = 0; e < 2; ++e) {
                const int b = 4 * h + 2 * i + e; /* byte b of the rows: k pair b */
                const __m256i v = scaled ? _mm256_subs_epu16(w[e], sub) : w[e];
                if (pairs) {
                    _mm256_storeu_si256((__m256i *)(dst + b * W), v);
                } else { /* float32 [k][W]: the halves */
                    _mm256_storeu_si256((__m256i *)(dst + 2 * b * W), _mm256_slli_epi32(v, 16));
                    _mm256_storeu_si256((__m256i *)(dst + (2 * b + 1) * W),
                                        _mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
                }
            }
        }
    }
}

/*
 * One step of an 8-row E4M3 group (8 k) into dst as 4 registers of BF16 pairs (pair q at
 * dst + q * W; lane r: row r), for the FMA loop to widen and multiply (fma_slice): the rows'
 * code pairs interleaved into one pair of 4 rows per 32 bits, zero-extended to words, and each
 * code's sign and 7 other bits moved into BF16 position, which makes the BF16 value * 2^-120
 * (stage_step's float32, in half the bytes; subnormal codes included). 5 instructions per 8
 * values where stage_step takes about 9 (with its float32 multiply and stores).
 */
DG_INLINE void stage_step_e4m3_pairs(const uint8_t *p, int64_t ld, uint32_t *dst, __m256i *nanmax, const int W) {
    __m256i y[4];
    load_rows8(p, ld, y);
    /* u[h], lane l: code pairs 2h, 2h + 1 of rows 4l .. 4l + 3, pair-major */
    const __m256i t01 = _mm256_unpacklo_epi16(y[0], y[1]), t23 = _mm256_unpacklo_epi16(y[2], y[3]);
    const __m256i u[2] = {_mm256_unpacklo_epi32(t01, t23), _mm256_unpackhi_epi32(t01, t23)};
    const __m256i zero = _mm256_setzero_si256(), m7f = _mm256_set1_epi8(0x7f);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        *nanmax = _mm256_max_epu8(*nanmax, _mm256_and_si256(u[h], m7f));
        const __m256i c[2] = {_mm256_unpacklo_epi8(u[h], zero), _mm256_unpackhi_epi8(u[h], zero)};
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const __m256i v = _mm256_srai_epi16(_mm256_slli_epi16(c[i], 8), 4); /* sign copies above bit 10 */
            const __m256i keep = _mm256_set1_epi16((short)0x87f0);
            _mm256_storeu_si256((__m256i *)(dst + (2 * h + i) * W), _mm256_and_si256(v, keep));
        }
    }
}

/* One step of an 8-row BF16 group (8 k) into dst as 4 registers of BF16 pairs (pair q at
 * dst + q * W; lane r: row r): the rows' words are already pairs, so the 4 x 4 word transposes
 * are the whole step (half the stores of stage_step's float32, and no widening: fma_pairs
 * widens in registers). */
DG_INLINE void stage_step_bf16_pairs(const uint8_t *p, int64_t ld, uint32_t *dst, const int W) {
    __m256i y[4], w[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
        y[j] = load_pair(p, ld, j, FMT_BF16);
    transpose4(y, w);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
        _mm256_storeu_si256((__m256i *)(dst + q * W), w[q]);
}

/* The subtrahends of stage_step_e2m1 for 8 rows' power-of-two scales f (fm); *big gets the rows
 * whose scale exceeds 2^E2M1_EMAX. */
DG_INLINE __m256i e2m1_subs(const float *f, __m256i *big) {
    const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(_mm256_loadu_ps(f)), 23),
                                       _mm256_set1_epi32(127));
    *big = _mm256_or_si256(*big, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(E2M1_EMAX)));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(E2M1_BIAS), e), 7),
                                       _mm256_set1_epi32(0xffff));
    return _mm256_or_si256(h, _mm256_slli_epi32(h, 16));
}

/* An E4M3 value from expand's float32 (value * 2^-120), exactly, without arithmetic on a
 * subnormal float: decode_avx512.c's e4m3_f32_exact (exponent + 120; for exponent bits 0,
 * 2y -+ 2^-6 and the sign put back for -0). */
DG_INLINE __m256 e4m3_f32_exact(__m256i t) {
    const __m256i s = _mm256_and_si256(t, _mm256_set1_epi32((int)0x80000000u));
    const __m256i e0 = _mm256_cmpeq_epi32(_mm256_and_si256(t, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
    const __m256 y = _mm256_castsi256_ps(_mm256_add_epi32(t, _mm256_set1_epi32(120 << 23)));
    const __m256 f = _mm256_fmsub_ps(y, _mm256_set1_ps(2.0f),
                                     _mm256_castsi256_ps(_mm256_or_si256(s, _mm256_set1_epi32(0x3c800000))));
    return _mm256_or_ps(_mm256_blendv_ps(y, f, _mm256_castsi256_ps(e0)), _mm256_castsi256_ps(s));
}

/* One step of an 8-row group into the float32 panel slice dst [k][W] at lane offset 8g (dst
 * points at lane 8g of the step's first k): rows at p (row stride ld bytes), values times mul
 * (codes only). guard: mul is E4M3's unit 2^120 and such multiplies are slow on this CPU
 * (dg_decode_job.subnormal_guard); then a step with a subnormal code converts its values by
 * e4m3_f32_exact instead (a multiply with a subnormal operand takes a microcode assist on
 * Intel cores: decode_avx512.c, stage_step_e4m3_f32). */
DG_INLINE void stage_step(const uint8_t *p, int64_t ld, __m256 mul, float *dst, __m256i *nanmax, const int fmt,
                           const int W, const bool guard) {
    const int epw = 2; /* elements per word: BF16 values or E4M3 codes (E2M1: stage_step_e2m1) */
    __m256i y[4], w[4];
    /* the least magnitude - 1 (wrapping: zero codes and the words' high bytes 255): below 7 when
     * a subnormal code (magnitude 1 .. 7) is in the step */
    __m256i least = _mm256_set1_epi8(-1);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        y[j] = load_pair(p, ld, j, fmt);
        if (fmt == FMT_E4M3) {
            const __m256i mag = _mm256_and_si256(y[j], _mm256_set1_epi16(0x7f));
            *nanmax = _mm256_max_epu8(*nanmax, mag);
            if (guard)
                least = _mm256_min_epu8(least, _mm256_sub_epi8(mag, _mm256_set1_epi8(1)));
        }
    }
    const bool exact = fmt == FMT_E4M3 && guard &&
                       _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_min_epu8(least, _mm256_set1_epi8(6)), least));
    transpose4(y, w);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
#pragma GCC unroll 4
        for (int t = 0; t < epw; ++t) {
            __m256 v = expand(w[q], fmt, t);
            if (exact)
                v = e4m3_f32_exact(_mm256_castps_si256(v));
            else if (fmt != FMT_BF16)
                v = _mm256_mul_ps(v, mul);
            _mm256_storeu_ps(dst + (epw * q + t) * W, v);
        }
}

/*
 * NB K blocks side by side (decode_body): acc[b M + m][g] chained over kc (even) k of block b,
 * which starts kblk k after block b - 1, from the BF16-pair slice buf + b * slice ([kc / 2][8 G]
 * words, each row's pair widened here: E4M3 then times its multiplier, folded when fold)
 * against A's value (k, row m, block b) at a[k sk + m sm + b sb]. Per pair the odd k first.
 * NB G M independent chains: blocks end in their order (block_end), so each chain and the
 * sums are decode_body's one block at a time; only the FMAs of different blocks interleave.
 */
DG_INLINE void fma_pairs(const dg_decode_job *j, const uint32_t *buf, int64_t slice, int64_t k0, int64_t kblk,
                         int64_t kc, const float *a, int64_t sk, int64_t sm, int64_t sb, __m256 acc[][4], const int M,
                         const int G, const int fmt, const int NB, const bool fold) {
    const __m256 unit = _mm256_set1_ps(0x1p120f);
    __m256 mul[4][4]; /* used when fold: one register (unit) otherwise, so 8 accumulators fit in 16 */
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
            mul[b][g] = unit;
    for (int64_t kk = 0; kk < kc; kk += 2) {
        if (fold && kk % 16 == 0) /* folded scales: per DG_DECODE_STEP (a divisor of fblk) */
#pragma GCC unroll 4
            for (int b = 0; b < NB; ++b)
#pragma GCC unroll 4
                for (int g = 0; g < G; ++g)
                    mul[b][g] = _mm256_loadu_ps(j->fm + (k0 + b * kblk + kk) / j->fblk * j->lanes + 8 * g);
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) {
            __m256 av[2][2]; /* [m][u], M <= 2 (NB > 1 only there); more rows broadcast per group */
            const int MA = M <= 2 ? M : 0; /* rows of A broadcast ahead */
#pragma GCC unroll 2
            for (int m = 0; m < MA; ++m)
                av[m][1] = _mm256_broadcast_ss(a + (kk + 1) * sk + m * sm + b * sb),
                av[m][0] = _mm256_broadcast_ss(a + kk * sk + m * sm + b * sb);
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) { /* one group's two values live at a time: 8 accumulators fit */
                const __m256i w = _mm256_load_si256((const __m256i *)(buf + b * slice + kk / 2 * 8 * G + 8 * g));
                /* odd: the high halves, by a blend with zero (a zero idiom, not one more register) */
                __m256 odd = _mm256_castsi256_ps(_mm256_blend_epi16(w, _mm256_setzero_si256(), 0x55));
                __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
                if (fmt == FMT_E4M3)
                    odd = _mm256_mul_ps(odd, fold ? mul[b][g] : unit),
                    even = _mm256_mul_ps(even, fold ? mul[b][g] : unit);
#pragma GCC unroll 4
                for (int m = 0; m < M; ++m) {
                    const __m256 ao = m < MA ? av[m & 1][1] : _mm256_broadcast_ss(a + (kk + 1) * sk + m * sm + b * sb);
                    const __m256 ae = m < MA ? av[m & 1][0] : _mm256_broadcast_ss(a + kk * sk + m * sm + b * sb);
                    acc[b * M + m][g] = _mm256_fmadd_ps(ae, even, _mm256_fmadd_ps(ao, odd, acc[b * M + m][g]));
                }
            }
        }
    }
}

/* acc[m][g] chained over kc (even) k of the panel slice buf [k][8 G] (pairs: BF16 pairs
 * [k / 2][8 G], E2M1 only here) against A at a (row m at a + m * lda): per pair the odd k first
 * (engine.h). G M independent chains. */
DG_INLINE void fma_slice(const dg_decode_job *j, const float *buf, int64_t k0, int64_t kc, const float *a, int64_t lda,
                         __m256 acc[4][4], const int M, const int G, const int fmt, const bool pairs) {
    if (pairs) {
        fma_pairs(j, (const uint32_t *)buf, 0, k0, 0, kc, a, 1, lda, 0, acc, M, G, fmt, 1, fmt == FMT_E4M3 && j->fm);
        return;
    }
    for (int64_t kk = 0; kk < kc; kk += 2)
#pragma GCC unroll 2
        for (int u = 1; u >= 0; --u) {
            const float *b = buf + (kk + u) * 8 * G;
            __m256 bv[4];
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g)
                bv[g] = _mm256_loadu_ps(b + 8 * g);
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m) {
                const __m256 av = _mm256_broadcast_ss(a + m * lda + kk + u);
#pragma GCC unroll 4
                for (int g = 0; g < G; ++g)
                    acc[m][g] = _mm256_fmadd_ps(av, bv[g], acc[m][g]);
            }
        }
}

#define CHUNK_K 128 /* k per staged chunk: [128][32] float32 = 16 KiB, in L1 */

/* Group g's multiplier of step s: the folded row (fm[s]) or the format's unit. */
DG_INLINE __m256 group_mul(const float *const *fm, int64_t s, int g, float unit) {
    return fm ? _mm256_loadu_ps(fm[s] + 8 * g) : _mm256_set1_ps(unit);
}

/* One step of group g (rows at p, stride ld) into dst: E2M1 by stage_step_e2m1 (scales fm[s]
 * as subtrahends), the other formats by stage_step (times group_mul). */
DG_INLINE void stage_group_step(const uint8_t *p, int64_t ld, const float *const *fm, int64_t s, int g, float unit,
                                float *dst, __m256i *nanmax, __m256i *big, const int fmt, const bool pairs,
                                const int W, const bool guard) {
    if (fmt == FMT_E2M1) /* dst: the step's first pair (pairs W lanes apart) */
        stage_step_e2m1(p, ld, fm ? e2m1_subs(fm[s] + 8 * g, big) : _mm256_setzero_si256(), fm != NULL,
                        (uint32_t *)dst, pairs, W);
    else if (pairs && fmt == FMT_BF16)
        stage_step_bf16_pairs(p, ld, (uint32_t *)dst, W);
    else if (pairs) /* E4M3: its multiplier applied by fma_pairs */
        stage_step_e4m3_pairs(p, ld, (uint32_t *)dst, nanmax, W);
    else
        stage_step(p, ld, group_mul(fm, s, g, unit), dst, nanmax, fmt, W, guard && fm == NULL);
}

/* Chunk [kk, kk + kc) of the 8 G rows as float32 [kc][8 G] in buf (pairs: BF16 pairs [kc / 2][8 G];
 * always for E2M1). */
DG_INLINE void stage_chunk(const dg_decode_job *j, int64_t kk, int64_t kc, int64_t full, int64_t bytes, float *buf,
                           uint8_t *tail, __m256i *nanmax, __m256i *big, const int fmt, const bool pairs,
                           const int G, const int ahead) {
    const int64_t kstep = fmt == FMT_E2M1 ? 16 : 8, pb = piece_bytes(fmt), ld = j->ldb;
    const int64_t vpk = pairs ? 2 : 1; /* k per buffer entry: BF16 pairs, or float32 values */
    const float unit = fmt == FMT_E4M3 ? 0x1p120f : 1.0f;
    const float *fmrow[CHUNK_K / 8], *const *fm = j->fm ? fmrow : NULL;
    for (int64_t s = 0; j->fm && s < kc; s += kstep) /* one division per step, not per group */
        fmrow[s / kstep] = j->fm + (kk + s) / j->fblk * j->lanes;
    if (kk + kc <= full) {
        const int64_t off = kk / kstep * pb;
        /* The chunk `ahead` chunks on of every row, into L2 (whole lines: kc * pb / kstep >= 64):
         * the one staged after the FMAs that follow this staging (decode_body stages `ahead`
         * chunks before their FMAs). Measured on Zen 3 (M = 1, 2 threads, DRAM-cold B, one chunk
         * staged per FMA pass): one chunk ahead 16 GB/s, two 13, none 11-15; more prefetches in
         * flight (bursts of 4-8 chunks) 10-12: they hold L1 miss buffers. */
        for (int r = 0; r < 8 * G; ++r)
            for (int64_t o = 0; o < kc / kstep * pb; o += 64)
                _mm_prefetch((const char *)(j->b + r * ld + off + ahead * (kc / kstep * pb) + o), _MM_HINT_T1);
        for (int g = 0; g < G; ++g) /* 8 rows' lines at a time */
            for (int64_t s = 0; s < kc; s += kstep)
                stage_group_step(j->b + (int64_t)(8 * g) * ld + off + s / kstep * pb, ld, fm, s / kstep, g, unit,
                                 buf + s / vpk * 8 * G + 8 * g, nanmax, big, fmt, pairs, 8 * G, j->subnormal_guard);
        return;
    }
    for (int64_t s = 0; s < kc; s += kstep) { /* partial steps: pieces copied into a zeroed block */
        const int64_t off = (kk + s) / kstep * pb, valid = bytes - off < pb ? bytes - off : pb;
        memset(tail, 0, 32 * 16);
        for (int r = 0; r < j->rows && valid > 0; ++r)
            memcpy(tail + r * pb, j->b + r * ld + off, (size_t)valid);
        for (int g = 0; g < G; ++g)
            stage_group_step(tail + 8 * g * pb, pb, fm, s / kstep, g, unit, buf + s / vpk * 8 * G + 8 * g, nanmax, big,
                             fmt, pairs, 8 * G, j->subnormal_guard);
    }
}

/* The end of K block kb (engine.h): total = fma(sa[m][kb] * sb[kb][lane], acc, total) (unit
 * scales where there are none: the blocked order of engine.h, "Accumulation order"). */
DG_INLINE void block_end(const dg_decode_job *j, int64_t kb, __m256 acc[][4], __m256 total[][4], const int M,
                         const int G) {
#pragma GCC unroll 2
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
            const __m256 sc = _mm256_mul_ps(_mm256_set1_ps(j->sa[m * j->sa_stride + kb]),
                                            _mm256_loadu_ps(j->sb + kb * 32 + 8 * g));
            total[m][g] = _mm256_fmadd_ps(sc, acc[m][g], total[m][g]);
        }
}

DG_INLINE void store_out(const dg_decode_job *j, __m256 total[][4], const int M, const int G) {
#pragma GCC unroll 2
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
            _mm256_storeu_ps(j->out + m * 32 + 8 * g, total[m][g]);
}

static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }

/* K blocks whose chains decode_body runs side by side at M rows of A and G groups of 8 rows:
 * two at M = 1 with 16 rows (4 chains), each block's slice 4 KiB. Measured on Zen 4 (DG_ISA=avx2):
 * four blocks (8 chains, 16 KiB of slices) were slower than two, the slices crowding out the
 * rows' lines in L1 (FP8 M = 1, N 2112, K 7168, 2 threads, cold B: 0.88 ms with four, 0.77 with
 * two; one thread, B in L2, FP8 99 vs 91 us, BF16 alike); FP8 x FP4 (32 rows, blocks of 32 k)
 * took 0.95 ms with two blocks against 0.87 with one. From 4 chains on, one block. */
#define BLOCKS_IN_FLIGHT(M, G) ((M) * (G) >= 4 ? 1 : 4 / ((M) * (G)))
_Static_assert(BLOCKS_IN_FLIGHT(1, 2) * 2 <= 4 && BLOCKS_IN_FLIGHT(1, 4) * 4 <= 4 && BLOCKS_IN_FLIGHT(1, 2) <= 2,
               "decode_body's buf holds NB G <= 4 slices, ail NB M <= 2 rows");

/*
 * The body for M rows of A (1 or 2), format fmt and G groups (constants after inlining). Per
 * chunk of gcd(gblk, CHUNK_K) k (whole chunks per K block), two phases:
 *   staging: the 8 G rows transposed into a slice of BF16 pairs [k / 2][8 G] in L1 (codes
 *     moved into BF16 position, their bits as decode_avx2.c's header says), 8 rows at a time
 *     (8 lines in flight: DeepSeek's K (2048, 7168, ...) make row strides that map all rows to
 *     one or two L1 sets, so touching 16 or 32 rows per step refetched every line from L2 each
 *     step: measured K = 2048 at 0.4x the speed of K = 2080);
 *   FMAs: the pairs widened in registers, G M independent chains over the slice.
 * G M chains alone (2 at M = 1 with 16 rows) wait on FMA latency: where a K block is one chunk,
 * NB = BLOCKS_IN_FLIGHT blocks are staged and their chains interleaved (fma_pairs), then end
 * in their order. Each element's chain and epilogue stay those of engine.h, so the bits are
 * those of one block at a time (BF16 M = 1, N 2112, K 7168, one Zen 4 thread, DG_ISA=avx2:
 * 2.15 ms with 2 chains; see README, Decoding).
 */
DG_INLINE bool decode_body(const dg_decode_job *j, const int M, const int fmt, const int G, const bool fold) {
    const int NB = BLOCKS_IN_FLIGHT(M, G);
    const int64_t kstep = fmt == FMT_E2M1 ? 16 : 8, pb = piece_bytes(fmt);
    const int64_t kend = (j->k + kstep - 1) / kstep * kstep;
    const int64_t bytes = fmt == FMT_E2M1 ? (j->k + 1) / 2 : fmt == FMT_E4M3 ? j->k : 2 * j->k; /* per row */
    const int64_t gblk = j->gblk, full = j->rows == 8 * G ? bytes / pb * kstep : 0;
    const int64_t chunk = gcd64(gblk, CHUNK_K), slice = CHUNK_K / 2 * 8 * G; /* words per block's slice */
    __m256 total[2][4], acc[8][4];
    __m256i nanmax = _mm256_setzero_si256(), big = _mm256_setzero_si256();
    uint32_t buf[4 * CHUNK_K / 2 * 8] __attribute__((aligned(32))); /* NB G <= 4: 8 KiB */
    float ail[CHUNK_K * 2]; /* [k][m][block]: NB M <= 2 */
    uint8_t tail[32 * 16];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
        total[0][g] = total[1][g] = _mm256_setzero_ps();
    int64_t kb0 = 0;
    if (NB > 1 && chunk == gblk) /* NB whole blocks at a time */
        for (; kb0 + NB * gblk <= kend; kb0 += NB * gblk) {
#pragma GCC unroll 4
            for (int b = 0; b < NB; ++b)
                stage_chunk(j, kb0 + b * gblk, gblk, full, bytes, (float *)(buf + b * slice), tail, &nanmax, &big,
                            fmt, true, G, NB);
            dg_decode_interleave_a(j, kb0, gblk, M, NB, ail); /* one pointer for the FMA loop */
#pragma GCC unroll 8
            for (int r = 0; r < NB * M; ++r)
#pragma GCC unroll 4
                for (int g = 0; g < G; ++g)
                    acc[r][g] = _mm256_setzero_ps();
            fma_pairs(j, buf, slice, kb0, gblk, gblk, ail, M * NB, NB, 1, acc, M, G, fmt, NB, fold);
#pragma GCC unroll 4
            for (int b = 0; b < NB; ++b)
                block_end(j, kb0 / gblk + b, acc + b * M, total, M, G);
        }
    for (; kb0 < kend; kb0 += gblk) { /* the rest one block at a time */
        const int64_t kb1 = kb0 + gblk < kend ? kb0 + gblk : kend;
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
            acc[0][g] = acc[1][g] = _mm256_setzero_ps();
        for (int64_t kk = kb0; kk < kb1; kk += chunk) {
            const int64_t kc = kb1 - kk < chunk ? kb1 - kk : chunk;
            stage_chunk(j, kk, kc, full, bytes, (float *)buf, tail, &nanmax, &big, fmt, true, G, 1);
            fma_pairs(j, buf, 0, kk, 0, kc, j->a + kk, 1, j->lda, 0, acc, M, G, fmt, 1, fold);
        }
        block_end(j, kb0 / gblk, acc, total, M, G);
    }
    store_out(j, total, M, G);
    if (fmt == FMT_E4M3) /* a byte 0x7f: a NaN code was read */
        return !_mm256_movemask_epi8(_mm256_cmpeq_epi8(nanmax, _mm256_set1_epi8(0x7f)));
    return !_mm256_movemask_epi8(big);
}

/* Rows [mb, mb + M) of A over a staged slice (fma_slice), their accumulators brought into
 * registers from accm and back. */
DG_INLINE void rows_slice(const dg_decode_job *j, const float *buf, int64_t kk, int64_t kc, int mb,
                          __m256 accm[DG_DECODE_MAX_M][4], const int M, const int G, const int fmt) {
    __m256 acc[4][4];
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
            acc[m][g] = accm[mb + m][g];
    fma_slice(j, buf, kk, kc, j->a + mb * j->lda + kk, j->lda, acc, M, G, fmt, fmt == FMT_E2M1);
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
            accm[mb + m][g] = acc[m][g];
}

/*
 * M = 3 .. DG_DECODE_MAX_M rows of A: each staged chunk of B serves every row, four rows at a
 * time (two with 32 rows of B: their 4 G accumulators in registers, kept in memory between
 * the passes; two rows per pass, latency-bound, had taken 1.9 ms for FP8 at M = 4, N 2112,
 * K 7168 on Zen 4), so B is widened once per call, not once per pass of rows; the small-M
 * kernels widen it per K slice too but pay MR-row panels of A and tile loads (measured here, one thread, FP4 4096 x 4096 with 1x32
 * scales: M = 3..8 took 27-31 ms on the small-M kernel, 2.9x the decode kernel's M = 2).
 * Per element the chain and epilogue are decode_body's, so the bits are those of M = 1 or 2.
 */
DG_INLINE bool decode_body_rows(const dg_decode_job *j, const int fmt, const int G) {
    const int M = j->m, MB = G <= 2 ? 4 : 2; /* rows of A per pass: 4 G accumulators, <= 8 */
    const int64_t kstep = fmt == FMT_E2M1 ? 16 : 8, pb = piece_bytes(fmt);
    const int64_t kend = (j->k + kstep - 1) / kstep * kstep;
    const int64_t bytes = fmt == FMT_E2M1 ? (j->k + 1) / 2 : fmt == FMT_E4M3 ? j->k : 2 * j->k; /* per row */
    const int64_t gblk = j->gblk, full = j->rows == 8 * G ? bytes / pb * kstep : 0;
    const int64_t chunk = gcd64(gblk, CHUNK_K);
    __m256 accm[DG_DECODE_MAX_M][4], totm[DG_DECODE_MAX_M][4];
    __m256i nanmax = _mm256_setzero_si256(), big = _mm256_setzero_si256();
    float buf[CHUNK_K * 32] __attribute__((aligned(32)));
    uint8_t tail[32 * 16];
    for (int m = 0; m < M; ++m)
        for (int g = 0; g < G; ++g)
            totm[m][g] = _mm256_setzero_ps();
    for (int64_t kb0 = 0; kb0 < kend; kb0 += gblk) {
        const int64_t kb1 = kb0 + gblk < kend ? kb0 + gblk : kend, kb = kb0 / gblk;
        for (int m = 0; m < M; ++m)
            for (int g = 0; g < G; ++g)
                accm[m][g] = _mm256_setzero_ps();
        for (int64_t kk = kb0; kk < kb1; kk += chunk) {
            const int64_t kc = kb1 - kk < chunk ? kb1 - kk : chunk;
            stage_chunk(j, kk, kc, full, bytes, buf, tail, &nanmax, &big, fmt, fmt == FMT_E2M1, G, 1);
            for (int mb = 0; mb < M; mb += MB) /* the rows left: a constant in each branch */
                switch (M - mb < MB ? M - mb : MB) {
                case 1: rows_slice(j, buf, kk, kc, mb, accm, 1, G, fmt); break;
                case 2: rows_slice(j, buf, kk, kc, mb, accm, 2, G, fmt); break;
                case 3: rows_slice(j, buf, kk, kc, mb, accm, MB >= 3 ? 3 : 1, G, fmt); break;
                default: rows_slice(j, buf, kk, kc, mb, accm, MB >= 4 ? 4 : 1, G, fmt); break;
                }
        }
        for (int m = 0; m < M; ++m) /* block_end, per row */
            for (int g = 0; g < G; ++g) {
                const __m256 sc = _mm256_mul_ps(_mm256_set1_ps(j->sa[m * j->sa_stride + kb]),
                                                _mm256_loadu_ps(j->sb + kb * 32 + 8 * g));
                totm[m][g] = _mm256_fmadd_ps(sc, accm[m][g], totm[m][g]);
            }
    }
    for (int m = 0; m < M; ++m)
        for (int g = 0; g < G; ++g)
            _mm256_storeu_ps(j->out + m * 32 + 8 * g, totm[m][g]);
    if (fmt == FMT_E4M3)
        return !_mm256_movemask_epi8(_mm256_cmpeq_epi8(nanmax, _mm256_set1_epi8(0x7f)));
    return !_mm256_movemask_epi8(big);
}

/* The small-M kernels' B slice (smallm.c) from E4M3 codes: rows [0, j->rows) (<= 16) for k in
 * [k0, k0 + kc) (k0 a multiple of 8) as float32 [kc][16] at dst, which has room for kc rounded
 * up to 8; the values decode_body stages (fm: NULL, unfolded scales). One pass over the codes
 * instead of widening rows to BF16 and transposing those. False: an E4M3 NaN code was read
 * (dst is then garbage; the caller stages the slice its exact way). */
bool dg_decode_stage_e4m3_avx2(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst) {
    uint8_t tail[32 * 16];
    __m256i nanmax = _mm256_setzero_si256(), big = _mm256_setzero_si256();
    const int64_t full = j->rows == 16 ? j->k / 8 * 8 : 0;
    stage_chunk(j, k0, kc, full, j->k, dst, tail, &nanmax, &big, FMT_E4M3, false, 2, 1);
    return !_mm256_movemask_epi8(_mm256_cmpeq_epi8(nanmax, _mm256_set1_epi8(0x7f)));
}

/* The same slice from E2M1 codes (k0 and kc multiples of 16), each 16 k in one pass
 * (stage_step_e2m1) instead of widening rows to BF16 and transposing those; j->fm: the folded
 * power-of-two scales [k / fblk][j->lanes] or NULL. False: a scale past 2^E2M1_EMAX (the caller
 * stages the slice its exact way). */
bool dg_decode_stage_e2m1_avx2(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst) {
    uint8_t tail[32 * 16];
    __m256i nanmax = _mm256_setzero_si256(), big = _mm256_setzero_si256();
    const int64_t bytes = (j->k + 1) / 2, full = j->rows == 16 ? bytes / 8 * 16 : 0;
    for (int64_t kk = k0; kk < k0 + kc; kk += CHUNK_K) /* stage_chunk's scale rows: CHUNK_K at most */
        stage_chunk(j, kk, k0 + kc - kk < CHUNK_K ? k0 + kc - kk : CHUNK_K, full, bytes, dst + (kk - k0) * 16, tail,
                    &nanmax, &big, FMT_E2M1, false, 2, 1);
    return !_mm256_movemask_epi8(big);
}

/* Up to 32 rows of B per call (cfg->decode_rows; G = 4 groups of 8, fewer rows zero-padded): at
 * M = 1, 4 FMA chains instead of 2 (16 rows) wait less on FMA latency (Zen 3, FP8 x FP4 7168 x
 * 2048 from L3: 1.74 -> 1.49 ms); 1 .. DG_DECODE_MAX_M rows of A. */
/* Each shape its own function: inlined into one dispatcher, GCC allocated registers over all
 * of them and spilled the accumulators of each. M = 1 and 2 per G, for E4M3 also with scales
 * folded into the rows (a constant multiplier otherwise); M > 2 decode_body_rows. */
#define SHAPE(name, body) \
    static __attribute__((noinline)) bool name(const dg_decode_job *j) { return body; }
#define SHAPES(fmt, s, fold)                                                   \
    SHAPE(s##_m1g2, decode_body(j, 1, fmt, 2, fold))                           \
    SHAPE(s##_m2g2, decode_body(j, 2, fmt, 2, fold))                           \
    SHAPE(s##_m1g4, decode_body(j, 1, fmt, 4, fold))                           \
    SHAPE(s##_m2g4, decode_body(j, 2, fmt, 4, fold))
#define PICK(s, j) \
    ((j)->rows <= 16 ? ((j)->m == 1 ? s##_m1g2(j) : s##_m2g2(j)) : ((j)->m == 1 ? s##_m1g4(j) : s##_m2g4(j)))

SHAPES(FMT_BF16, bf16, false)
SHAPES(FMT_E4M3, e4m3, false)
SHAPES(FMT_E4M3, e4m3f, true)
SHAPES(FMT_E2M1, e2m1, false)
SHAPE(bf16_rows_g2, decode_body_rows(j, FMT_BF16, 2))
SHAPE(bf16_rows_g4, decode_body_rows(j, FMT_BF16, 4))
SHAPE(e4m3_rows_g2, decode_body_rows(j, FMT_E4M3, 2))
SHAPE(e4m3_rows_g4, decode_body_rows(j, FMT_E4M3, 4))
SHAPE(e2m1_rows_g2, decode_body_rows(j, FMT_E2M1, 2))
SHAPE(e2m1_rows_g4, decode_body_rows(j, FMT_E2M1, 4))

bool dg_decode_bf16_avx2(const dg_decode_job *j) {
    if (j->m > 2)
        return j->rows <= 16 ? bf16_rows_g2(j) : bf16_rows_g4(j);
    return PICK(bf16, j);
}

bool dg_decode_e4m3_avx2(const dg_decode_job *j) {
    if (j->m > 2)
        return j->rows <= 16 ? e4m3_rows_g2(j) : e4m3_rows_g4(j);
    return j->fm ? PICK(e4m3f, j) : PICK(e4m3, j);
}

bool dg_decode_e2m1_avx2(const dg_decode_job *j) {
    if (j->m > 2)
        return j->rows <= 16 ? e2m1_rows_g2(j) : e2m1_rows_g4(j);
    return PICK(e2m1, j);
}


/*
 * Pre-packed B (src/engine/prepack.c): two 16-row BF16-pair panels (engine.h DG_PACK_BF16; the
 * second at j->b + j->ldb bytes, read only when j->rows > 16), word (k pair q, row i) at
 * q * 16 + i, K zero-padded to j->k (even). The panels are already transposed: no staging,
 * 4 M chains straight from the two streams. Same chain and epilogue as decode_body.
 */
DG_INLINE void pairs_body(const dg_decode_job *j, const int M) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const uint32_t *p0 = (const uint32_t *)j->b;
    const uint32_t *p1 = j->rows > 16 ? (const uint32_t *)(j->b + j->ldb) : p0;
    const int64_t kp = j->k + (j->k & 1), gblk = j->gblk;
    __m256 total[4][4], acc[4][4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g)
        total[0][g] = total[1][g] = _mm256_setzero_ps();
    for (int64_t kb0 = 0; kb0 < kp; kb0 += gblk) {
        const int64_t kb1 = kb0 + gblk < kp ? kb0 + gblk : kp;
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g)
            acc[0][g] = acc[1][g] = _mm256_setzero_ps();
        for (int64_t kk = kb0; kk < kb1; kk += 2) {
            const int64_t q = kk / 2;
            if ((q & 1) == 0) { /* 1 KiB ahead in both streams */
                _mm_prefetch((const char *)(p0 + q * 16 + 256), _MM_HINT_T0);
                _mm_prefetch((const char *)(p1 + q * 16 + 256), _MM_HINT_T0);
            }
            const __m256i w[4] = {_mm256_loadu_si256((const __m256i *)(p0 + q * 16)),
                                  _mm256_loadu_si256((const __m256i *)(p0 + q * 16 + 8)),
                                  _mm256_loadu_si256((const __m256i *)(p1 + q * 16)),
                                  _mm256_loadu_si256((const __m256i *)(p1 + q * 16 + 8))};
#pragma GCC unroll 2
            for (int u = 1; u >= 0; --u) { /* the odd k first */
                __m256 v[4];
#pragma GCC unroll 4
                for (int g = 0; g < 4; ++g)
                    v[g] = _mm256_castsi256_ps(u ? _mm256_and_si256(w[g], hi) : _mm256_slli_epi32(w[g], 16));
#pragma GCC unroll 2
                for (int m = 0; m < M; ++m) {
                    const __m256 av = _mm256_broadcast_ss(j->a + m * j->lda + kk + u);
#pragma GCC unroll 4
                    for (int g = 0; g < 4; ++g)
                        acc[m][g] = _mm256_fmadd_ps(av, v[g], acc[m][g]);
                }
            }
        }
        block_end(j, kb0 / gblk, acc, total, M, 4);
    }
    store_out(j, total, M, 4);
}

bool dg_decode_pairs_avx2(const dg_decode_job *j) {
    if (j->m == 1)
        pairs_body(j, 1);
    else
        pairs_body(j, 2);
    return true;
}
