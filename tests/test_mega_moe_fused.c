/*
 * test_mega_moe_fused.c - the fused mega MoE calls across processes (fork()ed ranks on one
 * machine, a process-shared pthread barrier standing in for MPI / torch.distributed during
 * buffer creation). One global problem (tokens, routing with masked slots and experts that get
 * no token, weights) is split over R = 1, 2 and 4 ranks with uneven token counts (some 0):
 *   - y is bitwise the same for every R and thread count,
 *   - bitwise equal to the unfused chain built from public kernels (m-grouped contiguous GEMMs,
 *     the reference's SwiGLU / quantisation steps, the reference combine order),
 *   - within calc_diff of the reference (double sums), stats increased as the reference does;
 * and the failures: invalid arguments on one rank, topk_idx out of range, a rank that exits
 * without calling, different configurations, bad configurations; each an error on every rank,
 * outputs untouched, the buffer still usable where documented.
 */
#define _GNU_SOURCE
#include "test_util.h"

#include "engine/mega_moe.h"
#include "reference/ref_mega_moe.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

enum { E = 8, K = 3, H = 160, I = 48, N = 29, TMAX = 32, MAXR = 4, S = 2 /* shared experts */ };
#define SFC ((H + 127) / 128)

/* The global problem, generated before fork() so every rank sees the same. */
static uint8_t g_x[N][H];                 /* E4M3 codes */
static int32_t g_xsf[N][SFC];             /* packed UE8M0 */
static uint16_t g_xb[N][H];               /* BF16 tokens (bf16 variant) */
static int64_t g_idx[N][K];
static float g_w[N][K];
static dg_tensor g_l1, g_l1sf, g_l2, g_l2sf, g_l1b, g_l2b; /* [E, ...] */
static dg_tensor g_sh1, g_sh1sf, g_sh2, g_sh2sf;           /* shared experts, FP8 [2SI, H], [H, SI] */
#define SH(sh) (sh)[0], (sh)[1], (sh)[2], (sh)[3]
/* Set in the parent before run(): the ranks call the `_packed` entry points on weights they
 * pack themselves (g_packed), at ISA level g_isa (-1: the best). */
static int g_packed, g_isa = -1;
/* The SiTU calls (g_situ; DeepGEMM's K3 betas) instead of SwiGLU with clamp 10, in the ranks and
 * in the unfused chain. */
static int g_situ;
#define SITU_BETA 4.0f
#define SITU_LINEAR_BETA 25.0f

/* Results shared with the parent. */
typedef struct shared_out {
    pthread_barrier_t bar;
    int status[MAXR][3];
    char msg[MAXR][3][256];
    uint16_t y[N][H];
    int32_t stats[E];
    uint16_t y_unfused[N][H], y_ref[N][H]; /* computed in a child too (see in_child) */
    int32_t stats_ref[E];
    int child_failures;
} shared_out;
static shared_out *g_out;

static int split(int R, int r, int *first) { /* uneven token counts, rank 1 of 4 gets none */
    static const int cuts[5][MAXR + 1] = {{0}, {0, N}, {0, 11, N}, {0}, {0, 9, 9, 20, N}};
    *first = cuts[R][r];
    return cuts[R][r + 1] - cuts[R][r];
}

static void make_problem(tu_rng *rng) {
    for (int t = 0; t < N; ++t) {
        for (int c = 0; c < H; ++c) {
            uint8_t v = (uint8_t)tu_randint(rng, 0, 255);
            if ((v & 0x7f) == 0x7f)
                v ^= 1; /* no NaN codes */
            g_x[t][c] = v;
            g_xb[t][c] = dg_float_to_bf16((float)tu_normal(rng));
        }
        for (int s = 0; s < SFC; ++s) {
            uint32_t w = 0;
            for (int b = 0; b < 4; ++b)
                w |= (uint32_t)(120 + tu_randint(rng, 0, 6)) << (8 * b);
            g_xsf[t][s] = (int32_t)w;
        }
        for (int j = 0; j < K; ++j) {
            int64_t e;
            do
                e = tu_randint(rng, -1, E - 1);
            while (e == 5); /* expert 5 never receives a token */
            for (int i = 0; i < j; ++i)
                if (g_idx[t][i] == e && e >= 0)
                    e = -1;
            g_idx[t][j] = e;
            g_w[t][j] = e < 0 ? 0.0f : (float)tu_uniform(rng);
        }
    }
    g_l1 = tu_alloc3(DG_FP4_E2M1X2, E, 2 * I, H / 2);
    g_l2 = tu_alloc3(DG_FP4_E2M1X2, E, H, I / 2);
    g_l1sf = tu_alloc3(DG_FLOAT32, E, 2 * I, (H + 31) / 32);
    g_l2sf = tu_alloc3(DG_FLOAT32, E, H, (I + 31) / 32);
    g_l1b = tu_alloc3(DG_BFLOAT16, E, 2 * I, H);
    g_l2b = tu_alloc3(DG_BFLOAT16, E, H, I);
    const dg_tensor *bytes[] = {&g_l1, &g_l2};
    for (int i = 0; i < 2; ++i)
        for (int64_t k = 0; k < dg_tensor_numel(bytes[i]); ++k)
            ((uint8_t *)bytes[i]->data)[k] = (uint8_t)tu_randint(rng, 0, 255);
    const dg_tensor *sfs[] = {&g_l1sf, &g_l2sf};
    for (int i = 0; i < 2; ++i)
        for (int64_t k = 0; k < dg_tensor_numel(sfs[i]); ++k)
            ((float *)sfs[i]->data)[k] = ldexpf(1.0f, (int)tu_randint(rng, -8, -4));
    g_sh1 = tu_alloc2(DG_FLOAT8_E4M3, 2 * S * I, H);
    g_sh2 = tu_alloc2(DG_FLOAT8_E4M3, H, S * I);
    g_sh1sf = tu_alloc2(DG_FLOAT32, 2 * S * I, (H + 31) / 32);
    g_sh2sf = tu_alloc2(DG_FLOAT32, H, (S * I + 31) / 32);
    const dg_tensor *codes[] = {&g_sh1, &g_sh2};
    for (int i = 0; i < 2; ++i)
        for (int64_t k = 0; k < dg_tensor_numel(codes[i]); ++k) {
            const uint8_t v = (uint8_t)tu_randint(rng, 0, 255);
            ((uint8_t *)codes[i]->data)[k] = (v & 0x7f) == 0x7f ? (uint8_t)(v ^ 1) : v;
        }
    const dg_tensor *ssf[] = {&g_sh1sf, &g_sh2sf};
    for (int i = 0; i < 2; ++i)
        for (int64_t k = 0; k < dg_tensor_numel(ssf[i]); ++k)
            ((float *)ssf[i]->data)[k] = ldexpf(1.0f, (int)tu_randint(rng, -12, -9));
    const dg_tensor *bf[] = {&g_l1b, &g_l2b};
    for (int i = 0; i < 2; ++i)
        for (int64_t k = 0; k < dg_tensor_numel(bf[i]); ++k)
            ((uint16_t *)bf[i]->data)[k] = dg_float_to_bf16(0.05f * (float)tu_normal(rng));
}

