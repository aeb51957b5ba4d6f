/*
 * dgbench_gemm.c - dense GEMM cases (SPEC 3): D = A @ B^T on DeepSeek's (N, K) shapes.
 *
 *   bf16_nt      A, B BF16; D BF16                           limit: BF16 dot products
 *   fp8_nt_1d2d  A E4M3 with 1x128 scales, B E4M3 with 128x128 scales (float32); D BF16
 *   fp8_fp4_nt   A E4M3 with 1x128 scales, B packed FP4 with 1x32 UE8M0-valued float32
 *                scales (DeepGEMM's FP8 x FP4 quant config (128, 32)); D BF16
 *
 * M is small while the only backend is the scalar reference, so that the whole default run
 * takes about a minute on 2 cores; raise `m` when fast kernels land. --quick uses m_quick and
 * N, K divided by 4 (rounded up to 128).
 * Timing includes everything the public call does (argument checks, any packing).
 * Bytes counted: A, B and their scales read once, D written once.
 */
#include "dgbench.h"

#include <stdio.h>
#include <string.h>

typedef enum gemm_kind { GEMM_BF16, GEMM_FP8_1D2D, GEMM_FP8_FP4 } gemm_kind;

typedef struct gemm_params {
    gemm_kind kind;
    int64_t m, n, k, m_quick;
} gemm_params;

typedef struct gemm_state {
    const gemm_params *p;
    dg_tensor a, sfa, b, sfb, d;
    dg_gemm_options opts;
} gemm_state;

static void gemm_free(void *s) {
    gemm_state *st = s;
    if (!st)
        return;
    bench_tensor_free(&st->a);
    bench_tensor_free(&st->sfa);
    bench_tensor_free(&st->b);
    bench_tensor_free(&st->sfb);
    bench_tensor_free(&st->d);
    bench_free(st);
}

