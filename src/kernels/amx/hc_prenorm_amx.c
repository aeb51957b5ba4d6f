/*
 * hc_prenorm_amx.c - AMX kernels of the fast HC prenorm GEMM (see hc_prenorm_kernels.h).
 *
 * B (float32) is split exactly into three BF16 parts, b = b0 + b1 + b2: b0 = b with its low 16
 * bits cleared (truncation: never rounds up to infinity), b1 the same of b - b0, b2 = b - b0 - b1
 * (at most 8 significant bits, so exact in BF16). The parts of B's 24 rows are 72 of the 80
 * columns of a VNNI B operand (five tiles of 16), A's rows are the tile A operand straight from
 * memory, and TDPBF16PS (exact BF16 products, float32 accumulation) adds A b0^T, A b1^T, A b2^T
 * into separate accumulators; d = (d0 + d1) + d2 at the end. The split is exact for
 * |b| >= 2^-103; smaller parts are BF16 denormals, which the tiles flush (as they flush A's).
 * Non-finite b give b0 = b (as BF16: NaNs stay NaNs) and zero lower parts (not inf - inf = NaN).
 *
 * Tiles for a block of up to 16 rows: 0-4 accumulate the 80 columns, 5 and 7 hold the A rows
 * (even and odd k steps), 6 the B tile of the moment. A block of r rows uses the configuration
 * for r, so no row past the block is read. Five products per 1 KiB of A keep the tiles ahead of
 * memory: with both cores the kernel streams A at 85-95% of the DRAM read rate (32-row blocks
 * sharing B tiles, three parts per accumulator, reached ~55%).
 * The square sums use AVX-512 on the same A lines, one k step behind the tile load that brought
 * them into L1 (loading them first made these loads the ones that wait for memory, measured
 * ~25% slower): 16 lanes per row, lane l adding a[k]^2 for k = 2l, 2l + 1 (mod 32) with
 * VDPBF16PS (exact products, float32 accumulation, BF16 denormals flushed like the tiles'), in
 * increasing k; both kernels do it the same way.
 */
#include "../hc_prenorm_kernels.h"
#include "../transpose16_avx512.h"
#include "amx_tiles.h"

#include <immintrin.h>
#include <string.h>

#define SF DG_HC_AMX_SF
#define STEP DG_HC_AMX_STEP /* uint16 per packed k step */
#define NT (DG_HC_AMX_COLS / 16) /* accumulator tiles */
#define SQ DG_HC_AMX_COLS        /* offset of the square-sum lanes in a row state */
#define PF_STEPS 8               /* B lines are hinted this many k steps ahead */

#define CFG(r)                                                                                                    \
    {                                                                                                             \
        .palette_id = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {r, r, r, r, r, r, 16, r},                  \
    }
/* kCfg[r]: a block of r rows (1..16). Static: see amx_tiles.h. */
static const dg_amx_tilecfg kCfg[17] = {
    {0},    CFG(1),  CFG(2),  CFG(3),  CFG(4),  CFG(5),  CFG(6),  CFG(7),  CFG(8),
    CFG(9), CFG(10), CFG(11), CFG(12), CFG(13), CFG(14), CFG(15), CFG(16),
};

/* The three BF16 parts of 32 floats (lo: k 0-15, hi: k 16-31), each as 16 k pairs. */
static inline void split3(__m512 lo, __m512 hi, __m512i part[3]) {
    const __m512i top = _mm512_set1_epi32((int)0xFFFF0000), expo = _mm512_set1_epi32(0x7F800000);
    __m512 p[2][3];
    const __m512 x[2] = {lo, hi};
    for (int h = 0; h < 2; ++h) {
        const __m512i bits = _mm512_castps_si512(x[h]);
        const __mmask16 finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(bits, expo), expo);
        /* non-finite lanes stay whole: the conversion keeps infinities and quiets NaNs (a NaN
         * whose payload lies in the low 16 bits would truncate to an infinity) */
        p[h][0] = _mm512_castsi512_ps(_mm512_mask_and_epi32(bits, finite, bits, top));
        const __m512 r1 = _mm512_maskz_sub_ps(finite, x[h], p[h][0]); /* exact */
        p[h][1] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r1), top));
        p[h][2] = _mm512_sub_ps(r1, p[h][1]); /* exact, at most 8 significant bits */
    }
    for (int q = 0; q < 3; ++q) /* exact conversions: every part is a BF16 value */
        part[q] = (__m512i)_mm512_cvtne2ps_pbh(p[1][q], p[0][q]);
}

