/*
 * formats.c - entry points for bulk conversion and the format utilities of deep_gemm.utils
 * (SPEC 1-2): dg_cast, UE8M0 packing, FP4 transposition, ceil_to_ue8m0 and calc_diff.
 */
#include "../formats/convert.h"
#include "../reference/ref_quant.h"
#include "quant_args.h"

#include <string.h>

static dg_status check_same_shape(const dg_tensor *a, const char *an, const dg_tensor *b, const char *bn) {
    DG_CHECK(a->ndim == b->ndim, DG_ERR_SHAPE, "argument '%s' has %d dimensions but '%s' has %d", bn, b->ndim, an,
             a->ndim);
    for (int i = 0; i < a->ndim; ++i)
        DG_CHECK(a->shape[i] == b->shape[i], DG_ERR_SHAPE,
                 "argument '%s': dimension %d is %lld but '%s' has %lld", bn, i, (long long)b->shape[i], an,
                 (long long)a->shape[i]);
    return DG_OK;
}

dg_status dg_cast(const dg_tensor *src, const dg_tensor *dst) {
    dg_api_begin("dg_cast");
    static const dg_dtype kTypes[3] = {DG_FLOAT32, DG_BFLOAT16, DG_FLOAT8_E4M3};
    DG_TRY(dg_check_tensor(src, "src", -1));
    DG_TRY(dg_check_dtype_in(src, "src", kTypes, 3));
    DG_TRY(dg_check_tensor(dst, "dst", -1));
    DG_TRY(dg_check_dtype_in(dst, "dst", kTypes, 3));
    DG_TRY(check_same_shape(src, "src", dst, "dst"));
    DG_TRY(dg_check_output(dst, "dst"));
    if (dg_tensors_same_view(src, dst))
        return DG_OK; /* same dtype, same elements: a copy onto itself */
    DG_TRY(dg_check_no_overlap(dst, "dst", src, "src", false));
    dg_convert_tensor(src, dst);
    return DG_OK;
}

dg_status dg_ceil_to_ue8m0_tensor(const dg_tensor *x, const dg_tensor *out) {
    dg_api_begin("dg_ceil_to_ue8m0_tensor");
    DG_TRY(qa_check_real_input(x, "x", -1));
    DG_TRY(dg_check_tensor_dtype(out, "out", -1, DG_FLOAT32));
    DG_TRY(check_same_shape(x, "x", out, "out"));
    DG_TRY(dg_check_output(out, "out"));
    DG_TRY(dg_check_no_overlap(out, "out", x, "x", true));
    ref_ceil_to_ue8m0(x, out);
    return DG_OK;
}

/* DeepGEMM's pack assertion: every value viewed as int32 is >= 0 with no mantissa bits. */
static dg_status check_packable(const dg_tensor *x) {
    const int64_t n = dg_tensor_numel(x);
    int64_t idx[DG_MAX_DIMS] = {0};
    for (int64_t e = 0; e < n; ++e, dg_index_next(idx, x->shape, x->ndim)) {
        uint32_t bits;
        memcpy(&bits, dg_elem_ptr(x, idx), 4);
        DG_CHECK((bits & 0x807fffffu) == 0, DG_ERR_VALUE,
                 "argument 'x': element %lld (bits 0x%08x) is not a non-negative power of two (UE8M0)",
                 (long long)e, (unsigned)bits);
    }
    return DG_OK;
}

dg_status dg_pack_ue8m0_to_int(const dg_tensor *x, dg_tensor *out) {
    dg_api_begin("dg_pack_ue8m0_to_int");
    DG_TRY(dg_check_tensor_dtype(x, "x", -1, DG_FLOAT32));
    DG_CHECK(x->ndim >= 1, DG_ERR_SHAPE, "argument 'x' must have at least 1 dimension");
    const int nd = x->ndim;
    DG_CHECK(x->shape[nd - 1] % 4 == 0, DG_ERR_SHAPE, "argument 'x': the last dimension (%lld) must be a multiple of 4",
             (long long)x->shape[nd - 1]);
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    int64_t shape[DG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[nd - 1] /= 4;
    if (qa_query(out, DG_INT32, nd, shape))
        return DG_OK;
    DG_TRY(qa_check_output(out, "out", DG_INT32, nd, shape));
    DG_TRY(dg_check_no_overlap(out, "out", x, "x", false));
    DG_TRY(check_packable(x));
    ref_pack_ue8m0(x, out);
    return DG_OK;
}

dg_status dg_unpack_ue8m0_from_int(const dg_tensor *packed_sf, dg_tensor *out) {
    dg_api_begin("dg_unpack_ue8m0_from_int");
    DG_TRY(dg_check_tensor_dtype(packed_sf, "packed_sf", -1, DG_INT32));
    DG_CHECK(packed_sf->ndim >= 1, DG_ERR_SHAPE, "argument 'packed_sf' must have at least 1 dimension");
    const int nd = packed_sf->ndim;
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    int64_t shape[DG_MAX_DIMS];
    memcpy(shape, packed_sf->shape, sizeof shape);
    DG_CHECK(dg_mul_ok(shape[nd - 1], 4, &shape[nd - 1]), DG_ERR_OVERFLOW,
             "argument 'packed_sf': 4x its last dimension overflows");
    if (qa_query(out, DG_FLOAT32, nd, shape))
        return DG_OK;
    DG_TRY(qa_check_output(out, "out", DG_FLOAT32, nd, shape));
    DG_TRY(dg_check_no_overlap(out, "out", packed_sf, "packed_sf", false));
    ref_unpack_ue8m0(packed_sf, out);
    return DG_OK;
}

dg_status dg_transpose_packed_fp4(const dg_tensor *a, dg_tensor *out) {
    dg_api_begin("dg_transpose_packed_fp4");
    DG_TRY(qa_check_fp4(a, "a"));
    const int64_t m = a->shape[0];
    int64_t n;
    DG_CHECK(m % 2 == 0, DG_ERR_SHAPE, "argument 'a': rows (%lld) must be even", (long long)m);
    DG_CHECK(dg_mul_ok(a->shape[1], 2, &n), DG_ERR_OVERFLOW, "argument 'a': 2x its columns overflows");
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    const int64_t shape[2] = {n, m / 2};
    if (qa_query(out, a->dtype, 2, shape))
        return DG_OK;
    DG_TRY(qa_check_fp4(out, "out"));
    DG_TRY(qa_check_output(out, "out", out->dtype, 2, shape));
    DG_TRY(dg_check_no_overlap(out, "out", a, "a", false));
    ref_transpose_packed_fp4(a, out);
    return DG_OK;
}

dg_status dg_calc_diff(const dg_tensor *x, const dg_tensor *y, double *out) {
    dg_api_begin("dg_calc_diff");
    DG_TRY(qa_check_real_input(x, "x", -1));
    DG_TRY(qa_check_real_input(y, "y", -1));
    DG_TRY(check_same_shape(x, "x", y, "y"));
    DG_TRY(dg_check_logical_size(x, "x"));
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    *out = ref_calc_diff(x, y);
    return DG_OK;
}
