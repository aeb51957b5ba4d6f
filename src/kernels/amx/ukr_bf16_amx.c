/*
 * ukr_bf16_amx.c - AMX BF16 microkernel, MR = 32, NR = 32 (2 x 2 tiles of 16 x 16 float32).
 *
 * Operands (engine.h): A in DG_PACK_AMX_A panels (each k step of 32 is a [32][32] row-major
 * block, so rows 0-15 and 16-31 are two A tiles with a 64-byte stride); B in DG_PACK_AMX_B
 * panels (k pairs x 32 columns x 2, so columns 0-15 and 16-31 are two B tiles with a 128-byte
 * stride). Tiles: 0-3 accumulate C, 4-5 hold A, 6-7 hold B.
 *
 * Order: per k step of 32 (K padded with zeros to a multiple of 32) one TDPBF16PS adds 32
 * products to each accumulator in the hardware's own order (measured: not the FMA chain of
 * engine.h, nor one rounding of the exact sum; fixed for a given CPU). Every element still
 * depends only on its own row of A, column of B and its k steps, so results are bitwise the
 * same for any M, tiling or thread count on one machine. Denormal inputs and results are
 * flushed to zero, as VDPBF16PS does.
 */
#include "../../engine/engine.h"
#include "amx_tiles.h"

#include <immintrin.h>

static const dg_amx_tilecfg kTiles = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void dg_ukr_bf16_amx_begin(void) { _tile_loadconfig(&kTiles); }

/* The tile epilogue of DG_UKR_SCALE: c = fma(sa[r] * sb[j], acc, c) in AVX-512. */
static void scale_into(const float *acc, float *c, int64_t ldc, const float *sa, const float *sb) {
    const __m512 s0 = _mm512_loadu_ps(sb), s1 = _mm512_loadu_ps(sb + 16);
    for (int r = 0; r < 32; ++r) {
        const __m512 ar = _mm512_set1_ps(sa[r]);
        float *cr = c + r * ldc;
        _mm512_storeu_ps(cr, _mm512_fmadd_ps(_mm512_mul_ps(ar, s0), _mm512_load_ps(acc + 32 * r), _mm512_loadu_ps(cr)));
        _mm512_storeu_ps(cr + 16, _mm512_fmadd_ps(_mm512_mul_ps(ar, s1), _mm512_load_ps(acc + 32 * r + 16),
                                                  _mm512_loadu_ps(cr + 16)));
    }
}

/* A's k step s, rows 0-15 at a + s * a_step with row stride a_stride bytes, rows 16-31 a_half
 * elements further: packed panels (1024, 512, 64 bytes) or A's own rows (32, 16 lda, 2 lda). */
