/*
 * sparse_mqa_logits.c - DeepGEMM 2.8's sparse lightning indexer (SPEC 5): the two metadata
 * builders and dg_fp8_fp4_sparse_mqa_logits / dg_fp8_fp4_paged_sparse_mqa_logits. Shapes,
 * limits and the metadata size follow DeepGEMM's csrc/apis/attention.hpp; see deepgemm.h.
 *
 * The metadata carries everything the logits call needs besides q, kv and weights (DeepGEMM's
 * logits call takes no ranges, indices or block table either). Its size is DeepGEMM's; its
 * contents are the CPU's: int32 words
 *   [0, 8)            header: magic, flags (paged, unaligned ks, FP4), S, N, sparse_block_kv,
 *                     num_sms the size was computed for, page_kv (paged) or num_kv_tokens
 *   [8, 8 + 2S)       per row: the kv range [begin, end) (paged: [0, context_len))
 *   then 2 S N words  per (row, block): its first token (DG_SPARSE_NO_BLOCK when it has no token
 *                     in the row's range, or is past the row's nb blocks) and, paged, its page
 * and zeros after. DeepGEMM's size always leaves room for this (checked anyway).
 */
#include "api/mqa_checks.h"
#include "core/internal.h"
#include "kernels/mqa_kernels.h"
#include "reference/ref_mqa.h"

#include <string.h>

enum {
    SPARSE_MAGIC = 0x4D534744, /* "DGSM" */
    SPARSE_HDR_WORDS = 8,
    SPARSE_PAGED = 1,
    SPARSE_UNALIGNED = 2,
    SPARSE_FP4 = 4,
    SPARSE_MAX_BLOCKS = 4096, /* DeepGEMM's limit on num_max_sparse_blocks */
    SPARSE_MAX_SMS = 256,     /* DeepGEMM's metadata kernel schedules at most 256 SMs */
    SPARSE_ROW_ALIGN_BYTES = 1024,
};

/* ---- DeepGEMM's metadata size ---------------------------------------------------------------- */

/* DeepGEMM's KV split of the sparse kernel: 640 tokens for FP4, 512 for FP8. */
static int64_t sparse_split_kv(int fp4) { return fp4 ? 640 : 512; }

/* get_num_metadata_bytes: a 16-byte header, KV splits of (16-byte header + 8 bytes per block),
 * 16-byte schedule entries for the splits rounded up to num_sms. Pairs of queries share splits in
 * the contiguous form. S = 0 (refused by DeepGEMM) gets the CPU header alone. */
static dg_status metadata_bytes(int64_t s, int64_t n, int64_t sbkv, int fp4, int paged, int64_t num_sms,
                                int64_t *out) {
    if (s == 0) {
        *out = SPARSE_HDR_WORDS * 4;
        return DG_OK;
    }
    const int64_t per_split = sparse_split_kv(fp4) / sbkv;
    const int64_t split_bytes = 16 + per_split * 8;
    int64_t splits, body, entries;
    const bool ok = paged ? dg_mul_ok(s, dg_ceil_div(n, per_split), &splits)
                          : dg_mul_ok(dg_ceil_div(s, 2), dg_ceil_div(2 * n, per_split), &splits);
    DG_CHECK(ok && dg_mul_ok(splits, split_bytes, &body) && dg_mul_ok(dg_align(splits, num_sms), 16, &entries) &&
                 body <= DG_MAX_SPAN_BYTES && entries <= DG_MAX_SPAN_BYTES,
             DG_ERR_OVERFLOW, "the sparse MQA metadata of %lld queries x %lld blocks is too large", (long long)s,
             (long long)n);
    *out = 16 + body + entries;
    /* The CPU's words fit: per query pair at least 2 * 16 + 16 N bytes against 16 + 16 N. */
    DG_CHECK((SPARSE_HDR_WORDS + 2 * s + 2 * s * n) * 4 <= *out, DG_ERR_INTERNAL,
             "sparse MQA metadata layout does not fit DeepGEMM's size");
    return DG_OK;
}

