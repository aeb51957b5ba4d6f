/*
 * test_util.h - a tiny test harness: checks that count and report, deterministic random data,
 * an independent calc_diff, and helpers to prove that failed calls wrote nothing.
 */
#ifndef DG_TEST_UTIL_H
#define DG_TEST_UTIL_H

#include "deepgemm.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int tu_passed, tu_failed;

void tu_check_impl(int ok, const char *file, int line, const char *expr, const char *fmt, ...);
#define TU_CHECK(cond, ...) tu_check_impl(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)
/* expr must return `want`; on a mismatch prints dg_last_error(). */
#define TU_CHECK_STATUS(expr, want)                                                            \
    do {                                                                                       \
        dg_status tu_s_ = (expr);                                                              \
        tu_check_impl(tu_s_ == (want), __FILE__, __LINE__, #expr, "got %s, want %s (%s)",     \
                      dg_status_string(tu_s_), dg_status_string(want), dg_last_error());       \
    } while (0)
#define TU_CHECK_OK(expr) TU_CHECK_STATUS(expr, DG_OK)

/* Prints "N passed, N failed" and returns the process exit code. */
int tu_finish(void);

/* Deterministic random numbers (splitmix64). */
typedef struct tu_rng { uint64_t s; } tu_rng;
uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r);           /* [0, 1) */
double tu_normal(tu_rng *r);            /* mean 0, std 1 */
int64_t tu_randint(tu_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */
void tu_fill_normal(tu_rng *r, float *x, size_t n, float scale);

/* DeepGEMM's similarity measure, in double, written independently of the library's. */
double tu_calc_diff(const float *x, const float *y, size_t n);

/* A contiguous tensor with its own memory (free with tu_free). */
dg_tensor tu_alloc(dg_dtype dtype, int ndim, const int64_t *shape);
dg_tensor tu_alloc2(dg_dtype dtype, int64_t d0, int64_t d1);
dg_tensor tu_alloc3(dg_dtype dtype, int64_t d0, int64_t d1, int64_t d2);
void tu_free(dg_tensor *t);
/* Fill every byte of the tensor's span with `byte` (a sentinel). */
void tu_fill_bytes(dg_tensor *t, unsigned char byte);
/* A copy of the tensor's bytes, and a check that they are unchanged. */
void *tu_snapshot(const dg_tensor *t);
/* A FLOAT16 copy [rows, cols] (row stride ld >= cols) of the FLOAT32 w (contiguous, times scale),
 * and w rounded in place to the same values: the two then hold exactly equal weights. */
dg_tensor tu_f16_copy(float *w, int64_t rows, int64_t cols, int64_t ld, float scale);
int tu_unchanged(const dg_tensor *t, const void *snapshot);
/* Reads every element of a FLOAT32/BFLOAT16 tensor into a new float array (row-major order). */
float *tu_to_float(const dg_tensor *t);

#endif
