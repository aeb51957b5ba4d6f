/*
 * test_gemm_dense_bad.c - bad arguments for every dense GEMM entry point: each returns the
 * expected status, the message names the function and the argument, and D and C are bitwise
 * untouched. Mutations are made on `_nt`-oriented views ([MN, K] operands and scales) and the
 * `t` operands are transposed at call time, so one list of cases serves every layout.
 */
#include "test_gemm_dense_util.h"

enum { F_BF16 = 0, F_FP8_FP4 = 4, F_FP8 = 8, F_SKIP = 12, N_FN = 13 };
static const char *const kName[N_FN] = {
    "dg_bf16_gemm_nt",    "dg_bf16_gemm_nn",    "dg_bf16_gemm_tn",    "dg_bf16_gemm_tt",
    "dg_fp8_fp4_gemm_nt", "dg_fp8_fp4_gemm_nn", "dg_fp8_fp4_gemm_tn", "dg_fp8_fp4_gemm_tt",
    "dg_fp8_gemm_nt",     "dg_fp8_gemm_nn",     "dg_fp8_gemm_tn",     "dg_fp8_gemm_tt",
    "dg_fp8_gemm_nt_skip_head_mid"};
static const int kTransA[4] = {0, 0, 1, 1}, kTransB[4] = {0, 1, 1, 0};

/* One call's arguments; a NULL-able pointer per tensor so a case can drop it. */
typedef struct args {
    dg_tensor a, sfa, b, sfb, d, c;
    int has_a, has_sfa, has_b, has_sfb, has_d, has_c, has_opt;
    dg_gemm_options opt;
    int hs[3], has_hs;
} args;

static int is_scaled(int fn) { return fn >= F_FP8_FP4; }

static dg_status call(int fn, const args *x) {
    const int lay = fn % 4;
    dg_tensor a = x->a, sfa = x->sfa, b = x->b, sfb = x->sfb;
    if (fn < F_SKIP && kTransA[lay])
        a = dg_tensor_transpose(a, 0, 1), sfa = dg_tensor_transpose(sfa, 0, 1);
    if (fn < F_SKIP && kTransB[lay])
        b = dg_tensor_transpose(b, 0, 1), sfb = dg_tensor_transpose(sfb, 0, 1);
    const dg_tensor *pa = x->has_a ? &a : NULL, *pb = x->has_b ? &b : NULL;
    const dg_tensor *psa = x->has_sfa ? &sfa : NULL, *psb = x->has_sfb ? &sfb : NULL;
    const dg_tensor *pd = x->has_d ? &x->d : NULL, *pc = x->has_c ? &x->c : NULL;
    const dg_gemm_options *po = x->has_opt ? &x->opt : NULL;
    switch (fn) {
    case 0: return dg_bf16_gemm_nt(pa, pb, pd, pc);
    case 1: return dg_bf16_gemm_nn(pa, pb, pd, pc);
    case 2: return dg_bf16_gemm_tn(pa, pb, pd, pc);
    case 3: return dg_bf16_gemm_tt(pa, pb, pd, pc);
    case 4: return dg_fp8_fp4_gemm_nt(pa, psa, pb, psb, pd, pc, po);
    case 5: return dg_fp8_fp4_gemm_nn(pa, psa, pb, psb, pd, pc, po);
    case 6: return dg_fp8_fp4_gemm_tn(pa, psa, pb, psb, pd, pc, po);
    case 7: return dg_fp8_fp4_gemm_tt(pa, psa, pb, psb, pd, pc, po);
    case 8: return dg_fp8_gemm_nt(pa, psa, pb, psb, pd, pc, po);
    case 9: return dg_fp8_gemm_nn(pa, psa, pb, psb, pd, pc, po);
    case 10: return dg_fp8_gemm_tn(pa, psa, pb, psb, pd, pc, po);
    case 11: return dg_fp8_gemm_tt(pa, psa, pb, psb, pd, pc, po);
    default: return dg_fp8_gemm_nt_skip_head_mid(pa, psa, pb, psb, pd, x->has_hs ? x->hs : NULL, po);
    }
}

