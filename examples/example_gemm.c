/* example_gemm.c - the README's C example: D = A @ B^T in BF16 with float32 output. */
#include <deepgemm.h>

#include <math.h>
#include <stdio.h>

int main(void) {
    enum { M = 4, N = 3, K = 8 };
    uint16_t a[M * K], b[N * K];
    float d[M * N];
    for (int i = 0; i < M * K; ++i)
        a[i] = dg_float_to_bf16((float)(i % 5) - 2.0f);
    for (int i = 0; i < N * K; ++i)
        b[i] = dg_float_to_bf16((float)(i % 3) * 0.5f);

    dg_tensor ta = dg_tensor_2d(a, DG_BFLOAT16, M, K);
    dg_tensor tb = dg_tensor_2d(b, DG_BFLOAT16, N, K);
    dg_tensor td = dg_tensor_2d(d, DG_FLOAT32, M, N);
    if (dg_bf16_gemm_nt(&ta, &tb, &td, NULL) != DG_OK) {
        fprintf(stderr, "%s\n", dg_last_error());
        return 1;
    }

    /* The inputs are small integers and halves, so float32 results are exact. */
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float want = 0;
            for (int k = 0; k < K; ++k)
                want += dg_bf16_to_float(a[m * K + k]) * dg_bf16_to_float(b[n * K + k]);
            if (fabsf(d[m * N + n] - want) != 0.0f) {
                fprintf(stderr, "d[%d][%d] = %g, want %g\n", m, n, d[m * N + n], want);
                return 1;
            }
        }
    printf("D[0][0] = %g\n", d[0]);
    return 0;
}
