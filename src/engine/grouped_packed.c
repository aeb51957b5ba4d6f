/*
 * grouped_packed.c - m-grouped GEMMs on grouped weights packed once (contract: grouped.h).
 *
 * Packing: each group [N, K] of B is packed by dg_engine_prepack_b on a 2-D view (so each is
 * exactly the dense packed B of that group, scale folding decided per group as the unpacked
 * grouped call decides it per job), then moved into one block: [G panel areas][G kept-scale
 * areas][the G dg_packed_b headers]. One block is one free (dg_packed_b_free frees pk.data)
 * and one huge-page-advised stream for decoding.
 *
 * GEMM: as grouped.c, groups of <= SMALL_M rows (decoding) are cut into column chunks of
 * CHUNK columns = whole NR panels, and all (group, chunk) items run in one dynamically
 * scheduled loop, each a single-threaded dg_engine_gemm_prepacked on a panel slice of its
 * group's packed B (the engine's region inside is nested, so inactive); larger groups are one
 * call each on all threads. Empty groups make no item. The per-element order never depends on
 * the N tiling or the thread (engine.h), so D is bitwise the unpacked grouped call's.
 */
#include "grouped.h"
#include "prepack.h"

#include "../reference/ref_gemm.h"

#include <stdlib.h>
#include <string.h>

/* rows up to which a group is cut into column chunks: smallm.c's bound for the level */
#define SMALL_M dg_engine_small_m_max(dg_engine_config(dg_get_isa()))
#define CHUNK DG_PACKED_SLICE /* columns per work item: a multiple of every NR (1024) */

static size_t up64(size_t x) { return (x + 63) / 64 * 64; }

static size_t panel_bytes(const dg_packed *pk) {
    return (size_t)(pk->panels * pk->kp * pk->r) * (pk->fmt == DG_PACK_F32 ? 4 : 2);
}

static size_t scale_bytes(const dg_packed *pk) {
    return pk->scales ? (size_t)(pk->panels * pk->nkb * pk->r) * sizeof(float) : 0;
}

/* Group g of b packed alone (dense): exactly what dg_pack_b gives for that [N, K] view. */
static dg_status pack_group(const dg_operand *b, int64_t g, struct dg_packed_b *one) {
    dg_tensor bv, sv;
    dg_operand og;
    DG_CHECK(dg_engine_operand_rows(b, g, 0, b->mn, &bv, &sv, &og), DG_ERR_INTERNAL,
             "group %lld of 'b' cannot be viewed as a 2-D operand", (long long)g);
    memset(one, 0, sizeof *one);
    return dg_engine_prepack_b(&og, one);
}

/* A group's kept FP4 / FP8 codes (prepack.h), on failure paths. */
static void free_kept(struct dg_packed_b *one) {
    dg_free(one->fp4_mem);
    dg_free(one->fp8_mem);
    one->fp4_mem = one->fp8_mem = NULL;
}

