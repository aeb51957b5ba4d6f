/*
 * config.c - the engine's per-ISA configuration table (data only, as BLIS's config/<cpu>/):
 * which microkernel and packed format, the register tile MR x NR and the cache blocks.
 *
 * Block sizes (float32 panels; BF16 panels take half the bytes):
 *   KC x NR      B micro-panel, kept in L1 (256 x 32 x 4 = 32 KiB) while MC/MR A panels pass
 *   MC x KC      A block, kept in L2 (224 x 256 x 4 = 224 KiB)
 *   MC x NC      the float32 accumulation tile of one thread (224 x 512 x 4 = 448 KiB, L2)
 * MC, NC also set the threading grain: threads take whole MC x NC output tiles.
 *
 * The AVX-512 BF16 level has two kernels giving the same bits (engine.h): VDPBF16PS on BF16
 * panels, or BF16 widened to float32 while packing and FMA. Which is faster depends on the
 * core: AMD Zen 4 issues one VDPBF16PS zmm per cycle but one zmm FMA (32 vs 16 products per
 * cycle), while Intel cores from Cooper Lake / Sapphire Rapids on issue two zmm FMAs per cycle
 * and one VDPBF16PS every other cycle (32 vs 16 the other way round; dgbench measures both).
 * So the default is VDPBF16PS except on Intel; dg_engine_set_dpbf16 overrides (tests use it).
 * Measured on an Intel (Sapphire Rapids class) core, kernels on L1-resident panels: VDPBF16PS
 * 113 GFLOPS (its peak), FP32 FMA ~195 GFLOPS (85% of its peak); inside a 2048 x 2112 x 7168
 * GEMM on one core: ~100 and ~155 GFLOPS.
 *
 * AMX (Sapphire Rapids on): 32 x 32 register tiles (2 x 2 tiles of 16 x 16, kernels/amx/),
 * A in DG_PACK_AMX_A, B in DG_PACK_AMX_B panels, the same tile loop. Measured on one core: the
 * microkernel reaches 2000-2300 GFLOPS on L2-resident panels, but ~1000 inside a
 * 2048 x 2112 x 7168 GEMM at MC x NC x KC = 512 x 512 x 256 (850-950 at 256 x 512 or
 * 384 x 384): the loss is fetching each tile's packed blocks from L3, which software
 * prefetching of the next K slice did not hide.
 * Re-measured 2026-12-06 (another Sapphire Rapids VM, 1 thread, 4096 x 2112 x 7168, kernel
 * calls timed by class): a call whose A panel (first B micro-panel of a K slice) or B panel
 * (first A panel) is new costs 4000-4600 TSC cycles, others 850-900 (~1500 GFLOPS; 2300 with
 * both panels in L1); the first-touch calls are 13% of calls and 43% of the kernel's time: the
 * packed operands (88 MB) stream from DRAM (~14 GB/s per core here). Software prefetches
 * (T0, T1 or T2) of the next B micro-panel across the current one's calls, of the next K
 * slice's A block across the slice or its last quarter, left the first-touch calls' cost
 * unchanged (4000-4700) on an idle machine; demand loads of the same lines did lower it
 * (3300 / 2100) but slowed the other calls more. MC x NC of 256 x 256 to 1024 x 128 and
 * 512 x 544 (no thin last tile) were no faster either. Reading A's rows in place (tile loads
 * with the row stride, no packed copy) was 15% slower: each tile load then touches 16 pages
 * (it pays where N fits one NC block and packing A is a pass of its own: gemm.c, a_in_place;
 * 4096 x 256 x 7168 16.3 -> 9.6 ms);
 * packing A per tile and K slice by the computing thread, 92-96 against 82 ms (2 threads).
 * Re-measured 2026-12-07 (Sapphire Rapids VM, the microkernel alone, ACC calls, TSC cycles per
 * call against 512 for its 32 TDPBF16PS): KC = 256 with A, B and C in L1 ~690 (74%); A cycling
 * through 16 panels in L2 ~750 (68%); C too cycling through the 256 micro-tiles of a
 * 512 x 512 tile (1 MiB, L2), as in the GEMM, ~920 (56%); KC = 1024, A and B both from L2,
 * 4250 of 2048 (48%): tile loads from L2 are what the kernel waits on, so KC stays at 256 (the
 * B micro-panel in L1). Hinting the next B micro-panel into L2 across the calls (gemm.c)
 * gained 2-8%; the next slice's A block spread over the slice's calls, or a whole A panel
 * before each call (3x slower: the hints fill the line buffers the tile loads need), did not.
 */
