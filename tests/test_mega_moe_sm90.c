/*
 * test_mega_moe_sm90.c - dg_fp8_mega_moe (DeepGEMM 2.8's SM90 FP8 mega MoE) on one rank: y
 * bitwise the chain of deepgemm.h built here from the public GEMMs (dg_fp8_gemm_nt with block
 * scales) and the test's own power-of-two activation quantiser, on every engine variant of this
 * CPU, 1 and 2 threads, waves of 3 rows and whole experts; within calc_diff of the same call on
 * the reference backend; the pre-packed call bitwise the raw one; recv stats; the buffer's
 * configuration rules and the call's refusals (nothing written). Several ranks: the Python test
 * (python/tests/test_mega_sm90.py) spawns two.
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

enum { E = 3, K = 2, H = 256, I = 128, T = 13, TMAX = 16 };
/* Not a BF16 value: a call that rounded it as the other mega MoE calls do would differ. */
static const float kClamp = 0.7f;

static uint8_t g_x[T][H];          /* E4M3 codes */
static float g_xsf[T][H / 128];    /* their scales */
static int64_t g_idx[T][K];
static float g_w[T][K];
static dg_tensor g_l1, g_l2;       /* E4M3 [E, 2I, H], [E, H, I] */
static dg_tensor g_l1sf, g_l2sf;   /* FLOAT32 [E, 2I/128, H/128], [E, H/128, I/128] */

/* The test's SM90 quantiser (deepgemm.h, dg_fp8_mega_moe step 4), by frexpf rather than bits:
 * sf = 2^ceil(log2(amax * (1/448))), 0 for amax 0. */
static void quantize(const float *a, int64_t n, uint8_t *codes, float *sf) {
    for (int64_t g = 0; g < n / 64; ++g) {
        float amax = 0.0f;
        for (int i = 0; i < 64; ++i)
            amax = fmaxf(amax, fabsf(a[g * 64 + i]));
        const float q = amax * (1.0f / 448.0f);
        int e = 0;
        const float m = frexpf(q, &e); /* q = m 2^e, m in [0.5, 1) */
        const int ceil_log2 = m == 0.5f ? e - 1 : e;
        sf[g] = q == 0.0f ? 0.0f : ldexpf(1.0f, ceil_log2 < -126 ? -126 : ceil_log2);
        const float inv = q == 0.0f ? 0x1p127f : ldexpf(1.0f, -(ceil_log2 < -126 ? -126 : ceil_log2));
        for (int i = 0; i < 64; ++i)
            codes[g * 64 + i] = dg_float_to_e4m3(a[g * 64 + i] * inv);
    }
}

/* E4M3 codes of value * scale (no NaN codes), and FLOAT32 block scales in [lo, 2 lo). */
static void make_weight(tu_rng *rng, int64_t n, int64_t k, float spread, float lo, dg_tensor *w, dg_tensor *sf) {
    *w = tu_alloc3(DG_FLOAT8_E4M3, E, n, k);
    for (int64_t q = 0; q < E * n * k; ++q)
        ((uint8_t *)w->data)[q] = dg_float_to_e4m3(spread * (float)tu_normal(rng));
    *sf = tu_alloc3(DG_FLOAT32, E, n / 128, k / 128);
    for (int64_t q = 0; q < E * (n / 128) * (k / 128); ++q)
        ((float *)sf->data)[q] = lo * (float)(1.0 + tu_uniform(rng));
}

static void make_problem(void) {
    tu_rng rng = {0x5e90};
    for (int t = 0; t < T; ++t) {
        for (int c = 0; c < H; ++c)
            g_x[t][c] = dg_float_to_e4m3(32.0f * (float)tu_normal(&rng));
        for (int c = 0; c < H / 128; ++c)
            g_xsf[t][c] = (float)(0.01 + 0.03 * tu_uniform(&rng));
        for (int j = 0; j < K; ++j) {
            g_idx[t][j] = tu_uniform(&rng) < 0.2 ? -1 : (j == 0 ? 0 : 2); /* expert 1 gets nothing */
            g_w[t][j] = g_idx[t][j] < 0 ? 0.0f : (float)(0.2 + 0.6 * tu_uniform(&rng));
        }
    }
    g_idx[4][0] = g_idx[4][1] = -1; /* a token without experts */
    make_weight(&rng, 2 * I, H, 64.0f, 0.001f, &g_l1, &g_l1sf);
    make_weight(&rng, H, I, 64.0f, 0.001f, &g_l2, &g_l2sf);
}

