/*
 * mqa_fp4_amx.c - FP4 x FP4 (MXFP4) MQA logits on AMX INT8 tiles (see mqa_kernels.h).
 *
 * The numerics are those of the VNNI kernel (avx512_bf16/mqa_fp4_vnni.c), bit for bit: E2M1
 * codes times 2 are small integers, a 32-element scale group's dot product I is exact in int32
 * (TDPBSSD: signed x signed, so no bias correction), and per (head, kv row) the groups are added
 * in increasing order as dot = fma((float)I, sq * sk, dot) from dot = 0, then the head chain
 * s = fma(w[h], relu(dot[h]), s) for h = 0, 1, .... Only where the integers come from changes.
 *
 * A tile product covers one scale group (k = 32: A tiles of 32 bytes per row, B tiles of 8 quad
 * rows), because each group needs its own integer sum. q is the A operand (heads as rows, straight
 * from the token's int8 rows), the panel the VNNI B operand (kv rows as columns), so a stored C
 * tile has heads as rows and kv rows as lanes: the group epilogue and the head chain run on
 * vectors of 16 kv rows with no transpose. Items (head tile, group, kv tile) alternate between two C
 * tiles: item n's product runs on the tile unit while item n - 1's tile is stored and item
 * n - LAG's stored sums are finished by the vector units.
 *
 * Layouts (bytes). q (per token): q2[hp][d] int8 (padded heads zero), then sq[d/32][hp] floats.
 * Panel: per group g and kv tile j (16 rows), 8 quad rows of 16 x 4 bytes, tile (g, j) at
 * (g * NW/16 + j) * 512; then sk[d/32][NW] floats; then n as an int32 (the tile skips kv tiles
 * past it: sparse and paged panels are often partly filled). Rows past n in the last filled
 * kv tile are zero; kv tiles past it are neither packed nor read.
 */
#include "../mqa_avx512_common.h"
#include "../transpose16_avx512.h"
#include "amx_tiles.h"

#include <immintrin.h>
#include <string.h>

#define NW DG_MQA_NW_AMX
enum { NJ = NW / 16 };

/* Static: see amx_tiles.h. Tiles 0-1: int32 C (16 x 16); 4-5: q (16 heads x 32 bytes); 6-7: kv
 * (8 quad rows x 16 columns). */
static const dg_amx_tilecfg kCfg = {
    .palette_id = 1,
    .colsb = {64, 64, 0, 0, 32, 32, 64, 64},
    .rows = {16, 16, 0, 0, 16, 16, 8, 8},
};

void dg_mqa_amx_fp4_begin(void) { _tile_loadconfig(&kCfg); }

void dg_mqa_q4_prep_amx(const uint8_t *const *rows, const uint32_t *sf, int64_t h, int64_t d, void *out) {
    const int64_t hp = dg_align(h, 16), groups = d / 32;
    int8_t *q2 = out;
    float *sq = (float *)(void *)(q2 + hp * d);
    const __m128i table = dg_mqa_e2m1x2_table();
    for (int64_t hh = 0; hh < hp; ++hh)
        for (int64_t g = 0; g < groups; ++g) {
            __m128i e0 = _mm_setzero_si128(), e1 = _mm_setzero_si128();
            if (hh < h)
                dg_mqa_e2m1_decode32(rows[hh] + 16 * g, table, &e0, &e1);
            _mm_storeu_si128((__m128i *)(void *)(q2 + hh * d + 32 * g), e0);
            _mm_storeu_si128((__m128i *)(void *)(q2 + hh * d + 32 * g + 16), e1);
            sq[g * hp + hh] = hh < h ? dg_mqa_half_ue8m0(sf[hh], g) : 0.0f;
        }
}

