/*
 * test_gemm_alpha.c - DeepGEMM 2.8's `alpha` on the dense GEMMs: D = round(C + alpha * acc).
 *
 * The contract (include/deepgemm.h, dense-gemm) defines alpha's arithmetic from the product the
 * same call computes without alpha into a FLOAT32 D (acc, unrounded): alpha * acc rounded to
 * float32, one float32 add of C, one rounding to D's dtype. So every case here is checked
 * bitwise against that formula applied by this file to the alpha-less call's FLOAT32 D, on every
 * engine variant of this CPU and on the reference backend, for:
 *   bf16 (all four layouts through the _ex forms), fp8 x fp8 / fp8 x fp4 / fp4 x fp4 (`_nt`,
 *   `_tn`), the pre-packed fp8_fp4 B; odd shapes (M = 1, tails in M, N, K), D BF16 and FLOAT32,
 *   no C, a separate C and C = D (accumulate in place), thread counts 1 and 3;
 * and against the naive double formula within BF16 rounding (calc_diff) as a sanity check.
 * Bad input: non-finite alpha (DG_ERR_VALUE), alpha given to GEMMs that do not take it
 * (DG_ERR_UNSUPPORTED), recipes given to BF16 (DG_ERR_VALUE); D untouched each time.
 */
#include "common/engine_variants.h"
#include "test_gemm_dense_util.h"

#include <math.h>

static dg_gemm_options with_alpha(float alpha) {
    dg_gemm_options o = dg_gemm_options_default();
    o.has_alpha = 1;
    o.alpha = alpha;
    return o;
}

/* A problem: A [m, k] and B [n, k] in `_nt` orientation (logical), dtypes and layouts. */
typedef struct prob {
    dg_dtype da, db;
    int64_t m, n, k;
    int a_mn_major, b_mn_major;
    int packed_sf;
    top a, b;
} prob;

static int gran_k_of(const prob *p) { return (p->da == DG_FP4_E2M1X2 && p->db == DG_FP4_E2M1X2) ? 32 : 128; }

static prob prob_make(tu_rng *r, dg_dtype da, dg_dtype db, int64_t m, int64_t n, int64_t k, int a_mn, int b_mn,
                      int packed_sf) {
    prob p = {da, db, m, n, k, a_mn, b_mn, packed_sf, {0}, {0}};
    const int gk = gran_k_of(&p);
    p.a = top_make(r, da, m, k, a_mn, 1, gk, packed_sf, 0);
    p.b = top_make(r, db, n, k, b_mn, packed_sf ? 1 : (db == DG_BFLOAT16 ? 1 : 128), gk, packed_sf, 0);
    return p;
}

static void prob_free(prob *p) {
    top_free(&p->a);
    top_free(&p->b);
}

static dg_gemm_options recipe_of(const prob *p, const dg_gemm_options *base) {
    dg_gemm_options o = *base;
    if (p->da != DG_BFLOAT16) {
        o.recipe[0] = 1;
        o.recipe[1] = p->packed_sf ? 1 : 128;
        o.recipe[2] = gran_k_of(p);
    }
    return o;
}

/* The `_nt` call (or the layout in `lay`: 0 nt, 1 tn) with opts; A/B are `_nt` views. */
static dg_status call(const prob *p, int lay, const dg_tensor *d, const dg_tensor *c, const dg_gemm_options *opts) {
    dg_tensor at, bt, sfat, sfbt;
    const dg_tensor *a = &p->a.t, *b = &p->b.t, *sfa = &p->a.sf, *sfb = &p->b.sf;
    if (lay == 1) { /* _tn takes A as [K, M] and B as [K, N]: pass the transposed views */
        a = dg_transposed_2d(a, &at);
        b = dg_transposed_2d(b, &bt);
        if (p->da != DG_BFLOAT16) {
            sfa = dg_transposed_2d(sfa, &sfat);
            sfb = dg_transposed_2d(sfb, &sfbt);
        }
    }
    if (p->da == DG_BFLOAT16)
        return lay == 0 ? dg_bf16_gemm_nt_ex(a, b, d, c, opts) : dg_bf16_gemm_tn_ex(a, b, d, c, opts);
    return lay == 0 ? dg_fp8_fp4_gemm_nt(a, sfa, b, sfb, d, c, opts) : dg_fp8_fp4_gemm_tn(a, sfa, b, sfb, d, c, opts);
}

