/*
 * grouped.c - m-grouped (contiguous, masked) and k-grouped GEMMs on the dense engine
 * (contract: grouped.h). Each call first turns the groups into a list of dense jobs (2-D views
 * of A rows, B's group, D rows, C) and checks that the engine takes every one; only then does
 * it run them in order, each job using all threads.
 */
#include "grouped.h"

#include "../reference/ref_gemm.h"

#include <stdatomic.h>
#include <string.h>

typedef struct gjob {
    dg_tensor av, asf, bv, bsf, dv, cv;
    dg_operand a, b;
    int has_c;
    /* B's float scales not scanned: its work items run on their being powers of two
     * (dg_engine_gemm_assuming_pow2); refuted: one was not, and the group runs again */
    bool assumed;
    atomic_int refuted;
} gjob;

/* One 2-D view [rows, cols] of dims (b, b + 1) of t starting at element offset off. */
static void view_rows(const dg_tensor *t, int b, int64_t off, int64_t rows, dg_tensor *v) {
    *v = *t;
    v->data = (char *)t->data + off * (int64_t)dg_dtype_size(t->dtype);
    v->ndim = 2;
    v->shape[0] = rows;
    v->shape[1] = t->shape[b + 1];
    v->strides[0] = t->strides[b];
    v->strides[1] = t->strides[b + 1];
    for (int i = 2; i < DG_MAX_DIMS; ++i)
        v->shape[i] = v->strides[i] = 0;
}

bool dg_engine_operand_rows(const dg_operand *op, int64_t g, int64_t row0, int64_t rows, dg_tensor *data_view,
                            dg_tensor *sf_view, dg_operand *out) {
    const int b = op->grouped ? 1 : 0;
    *out = *op;
    out->grouped = 0;
    out->groups = 1;
    out->mn = rows;
    out->fp4_dim = op->fp4_dim < 0 ? -1 : op->fp4_dim - b;
    int64_t r0 = row0, rn = rows;
    if (out->fp4_dim == 0) { /* FP4 pairs run along the rows: whole pairs only */
        if (row0 % 2 != 0 || (rows % 2 != 0 && row0 + rows != op->mn))
            return false;
        r0 = row0 / 2, rn = (rows + 1) / 2;
    }
    const dg_tensor *t = op->data;
    view_rows(t, b, (b ? g * t->strides[0] : 0) + r0 * t->strides[b], rn, data_view);
    out->data = data_view;
    if (!op->sf)
        return true;
    if (row0 % op->gran_mn != 0) /* the view's first row must start a scale block */
        return false;
    const dg_tensor *s = op->sf;
    view_rows(s, b, (b ? g * s->strides[0] : 0) + (row0 / op->gran_mn) * s->strides[b],
              dg_ceil_div(rows, op->gran_mn), sf_view);
    out->sf = sf_view;
    return true;
}

/* Whether job j's FP4 B (float32 scales, never scanned) may run on its scales assumed powers of
 * two: its items take the AMX small-M path, and the engine takes the job either way (so that a
 * refuted group never fails after D was written). */
static bool may_assume(const gjob *j) {
    dg_scale_plan p;
    if (!dg_engine_assume_pow2_applies(&j->a, &j->b, &p))
        return false;
    dg_operand no = j->b;
    no.sf_pow2 = -1;
    return dg_engine_plan_scales(&j->a, &no, &p);
}

/* Job j: rows [a0, a0 + rows) of A's group ga times B's group gb into D rows starting at d0 of
 * group dgrp of D (-1: D is 2-D). False when the engine would decline it. */
static bool make_job(gjob *j, const dg_operand *a, int64_t ga, int64_t a0, int64_t rows, const dg_operand *b,
                     int64_t gb, const dg_tensor *d, int64_t dgrp, int64_t d0) {
    memset(j, 0, sizeof *j);
    if (!dg_engine_operand_rows(a, ga, a0, rows, &j->av, &j->asf, &j->a) ||
        !dg_engine_operand_rows(b, gb, 0, b->mn, &j->bv, &j->bsf, &j->b))
        return false;
    j->dv = dg_ref_view2d(d, dgrp, d0, rows, 0, b->mn);
    dg_scale_plan plan;
    if (may_assume(j)) {
        j->assumed = true;
        return true;
    }
    if (!dg_engine_plan_scales(&j->a, &j->b, &plan))
        return false;
    if (j->b.sf && !j->b.sf_packed) /* the job, its column chunks and the engine call: one scan */
        j->b.sf_pow2 = plan.fold_b ? 1 : -1;
    return true;
}

