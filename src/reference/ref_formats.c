/*
 * ref_formats.c - reference format utilities: FP4 and FP8 dequantization, FP4 transposition, UE8M0
 * packing, element-wise ceil_to_ue8m0 and calc_diff (declared in ref_quant.h).
 */
#include "ref_quant.h"

#include "../formats/convert.h"

#include <string.h>

static inline uint8_t fp4_code(const dg_tensor *t, int64_t r, int64_t c) {
    const uint8_t byte = *(const uint8_t *)dg_ptr2(t, r, c / 2);
    return (c & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
}

/* DeepGEMM's dequantization: the sign only applies to a non-zero magnitude (code 8 -> +0). */
static inline float fp4_value(uint8_t code) {
    const float v = dg_e2m1_to_float(code & 7);
    return ((code & 8) && (code & 7)) ? -v : v;
}

/* Packed UE8M0 as DeepGEMM unpacks it: the byte shifted into the float32 exponent field. */
static inline float ue8m0_bits_to_float(uint32_t byte) {
    const uint32_t bits = byte << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The scale of row i's group g: float32, or byte g % 4 of packed word g / 4 as DeepGEMM unpacks. */
static float group_scale(const dg_tensor *sf, bool sf_packed, int64_t i, int64_t g) {
    if (!sf_packed)
        return *(const float *)dg_ptr2(sf, i, g);
    const uint32_t word = *(const uint32_t *)dg_ptr2(sf, i, g / 4);
    return ue8m0_bits_to_float((word >> (8 * (g % 4))) & 0xffu);
}

void ref_cast_back_from_fp4(const dg_tensor *packed, const dg_tensor *sf, int64_t gran_k, bool sf_packed,
                            const dg_tensor *out) {
    const int64_t m = out->shape[0], n = out->shape[1];
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
            dg_store_float(out, dg_ptr2(out, i, j),
                           fp4_value(fp4_code(packed, i, j)) * group_scale(sf, sf_packed, i, j / gran_k));
}

void ref_cast_back_from_fp8(const dg_tensor *x, const dg_tensor *sf, int64_t gran_k, bool sf_packed,
                            const dg_tensor *out) {
    const int64_t m = out->shape[0], n = out->shape[1];
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
            dg_store_float(out, dg_ptr2(out, i, j), dg_e4m3_to_float(*(const uint8_t *)dg_ptr2(x, i, j)) *
                                                        group_scale(sf, sf_packed, i, j / gran_k));
}

void ref_transpose_packed_fp4(const dg_tensor *a, const dg_tensor *out) {
    /* Logical a is [M, N]; logical out is [N, M] with out[c][r] = a[r][c]. */
    const int64_t n = out->shape[0], m_half = out->shape[1];
    for (int64_t c = 0; c < n; ++c)
        for (int64_t q = 0; q < m_half; ++q) {
            const uint8_t lo = fp4_code(a, 2 * q, c), hi = fp4_code(a, 2 * q + 1, c);
            *(uint8_t *)dg_ptr2(out, c, q) = (uint8_t)(lo | (hi << 4));
        }
}

void ref_pack_ue8m0(const dg_tensor *x, const dg_tensor *out) {
    /* Walk out; word q of a row takes x[..., 4q + j] as byte j. */
    const int nd = out->ndim;
    const int64_t n = dg_tensor_numel(out);
    int64_t idx[DG_MAX_DIMS] = {0}, xi[DG_MAX_DIMS];
    for (int64_t e = 0; e < n; ++e, dg_index_next(idx, out->shape, nd)) {
        memcpy(xi, idx, sizeof xi);
        uint32_t word = 0;
        for (int j = 0; j < 4; ++j) {
            xi[nd - 1] = 4 * idx[nd - 1] + j;
            uint32_t bits;
            memcpy(&bits, dg_elem_ptr(x, xi), 4);
            word |= ((bits >> 23) & 0xffu) << (8 * j);
        }
        memcpy(dg_elem_ptr(out, idx), &word, 4);
    }
}

void ref_unpack_ue8m0(const dg_tensor *packed_sf, const dg_tensor *out) {
    const int nd = out->ndim;
    const int64_t n = dg_tensor_numel(out);
    int64_t idx[DG_MAX_DIMS] = {0}, pi[DG_MAX_DIMS];
    for (int64_t e = 0; e < n; ++e, dg_index_next(idx, out->shape, nd)) {
        memcpy(pi, idx, sizeof pi);
        pi[nd - 1] = idx[nd - 1] / 4;
        const uint32_t word = *(const uint32_t *)dg_elem_ptr(packed_sf, pi);
        *(float *)dg_elem_ptr(out, idx) = ue8m0_bits_to_float((word >> (8 * (idx[nd - 1] % 4))) & 0xffu);
    }
}

void ref_ceil_to_ue8m0(const dg_tensor *x, const dg_tensor *out) {
    const int64_t n = dg_tensor_numel(x);
    int64_t idx[DG_MAX_DIMS] = {0};
    for (int64_t e = 0; e < n; ++e, dg_index_next(idx, x->shape, x->ndim))
        *(float *)dg_elem_ptr(out, idx) = dg_ceil_to_ue8m0(dg_load_float(x, dg_elem_ptr(x, idx)));
}

double ref_calc_diff(const dg_tensor *x, const dg_tensor *y) {
    const int64_t n = dg_tensor_numel(x);
    double xy = 0.0, den = 0.0;
    int64_t idx[DG_MAX_DIMS] = {0};
    for (int64_t e = 0; e < n; ++e, dg_index_next(idx, x->shape, x->ndim)) {
        const double a = dg_load_float(x, dg_elem_ptr(x, idx)), b = dg_load_float(y, dg_elem_ptr(y, idx));
        xy += a * b;
        den += a * a + b * b;
    }
    if (den == 0.0)
        return 0.0;
    return 1.0 - 2.0 * xy / den;
}
