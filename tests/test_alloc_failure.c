/*
 * test_alloc_failure.c - every entry point survives running out of memory.
 *
 * The library's allocations all go through dg_malloc / dg_aligned_alloc (src/core/alloc.c),
 * which has a test-only switch: dg_alloc_fail_nth(n) makes the nth allocation from now fail.
 * For each call below the test first runs it normally (the expected output bits), then again
 * with n = 1, 2, ... until a run makes fewer than n allocations. Every failing run must return
 * DG_ERR_ALLOC with a message and leave every output byte as it was (the outputs are filled with
 * a sentinel first), or, where a path has a fallback that needs no allocation, succeed with the
 * expected bits. Grouped calls are included: they allocate all they need before writing any
 * group, so a failed grouped call has written nothing either. Leaks are what the sanitizer job
 * (build-san, LeakSanitizer) reports for this program.
 *
 * The whole run repeats with the reference backend, whose oracle code allocates as well.
 */
#include "core/internal.h"
#include "engine/engine.h"
#include "kernels/hc_prenorm_kernels.h"
#include "test_gemm_grouped_common.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#define SENTINEL 0x5a
#define MAX_OUTS 4

typedef dg_status (*call_fn)(void *ctx);

typedef struct fault_case {
    const char *name;
    call_fn call;
    void *ctx;
    dg_tensor *outs[MAX_OUTS]; /* every tensor the call may write (contiguous) */
    int partial;               /* grouped: a failed call may have written finished work items */
} fault_case;

static int g_reference; /* the reference backend is selected */

/* The call, with the pooled scratch memory freed first, so that every run allocates it afresh. */
static dg_status call_fresh(const fault_case *c) {
    dg_ws_release_idle();
    dg_hc_release_scratch();
    return c->call(c->ctx);
}

static void fill_outs(const fault_case *c) {
    for (int i = 0; i < MAX_OUTS && c->outs[i]; ++i)
        tu_fill_bytes(c->outs[i], SENTINEL);
}

static void snap_outs(const fault_case *c, void **snaps) {
    for (int i = 0; i < MAX_OUTS; ++i)
        snaps[i] = c->outs[i] ? tu_snapshot(c->outs[i]) : NULL;
}

static int outs_equal(const fault_case *c, void *const *snaps) {
    for (int i = 0; i < MAX_OUTS && c->outs[i]; ++i)
        if (!tu_unchanged(c->outs[i], snaps[i]))
            return 0;
    return 1;
}

/* Every element either still holds the sentinel or its final value (same bytes as expected). */
static int outs_each_untouched_or_final(const fault_case *c, void *const *sentinel, void *const *expected) {
    for (int i = 0; i < MAX_OUTS && c->outs[i]; ++i) {
        const size_t es = dg_dtype_size(c->outs[i]->dtype), n = (size_t)dg_tensor_numel(c->outs[i]);
        const unsigned char *now = c->outs[i]->data, *sen = sentinel[i], *fin = expected[i];
        for (size_t e = 0; e < n; ++e)
            if (memcmp(now + e * es, sen + e * es, es) && memcmp(now + e * es, fin + e * es, es))
                return 0;
    }
    return 1;
}

static void free_snaps(void **snaps) {
    for (int i = 0; i < MAX_OUTS; ++i)
        free(snaps[i]);
}

static int g_cases_with_allocs; /* cases whose calls allocate (the others test nothing here) */
static long g_alloc_errors;     /* injected failures answered with DG_ERR_ALLOC */

