/* sf_layout.c - DeepGEMM's scale-factor layout functions (SPEC 8).
 *
 * These move and repack scales; they compute nothing, so the "reference" is this file itself.
 * Every function validates all arguments, computes the output descriptor DeepGEMM would
 * return, answers a query (out->data == NULL) with it, and otherwise checks that `out` has
 * exactly that descriptor before writing its elements.
 *
 * Shapes are handled as 3-D [G, MN, SK]; a 2-D tensor is viewed with G = 1.
 */
#include "../core/internal.h"

#include <string.h>

/* TMA wants 16-byte aligned strides: DeepGEMM pads MN to a multiple of 16 bytes. */
#define DG_TMA_ALIGNMENT_BYTES 16

static int64_t tma_aligned(int64_t x, int64_t element_size) {
    return dg_align(x, DG_TMA_ALIGNMENT_BYTES / element_size);
}

dg_status dg_get_tma_aligned_size(int x, int element_size, int *out) {
    dg_api_begin("dg_get_tma_aligned_size");
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    DG_CHECK(element_size > 0 && DG_TMA_ALIGNMENT_BYTES % element_size == 0, DG_ERR_VALUE,
             "argument 'element_size' (%d) must divide %d", element_size, DG_TMA_ALIGNMENT_BYTES);
    DG_CHECK(x >= 0, DG_ERR_VALUE, "argument 'x' (%d) must not be negative", x);
    const int64_t r = tma_aligned(x, element_size);
    DG_CHECK(r <= INT32_MAX, DG_ERR_OVERFLOW, "argument 'x': aligning %d to %d elements overflows int", x,
             DG_TMA_ALIGNMENT_BYTES / element_size);
    *out = (int)r;
    return DG_OK;
}

/* ---- helpers ----------------------------------------------------------------------------- */

/* A 2-D tensor as [1, R, C]. */
static dg_tensor as3d(const dg_tensor *t) {
    if (t->ndim == 3)
        return *t;
    dg_tensor v = *t;
    v.ndim = 3;
    v.shape[2] = t->shape[1];
    v.strides[2] = t->strides[1];
    v.shape[1] = t->shape[0];
    v.strides[1] = t->strides[0];
    v.shape[0] = 1;
    v.strides[0] = 0;
    return v;
}

/* The descriptor of an MN-major, TMA-aligned [(G,) MN, SK] tensor (DeepGEMM's empty_strided).
 * Its size comes from shapes alone, so a result no process could hold is refused here, before
 * any element of sf is read. */
static dg_status mn_major_desc(dg_dtype dtype, int ndim, int64_t g, int64_t mn, int64_t sk, dg_tensor *want) {
    memset(want, 0, sizeof *want);
    want->dtype = dtype;
    want->ndim = ndim;
    DG_CHECK(mn <= INT64_MAX / 2, DG_ERR_OVERFLOW, "argument 'sf': its MN extent %lld is too large", (long long)mn);
    const int64_t aligned = tma_aligned(mn, (int64_t)dg_dtype_size(dtype));
    int64_t batch_stride;
    DG_CHECK(dg_mul_ok(aligned, sk, &batch_stride), DG_ERR_OVERFLOW,
             "argument 'sf': the size of the result overflows");
    const int64_t shape[3] = {g, mn, sk}, strides[3] = {batch_stride, 1, aligned};
    const int off = 3 - ndim;
    for (int i = 0; i < ndim; ++i) {
        want->shape[i] = shape[i + off];
        want->strides[i] = strides[i + off];
    }
    return dg_check_result_span(want, "sf");
}

/* A descriptor with sf's shape and strides (DeepGEMM returns sf itself). */
static dg_tensor same_desc(const dg_tensor *sf) {
    dg_tensor want = *sf;
    want.data = NULL;
    return want;
}