static inline void ukr_body(int64_t kc, const uint16_t *a, int64_t a_step, int64_t a_half, int64_t a_stride,
                            const uint16_t *b, float *c, int64_t ldc, int mode, const float *sa, const float *sb) {
    /* Tiles are not renamed: a load into a tile waits until the products reading it finish.
     * So each operand is reloaded right after its last product of the step, while the other
     * products run, and the next step's first products find their operands ready. The first
     * step's loads come in the order of its products (C0, A0, B0 first). */
    const int64_t steps = kc / 32;
    if (mode == DG_UKR_ACC) {
        _tile_loadd(0, c, ldc * 4);
        _tile_loadd(4, a, a_stride);
        _tile_loadd(6, b, 128);
        _tile_loadd(1, c + 16, ldc * 4);
        _tile_loadd(7, b + 32, 128);
        _tile_loadd(2, c + 16 * ldc, ldc * 4);
        _tile_loadd(5, a + a_half, a_stride);
        _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(4, a, a_stride);
        _tile_loadd(6, b, 128);
        _tile_loadd(7, b + 32, 128);
        _tile_loadd(5, a + a_half, a_stride);
    }
    for (int64_t s = 1; s < steps; ++s) {
        const uint16_t *as = a + s * a_step, *bs = b + s * 16 * 64;
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(4, as, a_stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(6, bs, 128);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(7, bs + 32, 128);
        _tile_loadd(5, as + a_half, a_stride);
    }
    if (steps > 0) { /* the last step: nothing left to load */
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (mode != DG_UKR_SCALE) {
        _tile_stored(0, c, ldc * 4);
        _tile_stored(1, c + 16, ldc * 4);
        _tile_stored(2, c + 16 * ldc, ldc * 4);
        _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
        return;
    }
    float acc[32 * 32] __attribute__((aligned(64)));
    _tile_stored(0, acc, 128);
    _tile_stored(1, acc + 16, 128);
    _tile_stored(2, acc + 16 * 32, 128);
    _tile_stored(3, acc + 16 * 32 + 16, 128);
    scale_into(acc, c, ldc, sa, sb);
}

void dg_ukr_bf16_amx(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode, const float *sa,
                     const float *sb) {
    ukr_body(kc, a, 32 * 32, 16 * 32, 64, b, c, ldc, mode, sa, sb);
}

void dg_ukr_bf16_amx_a_rows(int64_t kc, const void *a, int64_t lda, const void *b, float *c, int64_t ldc,
                            int mode) {
    ukr_body(kc, a, 32, 16 * lda, 2 * lda, b, c, ldc, mode, NULL, NULL);
}

static inline __m512d lo_pd(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline __m512d hi_pd(__m512 v) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); }

/* One run of the BF16 einsum's float64 order (engine/batched.h): up to DG_F64_RUN blocks of
 * DG_ACC_BLOCK k (kc <= DG_F64_RUN * DG_ACC_BLOCK, a multiple of 32), each a tile chain from
 * zero stored as float32 (a tile store costs next to nothing here: measured); then per element
 * run = ((b0 + b1) + (b2 + b3)) in float64 and total = first ? run : c + run, kept in c, or on
 * the last run rounded to float32 into out. Absent blocks and the first run's missing total
 * are -0, the exact identity of IEEE addition (+0 would turn a -0 sum into +0), so they are
 * not added at all: a call of one block and of both flags is that block's chain itself, stored
 * straight from the tiles. The vector work is what costs (tile products and AVX-512 work do not
 * overlap on Sapphire Rapids: interleaving them was measured), so the run shares one float64
 * read-modify-write among its blocks; two floats add exactly in float64, so only (b01 + b23)
 * and the add into the total round, 2^29 times finer than a float32 add. */
void dg_ukr_bf16_amx_f64(int64_t kc, const void *a, const void *b, double *c, float *out, int64_t ldc, int flags) {
    const int nb = (int)((kc + DG_ACC_BLOCK - 1) / DG_ACC_BLOCK);
    if (nb == 1 && flags == (DG_F64_FIRST | DG_F64_LAST)) {
        ukr_body(kc, a, 32 * 32, 16 * 32, 64, b, out, ldc, DG_UKR_ZERO, NULL, NULL);
        return;
    }
    float acc[DG_F64_RUN][32 * 32] __attribute__((aligned(64)));
    for (int q = 0; q < nb; ++q) {
        const int64_t k0 = (int64_t)q * DG_ACC_BLOCK, len = kc - k0 < DG_ACC_BLOCK ? kc - k0 : DG_ACC_BLOCK;
        ukr_body(len, (const uint16_t *)a + k0 * 32, 32 * 32, 16 * 32, 64, (const uint16_t *)b + k0 * 32, acc[q], 32,
                 DG_UKR_ZERO, NULL, NULL);
    }
    for (int r = 0; r < 32; ++r)
        for (int h = 0; h < 32; h += 16) {
            __m512 v[DG_F64_RUN];
            for (int q = 0; q < DG_F64_RUN; ++q)
                v[q] = q < nb ? _mm512_load_ps(acc[q] + 32 * r + h) : _mm512_set1_ps(-0.0f);
            __m512d lo = _mm512_add_pd(_mm512_add_pd(lo_pd(v[0]), lo_pd(v[1])), _mm512_add_pd(lo_pd(v[2]), lo_pd(v[3])));
            __m512d hi = _mm512_add_pd(_mm512_add_pd(hi_pd(v[0]), hi_pd(v[1])), _mm512_add_pd(hi_pd(v[2]), hi_pd(v[3])));
            if (!(flags & DG_F64_FIRST)) { /* c is NULL when the call is the only run: not touched */
                const double *cr = c + r * ldc + h;
                lo = _mm512_add_pd(_mm512_loadu_pd(cr), lo), hi = _mm512_add_pd(_mm512_loadu_pd(cr + 8), hi);
            }
            if (flags & DG_F64_LAST) {
                _mm256_storeu_ps(out + r * ldc + h, _mm512_cvtpd_ps(lo));
                _mm256_storeu_ps(out + r * ldc + h + 8, _mm512_cvtpd_ps(hi));
            } else {
                _mm512_storeu_pd(c + r * ldc + h, lo);
                _mm512_storeu_pd(c + r * ldc + h + 8, hi);
            }
        }
}