static void run_case(const fault_case *c) {
    void *expected[MAX_OUTS], *sentinel[MAX_OUTS];
    fill_outs(c);
    snap_outs(c, sentinel);
    dg_alloc_fail_nth(0);
    dg_status s = call_fresh(c);
    TU_CHECK(s == DG_OK, "%s: the unfaulted call failed: %s (%s)", c->name, dg_status_string(s), dg_last_error());
    snap_outs(c, expected);
    long n = 1, failed = 0;
    for (; n < 100000; ++n) {
        fill_outs(c);
        dg_alloc_fail_nth(n);
        s = call_fresh(c);
        const int fired = !dg_alloc_fail_pending();
        dg_alloc_fail_nth(0);
        if (!fired) { /* the call made fewer than n allocations: a normal run */
            TU_CHECK(s == DG_OK && outs_equal(c, expected), "%s: run with %ld allocations: %s", c->name, n - 1,
                     dg_status_string(s));
            break;
        }
        if (s == DG_ERR_ALLOC) {
            ++failed;
            if (c->partial)
                TU_CHECK(outs_each_untouched_or_final(c, sentinel, expected),
                         "%s: allocation %ld failed and an output element holds neither the sentinel nor its "
                         "final value", c->name, n);
            else
                TU_CHECK(outs_equal(c, sentinel), "%s: allocation %ld failed and the outputs were written", c->name,
                         n);
            TU_CHECK(dg_last_error()[0] != '\0', "%s: allocation %ld failed without a message", c->name, n);
        } else {
            TU_CHECK(s == DG_OK && outs_equal(c, expected),
                     "%s: allocation %ld failed: got %s (%s), want DG_ERR_ALLOC or the normal result", c->name, n,
                     dg_status_string(s), dg_last_error());
        }
    }
    /* a path may also recover from a failed allocation (fp4 small M, HC prenorm's scratch): checked above */
    g_alloc_errors += failed;
    g_cases_with_allocs += n > 1;
    printf("  %-40s %ld allocation points, %ld gave DG_ERR_ALLOC\n", c->name, n - 1, failed);
    free_snaps(expected);
    free_snaps(sentinel);
}

/* ---- dense GEMMs ------------------------------------------------------------------------------ */

typedef struct gemm_ctx {
    int kind; /* 0 BF16, 1 FP8 1D2D, 2 FP8 x FP4, 3 FP4 x FP4, 4 tn BF16 */
    int packed;
    tq a, b;
    dg_tensor at, bt, d; /* at, bt: A and B stored K-outer (kind 4) */
    dg_gemm_options o;
} gemm_ctx;

static dg_status call_gemm(void *p) {
    gemm_ctx *g = p;
    if (g->packed) {
        dg_packed_b *pb = NULL;
        dg_status s = dg_pack_b(&g->b.data, g->kind ? &g->b.sf : NULL, &g->o, &pb);
        if (s != DG_OK)
            return s;
        s = g->kind ? dg_fp8_fp4_gemm_nt_packed(&g->a.data, &g->a.sf, pb, &g->d, NULL, &g->o)
                    : dg_bf16_gemm_nt_packed(&g->a.data, pb, &g->d, NULL);
        dg_packed_b_free(pb);
        return s;
    }
    switch (g->kind) {
    case 0: return dg_bf16_gemm_nt(&g->a.data, &g->b.data, &g->d, NULL);
    case 1: return dg_fp8_gemm_nt(&g->a.data, &g->a.sf, &g->b.data, &g->b.sf, &g->d, NULL, &g->o);
    case 4: return dg_bf16_gemm_tn(&g->at, &g->bt, &g->d, NULL);
    default: return dg_fp8_fp4_gemm_nt(&g->a.data, &g->a.sf, &g->b.data, &g->b.sf, &g->d, NULL, &g->o);
    }
}

