/*
 * mega_mhc.c - dg_mega_mhc (DeepGEMM 2.8's mega_mhc, csrc/apis/mega_mhc.hpp): argument checks,
 * then the fast path (engine/mega_mhc.c) or, when dg_use_reference(), the reference
 * (reference/ref_mhc.c). See deepgemm.h for the contract.
 */
#include "core/internal.h"
#include "engine/mega_mhc.h"
#include "reference/ref_mhc.h"

/* A dense tensor: dtype, ndim, extents (the first ndim of `shape`), row-major contiguous. */
static dg_status check_dense(const dg_tensor *t, const char *name, dg_dtype dtype, int ndim, const int64_t *shape) {
    DG_TRY(dg_check_tensor_dtype(t, name, ndim, dtype));
    for (int i = 0; i < ndim; ++i)
        DG_TRY(dg_check_dim(t, name, i, shape[i]));
    return dg_check_contiguous(t, name);
}

/* A scale-factor output INT32 [T, W]; column-major ones need stride (1, >= min_stride). */
static dg_status check_sf(const dg_tensor *t, const char *name, int64_t T, int64_t W, bool col_major,
                          int64_t min_stride, int64_t stride_multiple) {
    DG_TRY(dg_check_tensor_dtype(t, name, 2, DG_INT32));
    DG_TRY(dg_check_dim(t, name, 0, T));
    DG_TRY(dg_check_dim(t, name, 1, W));
    if (!col_major)
        return dg_check_contiguous(t, name);
    DG_CHECK(t->strides[0] == 1 || T <= 1, DG_ERR_LAYOUT,
             "argument '%s' must be column-major (stride 1 along tokens), got strides (%lld, %lld)", name,
             (long long)t->strides[0], (long long)t->strides[1]);
    DG_CHECK(W <= 1 || (t->strides[1] >= min_stride && t->strides[1] % stride_multiple == 0), DG_ERR_LAYOUT,
             "argument '%s': its column stride must be >= %lld and a multiple of %lld, got %lld", name,
             (long long)min_stride, (long long)stride_multiple, (long long)t->strides[1]);
    return DG_OK;
}

/* The optional-argument rules of DeepGEMM's mega_mhc. */
static dg_status check_optionals(const dg_tensor *shifted_prev_mix, const dg_tensor *new_prev_mix,
                                 const dg_tensor *y_bf16, const dg_tensor *y_fp8, const dg_tensor *y_gemm_sf,
                                 const dg_tensor *y_routed_sf, const dg_tensor *y_shared_sf, int shared_sf_block_m) {
    DG_CHECK((shifted_prev_mix != NULL) == (new_prev_mix != NULL), DG_ERR_VALUE,
             "argument 'new_prev_mix' must be given exactly when 'shifted_prev_mix' is (shifted mHC)");
    DG_CHECK((y_routed_sf != NULL) == (y_shared_sf != NULL), DG_ERR_VALUE,
             "argument 'y_shared_sf' must be given exactly when 'y_routed_sf' is");
    DG_CHECK(!(y_gemm_sf && y_routed_sf), DG_ERR_VALUE,
             "argument 'y_gemm_sf' cannot be given together with 'y_routed_sf' / 'y_shared_sf'");
    DG_CHECK(y_bf16 || y_fp8, DG_ERR_VALUE, "argument 'y_bf16': at least one of 'y_bf16' and 'y_fp8' is required");
    DG_CHECK((y_fp8 != NULL) == (y_gemm_sf || y_routed_sf), DG_ERR_VALUE,
             "argument 'y_fp8' needs scale outputs ('y_gemm_sf', or 'y_routed_sf' with 'y_shared_sf') and they "
             "need it");
    DG_CHECK(y_shared_sf ? shared_sf_block_m > 0 : shared_sf_block_m == 0, DG_ERR_VALUE,
             "argument 'shared_sf_block_m' must be positive with 'y_shared_sf' and 0 without it, got %d",
             shared_sf_block_m);
    return DG_OK;
}

typedef struct named {
    const dg_tensor *t;
    const char *name;
} named;

