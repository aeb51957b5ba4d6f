/*
 * dgbench.h - shared definitions of the benchmark's parts. dgbench uses only the public
 * header; everything here is the tool's own.
 *
 * Parts: dgbench.c (driver: options, timing, table, JSON), dgbench_peak.c (this machine's
 * limits), dgbench_util.c (buffers, random data, the tool's own quantizers, calc_diff),
 * dgbench_peer.c (oneDNN / OpenBLAS on the same inputs, loaded at run time) and one
 * dgbench_<family>.c per kernel family holding that family's cases.
 */
#ifndef DGBENCH_H
#define DGBENCH_H

#include <deepgemm.h>

#include <stddef.h>
#include <stdint.h>

/* ---- machine limits (dgbench_peak.c); 0 means "not measured / not available" ---- */

typedef struct bench_peaks {
    double bf16_gflops; /* VDPBF16PS, all threads */
    double fp32_gflops; /* FMA on the widest registers (zmm with AVX-512, else ymm), all threads */
    double fp32_ymm_gflops; /* FMA on ymm registers (AVX2), all threads: the limit of isa avx2 */
    double int8_gops;   /* VPDPBUSD, all threads */
    double dram_gbps;   /* streaming read over a buffer much larger than the last-level cache */
    double amx_bf16_gflops; /* TDPBF16PS tiles, all threads (the BF16 limit on isa amx) */
    double amx_int8_gops;   /* TDPBSSD tiles, all threads (the INT8 limit on isa amx) */
    const char *fp32_isa; /* "avx512", "avx2" or NULL */
    size_t dram_buffer_bytes;
    int threads;
} bench_peaks;

/* Measures every limit this CPU has on `threads` threads; takes a few seconds. */
void bench_measure_peaks(bench_peaks *p, int threads, int quick);
/* Size of the last-level cache as the OS reports it (0 if unknown). */
size_t bench_llc_bytes(void);

/* Which compute limit a case is measured against; memory traffic is always compared with
 * dram_gbps as well and the larger of the two lower bounds on time is the case's limit.
 * The instruction behind a limit follows the ISA level the library runs (dg_get_isa()), so
 * that DG_ISA=avx2 on an AVX-512 machine is rated against what avx2 can do: amx uses the tile
 * peaks for BF16 and INT8, avx512_bf16 VDPBF16PS / VPDPBUSD / zmm FMA, avx512 zmm FMA for
 * every kind, avx2 (and portable C) ymm FMA for every kind (compute_peak in dgbench.c). */
typedef enum bench_limit {
    BENCH_LIMIT_BF16 = 0, /* BF16 dot products (FP8/FP4 are expected to be widened to BF16) */
    BENCH_LIMIT_FP32 = 1,
    BENCH_LIMIT_INT8 = 2, /* INT8 dot products */
    BENCH_LIMIT_DRAM = 3  /* memory-bound: no compute limit */
} bench_limit;

/* ---- cases ---- */

/* The `size` argument of setup(): the case's own shape, --quick's smaller one, or --digest's
 * (small enough that one call per case at the portable level takes milliseconds, large enough
 * to cross the engine's blocks: K over several KC blocks with a tail, M over several MC tiles
 * and past the small-M limit where the case is a large-M one, several threads' worth of work). */
enum { BENCH_SIZE_FULL = 0, BENCH_SIZE_QUICK = 1, BENCH_SIZE_DIGEST = 2 };
#define BENCH_DIGEST_MAX 4

/* What setup() produces: the work of one run and the output compared between backends. */
typedef struct bench_work {
    void *state;     /* the case's own buffers, passed to run() and free() */
    double flops;    /* floating-point (or integer) operations of one run; 2 per multiply-add */
    double bytes;    /* bytes one run must at least read and write */
    dg_tensor out;   /* FLOAT32, BFLOAT16 or FLOAT8_E4M3 output written by run() */
    /* Runs it takes to read every rotated copy of the weights once (0 or 1: no rotation).
     * run_case makes that many untimed runs before timing, so that no timed run is the first
     * read of a copy since it was written: on a Sapphire Rapids VM such first reads ran 1.5-3x
     * slower than later ones and made the pre-packed decoding cases erratic (0.9-3.1 ms for
     * the same call), while an inference server reads its weights many times. */
    int rotation;
    char shape[64];  /* e.g. "m=64 n=2112 k=7168" */
    const struct bench_peer_gemm *peer; /* the same GEMM for peer libraries (dgbench_peer.h);
                                           NULL: no peer runs this case */
    /* --digest: every output of the case, whole (not out's sample), hashed in this order;
     * ndigest = 0: out. Any dtype and strides (dgbench_digest.c walks the elements). */
    dg_tensor digest[BENCH_DIGEST_MAX];
    int ndigest;
} bench_work;

typedef struct bench_case {
    const char *name;   /* "<family>/<kernel>/<shape>", unique; the filter matches substrings */
    bench_limit limit;
    const void *params; /* the case's own parameters (shape), read by setup() */
    /* Allocates and fills inputs; `size` is a BENCH_SIZE_* (non-zero: a small shape). Returns 0
     * on success. */
    int (*setup)(const struct bench_case *c, int size, bench_work *w);
    dg_status (*run)(void *state);
    void (*free)(void *state);
} bench_case;