#include "engine.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64) /* CMake builds the ISA kernels for x86-64 only */
#define DG_X86 1
#else
#define DG_X86 0
#endif

/* AVX-512 BF16 (VDPBF16PS) small_m_max 256: measured on Zen 5 (2 threads, N 2112, K 7168, BF16),
 * small-M vs large-M path: M = 80 4.7 vs 5.5-6.3 ms, 128 6.2-6.7 vs 7.2-7.9, 192 8.3-9.2 vs
 * 9.4-9.9, 256 11.3-11.6 vs 13.6, 512 20.9 vs 24.7, 1024 45.7 vs 45.1 (A no longer in cache);
 * masked g32 x 192 rows (N 7168, K 3072): 394 vs 522 ms (FP8). Past ~768 rows the small-M path
 * loses: it streams all of A once per 32 columns of B. 256: the same bound as AVX2's. */
/* AVX-512 BF16 wide decode kernels up to M = 64: measured on Zen 5 (see README, Decoding). */
#define DECODE_WIDE_MAX_M_AVX512BF16 64
_Static_assert(DECODE_WIDE_MAX_M_AVX512BF16 <= DG_DECODE_WIDE_MAX_M,
               "the wide kernels' buffers hold DG_DECODE_WIDE_MAX_M rows");
#define AVX512_SMALL {dg_ukr_f32_avx512_mr1, dg_ukr_f32_avx512_mr2, dg_ukr_f32_avx512_mr4, dg_ukr_f32_avx512_mr8}
/* AVX2 small_m_max 256: measured on Zen 3 (2 threads, N 2112, K 7168, BF16), small-M vs
 * large-M path: M = 65 13.4 vs 20.3 ms, 128 27.1 vs 35.0, 256 48.1-50.5 vs 60.2, 512 113 vs
 * 97 (the large-M AVX2 path packs all of B as float32 per call). */
#define AVX512_F32_CFG(name)                                                                                 \
    {name, DG_PACK_F32, 14, 32, 224, 512, 256, dg_ukr_f32_avx512, dg_pack_bf16_kmajor_avx512,                  \
     dg_pack_bf16_mnmajor_avx512, dg_widen_e4m3_avx512, dg_widen_e2m1_avx512, AVX512_SMALL,                    \
     .widen_e2m1_blocks = dg_widen_e2m1_blocks_avx512,                                                        \
     .decode = {dg_decode_bf16_avx512, dg_decode_e4m3_avx512, dg_decode_e2m1_avx512, dg_decode_pairs_avx2},   \
     .decode_rows = {DG_DECODE_WIDE_ROWS, DG_DECODE_WIDE_ROWS, DG_DECODE_WIDE_ROWS},                          \
     .stage_e4m3 = dg_decode_stage_e4m3_avx512, .stage_e2m1 = dg_decode_stage_e2m1_avx512}
