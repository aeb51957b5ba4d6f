/*
 * cublaslt.c - DeepGEMM 2.8's new dense names: the cuBLASLt GEMMs and the FP4 aliases.
 *
 * cublaslt_gemm_{nt,nn,tn,tt} (DeepGEMM csrc/apis/gemm.hpp): plain GEMMs D = C + A @ B^T with
 * no block scales. `_nt` is the core; the other layouts pass transposed views of A and/or B,
 * as DeepGEMM does. Every argument is checked, in the dense GEMMs' order and with their
 * messages, before anything is written; BF16 and unscaled E4M3 operands then run on the dense
 * engine (src/engine/) exactly as dg_bf16_gemm_nt / the FP8 GEMMs do, FLOAT32 operands (which
 * the engine, built on BF16 panels, does not take) on the reference kernel.
 *
 * batched_syrk / batched_symm: one `_nt` GEMM per batch on 2-D views, after checks of the whole
 * batched tensors (so no batch is written when any is wrong).
 *
 * The FP4 names are DeepGEMM's aliases of the fp8_fp4 functions: the very same calls, with the
 * alias's name in the error message.
 */
#include "../core/operand.h"
#include "../engine/engine.h"
#include "../reference/ref_gemm.h"

#include <stdio.h>
#include <string.h>

/* ---- cuBLASLt GEMMs --------------------------------------------------------------------- */

static const dg_dtype kInputs[3] = {DG_BFLOAT16, DG_FLOAT8_E4M3, DG_FLOAT32};

/* D [m, n]: BF16 or FP32 (FP32 only for FP32 inputs), unit stride along N, each element once. */
static dg_status check_d(const dg_tensor *d, dg_dtype in, int64_t m, int64_t n) {
    static const dg_dtype kOut[2] = {DG_BFLOAT16, DG_FLOAT32};
    DG_TRY(dg_check_tensor(d, "d", 2));
    DG_TRY(dg_check_dtype_in(d, "d", kOut, 2));
    DG_CHECK(in != DG_FLOAT32 || d->dtype == DG_FLOAT32, DG_ERR_DTYPE,
             "argument 'd' must be FLOAT32 for FLOAT32 operands (cuBLASLt's FP32 GEMM), got %s",
             dg_dtype_name(d->dtype));
    DG_TRY(dg_check_dim(d, "d", 0, m));
    DG_TRY(dg_check_dim(d, "d", 1, n));
    DG_TRY(dg_check_last_dim_contiguous(d, "d"));
    return dg_check_output(d, "d");
}

static dg_status cublaslt_nt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_operand oa, ob; /* no scales attached: every element counts with scale 1 */
    DG_TRY(dg_operand_init(&oa, "a", a, 0, kInputs, 3));
    DG_TRY(dg_operand_init(&ob, "b", b, 0, kInputs, 3));
    DG_CHECK(a->dtype == b->dtype, DG_ERR_DTYPE, "arguments 'a' (%s) and 'b' (%s) must have the same dtype",
             dg_dtype_name(a->dtype), dg_dtype_name(b->dtype));
    DG_CHECK(oa.k == ob.k, DG_ERR_SHAPE, "arguments 'a' and 'b' disagree on K (%lld vs %lld)", (long long)oa.k,
             (long long)ob.k);
    DG_TRY(check_d(d, a->dtype, oa.mn, ob.mn));
    DG_TRY(dg_check_c_like_d(c, d));
    DG_TRY(dg_check_no_overlap(d, "d", a, "a", false));
    DG_TRY(dg_check_no_overlap(d, "d", b, "b", false));
    if (oa.mn == 0 || ob.mn == 0)
        return DG_OK;
    if (a->dtype != DG_FLOAT32 && !dg_use_reference()) {
        const dg_status st = dg_engine_gemm(&oa, &ob, d, c);
        if (st != DG_ERR_UNSUPPORTED)
            return st;
    }
    DG_PATH_REFERENCE(a->dtype == DG_FLOAT32 ? "FLOAT32 inputs (the engine takes BF16, FP8, FP4)"
                                              : "these operands' scale blocks");
    dg_ref_gemm(&oa, 0, 0, oa.mn, &ob, 0, 0, ob.mn, d, c);
    return DG_OK;
}

dg_status dg_cublaslt_gemm_nt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_cublaslt_gemm_nt");
    return cublaslt_nt(a, b, d, c);
}

