/*
 * test_cublaslt.c - DeepGEMM 2.8's cuBLASLt GEMMs (dg_cublaslt_gemm_{nt,nn,tn,tt}) and FP4
 * aliases (dg_fp4_gemm_nt, dg_m_grouped_fp4_gemm_nt_{contiguous,masked}).
 *
 * cuBLASLt GEMMs: on odd shapes, every layout, K- and MN-major padded operands, BF16 / E4M3 /
 * FLOAT32 inputs and every allowed D, with and without C (separate or D itself):
 *  - exact inputs (small integers and halves, every partial sum exact in float32) give exactly
 *    the exact result on every engine variant and on the reference backend;
 *  - random inputs against this file's double-precision formula (calc_diff), and BF16 inputs
 *    bitwise equal to dg_bf16_gemm_* (the same engine);
 *  - bad arguments: the status, a message naming the function and the argument, D untouched.
 * FP4 aliases: bitwise the fp8_fp4 function's D, and errors under the alias's name.
 */
#include "common/engine_variants.h"
#include "test_gemm_dense_util.h"

static const char *const kLay[4] = {"nt", "nn", "tn", "tt"};
static const int kTransA[4] = {0, 0, 1, 1}, kTransB[4] = {0, 1, 1, 0};

static dg_status cublaslt(int lay, const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    switch (lay) {
    case 0: return dg_cublaslt_gemm_nt(a, b, d, c);
    case 1: return dg_cublaslt_gemm_nn(a, b, d, c);
    case 2: return dg_cublaslt_gemm_tn(a, b, d, c);
    default: return dg_cublaslt_gemm_tt(a, b, d, c);
    }
}

static dg_status bf16(int lay, const dg_tensor *a, const dg_tensor *b, const dg_tensor *d, const dg_tensor *c) {
    switch (lay) {
    case 0: return dg_bf16_gemm_nt(a, b, d, c);
    case 1: return dg_bf16_gemm_nn(a, b, d, c);
    case 2: return dg_bf16_gemm_tn(a, b, d, c);
    default: return dg_bf16_gemm_tt(a, b, d, c);
    }
}

/* An unscaled operand of logical shape [mn, k] (the `_nt` view), K- or MN-major with padded
 * leading stride; `val` holds what the GEMM must see. exact: values from a small set. */
typedef struct opnd {
    int64_t mn, k;
    float *val;
    void *mem;
    dg_tensor t;
} opnd;

static float draw(tu_rng *r, dg_dtype dt, int exact, uint32_t *bits) {
    float v;
    if (dt == DG_FLOAT8_E4M3) {
        uint8_t b;
        if (exact) {
            static const float kSet[9] = {-4.0f, -2.0f, -1.5f, -1.0f, 0.0f, 0.5f, 1.0f, 3.0f, 4.0f};
            b = dg_float_to_e4m3(kSet[tu_randint(r, 0, 8)]);
        } else {
            do
                b = (uint8_t)tu_next(r);
            while ((b & 0x7f) == 0x7f); /* no NaN */
        }
        *bits = b;
        return dg_e4m3_to_float(b);
    }
    v = exact ? (float)tu_randint(r, -8, 8) * 0.5f : (float)tu_normal(r);
    if (dt == DG_BFLOAT16) {
        *bits = dg_float_to_bf16(v);
        return dg_bf16_to_float((uint16_t)*bits);
    }
    memcpy(bits, &v, 4);
    return v;
}

static opnd opnd_make(tu_rng *r, dg_dtype dt, int64_t mn, int64_t k, int mn_major, int exact) {
    opnd o;
    o.mn = mn, o.k = k;
    o.val = malloc((size_t)(mn * k + 1) * sizeof(float));
    const size_t es = dg_dtype_size(dt);
    const int64_t ld = (mn_major ? mn : k) + 3, outer = mn_major ? k : mn;
    o.mem = malloc((size_t)(ld * outer + 1) * es);
    memset(o.mem, 0x7f, (size_t)(ld * outer + 1) * es); /* padding: NaN-ish garbage */
    o.t = dg_tensor_2d(o.mem, dt, mn, k);
    o.t.strides[0] = mn_major ? 1 : ld;
    o.t.strides[1] = mn_major ? ld : 1;
    for (int64_t i = 0; i < mn; ++i)
        for (int64_t kk = 0; kk < k; ++kk) {
            uint32_t bits;
            o.val[i * k + kk] = draw(r, dt, exact, &bits);
            const int64_t at = i * o.t.strides[0] + kk * o.t.strides[1];
            if (es == 1)
                ((uint8_t *)o.mem)[at] = (uint8_t)bits;
            else if (es == 2)
                ((uint16_t *)o.mem)[at] = (uint16_t)bits;
            else
                memcpy((uint32_t *)o.mem + at, &bits, 4);
        }
    return o;
}

static void opnd_free(opnd *o) {
    free(o->val);
    free(o->mem);
}

/* The view the layout's function takes: `t` operands are passed as [K, MN]. */
static dg_tensor as_arg(const opnd *o, int trans) { return trans ? dg_tensor_transpose(o->t, 0, 1) : o->t; }

