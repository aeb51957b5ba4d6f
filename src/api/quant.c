/*
 * quant.c - entry points of the quantization helpers (deep_gemm.utils, SPEC 2): argument
 * checks, the query form, then the reference in src/reference/ref_quant.c.
 */
#include "../reference/ref_quant.h"
#include "quant_args.h"

/* Query, then checks, of a 2-D data output and a 2-D scale output; *query is set when the
 * call only filled in descriptors. */
static dg_status prepare_outputs(const dg_tensor *x, dg_tensor *out, dg_dtype out_dtype, const int64_t out_shape[2],
                                 dg_tensor *out_sf, dg_dtype sf_dtype, const int64_t sf_shape[2], bool *query) {
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    DG_CHECK(out_sf != NULL, DG_ERR_NULL_POINTER, "argument 'out_sf' is NULL");
    const bool q_out = qa_query(out, out_dtype, 2, out_shape);
    const bool q_sf = qa_query(out_sf, sf_dtype, 2, sf_shape);
    *query = q_out || q_sf;
    if (*query)
        return DG_OK;
    if (out_dtype == DG_FP4_E2M1X2) {
        static const dg_dtype kFp4[2] = {DG_FP4_E2M1X2, DG_INT8};
        DG_TRY(dg_check_tensor(out, "out", 2));
        DG_TRY(dg_check_dtype_in(out, "out", kFp4, 2));
        DG_TRY(qa_check_output(out, "out", out->dtype, 2, out_shape));
        DG_TRY(dg_check_last_dim_contiguous(out, "out"));
    } else {
        DG_TRY(qa_check_output(out, "out", out_dtype, 2, out_shape));
    }
    DG_TRY(qa_check_output(out_sf, "out_sf", sf_dtype, 2, sf_shape));
    DG_TRY(dg_check_no_overlap(out, "out", x, "x", false));
    DG_TRY(dg_check_no_overlap(out_sf, "out_sf", x, "x", false));
    return dg_check_no_overlap(out_sf, "out_sf", out, "out", false);
}

dg_status dg_per_token_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, int use_packed_ue8m0,
                                   dg_tensor *out, dg_tensor *out_sf) {
    dg_api_begin("dg_per_token_cast_to_fp8");
    DG_TRY(qa_check_real_input(x, "x", 2));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], k = x->shape[1], s = qa_ceil_div(k, gran_k);
    if (use_packed_ue8m0) {
        DG_CHECK(use_ue8m0, DG_ERR_VALUE,
                 "argument 'use_packed_ue8m0' needs use_ue8m0 (only powers of two can be packed)");
        DG_CHECK(s % 4 == 0, DG_ERR_SHAPE,
                 "argument 'use_packed_ue8m0': scales per row (ceil(K/gran_k) = %lld) must be a multiple of 4",
                 (long long)s);
    }
    const int64_t shape[2] = {m, k}, sf_shape[2] = {m, use_packed_ue8m0 ? s / 4 : s};
    bool query;
    DG_TRY(prepare_outputs(x, out, DG_FLOAT8_E4M3, shape, out_sf, use_packed_ue8m0 ? DG_INT32 : DG_FLOAT32,
                           sf_shape, &query));
    if (query)
        return DG_OK;
    return ref_quant_fp8_blocks(x, 1, gran_k, use_ue8m0 != 0, use_packed_ue8m0 != 0, out, out_sf);
}

dg_status dg_per_block_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, dg_tensor *out,
                                   dg_tensor *out_sf) {
    dg_api_begin("dg_per_block_cast_to_fp8");
    DG_TRY(qa_check_real_input(x, "x", 2));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], k = x->shape[1];
    const int64_t shape[2] = {m, k}, sf_shape[2] = {qa_ceil_div(m, gran_k), qa_ceil_div(k, gran_k)};
    bool query;
    DG_TRY(prepare_outputs(x, out, DG_FLOAT8_E4M3, shape, out_sf, DG_FLOAT32, sf_shape, &query));
    if (query)
        return DG_OK;
    return ref_quant_fp8_blocks(x, gran_k, gran_k, use_ue8m0 != 0, false, out, out_sf);
}