/* The parts of one k step of a row of b (br: its first element; m: the valid elements), with the
 * same step PF_STEPS ahead hinted into the cache. */
static inline void split_step(const float *br, __mmask32 m, __m512i part[3]) {
    _mm_prefetch((const char *)(br + 32 * PF_STEPS), _MM_HINT_T0);
    _mm_prefetch((const char *)(br + 32 * PF_STEPS + 16), _MM_HINT_T0);
    split3(_mm512_maskz_loadu_ps((__mmask16)m, br), _mm512_maskz_loadu_ps((__mmask16)(m >> 16), br + 16), part);
}

void dg_hc_amx_pack_b(const float *b, int64_t ldb, int64_t nsc, int64_t k, int64_t s0, int64_t s1, uint16_t *bp) {
    for (int64_t s = s0; s < s1; ++s) {
        __m512i cols[DG_HC_AMX_COLS], t[16]; /* column c: its 16 k pairs */
        const int64_t k0 = 32 * s, len = k - k0 < 32 ? k - k0 : 32;
        const __mmask32 m = len == 32 ? ~(__mmask32)0 : (((__mmask32)1 << len) - 1);
        for (int c = 0; c < DG_HC_AMX_COLS; ++c)
            cols[c] = _mm512_setzero_si512();
        for (int n = 0; n < nsc; ++n) {
            __m512i part[3];
            split_step(b + n * ldb + k0, m, part);
            for (int q = 0; q < 3; ++q)
                cols[q * DG_HC_NS + n] = part[q];
        }
        uint16_t *out = bp + s * STEP;
        for (int q = 0; q < NT; ++q) {
            dg_transpose16_epi32(cols + 16 * q, t); /* tile row p: pair p of the tile's 16 columns */
            for (int p = 0; p < 16; ++p)
                _mm512_store_si512(out + q * 512 + 32 * p, t[p]);
        }
    }
}

/* Adds rows [0, rows) of one k step's A lines (ak: row 0, row stride lda) into the lanes sq. */
static inline __attribute__((always_inline)) void add_squares(const uint16_t *ak, int64_t lda, int rows, __m512 sq[16]) {
    for (int r = 0; r < rows; ++r) {
        const __m512bh x = (__m512bh)_mm512_loadu_si512(ak + r * lda);
        sq[r] = _mm512_dpbf16_ps(sq[r], x, x);
    }
}

/*
 * The lane sums of 16 vectors (lane r of the result: v[r]'s) in a fixed tree, h_i = l_i + l_{i+8},
 * q_i = h_i + h_{i+4}, then (q_0 + q_2) + (q_1 + q_3), by a transposing reduction: ~30
 * instructions for 16 rows.
 */
static inline __m512 lane_sums16(const __m512 v[16]) {
    __m512 h[8], q[4], t[2];
    for (int i = 0; i < 8; ++i) /* rows 2i, 2i+1: lanes i + (i + 8) -> 8 lanes each */
        h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i) /* rows 4i .. 4i+3: lanes i + (i + 4) -> 4 lanes each */
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i) /* per 128-bit lane: rows of q[2i] and q[2i+1], lanes i + (i + 2) */
        t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(q[2 * i]), _mm512_castps_pd(q[2 * i + 1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(q[2 * i]), _mm512_castps_pd(q[2 * i + 1]))));
    /* lanes 0 + 1 of each row */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x88), _mm512_shuffle_ps(t[0], t[1], 0xDD));
    /* row 4e + j sits in lane 4j + e */
    const __m512i row_lane = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(row_lane, r);
}

