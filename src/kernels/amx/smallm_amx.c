/*
 * smallm_amx.c - AMX kernels of the small-M (decoding) paths, M <= 64 (up to 4 tiles of 16 rows).
 *
 * dg_amx_small_t (unpacked B, smallm.c) computes D^T: 16 rows of B (K-major BF16, straight
 * from memory or from a widened scratch) are the tile-A operand, A packed as VNNI pairs
 * (DG_PACK_AMX_B with R = 16) the tile-B operand, giving [16 n][16 m] float32 tiles.
 * dg_amx_small_pp (pre-packed B, prepack.c) keeps the normal orientation: A packed
 * DG_PACK_AMX_A (R = 16) against the 32-column DG_PACK_AMX_B panels of B, giving [16 m][32 n].
 * Either way every element gets the same TDPBF16PS k steps of 32 (same zero padding), with the
 * products a*b = b*a, as in ukr_bf16_amx.c, so results match the large-M path bitwise.
 * Tiles: 0-3 accumulators, 4-7 operands; all 16 rows x 64 bytes (one configuration).
 */
#include "../../engine/engine.h"
#include "amx_tiles.h"
#include "../e4m3_bf16_avx512.h"
#include "../e4m3_bf16_bytes.h"

#include <immintrin.h>

static const dg_amx_tilecfg kSmallTiles = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void dg_amx_small_begin(void) { _tile_loadconfig(&kSmallTiles); }

/* pf: bytes ahead along each B row to prefetch into L2 (0: none); one thread must keep many
 * DRAM misses in flight across its row streams (the hardware prefetcher alone does not). */
/* And PF_L1 bytes ahead into L1: tile loads that miss L1 stall the tile unit. */
#define PF_L1 128
/* One k step of dg_amx_small_t with B in tile BT, accumulators C0..C3 (tile numbers must be
 * literal tokens for the AMX intrinsics). B alternates between tiles 4 and 5 and A between 6
 * and 7, so that the next load does not wait for the products still reading a tile. */
/* Accumulator tiles 0 .. mt - 1 (16 x 16 floats, 256 apart in acc): loaded when `accumulate`,
 * else zeroed; stored back at the end. */
