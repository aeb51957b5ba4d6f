/*
 * mega_moe.c - the expert side of a fused mega MoE call on one rank (mega_moe.h).
 *
 * Routing reads every rank's topk_idx from the symmetric buffer and lists, per local expert,
 * the (source rank, token, slot) pairs in that order: the reference's dispatch order. Each
 * expert then runs in waves of rows: gather the rows from the source ranks' buffers, L1 GEMM,
 * SwiGLU with clamp and top-k weight, activation quantisation, L2 GEMM, and each output row
 * copied into its source rank's combine area at (token, slot): no dispatched [tokens, H] or
 * combine [tokens, K, H] tensor is built as in the unfused chain (wave sizes: wave_rows).
 *
 * The GEMMs are the public dg_fp8_fp4_gemm_nt / dg_bf16_gemm_nt, or their `_packed` forms on
 * the expert's group of pre-packed weights (bitwise the same D): a row of their D depends only
 * on that row of A (batch invariance), so waves of any size, and the grouped GEMMs of an
 * unfused chain, give the same bits. SwiGLU / SiTU are the reference's own scalar steps
 * (src/reference/ref_mega_moe.c: float32 code, the same in every build); the conversions
 * around them run on the bulk kernels (dg_cast, per_token_cast_to_fp8's), which give the
 * reference's bits (NaN activations aside: see run_wave; y is the same).
 *
 * The NVFP4 call (dg_fp4_fp4_mega_moe) runs the same waves on E2M1 tokens and weights with
 * per-16 E4M3 scales: its GEMMs are dg_fp8_fp4_gemm_nt with recipe (1, 1, 16) and float32 D
 * (the expert's model scales multiply before the BF16 rounding), the E4M3 scale bytes widened
 * to float per token and per expert; its BF16 shared experts take x_bf16's rows.
 *
 * The SM90 call (dg_fp8_mega_moe) runs them on FP8 tokens and weights with float scales per
 * 1x128 and per 128x128 block: dg_fp8_gemm_nt with float32 L1 D (no BF16 rounding before
 * SwiGLU) and per-1x64 power-of-two activation scales (dg_ref_mega_moe_quantize_fp8_pow2).
 */
#include "mega_moe.h"

#include "prepack.h"
#include "reference/ref_mega_moe.h"
#include "kernels/moe_act_kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

dg_swiglu_row_fn dg_swiglu_row_for(dg_isa isa) {
#if DG_MOE_ACT_HAVE_X86
    if (isa >= DG_ISA_AVX512)
        return dg_swiglu_row_avx512;
    if (isa >= DG_ISA_AVX2)
        return dg_swiglu_row_avx2;
#else
    (void)isa;
#endif
    return dg_ref_mega_moe_swiglu;
}

dg_situ_row_fn dg_situ_row_for(dg_isa isa) {
#if DG_MOE_ACT_HAVE_X86
    if (isa >= DG_ISA_AVX512)
        return dg_situ_row_avx512;
    if (isa >= DG_ISA_AVX2)
        return dg_situ_row_avx2;
#else
    (void)isa;
#endif
    return dg_ref_mega_moe_situ;
}

typedef struct pair {
    int32_t rank;
    int32_t slot;
    int64_t token;
} pair;

static int64_t topk_at(const dg_symm_buffer *b, int r, int64_t t, int64_t j) {
    const int64_t *idx = (const int64_t *)dg_symm_area(b, r, b->lay.topk_idx);
    return idx[t * b->cfg.num_topk + j];
}

/*
 * Rows per wave. Each wave calls the GEMMs once per layer, and a GEMM call re-reads (and, above
 * the small-M sizes, re-packs) the expert's weights, so waves are as large as memory allows:
 * all of an expert's rows up to 64 MiB of wave buffers (L1 output, activations, L2 output and
 * gathered inputs per row). At decoding sizes a wave is one expert's few rows and its
 * intermediates stay in L1/L2; at prefill sizes they stream through L3 as in the unfused chain,
 * minus its full-size dispatch and combine tensors.
 */
static int64_t g_wave_rows_override;

void dg_mega_moe_set_wave_rows(int64_t rows) { g_wave_rows_override = rows > 0 ? rows : 0; }

