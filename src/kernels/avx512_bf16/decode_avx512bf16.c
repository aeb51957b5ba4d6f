/*
 * decode_avx512bf16.c - AVX-512 BF16 decoding kernels: 1 .. DG_DECODE_MAX_M rows of A against
 * DG_DECODE_ROWS (16) rows of B, and (the wide kernels, below) DG_DECODE_MAX_M + 1 ..
 * DG_DECODE_WIDE_MAX_M rows against 32, read in place (BF16, E4M3 or E2M1 codes, K contiguous), all of K
 * in one call (contract: dg_decode_job in src/engine/engine.h), on VDPBF16PS like the level's
 * small-M and large-M kernels, so every path gives a row of D the same bits.
 *
 * Why: the small-M path stages each K slice of B twice (codes widened into BF16 rows, then the
 * rows transposed into pair panels) and reloads it per A panel; here one step takes 32 k of
 * the 16 rows, widens each row's piece into one register (16 k pairs as BF16 pairs), transposes
 * the 16 x 16 words so that register p holds k pair p of the 16 rows (one lane per row), and
 * feeds the pairs straight to VDPBF16PS for every row of A.
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
 */
#include "../../engine/engine.h"
#include "../dpbf16_avx512.h"
#include "../e2m1_bf16_tables.h"
#include "../e4m3_bf16_avx512.h"
#include "../transpose16_avx512.h"

#include <immintrin.h>
#include <string.h>

#define DG_INLINE static inline __attribute__((always_inline))

/* FMT_E2M1P: pre-packed E2M1 decode panels (engine.h, DG_DECODE_E2M1P), widened in 128-bit lanes;
 * FMT_E4M3P: pre-packed E4M3 decode panels (DG_DECODE_E4M3P), one k pair of 16 rows per 32 bytes */
enum { FMT_BF16 = 0, FMT_E4M3 = 1, FMT_E2M1 = 2, FMT_E2M1P = 3, FMT_E4M3P = 4 };

/* Constants of the row widening, hoisted out of the per-row code. */
typedef struct widen_consts {
    __m512i lut, low4, m7f, lut_biased; /* lut_biased: kE2m1Bf16Biased, for scaled E2M1 rows */
} widen_consts;

/* Row r's 32 values from k0 (n valid, 1..32) as 16 BF16 pairs; *nan |= its E4M3 NaN lanes. */
DG_INLINE __m512i load_row(const uint8_t *row, int64_t k0, __mmask32 m, __mmask16 bm, const widen_consts *wc,
                           const int fmt, const bool biased, __mmask32 *nan) {
    if (fmt == FMT_BF16)
        return _mm512_maskz_loadu_epi16(m, row + 2 * k0);
    if (fmt == FMT_E4M3) {
        const __m512i c = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, row + k0));
        *nan |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(c, wc->m7f), wc->m7f);
        return dg_e4m3_bf16_avx512(c);
    }
    /* E2M1: byte j holds k0 + 2j (low nibble) and k0 + 2j + 1; BF16 of the 16 values by table */
    const __m512i d = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(bm, row + k0 / 2));
    const __m512i codes = _mm512_or_si512(_mm512_and_si512(d, wc->low4), _mm512_slli_epi32(_mm512_srli_epi32(d, 4), 16));
    return _mm512_maskz_permutexvar_epi16(m, codes, biased ? wc->lut_biased : wc->lut);
}

/* Per-lane exponent adds for the folded scales of fold block q (both 16-bit halves of a word);
 * *big gets the lanes whose largest value would leave BF16's range (E2M1 6 * 2^e for e > 125:
 * the driver admits scales up to 2^127, where the exact path rounds to infinity). */
DG_INLINE __m512i exps_of(__m512i e, int emax, __mmask16 *big) {
    *big |= _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(emax));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi32(e, 7), _mm512_set1_epi32(0xffff));
    return _mm512_or_si512(h, _mm512_slli_epi32(h, 16));
}

/* The pre-packed E2M1 panels' form of the same (E2M1_BIAS: e2m1_bf16_tables.h): per lane the subtrahend
 * (E2M1_BIAS - e) << 7 in both halves, in [0x80, 0x7d80] for the e in [-125, 125] the driver
 * admits (*big as above). */
