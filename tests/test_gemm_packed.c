/*
 * test_gemm_packed.c - pre-packed B (dg_pack_b, dg_*_gemm_nt_packed): on every ISA level this
 * CPU runs (AVX-512 BF16 with both kernels), D from the packed call is bitwise D from the
 * unpacked `_nt` call on the same inputs, for M = 1, 2, 5, 8, 16, 17, 33, 64, 300 (small-M and large-M
 * paths; small M on FP8 B reads its kept E4M3 codes on AMX, on FP4 B the decode panels on
 * AVX-512 BF16), N and K tails, K- and MN-major
 * B, BF16 / FP8 float scales (1D2D and 1D1D, A's gran_k finer than B's, B's gran_mn 96: kept
 * scales at 32-row blocks) / UE8M0 / FP8 x FP4 / FP4 x FP4, BF16 and FP32 D, C separate and in place; one
 * packed B serves several A. D is also checked against the naive formula (loose bound), so
 * that "both wrong in the same way" cannot pass. Bad inputs fail, name the argument, and
 * leave D untouched; a packed B used after dg_set_isa changed the kernel fails with
 * DG_ERR_VALUE.
 */
#include "test_gemm_dense_util.h"

#include "common/engine_variants.h"
#include "engine/engine.h"

typedef struct pcase {
    const char *name;
    dg_dtype da, db;
    int gran_a[2], gran_b[2], packed; /* packed: UE8M0 int32 scales for both */
    int64_t n, k;
    int b_mn_major;
} pcase;

static dg_gemm_options opts_of(const pcase *e) {
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe_a[0] = e->gran_a[0], o.recipe_a[1] = e->gran_a[1];
    o.recipe_b[0] = e->gran_b[0], o.recipe_b[1] = e->gran_b[1];
    return o;
}

static dg_tensor clone(const dg_tensor *t) {
    dg_tensor r = *t;
    const size_t bytes = (size_t)(t->shape[0] * t->strides[0] + 1) * dg_dtype_size(t->dtype);
    r.data = malloc(bytes);
    memcpy(r.data, t->data, bytes);
    return r;
}

static int same_span(const dg_tensor *x, const dg_tensor *y) {
    const size_t bytes = (size_t)(x->shape[0] * x->strides[0] + 1) * dg_dtype_size(x->dtype);
    return memcmp(x->data, y->data, bytes) == 0;
}

static dg_status unpacked(const pcase *e, const top *a, const top *b, const dg_tensor *d, const dg_tensor *c) {
    const dg_gemm_options o = opts_of(e);
    if (e->da == DG_BFLOAT16)
        return dg_bf16_gemm_nt(&a->t, &b->t, d, c);
    return dg_fp8_fp4_gemm_nt(&a->t, &a->sf, &b->t, &b->sf, d, c, &o);
}

static dg_status packed(const pcase *e, const top *a, const dg_packed_b *pb, const dg_tensor *d,
                        const dg_tensor *c) {
    const dg_gemm_options o = opts_of(e);
    if (e->da == DG_BFLOAT16)
        return dg_bf16_gemm_nt_packed(&a->t, pb, d, c);
    return dg_fp8_fp4_gemm_nt_packed(&a->t, &a->sf, pb, d, c, &o);
}

static dg_status pack(const pcase *e, const top *b, dg_packed_b **out) {
    const dg_gemm_options o = opts_of(e);
    if (e->db == DG_BFLOAT16)
        return dg_pack_b(&b->t, NULL, NULL, out);
    return dg_pack_b(&b->t, &b->sf, &o, out);
}

