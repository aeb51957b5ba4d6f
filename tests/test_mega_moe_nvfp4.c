/*
 * test_mega_moe_nvfp4.c - dg_fp4_fp4_mega_moe (DeepGEMM 2.8's NVFP4 mega MoE) on one rank: y
 * bitwise the chain of deepgemm.h built here from the public GEMMs, with the test's own NVFP4
 * quantiser (nearest E2M1 value, ties to the even code), on every engine variant of this CPU, 1
 * and 2 threads, waves of 3 rows and whole experts, INT32 MN-major and FLOAT32 weight scales, with
 * and without alphas / a2 scales / BF16 shared experts; within calc_diff of the same call on the
 * reference backend; recv stats; and the call's refusals (nothing written). Several ranks: the
 * Python test (python/tests/test_mega_nvfp4.py) spawns two.
 */
#include "deepgemm.h"
#include "engine/mega_moe.h"
#include "reference/ref_mega_moe.h"
#include "engine_variants.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { E = 3, K = 2, H = 128, I = 64, T = 13, TMAX = 16, S = 1 };
static const float kClamp = 6.0f, kRsf = 0.75f;
static const float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static uint8_t g_x[T][H / 2];         /* E2M1 pairs */
static float g_xsf[T][H / 16];        /* their E4M3 scale values */
static uint16_t g_xb[T][H];           /* the BF16 tokens (shared experts) */
static int64_t g_idx[T][K];
static float g_w[T][K];
static dg_tensor g_l1, g_l2;          /* FP4 [E, 2I, H/2], [E, H, I/2] */
static dg_tensor g_l1sf, g_l2sf;      /* INT32 MN-major [E, N, K/64] views */
static dg_tensor g_l1sff, g_l2sff;    /* FLOAT32 [E, N, K/16] */
static dg_tensor g_sh1, g_sh2;        /* BF16 [2SI, H], [H, SI] */
static float g_al1[E][2], g_al2[E], g_a2[E];

/* The test's E2M1 encoder: the nearest value, ties to the even code, saturating at 6. */
static uint8_t e2m1_nearest(float v) {
    const float a = fabsf(v);
    int best = 0;
    for (int c = 1; c < 8; ++c) {
        const float d = fabsf(kE2m1[c] - a), db = fabsf(kE2m1[best] - a);
        if (d < db || (d == db && c % 2 == 0))
            best = c;
    }
    if (a != a)
        best = 0;
    return (uint8_t)(best | (v < 0 && best ? 8 : 0));
}

/* NVFP4 with global scale g (deepgemm.h, dg_fp4_fp4_mega_moe step 4). */
static void quantize(const float *a, int64_t n, float g, uint8_t *codes, float *sf) {
    for (int64_t b = 0; b < n / 16; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i)
            amax = fmaxf(amax, fabsf(a[b * 16 + i]));
        sf[b] = dg_e4m3_to_float(dg_float_to_e4m3(fmaxf((amax / 6.0f) * (1.0f / g), 0x1p-9f)));
        for (int i = 0; i < 16; i += 2)
            codes[b * 8 + i / 2] = (uint8_t)(e2m1_nearest(a[b * 16 + i] / (sf[b] * g)) |
                                             e2m1_nearest(a[b * 16 + i + 1] / (sf[b] * g)) << 4);
    }
}

static float bf(float v) { return dg_bf16_to_float(dg_float_to_bf16(v)); }

/* FP4 weights with E4M3 scales: codes random, scales ~[0.02, 0.1) through E4M3; the INT32 words
 * stored MN-major (stride 1 along N), the float copy row-major. */
