/*
 * test_gemm_fp4x4.c - FP4 x FP4 GEMMs on integer dot products (src/engine/fp4x4.h).
 *   - every element is bitwise the documented order (exact int32 block dot products, then
 *     acc = fmaf(dot, (0.25f * sa) * sb, acc) per block, D = round(C + acc)), computed here
 *     independently, on every ISA level this CPU runs (portable, VNNI, AMX): so all levels agree
 *   - within the float32 accumulation bound of exact math, and calc_diff against the reference
 *     backend < 2e-2 (SPEC 3, both FP4)
 * on odd shapes (M, N, K = 1, tails of 32-row panels, of 256-row tiles, of the small-M limit
 * 64, of the 1024-k slice, K not a multiple of 32 or 128 with scale tails), nt/nn/tn/tt,
 * BF16 and float32 D, C none / separate / in place, float and packed UE8M0 scales with blocks
 * of 32, 64 and 128; thread-count determinism, batch invariance (row i of D = the M = 1
 * result), and DeepSeek (N, K) shapes with small M, checked on sampled rows.
 */
#include "test_gemm_dense_util.h"

#include "engine/engine.h"

typedef dg_status (*ff)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *,
                        const dg_tensor *, const dg_tensor *, const dg_gemm_options *);
static const ff kF[4] = {dg_fp8_fp4_gemm_nt, dg_fp8_fp4_gemm_nn, dg_fp8_fp4_gemm_tn, dg_fp8_fp4_gemm_tt};
static const int kTransA[4] = {0, 0, 1, 1}, kTransB[4] = {0, 1, 1, 0};

typedef struct recipe {
    int ga[2], gb[2], packed_a, packed_b;
} recipe;

static const recipe kRecipes[] = {
    {{1, 32}, {1, 32}, 1, 1},    /* DeepSeek: UE8M0 per 32 */
    {{1, 32}, {1, 32}, 0, 0},    /* float32 scales */
    {{1, 128}, {1, 32}, 1, 0},   /* block 32 from gcd */
    {{1, 64}, {32, 128}, 0, 0},  /* block 64, B scales per 32 rows */
    {{1, 128}, {1, 128}, 1, 1},  /* block 128 */
};
#define N_RECIPES ((int)(sizeof kRecipes / sizeof kRecipes[0]))

/* ---- the order, independently ------------------------------------------------------------ */

static float scale_of(const top *o, int64_t i, int64_t kk) {
    const dg_tensor *s = &o->sf;
    const int64_t si = i / o->gran_mn, sk = kk / o->gran_k;
    if (!o->packed)
        return ((const float *)s->data)[si * s->strides[0] + sk * s->strides[1]];
    const uint32_t w = ((const uint32_t *)s->data)[si * s->strides[0] + (sk / 4) * s->strides[1]];
    return ldexpf(1.0f, (int)((w >> (8 * (sk % 4))) & 0xff) - 127);
}

/* 2 x the E2M1 codes [mn][k] recovered from the values, and the scales per block [mn][nkb]. */
typedef struct ints {
    int8_t *v2;
    float *s;
    int64_t nkb;
} ints;

static ints ints_of(const top *o, int gblk) {
    ints r;
    r.nkb = tg_cdiv(o->k, gblk);
    r.v2 = malloc((size_t)(o->mn * o->k + 1));
    r.s = malloc((size_t)(o->mn * r.nkb + 1) * sizeof(float));
    for (int64_t i = 0; i < o->mn; ++i) {
        for (int64_t kk = 0; kk < o->k; ++kk)
            r.v2[i * o->k + kk] = (int8_t)lrintf(2.0f * o->val[i * o->k + kk] / scale_of(o, i, kk));
        for (int64_t kb = 0; kb < r.nkb; ++kb)
            r.s[i * r.nkb + kb] = scale_of(o, i, kb * gblk);
    }
    return r;
}

