/*
 * hc_prenorm_amx.c - AMX kernels of the fast HC prenorm GEMM (see hc_prenorm_kernels.h).
 *
 * B (float32) is split exactly into three BF16 parts, b = b0 + b1 + b2: b0 = b with its low 16
 * bits cleared (truncation: never rounds up to infinity), b1 the same of b - b0, b2 = b - b0 - b1
 * (at most 8 significant bits, so exact in BF16). Each part is a VNNI B tile operand, A's rows
 * are the tile A operand straight from memory, and TDPBF16PS (exact BF16 products, float32
 * accumulation) adds A b0^T, A b1^T, A b2^T into the same accumulators. The split is exact for
 * |b| >= 2^-103; smaller parts are BF16 denormals, which the tiles flush (as they flush A's).
 * Non-finite b give b0 = b (as BF16: NaNs stay NaNs) and zero lower parts (not inf - inf = NaN).
 *
 * Tiles for a block of up to 32 rows: 0-1 accumulate rows 0-15 (columns 0-15, 16-23), 2-3 rows
 * 16-31, 4-5 hold A rows 0-15 / 16-31, 6-7 the B part (columns 0-15 / 16-23). A block of r rows
 * loads the configuration for r, so no row past the block is read.
 * The square sums use AVX-512 on the same A lines (in L1 for the tile loads after): 16 lanes per
 * row, lane l adding a[k]^2 for k = 2l, 2l + 1 (mod 32) with VDPBF16PS (exact products, float32
 * accumulation, BF16 denormals flushed like the tiles'); both kernels do it the same way.
 */
#include "../hc_prenorm_kernels.h"
#include "amx_tiles.h"

#include <immintrin.h>
#include <string.h>

#define SF DG_HC_AMX_SF
#define STEP DG_HC_AMX_STEP /* uint16 per packed k step: 3 parts */
#define PART (STEP / 3)     /* one part: tile [16 k pairs][16 columns][2], then [16][8][2] */
#define HI_OFF 512          /* uint16 offset of the columns 16-23 tile inside a part */
#define PF_STEPS 8          /* lines are hinted this many k steps ahead */
#define HINT_STEPS 32       /* block_step hints A only for K ranges of fewer k steps */

#define CFG(r0, r1)                                                                                       \
    {                                                                                                     \
        .palette_id = 1, .colsb = {64, 32, (r1) ? 64 : 0, (r1) ? 32 : 0, 64, (r1) ? 64 : 0, 64, 32},      \
        .rows = {r0, r0, r1, r1, r0, r1, 16, 16},                                                         \
    }
/* kCfg[r]: a block of r rows (1..32). Static: see amx_tiles.h. */
static const dg_amx_tilecfg kCfg[33] = {
    {0},         CFG(1, 0),   CFG(2, 0),   CFG(3, 0),   CFG(4, 0),   CFG(5, 0),   CFG(6, 0),
    CFG(7, 0),   CFG(8, 0),   CFG(9, 0),   CFG(10, 0),  CFG(11, 0),  CFG(12, 0),  CFG(13, 0),
    CFG(14, 0),  CFG(15, 0),  CFG(16, 0),  CFG(16, 1),  CFG(16, 2),  CFG(16, 3),  CFG(16, 4),
    CFG(16, 5),  CFG(16, 6),  CFG(16, 7),  CFG(16, 8),  CFG(16, 9),  CFG(16, 10), CFG(16, 11),
    CFG(16, 12), CFG(16, 13), CFG(16, 14), CFG(16, 15), CFG(16, 16),
};

