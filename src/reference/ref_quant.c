/*
 * ref_quant.c - reference quantization to E4M3 and E2M1, following deep_gemm/utils/math.py
 * operation by operation in float32:
 *   amax = max |x| over the group (zero padding never raises it; NaN propagates)
 *   amax = max(amax, float(1e-4));  sf = amax / fmt_max;  sf = ceil_to_ue8m0(sf) if asked
 *   data = cast(x * (1.0f / sf))   -- torch computes 1.0 / sf as reciprocal(sf) * 1.0
 * Two passes: all scales first (into a temporary), then the data, then the scales.
 */
#include "ref_quant.h"

#include "../formats/convert.h"

#include <math.h>
#include <string.h>

float ref_group_scale(float amax, float fmt_max, bool use_ue8m0) {
    if (!isnan(amax) && amax < DG_AMAX_MIN)
        amax = DG_AMAX_MIN;
    const float sf = amax / fmt_max;
    return use_ue8m0 ? dg_ceil_to_ue8m0(sf) : sf;
}

/* torch's amax step: NaN sticks once seen. */
static inline float amax_step(float amax, float v) {
    const float a = fabsf(v);
    return (isnan(a) || a > amax) ? a : amax;
}

static inline float load2(const dg_tensor *t, int64_t i, int64_t j) { return dg_load_float(t, dg_ptr2(t, i, j)); }

/* Scales [rows, cols] (row-major in sf) into out_sf: FLOAT32, or INT32 packed UE8M0 with
 * byte j of word q holding scale 4q + j and 1.0 (byte 127) where the row has no scale left. */
static void store_scales(const float *sf, int64_t rows, int64_t cols, bool packed, const dg_tensor *out_sf) {
    for (int64_t r = 0; r < rows; ++r) {
        if (!packed) {
            for (int64_t c = 0; c < cols; ++c)
                *(float *)dg_ptr2(out_sf, r, c) = sf[r * cols + c];
            continue;
        }
        for (int64_t q = 0; q < dg_ceil_div(cols, 4); ++q) {
            uint32_t word = 0;
            for (int j = 0; j < 4; ++j) {
                const int64_t c = 4 * q + j;
                uint32_t bits = 127u << 23; /* 1.0 */
                if (c < cols)
                    memcpy(&bits, &sf[r * cols + c], 4);
                word |= ((bits >> 23) & 0xffu) << (8 * j);
            }
            memcpy(dg_ptr2(out_sf, r, q), &word, 4);
        }
    }
}

/* Block scales of x [M, K] for bm x bk blocks into sf [ceil(M/bm), ceil(K/bk)]. */
static void block_scales(const dg_tensor *x, int64_t bm, int64_t bk, float fmt_max, bool use_ue8m0, float *sf) {
    const int64_t m = x->shape[0], k = x->shape[1], sm = dg_ceil_div(m, bm), sk = dg_ceil_div(k, bk);
    for (int64_t s = 0; s < sm * sk; ++s)
        sf[s] = 0.0f;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) {
            float *a = &sf[(i / bm) * sk + j / bk];
            *a = amax_step(*a, load2(x, i, j));
        }
    for (int64_t s = 0; s < sm * sk; ++s)
        sf[s] = ref_group_scale(sf[s], fmt_max, use_ue8m0);
}

dg_status ref_quant_fp8_blocks(const dg_tensor *x, int64_t bm, int64_t bk, bool use_ue8m0, bool packed,
                               const dg_tensor *out, const dg_tensor *out_sf) {
    const int64_t m = x->shape[0], k = x->shape[1], sm = dg_ceil_div(m, bm), sk = dg_ceil_div(k, bk);
    float *sf = dg_malloc((size_t)(sm * sk > 0 ? sm * sk : 1) * sizeof(float));
    DG_CHECK(sf != NULL, DG_ERR_ALLOC, "cannot allocate %lld scales", (long long)(sm * sk));
    block_scales(x, bm, bk, DG_E4M3_MAX, use_ue8m0, sf);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) {
            const float r = 1.0f / sf[(i / bm) * sk + j / bk];
            *(uint8_t *)dg_ptr2(out, i, j) = dg_float_to_e4m3(load2(x, i, j) * r);
        }
    store_scales(sf, sm, sk, packed, out_sf);
    dg_free(sf);
    return DG_OK;
}

