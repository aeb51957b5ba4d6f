/*
 * deepgemm.h - the one public header of deepgemm-cpu.
 *
 * deepgemm-cpu carries DeepSeek's DeepGEMM kernel API to CPUs. Every DeepGEMM function
 * `name` is available here as `dg_name`, with the same arguments in the same order.
 * The behavioural contract is shared/SPEC.md; this header states the C conventions:
 *
 *  - Arrays are passed as `dg_tensor` descriptors (data pointer, dtype, shape, strides in
 *    elements), so that transposed views, MN-major scale tensors and padded strides are
 *    described exactly as PyTorch describes them. A NULL `const dg_tensor *` means "absent"
 *    where an argument is optional (DeepGEMM's `None`).
 *  - Every function returns a `dg_status`. On failure nothing has been written, and
 *    `dg_last_error()` holds a readable message naming the function and the argument.
 *  - Outputs are caller-allocated. Functions whose output shape depends on the inputs have a
 *    query form: pass an output descriptor whose `data` is NULL and the function fills in its
 *    dtype, shape and strides; allocate `dg_tensor_nbytes()` bytes and call again.
 *  - Results are deterministic: the same inputs give the same bits for any thread count.
 *
 * Thread safety: all functions may be called from several threads at once; settings are
 * process-wide.
 */
#ifndef DEEPGEMM_H
#define DEEPGEMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DG_VERSION_MAJOR 0
#define DG_VERSION_MINOR 1
#define DG_VERSION_PATCH 0

#if defined(_WIN32)
#define DG_API __declspec(dllexport)
#elif defined(__GNUC__)
#define DG_API __attribute__((visibility("default")))
#else
#define DG_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Status and errors
 * ------------------------------------------------------------------------------------------- */

typedef enum dg_status {
    DG_OK = 0,
    DG_ERR_NULL_POINTER = 1, /* a required pointer (tensor, data, string) is NULL */
    DG_ERR_DTYPE = 2,        /* a tensor has a dtype the function does not take */
    DG_ERR_SHAPE = 3,        /* dimensions disagree with each other or with the contract */
    DG_ERR_LAYOUT = 4,       /* strides, contiguity, alignment or aliasing not supported */
    DG_ERR_VALUE = 5,        /* a scalar argument or an index tensor's contents are invalid */
    DG_ERR_OVERFLOW = 6,     /* a size computation overflows */
    DG_ERR_ALLOC = 7,        /* a temporary buffer could not be allocated */
    DG_ERR_UNSUPPORTED = 8,  /* a valid request this build does not implement */
    DG_ERR_INTERNAL = 9
} dg_status;

/* The message of the most recent call on this thread ("" when it succeeded). */
DG_API const char *dg_last_error(void);
/* A fixed name for a status code, e.g. "DG_ERR_SHAPE". */
DG_API const char *dg_status_string(dg_status status);
DG_API const char *dg_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Tensors
 * ------------------------------------------------------------------------------------------- */

typedef enum dg_dtype {
    DG_FLOAT32 = 0,
    DG_BFLOAT16 = 1,      /* stored as uint16_t */
    DG_FLOAT8_E4M3 = 2,   /* float8_e4m3fn, stored as uint8_t */
    DG_FP4_E2M1X2 = 3,    /* two E2M1 codes in one byte, see below (DeepGEMM: int8 tensors) */
    DG_UE8M0 = 4,         /* one power-of-two scale per byte: 2^(byte - 127) */
    DG_INT32 = 5,         /* also: four UE8M0 scales packed little-endian ("packed UE8M0") */
    DG_INT64 = 6,
    DG_UINT8 = 7,         /* raw bytes (e.g. the paged KV cache) */
    DG_INT8 = 8,
    DG_DTYPE_COUNT = 9
} dg_dtype;

/*
 * Packed FP4 (DG_FP4_E2M1X2): each element is a byte holding two E2M1 codes, the lower-index
 * code in the low nibble. Pairs run along the tensor's unit-stride dimension, so shape[] and
 * strides[] count bytes and that dimension's logical extent is twice its shape, as with
 * DeepGEMM's int8 FP4 tensors ([R, C] logical stored as [R, C/2]).
 */

#define DG_MAX_DIMS 6

typedef struct dg_tensor {
    void *data;
    dg_dtype dtype;
    int ndim;
    int64_t shape[DG_MAX_DIMS];
    int64_t strides[DG_MAX_DIMS]; /* in elements (bytes for the 1-byte dtypes) */
} dg_tensor;

DG_API size_t dg_dtype_size(dg_dtype dtype);
DG_API const char *dg_dtype_name(dg_dtype dtype);

