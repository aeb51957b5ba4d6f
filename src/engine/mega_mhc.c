/*
 * mega_mhc.c - the fast dg_mega_mhc: three passes over the tokens.
 *   1. new_residual (step 1), token-parallel;
 *   2. the mixes and square sums (step 2): dg_hc_prenorm_fast on new_residual as [T, hc * H],
 *      fn as b, one split, into scratch (its own threads, its bits per ISA level);
 *   3. per token: the mix epilogue (step 3, the reference's dg_mhc_mix_token), the collapse and
 *      RMSNorm (step 4), the FP8 quantization (the reference's dg_mhc_quant_token, its codes from
 *      the level's run kernels: the same bits).
 * Steps 1 and 4 run the level's row kernels (kernels/mhc_kernels.h), which give every element
 * the reference's operations in the reference's order; the mean of squares keeps the
 * reference's 8 lanes. So a token's bits depend only on the token (never on T, the thread count
 * or the level's kernels), and equal the reference's whenever the GEMM's do.
 */
#include "mega_mhc.h"

#include "../kernels/hc_prenorm_kernels.h"
#include "../kernels/mhc_kernels.h"
#include "engine.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Per thread: step 4's route sum (float [H]) and, when y_bf16 is not wanted, y's row (BF16 [H]). */
static size_t thread_floats(int64_t H) { return (size_t)dg_align(H + dg_ceil_div(H, 2), 16); }

const dg_mhc_kernels *dg_mhc_kernels_for(dg_isa isa) {
    static const dg_mhc_kernels generic = {"generic", dg_mhc_post_generic, dg_mhc_collapse_generic,
                                           dg_mhc_scale_generic};
#if DG_MHC_HAVE_AVX2
    static const dg_mhc_kernels avx2 = {"avx2", dg_mhc_post_avx2, dg_mhc_collapse_avx2, dg_mhc_scale_avx2};
    static const dg_mhc_kernels avx512 = {"avx512", dg_mhc_post_avx512, dg_mhc_collapse_avx2, dg_mhc_scale_avx512};
    if (isa >= DG_ISA_AVX512)
        return &avx512;
    if (isa >= DG_ISA_AVX2)
        return &avx2;
#endif
    (void)isa;
    return &generic;
}

/* Step 4 for token t with collapse weights w [hc]; ws [H] = weight * rmsnorm_scale. */
static void norm_token(const dg_mhc_call *c, const dg_mhc_kernels *k, int64_t t, const float *w,
                       const float *restrict ws, float *restrict s, uint16_t *restrict ybuf,
                       const dg_convert_kernels *ck) {
    const int64_t H = c->h;
    float lane[DG_MHC_KERNEL_LANES];
    k->collapse(c->hc, H, c->new_residual + t * c->hc * H, w, s, lane);
    const float ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    const float r = 1.0f / sqrtf(ss / (float)H + c->rms_eps);
    uint16_t *restrict y = c->y_bf16 ? c->y_bf16 + t * H : ybuf;
    k->scale(H, s, r, ws, y);
    if (c->y_fp8)
        dg_mhc_quant_token(c, t, y, ck);
}

dg_status dg_mega_mhc_fast(const dg_mhc_call *c) {
    const int64_t T = c->t, H = c->h, N = c->n, hc = c->hc;
    int threads = dg_num_threads();
    if ((int64_t)threads > T)
        threads = (int)T;
    const bool par = T * hc * H >= 32768; /* below this a thread costs more than it saves */
    const size_t per = thread_floats(H);
    const dg_mhc_kernels *k = dg_mhc_kernels_for(dg_get_isa());
    const dg_convert_kernels *ck = dg_convert_kernels_for(dg_get_isa()); /* E4M3 codes at register speed */
    /* mixes [T, N], square sums [T], ws [H], then per-thread buffers */
    const size_t head = (size_t)dg_align(T * (N + 1) + H, 16);
    const size_t bytes = (head + (size_t)threads * per) * sizeof(float);
    float *mix = dg_malloc(bytes);
    DG_CHECK(mix != NULL, DG_ERR_ALLOC, "cannot allocate %zu bytes of scratch memory", bytes);
    float *sqr = mix + T * N, *ws = sqr + T, *bufs = mix + head;
    for (int64_t h = 0; h < H; ++h)
        ws[h] = dg_engine_bf16_f32(c->rms_weight[h]) * c->rms_scale;
    DG_PATH("prenorm engine + per-token passes (%s) | first: t=%lld hidden=%lld hc_mult=%lld", k->name,
            (long long)T, (long long)H, (long long)hc);

#pragma omp parallel for schedule(static) num_threads(threads) if (par)
    for (int64_t t = 0; t < T; ++t) {
        const int64_t H_ = c->h;
        k->post(c->hc, H_, c->x + t * H_, c->residual + t * c->hc * H_, c->post_mix + t * c->hc,
                c->comb + t * c->hc * c->hc, c->new_residual + t * c->hc * H_);
    }

    const dg_tensor a = dg_tensor_2d(c->new_residual, DG_BFLOAT16, T, hc * H);
    const dg_tensor d = dg_tensor_make(mix, DG_FLOAT32, 3, (int64_t[]){1, T, N});
    const dg_tensor s = dg_tensor_2d(sqr, DG_FLOAT32, 1, T);
    const dg_status st = dg_hc_prenorm_fast(&a, c->fn_t, &d, &s, 1);
    if (st != DG_OK) {
        dg_free(mix);
        return st;
    }

#pragma omp parallel for schedule(static) num_threads(threads) if (par)
    for (int64_t t = 0; t < T; ++t) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *buf = bufs + (size_t)tid * per;
        float pre[DG_MEGA_MHC_MAX_HC_MULT];
        dg_mhc_mix_token(c, mix + t * N, sqr[t], pre, c->new_post_mix + t * hc, c->new_comb + t * hc * hc);
        if (c->new_prev_mix)
            memcpy(c->new_prev_mix + t * hc, pre, (size_t)hc * sizeof(float));
        norm_token(c, k, t, c->shifted_prev_mix ? c->shifted_prev_mix + t * hc : pre, ws, buf,
                   (uint16_t *)(void *)(buf + H), ck);
    }
    dg_free(mix);
    return DG_OK;
}
