/*
 * dgbench_hc_einsum.c - hyper-connection prenorm and einsum cases (SPEC 6-7):
 *
 *   hc/tf32_prenorm        a BF16 [M, K], b FLOAT32 [N, K] with DeepSeek's N = 24 and the
 *                          shapes of SPEC 6 (M in {13, 4096}, K in {7168, 28672}), without
 *                          splits and with 16: d = a @ b^T and the row sums of squares.
 *                          The reference is too slow for M = 4096, so the diff column compares
 *                          a sample of at most 64 evenly spaced rows (the reference run gets
 *                          views of just those rows of a and d).
 *   hc/mega_mhc            dg_mega_mhc (shifted, y_bf16 and y_fp8 with GEMM-layout scales), hc_mult 4,
 *                          hidden 4096 / 7168, T = 1 and 16 (decode: bound by reading fn, [24, 4H] float32,
 *                          once) and 4096 (prefill: the GEMM's FP32 FMAs). The reference is too slow
 *                          for T = 4096: the diff column compares the first min(T, 64) tokens (the
 *                          reference run gets views of just those tokens). FLOPs: the GEMM's; bytes:
 *                          every input and output once. --digest: T 1, 16 or 70, hidden 1152.
 *   einsum/...             the einsum forms on DeepGEMM's test shapes: dgbench_einsum.inc
 *
 * The compared output is d. FLOPs count 2 per multiply-add of the product only.
 * --digest hashes d and the square sums of one call with K / 16 (448 to 1792: two to eight of
 * the AVX2 kernel's 224-long chunks, tails) and M 13, 137, 280 or 400 (over the 256-row blocks).
 */
#include "dgbench.h"

#include <stdio.h>
#include <string.h>

typedef enum hc_kind { HC_PRENORM, HC_MEGA_MHC } hc_kind;

typedef struct hc_params {
    hc_kind kind;
    int64_t d0, d1, d2, d3; /* prenorm: M, N, K, splits; mega_mhc: T, hidden */
} hc_params;

typedef struct hc_state {
    bench_pool pool; /* first: freed by bench_pool_state_free */
    const hc_params *p;
    dg_tensor *a, *sfa, *b, *sfb, *d, *s;
    dg_tensor a_smp, d_smp, *s_smp; /* prenorm: the sampled rows the reference computes */
    dg_tensor *mt[18], ms[18];       /* mega_mhc: x .. y_gemm_sf (see mhc_run), the reference's views */
} hc_state;

enum { MHC_T = 18 };
/* mega_mhc: the tensors' shapes for T tokens of hidden H (hc_mult 4, 24 mixes). */
static void mhc_shapes(int64_t T, int64_t H, int64_t sh[MHC_T][3], int *nd, dg_dtype *dt) {
    const int64_t s[MHC_T][3] = {{T, H}, {T, 4, H}, {T, 4, 1}, {T, 4, 1}, {T, 4, 4}, {24, 4 * H}, {3},
                                 {24}, {H}, {T, 4, H}, {T, 4, 1}, {T, 4, 1}, {T, 4, 4}, {T, H}, {T, H},
                                 {H / 128, (T + 3) / 4 * 4}};
    const int n[MHC_T] = {2, 3, 3, 3, 3, 2, 1, 1, 1, 3, 3, 3, 3, 2, 2, 2};
    const dg_dtype d[MHC_T] = {DG_BFLOAT16, DG_BFLOAT16, DG_FLOAT32, DG_FLOAT32, DG_FLOAT32, DG_FLOAT32,
                               DG_FLOAT32,  DG_FLOAT32,  DG_BFLOAT16, DG_BFLOAT16, DG_FLOAT32, DG_FLOAT32,
                               DG_FLOAT32, DG_BFLOAT16, DG_FLOAT8_E4M3, DG_INT32};
    memcpy(sh, s, sizeof s);
    memcpy(nd, n, sizeof n);
    memcpy(dt, d, sizeof d);
}
#define MHC_USED 16 /* tensors in use of the MHC_T slots */

static double nb(const dg_tensor *t) { return t ? (double)dg_tensor_nbytes(t) : 0; }

