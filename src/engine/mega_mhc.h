/* mega_mhc.h - the fast dg_mega_mhc (engine/mega_mhc.c). */
#ifndef DG_ENGINE_MEGA_MHC_H
#define DG_ENGINE_MEGA_MHC_H

#include "../reference/ref_mhc.h"

/*
 * The checked call with T > 0. Steps 1 and 4 (deepgemm.h) per token in vectorisable loops with
 * the reference's operation order, OpenMP over tokens; step 2 on tf32_hc_prenorm_gemm's engine;
 * step 3 and the FP8 quantization are the reference's per-token functions. DG_ERR_ALLOC when
 * scratch memory cannot be allocated (before anything is written, except as deepgemm.h says).
 */
dg_status dg_mega_mhc_fast(const dg_mhc_call *c);

#endif /* DG_ENGINE_MEGA_MHC_H */
