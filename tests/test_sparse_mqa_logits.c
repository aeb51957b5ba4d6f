/*
 * test_sparse_mqa_logits.c - DeepGEMM 2.8's sparse lightning indexer and the scheduled prefill:
 * dg_get_(paged_)sparse_mqa_logits_metadata + dg_fp8_fp4_(paged_)sparse_mqa_logits against the
 * dense kernels (bitwise, per (row, token) pair, at each ISA level and thread count), against the
 * reference backend, the -inf mask (padding blocks, -1 and out-of-range indices, tokens outside
 * the range, empty rows), S = 0, dg_get_mqa_logits_metadata + dg_fp8_fp4_mqa_logits_scheduled
 * (bitwise the unscheduled logits), and bad arguments (status, named argument, nothing written).
 */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Random quantized data: E4M3 bytes without NaN, FP4 nibbles, UE8M0 scales near 1, positive
 * float32 scales. Exact values do not matter: the checks compare kernels with each other. */
static void fill_codes(tu_rng *r, dg_tensor *t) {
    uint8_t *p = t->data;
    for (size_t i = 0; i < dg_tensor_nbytes(t); ++i) {
        uint8_t b = (uint8_t)tu_next(r);
        if (t->dtype == DG_FLOAT8_E4M3 && (b & 0x7f) == 0x7f)
            b ^= 0x08;
        p[i] = b;
    }
}
static uint32_t ue8m0_word(tu_rng *r) {
    uint32_t w = 0;
    for (int g = 0; g < 4; ++g)
        w |= (uint32_t)(124 + tu_randint(r, 0, 6)) << (8 * g);
    return w;
}
static void fill_scales(tu_rng *r, dg_tensor *t) {
    for (int64_t i = 0; i < dg_tensor_numel(t); ++i) {
        if (t->dtype == DG_INT32)
            ((uint32_t *)t->data)[i] = ue8m0_word(r);
        else
            ((float *)t->data)[i] = (float)(0.001 + 0.01 * tu_uniform(r));
    }
}
static void fill_weights(tu_rng *r, dg_tensor *t) {
    for (int64_t i = 0; i < dg_tensor_numel(t); ++i) {
        const float v = (float)tu_normal(r);
        if (t->dtype == DG_BFLOAT16)
            ((uint16_t *)t->data)[i] = dg_float_to_bf16(v);
        else if (t->dtype == DG_FLOAT16)
            ((uint16_t *)t->data)[i] = dg_float_to_f16(v);
        else
            ((float *)t->data)[i] = v;
    }
}

/* Sparse block lists: row i's first nb(i) entries random distinct blocks of its range (all of
 * them when they fit), sorted; some rows get -1 or a far-out block among them; then padding. */
static void make_indices(tu_rng *r, dg_tensor *idx, const int32_t *begin, const int32_t *end, int64_t sbkv,
                         int unaligned) {
    const int64_t s = idx->shape[0], n = idx->shape[1];
    int32_t *out = idx->data;
    for (int64_t i = 0; i < s; ++i) {
        const int64_t first = begin[i] / sbkv, avail = (end[i] - begin[i] + sbkv - 1) / sbkv;
        const int64_t nb = avail < n ? avail : n;
        int32_t *row = out + i * n;
        (void)unaligned;
        for (int64_t j = 0; j < nb; ++j) /* a sorted random subset: selection sampling */
            row[j] = 0;
        for (int64_t b = 0, got = 0; b < avail && got < nb; ++b)
            if (tu_randint(r, 0, avail - b - 1) < nb - got)
                row[got++] = (int32_t)(first + b);
        if (nb >= 3 && i % 3 == 1)
            row[1] = -1;
        if (nb >= 3 && i % 4 == 2)
            row[nb - 1] = (int32_t)(first + avail + 7);
        for (int64_t j = nb; j < n; ++j)
            row[j] = nb ? row[nb - 1] : 0;
    }
}

static float get(const dg_tensor *t, int64_t i, int64_t j) {
    if (t->dtype == DG_FLOAT32)
        return ((const float *)t->data)[i * t->strides[0] + j];
    return dg_bf16_to_float(((const uint16_t *)t->data)[i * t->strides[0] + j]);
}
static int same_bits(const dg_tensor *a, int64_t i, int64_t j, const dg_tensor *b, int64_t i2, int64_t j2) {
    const float x = get(a, i, j), y = get(b, i2, j2);
    return memcmp(&x, &y, sizeof x) == 0;
}

/* Sparse column (i, j * sbkv + o) against the dense logits: the dense bits when the token is
 * scored, else -inf; returns the number of mismatches. `start` is block j's first token. */
static int64_t compare_with_dense(const dg_tensor *sp, const dg_tensor *dense, const int32_t *idx, int64_t n,
                                  int64_t sbkv, const int32_t *begin, const int32_t *end, int unaligned) {
    int64_t bad = 0;
    for (int64_t i = 0; i < sp->shape[0]; ++i) {
        const int64_t nb_all = (end[i] - begin[i] + sbkv - 1) / sbkv, nb = nb_all < n ? nb_all : n;
        for (int64_t j = 0; j < n; ++j)
            for (int64_t o = 0; o < sbkv; ++o) {
                const int64_t t = (int64_t)idx[i * n + j] * sbkv + (unaligned ? begin[i] % sbkv : 0) + o;
                const int64_t col = j * sbkv + o;
                const int valid = j < nb && t >= begin[i] && t < end[i];
                if (valid ? !same_bits(sp, i, col, dense, i, t) : get(sp, i, col) != -INFINITY)
                    ++bad;
            }
    }
    return bad;
}

