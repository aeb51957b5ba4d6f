/*
 * test_engine_gemm.c - the dense GEMM engine (src/engine/) on every ISA level this CPU runs
 * (forced with dg_set_isa), against exact math on the dequantized values and against the
 * reference backend:
 *   - every element within the float32 accumulation bound
 *       |D - exact| <= 2^-24 * ((K + 4) * sum_k |a_k b_k| + |C|)   (+ 2^-8 |exact| for BF16 D)
 *   - calc_diff(engine, reference) under DeepGEMM's thresholds (BF16 1e-5, FP8 1e-3, FP4 2e-2)
 *   - all ISA levels give bitwise the same D (they share one accumulation order: engine.h)
 * on odd shapes: M, N, K = 1, tails of MR / NR / KC / MC / NC, K not a multiple of 128 (scale
 * tails), K- and MN-major operands with padded strides, nt/nn/tn/tt, C separate and in place.
 */
#include "test_gemm_dense_util.h"

#include "common/engine_variants.h"
#include "engine/engine.h"

typedef struct ecase {
    dg_dtype da, db;
    int gran_a[2], gran_b[2], packed; /* packed: UE8M0 int32 scales for both */
    dg_dtype out;
    int cmode; /* 0 none, 1 separate, 2 in place */
    int layout; /* 0 nt, 1 nn, 2 tn, 3 tt (operands arrive as transposed views) */
} ecase;

static const int kTransA[4] = {0, 0, 1, 1}, kTransB[4] = {0, 1, 1, 0};

static dg_status call(const ecase *e, const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                      const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c) {
    typedef dg_status (*bf)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *);
    typedef dg_status (*ff)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *,
                            const dg_tensor *, const dg_tensor *, const dg_gemm_options *);
    static const bf kB[4] = {dg_bf16_gemm_nt, dg_bf16_gemm_nn, dg_bf16_gemm_tn, dg_bf16_gemm_tt};
    static const ff kF[4] = {dg_fp8_fp4_gemm_nt, dg_fp8_fp4_gemm_nn, dg_fp8_fp4_gemm_tn, dg_fp8_fp4_gemm_tt};
    if (e->da == DG_BFLOAT16)
        return kB[e->layout](a, b, d, c);
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe_a[0] = e->gran_a[0], o.recipe_a[1] = e->gran_a[1];
    o.recipe_b[0] = e->gran_b[0], o.recipe_b[1] = e->gran_b[1];
    return kF[e->layout](a, sfa, b, sfb, d, c, &o);
}

static double threshold(const ecase *e) {
    if (e->da == DG_BFLOAT16)
        return 1e-5;
    if (e->da == DG_FP4_E2M1X2 && e->db == DG_FP4_E2M1X2)
        return 2e-2;
    return (e->da == DG_FP4_E2M1X2 || e->db == DG_FP4_E2M1X2) ? 1e-2 : 1e-3;
}

/* Runs one GEMM with the current ISA / backend into a fresh copy of d0; returns the copy. */
static dg_tensor run(const ecase *e, const top *a, const top *b, const dg_tensor *d0, const dg_tensor *c0,
                     dg_status *st) {
    dg_tensor d = *d0;
    const size_t bytes = (size_t)(d0->shape[0] * d0->strides[0] + 1) * dg_dtype_size(d0->dtype);
    d.data = malloc(bytes);
    memcpy(d.data, d0->data, bytes);
    dg_tensor at = a->t, sfa = a->sf, bt = b->t, sfb = b->sf;
    if (kTransA[e->layout])
        at = dg_tensor_transpose(at, 0, 1), sfa = dg_tensor_transpose(sfa, 0, 1);
    if (kTransB[e->layout])
        bt = dg_tensor_transpose(bt, 0, 1), sfb = dg_tensor_transpose(sfb, 0, 1);
    *st = call(e, &at, &sfa, &bt, &sfb, &d, e->cmode == 2 ? &d : e->cmode == 1 ? c0 : NULL);
    return d;
}

/* Exact value and float32 accumulation bound of every element (computed once per case). */
static void exact_and_bound(const top *a, const top *b, const dg_tensor *c, dg_dtype out, double *ex,
                            double *tol) {
    for (int64_t i = 0; i < a->mn; ++i)
        for (int64_t j = 0; j < b->mn; ++j) {
            const double cv = c ? tg_get(c, i, j) : 0.0;
            double e = cv, mag = 0;
            for (int64_t kk = 0; kk < a->k; ++kk) {
                const double p = (double)a->val[i * a->k + kk] * b->val[j * b->k + kk];
                e += p, mag += fabs(p);
            }
            double t = ldexp((double)(a->k + 4) * mag + fabs(cv), -24) + 1e-30;
            if (out == DG_BFLOAT16)
                t += ldexp(fabs(e), -8);
            ex[i * b->mn + j] = e, tol[i * b->mn + j] = t;
        }
}