/* Valid arguments: M = 3, N = 8 (skip: 2 heads of (3, 2, 1)), K = 256, D FLOAT32 with padded
 * rows, C a separate FLOAT32 matrix; FP8 operands with default 1D2D float scales. */
enum { M = 3, N = 8, K = 256, LD = 16 };
static float g_dmem[M * LD * 2], g_cmem[M * LD];

static args baseline(int fn, top *a, top *b) {
    args x;
    memset(&x, 0, sizeof x);
    x.a = a->t, x.sfa = a->sf, x.b = b->t, x.sfb = b->sf;
    x.has_a = x.has_b = x.has_d = 1;
    x.has_sfa = x.has_sfb = is_scaled(fn);
    x.has_c = fn < F_SKIP;
    x.opt = dg_gemm_options_default();
    x.hs[0] = 3, x.hs[1] = 2, x.hs[2] = 1, x.has_hs = 1;
    const int64_t nd = fn == F_SKIP ? N + 2 * 2 : N;
    x.d = dg_tensor_2d(g_dmem, DG_FLOAT32, M, nd);
    x.d.strides[0] = LD;
    x.c = dg_tensor_2d(g_cmem, DG_FLOAT32, M, N);
    x.c.strides[0] = LD;
    return x;
}

typedef void (*mutate_fn)(args *x, int fn);
typedef struct bad_case {
    const char *what;
    mutate_fn mutate;
    dg_status want;
    const char *names; /* expected in the message */
    int only;          /* 0: all, 1: scaled only, 2: not skip, 3: skip only, 4: fp8_fp4 (not skip) */
} bad_case;

