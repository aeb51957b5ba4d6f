/*
 * bind_attn.c - MQA logits (DeepSeek V3.2's lightning indexer): fp8_fp4_mqa_logits,
 * fp8_mqa_logits, get_paged_mqa_logits_metadata, fp8_fp4_paged_mqa_logits, fp8_paged_mqa_logits, and
 * DeepGEMM 2.8's get_mqa_logits_metadata (schedule_meta=), get_(paged_)sparse_mqa_logits_metadata,
 * fp8_fp4_(paged_)sparse_mqa_logits.
 * As in DeepGEMM these return new tensors: the library's query form gives the shape and
 * DeepGEMM's padded strides, deep_gemm_cpu._alloc allocates (torch or NumPy, like q), and the
 * second call fills it.
 */
#include "dgpy.h"

/* logits_dtype (NULL: not given, float32 stays): float32 or bfloat16, checked here so that the
 * message names the Python argument rather than the library's output tensor. */
static int logits_dtype_from(PyObject *obj, const char *fn, dg_dtype *out) {
    dg_dtype d;
    if (!obj)
        return 0;
    if (dgp_dtype_from(obj, fn, "logits_dtype", &d))
        return -1;
    if (d != DG_FLOAT32 && d != DG_BFLOAT16) {
        PyErr_Format(PyExc_TypeError, "%s: argument 'logits_dtype' must be float32 or bfloat16, got %S", fn, obj);
        return -1;
    }
    *out = d;
    return 0;
}

/* max_seqlen_k is DeepGEMM's: 0 gives logits [S, SK]; > 0 gives "compressed" logits
 * [S, max_seqlen_k] whose column c is kv row cu_seq_len_k_start[i] + c. The legacy form has no
 * logits_dtype, so its keyword list must end one entry earlier to match its format. */
static PyObject *mqa_logits(PyObject *args, PyObject *kw, const char *fn, int legacy) {
    static char *kw_new[] = {"q", "kv", "weights", "cu_seq_len_k_start", "cu_seq_len_k_end", "clean_logits",
                             "max_seqlen_k", "logits_dtype", "schedule_meta", NULL};
    static char *kw_old[] = {"q", "kv", "weights", "cu_seq_len_k_start", "cu_seq_len_k_end", "clean_logits",
                             "max_seqlen_k", NULL};
    PyObject *q, *kv, *w, *ks, *ke, *max_obj = NULL, *dtype_obj = NULL, *sched = Py_None;
    int clean = 1, max_seqlen_k = 0;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "OOOOO|pO%s:%s", legacy ? "" : "OO", fn);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, legacy ? kw_old : kw_new, &q, &kv, &w, &ks, &ke, &clean,
                                     &max_obj, &dtype_obj, &sched) ||
        (max_obj && dgp_int(max_obj, fn, "max_seqlen_k", &max_seqlen_k)))
        return NULL;
    dgp_tensor tq, tqs = {0}, tkv, tkvs, tw, tks, tke, tsm = {0};
    dg_tensor logits = {0};
    logits.dtype = DG_FLOAT32;
    int rc = legacy ? dgp_tensor_from(q, fn, "q", 0, &tq) : dgp_pair_from(q, fn, "q", 1, &tq, &tqs);
    if (rc || dgp_pair_from(kv, fn, "kv", 0, &tkv, &tkvs) || dgp_tensor_from(w, fn, "weights", 0, &tw) ||
        dgp_tensor_from(ks, fn, "cu_seq_len_k_start", 0, &tks) ||
        dgp_tensor_from(ke, fn, "cu_seq_len_k_end", 0, &tke) ||
        logits_dtype_from(dtype_obj, fn, &logits.dtype) ||
        (!legacy && dgp_tensor_from(sched, fn, "schedule_meta", DGP_OPTIONAL, &tsm)))
        return NULL;
    dg_status st = legacy ? dg_fp8_mqa_logits(&tq.t, &tkv.t, &tkvs.t, &tw.t, &tks.t, &tke.t, clean, max_seqlen_k,
                                              &logits)
                          : dg_fp8_fp4_mqa_logits_scheduled(&tq.t, dgp_ptr(&tqs), &tkv.t, &tkvs.t, &tw.t, &tks.t,
                                                            &tke.t, clean, max_seqlen_k, dgp_ptr(&tsm), &logits);
    if (st != DG_OK)
        return dgp_raise(st);
    /* Allocate like q's data tensor (torch or NumPy). */
    PyObject *like = legacy ? (Py_INCREF(q), q) : PySequence_GetItem(q, 0);
    PyObject *out = like ? dgp_alloc(like, &logits) : NULL;
    Py_XDECREF(like);
    if (!out)
        return NULL;
    if (legacy)
        DGP_NOGIL(st, dg_fp8_mqa_logits(&tq.t, &tkv.t, &tkvs.t, &tw.t, &tks.t, &tke.t, clean, max_seqlen_k, &logits));
    else
        DGP_NOGIL(st, dg_fp8_fp4_mqa_logits_scheduled(&tq.t, dgp_ptr(&tqs), &tkv.t, &tkvs.t, &tw.t, &tks.t, &tke.t,
                                                      clean, max_seqlen_k, dgp_ptr(&tsm), &logits));
    if (st != DG_OK) {
        Py_DECREF(out);
        return dgp_raise(st);
    }
    return out;
}