dg_status dg_per_channel_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, dg_tensor *out,
                                     dg_tensor *out_sf) {
    dg_api_begin("dg_per_channel_cast_to_fp8");
    DG_TRY(qa_check_real_input(x, "x", 2));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], n = x->shape[1];
    DG_CHECK(m % gran_k == 0, DG_ERR_SHAPE, "argument 'x': rows (%lld) must be a multiple of gran_k (%d)",
             (long long)m, gran_k);
    const int64_t shape[2] = {m, n}, sf_shape[2] = {m / gran_k, n};
    bool query;
    DG_TRY(prepare_outputs(x, out, DG_FLOAT8_E4M3, shape, out_sf, DG_FLOAT32, sf_shape, &query));
    if (query)
        return DG_OK;
    return ref_quant_fp8_blocks(x, gran_k, 1, use_ue8m0 != 0, false, out, out_sf);
}

dg_status dg_per_token_cast_to_fp4(const dg_tensor *x, int use_ue8m0, int gran_k, int use_packed_ue8m0,
                                   dg_tensor *out, dg_tensor *out_sf) {
    dg_api_begin("dg_per_token_cast_to_fp4");
    DG_TRY(qa_check_real_input(x, "x", 2));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], k = x->shape[1], s = qa_ceil_div(k, gran_k);
    DG_CHECK(k % 2 == 0, DG_ERR_SHAPE, "argument 'x': K (%lld) must be even to pack FP4 pairs", (long long)k);
    DG_CHECK((s % 2 == 0) || (gran_k % 2 == 0), DG_ERR_VALUE,
             "argument 'gran_k' (%d): K padded to a multiple of it (%lld) must be even", gran_k,
             (long long)(s * gran_k));
    DG_CHECK(!use_packed_ue8m0 || use_ue8m0, DG_ERR_VALUE,
             "argument 'use_packed_ue8m0' needs use_ue8m0 (only powers of two can be packed)");
    const int64_t shape[2] = {m, k / 2}, sf_shape[2] = {m, use_packed_ue8m0 ? qa_ceil_div(s, 4) : s};
    bool query;
    DG_TRY(prepare_outputs(x, out, DG_FP4_E2M1X2, shape, out_sf, use_packed_ue8m0 ? DG_INT32 : DG_FLOAT32,
                           sf_shape, &query));
    if (query)
        return DG_OK;
    return ref_quant_fp4_token(x, gran_k, use_ue8m0 != 0, use_packed_ue8m0 != 0, out, out_sf);
}

/* Which dimensions keep their own scale; none kept means one scale for the whole tensor (torch's
 * amax over an empty dim list reduces everything, so listing every dimension does the same). */
static dg_status custom_dims_keep(const dg_tensor *x, const int *dims, int num_dims, bool keep[DG_MAX_DIMS]) {
    DG_CHECK(num_dims >= 0, DG_ERR_VALUE, "argument 'num_dims' must be >= 0, got %d", num_dims);
    DG_CHECK(num_dims == 0 || dims != NULL, DG_ERR_NULL_POINTER, "argument 'dims' is NULL");
    for (int d = 0; d < DG_MAX_DIMS; ++d)
        keep[d] = false;
    for (int i = 0; i < num_dims; ++i) {
        DG_CHECK(dims[i] >= 0 && dims[i] < x->ndim, DG_ERR_VALUE,
                 "argument 'dims': entry %d (%d) is not a dimension of x (ndim %d)", i, dims[i], x->ndim);
        DG_CHECK(!keep[dims[i]], DG_ERR_VALUE, "argument 'dims': dimension %d is listed twice", dims[i]);
        keep[dims[i]] = true;
    }
    if (num_dims == x->ndim)
        for (int d = 0; d < DG_MAX_DIMS; ++d)
            keep[d] = false;
    /* torch refuses to reduce over an empty dimension of an empty tensor. */
    for (int d = 0; d < x->ndim; ++d)
        DG_CHECK(keep[d] || x->shape[d] != 0, DG_ERR_SHAPE,
                 "argument 'x': dimension %d is empty and not in 'dims', so its amax is undefined", d);
    return DG_OK;
}

