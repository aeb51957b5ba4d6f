/*
 * mega_moe.c - entry points of the mega MoE references (SPEC 9): argument checking for all R
 * simulated ranks, then the reference chain (src/reference/ref_mega_moe.c). Layouts, dtypes
 * and numerics are documented in include/deepgemm.h, section mega-moe.
 */
#include "core/internal.h"
#include "core/operand.h"
#include "reference/ref_mega_moe.h"

#include <math.h>
#include <stdio.h>

/* The arguments of either variant; NULL arrays for what the variant does not take. */
typedef struct moe_args {
    int fp8;
    int num_ranks, num_experts;
    const dg_tensor *const *x, *const *x_sf, *const *topk_idx, *const *topk_weights;
    const dg_tensor *const *l1, *const *l1_sf, *const *l2, *const *l2_sf;
    const dg_tensor *const *y, *const *stats;
    float clamp;
} moe_args;

/* Per-rank argument names such as "x[3]" for messages. */
typedef struct name_buf { char s[64]; } name_buf;
static const char *nm(name_buf *b, const char *base, int r) {
    snprintf(b->s, sizeof b->s, "%s[%d]", base, r);
    return b->s;
}

/* The per-rank arrays exist and hold no NULL entries (optional arrays may be NULL as a whole). */
static dg_status check_array(const dg_tensor *const *arr, const char *name, int R, int optional) {
    if (!arr) {
        DG_CHECK(optional, DG_ERR_NULL_POINTER, "argument '%s' (an array of %d tensors) is NULL", name, R);
        return DG_OK;
    }
    for (int r = 0; r < R; ++r)
        DG_CHECK(arr[r] != NULL, DG_ERR_NULL_POINTER, "argument '%s[%d]' is NULL", name, r);
    return DG_OK;
}

/* A weight operand [E/R, rows, cols] of rank r: dtype, K-major FP4 pairs, scales, extents. */
static dg_status check_weight(const moe_args *a, int r, int layer, dg_operand *op, int64_t epr,
                              int64_t rows, int64_t cols) {
    name_buf b, bs;
    const char *name = nm(&b, layer == 1 ? "l1_weights" : "l2_weights", r);
    const dg_dtype want = a->fp8 ? DG_FP4_E2M1X2 : DG_BFLOAT16;
    DG_TRY(dg_operand_init(op, name, (layer == 1 ? a->l1 : a->l2)[r], 1, &want, 1));
    DG_CHECK(!a->fp8 || op->fp4_dim == 2, DG_ERR_LAYOUT,
             "argument '%s': packed FP4 weights must be K-major (unit stride in the last dimension)", name);
    /* epr < 0: rank 0's L1 weights, which define the extents. */
    DG_CHECK(epr < 0 || (op->groups == epr && op->mn == rows && op->k == cols), DG_ERR_SHAPE,
             "argument '%s' must be [%lld, %lld, %lld] (logical), got [%lld, %lld, %lld]", name,
             (long long)epr, (long long)rows, (long long)cols, (long long)op->groups, (long long)op->mn,
             (long long)op->k);
    if (a->fp8)
        DG_TRY(dg_operand_set_scales(op, nm(&bs, layer == 1 ? "l1_weights_sf" : "l2_weights_sf", r),
                                     (layer == 1 ? a->l1_sf : a->l2_sf)[r], 1, DG_MEGA_MOE_ACT_GRAN));
    return DG_OK;
}

/* Rank 0's L1/L2 weights define E/R, I and H. */
static dg_status weight_extents(const moe_args *a, dg_mega_moe_problem *p, dg_operand *l1, dg_operand *l2) {
    DG_TRY(check_weight(a, 0, 1, &l1[0], -1, 0, 0));
    p->experts_per_rank = l1[0].groups;
    p->hidden = l1[0].k;
    DG_CHECK(p->experts_per_rank * a->num_ranks == a->num_experts, DG_ERR_SHAPE,
             "argument 'l1_weights[0]': %lld experts per rank, but num_experts / num_ranks = %d",
             (long long)p->experts_per_rank, a->num_experts / a->num_ranks);
    DG_CHECK(l1[0].mn % 2 == 0 && l1[0].mn > 0, DG_ERR_SHAPE,
             "argument 'l1_weights[0]': dimension 1 (2 * intermediate_hidden) must be even and "
             "positive, got %lld", (long long)l1[0].mn);
    DG_CHECK(p->hidden > 0, DG_ERR_SHAPE, "argument 'l1_weights[0]': hidden must be positive");
    p->inter = l1[0].mn / 2;
    for (int r = 0; r < a->num_ranks; ++r) {
        DG_TRY(check_weight(a, r, 1, &l1[r], p->experts_per_rank, 2 * p->inter, p->hidden));
        DG_TRY(check_weight(a, r, 2, &l2[r], p->experts_per_rank, p->hidden, p->inter));
    }
    return DG_OK;
}