static inline void acc_begin(const float *acc, int mt, int accumulate) {
    if (accumulate) {
        _tile_loadd(0, acc, 64);
        if (mt > 1)
            _tile_loadd(1, acc + 256, 64);
        if (mt > 2)
            _tile_loadd(2, acc + 512, 64);
        if (mt > 3)
            _tile_loadd(3, acc + 768, 64);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
}

static inline void acc_end(float *acc, int mt) {
    _tile_stored(0, acc, 64);
    if (mt > 1)
        _tile_stored(1, acc + 256, 64);
    if (mt > 2)
        _tile_stored(2, acc + 512, 64);
    if (mt > 3)
        _tile_stored(3, acc + 768, 64);
}

#define SMALL_T_STEP(BT, s, C0, C1, C2, C3)                                                        \
    do {                                                                                           \
        const uint16_t *bs = b + (s) * 32, *as = a + (s) * 512;                                    \
        if (pf)                                                                                    \
            for (int r = 0; r < 16; ++r) {                                                         \
                _mm_prefetch((const char *)(bs + r * ldb) + pf, _MM_HINT_T1);                      \
                _mm_prefetch((const char *)(bs + r * ldb) + PF_L1, _MM_HINT_T0);                   \
            }                                                                                      \
        _tile_loadd(BT, bs, ldb * 2);                                                              \
        _tile_loadd(6, as, 64);                                                                    \
        _tile_dpbf16ps(C0, BT, 6);                                                                 \
        if (mt > 1) {                                                                              \
            _tile_loadd(7, as + lda, 64);                                                          \
            _tile_dpbf16ps(C1, BT, 7);                                                             \
        }                                                                                          \
        if (mt > 2) {                                                                              \
            _tile_loadd(6, as + 2 * lda, 64);                                                      \
            _tile_dpbf16ps(C2, BT, 6);                                                             \
        }                                                                                          \
        if (mt > 3) {                                                                              \
            _tile_loadd(7, as + 3 * lda, 64);                                                      \
            _tile_dpbf16ps(C3, BT, 7);                                                             \
        }                                                                                          \
    } while (0)

#define SMALL_T_BODY(C0, C1, C2, C3)                                                               \
    do {                                                                                           \
        acc_begin(acc, mt, accumulate);                                                            \
        int64_t s = 0;                                                                             \
        for (; s + 1 < steps; s += 2) {                                                            \
            SMALL_T_STEP(4, s, C0, C1, C2, C3);                                                    \
            SMALL_T_STEP(5, s + 1, C0, C1, C2, C3);                                                \
        }                                                                                          \
        if (s < steps)                                                                             \
            SMALL_T_STEP(4, s, C0, C1, C2, C3);                                                    \
        acc_end(acc, mt);                                                                          \
    } while (0)

void dg_amx_small_t(int64_t steps, const uint16_t *b, int64_t ldb, int64_t pf, const uint16_t *a, int64_t lda,
                    int mt, float *acc, int accumulate) {
    SMALL_T_BODY(0, 1, 2, 3);
}
#undef SMALL_T_BODY
#undef SMALL_T_STEP

/* total[p][n][m] = fma(sa[p][m] * sb[n], acc[p][n][m], total[p][n][m]): the large-M kernel's
 * scale epilogue, transposed (sa * sb commutes). sa: 16 floats per tile at stride sa_stride. */
void dg_amx_small_t_scale(int mt, const float *acc, float *total, const float *sa, int64_t sa_stride,
                          const float *sb) {
    for (int p = 0; p < mt; ++p) {
        const __m512 va = _mm512_loadu_ps(sa + p * sa_stride);
        for (int n = 0; n < 16; ++n) {
            const int64_t o = p * 256 + n * 16;
            _mm512_storeu_ps(total + o, _mm512_fmadd_ps(_mm512_mul_ps(va, _mm512_set1_ps(sb[n])),
                                                        _mm512_loadu_ps(acc + o), _mm512_loadu_ps(total + o)));
        }
    }
}

/* Pre-packed B: one or two A tiles (mt <= 2) against both 16-column halves of a 32-column
 * panel (accumulators p * 2 + h, acc [16 mt][32]); larger M runs this per pair of A tiles, the
 * panel piece then coming from L1/L2. pf: bytes ahead in the panel to prefetch (0: none). */
void dg_amx_small_pp(int64_t steps, const uint16_t *a, int64_t lda, int mt, const uint16_t *b, int64_t pf,
                     float *acc, int accumulate) {
    if (accumulate) {
        _tile_loadd(0, acc, 128);
        _tile_loadd(1, acc + 16, 128);
        if (mt > 1) {
            _tile_loadd(2, acc + 512, 128);
            _tile_loadd(3, acc + 512 + 16, 128);
        }
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t s = 0; s < steps; ++s) {
        const uint16_t *bs = b + s * 1024, *as = a + s * 512;
        if (pf)
            for (int l = 0; l < 2048; l += 64)
                _mm_prefetch((const char *)bs + pf + l, _MM_HINT_T0);
        _tile_loadd(6, bs, 128);
        _tile_loadd(7, bs + 32, 128);
        _tile_loadd(4, as, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (mt > 1) {
            _tile_loadd(5, as + lda, 64);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, acc, 128);
    _tile_stored(1, acc + 16, 128);
    if (mt > 1) {
        _tile_stored(2, acc + 512, 128);
        _tile_stored(3, acc + 512 + 16, 128);
    }
}

/* total[r][n] = fma(sa[r] * sb[n], acc[r][n], total[r][n]) for 16 rows of 32 columns. */
void dg_amx_small_pp_scale(const float *acc, float *total, const float *sa, const float *sb) {
    const __m512 s0 = _mm512_loadu_ps(sb), s1 = _mm512_loadu_ps(sb + 16);
    for (int r = 0; r < 16; ++r) {
        const __m512 ar = _mm512_set1_ps(sa[r]);
        const float *x = acc + 32 * r;
        float *t = total + 32 * r;
        _mm512_storeu_ps(t, _mm512_fmadd_ps(_mm512_mul_ps(ar, s0), _mm512_loadu_ps(x), _mm512_loadu_ps(t)));
        _mm512_storeu_ps(t + 16,
                         _mm512_fmadd_ps(_mm512_mul_ps(ar, s1), _mm512_loadu_ps(x + 16), _mm512_loadu_ps(t + 16)));
    }
}

/* Hints the n bytes of a row `ahead` bytes past s into L2 (nothing when ahead is 0). */
static inline void prefetch_ahead(const uint8_t *s, int64_t n, int64_t ahead) {
    for (int64_t l = 0; ahead && l < n; l += 64)
        _mm_prefetch((const char *)s + ahead + l, _MM_HINT_T1);
}

/* Byte q of table half h: dg_kE4m3Bf16Mag[64 h + q]'s low byte (lo_t) and high byte (hi_t). */
static inline void e4m3_byte_tables(__m512i lo_t[2], __m512i hi_t[2]) {
    for (int h = 0; h < 2; ++h) {
        lo_t[h] = _mm512_load_si512(dg_e4m3_bf16_lo + 64 * h);
        hi_t[h] = _mm512_load_si512(dg_e4m3_bf16_hi + 64 * h);
    }
}

/* dg_amx_widen_e4m3_rows with byte tables (AVX512-VBMI, which every AMX CPU has; checked at
 * run time): 64 codes per step, the low and high bytes of the BF16 words looked up separately
 * (vpermi2b over 128 entries) and interleaved; about a third of the word-table path's work. */
__attribute__((target("avx512vbmi"))) static void widen_e4m3_vbmi(const uint8_t *src, int64_t ld, int rows,
                                                                   int64_t n, int64_t ahead, uint16_t *dst,
                                                                   int64_t ldd) {
    __m512i lo_t[2], hi_t[2];
    e4m3_byte_tables(lo_t, hi_t);
    /* lane L gets qwords L and L + 4: the in-lane unpacks then give codes 0..31 and 32..63 in order */
    const __m512i order = _mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0), sign = _mm512_set1_epi8((char)0x80);
    for (int r = 0; r < rows; ++r) {
        const uint8_t *s = src + r * ld;
        uint16_t *o = dst + r * ldd;
        prefetch_ahead(s, n, ahead);
        for (int64_t i = 0; i < n; i += 64) {
            const int64_t c = n - i < 64 ? n - i : 64;
            const __mmask64 mask = c == 64 ? ~(__mmask64)0 : ((__mmask64)1 << c) - 1;
            const __m512i v = _mm512_permutexvar_epi64(order, _mm512_maskz_loadu_epi8(mask, s + i));
            const __m512i lo = _mm512_permutex2var_epi8(lo_t[0], v, lo_t[1]); /* index bit 7 ignored */
            const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi_t[0], v, hi_t[1]), v, sign,
                                                         0xf8); /* | (v & 0x80) */
            const __mmask32 m0 = c >= 32 ? 0xffffffffu : (__mmask32)((1u << c) - 1);
            const __mmask32 m1 = c >= 64 ? 0xffffffffu : c > 32 ? (__mmask32)((1u << (c - 32)) - 1) : 0;
            _mm512_mask_storeu_epi16(o + i, m0, _mm512_unpacklo_epi8(lo, hi));
            if (m1)
                _mm512_mask_storeu_epi16(o + i + 32, m1, _mm512_unpackhi_epi8(lo, hi));
        }
    }
}

