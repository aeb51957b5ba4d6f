/*
 * test_engine_order.c - the engine's accumulation order (src/engine/engine.h, "Accumulation
 * order") pinned against a scalar model of it, bitwise, on every path a BF16 GEMM can take:
 * the decode kernels (M <= 8), the small-M kernels, the large-M loop, pre-packed B (small and
 * large M), the m-grouped masked GEMM, and einsum on the batched engine ('bhr,hdr->bhd', and
 * 'bmk,bnk->mn' whose K runs over the batch, with its extra level of group sums: batched.h).
 * The model: K padded to even, cut into blocks of DG_ACC_BLOCK; per block a float32 FMA chain
 * from 0 over the k pairs (high element first); the blocks' sums added in order. The model's result also differs from one chain over all
 * of K on these inputs (checked), so the test fails if a path falls back to the long chain.
 * Runs on every kernel variant of this CPU except AMX, whose tile unit sums in its own way
 * (engine.h); VDPBF16PS gives the same bits here (no denormal products in these inputs).
 * On AMX the BF16 einsum's own order (blocks added in float64, batched.h) is pinned against
 * the model built from dense GEMMs over its blocks (common/amx_einsum_model.h), both forms,
 * K' over segments included, and shown to differ from one tile chain over K.
 */
#include "test_util.h"

#include "common/amx_einsum_model.h"
#include "common/engine_variants.h"
#include "engine/batched.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* BF16 values of mixed magnitudes (2^-6 .. 2^6), so partial sums round often. */
static void fill_bf16(tu_rng *r, dg_tensor *t) {
    uint16_t *p = t->data;
    const int64_t n = dg_tensor_numel(t);
    for (int64_t i = 0; i < n; ++i)
        p[i] = dg_float_to_bf16((float)(tu_normal(r) * ldexp(1.0, (int)tu_randint(r, -6, 6))));
}

/* x, y: k BF16 values at strides sx, sy. blocks = 0: one chain over K; 1: the engine's order
 * (blocks of DG_ACC_BLOCK added in order); G > 1: the segmented order of batched.h (runs of G
 * blocks summed in order, the run sums added in order). */
static float model_dot(const uint16_t *x, int64_t sx, const uint16_t *y, int64_t sy, int64_t k, int blocks) {
    const int64_t kp = k + (k & 1), blk = blocks ? DG_ACC_BLOCK : kp;
    const int64_t run = blocks > 1 ? blocks : INT64_MAX;
    float total = 0.0f, group = 0.0f;
    for (int64_t k0 = 0, nb = 0; k0 < kp; k0 += blk, ++nb) {
        float acc = 0.0f;
        for (int64_t kk = k0; kk < k0 + blk && kk < kp; kk += 2) {
            const float x1 = kk + 1 < k ? dg_bf16_to_float(x[(kk + 1) * sx]) : 0.0f;
            const float y1 = kk + 1 < k ? dg_bf16_to_float(y[(kk + 1) * sy]) : 0.0f;
            acc = fmaf(x1, y1, acc);
            acc = fmaf(dg_bf16_to_float(x[kk * sx]), dg_bf16_to_float(y[kk * sy]), acc);
        }
        if (blocks <= 1) {
            total = blocks ? total + acc : acc;
            continue;
        }
        group = nb % run ? group + acc : acc;
        if (nb % run == run - 1 || k0 + blk >= kp)
            total += group;
    }
    return total;
}

/* D [m, n] float32 against the model for A [m, k], B [n, k] (row strides lda, ldb), in the
 * order `blocks` (model_dot). *differs: set where the order's result is not that of the next
 * simpler one (one chain for the engine's order, the engine's order for the segmented one). */
static void expect_model(const char *what, const float *d, int64_t ldd, const uint16_t *a, int64_t lda,
                         const uint16_t *b, int64_t ldb, int64_t m, int64_t n, int64_t k, int blocks,
                         const char *kernel, int *differs) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            const float want = model_dot(a + i * lda, 1, b + j * ldb, 1, k, blocks);
            if (memcmp(&want, &d[i * ldd + j], 4) != 0 && bad++ == 0)
                first = i * n + j;
            if (model_dot(a + i * lda, 1, b + j * ldb, 1, k, blocks > 1 ? 1 : 0) != want)
                *differs = 1;
        }
    TU_CHECK(bad == 0, "%s (%s): %lld of %lld elements differ from the blocked-order model (first at %lld)", what,
             kernel, (long long)bad, (long long)(m * n), (long long)first);
}