static void make_gemm(gemm_ctx *g, tu_rng *r, int kind, int packed, int64_t m, int64_t n, int64_t k) {
    memset(g, 0, sizeof *g);
    g->kind = kind;
    g->packed = packed;
    g->o = dg_gemm_options_default();
    static const tq_kind ka[5] = {TQ_BF16, TQ_FP8_F32, TQ_FP8_UE8M0, TQ_FP4_UE8M0, TQ_BF16};
    static const tq_kind kb[5] = {TQ_BF16, TQ_FP8_F32, TQ_FP4_UE8M0, TQ_FP4_UE8M0, TQ_BF16};
    static const int gka[5] = {1, 128, 128, 32, 1}, gkb[5] = {1, 128, 32, 32, 1}, gnb[5] = {1, 128, 1, 1, 1};
    g->a = tq_make(r, ka[kind], 0, 1, m, k, 1, gka[kind]);
    g->b = tq_make(r, kb[kind], 0, 1, n, k, gnb[kind], gkb[kind]);
    if (kind >= 2 && kind <= 3) {
        g->o.recipe_a[0] = 1, g->o.recipe_a[1] = gka[kind];
        g->o.recipe_b[0] = 1, g->o.recipe_b[1] = gkb[kind];
    }
    if (kind == 4) { /* A stored [K, M], B [K, N] */
        g->at = tu_alloc2(DG_BFLOAT16, k, m);
        g->bt = tu_alloc2(DG_BFLOAT16, k, n);
        for (int64_t j = 0; j < k; ++j) {
            for (int64_t i = 0; i < m; ++i)
                ((uint16_t *)g->at.data)[j * m + i] = ((uint16_t *)g->a.data.data)[i * k + j];
            for (int64_t i = 0; i < n; ++i)
                ((uint16_t *)g->bt.data)[j * n + i] = ((uint16_t *)g->b.data.data)[i * k + j];
        }
    }
    g->d = tu_alloc2(DG_BFLOAT16, m, n);
}

static void free_gemm(gemm_ctx *g) {
    tq_free(&g->a);
    tq_free(&g->b);
    if (g->at.data)
        tu_free(&g->at), tu_free(&g->bt);
    tu_free(&g->d);
}

static void test_dense(tu_rng *r) {
    static const char *names[5] = {"bf16_gemm_nt", "fp8_gemm_nt 1d2d", "fp8_fp4_gemm_nt", "fp4_gemm_nt",
                                   "bf16_gemm_tn"};
    static const int64_t ms[3] = {1, 37, 200};
    char name[96];
    for (int kind = 0; kind < 5; ++kind)
        for (int packed = 0; packed < 2; ++packed) {
            if (packed && (kind == 1 || kind == 4 || g_reference)) /* BF16 and FP4 weights; engine only */
                continue;
            for (int mi = 0; mi < 3; ++mi) {
                gemm_ctx g;
                make_gemm(&g, r, kind, packed, ms[mi], 72, 256);
                snprintf(name, sizeof name, "%s%s m%lld", names[kind], packed ? " packed" : "", (long long)ms[mi]);
                fault_case c = {name, call_gemm, &g, {&g.d}, 0};
                run_case(&c);
                free_gemm(&g);
            }
        }
}

/* ---- grouped GEMMs ---------------------------------------------------------------------------- */

typedef struct grouped_ctx {
    int form; /* 0 contiguous, 1 masked, 2 masked pre-packed, 3 k-grouped BF16 tn */
    int fp8;
    tq a, b;
    dg_tensor d, layout, at, bt;
    int ks[3];
    dg_gemm_options o;
} grouped_ctx;

static dg_status call_grouped(void *p) {
    grouped_ctx *g = p;
    const dg_tensor *sfa = g->fp8 ? &g->a.sf : NULL, *sfb = g->fp8 ? &g->b.sf : NULL;
    switch (g->form) {
    case 0:
        return g->fp8 ? dg_m_grouped_fp8_gemm_nt_contiguous(&g->a.data, sfa, &g->b.data, sfb, &g->d, &g->layout, &g->o)
                      : dg_m_grouped_bf16_gemm_nt_contiguous(&g->a.data, &g->b.data, &g->d, &g->layout, &g->o);
    case 1:
        return g->fp8 ? dg_m_grouped_fp8_gemm_nt_masked(&g->a.data, sfa, &g->b.data, sfb, &g->d, &g->layout, 8, &g->o)
                      : dg_m_grouped_bf16_gemm_nt_masked(&g->a.data, &g->b.data, &g->d, &g->layout, 8, &g->o);
    case 2: {
        dg_packed_b *pb = NULL;
        dg_status s = dg_pack_b_grouped(&g->b.data, NULL, &g->o, &pb);
        if (s != DG_OK)
            return s;
        s = dg_m_grouped_bf16_gemm_nt_masked_packed(&g->a.data, pb, &g->d, &g->layout, 8, &g->o);
        dg_packed_b_free(pb);
        return s;
    }
    default: return dg_k_grouped_bf16_gemm_tn_contiguous(&g->at, &g->bt, &g->d, g->ks, 3, &g->layout, NULL, &g->o);
    }
}

