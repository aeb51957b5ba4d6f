/*
 * test_float_math.c - the library's own float32 exp, softplus and sigmoid (core/float_math.h)
 * and the gate's scoring rows built on them (kernels/gate_kernels.h):
 *   - accuracy against double precision over a sweep of the whole float range (every 4099th
 *     bit pattern) and at the edges: exp within 1.1 ulp, softplus and sigmoid within 2.5 ulp,
 *     sqrt(softplus) within 2 ulp where softplus is a normal float, tanh within 1.5 ulp;
 *   - special values (zeros, infinities, NaN, the clamp and overflow edges);
 *   - every ISA level the CPU has: the scoring row gives dg_gate_score's bits (plus the bias),
 *     row lengths 1 .. 40 (vector tails) and the sweep, with and without a bias; a NaN result
 *     only needs to be a NaN;
 *   - the same for the Mega MoE's SwiGLU and SiTU rows against the reference's rows (clamped
 *     and not, NaN and infinite inputs, I = 1 .. 40 and a long row).
 */
#include "core/float_math.h"
#include "kernels/gate_kernels.h"
#include "kernels/moe_act_kernels.h"
#include "reference/ref_mega_moe.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* |got - want| in units of the last place of want as a float (subnormals: the smallest one);
 * a want beyond FLT_MAX counts as inf. */
static double ulp_error(float got, double want) {
    if (isnan(want))
        return isnan(got) ? 0.0 : INFINITY;
    if (fabs(want) > FLT_MAX)
        return isinf(got) && (got > 0) == (want > 0) ? 0.0 : INFINITY;
    if (isinf(got) || isnan(got))
        return INFINITY;
    int e;
    (void)frexp(want, &e);
    const double ulp = fmax(ldexp(1.0, e - 24), 0x1p-149);
    return fabs((double)got - want) / ulp;
}

static double softplus_ref(double v) { return v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)); }

static void test_accuracy(void) {
    double worst[5] = {0, 0, 0, 0, 0};
    float at[5] = {0, 0, 0, 0, 0};
    for (uint64_t b = 0; b < ((uint64_t)1 << 32); b += 4099) {
        const float x = from_bits((uint32_t)b);
        if (isnan(x))
            continue;
        const double sp = softplus_ref(x);
        const double err[5] = {
            ulp_error(dg_exp_f32(x), exp((double)x)),
            ulp_error(dg_softplus_f32(x), sp),
            x > -87.0f ? ulp_error(dg_sigmoid_f32(x), 1.0 / (1.0 + exp(-(double)x))) : 0.0,
            sp >= FLT_MIN ? ulp_error(sqrtf(dg_softplus_f32(x)), sqrt(sp)) : 0.0,
            ulp_error(dg_tanh_f32(x), tanh((double)x)),
        };
        for (int f = 0; f < 5; ++f)
            if (err[f] > worst[f])
                worst[f] = err[f], at[f] = x;
    }
    /* below -87 sigmoid's result is subnormal: absolute error within one subnormal step */
    for (float x = -104.0f; x < -87.0f; x += 0.013f)
        TU_CHECK(fabs((double)dg_sigmoid_f32(x) - 1.0 / (1.0 + exp(-(double)x))) <= 0x1p-149, "sigmoid(%a)", x);
    const double limit[5] = {1.1, 2.5, 2.5, 2.0, 1.5};
    static const char *const names[5] = {"exp", "softplus", "sigmoid", "sqrt(softplus)", "tanh"};
    for (int f = 0; f < 5; ++f)
        TU_CHECK(worst[f] <= limit[f], "%s: %.3f ulp at %a (limit %.1f)", names[f], worst[f], at[f], limit[f]);
}