static dg_status check_block_args(int num_max_sparse_blocks, int sparse_block_kv) {
    DG_CHECK(sparse_block_kv == 8 || sparse_block_kv == 16, DG_ERR_VALUE,
             "argument 'sparse_block_kv' must be 8 or 16, got %d", sparse_block_kv);
    DG_CHECK(num_max_sparse_blocks > 0 && num_max_sparse_blocks % 4 == 0 &&
                 num_max_sparse_blocks <= SPARSE_MAX_BLOCKS,
             DG_ERR_VALUE, "argument 'num_max_sparse_blocks' must be a positive multiple of 4 up to %d, got %d",
             SPARSE_MAX_BLOCKS, num_max_sparse_blocks);
    return DG_OK;
}

static dg_status check_qk_dtype(dg_dtype qk, int *fp4) {
    DG_CHECK(qk == DG_FP4_E2M1X2 || qk == DG_FLOAT8_E4M3, DG_ERR_DTYPE,
             "argument 'qk_dtype' must be fp4_e2m1x2 or float8_e4m3, got %s", dg_dtype_name(qk));
    *fp4 = qk == DG_FP4_E2M1X2;
    return DG_OK;
}

/* ---- metadata builders --------------------------------------------------------------------- */

/* What one builder call resolves. */
typedef struct sparse_src {
    int64_t s, n, sbkv, page_kv;
    int flags;
    const int32_t *ks, *ke;    /* contiguous */
    const int32_t *ctx;        /* paged */
    const int32_t *table;      /* paged: row i at table + i * table_stride */
    int64_t table_stride, table_width;
    const int32_t *idx;        /* [S, N] */
} sparse_src;

static dg_status check_indices_tensor(const dg_tensor *t, int64_t *s, int64_t *n) {
    DG_TRY(dg_check_tensor_dtype(t, "sparse_kv_block_indices", 2, DG_INT32));
    DG_TRY(dg_check_contiguous(t, "sparse_kv_block_indices"));
    *s = t->shape[0];
    *n = t->shape[1];
    DG_CHECK(*n > 0 && *n % 4 == 0 && *n <= SPARSE_MAX_BLOCKS, DG_ERR_SHAPE,
             "argument 'sparse_kv_block_indices': its %lld blocks per row must be a positive multiple of 4 up "
             "to %d", (long long)*n, SPARSE_MAX_BLOCKS);
    return DG_OK;
}

/* Validates the ranges (and pages), then writes the header, rows and blocks. */
static dg_status build_metadata(const sparse_src *in, int64_t aux, int num_sms, int32_t *out) {
    const int paged = in->flags & SPARSE_PAGED, unaligned = in->flags & SPARSE_UNALIGNED;
    int32_t *rows = out + SPARSE_HDR_WORDS, *slots = rows + 2 * in->s;
    for (int64_t i = 0; i < in->s; ++i) {
        const int64_t begin = paged ? 0 : in->ks[i], end = paged ? in->ctx[i] : in->ke[i];
        if (!paged)
            DG_CHECK(unaligned || begin == end || begin % in->sbkv == 0, DG_ERR_VALUE,
                     "argument 'cu_seq_len_k_start': row %lld starts at %lld, not a multiple of sparse_block_kv "
                     "%lld (pass use_unaligned_ks)", (long long)i, (long long)begin, (long long)in->sbkv);
        else
            DG_CHECK(dg_ceil_div(end, in->page_kv) <= in->table_width, DG_ERR_VALUE,
                     "argument 'block_table': row %lld needs %lld pages, the table has %lld", (long long)i,
                     (long long)dg_ceil_div(end, in->page_kv), (long long)in->table_width);
        const int64_t nb_all = dg_ceil_div(end - begin, in->sbkv);
        const int64_t nb = nb_all < in->n ? nb_all : in->n;
        const int64_t off = unaligned ? begin % in->sbkv : 0;
        for (int64_t j = 0; j < in->n; ++j) {
            int32_t *slot = slots + (i * in->n + j) * 2;
            slot[0] = DG_SPARSE_NO_BLOCK;
            slot[1] = 0;
            if (j >= nb)
                continue;
            const int64_t start = (int64_t)in->idx[i * in->n + j] * in->sbkv + off;
            if (start >= end || start + in->sbkv <= begin)
                continue; /* no token of the row's range: scores nothing */
            slot[0] = (int32_t)start;
            if (!paged)
                continue;
            const int32_t page = in->table[i * in->table_stride + start / in->page_kv];
            DG_CHECK(page >= 0, DG_ERR_VALUE, "argument 'block_table': entry [%lld, %lld] = %d is negative",
                     (long long)i, (long long)(start / in->page_kv), page);
            slot[1] = page;
        }
        rows[2 * i] = (int32_t)begin;
        rows[2 * i + 1] = (int32_t)end;
    }
    const int32_t hdr[SPARSE_HDR_WORDS] = {SPARSE_MAGIC, in->flags, (int32_t)in->s, (int32_t)in->n,
                                           (int32_t)in->sbkv, num_sms, (int32_t)aux, 0};
    memcpy(out, hdr, sizeof hdr);
    return DG_OK;
}