static void make_weight(tu_rng *rng, int64_t n, int64_t k, dg_tensor *w, dg_tensor *sf, dg_tensor *sff) {
    *w = tu_alloc3(DG_FP4_E2M1X2, E, n, k / 2);
    for (int64_t q = 0; q < E * n * k / 2; ++q)
        ((uint8_t *)w->data)[q] = (uint8_t)tu_randint(rng, 0, 255);
    *sff = tu_alloc3(DG_FLOAT32, E, n, k / 16);
    dg_tensor words = tu_alloc3(DG_INT32, E, k / 64, n); /* transposed storage */
    for (int64_t e = 0; e < E; ++e)
        for (int64_t r = 0; r < n; ++r)
            for (int64_t c = 0; c < k / 16; ++c) {
                const uint8_t byte = dg_float_to_e4m3((float)(0.02 + 0.08 * tu_uniform(rng)));
                ((float *)sff->data)[(e * n + r) * (k / 16) + c] = dg_e4m3_to_float(byte);
                uint32_t *word = (uint32_t *)words.data + (e * (k / 64) + c / 4) * n + r;
                *word = (*word & ~(0xffu << (8 * (c % 4)))) | (uint32_t)byte << (8 * (c % 4));
            }
    *sf = words; /* the view [E, n, k/64] with strides (n k/64, 1, n) */
    sf->shape[1] = n, sf->shape[2] = k / 64;
    sf->strides[0] = n * (k / 64), sf->strides[1] = 1, sf->strides[2] = n;
}

static void make_problem(void) {
    tu_rng rng = {0x4e5f4};
    for (int t = 0; t < T; ++t) {
        float row[H];
        for (int c = 0; c < H; ++c) {
            g_xb[t][c] = dg_float_to_bf16((float)tu_normal(&rng));
            row[c] = dg_bf16_to_float(g_xb[t][c]);
        }
        quantize(row, H, 1.0f, g_x[t], g_xsf[t]);
        for (int j = 0; j < K; ++j) {
            g_idx[t][j] = tu_uniform(&rng) < 0.2 ? -1 : (j == 0 ? 0 : 2); /* expert 1 gets nothing */
            g_w[t][j] = g_idx[t][j] < 0 ? 0.0f : (float)(0.2 + 0.6 * tu_uniform(&rng));
        }
    }
    g_idx[4][0] = g_idx[4][1] = -1; /* a token without experts */
    make_weight(&rng, 2 * I, H, &g_l1, &g_l1sf, &g_l1sff);
    make_weight(&rng, H, I, &g_l2, &g_l2sf, &g_l2sff);
    g_sh1 = tu_alloc2(DG_BFLOAT16, 2 * S * I, H), g_sh2 = tu_alloc2(DG_BFLOAT16, H, S * I);
    for (int64_t q = 0; q < 2 * S * I * H; ++q)
        ((uint16_t *)g_sh1.data)[q] = dg_float_to_bf16(0.08f * (float)tu_normal(&rng));
    for (int64_t q = 0; q < S * I * H; ++q)
        ((uint16_t *)g_sh2.data)[q] = dg_float_to_bf16(0.08f * (float)tu_normal(&rng));
    for (int e = 0; e < E; ++e) {
        g_al1[e][0] = (float)(0.5 + tu_uniform(&rng)), g_al1[e][1] = (float)(0.5 + tu_uniform(&rng));
        g_al2[e] = (float)(0.5 + tu_uniform(&rng)), g_a2[e] = (float)(0.05 + 0.1 * tu_uniform(&rng));
    }
}

static dg_tensor group2(const dg_tensor *t, int64_t e) {
    dg_tensor v = *t;
    v.ndim = 2;
    v.data = (char *)t->data + e * t->strides[0] * (int64_t)dg_dtype_size(t->dtype);
    v.shape[0] = t->shape[1], v.shape[1] = t->shape[2], v.strides[0] = t->strides[1], v.strides[1] = t->strides[2];
    return v;
}

static dg_gemm_options nvfp4_opts(void) {
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 1, o.recipe[2] = 16;
    return o;
}

/* One BF16 row through the shared experts (dg_bf16_mega_moe's chain, weight 1). */
static void shared_row(int t, float *out) {
    static uint16_t h[2 * S * I], act[S * I], o[H];
    dg_tensor a = dg_tensor_2d(g_xb[t], DG_BFLOAT16, 1, H), hd = dg_tensor_2d(h, DG_BFLOAT16, 1, 2 * S * I);
    TU_CHECK(dg_bf16_gemm_nt(&a, &g_sh1, &hd, NULL) == DG_OK, "shared L1: %s", dg_last_error());
    for (int i = 0; i < S * I; ++i) {
        const float g = fminf(dg_bf16_to_float(h[i]), kClamp);
        const float u = fminf(fmaxf(dg_bf16_to_float(h[S * I + i]), -kClamp), kClamp);
        act[i] = dg_float_to_bf16(((g / (1.0f + expf(-g))) * u) * 1.0f);
    }
    dg_tensor a2 = dg_tensor_2d(act, DG_BFLOAT16, 1, S * I), od = dg_tensor_2d(o, DG_BFLOAT16, 1, H);
    TU_CHECK(dg_bf16_gemm_nt(&a2, &g_sh2, &od, NULL) == DG_OK, "shared L2: %s", dg_last_error());
    for (int c = 0; c < H; ++c)
        out[c] = dg_bf16_to_float(o[c]);
}