static int64_t wave_rows(const dg_symm_buffer *b, int64_t inter, int nvfp4) {
    if (g_wave_rows_override > 0)
        return g_wave_rows_override;
    const int64_t H = b->cfg.hidden;
    const int64_t per_row = 3 * 4 * inter + 2 * inter + 2 * H + 2 * H + (nvfp4 ? 4 * H + H / 4 : 0) + 64;
    const int64_t rows = ((int64_t)64 << 20) / per_row;
    return rows < 64 ? 64 : rows > 8192 ? 8192 : rows;
}

/* Group g of a 3-D tensor as a 2-D view. */
static dg_tensor group_view(const dg_tensor *t, int64_t g) {
    dg_tensor v = *t;
    v.ndim = 2;
    v.data = (char *)t->data + g * t->strides[0] * (int64_t)dg_dtype_size(t->dtype);
    v.shape[0] = t->shape[1], v.shape[1] = t->shape[2];
    v.strides[0] = t->strides[1], v.strides[1] = t->strides[2];
    return v;
}

/* The NVFP4 scales of group g of an INT32 [G, >= rows, >= words] tensor of four E4M3 bytes each (any
 * strides), as FLOAT32 [rows, 4 words]: what the GEMMs take (their INT32 scales are UE8M0). */
static void nvfp4_scales(const dg_tensor *sf, int64_t g, int64_t rows, int64_t words, const float *lut, float *out) {
    const int64_t s1 = sf->strides[1], s2 = sf->strides[2];
    const uint32_t *base = (const uint32_t *)sf->data + g * sf->strides[0];
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t w = 0; w < words; ++w) {
            const uint32_t v = base[r * s1 + w * s2];
            for (int q = 0; q < 4; ++q)
                out[r * 4 * words + 4 * w + q] = lut[(v >> (8 * q)) & 0xff];
        }
}

/* What an expert's wave multiplies: FP8 tokens (per-1x32 scales), BF16 tokens, NVFP4 tokens, or
 * FP8 tokens and weights with float block scales (SM90: 1x128 / 128x128). */
typedef enum { KIND_FP8, KIND_BF16, KIND_NVFP4, KIND_FP8_BLOCK } wave_kind;

typedef struct wave_mem {
    void *a_in;      /* [W, H] gathered x rows (E4M3, BF16 or E2M1 pairs) */
    void *sf_in;     /* [W, ceil(H/128)] their packed scales (fp8), or [W, H/16] floats (nvfp4) */
    uint16_t *h;     /* [W, 2I] L1 output, BF16 */
    void *act;       /* [W, I] activations: E4M3 codes (fp8), BF16, or E2M1 pairs (nvfp4) */
    float *act_sf;   /* fp8: [W, ceil(I/128)] packed UE8M0 words (int32); nvfp4: [W, I/16] floats */
    uint16_t *o;     /* [W, H] L2 output, BF16 */
    float *tmp;      /* [n, 2I] L1 output as float, then [n, I] activations (n <= W) */
    float *of;       /* [W, H] L2 output as float (nvfp4) */
    float *s1f, *s2f; /* the expert's L1 / L2 scales as float (nvfp4 with INT32 scales) */
    float lut[256];  /* E4M3 byte -> float (nvfp4) */
} wave_mem;

/* A step of a wave (a GEMM, a conversion) failed: its message, in this call's name. */
static dg_status step_failed(const char *api, const char *step, const char *who) {
    char inner[512];
    snprintf(inner, sizeof inner, "%s", dg_last_error());
    dg_api_begin(api);
    return dg_fail(DG_ERR_INTERNAL, "%s, %s: %s", who, step, inner);
}

/* One expert's weights as 2-D views (or its pre-packed B's), and where its output rows go. */
typedef struct expert {
    wave_kind kind;
    dg_tensor w1, s1, w2, s2;          /* nvfp4: s1 / s2 FLOAT32 */
    const struct dg_packed_b *p1, *p2; /* non-NULL: the `_packed` calls (w1 .. s2 unused) */
    int64_t inter;       /* I, or num_shared_experts * I for the shared expert */
    uint16_t *shared_y;  /* NULL: routed (rows to the combine areas, top-k weight applied);
                          * else the shared expert: row of token t to shared_y[t], weight 1 */
    float alpha_gate, alpha_up, alpha2, a2; /* nvfp4: the expert's model scales (1 when not given) */
    char who[48];
} expert;

static float bf16_round(float v) { return dg_bf16_to_float(dg_float_to_bf16(v)); }

