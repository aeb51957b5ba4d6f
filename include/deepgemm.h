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
    DG_ERR_OVERFLOW = 6,     /* a size computation overflows, or a tensor (or a result the query
                                form would describe) spans more than 2^56 bytes, which no process
                                can address: refused from shapes and strides, no element read */
    DG_ERR_ALLOC = 7,        /* a temporary buffer could not be allocated: no output written,
                                except that a grouped GEMM may have finished some of its work
                                items (each element of D then holds its old or its final value) */
    DG_ERR_UNSUPPORTED = 8,  /* a valid request this build does not implement */
    DG_ERR_INTERNAL = 9,
    DG_ERR_COMM = 10         /* a collective call (mega MoE ranks) failed: a peer rank exited, did
                                not arrive within DG_COMM_TIMEOUT, or failed itself; the symmetric
                                buffer is then unusable (destroy it) unless the message says a
                                peer rejected its arguments */
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
    DG_FLOAT16 = 9,       /* IEEE binary16, stored as uint16_t: accepted as MQA logits weights */
    DG_DTYPE_COUNT = 10
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
    DG_ISA_AVX512_BF16 = 3, /* AVX-512 with VDPBF16PS and VNNI */
    DG_ISA_AMX = 4          /* the above plus AMX tiles (BF16 and INT8), granted by the OS */
} dg_isa;

typedef struct dg_cpu_info {
    char vendor[16];
    char brand[64];
    int logical_cores;
    int avx2, fma, avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni, amx_bf16;
    dg_isa best_isa;       /* the best level this CPU and this build support */
    int amx_int8;          /* AMX INT8 tiles (TDPBSSD and relatives) */
    int amx_usable;        /* the OS granted this process tile state (Linux: arch_prctl) */
    /* Data cache sizes one core sees, in bytes: [1] L1D, [2] L2, [3] L3 (shared ones whole);
     * [0] unused; 0 when unknown. From CPUID's cache parameters, else Linux's sysfs. The
     * kernels' cache blocking and prefetch distances are chosen from them. */
    int64_t cache_bytes[4];
} dg_cpu_info;

DG_API dg_status dg_get_cpu_info(dg_cpu_info *out);
DG_API const char *dg_isa_name(dg_isa isa);
/* The ISA level kernels use: the best available unless DG_ISA (generic, avx2, avx512,
 * avx512_bf16, amx) or dg_set_isa asks for a lower one. Asking for a level the CPU lacks fails. */
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
/* 1: the runtime JIT compiles no dimension in as a constant, whatever compiled_dims names
 * (DeepGEMM's set_ignore_compile_dims; README, "Runtime JIT"). Results do not change. */
DG_API void dg_set_ignore_compile_dims(int ignore);
DG_API int dg_get_ignore_compile_dims(void);
/* DeepGEMM 2.8's use_deterministic_algorithms(enabled). Every kernel here is always
 * deterministic (the same bits for any thread count and any call), so the flag is accepted and
 * changes nothing; dg_get_deterministic_algorithms() returns 1 whatever was asked. Should a
 * path ever trade determinism for speed, it will be off by default and this switch will choose. */
DG_API void dg_use_deterministic_algorithms(int enabled);
DG_API int dg_get_deterministic_algorithms(void);
/*
 * Path report: which implementation served each kind of call. With DG_PRINT_PATHS=1 (or
 * dg_set_print_paths(1)) every distinct line is written once to stderr as "[deepgemm path]
 * <entry point>: <path> [<faster path> declined: <why>] | first: <shape of the first call>",
 * for example "dg_fp8_gemm_nt: avx2 decode kernel (M <= 2, E4M3 B read in place) | first: m=1
 * n=2112 k=7168". Paths name the level (amx, avx512_bf16, avx512, avx2, generic) or
 * "reference". Mode 2 (DG_PRINT_PATHS=2) records without printing; 0 turns it off (default).
 * dg_get_path_report copies the recorded lines, '\n'-terminated, into buf (NUL-terminated,
 * truncated to size) and returns the length the whole report needs (snprintf's rule);
 * dg_clear_path_report forgets them, so that they are recorded and printed again. At most 256
 * distinct lines are kept. Off, the report costs one relaxed load per dispatch decision.
 */
DG_API void dg_set_print_paths(int mode);
DG_API int dg_get_print_paths(void);
DG_API size_t dg_get_path_report(char *buf, size_t size);
DG_API void dg_clear_path_report(void);
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
DG_API uint16_t dg_float_to_f16(float x);    /* IEEE binary16, round to nearest even (as torch) */
DG_API float dg_f16_to_float(uint16_t x);    /* exact */
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
    const char *compiled_dims; /* dims ('m', 'n', 'k') the runtime JIT may make constants; NULL:
                                * "nk" (README, "Runtime JIT"); never changes results */
    /* m-grouped contiguous layouts */
    int use_psum_layout;
    int ensure_zero_padding;         /* DeepGEMM's default is 1 */
    int expected_m_for_psum_layout;  /* <= 0: not given */
    /* DeepGEMM 2.8's `alpha`: D = C + alpha * (A @ B^T) (dense GEMMs only; see dense-gemm) */
    int has_alpha;                   /* 0: alpha not given (1) */
    float alpha;
} dg_gemm_options;

/* DeepGEMM's defaults: no recipe (deduced from the scale dtypes), ensure_zero_padding = 1.
 * Passing NULL wherever a `const dg_gemm_options *` is taken means these defaults. */
DG_API dg_gemm_options dg_gemm_options_default(void);

/* @@SECTION formats-quant: quantization helpers, packing, calc_diff (SPEC 1-2) @@ */

/*
 * Bulk conversion, like torch's `dst.copy_(src)`: src and dst have the same shape and any
 * strides; each dtype is FLOAT32, BFLOAT16 or FLOAT8_E4M3. Every element gives exactly the bits
 * of the scalar functions above (through float32). dst may be src itself only when the dtypes
 * agree (then nothing changes); otherwise they must not overlap.
 */
DG_API dg_status dg_cast(const dg_tensor *src, const dg_tensor *dst);

/*
 * Quantization helpers of deep_gemm.utils (SPEC 2). x is FLOAT32 or BFLOAT16 with any strides.
 * In every group: amax = max |x| (NaN propagates) clamped below at float(1e-4); sf = amax / 448
 * (FP8) or amax / 6 (FP4) in float32; with use_ue8m0, sf = dg_ceil_to_ue8m0(sf); then
 * data = cast(x * (1.0f / sf)), the reciprocal and the product in float32. K is padded with
 * zeros to a multiple of gran_k (> 0; DeepGEMM's default is 128). Outputs are row-major or
 * any strides that address each element once ("out": unit stride along its last dimension for
 * packed FP4) and must not overlap inputs or each other. Query form: when out or out_sf has
 * data == NULL, those descriptors are filled in (row-major) and nothing else is done.
 *
 * per_token:  x [M, K] -> out E4M3 [M, K], out_sf FLOAT32 [M, S], S = ceil(K/gran_k), or with
 *             use_packed_ue8m0 (needs use_ue8m0) INT32 [M, ceil(S/4)] with the missing scales of
 *             the last word set to 1.0 (byte 127), as DeepGEMM pads (MXFP8 with gran_k 32).
 */
DG_API dg_status dg_per_token_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, int use_packed_ue8m0,
                                          dg_tensor *out, dg_tensor *out_sf);
/* per_block:  gran_k x gran_k blocks; x [M, K] -> out E4M3 [M, K],
 *             out_sf FLOAT32 [ceil(M/gran_k), ceil(K/gran_k)]. */
DG_API dg_status dg_per_block_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, dg_tensor *out,
                                          dg_tensor *out_sf);
/* per_channel: gran_k rows x 1 column; x [M, N] with M % gran_k == 0 -> out E4M3 [M, N],
 *             out_sf FLOAT32 [M/gran_k, N]. */
DG_API dg_status dg_per_channel_cast_to_fp8(const dg_tensor *x, int use_ue8m0, int gran_k, dg_tensor *out,
                                            dg_tensor *out_sf);
/* per_custom_dims: x of any ndim; one scale per index of the dimensions listed in
 * dims[0..num_dims) (each in [0, ndim), no repeats), amax over all the other dimensions.
 * out E4M3 with x's shape; out_sf FLOAT32 shaped like DeepGEMM's `sf.squeeze()`: the listed
 * dimensions' extents in dimension order, extents of 1 dropped. As in torch's amax, listing
 * no dimension or every dimension reduces over the whole tensor (out_sf has 0 dimensions). */
DG_API dg_status dg_per_custom_dims_cast_to_fp8(const dg_tensor *x, const int *dims, int num_dims, int use_ue8m0,
                                                dg_tensor *out, dg_tensor *out_sf);
/* per_token FP4: x [M, K], K even, ceil(K/gran_k)*gran_k even -> out DG_FP4_E2M1X2 (or INT8)
 * [M, K/2] (element 2i low nibble); out_sf FLOAT32 [M, S], S = ceil(K/gran_k), or with
 * use_packed_ue8m0 (needs use_ue8m0) INT32 [M, ceil(S/4)] with the missing scales of the
 * last word set to 1.0 (byte 127), as DeepGEMM pads. */
DG_API dg_status dg_per_token_cast_to_fp4(const dg_tensor *x, int use_ue8m0, int gran_k, int use_packed_ue8m0,
                                          dg_tensor *out, dg_tensor *out_sf);
/* Dequantize packed FP4: packed DG_FP4_E2M1X2/INT8 [M, N/2] (unit stride along the last dim),
 * sf FLOAT32 [M, >= ceil(N/gran_k)] or with use_packed_ue8m0 INT32 [M, >= ceil(ceil(N/gran_k)/4)]
 * (byte b means the float with bits b << 23, as DeepGEMM unpacks: byte 0 gives 0) ->
 * out FLOAT32 (or BFLOAT16) [M, N] = value(code) * sf; code 8 (-0) gives +0 * sf. */
DG_API dg_status dg_cast_back_from_fp4(const dg_tensor *packed, const dg_tensor *sf, int gran_k,
                                       int use_packed_ue8m0, dg_tensor *out);
/* Dequantize FP8 (DeepGEMM 2.8's cast_back_from_fp8): x FLOAT8_E4M3 [M, N], any strides; sf as
 * in dg_cast_back_from_fp4 for N -> out FLOAT32 (or BFLOAT16) [M, N] = e4m3(x) * sf of its
 * group of gran_k (MXFP8: gran_k = 32 with packed UE8M0). */
DG_API dg_status dg_cast_back_from_fp8(const dg_tensor *x, const dg_tensor *sf, int gran_k, int use_packed_ue8m0,
                                       dg_tensor *out);
/* Element-wise dg_ceil_to_ue8m0: x FLOAT32/BFLOAT16 -> out FLOAT32 of x's shape (out may be the
 * same view as a FLOAT32 x). */
DG_API dg_status dg_ceil_to_ue8m0_tensor(const dg_tensor *x, const dg_tensor *out);
/* x FLOAT32 [..., S], S % 4 == 0, every value a non-negative float with zero mantissa bits
 * (+0, powers of two, +inf) -> out INT32 [..., S/4], byte j of word q = exponent byte of x[4q+j]. */
DG_API dg_status dg_pack_ue8m0_to_int(const dg_tensor *x, dg_tensor *out);
/* The inverse: packed INT32 [..., S4] -> out FLOAT32 [..., 4*S4], value bits = byte << 23. */
DG_API dg_status dg_unpack_ue8m0_from_int(const dg_tensor *packed_sf, dg_tensor *out);
/* Transpose a packed FP4 matrix: a DG_FP4_E2M1X2/INT8 [M, N/2] (M even, unit stride along the
 * last dim) holding logical [M, N] -> out (a's dtype) [N, M/2] holding logical [N, M]. */
DG_API dg_status dg_transpose_packed_fp4(const dg_tensor *a, dg_tensor *out);
/* DeepGEMM's calc_diff: 1 - 2*sum(x*y) / sum(x*x + y*y) in double over FLOAT32/BFLOAT16
 * tensors of equal shape and any strides; 0 when both are all zero (or empty). */
DG_API dg_status dg_calc_diff(const dg_tensor *x, const dg_tensor *y, double *out);

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
 * Accumulation (every GEMM family on the BF16 engine: dense, grouped, pre-packed, einsum,
 * FP8 and FP4 widened to BF16): K is cut into blocks of 128 (or of the scale block when that is
 * shorter); each block is a float32 FMA chain from 0, the blocks' sums are added in order
 * (times the block's scales, if any), then D = round(C + sum); einsum 'bmk,bnk->mn', whose K
 * runs over the whole batch, first adds runs of 16 block sums into group sums (BF16 einsum on
 * AMX adds its block sums in float64 instead: dg_einsum). Short chains keep
 * the rounding error several times below one chain over K (README, "Accuracy"); the block is a
 * constant, so a row's bits depend on neither M, the thread count nor the CPU within an ISA level.
 */
DG_API dg_status dg_bf16_gemm_nt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);
DG_API dg_status dg_bf16_gemm_nn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);
DG_API dg_status dg_bf16_gemm_tn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);
DG_API dg_status dg_bf16_gemm_tt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c);

