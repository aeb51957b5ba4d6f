/*
 * dgbench_grouped.c - grouped GEMM cases (SPEC 4), on DeepSeek's (N, K) = (4096, 2048):
 *
 *   bf16_nt_contiguous   index layout, G = 4 groups of {3, 1, 2, 2} rows, each padded to the
 *                        contiguous alignment (padding rows marked -1, not computed)
 *   fp8_nt_contiguous    the same with E4M3 operands, 1x128 / 128x128 float32 scales
 *   bf16_nt_masked       G = 4, max_m = 8, masked_m = {3, 1, 2, 2}
 *   k_bf16_tn            k-grouped weight gradient, G = 2, ks = {128, 256}, M = 512, N = 256
 *
 * Rows per group are tiny while the only backend is the scalar reference; data are random
 * values (E4M3 data with random positive scales: the timing does not depend on how they were
 * quantized). FLOPs count computed rows only; bytes count every operand once.
 */
#include "dgbench.h"

#include <stdio.h>

typedef enum grouped_kind { G_BF16_CONTIG, G_FP8_CONTIG, G_BF16_MASKED, G_K_BF16_TN } grouped_kind;

typedef struct grouped_params {
    grouped_kind kind;
    int64_t n, k;
} grouped_params;

typedef struct grouped_state {
    bench_pool pool; /* first: freed by bench_pool_state_free */
    const grouped_params *p;
    dg_tensor *a, *sfa, *b, *sfb, *d, *layout;
    int expected_m, ks[2];
} grouped_state;

enum { NUM_GROUPS = 4, MAX_M = 8 };
static const int ROWS[NUM_GROUPS] = {3, 1, 2, 2};

static double nbytes(const dg_tensor *t) { return t ? (double)dg_tensor_nbytes(t) : 0; }

/* m-grouped: A rows group after group, each group padded to the alignment. */
static int setup_m_grouped(grouped_state *st, int64_t n, int64_t k, int quick, bench_work *w) {
    const grouped_params *p = st->p;
    const int masked = p->kind == G_BF16_MASKED, fp8 = p->kind == G_FP8_CONTIG;
    const int64_t align = dg_get_mk_alignment_for_contiguous_layout();
    const int64_t m_total = masked ? NUM_GROUPS * MAX_M : NUM_GROUPS * align;
    const dg_dtype in = fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16;
    st->a = masked ? bench_pool_new(&st->pool, in, 3, (int64_t[]){NUM_GROUPS, MAX_M, k})
                   : bench_pool_new(&st->pool, in, 2, (int64_t[]){m_total, k});
    st->b = bench_pool_new(&st->pool, in, 3, (int64_t[]){NUM_GROUPS, n, k});
    st->d = masked ? bench_pool_new(&st->pool, DG_BFLOAT16, 3, (int64_t[]){NUM_GROUPS, MAX_M, n})
                   : bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){m_total, n});
    st->layout = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){masked ? NUM_GROUPS : m_total});
    if (fp8) {
        st->sfa = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){m_total, (k + 127) / 128});
        st->sfb = bench_pool_new(&st->pool, DG_FLOAT32, 3,
                                 (int64_t[]){NUM_GROUPS, (n + 127) / 128, (k + 127) / 128});
    }
    if (st->pool.failed)
        return -1;
    bench_fill(st->a, 11, 1.0f);
    bench_fill(st->b, 12, 1.0f);
    if (fp8) {
        bench_fill_uniform(st->sfa, 13, 0.5f, 2.0f);
        bench_fill_uniform(st->sfb, 14, 0.5f, 2.0f);
    }
    int32_t *lay = st->layout->data;
    int64_t rows = 0;
    for (int g = 0; g < NUM_GROUPS; ++g) {
        const int r = quick ? 1 : ROWS[g];
        rows += r;
        if (masked)
            lay[g] = r;
        else
            for (int64_t i = 0; i < align; ++i)
                lay[g * align + i] = i < r ? g : -1;
    }
    st->expected_m = (int)(rows / NUM_GROUPS) + 1;
    w->flops = 2.0 * (double)rows * (double)n * (double)k;
    w->bytes = (double)rows * (double)(k * dg_dtype_size(in) + 2 * n) + nbytes(st->b) +
               nbytes(st->sfa) + nbytes(st->sfb);
    snprintf(w->shape, sizeof w->shape, "g=%d m=%lld n=%lld k=%lld", NUM_GROUPS, (long long)rows,
             (long long)n, (long long)k);
    return 0;
}

