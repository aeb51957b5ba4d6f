/* ref_einsum.h - reference einsum kernels (SPEC 7). */
#ifndef DG_REFERENCE_REF_EINSUM_H
#define DG_REFERENCE_REF_EINSUM_H

#include "../core/operand.h"

/*
 * "bmk,bnk->mn": a [S, M, K], b [S, N, K] (any real dtype, any strides), d [M, N] FLOAT32 or
 * BFLOAT16, c (NULL or d's shape, may be d itself):
 * d[m, n] = c[m, n] + sum over s, then k, of a[s, m, k] * b[s, n, k], in double, rounded once.
 */
void dg_ref_einsum_bmk_bnk_mn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);

/*
 * Batched GEMM over grouped operands: a is [G, M, K], b is [G, N, K] (dg_operand, scales
 * applied exactly), d and c [G, M, N] views (c NULL or possibly d itself):
 * d[g, m, n] = c[g, m, n] + sum_k (raw_a * scale_a) * (raw_b * scale_b), in double, rounded once.
 */
void dg_ref_bmm(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const dg_tensor *c);

#endif /* DG_REFERENCE_REF_EINSUM_H */