static void dense_paths(const char *kernel, int *chain_differs) {
    tu_rng r = {7};
    const int64_t n = 45, k = 1001; /* 7 whole blocks, a tail, odd K */
    static const int64_t kMs[] = {1, 3, 17, 300};
    dg_tensor b = tu_alloc2(DG_BFLOAT16, n, k);
    fill_bf16(&r, &b);
    dg_packed_b *pb = NULL;
    TU_CHECK_OK(dg_pack_b(&b, NULL, NULL, &pb));
    for (size_t q = 0; q < sizeof kMs / sizeof kMs[0]; ++q) {
        const int64_t m = kMs[q];
        dg_tensor a = tu_alloc2(DG_BFLOAT16, m, k), d = tu_alloc2(DG_FLOAT32, m, n);
        fill_bf16(&r, &a);
        char what[64];
        TU_CHECK_OK(dg_bf16_gemm_nt(&a, &b, &d, NULL));
        snprintf(what, sizeof what, "bf16_gemm_nt M=%lld", (long long)m);
        expect_model(what, d.data, n, a.data, k, b.data, k, m, n, k, 1, kernel, chain_differs);
        TU_CHECK_OK(dg_bf16_gemm_nt_packed(&a, pb, &d, NULL));
        snprintf(what, sizeof what, "bf16_gemm_nt_packed M=%lld", (long long)m);
        expect_model(what, d.data, n, a.data, k, b.data, k, m, n, k, 1, kernel, chain_differs);
        tu_free(&a);
        tu_free(&d);
    }
    dg_packed_b_free(pb);
    tu_free(&b);
}

static void grouped_masked(const char *kernel, int *chain_differs) {
    tu_rng r = {8};
    const int64_t g = 3, mmax = 40, n = 33, k = 520;
    static const int32_t kRows[] = {1, 0, 37};
    dg_tensor a = tu_alloc3(DG_BFLOAT16, g, mmax, k), b = tu_alloc3(DG_BFLOAT16, g, n, k);
    dg_tensor d = tu_alloc3(DG_FLOAT32, g, mmax, n), mask = tu_alloc(DG_INT32, 1, &g);
    fill_bf16(&r, &a);
    fill_bf16(&r, &b);
    memcpy(mask.data, kRows, sizeof kRows);
    TU_CHECK_OK(dg_m_grouped_bf16_gemm_nt_masked(&a, &b, &d, &mask, 40, NULL));
    for (int64_t q = 0; q < g; ++q)
        expect_model("m_grouped_bf16_gemm_nt_masked", (const float *)d.data + q * mmax * n, n,
                     (const uint16_t *)a.data + q * mmax * k, k, (const uint16_t *)b.data + q * n * k, k, kRows[q], n,
                     k, 1, kernel, chain_differs);
    tu_free(&a);
    tu_free(&b);
    tu_free(&d);
    tu_free(&mask);
}

/* 'bmk,bnk->mn' on fresh inputs of shape kBmkShapes[q]: the einsum's float32 D, and A's and
 * B's rows with the segments one after the other, each padded with zeros to a multiple of
 * `step` (the padding the engine gives each segment: 2, or 32 on AMX): [M, K'] and [N, K']. */
static const int64_t kBmkShapes[2][4] = {{9, 7, 10, 51}, {19, 5, 33, 275}}; /* S, M, N, K */
typedef struct bmk_run {
    int64_t m, n, kcat; /* K' = S * padded K */
    dg_tensor d;
    uint16_t *ca, *cb;
} bmk_run;