static void test_grouped(tu_rng *r) {
    static const char *names[4] = {"m_grouped contiguous", "m_grouped masked", "m_grouped masked packed",
                                   "k_grouped bf16 tn"};
    char name[96];
    for (int form = 0; form < 4; ++form)
        for (int fp8 = 0; fp8 < 2; ++fp8) {
            if ((fp8 && form >= 2) || (form == 2 && g_reference))
                continue;
            grouped_ctx g;
            memset(&g, 0, sizeof g);
            g.form = form;
            g.fp8 = fp8;
            g.o = dg_gemm_options_default();
            const tq_kind kind = fp8 ? TQ_FP8_F32 : TQ_BF16;
            const int gk = fp8 ? 128 : 1, G = 3;
            const int64_t N = 40, K = 256, align = dg_get_mk_alignment_for_contiguous_layout();
            if (form == 0) { /* groups of 5, 0 and 9 rows, each padded to the alignment */
                const int rows[3] = {5, 0, 9};
                const int64_t M = 2 * align;
                g.a = tq_make(r, kind, 0, 1, M, K, 1, gk);
                g.b = tq_make(r, kind, 1, G, N, K, gk, gk);
                g.layout = tu_alloc(DG_INT32, 1, (int64_t[]){M});
                for (int64_t i = 0; i < M; ++i)
                    ((int32_t *)g.layout.data)[i] = -1;
                for (int64_t i = 0; i < rows[0]; ++i)
                    ((int32_t *)g.layout.data)[i] = 0;
                for (int64_t i = 0; i < rows[2]; ++i)
                    ((int32_t *)g.layout.data)[align + i] = 2;
                g.d = tu_alloc2(DG_BFLOAT16, M, N);
            } else if (form <= 2) { /* masked: 3, 0 and 8 rows of 8 */
                g.a = tq_make(r, kind, 1, G, 8, K, 1, gk);
                g.b = tq_make(r, kind, 1, G, N, K, gk, gk);
                g.layout = tu_alloc(DG_INT32, 1, (int64_t[]){G});
                const int32_t masked[3] = {3, 0, 8};
                memcpy(g.layout.data, masked, sizeof masked);
                g.d = tu_alloc3(DG_BFLOAT16, G, 8, N);
            } else { /* k-grouped: K sizes 128, 0, 256; a [sum K, M], b [sum K, N], d FLOAT32 [G, M, N] */
                const int ks[3] = {128, 0, 256};
                memcpy(g.ks, ks, sizeof ks);
                const int64_t M = 24, SK = 384;
                g.at = tu_alloc2(DG_BFLOAT16, SK, M);
                g.bt = tu_alloc2(DG_BFLOAT16, SK, N);
                for (int64_t i = 0; i < SK * M; ++i)
                    ((uint16_t *)g.at.data)[i] = dg_float_to_bf16((float)tu_normal(r));
                for (int64_t i = 0; i < SK * N; ++i)
                    ((uint16_t *)g.bt.data)[i] = dg_float_to_bf16((float)tu_normal(r));
                g.layout = tu_alloc(DG_INT32, 1, (int64_t[]){G});
                memcpy(g.layout.data, ks, sizeof ks);
                g.d = tu_alloc3(DG_FLOAT32, G, M, N);
            }
            snprintf(name, sizeof name, "%s %s", names[form], fp8 ? "fp8" : "bf16");
            fault_case c = {name, call_grouped, &g, {&g.d}, 1};
            run_case(&c);
            if (g.a.orig)
                tq_free(&g.a), tq_free(&g.b);
            if (g.at.data)
                tu_free(&g.at), tu_free(&g.bt);
            tu_free(&g.layout);
            tu_free(&g.d);
        }
}

