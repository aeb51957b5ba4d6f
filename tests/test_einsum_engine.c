/*
 * test_einsum_engine.c - dg_einsum / dg_fp8_einsum on the engine (src/engine/batched.c and
 * per-group dg_engine_gemm) against the reference backend: every form, odd shapes, strided
 * views, C accumulation, each ISA level and kernel, and bitwise determinism across thread
 * counts and calls; at every variant below AMX, each einsum equals the dense GEMM of the same
 * views bit for bit (the engine's one order); on AMX, where BF16 einsum adds its blocks in
 * float64 (batched.h), it equals that order built from dense GEMMs over its K blocks
 * (common/amx_einsum_model.h). fp8_einsum equals the dense GEMMs on every variant.
 *
 * Tolerances. The reference sums exactly (double) and rounds once; the engine accumulates in
 * float32. Element-wise: |engine - reference| <= (T + 4) * 2^-24 * sum|a*b| + |C| * 2^-23
 * + one ulp of the output (2^-7 relative for BF16, 2^-23 for float32), where T is the
 * number of terms and sum|a*b| is computed by the reference backend on the operands with
 * their signs cleared. calc_diff: < 1e-12 (float32 out) and < 1e-6 (BF16 out: a float32 sum
 * may round to the neighbouring BF16 value; DeepGEMM's own tests allow 1e-5 for bmk,bnk->mn).
 */
#include "test_util.h"
#include "common/amx_einsum_model.h"
#include "engine/batched.h"
#include "engine/engine.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* A view [d0, d1, d2] of a new contiguous tensor [d0, d1, d2 + pad] (*full) with random
 * contents: BF16 normal values, E4M3 codes (no NaN), FLOAT32 uniform scales in [0.5, 2) or
 * powers of two (pow2), INT32 packed UE8M0 bytes of 2^-3 .. 2^3. */
static dg_tensor rand_view(tu_rng *r, dg_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t pad, bool pow2,
                           dg_tensor *full) {
    *full = tu_alloc3(dt, d0, d1, d2 + pad);
    const int64_t n = d0 * d1 * (d2 + pad);
    for (int64_t i = 0; i < n; ++i) {
        if (dt == DG_BFLOAT16) {
            ((uint16_t *)full->data)[i] = dg_float_to_bf16((float)tu_normal(r));
        } else if (dt == DG_FLOAT8_E4M3) {
            uint8_t q = (uint8_t)tu_next(r);
            ((uint8_t *)full->data)[i] = (q & 0x7f) == 0x7f ? (uint8_t)(q - 1) : q;
        } else if (dt == DG_FLOAT32) {
            ((float *)full->data)[i] =
                pow2 ? ldexpf(1.0f, (int)tu_randint(r, -3, 3)) : (float)(0.5 + 1.5 * tu_uniform(r));
        } else {
            uint32_t w = 0;
            for (int b = 0; b < 4; ++b)
                w |= (uint32_t)(127 + tu_randint(r, -3, 3)) << (8 * b);
            ((uint32_t *)full->data)[i] = w;
        }
    }
    dg_tensor v = *full;
    v.shape[2] = d2;
    return v;
}

/* A copy of `full` with every sign cleared, and the view v re-pointed into it in *out. */
static dg_tensor abs_copy(const dg_tensor *full, const dg_tensor *v, dg_tensor *out) {
    *out = tu_alloc(full->dtype, full->ndim, full->shape);
    const int64_t n = dg_tensor_numel(full);
    for (int64_t i = 0; i < n; ++i) {
        if (full->dtype == DG_BFLOAT16)
            ((uint16_t *)out->data)[i] = ((uint16_t *)full->data)[i] & 0x7fff;
        else if (full->dtype == DG_FLOAT8_E4M3)
            ((uint8_t *)out->data)[i] = ((uint8_t *)full->data)[i] & 0x7f;
        else if (full->dtype == DG_FLOAT32)
            ((float *)out->data)[i] = fabsf(((float *)full->data)[i]);
        else
            ((uint32_t *)out->data)[i] = ((uint32_t *)full->data)[i];
    }
    dg_tensor w = *v;
    w.data = out->data;
    return w;
}

/* Engine output vs reference output with the bound above; c_abs may be NULL. */
static void compare(const char *what, const dg_tensor *eng, const dg_tensor *ref, const dg_tensor *sumabs,
                    const float *c_abs, int64_t terms) {
    float *e = tu_to_float(eng), *r = tu_to_float(ref), *s = tu_to_float(sumabs);
    const size_t n = (size_t)dg_tensor_numel(eng);
    const bool bf16 = eng->dtype == DG_BFLOAT16;
    int bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < n; ++i) {
        const double tol = ((double)terms + 4) * ldexp(1, -24) * s[i] + (c_abs ? c_abs[i] * ldexp(1, -23) : 0) +
                           fabs(r[i]) * (bf16 ? ldexp(1, -7) : ldexp(1, -23));
        if (!(fabs((double)e[i] - r[i]) <= tol) && bad++ == 0)
            first = i;
    }
    TU_CHECK(bad == 0, "%s: %d of %zu outside the bound (first %zu: %.9g vs %.9g)", what, bad, n, first,
             n ? e[first] : 0.0, n ? r[first] : 0.0);
    const double cd = tu_calc_diff(e, r, n);
    TU_CHECK(cd < (bf16 ? 1e-6 : 1e-12), "%s: calc_diff %.3g", what, cd);
    free(e), free(r), free(s);
}

