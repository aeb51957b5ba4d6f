/*
 * test_gemm_dense.c - the dense GEMMs (bf16 / fp8_fp4 / fp8, nt/nn/tn/tt) against the naive
 * formula of test_gemm_dense_util.h: every layout x output dtype x C mode (none, separate, in
 * place) x dtype combination x recipe, on shapes with M/N/K = 1, K = 0, empty M or N, K tails of
 * every scale block, N tails of 1D2D blocks, K- and MN-major operands with padded strides,
 * row- and MN-major scales, and padded D rows (whose padding must stay untouched).
 * Results must match bit for bit: both sides sum exact double products in increasing k.
 */
#include "test_gemm_dense_util.h"

typedef dg_status (*bf16_fn)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *);
typedef dg_status (*fp8_fn)(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *,
                            const dg_tensor *, const dg_tensor *, const dg_gemm_options *);

static const char *const kLayout[4] = {"nt", "nn", "tn", "tt"};
static const int kTransA[4] = {0, 0, 1, 1}, kTransB[4] = {0, 1, 1, 0};
static const bf16_fn kBf16[4] = {dg_bf16_gemm_nt, dg_bf16_gemm_nn, dg_bf16_gemm_tn, dg_bf16_gemm_tt};
static const fp8_fn kFp8Fp4[4] = {dg_fp8_fp4_gemm_nt, dg_fp8_fp4_gemm_nn, dg_fp8_fp4_gemm_tn, dg_fp8_fp4_gemm_tt};
static const fp8_fn kFp8[4] = {dg_fp8_gemm_nt, dg_fp8_gemm_nn, dg_fp8_gemm_tn, dg_fp8_gemm_tt};

enum { C_NONE, C_SEPARATE, C_INPLACE };
static const char *const kCMode[3] = {"no C", "C", "C == D"};

typedef struct gemm_case {
    const char *what;
    int layout, cmode;
    dg_dtype out;
    const bf16_fn *bf16;  /* one of these two tables */
    const fp8_fn *fp8;
    const dg_gemm_options *opts;
} gemm_case;

/* Runs one GEMM and compares all of D with the naive formula; D's row padding must be intact. */
static void run_case(tu_rng *r, const gemm_case *gc, const top *a, const top *b) {
    const int64_t m = a->mn, n = b->mn, pad = 2;
    dg_tensor d = tg_out(r, gc->out, m, n, pad, gc->cmode == C_INPLACE);
    dg_tensor csep = tg_out(r, gc->out, m, n, 1, 1);
    const dg_tensor *c = gc->cmode == C_NONE ? NULL : gc->cmode == C_SEPARATE ? &csep : &d;
    double *cval = malloc((size_t)(m * n + 1) * sizeof(double));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
            cval[i * n + j] = c ? (double)tg_get(c, i, j) : 0.0;

    dg_tensor at = a->t, sfa = a->sf, bt = b->t, sfb = b->sf;
    if (kTransA[gc->layout])
        at = dg_tensor_transpose(at, 0, 1), sfa = dg_tensor_transpose(sfa, 0, 1);
    if (kTransB[gc->layout])
        bt = dg_tensor_transpose(bt, 0, 1), sfb = dg_tensor_transpose(sfb, 0, 1);
    const dg_status st = gc->bf16 ? gc->bf16[gc->layout](&at, &bt, &d, c)
                                  : gc->fp8[gc->layout](&at, &sfa, &bt, &sfb, &d, c, gc->opts);

    int64_t bad = 0, first_i = -1, first_j = -1;
    for (int64_t i = 0; i < m && st == DG_OK; ++i) {
        for (int64_t j = 0; j < n; ++j)
            if (tg_bits(&d, i, j) != tg_expect(a, i, b, j, cval[i * n + j], gc->out) && bad++ == 0)
                first_i = i, first_j = j;
        for (int64_t j = n; j < n + pad; ++j) { /* inside the allocation: m * (n + pad) + 1 elements */
            uint32_t want = gc->out == DG_FLOAT32 ? 0x7b7b7b7bu : 0x7b7bu;
            if (tg_bits(&d, i, j) != want)
                ++bad;
        }
    }
    TU_CHECK(st == DG_OK && bad == 0,
             "%s %s %s %s: M=%lld N=%lld K=%lld a:%s%s b:%s%s: status %s (%s), %lld bad, first (%lld, %lld) "
             "got %g want bits %08x",
             gc->what, kLayout[gc->layout], dg_dtype_name(gc->out), kCMode[gc->cmode], (long long)m,
             (long long)n, (long long)a->k, dg_dtype_name(a->dt), a->mn_major ? " MN-major" : "",
             dg_dtype_name(b->dt), b->mn_major ? " MN-major" : "", dg_status_string(st), dg_last_error(),
             (long long)bad, (long long)first_i, (long long)first_j,
             first_i >= 0 ? tg_get(&d, first_i, first_j) : 0.0,
             first_i >= 0 ? tg_expect(a, first_i, b, first_j, cval[first_i * n + first_j], gc->out) : 0u);
    free(cval);
    free(d.data);
    free(csep.data);
}

