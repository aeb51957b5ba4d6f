/*
 * test_mega_mhc.c - dg_mega_mhc: the fast path against the reference backend.
 *   - "exact" inputs (small dyadic values: every GEMM sum is exact in float32): every output
 *     bit for bit equal to the reference's; random inputs: new_residual bit for bit, the mixes
 *     within 1e-9 calc_diff, y within DeepGEMM's thresholds (5e-5; y_fp8 2e-4; scale bytes 5e-5);
 *   - shapes: T = 1, 3, 13, 65, 70, hidden tails (H = 64, 96, 200: no FP8), hc_mult 1, 2, 3, 4,
 *     shifted and normal, y_bf16 with or without FP8, both scale layouts (shared_sf_block_m 32
 *     and 224 over several blocks, padding rows untouched);
 *   - the same bits for 1, 2 and 3 threads and at every ISA level of one bits class (generic and
 *     avx2; avx512 and avx512_bf16); a token's bits the same computed alone (T = 1) as inside T = 37;
 *   - every argument's bad input: the right status, the argument named, nothing written.
 */
#include "test_util.h"
#include "formats/convert.h"
#include "reference/ref_mhc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { IN_X, IN_RES, IN_PREV, IN_POST, IN_COMB, IN_FN, IN_SCALES, IN_BASES, IN_W, N_IN };
enum { OUT_NRES, OUT_NPREV, OUT_NPOST, OUT_NCOMB, OUT_Y, OUT_FP8, OUT_GSF, OUT_RSF, OUT_SSF, N_OUT };
static const char *in_names[N_IN] = {"x", "residual", "shifted_prev_mix", "post_mix", "comb_res_mix", "fn",
                                     "mix_scales", "mix_bases", "rmsnorm_weight"};
static const char *out_names[N_OUT] = {"new_residual", "new_prev_mix", "new_post_mix", "new_comb_res_mix",
                                       "y_bf16", "y_fp8", "y_gemm_sf", "y_routed_sf", "y_shared_sf"};

typedef struct mcase {
    int t, h, hc, shifted, bf16, sf; /* sf: 0 none, 1 y_gemm_sf, 2 y_routed_sf + y_shared_sf */
    int bm, exact;
} mcase;

/* One call's arguments; store[] owns the memory (views in in[] / out[] point into it). */
typedef struct margs {
    mcase c;
    dg_tensor store_in[N_IN], store_out[N_OUT];
    const dg_tensor *in[N_IN], *out[N_OUT];
    dg_tensor gsf, ssf; /* the column-major views */
    int hc, iters, bm;
    float f[8]; /* hc_norm_eps, hc_pre_eps, hc_post_scale, sinkhorn_eps, rmsnorm_eps, rmsnorm_scale */
} margs;

static float pick(tu_rng *r, const float *v, int n) { return v[tu_randint(r, 0, n - 1)]; }

