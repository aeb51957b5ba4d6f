/*
 * quant.c - entry points of the quantization helpers (deep_gemm.utils, SPEC 2): argument
 * checks, the query form, then the reference in src/reference/ref_quant.c or, for the FP8
 * block casts and the FP4 per-token cast of row-contiguous tensors, the fast path below,
 * which gives the same bits.
 */
#include "../kernels/quant_kernels.h"
#include "../reference/ref_quant.h"
#include "quant_args.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- fast path: per row group, vector block amax, the reference's scalar scale, vector
 * products, then the dg_cast E4M3 run kernel. Row groups are independent, so the result does
 * not depend on the thread count. */

static bool row_block_amax_generic(const void *row, bool bf16, int64_t k, int64_t bk, float *acc) {
    bool nan = false;
    for (int64_t j = 0; j < k; ++j) {
        float v;
        if (bf16) {
            const uint32_t u = (uint32_t)((const uint16_t *)row)[j] << 16;
            memcpy(&v, &u, 4);
        } else {
            v = ((const float *)row)[j];
        }
        const float a = fabsf(v);
        nan |= isnan(a);
        if (a > acc[j / bk])
            acc[j / bk] = a;
    }
    return nan;
}

static void row_scale_generic(const void *row, bool bf16, int64_t k, int64_t bk, const float *r, float *y) {
    for (int64_t j = 0; j < k; ++j) {
        float v;
        if (bf16) {
            const uint32_t u = (uint32_t)((const uint16_t *)row)[j] << 16;
            memcpy(&v, &u, 4);
        } else {
            v = ((const float *)row)[j];
        }
        y[j] = isnan(v) ? v : v * r[j / bk]; /* x's NaN, as the reference (quant_kernels.h) */
    }
}

static void f32_to_e2m1x2_generic(const float *y, uint8_t *dst, int64_t k) {
    for (int64_t j = 0; j < k; j += 2)
        dst[j / 2] = (uint8_t)(dg_float_to_e2m1(y[j]) | (dg_float_to_e2m1(y[j + 1]) << 4));
}

static const dg_quant_kernels *quant_kernels(dg_isa isa) {
    static const dg_quant_kernels generic = {row_block_amax_generic, row_scale_generic, f32_to_e2m1x2_generic};
#if DG_HAVE_AVX512_KERNELS
    static const dg_quant_kernels avx512 = {dg_quant_row_block_amax_avx512, dg_quant_row_scale_avx512,
                                            dg_quant_f32_to_e2m1x2_avx512};
    if (isa >= DG_ISA_AVX512)
        return &avx512;
#endif
    return &generic;
}

/* The reference's amax over rows [i0, i1) in its order: NaN sticks, and a later NaN replaces an
 * earlier one (only NaN rows come here). */
static void group_amax_scalar(const dg_tensor *x, int64_t i0, int64_t i1, int64_t bk, float *acc, int64_t sk) {
    for (int64_t c = 0; c < sk; ++c)
        acc[c] = 0.0f;
    for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = 0; j < x->shape[1]; ++j) {
            const float a = fabsf(dg_load_float(x, dg_ptr2(x, i, j)));
            if (isnan(a) || a > acc[j / bk])
                acc[j / bk] = a;
        }
}

/* Row g of the scales: FLOAT32, or INT32 packed UE8M0 (byte j of word q is scale 4q + j, 1.0
 * past the last one), as the reference's store_scales. */
static void store_scale_row(const float *sf, int64_t cols, bool packed, const dg_tensor *out_sf, int64_t g) {
    if (!packed) {
        for (int64_t c = 0; c < cols; ++c)
            *(float *)dg_ptr2(out_sf, g, c) = sf[c];
        return;
    }
    for (int64_t q = 0; q < qa_ceil_div(cols, 4); ++q) {
        uint32_t word = 0;
        for (int j = 0; j < 4; ++j) {
            uint32_t bits = 127u << 23;
            if (4 * q + j < cols)
                memcpy(&bits, &sf[4 * q + j], 4);
            word |= ((bits >> 23) & 0xffu) << (8 * j);
        }
        memcpy(dg_ptr2(out_sf, g, q), &word, 4);
    }
}

