/*
 * batched.c - batched / K-segmented BF16 GEMMs (contract and order: batched.h).
 *
 *   units = groups x MC-row tiles x NC-column tiles       [OpenMP, one thread per unit]
 *     for each segment s, for k0 in steps of KC:
 *       pack the unit's A rows and B rows of (s, k0 .. k0 + KC) into thread-local panels
 *       for jr over NR panels:  for ir over MR panels:  microkernel (ZERO first, then ACC)
 *     D = round(C + tile buffer)
 * Unlike gemm.c, which packs each operand once and shares the panels, every unit packs its
 * own panels: the per-group GEMMs are small (or, for segments, the operand is streamed once),
 * so there is little to share, and no barrier is needed between groups.
 */
#include "batched.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct bjob {
    const dg_bgemm *p;
    const dg_engine_cfg *cfg;
    int64_t mc, nc, mt, nt, kp;
    size_t es; /* bytes per packed element */
    const dg_scale_plan *plans; /* per group, with p->ops */
} bjob;

/* Portable packing of rows [0, rows) x k [k0, k0 + kc) into a panel slice of width r. */
static void pack_portable(const uint16_t *src, int64_t si, int64_t sk, int64_t rows, int r, int64_t k0,
                          int64_t kc, int64_t k, dg_pack_fmt fmt, void *dst) {
    for (int64_t kk = k0; kk < k0 + kc; ++kk)
        for (int i = 0; i < r; ++i) {
            const uint16_t v = i < rows && kk < k ? src[i * si + kk * sk] : 0;
            if (fmt == DG_PACK_F32)
                ((float *)dst)[(kk - k0) * r + i] = dg_engine_bf16_f32(v);
            else
                ((uint16_t *)dst)[((kk - k0) / 2) * 2 * r + 2 * i + ((kk - k0) & 1)] = v;
        }
}

/* Rows [0, rows) of a view (row 0 at src) into ceil(rows / r) panels of kc k each. */
static void pack_rows(const bjob *j, const uint16_t *src, int64_t si, int64_t sk, int64_t rows, int r,
                      int64_t k0, int64_t kc, char *dst) {
    const dg_engine_cfg *cfg = j->cfg;
    const int64_t k = j->p->k;
    for (int64_t p0 = 0; p0 < rows; p0 += r) {
        const uint16_t *s = src + p0 * si;
        const int64_t n = rows - p0 < r ? rows - p0 : r;
        void *pd = dst + (size_t)((p0 / r) * kc * r) * j->es;
        if (sk == 1 && cfg->pack_bf16 && r <= 32)
            cfg->pack_bf16(s, si, n, r, k0, kc, k, cfg->fmt, pd);
        else if (si == 1 && cfg->pack_bf16_mn && r <= 32)
            cfg->pack_bf16_mn(s, sk, n, r, k0, kc, k, cfg->fmt, pd);
        else
            pack_portable(s, si, sk, n, r, k0, kc, k, cfg->fmt, pd);
    }
}

/* Rows [i0, i0 + rows) of operand op (any dtype; folded scales applied by the fetch) into
 * panels of width r, through a K-major BF16 staging block [r][kc]. */
static void pack_op_rows(const bjob *j, const dg_operand *op, int fold, int64_t i0, int64_t rows, int r, int64_t k0,
                         int64_t kc, uint16_t *stage, char *dst) {
    const dg_engine_cfg *cfg = j->cfg;
    for (int64_t p0 = 0; p0 < rows; p0 += r) {
        for (int rr = 0; rr < r; ++rr) {
            if (p0 + rr < rows)
                dg_engine_fetch_bf16(op, i0 + p0 + rr, fold, k0, k0 + kc, stage + rr * kc, cfg);
            else
                memset(stage + rr * kc, 0, (size_t)kc * 2);
        }
        void *pd = dst + (size_t)((p0 / r) * kc * r) * j->es;
        if (cfg->pack_bf16 && r <= 32)
            cfg->pack_bf16(stage, kc, r, r, 0, kc, kc, cfg->fmt, pd);
        else
            pack_portable(stage, kc, 1, r, r, 0, kc, kc, cfg->fmt, pd);
    }
}

