/*
 * test_engine_grouped.c - the grouped GEMMs on the engine (src/engine/grouped.c) against the
 * reference backend: every function, dtype and layout form, with random group sizes, empty
 * groups, a single group, groups smaller than one microkernel tile, NaN garbage in padding rows
 * and a sentinel in every D element that must stay untouched.
 *
 * Each call runs from the same initial D with the reference backend, then with the engine on 1
 * and 2 threads (twice on 2). Checks: the engine results are bitwise equal across threads and
 * calls; every element the reference left untouched is untouched; the others agree with the
 * reference within DeepGEMM's calc_diff threshold and a tight elementwise bound (float32
 * accumulation error plus one rounding of D's dtype).
 */
#include "test_gemm_grouped_common.h"

#define SENTINEL 0xA5

typedef dg_status (*call_fn)(const void *ctx);

/* Runs fn from D's initial contents `init` and returns a copy of the result. */
static void *run_once(call_fn fn, const void *ctx, dg_tensor *d, const void *init, const char *what) {
    const size_t bytes = dg_tensor_nbytes(d);
    memcpy(d->data, init, bytes);
    const dg_status s = fn(ctx);
    TU_CHECK(s == DG_OK, "%s: %s", what, dg_last_error());
    void *out = malloc(bytes);
    memcpy(out, d->data, bytes);
    return out;
}

static double elem(dg_dtype dt, const void *base, size_t i) {
    return dt == DG_FLOAT32 ? ((const float *)base)[i] : dg_bf16_to_float(((const uint16_t *)base)[i]);
}

/* D must be contiguous; k is the longest reduction (for the elementwise bound). */
static void compare(const char *what, call_fn fn, const void *ctx, dg_tensor *d, int64_t k) {
    const size_t n = (size_t)dg_tensor_numel(d), es = dg_dtype_size(d->dtype);
    void *init = tu_snapshot(d);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    void *ref = run_once(fn, ctx, d, init, what);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    TU_CHECK_OK(dg_set_num_sms(1));
    void *e1 = run_once(fn, ctx, d, init, what);
    TU_CHECK_OK(dg_set_num_sms(2));
    void *e2 = run_once(fn, ctx, d, init, what), *e2b = run_once(fn, ctx, d, init, what);
    TU_CHECK(memcmp(e1, e2, n * es) == 0, "%s: 1 vs 2 threads differ", what);
    TU_CHECK(memcmp(e2, e2b, n * es) == 0, "%s: repeated calls differ", what);

    float *x = malloc((n ? n : 1) * sizeof(float)), *y = malloc((n ? n : 1) * sizeof(float));
    size_t m = 0, touched = 0;
    double ss = 0;
    for (size_t i = 0; i < n; ++i)
        if (memcmp((char *)ref + i * es, (char *)init + i * es, es) != 0) {
            const double r = elem(d->dtype, ref, i);
            ss += r * r, ++m;
        }
    const double rms = m ? sqrt(ss / (double)m) : 0, abs_tol = 1e-6 * sqrt((double)(k > 1 ? k : 1)) * rms;
    const double rel = d->dtype == DG_BFLOAT16 ? 1.0 / 128 : 0;
    size_t bad = 0;
    m = 0;
    for (size_t i = 0; i < n; ++i) {
        const char *ri = (char *)ref + i * es, *ei = (char *)e2 + i * es;
        if (memcmp(ri, (char *)init + i * es, es) == 0) { /* untouched by the reference */
            touched += memcmp(ei, ri, es) != 0;
            continue;
        }
        x[m] = (float)elem(d->dtype, e2, i), y[m] = (float)elem(d->dtype, ri, 0);
        bad += !(fabs((double)x[m] - y[m]) <= rel * fabs(y[m]) + abs_tol);
        ++m;
    }
    const double diff = tu_calc_diff(x, y, m);
    if (getenv("TEG_VERBOSE"))
        printf("%-90s diff %.2e, %zu elements, %zu differ bitwise\n", what, diff, m, (size_t)(memcmp(e2, ref, n * es) != 0));
    TU_CHECK(touched == 0, "%s: %zu elements written that the reference leaves alone", what, touched);
    TU_CHECK(bad == 0, "%s: %zu of %zu elements outside the elementwise bound", what, bad, m);
    TU_CHECK(diff < 1e-6, "%s: calc_diff vs the reference %.3g", what, diff);
    free(x);
    free(y);
    free(init);
    free(ref);
    free(e1);
    free(e2);
    free(e2b);
}

