/*
 * test_gemm_grouped_m.c - m-grouped contiguous (index and psum layouts) and masked GEMMs against
 * the test's own naive formula (exact, bit for bit) and against float math on the unquantized
 * inputs (DeepGEMM's calc_diff thresholds). Padding rows of A hold NaN garbage and D starts as a
 * sentinel, so reading a padding row or writing outside the computed rows is caught.
 */
#include "test_gemm_grouped_common.h"

#define SENTINEL 0xA5

typedef struct mcase {
    const char *name;
    tq_kind ka, kb;
    int gran_k_a, gran_k_b, gran_n_b;
    int recipe[3], recipe_a[2], recipe_b[2];
    double max_diff; /* calc_diff bound against unquantized math */
} mcase;

static const mcase kBf16 = {"bf16", TQ_BF16, TQ_BF16, 1, 1, 1, {0}, {0}, {0}, 1e-5};
static const mcase kFp8Legacy = {"fp8 1D2D float", TQ_FP8_F32, TQ_FP8_F32, 128, 128, 128, {0}, {0}, {0}, 1e-3};
static const mcase kFp8Recipe = {"fp8 recipe (1,128,128)", TQ_FP8_F32, TQ_FP8_F32, 128, 128, 128, {1, 128, 128},
                                 {0}, {0}, 1e-3};
static const mcase kFp8Ue8m0 = {"fp8 1D1D packed ue8m0", TQ_FP8_UE8M0, TQ_FP8_UE8M0, 128, 128, 1, {0}, {0}, {0}, 1e-3};
static const mcase kFp8Fp4 = {"fp8 x fp4", TQ_FP8_UE8M0, TQ_FP4_UE8M0, 128, 32, 1, {0}, {1, 128}, {1, 32}, 1e-2};
static const mcase kFp4Fp4 = {"fp4 x fp4", TQ_FP4_UE8M0, TQ_FP4_UE8M0, 32, 32, 1, {0}, {1, 32}, {1, 32}, 2e-2};

static dg_gemm_options case_opts(const mcase *cs) {
    dg_gemm_options o = dg_gemm_options_default();
    memcpy(o.recipe, cs->recipe, sizeof o.recipe);
    memcpy(o.recipe_a, cs->recipe_a, sizeof o.recipe_a);
    memcpy(o.recipe_b, cs->recipe_b, sizeof o.recipe_b);
    return o;
}

/* B re-laid out for `_nn`: data [G, K, N] (FP4 pairs along N) and scales [G, kblocks, nblocks]. */
static void make_nn(const tq *b, dg_tensor *data, dg_tensor *sf) {
    const int64_t G = b->G, N = b->R, K = b->K;
    const int fp4 = b->kind == TQ_FP4_UE8M0;
    *data = tu_alloc3(b->data.dtype, G, K, fp4 ? N / 2 : N);
    for (int64_t g = 0; g < G; ++g)
        for (int64_t k = 0; k < K; ++k)
            for (int64_t n = 0; n < N; ++n) {
                const int64_t src = (g * N + n) * K + k, dst = (g * K + k) * N + n;
                if (b->kind == TQ_BF16)
                    ((uint16_t *)data->data)[dst] = dg_float_to_bf16(b->orig[src]);
                else if (!fp4)
                    ((uint8_t *)data->data)[dst] = b->code[src];
                else
                    ((uint8_t *)data->data)[dst / 2] |= (uint8_t)(b->code[src] << ((dst & 1) ? 4 : 0));
            }
    memset(sf, 0, sizeof *sf);
    if (b->kind == TQ_BF16)
        return;
    const int64_t r = b->sf.shape[1], c = b->sf.shape[2];
    *sf = tu_alloc3(b->sf.dtype, G, c, r);
    for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < r; ++i)
            for (int64_t j = 0; j < c; ++j)
                ((uint32_t *)sf->data)[(g * c + j) * r + i] = ((const uint32_t *)b->sf.data)[(g * r + i) * c + j];
}