static void m_null_a(args *x, int fn) { (void)fn, x->has_a = 0; }
static void m_null_b(args *x, int fn) { (void)fn, x->has_b = 0; }
static void m_null_d(args *x, int fn) { (void)fn, x->has_d = 0; }
static void m_null_sfa(args *x, int fn) { (void)fn, x->has_sfa = 0; }
static void m_null_sfb(args *x, int fn) { (void)fn, x->has_sfb = 0; }
static void m_null_data(args *x, int fn) { (void)fn, x->a.data = NULL; }
static void m_dtype_a(args *x, int fn) { x->a.dtype = is_scaled(fn) ? DG_BFLOAT16 : DG_FLOAT8_E4M3; }
static void m_dtype_b(args *x, int fn) { x->b.dtype = is_scaled(fn) ? DG_INT8 : DG_FLOAT32; }
static void m_dtype_d(args *x, int fn) { (void)fn, x->d.dtype = DG_INT32; }
static void m_bad_dtype(args *x, int fn) { (void)fn, x->b.dtype = (dg_dtype)99; }
static void m_ndim_a(args *x, int fn) { (void)fn, x->a.ndim = 3, x->a.shape[2] = 1, x->a.strides[2] = 1; }
static void m_neg_stride(args *x, int fn) { (void)fn, x->b.strides[0] = -x->b.strides[0]; }
static void m_overflow(args *x, int fn) { (void)fn, x->a.strides[0] = INT64_MAX / 2; }
static void m_k_mismatch(args *x, int fn) { (void)fn, x->a.shape[1] -= 2; } /* same scale count */
static void m_d_rows(args *x, int fn) { (void)fn, x->d.shape[0] += 1; }
static void m_d_cols(args *x, int fn) { (void)fn, x->d.shape[1] -= 1; }
static void m_d_ncontig(args *x, int fn) { (void)fn, x->d.strides[0] = 1, x->d.strides[1] = M; }
static void m_d_selfoverlap(args *x, int fn) { (void)fn, x->d.strides[0] = 2; }
static void m_c_dtype(args *x, int fn) { (void)fn, x->c.dtype = DG_BFLOAT16; }
static void m_c_shape(args *x, int fn) { (void)fn, x->c.shape[1] += 1; }
static void m_c_ncontig(args *x, int fn) { (void)fn, x->c.strides[1] = 2; } /* still inside g_cmem */
static void m_c_partial(args *x, int fn) { (void)fn, x->c = x->d, x->c.data = (float *)x->d.data + 1; }
static void m_c_samebase(args *x, int fn) { (void)fn, x->c = x->d, x->c.strides[0] = LD - 1; }
static void m_alias_a(args *x, int fn) { (void)fn, x->a.data = (char *)x->d.data + 8; }
static void m_alias_b(args *x, int fn) { (void)fn, x->b.data = x->d.data; }
static void m_alias_sfa(args *x, int fn) { (void)fn, x->sfa.data = (float *)x->d.data + LD; }
static void m_alias_sfb(args *x, int fn) { (void)fn, x->sfb.data = x->d.data; }
static void m_sfa_dtype(args *x, int fn) { (void)fn, x->sfa.dtype = DG_BFLOAT16; }
static void m_sfa_shape(args *x, int fn) { (void)fn, x->sfa.shape[1] += 1; }
static void m_sfb_shape(args *x, int fn) { (void)fn, x->sfb.shape[0] += 1; } /* 1D2D wants 1 row */
static void m_sfb_1d1d(args *x, int fn) { (void)fn, x->has_opt = 1, x->opt.recipe[0] = 1, x->opt.recipe[1] = 1, x->opt.recipe[2] = 128; }
static void m_sf_packed_2d(args *x, int fn) {
    (void)fn;
    x->sfb.dtype = DG_INT32; /* packed scales cannot have gran_mn 128 */
    x->has_opt = 1, x->opt.recipe[0] = 1, x->opt.recipe[1] = 128, x->opt.recipe[2] = 128;
}
static void m_recipe_both(args *x, int fn) {
    (void)fn, x->has_opt = 1, x->opt.recipe[0] = 1, x->opt.recipe[1] = 128, x->opt.recipe[2] = 128;
    x->opt.recipe_a[0] = 1, x->opt.recipe_a[1] = 128, x->opt.recipe_b[0] = 128, x->opt.recipe_b[1] = 128;
}
static void m_recipe_a_only(args *x, int fn) { (void)fn, x->has_opt = 1, x->opt.recipe_a[0] = 1, x->opt.recipe_a[1] = 128; }
static void m_recipe_neg(args *x, int fn) { (void)fn, x->has_opt = 1, x->opt.recipe[0] = 1, x->opt.recipe[1] = -128, x->opt.recipe[2] = 128; }
static void m_fp4_strided(args *x, int fn) {
    (void)fn;
    x->a.dtype = DG_FP4_E2M1X2, x->a.shape[1] = K / 2, x->a.strides[1] = 2; /* no unit stride */
}
static void m_hs_null(args *x, int fn) { (void)fn, x->has_hs = 0; }
static void m_hs_neg(args *x, int fn) { (void)fn, x->hs[1] = -1; }
static void m_hs_zero(args *x, int fn) { (void)fn, x->hs[0] = 0, x->hs[2] = 0; }
static void m_hs_notmult(args *x, int fn) { (void)fn, x->hs[0] = 2, x->hs[1] = 5; } /* 8 % 3 != 0 */
static void m_skip_fp4(args *x, int fn) { (void)fn, x->a.dtype = DG_FP4_E2M1X2, x->a.shape[1] = K / 2; }
static void m_skip_recipe_a(args *x, int fn) {
    (void)fn, x->has_opt = 1, x->opt.recipe_a[0] = 1, x->opt.recipe_a[1] = 128;
    x->opt.recipe_b[0] = 128, x->opt.recipe_b[1] = 128;
}
static void m_skip_gran_k(args *x, int fn) {
    (void)fn, x->has_opt = 1, x->opt.recipe[0] = 1, x->opt.recipe[1] = 128, x->opt.recipe[2] = 64;
    x->sfa.shape[1] = 4, x->sfb.shape[1] = 4; /* consistent shapes, refused gran_k */
}
static void m_skip_k0(args *x, int fn) { (void)fn, x->a.shape[1] = 0, x->b.shape[1] = 0, x->sfa.shape[1] = 0, x->sfb.shape[1] = 0; }