/* rows x n E4M3 codes (row stride ld bytes) -> BF16 rows (stride ldd), sign copied; prefetches
 * each row `ahead` bytes further on. Table lookups: a third of the widening's instructions. */
void dg_amx_widen_e4m3_rows(const uint8_t *src, int64_t ld, int rows, int64_t n, int64_t ahead, uint16_t *dst,
                            int64_t ldd) {
    if (dg_cpu_has_avx512_vbmi()) {
        widen_e4m3_vbmi(src, ld, rows, n, ahead, dst, ldd);
        return;
    }
    for (int r = 0; r < rows; ++r) {
        const uint8_t *s = src + r * ld;
        uint16_t *o = dst + r * ldd;
        prefetch_ahead(s, n, ahead);
        for (int64_t i = 0; i < n; i += 32) {
            const __mmask32 mask = n - i >= 32 ? 0xffffffffu : (1u << (n - i)) - 1;
            const __m512i v = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask, s + i));
            _mm512_mask_storeu_epi16(o + i, mask, dg_e4m3_bf16_avx512(v));
        }
    }
}

/* ---- FP8 B widened inside the tile loop (dg_amx_small_t_e4m3) --------------------------------
 * Per k step the 16 x 32 codes become one BF16 B tile in a 1 KiB buffer (four in turn, see
 * below), and the step's TDPBF16PS run while the vector unit widens the next ones: about max(widening, tiles) per step
 * instead of their sum (widening a whole chunk first, then its tile steps). Same values (the
 * table), same tiles, same k steps as dg_amx_small_t on the widened rows: the same bits. */

