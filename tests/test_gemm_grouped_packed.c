/*
 * test_gemm_grouped_packed.c - m-grouped GEMMs on pre-packed grouped weights (dg_pack_b_grouped,
 * dg_m_grouped_*_gemm_nt_{masked,contiguous}_packed). On every engine variant this CPU runs, D
 * is bitwise D of the unpacked grouped call on the same inputs, for 1, 2 and 3 threads: BF16,
 * FP8 1D2D float, FP8 1D1D float with one group's scales powers of two (folded for that group
 * only), FP8 with B scale blocks of 96 rows (the kept FP8 codes' scales are sliced at 1024
 * columns), FP8 with per-row B scales of 256 columns (group 0 folded), FP8 UE8M0, FP8 x FP4
 * (also with scale blocks of 16: on AMX the packed call then runs on B's kept codes); masked (empty groups, 1..70 rows, a single group, D rows past
 * masked_m keep their sentinel) and contiguous (index form with -1 rows and a group in two
 * runs, psum form with zero padding); N past one work-item chunk. D is also checked against
 * the test's own formula (loose bound), so that both calls cannot be wrong the same way.
 * Bad inputs: test_gemm_grouped_packed_bad.c.
 */
#include "test_gemm_grouped_common.h"

#include "common/engine_variants.h"

#define SENT 0xA5

typedef struct pcase {
    const char *name;
    tq_kind ka, kb;
    int gran_k_a, gran_k_b, gran_n_b;
    int recipe_a[2], recipe_b[2];
    int pow2_group0; /* B's float scales of group 0 made powers of two */
} pcase;

static const pcase kCases[] = {
    {"bf16", TQ_BF16, TQ_BF16, 1, 1, 1, {0, 0}, {0, 0}, 0},
    {"fp8 1D2D float", TQ_FP8_F32, TQ_FP8_F32, 128, 128, 128, {0, 0}, {0, 0}, 0},
    {"fp8 1D1D float, group 0 folded", TQ_FP8_F32, TQ_FP8_F32, 128, 128, 1, {1, 128}, {1, 128}, 1},
    {"fp8 B 96x128", TQ_FP8_F32, TQ_FP8_F32, 128, 128, 96, {1, 128}, {96, 128}, 0},
    {"fp8 ue8m0", TQ_FP8_UE8M0, TQ_FP8_UE8M0, 128, 128, 1, {0, 0}, {0, 0}, 0},
    {"fp8 x fp4", TQ_FP8_UE8M0, TQ_FP4_UE8M0, 128, 32, 1, {1, 128}, {1, 32}, 0},
    /* blocks of 16 (NVFP4-like): A's float scales are not folded, so K blocks of 16, not whole
     * AMX k steps; at AMX the packed call runs the fallback level on B's kept codes */
    {"fp8 float/16 x fp4 ue8m0/16", TQ_FP8_F32, TQ_FP4_UE8M0, 16, 16, 1, {1, 16}, {1, 16}, 0},
    /* group 0 folded, the others keep per-row scales of gran_k 256, applied per accumulation
     * block of 128 (packing once reserved them per gran_k and failed with DG_ERR_INTERNAL) */
    {"fp8 B 1x256, group 0 folded", TQ_FP8_F32, TQ_FP8_F32, 128, 256, 1, {1, 128}, {1, 256}, 1},
};

static dg_gemm_options case_opts(const pcase *cs) {
    dg_gemm_options o = dg_gemm_options_default();
    memcpy(o.recipe_a, cs->recipe_a, sizeof o.recipe_a);
    memcpy(o.recipe_b, cs->recipe_b, sizeof o.recipe_b);
    return o;
}

static int g_formula; /* check against the formula (once per case: on the best variant) */

static int quantized(const pcase *cs) { return cs->ka != TQ_BF16; }

