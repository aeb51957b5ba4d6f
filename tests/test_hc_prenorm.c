/*
 * test_hc_prenorm.c - dg_tf32_hc_prenorm_gemm (SPEC 6): the reference backend against naive
 * double math (bitwise: it rounds exact double sums once), argument checking on both backends.
 * The fast kernels are tested against the reference in test_hc_prenorm_fast.c.
 */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#define CHECK_FAIL(expr, want, argname)                                                          \
    do {                                                                                         \
        TU_CHECK_STATUS(expr, want);                                                             \
        TU_CHECK(strstr(dg_last_error(), argname) != NULL, "message names '%s': %s", argname,    \
                 dg_last_error());                                                               \
    } while (0)

/* The test's own statement of DeepGEMM's split: blocks of 64 along K; the first
 * (blocks mod splits) splits get one block more. Returns split s's [k0, k1). */
static void split_bounds(int k, int splits, int s, int *k0, int *k1) {
    const int blocks = (k + 63) / 64;
    int start = 0;
    for (int i = 0; i < s; ++i)
        start += blocks / splits + (i < blocks % splits);
    const int count = blocks / splits + (s < blocks % splits);
    *k0 = start * 64 < k ? start * 64 : k;
    *k1 = (start + count) * 64 < k ? (start + count) * 64 : k;
}

typedef struct hc_case {
    int m, n, k, splits; /* splits <= 0: unsplit */
} hc_case;

static void run_case(tu_rng *rng, hc_case c, int a_row_pad, int d_row_pad) {
    const int m = c.m, n = c.n, k = c.k, s_count = c.splits > 0 ? c.splits : 1;
    /* a: BF16 [M, K] with row stride K + a_row_pad. */
    uint16_t *a_buf = calloc((size_t)m * (k + a_row_pad) + 1, 2);
    float *af = malloc((size_t)m * k * sizeof(float));
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < k; ++j) {
            const uint16_t h = dg_float_to_bf16((float)tu_normal(rng));
            a_buf[(size_t)i * (k + a_row_pad) + j] = h;
            af[(size_t)i * k + j] = dg_bf16_to_float(h);
        }
    dg_tensor a = dg_tensor_2d(a_buf, DG_BFLOAT16, m, k);
    a.strides[0] = k + a_row_pad;
    dg_tensor b = tu_alloc2(DG_FLOAT32, n, k);
    tu_fill_normal(rng, b.data, (size_t)n * k, 1.0f);
    const float *bf = b.data;

    /* d: [S,] M, N with row stride N + d_row_pad; sqr_sum contiguous. */
    const size_t d_elems = (size_t)s_count * m * (n + d_row_pad);
    float *d_buf = malloc(d_elems * sizeof(float) + 4);
    memset(d_buf, 0x7F, d_elems * sizeof(float));
    dg_tensor d = c.splits > 0 ? dg_tensor_3d(d_buf, DG_FLOAT32, s_count, m, n) : dg_tensor_2d(d_buf, DG_FLOAT32, m, n);
    d.strides[d.ndim - 2] = n + d_row_pad;
    if (d.ndim == 3)
        d.strides[0] = (int64_t)m * (n + d_row_pad);
    dg_tensor s = c.splits > 0 ? tu_alloc2(DG_FLOAT32, s_count, m) : tu_alloc(DG_FLOAT32, 1, (const int64_t[]){m});
    TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &s, c.splits));

    /* Each split against its own double sum (exact products, so bitwise), and the sum over
     * splits against the float64 result with DeepGEMM's threshold. */
    double *ref_d = calloc((size_t)m * n, sizeof(double)), *ref_s = calloc((size_t)m, sizeof(double));
    float *sum_d = calloc((size_t)m * n, sizeof(float)), *sum_s = calloc((size_t)m, sizeof(float));
    float *ref_df = malloc((size_t)m * n * sizeof(float)), *ref_sf = malloc((size_t)m * sizeof(float));
    int bad = 0;
    for (int sp = 0; sp < s_count; ++sp) {
        int k0, k1;
        split_bounds(k, s_count, sp, &k0, &k1);
        for (int i = 0; i < m; ++i) {
            double sq = 0;
            for (int j = k0; j < k1; ++j)
                sq += (double)af[(size_t)i * k + j] * af[(size_t)i * k + j];
            const float got_s = ((float *)s.data)[(size_t)sp * m + i];
            bad += got_s != (float)sq;
            sum_s[i] += got_s;
            ref_s[i] += sq;
            for (int jn = 0; jn < n; ++jn) {
                double acc = 0;
                for (int j = k0; j < k1; ++j)
                    acc += (double)af[(size_t)i * k + j] * bf[(size_t)jn * k + j];
                const float got = d_buf[(size_t)sp * m * (n + d_row_pad) + (size_t)i * (n + d_row_pad) + jn];
                bad += got != (float)acc;
                sum_d[(size_t)i * n + jn] += got;
                ref_d[(size_t)i * n + jn] += acc;
            }
        }
    }
    TU_CHECK(bad == 0, "m=%d n=%d k=%d splits=%d: %d partial sums differ from double math", m, n, k, c.splits, bad);
    for (int i = 0; i < m * n; ++i)
        ref_df[i] = (float)ref_d[i];
    for (int i = 0; i < m; ++i)
        ref_sf[i] = (float)ref_s[i];
    const double diff_d = tu_calc_diff(sum_d, ref_df, (size_t)m * n), diff_s = tu_calc_diff(sum_s, ref_sf, (size_t)m);
    TU_CHECK(diff_d < 1e-8 && diff_s < 1e-8, "m=%d n=%d k=%d splits=%d: calc_diff d %.3g s %.3g", m, n, k, c.splits,
             diff_d, diff_s);
    /* Padding between d's rows is untouched. */
    int pad_bad = 0;
    for (int sp = 0; sp < s_count; ++sp)
        for (int i = 0; i < m; ++i)
            for (int p = 0; p < d_row_pad; ++p) {
                uint32_t u;
                memcpy(&u, &d_buf[(size_t)sp * m * (n + d_row_pad) + (size_t)i * (n + d_row_pad) + n + p], 4);
                pad_bad += u != 0x7F7F7F7Fu;
            }
    TU_CHECK(pad_bad == 0, "row padding of d untouched");
    free(ref_d), free(ref_s), free(sum_d), free(sum_s), free(ref_df), free(ref_sf);
    free(a_buf), free(af), free(d_buf);
    tu_free(&b), tu_free(&s);
}

