/*
 * mqa_kernels.h - inner kernels of the fast MQA logits (SPEC 5), prefill and paged decode.
 *
 * The driver (src/kernels/mqa_logits.c) treats the logits as a GEMM of (query x head) rows
 * against kv rows with the epilogue fused: for one query token and one "panel" of `nw`
 * consecutive kv rows it calls `tile`, which returns, per kv row c of the panel,
 *     sum[c] = sum over h (increasing) of w[h] * relu(sum over k (increasing) of q[h][k] * kv[c][k])
 * in float32 (one FMA per step, per lane). Every lane of the panel runs the same instruction
 * sequence, so a logit's bits depend only on its inputs, the ISA's kernel and the head tile
 * size - never on the thread count, the panel a row lands in or its lane.
 *
 * Values are exact in float32: E4M3 codes are stored as value * 2^-8 (so a vector kernel may
 * convert through FP16 without rescaling; the driver multiplies the head sum by 2^16), times
 * their power-of-two UE8M0 scale for MXFP8; E2M1 codes as value * their UE8M0 scale (exact
 * unless it leaves float32's range).
 * With VNNI, FP4 x FP4 uses the integer path instead (q4_prep / kv4_pack / tile4): exact int32
 * dot products per 32-element scale group, scaled exactly and added group by group in float32,
 * then the same head chain (see avx512_bf16/mqa_fp4_vnni.c).
 *
 * FP32 FMA or VDPBF16PS: on Sapphire Rapids VDPBF16PS peaks at about half the FP32 FMA rate
 * (dgbench: ~116 vs ~230 GFLOPS per core), on AMD Zen 4 at twice it (~460 vs ~230 for two
 * cores), and E4M3 x E4M3 products are exact in float32 either way (MXFP8: while they stay in
 * float32's normal range; with the 2^-16 of the two conversions that needs the q and kv scale
 * bytes of a group to sum to at least ~162, which any quantizer's scales (bytes >= 105 for
 * amax >= 1e-4) do). So the AVX-512 BF16 level's FP8 tile sums over k pairs in VDPBF16PS's
 * order, on VDPBF16PS where the engine prefers it (dg_engine_dpbf16) and on FMA otherwise, with
 * the same bits (avx512_bf16/mqa_fp8_pairs.c). MXFP8 takes the same tiles, VDPBF16PS only for
 * calls whose scales keep every value, product and partial sum a normal float32 (VDPBF16PS
 * flushes denormals; the FMA tile gives such logits the same bits, so a logit's bits never
 * depend on which tile its call took).
 *
 * AMX level, FP8 (amx/mqa_amx.c): the dot products come from TDPBF16PS instead of the FMA
 * chain. E4M3 * 2^-8 is exact in BF16, the products are exact, and each k step of 32 (d
 * zero-padded to a multiple of 32, steps in increasing k) adds its 32 products to the float32
 * sum in the hardware's fixed order (not the FMA chain's bits, nor one rounding of the exact
 * sum). The head/relu/weight chain above is unchanged. A logit still depends only on its inputs:
 * not on the thread count, the panel, the lane or the query's position. FP4 x FP4 at the AMX
 * level takes TDPBSSD for the exact integer group sums (amx/mqa_fp4_amx.c) and otherwise the
 * VNNI kernel's steps, so its logits are bitwise the AVX-512 BF16 level's. MXFP8 takes the
 * FP8 AMX tiles when the call's scales are in the VDPBF16PS range above (each group's scale is
 * then an exact add to the BF16 exponents of the packed values) and the FMA pair tile
 * otherwise: at this level alone, a call's scale range can change a logit's bits.
 *
 * Layouts (float32): q as prep_q leaves it (default: [h][d] row-major, row stride d; at most
 * align(h, 16) * align(d, 32) floats); panel as pack leaves it (default: [d][nw], kv row c,
 * element k at panel[k * nw + c]; AVX-512: the rows themselves, [nw][d]; at most
 * nw * align(d, 32) floats); rows past the valid ones are zero. AMX: q is BF16 [hp][dp] and the
 * panel BF16 k pairs x nw (see mqa_amx.c), in the same float buffers.
 */
#ifndef DG_KERNELS_MQA_KERNELS_H
#define DG_KERNELS_MQA_KERNELS_H

#include "../core/internal.h"

#include <stdint.h>

#define DG_MQA_FP8_SCALE 0x1p-8f /* converted E4M3 = value * 2^-8 */

