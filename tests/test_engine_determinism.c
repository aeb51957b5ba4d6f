/*
 * test_engine_determinism.c - the engine's reproducibility contract (src/engine/engine.h):
 *   - the same call twice gives bitwise the same D;
 *   - 1 thread and 2 threads give bitwise the same D;
 *   - batch invariance: a row of D is bitwise the same whether computed with M = 1, M = 37 or
 *     M = 300, and wherever it sits in A (other rows, tile position, M tails do not matter);
 * for BF16, FP8 1D2D (float32 scales applied per K block), UE8M0 (folded) and FP8 x FP4, on
 * every kernel this CPU runs;
 *   - AMX: BF16 A read in place by the tiles (gemm.c, N within one column block) gives bitwise
 *     the D of the same values packed first (an MN-major A), M tails and row views included.
 */
#include "test_gemm_dense_util.h"

#include "common/engine_variants.h"
#include "engine/engine.h"

typedef struct dcase {
    const char *what;
    dg_dtype da, db;
    int gran_a[2], gran_b[2], packed;
} dcase;

/* Rows [r0, r0 + m) of operand a (data and, for gran_mn == 1, scales). */
static void view_rows(const top *a, int64_t r0, int64_t m, dg_tensor *t, dg_tensor *sf) {
    *t = a->t;
    t->data = (char *)t->data + r0 * t->strides[0] * (int64_t)dg_dtype_size(t->dtype);
    t->shape[0] = m;
    *sf = a->sf;
    if (a->dt != DG_BFLOAT16) {
        sf->data = (char *)sf->data + r0 * sf->strides[0] * 4;
        sf->shape[0] = m;
    }
}

static dg_tensor gemm(const dcase *c, const dg_tensor *a, const dg_tensor *sfa, const top *b) {
    dg_tensor d = tu_alloc2(DG_FLOAT32, a->shape[0], b->mn);
    dg_status st;
    if (c->da == DG_BFLOAT16) {
        st = dg_bf16_gemm_nt(a, &b->t, &d, NULL);
    } else {
        dg_gemm_options o = dg_gemm_options_default();
        o.recipe_a[0] = c->gran_a[0], o.recipe_a[1] = c->gran_a[1];
        o.recipe_b[0] = c->gran_b[0], o.recipe_b[1] = c->gran_b[1];
        st = dg_fp8_fp4_gemm_nt(a, sfa, &b->t, &b->sf, &d, NULL, &o);
    }
    TU_CHECK(st == DG_OK, "%s: %s", c->what, dg_last_error());
    return d;
}

static int rows_equal(const dg_tensor *x, int64_t rx, const dg_tensor *y, int64_t ry) {
    return memcmp((const float *)x->data + rx * x->strides[0], (const float *)y->data + ry * y->strides[0],
                  (size_t)x->shape[1] * sizeof(float)) == 0;
}

static void check(const dcase *c, const char *kernel) {
    tu_rng r = {21};
    const int64_t m = 300, n = 517, k = 300;
    top a = top_make(&r, c->da, m, k, 0, c->gran_a[0], c->gran_a[1], c->packed, 0);
    top b = top_make(&r, c->db, n, k, 0, c->gran_b[0], c->gran_b[1], c->packed, 0);
    dg_tensor at, sfa;
    view_rows(&a, 0, m, &at, &sfa);

    const int threads = dg_get_num_sms();
    TU_CHECK_OK(dg_set_num_sms(1));
    dg_tensor d1 = gemm(c, &at, &sfa, &b);
    TU_CHECK_OK(dg_set_num_sms(2));
    dg_tensor d2 = gemm(c, &at, &sfa, &b), d2b = gemm(c, &at, &sfa, &b);
    TU_CHECK_OK(dg_set_num_sms(threads));
    TU_CHECK(memcmp(d1.data, d2.data, (size_t)(m * n) * 4) == 0, "%s %s: 1 vs 2 threads differ", c->what, kernel);
    TU_CHECK(memcmp(d2.data, d2b.data, (size_t)(m * n) * 4) == 0, "%s %s: repeated calls differ", c->what, kernel);

    /* Batch invariance: sub-batches starting at several rows, of several sizes. */
    static const int64_t kStarts[] = {0, 5, 250};
    static const int64_t kSizes[] = {1, 37, 50};
    for (int s = 0; s < 3; ++s)
        for (int z = 0; z < 3; ++z) {
            const int64_t r0 = kStarts[s], mm = kSizes[z];
            if (r0 + mm > m)
                continue;
            dg_tensor sub, subsf;
            view_rows(&a, r0, mm, &sub, &subsf);
            dg_tensor ds = gemm(c, &sub, &subsf, &b);
            int same = 1;
            for (int64_t i = 0; i < mm; ++i)
                same &= rows_equal(&ds, i, &d2, r0 + i);
            TU_CHECK(same, "%s %s: rows %lld..%lld with M = %lld differ from M = 300", c->what, kernel,
                     (long long)r0, (long long)(r0 + mm - 1), (long long)mm);
            tu_free(&ds);
        }
    tu_free(&d1);
    tu_free(&d2);
    tu_free(&d2b);
    top_free(&a);
    top_free(&b);
}