/* Compares computed rows exactly with the naive formula and collects them for calc_diff. */
static void check_row(const tq *a, int64_t ga, int64_t ra, const tq *b, int64_t g, const dg_tensor *d,
                      const char *row, int64_t *mism, float *got, float *ref) {
    const int64_t N = b->R, K = a->K;
    const size_t es = dg_dtype_size(d->dtype);
    for (int64_t n = 0; n < N; ++n) {
        const double v = tq_dot(a->deq + (ga * a->R + ra) * K, b->deq + (g * N + n) * K, K);
        const void *p = row + (size_t)n * es;
        *mism += !tq_same_as_stored(d, p, v);
        got[n] = d->dtype == DG_FLOAT32 ? *(const float *)p : dg_bf16_to_float(*(const uint16_t *)p);
        double exact = 0;
        for (int64_t k = 0; k < K; ++k)
            exact += (double)a->orig[(ga * a->R + ra) * K + k] * b->orig[(g * N + n) * K + k];
        ref[n] = (float)exact;
    }
}

typedef struct cont_cfg {
    int G, expected_m, N, K, alignment;
    int psum, zero_pad, nn;
    dg_dtype out;
    int64_t d_pad;          /* extra elements per D row (a strided D view) */
    const int *forced_ms;   /* NULL: random 0.7x..1.3x of expected_m */
} cont_cfg;

static void run_contiguous(tu_rng *rng, const mcase *cs, const cont_cfg *cf) {
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(cf->alignment));
    const int G = cf->G, N = cf->N, K = cf->K, tail = 3;
    int ms[16];
    int64_t M = 0;
    for (int g = 0; g < G; ++g) {
        ms[g] = cf->forced_ms ? cf->forced_ms[g] : (int)(cf->expected_m * (0.7 + 0.6 * tu_uniform(rng)));
        M += tq_align(ms[g], cf->alignment);
    }
    M += tail; /* rows past the last group: never computed */
    tq A = tq_make(rng, cs->ka, 0, 1, M, K, 1, cs->gran_k_a);
    tq B = tq_make(rng, cs->kb, 1, G, N, K, cs->gran_n_b, cs->gran_k_b);
    int *row_group = malloc((size_t)M * sizeof(int));
    dg_tensor gl = tu_alloc(DG_INT32, 1, (int64_t[]){cf->psum ? G : M});
    int64_t start = 0;
    for (int64_t r = 0; r < M; ++r)
        row_group[r] = -1;
    for (int g = 0; g < G; ++g) {
        for (int64_t r = start; r < start + ms[g]; ++r)
            row_group[r] = g;
        if (cf->psum)
            ((int32_t *)gl.data)[g] = (int32_t)(start + ms[g]);
        start += tq_align(ms[g], cf->alignment);
    }
    for (int64_t r = 0; r < M; ++r) {
        if (!cf->psum)
            ((int32_t *)gl.data)[r] = row_group[r];
        if (row_group[r] < 0)
            tq_poison_row(&A, 0, r);
    }
    dg_tensor dfull = tu_alloc2(cf->out, M, N + cf->d_pad);
    dg_tensor d = dfull;
    d.shape[1] = N;
    tu_fill_bytes(&dfull, SENTINEL);
    void *snap = tu_snapshot(&dfull);
    dg_gemm_options o = case_opts(cs);
    o.use_psum_layout = cf->psum;
    o.ensure_zero_padding = cf->zero_pad;
    const int quant = cs->ka != TQ_BF16;
    dg_status s;
    if (cf->nn) {
        dg_tensor bnn, sfnn;
        make_nn(&B, &bnn, &sfnn);
        s = quant ? dg_m_grouped_fp8_fp4_gemm_nn_contiguous(&A.data, &A.sf, &bnn, &sfnn, &d, &gl, &o)
                  : dg_m_grouped_bf16_gemm_nn_contiguous(&A.data, &bnn, &d, &gl, &o);
        tu_free(&bnn);
        if (sfnn.data)
            tu_free(&sfnn);
    } else {
        s = quant ? dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&A.data, &A.sf, &B.data, &B.sf, &d, &gl, &o)
                  : dg_m_grouped_bf16_gemm_nt_contiguous(&A.data, &B.data, &d, &gl, &o);
    }
    TU_CHECK(s == DG_OK, "%s contiguous: %s", cs->name, dg_last_error());

    int64_t mism = 0, bad_pad = 0, n_rows = 0;
    float *got = malloc((size_t)M * N * sizeof(float)), *ref = malloc((size_t)M * N * sizeof(float));
    const size_t es = dg_dtype_size(cf->out), row_bytes = (size_t)(N + cf->d_pad) * es;
    for (int64_t r = 0; r < M; ++r) {
        const char *row = (const char *)dfull.data + r * row_bytes;
        if (row_group[r] >= 0) {
            check_row(&A, 0, r, &B, row_group[r], &d, row, &mism, got + n_rows * N, ref + n_rows * N);
            ++n_rows;
            bad_pad += memcmp(row + N * es, (const char *)snap + r * row_bytes + N * es, cf->d_pad * es) != 0;
            continue;
        }
        /* Padding row: zero (psum with zero padding, inside an aligned group) or untouched. */
        const int zeroed = cf->psum && cf->zero_pad && r < M - tail;
        for (size_t i = 0; i < row_bytes; ++i) {
            const uint8_t want = (zeroed && i < (size_t)N * es) ? 0 : ((const uint8_t *)snap)[r * row_bytes + i];
            bad_pad += (uint8_t)row[i] != want;
        }
    }
    const double diff = tu_calc_diff(got, ref, (size_t)(n_rows * N));
    TU_CHECK(mism == 0, "%s G=%d N=%d K=%d psum=%d nn=%d: %lld elements differ from the naive formula", cs->name,
             G, N, K, cf->psum, cf->nn, (long long)mism);
    TU_CHECK(bad_pad == 0, "%s psum=%d zero_pad=%d: %lld padding bytes wrong", cs->name, cf->psum, cf->zero_pad,
             (long long)bad_pad);
    TU_CHECK(diff < cs->max_diff, "%s: calc_diff %.3g >= %.3g", cs->name, diff, cs->max_diff);
    free(got);
    free(ref);
    free(snap);
    free(row_group);
    tu_free(&dfull);
    tu_free(&gl);
    tq_free(&A);
    tq_free(&B);
}