/* ---- BF16 ------------------------------------------------------------------------------- */

static void test_bf16(void) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {1, 1, 0}, {0, 3, 4}, {3, 0, 4}, {1, 7, 33},
                                        {6, 1, 17}, {5, 9, 70}, {2, 3, 5}};
    tu_rng r = {1};
    for (int layout = 0; layout < 4; ++layout)
        for (int o = 0; o < 2; ++o)
            for (int cm = 0; cm < 3; ++cm)
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
                    const int64_t *sh = shapes[s];
                    top a = top_make(&r, DG_BFLOAT16, sh[0], sh[2], (int)(tu_next(&r) & 1), 1, 1, 0, 0);
                    top b = top_make(&r, DG_BFLOAT16, sh[1], sh[2], (int)(tu_next(&r) & 1), 1, 1, 0, 0);
                    const gemm_case gc = {"bf16_gemm", layout, cm, o ? DG_FLOAT32 : DG_BFLOAT16, kBf16, NULL, NULL};
                    run_case(&r, &gc, &a, &b);
                    top_free(&a);
                    top_free(&b);
                }
}

/* ---- FP8 / FP4 -------------------------------------------------------------------------- */

typedef struct recipe_case {
    const char *name;
    int kind;            /* 0: opts NULL (default recipe), 1: recipe, 2: recipe_a + recipe_b */
    int recipe[3];
    int ga[2], gb[2];    /* the granularities that must result */
    int packed_a, packed_b;
} recipe_case;

static const recipe_case kRecipes[] = {
    {"default float -> (1,128,128)", 0, {0, 0, 0}, {1, 128}, {128, 128}, 0, 0},
    {"recipe (1,128,128)", 1, {1, 128, 128}, {1, 128}, {128, 128}, 0, 0},
    {"recipe (1,1,128) float", 1, {1, 1, 128}, {1, 128}, {1, 128}, 0, 0},
    {"default packed -> (1,1,128)", 0, {0, 0, 0}, {1, 128}, {1, 128}, 1, 1},
    {"recipe (1,1,128) packed", 1, {1, 1, 128}, {1, 128}, {1, 128}, 1, 1},
    {"recipe_a/b (1,32) packed", 2, {0, 0, 0}, {1, 32}, {1, 32}, 1, 1},
    {"recipe_a (1,128) recipe_b (1,32) packed", 2, {0, 0, 0}, {1, 128}, {1, 32}, 1, 1},
    {"recipe (128,128,128) float", 1, {128, 128, 128}, {128, 128}, {128, 128}, 0, 0},
    {"recipe_a (1,128) float, recipe_b (1,32) packed", 2, {0, 0, 0}, {1, 128}, {1, 32}, 0, 1},
};
#define N_RECIPES ((int)(sizeof kRecipes / sizeof kRecipes[0]))

/* Shapes (M, N, K) visited in turn: M/N/K = 1, K = 0, empty M, K tails of 32/128/512, an N
 * tail of a 128-row B scale block, an M tail of a 128-row A scale block. */
static const int64_t kShapes[][3] = {{1, 1, 1}, {2, 2, 1}, {1, 1, 2}, {2, 2, 0}, {3, 130, 300}, {4, 6, 128},
                                     {130, 2, 260}, {5, 9, 520}, {2, 129, 64}, {0, 4, 32}, {6, 3, 34}};
