/*
 * test_gemm_dense_spec.c - SPEC 3 accuracy on DeepGEMM shapes (calc_diff against float math on
 * the unquantized inputs, with this file's own quantizers written after deep_gemm.utils), and
 * fp8_gemm_nt_skip_head_mid against the naive formula with untouched middle columns.
 */
#include "test_gemm_dense_util.h"

/* ---- quantizers (SPEC 2), independent of the library's ---------------------------------- */

/* Smallest power of two >= x (x > 0), as ceil_to_ue8m0; returns its UE8M0 byte in *e. */
static float pow2_ceil(float x, uint8_t *e) {
    int ex;
    const float fr = frexpf(x, &ex); /* x = fr * 2^ex, fr in [0.5, 1) */
    int p = fr == 0.5f ? ex - 1 : ex;
    if (p < -126)
        p = -126;
    if (p > 127)
        p = 127;
    *e = (uint8_t)(p + 127);
    return ldexpf(1.0f, p);
}

typedef struct qmat {
    void *codes;  /* E4M3 [r, k] or packed FP4 [r, k / 2] */
    float *sf;    /* [sr, sk] float scales */
    uint8_t *e;   /* their UE8M0 bytes when ue8m0 */
    int64_t sr, sk;
} qmat;

/* Quantizes x [r, k] in blocks of (gm rows x gk columns): amax clamped at 1e-4, sf = amax / qmax
 * (rounded up to a power of two with ue8m0), codes = cast(x * (1 / sf)). */
static qmat quantize(const float *x, int64_t r, int64_t k, int gm, int gk, int fp4, int ue8m0) {
    qmat q;
    q.sr = tg_cdiv(r, gm), q.sk = tg_cdiv(k, gk);
    q.sf = malloc((size_t)(q.sr * q.sk) * sizeof(float));
    q.e = malloc((size_t)(q.sr * q.sk));
    q.codes = calloc((size_t)(fp4 ? r * k / 2 : r * k), 1);
    for (int64_t bi = 0; bi < q.sr; ++bi)
        for (int64_t bk = 0; bk < q.sk; ++bk) {
            float amax = 1e-4f;
            for (int64_t i = bi * gm; i < r && i < (bi + 1) * gm; ++i)
                for (int64_t kk = bk * gk; kk < k && kk < (bk + 1) * gk; ++kk)
                    amax = fmaxf(amax, fabsf(x[i * k + kk]));
            float sf = amax / (fp4 ? 6.0f : 448.0f);
            uint8_t e = 0;
            if (ue8m0)
                sf = pow2_ceil(sf, &e);
            q.sf[bi * q.sk + bk] = sf, q.e[bi * q.sk + bk] = e;
            const float inv = 1.0f / sf;
            for (int64_t i = bi * gm; i < r && i < (bi + 1) * gm; ++i)
                for (int64_t kk = bk * gk; kk < k && kk < (bk + 1) * gk; ++kk) {
                    const float v = x[i * k + kk] * inv;
                    if (!fp4) {
                        ((uint8_t *)q.codes)[i * k + kk] = dg_float_to_e4m3(v);
                        continue;
                    }
                    uint8_t *p = (uint8_t *)q.codes + i * k / 2 + kk / 2;
                    *p |= (uint8_t)(dg_float_to_e2m1(v) << (kk & 1 ? 4 : 0));
                }
        }
    return q;
}

/* The data and scale tensors of q: float [sr, sk] or packed UE8M0 int32 [sr, ceil(sk / 4)]. */
static void qmat_tensors(const qmat *q, int64_t r, int64_t k, int fp4, int packed, dg_tensor *t,
                         dg_tensor *sf, uint32_t **words) {
    *t = dg_tensor_2d(q->codes, fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, r, fp4 ? k / 2 : k);
    *words = NULL;
    if (!packed) {
        *sf = dg_tensor_2d(q->sf, DG_FLOAT32, q->sr, q->sk);
        return;
    }
    const int64_t cols = tg_cdiv(q->sk, 4);
    *words = calloc((size_t)(q->sr * cols), 4);
    for (int64_t i = 0; i < q->sr; ++i)
        for (int64_t s = 0; s < q->sk; ++s)
            (*words)[i * cols + s / 4] |= (uint32_t)q->e[i * q->sk + s] << (8 * (s % 4));
    *sf = dg_tensor_2d(*words, DG_INT32, q->sr, cols);
}

static void qmat_free(qmat *q) {
    free(q->codes);
    free(q->sf);
    free(q->e);
}

/* ---- accuracy against unquantized math ---------------------------------------------------- */

typedef struct acc_case {
    const char *name;
    int64_t m, n, k;
    int bf16;               /* bf16_gemm_nt instead of fp8_fp4_gemm_nt */
    int fp4_a, fp4_b, ue8m0;
    int ga[2], gb[2];       /* quantization blocks; passed as recipe_a/_b unless default */
    int use_default_recipe; /* opts NULL: float scales -> (1, 128, 128) */
    dg_dtype out;
    int with_c;
    double max_diff;
} acc_case;