static dg_tensor group2(const dg_tensor *t, int64_t e) {
    dg_tensor v = *t;
    v.ndim = 2;
    v.data = (char *)t->data + e * t->strides[0] * (int64_t)dg_dtype_size(t->dtype);
    v.shape[0] = t->shape[1], v.shape[1] = t->shape[2], v.strides[0] = t->strides[1], v.strides[1] = t->strides[2];
    return v;
}

static dg_gemm_options block_opts(int gran_a) {
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe_a[0] = 1, o.recipe_a[1] = gran_a, o.recipe_b[0] = 128, o.recipe_b[1] = 128;
    return o;
}

/* deepgemm.h's chain, one (token, slot) row at a time (batch invariance makes row order free). */
static void unfused(uint16_t (*y)[H], int32_t *recv) {
    static float part[T][K][H];
    memset(part, 0, sizeof part);
    memset(recv, 0, E * sizeof *recv);
    const dg_gemm_options o1 = block_opts(128), o2 = block_opts(64);
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < K; ++j) {
            const int64_t e = g_idx[t][j];
            if (e < 0)
                continue;
            ++recv[e];
            static float h[2 * I], act[I], asf[I / 64];
            static uint8_t codes[I];
            static uint16_t o[H];
            dg_tensor a = dg_tensor_2d(g_x[t], DG_FLOAT8_E4M3, 1, H), sa = dg_tensor_2d(g_xsf[t], DG_FLOAT32, 1, H / 128);
            dg_tensor w1 = group2(&g_l1, e), s1 = group2(&g_l1sf, e), hd = dg_tensor_2d(h, DG_FLOAT32, 1, 2 * I);
            TU_CHECK(dg_fp8_gemm_nt(&a, &sa, &w1, &s1, &hd, NULL, &o1) == DG_OK, "L1: %s", dg_last_error());
            for (int i = 0; i < I; ++i) {
                const float g = fminf(h[i], kClamp), u = fminf(fmaxf(h[I + i], -kClamp), kClamp);
                act[i] = ((g / (1.0f + expf(-g))) * u) * g_w[t][j];
            }
            quantize(act, I, codes, asf);
            dg_tensor a2 = dg_tensor_2d(codes, DG_FLOAT8_E4M3, 1, I), sa2 = dg_tensor_2d(asf, DG_FLOAT32, 1, I / 64);
            dg_tensor w2 = group2(&g_l2, e), s2 = group2(&g_l2sf, e), od = dg_tensor_2d(o, DG_BFLOAT16, 1, H);
            TU_CHECK(dg_fp8_gemm_nt(&a2, &sa2, &w2, &s2, &od, NULL, &o2) == DG_OK, "L2: %s", dg_last_error());
            for (int c = 0; c < H; ++c)
                part[t][j][c] = dg_bf16_to_float(o[c]);
        }
    for (int t = 0; t < T; ++t)
        for (int c = 0; c < H; ++c) {
            float acc = 0.0f;
            for (int j = 0; j < K; ++j)
                if (g_idx[t][j] >= 0)
                    acc += part[t][j][c];
            y[t][c] = dg_float_to_bf16(acc);
        }
}

static dg_symm_buffer *buffer(dg_mega_moe_mma mma) {
    dg_mega_moe_config cfg = {.num_ranks = 1, .rank = 0, .num_experts = E, .num_max_tokens_per_rank = TMAX,
                              .num_topk = K, .hidden = H, .intermediate_hidden = I, .mma = mma};
    char name[64];
    static int seq;
    snprintf(name, sizeof name, "sm90.%d.%d", (int)getpid(), seq++);
    dg_symm_buffer *b = NULL;
    if (dg_symm_buffer_create(&cfg, name, &b) != DG_OK || dg_symm_buffer_attach(b) != DG_OK ||
        dg_symm_buffer_seal(b) != DG_OK) {
        fprintf(stderr, "buffer: %s\n", dg_last_error());
        exit(2);
    }
    dg_tensor v;
    dg_symm_buffer_view(b, "x", &v);
    memcpy(v.data, g_x, sizeof g_x);
    dg_symm_buffer_view(b, "x_sf", &v);
    if (mma == DG_MEGA_MOE_SM90_FP8) {
        TU_CHECK(v.dtype == DG_FLOAT32 && v.shape[0] == 128 && v.shape[1] == H / 128, "x_sf view: %s [%lld, %lld]",
                 dg_dtype_name(v.dtype), (long long)v.shape[0], (long long)v.shape[1]);
        memcpy(v.data, g_xsf, sizeof g_xsf);
    }
    dg_symm_buffer_view(b, "topk_idx", &v);
    memcpy(v.data, g_idx, sizeof g_idx);
    dg_symm_buffer_view(b, "topk_weights", &v);
    memcpy(v.data, g_w, sizeof g_w);
    return b;
}

