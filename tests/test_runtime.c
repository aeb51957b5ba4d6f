/* test_runtime.c - settings, CPU detection, error model and tensor descriptors. */
#include "test_util.h"

#include "core/internal.h"

#include <string.h>

static void test_settings(void) {
    const int n0 = dg_get_num_sms();
    TU_CHECK(n0 >= 1, "num_sms %d", n0);
    TU_CHECK_OK(dg_set_num_sms(3));
    TU_CHECK(dg_get_num_sms() == 3, "num_sms after set");
    TU_CHECK_STATUS(dg_set_num_sms(0), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "dg_set_num_sms: argument 'num_sms'") != NULL,
             "message names the function and the argument: %s", dg_last_error());
    TU_CHECK(dg_get_num_sms() == 3, "a rejected set changes nothing");
    TU_CHECK_OK(dg_set_num_sms(n0));
    TU_CHECK(dg_last_error()[0] == '\0', "a successful call clears the message");

    TU_CHECK_STATUS(dg_set_tc_util(0), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "dg_set_tc_util: argument 'tc_util'") != NULL, "names: %s", dg_last_error());
    TU_CHECK_OK(dg_set_tc_util(80));
    TU_CHECK(dg_get_tc_util() == 80, "tc_util");
    dg_set_pdl(1);
    TU_CHECK(dg_get_pdl() == 1, "pdl");
    dg_set_pdl(0);
    dg_set_ignore_compile_dims(1);
    TU_CHECK(dg_get_ignore_compile_dims() == 1, "ignore_compile_dims");
    /* Always deterministic: the switch is accepted either way and the getter says so. */
    TU_CHECK(dg_get_deterministic_algorithms() == 1, "deterministic by default");
    dg_use_deterministic_algorithms(0);
    TU_CHECK(dg_get_deterministic_algorithms() == 1, "still deterministic after asking for less");
    dg_use_deterministic_algorithms(1);
    TU_CHECK(dg_get_deterministic_algorithms() == 1, "deterministic when asked");
    TU_CHECK_STATUS(dg_set_block_size_multiple_of(0, 1), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "dg_set_block_size_multiple_of: arguments 'block_m_multiple_of'") != NULL,
             "names: %s", dg_last_error());
    TU_CHECK_OK(dg_set_block_size_multiple_of(2, 4));
    int bm = 0, bn = 0;
    dg_get_block_size_multiple_of(&bm, &bn);
    TU_CHECK(bm == 2 && bn == 4, "block size multiples %d %d", bm, bn);

    TU_CHECK(dg_get_mk_alignment_for_contiguous_layout() == 128, "default mk alignment");
    TU_CHECK_STATUS(dg_set_mk_alignment_for_contiguous_layout(-5), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "dg_set_mk_alignment_for_contiguous_layout: argument 'alignment'") != NULL,
             "names: %s", dg_last_error());
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(64));
    TU_CHECK(dg_get_mk_alignment_for_contiguous_layout() == 64, "mk alignment after set");
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(128));
    TU_CHECK(dg_get_theoretical_mk_alignment_for_contiguous_layout(0) >= 1, "theoretical alignment");

    TU_CHECK_STATUS(dg_set_backend((dg_backend)7), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "dg_set_backend: argument 'backend'") != NULL, "names: %s", dg_last_error());
    const dg_backend b0 = dg_get_backend();
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    TU_CHECK(dg_get_backend() == DG_BACKEND_REFERENCE, "backend");
    TU_CHECK_OK(dg_set_backend(b0));

    const dg_gemm_options o = dg_gemm_options_default();
    TU_CHECK(o.ensure_zero_padding == 1 && o.recipe[0] == 0 && o.use_psum_layout == 0, "option defaults");
}

static void test_cpu(void) {
    dg_cpu_info ci;
    TU_CHECK_STATUS(dg_get_cpu_info(NULL), DG_ERR_NULL_POINTER);
    TU_CHECK_OK(dg_get_cpu_info(&ci));
    TU_CHECK(ci.logical_cores >= 1, "cores");
    TU_CHECK(ci.best_isa >= DG_ISA_GENERIC && ci.best_isa <= DG_ISA_AMX, "best isa");
    /* Cache sizes: unknown (0) or plausible and growing with the level; x86-64 and Linux
     * Linux machines report at least L1D and L2 (CPUID leaf 4 / 0x8000001D, or sysfs). */
    for (int l = 1; l <= 3; ++l)
        TU_CHECK(ci.cache_bytes[l] == 0 || (ci.cache_bytes[l] >= 4096 && ci.cache_bytes[l] <= ((int64_t)4 << 30)),
                 "L%d size %lld", l, (long long)ci.cache_bytes[l]);
    if (ci.cache_bytes[1] && ci.cache_bytes[2])
        TU_CHECK(ci.cache_bytes[1] < ci.cache_bytes[2], "L1d < L2");
    if (ci.cache_bytes[2] && ci.cache_bytes[3])
        TU_CHECK(ci.cache_bytes[2] <= ci.cache_bytes[3], "L2 <= L3");
#if defined(__x86_64__) && defined(__linux__)
    TU_CHECK(ci.cache_bytes[1] > 0 && ci.cache_bytes[2] > 0, "L1d and L2 detected: %lld, %lld",
             (long long)ci.cache_bytes[1], (long long)ci.cache_bytes[2]);
#endif
    const dg_isa isa0 = dg_get_isa();
    TU_CHECK(isa0 <= ci.best_isa, "current isa within best");
    for (int i = DG_ISA_GENERIC; i <= (int)ci.best_isa; ++i) {
        TU_CHECK_OK(dg_set_isa((dg_isa)i));
        TU_CHECK(dg_get_isa() == (dg_isa)i, "isa %d", i);
    }
    if (ci.best_isa < DG_ISA_AVX512_BF16)
        TU_CHECK_STATUS(dg_set_isa(DG_ISA_AVX512_BF16), DG_ERR_UNSUPPORTED);
    if (ci.best_isa < DG_ISA_AMX) {
        TU_CHECK_STATUS(dg_set_isa(DG_ISA_AMX), DG_ERR_UNSUPPORTED);
        TU_CHECK(strstr(dg_last_error(), "dg_set_isa: argument 'isa'") != NULL, "names: %s", dg_last_error());
    }
    TU_CHECK((ci.best_isa == DG_ISA_AMX) == (ci.amx_usable != 0), "amx level iff the OS granted tiles");
    TU_CHECK(strcmp(dg_isa_name(DG_ISA_AMX), "amx") == 0, "amx name");
    TU_CHECK_STATUS(dg_set_isa((dg_isa)42), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "dg_set_isa: argument 'isa'") != NULL, "names: %s", dg_last_error());
    TU_CHECK_OK(dg_set_isa(isa0));
    TU_CHECK(strcmp(dg_isa_name(DG_ISA_AVX2), "avx2") == 0, "isa name");
}

