/*
 * mega_gate.c - dg_bf16_mega_gate and dg_get_bf16_mega_gate_config (deepgemm.h, "mega-gate";
 * DeepGEMM 2.8's csrc/apis/mega_gate.hpp): argument checks in DeepGEMM's order, then the
 * contents that DeepGEMM asserts on the device (logical_count, fixed routing),
 * then the fast path (engine/mega_gate.c) or, when dg_use_reference(), the reference.
 */
#include "../engine/mega_gate.h"

#include <math.h>
#include <string.h>

static dg_status parse_scoring(const char *name, dg_gate_scoring *out) {
    static const struct { const char *name; dg_gate_scoring s; } kNames[] = {
        {"identity", DG_GATE_IDENTITY}, {"sigmoid", DG_GATE_SIGMOID}, {"sqrtsoftplus", DG_GATE_SQRTSOFTPLUS}};
    if (!name) { /* DeepGEMM's default */
        *out = DG_GATE_IDENTITY;
        return DG_OK;
    }
    for (size_t i = 0; i < sizeof kNames / sizeof kNames[0]; ++i)
        if (strcmp(name, kNames[i].name) == 0) {
            *out = kNames[i].s;
            return DG_OK;
        }
    return dg_fail(DG_ERR_VALUE, "argument 'scoring_func' must be 'sigmoid', 'sqrtsoftplus' or 'identity', got '%s'",
                   name);
}

/* An optional 1-D contiguous tensor of `n` elements of `dtype`. */
static dg_status check_vector(const dg_tensor *t, const char *name, int64_t n, dg_dtype dtype) {
    if (!t)
        return DG_OK;
    DG_TRY(dg_check_tensor_dtype(t, name, 1, dtype));
    DG_TRY(dg_check_dim(t, name, 0, n));
    return dg_check_contiguous(t, name);
}

/* A [rows, cols] output of `dtype`; contiguous unless only its rows must be (unmapped_topk_idx). */
static dg_status check_out2(const dg_tensor *t, const char *name, int64_t rows, int64_t cols, dg_dtype dtype,
                            bool rows_only) {
    DG_TRY(dg_check_tensor_dtype(t, name, 2, dtype));
    DG_TRY(dg_check_dim(t, name, 0, rows));
    DG_TRY(dg_check_dim(t, name, 1, cols));
    DG_TRY(rows_only ? dg_check_last_dim_contiguous(t, name) : dg_check_contiguous(t, name));
    return dg_check_output(t, name);
}

typedef struct gate_args {
    const dg_tensor *x, *weight, *mask, *bias, *image_bias, *image_token_mask, *fix_routing_mask,
        *to_physical_map, *logical_count, *unmapped, *force_random, *topk_idx, *topk_weights;
} gate_args;

/* Scalars: DeepGEMM's limits on H, E, K, ep_rank, the scaling factor and the shared experts. */
static dg_status check_scalars(int64_t hidden, int64_t experts, int num_topk, int use_shared, int num_shared,
                               float scale, int ep_rank, int *shared) {
    DG_CHECK(hidden > 0 && hidden % 256 == 0, DG_ERR_SHAPE,
             "argument 'x': hidden (%lld) must be a positive multiple of 256", (long long)hidden);
    DG_CHECK(experts > 0 && experts <= DG_GATE_MAX_EXPERTS && experts % 4 == 0, DG_ERR_SHAPE,
             "argument 'weight': the number of routed experts (%lld) must be in (0, 512] and a multiple of 4",
             (long long)experts);
    DG_CHECK(num_topk > 0 && num_topk <= experts && num_topk <= DG_GATE_MAX_SLOTS, DG_ERR_VALUE,
             "argument 'num_topk' (%d) must be in (0, min(num_routed_experts, 32)]", num_topk);
    DG_CHECK(ep_rank >= 0, DG_ERR_VALUE, "argument 'ep_rank' (%d) must be non-negative", ep_rank);
    DG_CHECK(isfinite(scale), DG_ERR_VALUE, "argument 'routed_scaling_factor' must be finite");
    *shared = 0;
    if (use_shared) {
        DG_CHECK(num_shared == 1 || num_shared == 2, DG_ERR_VALUE,
                 "argument 'num_shared_experts' (%d) must be 1 or 2 with use_shared_as_routed", num_shared);
        DG_CHECK(num_topk % num_shared == 0, DG_ERR_VALUE,
                 "argument 'num_topk' (%d) must be a multiple of num_shared_experts (%d)", num_topk, num_shared);
        DG_CHECK(experts % (num_topk / num_shared) == 0, DG_ERR_VALUE,
                 "argument 'num_shared_experts': num_routed_experts (%lld) must be a multiple of "
                 "num_topk / num_shared_experts (%d)", (long long)experts, num_topk / num_shared);
        *shared = num_shared;
    }
    DG_CHECK(num_topk + *shared <= DG_GATE_MAX_SLOTS, DG_ERR_VALUE,
             "argument 'num_topk': num_topk + shared experts (%d) must be at most 32", num_topk + *shared);
    return DG_OK;
}

