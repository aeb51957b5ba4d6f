/* check.c - argument checks shared by every entry point; each records a message naming the
 * argument and returns a status (see internal.h). */
#include "internal.h"

#include <string.h>

dg_status dg_check_tensor(const dg_tensor *t, const char *name, int ndim) {
    DG_CHECK(t != NULL, DG_ERR_NULL_POINTER, "argument '%s' is NULL", name);
    DG_CHECK((unsigned)t->dtype < DG_DTYPE_COUNT, DG_ERR_DTYPE, "argument '%s' has an invalid dtype (%d)",
             name, (int)t->dtype);
    DG_CHECK(t->ndim >= 0 && t->ndim <= DG_MAX_DIMS, DG_ERR_SHAPE,
             "argument '%s' has an invalid number of dimensions (%d)", name, t->ndim);
    DG_CHECK(ndim < 0 || t->ndim == ndim, DG_ERR_SHAPE, "argument '%s' must have %d dimensions, got %d",
             name, ndim, t->ndim);
    for (int i = 0; i < t->ndim; ++i) {
        DG_CHECK(t->shape[i] >= 0, DG_ERR_SHAPE, "argument '%s' has a negative extent %lld in dimension %d",
                 name, (long long)t->shape[i], i);
        DG_CHECK(t->strides[i] >= 0, DG_ERR_LAYOUT,
                 "argument '%s' has a negative stride %lld in dimension %d", name,
                 (long long)t->strides[i], i);
    }
    int64_t lo, hi;
    DG_CHECK(dg_tensor_span(t, &lo, &hi) && dg_tensor_numel(t) >= 0, DG_ERR_OVERFLOW,
             "argument '%s': the size of its memory span overflows", name);
    DG_CHECK(hi - lo <= DG_MAX_SPAN_BYTES, DG_ERR_OVERFLOW,
             "argument '%s' spans %lld bytes, more than any process can address (2^56)", name,
             (long long)(hi - lo));
    DG_CHECK(t->data != NULL || hi == lo, DG_ERR_NULL_POINTER, "argument '%s' has NULL data", name);
    /* Kernels load elements as their C types: a pointer off their alignment is undefined
     * behaviour (found by tests/fuzz; PyTorch's tensors are always aligned). */
    DG_CHECK(t->data == NULL || (uintptr_t)t->data % dg_dtype_size(t->dtype) == 0, DG_ERR_LAYOUT,
             "argument '%s': data %p is not aligned to its %d-byte %s elements", name, t->data,
             (int)dg_dtype_size(t->dtype), dg_dtype_name(t->dtype));
    return DG_OK;
}

dg_status dg_check_result_span(const dg_tensor *want, const char *name) {
    int64_t lo, hi;
    DG_CHECK(dg_tensor_span(want, &lo, &hi), DG_ERR_OVERFLOW,
             "argument '%s': the size of the result overflows", name);
    DG_CHECK(hi - lo <= DG_MAX_SPAN_BYTES, DG_ERR_OVERFLOW,
             "argument '%s': the result would span %lld bytes, more than any process can address (2^56)",
             name, (long long)(hi - lo));
    return DG_OK;
}

dg_status dg_check_logical_size(const dg_tensor *t, const char *name) {
    int64_t n = 1;
    bool ok = true;
    for (int i = 0; i < t->ndim && ok; ++i)
        ok = dg_mul_ok(n, t->shape[i], &n);
    ok = ok && dg_mul_ok(n, (int64_t)dg_dtype_size(t->dtype), &n);
    DG_CHECK(ok && n <= DG_MAX_SPAN_BYTES, DG_ERR_OVERFLOW,
             "argument '%s': its elements would fill more than 2^56 bytes stored densely (a broadcast view "
             "this large cannot be reduced in any reasonable time)", name);
    return DG_OK;
}

dg_status dg_check_tensor_dtype(const dg_tensor *t, const char *name, int ndim, dg_dtype want) {
    DG_TRY(dg_check_tensor(t, name, ndim));
    DG_CHECK(t->dtype == want, DG_ERR_DTYPE, "argument '%s' must be %s, got %s", name, dg_dtype_name(want),
             dg_dtype_name(t->dtype));
    return DG_OK;
}

dg_status dg_check_dtype_in(const dg_tensor *t, const char *name, const dg_dtype *allowed, int count) {
    for (int i = 0; i < count; ++i)
        if (t->dtype == allowed[i])
            return DG_OK;
    char list[256] = "";
    for (int i = 0; i < count; ++i) {
        if (i)
            strncat(list, " or ", sizeof list - strlen(list) - 1);
        strncat(list, dg_dtype_name(allowed[i]), sizeof list - strlen(list) - 1);
    }
    return dg_fail(DG_ERR_DTYPE, "argument '%s' must be %s, got %s", name, list, dg_dtype_name(t->dtype));
}