/* Query form, or the caller's UINT8 buffer of the right size; then the build, zeros after. */
static dg_status write_metadata(const sparse_src *in, int fp4, int64_t aux, dg_tensor *metadata,
                                const dg_tensor *const *ins, const char *const *names, int nins) {
    const int num_sms = dg_get_num_sms() < SPARSE_MAX_SMS ? dg_get_num_sms() : SPARSE_MAX_SMS;
    int64_t bytes;
    DG_TRY(metadata_bytes(in->s, in->n, in->sbkv, fp4, in->flags & SPARSE_PAGED, num_sms, &bytes));
    DG_CHECK(metadata != NULL, DG_ERR_NULL_POINTER, "argument 'metadata' is NULL");
    if (metadata->data == NULL) {
        *metadata = dg_tensor_make(NULL, DG_UINT8, 1, &bytes);
        return DG_OK;
    }
    DG_TRY(dg_check_tensor_dtype(metadata, "metadata", 1, DG_UINT8));
    DG_TRY(dg_check_dim(metadata, "metadata", 0, bytes));
    DG_TRY(dg_check_contiguous(metadata, "metadata"));
    DG_CHECK((uintptr_t)metadata->data % 4 == 0, DG_ERR_LAYOUT, "argument 'metadata' must be 4-byte aligned");
    for (int k = 0; k < nins; ++k)
        DG_TRY(dg_check_no_overlap(metadata, "metadata", ins[k], names[k], false));
    const size_t used = (size_t)(SPARSE_HDR_WORDS + 2 * in->s + 2 * in->s * in->n) * 4;
    int32_t *words = dg_malloc(used);
    DG_CHECK(words != NULL, DG_ERR_ALLOC, "no memory for the sparse MQA metadata");
    const dg_status st = build_metadata(in, aux, num_sms, words);
    if (st == DG_OK) { /* nothing written before every entry was checked */
        memcpy(metadata->data, words, used);
        memset((uint8_t *)metadata->data + used, 0, (size_t)bytes - used);
    }
    dg_free(words);
    return st;
}

