/*
 * smallm.c - the engine's small-M path (decoding: M <= 64; on AVX2 and VDPBF16PS AVX-512 BF16 M <= 256),
 * bound by reading B once.
 *
 * B is never packed as a whole: each thread takes blocks of NR columns and, for each K slice,
 * transposes that NR x slice piece of B from memory into an L1/L2 buffer in the small-M
 * kernels' format (float32, or BF16 pairs where the large-M kernel is VDPBF16PS; the ISA's
 * BF16 packer; BF16 K-major B is read in place, other dtypes/layouts are widened to BF16 rows
 * first), then runs the microkernel over the few A panels (MR = 1, 2, 4 or 8 rows, the same
 * kernel body instantiated per MR), with the per-K-block scale epilogue when scales are not
 * folded. Per output element the operations are exactly the large-M path's (engine.h: one
 * fma chain over k pairs, odd k first, blocks combined in order), so a row of D does not
 * depend on M or on which path ran it (batch invariance).
 *
 * Applies on ISAs with a BF16 packer and small-M kernels (AVX2 and AVX-512 levels); elsewhere
 * (portable C) small M takes the general path.
 *
 * On AMX configurations (section at the end) the large-M kernel's order is TDPBF16PS's, so
 * this path uses TDPBF16PS too, on D^T tiles: 16 rows of B (read in place when BF16 K-major,
 * K-major E4M3 / E2M1 codes widened per k step inside the tile loop, else widened to BF16 rows
 * in L1) are the tile-A operand, A packed once per call (VNNI pairs,
 * 16-row panels) the tile-B operand. Per element: the same k steps of 32 with the same zero
 * padding, the same scale epilogue per K block, the same store, so rows match the large-M path
 * bitwise (tests/test_engine_smallm_amx.c). The choice depends only on the configuration and M.
 */
#include "engine.h"
#include "jit_ukr.h"

#include <stdatomic.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define DG_X86 1
#else
#define DG_X86 0
#endif

#define SMALL_M_MAX 64 /* unless the configuration says otherwise (small_m_max) */
#define AMX_SMALL_M_MAX 64 /* 4 tiles of 16 rows; at M = 64 still ~6x the general path (which packs B) */
#define SMALL_KC 128 /* NR x slice float32 B piece: 32 x 128 x 4 = 16 KiB, stays in L1 */

int64_t dg_engine_small_m_max(const dg_engine_cfg *cfg) {
    if (cfg->amx)
        return AMX_SMALL_M_MAX;
    return cfg->small_m_max ? cfg->small_m_max : SMALL_M_MAX;
}

bool dg_engine_small_applies(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b) {
    (void)b;
    if (cfg->amx)
        return DG_X86 && a->mn <= AMX_SMALL_M_MAX;
    return a->mn <= dg_engine_small_m_max(cfg) && cfg->pack_bf16 && cfg->ukr_small[0];
}

typedef struct small_job {
    const dg_engine_cfg *cfg;
    const dg_operand *b;
    const dg_scale_plan *plan;
    const dg_packed *pa;
    dg_ukr_fn ukr;
    int mr;
    int64_t slice;   /* K slice: SMALL_KC rounded down to whole accumulation blocks (gblk) */
    const float *ones;
    bool subnormal_guard; /* dg_engine_subnormal_guard, for the E4M3 staging */
} small_job;

/* B row n at k in memory (K-major layouts; NULL otherwise), to prefetch rows ahead of widening. */
static const char *b_row_at(const dg_operand *b, int64_t n, int64_t k) {
    const dg_tensor *t = b->data;
    if (t->strides[1] != 1)
        return NULL;
    if (t->dtype == DG_BFLOAT16)
        return (const char *)t->data + 2 * (n * t->strides[0] + k);
    if (b->fp4_dim == 1)
        return (const char *)t->data + n * t->strides[0] + k / 2;
    return t->dtype == DG_FLOAT8_E4M3 ? (const char *)t->data + n * t->strides[0] + k : NULL;
}

/* B rows [n0, n0 + cols), k in [k0, k0 + kc), as an NR-wide panel slice in bbuf, in the small-M kernels'
 * format (cfg->small_fmt: float32, or BF16 pairs). */
static void stage_b(const small_job *j, int64_t n0, int64_t cols, int64_t k0, int64_t kc, uint16_t *stage,
                    float *bbuf) {
    const dg_operand *b = j->b;
    const int nr = j->cfg->nr;
    const dg_tensor *t = b->data;
    /* Each row's slice after next, fetched while this one is widened: the hardware prefetchers
     * do not follow NR short row streams (FP8 B at M = 16 on Zen 5: the widening waited on
     * memory 80% of its time). */
    const int64_t kn = k0 ? k0 + 2 * kc : kc, ahead = k0 ? kc : 2 * kc; /* two slices ahead */
    const int64_t span = kn + ahead < b->k ? ahead : b->k - kn; /* inside the rows */
    const int64_t bytes = t->dtype == DG_BFLOAT16 ? 2 * span : b->fp4_dim == 1 ? (span + 1) / 2 : span;
    for (int r = 0; r < cols && kn < b->k; ++r) {
        const char *p = b_row_at(b, n0 + r, kn);
        for (int64_t o = 0; p && o < bytes; o += 64)
            __builtin_prefetch(p + o, 0, 2);
    }
    if (t->dtype == DG_BFLOAT16 && t->strides[1] == 1) { /* read in place */
        j->cfg->pack_bf16((const uint16_t *)t->data + n0 * t->strides[0], t->strides[0], cols, nr, k0, kc, b->k,
                          j->cfg->small_fmt, bbuf);
        return;
    }
    if (t->dtype == DG_FLOAT8_E4M3 && t->strides[1] == 1 && !(j->plan->fold_b && b->sf) && j->cfg->stage_e4m3 &&
        k0 % 8 == 0 && j->cfg->small_fmt == DG_PACK_F32) { /* FP8 weights, one pass (NaN: below); [kc][nr] */
        dg_decode_job job;
        memset(&job, 0, sizeof job);
        job.b = (const uint8_t *)t->data + n0 * t->strides[0], job.ldb = t->strides[0];
        job.rows = (int)cols, job.k = b->k, job.subnormal_guard = j->subnormal_guard;
        if (j->cfg->stage_e4m3(&job, k0, kc, bbuf))
            return;
    }
    const bool fold = j->plan->fold_b && b->sf;
    if (t->dtype == DG_FP4_E2M1X2 && b->fp4_dim == 1 && !b->grouped && t->strides[1] == 1 && j->cfg->stage_e2m1 &&
        k0 % 16 == 0 && kc % 16 == 0 && (!fold || (b->gran_k % 16 == 0 && k0 % b->gran_k == 0)) &&
        j->cfg->small_fmt == DG_PACK_F32) {
        /* FP4 weights, one pass into [kc][nr], their folded scales (as the decode kernels take
         * them) in the staging rows' room: at most kc / 16 blocks of nr floats */
        dg_decode_job job;
        memset(&job, 0, sizeof job);
        job.b = (const uint8_t *)t->data + n0 * t->strides[0] + k0 / 2, job.ldb = t->strides[0];
        job.rows = (int)cols, job.k = b->k - k0, job.lanes = nr;
        int ok = 1;
        if (fold) {
            float *fm = (float *)(void *)stage;
            const int64_t kv = b->k - k0 < kc ? b->k - k0 : kc, nq = dg_ceil_div(kv, b->gran_k);
            for (int r = 0; r < nr; ++r)
                if (r < cols)
                    dg_operand_block_scales(b, n0 + r, k0 / b->gran_k, nq, fm + r, nr);
                else
                    for (int64_t q = 0; q < nq; ++q)
                        fm[q * nr + r] = 1.0f;
            for (int64_t q = 0; q < nq * nr; ++q) /* branch-free: it vectorises */
                ok &= dg_decode_fold_exact(fm[q], 1.0f);
            job.fm = fm, job.fblk = b->gran_k;
        }
        if (ok && j->cfg->stage_e2m1(&job, 0, kc, bbuf))
            return;
    }
    if (t->dtype == DG_BFLOAT16 && t->strides[0] == 1 && j->cfg->pack_bf16_mn) { /* MN-major, in place */
        j->cfg->pack_bf16_mn((const uint16_t *)t->data + n0, t->strides[1], cols, nr, k0, kc, b->k,
                             j->cfg->small_fmt, bbuf);
        return;
    }
    for (int r = 0; r < nr; ++r) {
        if (r < cols)
            dg_engine_fetch_bf16(b, n0 + r, j->plan->fold_b, k0, k0 + kc, stage + r * kc, j->cfg);
        else
            memset(stage + r * kc, 0, (size_t)kc * 2);
    }
    j->cfg->pack_bf16(stage, kc, nr, nr, 0, kc, kc, j->cfg->small_fmt, bbuf);
}

