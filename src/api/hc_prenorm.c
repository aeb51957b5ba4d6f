/* hc_prenorm.c - dg_tf32_hc_prenorm_gemm: argument checks, then the fast kernels
 * (kernels/hc_prenorm.c) or, when dg_use_reference(), the reference (SPEC 6). */
#include "../core/internal.h"
#include "../kernels/hc_prenorm_kernels.h"
#include "../reference/ref_hc.h"

/* A view of `t` with a leading dimension of extent 1 (unsplit outputs as one split). */
static dg_tensor add_leading_dim(const dg_tensor *t) {
    dg_tensor v = *t;
    v.ndim = t->ndim + 1;
    for (int i = t->ndim; i > 0; --i) {
        v.shape[i] = t->shape[i - 1];
        v.strides[i] = t->strides[i - 1];
    }
    v.shape[0] = 1;
    v.strides[0] = 0;
    return v;
}

static dg_status check_outputs(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                               const dg_tensor *s, int num_splits) {
    const bool split = num_splits > 0;
    const int64_t m = a->shape[0], n = b->shape[0];
    DG_TRY(dg_check_tensor_dtype(d, "d", split ? 3 : 2, DG_FLOAT32));
    DG_TRY(dg_check_tensor_dtype(s, "sqr_sum", split ? 2 : 1, DG_FLOAT32));
    if (split) {
        DG_TRY(dg_check_dim(d, "d", 0, num_splits));
        DG_TRY(dg_check_dim(s, "sqr_sum", 0, num_splits));
    }
    DG_TRY(dg_check_dim(d, "d", d->ndim - 2, m));
    DG_TRY(dg_check_dim(d, "d", d->ndim - 1, n));
    DG_TRY(dg_check_dim(s, "sqr_sum", s->ndim - 1, m));
    /* DeepGEMM: D is N-major, the squared sums contiguous. */
    DG_TRY(dg_check_last_dim_contiguous(d, "d"));
    if (dg_tensor_numel(s) > 0) /* empty tensors have no layout to check */
        DG_TRY(dg_check_contiguous(s, "sqr_sum"));
    DG_TRY(dg_check_output(d, "d"));
    DG_TRY(dg_check_no_overlap(d, "d", a, "a", false));
    DG_TRY(dg_check_no_overlap(d, "d", b, "b", false));
    DG_TRY(dg_check_no_overlap(s, "sqr_sum", a, "a", false));
    DG_TRY(dg_check_no_overlap(s, "sqr_sum", b, "b", false));
    DG_TRY(dg_check_no_overlap(s, "sqr_sum", d, "d", false));
    return DG_OK;
}

dg_status dg_tf32_hc_prenorm_gemm(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                  const dg_tensor *sqr_sum, int num_splits) {
    dg_api_begin("dg_tf32_hc_prenorm_gemm");
    DG_TRY(dg_check_tensor_dtype(a, "a", 2, DG_BFLOAT16));
    DG_TRY(dg_check_tensor_dtype(b, "b", 2, DG_FLOAT32));
    /* DeepGEMM: A and B are K-major. */
    DG_TRY(dg_check_last_dim_contiguous(a, "a"));
    DG_TRY(dg_check_last_dim_contiguous(b, "b"));
    DG_TRY(dg_check_dim(b, "b", 1, a->shape[1]));
    DG_CHECK(b->shape[0] > 0, DG_ERR_SHAPE, "argument 'b': N must be positive (got %lld)",
             (long long)b->shape[0]);
    DG_CHECK(a->shape[1] > 0, DG_ERR_SHAPE, "argument 'a': K must be positive (got %lld)",
             (long long)a->shape[1]);
    DG_TRY(check_outputs(a, b, d, sqr_sum, num_splits));
    if (a->shape[0] == 0)
        return DG_OK;
    /* Both backends take [S, M, N] / [S, M] outputs; an unsplit call is one split. */
    const dg_tensor d3 = num_splits > 0 ? *d : add_leading_dim(d);
    const dg_tensor s2 = num_splits > 0 ? *sqr_sum : add_leading_dim(sqr_sum);
    const int splits = num_splits > 0 ? num_splits : 1;
    if (!dg_use_reference())
        return dg_hc_prenorm_fast(a, b, &d3, &s2, splits);
    DG_PATH_REFERENCE("");
    dg_ref_hc_prenorm(a, b, &d3, &s2, splits);
    return DG_OK;
}