static PyObject *py_fp8_fp4_mqa_logits(PyObject *s, PyObject *args, PyObject *kw) {
    return mqa_logits(args, kw, "fp8_fp4_mqa_logits", 0);
}
static PyObject *py_fp8_mqa_logits(PyObject *s, PyObject *args, PyObject *kw) {
    return mqa_logits(args, kw, "fp8_mqa_logits", 1);
}

static PyObject *py_get_paged_mqa_logits_metadata(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "get_paged_mqa_logits_metadata";
    static char *kwl[] = {"context_lens", "block_kv", "num_sms", "indices", NULL};
    PyObject *lens, *block_obj, *sms_obj, *indices = Py_None;
    int block_kv, num_sms;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O:get_paged_mqa_logits_metadata", kwl, &lens, &block_obj,
                                     &sms_obj, &indices) ||
        dgp_int(block_obj, fn, "block_kv", &block_kv) || dgp_int(sms_obj, fn, "num_sms", &num_sms))
        return NULL;
    dgp_tensor tl, ti;
    if (dgp_tensor_from(lens, fn, "context_lens", 0, &tl) ||
        dgp_tensor_from(indices, fn, "indices", DGP_OPTIONAL, &ti))
        return NULL;
    dg_tensor meta = {0};
    dg_status st = dg_get_paged_mqa_logits_metadata(&tl.t, block_kv, num_sms, dgp_ptr(&ti), &meta);
    if (st != DG_OK)
        return dgp_raise(st);
    PyObject *out = dgp_alloc(lens, &meta);
    if (!out)
        return NULL;
    DGP_NOGIL(st, dg_get_paged_mqa_logits_metadata(&tl.t, block_kv, num_sms, dgp_ptr(&ti), &meta));
    if (st != DG_OK) {
        Py_DECREF(out);
        return dgp_raise(st);
    }
    return out;
}