/* ---- m-grouped -------------------------------------------------------------------------- */

typedef struct mkind {
    const char *name;
    tq_kind ka, kb;
    int gran_k_a, gran_k_b, gran_n_b;
    int recipe_a[2], recipe_b[2];
} mkind;

static const mkind kBf16 = {"bf16", TQ_BF16, TQ_BF16, 1, 1, 1, {0}, {0}};
static const mkind kFp8 = {"fp8 float 1x128/128x128", TQ_FP8_F32, TQ_FP8_F32, 128, 128, 128, {0}, {0}};
static const mkind kFp8Ue8m0 = {"fp8 packed ue8m0", TQ_FP8_UE8M0, TQ_FP8_UE8M0, 128, 128, 1, {0}, {0}};
static const mkind kFp8Fp4 = {"fp8 x fp4", TQ_FP8_UE8M0, TQ_FP4_UE8M0, 128, 32, 1, {1, 128}, {1, 32}};

typedef struct mctx {
    const mkind *kind;
    tq *a, *b;
    dg_tensor bnn, sfbnn; /* b as [G, K, N] for `_nn` */
    dg_tensor *d, *layout;
    dg_gemm_options o;
    int nn, masked;
} mctx;

static dg_status m_call(const void *p) {
    const mctx *c = p;
    const int q = c->kind->ka != TQ_BF16;
    const dg_tensor *b = c->nn ? &c->bnn : &c->b->data, *sfb = c->nn ? &c->sfbnn : &c->b->sf;
    if (c->masked)
        return q ? dg_m_grouped_fp8_fp4_gemm_nt_masked(&c->a->data, &c->a->sf, b, sfb, c->d, c->layout, 32, &c->o)
                 : dg_m_grouped_bf16_gemm_nt_masked(&c->a->data, b, c->d, c->layout, 32, &c->o);
    if (c->nn)
        return q ? dg_m_grouped_fp8_fp4_gemm_nn_contiguous(&c->a->data, &c->a->sf, b, sfb, c->d, c->layout, &c->o)
                 : dg_m_grouped_bf16_gemm_nn_contiguous(&c->a->data, b, c->d, c->layout, &c->o);
    return q ? dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&c->a->data, &c->a->sf, b, sfb, c->d, c->layout, &c->o)
             : dg_m_grouped_bf16_gemm_nt_contiguous(&c->a->data, b, c->d, c->layout, &c->o);
}

/* A [G, K, N] copy of b (FP4 pairs along N) with [G, kblocks, nblocks] scales. */
static void make_nn(const tq *b, dg_tensor *data, dg_tensor *sf) {
    const int64_t G = b->G, N = b->R, K = b->K;
    const int fp4 = b->kind == TQ_FP4_UE8M0;
    *data = tu_alloc3(b->data.dtype, G, K, fp4 ? N / 2 : N);
    memset(data->data, 0, dg_tensor_nbytes(data));
    for (int64_t g = 0; g < G; ++g)
        for (int64_t k = 0; k < K; ++k)
            for (int64_t n = 0; n < N; ++n) {
                const int64_t src = (g * N + n) * K + k, dst = (g * K + k) * N + n;
                if (b->kind == TQ_BF16)
                    ((uint16_t *)data->data)[dst] = dg_float_to_bf16(b->orig[src]);
                else if (!fp4)
                    ((uint8_t *)data->data)[dst] = b->code[src];
                else
                    ((uint8_t *)data->data)[dst / 2] |= (uint8_t)(b->code[src] << ((dst & 1) ? 4 : 0));
            }
    memset(sf, 0, sizeof *sf);
    if (b->kind == TQ_BF16)
        return;
    const int64_t r = b->sf.shape[1], c = b->sf.shape[2];
    *sf = tu_alloc3(b->sf.dtype, G, c, r);
    for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < r; ++i)
            for (int64_t j = 0; j < c; ++j)
                ((uint32_t *)sf->data)[(g * c + j) * r + i] = ((const uint32_t *)b->sf.data)[(g * r + i) * c + j];
}

