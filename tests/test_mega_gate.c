/*
 * test_mega_gate.c - dg_bf16_mega_gate and dg_get_bf16_mega_gate_config (deepgemm.h,
 * "mega-gate"): the fast path against the reference bit for bit (each ISA level, 1/2/3 threads,
 * batch invariance), both against the test's own float64 statement of the gate, the routing
 * controls (mask, shared slots, physical map, fixed and random routing), and every bad argument.
 */
#include "test_util.h"

#include "core/internal.h" /* dg_alloc_fail_nth */

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct gate_case {
    int t, h, e, k, shared; /* shared: S with use_shared_as_routed, 0 without */
    const char *scoring;    /* NULL: the default ("identity") */
    int bias, image, mask, map, fix, random, unmapped, ep_rank;
} gate_case;

/* Inputs and outputs of one case; the optional ones are NULL when the case has none. */
typedef struct gate_data {
    gate_case c;
    dg_tensor x, w, mask, bias, image_bias, image_mask, fix, map, count, random, unmapped, idx, wt;
    int64_t *unmapped_init; /* the fixed experts (copied into unmapped before each call) */
    int dup;
} gate_data;

static int slots(const gate_case *c) { return c->k + c->shared; }

static void fill_bf16(tu_rng *rng, dg_tensor *t, float scale) {
    uint16_t *p = t->data;
    for (int64_t i = 0; i < dg_tensor_numel(t); ++i)
        p[i] = dg_float_to_bf16((float)tu_normal(rng) * scale);
}

static void fill_flags(tu_rng *rng, dg_tensor *t, double p_true) {
    uint8_t *p = t->data;
    for (int64_t i = 0; i < dg_tensor_numel(t); ++i)
        p[i] = tu_uniform(rng) < p_true;
}

static gate_data make_data(tu_rng *rng, gate_case c) {
    gate_data g;
    memset(&g, 0, sizeof g);
    g.c = c;
    const int64_t t1[1] = {c.t}, e1[1] = {c.e}, l1[1] = {c.e + c.shared};
    g.x = tu_alloc2(DG_BFLOAT16, c.t, c.h);
    g.w = tu_alloc2(DG_BFLOAT16, c.e, c.h);
    fill_bf16(rng, &g.x, 1.0f);
    fill_bf16(rng, &g.w, 1.0f / sqrtf((float)c.h));
    if (c.mask) {
        g.mask = tu_alloc(DG_UINT8, 1, t1);
        fill_flags(rng, &g.mask, 0.75);
        ((uint8_t *)g.mask.data)[0] = 1;
    }
    if (c.bias) {
        g.bias = tu_alloc(DG_FLOAT32, 1, e1);
        tu_fill_normal(rng, g.bias.data, (size_t)c.e, 1.0f);
    }
    if (c.image) {
        g.image_bias = tu_alloc(DG_FLOAT32, 1, e1);
        tu_fill_normal(rng, g.image_bias.data, (size_t)c.e, 1.0f);
        g.image_mask = tu_alloc(DG_UINT8, 1, t1);
        fill_flags(rng, &g.image_mask, 0.5);
    }
    if (c.map) { /* DeepGEMM's test layout: replica 0 is the expert itself, the first 32 have a second */
        g.dup = 33;
        g.map = tu_alloc2(DG_INT32, c.e + c.shared, g.dup);
        g.count = tu_alloc(DG_INT32, 1, l1);
        int32_t *m = g.map.data, *n = g.count.data;
        for (int l = 0; l < c.e + c.shared; ++l) {
            for (int d = 0; d < g.dup; ++d)
                m[l * g.dup + d] = -1;
            m[l * g.dup] = l;
            n[l] = 1;
            if (l < 32) {
                m[l * g.dup + 1] = c.e + c.shared + l;
                n[l] = 2;
            }
        }
    }
    if (c.unmapped || c.fix) {
        g.unmapped = tu_alloc2(DG_INT64, c.t, c.k);
        g.unmapped_init = malloc((size_t)c.t * c.k * sizeof(int64_t));
        for (int i = 0; i < c.t * c.k; ++i)
            g.unmapped_init[i] = tu_randint(rng, 0, c.e - 1);
    }
    if (c.fix) {
        g.fix = tu_alloc(DG_UINT8, 1, t1);
        fill_flags(rng, &g.fix, 0.3);
    }
    if (c.random) {
        g.random = tu_alloc(DG_UINT8, 1, t1);
        fill_flags(rng, &g.random, 0.2);
    }
    g.idx = tu_alloc2(DG_INT64, c.t, slots(&c));
    g.wt = tu_alloc2(DG_FLOAT32, c.t, slots(&c));
    return g;
}