dg_status dg_mega_mhc(const dg_tensor *x, const dg_tensor *residual, const dg_tensor *shifted_prev_mix,
                      const dg_tensor *post_mix, const dg_tensor *comb_res_mix, const dg_tensor *fn,
                      const dg_tensor *mix_scales, const dg_tensor *mix_bases, int hc_mult, float hc_norm_eps,
                      float hc_pre_eps, float hc_post_scale, float sinkhorn_eps, int num_sinkhorn_iters,
                      const dg_tensor *rmsnorm_weight, float rmsnorm_eps, float rmsnorm_scale,
                      const dg_tensor *new_residual, const dg_tensor *new_prev_mix, const dg_tensor *new_post_mix,
                      const dg_tensor *new_comb_res_mix, const dg_tensor *y_bf16, const dg_tensor *y_fp8,
                      const dg_tensor *y_gemm_sf, const dg_tensor *y_routed_sf, const dg_tensor *y_shared_sf,
                      int shared_sf_block_m) {
    dg_api_begin("dg_mega_mhc");
    DG_TRY(check_optionals(shifted_prev_mix, new_prev_mix, y_bf16, y_fp8, y_gemm_sf, y_routed_sf, y_shared_sf,
                           shared_sf_block_m));
    DG_TRY(dg_check_tensor_dtype(x, "x", 2, DG_BFLOAT16));
    DG_TRY(dg_check_contiguous(x, "x"));
    const int64_t T = x->shape[0], H = x->shape[1];
    DG_CHECK(H > 0, DG_ERR_SHAPE, "argument 'x': hidden must be positive (got %lld)", (long long)H);
    DG_CHECK(hc_mult >= 1 && hc_mult <= DG_MEGA_MHC_MAX_HC_MULT, DG_ERR_VALUE,
             "argument 'hc_mult' must be in [1, %d] (DeepGEMM: 4), got %d", DG_MEGA_MHC_MAX_HC_MULT, hc_mult);
    DG_CHECK(num_sinkhorn_iters >= 1, DG_ERR_VALUE, "argument 'num_sinkhorn_iters' must be >= 1, got %d",
             num_sinkhorn_iters);
    const int64_t hc = hc_mult, N = hc * (hc + 2);
    int64_t K;
    DG_CHECK(dg_mul_ok(hc, H, &K) && K <= DG_MAX_SPAN_BYTES, DG_ERR_OVERFLOW,
             "argument 'x': hc_mult * hidden overflows");
    /* inputs */
    DG_TRY(check_dense(residual, "residual", DG_BFLOAT16, 3, (int64_t[]){T, hc, H}));
    if (shifted_prev_mix)
        DG_TRY(check_dense(shifted_prev_mix, "shifted_prev_mix", DG_FLOAT32, 3, (int64_t[]){T, hc, 1}));
    DG_TRY(check_dense(post_mix, "post_mix", DG_FLOAT32, 3, (int64_t[]){T, hc, 1}));
    DG_TRY(check_dense(comb_res_mix, "comb_res_mix", DG_FLOAT32, 3, (int64_t[]){T, hc, hc}));
    DG_TRY(check_dense(fn, "fn", DG_FLOAT32, 2, (int64_t[]){N, K}));
    DG_TRY(check_dense(mix_scales, "mix_scales", DG_FLOAT32, 1, (int64_t[]){3}));
    DG_TRY(check_dense(mix_bases, "mix_bases", DG_FLOAT32, 1, (int64_t[]){N}));
    DG_TRY(check_dense(rmsnorm_weight, "rmsnorm_weight", DG_BFLOAT16, 1, (int64_t[]){H}));
    /* outputs */
    DG_TRY(check_dense(new_residual, "new_residual", DG_BFLOAT16, 3, (int64_t[]){T, hc, H}));
    if (new_prev_mix)
        DG_TRY(check_dense(new_prev_mix, "new_prev_mix", DG_FLOAT32, 3, (int64_t[]){T, hc, 1}));
    DG_TRY(check_dense(new_post_mix, "new_post_mix", DG_FLOAT32, 3, (int64_t[]){T, hc, 1}));
    DG_TRY(check_dense(new_comb_res_mix, "new_comb_res_mix", DG_FLOAT32, 3, (int64_t[]){T, hc, hc}));
    if (y_bf16)
        DG_TRY(check_dense(y_bf16, "y_bf16", DG_BFLOAT16, 2, (int64_t[]){T, H}));
    const int64_t W = H / DG_MHC_SF_WORD;
    int64_t shared_rows = 0;
    dg_tensor shared_ext; /* y_shared_sf over all the rows it is written at */
    if (y_fp8) {
        DG_TRY(check_dense(y_fp8, "y_fp8", DG_FLOAT8_E4M3, 2, (int64_t[]){T, H}));
        DG_CHECK(H % DG_MHC_SF_WORD == 0, DG_ERR_SHAPE,
                 "argument 'y_fp8': hidden must be a multiple of %d (one INT32 of four per-32 scales), got %lld",
                 DG_MHC_SF_WORD, (long long)H);
        if (y_gemm_sf)
            DG_TRY(check_sf(y_gemm_sf, "y_gemm_sf", T, W, true, T, 4));
        if (y_routed_sf) {
            DG_TRY(check_sf(y_routed_sf, "y_routed_sf", T, W, false, 0, 1));
            const int64_t bm = shared_sf_block_m, per = dg_align(bm, 128);
            DG_CHECK(dg_mul_ok(dg_ceil_div(T, bm), per, &shared_rows) && shared_rows <= DG_MAX_SPAN_BYTES,
                     DG_ERR_OVERFLOW, "argument 'y_shared_sf': its row count overflows");
            DG_TRY(check_sf(y_shared_sf, "y_shared_sf", T, W, true, shared_rows, 1));
            shared_ext = *y_shared_sf;
            shared_ext.shape[0] = shared_rows;
            shared_ext.strides[0] = 1;
            DG_TRY(dg_check_tensor(&shared_ext, "y_shared_sf", 2));
        }
    }
    const named ins[] = {{x, "x"}, {residual, "residual"}, {shifted_prev_mix, "shifted_prev_mix"},
                         {post_mix, "post_mix"}, {comb_res_mix, "comb_res_mix"}, {fn, "fn"},
                         {mix_scales, "mix_scales"}, {mix_bases, "mix_bases"}, {rmsnorm_weight, "rmsnorm_weight"}};
    const named outs[] = {{new_residual, "new_residual"}, {new_prev_mix, "new_prev_mix"},
                          {new_post_mix, "new_post_mix"}, {new_comb_res_mix, "new_comb_res_mix"},
                          {y_bf16, "y_bf16"}, {y_fp8, "y_fp8"}, {y_gemm_sf, "y_gemm_sf"},
                          {y_routed_sf, "y_routed_sf"}, {y_shared_sf ? &shared_ext : NULL, "y_shared_sf"}};
    const int n_in = (int)(sizeof ins / sizeof ins[0]), n_out = (int)(sizeof outs / sizeof outs[0]);
    for (int o = 0; o < n_out; ++o) {
        if (!outs[o].t)
            continue;
        DG_TRY(dg_check_output(outs[o].t, outs[o].name));
        for (int i = 0; i < n_in; ++i)
            if (ins[i].t)
                DG_TRY(dg_check_no_overlap(outs[o].t, outs[o].name, ins[i].t, ins[i].name, false));
        for (int p = 0; p < o; ++p)
            if (outs[p].t)
                DG_TRY(dg_check_no_overlap(outs[o].t, outs[o].name, outs[p].t, outs[p].name, false));
    }
    if (T == 0)
        return DG_OK;
    const dg_tensor *sf = y_gemm_sf ? y_gemm_sf : y_routed_sf;
    const dg_mhc_call call = {
        .t = T, .h = H, .hc = hc_mult, .n = (int)N, .iters = num_sinkhorn_iters,
        .norm_eps = hc_norm_eps, .pre_eps = hc_pre_eps, .post_scale = hc_post_scale, .sk_eps = sinkhorn_eps,
        .rms_eps = rmsnorm_eps, .rms_scale = rmsnorm_scale,
        .x = x->data, .residual = residual->data, .rms_weight = rmsnorm_weight->data,
        .shifted_prev_mix = shifted_prev_mix ? shifted_prev_mix->data : NULL,
        .post_mix = post_mix->data, .comb = comb_res_mix->data, .fn = fn->data, .scales = mix_scales->data,
        .bases = mix_bases->data, .new_residual = new_residual->data,
        .new_prev_mix = new_prev_mix ? new_prev_mix->data : NULL, .new_post_mix = new_post_mix->data,
        .new_comb = new_comb_res_mix->data, .y_bf16 = y_bf16 ? y_bf16->data : NULL,
        .y_fp8 = y_fp8 ? y_fp8->data : NULL, .sf = sf ? sf->data : NULL,
        .sf_stride_t = sf ? sf->strides[0] : 0, .sf_stride_w = sf ? sf->strides[1] : 0,
        .shared_sf = y_shared_sf ? y_shared_sf->data : NULL,
        .shared_stride_w = y_shared_sf ? y_shared_sf->strides[1] : 0, .shared_bm = shared_sf_block_m,
        .fn_t = fn,
    };
    if (!dg_use_reference())
        return dg_mega_mhc_fast(&call);
    DG_PATH_REFERENCE("");
    return dg_ref_mega_mhc(&call);
}