static void set_recipes(mctx *c, const mkind *k) {
    c->o = dg_gemm_options_default();
    memcpy(c->o.recipe_a, k->recipe_a, sizeof c->o.recipe_a);
    memcpy(c->o.recipe_b, k->recipe_b, sizeof c->o.recipe_b);
}

/* Contiguous: ms[g] rows per group (each padded to `align` rows of NaN garbage, -1), 3 garbage
 * rows after the last group. */
static void contiguous(tu_rng *rng, const mkind *k, int G, const int *ms, int N, int K, int align, int psum,
                       int zero_pad, int nn, dg_dtype out) {
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(align));
    int64_t M = 3;
    for (int g = 0; g < G; ++g)
        M += tq_align(ms[g], align);
    tq A = tq_make(rng, k->ka, 0, 1, M, K, 1, k->gran_k_a);
    tq B = tq_make(rng, k->kb, 1, G, N, K, k->gran_n_b, k->gran_k_b);
    dg_tensor gl = tu_alloc(DG_INT32, 1, (int64_t[]){psum ? G : M}), d = tu_alloc2(out, M, N);
    int32_t *lay = gl.data;
    int64_t start = 0;
    for (int64_t r = 0; r < M && !psum; ++r)
        lay[r] = -1;
    for (int g = 0; g < G; ++g) {
        for (int64_t r = start; r < start + ms[g] && !psum; ++r)
            lay[r] = g;
        if (psum)
            lay[g] = (int32_t)(start + ms[g]);
        for (int64_t r = start + ms[g]; r < start + tq_align(ms[g], align); ++r)
            tq_poison_row(&A, 0, r);
        start += tq_align(ms[g], align);
    }
    for (int64_t r = start; r < M; ++r)
        tq_poison_row(&A, 0, r);
    tu_fill_bytes(&d, SENTINEL);
    mctx c = {.kind = k, .a = &A, .b = &B, .d = &d, .layout = &gl, .nn = nn};
    set_recipes(&c, k);
    c.o.use_psum_layout = psum;
    c.o.ensure_zero_padding = zero_pad;
    if (nn)
        make_nn(&B, &c.bnn, &c.sfbnn);
    char what[160];
    snprintf(what, sizeof what, "contiguous %s %s %s%s G=%d N=%d K=%d out=%s", k->name, nn ? "nn" : "nt",
             psum ? "psum" : "index", zero_pad ? "+zero" : "", G, N, K, dg_dtype_name(out));
    compare(what, m_call, &c, &d, K);
    if (nn) {
        tu_free(&c.bnn);
        if (c.sfbnn.data)
            tu_free(&c.sfbnn);
    }
    tu_free(&gl);
    tu_free(&d);
    tq_free(&A);
    tq_free(&B);
}

static void masked(tu_rng *rng, const mkind *k, int G, int max_m, const int *ms, int N, int K, dg_dtype out) {
    tq A = tq_make(rng, k->ka, 1, G, max_m, K, 1, k->gran_k_a);
    tq B = tq_make(rng, k->kb, 1, G, N, K, k->gran_n_b, k->gran_k_b);
    dg_tensor mm = tu_alloc(DG_INT32, 1, (int64_t[]){G}), d = tu_alloc3(out, G, max_m, N);
    for (int g = 0; g < G; ++g) {
        ((int32_t *)mm.data)[g] = ms[g];
        for (int r = ms[g]; r < max_m; ++r) /* rows past masked_m: garbage, never read */
            tq_poison_row(&A, g, r);
    }
    tu_fill_bytes(&d, SENTINEL);
    mctx c = {.kind = k, .a = &A, .b = &B, .d = &d, .layout = &mm, .masked = 1};
    set_recipes(&c, k);
    char what[160];
    snprintf(what, sizeof what, "masked %s G=%d max_m=%d N=%d K=%d out=%s", k->name, G, max_m, N, K,
             dg_dtype_name(out));
    compare(what, m_call, &c, &d, K);
    /* Explicitly: rows past masked_m still hold the sentinel after the engine's runs. */
    int64_t bad = 0;
    const size_t es = dg_dtype_size(out);
    for (int g = 0; g < G; ++g)
        for (int64_t r = ms[g]; r < max_m; ++r)
            for (size_t i = 0; i < (size_t)N * es; ++i)
                bad += ((uint8_t *)d.data)[((size_t)(g * max_m + r) * N) * es + i] != SENTINEL;
    TU_CHECK(bad == 0, "%s: %lld masked bytes written", what, (long long)bad);
    tu_free(&mm);
    tu_free(&d);
    tq_free(&A);
    tq_free(&B);
}

