/*
 * ref_mega_moe.h - the mega MoE reference as separate steps (dispatch, L1 GEMM, SwiGLU,
 * activation quantization, L2 GEMM, combine), so that later fused kernels can be checked
 * against each step and share the one combine order. The numerics are stated in
 * include/deepgemm.h (section mega-moe); the entry points in src/api/mega_moe.c validate every
 * argument and fill a dg_mega_moe_problem.
 */
#ifndef DG_REFERENCE_REF_MEGA_MOE_H
#define DG_REFERENCE_REF_MEGA_MOE_H

#include "core/operand.h"
#include "core/float_math.h"

/* Values per activation scale in step 4 (DeepGEMM's recipe (1, 1, 32)). */
#define DG_MEGA_MOE_ACT_GRAN 32

typedef struct dg_mega_moe_problem {
    int num_ranks;
    int64_t num_experts, experts_per_rank;
    int64_t hidden, inter, topk;          /* H, I, K */
    int fp8;                              /* 1: FP8 x, FP4 weights, FP8 activations; 0: BF16 */
    float clamp;                          /* already BF16-rounded; INFINITY: no clamp */
    const int64_t *num_tokens;            /* [R] */
    const dg_operand *x;                  /* [R], logical [T_r, H] (with scales when fp8) */
    const dg_operand *l1, *l2;            /* [R], grouped [E/R, 2I, H] and [E/R, H, I] */
    const dg_tensor *const *topk_idx;     /* [R], INT32 or INT64 [T_r, K] */
    const dg_tensor *const *topk_weights; /* [R], FLOAT32 [T_r, K] */
    const dg_tensor *const *y;            /* [R], BF16 [T_r, H] */
    const dg_tensor *const *stats;        /* NULL, or [R] INT32 [E/R] contiguous */
} dg_mega_moe_problem;

/* One dispatched (source rank, token, slot). */
typedef struct dg_mega_moe_pair {
    int32_t rank;
    int64_t token, slot;
} dg_mega_moe_pair;

/* topk_idx[rank][t, j] as an integer (INT32 or INT64). */
int64_t dg_ref_mega_moe_expert(const dg_mega_moe_problem *p, int rank, int64_t t, int64_t j);

/* Total (token, slot) pairs over all ranks, counting -1 slots too: the capacity dispatch needs. */
int64_t dg_ref_mega_moe_num_slots(const dg_mega_moe_problem *p);

/*
 * Step 1 (dispatch): the pairs routed to each global expert e are pairs[offsets[e] ..
 * offsets[e + 1]), ordered by (source rank, token, slot). offsets has E + 1 entries.
 */
void dg_ref_mega_moe_dispatch(const dg_mega_moe_problem *p, int64_t *offsets, dg_mega_moe_pair *pairs);

/* Step 2 (L1 GEMM): h[0, 2I) = BF16(float(x[src] . W1[expert]^T)), BF16 values held as float. */
void dg_ref_mega_moe_l1(const dg_mega_moe_problem *p, const dg_mega_moe_pair *src, int64_t expert,
                        float *h);

/* Step 3 (SwiGLU) of one element: clamp (unless clamp is INFINITY; a NaN gives the bound, as
 * fminf / fmaxf and DeepGEMM's __hmin2 / __hmax2), then ((gate / (1 + e^-gate)) * up) * weight
 * in float32 with core/float_math.h's e^x (the same bits on every machine; the vector rows in
 * kernels/moe_act_kernels.h run these operations lane by lane). */
static inline float dg_ref_swiglu_elem(float gate, float up, float clamp, float weight) {
    if (!isinf(clamp)) {
        gate = dg_fm_min(gate, clamp);
        up = dg_fm_min(dg_fm_max(up, -clamp), clamp);
    }
    return ((gate / (1.0f + dg_exp_f32(-gate))) * up) * weight;
}

/* Step 3 over a row: a[i] = dg_ref_swiglu_elem(h[i], h[I + i], ...) for i < I. */
void dg_ref_mega_moe_swiglu(const float *h, int64_t inter, float clamp, float weight, float *a);
/* DeepGEMM 2.8's SiTU (fp8_fp4_mega_moe(activation='situ'), no clamp) of one element, float32
 * in its kernel's order with core/float_math.h's e^x and tanh:
 * a = (((1 / (1 + e^-g)) * (beta * tanh(g / beta))) * (linear_beta * tanh(u / linear_beta))) * weight. */