/* Input formats of q and kv (the `fmt` argument of the kernels below). */
enum {
    DG_MQA_FP8 = 0,   /* E4M3, no per-element scales (kv: a float32 scale per row, applied by the driver) */
    DG_MQA_FP4 = 1,   /* MXFP4: packed E2M1 with a packed UE8M0 word per row (per-32 scales) */
    DG_MQA_MXFP8 = 2  /* MXFP8: E4M3 with a packed UE8M0 word per row (per-32 scales) */
};

/* The format of a problem: `fp4` (packed E2M1 data) and `mx` (per-32 UE8M0 words given). */
static inline int dg_mqa_format(int fp4, int mx) { return fp4 ? DG_MQA_FP4 : mx ? DG_MQA_MXFP8 : DG_MQA_FP8; }

/* MXFP8: multiplies converted E4M3 values (value * 2^-8) in place by their per-32 UE8M0 scales
 * from `word`. Exact for scale bytes 0..254: the products lie in [2^-144, 1.75 * 2^127], all
 * representable in float32 (subnormals included) with E4M3's 4 significant bits; byte 255 gives
 * inf as in dg_ue8m0_to_float and the reference. A plain loop: each ISA's file compiles
 * it with its own vector width. */
static inline void dg_mqa_apply_mx_scales(float *o, int64_t d, uint32_t word) {
    for (int64_t g = 0; g * 32 < d; ++g) {
        const float sc = dg_ue8m0_to_float((uint8_t)(word >> (8 * g)));
        const int64_t end = d < 32 * g + 32 ? d : 32 * g + 32;
        for (int64_t k = 32 * g; k < end; ++k)
            o[k] *= sc;
    }
}

/* Converts n rows of d values to float32 row-major out[r * d + k]. FP8 and MXFP8: rows[r]
 * holds d E4M3 bytes. FP4: rows[r] holds d/2 bytes of packed E2M1 (element 2i in the low
 * nibble of byte i). FP4 and MXFP8: sf[r] is the packed UE8M0 word (byte g scales elements
 * [32g, 32g + 32)). */
typedef void (*dg_mqa_convert_fn)(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt,
                                  float *out);
/* Packs n <= nw rows (as convert) into panel [d][nw], zeroing rows n..nw-1. `tmp` holds at
 * least nw * d floats. */
typedef void (*dg_mqa_pack_fn)(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt,
                               float *tmp, float *panel);
/* Rearranges a token's converted q [h][d] into the tile's layout (NULL: used as is). */
typedef void (*dg_mqa_prep_q_fn)(const float *q, int64_t h, int64_t d, float *out);
/* sum[c] for c < nw as described above; h >= 1 heads. While it computes, a tile hints the npf cache lines pf[0..npf) into the cache, spread over
 * its run (paged decode: the next panel's scattered rows; a burst of prefetches would stall on
 * the line fill buffers). */
typedef void (*dg_mqa_tile_fn)(const float *q, int64_t h, int64_t d, const float *w, const float *panel,
                               float *sum, const uint8_t *const *pf, int npf);

/* FP4 x FP4 on integer dot products (optional): q and kv go from packed E2M1 + UE8M0 words
 * straight to the kernel's layouts (at most align(h, 16) * d floats, nw * d floats). */
typedef void (*dg_mqa_q4_prep_fn)(const uint8_t *const *rows, const uint32_t *sf, int64_t h, int64_t d, void *out);
typedef void (*dg_mqa_kv4_pack_fn)(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, void *panel);
typedef void (*dg_mqa_tile4_fn)(const void *q, int64_t h, int64_t d, const float *w, const void *panel, float *sum,
                                const uint8_t *const *pf, int npf);

typedef struct dg_mqa_kernel {
    const char *name;
    int nw; /* kv rows per panel */
    dg_mqa_convert_fn convert;
    dg_mqa_pack_fn pack; /* NULL: convert, then the default transposing pack */
    dg_mqa_prep_q_fn prep_q;
    dg_mqa_tile_fn tile;
    dg_mqa_q4_prep_fn q4_prep; /* NULL: FP4 goes through float32 like FP8 */
    dg_mqa_kv4_pack_fn kv4_pack;
    dg_mqa_tile4_fn tile4;
    void (*begin)(void); /* NULL, or run by each thread of a call before its first tile (AMX: the tile config) */
    int qb;              /* prefill tokens per work item sharing a packed panel; 0: the driver's default */
} dg_mqa_kernel;