static void fill(margs *a, uint64_t seed) {
    tu_rng r = {seed};
    const mcase *c = &a->c;
    const int64_t T = c->t, H = c->h, hc = c->hc, N = hc * (hc + 2);
    static const float ints[] = {-2, -1, 0, 1, 2}, halves[] = {0.5f, 1.0f}, quarters[] = {0, 0.25f, 0.5f};
    uint16_t *x = a->store_in[IN_X].data, *res = a->store_in[IN_RES].data, *w = a->store_in[IN_W].data;
    float *prev = a->store_in[IN_PREV].data, *post = a->store_in[IN_POST].data, *comb = a->store_in[IN_COMB].data;
    float *fn = a->store_in[IN_FN].data, *sc = a->store_in[IN_SCALES].data, *bs = a->store_in[IN_BASES].data;
    for (int64_t i = 0; i < T * H; ++i)
        x[i] = dg_float_to_bf16(c->exact ? pick(&r, ints, 5) : (float)tu_normal(&r));
    for (int64_t i = 0; i < T * hc * H; ++i)
        res[i] = dg_float_to_bf16(c->exact ? pick(&r, ints, 5) : (float)tu_normal(&r));
    for (int64_t i = 0; i < T * hc; ++i) {
        post[i] = c->exact ? pick(&r, halves, 2) : 1.0f / (1.0f + expf(-(float)tu_normal(&r)));
        prev[i] = c->exact ? pick(&r, quarters, 3) + 0.25f : 1.0f / (1.0f + expf(-(float)tu_normal(&r)));
    }
    for (int64_t i = 0; i < T * hc * hc; ++i)
        comb[i] = c->exact ? pick(&r, quarters, 3) : (float)tu_uniform(&r) / (float)hc;
    for (int64_t i = 0; i < N * hc * H; ++i)
        fn[i] = c->exact ? (float)tu_randint(&r, -8, 8) / 16.0f : (float)tu_normal(&r) * 1e-2f;
    for (int i = 0; i < 3; ++i)
        sc[i] = (float)tu_normal(&r) * 0.1f;
    for (int64_t i = 0; i < N; ++i)
        bs[i] = (float)tu_normal(&r) * 0.1f;
    for (int64_t i = 0; i < H; ++i)
        w[i] = dg_float_to_bf16(1.0f + (float)tu_normal(&r) * 0.1f);
}

static void margs_init(margs *a, mcase c, uint64_t seed) {
    memset(a, 0, sizeof *a);
    a->c = c;
    const int64_t T = c.t, H = c.h, hc = c.hc, N = hc * (hc + 2), W = H / 128;
    a->store_in[IN_X] = tu_alloc2(DG_BFLOAT16, T, H);
    a->store_in[IN_RES] = tu_alloc3(DG_BFLOAT16, T, hc, H);
    a->store_in[IN_PREV] = tu_alloc3(DG_FLOAT32, T, hc, 1);
    a->store_in[IN_POST] = tu_alloc3(DG_FLOAT32, T, hc, 1);
    a->store_in[IN_COMB] = tu_alloc3(DG_FLOAT32, T, hc, hc);
    a->store_in[IN_FN] = tu_alloc2(DG_FLOAT32, N, hc * H);
    a->store_in[IN_SCALES] = tu_alloc(DG_FLOAT32, 1, (int64_t[]){3});
    a->store_in[IN_BASES] = tu_alloc(DG_FLOAT32, 1, (int64_t[]){N});
    a->store_in[IN_W] = tu_alloc(DG_BFLOAT16, 1, (int64_t[]){H});
    a->store_out[OUT_NRES] = tu_alloc3(DG_BFLOAT16, T, hc, H);
    a->store_out[OUT_NPREV] = tu_alloc3(DG_FLOAT32, T, hc, 1);
    a->store_out[OUT_NPOST] = tu_alloc3(DG_FLOAT32, T, hc, 1);
    a->store_out[OUT_NCOMB] = tu_alloc3(DG_FLOAT32, T, hc, hc);
    a->store_out[OUT_Y] = tu_alloc2(DG_BFLOAT16, T, H);
    a->store_out[OUT_FP8] = tu_alloc2(DG_FLOAT8_E4M3, T, H);
    const int64_t S = (T + 3) / 4 * 4, R = c.bm ? (T + c.bm - 1) / c.bm * ((c.bm + 127) / 128 * 128) : 1;
    a->store_out[OUT_GSF] = tu_alloc2(DG_INT32, W, S);
    a->store_out[OUT_RSF] = tu_alloc2(DG_INT32, T, W);
    a->store_out[OUT_SSF] = tu_alloc2(DG_INT32, W, R);
    a->gsf = a->store_out[OUT_GSF];
    a->gsf.shape[0] = T, a->gsf.shape[1] = W, a->gsf.strides[0] = 1, a->gsf.strides[1] = S;
    a->ssf = a->store_out[OUT_SSF];
    a->ssf.shape[0] = T, a->ssf.shape[1] = W, a->ssf.strides[0] = 1, a->ssf.strides[1] = R;
    for (int i = 0; i < N_IN; ++i)
        a->in[i] = &a->store_in[i];
    for (int i = 0; i < N_OUT; ++i)
        a->out[i] = &a->store_out[i];
    if (!c.shifted)
        a->in[IN_PREV] = a->out[OUT_NPREV] = NULL;
    if (!c.bf16)
        a->out[OUT_Y] = NULL;
    a->out[OUT_GSF] = c.sf == 1 ? &a->gsf : NULL;
    a->out[OUT_RSF] = c.sf == 2 ? a->out[OUT_RSF] : NULL;
    a->out[OUT_SSF] = c.sf == 2 ? &a->ssf : NULL;
    if (!c.sf)
        a->out[OUT_FP8] = NULL;
    a->hc = c.hc, a->iters = 7, a->bm = c.sf == 2 ? c.bm : 0;
    const float f[6] = {2e-5f, 3e-4f, 1.25f, 2e-6f, 7e-6f, 1.25f};
    memcpy(a->f, f, sizeof f);
    fill(a, seed);
    for (int i = 0; i < N_OUT; ++i)
        tu_fill_bytes(&a->store_out[i], 0x5a);
}

