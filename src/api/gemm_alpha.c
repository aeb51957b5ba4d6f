/*
 * gemm_alpha.c - the alpha epilogue of the dense GEMMs (see gemm_alpha.h).
 */
#include "gemm_alpha.h"

dg_status dg_gemm_with_alpha(const dg_tensor *d, const dg_tensor *c, int64_t m, int64_t n, float alpha,
                             dg_product_fn product, const void *ctx) {
    int64_t elems;
    DG_CHECK(dg_mul_ok(m, n, &elems) && elems <= INT64_MAX / 4 && (uint64_t)elems <= SIZE_MAX / 4, DG_ERR_OVERFLOW,
             "arguments 'a' and 'b': the product [%lld, %lld] is too large", (long long)m, (long long)n);
    /* A FLOAT32 D without C can hold the product itself; otherwise C (possibly D) must survive. */
    const bool in_place = d->dtype == DG_FLOAT32 && c == NULL;
    float *buf = NULL;
    dg_tensor out = *d;
    if (!in_place) {
        buf = dg_malloc((size_t)elems * sizeof(float));
        DG_CHECK(buf != NULL, DG_ERR_ALLOC, "out of memory for the [%lld, %lld] float32 buffer that 'alpha' needs",
                 (long long)m, (long long)n);
        out = dg_tensor_2d(buf, DG_FLOAT32, m, n);
    }
    const dg_status st = product(ctx, &out);
    if (st == DG_OK) {
#pragma omp parallel for schedule(static) num_threads(dg_num_threads())
        for (int64_t i = 0; i < m; ++i) {
            const float *row = (const float *)dg_ptr2(&out, i, 0);
            for (int64_t j = 0; j < n; ++j) {
                const float scaled = alpha * row[j]; /* rounded to float32, then one add */
                const float v = c ? dg_load_float(c, dg_ptr2(c, i, j)) + scaled : scaled;
                dg_store_float(d, dg_ptr2(d, i, j), v);
            }
        }
    }
    dg_free(buf);
    return st;
}