/*
 * Query form: fills *out and sets *query when out->data is NULL. Otherwise out must match `want`
 * (dtype, shape, and strides of every dimension with extent > 1) and not overlap `in`.
 */
static dg_status prepare_out(dg_tensor *out, const dg_tensor *want, const dg_tensor *in, bool *query) {
    *query = out->data == NULL;
    if (*query)
        return DG_OK;
    DG_TRY(dg_check_tensor(out, "out", want->ndim));
    DG_CHECK(out->dtype == want->dtype, DG_ERR_DTYPE, "argument 'out' must be %s, got %s",
             dg_dtype_name(want->dtype), dg_dtype_name(out->dtype));
    for (int i = 0; i < want->ndim; ++i)
        DG_TRY(dg_check_dim(out, "out", i, want->shape[i]));
    for (int i = 0; i < want->ndim; ++i)
        DG_CHECK(want->shape[i] <= 1 || out->strides[i] == want->strides[i], DG_ERR_LAYOUT,
                 "argument 'out': stride %d must be %lld as DeepGEMM lays it out, got %lld (query the "
                 "layout with out->data == NULL)",
                 i, (long long)want->strides[i], (long long)out->strides[i]);
    return dg_check_no_overlap(out, "out", in, "sf", false);
}

/* Writes the query answer, keeping out->data NULL. */
static void answer_query(dg_tensor *out, const dg_tensor *want) {
    *out = *want;
    out->data = NULL;
}

/* Copies every element of src to the same offset in dst (identical shape and strides). */
static void copy_same_layout(const dg_tensor *src, const dg_tensor *dst) {
    const dg_tensor s = as3d(src), d = as3d(dst);
    const size_t es = dg_dtype_size(src->dtype);
    if (s.shape[0] == 0 || s.shape[1] == 0 || s.shape[2] == 0) /* empty: do not walk the others */
        return;
    for (int64_t g = 0; g < s.shape[0]; ++g)
        for (int64_t i = 0; i < s.shape[1]; ++i)
            for (int64_t j = 0; j < s.shape[2]; ++j)
                memcpy(dg_ptr3(&d, g, i, j), dg_ptr3(&s, g, i, j), es);
}

static uint32_t float_bits(const dg_tensor *t, int64_t g, int64_t i, int64_t j) {
    uint32_t u;
    memcpy(&u, dg_ptr3(t, g, i, j), sizeof u);
    return u;
}

/* UE8M0 packing keeps only the exponent: sign and mantissa must be zero (DeepGEMM asserts it). */
static dg_status check_ue8m0_exact(const dg_tensor *sf3, int64_t g, int64_t i, int64_t j) {
    const uint32_t u = float_bits(sf3, g, i, j);
    DG_CHECK((u & 0x807fffffu) == 0, DG_ERR_VALUE,
             "argument 'sf': element [%lld, %lld, %lld] = %g is not a power of two (packing into UE8M0 "
             "keeps only the exponent)",
             (long long)g, (long long)i, (long long)j, (double)dg_load_float(sf3, dg_ptr3(sf3, g, i, j)));
    return DG_OK;
}

/* Every element packing reads is a power of two. Without a psum layout packing reads all of sf,
 * so each distinct element is checked once: a broadcast dimension (stride 0) is one element,
 * however long it is, and the check costs what sf's memory holds, not its logical size. */
static dg_status check_distinct_ue8m0_exact(const dg_tensor *sf3) {
    int64_t n[3];
    for (int d = 0; d < 3; ++d)
        n[d] = sf3->strides[d] == 0 && sf3->shape[d] > 1 ? 1 : sf3->shape[d];
    if (n[0] == 0 || n[1] == 0 || n[2] == 0) /* empty: the loops would still walk the other
                                                  extents (2^34 of them: a hang found by tests/fuzz) */
        return DG_OK;
    for (int64_t g = 0; g < n[0]; ++g)
        for (int64_t i = 0; i < n[1]; ++i)
            for (int64_t j = 0; j < n[2]; ++j)
                DG_TRY(check_ue8m0_exact(sf3, g, i, j));
    return DG_OK;
}

