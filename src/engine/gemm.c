/*
 * gemm.c - the engine's loop nest and threading (contract and accumulation order: engine.h).
 *
 *   pack A once (MR-row panels), pack B once (NR-row panels)          [parallel over panels]
 *   for each MC x NC output tile (OpenMP, one thread per tile, K never split):
 *     for k0 in steps of KC (whole accumulation blocks of gblk):
 *       for jr over NR panels of the tile:           B micro-panel KC x NR stays in L1
 *         for ir over MR panels of the tile:         A block MC x KC stays in L2
 *           microkernel per block of gblk -> float32 tile buffer (the block's epilogue)
 *     D = round(C + tile buffer)
 * Loop bounds are plain parameters; a JIT can make (M, N, K, MC, NC, KC, MR, NR) constants.
 */
#include "engine.h"
#include "fp4x4.h"
#include "../formats/convert.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct tile_job {
    const dg_engine_cfg *cfg;
    const dg_packed *pa, *pb;
    const dg_tensor *d, *c;
    int64_t m, n;
    int gblk;       /* the accumulation block (engine.h) */
    int64_t mc, nc; /* the tile actually used: the configuration's, halved for small problems */
    const uint16_t *a_rows; /* A read in place (cfg->ukr_a_rows; pa only describes it), or NULL */
    int64_t lda;            /* its row stride in elements */
} tile_job;

/* The K step of a tile's slices: whole accumulation blocks, about KC. */
static int64_t slice_step(const dg_engine_cfg *cfg, int gblk) { return gblk * (cfg->kc / gblk > 0 ? cfg->kc / gblk : 1); }

/* A read in place: rows [r0, r0 + rows) (rows < MR, the last panel), k in [k0, k1), as one
 * packed DG_PACK_AMX_A panel slice in `out` (rows past `rows` zero), for the packed kernel. */
static void stage_tail(const tile_job *j, int64_t r0, int64_t rows, int64_t k0, int64_t k1, uint16_t *out) {
    const int mr = j->cfg->mr;
    for (int64_t t = 0; t < (k1 - k0) / 32; ++t)
        for (int rr = 0; rr < mr; ++rr) {
            uint16_t *o = out + (t * mr + rr) * 32;
            if (rr < rows)
                memcpy(o, j->a_rows + (r0 + rr) * j->lda + k0 + 32 * t, 64);
            else
                memset(o, 0, 64);
        }
}

/* The rounding to BF16 runs on the level's conversion kernel (the same rounding as
 * dg_engine_f32_bf16: nearest even, NaNs kept quiet), ~4% of a large AMX GEMM when scalar. */
void dg_engine_store_row(const dg_tensor *d, const dg_tensor *c, int64_t i, int64_t n0, int64_t cols,
                         const float *acc) {
    void *dp = dg_ptr2(d, i, n0);
    const void *cp = c ? dg_ptr2(c, i, n0) : NULL;
    if (d->dtype == DG_FLOAT32) {
        float *o = dp;
        const float *ci = cp;
        if (ci)
            for (int64_t s = 0; s < cols; ++s)
                o[s] = ci[s] + acc[s];
        else
            memcpy(o, acc, (size_t)cols * sizeof(float));
        return;
    }
    const dg_convert_kernels *ck = dg_convert_kernels_for(dg_get_isa());
    uint16_t *o = dp;
    const uint16_t *ci = cp;
    if (!ci) {
        ck->f32_to_bf16(acc, o, (size_t)cols);
        return;
    }
    float sum[256];
    for (int64_t s0 = 0; s0 < cols; s0 += 256) {
        const int64_t w = cols - s0 < 256 ? cols - s0 : 256;
        for (int64_t s = 0; s < w; ++s)
            sum[s] = dg_engine_bf16_f32(ci[s0 + s]) + acc[s0 + s];
        ck->f32_to_bf16(sum, o + s0, (size_t)w);
    }
}

/* Brings the tile's D (and C) rows towards the cache while the last K step computes: the rows
 * are short strided pieces the hardware prefetcher does not follow, and storing into lines
 * that miss costs a DRAM round trip each (measured: ~6% of a large GEMM without this). */
static void prefetch_out(const tile_job *j, int64_t m0, int64_t rows, int64_t n0, int64_t cols) {
    const int64_t bytes = cols * (int64_t)dg_dtype_size(j->d->dtype);
    for (int64_t r = 0; r < rows; ++r) {
        const char *dp = dg_ptr2(j->d, m0 + r, n0);
        const char *cp = j->c && j->c->data != j->d->data ? dg_ptr2(j->c, m0 + r, n0) : NULL;
        for (int64_t off = 0; off < bytes; off += 64) {
            __builtin_prefetch(dp + off, 1, 2);
            if (cp)
                __builtin_prefetch(cp + off, 0, 2);
        }
    }
}

