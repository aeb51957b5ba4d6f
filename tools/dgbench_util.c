/*
 * dgbench_util.c - buffers, clocks, random data, quantizers and calc_diff for dgbench.
 * Written against the public header only, so the tool checks the library from outside.
 */
#include "dgbench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void *bench_alloc_uninit(size_t bytes) {
    void *p = NULL;
    /* 64: a cache line and an AVX-512 register. */
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return NULL;
    return p;
}

void *bench_alloc(size_t bytes) {
    void *p = bench_alloc_uninit(bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

void bench_free(void *p) { free(p); }

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int bench_portable_inputs;

/* Irwin-Hall: four 16-bit uniforms summed as integers (exact), centred, then two products
 * (sqrt(12 / 4) / 65536, then the caller's scale): one IEEE rounding each, nothing to contract. */
static void fill_normal_portable(float *x, size_t n, uint64_t seed, float scale) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = splitmix64(&s);
        const int32_t sum = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
                            (int32_t)(r >> 48) - 2 * 65535;
        volatile float unit = (float)sum * (1.7320508f / 65536.0f); /* volatile: no fused multiply */
        x[i] = unit * scale;
    }
}

void bench_fill_normal(float *x, size_t n, uint64_t seed, float scale) {
    if (bench_portable_inputs) {
        fill_normal_portable(x, n, seed, scale);
        return;
    }
    uint64_t s = seed;
    /* Box-Muller on two 53-bit uniforms; (0, 1] avoids log(0). */
    for (size_t i = 0; i < n; i += 2) {
        const double u1 = ((double)(splitmix64(&s) >> 11) + 1.0) * 0x1.0p-53;
        const double u2 = (double)(splitmix64(&s) >> 11) * 0x1.0p-53;
        const double r = sqrt(-2.0 * log(u1)), t = 6.283185307179586 * u2;
        x[i] = (float)(r * cos(t)) * scale;
        if (i + 1 < n)
            x[i + 1] = (float)(r * sin(t)) * scale;
    }
}

dg_tensor bench_tensor2(dg_dtype dtype, int64_t d0, int64_t d1) {
    dg_tensor t = dg_tensor_2d(NULL, dtype, d0, d1);
    t.data = bench_alloc(dg_tensor_nbytes(&t));
    return t;
}

void bench_tensor_free(dg_tensor *t) {
    bench_free(t->data);
    t->data = NULL;
}

void bench_to_bf16(const float *x, uint16_t *y, size_t n) {
    for (size_t i = 0; i < n; ++i)
        y[i] = dg_float_to_bf16(x[i]);
}

/* amax clamped below at 1e-4, divided by the format's largest value, optionally rounded up
 * to a power of two (SPEC 2). */
static float group_scale(float amax, float fmt_max, int ue8m0) {
    const float sf = fmaxf(amax, 1e-4f) / fmt_max;
    return ue8m0 ? dg_ceil_to_ue8m0(sf) : sf;
}

void bench_cast_fp8_rows(const float *x, int64_t rows, int64_t cols, int gran_k, int ue8m0,
                         uint8_t *q, float *sf) {
    const int64_t groups = (cols + gran_k - 1) / gran_k;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t k0 = g * gran_k, k1 = k0 + gran_k < cols ? k0 + gran_k : cols;
            float amax = 0;
            for (int64_t k = k0; k < k1; ++k)
                amax = fmaxf(amax, fabsf(x[r * cols + k]));
            const float s = group_scale(amax, 448.0f, ue8m0), inv = 1.0f / s;
            sf[r * groups + g] = s;
            for (int64_t k = k0; k < k1; ++k)
                q[r * cols + k] = dg_float_to_e4m3(x[r * cols + k] * inv);
        }
}

void bench_cast_fp8_block(const float *x, int64_t rows, int64_t cols, int gran, int ue8m0,
                          uint8_t *q, float *sf) {
    const int64_t gr = (rows + gran - 1) / gran, gc = (cols + gran - 1) / gran;
    for (int64_t bi = 0; bi < gr; ++bi)
        for (int64_t bj = 0; bj < gc; ++bj) {
            const int64_t r0 = bi * gran, r1 = r0 + gran < rows ? r0 + gran : rows;
            const int64_t c0 = bj * gran, c1 = c0 + gran < cols ? c0 + gran : cols;
            float amax = 0;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t c = c0; c < c1; ++c)
                    amax = fmaxf(amax, fabsf(x[r * cols + c]));
            const float s = group_scale(amax, 448.0f, ue8m0), inv = 1.0f / s;
            sf[bi * gc + bj] = s;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t c = c0; c < c1; ++c)
                    q[r * cols + c] = dg_float_to_e4m3(x[r * cols + c] * inv);
        }
}

