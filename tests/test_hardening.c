/*
 * test_hardening.c - regressions for issue 17: descriptors that reached undefined behaviour
 * (UBSan reports, no memory error) or checked every logical element before rejecting a size no
 * process could hold. Each case runs through the public API; built with
 * -fsanitize=undefined -fno-sanitize-recover=all, a regression aborts the program.
 */
#include "test_util.h"

#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* status `want` and a message naming `fn` and `arg` ('a', 'sf', ...). */
static void expect_fail(dg_status got, dg_status want, const char *fn, const char *arg, const char *what) {
    const char *msg = dg_last_error();
    TU_CHECK(got == want && strstr(msg, fn) && strstr(msg, arg), "%s: got %s want %s, message \"%s\" (should name %s)",
             what, dg_status_string(got), dg_status_string(want), msg, arg);
}

/* ---- FP4 extents doubled (core/operand.c) ------------------------------------------------- */

static void test_fp4_extent_doubling(void) {
    uint8_t byte[16] = {0};
    float sf[4] = {1, 1, 1, 1}, dmem[4] = {0};
    const int64_t huge = ((int64_t)1 << 62) + 1; /* twice this does not fit in int64 */
    dg_tensor sfa = dg_tensor_2d(sf, DG_FLOAT32, 1, 1), sfb = sfa;
    dg_tensor b = dg_tensor_2d(byte, DG_FP4_E2M1X2, 1, 1), d = dg_tensor_2d(dmem, DG_FLOAT32, 1, 1);
    /* K-major: pairs along K, K = 2 * shape[1] */
    dg_tensor a = dg_tensor_2d(byte, DG_FP4_E2M1X2, 1, huge);
    expect_fail(dg_fp8_fp4_gemm_nt(&a, &sfa, &b, &sfb, &d, NULL, NULL), DG_ERR_OVERFLOW, "dg_fp8_fp4_gemm_nt", "'a'",
                "FP4 K extent 2^62 + 1");
    /* MN-major: pairs along MN (unit stride there, none along K), MN = 2 * shape[0] */
    a = dg_tensor_2d(byte, DG_FP4_E2M1X2, huge, 1);
    a.strides[0] = 1, a.strides[1] = 5;
    expect_fail(dg_fp8_fp4_gemm_nt(&a, &sfa, &b, &sfb, &d, NULL, NULL), DG_ERR_OVERFLOW, "dg_fp8_fp4_gemm_nt", "'a'",
                "FP4 MN extent 2^62 + 1");
    TU_CHECK(dmem[0] == 0.0f, "nothing written");
}

/* ---- scale extents for huge K (dg_ceil_div from dg_operand_set_scales) -------------------- */

static void test_scale_extent_huge_k(void) {
    uint8_t byte = 0;
    float sf = 1.0f, dmem = 0.0f;
    /* A broadcast row of INT64_MAX elements addresses one byte: a valid view, K near INT64_MAX. */
    dg_tensor a = dg_tensor_2d(&byte, DG_FLOAT8_E4M3, 1, INT64_MAX);
    a.strides[0] = a.strides[1] = 0;
    dg_tensor b = a;
    dg_tensor sfa = dg_tensor_2d(&sf, DG_FLOAT32, 1, 1), sfb = sfa, d = dg_tensor_2d(&dmem, DG_FLOAT32, 1, 1);
    const dg_status st = dg_fp8_gemm_nt(&a, &sfa, &b, &sfb, &d, NULL, NULL);
    /* ceil(INT64_MAX / 128) = 2^56 K blocks, and 'sfa' has one */
    expect_fail(st, DG_ERR_SHAPE, "dg_fp8_gemm_nt", "'sfa'", "K = INT64_MAX");
    TU_CHECK(strstr(dg_last_error(), "72057594037927936") != NULL, "the expected extent is exact: %s",
             dg_last_error());
    TU_CHECK(dmem == 0.0f, "nothing written");
}

/* ---- K = 0 operands: NULL data and any strides (engine/pack.c) ---------------------------- */

static int all_equal(const float *x, int64_t n, float v) {
    for (int64_t i = 0; i < n; ++i)
        if (x[i] != v)
            return 0;
    return 1;
}

/* D = A @ B^T with K = 0 is zero (or C). The operands have no elements, so their data pointers
 * may be NULL and their row strides anything; nothing may be computed from them. */
static void run_k0(dg_dtype dt, int64_t m, int64_t n, int null_data, int64_t row_stride) {
    static float dmem[300 * 64], cmem[300 * 64];
    static uint8_t dummy[64];
    void *data = null_data ? NULL : dummy;
    dg_tensor a = dg_tensor_2d(data, dt, m, 0), b = dg_tensor_2d(data, dt, n, 0);
    a.strides[0] = b.strides[0] = row_stride;
    dg_tensor sfa = dg_tensor_2d(NULL, DG_FLOAT32, m, 0), sfb = dg_tensor_2d(NULL, DG_FLOAT32, (n + 127) / 128, 0);
    sfa.strides[0] = sfb.strides[0] = row_stride;
    dg_tensor d = dg_tensor_2d(dmem, DG_FLOAT32, m, n), c = dg_tensor_2d(cmem, DG_FLOAT32, m, n);
    for (int64_t i = 0; i < m * n; ++i)
        dmem[i] = 7.0f, cmem[i] = 2.5f;
    const int scaled = dt != DG_BFLOAT16;
    const dg_status st =
        scaled ? dg_fp8_fp4_gemm_nt(&a, &sfa, &b, &sfb, &d, NULL, NULL) : dg_bf16_gemm_nt(&a, &b, &d, NULL);
    TU_CHECK(st == DG_OK && all_equal(dmem, m * n, 0.0f), "%s K = 0, M %lld N %lld, %s data, row stride %lld: %s",
             dg_dtype_name(dt), (long long)m, (long long)n, null_data ? "NULL" : "dummy", (long long)row_stride,
             st == DG_OK ? "D is not zero" : dg_last_error());
    const dg_status stc =
        scaled ? dg_fp8_fp4_gemm_nt(&a, &sfa, &b, &sfb, &d, &c, NULL) : dg_bf16_gemm_nt(&a, &b, &d, &c);
    TU_CHECK(stc == DG_OK && all_equal(dmem, m * n, 2.5f), "%s K = 0 with C, M %lld: %s", dg_dtype_name(dt),
             (long long)m, stc == DG_OK ? "D is not C" : dg_last_error());
}

