/*
 * hc_prenorm_kernels.h - inner kernels of the fast dg_tf32_hc_prenorm_gemm (SPEC 6).
 *
 * The driver (src/kernels/hc_prenorm.c) cuts each output row's K range into chunks of
 * DG_HC_KC elements. Per chunk it copies the matching rows of B into a zero-padded panel
 * pk[DG_HC_NS][DG_HC_KC] (float32, in L1), and per group of up to `rows` rows of A it
 *   1. converts the group's A chunk to float32 once (convert: xa[r][DG_HC_KC], zero-padded,
 *      also adding the squares into the rows' square sums), then
 *   2. runs the micro kernel once per group of `cols` panel rows, which keeps rows x cols
 *      vector sums in registers (A and B loaded once per rows x cols FMAs).
 * Every output (row, column) and every square sum is held as `lanes` partial sums: lane l
 * accumulates the k = l (mod lanes) terms of the chunk in increasing k with single float32
 * FMAs, loaded from / stored to the row's state between chunks. So a row's bits depend only on
 * the row, its K range and the ISA's lane count - never on thread count or row grouping. The
 * driver adds the lanes up in a fixed order at the end.
 *
 * State of one row: DG_HC_NS column sums then the square sum, `lanes` floats each
 * (DG_HC_STATE(lanes) floats); consecutive rows of a group are `sf` floats apart.
 */
#ifndef DG_KERNELS_HC_PRENORM_KERNELS_H
#define DG_KERNELS_HC_PRENORM_KERNELS_H

#include "../core/internal.h"

#include <stdint.h>

/* K elements per chunk (multiple of 16). 448 = 7 of DeepGEMM's 64-blocks: 7168 / 16 splits is one
 * chunk. Panel (42 KiB) and converted A (7 KiB) slightly exceed a 48 KiB L1, yet measured faster
 * than 384 on Sapphire Rapids (fewer state round trips). */
#define DG_HC_KC 448
#define DG_HC_NS 24  /* columns per panel (DeepSeek's N); wider N takes several panels */
#define DG_HC_STATE(lanes) ((DG_HC_NS + 1) * (lanes))

/*
 * pk[r * DG_HC_KC + i] = b[r * ldb + i] for r < nsc, i < len; zero for the other i < round_up(len, 16)
 * and, for nsc <= r < DG_HC_NS, the whole row up to there. 0 < len <= DG_HC_KC.
 */
typedef void (*dg_hc_pack_fn)(const float *b, int64_t ldb, int64_t nsc, int64_t len, float *pk);
/*
 * xa[r * DG_HC_KC + i] = a[r * lda + i] as float32 for r < rows, i < len, and 0 for
 * len <= i < round_up(len, 16); sq[r * sf + l] += a^2 over i = l (mod lanes), starting from 0
 * instead of sq's contents when `first`. 0 < len <= DG_HC_KC.
 */
typedef void (*dg_hc_convert_fn)(const uint16_t *a, int64_t lda, int rows, int64_t len, float *xa, float *sq,
                                 int64_t sf, int first);
/*
 * acc[r * sf + c * lanes + l] += sum over i = l (mod lanes), i < len, of
 * xa[r * DG_HC_KC + i] * pk[c * DG_HC_KC + i], for r < rows (<= the kernel's rows) and
 * c < the kernel's cols, starting from 0 instead of acc's contents when `first`. len is a
 * multiple of 16. When pf is not NULL, the kernel also hints pf[0 .. len) (BF16: the next rows
 * of A) into the cache, spread over its steps.
 */
typedef void (*dg_hc_micro_fn)(const float *xa, int rows, int64_t len, const float *pk, float *acc, int64_t sf,
                               int first, const uint16_t *pf);

/*
 * out[c] = the sum of the `lanes` partial sums st[c * lanes + l] for c < DG_HC_NS + 1 (the
 * columns, then the square sum), always added in the same order.
 */
typedef void (*dg_hc_finish_fn)(const float *st, float *out);