dg_status dg_get_sparse_mqa_logits_metadata(const dg_tensor *cu_seq_len_k_start, const dg_tensor *cu_seq_len_k_end,
                                            int num_kv_tokens, const dg_tensor *sparse_kv_block_indices,
                                            dg_dtype qk_dtype, int sparse_block_kv, int use_unaligned_ks,
                                            dg_tensor *metadata) {
    dg_api_begin("dg_get_sparse_mqa_logits_metadata");
    int fp4 = 0;
    int64_t s = 0, n = 0;
    DG_TRY(check_indices_tensor(sparse_kv_block_indices, &s, &n));
    DG_TRY(check_block_args((int)n, sparse_block_kv));
    DG_TRY(check_qk_dtype(qk_dtype, &fp4));
    DG_CHECK(num_kv_tokens >= 0, DG_ERR_VALUE, "argument 'num_kv_tokens' must be >= 0, got %d", num_kv_tokens);
    const char *names[] = {"cu_seq_len_k_start", "cu_seq_len_k_end"};
    const dg_tensor *ts[] = {cu_seq_len_k_start, cu_seq_len_k_end};
    for (int k = 0; k < 2; ++k) {
        DG_TRY(dg_check_tensor_dtype(ts[k], names[k], 1, DG_INT32));
        DG_TRY(dg_check_dim(ts[k], names[k], 0, s));
        DG_TRY(dg_check_contiguous(ts[k], names[k]));
    }
    const int32_t *ks = cu_seq_len_k_start->data, *ke = cu_seq_len_k_end->data;
    for (int64_t i = 0; i < s; ++i)
        DG_CHECK(ks[i] >= 0 && ks[i] <= ke[i] && ke[i] <= num_kv_tokens, DG_ERR_VALUE,
                 "arguments 'cu_seq_len_k_start'/'cu_seq_len_k_end': row %lld has the range [%d, %d), not within "
                 "[0, num_kv_tokens = %d]", (long long)i, ks[i], ke[i], num_kv_tokens);
    const int flags = (use_unaligned_ks ? SPARSE_UNALIGNED : 0) | (fp4 ? SPARSE_FP4 : 0);
    const sparse_src in = {.s = s, .n = n, .sbkv = sparse_block_kv, .flags = flags, .ks = ks, .ke = ke,
                           .idx = sparse_kv_block_indices->data};
    const dg_tensor *ins[] = {cu_seq_len_k_start, cu_seq_len_k_end, sparse_kv_block_indices};
    const char *in_names[] = {"cu_seq_len_k_start", "cu_seq_len_k_end", "sparse_kv_block_indices"};
    return write_metadata(&in, fp4, num_kv_tokens, metadata, ins, in_names, 3);
}

dg_status dg_get_paged_sparse_mqa_logits_metadata(const dg_tensor *context_lens, const dg_tensor *block_table,
                                                  const dg_tensor *indices, int page_kv,
                                                  const dg_tensor *sparse_kv_block_indices, dg_dtype qk_dtype,
                                                  int sparse_block_kv, dg_tensor *metadata) {
    dg_api_begin("dg_get_paged_sparse_mqa_logits_metadata");
    int fp4 = 0;
    int64_t s = 0, n = 0;
    DG_TRY(check_indices_tensor(sparse_kv_block_indices, &s, &n));
    DG_TRY(check_block_args((int)n, sparse_block_kv));
    DG_TRY(check_qk_dtype(qk_dtype, &fp4));
    DG_CHECK(page_kv > 0 && page_kv % sparse_block_kv == 0, DG_ERR_VALUE,
             "argument 'page_kv' must be a positive multiple of sparse_block_kv (%d), got %d", sparse_block_kv,
             page_kv);
    DG_TRY(dg_check_tensor(context_lens, "context_lens", -1));
    DG_CHECK(context_lens->dtype == DG_INT32, DG_ERR_DTYPE, "argument 'context_lens' must be int32, got %s",
             dg_dtype_name(context_lens->dtype));
    DG_CHECK(dg_tensor_numel(context_lens) == s, DG_ERR_SHAPE,
             "argument 'context_lens' must have %lld elements (one per query), got %lld", (long long)s,
             (long long)dg_tensor_numel(context_lens));
    DG_TRY(dg_check_contiguous(context_lens, "context_lens"));
    const int32_t *ctx = context_lens->data;
    for (int64_t i = 0; i < s; ++i)
        DG_CHECK(ctx[i] >= 0, DG_ERR_VALUE, "argument 'context_lens': entry %lld is negative", (long long)i);
    DG_TRY(dg_check_tensor_dtype(block_table, "block_table", 2, DG_INT32));
    DG_TRY(dg_check_dim(block_table, "block_table", 0, s));
    DG_CHECK(block_table->shape[1] >= 1, DG_ERR_SHAPE, "argument 'block_table' must have at least one column");
    DG_TRY(dg_check_last_dim_contiguous(block_table, "block_table"));
    DG_TRY(dg_check_tensor_dtype(indices, "indices", 1, DG_INT32));
    DG_TRY(dg_check_dim(indices, "indices", 0, s));
    DG_TRY(dg_check_contiguous(indices, "indices"));
    const sparse_src in = {.s = s, .n = n, .sbkv = sparse_block_kv, .page_kv = page_kv,
                           .flags = SPARSE_PAGED | (fp4 ? SPARSE_FP4 : 0), .ctx = ctx, .table = block_table->data,
                           .table_stride = block_table->strides[0], .table_width = block_table->shape[1],
                           .idx = sparse_kv_block_indices->data};
    const dg_tensor *ins[] = {context_lens, block_table, indices, sparse_kv_block_indices};
    const char *in_names[] = {"context_lens", "block_table", "indices", "sparse_kv_block_indices"};
    return write_metadata(&in, fp4, page_kv, metadata, ins, in_names, 4);
}