/* ---- engine variants -------------------------------------------------------------------- */

typedef struct variant { dg_isa isa; int dpbf16, threads; } variant;

/* Selects a variant; false when this CPU lacks it. */
static dg_isa best_isa(void) {
    dg_cpu_info info;
    return dg_get_cpu_info(&info) == DG_OK ? info.best_isa : DG_ISA_GENERIC;
}

static bool set_variant(variant v) {
    if (v.isa > best_isa() || dg_set_isa(v.isa) != DG_OK)
        return false;
    dg_engine_set_dpbf16(v.dpbf16);
    TU_CHECK_OK(dg_set_num_sms(v.threads));
    return true;
}

static void reset_variant(void) {
    dg_set_isa(best_isa());
    dg_engine_set_dpbf16(-1);
    dg_set_num_sms(2);
}

static const variant kVariants[] = {
    {DG_ISA_AMX, -1, 2},        {DG_ISA_AMX, -1, 1},
    {DG_ISA_AVX512_BF16, 0, 2}, {DG_ISA_AVX512_BF16, 0, 1}, {DG_ISA_AVX512_BF16, 1, 2},
    {DG_ISA_AVX512, 0, 1},      {DG_ISA_AVX2, 0, 1},        {DG_ISA_GENERIC, 0, 1},
}; /* the lower levels on one thread keep the test short on a busy 2-core machine */
#define NVARIANTS ((int)(sizeof kVariants / sizeof kVariants[0]))

/* A call on one output tensor, fixed inputs. */
typedef dg_status (*call_fn)(const void *ctx, const dg_tensor *d, bool abs_inputs);
/* Checks d (the call's result under the current variant) against the dense GEMMs of the same
 * views under that variant (on AMX: the float64 order built from them); NULL: none. */
typedef void (*dense_fn)(const void *ctx, const dg_tensor *d, const char *what);

/*
 * Runs `call` on the reference (into ref), on |inputs| (into sumabs), then on every variant
 * (into d, starting from the initial bytes of dfull each time since C may be D): compares each
 * with the reference and with `dense`, and requires the same bits across ISA levels below
 * AMX, kernels, thread counts and repeated calls (the data holds no denormals), and likewise
 * across the AMX variants (TDPBF16PS has its own order).
 */
static void check_all(const char *what, call_fn call, const void *ctx, dg_tensor *dfull, const dg_tensor *d,
                      const float *c_abs, int64_t terms, dense_fn dense) {
    dg_tensor rfull = tu_alloc(dfull->dtype, dfull->ndim, dfull->shape);
    dg_tensor sfull = tu_alloc(dfull->dtype, dfull->ndim, dfull->shape);
    void *init = tu_snapshot(dfull);
    const size_t nbytes = (size_t)dg_tensor_numel(dfull) * dg_dtype_size(dfull->dtype);
    dg_tensor ref = *d, sum = *d;
    ref.data = (char *)rfull.data + ((char *)d->data - (char *)dfull->data);
    sum.data = (char *)sfull.data + ((char *)d->data - (char *)dfull->data);
    memcpy(rfull.data, init, nbytes);
    memcpy(sfull.data, init, nbytes);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    TU_CHECK_OK(call(ctx, &ref, false));
    TU_CHECK_OK(call(ctx, &sum, true));
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    dg_tensor first[2] = {tu_alloc(dfull->dtype, dfull->ndim, dfull->shape),
                          tu_alloc(dfull->dtype, dfull->ndim, dfull->shape)};
    bool have_first[2] = {false, false};
    for (int v = 0; v < NVARIANTS; ++v) {
        if (!set_variant(kVariants[v]))
            continue;
        char w[160];
        snprintf(w, sizeof w, "%s [isa %d dpbf16 %d threads %d]", what, (int)kVariants[v].isa, kVariants[v].dpbf16,
                 kVariants[v].threads);
        const int fam = kVariants[v].isa == DG_ISA_AMX;
        for (int rep = 0; rep < 2; ++rep) { /* twice: repeated calls give the same bits */
            memcpy(dfull->data, init, nbytes);
            TU_CHECK_OK(call(ctx, d, false));
            if (rep == 0)
                compare(w, d, &ref, &sum, c_abs, terms);
            if (rep == 0 && dense)
                dense(ctx, d, w);
            /* Every variant of a family, thread count and call: one set of bits (engine.h: the
             * order is the same for every kernel; VDPBF16PS differs only on denormals, absent
             * here). */
            if (!have_first[fam]) {
                memcpy(first[fam].data, dfull->data, nbytes);
                have_first[fam] = true;
            } else {
                TU_CHECK(memcmp(first[fam].data, dfull->data, nbytes) == 0, "%s rep %d: the same bits as the first run",
                         w, rep);
            }
        }
    }
    reset_variant();
    free(init);
    tu_free(&rfull), tu_free(&sfull), tu_free(&first[0]), tu_free(&first[1]);
}