static void run_accuracy(const acc_case *ac, tu_rng *r) {
    const int64_t m = ac->m, n = ac->n, k = ac->k;
    float *x = malloc((size_t)(m * k) * sizeof(float)), *y = malloc((size_t)(n * k) * sizeof(float));
    uint16_t *xb = malloc((size_t)(m * k) * 2), *yb = malloc((size_t)(n * k) * 2);
    for (int64_t i = 0; i < m * k; ++i)
        xb[i] = dg_float_to_bf16((float)tu_normal(r)), x[i] = dg_bf16_to_float(xb[i]);
    for (int64_t i = 0; i < n * k; ++i)
        yb[i] = dg_float_to_bf16((float)tu_normal(r)), y[i] = dg_bf16_to_float(yb[i]);
    dg_tensor d = tg_out(r, ac->out, m, n, 0, ac->with_c);
    dg_tensor c = tg_out(r, ac->out, m, n, 0, 1);
    float *want = malloc((size_t)(m * n) * sizeof(float));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double s = ac->with_c ? tg_get(&c, i, j) : 0.0;
            for (int64_t kk = 0; kk < k; ++kk)
                s += (double)x[i * k + kk] * y[j * k + kk];
            want[i * n + j] = ac->out == DG_BFLOAT16 ? dg_bf16_to_float(dg_float_to_bf16((float)s)) : (float)s;
        }

    dg_status st;
    if (ac->bf16) {
        const dg_tensor ta = dg_tensor_2d(xb, DG_BFLOAT16, m, k), tb = dg_tensor_2d(yb, DG_BFLOAT16, n, k);
        st = dg_bf16_gemm_nt(&ta, &tb, &d, ac->with_c ? &c : NULL);
    } else {
        qmat qa = quantize(x, m, k, ac->ga[0], ac->ga[1], ac->fp4_a, ac->ue8m0);
        qmat qb = quantize(y, n, k, ac->gb[0], ac->gb[1], ac->fp4_b, ac->ue8m0);
        dg_tensor ta, sfa, tb, sfb;
        uint32_t *wa, *wb;
        qmat_tensors(&qa, m, k, ac->fp4_a, ac->ue8m0, &ta, &sfa, &wa);
        qmat_tensors(&qb, n, k, ac->fp4_b, ac->ue8m0, &tb, &sfb, &wb);
        dg_gemm_options opt = dg_gemm_options_default();
        memcpy(opt.recipe_a, ac->ga, sizeof opt.recipe_a);
        memcpy(opt.recipe_b, ac->gb, sizeof opt.recipe_b);
        st = dg_fp8_fp4_gemm_nt(&ta, &sfa, &tb, &sfb, &d, ac->with_c ? &c : NULL,
                                ac->use_default_recipe ? NULL : &opt);
        qmat_free(&qa);
        qmat_free(&qb);
        free(wa);
        free(wb);
    }
    float *got = tu_to_float(&d);
    const double diff = tu_calc_diff(got, want, (size_t)(m * n));
    TU_CHECK(st == DG_OK && diff < ac->max_diff, "%s (M=%lld N=%lld K=%lld): %s %s, calc_diff %.3g (limit %g)",
             ac->name, (long long)m, (long long)n, (long long)k, dg_status_string(st), dg_last_error(), diff,
             ac->max_diff);
    printf("  %-28s M=%-2lld N=%-4lld K=%lld: calc_diff %.2e (limit %g)\n", ac->name, (long long)m,
           (long long)n, (long long)k, diff, ac->max_diff);
    /* The check must be able to fail: a wrong result is far above every limit. */
    if (ac->max_diff <= 1e-3) {
        got[0] += 1000.0f;
        TU_CHECK(tu_calc_diff(got, want, (size_t)(m * n)) > ac->max_diff, "calc_diff detects a wrong value");
    }
    free(got);
    free(want);
    free(x), free(y), free(xb), free(yb);
    free(d.data), free(c.data);
}