/* ---- psum layouts of m-grouped contiguous scales ----------------------------------------- */

static dg_status check_psum_layout(const dg_tensor *psum) {
    DG_TRY(dg_check_tensor_dtype(psum, "psum_layout", 1, DG_INT32));
    DG_TRY(dg_check_contiguous(psum, "psum_layout"));
    DG_CHECK(psum->shape[0] > 0, DG_ERR_SHAPE, "argument 'psum_layout' must not be empty");
    const int32_t *end = psum->data;
    for (int64_t g = 0; g < psum->shape[0]; ++g)
        DG_CHECK(end[g] >= 0 && (g == 0 || end[g] >= end[g - 1]), DG_ERR_VALUE,
                 "argument 'psum_layout': entry %lld (%d) must be >= 0 and >= the previous entry",
                 (long long)g, end[g]);
    return DG_OK;
}

/* Whether row `row` lies inside a group (else it is a gap row of the contiguous layout). */
static bool psum_row_valid(const dg_tensor *psum, int64_t alignment, int64_t row) {
    const int32_t *end = psum->data;
    for (int64_t g = 0; g < psum->shape[0]; ++g) {
        const int64_t start = g == 0 ? 0 : dg_align(end[g - 1], alignment);
        if (row >= start && row < end[g])
            return true;
    }
    return false;
}

/* ---- MN-major TMA-aligned float ----------------------------------------------------------- */

static dg_status check_float_sf(const dg_tensor *sf) {
    DG_TRY(dg_check_tensor(sf, "sf", -1));
    DG_CHECK(sf->ndim == 2 || sf->ndim == 3, DG_ERR_SHAPE, "argument 'sf' must have 2 or 3 dimensions, got %d",
             sf->ndim);
    DG_CHECK(sf->dtype == DG_FLOAT32, DG_ERR_DTYPE, "argument 'sf' must be float32, got %s",
             dg_dtype_name(sf->dtype));
    return DG_OK;
}

/* sf already checked; writes or answers the query. */
static dg_status mn_major_float(const dg_tensor *sf, dg_tensor *out) {
    const dg_tensor s = as3d(sf);
    dg_tensor want;
    DG_TRY(mn_major_desc(DG_FLOAT32, sf->ndim, s.shape[0], s.shape[1], s.shape[2], &want));
    bool query;
    DG_TRY(prepare_out(out, &want, sf, &query));
    if (query) {
        answer_query(out, &want);
        return DG_OK;
    }
    const dg_tensor o = as3d(out);
    if (s.shape[0] == 0 || s.shape[1] == 0 || s.shape[2] == 0) /* empty: do not walk the others */
        return DG_OK;
    for (int64_t g = 0; g < s.shape[0]; ++g)
        for (int64_t i = 0; i < s.shape[1]; ++i)
            for (int64_t j = 0; j < s.shape[2]; ++j)
                *(float *)dg_ptr3(&o, g, i, j) = *(const float *)dg_ptr3(&s, g, i, j);
    return DG_OK;
}

dg_status dg_get_mn_major_tma_aligned_tensor(const dg_tensor *sf, dg_tensor *out) {
    dg_api_begin("dg_get_mn_major_tma_aligned_tensor");
    DG_TRY(check_float_sf(sf));
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    return mn_major_float(sf, out);
}

/* ---- MN-major TMA-aligned packed UE8M0 ---------------------------------------------------- */

/*
 * Packs float sf [G, R, SK] into out [G, mn, ceil(SK/4)]: output row i reads input row
 * i / gran_mn (DeepGEMM broadcasts coarser scales to one per row first). Gap rows of a psum
 * layout read as zero. With out == NULL only checks the values that would be packed.
 */