/* ---- 'bmk,bnk->mn' ------------------------------------------------------------------------ */

typedef struct bmk_ctx {
    dg_tensor a, b, aa, ab; /* inputs and their |.| copies */
    const dg_tensor *c;     /* NULL, a separate C, or (in_place) D itself */
    bool in_place;
    const dg_tensor *c0;    /* the C of modes 1 and 2 (for the dense GEMM) */
} bmk_ctx;

/* abs_in: the operands with their signs cleared and no C, giving sum|a*b| for the bound. */
static dg_status bmk_call(const void *p, const dg_tensor *d, bool abs_in) {
    const bmk_ctx *x = p;
    const dg_tensor *c = abs_in ? NULL : x->in_place ? d : x->c; /* sum|a*b| leaves C out */
    return dg_einsum("bmk,bnk->mn", abs_in ? &x->aa : &x->a, abs_in ? &x->ab : &x->b, d, c);
}

/* The AMX order's D for A [M, K], B [N, K] views: the model's totals, then D = round(C + total)
 * (C: FLOAT32 [M, N] or NULL) into g, g's dtype. */
static void amx_model_d(const dg_tensor *a, const dg_tensor *b, const dg_tensor *c, dg_tensor *g) {
    const int64_t m = a->shape[0], n = b->shape[0];
    float *t = malloc((size_t)(m * n + 1) * sizeof(float));
    TU_CHECK(t != NULL, "out of memory");
    if (!t)
        return;
    tu_amx_einsum_model(a, b, t);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            const float v = c ? ((const float *)c->data)[i * c->strides[0] + j] + t[i * n + j] : t[i * n + j];
            if (g->dtype == DG_BFLOAT16)
                ((uint16_t *)g->data)[i * g->strides[0] + j] = dg_float_to_bf16(v);
            else
                ((float *)g->data)[i * g->strides[0] + j] = v;
        }
    free(t);
}

/* One segment (S = 1): the dense engine GEMM with the same C, bit for bit (AMX: its model). */
static void bmk_dense(const void *p, const dg_tensor *d, const char *what) {
    const bmk_ctx *x = p;
    const int64_t m = x->a.shape[1], n = x->b.shape[1], k = x->a.shape[2];
    if (x->a.shape[0] != 1 || m == 0 || n == 0)
        return;
    dg_tensor g = tu_alloc2(d->dtype, m, n);
    const dg_tensor a2 = dg_tensor_2d(x->a.data, DG_BFLOAT16, m, k), b2 = dg_tensor_2d(x->b.data, DG_BFLOAT16, n, k);
    if (dg_get_isa() == DG_ISA_AMX)
        amx_model_d(&a2, &b2, x->c || x->in_place ? x->c0 : NULL, &g);
    else
        TU_CHECK_OK(dg_bf16_gemm_nt(&a2, &b2, &g, x->c || x->in_place ? x->c0 : NULL));
    TU_CHECK(memcmp(g.data, d->data, (size_t)(m * n) * dg_dtype_size(d->dtype)) == 0, "%s: equals dg_bf16_gemm_nt (AMX: its float64 order)",
             what);
    tu_free(&g);
}

