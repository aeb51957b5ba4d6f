/*
 * mqa_logits.c - dg_fp8_mqa_logits and dg_fp8_fp4_mqa_logits (SPEC 5): argument checks,
 * the query form, then the reference kernel. Shapes and layouts follow DeepGEMM's
 * csrc/apis/attention.hpp; see deepgemm.h for the contract.
 */
#include "core/internal.h"
#include "kernels/mqa_kernels.h"
#include "reference/ref_mqa.h"
#include "api/mqa_checks.h"

#include <string.h>

/* DeepGEMM allocates logits rows padded to 1024 bytes, with at least 256 (its BLOCK_KV)
 * columns of slack past SK in the uncompressed case. */
enum { MQA_BLOCK_KV = 256, MQA_ROW_ALIGN_BYTES = 1024 };

/* An INT32 vector [n], contiguous (DeepGEMM: cu_seq_len_k_start/end). */
static dg_status check_i32_vector(const dg_tensor *t, const char *name, int64_t n) {
    DG_TRY(dg_check_tensor_dtype(t, name, 1, DG_INT32));
    DG_TRY(dg_check_dim(t, name, 0, n));
    return dg_check_contiguous(t, name);
}

/* q, q_sf, kv, kv_sf: dtypes, shapes, contiguity; fills the problem's extents. */
dg_status dg_mqa_widen_f16_weights(const dg_tensor **w, dg_tensor *view, void **copy) {
    *copy = NULL;
    if ((*w)->dtype != DG_FLOAT16)
        return DG_OK;
    const int64_t rows = (*w)->shape[0], h = (*w)->shape[1];
    float *f = dg_malloc((size_t)(rows * h) * sizeof(float) + 1); /* + 1: never malloc(0) */
    DG_CHECK(f != NULL, DG_ERR_ALLOC, "no memory for a float32 copy of the float16 'weights' [%lld, %lld]",
             (long long)rows, (long long)h);
    for (int64_t i = 0; i < rows; ++i) {
        const uint16_t *src = (const uint16_t *)(*w)->data + i * (*w)->strides[0];
        for (int64_t j = 0; j < h; ++j)
            f[i * h + j] = dg_f16_to_float(src[j]);
    }
    *view = dg_tensor_2d(f, DG_FLOAT32, rows, h);
    *w = view;
    *copy = f;
    return DG_OK;
}

dg_status dg_mqa_check_q_format(const dg_tensor *q, int ndim, int mx) {
    DG_TRY(dg_check_tensor(q, "q", ndim));
    if (mx) {
        const dg_dtype allowed[2] = {DG_FP4_E2M1X2, DG_FLOAT8_E4M3};
        return dg_check_dtype_in(q, "q", allowed, 2);
    }
    DG_CHECK(q->dtype == DG_FLOAT8_E4M3, DG_ERR_DTYPE,
             "argument 'q' must be float8_e4m3 without q_sf (FP4 needs its q_sf), got %s", dg_dtype_name(q->dtype));
    return DG_OK;
}

