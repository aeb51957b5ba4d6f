/* ref_mega_gate.c - the per-token gate of dg_bf16_mega_gate and its reference backend
 * (see ref_mega_gate.h; semantics in deepgemm.h, "mega-gate"). */
#include "ref_mega_gate.h"
#include "../engine/engine.h" /* DG_ACC_BLOCK: the engine's accumulation order is this reference's */

#include "../core/float_math.h"

#include <math.h>

dg_gate_route dg_gate_route_of(const dg_gate_problem *p, int64_t t) {
    if (p->mask && !p->mask[t])
        return DG_GATE_MASKED;
    if (p->force_random && p->force_random[t])
        return DG_GATE_RANDOM;
    if (p->fix_routing_mask && p->fix_routing_mask[t])
        return DG_GATE_FIXED;
    return DG_GATE_RANKED;
}

float dg_gate_score(dg_gate_scoring scoring, float logit) {
    switch (scoring) {
    case DG_GATE_SIGMOID:
        return dg_sigmoid_f32(logit);
    case DG_GATE_SQRTSOFTPLUS:
        /* NOTES: DeepGEMM takes v itself above 20, where softplus(v) is v in float32 (it is from ~14.6) */
        return sqrtf(dg_softplus_f32(logit));
    default:
        return logit;
    }
}

void dg_gate_score_row_ref(dg_gate_scoring scoring, const float *in, const float *bias, int64_t n, float *out) {
    for (int64_t e = 0; e < n; ++e)
        out[e] = dg_gate_score(scoring, in[e]) + (bias ? bias[e] : 0.0f);
}

void dg_gate_rank_row(const dg_gate_problem *p, int64_t t, const float *logits, float *rank,
                      dg_gate_score_row_fn score_row) {
    const int64_t e_count = p->experts;
    if (!p->bias && !p->image_bias) {
        for (int64_t e = 0; e < e_count; ++e)
            rank[e] = logits[e];
        return;
    }
    const bool image = p->image_token_mask && p->image_token_mask[t];
    score_row(p->scoring, logits, image ? p->image_bias : p->bias, e_count, rank);
}

void dg_ref_gate_topk(const float *rank, int64_t experts, int topk, int *sel) {
    bool taken[DG_GATE_MAX_EXPERTS] = {false};
    for (int j = 0; j < topk; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; ++e) {
            /* `>` keeps the lower index on ties and never takes NaN or -inf */
            if (!taken[e] && rank[e] > -INFINITY && (best < 0 || rank[e] > rank[best]))
                best = e;
        }
        if (best >= 0)
            taken[best] = true;
        sel[j] = best >= 0 ? (int)best : 0;
    }
}

/* The physical expert of logical expert l for token t (the header's spread over replicas). */
static int64_t physical_of(const dg_gate_problem *p, int64_t t, int l) {
    if (!p->to_physical_map)
        return l;
    const uint32_t spread = (uint32_t)p->ep_rank + (uint32_t)t * 23333u;
    const uint32_t replica = spread % (uint32_t)p->logical_count[l];
    return p->to_physical_map[(int64_t)l * p->dup + replica];
}

/* Slots of token t from its K logical routed experts and their scores. */
static void store_routed(const dg_gate_problem *p, int64_t t, const int *sel, const float *score) {
    const int k = p->topk, slots = p->topk + p->shared;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j)
        sum += score[j];
    sum += 1e-20f; /* DeepGEMM's guard against an all-zero top-k */
    int64_t *idx = p->topk_idx + t * slots;
    float *w = p->topk_weights + t * slots;
    for (int j = 0; j < slots; ++j) {
        const int logical = j < k ? sel[j] : (int)p->experts + (j - k);
        idx[j] = physical_of(p, t, logical);
        w[j] = j < k ? score[j] / sum * p->scale : 1.0f;
    }
    if (p->unmapped)
        for (int j = 0; j < k; ++j)
            p->unmapped[t * p->unmapped_stride + j] = sel[j];
}

static void store_masked(const dg_gate_problem *p, int64_t t) {
    const int slots = p->topk + p->shared;
    for (int j = 0; j < slots; ++j) {
        p->topk_idx[t * slots + j] = -1;
        p->topk_weights[t * slots + j] = 0.0f;
    }
    if (p->unmapped)
        for (int j = 0; j < p->topk; ++j)
            p->unmapped[t * p->unmapped_stride + j] = -1;
}

int64_t dg_gate_random_pool(const dg_gate_problem *p) {
    const int64_t logical = p->experts + p->shared;
    if (!p->logical_count)
        return logical;
    int64_t n = 0;
    for (int64_t l = 0; l < logical; ++l)
        n += p->logical_count[l];
    return n;
}