/* ---- MQA logits, HC prenorm, einsum, casts ------------------------------------------------- */

typedef struct misc_ctx {
    dg_tensor t[8];
    int splits;
} misc_ctx;

static void fill_random(tu_rng *r, dg_tensor *t) {
    const int64_t n = dg_tensor_numel(t);
    for (int64_t i = 0; i < n; ++i) {
        const float x = (float)tu_normal(r);
        switch (t->dtype) {
        case DG_BFLOAT16: ((uint16_t *)t->data)[i] = dg_float_to_bf16(x); break;
        case DG_FLOAT32: ((float *)t->data)[i] = x; break;
        case DG_FLOAT8_E4M3: ((uint8_t *)t->data)[i] = dg_float_to_e4m3(x); break;
        default: break;
        }
    }
}

static dg_status call_mqa(void *p) {
    misc_ctx *m = p; /* q, kv, kv_sf, weights, ks, ke, logits */
    return dg_fp8_mqa_logits(&m->t[0], &m->t[1], &m->t[2], &m->t[3], &m->t[4], &m->t[5], 1, 0, &m->t[6]);
}

static void test_mqa(tu_rng *r) {
    const int64_t S = 5, H = 4, D = 64, SK = 300;
    misc_ctx m;
    memset(&m, 0, sizeof m);
    m.t[0] = tu_alloc3(DG_FLOAT8_E4M3, S, H, D);
    m.t[1] = tu_alloc2(DG_FLOAT8_E4M3, SK, D);
    m.t[2] = tu_alloc(DG_FLOAT32, 1, (int64_t[]){SK});
    m.t[3] = tu_alloc2(DG_FLOAT32, S, H);
    m.t[4] = tu_alloc(DG_INT32, 1, (int64_t[]){S});
    m.t[5] = tu_alloc(DG_INT32, 1, (int64_t[]){S});
    m.t[6] = tu_alloc2(DG_FLOAT32, S, SK);
    for (int i = 0; i < 4; ++i)
        fill_random(r, &m.t[i]);
    for (int64_t i = 0; i < SK; ++i)
        ((float *)m.t[2].data)[i] = 0.5f + (float)tu_uniform(r);
    for (int64_t i = 0; i < S; ++i) {
        ((int32_t *)m.t[4].data)[i] = (int32_t)(7 * i);
        ((int32_t *)m.t[5].data)[i] = (int32_t)(SK - 11 * i);
    }
    fault_case c = {"fp8_mqa_logits", call_mqa, &m, {&m.t[6]}, 0};
    run_case(&c);
    for (int i = 0; i < 7; ++i)
        tu_free(&m.t[i]);
}

static dg_status call_hc(void *p) {
    misc_ctx *m = p;
    return dg_tf32_hc_prenorm_gemm(&m->t[0], &m->t[1], &m->t[2], &m->t[3], m->splits);
}

