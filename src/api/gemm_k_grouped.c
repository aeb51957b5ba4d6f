/*
 * gemm_k_grouped.c - k-grouped GEMMs (weight gradients of mixture-of-experts, SPEC 4):
 * D[g] = C[g] + A_g^T B_g with the K axis split into groups. Argument checks follow DeepGEMM's
 * csrc/apis/gemm.hpp (check_k_grouped_args) and csrc/apis/layout.hpp
 * (transform_k_grouped_sf_into_required_layout); everything, including ks and grouped_layout,
 * is checked before D is written. Then the engine (src/engine/grouped.c) runs, or the reference
 * (src/reference/ref_grouped.c) when dg_use_reference() or the engine declines the operands.
 *
 * grouped_layout: int32 [G]. Without use_psum_layout it repeats ks (group g owns the ks[g] rows
 * after the previous groups'); with use_psum_layout (`_tn` only) it holds each group's end row
 * and group g starts at align(end[g-1], k_alignment), ks then being optional (NULL / 0 groups).
 */
#include "core/internal.h"
#include "core/operand.h"
#include "engine/grouped.h"
#include "reference/ref_grouped.h"

typedef enum k_kind { K_FP8_TN, K_FP8_NT, K_BF16_TN, K_FP4_NT } k_kind;

/* Everything a validated call needs; the arrays are owned (dg_free). */
typedef struct k_plan {
    int64_t groups, m, n, sum_k, k_alignment;
    int gran_k;
    bool psum;
    int64_t *k_start, *k_len, *sf_start;
    int64_t sf_rows, packed_rows; /* scale extents the groups need (float, packed UE8M0) */
} k_plan;

static dg_status check_options(const dg_gemm_options *o, k_kind kind, k_plan *p) {
    DG_TRY(dg_check_alpha(o, false));
    DG_CHECK(o->recipe_a[0] == 0 && o->recipe_a[1] == 0 && o->recipe_b[0] == 0 && o->recipe_b[1] == 0,
             DG_ERR_VALUE, "arguments 'recipe_a' and 'recipe_b' are not taken by k-grouped GEMMs; give 'recipe'");
    p->psum = o->use_psum_layout != 0;
    p->gran_k = 1;
    if (kind == K_BF16_TN) {
        DG_CHECK(o->recipe[0] == 0 && o->recipe[1] == 0 && o->recipe[2] == 0, DG_ERR_VALUE,
                 "argument 'recipe' must not be given to BF16 GEMMs");
    } else {
        const bool given = o->recipe[0] || o->recipe[1] || o->recipe[2];
        const int r0 = given ? o->recipe[0] : 1, r1 = given ? o->recipe[1] : 1;
        /* DeepGEMM's recipes: (1, 1, 128) by default, FP4 only (1, 1, 32) */
        p->gran_k = given ? o->recipe[2] : kind == K_FP4_NT ? 32 : 128;
        DG_CHECK(r0 == 1 && r1 == 1, DG_ERR_VALUE,
                 "argument 'recipe' must be (1, 1, gran_k) for k-grouped GEMMs, got (%d, %d, %d)", r0, r1, p->gran_k);
        if (kind == K_FP4_NT)
            DG_CHECK(p->gran_k == 32, DG_ERR_VALUE,
                     "argument 'recipe' must be (1, 1, 32) for the FP4 form, got gran_k %d", p->gran_k);
        else if (kind == K_FP8_NT)
            DG_CHECK(p->gran_k == 128, DG_ERR_VALUE,
                     "argument 'recipe' must be (1, 1, 128) for the _nt form, got gran_k %d", p->gran_k);
        else
            DG_CHECK(p->gran_k == 32 || p->gran_k == 128, DG_ERR_VALUE,
                     "argument 'recipe': gran_k must be 32 or 128, got %d", p->gran_k);
    }
    DG_CHECK(!(p->psum && kind == K_FP8_NT), DG_ERR_VALUE,
             "argument 'use_psum_layout' is not available for the _nt form");
    p->k_alignment = kind == K_FP8_NT ? 128 : dg_get_mk_alignment_for_contiguous_layout();
    DG_CHECK(kind != K_FP4_NT || p->k_alignment % 256 == 0, DG_ERR_VALUE,
             "setting 'mk_alignment_for_contiguous_layout' (%lld) must be a multiple of 256 for the FP4 form "
             "(DeepGEMM's BLOCK_K)",
             (long long)p->k_alignment);
    DG_CHECK(p->k_alignment % 32 == 0, DG_ERR_VALUE,
             "setting 'mk_alignment_for_contiguous_layout' (%lld) must be a multiple of 32 for k-grouped GEMMs",
             (long long)p->k_alignment);
    return DG_OK;
}

