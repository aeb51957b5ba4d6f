/*
 * ref_mega_moe.c - the mega MoE reference (SPEC 9) as the literal unfused chain of
 * DeepGEMM's tests/test_mega_moe.py baseline: dispatch, grouped GEMM L1 (BF16 out), SwiGLU with
 * clamp and top-k weight, per-32 UE8M0 FP8 re-quantization (or BF16), grouped GEMM L2 (BF16
 * out), combine. NOTES: where DeepGEMM's fused kernel and its baseline agree we follow both.
 * Where they differ only in corner cases we pick one: the clamp value is rounded to BF16 (fused
 * kernel, which clamps BF16 pairs); the activation amax is floored at 1e-4 and divided by 448
 * (baseline and per_token_cast_to_fp8; the fused kernel multiplies by 1/448 without a floor,
 * which differs only for groups with amax < 1e-4). See deepgemm.h for the whole contract.
 */
#include "ref_mega_moe.h"

#include "ref_gemm.h"

#include "../formats/convert.h"

#include <math.h>
#include <string.h>

int64_t dg_ref_mega_moe_expert(const dg_mega_moe_problem *p, int rank, int64_t t, int64_t j) {
    const dg_tensor *idx = p->topk_idx[rank];
    const void *ptr = dg_ptr2(idx, t, j);
    return idx->dtype == DG_INT64 ? *(const int64_t *)ptr : (int64_t) * (const int32_t *)ptr;
}

int64_t dg_ref_mega_moe_num_slots(const dg_mega_moe_problem *p) {
    int64_t n = 0;
    for (int r = 0; r < p->num_ranks; ++r)
        n += p->num_tokens[r] * p->topk;
    return n;
}

void dg_ref_mega_moe_dispatch(const dg_mega_moe_problem *p, int64_t *offsets, dg_mega_moe_pair *pairs) {
    /* Counting sort by expert; scanning (rank, token, slot) in increasing order keeps that order
     * inside each expert. offsets[e + 1] first counts, then serves as expert e's fill cursor. */
    memset(offsets, 0, (size_t)(p->num_experts + 1) * sizeof *offsets);
    for (int r = 0; r < p->num_ranks; ++r)
        for (int64_t t = 0; t < p->num_tokens[r]; ++t)
            for (int64_t j = 0; j < p->topk; ++j) {
                const int64_t e = dg_ref_mega_moe_expert(p, r, t, j);
                if (e >= 0)
                    ++offsets[e + 1];
            }
    for (int64_t e = 0; e < p->num_experts; ++e)
        offsets[e + 1] += offsets[e];
    for (int r = 0; r < p->num_ranks; ++r)
        for (int64_t t = 0; t < p->num_tokens[r]; ++t)
            for (int64_t j = 0; j < p->topk; ++j) {
                const int64_t e = dg_ref_mega_moe_expert(p, r, t, j);
                if (e >= 0)
                    pairs[offsets[e]++] = (dg_mega_moe_pair){.rank = r, .token = t, .slot = j};
            }
    /* Each offsets[e] now holds expert e's end; shift back to starts. */
    for (int64_t e = p->num_experts; e > 0; --e)
        offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}

static float round_bf16(float v) { return dg_bf16_to_float(dg_float_to_bf16(v)); }

void dg_ref_mega_moe_l1(const dg_mega_moe_problem *p, const dg_mega_moe_pair *src, int64_t expert,
                        float *h) {
    const int owner = (int)(expert / p->experts_per_rank);
    const int64_t local = expert % p->experts_per_rank;
    for (int64_t n = 0; n < 2 * p->inter; ++n) {
        /* The GPU accumulates in float32 and its epilogue casts to BF16 (__float22bfloat162_rn). */
        const double acc = dg_ref_dot(&p->x[src->rank], 0, src->token, &p->l1[owner], local, n);
        h[n] = round_bf16((float)acc);
    }
}