/* ---- small groups: one parallel loop over (group, column chunk) items -------------------- */

/*
 * Groups the engine runs on its small-M path (decoding) are bound by reading their B once. One
 * engine call per group would put a thread barrier after every group (costly when a core is
 * shared, and uneven groups leave a thread idle at each); instead every such group is cut into
 * chunks of CHUNK columns and all chunks of all groups run in one dynamically scheduled loop,
 * each chunk a single-threaded engine call (the engine's own region is nested, so inactive) on
 * a column slice of B and D. The engine's per-element order does not depend on N tiling, so the
 * bits are those of one call per group. A chunk inherits its group's decision to fold B's
 * scales or not (dg_operand.sf_pow2, set by make_job), so its plan is the group's; a chunk
 * whose plan would still differ keeps its group on the one-call path. FP4 weights' float32
 * scales are not scanned at all where the AMX kernel checks them as it folds them (may_assume):
 * the items run on their being powers of two, and a group where one is not is scanned and run
 * again, all its items, after the loop.
 */
#define CHUNK 1024 /* columns per work item: a multiple of NR and of every scale block */

typedef struct gitem {
    gjob *job;
    dg_tensor bv, bsf, dv;
    dg_operand b;
} gitem;

static bool small_job(const gjob *j) { return dg_engine_small_applies(dg_engine_config(dg_get_isa()), &j->a, &j->b); }

/* Items for job j into it[]; false when a chunk's scale plan differs from the job's. */
static bool chunk_job(gjob *j, gitem *it) {
    dg_scale_plan whole, part;
    if (!j->assumed && !dg_engine_plan_scales(&j->a, &j->b, &whole))
        return false;
    for (int64_t n0 = 0, c = 0; n0 < j->b.mn; n0 += CHUNK, ++c) {
        const int64_t nc = j->b.mn - n0 < CHUNK ? j->b.mn - n0 : CHUNK;
        it[c].job = j;
        if (!dg_engine_operand_rows(&j->b, 0, n0, nc, &it[c].bv, &it[c].bsf, &it[c].b))
            return false;
        if (!j->assumed &&
            (!dg_engine_plan_scales(&j->a, &it[c].b, &part) || part.fold_b != whole.fold_b || part.gblk != whole.gblk))
            return false;
        it[c].dv = dg_ref_view2d(&j->dv, -1, 0, j->a.mn, n0, nc);
    }
    return true;
}

/* The items (redo: only those of refuted groups, whose scales have been scanned since). */
static dg_status run_items(const gitem *items, int64_t n, bool redo) {
    int failed = 0;
    dg_status first = DG_OK;
    const dg_api_context ctx = dg_api_save();
#pragma omp parallel for schedule(dynamic, 1) num_threads(dg_num_threads())
    for (int64_t i = 0; i < n; ++i) {
        int stop;
#pragma omp atomic read
        stop = failed;
        gjob *job = items[i].job;
        const bool refuted = atomic_load_explicit(&job->refuted, memory_order_relaxed) != 0;
        if (stop || (redo && !refuted) || (!redo && job->assumed && refuted))
            continue;
        dg_api_adopt(ctx); /* path lines and compiled_dims as the caller's */
        dg_status st;
        if (!redo && job->assumed) {
            bool no;
            st = dg_engine_gemm_assuming_pow2(&job->a, &items[i].b, &items[i].dv, &no);
            if (st == DG_OK && no)
                atomic_store_explicit(&job->refuted, 1, memory_order_relaxed);
        } else {
            st = dg_engine_gemm(&job->a, &items[i].b, &items[i].dv, NULL);
        }
        if (st != DG_OK) {
#pragma omp critical /* unnamed: a named one exports a global symbol */
            if (!failed)
                failed = 1, first = st;
        }
    }
    /* A worker's message is its own thread's: restate it here. */
    return failed ? dg_fail(first, "a grouped GEMM work item failed (out of memory?)") : DG_OK;
}