/* Linear index of idx among the kept dimensions (row-major over them). */
static int64_t kept_index(const dg_tensor *x, const bool *keep, const int64_t *idx) {
    int64_t lin = 0;
    for (int d = 0; d < x->ndim; ++d)
        if (keep[d])
            lin = lin * x->shape[d] + idx[d];
    return lin;
}

dg_status ref_quant_fp8_custom_dims(const dg_tensor *x, const bool *keep, bool use_ue8m0, const dg_tensor *out,
                                    const dg_tensor *out_sf) {
    int64_t ns = 1;
    for (int d = 0; d < x->ndim; ++d)
        ns *= keep[d] ? x->shape[d] : 1;
    float *sf = dg_malloc((size_t)(ns > 0 ? ns : 1) * sizeof(float));
    DG_CHECK(sf != NULL, DG_ERR_ALLOC, "cannot allocate %lld scales", (long long)ns);
    for (int64_t s = 0; s < ns; ++s)
        sf[s] = 0.0f;
    const int64_t n = dg_tensor_numel(x);
    int64_t idx[DG_MAX_DIMS] = {0};
    for (int64_t e = 0; e < n; ++e, dg_index_next(idx, x->shape, x->ndim)) {
        float *a = &sf[kept_index(x, keep, idx)];
        *a = amax_step(*a, dg_load_float(x, dg_elem_ptr(x, idx)));
    }
    for (int64_t s = 0; s < ns; ++s)
        sf[s] = ref_group_scale(sf[s], DG_E4M3_MAX, use_ue8m0);
    memset(idx, 0, sizeof idx);
    for (int64_t e = 0; e < n; ++e, dg_index_next(idx, x->shape, x->ndim)) {
        const float r = 1.0f / sf[kept_index(x, keep, idx)];
        *(uint8_t *)dg_elem_ptr(out, idx) = dg_float_to_e4m3(dg_load_float(x, dg_elem_ptr(x, idx)) * r);
    }
    /* The scales in row-major order of out_sf's own (squeezed) shape: the same order. */
    const int64_t nsf = dg_tensor_numel(out_sf);
    memset(idx, 0, sizeof idx);
    for (int64_t s = 0; s < nsf; ++s, dg_index_next(idx, out_sf->shape, out_sf->ndim))
        *(float *)dg_elem_ptr(out_sf, idx) = sf[s];
    dg_free(sf);
    return DG_OK;
}

dg_status ref_quant_fp4_token(const dg_tensor *x, int64_t gran_k, bool use_ue8m0, bool packed, const dg_tensor *out,
                              const dg_tensor *out_sf) {
    const int64_t m = x->shape[0], k = x->shape[1], sk = dg_ceil_div(k, gran_k);
    float *sf = dg_malloc((size_t)(m * sk > 0 ? m * sk : 1) * sizeof(float));
    DG_CHECK(sf != NULL, DG_ERR_ALLOC, "cannot allocate %lld scales", (long long)(m * sk));
    block_scales(x, 1, gran_k, DG_E2M1_MAX, use_ue8m0, sf);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; j += 2) { /* k is even: pairs are whole */
            const float r0 = 1.0f / sf[i * sk + j / gran_k], r1 = 1.0f / sf[i * sk + (j + 1) / gran_k];
            const uint8_t lo = dg_float_to_e2m1(load2(x, i, j) * r0);
            const uint8_t hi = dg_float_to_e2m1(load2(x, i, j + 1) * r1);
            *(uint8_t *)dg_ptr2(out, i, j / 2) = (uint8_t)(lo | (hi << 4));
        }
    store_scales(sf, m, sk, packed, out_sf);
    dg_free(sf);
    return DG_OK;
}