static void random_sizes(tu_rng *rng, int G, int expected, int *ms) {
    for (int g = 0; g < G; ++g)
        ms[g] = (int)(expected * (0.7 + 0.6 * tu_uniform(rng)));
}

static void test_m_grouped(tu_rng *rng) {
    const mkind *kinds[4] = {&kBf16, &kFp8, &kFp8Ue8m0, &kFp8Fp4};
    int ms[8];
    static const int tiny[5] = {1, 3, 0, 13, 5};  /* smaller than the 14-row microkernel tile */
    static const int single[1] = {150};           /* one group, the large-M path */
    for (int i = 0; i < 4; ++i) {
        const mkind *k = kinds[i];
        const int K = k->kb == TQ_FP4_UE8M0 ? 320 : 328; /* K tails inside a scale block */
        random_sizes(rng, 5, 40, ms);
        ms[2] = 0; /* an empty group */
        contiguous(rng, k, 5, ms, 72, K, 32, 0, 0, 0, DG_BFLOAT16);
        contiguous(rng, k, 5, ms, 72, K, 32, 1, 1, 1, DG_FLOAT32);
        random_sizes(rng, 4, 90, ms); /* groups above the small-M limit */
        contiguous(rng, k, 4, ms, 40, K, 128, 1, 0, 0, DG_BFLOAT16);
        contiguous(rng, k, 4, ms, 40, K, 64, 0, 0, 1, DG_BFLOAT16);
        contiguous(rng, k, 5, tiny, 72, K, 16, 0, 0, 0, DG_FLOAT32);
        contiguous(rng, k, 5, tiny, 72, K, 16, 1, 1, 0, DG_BFLOAT16);
        contiguous(rng, k, 1, single, 40, K, 32, i & 1, 1, 0, DG_BFLOAT16);
        random_sizes(rng, 6, 20, ms);
        ms[1] = 0, ms[4] = 48;
        masked(rng, k, 6, 48, ms, 72, K, DG_BFLOAT16);
        random_sizes(rng, 3, 70, ms);
        masked(rng, k, 3, 100, ms, 40, K, DG_FLOAT32);
    }
    /* N above one work-item chunk (1024 columns) with a tail: small groups cut into chunks. */
    static const int few[3] = {5, 0, 8}, mixed[3] = {3, 80, 7};
    masked(rng, &kFp8, 3, 8, few, 1100, 256, DG_BFLOAT16);
    masked(rng, &kBf16, 3, 80, mixed, 1100, 256, DG_FLOAT32);
    contiguous(rng, &kFp8Fp4, 3, mixed, 1100, 256, 16, 0, 0, 0, DG_BFLOAT16);
}

/* Rows [0, rows) of group g of a contiguous [G, R, C] tensor, as a 2-D view. */
static dg_tensor group_rows(const dg_tensor *t, int64_t g, int64_t rows) {
    return dg_tensor_2d((char *)t->data + (size_t)(g * t->strides[0]) * dg_dtype_size(t->dtype), t->dtype, rows,
                        t->shape[2]);
}

/* The operands of a masked grouped FP8 (fp4 0) or FP8 x FP4 (fp4 1) call, [G, rows, ...]. */
typedef struct masked_ops {
    const dg_tensor *a, *sfa, *b, *sfb;
    const dg_gemm_options *o;
    int fp4;
} masked_ops;

/* The masked grouped call on 1 and 2 threads: each group's rows bitwise those of one dense call
 * on the group's views (`what` names the case in failures). */
