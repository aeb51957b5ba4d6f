/*
 * paged_mqa_logits.c - paged-decoding MQA logits (SPEC 5): the work-split metadata and
 * dg_fp8_paged_mqa_logits / dg_fp8_fp4_paged_mqa_logits. Argument checks and the query form
 * live here; the arithmetic is src/reference/ref_mqa.c. Layouts: see deepgemm.h and
 * DeepGEMM's csrc/apis/attention.hpp.
 */
#include "core/internal.h"
#include "kernels/mqa_kernels.h"
#include "reference/ref_mqa.h"
#include "api/mqa_checks.h"

#include <string.h>

/* DeepGEMM splits each request's KV into chunks of 256 tokens (its SPLIT_KV) and pads logits
 * rows to a multiple of that and of 1024 bytes. */
enum { PAGED_SPLIT_KV = 256, PAGED_ROW_ALIGN_BYTES = 1024 };

/* ---- schedule ------------------------------------------------------------------------------ */

/* What the schedule is computed from. Requests: varlen -> runs of equal indices over the
 * rows; 2-D lens -> sequences of next_n rows; 1-D lens -> sequences counted as one unit each,
 * coordinate b (the lens do not carry next_n). */
typedef struct sched_input {
    const int32_t *ctx;
    int lens_2d;
    int64_t batch, next_n; /* context_lens is [batch] or [batch, next_n] */
    const int32_t *indices; /* NULL or [batch] (then next_n == 1) */
} sched_input;

static int64_t sched_ctx(const sched_input *in, int64_t row) { return in->ctx[row]; }

/* Fills out[(num_sms + 1) * 2] with DeepGEMM's SM100 split: request r has
 * work ceil(ctx_last / split) * tokens; part i starts at work unit i * (W / n) + min(i, W % n),
 * snapped to the start of the kv split holding it; the final row is (end coordinate, 0). */
static dg_status build_schedule(const sched_input *in, int64_t split, int num_sms, int32_t *out) {
    const int64_t nreq_max = in->batch;
    int64_t *req = dg_malloc((size_t)(nreq_max > 0 ? nreq_max : 1) * 3 * sizeof(int64_t));
    DG_CHECK(req != NULL, DG_ERR_ALLOC, "no memory for the schedule of %lld requests", (long long)nreq_max);
    int64_t nreq = 0, end_coord, total = 0;
    if (in->indices) {
        for (int64_t t = 0; t < in->batch;) {
            int64_t e = t;
            while (e + 1 < in->batch && in->indices[e + 1] == in->indices[t])
                ++e;
            req[nreq * 3 + 0] = t;
            req[nreq * 3 + 1] = e - t + 1;
            req[nreq * 3 + 2] = sched_ctx(in, e);
            ++nreq;
            t = e + 1;
        }
        end_coord = in->batch;
    } else {
        const int64_t ntok = in->lens_2d ? in->next_n : 1;
        for (int64_t b = 0; b < in->batch; ++b, ++nreq) {
            req[nreq * 3 + 0] = b * ntok;
            req[nreq * 3 + 1] = ntok;
            req[nreq * 3 + 2] = sched_ctx(in, in->lens_2d ? b * in->next_n + in->next_n - 1 : b);
        }
        end_coord = in->batch * ntok;
    }
    /* req[r*3+2] becomes the inclusive prefix sum of the work. */
    for (int64_t r = 0; r < nreq; ++r) {
        total += dg_ceil_div(req[r * 3 + 2], split) * req[r * 3 + 1];
        req[r * 3 + 2] = total;
    }
    const int64_t q = total / num_sms, rem = total % num_sms;
    for (int64_t i = 0; i <= num_sms; ++i) {
        const int64_t w = i * q + (i < rem ? i : rem);
        int64_t lo = 0, hi = nreq; /* first request whose prefix exceeds w */
        while (lo < hi) {
            const int64_t mid = (lo + hi) / 2;
            if (req[mid * 3 + 2] <= w)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < nreq) {
            const int64_t before = lo ? req[(lo - 1) * 3 + 2] : 0;
            out[i * 2] = (int32_t)req[lo * 3];
            out[i * 2 + 1] = (int32_t)((w - before) / req[lo * 3 + 1]);
        } else {
            out[i * 2] = (int32_t)end_coord;
            out[i * 2 + 1] = 0;
        }
    }
    dg_free(req);
    return DG_OK;
}