/* calc_diff of the scored entries of two sparse outputs, and whether their -inf masks agree. */
static double masked_diff(const dg_tensor *a, const dg_tensor *b, int *masks_agree) {
    const int64_t rows = a->shape[0], cols = a->shape[1];
    float *x = malloc(sizeof(float) * (size_t)(rows * cols + 1)), *y = malloc(sizeof(float) * (size_t)(rows * cols + 1));
    size_t n = 0;
    *masks_agree = 1;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            const float u = get(a, i, j), v = get(b, i, j);
            if ((u == -INFINITY) != (v == -INFINITY))
                *masks_agree = 0;
            if (u != -INFINITY && v != -INFINITY)
                x[n] = u, y[n] = v, ++n;
        }
    const double d = n ? tu_calc_diff(x, y, n) : 0.0;
    free(x), free(y);
    return d;
}

/* Every level (those the CPU lacks are skipped): each has its own sparse tiles and panels. */
static const dg_isa kIsas[] = {DG_ISA_GENERIC, DG_ISA_AVX2, DG_ISA_AVX512, DG_ISA_AVX512_BF16, DG_ISA_AMX};

/* ---- contiguous ------------------------------------------------------------------------------ */

typedef struct contig_case {
    int64_t s, sk, h, d, n, sbkv;
    int fmt, bf16, unaligned; /* fmt: 0 FP8 (float kv scales), 1 MXFP4, 2 MXFP8 */
    int f16;                  /* FLOAT16 weights (DeepGEMM 2.8), with either logits dtype */
} contig_case;

/* w as FLOAT32 of the same values (w FLOAT16), for the check that both give the same bits. */
static dg_tensor widened_weights(const dg_tensor *w) {
    dg_tensor f = tu_alloc2(DG_FLOAT32, w->shape[0], w->shape[1]);
    for (int64_t i = 0; i < dg_tensor_numel(w); ++i)
        ((float *)f.data)[i] = dg_f16_to_float(((const uint16_t *)w->data)[i]);
    return f;
}

