/*
 * test_engine_widen.c - dg_engine_fetch_bf16 (one logical row of an operand as BF16, folded
 * scales applied) through each ISA level's widening kernels against the portable loops
 * (no configuration), bit for bit: E4M3 and E2M1 rows, K-contiguous, with and without folded
 * scales (float32 and packed UE8M0; scale blocks 2 .. 256, shorter and longer than the range),
 * ranges that start inside a scale block, odd K, ranges past K, and scales at the ends of
 * BF16's exponent range (rounded, not exact); and every E4M3 code, NaN included, against its value.
 */
#include "test_util.h"
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

/* A random power of two 2^e, e in [lo, hi]. */
static float pow2(tu_rng *r, int lo, int hi) {
    const int e = (int)tu_randint(r, lo, hi);
    union { uint32_t u; float f; } v = {(uint32_t)(e + 127) << 23};
    return v.f;
}

typedef struct wcase {
    dg_dtype dt;
    int64_t k;
    int gran_k, scaled, packed, extreme;
} wcase;

static void check(const dg_engine_cfg *cfg, const wcase *c, tu_rng *r) {
    const int64_t rows = 3, kb = c->dt == DG_FP4_E2M1X2 ? (c->k + 1) / 2 : c->k;
    dg_tensor t = tu_alloc2(c->dt == DG_FP4_E2M1X2 ? DG_INT8 : c->dt, rows, kb);
    for (int64_t i = 0; i < rows * kb; ++i)
        ((uint8_t *)t.data)[i] = (uint8_t)tu_next(r);
    if (c->dt == DG_FLOAT8_E4M3) /* no NaN codes: the fast path keeps them NaN too, but as its own NaN */
        for (int64_t i = 0; i < rows * kb; ++i)
            if ((((uint8_t *)t.data)[i] & 0x7f) == 0x7f)
                ((uint8_t *)t.data)[i] = 0x7e;
    t.dtype = c->dt;
    dg_operand op;
    static const dg_dtype kAllowed[2] = {DG_FLOAT8_E4M3, DG_FP4_E2M1X2};
    TU_CHECK_OK(dg_operand_init(&op, "b", &t, 0, kAllowed, 2));
    const int64_t nq = dg_ceil_div(op.k, c->gran_k); /* FP4: K is twice the bytes (even) */
    dg_tensor sf = c->packed ? tu_alloc2(DG_INT32, rows, dg_ceil_div(nq, 4)) : tu_alloc2(DG_FLOAT32, rows, nq);
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t q = 0; q < nq; ++q) {
            const float s = c->extreme ? pow2(r, q & 1 ? 100 : -126, q & 1 ? 127 : -100) : pow2(r, -20, 20);
            if (c->packed) {
                union { float f; uint32_t u; } v = {s};
                uint8_t *w = (uint8_t *)((int32_t *)sf.data + i * sf.strides[0] + q / 4);
                w[q % 4] = (uint8_t)(v.u >> 23);
            } else {
                ((float *)sf.data)[i * sf.strides[0] + q] = s;
            }
        }
    if (c->scaled)
        TU_CHECK_OK(dg_operand_set_scales(&op, "sfb", &sf, 1, c->gran_k));
    const int64_t kp = op.k + 40;
    static const int64_t kStarts[] = {0, 2, 30, 64, 66, 128, 130};
    uint16_t *want = malloc((size_t)kp * 2), *got = malloc((size_t)kp * 2);
    for (size_t si = 0; si < sizeof kStarts / sizeof kStarts[0]; ++si)
        for (int span = 0; span < 3; ++span) {
            const int64_t k0 = kStarts[si], k1 = span == 0 ? k0 + 128 : span == 1 ? kp : k0 + 38;
            if (k0 >= op.k)
                continue;
            for (int64_t i = 0; i < rows; ++i) {
                memset(want, 0x5a, (size_t)kp * 2);
                memset(got, 0xa5, (size_t)kp * 2);
                dg_engine_fetch_bf16(&op, i, c->scaled, k0, k1 < kp ? k1 : kp, want, NULL);
                dg_engine_fetch_bf16(&op, i, c->scaled, k0, k1 < kp ? k1 : kp, got, cfg);
                const int64_t n = (k1 < kp ? k1 : kp) - k0;
                TU_CHECK(memcmp(want, got, (size_t)n * 2) == 0,
                         "%s %s K=%lld gran %d scaled %d packed %d extreme %d: row %lld k [%lld, %lld) differs", cfg->name,
                         dg_dtype_name(c->dt), (long long)c->k, c->gran_k, c->scaled, c->packed, c->extreme, (long long)i,
                         (long long)k0, (long long)(k0 + n));
            }
        }
    free(want);
    free(got);
    tu_free(&sf);
    t.dtype = DG_INT8;
    tu_free(&t);
}

/* Every E4M3 code (NaN included: a NaN of the code's sign) through the level's widen_e4m3, unscaled,
 * at every length 0 .. 256 (masked tails), against the portable table. */
static void check_all_codes(const dg_engine_cfg *cfg) {
    uint8_t codes[256];
    uint16_t got[256 + 32];
    for (int c = 0; c < 256; ++c)
        codes[c] = (uint8_t)(c * 37 + 11); /* a permutation: every code once, neighbours differ */
    for (int n = 0; n <= 256; n += n < 40 ? 1 : 27) {
        memset(got, 0xee, sizeof got);
        cfg->widen_e4m3(codes, n, 1.0f, got);
        int bad = -1;
        for (int i = 0; i < n && bad < 0; ++i) {
            const uint8_t c = codes[i];
            const float want = dg_e4m3_to_float(c);
            const uint32_t bits = (uint32_t)got[i] << 16;
            float v;
            memcpy(&v, &bits, 4);
            const bool ok = (c & 0x7f) == 0x7f ? v != v && (got[i] >> 15) == (c >> 7) : memcmp(&v, &want, 4) == 0;
            if (!ok)
                bad = i;
        }
        TU_CHECK(bad < 0 && got[n] == 0xeeee, "%s E4M3 widening, n %d: code 0x%02x gives 0x%04x (or wrote past n)",
                 cfg->name, n, bad < 0 ? 0 : codes[bad], bad < 0 ? got[n] : got[bad]);
    }
}

int main(void) {
    const dg_isa best = dg_get_isa();
    tu_rng r = {0x5eed};
    static const int64_t kK[] = {1, 31, 64, 600};
    static const int kGran[] = {2, 16, 32, 64, 256};
    int levels = 0;
    for (int isa = DG_ISA_AVX2; isa <= (int)best; ++isa) {
        const dg_engine_cfg *cfg = dg_engine_config((dg_isa)isa);
        if (!cfg->widen_e4m3)
            continue;
        ++levels;
        check_all_codes(cfg);
        for (size_t ki = 0; ki < 4; ++ki)
            for (size_t gi = 0; gi < 5; ++gi)
                for (int v = 0; v < 5; ++v) { /* unscaled, float, packed, float extreme, packed extreme */
                    const wcase fp4 = {DG_FP4_E2M1X2, kK[ki], kGran[gi], v > 0, v == 2 || v == 4, v >= 3};
                    check(cfg, &fp4, &r);
                    const wcase fp8 = {DG_FLOAT8_E4M3, kK[ki], kGran[gi], v > 0, v == 2 || v == 4, v >= 3};
                    check(cfg, &fp8, &r);
                }
    }
    if (!levels)
        printf("no ISA widening kernels on this CPU: nothing to compare\n");
    return tu_finish();
}
