/* einsum.c - dg_einsum and dg_fp8_einsum: argument checks, then the engine or the
 * references (SPEC 7).
 *
 * Every expression except "bmk,bnk->mn" is a batched GEMM D[g] = C[g] + A[g] @ B[g]^T on
 * permuted views of the arguments, exactly as DeepGEMM rewrites them; the permutations are
 * tabled below so that shapes, messages and the reference all use the same description.
 *
 * Backends (after all checks; dg_use_reference() selects the references):
 *   - BF16 forms run on dg_engine_bgemm (src/engine/batched.h), one call for all groups:
 *     'bhr,hdr->bhd' / 'bhd,hdr->bhr' are G = H independent GEMMs on strided views (B may be
 *     MN-major or a slice of a wider tensor); threads take whole (head, tile) units, so many
 *     small per-head GEMMs keep both cores busy. 'bmk,bnk->mn' is one GEMM whose K runs over
 *     (b, k): the operands are not one strided [M, b*k] view (b's stride is M*K, not K), so it
 *     is S = b segments of one accumulation per element, in increasing b then k - exactly
 *     the order a single GEMM over K' = b*k would use (each segment padded with zeros to
 *     even k, or to 32 on AMX; float32 chains over blocks of DG_ACC_BLOCK of K' added in
 *     order, engine.h), rounded once: D = round(C + total). No per-b rounding.
 *   - fp8_einsum also runs on dg_engine_bgemm, with 2-D operands per group (E4M3 widened to
 *     BF16 while packing; power-of-two scales folded, others applied per K block exactly as
 *     dg_engine_gemm does); when the engine declines the scales, the reference runs.
 * Every path is deterministic: bits depend on neither the thread count nor the call.
 */
#include "../core/internal.h"
#include "../core/operand.h"
#include "../engine/batched.h"
#include "../reference/ref_einsum.h"

#include <string.h>

/* One einsum form as a batched GEMM: view dim i of A/B/D is argument dim perm_x[i]
 * (views are [G, M, K], [G, N, K], [G, M, N]). */
typedef struct einsum_form {
    const char *expr;
    int perm_a[3], perm_b[3], perm_d[3];
} einsum_form;

static const einsum_form kBf16Forms[] = {
    {"bmk,bnk->mn", {0, 1, 2}, {0, 1, 2}, {0, 1, 2}}, /* special: sums over the batch */
    {"bhr,hdr->bhd", {1, 0, 2}, {0, 1, 2}, {1, 0, 2}},
    {"bhd,hdr->bhr", {1, 0, 2}, {0, 2, 1}, {1, 0, 2}},
};
static const char kBf16List[] = "'bmk,bnk->mn', 'bhr,hdr->bhd', 'bhd,hdr->bhr'";

static const einsum_form kFp8Forms[] = {
    {"bhr,hdr->bhd", {1, 0, 2}, {0, 1, 2}, {1, 0, 2}},
    {"bhd,hdr->bhr", {1, 0, 2}, {0, 2, 1}, {1, 0, 2}},
    {"bhd,bhr->hdr", {1, 2, 0}, {1, 2, 0}, {0, 1, 2}},
};
static const char kFp8List[] = "'bhr,hdr->bhd', 'bhd,hdr->bhr', 'bhd,bhr->hdr'";

static const einsum_form *find_form(const char *expr, const einsum_form *forms, int count) {
    for (int i = 0; i < count; ++i)
        if (strcmp(expr, forms[i].expr) == 0)
            return &forms[i];
    return NULL;
}

static dg_tensor permute3(const dg_tensor *t, const int perm[3]) {
    dg_tensor v = *t;
    for (int i = 0; i < 3; ++i) {
        v.shape[i] = t->shape[perm[i]];
        v.strides[i] = t->strides[perm[i]];
    }
    return v;
}

/* Argument dimension of a view dimension, for messages. */
static dg_status check_view_dim(const dg_tensor *t, const char *name, const int perm[3], int view_dim,
                                int64_t want) {
    return dg_check_dim(t, name, perm[view_dim], want);
}

/* ---- dg_einsum --------------------------------------------------------------------------- */

/* Empty tensors have no layout to speak of (PyTorch calls them contiguous whatever the strides). */
static dg_status check_contiguous_or_empty(const dg_tensor *t, const char *name) {
    return dg_tensor_numel(t) == 0 ? DG_OK : dg_check_contiguous(t, name);
}