static void margs_free(margs *a) {
    for (int i = 0; i < N_IN; ++i)
        tu_free(&a->store_in[i]);
    for (int i = 0; i < N_OUT; ++i)
        tu_free(&a->store_out[i]);
}

static dg_status run(const margs *a) {
    const dg_tensor *const *i = a->in, *const *o = a->out;
    return dg_mega_mhc(i[IN_X], i[IN_RES], i[IN_PREV], i[IN_POST], i[IN_COMB], i[IN_FN], i[IN_SCALES], i[IN_BASES],
                       a->hc, a->f[0], a->f[1], a->f[2], a->f[3], a->iters, i[IN_W], a->f[4], a->f[5], o[OUT_NRES],
                       o[OUT_NPREV], o[OUT_NPOST], o[OUT_NCOMB], o[OUT_Y], o[OUT_FP8], o[OUT_GSF], o[OUT_RSF],
                       o[OUT_SSF], a->bm);
}

static int same_bytes(const dg_tensor *x, const dg_tensor *y) {
    return memcmp(x->data, y->data, dg_tensor_nbytes(x)) == 0;
}

/* calc_diff of two output stores read as `dt` values (INT32 stores: as bytes). */
static double diff_as(const dg_tensor *x, const dg_tensor *y) {
    const size_t bytes = dg_tensor_nbytes(x);
    const int es = x->dtype == DG_FLOAT32 ? 4 : x->dtype == DG_BFLOAT16 ? 2 : 1;
    const size_t n = bytes / es;
    float *fx = malloc(n * sizeof(float)), *fy = malloc(n * sizeof(float));
    for (size_t k = 0; k < n; ++k) {
        const unsigned char *px = (const unsigned char *)x->data + k * es, *py = (const unsigned char *)y->data + k * es;
        if (es == 4) {
            memcpy(&fx[k], px, 4), memcpy(&fy[k], py, 4);
        } else if (es == 2) {
            uint16_t u, v;
            memcpy(&u, px, 2), memcpy(&v, py, 2);
            fx[k] = dg_bf16_to_float(u), fy[k] = dg_bf16_to_float(v);
        } else if (x->dtype == DG_FLOAT8_E4M3) {
            fx[k] = dg_e4m3_to_float(*px), fy[k] = dg_e4m3_to_float(*py);
        } else {
            fx[k] = *px, fy[k] = *py;
        }
    }
    const double d = tu_calc_diff(fx, fy, n);
    free(fx), free(fy);
    return d;
}