DG_INLINE __m512i subs_of(__m512i e, int emax, __mmask16 *big) {
    *big |= _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(emax));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(E2M1_BIAS), e), 7),
                                       _mm512_set1_epi32(0xffff));
    return _mm512_or_si512(h, _mm512_slli_epi32(h, 16));
}

/* Block q's adds (sub: the subtrahends of subs_of) for 16 rows: from the float scales fm
 * ([q][lanes]), or from pre-packed exponent bytes fme when given (dg_decode_job.fme: [q][16],
 * 127 = 2^0; unit 1, E2M1P only). */
DG_INLINE __m512i scale_exps(const float *fm, const uint8_t *fme, int64_t q, int64_t lanes, int unit_log2, int emax,
                             __mmask16 *big, const bool sub) {
    __m512i e;
    if (fme) {
        e = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(fme + q * 16))),
                             _mm512_set1_epi32(127));
    } else {
        const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(fm + q * lanes));
        e = _mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(127 + unit_log2));
    }
    return sub ? subs_of(e, emax, big) : exps_of(e, emax, big);
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

/* The 32 k from k0 of 16 B rows (b, row stride ldb; rows >= rows read as zero; n = K - k0 of
 * them valid, at most 32) widened per row and transposed: w[p] = k pair p of the 16 rows. */
DG_INLINE void load_rows(const uint8_t *b, const uint8_t *next, int64_t ldb, int rows, int64_t K, int64_t k0,
                         const widen_consts *wc, const int fmt, const bool biased, __mmask32 *nan, __m512i w[16]) {
    const int n = K - k0 < 32 ? (int)(K - k0) : 32;
    __m512i in[16];
    const int64_t off = fmt == FMT_BF16 ? 2 * k0 : fmt == FMT_E4M3 ? k0 : k0 / 2; /* bytes into each row */
    /* Once per cache line: the line 8 ahead of each row (16 short row streams); past a row's end,
     * the next block's row (next: the driver's next call on this thread), so that its first lines
     * are not demand misses (they were: FP4 rows of 1 KiB at M = 1 on Zen 5 waited on memory). */
    const int64_t row_bytes = fmt == FMT_BF16 ? 2 * K : fmt == FMT_E4M3 ? K : (K + 1) / 2, ahead = off + 512;
    if (off % 64 == 0)
        for (int r = 0; r < rows; ++r)
            _mm_prefetch(ahead < row_bytes || !next ? (const char *)b + r * ldb + ahead
                                                    : (const char *)next + r * ldb + (ahead - row_bytes), _MM_HINT_T0);
    const __mmask32 m = (__mmask32)(n >= 32 ? 0xffffffffu : (1u << n) - 1);
    const __mmask16 bm = (__mmask16)(n >= 32 ? 0xffffu : (1u << ((n + 1) / 2)) - 1);
    for (int r = 0; r < 16; ++r)
        in[r] = r < rows ? load_row(b + r * ldb, k0, m, bm, wc, fmt, biased, nan) : _mm512_setzero_si512();
    dg_transpose16_epi32(in, w);
}

/* One step, the 32 k from k0, of 16 B rows: rows read in place (load_rows) or a pre-packed E2M1
 * panel at b (FMT_E2M1P: 256 bytes per step, zero past K and past its rows); w[p] = k pair p
 * of the 16 rows (lane r: row r); folded power-of-two scales fm ([q][32] lanes, this half's
 * first lane) applied. */
