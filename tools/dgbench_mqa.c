/*
 * dgbench_mqa.c - lightning-indexer logits (SPEC 5), DeepSeek V3.2's shape H = 64, D = 128:
 *
 *   fp8_logits / fp4_logits   prefill: S query tokens against SK kv rows with causal ranges
 *                             [0, SK - S + i + 1) (DeepGEMM's test layout), clean_logits = 1
 *   fp8_paged / fp4_paged     decode: B sequences, next_n 1 or 2, block_kv = 64, contexts
 *                             8192 - (b * 37 mod 512), shuffled block table, clean_logits = 1
 *   mxfp8_logits              prefill as fp8_logits with DeepGEMM 2.8's MXFP8 (E4M3 q and kv,
 *                             per-32 UE8M0 scales packed in int32 words)
 *   fp4_sparse / fp4_paged_sparse   DeepGEMM 2.8's sparse indexer at its shape H = 32, D = 128,
 *                             MXFP4, BF16 weights and logits, 16-token blocks: each query scores
 *                             at most N blocks (sorted, spread over its causal range); paged:
 *                             requests of 4 queries, pages of 64, one shuffled table
 *   mxfp8_sparse              the contiguous sparse case with MXFP8 inputs
 *
 * FLOPs: 2 * H * D per valid (query, kv) pair (the head sum and weights are lower order). The
 * limit is the BF16 one (dgbench takes the larger of VDPBF16PS and FP32 FMA: E4M3 products are
 * exact in FP32), INT8 (VPDPBUSD) for the FP4 cases. MXFP8 runs on the FP32 FMA tile (the BF16
 * limit as FP8).
 * Bytes: q, kv (with scales) and weights read once, logits written once; for paged decode the
 * kv term is the cache blocks actually read, so the GB/s column is close to the KV-cache rate.
 *
 * The reference backend (double sums) would take minutes on these shapes, so the compared
 * output is a sample: 16 query rows (prefill) or 4 sequences (paged). The default backend
 * computes the whole problem and then copies the sample rows out (a negligible copy); the
 * reference backend computes only the sample rows, through views of the same inputs.
 * --digest hashes all logits of one call: prefill S = 4 against SK / 8 kv rows (256 to 1024:
 * one or two kv chunks), paged B / 16 sequences (at most 8) of contexts 384 - (b * 37 mod 512).
 */
#include "dgbench.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { HEADS = 64, DIM = 128, BLOCK_KV = 64, PREFILL_SAMPLE = 16, PAGED_SAMPLE = 4 };
enum { SPARSE_HEADS = 32, SPARSE_BLK = 16, SPARSE_PAGE = 64, SPARSE_REQ = 4 };

typedef enum mqa_kind { MQA_PREFILL, MQA_PAGED, MQA_SPARSE, MQA_PAGED_SPARSE } mqa_kind;

enum { FMT_FP8 = 0, FMT_FP4 = 1, FMT_MXFP8 = 2 }; /* MXFP4 is "fp4" in the case names */

typedef struct mqa_params {
    mqa_kind kind;
    int fmt;
    int64_t s, sk;  /* prefill: tokens, kv rows; paged: batch, max context; sparse: queries, kv rows */
    int64_t next_n; /* paged: next_n; sparse: N, the blocks per query */
} mqa_params;

typedef struct mqa_state {
    bench_pool pool; /* first: freed by bench_pool_state_free */
    const mqa_params *p;
    int64_t rows, nsample, sample_stride; /* sampled units: every sample_stride-th token/sequence */
    dg_tensor *q, *q_sf, *kv, *kv_sf, *weights, *ks, *ke, *logits, *sample;
    dg_tensor *cache, *lens, *table, *meta, *sample_meta;
    dg_tensor *indices, *req; /* sparse */
    int max_context;
} mqa_state;

static double nb(const dg_tensor *t) { return t ? (double)dg_tensor_nbytes(t) : 0.0; }

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Packed UE8M0 words with exponents near 2^0 (|E2M1| * scale stays O(1)). */
static void fill_sf_words(uint8_t *p, size_t words, uint64_t seed) {
    for (size_t i = 0; i < 4 * words; ++i)
        p[i] = (uint8_t)(124 + mix(&seed) % 5);
}

