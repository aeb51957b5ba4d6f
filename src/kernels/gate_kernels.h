/*
 * gate_kernels.h - the MoE gate's scoring over a row of experts (engine/mega_gate.c), portable
 * and per ISA level: out[e] = f(in[e]) + (bias ? bias[e] : 0) for e < n, f the scoring function
 * (deepgemm.h "mega-gate"; sigmoid and sqrt(softplus) from core/float_math.h). Every level runs
 * float_math.h's operations in its order, lane by lane, so each gives the bits of
 * dg_gate_score (reference/ref_mega_gate.c). The vector files are compiled with
 * -ffp-contract=off (CMakeLists.txt); their scalar tails call dg_gate_score itself.
 */
#ifndef DG_KERNELS_GATE_KERNELS_H
#define DG_KERNELS_GATE_KERNELS_H

#include "../core/internal.h"
#include "../reference/ref_mega_gate.h"

/* The row function of an ISA level (the portable level: dg_gate_score_row_ref). */
dg_gate_score_row_fn dg_gate_score_row_for(dg_isa isa);

#if defined(__x86_64__) || defined(_M_X64)
#define DG_GATE_HAVE_X86 1
void dg_gate_score_row_avx2(dg_gate_scoring scoring, const float *in, const float *bias, int64_t n, float *out);
void dg_gate_score_row_avx512(dg_gate_scoring scoring, const float *in, const float *bias, int64_t n, float *out);
#else
#define DG_GATE_HAVE_X86 0
#endif

#endif /* DG_KERNELS_GATE_KERNELS_H */