/* Rows r, r + 1 (32 codes each) -> BF16 rows at o, o + 32 (the vbmi widening, two rows a step). */
#define E4M3_ROWS2(r, tb)                                                                          \
    do {                                                                                           \
        const __m512i v_ = _mm512_permutexvar_epi64(                                               \
            order, _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(bs + (r) * ldb))), \
                                      _mm256_loadu_si256((const __m256i *)(bs + ((r) + 1) * ldb)), 1));            \
        const __m512i lo_ = _mm512_permutex2var_epi8(lo_t[0], v_, lo_t[1]);                        \
        const __m512i hi_ = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi_t[0], v_, hi_t[1]), v_, sign, 0xf8); \
        _mm512_store_si512(tb + (r) * 32, _mm512_unpacklo_epi8(lo_, hi_));                         \
        _mm512_store_si512(tb + ((r) + 1) * 32, _mm512_unpackhi_epi8(lo_, hi_));                   \
    } while (0)

/* Step s's codes -> buffer tb, prefetching every other step pf bytes further along the rows. */
#define E4M3_WIDEN(s, tb)                                                                          \
    do {                                                                                           \
        const uint8_t *bs = b + (s) * 32;                                                          \
        uint16_t *tb_ = (tb);                                                                      \
        if (pf && !((s) & 1))                                                                      \
            for (int r = 0; r < 16; ++r)                                                           \
                _mm_prefetch((const char *)(bs + r * ldb) + pf, _MM_HINT_T1);                      \
        for (int r = 0; r < 16; r += 2)                                                            \
            E4M3_ROWS2(r, tb_);                                                                    \
    } while (0)

/* Widening (WIDEN(s, buffer)) runs two steps ahead of the tile ops, in four 1 KiB buffers: a
 * tile load does not take data from the store buffer, and stores reach L1 only after they
 * retire, so a step's stores must be older than the previous step's tile ops (one step ahead:
 * ~6% slower). Shared by the E4M3 and E2M1 kernels. */
#define WIDEN_AHEAD_BY(WIDEN, STEP, SZ)                                                            \
    do {                                                                                           \
        int64_t s = 0;                                                                             \
        for (int64_t w = 0; w < 2 && w < steps; ++w)                                               \
            WIDEN(w, buf + (w & 3) * (SZ));                                                        \
        for (; s + 1 < steps; s += 2) {                                                            \
            if (s + 2 < steps)                                                                     \
                WIDEN(s + 2, buf + ((s + 2) & 3) * (SZ));                                          \
            STEP(4, s, buf + (s & 3) * (SZ));                                                      \
            if (s + 3 < steps)                                                                     \
                WIDEN(s + 3, buf + ((s + 3) & 3) * (SZ));                                          \
            STEP(5, s + 1, buf + ((s + 1) & 3) * (SZ));                                            \
        }                                                                                          \
        if (s < steps)                                                                             \
            STEP(4, s, buf + (s & 3) * (SZ));                                                      \
    } while (0)
#define WIDEN_AHEAD(WIDEN) WIDEN_AHEAD_BY(WIDEN, STEP_TILES, 512)

/* Step s's tile ops on the B tile in buffer tb (tile BT), accumulators 0..mt-1. */
#define STEP_TILES(BT, s, tb)                                                                      \
    do {                                                                                           \
        const uint16_t *as = a + (s) * 512;                                                        \
        _tile_loadd(BT, (tb), 64);                                                                 \
        _tile_loadd(6, as, 64);                                                                    \
        _tile_dpbf16ps(0, BT, 6);                                                                  \
        if (mt > 1) {                                                                              \
            _tile_loadd(7, as + lda, 64);                                                          \
            _tile_dpbf16ps(1, BT, 7);                                                              \
        }                                                                                          \
        if (mt > 2) {                                                                              \
            _tile_loadd(6, as + 2 * lda, 64);                                                      \
            _tile_dpbf16ps(2, BT, 6);                                                              \
        }                                                                                          \
        if (mt > 3) {                                                                              \
            _tile_loadd(7, as + 3 * lda, 64);                                                      \
            _tile_dpbf16ps(3, BT, 7);                                                              \
        }                                                                                          \
    } while (0)