static inline const char *panel_at(const dg_packed *p, int64_t panel, int64_t k0) {
    const size_t esize = p->fmt == DG_PACK_F32 ? 4 : 2;
    return (const char *)p->data + (size_t)(panel * p->kp * p->r + k0 * p->r) * esize;
}

static inline const float *scales_at(const dg_packed *p, int64_t panel, int64_t kb, const float *ones) {
    return p->scales ? p->scales + (panel * p->nkb + kb) * p->r : ones;
}

/* Share ir of mpan of the B micro-panel that follows (jr, k0) in run_tile's order (the next
 * panel of the slice, else the next slice's first), hinted into L2 while call (jr, ir) computes.
 * Without it a micro-panel's first call waits for it from L3 or DRAM: measured on a Sapphire
 * Rapids VM (2 threads, M = 4096) 2-8% of large GEMMs at the AMX, AVX-512 and AVX2 levels. Into
 * L2, not L1: the current micro-panel is what L1 holds. Hints never change results. */
static void prefetch_next_b(const dg_packed *pb, int64_t pb0, int64_t npan, int64_t jr, int64_t ir, int64_t mpan,
                            int64_t k0, int64_t k1, int64_t step) {
    const bool last = jr + 1 == npan;
    const int64_t nk0 = last ? k1 : k0;
    if (nk0 >= pb->kp)
        return;
    const int64_t len = nk0 + step < pb->kp ? step : pb->kp - nk0;
    const int64_t bytes = len * pb->r * (pb->fmt == DG_PACK_F32 ? 4 : 2), per = dg_align(dg_ceil_div(bytes, mpan), 64);
    const char *next = panel_at(pb, pb0 + (last ? 0 : jr + 1), nk0);
    for (int64_t o = ir * per; o < (ir + 1) * per && o < bytes; o += 64)
        __builtin_prefetch(next + o, 0, 2);
}

/* One MC x NC tile [m0, m0 + rows) x [n0, n0 + cols) into buf (ldc = NC rounded to NR). */
static void run_tile(const tile_job *j, int64_t m0, int64_t rows, int64_t n0, int64_t cols, float *buf,
                     int64_t ldc, const float *ones, uint16_t *tail) {
    const dg_engine_cfg *cfg = j->cfg;
    const dg_packed *pa = j->pa, *pb = j->pb;
    const int64_t mpan = dg_ceil_div(rows, cfg->mr), npan = dg_ceil_div(cols, cfg->nr);
    const int64_t pa0 = m0 / cfg->mr, pb0 = n0 / cfg->nr, kp = pa->kp;
    const int gblk = j->gblk;
    const int64_t step = slice_step(cfg, gblk);
    const int64_t tail_rows = j->a_rows && rows % cfg->mr ? rows % cfg->mr : 0; /* A in place: a short last panel */
    /* AMX without unfolded scales: one tile chain over all of K (engine.h), continued across
     * K slices through the buffer (tile loads and stores are exact) */
    const bool chain = cfg->amx && !pa->scales && !pb->scales;
    memset(buf, 0, (size_t)(mpan * cfg->mr * ldc) * sizeof(float));
    if (cfg->ukr_begin)
        cfg->ukr_begin();
    for (int64_t k0 = 0; k0 < kp; k0 += step) {
        const int64_t k1 = k0 + step < kp ? k0 + step : kp;
        if (k1 == kp)
            prefetch_out(j, m0, rows, n0, cols);
        if (tail_rows)
            stage_tail(j, m0 + (mpan - 1) * cfg->mr, tail_rows, k0, k1, tail);
        for (int64_t jr = 0; jr < npan; ++jr)
            for (int64_t ir = 0; ir < mpan; ++ir) {
                float *ct = buf + ir * cfg->mr * ldc + jr * cfg->nr;
                prefetch_next_b(pb, pb0, npan, jr, ir, mpan, k0, k1, step);
                if (j->a_rows && !(tail_rows && ir == mpan - 1)) { /* chain holds (dg_engine_gemm) */
                    cfg->ukr_a_rows(k1 - k0, j->a_rows + (m0 + ir * cfg->mr) * j->lda + k0, j->lda,
                                    panel_at(pb, pb0 + jr, k0), ct, ldc, k0 == 0 ? DG_UKR_ZERO : DG_UKR_ACC);
                    continue;
                }
                if (j->a_rows) {
                    cfg->ukr(k1 - k0, tail, panel_at(pb, pb0 + jr, k0), ct, ldc, k0 == 0 ? DG_UKR_ZERO : DG_UKR_ACC,
                             ones, ones);
                    continue;
                }
                if (chain) {
                    cfg->ukr(k1 - k0, panel_at(pa, pa0 + ir, k0), panel_at(pb, pb0 + jr, k0), ct, ldc,
                             k0 == 0 ? DG_UKR_ZERO : DG_UKR_ACC, ones, ones);
                    continue;
                }
                for (int64_t kb0 = k0; kb0 < k1; kb0 += gblk) { /* one scale epilogue per block */
                    const int64_t kb1 = kb0 + gblk < k1 ? kb0 + gblk : k1;
                    cfg->ukr(kb1 - kb0, panel_at(pa, pa0 + ir, kb0), panel_at(pb, pb0 + jr, kb0), ct, ldc,
                             DG_UKR_SCALE, scales_at(pa, pa0 + ir, kb0 / gblk, ones),
                             scales_at(pb, pb0 + jr, kb0 / gblk, ones));
                }
            }
    }
    for (int64_t r = 0; r < rows; ++r)
        dg_engine_store_row(j->d, j->c, m0 + r, n0, cols, buf + r * ldc);
}