static void test_special_values(void) {
    TU_CHECK(dg_exp_f32(0.0f) == 1.0f && dg_exp_f32(-0.0f) == 1.0f, "exp(+-0) = 1");
    TU_CHECK(isinf(dg_exp_f32(INFINITY)) && dg_exp_f32(INFINITY) > 0, "exp(inf) = inf");
    TU_CHECK(dg_exp_f32(-INFINITY) == 0.0f, "exp(-inf) = 0");
    TU_CHECK(isnan(dg_exp_f32(NAN)), "exp(NaN) is NaN");
    TU_CHECK(isinf(dg_exp_f32(88.73f)) && dg_exp_f32(88.72f) < INFINITY, "exp overflows past ln(FLT_MAX)");
    TU_CHECK(dg_exp_f32(-104.0f) == 0.0f && dg_exp_f32(-103.0f) > 0.0f, "exp underflows past 2^-150");
    TU_CHECK(dg_exp_f32(1.0f) == 0x1.5bf0a8p+1f, "exp(1) = e rounded: %a", dg_exp_f32(1.0f));
    TU_CHECK(dg_softplus_f32(-INFINITY) == 0.0f && isinf(dg_softplus_f32(INFINITY)), "softplus(+-inf)");
    TU_CHECK(isnan(dg_softplus_f32(NAN)) && isnan(dg_sigmoid_f32(NAN)), "NaN stays NaN");
    for (float v = 17.0f; v < 1e30f; v *= 1.37f)
        TU_CHECK(dg_softplus_f32(v) == v, "softplus(%a) = v above 17", v);
    TU_CHECK(dg_sigmoid_f32(0.0f) == 0.5f, "sigmoid(0) = 1/2");
    TU_CHECK(dg_sigmoid_f32(INFINITY) == 1.0f && dg_sigmoid_f32(-INFINITY) == 0.0f, "sigmoid(+-inf)");
    TU_CHECK(dg_sigmoid_f32(-100.0f) > 0.0f, "sigmoid keeps subnormal results");
    TU_CHECK(dg_tanh_f32(INFINITY) == 1.0f && dg_tanh_f32(-INFINITY) == -1.0f, "tanh(+-inf) = +-1");
    TU_CHECK(bits_of(dg_tanh_f32(-0.0f)) == 0x80000000u && dg_tanh_f32(0.0f) == 0.0f, "tanh keeps the zero's sign");
    TU_CHECK(isnan(dg_tanh_f32(NAN)) && dg_tanh_f32(0x1p-140f) == 0x1p-140f, "tanh(NaN), tanh(tiny) = tiny");
    TU_CHECK(dg_tanh_f32(-20.0f) == -1.0f, "tanh(-20) = -1");
}

static int same(float a, float b) { return isnan(a) ? isnan(b) : bits_of(a) == bits_of(b); }

/* The row of `isa` against the scalar scores on in[0, n). */
static int row_matches(dg_gate_score_row_fn row, dg_gate_scoring s, const float *in, const float *bias, int64_t n,
                       float *out) {
    row(s, in, bias, n, out);
    for (int64_t e = 0; e < n; ++e) {
        const float want = dg_gate_score(s, in[e]) + (bias ? bias[e] : 0.0f);
        if (!same(out[e], want)) {
            TU_CHECK(0, "scoring %d, element %lld of %lld: %a, want %a (input %a)", (int)s, (long long)e, (long long)n,
                     out[e], want, in[e]);
            return 0;
        }
    }
    return 1;
}

static void test_rows_bitwise(void) {
    enum { N = 1 << 20 };
    float *in = malloc(N * sizeof *in), *bias = malloc(N * sizeof *bias), *out = malloc((N + 16) * sizeof *out);
    TU_CHECK(in && bias && out, "allocation");
    if (!in || !bias || !out)
        goto done;
    static const float edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 89.0f, -104.0f, 88.72f, -87.33f,
                                  20.0f, 17.0f, -17.0f, 0x1p-149f, -0x1p-126f, FLT_MAX, -FLT_MAX, 1e-30f};
    tu_rng rng = {77};
    for (int64_t i = 0; i < N; ++i) {
        /* whole-range bit patterns, the gate's usual logits, and the edges */
        in[i] = i % 3 == 0   ? from_bits((uint32_t)tu_next(&rng))
                : i % 3 == 1 ? (float)(tu_normal(&rng) * 8.0)
                             : edges[i / 3 % (int64_t)(sizeof edges / sizeof edges[0])];
        bias[i] = (float)(tu_normal(&rng) * 0.1);
    }
    const dg_isa saved = dg_get_isa();
    static const dg_gate_scoring kinds[3] = {DG_GATE_IDENTITY, DG_GATE_SIGMOID, DG_GATE_SQRTSOFTPLUS};
    for (int isa = DG_ISA_GENERIC; isa <= DG_ISA_AMX; ++isa) {
        if (dg_set_isa((dg_isa)isa) != DG_OK)
            continue;
        const dg_gate_score_row_fn row = dg_gate_score_row_for((dg_isa)isa);
        int ok = 1;
        for (int k = 0; k < 3 && ok; ++k) {
            for (int64_t n = 1; n <= 40 && ok; ++n)
                ok = row_matches(row, kinds[k], in + 3 * n, n % 2 ? bias : NULL, n, out);
            for (int b = 0; b < 2 && ok; ++b)
                ok = row_matches(row, kinds[k], in, b ? bias : NULL, N, out);
        }
        TU_CHECK(ok, "isa %s: scoring rows match dg_gate_score", dg_isa_name((dg_isa)isa));
    }
    dg_set_isa(saved);
