/*
 * engine_variants.h - the engine's kernel variants on this CPU, for tests that run a case on
 * each: every ISA level up to the best, the AVX-512 BF16 level twice (VDPBF16PS kernel and
 * float32 FMA kernel, which give the same bits), then AMX (its own bits: engine.h).
 */
#ifndef TESTS_ENGINE_VARIANTS_H
#define TESTS_ENGINE_VARIANTS_H

#include "engine/engine.h"

static inline int tu_engine_variants(dg_isa best) { return (int)best + 1 + (best >= DG_ISA_AVX512_BF16); }

/* Selects variant v (0 .. tu_engine_variants(best) - 1) and returns its ISA level. */
static inline dg_isa tu_engine_variant_set(int v) {
    const dg_isa isa = v <= DG_ISA_AVX512_BF16 ? (dg_isa)v : v == DG_ISA_AVX512_BF16 + 1 ? DG_ISA_AVX512_BF16 : DG_ISA_AMX;
    dg_set_isa(isa);
    dg_engine_set_dpbf16(v == DG_ISA_AVX512_BF16 + 1 ? 0 : v == DG_ISA_AVX512_BF16 ? 1 : -1);
    return isa;
}

/* Restores the defaults after a variant loop. */
static inline void tu_engine_variants_done(dg_isa best) {
    dg_engine_set_dpbf16(-1);
    dg_set_isa(best);
}

#endif