void dg_ref_mega_moe_swiglu(const float *h, int64_t inter, float clamp, float weight, float *a) {
    for (int64_t i = 0; i < inter; ++i)
        a[i] = dg_ref_swiglu_elem(h[i], h[inter + i], clamp, weight);
}

uint8_t dg_e2m1_rne(float x) {
    static const float kUp[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const uint8_t kTieUp[7] = {0, 1, 0, 1, 0, 1, 0}; /* the tie goes to the even code */
    const float ax = fabsf(x);
    uint8_t code = 0;
    for (int i = 0; i < 7; ++i)
        code += kTieUp[i] ? ax >= kUp[i] : ax > kUp[i];
    if (x < 0 && code != 0)
        code |= 8;
    return code;
}

void dg_ref_mega_moe_quantize_nvfp4(const float *a, int64_t n, float g, uint8_t *codes, float *sf) {
    const float inv_g = 1.0f / g;
    for (int64_t b = 0; b < n / 16; ++b) {
        const float *v = a + b * 16;
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i)
            amax = fmaxf(amax, fabsf(v[i]));
        const float s = dg_e4m3_to_float(dg_float_to_e4m3(fmaxf((amax / 6.0f) * inv_g, 0x1p-9f)));
        const float elem = s * g;
        sf[b] = s;
        for (int i = 0; i < 16; i += 2)
            codes[b * 8 + i / 2] = (uint8_t)(dg_e2m1_rne(v[i] / elem) | (dg_e2m1_rne(v[i + 1] / elem) << 4));
    }
}