/* Elements within a loose bound of the naive formula (the engine's own tests are exact). */
static int64_t count_far(const top *a, const top *b, const dg_tensor *d, const dg_tensor *c) {
    int64_t bad = 0;
    for (int64_t i = 0; i < a->mn; ++i)
        for (int64_t j = 0; j < b->mn; ++j) {
            double ex = c ? tg_get(c, i, j) : 0.0, mag = c ? fabs(tg_get(c, i, j)) : 0.0;
            for (int64_t kk = 0; kk < a->k; ++kk) {
                const double p = (double)a->val[i * a->k + kk] * b->val[j * b->k + kk];
                ex += p, mag += fabs(p);
            }
            const double got = tg_get(d, i, j);
            bad += !(fabs(got - ex) <= 1e-2 * mag + 1e-6);
        }
    return bad;
}

/* One case on the current ISA: pack B once, then each M (and C mode) against the unpacked call. */
static void run_case(const pcase *e, const char *isa_name, tu_rng *r) {
    /* AMX small M: 1 and 2 tiles, odd rows; AVX-512 BF16 FP4 B: the narrow (1, 5) and wide
     * (16 .. 64) decode kernels on the decode panels, one to four groups of 16 rows per call */
    const int64_t ms[9] = {1, 2, 5, 8, 16, 17, 33, 64, 300};
    top b = top_make(r, e->db, e->n, e->k, e->b_mn_major, e->gran_b[0], e->gran_b[1], e->packed, 0);
    dg_packed_b *pb = NULL;
    TU_CHECK_OK(pack(e, &b, &pb));
    for (int mi = 0; mi < 9 && pb; ++mi) {
        const int64_t m = ms[mi];
        top a = top_make(r, e->da, m, e->k, 0, e->gran_a[0], e->gran_a[1], e->packed, 0);
        const dg_dtype out = mi % 2 ? DG_BFLOAT16 : DG_FLOAT32;
        dg_tensor c0 = tg_out(r, out, m, e->n, 3, 1), d0 = tg_out(r, out, m, e->n, 3, 0);
        for (int cmode = 0; cmode < 3; ++cmode) { /* none, separate, in place */
            dg_tensor du = clone(cmode == 2 ? &c0 : &d0), dp = clone(cmode == 2 ? &c0 : &d0);
            const dg_tensor *cu = cmode == 1 ? &c0 : cmode == 2 ? &du : NULL;
            const dg_tensor *cp = cmode == 1 ? &c0 : cmode == 2 ? &dp : NULL;
            TU_CHECK_OK(unpacked(e, &a, &b, &du, cu));
            TU_CHECK_OK(packed(e, &a, pb, &dp, cp));
            TU_CHECK(same_span(&du, &dp), "%s [%s] M=%lld cmode %d: packed differs bitwise from unpacked",
                     e->name, isa_name, (long long)m, cmode);
            if (cmode == 1) {
                const int64_t far = count_far(&a, &b, &dp, &c0);
                TU_CHECK(far == 0, "%s [%s] M=%lld: %lld elements far from the naive formula", e->name,
                         isa_name, (long long)m, (long long)far);
            }
            free(du.data);
            free(dp.data);
        }
        free(c0.data);
        free(d0.data);
        top_free(&a);
    }
    dg_packed_b_free(pb);
    top_free(&b);
}