static void run_bmk(tu_rng *r, int64_t s, int64_t m, int64_t n, int64_t k) {
    dg_tensor af, bf, aaf, abf;
    bmk_ctx x = {0};
    x.a = rand_view(r, DG_BFLOAT16, s, m, k, 0, false, &af);
    x.b = rand_view(r, DG_BFLOAT16, s, n, k, 0, false, &bf);
    x.aa = abs_copy(&af, &x.a, &aaf);
    x.ab = abs_copy(&bf, &x.b, &abf);
    dg_tensor c = tu_alloc2(DG_FLOAT32, m, n);
    float *cabs = malloc((size_t)(m * n + 1) * sizeof(float));
    for (int64_t i = 0; i < m * n; ++i) {
        ((float *)c.data)[i] = (float)(10 * tu_normal(r));
        cabs[i] = fabsf(((float *)c.data)[i]);
    }
    char what[160];
    x.c0 = &c;
    for (int mode = 0; mode < 4; ++mode) { /* 0: f32 no C, 1: f32 separate C, 2: f32 C == D, 3: bf16 */
        dg_tensor d = tu_alloc2(mode == 3 ? DG_BFLOAT16 : DG_FLOAT32, m, n);
        if (mode == 2)
            memcpy(d.data, c.data, (size_t)(m * n) * 4);
        x.c = mode == 1 ? &c : NULL;
        x.in_place = mode == 2;
        snprintf(what, sizeof what, "bmk,bnk->mn S=%lld M=%lld N=%lld K=%lld mode %d", (long long)s, (long long)m,
                 (long long)n, (long long)k, mode);
        check_all(what, bmk_call, &x, &d, &d, mode == 1 || mode == 2 ? cabs : NULL, s * (k + 1), bmk_dense);
        if (k == 0 || s == 0) /* nothing to sum: D = C exactly */
            TU_CHECK(mode != 2 || memcmp(d.data, c.data, (size_t)(m * n) * 4) == 0, "%s: D = C", what);
        tu_free(&d);
    }
    free(cabs);
    tu_free(&af), tu_free(&bf), tu_free(&aaf), tu_free(&abf), tu_free(&c);
}

/* ---- 'bhr,hdr->bhd' / 'bhd,hdr->bhr' ------------------------------------------------------ */

typedef struct heads_ctx {
    const char *expr;
    dg_tensor x, y, ax, ay;
} heads_ctx;

static dg_status heads_call(const void *p, const dg_tensor *d, bool abs_in) {
    const heads_ctx *h = p;
    return dg_einsum(h->expr, abs_in ? &h->ax : &h->x, abs_in ? &h->ay : &h->y, d, NULL);
}

/* Each head is the dense engine GEMM of its 2-D views, bit for bit (the same order; on AMX
 * the float64 order built from dense GEMMs over its K blocks). */
static void heads_dense(const void *p, const dg_tensor *z, const char *what) {
    const heads_ctx *c = p;
    const bool bhd_out = strcmp(c->expr, "bhr,hdr->bhd") == 0;
    const int64_t bb = c->x.shape[0], h = c->x.shape[1], xk = c->x.shape[2], dd = c->y.shape[1], rr = c->y.shape[2];
    const int64_t zn = z->shape[2];
    dg_tensor g = tu_alloc2(DG_BFLOAT16, bb, zn);
    int head_bad = 0;
    for (int64_t hh = 0; hh < h; ++hh) {
        dg_tensor ah = dg_tensor_2d((uint16_t *)c->x.data + hh * c->x.strides[1], DG_BFLOAT16, bb, xk);
        ah.strides[0] = c->x.strides[0];
        dg_tensor bh = dg_tensor_2d((uint16_t *)c->y.data + hh * c->y.strides[0], DG_BFLOAT16, bhd_out ? dd : rr,
                                    bhd_out ? rr : dd);
        if (bhd_out)
            bh.strides[0] = c->y.strides[1];
        else
            bh.strides[0] = 1, bh.strides[1] = c->y.strides[1];
        if (dg_get_isa() == DG_ISA_AMX)
            amx_model_d(&ah, &bh, NULL, &g);
        else
            TU_CHECK_OK(dg_bf16_gemm_nt(&ah, &bh, &g, NULL));
        for (int64_t i = 0; i < bb; ++i)
            head_bad += memcmp((uint16_t *)g.data + i * zn, (uint16_t *)z->data + i * z->strides[0] + hh * z->strides[1],
                               (size_t)zn * 2) != 0;
    }
    TU_CHECK(head_bad == 0, "%s: every head equals dg_bf16_gemm_nt on its views (AMX: the float64 order built "
             "from it; %d rows differ)", what, head_bad);
    tu_free(&g);
}

/* x [B, H, X] inside [B, H, X + xpad], y [H, D, R] inside [H, D, R + ypad], z inside
 * [B, H, Z + zpad] filled with a sentinel that must survive. */
/* big: an output past the engine's streaming threshold (batched.c: non-temporal stores), too
 * large for the reference here: only the dense-GEMM equality, on the fast variants. */