/* Halves NC, then MC, until there are at least two tiles per thread (balance on small
 * problems). The accumulation order does not depend on the tiling. */
static void choose_tiles(tile_job *j, int threads) {
    const dg_engine_cfg *cfg = j->cfg;
    j->mc = cfg->mc, j->nc = cfg->nc;
    while (dg_ceil_div(j->m, j->mc) * dg_ceil_div(j->n, j->nc) < 2 * threads) {
        if (j->nc > cfg->nr && j->nc >= j->mc)
            j->nc = dg_align(j->nc / 2, cfg->nr);
        else if (j->mc > cfg->mr)
            j->mc = dg_align(j->mc / 2, cfg->mr);
        else
            break;
    }
}

/* Threads take whole tiles; tiles sharing a B column block are adjacent in the order. */
static dg_status run_tiles(tile_job *j) {
    const dg_engine_cfg *cfg = j->cfg;
    choose_tiles(j, dg_num_threads());
    const int64_t mt = dg_ceil_div(j->m, j->mc), nt = dg_ceil_div(j->n, j->nc);
    /* one 64-byte pad per row: a power-of-two row stride maps a tile's rows onto few L1 sets */
    const int64_t ldc = j->nc + 16, tiles = mt * nt;
    const int threads = (int)(tiles < dg_num_threads() ? tiles : dg_num_threads());
    /* Every thread's buffers up front: a failure returns before anything is written. */
    const int nones = cfg->mr > cfg->nr ? cfg->mr : cfg->nr;
    /* A in place: a packed slice of the short last panel (BF16, 2 per float) */
    const int64_t tail_floats = j->a_rows ? dg_align(cfg->mr * slice_step(cfg, j->gblk) / 2, 16) : 0;
    const int64_t per_thread = dg_align(cfg->mc * ldc + nones, 16) + tail_floats;
    /* from the workspace pool: a fresh 2 MiB block per call had cost ~530 page faults */
    float *mem = dg_ws_get((size_t)(threads * per_thread) * sizeof(float));
    DG_CHECK(mem != NULL, DG_ERR_ALLOC, "out of memory for the GEMM tile buffers");
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *buf = mem + tid * per_thread, *ones = buf + cfg->mc * ldc;
        uint16_t *tail = j->a_rows ? (uint16_t *)(void *)(buf + dg_align(cfg->mc * ldc + nones, 16)) : NULL;
        for (int i = 0; i < nones; ++i)
            ones[i] = 1.0f;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t ic = t % mt, jc = t / mt, m0 = ic * j->mc, n0 = jc * j->nc;
            const int64_t rows = j->m - m0 < j->mc ? j->m - m0 : j->mc;
            const int64_t cols = j->n - n0 < j->nc ? j->n - n0 : j->nc;
            run_tile(j, m0, rows, n0, cols, buf, ldc, ones, tail);
        }
    }
    dg_ws_put(mem);
    return DG_OK;
}

/* The tile loop over operands packed by the caller (prepack.c: a pre-packed B). */
dg_status dg_engine_run_packed(const dg_engine_cfg *cfg, const dg_packed *pa, const dg_packed *pb, int gblk,
                               const dg_tensor *d, const dg_tensor *c) {
    tile_job j = {cfg, pa, pb, d, c, pa->mn, pb->mn, gblk, 0, 0, NULL, 0};
    return run_tiles(&j);
}

bool dg_engine_assume_pow2_applies(const dg_operand *a, const dg_operand *b, dg_scale_plan *plan) {
    if (b->data->dtype != DG_FP4_E2M1X2 || !b->sf || b->sf_packed || b->sf_pow2 != 0 || dg_engine_fp4x4_applies(a, b))
        return false;
    const dg_engine_cfg *cfg = dg_engine_config(dg_get_isa());
    if (!cfg->amx || !dg_engine_small_applies(cfg, a, b))
        return false;
    dg_operand assumed = *b;
    assumed.sf_pow2 = 1;
    return dg_engine_plan_scales(a, &assumed, plan) && dg_engine_config_for(cfg, plan) == cfg &&
           dg_engine_small_assume_pow2_applies(cfg, &assumed, plan);
}