/* round(C + sum_k a*b) in double, as a float (then D's dtype). */
static float expect(const opnd *a, int64_t m, const opnd *b, int64_t n, double c) {
    double acc = c;
    for (int64_t kk = 0; kk < a->k; ++kk)
        acc += (double)a->val[m * a->k + kk] * (double)b->val[n * b->k + kk];
    return (float)acc;
}

static uint32_t bits_of(dg_dtype dt, float f) {
    if (dt == DG_BFLOAT16)
        return dg_float_to_bf16(f);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* c_mode: 0 none, 1 separate C, 2 C = D (accumulate in place). Returns calc_diff of D against
 * the double formula; *exact_ok = every element bitwise equal to it. */
static double run_case(tu_rng *r, int lay, dg_dtype in, dg_dtype out, int64_t m, int64_t n, int64_t k, int mn_major,
                       int c_mode, int exact, int *exact_ok, dg_status *st) {
    opnd a = opnd_make(r, in, m, k, mn_major, exact), b = opnd_make(r, in, n, k, !mn_major, exact);
    dg_tensor d = tg_out(r, out, m, n, 2, c_mode == 2), c = tg_out(r, out, m, n, 5, 1);
    if (exact && c_mode) /* exact C: halves */
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                const float v = (float)tu_randint(r, -20, 20) * 0.5f;
                dg_tensor *t = c_mode == 2 ? &d : &c;
                void *p = (char *)t->data + (i * t->strides[0] + j) * dg_dtype_size(out);
                if (out == DG_FLOAT32)
                    memcpy(p, &v, 4);
                else
                    *(uint16_t *)p = dg_float_to_bf16(v);
            }
    float *cv = malloc((size_t)(m * n + 1) * sizeof(float)), *got = malloc((size_t)(m * n + 1) * sizeof(float));
    float *want = malloc((size_t)(m * n + 1) * sizeof(float));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
            cv[i * n + j] = c_mode == 0 ? 0.0f : tg_get(c_mode == 2 ? &d : &c, i, j);
    const dg_tensor ta = as_arg(&a, kTransA[lay]), tb = as_arg(&b, kTransB[lay]);
    *st = cublaslt(lay, &ta, &tb, &d, c_mode == 0 ? NULL : c_mode == 1 ? &c : &d);
    *exact_ok = 1;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            const float e = expect(&a, i, &b, j, cv[i * n + j]);
            want[i * n + j] = out == DG_BFLOAT16 ? dg_bf16_to_float(dg_float_to_bf16(e)) : e;
            got[i * n + j] = tg_get(&d, i, j);
            if (tg_bits(&d, i, j) != bits_of(out, e))
                *exact_ok = 0;
        }
    const double diff = tu_calc_diff(got, want, (size_t)(m * n));
    free(cv), free(got), free(want);
    free(d.data), free(c.data);
    opnd_free(&a), opnd_free(&b);
    return diff;
}

static const int64_t kShapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {70, 9, 130}, {2, 19, 0}, {5, 40, 257}};
enum { N_SHAPES = sizeof kShapes / sizeof kShapes[0] };

static void test_exact_all_variants(void) {
    const dg_isa best = dg_get_isa();
    static const dg_dtype kIn[3] = {DG_BFLOAT16, DG_FLOAT8_E4M3, DG_FLOAT32};
    tu_rng r = {11};
    for (int v = -1; v < tu_engine_variants(best); ++v) {
        if (v < 0)
            dg_set_backend(DG_BACKEND_REFERENCE);
        else
            dg_set_backend(DG_BACKEND_AUTO), tu_engine_variant_set(v);
        for (int lay = 0; lay < 4; ++lay)
            for (int ii = 0; ii < 3; ++ii)
                for (int o = 0; o < 2; ++o) {
                    const dg_dtype in = kIn[ii], out = o ? DG_FLOAT32 : DG_BFLOAT16;
                    if (in == DG_FLOAT32 && out != DG_FLOAT32)
                        continue;
                    for (int s = 0; s < N_SHAPES; ++s) {
                        const int c_mode = (s + lay + o) % 3, mn_major = (s + ii) % 2;
                        int exact_ok;
                        dg_status st;
                        run_case(&r, lay, in, out, kShapes[s][0], kShapes[s][1], kShapes[s][2], mn_major, c_mode, 1,
                                 &exact_ok, &st);
                        TU_CHECK(st == DG_OK && exact_ok, "variant %d %s in %s out %s shape %lld %lld %lld c %d: %s", v,
                                 kLay[lay], dg_dtype_name(in), dg_dtype_name(out), (long long)kShapes[s][0],
                                 (long long)kShapes[s][1], (long long)kShapes[s][2], c_mode, dg_last_error());
                    }
                }
    }
    dg_set_backend(DG_BACKEND_AUTO);
    tu_engine_variants_done(best);
}

