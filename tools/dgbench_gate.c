/*
 * dgbench_gate.c - the Mega Gate cases (DeepGEMM 2.8's bf16_mega_gate): the router GEMM of a
 * DeepSeek layer (H = 7168, E = 256, top-8, sqrtsoftplus with the correction bias, one shared
 * expert as routed) at decoding sizes T in {1, 8, 64} and one prefill size, T = 4096.
 * At decoding sizes the call is memory-bound: %lim is the time to read the BF16 router weights
 * [E, H] (3.5 MiB) once at the measured bandwidth (they fit in a large last-level cache, so
 * repeated runs may beat it); the prefill case is bound by its BF16 FLOPs.
 * The compared output is topk_weights; --digest hashes topk_idx and topk_weights of one call
 * with H / 8 and T 1, 8, 64 or 300 (over the gate's thread split), scored as timed.
 */
#include "dgbench.h"

#include <stdio.h>

typedef struct gate_params {
    int64_t tokens, hidden, experts;
    int topk;
} gate_params;

typedef struct gate_state {
    bench_pool pool; /* first: freed by bench_pool_state_free */
    const gate_params *p;
    dg_tensor *x, *w, *bias, *idx, *wt;
    const char *scoring;
} gate_state;

static int gate_setup(const bench_case *c, int size, bench_work *w) {
    const gate_params *p = c->params;
    gate_state *st = bench_alloc(sizeof *st);
    if (!st)
        return -1;
    st->p = p;
    /* the scoring functions are the library's own (core/float_math.h), the same bits on every
     * machine of a level: the digest covers them too */
    st->scoring = "sqrtsoftplus";
    int64_t t = p->tokens, h = p->hidden;
    if (size == BENCH_SIZE_QUICK)
        t = t > 64 ? t / 8 : t;
    if (size == BENCH_SIZE_DIGEST)
        t = t > 64 ? 300 : t, h = h / 8 / 256 * 256 > 0 ? h / 8 / 256 * 256 : 256;
    bench_pool *pool = &st->pool;
    const int slots = p->topk + 1;
    st->x = bench_pool_new(pool, DG_BFLOAT16, 2, (int64_t[]){t, h});
    st->w = bench_pool_new(pool, DG_BFLOAT16, 2, (int64_t[]){p->experts, h});
    st->bias = bench_pool_new(pool, DG_FLOAT32, 1, (int64_t[]){p->experts});
    st->idx = bench_pool_new(pool, DG_INT64, 2, (int64_t[]){t, slots});
    st->wt = bench_pool_new(pool, DG_FLOAT32, 2, (int64_t[]){t, slots});
    if (pool->failed) {
        bench_pool_state_free(st);
        return -1;
    }
    bench_fill(st->x, 61, 1.0f);
    bench_fill(st->w, 62, 0.012f); /* about hidden^-0.5, as DeepGEMM's test scales the weights */
    bench_fill(st->bias, 63, 0.1f);
    w->state = st;
    w->out = *st->wt;
    w->digest[0] = *st->idx, w->digest[1] = *st->wt, w->ndigest = 2;
    w->flops = 2.0 * (double)t * (double)p->experts * (double)h;
    w->bytes = (double)(dg_tensor_nbytes(st->x) + dg_tensor_nbytes(st->w) + dg_tensor_nbytes(st->bias) +
                        dg_tensor_nbytes(st->idx) + dg_tensor_nbytes(st->wt));
    snprintf(w->shape, sizeof w->shape, "t=%lld h=%lld e=%lld topk=%d", (long long)t, (long long)h,
             (long long)p->experts, p->topk);
    return 0;
}

static dg_status gate_run(void *s) {
    gate_state *st = s;
    return dg_bf16_mega_gate(st->x, st->w, st->p->topk, 1, 1, 2.5f, 0, st->scoring, NULL, st->bias, NULL, NULL,
                             NULL, NULL, NULL, NULL, NULL, st->idx, st->wt);
}

static const gate_params P[] = {
    {1, 7168, 256, 8},
    {8, 7168, 256, 8},
    {64, 7168, 256, 8},
    {4096, 7168, 256, 8},
};

#define CASE(name, i, lim) {name, lim, &P[i], gate_setup, gate_run, bench_pool_state_free}
static const bench_case CASES[] = {
    CASE("gate/bf16_mega_gate/t1_h7168_e256", 0, BENCH_LIMIT_BF16),
    CASE("gate/bf16_mega_gate/t8_h7168_e256", 1, BENCH_LIMIT_BF16),
    CASE("gate/bf16_mega_gate/t64_h7168_e256", 2, BENCH_LIMIT_BF16),
    CASE("gate/bf16_mega_gate/t4096_h7168_e256", 3, BENCH_LIMIT_BF16),
};
#undef CASE

const bench_family bench_family_gate = {"gate", CASES, sizeof CASES / sizeof CASES[0]};
