/*
 * engine.h - the dense GEMM engine: BLIS-style loops around one register-blocked microkernel.
 *
 *   D[M, N] = C + A[M, K] @ B[N, K]^T     (A, B: any dg_operand - BF16, E4M3, E2M1, any strides)
 *
 * Layering (STYLE.md, BLIS section): src/engine/ holds the portable loop nest (gemm.c),
 * packing (pack.c), the small-M path (smallm.c), panel memory (workspace.c), threading
 * (OpenMP) and the per-ISA configuration table (config.c); src/kernels/<isa>/ hold only the
 * microkernels and ISA-specific packing/widening. A public entry point validates, then calls
 * dg_engine_gemm (which declines, DG_ERR_UNSUPPORTED, what it does not cover).
 *
 * ---- Packed panels (the engine's own format; the basis for a future pre-packed weight API)
 * An operand [MN, K] is cut into panels of R rows (R = MR for A, NR for B); rows past MN are
 * zero. K is padded with zeros to Kp = K rounded up to even (VDPBF16PS works on k pairs).
 * Panel p starts at element p * Kp * R and stores, for the two element formats:
 *   DG_PACK_F32   float  P[k][R]        element (r, k) at k * R + r
 *   DG_PACK_BF16  bf16   P[k/2][R][2]   element (r, k) at (k/2) * 2R + 2r + (k & 1)
 *   DG_PACK_AMX_B as DG_PACK_BF16 with Kp = K rounded up to 32 (B tiles: 16 k pairs x 16 cols)
 *   DG_PACK_AMX_A bf16   P[k/32][R][32] element (r, k) at (k/32) * 32R + 32r + k % 32, Kp
 *                 rounded up to 32 (A tiles: 16 rows x 32 k, row stride 64 bytes)
 * In every format the k-slice starting at an even k0 (a multiple of 32 for AMX) begins at
 * element k0 * R, so a microkernel's operand pointers are computed the same way for all.
 * FP8/FP4 codes are widened to BF16 exactly while packing; power-of-two scales (UE8M0) are
 * folded into the values (exact barring BF16 overflow/underflow, i.e. scales beyond 2^+-118).
 * Scales that cannot be folded are packed per panel as float S[kb][R] (kb = k / gblk) and
 * applied by the microkernel's epilogue once per K block of gblk elements.
 *
 * ---- Accumulation order (the determinism / batch-invariance contract) ---------------------
 * K (padded) is cut into blocks of gblk = dg_engine_k_block(...): DG_ACC_BLOCK, or the largest
 * divisor of it that also divides every unfolded scale block. Every element D[i, j] is
 *   total = 0;  for each block kb (increasing):
 *     acc = 0;  for each k pair p of the block (increasing):
 *                 acc = fma(a[2p+1], b[2p+1], acc); acc = fma(a[2p], b[2p], acc)
 *     total = fma(sa[i, kb] * sb[j, kb], acc, total)     (unit scales: total + acc)
 * Finally D = round(C + total) (one float32 add, one rounding to D's dtype).
 * The pair chain is exactly what one VDPBF16PS lane does (products of BF16 values are exact in
 * float32; VDPBF16PS additionally flushes denormal inputs/outputs to zero - the only place
 * the ISAs may differ). Why blocks even without scales: one float32 chain over all of K lets
 * its rounding error grow with K; short chains added in a fixed order keep it several times
 * smaller (measured with BF16 inputs, K = 4096: outputs one BF16 step from the exactly rounded
 * result 0.038% -> 0.014%; K = 1024: 0.017% -> 0.011%), at one epilogue per 128 k. The block
 * is a constant, not a cache parameter, so bits stay the same on every CPU of one ISA level.
 * This order depends on neither M, N, the tile position nor the thread count: K is never
 * split across threads, tails are computed by the same kernel on zero-padded panels.
 * The small-M path (smallm.c, prepack.c) runs the large-M kernel's instruction: float32 FMA
 * kernels where that is FMA, VDPBF16PS kernels on BF16 panels where the large-M path runs
 * VDPBF16PS (AMD by default, config.c), TDPBF16PS on AMX; so rows agree bitwise across M for
 * every input, denormals included. VDPBF16PS flushes denormals (measured on AMD Zen 5: a
 * denormal accumulator is read as zero and each of its two steps' denormal results is
 * flushed), so where the AVX-512 BF16 level runs FMA instead (Intel by default) bits differ
 * from VDPBF16PS's on denormal products and partial sums only.
 *
 * AMX configurations (DG_ISA_AMX) replace the k-pair chain: K is padded with zeros to a
 * multiple of 32 and each k step of 32 is one TDPBF16PS, which adds the step's 32 exact
 * products to the float32 accumulator in the hardware's own way (it is neither the chain above
 * nor one rounding of the exact sum: measured on Sapphire Rapids). With unfolded scales the
 * blocks, the per-block scale epilogue and the final rounding are as above. Without them (BF16,
 * folded power-of-two scales) there are no blocks: every element is one tile chain over all k
 * steps from zero, then D = round(C + total). The block epilogue (tile stores, a float32 add per
 * element, a drained tile pipeline every 4 steps) cost 10-20% of a BF16 GEMM there (Sapphire
 * Rapids, 2 threads, M = 4096: N 2112 K 7168 98-111 -> 88-91 ms); a step adds 32 products, so
 * the chain is K/32 roundings long, and outputs one BF16 step off the exactly rounded result
 * measured 0.024% against the blocks' 0.012% at K = 4096 and 7168 (PyTorch's BF16 matmul
 * 0.020-0.028%). Every path of an AMX configuration (large M, small M, pre-packed, grouped)
 * follows this, so a row has the same bits whatever M, the tiling or the thread count; bits
 * differ from the other ISA levels. The BF16 einsum is the exception: it keeps blocks of
 * DG_ACC_BLOCK, each a tile chain from zero, and adds their sums in float64 (batched.h), to be
 * at least as accurate as PyTorch's einsum on upstream's cases. Scale blocks that are not
 * whole k steps (gblk % 32 != 0) run on the fallback.
 *
 * ---- Microkernel contract ---------------------------------------------------------------
 * One MR x NR tile of a float32 buffer c (row stride ldc), over kc (even) k of packed panels:
 *   DG_UKR_ZERO   c  = acc                    acc chained from 0 over the kc values
 *   DG_UKR_ACC    c  = acc                    acc starts from c (continues the chain)
 *   DG_UKR_SCALE  c  = fma(sa[r] * sb[j], acc, c)    acc chained from 0 (a scale epilogue)
 * No loops over m or n inside beyond the fixed MR x NR register tile. The kernel bodies are
 * static inline functions taking (kc, MR, NR) as parameters: a JIT instantiates the same
 * source with constants (kc = KC when K is known), as the per-ISA wrappers do for MR, NR.
 */