static dg_status check_bmk_bnk_mn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                  const dg_tensor *c) {
    DG_TRY(dg_check_tensor(d, "d", 2));
    DG_TRY(dg_check_dim(b, "b", 0, a->shape[0]));
    DG_TRY(dg_check_dim(b, "b", 2, a->shape[2]));
    DG_TRY(dg_check_dim(d, "d", 0, a->shape[1]));
    DG_TRY(dg_check_dim(d, "d", 1, b->shape[1]));
    DG_TRY(check_contiguous_or_empty(a, "a"));
    DG_TRY(check_contiguous_or_empty(b, "b"));
    DG_TRY(check_contiguous_or_empty(d, "d"));
    DG_CHECK(d->dtype == DG_FLOAT32 || c == NULL, DG_ERR_VALUE,
             "argument 'c': a bfloat16 'd' cannot accumulate 'c' (only float32 'd' can)");
    if (c) {
        DG_TRY(dg_check_tensor(c, "c", 2));
        DG_TRY(dg_check_dim(c, "c", 0, d->shape[0]));
        DG_TRY(dg_check_dim(c, "c", 1, d->shape[1]));
        if (!dg_tensors_same_view(c, d))
            DG_TRY(check_contiguous_or_empty(c, "c"));
        DG_TRY(dg_check_no_overlap(d, "d", c, "c", true));
    }
    return DG_OK;
}

/* "bhr,hdr->bhd" and "bhd,hdr->bhr": BF16 batched GEMMs over heads. */
static dg_status check_heads_form(const einsum_form *f, const dg_tensor *a, const dg_tensor *b,
                                  const dg_tensor *d, const dg_tensor *c) {
    DG_CHECK(c == NULL, DG_ERR_VALUE, "argument 'c' is not supported with '%s'", f->expr);
    DG_TRY(dg_check_tensor(d, "d", 3));
    DG_CHECK(d->dtype == DG_BFLOAT16, DG_ERR_DTYPE, "argument 'd' must be bfloat16 for '%s', got %s", f->expr,
             dg_dtype_name(d->dtype));
    const dg_tensor va = permute3(a, f->perm_a), vb = permute3(b, f->perm_b);
    DG_TRY(check_view_dim(b, "b", f->perm_b, 0, va.shape[0]));
    DG_TRY(check_view_dim(b, "b", f->perm_b, 2, va.shape[2]));
    DG_TRY(check_view_dim(d, "d", f->perm_d, 0, va.shape[0]));
    DG_TRY(check_view_dim(d, "d", f->perm_d, 1, va.shape[1]));
    DG_TRY(check_view_dim(d, "d", f->perm_d, 2, vb.shape[1]));
    DG_TRY(dg_check_last_dim_contiguous(a, "a"));
    DG_TRY(dg_check_last_dim_contiguous(b, "b"));
    DG_TRY(dg_check_last_dim_contiguous(d, "d"));
    return DG_OK;
}

/* ---- engine dispatch ----------------------------------------------------------------------- */

/* A BF16 [G, MN, K] view as the batched engine's operand (one segment per group). */
static dg_bview bview_groups(const dg_tensor *v) {
    return (dg_bview){(const uint16_t *)v->data, v->strides[0], 0, v->strides[1], v->strides[2]};
}

/* Group 0 of a [G, M, N] view as a 2-D tensor. */
static dg_tensor slice2(const dg_tensor *v, int64_t g) {
    dg_tensor t = *v;
    t.data = (char *)v->data + (size_t)(g * v->strides[0]) * dg_dtype_size(v->dtype);
    t.ndim = 2;
    t.shape[0] = v->shape[1], t.shape[1] = v->shape[2];
    t.strides[0] = v->strides[1], t.strides[1] = v->strides[2];
    return t;
}

/* "bmk,bnk->mn": one group, S segments (a, b contiguous [S, M/N, K]; d [M, N]). */
static dg_status engine_bmk_bnk_mn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                   const dg_tensor *c) {
    const dg_bgemm p = {1, a->shape[0], a->shape[1], b->shape[1], a->shape[2],
                        {(const uint16_t *)a->data, 0, a->strides[0], a->strides[1], a->strides[2]},
                        {(const uint16_t *)b->data, 0, b->strides[0], b->strides[1], b->strides[2]},
                        d, c, 0, 0, NULL};
    return dg_engine_bgemm(&p);
}

