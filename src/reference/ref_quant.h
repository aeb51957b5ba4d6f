/*
 * ref_quant.h - reference implementations of the quantization helpers (deep_gemm.utils) and
 * the format utilities behind src/api/quant.c and src/api/formats.c. Arguments have been
 * validated by the entry points; functions that need temporary memory return DG_ERR_ALLOC
 * before writing anything.
 */
#ifndef DG_REFERENCE_REF_QUANT_H
#define DG_REFERENCE_REF_QUANT_H

#include "../core/internal.h"

/* The largest magnitudes the scale maps amax to (DeepGEMM's divisors). */
#define DG_E4M3_MAX 448.0f
#define DG_E2M1_MAX 6.0f
/* DeepGEMM's clamp of amax, applied in float32 as torch's clamp does with a float tensor. */
#define DG_AMAX_MIN 1e-4f

/* sf of one group from its amax (NaN propagates, as torch's clamp). */
float ref_group_scale(float amax, float fmt_max, bool use_ue8m0);

/*
 * E4M3 quantization of x [M, K] (FLOAT32/BFLOAT16) in blocks of bm rows x bk columns, the
 * matrix padded with zeros to whole blocks: per_token (1, g), per_block (g, g), per_channel
 * (g, 1). out E4M3 [M, K]; out_sf FLOAT32 [ceil(M/bm), ceil(K/bk)] or, with packed, INT32
 * [ceil(M/bm), ceil(S/4)] whose missing trailing scales are 1.0.
 */
dg_status ref_quant_fp8_blocks(const dg_tensor *x, int64_t bm, int64_t bk, bool use_ue8m0, bool packed,
                               const dg_tensor *out, const dg_tensor *out_sf);

/* E4M3 quantization with one scale per index of the kept dimensions (keep[d] != 0); with no
 * kept dimension a single scale. out_sf holds the scales in row-major order of the kept
 * dimensions (its own shape and strides only decide where each one goes). */
dg_status ref_quant_fp8_custom_dims(const dg_tensor *x, const bool *keep, bool use_ue8m0, const dg_tensor *out,
                                    const dg_tensor *out_sf);

/* FP4 (E2M1) per-token quantization of x [M, K], groups 1 x gran_k: out packed [M, K/2],
 * out_sf as in ref_quant_fp8_blocks with bm = 1. */
dg_status ref_quant_fp4_token(const dg_tensor *x, int64_t gran_k, bool use_ue8m0, bool packed, const dg_tensor *out,
                              const dg_tensor *out_sf);

/* out [M, N] = value(code) * scale, see dg_cast_back_from_fp4. */
void ref_cast_back_from_fp4(const dg_tensor *packed, const dg_tensor *sf, int64_t gran_k, bool sf_packed,
                            const dg_tensor *out);
/* out [M, N] = e4m3(x) * scale, see dg_cast_back_from_fp8. */
void ref_cast_back_from_fp8(const dg_tensor *x, const dg_tensor *sf, int64_t gran_k, bool sf_packed,
                            const dg_tensor *out);
void ref_transpose_packed_fp4(const dg_tensor *a, const dg_tensor *out);
void ref_pack_ue8m0(const dg_tensor *x, const dg_tensor *out);
void ref_unpack_ue8m0(const dg_tensor *packed_sf, const dg_tensor *out);
void ref_ceil_to_ue8m0(const dg_tensor *x, const dg_tensor *out);
double ref_calc_diff(const dg_tensor *x, const dg_tensor *y);

#endif /* DG_REFERENCE_REF_QUANT_H */
