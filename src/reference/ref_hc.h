/* ref_hc.h - reference hyper-connection prenorm GEMM (SPEC 6). */
#ifndef DG_REFERENCE_REF_HC_H
#define DG_REFERENCE_REF_HC_H

#include "../core/internal.h"

/* DeepGEMM cuts K into blocks of this many elements and hands whole blocks to the splits. */
#define DG_HC_BLOCK_K 64

/* K range [*k0, *k1) of split `split` out of `num_splits` (see dg_tf32_hc_prenorm_gemm). */
void dg_hc_split_range(int64_t k, int num_splits, int split, int64_t *k0, int64_t *k1);

/*
 * a BF16 [M, K], b FLOAT32 [N, K] (any strides); d FLOAT32 [S, M, N] and sqr_sum FLOAT32 [S, M]
 * with S = num_splits >= 1 (the entry point passes 3-D/2-D views of unsplit outputs).
 * d[s, m, n] = sum_{k in split s} a[m, k] * b[n, k] and sqr_sum[s, m] = sum_{k in split s} a[m, k]^2,
 * accumulated in double in increasing k, rounded once to float.
 */
void dg_ref_hc_prenorm(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *sqr_sum,
                       int num_splits);

#endif /* DG_REFERENCE_REF_HC_H */