static void test_random(void) {
    static const dg_dtype kIn[3] = {DG_BFLOAT16, DG_FLOAT8_E4M3, DG_FLOAT32};
    tu_rng r = {12};
    for (int lay = 0; lay < 4; ++lay)
        for (int ii = 0; ii < 3; ++ii)
            for (int o = 0; o < 2; ++o) {
                const dg_dtype in = kIn[ii], out = o ? DG_FLOAT32 : DG_BFLOAT16;
                if (in == DG_FLOAT32 && out != DG_FLOAT32)
                    continue;
                for (int s = 0; s < N_SHAPES; ++s) {
                    if (kShapes[s][2] == 0)
                        continue;
                    for (int c_mode = 0; c_mode < 3; ++c_mode) {
                        int exact_ok;
                        dg_status st;
                        const double diff = run_case(&r, lay, in, out, kShapes[s][0], kShapes[s][1], kShapes[s][2],
                                                     (s + c_mode) % 2, c_mode, 0, &exact_ok, &st);
                        /* FLOAT32 inputs run the reference: exactly the double formula. */
                        const int ok = in == DG_FLOAT32 ? exact_ok : diff < (out == DG_BFLOAT16 ? 1e-4 : 1e-6);
                        TU_CHECK(st == DG_OK && ok, "%s in %s out %s shape %lld %lld %lld c %d: diff %g (%s)",
                                 kLay[lay], dg_dtype_name(in), dg_dtype_name(out), (long long)kShapes[s][0],
                                 (long long)kShapes[s][1], (long long)kShapes[s][2], c_mode, diff, dg_last_error());
                    }
                }
            }
}

/* BF16 operands: bitwise the D of dg_bf16_gemm_* (both on the engine). */
static void test_same_as_bf16_gemm(void) {
    tu_rng r = {13};
    for (int lay = 0; lay < 4; ++lay)
        for (int s = 0; s < N_SHAPES; ++s) {
            const int64_t m = kShapes[s][0] * 3, n = kShapes[s][1], k = kShapes[s][2];
            opnd a = opnd_make(&r, DG_BFLOAT16, m, k, s % 2, 0), b = opnd_make(&r, DG_BFLOAT16, n, k, 0, 0);
            const dg_tensor ta = as_arg(&a, kTransA[lay]), tb = as_arg(&b, kTransB[lay]);
            dg_tensor c = tg_out(&r, DG_BFLOAT16, m, n, 1, 1);
            dg_tensor d1 = tg_out(&r, DG_BFLOAT16, m, n, 0, 0), d2 = tg_out(&r, DG_BFLOAT16, m, n, 0, 0);
            TU_CHECK_OK(cublaslt(lay, &ta, &tb, &d1, &c));
            TU_CHECK_OK(bf16(lay, &ta, &tb, &d2, &c));
            TU_CHECK(memcmp(d1.data, d2.data, (size_t)(m * n) * 2) == 0, "%s shape %lld %lld %lld: not bitwise bf16_gemm",
                     kLay[lay], (long long)m, (long long)n, (long long)k);
            free(c.data), free(d1.data), free(d2.data);
            opnd_free(&a), opnd_free(&b);
        }
}

/* ---- bad arguments ----------------------------------------------------------------------- */

static int names(const char *fn, const char *arg) {
    const char *msg = dg_last_error();
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", arg);
    return strncmp(msg, fn, strlen(fn)) == 0 && msg[strlen(fn)] == ':' && strstr(msg, quoted) != NULL;
}

