/*
 * batched.c - batched / K-segmented BF16 GEMMs (contract and order: batched.h).
 *
 *   units = groups x MC-row tiles x NC-column tiles       [OpenMP, one thread per unit]
 *     the unit's K: segment 0's k (padded to kp), then segment 1's, ...; in blocks of KC:
 *       pack the unit's A rows and B rows of the block into thread-local panels
 *       for jr over NR panels:  for ir over MR panels:  microkernel per accumulation block
 *                                                        (engine.h: the block's epilogue)
 *     D = round(C + tile buffer)
 * Unlike gemm.c, which packs each operand once and shares the panels, every unit packs its
 * own panels: the per-group GEMMs are small (or, for segments, the operand is streamed once),
 * so there is little to share, and no barrier is needed between groups.
 * Configurations: the current ISA level's (dg_engine_config_for per group), so on AMX the
 * panels are DG_PACK_AMX_A / DG_PACK_AMX_B with K padded to 32 and the tile kernel runs, as
 * in dg_engine_gemm. Each group's bits are those of the dense GEMM of its views, except BF16
 * views on AMX: there each K chunk is one run of the float64 order (cfg->ukr_f64, batched.h).
 */
#include "batched.h"

#include <string.h>

#if defined(__SSE2__)
#include <immintrin.h> /* non-temporal stores (SSE2: baseline x86-64; AVX-512 in row_avx512) */
#define BATCHED_NT 1
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/* Unit scales for the accumulation blocks of BF16 views (no scales): MR, NR <= 32. */
#define ONES8 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f
static const float kOnes[32] = {ONES8, ONES8, ONES8, ONES8};

/* K chunk on AMX: longer than the configuration's KC (tuned for the dense loops) since each
 * unit re-packs its panels per chunk; one float64 run of BF16 views (batched.h), so that runs
 * start at multiples of DG_F64_RUN blocks of K' whatever the chunk loop does. */
#define BATCHED_AMX_KC (DG_F64_RUN * DG_ACC_BLOCK)
/* Outputs at least this large are written with non-temporal stores: the heads forms write
 * up to hundreds of MB once, and ordinary stores would first read every line (RFO). */
#define BATCHED_STREAM_BYTES ((int64_t)8 << 20)

typedef struct bjob {
    const dg_bgemm *p;
    const dg_engine_cfg *cfg;
    dg_pack_fmt fa, fb;         /* packed formats of A (MR panels) and B (NR panels) */
    int64_t mc, nc, mt, nt, kp; /* kp: K of one segment padded as fb requires */
    int64_t kcb;                /* K block: microkernel calls run over kcb k (or scale blocks) */
    size_t es; /* bytes per packed element */
    const dg_scale_plan *plans; /* per group, with p->ops */
    const int64_t *gid;         /* the groups this job runs (all with cfg), ngroups of them */
    int64_t ngroups;
    size_t abytes, bbytes, cbytes, sbytes, fbytes; /* per-thread memory: panels, C, staging, scales */
    size_t gbytes;              /* per-thread group sums (segments: batched.h, DG_ACC_GROUP), or 0 */
    size_t dbytes;              /* per-thread float64 sums (AMX, BF16 views: cfg->ukr_f64), or 0 */
    int stream;                 /* D written with non-temporal stores */
    int tile_major;             /* units ordered tile by tile (all groups of a tile together) */
    int64_t pf_bytes;           /* the most operand bytes of a chunk that pf_plan prefetches */
    char *bpre;                 /* B packed once for all units (bpre_at), or NULL: per unit */
    /* w outputs of a row of D: round(C + acc) (cp NULL: no C), streamed or not */
    void (*row)(int f32, const float *acc, const void *cp, void *dst, int64_t w, int stream);
} bjob;

/* AMX A tiles from a K-major source (unit stride along K): each k step of 32 is a [r][32]
 * block of row pieces (engine.h, DG_PACK_AMX_A), zero past `k` and past `rows`. */
static void pack_amx_a(const uint16_t *src, int64_t si, int64_t rows, int r, int64_t k0, int64_t kc, int64_t k,
                       uint16_t *dst) {
    const int64_t kend = k0 + kc < k ? k0 + kc : k;
    for (int i = 0; i < r; ++i) { /* row by row: the source is read sequentially */
        /* Rows are often far apart (a head of [B, H, R]): fetch a few rows ahead. */
        if (i + 4 < rows)
            for (int64_t ks = k0; ks < kend; ks += 32)
                __builtin_prefetch(src + (i + 4) * si + ks);
        for (int64_t ks = k0; ks < k0 + kc; ks += 32) {
            uint16_t *o = dst + (ks - k0) * r + 32 * i;
            const int64_t n = i >= rows || k <= ks ? 0 : k - ks > 32 ? 32 : k - ks;
            if (n == 32) {
                memcpy(o, src + i * si + ks, 64);
            } else {
                memcpy(o, src + i * si + ks, (size_t)n * 2);
                memset(o + n, 0, (size_t)(32 - n) * 2);
            }
        }
    }
}

/* Portable packing of rows [0, rows) x k [k0, k0 + kc) into a panel slice of width r. */
static void pack_portable(const uint16_t *src, int64_t si, int64_t sk, int64_t rows, int r, int64_t k0,
                          int64_t kc, int64_t k, dg_pack_fmt fmt, void *dst) {
    for (int64_t kk = k0; kk < k0 + kc; ++kk)
        for (int i = 0; i < r; ++i) {
            const uint16_t v = i < rows && kk < k ? src[i * si + kk * sk] : 0;
            if (fmt == DG_PACK_F32)
                ((float *)dst)[(kk - k0) * r + i] = dg_engine_bf16_f32(v);
            else if (fmt == DG_PACK_AMX_A)
                ((uint16_t *)dst)[((kk - k0) / 32) * 32 * r + 32 * i + (kk - k0) % 32] = v;
            else
                ((uint16_t *)dst)[((kk - k0) / 2) * 2 * r + 2 * i + ((kk - k0) & 1)] = v;
        }
}

/* Rows [0, rows) of a view (row 0 at src), k in [k0, k0 + kc), into slices of ceil(rows / r)
 * panels of format fmt (panel p at dst + p * pstride elements). */