static dg_status pack_mn_major(const dg_tensor *sf3, int64_t mn, int gran_mn, const dg_tensor *psum,
                               const dg_tensor *out3) {
    const int64_t alignment = dg_get_mk_alignment_for_contiguous_layout();
    const int64_t sk = sf3->shape[2], packed_k = dg_ceil_div(sk, 4);
    if (sf3->shape[0] == 0 || mn == 0 || packed_k == 0) /* nothing read or written; do not walk */
        return DG_OK;                                   /* the other extents (tests/fuzz: a hang) */
    for (int64_t g = 0; g < sf3->shape[0]; ++g)
        for (int64_t i = 0; i < mn; ++i) {
            const bool valid = !psum || psum_row_valid(psum, alignment, i);
            for (int64_t q = 0; q < packed_k; ++q) {
                uint32_t word = 0;
                for (int64_t j = 0; j < 4 && valid && 4 * q + j < sk; ++j) {
                    if (!out3)
                        DG_TRY(check_ue8m0_exact(sf3, g, i / gran_mn, 4 * q + j));
                    word |= ((float_bits(sf3, g, i / gran_mn, 4 * q + j) >> 23) & 0xffu) << (8 * j);
                }
                if (out3)
                    *(uint32_t *)dg_ptr3(out3, g, i, q) = word;
            }
        }
    return DG_OK;
}

/* sf (float, 2-D/3-D) and psum already checked except for their pairing. */
static dg_status packed_ue8m0(const dg_tensor *sf, int64_t mn, int gran_mn, const dg_tensor *psum, dg_tensor *out) {
    const dg_tensor s = as3d(sf);
    if (psum) {
        DG_CHECK(s.shape[0] == 1, DG_ERR_SHAPE, "argument 'sf': a psum layout needs a single batch, got %lld",
                 (long long)s.shape[0]);
        /* DeepGEMM's packing kernel reads a broadcast (gran_mn > 1) copy, which is contiguous. */
        if (gran_mn == 1)
            DG_TRY(dg_check_contiguous(sf, "sf"));
    }
    dg_tensor want;
    DG_TRY(mn_major_desc(DG_INT32, sf->ndim, s.shape[0], mn, dg_ceil_div(s.shape[2], 4), &want));
    bool query;
    DG_TRY(prepare_out(out, &want, sf, &query));
    if (psum && !query)
        DG_TRY(dg_check_no_overlap(out, "out", psum, "psum_layout", false));
    /* With a psum layout only rows inside groups are packed (gap rows may hold anything), so
     * the check walks the rows packing reads; otherwise every distinct element is read. */
    DG_TRY(psum ? pack_mn_major(&s, mn, gran_mn, psum, NULL) : check_distinct_ue8m0_exact(&s));
    if (query) {
        answer_query(out, &want);
        return DG_OK;
    }
    const dg_tensor o = as3d(out);
    return pack_mn_major(&s, mn, gran_mn, psum, &o);
}

dg_status dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(const dg_tensor *sf, const dg_tensor *psum_layout,
                                                          dg_tensor *out) {
    dg_api_begin("dg_get_mn_major_tma_aligned_packed_ue8m0_tensor");
    DG_TRY(check_float_sf(sf));
    if (psum_layout)
        DG_TRY(check_psum_layout(psum_layout));
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    return packed_ue8m0(sf, sf->shape[sf->ndim - 2], 1, psum_layout, out);
}

/* ---- K-grouped packed UE8M0 --------------------------------------------------------------- */

typedef struct k_grouped_plan {
    const int32_t *layout; /* grouped_layout contents: K sizes, or psum end offsets */
    int64_t groups;
    int64_t k_alignment;
    int gran_k;
    bool psum;
} k_grouped_plan;

/* Group g's K size as DeepGEMM's packing kernel derives it from the layout. */
static int64_t plan_group_k(const k_grouped_plan *p, int64_t g) {
    if (!p->psum)
        return p->layout[g];
    const int64_t start = g == 0 ? 0 : dg_align(p->layout[g - 1], p->k_alignment);
    return p->layout[g] - start;
}

