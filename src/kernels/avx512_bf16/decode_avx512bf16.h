/*
 * decode_avx512bf16.h - AVX-512 BF16 decoding kernels: 1 .. DG_DECODE_MAX_M rows of A against
 * DG_DECODE_ROWS (16) rows of B, and (the wide kernels, decode_wide_avx512bf16.c) DG_DECODE_MAX_M + 1 ..
 * DG_DECODE_WIDE_MAX_M rows against 32, read in place (BF16, E4M3 or E2M1 codes, K contiguous), all of K
 * in one call (contract: dg_decode_job in src/engine/engine.h), on VDPBF16PS like the level's
 * small-M and large-M kernels, so every path gives a row of D the same bits.
 *
 * Why: the small-M path stages each K slice of B twice (codes widened into BF16 rows, then the
 * rows transposed into pair panels) and reloads it per A panel; here one step takes 32 k of
 * the 16 rows, puts them in registers with k pair p of the 16 rows in register p (one lane per
 * row), and feeds the pairs straight to VDPBF16PS for every row of A. BF16 rows are loaded and
 * transposed (16 x 16 words); E2M1 and E4M3 codes are put in lanes first and widened by pair
 * after (e2m1_step_dwords, e4m3_half_words), which takes a fraction of the shuffles of widening
 * rows and transposing the result.
 *
 * Values: BF16 as stored; E4M3 and E2M1 codes widened exactly to BF16; a folded power-of-two
 * scale fm (divided by the format's unit, 2^120 for E4M3) is applied after the transpose, per
 * lane, by adding its exponent to every nonzero BF16 value (exact: the driver passes only scales
 * with which value * scale stays a normal number, which is what the small-M path's rounded
 * product gives then). Per element the chain is the engine's: per k pair one VDPBF16PS
 * (odd k, then even k), per K block of gblk the scale epilogue total = fma(sa * sb, acc,
 * total); k pairs past K (rounded up to even) are not part of the chain. E4M3 NaN codes are
 * detected, and so are scales that would overflow BF16: the call returns false and the caller
 * recomputes the block exactly.
 *
 * This header holds the kernels' bodies, inlined with M, the group count, B's format and
 * staging as constants; the entry points that instantiate them are spread over
 * decode_*_avx512bf16.c. Why several files: the instantiations make 2.4 MB of code, and in one
 * translation unit they took GCC 3 minutes at -O3 and the sanitizer and fuzzing builds
 * (ASan + UBSan) far longer, on one core while the other waited; apart they build in parallel.
 * Only those files include it.
 */
#ifndef DG_KERNELS_AVX512BF16_DECODE_AVX512BF16_H
#define DG_KERNELS_AVX512BF16_DECODE_AVX512BF16_H
#include "../../engine/engine.h"
#include "../dpbf16_avx512.h"
#include "../e2m1_bf16_tables.h"
#include "../e4m3_bf16_avx512.h"
#include "../e4m3_bf16_bytes.h"
#include "../transpose16_avx512.h"

#include <immintrin.h>
#include <string.h>

#define DG_INLINE static inline __attribute__((always_inline))

/* FMT_E2M1P: pre-packed E2M1 decode panels (engine.h, DG_DECODE_E2M1P), widened in 128-bit lanes;
 * FMT_E4M3P: pre-packed E4M3 decode panels (DG_DECODE_E4M3P), one k pair of 16 rows per 32 bytes;
 * FMT_E4M3V: E4M3 rows as FMT_E4M3, widened by byte tables (VBMI; dg_decode_job.byte_tables) */
enum { FMT_BF16 = 0, FMT_E4M3 = 1, FMT_E2M1 = 2, FMT_E2M1P = 3, FMT_E4M3P = 4, FMT_E4M3V = 5 };
#define IS_E4M3(fmt) ((fmt) == FMT_E4M3 || (fmt) == FMT_E4M3P || (fmt) == FMT_E4M3V)
#define IS_E4M3_ROWS(fmt) ((fmt) == FMT_E4M3 || (fmt) == FMT_E4M3V)

/* The 16 E2M1 values as BF16, twice: VPERMW reads 5 bits of each index (load_rows_e2m1). */
#define E2M1_BF16_VALUES 0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0, \
                         0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0
static const uint16_t kE2m1Bf16[32] = {E2M1_BF16_VALUES, E2M1_BF16_VALUES};
/* The same biased by 2^E2M1_BIAS, both zeros +0 (e2m1_bf16_tables.h explains it). */
#define E2M1_BF16_BIASED 0x0000, 0x7e00, 0x7e80, 0x7ec0, 0x7f00, 0x7f40, 0x7f80, 0x7fc0, \
                         0x0000, 0xfe00, 0xfe80, 0xfec0, 0xff00, 0xff40, 0xff80, 0xffc0
static const uint16_t kE2m1Bf16Biased[32] = {E2M1_BF16_BIASED, E2M1_BF16_BIASED};

/* Constants of the row widening, hoisted out of the per-row code. */
typedef struct widen_consts {
    __m512i lut, lut_biased; /* lut_biased: kE2m1Bf16Biased, for scaled E2M1 rows */
} widen_consts;

/* The folded scales' exponents a call met, per lane: the largest (hi) and smallest (lo), and
 * the sign and mantissa bits of float scales read in place (bad). Checked once at the call's
 * end (range_ok): accumulating compare masks per block had cost a store-forwarded update of
 * one mask per block and group. */
typedef struct exp_range {
    __m512i lo, hi, bad;
    __m512i nan; /* E4M3 rows: bytes reach 0x7f where a NaN code was met (e4m3_word_pairs) */
} exp_range;

/* Every exponent inside [-100, emax] and every float scale a positive power of two: E2M1
 * 6 * 2^e stays a finite BF16 for e <= 125 (the driver admits scales up to 2^127, where the
 * exact path rounds to infinity), E4M3 448 * 2^e for e <= 119; 2^-100 is the driver's lower
 * bound (dg_decode_fold_exact), kept for scales the kernel reads in place. */
DG_INLINE bool range_ok(const exp_range *r, int emax) {
    return !_mm512_cmpgt_epi32_mask(r->hi, _mm512_set1_epi32(emax)) &&
           !_mm512_cmplt_epi32_mask(r->lo, _mm512_set1_epi32(-100)) && !_mm512_test_epi32_mask(r->bad, r->bad) &&
           !_mm512_cmpeq_epi8_mask(r->nan, _mm512_set1_epi8(0x7f));
}

/* Per-lane exponent adds for the folded scales of fold block q (both 16-bit halves of a word). */
DG_INLINE __m512i exps_of(__m512i e, exp_range *big) {
    big->hi = _mm512_max_epi32(big->hi, e), big->lo = _mm512_min_epi32(big->lo, e);
    const __m512i h = _mm512_and_si512(_mm512_slli_epi32(e, 7), _mm512_set1_epi32(0xffff));
    return _mm512_or_si512(h, _mm512_slli_epi32(h, 16));
}