/* The optional tensors, in DeepGEMM's order. */
static dg_status check_options(const gate_args *a, int64_t tokens, int64_t experts, int topk, int shared) {
    DG_TRY(check_vector(a->mask, "mask", tokens, DG_UINT8));
    DG_TRY(check_vector(a->bias, "bias", experts, DG_FLOAT32));
    DG_CHECK(!a->image_bias == !a->image_token_mask, DG_ERR_VALUE,
             "arguments 'image_bias' and 'image_token_mask' must be given together");
    DG_TRY(check_vector(a->image_bias, "image_bias", experts, DG_FLOAT32));
    DG_TRY(check_vector(a->image_token_mask, "image_token_mask", tokens, DG_UINT8));
    DG_CHECK(!a->to_physical_map == !a->logical_count, DG_ERR_VALUE,
             "arguments 'to_physical_map' and 'logical_count' must be given together");
    if (a->to_physical_map) {
        const dg_tensor *m = a->to_physical_map;
        DG_TRY(dg_check_tensor_dtype(m, "to_physical_map", 2, DG_INT32));
        DG_TRY(dg_check_dim(m, "to_physical_map", 0, experts + shared));
        DG_CHECK(m->shape[1] > 0, DG_ERR_SHAPE, "argument 'to_physical_map' must have at least one column");
        DG_TRY(dg_check_contiguous(m, "to_physical_map"));
        DG_TRY(check_vector(a->logical_count, "logical_count", experts + shared, DG_INT32));
    }
    if (a->unmapped)
        DG_TRY(check_out2(a->unmapped, "unmapped_topk_idx", tokens, topk, DG_INT64, true));
    if (a->fix_routing_mask) {
        DG_CHECK(a->unmapped != NULL, DG_ERR_VALUE,
                 "argument 'fix_routing_mask' needs 'unmapped_topk_idx' (it holds the fixed experts)");
        DG_TRY(check_vector(a->fix_routing_mask, "fix_routing_mask", tokens, DG_UINT8));
    }
    return check_vector(a->force_random, "force_random", tokens, DG_UINT8);
}

/* Outputs are disjoint from each other and from every input (unmapped_topk_idx is read in place). */
static dg_status check_apart(const gate_args *a) {
    const dg_tensor *in[] = {a->x, a->weight, a->mask, a->bias, a->image_bias, a->image_token_mask,
                             a->fix_routing_mask, a->to_physical_map, a->logical_count, a->force_random};
    static const char *in_names[] = {"x", "weight", "mask", "bias", "image_bias", "image_token_mask",
                                     "fix_routing_mask", "to_physical_map", "logical_count", "force_random"};
    const dg_tensor *out[] = {a->topk_idx, a->topk_weights, a->unmapped};
    static const char *out_names[] = {"topk_idx", "topk_weights", "unmapped_topk_idx"};
    for (int o = 0; o < 3; ++o) {
        for (size_t i = 0; i < sizeof in / sizeof in[0]; ++i)
            DG_TRY(dg_check_no_overlap(out[o], out_names[o], in[i], in_names[i], false));
        for (int q = o + 1; q < 3; ++q)
            DG_TRY(dg_check_no_overlap(out[o], out_names[o], out[q], out_names[q], false));
    }
    return DG_OK;
}

/* What DeepGEMM asserts on the device, checked here before anything is written. */
static dg_status check_contents(const dg_gate_problem *p) {
    if (p->logical_count)
        for (int64_t l = 0; l < p->experts + p->shared; ++l)
            DG_CHECK(p->logical_count[l] >= 1 && p->logical_count[l] <= p->dup, DG_ERR_VALUE,
                     "argument 'logical_count': entry %lld is %d, must be in [1, %lld] (to_physical_map's columns)",
                     (long long)l, p->logical_count[l], (long long)p->dup);
    for (int64_t t = 0; t < p->tokens; ++t) {
        if (dg_gate_route_of(p, t) != DG_GATE_FIXED)
            continue;
        for (int j = 0; j < p->topk; ++j) {
            const int64_t e = p->unmapped[t * p->unmapped_stride + j];
            DG_CHECK(e >= 0 && e < p->experts, DG_ERR_VALUE,
                     "argument 'unmapped_topk_idx': fixed routing of token %lld names expert %lld, "
                     "outside [0, %lld)", (long long)t, (long long)e, (long long)p->experts);
        }
    }
    return DG_OK;
}