/* Experts [e0, e0 + n) of a global [E, ...] weight tensor. */
static dg_tensor experts(const dg_tensor *t, int64_t e0, int64_t n) {
    dg_tensor v = *t;
    v.data = (char *)t->data + e0 * t->strides[0] * (int64_t)dg_dtype_size(t->dtype);
    v.shape[0] = n;
    return v;
}

static dg_mega_moe_config config(int R, int r, int fp8) {
    return (dg_mega_moe_config){.num_ranks = R, .rank = r, .num_experts = E, .num_max_tokens_per_rank = TMAX,
                                .num_topk = K, .hidden = H, .intermediate_hidden = I,
                                .mma = fp8 ? DG_MEGA_MOE_FP8XFP4 : DG_MEGA_MOE_BF16XBF16};
}

/* What a rank does in one scenario. */
typedef enum mode {
    M_OK, M_BAD_Y_ON_1, M_BAD_TOPK_ON_0, M_EXIT_ON_1, M_CFG_MISMATCH, M_BF16, M_WRONG_VARIANT_ON_1, M_SHARED
} mode;

static void put_inputs(dg_symm_buffer *b, int first, int n, int fp8, int bad_topk) {
    dg_tensor v;
    dg_symm_buffer_view(b, "x", &v);
    for (int t = 0; t < n; ++t)
        memcpy((char *)v.data + t * v.strides[0] * (int64_t)dg_dtype_size(v.dtype),
               fp8 ? (void *)g_x[first + t] : (void *)g_xb[first + t], fp8 ? H : 2 * H);
    if (fp8) {
        dg_symm_buffer_view(b, "x_sf", &v);
        memcpy(v.data, g_xsf[first], (size_t)n * SFC * 4);
    }
    dg_symm_buffer_view(b, "topk_idx", &v);
    memcpy(v.data, g_idx[first], (size_t)n * K * 8);
    if (bad_topk && n > 0)
        ((int64_t *)v.data)[n * K - 1] = E;
    dg_symm_buffer_view(b, "topk_weights", &v);
    memcpy(v.data, g_w[first], (size_t)n * K * 4);
}

/* This rank's weights pre-packed (routed grouped, shared dense) and the `_packed` call. */
typedef struct packed_weights {
    dg_packed_b *l1, *l2, *sh1, *sh2;
} packed_weights;

static void pack_rank(int fp8, const dg_tensor *l1, const dg_tensor *l1sf, const dg_tensor *l2, const dg_tensor *l2sf,
                      const dg_tensor *const *sh, packed_weights *p) {
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 1, o.recipe[2] = 32;
    memset(p, 0, sizeof *p);
    if (dg_pack_b_grouped(l1, fp8 ? l1sf : NULL, &o, &p->l1) != DG_OK ||
        dg_pack_b_grouped(l2, fp8 ? l2sf : NULL, &o, &p->l2) != DG_OK ||
        (sh[0] && (dg_pack_b(sh[0], sh[1], &o, &p->sh1) != DG_OK || dg_pack_b(sh[2], sh[3], &o, &p->sh2) != DG_OK))) {
        fprintf(stderr, "packing failed: %s\n", dg_last_error());
        _exit(3);
    }
}

static dg_status call_packed(int fp8, const dg_tensor *y, const packed_weights *p, dg_symm_buffer *b,
                             const dg_tensor *stats) {
    if (g_situ)
        return dg_fp8_fp4_mega_moe_packed_situ(y, p->l1, p->l2, p->sh1, p->sh2, b, stats, SITU_BETA, SITU_LINEAR_BETA);
    return fp8 ? dg_fp8_fp4_mega_moe_packed(y, p->l1, p->l2, p->sh1, p->sh2, b, stats, 10.0f)
               : dg_bf16_mega_moe_packed(y, p->l1, p->l2, p->sh1, p->sh2, b, stats, 10.0f);
}

static void rank_main(int R, int r, mode m, int threads, const char *name) {
    const int fp8 = m != M_BF16;
    if (g_isa >= 0 && dg_set_isa((dg_isa)g_isa) != DG_OK)
        _exit(4);
    dg_set_num_sms(threads);
    if (threads == 2)
        dg_mega_moe_set_wave_rows(2 + r); /* experts split into several waves: the same bits */
    dg_mega_moe_config cfg = config(R, r, fp8);
    const dg_tensor *sh[4] = {NULL, NULL, NULL, NULL};
    if (m == M_SHARED) {
        cfg.num_shared_experts = S;
        sh[0] = &g_sh1, sh[1] = &g_sh1sf, sh[2] = &g_sh2, sh[3] = &g_sh2sf;
    }
    if (m == M_CFG_MISMATCH && r == R - 1)
        cfg.intermediate_hidden = 2 * I;
    dg_symm_buffer *b = NULL;
    int *st = g_out->status[r];
    st[0] = dg_symm_buffer_create(&cfg, name, &b);
    snprintf(g_out->msg[r][0], 256, "%s", dg_last_error());
    pthread_barrier_wait(&g_out->bar);
    st[1] = st[0] == DG_OK ? (int)dg_symm_buffer_attach(b) : st[0];
    snprintf(g_out->msg[r][1], 256, "%s", dg_last_error());
    pthread_barrier_wait(&g_out->bar);
    if (st[1] != DG_OK || dg_symm_buffer_seal(b) != DG_OK) {
        dg_symm_buffer_destroy(b);
        _exit(0);
    }
    if (m == M_EXIT_ON_1 && r == 1)
        _exit(0); /* dies without calling */

    int first, n = split(R, r, &first);
    put_inputs(b, first, n, fp8, m == M_BAD_TOPK_ON_0 && r == 0);
    uint16_t ybuf[TMAX + 1][H];
    for (int t = 0; t <= TMAX; ++t)
        for (int c = 0; c < H; ++c)
            ybuf[t][c] = 0x7fc1; /* sentinel NaN: must stay when the call fails */
    int rows = n;
    if (m == M_BAD_Y_ON_1 && r == 1)
        rows = TMAX + 1;
    dg_tensor y = dg_tensor_2d(ybuf, DG_BFLOAT16, rows, H);
    const int64_t epr = E / R;
    int32_t stats[E];
    for (int e = 0; e < epr; ++e)
        stats[e] = 100 * e;
    dg_tensor s = dg_tensor_1d(stats, DG_INT32, epr);
    dg_tensor l1 = experts(fp8 ? &g_l1 : &g_l1b, r * epr, epr), l2 = experts(fp8 ? &g_l2 : &g_l2b, r * epr, epr);
    dg_tensor l1sf = experts(&g_l1sf, r * epr, epr), l2sf = experts(&g_l2sf, r * epr, epr);
    packed_weights pw = {0};
    if (g_packed)
        pack_rank(fp8, &l1, &l1sf, &l2, &l2sf, sh, &pw);
    if (m == M_WRONG_VARIANT_ON_1 && r == 1)
        st[2] = dg_bf16_mega_moe(&y, &l1, &l2, NULL, NULL, b, &s, 10.0f);
    else if (g_packed)
        st[2] = call_packed(fp8, &y, &pw, b, &s);
    else if (fp8)
        st[2] = g_situ ? dg_fp8_fp4_mega_moe_situ(&y, &l1, &l1sf, &l2, &l2sf, SH(sh), b, &s, SITU_BETA, SITU_LINEAR_BETA)
                       : dg_fp8_fp4_mega_moe(&y, &l1, &l1sf, &l2, &l2sf, SH(sh), b, &s, 10.0f);
    else
        st[2] = dg_bf16_mega_moe(&y, &l1, &l2, NULL, NULL, b, &s, 10.0f);
    snprintf(g_out->msg[r][2], 256, "%s", dg_last_error());
    int untouched = 1;
    for (int t = 0; t <= TMAX; ++t)
        for (int c = 0; c < H; ++c)
            untouched &= ybuf[t][c] == 0x7fc1;
    if (st[2] == DG_OK) {
        memcpy(g_out->y[first], ybuf, (size_t)n * H * 2);
        for (int e = 0; e < epr; ++e)
            g_out->stats[r * epr + e] = stats[e] - 100 * e;
        /* A second call on the same buffer with the routing of the first gives the same y. */
        uint16_t y2[TMAX][H];
        dg_tensor yy = dg_tensor_2d(y2, DG_BFLOAT16, n, H);
        const int st2 = g_packed ? call_packed(fp8, &yy, &pw, b, NULL)
                        : g_situ ? dg_fp8_fp4_mega_moe_situ(&yy, &l1, &l1sf, &l2, &l2sf, SH(sh), b, NULL, SITU_BETA,
                                                            SITU_LINEAR_BETA)
                        : fp8   ? dg_fp8_fp4_mega_moe(&yy, &l1, &l1sf, &l2, &l2sf, SH(sh), b, NULL, 10.0f)
                                : dg_bf16_mega_moe(&yy, &l1, &l2, NULL, NULL, b, NULL, 10.0f);
        if (st2 != DG_OK || memcmp(y2, ybuf, (size_t)n * H * 2) != 0) {
            st[2] = 100 + (int)st2; /* reported by the parent, with the second call's message */
            snprintf(g_out->msg[r][2], 256, "second call: %s", st2 != DG_OK ? dg_last_error() : "y differs");
        }
    } else if (!untouched) {
        st[2] = 200; /* a failed call wrote y */
    } else if (m == M_BAD_Y_ON_1 || m == M_BAD_TOPK_ON_0 || m == M_WRONG_VARIANT_ON_1) {
        /* the buffer stays usable: a valid call now succeeds on every rank */
        put_inputs(b, first, n, fp8, 0);
        dg_tensor yy = dg_tensor_2d(ybuf, DG_BFLOAT16, n, H);
        const int st2 = dg_fp8_fp4_mega_moe(&yy, &l1, &l1sf, &l2, &l2sf, SH(sh), b, NULL, 10.0f);
        if (st2 != DG_OK)
            st[2] = 300 + (int)st2;
    }
    dg_packed_b_free(pw.l1), dg_packed_b_free(pw.l2), dg_packed_b_free(pw.sh1), dg_packed_b_free(pw.sh2);
    dg_symm_buffer_destroy(b);
    _exit(0);
}