static const pcase kCases[] = {
    {"bf16", DG_BFLOAT16, DG_BFLOAT16, {0, 0}, {0, 0}, 0, 70, 257, 0},
    {"bf16 B mn-major", DG_BFLOAT16, DG_BFLOAT16, {0, 0}, {0, 0}, 0, 33, 130, 1},
    {"fp8 1D2D float", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {128, 128}, 0, 70, 300, 0},
    {"fp8 1D1D float", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {1, 128}, 0, 45, 257, 0},
    {"fp8 A gran_k 64, B 128 (regrid)", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 64}, {1, 128}, 0, 40, 300, 0},
    {"fp8 float B mn-major", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {128, 128}, 0, 64, 200, 1},
    {"fp8 B gran (96, 128)", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {96, 128}, 0, 100, 256, 0},
    {"fp8 N, K odd", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {128, 128}, 0, 33, 161, 0},
    {"fp8 ue8m0", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {1, 128}, 1, 70, 300, 0},
    {"fp8 x fp4 ue8m0/32", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 1, 70, 300, 0},
    {"fp4 x fp4 ue8m0/32", DG_FP4_E2M1X2, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 1, 38, 160, 0},
    /* DeepSeek's FP8 x FP4 recipe (B's scales folded per 32 k); N 49, 30, 40: M <= 2 calls of
     * 4, 2, 3 groups of 16 rows, the last with 1, 14, 8 rows; K: steps of 32 with a tail,
     * blocks of 128 across them */
    {"fp8 1x128 x fp4 1x32", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 128}, {1, 32}, 1, 49, 350, 0},
    {"fp8 1x128 x fp4 1x32, K 48", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 128}, {1, 32}, 1, 30, 48, 0},
    {"fp8 1x128 x fp4 1x32, N 40", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 128}, {1, 32}, 1, 40, 162, 0},
    /* one panel, long K: a wide call's absent second group reads no scales (it had read past them) */
    {"fp8 1x128 x fp4 1x32, N 1, K 4096", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 128}, {1, 32}, 1, 1, 4096, 0},
    /* float (not power-of-two) scales: no exponent bytes, B's scales read per call */
    {"fp8 x fp4 float 1x32", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 128}, {1, 32}, 0, 33, 256, 0},
};

static void test_equivalence(void) {
    tu_rng r = {0x5eed1234};
    const dg_isa best = dg_get_isa();
    for (int v = 0; v < tu_engine_variants(best); ++v) {
        const char *name = dg_engine_config(tu_engine_variant_set(v))->name;
        for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; ++i)
            run_case(&kCases[i], name, &r);
    }
    tu_engine_variants_done(best);
    dg_engine_set_dpbf16(-1);
}

/* Bitwise the same for any thread count (the order of the K reduction never depends on it);
 * M = 20 runs the small-M path (FP8: on the kept codes), M = 100 the large-M one. */
static void test_threads(void) {
    tu_rng r = {77};
    const pcase *e = &kCases[2];
    top b = top_make(&r, e->db, 96, 384, 0, 128, 128, 0, 0);
    dg_packed_b *pb = NULL;
    TU_CHECK_OK(pack(e, &b, &pb));
    for (int64_t m = 20; m <= 100 && pb; m += 80) {
        top a = top_make(&r, e->da, m, 384, 0, 1, 128, 0, 0);
        dg_tensor d0 = tg_out(&r, DG_FLOAT32, m, 96, 0, 0), d1 = clone(&d0), d2 = clone(&d0);
        const int sms = dg_get_num_sms();
        TU_CHECK_OK(dg_set_num_sms(1));
        TU_CHECK_OK(packed(e, &a, pb, &d1, NULL));
        TU_CHECK_OK(dg_set_num_sms(3));
        TU_CHECK_OK(packed(e, &a, pb, &d2, NULL));
        TU_CHECK_OK(dg_set_num_sms(sms));
        TU_CHECK(same_span(&d1, &d2), "M=%lld: 1 thread and 3 threads differ", (long long)m);
        free(d0.data), free(d1.data), free(d2.data);
        top_free(&a);
    }
    dg_packed_b_free(pb);
    top_free(&b);
}

/* Where the level has E2M1 decode panel kernels, a pre-packed FP4 B serves decoding (M 1 and
 * 40: the narrow and the wide kernels) from them: the equivalence above then tested them. */