/* d[r][0, nsc) = (part 0 + part 1) + part 2 of the rows' column sums in st. */
static inline void finish_d(const float *st, int rows, int64_t nsc, float *d, int64_t ldd) {
    const __mmask32 m = (__mmask32)(((uint64_t)1 << nsc) - 1);
    for (int r = 0; r < rows; ++r) {
        const float *sr = st + r * SF;
        for (int h = 0; h < 2; ++h) { /* columns 0-15, 16-23 */
            const __mmask16 mh = (__mmask16)(m >> (16 * h));
            const __m512 p0 = _mm512_maskz_loadu_ps(mh, sr + 16 * h);
            const __m512 p1 = _mm512_maskz_loadu_ps(mh, sr + DG_HC_NS + 16 * h);
            const __m512 p2 = _mm512_maskz_loadu_ps(mh, sr + 2 * DG_HC_NS + 16 * h);
            _mm512_mask_storeu_ps(d + r * ldd + 16 * h, mh, _mm512_add_ps(_mm512_add_ps(p0, p1), p2));
        }
    }
}

void dg_hc_amx_finish(const float *st, int rows, int64_t nsc, float *d, int64_t ldd, float *s) {
    finish_d(st, rows, nsc, d, ldd);
    for (int r0 = 0; s && r0 < rows; r0 += 16) {
        __m512 v[16];
        for (int r = 0; r < 16; ++r)
            v[r] = r0 + r < rows ? _mm512_loadu_ps(st + (r0 + r) * SF + SQ) : _mm512_setzero_ps();
        const int n = rows - r0 < 16 ? rows - r0 : 16;
        _mm512_mask_storeu_ps(s + r0, (__mmask16)((1u << n) - 1), lane_sums16(v));
    }
}

/* A k step is the A tile load, then the products of A (tile TA: 5 for even k steps, 7 for odd
 * ones, so that the next step's A load need not wait for this step's products to free the tile:
 * measured ~14% faster at K = 28672) with the five B tiles of bs. */
#define LOAD_A(TA, ak, lda) _tile_loadd(TA, (ak), (lda) * 2)
#define PRODUCTS(TA, bs)                                                                                              \
    do {                                                                                                              \
        _tile_loadd(6, (bs), 64);                                                                                      \
        _tile_dpbf16ps(0, TA, 6);                                                                                      \
        _tile_loadd(6, (bs) + 512, 64);                                                                                \
        _tile_dpbf16ps(1, TA, 6);                                                                                      \
        _tile_loadd(6, (bs) + 1024, 64);                                                                               \
        _tile_dpbf16ps(2, TA, 6);                                                                                      \
        _tile_loadd(6, (bs) + 1536, 64);                                                                               \
        _tile_dpbf16ps(3, TA, 6);                                                                                      \
        _tile_loadd(6, (bs) + 2048, 64);                                                                               \
        _tile_dpbf16ps(4, TA, 6);                                                                                      \
    } while (0)

/* Stores the accumulators and square lanes into the state st; then, when `restart`, zeroes them. */
static inline __attribute__((always_inline)) void save_state(float *st, int rows, __m512 sq[16], const int squares,
                                                            int restart) {
    const int64_t ldst = SF * (int64_t)sizeof(float);
    _tile_stored(0, st, ldst);
    _tile_stored(1, st + 16, ldst);
    _tile_stored(2, st + 32, ldst);
    _tile_stored(3, st + 48, ldst);
    _tile_stored(4, st + 64, ldst);
    for (int r = 0; squares && r < rows; ++r)
        _mm512_storeu_ps(st + r * SF + SQ, sq[r]);
    if (restart) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(4);
        for (int r = 0; r < 16; ++r)
            sq[r] = _mm512_setzero_ps();
    }
}