/* Row i of the wave's input: token p->token of rank p->rank (the buffer's x, or x_bf16 for the
 * NVFP4 call's BF16 shared experts), with its scales as the GEMM takes them. */
static void gather_row(const dg_mega_moe_call *c, const expert *x, const pair *p, int64_t i, wave_mem *m) {
    const dg_symm_buffer *b = c->buf;
    const int64_t H = b->cfg.hidden, xrow = b->lay.x_row, sfc = b->lay.sf_cols;
    if (x->kind == KIND_BF16 && c->nvfp4) {
        uint16_t *dst = (uint16_t *)m->a_in + i * H;
        for (int64_t col = 0; col < H; ++col)
            dst[col] = *(const uint16_t *)dg_ptr2(c->x_bf16, p->token, col);
        return;
    }
    memcpy((char *)m->a_in + i * xrow, dg_symm_area(b, p->rank, b->lay.x) + p->token * xrow, (size_t)xrow);
    const uint8_t *sf = (const uint8_t *)dg_symm_area(b, p->rank, b->lay.x_sf) + p->token * sfc * 4;
    if (x->kind == KIND_FP8 || x->kind == KIND_FP8_BLOCK) /* packed UE8M0 words, or SM90's floats */
        memcpy((int32_t *)m->sf_in + i * sfc, sf, (size_t)sfc * 4);
    else if (x->kind == KIND_NVFP4)
        for (int64_t q = 0; q < 4 * sfc; ++q)
            ((float *)m->sf_in)[i * 4 * sfc + q] = m->lut[sf[q]];
}

/* The GEMM of one layer: A [n, k] of the wave's kind times the expert's B of that layer, into
 * d (BF16, or FLOAT32 for NVFP4). */
static dg_status layer_gemm(const expert *x, int layer, void *a_data, void *a_sf, int64_t n, int64_t k,
                            const dg_tensor *d) {
    const dg_tensor *w = layer == 1 ? &x->w1 : &x->w2, *ws = layer == 1 ? &x->s1 : &x->s2;
    const struct dg_packed_b *p = layer == 1 ? x->p1 : x->p2;
    dg_gemm_options opts = dg_gemm_options_default();
    opts.recipe[0] = 1, opts.recipe[1] = 1;
    if (x->kind == KIND_BF16) {
        dg_tensor a = dg_tensor_2d(a_data, DG_BFLOAT16, n, k);
        return p ? dg_bf16_gemm_nt_packed(&a, p, d, NULL) : dg_bf16_gemm_nt(&a, w, d, NULL);
    }
    if (x->kind == KIND_FP8_BLOCK) { /* A per 1x128 (tokens) or 1x64 (activations), B per 128x128 */
        const int gran = layer == 1 ? 128 : DG_MEGA_MOE_SM90_ACT_GRAN;
        opts.recipe[0] = opts.recipe[1] = 0;
        opts.recipe_a[0] = 1, opts.recipe_a[1] = gran, opts.recipe_b[0] = 128, opts.recipe_b[1] = 128;
        dg_tensor a = dg_tensor_2d(a_data, DG_FLOAT8_E4M3, n, k), sa = dg_tensor_2d(a_sf, DG_FLOAT32, n, k / gran);
        return p ? dg_fp8_fp4_gemm_nt_packed(&a, &sa, p, d, NULL, &opts) : dg_fp8_gemm_nt(&a, &sa, w, ws, d, NULL, &opts);
    }
    if (x->kind == KIND_FP8) {
        opts.recipe[2] = DG_MEGA_MOE_ACT_GRAN;
        /* both layers read packed UE8M0 words (four 1x32 blocks per word): the tokens' and the
         * activations' (run_wave casts them so). Power-of-two scales given packed are folded into
         * A's values, one accumulation chain over K; given as float32 they would keep a
         * per-block epilogue (a row's fold cannot depend on other rows' scales), 1.6-2x slower
         * on AMX for the L2 GEMM. */
        dg_tensor a = dg_tensor_2d(a_data, DG_FLOAT8_E4M3, n, k);
        dg_tensor sa = dg_tensor_2d(a_sf, DG_INT32, n, dg_ceil_div(k, 128));
        return p ? dg_fp8_fp4_gemm_nt_packed(&a, &sa, p, d, NULL, &opts) : dg_fp8_fp4_gemm_nt(&a, &sa, w, ws, d, NULL, &opts);
    }
    opts.recipe[2] = 16;
    dg_tensor a = dg_tensor_2d(a_data, DG_FP4_E2M1X2, n, k / 2), sa = dg_tensor_2d(a_sf, DG_FLOAT32, n, k / 16);
    return p ? dg_fp8_fp4_gemm_nt_packed(&a, &sa, p, d, NULL, &opts) : dg_fp8_fp4_gemm_nt(&a, &sa, w, ws, d, NULL, &opts);
}