static bool bmk_run_case(tu_rng *r, int q0, int64_t step, bmk_run *x) {
    const int64_t s = kBmkShapes[q0][0], m = kBmkShapes[q0][1], n = kBmkShapes[q0][2], k = kBmkShapes[q0][3];
    const int64_t kp = (k + step - 1) / step * step;
    dg_tensor a = tu_alloc3(DG_BFLOAT16, s, m, k), b = tu_alloc3(DG_BFLOAT16, s, n, k);
    *x = (bmk_run){m, n, s * kp, tu_alloc2(DG_FLOAT32, m, n), calloc((size_t)(m * s * kp), 2),
                   calloc((size_t)(n * s * kp), 2)};
    fill_bf16(r, &a);
    fill_bf16(r, &b);
    TU_CHECK_OK(dg_einsum("bmk,bnk->mn", &a, &b, &x->d, NULL));
    TU_CHECK(x->ca && x->cb, "out of memory");
    for (int64_t q = 0; q < s && x->ca && x->cb; ++q)
        for (int64_t kk = 0; kk < k; ++kk) {
            for (int64_t i = 0; i < m; ++i)
                x->ca[i * s * kp + q * kp + kk] = ((const uint16_t *)a.data)[(q * m + i) * k + kk];
            for (int64_t j = 0; j < n; ++j)
                x->cb[j * s * kp + q * kp + kk] = ((const uint16_t *)b.data)[(q * n + j) * k + kk];
        }
    tu_free(&a), tu_free(&b);
    return x->ca && x->cb;
}

static void bmk_run_free(bmk_run *x) {
    free(x->ca), free(x->cb);
    tu_free(&x->d);
}

/* 'bhr,hdr->bhd' on fresh inputs x [B, H, R], y [H, D, R] of kHeads: z [B, H, D] BF16. */
static const int64_t kHeads[4] = {5, 3, 700, 19}; /* B, H, R, D */
static void heads_case(tu_rng *r, dg_tensor *x, dg_tensor *y, dg_tensor *z) {
    *x = tu_alloc3(DG_BFLOAT16, kHeads[0], kHeads[1], kHeads[2]);
    *y = tu_alloc3(DG_BFLOAT16, kHeads[1], kHeads[3], kHeads[2]);
    *z = tu_alloc3(DG_BFLOAT16, kHeads[0], kHeads[1], kHeads[3]);
    fill_bf16(r, x);
    fill_bf16(r, y);
    TU_CHECK_OK(dg_einsum("bhr,hdr->bhd", x, y, z, NULL));
}

static void einsum_paths(const char *kernel, int *chain_differs) {
    tu_rng r = {9};
    { /* 'bhr,hdr->bhd' (BF16 out): per head a GEMM over r on strided views */
        const int64_t bb = kHeads[0], h = kHeads[1], rr = kHeads[2], dd = kHeads[3];
        dg_tensor x, y, z;
        heads_case(&r, &x, &y, &z);
        const uint16_t *xp = x.data, *yp = y.data;
        int64_t bad = 0;
        for (int64_t i = 0; i < bb; ++i)
            for (int64_t hh = 0; hh < h; ++hh)
                for (int64_t j = 0; j < dd; ++j) {
                    const uint16_t want = dg_float_to_bf16(model_dot(xp + (i * h + hh) * rr, 1, yp + (hh * dd + j) * rr,
                                                                     1, rr, 1));
                    bad += ((const uint16_t *)z.data)[(i * h + hh) * dd + j] != want;
                }
        TU_CHECK(bad == 0, "einsum bhr,hdr->bhd (%s): %lld elements differ from the model", kernel, (long long)bad);
        tu_free(&x);
        tu_free(&y);
        tu_free(&z);
    }
    /* 'bmk,bnk->mn': K' = the batch's segments of k (each padded to even) one after the other,
     * in the segmented order (batched.h): K' of 4 blocks (one group), then of 2.5 groups. */
    int group_differs = 0;
    for (int q0 = 0; q0 < 2; ++q0) {
        bmk_run x;
        if (bmk_run_case(&r, q0, 2, &x))
            expect_model("einsum bmk,bnk->mn", x.d.data, x.n, x.ca, x.kcat, x.cb, x.kcat, x.m, x.n, x.kcat,
                         DG_ACC_GROUP, kernel, &group_differs);
        bmk_run_free(&x);
    }
    TU_CHECK(group_differs, "einsum bmk,bnk->mn (%s): the inputs never tell the segmented order from the blocked "
             "one: the test could not fail", kernel);
}

/* D [m, n] (row stride ldd; FLOAT32, or BFLOAT16 when bf16) against the AMX einsum model for
 * A [m, k'] and B [n, k'] (contiguous rows); *differs: set where the model's float32 total is
 * not one tile chain over K' (the dense GEMM over all of it). */