/* Runs R ranks; returns 0 when every child exited normally. */
static int run(int R, mode m, int threads) {
    static int seq;
    char name[64];
    snprintf(name, sizeof name, "test.%d.%d", (int)getpid(), seq++);
    memset(g_out->status, -1, sizeof g_out->status);
    memset(g_out->msg, 0, sizeof g_out->msg);
    memset(g_out->y, 0xff, sizeof g_out->y);
    pthread_barrierattr_t at;
    pthread_barrierattr_init(&at);
    pthread_barrierattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&g_out->bar, &at, (unsigned)R);
    pid_t pids[MAXR];
    for (int r = 0; r < R; ++r) {
        pids[r] = fork();
        if (pids[r] == 0)
            rank_main(R, r, m, threads, name);
    }
    int bad = 0;
    for (int r = 0; r < R; ++r) {
        int ws;
        waitpid(pids[r], &ws, 0);
        bad |= !WIFEXITED(ws) || WEXITSTATUS(ws) != 0;
    }
    pthread_barrier_destroy(&g_out->bar);
    return bad;
}

/* The unfused chain on public kernels: per rank, gather its experts' pairs into the m-grouped
 * contiguous layout, L1 GEMM, SwiGLU + quantisation (the reference's steps), L2 GEMM, combine. */
/* The reference quantizer's power-of-two float scales of n elements as packed UE8M0 words
 * (byte g of word q: block 4q + g's exponent; a partial word padded with 1.0), the form in which
 * the fused call hands its activations' scales to the L2 GEMM (deepgemm.h). */
static void pack_ue8m0(const float *sf, int64_t n, int32_t *words) {
    const int64_t blocks = (n + 31) / 32;
    for (int64_t q = 0; q < (blocks + 3) / 4; ++q) {
        uint32_t w = 0;
        for (int g = 0; g < 4; ++g) {
            uint32_t e = 127; /* 1.0 */
            if (4 * q + g < blocks) {
                uint32_t bits;
                memcpy(&bits, &sf[4 * q + g], 4);
                e = (bits >> 23) & 0xffu;
            }
            w |= e << (8 * g);
        }
        words[q] = (int32_t)w;
    }
}