/* Bits the contract prescribes for D[i, j] from acc, C's value and alpha. */
static uint32_t expect_bits(float acc, const dg_tensor *c, int64_t i, int64_t j, float alpha, dg_dtype out) {
    const float scaled = alpha * acc;
    const float v = c ? tg_get(c, i, j) + scaled : scaled;
    if (out == DG_BFLOAT16)
        return dg_float_to_bf16(v);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* One case on the current engine variant: every D dtype and C mode. */
static void run_case(tu_rng *r, const prob *p, int lay, int use_packed, float alpha, const char *what) {
    dg_gemm_options base = dg_gemm_options_default();
    base = recipe_of(p, &base);
    dg_gemm_options opts = base;
    opts.has_alpha = 1;
    opts.alpha = alpha;

    dg_tensor acc = tg_out(r, DG_FLOAT32, p->m, p->n, 5, 0);
    TU_CHECK_OK(call(p, lay, &acc, NULL, &base));
    dg_packed_b *pk = NULL;
    if (use_packed)
        TU_CHECK_OK(dg_pack_b(&p->b.t, &p->b.sf, &base, &pk));

    for (int out = 0; out < 2; ++out) {
        const dg_dtype dt = out ? DG_FLOAT32 : DG_BFLOAT16;
        for (int cmode = 0; cmode < 3; ++cmode) { /* 0: no C, 1: separate C, 2: C = D */
            dg_tensor d = tg_out(r, dt, p->m, p->n, 3, cmode == 2);
            dg_tensor cs = tg_out(r, dt, p->m, p->n, 1, 1);
            dg_tensor c_before = tg_out(r, dt, p->m, p->n, 3, 0);
            if (cmode == 2) /* keep C's values: D is overwritten */
                for (int64_t i = 0; i < p->m; ++i)
                    memcpy(dg_ptr2(&c_before, i, 0), dg_ptr2(&d, i, 0), (size_t)p->n * dg_dtype_size(dt));
            const dg_tensor *c = cmode == 0 ? NULL : cmode == 1 ? &cs : &d;
            const dg_tensor *cval = cmode == 0 ? NULL : cmode == 1 ? &cs : &c_before;
            dg_status st = use_packed ? dg_fp8_fp4_gemm_nt_packed(&p->a.t, &p->a.sf, pk, &d, c, &opts)
                                      : call(p, lay, &d, c, &opts);
            TU_CHECK_OK(st);
            int64_t bad = 0;
            for (int64_t i = 0; i < p->m; ++i)
                for (int64_t j = 0; j < p->n; ++j)
                    bad += tg_bits(&d, i, j) != expect_bits(tg_get(&acc, i, j), cval, i, j, alpha, dt);
            TU_CHECK(bad == 0, "%s m=%lld n=%lld k=%lld out=%s c=%d packed=%d: %lld elements differ", what,
                     (long long)p->m, (long long)p->n, (long long)p->k, out ? "f32" : "bf16", cmode, use_packed,
                     (long long)bad);
            /* Sanity against the naive formula (the contract's product is float32). */
            if (cmode == 0 && dt == DG_FLOAT32) {
                float *got = malloc((size_t)(p->m * p->n + 1) * sizeof(float));
                float *want = malloc((size_t)(p->m * p->n + 1) * sizeof(float));
                for (int64_t i = 0; i < p->m; ++i)
                    for (int64_t j = 0; j < p->n; ++j) {
                        double s = 0;
                        for (int64_t kk = 0; kk < p->k; ++kk)
                            s += (double)p->a.val[i * p->k + kk] * p->b.val[j * p->k + kk];
                        got[i * p->n + j] = tg_get(&d, i, j);
                        want[i * p->n + j] = (float)(alpha * s);
                    }
                const double diff = tu_calc_diff(got, want, (size_t)(p->m * p->n));
                TU_CHECK(diff < 1e-6, "%s: calc_diff %.3g against the naive formula", what, diff);
                free(got);
                free(want);
            }
            tu_free(&d);
            tu_free(&cs);
            tu_free(&c_before);
        }
    }
    dg_packed_b_free(pk);
    tu_free(&acc);
}

static void test_values(void) {
    tu_rng r = {7};
    static const int64_t kShapes[][3] = {{1, 17, 64}, {5, 33, 200}, {37, 19, 130}, {64, 48, 256}};
    static const float kAlpha[] = {0.37f, -1.0f, 0.0f};
    const dg_isa best = dg_get_isa();
    for (int v = 0; v < tu_engine_variants(best); ++v) {
        const dg_isa isa = tu_engine_variant_set(v);
        for (int ref = 0; ref < 2; ++ref) {
            dg_set_backend(ref ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
            for (size_t s = 0; s < sizeof kShapes / sizeof kShapes[0]; ++s) {
                const int64_t m = kShapes[s][0], n = kShapes[s][1], k = kShapes[s][2];
                const float alpha = kAlpha[s % 3];
                char what[96];
                prob p = prob_make(&r, DG_BFLOAT16, DG_BFLOAT16, m, n, k, (int)(s & 1), 0, 0);
                for (int lay = 0; lay < 2; ++lay) {
                    snprintf(what, sizeof what, "isa %d ref %d bf16 lay %d", (int)isa, ref, lay);
                    run_case(&r, &p, lay, 0, alpha, what);
                }
                prob_free(&p);
                static const dg_dtype kPairs[3][2] = {{DG_FLOAT8_E4M3, DG_FLOAT8_E4M3},
                                                      {DG_FLOAT8_E4M3, DG_FP4_E2M1X2},
                                                      {DG_FP4_E2M1X2, DG_FP4_E2M1X2}};
                for (int q = 0; q < 3; ++q) {
                    const int64_t kq = kPairs[q][0] == DG_FP4_E2M1X2 || kPairs[q][1] == DG_FP4_E2M1X2 ? (k + 1) / 2 * 2 : k;
                    const int packed_sf = (int)((s + (size_t)q) & 1);
                    p = prob_make(&r, kPairs[q][0], kPairs[q][1], m, n, kq, 0, 0, packed_sf);
                    for (int lay = 0; lay < 2; ++lay) {
                        snprintf(what, sizeof what, "isa %d ref %d pair %d lay %d", (int)isa, ref, q, lay);
                        if (lay == 1 && (kPairs[q][0] == DG_FP4_E2M1X2 || kPairs[q][1] == DG_FP4_E2M1X2))
                            continue; /* FP4 pairs run along K: _tn needs MN-major packing */
                        run_case(&r, &p, lay, 0, alpha, what);
                    }
                    if (!ref) {
                        snprintf(what, sizeof what, "isa %d pair %d packed", (int)isa, q);
                        run_case(&r, &p, 0, 1, alpha, what);
                    }
                    prob_free(&p);
                }
            }
        }
        dg_set_backend(DG_BACKEND_AUTO);
    }
    tu_engine_variants_done(best);
}

/* The same bits whatever the thread count. */
static void test_threads(void) {
    tu_rng r = {11};
    prob p = prob_make(&r, DG_FLOAT8_E4M3, DG_FP4_E2M1X2, 70, 45, 256, 0, 0, 1);
    dg_gemm_options o = recipe_of(&p, &(dg_gemm_options){0});
    o.ensure_zero_padding = 1;
    o.has_alpha = 1;
    o.alpha = 0.731f;
    dg_tensor d1 = tg_out(&r, DG_BFLOAT16, p.m, p.n, 0, 0), d3 = tg_out(&r, DG_BFLOAT16, p.m, p.n, 0, 0);
    const int saved = dg_get_num_sms();
    dg_set_num_sms(1);
    TU_CHECK_OK(call(&p, 0, &d1, NULL, &o));
    dg_set_num_sms(3);
    TU_CHECK_OK(call(&p, 0, &d3, NULL, &o));
    dg_set_num_sms(saved);
    TU_CHECK(memcmp(d1.data, d3.data, (size_t)(p.m * p.n) * 2) == 0, "alpha: 1 and 3 threads differ");
    tu_free(&d1);
    tu_free(&d3);
    prob_free(&p);
}

static void test_bad(void) {
    tu_rng r = {13};
    prob p = prob_make(&r, DG_BFLOAT16, DG_BFLOAT16, 4, 8, 32, 0, 0, 0);
    dg_tensor d = tg_out(&r, DG_BFLOAT16, 4, 8, 0, 1);
    void *snap = tu_snapshot(&d);
    const float kBad[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; ++i) {
        dg_gemm_options o = with_alpha(kBad[i]);
        TU_CHECK_STATUS(dg_bf16_gemm_nt_ex(&p.a.t, &p.b.t, &d, NULL, &o), DG_ERR_VALUE);
        TU_CHECK(strstr(dg_last_error(), "alpha") != NULL, "message names alpha: %s", dg_last_error());
    }
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 1, o.recipe[2] = 128;
    TU_CHECK_STATUS(dg_bf16_gemm_nt_ex(&p.a.t, &p.b.t, &d, NULL, &o), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "dg_bf16_gemm_nt") != NULL, "message names the function: %s",
             dg_last_error());
    TU_CHECK(tu_unchanged(&d, snap), "D written on error");

    /* alpha where DeepGEMM has none: grouped GEMMs, skip_head_mid, pack_b. */
    o = with_alpha(2.0f);
    dg_tensor a3 = tu_alloc3(DG_BFLOAT16, 2, 4, 32), b3 = tu_alloc3(DG_BFLOAT16, 2, 8, 32);
    dg_tensor d3 = tu_alloc3(DG_BFLOAT16, 2, 4, 8), mm = tu_alloc2(DG_INT32, 1, 2);
    mm.ndim = 1, mm.shape[0] = 2, mm.strides[0] = 1;
    tu_fill_bytes(&a3, 0);
    tu_fill_bytes(&b3, 0);
    tu_fill_bytes(&mm, 0);
    void *snap3 = tu_snapshot(&d3);
    TU_CHECK_STATUS(dg_m_grouped_bf16_gemm_nt_masked(&a3, &b3, &d3, &mm, 4, &o), DG_ERR_UNSUPPORTED);
    TU_CHECK(strstr(dg_last_error(), "alpha") != NULL, "message names alpha: %s", dg_last_error());
    TU_CHECK(tu_unchanged(&d3, snap3), "grouped D written on error");
    prob q = prob_make(&r, DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, 4, 8, 128, 0, 0, 1);
    dg_packed_b *pk = NULL;
    dg_gemm_options oq = recipe_of(&q, &o);
    TU_CHECK_STATUS(dg_pack_b(&q.b.t, &q.b.sf, &oq, &pk), DG_ERR_UNSUPPORTED);
    TU_CHECK(pk == NULL, "pack_b produced an object on error");
    const int hs[3] = {2, 2, 2};
    dg_tensor dh = tu_alloc2(DG_BFLOAT16, 4, 12);
    TU_CHECK_STATUS(dg_fp8_gemm_nt_skip_head_mid(&q.a.t, &q.a.sf, &q.b.t, &q.b.sf, &dh, hs, &oq), DG_ERR_UNSUPPORTED);
    dg_tensor dq = tg_out(&r, DG_BFLOAT16, 4, 8, 0, 1);
    void *snapq = tu_snapshot(&dq);
    oq.alpha = NAN;
    TU_CHECK_STATUS(dg_fp8_fp4_gemm_nt(&q.a.t, &q.a.sf, &q.b.t, &q.b.sf, &dq, NULL, &oq), DG_ERR_VALUE);
    TU_CHECK(tu_unchanged(&dq, snapq), "fp8 D written on error");
    free(snap);
    free(snap3);
    free(snapq);
    tu_free(&a3), tu_free(&b3), tu_free(&d3), tu_free(&mm), tu_free(&dh), tu_free(&dq), tu_free(&d);
    prob_free(&p);
    prob_free(&q);
}

int main(void) {
    test_values();
    test_threads();
    test_bad();
    return tu_finish();
}