void bench_cast_fp4_rows(const float *x, int64_t rows, int64_t cols, int gran_k, int ue8m0,
                         uint8_t *q, float *sf) {
    const int64_t groups = (cols + gran_k - 1) / gran_k;
    memset(q, 0, (size_t)(rows * (cols / 2)));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t k0 = g * gran_k, k1 = k0 + gran_k < cols ? k0 + gran_k : cols;
            float amax = 0;
            for (int64_t k = k0; k < k1; ++k)
                amax = fmaxf(amax, fabsf(x[r * cols + k]));
            const float s = group_scale(amax, 6.0f, ue8m0), inv = 1.0f / s;
            sf[r * groups + g] = s;
            for (int64_t k = k0; k < k1; ++k) {
                const uint8_t code = dg_float_to_e2m1(x[r * cols + k] * inv) & 0xf;
                q[r * (cols / 2) + k / 2] |= (uint8_t)(k % 2 ? code << 4 : code);
            }
        }
}

dg_tensor *bench_pool_new(bench_pool *p, dg_dtype dtype, int ndim, const int64_t *shape) {
    static dg_tensor dummy;
    if (p->n >= BENCH_POOL_MAX) {
        p->failed = 1;
        dummy = dg_tensor_make(NULL, dtype, ndim, shape);
        return &dummy;
    }
    dg_tensor *t = &p->t[p->n++];
    *t = dg_tensor_make(NULL, dtype, ndim, shape);
    t->data = bench_alloc(dg_tensor_nbytes(t));
    if (!t->data)
        p->failed = 1;
    return t;
}

void bench_pool_state_free(void *state) {
    bench_pool *p = state;
    if (!p)
        return;
    for (int i = 0; i < p->n; ++i)
        bench_free(p->t[i].data);
    bench_free(p);
}

void bench_fill(dg_tensor *t, uint64_t seed, float scale) {
    const size_t n = (size_t)dg_tensor_numel(t);
    if (t->dtype == DG_FP4_E2M1X2 || t->dtype == DG_UINT8 || t->dtype == DG_INT8) {
        uint64_t s = seed;
        for (size_t i = 0; i < n; ++i) /* any two E2M1 codes make a valid byte */
            ((uint8_t *)t->data)[i] = (uint8_t)splitmix64(&s);
        return;
    }
    float *x = bench_alloc_uninit(n * sizeof(float));
    if (!x)
        return;
    bench_fill_normal(x, n, seed, scale);
    for (size_t i = 0; i < n; ++i) {
        if (t->dtype == DG_FLOAT32)
            ((float *)t->data)[i] = x[i];
        else if (t->dtype == DG_BFLOAT16)
            ((uint16_t *)t->data)[i] = dg_float_to_bf16(x[i]);
        else if (t->dtype == DG_FLOAT8_E4M3)
            ((uint8_t *)t->data)[i] = dg_float_to_e4m3(x[i]);
    }
    bench_free(x);
}

void bench_fill_uniform(dg_tensor *t, uint64_t seed, float lo, float hi) {
    uint64_t s = seed;
    const size_t n = (size_t)dg_tensor_numel(t);
    if (bench_portable_inputs) { /* 24-bit uniforms (exact in float), the product kept apart from the sum */
        for (size_t i = 0; i < n; ++i) {
            volatile float span = (hi - lo) * ((float)(splitmix64(&s) >> 40) * 0x1.0p-24f);
            ((float *)t->data)[i] = lo + span;
        }
        return;
    }
    for (size_t i = 0; i < n; ++i)
        ((float *)t->data)[i] = lo + (hi - lo) * (float)((double)(splitmix64(&s) >> 11) * 0x1.0p-53);
}

int64_t bench_jitter(int64_t x, uint64_t *s) {
    const uint64_t r = splitmix64(s);
    if (bench_portable_inputs) /* x * (70 + 0..60) / 100 in integers */
        return x * (int64_t)(70 + (r >> 11) % 61) / 100;
    return (int64_t)((double)x * (0.7 + 0.6 * ((double)(r >> 11) / 9007199254740992.0)));
}

int bench_can_read_float(dg_dtype dtype) {
    return dtype == DG_FLOAT32 || dtype == DG_BFLOAT16 || dtype == DG_FLOAT8_E4M3;
}

/* Row-major walk over any strides; `idx` holds the current multi-index. */
int bench_read_float(const dg_tensor *t, float *out) {
    if (!bench_can_read_float(t->dtype))
        return -1;
    const int64_t n = dg_tensor_numel(t);
    int64_t idx[DG_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; ++i) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; ++d)
            off += idx[d] * t->strides[d];
        out[i] = t->dtype == DG_FLOAT32    ? ((const float *)t->data)[off]
                 : t->dtype == DG_BFLOAT16 ? dg_bf16_to_float(((const uint16_t *)t->data)[off])
                                           : dg_e4m3_to_float(((const uint8_t *)t->data)[off]);
        for (int d = t->ndim - 1; d >= 0; --d) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return 0;
}

double bench_calc_diff(const float *x, const float *y, size_t n) {
    double xy = 0, sq = 0;
    for (size_t i = 0; i < n; ++i) {
        xy += (double)x[i] * y[i];
        sq += (double)x[i] * x[i] + (double)y[i] * y[i];
    }
    return sq == 0 ? 0.0 : 1.0 - 2.0 * xy / sq;
}