static PyObject *paged_logits(PyObject *args, PyObject *kw, const char *fn, int legacy) {
    static char *kw_new[] = {"q", "kv_cache", "weights", "context_lens", "block_table", "schedule_meta",
                             "max_context_len", "clean_logits", "logits_dtype", "indices", NULL};
    static char *kw_old[] = {"q", "kv_cache", "weights", "context_lens", "block_table", "schedule_meta",
                             "max_context_len", "clean_logits", "indices", NULL};
    PyObject *q, *kv, *w, *lens, *table, *meta, *max_obj, *dtype_obj = NULL, *indices = Py_None;
    int max_len, clean = 0, ok;
    char fmt[64];
    if (legacy) {
        snprintf(fmt, sizeof fmt, "OOOOOOO|pO:%s", fn);
        ok = PyArg_ParseTupleAndKeywords(args, kw, fmt, kw_old, &q, &kv, &w, &lens, &table, &meta, &max_obj, &clean,
                                         &indices);
    } else {
        snprintf(fmt, sizeof fmt, "OOOOOOO|pOO:%s", fn);
        ok = PyArg_ParseTupleAndKeywords(args, kw, fmt, kw_new, &q, &kv, &w, &lens, &table, &meta, &max_obj, &clean,
                                         &dtype_obj, &indices);
    }
    if (!ok || dgp_int(max_obj, fn, "max_context_len", &max_len))
        return NULL;
    dgp_tensor tq, tqs = {0}, tkv, tw, tl, tt, tm, ti;
    dg_tensor logits = {0};
    logits.dtype = DG_FLOAT32;
    int rc = legacy ? dgp_tensor_from(q, fn, "q", 0, &tq) : dgp_pair_from(q, fn, "q", 1, &tq, &tqs);
    if (rc || dgp_tensor_from(kv, fn, "kv_cache", 0, &tkv) || dgp_tensor_from(w, fn, "weights", 0, &tw) ||
        dgp_tensor_from(lens, fn, "context_lens", 0, &tl) || dgp_tensor_from(table, fn, "block_table", 0, &tt) ||
        dgp_tensor_from(meta, fn, "schedule_meta", 0, &tm) ||
        dgp_tensor_from(indices, fn, "indices", DGP_OPTIONAL, &ti) ||
        logits_dtype_from(dtype_obj, fn, &logits.dtype))
        return NULL;
#define PAGED_CALL                                                                                          \
    (legacy ? dg_fp8_paged_mqa_logits(&tq.t, &tkv.t, &tw.t, &tl.t, &tt.t, &tm.t, max_len, clean, dgp_ptr(&ti), \
                                      &logits)                                                              \
            : dg_fp8_fp4_paged_mqa_logits(&tq.t, dgp_ptr(&tqs), &tkv.t, &tw.t, &tl.t, &tt.t, &tm.t, max_len,  \
                                          clean, dgp_ptr(&ti), &logits))
    dg_status st = PAGED_CALL;
    if (st != DG_OK)
        return dgp_raise(st);
    PyObject *out = dgp_alloc(kv, &logits);
    if (!out)
        return NULL;
    DGP_NOGIL(st, PAGED_CALL);
#undef PAGED_CALL
    if (st != DG_OK) {
        Py_DECREF(out);
        return dgp_raise(st);
    }
    return out;
}

static PyObject *py_fp8_fp4_paged_mqa_logits(PyObject *s, PyObject *args, PyObject *kw) {
    return paged_logits(args, kw, "fp8_fp4_paged_mqa_logits", 0);
}
static PyObject *py_fp8_paged_mqa_logits(PyObject *s, PyObject *args, PyObject *kw) {
    return paged_logits(args, kw, "fp8_paged_mqa_logits", 1);
}

/* ---- DeepGEMM 2.8: scheduled prefill and the sparse indexer ------------------------------- */

/* Calls `call` twice: the query form gives the result's shape, dgp_alloc allocates it like
 * `like`, the second call fills it. */
#define QUERY_ALLOC_FILL(like, result, call)   \
    do {                                       \
        dg_status st_ = (call);                \
        if (st_ != DG_OK)                      \
            return dgp_raise(st_);             \
        out = dgp_alloc((like), &(result));    \
        if (!out)                              \
            return NULL;                       \
        DGP_NOGIL(st_, (call));                \
        if (st_ != DG_OK) {                    \
            Py_DECREF(out);                    \
            return dgp_raise(st_);             \
        }                                      \
    } while (0)

static PyObject *py_get_mqa_logits_metadata(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "get_mqa_logits_metadata";
    static char *kwl[] = {"cu_seq_len_k_start", "cu_seq_len_k_end", "num_kv_tokens", "num_heads", NULL};
    PyObject *ks, *ke, *nkv_obj, *nh_obj, *out = NULL;
    int nkv, nh;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO:get_mqa_logits_metadata", kwl, &ks, &ke, &nkv_obj, &nh_obj) ||
        dgp_int(nkv_obj, fn, "num_kv_tokens", &nkv) || dgp_int(nh_obj, fn, "num_heads", &nh))
        return NULL;
    dgp_tensor tks, tke;
    if (dgp_tensor_from(ks, fn, "cu_seq_len_k_start", 0, &tks) || dgp_tensor_from(ke, fn, "cu_seq_len_k_end", 0, &tke))
        return NULL;
    dg_tensor meta = {0};
    QUERY_ALLOC_FILL(ks, meta, dg_get_mqa_logits_metadata(&tks.t, &tke.t, nkv, nh, &meta));
    return out;
}

