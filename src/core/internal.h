/*
 * internal.h - what every part of the library shares: error reporting, argument checks,
 * settings, threads. Nothing here is public; the public API is include/deepgemm.h.
 */
#ifndef DG_CORE_INTERNAL_H
#define DG_CORE_INTERNAL_H

#include "deepgemm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors (runtime/error.c) ------------------------------------------------------------ */

/* Every public entry point starts with dg_api_begin(name): it clears this thread's message and
 * names the function for the messages that follow. */
void dg_api_begin(const char *api_name);
/* Records "api_name: <message>" for this thread and returns `status`. */
dg_status dg_fail(dg_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Early-return helpers for functions that return dg_status. */
#define DG_TRY(expr)                    \
    do {                                \
        dg_status dg_try_s_ = (expr);   \
        if (dg_try_s_ != DG_OK)         \
            return dg_try_s_;           \
    } while (0)

#define DG_CHECK(cond, status, ...)             \
    do {                                        \
        if (!(cond))                            \
            return dg_fail((status), __VA_ARGS__); \
    } while (0)

/* ---- tensor checks (core/check.c) -------------------------------------------------------- */

/* `name` is the argument's name as DeepGEMM spells it ("a", "sfb", "grouped_layout", ...). */

/* t and t->data are non-NULL (data may be NULL only when the tensor is empty), ndim matches
 * (ndim < 0: any), no negative extents, the addressed span fits in size_t. */
dg_status dg_check_tensor(const dg_tensor *t, const char *name, int ndim);
/* dg_check_tensor, plus dtype == want. */
dg_status dg_check_tensor_dtype(const dg_tensor *t, const char *name, int ndim, dg_dtype want);
/* dtype is one of the `count` dtypes in `allowed`. */
dg_status dg_check_dtype_in(const dg_tensor *t, const char *name, const dg_dtype *allowed, int count);
/* shape[dim] == want. */
dg_status dg_check_dim(const dg_tensor *t, const char *name, int dim, int64_t want);
/* Row-major contiguous. */
dg_status dg_check_contiguous(const dg_tensor *t, const char *name);
/* The last dimension has unit stride (or extent <= 1): "row-major rows". */
dg_status dg_check_last_dim_contiguous(const dg_tensor *t, const char *name);
/* Writing `out` cannot overwrite `in` (their byte spans are disjoint), unless they are the
 * very same view and `allow_same` is set (in-place accumulation). */
dg_status dg_check_no_overlap(const dg_tensor *out, const char *out_name, const dg_tensor *in,
                              const char *in_name, bool allow_same);
/* An output view must not address one element twice (no zero strides on extents > 1, no
 * dimensions interleaving). */
dg_status dg_check_output(const dg_tensor *t, const char *name);
/* Byte span [lo, hi) that a tensor's elements address relative to data; false on overflow. */
bool dg_tensor_span(const dg_tensor *t, int64_t *lo, int64_t *hi);
/* A descriptor the library computes for a result (query forms): its span must fit in int64 and
 * in DG_MAX_SPAN_BYTES. `name` is the argument whose extents make it too large. */
dg_status dg_check_result_span(const dg_tensor *want, const char *name);
/* An input read element by element (a reduction with no output to bound the work, such as
 * calc_diff): a broadcast view (stride 0) may claim far more elements than it spans, and a call
 * over more elements than any dense tensor could hold (2^56 bytes) would run for years. */
dg_status dg_check_logical_size(const dg_tensor *t, const char *name);
bool dg_tensors_same_view(const dg_tensor *a, const dg_tensor *b);

/* Element address of a tensor with up to 4 indices (unused trailing indices are ignored). */
static inline void *dg_elem_ptr(const dg_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; ++i)
        off += idx[i] * t->strides[i];
    return (char *)t->data + off * (int64_t)dg_dtype_size(t->dtype);
}
static inline void *dg_ptr2(const dg_tensor *t, int64_t i, int64_t j) {
    return (char *)t->data + (i * t->strides[0] + j * t->strides[1]) * (int64_t)dg_dtype_size(t->dtype);
}
static inline void *dg_ptr3(const dg_tensor *t, int64_t i, int64_t j, int64_t k) {
    return (char *)t->data +
           (i * t->strides[0] + j * t->strides[1] + k * t->strides[2]) * (int64_t)dg_dtype_size(t->dtype);
}

/* Reads any real-valued element as float (FLOAT32, BFLOAT16, FLOAT8_E4M3, INT32, INT8,
 * UINT8, UE8M0) and writes FLOAT32 or BFLOAT16 (round to nearest even). */
float dg_load_float(const dg_tensor *t, const void *p);
void dg_store_float(const dg_tensor *t, void *p, float v);