/* context_lens: INT32, contiguous, [batch] or [batch, next_n] (next_n < 0: any), values >= 0. */
static dg_status check_context_lens(const dg_tensor *t, int64_t batch, int64_t next_n) {
    DG_TRY(dg_check_tensor(t, "context_lens", -1));
    DG_CHECK(t->ndim == 1 || t->ndim == 2, DG_ERR_SHAPE,
             "argument 'context_lens' must be 1-D [batch] or 2-D [batch, next_n], got %d dimensions", t->ndim);
    DG_CHECK(t->dtype == DG_INT32, DG_ERR_DTYPE, "argument 'context_lens' must be int32, got %s",
             dg_dtype_name(t->dtype));
    DG_TRY(dg_check_contiguous(t, "context_lens"));
    if (batch >= 0)
        DG_TRY(dg_check_dim(t, "context_lens", 0, batch));
    if (t->ndim == 2 && next_n >= 0)
        DG_TRY(dg_check_dim(t, "context_lens", 1, next_n));
    const int64_t n = dg_tensor_numel(t);
    for (int64_t i = 0; i < n; ++i)
        DG_CHECK(((const int32_t *)t->data)[i] >= 0, DG_ERR_VALUE, "argument 'context_lens': entry %lld is negative",
                 (long long)i);
    return DG_OK;
}

/* indices: INT32 [batch], contiguous; only with one token per row. */
static dg_status check_indices(const dg_tensor *t, int64_t batch, int64_t next_n) {
    DG_CHECK(next_n == 1, DG_ERR_SHAPE, "argument 'indices' requires next_n == 1, got %lld", (long long)next_n);
    DG_TRY(dg_check_tensor_dtype(t, "indices", 1, DG_INT32));
    DG_TRY(dg_check_dim(t, "indices", 0, batch));
    return dg_check_contiguous(t, "indices");
}

static int64_t schedule_split(int64_t block_kv) { return dg_align(PAGED_SPLIT_KV, block_kv); }

dg_status dg_get_paged_mqa_logits_metadata(const dg_tensor *context_lens, int block_kv, int num_sms,
                                           const dg_tensor *indices, dg_tensor *schedule_meta) {
    dg_api_begin("dg_get_paged_mqa_logits_metadata");
    DG_TRY(check_context_lens(context_lens, -1, -1));
    const int64_t batch = context_lens->shape[0];
    const int64_t next_n = context_lens->ndim == 2 ? context_lens->shape[1] : 1;
    DG_CHECK(next_n >= 1, DG_ERR_SHAPE, "argument 'context_lens' must have next_n >= 1");
    DG_CHECK(block_kv >= 1, DG_ERR_VALUE, "argument 'block_kv' must be >= 1, got %d", block_kv);
    DG_CHECK(num_sms >= 1, DG_ERR_VALUE, "argument 'num_sms' must be >= 1, got %d", num_sms);
    if (indices)
        DG_TRY(check_indices(indices, batch, next_n));
    int64_t rows;
    DG_CHECK(dg_mul_ok(batch, next_n, &rows) && rows <= INT32_MAX, DG_ERR_OVERFLOW,
             "argument 'context_lens': too many rows for int32");
    DG_CHECK(schedule_meta != NULL, DG_ERR_NULL_POINTER, "argument 'schedule_meta' is NULL");
    if (schedule_meta->data == NULL) {
        *schedule_meta = dg_tensor_2d(NULL, DG_INT32, (int64_t)num_sms + 1, 2);
        return DG_OK;
    }
    DG_TRY(dg_check_tensor_dtype(schedule_meta, "schedule_meta", 2, DG_INT32));
    DG_TRY(dg_check_dim(schedule_meta, "schedule_meta", 0, (int64_t)num_sms + 1));
    DG_TRY(dg_check_dim(schedule_meta, "schedule_meta", 1, 2));
    DG_TRY(dg_check_contiguous(schedule_meta, "schedule_meta"));
    DG_TRY(dg_check_no_overlap(schedule_meta, "schedule_meta", context_lens, "context_lens", false));
    DG_TRY(dg_check_no_overlap(schedule_meta, "schedule_meta", indices, "indices", false));
    const sched_input in = {context_lens->data, context_lens->ndim == 2, batch, next_n,
                            indices ? indices->data : NULL};
    return build_schedule(&in, schedule_split(block_kv), num_sms, schedule_meta->data);
}

/* ---- paged logits -------------------------------------------------------------------------- */