/* ref_quant_fp8_blocks' contract and bits (fp4: ref_quant_fp4_token's, bm = 1), for x and out
 * with unit stride along K. */
static dg_status fast_quant_blocks(const dg_tensor *x, int64_t bm, int64_t bk, bool use_ue8m0, bool packed, bool fp4,
                                   const dg_tensor *out, const dg_tensor *out_sf) {
    const int64_t m = x->shape[0], k = x->shape[1], sm = qa_ceil_div(m, bm), sk = qa_ceil_div(k, bk);
    if (m == 0 || k == 0) /* no element and no scale (sk = 0); x may have NULL data */
        return DG_OK;
    /* Threads only for work worth waking them (~64K elements each); rows are independent, so
     * the count does not change the result. */
    int64_t nt = dg_num_threads(), work = m * k / 65536 + 1;
    nt = nt < sm ? nt : sm;
    nt = nt < work ? nt : work;
    if (nt < 1)
        nt = 1;
    const int64_t skp = dg_align(sk, 16), per = 2 * skp + dg_align(k, 16); /* acc, r, products */
    float *ws = dg_malloc((size_t)(nt * per) * sizeof(float));
    DG_CHECK(ws != NULL, DG_ERR_ALLOC, "cannot allocate %lld floats of workspace", (long long)(nt * per));
    const dg_isa isa = dg_get_isa();
    const dg_quant_kernels *qk = quant_kernels(isa);
    const dg_convert_kernels *ck = dg_convert_kernels_for(isa);
    DG_PATH("%s amax and scale kernels, %s blocks of %lldx%lld%s | first: m=%lld k=%lld",
            qk == quant_kernels(DG_ISA_GENERIC) ? "generic" : "avx512", fp4 ? "FP4" : "FP8", (long long)bm,
            (long long)bk, qk == quant_kernels(DG_ISA_GENERIC) && isa >= DG_ISA_AVX2 ? " [no avx2 kernels]" : "",
            (long long)m, (long long)k);
    const bool bf16 = x->dtype == DG_BFLOAT16;
#pragma omp parallel for schedule(static) num_threads((int)nt)
    for (int64_t g = 0; g < sm; ++g) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *acc = ws + tid * per, *r = acc + skp, *y = r + skp;
        const int64_t i0 = g * bm, i1 = i0 + bm < m ? i0 + bm : m;
        for (int64_t c = 0; c < sk; ++c)
            acc[c] = 0.0f;
        bool nan = false;
        for (int64_t i = i0; i < i1; ++i)
            nan |= qk->row_block_amax(dg_ptr2(x, i, 0), bf16, k, bk, acc);
        if (nan)
            group_amax_scalar(x, i0, i1, bk, acc, sk);
        for (int64_t c = 0; c < sk; ++c) {
            acc[c] = ref_group_scale(acc[c], fp4 ? DG_E2M1_MAX : DG_E4M3_MAX, use_ue8m0);
            r[c] = 1.0f / acc[c];
        }
        for (int64_t i = i0; i < i1; ++i) {
            qk->row_scale(dg_ptr2(x, i, 0), bf16, k, bk, r, y);
            if (fp4)
                qk->f32_to_e2m1x2(y, (uint8_t *)dg_ptr2(out, i, 0), k);
            else
                ck->f32_to_e4m3(y, (uint8_t *)dg_ptr2(out, i, 0), (size_t)k);
        }
        store_scale_row(acc, sk, packed, out_sf, g);
    }
    dg_free(ws);
    return DG_OK;
}

/* The fast path when both tensors are contiguous along K (else the reference's strided walk). */
static dg_status quant_fp8_blocks(const dg_tensor *x, int64_t bm, int64_t bk, bool use_ue8m0, bool packed,
                                  const dg_tensor *out, const dg_tensor *out_sf) {
    if (!dg_use_reference() && x->strides[1] == 1 && out->strides[1] == 1)
        return fast_quant_blocks(x, bm, bk, use_ue8m0, packed, false, out, out_sf);
    DG_PATH_REFERENCE("x or out is strided along K");
    return ref_quant_fp8_blocks(x, bm, bk, use_ue8m0, packed, out, out_sf);
}