/* deepgemm.h's chain, one (token, slot) row at a time (batch invariance makes row order free). */
static void unfused(int alphas, int shared, uint16_t (*y)[H], int32_t *recv) {
    static float part[T][K][H];
    memset(part, 0, sizeof part);
    memset(recv, 0, E * sizeof *recv);
    const dg_gemm_options o = nvfp4_opts();
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < K; ++j) {
            const int64_t e = g_idx[t][j];
            if (e < 0)
                continue;
            ++recv[e];
            static float h[2 * I], act[I], asf[I / 16], acc[H];
            static uint8_t codes[I / 2];
            dg_tensor a = dg_tensor_2d(g_x[t], DG_FP4_E2M1X2, 1, H / 2), sa = dg_tensor_2d(g_xsf[t], DG_FLOAT32, 1, H / 16);
            dg_tensor w1 = group2(&g_l1, e), s1 = group2(&g_l1sff, e), hd = dg_tensor_2d(h, DG_FLOAT32, 1, 2 * I);
            TU_CHECK(dg_fp8_fp4_gemm_nt(&a, &sa, &w1, &s1, &hd, NULL, &o) == DG_OK, "L1: %s", dg_last_error());
            const float ag = alphas ? g_al1[e][0] : 1.0f, au = alphas ? g_al1[e][1] : 1.0f;
            const float g2 = alphas ? g_a2[e] : 1.0f, al2 = alphas ? g_al2[e] : 1.0f;
            for (int i = 0; i < I; ++i) {
                const float g = fminf(bf(h[i] * ag), kClamp), u = fminf(fmaxf(bf(h[I + i] * au), -kClamp), kClamp);
                act[i] = (g / (1.0f + expf(-g))) * u;
            }
            quantize(act, I, g2, codes, asf);
            dg_tensor a2 = dg_tensor_2d(codes, DG_FP4_E2M1X2, 1, I / 2), sa2 = dg_tensor_2d(asf, DG_FLOAT32, 1, I / 16);
            dg_tensor w2 = group2(&g_l2, e), s2 = group2(&g_l2sff, e), od = dg_tensor_2d(acc, DG_FLOAT32, 1, H);
            TU_CHECK(dg_fp8_fp4_gemm_nt(&a2, &sa2, &w2, &s2, &od, NULL, &o) == DG_OK, "L2: %s", dg_last_error());
            for (int c = 0; c < H; ++c)
                part[t][j][c] = bf(bf((acc[c] * g2) * al2) * g_w[t][j]);
        }
    for (int t = 0; t < T; ++t) {
        float sh[H];
        if (shared)
            shared_row(t, sh);
        for (int c = 0; c < H; ++c) {
            float acc = 0.0f;
            for (int j = 0; j < K; ++j)
                if (g_idx[t][j] >= 0)
                    acc += part[t][j][c];
            float v = bf(bf(acc) * kRsf);
            y[t][c] = dg_float_to_bf16(shared ? v + sh[c] : v);
        }
    }
}