/* Fast (current settings) against the reference on case c. */
static void check_case(mcase c, uint64_t seed) {
    margs f, r;
    margs_init(&f, c, seed);
    margs_init(&r, c, seed);
    TU_CHECK_OK(run(&f));
    dg_set_backend(DG_BACKEND_REFERENCE);
    TU_CHECK_OK(run(&r));
    dg_set_backend(DG_BACKEND_AUTO);
    for (int o = 0; o < N_OUT; ++o) {
        const dg_tensor *x = &f.store_out[o], *y = &r.store_out[o];
        const int used = f.out[o] != NULL;
        if (!used || c.exact || o == OUT_NRES) {
            TU_CHECK(same_bytes(x, y), "T=%d H=%d hc=%d shifted=%d sf=%d exact=%d: %s differs%s", c.t, c.h, c.hc,
                     c.shifted, c.sf, c.exact, out_names[o], used ? "" : " (unused: must stay untouched)");
            continue;
        }
        const double lim = o <= OUT_NCOMB ? 1e-9 : o == OUT_FP8 ? 2e-4 : 5e-5;
        const double d = diff_as(x, y);
        TU_CHECK(d < lim, "T=%d H=%d hc=%d shifted=%d sf=%d: %s calc_diff %.3g >= %.3g", c.t, c.h, c.hc, c.shifted,
                 c.sf, out_names[o], d, lim);
    }
    margs_free(&f);
    margs_free(&r);
}