dg_status dg_engine_prepack_b_grouped(const dg_operand *b, struct dg_packed_b *out) {
    const int64_t G = b->groups;
    struct dg_packed_b one;
    DG_TRY(pack_group(b, 0, &one)); /* group 0 first: the sizes (equal for every group) */
    /* A group keeps scales or folds them (decided per group); reserve room for keeping. */
    const size_t dstride = up64(panel_bytes(&one.pk));
    size_t sstride = 0;
    if (b->sf)
        sstride = up64((size_t)(one.pk.panels * dg_ceil_div(b->k, dg_engine_k_block(0, b->gran_k, b->k)) * one.pk.r) *
                       sizeof(float)); /* kept scales are per accumulation block (pk.gblk) */
    if (sstride < up64(scale_bytes(&one.pk)))
        sstride = up64(scale_bytes(&one.pk));
    const size_t table = (size_t)G * (dstride + sstride);
    char *block = dg_packed_alloc(table + (size_t)G * sizeof(struct dg_packed_b));
    if (!block) {
        dg_engine_packed_free(&one.pk);
        free_kept(&one);
        return dg_fail(DG_ERR_ALLOC, "out of memory for a packed grouped B of %zu bytes", table);
    }
    struct dg_packed_b *groups = (struct dg_packed_b *)(block + table);
    memset(groups, 0, (size_t)G * sizeof *groups);
    dg_status st = DG_OK;
    for (int64_t g = 0; g < G && st == DG_OK; ++g) {
        if (g > 0)
            st = pack_group(b, g, &one);
        if (st != DG_OK)
            break;
        if (scale_bytes(&one.pk) > sstride || panel_bytes(&one.pk) > dstride) {
            dg_engine_packed_free(&one.pk);
            free_kept(&one);
            st = dg_fail(DG_ERR_INTERNAL, "group %lld of 'b' packed to an unexpected size", (long long)g);
            break;
        }
        struct dg_packed_b *e = &groups[g];
        *e = one;
        e->magic = DG_PACKED_B_MAGIC;
        e->dtype = out->dtype, e->sf_dtype = out->sf_dtype;
        e->gran_b[0] = out->gran_b[0], e->gran_b[1] = out->gran_b[1];
        e->groups = 0, e->group = NULL;
        e->pk.data = block + (size_t)g * dstride;
        memcpy(e->pk.data, one.pk.data, panel_bytes(&one.pk));
        if (one.pk.scales) {
            e->pk.scales = (float *)(block + (size_t)G * dstride + (size_t)g * sstride);
            memcpy(e->pk.scales, one.pk.scales, scale_bytes(&one.pk));
        }
        dg_engine_packed_free(&one.pk);
    }
    if (st != DG_OK) {
        for (int64_t g = 0; g < G; ++g) /* groups packed so far (the others are zeroed) */
            free_kept(&groups[g]);
        free(block);
        return st;
    }
    out->cfg = groups[0].cfg;
    out->fold_b = 1;
    for (int64_t g = 0; g < G; ++g)
        out->fold_b &= groups[g].fold_b;
    out->n = b->mn, out->k = b->k;
    memset(&out->pk, 0, sizeof out->pk); /* no panels of its own: only the block to free */
    out->pk.fmt = groups[0].pk.fmt, out->pk.r = groups[0].pk.r, out->pk.k = b->k, out->pk.kp = groups[0].pk.kp;
    out->pk.data = block;
    out->groups = G;
    out->group = groups;
    return DG_OK;
}

/* ---- the GEMMs ------------------------------------------------------------------------- */

typedef struct pitem {
    dg_tensor av, asf, dv;
    dg_operand a;
    struct dg_packed_b b; /* the group's packed B, or a slice of whole panels of it */
} pitem;

/* Panels [p0, p0 + np) of the dense packed gb: columns [p0 * NR, ...) of its B. */
static void slice_panels(const struct dg_packed_b *gb, int64_t p0, int64_t np, struct dg_packed_b *out) {
    const dg_packed *pk = &gb->pk;
    *out = *gb;
    out->pk.data = (char *)pk->data + (size_t)(p0 * pk->kp * pk->r) * (pk->fmt == DG_PACK_F32 ? 4 : 2);
    if (pk->scales)
        out->pk.scales = pk->scales + p0 * pk->nkb * pk->r;
    out->pk.panels = np;
    if (gb->fp4_codes) { /* the kept FP4 rows of these columns (prepack.h) */
        out->fp4_codes = gb->fp4_codes + p0 * pk->r * ((gb->k + 1) / 2);
        out->fp4_sf = gb->fp4_sf + p0 * pk->r * dg_ceil_div(gb->k, gb->gran_b[1]);
        if (gb->fp4p.codes) { /* p0 * r: a multiple of CHUNK, so of the panels' 16 rows */
            const int64_t panel0 = p0 * pk->r / 16;
            out->fp4p.codes = gb->fp4p.codes + panel0 * dg_ceil_div(gb->k, 32) * DG_E2M1P_STEP_BYTES;
            if (gb->fp4p.sfe) {
                out->fp4p.sfe = gb->fp4p.sfe + panel0 * dg_ceil_div(gb->k, gb->gran_b[1]) * 16;
                out->fp4p.exact = gb->fp4p.exact + panel0;
            }
        }
    }
    if (gb->fp8_codes) { /* the kept FP8 rows; p0 * r is a multiple of CHUNK, so of fp8_gran_mn */
        out->fp8_codes = gb->fp8_codes + p0 * pk->r * gb->k;
        if (gb->fp8p) /* and of the panels' 16 rows */
            out->fp8p = gb->fp8p + p0 * pk->r / 16 * dg_ceil_div(gb->k, 32) * DG_E4M3P_STEP_BYTES;
        if (gb->fp8_sf)
            out->fp8_sf = gb->fp8_sf + p0 * pk->r / gb->fp8_gran_mn * dg_ceil_div(gb->k, gb->gran_b[1]);
    }
    const int64_t cols = gb->n - p0 * pk->r;
    out->pk.mn = out->n = cols < np * pk->r ? cols : np * pk->r;
}