#define N_SHAPES ((int)(sizeof kShapes / sizeof kShapes[0]))

/* A random feasible physical layout for an operand, or -1 when there is none. */
static int pick_major(tu_rng *r, dg_dtype dt, int64_t mn, int64_t k) {
    const int first = (int)(tu_next(r) & 1);
    for (int t = 0; t < 2; ++t)
        if (top_layout_ok(dt, mn, k, first ^ t))
            return first ^ t;
    return -1;
}

static void test_fp8_fp4(void) {
    static const dg_dtype kDt[2] = {DG_FLOAT8_E4M3, DG_FP4_E2M1X2};
    tu_rng r = {2};
    int shape_at = 0;
    for (int fn = 0; fn < 2; ++fn)
        for (int layout = 0; layout < 4; ++layout)
            for (int o = 0; o < 2; ++o)
                for (int cm = 0; cm < 3; ++cm)
                    for (int combo = 0; combo < 4; ++combo)
                        for (int rc = 0; rc < N_RECIPES; ++rc) {
                            const recipe_case *R = &kRecipes[rc];
                            const dg_dtype da = kDt[combo >> 1], db = kDt[combo & 1];
                            const int64_t *sh;
                            int ma, mb;
                            do {
                                sh = kShapes[shape_at++ % N_SHAPES];
                                ma = pick_major(&r, da, sh[0], sh[2]);
                                mb = pick_major(&r, db, sh[1], sh[2]);
                            } while (ma < 0 || mb < 0);
                            top a = top_make(&r, da, sh[0], sh[2], ma, R->ga[0], R->ga[1], R->packed_a,
                                             (int)(tu_next(&r) & 1));
                            top b = top_make(&r, db, sh[1], sh[2], mb, R->gb[0], R->gb[1], R->packed_b,
                                             (int)(tu_next(&r) & 1));
                            dg_gemm_options opt = dg_gemm_options_default();
                            if (R->kind == 1)
                                memcpy(opt.recipe, R->recipe, sizeof opt.recipe);
                            if (R->kind == 2) {
                                memcpy(opt.recipe_a, R->ga, sizeof opt.recipe_a);
                                memcpy(opt.recipe_b, R->gb, sizeof opt.recipe_b);
                            }
                            const gemm_case gc = {R->name, layout, cm, o ? DG_FLOAT32 : DG_BFLOAT16, NULL,
                                                  fn ? kFp8 : kFp8Fp4, R->kind ? &opt : NULL};
                            run_case(&r, &gc, &a, &b);
                            top_free(&a);
                            top_free(&b);
                        }
}

/* The same inputs give the same bits (engine determinism: test_engine_determinism.c). */
static void test_deterministic(void) {
    tu_rng r = {3};
    top a = top_make(&r, DG_FLOAT8_E4M3, 5, 300, 0, 1, 128, 0, 0);
    top b = top_make(&r, DG_FP4_E2M1X2, 7, 300, 0, 1, 32, 1, 1);
    dg_gemm_options opt = dg_gemm_options_default();
    opt.recipe_a[0] = 1, opt.recipe_a[1] = 128, opt.recipe_b[0] = 1, opt.recipe_b[1] = 32;
    dg_tensor d1 = tg_out(&r, DG_FLOAT32, 5, 7, 0, 0), d2 = tg_out(&r, DG_FLOAT32, 5, 7, 0, 0);
    TU_CHECK_OK(dg_fp8_fp4_gemm_nt(&a.t, &a.sf, &b.t, &b.sf, &d1, NULL, &opt));
    TU_CHECK_OK(dg_fp8_fp4_gemm_nt(&a.t, &a.sf, &b.t, &b.sf, &d2, NULL, &opt));
    TU_CHECK(memcmp(d1.data, d2.data, 5 * 7 * sizeof(float)) == 0, "bitwise identical repeats");
    free(d1.data);
    free(d2.data);
    top_free(&a);
    top_free(&b);
}

int main(void) {
    /* These checks are bit-exact against double accumulation: they pin the reference (oracle)
     * backend. The engine (float32 accumulation) is checked with tolerances in test_engine_*.c. */
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    test_bf16();
    test_fp8_fp4();
    test_deterministic();
    return tu_finish();
}
