/*
 * mqa_checks.h - argument checks shared by the MQA logits entry points (dense, paged, sparse).
 */
#ifndef DG_API_MQA_CHECKS_H
#define DG_API_MQA_CHECKS_H

#include "reference/ref_mqa.h"

/* q's rank and dtype for its format: with q_sf (mx) FP4_E2M1X2 (MXFP4) or FLOAT8_E4M3 (MXFP8),
 * without it FLOAT8_E4M3 (FP8 with float32 kv scales). */
dg_status dg_mqa_check_q_format(const dg_tensor *q, int ndim, int mx);
/* q, q_sf (NULL: FP8; given: MXFP4 or MXFP8), kv, kv_sf of the contiguous form; fills s, sk, h, d,
 * fp4, mx and the tensors. */
dg_status dg_mqa_check_q_kv(dg_mqa_problem *p, const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv,
                            const dg_tensor *kv_sf);
/* q [B, next_n, H, D(/2)], q_sf and the fused cache of the paged form; fills the extents. */
dg_status dg_paged_mqa_check_q_cache(dg_paged_mqa_problem *p, const dg_tensor *q, const dg_tensor *q_sf,
                                     const dg_tensor *cache);

/* The weights' dtypes: FLOAT32, BFLOAT16 (with BFLOAT16 logits only) and FLOAT16 (DeepGEMM
 * 2.8, with either logits dtype). */
#define DG_MQA_WEIGHT_DTYPES {DG_FLOAT32, DG_BFLOAT16, DG_FLOAT16}
/* FLOAT16 weights are widened exactly into a contiguous float32 copy that replaces *w, so the
 * kernels and the reference (which take float32 and bfloat16) see float32 weights of the same
 * values; *copy is then the memory to dg_free, else NULL and *w unchanged. Called after every
 * check, so that a call that fails allocates nothing. */
dg_status dg_mqa_widen_f16_weights(const dg_tensor **w, dg_tensor *view, void **copy);

#endif /* DG_API_MQA_CHECKS_H */