/* D (and C) float32 [G, M, N] contiguous; C absent, the very same view as D, or disjoint. */
static dg_status check_dc(const dg_tensor *d, const dg_tensor *c, k_plan *p) {
    DG_TRY(dg_check_tensor_dtype(d, "d", 3, DG_FLOAT32));
    DG_TRY(dg_check_contiguous(d, "d"));
    p->groups = d->shape[0];
    p->m = d->shape[1];
    p->n = d->shape[2];
    if (c) {
        DG_TRY(dg_check_tensor_dtype(c, "c", 3, DG_FLOAT32));
        DG_TRY(dg_check_contiguous(c, "c"));
        for (int i = 0; i < 3; ++i)
            DG_TRY(dg_check_dim(c, "c", i, d->shape[i]));
        DG_TRY(dg_check_no_overlap(d, "d", c, "c", true));
    }
    return DG_OK;
}

/* ks: the (aligned) K of every group; optional (NULL, 0) only with the psum layout. */
static dg_status check_ks(const int *ks, int num_ks, k_plan *p) {
    DG_CHECK(num_ks >= 0, DG_ERR_VALUE, "argument 'num_ks' must be >= 0, got %d", num_ks);
    DG_CHECK(ks != NULL || num_ks == 0, DG_ERR_NULL_POINTER, "argument 'ks' is NULL but num_ks is %d", num_ks);
    if (num_ks == 0) {
        DG_CHECK(p->psum, DG_ERR_VALUE, "argument 'ks' must hold one K per group (%lld) unless use_psum_layout is set",
                 (long long)p->groups);
        return DG_OK;
    }
    DG_CHECK(num_ks == p->groups, DG_ERR_VALUE,
             "argument 'num_ks' (%d) must equal the number of groups of 'd' (%lld)", num_ks,
             (long long)p->groups);
    p->sum_k = 0;
    for (int g = 0; g < num_ks; ++g) {
        DG_CHECK(ks[g] >= 0 && ks[g] % p->k_alignment == 0, DG_ERR_VALUE,
                 "argument 'ks': entry %d (%d) must be a non-negative multiple of the K alignment %lld", g, ks[g],
                 (long long)p->k_alignment);
        p->sum_k += ks[g];
    }
    return DG_OK;
}

/* A and B with their sum_k (taken from a when ks is absent) and MN extents. */
static dg_status check_ab(const dg_tensor *a, const dg_tensor *b, k_kind kind, bool has_ks, k_plan *p) {
    if (kind == K_FP4_NT) {
        /* Packed FP4 [MN, sum_k / 2]: logical K-major [MN, sum_k]. */
        DG_TRY(dg_check_tensor_dtype(a, "a", 2, DG_FP4_E2M1X2));
        DG_TRY(dg_check_tensor_dtype(b, "b", 2, DG_FP4_E2M1X2));
        DG_TRY(dg_check_contiguous(a, "a"));
        DG_TRY(dg_check_contiguous(b, "b"));
        if (!has_ks)
            p->sum_k = 2 * a->shape[1]; /* shape entries are below 2^62 (dg_check_tensor) */
        DG_CHECK(p->sum_k % 2 == 0, DG_ERR_SHAPE, "argument 'ks': sum(ks) (%lld) must be even for packed FP4",
                 (long long)p->sum_k);
        DG_TRY(dg_check_dim(a, "a", 0, p->m));
        DG_TRY(dg_check_dim(a, "a", 1, p->sum_k / 2));
        DG_TRY(dg_check_dim(b, "b", 0, p->n));
        return dg_check_dim(b, "b", 1, p->sum_k / 2);
    }
    const dg_dtype want = kind == K_BF16_TN ? DG_BFLOAT16 : DG_FLOAT8_E4M3;
    if (kind == K_FP8_NT) {
        /* K-major: flat buffers of [M, k_g] (resp. [N, k_g]) blocks; only their sizes matter. */
        int64_t mk, nk;
        DG_CHECK(dg_mul_ok(p->sum_k, p->m, &mk) && dg_mul_ok(p->sum_k, p->n, &nk), DG_ERR_OVERFLOW,
                 "argument 'ks': sum(ks) * M or sum(ks) * N overflows");
        DG_TRY(dg_check_tensor_dtype(a, "a", -1, want));
        DG_TRY(dg_check_tensor_dtype(b, "b", -1, want));
        DG_TRY(dg_check_contiguous(a, "a"));
        DG_TRY(dg_check_contiguous(b, "b"));
        DG_CHECK(dg_tensor_numel(a) == mk, DG_ERR_SHAPE, "argument 'a' must hold sum(ks) * M = %lld elements, has %lld",
                 (long long)mk, (long long)dg_tensor_numel(a));
        DG_CHECK(dg_tensor_numel(b) == nk, DG_ERR_SHAPE, "argument 'b' must hold sum(ks) * N = %lld elements, has %lld",
                 (long long)nk, (long long)dg_tensor_numel(b));
        return DG_OK;
    }
    DG_TRY(dg_check_tensor_dtype(a, "a", 2, want));
    DG_TRY(dg_check_tensor_dtype(b, "b", 2, want));
    DG_TRY(dg_check_contiguous(a, "a"));
    DG_TRY(dg_check_contiguous(b, "b"));
    if (!has_ks)
        p->sum_k = a->shape[0];
    DG_TRY(dg_check_dim(a, "a", 0, p->sum_k));
    DG_TRY(dg_check_dim(a, "a", 1, p->m));
    DG_TRY(dg_check_dim(b, "b", 0, p->sum_k));
    return dg_check_dim(b, "b", 1, p->n);
}