dg_status dg_mqa_check_q_kv(dg_mqa_problem *p, const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv,
                             const dg_tensor *kv_sf) {
    /* q_sf given: MXFP4 (packed E2M1) or MXFP8 (E4M3), both with per-32 UE8M0 scales packed
     * in INT32 words; q_sf NULL: FP8 with a float32 scale per kv row. */
    const int mx = q_sf != NULL;
    DG_TRY(dg_mqa_check_q_format(q, 3, mx));
    const int fp4 = q->dtype == DG_FP4_E2M1X2;
    const dg_dtype data_dt = q->dtype;
    DG_TRY(dg_check_contiguous(q, "q"));
    p->fp4 = fp4;
    p->mx = mx;
    p->s = q->shape[0];
    p->h = q->shape[1];
    DG_CHECK(dg_mul_ok(q->shape[2], fp4 ? 2 : 1, &p->d), DG_ERR_OVERFLOW,
             "argument 'q': its head dimension %lld overflows", (long long)q->shape[2]);
    DG_CHECK(p->h >= 1, DG_ERR_SHAPE, "argument 'q' must have at least one head");
    DG_CHECK(p->d >= 1, DG_ERR_SHAPE, "argument 'q' must have a non-empty head dimension");
    /* an empty q (S = 0) may claim any H and D; the per-token buffers hold H x D values */
    int64_t hd;
    DG_CHECK(dg_mul_ok(p->h, p->d, &hd) && hd <= DG_MAX_SPAN_BYTES, DG_ERR_OVERFLOW,
             "argument 'q': %lld heads of %lld elements are more than any process can address",
             (long long)p->h, (long long)p->d);
    if (mx) {
        DG_CHECK(p->d % 32 == 0 && p->d <= 128, DG_ERR_SHAPE,
                 "argument 'q': the %s head dim must be a multiple of 32 and at most 128 (one packed "
                 "int32 of per-32 scales), got %lld", fp4 ? "FP4" : "MXFP8", (long long)p->d);
        DG_TRY(dg_check_tensor_dtype(q_sf, "q_sf", 2, DG_INT32));
        DG_TRY(dg_check_dim(q_sf, "q_sf", 0, p->s));
        DG_TRY(dg_check_dim(q_sf, "q_sf", 1, p->h));
        DG_TRY(dg_check_contiguous(q_sf, "q_sf"));
    }
    DG_TRY(dg_check_tensor_dtype(kv, "kv", 2, data_dt));
    DG_TRY(dg_check_dim(kv, "kv", 1, fp4 ? p->d / 2 : p->d));
    DG_TRY(dg_check_contiguous(kv, "kv"));
    p->sk = kv->shape[0];
    DG_TRY(dg_check_tensor_dtype(kv_sf, "kv_sf", 1, mx ? DG_INT32 : DG_FLOAT32));
    DG_TRY(dg_check_dim(kv_sf, "kv_sf", 0, p->sk));
    DG_TRY(dg_check_contiguous(kv_sf, "kv_sf"));
    p->q = q;
    p->q_sf = q_sf;
    p->kv = kv;
    p->kv_sf = kv_sf;
    return DG_OK;
}

/* Every row's range lies in [0, SK] and fits the compressed width. */
static dg_status check_ranges(const dg_mqa_problem *p) {
    for (int64_t i = 0; i < p->s; ++i) {
        const int64_t ks = p->ks[i], ke = p->ke[i];
        DG_CHECK(ks >= 0 && ks <= p->sk, DG_ERR_VALUE,
                 "argument 'cu_seq_len_k_start': entry %lld is %lld, outside [0, %lld]", (long long)i,
                 (long long)ks, (long long)p->sk);
        DG_CHECK(ke >= ks && ke <= p->sk, DG_ERR_VALUE,
                 "argument 'cu_seq_len_k_end': entry %lld is %lld, outside [cu_seq_len_k_start = %lld, %lld]",
                 (long long)i, (long long)ke, (long long)ks, (long long)p->sk);
        DG_CHECK(p->max_seqlen_k == 0 || ke - ks <= p->max_seqlen_k, DG_ERR_VALUE,
                 "argument 'max_seqlen_k' (%lld) is smaller than row %lld's range length %lld",
                 (long long)p->max_seqlen_k, (long long)i, (long long)(ke - ks));
    }
    return DG_OK;
}