/* Whether dg_engine_gemm_prepacked takes A with this group's B (its scale block checks, made
 * here so that a refusal comes before anything is written): on AMX, K blocks that are not
 * whole k steps run on B's kept codes, where it has them. */
static bool takes(const dg_engine_cfg *cfg, const dg_operand *a, const struct dg_packed_b *gb) {
    const int gblk = dg_engine_k_block(!a->sf || a->sf_packed ? 0 : a->gran_k, gb->pk.scales ? gb->pk.gblk : 0, a->k);
    return gblk % 2 == 0 && (!cfg->amx || gblk % 32 == 0 || gb->fp4_codes || gb->fp8_codes);
}

/*
 * Items for rows [a0, a0 + rows) of A's group ga (0: A is 2-D) times B group gb into D (group
 * dgrp, -1: 2-D; rows from d0): one item, or one per CHUNK columns for small M. With it ==
 * NULL only counts. False when A's rows are no view or the engine would refuse the pair.
 */
static bool make_items(const dg_operand *a, int64_t ga, int64_t a0, int64_t rows, const struct dg_packed_b *b,
                       int64_t gb, const dg_tensor *d, int64_t dgrp, int64_t d0, pitem *it, int64_t *count) {
    const struct dg_packed_b *grp = &b->group[gb];
    const int64_t per = rows <= SMALL_M ? CHUNK / grp->pk.r : grp->pk.panels;
    const int64_t n = dg_ceil_div(grp->pk.panels, per);
    for (int64_t c = 0; it && c < n; ++c) {
        pitem *x = &it[*count + c];
        if (!dg_engine_operand_rows(a, ga, a0, rows, &x->av, &x->asf, &x->a) ||
            !takes(b->cfg, &x->a, grp))
            return false;
        const int64_t p0 = c * per;
        slice_panels(grp, p0, grp->pk.panels - p0 < per ? grp->pk.panels - p0 : per, &x->b);
        x->dv = dg_ref_view2d(d, dgrp, d0, rows, p0 * grp->pk.r, x->b.n);
    }
    *count += n;
    return true;
}

static dg_status run_items(pitem *items, int64_t n) {
    /* Whole groups first (all threads each), then one dynamic loop over the chunks. */
    dg_status st = DG_OK;
    for (int64_t i = 0; i < n && st == DG_OK; ++i)
        if (items[i].a.mn > SMALL_M)
            st = dg_engine_gemm_prepacked(&items[i].a, &items[i].b, &items[i].dv, NULL);
    if (st != DG_OK)
        return st;
    int failed = 0;
    dg_status first = DG_OK;
    const dg_api_context ctx = dg_api_save();
#pragma omp parallel for schedule(dynamic, 1) num_threads(dg_num_threads())
    for (int64_t i = 0; i < n; ++i) {
        int stop;
#pragma omp atomic read
        stop = failed;
        if (stop || items[i].a.mn > SMALL_M)
            continue;
        dg_api_adopt(ctx); /* path lines and compiled_dims as the caller's */
        const dg_status s = dg_engine_gemm_prepacked(&items[i].a, &items[i].b, &items[i].dv, NULL);
        if (s != DG_OK) {
#pragma omp critical
            if (!failed)
                failed = 1, first = s;
        }
    }
    return failed ? dg_fail(first, "a grouped GEMM work item failed (out of memory?)") : DG_OK;
}