typedef struct dg_hc_kernel {
    const char *name;
    int lanes; /* partial sums per output */
    int rows;  /* rows of A per micro call (register blocking) */
    int cols;  /* panel rows per micro call; divides DG_HC_NS */
    int kc;    /* K per chunk (a multiple of 16, <= DG_HC_KC) */
    int ld;    /* row stride of pk and xa in floats (>= kc, a multiple of 8) */
    dg_hc_pack_fn pack;
    dg_hc_convert_fn convert;
    dg_hc_micro_fn micro;
    dg_hc_finish_fn finish;
} dg_hc_kernel;

#define DG_HC_KERNEL_DECL(isa)                                                                          \
    void dg_hc_pack_##isa(const float *b, int64_t ldb, int64_t nsc, int64_t len, float *pk);             \
    void dg_hc_convert_##isa(const uint16_t *a, int64_t lda, int rows, int64_t len, float *xa, float *sq, \
                             int64_t sf, int first);                                                   \
    void dg_hc_micro_##isa(const float *xa, int rows, int64_t len, const float *pk, float *acc, int64_t sf, \
                           int first, const uint16_t *pf);
/* The generic finish serves every 8-lane kernel (generic, AVX2). */
void dg_hc_finish_generic(const float *st, float *out);
void dg_hc_finish_avx512(const float *st, float *out);

DG_HC_KERNEL_DECL(generic)
#define DG_HC_KC_GENERIC DG_HC_KC
#define DG_HC_LD_GENERIC DG_HC_KC
#define DG_HC_LANES_GENERIC 8
#define DG_HC_ROWS_GENERIC 4
#define DG_HC_COLS_GENERIC 24

#if defined(__x86_64__) || defined(_M_X64)
#define DG_HC_HAVE_X86_KERNELS 1
DG_HC_KERNEL_DECL(avx2)
DG_HC_KERNEL_DECL(avx512)
#else
#define DG_HC_HAVE_X86_KERNELS 0
#endif
#if DG_HC_HAVE_X86_KERNELS && defined(DG_HAVE_AMX) /* the build has AMX kernels (CMakeLists.txt) */
#define DG_HC_HAVE_AMX 1
#else
#define DG_HC_HAVE_AMX 0
#endif
/* AVX2: chunks of 224 keep the 24-row panel (21 KiB) in a 32 KiB L1 (AMD Zen 2/3); with 448
 * it came from L2 for every micro call, 6 loads per 12 FMAs (measured on Zen 3, M = 4096,
 * K = 7168: see hc_prenorm_avx2.c). */
#define DG_HC_KC_AVX2 224
/* Rows 232 floats apart: with a stride of whole cache lines every load of a micro step hits the
 * same offset in its line (one L1 bank), which held the kernel near half its FMA rate on Zen 3. */
#define DG_HC_LD_AVX2 232
#define DG_HC_LANES_AVX2 8
#define DG_HC_ROWS_AVX2 2 /* 16 ymm registers: 2 x 6 sums, 2 A vectors, 1 B vector */
#define DG_HC_COLS_AVX2 6
#define DG_HC_KC_AVX512 DG_HC_KC
#define DG_HC_LD_AVX512 DG_HC_KC
#define DG_HC_LANES_AVX512 16
#define DG_HC_ROWS_AVX512 4 /* 32 zmm registers: 4 x 6 sums, 4 A vectors, 1 B vector */
#define DG_HC_COLS_AVX512 6

/*
 * AMX level (kernels/amx/hc_prenorm_amx.c): B is split exactly into three BF16 parts packed as
 * VNNI tiles, A's rows are tile operands read in place, and TDPBF16PS accumulates in float32.
 * The parts are DG_HC_AMX_COLS tile columns: part 0 of B's 24 rows, part 1, part 2, then zeros;
 * each has its own float32 accumulator, and d = (part 0 + part 1) + part 2 at the end.
 * Packed B, per panel of DG_HC_NS columns: one record of DG_HC_AMX_STEP uint16 per k step of 32
 * (K zero-padded), 64-byte aligned. Row state: DG_HC_AMX_SF floats, the DG_HC_AMX_COLS part sums
 * then 16 square-sum lanes. A row's bits depend only on the row, its K range and B: blocks,
 * chunks (state is stored and reloaded exactly) and threads never change them.
 */