/* q, q_sf and the fused cache: dtypes, shapes, layout; fills the problem's extents. */
dg_status dg_paged_mqa_check_q_cache(dg_paged_mqa_problem *p, const dg_tensor *q, const dg_tensor *q_sf,
                                     const dg_tensor *cache) {
    /* q_sf given: MXFP4 or MXFP8 (per-32 UE8M0 scales, packed INT32, in the cache too); NULL: FP8 */
    p->mx = q_sf != NULL;
    DG_TRY(dg_mqa_check_q_format(q, 4, p->mx));
    p->fp4 = q->dtype == DG_FP4_E2M1X2;
    DG_TRY(dg_check_contiguous(q, "q"));
    p->batch = q->shape[0];
    p->next_n = q->shape[1];
    p->h = q->shape[2];
    DG_CHECK(dg_mul_ok(q->shape[3], p->fp4 ? 2 : 1, &p->d), DG_ERR_OVERFLOW,
             "argument 'q': its head dimension %lld overflows", (long long)q->shape[3]);
    DG_CHECK(p->next_n >= 1 && p->h >= 1 && p->d >= 1, DG_ERR_SHAPE,
             "argument 'q' must have next_n, heads and head dim >= 1");
    int64_t rows, hd; /* an empty q (B = 0) may claim any next_n, H and D (found by tests/fuzz) */
    DG_CHECK(dg_mul_ok(p->batch, p->next_n, &rows) && rows <= INT32_MAX, DG_ERR_OVERFLOW,
             "argument 'q': too many query rows");
    DG_CHECK(dg_mul_ok(p->h, p->d, &hd) && hd <= DG_MAX_SPAN_BYTES, DG_ERR_OVERFLOW,
             "argument 'q': %lld heads of %lld elements are more than any process can address",
             (long long)p->h, (long long)p->d);
    if (p->mx) {
        DG_CHECK(p->d % 32 == 0 && p->d <= 128, DG_ERR_SHAPE,
                 "argument 'q': the %s head dim must be a multiple of 32 and at most 128, got %lld",
                 p->fp4 ? "FP4" : "MXFP8", (long long)p->d);
        DG_TRY(dg_check_tensor_dtype(q_sf, "q_sf", 3, DG_INT32));
        for (int i = 0; i < 3; ++i)
            DG_TRY(dg_check_dim(q_sf, "q_sf", i, q->shape[i]));
        DG_TRY(dg_check_contiguous(q_sf, "q_sf"));
    }
    DG_TRY(dg_check_tensor_dtype(cache, "kv_cache", 4, DG_UINT8));
    const int64_t row_bytes = (p->fp4 ? p->d / 2 : p->d) + 4; /* values + one 4-byte scale */
    DG_CHECK(cache->shape[1] >= 1, DG_ERR_SHAPE, "argument 'kv_cache' must have block_kv >= 1");
    DG_TRY(dg_check_dim(cache, "kv_cache", 2, 1));
    DG_TRY(dg_check_dim(cache, "kv_cache", 3, row_bytes));
    p->num_blocks = cache->shape[0];
    p->block_kv = cache->shape[1];
    p->block_stride = cache->strides[0];
    DG_CHECK(cache->strides[3] == 1 && cache->strides[1] == row_bytes, DG_ERR_LAYOUT,
             "argument 'kv_cache' must have strides[1] == %lld and strides[3] == 1", (long long)row_bytes);
    DG_CHECK(p->num_blocks <= 1 || (p->block_stride % 4 == 0 && p->block_stride >= p->block_kv * row_bytes),
             DG_ERR_LAYOUT, "argument 'kv_cache': strides[0] (%lld) must be a multiple of 4 and >= %lld",
             (long long)p->block_stride, (long long)(p->block_kv * row_bytes));
    p->q = q;
    p->q_sf = q_sf;
    p->cache = cache->data;
    return DG_OK;
}

/* Context lengths against max_context_len, the block table and the cache; the 2-D and varlen
 * rule that a request's last token has the longest context. */
