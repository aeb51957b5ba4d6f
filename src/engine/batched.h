/*
 * batched.h - batched and K-segmented BF16 GEMMs on the engine's microkernels (additive to
 * engine.h; the dense engine itself is unchanged).
 *
 *   for each group g < G:   D_g[M, N] = C_g + sum over segments s < S (increasing) of
 *                                             A_{g,s}[M, K] @ B_{g,s}[N, K]^T
 *
 * Operands are BF16 strided views: element (g, s, i, kk) at
 *   base + g * sg + s * ss + i * si + kk * sk       (elements; any strides, best with si or
 *                                                     sk == 1, which use the ISA packers)
 * Outputs: element (g, i, j) of D at d->data + g * dg + i * d->strides[0] + j (d is the 2-D
 * [M, N] view of group 0 with unit stride along N; C likewise with cg, or NULL, or D itself).
 *
 * Accumulation order (engine.h's contract, extended over segments): the segments' K, each
 * padded to even with zeros, run one after the other as one K' = S * Kp; K' is cut into
 * accumulation blocks of DG_ACC_BLOCK (a block may span two segments), each block a float32
 * chain from 0 over its k pairs. With S = 1 the blocks' sums are added in increasing order to
 * the total, as in engine.h. With S > 1 ('bmk,bnk->mn', whose K' runs to tens of thousands)
 * they are summed one level more: consecutive runs of DG_ACC_GROUP blocks are added in order
 * into a group sum (from the run's first block), and the group sums in order into the total;
 * a single chain of block sums lets rounding error grow with the number of blocks (measured
 * with upstream's S = 129, K = 384, BF16 outputs: about half as many outputs one BF16 step
 * from the exactly rounded result). Then D = round(C + total). With S = 1 this is exactly
 * the order of dg_engine_gemm on the same configuration.
 * On an AMX configuration, BF16 views (ops NULL) have an order of their own, more accurate
 * than dg_engine_gemm's one tile chain over K: each segment's K padded to 32 with zeros, K'
 * cut into blocks of DG_ACC_BLOCK as above, each block a tile chain from zero (one TDPBF16PS
 * per k step of 32, engine.h) rounded to float32; consecutive runs of DG_F64_RUN = 4 blocks
 * (K' positions [512 r, 512 r + 512)) summed in float64 as ((b0 + b1) + (b2 + b3)), blocks
 * past K' left out; the run sums added in order into a float64 total (the first run starts
 * it); the total rounded to float32 once, then D = round(C + total). No groups. Measured on
 * upstream's einsum cases (python -m deep_gemm_cpu.accuracy, Sapphire Rapids, 2^24 outputs per
 * case): at most 0.0077% of outputs one BF16 step from the exactly rounded result, against up
 * to 0.0175% with one tile chain over K and 0.0258% for PyTorch 2.13. The float64 adds cost: the long
 * contractions (K' of several chunks) take up to 40% longer than one tile chain did (AMX
 * products and AVX-512 work do not overlap, kernels/amx/ukr_bf16_amx.c; and the totals kept
 * between chunks), K' of one chunk 0-10%, K' of one block nothing (stored from the tiles).
 * Operands with scales (ops) follow dg_engine_gemm per group on AMX as everywhere
 * (dg_engine_config_for: the fallback's order for groups whose scale blocks are not whole tile
 * steps). Threads take whole output tiles of whole groups and never split K, so the bits
 * depend on neither the tiling nor the thread count.
 * Parallelism covers groups and tiles together: many small per-group GEMMs keep every thread
 * busy (each thread packs the panels of its own tiles).
 */
#ifndef DG_ENGINE_BATCHED_H
#define DG_ENGINE_BATCHED_H

#include "engine.h"

/* Accumulation blocks per group sum when K runs over segments (S > 1, order above): 2048 k. */
#define DG_ACC_GROUP 16

typedef struct dg_bview {
    const uint16_t *base;        /* BF16 bits */
    int64_t sg, ss, si, sk;      /* strides in elements: group, segment, row (M or N), K */
} dg_bview;

typedef struct dg_bgemm {
    int64_t groups, segs, m, n, k;
    dg_bview a, b;
    const dg_tensor *d;          /* group 0's [M, N] view, FLOAT32 or BFLOAT16, unit stride along N */
    const dg_tensor *c;          /* NULL, or like d (may be d itself) */
    int64_t dg, cg;              /* group strides of D and C, in elements */
    /* NULL: the BF16 views a, b. Else group g's A and B are the 2-D operands ops[2g] and
     * ops[2g + 1] (any dtype and scales dg_engine_gemm takes; segs must be 1; a and b
     * unused). Scales follow dg_engine_plan_scales per group: power-of-two ones folded into
     * the values, others applied per K block (the chain restarts per block, engine.h). */
    const dg_operand *ops;
} dg_bgemm;

/* Runs the problem with the current ISA and thread count. DG_ERR_UNSUPPORTED when a group's
 * operands are outside the engine (dg_engine_plan_scales); that and allocation failure return
 * before anything is written. */
dg_status dg_engine_bgemm(const dg_bgemm *p);

#endif /* DG_ENGINE_BATCHED_H */