static const bad_case kCases[] = {
    {"a NULL", m_null_a, DG_ERR_NULL_POINTER, "'a'", 0},
    {"b NULL", m_null_b, DG_ERR_NULL_POINTER, "'b'", 0},
    {"d NULL", m_null_d, DG_ERR_NULL_POINTER, "'d'", 0},
    {"a data NULL", m_null_data, DG_ERR_NULL_POINTER, "'a'", 0},
    {"a dtype", m_dtype_a, DG_ERR_DTYPE, "'a'", 0},
    {"b dtype", m_dtype_b, DG_ERR_DTYPE, "'b'", 0},
    {"d dtype", m_dtype_d, DG_ERR_DTYPE, "'d'", 0},
    {"invalid dtype", m_bad_dtype, DG_ERR_DTYPE, "'b'", 0},
    {"a 3-D", m_ndim_a, DG_ERR_SHAPE, "'a'", 0},
    {"negative stride", m_neg_stride, DG_ERR_LAYOUT, "'b'", 0},
    {"size overflow", m_overflow, DG_ERR_OVERFLOW, "'a'", 0},
    {"K mismatch", m_k_mismatch, DG_ERR_SHAPE, "'a'", 0},
    {"d rows", m_d_rows, DG_ERR_SHAPE, "'d'", 0},
    {"d cols", m_d_cols, DG_ERR_SHAPE, "'d'", 0},
    {"d not N-contiguous", m_d_ncontig, DG_ERR_LAYOUT, "'d'", 0},
    {"d rows overlap", m_d_selfoverlap, DG_ERR_LAYOUT, "'d'", 0},
    {"a overlaps d", m_alias_a, DG_ERR_LAYOUT, "'a'", 0},
    {"b overlaps d", m_alias_b, DG_ERR_LAYOUT, "'b'", 0},
    {"c dtype", m_c_dtype, DG_ERR_DTYPE, "'c'", 2},
    {"c shape", m_c_shape, DG_ERR_SHAPE, "'c'", 2},
    {"c not N-contiguous", m_c_ncontig, DG_ERR_LAYOUT, "'c'", 2},
    {"c partly overlaps d", m_c_partial, DG_ERR_LAYOUT, "'c'", 2},
    {"c same data, other strides", m_c_samebase, DG_ERR_LAYOUT, "'c'", 2},
    {"sfa NULL", m_null_sfa, DG_ERR_NULL_POINTER, "'sfa'", 1},
    {"sfb NULL", m_null_sfb, DG_ERR_NULL_POINTER, "'sfb'", 1},
    {"sfa dtype", m_sfa_dtype, DG_ERR_DTYPE, "'sfa'", 1},
    {"sfa shape", m_sfa_shape, DG_ERR_SHAPE, "'sfa'", 1},
    {"sfb shape", m_sfb_shape, DG_ERR_SHAPE, "'sfb'", 1},
    {"sfb shape for recipe (1,1,128)", m_sfb_1d1d, DG_ERR_SHAPE, "'sfb'", 1},
    {"sfa overlaps d", m_alias_sfa, DG_ERR_LAYOUT, "'sfa'", 1},
    {"sfb overlaps d", m_alias_sfb, DG_ERR_LAYOUT, "'sfb'", 1},
    {"packed sfb with gran_n 128", m_sf_packed_2d, DG_ERR_VALUE, "'sfb'", 1},
    {"recipe and recipe_a", m_recipe_both, DG_ERR_VALUE, "'recipe'", 1},
    {"recipe_a without recipe_b", m_recipe_a_only, DG_ERR_VALUE, "'recipe_a'", 1},
    {"negative granularity", m_recipe_neg, DG_ERR_VALUE, "'recipe'", 1},
    {"FP4 without unit stride", m_fp4_strided, DG_ERR_LAYOUT, "'a'", 4},
    {"head_splits NULL", m_hs_null, DG_ERR_NULL_POINTER, "'head_splits'", 3},
    {"head_splits negative", m_hs_neg, DG_ERR_VALUE, "'head_splits'", 3},
    {"head_splits left + right = 0", m_hs_zero, DG_ERR_VALUE, "'head_splits'", 3},
    {"N not a multiple of left + right", m_hs_notmult, DG_ERR_SHAPE, "head_splits", 3},
    {"skip: FP4 a", m_skip_fp4, DG_ERR_DTYPE, "'a'", 3},
    {"skip: recipe_a", m_skip_recipe_a, DG_ERR_VALUE, "'recipe_a'", 3},
    {"skip: gran_k 64", m_skip_gran_k, DG_ERR_VALUE, "'recipe': gran_k", 3},
    {"skip: K = 0", m_skip_k0, DG_ERR_SHAPE, "'b'", 3},
};

