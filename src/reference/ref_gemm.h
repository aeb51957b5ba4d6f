/*
 * ref_gemm.h - the reference (oracle) GEMM shared by every GEMM family: dense, m-/k-grouped,
 * einsum, skip_head_mid. It reads operands only through dg_operand_get (operand.h), so any
 * data layout, dtype and scale layout the operand accepts works unchanged. No argument
 * checking: callers validate first (see src/api/gemm_dense.c).
 *
 * Numeric contract (the oracle every fast kernel is compared with):
 *   value(x) = dg_operand_get(x, ...)                   dequantized element, a float
 *   acc      = (double)C + sum over k = 0, 1, ..., K-1 of (double)value(a) * (double)value(b)
 *   D        = dg_store_float(D, (float)acc)           one rounding to float, then to BF16
 * The products are exact in double; the sum runs in increasing k and is deterministic.
 */
#ifndef DG_REFERENCE_REF_GEMM_H
#define DG_REFERENCE_REF_GEMM_H

#include "../core/operand.h"

/*
 * Dot product of row i of operand a (group group_a) with row j of operand b (group group_b)
 * over their common K, in double, k ascending. a->k must equal b->k. Callers that sum several
 * dot products before rounding (e.g. einsum 'bmk,bnk->mn') use this directly.
 */
double dg_ref_dot(const dg_operand *a, int64_t group_a, int64_t i, const dg_operand *b,
                  int64_t group_b, int64_t j);

/*
 * One output block: for every r < m_end - m_begin and s < n_end - n_begin,
 *   D[r, s] = round(C[r, s] + dg_ref_dot(a, group_a, m_begin + r, b, group_b, n_begin + s))
 * with C[r, s] = 0 when c is NULL. `d` and `c` are 2-D FLOAT32/BF16 views of exactly that block
 * ([m_end - m_begin, n_end - n_begin], any strides; build them with dg_ref_view2d). c may be the
 * same view as d (each element is read before it is written); otherwise it must not overlap d.
 * group_a / group_b index the leading dimension of grouped operands (ignored otherwise).
 */
void dg_ref_gemm(const dg_operand *a, int64_t group_a, int64_t m_begin, int64_t m_end,
                 const dg_operand *b, int64_t group_b, int64_t n_begin, int64_t n_end,
                 const dg_tensor *d, const dg_tensor *c);

/*
 * A 2-D view [rows, cols] of a 2-D tensor t (group must be -1) or of group `group` of a 3-D
 * tensor t, starting at element (row0, col0). No checks; t must be a FLOAT32/BF16 (or other
 * whole-byte dtype) tensor and the block must lie inside it.
 */
dg_tensor dg_ref_view2d(const dg_tensor *t, int64_t group, int64_t row0, int64_t rows, int64_t col0,
                        int64_t cols);

#endif /* DG_REFERENCE_REF_GEMM_H */