/*
 * The same with options (DeepGEMM 2.8's keyword arguments of bf16_gemm_*): opts->compiled_dims
 * and opts->alpha; the recipe fields must be unset (BF16 has no scales). NULL: defaults.
 *
 * alpha (here and in dg_fp8_fp4_gemm_* / dg_fp8_gemm_* / dg_fp8_fp4_gemm_nt_packed; in DeepGEMM
 * 2.8 an SM100 epilogue option): D = round(C + alpha * acc), with acc the float32 product of
 * the contract below, alpha * acc rounded to float32, then one float32 add and one rounding to
 * D's dtype. The product is computed into a float32 buffer of [M, N] (D itself when D is
 * FLOAT32 and C is NULL), so a call with alpha needs M * N * 4 bytes more (DG_ERR_ALLOC
 * otherwise, nothing written). alpha must be finite (DG_ERR_VALUE). Every other function
 * taking dg_gemm_options rejects has_alpha with DG_ERR_UNSUPPORTED, as DeepGEMM has no alpha
 * there.
 */
DG_API dg_status dg_bf16_gemm_nt_ex(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                    const dg_tensor *c, const dg_gemm_options *opts);
DG_API dg_status dg_bf16_gemm_nn_ex(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                    const dg_tensor *c, const dg_gemm_options *opts);
DG_API dg_status dg_bf16_gemm_tn_ex(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                    const dg_tensor *c, const dg_gemm_options *opts);
DG_API dg_status dg_bf16_gemm_tt_ex(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                    const dg_tensor *c, const dg_gemm_options *opts);

/*
 * FP8 / FP4 GEMMs with block scales: A and B are FLOAT8_E4M3 or packed FP4 (DG_FP4_E2M1X2),
 * each with a scale tensor (sfa, sfb) in any of DeepGEMM's layouts: FLOAT32 of any strides or
 * INT32 packed UE8M0. `_tn`/`_nn`/`_tt` transpose sfa/sfb along with their operand.
 *   D[m, n] = C[m, n] + sum_k (A[m, k] * sfa(m, k)) * (B[n, k] * sfb(n, k))
 * Granularities come from opts->recipe / recipe_a / recipe_b, or by default from sfb's dtype
 * (float32 -> (1, 128, 128), packed -> (1, 1, 128)). opts may be NULL (defaults).
 * dg_fp8_gemm_* are the same functions under DeepGEMM's older names.
 * Numerics: FP8/FP4 values are widened to BF16 exactly and multiplied on the BF16 engine. When
 * both A and B are FP4 and the scale block (gcd of the two gran_k) is a multiple of 32, the
 * products are integers instead (2 x E2M1 is an integer in [-12, 12]): per element,
 * acc = fma((float)dot_kb, (0.25f * sa) * sb, acc) over the K blocks in order, with dot_kb the
 * exact int32 dot product of 2A and 2B over block kb; D = round(C + acc). The integer part is
 * exact, so this gives the same bits on every ISA level and machine.
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

/*
 * D = A @ B^T written around per-head gaps (DeepGEMM attention.hpp). head_splits = {left, mid,
 * right}: B is FLOAT8_E4M3 [heads * (left + right), K] (rows of each head: left, then right),
 * A FLOAT8_E4M3 [M, K], D [M, heads * (left + mid + right)] BF16/FLOAT32 with unit stride along
 * N. Head h's left rows go to D columns h*(left+mid+right) + [0, left), its right rows to
 * h*(left+mid+right) + left + mid + [0, right); the mid columns are left untouched. No C.
 * Only opts->recipe applies (recipe_a/recipe_b must be unset); gran_k must be 128. N, K > 0.
 */
DG_API dg_status dg_fp8_gemm_nt_skip_head_mid(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                              const dg_tensor *sfb, const dg_tensor *d,
                                              const int head_splits[3], const dg_gemm_options *opts);

/*
 * Pre-packed B (weights packed once, then reused by every GEMM; decoding skips re-packing).
 * dg_pack_b takes B as `_nt` does: [N, K], any strides; BF16 with sfb = NULL (opts ignored),
 * or FLOAT8_E4M3 / packed FP4 with sfb and the recipe (opts, NULL = defaults) exactly as
 * dg_fp8_fp4_gemm_nt would take them. The packed form is private memory in the engine's panel
 * format for the ISA level (and kernel) current at packing: NR-row panels, K padded to even,
 * values as BF16 k pairs (AVX2 and AVX-512 levels) or float32 (portable kernels), FP8/FP4
 * widened to BF16 exactly, power-of-two (UE8M0) scales folded into the values, other
 * float32 scales kept per panel and K block (src/engine/engine.h documents the layout).
 * An FP8 B packed on the AMX level also keeps its E4M3 codes K-major (1 byte per weight) and
 * its scales as float32: calls with M <= 64 (decoding) run the unpacked call's small-M path on
 * them, reading 1 byte per weight instead of the panels' 2, and large M runs on the panels;
 * an FP4 B there (whose codes every level keeps, below) serves M <= 64 from its codes alike.
 * On the AVX2 level the same codes (FP8: 1 byte, FP4: 0.5 bytes per weight) serve M <= 2.
 * Such an object thus takes 3 bytes per weight instead of 2 (+50%; a 2112 x 7168 B: 15 MB of
 * codes, 30 MB of panels). An FP4 B packed on the AVX-512 BF16 level also keeps its codes in
 * decode panels (16 rows x 32 k per 256 bytes, arranged for in-register widening without a
 * transpose) and, for power-of-two scales, their exponent bytes: calls with another A and
 * M <= 64 read those (0.5 bytes per weight plus 1 per 32 weights), 3 bytes per weight in all;
 * an FP8 B there keeps its codes also as E4M3 decode panels (16 rows x 32 k per 512 bytes),
 * read by calls with M <= 8, 4 bytes per weight in all. Packing per large-M call instead (codes only) was measured (one
 * thread, N 2112, K 7168) at 3.6x the time at M = 65, 1.8x at M = 256, 1.2x at M = 1024.
 * It does not refer to b/sfb afterwards. A packed B is read-only: GEMMs may share it across
 * threads. Free it with dg_packed_b_free (NULL is a no-op).
 * The `_nt_packed` GEMMs give bitwise the D of dg_bf16_gemm_nt / dg_fp8_fp4_gemm_nt on the same
 * inputs. They fail with DG_ERR_VALUE (nothing written) when dg_set_isa changed the kernel
 * since packing (pack again), or when opts' recipe for B differs from the packing one; with
 * DG_ERR_DTYPE when B's dtype does not fit the function; with DG_ERR_UNSUPPORTED under the
 * reference backend (dg_use_reference) or for scale blocks of odd length.
 * On AMX, scale blocks that are not whole AMX k steps (32; NVFP4's 16) run the AVX-512 level,
 * as the unpacked GEMM does: a B whose own scale blocks are such is packed for that level (and
 * accepted by calls at AMX); where only A's are, the call runs on B's kept FP8 / FP4 codes.
 */
typedef struct dg_packed_b dg_packed_b;
DG_API dg_status dg_pack_b(const dg_tensor *b, const dg_tensor *sfb, const dg_gemm_options *opts,
                           dg_packed_b **out);
DG_API void dg_packed_b_free(dg_packed_b *p);
DG_API dg_status dg_bf16_gemm_nt_packed(const dg_tensor *a, const dg_packed_b *b, const dg_tensor *d,
                                        const dg_tensor *c);
DG_API dg_status dg_fp8_fp4_gemm_nt_packed(const dg_tensor *a, const dg_tensor *sfa, const dg_packed_b *b,
                                           const dg_tensor *d, const dg_tensor *c, const dg_gemm_options *opts);

/* @@SECTION cublaslt-fp4-names: cuBLASLt GEMMs, DeepGEMM 2.8's FP4 names @@ */

/*
 * cuBLASLt GEMMs (DeepGEMM csrc/apis/gemm.hpp, cublaslt_gemm_*): plain GEMMs without block
 * scales, D = C + A @ B^T accumulated in float32, with DeepGEMM's arguments (a, b, d, c). On a
 * GPU they call cuBLASLt; here they run on the dense engine, so there is no cuBLASLt setting,
 * no alpha and no beta (DeepGEMM's calls have neither: beta is 1 when c is given, else 0).
 * Layout letters, the shapes of A, B, C and D, the rules for C (optional, D's dtype, the very
 * same view as D or disjoint from it), K = 0 (D = C, or 0) and empty M or N (nothing written)
 * are those of the dense GEMMs above. A and B have any strides and the same dtype:
 *   BFLOAT16       D BFLOAT16 or FLOAT32; bitwise the D of dg_bf16_gemm_* on the same inputs.
 *   FLOAT8_E4M3    D BFLOAT16 or FLOAT32; the codes' values unscaled (cuBLASLt without scale
 *                  pointers), widened exactly and multiplied on the engine as FP8 GEMMs are.
 *   FLOAT32        D FLOAT32 (cuBLASLt's FP32 GEMMs take no other output); cuBLASLt rounds
 *                  the inputs to TF32 on the GPU, the CPU does not: this dtype runs the
 *                  reference kernel (products exact, summed in double, rounded once), which is
 *                  single-threaded scalar code, for correctness rather than speed.
 */
DG_API dg_status dg_cublaslt_gemm_nt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                     const dg_tensor *c);
DG_API dg_status dg_cublaslt_gemm_nn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                     const dg_tensor *c);
DG_API dg_status dg_cublaslt_gemm_tn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                     const dg_tensor *c);
DG_API dg_status dg_cublaslt_gemm_tt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                     const dg_tensor *c);

/*
 * DeepGEMM 2.8's batched cuBLASLt calls (csrc/apis/gemm.hpp), one GEMM per batch as above:
 *   dg_batched_syrk: D[g] = A[g] @ A[g]^T, A [G, M, K] (or [M, K]) and D [G, M, M] (or [M, M]);
 *   dg_batched_symm: D[g] = A[g] @ B[g], A [G, M, M] (symmetric by contract: used as given),
 *                    B [G, M, K] and D [G, M, K] (or all three 2-D).
 * A and B have any strides; D has unit stride along its last dimension and A's dtype, which is
 * BFLOAT16 (the dense engine: bitwise dg_cublaslt_gemm_nt per batch) or FLOAT32 (the reference
 * kernel, as dg_cublaslt_gemm_nt). Every batch is checked before any is written; D must not
 * overlap the inputs.
 */
/*
 * DeepGEMM 2.8's cublaslt_nvfp4_gemm_nt: NVFP4 operands, D = C + A @ B^T.
 *   a DG_FP4_E2M1X2 (or INT8) [M, K / 2] and b [N, K / 2], contiguous (K-major E2M1 pairs),
 *   K % 32 == 0; sfa / sfb UINT8 (or INT8) contiguous, one UE4M3 scale (E4M3 bits, sign clear)
 *   per 16 elements of a row, in cuBLASLt's VEC16 tiled layout: ceil(MN / 128) x ceil(K / 64)
 *   tiles of 512 bytes, the scale of row r and 16-block c at byte
 *   ((r / 128) * ceil(K / 64) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4
 *   (numel exactly ceil(MN / 128) * ceil(K / 64) * 512);
 *   d [M, N] BFLOAT16 or FLOAT32 with unit stride along N; c optional as for the dense GEMMs.
 * Each E2M1 value times its scale is exact in BF16 (at most 6 significant bits), so A and B are
 * widened to BF16 and multiplied on the dense engine: bitwise dg_bf16_gemm_nt on the
 * dequantized operands. (cuBLASLt's per-tensor global scale is not an argument of DeepGEMM's
 * call; apply it to D, or use alpha on the dense GEMMs.)
 */
DG_API dg_status dg_cublaslt_nvfp4_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                           const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c);
DG_API dg_status dg_batched_syrk(const dg_tensor *a, const dg_tensor *d);
DG_API dg_status dg_batched_symm(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d);

/*
 * DeepGEMM 2.8's FP4 names. As in DeepGEMM (its Python module binds them to the same functions),
 * each is the FP8/FP4 function it names, with every argument, dtype combination and rule of it
 * (FP4 x FP4, FP8 x FP4, FP8 x FP8); only error messages carry the FP4 name.
 *   dg_fp4_gemm_nt                       = dg_fp8_fp4_gemm_nt
 *   dg_m_grouped_fp4_gemm_nt_contiguous  = dg_m_grouped_fp8_fp4_gemm_nt_contiguous
 *   dg_m_grouped_fp4_gemm_nt_masked      = dg_m_grouped_fp8_fp4_gemm_nt_masked
 * DeepGEMM's k_grouped_fp4_gemm_nt_contiguous (K-major packed FP4 weight gradients) is a kernel
 * of its own, not an alias: dg_k_grouped_fp4_gemm_nt_contiguous in the k-grouped section.
 */
DG_API dg_status dg_fp4_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp4_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa,
                                                     const dg_tensor *b, const dg_tensor *sfb,
                                                     const dg_tensor *d, const dg_tensor *grouped_layout,
                                                     const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp4_gemm_nt_masked(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                                 const dg_tensor *sfb, const dg_tensor *d,
                                                 const dg_tensor *masked_m, int expected_m,
                                                 const dg_gemm_options *opts);

/* @@SECTION grouped-gemm: m-grouped contiguous/masked, k-grouped (SPEC 4) @@ */

/*
 * m-grouped contiguous GEMMs (MoE forward): D[r, :] = A[r, :] . B[g(r)]^T, float32 accumulation.
 *   a  [M, K] K-major (unit stride along K): BFLOAT16, or FLOAT8_E4M3 / packed FP4 with sfa;
 *   b  [G, N, K] (`_nt`, any strides) or [G, K, N] (`_nn`; sfb then transposed likewise);
 *   d  [M, N] BFLOAT16 (DeepGEMM) or FLOAT32 (also accepted), unit stride along N.
 *   grouped_layout INT32, contiguous:
 *    - index form (default): [M], the group of every row, -1 = padding row (its A row is not
 *      read and its D row is left untouched);
 *    - psum form (opts->use_psum_layout): [G] end rows; group g covers rows
 *      [align(end[g-1], dg_get_mk_alignment_for_contiguous_layout()), end[g]), ends must not
 *      precede their group's start nor exceed M. With opts->ensure_zero_padding (default 1)
 *      rows [end[g], align(end[g])) of D are zeroed; rows outside every group and padding are
 *      left untouched. opts->expected_m_for_psum_layout is a hint, rejected without psum.
 * FP8/FP4 scales and recipes as the dense fp8_fp4 GEMMs (sfa [M, ...], sfb [G, ...]). G, N and
 * K must be positive; M may be 0. Invalid layout contents give DG_ERR_VALUE, nothing written.
 */
