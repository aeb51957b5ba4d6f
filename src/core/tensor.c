/* tensor.c - tensor descriptors: constructors, sizes, and element loads/stores. */
#include "internal.h"

#include <string.h>

static const size_t kDtypeSize[DG_DTYPE_COUNT] = {
    [DG_FLOAT32] = 4, [DG_BFLOAT16] = 2, [DG_FLOAT8_E4M3] = 1, [DG_FP4_E2M1X2] = 1,
    [DG_UE8M0] = 1,   [DG_INT32] = 4,    [DG_INT64] = 8,       [DG_UINT8] = 1,
    [DG_INT8] = 1,    [DG_FLOAT16] = 2,
};

static const char *const kDtypeName[DG_DTYPE_COUNT] = {
    [DG_FLOAT32] = "float32",  [DG_BFLOAT16] = "bfloat16", [DG_FLOAT8_E4M3] = "float8_e4m3fn",
    [DG_FP4_E2M1X2] = "fp4_e2m1x2 (packed int8)", [DG_UE8M0] = "ue8m0", [DG_INT32] = "int32",
    [DG_INT64] = "int64", [DG_UINT8] = "uint8", [DG_INT8] = "int8", [DG_FLOAT16] = "float16",
};

size_t dg_dtype_size(dg_dtype dtype) {
    return ((unsigned)dtype < DG_DTYPE_COUNT) ? kDtypeSize[dtype] : 0;
}

const char *dg_dtype_name(dg_dtype dtype) {
    return ((unsigned)dtype < DG_DTYPE_COUNT) ? kDtypeName[dtype] : "invalid dtype";
}

dg_tensor dg_tensor_make(void *data, dg_dtype dtype, int ndim, const int64_t *shape) {
    dg_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    if (ndim < 0 || ndim > DG_MAX_DIMS) {
        t.ndim = -1; /* rejected by every entry point */
        return t;
    }
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; --i) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        /* a product past int64 saturates: the entry points then refuse the span (no UB here) */
        if (!dg_mul_ok(stride, shape[i] > 1 ? shape[i] : 1, &stride))
            stride = INT64_MAX;
    }
    return t;
}

dg_tensor dg_tensor_1d(void *data, dg_dtype dtype, int64_t d0) {
    return dg_tensor_make(data, dtype, 1, &d0);
}

dg_tensor dg_tensor_2d(void *data, dg_dtype dtype, int64_t d0, int64_t d1) {
    const int64_t s[2] = {d0, d1};
    return dg_tensor_make(data, dtype, 2, s);
}

dg_tensor dg_tensor_3d(void *data, dg_dtype dtype, int64_t d0, int64_t d1, int64_t d2) {
    const int64_t s[3] = {d0, d1, d2};
    return dg_tensor_make(data, dtype, 3, s);
}

dg_tensor dg_tensor_transpose(dg_tensor t, int d0, int d1) {
    if (d0 < 0)
        d0 += t.ndim;
    if (d1 < 0)
        d1 += t.ndim;
    if (d0 < 0 || d1 < 0 || d0 >= t.ndim || d1 >= t.ndim) {
        t.ndim = -1;
        return t;
    }
    int64_t s = t.shape[d0];
    t.shape[d0] = t.shape[d1];
    t.shape[d1] = s;
    s = t.strides[d0];
    t.strides[d0] = t.strides[d1];
    t.strides[d1] = s;
    return t;
}

int64_t dg_tensor_numel(const dg_tensor *t) {
    if (!t || t->ndim < 0 || t->ndim > DG_MAX_DIMS)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; ++i)
        if (!dg_mul_ok(n, t->shape[i], &n))
            return -1;
    return n;
}

bool dg_tensor_span(const dg_tensor *t, int64_t *lo, int64_t *hi) {
    *lo = *hi = 0;
    const int64_t es = (int64_t)dg_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; ++i)
        if (t->shape[i] == 0)
            return true;
    int64_t l = 0, h = 0;
    for (int i = 0; i < t->ndim; ++i) {
        int64_t ext;
        if (t->shape[i] < 0 || !dg_mul_ok(t->strides[i], t->shape[i] - 1, &ext))
            return false;
        if (ext >= 0 ? __builtin_add_overflow(h, ext, &h) : __builtin_add_overflow(l, ext, &l))
            return false;
    }
    if (!dg_mul_ok(l, es, lo) || !dg_mul_ok(h, es, hi) || __builtin_add_overflow(*hi, es, hi))
        return false;
    return true;
}

size_t dg_tensor_nbytes(const dg_tensor *t) {
    int64_t lo, hi;
    if (!t || t->ndim < 0 || t->ndim > DG_MAX_DIMS || !dg_tensor_span(t, &lo, &hi))
        return 0;
    return (size_t)(hi - lo);
}

int dg_tensor_is_contiguous(const dg_tensor *t) {
    if (!t || t->ndim < 0 || t->ndim > DG_MAX_DIMS)
        return 0;
    if (dg_tensor_numel(t) == 0) /* PyTorch's rule: an empty tensor is contiguous */
        return 1;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
        if (t->shape[i] != 1 && t->strides[i] != expect)
            return 0;
        if (!dg_mul_ok(expect, t->shape[i], &expect)) /* more elements than int64 counts */
            return 0;
    }
    return 1;
}

float dg_load_float(const dg_tensor *t, const void *p) {
    switch (t->dtype) {
    case DG_FLOAT32: return *(const float *)p;
    case DG_BFLOAT16: return dg_bf16_to_float(*(const uint16_t *)p);
    case DG_FLOAT16: return dg_f16_to_float(*(const uint16_t *)p);
    case DG_FLOAT8_E4M3: return dg_e4m3_to_float(*(const uint8_t *)p);
    case DG_UE8M0: return dg_ue8m0_to_float(*(const uint8_t *)p);
    case DG_INT32: return (float)*(const int32_t *)p;
    case DG_INT64: return (float)*(const int64_t *)p;
    case DG_INT8: return (float)*(const int8_t *)p;
    case DG_UINT8: return (float)*(const uint8_t *)p;
    default: return 0.0f;
    }
}

void dg_store_float(const dg_tensor *t, void *p, float v) {
    if (t->dtype == DG_FLOAT32)
        *(float *)p = v;
    else if (t->dtype == DG_BFLOAT16)
        *(uint16_t *)p = dg_float_to_bf16(v);
}