/* The input rows group g owns in sf: those of its K aligned up (DeepGEMM's generators cast each
 * group padded to its aligned K; with ks its packer checks sum(ks / gran_k) rows). Only the first
 * ceil(group K / gran_k) of them are packed; with psum the rest are padding. */
static int64_t plan_group_sf_rows(const k_grouped_plan *p, int64_t g) {
    const int64_t k = plan_group_k(p, g);
    return dg_ceil_div(p->psum ? dg_align(k, p->k_alignment) : k, p->gran_k);
}

/*
 * Packed row `row` belongs to the group whose packed rows cover it; within it, packed row r
 * holds the group's scale rows 4r .. 4r+3. Returns false when no group owns the row.
 * *first is the sf row of the row's first byte, *end the group's end row in sf.
 */
static bool plan_locate(const k_grouped_plan *p, int64_t row, int64_t *first, int64_t *end) {
    int64_t sf_rows = 0, packed_rows = 0;
    for (int64_t g = 0; g < p->groups; ++g) {
        const int64_t n = dg_ceil_div(plan_group_k(p, g), p->gran_k);
        const int64_t packed = dg_ceil_div(n, 4);
        if (row < packed_rows + packed) {
            *first = sf_rows + 4 * (row - packed_rows);
            *end = sf_rows + n;
            return true;
        }
        sf_rows += plan_group_sf_rows(p, g);
        packed_rows += packed;
    }
    return false;
}

/* Packs sf [SK, MN] into out [PK, MN]; with out == NULL only checks the values it would read. */
static dg_status pack_k_grouped(const k_grouped_plan *p, const dg_tensor *sf, int64_t packed_k, const dg_tensor *out) {
    const dg_tensor s = as3d(sf);
    const int64_t mn = sf->shape[1];
    if (mn == 0) /* nothing read or written; do not walk the packed rows (tests/fuzz: a hang) */
        return DG_OK;
    for (int64_t r = 0; r < packed_k; ++r) {
        int64_t first = 0, end = 0;
        const bool owned = plan_locate(p, r, &first, &end);
        if (!owned && !out) /* nothing to check; MN may be huge when sf has no rows (tests/fuzz: a hang) */
            continue;
        for (int64_t c = 0; c < mn; ++c) {
            uint32_t word = 0;
            for (int64_t j = 0; owned && j < 4 && first + j < end; ++j) {
                if (!out)
                    DG_TRY(check_ue8m0_exact(&s, 0, first + j, c));
                word |= ((float_bits(&s, 0, first + j, c) >> 23) & 0xffu) << (8 * j);
            }
            if (out)
                *(uint32_t *)dg_ptr2(out, r, c) = word;
        }
    }
    return DG_OK;
}