static int64_t count_bad(const dg_tensor *d, const double *ex, const double *tol) {
    int64_t bad = 0;
    for (int64_t i = 0; i < d->shape[0]; ++i)
        for (int64_t j = 0; j < d->shape[1]; ++j)
            if (!(fabs(tg_get(d, i, j) - ex[i * d->shape[1] + j]) <= tol[i * d->shape[1] + j]))
                ++bad;
    return bad;
}

static float *as_float(const dg_tensor *d) {
    float *x = malloc((size_t)(d->shape[0] * d->shape[1] + 1) * sizeof(float));
    for (int64_t i = 0; i < d->shape[0]; ++i)
        for (int64_t j = 0; j < d->shape[1]; ++j)
            x[i * d->shape[1] + j] = tg_get(d, i, j);
    return x;
}

static int same_bits(const dg_tensor *x, const dg_tensor *y) {
    for (int64_t i = 0; i < x->shape[0]; ++i)
        for (int64_t j = 0; j < x->shape[1]; ++j)
            if (tg_bits(x, i, j) != tg_bits(y, i, j))
                return 0;
    return 1;
}

static void check(tu_rng *r, const ecase *e, int64_t m, int64_t n, int64_t k, int mnm_a, int mnm_b) {
    if (!top_layout_ok(e->da, m, k, mnm_a) || !top_layout_ok(e->db, n, k, mnm_b))
        return;
    top a = top_make(r, e->da, m, k, mnm_a, e->gran_a[0], e->gran_a[1], e->packed, 0);
    top b = top_make(r, e->db, n, k, mnm_b, e->gran_b[0], e->gran_b[1], e->packed, 1);
    dg_tensor d0 = tg_out(r, e->out, m, n, 3, e->cmode == 2), c0 = tg_out(r, e->out, m, n, 1, 1);
    const dg_tensor *cref = e->cmode == 2 ? &d0 : e->cmode == 1 ? &c0 : NULL;
    char what[200];
    snprintf(what, sizeof what, "%s x %s layout %d out %s cmode %d M=%lld N=%lld K=%lld mnm %d%d",
             dg_dtype_name(e->da), dg_dtype_name(e->db), e->layout, dg_dtype_name(e->out), e->cmode,
             (long long)m, (long long)n, (long long)k, mnm_a, mnm_b);

    dg_status st;
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    dg_tensor dref = run(e, &a, &b, &d0, &c0, &st);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    float *fref = as_float(&dref);
    double *ex = malloc((size_t)(m * n + 1) * sizeof(double)), *tol = malloc((size_t)(m * n + 1) * sizeof(double));
    exact_and_bound(&a, &b, cref, e->out, ex, tol);
    dg_tensor first = {0};
    const dg_isa best = dg_get_isa();
    for (int v = 0; v < tu_engine_variants(best); ++v) {
        const int isa = tu_engine_variant_set(v);
        dg_tensor d = run(e, &a, &b, &d0, &c0, &st);
        TU_CHECK(st == DG_OK, "%s isa %s: %s", what, dg_engine_config((dg_isa)isa)->name, dg_last_error());
        const int64_t bad = count_bad(&d, ex, tol);
        float *f = as_float(&d);
        const double diff = tu_calc_diff(f, fref, (size_t)(m * n));
        TU_CHECK(bad == 0 && diff < threshold(e), "%s isa %s: %lld elements out of bound, calc_diff %.3g",
                 what, dg_engine_config((dg_isa)isa)->name, (long long)bad, diff);
        for (int64_t i = 0; i < m; ++i) /* row padding untouched */
            for (int64_t j = n; j < n + 3; ++j)
                TU_CHECK(tg_bits(&d, i, j) == tg_bits(&d0, i, j), "%s: padding written", what);
        if (isa == DG_ISA_GENERIC)
            first = d;
        else if (isa == DG_ISA_AMX) { /* TDPBF16PS rounds its own way: bounds only */
            free(d.data);
        } else {
            TU_CHECK(same_bits(&first, &d), "%s: kernel %s differs bitwise from generic", what,
                     dg_engine_config((dg_isa)isa)->name);
            free(d.data);
        }
        free(f);
    }
    tu_engine_variants_done(best);
    free(first.data);
    free(fref);
    free(ex);
    free(tol);
    free(dref.data);
    free(d0.data);
    free(c0.data);
    top_free(&a);
    top_free(&b);
}

/* Shapes hitting every block tail: MR 4/6/14, NR 16/32, KC 256, MC 64..224, NC 256/512; M = 300
 * is past every level's small-M bound (AVX2: 256), so the large-M path runs everywhere. */
static const int64_t kShapes[][3] = {{1, 1, 1},   {1, 33, 7},   {2, 17, 2},    {15, 33, 129},
                                     {29, 65, 300}, {227, 517, 34}, {3, 40, 1024},
                                     {5, 70, 1101}, {64, 33, 520}, {1, 72, 320}, {2, 45, 1100}, {300, 70, 130}};

