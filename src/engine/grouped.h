/*
 * grouped.h - the grouped GEMMs of SPEC 4 on the dense engine (additive to engine.h).
 *
 * Every group (or, for the index layout of contiguous m-grouped GEMMs, every run of
 * consecutive rows with one group id) is one dense problem D_g = C_g + A_g @ B_g^T on 2-D,
 * non-grouped operand views, run by dg_engine_gemm. Scheduling across threads:
 *  - groups on the engine's large-M path: one call each; the engine splits the group's output
 *    tiles across all threads (dynamically), so uneven group sizes stay balanced;
 *  - groups on its small-M path (<= 64 rows, decoding): every group is cut into column chunks
 *    and all (group, chunk) items of the call run in one dynamically scheduled parallel loop,
 *    each a single-threaded engine call: one barrier per call, balanced for 32 tiny groups;
 *  - groups with no rows are skipped before any work (no packing, no B read).
 * Which thread runs an item never changes its bits.
 *
 * Numerics: exactly the engine's per-element order (engine.h). K is never split and A's
 * scales are never folded, so an output row depends only on its own A row and its group's B:
 * the bits do not depend on the other rows, the other groups, the thread count or the call.
 *
 * Each function first builds every view and asks the engine whether it takes the pair
 * (dg_engine_plan_scales); when any group is outside the engine it returns DG_ERR_UNSUPPORTED
 * without writing anything and the caller runs the reference. Allocation failures inside the
 * engine are returned as they happen (earlier groups may then be written already).
 */
#ifndef DG_ENGINE_GROUPED_H
#define DG_ENGINE_GROUPED_H

#include "../reference/ref_grouped.h"
#include "engine.h"

/*
 * Rows [row0, row0 + rows) of group g of op (g = 0 when op is not grouped) as a 2-D,
 * non-grouped operand; data_view / sf_view are the storage of its descriptors and must outlive
 * *out. False when the rows cannot be expressed as a view (a scale block or an FP4 pair would
 * be cut).
 */
bool dg_engine_operand_rows(const dg_operand *op, int64_t g, int64_t row0, int64_t rows, dg_tensor *data_view,
                            dg_tensor *sf_view, dg_operand *out);

/* Contiguous m-grouped GEMM (arguments and semantics: dg_ref_m_grouped_contiguous). */
dg_status dg_engine_m_grouped_contiguous(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                                         const int32_t *layout, int use_psum, int64_t alignment, int zero_padding);

/* Masked m-grouped GEMM (arguments and semantics: dg_ref_m_grouped_masked). */
dg_status dg_engine_m_grouped_masked(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                                     const int32_t *masked_m);

/* ---- pre-packed grouped weights (grouped_packed.c; the struct: prepack.h) ---------------
 * dg_engine_prepack_b_grouped packs every group of the grouped operand b ([G, N, K], scales
 * attached) for the current configuration; out's dtype, sf_dtype and gran_b are set by the
 * caller and copied into each group. The GEMMs below take such an object and give bitwise the
 * D of the unpacked calls above. Before writing anything they fail with DG_ERR_VALUE when the
 * current configuration is not the packing one and with DG_ERR_UNSUPPORTED when the packed
 * engine cannot run A's scale blocks with B's (dg_engine_gemm_prepacked's refusals). */
struct dg_packed_b;
dg_status dg_engine_prepack_b_grouped(const dg_operand *b, struct dg_packed_b *out);
dg_status dg_engine_m_grouped_masked_prepacked(const dg_operand *a, const struct dg_packed_b *b,
                                               const dg_tensor *d, const int32_t *masked_m);
dg_status dg_engine_m_grouped_contiguous_prepacked(const dg_operand *a, const struct dg_packed_b *b,
                                                   const dg_tensor *d, const int32_t *layout, int use_psum,
                                                   int64_t alignment, int zero_padding);

/* K-grouped GEMM (arguments and semantics: dg_ref_k_grouped). */
dg_status dg_engine_k_grouped(const dg_k_grouped_problem *p);

#endif /* DG_ENGINE_GROUPED_H */