DG_INLINE void load_step(const uint8_t *b, const uint8_t *next, int64_t ldb, int rows, int64_t K, int64_t k0,
                         const float *fm, const uint8_t *fme, int64_t fblk, int64_t lanes, const widen_consts *wc,
                         const int fmt, __mmask32 *nan, __mmask16 *big, __m512i w[16]) {
    const bool e4m3 = fmt == FMT_E4M3 || fmt == FMT_E4M3P;
    const int unit_log2 = e4m3 ? 120 : 0;
    const int emax = e4m3 ? 119 : 125; /* 448 * 2^119, 6 * 2^125: the largest finite BF16 */
    const bool scaled = fmt != FMT_BF16 && (fm || (fmt == FMT_E2M1P && fme));
    const bool subs = fmt == FMT_E2M1P || fmt == FMT_E2M1; /* E2M1 scales: biased tables (above) */
    if (fmt == FMT_E2M1P) {
        prefetch_panel(b, next, K, k0 / 32, 256);
        load_panel_e2m1(b + (k0 / 32) * 256, w, scaled);
    } else if (fmt == FMT_E4M3P) {
        prefetch_panel(b, next, K, k0 / 32, DG_E4M3P_STEP_BYTES);
        for (int p = 0; p < 16; ++p)
            w[p] = widen_panel_pair_e4m3(b + (k0 / 32) * DG_E4M3P_STEP_BYTES + 32 * p, nan);
    } else {
        load_rows(b, next, ldb, rows, K, k0, wc, fmt, scaled && subs, nan, w);
    }
    if (scaled) { /* pairs 0-7 at k0, 8-15 at k0 + 16: fblk is a multiple of 16 */
        const int64_t q0 = k0 / fblk, q1 = k0 + 16 < K ? (k0 + 16) / fblk : q0; /* fm has no block past K */
        const uint8_t *e = fmt == FMT_E2M1P ? fme : NULL; /* known NULL for the other formats */
        const __m512i lo = scale_exps(fm, e, q0, lanes, unit_log2, emax, big, subs);
        const __m512i hi = q1 == q0 ? lo : scale_exps(fm, e, q1, lanes, unit_log2, emax, big, subs);
        for (int p = 0; p < 16; ++p)
            w[p] = subs ? _mm512_subs_epu16(w[p], p < 8 ? lo : hi) : apply_exps(w[p], p < 8 ? lo : hi);
    }
}

static const uint16_t kE2m1Bf16[32] = {0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
                                       0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0};