dg_status dg_cublaslt_gemm_nn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_cublaslt_gemm_nn");
    dg_tensor bt;
    return cublaslt_nt(a, dg_transposed_2d(b, &bt), d, c);
}

dg_status dg_cublaslt_gemm_tn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_cublaslt_gemm_tn");
    dg_tensor at, bt;
    return cublaslt_nt(dg_transposed_2d(a, &at), dg_transposed_2d(b, &bt), d, c);
}

dg_status dg_cublaslt_gemm_tt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_cublaslt_gemm_tt");
    dg_tensor at;
    return cublaslt_nt(dg_transposed_2d(a, &at), b, d, c);
}

/* ---- batched cuBLASLt calls ------------------------------------------------------------- */

/* t (2-D or 3-D) as 3-D: a 2-D tensor is one batch. */
static dg_status batched_view(const dg_tensor *t, const char *name, dg_tensor *out) {
    DG_CHECK(t != NULL, DG_ERR_NULL_POINTER, "argument '%s' is NULL", name);
    DG_CHECK(t->ndim == 2 || t->ndim == 3, DG_ERR_SHAPE, "argument '%s' must be 2-D or 3-D, got %d dimensions", name,
             t->ndim);
    DG_TRY(dg_check_tensor(t, name, t->ndim));
    *out = *t;
    if (t->ndim == 2) {
        out->ndim = 3;
        out->shape[0] = 1, out->shape[1] = t->shape[0], out->shape[2] = t->shape[1];
        out->strides[0] = 0, out->strides[1] = t->strides[0], out->strides[2] = t->strides[1];
    }
    return DG_OK;
}

/* Batch g of a 3-D view, as 2-D. */
static dg_tensor batch_of(const dg_tensor *t, int64_t g) {
    dg_tensor v = dg_tensor_2d((char *)t->data + g * t->strides[0] * (int64_t)dg_dtype_size(t->dtype), t->dtype,
                               t->shape[1], t->shape[2]);
    v.strides[0] = t->strides[1], v.strides[1] = t->strides[2];
    return v;
}

/* The checks every batch shares: dtypes, batch counts, D's layout and its distance from the
 * inputs; then one GEMM per batch, D[g] = X[g] @ Y[g]^T (Y given as the `_nt` view). */
static dg_status batched_run(const dg_tensor *x, const dg_tensor *y, const dg_tensor *d, const dg_tensor *a_in,
                             const dg_tensor *b_in, const dg_tensor *d_in) {
    static const dg_dtype kTypes[2] = {DG_BFLOAT16, DG_FLOAT32};
    DG_TRY(dg_check_dtype_in(a_in, "a", kTypes, 2));
    if (b_in)
        DG_CHECK(b_in->dtype == a_in->dtype, DG_ERR_DTYPE, "arguments 'a' (%s) and 'b' (%s) must have the same dtype",
                 dg_dtype_name(a_in->dtype), dg_dtype_name(b_in->dtype));
    DG_CHECK(d_in->dtype == a_in->dtype, DG_ERR_DTYPE, "argument 'd' must have the dtype of 'a' (%s), got %s",
             dg_dtype_name(a_in->dtype), dg_dtype_name(d_in->dtype));
    DG_CHECK(x->shape[0] == d->shape[0] && y->shape[0] == d->shape[0], DG_ERR_SHAPE,
             "arguments %s and 'd' disagree on the number of batches (%lld, %lld vs %lld)",
             b_in ? "'a', 'b'" : "'a'", (long long)x->shape[0], (long long)y->shape[0], (long long)d->shape[0]);
    DG_CHECK(x->shape[2] == y->shape[2], DG_ERR_SHAPE, "arguments 'a'%s disagree on the contracted extent (%lld vs %lld)",
             b_in ? " and 'b'" : "", (long long)x->shape[2], (long long)y->shape[2]);
    DG_CHECK(d->shape[1] == x->shape[1] && d->shape[2] == y->shape[1], DG_ERR_SHAPE,
             "argument 'd' must be [%lld, %lld] per batch, got [%lld, %lld]", (long long)x->shape[1],
             (long long)y->shape[1], (long long)d->shape[1], (long long)d->shape[2]);
    DG_TRY(dg_check_last_dim_contiguous(d_in, "d"));
    DG_TRY(dg_check_output(d_in, "d"));
    DG_TRY(dg_check_no_overlap(d_in, "d", a_in, "a", false));
    if (b_in)
        DG_TRY(dg_check_no_overlap(d_in, "d", b_in, "b", false));
    for (int64_t g = 0; g < d->shape[0]; ++g) {
        const dg_tensor xg = batch_of(x, g), yg = batch_of(y, g), dg = batch_of(d, g);
        DG_TRY(cublaslt_nt(&xg, &yg, &dg, NULL));
    }
    return DG_OK;
}