static void unfused(int R, int fp8, int shared, uint16_t (*y)[H]) {
    static uint16_t sh_h[N][2 * S * I], sh_o[N][H];
    static uint8_t sh_act[N][S * I];
    static float sh_sf[N][(S * I + 31) / 32];
    static uint16_t o[N][K][H];
    static uint8_t a_in[N * K][H];
    static uint16_t a_inb[N * K][H];
    static int32_t sf_in[N * K][SFC], layout[N * K];
    static uint16_t h[N * K][2 * I], ob[N * K][H];
    static uint8_t act[N * K][I];
    static uint16_t actb[N * K][I];
    static float act_sf[N * K][(I + 31) / 32];
    static int32_t act_w[N * K][(I + 127) / 128], sh_w[N][(S * I + 127) / 128];
    static int src[N * K][2];
    const int64_t epr = E / R;
    memset(o, 0, sizeof o);
    for (int r = 0; r < R; ++r) {
        int rows = 0;
        for (int64_t e = r * epr; e < (r + 1) * epr; ++e)
            for (int t = 0; t < N; ++t) /* (source rank, token) order == global token order */
                for (int j = 0; j < K; ++j)
                    if (g_idx[t][j] == e) {
                        memcpy(a_in[rows], g_x[t], H);
                        memcpy(a_inb[rows], g_xb[t], 2 * H);
                        memcpy(sf_in[rows], g_xsf[t], SFC * 4);
                        layout[rows] = (int32_t)(e - r * epr);
                        src[rows][0] = t, src[rows][1] = j;
                        ++rows;
                    }
        if (rows == 0)
            continue;
        dg_gemm_options opts = dg_gemm_options_default();
        opts.recipe[0] = 1, opts.recipe[1] = 1, opts.recipe[2] = 32;
        dg_tensor gl = dg_tensor_1d(layout, DG_INT32, rows), hd = dg_tensor_2d(h, DG_BFLOAT16, rows, 2 * I);
        dg_tensor od = dg_tensor_2d(ob, DG_BFLOAT16, rows, H);
        dg_tensor l1 = experts(fp8 ? &g_l1 : &g_l1b, r * epr, epr), l2 = experts(fp8 ? &g_l2 : &g_l2b, r * epr, epr);
        dg_tensor l1sf = experts(&g_l1sf, r * epr, epr), l2sf = experts(&g_l2sf, r * epr, epr);
        if (fp8) {
            dg_tensor a = dg_tensor_2d(a_in, DG_FLOAT8_E4M3, rows, H), sa = dg_tensor_2d(sf_in, DG_INT32, rows, SFC);
            TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&a, &sa, &l1, &l1sf, &hd, &gl, &opts));
        } else {
            dg_tensor a = dg_tensor_2d(a_inb, DG_BFLOAT16, rows, H);
            TU_CHECK_OK(dg_m_grouped_bf16_gemm_nt_contiguous(&a, &l1, &hd, &gl, NULL));
        }
        for (int i = 0; i < rows; ++i) {
            float hf[2 * I], af[I];
            for (int k = 0; k < 2 * I; ++k)
                hf[k] = dg_bf16_to_float(h[i][k]);
            if (g_situ)
                dg_ref_mega_moe_situ(hf, I, SITU_BETA, SITU_LINEAR_BETA, g_w[src[i][0]][src[i][1]], af);
            else
                dg_ref_mega_moe_swiglu(hf, I, dg_bf16_to_float(dg_float_to_bf16(10.0f)), g_w[src[i][0]][src[i][1]], af);
            if (fp8) {
                dg_ref_mega_moe_quantize_fp8(af, I, act[i], act_sf[i], NULL);
                pack_ue8m0(act_sf[i], I, act_w[i]);
            } else
                for (int k = 0; k < I; ++k)
                    actb[i][k] = dg_float_to_bf16(af[k]);
        }
        if (fp8) {
            dg_tensor a = dg_tensor_2d(act, DG_FLOAT8_E4M3, rows, I);
            dg_tensor sa = dg_tensor_2d(act_w, DG_INT32, rows, (I + 127) / 128);
            TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&a, &sa, &l2, &l2sf, &od, &gl, &opts));
        } else {
            dg_tensor a = dg_tensor_2d(actb, DG_BFLOAT16, rows, I);
            TU_CHECK_OK(dg_m_grouped_bf16_gemm_nt_contiguous(&a, &l2, &od, &gl, NULL));
        }
        for (int i = 0; i < rows; ++i)
            memcpy(o[src[i][0]][src[i][1]], ob[i], 2 * H);
    }
    if (shared) { /* the shared experts on every token, one dense GEMM per layer */
        dg_gemm_options opts = dg_gemm_options_default();
        opts.recipe[0] = 1, opts.recipe[1] = 1, opts.recipe[2] = 32;
        dg_tensor a = dg_tensor_2d(g_x, DG_FLOAT8_E4M3, N, H), sa = dg_tensor_2d(g_xsf, DG_INT32, N, SFC);
        dg_tensor hd = dg_tensor_2d(sh_h, DG_BFLOAT16, N, 2 * S * I), od = dg_tensor_2d(sh_o, DG_BFLOAT16, N, H);
        TU_CHECK_OK(dg_fp8_fp4_gemm_nt(&a, &sa, &g_sh1, &g_sh1sf, &hd, NULL, &opts));
        for (int t = 0; t < N; ++t) {
            float hf[2 * S * I], af[S * I];
            for (int k = 0; k < 2 * S * I; ++k)
                hf[k] = dg_bf16_to_float(sh_h[t][k]);
            if (g_situ)
                dg_ref_mega_moe_situ(hf, S * I, SITU_BETA, SITU_LINEAR_BETA, 1.0f, af);
            else
                dg_ref_mega_moe_swiglu(hf, S * I, dg_bf16_to_float(dg_float_to_bf16(10.0f)), 1.0f, af);
            dg_ref_mega_moe_quantize_fp8(af, S * I, sh_act[t], sh_sf[t], NULL);
            pack_ue8m0(sh_sf[t], S * I, sh_w[t]);
        }
        dg_tensor a2 = dg_tensor_2d(sh_act, DG_FLOAT8_E4M3, N, S * I);
        dg_tensor s2 = dg_tensor_2d(sh_w, DG_INT32, N, (S * I + 127) / 128);
        TU_CHECK_OK(dg_fp8_fp4_gemm_nt(&a2, &s2, &g_sh2, &g_sh2sf, &od, NULL, &opts));
    }
    for (int t = 0; t < N; ++t) { /* combine: the shared row first, then the slots in order */
        const uint16_t *slots[K + 1];
        slots[0] = shared ? sh_o[t] : NULL;
        for (int j = 0; j < K; ++j)
            slots[1 + j] = g_idx[t][j] >= 0 ? o[t][j] : NULL;
        dg_mega_moe_combine_row(slots, K + 1, H, y[t]);
    }
}

/* The reference on the global problem as one rank; y and stats. */
static void reference(int fp8, uint16_t (*y)[H], int32_t *stats) {
    dg_tensor x = dg_tensor_2d(fp8 ? (void *)g_x : (void *)g_xb, fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16, N, H);
    dg_tensor xsf = dg_tensor_2d(g_xsf, DG_INT32, N, SFC), idx = dg_tensor_2d(g_idx, DG_INT64, N, K);
    dg_tensor w = dg_tensor_2d(g_w, DG_FLOAT32, N, K), yt = dg_tensor_2d(y, DG_BFLOAT16, N, H);
    memset(stats, 0, E * 4);
    dg_tensor st = dg_tensor_1d(stats, DG_INT32, E);
    const dg_tensor *px = &x, *pxsf = &xsf, *pidx = &idx, *pw = &w, *py = &yt, *pst = &st;
    const dg_tensor *pl1 = fp8 ? &g_l1 : &g_l1b, *pl2 = fp8 ? &g_l2 : &g_l2b, *pl1sf = &g_l1sf, *pl2sf = &g_l2sf;
    if (fp8)
        TU_CHECK_OK(dg_fp8_fp4_mega_moe_reference(1, E, &px, &pxsf, &pidx, &pw, &pl1, &pl1sf, &pl2, &pl2sf, &py,
                                                  &pst, 10.0f));
    else
        TU_CHECK_OK(dg_bf16_mega_moe_reference(1, E, &px, &pidx, &pw, &pl1, &pl2, &py, &pst, 10.0f));
}

/* libgomp's thread pool does not survive fork(): the parent never runs a kernel, children do
 * (the ranks, and this helper for the unfused chain and the reference). */
static void in_child(int R, int fp8, int what) {
    const pid_t pid = fork();
    if (pid == 0) {
        const int before = tu_failed;
        if (what == 0 || what == 2)
            unfused(R, fp8, what == 2, g_out->y_unfused);
        else
            reference(fp8, g_out->y_ref, g_out->stats_ref);
        g_out->child_failures += tu_failed - before;
        _exit(0);
    }
    int ws;
    waitpid(pid, &ws, 0);
    TU_CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "checker child crashed");
}

