/*
 * gemm_alpha.h - DeepGEMM 2.8's `alpha` epilogue for the dense GEMMs (include/deepgemm.h,
 * dense-gemm): D = round(C + alpha * acc).
 *
 * The engines' epilogues round C + acc directly to D's dtype, and threading alpha through every
 * path (large M, small M, decode, pre-packed, AMX, reference) would multiply the places where the
 * arithmetic is written down. Instead the product is computed once into a float32 [M, N] buffer
 * (a FLOAT32 D without C stores acc unrounded), and one pass applies alpha and C. The cost is
 * the buffer and one pass over M x N, small beside the GEMM except for tiny K.
 */
#ifndef DG_API_GEMM_ALPHA_H
#define DG_API_GEMM_ALPHA_H

#include "core/internal.h"

/* Writes A @ B^T (no C) into `out`, a FLOAT32 [M, N] view with unit stride along N. */
typedef dg_status (*dg_product_fn)(const void *ctx, const dg_tensor *out);

/* D [m, n] = round(C + alpha * product); D and C already validated (C may be D itself). */
dg_status dg_gemm_with_alpha(const dg_tensor *d, const dg_tensor *c, int64_t m, int64_t n, float alpha,
                             dg_product_fn product, const void *ctx);

#endif