/* No 64-bit platform gives a process more than 2^56 bytes of address space (x86-64 with 5-level
 * paging; 4-level paging and AArch64 give 2^47 to 2^52), so a tensor whose elements span more
 * bytes cannot exist. dg_check_tensor rejects it from shape and strides alone, before any
 * element is read, and so do the functions that compute a result's descriptor. */
#define DG_MAX_SPAN_BYTES ((int64_t)1 << 56)

/* Overflow-checked arithmetic on sizes. */
static inline bool dg_mul_ok(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
/* b > 0; no intermediate exceeds a, so this holds for every int64_t a (a + b - 1 would not). */
static inline int64_t dg_ceil_div(int64_t a, int64_t b) { return a / b + (a % b > 0); }
/* b > 0 and a <= INT64_MAX - b: callers align extents of checked tensors, which are far smaller. */
static inline int64_t dg_align(int64_t a, int64_t b) { return dg_ceil_div(a, b) * b; }

/* ---- argument helpers shared by the GEMM entry points (core/check.c) ------------------------ */

/* Optional C of a 2-D D: D's dtype and shape, unit stride along N, and either the very same view
 * as D (accumulate in place) or disjoint from it. NULL: DG_OK. */
dg_status dg_check_c_like_d(const dg_tensor *c, const dg_tensor *d);

/* The transposed descriptor of t in *store; t itself when it is NULL or not 2-D, so that the
 * checks report on the caller's tensor (the _nn / _tn / _tt forms). */
static inline const dg_tensor *dg_transposed_2d(const dg_tensor *t, dg_tensor *store) {
    if (!t || t->ndim != 2)
        return t;
    *store = dg_tensor_transpose(*t, 0, 1);
    return store;
}

/* ---- path report (runtime/paths.c) ------------------------------------------------------ */

/* The entry point whose call runs on this thread (set by dg_api_begin). */
const char *dg_api_name(void);
/* What a worker thread needs of its caller's call: the entry point (path report) and the
 * compiled_dims (JIT). Saved on the calling thread, adopted by each work item. */
typedef struct dg_api_context {
    const char *api;
    int dims;
} dg_api_context;
dg_api_context dg_api_save(void);
void dg_api_adopt(dg_api_context ctx);
/* The call's compiled_dims (dg_gemm_options; DeepGEMM: the dimensions a JIT compiles in as
 * constants), set by entry points that take options (reset by dg_api_begin): DG_DIM_* bits, or
 * -1 when not given (the entry point's default applies). */
enum { DG_DIM_M = 1, DG_DIM_N = 2, DG_DIM_K = 4 };
void dg_api_set_compiled_dims(const char *dims);
int dg_api_compiled_dims(void);
/* 0: off; 1: print and record; 2: record only (DG_PRINT_PATHS, dg_set_print_paths). */
int dg_paths_mode(void);
/* Records "<entry point>: <line>" once; the text after " | first: " (an example shape) is not
 * part of what makes a line new. Use DG_PATH: it costs one load while the report is off. */
void dg_path_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define DG_PATH(...)                                                                           \
    do {                                                                                       \
        if (dg_paths_mode())                                                                   \
            dg_path_note(__VA_ARGS__);                                                         \
    } while (0)
/* The reference serves a call: chosen (DG_BACKEND=reference), or the fast path declined. */
void dg_path_reference(const char *declined_why);
#define DG_PATH_REFERENCE(declined_why)                                                        \
    do {                                                                                       \
        if (dg_paths_mode())                                                                   \
            dg_path_reference(declined_why);                                                   \
    } while (0)

/* ---- settings (runtime/settings.c) ------------------------------------------------------- */

const dg_cpu_info *dg_cpu(void); /* detected once; never clears the error message */
bool dg_cpu_has_avx512_vbmi(void); /* byte permutes (VPERMB/VPERMI2B) the OS lets us use */
/* dg_cpu()->cache_bytes[level] for level 1 (data), 2 or 3, else 0 (0: unknown; blocking
 * choices have their own default). */
int64_t dg_cpu_cache_bytes(int level);
int dg_num_threads(void);          /* dg_get_num_sms() */
bool dg_use_reference(void);       /* DG_BACKEND=reference or dg_set_backend */

/* ---- allocation -------------------------------------------------------------------------- */

/* 64-byte aligned; NULL on failure or when bytes overflow. Free with dg_free. */
void *dg_malloc(size_t bytes);
void *dg_calloc(size_t count, size_t size);
/* align a power of two; bytes rounded up to a multiple of it (C11 aligned_alloc's rule). */
void *dg_aligned_alloc(size_t align, size_t bytes);
void dg_free(void *p);
/* Test-only fault injection: the nth allocation from now (through the functions above) fails,
 * later ones succeed; n <= 0 turns it off. dg_alloc_fail_pending: the failure is still to come. */
void dg_alloc_fail_nth(long n);
bool dg_alloc_fail_pending(void);

#endif /* DG_CORE_INTERNAL_H */