/* Splitting must add up to the unsplit result (to rounding of the partial sums). */
static void test_splits_add_up(tu_rng *rng) {
    const int m = 9, n = 24, k = 1000;
    dg_tensor a = tu_alloc2(DG_BFLOAT16, m, k), b = tu_alloc2(DG_FLOAT32, n, k);
    for (int i = 0; i < m * k; ++i)
        ((uint16_t *)a.data)[i] = dg_float_to_bf16((float)tu_normal(rng));
    tu_fill_normal(rng, b.data, (size_t)n * k, 1.0f);
    dg_tensor d1 = tu_alloc2(DG_FLOAT32, m, n), s1 = tu_alloc(DG_FLOAT32, 1, (const int64_t[]){m});
    TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&a, &b, &d1, &s1, 0));
    const int split_counts[3] = {1, 3, 16};
    for (int t = 0; t < 3; ++t) {
        const int sc = split_counts[t];
        dg_tensor d = tu_alloc3(DG_FLOAT32, sc, m, n), s = tu_alloc2(DG_FLOAT32, sc, m);
        TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &s, sc));
        float *sum_d = calloc((size_t)m * n, sizeof(float)), *sum_s = calloc((size_t)m, sizeof(float));
        for (int sp = 0; sp < sc; ++sp) {
            for (int i = 0; i < m * n; ++i)
                sum_d[i] += ((float *)d.data)[(size_t)sp * m * n + i];
            for (int i = 0; i < m; ++i)
                sum_s[i] += ((float *)s.data)[(size_t)sp * m + i];
        }
        const double dd = tu_calc_diff(sum_d, d1.data, (size_t)m * n), ds = tu_calc_diff(sum_s, s1.data, (size_t)m);
        TU_CHECK(dd < 1e-12 && ds < 1e-12, "%d splits add up: %.3g %.3g", sc, dd, ds);
        if (sc == 1)
            TU_CHECK(memcmp(d.data, d1.data, (size_t)m * n * 4) == 0 && memcmp(s.data, s1.data, (size_t)m * 4) == 0,
                     "one split equals the unsplit result bitwise");
        if (sc == 16) { /* 1000 = 16 blocks of 64 (the last one 40 long): one block per split */
            int k0, k1;
            split_bounds(k, 16, 15, &k0, &k1);
            TU_CHECK(k0 == 960 && k1 == 1000, "last split [%d, %d)", k0, k1);
        }
        free(sum_d), free(sum_s);
        tu_free(&d), tu_free(&s);
    }
    tu_free(&a), tu_free(&b), tu_free(&d1), tu_free(&s1);
}