/* Rows [r, r + n) of a tensor along dim 0 (same strides). */
static dg_tensor rows_view(const dg_tensor *t, int64_t r, int64_t n) {
    dg_tensor v = *t;
    v.data = (char *)t->data + r * t->strides[0] * (int64_t)dg_dtype_size(t->dtype);
    v.shape[0] = n;
    return v;
}

static int setup_prefill(mqa_state *st, int64_t s, int64_t sk, bench_work *w) {
    const int fp4 = st->p->fmt == FMT_FP4, mx = st->p->fmt != FMT_FP8;
    const dg_dtype dt = fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3;
    const int64_t db = fp4 ? DIM / 2 : DIM;
    st->q = bench_pool_new(&st->pool, dt, 3, (int64_t[]){s, HEADS, db});
    st->kv = bench_pool_new(&st->pool, dt, 2, (int64_t[]){sk, db});
    st->kv_sf = bench_pool_new(&st->pool, mx ? DG_INT32 : DG_FLOAT32, 1, (int64_t[]){sk});
    if (mx)
        st->q_sf = bench_pool_new(&st->pool, DG_INT32, 2, (int64_t[]){s, HEADS});
    st->weights = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){s, HEADS});
    st->ks = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){s});
    st->ke = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){s});
    st->logits = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){s, sk});
    st->nsample = PREFILL_SAMPLE < s ? PREFILL_SAMPLE : s;
    st->sample_stride = s / st->nsample;
    st->sample = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){st->nsample, sk});
    if (st->pool.failed)
        return -1;
    bench_fill(st->q, 31, 1.0f);
    bench_fill(st->kv, 32, 1.0f);
    if (mx) {
        fill_sf_words(st->q_sf->data, (size_t)(s * HEADS), 35);
        fill_sf_words(st->kv_sf->data, (size_t)sk, 36);
    } else {
        bench_fill_uniform(st->kv_sf, 33, 0.01f, 0.02f);
    }
    bench_fill(st->weights, 34, 1.0f);
    double pairs = 0;
    for (int64_t i = 0; i < s; ++i) { /* ks = 0 (zeroed), causal end */
        ((int32_t *)st->ke->data)[i] = (int32_t)(sk - s + i + 1);
        pairs += (double)(sk - s + i + 1);
    }
    w->flops = 2.0 * HEADS * DIM * pairs;
    w->bytes = nb(st->q) + nb(st->q_sf) + nb(st->kv) + nb(st->kv_sf) + nb(st->weights) + nb(st->logits);
    snprintf(w->shape, sizeof w->shape, "s=%lld sk=%lld causal", (long long)s, (long long)sk);
    return 0;
}

static int64_t paged_ctx(int64_t b, int64_t max_ctx) { return max_ctx - (b * 37) % 512; }

