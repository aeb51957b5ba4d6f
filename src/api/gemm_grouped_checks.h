/*
 * gemm_grouped_checks.h - argument checks shared by the m-grouped GEMMs (gemm_m_grouped.c) and
 * their pre-packed forms (gemm_grouped_packed.c): the same rules, the same messages.
 */
#ifndef DG_API_GEMM_GROUPED_CHECKS_H
#define DG_API_GEMM_GROUPED_CHECKS_H

#include "core/internal.h"
#include "core/operand.h"

static const dg_dtype kBf16Types[1] = {DG_BFLOAT16};
static const dg_dtype kFp8Fp4Types[2] = {DG_FLOAT8_E4M3, DG_FP4_E2M1X2};
static const dg_dtype kOutTypes[2] = {DG_BFLOAT16, DG_FLOAT32};

static inline bool any_nonzero(const int *v, int n) {
    for (int i = 0; i < n; ++i)
        if (v[i])
            return true;
    return false;
}

/* Granularities for FP8/FP4 (DeepGEMM's recipe rules), or a check that BF16 calls got none. */
static inline dg_status resolve_granularity(const dg_gemm_options *o, bool quantized, const dg_tensor *sfa,
                                            const dg_tensor *sfb, int ga[2], int gb[2]) {
    if (quantized)
        return dg_resolve_recipe(o, sfa, sfb, ga, gb); /* which also rejects alpha */
    DG_TRY(dg_check_alpha(o, false));
    DG_CHECK(!any_nonzero(o->recipe, 3) && !any_nonzero(o->recipe_a, 2) && !any_nonzero(o->recipe_b, 2),
             DG_ERR_VALUE, "arguments 'recipe', 'recipe_a' and 'recipe_b' must not be given to BF16 GEMMs");
    ga[0] = ga[1] = gb[0] = gb[1] = 1;
    return DG_OK;
}

/* DeepGEMM requires K-major operands here: unit stride along K (packed FP4: pairs along K). */
static inline dg_status check_k_major(const dg_operand *op, const char *name) {
    const dg_tensor *t = op->data;
    const int kd = t->ndim - 1;
    const bool ok = op->fp4_dim >= 0 ? op->fp4_dim == kd : (t->strides[kd] == 1 || t->shape[kd] <= 1);
    DG_CHECK(ok, DG_ERR_LAYOUT, "argument '%s' must be K-major (unit stride along K), strides are (%lld, %lld)",
             name, (long long)t->strides[kd - 1], (long long)t->strides[kd]);
    return DG_OK;
}

/* The N-major output D of `ndim` dimensions, BF16 or FLOAT32. */
static inline dg_status check_d(const dg_tensor *d, int ndim) {
    DG_TRY(dg_check_tensor(d, "d", ndim));
    DG_TRY(dg_check_dtype_in(d, "d", kOutTypes, 2));
    DG_TRY(dg_check_last_dim_contiguous(d, "d"));
    return dg_check_output(d, "d");
}

/* Masked forms take no psum layout (DeepGEMM's keyword arguments of the contiguous form). */
static inline dg_status check_masked_options(const dg_gemm_options *o) {
    DG_CHECK(!o->use_psum_layout, DG_ERR_VALUE,
             "argument 'use_psum_layout' is not taken by masked GEMMs (use the contiguous form)");
    DG_CHECK(o->expected_m_for_psum_layout <= 0, DG_ERR_VALUE,
             "argument 'expected_m_for_psum_layout' is not taken by masked GEMMs (use the contiguous form)");
    return DG_OK;
}

/* expected_m is a positive hint; every masked_m entry lies in [0, max_m]. */
static inline dg_status check_expected_m(int expected_m) {
    DG_CHECK(expected_m > 0, DG_ERR_VALUE, "argument 'expected_m' must be positive, got %d", expected_m);
    return DG_OK;
}
static inline dg_status check_masked_m_values(const int32_t *mm, int64_t groups, int64_t max_m) {
    for (int64_t g = 0; g < groups; ++g)
        DG_CHECK(mm[g] >= 0 && mm[g] <= max_m, DG_ERR_VALUE,
                 "argument 'masked_m': entry %lld (%d) is outside [0, max_m = %lld]", (long long)g, (int)mm[g],
                 (long long)max_m);
    return DG_OK;
}

/* The contiguous forms take expected_m_for_psum_layout only with use_psum_layout. */
static inline dg_status check_expected_m_for_psum(const dg_gemm_options *o, bool psum) {
    DG_CHECK(psum || o->expected_m_for_psum_layout <= 0, DG_ERR_VALUE,
             "argument 'expected_m_for_psum_layout' is only meaningful with use_psum_layout");
    return DG_OK;
}

/* A 1-D contiguous INT32 index tensor of `len` entries. */
static inline dg_status check_index_tensor(const dg_tensor *t, const char *name, int64_t len) {
    DG_TRY(dg_check_tensor_dtype(t, name, 1, DG_INT32));
    DG_TRY(dg_check_contiguous(t, name));
    return dg_check_dim(t, name, 0, len);
}

static inline dg_status check_d_disjoint(const dg_tensor *d, const dg_tensor *a, const dg_tensor *sfa,
                                         const dg_tensor *b, const dg_tensor *sfb, const dg_tensor *idx,
                                         const char *idx_name) {
    DG_TRY(dg_check_no_overlap(d, "d", a, "a", false));
    DG_TRY(dg_check_no_overlap(d, "d", sfa, "sfa", false));
    DG_TRY(dg_check_no_overlap(d, "d", b, "b", false));
    DG_TRY(dg_check_no_overlap(d, "d", sfb, "sfb", false));
    return dg_check_no_overlap(d, "d", idx, idx_name, false);
}

/* Index form: every entry is a group id or -1. */
static inline dg_status check_index_layout(const int32_t *gl, int64_t m, int64_t groups) {
    for (int64_t r = 0; r < m; ++r)
        DG_CHECK(gl[r] >= -1 && gl[r] < groups, DG_ERR_VALUE,
                 "argument 'grouped_layout': entry %lld (%d) is neither a group index in [0, %lld) nor -1 (padding)",
                 (long long)r, (int)gl[r], (long long)groups);
    return DG_OK;
}

/* Psum form: group g covers [align(end[g-1], alignment), end[g]) and must fit in M rows. */
static inline dg_status check_psum_layout(const int32_t *gl, int64_t m, int64_t groups, int64_t alignment) {
    int64_t start = 0;
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t end = gl[g];
        DG_CHECK(end >= start, DG_ERR_VALUE,
                 "argument 'grouped_layout': entry %lld (%lld, a psum end row) is before the group's start "
                 "row %lld (the previous end aligned to %lld)",
                 (long long)g, (long long)end, (long long)start, (long long)alignment);
        DG_CHECK(end <= m, DG_ERR_VALUE,
                 "argument 'grouped_layout': entry %lld (%lld, a psum end row) exceeds M = %lld",
                 (long long)g, (long long)end, (long long)m);
        start = dg_align(end, alignment);
    }
    return DG_OK;
}

#endif /* DG_API_GEMM_GROUPED_CHECKS_H */