static dg_symm_buffer *buffer(int shared, dg_mega_moe_mma mma) {
    dg_mega_moe_config cfg = {.num_ranks = 1, .rank = 0, .num_experts = E, .num_max_tokens_per_rank = TMAX,
                              .num_topk = K, .hidden = H, .intermediate_hidden = I,
                              .num_shared_experts = shared ? S : 0, .mma = mma};
    char name[64];
    static int seq;
    snprintf(name, sizeof name, "nvfp4.%d.%d", (int)getpid(), seq++);
    dg_symm_buffer *b = NULL;
    if (dg_symm_buffer_create(&cfg, name, &b) != DG_OK || dg_symm_buffer_attach(b) != DG_OK ||
        dg_symm_buffer_seal(b) != DG_OK) {
        fprintf(stderr, "buffer: %s\n", dg_last_error());
        exit(2);
    }
    if (mma != DG_MEGA_MOE_FP4XFP4)
        return b;
    dg_tensor v;
    dg_symm_buffer_view(b, "x", &v);
    TU_CHECK(v.dtype == DG_UINT8 && v.shape[1] == H / 2, "x view: %s [%lld]", dg_dtype_name(v.dtype),
             (long long)v.shape[1]);
    memcpy(v.data, g_x, sizeof g_x);
    dg_symm_buffer_view(b, "x_sf", &v);
    TU_CHECK(v.dtype == DG_INT32 && v.shape[1] == H / 64, "x_sf view: [%lld]", (long long)v.shape[1]);
    for (int t = 0; t < T; ++t)
        for (int c = 0; c < H / 16; ++c)
            ((uint8_t *)v.data)[t * (H / 16) + c] = dg_float_to_e4m3(g_xsf[t][c]);
    dg_symm_buffer_view(b, "topk_idx", &v);
    memcpy(v.data, g_idx, sizeof g_idx);
    dg_symm_buffer_view(b, "topk_weights", &v);
    memcpy(v.data, g_w, sizeof g_w);
    return b;
}

typedef struct call_opts {
    int alphas, shared, float_sf;
} call_opts;

static dg_tensor g_tal1, g_tal2, g_ta2, g_txb;

static dg_status call(dg_symm_buffer *b, const call_opts *o, uint16_t (*y)[H], int32_t *stats) {
    dg_tensor yt = dg_tensor_2d(y, DG_BFLOAT16, T, H), st = dg_tensor_1d(stats, DG_INT32, E);
    dg_fp4_fp4_mega_moe_extras ex = dg_fp4_fp4_mega_moe_extras_default();
    ex.routed_scaling_factor = kRsf;
    if (o->alphas)
        ex.l1_alphas = &g_tal1, ex.l2_alphas = &g_tal2, ex.a2_scales = &g_ta2;
    if (o->shared)
        ex.shared_l1_weights = &g_sh1, ex.shared_l2_weights = &g_sh2, ex.x_bf16 = &g_txb;
    return dg_fp4_fp4_mega_moe(&yt, &g_l1, o->float_sf ? &g_l1sff : &g_l1sf, &g_l2, o->float_sf ? &g_l2sff : &g_l2sf,
                               &ex, b, &st, kClamp);
}

static void test_chain(void) {
    static uint16_t want[2][2][T][H], y[T][H];
    int32_t recv[E], stats[E];
    for (int al = 0; al < 2; ++al)
        for (int sh = 0; sh < 2; ++sh)
            unfused(al, sh, want[al][sh], recv);
    TU_CHECK(memcmp(want[1][1], want[0][1], sizeof y) != 0 && memcmp(want[1][1], want[1][0], sizeof y) != 0,
             "alphas and shared experts change nothing: the problem cannot tell them apart");
    dg_symm_buffer *bufs[2] = {buffer(0, DG_MEGA_MOE_FP4XFP4), buffer(1, DG_MEGA_MOE_FP4XFP4)};
    const dg_isa best = dg_get_isa();
    const int nv = tu_engine_variants(best);
    for (int v = 0; v < nv; ++v) {
        const dg_isa isa = tu_engine_variant_set(v);
        for (int threads = 1; threads <= 2; ++threads) {
            dg_set_num_sms(threads);
            dg_mega_moe_set_wave_rows(threads == 2 ? 3 : 0);
            for (int al = 0; al < 2; ++al)
                for (int sh = 0; sh < 2; ++sh) {
                    const call_opts o = {al, sh, (al + sh + threads) % 2};
                    memset(y, 0xff, sizeof y);
                    memset(stats, 0, sizeof stats);
                    const dg_status s = call(bufs[sh], &o, y, stats);
                    TU_CHECK(s == DG_OK, "variant %d: %s", v, dg_last_error());
                    TU_CHECK(memcmp(y, want[al][sh], sizeof y) == 0,
                             "isa %d variant %d, %d threads, alphas %d, shared %d, float scales %d: y is not the chain's",
                             (int)isa, v, threads, al, sh, o.float_sf);
                    TU_CHECK(memcmp(stats, recv, sizeof recv) == 0, "recv stats");
                }
        }
    }
    tu_engine_variants_done(best);
    dg_mega_moe_set_wave_rows(0);
    dg_set_num_sms(2);

    /* The reference backend's GEMMs (double sums): within calc_diff of the engine's y. */
    dg_set_backend(DG_BACKEND_REFERENCE);
    const call_opts o = {1, 1, 0};
    TU_CHECK(call(bufs[1], &o, y, stats) == DG_OK, "reference backend: %s", dg_last_error());
    dg_set_backend(DG_BACKEND_AUTO);
    float *a = malloc(sizeof(float) * T * H), *r = malloc(sizeof(float) * T * H);
    for (int q = 0; q < T * H; ++q)
        a[q] = dg_bf16_to_float(((uint16_t *)y)[q]), r[q] = dg_bf16_to_float(((uint16_t *)want[1][1])[q]);
    const double d = tu_calc_diff(a, r, (size_t)T * H);
    TU_CHECK(d < 1e-4, "reference backend vs engine: calc_diff %g", d);
    free(a), free(r);
    for (int c = 0; c < H; ++c)
        TU_CHECK(want[0][0][4][c] == 0, "a token without experts and shared experts must give 0");
    dg_symm_buffer_destroy(bufs[0]);
    dg_symm_buffer_destroy(bufs[1]);
}