static dg_status check_k_grouped_args(const dg_tensor *sf, const dg_tensor *layout, const int *ks, int num_ks,
                                      int gran_k, int k_alignment, bool psum) {
    DG_CHECK(gran_k == 32 || gran_k == 128, DG_ERR_VALUE, "argument 'gran_k' must be 32 or 128, got %d", gran_k);
    DG_CHECK(k_alignment > 0 && k_alignment % 32 == 0, DG_ERR_VALUE,
             "argument 'k_alignment' must be a positive multiple of 32, got %d", k_alignment);
    DG_TRY(dg_check_tensor_dtype(sf, "sf", 2, DG_FLOAT32));
    DG_TRY(dg_check_contiguous(sf, "sf"));
    DG_CHECK(sf->shape[1] % 4 == 0, DG_ERR_SHAPE, "argument 'sf': MN (%lld) must be a multiple of 4",
             (long long)sf->shape[1]);
    DG_TRY(dg_check_tensor_dtype(layout, "grouped_layout", 1, DG_INT32));
    DG_TRY(dg_check_contiguous(layout, "grouped_layout"));
    const int64_t groups = layout->shape[0];
    DG_CHECK(groups >= 1 && groups <= 128, DG_ERR_SHAPE,
             "argument 'grouped_layout': the number of groups must be in [1, 128], got %lld", (long long)groups);
    DG_CHECK(num_ks >= 0, DG_ERR_VALUE, "argument 'num_ks' must not be negative, got %d", num_ks);
    DG_CHECK(ks != NULL || num_ks == 0, DG_ERR_NULL_POINTER, "argument 'ks' is NULL but num_ks is %d", num_ks);
    const bool has_ks = ks != NULL && num_ks > 0;
    DG_CHECK(has_ks || psum, DG_ERR_VALUE, "argument 'ks' must be given unless use_psum_layout is set");
    if (has_ks) {
        DG_CHECK(num_ks == groups, DG_ERR_SHAPE, "argument 'ks' has %d entries but grouped_layout has %lld", num_ks,
                 (long long)groups);
        for (int g = 0; g < num_ks; ++g)
            DG_CHECK(ks[g] >= 0, DG_ERR_VALUE, "argument 'ks': entry %d (%d) is negative", g, ks[g]);
    }
    return DG_OK;
}

/* The layout's contents: sizes agree with ks and sf, psum ends leave no negative group. */
static dg_status check_k_grouped_layout(const k_grouped_plan *p, const dg_tensor *sf, const int *ks, bool has_ks) {
    int64_t rows = 0;
    for (int64_t g = 0; g < p->groups; ++g) {
        const int64_t group_k = plan_group_k(p, g);
        if (p->psum)
            DG_CHECK(group_k >= 0, DG_ERR_VALUE,
                     "argument 'grouped_layout': end %lld (%d) lies before the aligned end of the previous group",
                     (long long)g, p->layout[g]);
        else
            DG_CHECK(has_ks && p->layout[g] == ks[g], DG_ERR_VALUE,
                     "argument 'grouped_layout': entry %lld (%d) must equal ks[%lld] (%d)", (long long)g,
                     p->layout[g], (long long)g, has_ks ? ks[g] : -1);
        rows += group_k < 0 ? 0 : plan_group_sf_rows(p, g);
    }
    if (p->psum)
        DG_CHECK(rows <= sf->shape[0], DG_ERR_SHAPE,
                 "argument 'sf' has %lld rows but grouped_layout needs %lld", (long long)sf->shape[0], (long long)rows);
    else
        DG_TRY(dg_check_dim(sf, "sf", 0, rows));
    return DG_OK;
}

dg_status dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
    const dg_tensor *sf, const dg_tensor *grouped_layout, const int *ks, int num_ks, int gran_k,
    int k_alignment, int use_psum_layout, dg_tensor *out) {
    dg_api_begin("dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor");
    const bool psum = use_psum_layout != 0;
    DG_TRY(check_k_grouped_args(sf, grouped_layout, ks, num_ks, gran_k, k_alignment, psum));
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    const bool has_ks = ks != NULL && num_ks > 0;
    const k_grouped_plan plan = {grouped_layout->data, grouped_layout->shape[0], k_alignment, gran_k, psum};
    DG_TRY(check_k_grouped_layout(&plan, sf, ks, has_ks));

    /* DeepGEMM sizes the output from the host copy of the K sizes, else by an upper bound. */
    int64_t packed_k = 0;
    if (has_ks)
        for (int g = 0; g < num_ks; ++g)
            packed_k += dg_ceil_div(ks[g], (int64_t)gran_k * 4);
    else
        packed_k = (sf->shape[0] + 3 * plan.groups) / 4;
    const int64_t shape[2] = {packed_k, sf->shape[1]};
    const dg_tensor want = dg_tensor_make(NULL, DG_INT32, 2, shape);
    DG_TRY(dg_check_result_span(&want, "sf"));
    bool query;
    DG_TRY(prepare_out(out, &want, sf, &query));
    if (!query)
        DG_TRY(dg_check_no_overlap(out, "out", grouped_layout, "grouped_layout", false));
    DG_TRY(pack_k_grouped(&plan, sf, packed_k, NULL));
    if (query) {
        answer_query(out, &want);
        return DG_OK;
    }
    return pack_k_grouped(&plan, sf, packed_k, out);
}