/* The same biased by 2^E2M1_BIAS, both zeros +0 (e2m1_bf16_tables.h explains it). */
static const uint16_t kE2m1Bf16Biased[32] = {0x0000, 0x7e00, 0x7e80, 0x7ec0, 0x7f00, 0x7f40, 0x7f80, 0x7fc0,
                                             0x0000, 0xfe00, 0xfe80, 0xfec0, 0xff00, 0xff40, 0xff80, 0xffc0};

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
    __mmask16 big = 0;
    const widen_consts wc = {_mm512_loadu_si512(kE2m1Bf16), _mm512_set1_epi32(15), _mm512_set1_epi16(0x7f),
                             _mm512_loadu_si512(kE2m1Bf16Biased)};
    int64_t kb = 0, kq = 0; /* the current K block's start and index */
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        if (k0 == kb + gblk) /* the block before k0 ends */
            close_block(j, kq++, 0, acc, total, M), kb += gblk;
        const int pe = kp - k0 < 32 ? (int)((kp - k0) / 2) : 16; /* pairs of this step inside K */
        const int split = kb + gblk < k0 + 2 * pe ? (int)((kb + gblk - k0) / 2) : -1; /* gblk: a multiple of 16 */
        /* A's pairs of this step (j->ap: step-major, zero past K), broadcast from memory: no shuffles */
        const uint32_t *ab = j->ap + (k0 / 32) * M * 16;
        __m512i w[16];
        load_step(j->b, j->next, j->ldb, j->rows, K, k0, j->fm, j->fme, j->fblk, j->lanes, &wc, fmt, &nan, &big, w);
        step_chain(j, ab, w, pe, split, kq, 0, acc, total, M);
        if (split >= 0)
            kq++, kb += gblk;
    }
    if (nan || big)
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
                           const uint32_t *ab, int pe, int split, int64_t kq, __m512 acc[4][DG_DECODE_MAX_M],
                           __m512 total[4][DG_DECODE_MAX_M], __mmask32 *nan,
                           const int M, const int G, const bool common, const int fmt) {
    __m512i w[4][4];
    for (int h = 0; h < G; ++h) {
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

DG_INLINE bool panel_body(const dg_decode_job *j, const int M, const int G, const int fmt) {
    const bool e4m3 = fmt == FMT_E4M3P;
    const int64_t K = j->k, kp = K + (K & 1), gblk = j->gblk;
    __m512 acc[4][DG_DECODE_MAX_M], total[4][DG_DECODE_MAX_M];
    for (int h = 0; h < G; ++h)
        for (int m = 0; m < M; ++m)
            acc[h][m] = total[h][m] = _mm512_setzero_ps();
    __mmask16 big = 0;
    __mmask32 nan = 0;
    int64_t kb = 0, kq = 0;
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        const int64_t st = k0 / 32;
        if (k0 == kb + gblk) {
            for (int h = 0; h < G; ++h)
                close_block(j, kq, 16 * h, acc[h], total[h], M);
            kq++, kb += gblk;
        }
        const int pe = kp - k0 < 32 ? (int)((kp - k0) / 2) : 16;
        const int split = kb + gblk < k0 + 2 * pe ? (int)((kb + gblk - k0) / 2) : -1;
        const uint32_t *ab = j->ap + st * M * 16;
        __m512i ex[4][2]; /* per group: subtrahends (subs_of) of pairs 0-7 and 8-15 */
        const bool scaled = j->fm || j->fme;
        if (scaled) {
            const int64_t q0 = k0 / j->fblk, q1 = k0 + 16 < K ? (k0 + 16) / j->fblk : q0;
            for (int h = 0; h < G; ++h) {
                const float *f = j->fm ? j->fm + 16 * h : NULL;
                const uint8_t *e = j->fme ? j->fme + h * j->fme_group : NULL;
                ex[h][0] = scale_exps(f, e, q0, j->lanes, e4m3 ? 120 : 0, e4m3 ? 119 : 125, &big, !e4m3);
                ex[h][1] = q1 == q0 ? ex[h][0]
                                    : scale_exps(f, e, q1, j->lanes, e4m3 ? 120 : 0, e4m3 ? 119 : 125, &big, !e4m3);
            }
        }
        for (int h = 0; h < G; ++h)
            prefetch_panel(j->b + h * j->ldb, j->next ? j->next + h * j->ldb : NULL, K, st,
                           e4m3 ? DG_E4M3P_STEP_BYTES : 256);
        if (pe == 16 && split < 0) /* the common step: no K end, no block end inside */
            for (int c = 0; c < 4; ++c)
                panel_chunk(j, st, c, scaled, ex, ab, 16, -1, kq, acc, total, &nan, M, G, true, fmt);
        else
            for (int c = 0; c < 4 && 4 * c < pe; ++c)
                panel_chunk(j, st, c, scaled, ex, ab, pe, split, kq, acc, total, &nan, M, G, false, fmt);
        if (split >= 0)
            kq++, kb += gblk;
    }
    if (big || nan)
        return false;
    for (int h = 0; h < G; ++h) {
        close_block(j, kq, 16 * h, acc[h], total[h], M);
        for (int m = 0; m < M; ++m)
            _mm512_storeu_ps(j->out + m * j->lanes + 16 * h, total[h][m]);
    }
    return true;
}

/* ---- M = DG_DECODE_MAX_M + 1 .. DG_DECODE_WIDE_MAX_M: 32 rows of B per call ----------------
 * Each step's 32 k of the 32 rows is widened and transposed as above (two halves of 16 rows)
 * into w, one NR = 32 panel step in L1; rows of A then run against it in groups of WIDE_G with
 * their accumulators in registers across the step's pairs (loaded and stored once per step);
 * each A pair is a broadcast memory operand of its two VDPBF16PS (dg_dpbf16_bcast). The per-element
 * operations are decode_body's. */
#define WIDE_G 8

/* Pairs [p0, p1) of the step panel w ([16][32] words) times G rows of A (ap: [G][16] pairs of
 * this step) into acc ([G][32]). */
DG_INLINE void wide_group(const uint32_t *ap, const uint32_t *w, float *acc, int p0, int p1, const int G) {
    __m512 c[WIDE_G][2];
    for (int m = 0; m < G; ++m)
        c[m][0] = _mm512_load_ps(acc + m * 32), c[m][1] = _mm512_load_ps(acc + m * 32 + 16);
    for (int p = p0; p < p1; ++p) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512(w + p * 32), b1 = (__m512bh)_mm512_load_si512(w + p * 32 + 16);
        for (int m = 0; m < G; ++m) { /* a broadcast operand each: 5% faster at M = 16 .. 64 on Zen 4 */
            c[m][0] = dg_dpbf16_bcast(c[m][0], (__m512i)b0, ap + m * 16 + p);
            c[m][1] = dg_dpbf16_bcast(c[m][1], (__m512i)b1, ap + m * 16 + p);
        }
    }
    for (int m = 0; m < G; ++m)
        _mm512_store_ps(acc + m * 32, c[m][0]), _mm512_store_ps(acc + m * 32 + 16, c[m][1]);
}