/* 16 x 16 transpose of 32-bit elements: out[c] lane i = in[i] lane c. */
static inline void transpose16(const __m512i in[16], __m512i out[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    /* u[4i + c], 128-bit lane j: column 4j + c of rows 4i .. 4i + 3 */
    for (int i = 0; i < 4; ++i) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; ++c) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                      y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        out[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        out[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
        out[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        out[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
    }
}

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

void dg_hc_amx_pack_b(const float *b, int64_t ldb, int64_t nsc, int64_t k, int64_t s0, int64_t s1, uint16_t *bp) {
    for (int64_t s = s0; s < s1; ++s) {
        __m512i rows[3][32], t[16];
        const int64_t k0 = 32 * s, len = k - k0 < 32 ? k - k0 : 32;
        const __mmask32 m = len == 32 ? ~(__mmask32)0 : (((__mmask32)1 << len) - 1);
        for (int n = 0; n < 32; ++n) {
            __m512i part[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
            if (n < nsc) {
                const float *br = b + n * ldb + k0;
                _mm_prefetch((const char *)(br + 32 * PF_STEPS), _MM_HINT_T0);
                _mm_prefetch((const char *)(br + 32 * PF_STEPS + 16), _MM_HINT_T0);
                split3(_mm512_maskz_loadu_ps((__mmask16)m, br), _mm512_maskz_loadu_ps((__mmask16)(m >> 16), br + 16),
                       part);
            }
            for (int q = 0; q < 3; ++q)
                rows[q][n] = part[q];
        }
        uint16_t *out = bp + s * STEP;
        for (int q = 0; q < 3; ++q) {
            transpose16(rows[q], t); /* tile row p: pair p of columns 0-15 */
            for (int p = 0; p < 16; ++p)
                _mm512_store_si512(out + q * PART + 32 * p, t[p]);
            transpose16(rows[q] + 16, t); /* columns 16-23 (24-31 are zero) */
            for (int p = 0; p < 16; ++p)
                _mm256_store_si256((__m256i *)(out + q * PART + HI_OFF + 16 * p), _mm512_castsi512_si256(t[p]));
        }
    }
}

/* One k step of 32 for the block: hints (when `hint`), square sums, then the tile products of
 * the 3 parts. ak: the block's first row at this step (row stride lda elements); bs: the packed
 * B step. Long K ranges take no software hints for A: with 32 rows in flight they take the line
 * fill buffers the hardware streamers need (measured: the M = 4096, K = 28672 call took ~20%
 * less CPU time without them); short ranges (splits) keep them, the streamers having no time to
 * ramp up there (and the hints past the range fetch the next split's).
 * Each B tile is reloaded as soon as the products reading it are issued (columns 0-15 before
 * 16-23), so the load overlaps the other tile's products; each accumulator still takes the
 * parts in order 0, 1, 2 (the same bits). */
static inline __attribute__((always_inline)) void block_step(const uint16_t *ak, int64_t lda, int rows, const int two,
                                                            const uint16_t *bs, float *st, int squares, int hint) {
    for (int r = 0; r < rows; ++r) {
        const uint16_t *ar = ak + r * lda;
        if (hint)
            _mm_prefetch((const char *)(ar + 32 * PF_STEPS), _MM_HINT_T0);
        if (squares) {
            const __m512bh x = (__m512bh)_mm512_loadu_si512(ar);
            float *acc = st + r * SF + DG_HC_NS;
            _mm512_storeu_ps(acc, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), x, x));
        }
    }
    _tile_loadd(4, ak, lda * 2);
    if (two)
        _tile_loadd(5, ak + 16 * lda, lda * 2);
    _tile_loadd(6, bs, 64);
    _tile_loadd(7, bs + HI_OFF, 32);
    for (int q = 0; q < 3; ++q) {
        _tile_dpbf16ps(0, 4, 6);
        if (two)
            _tile_dpbf16ps(2, 5, 6);
        if (q < 2)
            _tile_loadd(6, bs + (q + 1) * PART, 64);
        _tile_dpbf16ps(1, 4, 7);
        if (two)
            _tile_dpbf16ps(3, 5, 7);
        if (q < 2)
            _tile_loadd(7, bs + (q + 1) * PART + HI_OFF, 32);
    }
}

static inline __attribute__((always_inline)) void block_body(const uint16_t *a, int64_t lda, int rows, const int two,
                                                            int64_t k0, int64_t k1, const uint16_t *bp, float *st,
                                                            int first, int squares) {
    const int64_t ldst = SF * (int64_t)sizeof(float);
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        if (two) {
            _tile_zero(2);
            _tile_zero(3);
        }
        for (int r = 0; squares && r < rows; ++r)
            _mm512_storeu_ps(st + r * SF + DG_HC_NS, _mm512_setzero_ps());
    } else {
        _tile_loadd(0, st, ldst);
        _tile_loadd(1, st + 16, ldst);
        if (two) {
            _tile_loadd(2, st + 16 * SF, ldst);
            _tile_loadd(3, st + 16 * SF + 16, ldst);
        }
    }
    const int64_t kend = k0 + (k1 - k0) / 32 * 32;
    const int hint = k1 - k0 < 32 * HINT_STEPS;
    for (int64_t k = k0; k < kend; k += 32)
        block_step(a + k, lda, rows, two, bp + k / 32 * STEP, st, squares, hint);
    if (kend < k1) { /* K tail: A zero-padded to 32 (B's packing is) */
        uint16_t buf[32 * 32] __attribute__((aligned(64)));
        memset(buf, 0, sizeof buf);
        for (int r = 0; r < rows; ++r)
            memcpy(buf + 32 * r, a + r * lda + kend, (size_t)(k1 - kend) * sizeof(uint16_t));
        block_step(buf, 32, rows, two, bp + kend / 32 * STEP, st, squares, 0);
    }
    _tile_stored(0, st, ldst);
    _tile_stored(1, st + 16, ldst);
    if (two) {
        _tile_stored(2, st + 16 * SF, ldst);
        _tile_stored(3, st + 16 * SF + 16, ldst);
    }
}

void dg_hc_amx_block(const uint16_t *a, int64_t lda, int rows, int64_t k0, int64_t k1, const uint16_t *bp, float *st,
                     int first, int squares) {
    _tile_loadconfig(&kCfg[rows]);
    if (rows > 16)
        block_body(a, lda, rows, 1, k0, k1, bp, st, first, squares);
    else
        block_body(a, lda, rows, 0, k0, k1, bp, st, first, squares);
}

void dg_hc_amx_finish(const float *st, int rows, int64_t nsc, float *d, int64_t ldd, float *s) {
    for (int r = 0; r < rows; ++r) {
        const float *sr = st + r * SF;
        memcpy(d + r * ldd, sr, (size_t)nsc * sizeof(float));
        if (s) { /* the 16 lanes in a fixed tree */
            const __m512 v = _mm512_loadu_ps(sr + DG_HC_NS);
            const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
            __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            q = _mm_add_ps(q, _mm_movehl_ps(q, q));
            s[r] = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
        }
    }
}

/*
 * Few rows: the transposed products D^T = B A^T, with B's parts as tile A operands (rows of B,
 * converted k step by k step into L1, never packed) and A as the VNNI tile B operand (one 16 x 16
 * transpose of the rows' pairs per step). TDPBF16PS gives each element the same bits either way
 * round (measured on this hardware; the tests check it), so rows come out as from dg_hc_amx_block.
 * Tiles: 0 = D^T columns 0-15 x 16 rows of A, 1 = columns 16-23; 2-3 a part of B's rows 0-15 /
 * 16-23; 4 = A^T. Rows of A past `rows` are zero.
 */
static const dg_amx_tilecfg kCfgT = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64},
    .rows = {16, 8, 16, 8, 16},
};