static void run_contiguous(const contig_case *cc, uint64_t seed) {
    tu_rng r = {seed};
    const int fp4 = cc->fmt == 1, mx = cc->fmt != 0;
    const int64_t db = fp4 ? cc->d / 2 : cc->d;
    const dg_dtype qt = fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, out_dt = cc->bf16 ? DG_BFLOAT16 : DG_FLOAT32;
    dg_tensor q = tu_alloc3(qt, cc->s, cc->h, db), kv = tu_alloc2(qt, cc->sk, db);
    dg_tensor qsf = mx ? tu_alloc2(DG_INT32, cc->s, cc->h) : (dg_tensor){0};
    dg_tensor kvsf = tu_alloc(mx ? DG_INT32 : DG_FLOAT32, 1, (int64_t[]){cc->sk});
    dg_tensor w = tu_alloc2(cc->f16 ? DG_FLOAT16 : out_dt, cc->s, cc->h);
    dg_tensor ks = tu_alloc(DG_INT32, 1, (int64_t[]){cc->s}), ke = tu_alloc(DG_INT32, 1, (int64_t[]){cc->s});
    dg_tensor idx = tu_alloc2(DG_INT32, cc->s, cc->n);
    fill_codes(&r, &q), fill_codes(&r, &kv), fill_scales(&r, &kvsf), fill_weights(&r, &w);
    if (mx)
        fill_scales(&r, &qsf);
    int32_t *a = ks.data, *e = ke.data;
    for (int64_t i = 0; i < cc->s; ++i) { /* row kinds: empty, short, longer than N blocks, full */
        int64_t lo = tu_randint(&r, 0, cc->sk), hi = tu_randint(&r, 0, cc->sk);
        if (lo > hi) { const int64_t t = lo; lo = hi; hi = t; }
        if (!cc->unaligned)
            lo = lo / cc->sbkv * cc->sbkv;
        if (i % 5 == 1) hi = lo;
        if (i % 5 == 3) lo = 0, hi = cc->sk;
        a[i] = (int32_t)lo, e[i] = (int32_t)hi;
    }
    make_indices(&r, &idx, a, e, cc->sbkv, cc->unaligned);
    const dg_tensor *qsfp = mx ? &qsf : NULL;
    dg_tensor meta = {0};
    TU_CHECK_OK(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)cc->sk, &idx, qt, (int)cc->sbkv, cc->unaligned,
                                                  &meta));
    meta = tu_alloc(DG_UINT8, 1, meta.shape);
    TU_CHECK_OK(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)cc->sk, &idx, qt, (int)cc->sbkv, cc->unaligned,
                                                  &meta));
    dg_tensor shape = {.dtype = out_dt};
    TU_CHECK_OK(dg_fp8_fp4_sparse_mqa_logits(&q, qsfp, &kv, &kvsf, &w, &meta, (int)cc->n, (int)cc->sbkv,
                                             cc->unaligned, &shape));
    TU_CHECK(shape.shape[0] == cc->s && shape.shape[1] == cc->n * cc->sbkv, "query form shape");
    char tag[160];
    snprintf(tag, sizeof tag, "contig S=%lld SK=%lld H=%lld D=%lld N=%lld blk=%lld fmt=%d bf16=%d unaligned=%d f16w=%d",
             (long long)cc->s, (long long)cc->sk, (long long)cc->h, (long long)cc->d, (long long)cc->n,
             (long long)cc->sbkv, cc->fmt, cc->bf16, cc->unaligned, cc->f16);
    const dg_backend saved_backend = dg_get_backend();
    const int saved_sms = dg_get_num_sms();
    const dg_isa saved_isa = dg_get_isa();
    dg_tensor ref = tu_alloc2(out_dt, cc->s, cc->n * cc->sbkv), dense = tu_alloc2(out_dt, cc->s, cc->sk);
    dg_set_backend(DG_BACKEND_REFERENCE);
    TU_CHECK_OK(dg_fp8_fp4_sparse_mqa_logits(&q, qsfp, &kv, &kvsf, &w, &meta, (int)cc->n, (int)cc->sbkv,
                                             cc->unaligned, &ref));
    TU_CHECK_OK(dg_fp8_fp4_mqa_logits(&q, qsfp, &kv, &kvsf, &w, &ks, &ke, 1, 0, &dense));
    TU_CHECK(compare_with_dense(&ref, &dense, idx.data, cc->n, cc->sbkv, a, e, cc->unaligned) == 0,
             "%s: reference sparse == reference dense bitwise, -inf elsewhere", tag);
    if (cc->f16) {
        dg_tensor w32 = widened_weights(&w), ref32 = tu_alloc2(out_dt, cc->s, cc->n * cc->sbkv);
        TU_CHECK_OK(dg_fp8_fp4_sparse_mqa_logits(&q, qsfp, &kv, &kvsf, &w32, &meta, (int)cc->n, (int)cc->sbkv,
                                                 cc->unaligned, &ref32));
        TU_CHECK(memcmp(ref.data, ref32.data, dg_tensor_nbytes(&ref)) == 0,
                 "%s: float16 weights == float32 weights of the same values bitwise", tag);
        tu_free(&w32), tu_free(&ref32);
    }
    dg_set_backend(DG_BACKEND_AUTO);
    for (size_t k = 0; k < sizeof kIsas / sizeof kIsas[0]; ++k) {
        if (dg_set_isa(kIsas[k]) != DG_OK)
            continue;
        dg_set_num_sms(2);
        TU_CHECK_OK(dg_fp8_fp4_mqa_logits(&q, qsfp, &kv, &kvsf, &w, &ks, &ke, 1, 0, &dense));
        dg_tensor out[3];
        for (int t = 0; t < 3; ++t) {
            out[t] = tu_alloc2(out_dt, cc->s, cc->n * cc->sbkv);
            tu_fill_bytes(&out[t], 0x5a);
            dg_set_num_sms(t + 1);
            TU_CHECK_OK(dg_fp8_fp4_sparse_mqa_logits(&q, qsfp, &kv, &kvsf, &w, &meta, (int)cc->n, (int)cc->sbkv,
                                                     cc->unaligned, &out[t]));
        }
        TU_CHECK(compare_with_dense(&out[0], &dense, idx.data, cc->n, cc->sbkv, a, e, cc->unaligned) == 0,
                 "%s %s: sparse == dense bitwise per (row, token), -inf elsewhere", tag, dg_isa_name(kIsas[k]));
        for (int t = 1; t < 3; ++t)
            TU_CHECK(memcmp(out[0].data, out[t].data, dg_tensor_nbytes(&out[0])) == 0,
                     "%s %s: %d threads == 1 thread bitwise", tag, dg_isa_name(kIsas[k]), t + 1);
        int agree;
        const double diff = masked_diff(&out[0], &ref, &agree);
        TU_CHECK(agree && diff < (cc->bf16 ? 3e-5 : 5e-6), "%s %s: vs reference calc_diff %g, masks agree %d", tag,
                 dg_isa_name(kIsas[k]), diff, agree);
        for (int t = 0; t < 3; ++t)
            tu_free(&out[t]);
    }
    dg_set_isa(saved_isa), dg_set_num_sms(saved_sms), dg_set_backend(saved_backend);
    tu_free(&ref), tu_free(&dense), tu_free(&meta);
    tu_free(&q), tu_free(&kv), tu_free(&qsf), tu_free(&kvsf), tu_free(&w), tu_free(&ks), tu_free(&ke), tu_free(&idx);
}

/* ---- paged ----------------------------------------------------------------------------------- */

