/*
 * gemm_m_grouped.c - m-grouped GEMMs for mixture-of-experts (SPEC 4): contiguous (index or psum
 * grouped_layout) and masked forms, BF16 and FP8/FP4. Argument checks follow DeepGEMM's
 * csrc/apis/gemm.hpp; every check, including the contents of grouped_layout and masked_m, runs
 * before anything is written. Then the engine (src/engine/grouped.c) runs, or the reference
 * (src/reference/ref_grouped.c) when dg_use_reference() or the engine declines the operands.
 */
#include "core/internal.h"
#include "core/operand.h"
#include "engine/grouped.h"
#include "gemm_grouped_checks.h"
#include "reference/ref_grouped.h"

/*
 * Shared body of the contiguous forms. `b`/`sfb` arrive in the `_nt` orientation ([G, N, K]);
 * `_nn` callers pass transposed views. Names in messages are DeepGEMM's argument names.
 */
static dg_status m_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                              const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *gl,
                              const dg_gemm_options *opts, bool quantized) {
    const dg_gemm_options def = dg_gemm_options_default();
    const dg_gemm_options *o = opts ? opts : &def;
    int ga[2], gb[2];
    DG_TRY(resolve_granularity(o, quantized, sfa, sfb, ga, gb));
    const dg_dtype *types = quantized ? kFp8Fp4Types : kBf16Types;
    const int ntypes = quantized ? 2 : 1;
    dg_operand A, B;
    DG_TRY(dg_operand_init(&A, "a", a, 0, types, ntypes));
    DG_TRY(dg_operand_init(&B, "b", b, 1, types, ntypes));
    DG_TRY(check_k_major(&A, "a"));
    DG_CHECK(A.k == B.k, DG_ERR_SHAPE, "arguments 'a' and 'b' disagree on K (%lld vs %lld)", (long long)A.k,
             (long long)B.k);
    DG_CHECK(B.mn > 0 && B.k > 0 && B.groups > 0, DG_ERR_SHAPE,
             "argument 'b': N, K and the number of groups must be positive (got G=%lld, N=%lld, K=%lld)",
             (long long)B.groups, (long long)B.mn, (long long)B.k);
    DG_TRY(dg_operand_set_scales(&A, "sfa", sfa, ga[0], ga[1]));
    DG_TRY(dg_operand_set_scales(&B, "sfb", sfb, gb[0], gb[1]));
    DG_TRY(check_d(d, 2));
    DG_TRY(dg_check_dim(d, "d", 0, A.mn));
    DG_TRY(dg_check_dim(d, "d", 1, B.mn));
    const bool psum = o->use_psum_layout != 0;
    DG_TRY(check_index_tensor(gl, "grouped_layout", psum ? B.groups : A.mn));
    DG_TRY(check_expected_m_for_psum(o, psum));
    DG_TRY(check_d_disjoint(d, a, sfa, b, sfb, gl, "grouped_layout"));
    const int64_t alignment = dg_get_mk_alignment_for_contiguous_layout();
    const int32_t *layout = (const int32_t *)gl->data;
    if (psum)
        DG_TRY(check_psum_layout(layout, A.mn, B.groups, alignment));
    else
        DG_TRY(check_index_layout(layout, A.mn, B.groups));
    if (A.mn == 0)
        return DG_OK;
    const int zero_padding = o->ensure_zero_padding != 0;
    if (!dg_use_reference()) { /* the engine, unless it declines (then nothing was written) */
        const dg_status st = dg_engine_m_grouped_contiguous(&A, &B, d, layout, psum, alignment, zero_padding);
        if (st != DG_ERR_UNSUPPORTED)
            return st;
    }
    DG_PATH_REFERENCE("these operands' scale blocks");
    dg_ref_m_grouped_contiguous(&A, &B, d, layout, psum, alignment, zero_padding);
    return DG_OK;
}

/* `_nn`: b is [G, K, N]; DeepGEMM transposes b and sfb to the `_nt` orientation. */
static dg_status m_contiguous_nn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                 const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *gl,
                                 const dg_gemm_options *opts, bool quantized) {
    DG_TRY(dg_check_tensor(b, "b", 3));
    const dg_tensor bt = dg_tensor_transpose(*b, 1, 2);
    dg_tensor sfbt;
    if (sfb) {
        DG_TRY(dg_check_tensor(sfb, "sfb", 3));
        sfbt = dg_tensor_transpose(*sfb, 1, 2);
    }
    return m_contiguous(a, sfa, &bt, sfb ? &sfbt : NULL, d, gl, opts, quantized);
}

