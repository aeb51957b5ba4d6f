/*
 * decode_wide_avx512bf16.c - the AVX-512 BF16 wide decode kernels: DG_DECODE_MAX_M + 1 ..
 * DG_DECODE_WIDE_MAX_M rows of A against 32 rows of B (BF16, E4M3, E2M1 rows or E2M1 decode
 * panels), on the steps of decode_avx512bf16.h.
 */
#include "decode_avx512bf16.h"

/* ---- M = DG_DECODE_MAX_M + 1 .. DG_DECODE_WIDE_MAX_M: 32 rows of B per call ----------------
 * Each step's 32 k of the 32 rows is widened and transposed as above (two halves of 16 rows)
 * into w, one NR = 32 panel step in L1; rows of A then run against it in groups of WIDE_G with
 * their accumulators in registers across the step's pairs (loaded and stored once per step);
 * each A pair is a broadcast memory operand of its two VDPBF16PS (dg_dpbf16_bcast). The per-element
 * operations are decode_body's.
 * Tried for BF16 rows (2026-12-06, Zen 4): a transposed kernel with lanes over rows of A (A's
 * pairs pair-major, B's pairs broadcast straight from its rows, no transpose at all). From L2
 * it was 5-12% faster at M = 16..64 (B 32 x 3072); from DRAM in dgbench no faster at M = 16
 * and 15-25% slower at M = 64 and for the masked g6 x 20 case (16 row streams read 4 bytes at
 * a time, and A read once per 16 columns). */
#define WIDE_G 8

/* Pairs [p0, p1) of the step panel w ([16][32] words) times G rows of A (ap: [G][16] pairs of
 * this step) into acc ([G][32]). */
DG_INLINE void wide_group(const uint32_t *ap, const uint32_t *w, float *acc, int p0, int p1, const int G) {
    __m512 c[WIDE_G][2]; /* in registers: the loops over m unrolled (else GCC may keep c in memory) */
#pragma GCC unroll 8
    for (int m = 0; m < G; ++m)
        c[m][0] = _mm512_load_ps(acc + m * 32), c[m][1] = _mm512_load_ps(acc + m * 32 + 16);
    for (int p = p0; p < p1; ++p) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512(w + p * 32), b1 = (__m512bh)_mm512_load_si512(w + p * 32 + 16);
#pragma GCC unroll 8
        for (int m = 0; m < G; ++m) { /* a broadcast operand each: 5% faster at M = 16 .. 64 on Zen 4 */
            c[m][0] = dg_dpbf16_bcast(c[m][0], (__m512i)b0, ap + m * 16 + p);
            c[m][1] = dg_dpbf16_bcast(c[m][1], (__m512i)b1, ap + m * 16 + p);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < G; ++m)
        _mm512_store_ps(acc + m * 32, c[m][0]), _mm512_store_ps(acc + m * 32 + 16, c[m][1]);
}

/* wide_group for G = 1 .. WIDE_G rows, each its own small function, called through a table: a
 * switch over the inlined sizes measured slower in the early-widening loop (masked g6 x 20,
 * N 7168, K 3072, BF16 on Zen 4: 20.6-23.0 ms against 18.2-18.6). */
#define WIDE_GROUP_FN(g) \
    static void wide_group_##g(const uint32_t *ap, const uint32_t *w, float *acc, int p0, int p1) { \
        wide_group(ap, w, acc, p0, p1, g); \
    }
WIDE_GROUP_FN(1)
WIDE_GROUP_FN(2)
WIDE_GROUP_FN(3)
WIDE_GROUP_FN(4)
WIDE_GROUP_FN(5)
WIDE_GROUP_FN(6)
WIDE_GROUP_FN(7)
WIDE_GROUP_FN(8)
_Static_assert(WIDE_G == 8, "one wide_group_<g> per group size");
typedef void (*wide_group_fn)(const uint32_t *ap, const uint32_t *w, float *acc, int p0, int p1);
static const wide_group_fn kWideGroup[WIDE_G + 1] = {NULL,        wide_group_1, wide_group_2, wide_group_3, wide_group_4,
                                                     wide_group_5, wide_group_6, wide_group_7, wide_group_8};