/* fmt as in contig_case */
static void run_paged(int64_t s, int64_t h, int64_t d, int64_t page, int64_t n, int64_t sbkv, int fmt, int bf16,
                      int f16, uint64_t seed) {
    tu_rng r = {seed};
    const int fp4 = fmt == 1, mx = fmt != 0;
    const int64_t db = fp4 ? d / 2 : d, row_bytes = db + 4;
    const dg_dtype qt = fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, out_dt = bf16 ? DG_BFLOAT16 : DG_FLOAT32;
    dg_tensor ctx = tu_alloc2(DG_INT32, s, 1), ids = tu_alloc(DG_INT32, 1, (int64_t[]){s});
    int32_t *c = ctx.data, *req = ids.data;
    int64_t max_ctx = 1;
    for (int64_t i = 0; i < s; ++i) { /* requests of 1-3 queries, later queries one token more */
        req[i] = (int32_t)(i / 3);
        c[i] = i % 3 ? c[i - 1] + 1 : (int32_t)(i % 7 == 5 ? 0 : tu_randint(&r, 1, 6 * page));
        max_ctx = c[i] > max_ctx ? c[i] : max_ctx;
    }
    const int64_t width = (max_ctx + page - 1) / page + 1, pages = s * width + 2;
    dg_tensor table = tu_alloc2(DG_INT32, s, width);
    for (int64_t k = 0; k < s * width; ++k) /* a permutation of the pages */
        ((int32_t *)table.data)[k] = (int32_t)((k * 7919 + 3) % (s * width));
    const int64_t cshape[4] = {pages, page, 1, row_bytes};
    dg_tensor cache = dg_tensor_make(NULL, DG_UINT8, 4, cshape);
    cache.strides[0] = page * row_bytes + 12; /* padded pages */
    const size_t cache_bytes = (size_t)(pages * cache.strides[0]);
    cache.data = calloc(cache_bytes, 1);
    for (int64_t p = 0; p < pages; ++p) {
        uint8_t *base = (uint8_t *)cache.data + p * cache.strides[0];
        for (int64_t k = 0; k < page * db; ++k) {
            uint8_t b = (uint8_t)tu_next(&r);
            base[k] = (!fp4 && (b & 0x7f) == 0x7f) ? (uint8_t)(b ^ 8) : b;
        }
        for (int64_t t = 0; t < page; ++t) {
            uint32_t word;
            float f = (float)(0.001 + 0.01 * tu_uniform(&r));
            word = mx ? ue8m0_word(&r) : 0;
            memcpy(base + page * db + t * 4, mx ? (void *)&word : (void *)&f, 4);
        }
    }
    dg_tensor q = tu_alloc(qt, 4, (int64_t[]){s, 1, h, db});
    dg_tensor qsf = mx ? tu_alloc3(DG_INT32, s, 1, h) : (dg_tensor){0};
    dg_tensor w = tu_alloc2(f16 ? DG_FLOAT16 : out_dt, s, h), idx = tu_alloc2(DG_INT32, s, n);
    fill_codes(&r, &q), fill_weights(&r, &w);
    if (mx)
        fill_scales(&r, &qsf);
    int32_t *zeros = calloc((size_t)s, sizeof(int32_t));
    make_indices(&r, &idx, zeros, c, sbkv, 0);
    const dg_tensor *qsfp = mx ? &qsf : NULL;
    dg_tensor meta = {0};
    TU_CHECK_OK(dg_get_paged_sparse_mqa_logits_metadata(&ctx, &table, &ids, (int)page, &idx, qt, (int)sbkv, &meta));
    meta = tu_alloc(DG_UINT8, 1, meta.shape);
    TU_CHECK_OK(dg_get_paged_sparse_mqa_logits_metadata(&ctx, &table, &ids, (int)page, &idx, qt, (int)sbkv, &meta));
    char tag[160];
    snprintf(tag, sizeof tag, "paged S=%lld H=%lld D=%lld page=%lld N=%lld blk=%lld fmt=%d bf16=%d f16w=%d", (long long)s,
             (long long)h, (long long)d, (long long)page, (long long)n, (long long)sbkv, fmt, bf16, f16);
    const dg_backend saved_backend = dg_get_backend();
    const int saved_sms = dg_get_num_sms();
    const dg_isa saved_isa = dg_get_isa();
    dg_tensor ref = tu_alloc2(out_dt, s, n * sbkv), dense = tu_alloc2(out_dt, s, max_ctx);
    dg_tensor sched = tu_alloc2(DG_INT32, dg_get_num_sms() + 1, 2);
    dg_set_backend(DG_BACKEND_REFERENCE);
    TU_CHECK_OK(dg_fp8_fp4_paged_sparse_mqa_logits(&q, qsfp, &cache, &w, &meta, (int)n, (int)sbkv, &ref));
    dg_set_backend(DG_BACKEND_AUTO);
    for (size_t k = 0; k < sizeof kIsas / sizeof kIsas[0]; ++k) {
        if (dg_set_isa(kIsas[k]) != DG_OK)
            continue;
        dg_tensor out[3];
        for (int t = 0; t < 3; ++t) {
            out[t] = tu_alloc2(out_dt, s, n * sbkv);
            tu_fill_bytes(&out[t], 0x5a);
            dg_set_num_sms(t + 1);
            TU_CHECK_OK(dg_fp8_fp4_paged_sparse_mqa_logits(&q, qsfp, &cache, &w, &meta, (int)n, (int)sbkv, &out[t]));
        }
        /* the dense paged kernel with 2-D lens, each query its own block-table row */
        tu_free(&sched);
        sched = tu_alloc2(DG_INT32, dg_get_num_sms() + 1, 2);
        TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&ctx, (int)page, dg_get_num_sms(), NULL, &sched));
        TU_CHECK_OK(dg_fp8_fp4_paged_mqa_logits(&q, qsfp, &cache, &w, &ctx, &table, &sched, (int)max_ctx, 1, NULL,
                                                &dense));
        TU_CHECK(compare_with_dense(&out[0], &dense, idx.data, n, sbkv, zeros, c, 0) == 0,
                 "%s %s: sparse == dense paged bitwise, -inf elsewhere", tag, dg_isa_name(kIsas[k]));
        for (int t = 1; t < 3; ++t)
            TU_CHECK(memcmp(out[0].data, out[t].data, dg_tensor_nbytes(&out[0])) == 0,
                     "%s %s: %d threads == 1 thread bitwise", tag, dg_isa_name(kIsas[k]), t + 1);
        int agree;
        const double diff = masked_diff(&out[0], &ref, &agree);
        TU_CHECK(agree && diff < (bf16 ? 3e-5 : 5e-6), "%s %s: vs reference calc_diff %g, masks agree %d", tag,
                 dg_isa_name(kIsas[k]), diff, agree);
        for (int t = 0; t < 3; ++t)
            tu_free(&out[t]);
    }
    dg_set_isa(saved_isa), dg_set_num_sms(saved_sms), dg_set_backend(saved_backend);
    /* A block table entry past the cache: refused at the logits call, nothing written. */
    for (int64_t k = 0; k < s * width; ++k) /* every page past the cache: each scored block hits one */
        ((int32_t *)table.data)[k] = (int32_t)(pages + 5);
    dg_tensor bad_meta = tu_alloc(DG_UINT8, 1, meta.shape);
    TU_CHECK_OK(dg_get_paged_sparse_mqa_logits_metadata(&ctx, &table, &ids, (int)page, &idx, qt, (int)sbkv,
                                                        &bad_meta));
    TU_CHECK(memcmp(bad_meta.data, meta.data, dg_tensor_nbytes(&meta)) != 0, "%s: the case scores no block", tag);
    void *snap = tu_snapshot(&ref);
    TU_CHECK_STATUS(dg_fp8_fp4_paged_sparse_mqa_logits(&q, qsfp, &cache, &w, &bad_meta, (int)n, (int)sbkv, &ref),
                    DG_ERR_VALUE);
    TU_CHECK(tu_unchanged(&ref, snap), "%s: a page past the cache writes nothing", tag);
    free(snap);
    tu_free(&bad_meta), tu_free(&ref), tu_free(&dense), tu_free(&sched), tu_free(&meta);
    free(cache.data), free(zeros);
    tu_free(&ctx), tu_free(&ids), tu_free(&table), tu_free(&q), tu_free(&qsf), tu_free(&w), tu_free(&idx);
}