/* Cache block: BLOCK_KV rows of values, then BLOCK_KV 4-byte scales. */
static int setup_paged(mqa_state *st, int64_t batch, int64_t ctx, bench_work *w) {
    const int fp4 = st->p->fmt == FMT_FP4; /* the paged cases are FP8 or MXFP4 */
    const int64_t nn = st->p->next_n, db = fp4 ? DIM / 2 : DIM, row = db + 4;
    const int64_t per_seq = (ctx + BLOCK_KV - 1) / BLOCK_KV, blocks = batch * per_seq;
    st->max_context = (int)ctx;
    st->q = bench_pool_new(&st->pool, fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, 4, (int64_t[]){batch, nn, HEADS, db});
    if (fp4)
        st->q_sf = bench_pool_new(&st->pool, DG_INT32, 3, (int64_t[]){batch, nn, HEADS});
    st->cache = bench_pool_new(&st->pool, DG_UINT8, 4, (int64_t[]){blocks, BLOCK_KV, 1, row});
    st->weights = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){batch * nn, HEADS});
    st->lens = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){batch});
    st->table = bench_pool_new(&st->pool, DG_INT32, 2, (int64_t[]){batch, per_seq});
    st->logits = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){batch * nn, ctx});
    st->nsample = PAGED_SAMPLE < batch ? PAGED_SAMPLE : batch;
    st->sample_stride = batch / st->nsample;
    st->sample = bench_pool_new(&st->pool, DG_FLOAT32, 2, (int64_t[]){st->nsample * nn, ctx});
    if (st->pool.failed)
        return -1;
    bench_fill(st->q, 41, 1.0f);
    if (fp4)
        fill_sf_words(st->q_sf->data, (size_t)(batch * nn * HEADS), 45);
    bench_fill(st->weights, 42, 1.0f);
    for (int64_t b = 0; b < blocks; ++b) {
        uint8_t *blk = (uint8_t *)st->cache->data + b * BLOCK_KV * row;
        dg_tensor vals = dg_tensor_2d(blk, fp4 ? DG_UINT8 : DG_FLOAT8_E4M3, BLOCK_KV, db);
        bench_fill(&vals, 43 + (uint64_t)b, 1.0f);
        if (fp4) {
            fill_sf_words(blk + BLOCK_KV * db, BLOCK_KV, 1000 + (uint64_t)b);
        } else {
            dg_tensor sf = dg_tensor_1d(blk + BLOCK_KV * db, DG_FLOAT32, BLOCK_KV);
            bench_fill_uniform(&sf, 1000 + (uint64_t)b, 0.01f, 0.02f);
        }
    }
    /* Block table: a random permutation of all blocks (the cache is scattered). */
    int32_t *tab = st->table->data;
    for (int64_t i = 0; i < blocks; ++i)
        tab[i] = (int32_t)i;
    uint64_t seed = 77;
    for (int64_t i = blocks - 1; i > 0; --i) {
        const int64_t j = (int64_t)(mix(&seed) % (uint64_t)(i + 1));
        const int32_t t = tab[i];
        tab[i] = tab[j], tab[j] = t;
    }
    double pairs = 0, kv_bytes = 0;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t c = paged_ctx(b, ctx);
        ((int32_t *)st->lens->data)[b] = (int32_t)c;
        for (int64_t t = 0; t < nn; ++t)
            pairs += (double)(c - nn + t + 1);
        kv_bytes += (double)(c * row);
    }
    /* Metadata for the whole batch and for each sampled sequence alone. */
    const int sms = dg_get_num_sms();
    st->meta = bench_pool_new(&st->pool, DG_INT32, 2, (int64_t[]){sms + 1, 2});
    st->sample_meta = bench_pool_new(&st->pool, DG_INT32, 3, (int64_t[]){st->nsample, sms + 1, 2});
    if (st->pool.failed || dg_get_paged_mqa_logits_metadata(st->lens, BLOCK_KV, sms, NULL, st->meta) != DG_OK)
        return -1;
    for (int64_t k = 0; k < st->nsample; ++k) {
        dg_tensor lens = rows_view(st->lens, k * st->sample_stride, 1);
        dg_tensor meta = dg_tensor_2d((int32_t *)st->sample_meta->data + k * (sms + 1) * 2, DG_INT32, sms + 1, 2);
        if (dg_get_paged_mqa_logits_metadata(&lens, BLOCK_KV, sms, NULL, &meta) != DG_OK)
            return -1;
    }
    w->flops = 2.0 * HEADS * DIM * pairs;
    w->bytes = nb(st->q) + nb(st->q_sf) + kv_bytes + nb(st->weights) + nb(st->logits);
    snprintf(w->shape, sizeof w->shape, "b=%lld n=%lld ctx<=%lld kv=%.0fMB", (long long)batch, (long long)nn,
             (long long)ctx, kv_bytes / 1e6);
    return 0;
}

/* ---- sparse indexer ------------------------------------------------------------------------ */

/* Row i's range: contiguous [0, sk - s + i + 1) (causal); paged: request r = i / 4 has context
 * sk - (r * 37 mod 512), its queries one more each. Blocks: min(N, ceil(len / 16)) of them,
 * a sorted random subset (selection sampling). */
static int64_t sparse_len(const mqa_params *p, int64_t s, int64_t sk, int64_t i) {
    if (p->kind == MQA_SPARSE)
        return sk - s + i + 1;
    return sk - ((i / SPARSE_REQ) * 37) % 512 + i % SPARSE_REQ;
}

static void sparse_blocks(int32_t *row, int64_t n, int64_t len, uint64_t seed) {
    const int64_t avail = (len + SPARSE_BLK - 1) / SPARSE_BLK, nb = avail < n ? avail : n;
    int64_t got = 0;
    for (int64_t b = 0; b < avail && got < nb; ++b)
        if ((int64_t)(mix(&seed) % (uint64_t)(avail - b)) < nb - got)
            row[got++] = (int32_t)b;
    for (int64_t j = got; j < n; ++j)
        row[j] = got ? row[got - 1] : 0;
}

