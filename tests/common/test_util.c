/* test_util.c - see test_util.h. */
#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int tu_passed, tu_failed;

void tu_check_impl(int ok, const char *file, int line, const char *expr, const char *fmt, ...) {
    if (ok) {
        ++tu_passed;
        return;
    }
    ++tu_failed;
    fprintf(stderr, "FAIL %s:%d: %s: ", file, line, expr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int tu_finish(void) {
    printf("%d passed, %d failed\n", tu_passed, tu_failed);
    if (tu_passed + tu_failed == 0) {
        fprintf(stderr, "no checks ran\n");
        return 1;
    }
    return tu_failed ? 1 : 0;
}

uint64_t tu_next(tu_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1p-53; }

double tu_normal(tu_rng *r) {
    double u1 = tu_uniform(r), u2 = tu_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t tu_randint(tu_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_next(r) % (uint64_t)(hi - lo + 1));
}

void tu_fill_normal(tu_rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)tu_normal(r) * scale;
}

double tu_calc_diff(const float *x, const float *y, size_t n) {
    double xy = 0, xx_yy = 0;
    for (size_t i = 0; i < n; ++i) {
        xy += (double)x[i] * y[i];
        xx_yy += (double)x[i] * x[i] + (double)y[i] * y[i];
    }
    if (xx_yy == 0)
        return 0;
    return 1.0 - 2.0 * xy / xx_yy;
}

dg_tensor tu_alloc(dg_dtype dtype, int ndim, const int64_t *shape) {
    dg_tensor t = dg_tensor_make(NULL, dtype, ndim, shape);
    size_t bytes = dg_dtype_size(dtype);
    for (int i = 0; i < ndim; ++i)
        bytes *= (size_t)shape[i];
    t.data = calloc(bytes ? bytes : 1, 1);
    return t;
}

dg_tensor tu_alloc2(dg_dtype dtype, int64_t d0, int64_t d1) {
    const int64_t s[2] = {d0, d1};
    return tu_alloc(dtype, 2, s);
}

dg_tensor tu_alloc3(dg_dtype dtype, int64_t d0, int64_t d1, int64_t d2) {
    const int64_t s[3] = {d0, d1, d2};
    return tu_alloc(dtype, 3, s);
}

void tu_free(dg_tensor *t) {
    free(t->data);
    t->data = NULL;
}

void tu_fill_bytes(dg_tensor *t, unsigned char byte) { memset(t->data, byte, dg_tensor_nbytes(t)); }

dg_tensor tu_f16_copy(float *w, int64_t rows, int64_t cols, int64_t ld, float scale) {
    dg_tensor t = tu_alloc2(DG_FLOAT16, rows, ld);
    t.shape[1] = cols;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            uint16_t *h = (uint16_t *)t.data + i * ld + j;
            *h = dg_float_to_f16(w[i * cols + j] * scale);
            w[i * cols + j] = dg_f16_to_float(*h);
        }
    return t;
}

void *tu_snapshot(const dg_tensor *t) {
    const size_t n = dg_tensor_nbytes(t);
    void *p = malloc(n ? n : 1);
    if (n)
        memcpy(p, t->data, n);
    return p;
}

int tu_unchanged(const dg_tensor *t, const void *snapshot) {
    return memcmp(t->data, snapshot, dg_tensor_nbytes(t)) == 0;
}

float *tu_to_float(const dg_tensor *t) {
    const int64_t n = dg_tensor_numel(t);
    float *out = malloc((size_t)(n ? n : 1) * sizeof(float));
    int64_t idx[DG_MAX_DIMS] = {0};
    for (int64_t e = 0; e < n; ++e) {
        int64_t off = 0;
        for (int i = 0; i < t->ndim; ++i)
            off += idx[i] * t->strides[i];
        if (t->dtype == DG_FLOAT32)
            out[e] = ((const float *)t->data)[off];
        else
            out[e] = dg_bf16_to_float(((const uint16_t *)t->data)[off]);
        for (int i = t->ndim - 1; i >= 0; --i) {
            if (++idx[i] < t->shape[i])
                break;
            idx[i] = 0;
        }
    }
    return out;
}