/* The packed call (routed weights dg_pack_b_grouped with float scales per 1x16, the BF16 shared
 * experts dg_pack_b): bitwise the unpacked call on every engine variant; its refusals. */
static void test_packed(void) {
    static uint16_t want[T][H], y[T][H];
    int32_t stats[E];
    dg_symm_buffer *b = buffer(1, DG_MEGA_MOE_FP4XFP4);
    const dg_isa best = dg_get_isa();
    const dg_gemm_options o = nvfp4_opts();
    for (int v = 0; v < tu_engine_variants(best); ++v) {
        tu_engine_variant_set(v);
        dg_packed_b *p1 = NULL, *p2 = NULL, *s1 = NULL, *s2 = NULL;
        TU_CHECK(dg_pack_b_grouped(&g_l1, &g_l1sff, &o, &p1) == DG_OK && dg_pack_b_grouped(&g_l2, &g_l2sff, &o, &p2) == DG_OK &&
                     dg_pack_b(&g_sh1, NULL, NULL, &s1) == DG_OK && dg_pack_b(&g_sh2, NULL, NULL, &s2) == DG_OK,
                 "packing: %s", dg_last_error());
        dg_set_num_sms(1 + v % 2);
        TU_CHECK(call(b, &(call_opts){1, 1, 0}, want, stats) == DG_OK, "unpacked: %s", dg_last_error());
        dg_tensor yt = dg_tensor_2d(y, DG_BFLOAT16, T, H), st = dg_tensor_1d(stats, DG_INT32, E);
        dg_fp4_fp4_mega_moe_extras ex = dg_fp4_fp4_mega_moe_extras_default();
        ex.routed_scaling_factor = kRsf, ex.l1_alphas = &g_tal1, ex.l2_alphas = &g_tal2, ex.a2_scales = &g_ta2;
        ex.x_bf16 = &g_txb;
        memset(y, 0xff, sizeof y);
        TU_CHECK(dg_fp4_fp4_mega_moe_packed(&yt, p1, p2, s1, s2, &ex, b, &st, kClamp) == DG_OK, "packed: %s",
                 dg_last_error());
        TU_CHECK(memcmp(y, want, sizeof y) == 0, "variant %d: the packed call's y differs from the unpacked call's", v);
        memset(y, 0x5a, sizeof y);
        TU_CHECK(dg_fp4_fp4_mega_moe_packed(&yt, p1, p2, NULL, NULL, &ex, b, &st, kClamp) != DG_OK,
                 "packed call without the shared experts of the buffer");
        ex.shared_l1_weights = &g_sh1;
        TU_CHECK(dg_fp4_fp4_mega_moe_packed(&yt, p1, p2, s1, s2, &ex, b, &st, kClamp) == DG_ERR_VALUE,
                 "packed call with extras' shared tensors");
        ex.shared_l1_weights = NULL, ex.x_bf16 = NULL;
        TU_CHECK(dg_fp4_fp4_mega_moe_packed(&yt, p1, p2, s1, s2, &ex, b, &st, kClamp) == DG_ERR_VALUE,
                 "packed call without x_bf16");
        ex.x_bf16 = &g_txb;
        TU_CHECK(dg_fp4_fp4_mega_moe_packed(&yt, p2, p1, s1, s2, &ex, b, &st, kClamp) != DG_OK, "L1 / L2 swapped");
        dg_packed_b *q1 = NULL;
        dg_gemm_options o32 = nvfp4_opts();
        o32.recipe[2] = 32;
        dg_tensor sf32 = tu_alloc3(DG_FLOAT32, E, 2 * I, H / 32);
        TU_CHECK(dg_pack_b_grouped(&g_l1, &sf32, &o32, &q1) == DG_OK, "pack per 1x32: %s", dg_last_error());
        TU_CHECK(dg_fp4_fp4_mega_moe_packed(&yt, q1, p2, s1, s2, &ex, b, &st, kClamp) == DG_ERR_VALUE &&
                     strstr(dg_last_error(), "1x16"),
                 "weights packed per 1x32: %s", dg_last_error());
        for (size_t q = 0; q < sizeof y / 2; ++q)
            TU_CHECK(((uint16_t *)y)[q] == 0x5a5a, "y written by a refused packed call (entry %zu)", q);
        tu_free(&sf32);
        dg_packed_b_free(q1), dg_packed_b_free(p1), dg_packed_b_free(p2), dg_packed_b_free(s1), dg_packed_b_free(s2);
    }
    tu_engine_variants_done(best);
    dg_set_num_sms(2);
    dg_symm_buffer_destroy(b);
}