/* ---- scheduled dense prefill ---------------------------------------------------------------- */

static void test_scheduled(void) {
    tu_rng r = {77};
    const int64_t s = 13, sk = 600, h = 12, d = 64;
    dg_tensor q = tu_alloc3(DG_FLOAT8_E4M3, s, h, d), kv = tu_alloc2(DG_FLOAT8_E4M3, sk, d);
    dg_tensor kvsf = tu_alloc(DG_FLOAT32, 1, (int64_t[]){sk}), w = tu_alloc2(DG_FLOAT32, s, h);
    dg_tensor ks = tu_alloc(DG_INT32, 1, (int64_t[]){s}), ke = tu_alloc(DG_INT32, 1, (int64_t[]){s});
    fill_codes(&r, &q), fill_codes(&r, &kv), fill_scales(&r, &kvsf), fill_weights(&r, &w);
    for (int64_t i = 0; i < s; ++i) {
        ((int32_t *)ks.data)[i] = (int32_t)(i * 20);
        ((int32_t *)ke.data)[i] = (int32_t)(i % 4 == 1 ? i * 20 : 300 + i * 20);
    }
    const int saved_sms = dg_get_num_sms();
    dg_set_num_sms(3);
    dg_tensor meta = {0};
    TU_CHECK_OK(dg_get_mqa_logits_metadata(&ks, &ke, (int)sk, (int)h, &meta));
    TU_CHECK(meta.ndim == 1 && meta.dtype == DG_INT32 && meta.shape[0] == 10 + 2 * 2,
             "schedule_meta is INT32 [align(3 n, 2) + 2 ceil(S / (128 / H))], got %lld", (long long)meta.shape[0]);
    meta = tu_alloc(DG_INT32, 1, meta.shape);
    TU_CHECK_OK(dg_get_mqa_logits_metadata(&ks, &ke, (int)sk, (int)h, &meta));
    const int32_t *m = meta.data;
    /* blocks of 10 rows: spans [0, 460) (2 splits) and [200, 540) (3 splits); 5 splits over 3 parts */
    TU_CHECK(m[0] == 0 && m[1] == 0 && m[2] == 2 && m[3] == 1 && m[4] == 0 && m[5] == 2 && m[6] == 1 && m[7] == 2 &&
                 m[8] == 1 && m[9] == 0,
             "parts (%d %d %d | %d %d %d | %d %d %d)", m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8]);
    TU_CHECK(m[10] == 0 && m[11] == 460 && m[12] == 200 && m[13] == 540, "query block spans (%d %d %d %d)", m[10],
             m[11], m[12], m[13]);
    for (int clean = 0; clean < 2; ++clean)
        for (int max_k = 0; max_k <= 400; max_k += 400) {
            if (clean && max_k)
                continue;
            const int64_t width = max_k ? max_k : sk;
            dg_tensor a = tu_alloc2(DG_FLOAT32, s, width), b = tu_alloc2(DG_FLOAT32, s, width);
            tu_fill_bytes(&a, 0), tu_fill_bytes(&b, 0);
            TU_CHECK_OK(dg_fp8_fp4_mqa_logits(&q, NULL, &kv, &kvsf, &w, &ks, &ke, clean, max_k, &a));
            TU_CHECK_OK(dg_fp8_fp4_mqa_logits_scheduled(&q, NULL, &kv, &kvsf, &w, &ks, &ke, clean, max_k, &meta, &b));
            TU_CHECK(memcmp(a.data, b.data, dg_tensor_nbytes(&a)) == 0, "scheduled == unscheduled bitwise (clean %d, "
                     "max_seqlen_k %d)", clean, max_k);
            tu_free(&a), tu_free(&b);
        }
    dg_tensor out = tu_alloc2(DG_FLOAT32, s, sk);
    void *snap = tu_snapshot(&out);
    dg_set_num_sms(2); /* stale: built for 3 SMs, another size */
    TU_CHECK_STATUS(dg_fp8_fp4_mqa_logits_scheduled(&q, NULL, &kv, &kvsf, &w, &ks, &ke, 1, 0, &meta, &out),
                    DG_ERR_SHAPE);
    TU_CHECK(strstr(dg_last_error(), "schedule_meta") != NULL, "names schedule_meta: %s", dg_last_error());
    dg_set_num_sms(3);
    ((int32_t *)ke.data)[8] -= 7; /* other ranges: block 0 now ends at 453 */
    TU_CHECK_STATUS(dg_fp8_fp4_mqa_logits_scheduled(&q, NULL, &kv, &kvsf, &w, &ks, &ke, 1, 0, &meta, &out),
                    DG_ERR_VALUE);
    ((int32_t *)ke.data)[8] += 7;
    TU_CHECK(tu_unchanged(&out, snap), "a stale schedule writes nothing");
    dg_tensor m8 = tu_alloc(DG_UINT8, 1, meta.shape);
    TU_CHECK_STATUS(dg_fp8_fp4_mqa_logits_scheduled(&q, NULL, &kv, &kvsf, &w, &ks, &ke, 1, 0, &m8, &out),
                    DG_ERR_DTYPE);
    ((int32_t *)ks.data)[2] = ((int32_t *)ke.data)[2] + 1;
    TU_CHECK_STATUS(dg_get_mqa_logits_metadata(&ks, &ke, (int)sk, (int)h, &meta), DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_get_mqa_logits_metadata(&ks, &ke, (int)sk, 0, &meta), DG_ERR_VALUE);
    free(snap);
    dg_set_num_sms(saved_sms);
    tu_free(&m8), tu_free(&out), tu_free(&meta);
    tu_free(&q), tu_free(&kv), tu_free(&kvsf), tu_free(&w), tu_free(&ks), tu_free(&ke);
}