static void test_fp4_panels_used(void) {
    const dg_engine_cfg *cfg = dg_engine_config(dg_get_isa());
    if (!cfg->decode[DG_DECODE_E2M1P])
        return;
    tu_rng r = {4242};
    const pcase *e = &kCases[11];
    top b = top_make(&r, e->db, e->n, e->k, 0, e->gran_b[0], e->gran_b[1], e->packed, 0);
    dg_packed_b *pb = NULL;
    TU_CHECK_OK(pack(e, &b, &pb));
    const int mode = dg_get_print_paths();
    dg_set_print_paths(2);
    for (int64_t m = 1; m <= 40 && pb; m += 39) {
        top a = top_make(&r, e->da, m, e->k, 0, e->gran_a[0], e->gran_a[1], e->packed, 0);
        dg_tensor d = tg_out(&r, DG_FLOAT32, m, e->n, 0, 0);
        dg_clear_path_report();
        TU_CHECK_OK(packed(e, &a, pb, &d, NULL));
        char rep[2048];
        dg_get_path_report(rep, sizeof rep);
        TU_CHECK(strstr(rep, "from pre-packed E2M1 decode panels") != NULL, "M=%lld: panels not used; report:\n%s",
                 (long long)m, rep);
        free(d.data);
        top_free(&a);
    }
    dg_set_print_paths(mode);
    dg_packed_b_free(pb);
    top_free(&b);
}

/* On AMX a pre-packed FP4 B keeps its codes as nibble planes (engine.h, DG_AMX_E2M1_PLANES) for
 * the small-M kernel, which takes two 16-row blocks per call at M <= 16 (work items of 16+
 * blocks: N >= 256 with up to 2 threads, N >= 512 at 1). Bitwise the unpacked call (the kernel
 * on B's rows) with UE8M0 words and float powers of two (folded; one panel holding 2^-126, a
 * scale the planes kernel cannot apply, runs the rows' path), with arbitrary float scales (not
 * folded: an epilogue per K block, for pairs too), with A's scales folded or not, N with a
 * tail block, K over two chunks (8192 + 256), M 1 .. 64, 1, 2 and 3 threads. */
static void test_fp4_amx_planes(void) {
    const dg_engine_cfg *cfg = dg_engine_config(dg_get_isa());
    if (!cfg->amx)
        return;
    static const struct {
        int packed, tiny, ga;
        int64_t n, k;
    } cs[] = {{1, 0, 128, 300, 2048}, {2, 1, 32, 520, 512}, {0, 0, 128, 260, 8448}, {1, 0, 128, 40, 8448}};
    tu_rng r = {9191};
    const int sms = dg_get_num_sms(), mode = dg_get_print_paths();
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ++ci) {
        const pcase e = {"fp8 x fp4 planes", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, cs[ci].ga}, {1, 32},
                         cs[ci].packed, cs[ci].n, cs[ci].k, 0};
        top b = top_make(&r, e.db, e.n, e.k, 0, 1, 32, e.packed, 0);
        if (cs[ci].tiny) /* row 37: panel 2 */
            ((float *)b.sf.data)[37 * b.sf.strides[0] + 3] = 0x1p-126f;
        dg_packed_b *pb = NULL;
        TU_CHECK_OK(pack(&e, &b, &pb));
        const int64_t ms[5] = {1, 3, 16, 17, 64};
        for (int mi = 0; mi < 5 && pb; ++mi) {
            top a = top_make(&r, e.da, ms[mi], e.k, 0, 1, cs[ci].ga, e.packed, 0);
            dg_tensor du = tg_out(&r, DG_FLOAT32, ms[mi], e.n, 0, 0);
            TU_CHECK_OK(unpacked(&e, &a, &b, &du, NULL));
            for (int th = 1; th <= 3; ++th) {
                dg_tensor dp = clone(&du);
                memset(dp.data, 0, (size_t)(dp.shape[0] * dp.strides[0]) * sizeof(float));
                TU_CHECK_OK(dg_set_num_sms(th));
                dg_set_print_paths(2);
                dg_clear_path_report();
                TU_CHECK_OK(packed(&e, &a, pb, &dp, NULL));
                char rep[2048];
                dg_get_path_report(rep, sizeof rep);
                TU_CHECK(strstr(rep, "pre-packed planes") != NULL, "case %zu M=%lld: planes not used; report:\n%s", ci,
                         (long long)ms[mi], rep);
                TU_CHECK(same_span(&du, &dp), "case %zu M=%lld, %d threads: the packed call's D differs from the unpacked one's",
                         ci, (long long)ms[mi], th);
                free(dp.data);
            }
            TU_CHECK_OK(dg_set_num_sms(sms));
            dg_set_print_paths(mode);
            free(du.data);
            top_free(&a);
        }
        dg_packed_b_free(pb);
        top_free(&b);
    }
}

