/*
 * ref_grouped.h - reference (oracle) implementations of the grouped GEMMs for mixture-of-experts
 * (SPEC 4). The public entry points in src/api/gemm_m_grouped.c and gemm_k_grouped.c validate
 * every argument, including the contents of the layout tensors, and only then call these.
 *
 * Numerics, shared by every function here: each product is formed from the exactly dequantized
 * operands (raw value times scale, both widened to double), products are summed in double in
 * increasing k order, C (if any) is added in double, and the sum is rounded once to D's dtype
 * through dg_store_float. The result is deterministic.
 */
#ifndef DG_REFERENCE_REF_GROUPED_H
#define DG_REFERENCE_REF_GROUPED_H

#include "core/operand.h"

/* ---- m-grouped ------------------------------------------------------------------------------ */

/*
 * Contiguous layout: a is the [M, K] operand (not grouped), b the [G, N, K] operand, d [M, N].
 * `layout` is the validated grouped_layout:
 *  - index form (use_psum == 0): int32 [M]; row r belongs to group layout[r], -1 = padding row
 *    (neither its A row is read nor its D row written);
 *  - psum form (use_psum == 1): int32 [G] end rows; group g covers rows
 *    [align(layout[g-1], alignment), layout[g]). With zero_padding the rows
 *    [layout[g], min(align(layout[g], alignment), M)) of D are set to 0; every other row outside
 *    the groups is left untouched.
 */
void dg_ref_m_grouped_contiguous(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                                 const int32_t *layout, int use_psum, int64_t alignment,
                                 int zero_padding);

/* Masked layout: a [G, max_m, K], b [G, N, K], d [G, max_m, N]. Only rows m < masked_m[g] of
 * group g are computed; the rest of D is neither read nor written. */
void dg_ref_m_grouped_masked(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                             const int32_t *masked_m);

/* ---- k-grouped ------------------------------------------------------------------------------ */

/*
 * A k-grouped problem after validation: D[g] = C[g] + A_g^T B_g for g < groups, D and C float32
 * [G, M, N] (c NULL: no C; c may be the very same view as d).
 *
 * Operand layouts (DeepGEMM's):
 *  - MN-major (`_tn`, k_major == 0): a [sum_k, M] and b [sum_k, N]; group g owns rows
 *    [k_start[g], k_start[g] + k_len[g]).
 *  - K-major (`_nt`, k_major == 1): a and b are flat buffers holding, group after group, an
 *    [M, k_len[g]] (resp. [N, k_len[g]]) row-major block starting at element k_start[g] * M
 *    (resp. k_start[g] * N).
 *  - Packed FP4 (fp4 == 1): a [M, sum_k / 2], b [N, sum_k / 2], K-major rows; group g owns the
 *    logical columns [k_start[g], k_start[g] + k_len[g]) of every row (an odd k_len is read up
 *    to the pair's end: that code is padding, zero by DeepGEMM's contract).
 * FP8 scales are per channel along K with granularity gran_k:
 *  - MN-major: sf [rows, MN], float32 (group g's rows start at sf_start[g], one row per gran_k
 *    of its K) or int32 packed UE8M0 (group g's packed rows start at sf_start[g], four gran_k
 *    blocks per row, each group padded to whole packed rows);
 *  - K-major: float32 sf [MN, cols], group g's columns start at sf_start[g].
 *  - Packed FP4: as MN-major.
 * BF16 problems have sfa = sfb = NULL.
 */
typedef struct dg_k_grouped_problem {
    const dg_tensor *a, *sfa, *b, *sfb;
    const dg_tensor *d, *c;
    int64_t groups, m, n;
    int k_major;
    int fp4;        /* a, b packed FP4 [MN, sum_k / 2] (K-major rows; scales MN-major as `_tn`) */
    int gran_k;
    const int64_t *k_start, *k_len, *sf_start; /* [groups] each */
} dg_k_grouped_problem;

/*
 * Builds group g's operands as 2-D views of logical shape [M, k_len] and [N, k_len] (with their
 * scales). `views` is storage for the four view descriptors and must outlive a and b. Fails
 * only if the problem was not validated; k_len[g] must be > 0.
 */
dg_status dg_k_group_operands(const dg_k_grouped_problem *p, int64_t g, dg_tensor views[4],
                              dg_operand *a, dg_operand *b);

/* Computes every group; the problem must have passed dg_k_group_operands for each non-empty
 * group. */
void dg_ref_k_grouped(const dg_k_grouped_problem *p);

#endif /* DG_REFERENCE_REF_GROUPED_H */