/* x, topk_idx (shape and contents), topk_weights, y and stats of rank r. */
static dg_status check_rank(const moe_args *a, dg_mega_moe_problem *p, int r, dg_operand *x, int64_t *tokens) {
    name_buf b;
    const dg_dtype xt = a->fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16;
    DG_TRY(dg_operand_init(x, nm(&b, "x", r), a->x[r], 0, &xt, 1));
    DG_CHECK(x->k == p->hidden, DG_ERR_SHAPE, "argument 'x[%d]': hidden is %lld, the weights' is %lld",
             r, (long long)x->k, (long long)p->hidden);
    if (a->fp8)
        DG_TRY(dg_operand_set_scales(x, nm(&b, "x_sf", r), a->x_sf[r], 1, DG_MEGA_MOE_ACT_GRAN));
    const int64_t T = tokens[r] = x->mn;

    const dg_dtype it[2] = {DG_INT64, DG_INT32};
    const dg_tensor *idx = a->topk_idx[r];
    DG_TRY(dg_check_tensor(idx, nm(&b, "topk_idx", r), 2));
    DG_TRY(dg_check_dtype_in(idx, b.s, it, 2));
    if (r == 0) {
        p->topk = idx->shape[1];
        DG_CHECK(p->topk > 0, DG_ERR_SHAPE, "argument 'topk_idx[0]': num_topk must be positive");
    }
    DG_TRY(dg_check_dim(idx, b.s, 0, T));
    DG_TRY(dg_check_dim(idx, b.s, 1, p->topk));
    DG_TRY(dg_check_tensor_dtype(a->topk_weights[r], nm(&b, "topk_weights", r), 2, DG_FLOAT32));
    DG_TRY(dg_check_dim(a->topk_weights[r], b.s, 0, T));
    DG_TRY(dg_check_dim(a->topk_weights[r], b.s, 1, p->topk));
    DG_TRY(dg_check_tensor_dtype(a->y[r], nm(&b, "y", r), 2, DG_BFLOAT16));
    DG_TRY(dg_check_dim(a->y[r], b.s, 0, T));
    DG_TRY(dg_check_dim(a->y[r], b.s, 1, p->hidden));
    DG_TRY(dg_check_output(a->y[r], b.s));
    if (a->stats) {
        nm(&b, "cumulative_local_expert_recv_stats", r);
        DG_TRY(dg_check_tensor_dtype(a->stats[r], b.s, 1, DG_INT32));
        DG_TRY(dg_check_dim(a->stats[r], b.s, 0, p->experts_per_rank));
        DG_TRY(dg_check_contiguous(a->stats[r], b.s));
    }
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < p->topk; ++j) {
            const void *q = dg_ptr2(idx, t, j);
            const int64_t e = idx->dtype == DG_INT64 ? *(const int64_t *)q : *(const int32_t *)q;
            DG_CHECK(e >= -1 && e < a->num_experts, DG_ERR_VALUE,
                     "argument 'topk_idx[%d]': entry [%lld, %lld] is %lld, outside [-1, %d)", r,
                     (long long)t, (long long)j, (long long)e, a->num_experts);
        }
    return DG_OK;
}

/* No output (y[r], stats[r]) overlaps any input of any rank or another output. */
static dg_status check_overlaps(const moe_args *a) {
    const int R = a->num_ranks;
    struct { const dg_tensor *const *arr; const char *name; } ins[] = {
        {a->x, "x"}, {a->x_sf, "x_sf"}, {a->topk_idx, "topk_idx"}, {a->topk_weights, "topk_weights"},
        {a->l1, "l1_weights"}, {a->l1_sf, "l1_weights_sf"}, {a->l2, "l2_weights"},
        {a->l2_sf, "l2_weights_sf"}, {a->y, "y"}, {a->stats, "cumulative_local_expert_recv_stats"}};
    const int n_ins = (int)(sizeof ins / sizeof ins[0]), first_out = n_ins - 2;
    name_buf bo, bi;
    for (int o = first_out; o < n_ins; ++o) {
        if (!ins[o].arr)
            continue;
        for (int r = 0; r < R; ++r)
            for (int i = 0; i < n_ins; ++i) {
                if (!ins[i].arr)
                    continue;
                for (int s = 0; s < R; ++s) {
                    if (i == o && s == r)
                        continue;
                    DG_TRY(dg_check_no_overlap(ins[o].arr[r], nm(&bo, ins[o].name, r), ins[i].arr[s],
                                               nm(&bi, ins[i].name, s), false));
                }
            }
    }
    return DG_OK;
}

