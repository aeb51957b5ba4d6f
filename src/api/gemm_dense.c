/*
 * gemm_dense.c - dense GEMM entry points (SPEC 3): D = C + A @ B^T.
 *
 * As DeepGEMM (csrc/apis/gemm.hpp): `_nt` is the one core; `_nn`, `_tn`, `_tt` pass transposed
 * views of the operand (and of its scale tensor) and share its checks. The core accepts A and
 * B with any non-negative strides (K-major, MN-major or padded); D and C must have unit stride
 * along N. Every argument is validated before anything is written; then the engine
 * (src/engine/) runs, or the reference when dg_use_reference() or the engine declines.
 */
#include "../core/operand.h"
#include "../engine/engine.h"
#include "../reference/ref_gemm.h"
#include "gemm_alpha.h"

#include <string.h>

/* ---- shared checks ---------------------------------------------------------------------- */

/* D [m, n] BF16/FP32 with unit stride along N and no element addressed twice. */
static dg_status check_d(const dg_tensor *d, int64_t m, int64_t n) {
    static const dg_dtype kOut[2] = {DG_BFLOAT16, DG_FLOAT32};
    DG_TRY(dg_check_tensor(d, "d", 2));
    DG_TRY(dg_check_dtype_in(d, "d", kOut, 2));
    DG_TRY(dg_check_dim(d, "d", 0, m));
    DG_TRY(dg_check_dim(d, "d", 1, n));
    DG_TRY(dg_check_last_dim_contiguous(d, "d"));
    return dg_check_output(d, "d");
}

/* A and B agree on K; D is [M, N]. */
static dg_status check_problem(const dg_operand *a, const dg_operand *b, const dg_tensor *d,
                               const dg_tensor *c) {
    DG_CHECK(a->k == b->k, DG_ERR_SHAPE, "arguments 'a' and 'b' disagree on K (%lld vs %lld)",
             (long long)a->k, (long long)b->k);
    DG_TRY(check_d(d, a->mn, b->mn));
    return dg_check_c_like_d(c, d);
}

/* D must not overlap any read-only input (a scale tensor may be NULL). */
static dg_status check_inputs_apart(const dg_tensor *d, const dg_operand *a, const dg_operand *b) {
    DG_TRY(dg_check_no_overlap(d, "d", a->data, "a", false));
    DG_TRY(dg_check_no_overlap(d, "d", b->data, "b", false));
    DG_TRY(dg_check_no_overlap(d, "d", a->sf, "sfa", false));
    return dg_check_no_overlap(d, "d", b->sf, "sfb", false);
}

/* The engine unless the reference is forced or the engine declines this operand pair. */
static dg_status run_gemm(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const dg_tensor *c) {
    if (!dg_use_reference()) {
        const dg_status st = dg_engine_gemm(a, b, d, c);
        if (st != DG_ERR_UNSUPPORTED)
            return st;
    }
    DG_PATH_REFERENCE("these operands' scale blocks");
    dg_ref_gemm(a, 0, 0, a->mn, b, 0, 0, b->mn, d, c);
    return DG_OK;
}

/* The product A @ B^T alone, for the alpha epilogue (gemm_alpha.h). */
typedef struct product_ctx {
    const dg_operand *a, *b;
} product_ctx;

static dg_status product(const void *ctx, const dg_tensor *out) {
    const product_ctx *p = ctx;
    return run_gemm(p->a, p->b, out, NULL);
}

/* run_gemm, or with opts' alpha D = round(C + alpha * acc). */
static dg_status run_gemm_opts(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const dg_tensor *c,
                               const dg_gemm_options *opts) {
    if (!opts || !opts->has_alpha || a->k == 0) /* K = 0: D = C, as DeepGEMM's early return */
        return run_gemm(a, b, d, c);
    const product_ctx ctx = {a, b};
    return dg_gemm_with_alpha(d, c, a->mn, b->mn, opts->alpha, product, &ctx);
}

/* ---- BF16 ------------------------------------------------------------------------------- */