__attribute__((target("avx512vbmi"))) void dg_amx_small_t_e4m3(int64_t steps, const uint8_t *b, int64_t ldb,
                                                                int64_t pf, const uint16_t *a, int64_t lda, int mt,
                                                                float *acc, int accumulate, uint16_t *buf) {
    __m512i lo_t[2], hi_t[2];
    e4m3_byte_tables(lo_t, hi_t);
    const __m512i order = _mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0), sign = _mm512_set1_epi8((char)0x80);
    acc_begin(acc, mt, accumulate);
    WIDEN_AHEAD(E4M3_WIDEN);
    acc_end(acc, mt);
}
#undef E4M3_WIDEN
#undef E4M3_ROWS2


/* ---- FP4 B widened inside the tile loop (dg_amx_small_t_e2m1) --------------------------------
 * As dg_amx_small_t_e4m3 for E2M1 codes: per k step a row's 16 bytes (32 codes, low nibble
 * first) become 32 BF16 words by one word-table permute (vpermw), the nibbles first spread to
 * word lanes. A power-of-two scale per row and K block is applied by adding its exponent to the
 * table's nonzero entries (adj, dg_amx_e2m1_adj): the product rounded to BF16, exactly, for the
 * exponents dg_amx_e2m1_adj accepts, so the same bits as dg_widen_e2m1_blocks_avx512. */

/* BF16 bits of the 16 E2M1 codes (sign bit 3), twice: vpermw reads 5 index bits, and the
 * fifth is not cleared (E2M1_ROW) */
#define E2M1_BF16 0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0, \
                  0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0
static const uint16_t kE2m1Bf16[32] = {E2M1_BF16, E2M1_BF16};
#undef E2M1_BF16

/* Biased exponents e (dwords) -> table adjustments: (e - 127) << 7 in both 16-bit halves, added
 * to the BF16 words' exponent field. */
static inline __m512i e2m1_adj_words(__m512i e) {
    const __m512i w = _mm512_and_si512(_mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(127)), 7),
                                       _mm512_set1_epi32(0xffff));
    return _mm512_or_si512(w, _mm512_slli_epi32(w, 16));
}

bool dg_amx_e2m1_adj(const float *scales, int64_t n, int32_t *adj) {
    /* 2^e times 0.5 .. 6 stays a normal float and BF16 for e in [-125, 125]: there adding e to
     * the exponent field is the rounded product. Other scales (and non powers of two) decline. */
    const __m512i expo = _mm512_set1_epi32(0xff), lo = _mm512_set1_epi32(2), hi = _mm512_set1_epi32(252);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, scales + i));
        const __m512i e = _mm512_and_si512(_mm512_srli_epi32(u, 23), expo);
        const __mmask16 bad = _mm512_mask_test_epi32_mask(m, u, _mm512_set1_epi32((int)0x807fffff)) |
                              _mm512_mask_cmplt_epi32_mask(m, e, lo) | _mm512_mask_cmpgt_epi32_mask(m, e, hi);
        if (bad)
            return false;
        _mm512_mask_storeu_epi32(adj + i, m, e2m1_adj_words(e));
    }
    return true;
}

bool dg_amx_e2m1_adj_ue8m0(const uint8_t *e, int64_t n, int32_t *adj) {
    /* byte e is 2^(e - 127): accepted where dg_amx_e2m1_adj accepts that float, 2 <= e <= 252 */
    const __m512i lo = _mm512_set1_epi32(2), hi = _mm512_set1_epi32(252);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, e + i));
        if (_mm512_mask_cmplt_epi32_mask(m, v, lo) | _mm512_mask_cmpgt_epi32_mask(m, v, hi))
            return false;
        _mm512_mask_storeu_epi32(adj + i, m, e2m1_adj_words(v));
    }
    return true;
}