/* The pre-packed E2M1 panels' form of the same (E2M1_BIAS: e2m1_bf16_tables.h): per lane the subtrahend
 * (E2M1_BIAS - e) << 7 in both halves, in [0x80, 0x7d80] for the e in [-125, 125] that range_ok
 * admits (lanes outside it are recomputed exactly). */
DG_INLINE __m512i subs_of(__m512i e, exp_range *big) {
    big->hi = _mm512_max_epi32(big->hi, e), big->lo = _mm512_min_epi32(big->lo, e);
    const __m512i h = _mm512_and_si512(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(E2M1_BIAS), e), 7),
                                       _mm512_set1_epi32(0xffff));
    return _mm512_or_si512(h, _mm512_slli_epi32(h, 16));
}

/* Where 16 rows (a group, or a wide call's half) find their folded scales: fm ([q][lanes]
 * floats, the unit included), fme (exponent bytes [q][16], 127 = 2^0; unit 1, E2M1P only), or
 * B's own scales in place (sf, E2M1 rows only: dg_decode_job.fs; rows: the lanes that are B's
 * rows, the others read as 2^0). Scales of rows sf_row = 1 apart (MN-major, DeepGEMM's layout
 * for weights) are one load per block; K-major ones (sf_blk = 1) are read 16 words of 16 rows
 * at a time and transposed into tile (word w0 + i of row r in tile[i] lane r): a gather per
 * block took 15% of an M = 1 call on Zen 4. */
typedef struct fold_src {
    const float *fm;
    const uint8_t *fme, *sf;
    int64_t sf_row, sf_blk, words; /* words: scale words per row */
    int sf_packed;
    __mmask16 rows;
    int64_t w0; /* the tile's first word (-1: none yet) */
    __m512i tile[16];
} fold_src;

DG_INLINE void fold_of(const dg_decode_job *j, int r0, fold_src *f) {
    const int rows = j->rows - r0 >= 16 ? 16 : j->rows - r0 > 0 ? j->rows - r0 : 0;
    f->fm = j->fm ? j->fm + r0 : NULL;
    f->fme = j->fme && rows ? j->fme + r0 / 16 * j->fme_group : NULL;
    f->sf = j->fs ? j->fs + 4 * r0 * j->fs_row : NULL;
    f->sf_row = j->fs_row, f->sf_blk = j->fs_blk, f->sf_packed = j->fs_packed;
    const int64_t blocks = j->fblk ? (j->k + j->fblk - 1) / j->fblk : 0;
    f->words = j->fs_packed ? (blocks + 3) / 4 : blocks;
    f->rows = (__mmask16)((1u << rows) - 1);
    f->w0 = -1;
}

/* Scale word w of the 16 rows (rows past f->rows: fill). K-major: words w0 .. w0 + 15 of each
 * row (those inside the row) loaded, then transposed. */
DG_INLINE __m512i sf_words(fold_src *f, int64_t w, __m512i fill) {
    if (f->sf_row == 1)
        return _mm512_mask_loadu_epi32(fill, f->rows, f->sf + 4 * w * f->sf_blk);
    if (f->w0 < 0 || w < f->w0 || w >= f->w0 + 16) { /* K-major: the next 16 words of the rows */
        f->w0 = w - w % 16;
        const int64_t nw = f->words - f->w0;
        const __mmask16 m = (__mmask16)(nw >= 16 ? 0xffffu : (1u << nw) - 1);
        __m512i in[16];
        for (int r = 0; r < 16; ++r)
            in[r] = (f->rows >> r) & 1 ? _mm512_maskz_loadu_epi32(m, f->sf + 4 * (r * f->sf_row + f->w0)) : fill;
        dg_transpose16_epi32(in, f->tile);
    }
    return f->tile[w - f->w0];
}

/* Block q's adds (sub: the subtrahends of subs_of) for the 16 rows of f, their exponents noted in
 * *big. Scales read in place are checked as the driver checks fm (dg_decode_fold_exact, unit 1):
 * positive powers of two (big->bad) in range (range_ok). */
DG_INLINE __m512i scale_exps(fold_src *f, int64_t q, int64_t lanes, int unit_log2, exp_range *big, const bool sub) {
    __m512i e;
    if (f->sf) {
        if (f->sf_packed) {
            const __m512i w = sf_words(f, q >> 2, _mm512_set1_epi32(0x7f7f7f7f));
            e = _mm512_and_si512(_mm512_srli_epi32(w, (unsigned)(8 * (q & 3))), _mm512_set1_epi32(0xff));
        } else {
            const __m512i w = sf_words(f, q, _mm512_set1_epi32(0x3f800000));
            big->bad = _mm512_ternarylogic_epi32(big->bad, w, _mm512_set1_epi32((int)0x807fffffu), 0xf8); /* |= w & m */
            e = _mm512_srli_epi32(w, 23);
        }
        e = _mm512_sub_epi32(e, _mm512_set1_epi32(127));
    } else if (f->fme) {
        e = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(f->fme + q * 16))),
                             _mm512_set1_epi32(127));
    } else {
        const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(f->fm + q * lanes));
        e = _mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(127 + unit_log2));
    }
    return sub ? subs_of(e, big) : exps_of(e, big);
}

/* w times 2^e per lane (e from scale_exps), zeros kept: exact for normal results. */
DG_INLINE __m512i apply_exps(__m512i w, __m512i add) {
    return _mm512_mask_add_epi16(w, _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x7fff)), w, add);
}

/* kE2m1Bf16Lo, kE2m1Bf16Hi (VPSHUFB) and the biased high bytes of scaled panels: e2m1_bf16_tables.h. */

/* Chunk c (64 bytes at s) of a step of a pre-packed E2M1 panel (256 bytes per step, engine.h
 * DG_DECODE_E2M1P) into w[t] = k pair 4c + t of the 16 rows, with no transpose and no lane
 * crossing: chunk c's low nibbles are
 * pairs 4c, 4c + 1 and its high nibbles pairs 4c + 2, 4c + 3, in the byte order that VPSHUFB
 * (the two bytes of each BF16 value by table) and VPUNPCK{L,H}BW (bytes to words) turn into
 * one pair per 32-bit lane, row r in lane r. 11 instructions per 4 pairs, where row loads
 * take 6 per row and the transpose 4 per pair. */
DG_INLINE void widen_panel_chunk(const uint8_t *s, __m512i w[4], const bool biased) {
    const __m512i tlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kE2m1Bf16Lo));
    const __m512i thi =
        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(biased ? kE2m1Bf16HiBiased : kE2m1Bf16Hi)));
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i x = _mm512_loadu_si512(s);
    const __m512i lo = _mm512_and_si512(x, low4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
    const __m512i l0 = _mm512_shuffle_epi8(tlo, lo), h0 = _mm512_shuffle_epi8(thi, lo);
    const __m512i l1 = _mm512_shuffle_epi8(tlo, hi), h1 = _mm512_shuffle_epi8(thi, hi);
    w[0] = _mm512_unpacklo_epi8(l0, h0), w[1] = _mm512_unpackhi_epi8(l0, h0);
    w[2] = _mm512_unpacklo_epi8(l1, h1), w[3] = _mm512_unpackhi_epi8(l1, h1);
}