static dg_status check_contexts(const dg_paged_mqa_problem *p, int64_t max_blocks, const int32_t *indices) {
    const int64_t rows = p->batch * p->next_n;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t b = r / p->next_n;
        const int64_t ctx = p->context_lens_2d ? p->context_lens[r] : p->context_lens[b];
        DG_CHECK(ctx <= p->max_context_len, DG_ERR_VALUE,
                 "argument 'context_lens': %lld (row %lld) exceeds max_context_len %lld", (long long)ctx,
                 (long long)r, (long long)p->max_context_len);
        if (p->context_lens_2d) {
            const int64_t last = p->context_lens[b * p->next_n + p->next_n - 1];
            DG_CHECK(ctx <= last, DG_ERR_VALUE,
                     "argument 'context_lens': row %lld (%lld) exceeds its sequence's last token (%lld)",
                     (long long)r, (long long)ctx, (long long)last);
        }
        const int64_t nb = dg_ceil_div(dg_paged_visible_len(p, r), p->block_kv);
        DG_CHECK(nb <= max_blocks, DG_ERR_VALUE,
                 "argument 'block_table': row %lld needs %lld blocks, the table has %lld", (long long)b,
                 (long long)nb, (long long)max_blocks);
        const int32_t *row = p->block_table + b * p->block_table_stride;
        for (int64_t k = 0; k < nb; ++k)
            DG_CHECK(row[k] >= 0 && row[k] < p->num_blocks, DG_ERR_VALUE,
                     "argument 'block_table': entry [%lld, %lld] = %d is outside the cache's %lld blocks",
                     (long long)b, (long long)k, row[k], (long long)p->num_blocks);
        if (!indices)
            continue;
        /* Varlen: the run holding r; DeepGEMM reads one block_table row per run. */
        int64_t s = r, e = r;
        while (s > 0 && indices[s - 1] == indices[r])
            --s;
        while (e + 1 < rows && indices[e + 1] == indices[r])
            ++e;
        DG_CHECK(ctx <= p->context_lens[e], DG_ERR_VALUE,
                 "argument 'context_lens': row %lld (%lld) exceeds the last row %lld of its indices run (%lld)",
                 (long long)r, (long long)ctx, (long long)e, (long long)p->context_lens[e]);
        const int32_t *first = p->block_table + s * p->block_table_stride;
        DG_CHECK(nb == 0 || memcmp(row, first, (size_t)nb * sizeof(int32_t)) == 0, DG_ERR_VALUE,
                 "argument 'block_table': rows %lld and %lld share an indices run but differ in the blocks "
                 "they read", (long long)s, (long long)r);
    }
    return DG_OK;
}

/* schedule_meta must be exactly what the metadata function gives for these inputs. */
static dg_status check_schedule(const dg_paged_mqa_problem *p, const dg_tensor *meta, const int32_t *indices) {
    const int num_sms = dg_get_num_sms();
    DG_TRY(dg_check_tensor_dtype(meta, "schedule_meta", 2, DG_INT32));
    DG_TRY(dg_check_dim(meta, "schedule_meta", 0, (int64_t)num_sms + 1));
    DG_TRY(dg_check_dim(meta, "schedule_meta", 1, 2));
    DG_TRY(dg_check_contiguous(meta, "schedule_meta"));
    int32_t *want = dg_malloc(((size_t)num_sms + 1) * 2 * sizeof(int32_t));
    DG_CHECK(want != NULL, DG_ERR_ALLOC, "no memory to check 'schedule_meta'");
    const sched_input in = {p->context_lens, p->context_lens_2d, p->batch, p->next_n, indices};
    dg_status st = build_schedule(&in, schedule_split(p->block_kv), num_sms, want);
    if (st == DG_OK && memcmp(want, meta->data, ((size_t)num_sms + 1) * 2 * sizeof(int32_t)) != 0)
        st = dg_fail(DG_ERR_VALUE, "argument 'schedule_meta' does not match context_lens/indices and the "
                                   "current num_sms (%d); recompute it with dg_get_paged_mqa_logits_metadata",
                     num_sms);
    dg_free(want);
    return st;
}

/* Query form or caller-allocated logits [rows, max_context_len]. */
static dg_status check_paged_logits(dg_paged_mqa_problem *p, dg_tensor *logits, int legacy, int *is_query,
                                    const dg_tensor *const *ins, const char *const *names, int nins) {
    DG_CHECK(logits != NULL, DG_ERR_NULL_POINTER, "argument 'logits' is NULL");
    *is_query = logits->data == NULL;
    dg_tensor want = *logits;
    if (*is_query && legacy)
        want.dtype = DG_FLOAT32;
    const dg_dtype allowed[2] = {DG_FLOAT32, DG_BFLOAT16};
    DG_TRY(dg_check_dtype_in(&want, "logits", allowed, legacy ? 1 : 2));
    DG_CHECK(p->weights->dtype != DG_BFLOAT16 || want.dtype == DG_BFLOAT16, DG_ERR_DTYPE,
             "argument 'weights' may be bfloat16 only with bfloat16 logits");
    const int64_t rows = p->batch * p->next_n;
    if (*is_query) {
        const int64_t elems = PAGED_ROW_ALIGN_BYTES / (int64_t)dg_dtype_size(want.dtype);
        *logits = dg_tensor_2d(NULL, want.dtype, rows, p->max_context_len);
        logits->strides[0] = dg_align(dg_align(p->max_context_len, PAGED_SPLIT_KV), elems);
        return DG_OK;
    }
    DG_TRY(dg_check_tensor(logits, "logits", 2));
    DG_TRY(dg_check_dim(logits, "logits", 0, rows));
    DG_TRY(dg_check_dim(logits, "logits", 1, p->max_context_len));
    DG_TRY(dg_check_last_dim_contiguous(logits, "logits"));
    DG_TRY(dg_check_output(logits, "logits"));
    for (int i = 0; i < nins; ++i)
        DG_TRY(dg_check_no_overlap(logits, "logits", ins[i], names[i], false));
    p->logits = logits;
    return DG_OK;
}