/* Jobs without C: small ones through run_items, the others one engine call each. */
static dg_status run_jobs(gjob *jobs, int64_t n) {
    int64_t nitems = 0;
    for (int64_t i = 0; i < n; ++i)
        if (!jobs[i].has_c && small_job(&jobs[i]))
            nitems += dg_ceil_div(jobs[i].b.mn, CHUNK);
    gitem *items = dg_malloc((size_t)(nitems > 0 ? nitems : 1) * sizeof(gitem));
    DG_CHECK(items != NULL, DG_ERR_ALLOC, "out of memory for %lld grouped GEMM work items", (long long)nitems);
    bool *whole = dg_calloc((size_t)(n > 0 ? n : 1), sizeof(bool));
    if (!whole) {
        dg_free(items);
        return dg_fail(DG_ERR_ALLOC, "out of memory for %lld grouped GEMM jobs", (long long)n);
    }
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
        whole[i] = jobs[i].has_c || !small_job(&jobs[i]) || !chunk_job(&jobs[i], items + count);
        if (!whole[i])
            count += dg_ceil_div(jobs[i].b.mn, CHUNK);
    }
    dg_status st = DG_OK;
    for (int64_t i = 0; i < n && st == DG_OK; ++i)
        if (whole[i])
            st = dg_engine_gemm(&jobs[i].a, &jobs[i].b, &jobs[i].dv, jobs[i].has_c ? &jobs[i].cv : NULL);
    if (st == DG_OK)
        st = run_items(items, count, false);
    /* Groups whose scales were not all powers of two: scanned now, then run on that plan. */
    bool redo = false;
    for (int64_t i = 0; i < n && st == DG_OK; ++i)
        if (!whole[i] && jobs[i].assumed && atomic_load(&jobs[i].refuted)) {
            dg_scale_plan plan;
            if (!dg_engine_plan_scales(&jobs[i].a, &jobs[i].b, &plan)) { /* make_job checked both plans */
                st = dg_fail(DG_ERR_INTERNAL, "a grouped GEMM's scale plan changed");
                break;
            }
            jobs[i].b.sf_pow2 = plan.fold_b ? 1 : -1;
            redo = true;
        }
    for (int64_t i = 0; i < count && redo; ++i)
        items[i].b.sf_pow2 = items[i].job->b.sf_pow2;
    if (st == DG_OK && redo)
        st = run_items(items, count, true);
    dg_free(whole);
    dg_free(items);
    return st;
}

static gjob *alloc_jobs(int64_t n) { return dg_malloc((size_t)(n > 0 ? n : 1) * sizeof(gjob)); }

/* ---- m-grouped contiguous --------------------------------------------------------------- */

/* Runs of consecutive rows with one group id (index layout); -1 rows belong to none. With
 * jobs == NULL only counts them. */
static int64_t index_runs(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const int32_t *layout,
                          gjob *jobs, bool *ok) {
    int64_t n = 0;
    for (int64_t r = 0; r < a->mn;) {
        const int32_t g = layout[r];
        int64_t e = r + 1;
        while (e < a->mn && layout[e] == g)
            ++e;
        if (g >= 0) {
            if (jobs && !make_job(&jobs[n], a, 0, r, e - r, b, g, d, -1, r))
                *ok = false;
            ++n;
        }
        r = e;
    }
    return n;
}

static void zero_rows(const dg_tensor *d, int64_t r0, int64_t r1) {
    const size_t bytes = (size_t)d->shape[1] * dg_dtype_size(d->dtype); /* unit stride along N */
    for (int64_t r = r0; r < r1; ++r)
        memset(dg_ptr2(d, r, 0), 0, bytes); /* +0.0 is all-zero bits in FLOAT32 and BF16 */
}