/* B for the case: group 0's float scales rounded to powers of two (its values follow). */
static tq make_b(tu_rng *r, const pcase *cs, int64_t G, int64_t N, int64_t K) {
    tq b = tq_make(r, cs->kb, 1, G, N, K, cs->gran_n_b, cs->gran_k_b);
    if (!cs->pow2_group0)
        return b;
    const int64_t nk = b.sf.shape[2], nr = b.sf.shape[1];
    float *sf = b.sf.data;
    for (int64_t i = 0; i < nr * nk; ++i)
        sf[i] = exp2f(rintf(log2f(sf[i])));
    for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
            b.deq[n * K + k] =
                (double)dg_e4m3_to_float(b.code[n * K + k]) * sf[(n / cs->gran_n_b) * nk + k / cs->gran_k_b];
    return b;
}

static dg_status pack(const pcase *cs, const tq *b, dg_packed_b **out) {
    const dg_gemm_options o = case_opts(cs);
    return dg_pack_b_grouped(&b->data, tq_sf(b), quantized(cs) ? &o : NULL, out);
}

/* Rows of D computed by group g against the test's formula (loose bound; exactness is the
 * unpacked tests' job). a_row: A's row of each D row, or -1 for rows not computed. */
static int64_t count_far(const tq *a, const tq *b, const dg_tensor *d, int64_t rows, const int64_t *a_row,
                         const int64_t *grp) {
    int64_t bad = 0;
    const int64_t N = b->R, K = b->K;
    for (int64_t i = 0; i < rows; ++i) {
        if (a_row[i] < 0)
            continue;
        for (int64_t j = 0; j < N; ++j) {
            const double *x = a->deq + a_row[i] * K, *y = b->deq + (grp[i] * N + j) * K;
            double ex = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k)
                ex += x[k] * y[k], mag += fabs(x[k] * y[k]);
            const char *p = (const char *)d->data + (size_t)(i * N + j) * dg_dtype_size(d->dtype);
            const double got = d->dtype == DG_FLOAT32 ? *(const float *)p : dg_bf16_to_float(*(const uint16_t *)p);
            bad += !(fabs(got - ex) <= 1e-2 * mag + 1e-6);
        }
    }
    return bad;
}

/* ---- masked ------------------------------------------------------------------------------- */

static dg_status masked_call(const pcase *cs, const tq *a, const tq *b, const dg_packed_b *pb, const dg_tensor *d,
                             const dg_tensor *mm) {
    const dg_gemm_options o = case_opts(cs);
    if (!quantized(cs))
        return pb ? dg_m_grouped_bf16_gemm_nt_masked_packed(&a->data, pb, d, mm, 16, &o)
                  : dg_m_grouped_bf16_gemm_nt_masked(&a->data, &b->data, d, mm, 16, &o);
    return pb ? dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(&a->data, &a->sf, pb, d, mm, 16, &o)
              : dg_m_grouped_fp8_fp4_gemm_nt_masked(&a->data, &a->sf, &b->data, &b->sf, d, mm, 16, &o);
}

