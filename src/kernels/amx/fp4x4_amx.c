/*
 * fp4x4_amx.c - FP4 x FP4 microkernel on TDPBSSD (AMX INT8); panels and order: engine/fp4x4.h.
 * The 32 x 32 tile runs as two halves of 16 rows (the second only when rows > 16). Per k step
 * of 32: the A tile is 16 rows of the [32][32] step block (stride 32 bytes), B tiles are columns
 * 0-15 / 16-31 of the VNNI-4 step block (8 rows of 4-k groups, stride 128). Tiles 0-3 hold
 * int32 sums (exact; two sets, alternating per block), 4-5 A (alternating per step), 6-7 B.
 * After a block the int32 tiles go to a buffer and the float epilogue (AVX-512) applies its
 * scales to acc.
 */
#include "../../engine/fp4x4.h"
#include "amx_tiles.h"

#include <immintrin.h>

static const dg_amx_tilecfg kTiles = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 32, 32, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 8, 8},
};

void dg_f4_ukr_amx_begin(void) { _tile_loadconfig(&kTiles); }

/* acc = fmaf(dot, sa4 * sb, acc) for one stored block. */
static inline void epilogue(const int32_t *dot, int rows, const float *sa4, const float *sb, float *acc) {
    const __m512 sb0 = _mm512_loadu_ps(sb), sb1 = _mm512_loadu_ps(sb + 16);
    for (int r = 0; r < rows; ++r) {
        const __m512 sa = _mm512_set1_ps(sa4[r]);
        float *ar = acc + r * DG_F4_NR;
        const int32_t *dr = dot + r * DG_F4_NR;
        _mm512_storeu_ps(ar, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dr)), _mm512_mul_ps(sa, sb0),
                                             _mm512_loadu_ps(ar)));
        _mm512_storeu_ps(ar + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dr + 16)),
                                                  _mm512_mul_ps(sa, sb1), _mm512_loadu_ps(ar + 16)));
    }
}

/* One step of 32 k for 16 rows x 32 columns into C tiles (c0, c1), A in tile ac while the next
 * step's A goes to tile an. Tiles are not renamed: a load into a tile waits for the products
 * reading it, so B is reloaded right after its product and the next products find it ready. */
#define STEP(c0, c1, ac, an)                                   \
    do {                                                       \
        _tile_loadd(an, an_ptr, DG_F4_KS);                     \
        _tile_dpbssd(c0, ac, 6);                               \
        _tile_loadd(6, bn_ptr, 128);                           \
        _tile_dpbssd(c1, ac, 7);                               \
        _tile_loadd(7, bn_ptr + 64, 128);                      \
    } while (0)

/*
 * Rows [0, rows16) of one 16-row half (a, sa4, acc point at its first row). Blocks alternate
 * between C tiles {0, 1} and {2, 3}: block kb's products run on the tile unit while block
 * kb - 1's tiles are stored and its float epilogue runs on the vector units.
 */
static void half(int64_t steps, int spb, int rows16, const int8_t *a, const int8_t *b, const float *sa4,
                 const float *sb, float *acc) {
    int32_t buf[2][16 * DG_F4_NR] __attribute__((aligned(64)));
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, DG_F4_KS);
    _tile_loadd(6, b, 128);
    _tile_loadd(7, b + 64, 128);
    const int64_t nkb = (steps + spb - 1) / spb;
    for (int64_t kb = 0; kb <= nkb; ++kb) { /* kb = nkb only stores and applies the last block */
        const int64_t s0 = kb * spb, s1 = kb < nkb && s0 + spb < steps ? s0 + spb : steps;
        for (int64_t s = s0; s < s1; ++s) {
            const int64_t nx = s + 1 < steps ? s + 1 : s; /* the very last loads are harmless */
            const int8_t *an_ptr = a + nx * DG_F4_MR * DG_F4_KS, *bn_ptr = b + nx * DG_F4_KS * DG_F4_NR;
            if (kb & 1) {
                if (s & 1)
                    STEP(2, 3, 5, 4);
                else
                    STEP(2, 3, 4, 5);
            } else {
                if (s & 1)
                    STEP(0, 1, 5, 4);
                else
                    STEP(0, 1, 4, 5);
            }
        }
        if (kb == 0)
            continue;
        const int64_t done = kb - 1; /* its products are finished or finishing */
        int32_t *d = buf[done & 1];
        if (done & 1) {
            _tile_stored(2, d, 128);
            _tile_stored(3, d + 16, 128);
            _tile_zero(2);
            _tile_zero(3);
        } else {
            _tile_stored(0, d, 128);
            _tile_stored(1, d + 16, 128);
            _tile_zero(0);
            _tile_zero(1);
        }
        epilogue(d, rows16, sa4 + done * DG_F4_MR, sb + done * DG_F4_NR, acc);
    }
}

void dg_f4_ukr_amx(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                   const float *sb, const int32_t *bsum, float *acc) {
    (void)bsum;
    half(steps, spb, rows < 16 ? rows : 16, a, b, sa4, sb, acc);
    if (rows > 16)
        half(steps, spb, rows - 16, a + 16 * DG_F4_KS, b, sa4 + 16, sb, acc + 16 * DG_F4_NR);
}