static void masked_vs_dense(const char *what, const masked_ops *x, int G, int maxm, const int *ms) {
    const int64_t n = x->b->shape[1];
    dg_tensor mm = tu_alloc(DG_INT32, 1, (int64_t[]){G}), d = tu_alloc3(DG_BFLOAT16, G, maxm, n);
    dg_tensor dd = tu_alloc2(DG_BFLOAT16, maxm, n);
    for (int g = 0; g < G; ++g)
        ((int32_t *)mm.data)[g] = ms[g];
    for (int threads = 1; threads <= 2; ++threads) {
        TU_CHECK_OK(dg_set_num_sms(threads));
        TU_CHECK_OK(x->fp4 ? dg_m_grouped_fp8_fp4_gemm_nt_masked(x->a, x->sfa, x->b, x->sfb, &d, &mm, maxm, x->o)
                           : dg_m_grouped_fp8_gemm_nt_masked(x->a, x->sfa, x->b, x->sfb, &d, &mm, maxm, x->o));
        for (int g = 0; g < G; ++g) {
            dg_tensor a = group_rows(x->a, g, ms[g]), sa = group_rows(x->sfa, g, ms[g]);
            dg_tensor b = group_rows(x->b, g, n), sb = group_rows(x->sfb, g, x->sfb->shape[1]);
            dg_tensor dv = dd;
            dv.shape[0] = ms[g];
            TU_CHECK_OK(x->fp4 ? dg_fp8_fp4_gemm_nt(&a, &sa, &b, &sb, &dv, NULL, x->o)
                               : dg_fp8_gemm_nt(&a, &sa, &b, &sb, &dv, NULL, x->o));
            TU_CHECK(memcmp((uint16_t *)d.data + (size_t)g * maxm * n, dd.data, (size_t)ms[g] * n * 2) == 0,
                     "%s, group %d, %d threads: rows differ from one dense call", what, g, threads);
        }
    }
    tu_free(&dd);
    tu_free(&d);
    tu_free(&mm);
}

/*
 * Small groups run as column chunks of 1024 (grouped.c), and every chunk takes its group's
 * decision to fold B's float32 scales or not (one scan per group, dg_operand.sf_pow2). Here
 * group 0's first 1024 rows of B have power-of-two scales and its last rows not, so a chunk
 * alone would fold and its group does not: the D rows must be bitwise those of one dense call
 * per group, on 1 and 2 threads.
 */
static void chunk_scale_plan(tu_rng *rng) {
    enum { G = 2, MAXM = 4, N = 1100, K = 256 };
    static const int ms[G] = {3, 4};
    tq A = tq_make(rng, TQ_FP8_F32, 1, G, MAXM, K, 1, 128);
    tq B = tq_make(rng, TQ_FP8_F32, 1, G, N, K, 128, 128);
    const int64_t nb = B.sf.shape[1], kb = B.sf.shape[2];
    for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < nb; ++i)
            for (int64_t j = 0; j < kb; ++j)
                ((float *)B.sf.data)[(g * nb + i) * kb + j] =
                    g == 0 && i == nb - 1 ? 0.3f : ldexpf(1.0f, (int)((i + j) % 3) - 1);
    const masked_ops x = {&A.data, &A.sf, &B.data, &B.sf, NULL, 0};
    masked_vs_dense("masked fp8, group 0 scales mixed by chunk", &x, G, MAXM, ms);
    tq_free(&A);
    tq_free(&B);
}

/*
 * FP4 weights with float32 scales: on AMX the work items run on the scales being powers of two
 * without scanning them first (grouped.c, may_assume); a group where one is not runs again on
 * its scanned plan. One odd scale (times 1 + 2^-10: folding it would round) in a full 16-row
 * block of group 0's second chunk and in group 2's last row; group 1 has powers of two only.
 * Every group's rows must be bitwise one dense call's.
 */
static void fp4_assumed_scales(tu_rng *rng) {
    enum { G = 3, MAXM = 5, N = 1100, K = 256, NQ = K / 32 };
    static const int ms[G] = {5, 3, 4};
    tq A = tq_make(rng, TQ_FP8_UE8M0, 1, G, MAXM, K, 1, 128);
    tq B = tq_make(rng, TQ_FP4_UE8M0, 1, G, N, K, 1, 32);
    dg_tensor sfb = tu_alloc3(DG_FLOAT32, G, N, NQ);
    for (int64_t i = 0; i < G * N * NQ; ++i)
        ((float *)sfb.data)[i] = ldexpf(1.0f, (int)(i % 7) - 3);
    ((float *)sfb.data)[(0 * N + 1050) * NQ + NQ - 1] *= 1.0f + 0x1p-10f;
    ((float *)sfb.data)[(2 * N + N - 1) * NQ + NQ - 1] *= 1.0f + 0x1p-10f;
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe_a[0] = 1, o.recipe_a[1] = 128, o.recipe_b[0] = 1, o.recipe_b[1] = 32;
    const masked_ops x = {&A.data, &A.sf, &B.data, &sfb, &o, 1};
    masked_vs_dense("masked fp8 x fp4, float scales", &x, G, MAXM, ms);
    tu_free(&sfb);
    tq_free(&A);
    tq_free(&B);
}