/* Where the level has E4M3 decode panel kernels, a pre-packed FP8 B serves M <= DG_DECODE_MAX_M
 * from them (M 1 and 5: four and two groups of 16 rows per call) and M = 40 from its kept rows,
 * with float block scales and with folded UE8M0 ones; a NaN code makes the panels' blocks take
 * the exact path. Each D equals the unpacked call's. */
static void test_fp8_panels_used(void) {
    const dg_engine_cfg *cfg = dg_engine_config(dg_get_isa());
    if (!cfg->decode[DG_DECODE_E4M3P])
        return;
    tu_rng r = {4343};
    for (int trial = 0; trial < 4; ++trial) {
        const pcase *e = &kCases[trial < 2 ? 2 : 8]; /* fp8 1D2D float; fp8 UE8M0 (scales folded) */
        const int nan = trial % 2;
        top b = top_make(&r, e->db, 100, 300, 0, e->gran_b[0], e->gran_b[1], e->packed, 0);
        if (nan)
            ((uint8_t *)b.t.data)[37 * b.t.strides[0] + 101] = 0x7f; /* E4M3 NaN */
        dg_packed_b *pb = NULL;
        TU_CHECK_OK(pack(e, &b, &pb));
        const int mode = dg_get_print_paths();
        dg_set_print_paths(2);
        const int64_t ms[3] = {1, 5, 40};
        for (int mi = 0; mi < 3 && pb; ++mi) {
            top a = top_make(&r, e->da, ms[mi], 300, 0, e->gran_a[0], e->gran_a[1], e->packed, 0);
            dg_tensor d = tg_out(&r, DG_FLOAT32, ms[mi], 100, 0, 0), dr = clone(&d);
            dg_clear_path_report();
            TU_CHECK_OK(packed(e, &a, pb, &d, NULL));
            char rep[2048];
            dg_get_path_report(rep, sizeof rep);
            const bool want = ms[mi] <= DG_DECODE_MAX_M;
            TU_CHECK((strstr(rep, "from pre-packed E4M3 decode panels") != NULL) == want,
                     "M=%lld: E4M3 panels %s; report:\n%s", (long long)ms[mi], want ? "not used" : "used", rep);
            TU_CHECK(!nan || !want || strstr(rep, "exact small-M path") != NULL, "M=%lld: a NaN code ran no exact block:\n%s",
                     (long long)ms[mi], rep);
            TU_CHECK_OK(unpacked(e, &a, &b, &dr, NULL));
            TU_CHECK(same_span(&d, &dr), "M=%lld nan=%d: the packed call's D differs from the unpacked one's",
                     (long long)ms[mi], nan);
            free(d.data), free(dr.data);
            top_free(&a);
        }
        dg_set_print_paths(mode);
        dg_packed_b_free(pb);
        top_free(&b);
    }
}