/* Unfolded scales of rows [i0, i0 + r) of op at k (1 past the operand's rows or when folded). */
static void row_scales(const dg_operand *op, int folded, int64_t i0, int r, int64_t k, float *out) {
    for (int i = 0; i < r; ++i)
        out[i] = !folded && op->sf && i0 + i < op->mn ? dg_operand_scale(op, 0, i0 + i, k) : 1.0f;
}

/* One unit of an operand-pair group (p->ops): the engine's order, with the scale epilogue
 * once per K block of gblk when a scale is not folded. */
static void run_unit_ops(const bjob *j, int64_t g, int64_t m0, int64_t rows, int64_t n0, int64_t cols,
                         char *apack, char *bpack, float *cbuf, uint16_t *stage) {
    const dg_operand *a = &j->p->ops[2 * g], *b = &j->p->ops[2 * g + 1];
    const dg_scale_plan *plan = &j->plans[g];
    const dg_engine_cfg *cfg = j->cfg;
    const int mr = cfg->mr, nr = cfg->nr, gblk = plan->gblk;
    const int64_t mpan = dg_ceil_div(rows, mr), npan = dg_ceil_div(cols, nr), ldc = j->nc;
    const int64_t step = gblk ? gblk * (cfg->kc / gblk > 0 ? cfg->kc / gblk : 1) : cfg->kc;
    float sa[32], sb[32];
    if (gblk || j->kp == 0)
        memset(cbuf, 0, (size_t)(mpan * mr * ldc) * sizeof(float));
    for (int64_t k0 = 0; k0 < j->kp; k0 += step) {
        const int64_t kc = j->kp - k0 < step ? j->kp - k0 : step;
        pack_op_rows(j, a, plan->fold_a, m0, rows, mr, k0, kc, stage, apack);
        pack_op_rows(j, b, plan->fold_b, n0, cols, nr, k0, kc, stage, bpack);
        for (int64_t jr = 0; jr < npan; ++jr)
            for (int64_t ir = 0; ir < mpan; ++ir) {
                const char *ap = apack + (size_t)(ir * kc * mr) * j->es, *bp = bpack + (size_t)(jr * kc * nr) * j->es;
                float *ct = cbuf + ir * mr * ldc + jr * nr;
                if (!gblk) {
                    cfg->ukr(kc, ap, bp, ct, ldc, k0 == 0 ? DG_UKR_ZERO : DG_UKR_ACC, NULL, NULL);
                    continue;
                }
                for (int64_t kb0 = 0; kb0 < kc; kb0 += gblk) {
                    const int64_t kb1 = kb0 + gblk < kc ? kb0 + gblk : kc;
                    row_scales(a, plan->fold_a, m0 + ir * mr, mr, k0 + kb0, sa);
                    row_scales(b, plan->fold_b, n0 + jr * nr, nr, k0 + kb0, sb);
                    cfg->ukr(kb1 - kb0, ap + (size_t)(kb0 * mr) * j->es, bp + (size_t)(kb0 * nr) * j->es, ct, ldc,
                             DG_UKR_SCALE, sa, sb);
                }
            }
    }
}

