/*
 * test_gemm_grouped_common.h - shared by the grouped GEMM test programs: quantized operands built
 * by the test itself (its own scale computation and indexing), so that the expected results are
 * independent of the library's operand access code.
 *
 * A "tq" holds a [G, R, K] matrix (G = 1 and 2-D tensors when not grouped): the original values
 * (BF16-representable floats, as DeepGEMM's generators make them), the raw codes, the scales the
 * test chose, the dequantized values in double, and the library-facing tensors.
 */
#ifndef TEST_GEMM_GROUPED_COMMON_H
#define TEST_GEMM_GROUPED_COMMON_H

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum tq_kind {
    TQ_BF16,        /* no scales */
    TQ_FP8_F32,     /* E4M3, float32 scales per (gran_mn x gran_k) block */
    TQ_FP8_UE8M0,   /* E4M3, power-of-two scales per (1 x gran_k), packed into int32 */
    TQ_FP4_UE8M0    /* packed E2M1, power-of-two scales per (1 x gran_k), packed into int32 */
} tq_kind;

typedef struct tq {
    tq_kind kind;
    int grouped;
    int64_t G, R, K;
    int gran_mn, gran_k;
    float *orig;    /* [G*R*K] */
    double *deq;    /* [G*R*K] */
    uint8_t *code;  /* [G*R*K] E4M3 byte or E2M1 code (BF16: unused) */
    dg_tensor data; /* [G?, R, K] (packed FP4: [G?, R, K/2]) */
    dg_tensor sf;   /* float32 [G?, ceil(R/gmn), ceil(K/gk)] or int32 [G?, R, ceil(K/(4gk))] */
} tq;

static inline int64_t tq_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t tq_align(int64_t a, int64_t b) { return tq_cdiv(a, b) * b; }

static inline float tq_round_bf16(float x) { return dg_bf16_to_float(dg_float_to_bf16(x)); }

/* The exponent byte of a power-of-two float, read from its bits. */
static inline uint8_t tq_pow2_byte(float s) {
    uint32_t u;
    memcpy(&u, &s, 4);
    return (uint8_t)(u >> 23);
}

static inline dg_tensor tq_alloc_nd(dg_dtype dt, int grouped, int64_t g, int64_t r, int64_t c) {
    return grouped ? tu_alloc3(dt, g, r, c) : tu_alloc2(dt, r, c);
}

/* Quantizes one (gran_mn x gran_k) block of group g with the recipe's scale rule. */
static inline void tq_block(tq *q, int64_t g, int64_t r0, int64_t k0) {
    const int64_t r1 = r0 + q->gran_mn < q->R ? r0 + q->gran_mn : q->R;
    const int64_t k1 = k0 + q->gran_k < q->K ? k0 + q->gran_k : q->K;
    float amax = 1e-4f;
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = k0; k < k1; ++k)
            amax = fmaxf(amax, fabsf(q->orig[(g * q->R + r) * q->K + k]));
    const int fp4 = q->kind == TQ_FP4_UE8M0;
    float s = amax / (fp4 ? 6.0f : 448.0f);
    if (q->kind != TQ_FP8_F32)
        s = dg_ceil_to_ue8m0(s);
    const float inv = 1.0f / s;
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = k0; k < k1; ++k) {
            const int64_t e = (g * q->R + r) * q->K + k;
            const float x = q->orig[e] * inv;
            q->code[e] = fp4 ? dg_float_to_e2m1(x) : dg_float_to_e4m3(x);
            q->deq[e] = (double)(fp4 ? dg_e2m1_to_float(q->code[e]) : dg_e4m3_to_float(q->code[e])) * (double)s;
        }
    const int64_t kb = k0 / q->gran_k;
    if (q->kind == TQ_FP8_F32) {
        const int64_t nr = tq_cdiv(q->R, q->gran_mn), nk = tq_cdiv(q->K, q->gran_k);
        ((float *)q->sf.data)[(g * nr + r0 / q->gran_mn) * nk + kb] = s;
    } else {
        const int64_t nw = tq_cdiv(q->K, 4 * (int64_t)q->gran_k);
        uint8_t *bytes = (uint8_t *)q->sf.data; /* little-endian int32 words */
        bytes[((g * q->R + r0) * nw + kb / 4) * 4 + kb % 4] = tq_pow2_byte(s);
    }
}