static int applies(int only, int fn) {
    switch (only) {
    case 1: return is_scaled(fn);
    case 2: return fn != F_SKIP;
    case 3: return fn == F_SKIP;
    case 4: return fn >= F_FP8_FP4 && fn < F_SKIP;
    default: return 1;
    }
}

int main(void) {
    tu_rng r = {21};
    for (int fn = 0; fn < N_FN; ++fn) {
        const dg_dtype dt = is_scaled(fn) ? DG_FLOAT8_E4M3 : DG_BFLOAT16;
        top a = top_make(&r, dt, M, K, 0, 1, 128, 0, 0);
        top b = top_make(&r, dt, N, K, 0, 128, 128, 0, 0);
        for (size_t i = 0; i < sizeof g_dmem / sizeof g_dmem[0]; ++i)
            g_dmem[i] = (float)i, g_cmem[i % (M * LD)] = -(float)i;
        {
            args ok = baseline(fn, &a, &b);
            TU_CHECK(call(fn, &ok) == DG_OK, "%s: baseline arguments are valid: %s", kName[fn], dg_last_error());
        }
        for (size_t ci = 0; ci < sizeof kCases / sizeof kCases[0]; ++ci) {
            const bad_case *bc = &kCases[ci];
            if (!applies(bc->only, fn))
                continue;
            args x = baseline(fn, &a, &b);
            bc->mutate(&x, fn);
            float dsnap[sizeof g_dmem / sizeof g_dmem[0]], csnap[M * LD];
            memcpy(dsnap, g_dmem, sizeof dsnap);
            memcpy(csnap, g_cmem, sizeof csnap);
            const dg_status st = call(fn, &x);
            const char *msg = dg_last_error();
            TU_CHECK(st == bc->want && strstr(msg, bc->names) && strstr(msg, kName[fn]) &&
                         memcmp(dsnap, g_dmem, sizeof dsnap) == 0 && memcmp(csnap, g_cmem, sizeof csnap) == 0,
                     "%s / %s: got %s want %s, message \"%s\" (should name %s), outputs %s", kName[fn], bc->what,
                     dg_status_string(st), dg_status_string(bc->want), msg, bc->names,
                     memcmp(dsnap, g_dmem, sizeof dsnap) || memcmp(csnap, g_cmem, sizeof csnap) ? "CHANGED" : "intact");
        }
        top_free(&a);
        top_free(&b);
    }
    return tu_finish();
}