/* One kernel family's cases (defined in its dgbench_<family>.c). */
typedef struct bench_family {
    const char *name;
    const bench_case *cases;
    int count;
} bench_family;

extern const bench_family bench_family_gemm;
extern const bench_family bench_family_grouped;
extern const bench_family bench_family_mqa;
extern const bench_family bench_family_hc_einsum;
extern const bench_family bench_family_mega_moe;
extern const bench_family bench_family_quant;
extern const bench_family bench_family_gate;

/* ---- helpers (dgbench_util.c) ---- */

/* Zeroed memory aligned to 64 bytes; NULL on failure. Free with bench_free. */
void *bench_alloc(size_t bytes);
void *bench_alloc_uninit(size_t bytes); /* the same without zeroing (pages stay untouched) */
void bench_free(void *p);
double bench_now(void); /* seconds, monotonic */

/* Deterministic normal(0, 1) * scale values. With bench_portable_inputs set (--digest) every
 * generator of this file uses integer arithmetic and single IEEE operations only (no libm, no
 * a * b + c a compiler could contract into an FMA): the same inputs from the same seed on any
 * machine, C library and compiler. Normal values are then Irwin-Hall (a sum of four uniforms,
 * scaled to variance 1). */
extern int bench_portable_inputs;
void bench_fill_normal(float *x, size_t n, uint64_t seed, float scale);
/* (int)(x * (0.7 + 0.6 u)) for a uniform u from splitmix64 state *s (grouped sizes). */
int64_t bench_jitter(int64_t x, uint64_t *s);
/* Contiguous tensors over new memory (data NULL when allocation fails). */
dg_tensor bench_tensor2(dg_dtype dtype, int64_t d0, int64_t d1);
void bench_tensor_free(dg_tensor *t);
/* float -> BF16 for a whole array. */
void bench_to_bf16(const float *x, uint16_t *y, size_t n);
/*
 * The tool's own quantizers (DeepGEMM's recipes, SPEC 2), on row-major float [rows, cols]:
 *   bench_cast_fp8_rows:  E4M3 [rows, cols], one float32 scale per row per gran_k columns
 *                         -> sf [rows, ceil(cols/gran_k)]
 *   bench_cast_fp8_block: E4M3 [rows, cols], one scale per gran x gran block
 *                         -> sf [ceil(rows/gran), ceil(cols/gran)]
 *   bench_cast_fp4_rows:  packed E2M1 [rows, cols/2], one scale per row per gran_k columns
 * `ue8m0` rounds every scale up to a power of two.
 */
void bench_cast_fp8_rows(const float *x, int64_t rows, int64_t cols, int gran_k, int ue8m0,
                         uint8_t *q, float *sf);
void bench_cast_fp8_block(const float *x, int64_t rows, int64_t cols, int gran, int ue8m0,
                          uint8_t *q, float *sf);
void bench_cast_fp4_rows(const float *x, int64_t rows, int64_t cols, int gran_k, int ue8m0,
                         uint8_t *q, float *sf);
/*
 * A case's tensors, freed together. Put a bench_pool first in a case's state struct and use
 * bench_pool_state_free as the case's free(). bench_pool_new returns a zeroed contiguous
 * tensor owned by the pool; when allocation fails it sets pool->failed (check once at the end).
 */
#define BENCH_POOL_MAX 24
typedef struct bench_pool {
    dg_tensor t[BENCH_POOL_MAX];
    int n, failed;
} bench_pool;
dg_tensor *bench_pool_new(bench_pool *p, dg_dtype dtype, int ndim, const int64_t *shape);
void bench_pool_state_free(void *state);
/* Fills a contiguous FLOAT32 / BFLOAT16 / FLOAT8_E4M3 tensor with normal(0, 1) * scale values
 * (rounded to the dtype), or FP4_E2M1X2 with random codes. */
void bench_fill(dg_tensor *t, uint64_t seed, float scale);
/* Fills a contiguous FLOAT32 tensor with uniform values in [lo, hi). */
void bench_fill_uniform(dg_tensor *t, uint64_t seed, float lo, float hi);

/* Reads a FLOAT32, BFLOAT16 or FLOAT8_E4M3 tensor (any strides) into float, row-major order. */
int bench_read_float(const dg_tensor *t, float *out);
int bench_can_read_float(dg_dtype dtype);
/* DeepGEMM's calc_diff: 1 - 2*sum(x*y) / sum(x*x + y*y), in double; 0 when both are zero. */
double bench_calc_diff(const float *x, const float *y, size_t n);

/* ---- --digest (dgbench_digest.c) ---- */

/* 64-bit FNV-1a over a tensor's elements in row-major order (any strides; element bytes as
 * stored, little-endian), continuing from h (start: BENCH_FNV_INIT). */
#define BENCH_FNV_INIT 0xcbf29ce484222325ull
uint64_t bench_hash_tensor(uint64_t h, const dg_tensor *t);
/* Prints (and with write_dir writes to write_dir/<isa>.txt; with json also as JSON) the digest
 * of each of the n cases. Returns the exit status: 0, 1 when a case failed, 2 on bad usage. */
int bench_digest(const bench_case *const *cases, int n, const char *json, const char *write_dir);

#endif