#ifndef DG_ENGINE_ENGINE_H
#define DG_ENGINE_ENGINE_H

#include "../core/operand.h"

#include <string.h>

/* float -> BF16 bits, round to nearest even, NaN kept (quiet); vectorizes, unlike a call. */
static inline uint16_t dg_engine_f32_bf16(float x) {
    union { float f; uint32_t u; } v = {x};
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1)) >> 16);
}

/* A float32 scale the engine may fold: a power of two, normal and positive (no sign or
 * mantissa bits, exponent field 1 .. 254). */
static inline bool dg_engine_scale_pow2(float s) {
    union { float f; uint32_t u; } v = {s};
    return (v.u & 0x807fffffu) == 0 && v.u - 0x00800000u < 0x7f000000u;
}

static inline float dg_engine_bf16_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

typedef enum dg_pack_fmt {
    DG_PACK_F32 = 0,
    DG_PACK_BF16 = 1,
    DG_PACK_AMX_A = 2, /* AMX A tiles: K padded to 32; element (r, k) at (k/32)*32R + 32r + k%32 */
    DG_PACK_AMX_B = 3  /* DG_PACK_BF16's layout with K padded to 32 (AMX B tiles: k pairs x R) */
} dg_pack_fmt;

/* K of a packed operand rounded up to what its format's kernels step over. */
static inline int64_t dg_pack_kp(dg_pack_fmt fmt, int64_t k) {
    return fmt >= DG_PACK_AMX_A ? (k + 31) / 32 * 32 : k + (k & 1);
}
typedef enum dg_ukr_mode { DG_UKR_ZERO = 0, DG_UKR_ACC = 1, DG_UKR_SCALE = 2 } dg_ukr_mode;

/* The accumulation block (contract above): a constant so that bits never depend on the CPU's
 * caches; every cache block (KC, slices, AMX chunks) is a multiple of it. DeepGEMM's FP8
 * kernels promote their tensor-core sums to float32 every 128 k as well. */
#define DG_ACC_BLOCK 128
/* Blocks per run of the BF16 einsum's float64 order on AMX (batched.h); the kernel
 * (dg_engine_cfg.ukr_f64) adds them as ((b0 + b1) + (b2 + b3)), so this is 4. */
#define DG_F64_RUN 4
enum { DG_F64_FIRST = 1, DG_F64_LAST = 2 }; /* flags of dg_engine_cfg.ukr_f64 */
/* The K block of an operand pair with K = k: DG_ACC_BLOCK cut down to a divisor of each
 * unfolded scale block shorter than K (gran 0: that operand has none; a block covering all of
 * K constrains nothing); odd when such a scale block is odd (the engine declines). */
int dg_engine_k_block(int gran_a, int gran_b, int64_t k);

typedef void (*dg_ukr_fn)(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                          const float *sa, const float *sb);

/* ISA-specific packing of a K-major BF16 operand (unit stride along K): rows [0, rows) of
 * src (row stride ld), k in [k0, k0 + kc), kc even, zero past `k` and past `rows`, into a
 * panel slice of width r <= 32 (element (i, kk) at (kk - k0) * r + i in panel order). */
typedef void (*dg_pack_bf16_fn)(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t kc,
                                int64_t k, dg_pack_fmt fmt, void *dst);

/* ---- Decoding kernels (M <= DG_DECODE_MAX_M; smallm.c) ------------------------------------
 * One call: the M (1 .. DG_DECODE_MAX_M; DG_DECODE_PAIRS: 1 or 2) rows of A against
 * DG_DECODE_ROWS rows of B read in place, all of K
 * (DG_DECODE_PAIRS: 32, two panels). B row r is
 * at b + r * ldb bytes, K contiguous: BF16 bits, E4M3 codes, or E2M1 nibble pairs (low nibble
 * first); rows >= rows and k >= k read as zero. A: float32 rows at a + m * lda, zero from K up
 * to K rounded up to a multiple of DG_DECODE_STEP (16 k). Per element, exactly the
 * chain above: per K block of gblk (>= 1, dg_engine_k_block) acc chained from 0 over the block's
 * pairs, total = fma(sa[m * sa_stride + kb] * sb[kb * 32 + r], acc, total) (unit scales where
 * none are unfolded);
 * out[m * 32 + r] = total. E4M3 / E2M1 values are multiplied by fm[(k / fblk) * 32 + r], the
 * folded power-of-two scale times the format's unit (E4M3 2^120, E2M1 1: see decode_avx2.c), or by
 * the unit alone when fm is NULL; gblk and fblk are multiples of the step. Returns false when
 * it met an E4M3 NaN code (out is then garbage; the caller recomputes the block exactly). */