static double diff_bf16(uint16_t (*a)[H], uint16_t (*b)[H]) {
    static float fa[N * H], fb[N * H];
    for (int t = 0; t < N; ++t)
        for (int c = 0; c < H; ++c)
            fa[t * H + c] = dg_bf16_to_float(a[t][c]), fb[t * H + c] = dg_bf16_to_float(b[t][c]);
    return tu_calc_diff(fa, fb, (size_t)N * H);
}

static void test_results(int fp8) {
    static uint16_t first[N][H];
    uint16_t (*yu)[H] = g_out->y_unfused, (*yr)[H] = g_out->y_ref;
    const int32_t *sr = g_out->stats_ref;
    const size_t sr_bytes = sizeof g_out->stats_ref;
    in_child(1, fp8, 1);
    const int Rs[] = {1, 2, 4};
    for (int ri = 0; ri < 3; ++ri)
        for (int threads = 1; threads <= 2; ++threads) {
            const int R = Rs[ri];
            TU_CHECK(run(R, fp8 ? M_OK : M_BF16, threads) == 0, "R=%d: a rank crashed", R);
            for (int r = 0; r < R; ++r)
                TU_CHECK(g_out->status[r][2] == DG_OK, "%s R=%d threads=%d rank %d: status %d: %s",
                         fp8 ? "fp8" : "bf16", R, threads, r, g_out->status[r][2], g_out->msg[r][2]);
            if (ri == 0 && threads == 1) {
                memcpy(first, g_out->y, sizeof first);
                TU_CHECK(memcmp(g_out->stats, sr, sr_bytes) == 0, "recv stats differ from the reference");
                in_child(1, fp8, 0);
                TU_CHECK(memcmp(yu, first, sizeof first) == 0, "R=1: fused differs from the unfused chain");
                const double d = diff_bf16(first, yr);
                TU_CHECK(d < (fp8 ? 1e-3 : 1e-5), "calc_diff against the reference %g", d);
            } else {
                TU_CHECK(memcmp(g_out->y, first, sizeof first) == 0, "R=%d threads=%d: y differs from R=1", R,
                         threads);
                TU_CHECK(memcmp(g_out->stats, sr, sr_bytes) == 0, "R=%d: recv stats differ", R);
            }
            if (threads == 1 && R > 1) {
                in_child(R, fp8, 0);
                TU_CHECK(memcmp(yu, first, sizeof first) == 0, "R=%d: unfused chain differs", R);
            }
        }
    /* A token without experts gets zeros. */
    int seen = 0;
    for (int t = 0; t < N; ++t)
        if (g_idx[t][0] < 0 && g_idx[t][1] < 0 && g_idx[t][2] < 0) {
            seen = 1;
            for (int c = 0; c < H; ++c)
                TU_CHECK(first[t][c] == 0, "token %d without experts: y != 0", t);
        }
    (void)seen;
}

/* Shared experts fused: bitwise across rank counts and against the unfused chain with the shared
 * rows summed first; the shared part really contributes (y differs from the routed-only y). */
static void test_shared(void) {
    static uint16_t first[N][H], routed[N][H];
    TU_CHECK(run(1, M_OK, 1) == 0, "routed-only run crashed");
    memcpy(routed, g_out->y, sizeof routed);
    const int Rs[] = {1, 2, 4};
    for (int ri = 0; ri < 3; ++ri) {
        const int R = Rs[ri];
        TU_CHECK(run(R, M_SHARED, 1 + ri % 2) == 0, "shared R=%d: a rank crashed", R);
        for (int r = 0; r < R; ++r)
            TU_CHECK(g_out->status[r][2] == DG_OK, "shared R=%d rank %d: %d %s", R, r, g_out->status[r][2],
                     g_out->msg[r][2]);
        if (ri == 0) {
            memcpy(first, g_out->y, sizeof first);
            in_child(1, 1, 2);
            TU_CHECK(memcmp(g_out->y_unfused, first, sizeof first) == 0, "shared: fused differs from the unfused chain");
            TU_CHECK(memcmp(routed, first, sizeof first) != 0, "shared experts changed nothing");
        } else {
            TU_CHECK(memcmp(g_out->y, first, sizeof first) == 0, "shared R=%d: y differs from R=1", R);
        }
    }
}

/* The `_packed` calls on every ISA level of this CPU: bitwise the unpacked call's y at that
 * level, for 1 and 2 ranks, 1 and 2 threads (several waves per expert), FP8 x FP4 with and
 * without shared experts and BF16; recv stats as the reference's. */
static void test_packed(void) {
    static uint16_t unpacked[N][H];
    const mode modes[3] = {M_OK, M_SHARED, M_BF16};
    for (int isa = DG_ISA_GENERIC; isa <= DG_ISA_AMX; ++isa) {
        if (dg_set_isa((dg_isa)isa) != DG_OK)
            continue;
        g_isa = isa;
        for (int mi = 0; mi < 3; ++mi) {
            g_packed = 0;
            TU_CHECK(run(1, modes[mi], 1) == 0 && g_out->status[0][2] == DG_OK, "%s mode %d unpacked: %d %s",
                     dg_isa_name((dg_isa)isa), mi, g_out->status[0][2], g_out->msg[0][2]);
            memcpy(unpacked, g_out->y, sizeof unpacked);
            g_packed = 1;
            for (int R = 1; R <= 2; ++R)
                for (int threads = 1; threads <= 2; ++threads) {
                    TU_CHECK(run(R, modes[mi], threads) == 0, "%s packed R=%d: a rank crashed", dg_isa_name((dg_isa)isa),
                             R);
                    for (int r = 0; r < R; ++r)
                        TU_CHECK(g_out->status[r][2] == DG_OK, "%s mode %d packed R=%d threads=%d rank %d: %d %s",
                                 dg_isa_name((dg_isa)isa), mi, R, threads, r, g_out->status[r][2], g_out->msg[r][2]);
                    TU_CHECK(memcmp(g_out->y, unpacked, sizeof unpacked) == 0,
                             "%s mode %d packed R=%d threads=%d: y differs from the unpacked call's",
                             dg_isa_name((dg_isa)isa), mi, R, threads);
                    TU_CHECK(memcmp(g_out->stats, g_out->stats_ref, sizeof g_out->stats_ref) == 0,
                             "%s packed: recv stats differ from the reference's", dg_isa_name((dg_isa)isa));
                }
        }
    }
    g_packed = 0, g_isa = -1;
    dg_cpu_info ci;
    TU_CHECK_OK(dg_get_cpu_info(&ci));
    TU_CHECK_OK(dg_set_isa(ci.best_isa));
}

/* Bad pre-packed weights, on one rank (no kernel runs in this process): wrong group count,
 * dense vs grouped, wrong dtype or recipe, shapes, another ISA, shared weights
 * missing or unexpected, the reference backend; nothing written. */
