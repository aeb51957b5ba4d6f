/*
 * quant_kernels.h - row kernels of the fast quantization path (src/api/quant.c): block amax
 * and the x * (1/sf) product (and E2M1 codes, which dg_cast lacks), in a portable and an AVX-512 version chosen by ISA level. The
 * products go to the dg_cast run kernels (src/formats/convert.h) for the E4M3 codes, so the
 * bits are those of the reference (src/reference/ref_quant.c).
 */
#ifndef DG_KERNELS_QUANT_KERNELS_H
#define DG_KERNELS_QUANT_KERNELS_H

#include "../formats/convert.h"

typedef struct dg_quant_kernels {
    /* row: k contiguous FLOAT32 (bf16 false) or BFLOAT16 values. For every block c of bk
     * columns (the last one may be short): acc[c] = max(acc[c], max |x[j]|). Returns true when
     * the row holds a NaN; acc is then meaningless (the caller recomputes in scalar code,
     * which knows which NaN the reference keeps). */
    bool (*row_block_amax)(const void *row, bool bf16, int64_t k, int64_t bk, float *acc);
    /* y[j] = x[j] * r[j / bk] for j < k, a single float32 multiply; where x[j] is NaN, x[j]
     * (the NaN x86 gives the reference's multiply, x being its first operand, whatever r). */
    void (*row_scale)(const void *row, bool bf16, int64_t k, int64_t bk, const float *r, float *y);
    /* k (even) floats -> k/2 packed E2M1 pairs, element 2i in the low nibble of byte i, each
     * code dg_float_to_e2m1's. */
    void (*f32_to_e2m1x2)(const float *y, uint8_t *dst, int64_t k);
} dg_quant_kernels;

#if DG_HAVE_AVX512_KERNELS
bool dg_quant_row_block_amax_avx512(const void *row, bool bf16, int64_t k, int64_t bk, float *acc);
void dg_quant_row_scale_avx512(const void *row, bool bf16, int64_t k, int64_t bk, const float *r, float *y);
void dg_quant_f32_to_e2m1x2_avx512(const float *y, uint8_t *dst, int64_t k);
#endif

#endif /* DG_KERNELS_QUANT_KERNELS_H */