/* AMX, BF16: the large-M kernel reads a K-major A in place when N fits one column block (the
 * path report says so); an MN-major A with the same values is packed first. Bitwise the same D,
 * on M tails of 1 to 31 rows (the short last panel is staged), N tails, K of one k step to many
 * slices, padded row strides; and a row view starting at row 1 (other tails) keeps every row.
 * Every M here, and M - 1, is past the small-M path's 64 rows. */
static void check_a_in_place(void) {
    const dg_isa saved = dg_get_isa();
    if (dg_set_isa(DG_ISA_AMX) != DG_OK)
        return; /* not on this CPU */
    static const struct { int64_t m, n, k; } shapes[] = {
        {97, 256, 320}, {300, 48, 64}, {545, 512, 1024}, {66, 33, 32}, {128, 256, 7168}, {96, 17, 96},
    };
    const int saved_paths = dg_get_print_paths();
    dg_set_print_paths(2);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
        const int64_t m = shapes[s].m, n = shapes[s].n, k = shapes[s].k;
        tu_rng r1 = {s + 71}, r2 = {s + 71}, rb = {s + 171};
        top ak = top_make(&r1, DG_BFLOAT16, m, k, 0, 0, 0, 0, 0); /* row stride k + 3 */
        top am = top_make(&r2, DG_BFLOAT16, m, k, 1, 0, 0, 0, 0); /* the same values, MN-major */
        top b = top_make(&rb, DG_BFLOAT16, n, k, 0, 0, 0, 0, 0);
        dg_tensor d[3];
        for (int v = 0; v < 3; ++v) {
            d[v] = tu_alloc2(DG_FLOAT32, m, n);
            dg_clear_path_report();
            dg_status st;
            if (v == 1) {
                const dg_tensor at = dg_tensor_transpose(am.t, 0, 1);
                st = dg_bf16_gemm_tt(&at, &b.t, &d[v], NULL); /* A transposed, B as given */
            } else {
                dg_tensor at = ak.t; /* v == 2: rows 1 .. m - 1 into rows 1 .. of d[2] */
                dg_tensor dv = d[v];
                if (v == 2) {
                    at.data = (uint16_t *)at.data + at.strides[0], at.shape[0] = m - 1;
                    dv.data = (float *)dv.data + n, dv.shape[0] = m - 1;
                }
                st = dg_bf16_gemm_nt(&at, &b.t, &dv, NULL);
            }
            TU_CHECK(st == DG_OK, "A in place M=%lld N=%lld K=%lld variant %d: %s", (long long)m, (long long)n,
                     (long long)k, v, dg_last_error());
            char report[1024];
            dg_get_path_report(report, sizeof report);
            const int in_place = strstr(report, "large-M kernel (32x32 tiles, A bfloat16 read in place") != NULL;
            TU_CHECK(in_place == (v != 1), "A in place M=%lld N=%lld K=%lld variant %d took: %s", (long long)m,
                     (long long)n, (long long)k, v, report);
        }
        TU_CHECK(memcmp(d[0].data, d[1].data, (size_t)(m * n) * sizeof(float)) == 0,
                 "A in place M=%lld N=%lld K=%lld: bitwise the packed A's D", (long long)m, (long long)n, (long long)k);
        TU_CHECK(memcmp((float *)d[0].data + n, (float *)d[2].data + n, (size_t)((m - 1) * n) * sizeof(float)) == 0,
                 "A in place M=%lld N=%lld K=%lld: rows 1.. of a row view keep their bits", (long long)m, (long long)n,
                 (long long)k);
        for (int v = 0; v < 3; ++v)
            tu_free(&d[v]);
        top_free(&ak), top_free(&am), top_free(&b);
    }
    dg_clear_path_report();
    dg_set_print_paths(saved_paths);
    dg_set_isa(saved);
}

int main(void) {
    const dcase cases[] = {
        {"bf16", DG_BFLOAT16, DG_BFLOAT16, {0, 0}, {0, 0}, 0},
        {"fp8 1d2d float", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {128, 128}, 0},
        {"fp8 ue8m0 packed", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {1, 128}, 1},
        {"fp8 x fp4 (1,32) packed", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 1},
    };
    const dg_isa best = dg_get_isa();
    for (int v = 0; v < tu_engine_variants(best); ++v) {
        const dg_isa isa = tu_engine_variant_set(v);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c)
            check(&cases[c], dg_engine_config(isa)->name);
    }
    tu_engine_variants_done(best);
    check_a_in_place();
    return tu_finish();
}
