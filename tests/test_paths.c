/*
 * test_paths.c - the path report (dg_set_print_paths, dg_get_path_report): each distinct path
 * is recorded once with the entry point that took it, the first call's shape does not make a
 * line new, the reference backend and the engine's declines say why, the report's buffer rule
 * is snprintf's, and recording off costs nothing visible (no lines).
 */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static char *report(void) {
    const size_t need = dg_get_path_report(NULL, 0) + 1;
    char *buf = malloc(need);
    TU_CHECK(dg_get_path_report(buf, need) + 1 == need, "the report's length is stable");
    return buf;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; ++s)
        n += *s == '\n';
    return n;
}

/* Has a line containing every one of the given pieces (NULL-terminated). */
static int has_line(const char *rep, const char *const *pieces) {
    const char *line = rep;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        if (len >= sizeof buf)
            len = sizeof buf - 1;
        memcpy(buf, line, len);
        buf[len] = '\0';
        int all = 1;
        for (const char *const *p = pieces; *p; ++p)
            all &= strstr(buf, *p) != NULL;
        if (all)
            return 1;
        line += len + (end ? 1 : 0);
    }
    return 0;
}

static dg_status gemm(int64_t m, int k_major_b) {
    const int64_t n = 40, k = 96;
    dg_tensor a = tu_alloc2(DG_BFLOAT16, m, k), d = tu_alloc2(DG_BFLOAT16, m, n);
    dg_tensor b = k_major_b ? tu_alloc2(DG_BFLOAT16, n, k) : tu_alloc2(DG_BFLOAT16, k, n);
    tu_fill_bytes(&a, 0), tu_fill_bytes(&b, 0);
    dg_tensor bv = k_major_b ? b : dg_tensor_transpose(b, 0, 1);
    const dg_status s = dg_bf16_gemm_nt(&a, &bv, &d, NULL);
    tu_free(&a), tu_free(&b), tu_free(&d);
    return s;
}

static void test_off_records_nothing(void) {
    dg_set_print_paths(0);
    dg_clear_path_report();
    TU_CHECK_OK(gemm(3, 1));
    char *r = report();
    TU_CHECK(r[0] == '\0', "report off: got \"%s\"", r);
    free(r);
}

static void test_once_per_path(void) {
    dg_set_print_paths(2);
    dg_clear_path_report();
    TU_CHECK_OK(gemm(600, 1));
    TU_CHECK_OK(gemm(600, 1));
    TU_CHECK_OK(gemm(700, 1)); /* another shape, the same path: no new line */
    char *r = report();
    TU_CHECK(count_lines(r) == 1, "one path, one line; got:\n%s", r);
    const char *want[] = {"dg_bf16_gemm_nt: ", "large-M kernel", "| first: m=600 n=40 k=96", NULL};
    TU_CHECK(has_line(r, want), "the large-M line names the entry point and the first shape; got:\n%s", r);
    free(r);
    dg_clear_path_report();
    TU_CHECK_OK(gemm(700, 1));
    r = report();
    const char *again[] = {"| first: m=700", NULL};
    TU_CHECK(count_lines(r) == 1 && has_line(r, again), "cleared, then recorded again; got:\n%s", r);
    free(r);
}

static void test_levels_and_declines(void) {
    dg_set_print_paths(2);
    const dg_isa best = dg_get_isa();
    for (int isa = DG_ISA_GENERIC; isa <= (int)best; ++isa) {
        if (dg_set_isa((dg_isa)isa) != DG_OK)
            continue;
        dg_clear_path_report();
        TU_CHECK_OK(gemm(1, 1));
        TU_CHECK_OK(gemm(1, 0));
        char *r = report();
        const char *level[] = {"dg_bf16_gemm_nt: ", dg_isa_name((dg_isa)isa), NULL};
        TU_CHECK(has_line(r, level), "level %s named; got:\n%s", dg_isa_name((dg_isa)isa), r);
        if (isa == DG_ISA_AVX2) { /* AVX2 has the decode kernel; MN-major B declines it */
            const char *dec[] = {"decode kernel (M <= 8", NULL};
            const char *why[] = {"decode kernel declined: B is not K-major", NULL};
            TU_CHECK(has_line(r, dec) && has_line(r, why), "avx2 decode and its decline; got:\n%s", r);
        }
        if (isa == DG_ISA_AVX512_BF16) { /* on VDPBF16PS (AMD's choice) M = 9..64 takes the wide decode kernels */
            dg_clear_path_report();
            TU_CHECK_OK(gemm(16, 1));
            char *w = report();
            const char *dp[] = {"avx512_bf16/bf16", NULL}, *wide[] = {"decode kernel (M <= 64", NULL};
            TU_CHECK(!has_line(w, dp) || has_line(w, wide), "avx512_bf16 wide decode at M = 16; got:\n%s", w);
            free(w);
        }
        if (isa == DG_ISA_GENERIC) {
            const char *none[] = {"small-M path: none at this level", NULL};
            TU_CHECK(has_line(r, none), "generic says it has no small-M path; got:\n%s", r);
        }
        free(r);
    }
    TU_CHECK_OK(dg_set_isa(best));
    dg_clear_path_report();
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    TU_CHECK_OK(gemm(5, 1));
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    char *r = report();
    const char *ref[] = {"dg_bf16_gemm_nt: reference (the reference backend is selected)", NULL};
    TU_CHECK(has_line(r, ref), "the reference backend is reported; got:\n%s", r);
    free(r);
}