static void free_data(gate_data *g) {
    dg_tensor *all[] = {&g->x, &g->mask, &g->w, &g->bias, &g->image_bias, &g->image_mask, &g->fix,
                        &g->map, &g->count, &g->random, &g->unmapped, &g->idx, &g->wt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        if (all[i]->data)
            tu_free(all[i]);
    free(g->unmapped_init);
}

static const dg_tensor *opt(const dg_tensor *t) { return t->data ? t : NULL; }

static dg_status run(gate_data *g) {
    const gate_case *c = &g->c;
    if (g->unmapped.data)
        memcpy(g->unmapped.data, g->unmapped_init, (size_t)c->t * c->k * sizeof(int64_t));
    tu_fill_bytes(&g->idx, 0xA5);
    tu_fill_bytes(&g->wt, 0xA5);
    return dg_bf16_mega_gate(&g->x, &g->w, c->k, c->shared > 0, c->shared > 0 ? c->shared : 1, 1.5f, c->ep_rank,
                             c->scoring, opt(&g->mask), opt(&g->bias), opt(&g->image_bias), opt(&g->image_mask),
                             opt(&g->fix), opt(&g->map), opt(&g->count), opt(&g->unmapped), opt(&g->random),
                             &g->idx, &g->wt);
}

/* The outputs of the last run, for bitwise comparisons. */
typedef struct gate_result {
    void *idx, *wt, *unmapped;
} gate_result;

static gate_result snapshot(const gate_data *g) {
    gate_result r = {tu_snapshot(&g->idx), tu_snapshot(&g->wt), g->unmapped.data ? tu_snapshot(&g->unmapped) : NULL};
    return r;
}

static int same(const gate_data *g, const gate_result *r) {
    return tu_unchanged(&g->idx, r->idx) && tu_unchanged(&g->wt, r->wt) &&
           (!r->unmapped || tu_unchanged(&g->unmapped, r->unmapped));
}

static void free_result(gate_result *r) {
    free(r->idx);
    free(r->wt);
    free(r->unmapped);
}

/* ---- the test's own float64 statement of the gate -------------------------------------------- */

static double score64(const char *scoring, double v) {
    if (scoring && strcmp(scoring, "sigmoid") == 0)
        return 1.0 / (1.0 + exp(-v));
    if (scoring && strcmp(scoring, "sqrtsoftplus") == 0)
        return sqrt(v > 20.0 ? v : log1p(exp(v)));
    return v;
}

static int flag(const dg_tensor *t, int i) { return t->data ? ((const uint8_t *)t->data)[i] != 0 : -1; }

/* Checks the outputs of token i against float64 math: the selection up to numerical ties
 * (tolerance 1e-4 relative to the largest rank), order best first, weights within 1e-5. */
static void check_token64(const gate_data *g, int i) {
    const gate_case *c = &g->c;
    const int n = slots(c);
    const int64_t *idx = (const int64_t *)g->idx.data + (int64_t)i * n;
    const float *wt = (const float *)g->wt.data + (int64_t)i * n;
    const int64_t *unm = g->unmapped.data ? (const int64_t *)g->unmapped.data + (int64_t)i * c->k : NULL;
    if (flag(&g->mask, i) == 0) {
        for (int j = 0; j < n; ++j)
            TU_CHECK(idx[j] == -1 && wt[j] == 0.0f, "masked token %d slot %d: %lld %g", i, j, (long long)idx[j], wt[j]);
        for (int j = 0; unm && j < c->k; ++j)
            TU_CHECK(unm[j] == -1, "masked token %d unmapped %d", i, j);
        return;
    }
    if (flag(&g->random, i) == 1) {
        const int64_t pool = c->map ? (c->e + c->shared) + (c->e + c->shared < 32 ? c->e + c->shared : 32)
                                    : c->e + c->shared;
        for (int j = 0; j < n; ++j) {
            TU_CHECK(idx[j] >= 0 && idx[j] < pool && wt[j] > 0.0f && wt[j] <= 1.0f, "random token %d slot %d", i, j);
            for (int q = 0; q < j; ++q)
                TU_CHECK(idx[q] != idx[j], "random token %d: slots %d and %d both %lld", i, q, j, (long long)idx[j]);
        }
        for (int j = 0; unm && j < c->k; ++j)
            TU_CHECK(unm[j] == -1, "random token %d unmapped %d", i, j);
        return;
    }
    /* Logical routed experts: unmapped_topk_idx, or topk_idx through the test's map layout. */
    int sel[32];
    for (int j = 0; j < c->k; ++j) {
        sel[j] = unm ? (int)unm[j] : (int)idx[j];
        if (!unm && c->map && sel[j] >= c->e + c->shared)
            sel[j] -= c->e + c->shared;
        TU_CHECK(sel[j] >= 0 && sel[j] < c->e, "token %d slot %d: expert %d", i, j, sel[j]);
    }
    const uint16_t *x = (const uint16_t *)g->x.data + (int64_t)i * c->h;
    double logit[512], rank[512], maxabs = 0.0;
    const int biased = c->bias || c->image;
    const float *b = flag(&g->image_mask, i) == 1 ? g->image_bias.data : (c->bias ? g->bias.data : NULL);
    for (int e = 0; e < c->e; ++e) {
        const uint16_t *w = (const uint16_t *)g->w.data + (int64_t)e * c->h;
        double acc = 0.0;
        for (int k = 0; k < c->h; ++k)
            acc += (double)dg_bf16_to_float(x[k]) * dg_bf16_to_float(w[k]);
        logit[e] = acc;
        rank[e] = biased ? score64(c->scoring, acc) + (b ? b[e] : 0.0) : acc;
        maxabs = fmax(maxabs, fabs(rank[e]));
    }
    const double tol = 1e-4 * (1.0 + maxabs);
    if (flag(&g->fix, i) == 1) {
        for (int j = 0; j < c->k; ++j)
            TU_CHECK(sel[j] == g->unmapped_init[(int64_t)i * c->k + j], "fixed token %d slot %d", i, j);
    } else {
        double min_sel = INFINITY, max_unsel = -INFINITY;
        for (int j = 0; j < c->k; ++j) {
            min_sel = fmin(min_sel, rank[sel[j]]);
            if (j > 0)
                TU_CHECK(rank[sel[j]] <= rank[sel[j - 1]] + tol, "token %d: slot %d ranks above slot %d", i, j, j - 1);
            for (int q = 0; q < j; ++q)
                TU_CHECK(sel[q] != sel[j], "token %d: expert %d twice", i, sel[j]);
        }
        for (int e = 0; e < c->e; ++e) {
            int chosen = 0;
            for (int j = 0; j < c->k; ++j)
                chosen |= sel[j] == e;
            if (!chosen)
                max_unsel = fmax(max_unsel, rank[e]);
        }
        TU_CHECK(max_unsel <= min_sel + tol, "token %d: an unselected expert ranks %g above %g", i, max_unsel, min_sel);
    }
    double sum = 0.0;
    for (int j = 0; j < c->k; ++j)
        sum += score64(c->scoring, logit[sel[j]]);
    double sum_abs = 0.0;
    for (int j = 0; j < c->k; ++j)
        sum_abs += fabs(score64(c->scoring, logit[sel[j]]));
    /* identity scores may cancel in the sum: the tolerance grows with the condition number */
    const double cond = sum != 0.0 ? sum_abs / fabs(sum) : 1.0;
    for (int j = 0; j < c->k; ++j) {
        const double want = score64(c->scoring, logit[sel[j]]) / (sum + 1e-20) * 1.5;
        TU_CHECK(fabs(wt[j] - want) <= 1e-5 * (1.0 + fabs(want)) * cond, "token %d slot %d: weight %g, want %g", i, j,
                 wt[j], want);
    }
    for (int s = 0; s < c->shared; ++s) {
        const int l = c->e + s;
        int64_t want = l;
        if (c->map) {
            const uint32_t spread = (uint32_t)c->ep_rank + (uint32_t)i * 23333u;
            const int cnt = ((const int32_t *)g->count.data)[l];
            want = ((const int32_t *)g->map.data)[l * g->dup + spread % (uint32_t)cnt];
        }
        TU_CHECK(idx[c->k + s] == want && wt[c->k + s] == 1.0f, "token %d shared slot %d: %lld %g", i, s,
                 (long long)idx[c->k + s], wt[c->k + s]);
    }
}

/* ---- fast path against the reference ------------------------------------------------------- */

static void check_case(tu_rng *rng, gate_case c) {
    gate_data g = make_data(rng, c);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    TU_CHECK_OK(run(&g));
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    for (int i = 0; i < c.t; ++i)
        check_token64(&g, i);
    gate_result ref = snapshot(&g);
    const dg_isa best = dg_get_isa();
    const int old_threads = dg_get_num_sms();
    const dg_isa isas[2] = {DG_ISA_GENERIC, DG_ISA_AVX2};
    for (int v = 0; v < 2; ++v) {
        if (isas[v] > best)
            continue;
        TU_CHECK_OK(dg_set_isa(isas[v]));
        for (int threads = 1; threads <= 3; ++threads) {
            TU_CHECK_OK(dg_set_num_sms(threads));
            TU_CHECK_OK(run(&g));
            TU_CHECK(same(&g, &ref), "T=%d H=%d E=%d K=%d S=%d %s: fast (%s, %d threads) differs from the reference",
                     c.t, c.h, c.e, c.k, c.shared, c.scoring ? c.scoring : "default", dg_isa_name(isas[v]), threads);
        }
    }
    TU_CHECK_OK(dg_set_isa(best));
    TU_CHECK_OK(dg_set_num_sms(old_threads));
    free_result(&ref);
    free_data(&g);
}

/* A token's outputs do not depend on the tokens around it: the last token alone gives its row. */
static void check_batch_invariance(tu_rng *rng) {
    gate_case c = {.t = 37, .h = 512, .e = 64, .k = 8, .shared = 1, .scoring = "sqrtsoftplus", .bias = 1, .map = 1,
                   .unmapped = 1};
    gate_data g = make_data(rng, c);
    TU_CHECK_OK(run(&g));
    for (int len = 1; len <= 2; ++len) {
        const int first = c.t - len;
        gate_case c1 = c;
        c1.t = len;
        gate_data one = make_data(rng, c1);
        memcpy(one.x.data, (uint16_t *)g.x.data + (int64_t)first * c.h, (size_t)len * c.h * 2);
        memcpy(one.w.data, g.w.data, (size_t)c.e * c.h * 2);
        memcpy(one.bias.data, g.bias.data, (size_t)c.e * 4);
        TU_CHECK_OK(run(&one));
        const int n = slots(&c);
        /* the token index enters the replica choice, so compare the unmapped experts and weights */
        TU_CHECK(memcmp(one.wt.data, (float *)g.wt.data + (int64_t)first * n, (size_t)len * n * 4) == 0,
                 "batch invariance: weights of the last %d tokens", len);
        TU_CHECK(memcmp(one.unmapped.data, (int64_t *)g.unmapped.data + (int64_t)first * c.k, (size_t)len * c.k * 8) == 0,
                 "batch invariance: experts of the last %d tokens", len);
        free_data(&one);
    }
    free_data(&g);
}

/* x = weight = 0 with identity scoring: every rank ties, so the K lowest experts in order. */
static void check_ties(tu_rng *rng) {
    gate_case c = {.t = 8, .h = 256, .e = 128, .k = 8};
    gate_data g = make_data(rng, c);
    memset(g.x.data, 0, (size_t)c.t * c.h * 2);
    memset(g.w.data, 0, (size_t)c.e * c.h * 2);
    for (int backend = 0; backend < 2; ++backend) {
        TU_CHECK_OK(dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO));
        TU_CHECK_OK(run(&g));
        for (int i = 0; i < c.t * c.k; ++i) {
            TU_CHECK(((int64_t *)g.idx.data)[i] == i % c.k, "ties: slot %d holds %lld", i,
                     (long long)((int64_t *)g.idx.data)[i]);
            /* all scores 0: 0 / (0 + 1e-20) * 1.5 = 0 */
            TU_CHECK(((float *)g.wt.data)[i] == 0.0f, "ties: weight %d", i);
        }
    }
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    free_data(&g);
}