/* Float32 scale rows (blocks of gran_k along K) a group of K extent len owns: those of its K
 * aligned up, as DeepGEMM lays them out (its generators cast each group padded to its aligned K,
 * and its packer checks sum(ks / gran_k) rows). Without psum len is aligned already; with psum
 * the rows past len are never read. Packed UE8M0 rows follow the group's own K instead
 * (packed_rows): DeepGEMM's packer writes, and its kernels read, ceil(len / (4 gran_k)). */
static int64_t sf_blocks(const k_plan *p, int64_t len) {
    return dg_ceil_div(p->psum ? dg_align(len, p->k_alignment) : len, p->gran_k);
}

static int64_t packed_rows(const k_plan *p, int64_t len) { return dg_ceil_div(dg_ceil_div(len, p->gran_k), 4); }

/* Group ranges from grouped_layout (checked against ks) and each group's first scale row. */
static dg_status plan_groups(const int32_t *gl, const int *ks, bool has_ks, k_plan *p) {
    int64_t next = 0, sf = 0, packed = 0;
    for (int64_t g = 0; g < p->groups; ++g) {
        int64_t start = next, len;
        if (!p->psum) {
            DG_CHECK(gl[g] == ks[g], DG_ERR_VALUE,
                     "argument 'grouped_layout': entry %lld (%d) must equal ks[%lld] = %d",
                     (long long)g, (int)gl[g], (long long)g, ks[g]);
            len = ks[g];
            next = start + len;
        } else {
            start = dg_align(next, p->k_alignment);
            DG_CHECK(gl[g] >= start && gl[g] <= p->sum_k, DG_ERR_VALUE,
                     "argument 'grouped_layout': entry %lld (%d, a psum end) must lie in [%lld, %lld]: the previous "
                     "end aligned to %lld, and the K extent of 'a'",
                     (long long)g, (int)gl[g], (long long)start, (long long)p->sum_k, (long long)p->k_alignment);
            len = gl[g] - start;
            DG_CHECK(!has_ks || ks[g] == dg_align(len, p->k_alignment), DG_ERR_VALUE,
                     "argument 'ks': entry %lld (%d) must be the group's K (%lld) aligned to %lld", (long long)g, ks[g],
                     (long long)len, (long long)p->k_alignment);
            next = gl[g];
        }
        p->k_start[g] = start;
        p->k_len[g] = len;
        const int64_t blocks = sf_blocks(p, len);
        p->sf_start[g] = sf; /* float rows; use_packed_starts() rewrites it for packed scales */
        sf += blocks;
        packed += packed_rows(p, len);
    }
    p->sf_rows = sf;
    p->packed_rows = packed;
    return DG_OK;
}

/* Per-channel scales: MN-major [rows, MN] float32 (rows exact) or packed int32 (at least the
 * packed rows the groups need, as DeepGEMM); K-major (`_nt`) float32 [MN, rows]. */