static int hc_setup(const bench_case *c, int size, bench_work *w) {
    const int quick = size != BENCH_SIZE_FULL;
    const hc_params *p = c->params;
    hc_state *st = bench_alloc(sizeof *st);
    if (!st)
        return -1;
    st->p = p;
    bench_pool *pool = &st->pool;
    const int64_t q = quick ? 4 : 1;
    double flops = 0;
    if (p->kind == HC_PRENORM) {
        int64_t m = p->d0 / q > 0 ? p->d0 / q : 1, n = p->d1, k = p->d2;
        const int64_t sp = p->d3;
        if (size == BENCH_SIZE_DIGEST)
            m = p->d0 >= 8192 ? 400 : p->d0 >= 4096 ? 280 : p->d0, k = p->d2 / 16;
        st->a = bench_pool_new(pool, DG_BFLOAT16, 2, (int64_t[]){m, k});
        st->b = bench_pool_new(pool, DG_FLOAT32, 2, (int64_t[]){n, k});
        if (sp > 0) {
            st->d = bench_pool_new(pool, DG_FLOAT32, 3, (int64_t[]){sp, m, n});
            st->s = bench_pool_new(pool, DG_FLOAT32, 2, (int64_t[]){sp, m});
        } else {
            st->d = bench_pool_new(pool, DG_FLOAT32, 2, (int64_t[]){m, n});
            st->s = bench_pool_new(pool, DG_FLOAT32, 1, (int64_t[]){m});
        }
        const int64_t step = m > 64 ? m / 64 : 1, rows = (m + step - 1) / step;
        st->s_smp = sp > 0 ? bench_pool_new(pool, DG_FLOAT32, 2, (int64_t[]){sp, rows})
                           : bench_pool_new(pool, DG_FLOAT32, 1, (int64_t[]){rows});
        if (!pool->failed) {
            st->a_smp = *st->a;
            st->a_smp.shape[0] = rows;
            st->a_smp.strides[0] *= step;
            st->d_smp = *st->d;
            st->d_smp.shape[st->d->ndim - 2] = rows;
            st->d_smp.strides[st->d->ndim - 2] *= step;
        }
        flops = 2.0 * (double)m * (double)n * (double)k;
        snprintf(w->shape, sizeof w->shape, "m=%lld n=%lld k=%lld splits=%lld", (long long)m,
                 (long long)n, (long long)k, (long long)sp);
    }
    if (p->kind == HC_MEGA_MHC) {
        int64_t T = p->d0 / q > 0 ? p->d0 / q : 1, H = p->d1;
        if (size == BENCH_SIZE_DIGEST) /* over the 8-wide lanes and the thread split, small */
            T = p->d0 >= 4096 ? 70 : p->d0, H = 1152;
        const int64_t rows = T < 64 ? T : 64;
        int64_t sh[MHC_T][3];
        int nd[MHC_T];
        dg_dtype dt[MHC_T];
        mhc_shapes(T, H, sh, nd, dt);
        double bytes = 0;
        for (int i = 0; i < MHC_USED; ++i) {
            st->mt[i] = bench_pool_new(pool, dt[i], nd[i], sh[i]);
            if (pool->failed)
                break;
            bench_fill(st->mt[i], 60 + i, i == 5 ? 0.01f : i == 6 || i == 7 ? 0.1f : 1.0f);
            bytes += nb(st->mt[i]);
            st->ms[i] = *st->mt[i];
            if (i != 5 && i != 6 && i != 7 && i != 8 && i != 15)
                st->ms[i].shape[0] = rows; /* the first tokens */
        }
        if (!pool->failed) { /* y_gemm_sf: column-major [T, H / 128] */
            dg_tensor *g = st->mt[15];
            g->shape[0] = T, g->shape[1] = H / 128, g->strides[0] = 1, g->strides[1] = (T + 3) / 4 * 4;
            st->ms[15] = *g;
            st->ms[15].shape[0] = rows;
            bench_fill_uniform(st->mt[2], 61, 0.1f, 0.9f);
            bench_fill_uniform(st->mt[3], 62, 0.1f, 0.9f);
            bench_fill_uniform(st->mt[4], 63, 0.0f, 0.5f);
        }
        flops = 2.0 * (double)T * 24.0 * 4.0 * (double)H;
        snprintf(w->shape, sizeof w->shape, "t=%lld hidden=%lld hc_mult=4 shifted fp8", (long long)T, (long long)H);
        if (!pool->failed) {
            w->state = st;
            w->out = st->ms[13];
            w->digest[0] = *st->mt[9], w->digest[1] = *st->mt[13], w->ndigest = 2;
            w->flops = flops;
            w->bytes = bytes;
            return 0;
        }
    }
    if (pool->failed) {
        bench_pool_state_free(st);
        return -1;
    }
    bench_fill(st->a, 51, 1.0f);
    bench_fill(st->b, 52, p->kind == HC_PRENORM ? 0.01f : 1.0f);
    if (st->sfa) {
        bench_fill_uniform(st->sfa, 53, 0.5f, 2.0f);
        bench_fill_uniform(st->sfb, 54, 0.5f, 2.0f);
    }
    w->state = st;
    w->out = p->kind == HC_PRENORM ? st->d_smp : *st->d;
    w->digest[0] = *st->d, w->digest[1] = *st->s, w->ndigest = 2;
    w->flops = flops;
    w->bytes = nb(st->a) + nb(st->sfa) + nb(st->b) + nb(st->sfb) + nb(st->d) + nb(st->s);
    return 0;
}