static const dg_engine_cfg kCfg[] = {
    [DG_ISA_GENERIC] = {"generic/f32", DG_PACK_F32, 4, 16, 64, 256, 256, dg_ukr_f32_generic},
#if DG_X86
    [DG_ISA_AVX2] = {"avx2/f32", DG_PACK_F32, 6, 16, 192, 512, 256, dg_ukr_f32_avx2,
                     dg_pack_bf16_kmajor_avx2, dg_pack_bf16_mnmajor_avx2, dg_widen_e4m3_avx2, dg_widen_e2m1_avx2,
                     {dg_ukr_f32_avx2_mr1, dg_ukr_f32_avx2_mr2, dg_ukr_f32_avx2_mr4, dg_ukr_f32_avx2},
                     .small_mr = {1, 2, 4, 6}, .small_m_max = 256,
                     .decode = {dg_decode_bf16_avx2, dg_decode_e4m3_avx2, dg_decode_e2m1_avx2, dg_decode_pairs_avx2},
                     /* FP4: 4 FMA chains per row of A (decode_avx2.c); BF16 and FP8 rows, whose
                      * staged chunks span 2-4 lines per row, measured slower with 32 */
                     .decode_rows = {[DG_DECODE_E2M1] = DG_DECODE_WIDE_ROWS},
                     .stage_e4m3 = dg_decode_stage_e4m3_avx2, .stage_e2m1 = dg_decode_stage_e2m1_avx2},
    [DG_ISA_AVX512] = AVX512_F32_CFG("avx512/f32"),
    [DG_ISA_AVX512_BF16] = {"avx512_bf16/bf16", DG_PACK_BF16, 14, 32, 224, 512, 256, dg_ukr_bf16_avx512bf16,
                            dg_pack_bf16_kmajor_avx512, dg_pack_bf16_mnmajor_avx512,
                            dg_widen_e4m3_avx512, dg_widen_e2m1_avx512,
                            {dg_ukr_bf16_avx512bf16_mr1, dg_ukr_bf16_avx512bf16_mr2, dg_ukr_bf16_avx512bf16_mr4,
                             dg_ukr_bf16_avx512bf16_mr8},
                            .small_fmt = DG_PACK_BF16, .widen_e2m1_blocks = dg_widen_e2m1_blocks_avx512, .small_m_max = 256,
                            .decode = {dg_decode_bf16_avx512bf16, dg_decode_e4m3_avx512bf16, dg_decode_e2m1_avx512bf16, NULL,
                                       dg_decode_e2m1p_avx512bf16, dg_decode_e4m3p_avx512bf16},
                            .decode_wide = {dg_decode_wide_bf16_avx512bf16, dg_decode_wide_e4m3_avx512bf16,
                                            dg_decode_wide_e2m1_avx512bf16, NULL, dg_decode_wide_e2m1p_avx512bf16},
                            .decode_wide_max_m = DECODE_WIDE_MAX_M_AVX512BF16, .decode_pairs = true,
                            .decode_groups = {[DG_DECODE_E4M3] = true, [DG_DECODE_E2M1] = true, [DG_DECODE_E2M1P] = true, [DG_DECODE_E4M3P] = true},
                            .decode_sf_in_place = true},
#if defined(DG_HAVE_AMX)
    [DG_ISA_AMX] = {"amx/bf16", DG_PACK_AMX_B, 32, 32, 512, 512, 256, dg_ukr_bf16_amx,
                    dg_pack_bf16_kmajor_avx512, dg_pack_bf16_mnmajor_avx512,
                    dg_widen_e4m3_avx512, dg_widen_e2m1_avx512, {NULL},
                    .amx = 1, .fallback = DG_ISA_AVX512_BF16, .ukr_begin = dg_ukr_bf16_amx_begin,
                    .pack_amx_a_mn = dg_pack_bf16_mn_amx_a_avx512, .widen_e2m1_blocks = dg_widen_e2m1_blocks_avx512,
                    .ukr_f64 = dg_ukr_bf16_amx_f64, .ukr_a_rows = dg_ukr_bf16_amx_a_rows},
#endif
#else
    [DG_ISA_AVX2] = {"generic/f32", DG_PACK_F32, 4, 16, 64, 256, 256, dg_ukr_f32_generic},
    [DG_ISA_AVX512] = {"generic/f32", DG_PACK_F32, 4, 16, 64, 256, 256, dg_ukr_f32_generic},
    [DG_ISA_AVX512_BF16] = {"generic/f32", DG_PACK_F32, 4, 16, 64, 256, 256, dg_ukr_f32_generic},
    [DG_ISA_AMX] = {"generic/f32", DG_PACK_F32, 4, 16, 64, 256, 256, dg_ukr_f32_generic},
#endif
};

/* The avx512_bf16 level where FP32 FMA is the faster instruction (Intel, see above): the
 * AVX-512 F kernels, under the level's own name so that path reports and errors say which
 * level chose them. */