static dg_status call(dg_symm_buffer *b, uint16_t (*y)[H], int32_t *stats) {
    dg_tensor yt = dg_tensor_2d(y, DG_BFLOAT16, T, H), st = dg_tensor_1d(stats, DG_INT32, E);
    return dg_fp8_mega_moe(&yt, &g_l1, &g_l1sf, &g_l2, &g_l2sf, b, &st, kClamp);
}

static void test_chain(void) {
    static uint16_t want[T][H], y[T][H];
    int32_t recv[E], stats[E];
    unfused(want, recv);
    dg_symm_buffer *b = buffer(DG_MEGA_MOE_SM90_FP8);
    const dg_isa best = dg_get_isa();
    const int nv = tu_engine_variants(best);
    for (int v = 0; v < nv; ++v) {
        const dg_isa isa = tu_engine_variant_set(v);
        for (int threads = 1; threads <= 2; ++threads) {
            dg_set_num_sms(threads);
            dg_mega_moe_set_wave_rows(threads == 2 ? 3 : 0);
            memset(y, 0xff, sizeof y);
            memset(stats, 0, sizeof stats);
            TU_CHECK(call(b, y, stats) == DG_OK, "variant %d: %s", v, dg_last_error());
            TU_CHECK(memcmp(y, want, sizeof y) == 0, "isa %d variant %d, %d threads: y is not the chain's", (int)isa,
                     v, threads);
            TU_CHECK(memcmp(stats, recv, sizeof recv) == 0, "recv stats");
        }
    }
    tu_engine_variants_done(best);
    dg_mega_moe_set_wave_rows(0);
    dg_set_num_sms(2);

    /* The reference backend's GEMMs (double sums): within calc_diff of the engine's y. */
    dg_set_backend(DG_BACKEND_REFERENCE);
    TU_CHECK(call(b, y, stats) == DG_OK, "reference backend: %s", dg_last_error());
    dg_set_backend(DG_BACKEND_AUTO);
    float *a = malloc(sizeof(float) * T * H), *r = malloc(sizeof(float) * T * H);
    int nonzero = 0;
    for (int q = 0; q < T * H; ++q) {
        a[q] = dg_bf16_to_float(((uint16_t *)y)[q]), r[q] = dg_bf16_to_float(((uint16_t *)want)[q]);
        nonzero += r[q] != 0.0f;
    }
    const double d = tu_calc_diff(a, r, (size_t)T * H);
    TU_CHECK(d < 1e-4, "reference backend vs engine: calc_diff %g", d);
    TU_CHECK(nonzero > T * H / 2, "the problem is mostly zeros (%d of %d): it cannot tell paths apart", nonzero,
             T * H);
    free(a), free(r);
    for (int c = 0; c < H; ++c)
        TU_CHECK(want[4][c] == 0, "a token without experts must give 0");
    dg_symm_buffer_destroy(b);
}

/* The packed call (dg_pack_b_grouped with the block scales): bitwise the raw call on every engine
 * variant; weights packed per 1x32 are refused. */