static void wide_pairs(const uint32_t *ap, int M, const uint32_t *w, float *acc, int p0, int p1) {
    int m0 = 0;
    for (; m0 + WIDE_G <= M; m0 += WIDE_G)
        wide_group(ap + m0 * 16, w, acc + m0 * 32, p0, p1, WIDE_G);
    ap += m0 * 16, acc += m0 * 32;
    switch (M - m0) {
    case 1: wide_group(ap, w, acc, p0, p1, 1); break;
    case 2: wide_group(ap, w, acc, p0, p1, 2); break;
    case 3: wide_group(ap, w, acc, p0, p1, 3); break;
    case 4: wide_group(ap, w, acc, p0, p1, 4); break;
    case 5: wide_group(ap, w, acc, p0, p1, 5); break;
    case 6: wide_group(ap, w, acc, p0, p1, 6); break;
    case 7: wide_group(ap, w, acc, p0, p1, 7); break;
    default: break;
    }
}

/* K block kq ends for all rows: total = fma(sa * sb, acc, total), acc = 0 (close_block's operations). */
static void wide_close(const dg_decode_job *j, int64_t kq, float *acc, float *total) {
    const __m512 sb0 = _mm512_loadu_ps(j->sb + kq * 32), sb1 = _mm512_loadu_ps(j->sb + kq * 32 + 16);
    for (int m = 0; m < j->m; ++m) {
        const __m512 sa = _mm512_set1_ps(j->sa[m * j->sa_stride + kq]);
        float *a = acc + m * 32, *t = total + m * 32;
        _mm512_store_ps(t, _mm512_fmadd_ps(_mm512_mul_ps(sa, sb0), _mm512_load_ps(a), _mm512_load_ps(t)));
        _mm512_store_ps(t + 16, _mm512_fmadd_ps(_mm512_mul_ps(sa, sb1), _mm512_load_ps(a + 16), _mm512_load_ps(t + 16)));
        _mm512_store_ps(a, _mm512_setzero_ps());
        _mm512_store_ps(a + 16, _mm512_setzero_ps());
    }
}

DG_INLINE bool wide_body(const dg_decode_job *j, const int fmt) {
    const int64_t K = j->k, kp = K + (K & 1), gblk = j->gblk;
    const int M = j->m;
    _Alignas(64) float acc[DG_DECODE_WIDE_MAX_M * 32], total[DG_DECODE_WIDE_MAX_M * 32];
    _Alignas(64) uint32_t w[16 * 32];
    memset(acc, 0, (size_t)M * 32 * sizeof(float));
    memset(total, 0, (size_t)M * 32 * sizeof(float));
    __mmask32 nan = 0;
    __mmask16 big = 0;
    const widen_consts wc = {_mm512_loadu_si512(kE2m1Bf16), _mm512_set1_epi32(15), _mm512_set1_epi16(0x7f),
                             _mm512_loadu_si512(kE2m1Bf16Biased)};
    const int lo_rows = j->rows < 16 ? j->rows : 16, hi_rows = j->rows - lo_rows;
    int64_t kb = 0, kq = 0; /* the current K block's start and index */
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        __m512i half[16];
        load_step(j->b, j->next, j->ldb, lo_rows, K, k0, j->fm, j->fme, j->fblk, 32, &wc, fmt, &nan, &big, half);
        for (int p = 0; p < 16; ++p)
            _mm512_store_si512(w + p * 32, half[p]);
        const int64_t half_off = fmt == FMT_E2M1P ? j->ldb : 16 * j->ldb; /* the second 16 rows */
        load_step(hi_rows > 0 ? j->b + half_off : j->b, j->next ? j->next + half_off : NULL, j->ldb, hi_rows, K, k0,
                  j->fm ? j->fm + 16 : NULL, hi_rows > 0 && j->fme ? j->fme + j->fme_group : NULL, j->fblk, 32, &wc, fmt, &nan,
                  &big, half);
        for (int p = 0; p < 16; ++p)
            _mm512_store_si512(w + p * 32 + 16, half[p]);
        const uint32_t *ap = j->ap + (k0 / 32) * M * 16;
        if (k0 == kb + gblk) /* the block before k0 ends */
            wide_close(j, kq++, acc, total), kb += gblk;
        const int pe = kp - k0 < 32 ? (int)((kp - k0) / 2) : 16; /* pairs of this step inside K */
        if (kb + gblk < k0 + 2 * pe) { /* a block ends inside the step (gblk, kb: multiples of 16) */
            const int split = (int)((kb + gblk - k0) / 2);
            wide_pairs(ap, M, w, acc, 0, split);
            wide_close(j, kq++, acc, total), kb += gblk;
            wide_pairs(ap, M, w, acc, split, pe);
        } else {
            wide_pairs(ap, M, w, acc, 0, pe);
        }
    }
    if (nan || big)
        return false;
    wide_close(j, kq, acc, total); /* the last block */
    memcpy(j->out, total, (size_t)M * 32 * sizeof(float));
    return true;
}