/* ---- logits ---------------------------------------------------------------------------------- */

/* The metadata against the call: header, size, and every range and block it names (the kernels
 * then read only kv rows inside [0, sk) resp. pages inside [0, num_pages)). */
static dg_status check_metadata(dg_sparse_mqa_problem *p, const dg_tensor *meta, int unaligned, int64_t sk,
                                int64_t num_pages) {
    DG_TRY(dg_check_tensor_dtype(meta, "metadata", 1, DG_UINT8));
    DG_TRY(dg_check_contiguous(meta, "metadata"));
    DG_CHECK(meta->shape[0] >= SPARSE_HDR_WORDS * 4 && (uintptr_t)meta->data % 4 == 0, DG_ERR_VALUE,
             "argument 'metadata' is not sparse MQA metadata (too short or unaligned)");
    const int32_t *w = meta->data;
    const int flags = (p->paged ? SPARSE_PAGED : 0) | (unaligned ? SPARSE_UNALIGNED : 0) | (p->fp4 ? SPARSE_FP4 : 0);
    DG_CHECK(w[0] == SPARSE_MAGIC, DG_ERR_VALUE, "argument 'metadata' is not sparse MQA metadata");
    DG_CHECK(w[1] == flags, DG_ERR_VALUE,
             "argument 'metadata' was built for another form (paged %d, use_unaligned_ks %d, fp4 %d); this call "
             "is paged %d, use_unaligned_ks %d, fp4 %d", !!(w[1] & SPARSE_PAGED), !!(w[1] & SPARSE_UNALIGNED),
             !!(w[1] & SPARSE_FP4), p->paged, unaligned, p->fp4);
    DG_CHECK(w[2] == p->s && w[3] == p->nmsb && w[4] == p->sbkv, DG_ERR_VALUE,
             "argument 'metadata' was built for %d queries x %d blocks of %d; this call has %lld x %lld of %lld",
             w[2], w[3], w[4], (long long)p->s, (long long)p->nmsb, (long long)p->sbkv);
    DG_CHECK(w[5] >= 1 && w[5] <= SPARSE_MAX_SMS, DG_ERR_VALUE, "argument 'metadata' has a bad header");
    DG_CHECK(!p->paged || w[6] == p->page_kv, DG_ERR_VALUE,
             "argument 'metadata' was built for page_kv %d, the kv_cache has %lld", w[6], (long long)p->page_kv);
    int64_t bytes;
    DG_TRY(metadata_bytes(p->s, p->nmsb, p->sbkv, p->fp4, p->paged, w[5], &bytes));
    DG_TRY(dg_check_dim(meta, "metadata", 0, bytes));
    p->rows = w + SPARSE_HDR_WORDS;
    p->slots = p->rows + 2 * p->s;
    for (int64_t i = 0; i < p->s; ++i) {
        const int64_t begin = p->rows[2 * i], end = p->rows[2 * i + 1];
        DG_CHECK(begin >= 0 && begin <= end && (p->paged ? begin == 0 : end <= sk), DG_ERR_VALUE,
                 "argument 'metadata': row %lld's range [%lld, %lld) is outside the kv (%lld rows)", (long long)i,
                 (long long)begin, (long long)end, (long long)sk);
        for (int64_t j = 0; j < p->nmsb; ++j) {
            const int32_t *slot = p->slots + (i * p->nmsb + j) * 2;
            if (slot[0] == DG_SPARSE_NO_BLOCK)
                continue;
            DG_CHECK(slot[0] < end && (int64_t)slot[0] + p->sbkv > begin &&
                         (!p->paged || (slot[0] % p->sbkv == 0 && slot[1] >= 0 && slot[1] < num_pages)),
                     DG_ERR_VALUE, "argument 'metadata': block %lld of row %lld (token %d, page %d) is invalid for "
                     "this kv", (long long)j, (long long)i, slot[0], slot[1]);
        }
    }
    return DG_OK;
}