/* The head forms on permuted views: va [H, M, K], vb [H, N, K], vd [H, M, N]. */
static dg_status engine_heads(const dg_tensor *va, const dg_tensor *vb, const dg_tensor *vd) {
    const dg_tensor d0 = slice2(vd, 0);
    const dg_bgemm p = {va->shape[0], 1, va->shape[1], vb->shape[1], va->shape[2],
                        bview_groups(va), bview_groups(vb), &d0, NULL, vd->strides[0], 0, NULL};
    return dg_engine_bgemm(&p);
}

dg_status dg_einsum(const char *expr, const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                    const dg_tensor *c) {
    dg_api_begin("dg_einsum");
    DG_CHECK(expr != NULL, DG_ERR_NULL_POINTER, "argument 'expr' is NULL");
    const einsum_form *f = find_form(expr, kBf16Forms, (int)(sizeof kBf16Forms / sizeof kBf16Forms[0]));
    DG_CHECK(f != NULL, DG_ERR_VALUE, "unsupported einsum expression '%s' (supported: %s)", expr, kBf16List);
    DG_TRY(dg_check_tensor_dtype(a, "a", 3, DG_BFLOAT16));
    DG_TRY(dg_check_tensor_dtype(b, "b", 3, DG_BFLOAT16));
    DG_TRY(dg_check_tensor(d, "d", -1));
    const dg_dtype out_types[2] = {DG_BFLOAT16, DG_FLOAT32};
    DG_TRY(dg_check_dtype_in(d, "d", out_types, 2));
    if (c) {
        DG_TRY(dg_check_tensor(c, "c", -1));
        DG_CHECK(c->dtype == d->dtype, DG_ERR_DTYPE, "argument 'c' must have the dtype of 'd' (%s), got %s",
                 dg_dtype_name(d->dtype), dg_dtype_name(c->dtype));
    }
    const bool sum_batch = f == &kBf16Forms[0];
    DG_TRY(sum_batch ? check_bmk_bnk_mn(a, b, d, c) : check_heads_form(f, a, b, d, c));
    DG_TRY(dg_check_output(d, "d"));
    DG_TRY(dg_check_no_overlap(d, "d", a, "a", false));
    DG_TRY(dg_check_no_overlap(d, "d", b, "b", false));

    if (sum_batch) {
        if (dg_tensor_numel(d) == 0) /* nothing to write; M or N may be huge (tests/fuzz) */
            return DG_OK;
        if (dg_tensor_numel(a) == 0 || dg_tensor_numel(b) == 0) { /* S = 0 or K = 0: d = c, or 0 */
            for (int64_t i = 0; i < d->shape[0]; ++i) /* K may be huge here: never packed (tests/fuzz) */
                for (int64_t j = 0; j < d->shape[1]; ++j)
                    dg_store_float(d, dg_ptr2(d, i, j), c ? dg_load_float(c, dg_ptr2(c, i, j)) : 0.0f);
            return DG_OK;
        }
        if (!dg_use_reference())
            return engine_bmk_bnk_mn(a, b, d, c);
        DG_PATH_REFERENCE("");
        dg_ref_einsum_bmk_bnk_mn(a, b, d, c);
        return DG_OK;
    }
    const dg_tensor va = permute3(a, f->perm_a), vb = permute3(b, f->perm_b), vd = permute3(d, f->perm_d);
    const dg_dtype bf16 = DG_BFLOAT16;
    dg_operand oa, ob;
    DG_TRY(dg_operand_init(&oa, "a", &va, 1, &bf16, 1));
    DG_TRY(dg_operand_init(&ob, "b", &vb, 1, &bf16, 1));
    /* nothing to write: an empty d may still claim ~2^32 heads, which the loops would walk
     * (found by tests/fuzz: a hang) */
    if (dg_tensor_numel(d) == 0)
        return DG_OK;
    if (!dg_use_reference())
        return engine_heads(&va, &vb, &vd);
    DG_PATH_REFERENCE("");
    dg_ref_bmm(&oa, &ob, &vd, NULL);
    return DG_OK;
}

/* ---- dg_fp8_einsum ----------------------------------------------------------------------- */

/* Checks one scale tensor against its operand view [G, MN, K] with granularity (gmn, gk), in
 * the argument's own dimensions so that messages name what the caller passed. */
