/*
 * float_math.h - the library's own float32 exp, sigmoid, softplus and tanh (the MoE gate's
 * scores, the Mega MoE's SwiGLU and SiTU, the mHC's sigmoid and softmax; deepgemm.h).
 *
 * Why not libm: expf and log1pf give different bits in different C libraries (and versions),
 * so a result that goes through them would not be the same bits on every machine, and a scalar
 * libm call per element cannot keep up with the GEMM that feeds it. These functions are a fixed
 * sequence of IEEE-754 float32 operations (fmaf, +, -, *, /, sqrt, comparisons and exact integer
 * work on the exponent), each correctly rounded (fmaf by C11's definition, in hardware or in the
 * C library; float arithmetic in float precision: FLT_EVAL_METHOD 0, as on x86-64 and ARM64,
 * not x87), so the scalar versions below and the vector versions (kernels/<isa>/float_math_*.h,
 * written op for op after them) give the same bits on every CPU. Accuracy (tests/test_float_math.c,
 * against double precision on every 4099th float of the whole range): exp within 1.1 ulp,
 * softplus and sigmoid within 2.5 ulp, the square root of softplus within 2 ulp where softplus
 * is a normal float (libm's sqrtf(log1pf(expf(v))) on the same sweep: 1.3 ulp), tanh within
 * 1.5 ulp (glibc's tanhf: 2.2).
 *
 * Scalar helpers mirror the vector instructions' rules: dg_fm_max(a, b) is "a > b ? a : b" and
 * dg_fm_min(a, b) is "a < b ? a : b" (MAXPS / MINPS: the second operand when either is NaN).
 * Compile users with -ffp-contract=off, or rely on these functions naming every fused
 * multiply-add: a product and a sum written apart must not be fused by the compiler.
 */
#ifndef DG_CORE_FLOAT_MATH_H
#define DG_CORE_FLOAT_MATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD > 0
#error "float_math.h needs float arithmetic in float precision (FLT_EVAL_METHOD 0; x87: -mfpmath=sse)"
#endif

/* exp: x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite: ln2 in a high and a low part), e^r by its
 * Taylor polynomial to degree 7 (truncation below 2^-27 of the result), times 2^n applied in
 * two exact halves so that subnormal results round once and overflow gives inf. */
#define DG_FM_LOG2E 0x1.715476p+0f
#define DG_FM_LN2_HI 0x1.62e430p-1f
#define DG_FM_LN2_LO (-0x1.05c610p-29f)
#define DG_FM_ROUND 0x1.8p23f /* adding it rounds |v| < 2^22 to an integer in the low bits */
#define DG_FM_EXP_LO (-104.0f) /* below: e^x < 2^-150, rounds to 0 */
#define DG_FM_EXP_HI 89.0f     /* above: e^x overflows */
static const float dg_fm_exp_poly[6] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f,
                                         1.0f / 24.0f,   1.0f / 6.0f,   0.5f}; /* 1/k!, k = 7 .. 2 */

/* log1p(u) for u in [0, 1] as 2 atanh(s), s = u / (2 + u) in [0, 1/3]: 2s (1 + s^2/3 + ... +
 * s^14/15) (the next term is below 2^-28 of the sum). */
static const float dg_fm_atanh_poly[7] = {1.0f / 15.0f, 1.0f / 13.0f, 1.0f / 11.0f, 1.0f / 9.0f,
                                           1.0f / 7.0f,  1.0f / 5.0f,  1.0f / 3.0f};

#define DG_FM_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Horner's rule, coefficients highest degree first: c[0] x^(n-1) + ... + c[n-1], one fmaf per
 * step (the vector headers have the same loop). */
static inline float dg_fm_horner(float x, const float *c, int n) {
    float q = c[0];
    for (int i = 1; i < n; ++i)
        q = fmaf(q, x, c[i]);
    return q;
}

static inline float dg_fm_max(float a, float b) { return a > b ? a : b; }
static inline float dg_fm_min(float a, float b) { return a < b ? a : b; }

