/*
 * test_quant_fast.c - the fast FP8 block casts (per token, per block, per channel) and FP4
 * per-token cast against the scalar reference backend, bit for bit (data and scales), at
 * every ISA level the CPU has: random rows of mixed magnitudes, zero rows, denormals, infinities, NaN rows with
 * several payloads and signs in one group, K tails that are not multiples of the group,
 * UE8M0 on and off, packed scales, strided rows and one or all threads.
 */
#include "common/test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Row-kind mix: kinds repeat with different periods so groups of rows see several at once. */
static float sample(tu_rng *r, int64_t i, int64_t j, float row_scale) {
    if (i % 5 == 1)
        return (j & 1) ? -0.0f : 0.0f;
    if (i % 7 == 2) { /* float32 denormals (also BF16 denormals after truncation) */
        uint32_t u = (uint32_t)tu_randint(r, 1, 0x7fffff) | (tu_next(r) & 1 ? 0x80000000u : 0);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (i % 11 == 3 && j % 37 == 5)
        return (j & 2) ? INFINITY : -INFINITY;
    if (i % 13 == 4 && j % 29 == 3) { /* NaNs whose payloads and signs differ */
        uint32_t u = 0x7fc00000u | (uint32_t)(j * 0x10101u & 0x3f0000u) | (j & 4 ? 0x80000000u : 0);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return (float)tu_normal(r) * row_scale;
}

static dg_tensor make_x(tu_rng *r, dg_dtype dt, int64_t m, int64_t k, int64_t ld, void **mem) {
    const size_t es = dt == DG_BFLOAT16 ? 2 : 4;
    *mem = calloc((size_t)(m * ld + 1), es);
    for (int64_t i = 0; i < m; ++i) {
        const float row_scale = ldexpf(1.0f, (int)tu_randint(r, -24, 20));
        for (int64_t j = 0; j < k; ++j) {
            const float v = sample(r, i, j, row_scale);
            if (dt == DG_BFLOAT16)
                ((uint16_t *)*mem)[i * ld + j] = (uint16_t)(f2u(v) >> 16);
            else
                ((float *)*mem)[i * ld + j] = v;
        }
    }
    dg_tensor x = dg_tensor_2d(*mem, dt, m, k);
    x.strides[0] = ld;
    return x;
}

typedef enum { PER_TOKEN, PER_BLOCK, PER_CHANNEL, PER_TOKEN_FP4 } kind;

static dg_status run(kind kd, const dg_tensor *x, int ue8m0, int g, int packed, dg_tensor *out, dg_tensor *sf) {
    if (kd == PER_TOKEN)
        return dg_per_token_cast_to_fp8(x, ue8m0, g, packed, out, sf);
    if (kd == PER_TOKEN_FP4)
        return dg_per_token_cast_to_fp4(x, ue8m0, g, packed, out, sf);
    if (kd == PER_BLOCK)
        return dg_per_block_cast_to_fp8(x, ue8m0, g, out, sf);
    return dg_per_channel_cast_to_fp8(x, ue8m0, g, out, sf);
}

/* One call on each backend with fresh outputs (query form), then bytewise equality. */
static void compare(kind kd, const dg_tensor *x, int ue8m0, int g, int packed, const char *what) {
    dg_tensor o[2], s[2];
    void *mo[2], *ms[2];
    for (int b = 0; b < 2; ++b) {
        o[b].data = NULL;
        s[b].data = NULL;
        TU_CHECK_OK(run(kd, x, ue8m0, g, packed, &o[b], &s[b]));
        mo[b] = malloc(dg_tensor_nbytes(&o[b]) + 1);
        ms[b] = malloc(dg_tensor_nbytes(&s[b]) + 1);
        memset(mo[b], 0xa5, dg_tensor_nbytes(&o[b]) + 1);
        memset(ms[b], 0xa5, dg_tensor_nbytes(&s[b]) + 1);
        o[b].data = mo[b];
        s[b].data = ms[b];
        TU_CHECK_OK(dg_set_backend(b ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO));
        TU_CHECK_OK(run(kd, x, ue8m0, g, packed, &o[b], &s[b]));
    }
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    TU_CHECK(memcmp(mo[0], mo[1], dg_tensor_nbytes(&o[0])) == 0, "%s: data differs", what);
    TU_CHECK(memcmp(ms[0], ms[1], dg_tensor_nbytes(&s[0])) == 0, "%s: scales differ", what);
    for (int b = 0; b < 2; ++b) {
        free(mo[b]);
        free(ms[b]);
    }
}

int main(void) {
    static const int64_t kShapes[][2] = {{1, 1}, {3, 7}, {5, 130}, {17, 300}, {130, 257}, {40, 1024}, {300, 512}, {2, 4100}, {9, 96}};
    static const int kGran[] = {128, 32, 7, 1};
    const dg_isa top = dg_get_isa();
    const int sms = dg_get_num_sms();
    tu_rng rng = {20261129};
    char what[160];
    for (int isa = DG_ISA_GENERIC; isa <= (int)top; ++isa) {
        TU_CHECK_OK(dg_set_isa((dg_isa)isa));
        for (size_t si = 0; si < sizeof kShapes / sizeof kShapes[0]; ++si)
            for (int dt = 0; dt < 2; ++dt) {
                const int64_t m = kShapes[si][0], k = kShapes[si][1];
                const dg_dtype dtype = dt ? DG_BFLOAT16 : DG_FLOAT32;
                void *mem;
                const dg_tensor x = make_x(&rng, dtype, m, k, k + (si & 1) * 3, &mem);
                TU_CHECK_OK(dg_set_num_sms(si % 3 == 1 ? 1 : sms));
                for (size_t gi = 0; gi < sizeof kGran / sizeof kGran[0]; ++gi)
                    for (int ue = 0; ue < 2; ++ue) {
                        const int g = kGran[gi];
                        snprintf(what, sizeof what, "isa %d %s m=%lld k=%lld g=%d ue8m0=%d", isa,
                                 dt ? "bf16" : "f32", (long long)m, (long long)k, g, ue);
                        compare(PER_TOKEN, &x, ue, g, 0, what);
                        if (ue) /* packed; a partial last word padded with 1.0 */
                            compare(PER_TOKEN, &x, ue, g, 1, what);
                        if (g > 1)
                            compare(PER_BLOCK, &x, ue, g, 0, what);
                        if (m % g == 0)
                            compare(PER_CHANNEL, &x, ue, g, 0, what);
                        const int64_t s = (k + g - 1) / g;
                        if (k % 2 == 0 && (s % 2 == 0 || g % 2 == 0))
                            for (int packed = 0; packed <= ue; ++packed)
                                compare(PER_TOKEN_FP4, &x, ue, g, packed, what);
                    }
                free(mem);
            }
    }
    TU_CHECK_OK(dg_set_num_sms(sms));
    TU_CHECK_OK(dg_set_isa(top));
    return tu_finish();
}