/* Steps prefetched ahead along a panel (4, 8 and 16 measured alike on Zen 4 at M = 1) */
#define PANEL_AHEAD 4

/* The panel at b (K's steps of `bytes`: 256 for E2M1, 512 for E4M3) PANEL_AHEAD steps past step
 * st, then the first steps of this thread's next call (next, NULL: none): one stream per panel,
 * not 16 row streams. */
DG_INLINE void prefetch_panel(const uint8_t *b, const uint8_t *next, int64_t K, int64_t st, const int bytes) {
    const int64_t steps = (K + 31) / 32, ah = st + PANEL_AHEAD;
    const uint8_t *pf = ah < steps ? b + ah * bytes : next ? next + (ah - steps) * bytes : NULL;
    if (pf)
        for (int c = 0; c < bytes / 64; ++c)
            _mm_prefetch((const char *)pf + 64 * c, _MM_HINT_T0);
}

/* Pair p of a step of a pre-packed E4M3 panel (engine.h, DG_DECODE_E4M3P: 32 bytes, row r's two
 * codes at bytes 2r, 2r + 1) as 16 BF16 pairs, lane r row r: zero-extended to words, the pair
 * already in its lane (no transpose), widened by table as rows are; *nan gets the NaN codes'
 * lanes (their blocks are recomputed exactly). */
DG_INLINE __m512i widen_panel_pair_e4m3(const uint8_t *s, __mmask32 *nan) {
    const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)s));
    const __m512i m7f = _mm512_set1_epi16(0x7f);
    *nan |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(c, m7f), m7f);
    return dg_e4m3_bf16_avx512(c);
}

/* A whole step (4 chunks of 64 bytes at s): w[p], p = 0..15. */
DG_INLINE void load_panel_e2m1(const uint8_t *s, __m512i w[16], const bool biased) {
    for (int c = 0; c < 4; ++c)
        widen_panel_chunk(s + 64 * c, w + 4 * c, biased);
}

/* v with the 16 bytes at p in the 128-bit lane that mask k selects: a merge-masked broadcast
 * load, which uses no shuffle port (compilers turn the intrinsic into VINSERTI32X4, which does:
 * on Zen 4 the shuffles, not the loads, bound this kernel). */
DG_INLINE __m512i merge_lane(__m512i v, __mmask16 k, const uint8_t *p) {
    __asm__("vbroadcasti32x4 %2, %0%{%1%}" : "+v"(v) : "Yk"(k), "m"(*(const __m128i *)(const void *)p));
    return v;
}

/* The 16-byte slices at `off` of 16 B rows in lanes: q[L] holds rows L, L + 4, L + 8, L + 12
 * in its 128-bit lanes 0 .. 3. Rows >= rows and bytes from nbytes on (nbytes < 16) read as zero.
 * Shared by the E2M1 and E4M3 rows, whose bytes are put in lanes first and widened after
 * (e2m1_step_dwords, e4m3_half_words): widening rows, then transposing 16 x 16 words, took
 * 64 lane-crossing shuffles per step on top of the widening's. */
DG_INLINE void row_slices(const uint8_t *b, int64_t ldb, int rows, int nbytes, int64_t off, __m512i q[4]) {
    if (nbytes >= 16 && rows == 16) {
        for (int L = 0; L < 4; ++L) {
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b + L * ldb + off)));
            v = merge_lane(v, 0x00f0, b + (L + 4) * ldb + off);
            v = merge_lane(v, 0x0f00, b + (L + 8) * ldb + off);
            q[L] = merge_lane(v, 0xf000, b + (L + 12) * ldb + off);
        }
        return;
    }
    const __mmask16 bm = (__mmask16)(nbytes >= 16 ? 0xffffu : (1u << (nbytes > 0 ? nbytes : 0)) - 1);
    for (int L = 0; L < 4; ++L) {
        __m128i s[4];
        for (int l = 0; l < 4; ++l)
            s[l] = L + 4 * l < rows ? _mm_maskz_loadu_epi8(bm, b + (L + 4 * l) * ldb + off) : _mm_setzero_si128();
        __m512i v = _mm512_inserti32x4(_mm512_castsi128_si512(s[0]), s[1], 1);
        v = _mm512_inserti32x4(v, s[2], 2);
        q[L] = _mm512_inserti32x4(v, s[3], 3);
    }
}

/* E2M1 rows without per-row widening or the 16 x 16 word transpose: a step's 16 bytes of row r
 * (32 k, one byte per k pair) hold k pairs 4c .. 4c + 3 in their dword c, so 16 row slices in
 * four registers (row_slices) and one in-lane 4 x 4 dword transpose (8 unpacks) give x[c] with
 * row r's dword c in dword r. Pair t of x[c]
 * is then one VPERMW of the table: the low word's index is the byte's low nibble (x >> 8t), the
 * high word's its high nibble (x << (12 - 8t)), each in the word's low 4 bits (VPERMW reads 5:
 * the tables hold the 16 values twice). Per step 12 lane loads (merge_lane), 8 unpacks and 16
 * VPERMW where widening rows took 32 lane-crossing shuffles and the transpose 64. Rows >= rows
 * and bytes past K read as zero (n: the k of the step inside K). */