static inline float dg_fm_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 2^k for k in [-126, 127], exactly. */
static inline float dg_fm_pow2(int32_t k) { return dg_fm_from_bits((uint32_t)(k + 127) << 23); }

static inline float dg_exp_f32(float x) {
    const float xc = dg_fm_min(DG_FM_EXP_HI, dg_fm_max(DG_FM_EXP_LO, x)); /* NaN stays NaN */
    const float n = fmaf(xc, DG_FM_LOG2E, DG_FM_ROUND) - DG_FM_ROUND;
    float r = fmaf(n, -DG_FM_LN2_HI, xc);
    r = fmaf(n, -DG_FM_LN2_LO, r);
    const float q = dg_fm_horner(r, dg_fm_exp_poly, DG_FM_LEN(dg_fm_exp_poly));
    const float e = fmaf(q, r * r, r) + 1.0f;
    /* n in [-150, 128]: two halves in [-75, 64], each a normal power of two; the first product
     * is exact, the second rounds once. GCC and Clang shift negative ints arithmetically. */
    const int32_t ni = x == x ? (int32_t)n : 0, n1 = ni >> 1, n2 = ni - n1;
    const float y = (e * dg_fm_pow2(n1)) * dg_fm_pow2(n2);
    return x == x ? y : x;
}

/* log(1 + e^v) = max(v, 0) + log1p(e^-|v|); v for v above ~14.6 (the log1p term is below half
 * an ulp of v there), NaN for NaN. */
static inline float dg_softplus_f32(float v) {
    const float u = dg_exp_f32(-fabsf(v));
    /* d = 2 + u rounded, err its exact rounding error (|2| >= u), s = u / (d + err) to first
     * order: the rounding of d would otherwise cost about half an ulp */
    const float d = 2.0f + u, err = (2.0f - d) + u, s0 = u / d;
    const float s = fmaf(-s0, err / d, s0), w = s * s;
    const float p = dg_fm_horner(w, dg_fm_atanh_poly, DG_FM_LEN(dg_fm_atanh_poly));
    const float l = fmaf(s, w * p, s);
    return dg_fm_max(v, 0.0f) + (l + l);
}

/* tanh(x): below |x| = 0.55 its Taylor series to x^17 (the next term is below 2^-27 of the
 * result), above it 1 - 2 / (e^2|x| + 1) (the subtraction is exact down to 0.55, where
 * 2 / (e^2|x| + 1) reaches 1/2); the sign of x put back last. */
#define DG_FM_TANH_SPLIT 0.55f
static const float dg_fm_tanh_poly[8] = {6404582.0f / 10854718875.0f, -929569.0f / 638512875.0f,
                                          21844.0f / 6081075.0f,       -1382.0f / 155925.0f,
                                          62.0f / 2835.0f,             -17.0f / 315.0f,
                                          2.0f / 15.0f,                -1.0f / 3.0f}; /* x^17 .. x^3 */

static inline float dg_tanh_f32(float x) {
    const float a = fabsf(x), w = a * a;
    const float q = dg_fm_horner(w, dg_fm_tanh_poly, DG_FM_LEN(dg_fm_tanh_poly));
    const float small = fmaf(a, w * q, a);
    const float big = 1.0f - 2.0f / (dg_exp_f32(a + a) + 1.0f);
    uint32_t r, sx;
    const float m = a < DG_FM_TANH_SPLIT ? small : big;
    memcpy(&r, &m, sizeof r);
    memcpy(&sx, &x, sizeof sx);
    return dg_fm_from_bits(r | (sx & 0x80000000u));
}

/* 1 / (1 + e^-v), as t / (1 + t) with t = e^v below 0 (e^-v would overflow where the result
 * is still representable). */
static inline float dg_sigmoid_f32(float v) {
    const float t = dg_exp_f32(-fabsf(v)), d = 1.0f + t;
    return v < 0.0f ? t / d : 1.0f / d;
}

#endif /* DG_CORE_FLOAT_MATH_H */