static void test_bad(void) {
    enum { M = 4, N = 6, K = 10 };
    tu_rng r = {14};
    for (int lay = 0; lay < 4; ++lay) {
        char fn[32];
        snprintf(fn, sizeof fn, "dg_cublaslt_gemm_%s", kLay[lay]);
        opnd a = opnd_make(&r, DG_BFLOAT16, M, K, 0, 0), b = opnd_make(&r, DG_BFLOAT16, N, K, 0, 0);
        opnd af = opnd_make(&r, DG_FLOAT32, M, K, 0, 0), bk = opnd_make(&r, DG_BFLOAT16, N, K + 1, 0, 0);
        dg_tensor d = tg_out(&r, DG_FLOAT32, M, N, 0, 1), db = tg_out(&r, DG_BFLOAT16, M, N, 0, 1);
        dg_tensor cb = tg_out(&r, DG_BFLOAT16, M, N, 0, 1);
        void *snap = tu_snapshot(&d), *snapb = tu_snapshot(&db);
        const dg_tensor ta = as_arg(&a, kTransA[lay]), tb = as_arg(&b, kTransB[lay]);
        const dg_tensor taf = as_arg(&af, kTransA[lay]), tbk = as_arg(&bk, kTransB[lay]);
        dg_tensor t;

#define BAD(call, status, arg)                                                                             \
    do {                                                                                                   \
        TU_CHECK_STATUS(call, status);                                                                     \
        TU_CHECK(names(fn, arg), "%s: message does not name %s and '%s': %s", #call, fn, arg, dg_last_error()); \
        TU_CHECK(tu_unchanged(&d, snap) && tu_unchanged(&db, snapb), "%s: %s wrote D", #call, fn);         \
    } while (0)

        BAD(cublaslt(lay, NULL, &tb, &d, NULL), DG_ERR_NULL_POINTER, "a");
        BAD(cublaslt(lay, &ta, NULL, &d, NULL), DG_ERR_NULL_POINTER, "b");
        BAD(cublaslt(lay, &ta, &tb, NULL, NULL), DG_ERR_NULL_POINTER, "d");
        t = ta, t.dtype = DG_INT32;
        BAD(cublaslt(lay, &t, &tb, &d, NULL), DG_ERR_DTYPE, "a");
        t = tb, t.dtype = DG_FP4_E2M1X2; /* FP4 needs scales: the fp8_fp4 GEMMs */
        BAD(cublaslt(lay, &ta, &t, &d, NULL), DG_ERR_DTYPE, "b");
        BAD(cublaslt(lay, &taf, &tb, &d, NULL), DG_ERR_DTYPE, "b");  /* mixed dtypes */
        BAD(cublaslt(lay, &ta, &tbk, &d, NULL), DG_ERR_SHAPE, "b");  /* K disagrees */
        t = ta, t.ndim = 3, t.shape[2] = 1, t.strides[2] = 1;
        BAD(cublaslt(lay, &t, &tb, &d, NULL), DG_ERR_SHAPE, "a");
        t = d, t.dtype = DG_INT32;
        BAD(cublaslt(lay, &ta, &tb, &t, NULL), DG_ERR_DTYPE, "d");
        {
            dg_tensor af_b = as_arg(&af, kTransB[lay]); /* FLOAT32 [N?]: reuse af as b with N = M */
            dg_tensor dsq = db;
            dsq.shape[1] = M;
            BAD(cublaslt(lay, &taf, &af_b, &dsq, NULL), DG_ERR_DTYPE, "d"); /* FLOAT32 in, BF16 out */
        }
        t = d, t.shape[1] = N - 1;
        BAD(cublaslt(lay, &ta, &tb, &t, NULL), DG_ERR_SHAPE, "d");
        t = d, t.shape[0] = N, t.shape[1] = M, t.strides[0] = 1, t.strides[1] = N; /* column-major D */
        BAD(cublaslt(lay, &ta, &tb, &t, NULL), DG_ERR_SHAPE, "d");
        t = dg_tensor_transpose(dg_tensor_2d(d.data, DG_FLOAT32, N, M), 0, 1); /* [M, N], N stride M */
        BAD(cublaslt(lay, &ta, &tb, &t, NULL), DG_ERR_LAYOUT, "d");
        BAD(cublaslt(lay, &ta, &tb, &d, &cb), DG_ERR_DTYPE, "c");
        t = cb, t.shape[0] = M - 1;
        BAD(cublaslt(lay, &ta, &tb, &db, &t), DG_ERR_SHAPE, "c");
        t = db, t.data = (uint16_t *)db.data + 1; /* overlaps D, not D itself (tg_out has a spare element) */
        BAD(cublaslt(lay, &ta, &tb, &db, &t), DG_ERR_LAYOUT, "c");
        {
            const dg_tensor dav = dg_tensor_2d(a.mem, DG_BFLOAT16, M, N); /* D over A's memory */
            TU_CHECK_STATUS(cublaslt(lay, &ta, &tb, &dav, NULL), DG_ERR_LAYOUT);
            TU_CHECK(names(fn, "a"), "D over A: %s", dg_last_error());
        }
#undef BAD
        free(snap), free(snapb);
        free(d.data), free(db.data), free(cb.data);
        opnd_free(&a), opnd_free(&b), opnd_free(&af), opnd_free(&bk);
    }
}

/* ---- FP4 aliases ---------------------------------------------------------------------------- */

static void test_fp4_aliases(void) {
    tu_rng r = {15};
    /* Dense: FP4 x FP4 (integer path) and FP8 x FP4, float and packed scales. */
    for (int v = 0; v < 2; ++v) {
        const int64_t m = 5, n = 24, k = 192;
        top a = top_make(&r, v ? DG_FLOAT8_E4M3 : DG_FP4_E2M1X2, m, k, 0, 1, v ? 128 : 32, !v, 0);
        top b = top_make(&r, DG_FP4_E2M1X2, n, k, 0, 1, 32, 1, 0);
        dg_gemm_options o = dg_gemm_options_default();
        o.recipe_a[0] = 1, o.recipe_a[1] = v ? 128 : 32, o.recipe_b[0] = 1, o.recipe_b[1] = 32;
        dg_tensor d1 = tg_out(&r, DG_BFLOAT16, m, n, 0, 0), d2 = tg_out(&r, DG_BFLOAT16, m, n, 0, 0);
        TU_CHECK_OK(dg_fp4_gemm_nt(&a.t, &a.sf, &b.t, &b.sf, &d1, NULL, &o));
        TU_CHECK_OK(dg_fp8_fp4_gemm_nt(&a.t, &a.sf, &b.t, &b.sf, &d2, NULL, &o));
        TU_CHECK(memcmp(d1.data, d2.data, (size_t)(m * n) * 2) == 0, "dg_fp4_gemm_nt differs from dg_fp8_fp4_gemm_nt");
        double dd = 0;
        float *got = tu_to_float(&d1), *want = malloc((size_t)(m * n) * sizeof(float));
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
                want[i * n + j] = dg_bf16_to_float((uint16_t)tg_expect(&a, i, &b, j, 0.0, DG_BFLOAT16));
        dd = tu_calc_diff(got, want, (size_t)(m * n));
        TU_CHECK(dd < 1e-5, "dg_fp4_gemm_nt against the formula: %g", dd);
        free(got), free(want);
        void *snap = tu_snapshot(&d1);
        dg_tensor bad = d1;
        bad.shape[1] = n - 1;
        TU_CHECK_STATUS(dg_fp4_gemm_nt(&a.t, &a.sf, &b.t, &b.sf, &bad, NULL, &o), DG_ERR_SHAPE);
        TU_CHECK(names("dg_fp4_gemm_nt", "d") && !strstr(dg_last_error(), "fp8_fp4"), "alias message: %s",
                 dg_last_error());
        TU_CHECK_STATUS(dg_fp4_gemm_nt(&a.t, NULL, &b.t, &b.sf, &d1, NULL, &o), DG_ERR_NULL_POINTER);
        TU_CHECK(names("dg_fp4_gemm_nt", "sfa"), "alias message: %s", dg_last_error());
        TU_CHECK(tu_unchanged(&d1, snap), "failed dg_fp4_gemm_nt wrote D");
        free(snap);
        free(d1.data), free(d2.data);
        top_free(&a), top_free(&b);
    }

    /* m-grouped: G = 2 FP4 experts [N, K]; contiguous rows and masked groups. */
    enum { G = 2, MG = 6, NG = 16, KG = 128 };
    top e[G], x = top_make(&r, DG_FP4_E2M1X2, G * MG, KG, 0, 1, 32, 1, 0);
    uint8_t *bmem = malloc((size_t)G * NG * KG / 2);
    uint32_t *sbmem = malloc((size_t)G * NG * (KG / 128) * 4);
    for (int g = 0; g < G; ++g) {
        e[g] = top_make(&r, DG_FP4_E2M1X2, NG, KG, 0, 1, 32, 1, 0);
        for (int i = 0; i < NG; ++i) {
            memcpy(bmem + ((size_t)g * NG + i) * KG / 2, (uint8_t *)e[g].mem + i * e[g].t.strides[0], KG / 2);
            sbmem[g * NG + i] = ((uint32_t *)e[g].sfmem)[i * e[g].sf.strides[0]];
        }
    }
    dg_tensor b3 = dg_tensor_3d(bmem, DG_FP4_E2M1X2, G, NG, KG / 2), sb3 = dg_tensor_3d(sbmem, DG_INT32, G, NG, 1);
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe_a[0] = 1, o.recipe_a[1] = 32, o.recipe_b[0] = 1, o.recipe_b[1] = 32;
    int32_t layout[G * MG];
    for (int i = 0; i < G * MG; ++i)
        layout[i] = i / MG;
    dg_tensor gl = dg_tensor_1d(layout, DG_INT32, G * MG);
    const int saved_align = dg_get_mk_alignment_for_contiguous_layout();
    dg_set_mk_alignment_for_contiguous_layout(MG); /* not needed by the index form; harmless */
    dg_tensor d1 = tg_out(&r, DG_BFLOAT16, G * MG, NG, 0, 0), d2 = tg_out(&r, DG_BFLOAT16, G * MG, NG, 0, 0);
    TU_CHECK_OK(dg_m_grouped_fp4_gemm_nt_contiguous(&x.t, &x.sf, &b3, &sb3, &d1, &gl, &o));
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&x.t, &x.sf, &b3, &sb3, &d2, &gl, &o));
    TU_CHECK(memcmp(d1.data, d2.data, (size_t)(G * MG * NG) * 2) == 0, "m-grouped contiguous alias differs");
    int worst = 0;
    for (int i = 0; i < G * MG; ++i)
        for (int j = 0; j < NG; ++j)
            worst |= fabsf(tg_get(&d1, i, j) -
                           dg_bf16_to_float((uint16_t)tg_expect(&x, i, &e[i / MG], j, 0.0, DG_BFLOAT16))) >
                     1e-2f * (1.0f + fabsf(tg_get(&d1, i, j)));
    TU_CHECK(!worst, "m_grouped_fp4 contiguous against the formula");
    dg_tensor glbad = gl;
    glbad.dtype = DG_INT64;
    TU_CHECK(dg_m_grouped_fp4_gemm_nt_contiguous(&x.t, &x.sf, &b3, &sb3, &d1, &glbad, &o) != DG_OK &&
                 names("dg_m_grouped_fp4_gemm_nt_contiguous", "grouped_layout"),
             "contiguous alias message: %s", dg_last_error());
    dg_set_mk_alignment_for_contiguous_layout(saved_align);

    /* masked: the same rows seen as [G, MG, K]; group 1 computes only 2 rows. */
    dg_tensor x3 = dg_tensor_3d(x.mem, DG_FP4_E2M1X2, G, MG, KG / 2);
    x3.strides[0] = MG * x.t.strides[0], x3.strides[1] = x.t.strides[0];
    dg_tensor sx3 = dg_tensor_3d(x.sfmem, DG_INT32, G, MG, 1);
    sx3.strides[0] = MG * x.sf.strides[0], sx3.strides[1] = x.sf.strides[0];
    int32_t mm[G] = {MG, 2};
    dg_tensor masked = dg_tensor_1d(mm, DG_INT32, G);
    dg_tensor e1 = tg_out(&r, DG_BFLOAT16, G * MG, NG, 0, 0), e2 = tg_out(&r, DG_BFLOAT16, G * MG, NG, 0, 0);
    dg_tensor e13 = dg_tensor_3d(e1.data, DG_BFLOAT16, G, MG, NG), e23 = dg_tensor_3d(e2.data, DG_BFLOAT16, G, MG, NG);
    TU_CHECK_OK(dg_m_grouped_fp4_gemm_nt_masked(&x3, &sx3, &b3, &sb3, &e13, &masked, 4, &o));
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_masked(&x3, &sx3, &b3, &sb3, &e23, &masked, 4, &o));
    TU_CHECK(memcmp(e1.data, e2.data, (size_t)(G * MG * NG) * 2) == 0, "m-grouped masked alias differs");
    TU_CHECK(memcmp(e1.data, d1.data, (size_t)(MG + 2) * NG * 2) == 0, "masked rows differ from contiguous ones");
    TU_CHECK_STATUS(dg_m_grouped_fp4_gemm_nt_masked(&x3, &sx3, &b3, &sb3, &e13, &masked, 0, &o), DG_ERR_VALUE);
    TU_CHECK(names("dg_m_grouped_fp4_gemm_nt_masked", "expected_m"), "masked alias message: %s", dg_last_error());
    free(d1.data), free(d2.data), free(e1.data), free(e2.data), free(bmem), free(sbmem);
    for (int g = 0; g < G; ++g)
        top_free(&e[g]);
    top_free(&x);
}