/* Metadata of rows [r, r + n) into `meta` (query form first when meta->data is NULL). */
static dg_status sparse_meta(mqa_state *st, int64_t r, int64_t n, dg_tensor *meta) {
    dg_tensor idx = rows_view(st->indices, r, n);
    if (st->p->kind == MQA_SPARSE) {
        dg_tensor ks = rows_view(st->ks, r, n), ke = rows_view(st->ke, r, n);
        return dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)st->kv->shape[0], &idx, st->q->dtype, SPARSE_BLK,
                                                 0, meta);
    }
    dg_tensor lens = rows_view(st->lens, r, n), table = rows_view(st->table, r, n), req = rows_view(st->req, r, n);
    return dg_get_paged_sparse_mqa_logits_metadata(&lens, &table, &req, SPARSE_PAGE, &idx, st->q->dtype,
                                                   SPARSE_BLK, meta);
}

static int setup_sparse(mqa_state *st, int64_t s, int64_t sk, bench_work *w) {
    const mqa_params *p = st->p;
    const int paged = p->kind == MQA_PAGED_SPARSE;
    const dg_dtype dt = p->fmt == FMT_FP4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3; /* MXFP4 or MXFP8 */
    const int64_t n = p->next_n, db = p->fmt == FMT_FP4 ? DIM / 2 : DIM, h = SPARSE_HEADS;
    const int64_t nreq = (s + SPARSE_REQ - 1) / SPARSE_REQ;
    const int64_t per_req = (sk + SPARSE_REQ + SPARSE_PAGE - 1) / SPARSE_PAGE, pages = nreq * per_req;
    st->q = bench_pool_new(&st->pool, dt, paged ? 4 : 3,
                           paged ? (int64_t[]){s, 1, h, db} : (int64_t[]){s, h, db});
    st->q_sf = bench_pool_new(&st->pool, DG_INT32, paged ? 3 : 2, paged ? (int64_t[]){s, 1, h} : (int64_t[]){s, h});
    st->weights = bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){s, h});
    st->indices = bench_pool_new(&st->pool, DG_INT32, 2, (int64_t[]){s, n});
    st->logits = bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){s, n * SPARSE_BLK});
    if (paged) {
        st->cache = bench_pool_new(&st->pool, DG_UINT8, 4, (int64_t[]){pages, SPARSE_PAGE, 1, db + 4});
        st->lens = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){s});
        st->req = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){s});
        st->table = bench_pool_new(&st->pool, DG_INT32, 2, (int64_t[]){s, per_req});
    } else {
        st->kv = bench_pool_new(&st->pool, dt, 2, (int64_t[]){sk, db});
        st->kv_sf = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){sk});
        st->ks = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){s});
        st->ke = bench_pool_new(&st->pool, DG_INT32, 1, (int64_t[]){s});
    }
    st->nsample = PREFILL_SAMPLE < s ? PREFILL_SAMPLE : s;
    st->sample_stride = s / st->nsample;
    st->sample = bench_pool_new(&st->pool, DG_BFLOAT16, 2, (int64_t[]){st->nsample, n * SPARSE_BLK});
    if (st->pool.failed)
        return -1;
    bench_fill(st->q, 51, 1.0f);
    fill_sf_words(st->q_sf->data, (size_t)(s * h), 52);
    bench_fill(st->weights, 53, 1.0f);
    if (paged) {
        const int64_t row = db + 4;
        const dg_dtype vdt = db == DIM ? DG_FLOAT8_E4M3 : DG_UINT8;
        dg_tensor vals = dg_tensor_2d(st->cache->data, vdt, pages * SPARSE_PAGE, row);
        bench_fill(&vals, 54, 1.0f);
        for (int64_t pg = 0; pg < pages; ++pg)
            fill_sf_words((uint8_t *)st->cache->data + pg * SPARSE_PAGE * row + SPARSE_PAGE * db, SPARSE_PAGE,
                          2000 + (uint64_t)pg);
        int32_t *perm = bench_alloc((size_t)pages * sizeof(int32_t));
        if (!perm)
            return -1;
        for (int64_t i = 0; i < pages; ++i)
            perm[i] = (int32_t)i;
        uint64_t seed = 78;
        for (int64_t i = pages - 1; i > 0; --i) {
            const int64_t j = (int64_t)(mix(&seed) % (uint64_t)(i + 1));
            const int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int64_t i = 0; i < s; ++i) { /* a request's queries share its pages */
            memcpy((int32_t *)st->table->data + i * per_req, perm + (i / SPARSE_REQ) * per_req,
                   (size_t)per_req * sizeof(int32_t));
            ((int32_t *)st->req->data)[i] = (int32_t)(i / SPARSE_REQ);
            ((int32_t *)st->lens->data)[i] = (int32_t)sparse_len(p, s, sk, i);
        }
        bench_free(perm);
    } else {
        bench_fill(st->kv, 55, 1.0f);
        fill_sf_words(st->kv_sf->data, (size_t)sk, 56);
        for (int64_t i = 0; i < s; ++i)
            ((int32_t *)st->ke->data)[i] = (int32_t)sparse_len(p, s, sk, i);
    }
    double pairs = 0, kv_bytes = 0;
    for (int64_t i = 0; i < s; ++i) {
        const int64_t len = sparse_len(p, s, sk, i), nb = (len + SPARSE_BLK - 1) / SPARSE_BLK;
        sparse_blocks((int32_t *)st->indices->data + i * n, n, len, 3000 + (uint64_t)i);
        const int64_t toks = (nb < n ? nb : n) * SPARSE_BLK;
        pairs += (double)(toks < len ? toks : len);
    }
    kv_bytes = pairs * (db + 4); /* an upper bound: blocks shared by queries are read once */
    dg_tensor q = {.data = NULL};
    if (sparse_meta(st, 0, s, &q) != DG_OK)
        return -1;
    st->meta = bench_pool_new(&st->pool, DG_UINT8, 1, q.shape);
    dg_tensor q1 = {.data = NULL};
    if (st->pool.failed || sparse_meta(st, 0, 1, &q1) != DG_OK)
        return -1;
    st->sample_meta = bench_pool_new(&st->pool, DG_UINT8, 2, (int64_t[]){st->nsample, q1.shape[0]});
    if (st->pool.failed || sparse_meta(st, 0, s, st->meta) != DG_OK)
        return -1;
    for (int64_t k = 0; k < st->nsample; ++k) {
        dg_tensor m = dg_tensor_1d((uint8_t *)st->sample_meta->data + k * q1.shape[0], DG_UINT8, q1.shape[0]);
        if (sparse_meta(st, k * st->sample_stride, 1, &m) != DG_OK)
            return -1;
    }
    w->flops = 2.0 * h * DIM * pairs;
    w->bytes = nb(st->q) + nb(st->q_sf) + kv_bytes + nb(st->weights) + nb(st->logits) + nb(st->meta);
    snprintf(w->shape, sizeof w->shape, "s=%lld sk=%lld blocks=%lldx%d%s", (long long)s, (long long)sk,
             (long long)n, SPARSE_BLK, paged ? " paged" : "");
    return 0;
}