static void test_k0_operands(void) {
    dg_cpu_info ci;
    dg_get_cpu_info(&ci);
    const dg_isa isa0 = dg_get_isa();
    const dg_dtype dts[3] = {DG_BFLOAT16, DG_FLOAT8_E4M3, DG_FP4_E2M1X2};
    const int64_t ms[4] = {1, 7, 64, 300}; /* small-M and packed paths */
    for (int isa = DG_ISA_GENERIC; isa <= (int)ci.best_isa; ++isa) {
        dg_set_isa((dg_isa)isa);
        for (int t = 0; t < 3; ++t)
            for (int i = 0; i < 4; ++i) {
                run_k0(dts[t], ms[i], 64, 1, 0);
                run_k0(dts[t], ms[i], 64, 1, 8); /* NULL data plus a row offset */
                run_k0(dts[t], ms[i], 64, 0, INT64_MAX / 2); /* row offsets would overflow */
            }
    }
    dg_set_isa(isa0);
}

/* ---- impossible sizes are rejected from shapes and strides, at once ----------------------- */

static void test_impossible_sizes(void) {
    static float zero[4];
    /* torch.zeros(1, 1).expand(128, 5146971002709138): a valid view of one float whose packed
     * MN-major result would need ~2^59 bytes. It used to check every logical element first. */
    dg_tensor sf = dg_tensor_2d(zero, DG_FLOAT32, 128, 5146971002709138LL);
    sf.strides[0] = sf.strides[1] = 0;
    dg_tensor out = {0};
    double t0 = now_ms();
    dg_status st = dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out);
    double ms = now_ms() - t0;
    expect_fail(st, DG_ERR_OVERFLOW, "dg_get_mn_major_tma_aligned_packed_ue8m0_tensor", "'sf'", "expanded sf, query");
    TU_CHECK(ms < 10.0, "rejected in %.3f ms (limit 10)", ms);

    const int recipe[3] = {1, 128, 128};
    t0 = now_ms();
    st = dg_transform_sf_into_required_layout(&sf, 128, 5146971002709138LL * 128, recipe, 3, 0, 1, 0, NULL, &out);
    ms = now_ms() - t0;
    expect_fail(st, DG_ERR_OVERFLOW, "dg_transform_sf_into_required_layout", "'sf'", "expanded sf, transform");
    TU_CHECK(ms < 10.0, "rejected in %.3f ms (limit 10)", ms);

    t0 = now_ms();
    st = dg_get_mn_major_tma_aligned_tensor(&sf, &out);
    ms = now_ms() - t0;
    expect_fail(st, DG_ERR_OVERFLOW, "dg_get_mn_major_tma_aligned_tensor", "'sf'", "expanded sf, float layout");
    TU_CHECK(ms < 10.0, "rejected in %.3f ms (limit 10)", ms);

    /* A possible but huge result (2^37 bytes): the query answers from the one distinct element. */
    sf.shape[1] = (int64_t)1 << 30;
    t0 = now_ms();
    st = dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out);
    ms = now_ms() - t0;
    TU_CHECK(st == DG_OK && out.data == NULL && out.shape[1] == ((int64_t)1 << 28) && out.strides[1] == 128,
             "huge broadcast query: %s", dg_last_error());
    TU_CHECK(ms < 10.0, "answered in %.3f ms (limit 10)", ms);
    zero[0] = 3.0f; /* not a power of two: the same check still finds it */
    st = dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out);
    expect_fail(st, DG_ERR_VALUE, "dg_get_mn_major_tma_aligned_packed_ue8m0_tensor", "'sf'", "broadcast 3.0");
    zero[0] = 0.0f;

    /* An input whose strides span more bytes than any process can address. */
    static uint16_t bf[64];
    float dmem[4 * 4];
    dg_tensor a = dg_tensor_2d(bf, DG_BFLOAT16, 4, 8), b = dg_tensor_2d(bf, DG_BFLOAT16, 4, 8);
    dg_tensor d = dg_tensor_2d(dmem, DG_FLOAT32, 4, 4);
    a.strides[0] = (int64_t)1 << 55;
    t0 = now_ms();
    st = dg_bf16_gemm_nt(&a, &b, &d, NULL);
    ms = now_ms() - t0;
    expect_fail(st, DG_ERR_OVERFLOW, "dg_bf16_gemm_nt", "'a'", "a spans 2^57 bytes");
    TU_CHECK(ms < 10.0, "rejected in %.3f ms (limit 10)", ms);
}

/* With an argument, runs only the groups whose name contains it (one regression at a time). */
int main(int argc, char **argv) {
    static const struct { const char *name; void (*run)(void); } groups[] = {
        {"fp4_extent_doubling", test_fp4_extent_doubling},
        {"scale_extent_huge_k", test_scale_extent_huge_k},
        {"k0_operands", test_k0_operands},
        {"impossible_sizes", test_impossible_sizes},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; ++i)
        if (argc < 2 || strstr(groups[i].name, argv[1]))
            groups[i].run();
    return tu_finish();
}