static dg_status run_wave(const dg_mega_moe_call *c, const expert *x, const pair *pairs, int64_t n, wave_mem *m) {
    const dg_symm_buffer *b = c->buf;
    const int64_t H = b->cfg.hidden, I = x->inter, K = b->cfg.num_topk;
    const int nv = x->kind == KIND_NVFP4, blk = x->kind == KIND_FP8_BLOCK;
    const char *api = dg_api_name();

    for (int64_t i = 0; i < n; ++i) /* dispatch: pull the rows from their source ranks */
        gather_row(c, x, &pairs[i], i, m);

    /* L1: BF16 D, except NVFP4's float32 D, which its gate / up scales multiply before rounding,
     * and SM90's, which SwiGLU takes unrounded. */
    float *hf = m->tmp, *af = m->tmp + n * 2 * I;
    dg_tensor hd = dg_tensor_2d(m->h, DG_BFLOAT16, n, 2 * I), od = dg_tensor_2d(m->o, DG_BFLOAT16, n, H);
    dg_tensor hf_t = dg_tensor_2d(hf, DG_FLOAT32, n, 2 * I), af_t = dg_tensor_2d(af, DG_FLOAT32, n, I);
    if (layer_gemm(x, 1, m->a_in, m->sf_in, n, H, nv || blk ? &hf_t : &hd) != DG_OK)
        return step_failed(api, "L1 GEMM", x->who);
    dg_api_begin(api);

    /* SwiGLU with clamp or SiTU, and the top-k weight (the reference's steps, vectorised:
     * kernels/moe_act_kernels.h),
     * between bulk conversions that give the reference's bits: the L1 output to float, then
     * the activations to E4M3 with per-1x32 UE8M0 scales (per_token_cast_to_fp8's kernels:
     * the reference's quantisation) or to BF16. NVFP4: the gate / up scales and BF16 rounding
     * first, no top-k weight (applied after L2), and the NVFP4 quantisation per row. */
    if (!nv && !blk && dg_cast(&hd, &hf_t) != DG_OK)
        return step_failed(api, "L1 output cast", x->who);
    const int threads = dg_num_threads();
    const dg_swiglu_row_fn swiglu = dg_swiglu_row_for(dg_get_isa());
    const dg_situ_row_fn situ = dg_situ_row_for(dg_get_isa());
#pragma omp parallel for num_threads(threads) schedule(static) if (n * I >= 32768)
    for (int64_t i = 0; i < n; ++i) {
        const pair *p = &pairs[i];
        const float *wts = (const float *)dg_symm_area(b, p->rank, b->lay.topk_weights);
        const float w = x->shared_y || nv ? 1.0f : wts[p->token * K + p->slot];
        float *h = hf + i * 2 * I;
        if (nv)
            for (int64_t j = 0; j < I; ++j) {
                h[j] = bf16_round(h[j] * x->alpha_gate);
                h[I + j] = bf16_round(h[I + j] * x->alpha_up);
            }
        if (c->situ)
            situ(h, I, c->situ_beta, c->situ_linear_beta, w, af + i * I);
        else
            swiglu(h, I, c->clamp, w, af + i * I);
        if (nv)
            dg_ref_mega_moe_quantize_nvfp4(af + i * I, I, x->a2, (uint8_t *)m->act + i * (I / 2),
                                           m->act_sf + i * (I / 16));
        if (blk)
            dg_ref_mega_moe_quantize_fp8_pow2(af + i * I, I, (uint8_t *)m->act + i * I,
                                              m->act_sf + i * (I / DG_MEGA_MOE_SM90_ACT_GRAN));
    }
    if (!nv && !blk) {
        dg_tensor act = dg_tensor_2d(m->act, x->kind == KIND_FP8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16, n, I);
        dg_tensor act_sf = dg_tensor_2d(m->act_sf, DG_INT32, n, dg_ceil_div(I, 128)); /* packed UE8M0 */
        /* (A NaN activation: per_token_cast_to_fp8's block amax propagates it where the reference's
         * skips it, so their codes and scales differ in that block; but any NaN in a row makes
         * that row's whole L2 output NaN, so y is the same either way; tests/test_mega_moe_fused.c,
         * test_nan_activations.) */
        const dg_status st = x->kind == KIND_FP8 ? dg_per_token_cast_to_fp8(&af_t, 1, DG_MEGA_MOE_ACT_GRAN, 1, &act, &act_sf)
                                                 : dg_cast(&af_t, &act);
        if (st != DG_OK)
            return step_failed(api, "activation cast", x->who);
        dg_api_begin(api);
    }

    dg_tensor of_t = dg_tensor_2d(m->of, DG_FLOAT32, n, H);
    if (layer_gemm(x, 2, m->act, m->act_sf, n, I, nv ? &of_t : &od) != DG_OK)
        return step_failed(api, "L2 GEMM", x->who);
    dg_api_begin(api);

    if (nv) { /* o = BF16((acc * g) * alpha2), then the top-k weight: BF16(o * w) */
#pragma omp parallel for num_threads(threads) schedule(static) if (n * H >= 65536)
        for (int64_t i = 0; i < n; ++i) {
            const pair *p = &pairs[i];
            const float w = ((const float *)dg_symm_area(b, p->rank, b->lay.topk_weights))[p->token * K + p->slot];
            for (int64_t col = 0; col < H; ++col)
                m->o[i * H + col] = dg_float_to_bf16(bf16_round((m->of[i * H + col] * x->a2) * x->alpha2) * w);
        }
    }

    for (int64_t i = 0; i < n; ++i) { /* combine, first half: the row into its source's area */
        const pair *p = &pairs[i];
        uint16_t *dst = x->shared_y ? x->shared_y + p->token * H
                                    : (uint16_t *)dg_symm_area(b, p->rank, b->lay.combine) + (p->token * K + p->slot) * H;
        memcpy(dst, m->o + i * H, (size_t)H * 2);
    }
    return DG_OK;
}