/* ---- transform_sf_into_required_layout ---------------------------------------------------- */

static dg_status resolve_transform_recipe(const int *recipe, int recipe_len, int is_sfa, int *gran_mn, int *gran_k) {
    DG_CHECK(recipe != NULL, DG_ERR_NULL_POINTER, "argument 'recipe' is NULL");
    DG_CHECK(recipe_len == 2 || recipe_len == 3, DG_ERR_VALUE, "argument 'recipe_len' must be 2 or 3, got %d",
             recipe_len);
    if (recipe_len == 3) {
        DG_CHECK(is_sfa == 0 || is_sfa == 1, DG_ERR_VALUE,
                 "argument 'is_sfa' must be 0 or 1 with a 3-entry recipe, got %d", is_sfa);
        *gran_mn = is_sfa ? recipe[0] : recipe[1];
        *gran_k = recipe[2];
    } else {
        DG_CHECK(is_sfa == -1, DG_ERR_VALUE, "argument 'is_sfa' must be -1 (None) with a 2-entry recipe, got %d",
                 is_sfa);
        *gran_mn = recipe[0];
        *gran_k = recipe[1];
    }
    DG_CHECK(*gran_mn > 0 && *gran_k > 0, DG_ERR_VALUE, "argument 'recipe': granularities (%d, %d) must be positive",
             *gran_mn, *gran_k);
    return DG_OK;
}

/* DeepGEMM's check_sf_layout shape part. */
static dg_status check_transform_sf(const dg_tensor *sf, int64_t mn, int64_t k, int gran_mn, int gran_k,
                                    int num_groups) {
    DG_CHECK(mn >= 0 && k >= 0, DG_ERR_VALUE, "arguments 'mn' (%lld) and 'k' (%lld) must not be negative",
             (long long)mn, (long long)k);
    const bool grouped = num_groups > 0;
    DG_TRY(dg_check_tensor(sf, "sf", grouped ? 3 : 2));
    const dg_dtype types[2] = {DG_FLOAT32, DG_INT32};
    DG_TRY(dg_check_dtype_in(sf, "sf", types, 2));
    const int nd = sf->ndim;
    if (grouped)
        DG_TRY(dg_check_dim(sf, "sf", 0, num_groups));
    DG_TRY(dg_check_dim(sf, "sf", nd - 2, dg_ceil_div(mn, gran_mn)));
    DG_TRY(dg_check_dim(sf, "sf", nd - 1, dg_ceil_div(k, (int64_t)gran_k * (sf->dtype == DG_FLOAT32 ? 1 : 4))));
    return DG_OK;
}

/* SM90's (128, 128) SFB: contiguous, or contiguous after swapping its last two dimensions. */
static dg_status check_sm90_sfb(const dg_tensor *sf) {
    const int nd = sf->ndim;
    const int64_t r = sf->shape[nd - 2], c = sf->shape[nd - 1];
    const int64_t sr = sf->strides[nd - 2], sc = sf->strides[nd - 1];
    int64_t rc = 0;
    const bool rc_ok = !__builtin_mul_overflow(r, c, &rc); /* an empty sf may have huge r and c */
    if (nd == 3)
        DG_CHECK(rc_ok && sf->strides[0] == rc, DG_ERR_LAYOUT,
                 "argument 'sf': group stride must be %lld x %lld, got %lld", (long long)r, (long long)c,
                 (long long)sf->strides[0]);
    DG_CHECK((sc == 1 && sr == c) || (sc == r && sr == 1), DG_ERR_LAYOUT,
             "argument 'sf' must be contiguous or MN-major contiguous (strides %lld, %lld)", (long long)sr,
             (long long)sc);
    return DG_OK;
}