/* The group of rows m0 .. m0 + WIDE_G - 1 of A (fewer at M's end) over pairs [p0, p1). */
DG_INLINE void wide_pairs_group(const uint32_t *ap, int M, const uint32_t *w, float *acc, int p0, int p1, int m0) {
    kWideGroup[M - m0 < WIDE_G ? M - m0 : WIDE_G](ap + m0 * 16, w, acc + m0 * 32, p0, p1);
}

static void wide_pairs(const uint32_t *ap, int M, const uint32_t *w, float *acc, int p0, int p1) {
    int m0 = 0;
    for (; m0 + WIDE_G <= M; m0 += WIDE_G)
        wide_group(ap + m0 * 16, w, acc + m0 * 32, p0, p1, WIDE_G);
    if (m0 < M)
        wide_pairs_group(ap, M, w, acc, p0, p1, m0);
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

/* Half h (rows 16h .. 16h + 15) of the step from k0 widened into panel w ([16][32] words). */
DG_INLINE void wide_half(const dg_decode_job *j, int h, int rows, int64_t k0, fold_src *fs, const widen_consts *wc,
                         row_stage *st, __mmask32 *nan, exp_range *big, uint32_t *w, const int fmt) {
    const int64_t off = h == 0 ? 0 : fmt == FMT_E2M1P ? j->ldb : 16 * j->ldb; /* the second 16 rows */
    __m512i half[16];
    load_step(rows > 0 ? j->b + off : j->b, j->next ? j->next + off : NULL, j->ldb, rows, j->k, k0, fs, j->fblk, 32,
              wc, fmt, nan, big, st, half);
    for (int p = 0; p < 16; ++p)
        _mm512_store_si512(w + p * 32 + 16 * h, half[p]);
}

/* The next step's 32 rows are widened (into the other panel) while the current step runs: when
 * M is not a multiple of WIDE_G, after the first group of rows of A, so that their shuffles and
 * loads issue beside the VDPBF16PS of the groups that follow (independent work), else after
 * the last group, as before. Measured on Zen 4 (2 threads, B from DRAM, old -> early): BF16 N
 * 2112, K 7168, M = 12 2.1-2.2 -> 1.5 ms, M = 20 2.8-3.0 -> 2.3, M = 36 4.0 -> 3.3-3.8; FP4 N 4096,
 * K 7168, M = 12 4.0-4.4 -> 3.0-3.7, M = 44 9.0-9.1 -> 7.8-7.9; masked g6 x 20, N 7168, K 3072
 * BF16 23.3-23.6 -> 18.6-19.1 ms, FP8 23.9-24.0 -> 19.7-20.3. Early widening at M = 16, 32, 48
 * and 64 was 3-20% slower (FP4 decode panels at M = 16 the most), so there it stays late.
 * Same operations per element either way. */
DG_INLINE bool wide_body(const dg_decode_job *j, const int fmt) {
    const int64_t K = j->k, kp = K + (K & 1), gblk = j->gblk;
    const int M = j->m;
    _Alignas(64) float acc[DG_DECODE_WIDE_MAX_M * 32], total[DG_DECODE_WIDE_MAX_M * 32];
    _Alignas(64) uint32_t w[2][16 * 32]; /* the current step's panel and the next one's */
    memset(acc, 0, (size_t)M * 32 * sizeof(float));
    memset(total, 0, (size_t)M * 32 * sizeof(float));
    __mmask32 nan = 0;
    exp_range big = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    const widen_consts wc = {_mm512_loadu_si512(kE2m1Bf16), _mm512_loadu_si512(kE2m1Bf16Biased)};
    const int lo_rows = j->rows < 16 ? j->rows : 16, hi_rows = j->rows - lo_rows;
    fold_src fs_lo, fs_hi;
    fold_of(j, 0, &fs_lo), fold_of(j, 16, &fs_hi);
    row_stage stage[2]; /* the two halves' rows, staged apart (stage_rows) */
    row_stage *st_lo = j->stage_rows ? &stage[0] : NULL, *st_hi = j->stage_rows ? &stage[1] : NULL;
    /* the next step widened after the first group of rows of A where the last group is partial
     * (M % WIDE_G rows), else at the step's end into the same panel */
    const bool early = M % WIDE_G != 0;
    wide_half(j, 0, lo_rows, 0, &fs_lo, &wc, st_lo, &nan, &big, w[0], fmt);
    wide_half(j, 1, hi_rows, 0, &fs_hi, &wc, st_hi, &nan, &big, w[0], fmt);
    int64_t kb = 0, kq = 0; /* the current K block's start and index */
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
        const uint32_t *cur = w[early ? (k0 / 32) & 1 : 0];
        uint32_t *nxt = w[early ? (k0 / 32 + 1) & 1 : 0];
        const bool more = k0 + 32 < kp;
        const uint32_t *ap = j->ap + (k0 / 32) * M * 16;
        if (k0 == kb + gblk) /* the block before k0 ends */
            wide_close(j, kq++, acc, total), kb += gblk;
        const int pe = kp - k0 < 32 ? (int)((kp - k0) / 2) : 16; /* pairs of this step inside K */
        if (kb + gblk < k0 + 2 * pe) { /* a block ends inside the step (gblk, kb: multiples of 16) */
            const int split = (int)((kb + gblk - k0) / 2);
            wide_pairs(ap, M, cur, acc, 0, split);
            wide_close(j, kq++, acc, total), kb += gblk;
            wide_pairs(ap, M, cur, acc, split, pe);
            if (more) {
                wide_half(j, 0, lo_rows, k0 + 32, &fs_lo, &wc, st_lo, &nan, &big, nxt, fmt);
                wide_half(j, 1, hi_rows, k0 + 32, &fs_hi, &wc, st_hi, &nan, &big, nxt, fmt);
            }
            continue;
        }
        if (!early) { /* the step, then the next one widened into the same panel */
            wide_pairs(ap, M, cur, acc, 0, pe);
            if (more) {
                wide_half(j, 0, lo_rows, k0 + 32, &fs_lo, &wc, st_lo, &nan, &big, nxt, fmt);
                wide_half(j, 1, hi_rows, k0 + 32, &fs_hi, &wc, st_hi, &nan, &big, nxt, fmt);
            }
            continue;
        }
        for (int m0 = 0; m0 < M; m0 += WIDE_G) {
            wide_pairs_group(ap, M, cur, acc, 0, pe, m0);
            if (more && m0 == 0) {
                wide_half(j, 0, lo_rows, k0 + 32, &fs_lo, &wc, st_lo, &nan, &big, nxt, fmt);
                wide_half(j, 1, hi_rows, k0 + 32, &fs_hi, &wc, st_hi, &nan, &big, nxt, fmt);
            }
        }
    }
    if (nan || !range_ok(&big, IS_E4M3(fmt) ? 119 : 125))
        return false;
    wide_close(j, kq, acc, total); /* the last block */
    memcpy(j->out, total, (size_t)M * 32 * sizeof(float));
    return true;
}

bool dg_decode_wide_bf16_avx512bf16(const dg_decode_job *j) { return wide_body(j, FMT_BF16); }
bool dg_decode_wide_e4m3_avx512bf16(const dg_decode_job *j) {
    return j->byte_tables ? wide_body(j, FMT_E4M3V) : wide_body(j, FMT_E4M3);
}
bool dg_decode_wide_e2m1_avx512bf16(const dg_decode_job *j) { return wide_body(j, FMT_E2M1); }
bool dg_decode_wide_e2m1p_avx512bf16(const dg_decode_job *j) { return wide_body(j, FMT_E2M1P); }
