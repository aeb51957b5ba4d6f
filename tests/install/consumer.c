/* consumer.c - a program built against an installed deepgemm-cpu (see test_install.sh). */
#include <deepgemm.h>

#include <stdio.h>

int main(void) {
    /* D = A @ B^T with A = [[1, 2], [3, 4]] and B = I: D = A, exact in BF16 and float32. */
    uint16_t a[4], b[4];
    const float av[4] = {1, 2, 3, 4}, bv[4] = {1, 0, 0, 1};
    float d[4];
    for (int i = 0; i < 4; ++i) {
        a[i] = dg_float_to_bf16(av[i]);
        b[i] = dg_float_to_bf16(bv[i]);
    }
    dg_tensor ta = dg_tensor_2d(a, DG_BFLOAT16, 2, 2), tb = dg_tensor_2d(b, DG_BFLOAT16, 2, 2);
    dg_tensor td = dg_tensor_2d(d, DG_FLOAT32, 2, 2);
    if (dg_bf16_gemm_nt(&ta, &tb, &td, NULL) != DG_OK) {
        fprintf(stderr, "%s\n", dg_last_error());
        return 1;
    }
    for (int i = 0; i < 4; ++i)
        if (d[i] != av[i]) {
            fprintf(stderr, "d[%d] = %g, want %g\n", i, d[i], av[i]);
            return 1;
        }
    /* A failing call must report through dg_last_error, also across the installed library. */
    if (dg_bf16_gemm_nt(NULL, &tb, &td, NULL) != DG_ERR_NULL_POINTER || !dg_last_error()[0]) {
        fprintf(stderr, "NULL argument was not reported\n");
        return 1;
    }
    printf("deepgemm %s ok\n", dg_version_string());
    return 0;
}
