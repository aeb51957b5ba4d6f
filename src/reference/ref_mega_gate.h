/*
 * ref_mega_gate.h - the MoE top-k gate of dg_bf16_mega_gate (see deepgemm.h, "mega-gate"):
 * the problem descriptor both backends take, the per-token pieces that define the outputs
 * (scores, ranking, normalisation, shared slots, physical map, random routing), and the
 * reference backend. The fast backend (engine/mega_gate.c) reuses the per-token pieces with its
 * own logits (the BF16 engine) and its own top-k selection, and must give the same bits.
 */
#ifndef DG_REFERENCE_REF_MEGA_GATE_H
#define DG_REFERENCE_REF_MEGA_GATE_H

#include "../core/internal.h"

#define DG_GATE_MAX_EXPERTS 512 /* DeepGEMM's limit on E */
#define DG_GATE_MAX_SLOTS 32    /* DeepGEMM's limit on K + S (a warp's lanes) */
#define DG_GATE_MAX_TOKENS ((int64_t)1 << 20)

typedef enum dg_gate_scoring {
    DG_GATE_IDENTITY = 0,
    DG_GATE_SIGMOID = 1,
    DG_GATE_SQRTSOFTPLUS = 2
} dg_gate_scoring;

/* One validated call: every tensor contiguous (unmapped: rows of unit stride), dtypes as the
 * header states; absent optional tensors are NULL. */
typedef struct dg_gate_problem {
    const uint16_t *x, *weight;  /* [T, H], [E, H] BF16 */
    int64_t tokens, hidden, experts;
    int topk, shared;            /* K, S (0 unless use_shared_as_routed) */
    float scale;                 /* routed_scaling_factor */
    int ep_rank;
    dg_gate_scoring scoring;
    const uint8_t *mask, *image_token_mask, *fix_routing_mask, *force_random; /* [T] */
    const float *bias, *image_bias;                                          /* [E] */
    const int32_t *to_physical_map, *logical_count; /* [E + S, dup], [E + S] */
    int64_t dup;
    int64_t *unmapped;          /* [T, K], row stride unmapped_stride */
    int64_t unmapped_stride;
    int64_t *topk_idx;          /* [T, K + S] */
    float *topk_weights;        /* [T, K + S] */
} dg_gate_problem;

/* How token t is routed (the header's priority order). */
typedef enum dg_gate_route { DG_GATE_MASKED, DG_GATE_RANDOM, DG_GATE_FIXED, DG_GATE_RANKED } dg_gate_route;
dg_gate_route dg_gate_route_of(const dg_gate_problem *p, int64_t t);

/* score = f(logit) for the problem's scoring function (sigmoid and softplus: core/float_math.h). */
float dg_gate_score(dg_gate_scoring scoring, float logit);

/* A scoring row: out[e] = dg_gate_score(scoring, in[e]) + (bias ? bias[e] : 0) for e < n, in
 * those bits (the fast ones: kernels/gate_kernels.h). */
typedef void (*dg_gate_score_row_fn)(dg_gate_scoring scoring, const float *in, const float *bias, int64_t n,
                                     float *out);

/* The scalar scoring row. */
void dg_gate_score_row_ref(dg_gate_scoring scoring, const float *in, const float *bias, int64_t n, float *out);

/* rank[e] for token t from its logits row [E] (the header's rule: bias or image_bias added to
 * the score when either is given, the raw logit otherwise). */
void dg_gate_rank_row(const dg_gate_problem *p, int64_t t, const float *logits, float *rank,
                      dg_gate_score_row_fn score_row);

/* A selection function: the K experts of largest rank (best first, ties to the lower index,
 * NaN / -inf never chosen, unfilled slots 0) into sel[K]. */
typedef void (*dg_gate_topk_fn)(const float *rank, int64_t experts, int topk, int *sel);

/* The reference selection: K scans for the best remaining expert. */
void dg_ref_gate_topk(const float *rank, int64_t experts, int topk, int *sel);

/* Writes token t's outputs from its logits row. `topk` and `score_row` are used for ranked
 * tokens only. */
void dg_gate_token(const dg_gate_problem *p, int64_t t, const float *logits, float *rank_scratch,
                   dg_gate_topk_fn topk, dg_gate_score_row_fn score_row);

/* The number of experts force_random draws from (E + S, or the sum of logical_count). */
int64_t dg_gate_random_pool(const dg_gate_problem *p);

/* The reference backend: logits by the scalar chain (deepgemm.h, "Numerics"), then
 * dg_gate_token with dg_ref_gate_topk, token by token. */
void dg_ref_mega_gate(const dg_gate_problem *p);

/* One logit as the reference computes it (the BF16 engine's per-element chain). */
float dg_ref_gate_logit(const uint16_t *x, const uint16_t *w, int64_t hidden);

#endif /* DG_REFERENCE_REF_MEGA_GATE_H */