done:
    free(in);
    free(bias);
    free(out);
}

/* The SwiGLU and SiTU rows of every level against the reference rows (h: I gates then I ups). */
static void test_swiglu_rows(void) {
    enum { LONG = 3000 };
    float *h = malloc(2 * LONG * sizeof *h), *want = malloc(LONG * sizeof *want), *got = malloc(LONG * sizeof *got);
    TU_CHECK(h && want && got, "allocation");
    if (!h || !want || !got)
        goto done;
    tu_rng rng = {91};
    static const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 100.0f, -100.0f, 1e-40f, 89.5f, -89.5f};
    for (int64_t i = 0; i < 2 * LONG; ++i)
        h[i] = i % 11 == 5 ? specials[i / 11 % (int64_t)(sizeof specials / sizeof specials[0])]
                           : (float)(tu_normal(&rng) * (i % 3 ? 4.0 : 30.0));
    const dg_isa saved = dg_get_isa();
    static const float clamps[3] = {INFINITY, 10.0f, 0.5f};
    for (int isa = DG_ISA_GENERIC; isa <= DG_ISA_AMX; ++isa) {
        if (dg_set_isa((dg_isa)isa) != DG_OK)
            continue;
        const dg_swiglu_row_fn row = dg_swiglu_row_for((dg_isa)isa);
        int bad = 0;
        for (int c = 0; c < 3 && !bad; ++c)
            for (int64_t inter = 1; inter <= 41 && !bad; ++inter) {
                const int64_t I = inter == 41 ? LONG : inter;
                dg_ref_mega_moe_swiglu(h, I, clamps[c], 0.75f, want);
                row(h, I, clamps[c], 0.75f, got);
                for (int64_t i = 0; i < I && !bad; ++i)
                    if (!same(got[i], want[i])) {
                        bad = 1;
                        TU_CHECK(0, "isa %s, clamp %g, I = %lld, element %lld: %a, want %a (gate %a, up %a)",
                                 dg_isa_name((dg_isa)isa), (double)clamps[c], (long long)I, (long long)i, got[i],
                                 want[i], h[i], h[I + i]);
                    }
            }
        TU_CHECK(!bad, "isa %s: SwiGLU rows match the reference", dg_isa_name((dg_isa)isa));
        const dg_situ_row_fn situ = dg_situ_row_for((dg_isa)isa);
        static const float betas[2][2] = {{1.0f, 1.0f}, {2.5f, 0.75f}};
        for (int c = 0; c < 2 && !bad; ++c)
            for (int64_t inter = 1; inter <= 41 && !bad; ++inter) {
                const int64_t I = inter == 41 ? LONG : inter;
                dg_ref_mega_moe_situ(h, I, betas[c][0], betas[c][1], 0.75f, want);
                situ(h, I, betas[c][0], betas[c][1], 0.75f, got);
                for (int64_t i = 0; i < I && !bad; ++i)
                    if (!same(got[i], want[i])) {
                        bad = 1;
                        TU_CHECK(0, "isa %s, SiTU betas %g %g, I = %lld, element %lld: %a, want %a",
                                 dg_isa_name((dg_isa)isa), (double)betas[c][0], (double)betas[c][1], (long long)I,
                                 (long long)i, got[i], want[i]);
                    }
            }
        TU_CHECK(!bad, "isa %s: SiTU rows match the reference", dg_isa_name((dg_isa)isa));
    }
    dg_set_isa(saved);
done:
    free(h);
    free(want);
    free(got);
}

int main(void) {
    test_special_values();
    test_accuracy();
    test_rows_bitwise();
    test_swiglu_rows();
    return tu_finish();
}
