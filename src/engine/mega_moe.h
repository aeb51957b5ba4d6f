/*
 * mega_moe.h - one rank's part of a fused mega MoE call (include/deepgemm.h, section
 * mega-moe), after the dispatch barrier: route every rank's tokens, run this rank's experts in
 * waves and write the expert outputs into the source ranks' combine areas; after the combine
 * barrier, sum this rank's own tokens. src/api/mega_moe_fused.c validates and synchronises.
 */
#ifndef DG_ENGINE_MEGA_MOE_H
#define DG_ENGINE_MEGA_MOE_H

#include "comm/symm_buffer.h"

typedef struct dg_mega_moe_call {
    dg_symm_buffer *buf;
    int fp8;                                  /* FP8 tokens (fp8xfp4, fp8xfp8) */
    int nvfp4;                                /* fp4xfp4 (dg_fp4_fp4_mega_moe): the block below */
    int sm90;                                 /* the SM90 FP8 call (dg_fp8_mega_moe): block-128 scales */
    const dg_tensor *x_bf16;                  /* [T_me, H] BF16, the shared experts' input; NULL without */
    const dg_tensor *l1_alphas, *l2_alphas, *a2_scales; /* NULL or FLOAT32 [E/R, 2], [E/R], [E/R] */
    float routed_scaling_factor;
    const dg_tensor *y;
    const dg_tensor *l1, *l1_sf, *l2, *l2_sf; /* this rank's experts, [E/R, ...] */
    const dg_tensor *stats;                   /* NULL or INT32 [E/R] */
    const dg_tensor *shared_l1, *shared_l1_sf, *shared_l2, *shared_l2_sf; /* 2-D; NULL without */
    /* The `_packed` calls: the weights pre-packed instead (l1p / l2p grouped by local expert,
     * the shared ones dense), the tensors above then NULL. */
    const struct dg_packed_b *l1p, *l2p, *shared_l1p, *shared_l2p;
    uint16_t *shared_y;                       /* [T_me, H] BF16 scratch; NULL: no shared expert */
    float clamp;                              /* BF16-rounded, INFINITY for none */
    int situ;                                 /* SiTU instead of SwiGLU (clamp then INFINITY) */
    float situ_beta, situ_linear_beta;
    const int64_t *num_tokens;                /* [R], as posted at the dispatch barrier */
    int64_t *recv;                            /* [E/R] out: pairs each local expert received */
} dg_mega_moe_call;

/* Routing, expert waves and the writes into the combine areas. Fails (DG_ERR_VALUE) on a
 * topk_idx entry outside [-1, E) of any rank, identically on every rank. */
dg_status dg_mega_moe_experts(const dg_mega_moe_call *c);

/* Tests: waves of at most `rows` rows (0: the size chosen from the configuration). */
void dg_mega_moe_set_wave_rows(int64_t rows);

/* After the combine barrier: y (and stats) of this rank, with `threads` threads and scratch of
 * dg_mega_moe_combine_scratch_bytes (allocated before the barrier: this step cannot fail). */
size_t dg_mega_moe_combine_scratch_bytes(const dg_symm_buffer *b, int threads);
void dg_mega_moe_combine(const dg_mega_moe_call *c, void *scratch, int threads);

#endif /* DG_ENGINE_MEGA_MOE_H */