dg_status dg_engine_gemm_assuming_pow2(const dg_operand *a, const dg_operand *b, const dg_tensor *d, bool *refuted) {
    *refuted = true;
    dg_scale_plan plan;
    if (!dg_engine_assume_pow2_applies(a, b, &plan))
        return DG_OK;
    dg_operand assumed = *b;
    assumed.sf_pow2 = 1;
    return dg_engine_gemm_small_assume_pow2(dg_engine_config(dg_get_isa()), a, &assumed, &plan, d, refuted);
}

/* AMX: A's BF16 rows fed to the tiles where they are, without a packed copy, when B fits in one
 * NC column block: then every A panel is read by one tile's column loop only, and packing it
 * would add a write and a read of all of A (for the router GEMM of bf16_mega_gate, N = 256,
 * K = 7168: a third of the call). With several column blocks the packed panels are re-read
 * per block, contiguously, and reading rows in place measured 15% slower (config.c). Needs K
 * in whole k steps (no padding to read) and no scales (one tile chain over K, engine.h). */
static bool a_in_place(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b, const dg_scale_plan *plan) {
    return cfg->ukr_a_rows && a->data->dtype == DG_BFLOAT16 && !a->grouped && !a->sf && a->data->strides[1] == 1 &&
           a->k % 32 == 0 && a->mn >= cfg->mr && b->mn <= cfg->nc && !(b->sf && !plan->fold_b);
}

dg_status dg_engine_gemm(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const dg_tensor *c) {
    if (dg_engine_fp4x4_applies(a, b)) /* both E2M1: integer block dot products (fp4x4.h) */
        return dg_engine_gemm_fp4x4(a, b, d, c);
    if (!c) { /* FP4 weights' float scales checked by the kernel that folds them (engine.h) */
        bool refuted;
        const dg_status st = dg_engine_gemm_assuming_pow2(a, b, d, &refuted);
        if (st != DG_OK || !refuted)
            return st;
    }
    const dg_engine_cfg *cfg = dg_engine_config(dg_get_isa());
    dg_scale_plan plan;
    if (!dg_engine_plan_scales(a, b, &plan)) {
        DG_PATH("reference [engine declined: a K block of %d/%d scales holds an odd number of k]", a->gran_k,
                b->gran_k);
        return DG_ERR_UNSUPPORTED;
    }
    const dg_engine_cfg *chosen = dg_engine_config_for(cfg, &plan);
    if (chosen != cfg)
        DG_PATH("%s instead of %s [scale block %d is not a whole AMX k step (32)]", chosen->name, cfg->name, plan.gblk);
    cfg = chosen;
    if (dg_engine_small_applies(cfg, a, b))
        return dg_engine_gemm_small(cfg, a, b, &plan, d, c);
    const bool in_place = a_in_place(cfg, a, b, &plan);
    DG_PATH("%s large-M kernel (%dx%d tiles, A %s%s, B %s%s)%s | first: m=%lld n=%lld k=%lld", cfg->name, cfg->mr,
            cfg->nr, dg_dtype_name(a->data->dtype), in_place ? " read in place" : "", dg_dtype_name(b->data->dtype),
            !plan.fold_a || !plan.fold_b ? ", scales per K block" : "",
            a->mn <= dg_engine_small_m_max(cfg) ? " [small-M path: none at this level]" : "", (long long)a->mn,
            (long long)b->mn, (long long)a->k);
    dg_packed pa = {0}, pb;
    if (in_place) /* describes A's panels; their data stays in A */
        pa = (dg_packed){.fmt = DG_PACK_AMX_A, .r = cfg->mr, .mn = a->mn, .k = a->k, .kp = a->k,
                         .panels = dg_ceil_div(a->mn, cfg->mr)};
    else
        DG_TRY(dg_engine_pack(a, plan.fold_a, plan.gblk, dg_engine_fmt_a(cfg), cfg->mr, cfg, &pa));
    dg_status st = dg_engine_pack(b, plan.fold_b, plan.gblk, cfg->fmt, cfg->nr, cfg, &pb);
    if (st == DG_OK) {
        tile_job j = {cfg, &pa, &pb, d, c, a->mn, b->mn, plan.gblk, 0, 0,
                      in_place ? (const uint16_t *)a->data->data : NULL, in_place ? a->data->strides[0] : 0};
        st = run_tiles(&j);
        dg_engine_packed_free(&pb);
    }
    if (!in_place)
        dg_engine_packed_free(&pa);
    return st;
}