/* ---- k-grouped -------------------------------------------------------------------------- */

typedef enum kform { KF_BF16_TN, KF_FP8_TN_F32, KF_FP8_TN_PACKED, KF_FP8_NT } kform;

typedef struct kctx {
    kform form;
    dg_tensor a, sfa, b, sfb, *d, *c, gl;
    const int *ks;
    int num_ks;
    dg_gemm_options o;
} kctx;

static dg_status k_call(const void *p) {
    const kctx *c = p;
    if (c->form == KF_BF16_TN)
        return dg_k_grouped_bf16_gemm_tn_contiguous(&c->a, &c->b, c->d, c->ks, c->num_ks, &c->gl, c->c, &c->o);
    if (c->form == KF_FP8_NT)
        return dg_k_grouped_fp8_gemm_nt_contiguous(&c->a, &c->sfa, &c->b, &c->sfb, c->d, c->ks, c->num_ks, &c->gl,
                                                   c->c, &c->o);
    return dg_k_grouped_fp8_gemm_tn_contiguous(&c->a, &c->sfa, &c->b, &c->sfb, c->d, c->ks, c->num_ks, &c->gl, c->c,
                                               &c->o);
}

/* Random data: BF16 normal values, or E4M3 codes that are not NaN. */
static void fill_data(tu_rng *rng, dg_tensor *t) {
    const int64_t n = dg_tensor_numel(t);
    for (int64_t i = 0; i < n; ++i) {
        if (t->dtype == DG_BFLOAT16) {
            ((uint16_t *)t->data)[i] = dg_float_to_bf16((float)tu_normal(rng));
        } else {
            uint8_t v = (uint8_t)tu_next(rng);
            ((uint8_t *)t->data)[i] = (v & 0x7f) == 0x7f ? (uint8_t)(v ^ 1) : v;
        }
    }
}

/* Scales: float32 in [0.5, 2) (pow2: powers of two, which the engine folds into B), or packed
 * UE8M0 bytes in [120, 134]. */
static void fill_scales(tu_rng *rng, dg_tensor *t, int pow2) {
    const int64_t n = dg_tensor_numel(t);
    for (int64_t i = 0; i < n; ++i) {
        if (t->dtype == DG_INT32) {
            uint32_t w = 0;
            for (int j = 0; j < 4; ++j)
                w |= (uint32_t)(120 + tu_randint(rng, 0, 14)) << (8 * j);
            ((uint32_t *)t->data)[i] = w;
        } else {
            ((float *)t->data)[i] = pow2 ? ldexpf(1.0f, (int)tu_randint(rng, -3, 3)) : (float)(0.5 + 1.5 * tu_uniform(rng));
        }
    }
}

/* G groups of ks[g] (multiples of the alignment, zeros allowed) K rows; c_mode 0: no C,
 * 1: a separate C, 2: C is D (accumulate in place). */