static dg_status run_sparse_rows(mqa_state *st, int64_t r, int64_t n, const dg_tensor *meta, dg_tensor *logits) {
    dg_tensor q = rows_view(st->q, r, n), qsf = rows_view(st->q_sf, r, n), w = rows_view(st->weights, r, n);
    const int nmsb = (int)st->p->next_n;
    if (st->p->kind == MQA_SPARSE)
        return dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, st->kv, st->kv_sf, &w, meta, nmsb, SPARSE_BLK, 0, logits);
    return dg_fp8_fp4_paged_sparse_mqa_logits(&q, &qsf, st->cache, &w, meta, nmsb, SPARSE_BLK, logits);
}

/* The -inf of unscored columns become 0 (calc_diff), as zero_masked does for float32. */
static void zero_masked_bf16(dg_tensor *t) {
    for (int64_t i = 0; i < t->shape[0]; ++i)
        for (int64_t j = 0; j < t->shape[1]; ++j) {
            uint16_t *v = (uint16_t *)t->data + i * t->strides[0] + j;
            if (*v == 0xff80)
                *v = 0;
        }
}

static dg_status sparse_run(mqa_state *st) {
    if (dg_get_backend() == DG_BACKEND_REFERENCE) { /* only the sample */
        const int64_t mb = st->sample_meta->shape[1];
        for (int64_t k = 0; k < st->nsample; ++k) {
            dg_tensor out = rows_view(st->sample, k, 1);
            dg_tensor m = dg_tensor_1d((uint8_t *)st->sample_meta->data + k * mb, DG_UINT8, mb);
            const dg_status rc = run_sparse_rows(st, k * st->sample_stride, 1, &m, &out);
            if (rc != DG_OK)
                return rc;
        }
    } else {
        const dg_status rc = run_sparse_rows(st, 0, st->q->shape[0], st->meta, st->logits);
        if (rc != DG_OK)
            return rc;
        const size_t row_bytes = (size_t)st->sample->shape[1] * 2;
        for (int64_t k = 0; k < st->nsample; ++k)
            memcpy((uint16_t *)st->sample->data + k * st->sample->strides[0],
                   (uint16_t *)st->logits->data + k * st->sample_stride * st->logits->strides[0], row_bytes);
    }
    zero_masked_bf16(st->sample);
    return DG_OK;
}