/* A row-major (C order) descriptor over `data`. ndim in [0, DG_MAX_DIMS]. */
DG_API dg_tensor dg_tensor_make(void *data, dg_dtype dtype, int ndim, const int64_t *shape);
/* Convenience constructors for row-major 1-D, 2-D and 3-D tensors. */
DG_API dg_tensor dg_tensor_1d(void *data, dg_dtype dtype, int64_t d0);
DG_API dg_tensor dg_tensor_2d(void *data, dg_dtype dtype, int64_t d0, int64_t d1);
DG_API dg_tensor dg_tensor_3d(void *data, dg_dtype dtype, int64_t d0, int64_t d1, int64_t d2);
/* The same memory with dimensions d0 and d1 swapped (PyTorch's `transpose`). */
DG_API dg_tensor dg_tensor_transpose(dg_tensor t, int d0, int d1);
/* Number of elements (product of the shape). */
DG_API int64_t dg_tensor_numel(const dg_tensor *t);
/* Bytes from the lowest to one past the highest addressed element (0 when empty). */
DG_API size_t dg_tensor_nbytes(const dg_tensor *t);
/* 1 when the strides are row-major contiguous. */
DG_API int dg_tensor_is_contiguous(const dg_tensor *t);

/* ---------------------------------------------------------------------------------------------
 * Runtime: CPU features, settings (SPEC 10)
 * ------------------------------------------------------------------------------------------- */

typedef enum dg_isa {
    DG_ISA_GENERIC = 0,    /* portable C */
    DG_ISA_AVX2 = 1,       /* AVX2 + FMA */
    DG_ISA_AVX512 = 2,     /* AVX-512 F/BW/VL */
    DG_ISA_AVX512_BF16 = 3 /* AVX-512 with VDPBF16PS and VNNI */
} dg_isa;

typedef struct dg_cpu_info {
    char vendor[16];
    char brand[64];
    int logical_cores;
    int avx2, fma, avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni, amx_bf16;
    dg_isa best_isa;       /* the best level this CPU and this build support */
} dg_cpu_info;

DG_API dg_status dg_get_cpu_info(dg_cpu_info *out);
DG_API const char *dg_isa_name(dg_isa isa);
/* The ISA level kernels use: the best available unless DG_ISA (generic, avx2, avx512,
 * avx512_bf16) or dg_set_isa asks for a lower one. Asking for a level the CPU lacks fails. */
DG_API dg_isa dg_get_isa(void);
DG_API dg_status dg_set_isa(dg_isa isa);

typedef enum dg_backend {
    DG_BACKEND_AUTO = 0,      /* fastest available implementation */
    DG_BACKEND_REFERENCE = 1  /* the scalar reference implementations (the SPEC's oracle) */
} dg_backend;
/* Initial value from DG_BACKEND=reference|auto. */
DG_API dg_backend dg_get_backend(void);
DG_API dg_status dg_set_backend(dg_backend backend);

/* Number of threads kernels use ("SMs" on a GPU). Default: DG_NUM_THREADS, else the number
 * of logical cores available to the process. */
DG_API dg_status dg_set_num_sms(int num_sms);
DG_API int dg_get_num_sms(void);
/* Accepted for compatibility; kept and returned but with no effect on a CPU. */
DG_API dg_status dg_set_tc_util(int tc_util);
DG_API int dg_get_tc_util(void);
DG_API void dg_set_pdl(int enable_pdl);
DG_API int dg_get_pdl(void);
DG_API void dg_set_ignore_compile_dims(int ignore);
DG_API int dg_get_ignore_compile_dims(void);
DG_API dg_status dg_set_block_size_multiple_of(int block_m_multiple_of, int block_n_multiple_of);
DG_API void dg_get_block_size_multiple_of(int *block_m_multiple_of, int *block_n_multiple_of);
/* Row alignment of each group in m-grouped contiguous layouts (default 128, as DeepGEMM). */
DG_API dg_status dg_set_mk_alignment_for_contiguous_layout(int alignment);
DG_API int dg_get_mk_alignment_for_contiguous_layout(void);
/* The smallest alignment the kernels could work with; expected_m <= 0 means "not given". */
DG_API int dg_get_theoretical_mk_alignment_for_contiguous_layout(int expected_m);

/* ---------------------------------------------------------------------------------------------
 * Number formats (SPEC 1): scalar conversions
 * ------------------------------------------------------------------------------------------- */

DG_API uint16_t dg_float_to_bf16(float x);   /* round to nearest even; NaN stays NaN */
DG_API float dg_bf16_to_float(uint16_t x);
DG_API uint8_t dg_float_to_e4m3(float x);    /* bit-identical to torch's float8_e4m3fn cast */
DG_API float dg_e4m3_to_float(uint8_t x);
DG_API uint8_t dg_float_to_e2m1(float x);    /* DeepGEMM's midpoint rule; a 4-bit code */
DG_API float dg_e2m1_to_float(uint8_t code); /* low 4 bits used */
DG_API float dg_ceil_to_ue8m0(float x);      /* smallest power of two >= |x|, exp in [1, 254] */
DG_API uint8_t dg_float_to_ue8m0(float x);   /* the exponent byte of dg_ceil_to_ue8m0(x) */
DG_API float dg_ue8m0_to_float(uint8_t e);   /* 2^(e - 127) */