typedef struct masked_cfg {
    int G, max_m, expected_m, N, K;
    const int *forced_ms;
    dg_dtype out;
} masked_cfg;

static void run_masked(tu_rng *rng, const mcase *cs, const masked_cfg *cf) {
    const int G = cf->G, N = cf->N, K = cf->K, max_m = cf->max_m;
    tq A = tq_make(rng, cs->ka, 1, G, max_m, K, 1, cs->gran_k_a);
    tq B = tq_make(rng, cs->kb, 1, G, N, K, cs->gran_n_b, cs->gran_k_b);
    dg_tensor mm = tu_alloc(DG_INT32, 1, (int64_t[]){G});
    int32_t *m = mm.data;
    for (int g = 0; g < G; ++g) {
        const int v = cf->forced_ms ? cf->forced_ms[g] : (int)(cf->expected_m * (0.7 + 0.6 * tu_uniform(rng)));
        m[g] = v > max_m ? max_m : v;
        for (int r = m[g]; r < max_m; ++r)
            tq_poison_row(&A, g, r);
    }
    dg_tensor d = tu_alloc3(cf->out, G, max_m, N);
    tu_fill_bytes(&d, SENTINEL);
    void *snap = tu_snapshot(&d);
    const dg_gemm_options o = case_opts(cs);
    for (int rep = 0; rep < 2; ++rep) { /* the second call must reproduce the same bits */
        void *first = rep ? tu_snapshot(&d) : NULL;
        const dg_status s = cs->ka != TQ_BF16
                                ? dg_m_grouped_fp8_fp4_gemm_nt_masked(&A.data, &A.sf, &B.data, &B.sf, &d, &mm,
                                                                      cf->expected_m, &o)
                                : dg_m_grouped_bf16_gemm_nt_masked(&A.data, &B.data, &d, &mm, cf->expected_m, NULL);
        TU_CHECK(s == DG_OK, "%s masked: %s", cs->name, dg_last_error());
        if (first) {
            TU_CHECK(tu_unchanged(&d, first), "%s masked: a repeated call gives other bits", cs->name);
            free(first);
        }
    }
    int64_t mism = 0, touched = 0, n_rows = 0;
    const size_t es = dg_dtype_size(cf->out), row_bytes = (size_t)N * es;
    float *got = malloc((size_t)G * max_m * N * sizeof(float)), *ref = malloc((size_t)G * max_m * N * sizeof(float));
    for (int g = 0; g < G; ++g)
        for (int r = 0; r < max_m; ++r) {
            const size_t off = ((size_t)g * max_m + r) * row_bytes;
            const char *row = (const char *)d.data + off;
            if (r < m[g]) {
                check_row(&A, g, r, &B, g, &d, row, &mism, got + n_rows * N, ref + n_rows * N);
                ++n_rows;
            } else {
                touched += memcmp(row, (const char *)snap + off, row_bytes) != 0;
            }
        }
    const double diff = tu_calc_diff(got, ref, (size_t)(n_rows * N));
    TU_CHECK(mism == 0, "%s masked G=%d: %lld elements differ from the naive formula", cs->name, G, (long long)mism);
    TU_CHECK(touched == 0, "%s masked: %lld rows beyond masked_m were written", cs->name, (long long)touched);
    TU_CHECK(diff < cs->max_diff, "%s masked: calc_diff %.3g", cs->name, diff);
    free(got);
    free(ref);
    free(snap);
    tu_free(&d);
    tu_free(&mm);
    tq_free(&A);
    tq_free(&B);
}

