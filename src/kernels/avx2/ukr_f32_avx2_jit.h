/*
 * ukr_f32_avx2_jit.h - the runtime JIT's unit for the AVX2 float32 microkernel (src/jit/jit.h;
 * the descriptor is built by src/engine/jit_ukr.c). Not compiled into the library: CMake embeds
 * it and ukr_f32_avx2.h, and the JIT compiles them with these constants defined:
 *   DG_JIT_SYMBOL               the function's name (a dg_ukr_fn)
 *   DG_UKR_ACC, DG_UKR_SCALE    engine.h's dg_ukr_mode values
 *   DG_JIT_MR, DG_JIT_NV        the register tile (as the built-in instance of that MR)
 *   DG_JIT_LDC                  the row stride of c the caller passes (small-M path: NR)
 *   DG_JIT_KC, DG_JIT_KT        the k extents of the calls (K's slice or accumulation block, and the
 *                               tail), 0 when K is not a compiled dimension
 * Calls with other (kc, ldc) run the same body with them as variables: every call computes what
 * the built-in kernel computes, in the same order.
 */
#define DG_UKR_INLINE inline __attribute__((always_inline))
#include "ukr_f32_avx2.h"

void DG_JIT_SYMBOL(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode, const float *sa,
                   const float *sb);

void DG_JIT_SYMBOL(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode, const float *sa,
                   const float *sb) {
#if DG_JIT_KC > 0
    if (kc == DG_JIT_KC && ldc == DG_JIT_LDC) {
        dg_ukr_f32_avx2_body(DG_JIT_KC, a, b, c, DG_JIT_LDC, mode, sa, sb, DG_JIT_MR, DG_JIT_NV);
        return;
    }
#endif
#if DG_JIT_KT > 0 && DG_JIT_KT != DG_JIT_KC
    if (kc == DG_JIT_KT && ldc == DG_JIT_LDC) {
        dg_ukr_f32_avx2_body(DG_JIT_KT, a, b, c, DG_JIT_LDC, mode, sa, sb, DG_JIT_MR, DG_JIT_NV);
        return;
    }
#endif
    if (ldc == DG_JIT_LDC) {
        dg_ukr_f32_avx2_body(kc, a, b, c, DG_JIT_LDC, mode, sa, sb, DG_JIT_MR, DG_JIT_NV);
        return;
    }
    dg_ukr_f32_avx2_body(kc, a, b, c, ldc, mode, sa, sb, DG_JIT_MR, DG_JIT_NV);
}