dg_status dg_engine_m_grouped_contiguous(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                                         const int32_t *layout, int use_psum, int64_t alignment, int zero_padding) {
    bool ok = true;
    const int64_t n = use_psum ? b->groups : index_runs(a, b, d, layout, NULL, &ok);
    gjob *jobs = alloc_jobs(n);
    DG_CHECK(jobs != NULL, DG_ERR_ALLOC, "out of memory for %lld grouped GEMM jobs", (long long)n);
    int64_t count = 0;
    if (!use_psum) {
        count = index_runs(a, b, d, layout, jobs, &ok);
    } else {
        for (int64_t g = 0, start = 0; g < b->groups && ok; ++g) {
            const int64_t end = layout[g];
            if (end > start)
                ok = make_job(&jobs[count++], a, 0, start, end - start, b, g, d, -1, start);
            start = dg_align(end, alignment);
        }
    }
    if (!ok) {
        dg_free(jobs);
        return DG_ERR_UNSUPPORTED;
    }
    if (use_psum && zero_padding) /* before the jobs: nothing can fail after a first write but OOM */
        for (int64_t g = 0; g < b->groups; ++g) {
            const int64_t end = layout[g], next = dg_align(end, alignment);
            zero_rows(d, end, next < a->mn ? next : a->mn);
        }
    const dg_status st = run_jobs(jobs, count);
    dg_free(jobs);
    return st;
}

/* ---- m-grouped masked ------------------------------------------------------------------- */

dg_status dg_engine_m_grouped_masked(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                                     const int32_t *masked_m) {
    gjob *jobs = alloc_jobs(a->groups);
    DG_CHECK(jobs != NULL, DG_ERR_ALLOC, "out of memory for %lld grouped GEMM jobs", (long long)a->groups);
    int64_t count = 0;
    bool ok = true;
    for (int64_t g = 0; g < a->groups && ok; ++g)
        if (masked_m[g] > 0) /* empty groups cost nothing: no job, no packing of B */
            ok = make_job(&jobs[count++], a, g, 0, masked_m[g], b, g, d, g, 0);
    const dg_status st = ok ? run_jobs(jobs, count) : DG_ERR_UNSUPPORTED;
    dg_free(jobs);
    return st;
}

/* ---- k-grouped -------------------------------------------------------------------------- */

typedef struct kjob {
    dg_tensor views[4], dv, cv;
    dg_operand a, b;
} kjob;

/* D[g] = C[g] (or 0): an empty group. D and C are contiguous float32 [G, M, N]. */
static void copy_c(const dg_k_grouped_problem *p, int64_t g) {
    const size_t bytes = (size_t)(p->m * p->n) * sizeof(float);
    float *dst = dg_ptr3(p->d, g, 0, 0);
    if (!p->c)
        memset(dst, 0, bytes);
    else if (dg_ptr3(p->c, g, 0, 0) != (void *)dst)
        memcpy(dst, dg_ptr3(p->c, g, 0, 0), bytes);
}

dg_status dg_engine_k_grouped(const dg_k_grouped_problem *p) {
    kjob *jobs = dg_malloc((size_t)(p->groups > 0 ? p->groups : 1) * sizeof(kjob));
    DG_CHECK(jobs != NULL, DG_ERR_ALLOC, "out of memory for %lld grouped GEMM jobs", (long long)p->groups);
    bool ok = true;
    for (int64_t g = 0; g < p->groups && ok; ++g) {
        if (p->k_len[g] == 0)
            continue;
        kjob *j = &jobs[g];
        dg_scale_plan plan;
        ok = dg_k_group_operands(p, g, j->views, &j->a, &j->b) == DG_OK && dg_engine_plan_scales(&j->a, &j->b, &plan);
        if (ok && j->b.sf && !j->b.sf_packed) /* scanned: the engine call need not scan again */
            j->b.sf_pow2 = plan.fold_b ? 1 : -1;
        j->dv = dg_ref_view2d(p->d, g, 0, p->m, 0, p->n);
        if (p->c)
            j->cv = dg_ref_view2d(p->c, g, 0, p->m, 0, p->n);
    }
    dg_status st = ok ? DG_OK : DG_ERR_UNSUPPORTED;
    for (int64_t g = 0; g < p->groups && st == DG_OK; ++g) {
        if (p->k_len[g] == 0)
            copy_c(p, g);
        else
            st = dg_engine_gemm(&jobs[g].a, &jobs[g].b, &jobs[g].dv, p->c ? &jobs[g].cv : NULL);
    }
    dg_free(jobs);
    return st;
}