/* Writes the codes / BF16 values into q->data. */
static inline void tq_store(tq *q) {
    const int64_t n = q->G * q->R * q->K;
    for (int64_t e = 0; e < n; ++e) {
        if (q->kind == TQ_BF16)
            ((uint16_t *)q->data.data)[e] = dg_float_to_bf16(q->orig[e]);
        else if (q->kind == TQ_FP8_F32 || q->kind == TQ_FP8_UE8M0)
            ((uint8_t *)q->data.data)[e] = q->code[e];
        else {
            uint8_t *p = (uint8_t *)q->data.data + e / 2;
            *p = (e & 1) ? (uint8_t)((*p & 0x0f) | (q->code[e] << 4)) : (uint8_t)((*p & 0xf0) | q->code[e]);
        }
    }
}

/* A random [G?, R, K] operand, values ~ N(0, 1) rounded to BF16 (K even for FP4). */
static inline tq tq_make(tu_rng *rng, tq_kind kind, int grouped, int64_t G, int64_t R, int64_t K, int gran_mn,
                         int gran_k) {
    tq q;
    memset(&q, 0, sizeof q);
    q.kind = kind;
    q.grouped = grouped;
    q.G = grouped ? G : 1;
    q.R = R;
    q.K = K;
    q.gran_mn = kind == TQ_FP8_F32 ? gran_mn : 1;
    q.gran_k = gran_k;
    const int64_t n = q.G * R * K;
    q.orig = malloc((size_t)(n ? n : 1) * sizeof(float));
    q.deq = malloc((size_t)(n ? n : 1) * sizeof(double));
    q.code = calloc((size_t)(n ? n : 1), 1);
    for (int64_t e = 0; e < n; ++e)
        q.orig[e] = tq_round_bf16((float)tu_normal(rng));
    if (kind == TQ_BF16) {
        q.data = tq_alloc_nd(DG_BFLOAT16, grouped, q.G, R, K);
        for (int64_t e = 0; e < n; ++e)
            q.deq[e] = q.orig[e];
    } else {
        q.data = tq_alloc_nd(kind == TQ_FP4_UE8M0 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, grouped, q.G, R,
                             kind == TQ_FP4_UE8M0 ? K / 2 : K);
        if (kind == TQ_FP8_F32)
            q.sf = tq_alloc_nd(DG_FLOAT32, grouped, q.G, tq_cdiv(R, q.gran_mn), tq_cdiv(K, gran_k));
        else
            q.sf = tq_alloc_nd(DG_INT32, grouped, q.G, R, tq_cdiv(K, 4 * (int64_t)gran_k));
        for (int64_t g = 0; g < q.G; ++g)
            for (int64_t r = 0; r < R; r += q.gran_mn)
                for (int64_t k = 0; k < K; k += gran_k)
                    tq_block(&q, g, r, k);
    }
    tq_store(&q);
    return q;
}

/* Overwrites row r of group g (data and, for per-row scales, its scales) with NaN garbage. */
static inline void tq_poison_row(tq *q, int64_t g, int64_t r) {
    const int64_t rk = q->kind == TQ_FP4_UE8M0 ? q->K / 2 : q->K;
    const size_t es = dg_dtype_size(q->data.dtype);
    memset((char *)q->data.data + (size_t)((g * q->R + r) * rk) * es, q->kind == TQ_BF16 ? 0xff : 0x7f,
           (size_t)rk * es);
    if (q->kind == TQ_FP8_UE8M0 || q->kind == TQ_FP4_UE8M0) {
        const int64_t nw = q->sf.shape[q->sf.ndim - 1];
        memset((int32_t *)q->sf.data + (g * q->R + r) * nw, 0xff, (size_t)nw * 4);
    } else if (q->kind == TQ_FP8_F32 && q->gran_mn == 1) {
        const int64_t nk = q->sf.shape[q->sf.ndim - 1];
        for (int64_t j = 0; j < nk; ++j)
            ((float *)q->sf.data)[(g * q->R + r) * nk + j] = NAN;
    }
}

static inline void tq_free(tq *q) {
    free(q->orig);
    free(q->deq);
    free(q->code);
    tu_free(&q->data);
    if (q->sf.data)
        tu_free(&q->sf);
}

static inline const dg_tensor *tq_sf(const tq *q) { return q->kind == TQ_BF16 ? NULL : &q->sf; }

/* sum_k x[k] * y[k] in double, increasing k: the same order as the reference. */
static inline double tq_dot(const double *x, const double *y, int64_t k) {
    double acc = 0.0;
    for (int64_t i = 0; i < k; ++i)
        acc += x[i] * y[i];
    return acc;
}

/* One D element as the library must store it (rounded once via float, as dg_store_float). */
static inline int tq_same_as_stored(const dg_tensor *d, const void *p, double v) {
    if (d->dtype == DG_FLOAT32)
        return *(const float *)p == (float)v || (isnan(*(const float *)p) && isnan(v));
    return *(const uint16_t *)p == dg_float_to_bf16((float)v);
}

#endif /* TEST_GEMM_GROUPED_COMMON_H */