static void block_scales(const dg_operand *b, int64_t n0, int rows, int nrows, int64_t step, int64_t count,
                         int64_t lanes, float *out);

/*
 * Adjacent NR-column blocks of D, columns [n0, n0 + cols): per K slice, every block's piece
 * of B is staged (bbuf [blocks][slice][NR]), then each A panel runs against all of them.
 * cbuf: [blocks][panels][MR][NR].
 */
static void run_blocks(const small_job *j, int64_t n0, int64_t cols, uint16_t *stage, float *bbuf, float *cbuf,
                       float *sb) {
    const dg_packed *pa = j->pa;
    const int nr = j->cfg->nr, mr = j->mr, gblk = j->plan->gblk;
    const int64_t kp = pa->kp, per = pa->panels * mr * nr, nblk = dg_ceil_div(cols, nr);
    const size_t es = j->cfg->small_fmt == DG_PACK_F32 ? 4 : 2; /* bytes per packed element */
    const bool scaled_b = !j->plan->fold_b && j->b->sf;
    memset(cbuf, 0, (size_t)(nblk * per) * sizeof(float));
    /* B's scales of every K block, once per call: sb[(bi * nkb + kb) * nr + s] (rows located once;
     * a dg_operand_scale per element and block, with its two index divisions, had taken a tenth of
     * an FP8 1D2D call at M = 16 on AVX2) */
    const int64_t nkb = dg_ceil_div(kp, gblk);
    for (int64_t bi = 0; bi < nblk && scaled_b; ++bi)
        block_scales(j->b, n0 + bi * nr, (int)(cols - bi * nr < nr ? cols - bi * nr : nr), nr, gblk, nkb, nr,
                     sb + bi * nkb * nr);
    for (int64_t k0 = 0; k0 < kp; k0 += j->slice) {
        const int64_t kc = kp - k0 < j->slice ? kp - k0 : j->slice;
        for (int64_t bi = 0; bi < nblk; ++bi)
            stage_b(j, n0 + bi * nr, cols - bi * nr < nr ? cols - bi * nr : nr, k0, kc, stage,
                    bbuf + bi * (j->slice + 8) * nr);
        for (int64_t ir = 0; ir < pa->panels; ++ir) {
            const char *ap = (const char *)pa->data + (size_t)(ir * kp * mr) * es;
            for (int64_t bi = 0; bi < nblk; ++bi) {
                const char *bb = (const char *)(bbuf + bi * (j->slice + 8) * nr);
                float *cb = cbuf + bi * per + ir * mr * nr;
                for (int64_t kb0 = k0; kb0 < k0 + kc; kb0 += gblk) { /* one scale epilogue per block */
                    const int64_t kb1 = kb0 + gblk < k0 + kc ? kb0 + gblk : k0 + kc;
                    const float *sbp = scaled_b ? sb + (bi * nkb + kb0 / gblk) * nr : j->ones;
                    const float *sap = pa->scales ? pa->scales + (ir * pa->nkb + kb0 / gblk) * mr : j->ones;
                    j->ukr(kb1 - kb0, ap + (size_t)(kb0 * mr) * es, bb + (size_t)((kb0 - k0) * nr) * es, cb, nr,
                           DG_UKR_SCALE, sap, sbp);
                }
            }
        }
    }
}

/* ---- decoding (M <= DG_DECODE_MAX_M, or the wide kernels' bound): B read in place by the
 * configuration's decode kernel ----
 * Calls of DG_DECODE_ROWS columns (wide kernels: DG_DECODE_WIDE_ROWS; engine.h: dg_decode_job).
 * The kernel's per-element operations are the small-M kernels' (same chain, same epilogue, same folded values), so a block may fall back
 * to run_block at any time without changing bits: when the kernel met an E4M3 NaN code, or
 * when a folded scale is outside the range where value * scale is one exact multiply. */

static atomic_int g_decode = 1, g_decode_byte_tables = 1, g_decode_stage_rows = -1;

void dg_engine_set_decode(int use) { atomic_store(&g_decode, use != 0); }
void dg_engine_set_decode_byte_tables(int use) { atomic_store(&g_decode_byte_tables, use != 0); }
void dg_engine_set_decode_stage_rows(int use) { atomic_store(&g_decode_stage_rows, use < 0 ? -1 : use > 0); }

typedef struct decode_plan {
    dg_decode_fn fn;
    const uint8_t *panels; /* B's pre-packed E2M1 decode panels (DG_DECODE_E2M1P), or NULL: B's rows */
    const uint8_t *psfe;   /* their folded scales' exponents per panel (dg_e2m1_panels), or NULL */
    const uint8_t *pexact;
    int64_t panel_bytes;   /* one panel of 16 rows over all of K */
    int64_t lanes;         /* the lane stride of the kernels' scales and output (dg_decode_job) */
    int rows;           /* B rows per call: DG_DECODE_ROWS, or DG_DECODE_WIDE_ROWS (wide kernels) */
    dg_decode_a a;
    int64_t fblk, nkbf; /* fold blocks of B's folded scales (fblk 0: none) */
    bool sf_in_place;   /* the kernel reads B's folded scales in place (dg_decode_job.fs) */
    bool byte_tables;   /* dg_decode_job.byte_tables */
    bool stage_rows;    /* dg_decode_job.stage_rows */
    float unit;         /* the kernel's value unit for codes (2^120 E4M3, 1 E2M1) */
} decode_plan;

/* The largest M the configuration's decode kernels take (DG_DECODE_MAX_M, or the wide kernels'). */
static int64_t decode_max_m(const dg_engine_cfg *cfg) {
    if (!cfg->decode_wide[0] || cfg->decode_wide_max_m <= DG_DECODE_MAX_M)
        return DG_DECODE_MAX_M;
    return cfg->decode_wide_max_m < DG_DECODE_WIDE_MAX_M ? cfg->decode_wide_max_m : DG_DECODE_WIDE_MAX_M;
}

/* The decode kernel format of B, or -1. */
static int decode_format(const dg_operand *b) {
    const dg_tensor *t = b->data;
    if (b->grouped || t->strides[1] != 1)
        return -1;
    if (t->dtype == DG_BFLOAT16 && !b->sf)
        return DG_DECODE_BF16;
    if (t->dtype == DG_FLOAT8_E4M3)
        return DG_DECODE_E4M3;
    return t->dtype == DG_FP4_E2M1X2 && b->fp4_dim == 1 ? DG_DECODE_E2M1 : -1;
}

/* Rows at least this large (m * lda values) are prepared by all threads: serial, M = 64 rows of
 * K = 7168 took a tenth of a 256-column GEMM's time on Zen 4. */
#define DECODE_A_PARALLEL_VALUES (1 << 15)

