/* ref_einsum.c - reference einsum kernels (see ref_einsum.h). */
#include "ref_einsum.h"

void dg_ref_einsum_bmk_bnk_mn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    const int64_t batches = a->shape[0], m_total = a->shape[1], k_total = a->shape[2];
    const int64_t n_total = b->shape[1];
    for (int64_t m = 0; m < m_total; ++m)
        for (int64_t n = 0; n < n_total; ++n) {
            double acc = 0.0;
            for (int64_t s = 0; s < batches; ++s)
                for (int64_t k = 0; k < k_total; ++k)
                    acc += (double)dg_load_float(a, dg_ptr3(a, s, m, k)) *
                           (double)dg_load_float(b, dg_ptr3(b, s, n, k));
            /* Read C before writing D: they may be the same memory. */
            if (c)
                acc += (double)dg_load_float(c, dg_ptr2(c, m, n));
            dg_store_float(d, dg_ptr2(d, m, n), (float)acc);
        }
}

/* The exactly dequantized element: raw * scale in double (an E4M3 or BF16 value times a float
 * scale needs more than float's 24 bits, but fits in double's 53). */
static double operand_value(const dg_operand *op, int64_t g, int64_t i, int64_t k) {
    return (double)dg_operand_raw(op, g, i, k) * (double)dg_operand_scale(op, g, i, k);
}

void dg_ref_bmm(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const dg_tensor *c) {
    for (int64_t g = 0; g < a->groups; ++g)
        for (int64_t m = 0; m < a->mn; ++m)
            for (int64_t n = 0; n < b->mn; ++n) {
                double acc = 0.0;
                for (int64_t k = 0; k < a->k; ++k)
                    acc += operand_value(a, g, m, k) * operand_value(b, g, n, k);
                if (c)
                    acc += (double)dg_load_float(c, dg_ptr3(c, g, m, n));
                dg_store_float(d, dg_ptr3(d, g, m, n), (float)acc);
            }
}