/* AMX only: scale blocks of 16 (NVFP4's) are not whole AMX k steps; the unpacked and the
 * pre-packed FP8 x FP4 GEMM both say which level served them instead, and agree bitwise. */
static void test_amx_scale_blocks(void) {
    if (dg_get_isa() < DG_ISA_AMX)
        return;
    const int64_t m = 100, n = 48, k = 96;
    dg_tensor a = tu_alloc2(DG_FLOAT8_E4M3, m, k), sfa = tu_alloc2(DG_FLOAT32, m, k / 16);
    dg_tensor b = tu_alloc2(DG_FP4_E2M1X2, n, k / 2), sfb = tu_alloc2(DG_FLOAT32, n, k / 16);
    dg_tensor d1 = tu_alloc2(DG_FLOAT32, m, n), d2 = tu_alloc2(DG_FLOAT32, m, n);
    for (int64_t i = 0; i < m * k; ++i)
        ((uint8_t *)a.data)[i] = (uint8_t)(0x30 + i % 13); /* finite E4M3 codes */
    tu_fill_bytes(&b, 3);
    for (int64_t i = 0; i < m * k / 16; ++i)
        ((float *)sfa.data)[i] = 0.75f + (float)(i % 5) * 0.125f; /* not powers of two: not folded */
    for (int64_t i = 0; i < n * k / 16; ++i)
        ((float *)sfb.data)[i] = 1.25f + (float)(i % 3) * 0.25f;
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe_a[0] = 1, o.recipe_a[1] = 16, o.recipe_b[0] = 1, o.recipe_b[1] = 16;
    dg_set_print_paths(2);
    dg_clear_path_report();
    TU_CHECK_OK(dg_fp8_fp4_gemm_nt(&a, &sfa, &b, &sfb, &d1, NULL, &o));
    dg_packed_b *pb = NULL;
    TU_CHECK_OK(dg_pack_b(&b, &sfb, &o, &pb));
    TU_CHECK_OK(dg_fp8_fp4_gemm_nt_packed(&a, &sfa, pb, &d2, NULL, &o));
    char *r = report();
    const char *unpacked[] = {"dg_fp8_fp4_gemm_nt: ", "instead of amx/bf16 [scale block 16", NULL};
    const char *packed[] = {"dg_fp8_fp4_gemm_nt_packed: ", "instead of amx/bf16 [B pre-packed with scale blocks of 16",
                            NULL};
    TU_CHECK(has_line(r, unpacked) && has_line(r, packed), "both calls name the level that served them; got:\n%s", r);
    free(r);
    TU_CHECK(memcmp(d1.data, d2.data, (size_t)(m * n) * sizeof(float)) == 0, "packed and unpacked D agree bitwise");
    dg_packed_b_free(pb);
    dg_set_print_paths(0);
    tu_free(&a), tu_free(&sfa), tu_free(&b), tu_free(&sfb), tu_free(&d1), tu_free(&d2);
}

static void test_buffer_rule(void) {
    dg_set_print_paths(2);
    dg_clear_path_report();
    TU_CHECK_OK(gemm(600, 1));
    const size_t need = dg_get_path_report(NULL, 0);
    TU_CHECK(need > 10, "a line was recorded");
    char small[8];
    memset(small, 'x', sizeof small);
    TU_CHECK(dg_get_path_report(small, sizeof small) == need, "the needed length, whatever the buffer");
    TU_CHECK(small[7] == '\0' && strlen(small) == 7, "truncated and NUL-terminated");
    TU_CHECK(dg_get_path_report(small, 0) == need && small[0] != '\0', "size 0 writes nothing");
    dg_set_print_paths(7); /* not a mode: off */
    TU_CHECK(dg_get_print_paths() == 0, "an unknown mode turns the report off");
    dg_clear_path_report();
}

int main(int argc, char **argv) {
    static const struct { const char *name; void (*run)(void); } groups[] = {
        {"off_records_nothing", test_off_records_nothing},
        {"once_per_path", test_once_per_path},
        {"levels_and_declines", test_levels_and_declines},
        {"amx_scale_blocks", test_amx_scale_blocks},
        {"buffer_rule", test_buffer_rule},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; ++i)
        if (argc < 2 || strstr(groups[i].name, argv[1]))
            groups[i].run();
    return tu_finish();
}