/* Row r of step s's codes -> BF16 words at tb + 32 r, with the row's adjusted table. Bytes 2q,
 * 2q + 1 of the row go to qword q (vpmovzxwq), and vpmultishiftqb puts bits 0, 4, 8 and 12 of it
 * at the bottom of words 4q .. 4q + 3: codes 4q .. 4q + 3 in their low nibbles (the bits above
 * do not matter: vpermw reads five, the table is doubled). Spreading the nibbles by a dword
 * multiply instead (vpmaddwd by 4097 on zero-extended bytes) gave the same words and was 6-7%
 * slower with B in cache (Sapphire Rapids VM, FP4 M = 1, N 7168, K 2048). */
#define E2M1_ROW(r, tb)                                                                            \
    do {                                                                                           \
        const __m512i d_ = _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(bs + (r) * ldb))); \
        const __m512i i_ = _mm512_multishift_epi64_epi8(spread, d_);                               \
        const __m512i t_ = aq ? _mm512_mask_add_epi16(lut, nonzero, lut, _mm512_set1_epi32(aq[(r) * ldadj])) : lut; \
        _mm512_store_si512((tb) + (r) * 32, _mm512_permutexvar_epi16(i_, t_));                     \
    } while (0)

/* Step s's codes -> buffer tb, prefetching once per cache line of each row (every 4 steps). */
#define E2M1_WIDEN(s, tb)                                                                          \
    do {                                                                                           \
        const uint8_t *bs = b + (s) * 16;                                                          \
        const int32_t *aq = adj ? adj + (t0 + (s)) / spb : NULL;                                  \
        uint16_t *tb_ = (tb);                                                                      \
        if (pf && !((s) & 3))                                                                      \
            for (int r = 0; r < 16; ++r)                                                           \
                _mm_prefetch((const char *)(bs + r * ldb) + pf, _MM_HINT_T1);                      \
        for (int r = 0; r < 16; ++r)                                                               \
            E2M1_ROW(r, tb_);                                                                      \
    } while (0)

__attribute__((target("avx512vbmi"))) void dg_amx_small_t_e2m1(int64_t steps, const uint8_t *b, int64_t ldb,
                                                                int64_t pf, const int32_t *adj, int64_t ldadj,
                                                                int64_t t0, int64_t spb, const uint16_t *a, int64_t lda,
                                                                int mt, float *acc, int accumulate, uint16_t *buf) {
    const __m512i lut = _mm512_loadu_si512(kE2m1Bf16), spread = _mm512_set1_epi64(0x000c000800040000LL);
    const __mmask32 nonzero = 0xfefefefe; /* not the zeros, codes 0 and 8 (and their copies) */
    acc_begin(acc, mt, accumulate);
    WIDEN_AHEAD(E2M1_WIDEN);
    acc_end(acc, mt);
}
#undef E2M1_WIDEN
#undef E2M1_ROW

/* ---- FP4 B pre-packed as nibble planes (dg_amx_small_t_e2m1_planes) -------------------------
 * The row-major codes above cost two port-5 shuffles per row and k step just to bring each
 * nibble to its own word (vpmovzxwq, vpmultishiftqb) before the table permute; the tile
 * products occupy the other vector port, so widening and products barely overlap. In the
 * planes layout (engine.h, DG_AMX_E2M1_PLANES) the 16-bit word w of a 64-byte group holds the
 * codes of k = w of four rows, 4 bits each: row q of the group is the word shifted right by
 * 4q (one shift, none for q = 0), then the same permute and scale add as dg_amx_small_t_e2m1.
 * One call also takes two 16-row blocks at M <= 16: a single accumulator tile is a chain of
 * dependent tile products, and two independent chains keep the tile unit busy (FP4 M = 1,
 * B in L2, Sapphire Rapids VM: ~5.0 TSC per row and k step with the row-major codes, 4.1 on
 * planes with one block, 3.1 with two). */

/* Group word vector v_ shifted for row q -> BF16 words of row r (of the block) at tb + 32 r. */
#define PLANE_ROW(v_, r, tb)                                                                       \
    do {                                                                                           \
        const __m512i t_ = sfe ? _mm512_mask_add_epi16(lut, nonzero, lut, _mm512_set1_epi32(aw[(r) & 15])) : lut; \
        _mm512_store_si512((tb) + (r) * 32, _mm512_permutexvar_epi16((v_), t_));                   \
    } while (0)