static void test_contiguous(tu_rng *rng) {
    static const int small[4] = {5, 0, 3, 40};  /* an empty group and groups under 8 rows */
    static const int one[1] = {77};
    const mcase *quant[5] = {&kFp8Legacy, &kFp8Recipe, &kFp8Ue8m0, &kFp8Fp4, &kFp4Fp4};
    const int qk[5] = {320, 192, 192, 256, 128}; /* K tails: 320 and 192 are not multiples of 128 */
    for (int nn = 0; nn < 2; ++nn) {
        run_contiguous(rng, &kBf16, &(cont_cfg){4, 24, 64, 96, 32, 0, 0, nn, DG_BFLOAT16, 0, NULL});
        run_contiguous(rng, &kBf16, &(cont_cfg){4, 0, 64, 96, 16, 1, 1, nn, DG_BFLOAT16, 0, small});
        for (int i = 0; i < 5; ++i)
            run_contiguous(rng, quant[i], &(cont_cfg){3, 20, 160, qk[i], 128, nn, 1, nn, DG_BFLOAT16, 0, NULL});
    }
    /* index form with tiny/empty groups, psum without zero padding, one group, float32 D,
     * strided D, an alignment of 1 (no padding at all) */
    for (int i = 0; i < 5; ++i) {
        run_contiguous(rng, quant[i], &(cont_cfg){4, 0, 64, qk[i], 8, 0, 1, 0, DG_BFLOAT16, 0, small});
        run_contiguous(rng, quant[i], &(cont_cfg){4, 0, 64, qk[i], 8, 1, 0, 0, DG_BFLOAT16, 0, small});
    }
    run_contiguous(rng, &kBf16, &(cont_cfg){4, 0, 64, 64, 16, 1, 0, 0, DG_BFLOAT16, 0, small});
    run_contiguous(rng, &kBf16, &(cont_cfg){1, 0, 96, 128, 128, 0, 1, 0, DG_BFLOAT16, 0, one});
    run_contiguous(rng, &kFp8Legacy, &(cont_cfg){1, 0, 96, 128, 128, 1, 1, 0, DG_BFLOAT16, 0, one});
    run_contiguous(rng, &kBf16, &(cont_cfg){3, 16, 64, 80, 32, 0, 1, 1, DG_FLOAT32, 5, NULL});
    run_contiguous(rng, &kFp8Ue8m0, &(cont_cfg){3, 16, 64, 128, 32, 1, 1, 0, DG_FLOAT32, 7, NULL});
    run_contiguous(rng, &kBf16, &(cont_cfg){5, 10, 64, 64, 1, 1, 1, 0, DG_BFLOAT16, 0, NULL});
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(128));
}