static dg_status check_sf(const dg_tensor *sf, const char *name, int64_t mn, k_kind kind, const k_plan *p) {
    DG_TRY(dg_check_tensor(sf, name, 2));
    if (kind == K_FP8_NT) {
        DG_TRY(dg_check_tensor_dtype(sf, name, 2, DG_FLOAT32));
        DG_TRY(dg_check_dim(sf, name, 0, mn));
        return dg_check_dim(sf, name, 1, p->sf_rows);
    }
    const dg_dtype types[2] = {DG_FLOAT32, DG_INT32};
    DG_TRY(dg_check_dtype_in(sf, name, types, 2));
    DG_TRY(dg_check_dim(sf, name, 1, mn));
    if (sf->dtype == DG_FLOAT32)
        return dg_check_dim(sf, name, 0, p->sf_rows);
    DG_CHECK(sf->shape[0] >= p->packed_rows, DG_ERR_SHAPE,
             "argument '%s': packed UE8M0 scales need at least %lld rows, got %lld", name,
             (long long)p->packed_rows, (long long)sf->shape[0]);
    return DG_OK;
}

/* Rewrites sf_start as packed-row starts (each group padded to whole packed rows). */
static void use_packed_starts(k_plan *p) {
    int64_t packed = 0;
    for (int64_t g = 0; g < p->groups; ++g) {
        p->sf_start[g] = packed;
        packed += packed_rows(p, p->k_len[g]);
    }
}

/* Packed FP4 groups of odd K end inside a pair whose other code the kernels read (ref_grouped.h):
 * DeepGEMM requires such padding codes to be zero, and so does this check, rather than let a
 * stray code change D. One nibble per row per odd group. */
static dg_status check_fp4_padding(const dg_tensor *x, const char *name, const k_plan *p) {
    for (int64_t g = 0; g < p->groups; ++g) {
        if (p->k_len[g] % 2 == 0)
            continue;
        const int64_t col = (p->k_start[g] + p->k_len[g]) / 2; /* the pair holding the padding code */
        for (int64_t i = 0; i < x->shape[0]; ++i) {
            const uint8_t byte = *((const uint8_t *)x->data + i * x->strides[0] + col);
            DG_CHECK((byte >> 4) == 0, DG_ERR_VALUE,
                     "argument '%s': row %lld, K %lld: the padding code after group %lld's odd K (%lld) must be "
                     "zero, as DeepGEMM requires",
                     name, (long long)i, (long long)(p->k_start[g] + p->k_len[g]), (long long)g,
                     (long long)p->k_len[g]);
        }
    }
    return DG_OK;
}

static dg_status k_grouped_checked(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                   const dg_tensor *sfb, const dg_tensor *d, const int *ks, int num_ks,
                                   const dg_tensor *gl, const dg_tensor *c, k_kind kind, k_plan *p) {
    DG_TRY(check_dc(d, c, p));
    DG_TRY(dg_check_tensor_dtype(gl, "grouped_layout", 1, DG_INT32));
    DG_TRY(dg_check_contiguous(gl, "grouped_layout"));
    DG_TRY(dg_check_dim(gl, "grouped_layout", 0, p->groups));
    DG_TRY(check_ks(ks, num_ks, p));
    const bool has_ks = num_ks > 0;
    DG_TRY(check_ab(a, b, kind, has_ks, p));
    const size_t count = (size_t)(p->groups > 0 ? p->groups : 1);
    p->k_start = dg_calloc(count, sizeof(int64_t));
    p->k_len = dg_calloc(count, sizeof(int64_t));
    p->sf_start = dg_calloc(count, sizeof(int64_t));
    DG_CHECK(p->k_start && p->k_len && p->sf_start, DG_ERR_ALLOC, "cannot allocate %lld group descriptors",
             (long long)p->groups);
    DG_TRY(plan_groups((const int32_t *)gl->data, ks, has_ks, p));
    if (kind == K_FP4_NT) {
        DG_TRY(check_fp4_padding(a, "a", p));
        DG_TRY(check_fp4_padding(b, "b", p));
    }
    if (kind != K_BF16_TN) {
        DG_TRY(check_sf(sfa, "sfa", p->m, kind, p));
        DG_TRY(check_sf(sfb, "sfb", p->n, kind, p));
        DG_CHECK(sfa->dtype == sfb->dtype, DG_ERR_DTYPE, "arguments 'sfa' (%s) and 'sfb' (%s) must have the same dtype",
                 dg_dtype_name(sfa->dtype), dg_dtype_name(sfb->dtype));
        if (sfa->dtype == DG_INT32)
            use_packed_starts(p);
    }
    const dg_tensor *inputs[5] = {a, sfa, b, sfb, gl};
    const char *names[5] = {"a", "sfa", "b", "sfb", "grouped_layout"};
    for (int i = 0; i < 5; ++i)
        DG_TRY(dg_check_no_overlap(d, "d", inputs[i], names[i], false));
    return DG_OK;
}