static void pack_rows(const bjob *j, const uint16_t *src, int64_t si, int64_t sk, int64_t rows, int r,
                      dg_pack_fmt fmt, int64_t k0, int64_t kc, int64_t pstride, char *dst) {
    const dg_engine_cfg *cfg = j->cfg;
    const int64_t k = j->p->k;
    if (si == 1 && sk != 1 && fmt != DG_PACK_AMX_A && cfg->pack_bf16_mn && r <= 32) {
        /* MN-major: k rows far apart (a transposed [H, D, R] head: one row per k, R + pad
         * elements apart, past what the hardware prefetchers follow). 32 k at a time across all
         * panels reads each k row's whole piece in address order instead of one 64-byte line
         * of it per panel (measured ~1.5x on 'bhd,hdr->bhr' b128_h8_r4096_d1024). */
        for (int64_t kb = k0; kb < k0 + kc; kb += 32)
            for (int64_t p0 = 0; p0 < rows; p0 += r) {
                const int64_t n = rows - p0 < r ? rows - p0 : r, w = k0 + kc - kb < 32 ? k0 + kc - kb : 32;
                cfg->pack_bf16_mn(src + p0, sk, n, r, kb, w, k, fmt,
                                  dst + (size_t)((p0 / r) * pstride + (kb - k0) * r) * j->es);
            }
        return;
    }
    for (int64_t p0 = 0; p0 < rows; p0 += r) {
        const uint16_t *s = src + p0 * si;
        const int64_t n = rows - p0 < r ? rows - p0 : r;
        void *pd = dst + (size_t)((p0 / r) * pstride) * j->es;
        if (fmt == DG_PACK_AMX_A && sk == 1)
            pack_amx_a(s, si, n, r, k0, kc, k, pd);
        else if (fmt != DG_PACK_AMX_A && sk == 1 && cfg->pack_bf16 && r <= 32)
            cfg->pack_bf16(s, si, n, r, k0, kc, k, fmt, pd);
        else if (fmt != DG_PACK_AMX_A && si == 1 && cfg->pack_bf16_mn && r <= 32)
            cfg->pack_bf16_mn(s, sk, n, r, k0, kc, k, fmt, pd);
        else
            pack_portable(s, si, sk, n, r, k0, kc, k, fmt, pd);
    }
}

/* Rows [i0, i0 + rows) of operand op (any dtype; folded scales applied by the fetch) into
 * panels of width r, through a K-major BF16 staging block [r][kc]. */
static void pack_op_rows(const bjob *j, const dg_operand *op, int fold, int64_t i0, int64_t rows, int r,
                         dg_pack_fmt fmt, int64_t k0, int64_t kc, uint16_t *stage, char *dst) {
    const dg_engine_cfg *cfg = j->cfg;
    for (int64_t p0 = 0; p0 < rows; p0 += r) {
        for (int rr = 0; rr < r; ++rr) {
            if (p0 + rr < rows)
                dg_engine_fetch_bf16(op, i0 + p0 + rr, fold, k0, k0 + kc, stage + rr * kc, cfg);
            else
                memset(stage + rr * kc, 0, (size_t)kc * 2);
        }
        void *pd = dst + (size_t)((p0 / r) * kc * r) * j->es;
        if (fmt == DG_PACK_AMX_A)
            pack_amx_a(stage, kc, r, r, 0, kc, kc, pd);
        else if (cfg->pack_bf16 && r <= 32)
            cfg->pack_bf16(stage, kc, r, r, 0, kc, kc, fmt, pd);
        else
            pack_portable(stage, kc, 1, r, r, 0, kc, kc, fmt, pd);
    }
}

/* Unfolded scales of rows [i0, i0 + r) of op at k (1 past the operand's rows or when folded). */
static void row_scales(const dg_operand *op, int folded, int64_t i0, int r, int64_t k, float *out) {
    for (int i = 0; i < r; ++i)
        out[i] = !folded && op->sf && i0 + i < op->mn ? dg_operand_scale(op, 0, i0 + i, k) : 1.0f;
}

/*
 * B packed once per job (BF16 views whose row tiles share each B block, such as the heads
 * forms' y[h], reused by every tile of rows): otherwise every unit packs the same B again (measured on Zen 4, 'bhr,hdr->bhd' b4096 h128 r512 d128: packing took a quarter of the
 * time, B a third of it). Block (g, column tile jc) holds the chunks of its K' one after the
 * other, each laid out as a unit packs it: chunk [q0, q0 + kc) at q0 * NCp elements, panel jr
 * at jr * kc * NR within it (NCp: the column tile rounded to panels, j->nc).
 */
static int64_t bpre_elems(const bjob *j) {
    return j->p->groups * j->nt * j->p->segs * j->kp * j->nc;
}

static char *bpre_at(const bjob *j, int64_t g, int64_t jc, int64_t q0) {
    return j->bpre + (size_t)(((g * j->nt + jc) * j->p->segs * j->kp + q0) * j->nc) * j->es;
}

/* Only while the packed B stays in the last-level cache (half of it; 8 MiB when unknown):
 * larger, the extra pass over memory costs more than packing in the units, where it overlaps
 * (measured: 'bmk,bnk->mn' S1024 M256 N256 K256, 134 MB of packed B, 97 -> 108 ms). */
static bool bpre_applies(const bjob *j) {
    const int64_t l3 = dg_cpu_cache_bytes(3), limit = (l3 > 0 ? l3 : (int64_t)16 << 20) / 2;
    int64_t bytes;
    return !j->p->ops && j->mt > 1 && !__builtin_mul_overflow(bpre_elems(j), (int64_t)j->es, &bytes) && bytes <= limit;
}

/* A unit: group g, output rows [m0, m0 + rows) and columns [n0, n0 + cols). */
typedef struct bunit {
    int64_t g, m0, rows, n0, cols;
} bunit;