/* A counter-based draw: splitmix64's finalizer over (ep_rank, token, slot, stream). */
static uint64_t random_bits(const dg_gate_problem *p, int64_t t, int slot, int stream) {
    uint64_t z = ((uint64_t)(uint32_t)p->ep_rank << 32) ^ ((uint64_t)t << 6) ^ ((uint64_t)slot << 1) ^
                 (uint64_t)stream;
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* K + S distinct experts of [0, pool): slot i takes the r-th expert not yet taken, r drawn from
 * [0, pool - i) (sequential sampling without replacement). */
static void store_random(const dg_gate_problem *p, int64_t t, int64_t pool) {
    const int slots = p->topk + p->shared;
    int64_t taken[DG_GATE_MAX_SLOTS]; /* ascending */
    int64_t *idx = p->topk_idx + t * slots;
    float *w = p->topk_weights + t * slots;
    for (int i = 0; i < slots; ++i) {
        int64_t v = (int64_t)(random_bits(p, t, i, 0) % (uint64_t)(pool - i));
        int pos = 0;
        while (pos < i && taken[pos] <= v) {
            ++v;
            ++pos;
        }
        for (int q = i; q > pos; --q)
            taken[q] = taken[q - 1];
        taken[pos] = v;
        idx[i] = v;
        /* (0, 1]: 24 random bits plus one, times 2^-24, exact in float32 */
        w[i] = (float)((random_bits(p, t, i, 1) >> 40) + 1) * 0x1p-24f;
    }
    if (p->unmapped)
        for (int j = 0; j < p->topk; ++j)
            p->unmapped[t * p->unmapped_stride + j] = -1;
}

void dg_gate_token(const dg_gate_problem *p, int64_t t, const float *logits, float *rank_scratch,
                   dg_gate_topk_fn topk, dg_gate_score_row_fn score_row) {
    int sel[DG_GATE_MAX_SLOTS];
    float score[DG_GATE_MAX_SLOTS];
    switch (dg_gate_route_of(p, t)) {
    case DG_GATE_MASKED:
        store_masked(p, t);
        return;
    case DG_GATE_RANDOM:
        store_random(p, t, dg_gate_random_pool(p));
        return;
    case DG_GATE_FIXED:
        for (int j = 0; j < p->topk; ++j)
            sel[j] = (int)p->unmapped[t * p->unmapped_stride + j];
        break;
    case DG_GATE_RANKED:
        dg_gate_rank_row(p, t, logits, rank_scratch, score_row);
        topk(rank_scratch, p->experts, p->topk, sel);
        break;
    }
    for (int j = 0; j < p->topk; ++j)
        score[j] = dg_gate_score(p->scoring, logits[sel[j]]);
    store_routed(p, t, sel, score);
}

float dg_ref_gate_logit(const uint16_t *x, const uint16_t *w, int64_t hidden) {
    /* NOTES: the engine's order (engine.h): a float32 chain from 0 per accumulation block of
     * DG_ACC_BLOCK k, the blocks' sums added in order. The product of two BF16 values is exact
     * in float32, so fmaf(a, b, acc) is one rounding of acc + a * b, as in the engine's
     * kernels; pairs run high element first. */
    float total = 0.0f;
    for (int64_t k0 = 0; k0 + 1 < hidden; k0 += DG_ACC_BLOCK) {
        float acc = 0.0f;
        for (int64_t k = k0; k + 1 < hidden && k < k0 + DG_ACC_BLOCK; k += 2) {
            acc = fmaf(dg_bf16_to_float(x[k + 1]), dg_bf16_to_float(w[k + 1]), acc);
            acc = fmaf(dg_bf16_to_float(x[k]), dg_bf16_to_float(w[k]), acc);
        }
        total += acc;
    }
    return 0.0f + total;
}

void dg_ref_mega_gate(const dg_gate_problem *p) {
    float logits[DG_GATE_MAX_EXPERTS], rank[DG_GATE_MAX_EXPERTS];
    for (int64_t t = 0; t < p->tokens; ++t) {
        const dg_gate_route route = dg_gate_route_of(p, t);
        if (route == DG_GATE_RANKED || route == DG_GATE_FIXED)
            for (int64_t e = 0; e < p->experts; ++e)
                logits[e] = dg_ref_gate_logit(p->x + t * p->hidden, p->weight + e * p->hidden, p->hidden);
        dg_gate_token(p, t, logits, rank, dg_ref_gate_topk, dg_gate_score_row_ref);
    }
}