static void test_packed_bad(void) {
    dg_mega_moe_config one = config(1, 0, 1);
    one.num_shared_experts = S;
    char name[64];
    snprintf(name, sizeof name, "packedbad.%d", (int)getpid());
    dg_symm_buffer *b = NULL;
    TU_CHECK_OK(dg_symm_buffer_create(&one, name, &b));
    TU_CHECK_OK(dg_symm_buffer_attach(b));
    TU_CHECK_OK(dg_symm_buffer_seal(b));
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 1, o.recipe[2] = 32;
    const dg_tensor L1 = experts(&g_l1, 0, E), L2 = experts(&g_l2, 0, E), L1s = experts(&g_l1sf, 0, E),
                    L2s = experts(&g_l2sf, 0, E), half = experts(&g_l1, 0, E / 2), halfs = experts(&g_l1sf, 0, E / 2);
    const dg_tensor L1b = experts(&g_l1b, 0, E), L2b = experts(&g_l2b, 0, E);
    dg_packed_b *p1, *p2, *s1, *s2, *few, *dense, *bf1, *bf2, *coarse, *sg;
    TU_CHECK_OK(dg_pack_b_grouped(&L1, &L1s, &o, &p1));
    TU_CHECK_OK(dg_pack_b_grouped(&L2, &L2s, &o, &p2));
    TU_CHECK_OK(dg_pack_b(&g_sh1, &g_sh1sf, &o, &s1));
    TU_CHECK_OK(dg_pack_b(&g_sh2, &g_sh2sf, &o, &s2));
    TU_CHECK_OK(dg_pack_b_grouped(&half, &halfs, &o, &few));
    dg_tensor g1 = g_sh1, g1s = g_sh1sf; /* the shared L1 as one group: grouped, not dense */
    for (dg_tensor *t = &g1; t; t = t == &g1 ? &g1s : NULL) {
        t->ndim = 3, t->shape[2] = t->shape[1], t->shape[1] = t->shape[0], t->shape[0] = 1;
        t->strides[2] = t->strides[1], t->strides[1] = t->strides[0], t->strides[0] = t->shape[1] * t->strides[1];
    }
    TU_CHECK_OK(dg_pack_b_grouped(&g1, &g1s, &o, &sg));
    dg_tensor e0 = experts(&g_l1, 0, 1), e0s = experts(&g_l1sf, 0, 1);
    e0.ndim = 2, e0.shape[0] = e0.shape[1], e0.shape[1] = e0.shape[2], e0.strides[0] = e0.strides[1],
    e0.strides[1] = e0.strides[2];
    e0s.ndim = 2, e0s.shape[0] = e0s.shape[1], e0s.shape[1] = e0s.shape[2], e0s.strides[0] = e0s.strides[1],
    e0s.strides[1] = e0s.strides[2];
    TU_CHECK_OK(dg_pack_b(&e0, &e0s, &o, &dense));
    TU_CHECK_OK(dg_pack_b_grouped(&L1b, NULL, NULL, &bf1));
    TU_CHECK_OK(dg_pack_b_grouped(&L2b, NULL, NULL, &bf2));
    dg_gemm_options o64 = o;
    o64.recipe[2] = 64; /* scales per 1x64: the L1 scales read at half their columns */
    dg_tensor L1s64 = L1s;
    L1s64.shape[2] = (H + 63) / 64;
    TU_CHECK_OK(dg_pack_b_grouped(&L1, &L1s64, &o64, &coarse));
    static uint16_t yb[TMAX][H];
    for (int t = 0; t < TMAX; ++t)
        for (int c = 0; c < H; ++c)
            yb[t][c] = 0x7fc1;
    dg_tensor y = dg_tensor_2d(yb, DG_BFLOAT16, 2, H);
    const struct { dg_packed_b *a, *b, *c, *d; dg_status want; const char *what; } cases[] = {
        {NULL, p2, s1, s2, DG_ERR_NULL_POINTER, "l1_weights"},
        {few, p2, s1, s2, DG_ERR_VALUE, "got 4"},
        {dense, p2, s1, s2, DG_ERR_VALUE, "must hold 8 groups"},
        {p2, p2, s1, s2, DG_ERR_SHAPE, "l1_weights"},
        {bf1, bf2, s1, s2, DG_ERR_DTYPE, "bfloat16"},
        {coarse, p2, s1, s2, DG_ERR_VALUE, "granularity"},
        {p1, p2, NULL, NULL, DG_ERR_NULL_POINTER, "shared"},
        {p1, p2, s2, s2, DG_ERR_SHAPE, "shared_l1_weights"},
        {p1, p2, p1, s2, DG_ERR_DTYPE, "fp4"},
        {p1, p2, sg, s2, DG_ERR_VALUE, "dense packed B"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        TU_CHECK_STATUS(dg_fp8_fp4_mega_moe_packed(&y, cases[i].a, cases[i].b, cases[i].c, cases[i].d, b, NULL, 10.0f),
                        cases[i].want);
        TU_CHECK(strstr(dg_last_error(), cases[i].what) != NULL, "case %zu: message '%s' lacks '%s'", i,
                 dg_last_error(), cases[i].what);
    }
    TU_CHECK_STATUS(dg_bf16_mega_moe_packed(&y, bf1, bf2, NULL, NULL, b, NULL, 10.0f), DG_ERR_VALUE); /* fp8 buffer */
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    TU_CHECK_STATUS(dg_fp8_fp4_mega_moe_packed(&y, p1, p2, s1, s2, b, NULL, 10.0f), DG_ERR_UNSUPPORTED);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    const dg_isa best = dg_get_isa();
    if (best > DG_ISA_GENERIC) { /* packed for another level */
        TU_CHECK_OK(dg_set_isa(DG_ISA_GENERIC));
        TU_CHECK_STATUS(dg_fp8_fp4_mega_moe_packed(&y, p1, p2, s1, s2, b, NULL, 10.0f), DG_ERR_VALUE);
        TU_CHECK(strstr(dg_last_error(), "pack the weights again") != NULL, "isa message: %s", dg_last_error());
        TU_CHECK_OK(dg_set_isa(best));
    }
    int untouched = 1;
    for (int t = 0; t < TMAX; ++t)
        for (int c = 0; c < H; ++c)
            untouched &= yb[t][c] == 0x7fc1;
    TU_CHECK(untouched, "a refused packed call wrote y");
    dg_packed_b_free(p1), dg_packed_b_free(p2), dg_packed_b_free(s1), dg_packed_b_free(s2), dg_packed_b_free(few);
    dg_packed_b_free(sg);
    dg_packed_b_free(dense), dg_packed_b_free(bf1), dg_packed_b_free(bf2), dg_packed_b_free(coarse);
    dg_symm_buffer_destroy(b);
}

/* SiTU: bitwise the unfused chain with the reference's SiTU step (routed and shared experts),
 * the same for 1, 2 and 4 ranks and on pre-packed weights; differs from SwiGLU; bad betas. */
static void test_situ(void) {
    static uint16_t swiglu[N][H], first[N][H];
    TU_CHECK(run(1, M_SHARED, 1) == 0 && g_out->status[0][2] == DG_OK, "swiglu run");
    memcpy(swiglu, g_out->y, sizeof swiglu);
    g_situ = 1;
    const int Rs[] = {1, 2, 4};
    for (int ri = 0; ri < 3; ++ri)
        for (int packed = 0; packed < 2; ++packed) {
            g_packed = packed;
            const int R = Rs[ri];
            TU_CHECK(run(R, M_SHARED, 1 + ri % 2) == 0, "situ R=%d: a rank crashed", R);
            for (int r = 0; r < R; ++r)
                TU_CHECK(g_out->status[r][2] == DG_OK, "situ R=%d packed=%d rank %d: %d %s", R, packed, r,
                         g_out->status[r][2], g_out->msg[r][2]);
            if (ri == 0 && !packed) {
                memcpy(first, g_out->y, sizeof first);
                in_child(1, 1, 2);
                TU_CHECK(memcmp(g_out->y_unfused, first, sizeof first) == 0, "situ: fused differs from the unfused chain");
                TU_CHECK(memcmp(swiglu, first, sizeof first) != 0, "situ gives the SwiGLU result");
            } else {
                TU_CHECK(memcmp(g_out->y, first, sizeof first) == 0, "situ R=%d packed=%d: y differs from R=1", R, packed);
            }
        }
    g_situ = 0, g_packed = 0;
    /* bad betas: refused on one rank before any work (no kernel runs in this process) */
    dg_mega_moe_config one = config(1, 0, 1);
    char name[64];
    snprintf(name, sizeof name, "situbad.%d", (int)getpid());
    dg_symm_buffer *b = NULL;
    TU_CHECK_OK(dg_symm_buffer_create(&one, name, &b));
    TU_CHECK_OK(dg_symm_buffer_attach(b));
    TU_CHECK_OK(dg_symm_buffer_seal(b));
    uint16_t yb[H];
    dg_tensor y = dg_tensor_2d(yb, DG_BFLOAT16, 1, H), L1 = experts(&g_l1, 0, E), L2 = experts(&g_l2, 0, E),
              L1s = experts(&g_l1sf, 0, E), L2s = experts(&g_l2sf, 0, E);
    const float bad[4][2] = {{0.0f, 25.0f}, {4.0f, -1.0f}, {NAN, 25.0f}, {4.0f, INFINITY}};
    for (int i = 0; i < 4; ++i) {
        TU_CHECK_STATUS(dg_fp8_fp4_mega_moe_situ(&y, &L1, &L1s, &L2, &L2s, NULL, NULL, NULL, NULL, b, NULL, bad[i][0],
                                                 bad[i][1]),
                        DG_ERR_VALUE);
        TU_CHECK(strstr(dg_last_error(), "situ_beta") != NULL, "bad betas message: %s", dg_last_error());
    }
    dg_symm_buffer_destroy(b);

    /* fp8xfp8 buffers take FP8 routed weights only, no SiTU; the bf16 call refuses them too */
    dg_mega_moe_config c8 = config(1, 0, 1);
    c8.mma = DG_MEGA_MOE_FP8XFP8;
    snprintf(name, sizeof name, "fp8bad.%d", (int)getpid());
    TU_CHECK_OK(dg_symm_buffer_create(&c8, name, &b));
    TU_CHECK_OK(dg_symm_buffer_attach(b));
    TU_CHECK_OK(dg_symm_buffer_seal(b));
    dg_tensor v;
    TU_CHECK_OK(dg_symm_buffer_view(b, "x_sf", &v));
    TU_CHECK_STATUS(dg_fp8_fp4_mega_moe(&y, &L1, &L1s, &L2, &L2s, NULL, NULL, NULL, NULL, b, NULL, 10.0f), DG_ERR_DTYPE);
    TU_CHECK_STATUS(dg_fp8_fp4_mega_moe_situ(&y, &L1, &L1s, &L2, &L2s, NULL, NULL, NULL, NULL, b, NULL, 4.0f, 25.0f),
                    DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "fp8xfp8") != NULL, "situ on fp8xfp8: %s", dg_last_error());
    dg_tensor B1 = experts(&g_l1b, 0, E), B2 = experts(&g_l2b, 0, E);
    TU_CHECK_STATUS(dg_bf16_mega_moe(&y, &B1, &B2, NULL, NULL, b, NULL, 10.0f), DG_ERR_VALUE);
    dg_symm_buffer_destroy(b);
    c8.mma = (dg_mega_moe_mma)3;
    TU_CHECK_STATUS(dg_symm_buffer_create(&c8, name, &b), DG_ERR_VALUE);
}