static uint32_t order_bits(const ints *a, int64_t i, const ints *b, int64_t j, int64_t k, int gblk, const float *c,
                           dg_dtype out) {
    float acc = 0.0f;
    for (int64_t kb = 0; kb < a->nkb; ++kb) {
        int32_t dot = 0;
        for (int64_t kk = kb * gblk; kk < k && kk < (kb + 1) * gblk; ++kk)
            dot += a->v2[i * k + kk] * b->v2[j * k + kk];
        const float s = (0.25f * a->s[i * a->nkb + kb]) * b->s[j * b->nkb + kb];
        acc = fmaf((float)dot, s, acc);
    }
    const float r = c ? *c + acc : acc;
    if (out == DG_BFLOAT16)
        return dg_float_to_bf16(r);
    uint32_t u;
    memcpy(&u, &r, 4);
    return u;
}

static void ints_free(ints *r) {
    free(r->v2);
    free(r->s);
}

/* ---- one case on every level --------------------------------------------------------------- */

static dg_tensor clone(const dg_tensor *t) {
    dg_tensor r = *t;
    const size_t bytes = (size_t)(t->shape[0] * t->strides[0] + 1) * dg_dtype_size(t->dtype);
    r.data = malloc(bytes);
    memcpy(r.data, t->data, bytes);
    return r;
}

static dg_status call(int layout, const recipe *rc, const top *a, const top *b, const dg_tensor *d,
                      const dg_tensor *c) {
    dg_tensor at = a->t, sfa = a->sf, bt = b->t, sfb = b->sf;
    if (kTransA[layout])
        at = dg_tensor_transpose(at, 0, 1), sfa = dg_tensor_transpose(sfa, 0, 1);
    if (kTransB[layout])
        bt = dg_tensor_transpose(bt, 0, 1), sfb = dg_tensor_transpose(sfb, 0, 1);
    dg_gemm_options o = dg_gemm_options_default();
    memcpy(o.recipe_a, rc->ga, sizeof o.recipe_a);
    memcpy(o.recipe_b, rc->gb, sizeof o.recipe_b);
    return kF[layout](&at, &sfa, &bt, &sfb, d, c, &o);
}

static int gcd(int x, int y) { return y ? gcd(y, x % y) : x; }

static void check(tu_rng *r, int64_t m, int64_t n, int64_t k, int layout, const recipe *rc, dg_dtype out, int cmode) {
    int ma = kTransA[layout], mb = !kTransB[layout] ? 0 : 1; /* tn/tt: A MN-major; nn/tn: B MN-major */
    if (!top_layout_ok(DG_FP4_E2M1X2, m, k, ma))
        ma ^= 1;
    if (!top_layout_ok(DG_FP4_E2M1X2, n, k, mb))
        mb ^= 1;
    if (!top_layout_ok(DG_FP4_E2M1X2, m, k, ma) || !top_layout_ok(DG_FP4_E2M1X2, n, k, mb))
        return;
    const int gblk = gcd(rc->ga[1], rc->gb[1]);
    top a = top_make(r, DG_FP4_E2M1X2, m, k, ma, rc->ga[0], rc->ga[1], rc->packed_a, (int)(tu_next(r) & 1));
    top b = top_make(r, DG_FP4_E2M1X2, n, k, mb, rc->gb[0], rc->gb[1], rc->packed_b, (int)(tu_next(r) & 1));
    ints ia = ints_of(&a, gblk), ib = ints_of(&b, gblk);
    dg_tensor d0 = tg_out(r, out, m, n, 3, cmode == 2), c0 = tg_out(r, out, m, n, 1, 1);
    const dg_tensor *cin = cmode == 2 ? &d0 : cmode == 1 ? &c0 : NULL;
    char what[160];
    snprintf(what, sizeof what, "M=%lld N=%lld K=%lld layout %d (mnm %d%d) gran %d/%d %s cmode %d", (long long)m,
             (long long)n, (long long)k, layout, ma, mb, rc->ga[1], rc->gb[1], dg_dtype_name(out), cmode);

    /* expected bits, exact values and bounds */
    uint32_t *want = malloc((size_t)(m * n + 1) * 4);
    double *ex = malloc((size_t)(m * n + 1) * sizeof(double)), *tol = malloc((size_t)(m * n + 1) * sizeof(double));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            const float cv = cin ? tg_get(cin, i, j) : 0.0f;
            want[i * n + j] = order_bits(&ia, i, &ib, j, k, gblk, cin ? &cv : NULL, out);
            double e = cv, mag = 0;
            for (int64_t kk = 0; kk < k; ++kk) {
                const double p = (double)a.val[i * k + kk] * b.val[j * k + kk];
                e += p, mag += fabs(p);
            }
            ex[i * n + j] = e;
            tol[i * n + j] = ldexp((double)(k + 4) * mag + fabs(cv), -24) + 1e-30 + (out == DG_BFLOAT16 ? ldexp(fabs(e), -8) : 0);
        }
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    dg_tensor dref = clone(&d0);
    TU_CHECK_OK(call(layout, rc, &a, &b, &dref, cmode == 2 ? &dref : cin));
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    float *fref = tu_to_float(&dref);
    const dg_isa best = dg_get_isa();
    for (int isa = DG_ISA_GENERIC; isa <= (int)best; ++isa) {
        TU_CHECK_OK(dg_set_isa((dg_isa)isa));
        dg_tensor d = clone(&d0);
        const dg_status st = call(layout, rc, &a, &b, &d, cmode == 2 ? &d : cin);
        int64_t off_order = 0, off_bound = 0, pad = 0;
        for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
                off_order += tg_bits(&d, i, j) != want[i * n + j];
                off_bound += !(fabs(tg_get(&d, i, j) - ex[i * n + j]) <= tol[i * n + j]);
            }
            for (int64_t j = n; j < n + 3; ++j)
                pad += tg_bits(&d, i, j) != tg_bits(&d0, i, j);
        }
        float *f = tu_to_float(&d);
        const double diff = tu_calc_diff(f, fref, (size_t)(m * n));
        TU_CHECK(st == DG_OK && off_order == 0 && off_bound == 0 && pad == 0 && diff < 2e-2,
                 "%s [%s]: status %s (%s), %lld not in the order, %lld out of bound, %lld padding written, "
                 "calc_diff %.3g",
                 what, dg_isa_name((dg_isa)isa), dg_status_string(st), dg_last_error(), (long long)off_order,
                 (long long)off_bound, (long long)pad, diff);
        free(f);
        free(d.data);
    }
    TU_CHECK_OK(dg_set_isa(best));
    free(fref), free(dref.data), free(want), free(ex), free(tol), free(d0.data), free(c0.data);
    ints_free(&ia), ints_free(&ib);
    top_free(&a), top_free(&b);
}

