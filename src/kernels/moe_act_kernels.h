/*
 * moe_act_kernels.h - the Mega MoE's SwiGLU over one row of the L1 output (engine/mega_moe.c),
 * and its SiTU, per ISA level. SwiGLU: for i < I, with g = h[i] and u = h[I + i], clamped when clamp is finite
 * (g = min(g, clamp), u = min(max(u, -clamp), clamp); a NaN gives the bound, as fminf / fmaxf),
 *     a[i] = ((g / (1 + e^-g)) * u) * weight
 * in float32, e^x from core/float_math.h. Every level runs the reference's operations
 * (dg_ref_mega_moe_swiglu) in its order, lane by lane, so each gives its bits; the vector files
 * are compiled with -ffp-contract=off (CMakeLists.txt).
 */
#ifndef DG_KERNELS_MOE_ACT_KERNELS_H
#define DG_KERNELS_MOE_ACT_KERNELS_H

#include "../core/internal.h"

typedef void (*dg_swiglu_row_fn)(const float *h, int64_t inter, float clamp, float weight, float *a);
/* SiTU (dg_ref_situ_elem) over a row, likewise. */
typedef void (*dg_situ_row_fn)(const float *h, int64_t inter, float beta, float linear_beta, float weight,
                               float *a);

/* The row functions of an ISA level (the portable level: the reference's rows). */
dg_swiglu_row_fn dg_swiglu_row_for(dg_isa isa);
dg_situ_row_fn dg_situ_row_for(dg_isa isa);

#if defined(__x86_64__) || defined(_M_X64)
#define DG_MOE_ACT_HAVE_X86 1
void dg_swiglu_row_avx2(const float *h, int64_t inter, float clamp, float weight, float *a);
void dg_swiglu_row_avx512(const float *h, int64_t inter, float clamp, float weight, float *a);
void dg_situ_row_avx2(const float *h, int64_t inter, float beta, float linear_beta, float weight, float *a);
void dg_situ_row_avx512(const float *h, int64_t inter, float beta, float linear_beta, float weight, float *a);
#else
#define DG_MOE_ACT_HAVE_X86 0
#endif

#endif /* DG_KERNELS_MOE_ACT_KERNELS_H */