static float entry(const dg_tensor *t, int64_t i, int64_t j) {
    return t ? *(const float *)dg_ptr2(t, i, j) : 1.0f;
}

dg_status dg_mega_moe_experts(const dg_mega_moe_call *c) {
    const dg_symm_buffer *b = c->buf;
    const int R = b->cfg.num_ranks, me = b->cfg.rank;
    const int64_t E = b->cfg.num_experts, epr = E / R, lo = epr * me, K = b->cfg.num_topk;
    const int64_t H = b->cfg.hidden, I = b->cfg.intermediate_hidden;
    const int64_t shared_rows = c->shared_y ? c->num_tokens[me] : 0;
    const int64_t I_max = c->shared_y && b->cfg.num_shared_experts > 1 ? b->cfg.num_shared_experts * I : I;
    const int nv = c->nvfp4;
    const wave_kind routed_kind = nv ? KIND_NVFP4 : c->sm90 ? KIND_FP8_BLOCK : c->fp8 ? KIND_FP8 : KIND_BF16;

    /* Routing, with the range check every rank makes identically on the same data. */
    int64_t *start = dg_calloc((size_t)epr + 1, sizeof *start);
    if (!start)
        return dg_fail(DG_ERR_ALLOC, "cannot allocate the routing table (%lld experts)", (long long)epr);
    for (int r = 0; r < R; ++r)
        for (int64_t t = 0; t < c->num_tokens[r]; ++t)
            for (int64_t j = 0; j < K; ++j) {
                const int64_t e = topk_at(b, r, t, j);
                if (e < -1 || e >= E) {
                    dg_free(start);
                    return dg_fail(DG_ERR_VALUE,
                                   "rank %d's topk_idx: entry [%lld, %lld] is %lld, outside [-1, num_experts = %lld)",
                                   r, (long long)t, (long long)j, (long long)e, (long long)E);
                }
                if (e >= lo && e < lo + epr)
                    ++start[e - lo + 1];
            }
    for (int64_t e = 0; e < epr; ++e) {
        c->recv[e] = start[e + 1];
        start[e + 1] += start[e];
    }
    const int64_t total = start[epr];
    int64_t most = shared_rows;
    for (int64_t e = 0; e < epr; ++e)
        most = c->recv[e] > most ? c->recv[e] : most;

    /* Routed pairs by expert, then the shared expert's: this rank's tokens in order. */
    pair *pairs = dg_calloc((size_t)(total + shared_rows) + 1, sizeof *pairs);
    int64_t *fill = dg_calloc((size_t)epr + 1, sizeof *fill);
    const int64_t waves = wave_rows(b, I_max, nv), W = most < waves ? most : waves; /* 0: nothing to run */
    const int nv_int_sf = nv && c->l1_sf && c->l1_sf->dtype == DG_INT32; /* scales to convert per expert */
    wave_mem m = {0};
    if (W > 0) {
        m.a_in = dg_malloc((size_t)(W * H) * 2);
        m.sf_in = dg_malloc((size_t)(W * (nv ? H / 16 : b->lay.sf_cols) + 1) * 4);
        m.h = dg_malloc((size_t)(W * 2 * I_max) * 2);
        m.act = dg_malloc((size_t)(W * I_max) * 2);
        m.act_sf = dg_malloc((size_t)(W * (dg_ceil_div(I_max, nv ? 16 : DG_MEGA_MOE_ACT_GRAN) + 1)) * 4);
        m.o = dg_malloc((size_t)(W * H) * 2);
        m.tmp = dg_malloc((size_t)(W * 3 * I_max) * 4);
        if (nv)
            m.of = dg_malloc((size_t)(W * H) * 4);
        if (nv_int_sf) {
            m.s1f = dg_malloc((size_t)(2 * I * (H / 16)) * 4);
            m.s2f = dg_malloc((size_t)(H * (I / 16)) * 4);
        }
    }
    dg_status st = DG_OK;
    if (!pairs || !fill ||
        (W > 0 && (!m.a_in || !m.sf_in || !m.h || !m.act || !m.act_sf || !m.o || !m.tmp || (nv && !m.of) ||
                   (nv_int_sf && (!m.s1f || !m.s2f))))) {
        st = dg_fail(DG_ERR_ALLOC, "cannot allocate the expert waves (%lld rows of hidden %lld)", (long long)W,
                     (long long)H);
        goto done;
    }
    for (int q = 0; q < 256; ++q)
        m.lut[q] = dg_e4m3_to_float((uint8_t)q);
    for (int r = 0; r < R; ++r)
        for (int64_t t = 0; t < c->num_tokens[r]; ++t)
            for (int64_t j = 0; j < K; ++j) {
                const int64_t e = topk_at(b, r, t, j) - lo;
                if (e >= 0 && e < epr)
                    pairs[start[e] + fill[e]++] = (pair){.rank = r, .slot = (int32_t)j, .token = t};
            }
    for (int64_t t = 0; t < shared_rows; ++t)
        pairs[total + t] = (pair){.rank = me, .slot = -1, .token = t};

    expert x = {.kind = routed_kind, .inter = I, .alpha_gate = 1.0f, .alpha_up = 1.0f, .alpha2 = 1.0f, .a2 = 1.0f};
    for (int64_t e = 0; e < epr && st == DG_OK; ++e) {
        if (start[e + 1] == start[e])
            continue;
        if (c->l1p) {
            x.p1 = &c->l1p->group[e], x.p2 = &c->l2p->group[e];
        } else {
            x.w1 = group_view(c->l1, e), x.w2 = group_view(c->l2, e);
            if (c->fp8 || nv || c->sm90)
                x.s1 = group_view(c->l1_sf, e), x.s2 = group_view(c->l2_sf, e);
        }
        if (nv_int_sf) {
            nvfp4_scales(c->l1_sf, e, 2 * I, H / 64, m.lut, m.s1f);
            nvfp4_scales(c->l2_sf, e, H, I / 64, m.lut, m.s2f);
            x.s1 = dg_tensor_2d(m.s1f, DG_FLOAT32, 2 * I, H / 16);
            x.s2 = dg_tensor_2d(m.s2f, DG_FLOAT32, H, I / 16);
        }
        if (nv) {
            x.alpha_gate = entry(c->l1_alphas, e, 0), x.alpha_up = entry(c->l1_alphas, e, 1);
            x.alpha2 = c->l2_alphas ? ((const float *)c->l2_alphas->data)[e * c->l2_alphas->strides[0]] : 1.0f;
            x.a2 = c->a2_scales ? ((const float *)c->a2_scales->data)[e * c->a2_scales->strides[0]] : 1.0f;
        }
        snprintf(x.who, sizeof x.who, "local expert %lld", (long long)e);
        for (int64_t i = start[e]; i < start[e + 1] && st == DG_OK; i += W)
            st = run_wave(c, &x, pairs + i, start[e + 1] - i < W ? start[e + 1] - i : W, &m);
    }
    if (shared_rows > 0 && st == DG_OK) {
        expert sx = {.kind = nv ? KIND_BF16 : routed_kind, .p1 = c->shared_l1p, .p2 = c->shared_l2p,
                     .inter = b->cfg.num_shared_experts * I, .shared_y = c->shared_y};
        if (!c->shared_l1p) {
            sx.w1 = *c->shared_l1, sx.w2 = *c->shared_l2;
            if (c->fp8)
                sx.s1 = *c->shared_l1_sf, sx.s2 = *c->shared_l2_sf;
        }
        snprintf(sx.who, sizeof sx.who, "the shared expert%s", b->cfg.num_shared_experts > 1 ? "s" : "");
        for (int64_t i = 0; i < shared_rows && st == DG_OK; i += W)
            st = run_wave(c, &sx, pairs + total + i, shared_rows - i < W ? shared_rows - i : W, &m);
    }
done:
    dg_free(start);
    dg_free(pairs);
    dg_free(fill);
    dg_free(m.a_in);
    dg_free(m.sf_in);
    dg_free(m.h);
    dg_free(m.act);
    dg_free(m.act_sf);
    dg_free(m.o);
    dg_free(m.tmp);
    dg_free(m.of);
    dg_free(m.s1f);
    dg_free(m.s2f);
    return st;
}