/* At a cut: the finished piece's outputs to d (through a state in L1) and s, then zeroed sums. */
static inline __attribute__((always_inline)) void finish_piece(int rows, __m512 sq[16], const int squares, int64_t nsc,
                                                              float *d, float *s) {
    float tmp[16 * SF] __attribute__((aligned(64)));
    if (squares)
        _mm512_mask_storeu_ps(s, (__mmask16)((1u << rows) - 1), lane_sums16(sq));
    save_state(tmp, rows, sq, 0, 1);
    finish_d(tmp, rows, nsc, d, DG_HC_NS);
}

/*
 * The pieces of [k0, k1) between the cuts, in one pass: at a cut the next piece's first A tile is
 * loaded before the finished piece is stored, written out and its sums zeroed, so the A stream
 * does not wait for the stores. Square sums lag one k step (lines in L1): a cut first adds the
 * finished piece's last step.
 */
static inline __attribute__((always_inline)) void block_body(const uint16_t *a, int64_t lda, int rows, int64_t k0,
                                                            int64_t k1, const int64_t *cuts, int ncuts,
                                                            const uint16_t *bp, float *st, int first, int64_t nsc,
                                                            float *stage, float *stage_s, int64_t slot,
                                                            const int squares) {
    const int64_t ldst = SF * (int64_t)sizeof(float);
    __m512 sq[16];
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(4);
    } else {
        _tile_loadd(0, st, ldst);
        _tile_loadd(1, st + 16, ldst);
        _tile_loadd(2, st + 32, ldst);
        _tile_loadd(3, st + 48, ldst);
        _tile_loadd(4, st + 64, ldst);
    }
    for (int r = 0; r < 16; ++r)
        sq[r] = first || !squares || r >= rows ? _mm512_setzero_ps() : _mm512_loadu_ps(st + r * SF + SQ);
    const int64_t kend = k0 + (k1 - k0) / 32 * 32;
    int c = 0;
    int64_t next = ncuts > 0 ? cuts[0] : k1 + 1;
    for (int64_t k = k0; k < kend; k += 32) {
        const int odd = (k / 32) % 2;
        const uint16_t *bs = bp + k / 32 * STEP;
        if (odd)
            LOAD_A(7, a + k, lda);
        else
            LOAD_A(5, a + k, lda);
        if (squares && k > k0 && k == next) /* the finished piece's last step */
            add_squares(a + k - 32, lda, rows, sq);
        if (k == next) {
            finish_piece(rows, sq, squares, nsc, stage + c * slot * DG_HC_NS, stage_s + c * slot);
            next = ++c < ncuts ? cuts[c] : k1 + 1;
        }
        if (odd)
            PRODUCTS(7, bs);
        else
            PRODUCTS(5, bs);
        if (squares && k > k0 && (c == 0 || k != cuts[c - 1])) /* the previous step's lines */
            add_squares(a + k - 32, lda, rows, sq);
    }
    if (squares && kend > k0)
        add_squares(a + kend - 32, lda, rows, sq);
    if (kend < k1) { /* K tail: A zero-padded to 32 (B's packing is) */
        if (kend == next) {
            finish_piece(rows, sq, squares, nsc, stage + c * slot * DG_HC_NS, stage_s + c * slot);
            ++c;
        }
        uint16_t buf[16 * 32] __attribute__((aligned(64)));
        memset(buf, 0, sizeof buf);
        for (int r = 0; r < rows; ++r)
            memcpy(buf + 32 * r, a + r * lda + kend, (size_t)(k1 - kend) * sizeof(uint16_t));
        const uint16_t *bs = bp + kend / 32 * STEP;
        if ((kend / 32) % 2) {
            LOAD_A(7, buf, 32);
            PRODUCTS(7, bs);
        } else {
            LOAD_A(5, buf, 32);
            PRODUCTS(5, bs);
        }
        if (squares)
            add_squares(buf, 32, rows, sq);
    }
    save_state(st, rows, sq, squares, 0);
}

void dg_hc_amx_config(int rows) { _tile_loadconfig(&kCfg[rows]); }