static dg_status check_weights(dg_sparse_mqa_problem *p, const dg_tensor *weights) {
    const dg_dtype allowed[3] = DG_MQA_WEIGHT_DTYPES;
    DG_TRY(dg_check_tensor(weights, "weights", 2));
    DG_TRY(dg_check_dtype_in(weights, "weights", allowed, 3));
    DG_TRY(dg_check_dim(weights, "weights", 0, p->s));
    DG_TRY(dg_check_dim(weights, "weights", 1, p->h));
    DG_TRY(dg_check_last_dim_contiguous(weights, "weights"));
    p->weights = weights;
    return DG_OK;
}

/* Query form, or the caller's logits [S, N * sbkv]. */
static dg_status check_sparse_logits(dg_sparse_mqa_problem *p, dg_tensor *logits, int *is_query,
                                     const dg_tensor *const *ins, const char *const *names, int nins) {
    DG_CHECK(logits != NULL, DG_ERR_NULL_POINTER, "argument 'logits' is NULL");
    *is_query = logits->data == NULL;
    const dg_dtype allowed[2] = {DG_FLOAT32, DG_BFLOAT16};
    DG_TRY(dg_check_dtype_in(logits, "logits", allowed, 2));
    DG_CHECK(p->weights->dtype != DG_BFLOAT16 || logits->dtype == DG_BFLOAT16, DG_ERR_DTYPE,
             "argument 'weights' may be bfloat16 only with bfloat16 logits");
    const int64_t width = p->nmsb * p->sbkv;
    if (*is_query) {
        const int64_t elems = SPARSE_ROW_ALIGN_BYTES / (int64_t)dg_dtype_size(logits->dtype);
        *logits = dg_tensor_2d(NULL, logits->dtype, p->s, width);
        logits->strides[0] = dg_align(width, elems);
        return DG_OK;
    }
    DG_TRY(dg_check_tensor(logits, "logits", 2));
    DG_TRY(dg_check_dim(logits, "logits", 0, p->s));
    DG_TRY(dg_check_dim(logits, "logits", 1, width));
    DG_TRY(dg_check_last_dim_contiguous(logits, "logits"));
    DG_TRY(dg_check_output(logits, "logits"));
    for (int k = 0; k < nins; ++k)
        DG_TRY(dg_check_no_overlap(logits, "logits", ins[k], names[k], false));
    p->logits = logits;
    return DG_OK;
}

