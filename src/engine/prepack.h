/*
 * prepack.h - a weight operand B packed once into the engine's panels (format: engine.h,
 * "Packed panels" and "Pre-packed B"), and the GEMM that takes it (prepack.c). The public
 * handle dg_packed_b (include/deepgemm.h) is this struct.
 */
#ifndef DG_ENGINE_PREPACK_H
#define DG_ENGINE_PREPACK_H

#include "engine.h"

#define DG_PACKED_B_MAGIC 0x44475042u /* "DGPB": catches a stray pointer or a double free */
/* Column slices of a packed B (grouped_packed.c's work items) start at multiples of this. */
#define DG_PACKED_SLICE 1024

struct dg_packed_b {
    uint32_t magic;
    const dg_engine_cfg *cfg; /* the configuration (ISA, kernel, panel format) packed for */
    dg_dtype dtype;           /* B's dtype: BF16, E4M3 or FP4 */
    dg_dtype sf_dtype;        /* FLOAT32 or INT32 (packed UE8M0); unused for BF16 */
    int gran_b[2];            /* B's resolved recipe (gran_mn, gran_k); 0 for BF16 */
    int fold_b;               /* B's scales are folded into the panel values */
    int64_t n, k;             /* logical B [N, K] */
    dg_packed pk;             /* NR-row panels; pk.gblk = dg_engine_k_block(0, gran_b[1], k)
                               * when scales are kept */
    /* FP4 B only: its E2M1 codes K-major [n][ceil(k / 2)] and its scales as float32
     * [n][ceil(k / gran_b[1])], in the block fp4_mem (dg_free): an FP4 A then runs the integer
     * path of fp4x4.h on them, as the unpacked call does (bitwise the same D), and so does a
     * decoding call (M <= 2) with another A on configurations with decode kernels: the
     * unpacked call's small-M path, 0.5 bytes per weight instead of the panels' 2. */
    void *fp4_mem;
    const uint8_t *fp4_codes;
    const float *fp4_sf;
    /* The same codes and scales as decode panels (engine.h, dg_e2m1_panels: 16 rows x 32 k per
     * 256 bytes) on configurations with kernels for them (AVX-512 BF16; else fp4p.codes NULL):
     * decoding calls with another A, M up to the decode kernels' bound, read these (0.5 bytes
     * per weight, widened in 128-bit lanes with no transpose) and the bytes above serve the
     * rest. 1 byte per weight in all with the codes, plus the BF16 panels' 2. On AMX
     * configurations fp4p.codes holds the same codes as DG_AMX_E2M1_PLANES (engine.h) for the
     * AMX small-M kernel, M <= 64, with sfe and exact as engine.h describes for AMX. */
    dg_e2m1_panels fp4p;
    /* FP8 B on AMX configurations and on those with decode kernels (AVX2 and up): its E4M3 codes
     * K-major [n][k] (1 byte per weight) and, with
     * scales, float32 scales [ceil(n / fp8_gran_mn)][ceil(k / gran_b[1])], fp8_gran_mn =
     * gcd(gran_b[0], DG_PACKED_SLICE) (the same values; a column slice at a multiple of
     * DG_PACKED_SLICE still indexes them), in the block fp8_mem (dg_free). Small-M calls run
     * smallm.c on them as on an unpacked K-major FP8 B (bitwise the unpacked call's D) and read
     * 1 byte per weight instead of the panels' 2.
     * The codes serve only M <= 2, where reading B is the bound; larger M takes the panels (the
     * small-M kernels staging codes per K slice cost more than widening BF16 panels: grouped FP8
     * decoding measured 94 ms on codes vs 72 ms on panels at the AVX-512 level).
     * Large-M calls keep using the BF16 panels (pk): the object then holds both, 3 bytes per
     * weight instead of 2 (+50%), because packing B per large-M call instead was measured at
     * 3.6x the time at M = 65, 1.8x at 256, 1.2x at 1024 (N 2112, K 7168, one thread). */
    void *fp8_mem;
    const uint8_t *fp8_codes;
    /* The same codes as decode panels (engine.h, DG_DECODE_E4M3P: 16 rows x 32 k per 512 bytes)
     * on configurations with kernels for them (AVX-512 BF16; else NULL), in fp8_mem: decoding
     * calls M <= DG_DECODE_MAX_M read these (1 byte per weight, no transpose per step; the rows
     * above serve wider calls and the exact fallback). 2 bytes per weight with the codes. */
    const uint8_t *fp8p;
    const float *fp8_sf;
    int fp8_gran_mn;
    /* Grouped weights (dg_pack_b_grouped, src/engine/grouped_packed.c): groups = G > 0 and
     * group[g] is group g's dense packed B (fold_b, pk of its own). pk.data is then the one
     * block holding every group's panels, kept scales and this table (freed with it); pk
     * describes no panels. Dense objects: groups = 0, group = NULL. */
    int64_t groups;
    const struct dg_packed_b *group;
};

/* Memory for a large read-mostly block of a packed B: 2 MiB aligned and huge-page advised when
 * large (fewer TLB misses over the decoding stream), else 64-byte aligned; dg_free() it. NULL
 * when out of memory. */
void *dg_packed_alloc(size_t bytes);

/* Packs operand b (its scales, if any, at gran (gran_mn, gran_k) already attached) for the
 * current configuration into out (fields above). */
dg_status dg_engine_prepack_b(const dg_operand *b, struct dg_packed_b *out);

/* The tail of dg_pack_b / dg_pack_b_grouped (src/api/gemm_packed.c): B's recipe and scales
 * attached to ob, a new handle filled by `pack`, *out set only on success. */
dg_status dg_packed_b_make(dg_operand *ob, const dg_tensor *b, const dg_tensor *sfb, const dg_gemm_options *opts,
                           dg_status (*pack)(const dg_operand *, struct dg_packed_b *), dg_packed_b **out);

/* The configuration a call on B runs under the current ISA: B's own, which is the current one
 * or, at AMX, its fallback level when B's scale blocks are not whole AMX k steps (packed there
 * as the unpacked call would run). DG_ERR_VALUE when dg_set_isa changed the level since packing. */
dg_status dg_engine_prepacked_cfg(const struct dg_packed_b *b, const struct dg_engine_cfg **cfg);

/* D = C + A @ B^T with B pre-packed. DG_ERR_VALUE when the current configuration is not the
 * one B was packed for; DG_ERR_UNSUPPORTED (nothing written) when the unpacked call would not
 * run the engine for this pair (scale blocks of odd length), so that results could differ. */
dg_status dg_engine_gemm_prepacked(const dg_operand *a, const struct dg_packed_b *b, const dg_tensor *d,
                                   const dg_tensor *c);

/* BF16-pair panel words [pairs][r] -> float32 panel [2 * pairs][r] (src/kernels/avx512/ and
 * avx2/; x86-64 only, called only on configurations of that level or above). */
void dg_widen_pairs_avx512(const uint32_t *src, int64_t pairs, int r, uint32_t *dst);
void dg_widen_pairs_avx2(const uint32_t *src, int64_t pairs, int r, uint32_t *dst);

#endif /* DG_ENGINE_PREPACK_H */