static void test_split_rule_by_hand(void) {
    /* K = 448 is 7 blocks; 3 splits take 3, 2, 2 blocks. K = 100: 2 blocks, 5 splits: 1, 1, 0, 0, 0. */
    int k0, k1;
    split_bounds(448, 3, 0, &k0, &k1);
    TU_CHECK(k0 == 0 && k1 == 192, "split 0 of 448/3: [%d, %d)", k0, k1);
    split_bounds(448, 3, 1, &k0, &k1);
    TU_CHECK(k0 == 192 && k1 == 320, "split 1 of 448/3: [%d, %d)", k0, k1);
    split_bounds(448, 3, 2, &k0, &k1);
    TU_CHECK(k0 == 320 && k1 == 448, "split 2 of 448/3: [%d, %d)", k0, k1);
    split_bounds(100, 5, 1, &k0, &k1);
    TU_CHECK(k0 == 64 && k1 == 100, "split 1 of 100/5: [%d, %d)", k0, k1);
    split_bounds(100, 5, 3, &k0, &k1);
    TU_CHECK(k0 == k1, "split 3 of 100/5 is empty");

    /* The library's split of K = 448 into 3: a = 1 everywhere, b = 1: d = s = split length. */
    dg_tensor a = tu_alloc2(DG_BFLOAT16, 2, 448), b = tu_alloc2(DG_FLOAT32, 8, 448);
    for (int i = 0; i < 2 * 448; ++i)
        ((uint16_t *)a.data)[i] = dg_float_to_bf16(1.0f);
    for (int i = 0; i < 8 * 448; ++i)
        ((float *)b.data)[i] = 1.0f;
    dg_tensor d = tu_alloc3(DG_FLOAT32, 3, 2, 8), s = tu_alloc2(DG_FLOAT32, 3, 2);
    TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &s, 3));
    const float want[3] = {192, 128, 128};
    for (int sp = 0; sp < 3; ++sp)
        TU_CHECK(((float *)d.data)[sp * 16 + 9] == want[sp] && ((float *)s.data)[sp * 2 + 1] == want[sp],
                 "split %d sums %g %g, want %g", sp, ((float *)d.data)[sp * 16 + 9], ((float *)s.data)[sp * 2 + 1],
                 want[sp]);
    tu_free(&a), tu_free(&b), tu_free(&d), tu_free(&s);
}