/* Activations with NaNs among finite ones (L1 scales of some gate rows so large that those
 * gates overflow to -inf: silu = -inf / inf):
 * the fused call (whose activation cast propagates NaNs into a block's scale, where the
 * reference's skips them) is still bitwise the unfused chain on the reference's steps: a NaN
 * in an activation row makes its whole L2 output row NaN either way. */
static void test_nan_activations(void) {
    const int64_t n = dg_tensor_numel(&g_l1sf);
    float *sf = (float *)g_l1sf.data, *keep = malloc((size_t)n * sizeof *keep);
    TU_CHECK(keep != NULL, "malloc");
    memcpy(keep, sf, (size_t)n * sizeof *keep);
    const int64_t cols = g_l1sf.shape[2]; /* every 7th gate row only: NaNs among finite values */
    for (int64_t i = 0; i < n; ++i)
        if ((i / cols) % (2 * I) < I && (i / cols) % 7 == 0)
            sf[i] = ldexpf(sf[i], 125);
    TU_CHECK(run(1, M_OK, 2) == 0 && g_out->status[0][2] == DG_OK, "nan run: %d %s", g_out->status[0][2],
             g_out->msg[0][2]);
    static uint16_t fused[N][H];
    memcpy(fused, g_out->y, sizeof fused);
    int nans = 0;
    for (int t = 0; t < N; ++t)
        for (int c = 0; c < H; ++c)
            nans += (fused[t][c] & 0x7fff) > 0x7f80;
    TU_CHECK(nans > 0, "the overflowing scales gave no NaN output");
    in_child(1, 1, 0);
    TU_CHECK(memcmp(g_out->y_unfused, fused, sizeof fused) == 0, "NaN activations: fused differs from the unfused chain");
    memcpy(sf, keep, (size_t)n * sizeof *keep);
    free(keep);
}