#define DG_HC_AMX_COLS 80                                   /* 3 parts x 24 columns, 8 zero */
#define DG_HC_AMX_STEP (DG_HC_AMX_COLS / 16 * 16 * 32)      /* 5 tiles of 16 k pairs x 16 columns */
#define DG_HC_AMX_SF (DG_HC_AMX_COLS + 16)
#define DG_HC_AMX_ROWS 16 /* rows per block call: one A tile */
#if DG_HC_HAVE_X86_KERNELS
/* Packs k steps [s0, s1) of nsc (<= DG_HC_NS) rows of b [nsc, k] into bp (the panel's step 0). */
void dg_hc_amx_pack_b(const float *b, int64_t ldb, int64_t nsc, int64_t k, int64_t s0, int64_t s1, uint16_t *bp);
/* Loads the tile configuration of dg_hc_amx_block for blocks of `rows` rows (1..16). LDTILECFG
 * costs as much as a short split's tile work, so callers load it once per run of blocks of the
 * same height; dg_hc_amx_block_t loads its own (reload after it). */
void dg_hc_amx_config(int rows);
/*
 * Rows [0, rows) (rows <= DG_HC_AMX_ROWS) of a, K range [k0, k1) (k0 a multiple of 32; ends at
 * the last k step or at K) cut at the ncuts ascending multiples of 32 in cuts (inside (k0, k1)):
 * the first piece adds into the row states st (rows DG_HC_AMX_SF floats apart; from zero when
 * `first`), each later piece starts from zero. A piece that ends at cut c is written out as by
 * dg_hc_amx_finish (nsc columns) to stage + c * slot * DG_HC_NS (rows DG_HC_NS floats apart)
 * and its square sums to stage_s + c * slot (when `squares`); the last piece stays in st. The
 * square-sum lanes only when `squares`. bp: packed B of the panel (step 0). Needs
 * dg_hc_amx_config(rows) loaded on this thread.
 */
void dg_hc_amx_block(const uint16_t *a, int64_t lda, int rows, int64_t k0, int64_t k1, const int64_t *cuts, int ncuts,
                     const uint16_t *bp, float *st, int first, int squares, int64_t nsc, float *stage, float *stage_s,
                     int64_t slot);
/*
 * The same for rows <= 16 over a whole K range [k0, k1) from zero, from b itself (nsc rows, row
 * stride ldb) instead of packed B: the same bits, for row groups too small to repay packing.
 */
void dg_hc_amx_block_t(const uint16_t *a, int64_t lda, int rows, int64_t k0, int64_t k1, const float *b, int64_t ldb,
                       int64_t nsc, float *st, int squares);
/* d[r][0, nsc) = the rows' column sums; s[r] = their square sums (lanes added in a fixed order) unless s is NULL. */
void dg_hc_amx_finish(const float *st, int rows, int64_t nsc, float *d, int64_t ldd, float *s);
#endif

/* Frees the scratch buffer kept between calls (tests: so that the next call allocates). */
void dg_hc_release_scratch(void);

/* The kernel dg_hc_prenorm_fast uses for an ISA level (the best this build has at or below it). */
const dg_hc_kernel *dg_hc_kernel_for(dg_isa isa);

/*
 * The fast path of dg_tf32_hc_prenorm_gemm, on arguments the entry point has checked:
 * a BFLOAT16 [M, K] and b FLOAT32 [N, K] with unit stride along K, M, N, K > 0; d FLOAT32
 * [S, M, N] with unit stride along N and sqr_sum FLOAT32 [S, M] contiguous, S = num_splits >= 1
 * (3-D / 2-D views of unsplit outputs). Uses dg_get_isa()'s kernel (at DG_ISA_AMX the tile
 * kernels when N <= 96, else the AVX-512 one) on up to dg_get_num_sms() threads; the result bits
 * do not depend on the thread count, nor a row's on M. Returns DG_ERR_ALLOC (having
 * written nothing) when its scratch memory cannot be allocated.
 */
dg_status dg_hc_prenorm_fast(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                             const dg_tensor *sqr_sum, int num_splits);

#endif /* DG_KERNELS_HC_PRENORM_KERNELS_H */