dg_status dg_engine_decode_a(const dg_engine_cfg *cfg, const dg_operand *a, int fold_a, int gblk, dg_decode_a *out) {
    const int64_t m = a->mn;
    const bool pairs = cfg->decode_pairs; /* the kernels read either the pairs or the float rows */
    out->pairs = NULL;
    out->lda = dg_align(a->k > 0 ? a->k : 1, DG_DECODE_STEP);
    out->nkb = dg_ceil_div(out->lda, gblk); /* gblk >= 1 (dg_engine_k_block) */
    const int64_t lda = out->lda, nkb = out->nkb, steps = dg_ceil_div(lda, 32);
    const int threads = m * lda >= DECODE_A_PARALLEL_VALUES && m > 1 ? (int)(m < dg_num_threads() ? m : dg_num_threads())
                                                                     : 1;
    const int64_t nrows = pairs ? 0 : m * lda;
    /* [rows (float rows only)][sa][one BF16 row per thread, padded to whole steps] */
    float *mem = dg_malloc((size_t)(nrows + m * nkb + 1) * sizeof(float) + (size_t)(threads * steps * 32) * 2);
    if (pairs && mem)
        out->pairs = dg_malloc((size_t)(steps * m * 16 + 1) * sizeof(uint32_t));
    if (!mem || (pairs && !out->pairs)) {
        dg_free(mem);
        out->mem = out->rows = out->sa = NULL;
        return dg_fail(DG_ERR_ALLOC, "out of memory for the decoding GEMM's A rows");
    }
    out->mem = mem;
    out->rows = pairs ? NULL : mem;
    out->sa = mem + nrows;
    uint16_t *const scratch = (uint16_t *)(out->sa + m * nkb + 1);
    float *const rows = out->rows;
    uint32_t *const pr = out->pairs;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t i = 0; i < m; ++i) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        uint16_t *row = scratch + (size_t)tid * (size_t)(steps * 32);
        dg_engine_fetch_bf16(a, i, fold_a, 0, steps * 32, row, cfg); /* zero from K on */
        for (int64_t kb = 0; kb < nkb; ++kb) /* as pack_scales: 1 where A's scales are folded */
            out->sa[i * nkb + kb] = !fold_a && a->sf && kb * gblk < a->k ? dg_operand_scale(a, 0, i, kb * gblk) : 1.0f;
        if (!pairs) {
            for (int64_t kk = 0; kk < lda; ++kk)
                rows[i * lda + kk] = dg_engine_bf16_f32(row[kk]);
            continue;
        }
        /* k pairs of each step: two consecutive BF16 values are one little-endian 32-bit pair
         * (low half the even k), so a step of row i is its 64 bytes as they are */
        for (int64_t st = 0; st < steps; ++st)
            memcpy(pr + (st * m + i) * 16, row + 32 * st, 64);
    }
    return DG_OK;
}

void dg_engine_decode_a_free(dg_decode_a *a) {
    dg_free(a->mem);
    dg_free(a->pairs);
    a->mem = a->rows = a->sa = NULL;
    a->pairs = NULL;
}

/* Why the decode kernel does not take an M <= DG_DECODE_MAX_M call (the path report), or NULL when it does. */
static const char *decode_declines(const dg_engine_cfg *cfg, const dg_operand *b, const dg_scale_plan *plan,
                                   int fmt, bool wide) {
    if (!atomic_load(&g_decode))
        return "switched off (dg_engine_set_decode)";
    if (fmt < 0)
        return b->grouped ? "B is grouped" : b->data->strides[1] != 1 ? "B is not K-major"
               : b->data->dtype == DG_BFLOAT16 ? "BF16 B with scales" : "B's format";
    if (!(wide ? cfg->decode_wide[fmt] : cfg->decode[fmt]))
        return "no decode kernel for B's format at this level";
    if (plan->gblk % DG_DECODE_STEP || (plan->fold_b && b->sf && b->gran_k % DG_DECODE_STEP))
        return "the scale block is not a multiple of the kernel's k step";
    return NULL;
}

/* Fills dp and sets *use when the decode kernel takes this call. */
static dg_status decode_prepare(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                                const dg_scale_plan *plan, const dg_e2m1_panels *panels, decode_plan *dp,
                                bool *use) {
    memset(dp, 0, sizeof *dp);
    *use = false;
    int fmt = atomic_load(&g_decode) ? decode_format(b) : -1;
    const bool wide = a->mn > DG_DECODE_MAX_M;
    if (fmt == DG_DECODE_E2M1 && panels && (wide ? cfg->decode_wide[DG_DECODE_E2M1P] : cfg->decode[DG_DECODE_E2M1P])) {
        fmt = DG_DECODE_E2M1P;
        dp->panels = panels->codes, dp->psfe = panels->sfe, dp->pexact = panels->exact;
        dp->panel_bytes = dg_ceil_div(b->k, 32) * DG_E2M1P_STEP_BYTES;
    } else if (fmt == DG_DECODE_E4M3 && panels && panels->codes && !wide && cfg->decode[DG_DECODE_E4M3P]) {
        fmt = DG_DECODE_E4M3P; /* its folded scales are read as floats (block_scales) */
        dp->panels = panels->codes;
        dp->panel_bytes = dg_ceil_div(b->k, 32) * DG_E4M3P_STEP_BYTES;
    }
    if (a->mn > decode_max_m(cfg) || a->mn < 1 || b->k < 1)
        return DG_OK;
    const char *why = decode_declines(cfg, b, plan, fmt, wide);
    if (why) {
        DG_PATH("%s small-M kernel [decode kernel declined: %s] | first: m=%lld n=%lld k=%lld", cfg->name, why,
                (long long)a->mn, (long long)b->mn, (long long)b->k);
        return DG_OK;
    }
    if (plan->fold_b && b->sf) {
        dp->fblk = b->gran_k, dp->nkbf = dg_ceil_div(b->k, b->gran_k);
        /* E2M1 rows: the kernel reads the scales where they are, one per row and block, MN- or
         * K-major (no per-call table: writing and checking one took a fifth of an M = 1 call) */
        const int64_t s0 = b->sf->strides[0], s1 = b->sf->strides[1];
        dp->sf_in_place = fmt == DG_DECODE_E2M1 && cfg->decode_sf_in_place && b->gran_mn == 1 &&
                          ((s0 == 1 && s1 >= 1) || (s1 == 1 && s0 >= 1));
    }
    dp->fn = wide ? cfg->decode_wide[fmt] : cfg->decode[fmt];
    dp->byte_tables = dg_cpu_has_avx512_vbmi() && atomic_load(&g_decode_byte_tables);
    /* groups of rows (decode panels, AVX-512 BF16 E2M1 and E4M3 rows): four groups of 16 rows per
     * call at M <= 2, two up to DG_DECODE_MAX_M (decode_avx512bf16.h, panel_body). E4M3 rows take
     * two at every M (measured on Zen 4, N 2112, K 7168 from DRAM, M = 1: one group 0.69 ms, two
     * 0.61-0.66, four 0.78; M = 8: one 1.95, two 1.18): rows 7168 bytes apart share few sets of an
     * 8-way L1, and 64 of them evicted each other's lines */
    const bool groups = !wide && cfg->decode_groups[fmt];
    dp->rows = groups && a->mn <= 2 && fmt != DG_DECODE_E4M3 ? DG_DECODE_PANEL_ROWS
               : wide || groups      ? DG_DECODE_WIDE_ROWS
               : cfg->decode_rows[fmt] ? cfg->decode_rows[fmt]
                                       : DG_DECODE_ROWS;
    dp->lanes = dp->rows > 32 ? dp->rows : 32;
    /* codes read in place, 16 or 32 bytes of a row's line per step: staged when the rows crowd
     * L1 (dg_decode_job.stage_rows; measured on Zen 4, 2 threads, cold B: E4M3 N 7168 K 4096
     * M = 1 3.2 -> 1.6 ms, M = 8 4.2 -> 3.0; K 2048 M = 1 1.14 -> 0.94; E2M1 K 4096 M = 1
     * 1.61 -> 1.23. Rows 7168 bytes apart, eight to a set of an 8-way L1, stay in place: staged,
     * E4M3 M = 2..4 ran 10-14% slower, M = 1 5% faster) */
    const int stage = atomic_load(&g_decode_stage_rows);
    if (fmt == DG_DECODE_E4M3 || fmt == DG_DECODE_E2M1)
        dp->stage_rows = stage >= 0 ? stage : dg_engine_rows_crowd_l1(b->data->strides[0], dp->rows);
    dp->unit = fmt == DG_DECODE_E4M3 || fmt == DG_DECODE_E4M3P ? 0x1p120f : 1.0f;
    DG_TRY(dg_engine_decode_a(cfg, a, plan->fold_a, plan->gblk, &dp->a));
    *use = true;
    return DG_OK;
}