static void test_packed(void) {
    static uint16_t want[T][H], y[T][H];
    int32_t stats[E];
    dg_symm_buffer *b = buffer(DG_MEGA_MOE_SM90_FP8);
    const dg_isa best = dg_get_isa();
    const dg_gemm_options o1 = block_opts(128), o2 = block_opts(64);
    for (int v = 0; v < tu_engine_variants(best); ++v) {
        tu_engine_variant_set(v);
        dg_packed_b *p1 = NULL, *p2 = NULL;
        TU_CHECK(dg_pack_b_grouped(&g_l1, &g_l1sf, &o1, &p1) == DG_OK &&
                     dg_pack_b_grouped(&g_l2, &g_l2sf, &o2, &p2) == DG_OK,
                 "packing: %s", dg_last_error());
        dg_set_num_sms(1 + v % 2);
        TU_CHECK(call(b, want, stats) == DG_OK, "raw: %s", dg_last_error());
        dg_tensor yt = dg_tensor_2d(y, DG_BFLOAT16, T, H), st = dg_tensor_1d(stats, DG_INT32, E);
        memset(y, 0xff, sizeof y);
        TU_CHECK(dg_fp8_mega_moe_packed(&yt, p1, p2, b, &st, kClamp) == DG_OK, "packed: %s", dg_last_error());
        TU_CHECK(memcmp(y, want, sizeof y) == 0, "variant %d: the packed call's y differs from the raw call's", v);
        memset(y, 0x5a, sizeof y);
        TU_CHECK(dg_fp8_mega_moe_packed(&yt, p2, p1, b, &st, kClamp) != DG_OK, "L1 / L2 swapped");
        dg_packed_b *q1 = NULL;
        dg_gemm_options o32 = dg_gemm_options_default();
        o32.recipe[0] = 1, o32.recipe[1] = 1, o32.recipe[2] = 32;
        dg_tensor sf32 = tu_alloc3(DG_FLOAT32, E, 2 * I, H / 32);
        TU_CHECK(dg_pack_b_grouped(&g_l1, &sf32, &o32, &q1) == DG_OK, "pack per 1x32: %s", dg_last_error());
        TU_CHECK(dg_fp8_mega_moe_packed(&yt, q1, p2, b, &st, kClamp) == DG_ERR_VALUE &&
                     strstr(dg_last_error(), "128x128"),
                 "weights packed per 1x32: %s", dg_last_error());
        TU_CHECK(dg_fp8_mega_moe_packed(&yt, NULL, p2, b, &st, kClamp) == DG_ERR_NULL_POINTER, "NULL packed L1");
        for (size_t q = 0; q < sizeof y / 2; ++q)
            TU_CHECK(((uint16_t *)y)[q] == 0x5a5a, "y written by a refused packed call (entry %zu)", q);
        tu_free(&sf32);
        dg_packed_b_free(q1), dg_packed_b_free(p1), dg_packed_b_free(p2);
    }
    tu_engine_variants_done(best);
    dg_set_num_sms(2);
    dg_symm_buffer_destroy(b);
}