dg_status dg_bf16_mega_gate(const dg_tensor *x, const dg_tensor *weight, int num_topk, int use_shared_as_routed,
                            int num_shared_experts, float routed_scaling_factor, int ep_rank,
                            const char *scoring_func, const dg_tensor *mask, const dg_tensor *bias,
                            const dg_tensor *image_bias, const dg_tensor *image_token_mask,
                            const dg_tensor *fix_routing_mask, const dg_tensor *to_physical_map,
                            const dg_tensor *logical_count, const dg_tensor *unmapped_topk_idx,
                            const dg_tensor *force_random, const dg_tensor *topk_idx,
                            const dg_tensor *topk_weights) {
    dg_api_begin("dg_bf16_mega_gate");
    const gate_args a = {x, weight, mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map,
                         logical_count, unmapped_topk_idx, force_random, topk_idx, topk_weights};
    DG_TRY(dg_check_tensor_dtype(x, "x", 2, DG_BFLOAT16));
    DG_TRY(dg_check_tensor_dtype(weight, "weight", 2, DG_BFLOAT16));
    DG_TRY(dg_check_dim(weight, "weight", 1, x->shape[1]));
    DG_TRY(dg_check_contiguous(x, "x"));
    DG_TRY(dg_check_contiguous(weight, "weight"));
    const int64_t tokens = x->shape[0], hidden = x->shape[1], experts = weight->shape[0];
    int shared = 0;
    DG_TRY(check_scalars(hidden, experts, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor,
                         ep_rank, &shared));
    DG_CHECK(tokens <= DG_GATE_MAX_TOKENS, DG_ERR_SHAPE, "argument 'x': %lld tokens, at most 2^20 are supported",
             (long long)tokens);
    dg_gate_scoring scoring = DG_GATE_IDENTITY;
    DG_TRY(parse_scoring(scoring_func, &scoring));
    DG_TRY(check_options(&a, tokens, experts, num_topk, shared));
    DG_TRY(check_out2(topk_idx, "topk_idx", tokens, num_topk + shared, DG_INT64, false));
    DG_TRY(check_out2(topk_weights, "topk_weights", tokens, num_topk + shared, DG_FLOAT32, false));
    DG_TRY(check_apart(&a));
    if (tokens == 0)
        return DG_OK;

    const dg_gate_problem p = {
        .x = x->data, .weight = weight->data, .tokens = tokens, .hidden = hidden, .experts = experts,
        .topk = num_topk, .shared = shared, .scale = routed_scaling_factor, .ep_rank = ep_rank,
        .scoring = scoring,
        .mask = mask ? mask->data : NULL,
        .image_token_mask = image_token_mask ? image_token_mask->data : NULL,
        .fix_routing_mask = fix_routing_mask ? fix_routing_mask->data : NULL,
        .force_random = force_random ? force_random->data : NULL,
        .bias = bias ? bias->data : NULL, .image_bias = image_bias ? image_bias->data : NULL,
        .to_physical_map = to_physical_map ? to_physical_map->data : NULL,
        .logical_count = logical_count ? logical_count->data : NULL,
        .dup = to_physical_map ? to_physical_map->shape[1] : 0,
        .unmapped = unmapped_topk_idx ? unmapped_topk_idx->data : NULL,
        .unmapped_stride = unmapped_topk_idx ? unmapped_topk_idx->strides[0] : 0,
        .topk_idx = topk_idx->data, .topk_weights = topk_weights->data,
    };
    DG_TRY(check_contents(&p));
    if (!dg_use_reference()) {
        DG_PATH("BF16 engine logits, one-pass top-k per token | first: tokens=%lld hidden=%lld experts=%lld topk=%d",
                (long long)tokens, (long long)hidden, (long long)experts, num_topk);
        return dg_engine_mega_gate(&p);
    }
    DG_PATH_REFERENCE("");
    dg_ref_mega_gate(&p);
    return DG_OK;
}

dg_status dg_get_bf16_mega_gate_config(int64_t num_tokens, int64_t hidden, int64_t num_routed_experts,
                                       int64_t num_topk, dg_mega_gate_config *out) {
    dg_api_begin("dg_get_bf16_mega_gate_config");
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    DG_CHECK(num_tokens > 0 && num_tokens <= DG_GATE_MAX_TOKENS, DG_ERR_VALUE,
             "argument 'num_tokens' (%lld) must be in [1, 2^20]", (long long)num_tokens);
    DG_CHECK(hidden > 0 && hidden % 256 == 0, DG_ERR_VALUE,
             "argument 'hidden' (%lld) must be a positive multiple of 256", (long long)hidden);
    DG_CHECK(num_routed_experts > 0 && num_routed_experts <= DG_GATE_MAX_EXPERTS && num_routed_experts % 4 == 0,
             DG_ERR_VALUE, "argument 'num_routed_experts' (%lld) must be in (0, 512] and a multiple of 4",
             (long long)num_routed_experts);
    DG_CHECK(num_topk > 0 && num_topk <= num_routed_experts && num_topk <= DG_GATE_MAX_SLOTS, DG_ERR_VALUE,
             "argument 'num_topk' (%lld) must be in (0, min(num_routed_experts, 32)]", (long long)num_topk);
    const int block = (int)dg_gate_block_tokens(num_tokens), threads = dg_num_threads();
    *out = (dg_mega_gate_config){
        .block_tokens = block, .num_mma_ctas = 1, .num_split_k = 1, .num_expert_groups = 1,
        .num_gate_warpgroups = block < threads ? block : threads, .num_sms = threads,
    };
    return DG_OK;
}