static void run_heads(tu_rng *r, bool bhd_out, int64_t bb, int64_t h, int64_t rr, int64_t dd, int64_t xpad,
                      int64_t ypad, int64_t zpad, bool big) {
    const int64_t xk = bhd_out ? rr : dd, zn = bhd_out ? dd : rr;
    heads_ctx c = {.expr = bhd_out ? "bhr,hdr->bhd" : "bhd,hdr->bhr"};
    dg_tensor xf, yf, axf, ayf;
    c.x = rand_view(r, DG_BFLOAT16, bb, h, xk, xpad, false, &xf);
    c.y = rand_view(r, DG_BFLOAT16, h, dd, rr, ypad, false, &yf);
    c.ax = abs_copy(&xf, &c.x, &axf);
    c.ay = abs_copy(&yf, &c.y, &ayf);
    dg_tensor zf = tu_alloc3(DG_BFLOAT16, bb, h, zn + zpad);
    tu_fill_bytes(&zf, 0x3C);
    dg_tensor z = zf;
    z.shape[2] = zn;
    char what[160];
    snprintf(what, sizeof what, "%s B=%lld H=%lld R=%lld D=%lld pads %lld/%lld/%lld", c.expr, (long long)bb,
             (long long)h, (long long)rr, (long long)dd, (long long)xpad, (long long)ypad, (long long)zpad);
    if (!big)
        check_all(what, heads_call, &c, &zf, &z, NULL, xk, heads_dense);
    static const int kBig[] = {0, 2, 4, 6}; /* AMX, both AVX-512 BF16 kernels, AVX2 (SSE2 stores) */
    for (int v = 0; big && v < 4; ++v) {
        if (!set_variant(kVariants[kBig[v]]))
            continue;
        TU_CHECK_OK(heads_call(&c, &z, false));
        heads_dense(&c, &z, what);
    }
    reset_variant();
    int pad_bad = 0;
    for (int64_t i = 0; i < bb * h; ++i)
        for (int64_t p = 0; p < zpad; ++p)
            pad_bad += ((uint16_t *)zf.data)[i * (zn + zpad) + zn + p] != 0x3C3C;
    TU_CHECK(pad_bad == 0, "%s: the padding of z is untouched", what);
    tu_free(&xf), tu_free(&yf), tu_free(&axf), tu_free(&ayf), tu_free(&zf);
}

/* ---- fp8_einsum ------------------------------------------------------------------------------ */

typedef enum { F_BHR_HDR_BHD, F_BHD_HDR_BHR, F_BHD_BHR_HDR } fp8_form;

typedef struct fp8_ctx {
    const char *expr;
    dg_tensor x, sx, y, sy, ax, ay;
    const int *recipe;
    int recipe_k[3]; /* 'bhr,hdr->bhd' with a K granularity other than 128 */
    bool with_c;
} fp8_ctx;

static dg_status fp8_call(const void *p, const dg_tensor *d, bool abs_in) {
    const fp8_ctx *f = p;
    return dg_fp8_einsum(f->expr, abs_in ? &f->ax : &f->x, &f->sx, abs_in ? &f->ay : &f->y, &f->sy, d,
                         f->with_c && !abs_in ? d : NULL, f->recipe);
}

/* 'bhr,hdr->bhd' without C: each head equals dg_fp8_gemm_nt on its 2-D views bit for bit
 * (the same configuration and order per group, AMX included). */
static void fp8_dense(const void *p, const dg_tensor *z, const char *what) {
    const fp8_ctx *f = p;
    if (f->with_c || strcmp(f->expr, "bhr,hdr->bhd") != 0)
        return;
    const int64_t bb = f->x.shape[0], h = f->x.shape[1], rr = f->x.shape[2], dd = f->y.shape[1];
    dg_gemm_options o = dg_gemm_options_default();
    for (int i = 0; i < 3; ++i)
        o.recipe[i] = f->recipe ? f->recipe[i] : i == 0 ? 1 : 128;
    dg_tensor g = tu_alloc2(z->dtype, bb, dd);
    const size_t es = dg_dtype_size(z->dtype), ss = dg_dtype_size(f->sx.dtype);
    int bad = 0;
    for (int64_t hh = 0; hh < h; ++hh) {
        dg_tensor a = dg_tensor_2d((uint8_t *)f->x.data + hh * f->x.strides[1], DG_FLOAT8_E4M3, bb, rr);
        dg_tensor sa = dg_tensor_2d((char *)f->sx.data + hh * f->sx.strides[1] * ss, f->sx.dtype, bb, f->sx.shape[2]);
        dg_tensor b = dg_tensor_2d((uint8_t *)f->y.data + hh * f->y.strides[0], DG_FLOAT8_E4M3, dd, rr);
        dg_tensor sb = dg_tensor_2d((float *)f->sy.data + hh * f->sy.strides[0], DG_FLOAT32, f->sy.shape[1],
                                    f->sy.shape[2]);
        a.strides[0] = f->x.strides[0], sa.strides[0] = f->sx.strides[0];
        b.strides[0] = f->y.strides[1], sb.strides[0] = f->sy.strides[1];
        TU_CHECK_OK(dg_fp8_gemm_nt(&a, &sa, &b, &sb, &g, NULL, &o));
        for (int64_t i = 0; i < bb; ++i)
            bad += memcmp((char *)g.data + (size_t)(i * dd) * es,
                          (char *)z->data + (size_t)(i * z->strides[0] + hh * z->strides[1]) * es, (size_t)dd * es) != 0;
    }
    TU_CHECK(bad == 0, "%s: every head equals dg_fp8_gemm_nt on its views (%d rows differ)", what, bad);
    tu_free(&g);
}

