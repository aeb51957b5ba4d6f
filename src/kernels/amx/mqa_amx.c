/*
 * mqa_amx.c - FP8 (E4M3) MQA logits on AMX BF16 tiles (see mqa_kernels.h).
 *
 * E4M3 codes times 2^-8 are exact in BF16 (3 mantissa bits; exponents 2^-17 .. 2^0, far from
 * BF16's denormals, which the tiles would flush), so TDPBF16PS multiplies them exactly and adds
 * in float32, in its own fixed order per k step of 32 (d zero-padded to a multiple of 32).
 * Per query token and panel the tiles give dots[h][c] with heads as tile rows (q is the A
 * operand straight from its padded [hp][dp] rows) and kv rows as tile columns (the panel is the
 * VNNI B operand: k pairs x NW columns); each element depends only on its q row, kv row and the
 * k steps, never on the tile, panel or thread. The epilogue then runs, per 16 kv rows (one
 * vector), the chain s = fma(w[h], relu(dot[h]), s) for h = 0, 1, ... as every kernel does.
 *
 * Blocks of 16 heads x 32 kv rows, head tiles outer (a q tile is reused from L1 by the panel's
 * column pairs), alternate between two accumulator sets (tiles 0-1 with q in 4, tiles 2-3 with
 * q in 5; 6-7 hold the panel): a block's products start while the previous block's tiles are
 * stored, and the chain of the block before that runs meanwhile. The chain state of the NW kv
 * rows stays in registers across the head tiles. Measured (one core, H = 64, d = 128, NW = 64,
 * 3.3 GHz): ~1900 cycles per token and panel (1024 at the TDPBF16PS peak; the blocks load 1.5
 * tiles per product); a 2 x 2 block of 32 heads x 32 rows (one accumulator set, operands
 * reloaded early, the next block's first operands loaded by the last step) was 5-12% slower,
 * panels of 128 rows no faster. Packing a 64-row panel costs about as much (byte permutes on
 * port 5, see dg_mqa_pack_amx), so prefill shares a panel among 16 tokens (DG_MQA_QB_AMX).
 */
#include "../mqa_kernels.h"
#include "../transpose16_avx512.h"
#include "amx_tiles.h"
#include "../e4m3_bf16_bytes.h"

#include <immintrin.h>
#include <string.h>

#define NW DG_MQA_NW_AMX

/* Static: see amx_tiles.h. */
static const dg_amx_tilecfg kCfg = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void dg_mqa_amx_begin(void) { _tile_loadconfig(&kCfg); }

/* High bytes of BF16(E4M3 value * 2^-8) by code & 0x7f (the low bytes: e4m3_bf16_bytes.h;
 * generated; exact: normal codes have exponent e + 112 and the mantissa shifted up by 4,
 * subnormal ones are m * 2^-17, 0x7f is NaN). The sign is the code's bit 7, moved to bit 15. */
static const uint8_t kHi[128] __attribute__((aligned(64))) = {
    0x00, 0x37, 0x37, 0x37, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38,
    0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39,
    0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a,
    0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b,
    0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c,
    0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d,
    0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e,
    0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x7f,
};

/* Interleaves the low and high BF16 bytes of codes 0-31 (kMixA) and 32-63 (kMixB) of a vector. */
static const uint8_t kMixA[64] __attribute__((aligned(64))) = {
    0,  64, 1,  65, 2,  66, 3,  67, 4,  68, 5,  69, 6,  70, 7,  71, 8,  72, 9,  73, 10, 74,
    11, 75, 12, 76, 13, 77, 14, 78, 15, 79, 16, 80, 17, 81, 18, 82, 19, 83, 20, 84, 21, 85,
    22, 86, 23, 87, 24, 88, 25, 89, 26, 90, 27, 91, 28, 92, 29, 93, 30, 94, 31, 95,
};
static const uint8_t kMixB[64] __attribute__((aligned(64))) = {
    32, 96,  33, 97,  34, 98,  35, 99,  36, 100, 37, 101, 38, 102, 39, 103, 40, 104, 41, 105, 42, 106,
    43, 107, 44, 108, 45, 109, 46, 110, 47, 111, 48, 112, 49, 113, 50, 114, 51, 115, 52, 116, 53, 117,
    54, 118, 55, 119, 56, 120, 57, 121, 58, 122, 59, 123, 60, 124, 61, 125, 62, 126, 63, 127,
};

