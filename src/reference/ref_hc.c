/* ref_hc.c - reference hyper-connection prenorm GEMM (see ref_hc.h). */
#include "ref_hc.h"

void dg_hc_split_range(int64_t k, int num_splits, int split, int64_t *k0, int64_t *k1) {
    /* The first nb % S splits take one block more than the others (DeepGEMM's kernel). */
    const int64_t nb = dg_ceil_div(k, DG_HC_BLOCK_K);
    const int64_t per = nb / num_splits, rem = nb % num_splits;
    const int64_t first = split * per + (split < rem ? split : rem);
    const int64_t count = per + (split < rem ? 1 : 0);
    *k0 = first * DG_HC_BLOCK_K;
    *k1 = (first + count) * DG_HC_BLOCK_K;
    if (*k0 > k)
        *k0 = k;
    if (*k1 > k)
        *k1 = k;
}

void dg_ref_hc_prenorm(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *sqr_sum,
                       int num_splits) {
    const int64_t m_total = a->shape[0], k_total = a->shape[1], n_total = b->shape[0];
    for (int s = 0; s < num_splits; ++s) {
        int64_t k0, k1;
        dg_hc_split_range(k_total, num_splits, s, &k0, &k1);
        for (int64_t m = 0; m < m_total; ++m) {
            double sq = 0.0;
            for (int64_t k = k0; k < k1; ++k) {
                const double x = dg_load_float(a, dg_ptr2(a, m, k));
                sq += x * x;
            }
            dg_store_float(sqr_sum, dg_ptr2(sqr_sum, s, m), (float)sq);
            for (int64_t n = 0; n < n_total; ++n) {
                double acc = 0.0;
                for (int64_t k = k0; k < k1; ++k)
                    acc += (double)dg_load_float(a, dg_ptr2(a, m, k)) * (double)dg_load_float(b, dg_ptr2(b, n, k));
                dg_store_float(d, dg_ptr3(d, s, m, n), (float)acc);
            }
        }
    }
}