/* B's scales of rows [n0, n0 + rows) (zero rows: none) per K step of `step`, count steps, into
 * out[q * lanes + r] (1 past K and for rows <= r < nrows): what dg_operand_scale_row gives, read
 * with dg_operand_block_scales when a scale block is one step (the common FP4 / FP8 weight
 * layouts: the general per-row routine had cost 13% of an M = 1 FP8 x FP4 GEMM). */
static void block_scales(const dg_operand *b, int64_t n0, int rows, int nrows, int64_t step, int64_t count,
                         int64_t lanes, float *out) {
    const int64_t valid = dg_ceil_div(b->k, step), n = valid < count ? valid : count;
    const bool direct = b->sf && step == b->gran_k;
    if (direct && rows > 0)
        dg_operand_block_scales_rows(b, n0, rows, 0, n, out, lanes);
    for (int r = 0; r < nrows; ++r) {
        int64_t q = r < rows && direct ? n : 0;
        if (r < rows && !direct)
            dg_operand_scale_row(b, n0 + r, step, count, 1.0f, out + r, lanes), q = count;
        for (; q < count; ++q)
            out[q * lanes + r] = 1.0f;
    }
}

/* Columns [n0, n0 + cols) (cols <= dp->rows) through the decode kernel into out [m][lanes]; false when
 * the block must take the exact path instead. sb, fm: per-thread scratch. */
static bool decode_block(const decode_plan *dp, const dg_operand *a, const dg_operand *b, const dg_scale_plan *plan,
                         int64_t n0, int64_t cols, int64_t next_n0, float *sb, bool *sb_ones, float *fm,
                         float *out) {
    const dg_tensor *t = b->data;
    const bool scaled_b = !plan->fold_b && b->sf;
    const int nr = dp->rows;
    const int64_t lanes = dp->lanes;
    if (scaled_b || !*sb_ones) /* unscaled: ones, written once per thread (sb_ones) */
        block_scales(b, n0, scaled_b ? (int)cols : 0, nr, plan->gblk, dp->a.nkb, lanes, sb);
    *sb_ones = !scaled_b;
    if (b->sf && !dp->psfe && next_n0 < b->mn) /* the next call's scales arrive while this one runs */
        dg_operand_prefetch_scales(b, next_n0, (int)(b->mn - next_n0 < nr ? b->mn - next_n0 : nr),
                                   dg_ceil_div(b->k, b->gran_k));
    const uint8_t *fme = NULL; /* the kernel reads the packed exponents in place */
    const uint8_t *fs = NULL;  /* the kernel reads B's scales in place (and checks them) */
    if (dp->nkbf && dp->sf_in_place) {
        const dg_tensor *sf = b->sf;
        fs = (const uint8_t *)sf->data + 4 * n0 * sf->strides[0];
    } else if (dp->nkbf && dp->psfe) { /* fblk = gran_k; the range check was made at packing */
        for (int64_t g = 0; g * 16 < cols; ++g)
            if (!dp->pexact[n0 / 16 + g])
                return false;
        fme = dp->psfe + n0 / 16 * dp->nkbf * 16;
    } else if (dp->nkbf) {
        block_scales(b, n0, (int)cols, nr, dp->fblk, dp->nkbf, lanes, fm);
    }
    const float unit = dp->unit;
    int ok = 1; /* dg_decode_fold_exact for every folded scale */
    for (int64_t q = 0; q < (dp->psfe || fs ? 0 : dp->nkbf); ++q) /* panels: unit 1, checked at packing */
        for (int r = 0; r < nr; ++r) { /* branch-free: it vectorises */
            const float s = fm[q * lanes + r];
            ok &= dg_decode_fold_exact(s, unit);
            fm[q * lanes + r] = s * unit;
        }
    if (!ok)
        return false;
    const int64_t es = t->dtype == DG_BFLOAT16 ? 2 : 1;
    /* B rows in place, or (panels) panel n0 / 16 with panels as "rows" ldb apart */
    const uint8_t *base = dp->panels ? dp->panels : (const uint8_t *)t->data;
    const int64_t ld = dp->panels ? dp->panel_bytes : t->strides[0] * es, per = dp->panels ? 16 : 1;
    const dg_decode_job job = {base + n0 / per * ld, ld, (int)cols, b->k, dp->a.rows, dp->a.lda, (int)a->mn,
                               plan->gblk, dp->a.sa, sb, dp->a.nkb, dp->fblk, dp->nkbf && !fme && !fs ? fm : NULL, out,
                               dp->a.pairs, next_n0 < b->mn ? base + next_n0 / per * ld : NULL, lanes, fme,
                               dp->nkbf * 16, fs, fs ? b->sf->strides[0] : 0, fs ? b->sf->strides[1] : 0,
                               b->sf_packed, dp->byte_tables, dp->stage_rows && !dp->panels, false};
    return dp->fn(&job);
}

#if DG_X86 && defined(DG_HAVE_AMX)
/* ---- AMX: D^T tiles (kernels/amx/smallm_amx.c) -------------------------------------------
 * A work item is a group of up to AMX_GROUP blocks of 16 B rows; K runs in chunks (outer) over
 * the blocks (inner), so a chunk of packed A is reused by the group's blocks. B read in place
 * (BF16, K-major) takes long chunks: its accumulator tiles then stay in registers (storing and
 * reloading them per short chunk cost more than reading packed A from L2: measured at M = 64).
 * B's codes widened in the tile loop take long chunks too. Other widened B takes short chunks
 * whose scratch stays in L1. B is read once, the next chunk of each row (or on K's last chunk
 * the next 16 rows) prefetched meanwhile. */

#define AMX_GROUP 8
#define AMX_KC_MAX 8192 /* B read in place: scratch (tails) 16 x 8192 BF16 = 256 KiB */
#define AMX_KC_WIDE 256 /* widened B: 16 x 256 BF16 = 8 KiB, in L1 for the tile loads (measured: 256 > 512 > 1024) */
#define AMX_PLANES_PF 2048 /* planes: bytes ahead in a panel's stream (8 k steps) hinted into L2 */

typedef struct amx_job {
    const dg_engine_cfg *cfg;
    const dg_operand *b;
    const dg_scale_plan *plan;
    const dg_packed *pa; /* A as DG_PACK_AMX_B panels of 16 rows (VNNI pairs: the tile-B operand) */
    int64_t chunk;       /* K per piece of B: a multiple of 32 and of gblk */
    bool bf16_kmajor, e4m3_kmajor, e2m1_kmajor, scaled_b;
    bool e4m3_fused; /* e4m3_kmajor, widened inside the tile loop (dg_amx_small_t_e4m3) */
    bool e2m1_fused; /* K-major FP4 codes widened inside the tile loop (dg_amx_small_t_e2m1) */
    bool e2m1_fold;  /* ... with B's folded power-of-two scales added to the exponents */
    const dg_e2m1_panels *planes; /* ... or rather B's DG_AMX_E2M1_PLANES (pre-packed B), NULL: none */
    int64_t ldp, ldsfe;           /* bytes per panel of planes and of their exponent bytes */
    atomic_int *refuted; /* dg_engine_gemm_small_assume_pow2: set on a scale that is no power of two
                          * (or, before any work, when the kernel that checks them does not apply) */
} amx_job;