static dg_status run_sparse(dg_sparse_mqa_problem *p) {
    dg_tensor w32;
    void *copy;
    DG_TRY(dg_mqa_widen_f16_weights(&p->weights, &w32, &copy));
    dg_status st;
    if (dg_use_reference()) {
        DG_PATH_REFERENCE("");
        st = dg_ref_sparse_mqa_logits(p);
    } else {
        st = dg_sparse_mqa_logits_fast(p);
    }
    dg_free(copy);
    return st;
}

dg_status dg_fp8_fp4_sparse_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv,
                                       const dg_tensor *kv_sf, const dg_tensor *weights, const dg_tensor *metadata,
                                       int num_max_sparse_blocks, int sparse_block_kv, int use_unaligned_ks,
                                       dg_tensor *logits) {
    dg_api_begin("dg_fp8_fp4_sparse_mqa_logits");
    dg_mqa_problem dense = {0};
    DG_TRY(dg_mqa_check_q_kv(&dense, q, q_sf, kv, kv_sf));
    DG_TRY(check_block_args(num_max_sparse_blocks, sparse_block_kv));
    dg_sparse_mqa_problem p = {.s = dense.s, .h = dense.h, .d = dense.d, .nmsb = num_max_sparse_blocks,
                               .sbkv = sparse_block_kv, .fp4 = dense.fp4, .mx = dense.mx, .q = q, .q_sf = q_sf, .kv = kv,
                               .kv_sf = kv_sf};
    DG_TRY(check_weights(&p, weights));
    DG_TRY(check_metadata(&p, metadata, use_unaligned_ks != 0, dense.sk, 0));
    const dg_tensor *ins[] = {q, q_sf, kv, kv_sf, weights, metadata};
    const char *names[] = {"q", "q_sf", "kv", "kv_sf", "weights", "metadata"};
    int is_query = 0;
    DG_TRY(check_sparse_logits(&p, logits, &is_query, ins, names, 6));
    return is_query ? DG_OK : run_sparse(&p);
}

dg_status dg_fp8_fp4_paged_sparse_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv_cache,
                                             const dg_tensor *weights, const dg_tensor *metadata,
                                             int num_max_sparse_blocks, int sparse_block_kv, dg_tensor *logits) {
    dg_api_begin("dg_fp8_fp4_paged_sparse_mqa_logits");
    dg_paged_mqa_problem dense = {0};
    DG_TRY(dg_paged_mqa_check_q_cache(&dense, q, q_sf, kv_cache));
    DG_CHECK(dense.next_n == 1, DG_ERR_SHAPE, "argument 'q' must be [S, 1, H, D]: next_n must be 1, got %lld",
             (long long)dense.next_n);
    DG_TRY(check_block_args(num_max_sparse_blocks, sparse_block_kv));
    DG_CHECK(dense.block_kv % sparse_block_kv == 0, DG_ERR_SHAPE,
             "argument 'kv_cache': its page of %lld tokens is not a multiple of sparse_block_kv %d",
             (long long)dense.block_kv, sparse_block_kv);
    dg_sparse_mqa_problem p = {.s = dense.batch, .h = dense.h, .d = dense.d, .nmsb = num_max_sparse_blocks,
                               .sbkv = sparse_block_kv, .fp4 = dense.fp4, .mx = dense.mx, .paged = 1, .q = q, .q_sf = q_sf,
                               .cache = dense.cache, .page_kv = dense.block_kv, .page_stride = dense.block_stride,
                               .num_pages = dense.num_blocks};
    DG_TRY(check_weights(&p, weights));
    DG_TRY(check_metadata(&p, metadata, 0, 0, dense.num_blocks));
    const dg_tensor *ins[] = {q, q_sf, kv_cache, weights, metadata};
    const char *names[] = {"q", "q_sf", "kv_cache", "weights", "metadata"};
    int is_query = 0;
    DG_TRY(check_sparse_logits(&p, logits, &is_query, ins, names, 5));
    return is_query ? DG_OK : run_sparse(&p);
}