/* ---- batched_syrk / batched_symm ------------------------------------------------------- */

/* Bitwise dg_cublaslt_gemm_nt per batch (the contract), 2-D and 3-D, strided inputs, both dtypes;
 * then bad input: status, argument named, D untouched. */
static void test_batched(void) {
    tu_rng r = {17};
    static const dg_dtype kDt[2] = {DG_BFLOAT16, DG_FLOAT32};
    for (int t = 0; t < 2; ++t)
        for (int nd = 2; nd <= 3; ++nd) {
            const dg_dtype dt = kDt[t];
            const int64_t G = nd == 3 ? 3 : 1, M = 13, K = 37, es = (int64_t)dg_dtype_size(dt);
            /* A [G, M, K] stored MN-major per batch (strides (M*K, 1, M)): any strides are taken */
            dg_tensor a = tu_alloc3(dt, G, K, M), s = tu_alloc3(dt, G, M, M), b = tu_alloc3(dt, G, M, K);
            for (dg_tensor *x = &a; x; x = x == &a ? &s : x == &s ? &b : NULL)
                for (int64_t e = 0; e < dg_tensor_numel(x); ++e) {
                    const float v = (float)tu_normal(&r);
                    if (dt == DG_FLOAT32)
                        ((float *)x->data)[e] = v;
                    else
                        ((uint16_t *)x->data)[e] = dg_float_to_bf16(v);
                }
            dg_tensor av = dg_tensor_transpose(a, 1, 2); /* [G, M, K] */
            dg_tensor d = tu_alloc3(dt, G, M, M), d2 = tu_alloc3(dt, G, M, K), w = tu_alloc2(dt, M, M),
                      w2 = tu_alloc2(dt, M, K);
            dg_tensor av_n = av, d_n = d, s_n = s, b_n = b, d2_n = d2;
            if (nd == 2) { /* the 2-D forms: batch 0's views */
                av_n = dg_tensor_2d(av.data, dt, M, K), av_n.strides[0] = av.strides[1], av_n.strides[1] = av.strides[2];
                d_n = dg_tensor_2d(d.data, dt, M, M), s_n = dg_tensor_2d(s.data, dt, M, M);
                b_n = dg_tensor_2d(b.data, dt, M, K), d2_n = dg_tensor_2d(d2.data, dt, M, K);
            }
            TU_CHECK_OK(dg_batched_syrk(&av_n, &d_n));
            TU_CHECK_OK(dg_batched_symm(&s_n, &b_n, &d2_n));
            for (int64_t g = 0; g < G; ++g) {
                dg_tensor ag = dg_tensor_2d((char *)av.data + g * av.strides[0] * es, dt, M, K);
                ag.strides[0] = av.strides[1], ag.strides[1] = av.strides[2];
                TU_CHECK_OK(dg_cublaslt_gemm_nt(&ag, &ag, &w, NULL));
                TU_CHECK(memcmp(w.data, (char *)d.data + g * M * M * es, (size_t)(M * M * es)) == 0,
                         "batched_syrk %s %d-D batch %lld differs from cublaslt_gemm_nt", dg_dtype_name(dt), nd,
                         (long long)g);
                const dg_tensor sg = dg_tensor_2d((char *)s.data + g * M * M * es, dt, M, M);
                const dg_tensor bg = dg_tensor_2d((char *)b.data + g * M * K * es, dt, M, K);
                TU_CHECK_OK(dg_cublaslt_gemm_nn(&sg, &bg, &w2, NULL));
                TU_CHECK(memcmp(w2.data, (char *)d2.data + g * M * K * es, (size_t)(M * K * es)) == 0,
                         "batched_symm %s %d-D batch %lld differs from cublaslt_gemm_nn", dg_dtype_name(dt), nd,
                         (long long)g);
            }
            tu_free(&a), tu_free(&s), tu_free(&b), tu_free(&d), tu_free(&d2), tu_free(&w), tu_free(&w2);
        }
    /* No batches: nothing to do. */
    dg_tensor a0 = tu_alloc3(DG_BFLOAT16, 0, 4, 8), d0 = tu_alloc3(DG_BFLOAT16, 0, 4, 4);
    TU_CHECK_OK(dg_batched_syrk(&a0, &d0));
    tu_free(&a0), tu_free(&d0);

    /* Bad input. */
    dg_tensor a = tu_alloc3(DG_BFLOAT16, 2, 4, 8), d = tu_alloc3(DG_BFLOAT16, 2, 4, 4);
    dg_tensor s = tu_alloc3(DG_BFLOAT16, 2, 4, 4), b = tu_alloc3(DG_BFLOAT16, 2, 4, 8), d2 = tu_alloc3(DG_BFLOAT16, 2, 4, 8);
    tu_fill_bytes(&a, 0), tu_fill_bytes(&s, 0), tu_fill_bytes(&b, 0);
    tu_fill_bytes(&d, 0x3c), tu_fill_bytes(&d2, 0x3c);
    void *snap = tu_snapshot(&d), *snap2 = tu_snapshot(&d2);
    dg_tensor df = d;
    df.dtype = DG_FLOAT32;
    df.strides[1] = 4, df.strides[0] = 16;
    TU_CHECK_STATUS(dg_batched_syrk(&a, &df), DG_ERR_DTYPE);
    TU_CHECK(names("dg_batched_syrk", "d"), "names d: %s", dg_last_error());
    dg_tensor d1 = tu_alloc3(DG_BFLOAT16, 1, 4, 4);
    TU_CHECK_STATUS(dg_batched_syrk(&a, &d1), DG_ERR_SHAPE);
    dg_tensor dw = tu_alloc3(DG_BFLOAT16, 2, 4, 5);
    TU_CHECK_STATUS(dg_batched_syrk(&a, &dw), DG_ERR_SHAPE);
    dg_tensor a1 = dg_tensor_1d(a.data, DG_BFLOAT16, 8);
    TU_CHECK_STATUS(dg_batched_syrk(&a1, &d), DG_ERR_SHAPE);
    TU_CHECK_STATUS(dg_batched_syrk(NULL, &d), DG_ERR_NULL_POINTER);
    dg_tensor a8 = a;
    a8.dtype = DG_FLOAT8_E4M3;
    TU_CHECK_STATUS(dg_batched_syrk(&a8, &d), DG_ERR_DTYPE);
    dg_tensor alias = dg_tensor_3d(a.data, DG_BFLOAT16, 2, 4, 4); /* D over A's bytes */
    TU_CHECK_STATUS(dg_batched_syrk(&a, &alias), DG_ERR_LAYOUT);
    dg_tensor rect = tu_alloc3(DG_BFLOAT16, 2, 4, 8);
    TU_CHECK_STATUS(dg_batched_symm(&rect, &b, &d2), DG_ERR_SHAPE);
    TU_CHECK(names("dg_batched_symm", "a"), "names a: %s", dg_last_error());
    dg_tensor b5 = tu_alloc3(DG_BFLOAT16, 2, 5, 8);
    TU_CHECK_STATUS(dg_batched_symm(&s, &b5, &d2), DG_ERR_SHAPE);
    dg_tensor bf = tu_alloc3(DG_FLOAT32, 2, 4, 8);
    TU_CHECK_STATUS(dg_batched_symm(&s, &bf, &d2), DG_ERR_DTYPE);
    TU_CHECK(tu_unchanged(&d, snap) && tu_unchanged(&d2, snap2), "bad batched calls leave d untouched");
    free(snap), free(snap2);
    tu_free(&a), tu_free(&d), tu_free(&s), tu_free(&b), tu_free(&d2), tu_free(&d1), tu_free(&dw), tu_free(&rect);
    tu_free(&b5), tu_free(&bf);
}