/* B's codes read in place by the fused kernels (16 whole rows, whole k steps inside K): */
typedef struct amx_codes {
    const uint8_t *e4m3, *e2m1; /* the rows' codes at k = 0 (NULL: not this kind) */
    const uint8_t *planes;      /* or their panel of planes at k = 0, nb panels (j->ldp apart), */
    const uint8_t *sfe;         /* with the exponents of the chunk's first block (NULL: none) */
    int nb;
    const int32_t *adj;         /* e2m1: the chunk's exponent adjustments, [16][ldadj] (NULL: none) */
    int64_t ldadj;
} amx_codes;


/* B rows [n0, n0 + cols), k in [k0, k1), as BF16 tile rows (zero past K and past cols): B
 * itself (BF16, K-major, whole rows in range) or the widened scratch. *pf: bytes ahead along
 * the rows for the kernel to prefetch (the next chunk), 0 when this call prefetched. */
static const uint16_t *amx_stage(const amx_job *j, int64_t n0, int64_t cols, int64_t k0, int64_t k1,
                                 uint16_t *scratch, int64_t *ld, int64_t *pf) {
    const dg_operand *b = j->b;
    const dg_tensor *t = b->data;
    const int64_t chunk = j->chunk, kv = (b->k < k1 ? b->k : k1) - k0, more = k1 < b->k ? chunk : 0;
    *ld = chunk, *pf = 0;
    if (j->bf16_kmajor && cols == 16 && kv == k1 - k0) {
        *ld = t->strides[0], *pf = 2 * more;
        return (const uint16_t *)t->data + n0 * t->strides[0] + k0;
    }
    if (j->e4m3_kmajor) { /* the common FP8 weight: table widening */
        dg_amx_widen_e4m3_rows((const uint8_t *)t->data + n0 * t->strides[0] + k0, t->strides[0], (int)cols,
                               kv > 0 ? kv : 0, more, scratch, chunk);
    } else if (j->e2m1_kmajor && kv > 0) { /* FP4 weights: folded scales read here, per block */
        const bool fold = j->plan->fold_b && b->sf;
        const int64_t blk = fold ? b->gran_k : chunk;
        float sc[AMX_KC_WIDE / 32 + 1];
        for (int r = 0; r < cols; ++r) {
            const uint8_t *row = (const uint8_t *)t->data + (n0 + r) * t->strides[0] + k0 / 2;
            for (int64_t o = 0; more && o < chunk / 2; o += 64)
                __builtin_prefetch(row + more / 2 + o, 0, 2);
            sc[0] = 1.0f;
            if (fold) { /* dg_operand_scale without its two divisions per block */
                const dg_tensor *st = b->sf;
                const int64_t base = (n0 + r) / b->gran_mn * st->strides[0], sk0 = k0 / blk;
                for (int64_t q = 0; q * blk < kv; ++q)
                    sc[q] = b->sf_packed ? dg_ue8m0_to_float((uint8_t)(((const uint32_t *)st->data)[
                                               base + ((sk0 + q) >> 2) * st->strides[1]] >> (8 * ((sk0 + q) & 3))))
                                         : ((const float *)st->data)[base + (sk0 + q) * st->strides[1]];
            }
            dg_widen_e2m1_blocks_avx512(row, kv, 0, blk, sc, scratch + r * chunk);
        }
    } else {
        for (int r = 0; r < cols && more; ++r) { /* this row's next chunk */
            const char *p = b_row_at(b, n0 + r, k1);
            for (int64_t o = 0; p && o < 2 * chunk; o += 64)
                __builtin_prefetch(p + o, 0, 2);
        }
        for (int r = 0; r < cols; ++r)
            dg_engine_fetch_bf16(b, n0 + r, j->plan->fold_b, k0, k1, scratch + r * chunk, j->cfg);
    }
    for (int r = 0; r < 16; ++r) { /* zero tails (the fetch path already zeroed k >= K) */
        const bool fast = j->e4m3_kmajor || (j->e2m1_kmajor && kv > 0);
        const int64_t from = r >= cols ? 0 : fast && kv < k1 - k0 ? (kv > 0 ? kv : 0) : k1 - k0;
        if (from < k1 - k0)
            memset(scratch + r * chunk + from, 0, (size_t)(k1 - k0 - from) * 2);
    }
    return scratch;
}

/* B's scales of rows [n0, n0 + 16) for the K block at kb0 (rows past N: any value). */
static const float *amx_scales_b(const amx_job *j, int64_t n0, int64_t cols, int64_t kb0, float *sb,
                                 const float *ones) {
    const dg_operand *b = j->b;
    if (!j->scaled_b)
        return ones;
    if (b->gran_mn % 16 == 0) { /* one scale for the 16 rows (n0 % 16 == 0) */
        const float v = dg_operand_scale(b, 0, n0, kb0);
        for (int s = 0; s < 16; ++s)
            sb[s] = v;
    } else {
        for (int s = 0; s < 16; ++s)
            sb[s] = s < cols ? dg_operand_scale(b, 0, n0 + s, kb0) : 1.0f;
    }
    return sb;
}

/* k steps from kb (k index; chunk at k0) of B rows [n0, n0 + 16) into out: E4M3 or E2M1 codes
 * widened per k step (cd) or the staged BF16 rows src. */
static void amx_steps(const amx_job *j, const amx_codes *cd, const uint16_t *src, int64_t ld, int64_t pf,
                      int64_t k0, int64_t kb, int64_t steps, float *out, int accumulate, uint16_t *buf) {
    const dg_packed *pa = j->pa;
    const uint16_t *ad = (const uint16_t *)pa->data + kb * 16;
    const int64_t ldb = j->b->data->strides[0];
    if (cd->planes)
        dg_amx_small_t_e2m1_planes(steps, cd->planes + kb / 32 * DG_AMX_E2M1_STEP_BYTES, j->ldp, cd->nb, pf, cd->sfe,
                                   j->ldsfe, (kb - k0) / 32, j->b->gran_k / 32, ad, pa->kp * 16, (int)pa->panels, out,
                                   accumulate, buf);
    else if (cd->e4m3)
        dg_amx_small_t_e4m3(steps, cd->e4m3 + kb, ldb, pf, ad, pa->kp * 16, (int)pa->panels, out, accumulate, buf);
    else if (cd->e2m1)
        dg_amx_small_t_e2m1(steps, cd->e2m1 + kb / 2, ldb, pf, cd->adj, cd->ldadj, (kb - k0) / 32, j->b->gran_k / 32, ad,
                            pa->kp * 16, (int)pa->panels, out, accumulate, buf);
    else
        dg_amx_small_t(steps, src + (kb - k0), ld, pf, ad, pa->kp * 16, (int)pa->panels, out, accumulate);
}

/* The exponent adjustments of B rows [n0, n0 + 16)'s folded scales over K [k0, k1) (inside K),
 * [16][ldadj] in scratch (unused by the fused kernel); false when one is not a power of two
 * the kernel can apply exactly (then the rows are staged as other B). Float scales contiguous
 * along K (pre-packed B's kept scales) are read in place, others a row at a time. */