static void run_masked(const pcase *cs, const char *isa, tu_rng *r, int64_t G, const int32_t *masked, int64_t N,
                       int64_t K, dg_dtype out) {
    const int64_t max_m = 72;
    tq a = tq_make(r, cs->ka, 1, G, max_m, K, 1, cs->gran_k_a), b = make_b(r, cs, G, N, K);
    dg_tensor mm = tu_alloc(DG_INT32, 1, (int64_t[]){G});
    memcpy(mm.data, masked, (size_t)G * 4);
    for (int64_t g = 0; g < G; ++g) /* rows past masked_m are garbage: never read */
        for (int64_t m = masked[g]; m < max_m; ++m)
            tq_poison_row(&a, g, m);
    dg_packed_b *pb = NULL;
    TU_CHECK_OK(pack(cs, &b, &pb));
    dg_tensor du = tu_alloc3(out, G, max_m, N), dp = tu_alloc3(out, G, max_m, N), sent = tu_alloc3(out, G, max_m, N);
    tu_fill_bytes(&du, SENT), tu_fill_bytes(&sent, SENT);
    TU_CHECK_OK(masked_call(cs, &a, &b, NULL, &du, &mm));
    const int sms = dg_get_num_sms();
    for (int t = 1; t <= 3 && pb; ++t) {
        tu_fill_bytes(&dp, SENT);
        TU_CHECK_OK(dg_set_num_sms(t));
        TU_CHECK_OK(masked_call(cs, &a, &b, pb, &dp, &mm));
        TU_CHECK(memcmp(du.data, dp.data, dg_tensor_nbytes(&du)) == 0,
                 "%s [%s] masked G=%lld N=%lld, %d threads: packed differs bitwise from unpacked", cs->name, isa,
                 (long long)G, (long long)N, t);
    }
    TU_CHECK_OK(dg_set_num_sms(sms));
    const size_t row = (size_t)N * dg_dtype_size(out);
    int64_t *a_row = malloc(sizeof(int64_t) * (size_t)(G * max_m)), *grp = malloc(sizeof(int64_t) * (size_t)(G * max_m));
    for (int64_t g = 0; g < G; ++g)
        for (int64_t m = 0; m < max_m; ++m) {
            a_row[g * max_m + m] = m < masked[g] ? g * max_m + m : -1, grp[g * max_m + m] = g;
            if (m >= masked[g]) /* rows past masked_m keep the sentinel */
                TU_CHECK(memcmp((char *)dp.data + (size_t)(g * max_m + m) * row,
                                (char *)sent.data + (size_t)(g * max_m + m) * row, row) == 0,
                         "%s [%s]: group %lld row %lld past masked_m was written", cs->name, isa, (long long)g,
                         (long long)m);
        }
    const int64_t far = !g_formula ? 0 : count_far(&a, &b, &dp, G * max_m, a_row, grp);
    TU_CHECK(far == 0, "%s [%s] masked: %lld elements far from the formula", cs->name, isa, (long long)far);
    free(a_row), free(grp);
    dg_packed_b_free(pb);
    tu_free(&du), tu_free(&dp), tu_free(&sent), tu_free(&mm);
    tq_free(&a), tq_free(&b);
}

/* ---- contiguous --------------------------------------------------------------------------- */

static dg_status contig_call(const pcase *cs, const tq *a, const tq *b, const dg_packed_b *pb, const dg_tensor *d,
                             const dg_tensor *gl, int psum) {
    dg_gemm_options o = case_opts(cs);
    o.use_psum_layout = psum;
    if (!quantized(cs))
        return pb ? dg_m_grouped_bf16_gemm_nt_contiguous_packed(&a->data, pb, d, gl, &o)
                  : dg_m_grouped_bf16_gemm_nt_contiguous(&a->data, &b->data, d, gl, &o);
    return pb ? dg_m_grouped_fp8_fp4_gemm_nt_contiguous_packed(&a->data, &a->sf, pb, d, gl, &o)
              : dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&a->data, &a->sf, &b->data, &b->sf, d, gl, &o);
}

