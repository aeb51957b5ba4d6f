/*
 * dgbench_mqa.c - lightning-indexer logits (SPEC 5), H = 32 heads of D = 128:
 *
 *   fp8_logits        S = 64 query tokens over SK = 4096 kv rows, every row visible
 *   fp8_paged_logits  B = 32 sequences, next_n = 1, context 8192, block_kv = 64, identity
 *                     block table; schedule metadata computed once in setup
 *
 * FLOPs: 2 * H * D per (query, kv) pair (the head sum and weights are lower order). Bytes:
 * q, kv (with scales), weights read once, logits written once. Logits are float32.
 */
#include "dgbench.h"

#include <stdio.h>
#include <string.h>

enum { HEADS = 32, DIM = 128, BLOCK_KV = 64 };

typedef enum mqa_kind { MQA_FP8, MQA_FP8_PAGED } mqa_kind;

typedef struct mqa_params {
    mqa_kind kind;
    int64_t s, sk; /* paged: batch, context length */
} mqa_params;

typedef struct mqa_state {
    bench_pool pool; /* first: freed by bench_pool_state_free */
    const mqa_params *p;
    dg_tensor *q, *kv, *kv_sf, *weights, *ks, *ke, *logits;
    dg_tensor *cache, *lens, *table, *meta;
    int max_context;
} mqa_state;

static double nb(const dg_tensor *t) { return (double)dg_tensor_nbytes(t); }

static int setup_flat(mqa_state *st, int64_t s, int64_t sk, bench_work *w) {
    st->q = bench_pool_new(&st->pool, DG_FLOAT8_E4M3, 3, (int64_t[]){s, HEADS, DIM});
    st->kv = bench_pool_new(&st->pool, DG_FLOAT8_E4M3, 2, (int64_t[]){sk, DIM});
    st->kv_sf = bench_pool_new(&st->pool, DG_FLOAT32, 1, (int64_t[]){sk});
    st->weights = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){s, HEADS});
    st->ks = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){s});
    st->ke = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){s});
    st->logits = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){s, sk});
    if (st->pool.failed)
        return -1;
    bench_fill(st->q, 31, 1.0f);
    bench_fill(st->kv, 32, 1.0f);
    bench_fill_uniform(st->kv_sf, 33, 0.01f, 0.02f);
    bench_fill(st->weights, 34, 1.0f);
    for (int64_t i = 0; i < s; ++i) /* ks = 0 (zeroed), ke = SK: everything visible */
        ((int32_t *)st->ke->data)[i] = (int32_t)sk;
    w->flops = 2.0 * HEADS * DIM * (double)s * (double)sk;
    w->bytes = nb(st->q) + nb(st->kv) + nb(st->kv_sf) + nb(st->weights) + nb(st->logits);
    snprintf(w->shape, sizeof w->shape, "s=%lld sk=%lld h=%d d=%d", (long long)s, (long long)sk,
             HEADS, DIM);
    return 0;
}

/* Cache block layout: BLOCK_KV rows of DIM E4M3 bytes, then BLOCK_KV float32 scales. */
static int setup_paged(mqa_state *st, int64_t batch, int64_t ctx, bench_work *w) {
    const int64_t blocks_per_seq = (ctx + BLOCK_KV - 1) / BLOCK_KV, blocks = batch * blocks_per_seq;
    st->max_context = (int)ctx;
    st->q = bench_pool_new(&st->pool, DG_FLOAT8_E4M3, 4, (int64_t[]){batch, 1, HEADS, DIM});
    st->cache = bench_pool_new(&st->pool, DG_UINT8, 4, (int64_t[]){blocks, BLOCK_KV, 1, DIM + 4});
    st->weights = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){batch, HEADS});
    st->lens = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){batch});
    st->table = bench_pool_new(&st->pool, DG_INT32, 2, (int64_t[]){batch, blocks_per_seq});
    st->logits = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){batch, ctx});
    if (st->pool.failed)
        return -1;
    bench_fill(st->q, 41, 1.0f);
    bench_fill(st->weights, 42, 1.0f);
    for (int64_t b = 0; b < blocks; ++b) {
        uint8_t *blk = (uint8_t *)st->cache->data + b * BLOCK_KV * (DIM + 4);
        dg_tensor vals = dg_tensor_2d(blk, DG_FLOAT8_E4M3, BLOCK_KV, DIM);
        dg_tensor sf = dg_tensor_1d(blk + BLOCK_KV * DIM, DG_FLOAT32, BLOCK_KV);
        bench_fill(&vals, 43 + (uint64_t)b, 1.0f);
        bench_fill_uniform(&sf, 1000 + (uint64_t)b, 0.01f, 0.02f);
    }
    for (int64_t b = 0; b < batch; ++b) {
        ((int32_t *)st->lens->data)[b] = (int32_t)ctx;
        for (int64_t k = 0; k < blocks_per_seq; ++k)
            ((int32_t *)st->table->data)[b * blocks_per_seq + k] = (int32_t)(b * blocks_per_seq + k);
    }
    dg_tensor meta = {0};
    if (dg_get_paged_mqa_logits_metadata(st->lens, BLOCK_KV, dg_get_num_sms(), NULL, &meta) != DG_OK)
        return -1;
    st->meta = bench_pool_new(&st->pool, meta.dtype, meta.ndim, meta.shape);
    if (st->pool.failed ||
        dg_get_paged_mqa_logits_metadata(st->lens, BLOCK_KV, dg_get_num_sms(), NULL, st->meta) != DG_OK)
        return -1;
    w->flops = 2.0 * HEADS * DIM * (double)batch * (double)ctx;
    w->bytes = nb(st->q) + nb(st->cache) + nb(st->weights) + nb(st->logits);
    snprintf(w->shape, sizeof w->shape, "b=%lld ctx=%lld h=%d d=%d", (long long)batch,
             (long long)ctx, HEADS, DIM);
    return 0;
}

static int mqa_setup(const bench_case *c, int quick, bench_work *w) {
    const mqa_params *p = c->params;
    mqa_state *st = bench_alloc(sizeof *st);
    if (!st)
        return -1;
    st->p = p;
    const int64_t s = quick ? p->s / 4 : p->s, sk = quick ? p->sk / 4 : p->sk;
    const int rc = p->kind == MQA_FP8 ? setup_flat(st, s, sk, w) : setup_paged(st, s, sk, w);
    if (rc != 0) {
        bench_pool_state_free(st);
        return -1;
    }
    w->state = st;
    w->out = *st->logits;
    return 0;
}

static dg_status mqa_run(void *s) {
    mqa_state *st = s;
    if (st->p->kind == MQA_FP8)
        return dg_fp8_mqa_logits(st->q, st->kv, st->kv_sf, st->weights, st->ks, st->ke, 1, 0,
                                 st->logits);
    return dg_fp8_paged_mqa_logits(st->q, st->cache, st->weights, st->lens, st->table, st->meta,
                                   st->max_context, 0, NULL, st->logits);
}

static const mqa_params P[] = {
    {MQA_FP8, 64, 4096},
    {MQA_FP8_PAGED, 32, 8192},
};

#define CASE(name, i) {name, BENCH_LIMIT_BF16, &P[i], mqa_setup, mqa_run, bench_pool_state_free}
static const bench_case CASES[] = {
    CASE("mqa/fp8_logits/h32_d128", 0),
    CASE("mqa/fp8_paged_logits/h32_d128", 1),
};
#undef CASE

const bench_family bench_family_mqa = {"mqa", CASES, sizeof CASES / sizeof CASES[0]};
