/*
 * convert.h - bulk conversions between FLOAT32, BFLOAT16 and FLOAT8_E4M3 (dg_cast).
 *
 * Contiguous runs go through a table of run kernels chosen by ISA level: a portable
 * `_generic` twin (convert_generic.c) and an AVX-512 version (kernels/avx512/convert_avx512.c)
 * with the same signature. Every kernel must give exactly the bits of the scalar functions in
 * scalar.c; tests/test_formats.c checks that exhaustively for both.
 */
#ifndef DG_FORMATS_CONVERT_H
#define DG_FORMATS_CONVERT_H

#include "../core/internal.h"

#include <string.h>

/* The AVX2 and AVX-512 kernels are compiled (with their own flags, see CMakeLists.txt) on
 * x86-64 only. */
#if defined(__x86_64__) || defined(_M_X64)
#define DG_HAVE_AVX512_KERNELS 1
#define DG_HAVE_AVX2_KERNELS 1
#else
#define DG_HAVE_AVX512_KERNELS 0
#define DG_HAVE_AVX2_KERNELS 0
#endif

/* dg_float_to_bf16 (round to nearest even; NaN stays NaN, quiet) inline, for loops that store
 * one value at a time; scalar.c defines the public function with it. */
static inline uint16_t dg_round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force a quiet payload */
        return (uint16_t)((u >> 16) | 0x0040u);
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u); /* ties to even */
    return (uint16_t)((u + rounding) >> 16);
}

/* Convert n contiguous elements; src and dst do not overlap. */
typedef struct dg_convert_kernels {
    void (*f32_to_e4m3)(const float *src, uint8_t *dst, size_t n);
    void (*f32_to_bf16)(const float *src, uint16_t *dst, size_t n);
    void (*e4m3_to_f32)(const uint8_t *src, float *dst, size_t n);
    void (*e4m3_to_bf16)(const uint8_t *src, uint16_t *dst, size_t n);
} dg_convert_kernels;

void dg_f32_to_e4m3_generic(const float *src, uint8_t *dst, size_t n);
void dg_f32_to_bf16_generic(const float *src, uint16_t *dst, size_t n);
void dg_e4m3_to_f32_generic(const uint8_t *src, float *dst, size_t n);
void dg_e4m3_to_bf16_generic(const uint8_t *src, uint16_t *dst, size_t n);
#if DG_HAVE_AVX2_KERNELS
void dg_f32_to_e4m3_avx2(const float *src, uint8_t *dst, size_t n);
void dg_f32_to_bf16_avx2(const float *src, uint16_t *dst, size_t n);
void dg_e4m3_to_f32_avx2(const uint8_t *src, float *dst, size_t n);
void dg_e4m3_to_bf16_avx2(const uint8_t *src, uint16_t *dst, size_t n);
#endif
#if DG_HAVE_AVX512_KERNELS
void dg_f32_to_e4m3_avx512(const float *src, uint8_t *dst, size_t n);
void dg_f32_to_bf16_avx512(const float *src, uint16_t *dst, size_t n);
void dg_e4m3_to_f32_avx512(const uint8_t *src, float *dst, size_t n);
void dg_e4m3_to_bf16_avx512(const uint8_t *src, uint16_t *dst, size_t n);
#endif

/* The run kernels for an ISA level (the best this build has at or below it). */
const dg_convert_kernels *dg_convert_kernels_for(dg_isa isa);

/* Converts every element of src into dst. The caller has checked dtypes (FLOAT32, BFLOAT16,
 * FLOAT8_E4M3), equal shapes and overlap. Uses the kernels of dg_get_isa(). */
void dg_convert_tensor(const dg_tensor *src, const dg_tensor *dst);

/* Row-major multi-index walking over `shape` (ndim dims): advances idx, returns false after
 * the last element. */
static inline bool dg_index_next(int64_t *idx, const int64_t *shape, int ndim) {
    for (int i = ndim - 1; i >= 0; --i) {
        if (++idx[i] < shape[i])
            return true;
        idx[i] = 0;
    }
    return false;
}

/* Element offset (in elements) of idx in t. */
static inline int64_t dg_index_offset(const dg_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; ++i)
        off += idx[i] * t->strides[i];
    return off;
}

#endif /* DG_FORMATS_CONVERT_H */