static PyObject *py_get_sparse_mqa_logits_metadata(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "get_sparse_mqa_logits_metadata";
    static char *kwl[] = {"cu_seq_len_k_start", "cu_seq_len_k_end", "num_kv_tokens", "sparse_kv_block_indices",
                          "qk_dtype", "sparse_block_kv", "use_unaligned_ks", NULL};
    PyObject *ks, *ke, *nkv_obj, *idx, *qk_obj, *blk_obj, *out = NULL;
    int nkv, blk, unaligned = 0;
    dg_dtype qk;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|p:get_sparse_mqa_logits_metadata", kwl, &ks, &ke, &nkv_obj,
                                     &idx, &qk_obj, &blk_obj, &unaligned) ||
        dgp_int(nkv_obj, fn, "num_kv_tokens", &nkv) || dgp_int(blk_obj, fn, "sparse_block_kv", &blk) ||
        dgp_dtype_from(qk_obj, fn, "qk_dtype", &qk))
        return NULL;
    dgp_tensor tks, tke, tidx;
    if (dgp_tensor_from(ks, fn, "cu_seq_len_k_start", 0, &tks) ||
        dgp_tensor_from(ke, fn, "cu_seq_len_k_end", 0, &tke) ||
        dgp_tensor_from(idx, fn, "sparse_kv_block_indices", 0, &tidx))
        return NULL;
    dg_tensor meta = {0};
    QUERY_ALLOC_FILL(idx, meta,
                     dg_get_sparse_mqa_logits_metadata(&tks.t, &tke.t, nkv, &tidx.t, qk, blk, unaligned, &meta));
    return out;
}

static PyObject *py_get_paged_sparse_mqa_logits_metadata(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "get_paged_sparse_mqa_logits_metadata";
    static char *kwl[] = {"context_lens", "block_table", "indices", "page_kv", "sparse_kv_block_indices",
                          "qk_dtype", "sparse_block_kv", NULL};
    PyObject *lens, *table, *ids, *page_obj, *idx, *qk_obj, *blk_obj, *out = NULL;
    int page, blk;
    dg_dtype qk;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOO:get_paged_sparse_mqa_logits_metadata", kwl, &lens, &table,
                                     &ids, &page_obj, &idx, &qk_obj, &blk_obj) ||
        dgp_int(page_obj, fn, "page_kv", &page) || dgp_int(blk_obj, fn, "sparse_block_kv", &blk) ||
        dgp_dtype_from(qk_obj, fn, "qk_dtype", &qk))
        return NULL;
    dgp_tensor tl, tt, ti, tidx;
    if (dgp_tensor_from(lens, fn, "context_lens", 0, &tl) || dgp_tensor_from(table, fn, "block_table", 0, &tt) ||
        dgp_tensor_from(ids, fn, "indices", 0, &ti) || dgp_tensor_from(idx, fn, "sparse_kv_block_indices", 0, &tidx))
        return NULL;
    dg_tensor meta = {0};
    QUERY_ALLOC_FILL(idx, meta,
                     dg_get_paged_sparse_mqa_logits_metadata(&tl.t, &tt.t, &ti.t, page, &tidx.t, qk, blk, &meta));
    return out;
}

/* DeepGEMM returns BF16 logits [S, N * sparse_block_kv]. */
static PyObject *py_fp8_fp4_sparse_mqa_logits(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "fp8_fp4_sparse_mqa_logits";
    static char *kwl[] = {"q", "kv", "weights", "metadata", "num_max_sparse_blocks", "sparse_block_kv",
                          "use_unaligned_ks", NULL};
    PyObject *q, *kv, *w, *meta, *n_obj, *blk_obj, *out = NULL;
    int n, blk, unaligned = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|p:fp8_fp4_sparse_mqa_logits", kwl, &q, &kv, &w, &meta, &n_obj,
                                     &blk_obj, &unaligned) ||
        dgp_int(n_obj, fn, "num_max_sparse_blocks", &n) || dgp_int(blk_obj, fn, "sparse_block_kv", &blk))
        return NULL;
    dgp_tensor tq, tqs = {0}, tkv, tkvs, tw, tm;
    if (dgp_pair_from(q, fn, "q", 1, &tq, &tqs) || dgp_pair_from(kv, fn, "kv", 0, &tkv, &tkvs) ||
        dgp_tensor_from(w, fn, "weights", 0, &tw) || dgp_tensor_from(meta, fn, "metadata", 0, &tm))
        return NULL;
    dg_tensor logits = {0};
    logits.dtype = DG_BFLOAT16;
    PyObject *like = PySequence_GetItem(q, 0);
    if (!like)
        return NULL;
    Py_DECREF(like); /* q holds it */
    QUERY_ALLOC_FILL(like, logits,
                     dg_fp8_fp4_sparse_mqa_logits(&tq.t, dgp_ptr(&tqs), &tkv.t, &tkvs.t, &tw.t, &tm.t, n, blk,
                                                  unaligned, &logits));
    return out;
}