static dg_status k_grouped(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b, const dg_tensor *sfb,
                           const dg_tensor *d, const int *ks, int num_ks, const dg_tensor *gl, const dg_tensor *c,
                           const dg_gemm_options *opts, k_kind kind) {
    const dg_gemm_options def = dg_gemm_options_default();
    k_plan p = {0};
    DG_TRY(check_options(opts ? opts : &def, kind, &p));
    dg_status s = k_grouped_checked(a, sfa, b, sfb, d, ks, num_ks, gl, c, kind, &p);
    const dg_k_grouped_problem prob = {
        .a = a, .sfa = sfa, .b = b, .sfb = sfb, .d = d, .c = c,
        .groups = p.groups, .m = p.m, .n = p.n, .k_major = kind == K_FP8_NT || kind == K_FP4_NT,
        .fp4 = kind == K_FP4_NT, .gran_k = p.gran_k,
        .k_start = p.k_start, .k_len = p.k_len, .sf_start = p.sf_start,
    };
    /* Build every group's operand views once before writing: a last line of defence. */
    for (int64_t g = 0; s == DG_OK && g < p.groups; ++g) {
        dg_tensor views[4];
        dg_operand ga, gb;
        if (p.k_len[g] > 0)
            s = dg_k_group_operands(&prob, g, views, &ga, &gb);
    }
    if (s == DG_OK && p.m > 0 && p.n > 0) {
        if (!dg_use_reference()) /* the engine, unless it declines (then nothing was written) */
            s = dg_engine_k_grouped(&prob);
        if (dg_use_reference() || s == DG_ERR_UNSUPPORTED) {
            s = DG_OK;
            DG_PATH_REFERENCE("these operands' scale blocks");
            dg_ref_k_grouped(&prob);
        }
    }
    dg_free(p.k_start);
    dg_free(p.k_len);
    dg_free(p.sf_start);
    return s;
}

/* ---- public entry points -------------------------------------------------------------------- */

dg_status dg_k_grouped_fp8_gemm_tn_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                              const dg_tensor *sfb, const dg_tensor *d, const int *ks, int num_ks,
                                              const dg_tensor *grouped_layout, const dg_tensor *c,
                                              const dg_gemm_options *opts) {
    dg_api_begin("dg_k_grouped_fp8_gemm_tn_contiguous");
    return k_grouped(a, sfa, b, sfb, d, ks, num_ks, grouped_layout, c, opts, K_FP8_TN);
}

dg_status dg_k_grouped_fp8_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                              const dg_tensor *sfb, const dg_tensor *d, const int *ks, int num_ks,
                                              const dg_tensor *grouped_layout, const dg_tensor *c,
                                              const dg_gemm_options *opts) {
    dg_api_begin("dg_k_grouped_fp8_gemm_nt_contiguous");
    return k_grouped(a, sfa, b, sfb, d, ks, num_ks, grouped_layout, c, opts, K_FP8_NT);
}

dg_status dg_k_grouped_bf16_gemm_tn_contiguous(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                                               const int *ks, int num_ks, const dg_tensor *grouped_layout,
                                               const dg_tensor *c, const dg_gemm_options *opts) {
    dg_api_begin("dg_k_grouped_bf16_gemm_tn_contiguous");
    return k_grouped(a, NULL, b, NULL, d, ks, num_ks, grouped_layout, c, opts, K_BF16_TN);
}

dg_status dg_k_grouped_fp4_gemm_nt_contiguous(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                              const dg_tensor *sfb, const dg_tensor *d, const int *ks, int num_ks,
                                              const dg_tensor *grouped_layout, const dg_tensor *c,
                                              const dg_gemm_options *opts) {
    dg_api_begin("dg_k_grouped_fp4_gemm_nt_contiguous");
    return k_grouped(a, sfa, b, sfb, d, ks, num_ks, grouped_layout, c, opts, K_FP4_NT);
}
