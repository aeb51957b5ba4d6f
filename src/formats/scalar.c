/*
 * scalar.c - the number formats of SPEC 1, one value at a time. These are the definitions the
 * rest of the library (and its vectorised conversions) must agree with bit for bit.
 */
#include "../core/internal.h"
#include "convert.h"

#include <math.h>
#include <string.h>

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t dg_float_to_bf16(float x) { return dg_round_bf16(x); }

float dg_bf16_to_float(uint16_t x) { return u2f((uint32_t)x << 16); }

/* binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits; every value is a float32. */
float dg_f16_to_float(uint16_t x) {
    const uint32_t sign = (uint32_t)(x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, f = x & 0x3ffu;
    if (e == 0) { /* zero or subnormal: f * 2^-24, exact */
        const float v = (float)f * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31) /* infinity, NaN (payload kept) */
        return u2f(sign | 0x7f800000u | f << 13);
    return u2f(sign | (e + 112) << 23 | f << 13);
}

/* Round to nearest even; beyond the largest finite 65504 (from 65520 up) to infinity, as
 * IEEE and torch's cast; NaN stays NaN (quiet, sign kept). */
uint16_t dg_float_to_f16(float x) {
    const uint32_t u = f2u(x), a = u & 0x7fffffffu;
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u)
        return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u) /* >= 65520 */
        return sign | 0x7c00u;
    if (a >= 0x38800000u) { /* >= 2^-14: a normal half; rebias, then round the 13 dropped bits */
        const uint32_t t = a - 0x38000000u;
        return sign | (uint16_t)((t + 0xfffu + ((t >> 13) & 1u)) >> 13);
    }
    /* subnormal (or zero) half: |x| * 2^24 is exact, the rounding mode is nearest even */
    return sign | (uint16_t)nearbyintf(u2f(a) * 0x1p24f);
}

/*
 * float32 -> E4M3 (float8_e4m3fn), as PyTorch 2.13 casts (checked against it bit for bit in
 * tests/python): round to nearest even; finite values beyond the largest finite 448 and
 * infinities saturate to +-448 (0x7e); NaN becomes 0x7f with the input's sign. E4M3 has
 * quantum 2^(e-3) for normal exponent e in [-6, 8] and 2^-9 below 2^-6 (subnormals). Scaling
 * by a power of two is exact for every float32, so nearbyintf in the default rounding mode
 * does the rounding.
 */
uint8_t dg_float_to_e4m3(float x) {
    const uint32_t u = f2u(x);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t mag_bits = u & 0x7fffffffu;
    if (mag_bits > 0x7f800000u)
        return sign | 0x7f;
    if (mag_bits >= 0x43e00000u) /* >= 448 (and infinity): saturate */
        return sign | 0x7e;
    const float mag = u2f(mag_bits);
    if (mag < 0x1p-6f) {
        /* Subnormal range: multiples of 2^-9; 8 * 2^-9 is the smallest normal (code 0x08). */
        const float q = nearbyintf(mag * 512.0f);
        return sign | (uint8_t)q;
    }
    int e = (int)((mag_bits >> 23) & 0xff) - 127; /* in [-6, 8] here */
    float q = nearbyintf(ldexpf(mag, 3 - e));     /* in [8, 16] */
    if (q >= 16.0f) {
        q = 8.0f;
        ++e;
    }
    return sign | (uint8_t)(((e + 7) << 3) | ((int)q - 8)); /* below 448: never the NaN code */
}

float dg_e4m3_to_float(uint8_t x) {
    const uint32_t sign = (uint32_t)(x & 0x80) << 24;
    const uint32_t exp = (x >> 3) & 15u, man = x & 7u;
    if (exp == 15 && man == 7)
        return u2f(sign | 0x7fc00000u);
    if (exp == 0)
        return u2f(sign | f2u((float)man * 0x1p-9f));
    return u2f(sign | ((exp - 7 + 127) << 23) | (man << 20));
}

/* DeepGEMM's rule: count the midpoints |x| lies strictly above; -0 and NaN give +0. */
uint8_t dg_float_to_e2m1(float x) {
    static const float kMidpoints[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const float ax = fabsf(x);
    uint8_t code = 0;
    for (int i = 0; i < 7; ++i)
        code += ax > kMidpoints[i];
    if (x < 0 && code != 0)
        code |= 8;
    return code;
}

float dg_e2m1_to_float(uint8_t code) {
    static const float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return kValues[code & 15];
}

float dg_ceil_to_ue8m0(float x) {
    const uint32_t u = f2u(x) & 0x7fffffffu;
    int exp = (int)(u >> 23) + ((u & 0x7fffffu) != 0);
    exp = exp < 1 ? 1 : (exp > 254 ? 254 : exp);
    return u2f((uint32_t)exp << 23);
}

uint8_t dg_float_to_ue8m0(float x) { return (uint8_t)(f2u(dg_ceil_to_ue8m0(x)) >> 23); }

float dg_ue8m0_to_float(uint8_t e) {
    /* 2^(e-127): e = 0 is the float32 subnormal 2^-127, e = 255 overflows to infinity. */
    return e == 0 ? u2f(0x00400000u) : u2f((uint32_t)e << 23);
}