/* A failing call: the wanted status, a message naming `arg`, and D (and C) untouched. */
#define EXPECT_FAIL(expr, want, arg, dt)                                                                   \
    do {                                                                                                   \
        void *snap_ = tu_snapshot(dt);                                                                     \
        TU_CHECK_STATUS(expr, want);                                                                       \
        TU_CHECK(strstr(dg_last_error(), arg) != NULL, "message '%s' should name %s", dg_last_error(), arg); \
        TU_CHECK(tu_unchanged(dt, snap_), "%s wrote D on failure", #expr);                                 \
        free(snap_);                                                                                       \
    } while (0)

static void test_bad(void) {
    tu_rng r = {99};
    const pcase *f8 = &kCases[2], *bf = &kCases[0], *ue = &kCases[8];
    top a8 = top_make(&r, DG_FLOAT8_E4M3, 5, 256, 0, 1, 128, 0, 0);
    top b8 = top_make(&r, DG_FLOAT8_E4M3, 40, 256, 0, 128, 128, 0, 0);
    top a16 = top_make(&r, DG_BFLOAT16, 5, 256, 0, 0, 0, 0, 0);
    top b16 = top_make(&r, DG_BFLOAT16, 40, 256, 0, 0, 0, 0, 0);
    top a16k = top_make(&r, DG_BFLOAT16, 5, 254, 0, 0, 0, 0, 0);
    top bue = top_make(&r, DG_FLOAT8_E4M3, 40, 256, 0, 1, 128, 1, 0);
    dg_tensor d = tg_out(&r, DG_FLOAT32, 5, 40, 2, 1), dsmall = tg_out(&r, DG_FLOAT32, 5, 39, 0, 1);
    const dg_gemm_options o8 = opts_of(f8);
    dg_packed_b *p8 = NULL, *p16 = NULL, *pue = NULL, *untouched = (dg_packed_b *)&r;
    TU_CHECK_OK(pack(f8, &b8, &p8));
    TU_CHECK_OK(pack(bf, &b16, &p16));
    TU_CHECK_OK(pack(ue, &bue, &pue));

    /* dg_pack_b: nothing written to *out on failure */
    dg_packed_b *out = untouched;
    TU_CHECK_STATUS(dg_pack_b(&b8.t, &b8.sf, &o8, NULL), DG_ERR_NULL_POINTER);
    TU_CHECK(strstr(dg_last_error(), "'out'") != NULL, "names out: %s", dg_last_error());
    TU_CHECK_STATUS(dg_pack_b(NULL, &b8.sf, &o8, &out), DG_ERR_NULL_POINTER);
    TU_CHECK_STATUS(dg_pack_b(&b8.t, NULL, &o8, &out), DG_ERR_NULL_POINTER);
    TU_CHECK(strstr(dg_last_error(), "'sfb'") != NULL, "names sfb: %s", dg_last_error());
    TU_CHECK_STATUS(dg_pack_b(&b16.t, &b8.sf, NULL, &out), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'sfb'") != NULL, "names sfb: %s", dg_last_error());
    dg_tensor bad_dt = b16.t;
    bad_dt.dtype = DG_FLOAT32;
    TU_CHECK_STATUS(dg_pack_b(&bad_dt, NULL, NULL, &out), DG_ERR_DTYPE);
    TU_CHECK(out == untouched, "dg_pack_b wrote *out on failure");

    /* BF16 packed GEMM */
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(NULL, p16, &d, NULL), DG_ERR_NULL_POINTER, "'a'", &d);
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16.t, NULL, &d, NULL), DG_ERR_NULL_POINTER, "'b'", &d);
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16.t, p16, NULL, NULL), DG_ERR_NULL_POINTER, "'d'", &d);
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16k.t, p16, &d, NULL), DG_ERR_SHAPE, "'b'", &d);
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16.t, p8, &d, NULL), DG_ERR_DTYPE, "'b'", &d);
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a8.t, p16, &d, NULL), DG_ERR_DTYPE, "'a'", &d);
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16.t, p16, &dsmall, NULL), DG_ERR_SHAPE, "'d'", &dsmall);
    dg_tensor dbf = d;
    dbf.dtype = DG_BFLOAT16;
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16.t, p16, &d, &dbf), DG_ERR_DTYPE, "'c'", &d);

    /* FP8 packed GEMM */
    EXPECT_FAIL(dg_fp8_fp4_gemm_nt_packed(&a8.t, NULL, p8, &d, NULL, &o8), DG_ERR_NULL_POINTER, "'sfa'", &d);
    EXPECT_FAIL(dg_fp8_fp4_gemm_nt_packed(&a8.t, &a8.sf, NULL, &d, NULL, &o8), DG_ERR_NULL_POINTER, "'b'", &d);
    EXPECT_FAIL(dg_fp8_fp4_gemm_nt_packed(&a8.t, &a8.sf, p16, &d, NULL, &o8), DG_ERR_DTYPE, "'b'", &d);
    EXPECT_FAIL(dg_fp8_fp4_gemm_nt_packed(&a16.t, &a8.sf, p8, &d, NULL, &o8), DG_ERR_DTYPE, "'a'", &d);
    top a8k = top_make(&r, DG_FLOAT8_E4M3, 5, 384, 0, 1, 128, 0, 0);
    EXPECT_FAIL(dg_fp8_fp4_gemm_nt_packed(&a8k.t, &a8k.sf, p8, &d, NULL, &o8), DG_ERR_SHAPE, "'b'", &d);
    top_free(&a8k);
    /* B packed with recipe (128, 128); the call says (1, 128) for B */
    const dg_gemm_options o11 = opts_of(&kCases[3]);
    EXPECT_FAIL(dg_fp8_fp4_gemm_nt_packed(&a8.t, &a8.sf, p8, &d, NULL, &o11), DG_ERR_VALUE, "'opts'", &d);
    /* packed with UE8M0 (default recipe (1, 1, 128)); NULL opts resolves the same: accepted */
    top aue = top_make(&r, DG_FLOAT8_E4M3, 5, 256, 0, 1, 128, 1, 0);
    dg_tensor dd = tg_out(&r, DG_FLOAT32, 5, 40, 0, 0), du = clone(&dd);
    TU_CHECK_OK(dg_fp8_fp4_gemm_nt_packed(&aue.t, &aue.sf, pue, &dd, NULL, NULL));
    TU_CHECK_OK(dg_fp8_fp4_gemm_nt(&aue.t, &aue.sf, &bue.t, &bue.sf, &du, NULL, NULL));
    TU_CHECK(same_span(&dd, &du), "UE8M0 default recipe: packed differs from unpacked");
    /* a 1D2D recipe call on the UE8M0-packed B */
    EXPECT_FAIL(dg_fp8_fp4_gemm_nt_packed(&a8.t, &a8.sf, pue, &d, NULL, &o8), DG_ERR_VALUE, "'opts'", &d);
    free(dd.data), free(du.data);
    top_free(&aue);

    /* the reference backend cannot run a packed B */
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16.t, p16, &d, NULL), DG_ERR_UNSUPPORTED, "reference", &d);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));

    /* a packed B used after dg_set_isa changed the kernel */
    const dg_isa best = dg_get_isa();
    if (best != DG_ISA_GENERIC) {
        TU_CHECK_OK(dg_set_isa(DG_ISA_GENERIC));
        EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16.t, p16, &d, NULL), DG_ERR_VALUE, "'b'", &d);
        EXPECT_FAIL(dg_fp8_fp4_gemm_nt_packed(&a8.t, &a8.sf, p8, &d, NULL, &o8), DG_ERR_VALUE, "dg_set_isa", &d);
        TU_CHECK_OK(dg_set_isa(best));
        TU_CHECK_OK(dg_bf16_gemm_nt_packed(&a16.t, p16, &d, NULL)); /* back on its kernel: fine */
    }
    if (best == DG_ISA_AVX512_BF16) { /* the other kernel at the same level */
        dg_engine_set_dpbf16(dg_engine_config(best)->fmt == DG_PACK_BF16 ? 0 : 1);
        EXPECT_FAIL(dg_bf16_gemm_nt_packed(&a16.t, p16, &d, NULL), DG_ERR_VALUE, "'b'", &d);
        dg_engine_set_dpbf16(-1);
    }
    dg_packed_b_free(NULL);
    dg_packed_b_free(p8), dg_packed_b_free(p16), dg_packed_b_free(pue);
    free(d.data), free(dsmall.data);
    top_free(&a8), top_free(&b8), top_free(&a16), top_free(&b16), top_free(&a16k), top_free(&bue);
}

int main(void) {
    test_equivalence();
    test_threads();
    test_fp4_panels_used();
    test_fp4_amx_planes();
    test_fp8_panels_used();
    test_bad();
    return tu_finish();
}