DG_INLINE void e2m1_step_dwords(const uint8_t *b, int64_t ldb, int rows, int n, int64_t off, __m512i x[4]) {
    __m512i q[4];
    row_slices(b, ldb, rows, (n + 1) / 2, off, q);
    const __m512i t0 = _mm512_unpacklo_epi32(q[0], q[1]), t1 = _mm512_unpackhi_epi32(q[0], q[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(q[2], q[3]), t3 = _mm512_unpackhi_epi32(q[2], q[3]);
    x[0] = _mm512_unpacklo_epi64(t0, t2), x[1] = _mm512_unpackhi_epi64(t0, t2);
    x[2] = _mm512_unpacklo_epi64(t1, t3), x[3] = _mm512_unpackhi_epi64(t1, t3);
    /* odd K: the last byte's high nibble (k = K) is widened as it is; A is +0 there, so its
     * product is a zero, which leaves the chain's sums as they are */
}

/* E4M3 rows, half h of a step (16 bytes of each row at off = k0 + 16h: k pairs 8h .. 8h + 7,
 * one word each) of 16 rows, put in lanes (row_slices), then per lane a 4 x 8 word transpose
 * in 8 in-lane unpacks (16-bit, then 32-bit): y[j] holds k pair 8h + 2j of the lane's four rows
 * in its low qword and pair 8h + 2j + 1 in its high one (e4m3_word_pairs widens them). 16
 * in-lane shuffles per step where widening rows took 16 lane-crossing ones and the 16 x 16
 * transpose 64. nbytes: the half's bytes inside K (<= 0: none, y zero). */
DG_INLINE void e4m3_half_words(const uint8_t *b, int64_t ldb, int rows, int nbytes, int64_t off, __m512i y[4]) {
    if (nbytes <= 0) {
        for (int j = 0; j < 4; ++j)
            y[j] = _mm512_setzero_si512();
        return;
    }
    __m512i q[4];
    row_slices(b, ldb, rows, nbytes, off, q);
    const __m512i a0 = _mm512_unpacklo_epi16(q[0], q[1]), a1 = _mm512_unpackhi_epi16(q[0], q[1]);
    const __m512i b0 = _mm512_unpacklo_epi16(q[2], q[3]), b1 = _mm512_unpackhi_epi16(q[2], q[3]);
    y[0] = _mm512_unpacklo_epi32(a0, b0), y[1] = _mm512_unpackhi_epi32(a0, b0);
    y[2] = _mm512_unpacklo_epi32(a1, b1), y[3] = _mm512_unpackhi_epi32(a1, b1);
}

/* VPERMT2B (AVX512-VBMI) as inline assembly, so that this file keeps its level's flags (Cooper
 * Lake has AVX-512 BF16 without VBMI): byte i of the result is byte idx[i] & 127 of t0:t1. */
DG_INLINE __m512i permt2b(__m512i t0, __m512i idx, __m512i t1) {
    __asm__("vpermt2b %2, %1, %0" : "+v"(t0) : "v"(idx), "v"(t1));
    return t0;
}

/* The two k pairs of y (e4m3_half_words) as BF16 pairs, lane r row r. Byte tables (VBMI, vbmi):
 * the low and high bytes of each value looked up over 128 entries (e4m3_bf16_bytes.h), the sign
 * OR-ed into the high byte, then VPUNPCK{L,H}BW interleave them into each pair's 32-bit lane: 6
 * operations per two pairs. Without VBMI: bytes zero-extended to words (VPUNPCK{L,H}BW), widened
 * by word tables (dg_e4m3_bf16_avx512), 14. NaN codes (their calls are recomputed exactly) raise
 * bytes of big->nan to 0x7f: the high byte table's NaN entry is the only one above 0x43. */
DG_INLINE void e4m3_word_pairs(__m512i y, exp_range *big, __m512i w[2], const bool vbmi) {
    if (vbmi) {
        const __m512i lo = permt2b(_mm512_load_si512(dg_e4m3_bf16_lo), y, _mm512_load_si512(dg_e4m3_bf16_lo + 64));
        const __m512i hm = permt2b(_mm512_load_si512(dg_e4m3_bf16_hi), y, _mm512_load_si512(dg_e4m3_bf16_hi + 64));
        big->nan = _mm512_max_epu8(big->nan, hm);
        const __m512i hi = _mm512_ternarylogic_epi32(hm, y, _mm512_set1_epi8((char)0x80), 0xf8); /* | (y & 0x80) */
        w[0] = _mm512_unpacklo_epi8(lo, hi), w[1] = _mm512_unpackhi_epi8(lo, hi);
        return;
    }
    big->nan = _mm512_max_epu8(big->nan, _mm512_and_si512(y, _mm512_set1_epi8(0x7f)));
    const __m512i z = _mm512_setzero_si512();
    w[0] = dg_e4m3_bf16_avx512(_mm512_unpacklo_epi8(y, z)), w[1] = dg_e4m3_bf16_avx512(_mm512_unpackhi_epi8(y, z));
}

/* Pairs 4c .. 4c + 3 of the 16 rows from x = x[c] of e2m1_step_dwords. */
DG_INLINE void e2m1_dword_pairs(__m512i v, __m512i lut, __m512i w[4]) {
    /* i0: low word x, high word x << 12 (nibbles 0 and 1 in their words' low bits); shifted
     * right by 8 the same dword gives nibbles 2 and 3 there (i1); i2, i3 likewise from x >> 16 */
    const __m512i i0 = _mm512_mask_blend_epi16(0xaaaaaaaau, v, _mm512_slli_epi32(v, 12));
    const __m512i i1 = _mm512_srli_epi32(i0, 8);
    const __m512i i2 = _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(v, 16), _mm512_srli_epi32(v, 4));
    const __m512i i3 = _mm512_srli_epi32(i2, 8);
    w[0] = _mm512_permutexvar_epi16(i0, lut), w[1] = _mm512_permutexvar_epi16(i1, lut);
    w[2] = _mm512_permutexvar_epi16(i2, lut), w[3] = _mm512_permutexvar_epi16(i3, lut);
}

/* Bytes ahead along each of a call's rows when it reads one group of 16 (8 KiB in flight, a
 * quarter of L1D); a call of G groups prefetches 1/G of that per row, the same bytes in flight.
 * On Zen 4 at M = 1 (FP4 rows of 1 KiB, 4 groups) 128 to 2048 bytes per row measured alike. */
#define PREFETCH_AHEAD 512

/* Prefetch for B read as rows: rows [0, rows) at b, `off` bytes into rows of row_bytes. */
DG_INLINE void prefetch_rows(const uint8_t *b, const uint8_t *next, int64_t ldb, int rows, int64_t off,
                             int64_t row_bytes, const int groups) {
    /* Once per cache line: a line PREFETCH_AHEAD / groups bytes ahead of each row (16 short row
     * streams per group); past a row's end, the next block's row (next: the driver's next call
     * on this thread), so that its first lines are not demand misses (they were: FP4 rows of
     * 1 KiB at M = 1 on Zen 5 waited on memory). Into L2, not L1: rows of 7168 bytes fall into
     * four sets of Zen 4's 8-way L1, which 16 rows' current lines and as many prefetched ones
     * fill (E4M3 rows, N 2112, K 7168 from DRAM on Zen 4: M = 4 0.97 -> 0.80 ms, M = 1 and 2
     * 2-3% faster; E2M1 rows at M = 1 alike or faster). */
    const int64_t ahead = off + PREFETCH_AHEAD / groups;
    if (off % 64 == 0)
        for (int r = 0; r < rows; ++r)
            _mm_prefetch(ahead < row_bytes || !next ? (const char *)b + r * ldb + ahead
                                                    : (const char *)next + r * ldb + (ahead - row_bytes), _MM_HINT_T1);
}

/* Rows staged into L1 (dg_decode_job.stage_rows): when a call's rows crowd few L1 sets (row
 * strides of 1, 2 or 4 KiB: DeepSeek's K), the slices above, 16 or 32 bytes of a line per step,
 * found the line evicted by the other rows' lines before the next step read the rest of it, and
 * every step refetched all of its lines from L2 (E4M3 rows at M = 1, N 7168 on Zen 4: K = 4096
 * ran at half the speed of K = 4224). Staged, each line of each row is read once, whole, into
 * a buffer of [rows][64] bytes, and the slices read the buffer. Line c + 1 is copied when the
 * reading enters line c (two buffers), so its stores are done when the slices load them. */
#define STAGE_ROWS DG_DECODE_PANEL_ROWS
typedef struct row_stage {
    _Alignas(64) uint8_t buf[2][STAGE_ROWS * 64];
} row_stage;

/* Line `line` (64 bytes at 64 line) of rows [r0, r1) into dst ([rows][64]), zero past row_bytes. */
DG_INLINE void stage_line(const uint8_t *b, int64_t ldb, int r0, int r1, int64_t line, int64_t row_bytes,
                          uint8_t *dst) {
    const int64_t left = row_bytes - 64 * line;
    if (left >= 64) {
        for (int r = r0; r < r1; ++r)
            _mm512_store_si512(dst + 64 * r, _mm512_loadu_si512(b + r * ldb + 64 * line));
    } else if (left > 0) {
        const __mmask64 m = ((__mmask64)1 << left) - 1;
        for (int r = r0; r < r1; ++r)
            _mm512_store_si512(dst + 64 * r, _mm512_maskz_loadu_epi8(m, b + r * ldb + 64 * line));
    }
}

/* The staged copy ([rows][64]) of the line holding byte off of rows [0, rows) at b (off: a
 * step's first byte; each step reads step_bytes of a row, inside one line). Each step of a line
 * copies its share of the rows' next line (a burst of every row's copy at once measured slower). */
DG_INLINE const uint8_t *stage_at(row_stage *st, const uint8_t *b, int64_t ldb, int rows, int64_t off,
                                  int64_t row_bytes, const int step_bytes) {
    const int64_t line = off / 64;
    const int parts = 64 / step_bytes, part = (int)(off % 64) / step_bytes;
    if (off == 0)
        stage_line(b, ldb, 0, rows, 0, row_bytes, st->buf[0]);
    stage_line(b, ldb, rows * part / parts, rows * (part + 1) / parts, line + 1, row_bytes, st->buf[(line + 1) & 1]);
    return st->buf[line & 1];
}

/* The 32 k from k0 of 16 B rows (b, row stride ldb; rows >= rows read as zero; n = K - k0 of
 * them valid, at most 32): BF16 rows loaded and transposed, E2M1 and E4M3 codes put in lanes
 * and widened by pair (e2m1_step_dwords / e2m1_dword_pairs, e4m3_half_words / e4m3_word_pairs):
 * w[p] = k pair p of the 16 rows. */
DG_INLINE void load_rows(const uint8_t *b, const uint8_t *next, int64_t ldb, int rows, int64_t K, int64_t k0,
                         const widen_consts *wc, const int fmt, const bool biased, exp_range *big, row_stage *st,
                         __m512i w[16]) {
    const int n = K - k0 < 32 ? (int)(K - k0) : 32;
    const int64_t off = fmt == FMT_BF16 ? 2 * k0 : IS_E4M3_ROWS(fmt) ? k0 : k0 / 2; /* bytes into each row */
    const int64_t row_bytes = fmt == FMT_BF16 ? 2 * K : IS_E4M3_ROWS(fmt) ? K : (K + 1) / 2;
    prefetch_rows(b, next, ldb, rows, off, row_bytes, 1);
    int64_t soff = off, sld = ldb; /* where the slices are read: the rows, or their staged lines */
    const uint8_t *src = b;
    if (st && fmt != FMT_BF16) /* BF16 steps read whole lines: nothing to keep */
        src = stage_at(st, b, ldb, rows, off, row_bytes, IS_E4M3_ROWS(fmt) ? 32 : 16), sld = 64, soff = off % 64;
    if (fmt == FMT_E2M1) {
        __m512i x[4];
        e2m1_step_dwords(src, sld, rows, n, soff, x);
        for (int c = 0; c < 4; ++c)
            e2m1_dword_pairs(x[c], biased ? wc->lut_biased : wc->lut, w + 4 * c);
        return;
    }
    if (IS_E4M3_ROWS(fmt)) {
        for (int h = 0; h < 2; ++h) {
            __m512i y[4];
            e4m3_half_words(src, sld, rows, n - 16 * h, soff + 16 * h, y);
            for (int j = 0; j < 4; ++j)
                e4m3_word_pairs(y[j], big, w + 8 * h + 2 * j, fmt == FMT_E4M3V);
        }
        return;
    }
    __m512i in[16];
    const __mmask32 m = (__mmask32)(n >= 32 ? 0xffffffffu : (1u << n) - 1);
    for (int r = 0; r < 16; ++r)
        in[r] = r < rows ? _mm512_maskz_loadu_epi16(m, b + r * ldb + 2 * k0) : _mm512_setzero_si512();
    dg_transpose16_epi32(in, w);
}

/* One step, the 32 k from k0, of 16 B rows: rows read in place (load_rows) or a pre-packed E2M1
 * panel at b (FMT_E2M1P: 256 bytes per step, zero past K and past its rows); w[p] = k pair p
 * of the 16 rows (lane r: row r); folded power-of-two scales fm ([q][32] lanes, this half's
 * first lane) applied. */
DG_INLINE void load_step(const uint8_t *b, const uint8_t *next, int64_t ldb, int rows, int64_t K, int64_t k0,
                         fold_src *fs, int64_t fblk, int64_t lanes, const widen_consts *wc,
                         const int fmt, __mmask32 *nan, exp_range *big, row_stage *st, __m512i w[16]) {
    const int unit_log2 = IS_E4M3(fmt) ? 120 : 0;
    const bool scaled = fmt != FMT_BF16 && (fs->fm || (fmt == FMT_E2M1P && fs->fme) || (fmt == FMT_E2M1 && fs->sf));
    const bool subs = fmt == FMT_E2M1P || fmt == FMT_E2M1; /* E2M1 scales: biased tables (above) */
    if (fmt == FMT_E2M1P) {
        prefetch_panel(b, next, K, k0 / 32, 256);
        load_panel_e2m1(b + (k0 / 32) * 256, w, scaled);
    } else if (fmt == FMT_E4M3P) {
        prefetch_panel(b, next, K, k0 / 32, DG_E4M3P_STEP_BYTES);
        for (int p = 0; p < 16; ++p)
            w[p] = widen_panel_pair_e4m3(b + (k0 / 32) * DG_E4M3P_STEP_BYTES + 32 * p, nan);
    } else {
        load_rows(b, next, ldb, rows, K, k0, wc, fmt, scaled && subs, big, st, w);
    }
    if (scaled) { /* pairs 0-7 at k0, 8-15 at k0 + 16: fblk is a multiple of 16 */
        const int64_t q0 = k0 / fblk, q1 = k0 + 16 < K ? (k0 + 16) / fblk : q0; /* fm has no block past K */
        const __m512i lo = scale_exps(fs, q0, lanes, unit_log2, big, subs);
        const __m512i hi = q1 == q0 ? lo : scale_exps(fs, q1, lanes, unit_log2, big, subs);
        for (int p = 0; p < 16; ++p)
            w[p] = subs ? _mm512_subs_epu16(w[p], p < 8 ? lo : hi) : apply_exps(w[p], p < 8 ? lo : hi);
    }
}


/* K block kq ends: total = fma(sa * sb, acc, total) per row of A (the engine's epilogue), acc = 0;
 * lane0: the first of the 16 B rows (sb's lanes). */
DG_INLINE void close_block(const dg_decode_job *j, int64_t kq, int lane0, __m512 *acc, __m512 *total, const int M) {
    const __m512 sb = _mm512_loadu_ps(j->sb + kq * j->lanes + lane0);
    for (int m = 0; m < M; ++m) {
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(j->sa[m * j->sa_stride + kq]), sb);
        total[m] = _mm512_fmadd_ps(s, acc[m], total[m]);
        acc[m] = _mm512_setzero_ps();
    }
}