#define DG_DECODE_STEP 16 /* a multiple of every format's step */
/* B rows per call of the row kernels: 16 measured faster than 32 at M = 1 on Zen 3 with B from
 * DRAM (15-19 vs 11-16 GB/s, 2 threads): half the concurrent row streams for the prefetchers,
 * and two FMA chains per row of A still outrun memory. */
#define DG_DECODE_ROWS 16
/* Rows of A a row kernel takes (B staged once for all of them; kernels/avx2/decode_avx2.c). */
#define DG_DECODE_MAX_M 8
/* The wide kernels (cfg->decode_wide): M = DG_DECODE_MAX_M + 1 .. decode_wide_max_m (at most
 * DG_DECODE_WIDE_MAX_M) against DG_DECODE_WIDE_ROWS rows of B per call; out, sb and fm as above
 * with lanes r < 32. */
#define DG_DECODE_WIDE_MAX_M 64
#define DG_DECODE_WIDE_ROWS 32
typedef struct dg_decode_job {
    const uint8_t *b;
    int64_t ldb;
    int rows;
    int64_t k;
    const float *a;
    int64_t lda;
    int m;
    int64_t gblk;
    const float *sa, *sb;
    int64_t sa_stride;
    int64_t fblk;
    const float *fm;
    float *out;
    /* A as BF16 pairs, step-major [k / 32][m][16] (pair p of a step: k = 32 * step + 2p, 2p + 1;
     * zero past K): read by the AVX-512 BF16 kernels (narrow and wide), which therefore need it
     * set; the AVX2 kernels read `a`. */
    const uint32_t *ap;
    /* The rows of B this thread's next call reads (same ldb; NULL: none known), to prefetch
     * their first lines while this call ends (AVX-512 BF16 kernels). */
    const uint8_t *next;
    /* The lane stride of sb, fm and out: 32 for every kernel but those of cfg->decode_groups
     * at M <= 2, which take up to 64 rows per call (DG_DECODE_PANEL_ROWS; decode_avx512bf16.h). */
    int64_t lanes;
    /* E2M1P kernels only: the folded scales as exponent bytes instead of fm (dg_e2m1_panels.sfe:
     * [q][16] per group of 16 rows, groups fme_group bytes apart), or NULL. */
    const uint8_t *fme;
    int64_t fme_group;
    /* E2M1 kernels of configurations with decode_sf_in_place only: B's own scales read in place
     * as the folded ones, instead of fm (NULL: fm): the call's first row's block 0 at fs
     * (float32, or with fs_packed INT32 words of four UE8M0 bytes), rows fs_row elements
     * apart, blocks (words of four blocks) fs_blk apart; unit 1. The kernels check what the
     * driver checks of fm (powers of two, dg_decode_fold_exact) and return false otherwise. */
    const uint8_t *fs;
    int64_t fs_row, fs_blk;
    int fs_packed;
    /* E4M3 rows: widened by byte tables (AVX512-VBMI; the driver sets it where the CPU has VBMI
     * and dg_engine_set_decode_byte_tables allows it), else by word tables: the same values. */
    bool byte_tables;
    /* E2M1 and E4M3 rows (AVX-512 BF16 kernels): the call's rows are copied a cache line at a
     * time into an L1 buffer and read from there, because their stride maps them onto few L1
     * sets (dg_engine_rows_crowd_l1); false: read in place. The same values either way. */
    bool stage_rows;
    /* E4M3 staging for the small-M kernels (AVX2, AVX-512; the decode kernels take false):
     * steps holding a subnormal code are converted without multiplying a subnormal float
     * (dg_engine_subnormal_guard); the same values either way. */
    bool subnormal_guard;
} dg_decode_job;
#define DG_DECODE_PANEL_ROWS 64
typedef bool (*dg_decode_fn)(const dg_decode_job *j);
/* Whether a float multiply with a subnormal operand is slow on this CPU: a microcode assist on
 * Intel cores (E4M3 weights with 1% subnormal codes staged at half speed on Sapphire Rapids). */
bool dg_engine_subnormal_guard(void);
/* 0 turns the decode kernels off (M <= DG_DECODE_MAX_M then runs the small-M kernels: the same
 * bits; tests). */
void dg_engine_set_decode(int use);
/* 0 makes the E4M3 decode kernels widen by word tables on CPUs with VBMI too (the same bits;
 * tests, so that the form Cooper Lake runs stays tested on newer CPUs). */
void dg_engine_set_decode_byte_tables(int use);
/* E2M1 / E4M3 rows staged into L1 (dg_decode_job.stage_rows): -1 where the rows crowd L1 (the
 * default), 0 never, 1 always (the same bits; tests run both). */
void dg_engine_set_decode_stage_rows(int use);
/* DG_DECODE_PAIRS: pre-packed BF16-pair panels instead of B rows (prepack.c): two 16-row
 * panels, the second at b + ldb bytes (read when rows > 16), k = the panels' padded K. */
/* DG_DECODE_E2M1P: pre-packed E2M1 decode panels (prepack.c, pack_e2m1_panels) instead
 * of B rows: panel P holds rows 16P .. 16P + 15 over all of K in steps of 32 k, 256 bytes per
 * step, panels ldb bytes apart (the second 16 rows of a wide call at b + ldb); codes past K and
 * past B's rows are zero. In step s, pair p = 4c + t (k = 32s + 2p + e, e = 0, 1) of row
 * r = 4L + q sits in byte 256s + 64c + 16L + 2q + 8(t & 1) + e, low nibble for t < 2, high nibble
 * for t >= 2: the order in which in-lane byte shuffles give each 32-bit lane r its row's pair
 * (decode_avx512bf16.h, load_panel_e2m1). */