/* 64 codes -> BF16: codes 0-31 into *v0, 32-63 into *v1 (byte tables: VBMI permutes; every CPU
 * with AMX-BF16 has AVX512-VBMI, and the kernel selection checks it). */
__attribute__((target("avx512vbmi"))) static inline void e4m3_widen(__m512i x, __m512i *v0, __m512i *v1) {
    const __m512i lo =
        _mm512_permutex2var_epi8(_mm512_load_si512(dg_e4m3_bf16_lo), x, _mm512_load_si512(dg_e4m3_bf16_lo + 64));
    __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(kHi), x, _mm512_load_si512(kHi + 64));
    hi = _mm512_ternarylogic_epi32(hi, x, _mm512_set1_epi8((char)0x80), 0xf8); /* hi | (x & 0x80) */
    *v0 = _mm512_permutex2var_epi8(lo, _mm512_load_si512(kMixA), hi);
    *v1 = _mm512_permutex2var_epi8(lo, _mm512_load_si512(kMixB), hi);
}

/* Rows a (bytes 0-31) and b (bytes 32-63, NULL: zero) of `cnt` codes, zero past cnt. Whole
 * steps load with two 32-byte loads, the second merged into the upper half as a broadcast (a
 * load-port operation, not a lane-crossing shuffle). */
static inline __m512i two_rows(const uint8_t *a, const uint8_t *b, int cnt) {
    if (cnt == 32) {
        const __m512i lo = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)a));
        return b ? _mm512_mask_broadcast_i64x4(lo, 0xf0, _mm256_loadu_si256((const __m256i *)(const void *)b)) : lo;
    }
    const __mmask32 m = ((__mmask32)1 << cnt) - 1;
    const __m256i hi = b ? _mm256_maskz_loadu_epi8(m, b) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_maskz_loadu_epi8(m, a)), hi, 1);
}

/* q [h][d] float32 (value * 2^-8, MXFP8: times its group's scale; exact in BF16 while normal,
 * see mx_scale) -> BF16 [hp][dp], zero-padded heads and k. */
void dg_mqa_prep_q_amx(const float *q, int64_t h, int64_t d, float *out) {
    const int64_t hp = dg_align(h, 16), dp = dg_align(d, 32);
    uint16_t *o = (uint16_t *)(void *)out;
    for (int64_t hh = 0; hh < hp; ++hh)
        for (int64_t k = 0; k < dp; k += 32) {
            const int64_t cnt = hh < h ? (d - k < 32 ? d - k : 32) : 0;
            const __mmask32 m = cnt >= 32 ? 0xffffffffu : (((__mmask32)1 << cnt) - 1);
            const __m512 lo = _mm512_maskz_loadu_ps((__mmask16)m, q + hh * d + k);
            const __m512 hi = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), q + hh * d + k + 16);
            _mm512_storeu_si512(o + hh * dp + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo)); /* exact */
        }
}

/* MXFP8: the panel words of one k step (one scale group; lane c: kv row c's two BF16 values)
 * times 2^(b - 127) for each lane's scale byte b, as an add to the exponent field of every
 * finite nonzero value (zeros, the padding and NaN codes keep their bits). `delta` holds
 * (b - 127) * 128 in both 16-bit halves of each lane. Exact only while the results stay normal
 * BF16, which the driver guarantees by taking this kernel for MXFP8 only when
 * dg_mqa_kernel_for's mx_in_range holds (every value then lies in [2^-126, 2^127)). */
