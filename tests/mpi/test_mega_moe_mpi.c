/*
 * test_mega_moe_mpi.c - the fused mega MoE with ranks started by mpirun, the buffer created by
 * dg_symm_buffer_create_mpi: shared memory, or the network path under DG_COMM_FORCE_NETWORK=1.
 * Every rank generates the same global problem (uneven token counts, some ranks without
 * tokens, masked slots, an expert without tokens) and checks its part of y
 *   - bitwise against the same problem run by this process alone on a one-rank buffer (which
 *     test_mega_moe_fused.c checks bitwise against the unfused chain),
 *   - within calc_diff of the reference, and the recv stats against the reference's;
 * then the failures: a topk_idx entry out of range on the last rank, too many tokens on rank
 * 0 (an error on every rank, y untouched, the buffer usable after), and different
 * configurations at creation. Exit status 1 on any failed check, on any rank.
 */
#include "test_util.h"

#include <mpi.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { E = 8, K = 3, H = 160, I = 48, N = 37, TMAX = 40 };
#define SFC ((H + 127) / 128)

static uint8_t g_x[N][H];
static int32_t g_xsf[N][SFC];
static int64_t g_idx[N][K];
static float g_w[N][K];
static dg_tensor g_l1, g_l1sf, g_l2, g_l2sf;

static void make_problem(void) {
    tu_rng rng = {11};
    for (int t = 0; t < N; ++t) {
        for (int c = 0; c < H; ++c) {
            uint8_t v = (uint8_t)tu_randint(&rng, 0, 255);
            g_x[t][c] = (v & 0x7f) == 0x7f ? (uint8_t)(v ^ 1) : v;
        }
        for (int s = 0; s < SFC; ++s)
            g_xsf[t][s] = (int32_t)(0x7c7d7e7fu - (uint32_t)tu_randint(&rng, 0, 3) * 0x01010101u);
        for (int j = 0; j < K; ++j) {
            int64_t e;
            do
                e = tu_randint(&rng, -1, E - 1);
            while (e == 2);
            for (int i = 0; i < j; ++i)
                e = g_idx[t][i] == e ? -1 : e;
            g_idx[t][j] = e;
            g_w[t][j] = e < 0 ? 0.0f : (float)tu_uniform(&rng);
        }
    }
    g_l1 = tu_alloc3(DG_FP4_E2M1X2, E, 2 * I, H / 2);
    g_l2 = tu_alloc3(DG_FP4_E2M1X2, E, H, I / 2);
    g_l1sf = tu_alloc3(DG_FLOAT32, E, 2 * I, (H + 31) / 32);
    g_l2sf = tu_alloc3(DG_FLOAT32, E, H, (I + 31) / 32);
    for (int64_t k = 0; k < dg_tensor_numel(&g_l1); ++k)
        ((uint8_t *)g_l1.data)[k] = (uint8_t)tu_randint(&rng, 0, 255);
    for (int64_t k = 0; k < dg_tensor_numel(&g_l2); ++k)
        ((uint8_t *)g_l2.data)[k] = (uint8_t)tu_randint(&rng, 0, 255);
    for (int64_t k = 0; k < dg_tensor_numel(&g_l1sf); ++k)
        ((float *)g_l1sf.data)[k] = ldexpf(1.0f, (int)tu_randint(&rng, -8, -4));
    for (int64_t k = 0; k < dg_tensor_numel(&g_l2sf); ++k)
        ((float *)g_l2sf.data)[k] = ldexpf(1.0f, (int)tu_randint(&rng, -8, -4));
}

static dg_tensor experts(const dg_tensor *t, int64_t e0, int64_t n) {
    dg_tensor v = *t;
    v.data = (char *)t->data + e0 * t->strides[0] * (int64_t)dg_dtype_size(t->dtype);
    v.shape[0] = n;
    return v;
}

/* Uneven split: rank r gets tokens [first, first + n); with 4 ranks, rank 1 gets none. */
static int split(int R, int r, int *first) {
    int cut[9] = {0};
    for (int i = 1; i <= R; ++i)
        cut[i] = R == 4 && i == 2 ? cut[1] : (int)((int64_t)N * i * i / ((int64_t)R * R));
    cut[R] = N;
    *first = cut[r];
    return cut[r + 1] - cut[r];
}