/* One step's pairs [0, pe) of 16 B rows (w) for the M rows of A (ab: their pairs of this step),
 * closing the K block that ends inside the step (at pair split, < pe; -1: none). A's pairs are
 * broadcast operands (dg_dpbf16_bcast: at M = 8, rows in place, 0.52 -> 0.44 ms for B 512 x 7168
 * on one Zen 4 core). */
DG_INLINE void step_chain(const dg_decode_job *j, const uint32_t *ab, const __m512i w[16], int pe, int split,
                          int64_t kq, int lane0, __m512 *acc, __m512 *total, const int M) {
    if (pe == 16 && split < 0) { /* the common step: 16 pairs, no block ends inside */
#pragma GCC unroll 16
        for (int p = 0; p < 16; ++p)
            for (int m = 0; m < M; ++m)
                acc[m] = dg_dpbf16_bcast(acc[m], w[p], ab + m * 16 + p);
        return;
    }
    for (int p = 0; p < pe; ++p) { /* a step with K's end or a block end inside */
        if (p == split)
            close_block(j, kq, lane0, acc, total, M);
        for (int m = 0; m < M; ++m)
            acc[m] = dg_dpbf16_bcast(acc[m], w[p], ab + m * 16 + p);
    }
}

/* Two chains at M = 1 (32 rows per call) measured no faster on Zen 5 than one with rows read in
 * place: the step's shuffles (widening, transpose), not the chain's latency, bound it once A's
 * pairs are broadcast from memory. From decode panels they do not: see panel_body. */