void dg_hc_amx_block(const uint16_t *a, int64_t lda, int rows, int64_t k0, int64_t k1, const int64_t *cuts, int ncuts,
                     const uint16_t *bp, float *st, int first, int squares, int64_t nsc, float *stage, float *stage_s,
                     int64_t slot) {
    if (squares)
        block_body(a, lda, rows, k0, k1, cuts, ncuts, bp, st, first, nsc, stage, stage_s, slot, 1);
    else
        block_body(a, lda, rows, k0, k1, cuts, ncuts, bp, st, first, nsc, stage, stage_s, slot, 0);
}

/*
 * Few rows: the transposed products D^T = B A^T, with B's parts as tile A operands (its 80
 * columns as rows, converted k step by k step into L1, never packed) and A as the VNNI tile B
 * operand (one 16 x 16 transpose of the rows' pairs per step). TDPBF16PS gives each element the
 * same bits either way round (measured on this hardware; the tests check it), so rows come out
 * as from dg_hc_amx_block. Tiles: 0-4 = D^T columns 16q .. 16q + 15 x 16 rows of A; 5 a tile of
 * B's parts; 6 = A^T. Rows of A past `rows` are zero.
 */
static const dg_amx_tilecfg kCfgT = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16},
};

void dg_hc_amx_block_t(const uint16_t *a, int64_t lda, int rows, int64_t k0, int64_t k1, const float *b, int64_t ldb,
                       int64_t nsc, float *st, int squares) {
    uint16_t bq[DG_HC_AMX_COLS][32] __attribute__((aligned(64)));
    uint32_t av[16][16] __attribute__((aligned(64)));
    float ct[DG_HC_AMX_COLS][16] __attribute__((aligned(64)));
    memset(bq, 0, sizeof bq); /* columns past nsc in each part, and the last 8 */
    _tile_loadconfig(&kCfgT);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    __m512 sq[16];
    for (int r = 0; r < 16; ++r)
        sq[r] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 32) {
        const int64_t len = k1 - k < 32 ? k1 - k : 32;
        const __mmask32 m = len == 32 ? ~(__mmask32)0 : (((__mmask32)1 << len) - 1);
        for (int n = 0; n < nsc; ++n) {
            __m512i part[3];
            split_step(b + n * ldb + k, m, part);
            for (int q = 0; q < 3; ++q)
                _mm512_store_si512(bq[q * DG_HC_NS + n], part[q]);
        }
        __m512i x[16], t[16];
        for (int r = 0; r < 16; ++r) {
            x[r] = _mm512_setzero_si512();
            if (r < rows) {
                const uint16_t *ar = a + r * lda + k;
                _mm_prefetch((const char *)(ar + 32 * PF_STEPS), _MM_HINT_T0);
                x[r] = _mm512_maskz_loadu_epi16(m, ar);
                sq[r] = _mm512_dpbf16_ps(sq[r], (__m512bh)x[r], (__m512bh)x[r]);
            }
        }
        dg_transpose16_epi32(x, t); /* row p: pair p of every row of A */
        for (int p = 0; p < 16; ++p)
            _mm512_store_si512(av[p], t[p]);
        _tile_loadd(6, av, 64);
        _tile_loadd(5, bq[0], 64);
        _tile_dpbf16ps(0, 5, 6);
        _tile_loadd(5, bq[16], 64);
        _tile_dpbf16ps(1, 5, 6);
        _tile_loadd(5, bq[32], 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(5, bq[48], 64);
        _tile_dpbf16ps(3, 5, 6);
        _tile_loadd(5, bq[64], 64);
        _tile_dpbf16ps(4, 5, 6);
    }
    _tile_stored(0, ct[0], 64);
    _tile_stored(1, ct[16], 64);
    _tile_stored(2, ct[32], 64);
    _tile_stored(3, ct[48], 64);
    _tile_stored(4, ct[64], 64);
    for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < DG_HC_AMX_COLS; ++c)
            st[r * SF + c] = ct[c][r];
        if (squares)
            _mm512_storeu_ps(st + r * SF + SQ, sq[r]);
    }
}
