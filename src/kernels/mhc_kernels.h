/*
 * mhc_kernels.h - the per-token row kernels of the fast dg_mega_mhc (engine/mega_mhc.c): step 1
 * (the post mix into new_residual) and step 4 (the collapse, RMSNorm and y), in a portable and an
 * AVX2 version chosen by ISA level. Each element takes the reference's operations in the
 * reference's order (src/reference/ref_mhc.c, include/deepgemm.h): products and sums rounded one
 * by one, never fused into FMAs (the AVX2 file is compiled with -ffp-contract=off for that), so
 * every level gives the reference's bits.
 */
#ifndef DG_KERNELS_MHC_KERNELS_H
#define DG_KERNELS_MHC_KERNELS_H

#include "../core/internal.h"
#include "../engine/engine.h"

/* Partial sums of the RMSNorm's mean of squares: lane l takes h = l mod 8 (as DG_MHC_LANES). */
#define DG_MHC_KERNEL_LANES 8

typedef struct dg_mhc_kernels {
    const char *name;
    /* One token, hidden [0, H): out[j][h] = bf16(x[h] * post[j] + e_j[h]) with
     * e_j = comb[0][j] * res[0][h], then e_j += comb[i][j] * res[i][h] for i = 1 .. hc-1
     * (comb row-major [hc][hc]; res and out [hc][H] BF16). */
    void (*post)(int hc, int64_t H, const uint16_t *x, const uint16_t *res, const float *post, const float *comb,
                 uint16_t *out);
    /* s[h] = bf16-rounded (nr[0][h] * w[0] + ... + nr[hc-1][h] * w[hc-1]), in that order, and
     * lane[l] = sum over h = l mod 8 (h increasing) of s[h]^2 (nr [hc][H] BF16). */
    void (*collapse)(int hc, int64_t H, const uint16_t *nr, const float *w, float *s,
                     float lane[DG_MHC_KERNEL_LANES]);
    /* y[h] = bf16((s[h] * r) * ws[h]). */
    void (*scale)(int64_t H, const float *s, float r, const float *ws, uint16_t *y);
} dg_mhc_kernels;

const dg_mhc_kernels *dg_mhc_kernels_for(dg_isa isa);

/* The post pass's columns [h0, H) one by one (the vector kernels' tails), in the reference's
 * order; included by files compiled with -ffp-contract=off, so no product and sum fuse. */
static inline void dg_mhc_post_tail(int hc, int64_t H, int64_t h0, const uint16_t *x, const uint16_t *res,
                                    const float *post, const float *comb, uint16_t *out) {
    for (int j = 0; j < hc; ++j)
        for (int64_t h = h0; h < H; ++h) {
            float e = comb[j] * dg_engine_bf16_f32(res[h]);
            for (int i = 1; i < hc; ++i)
                e += comb[i * hc + j] * dg_engine_bf16_f32(res[i * H + h]);
            out[j * H + h] = dg_engine_f32_bf16(dg_engine_bf16_f32(x[h]) * post[j] + e);
        }
}

void dg_mhc_post_generic(int hc, int64_t H, const uint16_t *x, const uint16_t *res, const float *post,
                         const float *comb, uint16_t *out);
void dg_mhc_collapse_generic(int hc, int64_t H, const uint16_t *nr, const float *w, float *s,
                             float lane[DG_MHC_KERNEL_LANES]);
void dg_mhc_scale_generic(int64_t H, const float *s, float r, const float *ws, uint16_t *y);
#if defined(__x86_64__) || defined(_M_X64)
#define DG_MHC_HAVE_AVX2 1
void dg_mhc_post_avx2(int hc, int64_t H, const uint16_t *x, const uint16_t *res, const float *post,
                      const float *comb, uint16_t *out);
void dg_mhc_collapse_avx2(int hc, int64_t H, const uint16_t *nr, const float *w, float *s,
                          float lane[DG_MHC_KERNEL_LANES]);
void dg_mhc_scale_avx2(int64_t H, const float *s, float r, const float *ws, uint16_t *y);
void dg_mhc_post_avx512(int hc, int64_t H, const uint16_t *x, const uint16_t *res, const float *post,
                        const float *comb, uint16_t *out);
void dg_mhc_scale_avx512(int64_t H, const float *s, float r, const float *ws, uint16_t *y);
#else
#define DG_MHC_HAVE_AVX2 0
#endif

#endif /* DG_KERNELS_MHC_KERNELS_H */