static dg_status hc_run(void *s) {
    hc_state *st = s;
    switch (st->p->kind) {
    case HC_PRENORM:
        if (dg_get_backend() == DG_BACKEND_REFERENCE) /* the sampled rows only */
            return dg_tf32_hc_prenorm_gemm(&st->a_smp, st->b, &st->d_smp, st->s_smp, (int)st->p->d3);
        return dg_tf32_hc_prenorm_gemm(st->a, st->b, st->d, st->s, (int)st->p->d3);
    case HC_MEGA_MHC: {
        dg_tensor *const *t = st->mt;
        dg_tensor v[MHC_USED];
        for (int i = 0; i < MHC_USED; ++i) /* the reference: the first tokens only */
            v[i] = dg_get_backend() == DG_BACKEND_REFERENCE ? st->ms[i] : *t[i];
        return dg_mega_mhc(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], 4, 1e-6f, 1e-6f, 2.0f, 1e-6f,
                           20, &v[8], 1e-6f, 1.0f, &v[9], &v[10], &v[11], &v[12], &v[13], &v[14], &v[15], NULL,
                           NULL, 0);
    }
    }
    return DG_ERR_INTERNAL;
}

#include "dgbench_einsum.inc" /* the einsum cases (EINSUM_CASES) */

/* SPEC 6's grid: M in {13, 137, 4096, 8192} x K in {7168, 7680, 28672}, with and without 16
 * K splits (N = 24). */
static const hc_params P[] = {
    {HC_PRENORM, 13, 24, 7168, 0},
    {HC_PRENORM, 13, 24, 7168, 16},
    {HC_PRENORM, 13, 24, 7680, 0},
    {HC_PRENORM, 13, 24, 7680, 16},
    {HC_PRENORM, 13, 24, 28672, 0},
    {HC_PRENORM, 13, 24, 28672, 16},
    {HC_PRENORM, 137, 24, 7168, 0},
    {HC_PRENORM, 137, 24, 7168, 16},
    {HC_PRENORM, 137, 24, 7680, 0},
    {HC_PRENORM, 137, 24, 7680, 16},
    {HC_PRENORM, 137, 24, 28672, 0},
    {HC_PRENORM, 137, 24, 28672, 16},
    {HC_PRENORM, 4096, 24, 7168, 0},
    {HC_PRENORM, 4096, 24, 7168, 16},
    {HC_PRENORM, 4096, 24, 7680, 0},
    {HC_PRENORM, 4096, 24, 7680, 16},
    {HC_PRENORM, 4096, 24, 28672, 0},
    {HC_PRENORM, 4096, 24, 28672, 16},
    {HC_PRENORM, 8192, 24, 7168, 0},
    {HC_PRENORM, 8192, 24, 7168, 16},
    {HC_PRENORM, 8192, 24, 7680, 0},
    {HC_PRENORM, 8192, 24, 7680, 16},
    {HC_PRENORM, 8192, 24, 28672, 0},
    {HC_PRENORM, 8192, 24, 28672, 16},
    {HC_MEGA_MHC, 1, 7168, 0, 0},
    {HC_MEGA_MHC, 16, 7168, 0, 0},
    {HC_MEGA_MHC, 4096, 7168, 0, 0},
    {HC_MEGA_MHC, 1, 4096, 0, 0},
};

#define CASE(name, i, lim) {name, lim, &P[i], hc_setup, hc_run, bench_pool_state_free}
static const bench_case CASES[] = {
    CASE("hc/tf32_prenorm/m13_k7168", 0, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m13_k7168_split16", 1, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m13_k7680", 2, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m13_k7680_split16", 3, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m13_k28672", 4, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m13_k28672_split16", 5, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m137_k7168", 6, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m137_k7168_split16", 7, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m137_k7680", 8, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m137_k7680_split16", 9, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m137_k28672", 10, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m137_k28672_split16", 11, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m4096_k7168", 12, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m4096_k7168_split16", 13, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m4096_k7680", 14, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m4096_k7680_split16", 15, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m4096_k28672", 16, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m4096_k28672_split16", 17, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m8192_k7168", 18, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m8192_k7168_split16", 19, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m8192_k7680", 20, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m8192_k7680_split16", 21, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m8192_k28672", 22, BENCH_LIMIT_FP32),
    CASE("hc/tf32_prenorm/m8192_k28672_split16", 23, BENCH_LIMIT_FP32),
    CASE("hc/mega_mhc/t1_h7168", 24, BENCH_LIMIT_FP32),
    CASE("hc/mega_mhc/t16_h7168", 25, BENCH_LIMIT_FP32),
    CASE("hc/mega_mhc/t4096_h7168", 26, BENCH_LIMIT_FP32),
    CASE("hc/mega_mhc/t1_h4096", 27, BENCH_LIMIT_FP32),
    EINSUM_CASES
};
#undef CASE

const bench_family bench_family_hc_einsum = {"hc_einsum", CASES, sizeof CASES / sizeof CASES[0]};