DG_API dg_status dg_m_grouped_bf16_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *b,
                                                      const dg_tensor *d, const dg_tensor *grouped_layout,
                                                      const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_bf16_gemm_nn_contiguous(const dg_tensor *a, const dg_tensor *b,
                                                      const dg_tensor *d, const dg_tensor *grouped_layout,
                                                      const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp8_fp4_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa,
                                                         const dg_tensor *b, const dg_tensor *sfb,
                                                         const dg_tensor *d, const dg_tensor *grouped_layout,
                                                         const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp8_fp4_gemm_nn_contiguous(const dg_tensor *a, const dg_tensor *sfa,
                                                         const dg_tensor *b, const dg_tensor *sfb,
                                                         const dg_tensor *d, const dg_tensor *grouped_layout,
                                                         const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp8_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa,
                                                     const dg_tensor *b, const dg_tensor *sfb,
                                                     const dg_tensor *d, const dg_tensor *grouped_layout,
                                                     const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp8_gemm_nn_contiguous(const dg_tensor *a, const dg_tensor *sfa,
                                                     const dg_tensor *b, const dg_tensor *sfb,
                                                     const dg_tensor *d, const dg_tensor *grouped_layout,
                                                     const dg_gemm_options *opts);

/*
 * m-grouped masked GEMMs (MoE decoding): a [G, max_m, K] and b [G, N, K], both K-major,
 * d [G, max_m, N] BFLOAT16 (or FLOAT32); masked_m INT32 [G] contiguous with
 * 0 <= masked_m[g] <= max_m. Only rows m < masked_m[g] of group g are computed; the rest of D is
 * neither read nor written. expected_m (> 0) is a scheduling hint. sfa is [G, max_m, ...].
 */
DG_API dg_status dg_m_grouped_bf16_gemm_nt_masked(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                                  const dg_tensor *masked_m, int expected_m,
                                                  const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp8_fp4_gemm_nt_masked(const dg_tensor *a, const dg_tensor *sfa,
                                                     const dg_tensor *b, const dg_tensor *sfb,
                                                     const dg_tensor *d, const dg_tensor *masked_m,
                                                     int expected_m, const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp8_gemm_nt_masked(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                                 const dg_tensor *sfb, const dg_tensor *d,
                                                 const dg_tensor *masked_m, int expected_m,
                                                 const dg_gemm_options *opts);

/*
 * Pre-packed grouped weights (MoE experts packed once; decoding then only streams them).
 * dg_pack_b_grouped takes b [G, N, K] (any strides) as the m-grouped `_nt` GEMMs do: BF16 with
 * sfb = NULL (opts ignored), or FLOAT8_E4M3 / packed FP4 with sfb [G, ...] and the recipe
 * (opts, NULL = defaults). The result is one dg_packed_b holding G dense packed B's (each as
 * dg_pack_b packs that group, for the current ISA, FP8 groups keeping their E4M3 codes too as
 * dg_pack_b describes); it does not refer to b/sfb afterwards, is
 * read-only, and is freed with dg_packed_b_free. G, N, K > 0.
 * The `_packed` m-grouped GEMMs take it in place of b/sfb, with every other argument and rule
 * of the unpacked `_nt` call (a K-major; a's groups / K and d's N must match the packed G, K,
 * N; FP8 entries cover FP8 x FP8 and FP8/FP4 x FP4 as the `fp8_fp4` ones do). D is bitwise the
 * unpacked call's on the same inputs. They fail, nothing written, with DG_ERR_VALUE when
 * dg_set_isa changed the kernel since packing or opts' recipe for B differs from the packing
 * one, DG_ERR_DTYPE when B's dtype does not fit, DG_ERR_VALUE for a dense packed B, and
 * DG_ERR_UNSUPPORTED under the reference backend or for scale blocks the packed engine cannot
 * run (odd lengths; on AMX, not multiples of 32 where B kept no FP8 / FP4 codes: FP8 and FP4
 * B keep them, and such calls run the AVX-512 level on them, as the unpacked call does). Decoding-sized groups (<= 64 rows) are
 * scheduled as column chunks of all groups in one parallel loop; empty groups cost nothing.
 * The dense `_nt_packed` GEMMs do not take a grouped object.
 */
DG_API dg_status dg_pack_b_grouped(const dg_tensor *b, const dg_tensor *sfb, const dg_gemm_options *opts,
                                   dg_packed_b **out);
DG_API dg_status dg_m_grouped_bf16_gemm_nt_masked_packed(const dg_tensor *a, const dg_packed_b *b,
                                                         const dg_tensor *d, const dg_tensor *masked_m,
                                                         int expected_m, const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(const dg_tensor *a, const dg_tensor *sfa,
                                                            const dg_packed_b *b, const dg_tensor *d,
                                                            const dg_tensor *masked_m, int expected_m,
                                                            const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_bf16_gemm_nt_contiguous_packed(const dg_tensor *a, const dg_packed_b *b,
                                                             const dg_tensor *d, const dg_tensor *grouped_layout,
                                                             const dg_gemm_options *opts);
DG_API dg_status dg_m_grouped_fp8_fp4_gemm_nt_contiguous_packed(const dg_tensor *a, const dg_tensor *sfa,
                                                                const dg_packed_b *b, const dg_tensor *d,
                                                                const dg_tensor *grouped_layout,
                                                                const dg_gemm_options *opts);

/*
 * k-grouped GEMMs (MoE weight gradients): D[g] = C[g] + A_g^T B_g, d and c FLOAT32 [G, M, N]
 * contiguous; c may be NULL (D[g] = A_g^T B_g; DeepGEMM always passes one) or the very same
 * view as d. Empty groups (k = 0) give D[g] = C[g] (0 without C).
 *   ks[num_ks]: each group's K, a multiple of the K alignment (`_tn`:
 *     dg_get_mk_alignment_for_contiguous_layout(), which must be a multiple of 32; `_nt`: 128).
 *   grouped_layout INT32 [G] contiguous: equal to ks; or, with opts->use_psum_layout (`_tn`
 *     only), each group's end row, group g starting at align(end[g-1], K alignment), ks then
 *     optional (NULL, 0) and otherwise equal to each group's K aligned up.
 *   `_tn` (MN-major): a [sum_k, M], b [sum_k, N] contiguous (FLOAT8_E4M3 or BFLOAT16); psum
 *     rows between groups are never read. FP8 scales per channel along K:
 *     sfa FLOAT32 [sum_g ceil(k_g / gran_k), M] (any strides), or INT32 packed UE8M0
 *     [>= sum_g ceil(k_g / (4 gran_k)), M] with each group starting a new packed row; sfb
 *     likewise with N. With the psum layout the float32 rows of a group are those of its K
 *     aligned up (see dg_k_grouped_fp4_gemm_nt_contiguous below).
 *   `_nt` (K-major): a, b contiguous of sum_k*M (sum_k*N) FLOAT8_E4M3 elements holding group
 *     after group an [M, k_g] (resp. [N, k_g]) row-major block; sfa FLOAT32 [M, sum_k / 128],
 *     sfb [N, sum_k / 128], any strides.
 * opts->recipe: (1, 1, gran_k) with gran_k 32 or 128 (`_nt`: 128); default (1, 1, 128).
 */
DG_API dg_status dg_k_grouped_fp8_gemm_tn_contiguous(const dg_tensor *a, const dg_tensor *sfa,
                                                     const dg_tensor *b, const dg_tensor *sfb,
                                                     const dg_tensor *d, const int *ks, int num_ks,
                                                     const dg_tensor *grouped_layout, const dg_tensor *c,
                                                     const dg_gemm_options *opts);
DG_API dg_status dg_k_grouped_fp8_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa,
                                                     const dg_tensor *b, const dg_tensor *sfb,
                                                     const dg_tensor *d, const int *ks, int num_ks,
                                                     const dg_tensor *grouped_layout, const dg_tensor *c,
                                                     const dg_gemm_options *opts);
DG_API dg_status dg_k_grouped_bf16_gemm_tn_contiguous(const dg_tensor *a, const dg_tensor *b,
                                                      const dg_tensor *d, const int *ks, int num_ks,
                                                      const dg_tensor *grouped_layout, const dg_tensor *c,
                                                      const dg_gemm_options *opts);

/*
 * DeepGEMM 2.8's k-grouped FP4 GEMM (FP4 weight gradients): as the `_tn` form above, but
 *   a DG_FP4_E2M1X2 (or INT8) [M, sum_k / 2] and b [N, sum_k / 2], contiguous: logical K-major
 *     [M, sum_k] / [N, sum_k] with the pairs along K; group g owns columns
 *     [start_g, start_g + k_g) of every row (start_g as in `_tn`, psum layout included);
 *   opts->recipe must be (1, 1, 32) (the default here); the K alignment
 *     (dg_get_mk_alignment_for_contiguous_layout()) must be a multiple of 256, as DeepGEMM's;
 *   sfa / sfb per channel along K, MN-major as `_tn`'s: FLOAT32 [rows, M] or INT32 packed
 *     UE8M0 [>= packed rows, M].
 * Scale rows per group, here and in `_tn` with the psum layout: FLOAT32 scales give each group
 * the rows of its K aligned up to the K alignment (align(k_g, alignment) / gran_k, as DeepGEMM's
 * generators cast each group padded to its aligned K; without psum k_g is aligned already), so a
 * psum group whose K is not aligned owns rows its K does not need, never read. Packed UE8M0
 * scales give each group the packed rows of its own K (ceil(k_g / (4 gran_k))), as
 * dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor writes them and DeepGEMM's kernels
 * read them. With psum, an odd k_g's last pair holds one code
 * past the group, which must be zero (as DeepGEMM requires of its padding codes).
 * Numerics: FP4 x FP4 on exact integer dot products per scale block of 32 (dense-gemm section),
 * D = C + sum over blocks in order, float32 throughout.
 */
DG_API dg_status dg_k_grouped_fp4_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa,
                                                     const dg_tensor *b, const dg_tensor *sfb,
                                                     const dg_tensor *d, const int *ks, int num_ks,
                                                     const dg_tensor *grouped_layout, const dg_tensor *c,
                                                     const dg_gemm_options *opts);

/* @@SECTION mqa-logits: MQA logits, paged MQA logits, metadata (SPEC 5) @@ */

/*
 * Lightning-indexer logits (DeepSeek V3.2). For query token i and kv row j:
 *   logits[i, j] = sum_h relu(q[i, h, :] . kv[j, :]) * weights[i, h]
 * with q and kv dequantized. FP8: q is E4M3 without scale, kv is E4M3 with one float32
 * scale per row, applied (as DeepGEMM's kernels do) to the head sum:
 *   logits[i, j] = kv_sf[j] * sum_h relu(q[i, h, :] . kv_raw[j, :]) * weights[i, h]
 * (equal to relu(q . (kv * kv_sf)) for the non-negative scales the quantizer makes).
 * FP4 (MXFP4): q and kv are packed E2M1 with one UE8M0 scale per 32 elements of the head dim,
 * packed four to an int32 (byte g scales elements [32g, 32g + 32)), folded into the dot product.
 * MXFP8 (DeepGEMM 2.8): q and kv are E4M3 with the same packed per-32 UE8M0 scales, folded the
 * same way (no float32 kv scale). Which one a call is follows from q_sf and q's dtype.
 *
 * dg_fp8_fp4_mqa_logits(q, q_sf, kv, kv_sf, weights, ks, ke, clean_logits, max_seqlen_k, logits)
 *   q        FP8: FLOAT8_E4M3 [S, H, D], q_sf NULL.  FP4: FP4_E2M1X2 [S, H, D/2] with
 *            q_sf INT32 [S, H].  MXFP8: FLOAT8_E4M3 [S, H, D] with q_sf INT32 [S, H]. With q_sf,
 *            D is a multiple of 32, at most 128 (one int32 of scales). Contiguous.
 *   kv, kv_sf  FP8: FLOAT8_E4M3 [SK, D] and FLOAT32 [SK].  FP4: FP4_E2M1X2 [SK, D/2] and
 *            INT32 [SK] packed UE8M0.  MXFP8: FLOAT8_E4M3 [SK, D] and INT32 [SK] packed UE8M0.
 *            Contiguous. (The format must match q's.)
 *   weights  FLOAT32 [S, H], FLOAT16 (DeepGEMM 2.8; widened exactly to float32, so the logits
 *            are those of float32 weights of the same values), or BFLOAT16 when logits are
 *            BFLOAT16; unit stride along H.
 *   ks, ke   INT32 [S] (DeepGEMM's cu_seq_len_k_start/end), 0 <= ks[i] <= ke[i] <= SK.
 *   clean_logits  DeepGEMM's default is 1: entries outside [ks[i], ke[i]) become -inf; with 0
 *            they are left unwritten.
 *   max_seqlen_k  0 (DeepGEMM's default): logits are [S, SK]. > 0: "compressed" logits
 *            [S, max_seqlen_k], column c holding kv row ks[i] + c; needs ke[i] - ks[i] <=
 *            max_seqlen_k. (DeepGEMM refuses clean_logits here; the CPU writes -inf to columns
 *            c >= ke[i] - ks[i].)
 *   logits   FLOAT32 or BFLOAT16 (DeepGEMM's logits_dtype), unit stride along columns, any
 *            row stride >= the row length. Query form (data == NULL, dtype set to the wanted
 *            logits dtype): fills shape and DeepGEMM's padded strides (row stride aligned to
 *            1024 bytes: align(SK + 256, 1024 / elem) or align(align(max_seqlen_k, 256), ...)).
 * dg_fp8_mqa_logits is the legacy form: FP8 only, logits FLOAT32 (the query form fills it).
 * Any H >= 1 and D >= 1 are accepted (with q_sf: D % 32 == 0, D <= 128; DeepGEMM's GPUs take H
 * in {8..64}, D in {32, 64, 128}).
 */
DG_API dg_status dg_fp8_mqa_logits(const dg_tensor *q, const dg_tensor *kv, const dg_tensor *kv_sf,
                                   const dg_tensor *weights, const dg_tensor *cu_seq_len_k_start,
                                   const dg_tensor *cu_seq_len_k_end, int clean_logits, int max_seqlen_k,
                                   dg_tensor *logits);
DG_API dg_status dg_fp8_fp4_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv,
                                       const dg_tensor *kv_sf, const dg_tensor *weights,
                                       const dg_tensor *cu_seq_len_k_start, const dg_tensor *cu_seq_len_k_end,
                                       int clean_logits, int max_seqlen_k, dg_tensor *logits);

/*
 * Paged decoding. A batch of B sequences with next_n query tokens each; query row
 * r = b * next_n + t. The KV cache is paged in blocks of block_kv tokens:
 *   kv_cache  UINT8 [num_blocks, block_kv, 1, D + 4] (FP8, MXFP8) or [num_blocks, block_kv, 1,
 *             D/2 + 4] (FP4); strides[1] = last extent, strides[3] = 1, strides[0] a multiple of 4
 *             and >= block_kv * (last extent). Each block starts with block_kv rows of D E4M3
 *             bytes (FP4: D/2 packed bytes), followed by block_kv float32 scales (FP4, MXFP8:
 *             block_kv int32 packed UE8M0, one per token): the [block_kv, 1, D + 4] shape is only
 *             a view.
 *   block_table  INT32 [B, max_blocks], unit stride along blocks: logical block k of sequence b
 *             is cache block block_table[b, k] (entries past a sequence's length are not read).
 *   context_lens  INT32 [B]: token t of sequence b sees positions p < ctx[b] with
 *             p <= ctx[b] - next_n + t.  INT32 [B, next_n]: token t sees p < ctx[b, t]; the last
 *             token's length must be the largest (DeepGEMM schedules by it).
 *   indices   NULL, or INT32 [B] for variable-length batches (next_n must be 1): each row is one
 *             query token, and a run of equal indices marks tokens of one sequence, which
 *             DeepGEMM schedules together; within a run the last token's context must be the
 *             largest and the block_table rows must agree on the blocks each token reads.
 *   q         FP8: FLOAT8_E4M3 [B, next_n, H, D], q_sf NULL. FP4: FP4_E2M1X2 [B, next_n, H, D/2]
 *             and q_sf INT32 [B, next_n, H]. MXFP8: FLOAT8_E4M3 [B, next_n, H, D] and q_sf INT32
 *             [B, next_n, H] (the cache's scales are then packed UE8M0). Contiguous.
 *   weights   FLOAT32 or FLOAT16 [B * next_n, H] (BFLOAT16 when logits are BFLOAT16), unit stride along H
 *             (contiguous for FP8 without q_sf).
 *   schedule_meta  INT32 [dg_get_num_sms() + 1, 2] from dg_get_paged_mqa_logits_metadata; it is
 *             checked to equal that function's answer for these context_lens, indices and block_kv.
 *   max_context_len  the logits width; every context length must be <= it.
 *   clean_logits  DeepGEMM's default is 0 (invisible positions unwritten); 1 writes -inf there.
 *   logits    FLOAT32 or BFLOAT16 [B * next_n, max_context_len], unit column stride, row stride
 *             >= max_context_len. Query form: row stride align(align(max_context_len, 256),
 *             1024 / elem) as DeepGEMM allocates.
 *   logits[r, p] = sum_h relu(q[b, t, h, :] . kv(b, p)) * weights[r, h] for visible p.
 *
 * dg_get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices, schedule_meta):
 * splits the work into num_sms balanced parts. A request is a sequence (2-D lens: next_n tokens;
 * 1-D lens: counted as one unit, row coordinate = b; varlen: a run of equal indices); its work is
 * ceil(ctx_last / split) * tokens with split = align(256, block_kv). schedule_meta INT32
 * [num_sms + 1, 2]: row i = (first query row of the request where part i starts, kv split index
 * within it); the last row is (number of rows, 0). Query form supported. block_kv >= 1,
 * num_sms >= 1.
 */
DG_API dg_status dg_get_paged_mqa_logits_metadata(const dg_tensor *context_lens, int block_kv, int num_sms,
                                                  const dg_tensor *indices, dg_tensor *schedule_meta);
DG_API dg_status dg_fp8_paged_mqa_logits(const dg_tensor *q, const dg_tensor *kv_cache, const dg_tensor *weights,
                                         const dg_tensor *context_lens, const dg_tensor *block_table,
                                         const dg_tensor *schedule_meta, int max_context_len, int clean_logits,
                                         const dg_tensor *indices, dg_tensor *logits);
DG_API dg_status dg_fp8_fp4_paged_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv_cache,
                                             const dg_tensor *weights, const dg_tensor *context_lens,
                                             const dg_tensor *block_table, const dg_tensor *schedule_meta,
                                             int max_context_len, int clean_logits, const dg_tensor *indices,
                                             dg_tensor *logits);

/*
 * Scheduled prefill (DeepGEMM 2.8). dg_get_mqa_logits_metadata(ks, ke, num_kv_tokens, num_heads,
 * schedule_meta): ks, ke INT32 [S] contiguous with 0 <= ks[i] <= ke[i]; num_kv_tokens >= 1;
 * num_heads >= 1. schedule_meta INT32 [align(3 * n, 2) + 2 * ceil(S / block_q)], contiguous, with
 * n = dg_get_num_sms() and block_q = max(1, 128 / num_heads) (DeepGEMM's shape). Words 3p, 3p + 1,
 * 3p + 2 of part p < n: (query block, 256-row kv split within it) where the part starts and its
 * number of splits; then per query block b: the kv span [lo, hi) its rows cover, clamped to
 * [0, num_kv_tokens] ((0, 0) when every row is empty). Query form supported; S >= 1 (DeepGEMM's rule).
 * dg_fp8_fp4_mqa_logits_scheduled(..., schedule_meta, logits) is dg_fp8_fp4_mqa_logits with
 * DeepGEMM's schedule_meta argument (NULL: unscheduled): the metadata must equal what
 * dg_get_mqa_logits_metadata gives for these ks, ke, SK = kv rows, H and the current num_sms
 * (otherwise DG_ERR_VALUE); the logits are bitwise those of the unscheduled call (the CPU kernel
 * balances its threads itself; the schedule is checked, not followed).
 */
DG_API dg_status dg_get_mqa_logits_metadata(const dg_tensor *cu_seq_len_k_start, const dg_tensor *cu_seq_len_k_end,
                                            int num_kv_tokens, int num_heads, dg_tensor *schedule_meta);
DG_API dg_status dg_fp8_fp4_mqa_logits_scheduled(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv,
                                                 const dg_tensor *kv_sf, const dg_tensor *weights,
                                                 const dg_tensor *cu_seq_len_k_start,
                                                 const dg_tensor *cu_seq_len_k_end, int clean_logits,
                                                 int max_seqlen_k, const dg_tensor *schedule_meta,
                                                 dg_tensor *logits);

/*
 * Sparse lightning indexer (DeepGEMM 2.8): each query row scores only a list of KV blocks of
 * sparse_block_kv (8 or 16) tokens instead of its whole range.
 *   sparse_kv_block_indices  INT32 [S, N] contiguous, N = num_max_sparse_blocks, 0 < N <= 4096,
 *       N % 4 == 0. Row i uses its first nb(i) = min(N, ceil(len(i) / sparse_block_kv)) entries,
 *       len(i) = ke[i] - ks[i] (paged: context_lens[i]); the rest is padding and never read.
 *       DeepGEMM wants these unique and increasing; the CPU takes any values: an entry whose
 *       block has no token inside the row's range (e.g. -1) scores nothing (its columns are -inf).
 *   Block j of row i (entry idx = indices[i, j]) covers kv tokens t = start + o, o < sparse_block_kv:
 *       contiguous: start = idx * sparse_block_kv, plus ks[i] % sparse_block_kv with use_unaligned_ks
 *       (without it every non-empty row needs ks[i] % sparse_block_kv == 0, DG_ERR_VALUE otherwise);
 *       paged: start = idx * sparse_block_kv is a position of the row's sequence, read through
 *       block_table row i (page start / page_kv, token start % page_kv).
 *   logits  [S, N * sparse_block_kv], FLOAT32 or BFLOAT16 (DeepGEMM: BFLOAT16 only), unit column
 *       stride: column j * sparse_block_kv + o holds the logit of token t = start + o, bitwise the
 *       dense kernel's value for that (row, token) pair (dg_fp8_fp4_mqa_logits column t, resp.
 *       dg_fp8_fp4_paged_mqa_logits column t with 2-D context_lens), when j < nb(i) and
 *       ks[i] <= t < ke[i] (paged: 0 <= t < context_lens[i]); every other column is -inf (DeepGEMM
 *       leaves them unspecified). Query form: row stride align(N * sparse_block_kv, 1024 / elem).
 *   weights  [S, H] with unit stride along H: BFLOAT16 (DeepGEMM's only choice; BFLOAT16 logits),
 *       or FLOAT32 or FLOAT16 (widened exactly) with either logits dtype.
 *   q/kv formats: MXFP4 or MXFP8 as dg_fp8_fp4_mqa_logits (q FP4_E2M1X2 or FLOAT8_E4M3 with
 *       q_sf INT32, kv_sf INT32), DeepGEMM's two, or FP8 without q scale (q_sf NULL; kv float32
 *       per-row scales) as a CPU extra. Any H, D the dense kernels take (DeepGEMM: H = 32,
 *       D = 128).
 *
 * dg_get_sparse_mqa_logits_metadata(ks, ke, num_kv_tokens, sparse_kv_block_indices, qk_dtype,
 *     sparse_block_kv, use_unaligned_ks, metadata): ks, ke INT32 [S] contiguous with
 *     0 <= ks[i] <= ke[i] <= num_kv_tokens; qk_dtype FP4_E2M1X2 or FLOAT8_E4M3 (q's dtype).
 * dg_get_paged_sparse_mqa_logits_metadata(context_lens, block_table, indices, page_kv,
 *     sparse_kv_block_indices, qk_dtype, sparse_block_kv, metadata): context_lens INT32 with S
 *     elements, contiguous, >= 0; block_table INT32 [S, W >= 1] unit stride along W, row i the
 *     pages of query i's sequence, with ceil(context_lens[i] / page_kv) <= W; indices INT32 [S]
 *     contiguous (the request of each query; DeepGEMM pairs a request's queries, the CPU only
 *     checks the shape); page_kv >= 1 a multiple of sparse_block_kv.
 *   metadata  UINT8 1-D of DeepGEMM's size (header + KV splits + schedule entries for
 *     n = min(dg_get_num_sms(), 256); 32 bytes when S = 0, which DeepGEMM refuses), contiguous;
 *     query form supported. It holds the resolved blocks (each row's range and each block's
 *     first token and cache page), everything the logits call needs besides q, kv and weights;
 *     the layout is the CPU's own, not DeepGEMM's. Indices are read only in the metadata call.
 * dg_fp8_fp4_sparse_mqa_logits(q, q_sf, kv, kv_sf, weights, metadata, num_max_sparse_blocks,
 *     sparse_block_kv, use_unaligned_ks, logits): q [S, H, D(/2)], kv [SK, D(/2)] as
 *     dg_fp8_fp4_mqa_logits; every range must end within SK.
 * dg_fp8_fp4_paged_sparse_mqa_logits(q, q_sf, kv_cache, weights, metadata, num_max_sparse_blocks,
 *     sparse_block_kv, logits): q [S, 1, H, D(/2)], q_sf [S, 1, H], kv_cache as
 *     dg_fp8_fp4_paged_mqa_logits with block_kv == page_kv; every page read must exist.
 *   The metadata is checked against the call (its kind, S, N, sparse_block_kv, qk dtype,
 *   use_unaligned_ks, page_kv, size, and every range and page it names): DG_ERR_VALUE otherwise.
 *   The same bits for any thread count and ISA level generic/avx2 vs the dense kernels' bits at
 *   that level.
 */
DG_API dg_status dg_get_sparse_mqa_logits_metadata(const dg_tensor *cu_seq_len_k_start,
                                                   const dg_tensor *cu_seq_len_k_end, int num_kv_tokens,
                                                   const dg_tensor *sparse_kv_block_indices, dg_dtype qk_dtype,
                                                   int sparse_block_kv, int use_unaligned_ks, dg_tensor *metadata);
DG_API dg_status dg_get_paged_sparse_mqa_logits_metadata(const dg_tensor *context_lens, const dg_tensor *block_table,
                                                         const dg_tensor *indices, int page_kv,
                                                         const dg_tensor *sparse_kv_block_indices, dg_dtype qk_dtype,
                                                         int sparse_block_kv, dg_tensor *metadata);
DG_API dg_status dg_fp8_fp4_sparse_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *kv,
                                              const dg_tensor *kv_sf, const dg_tensor *weights,
                                              const dg_tensor *metadata, int num_max_sparse_blocks,
                                              int sparse_block_kv, int use_unaligned_ks, dg_tensor *logits);
DG_API dg_status dg_fp8_fp4_paged_sparse_mqa_logits(const dg_tensor *q, const dg_tensor *q_sf,
                                                    const dg_tensor *kv_cache, const dg_tensor *weights,
                                                    const dg_tensor *metadata, int num_max_sparse_blocks,
                                                    int sparse_block_kv, dg_tensor *logits);

/* @@SECTION hc-einsum-layout: HC prenorm, einsum, scale-factor layouts (SPEC 6-8) @@ */

/*
 * Hyper-connection prenorm GEMM (mHC): a BFLOAT16 [M, K] and b FLOAT32 [N, K], both with unit
 * stride along K; d FLOAT32 with unit stride along N; sqr_sum FLOAT32 contiguous.
 *   num_splits <= 0 (DeepGEMM's None): d [M, N] = a @ b^T, sqr_sum [M] = sum_k a[m, k]^2.
 *   num_splits >= 1: d [num_splits, M, N], sqr_sum [num_splits, M]; split s holds the partial
 *   sums over its K range. K is cut into blocks of 64 (the last one may be short); with
 *   nb = ceil(K / 64) blocks, split s takes nb / num_splits blocks, one more when
 *   s < nb % num_splits, in order (DeepGEMM's split). Splits without blocks are zero.
 * N > 0 and K > 0 are required; M = 0 does nothing. Unlike the GPU, any N and K are accepted.
 * Float32 FMAs, no TF32 rounding (calc_diff against float64 far below DeepGEMM's 1e-8); the same
 * bits for any thread count and row of M. The reference backend rounds exact (double) sums once.
 * Bits across ISA levels: each output is held as L partial sums (lane l: the terms k = l mod L
 * of its split, in increasing k) added in a fixed order at the end, with L = 8 on the portable
 * and AVX2 levels (the same bits, tested) and L = 16 on the AVX-512 levels; AMX runs its own
 * tile order. So generic/AVX2 and AVX-512 differ in the last bits (a different summation tree,
 * both within float32 rounding of the exact sum): a wider lane count is what makes the AVX-512
 * kernel fast, so it is kept and stated here.
 */
DG_API dg_status dg_tf32_hc_prenorm_gemm(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                         const dg_tensor *sqr_sum, int num_splits);

/*
 * Mega mHC (DeepGEMM 2.8's mega_mhc): one hyper-connection boundary between two sublayers, per
 * token t (hc = hc_mult routes, H = hidden, N = hc * (hc + 2) mixes):
 *   1. post of the finished sublayer: new_residual[t, j, h] =
 *        bf16(x[t, h] * post_mix[t, j] + sum_i comb_res_mix[t, i, j] * residual[t, i, h]);
 *   2. the next pre's prenorm GEMM on new_residual flattened to [T, hc * H]:
 *        mix[t, n] = new_residual[t] . fn[n], sqr[t] = sum new_residual[t]^2 (as tf32_hc_prenorm_gemm);
 *   3. mix[t, n] = (mix * rsqrt(sqr / (hc * H) + hc_norm_eps)) * scale[n] + mix_bases[n], with
 *      scale = mix_scales[0] for n < hc (pre), [1] for hc <= n < 2 hc (post), [2] for the rest;
 *      pre[j] = sigmoid(mix[j]) + hc_pre_eps; new_post_mix[t, j] = sigmoid(mix[hc + j]) *
 *      hc_post_scale; new_comb_res_mix[t] = Sinkhorn of the hc x hc matrix mix[2 hc + i hc + j]:
 *      softmax over j, + sinkhorn_eps, columns divided by (column sum + sinkhorn_eps), then
 *      num_sinkhorn_iters - 1 times rows then columns divided by (their sum + sinkhorn_eps);
 *   4. collapse: c[h] = bf16(sum_j w[j] * new_residual[t, j, h]) with w = shifted_prev_mix[t]
 *      (shifted mHC) or this call's pre (normal mHC); RMSNorm:
 *        y[t, h] = bf16((c[h] * rsqrt(mean_h c^2 + rmsnorm_eps)) * (rmsnorm_weight[h] * rmsnorm_scale));
 *      y_fp8 / its scales: y quantized per 32 elements (amax clamped at 1e-4, UE8M0 scale
 *      ceil_pow2(amax / 448), e4m3(y / scale)), four scale bytes packed per INT32 word
 *      (per_token_cast_to_fp8(y, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)).
 * Shifted mHC: shifted_prev_mix and new_prev_mix both given (new_prev_mix = pre); normal: both NULL.
 * Tensors (all contiguous unless stated):
 *   x BFLOAT16 [T, H]; residual BFLOAT16 [T, hc, H]; shifted_prev_mix, post_mix FLOAT32 [T, hc, 1];
 *   comb_res_mix FLOAT32 [T, hc, hc]; fn FLOAT32 [N, hc * H]; mix_scales FLOAT32 [3];
 *   mix_bases FLOAT32 [N]; rmsnorm_weight BFLOAT16 [H]; outputs new_residual like residual,
 *   new_prev_mix / new_post_mix like post_mix, new_comb_res_mix like comb_res_mix;
 *   y_bf16 BFLOAT16 [T, H] and/or y_fp8 FLOAT8_E4M3 [T, H] (at least one; y_fp8 needs
 *   H % 128 == 0). With y_fp8 give either y_gemm_sf alone (INT32 [T, H / 128], strides
 *   (1, S) with S >= T and S % 4 == 0: DeepGEMM's TMA-aligned column-major SF) or y_routed_sf
 *   (INT32 [T, H / 128] contiguous) together with y_shared_sf (INT32 [T, H / 128], strides (1, S)
 *   with S >= R = ceil(T / shared_sf_block_m) * align(shared_sf_block_m, 128)): Mega MoE's
 *   shared-expert layout, token t's words at row shared_sf_row(t) = t / B * align(B, 128) +
 *   (t % B) / 128 * 128 + (t % B) % 32 * 4 + (t % B) % 128 / 32 (B = shared_sf_block_m > 0).
 *   Rows of y_shared_sf beyond T are written: its memory must hold R rows per column (the view
 *   of DeepGEMM's storage[:T]); rows that belong to no token are left as they were.
 *   shared_sf_block_m must be 0 without y_shared_sf. Outputs may not overlap inputs or each other.
 * Numerics (the reference, DG_BACKEND=reference, is the spec): float32 operations in the order
 * written above; the sums over routes left to right; softmax subtracts the row max; exp and
 * sigmoid are the library's own float32 functions (src/core/float_math.h, the same bits on every
 * machine and C library; sigmoid(v) = 1 / (1 + e^-v)); rsqrt(v) is 1 / sqrtf(v); mean_h c^2 is 8 partial sums (lane l takes
 * h = l mod 8 in increasing h) added ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), over H.
 * Step 2 is the prenorm GEMM of each backend: the reference rounds exact sums once, the fast path
 * runs tf32_hc_prenorm_gemm's engine (its bits per ISA level, see above). So the two backends
 * agree bit for bit on new_residual, and on every output whenever the GEMM's sums are exact in
 * float32; otherwise they differ by the GEMM's float32 rounding carried through steps 3-4
 * (tested: calc_diff < 1e-9 on the mixes, DeepGEMM's 5e-5 / 2e-4 on y). Same bits for any thread
 * count and for a token whatever T.
 * Unlike the GPU (hc_mult == 4, H % 1024 == 0, T <= 2^20, SM100 only), any hc_mult in
 * 1..DG_MEGA_MHC_MAX_HC_MULT, H > 0 and T >= 0 are accepted; num_sinkhorn_iters must be >= 1.
 * T = 0 (valid arguments) does nothing. DeepGEMM's split-K choice has no CPU meaning.
 * Errors: DG_ERR_NULL_POINTER, DG_ERR_DTYPE, DG_ERR_SHAPE, DG_ERR_LAYOUT (strides, overlap),
 * DG_ERR_VALUE (hc_mult, num_sinkhorn_iters, shared_sf_block_m, the optional-output rules),
 * DG_ERR_OVERFLOW; nothing is written. DG_ERR_ALLOC: scratch memory; when the GEMM engine's own
 * scratch fails, new_residual (written before the GEMM reads it) holds its result and nothing else
 * is written.
 */
#define DG_MEGA_MHC_MAX_HC_MULT 8
DG_API dg_status dg_mega_mhc(const dg_tensor *x, const dg_tensor *residual, const dg_tensor *shifted_prev_mix,
                             const dg_tensor *post_mix, const dg_tensor *comb_res_mix, const dg_tensor *fn,
                             const dg_tensor *mix_scales, const dg_tensor *mix_bases, int hc_mult,
                             float hc_norm_eps, float hc_pre_eps, float hc_post_scale, float sinkhorn_eps,
                             int num_sinkhorn_iters, const dg_tensor *rmsnorm_weight, float rmsnorm_eps,
                             float rmsnorm_scale, const dg_tensor *new_residual, const dg_tensor *new_prev_mix,
                             const dg_tensor *new_post_mix, const dg_tensor *new_comb_res_mix,
                             const dg_tensor *y_bf16, const dg_tensor *y_fp8, const dg_tensor *y_gemm_sf,
                             const dg_tensor *y_routed_sf, const dg_tensor *y_shared_sf, int shared_sf_block_m);

/*
 * BF16 einsum; a and b are BFLOAT16 and c (optional) has d's dtype. Supported expressions:
 *   "bmk,bnk->mn":  a [S, M, K], b [S, N, K], d [M, N] = c + sum_{s,k} a[s,m,k] b[s,n,k].
 *                   a, b, d contiguous. d FLOAT32: c may be absent, the very same view as d
 *                   (DeepGEMM's accumulate form) or a contiguous non-overlapping [M, N];
 *                   d BFLOAT16: c must be absent.
 *   "bhr,hdr->bhd": a [B, H, R], b [H, D, R], d [B, H, D] BFLOAT16, no c.
 *   "bhd,hdr->bhr": a [B, H, D], b [H, D, R], d [B, H, R] BFLOAT16, no c.
 *                   For these two, every tensor needs unit stride in its last dimension; other
 *                   strides are free (b may be a slice such as fy[:, :, :R]).
 * Any other expression gives DG_ERR_VALUE. (DeepGEMM's use_cublaslt flag has no CPU meaning.)
 * Numerics: the dense GEMMs' blocks of 128 (above; 'bmk,bnk->mn' with its group sums). On AMX
 * each block is one tile chain and the block sums are added in float64 (per 512 k of the
 * contraction ((b0 + b1) + (b2 + b3)), absent blocks left out, then in order), rounded to
 * float32 once, then D = round(c + sum): more accurate than the dense GEMMs' one tile chain
 * there, and than PyTorch's BF16 einsum on upstream's cases (README, "Accuracy"), at some
 * speed on long contractions. Deterministic and batch-invariant on every level.
 */
DG_API dg_status dg_einsum(const char *expr, const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                           const dg_tensor *c);

/*
 * FP8 einsum: (a, sfa) and (b, sfb) are FLOAT8_E4M3 with scales (FLOAT32 of any strides, or
 * INT32 packed UE8M0 where the granularity along MN is 1); d BFLOAT16 or FLOAT32 with unit
 * stride in its last dimension; c optional, d's dtype, may be the very same view as d.
 * recipe = (gran_m, gran_n, gran_k), NULL = DeepGEMM's default (1, 128, 128). Each expression is
 * a batched GEMM D[g] = C[g] + A[g] @ B[g]^T over a permuted view, as DeepGEMM does it:
 *   "bhr,hdr->bhd": a [B, H, R], sfa [B, H, ceil(R/gk)]; b [H, D, R], sfb [H, ceil(D/gn), ceil(R/gk)];
 *                   d, c [B, H, D]   (per-token a, per-block b with the default recipe)
 *   "bhd,hdr->bhr": a [B, H, D], sfa [B, H, ceil(D/gk)]; b [H, D, R], sfb [H, ceil(D/gk), ceil(R/gn)];
 *                   d, c [B, H, R]
 *   "bhd,bhr->hdr": a [B, H, D], sfa [ceil(B/gk), H, ceil(D/gm)]; b [B, H, R],
 *                   sfb [ceil(B/gk), H, ceil(R/gn)]; d, c [H, D, R]   (use recipe (1, 1, 128))
 * a and b need a unit stride along K or along M/N of the permuted view. Float32 scales are applied
 * exactly as given (no UE8M0 rounding is required or applied).
 */
DG_API dg_status dg_fp8_einsum(const char *expr, const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                               const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                               const int *recipe);

/*
 * Scale-factor layouts. All produce the very tensors DeepGEMM produces (values, shapes and
 * strides, in elements). Each output uses the query form: with out->data == NULL the function
 * fills out's dtype, ndim, shape and strides and returns; then allocate dg_tensor_nbytes(out)
 * bytes, set out->data and call again. A given out must have exactly those dtype, shape and
 * strides, and must not overlap the input. Only elements are written: the padding between
 * MN-major columns (rows mn .. tma_aligned_mn - 1) is left as it is, as on the GPU.
 *
 * "TMA-aligned MN-major" for sf [(G,) MN, SK]: strides ((A * SK,) 1, A) with
 * A = dg_get_tma_aligned_size(MN, element size), i.e. MN padded to 16 bytes.
 * "Packed UE8M0": INT32, byte j of element [.., i, q] = the exponent byte (bits 23..30) of
 * float scale [.., i, 4q + j] (0 beyond SK); the float scales must be powers of two or zero
 * (sign and mantissa bits zero), otherwise DG_ERR_VALUE.
 */
/* *out = align(x, 16 / element_size); element_size must divide 16; x >= 0. */
DG_API dg_status dg_get_tma_aligned_size(int x, int element_size, int *out);
/* FLOAT32 sf [(G,) MN, SK] of any strides -> FLOAT32, same shape, TMA-aligned MN-major. */
DG_API dg_status dg_get_mn_major_tma_aligned_tensor(const dg_tensor *sf, dg_tensor *out);
/*
 * FLOAT32 sf [(G,) MN, SK] of any strides -> INT32 [(G,) MN, ceil(SK/4)] packed UE8M0,
 * TMA-aligned MN-major. psum_layout (optional, INT32 contiguous, non-empty, non-decreasing end
 * rows of m-grouped contiguous groups; needs a contiguous sf of one batch): rows outside every
 * [align(end[g-1], dg_get_mk_alignment_for_contiguous_layout()), end[g]) are gap rows; they
 * become 0 and their values are not checked.
 */
DG_API dg_status dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(const dg_tensor *sf, const dg_tensor *psum_layout,
                                                                 dg_tensor *out);
/*
 * K-grouped weight-gradient scales: FLOAT32 sf [SK, MN] contiguous (rows = K blocks of all groups
 * one after the other, MN % 4 == 0) -> INT32 [PK, MN] contiguous, each group's rows packed by 4
 * along K separately (a group's last packed row is padded with zero bytes).
 * grouped_layout: INT32 contiguous [G], G <= 128: the groups' K sizes, or with use_psum_layout
 * their end offsets (group g spans K [align(end[g-1], k_alignment), end[g])). ks (num_ks entries,
 * host copy of the K sizes; NULL or num_ks == 0 = not given, then use_psum_layout is required)
 * sizes the output: PK = sum ceil(ks[g] / (4 gran_k)), or (SK + 3 G) / 4 without ks. Packed rows
 * past the last group's are 0. gran_k is 32 or 128; k_alignment a multiple of 32.
 * With use_psum_layout, group g's input rows are those of its K aligned up to k_alignment
 * (DeepGEMM's layout: each group cast padded to its aligned K), of which the first
 * ceil(K_g / gran_k) are packed: ceil(K_g / (4 gran_k)) packed rows per group.
 */
DG_API dg_status dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
    const dg_tensor *sf, const dg_tensor *grouped_layout, const int *ks, int num_ks, int gran_k,
    int k_alignment, int use_psum_layout, dg_tensor *out);