/* Huge biases decide the ranking (DeepGEMM's test: bias 1e8, image_bias -1e8), and the weights
 * still come from the unbiased scores. */
static void check_bias_dominates(tu_rng *rng) {
    gate_case c = {.t = 16, .h = 256, .e = 32, .k = 4, .scoring = "sigmoid", .bias = 1, .image = 1};
    gate_data g = make_data(rng, c);
    for (int e = 0; e < c.e; ++e) {
        ((float *)g.bias.data)[e] = e == 5 || e == 9 || e == 17 || e == 30 ? 1e8f : 0.0f;
        ((float *)g.image_bias.data)[e] = e < 4 ? 0.0f : -1e8f;
    }
    TU_CHECK_OK(run(&g));
    for (int i = 0; i < c.t; ++i) {
        const int64_t *idx = (int64_t *)g.idx.data + i * c.k;
        int got[32] = {0};
        for (int j = 0; j < c.k; ++j)
            got[idx[j]] = 1;
        const int image = ((uint8_t *)g.image_mask.data)[i] != 0;
        TU_CHECK(image ? got[0] && got[1] && got[2] && got[3] : got[5] && got[9] && got[17] && got[30],
                 "bias decides token %d", i);
        check_token64(&g, i);
    }
    free_data(&g);
}