static int mqa_setup(const bench_case *c, int size, bench_work *w) {
    const mqa_params *p = c->params;
    mqa_state *st = bench_alloc(sizeof *st);
    if (!st)
        return -1;
    st->p = p;
    int64_t s = size ? p->s / 4 : p->s, sk = size ? p->sk / 4 : p->sk;
    if (size == BENCH_SIZE_DIGEST && p->kind == MQA_PREFILL)
        s = 4, sk = p->sk / 8;
    else if (size == BENCH_SIZE_DIGEST)
        s = p->s / 16 < 8 ? p->s / 16 : 8, sk = 384;
    if (size == BENCH_SIZE_DIGEST && p->kind >= MQA_SPARSE)
        s = 6, sk = 700;
    const int rc = p->kind == MQA_PREFILL ? setup_prefill(st, s, sk, w)
                   : p->kind == MQA_PAGED ? setup_paged(st, s, sk, w)
                                          : setup_sparse(st, s, sk, w);
    if (rc != 0) {
        bench_pool_state_free(st);
        return -1;
    }
    w->state = st;
    w->out = *st->sample;
    w->digest[0] = *st->logits, w->ndigest = 1;
    return 0;
}

static dg_status run_prefill_rows(mqa_state *st, int64_t i, int64_t n, dg_tensor *logits) {
    dg_tensor q = rows_view(st->q, i, n), w = rows_view(st->weights, i, n);
    dg_tensor ks = rows_view(st->ks, i, n), ke = rows_view(st->ke, i, n);
    dg_tensor qsf = st->q_sf ? rows_view(st->q_sf, i, n) : (dg_tensor){0};
    return dg_fp8_fp4_mqa_logits(&q, st->q_sf ? &qsf : NULL, st->kv, st->kv_sf, &w, &ks, &ke, 1, 0, logits);
}

static dg_status run_paged_seqs(mqa_state *st, int64_t b, int64_t n, const dg_tensor *meta, dg_tensor *logits) {
    const int64_t nn = st->p->next_n;
    dg_tensor q = rows_view(st->q, b, n), w = rows_view(st->weights, b * nn, n * nn);
    dg_tensor lens = rows_view(st->lens, b, n), table = rows_view(st->table, b, n);
    dg_tensor qsf = st->q_sf ? rows_view(st->q_sf, b, n) : (dg_tensor){0};
    return dg_fp8_fp4_paged_mqa_logits(&q, st->q_sf ? &qsf : NULL, st->cache, &w, &lens, &table, meta,
                                       st->max_context, 1, NULL, logits);
}

/* calc_diff cannot take infinities: the masked (-inf) entries of the sample become 0 in both
 * backends' outputs (a wrongly masked or unmasked entry still shows up as a difference). */
static void zero_masked(dg_tensor *t) {
    for (int64_t i = 0; i < t->shape[0]; ++i)
        for (int64_t j = 0; j < t->shape[1]; ++j) {
            float *v = (float *)t->data + i * t->strides[0] + j;
            if (*v == -INFINITY)
                *v = 0.0f;
        }
}