dg_status dg_per_custom_dims_cast_to_fp8(const dg_tensor *x, const int *dims, int num_dims, int use_ue8m0,
                                         dg_tensor *out, dg_tensor *out_sf) {
    dg_api_begin("dg_per_custom_dims_cast_to_fp8");
    DG_TRY(qa_check_real_input(x, "x", -1));
    bool keep[DG_MAX_DIMS];
    DG_TRY(custom_dims_keep(x, dims, num_dims, keep));
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    DG_CHECK(out_sf != NULL, DG_ERR_NULL_POINTER, "argument 'out_sf' is NULL");
    int64_t sf_shape[DG_MAX_DIMS];
    int sf_ndim = 0;
    for (int d = 0; d < x->ndim; ++d)
        if (keep[d] && x->shape[d] != 1) /* DeepGEMM returns sf.squeeze() */
            sf_shape[sf_ndim++] = x->shape[d];
    const bool q_out = qa_query(out, DG_FLOAT8_E4M3, x->ndim, x->shape);
    const bool q_sf = qa_query(out_sf, DG_FLOAT32, sf_ndim, sf_shape);
    if (q_out || q_sf)
        return DG_OK;
    DG_TRY(qa_check_output(out, "out", DG_FLOAT8_E4M3, x->ndim, x->shape));
    DG_TRY(qa_check_output(out_sf, "out_sf", DG_FLOAT32, sf_ndim, sf_shape));
    DG_TRY(dg_check_no_overlap(out, "out", x, "x", false));
    DG_TRY(dg_check_no_overlap(out_sf, "out_sf", x, "x", false));
    DG_TRY(dg_check_no_overlap(out_sf, "out_sf", out, "out", false));
    return ref_quant_fp8_custom_dims(x, keep, use_ue8m0 != 0, out, out_sf);
}

dg_status dg_cast_back_from_fp4(const dg_tensor *packed, const dg_tensor *sf, int gran_k, int use_packed_ue8m0,
                                dg_tensor *out) {
    dg_api_begin("dg_cast_back_from_fp4");
    DG_TRY(qa_check_fp4(packed, "packed"));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = packed->shape[0], n = packed->shape[1] * 2, s = qa_ceil_div(n, gran_k);
    DG_TRY(dg_check_tensor_dtype(sf, "sf", 2, use_packed_ue8m0 ? DG_INT32 : DG_FLOAT32));
    DG_TRY(dg_check_dim(sf, "sf", 0, m));
    const int64_t sf_cols = use_packed_ue8m0 ? qa_ceil_div(s, 4) : s;
    DG_CHECK(sf->shape[1] >= sf_cols, DG_ERR_SHAPE,
             "argument 'sf' has %lld columns, fewer than the %lld that N = %lld and gran_k = %d need",
             (long long)sf->shape[1], (long long)sf_cols, (long long)n, gran_k);
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    const int64_t shape[2] = {m, n};
    if (qa_query(out, DG_FLOAT32, 2, shape))
        return DG_OK;
    static const dg_dtype kOut[2] = {DG_FLOAT32, DG_BFLOAT16};
    DG_TRY(dg_check_tensor(out, "out", 2));
    DG_TRY(dg_check_dtype_in(out, "out", kOut, 2));
    DG_TRY(qa_check_output(out, "out", out->dtype, 2, shape));
    DG_TRY(dg_check_no_overlap(out, "out", packed, "packed", false));
    DG_TRY(dg_check_no_overlap(out, "out", sf, "sf", false));
    ref_cast_back_from_fp4(packed, sf, gran_k, use_packed_ue8m0 != 0, out);
    return DG_OK;
}