dg_status dg_check_dim(const dg_tensor *t, const char *name, int dim, int64_t want) {
    DG_CHECK(dim >= 0 && dim < t->ndim, DG_ERR_SHAPE, "argument '%s' has no dimension %d", name, dim);
    DG_CHECK(t->shape[dim] == want, DG_ERR_SHAPE, "argument '%s': dimension %d must be %lld, got %lld", name,
             dim, (long long)want, (long long)t->shape[dim]);
    return DG_OK;
}

dg_status dg_check_contiguous(const dg_tensor *t, const char *name) {
    DG_CHECK(dg_tensor_is_contiguous(t), DG_ERR_LAYOUT, "argument '%s' must be contiguous (row-major)", name);
    return DG_OK;
}

dg_status dg_check_last_dim_contiguous(const dg_tensor *t, const char *name) {
    DG_CHECK(t->ndim == 0 || t->strides[t->ndim - 1] == 1 || t->shape[t->ndim - 1] <= 1, DG_ERR_LAYOUT,
             "argument '%s' must have unit stride in its last dimension (got %lld)", name,
             (long long)(t->ndim ? t->strides[t->ndim - 1] : 0));
    return DG_OK;
}

bool dg_tensors_same_view(const dg_tensor *a, const dg_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; ++i)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->strides[i] != b->strides[i]))
            return false;
    return true;
}

dg_status dg_check_no_overlap(const dg_tensor *out, const char *out_name, const dg_tensor *in,
                              const char *in_name, bool allow_same) {
    if (!out || !in)
        return DG_OK;
    if (allow_same && dg_tensors_same_view(out, in))
        return DG_OK;
    int64_t olo, ohi, ilo, ihi;
    if (!dg_tensor_span(out, &olo, &ohi) || !dg_tensor_span(in, &ilo, &ihi) || olo == ohi || ilo == ihi)
        return DG_OK;
    const char *o0 = (const char *)out->data + olo, *o1 = (const char *)out->data + ohi;
    const char *i0 = (const char *)in->data + ilo, *i1 = (const char *)in->data + ihi;
    DG_CHECK(o1 <= i0 || i1 <= o0, DG_ERR_LAYOUT, "output '%s' overlaps input '%s'%s", out_name, in_name,
             allow_same ? " (only an identical view is allowed)" : "");
    return DG_OK;
}

dg_status dg_check_output(const dg_tensor *t, const char *name) {
    /* Sort the dimensions with extent > 1 by stride; each must step past the span of all
     * smaller-stride ones (last element + 1), which rules out any element being addressed twice
     * (a strided row sample of a [S, M, N] output is fine: its rows end before the next slab). */
    for (int i = 0; i < t->ndim; ++i)
        if (t->shape[i] == 0) /* no element, none addressed twice (other extents may be huge) */
            return DG_OK;
    int idx[DG_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; ++i)
        if (t->shape[i] > 1)
            idx[n++] = i;
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && t->strides[idx[j]] < t->strides[idx[j - 1]]; --j) {
            const int s = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = s;
        }
    int64_t need = 1;
    for (int i = 0; i < n; ++i) {
        const int d = idx[i];
        DG_CHECK(t->strides[d] >= need, DG_ERR_LAYOUT,
                 "output '%s' has overlapping elements (dimension %d, stride %lld)", name, d,
                 (long long)t->strides[d]);
        int64_t step;
        DG_CHECK(dg_mul_ok(t->strides[d], t->shape[d] - 1, &step) && !__builtin_add_overflow(need, step, &need),
                 DG_ERR_OVERFLOW, "output '%s': the size of its memory span overflows (dimension %d)", name, d);
    }
    return DG_OK;
}

dg_status dg_check_c_like_d(const dg_tensor *c, const dg_tensor *d) {
    if (!c)
        return DG_OK;
    DG_TRY(dg_check_tensor(c, "c", 2));
    DG_CHECK(c->dtype == d->dtype, DG_ERR_DTYPE, "argument 'c' must have the dtype of 'd' (%s), got %s",
             dg_dtype_name(d->dtype), dg_dtype_name(c->dtype));
    DG_TRY(dg_check_dim(c, "c", 0, d->shape[0]));
    DG_TRY(dg_check_dim(c, "c", 1, d->shape[1]));
    DG_TRY(dg_check_last_dim_contiguous(c, "c"));
    return dg_check_no_overlap(d, "d", c, "c", true);
}