static void test_masked(tu_rng *rng) {
    static const int forced[4] = {20, 0, 48, 3}; /* an empty group, a full group, a tiny group */
    const mcase *cases[5] = {&kBf16, &kFp8Legacy, &kFp8Ue8m0, &kFp8Fp4, &kFp4Fp4};
    const int ks[5] = {96, 320, 192, 256, 128};
    for (int i = 0; i < 5; ++i) {
        run_masked(rng, cases[i], &(masked_cfg){4, 48, 20, 160, ks[i], forced, DG_BFLOAT16});
        run_masked(rng, cases[i], &(masked_cfg){3, 40, 24, 64, ks[i], NULL, DG_BFLOAT16});
    }
    run_masked(rng, &kBf16, &(masked_cfg){1, 16, 10, 64, 64, NULL, DG_FLOAT32});
    /* The fp8 alias runs the same function. */
    tq A = tq_make(rng, TQ_FP8_F32, 1, 2, 8, 128, 1, 128), B = tq_make(rng, TQ_FP8_F32, 1, 2, 64, 128, 128, 128);
    dg_tensor mm = tu_alloc(DG_INT32, 1, (int64_t[]){2});
    ((int32_t *)mm.data)[0] = 8;
    ((int32_t *)mm.data)[1] = 5;
    dg_tensor d1 = tu_alloc3(DG_BFLOAT16, 2, 8, 64), d2 = tu_alloc3(DG_BFLOAT16, 2, 8, 64);
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_masked(&A.data, &A.sf, &B.data, &B.sf, &d1, &mm, 8, NULL));
    TU_CHECK_OK(dg_m_grouped_fp8_gemm_nt_masked(&A.data, &A.sf, &B.data, &B.sf, &d2, &mm, 8, NULL));
    TU_CHECK(memcmp(d1.data, d2.data, dg_tensor_nbytes(&d1)) == 0, "fp8 masked alias differs");
    tu_free(&d1);
    tu_free(&d2);
    tu_free(&mm);
    tq_free(&A);
    tq_free(&B);
}

/* dg_m_grouped_fp8_gemm_{nt,nn}_contiguous are the fp8_fp4 functions under DeepGEMM's old names. */
static void test_aliases(tu_rng *rng) {
    tq A = tq_make(rng, TQ_FP8_F32, 0, 1, 16, 128, 1, 128), B = tq_make(rng, TQ_FP8_F32, 1, 2, 64, 128, 128, 128);
    dg_tensor gl = tu_alloc(DG_INT32, 1, (int64_t[]){16});
    for (int r = 0; r < 16; ++r)
        ((int32_t *)gl.data)[r] = r < 9 ? 0 : (r < 15 ? 1 : -1);
    dg_tensor d1 = tu_alloc2(DG_BFLOAT16, 16, 64), d2 = tu_alloc2(DG_BFLOAT16, 16, 64);
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&A.data, &A.sf, &B.data, &B.sf, &d1, &gl, NULL));
    TU_CHECK_OK(dg_m_grouped_fp8_gemm_nt_contiguous(&A.data, &A.sf, &B.data, &B.sf, &d2, &gl, NULL));
    TU_CHECK(memcmp(d1.data, d2.data, dg_tensor_nbytes(&d1)) == 0, "fp8 nt alias differs");
    dg_tensor bnn, sfnn;
    make_nn(&B, &bnn, &sfnn);
    memset(d2.data, 0, dg_tensor_nbytes(&d2));
    TU_CHECK_OK(dg_m_grouped_fp8_gemm_nn_contiguous(&A.data, &A.sf, &bnn, &sfnn, &d2, &gl, NULL));
    TU_CHECK(memcmp(d1.data, d2.data, dg_tensor_nbytes(&d1)) == 0, "fp8 nn alias differs from nt");
    /* M = 0 is accepted and does nothing. */
    dg_tensor a0 = A.data, sfa0 = A.sf, d0 = d1, gl0 = gl;
    a0.shape[0] = sfa0.shape[0] = d0.shape[0] = gl0.shape[0] = 0;
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&a0, &sfa0, &B.data, &B.sf, &d0, &gl0, NULL));
    tu_free(&bnn);
    tu_free(&sfnn);
    tu_free(&d1);
    tu_free(&d2);
    tu_free(&gl);
    tq_free(&A);
    tq_free(&B);
}

int main(void) {
    /* These checks are bit-exact against double accumulation: they pin the reference (oracle)
     * backend. The engine (float32 accumulation) is checked in test_engine_grouped.c. */
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    tu_rng rng = {42};
    test_contiguous(&rng);
    test_masked(&rng);
    test_aliases(&rng);
    return tu_finish();
}
