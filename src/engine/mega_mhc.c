/*
 * mega_mhc.c - the fast dg_mega_mhc: three passes over the tokens.
 *   1. new_residual (step 1), token-parallel;
 *   2. the mixes and square sums (step 2): dg_hc_prenorm_fast on new_residual as [T, hc * H],
 *      fn as b, one split, into scratch (its own threads, its bits per ISA level);
 *   3. per token: the mix epilogue (step 3, the reference's dg_mhc_mix_token), the collapse and
 *      RMSNorm (step 4), the FP8 quantization (the reference's dg_mhc_quant_token, its codes from
 *      the level's run kernels: the same bits).
 * Steps 1 and 4 run as passes over one token's hidden vector that add one route at a time, so
 * every element sees the reference's operations in the reference's order while each pass is a
 * plain loop the compiler vectorises; the mean of squares keeps the reference's 8 lanes. So a
 * token's bits depend only on the token (never on T or the thread count), and equal the
 * reference's whenever the GEMM's do.
 */
#include "mega_mhc.h"

#include "../kernels/hc_prenorm_kernels.h"
#include "engine.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Per thread: step 4's route sum (float [H]) and, when y_bf16 is not wanted, y's row (BF16 [H]);
 * step 1's widened block (post_token: float [(hc + 1) * POST_BLOCK]) reuses the same memory. */
#define POST_BLOCK 256
static size_t thread_floats(int64_t H, int hc) {
    const int64_t step4 = H + dg_ceil_div(H, 2), step1 = (int64_t)(hc + 1) * POST_BLOCK;
    return (size_t)dg_align(step4 > step1 ? step4 : step1, 16);
}

/* Step 1 for token t over blocks of POST_BLOCK hidden elements: each block of the hc residual
 * rows and of x is widened once into r (float [(hc + 1) * POST_BLOCK] scratch), then every
 * output row j takes the reference's operations in its order (c0 * r0, then + ci * ri for
 * i = 1 .. hc-1, then x * post_j + e, rounded once), as plain loops the compiler vectorises. */
static void post_token(const dg_mhc_call *c, int64_t t, float *restrict r) {
    const int hc = c->hc;
    const int64_t H = c->h;
    const uint16_t *x = c->x + t * H, *res = c->residual + t * hc * H;
    const float *post = c->post_mix + t * hc, *comb = c->comb + t * hc * hc;
    float *restrict xf = r + (size_t)hc * POST_BLOCK;
    for (int64_t h0 = 0; h0 < H; h0 += POST_BLOCK) {
        const int64_t n = H - h0 < POST_BLOCK ? H - h0 : POST_BLOCK;
        for (int i = 0; i < hc; ++i) {
            const uint16_t *restrict src = res + i * H + h0;
            float *restrict dst = r + (size_t)i * POST_BLOCK;
            for (int64_t h = 0; h < n; ++h)
                dst[h] = dg_engine_bf16_f32(src[h]);
        }
        for (int64_t h = 0; h < n; ++h)
            xf[h] = dg_engine_bf16_f32(x[h0 + h]);
        for (int j = 0; j < hc; ++j) {
            float e[POST_BLOCK];
            const float c0 = comb[j];
            for (int64_t h = 0; h < n; ++h)
                e[h] = c0 * r[h];
            for (int i = 1; i < hc; ++i) {
                const float ci = comb[i * hc + j];
                const float *restrict ri = r + (size_t)i * POST_BLOCK;
                for (int64_t h = 0; h < n; ++h)
                    e[h] += ci * ri[h];
            }
            uint16_t *restrict out = c->new_residual + (t * hc + j) * H + h0;
            const float pj = post[j];
            for (int64_t h = 0; h < n; ++h)
                out[h] = dg_engine_f32_bf16(xf[h] * pj + e[h]);
        }
    }
}

/* Step 4 for token t with collapse weights w [hc]; ws [H] = weight * rmsnorm_scale. */
static void norm_token(const dg_mhc_call *c, int64_t t, const float *w, const float *restrict ws,
                       float *restrict s, uint16_t *restrict ybuf, const dg_convert_kernels *ck) {
    const int hc = c->hc;
    const int64_t H = c->h;
    const uint16_t *restrict nr = c->new_residual + t * hc * H;
    const float w0 = w[0];
    for (int64_t h = 0; h < H; ++h)
        s[h] = dg_engine_bf16_f32(nr[h]) * w0;
    for (int j = 1; j < hc; ++j) {
        const uint16_t *restrict rj = nr + j * H;
        const float wj = w[j];
        for (int64_t h = 0; h < H; ++h)
            s[h] += dg_engine_bf16_f32(rj[h]) * wj;
    }
    for (int64_t h = 0; h < H; ++h)
        s[h] = dg_engine_bf16_f32(dg_engine_f32_bf16(s[h]));
    float lane[DG_MHC_LANES] = {0};
    const int64_t body = H / DG_MHC_LANES * DG_MHC_LANES;
    for (int64_t h = 0; h < body; h += DG_MHC_LANES)
        for (int l = 0; l < DG_MHC_LANES; ++l)
            lane[l] += s[h + l] * s[h + l];
    for (int64_t h = body; h < H; ++h)
        lane[h - body] += s[h] * s[h];
    const float ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    const float r = 1.0f / sqrtf(ss / (float)H + c->rms_eps);
    uint16_t *restrict y = c->y_bf16 ? c->y_bf16 + t * H : ybuf;
    for (int64_t h = 0; h < H; ++h)
        y[h] = dg_engine_f32_bf16((s[h] * r) * ws[h]);
    if (c->y_fp8)
        dg_mhc_quant_token(c, t, y, ck);
}

dg_status dg_mega_mhc_fast(const dg_mhc_call *c) {
    const int64_t T = c->t, H = c->h, N = c->n, hc = c->hc;
    int threads = dg_num_threads();
    if ((int64_t)threads > T)
        threads = (int)T;
    const bool par = T * hc * H >= 32768; /* below this a thread costs more than it saves */
    const size_t per = thread_floats(H, (int)hc);
    const dg_convert_kernels *ck = dg_convert_kernels_for(dg_get_isa()); /* E4M3 codes at register speed */
    /* mixes [T, N], square sums [T], ws [H], then per-thread buffers */
    const size_t head = (size_t)dg_align(T * (N + 1) + H, 16);
    const size_t bytes = (head + (size_t)threads * per) * sizeof(float);
    float *mix = dg_malloc(bytes);
    DG_CHECK(mix != NULL, DG_ERR_ALLOC, "cannot allocate %zu bytes of scratch memory", bytes);
    float *sqr = mix + T * N, *ws = sqr + T, *bufs = mix + head;
    for (int64_t h = 0; h < H; ++h)
        ws[h] = dg_engine_bf16_f32(c->rms_weight[h]) * c->rms_scale;
    DG_PATH("prenorm engine + per-token passes | first: t=%lld hidden=%lld hc_mult=%lld", (long long)T,
            (long long)H, (long long)hc);

#pragma omp parallel for schedule(static) num_threads(threads) if (par)
    for (int64_t t = 0; t < T; ++t) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        post_token(c, t, bufs + (size_t)tid * per);
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
        norm_token(c, t, c->shifted_prev_mix ? c->shifted_prev_mix + t * hc : pre, ws, buf,
                   (uint16_t *)(void *)(buf + H), ck);
    }
    dg_free(mix);
    return DG_OK;
}