static void put(dg_symm_buffer *b, int first, int n, int bad_last) {
    dg_tensor v;
    dg_symm_buffer_view(b, "x", &v);
    memcpy(v.data, g_x[first], (size_t)n * H);
    dg_symm_buffer_view(b, "x_sf", &v);
    memcpy(v.data, g_xsf[first], (size_t)n * SFC * 4);
    dg_symm_buffer_view(b, "topk_idx", &v);
    memcpy(v.data, g_idx[first], (size_t)n * K * 8);
    if (bad_last && n > 0)
        ((int64_t *)v.data)[n * K - 1] = -2;
    dg_symm_buffer_view(b, "topk_weights", &v);
    memcpy(v.data, g_w[first], (size_t)n * K * 4);
}

static dg_mega_moe_config config(void) {
    return (dg_mega_moe_config){.num_experts = E, .num_max_tokens_per_rank = TMAX, .num_topk = K, .hidden = H,
                                .intermediate_hidden = I, .mma = DG_MEGA_MOE_FP8XFP4};
}

static dg_status call(dg_symm_buffer *b, int R, int r, uint16_t *y, int rows, int32_t *stats) {
    const int64_t epr = E / R;
    dg_tensor yt = dg_tensor_2d(y, DG_BFLOAT16, rows, H), st = dg_tensor_1d(stats, DG_INT32, epr);
    dg_tensor l1 = experts(&g_l1, r * epr, epr), l2 = experts(&g_l2, r * epr, epr);
    dg_tensor s1 = experts(&g_l1sf, r * epr, epr), s2 = experts(&g_l2sf, r * epr, epr);
    return dg_fp8_fp4_mega_moe(&yt, &l1, &s1, &l2, &s2, NULL, NULL, NULL, NULL, b, stats ? &st : NULL, 10.0f);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int R, r;
    MPI_Comm_size(MPI_COMM_WORLD, &R);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    make_problem();
    dg_set_num_sms(1);

    /* This process alone, all tokens, one rank: the expected bits. */
    static uint16_t y_one[N][H], y[TMAX + 1][H];
    int32_t stats_one[E] = {0};
    {
        dg_mega_moe_config c = config();
        c.num_ranks = 1, c.rank = 0;
        char name[64];
        snprintf(name, sizeof name, "mpitest.%d.%d", (int)getpid(), r);
        dg_symm_buffer *one = NULL;
        TU_CHECK_OK(dg_symm_buffer_create(&c, name, &one));
        TU_CHECK_OK(dg_symm_buffer_attach(one));
        TU_CHECK_OK(dg_symm_buffer_seal(one));
        put(one, 0, N, 0);
        TU_CHECK_OK(call(one, 1, 0, &y_one[0][0], N, stats_one));
        dg_symm_buffer_destroy(one);
    }
    /* The reference, for calc_diff and stats. */
    static uint16_t y_ref[N][H];
    int32_t stats_ref[E] = {0};
    {
        dg_tensor x = dg_tensor_2d(g_x, DG_FLOAT8_E4M3, N, H), xsf = dg_tensor_2d(g_xsf, DG_INT32, N, SFC);
        dg_tensor idx = dg_tensor_2d(g_idx, DG_INT64, N, K), w = dg_tensor_2d(g_w, DG_FLOAT32, N, K);
        dg_tensor yr = dg_tensor_2d(y_ref, DG_BFLOAT16, N, H), sr = dg_tensor_1d(stats_ref, DG_INT32, E);
        const dg_tensor *px = &x, *pxsf = &xsf, *pi = &idx, *pw = &w, *py = &yr, *ps = &sr;
        const dg_tensor *p1 = &g_l1, *p1s = &g_l1sf, *p2 = &g_l2, *p2s = &g_l2sf;
        TU_CHECK_OK(dg_fp8_fp4_mega_moe_reference(1, E, &px, &pxsf, &pi, &pw, &p1, &p1s, &p2, &p2s, &py, &ps, 10.0f));
        TU_CHECK(memcmp(stats_one, stats_ref, sizeof stats_ref) == 0, "one-rank stats differ from the reference");
    }

    dg_mega_moe_config c = config();
    dg_symm_buffer *b = NULL;
    TU_CHECK_OK(dg_symm_buffer_create_mpi(&(MPI_Comm){MPI_COMM_WORLD}, &c, &b));
    int first, n = split(R, r, &first);
    const int64_t epr = E / R;
    dg_set_print_paths(2);
    dg_clear_path_report();
    for (int rep = 0; rep < 2 && b; ++rep) { /* twice: the buffer is reusable */
        put(b, first, n, 0);
        int32_t stats[E];
        for (int e = 0; e < epr; ++e)
            stats[e] = 5;
        TU_CHECK_OK(call(b, R, r, &y[0][0], n, stats));
        TU_CHECK(memcmp(y, y_one[first], (size_t)n * H * 2) == 0, "rank %d of %d: y differs from the one-rank run",
                 r, R);
        for (int e = 0; e < epr; ++e)
            TU_CHECK(stats[e] - 5 == stats_ref[r * epr + e], "rank %d: stats[%d] = %d, want %d", r, e, stats[e] - 5,
                     stats_ref[r * epr + e]);
    }
    {
        char report[4096] = {0};
        dg_get_path_report(report, sizeof report);
        const char *net = getenv("DG_COMM_FORCE_NETWORK");
        const int want_net = net && !strcmp(net, "1");
        TU_CHECK(strstr(report, want_net ? "network path (MPI)" : "shared memory") != NULL,
                 "rank %d: the path report does not show the %s path: %s", r, want_net ? "network" : "shared-memory",
                 report);
        dg_set_print_paths(0);
    }
    if (b) {
        float *a = malloc((size_t)N * H * 4), *bb = malloc((size_t)N * H * 4);
        for (int i = 0; i < N * H; ++i)
            a[i] = dg_bf16_to_float((&y_one[0][0])[i]), bb[i] = dg_bf16_to_float((&y_ref[0][0])[i]);
        const double d = tu_calc_diff(a, bb, (size_t)N * H);
        TU_CHECK(d < 1e-3, "calc_diff against the reference %g", d);
        free(a), free(bb);

        /* topk_idx out of range on the last rank: every rank fails, y untouched. */
        put(b, first, n, r == R - 1);
        memset(y, 0x5a, sizeof y);
        const dg_status s1 = call(b, R, r, &y[0][0], n, NULL);
        TU_CHECK(s1 == DG_ERR_VALUE && strstr(dg_last_error(), "topk_idx"), "bad topk: rank %d got %s: %s", r,
                 dg_status_string(s1), dg_last_error());
        /* Too many tokens on rank 0. */
        put(b, first, n, 0);
        const dg_status s2 = call(b, R, r, &y[0][0], r == 0 ? TMAX + 1 : n, NULL);
        TU_CHECK(s2 == (r == 0 ? DG_ERR_SHAPE : DG_ERR_VALUE), "bad y: rank %d got %s: %s", r, dg_status_string(s2),
                 dg_last_error());
        int untouched = 1;
        for (size_t i = 0; i < sizeof y; ++i)
            untouched &= ((unsigned char *)y)[i] == 0x5a;
        TU_CHECK(untouched, "rank %d: a failed call wrote y", r);
        TU_CHECK_OK(call(b, R, r, &y[0][0], n, NULL));
        TU_CHECK(memcmp(y, y_one[first], (size_t)n * H * 2) == 0, "rank %d: y after the failures differs", r);
    }
    dg_symm_buffer_destroy(b);

    /* Different configurations: an error on every rank. */
    if (R > 1) {
        dg_mega_moe_config d = config();
        if (r == R - 1)
            d.hidden = 2 * H;
        dg_symm_buffer *bad = (dg_symm_buffer *)1;
        const dg_status s = dg_symm_buffer_create_mpi(&(MPI_Comm){MPI_COMM_WORLD}, &d, &bad);
        TU_CHECK(s == DG_ERR_VALUE && bad == NULL && strstr(dg_last_error(), "different configurations"),
                 "mismatch: rank %d got %s: %s", r, dg_status_string(s), dg_last_error());
    }
    int failed = tu_failed, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const int rc = tu_finish();
    MPI_Finalize();
    return any ? 1 : rc;
}
