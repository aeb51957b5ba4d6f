/*
 * ref_mhc.h - reference Mega mHC (dg_mega_mhc, see deepgemm.h), and the per-token pieces the
 * fast path (engine/mega_mhc.c) shares with it.
 */
#ifndef DG_REFERENCE_REF_MHC_H
#define DG_REFERENCE_REF_MHC_H

#include "../core/internal.h"
#include "../formats/convert.h"

/* Partial sums of the RMSNorm's mean of squares (deepgemm.h: lane l takes h = l mod 8). */
#define DG_MHC_LANES 8
/* The quantization group of y_fp8 and the elements one packed INT32 scale word covers. */
#define DG_MHC_FP8_GRAN 32
#define DG_MHC_SF_WORD (4 * DG_MHC_FP8_GRAN)

/* One checked call (src/api/mega_mhc.c). Dense tensors are contiguous, so their data pointers
 * are used directly; the scale-factor outputs keep their strides. */
typedef struct dg_mhc_call {
    int64_t t, h;  /* tokens, hidden */
    int hc, n;     /* hc_mult, mixes = hc * (hc + 2) */
    int iters;     /* num_sinkhorn_iters >= 1 */
    float norm_eps, pre_eps, post_scale, sk_eps, rms_eps, rms_scale;
    const uint16_t *x, *residual, *rms_weight;      /* BF16 */
    const float *shifted_prev_mix;                  /* NULL: normal mHC */
    const float *post_mix, *comb, *fn, *scales, *bases;
    uint16_t *new_residual;                          /* BF16 */
    float *new_prev_mix;                             /* NULL: normal mHC */
    float *new_post_mix, *new_comb;
    uint16_t *y_bf16;                                /* NULL: not wanted */
    uint8_t *y_fp8;                                  /* NULL: not wanted */
    int32_t *sf;                                     /* y_gemm_sf or y_routed_sf (with y_fp8) */
    int64_t sf_stride_t, sf_stride_w;
    int32_t *shared_sf;                              /* NULL unless given */
    int64_t shared_stride_w;
    int64_t shared_bm;                               /* shared_sf_block_m */
    const dg_tensor *fn_t;                           /* fn's descriptor (the GEMM's b) */
} dg_mhc_call;

/* Row of y_shared_sf that holds token t's words (Mega MoE's shared-expert layout). */
static inline int64_t dg_mhc_shared_row(int64_t t, int64_t bm) {
    const int64_t i = t % bm;
    return t / bm * dg_align(bm, 128) + i / 128 * 128 + i % 32 * 4 + i % 128 / 32;
}

/* Step 3 for one token: mix [n] raw GEMM outputs, sqr its square sum -> pre [hc],
 * post [hc], comb [hc * hc]. Scalar: a few hundred operations per token. */
void dg_mhc_mix_token(const dg_mhc_call *c, const float *mix, float sqr, float *pre, float *post, float *comb);

/* y_fp8 and its scale words for token t from its BF16 row y [h]. The E4M3 codes come from the
 * run kernels ck (the same bits: src/formats/convert.h), or from dg_float_to_e4m3 (ck NULL). */
void dg_mhc_quant_token(const dg_mhc_call *c, int64_t t, const uint16_t *y, const dg_convert_kernels *ck);

/* The whole call; DG_ERR_ALLOC (nothing written) when its scratch cannot be allocated. */
dg_status dg_ref_mega_mhc(const dg_mhc_call *c);

#endif /* DG_REFERENCE_REF_MHC_H */