size_t dg_mega_moe_combine_scratch_bytes(const dg_symm_buffer *b, int threads) {
    const size_t per = ((size_t)(b->cfg.num_topk + 1) * sizeof(void *) + (size_t)b->cfg.hidden * 2 + 63) & ~(size_t)63;
    return (size_t)threads * per;
}

void dg_mega_moe_combine(const dg_mega_moe_call *c, void *scratch, int threads) {
    const dg_symm_buffer *b = c->buf;
    const int me = b->cfg.rank;
    const int64_t K = b->cfg.num_topk, H = b->cfg.hidden, T = c->num_tokens[me];
    const uint16_t *area = (const uint16_t *)dg_symm_area(b, me, b->lay.combine);
    const size_t per_thread = dg_mega_moe_combine_scratch_bytes(b, 1);
#pragma omp parallel num_threads(threads) if (T * K * H >= 65536)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        char *mine = (char *)scratch + (size_t)tid * per_thread;
        /* slots[0]: the shared expert's row (summed first) or NULL; slots[1 + j]: slot j's */
        const uint16_t **slots = (const uint16_t **)(void *)mine;
        uint16_t *row = (uint16_t *)(void *)(mine + (size_t)(K + 1) * sizeof(void *));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; ++t) {
            /* NVFP4 adds its shared experts after the routed sum and its scaling (upstream's
             * order); the other calls sum them first. */
            slots[0] = c->shared_y && !c->nvfp4 ? c->shared_y + t * H : NULL;
            for (int64_t j = 0; j < K; ++j)
                slots[1 + j] = topk_at(b, me, t, j) >= 0 ? area + (t * K + j) * H : NULL;
            dg_mega_moe_combine_row(slots, K + 1, H, row);
            if (c->nvfp4)
                for (int64_t col = 0; col < H; ++col) {
                    uint16_t v = dg_float_to_bf16(dg_bf16_to_float(row[col]) * c->routed_scaling_factor);
                    if (c->shared_y)
                        v = dg_float_to_bf16(dg_bf16_to_float(v) + dg_bf16_to_float(c->shared_y[t * H + col]));
                    row[col] = v;
                }
            for (int64_t col = 0; col < H; ++col)
                *(uint16_t *)dg_ptr2(c->y, t, col) = row[col];
        }
    }
    if (c->stats) {
        int32_t *s = (int32_t *)c->stats->data;
        for (int64_t e = 0; e < b->cfg.num_experts / b->cfg.num_ranks; ++e)
            s[e] = (int32_t)((uint32_t)s[e] + (uint32_t)c->recv[e]); /* wraps like the GPU's red.add */
    }
}