/* The logits descriptor: query form, or a caller-allocated view to check. */
static dg_status check_logits(dg_mqa_problem *p, dg_tensor *logits, const dg_tensor *ks, const dg_tensor *ke,
                              int legacy, int *is_query) {
    DG_CHECK(logits != NULL, DG_ERR_NULL_POINTER, "argument 'logits' is NULL");
    *is_query = logits->data == NULL;
    /* The legacy query form always answers FLOAT32; otherwise the caller's dtype is the ask. */
    dg_tensor want = *logits;
    if (*is_query && legacy)
        want.dtype = DG_FLOAT32;
    const dg_dtype allowed[2] = {DG_FLOAT32, DG_BFLOAT16};
    DG_TRY(dg_check_dtype_in(&want, "logits", allowed, legacy ? 1 : 2));
    DG_CHECK(p->weights->dtype != DG_BFLOAT16 || want.dtype == DG_BFLOAT16, DG_ERR_DTYPE,
             "argument 'weights' may be bfloat16 only with bfloat16 logits");
    const int64_t width = p->max_seqlen_k > 0 ? p->max_seqlen_k : p->sk;
    if (*is_query) {
        const int64_t elems = MQA_ROW_ALIGN_BYTES / (int64_t)dg_dtype_size(want.dtype);
        const int64_t stride = p->max_seqlen_k > 0 ? dg_align(dg_align(width, MQA_BLOCK_KV), elems)
                                                   : dg_align(width + MQA_BLOCK_KV, elems);
        const int64_t shape[2] = {p->s, width};
        *logits = dg_tensor_make(NULL, want.dtype, 2, shape);
        logits->strides[0] = stride;
        return DG_OK;
    }
    DG_TRY(dg_check_tensor(logits, "logits", 2));
    DG_TRY(dg_check_dim(logits, "logits", 0, p->s));
    DG_TRY(dg_check_dim(logits, "logits", 1, width));
    DG_TRY(dg_check_last_dim_contiguous(logits, "logits"));
    DG_TRY(dg_check_output(logits, "logits"));
    const struct { const dg_tensor *t; const char *name; } ins[] = {
        {p->q, "q"}, {p->q_sf, "q_sf"}, {p->kv, "kv"}, {p->kv_sf, "kv_sf"}, {p->weights, "weights"},
        {ks, "cu_seq_len_k_start"}, {ke, "cu_seq_len_k_end"},
    };
    for (size_t k = 0; k < sizeof ins / sizeof ins[0]; ++k)
        DG_TRY(dg_check_no_overlap(logits, "logits", ins[k].t, ins[k].name, false));
    p->logits = logits;
    return DG_OK;
}

/* ---- DeepGEMM 2.8's prefill schedule ------------------------------------------------------- */

/* DeepGEMM's query rows per block (128 / num_heads) and kv rows per split. */
static int64_t sched_block_q(int64_t h) { return h <= 128 ? 128 / h : 1; }
enum { MQA_SCHED_SPLIT_KV = 256 };

static int64_t sched_words(int64_t s, int64_t h, int num_sms) {
    return dg_align(3 * (int64_t)num_sms, 2) + 2 * dg_ceil_div(s, sched_block_q(h));
}

/* Fills out[sched_words] (see deepgemm.h): per query block the clamped span of its rows and its
 * number of 256-row splits; then num_sms parts of equal split counts (the first T % n one more). */
static dg_status build_mqa_schedule(const int32_t *ks, const int32_t *ke, int64_t s, int64_t sk, int64_t h,
                                    int num_sms, int32_t *out) {
    const int64_t bq = sched_block_q(h), nqb = dg_ceil_div(s, bq), head = dg_align(3 * (int64_t)num_sms, 2);
    int64_t *prefix = dg_malloc((size_t)(nqb > 0 ? nqb : 1) * sizeof(int64_t));
    DG_CHECK(prefix != NULL, DG_ERR_ALLOC, "no memory for the schedule of %lld query blocks", (long long)nqb);
    int64_t total = 0;
    for (int64_t b = 0; b < nqb; ++b) {
        int64_t lo = sk, hi = 0;
        for (int64_t i = b * bq; i < (b + 1) * bq && i < s; ++i) {
            const int64_t a = ks[i] < sk ? ks[i] : sk, e = ke[i] < sk ? ke[i] : sk;
            if (a < e) {
                lo = a < lo ? a : lo;
                hi = e > hi ? e : hi;
            }
        }
        if (lo >= hi)
            lo = hi = 0;
        out[head + 2 * b] = (int32_t)lo;
        out[head + 2 * b + 1] = (int32_t)hi;
        total += hi > lo ? dg_ceil_div(hi - lo / MQA_SCHED_SPLIT_KV * MQA_SCHED_SPLIT_KV, MQA_SCHED_SPLIT_KV) : 0;
        prefix[b] = total;
    }
    const int64_t q = total / num_sms, rem = total % num_sms;
    for (int64_t part = 0; part < num_sms; ++part) {
        const int64_t w = part * q + (part < rem ? part : rem), count = q + (part < rem);
        int64_t lo = 0, hi = nqb; /* first block whose prefix exceeds w */
        while (lo < hi) {
            const int64_t mid = (lo + hi) / 2;
            if (prefix[mid] <= w)
                lo = mid + 1;
            else
                hi = mid;
        }
        out[3 * part] = (int32_t)lo;
        out[3 * part + 1] = (int32_t)(lo < nqb ? w - (lo ? prefix[lo - 1] : 0) : 0);
        out[3 * part + 2] = (int32_t)count;
    }
    if (head > 3 * (int64_t)num_sms)
        out[head - 1] = 0;
    dg_free(prefix);
    return DG_OK;
}