static dg_status bf16_gemm_nt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                              const dg_tensor *c, const dg_gemm_options *opts) {
    static const dg_dtype kIn[1] = {DG_BFLOAT16};
    dg_operand oa, ob;
    DG_TRY(dg_operand_init(&oa, "a", a, 0, kIn, 1));
    DG_TRY(dg_operand_init(&ob, "b", b, 0, kIn, 1));
    DG_TRY(check_problem(&oa, &ob, d, c));
    DG_TRY(check_inputs_apart(d, &oa, &ob));
    if (opts) {
        static const int kNone[3] = {0, 0, 0};
        DG_CHECK(!memcmp(opts->recipe, kNone, sizeof opts->recipe) &&
                     !memcmp(opts->recipe_a, kNone, sizeof opts->recipe_a) &&
                     !memcmp(opts->recipe_b, kNone, sizeof opts->recipe_b),
                 DG_ERR_VALUE, "arguments 'recipe', 'recipe_a' and 'recipe_b' must not be given to BF16 GEMMs");
        DG_TRY(dg_check_alpha(opts, true));
    }
    if (oa.mn == 0 || ob.mn == 0)
        return DG_OK;
    return run_gemm_opts(&oa, &ob, d, c, opts);
}

/* The four layouts, as fp8_fp4_layout below. */
static dg_status bf16_layout(int trans_a, int trans_b, const dg_tensor *a, const dg_tensor *b, const dg_tensor *d,
                             const dg_tensor *c, const dg_gemm_options *opts) {
    if (opts)
        dg_api_set_compiled_dims(opts->compiled_dims);
    dg_tensor at, bt;
    if (trans_a)
        a = dg_transposed_2d(a, &at);
    if (trans_b)
        b = dg_transposed_2d(b, &bt);
    return bf16_gemm_nt(a, b, d, c, opts);
}

dg_status dg_bf16_gemm_nt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_bf16_gemm_nt");
    return bf16_layout(0, 0, a, b, d, c, NULL);
}

dg_status dg_bf16_gemm_nn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_bf16_gemm_nn");
    return bf16_layout(0, 1, a, b, d, c, NULL);
}

dg_status dg_bf16_gemm_tn(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_bf16_gemm_tn");
    return bf16_layout(1, 1, a, b, d, c, NULL);
}

dg_status dg_bf16_gemm_tt(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_bf16_gemm_tt");
    return bf16_layout(1, 0, a, b, d, c, NULL);
}

dg_status dg_bf16_gemm_nt_ex(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c,
                             const dg_gemm_options *opts) {
    dg_api_begin("dg_bf16_gemm_nt");
    return bf16_layout(0, 0, a, b, d, c, opts);
}

dg_status dg_bf16_gemm_nn_ex(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c,
                             const dg_gemm_options *opts) {
    dg_api_begin("dg_bf16_gemm_nn");
    return bf16_layout(0, 1, a, b, d, c, opts);
}

dg_status dg_bf16_gemm_tn_ex(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c,
                             const dg_gemm_options *opts) {
    dg_api_begin("dg_bf16_gemm_tn");
    return bf16_layout(1, 1, a, b, d, c, opts);
}

dg_status dg_bf16_gemm_tt_ex(const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c,
                             const dg_gemm_options *opts) {
    dg_api_begin("dg_bf16_gemm_tt");
    return bf16_layout(1, 0, a, b, d, c, opts);
}

/* ---- FP8 / FP4 -------------------------------------------------------------------------- */

static const dg_dtype kFp8Fp4[2] = {DG_FLOAT8_E4M3, DG_FP4_E2M1X2};

/* Operand dtypes, then the recipe, then the scales, as DeepGEMM orders its checks. */
static dg_status init_scaled(dg_operand *oa, dg_operand *ob, const dg_tensor *a, const dg_tensor *sfa,
                             const dg_tensor *b, const dg_tensor *sfb, const dg_gemm_options *opts,
                             int n_allowed, int gran_a[2], int gran_b[2]) {
    DG_TRY(dg_operand_init(oa, "a", a, 0, kFp8Fp4, n_allowed));
    DG_TRY(dg_operand_init(ob, "b", b, 0, kFp8Fp4, n_allowed));
    DG_TRY(dg_resolve_recipe(opts, sfa, sfb, gran_a, gran_b));
    DG_TRY(dg_operand_set_scales(oa, "sfa", sfa, gran_a[0], gran_a[1]));
    return dg_operand_set_scales(ob, "sfb", sfb, gran_b[0], gran_b[1]);
}

static dg_status fp8_fp4_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                 const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                                 const dg_gemm_options *opts) {
    dg_operand oa, ob;
    int gran_a[2], gran_b[2];
    /* alpha is checked here; the recipe resolution shared with the grouped GEMMs rejects it. */
    DG_TRY(dg_check_alpha(opts, true));
    dg_gemm_options rest = opts ? *opts : dg_gemm_options_default();
    rest.has_alpha = 0;
    DG_TRY(init_scaled(&oa, &ob, a, sfa, b, sfb, &rest, 2, gran_a, gran_b));
    DG_TRY(check_problem(&oa, &ob, d, c));
    DG_TRY(check_inputs_apart(d, &oa, &ob));
    if (oa.mn == 0 || ob.mn == 0)
        return DG_OK;
    return run_gemm_opts(&oa, &ob, d, c, opts);
}