static void test_tensors(void) {
    float buf[24];
    dg_tensor t = dg_tensor_3d(buf, DG_FLOAT32, 2, 3, 4);
    TU_CHECK(t.strides[0] == 12 && t.strides[1] == 4 && t.strides[2] == 1, "row-major strides");
    TU_CHECK(dg_tensor_numel(&t) == 24 && dg_tensor_nbytes(&t) == 96, "numel/nbytes");
    TU_CHECK(dg_tensor_is_contiguous(&t), "contiguous");
    dg_tensor tt = dg_tensor_transpose(t, 1, 2);
    TU_CHECK(tt.shape[1] == 4 && tt.strides[1] == 1 && tt.strides[2] == 4, "transpose");
    TU_CHECK(!dg_tensor_is_contiguous(&tt), "transposed is not contiguous");
    TU_CHECK(dg_tensor_nbytes(&tt) == 96, "transposed span");
    TU_CHECK(dg_tensor_transpose(t, 0, 5).ndim == -1, "bad transpose marks the tensor invalid");
    TU_CHECK(dg_dtype_size(DG_BFLOAT16) == 2 && dg_dtype_size(DG_FP4_E2M1X2) == 1, "dtype sizes");
    TU_CHECK(dg_dtype_size((dg_dtype)99) == 0, "invalid dtype size");

    /* internal checks used by every entry point */
    dg_api_begin("test");
    TU_CHECK_STATUS(dg_check_tensor(NULL, "x", 2), DG_ERR_NULL_POINTER);
    TU_CHECK(strstr(dg_last_error(), "'x'") != NULL, "names the argument: %s", dg_last_error());
    TU_CHECK_STATUS(dg_check_tensor(&t, "x", 2), DG_ERR_SHAPE);
    dg_tensor bad = t;
    bad.data = NULL;
    TU_CHECK_STATUS(dg_check_tensor(&bad, "x", 3), DG_ERR_NULL_POINTER);
    bad = dg_tensor_2d(NULL, DG_FLOAT32, 0, 5);
    TU_CHECK_OK(dg_check_tensor(&bad, "empty", 2));
    bad = t;
    bad.shape[1] = -1;
    TU_CHECK_STATUS(dg_check_tensor(&bad, "x", 3), DG_ERR_SHAPE);
    bad = t;
    bad.strides[0] = INT64_MAX / 2;
    TU_CHECK_STATUS(dg_check_tensor(&bad, "x", 3), DG_ERR_OVERFLOW);
    bad = t;
    bad.dtype = (dg_dtype)77;
    TU_CHECK_STATUS(dg_check_tensor(&bad, "x", 3), DG_ERR_DTYPE);
    TU_CHECK_STATUS(dg_check_tensor_dtype(&t, "x", 3, DG_BFLOAT16), DG_ERR_DTYPE);

    dg_tensor half = dg_tensor_2d(buf + 6, DG_FLOAT32, 2, 6);
    dg_tensor first = dg_tensor_2d(buf, DG_FLOAT32, 2, 6);
    dg_tensor second = dg_tensor_2d(buf + 12, DG_FLOAT32, 2, 6);
    TU_CHECK_STATUS(dg_check_no_overlap(&half, "d", &first, "c", true), DG_ERR_LAYOUT);
    TU_CHECK_OK(dg_check_no_overlap(&second, "d", &first, "c", false));
    TU_CHECK_OK(dg_check_no_overlap(&first, "d", &first, "c", true));
    TU_CHECK_STATUS(dg_check_no_overlap(&first, "d", &first, "c", false), DG_ERR_LAYOUT);

    dg_tensor bcast = dg_tensor_2d(buf, DG_FLOAT32, 3, 4);
    bcast.strides[0] = 0;
    TU_CHECK_STATUS(dg_check_output(&bcast, "d"), DG_ERR_LAYOUT);
    TU_CHECK_OK(dg_check_output(&tt, "d"));
    TU_CHECK_OK(dg_check_last_dim_contiguous(&t, "x"));
    TU_CHECK_STATUS(dg_check_last_dim_contiguous(&tt, "x"), DG_ERR_LAYOUT);
}

int main(void) {
    test_settings();
    test_cpu();
    test_tensors();
    return tu_finish();
}