static inline __m512i mx_scale(__m512i v, __m512i delta) {
    const __m512i expo = _mm512_set1_epi16(0x7f80);
    const __mmask32 finite_nonzero = _mm512_test_epi16_mask(v, expo) &
                                     _mm512_cmpneq_epi16_mask(_mm512_and_si512(v, expo), expo);
    return _mm512_mask_add_epi16(v, finite_nonzero, v, delta);
}

/* The panel as the VNNI B operand: per k step s of 32, 16 pair rows of NW columns, 32-bit word
 * [(16 s + p) * NW + c] = BF16 (kv[c][32 s + 2p], kv[c][32 s + 2p + 1]); zero past n and d.
 * Per 16 rows and k step the code pairs are transposed as bytes (dg_transpose16_epi16_pairs),
 * then widened: 56 lane-crossing permutes against 104 for widening the rows and transposing the
 * words (SPR VM, one 64-row panel in L1: FP8 1637 -> 1209 TSC ticks, MXFP8 2392 -> 1577).
 * FP8 and MXFP8 (the scale of row c's group s folded in, see mx_scale); FP4 takes the integer
 * kernel (mqa_fp4_amx.c). */
__attribute__((target("avx512vbmi"))) void dg_mqa_pack_amx(const uint8_t *const *rows, const uint32_t *sf, int n,
                                                          int64_t d, int fmt, float *tmp, float *panel) {
    (void)tmp;
    const int mx = fmt == DG_MQA_MXFP8;
    uint32_t *o = (uint32_t *)(void *)panel;
    const int64_t dp = dg_align(d, 32);
    for (int g = 0; g < NW; g += 16) {
        const int live = n - g < 0 ? 0 : n - g > 16 ? 16 : n - g;
        if (live == 0) { /* the columns of an empty row group are zero */
            for (int64_t p = 0; p < dp / 2; ++p)
                _mm512_storeu_si512(o + p * NW + g, _mm512_setzero_si512());
            continue;
        }
        const __m512i words = mx ? _mm512_maskz_loadu_epi32((__mmask16)((1u << live) - 1), sf + g)
                                 : _mm512_setzero_si512();
        for (int64_t k = 0; k < dp; k += 32) {
            const int cnt = (int)(d - k < 32 ? d - k : 32);
            __m512i x[8], y[8];
            for (int i = 0; i < 8; ++i) {
                const int r = 2 * i;
                x[i] = r < live ? two_rows(rows[g + r] + k, r + 1 < live ? rows[g + r + 1] + k : NULL, cnt)
                                : _mm512_setzero_si512();
            }
            dg_transpose16_epi16_pairs(x, y);
            __m512i delta = _mm512_setzero_si512();
            if (mx) {
                const __m512i b = _mm512_and_si512(_mm512_srli_epi32(words, (unsigned)(k / 32 * 8)),
                                                   _mm512_set1_epi32(0xff));
                const __m512i e = _mm512_slli_epi32(_mm512_sub_epi32(b, _mm512_set1_epi32(127)), 7);
                delta = _mm512_or_si512(_mm512_and_si512(e, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(e, 16));
            }
            for (int j = 0; j < 8; ++j) {
                __m512i t0, t1;
                e4m3_widen(y[j], &t0, &t1);
                if (mx) {
                    t0 = mx_scale(t0, delta);
                    t1 = mx_scale(t1, delta);
                }
                _mm512_storeu_si512(o + (k / 2 + 2 * j) * NW + g, t0);
                _mm512_storeu_si512(o + (k / 2 + 2 * j + 1) * NW + g, t1);
            }
        }
    }
}

/* Chains of 32 kv rows over heads [0, hn) of a stored block (rows 32 floats apart). */
static inline void chain(const float *buf, int hn, const float *w, __m512 *s0, __m512 *s1) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 a = *s0, b = *s1;
    for (int l = 0; l < hn; ++l) {
        const __m512 wl = _mm512_set1_ps(w[l]);
        a = _mm512_fmadd_ps(wl, _mm512_max_ps(_mm512_load_ps(buf + 32 * l), zero), a);
        b = _mm512_fmadd_ps(wl, _mm512_max_ps(_mm512_load_ps(buf + 32 * l + 16), zero), b);
    }
    *s0 = a, *s1 = b;
}

