/* ref_grouped.c - reference grouped GEMMs (see ref_grouped.h for layouts and numerics). */
#include "ref_grouped.h"

/* sum_k (a(ga, i, k) * sfa) * (b(gb, j, k) * sfb) in double, k increasing. A raw value of E4M3,
 * E2M1 or BF16 has at most 8 significant bits and a float32 scale 24, so each dequantized factor
 * is exact in double. */
static double dot(const dg_operand *a, int64_t ga, int64_t i, const dg_operand *b, int64_t gb,
                  int64_t j) {
    double acc = 0.0;
    for (int64_t kk = 0; kk < a->k; ++kk) {
        const double x = (double)dg_operand_raw(a, ga, i, kk) * (double)dg_operand_scale(a, ga, i, kk);
        const double y = (double)dg_operand_raw(b, gb, j, kk) * (double)dg_operand_scale(b, gb, j, kk);
        acc += x * y;
    }
    return acc;
}

/* D[r, :] = A[r, :] . B[g]^T for one row r of the (non-grouped) A. */
static void contiguous_row(const dg_operand *a, const dg_operand *b, const dg_tensor *d, int64_t r,
                           int64_t g) {
    for (int64_t j = 0; j < b->mn; ++j)
        dg_store_float(d, dg_ptr2(d, r, j), (float)dot(a, 0, r, b, g, j));
}

static void zero_row(const dg_tensor *d, int64_t r) {
    for (int64_t j = 0; j < d->shape[1]; ++j)
        dg_store_float(d, dg_ptr2(d, r, j), 0.0f);
}

void dg_ref_m_grouped_contiguous(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                                 const int32_t *layout, int use_psum, int64_t alignment,
                                 int zero_padding) {
    const int64_t m = a->mn;
    if (!use_psum) {
        for (int64_t r = 0; r < m; ++r)
            if (layout[r] >= 0)
                contiguous_row(a, b, d, r, layout[r]);
        return;
    }
    int64_t start = 0;
    for (int64_t g = 0; g < b->groups; ++g) {
        const int64_t end = layout[g];
        for (int64_t r = start; r < end; ++r)
            contiguous_row(a, b, d, r, g);
        const int64_t next = dg_align(end, alignment);
        if (zero_padding)
            for (int64_t r = end; r < next && r < m; ++r)
                zero_row(d, r);
        start = next;
    }
}

void dg_ref_m_grouped_masked(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                             const int32_t *masked_m) {
    for (int64_t g = 0; g < a->groups; ++g)
        for (int64_t r = 0; r < masked_m[g]; ++r)
            for (int64_t j = 0; j < b->mn; ++j)
                dg_store_float(d, dg_ptr3(d, g, r, j), (float)dot(a, g, r, b, g, j));
}

/* A 2-D view [mn, cols] of rows/columns of a k-grouped operand or scale tensor. `origin` is the
 * element offset of the view's first element; s_mn and s_k are its strides. */
static dg_tensor view2(const dg_tensor *t, int64_t origin, int64_t mn, int64_t cols, int64_t s_mn,
                       int64_t s_k) {
    dg_tensor v = *t;
    v.data = (char *)t->data + origin * (int64_t)dg_dtype_size(t->dtype);
    v.ndim = 2;
    v.shape[0] = mn;
    v.shape[1] = cols;
    v.strides[0] = s_mn;
    v.strides[1] = s_k;
    return v;
}

/* Group g's slice of one operand (data, scales) as an [mn, k_len] dg_operand. */
static dg_status group_operand(const dg_k_grouped_problem *p, int64_t g, const dg_tensor *x,
                               const dg_tensor *sf, int64_t mn, const char *name,
                               const char *sf_name, dg_tensor *xv, dg_tensor *sfv, dg_operand *op) {
    static const dg_dtype kTypes[3] = {DG_FLOAT8_E4M3, DG_BFLOAT16, DG_FP4_E2M1X2};
    const int64_t k0 = p->k_start[g], kl = p->k_len[g];
    if (p->fp4) /* pairs: k0 is even (an aligned start); an odd kl ends inside its last pair */
        *xv = view2(x, k0 / 2, mn, (kl + 1) / 2, x->strides[0], 1);
    else if (p->k_major)
        *xv = view2(x, k0 * mn, mn, kl, kl, 1);
    else
        *xv = view2(x, k0 * x->strides[0], mn, kl, x->strides[1], x->strides[0]);
    DG_TRY(dg_operand_init(op, name, xv, 0, kTypes, 3));
    if (!sf)
        return dg_operand_set_scales(op, sf_name, NULL, 1, 1);
    const int64_t blocks = dg_ceil_div(kl, p->gran_k);
    const int64_t cols = sf->dtype == DG_INT32 ? dg_ceil_div(blocks, 4) : blocks;
    if (p->k_major && !p->fp4)
        *sfv = view2(sf, p->sf_start[g] * sf->strides[1], mn, cols, sf->strides[0], sf->strides[1]);
    else
        *sfv = view2(sf, p->sf_start[g] * sf->strides[0], mn, cols, sf->strides[1], sf->strides[0]);
    return dg_operand_set_scales(op, sf_name, sfv, 1, p->gran_k);
}

dg_status dg_k_group_operands(const dg_k_grouped_problem *p, int64_t g, dg_tensor views[4],
                              dg_operand *a, dg_operand *b) {
    DG_CHECK(p->k_len[g] > 0, DG_ERR_INTERNAL, "group %lld is empty", (long long)g);
    DG_TRY(group_operand(p, g, p->a, p->sfa, p->m, "a", "sfa", &views[0], &views[1], a));
    return group_operand(p, g, p->b, p->sfb, p->n, "b", "sfb", &views[2], &views[3], b);
}

void dg_ref_k_grouped(const dg_k_grouped_problem *p) {
    const dg_tensor *d = p->d, *c = p->c;
    for (int64_t g = 0; g < p->groups; ++g) {
        dg_tensor views[4];
        dg_operand a, b;
        const int empty = p->k_len[g] == 0;
        if (!empty && dg_k_group_operands(p, g, views, &a, &b) != DG_OK)
            return; /* unreachable after validation */
        for (int64_t i = 0; i < p->m; ++i)
            for (int64_t j = 0; j < p->n; ++j) {
                double acc = empty ? 0.0 : dot(&a, 0, i, &b, 0, j);
                if (c)
                    acc += (double)dg_load_float(c, dg_ptr3(c, g, i, j));
                dg_store_float(d, dg_ptr3(d, g, i, j), (float)acc);
            }
    }
}