/* Step s of nb blocks -> buffer tb (block b's rows at tb + 512 b), prefetching pf bytes ahead
 * in each block's stream (a step is 4 lines). With scales, the block's 16 exponent bytes
 * become the rows' table adjustments (aw). */
#define PLANES_WIDEN(s, tb)                                                                        \
    do {                                                                                           \
        uint16_t *tb_ = (tb);                                                                      \
        for (int bk = 0; bk < nb; ++bk) {                                                          \
            const uint8_t *ps = p + bk * ldp + (s) * DG_AMX_E2M1_STEP_BYTES;                       \
            if (pf)                                                                                \
                for (int l = 0; l < DG_AMX_E2M1_STEP_BYTES; l += 64)                               \
                    _mm_prefetch((const char *)ps + pf + l, _MM_HINT_T1);                          \
            if (sfe)                                                                               \
                _mm512_store_si512(aw, e2m1_adj_words(_mm512_cvtepu8_epi32(_mm_loadu_si128(        \
                                           (const __m128i *)(sfe + bk * ldsfe + (t0 + (s)) / spb * 16))))); \
            for (int g = 0; g < 4; ++g) {                                                          \
                const __m512i v = _mm512_loadu_si512(ps + 64 * g);                                 \
                const int r = 16 * bk + 4 * g;                                                     \
                PLANE_ROW(v, r, tb_);                                                              \
                PLANE_ROW(_mm512_srli_epi16(v, 4), r + 1, tb_);                                    \
                PLANE_ROW(_mm512_srli_epi16(v, 8), r + 2, tb_);                                    \
                PLANE_ROW(_mm512_srli_epi16(v, 12), r + 3, tb_);                                   \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Two blocks (tiles 0 and 1), M <= 16: step s's tile ops on the blocks' tiles in buffer tb.
 * Each parity has its own operand tiles (4, 5, 6 or 2, 3, 7), so a load never waits for the
 * products still reading the previous step's tiles. */
#define STEP_PAIR(BT, s, tb)                                                                       \
    do {                                                                                           \
        const uint16_t *as = a + (s) * 512;                                                        \
        if ((BT) == 4) {                                                                           \
            _tile_loadd(4, (tb), 64);                                                              \
            _tile_loadd(6, as, 64);                                                                \
            _tile_loadd(5, (tb) + 512, 64);                                                        \
            _tile_dpbf16ps(0, 4, 6);                                                               \
            _tile_dpbf16ps(1, 5, 6);                                                               \
        } else {                                                                                   \
            _tile_loadd(2, (tb), 64);                                                              \
            _tile_loadd(7, as, 64);                                                                \
            _tile_loadd(3, (tb) + 512, 64);                                                        \
            _tile_dpbf16ps(0, 2, 7);                                                               \
            _tile_dpbf16ps(1, 3, 7);                                                               \
        }                                                                                          \
    } while (0)

void dg_amx_small_t_e2m1_planes(int64_t steps, const uint8_t *p, int64_t ldp, int nb, int64_t pf, const uint8_t *sfe,
                                int64_t ldsfe, int64_t t0, int64_t spb, const uint16_t *a, int64_t lda, int mt,
                                float *acc, int accumulate, uint16_t *buf) {
    const __m512i lut = _mm512_loadu_si512(kE2m1Bf16);
    const __mmask32 nonzero = 0xfefefefe; /* as in dg_amx_small_t_e2m1 */
    int32_t aw[16] __attribute__((aligned(64))); /* the current block's row adjustments */
    if (nb == 2) { /* mt == 1: block b's tile at acc + 256 b */
        acc_begin(acc, 2, accumulate);
        WIDEN_AHEAD_BY(PLANES_WIDEN, STEP_PAIR, 1024);
        acc_end(acc, 2);
        return;
    }
    acc_begin(acc, mt, accumulate);
    WIDEN_AHEAD_BY(PLANES_WIDEN, STEP_TILES, 1024);
    acc_end(acc, mt);
}
#undef STEP_PAIR
#undef PLANES_WIDEN
#undef PLANE_ROW
#undef STEP_TILES
#undef WIDEN_AHEAD
#undef WIDEN_AHEAD_BY
