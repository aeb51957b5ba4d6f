/*
 * quant_args.h - argument checks shared by src/api/quant.c and src/api/formats.c: expected
 * output shapes, the query form, and the FLOAT32/BFLOAT16 input rule.
 */
#ifndef DG_API_QUANT_ARGS_H
#define DG_API_QUANT_ARGS_H

#include "../core/internal.h"

/* ceil(a / b) for a >= 0, b > 0, without the overflow of a + b - 1. */
static inline int64_t qa_ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* A FLOAT32 or BFLOAT16 input of ndim dimensions (ndim < 0: any). */
static inline dg_status qa_check_real_input(const dg_tensor *t, const char *name, int ndim) {
    static const dg_dtype kReal[2] = {DG_FLOAT32, DG_BFLOAT16};
    DG_TRY(dg_check_tensor(t, name, ndim));
    return dg_check_dtype_in(t, name, kReal, 2);
}

/* A packed FP4 tensor: DG_FP4_E2M1X2 or INT8 (DeepGEMM's dtype), 2-D, pairs along the last
 * dimension (unit stride there). */
static inline dg_status qa_check_fp4(const dg_tensor *t, const char *name) {
    static const dg_dtype kFp4[2] = {DG_FP4_E2M1X2, DG_INT8};
    DG_TRY(dg_check_tensor(t, name, 2));
    DG_TRY(dg_check_dtype_in(t, name, kFp4, 2));
    return dg_check_last_dim_contiguous(t, name);
}

/* Query form: true (and `t` filled in row-major) when t->data is NULL. */
static inline bool qa_query(dg_tensor *t, dg_dtype dtype, int ndim, const int64_t *shape) {
    if (t->data != NULL)
        return false;
    *t = dg_tensor_make(NULL, dtype, ndim, shape);
    return true;
}

/* An output of exactly this dtype and shape that addresses each element once. */
static inline dg_status qa_check_output(const dg_tensor *t, const char *name, dg_dtype dtype, int ndim,
                                        const int64_t *shape) {
    DG_TRY(dg_check_tensor_dtype(t, name, ndim, dtype));
    for (int i = 0; i < ndim; ++i)
        DG_TRY(dg_check_dim(t, name, i, shape[i]));
    return dg_check_output(t, name);
}

static inline dg_status qa_check_gran_k(int gran_k) {
    DG_CHECK(gran_k > 0, DG_ERR_VALUE, "argument 'gran_k' must be positive, got %d", gran_k);
    return DG_OK;
}

#endif /* DG_API_QUANT_ARGS_H */