static int64_t quarter(int64_t x) {
    const int64_t q = (x / 4 + 127) / 128 * 128;
    return q < 128 ? 128 : q;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Quantizes x [rows, cols] into t / sf as the case's recipe says. */
static int quantize(const float *x, int64_t rows, int64_t cols, gemm_kind kind, int is_b,
                    dg_tensor *t, dg_tensor *sf) {
    if (kind == GEMM_BF16) {
        *t = bench_tensor2(DG_BFLOAT16, rows, cols);
        if (t->data)
            bench_to_bf16(x, t->data, (size_t)(rows * cols));
        return t->data ? 0 : -1;
    }
    if (is_b && kind == GEMM_FP8_FP4) {
        *t = bench_tensor2(DG_FP4_E2M1X2, rows, cols / 2);
        *sf = bench_tensor2(DG_FLOAT32, rows, cdiv(cols, 32));
        if (!t->data || !sf->data)
            return -1;
        bench_cast_fp4_rows(x, rows, cols, 32, 1, t->data, sf->data);
        return 0;
    }
    *t = bench_tensor2(DG_FLOAT8_E4M3, rows, cols);
    if (is_b) { /* FP8 weights: 128 x 128 blocks */
        *sf = bench_tensor2(DG_FLOAT32, cdiv(rows, 128), cdiv(cols, 128));
        if (!t->data || !sf->data)
            return -1;
        bench_cast_fp8_block(x, rows, cols, 128, 0, t->data, sf->data);
    } else { /* activations: 1 x 128 per token */
        *sf = bench_tensor2(DG_FLOAT32, rows, cdiv(cols, 128));
        if (!t->data || !sf->data)
            return -1;
        bench_cast_fp8_rows(x, rows, cols, 128, kind == GEMM_FP8_FP4, t->data, sf->data);
    }
    return 0;
}

static int gemm_setup(const bench_case *c, int quick, bench_work *w) {
    const gemm_params *p = c->params;
    const int64_t m = quick ? p->m_quick : p->m, n = quick ? quarter(p->n) : p->n,
                  k = quick ? quarter(p->k) : p->k;
    gemm_state *st = bench_alloc(sizeof *st);
    float *x = bench_alloc_uninit((size_t)((m > n ? m : n) * k) * sizeof(float));
    int rc = -1;
    if (!st || !x)
        goto out;
    st->p = p;
    st->opts = dg_gemm_options_default();
    if (p->kind == GEMM_FP8_FP4) {
        st->opts.recipe_a[0] = 1, st->opts.recipe_a[1] = 128;
        st->opts.recipe_b[0] = 1, st->opts.recipe_b[1] = 32;
    }
    bench_fill_normal(x, (size_t)(m * k), 1, 1.0f);
    if (quantize(x, m, k, p->kind, 0, &st->a, &st->sfa) != 0)
        goto out;
    bench_fill_normal(x, (size_t)(n * k), 2, 1.0f);
    if (quantize(x, n, k, p->kind, 1, &st->b, &st->sfb) != 0)
        goto out;
    st->d = bench_tensor2(DG_BFLOAT16, m, n);
    if (!st->d.data)
        goto out;
    w->state = st;
    w->out = st->d;
    w->flops = 2.0 * (double)m * (double)n * (double)k;
    w->bytes = (double)(dg_tensor_nbytes(&st->a) + dg_tensor_nbytes(&st->b) +
                        dg_tensor_nbytes(&st->sfa) + dg_tensor_nbytes(&st->sfb) +
                        dg_tensor_nbytes(&st->d));
    snprintf(w->shape, sizeof w->shape, "m=%lld n=%lld k=%lld", (long long)m, (long long)n,
             (long long)k);
    rc = 0;
out:
    bench_free(x);
    if (rc != 0)
        gemm_free(st);
    return rc;
}

static dg_status gemm_run(void *s) {
    gemm_state *st = s;
    switch (st->p->kind) {
    case GEMM_BF16:
        return dg_bf16_gemm_nt(&st->a, &st->b, &st->d, NULL);
    case GEMM_FP8_1D2D:
        return dg_fp8_gemm_nt(&st->a, &st->sfa, &st->b, &st->sfb, &st->d, NULL, &st->opts);
    case GEMM_FP8_FP4:
        return dg_fp8_fp4_gemm_nt(&st->a, &st->sfa, &st->b, &st->sfb, &st->d, NULL, &st->opts);
    }
    return DG_ERR_INTERNAL;
}

/* DeepSeek's (N, K) shapes from DeepGEMM's tests (SPEC 3); m sized for ~0.5 s per run with
 * the scalar reference on 2 cores (M = 1 is DeepGEMM's decoding shape). */
#define SHAPE(kind, m, n, k) {kind, m, n, k, m < 4 ? m : 4}
static const gemm_params P[] = {
    SHAPE(GEMM_BF16, 4, 2112, 7168),     SHAPE(GEMM_BF16, 2, 24576, 1536),
    SHAPE(GEMM_BF16, 4, 7168, 2048),     SHAPE(GEMM_FP8_1D2D, 4, 2112, 7168),
    SHAPE(GEMM_FP8_1D2D, 1, 24576, 1536), SHAPE(GEMM_FP8_1D2D, 4, 7168, 2048),
    SHAPE(GEMM_FP8_FP4, 4, 2112, 7168),  SHAPE(GEMM_FP8_FP4, 1, 24576, 1536),
    SHAPE(GEMM_FP8_FP4, 4, 7168, 2048),
};
#undef SHAPE

#define CASE(name, i) {name, BENCH_LIMIT_BF16, &P[i], gemm_setup, gemm_run, gemm_free}
static const bench_case CASES[] = {
    CASE("gemm/bf16_nt/n2112_k7168", 0),      CASE("gemm/bf16_nt/n24576_k1536", 1),
    CASE("gemm/bf16_nt/n7168_k2048", 2),      CASE("gemm/fp8_nt_1d2d/n2112_k7168", 3),
    CASE("gemm/fp8_nt_1d2d/n24576_k1536", 4), CASE("gemm/fp8_nt_1d2d/n7168_k2048", 5),
    CASE("gemm/fp8_fp4_nt/n2112_k7168", 6),   CASE("gemm/fp8_fp4_nt/n24576_k1536", 7),
    CASE("gemm/fp8_fp4_nt/n7168_k2048", 8),
};
#undef CASE

const bench_family bench_family_gemm = {"gemm", CASES, sizeof CASES / sizeof CASES[0]};