static bool amx_e2m1_adj(const amx_job *j, int64_t n0, int64_t k0, int64_t k1, uint16_t *scratch, amx_codes *cd) {
    const dg_operand *b = j->b;
    const dg_tensor *st = b->sf;
    const int64_t gk = b->gran_k, nq = dg_ceil_div(k1 - k0, gk);
    const bool direct = !b->sf_packed && st->strides[1] == 1 && b->gran_mn == 1;
    int32_t *adj = (int32_t *)scratch;
    float *row = (float *)(adj + 16 * nq);
    if (b->sf_packed && st->strides[1] == 1 && b->gran_mn == 1) {
        /* K-major UE8M0 words: a row's blocks are consecutive bytes, read as such (decoding them
         * to floats one by one first had cost 70% of the kernel's time at M = 1, K 7168) */
        for (int r = 0; r < 16; ++r)
            if (!dg_amx_e2m1_adj_ue8m0((const uint8_t *)((const uint32_t *)st->data + (n0 + r) * st->strides[0]) + k0 / gk,
                                       nq, adj + r * nq))
                return false;
        cd->adj = adj, cd->ldadj = nq;
        return true;
    }
    for (int r = 0; r < 16; ++r) {
        const float *sr = direct ? (const float *)st->data + (n0 + r) * st->strides[0] + k0 / gk : row;
        if (!direct)
            dg_operand_block_scales(b, n0 + r, k0 / gk, nq, row, 1);
        if (!dg_amx_e2m1_adj(sr, nq, adj + r * nq))
            return false;
    }
    cd->adj = adj, cd->ldadj = nq;
    return true;
}

/* How many 16-row blocks from block bi (n0) of a group of nblk run on B's planes: 0 (none:
 * no planes, or a scale the kernel cannot apply, see engine.h), 1, or at M <= 16 (mt 1) 2:
 * one call then runs two independent tile chains. */
static int amx_planes_blocks(const amx_job *j, int64_t bi, int64_t nblk, int64_t n0, int mt) {
    const dg_e2m1_panels *pl = j->planes;
    const int64_t p = n0 / 16;
    if (!pl || (j->e2m1_fold && !(pl->exact && pl->exact[p])))
        return 0;
    return mt == 1 && bi + 1 < nblk && n0 + 32 <= j->b->mn && (!j->e2m1_fold || pl->exact[p + 1]) ? 2 : 1;
}

/* Whether every scale of B rows [n0, n1) over K [k0, k1) (inside K) is a power of two: the
 * test dg_engine_plan_scales applies to all of B. */
static bool rows_scales_pow2(const dg_operand *b, int64_t n0, int64_t n1, int64_t k0, int64_t k1) {
    const int64_t gk = b->gran_k, q0 = k0 / gk, nq = dg_ceil_div(k1, gk) - q0;
    float s[64];
    for (int64_t r = n0; r < n1; ++r)
        for (int64_t q = 0; q < nq; q += 64) {
            const int64_t cnt = nq - q < 64 ? nq - q : 64;
            dg_operand_block_scales(b, r, q0 + q, cnt, s, 1);
            for (int64_t i = 0; i < cnt; ++i)
                if (!dg_engine_scale_pow2(s[i]))
                    return false;
        }
    return true;
}

/* Blocks [g0, g0 + nblk) of 16 B rows into total [nblk][mt][16 n][16 m]. */
static void amx_group(const amx_job *j, int64_t g0, int64_t nblk, uint16_t *scratch, float *acc, float *total,
                      float *sb, const float *ones, uint16_t *buf) {
    const dg_packed *pa = j->pa;
    const int mt = (int)pa->panels, gblk = j->plan->gblk;
    const int64_t kp = pa->kp, n = j->b->mn, per = mt * 256;
    memset(total, 0, (size_t)(nblk * per) * sizeof(float));
    dg_amx_small_begin();
    for (int64_t k0 = 0; k0 < kp; k0 += j->chunk) {
        const int64_t k1 = kp - k0 < j->chunk ? kp : k0 + j->chunk;
        int nb = 1; /* blocks in this call: 2 for a pair on planes (dg_amx_small_t_e2m1_planes) */
        for (int64_t bi = 0; bi < nblk; bi += nb) {
            const int64_t n0 = (g0 + bi) * 16, cols = n - n0 < 16 ? n - n0 : 16;
            int64_t ld = 0, pf = 0;
            amx_codes cd = {NULL, NULL, NULL, NULL, 1, NULL, 0};
            const uint16_t *src = NULL;
            nb = 1;
            if ((j->e4m3_fused || j->e2m1_fused) && cols == 16 && k1 <= j->b->k) { /* codes read in place */
                const dg_tensor *t = j->b->data;
                const uint8_t *rows = (const uint8_t *)t->data + n0 * t->strides[0];
                /* prefetch the rows' next chunk, else (K's last chunk) the next 16 rows at the
                 * same k: short rows (FP4, K 2048: 1 KiB) are too short a stream for the hardware
                 * prefetcher to follow (cold B, M = 1: 3 GB/s without) */
                pf = k1 < j->b->k ? (j->e4m3_fused ? j->chunk : j->chunk / 2)
                     : n0 + 32 <= n ? 16 * t->strides[0] : 0;
                const int np = j->e2m1_fused ? amx_planes_blocks(j, bi, nblk, n0, mt) : 0;
                if (j->e4m3_fused) {
                    cd.e4m3 = rows;
                } else if (np) { /* one stream per panel: hinted a fixed distance ahead */
                    nb = cd.nb = np, pf = AMX_PLANES_PF;
                    cd.planes = j->planes->codes + n0 / 16 * j->ldp;
                    if (j->e2m1_fold)
                        cd.sfe = j->planes->sfe + n0 / 16 * j->ldsfe + k0 / j->b->gran_k * 16;
                } else if (!j->e2m1_fold || amx_e2m1_adj(j, n0, k0, k1, scratch, &cd)) {
                    cd.e2m1 = rows;
                } else if (j->refuted && !rows_scales_pow2(j->b, n0, n0 + 16, k0, k1)) {
                    atomic_store_explicit(j->refuted, 1, memory_order_relaxed);
                    return;
                }
            }
            if (!cd.e4m3 && !cd.e2m1 && !cd.planes)
                src = amx_stage(j, n0, cols, k0, k1, scratch, &ld, &pf);
            float *tot = total + bi * per; /* a pair's second block: tot + 256 (per is 256 at mt 1) */
            if (!pa->scales && !j->scaled_b) { /* one tile chain over K (engine.h) */
                amx_steps(j, &cd, src, ld, pf, k0, k0, (k1 - k0) / 32, tot, k0 > 0, buf);
                continue;
            }
            for (int64_t kb0 = k0; kb0 < k1; kb0 += gblk) { /* one scale epilogue per block */
                const int64_t kb1 = kb0 + gblk < k1 ? kb0 + gblk : k1;
                amx_steps(j, &cd, src, ld, pf, k0, kb0, (kb1 - kb0) / 32, acc, 0, buf);
                for (int bk = 0; bk < nb; ++bk) {
                    const float *sbp = amx_scales_b(j, n0 + 16 * bk, cols, kb0, sb, ones);
                    if (pa->scales)
                        dg_amx_small_t_scale(mt, acc + 256 * bk, tot + per * bk, pa->scales + (kb0 / gblk) * 16,
                                             pa->nkb * 16, sbp);
                    else
                        dg_amx_small_t_scale(mt, acc + 256 * bk, tot + per * bk, ones, 0, sbp);
                }
            }
        }
    }
}

/*
 * K per chunk of B (a multiple of 32 and of gblk) for a packed A of kp, and whether K-major FP4
 * codes are widened in the tile loop (*e2m1_fused). B read in place (BF16, or E4M3 widened per
 * k step: in_place) takes long chunks: few row streams at a time, which the hardware prefetcher
 * follows (FP8 B in chunks of 256 held 128 short streams per thread: ~60% of DRAM); widened B a
 * piece that stays in L1 between widening and the tile loads.
 */