/*
 * DeepGEMM's scale preparation for its kernels. recipe: recipe_len 3 ((gran_m, gran_n, gran_k),
 * is_sfa 0 or 1 picks gran_m or gran_n) or 2 ((gran_mn, gran_k), is_sfa must be -1 = None).
 * num_groups <= 0 = None (sf 2-D), else sf is [num_groups, ., .]. sf must be
 * [(G,) ceil(mn/gran_mn), ceil(k/gran_k)] FLOAT32 or [(G,) mn, ceil(k/(4 gran_k))] INT32.
 * The CPU library answers as DeepGEMM does on SM100 GPUs:
 *   - FLOAT32 with gran_k 32 or 128 -> rows broadcast to mn (row i uses row i / gran_mn), then
 *     dg_get_mn_major_tma_aligned_packed_ue8m0_tensor (psum_layout passed on);
 *   - INT32 with gran_mn 1 and gran_k 32 or 128 -> checked to be TMA-aligned MN-major, copied;
 * except that with disable_ue8m0_cast it answers as on SM90 GPUs:
 *   - FLOAT32 (1, 128) -> dg_get_mn_major_tma_aligned_tensor;
 *   - FLOAT32 (128, 128) -> checked to be contiguous or contiguous after swapping its last two
 *     dimensions, copied (same shape and strides).
 * Anything else is DG_ERR_VALUE ("unknown SF transformation"). Where DeepGEMM returns sf itself,
 * out is a copy of sf with sf's shape and strides.
 */
