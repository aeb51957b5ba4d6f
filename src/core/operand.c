/* operand.c - checking GEMM operands and their scales (see operand.h). */
#include "operand.h"

#include <math.h>
#include <string.h>

/* dg_ue8m0_to_float inlined for the scale tables' loops (2^(e - 127); 0: the subnormal 2^-127). */
static inline float ue8m0_value(uint32_t e) {
    const uint32_t bits = e ? e << 23 : 0x00400000u;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

dg_status dg_operand_init(dg_operand *op, const char *name, const dg_tensor *data, int grouped,
                          const dg_dtype *allowed, int n_allowed) {
    const int nd = grouped ? 3 : 2;
    DG_TRY(dg_check_tensor(data, name, nd));
    DG_TRY(dg_check_dtype_in(data, name, allowed, n_allowed));
    op->data = data;
    op->sf = NULL;
    op->grouped = grouped;
    op->groups = grouped ? data->shape[0] : 1;
    op->mn = data->shape[nd - 2];
    op->k = data->shape[nd - 1];
    op->fp4_dim = -1;
    op->gran_mn = op->gran_k = 1;
    op->sf_packed = 0;
    op->sf_pow2 = 0;
    if (data->dtype == DG_FP4_E2M1X2) {
        /* Pairs run along the unit-stride dimension. DeepGEMM's get_major_type_ab: K-major
         * exactly when stride(-1) == 1, else MN-major (stride(-2) == 1). Only when neither
         * stride is 1 does an extent of 1 decide (its stride is meaningless). */
        const int64_t *st = data->strides, *sh = data->shape;
        const bool k_major = st[nd - 1] == 1 || (st[nd - 2] != 1 && sh[nd - 1] <= 1);
        if (k_major) {
            op->fp4_dim = nd - 1;
            DG_CHECK(dg_mul_ok(op->k, 2, &op->k), DG_ERR_OVERFLOW,
                     "argument '%s': twice its packed FP4 K extent (%lld) overflows", name, (long long)sh[nd - 1]);
        } else if (st[nd - 2] == 1 || sh[nd - 2] <= 1) {
            op->fp4_dim = nd - 2;
            DG_CHECK(dg_mul_ok(op->mn, 2, &op->mn), DG_ERR_OVERFLOW,
                     "argument '%s': twice its packed FP4 MN extent (%lld) overflows", name, (long long)sh[nd - 2]);
        } else {
            return dg_fail(DG_ERR_LAYOUT,
                           "argument '%s': packed FP4 needs a unit stride in one of its last two "
                           "dimensions (strides %lld, %lld)",
                           name, (long long)data->strides[nd - 2], (long long)data->strides[nd - 1]);
        }
    }
    return DG_OK;
}

dg_status dg_operand_set_scales(dg_operand *op, const char *sf_name, const dg_tensor *sf,
                                int gran_mn, int gran_k) {
    const dg_dtype dt = op->data->dtype;
    const bool needs_sf = dt == DG_FLOAT8_E4M3 || dt == DG_FP4_E2M1X2;
    if (!needs_sf) {
        DG_CHECK(sf == NULL, DG_ERR_VALUE, "argument '%s': %s data takes no scales", sf_name,
                 dg_dtype_name(dt));
        op->sf = NULL;
        return DG_OK;
    }
    DG_CHECK(sf != NULL, DG_ERR_NULL_POINTER, "argument '%s': %s data needs scales", sf_name,
             dg_dtype_name(dt));
    DG_CHECK(gran_mn > 0 && gran_k > 0, DG_ERR_VALUE,
             "argument '%s': scale granularity (%d, %d) must be positive", sf_name, gran_mn, gran_k);
    const int nd = op->grouped ? 3 : 2;
    DG_TRY(dg_check_tensor(sf, sf_name, nd));
    const dg_dtype sf_types[2] = {DG_FLOAT32, DG_INT32};
    DG_TRY(dg_check_dtype_in(sf, sf_name, sf_types, 2));
    const bool packed = sf->dtype == DG_INT32;
    DG_CHECK(!packed || gran_mn == 1, DG_ERR_VALUE,
             "argument '%s': packed UE8M0 scales need gran_mn == 1 (recipe gives %d)", sf_name,
             gran_mn);
    if (op->grouped)
        DG_TRY(dg_check_dim(sf, sf_name, 0, op->groups));
    DG_TRY(dg_check_dim(sf, sf_name, nd - 2, dg_ceil_div(op->mn, gran_mn)));
    DG_TRY(dg_check_dim(sf, sf_name, nd - 1, dg_ceil_div(op->k, (int64_t)gran_k * (packed ? 4 : 1))));
    op->sf = sf;
    op->gran_mn = gran_mn;
    op->gran_k = gran_k;
    op->sf_packed = packed;
    op->sf_pow2 = 0; /* not yet scanned */
    return DG_OK;
}

static bool all_zero(const int *v, int n) {
    for (int i = 0; i < n; ++i)
        if (v[i] != 0)
            return false;
    return true;
}

dg_status dg_check_alpha(const dg_gemm_options *opts, bool allowed) {
    if (!opts || !opts->has_alpha)
        return DG_OK;
    DG_CHECK(allowed, DG_ERR_UNSUPPORTED,
             "argument 'alpha' is only taken by the dense GEMMs (bf16_gemm_*, fp8_fp4_gemm_*), as in DeepGEMM");
    DG_CHECK(isfinite(opts->alpha), DG_ERR_VALUE, "argument 'alpha' must be finite, got %g", (double)opts->alpha);
    return DG_OK;
}

dg_status dg_resolve_recipe(const dg_gemm_options *opt, const dg_tensor *sfa, const dg_tensor *sfb,
                            int gran_a[2], int gran_b[2]) {
    const dg_gemm_options def = dg_gemm_options_default();
    if (!opt)
        opt = &def;
    /* Only the dense GEMMs take alpha; they check it and pass their options on without it. */
    DG_TRY(dg_check_alpha(opt, false));
    const bool has_recipe = !all_zero(opt->recipe, 3);
    const bool has_a = !all_zero(opt->recipe_a, 2), has_b = !all_zero(opt->recipe_b, 2);
    DG_CHECK(has_a == has_b, DG_ERR_VALUE, "arguments 'recipe_a' and 'recipe_b' must be given together");
    DG_CHECK(!(has_a && has_recipe), DG_ERR_VALUE,
             "arguments 'recipe' and 'recipe_a'/'recipe_b': give either recipe or the pair, not both");
    if (has_a) {
        gran_a[0] = opt->recipe_a[0];
        gran_a[1] = opt->recipe_a[1];
        gran_b[0] = opt->recipe_b[0];
        gran_b[1] = opt->recipe_b[1];
    } else if (has_recipe) {
        gran_a[0] = opt->recipe[0];
        gran_b[0] = opt->recipe[1];
        gran_a[1] = gran_b[1] = opt->recipe[2];
    } else {
        /* DeepGEMM's get_default_recipe: float32 SFB is the legacy 1D2D format. */
        const bool sfb_packed = sfb && sfb->dtype == DG_INT32;
        (void)sfa;
        gran_a[0] = 1;
        gran_b[0] = sfb_packed ? 1 : 128;
        gran_a[1] = gran_b[1] = 128;
    }
    DG_CHECK(gran_a[0] > 0 && gran_a[1] > 0 && gran_b[0] > 0 && gran_b[1] > 0, DG_ERR_VALUE,
             "argument 'recipe': granularities must be positive (A: %d, %d; B: %d, %d)", gran_a[0], gran_a[1],
             gran_b[0], gran_b[1]);
    return DG_OK;
}

void dg_operand_scale_row(const dg_operand *op, int64_t i, int64_t step, int64_t count, float mult, float *out,
                          int64_t ostride) {
    const int64_t valid = step > 0 ? dg_ceil_div(op->k, step) : 0, n = valid < count ? valid : count;
    for (int64_t q = n; q < count; ++q)
        out[q * ostride] = 1.0f;
    const dg_tensor *t = op->sf;
    if (!t || n == 0) {
        for (int64_t q = 0; q < n; ++q)
            out[q * ostride] = mult;
        return;
    }
    if (op->gran_k % step && step % op->gran_k) {
        for (int64_t q = 0; q < n; ++q)
            out[q * ostride] = mult * dg_operand_scale(op, 0, i, q * step);
        return;
    }
    /* scale block sk covers `rep` steps (step divides gran_k), or each step skips `skip` blocks */
    const int64_t rep = op->gran_k % step == 0 ? op->gran_k / step : 1, skip = rep == 1 ? step / op->gran_k : 1;
    const int64_t s1 = t->strides[op->grouped ? 2 : 1];
    const char *row = (const char *)t->data + (i / op->gran_mn) * t->strides[op->grouped ? 1 : 0] * 4;
    for (int64_t q = 0, sk = 0; q < n; sk += skip) {
        const float v = !op->sf_packed ? ((const float *)row)[sk * s1]
                                       : ue8m0_value((((const uint32_t *)row)[(sk >> 2) * s1] >> (8 * (sk & 3))) & 0xffu);
        for (int64_t r = 0; r < rep && q < n; ++r, ++q)
            out[q * ostride] = mult * v;
    }
}

void dg_operand_block_scales(const dg_operand *op, int64_t i, int64_t q0, int64_t count, float *out, int64_t ostride) {
    const dg_tensor *t = op->sf;
    const int b = op->grouped ? 1 : 0;
    const int64_t s1 = t->strides[b + 1];
    const char *row = (const char *)t->data + (op->gran_mn == 1 ? i : i / op->gran_mn) * t->strides[b] * 4;
    for (int64_t q = 0; q < count; ++q) {
        const int64_t sk = q0 + q;
        out[q * ostride] = !op->sf_packed ? ((const float *)row)[sk * s1]
                                : ue8m0_value((((const uint32_t *)row)[(sk >> 2) * s1] >> (8 * (sk & 3))) & 0xffu);
    }
}

void dg_operand_block_scales_rows(const dg_operand *op, int64_t i0, int rows, int64_t q0, int64_t count, float *out,
                                  int64_t ostride) {
    const dg_tensor *t = op->sf;
    const int b = op->grouped ? 1 : 0;
    const int64_t s0 = t->strides[b], s1 = t->strides[b + 1];
    if (!op->sf_packed || s0 != 1) { /* a row at a time, each located once */
        for (int r = 0; r < rows; ++r)
            dg_operand_block_scales(op, i0 + r, q0, count, out + r, ostride);
        return;
    }
    /* MN-major packed (gran_mn 1: dg_operand_set_scales): block by block, the rows' words adjacent */
    const uint32_t *base = (const uint32_t *)t->data + i0;
    for (int64_t q = 0; q < count; ++q) {
        const uint32_t *col = base + ((q0 + q) >> 2) * s1;
        const int sh = (int)(8 * ((q0 + q) & 3));
        for (int r = 0; r < rows; ++r)
            out[q * ostride + r] = ue8m0_value((col[r] >> sh) & 0xffu);
    }
}

void dg_operand_prefetch_scales(const dg_operand *op, int64_t i0, int rows, int64_t count) {
    const dg_tensor *t = op->sf;
    const int b = op->grouped ? 1 : 0;
    const int64_t s0 = t->strides[b], s1 = t->strides[b + 1];
    const int64_t words = op->sf_packed ? (count + 3) / 4 : count;
    if (s1 != 1) /* K-major rows only: other layouts are read block by block, a line per 16 rows */
        return;
    for (int r = 0; r < rows; r += op->gran_mn) {
        const char *row = (const char *)t->data + 4 * ((i0 + r) / op->gran_mn * s0);
        for (int64_t w = 0; w < words; w += 16)
            __builtin_prefetch(row + 4 * w);
        __builtin_prefetch(row + 4 * (words - 1));
    }
}