static int64_t amx_chunk(const dg_operand *b, const dg_scale_plan *plan, int64_t kp, bool in_place,
                         bool *e2m1_fused) {
    const bool fold = plan->fold_b && b->sf;
    /* K in whole k steps: a tail would stage its whole (long) chunk through the generic fetch.
     * The tile-loop widening spreads nibbles with VBMI's multishift (every AMX CPU so far has it). */
    bool fused = b->fp4_dim == 1 && b->data->strides[1] == 1 && !b->grouped && b->k % 32 == 0 &&
                 dg_cpu_has_avx512_vbmi() &&
                 (!fold || (b->gran_k % 32 == 0 && AMX_KC_MAX % b->gran_k == 0 && AMX_KC_MAX % plan->gblk == 0));
    int64_t want = in_place || fused ? AMX_KC_MAX : AMX_KC_WIDE;
    want = want < kp ? want : kp > 32 ? kp : 32;
    const int64_t chunk = plan->gblk * (want / plan->gblk > 0 ? want / plan->gblk : 1);
    /* folded scales: chunks start on scale blocks (dg_amx_small_t_e2m1 counts blocks from there) */
    *e2m1_fused = fused && (!fold || chunk % b->gran_k == 0 || chunk >= kp);
    return chunk;
}

static dg_status amx_small(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                           const dg_e2m1_panels *panels, const dg_scale_plan *plan, const dg_tensor *d,
                           const dg_tensor *c, atomic_int *refuted) {
    if (a->mn == 0 || b->mn == 0)
        return DG_OK;
    const dg_tensor *bt = b->data;
    amx_job j = {cfg, b, plan, NULL, 0, false, false, false, false, false, false, false, NULL, 0, 0, refuted};
    j.bf16_kmajor = bt->dtype == DG_BFLOAT16 && bt->strides[1] == 1;
    j.e4m3_kmajor = bt->dtype == DG_FLOAT8_E4M3 && bt->strides[1] == 1 && !(plan->fold_b && b->sf);
    j.scaled_b = !plan->fold_b && b->sf;
    j.e4m3_fused = j.e4m3_kmajor && dg_cpu_has_avx512_vbmi();
    dg_packed pa;
    DG_TRY(dg_engine_pack(a, plan->fold_a, plan->gblk, DG_PACK_AMX_B, 16, cfg, &pa));
    j.pa = &pa;
    const int64_t n = b->mn, blocks = dg_ceil_div(n, 16), mt = pa.panels, m = a->mn;
    const bool fold = plan->fold_b && b->sf;
    j.chunk = amx_chunk(b, plan, pa.kp, j.bf16_kmajor || j.e4m3_fused, &j.e2m1_fused);
    j.e2m1_fold = j.e2m1_fused && fold;
    if (j.e2m1_fused && panels && panels->codes) { /* B pre-packed as planes (prepack.c) */
        j.planes = panels, j.ldp = dg_ceil_div(b->k, 32) * DG_AMX_E2M1_STEP_BYTES;
        j.ldsfe = dg_ceil_div(b->k, b->gran_k) * 16;
    }
    j.e2m1_kmajor = b->fp4_dim == 1 && bt->strides[1] == 1 && j.chunk <= AMX_KC_WIDE &&
                    (!(plan->fold_b && b->sf) || (b->gran_k % 32 == 0 && j.chunk % b->gran_k == 0));
    /* An assumed fold holds only where every scale passes a check: the fused kernel's for whole
     * 16-row blocks (amx_group), this one for the last rows. */
    const int64_t whole = n / 16 * 16;
    if (refuted && (!j.e2m1_fold || (whole < n && !rows_scales_pow2(b, whole, n, 0, b->k)))) {
        atomic_store_explicit(refuted, 1, memory_order_relaxed);
        dg_engine_packed_free(&pa);
        return DG_OK;
    }
    DG_PATH("%s small-M AMX kernel (D^T tiles; B %s%s) | first: m=%lld n=%lld k=%lld", cfg->name,
            dg_dtype_name(bt->dtype),
            j.planes ? " pre-packed planes widened in the tile loop"
            : j.e4m3_fused || j.e2m1_fused ? " codes widened in the tile loop"
            : j.bf16_kmajor || j.e4m3_kmajor ? " read in place" : " widened",
            (long long)a->mn, (long long)b->mn, (long long)b->k);
    const int nt = dg_num_threads();
    int64_t group = blocks / (4 * nt); /* at least 4 items per thread, for balance */
    group = group < 1 ? 1 : group > AMX_GROUP ? AMX_GROUP : group;
    const int64_t items = dg_ceil_div(blocks, group);
    const int threads = (int)(items < nt ? items : nt);
    /* Per thread (floats): totals, acc (at least two tiles: a pair on planes), ones, B scales,
     * output row, the BF16 scratch, then the four tile buffers of the fused kernels (8 KiB). */
    const int64_t acc_floats = (mt > 2 ? mt : 2) * 256;
    const int64_t per_thread = dg_align(group * mt * 256 + acc_floats + 32 + group * 16 + 8 * j.chunk + 2048, 16);
    float *mem = dg_malloc((size_t)(threads * per_thread) * sizeof(float));
    if (!mem) {
        dg_engine_packed_free(&pa);
        return dg_fail(DG_ERR_ALLOC, "out of memory for the small-M GEMM buffers");
    }
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *total = mem + tid * per_thread, *acc = total + group * mt * 256, *ones = acc + acc_floats;
        float *sb = ones + 16, *row = sb + 16;
        uint16_t *scratch = (uint16_t *)(row + group * 16), *buf = scratch + 16 * j.chunk; /* 8 KiB, aligned */
        for (int s = 0; s < 16; ++s)
            ones[s] = 1.0f;
#pragma omp for schedule(dynamic, 1) /* any order: each block's result is fixed */
        for (int64_t it = 0; it < items; ++it) {
            const int64_t g0 = it * group, nblk = blocks - g0 < group ? blocks - g0 : group;
            const int64_t n0 = g0 * 16, cols = n - n0 < nblk * 16 ? n - n0 : nblk * 16;
            if (refuted && atomic_load_explicit(refuted, memory_order_relaxed))
                continue; /* the caller recomputes D */
            amx_group(&j, g0, nblk, scratch, acc, total, sb, ones, buf);
            for (int64_t i = 0; i < m; ++i) { /* D^T tiles -> row i */
                for (int64_t s = 0; s < cols; ++s)
                    row[s] = total[(s / 16) * mt * 256 + (i / 16) * 256 + (s % 16) * 16 + i % 16];
                dg_engine_store_row(d, c, i, n0, cols, row);
            }
        }
    }
    dg_free(mem);
    dg_engine_packed_free(&pa);
    return DG_OK;
}
#endif

bool dg_engine_small_assume_pow2_applies(const dg_engine_cfg *cfg, const dg_operand *b, const dg_scale_plan *plan) {
#if DG_X86 && defined(DG_HAVE_AMX)
    bool fused = false;
    if (cfg->amx && plan->fold_b && b->sf && !b->sf_packed)
        amx_chunk(b, plan, dg_pack_kp(DG_PACK_AMX_B, b->k), false, &fused);
    return fused;
#else
    (void)cfg, (void)b, (void)plan;
    return false;
#endif
}

dg_status dg_engine_gemm_small_assume_pow2(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                                          const dg_scale_plan *plan, const dg_tensor *d, bool *refuted) {
    *refuted = true;
#if DG_X86 && defined(DG_HAVE_AMX)
    if (cfg->amx && plan->fold_b && b->sf && !b->sf_packed) {
        atomic_int r = 0;
        const dg_status st = amx_small(cfg, a, b, NULL, plan, d, NULL, &r);
        *refuted = atomic_load(&r) != 0;
        return st;
    }
#else
    (void)cfg, (void)a, (void)b, (void)plan, (void)d;
#endif
    return DG_OK;
}