/* gk: K granularity of the scales ('bhr,hdr->bhd' only; 128 otherwise). mixed: head 0's y
 * scales are powers of two (folded: no K blocks), the others' not, so with gk = 16 the heads
 * run on different configurations (AMX and its fallback). */
static void run_fp8_k(tu_rng *r, fp8_form form, int64_t bb, int64_t h, int64_t dd, int64_t rr, bool pow2,
                      bool packed_sfa, dg_dtype out, bool with_c, int gk, bool mixed) {
    static const char *const exprs[3] = {"bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr"};
    static const int recipe_hdr[3] = {1, 1, 128};
    fp8_ctx f = {.expr = exprs[form]};
    dg_tensor xf, yf, sxf, syf, axf, ayf;
    int64_t zs[3], terms;
    const dg_dtype sxt = packed_sfa ? DG_INT32 : DG_FLOAT32;
    if (form == F_BHR_HDR_BHD) {
        f.x = rand_view(r, DG_FLOAT8_E4M3, bb, h, rr, 0, false, &xf);
        f.sx = rand_view(r, sxt, bb, h, cdiv(rr, packed_sfa ? 4 * gk : gk), 0, pow2, &sxf);
        f.y = rand_view(r, DG_FLOAT8_E4M3, h, dd, rr, 0, false, &yf);
        f.sy = rand_view(r, DG_FLOAT32, h, cdiv(dd, 128), cdiv(rr, gk), 0, pow2, &syf);
        for (int64_t i = 0; mixed && i < f.sy.shape[1] * f.sy.shape[2]; ++i)
            ((float *)f.sy.data)[i] = ldexpf(1.0f, (int)(i % 7) - 3);
        zs[0] = bb, zs[1] = h, zs[2] = dd, terms = rr;
        if (gk != 128) {
            f.recipe_k[0] = 1, f.recipe_k[1] = 128, f.recipe_k[2] = gk;
            f.recipe = f.recipe_k;
        }
    } else if (form == F_BHD_HDR_BHR) {
        f.x = rand_view(r, DG_FLOAT8_E4M3, bb, h, dd, 0, false, &xf);
        f.sx = rand_view(r, sxt, bb, h, cdiv(dd, packed_sfa ? 512 : 128), 0, pow2, &sxf);
        f.y = rand_view(r, DG_FLOAT8_E4M3, h, dd, rr, 0, false, &yf);
        f.sy = rand_view(r, DG_FLOAT32, h, cdiv(dd, 128), cdiv(rr, 128), 0, pow2, &syf);
        zs[0] = bb, zs[1] = h, zs[2] = rr, terms = dd;
    } else {
        f.x = rand_view(r, DG_FLOAT8_E4M3, bb, h, dd, 0, false, &xf);
        f.sx = rand_view(r, DG_FLOAT32, cdiv(bb, 128), h, dd, 0, pow2, &sxf);
        f.y = rand_view(r, DG_FLOAT8_E4M3, bb, h, rr, 0, false, &yf);
        f.sy = rand_view(r, DG_FLOAT32, cdiv(bb, 128), h, rr, 0, pow2, &syf);
        zs[0] = h, zs[1] = dd, zs[2] = rr, terms = bb;
        f.recipe = recipe_hdr;
    }
    f.ax = abs_copy(&xf, &f.x, &axf);
    f.ay = abs_copy(&yf, &f.y, &ayf);
    f.with_c = with_c;
    dg_tensor z = tu_alloc3(out, zs[0], zs[1], zs[2]);
    const int64_t zn = zs[0] * zs[1] * zs[2];
    float *cabs = malloc((size_t)(zn + 1) * sizeof(float));
    for (int64_t i = 0; i < zn; ++i) {
        const float v = with_c ? (float)(5 * tu_normal(r)) : 0.0f;
        if (out == DG_FLOAT32)
            ((float *)z.data)[i] = v;
        else
            ((uint16_t *)z.data)[i] = dg_float_to_bf16(v);
        cabs[i] = fabsf(v);
    }
    char what[200];
    snprintf(what, sizeof what, "fp8 %s B=%lld H=%lld D=%lld R=%lld pow2 %d packed %d out %s c %d gk %d mixed %d",
             f.expr, (long long)bb, (long long)h, (long long)dd, (long long)rr, pow2, packed_sfa, dg_dtype_name(out),
             with_c, gk, mixed);
    check_all(what, fp8_call, &f, &z, &z, with_c ? cabs : NULL, terms, fp8_dense);
    free(cabs);
    tu_free(&xf), tu_free(&yf), tu_free(&sxf), tu_free(&syf), tu_free(&axf), tu_free(&ayf), tu_free(&z);
}