static dg_status paged_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv_cache,
                                  const dg_tensor *weights, const dg_tensor *context_lens,
                                  const dg_tensor *block_table, const dg_tensor *schedule_meta,
                                  int max_context_len, int clean_logits, const dg_tensor *indices,
                                  dg_tensor *logits, int legacy) {
    dg_paged_mqa_problem p = {0};
    DG_TRY(dg_paged_mqa_check_q_cache(&p, q, q_sf, kv_cache));
    const int64_t rows = p.batch * p.next_n;
    const dg_dtype w_allowed[3] = DG_MQA_WEIGHT_DTYPES;
    DG_TRY(dg_check_tensor(weights, "weights", 2));
    DG_TRY(dg_check_dtype_in(weights, "weights", w_allowed, 3));
    DG_TRY(dg_check_dim(weights, "weights", 0, rows));
    DG_TRY(dg_check_dim(weights, "weights", 1, p.h));
    DG_TRY(p.mx ? dg_check_last_dim_contiguous(weights, "weights") : dg_check_contiguous(weights, "weights"));
    p.weights = weights;
    DG_TRY(check_context_lens(context_lens, p.batch, p.next_n));
    p.context_lens = context_lens->data;
    p.context_lens_2d = context_lens->ndim == 2;
    DG_TRY(dg_check_tensor_dtype(block_table, "block_table", 2, DG_INT32));
    DG_TRY(dg_check_dim(block_table, "block_table", 0, p.batch));
    DG_TRY(dg_check_last_dim_contiguous(block_table, "block_table"));
    p.block_table = block_table->data;
    p.block_table_stride = block_table->strides[0];
    if (indices)
        DG_TRY(check_indices(indices, p.batch, p.next_n));
    const int32_t *idx = indices ? indices->data : NULL;
    DG_CHECK(max_context_len >= 0, DG_ERR_VALUE, "argument 'max_context_len' must be >= 0, got %d",
             max_context_len);
    p.max_context_len = max_context_len;
    p.clean_logits = clean_logits != 0;
    DG_TRY(check_contexts(&p, block_table->shape[1], idx));
    DG_TRY(check_schedule(&p, schedule_meta, idx));
    const dg_tensor *ins[] = {q, q_sf, kv_cache, weights, context_lens, block_table, schedule_meta, indices};
    const char *names[] = {"q", "q_sf", "kv_cache", "weights", "context_lens", "block_table", "schedule_meta",
                           "indices"};
    int is_query = 0;
    DG_TRY(check_paged_logits(&p, logits, legacy, &is_query, ins, names, 8));
    if (is_query)
        return DG_OK;
    dg_tensor w32;
    void *copy;
    DG_TRY(dg_mqa_widen_f16_weights(&p.weights, &w32, &copy));
    dg_status st;
    if (dg_use_reference()) {
        DG_PATH_REFERENCE("");
        st = dg_ref_paged_mqa_logits(&p);
    } else {
        st = dg_paged_mqa_logits_fast(&p);
    }
    dg_free(copy);
    return st;
}

dg_status dg_fp8_fp4_paged_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv_cache,
                                      const dg_tensor *weights, const dg_tensor *context_lens,
                                      const dg_tensor *block_table, const dg_tensor *schedule_meta,
                                      int max_context_len, int clean_logits, const dg_tensor *indices,
                                      dg_tensor *logits) {
    dg_api_begin("dg_fp8_fp4_paged_mqa_logits");
    return paged_mqa_logits(q, q_sf, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                            clean_logits, indices, logits, 0);
}

dg_status dg_fp8_paged_mqa_logits(const dg_tensor *q, const dg_tensor *kv_cache, const dg_tensor *weights,
                                  const dg_tensor *context_lens, const dg_tensor *block_table,
                                  const dg_tensor *schedule_meta, int max_context_len, int clean_logits,
                                  const dg_tensor *indices, dg_tensor *logits) {
    dg_api_begin("dg_fp8_paged_mqa_logits");
    return paged_mqa_logits(q, NULL, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                            clean_logits, indices, logits, 1);
}