DG_API dg_status dg_transform_sf_into_required_layout(const dg_tensor *sf, int64_t mn, int64_t k,
                                                      const int *recipe, int recipe_len, int num_groups,
                                                      int is_sfa, int disable_ue8m0_cast,
                                                      const dg_tensor *psum_layout, dg_tensor *out);

/* @@SECTION mega-gate: BF16 router GEMM + MoE top-k gate (DeepGEMM 2.8's bf16_mega_gate) @@ */

/*
 * dg_bf16_mega_gate: the MoE router of one layer in one call. Per token t:
 *   logits[t, e] = x[t, :] . weight[e, :]          float32, see "Numerics"
 *   score[t, e]  = f(logits[t, e])                 f by scoring_func:
 *       "identity"      f(v) = v                   (DeepGEMM's default; NULL means it too)
 *       "sigmoid"       f(v) = 1 / (1 + e^-v)
 *       "sqrtsoftplus"  f(v) = sqrtf(log(1 + e^v))    (sqrtf(v) from v ~ 14.6)
 *   e^v, sigmoid and softplus are the library's own float32 functions (src/core/float_math.h:
 *   a fixed sequence of IEEE operations, within 2.5 ulp; sqrtsoftplus within 2 ulp while the
 *   softplus is a normal float), so the
 *   scores are the same bits on every machine, C library and ISA level.
 *   rank[t, e]   = score[t, e] + b[e] when bias or image_bias is given, where b is image_bias
 *                  for tokens with image_token_mask[t] set, else bias (zeros when bias is NULL);
 *                  otherwise rank[t, e] = logits[t, e] (f is increasing: DeepGEMM ranks the
 *                  raw logits then, so saturated scores still rank by logit).
 *   The K = num_topk experts of largest rank, best first; equal ranks go to the lower expert
 *   index. NaN and -inf ranks are never chosen; a slot left without a candidate holds
 *   expert 0 (DeepGEMM's clamp).
 *   topk_weights[t, j] = (score[t, sel_j] / (sum_{i<K} score[t, sel_i] + 1e-20f)) * routed_scaling_factor
 *                  for j < K, the sum in float32 in slot order; the weights use the unbiased scores.
 * Shared experts as routed (use_shared_as_routed != 0): S = num_shared_experts (1 or 2) slots
 * follow the K routed ones: slot K + s holds logical expert E + s with weight 1.0. Otherwise S = 0
 * and num_shared_experts is ignored. K' = K + S; the E + S logical experts are numbered
 * 0 .. E + S - 1.
 * Per-token controls, in priority order:
 *   mask[t] == 0          the token is not routed: topk_idx = -1, topk_weights = 0 in all K' slots,
 *                         unmapped_topk_idx = -1 in its K slots.
 *   force_random[t] != 0  K' distinct experts drawn uniformly from [0, P) (P = E + S, or with a
 *                         physical map the sum of logical_count) written to topk_idx as they are
 *                         (already physical), weights uniform in (0, 1], unmapped_topk_idx = -1.
 *                         The draws are a counter-based hash of (ep_rank, t, slot), so a call
 *                         repeats its bits; they are not DeepGEMM's curand (Philox) sequence.
 *   fix_routing_mask[t]   the K routed experts are read from unmapped_topk_idx[t, :] (each in
 *                         [0, E)) instead of ranked; weights as above from their scores.
 * Physical map (to_physical_map [E + S, D] INT32 with logical_count [E + S] INT32, both or
 * neither): the logical expert l of slot j is written to topk_idx as
 *   to_physical_map[l, ((uint32)ep_rank + (uint32)t * 23333u) % logical_count[l]]
 * (DeepGEMM's spread of a logical expert's tokens over its replicas; the product wraps modulo
 * 2^32 as there); without a map topk_idx holds l. unmapped_topk_idx (optional output) receives
 * the K logical routed experts.
 *
 * Tensors (DeepGEMM's mask dtype torch.bool is DG_UINT8 here: nonzero is true):
 *   x                 [T, H] BFLOAT16 contiguous; weight [E, H] BFLOAT16 contiguous.
 *   mask, image_token_mask, fix_routing_mask, force_random   NULL or [T] UINT8 contiguous.
 *   bias, image_bias  NULL or [E] FLOAT32 contiguous; image_bias and image_token_mask both or neither.
 *   unmapped_topk_idx NULL or [T, K] INT64 with unit stride along K (any row stride); required
 *                     when fix_routing_mask is given (it is then read, then written).
 *   topk_idx          [T, K'] INT64 contiguous, written; topk_weights [T, K'] FLOAT32 contiguous,
 *                     written. Outputs must not overlap each other or any input.
 * Limits (DeepGEMM's): H > 0 and H % 256 == 0; 0 < E <= 512 and E % 4 == 0; 0 < K <= E and
 * K <= 32; K' <= 32; ep_rank >= 0; routed_scaling_factor finite; with use_shared_as_routed,
 * S in {1, 2}, K % S == 0 and E % (K / S) == 0; T <= 2^20 (T = 0 does nothing); every
 * logical_count entry in [1, D]; fixed routing entries in [0, E) (P >= K' always holds: K <= E
 * and every count is at least 1). Contents are checked before anything is written (DG_ERR_VALUE names
 * the tensor); DeepGEMM checks them on the device, if at all.
 * Errors: DG_ERR_NULL_POINTER, DG_ERR_DTYPE, DG_ERR_SHAPE, DG_ERR_LAYOUT (non-contiguous,
 * overlapping outputs), DG_ERR_VALUE (limits, scoring_func, contents), DG_ERR_ALLOC (nothing
 * written, except that with T > block_tokens earlier chunks of tokens may be).
 *
 * Numerics: logits follow the BF16 engine's order (see dg_bf16_gemm_nt; products of BF16
 * values are exact): per block of 128 k, acc = 0; for each k pair p of the block:
 * acc = fma(x[2p+1], w[2p+1], acc); acc = fma(x[2p], w[2p], acc); then total += acc over the
 * blocks in order; logit = 0.0f + total. The reference backend computes exactly this in
 * scalar code, so the fast path (the engine's GEMM over chunks of tokens, then the gate per
 * token) gives the same bits as the reference at the generic and AVX2 levels (tested)
 * and on AVX-512; where the engine runs VDPBF16PS (denormal products flushed) or AMX tiles
 * (their own summation), logits may differ in the last bits and so weights, and the choice
 * between near-tied experts. The scoring functions are the same bits at every level (their vector
 * versions run float_math.h's operations lane by lane). Any thread count and
 * any T give the same bits for a token (the gate is per token, K is never split).
 */