/* ks, ke INT32 [S] with 0 <= ks <= ke; fills *s. */
static dg_status check_sched_ranges(const dg_tensor *ks, const dg_tensor *ke, int64_t *s) {
    DG_TRY(dg_check_tensor_dtype(ks, "cu_seq_len_k_start", 1, DG_INT32));
    DG_TRY(dg_check_contiguous(ks, "cu_seq_len_k_start"));
    *s = ks->shape[0];
    DG_TRY(check_i32_vector(ke, "cu_seq_len_k_end", *s));
    const int32_t *a = ks->data, *e = ke->data;
    for (int64_t i = 0; i < *s; ++i)
        DG_CHECK(a[i] >= 0 && a[i] <= e[i], DG_ERR_VALUE,
                 "arguments 'cu_seq_len_k_start'/'cu_seq_len_k_end': row %lld has the range [%d, %d)",
                 (long long)i, a[i], e[i]);
    return DG_OK;
}

dg_status dg_get_mqa_logits_metadata(const dg_tensor *cu_seq_len_k_start, const dg_tensor *cu_seq_len_k_end,
                                     int num_kv_tokens, int num_heads, dg_tensor *schedule_meta) {
    dg_api_begin("dg_get_mqa_logits_metadata");
    int64_t s;
    DG_TRY(check_sched_ranges(cu_seq_len_k_start, cu_seq_len_k_end, &s));
    DG_CHECK(s >= 1, DG_ERR_SHAPE, "argument 'cu_seq_len_k_start' must have at least one query row");
    DG_CHECK(num_kv_tokens >= 1, DG_ERR_VALUE, "argument 'num_kv_tokens' must be >= 1, got %d", num_kv_tokens);
    DG_CHECK(num_heads >= 1, DG_ERR_VALUE, "argument 'num_heads' must be >= 1, got %d", num_heads);
    const int num_sms = dg_get_num_sms();
    const int64_t words = sched_words(s, num_heads, num_sms);
    DG_CHECK(words <= INT32_MAX, DG_ERR_OVERFLOW, "argument 'cu_seq_len_k_start': too many query rows");
    DG_CHECK(schedule_meta != NULL, DG_ERR_NULL_POINTER, "argument 'schedule_meta' is NULL");
    if (schedule_meta->data == NULL) {
        *schedule_meta = dg_tensor_make(NULL, DG_INT32, 1, &words);
        return DG_OK;
    }
    DG_TRY(dg_check_tensor_dtype(schedule_meta, "schedule_meta", 1, DG_INT32));
    DG_TRY(dg_check_dim(schedule_meta, "schedule_meta", 0, words));
    DG_TRY(dg_check_contiguous(schedule_meta, "schedule_meta"));
    DG_TRY(dg_check_no_overlap(schedule_meta, "schedule_meta", cu_seq_len_k_start, "cu_seq_len_k_start", false));
    DG_TRY(dg_check_no_overlap(schedule_meta, "schedule_meta", cu_seq_len_k_end, "cu_seq_len_k_end", false));
    return build_mqa_schedule(cu_seq_len_k_start->data, cu_seq_len_k_end->data, s, num_kv_tokens, num_heads,
                              num_sms, schedule_meta->data);
}

/* schedule_meta must be what dg_get_mqa_logits_metadata gives for this problem now. */
static dg_status check_mqa_schedule(const dg_mqa_problem *p, const dg_tensor *meta) {
    const int num_sms = dg_get_num_sms();
    const int64_t words = sched_words(p->s, p->h, num_sms);
    DG_CHECK(p->s >= 1 && p->sk >= 1, DG_ERR_SHAPE,
             "argument 'schedule_meta' needs at least one query row and one kv row (DeepGEMM's rule)");
    DG_TRY(dg_check_tensor_dtype(meta, "schedule_meta", 1, DG_INT32));
    DG_TRY(dg_check_dim(meta, "schedule_meta", 0, words));
    DG_TRY(dg_check_contiguous(meta, "schedule_meta"));
    int32_t *want = dg_malloc((size_t)words * sizeof(int32_t));
    DG_CHECK(want != NULL, DG_ERR_ALLOC, "no memory to check 'schedule_meta'");
    dg_status st = build_mqa_schedule(p->ks, p->ke, p->s, p->sk, p->h, num_sms, want);
    if (st == DG_OK && memcmp(want, meta->data, (size_t)words * sizeof(int32_t)) != 0)
        st = dg_fail(DG_ERR_VALUE, "argument 'schedule_meta' does not match cu_seq_len_k_start/end, the kv rows, "
                                   "the heads and the current num_sms (%d); recompute it with "
                                   "dg_get_mqa_logits_metadata", num_sms);
    dg_free(want);
    return st;
}