static void test_shapes(void) {
    static const int64_t shapes[][3] = {{1, 1, 2},    {2, 2, 1},     {1, 33, 64},   {3, 31, 30},    {33, 32, 96},
                                        {64, 65, 160}, {65, 40, 200}, {70, 90, 1100}, {257, 33, 130}, {100, 300, 62}};
    tu_rng r = {41};
    int at = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (int layout = 0; layout < 4; ++layout, ++at)
            check(&r, shapes[s][0], shapes[s][1], shapes[s][2], layout, &kRecipes[at % N_RECIPES],
                  at % 2 ? DG_BFLOAT16 : DG_FLOAT32, at % 3);
}

/* ---- determinism --------------------------------------------------------------------------- */

static dg_tensor run_nt(const recipe *rc, const dg_tensor *a, const dg_tensor *sfa, const top *b) {
    dg_tensor d = tu_alloc2(DG_FLOAT32, a->shape[0], b->mn);
    dg_gemm_options o = dg_gemm_options_default();
    memcpy(o.recipe_a, rc->ga, sizeof o.recipe_a);
    memcpy(o.recipe_b, rc->gb, sizeof o.recipe_b);
    TU_CHECK_OK(dg_fp8_fp4_gemm_nt(a, sfa, &b->t, &b->sf, &d, NULL, &o));
    return d;
}