#define DECODE_FN(name, fmt)                                                                       \
    bool name(const dg_decode_job *j) {                                                            \
        switch (j->m) {                                                                            \
        case 1: return decode_body(j, fmt, 1);                                                     \
        case 2: return decode_body(j, fmt, 2);                                                     \
        case 3: return decode_body(j, fmt, 3);                                                     \
        case 4: return decode_body(j, fmt, 4);                                                     \
        case 5: return decode_body(j, fmt, 5);                                                     \
        case 6: return decode_body(j, fmt, 6);                                                     \
        case 7: return decode_body(j, fmt, 7);                                                     \
        default: return decode_body(j, fmt, 8);                                                    \
        }                                                                                          \
    }

DECODE_FN(dg_decode_bf16_avx512bf16, FMT_BF16)
DECODE_FN(dg_decode_e4m3_avx512bf16, FMT_E4M3)
DECODE_FN(dg_decode_e2m1_avx512bf16, FMT_E2M1)
/* Decode panels: calls of several groups of 16 rows run panel_body (up to four at M <= 2, two
 * at M = 3..8), a call of one group (B's last rows) decode_body. */
DG_INLINE bool panel_dispatch(const dg_decode_job *j, const int fmt) {
    const int groups = (j->rows + 15) / 16;
    if (groups > 1) /* M <= 2: up to 4 groups; M 3..8: 2 (the driver's calls: DG_DECODE_PANEL_ROWS, 32) */
        switch (j->m <= 2 ? groups + 4 * (j->m - 1) : 8 + j->m) {
        case 2: return panel_body(j, 1, 2, fmt);
        case 3: return panel_body(j, 1, 3, fmt);
        case 4: return panel_body(j, 1, 4, fmt);
        case 6: return panel_body(j, 2, 2, fmt);
        case 7: return panel_body(j, 2, 3, fmt);
        case 8: return panel_body(j, 2, 4, fmt);
        case 11: return panel_body(j, 3, 2, fmt);
        case 12: return panel_body(j, 4, 2, fmt);
        case 13: return panel_body(j, 5, 2, fmt);
        case 14: return panel_body(j, 6, 2, fmt);
        case 15: return panel_body(j, 7, 2, fmt);
        default: return panel_body(j, 8, 2, fmt);
        }
    switch (j->m) {
    case 1: return decode_body(j, fmt, 1);
    case 2: return decode_body(j, fmt, 2);
    case 3: return decode_body(j, fmt, 3);
    case 4: return decode_body(j, fmt, 4);
    case 5: return decode_body(j, fmt, 5);
    case 6: return decode_body(j, fmt, 6);
    case 7: return decode_body(j, fmt, 7);
    default: return decode_body(j, fmt, 8);
    }
}

bool dg_decode_e2m1p_avx512bf16(const dg_decode_job *j) { return panel_dispatch(j, FMT_E2M1P); }
bool dg_decode_e4m3p_avx512bf16(const dg_decode_job *j) { return panel_dispatch(j, FMT_E4M3P); }

#define DECODE_WIDE_FN(name, fmt) \
    bool name(const dg_decode_job *j) { return wide_body(j, fmt); }

DECODE_WIDE_FN(dg_decode_wide_bf16_avx512bf16, FMT_BF16)
DECODE_WIDE_FN(dg_decode_wide_e4m3_avx512bf16, FMT_E4M3)
DECODE_WIDE_FN(dg_decode_wide_e2m1_avx512bf16, FMT_E2M1)
DECODE_WIDE_FN(dg_decode_wide_e2m1p_avx512bf16, FMT_E2M1P)