DG_API dg_status dg_bf16_mega_gate(const dg_tensor *x, const dg_tensor *weight, int num_topk,
                                   int use_shared_as_routed, int num_shared_experts,
                                   float routed_scaling_factor, int ep_rank, const char *scoring_func,
                                   const dg_tensor *mask, const dg_tensor *bias, const dg_tensor *image_bias,
                                   const dg_tensor *image_token_mask, const dg_tensor *fix_routing_mask,
                                   const dg_tensor *to_physical_map, const dg_tensor *logical_count,
                                   const dg_tensor *unmapped_topk_idx, const dg_tensor *force_random,
                                   const dg_tensor *topk_idx, const dg_tensor *topk_weights);

/*
 * DeepGEMM's get_bf16_mega_gate_config: the schedule dg_bf16_mega_gate uses for a problem, with
 * DeepGEMM's keys given their CPU meaning:
 *   block_tokens         tokens per chunk: the router GEMM runs over this many tokens at a time
 *                        into a float32 scratch [block_tokens, E], then the gate ranks them
 *                        (min(T, 1024)).
 *   num_mma_ctas         1: each logit is one thread's dot product (no CTA pairs on a CPU).
 *   num_split_k          1: K (hidden) is never split, always (so also under
 *                        use_deterministic_algorithms, as DeepGEMM's test asserts).
 *   num_expert_groups    1: a token's experts are all ranked in one pass.
 *   num_gate_warpgroups  threads ranking the tokens of a chunk: min(num_sms, block_tokens).
 *   num_sms              threads the call uses: dg_get_num_sms().
 * Errors as DeepGEMM's: T in [1, 2^20], H > 0 and H % 256 == 0, E in (0, 512] with E % 4 == 0,
 * K in (0, min(E, 32)]; otherwise DG_ERR_VALUE naming the argument.
 */
typedef struct dg_mega_gate_config {
    int block_tokens, num_mma_ctas, num_split_k, num_expert_groups, num_gate_warpgroups, num_sms;
} dg_mega_gate_config;
DG_API dg_status dg_get_bf16_mega_gate_config(int64_t num_tokens, int64_t hidden, int64_t num_routed_experts,
                                              int64_t num_topk, dg_mega_gate_config *out);

/* @@SECTION mega-moe: fused expert-parallel MoE (SPEC 9) @@ */

