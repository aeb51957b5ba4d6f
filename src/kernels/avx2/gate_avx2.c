/* gate_avx2.c - the gate's scoring row on 8 lanes (see gate_kernels.h); the tail runs the scalar
 * functions themselves. */
#include "../gate_kernels.h"
#include "float_math_avx2.h"

void dg_gate_score_row_avx2(dg_gate_scoring scoring, const float *in, const float *bias, int64_t n, float *out) {
    int64_t e = 0;
    for (; e + 8 <= n; e += 8) {
        const __m256 v = _mm256_loadu_ps(in + e);
        __m256 f = scoring == DG_GATE_SIGMOID        ? dg_sigmoid8(v)
                   : scoring == DG_GATE_SQRTSOFTPLUS ? _mm256_sqrt_ps(dg_softplus8(v))
                                                     : v;
        f = _mm256_add_ps(f, bias ? _mm256_loadu_ps(bias + e) : _mm256_setzero_ps());
        _mm256_storeu_ps(out + e, f);
    }
    for (; e < n; ++e)
        out[e] = dg_gate_score(scoring, in[e]) + (bias ? bias[e] : 0.0f);
}