void dg_hc_amx_block_t(const uint16_t *a, int64_t lda, int rows, int64_t k0, int64_t k1, const float *b, int64_t ldb,
                       int64_t nsc, float *st, int squares) {
    uint16_t bq[3][DG_HC_NS][32] __attribute__((aligned(64)));
    uint32_t av[16][16] __attribute__((aligned(64)));
    float ct[DG_HC_NS][16] __attribute__((aligned(64)));
    if (nsc < DG_HC_NS)
        memset(bq, 0, sizeof bq);
    _tile_loadconfig(&kCfgT);
    _tile_zero(0);
    _tile_zero(1);
    __m512 sq[16];
    for (int r = 0; r < 16; ++r)
        sq[r] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 32) {
        const int64_t len = k1 - k < 32 ? k1 - k : 32;
        const __mmask32 m = len == 32 ? ~(__mmask32)0 : (((__mmask32)1 << len) - 1);
        for (int n = 0; n < nsc; ++n) {
            const float *br = b + n * ldb + k;
            _mm_prefetch((const char *)(br + 32 * PF_STEPS), _MM_HINT_T0);
            _mm_prefetch((const char *)(br + 32 * PF_STEPS + 16), _MM_HINT_T0);
            __m512i part[3];
            split3(_mm512_maskz_loadu_ps((__mmask16)m, br), _mm512_maskz_loadu_ps((__mmask16)(m >> 16), br + 16), part);
            for (int q = 0; q < 3; ++q)
                _mm512_store_si512(bq[q][n], part[q]);
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
        transpose16(x, t); /* row p: pair p of every row of A */
        for (int p = 0; p < 16; ++p)
            _mm512_store_si512(av[p], t[p]);
        _tile_loadd(4, av, 64);
        for (int q = 0; q < 3; ++q) {
            _tile_loadd(2, bq[q][0], 64);
            _tile_loadd(3, bq[q][16], 64);
            _tile_dpbf16ps(0, 2, 4);
            _tile_dpbf16ps(1, 3, 4);
        }
    }
    _tile_stored(0, ct[0], 64);
    _tile_stored(1, ct[16], 64);
    for (int r = 0; r < rows; ++r) {
        for (int n = 0; n < DG_HC_NS; ++n)
            st[r * SF + n] = ct[n][r];
        if (squares)
            _mm512_storeu_ps(st + r * SF + DG_HC_NS, sq[r]);
    }
}