/* The four layouts: `t` operands (and their scales) arrive transposed and are turned back. */
static dg_status fp8_fp4_layout(int trans_a, int trans_b, const dg_tensor *a, const dg_tensor *sfa,
                                const dg_tensor *b, const dg_tensor *sfb, const dg_tensor *d,
                                const dg_tensor *c, const dg_gemm_options *opts) {
    dg_api_set_compiled_dims(opts ? opts->compiled_dims : NULL); /* the JIT's (engine/jit_ukr.c) */
    dg_tensor at, sfat, bt, sfbt;
    if (trans_a) {
        a = dg_transposed_2d(a, &at);
        sfa = dg_transposed_2d(sfa, &sfat);
    }
    if (trans_b) {
        b = dg_transposed_2d(b, &bt);
        sfb = dg_transposed_2d(sfb, &sfbt);
    }
    return fp8_fp4_gemm_nt(a, sfa, b, sfb, d, c, opts);
}

dg_status dg_fp8_fp4_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                             const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                             const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_fp4_gemm_nt");
    return fp8_fp4_layout(0, 0, a, sfa, b, sfb, d, c, opts);
}

dg_status dg_fp8_fp4_gemm_nn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                             const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                             const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_fp4_gemm_nn");
    return fp8_fp4_layout(0, 1, a, sfa, b, sfb, d, c, opts);
}

dg_status dg_fp8_fp4_gemm_tn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                             const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                             const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_fp4_gemm_tn");
    return fp8_fp4_layout(1, 1, a, sfa, b, sfb, d, c, opts);
}

dg_status dg_fp8_fp4_gemm_tt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                             const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                             const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_fp4_gemm_tt");
    return fp8_fp4_layout(1, 0, a, sfa, b, sfb, d, c, opts);
}

/* DeepGEMM's older names: the same functions (aliases in its Python module). */
dg_status dg_fp8_gemm_nt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                         const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                         const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_gemm_nt");
    return fp8_fp4_layout(0, 0, a, sfa, b, sfb, d, c, opts);
}

dg_status dg_fp8_gemm_nn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                         const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                         const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_gemm_nn");
    return fp8_fp4_layout(0, 1, a, sfa, b, sfb, d, c, opts);
}

dg_status dg_fp8_gemm_tn(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                         const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                         const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_gemm_tn");
    return fp8_fp4_layout(1, 1, a, sfa, b, sfb, d, c, opts);
}

dg_status dg_fp8_gemm_tt(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                         const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *c,
                         const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_gemm_tt");
    return fp8_fp4_layout(1, 0, a, sfa, b, sfb, d, c, opts);
}

/* ---- skip_head_mid (DeepGEMM csrc/apis/attention.hpp) ----------------------------------- */

/*
 * B holds `heads` groups of (left + right) rows; D holds `heads` groups of (left + mid + right)
 * columns. B row h*(left+right) + j goes to D column h*(left+mid+right) + j for j < left and
 * to h*(left+mid+right) + mid + j otherwise (DeepGEMM's EpilogueHeadSplits index map); the mid
 * columns are never written.
 */
static dg_status check_head_splits(const int *hs, int64_t n, int64_t *d_cols) {
    DG_CHECK(hs != NULL, DG_ERR_NULL_POINTER, "argument 'head_splits' is NULL");
    DG_CHECK(hs[0] >= 0 && hs[1] >= 0 && hs[2] >= 0 && (int64_t)hs[0] + hs[2] > 0, DG_ERR_VALUE,
             "argument 'head_splits' (%d, %d, %d) must be non-negative with left + right > 0", hs[0],
             hs[1], hs[2]);
    const int64_t lr = (int64_t)hs[0] + hs[2];
    DG_CHECK(n % lr == 0, DG_ERR_SHAPE,
             "argument 'b' has %lld rows, not a multiple of left + right = %lld (head_splits)",
             (long long)n, (long long)lr);
    int64_t mid_cols;
    DG_CHECK(dg_mul_ok(n / lr, hs[1], &mid_cols) && !__builtin_add_overflow(n, mid_cols, d_cols),
             DG_ERR_OVERFLOW, "argument 'head_splits': the number of columns of 'd' overflows");
    return DG_OK;
}