dg_status dg_batched_syrk(const dg_tensor *a, const dg_tensor *d) {
    dg_api_begin("dg_batched_syrk");
    dg_tensor a3, d3;
    DG_TRY(batched_view(a, "a", &a3));
    DG_TRY(batched_view(d, "d", &d3));
    return batched_run(&a3, &a3, &d3, a, NULL, d);
}

dg_status dg_batched_symm(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d) {
    dg_api_begin("dg_batched_symm");
    dg_tensor a3, b3, d3;
    DG_TRY(batched_view(a, "a", &a3));
    DG_TRY(batched_view(b, "b", &b3));
    DG_TRY(batched_view(d, "d", &d3));
    DG_CHECK(a3.shape[1] == a3.shape[2], DG_ERR_SHAPE, "argument 'a' must be square per batch, got [%lld, %lld]",
             (long long)a3.shape[1], (long long)a3.shape[2]);
    /* D = A @ B: B [M, K] is the `_nt` operand B^T, i.e. B's transposed view [K, M] */
    dg_tensor bt = b3;
    bt.shape[1] = b3.shape[2], bt.shape[2] = b3.shape[1];
    bt.strides[1] = b3.strides[2], bt.strides[2] = b3.strides[1];
    return batched_run(&a3, &bt, &d3, a, b, d);
}

/* ---- NVFP4 ------------------------------------------------------------------------------ */