/* DG_DECODE_E4M3P: pre-packed E4M3 decode panels (prepack.c, pack_e4m3_panels) instead of B
 * rows: panel P holds rows 16P .. 16P + 15 over all of K in steps of 32 k, 512 bytes per step,
 * panels ldb bytes apart; in step s, k pair p (k = 32s + 2p + e) of row r sits in byte
 * 512s + 32p + 2r + e, so that zero-extending 32 bytes to words gives each 32-bit lane r its
 * row's pair (no transpose); codes past K and past B's rows are zero (+0). Narrow kernels only
 * (M <= DG_DECODE_MAX_M): wider calls read B's rows. */
enum { DG_DECODE_BF16 = 0, DG_DECODE_E4M3 = 1, DG_DECODE_E2M1 = 2, DG_DECODE_PAIRS = 3, DG_DECODE_E2M1P = 4,
       DG_DECODE_E4M3P = 5, DG_DECODE_FORMATS = 6 };
#define DG_E2M1P_STEP_BYTES 256
#define DG_E4M3P_STEP_BYTES 512

/* A's side of a decode call (smallm.c): rows [m][lda] float32 (A's values as the small-M
 * kernels see them: BF16-rounded, folded scales applied; zero from K up to lda, a multiple of
 * DG_DECODE_STEP), or instead, where the configuration's kernels read them (decode_pairs),
 * the same values as BF16 pairs; and sa [m][nkb]: A's unfolded scale per K block of gblk (1
 * where folded or absent). */
typedef struct dg_decode_a {
    float *rows, *sa; /* rows: NULL where the kernels read pairs */
    uint32_t *pairs;  /* the rows as BF16 pairs, step-major (dg_decode_job.ap); NULL where they read rows */
    void *mem;        /* rows and sa, one allocation */
    int64_t lda, nkb;
} dg_decode_a;
struct dg_engine_cfg;
dg_status dg_engine_decode_a(const struct dg_engine_cfg *cfg, const dg_operand *a, int fold_a, int gblk,
                             dg_decode_a *out);
void dg_engine_decode_a_free(dg_decode_a *a);

/* One ISA's configuration: data, not code (BLIS config/<cpu>/). */
typedef struct dg_engine_cfg {
    const char *name;
    dg_pack_fmt fmt;
    int mr, nr;          /* register tile */
    int mc, nc, kc;      /* cache blocks: mc % mr == 0, nc % nr == 0, kc even */
    dg_ukr_fn ukr;
    dg_pack_bf16_fn pack_bf16; /* NULL: the portable packer */
    dg_pack_bf16_fn pack_bf16_mn; /* the same for MN-major BF16 (ld = stride along K) */
    /* Contiguous E4M3 / E2M1 codes to BF16 bits times a power-of-two scale (NULL: portable). */
    void (*widen_e4m3)(const uint8_t *src, int64_t n, float scale, uint16_t *out);
    void (*widen_e2m1)(const uint8_t *src, int64_t n, float scale, uint16_t *out);
    /* Small M (decoding): microkernels for MR = 1, 2, 4, 8 with NR = nr on small_fmt panels
     * (NULL: small M takes the general path). */
    dg_ukr_fn ukr_small[4];
    /* The panel format of ukr_small: DG_PACK_F32 (0), or DG_PACK_BF16 where the large-M kernel
     * is VDPBF16PS, so that both paths flush the same denormals (batch invariance). */
    dg_pack_fmt small_fmt;
    /* Rows of ukr_small[i] when they are not {1, 2, 4, 8}; then dg_engine_small_kernel weighs
     * padding against FMA latency (config.c). */
    int small_mr[4];
    /* M up to which the small-M path runs (0: 64), measured per level against the large-M
     * path (the crossover moves with the large-M kernel's efficiency). */
    int small_m_max;
    /* Decoding kernels per B format (DG_DECODE_*; NULL: M <= DG_DECODE_MAX_M takes the small-M kernels). */
    dg_decode_fn decode[DG_DECODE_FORMATS];
    /* Decoding kernels for M = DG_DECODE_MAX_M + 1 .. decode_wide_max_m per B format (NULL: those
     * M take the small-M kernels), 32 rows of B per call. */
    dg_decode_fn decode_wide[DG_DECODE_FORMATS];
    int decode_wide_max_m;
    /* B rows per call of the decode kernels reading B's rows at M <= DG_DECODE_MAX_M, per B
     * format (0: DG_DECODE_ROWS; at most DG_DECODE_WIDE_ROWS). */
    int decode_rows[DG_DECODE_FORMATS];
    /* The decode kernels read A as BF16 pairs (dg_decode_job.ap), not as float rows (a). */
    bool decode_pairs;
    /* Per B format: the narrow kernel runs several groups of 16 rows per call, their chains side
     * by side (decode_avx512bf16.h, panel_body): DG_DECODE_PANEL_ROWS rows at M <= 2,
     * DG_DECODE_WIDE_ROWS above (decode_rows is then unused); E4M3 rows DG_DECODE_WIDE_ROWS at
     * every M (smallm.c, decode_prepare, says why). */
    bool decode_groups[DG_DECODE_FORMATS];
    /* The E2M1 kernels read B's folded scales in place (dg_decode_job.fs). */
    bool decode_sf_in_place;
    /* The small-M B slice [kc][nr] (DG_PACK_F32) straight from K-major E4M3 codes without folded
     * scales (kernels/avx2/decode_avx2.c, kernels/avx512/decode_avx512.c; NULL: widen rows, then
     * transpose). */
    bool (*stage_e4m3)(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst);
    /* The same from K-major E2M1 codes, with folded power-of-two scales (job.fm, lanes nr) or none. */
    bool (*stage_e2m1)(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst);
    /* AMX tile kernels: A is packed DG_PACK_AMX_A (B: fmt = DG_PACK_AMX_B), K blocks of
     * unfolded scales must be whole tile steps (gblk % 32 == 0), else the engine runs
     * `fallback`. Their order differs from the chain below (see kernels/amx/ukr_amx.c). */
    int amx;
    dg_isa fallback;
    void (*ukr_begin)(void); /* once per thread and output tile before ukr calls (NULL: none) */
    /* One DG_PACK_AMX_A k step from MN-major BF16 (NULL: portable; pack_avx512.c). */
    void (*pack_amx_a_mn)(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t k,
                          uint16_t *dst);
    /* n E2M1 values, value j times scales[(first + j) / blk] (first, blk even): widen_e2m1 over a
     * row's scale blocks in one call, the same bits (NULL: one widen_e2m1 call per block). */
    void (*widen_e2m1_blocks)(const uint8_t *src, int64_t n, int64_t first, int64_t blk, const float *scales,
                              uint16_t *out);
    /* AMX: one run of the BF16 einsum's float64 order (batched.h) over kc <= DG_F64_RUN *
     * DG_ACC_BLOCK k on an MR x NR tile: the float64 total in c (DG_F64_FIRST: the run starts
     * it, c not read), or with DG_F64_LAST rounded to float32 into out instead (c not written;
     * NULL when the call is the only run); both of row stride ldc. NULL elsewhere. */
    void (*ukr_f64)(int64_t kc, const void *a, const void *b, double *c, float *out, int64_t ldc, int flags);
    /* AMX: ukr (modes ZERO and ACC) with A's MR rows read where they are (BF16, K-major, row
     * stride lda elements, kc whole k steps of 32): the same tile ops on the same values, so
     * the same bits as on packed A. Used where packing A would only add a pass over it
     * (gemm.c). NULL elsewhere. */
    void (*ukr_a_rows)(int64_t kc, const void *a, int64_t lda, const void *b, float *c, int64_t ldc, int mode);
} dg_engine_cfg;