static void test_accuracy(void) {
    /* DeepGEMM's shapes (N, K) = (576, 7168) and (256, 7168) with a small M; the quantization
     * configs of tests/generators.py: 1D2D legacy FP8, 1D1D UE8M0, FP8 x FP4 (gran_k 32). */
    static const acc_case cases[] = {
        {"bf16", 4, 576, 7168, 1, 0, 0, 0, {0, 0}, {0, 0}, 0, DG_BFLOAT16, 0, 1e-5},
        {"bf16 accumulate fp32", 2, 256, 7168, 1, 0, 0, 0, {0, 0}, {0, 0}, 0, DG_FLOAT32, 1, 1e-5},
        {"fp8 1D2D default recipe", 4, 576, 7168, 0, 0, 0, 0, {1, 128}, {128, 128}, 1, DG_BFLOAT16, 0, 1e-3},
        {"fp8 1D1D ue8m0 accumulate", 2, 256, 7168, 0, 0, 0, 1, {1, 128}, {1, 128}, 0, DG_FLOAT32, 1, 1e-3},
        {"fp8 x fp4", 4, 576, 7168, 0, 0, 1, 1, {1, 128}, {1, 32}, 0, DG_BFLOAT16, 0, 1e-2},
        {"fp4 x fp8", 2, 256, 7168, 0, 1, 0, 1, {1, 32}, {1, 128}, 0, DG_BFLOAT16, 0, 1e-2},
        {"fp4 x fp4", 2, 256, 7168, 0, 1, 1, 1, {1, 32}, {1, 32}, 0, DG_BFLOAT16, 0, 2e-2},
    };
    tu_rng r = {11};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        run_accuracy(&cases[i], &r);
}

/* ---- skip_head_mid ------------------------------------------------------------------------ */

static void run_skip(tu_rng *r, const int hs[3], int64_t heads, int64_t m, int64_t k, int packed,
                     int gran_n, dg_dtype out) {
    const int64_t lr = hs[0] + hs[2], n = heads * lr, w = hs[0] + hs[1] + hs[2], nd = heads * w;
    top a = top_make(r, DG_FLOAT8_E4M3, m, k, (int)(tu_next(r) & 1), 1, 128, packed, (int)(tu_next(r) & 1));
    top b = top_make(r, DG_FLOAT8_E4M3, n, k, (int)(tu_next(r) & 1), gran_n, 128, packed, (int)(tu_next(r) & 1));
    dg_gemm_options opt = dg_gemm_options_default();
    opt.recipe[0] = 1, opt.recipe[1] = gran_n, opt.recipe[2] = 128;
    dg_tensor d = tg_out(r, out, m, nd, 3, 1);
    void *before = malloc((size_t)(m * (nd + 3) + 1) * dg_dtype_size(out));
    memcpy(before, d.data, (size_t)(m * (nd + 3) + 1) * dg_dtype_size(out));
    const dg_status st = dg_fp8_gemm_nt_skip_head_mid(&a.t, &a.sf, &b.t, &b.sf, &d, hs, &opt);

    dg_tensor old = d;
    old.data = before;
    int64_t bad = 0;
    for (int64_t i = 0; i < m && st == DG_OK; ++i)
        for (int64_t col = 0; col < nd + 3; ++col) {
            const int64_t h = col / w, j = col % w;
            uint32_t want;
            if (col >= nd || (j >= hs[0] && j < hs[0] + hs[1]))
                want = tg_bits(&old, i, col); /* mid columns and row padding: untouched */
            else
                want = tg_expect(&a, i, &b, h * lr + (j < hs[0] ? j : j - hs[1]), 0.0, out);
            bad += tg_bits(&d, i, col) != want;
        }
    TU_CHECK(st == DG_OK && bad == 0, "skip_head_mid (%d,%d,%d) heads %lld M=%lld K=%lld %s gran_n %d %s: %s %s, %lld bad",
             hs[0], hs[1], hs[2], (long long)heads, (long long)m, (long long)k, packed ? "packed" : "float",
             gran_n, dg_dtype_name(out), dg_status_string(st), dg_last_error(), (long long)bad);
    free(before);
    free(d.data);
    top_free(&a);
    top_free(&b);
}

static void test_skip_head_mid(void) {
    static const int splits[][3] = {{3, 2, 5}, {4, 0, 4}, {0, 3, 2}, {2, 1, 0}, {128, 64, 128}, {64, 7, 80}};
    static const int64_t heads[] = {2, 3, 2, 4, 1, 2};
    tu_rng r = {12};
    for (int s = 0; s < 6; ++s)
        for (int o = 0; o < 2; ++o) {
            const dg_dtype out = o ? DG_FLOAT32 : DG_BFLOAT16;
            run_skip(&r, splits[s], heads[s], 3, 130, 0, 128, out); /* 1D2D, N tails */
            run_skip(&r, splits[s], heads[s], 1, 256, 1, 1, out);   /* 1D1D packed UE8M0 */
            run_skip(&r, splits[s], heads[s], 2, 7, 0, 1, out);     /* 1D1D float, K tail */
        }
    /* M = 0: nothing to do, nothing written. */
    run_skip(&r, splits[0], 2, 0, 128, 0, 128, DG_BFLOAT16);
}

int main(void) {
    /* skip_head_mid is checked bit-exactly against double accumulation: the reference backend;
     * test_engine_gemm.c checks the engine's skip_head_mid with tolerances. */
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    test_skip_head_mid();
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    test_accuracy();
    return tu_finish();
}