DG_INLINE bool decode_body(const dg_decode_job *j, const int fmt, const int M) {
    const int64_t K = j->k, kp = K + (K & 1), gblk = j->gblk;
    __m512 acc[DG_DECODE_MAX_M], total[DG_DECODE_MAX_M];
    for (int m = 0; m < M; ++m)
        acc[m] = total[m] = _mm512_setzero_ps();
    __mmask32 nan = 0;
    exp_range big = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    const widen_consts wc = {_mm512_loadu_si512(kE2m1Bf16), _mm512_loadu_si512(kE2m1Bf16Biased)};
    fold_src fs;
    fold_of(j, 0, &fs);
    row_stage stage;
    row_stage *st = j->stage_rows ? &stage : NULL;
    int64_t kb = 0, kq = 0; /* the current K block's start and index */
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        if (k0 == kb + gblk) /* the block before k0 ends */
            close_block(j, kq++, 0, acc, total, M), kb += gblk;
        const int pe = kp - k0 < 32 ? (int)((kp - k0) / 2) : 16; /* pairs of this step inside K */
        const int split = kb + gblk < k0 + 2 * pe ? (int)((kb + gblk - k0) / 2) : -1; /* gblk: a multiple of 16 */
        /* A's pairs of this step (j->ap: step-major, zero past K), broadcast from memory: no shuffles */
        const uint32_t *ab = j->ap + (k0 / 32) * M * 16;
        __m512i w[16];
        load_step(j->b, j->next, j->ldb, j->rows, K, k0, &fs, j->fblk, j->lanes, &wc, fmt, &nan, &big, st, w);
        step_chain(j, ab, w, pe, split, kq, 0, acc, total, M);
        if (split >= 0)
            kq++, kb += gblk;
    }
    if (nan || !range_ok(&big, IS_E4M3(fmt) ? 119 : 125))
        return false;
    close_block(j, kq, 0, acc, total, M); /* the last block */
    for (int m = 0; m < M; ++m)
        _mm512_storeu_ps(j->out + m * j->lanes, total[m]);
    return true;
}

/* ---- Decode panels, M <= 8: G (2 .. 4) groups of 16 rows per call ---------------------------
 * Widened from panels, a step costs few shuffles, and one group's 16 dependent VDPBF16PS per
 * step (per row of A) become the bound (measured on Zen 4 at M = 1: the chain took the
 * samples). So a call takes up to four groups at M <= 2 and two at M = 3..8 (more accumulators
 * would not fit in registers) and runs their chains side by side, chunk by chunk (4 pairs of
 * every group, then the next 4), which keeps G x 4 pair registers live instead of G x 16; one
 * broadcast of A feeds G VDPBF16PS. Measured on Zen 4, pre-packed FP4 B 7168 x 2048, 2 threads:
 * M = 1 0.31-0.37 ms (one group per call: 0.7-1.2), M = 6 0.68-0.74 ms (one group: 1.0-1.3).
 * Per element the operations are decode_body's. */
/* Chunk c (pairs 4c .. 4c + 3) of step st for the G groups: widened from the panels (with the
 * groups' exponent adds ex), then the chains. common: all 4 pairs inside K, no block end
 * among them (no checks: the compiler keeps it all in registers). */
DG_INLINE void panel_chunk(const dg_decode_job *j, int64_t st, int c, bool scaled, const __m512i ex[4][2],
                           const __m512i xs[4][4], const uint32_t *ab, int pe, int split, int64_t kq,
                           __m512 acc[4][DG_DECODE_MAX_M], __m512 total[4][DG_DECODE_MAX_M], __mmask32 *nan,
                           exp_range *big, const int M, const int G, const bool common, const int fmt) {
    __m512i w[4][4];
    for (int h = 0; h < G; ++h) {
        if (fmt == FMT_E2M1) { /* B's rows: this chunk's dwords of the group's 16 rows (xs) */
            e2m1_dword_pairs(xs[h][c], _mm512_loadu_si512(scaled ? kE2m1Bf16Biased : kE2m1Bf16), w[h]);
            if (scaled)
                for (int t = 0; t < 4; ++t)
                    w[h][t] = _mm512_subs_epu16(w[h][t], ex[h][c >> 1]);
            continue;
        }
        if (IS_E4M3_ROWS(fmt)) { /* B's rows: the chunk's two y registers of the group's current half (xs) */
            e4m3_word_pairs(xs[h][2 * (c & 1)], big, w[h], fmt == FMT_E4M3V);
            e4m3_word_pairs(xs[h][2 * (c & 1) + 1], big, w[h] + 2, fmt == FMT_E4M3V);
            if (scaled)
                for (int t = 0; t < 4; ++t)
                    w[h][t] = apply_exps(w[h][t], ex[h][c >> 1]);
            continue;
        }
        if (fmt == FMT_E4M3P) { /* exponent adds on the widened values (exps_of) */
            for (int t = 0; t < 4; ++t) {
                w[h][t] = widen_panel_pair_e4m3(j->b + h * j->ldb + st * DG_E4M3P_STEP_BYTES + 32 * (4 * c + t), nan);
                if (scaled)
                    w[h][t] = apply_exps(w[h][t], ex[h][c >> 1]);
            }
            continue;
        }
        widen_panel_chunk(j->b + h * j->ldb + st * 256 + 64 * c, w[h], scaled);
        if (scaled)
            for (int t = 0; t < 4; ++t)
                w[h][t] = _mm512_subs_epu16(w[h][t], ex[h][c >> 1]);
    }
    for (int t = 0; t < 4; ++t) {
        const int p = 4 * c + t;
        if (!common && p >= pe)
            break;
        if (!common && p == split)
            for (int h = 0; h < G; ++h)
                close_block(j, kq, 16 * h, acc[h], total[h], M);
        for (int m = 0; m < M; ++m) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ab[m * 16 + p]);
            for (int h = 0; h < G; ++h)
                acc[h][m] = _mm512_dpbf16_ps(acc[h][m], a, (__m512bh)w[h][t]);
        }
    }
}