/*
 * Mega MoE references: what DeepGEMM's fp8_fp4_mega_moe / bf16_mega_moe compute, as the literal
 * unfused chain, for R ranks simulated in one process. DeepGEMM's kernels reach their peers
 * through a symmetric buffer; a CPU process has none, so every per-rank argument here is an
 * array of R tensor pointers, entry r belonging to rank r. Rank r owns the E/R experts
 * [r*E/R, (r+1)*E/R). T_r (tokens) may differ between ranks; H (hidden), I (intermediate),
 * K (top-k) and E are common. Weights use the layout BEFORE transform_weights_for_mega_moe.
 * H and I need not be multiples of 32 (DeepGEMM's GPU kernels want multiples of 128): a last
 * partial 1x32 group has its own scale. FP4 needs H and I even.
 *
 *   x[r]             [T_r, H]: FLOAT8_E4M3 with x_sf[r] = per-1x32 UE8M0 scales, INT32 packed
 *                    [T_r, ceil(H/128)] (DeepGEMM's buffer.x_sf) or FLOAT32 [T_r, ceil(H/32)];
 *                    BFLOAT16 in the bf16 variant. Any strides.
 *   topk_idx[r]      [T_r, K] INT64 (DeepGEMM's buffer dtype) or INT32, values in [-1, E);
 *                    -1 = no expert.
 *   topk_weights[r]  [T_r, K] FLOAT32.
 *   l1_weights[r]    [E/R, 2I, H]: rows [0, I) gate, [I, 2I) up. Packed FP4 (DG_FP4_E2M1X2
 *                    [E/R, 2I, H/2], unit stride along H) with l1_weights_sf[r] = per-1x32 UE8M0
 *                    scales, INT32 packed [E/R, 2I, ceil(H/128)] of any strides (e.g. DeepGEMM's
 *                    MN-major TMA-aligned layout) or FLOAT32 [E/R, 2I, ceil(H/32)];
 *                    BFLOAT16 (any strides) in the bf16 variant.
 *   l2_weights[r]    [E/R, H, I], likewise (scales per 1x32 along I).
 *   y[r]             [T_r, H] BFLOAT16, written.
 *   cumulative_local_expert_recv_stats  NULL (DeepGEMM's None) or R contiguous INT32 [E/R]:
 *                    entry e is INCREASED by the number of (token, slot) pairs of all ranks routed
 *                    to local expert e (wrapping modulo 2^32).
 *   activation_clamp INFINITY (math.h) means none, DeepGEMM's default; otherwise >= 0.
 *
 * For every (source rank s, token t, slot j) with e = topk_idx[s][t, j] >= 0, on the rank owning e:
 *   1. h = x[s][t] . W1[e]^T: exact products summed in double, rounded to float32, then to BF16;
 *   2. gate = h[:I], up = h[I:]; with c = BF16(activation_clamp), as DeepGEMM's fused kernel:
 *      gate = min(gate, c), up = min(max(up, -c), c) (skipped when there is no clamp);
 *   3. a = ((gate / (1 + e^-gate)) * up) * topk_weights[s][t, j], float32, e^x the library's own
 *      (src/core/float_math.h: within 1.1 ulp, the same bits on every machine and C library; not
 *      DeepGEMM's fast_math approximations);
 *   4. FP8: per 32 consecutive values amax = max(max|a|, 1e-4), sf = ceil_to_ue8m0(amax / 448),
 *      a = e4m3(a * (1 / sf)) * sf (per_token_cast_to_fp8, gran_k 32, UE8M0). BF16: a = bf16(a);
 *   5. o = a . W2[e]^T as in step 1, BF16;
 *   6. combine on rank s: y[s][t] = BF16(float32 sum, starting from +0, of o over the slots j
 *      with topk_idx >= 0 in increasing j). A token without experts gets y = 0.
 * On error nothing is written.
 */
DG_API dg_status dg_fp8_fp4_mega_moe_reference(
    int num_ranks, int num_experts, const dg_tensor *const *x, const dg_tensor *const *x_sf,
    const dg_tensor *const *topk_idx, const dg_tensor *const *topk_weights,
    const dg_tensor *const *l1_weights, const dg_tensor *const *l1_weights_sf,
    const dg_tensor *const *l2_weights, const dg_tensor *const *l2_weights_sf,
    const dg_tensor *const *y, const dg_tensor *const *cumulative_local_expert_recv_stats,
    float activation_clamp);
DG_API dg_status dg_bf16_mega_moe_reference(
    int num_ranks, int num_experts, const dg_tensor *const *x, const dg_tensor *const *topk_idx,
    const dg_tensor *const *topk_weights, const dg_tensor *const *l1_weights,
    const dg_tensor *const *l2_weights, const dg_tensor *const *y,
    const dg_tensor *const *cumulative_local_expert_recv_stats, float activation_clamp);

/*
 * Expert-parallel Mega MoE across processes (DeepGEMM's get_symm_buffer_for_mega_moe,
 * fp8_fp4_mega_moe, bf16_mega_moe). Each of R ranks (processes) owns E/R consecutive experts and
 * a symmetric buffer: a POSIX shared-memory segment of the same layout on every rank, mapped by
 * every rank of the machine. A call computes, for the tokens every rank placed in its buffer,
 * exactly the chain of dg_fp8_fp4_mega_moe_reference above (steps 1-6), with these kernels:
 *   1. dispatch: each rank reads the (token, slot) pairs routed to its experts straight from
 *      the peers' buffers, in (source rank, token, slot) order;
 *   2./5. per local expert (in waves of rows), its rows gathered and multiplied by dg_fp8_fp4_gemm_nt
 *      (recipe (1, 1, 32)) or dg_bf16_gemm_nt, so both GEMMs give bitwise the rows of the
 *      m-grouped contiguous GEMMs on the gathered layout (batch invariance);
 *   3./4. SwiGLU, clamp, top-k weight and the activation quantisation as the reference states,
 *      the activations' UE8M0 scales handed to the L2 GEMM packed four per INT32 word (as
 *      per_token_cast_to_fp8(..., use_ue8m0 = 1, gran_k = 32, use_packed_ue8m0 = 1) gives them:
 *      the GEMMs fold packed power-of-two scales into A, one accumulation chain over K, where
 *      float32 scales keep a per-block epilogue; the unfused chain that y equals bitwise passes
 *      them packed too);
 *   6. the expert output rows are written into the source rank's combine area and summed there
 *      in slot order (the reference's combine, the one order).
 * So y is bitwise the same for any R, any thread count and any split of the tokens, and equal
 * to the unfused chain built from the public GEMMs; against the reference's double sums it
 * agrees within DeepGEMM's calc_diff thresholds.
 *
 * Creating a buffer is collective and takes three steps with a barrier of the caller's
 * bootstrap (MPI, torch.distributed, mpi4py) between them: dg_symm_buffer_create (every rank,
 * the same `name`), barrier, dg_symm_buffer_attach (maps the peers, checks that every rank
 * passed the same configuration: a mismatch fails on every rank), barrier,
 * dg_symm_buffer_seal (removes the segment names; the mappings stay). The calls are collective
 * too: every rank calls with its own y; ranks synchronise through counters in the segments.
 * Failures are errors on every rank, never a hang: a rank whose arguments are invalid fails
 * with its message and its peers fail with DG_ERR_VALUE naming it; topk_idx entries outside
 * [-1, E) on any rank fail on every rank; a rank that exited or did not arrive within
 * DG_COMM_TIMEOUT seconds (default 60) fails the others with DG_ERR_COMM. y and the stats are
 * written only when every rank succeeded.
 * dg_symm_buffer_create_mpi does the three steps over an MPI communicator (the library's MPI
 * build). When its ranks span several machines, or DG_COMM_FORCE_NETWORK=1, every exchange of
 * the calls goes through MPI instead (the network path: the same results, bitwise; a rank that
 * dies is then MPI's to handle, which aborts the job, and DG_COMM_TIMEOUT does not apply).
 */
typedef enum dg_mega_moe_mma {
    DG_MEGA_MOE_FP8XFP4 = 0,  /* DeepGEMM's mma_type 'fp8xfp4' */
    DG_MEGA_MOE_BF16XBF16 = 1, /* 'bf16xbf16' */
    DG_MEGA_MOE_FP8XFP8 = 2,   /* 'fp8xfp8': FP8 tokens and FP8 routed weights (DeepGEMM 2.8), the
                                * FP8 x FP4 calls with FLOAT8_E4M3 L1 / L2 and per-1x32 scales */
    DG_MEGA_MOE_FP4XFP4 = 3,   /* 'fp4xfp4': NVFP4 tokens and routed weights (DeepGEMM 2.8's
                                * fp4_fp4_mega_moe), dg_fp4_fp4_mega_moe; hidden and
                                * intermediate_hidden multiples of 64 */
    DG_MEGA_MOE_SM90_FP8 = 4   /* DeepGEMM 2.8's SM90 buffer (get_symm_buffer_for_sm90_mega_moe):
                                * FP8 tokens with float scales per 1x128 and FP8 weights with
                                * float scales per 128x128 block, dg_fp8_mega_moe; hidden a
                                * multiple of 256, intermediate_hidden of 128, no shared experts,
                                * tokens aligned to dg_get_token_alignment_for_sm90_mega_moe() */
} dg_mega_moe_mma;

typedef struct dg_mega_moe_config {
    int num_ranks, rank;
    int64_t num_experts;             /* E, a multiple of num_ranks */
    int64_t num_max_tokens_per_rank; /* rounded up to dg_get_token_alignment_for_mega_moe() */
    int64_t num_topk, hidden, intermediate_hidden;
    int64_t num_shared_experts;      /* S in [0, 64]: shared experts fused into the call */
    dg_mega_moe_mma mma;
} dg_mega_moe_config;

typedef struct dg_symm_buffer dg_symm_buffer;

DG_API int64_t dg_get_token_alignment_for_mega_moe(void);
/* 128, as DeepGEMM's SM90 kernel: num_max_tokens_per_rank of a DG_MEGA_MOE_SM90_FP8 buffer is
 * rounded up to it. */
DG_API int64_t dg_get_token_alignment_for_sm90_mega_moe(void);
/* Bytes of one rank's segment for cfg (rank ignored); DG_ERR_* for an invalid configuration. */
DG_API dg_status dg_get_symm_buffer_size_for_mega_moe(const dg_mega_moe_config *cfg, int64_t *bytes);
/* name: 1-64 characters of [A-Za-z0-9_.-], the same on every rank, unique per buffer. */
DG_API dg_status dg_symm_buffer_create(const dg_mega_moe_config *cfg, const char *name, dg_symm_buffer **out);
DG_API dg_status dg_symm_buffer_attach(dg_symm_buffer *buf);
DG_API dg_status dg_symm_buffer_seal(dg_symm_buffer *buf);
/* Frees the rank's mappings (not collective; call after the last mega MoE call of every rank). */
DG_API void dg_symm_buffer_destroy(dg_symm_buffer *buf);
/*
 * Collective over the MPI communicator *mpi_comm (a pointer to an MPI_Comm, so that this header
 * needs no mpi.h); cfg's num_ranks and rank are taken from the communicator. MPI must be
 * initialised. A failure on any rank fails every rank. DG_ERR_UNSUPPORTED when the library was
 * built without MPI (dg_has_mpi() == 0).
 */
DG_API dg_status dg_symm_buffer_create_mpi(const void *mpi_comm, const dg_mega_moe_config *cfg,
                                           dg_symm_buffer **out);
DG_API int dg_has_mpi(void);
/* MPI_Get_library_version of the MPI the library was built with ("" without MPI): a communicator
 * may only be passed in from code using the same MPI library. */
DG_API const char *dg_mpi_library_version(void);
/* The configuration with num_max_tokens_per_rank aligned as the buffer holds it. */
DG_API dg_status dg_symm_buffer_config(const dg_symm_buffer *buf, dg_mega_moe_config *cfg);
/*
 * Views of this rank's inputs in its segment (DeepGEMM's buffer.x, ...), contiguous, with
 * T = num_max_tokens_per_rank rows: "x" [T, H] FLOAT8_E4M3 (BFLOAT16 for bf16xbf16; UINT8
 * [T, H/2] E2M1 pairs, low nibble first, for fp4xfp4), "x_sf" [T, ceil(H/128)] INT32 (four
 * per-1x32 UE8M0 bytes each; for fp4xfp4 [T, H/64], four per-1x16 E4M3 scale bytes each; for
 * the SM90 buffer [T, H/128] FLOAT32, one scale per 1x128; not for bf16xbf16), "topk_idx"
 * [T, K] INT64, "topk_weights" [T, K] FLOAT32. The first y.shape[0] rows are the call's tokens.
 */
DG_API dg_status dg_symm_buffer_view(const dg_symm_buffer *buf, const char *field, dg_tensor *out);

/*
 * The fused calls. y: BFLOAT16 [T_r, H], any strides, T_r <= num_max_tokens_per_rank (may
 * differ per rank, may be 0). Weights of this rank's E/R experts as in the reference (DeepGEMM's
 * layout before transform_weights_for_mega_moe; its CPU form is the `_packed` calls below): L1
 * [E/R, 2I, H] and L2 [E/R, H, I], packed FP4 with per-1x32 UE8M0 scales (FLOAT32 or INT32
 * packed, any strides) or BFLOAT16. stats: NULL or INT32 [E/R] contiguous, increased as the
 * reference does. activation_clamp: INFINITY (none) or >= 0.
 * Shared experts (DeepGEMM's shared_l1_weights / shared_l2_weights), required when the buffer
 * has num_shared_experts = S > 0 and NULL otherwise: L1 [2 S I, H] (gate rows, then up rows)
 * and L2 [H, S I], FLOAT8_E4M3 with per-1x32 UE8M0 scales (FLOAT32 or INT32 packed, any
 * strides) in the fp8xfp4 variant, BFLOAT16 in the bf16 one. They run on this rank's own
 * tokens as a routed expert does (steps 1-5) with top-k weight 1 and intermediate width S I,
 * and their BF16 row is summed first in the combine: y[t] = BF16(((+0 + shared[t]) + o_0) +
 * ...), as DeepEP's combine adds its bias.
 */