/* ---- bad arguments --------------------------------------------------------------------------- */

#define CHECK_BAD(call, want, argname)                                                                   \
    do {                                                                                                 \
        gate_result before_ = snapshot(&g);                                                              \
        TU_CHECK_STATUS(call, want);                                                                     \
        TU_CHECK(strstr(dg_last_error(), argname) != NULL, "message names '%s': %s", argname, dg_last_error()); \
        TU_CHECK(same(&g, &before_), "a failed call wrote its outputs (%s)", argname);                  \
        free_result(&before_);                                                                           \
    } while (0)

/* The call of `g` with one argument replaced (NULL pointers in the replacement table mean "keep"). */
typedef struct gate_call {
    const dg_tensor *x, *w, *mask, *bias, *image_bias, *image_mask, *fix, *map, *count, *unmapped, *random, *idx, *wt;
    int k, use_shared, shared, ep_rank;
    float scale;
    const char *scoring;
} gate_call;

static gate_call base_call(gate_data *g) {
    gate_call k = {&g->x, &g->w, opt(&g->mask), opt(&g->bias), opt(&g->image_bias), opt(&g->image_mask),
                   opt(&g->fix), opt(&g->map), opt(&g->count), opt(&g->unmapped), opt(&g->random), &g->idx, &g->wt,
                   g->c.k, g->c.shared > 0, g->c.shared > 0 ? g->c.shared : 1, g->c.ep_rank, 1.5f, "sqrtsoftplus"};
    return k;
}