/* Packed INT32 input: TMA-aligned MN-major already. */
static dg_status check_packed_tma(const dg_tensor *sf, int64_t mn) {
    const int nd = sf->ndim;
    const int64_t aligned = tma_aligned(mn, 4);
    if (nd == 3)
        DG_CHECK(sf->strides[0] == sf->strides[2] * sf->shape[2], DG_ERR_LAYOUT,
                 "argument 'sf': group stride must be %lld, got %lld", (long long)(sf->strides[2] * sf->shape[2]),
                 (long long)sf->strides[0]);
    DG_CHECK(sf->strides[nd - 2] == 1 || mn == 1, DG_ERR_LAYOUT, "argument 'sf' must be MN-major (stride %lld)",
             (long long)sf->strides[nd - 2]);
    DG_CHECK(sf->strides[nd - 1] == aligned, DG_ERR_LAYOUT,
             "argument 'sf': K stride must be the TMA-aligned MN %lld, got %lld", (long long)aligned,
             (long long)sf->strides[nd - 1]);
    return DG_OK;
}

/* Copies sf into out with sf's own layout (DeepGEMM returns sf). */
static dg_status pass_through(const dg_tensor *sf, dg_tensor *out) {
    const dg_tensor want = same_desc(sf);
    bool query;
    DG_TRY(prepare_out(out, &want, sf, &query));
    if (query)
        answer_query(out, &want);
    else
        copy_same_layout(sf, out);
    return DG_OK;
}

dg_status dg_transform_sf_into_required_layout(const dg_tensor *sf, int64_t mn, int64_t k, const int *recipe,
                                               int recipe_len, int num_groups, int is_sfa, int disable_ue8m0_cast,
                                               const dg_tensor *psum_layout, dg_tensor *out) {
    dg_api_begin("dg_transform_sf_into_required_layout");
    int gran_mn = 0, gran_k = 0;
    DG_TRY(resolve_transform_recipe(recipe, recipe_len, is_sfa, &gran_mn, &gran_k));
    DG_TRY(check_transform_sf(sf, mn, k, gran_mn, gran_k, num_groups));
    if (psum_layout)
        DG_TRY(check_psum_layout(psum_layout));
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    const bool is_float = sf->dtype == DG_FLOAT32, disable = disable_ue8m0_cast != 0;

    /* SM90 behaviour (only reached with disable_ue8m0_cast on the CPU). */
    if (is_float && gran_mn == 1 && gran_k == 128 && disable)
        return mn_major_float(sf, out);
    if (is_float && gran_mn == 128 && gran_k == 128 && disable) {
        DG_TRY(check_sm90_sfb(sf));
        return pass_through(sf, out);
    }
    /* SM100 behaviour. */
    if (is_float && (gran_k == 32 || gran_k == 128)) {
        DG_CHECK(!disable, DG_ERR_VALUE,
                 "argument 'disable_ue8m0_cast' is only supported for float32 recipes (1, 128) and (128, 128), "
                 "got (%d, %d)",
                 gran_mn, gran_k);
        return packed_ue8m0(sf, mn, gran_mn, psum_layout, out);
    }
    if (!is_float && gran_mn == 1 && (gran_k == 32 || gran_k == 128)) {
        DG_TRY(check_packed_tma(sf, mn));
        return pass_through(sf, out);
    }
    return dg_fail(DG_ERR_VALUE, "arguments 'sf' and 'recipe': unknown SF transformation for %s scales with "
                   "granularity (%d, %d)%s",
                   dg_dtype_name(sf->dtype), gran_mn, gran_k, disable ? " and disable_ue8m0_cast" : "");
}