/* Query, then checks, of a 2-D data output and a 2-D scale output; *query is set when the
 * call only filled in descriptors. */
static dg_status prepare_outputs(const dg_tensor *x, dg_tensor *out, dg_dtype out_dtype, const int64_t out_shape[2],
                                 dg_tensor *out_sf, dg_dtype sf_dtype, const int64_t sf_shape[2], bool *query) {
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    DG_CHECK(out_sf != NULL, DG_ERR_NULL_POINTER, "argument 'out_sf' is NULL");
    const bool q_out = qa_query(out, out_dtype, 2, out_shape);
    const bool q_sf = qa_query(out_sf, sf_dtype, 2, sf_shape);
    *query = q_out || q_sf;
    if (*query)
        return DG_OK;
    if (out_dtype == DG_FP4_E2M1X2) {
        static const dg_dtype kFp4[2] = {DG_FP4_E2M1X2, DG_INT8};
        DG_TRY(dg_check_tensor(out, "out", 2));
        DG_TRY(dg_check_dtype_in(out, "out", kFp4, 2));
        DG_TRY(qa_check_output(out, "out", out->dtype, 2, out_shape));
        DG_TRY(dg_check_last_dim_contiguous(out, "out"));
    } else {
        DG_TRY(qa_check_output(out, "out", out_dtype, 2, out_shape));
    }
    DG_TRY(qa_check_output(out_sf, "out_sf", sf_dtype, 2, sf_shape));
    DG_TRY(dg_check_no_overlap(out, "out", x, "x", false));
    DG_TRY(dg_check_no_overlap(out_sf, "out_sf", x, "x", false));
    return dg_check_no_overlap(out_sf, "out_sf", out, "out", false);
}

dg_status dg_per_token_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, int use_packed_ue8m0,
                                   dg_tensor *out, dg_tensor *out_sf) {
    dg_api_begin("dg_per_token_cast_to_fp8");
    DG_TRY(qa_check_real_input(x, "x", 2));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], k = x->shape[1], s = qa_ceil_div(k, gran_k);
    /* packed: the last word's missing scales are 1.0 (byte 127), as DeepGEMM 2.8 pads them for
     * MXFP8 head dims of 32 and 64 (gran_k 32: one or two scales per row) */
    DG_CHECK(!use_packed_ue8m0 || use_ue8m0, DG_ERR_VALUE,
             "argument 'use_packed_ue8m0' needs use_ue8m0 (only powers of two can be packed)");
    const int64_t shape[2] = {m, k}, sf_shape[2] = {m, use_packed_ue8m0 ? qa_ceil_div(s, 4) : s};
    bool query;
    DG_TRY(prepare_outputs(x, out, DG_FLOAT8_E4M3, shape, out_sf, use_packed_ue8m0 ? DG_INT32 : DG_FLOAT32,
                           sf_shape, &query));
    if (query)
        return DG_OK;
    return quant_fp8_blocks(x, 1, gran_k, use_ue8m0 != 0, use_packed_ue8m0 != 0, out, out_sf);
}

dg_status dg_per_block_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, dg_tensor *out,
                                   dg_tensor *out_sf) {
    dg_api_begin("dg_per_block_cast_to_fp8");
    DG_TRY(qa_check_real_input(x, "x", 2));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], k = x->shape[1];
    const int64_t shape[2] = {m, k}, sf_shape[2] = {qa_ceil_div(m, gran_k), qa_ceil_div(k, gran_k)};
    bool query;
    DG_TRY(prepare_outputs(x, out, DG_FLOAT8_E4M3, shape, out_sf, DG_FLOAT32, sf_shape, &query));
    if (query)
        return DG_OK;
    return quant_fp8_blocks(x, gran_k, gran_k, use_ue8m0 != 0, false, out, out_sf);
}

dg_status dg_per_channel_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, dg_tensor *out,
                                     dg_tensor *out_sf) {
    dg_api_begin("dg_per_channel_cast_to_fp8");
    DG_TRY(qa_check_real_input(x, "x", 2));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], n = x->shape[1];
    DG_CHECK(m % gran_k == 0, DG_ERR_SHAPE, "argument 'x': rows (%lld) must be a multiple of gran_k (%d)",
             (long long)m, gran_k);
    const int64_t shape[2] = {m, n}, sf_shape[2] = {m / gran_k, n};
    bool query;
    DG_TRY(prepare_outputs(x, out, DG_FLOAT8_E4M3, shape, out_sf, DG_FLOAT32, sf_shape, &query));
    if (query)
        return DG_OK;
    return quant_fp8_blocks(x, gran_k, 1, use_ue8m0 != 0, false, out, out_sf);
}