void dg_ref_mega_moe_quantize_fp8_pow2(const float *a, int64_t n, uint8_t *codes, float *sf) {
    for (int64_t g = 0; g < n / DG_MEGA_MOE_SM90_ACT_GRAN; ++g) {
        const float *v = a + g * DG_MEGA_MOE_SM90_ACT_GRAN;
        float amax = 0.0f;
        for (int i = 0; i < DG_MEGA_MOE_SM90_ACT_GRAN; ++i)
            amax = fmaxf(amax, fabsf(v[i]));
        /* 2^e with e = ceil(log2(amax / 448)) read off the float's bits, as the GPU's integer
         * log2 does; e = -127 (amax 0) gives sf 0 and an inverse of 2^127 (codes 0). The
         * inverse is exact: a power of two. */
        uint32_t bits;
        const float q = amax * (1.0f / 448.0f);
        memcpy(&bits, &q, 4);
        const int e = (int)((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0);
        const uint32_t sf_bits = e <= -127 ? 0u : (uint32_t)(e + 127) << 23; /* e <= 128: inf at most */
        const uint32_t inv_bits = e >= 127 ? 0u : (uint32_t)(127 - e) << 23;
        float scale, inv;
        memcpy(&scale, &sf_bits, 4);
        memcpy(&inv, &inv_bits, 4);
        sf[g] = scale;
        for (int i = 0; i < DG_MEGA_MOE_SM90_ACT_GRAN; ++i)
            codes[g * DG_MEGA_MOE_SM90_ACT_GRAN + i] = dg_float_to_e4m3(v[i] * inv);
    }
}

void dg_ref_mega_moe_situ(const float *h, int64_t inter, float beta, float linear_beta, float weight, float *a) {
    for (int64_t i = 0; i < inter; ++i)
        a[i] = dg_ref_situ_elem(h[i], h[inter + i], beta, linear_beta, weight);
}

void dg_ref_mega_moe_quantize_fp8(const float *a, int64_t n, uint8_t *codes, float *sf, float *a_q) {
    for (int64_t g0 = 0, s = 0; g0 < n; g0 += DG_MEGA_MOE_ACT_GRAN, ++s) {
        const int64_t g1 = g0 + DG_MEGA_MOE_ACT_GRAN < n ? g0 + DG_MEGA_MOE_ACT_GRAN : n;
        float amax = 0.0f;
        for (int64_t i = g0; i < g1; ++i)
            amax = fmaxf(amax, fabsf(a[i]));
        /* 1e-4 and 448 (largest finite E4M3) come from per_token_cast_to_fp8 / the baseline. */
        amax = fmaxf(amax, 1e-4f);
        const float scale = dg_ceil_to_ue8m0(amax / 448.0f);
        const float inv = 1.0f / scale; /* a power of two: exact */
        sf[s] = scale;
        for (int64_t i = g0; i < g1; ++i) {
            codes[i] = dg_float_to_e4m3(a[i] * inv);
            if (a_q)
                a_q[i] = dg_e4m3_to_float(codes[i]) * scale;
        }
    }
}

void dg_ref_mega_moe_round_bf16(float *a, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        a[i] = round_bf16(a[i]);
}

void dg_ref_mega_moe_l2(const dg_mega_moe_problem *p, int64_t expert, const float *a, uint16_t *o) {
    const int owner = (int)(expert / p->experts_per_rank);
    const int64_t local = expert % p->experts_per_rank;
    /* The activation row as a FLOAT32 [1, I] operand, so that the dot product is the shared one. */
    dg_tensor at = dg_tensor_2d((void *)a, DG_FLOAT32, 1, p->inter);
    dg_operand act = {.data = &at, .sf = NULL, .grouped = 0, .groups = 1, .mn = 1, .k = p->inter,
                      .fp4_dim = -1, .gran_mn = 1, .gran_k = 1, .sf_packed = 0};
    for (int64_t n = 0; n < p->hidden; ++n)
        o[n] = dg_float_to_bf16((float)dg_ref_dot(&act, 0, 0, &p->l2[owner], local, n));
}

/* Per column, the slots in increasing j: the one order. Columns go in chunks, each slot's run
 * of a chunk added into a float row (loops the compiler vectorizes; the same sums). */
void dg_mega_moe_combine_row(const uint16_t *const *o_slots, int64_t topk, int64_t hidden, uint16_t *y) {
    enum { CHUNK = 256 };
    float acc[CHUNK];
    for (int64_t c0 = 0; c0 < hidden; c0 += CHUNK) {
        const int64_t w = hidden - c0 < CHUNK ? hidden - c0 : CHUNK;
        for (int64_t c = 0; c < w; ++c)
            acc[c] = 0.0f;
        for (int64_t j = 0; j < topk; ++j) {
            const uint16_t *o = o_slots[j];
            if (!o)
                continue;
            for (int64_t c = 0; c < w; ++c) {
                const uint32_t bits = (uint32_t)o[c0 + c] << 16;
                float v;
                memcpy(&v, &bits, 4);
                acc[c] += v;
            }
        }
        for (int64_t c = 0; c < w; ++c)
            y[c0 + c] = dg_round_bf16(acc[c]);
    }
}

/* Steps 2-5 for every dispatched pair of one expert; o rows land in the combine buffer at
 * [source rank][token][slot], as DeepGEMM's L2 epilogue writes them to the source rank. */
static void run_expert(const dg_mega_moe_problem *p, int64_t expert, const dg_mega_moe_pair *pairs,
                       int64_t count, const int64_t *rank_base, uint16_t *combine, float *h, float *a,
                       uint8_t *codes, float *sf) {
    for (int64_t i = 0; i < count; ++i) {
        const dg_mega_moe_pair *src = &pairs[i];
        const dg_tensor *w = p->topk_weights[src->rank];
        const float weight = *(const float *)dg_ptr2(w, src->token, src->slot);
        dg_ref_mega_moe_l1(p, src, expert, h);
        dg_ref_mega_moe_swiglu(h, p->inter, p->clamp, weight, a);
        if (p->fp8)
            dg_ref_mega_moe_quantize_fp8(a, p->inter, codes, sf, a);
        else
            dg_ref_mega_moe_round_bf16(a, p->inter);
        uint16_t *o = combine + rank_base[src->rank] + (src->token * p->topk + src->slot) * p->hidden;
        dg_ref_mega_moe_l2(p, expert, a, o);
    }
}

/* Step 6 for one rank, then the BF16 store into y[r] (any strides). */
static void combine_rank(const dg_mega_moe_problem *p, int r, const uint16_t *combine,
                         const uint16_t **slots, uint16_t *row) {
    const dg_tensor *y = p->y[r];
    for (int64_t t = 0; t < p->num_tokens[r]; ++t) {
        for (int64_t j = 0; j < p->topk; ++j)
            slots[j] = dg_ref_mega_moe_expert(p, r, t, j) >= 0 ? combine + (t * p->topk + j) * p->hidden
                                                                : NULL;
        dg_mega_moe_combine_row(slots, p->topk, p->hidden, row);
        for (int64_t c = 0; c < p->hidden; ++c)
            *(uint16_t *)dg_ptr2(y, t, c) = row[c];
    }
}

dg_status dg_ref_mega_moe(const dg_mega_moe_problem *p) {
    const int R = p->num_ranks;
    const int64_t slots_total = dg_ref_mega_moe_num_slots(p);
    /* The API checked that slots_total * hidden * 2 bytes and the other sizes fit. */
    int64_t *offsets = dg_calloc((size_t)p->num_experts + 1, sizeof *offsets);
    int64_t *rank_base = dg_calloc((size_t)R, sizeof *rank_base);
    dg_mega_moe_pair *pairs = dg_calloc((size_t)slots_total + 1, sizeof *pairs);
    uint16_t *combine = dg_calloc((size_t)(slots_total * p->hidden) + 1, sizeof *combine);
    float *h = dg_calloc((size_t)(2 * p->inter) + 1, sizeof *h);
    float *a = dg_calloc((size_t)p->inter + 1, sizeof *a);
    uint8_t *codes = dg_calloc((size_t)p->inter + 1, 1);
    float *sf = dg_calloc((size_t)dg_ceil_div(p->inter, DG_MEGA_MOE_ACT_GRAN) + 1, sizeof *sf);
    const uint16_t **slots = dg_calloc((size_t)p->topk + 1, sizeof *slots);
    uint16_t *row = dg_calloc((size_t)p->hidden + 1, sizeof *row);
    dg_status st = DG_OK;
    if (!offsets || !rank_base || !pairs || !combine || !h || !a || !codes || !sf || !slots || !row) {
        st = dg_fail(DG_ERR_ALLOC, "cannot allocate the mega MoE work buffers (%lld slots)",
                     (long long)slots_total);
        goto done;
    }
    for (int r = 1; r < R; ++r)
        rank_base[r] = rank_base[r - 1] + p->num_tokens[r - 1] * p->topk * p->hidden;

    dg_ref_mega_moe_dispatch(p, offsets, pairs);
    for (int64_t e = 0; e < p->num_experts; ++e)
        run_expert(p, e, pairs + offsets[e], offsets[e + 1] - offsets[e], rank_base, combine, h, a,
                   codes, sf);
    for (int r = 0; r < R; ++r)
        combine_rank(p, r, combine + rank_base[r], slots, row);
    if (p->stats) {
        for (int64_t e = 0; e < p->num_experts; ++e) {
            const dg_tensor *s = p->stats[e / p->experts_per_rank];
            int32_t *cell = (int32_t *)s->data + e % p->experts_per_rank;
            /* Unsigned arithmetic: wraps like the GPU's red.add instead of overflowing. */
            *cell = (int32_t)((uint32_t)*cell + (uint32_t)(offsets[e + 1] - offsets[e]));
        }
    }
done:
    dg_free(offsets);
    dg_free(rank_base);
    dg_free(pairs);
    dg_free(combine);
    dg_free(h);
    dg_free(a);
    dg_free(codes);
    dg_free(sf);
    dg_free(slots);
    dg_free(row);
    return st;
}