/* The engine computes all of A @ B^T into a float32 buffer, whose columns then go to their
 * places in D (rounded once, to D's dtype): the same values as computing each head directly. */
static dg_status skip_head_mid_engine(const dg_operand *a, const dg_operand *b, const dg_tensor *d, int64_t left,
                                      int64_t mid, int64_t right) {
    int64_t elems;
    DG_CHECK(dg_mul_ok(a->mn, b->mn, &elems) && elems <= INT64_MAX / 4, DG_ERR_OVERFLOW,
             "arguments 'a' and 'b': the product [%lld, %lld] is too large", (long long)a->mn, (long long)b->mn);
    float *buf = dg_malloc((size_t)elems * sizeof(float));
    DG_CHECK(buf != NULL, DG_ERR_ALLOC, "out of memory for a [%lld, %lld] float32 buffer", (long long)a->mn,
             (long long)b->mn);
    const dg_tensor full = dg_tensor_2d(buf, DG_FLOAT32, a->mn, b->mn);
    const dg_status st = dg_engine_gemm(a, b, &full, NULL);
    if (st == DG_OK) {
        const int64_t lr = left + right, w = left + mid + right;
        for (int64_t i = 0; i < a->mn; ++i)
            for (int64_t col = 0; col < b->mn; ++col) {
                const int64_t h = col / lr, j = col % lr, dcol = h * w + (j < left ? j : j + mid);
                dg_store_float(d, dg_ptr2(d, i, dcol), buf[i * b->mn + col]);
            }
    }
    dg_free(buf);
    return st;
}

dg_status dg_fp8_gemm_nt_skip_head_mid(const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                                       const dg_tensor *sfb, const dg_tensor *d, const int head_splits[3],
                                       const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_gemm_nt_skip_head_mid");
    DG_CHECK(!opts || (opts->recipe_a[0] == 0 && opts->recipe_a[1] == 0 && opts->recipe_b[0] == 0 &&
                       opts->recipe_b[1] == 0),
             DG_ERR_VALUE, "arguments 'recipe_a' and 'recipe_b' are not taken here; give 'recipe'");
    dg_operand oa, ob;
    int gran_a[2], gran_b[2];
    DG_TRY(init_scaled(&oa, &ob, a, sfa, b, sfb, opts, 1, gran_a, gran_b));
    DG_CHECK(gran_a[1] == 128 && gran_b[1] == 128, DG_ERR_VALUE,
             "argument 'recipe': gran_k must be 128 (got %d for A, %d for B)", gran_a[1], gran_b[1]);
    DG_CHECK(oa.k == ob.k, DG_ERR_SHAPE, "arguments 'a' and 'b' disagree on K (%lld vs %lld)",
             (long long)oa.k, (long long)ob.k);
    DG_CHECK(ob.mn > 0 && ob.k > 0, DG_ERR_SHAPE, "argument 'b' must not be empty (N = %lld, K = %lld)",
             (long long)ob.mn, (long long)ob.k);
    int64_t d_cols = 0;
    DG_TRY(check_head_splits(head_splits, ob.mn, &d_cols));
    DG_TRY(check_d(d, oa.mn, d_cols));
    DG_TRY(check_inputs_apart(d, &oa, &ob));
    if (oa.mn == 0)
        return DG_OK;

    const int64_t left = head_splits[0], mid = head_splits[1], right = head_splits[2];
    const int64_t heads = ob.mn / (left + right);
    if (!dg_use_reference()) {
        const dg_status st = skip_head_mid_engine(&oa, &ob, d, left, mid, right);
        if (st != DG_ERR_UNSUPPORTED)
            return st;
    }
    DG_PATH_REFERENCE("these operands' scale blocks");
    for (int64_t h = 0; h < heads; ++h) {
        const int64_t n0 = h * (left + right), col0 = h * (left + mid + right);
        const dg_tensor dl = dg_ref_view2d(d, -1, 0, oa.mn, col0, left);
        const dg_tensor dr = dg_ref_view2d(d, -1, 0, oa.mn, col0 + left + mid, right);
        dg_ref_gemm(&oa, 0, 0, oa.mn, &ob, 0, n0, n0 + left, &dl, NULL);
        dg_ref_gemm(&oa, 0, 0, oa.mn, &ob, 0, n0 + left, n0 + left + right, &dr, NULL);
    }
    return DG_OK;
}