static void expect_amx_model(const char *what, const void *d, bool bf16, int64_t ldd, const uint16_t *a,
                             const uint16_t *b, int64_t m, int64_t n, int64_t k, int *differs) {
    const dg_tensor av = dg_tensor_2d((void *)a, DG_BFLOAT16, m, k), bv = dg_tensor_2d((void *)b, DG_BFLOAT16, n, k);
    dg_tensor chain = tu_alloc2(DG_FLOAT32, m, n);
    float *want = malloc((size_t)(m * n + 1) * sizeof(float));
    TU_CHECK(want != NULL, "out of memory");
    TU_CHECK_OK(dg_bf16_gemm_nt(&av, &bv, &chain, NULL));
    int64_t bad = 0;
    if (want) {
        tu_amx_einsum_model(&av, &bv, want);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                if (bf16)
                    bad += dg_float_to_bf16(want[i * n + j]) != ((const uint16_t *)d)[i * ldd + j];
                else
                    bad += memcmp(&want[i * n + j], (const float *)d + i * ldd + j, 4) != 0;
                *differs |= memcmp(&want[i * n + j], (const float *)chain.data + i * n + j, 4) != 0;
            }
    }
    TU_CHECK(bad == 0, "%s (amx): %lld of %lld elements differ from the float64 order built from dense GEMMs", what,
             (long long)bad, (long long)(m * n));
    free(want);
    tu_free(&chain);
}

/* The BF16 einsum on AMX: 'bhr,hdr->bhd' with K = 700 (two runs, the second of one whole block
 * and one padded to 64), and 'bmk,bnk->mn' over segments padded to 32 (blocks spanning
 * segments, K' of 2 and of 19 runs; float32 outputs), against expect_amx_model. */
static void einsum_amx(int *chain_differs) {
    tu_rng r = {10};
    {
        const int64_t bb = kHeads[0], h = kHeads[1], rr = kHeads[2], dd = kHeads[3];
        dg_tensor x, y, z;
        heads_case(&r, &x, &y, &z);
        uint16_t *xh = malloc((size_t)(bb * rr) * 2);
        TU_CHECK(xh != NULL, "out of memory");
        for (int64_t hh = 0; hh < h && xh; ++hh) { /* head hh: rows x[:, hh, :] gathered */
            for (int64_t i = 0; i < bb; ++i)
                memcpy(xh + i * rr, (const uint16_t *)x.data + (i * h + hh) * rr, (size_t)rr * 2);
            expect_amx_model("einsum bhr,hdr->bhd", (const uint16_t *)z.data + hh * dd, true, h * dd, xh,
                             (const uint16_t *)y.data + hh * dd * rr, bb, dd, rr, chain_differs);
        }
        free(xh);
        tu_free(&x), tu_free(&y), tu_free(&z);
    }
    for (int q0 = 0; q0 < 2; ++q0) { /* AMX pads each segment to whole k steps of 32 */
        bmk_run x;
        if (bmk_run_case(&r, q0, 32, &x))
            expect_amx_model("einsum bmk,bnk->mn", x.d.data, false, x.n, x.ca, x.cb, x.m, x.n, x.kcat, chain_differs);
        bmk_run_free(&x);
    }
}

int main(void) {
    const dg_isa best = dg_get_isa();
    int chain_differs = 0;
    for (int v = 0; v < tu_engine_variants(best); ++v) {
        const dg_isa isa = tu_engine_variant_set(v);
        if (isa == DG_ISA_AMX) { /* the tile unit's own summation (engine.h): einsum's order only */
            int amx_differs = 0;
            einsum_amx(&amx_differs);
            TU_CHECK(amx_differs, "amx: the einsum inputs never tell the float64 order from one tile chain: the "
                     "test could not fail");
            continue;
        }
        const char *kernel = dg_engine_config(isa)->name;
        for (int decode = 1; decode >= 0; --decode) { /* decode kernels on, then M <= 8 on small-M */
            dg_engine_set_decode(decode);
            dense_paths(kernel, &chain_differs);
        }
        dg_engine_set_decode(1);
        grouped_masked(kernel, &chain_differs);
        einsum_paths(kernel, &chain_differs);
    }
    tu_engine_variants_done(best);
    TU_CHECK(chain_differs, "the inputs never tell the blocked order from one chain: the test could not fail");
    return tu_finish();
}