/* E4M3 rows: the half step of chunks c, c + 1 (c even) of the G groups into xs (e4m3_half_words). */
DG_INLINE void e4m3_groups_half(const dg_decode_job *j, const uint8_t *src, int64_t sld, int64_t soff, int64_t k0,
                                 int c, const int G, __m512i xs[4][4]) {
    const int n = j->k - k0 < 32 ? (int)(j->k - k0) : 32; /* the step's k inside K */
    for (int h = 0; h < G; ++h) {
        const int rows = j->rows - 16 * h < 16 ? j->rows - 16 * h : 16;
        e4m3_half_words(src + h * 16 * sld, sld, rows, n - 8 * c, soff + 8 * c, xs[h]);
    }
}

/* The G groups' exponent subtrahends (E4M3P: adds) for the step from k0 (scale_exps). */
DG_INLINE void step_exps(const dg_decode_job *j, fold_src *fs, int64_t k0, const int G, const bool e4m3,
                         exp_range *big, __m512i ex[4][2]) {
    const int64_t q0 = k0 / j->fblk, q1 = k0 + 16 < j->k ? (k0 + 16) / j->fblk : q0;
    for (int h = 0; h < G; ++h) {
        ex[h][0] = scale_exps(&fs[h], q0, j->lanes, e4m3 ? 120 : 0, big, !e4m3);
        ex[h][1] = q1 == q0 ? ex[h][0] : scale_exps(&fs[h], q1, j->lanes, e4m3 ? 120 : 0, big, !e4m3);
    }
}

/* staged (a constant, as fmt): B's rows read from their staged lines (dg_decode_job.stage_rows);
 * a run-time choice inside the loop had cost the unstaged calls a quarter of their speed
 * (E4M3 rows, N 2112, K 7168, M = 1 on Zen 4: 0.62 -> 0.78 ms). */
DG_INLINE bool panel_body(const dg_decode_job *j, const int M, const int G, const int fmt, const bool staged) {
    const bool e4m3 = IS_E4M3(fmt);
    const int64_t K = j->k, kp = K + (K & 1), gblk = j->gblk;
    __m512 acc[4][DG_DECODE_MAX_M], total[4][DG_DECODE_MAX_M];
    for (int h = 0; h < G; ++h)
        for (int m = 0; m < M; ++m)
            acc[h][m] = total[h][m] = _mm512_setzero_ps();
    exp_range big = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    __mmask32 nan = 0;
    const bool scaled = j->fm || j->fme || j->fs;
    __m512i ex[4][2]; /* per group: subtrahends (subs_of) of pairs 0-7 and 8-15 */
    fold_src fs[4];
    for (int h = 0; h < G; ++h)
        fold_of(j, 16 * h, &fs[h]);
    const bool rows_in = IS_E4M3_ROWS(fmt) || fmt == FMT_E2M1; /* B's rows, not panels */
    const int64_t row_bytes = IS_E4M3_ROWS(fmt) ? K : (K + 1) / 2;
    row_stage stage;
    int64_t kb = 0, kq = 0;
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        const int64_t st = k0 / 32;
        /* B's rows are read at src, rows sld apart, from byte soff of the step (staged: its line's copy) */
        const int64_t off = IS_E4M3_ROWS(fmt) ? k0 : k0 / 2;
        const uint8_t *src = j->b;
        int64_t sld = j->ldb, soff = off;
        if (rows_in && staged)
            src = stage_at(&stage, j->b, j->ldb, j->rows, off, row_bytes, IS_E4M3_ROWS(fmt) ? 32 : 16), sld = 64,
            soff = off % 64;
        if (k0 == kb + gblk) {
            for (int h = 0; h < G; ++h)
                close_block(j, kq, 16 * h, acc[h], total[h], M);
            kq++, kb += gblk;
        }
        const int pe = kp - k0 < 32 ? (int)((kp - k0) / 2) : 16;
        const int split = kb + gblk < k0 + 2 * pe ? (int)((kb + gblk - k0) / 2) : -1;
        const uint32_t *ab = j->ap + st * M * 16;
        if (scaled)
            step_exps(j, fs, k0, G, e4m3, &big, ex);
        /* B's rows: the step's dwords of each group (FMT_E2M1, e2m1_step_dwords), or the words of
         * the half step that the chunk is in (FMT_E4M3, e4m3_half_words: loaded below) */
        __m512i xs[4][4];
        for (int h = 0; h < G; ++h) {
            if (IS_E4M3_ROWS(fmt)) {
                const int64_t gb = h * 16 * j->ldb;
                prefetch_rows(j->b + gb, j->next ? j->next + gb : NULL, j->ldb, j->rows - 16 * h < 16 ? j->rows - 16 * h : 16,
                              k0, K, G);
            } else if (fmt == FMT_E2M1) {
                const int64_t gb = h * 16 * j->ldb; /* group h: rows 16h .. 16h + 15 */
                const int rows = j->rows - 16 * h < 16 ? j->rows - 16 * h : 16, n = K - k0 < 32 ? (int)(K - k0) : 32;
                prefetch_rows(j->b + gb, j->next ? j->next + gb : NULL, j->ldb, rows, k0 / 2, (K + 1) / 2, G);
                e2m1_step_dwords(src + h * 16 * sld, sld, rows, n, soff, xs[h]);
            } else {
                prefetch_panel(j->b + h * j->ldb, j->next ? j->next + h * j->ldb : NULL, K, st,
                               e4m3 ? DG_E4M3P_STEP_BYTES : 256);
            }
        }
        if (pe == 16 && split < 0) { /* the common step: no K end, no block end inside */
            for (int c = 0; c < 4; ++c) {
                if (IS_E4M3_ROWS(fmt) && (c & 1) == 0)
                    e4m3_groups_half(j, src, sld, soff, k0, c, G, xs);
                panel_chunk(j, st, c, scaled, ex, xs, ab, 16, -1, kq, acc, total, &nan, &big, M, G, true, fmt);
            }
        } else {
            for (int c = 0; c < 4 && 4 * c < pe; ++c) {
                if (IS_E4M3_ROWS(fmt) && (c & 1) == 0)
                    e4m3_groups_half(j, src, sld, soff, k0, c, G, xs);
                panel_chunk(j, st, c, scaled, ex, xs, ab, pe, split, kq, acc, total, &nan, &big, M, G, false, fmt);
            }
        }
        if (split >= 0)
            kq++, kb += gblk;
    }
    if (nan || !range_ok(&big, e4m3 ? 119 : 125))
        return false;
    for (int h = 0; h < G; ++h) {
        close_block(j, kq, 16 * h, acc[h], total[h], M);
        for (int m = 0; m < M; ++m)
            _mm512_storeu_ps(j->out + m * j->lanes + 16 * h, total[h][m]);
    }
    return true;
}