/* Row r's groups g, g + 1 (when present) as 16 int8 quads; zero past n or d. */
static inline __m512i row_pair(const uint8_t *const *rows, int n, int r, int64_t g, int64_t groups, __m128i table) {
    if (r >= n)
        return _mm512_setzero_si512();
    __m128i e[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
    dg_mqa_e2m1_decode32(rows[r] + 16 * g, table, &e[0], &e[1]);
    if (g + 1 < groups)
        dg_mqa_e2m1_decode32(rows[r] + 16 * g + 16, table, &e[2], &e[3]);
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(e[0]), e[1], 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(e[2]), e[3], 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

void dg_mqa_kv4_pack_amx(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, void *panel) {
    const int64_t groups = d / 32;
    uint8_t *kv = panel;
    float *sk = (float *)(void *)(kv + (int64_t)NW * d);
    const __m128i table = dg_mqa_e2m1x2_table();
    const int nj = (n + 15) / 16; /* kv tiles past the rows are never loaded (dg_mqa_tile4_amx) */
    for (int j = 0; j < nj; ++j)
        for (int64_t g = 0; g < groups; g += 2) {
            __m512i v[16], t[16];
            for (int r = 0; r < 16; ++r)
                v[r] = row_pair(rows, n, 16 * j + r, g, groups, table);
            dg_transpose16_epi32(v, t); /* t[q]: quad q of the two groups, one lane per row */
            for (int q = 0; q < 8; ++q)
                _mm512_storeu_si512(kv + ((g * NJ + j) * 8 + q) * 64, t[q]);
            if (g + 1 < groups)
                for (int q = 0; q < 8; ++q)
                    _mm512_storeu_si512(kv + (((g + 1) * NJ + j) * 8 + q) * 64, t[8 + q]);
        }
    for (int64_t g = 0; g < groups; ++g)
        for (int c = 0; c < NW; ++c)
            sk[g * NW + c] = c < n ? dg_mqa_half_ue8m0(sf[c], g) : 0.0f;
    const int32_t rows_used = n;
    memcpy(sk + groups * NW, &rows_used, sizeof rows_used);
}

/* Items in order: head tile i, group g, kv tile j (innermost). */
typedef struct item {
    int64_t i, g, j;
} item;

static inline void next_item(item *t, int64_t groups, int64_t nj) {
    if (++t->j < nj)
        return;
    t->j = 0;
    if (++t->g < groups)
        return;
    t->g = 0;
    ++t->i;
}

/* Item t's product into C tile c, with its kv tile loaded into tile b and q's in tile a (loaded
 * by the first item of its (head tile, group): the next three reuse it). Tile numbers must be
 * literals (they are assembled into the instructions). */
#define PRODUCT(c, a, b, t)                                                                                     \
    do {                                                                                                        \
        _tile_zero(c);                                                                                          \
        if ((t).j == 0)                                                                                         \
            _tile_loadd(a, q2 + 16 * (t).i * d + 32 * (t).g, d);                                                \
        _tile_loadd(b, kv + ((t).g * NJ + (t).j) * 512, 64);                                                    \
        _tile_dpbssd(c, a, b);                                                                                  \
    } while (0)

/* How many items after its product an item's stored tile is read back. A tile store retires
 * only after the products before it in program order (the next item's), and the vector loads
 * of its result wait for it to commit: reading it back at once would put a product's latency
 * into every item. */
#define LAG 3

void dg_mqa_tile4_amx(const void *qv, int64_t h, int64_t d, const float *w, const void *panelv, float *sum,
                      const uint8_t *const *pf, int npf) {
    const int64_t hp = dg_align(h, 16), groups = d / 32, ht = hp / 16;
    const int8_t *q2 = qv;
    const float *sq = (const float *)(const void *)(q2 + hp * d);
    const uint8_t *kv = panelv;
    const float *sk = (const float *)(const void *)(kv + (int64_t)NW * d);
    int32_t rows_used;
    memcpy(&rows_used, sk + groups * NW, sizeof rows_used);
    const int64_t nj = dg_ceil_div(rows_used, 16); /* kv tiles with rows; the others' sums are 0 */
    int32_t buf[LAG + 1][16 * 16] __attribute__((aligned(64)));
    __m512 dot[NJ][16]; /* head tile i's dots, kv tile j, head l */
    const __m512 zero = _mm512_setzero_ps();
    __m512 s[NJ];
    for (int j = 0; j < NJ; ++j)
        s[j] = zero;
    const int64_t items = ht * nj * groups;
    int64_t pfi = 0;
    item in = {0, 0, 0}, out = {0, 0, 0};
    for (int64_t n = 0; n < items + LAG; ++n) {
        if (n < items) {
            for (const int64_t end = npf ? npf * (n + 1) / items : 0; pfi < end; ++pfi)
                _mm_prefetch((const char *)pf[pfi], _MM_HINT_T0);
            const int qt = (int)((in.i * groups + in.g) & 1); /* q's tile: 4 or 5 */
            if (n & 1) {
                if (qt)
                    PRODUCT(1, 5, 7, in);
                else
                    PRODUCT(1, 4, 7, in);
            } else {
                if (qt)
                    PRODUCT(0, 5, 6, in);
                else
                    PRODUCT(0, 4, 6, in);
            }
            next_item(&in, groups, nj);
        }
        if (n >= 1 && n <= items) { /* store item n - 1 */
            int32_t *b = buf[(n - 1) % (LAG + 1)];
            if ((n - 1) & 1)
                _tile_stored(1, b, 64);
            else
                _tile_stored(0, b, 64);
        }
        if (n < LAG)
            continue;
        /* finish item n - LAG */
        const int32_t *b = buf[(n - LAG) % (LAG + 1)];
        const int64_t g = out.g, j = out.j, i = out.i;
        const __m512 skv = _mm512_loadu_ps(sk + g * NW + 16 * j);
        const float *sqg = sq + g * hp + 16 * i;
        __m512 *dj = dot[j];
        for (int l = 0; l < 16; ++l) {
            const __m512 f = _mm512_cvtepi32_ps(_mm512_load_si512(b + 16 * l));
            const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(sqg[l]), skv);
            dj[l] = _mm512_fmadd_ps(f, sc, g == 0 ? zero : dj[l]);
        }
        if (g == groups - 1 && j == nj - 1) {
            /* head tile i done: the chains of the NJ kv tiles over its valid heads, in increasing
             * order, interleaved (one chain alone would wait on each FMA's latency) */
            const int64_t hn = h - 16 * i < 16 ? h - 16 * i : 16;
            for (int l = 0; l < hn; ++l) {
                const __m512 wl = _mm512_set1_ps(w[16 * i + l]);
                for (int jj = 0; jj < nj; ++jj)
                    s[jj] = _mm512_fmadd_ps(wl, _mm512_max_ps(dot[jj][l], zero), s[jj]);
            }
        }
        next_item(&out, groups, nj);
    }
    for (int j = 0; j < NJ; ++j)
        _mm512_storeu_ps(sum + 16 * j, s[j]);
}