static dg_status call(const gate_call *k) {
    return dg_bf16_mega_gate(k->x, k->w, k->k, k->use_shared, k->shared, k->scale, k->ep_rank, k->scoring, k->mask,
                             k->bias, k->image_bias, k->image_mask, k->fix, k->map, k->count, k->unmapped, k->random,
                             k->idx, k->wt);
}

static void check_bad_args(tu_rng *rng) {
    gate_case c = {.t = 4, .h = 256, .e = 16, .k = 4, .shared = 2, .bias = 1, .image = 1, .mask = 1, .map = 1,
                   .fix = 1, .random = 1, .unmapped = 1};
    gate_data g = make_data(rng, c);
    memcpy(g.unmapped.data, g.unmapped_init, (size_t)c.t * c.k * 8);
    gate_call k;
    dg_tensor bad;
    const int64_t t1[1] = {c.t};
    dg_tensor other = tu_alloc2(DG_BFLOAT16, c.e, 512), f32x = tu_alloc2(DG_FLOAT32, c.t, c.h);
    dg_tensor u8e = tu_alloc(DG_UINT8, 1, (const int64_t[]){c.e}), f32t = tu_alloc(DG_FLOAT32, 1, t1);
    for (int backend = 0; backend < 2; ++backend) {
        TU_CHECK_OK(dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO));
        k = base_call(&g); k.x = NULL; CHECK_BAD(call(&k), DG_ERR_NULL_POINTER, "'x'");
        k = base_call(&g); k.x = &f32x; CHECK_BAD(call(&k), DG_ERR_DTYPE, "'x'");
        k = base_call(&g); k.w = NULL; CHECK_BAD(call(&k), DG_ERR_NULL_POINTER, "'weight'");
        k = base_call(&g); k.w = &other; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'weight'");
        bad = dg_tensor_transpose(g.x, 0, 1); bad = dg_tensor_transpose(bad, 0, 1); bad.strides[0] = c.h + 1;
        bad.shape[0] = c.t - 1;
        k = base_call(&g); k.x = &bad; CHECK_BAD(call(&k), DG_ERR_LAYOUT, "'x'");
        bad = g.x; bad.shape[1] = 128; bad.strides[0] = 128;
        dg_tensor w128 = g.w; w128.shape[1] = 128; w128.strides[0] = 128;
        k = base_call(&g); k.x = &bad; k.w = &w128; CHECK_BAD(call(&k), DG_ERR_SHAPE, "hidden");
        k = base_call(&g); k.x = &bad; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'weight'");
        dg_tensor w18 = dg_tensor_2d(other.data, DG_BFLOAT16, 18, c.h); /* E % 4 != 0 */
        k = base_call(&g); k.w = &w18; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'weight'");
        k = base_call(&g); k.k = 0; CHECK_BAD(call(&k), DG_ERR_VALUE, "'num_topk'");
        k = base_call(&g); k.k = 33; CHECK_BAD(call(&k), DG_ERR_VALUE, "'num_topk'");
        k = base_call(&g); k.ep_rank = -1; CHECK_BAD(call(&k), DG_ERR_VALUE, "'ep_rank'");
        k = base_call(&g); k.scale = INFINITY; CHECK_BAD(call(&k), DG_ERR_VALUE, "'routed_scaling_factor'");
        k = base_call(&g); k.scale = NAN; CHECK_BAD(call(&k), DG_ERR_VALUE, "'routed_scaling_factor'");
        k = base_call(&g); k.shared = 3; CHECK_BAD(call(&k), DG_ERR_VALUE, "'num_shared_experts'");
        k = base_call(&g); k.k = 3; CHECK_BAD(call(&k), DG_ERR_VALUE, "'num_topk'"); /* 3 % 2 */
        k = base_call(&g); k.k = 6; CHECK_BAD(call(&k), DG_ERR_VALUE, "'num_shared_experts'"); /* 16 % 3 */
        k = base_call(&g); k.scoring = "softmax"; CHECK_BAD(call(&k), DG_ERR_VALUE, "'scoring_func'");
        k = base_call(&g); k.mask = &f32t; CHECK_BAD(call(&k), DG_ERR_DTYPE, "'mask'");
        k = base_call(&g); k.mask = &u8e; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'mask'");
        k = base_call(&g); k.bias = &f32t; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'bias'");
        k = base_call(&g); k.bias = &u8e; CHECK_BAD(call(&k), DG_ERR_DTYPE, "'bias'");
        k = base_call(&g); k.image_bias = NULL; CHECK_BAD(call(&k), DG_ERR_VALUE, "'image_bias'");
        k = base_call(&g); k.image_bias = &f32t; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'image_bias'");
        k = base_call(&g); k.image_mask = &u8e; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'image_token_mask'");
        k = base_call(&g); k.count = NULL; CHECK_BAD(call(&k), DG_ERR_VALUE, "'logical_count'");
        bad = g.map; bad.shape[0] = c.e;
        k = base_call(&g); k.map = &bad; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'to_physical_map'");
        bad = g.map; bad.dtype = DG_FLOAT32;
        k = base_call(&g); k.map = &bad; CHECK_BAD(call(&k), DG_ERR_DTYPE, "'to_physical_map'");
        bad = g.count; bad.shape[0] = c.e;
        k = base_call(&g); k.count = &bad; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'logical_count'");
        k = base_call(&g); k.unmapped = NULL; CHECK_BAD(call(&k), DG_ERR_VALUE, "'fix_routing_mask'");
        bad = g.unmapped; bad.strides[1] = 2; bad.strides[0] = 2 * c.k;
        k = base_call(&g); k.unmapped = &bad; CHECK_BAD(call(&k), DG_ERR_LAYOUT, "'unmapped_topk_idx'");
        bad = g.unmapped; bad.shape[1] = c.k + 1;
        k = base_call(&g); k.unmapped = &bad; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'unmapped_topk_idx'");
        k = base_call(&g); k.fix = &u8e; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'fix_routing_mask'");
        k = base_call(&g); k.random = &f32t; CHECK_BAD(call(&k), DG_ERR_DTYPE, "'force_random'");
        k = base_call(&g); k.idx = NULL; CHECK_BAD(call(&k), DG_ERR_NULL_POINTER, "'topk_idx'");
        bad = g.idx; bad.shape[1] = c.k; bad.strides[0] = c.k;
        k = base_call(&g); k.idx = &bad; CHECK_BAD(call(&k), DG_ERR_SHAPE, "'topk_idx'");
        bad = g.wt; bad.dtype = DG_INT32;
        k = base_call(&g); k.wt = &bad; CHECK_BAD(call(&k), DG_ERR_DTYPE, "'topk_weights'");
        bad = g.wt; bad.strides[0] = 0;
        k = base_call(&g); k.wt = &bad; CHECK_BAD(call(&k), DG_ERR_LAYOUT, "'topk_weights'");
        /* overlapping outputs and inputs */
        bad = dg_tensor_2d(g.unmapped.data, DG_INT64, c.t, c.k + c.shared);
        k = base_call(&g); k.idx = &bad; CHECK_BAD(call(&k), DG_ERR_LAYOUT, "'topk_idx'");
        bad = dg_tensor_2d(g.x.data, DG_FLOAT32, c.t, c.k + c.shared);
        k = base_call(&g); k.wt = &bad; CHECK_BAD(call(&k), DG_ERR_LAYOUT, "'topk_weights'");
        /* contents */
        int32_t *cnt = g.count.data;
        const int32_t saved = cnt[3];
        cnt[3] = 0;
        k = base_call(&g); CHECK_BAD(call(&k), DG_ERR_VALUE, "'logical_count'");
        cnt[3] = 34;
        k = base_call(&g); CHECK_BAD(call(&k), DG_ERR_VALUE, "'logical_count'");
        cnt[3] = saved;
        uint8_t *m = g.mask.data, *fx = g.fix.data, *rnd = g.random.data;
        m[1] = 1, fx[1] = 1, rnd[1] = 0;
        int64_t *u = g.unmapped.data;
        const int64_t saved_u = u[1 * c.k + 2];
        u[1 * c.k + 2] = c.e;
        k = base_call(&g); CHECK_BAD(call(&k), DG_ERR_VALUE, "'unmapped_topk_idx'");
        u[1 * c.k + 2] = -1;
        k = base_call(&g); CHECK_BAD(call(&k), DG_ERR_VALUE, "'unmapped_topk_idx'");
        u[1 * c.k + 2] = saved_u;
        rnd[1] = 0;
        k = base_call(&g); TU_CHECK_OK(call(&k));
        memcpy(g.unmapped.data, g.unmapped_init, (size_t)c.t * c.k * 8);
    }
    /* More than 2^20 tokens (no element is read: the check comes first). */
    bad = g.x; bad.shape[0] = ((int64_t)1 << 20) + 1;
    dg_tensor big_idx = g.idx, big_wt = g.wt;
    big_idx.shape[0] = big_wt.shape[0] = bad.shape[0];
    k = base_call(&g); k.x = &bad; k.idx = &big_idx; k.wt = &big_wt; k.mask = k.image_mask = k.fix = k.random = NULL;
    k.image_bias = NULL; k.unmapped = NULL;
    gate_result before = snapshot(&g);
    TU_CHECK_STATUS(call(&k), DG_ERR_SHAPE);
    TU_CHECK(strstr(dg_last_error(), "2^20") != NULL, "names the token limit: %s", dg_last_error());
    free_result(&before);
    /* T = 0 does nothing and succeeds */
    bad = g.x; bad.shape[0] = 0;
    big_idx = g.idx; big_wt = g.wt; big_idx.shape[0] = big_wt.shape[0] = 0;
    k.x = &bad; k.idx = &big_idx; k.wt = &big_wt;
    TU_CHECK_OK(call(&k));
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    tu_free(&other); tu_free(&f32x); tu_free(&u8e); tu_free(&f32t);
    free_data(&g);
}