/* Index form: runs (group, rows), -1 = padding rows. Psum form: end rows of G groups. */
static void run_contig(const pcase *cs, const char *isa, tu_rng *r, int psum, int64_t N, int64_t K) {
    enum { G = 4 };
    static const int32_t runs[][2] = {{0, 3}, {-1, 2}, {2, 70}, {3, 20}, {1, 1}, {-1, 3}, {0, 5}};
    static const int32_t ends[G] = {5, 16, 16, 101}; /* alignment 16: [0,5) [16,16) [16,16) [16,101) */
    int64_t M = 0;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; ++i)
        M += runs[i][1];
    if (psum)
        M = 120;
    tq a = tq_make(r, cs->ka, 0, 1, M, K, 1, cs->gran_k_a), b = make_b(r, cs, G, N, K);
    int64_t *a_row = malloc(sizeof(int64_t) * (size_t)M), *grp = malloc(sizeof(int64_t) * (size_t)M);
    dg_tensor gl = tu_alloc(DG_INT32, 1, (int64_t[]){psum ? G : M});
    int32_t *lay = gl.data;
    for (int64_t i = 0; i < M; ++i)
        a_row[i] = -1, grp[i] = 0;
    if (psum) {
        memcpy(lay, ends, sizeof ends);
        for (int64_t g = 0, start = 0; g < G; start = tq_align(ends[g], 16), ++g)
            for (int64_t i = start; i < ends[g]; ++i)
                a_row[i] = i, grp[i] = g;
    } else {
        for (size_t i = 0, row = 0; i < sizeof runs / sizeof runs[0]; ++i)
            for (int32_t j = 0; j < runs[i][1]; ++j, ++row)
                lay[row] = runs[i][0], a_row[row] = runs[i][0] < 0 ? -1 : (int64_t)row, grp[row] = runs[i][0];
    }
    for (int64_t i = 0; i < M; ++i)
        if (a_row[i] < 0)
            tq_poison_row(&a, 0, i);
    const int align = dg_get_mk_alignment_for_contiguous_layout();
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(16));
    dg_packed_b *pb = NULL;
    TU_CHECK_OK(pack(cs, &b, &pb));
    dg_tensor du = tu_alloc2(DG_BFLOAT16, M, N), dp = tu_alloc2(DG_BFLOAT16, M, N);
    tu_fill_bytes(&du, SENT);
    TU_CHECK_OK(contig_call(cs, &a, &b, NULL, &du, &gl, psum));
    const int sms = dg_get_num_sms();
    for (int t = 1; t <= 3 && pb; ++t) {
        tu_fill_bytes(&dp, SENT);
        TU_CHECK_OK(dg_set_num_sms(t));
        TU_CHECK_OK(contig_call(cs, &a, &b, pb, &dp, &gl, psum));
        TU_CHECK(memcmp(du.data, dp.data, dg_tensor_nbytes(&du)) == 0,
                 "%s [%s] contiguous %s, %d threads: packed differs bitwise from unpacked", cs->name, isa,
                 psum ? "psum" : "index", t);
    }
    TU_CHECK_OK(dg_set_num_sms(sms));
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(align));
    const int64_t far = !g_formula ? 0 : count_far(&a, &b, &dp, M, a_row, grp);
    TU_CHECK(far == 0, "%s [%s] contiguous: %lld elements far from the formula", cs->name, isa, (long long)far);
    if (psum) /* zero padding: rows [5, 16) and [101, 112) of D are +0.0; later rows keep the sentinel */
        TU_CHECK(((uint16_t *)dp.data)[7 * N] == 0 && ((uint16_t *)dp.data)[111 * N] == 0 &&
                     ((uint8_t *)dp.data)[115 * N * 2] == SENT,
                 "%s [%s]: psum padding rows wrong", cs->name, isa);
    free(a_row), free(grp);
    dg_packed_b_free(pb);
    tu_free(&du), tu_free(&dp), tu_free(&gl);
    tq_free(&a), tq_free(&b);
}

static void test_equivalence(void) {
    tu_rng r = {0x6e0d};
    static const int32_t m5[5] = {1, 0, 70, 17, 64}, m3[3] = {20, 0, 9}, m1[1] = {5};
    const dg_isa best = dg_get_isa();
    for (int v = 0; v < tu_engine_variants(best); ++v) {
        const char *isa = dg_engine_config(tu_engine_variant_set(v))->name;
        g_formula = v == tu_engine_variants(best) - 1;
        for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; ++i) {
            const pcase *cs = &kCases[i];
            run_masked(cs, isa, &r, 5, m5, 70, 300, DG_BFLOAT16);
            run_masked(cs, isa, &r, 3, m3, 1100, 128, DG_FLOAT32); /* N past one chunk */
            run_masked(cs, isa, &r, 1, m1, 96, 256, DG_BFLOAT16);  /* a single group */
            run_contig(cs, isa, &r, 0, 70, 300);
            run_contig(cs, isa, &r, 1, 40, 128);
        }
    }
    tu_engine_variants_done(best);
}

int main(void) {
    test_equivalence();
    return tu_finish();
}