static void test_refusals(void) {
    static uint16_t y[T][H];
    int32_t stats[E] = {0};
    dg_symm_buffer *b = buffer(1, DG_MEGA_MOE_FP4XFP4), *b8 = buffer(0, DG_MEGA_MOE_FP8XFP4);
    memset(y, 0x5a, sizeof y);
    const call_opts ok = {1, 1, 0};
    dg_tensor yt = dg_tensor_2d(y, DG_BFLOAT16, T, H);
    /* the FP8 calls refuse an fp4xfp4 buffer, the NVFP4 call every other */
    TU_CHECK(dg_fp8_fp4_mega_moe(&yt, &g_l1, &g_l1sf, &g_l2, &g_l2sf, NULL, NULL, NULL, NULL, b, NULL, kClamp) ==
                 DG_ERR_VALUE, "fp8 call on an fp4xfp4 buffer");
    TU_CHECK(call(b8, &(call_opts){0, 0, 0}, y, stats) == DG_ERR_VALUE && strstr(dg_last_error(), "fp4xfp4"),
             "nvfp4 call on an fp8xfp4 buffer: %s", dg_last_error());
    TU_CHECK(call(b, &(call_opts){1, 0, 0}, y, stats) != DG_OK, "shared experts missing");
    float bad_a2[E] = {g_a2[0], 0.0f, g_a2[2]};
    dg_tensor ta2 = g_ta2;
    g_ta2 = dg_tensor_1d(bad_a2, DG_FLOAT32, E);
    TU_CHECK(call(b, &ok, y, stats) == DG_ERR_VALUE && strstr(dg_last_error(), "a2_scales"), "a2 = 0: %s",
             dg_last_error());
    bad_a2[1] = NAN;
    TU_CHECK(call(b, &ok, y, stats) == DG_ERR_VALUE, "a2 = NaN");
    g_ta2 = ta2;
    dg_tensor tal1 = g_tal1;
    g_tal1 = dg_tensor_1d(g_al2, DG_FLOAT32, E);
    TU_CHECK(call(b, &ok, y, stats) != DG_OK && strstr(dg_last_error(), "l1_alphas"), "l1_alphas 1-D: %s",
             dg_last_error());
    g_tal1 = tal1;
    dg_tensor txb = g_txb;
    g_txb = dg_tensor_2d(g_xb, DG_BFLOAT16, T - 1, H);
    TU_CHECK(call(b, &ok, y, stats) == DG_ERR_SHAPE && strstr(dg_last_error(), "x_bf16"), "x_bf16 rows: %s",
             dg_last_error());
    g_txb = txb;
    dg_tensor yv = dg_tensor_2d(y, DG_BFLOAT16, T, H);
    dg_fp4_fp4_mega_moe_extras ex = dg_fp4_fp4_mega_moe_extras_default();
    ex.shared_l1_weights = &g_sh1, ex.shared_l2_weights = &g_sh2, ex.x_bf16 = &g_txb;
    ex.routed_scaling_factor = INFINITY;
    TU_CHECK(dg_fp4_fp4_mega_moe(&yv, &g_l1, &g_l1sf, &g_l2, &g_l2sf, &ex, b, NULL, kClamp) == DG_ERR_VALUE,
             "routed_scaling_factor inf");
    ex.routed_scaling_factor = 1.0f, ex.x_bf16 = NULL;
    TU_CHECK(dg_fp4_fp4_mega_moe(&yv, &g_l1, &g_l1sf, &g_l2, &g_l2sf, &ex, b, NULL, kClamp) == DG_ERR_VALUE,
             "shared weights without x_bf16");
    ex.x_bf16 = &g_txb;
    dg_tensor sf = g_l1sf;
    sf.shape[2] = 1;
    TU_CHECK(dg_fp4_fp4_mega_moe(&yv, &g_l1, &sf, &g_l2, &g_l2sf, &ex, b, NULL, kClamp) != DG_OK, "short scales");
    TU_CHECK(dg_fp4_fp4_mega_moe(&yv, &g_sh1, &g_l1sf, &g_l2, &g_l2sf, &ex, b, NULL, kClamp) != DG_OK,
             "BF16 routed weights");
    for (size_t q = 0; q < sizeof y / 2; ++q)
        TU_CHECK(((uint16_t *)y)[q] == 0x5a5a, "y written by a refused call (entry %zu)", q);
    dg_mega_moe_config cfg = {.num_ranks = 1, .num_experts = E, .num_max_tokens_per_rank = TMAX, .num_topk = K,
                              .hidden = H + 32, .intermediate_hidden = I, .mma = DG_MEGA_MOE_FP4XFP4};
    int64_t bytes = 0;
    TU_CHECK(dg_get_symm_buffer_size_for_mega_moe(&cfg, &bytes) == DG_ERR_VALUE, "hidden 160 accepted");
    cfg.hidden = H;
    TU_CHECK(dg_get_symm_buffer_size_for_mega_moe(&cfg, &bytes) == DG_OK && bytes > TMAX * K * H * 2, "size");
    dg_symm_buffer_destroy(b);
    dg_symm_buffer_destroy(b8);
}