/*
 * Software prefetch (to L2) of what the next packing reads, spread over the microkernel calls
 * of the current chunk: the unit's next K chunk, or after its last chunk the first chunk of the
 * unit the thread runs next (job_run claims it one unit ahead). Packing straight from memory
 * stalls on every row: the rows are short pieces far apart ([B, H, R] heads, E4M3 heads of R
 * bytes), or, for the K-segmented form, each chunk is new memory (measured on Zen 4: 'bmk,bnk->mn'
 * S 4096, M 128, N 384, K 128 175 -> 157 ms; ~8% on fp8 'bhr,hdr->bhd' b128_h8_r4096_d1024).
 * Items (a few per microkernel call): for operand pairs (p->ops) the MR panels of A, then the
 * NR panels of B, rows with contiguous 1- or 2-byte elements along K only; for the BF16 views a
 * row of the unit over the chunk's K' positions when the view is K-major, else one position's
 * piece of the unit's rows (MN-major).
 */
typedef struct pf_plan {
    bunit u;
    int64_t k0, k1;  /* the chunk: k (p->ops) or K' positions (segments), k1 <= k0: none */
    int64_t na, items, done; /* A's items come first */
} pf_plan;

static int64_t view_items(const dg_bview *v, int64_t rows, int64_t kc) {
    return v->sk == 1 ? rows : v->si == 1 ? kc : 0;
}

static void pf_plan_init(const bjob *j, pf_plan *pf, const bunit *u, int64_t k0, int64_t k1) {
    *pf = (pf_plan){.u = *u, .k0 = k0, .k1 = k1};
    if (k1 <= k0)
        return;
    if (j->p->ops) {
        pf->na = dg_ceil_div(u->rows, j->cfg->mr);
        pf->items = pf->na + dg_ceil_div(u->cols, j->cfg->nr);
    } else {
        pf->na = view_items(&j->p->a, u->rows, k1 - k0);
        /* pre-packed B: its chunk is contiguous, items of 1 KiB */
        pf->items = pf->na + (j->bpre ? dg_ceil_div((k1 - k0) * dg_align(u->cols, j->cfg->nr) * (int64_t)j->es, 1024)
                                      : view_items(&j->p->b, u->cols, k1 - k0));
    }
}

/* A panel of an operand pair's rows over k [k0, k1). */
static void pf_ops_panel(const bjob *j, const pf_plan *c, int side, int64_t panel) {
    const int r = side ? j->cfg->nr : j->cfg->mr;
    const int64_t all = side ? c->u.cols : c->u.rows, i0 = (side ? c->u.n0 : c->u.m0) + panel * r;
    const int64_t nrow = all - panel * r < r ? all - panel * r : r;
    const dg_tensor *t = j->p->ops[2 * c->u.g + side].data;
    const int64_t es = (int64_t)dg_dtype_size(t->dtype), k1 = c->k1 < j->p->k ? c->k1 : j->p->k;
    if (t->strides[1] != 1 || (t->dtype != DG_BFLOAT16 && t->dtype != DG_FLOAT8_E4M3))
        return;
    for (int64_t i = 0; i < nrow; ++i)
        for (int64_t kk = c->k0 * es; kk < k1 * es; kk += 64)
            __builtin_prefetch((const char *)t->data + (i0 + i) * t->strides[0] * es + kk, 0, 2);
}

/* Item `item` of a BF16 view: a row over the positions, or a position's row piece. */
static void pf_view_item(const bjob *j, const dg_bview *v, int64_t i0, int64_t rows, const pf_plan *c,
                         int64_t item) {
    const int64_t k = j->p->k;
    const uint16_t *base = v->base + c->u.g * v->sg;
    if (v->sk == 1) {
        const uint16_t *row = base + (i0 + item) * v->si;
        for (int64_t q = c->k0; q < c->k1;) { /* the positions' pieces, segment by segment */
            const int64_t s = q / j->kp, k0 = q % j->kp, end = j->kp - k0 < c->k1 - q ? j->kp : k0 + c->k1 - q;
            for (int64_t kk = k0; kk < (end < k ? end : k); kk += 32)
                __builtin_prefetch(row + s * v->ss + kk, 0, 2);
            q += end - k0;
        }
        return;
    }
    const int64_t q = c->k0 + item, s = q / j->kp, kk = q % j->kp;
    if (kk < k) /* positions past k are the zero padding */
        for (int64_t i = 0; i < rows; i += 32)
            __builtin_prefetch(base + s * v->ss + kk * v->sk + i0 + i, 0, 2);
}

/* Prefetches items until `upto` of them are done. */
static void pf_run(const bjob *j, pf_plan *c, int64_t upto) {
    for (; c->done < upto && c->done < c->items; ++c->done) {
        const int side = c->done >= c->na;
        const int64_t item = side ? c->done - c->na : c->done;
        if (j->p->ops) {
            pf_ops_panel(j, c, side, item);
        } else if (side && j->bpre) {
            const char *blk = bpre_at(j, c->u.g, c->u.n0 / j->nc, c->k0) + item * 1024;
            for (int l = 0; l < 1024; l += 64)
                __builtin_prefetch(blk + l, 0, 2);
        } else
            pf_view_item(j, side ? &j->p->b : &j->p->a, side ? c->u.n0 : c->u.m0, side ? c->u.cols : c->u.rows, c,
                         item);
    }
}

/* The K step of a group's operand pair: whole accumulation blocks of about KC. */
static int64_t ops_step(const bjob *j, int64_t g) {
    const int64_t gblk = j->plans[g].gblk;
    return gblk * (j->kcb / gblk > 0 ? j->kcb / gblk : 1);
}

/* What to prefetch while the chunk [k0, k0 + kc) of unit u (of `total` k or positions) runs:
 * nothing when the next chunk's operands exceed a quarter of the L2 cache, which also holds
 * the current panels and the C tile (measured on Zen 4, 1 MiB L2: 'bhd,hdr->bhr' h8 d1024,
 * 320 KiB per chunk, ran 3-9% slower with the prefetch; 'bmk,bnk->mn' at 160 KiB 11% faster). */
