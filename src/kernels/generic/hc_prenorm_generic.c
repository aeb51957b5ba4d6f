/*
 * hc_prenorm_generic.c - portable kernels of the fast HC prenorm GEMM (see
 * hc_prenorm_kernels.h): 8 partial sums per output, plain float32 fused multiply-adds (fmaf,
 * one rounding per term as the vector kernels do).
 */
#include "../hc_prenorm_kernels.h"

#include <math.h>
#include <string.h>

#define L DG_HC_LANES_GENERIC
#define C DG_HC_COLS_GENERIC

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void dg_hc_pack_generic(const float *b, int64_t ldb, int64_t nsc, int64_t len, float *pk) {
    const int64_t padded = dg_align(len, 16);
    for (int64_t r = 0; r < DG_HC_NS; ++r)
        for (int64_t i = 0; i < padded; ++i)
            pk[r * DG_HC_KC + i] = r < nsc && i < len ? b[r * ldb + i] : 0.0f;
}

void dg_hc_convert_generic(const uint16_t *a, int64_t lda, int rows, int64_t len, float *xa, float *sq, int64_t sf,
                           int first) {
    const int64_t padded = dg_align(len, 16);
    for (int r = 0; r < rows; ++r) {
        float *xr = xa + r * DG_HC_KC, *s = sq + r * sf;
        if (first)
            memset(s, 0, L * sizeof(float));
        for (int64_t i = 0; i < padded; ++i) {
            const float x = i < len ? bf16_to_f32(a[r * lda + i]) : 0.0f;
            xr[i] = x;
            s[i % L] = fmaf(x, x, s[i % L]);
        }
    }
}

void dg_hc_micro_generic(const float *xa, int rows, int64_t len, const float *pk, float *acc, int64_t sf,
                         int first, const uint16_t *pf) {
    (void)pf; /* no portable prefetch needed here */
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < C; ++c) {
            const float *x = xa + r * DG_HC_KC, *b = pk + c * DG_HC_KC;
            float s[L];
            if (first)
                memset(s, 0, sizeof s);
            else
                memcpy(s, acc + r * sf + c * L, sizeof s);
            for (int64_t i = 0; i < len; i += L)
                for (int l = 0; l < L; ++l)
                    s[l] = fmaf(x[i + l], b[i + l], s[l]);
            memcpy(acc + r * sf + c * L, s, sizeof s);
        }
}

/* Pairwise: lanes (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then 0+1. */
void dg_hc_finish_generic(const float *st, float *out) {
    for (int c = 0; c <= DG_HC_NS; ++c) {
        const float *v = st + c * L;
        const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
        out[c] = (s0 + s2) + (s1 + s3);
    }
}