dg_status dg_per_token_cast_to_fp4(const dg_tensor *x, int use_ue8m0, int gran_k, int use_packed_ue8m0,
                                   dg_tensor *out, dg_tensor *out_sf) {
    dg_api_begin("dg_per_token_cast_to_fp4");
    DG_TRY(qa_check_real_input(x, "x", 2));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], k = x->shape[1], s = qa_ceil_div(k, gran_k);
    DG_CHECK(k % 2 == 0, DG_ERR_SHAPE, "argument 'x': K (%lld) must be even to pack FP4 pairs", (long long)k);
    DG_CHECK((s % 2 == 0) || (gran_k % 2 == 0), DG_ERR_VALUE, /* no s * gran_k: it may overflow (tests/fuzz) */
             "argument 'gran_k' (%d): K (%lld) padded to a multiple of it (%lld blocks) must be even", gran_k,
             (long long)k, (long long)s);
    DG_CHECK(!use_packed_ue8m0 || use_ue8m0, DG_ERR_VALUE,
             "argument 'use_packed_ue8m0' needs use_ue8m0 (only powers of two can be packed)");
    const int64_t shape[2] = {m, k / 2}, sf_shape[2] = {m, use_packed_ue8m0 ? qa_ceil_div(s, 4) : s};
    bool query;
    DG_TRY(prepare_outputs(x, out, DG_FP4_E2M1X2, shape, out_sf, use_packed_ue8m0 ? DG_INT32 : DG_FLOAT32,
                           sf_shape, &query));
    if (query)
        return DG_OK;
    if (!dg_use_reference() && x->strides[1] == 1 && out->strides[1] == 1)
        return fast_quant_blocks(x, 1, gran_k, use_ue8m0 != 0, use_packed_ue8m0 != 0, true, out, out_sf);
    DG_PATH_REFERENCE("x or out is strided along K");
    return ref_quant_fp4_token(x, gran_k, use_ue8m0 != 0, use_packed_ue8m0 != 0, out, out_sf);
}

/* t viewed as 2-D [prod(shape[0, split)), prod(shape[split, ndim))] (o), when it has elements,
 * its dimensions from split on are row-major contiguous and those before split one uniformly
 * strided run (dimensions of size 1 take any stride); false when they are not (empty tensors,
 * whose strides may be anything, included: fuzz_quant found 1111551 x (2^63 - 1)). */
static bool flatten_2d(const dg_tensor *t, int split, dg_tensor *o) {
    if (dg_tensor_numel(t) == 0)
        return false;
    int64_t inner = 1, rows = 1, rs = 0, next = 0;
    for (int d = t->ndim - 1; d >= split; --d) {
        if (t->shape[d] != 1 && t->strides[d] != inner)
            return false;
        if (__builtin_mul_overflow(inner, t->shape[d], &inner))
            return false;
    }
    for (int d = split - 1; d >= 0; --d) {
        if (t->shape[d] == 1)
            continue;
        if (rows > 1 && t->strides[d] != next)
            return false;
        if (rows == 1)
            rs = t->strides[d];
        if (__builtin_mul_overflow(rows, t->shape[d], &rows) ||
            __builtin_mul_overflow(t->strides[d], t->shape[d], &next))
            return false;
    }
    *o = *t;
    o->ndim = 2;
    o->shape[0] = rows, o->shape[1] = inner;
    o->strides[0] = rows > 1 ? rs : inner, o->strides[1] = 1;
    return true;
}

/* Which dimensions keep their own scale; none kept means one scale for the whole tensor (torch's
 * amax over an empty dim list reduces everything, so listing every dimension does the same). */