static void test_bad_inputs(void) {
    const int m = 5, n = 8, k = 70;
    dg_tensor a = tu_alloc2(DG_BFLOAT16, m, k), b = tu_alloc2(DG_FLOAT32, n, k);
    dg_tensor d = tu_alloc2(DG_FLOAT32, m, n), s = tu_alloc(DG_FLOAT32, 1, (const int64_t[]){m});
    dg_tensor d3 = tu_alloc3(DG_FLOAT32, 2, m, n), s2 = tu_alloc2(DG_FLOAT32, 2, m);
    tu_fill_bytes(&d, 0x5C), tu_fill_bytes(&s, 0x5C), tu_fill_bytes(&d3, 0x5C), tu_fill_bytes(&s2, 0x5C);
    void *sd = tu_snapshot(&d), *ss = tu_snapshot(&s), *sd3 = tu_snapshot(&d3), *ss2 = tu_snapshot(&s2);

    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(NULL, &b, &d, &s, 0), DG_ERR_NULL_POINTER, "'a'");
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, NULL, &d, &s, 0), DG_ERR_NULL_POINTER, "'b'");
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, NULL, &s, 0), DG_ERR_NULL_POINTER, "'d'");
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d, NULL, 0), DG_ERR_NULL_POINTER, "sqr_sum");
    dg_tensor bad = a;
    bad.dtype = DG_FLOAT32;
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&bad, &b, &d, &s, 0), DG_ERR_DTYPE, "'a'");
    bad = b;
    bad.dtype = DG_BFLOAT16;
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &bad, &d, &s, 0), DG_ERR_DTYPE, "'b'");
    bad = d;
    bad.dtype = DG_BFLOAT16;
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &bad, &s, 0), DG_ERR_DTYPE, "'d'");
    bad = s;
    bad.dtype = DG_BFLOAT16;
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &bad, 0), DG_ERR_DTYPE, "sqr_sum");
    /* K mismatch, N = 0, K = 0. */
    const dg_tensor b_k = dg_tensor_2d(b.data, DG_FLOAT32, n, k - 1);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b_k, &d, &s, 0), DG_ERR_SHAPE, "'b'");
    const dg_tensor b_n0 = dg_tensor_2d(b.data, DG_FLOAT32, 0, k);
    const dg_tensor d_n0 = dg_tensor_2d(d.data, DG_FLOAT32, m, 0);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b_n0, &d_n0, &s, 0), DG_ERR_SHAPE, "'b'");
    const dg_tensor a_k0 = dg_tensor_2d(a.data, DG_BFLOAT16, m, 0), b_k0 = dg_tensor_2d(b.data, DG_FLOAT32, n, 0);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a_k0, &b_k0, &d, &s, 0), DG_ERR_SHAPE, "'a'");
    /* Output shapes. */
    const dg_tensor d_m = dg_tensor_2d(d.data, DG_FLOAT32, m - 1, n);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d_m, &s, 0), DG_ERR_SHAPE, "'d'");
    const dg_tensor s_m = dg_tensor_1d(s.data, DG_FLOAT32, m - 1);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &s_m, 0), DG_ERR_SHAPE, "sqr_sum");
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &s, 2), DG_ERR_SHAPE, "'d'");
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d3, &s2, 3), DG_ERR_SHAPE, "'d'");
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d3, &s, 2), DG_ERR_SHAPE, "sqr_sum");
    const dg_tensor s2_3 = dg_tensor_2d(s2.data, DG_FLOAT32, 1, m);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d3, &s2_3, 2), DG_ERR_SHAPE, "sqr_sum");
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d3, &s2, 0), DG_ERR_SHAPE, "'d'");
    /* Layouts: MN-major a or b, column-major d, strided sqr_sum, aliasing. */
    const dg_tensor a_t = dg_tensor_transpose(dg_tensor_2d(a.data, DG_BFLOAT16, k, m), 0, 1);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a_t, &b, &d, &s, 0), DG_ERR_LAYOUT, "'a'");
    const dg_tensor b_t = dg_tensor_transpose(dg_tensor_2d(b.data, DG_FLOAT32, k, n), 0, 1);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b_t, &d, &s, 0), DG_ERR_LAYOUT, "'b'");
    const dg_tensor d_t = dg_tensor_transpose(dg_tensor_2d(d.data, DG_FLOAT32, n, m), 0, 1);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d_t, &s, 0), DG_ERR_LAYOUT, "'d'");
    dg_tensor s_str = dg_tensor_1d(s2.data, DG_FLOAT32, m);
    s_str.strides[0] = 2;
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &s_str, 0), DG_ERR_LAYOUT, "sqr_sum");
    dg_tensor d_rep = d;
    d_rep.strides[0] = 0;
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d_rep, &s, 0), DG_ERR_LAYOUT, "'d'");
    const dg_tensor d_on_b = dg_tensor_2d(b.data, DG_FLOAT32, m, n);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d_on_b, &s, 0), DG_ERR_LAYOUT, "'d'");
    const dg_tensor s_on_d = dg_tensor_1d((float *)d.data + 3, DG_FLOAT32, m);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &s_on_d, 0), DG_ERR_LAYOUT, "sqr_sum");
    const dg_tensor s_on_a = dg_tensor_1d(a.data, DG_FLOAT32, m);
    CHECK_FAIL(dg_tf32_hc_prenorm_gemm(&a, &b, &d, &s_on_a, 0), DG_ERR_LAYOUT, "sqr_sum");

    TU_CHECK(tu_unchanged(&d, sd) && tu_unchanged(&s, ss) && tu_unchanged(&d3, sd3) && tu_unchanged(&s2, ss2),
             "failed calls write nothing");
    { /* every other row of a split output: strided, but no element twice (dgbench samples so) */
        const int64_t half = (m + 1) / 2;
        float *dsm = calloc((size_t)(2 * m * n), sizeof(float)), *ssm = calloc((size_t)(2 * half), sizeof(float));
        dg_tensor a_h = a, d_h = dg_tensor_3d(dsm, DG_FLOAT32, 2, half, n);
        a_h.shape[0] = half, a_h.strides[0] *= 2;
        d_h.strides[0] = m * n, d_h.strides[1] = 2 * n;
        const dg_tensor s_h = dg_tensor_2d(ssm, DG_FLOAT32, 2, half);
        TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&a_h, &b, &d_h, &s_h, 2));
        float *dfull = calloc((size_t)(2 * m * n), sizeof(float)), *sfull = calloc((size_t)(2 * m), sizeof(float));
        const dg_tensor d_f = dg_tensor_3d(dfull, DG_FLOAT32, 2, m, n), s_f = dg_tensor_2d(sfull, DG_FLOAT32, 2, m);
        TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&a, &b, &d_f, &s_f, 2));
        int same = 1;
        for (int64_t sp = 0; sp < 2; ++sp)
            for (int64_t r = 0; r < half; ++r)
                same &= memcmp(dsm + sp * m * n + 2 * r * n, dfull + sp * m * n + 2 * r * n,
                               (size_t)n * sizeof(float)) == 0;
        TU_CHECK(same, "a row-strided split output equals the rows of the full call");
        free(dsm), free(ssm), free(dfull), free(sfull);
    }
    /* M = 0 does nothing and succeeds. */
    const dg_tensor a0 = dg_tensor_2d(a.data, DG_BFLOAT16, 0, k), d0 = dg_tensor_2d(d.data, DG_FLOAT32, 0, n);
    const dg_tensor s0 = dg_tensor_1d(s.data, DG_FLOAT32, 0);
    TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&a0, &b, &d0, &s0, 0));
    TU_CHECK(tu_unchanged(&d, sd), "M = 0 writes nothing");
    const dg_tensor d30 = dg_tensor_3d(d3.data, DG_FLOAT32, 2, 0, n), s20 = dg_tensor_2d(s2.data, DG_FLOAT32, 2, 0);
    TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&a0, &b, &d30, &s20, 2));
    TU_CHECK(tu_unchanged(&d3, sd3) && tu_unchanged(&s2, ss2), "M = 0 with splits writes nothing");
    free(sd), free(ss), free(sd3), free(ss2);
    tu_free(&a), tu_free(&b), tu_free(&d), tu_free(&s), tu_free(&d3), tu_free(&s2);
}

int main(void) {
    tu_rng rng = {2024};
    /* Argument checks come before the backend is chosen: the same answers on both. */
    test_bad_inputs();
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    test_split_rule_by_hand();
    /* DeepGEMM's N = 24 and M = 13 / 137 with smaller K (K tails included), odd N, M = 1. */
    const hc_case cases[] = {
        {13, 24, 1024, 0}, {13, 24, 1024, 16}, {137, 24, 448, 0}, {137, 24, 448, 3}, {1, 24, 100, 0},
        {1, 24, 100, 5},   {7, 7, 1, 0},       {7, 7, 1, 2},      {65, 24, 130, 4}, {3, 40, 7168, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        run_case(&rng, cases[i], (int)(i % 3), (int)(i % 2) * 5);
    test_splits_add_up(&rng);
    test_bad_inputs();
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    test_split_rule_by_hand(); /* small integers: exact on the fast path too */
    test_splits_add_up(&rng);
    return tu_finish();
}
