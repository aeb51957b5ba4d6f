/*
 * dgbench_mega_moe.c - Mega MoE (SPEC 9), BF16 variant of the reference chain: R = 2 ranks
 * simulated in one process, E = 8 experts (4 per rank), top-2, hidden H = 512, intermediate
 * I = 256, T = 32 tokens per rank (DeepSeek's real sizes are far beyond the scalar reference).
 * Every token goes to two distinct experts chosen round-robin so that all ranks exchange tokens.
 * FLOPs: per routed token 2*H*2I (L1) + 2*I*H (L2). Bytes: x, both weight sets, y.
 * The compared output is y of all ranks (one [R*T, H] buffer; rank r's y is a row slice).
 * --quick: T / 4; --digest: T = 2.
 */
#include "dgbench.h"

#include <math.h>
#include <stdio.h>

enum { RANKS = 2, EXPERTS = 8, TOPK = 2 };

typedef struct moe_params {
    int64_t tokens, hidden, inter;
} moe_params;

typedef struct moe_state {
    bench_pool pool; /* first: freed by bench_pool_state_free */
    dg_tensor *x[RANKS], *idx[RANKS], *wts[RANKS], *l1[RANKS], *l2[RANKS], *y_all;
    dg_tensor y[RANKS];
    const dg_tensor *cx[RANKS], *cidx[RANKS], *cwts[RANKS], *cl1[RANKS], *cl2[RANKS], *cy[RANKS];
} moe_state;

static int moe_setup(const bench_case *c, int size, bench_work *w) {
    const moe_params *p = c->params;
    const int64_t t = size == BENCH_SIZE_DIGEST ? 2 : size ? p->tokens / 4 : p->tokens, h = p->hidden, in = p->inter;
    const int64_t local = EXPERTS / RANKS;
    moe_state *st = bench_alloc(sizeof *st);
    if (!st)
        return -1;
    st->y_all = bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){RANKS * t, h});
    for (int r = 0; r < RANKS; ++r) {
        st->x[r] = bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){t, h});
        st->idx[r] = bench_pool_new(&st->pool, DG_INT32, 2, (int64_t[]){t, TOPK});
        st->wts[r] = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){t, TOPK});
        st->l1[r] = bench_pool_new(&st->pool, DG_BFLOAT16, 3, (int64_t[]){local, 2 * in, h});
        st->l2[r] = bench_pool_new(&st->pool, DG_BFLOAT16, 3, (int64_t[]){local, h, in});
    }
    if (st->pool.failed) {
        bench_pool_state_free(st);
        return -1;
    }
    double bytes = (double)dg_tensor_nbytes(st->y_all);
    for (int r = 0; r < RANKS; ++r) {
        bench_fill(st->x[r], 61 + r, 1.0f);
        bench_fill(st->l1[r], 71 + r, 0.05f);
        bench_fill(st->l2[r], 81 + r, 0.05f);
        bench_fill_uniform(st->wts[r], 91 + r, 0.1f, 1.0f);
        for (int64_t i = 0; i < t; ++i)
            for (int j = 0; j < TOPK; ++j)
                ((int32_t *)st->idx[r]->data)[i * TOPK + j] = (int32_t)((i + r + 3 * j) % EXPERTS);
        st->y[r] = dg_tensor_2d((uint16_t *)st->y_all->data + r * t * h, DG_BFLOAT16, t, h);
        st->cx[r] = st->x[r], st->cidx[r] = st->idx[r], st->cwts[r] = st->wts[r];
        st->cl1[r] = st->l1[r], st->cl2[r] = st->l2[r], st->cy[r] = &st->y[r];
        bytes += (double)(dg_tensor_nbytes(st->x[r]) + dg_tensor_nbytes(st->l1[r]) +
                          dg_tensor_nbytes(st->l2[r]));
    }
    const double routed = (double)RANKS * (double)t * TOPK;
    w->state = st;
    w->out = *st->y_all;
    w->flops = routed * (2.0 * (double)h * 2 * (double)in + 2.0 * (double)in * (double)h);
    w->bytes = bytes;
    snprintf(w->shape, sizeof w->shape, "r=%d e=%d t=%lld h=%lld i=%lld", RANKS, EXPERTS,
             (long long)t, (long long)h, (long long)in);
    return 0;
}

static dg_status moe_run(void *s) {
    moe_state *st = s;
    return dg_bf16_mega_moe_reference(RANKS, EXPERTS, st->cx, st->cidx, st->cwts, st->cl1, st->cl2,
                                      st->cy, NULL, INFINITY);
}

static const moe_params P[] = {{32, 512, 256}};

static const bench_case CASES[] = {
    {"mega_moe/bf16_reference/h512_i256", BENCH_LIMIT_BF16, &P[0], moe_setup, moe_run,
     bench_pool_state_free},
};

const bench_family bench_family_mega_moe = {"mega_moe", CASES, sizeof CASES / sizeof CASES[0]};