static void check_shapes(void) {
    static const mcase cases[] = {
        {1, 128, 4, 1, 1, 1, 0, 0},   {1, 128, 4, 0, 1, 2, 32, 0}, {3, 200, 4, 1, 1, 0, 0, 0},
        {13, 1024, 4, 0, 1, 1, 0, 0}, {13, 1024, 4, 1, 0, 2, 224, 0}, {65, 256, 4, 1, 1, 2, 32, 0},
        {70, 256, 4, 0, 0, 2, 32, 0}, {70, 256, 4, 0, 0, 1, 0, 0}, {2, 96, 2, 1, 1, 0, 0, 0},
        {5, 64, 1, 0, 1, 0, 0, 0},    {7, 384, 3, 1, 1, 1, 0, 0},  {4, 2048, 4, 1, 1, 2, 224, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        for (int exact = 0; exact <= 1; ++exact) {
            mcase c = cases[i];
            c.exact = exact;
            check_case(c, 100 + i);
        }
}

/* The ISA levels whose mixes share bits (deepgemm.h, tf32_hc_prenorm_gemm): portable and AVX2
 * hold 8 partial sums per output, both AVX-512 levels 16; AMX tiles round their own way. */
static int bits_class(int isa) { return isa <= (int)DG_ISA_AVX2 ? 0 : isa <= (int)DG_ISA_AVX512_BF16 ? 1 : 2; }

/* Fast-path bits for 1, 2, 3 threads and each ISA level this CPU runs, equal within a bits class;
 * a token alone. */
static void check_invariance(void) {
    const mcase c = {37, 1024, 4, 1, 1, 1, 0, 0};
    margs base;
    margs_init(&base, c, 7);
    dg_set_num_sms(1);
    TU_CHECK_OK(run(&base));
    const dg_isa top = dg_get_isa();
    margs first[3];
    int have[3] = {0, 0, 0};
    for (int isa = DG_ISA_GENERIC; isa <= (int)top; ++isa)
        for (int th = 1; th <= 3; ++th) {
            const int cls = bits_class(isa);
            margs m;
            margs_init(&m, c, 7);
            TU_CHECK_OK(dg_set_isa((dg_isa)isa));
            dg_set_num_sms(th);
            TU_CHECK_OK(run(&m));
            const margs *want = have[cls] ? &first[cls] : isa == (int)top ? &base : NULL;
            for (int o = 0; want && o < N_OUT; ++o)
                TU_CHECK(same_bytes(&m.store_out[o], &want->store_out[o]), "isa %s, %d threads: %s differs",
                         dg_isa_name((dg_isa)isa), th, out_names[o]);
            if (have[cls]) {
                margs_free(&m);
            } else {
                first[cls] = m;
                have[cls] = 1;
            }
        }
    for (int cls = 0; cls < 3; ++cls)
        if (have[cls]) {
            if (cls == bits_class(top))
                for (int o = 0; o < N_OUT; ++o)
                    TU_CHECK(same_bytes(&base.store_out[o], &first[cls].store_out[o]), "isa %s, 1 thread, first call: %s differs",
                             dg_isa_name(top), out_names[o]);
            margs_free(&first[cls]);
        }
    dg_set_isa(top);
    dg_set_num_sms(2);
    /* token k alone: copy its inputs into a T = 1 call */
    const int64_t H = c.h, hc = c.hc, W = H / 128, S = base.gsf.strides[1];
    for (int k = 0; k < c.t; k += 12) {
        mcase one = c;
        one.t = 1;
        margs m;
        margs_init(&m, one, 7);
        memcpy(m.store_in[IN_FN].data, base.store_in[IN_FN].data, dg_tensor_nbytes(&base.store_in[IN_FN]));
        memcpy(m.store_in[IN_SCALES].data, base.store_in[IN_SCALES].data, 12);
        memcpy(m.store_in[IN_BASES].data, base.store_in[IN_BASES].data, dg_tensor_nbytes(&base.store_in[IN_BASES]));
        memcpy(m.store_in[IN_W].data, base.store_in[IN_W].data, (size_t)H * 2);
        const int64_t row[N_IN] = {H * 2, hc * H * 2, hc * 4, hc * 4, hc * hc * 4};
        for (int i = IN_X; i <= IN_COMB; ++i)
            memcpy(m.store_in[i].data, (char *)base.store_in[i].data + k * row[i], (size_t)row[i]);
        TU_CHECK_OK(run(&m));
        const int64_t orow[N_OUT] = {hc * H * 2, hc * 4, hc * 4, hc * hc * 4, H * 2, H};
        for (int o = OUT_NRES; o <= OUT_FP8; ++o)
            TU_CHECK(memcmp(m.store_out[o].data, (char *)base.store_out[o].data + k * orow[o], (size_t)orow[o]) == 0,
                     "token %d alone: %s differs", k, out_names[o]);
        for (int64_t w = 0; w < W; ++w)
            TU_CHECK(((int32_t *)m.store_out[OUT_GSF].data)[w * m.gsf.strides[1]] ==
                         ((int32_t *)base.store_out[OUT_GSF].data)[k + w * S],
                     "token %d alone: y_gemm_sf word %lld differs", k, (long long)w);
        margs_free(&m);
    }
    margs_free(&base);
}

/* One bad call: status, message naming `arg`, no output byte changed. */
static void expect_bad(const margs *a, dg_status want, const char *arg, const char *what) {
    void *snap[N_OUT];
    for (int o = 0; o < N_OUT; ++o)
        snap[o] = tu_snapshot(&a->store_out[o]);
    const dg_status st = run(a);
    TU_CHECK(st == want, "%s: got %s, want %s (%s)", what, dg_status_string(st), dg_status_string(want),
             dg_last_error());
    char needle[64];
    snprintf(needle, sizeof needle, "'%s'", arg);
    TU_CHECK(strstr(dg_last_error(), needle) != NULL, "%s: message does not name %s: %s", what, arg,
             dg_last_error());
    for (int o = 0; o < N_OUT; ++o) {
        TU_CHECK(tu_unchanged(&a->store_out[o], snap[o]), "%s: %s was written", what, out_names[o]);
        free(snap[o]);
    }
}

static void check_bad(void) {
    const mcase c = {5, 256, 4, 1, 1, 2, 32, 0};
    margs a;
    margs_init(&a, c, 3);
    TU_CHECK_OK(run(&a)); /* valid as built */
    for (int o = 0; o < N_OUT; ++o)
        tu_fill_bytes(&a.store_out[o], 0x5a);
    for (int backend = 0; backend < 2; ++backend) {
        dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
        for (int i = 0; i < N_IN + N_OUT; ++i) {
            const dg_tensor **slot = i < N_IN ? &a.in[i] : &a.out[i - N_IN];
            const char *name = i < N_IN ? in_names[i] : out_names[i - N_IN];
            const dg_tensor *keep = *slot;
            if (!keep) /* y_gemm_sf: not in this call (see the rules below) */
                continue;
            dg_tensor t = *keep;
            char what[96];
            /* NULL data, wrong dtype, wrong extent, wrong stride, overlap */
            t.data = NULL;
            *slot = &t;
            snprintf(what, sizeof what, "%s NULL data", name);
            expect_bad(&a, DG_ERR_NULL_POINTER, name, what);
            t = *keep;
            t.dtype = t.dtype == DG_FLOAT32 ? DG_BFLOAT16 : DG_FLOAT32;
            snprintf(what, sizeof what, "%s dtype", name);
            expect_bad(&a, DG_ERR_DTYPE, name, what);
            t = *keep;
            if (i == IN_X) { /* x defines T and H: other arguments would disagree with it */
                t.ndim = 1;
            } else if (t.strides[t.ndim - 1] != 1) { /* column-major SF: one column less */
                t.shape[1] -= 1;
            } else { /* one element more in the last dimension, still row-major */
                t.shape[t.ndim - 1] += 1;
                t = dg_tensor_make(t.data, t.dtype, t.ndim, t.shape);
            }
            snprintf(what, sizeof what, "%s shape", name);
            expect_bad(&a, DG_ERR_SHAPE, name, what);
            if (i != IN_SCALES && t.ndim >= 2 && keep->shape[0] > 1) {
                t = *keep;
                t.strides[0] += 1; /* rows apart: not contiguous / not column-major */
                if (keep->strides[0] == 1)
                    t.strides[0] = 2, t.strides[1] = keep->strides[1] * 2;
                snprintf(what, sizeof what, "%s strides", name); /* past the store: never accessed */
                expect_bad(&a, DG_ERR_LAYOUT, name, what);
            }
            *slot = keep;
        }
        /* an output over an input, over another output */
        dg_tensor alias = *a.out[OUT_NRES];
        alias.data = a.store_in[IN_RES].data;
        const dg_tensor *keep = a.out[OUT_NRES];
        a.out[OUT_NRES] = &alias;
        expect_bad(&a, DG_ERR_LAYOUT, "new_residual", "new_residual over residual");
        a.out[OUT_NRES] = keep;
        dg_tensor alias2 = *a.out[OUT_NPOST];
        alias2.data = a.store_out[OUT_NPREV].data;
        keep = a.out[OUT_NPOST];
        a.out[OUT_NPOST] = &alias2;
        expect_bad(&a, DG_ERR_LAYOUT, "new_post_mix", "new_post_mix over new_prev_mix");
        a.out[OUT_NPOST] = keep;
        /* scalars */
        a.hc = 0, expect_bad(&a, DG_ERR_VALUE, "hc_mult", "hc_mult 0");
        a.hc = DG_MEGA_MHC_MAX_HC_MULT + 1, expect_bad(&a, DG_ERR_VALUE, "hc_mult", "hc_mult too big");
        a.hc = 3, expect_bad(&a, DG_ERR_SHAPE, "residual", "hc_mult 3 against 4 routes");
        a.hc = 4;
        a.iters = 0, expect_bad(&a, DG_ERR_VALUE, "num_sinkhorn_iters", "no Sinkhorn iteration");
        a.iters = 7;
        a.bm = 0, expect_bad(&a, DG_ERR_VALUE, "shared_sf_block_m", "block_m 0 with y_shared_sf");
        a.bm = 32;
        /* the optional-argument rules */
        const dg_tensor *prev = a.in[IN_PREV], *y = a.out[OUT_Y], *r = a.out[OUT_RSF], *s = a.out[OUT_SSF];
        a.in[IN_PREV] = NULL, expect_bad(&a, DG_ERR_VALUE, "new_prev_mix", "new_prev_mix without shifted");
        a.in[IN_PREV] = prev;
        a.out[OUT_SSF] = NULL, expect_bad(&a, DG_ERR_VALUE, "y_shared_sf", "routed without shared");
        a.out[OUT_SSF] = s;
        a.out[OUT_GSF] = &a.gsf, expect_bad(&a, DG_ERR_VALUE, "y_gemm_sf", "gemm and routed");
        a.out[OUT_GSF] = NULL;
        const dg_tensor *fp8 = a.out[OUT_FP8];
        a.out[OUT_Y] = NULL, a.out[OUT_FP8] = NULL, a.out[OUT_RSF] = NULL, a.out[OUT_SSF] = NULL, a.bm = 0;
        expect_bad(&a, DG_ERR_VALUE, "y_bf16", "no y at all");
        a.out[OUT_Y] = y;
        a.out[OUT_RSF] = r, a.out[OUT_SSF] = s, a.bm = 32;
        expect_bad(&a, DG_ERR_VALUE, "y_fp8", "scales without y_fp8");
        a.out[OUT_FP8] = fp8;
        /* y_shared_sf's column stride below the rows it is written at */
        dg_tensor ss = a.ssf;
        ss.strides[1] = 32;
        a.out[OUT_SSF] = &ss, expect_bad(&a, DG_ERR_LAYOUT, "y_shared_sf", "shared SF stride short");
        a.out[OUT_SSF] = s;
    }
    dg_set_backend(DG_BACKEND_AUTO);
    margs_free(&a);
    /* FP8 needs hidden % 128 == 0 */
    margs b;
    margs_init(&b, (mcase){2, 200, 4, 0, 1, 0, 0, 0}, 4);
    dg_tensor fp8 = tu_alloc2(DG_FLOAT8_E4M3, 2, 200), sf = tu_alloc2(DG_INT32, 2, 1);
    b.out[OUT_FP8] = &fp8, b.out[OUT_RSF] = &sf;
    dg_tensor ssf = tu_alloc2(DG_INT32, 1, 128);
    ssf.shape[0] = 2, ssf.shape[1] = 1, ssf.strides[0] = 1, ssf.strides[1] = 128;
    b.out[OUT_SSF] = &ssf, b.bm = 32;
    expect_bad(&b, DG_ERR_SHAPE, "y_fp8", "FP8 with hidden 200");
    tu_free(&fp8), tu_free(&sf), tu_free(&ssf);
    margs_free(&b);
    /* T = 0 does nothing */
    margs e;
    margs_init(&e, (mcase){0, 256, 4, 1, 1, 1, 0, 0}, 5);
    TU_CHECK_OK(run(&e));
    margs_free(&e);
}

/* The FP8 step alone: the fast path's codes (run kernels, integer amax) against the reference's
 * (scalar), on rows with zeros, signed zeros, huge and tiny values, infinities and NaNs (the
 * amax of a group with a NaN falls back to the reference's loop). */
static void check_quant_token(void) {
    enum { H = 512, W = H / DG_MHC_SF_WORD };
    static const uint16_t kSpecial[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f7f, 0x0001, 0x8001, 0x4380};
    tu_rng r = {71};
    uint16_t y[H];
    for (int i = 0; i < H; ++i)
        y[i] = dg_float_to_bf16((float)tu_normal(&r) * (i < 128 ? 1e-3f : 30.0f));
    for (int k = 0; k < 24; ++k) /* specials sprinkled over every group but the last */
        y[tu_randint(&r, 0, H - 33)] = kSpecial[k % (int)(sizeof kSpecial / sizeof kSpecial[0])];
    uint8_t codes[2][H];
    int32_t sf[2][W];
    for (int v = 0; v < 2; ++v) {
        dg_mhc_call c;
        memset(&c, 0, sizeof c);
        c.t = 1, c.h = H, c.y_fp8 = codes[v], c.sf = sf[v], c.sf_stride_t = W, c.sf_stride_w = 1;
        dg_mhc_quant_token(&c, 0, y, v ? dg_convert_kernels_for(dg_get_isa()) : NULL);
    }
    TU_CHECK(memcmp(codes[0], codes[1], sizeof codes[0]) == 0, "quant_token: E4M3 codes differ");
    TU_CHECK(memcmp(sf[0], sf[1], sizeof sf[0]) == 0, "quant_token: scale words differ");
}

int main(void) {
    check_quant_token();
    dg_set_num_sms(3);
    check_shapes();
    check_invariance();
    check_bad();
    return tu_finish();
}
