/*
 * convert_generic.c - portable twins of the AVX-512 run kernels: the scalar functions in a
 * loop, so they are the definition by construction.
 */
#include "convert.h"

void dg_f32_to_e4m3_generic(const float *src, uint8_t *dst, size_t n) {
    for (size_t i = 0; i < n; ++i)
        dst[i] = dg_float_to_e4m3(src[i]);
}

void dg_f32_to_bf16_generic(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; ++i)
        dst[i] = dg_float_to_bf16(src[i]);
}

void dg_e4m3_to_f32_generic(const uint8_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; ++i)
        dst[i] = dg_e4m3_to_float(src[i]);
}

/* Exact: every E4M3 value has at most 4 significant bits, so the BF16 rounding is a no-op. */
void dg_e4m3_to_bf16_generic(const uint8_t *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; ++i)
        dst[i] = dg_float_to_bf16(dg_e4m3_to_float(src[i]));
}