/* The packed format of A (the MR-row operand) under configuration cfg. */
static inline dg_pack_fmt dg_engine_fmt_a(const dg_engine_cfg *cfg) { return cfg->amx ? DG_PACK_AMX_A : cfg->fmt; }

/* Which of cfg->ukr_small runs an M-row small-M call (index 0..3); *mr gets its rows. */
int dg_engine_small_kernel(const dg_engine_cfg *cfg, int64_t m, int *mr);

/* The kernel for an A panel with only `rows` (< MR) valid rows, such as a tile's last: the
 * small-M kernel that holds them on the same panel format when there is one with fewer rows
 * than MR (each row's chain, hence its bits, is the same in every MR: engine.h), else
 * cfg->ukr. *r: the panel's rows (its width when packed). Saves the padded rows' work, e.g.
 * 12 of the 140 rows computed for M = 128 at MR = 14. */
dg_ukr_fn dg_engine_tail_kernel(const dg_engine_cfg *cfg, int64_t rows, int *r);
/* Whether `rows` rows `ld` bytes apart, touched together, crowd the L1 data cache: more of them
 * fall into one set than it has ways (x86 L1D: 64 sets of 64-byte lines, 4 KiB per way, as
 * virtual indexing needs; ways from the detected size). Strides of 1, 2 or 4 KiB do. */
bool dg_engine_rows_crowd_l1(int64_t ld, int rows);

/* The configuration for an ISA level (never NULL: generic is always there). */
const dg_engine_cfg *dg_engine_config(dg_isa isa);
struct dg_scale_plan;
/* The configuration the large-M loops use for a scale plan: cfg itself, or its fallback when
 * its kernels cannot take the plan's K blocks (AMX: gblk % 32 != 0). */
const dg_engine_cfg *dg_engine_config_for(const dg_engine_cfg *cfg, const struct dg_scale_plan *plan);
/* At the AVX-512 BF16 level: 1 uses VDPBF16PS, 0 the float32 FMA kernel, -1 decides by CPU
 * (config.c). Both give the same bits (up to VDPBF16PS's denormal flushing). */
void dg_engine_set_dpbf16(int use);
/* Whether VDPBF16PS is preferred at the AVX-512 BF16 level now (the rule above, or the override). */
bool dg_engine_dpbf16(void);

/* Microkernels (src/kernels/<isa>/). Absent ISAs (non-x86 builds) map to the generic twin. */
void dg_ukr_f32_generic(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                        const float *sa, const float *sb);
void dg_ukr_f32_avx2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                     const float *sa, const float *sb);
void dg_ukr_f32_avx2_mr1(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb);
void dg_ukr_f32_avx2_mr2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb);
void dg_ukr_f32_avx2_mr4(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                         const float *sa, const float *sb);
void dg_pack_bf16_kmajor_avx2(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t kc,
                              int64_t k, dg_pack_fmt fmt, void *dst);
void dg_pack_bf16_mnmajor_avx2(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t kc,
                               int64_t k, dg_pack_fmt fmt, void *dst);