/* One head tile x 32 kv columns into accumulators c0, c1 (q in tile qt). Tile numbers must be
 * literals (they are assembled into the instructions). */
#define BLOCK1(c0, c1, qt, qq)                                                                                    \
    do {                                                                                                          \
        _tile_zero(c0);                                                                                           \
        _tile_zero(c1);                                                                                           \
        for (int64_t s = 0; s < steps; ++s) {                                                                     \
            _tile_loadd(qt, (qq) + 32 * s, dp * 2);                                                               \
            _tile_loadd(6, pb + s * 32 * NW, NW * 4);                                                             \
            _tile_loadd(7, pb + s * 32 * NW + 32, NW * 4);                                                        \
            _tile_dpbf16ps(c0, qt, 6);                                                                            \
            _tile_dpbf16ps(c1, qt, 7);                                                                            \
        }                                                                                                         \
    } while (0)
#define STORE1(c0, c1, b)                                                                                         \
    do {                                                                                                          \
        _tile_stored(c0, (b), 128);                                                                               \
        _tile_stored(c1, (b) + 16, 128);                                                                          \
    } while (0)

void dg_mqa_tile_amx(const float *qv, int64_t h, int64_t d, const float *w, const float *panelv, float *sum,
                     const uint8_t *const *pf, int npf) {
    const uint16_t *q = (const uint16_t *)(const void *)qv, *panel = (const uint16_t *)(const void *)panelv;
    const int64_t dp = dg_align(d, 32), steps = dp / 32, ht = dg_ceil_div(h, 16);
    enum { NJ = NW / 32 };
    float buf[2][16 * 32] __attribute__((aligned(64)));
    __m512 acc[2 * NJ];
    for (int j = 0; j < 2 * NJ; ++j)
        acc[j] = _mm512_setzero_ps();
    const int64_t blocks = NJ * ht;
    int64_t pfi = 0;
    for (int64_t b = 0; b < blocks; ++b) {
        for (const int64_t end = npf * (b + 1) / blocks; pfi < end; ++pfi)
            _mm_prefetch((const char *)pf[pfi], _MM_HINT_T0);
        const int64_t i = b / NJ, j = b % NJ;
        const uint16_t *pb = panel + 64 * j, *qq = q + 16 * i * dp;
        if (b & 1) {
            BLOCK1(2, 3, 5, qq);
            STORE1(0, 1, buf[0]);
        } else {
            BLOCK1(0, 1, 4, qq);
            if (b)
                STORE1(2, 3, buf[1]);
        }
        if (b >= 2) { /* block b - 2's chain runs while these products execute */
            const int64_t i2 = (b - 2) / NJ, j2 = (b - 2) % NJ;
            const int hn = (int)(h - 16 * i2 < 16 ? h - 16 * i2 : 16);
            chain(buf[b & 1], hn, w + 16 * i2, &acc[2 * j2], &acc[2 * j2 + 1]);
        }
    }
    for (int64_t b = blocks; b < blocks + 2; ++b) {
        if (b == blocks) {
            if (b & 1)
                STORE1(0, 1, buf[0]);
            else
                STORE1(2, 3, buf[1]);
        }
        if (b >= 2) {
            const int64_t i2 = (b - 2) / NJ, j2 = (b - 2) % NJ;
            const int hn = (int)(h - 16 * i2 < 16 ? h - 16 * i2 : 16);
            chain(buf[b & 1], hn, w + 16 * i2, &acc[2 * j2], &acc[2 * j2 + 1]);
        }
    }
    for (int j = 0; j < 2 * NJ; ++j)
        _mm512_storeu_ps(sum + 16 * j, acc[j]);
}