static dg_status custom_dims_keep(const dg_tensor *x, const int *dims, int num_dims, bool keep[DG_MAX_DIMS]) {
    DG_CHECK(num_dims >= 0, DG_ERR_VALUE, "argument 'num_dims' must be >= 0, got %d", num_dims);
    DG_CHECK(num_dims == 0 || dims != NULL, DG_ERR_NULL_POINTER, "argument 'dims' is NULL");
    for (int d = 0; d < DG_MAX_DIMS; ++d)
        keep[d] = false;
    for (int i = 0; i < num_dims; ++i) {
        DG_CHECK(dims[i] >= 0 && dims[i] < x->ndim, DG_ERR_VALUE,
                 "argument 'dims': entry %d (%d) is not a dimension of x (ndim %d)", i, dims[i], x->ndim);
        DG_CHECK(!keep[dims[i]], DG_ERR_VALUE, "argument 'dims': dimension %d is listed twice", dims[i]);
        keep[dims[i]] = true;
    }
    if (num_dims == x->ndim)
        for (int d = 0; d < DG_MAX_DIMS; ++d)
            keep[d] = false;
    /* torch refuses to reduce over an empty dimension of an empty tensor. */
    for (int d = 0; d < x->ndim; ++d)
        DG_CHECK(keep[d] || x->shape[d] != 0, DG_ERR_SHAPE,
                 "argument 'x': dimension %d is empty and not in 'dims', so its amax is undefined", d);
    return DG_OK;
}

dg_status dg_per_custom_dims_cast_to_fp8(const dg_tensor *x, const int *dims, int num_dims, int use_ue8m0,
                                         dg_tensor *out, dg_tensor *out_sf) {
    dg_api_begin("dg_per_custom_dims_cast_to_fp8");
    DG_TRY(qa_check_real_input(x, "x", -1));
    bool keep[DG_MAX_DIMS];
    DG_TRY(custom_dims_keep(x, dims, num_dims, keep));
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    DG_CHECK(out_sf != NULL, DG_ERR_NULL_POINTER, "argument 'out_sf' is NULL");
    int64_t sf_shape[DG_MAX_DIMS];
    int sf_ndim = 0;
    for (int d = 0; d < x->ndim; ++d)
        if (keep[d] && x->shape[d] != 1) /* DeepGEMM returns sf.squeeze() */
            sf_shape[sf_ndim++] = x->shape[d];
    const bool q_out = qa_query(out, DG_FLOAT8_E4M3, x->ndim, x->shape);
    const bool q_sf = qa_query(out_sf, DG_FLOAT32, sf_ndim, sf_shape);
    if (q_out || q_sf)
        return DG_OK;
    DG_TRY(qa_check_output(out, "out", DG_FLOAT8_E4M3, x->ndim, x->shape));
    DG_TRY(qa_check_output(out_sf, "out_sf", DG_FLOAT32, sf_ndim, sf_shape));
    DG_TRY(dg_check_no_overlap(out, "out", x, "x", false));
    DG_TRY(dg_check_no_overlap(out_sf, "out_sf", x, "x", false));
    DG_TRY(dg_check_no_overlap(out_sf, "out_sf", out, "out", false));
    /* Kept dimensions before reduced ones (the indexer's per-row cast of q and k): rows of one
     * scale each, which the per-token kernels quantize with the reference's operations. */
    int split = 0;
    for (int d = 0; d < x->ndim; ++d)
        if (keep[d] && x->shape[d] != 1)
            split = d + 1;
    bool leading = true;
    for (int d = 0; d < split; ++d)
        leading &= keep[d] || x->shape[d] == 1;
    dg_tensor x2, out2, sf2;
    if (!dg_use_reference() && leading && flatten_2d(x, split, &x2) && flatten_2d(out, split, &out2) &&
        flatten_2d(out_sf, out_sf->ndim, &sf2) && x2.strides[1] == 1 && out2.strides[1] == 1)
        return fast_quant_blocks(&x2, 1, x2.shape[1], use_ue8m0 != 0, false, false, &out2, &sf2);
    DG_PATH("reference loops (custom dims: kept dimensions after reduced ones, or strides that do not flatten) | "
            "first: ndim=%d",
            x->ndim);
    return ref_quant_fp8_custom_dims(x, keep, use_ue8m0 != 0, out, out_sf);
}