static dg_status check_einsum_sf(const dg_tensor *sf, const char *name, const int perm[3], const dg_tensor *view,
                                 int gmn, int gk) {
    DG_TRY(dg_check_tensor(sf, name, 3));
    const dg_dtype sf_types[2] = {DG_FLOAT32, DG_INT32};
    DG_TRY(dg_check_dtype_in(sf, name, sf_types, 2));
    const bool packed = sf->dtype == DG_INT32;
    DG_CHECK(!packed || gmn == 1, DG_ERR_VALUE,
             "argument '%s': packed UE8M0 scales need a granularity of 1 along M/N (recipe gives %d)", name, gmn);
    DG_TRY(check_view_dim(sf, name, perm, 0, view->shape[0]));
    DG_TRY(check_view_dim(sf, name, perm, 1, dg_ceil_div(view->shape[1], gmn)));
    DG_TRY(check_view_dim(sf, name, perm, 2, dg_ceil_div(view->shape[2], (int64_t)gk * (packed ? 4 : 1))));
    return DG_OK;
}

static dg_status check_fp8_operand(const dg_tensor *t, const char *name, const dg_tensor *view) {
    DG_TRY(dg_check_tensor_dtype(t, name, 3, DG_FLOAT8_E4M3));
    /* DeepGEMM: the permuted operand is K-major or MN-major. */
    DG_CHECK(view->strides[2] == 1 || view->strides[1] == 1 || view->shape[2] <= 1 || view->shape[1] <= 1,
             DG_ERR_LAYOUT, "argument '%s' needs a unit stride along K or along M/N of the GEMM", name);
    return DG_OK;
}

static dg_status check_fp8_output(const einsum_form *f, const dg_tensor *d, const dg_tensor *c,
                                  const dg_tensor *va, const dg_tensor *vb) {
    DG_TRY(dg_check_tensor(d, "d", 3));
    const dg_dtype out_types[2] = {DG_BFLOAT16, DG_FLOAT32};
    DG_TRY(dg_check_dtype_in(d, "d", out_types, 2));
    DG_TRY(check_view_dim(d, "d", f->perm_d, 0, va->shape[0]));
    DG_TRY(check_view_dim(d, "d", f->perm_d, 1, va->shape[1]));
    DG_TRY(check_view_dim(d, "d", f->perm_d, 2, vb->shape[1]));
    DG_TRY(dg_check_last_dim_contiguous(d, "d"));
    DG_TRY(dg_check_output(d, "d"));
    if (!c)
        return DG_OK;
    DG_TRY(dg_check_tensor(c, "c", 3));
    DG_CHECK(c->dtype == d->dtype, DG_ERR_DTYPE, "argument 'c' must have the dtype of 'd' (%s), got %s",
             dg_dtype_name(d->dtype), dg_dtype_name(c->dtype));
    for (int i = 0; i < 3; ++i)
        DG_TRY(dg_check_dim(c, "c", i, d->shape[i]));
    DG_TRY(dg_check_last_dim_contiguous(c, "c"));
    return dg_check_no_overlap(d, "d", c, "c", true);
}

/* All groups in one dg_engine_bgemm call on 2-D views of each group (data, scales), with
 * the reference when the engine declines (before anything is written). The operands of every
 * group have the same shapes, so the caller's checks hold for all groups. */
static dg_status engine_fp8(const dg_tensor *va, const dg_tensor *vsfa, const dg_tensor *vb, const dg_tensor *vsfb,
                            const int r[3], const dg_tensor *vd, const dg_tensor *vc, const dg_operand *ga,
                            const dg_operand *gb) {
    const int64_t groups = va->shape[0];
    if (groups == 0 || va->shape[1] == 0 || vb->shape[1] == 0)
        return DG_OK;
    const dg_dtype e4m3 = DG_FLOAT8_E4M3;
    dg_tensor *views = dg_malloc((size_t)groups * 4 * sizeof *views);
    dg_operand *ops = dg_malloc((size_t)groups * 2 * sizeof *ops);
    dg_status st = views && ops ? DG_OK : dg_fail(DG_ERR_ALLOC, "out of memory for the fp8 einsum operands");
    for (int64_t g = 0; st == DG_OK && g < groups; ++g) {
        dg_tensor *v = views + 4 * g;
        v[0] = slice2(va, g), v[1] = slice2(vsfa, g), v[2] = slice2(vb, g), v[3] = slice2(vsfb, g);
        st = dg_operand_init(&ops[2 * g], "a", &v[0], 0, &e4m3, 1);
        if (st == DG_OK)
            st = dg_operand_set_scales(&ops[2 * g], "sfa", &v[1], r[0], r[2]);
        if (st == DG_OK)
            st = dg_operand_init(&ops[2 * g + 1], "b", &v[2], 0, &e4m3, 1);
        if (st == DG_OK)
            st = dg_operand_set_scales(&ops[2 * g + 1], "sfb", &v[3], r[1], r[2]);
    }
    if (st == DG_OK) {
        const dg_tensor d0 = slice2(vd, 0), c0 = vc ? slice2(vc, 0) : d0;
        const dg_bgemm p = {groups, 1, va->shape[1], vb->shape[1], va->shape[2], {0}, {0}, &d0, vc ? &c0 : NULL,
                            vd->strides[0], vc ? vc->strides[0] : 0, ops};
        st = dg_engine_bgemm(&p);
        if (st == DG_ERR_UNSUPPORTED) {
            dg_ref_bmm(ga, gb, vd, vc);
            st = DG_OK;
        }
    }
    dg_free(views);
    dg_free(ops);
    return st;
}