static void pf_plan_next(const bjob *j, pf_plan *pf, const bunit *u, const bunit *next, int64_t k0, int64_t kc,
                         int64_t total) {
    const int64_t step = j->p->ops ? ops_step(j, u->g) : j->kcb;
    pf_plan_init(j, pf, u, 0, 0);
    const bunit *w = k0 + kc < total ? u : next;
    if (!w)
        return;
    const int64_t q0 = w == u ? k0 + kc : 0, wstep = w == u ? step : j->p->ops ? ops_step(j, next->g) : j->kcb;
    const int64_t q1 = q0 + wstep < total ? q0 + wstep : total;
    int64_t bytes = (w->rows + w->cols) * (q1 - q0) * 2;
    if (j->p->ops)
        bytes = (w->rows * (int64_t)dg_dtype_size(j->p->ops[2 * w->g].data->dtype) +
                 w->cols * (int64_t)dg_dtype_size(j->p->ops[2 * w->g + 1].data->dtype)) * (q1 - q0);
    if (bytes <= j->pf_bytes)
        pf_plan_init(j, pf, w, q0, q1);
}

/* One unit of an operand-pair group (p->ops): the engine's order, with the scale epilogue
 * once per K block of gblk when a scale is not folded. */
static void run_unit_ops(const bjob *j, const bunit *u, const bunit *next, char *apack, char *bpack, float *cbuf,
                         uint16_t *stage, float *scales) {
    const int64_t g = u->g, m0 = u->m0, rows = u->rows, n0 = u->n0, cols = u->cols;
    const dg_operand *a = &j->p->ops[2 * g], *b = &j->p->ops[2 * g + 1];
    const dg_scale_plan *plan = &j->plans[g];
    const dg_engine_cfg *cfg = j->cfg;
    const int mr = cfg->mr, nr = cfg->nr, gblk = plan->gblk;
    const int64_t mpan = dg_ceil_div(rows, mr), npan = dg_ceil_div(cols, nr), ldc = j->nc;
    const int64_t step = ops_step(j, g);
    int rt; /* the last A panel's rows and kernel (dg_engine_tail_kernel) */
    const dg_ukr_fn tail = dg_engine_tail_kernel(cfg, rows - (mpan - 1) * mr, &rt);
    const int64_t full = rt == mr ? rows : (mpan - 1) * mr;
    memset(cbuf, 0, (size_t)(mpan * mr * ldc) * sizeof(float));
    for (int64_t k0 = 0; k0 < j->kp; k0 += step) {
        const int64_t kc = j->kp - k0 < step ? j->kp - k0 : step;
        pack_op_rows(j, a, plan->fold_a, m0, full, mr, j->fa, k0, kc, stage, apack);
        if (full < rows)
            pack_op_rows(j, a, plan->fold_a, m0 + full, rows - full, rt, j->fa, k0, kc, stage,
                         apack + (size_t)((mpan - 1) * kc * mr) * j->es);
        pack_op_rows(j, b, plan->fold_b, n0, cols, nr, j->fb, k0, kc, stage, bpack);
        /* The chunk's scales once (not per microkernel call): A's [mpan][nb][MR] at scales,
         * then B's [npan][nb][NR]. */
        const int64_t nb = dg_ceil_div(kc, gblk), calls = npan * mpan;
        pf_plan pf;
        pf_plan_next(j, &pf, u, next, k0, kc, j->kp);
        float *sbs = scales + mpan * nb * mr;
        for (int64_t ir = 0; ir < mpan; ++ir)
            for (int64_t kb = 0; kb < nb; ++kb)
                row_scales(a, plan->fold_a, m0 + ir * mr, mr, k0 + kb * gblk, scales + (ir * nb + kb) * mr);
        for (int64_t jr = 0; jr < npan; ++jr)
            for (int64_t kb = 0; kb < nb; ++kb)
                row_scales(b, plan->fold_b, n0 + jr * nr, nr, k0 + kb * gblk, sbs + (jr * nb + kb) * nr);
        for (int64_t jr = 0; jr < npan; ++jr)
            for (int64_t ir = 0; ir < mpan; ++ir) {
                const char *ap = apack + (size_t)(ir * kc * mr) * j->es, *bp = bpack + (size_t)(jr * kc * nr) * j->es;
                float *ct = cbuf + ir * mr * ldc + jr * nr;
                const int r = ir == mpan - 1 ? rt : mr;
                const dg_ukr_fn ukr = ir == mpan - 1 ? tail : cfg->ukr;
                if (cfg->amx && plan->fold_a && plan->fold_b) /* one tile chain over K (engine.h) */
                    ukr(kc, ap, bp, ct, ldc, DG_UKR_ACC, scales, sbs);
                else
                    for (int64_t kb = 0; kb < nb; ++kb) {
                        const int64_t kb0 = kb * gblk, kb1 = kb0 + gblk < kc ? kb0 + gblk : kc;
                        ukr(kb1 - kb0, ap + (size_t)(kb0 * r) * j->es, bp + (size_t)(kb0 * nr) * j->es, ct, ldc,
                            DG_UKR_SCALE, scales + (ir * nb + kb) * mr, sbs + (jr * nb + kb) * nr);
                    }
                pf_run(j, &pf, (jr * mpan + ir + 1) * pf.items / calls);
            }
    }
}

/* The D (and C) rows of a unit towards the cache before the last K block (gemm.c: stores
 * into short strided rows otherwise miss one by one). */
static void prefetch_out(const dg_tensor *d, const dg_tensor *c, int stream, int64_t m0, int64_t rows, int64_t n0,
                         int64_t cols) {
    const int64_t bytes = cols * (int64_t)dg_dtype_size(d->dtype);
    for (int64_t r = 0; r < rows; ++r) {
        const char *dp = dg_ptr2(d, m0 + r, n0);
        const char *cp = c && c->data != d->data ? dg_ptr2(c, m0 + r, n0) : NULL;
        for (int64_t off = 0; off < bytes; off += 64) {
            if (!stream)
                __builtin_prefetch(dp + off, 1, 2);
            if (cp)
                __builtin_prefetch(cp + off, 0, 2);
        }
    }
}

/* out[t] = round(C[t] + acc[t]) in D's dtype for t < w: dg_engine_store_row's arithmetic
 * (cp NULL: no C). Integer rounding, so every instruction set gives the same bits. */