static void test_bf16(void) {
    tu_rng r = {11};
    for (size_t s = 0; s < sizeof kShapes / sizeof kShapes[0]; ++s)
        for (int v = 0; v < 4; ++v) {
            const ecase e = {DG_BFLOAT16, DG_BFLOAT16, {0, 0}, {0, 0}, 0, v & 1 ? DG_BFLOAT16 : DG_FLOAT32,
                             (int)(s + (size_t)v) % 3, v};
            check(&r, &e, kShapes[s][0], kShapes[s][1], kShapes[s][2], v >> 1, (int)(s & 1));
        }
}

static void test_scaled(void) {
    tu_rng r = {12};
    const ecase cases[] = {
        /* 1D2D float32: both scales in the per-128 epilogue */
        {DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {128, 128}, 0, DG_BFLOAT16, 0, 0},
        /* 1D1D float32 */
        {DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {1, 128}, 0, DG_FLOAT32, 1, 1},
        /* UE8M0 packed: folded into the values */
        {DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {1, 128}, 1, DG_FLOAT32, 2, 2},
        /* FP8 x FP4 (1, 32) packed */
        {DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 1, DG_BFLOAT16, 0, 3},
        /* FP4 x FP8 float: epilogue per 32 */
        {DG_FP4_E2M1X2, DG_FLOAT8_E4M3, {1, 32}, {1, 128}, 0, DG_FLOAT32, 1, 0},
        /* FP4 x FP4 */
        {DG_FP4_E2M1X2, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 1, DG_FLOAT32, 0, 0},
        /* FP8 (1, 128) x FP4 (1, 32), both packed, B K-major (even index): a K tail inside A's
         * last block; M <= 2 runs the decode kernels */
        {DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 128}, {1, 32}, 1, DG_FLOAT32, 1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c)
        for (size_t s = 0; s < sizeof kShapes / sizeof kShapes[0]; ++s)
            check(&r, &cases[c], kShapes[s][0], kShapes[s][1], kShapes[s][2], (int)(s & 1), (int)(c & 1));
}

/* skip_head_mid through the engine: head columns close to the reference, mid columns and row
 * padding untouched. */
static void test_skip_head_mid(void) {
    tu_rng r = {13};
    static const int hs[][3] = {{3, 2, 5}, {128, 64, 128}, {0, 3, 40}};
    for (int s = 0; s < 3; ++s)
        for (int packed = 0; packed < 2; ++packed) {
            const int64_t m = s == 1 ? 70 : 5, k = 300, lr = hs[s][0] + hs[s][2], n = 2 * lr;
            const int64_t w = lr + hs[s][1], nd = 2 * w;
            top a = top_make(&r, DG_FLOAT8_E4M3, m, k, 0, 1, 128, packed, 0);
            top b = top_make(&r, DG_FLOAT8_E4M3, n, k, 0, packed ? 1 : 128, 128, packed, 0);
            dg_gemm_options o = dg_gemm_options_default();
            o.recipe[0] = 1, o.recipe[1] = packed ? 1 : 128, o.recipe[2] = 128;
            dg_tensor d0 = tg_out(&r, DG_BFLOAT16, m, nd, 2, 1), dref = d0, deng = d0;
            const size_t bytes = (size_t)(m * (nd + 2) + 1) * 2;
            dref.data = malloc(bytes), deng.data = malloc(bytes);
            memcpy(dref.data, d0.data, bytes), memcpy(deng.data, d0.data, bytes);
            TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
            TU_CHECK_OK(dg_fp8_gemm_nt_skip_head_mid(&a.t, &a.sf, &b.t, &b.sf, &dref, hs[s], &o));
            TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
            TU_CHECK_OK(dg_fp8_gemm_nt_skip_head_mid(&a.t, &a.sf, &b.t, &b.sf, &deng, hs[s], &o));
            int64_t bad = 0;
            for (int64_t i = 0; i < m; ++i)
                for (int64_t col = 0; col < nd + 2; ++col) {
                    const int64_t j = col % w;
                    if (col >= nd || (j >= hs[s][0] && j < hs[s][0] + hs[s][1]))
                        bad += tg_bits(&deng, i, col) != tg_bits(&d0, i, col);
                    else
                        bad += fabs(tg_get(&deng, i, col) - tg_get(&dref, i, col)) >
                               ldexp(fabs(tg_get(&dref, i, col)), -7) + 1e-3;
                }
            TU_CHECK(bad == 0, "skip_head_mid (%d,%d,%d) packed %d: %lld bad", hs[s][0], hs[s][1], hs[s][2], packed,
                     (long long)bad);
            free(d0.data), free(dref.data), free(deng.data);
            top_free(&a);
            top_free(&b);
        }
}

int main(void) {
    test_bf16();
    test_scaled();
    test_skip_head_mid();
    return tu_finish();
}