static inline float dg_ref_situ_elem(float g, float u, float beta, float linear_beta, float weight) {
    const float sigmoid = 1.0f / (1.0f + dg_exp_f32(-g));
    const float gt = sigmoid * (beta * dg_tanh_f32(g / beta));
    return (gt * (linear_beta * dg_tanh_f32(u / linear_beta))) * weight;
}

/* SiTU over a row: a[i] = dg_ref_situ_elem(h[i], h[I + i], ...) for i < I. */
void dg_ref_mega_moe_situ(const float *h, int64_t inter, float beta, float linear_beta, float weight, float *a);

/*
 * Step 4 (FP8 variant): per DG_MEGA_MOE_ACT_GRAN values, codes = E4M3(a * (1 / sf)) with
 * sf = ceil_to_ue8m0(max(amax, 1e-4) / 448); sf has ceil(n / 32) entries. a_q (NULL, or a
 * itself for in place) receives the dequantized values codes * sf, exact in float32.
 */
void dg_ref_mega_moe_quantize_fp8(const float *a, int64_t n, uint8_t *codes, float *sf, float *a_q);
/*
 * Step 4 of the NVFP4 mega MoE (dg_fp4_fp4_mega_moe): per 16 values, with g the expert's
 * a2_scale (1 without), amax = max |a| (NaNs skipped), sf = E4M3(max((amax / 6) * (1 / g),
 * 2^-9)) (round to nearest even, saturating at 448), code = E2M1 of a / (sf * g) by round to
 * nearest even with saturation at 6 (dg_e2m1_rne; a NaN gives 0). codes: n / 2 bytes of pairs,
 * low nibble first; sf: n / 16 floats (the E4M3 values). n is a multiple of 16.
 */
void dg_ref_mega_moe_quantize_nvfp4(const float *a, int64_t n, float g, uint8_t *codes, float *sf);
/*
 * Step 4 of the SM90 FP8 mega MoE (dg_fp8_mega_moe): per 64 values (n a multiple of 64), with
 * amax = max |a| (NaNs skipped), sf = 2^ceil(log2(amax * (1 / 448))) taken from the bits of
 * amax * (1 / 448) (its exponent, plus one when any mantissa bit is set; a subnormal counts as
 * 2^-126) and 0 when amax is 0; codes = E4M3(a * 2^-log2(sf)) (round to nearest even; 0 when
 * sf is 0). sf: n / 64 floats. As DeepGEMM's kernel: no epsilon, the reciprocal multiplied.
 */
void dg_ref_mega_moe_quantize_fp8_pow2(const float *a, int64_t n, uint8_t *codes, float *sf);
/* Values per activation scale of the SM90 FP8 mega MoE's step 4. */
#define DG_MEGA_MOE_SM90_ACT_GRAN 64
/* E2M1 by round to nearest even (PTX cvt.rn.satfinite.e2m1x2: ties 0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
 * 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating at 6; NaN -> 0. dg_float_to_e2m1 differs at
 * the ties 0.75, 1.75 and 3.5 (DeepGEMM's casts round those down). */
uint8_t dg_e2m1_rne(float x);
/* Step 4 (BF16 variant): a rounded to BF16 in place. */
void dg_ref_mega_moe_round_bf16(float *a, int64_t n);

/* Step 5 (L2 GEMM): o[0, H) = BF16(float(a . W2[expert]^T)), a holding the I step-4 values. */
void dg_ref_mega_moe_l2(const dg_mega_moe_problem *p, int64_t expert, const float *a, uint16_t *o);

/*
 * Step 6 (combine), THE summation order shared by every implementation: for each column c,
 * acc = +0.0f; for j = 0 .. topk-1 with o_slots[j] != NULL: acc += float(o_slots[j][c]) in
 * float32; y[c] = BF16(acc). o_slots[j] is the BF16 row of slot j, NULL when the slot is -1.
 */
void dg_mega_moe_combine_row(const uint16_t *const *o_slots, int64_t topk, int64_t hidden, uint16_t *y);

/* The whole chain; allocates its buffers first and writes y/stats only at the end. */
dg_status dg_ref_mega_moe(const dg_mega_moe_problem *p);

#endif /* DG_REFERENCE_REF_MEGA_MOE_H */