static void test_refusals(void) {
    static uint16_t y[T][H];
    int32_t stats[E] = {0};
    dg_symm_buffer *b = buffer(DG_MEGA_MOE_SM90_FP8), *b8 = buffer(DG_MEGA_MOE_FP8XFP8);
    memset(y, 0x5a, sizeof y);
    dg_tensor yt = dg_tensor_2d(y, DG_BFLOAT16, T, H), st = dg_tensor_1d(stats, DG_INT32, E);
    /* the SM90 call refuses the other buffers, the other calls the SM90 buffer */
    TU_CHECK(call(b8, y, stats) == DG_ERR_VALUE && strstr(dg_last_error(), "SM90"), "SM90 call on an fp8xfp8 buffer: %s",
             dg_last_error());
    dg_tensor sf32 = tu_alloc3(DG_FLOAT32, E, 2 * I, H / 32), sf32b = tu_alloc3(DG_FLOAT32, E, H, I / 32);
    TU_CHECK(dg_fp8_fp4_mega_moe(&yt, &g_l1, &sf32, &g_l2, &sf32b, NULL, NULL, NULL, NULL, b, &st, kClamp) ==
                 DG_ERR_VALUE, "fp8_fp4 call on the SM90 buffer");
    /* scales: INT32, per 1x32, short; weights BF16 */
    TU_CHECK(dg_fp8_mega_moe(&yt, &g_l1, &sf32, &g_l2, &g_l2sf, b, &st, kClamp) != DG_OK, "per-1x32 scales");
    dg_tensor isf = g_l1sf;
    isf.dtype = DG_INT32;
    TU_CHECK(dg_fp8_mega_moe(&yt, &g_l1, &isf, &g_l2, &g_l2sf, b, &st, kClamp) == DG_ERR_DTYPE, "INT32 scales");
    dg_tensor short_sf = g_l2sf;
    short_sf.shape[2] = 0;
    TU_CHECK(dg_fp8_mega_moe(&yt, &g_l1, &g_l1sf, &g_l2, &short_sf, b, &st, kClamp) != DG_OK, "short scales");
    TU_CHECK(dg_fp8_mega_moe(&yt, &g_l1, NULL, &g_l2, &g_l2sf, b, &st, kClamp) == DG_ERR_NULL_POINTER, "NULL scales");
    dg_tensor bf = tu_alloc3(DG_BFLOAT16, E, 2 * I, H);
    TU_CHECK(dg_fp8_mega_moe(&yt, &bf, &g_l1sf, &g_l2, &g_l2sf, b, &st, kClamp) == DG_ERR_DTYPE, "BF16 weights");
    TU_CHECK(dg_fp8_mega_moe(&yt, &g_l2, &g_l2sf, &g_l1, &g_l1sf, b, &st, kClamp) == DG_ERR_SHAPE, "L1 / L2 swapped");
    TU_CHECK(dg_fp8_mega_moe(&yt, &g_l1, &g_l1sf, &g_l2, &g_l2sf, b, &st, -1.0f) == DG_ERR_VALUE, "clamp < 0");
    TU_CHECK(dg_fp8_mega_moe(&yt, &g_l1, &g_l1sf, &g_l2, &g_l2sf, NULL, &st, kClamp) == DG_ERR_NULL_POINTER,
             "NULL buffer");
    for (size_t q = 0; q < sizeof y / 2; ++q)
        TU_CHECK(((uint16_t *)y)[q] == 0x5a5a, "y written by a refused call (entry %zu)", q);
    /* the configuration */
    dg_mega_moe_config cfg = {.num_ranks = 1, .num_experts = E, .num_max_tokens_per_rank = 1, .num_topk = K,
                              .hidden = H, .intermediate_hidden = I, .mma = DG_MEGA_MOE_SM90_FP8};
    int64_t bytes = 0;
    TU_CHECK(dg_get_symm_buffer_size_for_mega_moe(&cfg, &bytes) == DG_OK && bytes >= 128 * K * H * 2,
             "size: %s (128 aligned tokens)", dg_last_error());
    TU_CHECK(dg_get_token_alignment_for_sm90_mega_moe() == 128, "SM90 token alignment");
    cfg.hidden = 384;
    TU_CHECK(dg_get_symm_buffer_size_for_mega_moe(&cfg, &bytes) == DG_ERR_VALUE, "hidden 384 accepted");
    cfg.hidden = H, cfg.intermediate_hidden = 192;
    TU_CHECK(dg_get_symm_buffer_size_for_mega_moe(&cfg, &bytes) == DG_ERR_VALUE, "intermediate 192 accepted");
    cfg.intermediate_hidden = I, cfg.num_shared_experts = 1;
    TU_CHECK(dg_get_symm_buffer_size_for_mega_moe(&cfg, &bytes) == DG_ERR_VALUE &&
                 strstr(dg_last_error(), "shared"),
             "shared experts accepted: %s", dg_last_error());
    tu_free(&sf32), tu_free(&sf32b), tu_free(&bf);
    dg_symm_buffer_destroy(b);
    dg_symm_buffer_destroy(b8);
}

/* The library's quantiser (src/reference) against the test's at the edges: amax exactly 448 2^k
 * (no round up), just above, zero, subnormal quotients, a NaN entry (skipped by amax). */
static void test_quantiser_edges(void) {
    static const float amaxes[] = {448.0f, 448.0f * 0x1p-10f, 448.0f * 1.0000001f, 1.0f, 3e-3f, 0.0f, 1e-40f,
                                   0x1p-120f, 5.0e4f};
    for (size_t i = 0; i < sizeof amaxes / sizeof amaxes[0]; ++i) {
        float block[64];
        for (int q = 0; q < 64; ++q)
            block[q] = amaxes[i] * (float)(q - 31) / 32.0f;
        block[7] = -amaxes[i];
        uint8_t mine[64], lib[64];
        float sm, sl;
        quantize(block, 64, mine, &sm);
        dg_ref_mega_moe_quantize_fp8_pow2(block, 64, lib, &sl);
        TU_CHECK(sm == sl && memcmp(mine, lib, 64) == 0, "amax %g: sf %g vs %g", (double)amaxes[i], (double)sm,
                 (double)sl);
    }
    float block[64] = {1.0f, NAN, -2.0f};
    uint8_t lib[64];
    float sl;
    dg_ref_mega_moe_quantize_fp8_pow2(block, 64, lib, &sl);
    TU_CHECK(sl == 0x1p-7f, "NaN entry: sf %g, want 2^-7 (amax 2 of the other entries)", (double)sl);
}

int main(void) {
    make_problem();
    test_quantiser_edges();
    test_chain();
    test_packed();
    test_refusals();
    return tu_finish();
}