/* ---- bad arguments, S = 0 ------------------------------------------------------------------- */

static void test_bad_and_empty(void) {
    tu_rng r = {99};
    const int64_t s = 4, sk = 96, h = 4, d = 64, n = 8;
    dg_tensor q = tu_alloc3(DG_FP4_E2M1X2, s, h, d / 2), qsf = tu_alloc2(DG_INT32, s, h);
    dg_tensor kv = tu_alloc2(DG_FP4_E2M1X2, sk, d / 2), kvsf = tu_alloc(DG_INT32, 1, (int64_t[]){sk});
    dg_tensor w = tu_alloc2(DG_BFLOAT16, s, h), idx = tu_alloc2(DG_INT32, s, n);
    dg_tensor ks = tu_alloc(DG_INT32, 1, (int64_t[]){s}), ke = tu_alloc(DG_INT32, 1, (int64_t[]){s});
    fill_codes(&r, &q), fill_codes(&r, &kv), fill_scales(&r, &qsf), fill_scales(&r, &kvsf), fill_weights(&r, &w);
    for (int64_t i = 0; i < s; ++i)
        ((int32_t *)ks.data)[i] = (int32_t)(16 * i), ((int32_t *)ke.data)[i] = (int32_t)(16 * i + 30);
    make_indices(&r, &idx, ks.data, ke.data, 16, 0);
    dg_tensor meta = {0};
    TU_CHECK_OK(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)sk, &idx, DG_FP4_E2M1X2, 16, 0, &meta));
    meta = tu_alloc(DG_UINT8, 1, meta.shape);
    TU_CHECK_OK(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)sk, &idx, DG_FP4_E2M1X2, 16, 0, &meta));
    void *msnap = tu_snapshot(&meta);
    /* metadata errors: nothing written to it */
    TU_CHECK_STATUS(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)sk, &idx, DG_FP4_E2M1X2, 12, 0, &meta),
                    DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)sk, &idx, DG_BFLOAT16, 16, 0, &meta),
                    DG_ERR_DTYPE);
    TU_CHECK_STATUS(dg_get_sparse_mqa_logits_metadata(&ks, &ke, 40, &idx, DG_FP4_E2M1X2, 16, 0, &meta), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "num_kv_tokens") != NULL, "names num_kv_tokens: %s", dg_last_error());
    ((int32_t *)ks.data)[1] += 3; /* unaligned start without use_unaligned_ks */
    TU_CHECK_STATUS(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)sk, &idx, DG_FP4_E2M1X2, 16, 0, &meta),
                    DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "use_unaligned_ks") != NULL, "suggests use_unaligned_ks: %s", dg_last_error());
    ((int32_t *)ks.data)[1] -= 3;
    dg_tensor idx6 = tu_alloc2(DG_INT32, s, 6);
    TU_CHECK_STATUS(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)sk, &idx6, DG_FP4_E2M1X2, 16, 0, &meta),
                    DG_ERR_SHAPE);
    TU_CHECK_STATUS(dg_get_sparse_mqa_logits_metadata(&ks, &ke, (int)sk, &idx, DG_FP4_E2M1X2, 16, 0, NULL),
                    DG_ERR_NULL_POINTER);
    TU_CHECK(tu_unchanged(&meta, msnap), "failed metadata calls write nothing");
    /* logits errors: nothing written */
    dg_tensor out = tu_alloc2(DG_BFLOAT16, s, n * 16);
    void *snap = tu_snapshot(&out);
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv, &kvsf, &w, &meta, 12, 16, 0, &out), DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv, &kvsf, &w, &meta, (int)n, 8, 0, &out), DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv, &kvsf, &w, &meta, (int)n, 16, 1, &out), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "metadata") != NULL, "names metadata: %s", dg_last_error());
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv, &kvsf, &w, NULL, (int)n, 16, 0, &out),
                    DG_ERR_NULL_POINTER);
    dg_tensor kv_short = kv, kvsf_short = kvsf;
    kv_short.shape[0] = kvsf_short.shape[0] = 50; /* row 3's range ends at 78 */
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv_short, &kvsf_short, &w, &meta, (int)n, 16, 0, &out),
                    DG_ERR_VALUE);
    ((int32_t *)meta.data)[8 + 2 * s + 2] = 1000; /* row 0, block 1 corrupted */
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv, &kvsf, &w, &meta, (int)n, 16, 0, &out), DG_ERR_VALUE);
    memcpy(meta.data, msnap, dg_tensor_nbytes(&meta));
    dg_tensor wide = tu_alloc2(DG_BFLOAT16, s, n * 16 + 1);
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv, &kvsf, &w, &meta, (int)n, 16, 0, &wide), DG_ERR_SHAPE);
    dg_tensor f32 = tu_alloc2(DG_FLOAT32, s, n * 16);
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv, &kvsf, &w, &meta, (int)n, 16, 0, &f32), DG_ERR_DTYPE);
    dg_tensor q8 = tu_alloc3(DG_FLOAT8_E4M3, s, h, d), kv8 = tu_alloc2(DG_FLOAT8_E4M3, sk, d);
    /* MXFP8 q and kv against metadata built for FP4 (DeepGEMM's KV split differs) */
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q8, &qsf, &kv8, &kvsf, &w, &meta, (int)n, 16, 0, &out),
                    DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'metadata'") != NULL, "names metadata: %s", dg_last_error());
    dg_tensor kvsf_f = tu_alloc(DG_FLOAT32, 1, (int64_t[]){sk}); /* MXFP8 q with float kv scales */
    TU_CHECK_STATUS(dg_fp8_fp4_sparse_mqa_logits(&q8, &qsf, &kv8, &kvsf_f, &w, &meta, (int)n, 16, 0, &out),
                    DG_ERR_DTYPE);
    TU_CHECK(strstr(dg_last_error(), "'kv_sf'") != NULL, "names kv_sf: %s", dg_last_error());
    tu_free(&kvsf_f);
    TU_CHECK(tu_unchanged(&out, snap), "failed logits calls write nothing");
    TU_CHECK_OK(dg_fp8_fp4_sparse_mqa_logits(&q, &qsf, &kv, &kvsf, &w, &meta, (int)n, 16, 0, &out));
    /* S = 0: metadata of the header alone, logits [0, N * 16] */
    dg_tensor e1 = tu_alloc(DG_INT32, 1, (int64_t[]){0}), e2 = tu_alloc2(DG_INT32, 0, n), em = {0};
    TU_CHECK_OK(dg_get_sparse_mqa_logits_metadata(&e1, &e1, 0, &e2, DG_FP4_E2M1X2, 16, 0, &em));
    TU_CHECK(em.shape[0] == 32, "empty metadata is 32 bytes, got %lld", (long long)em.shape[0]);
    em = tu_alloc(DG_UINT8, 1, em.shape);
    TU_CHECK_OK(dg_get_sparse_mqa_logits_metadata(&e1, &e1, 0, &e2, DG_FP4_E2M1X2, 16, 0, &em));
    dg_tensor q0 = tu_alloc3(DG_FP4_E2M1X2, 0, h, d / 2), qsf0 = tu_alloc2(DG_INT32, 0, h);
    dg_tensor w0 = tu_alloc2(DG_BFLOAT16, 0, h), out0 = {.dtype = DG_BFLOAT16};
    TU_CHECK_OK(dg_fp8_fp4_sparse_mqa_logits(&q0, &qsf0, &kv, &kvsf, &w0, &em, (int)n, 16, 0, &out0));
    TU_CHECK(out0.shape[0] == 0 && out0.shape[1] == n * 16 && out0.strides[0] == 512, "empty logits shape");
    out0 = tu_alloc2(DG_BFLOAT16, 0, n * 16);
    TU_CHECK_OK(dg_fp8_fp4_sparse_mqa_logits(&q0, &qsf0, &kv, &kvsf, &w0, &em, (int)n, 16, 0, &out0));
    /* paged metadata: a context longer than the block table */
    dg_tensor ctx = tu_alloc(DG_INT32, 1, (int64_t[]){s}), table = tu_alloc2(DG_INT32, s, 2), ids = ctx;
    ids = tu_alloc(DG_INT32, 1, (int64_t[]){s});
    for (int64_t i = 0; i < s; ++i)
        ((int32_t *)ctx.data)[i] = 64, ((int32_t *)ids.data)[i] = (int32_t)i;
    for (int64_t k = 0; k < 2 * s; ++k)
        ((int32_t *)table.data)[k] = (int32_t)k;
    dg_tensor pm = {0};
    TU_CHECK_OK(dg_get_paged_sparse_mqa_logits_metadata(&ctx, &table, &ids, 32, &idx, DG_FP4_E2M1X2, 16, &pm));
    TU_CHECK_STATUS(dg_get_paged_sparse_mqa_logits_metadata(&ctx, &table, &ids, 24, &idx, DG_FP4_E2M1X2, 16, &pm),
                    DG_ERR_VALUE);
    ((int32_t *)ctx.data)[2] = 65;
    pm = tu_alloc(DG_UINT8, 1, pm.shape);
    TU_CHECK_STATUS(dg_get_paged_sparse_mqa_logits_metadata(&ctx, &table, &ids, 32, &idx, DG_FP4_E2M1X2, 16, &pm),
                    DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "block_table") != NULL, "names block_table: %s", dg_last_error());
    /* contiguous metadata passed to the paged call */
    dg_tensor pq = tu_alloc(DG_FP4_E2M1X2, 4, (int64_t[]){s, 1, h, d / 2}), pqsf = tu_alloc3(DG_INT32, s, 1, h);
    dg_tensor pc = tu_alloc(DG_UINT8, 4, (int64_t[]){8, 32, 1, d / 2 + 4});
    TU_CHECK_STATUS(dg_fp8_fp4_paged_sparse_mqa_logits(&pq, &pqsf, &pc, &w, &meta, (int)n, 16, &out), DG_ERR_VALUE);
    free(snap), free(msnap);
    tu_free(&pq), tu_free(&pqsf), tu_free(&pc), tu_free(&pm), tu_free(&ctx), tu_free(&table), tu_free(&ids);
    tu_free(&e1), tu_free(&e2), tu_free(&em), tu_free(&q0), tu_free(&qsf0), tu_free(&w0), tu_free(&out0);
    tu_free(&q8), tu_free(&kv8), tu_free(&wide), tu_free(&f32), tu_free(&idx6), tu_free(&out), tu_free(&meta);
    tu_free(&q), tu_free(&qsf), tu_free(&kv), tu_free(&kvsf), tu_free(&w), tu_free(&idx), tu_free(&ks), tu_free(&ke);
}