static void run_fp8(tu_rng *r, fp8_form form, int64_t bb, int64_t h, int64_t dd, int64_t rr, bool pow2,
                    bool packed_sfa, dg_dtype out, bool with_c) {
    run_fp8_k(r, form, bb, h, dd, rr, pow2, packed_sfa, out, with_c, 128, false);
}

/* ---- the batched engine's packing paths ------------------------------------------------- */

/* dg_engine_bgemm (G groups, S segments) with A MN-major and B strided along both axes
 * (portable packing; MN-major B packing) equals the same problem on K-major copies (the ISA
 * packers), bit for bit, on every variant: packing moves values, never the order. */
static void run_layouts(tu_rng *r, int64_t g, int64_t s, int64_t m, int64_t n, int64_t k) {
    uint16_t *ak = malloc((size_t)(g * s * m * k) * 2 + 2), *am = malloc((size_t)(g * s * m * k) * 2 + 2);
    uint16_t *bk = malloc((size_t)(g * s * n * k) * 2 + 2), *bw = malloc((size_t)(g * s * n * k) * 4 + 2);
    for (int64_t q = 0; q < g * s; ++q) /* ak [q][m][k], am [q][k][m]; bk [q][n][k], bw [q][k][n][2] */
        for (int64_t i = 0; i < m * k; ++i)
            ak[q * m * k + i] = am[q * m * k + (i % k) * m + i / k] = dg_float_to_bf16((float)tu_normal(r));
    for (int64_t q = 0; q < g * s; ++q)
        for (int64_t i = 0; i < n * k; ++i) {
            bk[q * n * k + i] = bw[2 * (q * n * k + (i % k) * n + i / k)] = dg_float_to_bf16((float)tu_normal(r));
            bw[2 * (q * n * k + (i % k) * n + i / k) + 1] = 0x7fc0; /* a NaN that must never be read */
        }
    dg_tensor d0 = tu_alloc2(DG_FLOAT32, g * m, n), d1 = tu_alloc2(DG_FLOAT32, g * m, n);
    dg_tensor v0 = d0, v1 = d1;
    v0.shape[0] = v1.shape[0] = m;
    const dg_bgemm pk = {g, s, m, n, k, {ak, s * m * k, m * k, k, 1}, {bk, s * n * k, n * k, k, 1}, &v0, NULL, m * n,
                         0, NULL};
    const dg_bgemm pm = {g, s, m, n, k, {am, s * m * k, m * k, 1, m}, {bw, 2 * s * n * k, 2 * n * k, 2, 2 * n}, &v1,
                         NULL, m * n, 0, NULL};
    char what[160];
    for (int v = 0; v < NVARIANTS; ++v) {
        if (!set_variant(kVariants[v]))
            continue;
        snprintf(what, sizeof what, "bgemm layouts G=%lld S=%lld M=%lld N=%lld K=%lld [isa %d dpbf16 %d threads %d]",
                 (long long)g, (long long)s, (long long)m, (long long)n, (long long)k, (int)kVariants[v].isa,
                 kVariants[v].dpbf16, kVariants[v].threads);
        TU_CHECK_OK(dg_engine_bgemm(&pk));
        TU_CHECK_OK(dg_engine_bgemm(&pm));
        TU_CHECK(memcmp(d0.data, d1.data, (size_t)(g * m * n) * 4) == 0, "%s: strided packing, the same bits", what);
    }
    reset_variant();
    free(ak), free(am), free(bk), free(bw);
    tu_free(&d0), tu_free(&d1);
}

/* Batch invariance of dg_engine_bgemm: one call over M rows (several row tiles sharing each
 * group's B, which the engine then packs once; the last A panel on a narrower kernel) gives
 * the bits of calls over `block` rows at a time (one row tile each), on every variant. */
