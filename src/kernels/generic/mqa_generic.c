/* mqa_generic.c - portable MQA logits kernels (see mqa_kernels.h): table conversion, a
 * transposing pack and a scalar tile with the same per-lane order as the vector kernels. */
#include "../mqa_kernels.h"

#include <string.h>

/* value * 2^-8 of every E4M3 code; filled once (the values are exact). */
static float g_e4m3[256];
static int g_e4m3_ready;

static const float *e4m3_table(void) {
    if (!__atomic_load_n(&g_e4m3_ready, __ATOMIC_ACQUIRE)) {
        for (int c = 0; c < 256; ++c)
            g_e4m3[c] = dg_e4m3_to_float((uint8_t)c) * DG_MQA_FP8_SCALE;
        __atomic_store_n(&g_e4m3_ready, 1, __ATOMIC_RELEASE);
    }
    return g_e4m3;
}

void dg_mqa_convert_generic(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *out) {
    const float *t8 = e4m3_table();
    for (int r = 0; r < n; ++r) {
        const uint8_t *row = rows[r];
        float *o = out + (int64_t)r * d;
        if (fmt != DG_MQA_FP4) {
            for (int64_t k = 0; k < d; ++k)
                o[k] = t8[row[k]];
            if (fmt == DG_MQA_MXFP8)
                dg_mqa_apply_mx_scales(o, d, sf[r]);
            continue;
        }
        for (int64_t k = 0; k < d; ++k) {
            const uint8_t code = (k & 1) ? (uint8_t)(row[k / 2] >> 4) : (uint8_t)(row[k / 2] & 15);
            o[k] = dg_e2m1_to_float(code) * dg_ue8m0_to_float((uint8_t)(sf[r] >> (8 * (k / 32))));
        }
    }
}

void dg_mqa_pack_generic(const uint8_t *const *rows, const uint32_t *sf, int n, int64_t d, int fmt, float *tmp,
                         float *panel, int nw) {
    dg_mqa_convert_generic(rows, sf, n, d, fmt, tmp);
    for (int64_t k = 0; k < d; ++k) {
        float *p = panel + k * nw;
        for (int c = 0; c < n; ++c)
            p[c] = tmp[(int64_t)c * d + k];
        for (int c = n; c < nw; ++c)
            p[c] = 0.0f;
    }
}

void dg_mqa_tile_generic(const float *q, int64_t h, int64_t d, const float *w, const float *panel, float *sum,
                      const uint8_t *const *pf, int npf) {
    for (int i = 0; i < npf; ++i)
        __builtin_prefetch(pf[i]);
    enum { NW = DG_MQA_NW_GENERIC };
    float acc[NW];
    for (int c = 0; c < NW; ++c)
        sum[c] = 0.0f;
    for (int64_t hh = 0; hh < h; ++hh) {
        for (int c = 0; c < NW; ++c)
            acc[c] = 0.0f;
        for (int64_t k = 0; k < d; ++k) {
            const float a = q[hh * d + k];
            for (int c = 0; c < NW; ++c)
                acc[c] = __builtin_fmaf(a, panel[k * NW + c], acc[c]);
        }
        for (int c = 0; c < NW; ++c)
            sum[c] = __builtin_fmaf(w[hh], acc[c] > 0.0f ? acc[c] : 0.0f, sum[c]);
    }
}
