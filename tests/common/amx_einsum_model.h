/*
 * amx_einsum_model.h - the BF16 einsum's order on AMX (src/engine/batched.h) built from dense
 * GEMMs, for tests that pin it bit for bit. On AMX, dg_bf16_gemm_nt over a K slice of at most
 * DG_ACC_BLOCK is one tile chain from zero (engine.h), which is exactly one einsum block; the
 * model combines those block sums in float64 as batched.h says: per run of DG_F64_RUN blocks
 * ((b0 + b1) + (b2 + b3)) with absent blocks left out, the runs added in order (the first run
 * is the total's start), the total rounded to float32 once. Leaving a term out is adding -0.0,
 * IEEE addition's exact identity, which is how the model writes it.
 */
#ifndef TESTS_AMX_EINSUM_MODEL_H
#define TESTS_AMX_EINSUM_MODEL_H

#include "engine/engine.h"
#include "test_util.h"

#include <stdlib.h>

/* a [M, K'] and b [N, K'] BF16 2-D views (any strides; K' as the einsum sees it, segments
 * concatenated and padded by the caller); out: the M x N float32 totals, row-major, before C.
 * Runs with the current ISA, which must be AMX. */
static inline void tu_amx_einsum_model(const dg_tensor *a, const dg_tensor *b, float *out) {
    _Static_assert(DG_F64_RUN == 4, "the model's tree is ((b0 + b1) + (b2 + b3))");
    const int64_t m = a->shape[0], n = b->shape[0], k = a->shape[1], mn = m * n;
    double *tot = malloc(((size_t)mn + 1) * sizeof(double));
    float *blk = calloc((size_t)(DG_F64_RUN * mn) + 1, sizeof(float));
    TU_CHECK(tot && blk, "out of memory for the AMX einsum model");
    for (int64_t i = 0; tot && i < mn; ++i)
        tot[i] = -0.0;
    for (int64_t r0 = 0; tot && blk && r0 < k; r0 += DG_F64_RUN * DG_ACC_BLOCK) {
        int nb = 0;
        for (; nb < DG_F64_RUN && r0 + nb * DG_ACC_BLOCK < k; ++nb) {
            const int64_t k0 = r0 + nb * DG_ACC_BLOCK, len = k - k0 < DG_ACC_BLOCK ? k - k0 : DG_ACC_BLOCK;
            dg_tensor as = *a, bs = *b, d = dg_tensor_2d(blk + nb * mn, DG_FLOAT32, m, n);
            as.data = (uint16_t *)a->data + k0 * a->strides[1], as.shape[1] = len;
            bs.data = (uint16_t *)b->data + k0 * b->strides[1], bs.shape[1] = len;
            TU_CHECK_OK(dg_bf16_gemm_nt(&as, &bs, &d, NULL));
        }
        for (int64_t i = 0; i < mn; ++i) {
            double v[DG_F64_RUN];
            for (int q = 0; q < DG_F64_RUN; ++q)
                v[q] = q < nb ? (double)blk[q * mn + i] : -0.0;
            tot[i] = tot[i] + ((v[0] + v[1]) + (v[2] + v[3]));
        }
    }
    for (int64_t i = 0; tot && i < mn; ++i)
        out[i] = (float)tot[i];
    free(tot);
    free(blk);
}

#endif