static void run_row_blocks(tu_rng *r, int64_t g, int64_t s, int64_t m, int64_t n, int64_t k, int64_t block) {
    uint16_t *a = malloc((size_t)(g * s * m * k) * 2 + 2), *b = malloc((size_t)(g * s * n * k) * 2 + 2);
    for (int64_t i = 0; i < g * s * m * k; ++i)
        a[i] = dg_float_to_bf16((float)tu_normal(r));
    for (int64_t i = 0; i < g * s * n * k; ++i)
        b[i] = dg_float_to_bf16((float)tu_normal(r));
    /* A [m][g][s][k] (rows of all groups interleaved, as the heads forms), B [g][s][n][k] */
    const dg_bview av = {a, s * k, k, g * s * k, 1}, bv = {b, s * n * k, n * k, k, 1};
    dg_tensor d0 = tu_alloc2(DG_BFLOAT16, m, g * n), d1 = tu_alloc2(DG_BFLOAT16, m, g * n);
    char what[160];
    for (int v = 0; v < NVARIANTS; ++v) {
        if (!set_variant(kVariants[v]))
            continue;
        snprintf(what, sizeof what, "bgemm row blocks G=%lld S=%lld M=%lld N=%lld K=%lld by %lld [isa %d dpbf16 %d threads %d]",
                 (long long)g, (long long)s, (long long)m, (long long)n, (long long)k, (long long)block,
                 (int)kVariants[v].isa, kVariants[v].dpbf16, kVariants[v].threads);
        dg_tensor v0 = d0;
        v0.shape[1] = n;
        const dg_bgemm whole = {g, s, m, n, k, av, bv, &v0, NULL, n, 0, NULL};
        TU_CHECK_OK(dg_engine_bgemm(&whole));
        for (int64_t m0 = 0; m0 < m; m0 += block) {
            dg_tensor v1 = d1;
            v1.data = (uint16_t *)d1.data + m0 * g * n;
            v1.shape[0] = m - m0 < block ? m - m0 : block, v1.shape[1] = n;
            dg_bview ab = av;
            ab.base = a + m0 * av.si;
            const dg_bgemm part = {g, s, v1.shape[0], n, k, ab, bv, &v1, NULL, n, 0, NULL};
            TU_CHECK_OK(dg_engine_bgemm(&part));
        }
        TU_CHECK(memcmp(d0.data, d1.data, (size_t)(m * g * n) * 2) == 0, "%s: the same bits", what);
    }
    reset_variant();
    free(a), free(b);
    tu_free(&d0), tu_free(&d1);
}

int main(void) {
    tu_rng rng = {11};
    TU_CHECK_OK(dg_set_num_sms(2));
    const int64_t bmk[][4] = {{3, 5, 7, 9}, {4, 37, 45, 33}, {2, 130, 70, 128}, {7, 16, 64, 1},
                              {1, 1, 1, 2}, {3, 29, 100, 0}, {0, 4, 5, 6},    {33, 20, 300, 24},
                              {1, 40, 50, 64}, {1, 230, 33, 300}};
    for (size_t i = 0; i < sizeof bmk / sizeof bmk[0]; ++i)
        run_bmk(&rng, bmk[i][0], bmk[i][1], bmk[i][2], bmk[i][3]);
    /* B, H, R, D, xpad, ypad, zpad */
    const int64_t heads[][7] = {{3, 2, 40, 5, 0, 8, 0},    {1, 3, 129, 17, 2, 3, 3}, {37, 5, 64, 33, 1, 0, 2},
                                {130, 3, 33, 70, 0, 5, 1}, {20, 16, 96, 48, 0, 128, 0}, {300, 1, 70, 40, 3, 1, 0},
                                {2, 2, 1, 3, 0, 0, 0}};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; ++i)
        for (int form = 0; form < 2; ++form)
            run_heads(&rng, form == 0, heads[i][0], heads[i][1], heads[i][2], heads[i][3], heads[i][4], heads[i][5],
                      heads[i][6], false);
    run_heads(&rng, false, 520, 16, 517, 16, 0, 0, 1, true); /* 8.6 MB of z, rows not 16-byte aligned */
    run_row_blocks(&rng, 3, 1, 300, 70, 130, 7); /* shared B packed once; tails of 6 and 7 rows */
    run_row_blocks(&rng, 2, 3, 461, 40, 66, 13); /* segments: K' = 3 x 66 */
    run_layouts(&rng, 3, 2, 37, 45, 70);
    run_layouts(&rng, 1, 5, 70, 33, 33);
    run_fp8(&rng, F_BHR_HDR_BHD, 3, 2, 130, 200, true, false, DG_BFLOAT16, false);
    run_fp8(&rng, F_BHR_HDR_BHD, 3, 2, 130, 200, true, true, DG_FLOAT32, true);
    run_fp8(&rng, F_BHR_HDR_BHD, 20, 3, 20, 300, false, false, DG_FLOAT32, false);
    run_fp8(&rng, F_BHR_HDR_BHD, 2, 2, 9, 140, false, false, DG_BFLOAT16, true);
    run_fp8(&rng, F_BHR_HDR_BHD, 250, 2, 40, 260, false, true, DG_BFLOAT16, false); /* tiles; packed sfa */
    run_fp8_k(&rng, F_BHR_HDR_BHD, 40, 3, 50, 100, false, true, DG_BFLOAT16, false, 16, true); /* two configs */
    run_fp8(&rng, F_BHD_HDR_BHR, 2, 2, 260, 140, true, false, DG_BFLOAT16, false);
    run_fp8(&rng, F_BHD_HDR_BHR, 17, 2, 150, 33, false, false, DG_FLOAT32, true);
    run_fp8(&rng, F_BHD_BHR_HDR, 150, 2, 6, 10, true, false, DG_FLOAT32, true);
    run_fp8(&rng, F_BHD_BHR_HDR, 130, 3, 5, 4, false, false, DG_FLOAT32, false);
    return tu_finish();
}