bool dg_decode_bf16_avx2(const dg_decode_job *j);
bool dg_decode_e4m3_avx2(const dg_decode_job *j);
bool dg_decode_e2m1_avx2(const dg_decode_job *j);
bool dg_decode_bf16_avx512(const dg_decode_job *j);
bool dg_decode_e4m3_avx512(const dg_decode_job *j);
bool dg_decode_e2m1_avx512(const dg_decode_job *j);
bool dg_decode_bf16_avx512bf16(const dg_decode_job *j);
bool dg_decode_e4m3_avx512bf16(const dg_decode_job *j);
bool dg_decode_e2m1_avx512bf16(const dg_decode_job *j);
bool dg_decode_e2m1p_avx512bf16(const dg_decode_job *j);
bool dg_decode_e4m3p_avx512bf16(const dg_decode_job *j);
bool dg_decode_wide_bf16_avx512bf16(const dg_decode_job *j);
bool dg_decode_wide_e4m3_avx512bf16(const dg_decode_job *j);
bool dg_decode_wide_e2m1_avx512bf16(const dg_decode_job *j);
bool dg_decode_wide_e2m1p_avx512bf16(const dg_decode_job *j);
bool dg_decode_pairs_avx2(const dg_decode_job *j);
bool dg_decode_stage_e4m3_avx2(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst);
bool dg_decode_stage_e2m1_avx2(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst);
bool dg_decode_stage_e4m3_avx512(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst);
bool dg_decode_stage_e2m1_avx512(const dg_decode_job *j, int64_t k0, int64_t kc, float *dst);
void dg_widen_e4m3_avx2(const uint8_t *src, int64_t n, float scale, uint16_t *out);
void dg_widen_e2m1_avx2(const uint8_t *src, int64_t n, float scale, uint16_t *out);
void dg_ukr_f32_avx512(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                       const float *sa, const float *sb);
void dg_ukr_bf16_amx_begin(void);
void dg_ukr_bf16_amx(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode, const float *sa,
                     const float *sb);
void dg_ukr_bf16_amx_f64(int64_t kc, const void *a, const void *b, double *c, float *out, int64_t ldc, int flags);
void dg_ukr_bf16_amx_a_rows(int64_t kc, const void *a, int64_t lda, const void *b, float *c, int64_t ldc,
                            int mode);
void dg_ukr_bf16_avx512bf16(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                            const float *sa, const float *sb);
/* AMX small-M kernels (src/kernels/amx/smallm_amx.c; x86-64 only), after dg_amx_small_begin.
 * _t: acc[p] = [16 n][16 m] (p < mt) over `steps` k steps of 32: B rows at b (row stride ldb
 * elements, BF16; prefetched pf bytes ahead, 0: not), A as DG_PACK_AMX_B R = 16 panels at a
 * (panel stride lda elements).
 * _pp: acc = [16 mt][32] (mt <= 2) over 32-column DG_PACK_AMX_B panel b (prefetched pf bytes
 * ahead, 0: not), A as DG_PACK_AMX_A R = 16.
 * accumulate: continue from acc, else start from zero. _scale: the DG_UKR_SCALE epilogue. */
void dg_amx_small_begin(void);
void dg_amx_small_t(int64_t steps, const uint16_t *b, int64_t ldb, int64_t pf, const uint16_t *a, int64_t lda,
                    int mt, float *acc, int accumulate);
void dg_amx_small_t_scale(int mt, const float *acc, float *total, const float *sa, int64_t sa_stride,
                          const float *sb);
void dg_amx_small_pp(int64_t steps, const uint16_t *a, int64_t lda, int mt, const uint16_t *b, int64_t pf,
                     float *acc, int accumulate);
void dg_amx_small_pp_scale(const float *acc, float *total, const float *sa, const float *sb);
/* rows x n E4M3 codes (row stride ld) -> BF16 (row stride ldd), the values of dg_widen_e4m3_avx512
 * at scale 1; prefetches `ahead` bytes further along each source row (0: none). */
void dg_amx_widen_e4m3_rows(const uint8_t *src, int64_t ld, int rows, int64_t n, int64_t ahead, uint16_t *dst,
                            int64_t ldd);
/* dg_amx_small_t with B given as E4M3 codes (16 rows at b, row stride ldb bytes, 32 * steps
 * codes each), widened per k step into buf (4 KiB, 64-byte aligned) with the values of
 * dg_amx_widen_e4m3_rows: the same bits as widening first. Needs AVX512-VBMI: dg_cpu_has_avx512_vbmi. */
void dg_amx_small_t_e4m3(int64_t steps, const uint8_t *b, int64_t ldb, int64_t pf, const uint16_t *a, int64_t lda,
                         int mt, float *acc, int accumulate, uint16_t *buf);
/* dg_amx_small_t with B given as E2M1 codes (16 rows at b, row stride ldb bytes, 16 * steps
 * bytes each, low nibble first), widened per k step into buf (4 KiB, 64-byte aligned). adj
 * (NULL: none): row r's K block q at adj[r * ldadj + q], from dg_amx_e2m1_adj (the rows'
 * power-of-two scales); step s is in block (t0 + s) / spb. The values of
 * dg_widen_e2m1_blocks_avx512 with those scales, so the same bits as widening first. */
void dg_amx_small_t_e2m1(int64_t steps, const uint8_t *b, int64_t ldb, int64_t pf, const int32_t *adj,
                         int64_t ldadj, int64_t t0, int64_t spb, const uint16_t *a, int64_t lda, int mt, float *acc,
                         int accumulate, uint16_t *buf);
/* DG_AMX_E2M1_PLANES: a K-major E2M1 B pre-packed for the AMX small-M kernel (prepack.c,
 * pack_e2m1_amx_planes), in dg_e2m1_panels.codes on AMX configurations: panel P holds rows
 * 16P .. 16P + 15 over K in steps of 32 k, DG_AMX_E2M1_STEP_BYTES per step, panels
 * ceil(K / 32) steps apart; in step s, group g (rows 16P + 4g .. + 3) is 64 bytes at 64 g whose
 * little-endian 16-bit word w holds the codes of k = 32 s + w, row 4g + q in bits 4q .. 4q + 3.
 * Codes past K and past B's rows are zero (+0). The same bytes per weight as the row-major
 * codes (0.5), and the same size and panel steps as DG_DECODE_E2M1P (slicing is shared). */
