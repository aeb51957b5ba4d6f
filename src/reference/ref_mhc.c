/* ref_mhc.c - reference Mega mHC (see ref_mhc.h and dg_mega_mhc in deepgemm.h). */
#include "ref_mhc.h"

#include "ref_hc.h"
#include "ref_quant.h"
#include "../core/float_math.h"

#include <math.h>
#include <string.h>

/* In place on an hc x hc matrix (e^x: core/float_math.h, the same bits on every machine):
 * softmax over each row, + eps, then columns divided by (column sum + eps); then iters - 1 rounds of rows and columns (DeepGEMM's reference). */
static void sinkhorn(float *m, int hc, int iters, float eps) {
    for (int i = 0; i < hc; ++i) {
        float *row = m + i * hc, mx = row[0], sum = 0.0f;
        for (int j = 1; j < hc; ++j)
            mx = row[j] > mx ? row[j] : mx;
        for (int j = 0; j < hc; ++j) {
            row[j] = dg_exp_f32(row[j] - mx);
            sum += row[j];
        }
        for (int j = 0; j < hc; ++j)
            row[j] = row[j] / sum + eps;
    }
    for (int it = 0; it < iters; ++it) {
        if (it > 0)
            for (int i = 0; i < hc; ++i) {
                float sum = 0.0f;
                for (int j = 0; j < hc; ++j)
                    sum += m[i * hc + j];
                for (int j = 0; j < hc; ++j)
                    m[i * hc + j] = m[i * hc + j] / (sum + eps);
            }
        for (int j = 0; j < hc; ++j) {
            float sum = 0.0f;
            for (int i = 0; i < hc; ++i)
                sum += m[i * hc + j];
            for (int i = 0; i < hc; ++i)
                m[i * hc + j] = m[i * hc + j] / (sum + eps);
        }
    }
}

void dg_mhc_mix_token(const dg_mhc_call *c, const float *mix, float sqr, float *pre, float *post, float *comb) {
    const int hc = c->hc;
    const float rs = 1.0f / sqrtf(sqr / (float)((int64_t)hc * c->h) + c->norm_eps);
    float v[DG_MEGA_MHC_MAX_HC_MULT * (DG_MEGA_MHC_MAX_HC_MULT + 2)];
    for (int n = 0; n < c->n; ++n) {
        const float scale = c->scales[n < hc ? 0 : n < 2 * hc ? 1 : 2];
        v[n] = (mix[n] * rs) * scale + c->bases[n];
    }
    for (int j = 0; j < hc; ++j) {
        pre[j] = dg_sigmoid_f32(v[j]) + c->pre_eps;
        post[j] = dg_sigmoid_f32(v[hc + j]) * c->post_scale;
    }
    memcpy(comb, v + 2 * hc, (size_t)hc * hc * sizeof(float));
    sinkhorn(comb, hc, c->iters, c->sk_eps);
}

void dg_mhc_quant_token(const dg_mhc_call *c, int64_t t, const uint16_t *y, const dg_convert_kernels *ck) {
    uint8_t *codes = c->y_fp8 + t * c->h;
    float scaled[DG_MHC_FP8_GRAN];
    for (int64_t w = 0; w < c->h / DG_MHC_SF_WORD; ++w) {
        uint32_t word = 0;
        for (int g = 0; g < 4; ++g) {
            const int64_t h0 = w * DG_MHC_SF_WORD + g * DG_MHC_FP8_GRAN;
            float amax = 0.0f;
            if (ck) {
                /* Fast path: |y| orders as its BF16 bits without the sign, NaNs above infinity, so
                 * the integer maximum is the loop's amax, or a NaN exactly when the loop's is one
                 * (which NaN never reaches the outputs: ref_group_scale sees only NaN-ness). */
                uint16_t top = 0;
                for (int i = 0; i < DG_MHC_FP8_GRAN; ++i) {
                    const uint16_t m = (uint16_t)(y[h0 + i] & 0x7fffu);
                    top = m > top ? m : top;
                }
                amax = dg_bf16_to_float(top);
            } else {
                for (int i = 0; i < DG_MHC_FP8_GRAN; ++i) {
                    const float a = fabsf(dg_bf16_to_float(y[h0 + i]));
                    amax = (isnan(a) || a > amax) ? a : amax; /* torch's amax: NaN sticks */
                }
            }
            const float sf = ref_group_scale(amax, DG_E4M3_MAX, true), r = 1.0f / sf;
            for (int i = 0; i < DG_MHC_FP8_GRAN; ++i) {
                const union { uint32_t u; float f; } v = {(uint32_t)y[h0 + i] << 16}; /* dg_bf16_to_float */
                scaled[i] = v.f * r;
            }
            if (ck)
                ck->f32_to_e4m3(scaled, codes + h0, DG_MHC_FP8_GRAN);
            else
                for (int i = 0; i < DG_MHC_FP8_GRAN; ++i)
                    codes[h0 + i] = dg_float_to_e4m3(scaled[i]);
            uint32_t bits;
            memcpy(&bits, &sf, 4);
            word |= ((bits >> 23) & 0xffu) << (8 * g);
        }
        c->sf[t * c->sf_stride_t + w * c->sf_stride_w] = (int32_t)word;
        if (c->shared_sf)
            c->shared_sf[dg_mhc_shared_row(t, c->shared_bm) + w * c->shared_stride_w] = (int32_t)word;
    }
}