/* ---- NVFP4 ------------------------------------------------------------------------------ */

/* Random NVFP4 operand [mn, k]: codes, VEC16 scales (deepgemm.h's byte formula, written here
 * independently), and its exact BF16 values. */
static void nvfp4_make(tu_rng *r, int64_t mn, int64_t k, dg_tensor *codes, dg_tensor *sf, dg_tensor *bf) {
    const int64_t kt = (k + 63) / 64, nt = (mn + 127) / 128;
    *codes = tu_alloc2(DG_INT8, mn, k / 2);
    *sf = tu_alloc(DG_UINT8, 1, (int64_t[]){nt * kt * 512});
    *bf = tu_alloc2(DG_BFLOAT16, mn, k);
    tu_fill_bytes(sf, 0x7e); /* padding bytes: large scales, never read */
    uint8_t *c = codes->data, *s = sf->data;
    for (int64_t i = 0; i < mn; ++i)
        for (int64_t b = 0; b < k / 16; ++b) {
            const uint8_t code = (uint8_t)tu_randint(r, 1, 0x5f); /* UE4M3 incl. subnormals, below 2^4 */
            const int64_t tile = (i / 128) * kt + b / 4, in_tile = (i % 32) * 16 + ((i % 128) / 32) * 4 + b % 4;
            s[tile * 512 + in_tile] = code;
            for (int64_t e = 0; e < 16; ++e) {
                const int64_t kk = b * 16 + e;
                const uint8_t v = (uint8_t)(tu_next(r) & 15);
                uint8_t *byte = &c[i * (k / 2) + kk / 2];
                *byte = kk & 1 ? (uint8_t)((*byte & 0x0f) | (v << 4)) : (uint8_t)((*byte & 0xf0) | v);
                ((uint16_t *)bf->data)[i * k + kk] = dg_float_to_bf16(dg_e2m1_to_float(v) * dg_e4m3_to_float(code));
            }
        }
}