static dg_status mqa_run(void *s) {
    mqa_state *st = s;
    if (st->p->kind >= MQA_SPARSE)
        return sparse_run(st);
    const int paged = st->p->kind == MQA_PAGED;
    const int64_t per = paged ? st->p->next_n : 1; /* logits rows per sampled unit */
    if (dg_get_backend() == DG_BACKEND_REFERENCE) { /* only the sample */
        const int sms = dg_get_num_sms();
        for (int64_t k = 0; k < st->nsample; ++k) {
            dg_tensor out = rows_view(st->sample, k * per, per);
            const int64_t u = k * st->sample_stride;
            dg_status rc;
            if (paged) {
                dg_tensor meta = dg_tensor_2d((int32_t *)st->sample_meta->data + k * (sms + 1) * 2, DG_INT32,
                                              sms + 1, 2);
                rc = run_paged_seqs(st, u, 1, &meta, &out);
            } else {
                rc = run_prefill_rows(st, u, 1, &out);
            }
            if (rc != DG_OK)
                return rc;
        }
        zero_masked(st->sample);
        return DG_OK;
    }
    const dg_status rc = paged ? run_paged_seqs(st, 0, st->q->shape[0], st->meta, st->logits)
                               : run_prefill_rows(st, 0, st->q->shape[0], st->logits);
    if (rc != DG_OK)
        return rc;
    const size_t row_bytes = (size_t)st->sample->shape[1] * sizeof(float);
    for (int64_t k = 0; k < st->nsample; ++k)
        for (int64_t t = 0; t < per; ++t)
            memcpy((float *)st->sample->data + (k * per + t) * st->sample->strides[0],
                   (float *)st->logits->data + (k * st->sample_stride * per + t) * st->logits->strides[0], row_bytes);
    zero_masked(st->sample);
    return DG_OK;
}

static const mqa_params P[] = {
    {MQA_PREFILL, 0, 2048, 2048, 0}, {MQA_PREFILL, 0, 2048, 4096, 0}, {MQA_PREFILL, 0, 2048, 8192, 0},
    {MQA_PREFILL, 1, 2048, 4096, 0}, {MQA_PAGED, 0, 64, 8192, 1},     {MQA_PAGED, 0, 64, 8192, 2},
    {MQA_PAGED, 0, 256, 8192, 1},    {MQA_PAGED, 0, 128, 8192, 2},    {MQA_PAGED, 1, 64, 8192, 1},
    {MQA_PAGED, 1, 64, 8192, 2},     {MQA_SPARSE, 1, 512, 32768, 512}, {MQA_PAGED_SPARSE, 1, 512, 8192, 512},
    {MQA_PREFILL, 2, 2048, 4096, 0}, {MQA_SPARSE, 2, 512, 32768, 512},
};

/* FP4 x FP4 runs on integer dot products (VPDPBUSD): measured against the INT8 limit. */
#define CASE(name, i, lim) {name, BENCH_LIMIT_##lim, &P[i], mqa_setup, mqa_run, bench_pool_state_free}
static const bench_case CASES[] = {
    CASE("mqa/fp8_logits/h64_d128_s2048_sk2048", 0, BF16), CASE("mqa/fp8_logits/h64_d128_s2048_sk4096", 1, BF16),
    CASE("mqa/fp8_logits/h64_d128_s2048_sk8192", 2, BF16), CASE("mqa/fp4_logits/h64_d128_s2048_sk4096", 3, INT8),
    CASE("mqa/fp8_paged/h64_d128_b64_n1", 4, BF16),        CASE("mqa/fp8_paged/h64_d128_b64_n2", 5, BF16),
    CASE("mqa/fp8_paged/h64_d128_b256_n1", 6, BF16),       CASE("mqa/fp8_paged/h64_d128_b128_n2", 7, BF16),
    CASE("mqa/fp4_paged/h64_d128_b64_n1", 8, INT8),        CASE("mqa/fp4_paged/h64_d128_b64_n2", 9, INT8),
    CASE("mqa/fp4_sparse/h32_d128_s512_n512x16", 10, INT8), CASE("mqa/fp4_paged_sparse/h32_d128_s512_n512x16", 11, INT8),
    CASE("mqa/mxfp8_logits/h64_d128_s2048_sk4096", 12, BF16), CASE("mqa/mxfp8_sparse/h32_d128_s512_n512x16", 13, BF16),
};
#undef CASE

const bench_family bench_family_mqa = {"mqa", CASES, sizeof CASES / sizeof CASES[0]};