static inline void cvt_body(int f32, const float *acc, const void *cp, void *out, int64_t w) {
    if (f32) {
        const float *ci = cp;
        float *o = out;
        for (int64_t t = 0; t < w; ++t)
            o[t] = ci ? ci[t] + acc[t] : acc[t];
    } else if (cp) {
        const uint16_t *ci = cp;
        uint16_t *o = out;
        for (int64_t t = 0; t < w; ++t)
            o[t] = dg_engine_f32_bf16(dg_engine_bf16_f32(ci[t]) + acc[t]);
    } else {
        uint16_t *o = out;
        for (int64_t t = 0; t < w; ++t)
            o[t] = dg_engine_f32_bf16(acc[t]);
    }
}

enum { ROW_PIECE = 256 }; /* columns per row write: the stream buffer */

/* w <= ROW_PIECE outputs of a row into dst: directly, or (stream) through a buffer and
 * non-temporal stores (partial lines at the ends with ordinary ones). */
static void row_portable(int f32, const float *acc, const void *cp, void *dst, int64_t w, int stream) {
#ifdef BATCHED_NT
    if (stream) {
        uint32_t buf[ROW_PIECE] __attribute__((aligned(16)));
        cvt_body(f32, acc, cp, buf, w);
        char *dp = dst;
        const char *src = (const char *)buf;
        size_t left = (size_t)w * (f32 ? 4 : 2), head = (size_t)(-(uintptr_t)dp & 15);
        head = head < left ? head : left;
        memcpy(dp, src, head);
        dp += head, src += head, left -= head;
        for (; left >= 16; dp += 16, src += 16, left -= 16)
            _mm_stream_si128((__m128i *)dp, _mm_loadu_si128((const __m128i *)src));
        memcpy(dp, src, left);
        return;
    }
#endif
    cvt_body(f32, acc, cp, dst, w);
}

#if defined(__GNUC__) && defined(__x86_64__)
/* The same for the AVX-512 levels: the C loops vectorized for AVX-512 (the BF16 rounding of
 * the heads forms' large outputs is a visible share of their time in SSE2), whole-line
 * non-temporal stores. */
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) static void
row_avx512(int f32, const float *acc, const void *cp, void *dst, int64_t w, int stream) {
    if (!stream) {
        cvt_body(f32, acc, cp, dst, w);
        return;
    }
    uint32_t buf[ROW_PIECE] __attribute__((aligned(64)));
    cvt_body(f32, acc, cp, buf, w);
    char *dp = dst;
    const char *src = (const char *)buf;
    size_t left = (size_t)w * (f32 ? 4 : 2), head = (size_t)(-(uintptr_t)dp & 63);
    head = head < left ? head : left;
    memcpy(dp, src, head);
    dp += head, src += head, left -= head;
    for (; left >= 64; dp += 64, src += 64, left -= 64)
        _mm512_stream_si512((void *)dp, _mm512_loadu_si512(src));
    memcpy(dp, src, left);
}
#endif

/* D[m0 + r, n0 .. n0 + cols) = round(C + acc row r) for r < rows. */
static void store_rows(const bjob *j, const dg_tensor *d, const dg_tensor *c, int64_t m0, int64_t rows, int64_t n0,
                       int64_t cols, const float *cbuf) {
    const int f32 = d->dtype == DG_FLOAT32;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t s0 = 0; s0 < cols; s0 += ROW_PIECE) {
            const int64_t w = cols - s0 < ROW_PIECE ? cols - s0 : ROW_PIECE;
            const void *cp = c ? dg_ptr2(c, m0 + r, n0 + s0) : NULL;
            j->row(f32, cbuf + r * j->nc + s0, cp, dg_ptr2(d, m0 + r, n0 + s0), w, j->stream);
        }
#ifdef BATCHED_NT
    if (j->stream)
        _mm_sfence(); /* the streamed lines are visible before the unit is done */
#endif
}

/* Positions [q0, q0 + kc) of a unit's K, which runs over the segments one after the other,
 * each padded to kp (position q: segment q / kp, k q % kp), into the unit's A and B panels.
 * kc and kp are multiples of the format's k step (2, or 32 for AMX), so each segment's piece
 * starts a whole step of the panels and one microkernel call covers several segments with
 * the order of one call per segment (an accumulation block may span two segments). */
static void pack_chunk(const bjob *j, int64_t g, int64_t m0, int64_t rows, int rt, int64_t n0, int64_t cols,
                       int64_t q0, int64_t kc, char *apack, char *bpack) {
    const dg_bgemm *p = j->p;
    const int mr = j->cfg->mr, nr = j->cfg->nr;
    const int64_t full = rt == mr ? rows : rows / mr * mr; /* rows in MR-row panels; the rest: rt */
    char *atail = apack + (size_t)(full / mr * kc * mr) * j->es;
    for (int64_t q = q0; q < q0 + kc;) {
        const int64_t s = q / j->kp, k0 = q % j->kp, len = j->kp - k0 < q0 + kc - q ? j->kp - k0 : q0 + kc - q;
        const uint16_t *ab = p->a.base + g * p->a.sg + s * p->a.ss + m0 * p->a.si;
        const uint16_t *bb = p->b.base + g * p->b.sg + s * p->b.ss + n0 * p->b.si;
        pack_rows(j, ab, p->a.si, p->a.sk, full, mr, j->fa, k0, len, kc * mr, apack + (size_t)((q - q0) * mr) * j->es);
        if (full < rows)
            pack_rows(j, ab + full * p->a.si, p->a.si, p->a.sk, rows - full, rt, j->fa, k0, len, kc * rt,
                      atail + (size_t)((q - q0) * rt) * j->es);
        if (bpack)
            pack_rows(j, bb, p->b.si, p->b.sk, cols, nr, j->fb, k0, len, kc * nr, bpack + (size_t)((q - q0) * nr) * j->es);
        q += len;
    }
}