/* M for the bodies: 1 .. DG_DECODE_MAX_M (the driver's calls never pass more). */
DG_INLINE int decode_m(const dg_decode_job *j) { return j->m < 1 ? 1 : j->m < DG_DECODE_MAX_M ? j->m : DG_DECODE_MAX_M; }

/* ---- Dispatch: one function per shape ---------------------------------------------------------
 * Calls of several groups of 16 rows run panel_body (up to four groups at M <= 2, two at
 * M = 3..8; E4M3 rows two at every M), a call of one group (B's last rows) decode_body. Each
 * (M, groups) shape of a format is a function of its own (noinline), reached through the
 * format's table (decode_shapes): inlined into one dispatcher, the shapes had made a function of
 * half a megabyte in which GCC kept accumulators and row pointers on the stack (E4M3 rows,
 * M = 1, N 2112, K 7168, one thread on Zen 4: 2.0 ms, as functions of their own 1.2 ms).
 *
 * Sanitizer builds (DG_DECODE_RUNTIME_SHAPES, set by CMake under DG_SANITIZE) run the bodies
 * with M and the group count as run-time values instead: the same source and the same memory
 * accesses, without the constant-shape instantiations, which ASan + UBSan took over half an
 * hour to instrument (clang; GCC a quarter of an hour). */
typedef bool (*decode_shape_fn)(const dg_decode_job *j);
typedef struct decode_shapes {
    decode_shape_fn one[DG_DECODE_MAX_M + 1];     /* decode_body at M (index M) */
    decode_shape_fn two[DG_DECODE_MAX_M + 1];     /* panel_body at M, two groups */
    decode_shape_fn more[4];                      /* panel_body at M = 1, 2 with 3, 4 groups */
} decode_shapes;

#ifdef DG_DECODE_RUNTIME_SHAPES
#define DECODE_SHAPES_TWO(name, fmt, staged) static const decode_shapes name = {{NULL}, {NULL}, {NULL}};
#define DECODE_SHAPES_MORE(name, fmt, staged) DECODE_SHAPES_TWO(name, fmt, staged)
#else
#define DECODE_ONE_(name, fmt, M) \
    static __attribute__((noinline)) bool name##_##M(const dg_decode_job *j) { return decode_body(j, fmt, M); }
#define DECODE_PANEL_(name, fmt, staged, M, G) \
    static __attribute__((noinline)) bool name##_##M##x##G(const dg_decode_job *j) { \
        return panel_body(j, M, G, fmt, staged); \
    }
/* Every format's shapes: one group at M = 1..8, two groups at M = 1..8. */
#define DECODE_SHAPES_COMMON_(name, fmt, staged) \
    DECODE_ONE_(name, fmt, 1) DECODE_ONE_(name, fmt, 2) DECODE_ONE_(name, fmt, 3) DECODE_ONE_(name, fmt, 4) \
    DECODE_ONE_(name, fmt, 5) DECODE_ONE_(name, fmt, 6) DECODE_ONE_(name, fmt, 7) DECODE_ONE_(name, fmt, 8) \
    DECODE_PANEL_(name, fmt, staged, 1, 2) DECODE_PANEL_(name, fmt, staged, 2, 2) \
    DECODE_PANEL_(name, fmt, staged, 3, 2) DECODE_PANEL_(name, fmt, staged, 4, 2) \
    DECODE_PANEL_(name, fmt, staged, 5, 2) DECODE_PANEL_(name, fmt, staged, 6, 2) \
    DECODE_PANEL_(name, fmt, staged, 7, 2) DECODE_PANEL_(name, fmt, staged, 8, 2)
#define DECODE_TABLES_COMMON_(name) \
    {NULL, name##_1, name##_2, name##_3, name##_4, name##_5, name##_6, name##_7, name##_8}, \
    {NULL, name##_1x2, name##_2x2, name##_3x2, name##_4x2, name##_5x2, name##_6x2, name##_7x2, name##_8x2}
/* The table of a format whose calls take two groups at every M (E4M3 rows) ... */
#define DECODE_SHAPES_TWO(name, fmt, staged) \
    DECODE_SHAPES_COMMON_(name, fmt, staged) \
    static const decode_shapes name = {DECODE_TABLES_COMMON_(name), {NULL, NULL, NULL, NULL}};
/* ... and of the others, which take up to four at M <= 2. */
#define DECODE_SHAPES_MORE(name, fmt, staged) \
    DECODE_SHAPES_COMMON_(name, fmt, staged) \
    DECODE_PANEL_(name, fmt, staged, 1, 3) DECODE_PANEL_(name, fmt, staged, 1, 4) \
    DECODE_PANEL_(name, fmt, staged, 2, 3) DECODE_PANEL_(name, fmt, staged, 2, 4) \
    static const decode_shapes name = {DECODE_TABLES_COMMON_(name), {name##_1x3, name##_1x4, name##_2x3, name##_2x4}};
#endif

/* The call j on its shape's function of s (DECODE_SHAPES_* of fmt and staged). */
DG_INLINE bool panel_dispatch(const dg_decode_job *j, const int fmt, const bool staged, const decode_shapes *s) {
    const int groups = (j->rows + 15) / 16, M = decode_m(j);
#ifdef DG_DECODE_RUNTIME_SHAPES
    (void)s;
    if (groups > 1)
        return panel_body(j, M, IS_E4M3_ROWS(fmt) || M > 2 ? 2 : groups < 4 ? groups : 4, fmt, staged);
    return decode_body(j, fmt, M);
#else
    (void)staged;
    if (groups > 2 && M <= 2 && !IS_E4M3_ROWS(fmt)) /* three or four groups */
        return s->more[2 * (M - 1) + (groups > 3)](j);
    return groups > 1 ? s->two[M](j) : s->one[M](j);
#endif
}

/* E4M3 rows staged into L1 (dg_decode_job.stage_rows), in decode_e4m3_staged_avx512bf16.c. */
bool dg_decode_e4m3_staged_avx512bf16(const dg_decode_job *j);

#endif
