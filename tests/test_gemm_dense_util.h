/*
 * test_gemm_dense_util.h - test-side GEMM operands for the dense GEMM tests, written
 * independently of the library: logical codes and scales are drawn at random, dequantized
 * with the scalar format functions and this file's own scale indexing, and then laid out in
 * memory (K- or MN-major, padded strides, FP4 nibble packing, float or packed UE8M0 scales in
 * row- or MN-major order). `val` is what the GEMM must see.
 */
#ifndef TEST_GEMM_DENSE_UTIL_H
#define TEST_GEMM_DENSE_UTIL_H

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct top {
    int64_t mn, k;          /* logical [mn, k] */
    dg_dtype dt;            /* DG_BFLOAT16, DG_FLOAT8_E4M3 or DG_FP4_E2M1X2 */
    int mn_major;           /* physical data layout */
    int gran_mn, gran_k;    /* scale granularity (scaled dtypes) */
    int packed, sf_mn_major;
    float *val;             /* [mn * k] dequantized values */
    void *mem, *sfmem;
    dg_tensor t, sf;        /* the operand as DeepGEMM's `_nt` takes it: [mn, k] views */
} top;

static inline int64_t tg_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Can an operand of this dtype be laid out this way? (FP4 pairs need an even extent.) */
static inline int top_layout_ok(dg_dtype dt, int64_t mn, int64_t k, int mn_major) {
    if (dt != DG_FP4_E2M1X2)
        return 1;
    return mn_major ? mn % 2 == 0 : k % 2 == 0;
}

/* A random raw code and its value: BF16 bits, an E4M3 byte (never NaN) or an E2M1 nibble. */
static inline float top_draw(tu_rng *r, dg_dtype dt, uint32_t *code) {
    if (dt == DG_BFLOAT16) {
        *code = dg_float_to_bf16((float)tu_normal(r));
        return dg_bf16_to_float((uint16_t)*code);
    }
    if (dt == DG_FLOAT8_E4M3) {
        uint8_t b;
        do
            b = (uint8_t)tu_next(r);
        while ((b & 0x7f) == 0x7f);
        *code = b;
        return dg_e4m3_to_float(b);
    }
    *code = (uint32_t)(tu_next(r) & 15);
    return dg_e2m1_to_float((uint8_t)*code);
}

/* Builds a random operand. gran_mn/gran_k/packed are ignored for BF16. */
static inline top top_make(tu_rng *r, dg_dtype dt, int64_t mn, int64_t k, int mn_major, int gran_mn,
                           int gran_k, int packed, int sf_mn_major) {
    top o;
    memset(&o, 0, sizeof o);
    o.mn = mn, o.k = k, o.dt = dt, o.mn_major = mn_major;
    o.gran_mn = gran_mn, o.gran_k = gran_k, o.packed = packed, o.sf_mn_major = sf_mn_major;
    const int scaled = dt != DG_BFLOAT16;
    const int64_t sm = scaled ? tg_cdiv(mn, gran_mn) : 0, sk = scaled ? tg_cdiv(k, gran_k) : 0;

    /* Scale values per block: UE8M0 exponents for packed (1: as INT32 words, 2: as the float32
     * powers of two), arbitrary floats otherwise. */
    float *sval = malloc((size_t)(sm * sk + 1) * sizeof(float));
    uint8_t *sexp = malloc((size_t)(sm * sk + 1));
    for (int64_t i = 0; i < sm * sk; ++i) {
        sexp[i] = (uint8_t)tu_randint(r, 118, 134);
        sval[i] = packed ? ldexpf(1.0f, sexp[i] - 127) : (float)(0.25 + tu_uniform(r)) * ldexpf(1.0f, (int)tu_randint(r, -3, 3));
    }

    /* Logical codes and values. */
    uint32_t *code = malloc((size_t)(mn * k + 1) * sizeof(uint32_t));
    o.val = malloc((size_t)(mn * k + 1) * sizeof(float));
    for (int64_t i = 0; i < mn; ++i)
        for (int64_t kk = 0; kk < k; ++kk) {
            float v = top_draw(r, dt, &code[i * k + kk]);
            if (scaled)
                v = v * sval[(i / gran_mn) * sk + kk / gran_k];
            o.val[i * k + kk] = v;
        }

    /* Physical data with padded leading strides. */
    const size_t es = dg_dtype_size(dt);
    const int fp4 = dt == DG_FP4_E2M1X2;
    const int64_t pmn = (fp4 && mn_major) ? mn / 2 : mn, pk = (fp4 && !mn_major) ? k / 2 : k;
    const int64_t ld = (mn_major ? pmn : pk) + 3;
    const int64_t outer = mn_major ? k : mn;
    o.mem = calloc((size_t)(ld * outer + 1), es);
    memset(o.mem, 0xA5, (size_t)(ld * outer) * es); /* padding bytes are garbage on purpose */
    o.t = dg_tensor_2d(o.mem, dt, pmn, pk);
    o.t.strides[0] = mn_major ? 1 : ld;
    o.t.strides[1] = mn_major ? ld : 1;
    for (int64_t i = 0; i < mn; ++i)
        for (int64_t kk = 0; kk < k; ++kk) {
            const uint32_t c = code[i * k + kk];
            if (dt == DG_BFLOAT16) {
                ((uint16_t *)o.mem)[mn_major ? kk * ld + i : i * ld + kk] = (uint16_t)c;
            } else if (!fp4) {
                ((uint8_t *)o.mem)[mn_major ? kk * ld + i : i * ld + kk] = (uint8_t)c;
            } else {
                const int64_t byte = mn_major ? kk * ld + i / 2 : i * ld + kk / 2;
                const int hi = mn_major ? (int)(i & 1) : (int)(kk & 1);
                uint8_t *p = (uint8_t *)o.mem + byte;
                *p = hi ? (uint8_t)((*p & 0x0f) | (c << 4)) : (uint8_t)((*p & 0xf0) | c);
            }
        }

    /* Physical scales: float [sm, sk] or packed int32 [sm, ceil(sk / 4)], row- or MN-major. */
    if (scaled) {
        const int words = packed == 1;
        const int64_t cols = words ? tg_cdiv(sk, 4) : sk;
        const int64_t lds = sf_mn_major ? (sm + 3) / 4 * 4 : cols; /* 16-byte aligned MN extent */
        const int64_t outer_s = sf_mn_major ? cols : sm;
        o.sfmem = calloc((size_t)(lds * outer_s + 1), 4);
        o.sf = dg_tensor_2d(o.sfmem, words ? DG_INT32 : DG_FLOAT32, sm, cols);
        o.sf.strides[0] = sf_mn_major ? 1 : lds;
        o.sf.strides[1] = sf_mn_major ? lds : 1;
        for (int64_t i = 0; i < sm; ++i)
            for (int64_t q = 0; q < cols; ++q) {
                const int64_t at = sf_mn_major ? q * lds + i : i * lds + q;
                if (!words) {
                    ((float *)o.sfmem)[at] = sval[i * sk + q];
                    continue;
                }
                uint32_t w = 0;
                for (int j = 0; j < 4; ++j) {
                    const int64_t s = 4 * q + j;
                    const uint32_t e = s < sk ? sexp[i * sk + s] : (uint32_t)(tu_next(r) & 0xff);
                    w |= e << (8 * j);
                }
                ((uint32_t *)o.sfmem)[at] = w;
            }
    }
    free(sval);
    free(sexp);
    free(code);
    return o;
}