static dg_status mega_moe(const moe_args *a) {
    const int R = a->num_ranks;
    DG_CHECK(R >= 1, DG_ERR_VALUE, "argument 'num_ranks' must be >= 1, got %d", R);
    DG_CHECK(a->num_experts >= 1 && a->num_experts % R == 0, DG_ERR_VALUE,
             "argument 'num_experts' (%d) must be a positive multiple of num_ranks (%d)", a->num_experts, R);
    DG_CHECK(!isnan(a->clamp) && a->clamp >= 0.0f, DG_ERR_VALUE,
             "argument 'activation_clamp' must be >= 0 (INFINITY for none), got %g", (double)a->clamp);
    DG_TRY(check_array(a->x, "x", R, 0));
    DG_TRY(check_array(a->topk_idx, "topk_idx", R, 0));
    DG_TRY(check_array(a->topk_weights, "topk_weights", R, 0));
    DG_TRY(check_array(a->l1, "l1_weights", R, 0));
    DG_TRY(check_array(a->l2, "l2_weights", R, 0));
    if (a->fp8) {
        DG_TRY(check_array(a->x_sf, "x_sf", R, 0));
        DG_TRY(check_array(a->l1_sf, "l1_weights_sf", R, 0));
        DG_TRY(check_array(a->l2_sf, "l2_weights_sf", R, 0));
    }
    DG_TRY(check_array(a->y, "y", R, 0));
    DG_TRY(check_array(a->stats, "cumulative_local_expert_recv_stats", R, 1));

    dg_mega_moe_problem p = {.num_ranks = R, .num_experts = a->num_experts, .fp8 = a->fp8};
    dg_operand *ops = dg_calloc((size_t)R * 3, sizeof *ops);
    int64_t *tokens = dg_calloc((size_t)R, sizeof *tokens);
    dg_status st = DG_OK;
    if (!ops || !tokens) {
        st = dg_fail(DG_ERR_ALLOC, "cannot allocate %d rank descriptors", R);
        goto done;
    }
    dg_operand *x = ops, *l1 = ops + R, *l2 = ops + 2 * R;
    if ((st = weight_extents(a, &p, l1, l2)) != DG_OK)
        goto done;
    for (int r = 0; r < R && st == DG_OK; ++r)
        st = check_rank(a, &p, r, &x[r], tokens);
    if (st != DG_OK || (st = check_overlaps(a)) != DG_OK)
        goto done;

    /* The reference keeps every o row: sum_r T_r * K * H BF16 values must be addressable. */
    int64_t slots = 0, bytes = 0;
    bool ok = true;
    for (int r = 0; r < R && ok; ++r) {
        int64_t s;
        ok = dg_mul_ok(tokens[r], p.topk, &s) && !__builtin_add_overflow(slots, s, &slots);
    }
    ok = ok && dg_mul_ok(slots, p.hidden, &bytes) && dg_mul_ok(bytes, 2, &bytes) &&
         (uint64_t)bytes < (uint64_t)SIZE_MAX / 2;
    if (!ok) {
        st = dg_fail(DG_ERR_OVERFLOW,
                     "arguments 'x' and 'topk_idx': the dispatched rows (tokens x num_topk x hidden) overflow");
        goto done;
    }

    p.clamp = isinf(a->clamp) ? a->clamp : dg_bf16_to_float(dg_float_to_bf16(a->clamp));
    p.num_tokens = tokens;
    p.x = x;
    p.l1 = l1;
    p.l2 = l2;
    p.topk_idx = a->topk_idx;
    p.topk_weights = a->topk_weights;
    p.y = a->y;
    p.stats = a->stats;
    st = dg_ref_mega_moe(&p);
done:
    dg_free(ops);
    dg_free(tokens);
    return st;
}

dg_status dg_fp8_fp4_mega_moe_reference(
    int num_ranks, int num_experts, const dg_tensor *const *x, const dg_tensor *const *x_sf,
    const dg_tensor *const *topk_idx, const dg_tensor *const *topk_weights,
    const dg_tensor *const *l1_weights, const dg_tensor *const *l1_weights_sf,
    const dg_tensor *const *l2_weights, const dg_tensor *const *l2_weights_sf,
    const dg_tensor *const *y, const dg_tensor *const *cumulative_local_expert_recv_stats,
    float activation_clamp) {
    dg_api_begin("dg_fp8_fp4_mega_moe_reference");
    const moe_args a = {.fp8 = 1, .num_ranks = num_ranks, .num_experts = num_experts, .x = x,
                        .x_sf = x_sf, .topk_idx = topk_idx, .topk_weights = topk_weights,
                        .l1 = l1_weights, .l1_sf = l1_weights_sf, .l2 = l2_weights,
                        .l2_sf = l2_weights_sf, .y = y, .stats = cumulative_local_expert_recv_stats,
                        .clamp = activation_clamp};
    return mega_moe(&a);
}

dg_status dg_bf16_mega_moe_reference(
    int num_ranks, int num_experts, const dg_tensor *const *x, const dg_tensor *const *topk_idx,
    const dg_tensor *const *topk_weights, const dg_tensor *const *l1_weights,
    const dg_tensor *const *l2_weights, const dg_tensor *const *y,
    const dg_tensor *const *cumulative_local_expert_recv_stats, float activation_clamp) {
    dg_api_begin("dg_bf16_mega_moe_reference");
    const moe_args a = {.fp8 = 0, .num_ranks = num_ranks, .num_experts = num_experts, .x = x,
                        .topk_idx = topk_idx, .topk_weights = topk_weights, .l1 = l1_weights,
                        .l2 = l2_weights, .y = y, .stats = cumulative_local_expert_recv_stats,
                        .clamp = activation_clamp};
    return mega_moe(&a);
}