/* k-grouped: a [sum_k, M], b [sum_k, N], d [G, M, N] float32. */
static int setup_k_grouped(grouped_state *st, int64_t m, int64_t n, int quick, bench_work *w) {
    st->ks[0] = 128, st->ks[1] = quick ? 128 : 256;
    const int64_t sum_k = st->ks[0] + st->ks[1];
    st->a = bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){sum_k, m});
    st->b = bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){sum_k, n});
    st->d = bench_pool_new(&st->pool, DG_FLOAT32, 3, (int64_t[]){2, m, n});
    st->layout = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){2});
    if (st->pool.failed)
        return -1;
    bench_fill(st->a, 21, 1.0f);
    bench_fill(st->b, 22, 1.0f);
    ((int32_t *)st->layout->data)[0] = st->ks[0];
    ((int32_t *)st->layout->data)[1] = st->ks[1];
    w->flops = 2.0 * (double)sum_k * (double)m * (double)n;
    w->bytes = nbytes(st->a) + nbytes(st->b) + nbytes(st->d);
    snprintf(w->shape, sizeof w->shape, "g=2 m=%lld n=%lld k=%lld", (long long)m, (long long)n,
             (long long)sum_k);
    return 0;
}

static int grouped_setup(const bench_case *c, int quick, bench_work *w) {
    const grouped_params *p = c->params;
    grouped_state *st = bench_alloc(sizeof *st);
    if (!st)
        return -1;
    st->p = p;
    const int64_t n = quick ? p->n / 4 : p->n, k = quick ? p->k / 4 : p->k;
    const int rc = p->kind == G_K_BF16_TN ? setup_k_grouped(st, n, k, quick, w)
                                          : setup_m_grouped(st, n, k, quick, w);
    if (rc != 0) {
        bench_pool_state_free(st);
        return -1;
    }
    w->state = st;
    w->out = *st->d;
    return 0;
}

static dg_status grouped_run(void *s) {
    grouped_state *st = s;
    switch (st->p->kind) {
    case G_BF16_CONTIG:
        return dg_m_grouped_bf16_gemm_nt_contiguous(st->a, st->b, st->d, st->layout, NULL);
    case G_FP8_CONTIG:
        return dg_m_grouped_fp8_gemm_nt_contiguous(st->a, st->sfa, st->b, st->sfb, st->d, st->layout,
                                                   NULL);
    case G_BF16_MASKED:
        return dg_m_grouped_bf16_gemm_nt_masked(st->a, st->b, st->d, st->layout, st->expected_m, NULL);
    case G_K_BF16_TN:
        return dg_k_grouped_bf16_gemm_tn_contiguous(st->a, st->b, st->d, st->ks, 2, st->layout, NULL,
                                                    NULL);
    }
    return DG_ERR_INTERNAL;
}

/* For k-grouped, n and k of the params are M and N of the weight gradient. */
static const grouped_params P[] = {
    {G_BF16_CONTIG, 4096, 2048},
    {G_FP8_CONTIG, 4096, 2048},
    {G_BF16_MASKED, 4096, 2048},
    {G_K_BF16_TN, 512, 256},
};

#define CASE(name, i) {name, BENCH_LIMIT_BF16, &P[i], grouped_setup, grouped_run, bench_pool_state_free}
static const bench_case CASES[] = {
    CASE("grouped/bf16_nt_contiguous/n4096_k2048", 0),
    CASE("grouped/fp8_nt_contiguous/n4096_k2048", 1),
    CASE("grouped/bf16_nt_masked/n4096_k2048", 2),
    CASE("grouped/k_bf16_tn/m512_n256", 3),
};
#undef CASE

const bench_family bench_family_grouped = {"grouped", CASES, sizeof CASES / sizeof CASES[0]};