static PyObject *py_fp8_fp4_paged_sparse_mqa_logits(PyObject *s, PyObject *args, PyObject *kw) {
    static const char *fn = "fp8_fp4_paged_sparse_mqa_logits";
    static char *kwl[] = {"q", "kv_cache", "weights", "metadata", "num_max_sparse_blocks", "sparse_block_kv", NULL};
    PyObject *q, *kv, *w, *meta, *n_obj, *blk_obj, *out = NULL;
    int n, blk;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO:fp8_fp4_paged_sparse_mqa_logits", kwl, &q, &kv, &w, &meta,
                                     &n_obj, &blk_obj) ||
        dgp_int(n_obj, fn, "num_max_sparse_blocks", &n) || dgp_int(blk_obj, fn, "sparse_block_kv", &blk))
        return NULL;
    dgp_tensor tq, tqs = {0}, tkv, tw, tm;
    if (dgp_pair_from(q, fn, "q", 1, &tq, &tqs) || dgp_tensor_from(kv, fn, "kv_cache", 0, &tkv) ||
        dgp_tensor_from(w, fn, "weights", 0, &tw) || dgp_tensor_from(meta, fn, "metadata", 0, &tm))
        return NULL;
    dg_tensor logits = {0};
    logits.dtype = DG_BFLOAT16;
    QUERY_ALLOC_FILL(kv, logits,
                     dg_fp8_fp4_paged_sparse_mqa_logits(&tq.t, dgp_ptr(&tqs), &tkv.t, &tw.t, &tm.t, n, blk, &logits));
    return out;
}
#undef QUERY_ALLOC_FILL

#define KW (PyCFunction)(void (*)(void))
#define M(name, doc) {#name, KW py_##name, METH_VARARGS | METH_KEYWORDS, doc}
PyMethodDef dgp_attn_methods[] = {
    M(fp8_fp4_mqa_logits, "fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, "
                          "clean_logits=True, max_seqlen_k=0, logits_dtype=torch.float32, schedule_meta=None) -> "
                          "logits; q = (q, q_sf or None), kv = (kv, kv_sf)"),
    M(get_mqa_logits_metadata,
      "get_mqa_logits_metadata(cu_seq_len_k_start, cu_seq_len_k_end, num_kv_tokens, num_heads) -> schedule_meta"),
    M(get_sparse_mqa_logits_metadata,
      "get_sparse_mqa_logits_metadata(cu_seq_len_k_start, cu_seq_len_k_end, num_kv_tokens, "
      "sparse_kv_block_indices, qk_dtype, sparse_block_kv, use_unaligned_ks=False) -> uint8 metadata"),
    M(get_paged_sparse_mqa_logits_metadata,
      "get_paged_sparse_mqa_logits_metadata(context_lens, block_table, indices, page_kv, sparse_kv_block_indices, "
      "qk_dtype, sparse_block_kv) -> uint8 metadata"),
    M(fp8_fp4_sparse_mqa_logits, "fp8_fp4_sparse_mqa_logits(q, kv, weights, metadata, num_max_sparse_blocks, "
                                 "sparse_block_kv, use_unaligned_ks=False) -> bfloat16 logits"),
    M(fp8_fp4_paged_sparse_mqa_logits, "fp8_fp4_paged_sparse_mqa_logits(q, kv_cache, weights, metadata, "
                                       "num_max_sparse_blocks, sparse_block_kv) -> bfloat16 logits"),
    M(fp8_mqa_logits, "fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, "
                      "max_seqlen_k=0) -> float32 logits"),
    M(get_paged_mqa_logits_metadata,
      "get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None) -> schedule_meta"),
    M(fp8_fp4_paged_mqa_logits, "fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, "
                                "schedule_meta, max_context_len, clean_logits=False, logits_dtype=torch.float32, "
                                "indices=None) -> logits"),
    M(fp8_paged_mqa_logits, "fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, "
                            "max_context_len, clean_logits=False, indices=None) -> float32 logits"),
    {NULL, NULL, 0, NULL},
};