/* Block `blk` of the pre-packing: group, column tile and chunk. */
static void bpre_pack(const bjob *j, int64_t blk) {
    const dg_bgemm *p = j->p;
    const int64_t ktot = p->segs * j->kp, chunks = dg_ceil_div(ktot, j->kcb);
    const int64_t c = blk % chunks, jc = blk / chunks % j->nt, g = blk / chunks / j->nt;
    const int64_t q0 = c * j->kcb, kc = ktot - q0 < j->kcb ? ktot - q0 : j->kcb, n0 = jc * j->nc;
    const int64_t cols = p->n - n0 < j->nc ? p->n - n0 : j->nc;
    char *dst = bpre_at(j, g, jc, q0);
    for (int64_t q = q0; q < q0 + kc;) {
        const int64_t s = q / j->kp, k0 = q % j->kp, len = j->kp - k0 < q0 + kc - q ? j->kp - k0 : q0 + kc - q;
        pack_rows(j, p->b.base + g * p->b.sg + s * p->b.ss + n0 * p->b.si, p->b.si, p->b.sk, cols, j->cfg->nr, j->fb,
                  k0, len, kc * j->cfg->nr, dst + (size_t)((q - q0) * j->cfg->nr) * j->es);
        q += len;
    }
}

/* ct += gt over one mr x NR tile (row stride ldc): a group's sum joins the total. */
static void add_tile(float *ct, const float *gt, int64_t ldc, int mr, int nr) {
    for (int r = 0; r < mr; ++r)
        for (int c = 0; c < nr; ++c)
            ct[r * ldc + c] += gt[r * ldc + c];
}

/* One unit; next: the unit this thread runs after it (prefetched), or NULL. gbuf: the group
 * sums' buffer (like cbuf) when K runs over segments, else NULL. dbuf: the float64 totals (like
 * cbuf, in doubles) between the chunks of the AMX order for BF16 views (batched.h), or NULL
 * (no such order, or K' in one chunk). */
static void run_unit(const bjob *j, const bunit *u, const bunit *next, char *apack, char *bpack, float *cbuf,
                     uint16_t *stage, float *scales, float *gbuf, double *dbuf) {
    const dg_bgemm *p = j->p;
    const int64_t g = u->g, m0 = u->m0, rows = u->rows, n0 = u->n0, cols = u->cols;
    const dg_engine_cfg *cfg = j->cfg;
    const int mr = cfg->mr, nr = cfg->nr;
    const int64_t mpan = dg_ceil_div(rows, mr), npan = dg_ceil_div(cols, nr), ldc = j->nc;
    const int64_t ktot = p->ops ? 0 : p->segs * j->kp;
    const bool f64 = !p->ops && cfg->ukr_f64; /* the AMX order of BF16 views (batched.h) */
    dg_tensor dv = *p->d, cv;
    dv.data = (char *)p->d->data + (size_t)(g * p->dg) * dg_dtype_size(p->d->dtype);
    if (p->c) {
        cv = *p->c;
        cv.data = (char *)p->c->data + (size_t)(g * p->cg) * dg_dtype_size(p->c->dtype);
    }
    if (cfg->ukr_begin) /* tile state: once per unit, never assumed to survive between calls */
        cfg->ukr_begin();
    if (p->ops)
        run_unit_ops(j, u, next, apack, bpack, cbuf, stage, scales);
    else if (!f64 || ktot == 0) /* the float64 order writes cbuf on its last chunk */
        memset(cbuf, 0, (size_t)(mpan * mr * ldc) * sizeof(float));
    int rt; /* the last A panel's rows and kernel (dg_engine_tail_kernel) */
    const dg_ukr_fn tail = dg_engine_tail_kernel(cfg, rows - (mpan - 1) * mr, &rt);
    for (int64_t q0 = 0; q0 < ktot; q0 += j->kcb) {
        const int64_t kc = ktot - q0 < j->kcb ? ktot - q0 : j->kcb;
        char *bp0 = j->bpre ? bpre_at(j, g, n0 / j->nc, q0) : bpack;
        pack_chunk(j, g, m0, rows, rt, n0, cols, q0, kc, apack, j->bpre ? NULL : bpack);
        if (q0 + kc == ktot)
            prefetch_out(&dv, p->c ? &cv : NULL, j->stream, m0, rows, n0, cols);
        const int64_t calls = npan * mpan;
        pf_plan pf;
        pf_plan_next(j, &pf, u, next, q0, kc, ktot);
        for (int64_t jr = 0; jr < npan; ++jr)
            for (int64_t ir = 0; ir < mpan; ++ir) {
                pf_run(j, &pf, (jr * mpan + ir + 1) * pf.items / calls);
                float *ct = cbuf + ir * mr * ldc + jr * nr, *gt = gbuf ? gbuf + ir * mr * ldc + jr * nr : NULL;
                const int r = ir == mpan - 1 ? rt : mr;
                const dg_ukr_fn ukr = ir == mpan - 1 ? tail : cfg->ukr;
                if (f64) { /* AMX: the chunk is one run of blocks, added in float64 (batched.h) */
                    const int flags = (q0 == 0 ? DG_F64_FIRST : 0) | (q0 + kc == ktot ? DG_F64_LAST : 0);
                    cfg->ukr_f64(kc, apack + (size_t)(ir * kc * mr) * j->es, bp0 + (size_t)(jr * kc * nr) * j->es,
                                 dbuf ? dbuf + ir * mr * ldc + jr * nr : NULL, ct, ldc, flags);
                    continue;
                }
                for (int64_t b0 = 0; b0 < kc; b0 += DG_ACC_BLOCK) { /* kcb is a multiple of the block */
                    const int64_t len = kc - b0 < DG_ACC_BLOCK ? kc - b0 : DG_ACC_BLOCK;
                    const char *ap = apack + (size_t)(ir * kc * mr + b0 * r) * j->es;
                    const char *bp = bp0 + (size_t)((jr * kc + b0) * nr) * j->es;
                    if (!gt) {
                        ukr(len, ap, bp, ct, ldc, DG_UKR_SCALE, kOnes, kOnes);
                        continue;
                    }
                    /* Block blk of K' starts a group (its sum from the block's own), joins it,
                     * and the group's sum joins the total when the group or K' ends. */
                    const int64_t blk = (q0 + b0) / DG_ACC_BLOCK;
                    ukr(len, ap, bp, gt, ldc, blk % DG_ACC_GROUP ? DG_UKR_SCALE : DG_UKR_ZERO, kOnes, kOnes);
                    if (blk % DG_ACC_GROUP == DG_ACC_GROUP - 1 || q0 + b0 + len == ktot)
                        add_tile(ct, gt, ldc, r, nr);
                }
            }
    }
    store_rows(j, &dv, p->c ? &cv : NULL, m0, rows, n0, cols, cbuf);
}