int main(void) {
    static const contig_case cases[] = {
        /* s, sk, h, d, n, sbkv, fmt, bf16, unaligned, f16 */
        {7, 300, 5, 40, 8, 16, 0, 0, 0, 0},   {9, 257, 32, 128, 12, 8, 1, 1, 1, 0}, {1, 33, 3, 64, 4, 16, 1, 0, 0, 0},
        {11, 400, 17, 64, 4, 8, 0, 1, 1, 0},  {6, 500, 8, 96, 40, 16, 0, 0, 1, 0},  {5, 160, 32, 128, 16, 16, 1, 1, 0, 0},
        {9, 257, 32, 128, 12, 8, 2, 1, 1, 0}, {6, 300, 7, 96, 8, 16, 2, 0, 0, 0},   {1, 33, 3, 32, 4, 16, 2, 1, 0, 0},
        {7, 300, 5, 40, 8, 16, 0, 0, 0, 1}, {9, 257, 32, 128, 12, 8, 1, 1, 1, 1}, {6, 300, 7, 96, 8, 16, 2, 0, 0, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k)
        run_contiguous(&cases[k], 1000 + k);
    run_paged(10, 32, 128, 64, 8, 16, 1, 1, 0, 2001);
    run_paged(7, 5, 40, 32, 12, 8, 0, 0, 0, 2002);
    run_paged(4, 16, 64, 16, 4, 16, 1, 0, 0, 2003);
    run_paged(10, 32, 128, 64, 8, 16, 2, 1, 0, 2004);
    run_paged(5, 9, 64, 32, 8, 8, 2, 0, 0, 2005);
    run_paged(7, 5, 40, 32, 12, 8, 0, 0, 1, 2006); /* float16 weights */
    run_paged(10, 32, 128, 64, 8, 16, 2, 1, 1, 2007);
    test_scheduled();
    test_bad_and_empty();
    return tu_finish();
}
