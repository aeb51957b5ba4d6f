/*
 * mhc_generic.c - portable row kernels of the fast dg_mega_mhc (mhc_kernels.h), written for
 * auto-vectorization with baseline SSE2 (which has no FMA to fuse into).
 */
#include "../mhc_kernels.h"

#include "../../engine/engine.h"

/* Step 1 in blocks of POST_BLOCK elements: each block of the residual rows and x is widened
 * once, then every output row j runs its chain over the widened block. */
#define POST_BLOCK 256

void dg_mhc_post_generic(int hc, int64_t H, const uint16_t *x, const uint16_t *res, const float *post,
                         const float *comb, uint16_t *out) {
    float r[(DG_MEGA_MHC_MAX_HC_MULT + 1) * POST_BLOCK], e[POST_BLOCK];
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
            const float c0 = comb[j];
            for (int64_t h = 0; h < n; ++h)
                e[h] = c0 * r[h];
            for (int i = 1; i < hc; ++i) {
                const float ci = comb[i * hc + j];
                const float *restrict ri = r + (size_t)i * POST_BLOCK;
                for (int64_t h = 0; h < n; ++h)
                    e[h] += ci * ri[h];
            }
            uint16_t *restrict o = out + j * H + h0;
            const float pj = post[j];
            for (int64_t h = 0; h < n; ++h)
                o[h] = dg_engine_f32_bf16(xf[h] * pj + e[h]);
        }
    }
}

void dg_mhc_collapse_generic(int hc, int64_t H, const uint16_t *nr, const float *w, float *s,
                             float lane[DG_MHC_KERNEL_LANES]) {
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
    for (int l = 0; l < DG_MHC_KERNEL_LANES; ++l)
        lane[l] = 0.0f;
    const int64_t body = H / DG_MHC_KERNEL_LANES * DG_MHC_KERNEL_LANES;
    for (int64_t h = 0; h < body; h += DG_MHC_KERNEL_LANES)
        for (int l = 0; l < DG_MHC_KERNEL_LANES; ++l)
            lane[l] += s[h + l] * s[h + l];
    for (int64_t h = body; h < H; ++h)
        lane[h - body] += s[h] * s[h];
}

void dg_mhc_scale_generic(int64_t H, const float *s, float r, const float *ws, uint16_t *y) {
    for (int64_t h = 0; h < H; ++h)
        y[h] = dg_engine_f32_bf16((s[h] * r) * ws[h]);
}