/* Tile counts: the configuration's blocks, then doubled (along the larger tile side first)
 * until every thread has work and the units divide evenly among threads (or there are
 * plenty); then tiles of equal size (rounded to whole panels). Tiling never changes bits. */
static void choose_tiles(bjob *j, int threads) {
    const dg_engine_cfg *cfg = j->cfg;
    const dg_bgemm *p = j->p;
    int64_t mt = dg_ceil_div(p->m, cfg->mc), nt = dg_ceil_div(p->n, cfg->nc);
    const int64_t mt_max = dg_ceil_div(p->m, cfg->mr), nt_max = dg_ceil_div(p->n, cfg->nr);
    for (;;) {
        const int64_t units = j->ngroups * mt * nt;
        if (units >= threads && (units % threads == 0 || units >= 4 * threads))
            break;
        const int64_t rows = dg_ceil_div(p->m, mt), cols = dg_ceil_div(p->n, nt);
        if (nt < nt_max && cols >= rows)
            nt = nt * 2 < nt_max ? nt * 2 : nt_max;
        else if (mt < mt_max)
            mt = mt * 2 < mt_max ? mt * 2 : mt_max;
        else if (nt < nt_max)
            nt = nt * 2 < nt_max ? nt * 2 : nt_max;
        else
            break;
    }
    j->mc = dg_align(dg_ceil_div(p->m, mt), cfg->mr);
    j->nc = dg_align(dg_ceil_div(p->n, nt), cfg->nr);
    j->mt = dg_ceil_div(p->m, j->mc), j->nt = dg_ceil_div(p->n, j->nc);
}

/* |elems| * size, saturated at INT64_MAX: a stride over an extent of 1 may be any int64 (nothing
 * steps by it), and these distances only order the tile walk. */
static int64_t abs_bytes(int64_t elems, int64_t size) {
    const uint64_t a = elems < 0 ? 0 - (uint64_t)elems : (uint64_t)elems;
    int64_t out;
    return a > (uint64_t)INT64_MAX || __builtin_mul_overflow((int64_t)a, size, &out) ? INT64_MAX : out;
}

/* Distances in bytes between A's groups and between A's rows (group 0). */
static int64_t group_stride_bytes(const dg_bgemm *p) {
    if (!p->ops)
        return abs_bytes(p->a.sg, 2);
    if (p->groups < 2)
        return 0;
    const uintptr_t g1 = (uintptr_t)p->ops[2].data->data, g0 = (uintptr_t)p->ops[0].data->data;
    return abs_bytes((int64_t)(g1 > g0 ? g1 - g0 : g0 - g1), 1);
}

static int64_t row_stride_bytes(const dg_bgemm *p) {
    return p->ops ? abs_bytes(p->ops[0].data->strides[0], (int64_t)dg_dtype_size(p->ops[0].data->dtype))
                  : abs_bytes(p->a.si, 2);
}

/* A job of configuration cfg over groups gid[0 .. ngroups): formats, tiles, panel memory. */
static void job_init(bjob *j, const dg_bgemm *p, const dg_engine_cfg *cfg, const dg_scale_plan *plans,
                     const int64_t *gid, int64_t ngroups) {
    *j = (bjob){.p = p, .cfg = cfg, .fa = dg_engine_fmt_a(cfg), .fb = cfg->fmt, .plans = plans, .gid = gid,
                .ngroups = ngroups};
    j->kp = dg_pack_kp(j->fb, p->k);
    j->es = cfg->fmt == DG_PACK_F32 ? 4 : 2;
    j->kcb = cfg->amx ? BATCHED_AMX_KC : cfg->kc;
    choose_tiles(j, dg_num_threads());
    int64_t kc = j->kcb, nb = 0; /* the longest K chunk (KC, or whole scale blocks); its blocks */
    for (int64_t q = 0; plans && q < ngroups; ++q) {
        const int64_t gb = plans[gid[q]].gblk, st = gb * (j->kcb / gb > 0 ? j->kcb / gb : 1); /* gb >= 1 */
        kc = st > kc ? st : kc;
        nb = st / gb > nb ? st / gb : nb;
    }
    j->abytes = (size_t)dg_align(j->mc * kc * (int64_t)j->es, 64);
    j->bbytes = (size_t)dg_align(j->nc * kc * (int64_t)j->es, 64);
    j->cbytes = (size_t)dg_align(j->mc * j->nc * (int64_t)sizeof(float), 64);
    j->sbytes = p->ops ? (size_t)dg_align(32 * kc * 2, 64) : 0; /* staging rows */
    j->fbytes = (size_t)dg_align((j->mc + j->nc) * nb * (int64_t)sizeof(float), 64);
    /* float64 totals between chunks: none when K' is one chunk */
    j->dbytes = !p->ops && cfg->ukr_f64 && p->segs * j->kp > j->kcb ? 2 * j->cbytes : 0;
    j->gbytes = !p->ops && p->segs > 1 && !cfg->ukr_f64 ? j->cbytes : 0;
#ifdef BATCHED_NT
    j->stream = ngroups * p->m * p->n * (int64_t)dg_dtype_size(p->d->dtype) >= BATCHED_STREAM_BYTES;
#endif
    /* The heads forms interleave groups inside A's rows ([B, H, R]: group stride R, row stride
     * H * R): taking every group of one row tile in turn reads A in address order (measured
     * ~15% faster on [4096, 128, 512] than group by group, where each unit jumps 128 KiB per
     * row); B of all groups is small enough to stay cached. */
    j->tile_major = ngroups > 1 && group_stride_bytes(p) < row_stride_bytes(p);
    const int64_t l2 = dg_cpu_cache_bytes(2);
    j->pf_bytes = (l2 > 0 ? l2 : (int64_t)512 << 10) / 4;
    j->row = row_portable;
#if defined(__GNUC__) && defined(__x86_64__)
    if (dg_get_isa() >= DG_ISA_AVX512)
        j->row = row_avx512;
#endif
}

