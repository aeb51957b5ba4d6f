/*
 * jit_ukr.c - the small-M path's microkernels through the runtime JIT (jit_ukr.h).
 *
 * The family: the AVX2 float32 kernels (kernels/avx2/ukr_f32_avx2.h, MR = 1, 2, 4, 6, NR = 16),
 * instantiated by kernels/avx2/ukr_f32_avx2_jit.h with the small-M path's row stride of c (NR)
 * and, when K is a compiled dimension, the k extents of its calls: the K slice or accumulation
 * block gblk (every call but the last) and the tail. Calls with other extents run the same body with
 * variables, so the JIT's kernel computes exactly what the built-in one does, in the same order.
 *
 * compiled_dims (DeepGEMM's get_compiled_dim): a dimension named in the call's compiled_dims
 * (dg_gemm_options; "nk" when the entry point takes none) becomes a constant, unless
 * dg_set_ignore_compile_dims(1). This family uses K only: M and N set loop counts outside the
 * microkernel, so naming them changes nothing here.
 *
 * Where: DG_JIT=1 (or dg_engine_set_jit(1)) for every call the family covers; by default only
 * for shapes measured faster (none yet: README, "Runtime JIT", has the measurements).
 */
#include "jit_ukr.h"

#include "../jit/jit.h"

#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#define DG_X86 1
#else
#define DG_X86 0
#endif

static atomic_int g_use = -2;

void dg_engine_set_jit(int use) { atomic_store(&g_use, use < -1 ? -2 : use > 1 ? 1 : use); }

int dg_engine_jit_use(void) {
    const int u = atomic_load_explicit(&g_use, memory_order_relaxed);
    return u == -2 ? dg_jit_mode() : u;
}

/* Shapes where the JIT's kernel was measured faster than the built-in one (default policy). */
static bool measured_faster(int mr, int64_t m, int64_t n, int64_t k) {
    (void)mr, (void)m, (void)n, (void)k;
    return false;
}

dg_ukr_fn dg_engine_jit_small_ukr(const dg_engine_cfg *cfg, dg_ukr_fn builtin, int mr, int64_t step, int64_t kp,
                                  int64_t m, int64_t n, int64_t k) {
#if DG_X86
    const int use = dg_engine_jit_use();
    if (use == 0 || (use < 0 && !measured_faster(mr, m, n, k)) || cfg->fmt != DG_PACK_F32 || cfg->nr != 16)
        return builtin;
    if (builtin != dg_ukr_f32_avx2_mr1 && builtin != dg_ukr_f32_avx2_mr2 && builtin != dg_ukr_f32_avx2_mr4 &&
        builtin != dg_ukr_f32_avx2)
        return builtin;
    int dims = dg_api_compiled_dims();
    if (dims < 0)
        dims = DG_DIM_N | DG_DIM_K; /* DeepGEMM's default for the NT GEMMs */
    if (dg_get_ignore_compile_dims())
        dims = 0;
    const int64_t kc = (dims & DG_DIM_K) && kp > 0 ? step : 0, kt = kc ? kp % step : 0;
    const dg_jit_desc d = {
        .family = "ukr_f32_avx2",
        .symbol = "dg_jit_ukr_f32_avx2",
        .nconsts = 7,
        .consts = {{"DG_UKR_ACC", DG_UKR_ACC},
                   {"DG_UKR_SCALE", DG_UKR_SCALE},
                   {"DG_JIT_MR", mr},
                   {"DG_JIT_NV", cfg->nr / 8},
                   {"DG_JIT_LDC", cfg->nr},
                   {"DG_JIT_KC", kc},
                   {"DG_JIT_KT", kt}},
        .nsources = 1,
        .sources = {"kernels/avx2/ukr_f32_avx2_jit.h"},
        /* DG_ISA_FLAGS_avx2 (CMakeLists.txt), and the built-in kernels' tuning: -march=native
         * implies -mtune=native, and on Zen 3 -mtune=znver3 makes these kernels 1.5x slower at
         * MR 4 and 6 (B loads folded into every FMA, extra register moves: 265 vs 177 ns per
         * kc = 128 call at MR 4, 443 vs 287 at MR 6, measured with test_jit --bench's kernels) */
        .flags = "-mavx2 -mfma -mf16c -mtune=generic",
    };
    const dg_ukr_fn fn = (dg_ukr_fn)dg_jit_get(&d);
    if (!fn) {
        DG_PATH("%s small-M microkernel: built-in [runtime JIT declined: off, no compiler or no cache; "
                "DG_JIT_DEBUG=1 says which] | first: m=%lld n=%lld k=%lld",
                cfg->name, (long long)m, (long long)n, (long long)k);
        return builtin;
    }
    DG_PATH("%s small-M microkernel from the runtime JIT (MR %d, kc %s) | first: m=%lld n=%lld k=%lld kc=%lld "
            "tail=%lld",
            cfg->name, mr, kc ? "constant" : "variable", (long long)m, (long long)n, (long long)k, (long long)kc,
            (long long)kt);
    return fn;
#else
    (void)cfg, (void)mr, (void)step, (void)kp, (void)m, (void)n, (void)k;
    return builtin;
#endif
}