#define DG_AMX_E2M1_STEP_BYTES 256
/* dg_amx_small_t_e2m1 on nb (1, or 2 when mt == 1) consecutive 16-row panels of such planes:
 * the first at p (its step 0 at p, so p = panel + 256 * (k0 / 32)), the next ldp bytes on;
 * block b's accumulator at acc + 256 b when nb is 2. sfe (NULL: no scales): the panels' scales
 * as biased exponent bytes (scale 2^(e - 127)), [q][16] per panel, panels ldsfe bytes apart,
 * every one accepted by dg_amx_e2m1_adj (checked at packing: dg_e2m1_panels.exact); step s is
 * in block (t0 + s) / spb. buf: 8 KiB, 64-byte aligned. pf: bytes ahead in each panel's stream
 * to hint into L2 (0: none). The same values and tile steps as dg_amx_small_t_e2m1 on the
 * row-major codes with those scales: the same bits. */
void dg_amx_small_t_e2m1_planes(int64_t steps, const uint8_t *p, int64_t ldp, int nb, int64_t pf, const uint8_t *sfe,
                                int64_t ldsfe, int64_t t0, int64_t spb, const uint16_t *a, int64_t lda, int mt,
                                float *acc, int accumulate, uint16_t *buf);
/* Whether dg_amx_e2m1_adj accepts scale s (a power of two 2^e, |e| <= 125). */
static inline bool dg_amx_e2m1_scale_ok(float s) {
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    return !(u & 0x807fffffu) && (u >> 23) >= 2 && (u >> 23) <= 252;
}
/* adj[i] for dg_amx_small_t_e2m1 from n float scales; false (adj partly written) when one is not
 * a power of two 2^e with |e| <= 125, where adding to the exponent is not the rounded product. */
bool dg_amx_e2m1_adj(const float *scales, int64_t n, int32_t *adj);
/* The same from n UE8M0 bytes (scale 2^(e - 127)) instead of their float values. */
bool dg_amx_e2m1_adj_ue8m0(const uint8_t *e, int64_t n, int32_t *adj);

void dg_pack_bf16_kmajor_avx512(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t kc,
                                int64_t k, dg_pack_fmt fmt, void *dst);
void dg_pack_bf16_mn_amx_a_avx512(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0, int64_t k,
                                  uint16_t *dst);
void dg_pack_bf16_mnmajor_avx512(const uint16_t *src, int64_t ld, int64_t rows, int r, int64_t k0,
                                 int64_t kc, int64_t k, dg_pack_fmt fmt, void *dst);
void dg_widen_e4m3_avx512(const uint8_t *src, int64_t n, float scale, uint16_t *out);
void dg_widen_e2m1_avx512(const uint8_t *src, int64_t n, float scale, uint16_t *out);
void dg_widen_e2m1_blocks_avx512(const uint8_t *src, int64_t n, int64_t first, int64_t blk, const float *scales,
                                 uint16_t *out);
void dg_ukr_bf16_avx512bf16_mr1(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                                const float *sa, const float *sb);
void dg_ukr_bf16_avx512bf16_mr2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                                const float *sa, const float *sb);
void dg_ukr_bf16_avx512bf16_mr4(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                                const float *sa, const float *sb);
void dg_ukr_bf16_avx512bf16_mr8(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                                const float *sa, const float *sb);
void dg_ukr_f32_avx512_mr1(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                           const float *sa, const float *sb);
void dg_ukr_f32_avx512_mr2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                           const float *sa, const float *sb);
void dg_ukr_f32_avx512_mr4(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                           const float *sa, const float *sb);
void dg_ukr_f32_avx512_mr8(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mode,
                           const float *sa, const float *sb);

/* Panel memory from a process-wide pool (workspace.c): 64-byte (large: 2 MiB) aligned,
 * contents undefined; give it back with dg_ws_put. NULL when out of memory. */
void *dg_ws_get(size_t bytes);
void dg_ws_put(void *p);
/* Frees the pooled blocks no call holds (tests: so that the next call allocates afresh). */
void dg_ws_release_idle(void);

/* A packed operand (see the format above). */
typedef struct dg_packed {
    dg_pack_fmt fmt;
    int r;                 /* rows per panel */
    int64_t mn, k, kp;     /* logical rows, K, padded K */
    int64_t panels;
    void *data;            /* panels * kp * r elements */
    int gblk;              /* 0: no scales packed (ones; the epilogue still runs per block of the
                            * plan's gblk); else the K block of the packed unfolded scales */
    int64_t nkb;           /* ceil(K / gblk) */
    float *scales;         /* panels * nkb * r, or NULL (all ones) */
} dg_packed;

/* How the scales of an operand pair are applied: which ones are folded, and gblk. */
typedef struct dg_scale_plan {
    int fold_a, fold_b;    /* fold into packed values (power-of-two scales) */
    int gblk;              /* the accumulation block, dg_engine_k_block (never 0) */
} dg_scale_plan;

/* Decides the plan; false when the engine cannot run this pair (the caller falls back). */
bool dg_engine_plan_scales(const dg_operand *a, const dg_operand *b, dg_scale_plan *plan);

/* Row i of op (group 0), k in [k0, k1), widened to BF16 bits (exact), power-of-two scales
 * folded when `fold`; zero for k >= K. `isa` supplies SIMD widening (NULL: portable code). */
void dg_engine_fetch_bf16(const dg_operand *op, int64_t i, int fold, int64_t k0, int64_t k1, uint16_t *out,
                          const dg_engine_cfg *isa);

/* Packs rows [0, op->mn) of operand `op` (group 0) into panels of r rows (pack.c) with the
 * packers of configuration `isa` (NULL: portable code only). */
dg_status dg_engine_pack(const dg_operand *op, int fold, int gblk, dg_pack_fmt fmt, int r,
                         const dg_engine_cfg *isa, dg_packed *out);
void dg_engine_packed_free(dg_packed *p);