static size_t job_per_thread(const bjob *j) {
    return j->abytes + j->bbytes + j->cbytes + j->sbytes + j->fbytes + j->gbytes + j->dbytes;
}

/* Unit u in the job's order (tile_major: all groups of a tile together). */
static bunit unit_at(const bjob *j, int64_t u) {
    const int64_t tiles = j->mt * j->nt;
    const int64_t g = j->gid[j->tile_major ? u % j->ngroups : u / tiles];
    const int64_t t = j->tile_major ? u / j->ngroups : u % tiles;
    const int64_t m0 = (t % j->mt) * j->mc, n0 = (t / j->mt) * j->nc;
    return (bunit){g, m0, j->p->m - m0 < j->mc ? j->p->m - m0 : j->mc, n0, j->p->n - n0 < j->nc ? j->p->n - n0 : j->nc};
}

/* Thread t starts with unit t, then threads take units from a shared counter, each claiming
 * its next unit when it starts one, so that the current unit's last chunk can prefetch the
 * next one's operands (pf_plan). Units write disjoint outputs: which thread runs which never
 * changes a bit. */
static void job_run(const bjob *j, char *mem, size_t per) {
    const int64_t units = j->ngroups * j->mt * j->nt;
    const int threads = (int)(units < dg_num_threads() ? units : dg_num_threads());
    int64_t counter = 0;
#pragma omp parallel num_threads(threads)
    {
        int tid = 0, team = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num(), team = omp_get_num_threads();
#endif
#pragma omp single
        counter = team; /* units [0, team) are the threads' first ones */
        if (j->bpre) {
            const int64_t blocks = j->p->groups * j->nt * dg_ceil_div(j->p->segs * j->kp, j->kcb);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < blocks; ++b)
                bpre_pack(j, b);
        }
        char *base = mem + per * (size_t)tid;
        char *cb = base + j->abytes + j->bbytes, *sb = cb + j->cbytes, *gb = sb + j->sbytes + j->fbytes;
        char *db = gb + j->gbytes; /* 64-byte aligned, as every part */
        int64_t cur = tid, next;
        while (cur < units) {
#pragma omp atomic capture
            next = counter++;
            const bunit u = unit_at(j, cur), nu = next < units ? unit_at(j, next) : u;
            run_unit(j, &u, next < units ? &nu : NULL, base, base + j->abytes, (float *)cb, (uint16_t *)sb,
                     (float *)(sb + j->sbytes), j->gbytes ? (float *)gb : NULL, j->dbytes ? (double *)db : NULL);
            cur = next;
        }
    }
}

/*
 * Every group runs on the configuration dg_engine_gemm would pick for its operands
 * (dg_engine_config_for: AMX unless unfolded scale blocks are not whole tile steps), so each
 * group's bits are those of the dense GEMM. Scale plans may differ between groups (B scales
 * that happen to be powers of two are folded), hence at most two jobs: the groups on the
 * current configuration, then those on its fallback.
 */
dg_status dg_engine_bgemm(const dg_bgemm *p) {
    if (p->groups == 0 || p->m == 0 || p->n == 0)
        return DG_OK;
    const dg_engine_cfg *cfg = dg_engine_config(dg_get_isa());
    dg_scale_plan *plans = NULL;
    int64_t *gid = dg_malloc((size_t)p->groups * sizeof *gid);
    if (p->ops)
        plans = dg_malloc((size_t)p->groups * sizeof *plans);
    if (!gid || (p->ops && !plans)) {
        dg_free(gid), dg_free(plans);
        return dg_fail(DG_ERR_ALLOC, "out of memory for the batched GEMM plans");
    }
    int64_t nmain = 0, nfall = 0; /* gid: main groups from the front, fallback ones from the back */
    const dg_engine_cfg *fall = cfg;
    for (int64_t g = 0; g < p->groups; ++g) {
        const dg_engine_cfg *c = cfg;
        if (plans) {
            if (!dg_engine_plan_scales(&p->ops[2 * g], &p->ops[2 * g + 1], &plans[g])) {
                dg_free(gid), dg_free(plans);
                return DG_ERR_UNSUPPORTED;
            }
            c = dg_engine_config_for(cfg, &plans[g]);
        }
        if (c == cfg)
            gid[nmain++] = g;
        else
            fall = c, gid[p->groups - 1 - nfall++] = g;
    }
    DG_PATH("%s batched kernel (%lld groups%s%s) | first: m=%lld n=%lld k=%lld", cfg->name, (long long)p->groups,
            nfall ? ", some on " : "", nfall ? fall->name : "", (long long)p->m, (long long)p->n, (long long)p->k);
    bjob jobs[2];
    int njobs = 0;
    if (nmain)
        job_init(&jobs[njobs++], p, cfg, plans, gid, nmain);
    if (nfall)
        job_init(&jobs[njobs++], p, fall, plans, gid + nmain, nfall);
    size_t per = 0;
    for (int i = 0; i < njobs; ++i)
        per = job_per_thread(&jobs[i]) > per ? job_per_thread(&jobs[i]) : per;
    char *mem = dg_ws_get(per * (size_t)dg_num_threads() + 64);
    if (!mem) {
        dg_free(gid), dg_free(plans);
        return dg_fail(DG_ERR_ALLOC, "out of memory for the batched GEMM panels");
    }
    for (int i = 0; i < njobs; ++i) {
        /* no memory for the shared B: each unit packs its own, as always */
        char *bpre = bpre_applies(&jobs[i]) ? dg_ws_get((size_t)(bpre_elems(&jobs[i]) * (int64_t)jobs[i].es) + 64) : NULL;
        jobs[i].bpre = bpre;
        job_run(&jobs[i], mem, per);
        dg_ws_put(bpre);
    }
    dg_ws_put(mem);
    dg_free(gid), dg_free(plans);
    return DG_OK;
}