dg_status dg_engine_gemm_small(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                               const dg_scale_plan *plan, const dg_tensor *d, const dg_tensor *c) {
    return dg_engine_gemm_small_panels(cfg, a, b, NULL, plan, d, c);
}

dg_status dg_engine_gemm_small_panels(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                                      const dg_e2m1_panels *panels, const dg_scale_plan *plan,
                                      const dg_tensor *d, const dg_tensor *c) {
#if DG_X86 && defined(DG_HAVE_AMX)
    if (cfg->amx)
        return amx_small(cfg, a, b, panels, plan, d, c, NULL);
#endif
    int mr;
    const int which = dg_engine_small_kernel(cfg, a->mn, &mr);
    small_job j = {cfg, b, plan, NULL, cfg->ukr_small[which], mr, SMALL_KC, NULL, dg_engine_subnormal_guard()};
    j.slice = plan->gblk * (SMALL_KC / plan->gblk > 0 ? SMALL_KC / plan->gblk : 1);
    dg_packed pa;
    DG_TRY(dg_engine_pack(a, plan->fold_a, plan->gblk, cfg->small_fmt, j.mr, cfg, &pa));
    j.pa = &pa;

    decode_plan dp;
    bool decode = false;
    const dg_status dst = decode_prepare(cfg, a, b, plan, panels, &dp, &decode);
    if (dst != DG_OK) {
        dg_engine_packed_free(&pa);
        return dst;
    }
    if (!decode) /* the runtime JIT's instance for these k extents, where it serves (jit_ukr.c) */
        j.ukr = dg_engine_jit_small_ukr(cfg, j.ukr, j.mr, plan->gblk, pa.kp, a->mn, b->mn,
                                        b->k);
    const int nr = cfg->nr;
    /* Work items: whole NR blocks (for the exact fallback) of whole decode calls: one call of
     * DG_DECODE_ROWS columns on AVX2 (NR 16), two on AVX-512 (NR 32), one of DG_DECODE_WIDE_ROWS
     * for the wide kernels (M > DG_DECODE_MAX_M); else one NR block
     * (staging 4 blocks per A pass measured no faster at M = 16 and 64 on Zen 3). */
    const int rows = decode ? dp.rows : DG_DECODE_ROWS; /* B rows per decode call */
    const int nb = decode && rows % nr == 0 ? rows / nr : 1;
    const int64_t n = b->mn, width = (int64_t)nb * nr, mpad = pa.panels * j.mr;
    const int parts = decode && width % rows == 0 ? (int)(width / rows) : 0;
    decode = decode && parts > 0;
    const int64_t items = dg_ceil_div(n, width);
    const int threads = (int)(items < dg_num_threads() ? items : dg_num_threads());
    if (decode)
        DG_PATH("%s decode kernel (M <= %lld, %s B %s) | first: m=%lld n=%lld k=%lld", cfg->name,
                (long long)decode_max_m(cfg), dg_dtype_name(b->data->dtype),
                dp.panels ? (b->data->dtype == DG_FLOAT8_E4M3 ? "from pre-packed E4M3 decode panels"
                                                              : "from pre-packed E2M1 decode panels")
                          : "read in place", (long long)a->mn, (long long)n,
                (long long)b->k);
    else if (a->mn > 2)
        DG_PATH("%s small-M kernel (M <= %lld) | first: m=%lld n=%lld k=%lld", cfg->name,
                (long long)dg_engine_small_m_max(cfg), (long long)a->mn, (long long)n, (long long)b->k);
    atomic_int exact_blocks = 0;
    /* Every thread's buffers up front (floats): B slice, accumulators, ones, B scales, the
     * decode kernel's scales and output, then the BF16 staging rows; a failure returns before
     * anything is written. */
    const int64_t ostride = dp.lanes * a->mn; /* a decode call's out [m][lanes] */
    const int64_t dec = decode ? dp.lanes * (dp.a.nkb + dp.nkbf) + parts * ostride : 0;
    const int64_t sbn = nb * dg_ceil_div(pa.kp, plan->gblk) * nr + 8; /* B scales of an item (run_blocks) */
    const int64_t per_thread =
        dg_align(nb * (j.slice * nr + 8 * nr + mpad * nr) + nr + 8 + sbn + dec + (j.slice * nr + 1) / 2, 16);
    float *mem = dg_malloc((size_t)(threads * per_thread) * sizeof(float));
    if (!mem) {
        dg_engine_decode_a_free(&dp.a);
        dg_engine_packed_free(&pa);
        return dg_fail(DG_ERR_ALLOC, "out of memory for the small-M GEMM buffers");
    }
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        /* B slices of (slice + 8) k: the E4M3 stage writes up to a whole step of 8 past a slice */
        float *bbuf = mem + tid * per_thread, *cbuf = bbuf + nb * (j.slice + 8) * nr, *ones = cbuf + nb * mpad * nr;
        float *sbuf = ones + nr + 8, *dsb = sbuf + sbn, *dfm = dsb + dp.lanes * dp.a.nkb, *dout = dfm + dp.lanes * dp.nkbf;
        uint16_t *stage = (uint16_t *)(sbuf + sbn + dec);
        small_job jt = j;
        bool sb_ones = false; /* dsb holds the unscaled ones (decode_block) */
        for (int s = 0; s < nr + 8; ++s)
            ones[s] = 1.0f;
        jt.ones = ones;
#pragma omp for schedule(dynamic, 2) /* any item order: each item's result is fixed; chunks of 2: see next */
        for (int64_t it = 0; it < items; ++it) {
            const int64_t i0 = it * width, icols = n - i0 < width ? n - i0 : width;
            bool decoded = decode;
            for (int part = 0; decoded && part < parts && part * rows < icols; ++part) {
                const int64_t c0 = part * rows, pc = icols - c0 < rows ? icols - c0 : rows;
                /* the next call on this thread: the item's next part, or the next item of this
                 * thread's chunk of two (schedule below) */
                const int64_t next = part + 1 < parts ? i0 + c0 + rows : it % 2 == 0 ? i0 + width : n;
                decoded = decode_block(&dp, a, b, plan, i0 + c0, pc, next, dsb, &sb_ones, dfm, dout + part * ostride);
            }
            if (decoded) {
                for (int part = 0; part < parts && part * rows < icols; ++part) {
                    const int64_t c0 = part * rows, pc = icols - c0 < rows ? icols - c0 : rows;
                    for (int64_t i = 0; i < a->mn; ++i)
                        dg_engine_store_row(d, c, i, i0 + c0, pc, dout + part * ostride + i * dp.lanes);
                }
                continue;
            }
            if (decode)
                atomic_store_explicit(&exact_blocks, 1, memory_order_relaxed);
            run_blocks(&jt, i0, icols, stage, bbuf, cbuf, sbuf);
            for (int64_t n0 = i0; n0 < i0 + icols; n0 += nr) {
                const int64_t cols = n - n0 < nr ? n - n0 : nr;
                for (int64_t i = 0; i < a->mn; ++i)
                    dg_engine_store_row(d, c, i, n0, cols, cbuf + (n0 - i0) / nr * mpad * nr + i * nr);
            }
        }
    }
    if (atomic_load(&exact_blocks)) /* noted here: worker threads have no entry point name */
        DG_PATH("%s decode kernel: some blocks of B rows ran the exact small-M path [E4M3 NaN codes, or folded "
                "scales a single multiply cannot apply exactly]", cfg->name);
    dg_engine_decode_a_free(&dp.a);
    dg_free(mem);
    dg_engine_packed_free(&pa);
    return DG_OK;
}