static inline void top_free(top *o) {
    free(o->val);
    free(o->mem);
    free(o->sfmem);
    memset(o, 0, sizeof *o);
}

/* An output-shaped FLOAT32/BF16 [m, n] matrix with row stride n + pad, filled with random
 * values (as DeepGEMM's accumulate tests do) or the byte pattern 0x7b. */
static inline dg_tensor tg_out(tu_rng *r, dg_dtype dt, int64_t m, int64_t n, int64_t pad, int random) {
    const int64_t ld = n + pad;
    const size_t es = dg_dtype_size(dt);
    void *mem = malloc((size_t)(m * ld + 1) * es);
    memset(mem, 0x7b, (size_t)(m * ld + 1) * es);
    dg_tensor t = dg_tensor_2d(mem, dt, m, n);
    t.strides[0] = ld;
    if (random)
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                const float v = (float)tu_normal(r) * 8.0f;
                if (dt == DG_FLOAT32)
                    ((float *)mem)[i * ld + j] = v;
                else
                    ((uint16_t *)mem)[i * ld + j] = dg_float_to_bf16(v);
            }
    return t;
}

static inline float tg_get(const dg_tensor *t, int64_t i, int64_t j) {
    const int64_t at = i * t->strides[0] + j * t->strides[1];
    return t->dtype == DG_FLOAT32 ? ((const float *)t->data)[at] : dg_bf16_to_float(((const uint16_t *)t->data)[at]);
}

/* Bits of element (i, j) of a FLOAT32/BF16 matrix. */
static inline uint32_t tg_bits(const dg_tensor *t, int64_t i, int64_t j) {
    const int64_t at = i * t->strides[0] + j * t->strides[1];
    if (t->dtype == DG_FLOAT32) {
        uint32_t u;
        memcpy(&u, (const float *)t->data + at, 4);
        return u;
    }
    return ((const uint16_t *)t->data)[at];
}

/* The naive formula: round(C + sum_k a*b) for one element, k ascending in double. */
static inline uint32_t tg_expect(const top *a, int64_t m, const top *b, int64_t n, double c, dg_dtype out) {
    double acc = c;
    for (int64_t kk = 0; kk < a->k; ++kk)
        acc += (double)a->val[m * a->k + kk] * (double)b->val[n * b->k + kk];
    const float f = (float)acc;
    if (out == DG_BFLOAT16)
        return dg_float_to_bf16(f);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#endif
