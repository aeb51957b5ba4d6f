/*
 * dgbench_quant.c - quantization helpers (SPEC 2) on an activation of K = 7168:
 *
 *   quant/per_token_fp8   x BF16 [M, K] -> E4M3 [M, K] with 1x128 float32 scales
 *   quant/per_block_fp8   x BF16 [M, K] -> E4M3 [M, K] with 128x128 float32 scales
 *
 * Memory-bound: bytes = x read once, data and scales written once; no FLOPs counted.
 * The compared output is the E4M3 data; --digest (M = 136: a tail of a 128-row block) hashes it
 * and the scales.
 */
#include "dgbench.h"

#include <stdio.h>

typedef enum quant_kind { Q_PER_TOKEN, Q_PER_BLOCK } quant_kind;

typedef struct quant_params {
    quant_kind kind;
    int64_t m, k;
} quant_params;

typedef struct quant_state {
    bench_pool pool; /* first: freed by bench_pool_state_free */
    const quant_params *p;
    dg_tensor *x, *out, *sf;
} quant_state;

static int quant_setup(const bench_case *c, int size, bench_work *w) {
    const quant_params *p = c->params;
    const int64_t m = size == BENCH_SIZE_DIGEST ? 136 : size ? p->m / 8 : p->m, k = p->k;
    const int64_t sf_rows = p->kind == Q_PER_TOKEN ? m : (m + 127) / 128;
    quant_state *st = bench_alloc(sizeof *st);
    if (!st)
        return -1;
    st->p = p;
    st->x = bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){m, k});
    st->out = bench_pool_new(&st->pool, DG_FLOAT8_E4M3, 2, (int64_t[]){m, k});
    st->sf = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){sf_rows, (k + 127) / 128});
    if (st->pool.failed) {
        bench_pool_state_free(st);
        return -1;
    }
    bench_fill(st->x, 101, 1.0f);
    w->state = st;
    w->out = *st->out;
    w->digest[0] = *st->out, w->digest[1] = *st->sf, w->ndigest = 2;
    w->flops = 0;
    w->bytes = (double)(dg_tensor_nbytes(st->x) + dg_tensor_nbytes(st->out) + dg_tensor_nbytes(st->sf));
    snprintf(w->shape, sizeof w->shape, "m=%lld k=%lld", (long long)m, (long long)k);
    return 0;
}

static dg_status quant_run(void *s) {
    quant_state *st = s;
    if (st->p->kind == Q_PER_TOKEN)
        return dg_per_token_cast_to_fp8(st->x, 0, 128, 0, st->out, st->sf);
    return dg_per_block_cast_to_fp8(st->x, 0, 128, st->out, st->sf);
}

static const quant_params P[] = {
    {Q_PER_TOKEN, 1024, 7168},
    {Q_PER_BLOCK, 1024, 7168},
};

#define CASE(name, i) {name, BENCH_LIMIT_DRAM, &P[i], quant_setup, quant_run, bench_pool_state_free}
static const bench_case CASES[] = {
    CASE("quant/per_token_fp8/k7168", 0),
    CASE("quant/per_block_fp8/k7168", 1),
};
#undef CASE

const bench_family bench_family_quant = {"quant", CASES, sizeof CASES / sizeof CASES[0]};