/* Step 1 for token t. */
static void post_token(const dg_mhc_call *c, int64_t t) {
    const int hc = c->hc;
    const int64_t H = c->h;
    const uint16_t *x = c->x + t * H, *res = c->residual + t * hc * H;
    const float *post = c->post_mix + t * hc, *comb = c->comb + t * hc * hc;
    for (int j = 0; j < hc; ++j)
        for (int64_t h = 0; h < H; ++h) {
            float e = comb[j] * dg_bf16_to_float(res[h]);
            for (int i = 1; i < hc; ++i)
                e += comb[i * hc + j] * dg_bf16_to_float(res[i * H + h]);
            c->new_residual[(t * hc + j) * H + h] = dg_float_to_bf16(dg_bf16_to_float(x[h]) * post[j] + e);
        }
}

/* Step 4 for token t with collapse weights w [hc]; cbuf [h] floats, ybuf [h] BF16 scratch. */
static void norm_token(const dg_mhc_call *c, int64_t t, const float *w, float *cbuf, uint16_t *ybuf) {
    const int hc = c->hc;
    const int64_t H = c->h;
    const uint16_t *nr = c->new_residual + t * hc * H;
    float lane[DG_MHC_LANES] = {0};
    for (int64_t h = 0; h < H; ++h) {
        float s = dg_bf16_to_float(nr[h]) * w[0];
        for (int j = 1; j < hc; ++j)
            s += dg_bf16_to_float(nr[j * H + h]) * w[j];
        cbuf[h] = dg_bf16_to_float(dg_float_to_bf16(s));
        lane[h % DG_MHC_LANES] += cbuf[h] * cbuf[h];
    }
    const float ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    const float r = 1.0f / sqrtf(ss / (float)H + c->rms_eps);
    uint16_t *y = c->y_bf16 ? c->y_bf16 + t * H : ybuf;
    for (int64_t h = 0; h < H; ++h)
        y[h] = dg_float_to_bf16((cbuf[h] * r) * (dg_bf16_to_float(c->rms_weight[h]) * c->rms_scale));
    if (c->y_fp8)
        dg_mhc_quant_token(c, t, y, NULL);
}

dg_status dg_ref_mega_mhc(const dg_mhc_call *c) {
    const int64_t T = c->t, H = c->h, N = c->n;
    /* mixes [T, N], square sums [T], then one token's collapse (float) and y (BF16) */
    const size_t bytes = ((size_t)T * (size_t)(N + 1) + (size_t)H) * sizeof(float) + (size_t)H * 2;
    float *mix = dg_malloc(bytes);
    DG_CHECK(mix != NULL, DG_ERR_ALLOC, "cannot allocate %zu bytes of scratch memory", bytes);
    float *sqr = mix + T * N, *cbuf = sqr + T;
    uint16_t *ybuf = (uint16_t *)(void *)(cbuf + H);
    for (int64_t t = 0; t < T; ++t)
        post_token(c, t);
    /* Step 2 on the rounded new_residual, flattened to [T, hc * H]: one split */
    dg_tensor a = dg_tensor_2d(c->new_residual, DG_BFLOAT16, T, c->hc * H);
    dg_tensor d = dg_tensor_make(mix, DG_FLOAT32, 3, (int64_t[]){1, T, N});
    dg_tensor s = dg_tensor_2d(sqr, DG_FLOAT32, 1, T);
    dg_ref_hc_prenorm(&a, c->fn_t, &d, &s, 1);
    float pre[DG_MEGA_MHC_MAX_HC_MULT];
    for (int64_t t = 0; t < T; ++t) {
        dg_mhc_mix_token(c, mix + t * N, sqr[t], pre, c->new_post_mix + t * c->hc,
                         c->new_comb + t * c->hc * c->hc);
        if (c->new_prev_mix)
            memcpy(c->new_prev_mix + t * c->hc, pre, (size_t)c->hc * sizeof(float));
        norm_token(c, t, c->shifted_prev_mix ? c->shifted_prev_mix + t * c->hc : pre, cbuf, ybuf);
    }
    dg_free(mix);
    return DG_OK;
}