dg_status dg_fp8_einsum(const char *expr, const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                        const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c, const int *recipe) {
    dg_api_begin("dg_fp8_einsum");
    DG_CHECK(expr != NULL, DG_ERR_NULL_POINTER, "argument 'expr' is NULL");
    const einsum_form *f = find_form(expr, kFp8Forms, (int)(sizeof kFp8Forms / sizeof kFp8Forms[0]));
    DG_CHECK(f != NULL, DG_ERR_VALUE, "unsupported fp8 einsum expression '%s' (supported: %s)", expr, kFp8List);
    static const int kDefaultRecipe[3] = {1, 128, 128};
    const int *r = recipe ? recipe : kDefaultRecipe;
    DG_CHECK(r[0] > 0 && r[1] > 0 && r[2] > 0, DG_ERR_VALUE, "argument 'recipe' (%d, %d, %d) must be positive",
             r[0], r[1], r[2]);
    DG_TRY(dg_check_tensor(a, "a", 3));
    DG_TRY(dg_check_tensor(b, "b", 3));
    const dg_tensor va = permute3(a, f->perm_a), vb = permute3(b, f->perm_b);
    DG_TRY(check_fp8_operand(a, "a", &va));
    DG_TRY(check_fp8_operand(b, "b", &vb));
    DG_TRY(check_view_dim(b, "b", f->perm_b, 0, va.shape[0]));
    DG_TRY(check_view_dim(b, "b", f->perm_b, 2, va.shape[2]));
    DG_TRY(check_einsum_sf(sfa, "sfa", f->perm_a, &va, r[0], r[2]));
    DG_TRY(check_einsum_sf(sfb, "sfb", f->perm_b, &vb, r[1], r[2]));
    DG_TRY(check_fp8_output(f, d, c, &va, &vb));
    const dg_tensor *inputs[4] = {a, sfa, b, sfb};
    const char *names[4] = {"a", "sfa", "b", "sfb"};
    for (int i = 0; i < 4; ++i)
        DG_TRY(dg_check_no_overlap(d, "d", inputs[i], names[i], false));

    const dg_tensor vsfa = permute3(sfa, f->perm_a), vsfb = permute3(sfb, f->perm_b);
    const dg_tensor vd = permute3(d, f->perm_d);
    const dg_tensor vc = c ? permute3(c, f->perm_d) : vd;
    const dg_dtype e4m3 = DG_FLOAT8_E4M3;
    dg_operand oa, ob;
    DG_TRY(dg_operand_init(&oa, "a", &va, 1, &e4m3, 1));
    DG_TRY(dg_operand_init(&ob, "b", &vb, 1, &e4m3, 1));
    DG_TRY(dg_operand_set_scales(&oa, "sfa", &vsfa, r[0], r[2]));
    DG_TRY(dg_operand_set_scales(&ob, "sfb", &vsfb, r[1], r[2]));
    if (dg_tensor_numel(d) == 0) /* nothing to write (see dg_einsum) */
        return DG_OK;
    if (!dg_use_reference())
        return engine_fp8(&va, &vsfa, &vb, &vsfb, r, &vd, c ? &vc : NULL, &oa, &ob);
    DG_PATH_REFERENCE("");
    dg_ref_bmm(&oa, &ob, &vd, c ? &vc : NULL);
    return DG_OK;
}