/* The quantiser of the library (src/reference) against the test's on ties and edges. */
static void test_quantiser_edges(void) {
    static const float vals[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 7.0f, -0.75f, -0.2f, 1e9f, NAN, -0.0f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; ++i) {
        float block[16] = {6.0f}; /* amax 6 -> sf 1 */
        block[1] = vals[i];
        uint8_t mine[8], lib[8];
        float sm[1], sl[1];
        quantize(block, 16, 1.0f, mine, sm);
        dg_ref_mega_moe_quantize_nvfp4(block, 16, 1.0f, lib, sl);
        TU_CHECK(memcmp(mine, lib, 8) == 0 && sm[0] == sl[0], "value %g: code %02x vs %02x", (double)vals[i],
                 mine[0], lib[0]);
    }
}

int main(void) {
    make_problem();
    g_tal1 = dg_tensor_2d(g_al1, DG_FLOAT32, E, 2), g_tal2 = dg_tensor_1d(g_al2, DG_FLOAT32, E);
    g_ta2 = dg_tensor_1d(g_a2, DG_FLOAT32, E), g_txb = dg_tensor_2d(g_xb, DG_BFLOAT16, T, H);
    test_quantiser_edges();
    test_chain();
    test_packed();
    test_refusals();
    return tu_finish();
}