/* D[i, n0 .. n0 + cols) = round(C + acc[0 .. cols)) in D's dtype (gemm.c). C may be D itself. */
void dg_engine_store_row(const dg_tensor *d, const dg_tensor *c, int64_t i, int64_t n0, int64_t cols,
                         const float *acc);

/* The small-M path (smallm.c): the largest M it runs under cfg, whether it takes this pair,
 * and the call. */
int64_t dg_engine_small_m_max(const dg_engine_cfg *cfg);
bool dg_engine_small_applies(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b);
dg_status dg_engine_gemm_small(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                               const dg_scale_plan *plan, const dg_tensor *d, const dg_tensor *c);
/* dg_engine_gemm_small (c NULL) for a B whose float32 scales have not been scanned, on the
 * assumption that every one is a power of two (plan->fold_b, b->sf_pow2 1): on AMX the kernel
 * that widens K-major FP4 codes in the tile loop checks each scale it folds anyway
 * (dg_amx_e2m1_adj), so the scan before the call (1 x 32 float scales are a fifth of the bytes
 * an FP4 decoding call reads; 14% of an M = 1 call on Sapphire Rapids) is not needed. Sets
 * *refuted when a scale is not a power of two or the call is not one of those; D's contents
 * are then unspecified and the caller runs the scanned plan (the same bits as ever). */
dg_status dg_engine_gemm_small_assume_pow2(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                                          const dg_scale_plan *plan, const dg_tensor *d, bool *refuted);
/* Whether that kernel takes B under plan (fold_b assumed): no call is made where it would only
 * be refuted at once (other scale blocks, K tails, MN-major codes). */
bool dg_engine_small_assume_pow2_applies(const dg_engine_cfg *cfg, const dg_operand *b, const dg_scale_plan *plan);
/* Whether the pair takes that assumption: B E2M1 with unscanned float32 scales (b->sf_pow2 0)
 * on the AMX small-M path with the checking kernel; *plan: the plan under it. */
bool dg_engine_assume_pow2_applies(const dg_operand *a, const dg_operand *b, dg_scale_plan *plan);
/* dg_engine_gemm without C on that assumption, where it applies; *refuted: it did not apply or did not hold,
 * and D must be computed otherwise (dg_engine_gemm does so itself; grouped.c for a whole group).
 * Running out of memory on that second run leaves D partly written (the one exception to
 * "nothing written on failure": the first run already wrote it). */
dg_status dg_engine_gemm_assuming_pow2(const dg_operand *a, const dg_operand *b, const dg_tensor *d, bool *refuted);
/* A K-major E2M1 B (fp4_dim 1) pre-packed for the decode kernels (prepack.c): its codes as
 * DG_DECODE_E2M1P panels and, when B's scales are folded (powers of two: UE8M0, the FP4 weight
 * recipes), the scales' biased exponents per panel of 16 rows, sfe [panel][q][16] for the K
 * blocks q of gran_k (127, i.e. 1, past B's rows; NULL: other scales), so that a call reads
 * 16 bytes per panel and block instead of B's float scales element by element (which had cost
 * a third of an M = 1 call); exact[panel] = 1 when every scale of the panel passes
 * dg_decode_fold_exact (unit 1). On AMX configurations codes holds DG_AMX_E2M1_PLANES instead,
 * read only by the AMX small-M path, with sfe as above and exact[panel] = 1 when every scale
 * of the panel passes dg_amx_e2m1_scale_ok. */
/* Whether a folded scale s can be applied to a code's value (the format's unit times s) by one
 * exact multiply: value * s stays a normal float32 and unit * s is finite. Checked per call by
 * the decode driver (smallm.c) and once at packing for decode panels (prepack.c). */
static inline int dg_decode_fold_exact(float s, float unit) { return (s >= 0x1p-100f) & (s * unit <= 0x1p127f); }

typedef struct dg_e2m1_panels {
    const uint8_t *codes;
    const uint8_t *sfe;
    const uint8_t *exact;
} dg_e2m1_panels;
/* The same call where b also exists as such panels (NULL: none): the decode kernels read the
 * panels, anything else (other M, the exact fallback) reads b. The same bits either way. */
dg_status dg_engine_gemm_small_panels(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                                      const dg_e2m1_panels *panels, const dg_scale_plan *plan,
                                      const dg_tensor *d, const dg_tensor *c);

/*
 * D = C + A @ B^T with the current ISA and thread count. Returns DG_ERR_UNSUPPORTED (without
 * touching D) when this operand pair is outside the engine; callers then use the reference.
 * Only allocation failures are other errors.
 */
dg_status dg_engine_gemm(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const dg_tensor *c);

/* The large-M tile loop on packed A (MR panels) and B (NR panels) of configuration cfg, in K
 * blocks of gblk (the pair's dg_engine_k_block; the panels' scales, if any, at that block). */
dg_status dg_engine_run_packed(const dg_engine_cfg *cfg, const dg_packed *pa, const dg_packed *pb, int gblk,
                               const dg_tensor *d, const dg_tensor *c);

/* ---- Pre-packed B (prepack.c, public as dg_packed_b): a dg_packed of NR-row panels (the
 * format above) for the configuration current when packing (its `cfg` is recorded; a GEMM
 * under another configuration fails with DG_ERR_VALUE). Panels are DG_PACK_BF16 on
 * configurations with a small-M path (AVX-512 levels: half the bytes for decoding; widened to
 * float32 per K slice, or per call for large M on a float32 kernel), else the kernel's format.
 * Scales are folded exactly as dg_engine_plan_scales would fold them (UE8M0 / power-of-two B
 * scales), otherwise kept as float S[kb][NR] per panel at B's own gran_k (re-gridded per call
 * to gcd with A's gran_k). The panels live in memory of their own, not the workspace pool. */

#endif /* DG_ENGINE_ENGINE_H */