static void test_failures(void) {
    setenv("DG_COMM_TIMEOUT", "20", 1);
    TU_CHECK(run(2, M_BAD_Y_ON_1, 1) == 0, "bad y: crash");
    TU_CHECK(g_out->status[1][2] == DG_ERR_SHAPE, "bad y on rank 1: %d %s", g_out->status[1][2], g_out->msg[1][2]);
    TU_CHECK(g_out->status[0][2] == DG_ERR_VALUE && strstr(g_out->msg[0][2], "rank 1"), "peer of bad y: %d %s",
             g_out->status[0][2], g_out->msg[0][2]);

    TU_CHECK(run(4, M_BAD_TOPK_ON_0, 1) == 0, "bad topk: crash");
    for (int r = 0; r < 4; ++r)
        TU_CHECK(g_out->status[r][2] == DG_ERR_VALUE && strstr(g_out->msg[r][2], "topk_idx"),
                 "bad topk, rank %d: %d %s", r, g_out->status[r][2], g_out->msg[r][2]);

    TU_CHECK(run(2, M_WRONG_VARIANT_ON_1, 1) == 0, "wrong variant: crash");
    TU_CHECK(g_out->status[1][2] == DG_ERR_VALUE && g_out->status[0][2] == DG_ERR_VALUE,
             "bf16 call on an fp8 buffer: %d %d", g_out->status[0][2], g_out->status[1][2]);

    TU_CHECK(run(3 + 1, M_EXIT_ON_1, 1) == 0, "exit: crash");
    for (int r = 0; r < 4; ++r)
        if (r != 1)
            TU_CHECK(g_out->status[r][2] == DG_ERR_COMM && strstr(g_out->msg[r][2], "rank 1"),
                     "rank %d with rank 1 gone: %d %s", r, g_out->status[r][2], g_out->msg[r][2]);

    TU_CHECK(run(2, M_CFG_MISMATCH, 1) == 0, "mismatch: crash");
    for (int r = 0; r < 2; ++r)
        TU_CHECK(g_out->status[r][1] == DG_ERR_VALUE && strstr(g_out->msg[r][1], "intermediate_hidden"),
                 "config mismatch, rank %d: %d %s", r, g_out->status[r][1], g_out->msg[r][1]);
}

static void test_bad_configs(void) {
    dg_symm_buffer *b = (dg_symm_buffer *)1;
    dg_mega_moe_config c = config(2, 0, 1);
    TU_CHECK_STATUS(dg_symm_buffer_create(NULL, "n", &b), DG_ERR_NULL_POINTER);
    TU_CHECK(b == NULL, "out not cleared");
    TU_CHECK_STATUS(dg_symm_buffer_create(&c, "bad/name", &b), DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_symm_buffer_create(&c, "", &b), DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_symm_buffer_create(&c, NULL, &b), DG_ERR_NULL_POINTER);
    dg_mega_moe_config d = c;
    d.num_experts = 7;
    TU_CHECK_STATUS(dg_symm_buffer_create(&d, "n", &b), DG_ERR_VALUE);
    d = c, d.rank = 2;
    TU_CHECK_STATUS(dg_symm_buffer_create(&d, "n", &b), DG_ERR_VALUE);
    d = c, d.num_topk = 0;
    TU_CHECK_STATUS(dg_symm_buffer_create(&d, "n", &b), DG_ERR_VALUE);
    d = c, d.hidden = 33;
    TU_CHECK_STATUS(dg_symm_buffer_create(&d, "n", &b), DG_ERR_VALUE);
    d = c, d.num_shared_experts = 65;
    TU_CHECK_STATUS(dg_symm_buffer_create(&d, "n", &b), DG_ERR_VALUE);
    d = c, d.num_max_tokens_per_rank = (int64_t)1 << 30, d.hidden = 1 << 20, d.num_topk = 8;
    int64_t bytes = 0;
    TU_CHECK_STATUS(dg_get_symm_buffer_size_for_mega_moe(&d, &bytes), DG_ERR_OVERFLOW);
    TU_CHECK_OK(dg_get_symm_buffer_size_for_mega_moe(&c, &bytes));
    TU_CHECK(bytes > 0 && bytes % 4096 == 0, "size %lld", (long long)bytes);
    TU_CHECK(dg_get_token_alignment_for_mega_moe() >= 1, "alignment");
    /* One rank: attach before create of a peer fails cleanly, calls on an unattached buffer fail. */
    TU_CHECK_OK(dg_symm_buffer_create(&c, "lonely", &b));
    TU_CHECK_STATUS(dg_symm_buffer_attach(b), DG_ERR_COMM);
    uint16_t yb[H];
    dg_tensor y = dg_tensor_2d(yb, DG_BFLOAT16, 1, H), l1 = experts(&g_l1, 0, 4), l2 = experts(&g_l2, 0, 4);
    dg_tensor l1sf = experts(&g_l1sf, 0, 4), l2sf = experts(&g_l2sf, 0, 4);
    TU_CHECK_STATUS(dg_fp8_fp4_mega_moe(&y, &l1, &l1sf, &l2, &l2sf, NULL, NULL, NULL, NULL, b, NULL, INFINITY), DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_fp8_fp4_mega_moe(&y, &l1, &l1sf, &l2, &l2sf, NULL, NULL, NULL, NULL, NULL, NULL, INFINITY), DG_ERR_NULL_POINTER);
    dg_tensor v;
    TU_CHECK_STATUS(dg_symm_buffer_view(b, "nope", &v), DG_ERR_VALUE);
    dg_symm_buffer_destroy(b);
    dg_symm_buffer_destroy(NULL);

    /* Shared expert weights: required with num_shared_experts > 0, refused without, shapes
     * checked. One rank, so no kernel runs in this (the parent) process. */
    for (int with = 0; with < 2; ++with) {
        dg_mega_moe_config one = config(1, 0, 1);
        one.num_shared_experts = with ? S : 0;
        char name[64];
        snprintf(name, sizeof name, "shared.%d.%d", (int)getpid(), with);
        dg_symm_buffer *b1 = NULL;
        TU_CHECK_OK(dg_symm_buffer_create(&one, name, &b1));
        TU_CHECK_OK(dg_symm_buffer_attach(b1));
        TU_CHECK_OK(dg_symm_buffer_seal(b1));
        dg_tensor L1 = experts(&g_l1, 0, E), L2 = experts(&g_l2, 0, E), L1s = experts(&g_l1sf, 0, E),
                  L2s = experts(&g_l2sf, 0, E);
        if (with) {
            TU_CHECK_STATUS(dg_fp8_fp4_mega_moe(&y, &L1, &L1s, &L2, &L2s, NULL, NULL, NULL, NULL, b1, NULL, INFINITY),
                            DG_ERR_NULL_POINTER);
            TU_CHECK_STATUS(dg_fp8_fp4_mega_moe(&y, &L1, &L1s, &L2, &L2s, &g_sh2, &g_sh2sf, &g_sh2, &g_sh2sf, b1, NULL,
                                                INFINITY),
                            DG_ERR_SHAPE);
            TU_CHECK_STATUS(dg_fp8_fp4_mega_moe(&y, &L1, &L1s, &L2, &L2s, &g_sh1, NULL, &g_sh2, &g_sh2sf, b1, NULL,
                                                INFINITY),
                            DG_ERR_NULL_POINTER);
        } else {
            TU_CHECK_STATUS(dg_fp8_fp4_mega_moe(&y, &L1, &L1s, &L2, &L2s, &g_sh1, &g_sh1sf, &g_sh2, &g_sh2sf, b1, NULL,
                                                INFINITY),
                            DG_ERR_VALUE);
        }
        dg_symm_buffer_destroy(b1);
    }
}

int main(void) {
    g_out = mmap(NULL, sizeof *g_out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    TU_CHECK(g_out != MAP_FAILED, "mmap");
    tu_rng rng = {7};
    make_problem(&rng);
    test_bad_configs();
    test_results(1);
    test_results(0);
    test_shared();
    test_packed();
    test_packed_bad();
    test_situ();
    test_nan_activations();
    test_failures();
    TU_CHECK(g_out->child_failures == 0, "%d checks failed in checker children", g_out->child_failures);
    return tu_finish();
}