#if DG_X86
static const dg_engine_cfg kAvx512Bf16OnFma = AVX512_F32_CFG("avx512_bf16/f32");
#endif

bool dg_engine_subnormal_guard(void) { return strcmp(dg_cpu()->vendor, "GenuineIntel") == 0; }

static atomic_int g_dpbf16 = -1; /* -1: by CPU vendor */

void dg_engine_set_dpbf16(int use) { atomic_store(&g_dpbf16, use < 0 ? -1 : use > 0); }

bool dg_engine_dpbf16(void) {
    const int v = atomic_load(&g_dpbf16);
    if (v >= 0)
        return v;
    return strcmp(dg_cpu()->vendor, "GenuineIntel") != 0;
}

const dg_engine_cfg *dg_engine_config(dg_isa isa) {
    if ((int)isa < 0 || (int)isa >= (int)(sizeof kCfg / sizeof kCfg[0]))
        isa = DG_ISA_GENERIC;
#if DG_X86
    if (isa == DG_ISA_AVX512_BF16 && !dg_engine_dpbf16())
        return &kAvx512Bf16OnFma;
#endif
    return &kCfg[isa];
}

const dg_engine_cfg *dg_engine_config_for(const dg_engine_cfg *cfg, const dg_scale_plan *plan) {
    if (cfg->amx && plan->gblk % 32 != 0)
        return dg_engine_config(cfg->fallback);
    return cfg;
}

/*
 * The small-M kernel for M rows. Default ({1, 2, 4, 8}): the smallest that holds M, else the
 * largest. With small_mr given (AVX2: 2 x 8 columns per row, 16 registers): an MR-row kernel
 * runs 2 * MR independent FMA chains, one FMA per k each; with FMA latency 4 and 2 FMAs per
 * cycle, chains of fewer than 4 rows wait on latency, so a k step costs max(MR, 4) half-cycles
 * per panel and M rows cost ceil(M / MR) * max(MR, 4): M = 8 and 16 run 4-row panels (no
 * padding), M = 6 the 6-row kernel.
 */
int dg_engine_small_kernel(const dg_engine_cfg *cfg, int64_t m, int *mr) {
    static const int kDefault[4] = {1, 2, 4, 8};
    if (!cfg->small_mr[0]) {
        int which = 3;
        while (which > 0 && kDefault[which - 1] >= m)
            --which;
        *mr = kDefault[which];
        return which;
    }
    int best = 0;
    int64_t best_cost = -1;
    for (int i = 0; i < 4; ++i) {
        const int r = cfg->small_mr[i];
        const int64_t cost = (m + r - 1) / r * (r > 4 ? r : 4);
        if (best_cost < 0 || cost < best_cost)
            best = i, best_cost = cost;
    }
    *mr = cfg->small_mr[best];
    return best;
}

dg_ukr_fn dg_engine_tail_kernel(const dg_engine_cfg *cfg, int64_t rows, int *r) {
    *r = cfg->mr;
    if (rows <= 0 || rows >= cfg->mr || cfg->amx || cfg->small_fmt != cfg->fmt || !cfg->ukr_small[0])
        return cfg->ukr;
    int sr;
    const int which = dg_engine_small_kernel(cfg, rows, &sr);
    if (sr < rows || sr >= cfg->mr || !cfg->ukr_small[which]) /* more than one panel, or no saving */
        return cfg->ukr;
    *r = sr;
    return cfg->ukr_small[which];
}

bool dg_engine_rows_crowd_l1(int64_t ld, int rows) {
    enum { LINE = 64, SETS = 64 }; /* virtually indexed: sets x line = the 4 KiB page */
    const int64_t l1 = dg_cpu_cache_bytes(1);
    const int ways = l1 >= SETS * LINE ? (int)(l1 / (SETS * LINE)) : 8;
    int count[SETS] = {0}, most = 0;
    for (int r = 0; r < rows; ++r) {
        const int set = (int)(((uint64_t)r * (uint64_t)ld / LINE) % SETS);
        if (++count[set] > most)
            most = count[set];
    }
    return most > ways;
}