/* Byte offset of the VEC16 scale of row r, 16-block c (deepgemm.h), kt = ceil(K / 64). */
static int64_t vec16_offset(int64_t r, int64_t c, int64_t kt) {
    return ((r / 128) * kt + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

/* One NVFP4 operand: the codes [mn, K / 2] and the VEC16 scales. */
static dg_status check_nvfp4(const dg_tensor *x, const char *name, const dg_tensor *sf, const char *sf_name,
                             int64_t *mn, int64_t *k) {
    static const dg_dtype kCodes[2] = {DG_FP4_E2M1X2, DG_INT8};
    /* bytes: UINT8 as DeepGEMM's tests pass them, or INT8 (which Python hands over as the FP4 dtype) */
    static const dg_dtype kSf[3] = {DG_UINT8, DG_INT8, DG_FP4_E2M1X2};
    DG_TRY(dg_check_tensor(x, name, 2));
    DG_TRY(dg_check_dtype_in(x, name, kCodes, 2));
    DG_TRY(dg_check_contiguous(x, name));
    *mn = x->shape[0];
    *k = 2 * x->shape[1]; /* shape entries are below 2^62 (dg_check_tensor) */
    DG_CHECK(*k % 32 == 0, DG_ERR_SHAPE, "argument '%s': K (%lld) must be a multiple of 32 for NVFP4", name,
             (long long)*k);
    DG_CHECK(sf != NULL, DG_ERR_NULL_POINTER, "argument '%s' is NULL", sf_name);
    DG_TRY(dg_check_tensor(sf, sf_name, sf->ndim));
    DG_TRY(dg_check_dtype_in(sf, sf_name, kSf, 3));
    DG_TRY(dg_check_contiguous(sf, sf_name));
    const int64_t want = dg_ceil_div(*mn, 128) * dg_ceil_div(*k, 64) * 512;
    DG_CHECK(dg_tensor_numel(sf) == want, DG_ERR_SHAPE,
             "argument '%s' must hold ceil(%lld / 128) * ceil(%lld / 64) * 512 = %lld UE4M3 bytes (cuBLASLt's VEC16 "
             "layout), has %lld",
             sf_name, (long long)*mn, (long long)*k, (long long)want, (long long)dg_tensor_numel(sf));
    return DG_OK;
}

/* Rows of an NVFP4 operand as BF16 [mn, k] (exact: deepgemm.h). */
static void widen_nvfp4(const dg_tensor *x, const dg_tensor *sf, int64_t mn, int64_t k, uint16_t *out) {
    const uint8_t *codes = x->data, *scales = sf->data;
    const int64_t kt = dg_ceil_div(k, 64);
#pragma omp parallel for schedule(static) num_threads(dg_num_threads())
    for (int64_t r = 0; r < mn; ++r)
        for (int64_t c = 0; c < k / 16; ++c) {
            const float s = dg_e4m3_to_float((uint8_t)(scales[vec16_offset(r, c, kt)] & 0x7f)); /* unsigned */
            for (int64_t e = 0; e < 16; ++e) {
                const int64_t kk = c * 16 + e;
                const uint8_t byte = codes[r * (k / 2) + kk / 2];
                out[r * k + kk] = dg_float_to_bf16(dg_e2m1_to_float(kk & 1 ? byte >> 4 : byte & 15) * s);
            }
        }
}

dg_status dg_cublaslt_nvfp4_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                    const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_cublaslt_nvfp4_gemm_nt");
    int64_t m, n, k, k2;
    DG_TRY(check_nvfp4(a, "a", sfa, "sfa", &m, &k));
    DG_TRY(check_nvfp4(b, "b", sfb, "sfb", &n, &k2));
    DG_CHECK(k == k2, DG_ERR_SHAPE, "arguments 'a' and 'b' disagree on K (%lld vs %lld)", (long long)k, (long long)k2);
    DG_TRY(check_d(d, DG_BFLOAT16, m, n));
    DG_TRY(dg_check_c_like_d(c, d));
    const dg_tensor *in[4] = {a, sfa, b, sfb};
    const char *names[4] = {"a", "sfa", "b", "sfb"};
    for (int i = 0; i < 4; ++i)
        DG_TRY(dg_check_no_overlap(d, "d", in[i], names[i], false));
    if (m == 0 || n == 0)
        return DG_OK;
    int64_t elems;
    DG_CHECK(dg_mul_ok(m + n, k, &elems) && (uint64_t)elems <= SIZE_MAX / 2, DG_ERR_OVERFLOW,
             "arguments 'a' and 'b': widening [%lld + %lld, %lld] to BF16 overflows", (long long)m, (long long)n,
             (long long)k);
    uint16_t *wa = dg_malloc((size_t)elems * 2 + 2);
    DG_CHECK(wa != NULL, DG_ERR_ALLOC, "out of memory for the BF16 copies of 'a' and 'b' ([%lld + %lld, %lld])",
             (long long)m, (long long)n, (long long)k);
    uint16_t *wb = wa + m * k;
    widen_nvfp4(a, sfa, m, k, wa);
    widen_nvfp4(b, sfb, n, k, wb);
    const dg_tensor ta = dg_tensor_2d(wa, DG_BFLOAT16, m, k), tb = dg_tensor_2d(wb, DG_BFLOAT16, n, k);
    const dg_status st = cublaslt_nt(&ta, &tb, d, c);
    dg_free(wa);
    return st;
}

/* ---- FP4 aliases ------------------------------------------------------------------------ */

/* After a failed call of `from`, the same message under the alias's name `to`. */
static dg_status as_alias(dg_status st, const char *from, const char *to) {
    if (st == DG_OK)
        return st;
    char rest[512];
    const char *msg = dg_last_error();
    const size_t n = strlen(from);
    if (strncmp(msg, from, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ')
        msg += n + 2;
    snprintf(rest, sizeof rest, "%s", msg);
    dg_api_begin(to);
    return dg_fail(st, "%s", rest);
}

dg_status dg_fp4_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b, const dg_tensor *sfb,
                         const dg_tensor *d, const dg_tensor *c, const dg_gemm_options *opts) {
    return as_alias(dg_fp8_fp4_gemm_nt(a, sfa, b, sfb, d, c, opts), "dg_fp8_fp4_gemm_nt", "dg_fp4_gemm_nt");
}

dg_status dg_m_grouped_fp4_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                              const dg_tensor *sfb, const dg_tensor *d,
                                              const dg_tensor *grouped_layout, const dg_gemm_options *opts) {
    return as_alias(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, d, grouped_layout, opts),
                    "dg_m_grouped_fp8_fp4_gemm_nt_contiguous", "dg_m_grouped_fp4_gemm_nt_contiguous");
}

dg_status dg_m_grouped_fp4_gemm_nt_masked(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                          const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *masked_m,
                                          int expected_m, const dg_gemm_options *opts) {
    return as_alias(dg_m_grouped_fp8_fp4_gemm_nt_masked(a, sfa, b, sfb, d, masked_m, expected_m, opts),
                    "dg_m_grouped_fp8_fp4_gemm_nt_masked", "dg_m_grouped_fp4_gemm_nt_masked");
}