static void test_nvfp4(void) {
    tu_rng r = {23};
    static const int64_t kShapes[][3] = {{1, 7, 32}, {37, 130, 96}, {129, 40, 256}};
    for (size_t q = 0; q < sizeof kShapes / sizeof kShapes[0]; ++q) {
        const int64_t m = kShapes[q][0], n = kShapes[q][1], k = kShapes[q][2];
        dg_tensor ac, as, ab, bc, bs, bb;
        nvfp4_make(&r, m, k, &ac, &as, &ab);
        nvfp4_make(&r, n, k, &bc, &bs, &bb);
        for (int out = 0; out < 2; ++out)
            for (int cm = 0; cm < 2; ++cm) {
                const dg_dtype dt = out ? DG_FLOAT32 : DG_BFLOAT16;
                dg_tensor d = tu_alloc2(dt, m, n), w = tu_alloc2(dt, m, n), c = tu_alloc2(dt, m, n);
                tu_fill_bytes(&c, 0x3d);
                TU_CHECK_OK(dg_cublaslt_nvfp4_gemm_nt(&ac, &as, &bc, &bs, &d, cm ? &c : NULL));
                TU_CHECK_OK(dg_bf16_gemm_nt(&ab, &bb, &w, cm ? &c : NULL));
                TU_CHECK(memcmp(d.data, w.data, dg_tensor_nbytes(&d)) == 0,
                         "nvfp4 m=%lld n=%lld k=%lld out=%d c=%d: D differs from bf16_gemm_nt on the values",
                         (long long)m, (long long)n, (long long)k, out, cm);
                tu_free(&d), tu_free(&w), tu_free(&c);
            }
        tu_free(&ac), tu_free(&as), tu_free(&ab), tu_free(&bc), tu_free(&bs), tu_free(&bb);
    }
    /* Bad input, D untouched. */
    dg_tensor ac, as, ab, bc, bs, bb;
    nvfp4_make(&r, 4, 64, &ac, &as, &ab);
    nvfp4_make(&r, 8, 64, &bc, &bs, &bb);
    dg_tensor d = tu_alloc2(DG_BFLOAT16, 4, 8);
    tu_fill_bytes(&d, 0x11);
    void *snap = tu_snapshot(&d);
    dg_tensor short_sf = as;
    short_sf.shape[0] -= 1;
    TU_CHECK_STATUS(dg_cublaslt_nvfp4_gemm_nt(&ac, &short_sf, &bc, &bs, &d, NULL), DG_ERR_SHAPE);
    TU_CHECK(names("dg_cublaslt_nvfp4_gemm_nt", "sfa"), "names sfa: %s", dg_last_error());
    dg_tensor k48 = dg_tensor_2d(ac.data, DG_INT8, 4, 24);
    TU_CHECK_STATUS(dg_cublaslt_nvfp4_gemm_nt(&k48, &as, &bc, &bs, &d, NULL), DG_ERR_SHAPE);
    dg_tensor a8 = ac;
    a8.dtype = DG_FLOAT8_E4M3;
    TU_CHECK_STATUS(dg_cublaslt_nvfp4_gemm_nt(&a8, &as, &bc, &bs, &d, NULL), DG_ERR_DTYPE);
    TU_CHECK_STATUS(dg_cublaslt_nvfp4_gemm_nt(&ac, NULL, &bc, &bs, &d, NULL), DG_ERR_NULL_POINTER);
    dg_tensor sf32 = as;
    sf32.dtype = DG_FLOAT32, sf32.shape[0] /= 4;
    TU_CHECK_STATUS(dg_cublaslt_nvfp4_gemm_nt(&ac, &sf32, &bc, &bs, &d, NULL), DG_ERR_DTYPE);
    dg_tensor dn = tu_alloc2(DG_BFLOAT16, 4, 7);
    TU_CHECK_STATUS(dg_cublaslt_nvfp4_gemm_nt(&ac, &as, &bc, &bs, &dn, NULL), DG_ERR_SHAPE);
    dg_tensor over = dg_tensor_2d(as.data, DG_BFLOAT16, 4, 8); /* D over sfa's bytes */
    TU_CHECK_STATUS(dg_cublaslt_nvfp4_gemm_nt(&ac, &as, &bc, &bs, &over, NULL), DG_ERR_LAYOUT);
    TU_CHECK(tu_unchanged(&d, snap), "bad nvfp4 calls leave d untouched");
    free(snap);
    tu_free(&d), tu_free(&dn), tu_free(&ac), tu_free(&as), tu_free(&ab), tu_free(&bc), tu_free(&bs), tu_free(&bb);
}

int main(void) {
    test_nvfp4();
    test_batched();
    test_exact_all_variants();
    test_random();
    test_same_as_bf16_gemm();
    test_bad();
    test_fp4_aliases();
    return tu_finish();
}
