/*
 * jit_ukr.h - the engine's microkernels through the runtime JIT (src/jit/jit.h): the small-M
 * path's AVX2 float32 kernels instantiated with the call's k extents as constants
 * (jit_ukr.c; the engine.h contract: the same body, so the same bits).
 */
#ifndef DG_ENGINE_JIT_UKR_H
#define DG_ENGINE_JIT_UKR_H

#include "engine.h"

/* Where the engine uses the JIT: 1 every family and shape it covers, 0 nowhere, -1 where it
 * was measured faster (jit_ukr.c), -2 (the initial state) as DG_JIT says (1, 0, unset = -1). */
void dg_engine_set_jit(int use);
int dg_engine_jit_use(void);

/*
 * The kernel a small-M call runs instead of `builtin` (an MR-row instance of cfg's small-M
 * kernels): the JIT's instance for these calls' k extents when the JIT serves this shape, else
 * `builtin`. step: the k of every call but the last (the K slice, or the accumulation block gblk);
 * kp: the padded K the calls cover; m, n, k: the problem, for the policy and the path report.
 */
dg_ukr_fn dg_engine_jit_small_ukr(const dg_engine_cfg *cfg, dg_ukr_fn builtin, int mr, int64_t step, int64_t kp,
                                  int64_t m, int64_t n, int64_t k);

#endif /* DG_ENGINE_JIT_UKR_H */
