/* gate_avx512.c - the gate's scoring row on 16 lanes (see gate_kernels.h). */
#include "../gate_kernels.h"
#include "float_math_avx512.h"

void dg_gate_score_row_avx512(dg_gate_scoring scoring, const float *in, const float *bias, int64_t n, float *out) {
    for (int64_t e = 0; e < n; e += 16) {
        const __mmask16 m = n - e >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - e)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, in + e);
        __m512 f = scoring == DG_GATE_SIGMOID        ? dg_sigmoid16(v)
                   : scoring == DG_GATE_SQRTSOFTPLUS ? _mm512_sqrt_ps(dg_softplus16(v))
                                                     : v;
        f = _mm512_add_ps(f, bias ? _mm512_maskz_loadu_ps(m, bias + e) : _mm512_setzero_ps());
        _mm512_mask_storeu_ps(out + e, m, f);
    }
}