DG_API dg_status dg_fp8_fp4_mega_moe(const dg_tensor *y, const dg_tensor *l1_weights,
                                     const dg_tensor *l1_weights_sf, const dg_tensor *l2_weights,
                                     const dg_tensor *l2_weights_sf, const dg_tensor *shared_l1_weights,
                                     const dg_tensor *shared_l1_weights_sf,
                                     const dg_tensor *shared_l2_weights,
                                     const dg_tensor *shared_l2_weights_sf, dg_symm_buffer *buf,
                                     const dg_tensor *cumulative_local_expert_recv_stats,
                                     float activation_clamp);
DG_API dg_status dg_bf16_mega_moe(const dg_tensor *y, const dg_tensor *l1_weights,
                                  const dg_tensor *l2_weights, const dg_tensor *shared_l1_weights,
                                  const dg_tensor *shared_l2_weights, dg_symm_buffer *buf,
                                  const dg_tensor *cumulative_local_expert_recv_stats,
                                  float activation_clamp);
/*
 * The same calls on pre-packed expert weights (what DeepGEMM's transform_weights_for_mega_moe
 * is for: a layout prepared once for the kernel). l1_weights / l2_weights: dg_pack_b_grouped of
 * this rank's L1 [E/R, 2I, H] and L2 [E/R, H, I] (packed FP4 with per-1x32 scales and
 * opts->recipe (1, 1, 32), or BF16); shared_l1_weights / shared_l2_weights: dg_pack_b of the
 * shared experts' [2 S I, H] and [H, S I] (FP8 with per-1x32 scales and the same recipe, or
 * BF16), NULL without shared experts. Packed for the ISA level current at the call (else
 * DG_ERR_VALUE: pack again). y is bitwise the unpacked call's on the same weights: each wave
 * runs dg_fp8_fp4_gemm_nt_packed / dg_bf16_gemm_nt_packed on the expert's packed group, which
 * give the unpacked GEMMs' D. What it buys: no weight packing per wave, and at decoding sizes
 * the packed objects' in-register-widened decode panels (a decode step reads each active
 * expert's FP4 weights once at about 0.5 byte per weight). The packed objects hold about
 * 3 bytes per weight (include the BF16 panels; see dg_pack_b), 6x the FP4 weights. Every other
 * argument and rule is the unpacked call's; DG_ERR_UNSUPPORTED under the reference backend.
 */
DG_API dg_status dg_fp8_fp4_mega_moe_packed(const dg_tensor *y, const dg_packed_b *l1_weights,
                                            const dg_packed_b *l2_weights, const dg_packed_b *shared_l1_weights,
                                            const dg_packed_b *shared_l2_weights, dg_symm_buffer *buf,
                                            const dg_tensor *cumulative_local_expert_recv_stats,
                                            float activation_clamp);
DG_API dg_status dg_bf16_mega_moe_packed(const dg_tensor *y, const dg_packed_b *l1_weights,
                                         const dg_packed_b *l2_weights, const dg_packed_b *shared_l1_weights,
                                         const dg_packed_b *shared_l2_weights, dg_symm_buffer *buf,
                                         const dg_tensor *cumulative_local_expert_recv_stats,
                                         float activation_clamp);
/*
 * The FP8 x FP4 calls with DeepGEMM 2.8's SiTU activation (fp8_fp4_mega_moe(activation='situ',
 * situ_beta=, situ_linear_beta=); no activation clamp, as upstream requires): step 3 becomes,
 * in float32 with the library's e^x and tanh (src/core/float_math.h: within 1.1 and 1.5 ulp, the
 * same bits on every machine), with gate g and up u as in step 2,
 *   a = (((1 / (1 + e^-g)) * (beta * tanh(g / beta))) * (linear_beta * tanh(u / linear_beta)))
 *       * topk_weight,
 * the shared experts' too (weight 1); everything else as the SwiGLU calls. situ_beta and
 * situ_linear_beta must be finite and > 0 (else DG_ERR_VALUE).
 */
DG_API dg_status dg_fp8_fp4_mega_moe_situ(const dg_tensor *y, const dg_tensor *l1_weights,
                                          const dg_tensor *l1_weights_sf, const dg_tensor *l2_weights,
                                          const dg_tensor *l2_weights_sf, const dg_tensor *shared_l1_weights,
                                          const dg_tensor *shared_l1_weights_sf, const dg_tensor *shared_l2_weights,
                                          const dg_tensor *shared_l2_weights_sf, dg_symm_buffer *buf,
                                          const dg_tensor *cumulative_local_expert_recv_stats, float situ_beta,
                                          float situ_linear_beta);
DG_API dg_status dg_fp8_fp4_mega_moe_packed_situ(const dg_tensor *y, const dg_packed_b *l1_weights,
                                                 const dg_packed_b *l2_weights,
                                                 const dg_packed_b *shared_l1_weights,
                                                 const dg_packed_b *shared_l2_weights, dg_symm_buffer *buf,
                                                 const dg_tensor *cumulative_local_expert_recv_stats,
                                                 float situ_beta, float situ_linear_beta);

/*
 * DeepGEMM 2.8's NVFP4 mega MoE (fp4_fp4_mega_moe) on a buffer of mma_type DG_MEGA_MOE_FP4XFP4:
 * tokens in the buffer as E2M1 codes with one E4M3 scale per 16 values (the "x" / "x_sf" views),
 * routed weights the same (l1 [E/R, 2I, H/2], l2 [E/R, H, I/2] DG_FP4_E2M1X2 or INT8, unit
 * stride along K; l1_sf / l2_sf INT32 [E/R, N, K/64] of four E4M3 bytes each, any strides, e.g.
 * DeepGEMM's MN-major layout, or FLOAT32 [E/R, N, K/16] of the scale values), optional BF16
 * shared experts run on BF16 tokens, and the per-expert model scales of NVIDIA's NVFP4
 * checkpoints. For every (source rank s, token t, slot j) with e = topk_idx[s][t, j] >= 0:
 *   1. acc = x[s][t] . W1[e]^T over the scaled E2M1 values (each exact in BF16), the float32
 *      D of dg_fp8_fp4_gemm_nt with recipe (1, 1, 16); gate = BF16(acc[:I] * l1_alphas[e, 0]),
 *      up = BF16(acc[I:] * l1_alphas[e, 1]) (alphas 1 when not given);
 *   2. the clamp of dg_fp8_fp4_mega_moe, then 3. a = (gate / (1 + e^-gate)) * up in float32,
 *      without the top-k weight (upstream applies it after L2);
 *   4. a quantised to NVFP4 with g = a2_scales[e] (1 when not given): per 16 values
 *      sf = E4M3(max((amax / 6) * (1 / g), 2^-9)), codes = E2M1 of a / (sf * g) by round to
 *      nearest even (as the GPU's cvt.rn.satfinite);
 *   5. acc2 = codes . W2[e]^T as in step 1 with sf as A's scales; o = BF16((acc2 * g) *
 *      l2_alphas[e]); o' = BF16(float(o) * topk_weights[s][t, j]);
 *   6. combine on rank s: r = BF16(float32 sum from +0 of o' over the slots in increasing j),
 *      r = BF16(float(r) * routed_scaling_factor), then with shared experts
 *      y[s][t] = BF16(float(r) + float(shared[t])), where shared[t] is dg_bf16_mega_moe's shared
 *      expert chain (steps 1-5, BF16 activations, weight 1, width S I) on x_bf16[t].
 * As the other calls: bitwise the same for any rank count, thread count and token split, and
 * equal to this chain built from the public GEMMs; within DeepGEMM's test thresholds of its
 * float32 reference. extras may be NULL (no shared experts, alphas, a2_scales; scaling 1).
 * fast_math is DeepGEMM's GPU switch: the library's e^x here either way.
 */
typedef struct dg_fp4_fp4_mega_moe_extras {
    const dg_tensor *shared_l1_weights; /* BFLOAT16 [2 S I, H], any strides; NULL without */
    const dg_tensor *shared_l2_weights; /* BFLOAT16 [H, S I] */
    const dg_tensor *x_bf16;            /* BFLOAT16 [T_r, H]: this rank's tokens for the shared experts;
                                         * given exactly when the buffer has shared experts */
    const dg_tensor *l1_alphas;         /* NULL or FLOAT32 [E/R, 2] (gate, up), any strides */
    const dg_tensor *l2_alphas;         /* NULL or FLOAT32 [E/R] */
    const dg_tensor *a2_scales;         /* NULL or FLOAT32 [E/R], every entry finite and > 0 */
    float routed_scaling_factor;        /* finite; 1 in dg_fp4_fp4_mega_moe_extras_default */
} dg_fp4_fp4_mega_moe_extras;

DG_API dg_fp4_fp4_mega_moe_extras dg_fp4_fp4_mega_moe_extras_default(void);
DG_API dg_status dg_fp4_fp4_mega_moe(const dg_tensor *y, const dg_tensor *l1_weights,
                                     const dg_tensor *l1_weights_sf, const dg_tensor *l2_weights,
                                     const dg_tensor *l2_weights_sf, const dg_fp4_fp4_mega_moe_extras *extras,
                                     dg_symm_buffer *buf, const dg_tensor *cumulative_local_expert_recv_stats,
                                     float activation_clamp);
/*
 * The NVFP4 call on pre-packed weights: l1_weights / l2_weights dg_pack_b_grouped of this rank's
 * routed experts with FLOAT32 scales [E/R, N, K/16] (the E4M3 values) and opts->recipe
 * (1, 1, 16); shared_l1_weights / shared_l2_weights dg_pack_b of the BF16 shared experts (NULL
 * without; extras' shared tensors must then be NULL, x_bf16 is still given). y is bitwise the
 * unpacked call's: the waves run dg_fp8_fp4_gemm_nt_packed. Rules otherwise as
 * dg_fp8_fp4_mega_moe_packed's (live objects packed for the current ISA level, not under the
 * reference backend).
 */
DG_API dg_status dg_fp4_fp4_mega_moe_packed(const dg_tensor *y, const dg_packed_b *l1_weights,
                                            const dg_packed_b *l2_weights, const dg_packed_b *shared_l1_weights,
                                            const dg_packed_b *shared_l2_weights,
                                            const dg_fp4_fp4_mega_moe_extras *extras, dg_symm_buffer *buf,
                                            const dg_tensor *cumulative_local_expert_recv_stats,
                                            float activation_clamp);

/*
 * DeepGEMM 2.8's SM90 FP8 mega MoE (fp8_mega_moe, recipe (128, 128, 128)) on a buffer of mma
 * DG_MEGA_MOE_SM90_FP8: tokens E4M3 with one float scale per 1x128 (the "x" / "x_sf" views),
 * routed weights E4M3 l1 [E/R, 2I, H] (gate rows, then up rows) and l2 [E/R, H, I], unit stride
 * along K, with FLOAT32 scales per 128x128 block, l1_sf [E/R, 2I/128, H/128] and l2_sf
 * [E/R, H/128, I/128] (DeepEP's layout; any strides). For every (source rank s, token t, slot j)
 * with e = topk_idx[s][t, j] >= 0:
 *   1. h = x[s][t] . W1[e]^T in float32, the float32 D of dg_fp8_gemm_nt with recipe
 *      (1, 128, 128) (per 128-K block, the block's sum times sa * sb); no BF16 rounding;
 *   2. with activation_clamp c (as given, not rounded): gate = min(h[:I], c), up =
 *      min(max(h[I:], -c), c);
 *   3. a = ((gate / (1 + e^-gate)) * up) * topk_weights[s][t, j] in float32 (e^x as above);
 *   4. per 64 values of a: sf = 2^ceil(log2(amax * (1 / 448))) (a power of two, exactly;
 *      sf = 0 and codes 0 when amax is 0), codes = E4M3(a * (1 / sf)) (round to nearest even);
 *   5. o = BF16(codes . W2[e]^T), the BF16 D of dg_fp8_gemm_nt with recipe_a (1, 64) (sf per
 *      1x64) and recipe_b (128, 128);
 *   6. combine on rank s: y[s][t] = BF16(float32 sum from +0 of o over the slots in increasing j;
 *      masked slots skipped; a token without experts gives 0).
 * Bitwise the same for any rank count, thread count and token split, and equal to this chain
 * built from the public GEMMs; within DeepGEMM's test threshold (calc_diff < 0.01) of its
 * float32 reference. fast_math is DeepGEMM's GPU switch: the library's e^x either way. The SM90
 * kernel has no shared experts and no SiTU; DeepGEMM's transform_weights_for_mega_moe_sm90
 * interleaves gate and up rows for its tensor cores, which this call does not take (give the
 * natural layout, or pre-packed weights below).
 */
DG_API dg_status dg_fp8_mega_moe(const dg_tensor *y, const dg_tensor *l1_weights, const dg_tensor *l1_weights_sf,
                                 const dg_tensor *l2_weights, const dg_tensor *l2_weights_sf, dg_symm_buffer *buf,
                                 const dg_tensor *cumulative_local_expert_recv_stats, float activation_clamp);
/*
 * The SM90 call on pre-packed weights: l1_weights / l2_weights dg_pack_b_grouped of this rank's
 * routed experts with their FLOAT32 128x128 block scales and opts->recipe_b (128, 128) (with
 * recipe_a (1, 128) for L1 and (1, 64) for L2, what the call multiplies them with). y is bitwise
 * the unpacked call's. Rules as
 * dg_fp8_fp4_mega_moe_packed's (live objects packed for the current ISA level, not under the
 * reference backend).
 */
DG_API dg_status dg_fp8_mega_moe_packed(const dg_tensor *y, const dg_packed_b *l1_weights,
                                        const dg_packed_b *l2_weights, dg_symm_buffer *buf,
                                        const dg_tensor *cumulative_local_expert_recv_stats,
                                        float activation_clamp);

#ifdef __cplusplus
}
#endif

#endif /* DEEPGEMM_H */