/* ---------------------------------------------------------------------------------------------
 * GEMM options: DeepGEMM's keyword arguments (recipe, recipe_a, recipe_b, ...).
 * ------------------------------------------------------------------------------------------- */

typedef struct dg_gemm_options {
    int recipe[3];          /* (gran_m, gran_n, gran_k); all 0 = not given */
    int recipe_a[2];        /* (gran_mn, gran_k) for A; all 0 = not given */
    int recipe_b[2];        /* (gran_mn, gran_k) for B; all 0 = not given */
    int disable_ue8m0_cast; /* accepted: the CPU applies float32 scales exactly as given */
    const char *compiled_dims; /* accepted, no effect (JIT hint) */
    /* m-grouped contiguous layouts */
    int use_psum_layout;
    int ensure_zero_padding;         /* DeepGEMM's default is 1 */
    int expected_m_for_psum_layout;  /* <= 0: not given */
} dg_gemm_options;

/* DeepGEMM's defaults: no recipe (deduced from the scale dtypes), ensure_zero_padding = 1.
 * Passing NULL wherever a `const dg_gemm_options *` is taken means these defaults. */
DG_API dg_gemm_options dg_gemm_options_default(void);

/* @@SECTION formats-quant: quantization helpers, packing, calc_diff (SPEC 1-2) @@ */

/* @@SECTION dense-gemm: bf16/fp8/fp8_fp4 GEMMs nt/nn/tn/tt, skip_head_mid (SPEC 3) @@ */

/*
 * Dense GEMMs: D = C + A @ B^T, accumulated in float32.
 *
 * Layout letters as DeepGEMM: `_nt` takes A [M, K] and B [N, K]; `_nn` takes B as [K, N];
 * `_tn` takes A as [K, M] and B as [K, N]; `_tt` takes A as [K, M] and B [N, K]. The other
 * forms are `_nt` on transposed views, so `_nt` itself accepts A and B with any strides
 * (K-major or MN-major). D (and C) are [M, N], BF16 or FLOAT32, with unit stride along N.
 * C is optional (NULL), has D's dtype, and may be the very same view as D (accumulate in
 * place); otherwise C must not overlap D. With K = 0, D = C (or 0).
 */
DG_API dg_status dg_bf16_gemm_nt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);
DG_API dg_status dg_bf16_gemm_nn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);
DG_API dg_status dg_bf16_gemm_tn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);
DG_API dg_status dg_bf16_gemm_tt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);

/*
 * FP8 / FP4 GEMMs with block scales: A and B are FLOAT8_E4M3 or packed FP4 (DG_FP4_E2M1X2),
 * each with a scale tensor (sfa, sfb) in any of DeepGEMM's layouts: FLOAT32 of any strides or
 * INT32 packed UE8M0. `_tn`/`_nn`/`_tt` transpose sfa/sfb along with their operand.
 *   D[m, n] = C[m, n] + sum_k (A[m, k] * sfa(m, k)) * (B[n, k] * sfb(n, k))
 * Granularities come from opts->recipe / recipe_a / recipe_b, or by default from sfb's dtype
 * (float32 -> (1, 128, 128), packed -> (1, 1, 128)). opts may be NULL (defaults).
 * dg_fp8_gemm_* are the same functions under DeepGEMM's older names.
 */
DG_API dg_status dg_fp8_fp4_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                    const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                    const dg_gemm_options *opts);
DG_API dg_status dg_fp8_fp4_gemm_nn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                    const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                    const dg_gemm_options *opts);
DG_API dg_status dg_fp8_fp4_gemm_tn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                    const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                    const dg_gemm_options *opts);
DG_API dg_status dg_fp8_fp4_gemm_tt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                    const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                    const dg_gemm_options *opts);
DG_API dg_status dg_fp8_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                const dg_gemm_options *opts);
DG_API dg_status dg_fp8_gemm_nn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                const dg_gemm_options *opts);
DG_API dg_status dg_fp8_gemm_tn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                const dg_gemm_options *opts);
DG_API dg_status dg_fp8_gemm_tt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                const dg_gemm_options *opts);

/* @@SECTION grouped-gemm: m-grouped contiguous/masked, k-grouped (SPEC 4) @@ */

/* @@SECTION mqa-logits: MQA logits, paged MQA logits, metadata (SPEC 5) @@ */

/* @@SECTION hc-einsum-layout: HC prenorm, einsum, scale-factor layouts (SPEC 6-8) @@ */

/* @@SECTION mega-moe: fused expert-parallel MoE (SPEC 9) @@ */

#ifdef __cplusplus
}
#endif

#endif /* DEEPGEMM_H */