static dg_status m_masked(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                          const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *masked_m,
                          int expected_m, const dg_gemm_options *opts, bool quantized) {
    const dg_gemm_options def = dg_gemm_options_default();
    const dg_gemm_options *o = opts ? opts : &def;
    DG_TRY(check_masked_options(o));
    int ga[2], gb[2];
    DG_TRY(resolve_granularity(o, quantized, sfa, sfb, ga, gb));
    const dg_dtype *types = quantized ? kFp8Fp4Types : kBf16Types;
    const int ntypes = quantized ? 2 : 1;
    dg_operand A, B;
    DG_TRY(dg_operand_init(&A, "a", a, 1, types, ntypes));
    DG_TRY(dg_operand_init(&B, "b", b, 1, types, ntypes));
    DG_TRY(check_k_major(&A, "a"));
    DG_TRY(check_k_major(&B, "b"));
    DG_CHECK(A.groups == B.groups, DG_ERR_SHAPE,
             "arguments 'a' and 'b' disagree on the number of groups (%lld vs %lld)",
             (long long)A.groups, (long long)B.groups);
    DG_CHECK(A.k == B.k, DG_ERR_SHAPE, "arguments 'a' and 'b' disagree on K (%lld vs %lld)", (long long)A.k,
             (long long)B.k);
    DG_CHECK(A.groups > 0 && A.mn > 0 && A.k > 0, DG_ERR_SHAPE,
             "argument 'a': the number of groups, max_m and K must be positive (got G=%lld, max_m=%lld, K=%lld)",
             (long long)A.groups, (long long)A.mn, (long long)A.k);
    DG_CHECK(B.mn > 0, DG_ERR_SHAPE, "argument 'b': N must be positive (got N=%lld)", (long long)B.mn);
    DG_TRY(check_expected_m(expected_m));
    DG_TRY(dg_operand_set_scales(&A, "sfa", sfa, ga[0], ga[1]));
    DG_TRY(dg_operand_set_scales(&B, "sfb", sfb, gb[0], gb[1]));
    DG_TRY(check_d(d, 3));
    DG_TRY(dg_check_dim(d, "d", 0, A.groups));
    DG_TRY(dg_check_dim(d, "d", 1, A.mn));
    DG_TRY(dg_check_dim(d, "d", 2, B.mn));
    DG_TRY(check_index_tensor(masked_m, "masked_m", A.groups));
    DG_TRY(check_d_disjoint(d, a, sfa, b, sfb, masked_m, "masked_m"));
    const int32_t *mm = (const int32_t *)masked_m->data;
    DG_TRY(check_masked_m_values(mm, A.groups, A.mn));
    if (!dg_use_reference()) {
        const dg_status st = dg_engine_m_grouped_masked(&A, &B, d, mm);
        if (st != DG_ERR_UNSUPPORTED)
            return st;
    }
    DG_PATH_REFERENCE("these operands' scale blocks");
    dg_ref_m_grouped_masked(&A, &B, d, mm);
    return DG_OK;
}

/* ---- public entry points -------------------------------------------------------------------- */

dg_status dg_m_grouped_bf16_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                               const dg_tensor *grouped_layout, const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_bf16_gemm_nt_contiguous");
    return m_contiguous(a, NULL, b, NULL, d, grouped_layout, opts, false);
}

dg_status dg_m_grouped_bf16_gemm_nn_contiguous(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                               const dg_tensor *grouped_layout, const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_bf16_gemm_nn_contiguous");
    return m_contiguous_nn(a, NULL, b, NULL, d, grouped_layout, opts, false);
}

dg_status dg_m_grouped_fp8_fp4_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                                  const dg_tensor *sfb, const dg_tensor *d,
                                                  const dg_tensor *grouped_layout, const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_fp8_fp4_gemm_nt_contiguous");
    return m_contiguous(a, sfa, b, sfb, d, grouped_layout, opts, true);
}

dg_status dg_m_grouped_fp8_fp4_gemm_nn_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                                  const dg_tensor *sfb, const dg_tensor *d,
                                                  const dg_tensor *grouped_layout, const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_fp8_fp4_gemm_nn_contiguous");
    return m_contiguous_nn(a, sfa, b, sfb, d, grouped_layout, opts, true);
}

dg_status dg_m_grouped_fp8_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                              const dg_tensor *sfb, const dg_tensor *d,
                                              const dg_tensor *grouped_layout, const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_fp8_gemm_nt_contiguous");
    return m_contiguous(a, sfa, b, sfb, d, grouped_layout, opts, true);
}

dg_status dg_m_grouped_fp8_gemm_nn_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                              const dg_tensor *sfb, const dg_tensor *d,
                                              const dg_tensor *grouped_layout, const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_fp8_gemm_nn_contiguous");
    return m_contiguous_nn(a, sfa, b, sfb, d, grouped_layout, opts, true);
}

dg_status dg_m_grouped_bf16_gemm_nt_masked(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                           const dg_tensor *masked_m, int expected_m,
                                           const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_bf16_gemm_nt_masked");
    return m_masked(a, NULL, b, NULL, d, masked_m, expected_m, opts, false);
}

dg_status dg_m_grouped_fp8_fp4_gemm_nt_masked(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                              const dg_tensor *sfb, const dg_tensor *d,
                                              const dg_tensor *masked_m, int expected_m,
                                              const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_fp8_fp4_gemm_nt_masked");
    return m_masked(a, sfa, b, sfb, d, masked_m, expected_m, opts, true);
}

dg_status dg_m_grouped_fp8_gemm_nt_masked(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                          const dg_tensor *sfb, const dg_tensor *d,
                                          const dg_tensor *masked_m, int expected_m,
                                          const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_fp8_gemm_nt_masked");
    return m_masked(a, sfa, b, sfb, d, masked_m, expected_m, opts, true);
}