/* One unit: group g, rows [m0, m0 + rows), columns [n0, n0 + cols). */
static void run_unit(const bjob *j, int64_t g, int64_t m0, int64_t rows, int64_t n0, int64_t cols, char *apack,
                     char *bpack, float *cbuf, uint16_t *stage) {
    const dg_bgemm *p = j->p;
    const dg_engine_cfg *cfg = j->cfg;
    const int mr = cfg->mr, nr = cfg->nr;
    const int64_t mpan = dg_ceil_div(rows, mr), npan = dg_ceil_div(cols, nr), ldc = j->nc;
    int first = 1;
    if (p->ops)
        run_unit_ops(j, g, m0, rows, n0, cols, apack, bpack, cbuf, stage);
    else if (j->kp == 0 || p->segs == 0)
        memset(cbuf, 0, (size_t)(mpan * mr * ldc) * sizeof(float));
    for (int64_t s = 0; s < (p->ops ? 0 : p->segs); ++s) {
        const uint16_t *ab = p->a.base + g * p->a.sg + s * p->a.ss + m0 * p->a.si;
        const uint16_t *bb = p->b.base + g * p->b.sg + s * p->b.ss + n0 * p->b.si;
        for (int64_t k0 = 0; k0 < j->kp; k0 += cfg->kc) {
            const int64_t kc = j->kp - k0 < cfg->kc ? j->kp - k0 : cfg->kc;
            pack_rows(j, ab, p->a.si, p->a.sk, rows, mr, k0, kc, apack);
            pack_rows(j, bb, p->b.si, p->b.sk, cols, nr, k0, kc, bpack);
            for (int64_t jr = 0; jr < npan; ++jr)
                for (int64_t ir = 0; ir < mpan; ++ir)
                    cfg->ukr(kc, apack + (size_t)(ir * kc * mr) * j->es, bpack + (size_t)(jr * kc * nr) * j->es,
                             cbuf + ir * mr * ldc + jr * nr, ldc, first ? DG_UKR_ZERO : DG_UKR_ACC, NULL, NULL);
            first = 0;
        }
    }
    dg_tensor dv = *p->d, cv;
    dv.data = (char *)p->d->data + (size_t)(g * p->dg) * dg_dtype_size(p->d->dtype);
    if (p->c) {
        cv = *p->c;
        cv.data = (char *)p->c->data + (size_t)(g * p->cg) * dg_dtype_size(p->c->dtype);
    }
    for (int64_t r = 0; r < rows; ++r)
        dg_engine_store_row(&dv, p->c ? &cv : NULL, m0 + r, n0, cols, cbuf + r * ldc);
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
        const int64_t units = p->groups * mt * nt;
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

dg_status dg_engine_bgemm(const dg_bgemm *p) {
    if (p->groups == 0 || p->m == 0 || p->n == 0)
        return DG_OK;
    bjob j = {p, dg_engine_config(dg_get_isa()), 0, 0, 0, 0, p->k + (p->k & 1), 0, NULL};
    j.es = j.cfg->fmt == DG_PACK_F32 ? 4 : 2;
    dg_scale_plan *plans = NULL;
    if (p->ops) {
        plans = dg_malloc((size_t)p->groups * sizeof *plans);
        DG_CHECK(plans != NULL, DG_ERR_ALLOC, "out of memory for the batched GEMM plans");
        for (int64_t g = 0; g < p->groups; ++g)
            if (!dg_engine_plan_scales(&p->ops[2 * g], &p->ops[2 * g + 1], &plans[g])) {
                dg_free(plans);
                return DG_ERR_UNSUPPORTED;
            }
        j.plans = plans;
    }
    choose_tiles(&j, dg_num_threads());
    const int64_t units = p->groups * j.mt * j.nt;
    const int threads = (int)(units < dg_num_threads() ? units : dg_num_threads());
    int64_t kc = j.cfg->kc; /* the longest K chunk: KC, or a whole number of scale blocks */
    for (int64_t g = 0; plans && g < p->groups; ++g) {
        const int64_t gb = plans[g].gblk, st = gb ? gb * (j.cfg->kc / gb > 0 ? j.cfg->kc / gb : 1) : 0;
        kc = st > kc ? st : kc;
    }
    const size_t abytes = dg_align((int64_t)(j.mc * kc * (int64_t)j.es), 64);
    const size_t bbytes = dg_align((int64_t)(j.nc * kc * (int64_t)j.es), 64);
    const size_t cbytes = dg_align(j.mc * j.nc * (int64_t)sizeof(float), 64);
    const size_t sbytes = p->ops ? (size_t)dg_align(32 * kc * 2, 64) : 0; /* staging rows */
    const size_t per = abytes + bbytes + cbytes + sbytes;
    char *mem = dg_ws_get(per * (size_t)threads + 64);
    if (!mem) {
        dg_free(plans);
        return dg_fail(DG_ERR_ALLOC, "out of memory for the batched GEMM panels");
    }
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        char *base = mem + per * (size_t)tid;
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; ++u) {
            const int64_t g = u / (j.mt * j.nt), t = u % (j.mt * j.nt);
            const int64_t m0 = (t % j.mt) * j.mc, n0 = (t / j.mt) * j.nc;
            const int64_t rows = p->m - m0 < j.mc ? p->m - m0 : j.mc;
            const int64_t cols = p->n - n0 < j.nc ? p->n - n0 : j.nc;
            run_unit(&j, g, m0, rows, n0, cols, base, base + abytes, (float *)(base + abytes + bbytes),
                     (uint16_t *)(base + abytes + bbytes + cbytes));
        }
    }
    dg_ws_put(mem);
    dg_free(plans);
    return DG_OK;
}