/* The kernel for an ISA level and an input format (falls back to lower levels). mx_in_range:
 * for MXFP8, whether every scale byte of the call keeps the values, products and sums in
 * float32's normal range (mx_ok in mqa_logits.c), which the VDPBF16PS and AMX tiles need. */
const dg_mqa_kernel *dg_mqa_kernel_for(dg_isa isa, int fmt, bool mx_in_range);

/* Generic pieces (src/kernels/generic/mqa_generic.c), usable by every ISA. */
void dg_mqa_convert_generic(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *out);
void dg_mqa_pack_generic(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                         float *panel, int nw);
void dg_mqa_tile_generic(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                         const uint8_t *const *pf, int npf);
#define DG_MQA_NW_GENERIC 16

#if defined(__x86_64__) || defined(_M_X64)
#define DG_MQA_HAVE_X86 1
#define DG_MQA_NW_AVX2 16
#define DG_MQA_NW_AVX512 48
void dg_mqa_tile_avx2(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                         const uint8_t *const *pf, int npf);
void dg_mqa_convert_avx2(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *out);
void dg_mqa_pack_avx2(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                      float *panel);
void dg_mqa_tile_avx512(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                         const uint8_t *const *pf, int npf);
void dg_mqa_convert_avx512(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *out);
void dg_mqa_prep_q_avx512(const float *q, int64_t h, int64_t d, float *qt);
void dg_mqa_pack_avx512(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                        float *panel);
/* FP8 at the AVX-512 BF16 level: the k-pair order on VDPBF16PS or on FMA (avx512_bf16/mqa_fp8_pairs.c). */
void dg_mqa_prep_q_pairs(const float *q, int64_t h, int64_t d, float *out);
void dg_mqa_pack_pairs(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                       float *panel);
void dg_mqa_tile_pairs_dp(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                          const uint8_t *const *pf, int npf);
void dg_mqa_tile_pairs_fma(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                           const uint8_t *const *pf, int npf);
void dg_mqa_q4_prep_vnni(const uint8_t *const *rows, const uint32_t *sf, int64_t h, int64_t d, void *out);
void dg_mqa_kv4_pack_vnni(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, void *panel);
void dg_mqa_tile4_vnni(const void *q, int64_t h, int64_t d, const float *w, const void *panel, float *sum,
                       const uint8_t *const *pf, int npf);
#else
#define DG_MQA_HAVE_X86 0
#endif

#if DG_MQA_HAVE_X86 && defined(DG_HAVE_AMX) /* the build has AMX kernels (CMakeLists.txt) */
#define DG_MQA_HAVE_AMX 1
#define DG_MQA_NW_AMX 64 /* a multiple of 32 (blocks of two column tiles); 128 measured no faster */
/* Prefill tokens per item: packing a panel costs about 1.3 tokens' tiles (measured: 16 ~5% faster
 * than 32, ~15% faster than 8). */
#define DG_MQA_QB_AMX 16
void dg_mqa_amx_begin(void);
void dg_mqa_prep_q_amx(const float *q, int64_t h, int64_t d, float *out);
void dg_mqa_pack_amx(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                     float *panel);
void dg_mqa_tile_amx(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                     const uint8_t *const *pf, int npf);
/* FP4 x FP4 on AMX INT8 tiles (amx/mqa_fp4_amx.c): the VNNI kernel's bits. */
void dg_mqa_amx_fp4_begin(void);
void dg_mqa_q4_prep_amx(const uint8_t *const *rows, const uint32_t *sf, int64_t h, int64_t d, void *out);
void dg_mqa_kv4_pack_amx(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, void *panel);
void dg_mqa_tile4_amx(const void *q, int64_t h, int64_t d, const float *w, const void *panel, float *sum,
                      const uint8_t *const *pf, int npf);
#else
#define DG_MQA_HAVE_AMX 0
#endif

/* Fast entry points (src/kernels/mqa_logits.c); arguments already validated. Fail only with
 * DG_ERR_ALLOC, before writing anything. */
struct dg_mqa_problem;
struct dg_paged_mqa_problem;
struct dg_sparse_mqa_problem;
dg_status dg_mqa_logits_fast(const struct dg_mqa_problem *p);
dg_status dg_paged_mqa_logits_fast(const struct dg_paged_mqa_problem *p);
dg_status dg_sparse_mqa_logits_fast(const struct dg_sparse_mqa_problem *p);

#endif /* DG_KERNELS_MQA_KERNELS_H */