static void k_grouped(tu_rng *rng, kform form, int G, const int *ks, int M, int N, int gran_k, int c_mode, int pow2) {
    const int align = form == KF_FP8_NT ? 128 : 32;
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(align));
    int64_t sum_k = 0, sf_rows = 0, packed_rows = 0;
    for (int g = 0; g < G; ++g) {
        sum_k += ks[g];
        sf_rows += tq_cdiv(ks[g], gran_k);
        packed_rows += tq_cdiv(tq_cdiv(ks[g], gran_k), 4);
    }
    const dg_dtype dt = form == KF_BF16_TN ? DG_BFLOAT16 : DG_FLOAT8_E4M3;
    kctx c;
    memset(&c, 0, sizeof c);
    c.form = form, c.ks = ks, c.num_ks = G;
    c.o = dg_gemm_options_default();
    if (form != KF_BF16_TN)
        c.o.recipe[0] = 1, c.o.recipe[1] = 1, c.o.recipe[2] = gran_k;
    if (form == KF_FP8_NT) {
        c.a = tu_alloc(dt, 1, (int64_t[]){sum_k * M > 0 ? sum_k * M : 0});
        c.b = tu_alloc(dt, 1, (int64_t[]){sum_k * N > 0 ? sum_k * N : 0});
        c.sfa = tu_alloc2(DG_FLOAT32, M, sf_rows);
        c.sfb = tu_alloc2(DG_FLOAT32, N, sf_rows);
    } else {
        c.a = tu_alloc2(dt, sum_k, M);
        c.b = tu_alloc2(dt, sum_k, N);
        const int packed = form == KF_FP8_TN_PACKED;
        if (form != KF_BF16_TN) {
            c.sfa = tu_alloc2(packed ? DG_INT32 : DG_FLOAT32, packed ? packed_rows : sf_rows, M);
            c.sfb = tu_alloc2(packed ? DG_INT32 : DG_FLOAT32, packed ? packed_rows : sf_rows, N);
        }
    }
    fill_data(rng, &c.a);
    fill_data(rng, &c.b);
    if (c.sfa.data) {
        fill_scales(rng, &c.sfa, 0);
        fill_scales(rng, &c.sfb, pow2);
    }
    c.gl = tu_alloc(DG_INT32, 1, (int64_t[]){G});
    for (int g = 0; g < G; ++g)
        ((int32_t *)c.gl.data)[g] = ks[g];
    dg_tensor d = tu_alloc3(DG_FLOAT32, G, M, N), cc = {0};
    float *dv = d.data;
    for (int64_t i = 0; i < (int64_t)G * M * N; ++i)
        dv[i] = (float)tu_normal(rng);
    c.d = &d;
    if (c_mode == 1) {
        cc = tu_alloc3(DG_FLOAT32, G, M, N);
        for (int64_t i = 0; i < (int64_t)G * M * N; ++i)
            ((float *)cc.data)[i] = (float)tu_normal(rng);
        c.c = &cc;
    } else if (c_mode == 2) {
        c.c = &d;
    }
    static const char *names[4] = {"bf16 tn", "fp8 tn float", "fp8 tn packed", "fp8 nt"};
    char what[160];
    snprintf(what, sizeof what, "k-grouped %s G=%d M=%d N=%d gran_k=%d c=%d pow2=%d", names[form], G, M, N, gran_k,
             c_mode, pow2);
    compare(what, k_call, &c, &d, sum_k);
    tu_free(&c.a);
    tu_free(&c.b);
    if (c.sfa.data) {
        tu_free(&c.sfa);
        tu_free(&c.sfb);
    }
    tu_free(&c.gl);
    tu_free(&d);
    if (cc.data)
        tu_free(&cc);
}

static void test_k_grouped(tu_rng *rng) {
    static const int ks4[4] = {96, 0, 224, 160}, single[1] = {320}, empty[3] = {0, 0, 0};
    static const int nt4[4] = {256, 0, 128, 384};
    k_grouped(rng, KF_BF16_TN, 4, ks4, 40, 72, 1, 0, 0);
    k_grouped(rng, KF_BF16_TN, 4, ks4, 72, 40, 1, 1, 0);
    k_grouped(rng, KF_BF16_TN, 1, single, 40, 72, 1, 2, 0);
    k_grouped(rng, KF_BF16_TN, 3, empty, 16, 24, 1, 1, 0);
    k_grouped(rng, KF_FP8_TN_F32, 4, ks4, 40, 72, 32, 1, 0);
    k_grouped(rng, KF_FP8_TN_F32, 4, ks4, 72, 40, 128, 2, 1);
    k_grouped(rng, KF_FP8_TN_PACKED, 4, ks4, 40, 72, 32, 0, 0);
    k_grouped(rng, KF_FP8_TN_PACKED, 1, single, 72, 40, 128, 1, 0);
    k_grouped(rng, KF_FP8_NT, 4, nt4, 40, 72, 128, 1, 0);
    k_grouped(rng, KF_FP8_NT, 4, nt4, 24, 40, 128, 2, 1);
}

int main(void) {
    tu_rng rng = {2024};
    const int threads = dg_get_num_sms(), align = dg_get_mk_alignment_for_contiguous_layout();
    test_m_grouped(&rng);
    chunk_scale_plan(&rng);
    fp4_assumed_scales(&rng);
    test_k_grouped(&rng);
    TU_CHECK_OK(dg_set_num_sms(threads));
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(align));
    return tu_finish();
}