/* Threads 1 / 2 / 3 and row views of A (M = 1 and sub-blocks) give the same bits, per level. */
static void test_determinism(void) {
    tu_rng r = {42};
    const recipe *rc = &kRecipes[1];
    const int64_t m = 300, n = 140, k = 520;
    top a = top_make(&r, DG_FP4_E2M1X2, m, k, 0, rc->ga[0], rc->ga[1], rc->packed_a, 0);
    top b = top_make(&r, DG_FP4_E2M1X2, n, k, 0, rc->gb[0], rc->gb[1], rc->packed_b, 0);
    const dg_isa best = dg_get_isa();
    const int sms = dg_get_num_sms();
    for (int isa = DG_ISA_GENERIC; isa <= (int)best; ++isa) {
        TU_CHECK_OK(dg_set_isa((dg_isa)isa));
        TU_CHECK_OK(dg_set_num_sms(2));
        dg_tensor full = run_nt(rc, &a.t, &a.sf, &b);
        for (int th = 1; th <= 3; th += 2) {
            TU_CHECK_OK(dg_set_num_sms(th));
            dg_tensor d = run_nt(rc, &a.t, &a.sf, &b);
            TU_CHECK(memcmp(d.data, full.data, (size_t)(m * n) * 4) == 0, "[%s] %d threads differ from 2",
                     dg_isa_name((dg_isa)isa), th);
            tu_free(&d);
        }
        TU_CHECK_OK(dg_set_num_sms(sms));
        static const int64_t views[][2] = {{0, 1}, {37, 1}, {299, 1}, {5, 40}, {200, 64}, {3, 65}, {17, 283}};
        for (size_t v = 0; v < sizeof views / sizeof views[0]; ++v) {
            const int64_t r0 = views[v][0], mm = views[v][1];
            dg_tensor at = a.t, sfa = a.sf;
            at.data = (char *)at.data + r0 * at.strides[0];
            at.shape[0] = mm;
            sfa.data = (char *)sfa.data + r0 * sfa.strides[0] * 4;
            sfa.shape[0] = mm;
            dg_tensor d = run_nt(rc, &at, &sfa, &b);
            TU_CHECK(memcmp(d.data, (float *)full.data + r0 * n, (size_t)(mm * n) * 4) == 0,
                     "[%s] rows [%lld, %lld) computed alone differ from the M = %lld result",
                     dg_isa_name((dg_isa)isa), (long long)r0, (long long)(r0 + mm), (long long)m);
            tu_free(&d);
        }
        tu_free(&full);
    }
    TU_CHECK_OK(dg_set_isa(best));
    top_free(&a), top_free(&b);
}

/* ---- DeepSeek shapes ------------------------------------------------------------------------ */

/* DeepGEMM's (N, K) with M = 1 and 80, on the SIMD levels; rows 0, M/2, M-1 checked bitwise
 * against the order (the other rows are the same computation: batch invariance above). */
static void test_deepseek(void) {
    static const int64_t nk[][2] = {{2112, 7168}, {576, 7168}, {24576, 1536}, {7168, 2048}};
    tu_rng r = {43};
    const recipe *rc = &kRecipes[0];
    const dg_isa best = dg_get_isa();
    for (size_t s = 0; s < sizeof nk / sizeof nk[0]; ++s) {
        const int64_t n = nk[s][0], k = nk[s][1];
        top b = top_make(&r, DG_FP4_E2M1X2, n, k, 0, rc->gb[0], rc->gb[1], rc->packed_b, 0);
        ints ib = ints_of(&b, 32);
        for (int mi = 0; mi < 2; ++mi) {
            const int64_t m = mi ? 80 : 1;
            top a = top_make(&r, DG_FP4_E2M1X2, m, k, 0, rc->ga[0], rc->ga[1], rc->packed_a, 0);
            ints ia = ints_of(&a, 32);
            for (int isa = DG_ISA_AVX512_BF16; isa <= (int)best; ++isa) {
                TU_CHECK_OK(dg_set_isa((dg_isa)isa));
                dg_tensor d = run_nt(rc, &a.t, &a.sf, &b);
                const int64_t rows[3] = {0, m / 2, m - 1};
                int64_t bad = 0;
                for (int q = 0; q < 3; ++q)
                    for (int64_t j = 0; j < n; ++j)
                        bad += tg_bits(&d, rows[q], j) != order_bits(&ia, rows[q], &ib, j, k, 32, NULL, DG_FLOAT32);
                TU_CHECK(bad == 0, "DeepSeek M=%lld N=%lld K=%lld [%s]: %lld sampled elements not in the order",
                         (long long)m, (long long)n, (long long)k, dg_isa_name((dg_isa)isa), (long long)bad);
                tu_free(&d);
            }
            ints_free(&ia);
            top_free(&a);
        }
        ints_free(&ib);
        top_free(&b);
    }
    TU_CHECK_OK(dg_set_isa(best));
}

int main(void) {
    test_shapes();
    test_determinism();
    test_deepseek();
    return tu_finish();
}
