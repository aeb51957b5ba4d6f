/* ref_gemm.c - the reference GEMM: double accumulation in increasing k (see ref_gemm.h). */
#include "ref_gemm.h"

double dg_ref_dot(const dg_operand *a, int64_t group_a, int64_t i, const dg_operand *b,
                  int64_t group_b, int64_t j) {
    double acc = 0.0;
    for (int64_t kk = 0; kk < a->k; ++kk)
        acc += (double)dg_operand_get(a, group_a, i, kk) * (double)dg_operand_get(b, group_b, j, kk);
    return acc;
}

void dg_ref_gemm(const dg_operand *a, int64_t group_a, int64_t m_begin, int64_t m_end,
                 const dg_operand *b, int64_t group_b, int64_t n_begin, int64_t n_end,
                 const dg_tensor *d, const dg_tensor *c) {
    for (int64_t r = 0; r < m_end - m_begin; ++r) {
        for (int64_t s = 0; s < n_end - n_begin; ++s) {
            /* C is read before D is written, so c == d (in place) is safe element by element. */
            double acc = c ? (double)dg_load_float(c, dg_ptr2(c, r, s)) : 0.0;
            acc += dg_ref_dot(a, group_a, m_begin + r, b, group_b, n_begin + s);
            dg_store_float(d, dg_ptr2(d, r, s), (float)acc);
        }
    }
}

dg_tensor dg_ref_view2d(const dg_tensor *t, int64_t group, int64_t row0, int64_t rows, int64_t col0,
                        int64_t cols) {
    const int b = group >= 0 ? 1 : 0;
    int64_t off = row0 * t->strides[b] + col0 * t->strides[b + 1];
    if (b)
        off += group * t->strides[0];
    dg_tensor v = *t;
    v.data = (char *)t->data + off * (int64_t)dg_dtype_size(t->dtype);
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.strides[0] = t->strides[b];
    v.strides[1] = t->strides[b + 1];
    for (int i = 2; i < DG_MAX_DIMS; ++i)
        v.shape[i] = v.strides[i] = 0;
    return v;
}