static void check_config(void) {
    dg_mega_gate_config cfg;
    const int old = dg_get_num_sms();
    TU_CHECK_OK(dg_set_num_sms(3));
    TU_CHECK_OK(dg_get_bf16_mega_gate_config(16, 4096, 256, 6, &cfg));
    TU_CHECK(cfg.num_split_k == 1 && cfg.num_mma_ctas == 1 && cfg.num_expert_groups == 1, "config constants");
    TU_CHECK(cfg.block_tokens == 16 && cfg.num_gate_warpgroups == 3 && cfg.num_sms == 3, "config 16 tokens: %d %d %d",
             cfg.block_tokens, cfg.num_gate_warpgroups, cfg.num_sms);
    TU_CHECK_OK(dg_get_bf16_mega_gate_config(1, 7168, 256, 8, &cfg));
    TU_CHECK(cfg.block_tokens == 1 && cfg.num_gate_warpgroups == 1, "config 1 token");
    TU_CHECK_OK(dg_get_bf16_mega_gate_config(5000, 7168, 256, 8, &cfg));
    TU_CHECK(cfg.block_tokens == 1024, "config 5000 tokens: %d", cfg.block_tokens);
    dg_use_deterministic_algorithms(1);
    TU_CHECK_OK(dg_get_bf16_mega_gate_config(16, 4096, 256, 6, &cfg));
    TU_CHECK(cfg.num_split_k == 1, "deterministic: no split K");
    dg_use_deterministic_algorithms(0);
    TU_CHECK_OK(dg_set_num_sms(old));
    TU_CHECK_STATUS(dg_get_bf16_mega_gate_config(0, 4096, 256, 6, &cfg), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'num_tokens'") != NULL, "%s", dg_last_error());
    TU_CHECK_STATUS(dg_get_bf16_mega_gate_config(16, 4000, 256, 6, &cfg), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'hidden'") != NULL, "%s", dg_last_error());
    TU_CHECK_STATUS(dg_get_bf16_mega_gate_config(16, 4096, 514, 6, &cfg), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'num_routed_experts'") != NULL, "%s", dg_last_error());
    TU_CHECK_STATUS(dg_get_bf16_mega_gate_config(16, 4096, 256, 33, &cfg), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'num_topk'") != NULL, "%s", dg_last_error());
    TU_CHECK_STATUS(dg_get_bf16_mega_gate_config(16, 4096, 256, 6, NULL), DG_ERR_NULL_POINTER);
}

/* Each allocation of a call failing in turn: DG_ERR_ALLOC with nothing written, or success. */
static void check_alloc_failure(tu_rng *rng) {
    gate_case c = {.t = 70, .h = 512, .e = 64, .k = 8, .scoring = "sigmoid", .bias = 1};
    gate_data g = make_data(rng, c);
    int failures = 0;
    for (long n = 1; n <= 6; ++n) {
        tu_fill_bytes(&g.idx, 0x5A);
        tu_fill_bytes(&g.wt, 0x5A);
        gate_result before = snapshot(&g);
        dg_alloc_fail_nth(n);
        const dg_status st = dg_bf16_mega_gate(&g.x, &g.w, c.k, 0, 1, 1.5f, 0, c.scoring, NULL, &g.bias, NULL, NULL,
                                               NULL, NULL, NULL, NULL, NULL, &g.idx, &g.wt);
        const bool pending = dg_alloc_fail_pending();
        dg_alloc_fail_nth(0);
        if (st == DG_ERR_ALLOC) {
            ++failures;
            TU_CHECK(same(&g, &before), "allocation %ld failed and outputs were written", n);
        } else {
            TU_CHECK(st == DG_OK && pending, "allocation %ld: %s", n, dg_status_string(st));
        }
        free_result(&before);
    }
    TU_CHECK(failures >= 1, "the logits scratch is allocated");
    free_data(&g);
}

int main(void) {
    tu_rng rng = {2024};
    static const gate_case cases[] = {
        /* t, h, e, k, shared, scoring, bias, image, mask, map, fix, random, unmapped, ep_rank */
        {1, 256, 12, 1, 0, NULL, 0, 0, 0, 0, 0, 0, 0, 0},
        {1, 256, 12, 6, 2, "sigmoid", 1, 0, 0, 0, 0, 0, 1, 0},
        {3, 512, 260, 5, 1, "sqrtsoftplus", 1, 0, 0, 1, 0, 0, 0, 3},
        {17, 256, 36, 8, 0, "sqrtsoftplus", 0, 0, 1, 0, 0, 0, 1, 0},
        {17, 256, 36, 8, 0, "sigmoid", 0, 1, 1, 0, 0, 0, 1, 1},
        {9, 256, 20, 4, 2, "identity", 1, 0, 0, 0, 0, 0, 0, 0},
        {33, 256, 64, 8, 2, "sqrtsoftplus", 1, 1, 1, 1, 1, 1, 1, 5},
        {40, 768, 128, 32, 0, "sigmoid", 1, 0, 0, 0, 1, 1, 1, 0},
        {4, 7168, 256, 8, 0, "sqrtsoftplus", 1, 0, 0, 0, 0, 0, 0, 0}, /* DeepSeek V3's router */
        {1100, 256, 12, 6, 2, "sqrtsoftplus", 1, 0, 1, 1, 0, 0, 1, 2}, /* two chunks */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        check_case(&rng, cases[i]);
    check_batch_invariance(&rng);
    check_ties(&rng);
    check_bias_dominates(&rng);
    check_bad_args(&rng);
    check_config();
    check_alloc_failure(&rng);
    return tu_finish();
}