static dg_status mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv, const dg_tensor *kv_sf,
                            const dg_tensor *weights, const dg_tensor *ks, const dg_tensor *ke, int clean_logits,
                            int max_seqlen_k, const dg_tensor *schedule_meta, dg_tensor *logits, int legacy) {
    dg_mqa_problem p = {0};
    DG_TRY(dg_mqa_check_q_kv(&p, q, q_sf, kv, kv_sf));
    const dg_dtype w_allowed[3] = DG_MQA_WEIGHT_DTYPES;
    DG_TRY(dg_check_tensor(weights, "weights", 2));
    DG_TRY(dg_check_dtype_in(weights, "weights", w_allowed, 3));
    DG_TRY(dg_check_dim(weights, "weights", 0, p.s));
    DG_TRY(dg_check_dim(weights, "weights", 1, p.h));
    DG_TRY(dg_check_last_dim_contiguous(weights, "weights"));
    p.weights = weights;
    DG_TRY(check_i32_vector(ks, "cu_seq_len_k_start", p.s));
    DG_TRY(check_i32_vector(ke, "cu_seq_len_k_end", p.s));
    DG_CHECK(max_seqlen_k >= 0, DG_ERR_VALUE, "argument 'max_seqlen_k' must be >= 0, got %d", max_seqlen_k);
    p.ks = ks->data;
    p.ke = ke->data;
    p.max_seqlen_k = max_seqlen_k;
    p.clean_logits = clean_logits != 0;
    DG_TRY(check_ranges(&p));
    if (schedule_meta)
        DG_TRY(check_mqa_schedule(&p, schedule_meta));
    int is_query = 0;
    DG_TRY(check_logits(&p, logits, ks, ke, legacy, &is_query));
    if (is_query)
        return DG_OK;
    dg_tensor w32;
    void *copy;
    DG_TRY(dg_mqa_widen_f16_weights(&p.weights, &w32, &copy));
    dg_status st;
    if (dg_use_reference()) {
        DG_PATH_REFERENCE("");
        st = dg_ref_mqa_logits(&p);
    } else {
        st = dg_mqa_logits_fast(&p);
    }
    dg_free(copy);
    return st;
}

dg_status dg_fp8_fp4_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv,
                                const dg_tensor *kv_sf, const dg_tensor *weights,
                                const dg_tensor *cu_seq_len_k_start, const dg_tensor *cu_seq_len_k_end,
                                int clean_logits, int max_seqlen_k, dg_tensor *logits) {
    dg_api_begin("dg_fp8_fp4_mqa_logits");
    return mqa_logits(q, q_sf, kv, kv_sf, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                      max_seqlen_k, NULL, logits, 0);
}

dg_status dg_fp8_fp4_mqa_logits_scheduled(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv,
                                          const dg_tensor *kv_sf, const dg_tensor *weights,
                                          const dg_tensor *cu_seq_len_k_start, const dg_tensor *cu_seq_len_k_end,
                                          int clean_logits, int max_seqlen_k, const dg_tensor *schedule_meta,
                                          dg_tensor *logits) {
    dg_api_begin("dg_fp8_fp4_mqa_logits_scheduled");
    return mqa_logits(q, q_sf, kv, kv_sf, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                      max_seqlen_k, schedule_meta, logits, 0);
}

dg_status dg_fp8_mqa_logits(const dg_tensor *q, const dg_tensor *kv, const dg_tensor *kv_sf,
                            const dg_tensor *weights, const dg_tensor *cu_seq_len_k_start,
                            const dg_tensor *cu_seq_len_k_end, int clean_logits, int max_seqlen_k,
                            dg_tensor *logits) {
    dg_api_begin("dg_fp8_mqa_logits");
    return mqa_logits(q, NULL, kv, kv_sf, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                      max_seqlen_k, NULL, logits, 1);
}