static dg_status check_cfg(const struct dg_packed_b *b) {
    const dg_engine_cfg *cfg;
    return dg_engine_prepacked_cfg(b, &cfg);
}

static dg_status refused(pitem *items) {
    dg_free(items);
    return dg_fail(DG_ERR_UNSUPPORTED, "the engine cannot run these scale blocks on the packed 'b' (AMX needs "
                                       "multiples of 32, others even lengths); use the unpacked GEMM");
}

dg_status dg_engine_m_grouped_masked_prepacked(const dg_operand *a, const struct dg_packed_b *b,
                                               const dg_tensor *d, const int32_t *masked_m) {
    DG_TRY(check_cfg(b));
    int64_t n = 0;
    for (int64_t g = 0; g < a->groups; ++g)
        if (masked_m[g] > 0) /* empty groups cost nothing */
            make_items(a, g, 0, masked_m[g], b, g, d, g, 0, NULL, &n);
    pitem *items = dg_malloc((size_t)(n > 0 ? n : 1) * sizeof(pitem));
    DG_CHECK(items != NULL, DG_ERR_ALLOC, "out of memory for %lld grouped GEMM work items", (long long)n);
    int64_t count = 0;
    for (int64_t g = 0; g < a->groups; ++g)
        if (masked_m[g] > 0 && !make_items(a, g, 0, masked_m[g], b, g, d, g, 0, items, &count))
            return refused(items);
    const dg_status st = run_items(items, count);
    dg_free(items);
    return st;
}

/* Items of the contiguous layout (index: runs of one group id; psum: one range per group). */
static bool contiguous_items(const dg_operand *a, const struct dg_packed_b *b, const dg_tensor *d,
                             const int32_t *layout, int use_psum, int64_t alignment, pitem *it, int64_t *count) {
    if (use_psum) {
        for (int64_t g = 0, start = 0; g < b->groups; ++g) {
            const int64_t end = layout[g];
            if (end > start && !make_items(a, 0, start, end - start, b, g, d, -1, start, it, count))
                return false;
            start = dg_align(end, alignment);
        }
        return true;
    }
    for (int64_t r = 0; r < a->mn;) {
        int64_t e = r + 1;
        while (e < a->mn && layout[e] == layout[r])
            ++e;
        if (layout[r] >= 0 && !make_items(a, 0, r, e - r, b, layout[r], d, -1, r, it, count))
            return false;
        r = e;
    }
    return true;
}

dg_status dg_engine_m_grouped_contiguous_prepacked(const dg_operand *a, const struct dg_packed_b *b,
                                                   const dg_tensor *d, const int32_t *layout, int use_psum,
                                                   int64_t alignment, int zero_padding) {
    DG_TRY(check_cfg(b));
    int64_t n = 0, count = 0;
    contiguous_items(a, b, d, layout, use_psum, alignment, NULL, &n);
    pitem *items = dg_malloc((size_t)(n > 0 ? n : 1) * sizeof(pitem));
    DG_CHECK(items != NULL, DG_ERR_ALLOC, "out of memory for %lld grouped GEMM work items", (long long)n);
    if (!contiguous_items(a, b, d, layout, use_psum, alignment, items, &count))
        return refused(items);
    if (use_psum && zero_padding) /* after every check: only allocation failures remain */
        for (int64_t g = 0; g < b->groups; ++g) {
            const int64_t end = layout[g], next = dg_align(end, alignment) < a->mn ? dg_align(end, alignment) : a->mn;
            const size_t bytes = (size_t)d->shape[1] * dg_dtype_size(d->dtype); /* unit stride along N */
            for (int64_t r = end; r < next; ++r)
                memset(dg_ptr2(d, r, 0), 0, bytes); /* +0.0 is all-zero bits in FLOAT32 and BF16 */
        }
    const dg_status st = run_items(items, count);
    dg_free(items);
    return st;
}