/* The scale operand of a cast back: FLOAT32 [M, >= S] or packed INT32 [M, >= ceil(S / 4)] for
 * S = ceil(n / gran_k) groups. */
static dg_status check_cast_back_sf(const dg_tensor *sf, int64_t m, int64_t n, int gran_k, int use_packed_ue8m0) {
    const int64_t s = qa_ceil_div(n, gran_k);
    DG_TRY(dg_check_tensor_dtype(sf, "sf", 2, use_packed_ue8m0 ? DG_INT32 : DG_FLOAT32));
    DG_TRY(dg_check_dim(sf, "sf", 0, m));
    const int64_t sf_cols = use_packed_ue8m0 ? qa_ceil_div(s, 4) : s;
    DG_CHECK(sf->shape[1] >= sf_cols, DG_ERR_SHAPE,
             "argument 'sf' has %lld columns, fewer than the %lld that N = %lld and gran_k = %d need",
             (long long)sf->shape[1], (long long)sf_cols, (long long)n, gran_k);
    return DG_OK;
}

/* The FLOAT32 / BFLOAT16 [m, n] result of a cast back (or the query form's answer). */
static dg_status check_cast_back_out(dg_tensor *out, int64_t m, int64_t n, const dg_tensor *x, const char *x_name,
                                     const dg_tensor *sf, int *is_query) {
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    const int64_t shape[2] = {m, n};
    *is_query = qa_query(out, DG_FLOAT32, 2, shape);
    if (*is_query)
        return DG_OK;
    static const dg_dtype kOut[2] = {DG_FLOAT32, DG_BFLOAT16};
    DG_TRY(dg_check_tensor(out, "out", 2));
    DG_TRY(dg_check_dtype_in(out, "out", kOut, 2));
    DG_TRY(qa_check_output(out, "out", out->dtype, 2, shape));
    DG_TRY(dg_check_no_overlap(out, "out", x, x_name, false));
    return dg_check_no_overlap(out, "out", sf, "sf", false);
}

dg_status dg_cast_back_from_fp4(const dg_tensor *packed, const dg_tensor *sf, int gran_k, int use_packed_ue8m0,
                                dg_tensor *out) {
    dg_api_begin("dg_cast_back_from_fp4");
    DG_TRY(qa_check_fp4(packed, "packed"));
    DG_TRY(qa_check_gran_k(gran_k));
    int64_t n; /* logical N: twice the packed bytes (an empty tensor may claim any extent) */
    DG_CHECK(dg_mul_ok(packed->shape[1], 2, &n), DG_ERR_OVERFLOW,
             "argument 'packed': its logical extent 2 x %lld overflows", (long long)packed->shape[1]);
    const int64_t m = packed->shape[0];
    DG_TRY(check_cast_back_sf(sf, m, n, gran_k, use_packed_ue8m0));
    int is_query;
    DG_TRY(check_cast_back_out(out, m, n, packed, "packed", sf, &is_query));
    if (is_query)
        return DG_OK;
    DG_PATH("reference loops (no fast kernel) | first: m=%lld n=%lld", (long long)m, (long long)n);
    ref_cast_back_from_fp4(packed, sf, gran_k, use_packed_ue8m0 != 0, out);
    return DG_OK;
}

dg_status dg_cast_back_from_fp8(const dg_tensor *x, const dg_tensor *sf, int gran_k, int use_packed_ue8m0,
                                dg_tensor *out) {
    dg_api_begin("dg_cast_back_from_fp8");
    DG_TRY(dg_check_tensor_dtype(x, "x", 2, DG_FLOAT8_E4M3));
    DG_TRY(qa_check_gran_k(gran_k));
    const int64_t m = x->shape[0], n = x->shape[1];
    DG_TRY(check_cast_back_sf(sf, m, n, gran_k, use_packed_ue8m0));
    int is_query;
    DG_TRY(check_cast_back_out(out, m, n, x, "x", sf, &is_query));
    if (is_query)
        return DG_OK;
    DG_PATH("reference loops (no fast kernel) | first: m=%lld n=%lld", (long long)m, (long long)n);
    ref_cast_back_from_fp8(x, sf, gran_k, use_packed_ue8m0 != 0, out);
    return DG_OK;
}