static void test_hc(tu_rng *r) {
    const int64_t M = 19, N = 24, K = 700;
    for (int splits = 0; splits <= 3; splits += 3) {
        misc_ctx m;
        memset(&m, 0, sizeof m);
        m.splits = splits;
        m.t[0] = tu_alloc2(DG_BFLOAT16, M, K);
        m.t[1] = tu_alloc2(DG_FLOAT32, N, K);
        m.t[2] = splits ? tu_alloc3(DG_FLOAT32, splits, M, N) : tu_alloc2(DG_FLOAT32, M, N);
        m.t[3] = splits ? tu_alloc2(DG_FLOAT32, splits, M) : tu_alloc(DG_FLOAT32, 1, (int64_t[]){M});
        fill_random(r, &m.t[0]);
        fill_random(r, &m.t[1]);
        fault_case c = {splits ? "tf32_hc_prenorm_gemm splits 3" : "tf32_hc_prenorm_gemm", call_hc, &m,
                        {&m.t[2], &m.t[3]}, 0};
        run_case(&c);
        for (int i = 0; i < 4; ++i)
            tu_free(&m.t[i]);
    }
}

static dg_status call_einsum(void *p) {
    misc_ctx *m = p;
    return dg_einsum("bhr,hdr->bhd", &m->t[0], &m->t[1], &m->t[2], NULL);
}

static void test_einsum(tu_rng *r) {
    const int64_t B = 3, H = 2, R = 160, D = 40;
    misc_ctx m;
    memset(&m, 0, sizeof m);
    m.t[0] = tu_alloc3(DG_BFLOAT16, B, H, R);
    m.t[1] = tu_alloc3(DG_BFLOAT16, H, D, R);
    m.t[2] = tu_alloc3(DG_BFLOAT16, B, H, D);
    fill_random(r, &m.t[0]);
    fill_random(r, &m.t[1]);
    fault_case c = {"einsum bhr,hdr->bhd", call_einsum, &m, {&m.t[2]}, 0};
    run_case(&c);
    for (int i = 0; i < 3; ++i)
        tu_free(&m.t[i]);
}

static dg_status call_cast(void *p) {
    misc_ctx *m = p;
    return m->splits ? dg_per_block_cast_to_fp8(&m->t[0], 1, 128, &m->t[1], &m->t[2])
                     : dg_per_token_cast_to_fp8(&m->t[0], 1, 128, 0, &m->t[1], &m->t[2]);
}

static void test_casts(tu_rng *r) {
    const int64_t M = 130, K = 300;
    for (int block = 0; block < 2; ++block) {
        misc_ctx m;
        memset(&m, 0, sizeof m);
        m.splits = block;
        m.t[0] = tu_alloc2(DG_BFLOAT16, M, K);
        m.t[1] = tu_alloc2(DG_FLOAT8_E4M3, M, K);
        m.t[2] = block ? tu_alloc2(DG_FLOAT32, (M + 127) / 128, (K + 127) / 128) : tu_alloc2(DG_FLOAT32, M, (K + 127) / 128);
        fill_random(r, &m.t[0]);
        fault_case c = {block ? "per_block_cast_to_fp8" : "per_token_cast_to_fp8", call_cast, &m, {&m.t[1], &m.t[2]}, 0};
        run_case(&c);
        for (int i = 0; i < 3; ++i)
            tu_free(&m.t[i]);
    }
}

int main(int argc, char **argv) {
    static const struct { const char *name; void (*run)(tu_rng *); } groups[] = {
        {"dense", test_dense}, {"grouped", test_grouped}, {"mqa", test_mqa},
        {"hc", test_hc},       {"einsum", test_einsum},   {"casts", test_casts},
    };
    for (int backend = 0; backend < 2; ++backend) {
        g_reference = backend;
        TU_CHECK_OK(dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO));
        printf("%s backend\n", backend ? "reference" : "fast");
        for (size_t i = 0; i < sizeof groups / sizeof groups[0]; ++i)
            if (argc < 2 || strstr(groups[i].name, argv[1])) {
                tu_rng r = {0x5eed + i};
                groups[i].run(&r);
            }
    }
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    if (argc < 2) /* the switch reaches the allocations of most calls */
        TU_CHECK(g_cases_with_allocs >= 30 && g_alloc_errors >= 100, "only %d cases allocate, %ld DG_ERR_ALLOC",
                 g_cases_with_allocs, g_alloc_errors);
    return tu_finish();
}
